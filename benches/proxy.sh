#!/usr/bin/env bash
# Proxy overhead: the replay server's streams (SGLang's SSE shapes), alternately direct and through
# `sglang-supervisor run --proxy-addr`, same load each time; the supervisor's CPU per forwarded
# event is read from /proc around the proxied rounds only.
# usage: benches/proxy.sh [STREAMS=64] [TOKENS=256] [ROUNDS=7] [TOKEN_GAP_US=2000] [PATH=/generate]
# FLOOR=1 then runs the same load through benches/epoll_relay.c (one thread, one epoll set, bytes
# copied both ways, nothing parsed): what a hop costs per event at the least, the scale for the
# supervisor's figure. STEP_US=N makes the replay server write every stream's event together at
# each N-µs step (as SGLang's HTTP thread writes after each decode step) instead of each stream
# TOKEN_GAP_US after its own previous event. FLOOR=uring then also runs benches/uring_relay.c (the
# same relay on one io_uring: one system call per pass over all ready connections), and
# URING_MIN_WAIT_US=N a third time with the kernel holding its wake-ups up to N us (Linux 6.12+).
# TAP=1 then runs the load with no hop, ROUNDS pairs of a wave unwatched and one watched by the
# supervisor's tap (`run --tap` attached to the server's port): what the tap costs the server and
# itself, and whether it counted every token (TAP_PROBE=1: benches/packet_tap.c, a bare ring;
# TAP_WAVES=N: N waves per side of a pair, e.g. 200 one-stream requests for the TTFT p99).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x target/release/proxy-bench ] || cargo build --release --workspace --bins
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
work=$(mktemp -d)
. benches/free_port.sh
. benches/tap_attach.sh
port=$(free_port)
target/release/sglang-supervisor run --no-tee --metrics-addr none --proxy-addr 127.0.0.1:0 --events "$work/ev.jsonl" \
  -- target/release/sglang-replay --port "$port" --speed 100 --token-gap-us "${4:-2000}" --merge-every 5 --step-us "${STEP_US:-0}" >/dev/null 2>&1 &
sup=$!
for _ in $(seq 200); do grep -q '"event":"ready"' "$work/ev.jsonl" 2>/dev/null && break; sleep 0.05; done
proxy=$(grep -o '"proxy":"[^"]*"' "$work/ev.jsonl" | cut -d'"' -f4)
server=$(pgrep -P "$sup" -f sglang-replay | head -1 || true)
target/release/proxy-bench "127.0.0.1:$port" "$proxy" "${1:-64}" "${2:-256}" "${3:-7}" "$sup" "${5:-/generate}" "${server:-0}"
kill -TERM $sup; wait $sup || true
# a replay server of its own on PORT, as the supervisor's (its pid in $replay)
start_replay() {
  target/release/sglang-replay --port "$1" --speed 100 --token-gap-us "$GAP_US" --merge-every 5 --step-us "${STEP_US:-0}" >/dev/null 2>&1 &
  replay=$!
}
wait_for_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && break; sleep 0.05; done; }
# the same load through a relay that parses nothing: NAME then its command line (its two ports appended)
floor() {
  local name=$1; shift
  server_port=$(free_port); relay_port=$(free_port)
  start_replay "$server_port"
  "$@" "$relay_port" "$server_port" ${RELAY_ARGS:-} & relay=$!
  wait_for_port "$server_port"
  echo "the floor: the same load through $name (its CPU in the 'supervisor' line)"
  target/release/proxy-bench "127.0.0.1:$server_port" "127.0.0.1:$relay_port" "${STREAMS}" "${TOKENS}" "${ROUNDS}" "$relay" "${PATHQ}" "$replay"
  kill $relay $replay; wait $relay $replay 2>/dev/null || true
}
STREAMS=${1:-64} TOKENS=${2:-256} ROUNDS=${3:-7} GAP_US=${4:-2000} PATHQ=${5:-/generate}
if [ -n "${FLOOR:-}" ]; then
  cc -O2 -o "$work/epoll_relay" benches/epoll_relay.c
  RELAY_ARGS= floor epoll_relay "$work/epoll_relay"
fi
if [ "${FLOOR:-}" = uring ]; then
  # URING_RELAY=PATH: one built elsewhere (cc -O2 -static ... -luring), for a host without liburing-dev
  if [ -n "${URING_RELAY:-}" ]; then cp "$URING_RELAY" "$work/uring_relay"; else cc -O2 -o "$work/uring_relay" benches/uring_relay.c -luring; fi
  RELAY_ARGS= floor uring_relay "$work/uring_relay"
  [ -n "${URING_MIN_WAIT_US:-}" ] && RELAY_ARGS=$URING_MIN_WAIT_US floor "uring_relay, wake-ups held up to ${URING_MIN_WAIT_US} us" "$work/uring_relay"
fi
if [ -n "${TAP:-}" ]; then
  # no hop at all: the client straight to the server, ROUNDS pairs of one unwatched wave and one
  # watched by the supervisor's tap (`run --tap`, attached to the server's port), so the server's
  # CPU per event is compared pair by pair; the tap's own CPU is read around its waves
  # (TAP_PROBE=1: benches/packet_tap.c instead, a bare packet ring that only counts `data:`)
  server_port=$(free_port)
  start_replay "$server_port"
  wait_for_port "$server_port"
  if [ -n "${TAP_PROBE:-}" ]; then cc -O2 -o "$work/packet_tap" benches/packet_tap.c; fi
  tap_on() {
    if [ -n "${TAP_PROBE:-}" ]; then "$work/packet_tap" "$server_port" "${TAP_RETIRE_MS:-1}" & tap=$!; return; fi
    tap_attach "$server_port" "$work"
  }
  echo "no hop: the server's CPU per event written, unwatched then watched by the tap, pair by pair"
  for _ in $(seq "$ROUNDS"); do
    target/release/proxy-bench "127.0.0.1:$server_port" "127.0.0.1:$server_port" "$STREAMS" "$TOKENS" "${TAP_WAVES:-1}" 0 "$PATHQ" "$replay" 2>&1 |
      grep -o 'TTFT median [0-9.]* ms p99 [0-9.]* ms\|E2E median [0-9.]* ms\|= [0-9.]* us per event written' | tr '\n' ' ' | sed 's/^/unwatched: /'; echo
    rm -f "$work/tap.jsonl"
    tap_on
    target/release/proxy-bench "127.0.0.1:$server_port" "127.0.0.1:$server_port" "$STREAMS" "$TOKENS" "${TAP_WAVES:-1}" "$tap" "$PATHQ" "$replay" 2>&1 |
      grep -o 'TTFT median [0-9.]* ms p99 [0-9.]* ms\|E2E median [0-9.]* ms\|= [0-9.]* us per event\( written\)\?' | tr '\n' ' ' | sed 's/^/watched:   /'
    kill -TERM $tap; wait $tap 2>/dev/null || true
    # what the tap measured of the watched wave: one record per stream, every token counted
    [ -z "${TAP_PROBE:-}" ] && printf '| ' && python3 benches/tap_records.py "$work/tap.jsonl" "$STREAMS" "$TOKENS"
    # and what it said of itself: lost segments, a window closed early (the first two warnings)
    [ -z "${TAP_PROBE:-}" ] && grep -m2 -o 'WARN.*' "$work/tap.err" | sed 's/^/ | /' | tr -d '\n' || true
    echo
  done
  kill $replay; wait $replay 2>/dev/null || true
fi
rm -rf "$work"
