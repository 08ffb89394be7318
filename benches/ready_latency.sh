#!/usr/bin/env bash
# Readiness detection latency: from the moment the replay server writes SGLang's ready line (it
# stamps its own wall clock just before) to the supervisor's `ready` event (`ts`, microseconds),
# with the HTTP confirmation included (0.5.14 imitation: GET /ready → 404, then GET /model_info).
# Usage: benches/ready_latency.sh [RUNS]   (SUP_BIN=path runs another supervisor binary)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-30}
bin=${SUP_BIN:-target/release/sglang-supervisor}
[ -x "$bin" ] && [ -x target/release/sglang-replay ] || cargo build --release --workspace --bins
work=$(mktemp -d)
for i in $(seq "$runs"); do
  port=$((32000 + i))
  "$bin" run --no-tee --events "$work/ev$i.jsonl" -- \
    target/release/sglang-replay --port "$port" --speed 100 --ready-stamp "$work/stamp$i" --exit-after-ready 0:0.2 \
    >/dev/null 2>&1
done
python3 - "$work" "$runs" <<'PY'
import json, sys, datetime, statistics
work, runs = sys.argv[1], int(sys.argv[2])
lags = []
for i in range(1, runs + 1):
    stamp = int(open(f"{work}/stamp{i}").read()) / 1e9
    ev = [json.loads(l) for l in open(f"{work}/ev{i}.jsonl")]
    ready = next(e for e in ev if e["event"] == "ready")
    ts = datetime.datetime.strptime(ready["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc).timestamp()
    lags.append((ts - stamp) * 1000)
lags.sort()
q = lambda p: lags[min(len(lags) - 1, int(p * len(lags)))]
print(f"ready line -> ready event over {runs} runs: p50 {statistics.median(lags):.2f} ms, p90 {q(0.9):.2f} ms, max {lags[-1]:.2f} ms")
PY
rm -rf "$work"
