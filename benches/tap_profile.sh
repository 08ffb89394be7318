#!/usr/bin/env bash
# The tap's CPU per event, and where it goes: the replay server's streams straight to its port
# while a supervisor is attached to that port with `run --tap --upstream`; proxy-bench reads the
# supervisor's CPU around its waves, and PERF=1 records a `perf` profile of it meanwhile.
# usage: benches/tap_profile.sh [STREAMS=256] [TOKENS=256] [WAVES=3] [TOKEN_GAP_US=2000]
# TAP_SUP=PATH runs another build of the supervisor (a before/after pair, side by side).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x target/release/proxy-bench ] || cargo build --release --workspace --bins
work=$(mktemp -d)
. benches/free_port.sh
. benches/tap_attach.sh
port=$(free_port)
streams=${1:-256} tokens=${2:-256}
target/release/sglang-replay --port "$port" --speed 100 --token-gap-us "${4:-2000}" --merge-every 5 >/dev/null 2>&1 &
replay=$!
tap_attach "$port" "$work"
if [ -n "${PERF:-}" ]; then perf record -e cpu-clock -F 4999 -g -p "$tap" -o "$work/perf.data" 2>/dev/null & rec=$!; fi
target/release/proxy-bench "127.0.0.1:$port" "127.0.0.1:$port" "$streams" "$tokens" "${3:-3}" "$tap" /generate "$replay" | grep 'supervisor CPU'
if [ -n "${PERF:-}" ]; then kill -INT "$rec"; wait "$rec" || true; fi
kill -TERM "$tap"; wait "$tap" || true
kill "$replay"; wait "$replay" 2>/dev/null || true
python3 - "$work/tap.jsonl" "$tokens" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
exact = sum(1 for x in r if x.get("completion_tokens") == int(sys.argv[2]) and not x.get("error"))
print(f"tap: {len(r)} records, {exact} with every token")
PY
[ -n "${PERF:-}" ] && perf report -i "$work/perf.data" --no-children --sort dso,symbol --stdio 2>/dev/null | grep -E '^ +[0-9.]+%' | head -20
rm -rf "$work"
