# shellcheck shell=bash
# free_port: a port for a server a bench starts, below Linux's ephemeral range (32768-60999 by
# default: an outgoing connection can take a port inside it between the pick and the server's
# bind, which failed the load test at times) and free at the time of the pick.
free_port() {
  local p
  for _ in $(seq 50); do
    p=$((12000 + RANDOM % 7000))
    if python3 -c 'import socket, sys; socket.socket().bind(("127.0.0.1", int(sys.argv[1])))' "$p" 2>/dev/null; then
      echo "$p"
      return 0
    fi
  done
  echo "no free port between 12000 and 19000" >&2
  return 1
}
