# shellcheck shell=bash
# tap_attach PORT DIR: a supervisor attached to the server on PORT with `run --tap --upstream`
# (its pid in $tap), once it is ready; its events, requests log and stderr in DIR (tap-ev.jsonl,
# tap.jsonl, tap.err). TAP_SUP=PATH runs another build of the supervisor.
tap_attach() {
  rm -f "$2/tap-ev.jsonl"
  "${TAP_SUP:-target/release/sglang-supervisor}" run --upstream "http://127.0.0.1:$1" --ready-on http --tap \
    --metrics-addr none --gpu-backend none --no-preflight --no-tee --events "$2/tap-ev.jsonl" \
    --requests-log "$2/tap.jsonl" -- sleep 100000 2> "$2/tap.err" &
  tap=$!
  for _ in $(seq 200); do grep -q '"event":"ready"' "$2/tap-ev.jsonl" 2>/dev/null && break; sleep 0.05; done
}
