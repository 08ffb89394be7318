#!/usr/bin/env bash
# What `run --tap` adds to the server's own sends: the kernel copies each segment of the tapped
# port into the tap's ring in the writer's path (on loopback, in the softirq the send runs), which
# is the one cost the tap puts on a server that is never slowed by the tap's thread. Measured with
# benches/tcp_op_cost.c (one thread sends EVENT_BYTES on loopback TCP and reads them back, never
# blocking): bare and with a supervisor tapping its port, in ABBA order, ROUNDS pairs, each run
# pinned to CPU WRITER_CPU and the tap to TAP_CPU. Prints each run and the median of the pairs'
# differences (tapped - bare, µs per event of send + recv). WRITER_CPUS="0 1 ..." runs one writer
# per CPU listed at once, each on its own address and the same tapped port (their mean per run):
# whether writers on several CPUs cost each other more through the tap's one ring. WORK_KB=N
# gives each event a walk of an N KiB working set in the writer (tcp_op_cost's WORK_KB), and
# compares its user time an event instead: what the tap costs the writer's own code, whose caches
# the kernel's copy into the ring (SGLANG_SUPERVISOR_TAP_RING_MB, default 32) runs through.
# PY_WRITER=1 runs benches/py_event_writer.py instead (a Python writer building OpenAI chat chunks)
# and compares its user time an event, as WORK_KB does, the system time's median beside it.
# SHOW_RUNS=1 prints each run's own line. TAPS=N attaches N supervisors to the port for the tapped runs, each copying every segment into
# its own ring: N times one tap's cost, to tell it from the host's noise. DRAIN=packet|bpf copies
# without a tap: TAPS rings of benches/ring_drain.c of that kind (packet: the tap's packet rings,
# nothing read; bpf: eBPF programs on the cgroup egress hook, each keeping the same bytes in a
# BPF ring buffer), so that the two ways of copying are compared on the same writer.
#   usage: benches/tap_writer_cost.sh [ROUNDS=5] [COUNT=200000] [EVENT_BYTES=200]
#   (repo root, after cargo build --release; TAP_SUP=PATH runs another build of the supervisor)
set -euo pipefail
ROUNDS=${1:-5} COUNT=${2:-200000} BYTES=${3:-200}
case ${DRAIN:-} in ""|packet|bpf) ;; *) echo "tap_writer_cost: DRAIN=$DRAIN: expected packet or bpf" >&2; exit 2 ;; esac
WRITER_CPU=${WRITER_CPU:-0} TAP_CPU=${TAP_CPU:-1}
cd "$(dirname "$0")/.."
. benches/tap_attach.sh
W=$(mktemp -d)
trap 'kill ${http:-} 2>/dev/null; rm -rf "$W"' EXIT
writer_port "$W"

one() {  # one run: prints send + recv µs per event (the mean over the writers)
  local k=2 cpu pids=()
  for cpu in ${WRITER_CPUS:-$WRITER_CPU}; do
    if [ -n "${PY_WRITER:-}" ]; then
      taskset -c "$cpu" python3 benches/py_event_writer.py "$COUNT" "$BYTES" "$PORT" "$k" > "$W/one-$k" &
    else
      taskset -c "$cpu" "$W/tcp_op_cost" "$COUNT" "$BYTES" "$PORT" "$k" ${WORK_KB:-} > "$W/one-$k" &
    fi
    pids+=($!)
    k=$((k + 1))
  done
  # (errexit is off in $(...): a writer that failed, or printed no figure, is said here)
  wait "${pids[@]}" || { echo "tap_writer_cost: a writer failed: $(cat "$W"/one-* 2>/dev/null)" >&2; exit 1; }
  # the figure (send + recv, or user time with WORK_KB or PY_WRITER), and the system time an event
  # where the line has it (else 0)
  local figure="send [+] recv"; [ -n "${WORK_KB:-}${PY_WRITER:-}" ] && figure="user"
  cat "$W"/one-* | tee -a "$W/runs" | awk -v f="$figure" '
    function after(re,   t) { if (!match($0, re " [0-9.]+ us")) return 0; t = substr($0, RSTART, RLENGTH); sub(/ us$/, "", t); sub(/.* /, "", t); return t + 0 }
    { s += after(f); y += after("system"); n++ }
    END { if (!n || !s) { print "tap_writer_cost: no figure in a writer'"'"'s line" > "/dev/stderr"; exit 1 }
          printf "%.3f %.3f\n", s / n, y / n }' || exit 1
  [ -n "${SHOW_RUNS:-}" ] && cat "$W"/one-* >&2
  rm -f "$W"/one-*
}
tapped() {  # TAPS=N supervisors tapping the port at once, each with its own ring
  local k taps=()
  # run in $(...), a subshell: its own trap takes its taps down, whatever stops it
  trap 'kill "${taps[@]}" 2>/dev/null' EXIT
  if [ -n "${DRAIN:-}" ]; then
    ring_drain_start tap_writer_cost: "$W/drain.err" taskset -c "$TAP_CPU" "$W/ring_drain" "$PORT" "${TAPS:-1}" drain "$DRAIN" || exit 1
    taps+=("$drain")
  else
    for k in $(seq "${TAPS:-1}"); do
      mkdir -p "$W/tap$k"
      tap_attach "$PORT" "$W/tap$k"
      taps+=("$tap")
      grep -q '"event":"ready"' "$W/tap$k/tap-ev.jsonl" || { echo "tap_writer_cost: the tap did not get ready: $(tail -3 "$W/tap$k/tap.err")" >&2; exit 1; }
      taskset -a -p -c "$TAP_CPU" "$tap" >/dev/null
    done
  fi
  one || exit 1
  kill -INT "${taps[@]}"; wait "${taps[@]}" || true; taps=()
  # a ring that overflowed (its reader starved) copied less than the writer sent: not a figure
  if [ -n "${DRAIN:-}" ]; then ring_drain_check_drops tap_writer_cost: "$W/drain.err" || exit 1; fi
}
[ -n "${DRAIN:-}" ] && cc -O2 -o "$W/ring_drain" benches/ring_drain.c
event="$BYTES bytes"; [ -n "${PY_WRITER:-}" ] && event="a chat chunk, about 290 bytes"
diffs=() sysdiffs=()
for r in $(seq "$ROUNDS"); do
  if (( r % 2 )); then bare=$(one); tap_=$(tapped); else tap_=$(tapped); bare=$(one); fi
  read -r b bs <<< "$bare"; read -r t ts <<< "$tap_"
  d=$(awk -v t="$t" -v b="$b" 'BEGIN{printf "%.3f", t - b}')
  diffs+=("$d"); sysdiffs+=("$(awk -v t="$ts" -v b="$bs" 'BEGIN{printf "%.3f", t - b}')")
  echo "round $r: bare $b us, tapped${TAPS:+ by $TAPS} $t us per event of $event${WORK_KB:+ (user time, $WORK_KB KiB walk)}${PY_WRITER:+ (user time, Python)}: tap adds $d us${PY_WRITER:+ (system $bs -> $ts us)}"
done
median() { printf '%s\n' "$@" | sort -g | awk -v n="$#" '{a[NR]=$1} END{m=(n%2)?a[(n+1)/2]:(a[n/2]+a[n/2+1])/2; printf "%.3f us per event", m; printf " (range %.3f to %.3f, %d pairs)", a[1], a[n], n}'; }
what="send + recv in the writer"; [ -n "${WORK_KB:-}" ] && what="the writer's user time, $WORK_KB KiB walk"
[ -n "${PY_WRITER:-}" ] && what="the Python writer's user time"
copies="tap(s)"; [ -n "${DRAIN:-}" ] && copies="$DRAIN copies of ring_drain"
echo "tap_writer_cost: ${TAPS:-1} $copies add $(median "${diffs[@]}") to $what"
[ -n "${WORK_KB:-}${PY_WRITER:-}" ] && echo "tap_writer_cost: and $(median "${sysdiffs[@]}") to its system time"
exit 0
