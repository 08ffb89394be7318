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
python3 benches/event_lag.py "$work" "$runs" ready 'stamp{i}' 0 "ready line -> ready event"
rm -rf "$work"
