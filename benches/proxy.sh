#!/usr/bin/env bash
# Proxy overhead: the replay server's streams (SGLang's SSE shapes), alternately direct and through
# `sglang-supervisor run --proxy-addr`, same load each time; the supervisor's CPU per forwarded
# event is read from /proc around the proxied rounds only.
# usage: benches/proxy.sh [STREAMS=64] [TOKENS=256] [ROUNDS=7] [TOKEN_GAP_US=2000] [PATH=/generate]
# FLOOR=1 then runs the same load through benches/epoll_relay.c (one thread, one epoll set, bytes
# copied both ways, nothing parsed): what a hop costs per event at the least, the scale for the
# supervisor's figure. STEP_US=N makes the replay server write every stream's event together at
# each N-µs step (as SGLang's HTTP thread writes after each decode step) instead of each stream
# TOKEN_GAP_US after its own previous event.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x target/release/proxy-bench ] || cargo build --release --workspace --bins
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
work=$(mktemp -d)
. benches/free_port.sh
port=$(free_port)
target/release/sglang-supervisor run --no-tee --metrics-addr none --proxy-addr 127.0.0.1:0 --events "$work/ev.jsonl" \
  -- target/release/sglang-replay --port "$port" --speed 100 --token-gap-us "${4:-2000}" --merge-every 5 --step-us "${STEP_US:-0}" >/dev/null 2>&1 &
sup=$!
for _ in $(seq 200); do grep -q '"event":"ready"' "$work/ev.jsonl" 2>/dev/null && break; sleep 0.05; done
proxy=$(grep -o '"proxy":"[^"]*"' "$work/ev.jsonl" | cut -d'"' -f4)
server=$(pgrep -P "$sup" -f sglang-replay | head -1 || true)
target/release/proxy-bench "127.0.0.1:$port" "$proxy" "${1:-64}" "${2:-256}" "${3:-7}" "$sup" "${5:-/generate}" "${server:-0}"
kill -TERM $sup; wait $sup || true
if [ -n "${FLOOR:-}" ]; then
  cc -O2 -o "$work/epoll_relay" benches/epoll_relay.c
  server_port=$(free_port); relay_port=$(free_port)
  target/release/sglang-replay --port "$server_port" --speed 100 --token-gap-us "${4:-2000}" --merge-every 5 --step-us "${STEP_US:-0}" >/dev/null 2>&1 &
  replay=$!
  "$work/epoll_relay" "$relay_port" "$server_port" & relay=$!
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$server_port") 2>/dev/null && break; sleep 0.05; done
  echo "the floor: the same load through epoll_relay (its CPU in the 'supervisor' line)"
  target/release/proxy-bench "127.0.0.1:$server_port" "127.0.0.1:$relay_port" "${1:-64}" "${2:-256}" "${3:-7}" "$relay" "${5:-/generate}" "$replay"
  kill $relay $replay; wait $relay $replay 2>/dev/null || true
fi
rm -rf "$work"
