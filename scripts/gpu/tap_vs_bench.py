"""The tap's records of one benchmark run held against bench_serving's own per-request figures.

usage: tap_vs_bench.py TAP_REQUESTS.jsonl BENCH_RESULT.jsonl NAME
bench_serving (--output-details) gives each request's output length, TTFT and ITLs but not which
connection it was, so the two sides are compared as multisets: token counts exactly (sorted), TTFT
and E2E as sorted pairs (tap minus client: the tap stamps a segment in the kernel, between the
client's send and the server's read, so its times are a little shorter).
"""
import json
import statistics as st
import sys

recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
b = [json.loads(l.replace("Infinity", "1e999")) for l in open(sys.argv[2])][-1]
name = sys.argv[3]
gen = [r for r in recs if r["endpoint"] in ("/generate", "/v1/completions", "/v1/chat/completions")]
errors = [r for r in gen if r.get("error")]
ok = [r for r in gen if not r.get("error")]
# bench_serving's warm-up request(s) come before its clock: the tap sees them too
tap_tokens = sorted(r["completion_tokens"] for r in ok if r.get("completion_tokens") is not None)
bench_tokens = sorted(n for n in b.get("output_lens", []) if n)
extra = len(tap_tokens) - len(bench_tokens)
matched = bench_tokens == tap_tokens[extra:] if extra >= 0 else False
# the warm-up requests are the earliest: drop that many from the tap's side, by start time
timed = sorted(ok, key=lambda r: r["start_unix"])[max(extra, 0):]
unknown = sum(1 for r in ok if r.get("completion_tokens") is None)
print(f"{name}: tap {len(gen)} records ({len(errors)} errors, {unknown} without counts), bench {len(bench_tokens)} requests + {extra} warm-up; "
      f"completion tokens {'EQUAL' if matched else 'DIFFER'} as multisets (tap {sum(tap_tokens)} incl. warm-up, bench {sum(bench_tokens)})")
if errors:
    print(f"{name}: first error: {errors[0].get('error')}")


def pairs(label, tap, client):
    tap, client = sorted(tap), sorted(client)
    n = min(len(tap), len(client))
    if not n:
        return
    d = [(tap[i] - client[i]) * 1000 for i in range(n)]
    print(f"{name}: {label} sorted pairs tap-minus-client: median {st.median(d):+.3f} ms, min {min(d):+.3f}, max {max(d):+.3f} (n={n}); "
          f"medians tap {st.median(tap) * 1000:.2f} ms, client {st.median(client) * 1000:.2f} ms")


pairs("TTFT", [r["ttft_s"] for r in timed if r.get("ttft_s") is not None], [t for t in b.get("ttfts", []) if t])
pairs("E2E", [r["e2e_s"] for r in timed], [t + sum(i) for t, i in zip(b.get("ttfts", []), b.get("itls", [])) if t])
tpot = [r["tpot_s"] for r in timed if r.get("tpot_s") is not None]
if tpot:
    print(f"{name}: median TPOT tap {st.median(tpot) * 1000:.3f} ms, bench {b.get('median_tpot_ms', float('nan')):.3f} ms; "
          f"median E2E tap {st.median(r['e2e_s'] for r in timed) * 1000:.1f} ms, bench {b.get('median_e2e_latency_ms', float('nan')):.1f} ms")
