#!/usr/bin/env bash
# What taps cost a saturated Python streaming server (benches/py_sse_server.py, asyncio, on
# SERVER_CPU), its streams read by stream-load (STREAMS of 256 tokens) on OTHER_CPU, where the
# taps run too, keyed on and off in turns of 2–3 s by scripts/gpu/tap_toggle.py, as the
# acceptance keys a real SGLang's (SIDES=keyedtog). Each 0.25 s slice of the server's own
# samples that lies wholly within an on-turn or an off-turn counts for it: its events a second,
# and its user and system time an event. Arms, each run for SECS in every round:
#   supN    N supervisors tapping the port (`run --tap --upstream`), their requests logged
#   drainN  N rings of benches/ring_drain.c: the tap's filter and ring, no reader's work
#   touchN  the same, every byte read
#   bpfN    N eBPF programs of benches/ring_drain.c (KIND bpf: the cgroup egress hook, a BPF ring
#           buffer each), keyed by signals (tap_toggle.py --signals): off, no program at all
#   packetN drainN keyed the same way: off, its packet sockets off the packet hook, so on − off is the
#           whole cost, the packet hook's own included, like for like with bpfN (drainN's filter
#           swap keys the copy alone)
# Prints each run, then per arm the median of its rounds: events/s on/off, and on − off of the
# user and the system time an event.
#   usage: benches/tap_server_cost.sh [ARMS="sup8 drain8"] [ROUNDS=3] [SECS=40] [STREAMS=32]
#   (repo root, after cargo build --release --workspace --bins; needs CAP_NET_RAW and, for
#   tap_toggle.py's pidfd_getfd, the right to ptrace the taps: root)
set -euo pipefail
ARMS=${1:-sup8 drain8} ROUNDS=${2:-3} SECS=${3:-40} STREAMS=${4:-32}
SERVER_CPU=${SERVER_CPU:-0} OTHER_CPU=${OTHER_CPU:-1}
cd "$(dirname "$0")/.."
for a in $ARMS; do
  [[ $a =~ ^(sup|drain|touch|bpf|packet)([1-9]|[1-5][0-9]|6[0-4])$ ]] || { echo "tap_server_cost: arm '$a': expected supN, drainN, touchN, bpfN or packetN (N 1..64)" >&2; exit 2; }
done
for b in sglang-supervisor stream-load; do
  [ -x "target/release/$b" ] || { echo "tap_server_cost: target/release/$b is missing: cargo build --release --workspace --bins" >&2; exit 2; }
done
W=$(mktemp -d)
pids=()
# (under set -e a trap stops at its first failing command: a kill with nothing to kill)
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$W"' EXIT
cc -O2 -o "$W/ring_drain" benches/ring_drain.c
. benches/free_port.sh
. benches/tap_attach.sh

one() {  # one ARM: prints "events/s-ratio user-diff system-diff" and says the run on stderr
  local arm=$1 n=${1//[a-z]/} port k taps=()
  # run in $(...), a subshell: its own trap takes its server and taps down if it is stopped
  trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
  port=$(free_port)
  rm -f "$W/stop" "$W/keys" "$W/samples"
  # what is started here writes nothing to the $(...) pipe, which would wait for it to exit
  taskset -c "$SERVER_CPU" python3 benches/py_sse_server.py "$port" "$W/samples" > /dev/null & pids=("$!")
  for _ in $(seq 100); do [ -s "$W/samples" ] && break; sleep 0.05; done
  case $arm in
    sup*)
      for k in $(seq "$n"); do
        mkdir -p "$W/tap$k"
        tap_attach "$port" "$W/tap$k"
        taps+=("$tap"); pids+=("$tap")  # in pids at once: a tap that is not ready exits the run
        grep -q '"event":"ready"' "$W/tap$k/tap-ev.jsonl" || { echo "tap_server_cost: tap $k not ready: $(tail -2 "$W/tap$k/tap.err")" >&2; exit 1; }
        taskset -a -p -c "$OTHER_CPU" "$tap" > /dev/null
      done ;;
    drain*|touch*|bpf*|packet*)
      local mode=${arm%%[0-9]*} kind=packet
      case $mode in bpf|packet) kind=$mode; mode=drain ;; esac
      ring_drain_start "tap_server_cost: $arm:" "$W/drain.err" taskset -c "$OTHER_CPU" "$W/ring_drain" "$port" "$n" "$mode" "$kind" || exit 1
      taps+=("$drain"); pids+=("$drain") ;;
  esac
  local by=(); [[ $arm == bpf* || $arm == packet* ]] && by=(--signals)
  taskset -c "$OTHER_CPU" python3 scripts/gpu/tap_toggle.py "${by[@]}" "$(IFS=,; echo "${taps[*]}")" "$W/stop" "$W/keys" 2000 > /dev/null &
  local toggle=$!; pids+=("$toggle")
  taskset -c "$OTHER_CPU" target/release/stream-load "127.0.0.1:$port" "$STREAMS" 256 "$SECS" > /dev/null
  touch "$W/stop"; wait "$toggle"
  kill -INT "${taps[@]}"; wait "${taps[@]}" 2>/dev/null || true
  # a ring that overflowed copied less than the server sent: not a figure
  if [[ $arm != sup* ]]; then ring_drain_check_drops "tap_server_cost: $arm:" "$W/drain.err" || exit 1; fi
  kill "${pids[0]}"; wait "${pids[0]}" 2>/dev/null || true
  pids=()
  python3 - "$W/samples" "$W/keys" "$arm" <<'PY'
import sys
samples = [list(map(float, l.split())) for l in open(sys.argv[1])]
keys = [list(map(float, l.split()[:3])) for l in open(sys.argv[2])]
def state(a, b):
    if any(on <= a and b <= off for _, on, off in keys):
        return "on"
    if any(k[2] <= a and b <= n[1] for k, n in zip(keys, keys[1:])):
        return "off"
    return None
sums = {"on": [0.0] * 4, "off": [0.0] * 4}  # events, user, system, seconds
for a, b, events, user, system in samples:
    s = state(a, b)
    if s:
        for i, v in enumerate((events, user, system, b - a)):
            sums[s][i] += v
(e1, u1, s1, t1), (e0, u0, s0, t0) = sums["on"], sums["off"]
if not (e1 and e0):
    sys.exit(f"tap_server_cost: {sys.argv[3]}: no slice wholly on or off ({len(samples)} samples, {len(keys)} on-turns):"
             " a longer SECS gives more turns")
ratio, du, ds = (e1 / t1) / (e0 / t0), (u1 / e1 - u0 / e0) * 1e6, (s1 / e1 - s0 / e0) * 1e6
print(f"{sys.argv[3]}: events/s on/off {ratio:.3f} ({e1 / t1:.0f} / {e0 / t0:.0f}), user {u0 / e0 * 1e6:.2f} us an event off, "
      f"{du:+.2f} on; system {s0 / e0 * 1e6:.2f} off, {ds:+.2f} on; busy {(u0 + s0) / t0 * 100:.0f} % off", file=sys.stderr)
print(f"{ratio:.4f} {du:.3f} {ds:.3f}")
PY
}

declare -A got
for r in $(seq "$ROUNDS"); do
  for a in $ARMS; do got[$a]+="$(one "$a")"$'\n'; done
done
for a in $ARMS; do
  printf '%s' "${got[$a]}" | python3 -c '
import statistics, sys
rows = [list(map(float, l.split())) for l in sys.stdin if l.strip()]
med = [statistics.median(c) for c in zip(*rows)]
print(f"tap_server_cost: {sys.argv[1]}, median of {len(rows)} runs: events/s on/off {med[0]:.3f}, user {med[1]:+.2f} us an event, system {med[2]:+.2f} us")' "$a"
done
