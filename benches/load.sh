#!/usr/bin/env bash
# Load: `/metrics` scraped by wrk (Debian's) at a steady rate while the proxy carries STREAMS
# concurrent streams and the sampler reads 8 (stub NVML) GPUs every 100 ms, for SECONDS. Prints
# wrk's errors and latency percentiles, the streams' completed/failed counts, and the
# supervisor's RSS and CPU sampled every 10 s (growth = last - first).
# usage: benches/load.sh [SECONDS=600] [STREAMS=512]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-600}; streams=${2:-512}
command -v wrk >/dev/null || { echo "needs wrk (apt-get install wrk)"; exit 2; }
[ -x target/release/stream-load ] || cargo build --release --workspace --bins
work=$(mktemp -d)
cc -shared -fPIC -O2 -o "$work/libnvidia-ml.so.1" tests/stubs/nvml_stub.c
. benches/free_port.sh
port=$(free_port)
STUB_NVML_GPUS=8 target/release/sglang-supervisor run --no-tee --metrics-addr 127.0.0.1:0 \
  --proxy-addr 127.0.0.1:0 --gpu-backend nvml --nvml-lib "$work/libnvidia-ml.so.1" \
  --sample-interval 100ms --events "$work/ev.jsonl" \
  -- target/release/sglang-replay --port "$port" --speed 100 >/dev/null 2>&1 &
sup=$!
for _ in $(seq 400); do grep -q '"event":"ready"' "$work/ev.jsonl" 2>/dev/null && break; sleep 0.05; done
metrics=$(grep -o '"metrics":"[^"]*"' "$work/ev.jsonl" | cut -d'"' -f4)
proxy=$(grep -o '"proxy":"[^"]*"' "$work/ev.jsonl" | cut -d'"' -f4)
tck=$(getconf CLK_TCK)
( while kill -0 $sup 2>/dev/null; do
    read -r -a st < "/proc/$sup/stat" || break
    rss=$(awk '/VmRSS/{print $2}' "/proc/$sup/status")
    echo "$(date +%s) $rss $(( st[13] + st[14] ))"
    sleep 10
  done ) > "$work/usage" &
target/release/stream-load "$proxy" "$streams" 64 "$secs" > "$work/streams" &
loadpid=$!
wrk -t2 -c8 -d"${secs}s" --latency "http://$metrics/metrics" > "$work/wrk"
wait $loadpid
kill -TERM $sup; wait $sup || true
echo "== wrk on /metrics ($secs s, 8 connections)"; grep -E "Latency|50%|90%|99%|Requests/sec|requests in|Socket errors|Non-2xx" "$work/wrk"
echo "== proxy"; cat "$work/streams"
echo "== supervisor usage (time, RSS kB, CPU ticks)"; python3 - "$work/usage" "$tck" <<'PY'
import sys
rows = [list(map(int, l.split())) for l in open(sys.argv[1]) if l.strip()]
tck = int(sys.argv[2])
t0, r0, c0 = rows[0]; t1, r1, c1 = rows[-1]
mid = rows[len(rows) // 2]
print(f"samples {len(rows)}; RSS first {r0} kB, middle {mid[1]} kB, last {r1} kB, max {max(r[1] for r in rows)} kB; "
      f"growth second half {r1 - mid[1]} kB; CPU {(c1 - c0) / tck / max(1, t1 - t0) * 100:.1f} % of a core")
PY
rm -rf "$work"
