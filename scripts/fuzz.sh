#!/usr/bin/env bash
# Long fuzzing runs by hand, coverage-guided (libFuzzer through cargo-fuzz), over the harnesses
# that CI runs for a few seconds each (tests/tests/fuzz.rs). New inputs that add coverage go into
# fuzz/corpus/TARGET (commit the interesting ones); a crash is saved under fuzz/artifacts/.
# Usage: scripts/fuzz.sh [TARGET|all] [SECONDS]     (cargo install cargo-fuzz)
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
target=${1:-all}; secs=${2:-60}
targets=$([ "$target" = all ] && echo log_line server_args recipe sse run_json flag_schema body_counts || echo "$target")
# cargo-fuzz passes unstable flags; the toolchain here is stable.
export RUSTC_BOOTSTRAP=1
for t in $targets; do
  mkdir -p "target/corpus/$t"
  # New inputs go to target/corpus (scratch); the committed corpus is read as seeds.
  cargo fuzz run --sanitizer none "$t" "target/corpus/$t" "corpus/$t" -- -max_total_time="$secs" -max_len=65536 2>&1 | grep -E "^#[0-9]+.*(DONE|NEW|pulse)|Done|ERROR|panicked|SUMMARY" | tail -4
done
