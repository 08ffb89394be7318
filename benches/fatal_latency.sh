#!/usr/bin/env bash
# Fatal-error detection latency: from the moment the child writes a fatal line (it stamps its own
# wall clock just before, on the line above) to the supervisor's `fatal` event (`ts`,
# microseconds). Unlike benches/ready_latency.sh no HTTP check is involved: this is the log path
# alone (read, hand-off to the parser, parse, event).
# Usage: benches/fatal_latency.sh [RUNS]   (SUP_BIN=path runs another supervisor binary)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-30}
bin=${SUP_BIN:-target/release/sglang-supervisor}
[ -x "$bin" ] || cargo build --release -p sglang-supervisor
work=$(mktemp -d)
for i in $(seq "$runs"); do
  # The child waits for the supervisor to settle, then writes the stamp and the fatal line at once.
  "$bin" run --no-tee --metrics-addr none --gpu-backend none --grace 1s \
    --log-file "$work/log$i" --events "$work/ev$i.jsonl" -- python3 -c '
import sys, time
time.sleep(0.3)
sys.stdout.write("stamp %d\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n" % time.time_ns())
sys.stdout.flush()
time.sleep(10)' >/dev/null 2>&1 || true
done
python3 benches/event_lag.py "$work" "$runs" fatal 'log{i}' 1 "fatal line -> fatal event"
rm -rf "$work"
