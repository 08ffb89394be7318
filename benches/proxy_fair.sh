#!/usr/bin/env bash
# Fairness under load: STREAMS concurrent streams (alternately direct and through the proxy, as
# benches/proxy.sh) while /metrics is scraped SCRAPES times a second for the whole run. Prints
# the scrape latencies (p50/p99/max, achieved rate) and the proxy's effect on each stream's
# largest inter-chunk gap (a stall shows there first).
# usage: benches/proxy_fair.sh [STREAMS=1024] [ROUNDS=11] [TOKEN_GAP_US=10000] [SCRAPES=100]
# TAP=1: the supervisor measures with `--tap` instead of the proxy; both legs then go straight to
# the server, watched by the tap, and the scrapes read the tap's series (item 3 with no hop).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x target/release/proxy-bench ] || cargo build --release --workspace --bins
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
streams=${1:-1024}; rounds=${2:-11}; gap=${3:-10000}; rate=${4:-100}
work=$(mktemp -d)
. benches/free_port.sh
port=$(free_port)
measure=(--proxy-addr 127.0.0.1:0); [ -n "${TAP:-}" ] && measure=(--tap --requests-log "$work/tap.jsonl")
target/release/sglang-supervisor run --no-tee --metrics-addr 127.0.0.1:0 "${measure[@]}" --events "$work/ev.jsonl" \
  -- target/release/sglang-replay --port "$port" --speed 100 --token-gap-us "$gap" --merge-every 5 >/dev/null 2>&1 &
sup=$!
for _ in $(seq 200); do grep -q '"event":"ready"' "$work/ev.jsonl" 2>/dev/null && break; sleep 0.05; done
if [ -n "${TAP:-}" ]; then proxy=127.0.0.1:$port; else proxy=$(grep -o '"proxy":"[^"]*"' "$work/ev.jsonl" | cut -d'"' -f4); fi
metrics=$(grep -o '"metrics":"[^"]*"' "$work/ev.jsonl" | cut -d'"' -f4)
python3 - "$metrics" "$rate" "$work/stop" > "$work/scrapes" <<'PY' &
import sys, time, os, http.client, statistics
addr, rate, stop = sys.argv[1], float(sys.argv[2]), sys.argv[3]
host, port = addr.rsplit(":", 1)
lat, errors, t0, n = [], 0, time.monotonic(), 0
while not os.path.exists(stop):
    due = t0 + n / rate
    time.sleep(max(0.0, due - time.monotonic()))
    n += 1
    s = time.perf_counter()
    try:
        c = http.client.HTTPConnection(host, int(port), timeout=10)
        c.request("GET", "/metrics"); r = c.getresponse(); r.read(); c.close()
        if r.status != 200: errors += 1
    except Exception:
        errors += 1
    lat.append((time.perf_counter() - s) * 1000)
lat.sort(); q = lambda p: lat[min(len(lat) - 1, int(p * (len(lat) - 1)))]
el = time.monotonic() - t0
print(f"/metrics: {len(lat)} scrapes in {el:.1f} s ({len(lat)/el:.1f}/s), {errors} errors; latency p50 {q(.5):.2f} ms, p99 {q(.99):.2f} ms, max {lat[-1]:.2f} ms")
PY
scraper=$!
server=$(pgrep -P "$sup" -f sglang-replay | head -1 || true)
target/release/proxy-bench "127.0.0.1:$port" "$proxy" "$streams" 256 "$rounds" "$sup" /generate "${server:-0}"
touch "$work/stop"; wait $scraper
cat "$work/scrapes"
kill -TERM $sup; wait $sup || true
if [ -n "${TAP:-}" ]; then
  python3 benches/tap_records.py "$work/tap.jsonl" $((2 * streams * rounds)) 256; echo
fi
rm -rf "$work"
