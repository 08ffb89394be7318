#!/usr/bin/env bash
# Where the tap's cost falls in the writer's kernel path: `perf record -e cpu-clock -g` of
# benches/tcp_op_cost.c (one thread sends EVENT_BYTES on loopback TCP and reads them back) with a
# supervisor tapping its port, the writer on CPU WRITER_CPU and the tap on TAP_CPU. Prints the
# writer's send + recv µs per event (under perf), the share of its samples in the tap's kernel
# functions (inclusive: tpacket_rcv; in it the copy, the filter, the block hand-over whose wake-up
# of a reader asleep on the socket is the server's to pay), how often the tap thread was seen
# raised (nice or real time, `ps -L` every 100 ms), its CPU ticks and context switches, and any
# drop it reported. RUNS runs, alternating between the builds in TAP_SUPS (default: this one).
#   usage: benches/tap_writer_profile.sh [RUNS=2] [COUNT=300000] [EVENT_BYTES=1500]
#   (repo root, after cargo build --release; needs perf and root; TAP_SUPS="PATH PATH" compares
#   builds; a build run under `setpriv --bounding-set -sys_nice` is never raised)
set -euo pipefail
RUNS=${1:-2} COUNT=${2:-300000} BYTES=${3:-1500}
WRITER_CPU=${WRITER_CPU:-0} TAP_CPU=${TAP_CPU:-1}
cd "$(dirname "$0")/.."
command -v perf >/dev/null || { echo "tap_writer_profile: needs perf (scripts/setup.sh installs it)" >&2; exit 1; }
. benches/tap_attach.sh
W=$(mktemp -d)
trap 'kill ${http:-} ${tap:-} ${watch:-} 2>/dev/null; rm -rf "$W"' EXIT
writer_port "$W"

one() {  # one profiled run with the build $1
  TAP_SUP=$1 tap_attach "$PORT" "$W"
  grep -q '"event":"ready"' "$W/tap-ev.jsonl" || { echo "tap_writer_profile: the tap did not get ready: $(tail -3 "$W/tap.err")" >&2; exit 1; }
  taskset -a -p -c "$TAP_CPU" "$tap" >/dev/null
  # The tap's threads seen at a nice value other than 0 or a policy other than TS.
  (for _ in $(seq 30); do { ps -L -o ni=,cls=,comm= -p "$tap" || true; } | awk '$3 == "tap" && ($1 != 0 || $2 != "TS")'; sleep 0.1; done | wc -l > "$W/raised") &
  watch=$!
  local us
  us=$(perf record -q -e cpu-clock -g -o "$W/perf.data" -- taskset -c "$WRITER_CPU" "$W/tcp_op_cost" "$COUNT" "$BYTES" "$PORT" 2 2>/dev/null |
    sed -E 's/.*send \+ recv ([0-9.]+) us.*/\1/')
  wait "$watch"; watch=
  local ticks switches
  ticks=$(awk '{print $14 + $15}' "/proc/$tap/stat")
  switches=$(cat /proc/"$tap"/task/*/status | awk '/^voluntary_ctxt/{v += $2} END{print v}')
  kill -INT "$tap"; wait "$tap" || true; tap=
  local shares
  shares=$(perf report -i "$W/perf.data" --children --stdio --sort sym -g none 2>/dev/null |
    awk '$1 ~ /%$/ && $NF ~ /^(tpacket_rcv|skb_copy_bits|bpf_prog_run_pin_on_cpu|prb_retire_current_block)$/ {s[$NF] = $1}
      END {printf "tpacket_rcv %s (copy %s, filter %s, hand-over %s)", s["tpacket_rcv"], s["skb_copy_bits"] ? s["skb_copy_bits"] : "0%",
        s["bpf_prog_run_pin_on_cpu"] ? s["bpf_prog_run_pin_on_cpu"] : "0%", s["prb_retire_current_block"] ? s["prb_retire_current_block"] : "0%"}')
  echo "$1: send + recv $us us; $shares; raised $(cat "$W/raised")/30; tap $ticks ticks, $switches switches; drops said: $(grep -ci 'dropped\|overflow' "$W/tap.err" || true)"
}
read -r -a sups <<< "${TAP_SUPS:-target/release/sglang-supervisor}"
for r in $(seq "$RUNS"); do
  for s in "${sups[@]}"; do one "$s"; done
done
