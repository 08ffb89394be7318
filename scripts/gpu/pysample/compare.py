"""Shares of the HTTP process's main-thread samples by function, arm against arm.

usage: compare.py DIR [TOP]   DIR holds RUN.folded files named cCONC-ARM-ROUND.folded
(sitecustomize.py). For every function, the share of samples with it on the stack (inclusive)
and as the innermost frame (self), per arm (all its rounds together), the functions whose
inclusive share differs most between arms first.
"""
import collections
import glob
import os
import re
import sys


def load(path):
    incl, own, total = collections.Counter(), collections.Counter(), 0
    for line in open(path):
        stack, _, n = line.rstrip("\n").rpartition(" ")
        n = int(n)
        total += n
        frames = stack.split(";")
        for f in set(frames):
            incl[f] += n
        own[frames[-1]] += n
    return incl, own, total


def main():
    d = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    arms = collections.defaultdict(lambda: [collections.Counter(), collections.Counter(), 0])
    for f in sorted(glob.glob(os.path.join(d, "*.folded"))):
        m = re.match(r"c(\d+)-(\w+)-(\d+)\.folded$", os.path.basename(f))
        if not m:
            continue
        incl, own, total = load(f)
        print(f"{os.path.basename(f)}: {total} samples")
        a = arms[m.group(2)]
        a[0].update(incl)
        a[1].update(own)
        a[2] += total
    names = sorted(arms)
    if not names:
        print("no samples")
        return
    share, own = (per_arm(arms, names, i) for i in (0, 1))
    print("inclusive % (self %) by arm: " + " | ".join(names))
    cell = lambda n, f: f"{share[n].get(f, 0) * 100:5.1f} ({own[n].get(f, 0) * 100:4.1f})"
    table(names, share, cell, top, 70)


def per_arm(arms, names, i):
    """Counter i of each arm divided by the arm's count (samples, or rounds)."""
    return {n: {k: v / max(arms[n][2], 1) for k, v in arms[n][i].items()} for n in names}


def table(names, key, cell, top, width):
    """The functions whose `key` differs most between arms first, one line each."""
    funcs = set().union(*(key[n] for n in names))
    spread = lambda f: max(key[n].get(f, 0) for n in names) - min(key[n].get(f, 0) for n in names)
    for f in sorted(funcs, key=spread, reverse=True)[:top]:
        print(f"  {f[:width]:{width}s} " + " | ".join(cell(n, f) for n in names))



def profiles(d, top):
    """cProfile's figures (PYSAMPLE_MODE=profile) per arm, per round on average: calls and own
    seconds, the functions whose own time differs most between arms first."""
    arms = collections.defaultdict(lambda: [collections.Counter(), collections.Counter(), 0])
    for f in sorted(glob.glob(os.path.join(d, "*.prof.txt"))):
        m = re.match(r"c(\d+)-(\w+)-(\d+)\.prof\.txt$", os.path.basename(f))
        if not m:
            continue
        a = arms[m.group(2)]
        a[2] += 1
        for line in open(f):
            nc, tt, _ct, name = line.rstrip("\n").split("\t")
            a[0][name] += int(nc)
            a[1][name] += float(tt)
    if not arms:
        return
    names = sorted(arms)
    calls, own = (per_arm(arms, names, i) for i in (0, 1))
    print("cProfile, per round: " + " | ".join(f"{n}: {arms[n][2]} rounds, {sum(own[n].values()):.2f} s own time" for n in names))
    print("own s (calls) by arm: " + " | ".join(names))
    cell = lambda n, f: f"{own[n].get(f, 0):7.3f} ({calls[n].get(f, 0):9.0f})"
    table(names, own, cell, top, 80)


main()
profiles(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30)


def common_factor(d):
    """Run against run: over the functions called > 50 000 times, as often in both (1 %), with
    > 0.2 s own time, the median and p10-p90 of their own-time ratios: one factor for all of
    them is the same work on a slower or faster CPU."""
    runs = {}
    for f in sorted(glob.glob(os.path.join(d, "*.prof.txt"))):
        rows = (line.rstrip("\n").split("\t") for line in open(f))
        runs[os.path.basename(f)[: -len(".prof.txt")]] = {r[3]: (int(r[0]), float(r[1])) for r in rows}
    names = sorted(runs)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            A, B = runs[a], runs[b]
            r = sorted(B[k][1] / A[k][1] for k in A if k in B and A[k][0] > 50000 and A[k][1] > 0.2 and abs(A[k][0] - B[k][0]) <= 0.01 * A[k][0])
            if r:
                print(f"{b} / {a}: own-time ratio over {len(r)} functions median {r[len(r) // 2]:.3f}, p10 {r[len(r) // 10]:.3f}, p90 {r[9 * len(r) // 10]:.3f}")


common_factor(sys.argv[1])
