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

# ring_drain_start WHO LOG CMD...: CMD (benches/ring_drain.c's binary and its arguments, after any
# prefix such as taskset) in the background, its pid in $drain, its stderr appended to LOG; returns
# once it prints its "ring(s) on port" line, which comes after every ring is set (a fixed sleep is
# too short for many bpf programs, or too long), or else (it exited, or 10 s passed) takes it down
# and returns 1, said on stderr after WHO. LOG may hold earlier runs (proxy_acceptance.sh appends
# to one): only what this start appends is read, from byte $drain_from on, here and by
# ring_drain_check_drops. Its stdout, where it prints nothing, is not the caller's: in $(...) it
# would hold that open.
ring_drain_start() {
  local who=$1 log=$2; shift 2
  drain_from=$(( $(stat -c %s "$log" 2>/dev/null || echo 0) + 1 ))
  "$@" > /dev/null 2>> "$log" &
  drain=$!
  for _ in $(seq 500); do
    [[ $(tail -c "+$drain_from" "$log") == *'ring(s) on port'* ]] && return 0
    kill -0 "$drain" 2>/dev/null || break
    sleep 0.02
  done
  # (it may have said so just before it exited)
  [[ $(tail -c "+$drain_from" "$log") == *'ring(s) on port'* ]] && return 0
  kill "$drain" 2>/dev/null || true; wait "$drain" 2>/dev/null || true
  echo "$who ring_drain did not start ($log): $(tail -c "+$drain_from" "$log" | tail -3)" >&2
  return 1
}

# ring_drain_check_drops WHO LOG: after the ring_drain that ring_drain_start started with LOG has
# exited, 0 where its final line says ", 0 dropped"; else 1, said in one line on stderr after WHO:
# a ring that overflowed (its reader starved) copied less than was sent, a count it could not read
# ("?") may hide that, and no final line means it never counted (not stopped by SIGTERM or SIGINT).
ring_drain_check_drops() {
  local who=$1 log=$2 last why
  last=$(tail -c "+${drain_from:-1}" "$log" 2>/dev/null | tail -1) || true
  case $last in
    *', 0 dropped') return 0 ;;
    *', ? dropped') why="could not read its drops counter, so it may have dropped" ;;
    *' dropped') why="dropped what it could not hold" ;;
    *) why="printed no final count" ;;
  esac
  echo "$who ring_drain $why ($log): ${last:-nothing}" >&2
  return 1
}
