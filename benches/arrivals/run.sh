#!/usr/bin/env bash
# When a burst of bench_serving-like requests reaches a server, straight and through the proxy.
# burst.py sends N requests at once from one asyncio loop, a new aiohttp session per request (as
# bench_serving does); server.py records each connection's accept and the kernel's receive time
# of its request bytes (SO_TIMESTAMPNS), answers after HOLD seconds. Needs aiohttp for PYTHON.
# usage: benches/arrivals/run.sh [N=512] [ROUNDS=2] [PYTHON=python3]
set -u
cd "$(dirname "$0")/../.."
n=${1:-512}; rounds=${2:-2}; py=${3:-python3}
[ -x target/release/sglang-supervisor ] || cargo build --release -p sglang-supervisor
. benches/free_port.sh
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
run() {
  local port; port=$(free_port)
  python3 benches/arrivals/server.py "$port" 0.5 "$work/arr-$1.json" & local srv=$!
  sleep 0.5
  local target=$port sup=
  if [ "$1" = proxy ]; then
    target/release/sglang-supervisor run --upstream "http://127.0.0.1:$port" --ready-on http --proxy-addr 127.0.0.1:0 \
      --metrics-addr none --gpu-backend none --no-preflight --no-tee --events "$work/ev.jsonl" -- sleep 1000 2>/dev/null & sup=$!
    for _ in $(seq 50); do grep -q '"proxy":' "$work/ev.jsonl" 2>/dev/null && break; sleep 0.1; done
    target=$(grep -o '"proxy":"[^"]*"' "$work/ev.jsonl" | head -1 | cut -d'"' -f4 | cut -d: -f2)
  fi
  "$py" benches/arrivals/burst.py "$target" "$n" "$work/burst-$1.json"
  kill -TERM "$srv"; wait "$srv" 2>/dev/null
  if [ -n "$sup" ]; then kill -TERM "$sup"; wait "$sup" 2>/dev/null; rm -f "$work/ev.jsonl"; fi
  python3 - "$work" "$1" <<'PY'
import json, sys
w, arm = sys.argv[1:]
a = [x for x in json.load(open(f"{w}/arr-{arm}.json")) if x["data"] and x["line"].startswith("POST /generate")]
b = json.load(open(f"{w}/burst-{arm}.json"))
t0 = min(x["send"] for x in b)
d = sorted((x["data"] - t0) * 1000 for x in a)
acc = sorted((x["accept"] - t0) * 1000 for x in a)
q = lambda v: [round(v[int(p * (len(v) - 1))], 1) for p in (0, .1, .5, .9, 1)]
print(f"{arm:6s}: {len(d)} requests; ms after the first send, p0/p10/p50/p90/p100: request bytes at the server {q(d)}; accepted {q(acc)}")
PY
}
for _ in $(seq "$rounds"); do run direct; run proxy; done
