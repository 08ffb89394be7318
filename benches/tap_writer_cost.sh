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
#   usage: benches/tap_writer_cost.sh [ROUNDS=5] [COUNT=200000] [EVENT_BYTES=200]
#   (repo root, after cargo build --release; TAP_SUP=PATH runs another build of the supervisor)
set -euo pipefail
ROUNDS=${1:-5} COUNT=${2:-200000} BYTES=${3:-200}
WRITER_CPU=${WRITER_CPU:-0} TAP_CPU=${TAP_CPU:-1}
cd "$(dirname "$0")/.."
. benches/tap_attach.sh
W=$(mktemp -d)
trap 'kill ${http:-} ${tap:-} 2>/dev/null; rm -rf "$W"' EXIT
writer_port "$W"

one() {  # one run: prints send + recv µs per event (the mean over the writers)
  local k=2 cpu pids=()
  for cpu in ${WRITER_CPUS:-$WRITER_CPU}; do
    taskset -c "$cpu" "$W/tcp_op_cost" "$COUNT" "$BYTES" "$PORT" "$k" ${WORK_KB:-} > "$W/one-$k" &
    pids+=($!)
    k=$((k + 1))
  done
  wait "${pids[@]}"
  local figure='s/.*send \+ recv ([0-9.]+) us.*/\1/'
  [ -n "${WORK_KB:-}" ] && figure='s/.*user ([0-9.]+) us.*/\1/'
  cat "$W"/one-* | tee -a "$W/runs" | sed -E "$figure" |
    awk '{s += $1; n++} END {printf "%.3f\n", s / n}'
  rm -f "$W"/one-*
}
tapped() {
  tap_attach "$PORT" "$W"
  grep -q '"event":"ready"' "$W/tap-ev.jsonl" || { echo "tap_writer_cost: the tap did not get ready: $(tail -3 "$W/tap.err")" >&2; exit 1; }
  taskset -a -p -c "$TAP_CPU" "$tap" >/dev/null
  one
  kill -INT "$tap"; wait "$tap" || true; tap=
}
diffs=()
for r in $(seq "$ROUNDS"); do
  if (( r % 2 )); then b=$(one); t=$(tapped); else t=$(tapped); b=$(one); fi
  d=$(awk -v t="$t" -v b="$b" 'BEGIN{printf "%.3f", t - b}')
  diffs+=("$d")
  echo "round $r: bare $b us, tapped $t us per event of $BYTES bytes${WORK_KB:+ (user time, $WORK_KB KiB walk)}: tap adds $d us"
done
what="send + recv in the writer"; [ -n "${WORK_KB:-}" ] && what="the writer's user time, $WORK_KB KiB walk"
printf '%s\n' "${diffs[@]}" | sort -g | awk -v n="$ROUNDS" -v what="$what" '{a[NR]=$1} END{m=(n%2)?a[(n+1)/2]:(a[n/2]+a[n/2+1])/2;
  printf "tap_writer_cost: median added %.3f us per event (%s), range %.3f to %.3f, %d pairs\n", m, what, a[1], a[n], n}'
