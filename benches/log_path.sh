#!/usr/bin/env bash
# Log path throughput: `sglang-supervisor run -- cat BIG` (tee to file + terminal copy + full
# parsing) against `cat BIG | tee FILE >/dev/null`, on a 200 MB+ log made of real SGLang lines.
# Usage: benches/log_path.sh [ROUNDS] [MB]
#
# Each round runs, side by side and in this order:
#   cat | tee                                      the reference
#   run -- cat BIG                                 the supervisor as it starts by default
#   run --gpu-backend none -- cat BIG              the same without GPU sampling (no NVML load)
#   run -- date,  run --gpu-backend none -- date   the fixed cost, with no log to speak of
# and prints medians: throughput and its ratio to `cat | tee` end to end, and net of the fixed
# cost (a GPU host loads NVML at start and reads energy counters at exit: that is start-up, not
# throughput); the CPU seconds of each contender (user + system of the whole pipeline, `cat`
# included: steadier than wall time on a loaded machine); the fixed cost itself, split into
# "launch to child running" (the child, `date`, prints its own clock) and the whole `run -- date`;
# the supervisor's peak RSS.
#
# Self-contained: the input is built here from tests/fixtures; nothing is built or downloaded when
# the binary exists (SUP_BIN=path picks another one). Needs bash, coreutils, awk, cmp.
# SUP_EXTRA adds supervisor options, e.g. the cost of scanning for secrets:
#   HF_TOKEN=hf_0123456789abcdef SUP_EXTRA=--redact-log benches/log_path.sh 9 256
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-7}; mb=${2:-256}
bin=${SUP_BIN:-target/release/sglang-supervisor}
[ -x "$bin" ] || cargo build --release -p sglang-supervisor
work=${BENCH_DIR:-$(mktemp -d)}; mkdir -p "$work"; big=$work/big.log
if [ ! -s "$big" ] || [ "$(stat -c %s "$big")" -lt $((mb << 20)) ]; then
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

ns() { date +%s%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.6f", (b - a) / 1e9 }'; }
field() { grep -o "\"$1\":[0-9.]*" "$2" | tail -1 | cut -d: -f2; }
TIMEFORMAT='%R %U %S'
# timed NAME command...: wall seconds appended to NAME_t, user + system seconds to NAME_c.
timed() {
  local name=$1 r u s; shift
  { time "$@"; } 2> "$work/time.out"
  read -r r u s < <(tail -1 "$work/time.out")
  eval "${name}_t+=($r)"
  eval "${name}_c+=($(awk -v u="$u" -v s="$s" 'BEGIN { print u + s }'))"
}
tee_run() { cat "$big" | tee "$work/tee.out" >/dev/null; }
# The supervisor's own messages and the child's terminal copy go to /dev/null, like tee's stdout.
# The metrics server runs as by default, on a free port (9400 may be taken on a shared host).
sup() { # sup OUT_PREFIX [options] -- command...
  local out=$1; shift
  # shellcheck disable=SC2086
  "$bin" run --metrics-addr 127.0.0.1:0 ${SUP_EXTRA:-} --log-file "$out.log" --events "$out.ev" "$@" >/dev/null 2>"$out.err"
}

declare -a tee_t tee_c sup_t sup_c non_t non_c fix_t fixn_t start_t startn_t direct_t rss_a rss_n cpu_a cpu_n
for _ in $(seq "$runs"); do
  timed tee tee_run

  timed sup sup "$work/sup" -- cat "$big"
  cmp -s "$big" "$work/sup.log" || { echo "log file differs from the input" >&2; exit 1; }
  rss_a+=("$(field supervisor_max_rss_kb "$work/sup.ev")"); cpu_a+=("$(field supervisor_cpu_s "$work/sup.ev")")

  timed non sup "$work/non" --gpu-backend none -- cat "$big"
  cmp -s "$big" "$work/non.log" || { echo "log file differs from the input (--gpu-backend none)" >&2; exit 1; }
  rss_n+=("$(field supervisor_max_rss_kb "$work/non.ev")"); cpu_n+=("$(field supervisor_cpu_s "$work/non.ev")")

  # Fixed cost: launch to the child running (it prints its clock), and the whole run around it.
  t0=$(ns); date +%s%N > "$work/direct.out"; direct_t+=("$(secs "$t0" "$(cat "$work/direct.out")")")
  t0=$(ns); sup "$work/fix" -- date +%s%N; t1=$(ns)
  fix_t+=("$(secs "$t0" "$t1")"); start_t+=("$(secs "$t0" "$(head -1 "$work/fix.log")")")
  t0=$(ns); sup "$work/fixn" --gpu-backend none -- date +%s%N; t1=$(ns)
  fixn_t+=("$(secs "$t0" "$t1")"); startn_t+=("$(secs "$t0" "$(head -1 "$work/fixn.log")")")
done

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END{print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
lines=$(field lines "$work/sup.ev")
gpus=$(grep -c '"event":"power"' "$work/sup.ev" || true)
awk -v size="$size" -v lines="$lines" -v runs="$runs" -v gpus="$gpus" -v extra="${SUP_EXTRA:-}" \
    -v mt="$(median "${tee_t[@]}")" -v ms="$(median "${sup_t[@]}")" -v mn="$(median "${non_t[@]}")" \
    -v ct="$(median "${tee_c[@]}")" -v cs="$(median "${sup_c[@]}")" -v cn="$(median "${non_c[@]}")" \
    -v mf="$(median "${fix_t[@]}")" -v mfn="$(median "${fixn_t[@]}")" \
    -v ma="$(median "${start_t[@]}")" -v man="$(median "${startn_t[@]}")" -v md="$(median "${direct_t[@]}")" \
    -v ra="$(median "${rss_a[@]}")" -v rn="$(median "${rss_n[@]}")" \
    -v oa="$(median "${cpu_a[@]}")" -v on="$(median "${cpu_n[@]}")" '
function mbs(t) { return size / 1048576 / t }
BEGIN {
  printf "input %d MB (%s lines), %d rounds, medians; supervisor options: %s\n", size / 1048576, lines, runs, (extra == "" ? "(none)" : extra)
  printf "GPU sampling in the default run: %s\n", (gpus > 0 ? "yes (it reported a power window)" : "no GPU found")
  printf "%-31s %7s %6s %6s %9s %7s %9s\n", "", "wall s", "MB/s", "ratio", "net ratio", "CPU s", "CPU ratio"
  printf "%-31s %7.3f %6.0f %6s %9s %7.3f %9s\n", "cat | tee", mt, mbs(mt), "1", "1", ct, "1"
  printf "%-31s %7.3f %6.0f %6.2f %9.2f %7.3f %9.2f\n", "run -- cat (default)", ms, mbs(ms), mt / ms, mt / (ms - mf), cs, cs / ct
  printf "%-31s %7.3f %6.0f %6.2f %9.2f %7.3f %9.2f\n", "run --gpu-backend none -- cat", mn, mbs(mn), mt / mn, mt / (mn - mfn), cn, cn / ct
  printf "ratio: throughput / tee throughput (tee wall / supervisor wall), >= 1 is as fast; net ratio: the\n"
  printf "same with the fixed cost below taken off the supervisor wall; CPU: user + system of the whole\n"
  printf "pipeline (cat included), CPU ratio = supervisor / tee.\n"
  printf "fixed cost, default:            launch to child running %6.1f ms, whole run -- date %6.1f ms\n", ma * 1000, mf * 1000
  printf "fixed cost, --gpu-backend none: launch to child running %6.1f ms, whole run -- date %6.1f ms\n", man * 1000, mfn * 1000
  printf "reference: launch to a bare date running %.1f ms\n", md * 1000
  printf "supervisor peak RSS: default %d kB, --gpu-backend none %d kB; its own CPU (getrusage): default %.3f s, none %.3f s\n", ra, rn, oa, on
}'
