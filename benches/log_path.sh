#!/usr/bin/env bash
# Log path throughput: `sglang-supervisor run -- cat BIG` (tee to file + terminal copy + full
# parsing) against `cat BIG | tee FILE >/dev/null`, on a 200 MB+ log made of real SGLang lines.
# Runs alternate side by side; prints medians and the ratio. Usage: benches/log_path.sh [RUNS] [MB]
# SUP_EXTRA adds supervisor options, e.g. the cost of scanning for secrets:
#   HF_TOKEN=hf_0123456789abcdef SUP_EXTRA=--redact-log benches/log_path.sh 9 256
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-7}; mb=${2:-256}
bin=target/release/sglang-supervisor
[ -x "$bin" ] || cargo build --release -p sglang-supervisor
work=${BENCH_DIR:-$(mktemp -d)}; mkdir -p "$work"; big=$work/big.log
if [ ! -s "$big" ]; then
  # One real startup (server_args line, phases, warnings, ready line), then the steady state of a
  # serving log: the recorded batch and access lines, repeated to size. (A failure line in the
  # corpus would, rightly, make the supervisor stop `cat`.)
  fx=tests/fixtures/sglang-0.5.14-h200
  grep -v 'SIGTERM received\|Gracefully exiting\|kill_process_tree\|destroy_process_group' "$fx/A_nograph/server.log" > "$big"
  grep -hE 'Decode batch|Prefill batch|INFO:     127\.0\.0\.1' "$fx"/{A_nograph,B_decode_graph,F_tokworkers2}/server.log > "$work/steady"
  for _ in $(seq 10); do cat "$work/steady"; done > "$work/steady10"
  while [ "$(stat -c %s "$big")" -lt $((mb << 20)) ]; do cat "$work/steady10" >> "$big"; done
fi
size=$(stat -c %s "$big")
now() { date +%s.%N; }
tee_t=(); sup_t=()
for i in $(seq "$runs"); do
  t0=$(now); cat "$big" | tee "$work/tee.out" >/dev/null; t1=$(now); tee_t+=("$(echo "$t1 - $t0" | bc -l)")
  # shellcheck disable=SC2086
  t0=$(now); "$bin" run ${SUP_EXTRA:-} --log-file "$work/sup.out" --events "$work/ev.jsonl" -- cat "$big" >/dev/null 2>"$work/sup.err"; t1=$(now)
  sup_t+=("$(echo "$t1 - $t0" | bc -l)")
  cmp -s "$big" "$work/sup.out" || { echo "log file differs from the input" >&2; exit 1; }
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END{print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
mt=$(median "${tee_t[@]}"); ms=$(median "${sup_t[@]}")
rss=$(grep -o '"supervisor_max_rss_kb":[0-9]*' "$work/ev.jsonl" | cut -d: -f2)
lines=$(grep -o '"lines":[0-9]*' "$work/ev.jsonl" | cut -d: -f2)
printf 'input %d MB (%s lines), %d runs each\n' $((size >> 20)) "$lines" "$runs"
printf 'cat | tee        median %.3f s  (%.0f MB/s)\n' "$mt" "$(echo "$size / 1048576 / $mt" | bc -l)"
printf 'supervisor run   median %.3f s  (%.0f MB/s)\n' "$ms" "$(echo "$size / 1048576 / $ms" | bc -l)"
printf 'ratio (supervisor throughput / tee throughput): %.2f\n' "$(echo "$mt / $ms" | bc -l)"
printf 'supervisor peak RSS: %s kB\n' "$rss"
