"""Pools benches/tap_ttft.sh's TTFTs (lines `direct MS` = unwatched, `proxy MS` = watched) and
prints watched − unwatched at the median and the p99, each with a bootstrap 95 % interval
(each side resampled with replacement, 1 000 times, seeded: the same file gives the same line)."""
import random
import sys


def pct(v, q):
    """The q-quantile of sorted v, as proxy-bench takes it (nearest rank)."""
    return v[round((len(v) - 1) * q)]


def main(path):
    side = {"direct": [], "proxy": []}
    for line in open(path):
        name, ms = line.split()
        if ms.lower() != "nan":
            side[name].append(float(ms) * 1000.0)
    off, on = sorted(side["direct"]), sorted(side["proxy"])
    if not off or not on:
        sys.exit(f"tap_ttft.py: {path} holds no TTFT of one side")
    rng = random.Random(16)
    for q, name in ((0.5, "median"), (0.99, "p99")):
        diffs = sorted(
            pct(sorted(rng.choices(on, k=len(on))), q) - pct(sorted(rng.choices(off, k=len(off))), q)
            for _ in range(1000)
        )
        print(
            f"pooled {name} TTFT: watched {pct(on, q):.1f} us, unwatched {pct(off, q):.1f} us, "
            f"added {pct(on, q) - pct(off, q):+.1f} us (95 % interval {diffs[25]:+.1f} to {diffs[974]:+.1f}; "
            f"{len(on)} and {len(off)} requests)"
        )


main(sys.argv[1])
