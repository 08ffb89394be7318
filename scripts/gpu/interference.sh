#!/usr/bin/env bash
# Does a busy proxy slow a Python thread on a CPU it never touches? (docs/real-gpu.md, thirteenth
# session: SGLang's HTTP thread spent 1.06–1.46x the time in every one of its functions while half
# its streams went through the proxy, the same calls made.) No SGLang here: a fixed Python loop on
# its own CPU times itself every 0.5 s while the replay server's streams go to a client straight,
# through the supervisor's proxy and through epoll_relay, phase after phase:
#   idle direct proxied relay direct proxied relay idle
# (PHASES may add "tapped": straight to the server while benches/packet_tap.c watches the port.)
# If the loop's work per CPU-second falls only while the proxy (or any hop) runs, CPUs interfere
# on this host (a shared core, cache or the hypervisor), and SGLang's slowdown is that; if it holds,
# the cause is in what the server itself does.
#   usage: scripts/gpu/interference.sh BINDIR OUTDIR [PHASE_S=20] [STREAMS=256]
#   BINDIR: sglang-supervisor, sglang-replay, stream-load. CPUs (taskset lists, override to fit
#   the host): REPLAY_CPUS (0-3), PROBE_CPUS (7; several, space-separated, one loop each),
#   CLIENT_CPUS (8-11), SUP_CPUS (12-15, also epoll_relay's). SUP_ENV: environment for the
#   supervisor (proxy tuning). PHASES overrides the sequence above.
set -euo pipefail
BINDIR=$(realpath "${1:?bin dir}"); O=$(realpath -m "${2:?outdir}")
PHASE_S=${3:-20}; STREAMS=${4:-256}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
REPLAY_CPUS=${REPLAY_CPUS:-0-3} PROBE_CPUS=${PROBE_CPUS:-7} CLIENT_CPUS=${CLIENT_CPUS:-8-11} SUP_CPUS=${SUP_CPUS:-12-15}
PHASES=${PHASES:-idle direct proxied relay direct proxied relay idle}
for p in $PHASES; do case $p in idle|direct|proxied|relay|tapped) ;; *) echo "interference.sh: phase '$p': expected idle, direct, proxied, relay or tapped" >&2; exit 2 ;; esac; done
for b in sglang-supervisor sglang-replay stream-load; do
  [ -x "$BINDIR/$b" ] || { echo "interference.sh: $BINDIR/$b is missing: build with cargo build --release -p sglang-supervisor -p sglang-supervisor-tests --bins" >&2; exit 2; }
done
mkdir -p "$O"; rm -f "$O"/events.jsonl "$O"/probe*.txt "$O"/phases.txt "$O"/packet_tap.txt  # a stale events file would name an old proxy
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
. "$HERE/benches/free_port.sh"
say() { echo "[interference $(date +%T.%3N)] $*"; }
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
echo "SMT siblings: $(cat /sys/devices/system/cpu/cpu*/topology/thread_siblings_list 2>/dev/null | sort -u | tr '\n' ' ')"

# the bystander: the same Python work in every 0.5 s slice; its work per CPU-second is its speed,
# its CPU per wall second its share of the CPU (below 1: something else ran there)
i=0
for cpu in $PROBE_CPUS; do
  taskset -c "$cpu" python3 -c '
import json, sys, time
doc = {"text": "x" * 200, "meta_info": {"id": "abc", "completion_tokens": 17, "finish_reason": None}}
out = open(sys.argv[1], "w", buffering=1)
while True:
    w0, c0, n = time.time(), time.process_time(), 0
    while time.time() - w0 < 0.5:
        for _ in range(200):
            s = json.dumps(doc); d = json.loads(s); d["meta_info"]["completion_tokens"] += 1
        n += 200
    out.write(f"{time.time():.3f} {n} {time.process_time() - c0:.4f} {time.time() - w0:.4f}\n")
' "$O/probe$i.txt" & pids+=($!)
  i=$((i + 1))
done

port=$(free_port); relay_port=$(free_port)
env ${SUP_ENV:-} taskset -c "$SUP_CPUS" "$BINDIR/sglang-supervisor" run --no-tee --metrics-addr none --proxy-addr 127.0.0.1:0 --events "$O/events.jsonl" \
  -- taskset -c "$REPLAY_CPUS" "$BINDIR/sglang-replay" --port "$port" --speed 100 --token-gap-us 2000 --merge-every 5 >/dev/null 2>&1 & sup=$!; pids+=($sup)
for _ in $(seq 200); do grep -q '"event":"ready"' "$O/events.jsonl" 2>/dev/null && break; sleep 0.05; done
proxy=$(grep -o '"proxy":"[^"]*"' "$O/events.jsonl" | cut -d'"' -f4)
[ -n "$proxy" ] || { echo "interference.sh: the supervisor did not report a proxy address (see $O/events.jsonl)" >&2; exit 1; }
cc -O2 -o "$O/epoll_relay" "$HERE/benches/epoll_relay.c"
[[ " $PHASES " == *" tapped "* ]] && cc -O2 -o "$O/packet_tap" "$HERE/benches/packet_tap.c"
taskset -c "$SUP_CPUS" "$O/epoll_relay" "$relay_port" "$port" & relay=$!; pids+=($relay)
server=$(pgrep -P "$sup" -x sglang-replay | head -1 || true)
[ -n "$server" ] || echo "interference.sh: the replay server under the supervisor was not found: its CPU reads 0"

ticks() { [ -n "$1" ] && awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
: > "$O/phases.txt"
for phase in $PHASES; do
  tap=
  [ "$phase" = tapped ] && { taskset -c "$SUP_CPUS" "$O/packet_tap" "$port" 2>>"$O/packet_tap.txt" & tap=$!; }
  case $phase in direct|tapped) addr=127.0.0.1:$port ;; proxied) addr=$proxy ;; relay) addr=127.0.0.1:$relay_port ;; idle) addr= ;; esac
  t0=$(date +%s.%N); s0=$(ticks "$sup"); r0=$(ticks "$relay"); v0=$(ticks "$server")
  if [ -n "$addr" ]; then
    result=$(taskset -c "$CLIENT_CPUS" "$BINDIR/stream-load" "$addr" "$STREAMS" 256 "$PHASE_S" 2>&1 | tail -1)
  else
    sleep "$PHASE_S"; result=-
  fi
  t1=$(date +%s.%N)
  [ -n "$tap" ] && { kill "$tap"; wait "$tap" 2>/dev/null || true; }
  echo "$phase $t0 $t1 $(( $(ticks "$sup") - s0 )) $(( $(ticks "$relay") - r0 )) $(( $(ticks "$server") - v0 )) $result" >> "$O/phases.txt"
  say "$phase: $result"
done

python3 - "$O" "$(getconf CLK_TCK)" $PROBE_CPUS <<'EOF'
import statistics as st, sys
o, hz, cpus = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
phases = [l.split(None, 6) for l in open(f"{o}/phases.txt")]
print("phase    | " + " | ".join(f"CPU {c}: work/CPU-s, CPU share" for c in cpus) + " | supervisor, relay, server CPU (s)")
for name, t0, t1, sup, relay, server, *_ in phases:
    t0, t1 = float(t0) + 2, float(t1)  # the first 2 s of a phase settle
    cols = []
    for i in range(len(cpus)):
        rows = [l.split() for l in open(f"{o}/probe{i}.txt")]
        rows = [r for r in rows if t0 <= float(r[0]) <= t1]
        if not rows:
            cols.append("no samples"); continue
        speed = st.median(int(r[1]) / float(r[2]) for r in rows if float(r[2]) > 0)
        share = st.median(float(r[2]) / float(r[3]) for r in rows)
        cols.append(f"{speed:,.0f}/s, {share:.3f}")
    print(f"{name:8} | " + " | ".join(cols) + f" | {int(sup)/hz:.2f}, {int(relay)/hz:.2f}, {int(server)/hz:.2f}")
EOF
