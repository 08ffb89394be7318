#!/usr/bin/env bash
# Builds the supervisor and runs it on the embedded default: a replay of a real SGLang 0.5.14 start
# recorded on an H200 (tests/fixtures/), served on 127.0.0.1:30000, ten times faster than recorded.
# It prints the server's log as it comes, the supervisor's own messages, then the events file.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
cargo build --release --workspace --bins
out=${DEMO_DIR:-target/demo}; mkdir -p "$out"
set +e
target/release/sglang-supervisor run --events "$out/events.jsonl" --log-file "$out/server.log" \
  --ready-timeout 2m -- target/release/sglang-replay --speed 10 --exit-after-ready 0:2 "$@"
status=$?
set -e
echo; echo "== supervisor exit status: $status; events ($out/events.jsonl):"
cut -c1-200 "$out/events.jsonl"
exit "$status"
