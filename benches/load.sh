#!/usr/bin/env bash
# Load: `/metrics` scraped by wrk (Debian's) at a steady rate while the proxy carries STREAMS
# concurrent streams and the sampler reads 8 (stub NVML) GPUs every 100 ms, for SECONDS. Prints
# wrk's errors and latency percentiles, the streams' completed/failed counts, and the
# supervisor's RSS and CPU sampled every 10 s (growth = last - first).
# TAP=1: the streams go straight to the server, measured by the tap (`run --tap`) instead of the
# proxy; then also every request the client made is held against the tap's requests log (one
# record each, every token counted) and the tap's lost-segment counters.
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
tokens=64
measure=(--proxy-addr 127.0.0.1:0)
[ -n "${TAP:-}" ] && measure=(--tap --requests-log "$work/requests.jsonl")
STUB_NVML_GPUS=8 target/release/sglang-supervisor run --no-tee --metrics-addr 127.0.0.1:0 \
  "${measure[@]}" --gpu-backend nvml --nvml-lib "$work/libnvidia-ml.so.1" \
  --sample-interval 100ms --events "$work/ev.jsonl" \
  -- target/release/sglang-replay --port "$port" --speed 100 >/dev/null 2>&1 &
sup=$!
for _ in $(seq 400); do grep -q '"event":"ready"' "$work/ev.jsonl" 2>/dev/null && break; sleep 0.05; done
metrics=$(grep -o '"metrics":"[^"]*"' "$work/ev.jsonl" | cut -d'"' -f4)
proxy=$(grep -o '"proxy":"[^"]*"' "$work/ev.jsonl" | cut -d'"' -f4 || true)
[ -n "${TAP:-}" ] && proxy=127.0.0.1:$port
[ -n "$metrics" ] && [ -n "$proxy" ] || { echo "the supervisor did not start:"; cat "$work/ev.jsonl"; exit 1; }
tck=$(getconf CLK_TCK)
( while kill -0 $sup 2>/dev/null; do
    read -r -a st < "/proc/$sup/stat" || break
    rss=$(awk '/VmRSS/{print $2}' "/proc/$sup/status")
    echo "$(date +%s) $rss $(( st[13] + st[14] ))"
    sleep 10
  done ) > "$work/usage" &
target/release/stream-load "$proxy" "$streams" "$tokens" "$secs" > "$work/streams" &
loadpid=$!
wrk -t2 -c8 -d"${secs}s" --latency "http://$metrics/metrics" > "$work/wrk"
wait $loadpid
# the tap's counters of what it could not read, once every request has ended
sleep 0.5
tapcounts=$(python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' \
  "http://$metrics/metrics" | grep -E "^sglang_supervisor_tap_(dropped_packets|unread_connections)_total" || true)
kill -TERM $sup; wait $sup || true
echo "== wrk on /metrics ($secs s, 8 connections)"; grep -E "Latency|50%|90%|99%|Requests/sec|requests in|Socket errors|Non-2xx" "$work/wrk"
if [ -n "${TAP:-}" ]; then
  echo "== straight to the server, measured by the tap"; cat "$work/streams"
  echo "$tapcounts"
  python3 - "$work/requests.jsonl" "$work/streams" "$tokens" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
words = open(sys.argv[2]).read().split()
done, failed, tokens = int(words[2]), int(words[5]), int(sys.argv[3])
exact = sum(r["status"] == 200 and not r.get("error") and r["completion_tokens"] == tokens for r in recs)
print(f"tap records {len(recs)} for {done + failed} requests made; {exact} exact ({tokens} tokens, no error), "
      f"{sum(bool(r.get('error')) for r in recs)} with an error")
PY
else
  echo "== proxy"; cat "$work/streams"
fi
echo "== supervisor usage (time, RSS kB, CPU ticks)"; python3 - "$work/usage" "$tck" <<'PY'
import sys
rows = [list(map(int, l.split())) for l in open(sys.argv[1]) if l.strip()]
tck = int(sys.argv[2])
t0, r0, c0 = rows[0]; t1, r1, c1 = rows[-1]
mid = rows[len(rows) // 2]
print(f"samples {len(rows)}; RSS first {r0} kB, middle {mid[1]} kB, last {r1} kB, max {max(r[1] for r in rows)} kB; "
      f"growth second half {r1 - mid[1]} kB; CPU {(c1 - c0) / tck / max(1, t1 - t0) * 100:.1f} % of a core")
print("RSS kB every 10 s: " + " ".join(str(r[1]) for r in rows))
PY
rm -rf "$work"
