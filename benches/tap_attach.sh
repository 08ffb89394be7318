# shellcheck shell=bash
# tap_attach PORT DIR: a supervisor attached to the server on PORT with `run --tap --upstream`
# (its pid in $tap), once it is ready; its events, requests log and stderr in DIR (tap-ev.jsonl,
# tap.jsonl, tap.err). TAP_SUP=PATH runs another build of the supervisor. Its stdout is not the
# caller's: a tap started in $(...) would hold that open until it exits.
tap_attach() {
  rm -f "$2/tap-ev.jsonl"
  "${TAP_SUP:-target/release/sglang-supervisor}" run --upstream "http://127.0.0.1:$1" --ready-on http --tap \
    --metrics-addr none --gpu-backend none --no-preflight --no-tee --events "$2/tap-ev.jsonl" \
    --requests-log "$2/tap.jsonl" -- sleep 100000 > /dev/null 2> "$2/tap.err" &
  tap=$!
  for _ in $(seq 200); do grep -q '"event":"ready"' "$2/tap-ev.jsonl" 2>/dev/null && break; sleep 0.05; done
}

# writer_port DIR: for benches/tcp_op_cost.c under a tap: builds it as DIR/tcp_op_cost, and sets
# PORT to a free port with a file server on 127.0.0.1:PORT (its pid in $http) answering /health,
# which the tap's readiness needs; tcp_op_cost listens on 127.0.0.2:PORT, a segment the same
# filter keeps.
writer_port() {
  cc -O2 -o "$1/tcp_op_cost" benches/tcp_op_cost.c
  PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  mkdir "$1/www" && echo ok > "$1/www/health"
  python3 -m http.server "$PORT" --bind 127.0.0.1 --directory "$1/www" >/dev/null 2>&1 &
  http=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.05; done
}
