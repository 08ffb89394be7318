#!/usr/bin/env bash
# The proxy held against the benchmark it wraps, on the lent H200 (docs/real-gpu.md): a real
# SGLang 0.5.14 (tiny dummy Llama) under the supervisor.
#   usage (GPU machine, repo root): scripts/gpu/proxy_acceptance.sh BINDIR BUNDLE OUTDIR [PHASES]
#   BINDIR  sglang-supervisor, sglang-replay, proxy-bench, tcp-relay (x86-64); BUNDLE the prepared .sgldev
#   PHASES  default "M E S":
#     M  the hot-path benchmarks on this quiet 16-core host: benches/proxy.sh at 256 and 1024
#        streams, benches/proxy_fair.sh (1024 streams + 100 scrapes/s), benches/log_path.sh
#     E  exactness (issue 13): bench_serving --backend sglang, sglang-oai, sglang-oai-chat and vllm
#        at c=32 through the proxy, each in a named window stopped with ?bench_result=: per-request
#        tokens vs bench_serving's output details, window throughput vs bench_serving's, sorted
#        pairs of TTFT and E2E
#     S  speed (issue 16): bench_serving --backend sglang at c=256 and c=512, 1024 prompts x 256
#        tokens, straight to SGLang and through the proxy in ABBA order (direct proxy proxy direct
#        ..., so a drift of the host cancels), PAIRS pairs each (default 4), cache flushed before
#        every run. Noise controls, both arms alike: GRAPH_BS=N captures CUDA graphs up to batch N
#        (a batch past the largest graph runs eager and slower, a step change at c=256/512);
#        PIN="SERVER_CPUS CLIENT_CPUS SUPERVISOR_CPUS" pins the three apart (taskset lists).
#        SIDES="direct relay proxy" adds a third arm through tcp-relay (a hop that reads nothing):
#        the cost of any extra hop, apart from the proxy's own. SIDES="... x1 x2" add arms through
#        further supervisors in front of the same server, each with the environment in X1_ENV,
#        X2_ENV (proxy tuning). The server's CPU is read per run, per process. SIDES="split": one
#        run is two bench_serving at once, each with half the concurrency and prompts, one straight
#        and one through the proxy, their main runs started together (scripts/gpu/clientstamps
#        holds each warm-up's answer until both have one, before either starts its clock): the
#        proxied half against the direct half of the same run (splitp / splitd). SPLIT_VIA=x1
#        sends that half through arm x1 (started for it, with X1_ENV) or the relay instead.
#        SIDES="split aa" alternates it with its control: both halves straight (aap / aad).
#        SIDES="split sx aa" adds a second split arm whose proxied half goes through arm x1 (sxp /
#        sxd), so two proxy settings (the main supervisor's and X1_ENV) meet the same control;
#        SX_VIA=relay sends that half through tcp-relay instead (a hop that parses no HTTP).
#        SIDES="direct tap": no hop either way; in the tap arm a second supervisor (`run --tap`
#        attached to the server's port) watches the run, and its records are held against
#        bench_serving's own (scripts/gpu/tap_vs_bench.py: tokens as multisets, TTFT/E2E pairs).
#        SIDES="attached tap": the control arm started and stopped the same way, without --tap, so
#        the tap is the only difference (its /health probe at start, say, is in both).
#        SIDES="keyed": one run straight to the server while the tap is started and stopped beside
#        it in turns of KEY_MS to 1.5 x KEY_MS ms (8000); the client stamps every event
#        (scripts/gpu/clientstamps, BENCH_CHUNKS) and scripts/gpu/keyed.py holds each on-turn
#        against the off-turns on either side: events/s, gaps between events (TPOT), TTFT, E2E, as
#        on/off ratios with 95 % intervals, per run and pooled. Give it RUN_S=170 (or PROMPTS=8192)
#        or more: at c=256 the default 1024 prompts make a run shorter than one turn, and an
#        interval of ±1 % wants some seven on-turns (docs/real-gpu.md, "Eighteenth session"). SIDES="keyed keyedctl" adds
#        its control: the same supervisor keyed in turns without --tap (what the method reads when
#        nothing is measured). SIDES="keyedmix": both in one run, the on-turns alternating the tap
#        and its control, so keyed.py also holds each tap turn against the control turns on either
#        side (tap/ctl), with no drift between runs in it. KEYED_BACKEND=sglang-oai-chat runs the keyed
#        arms on InferenceX's path (OpenAI chat streams: events of ~250 bytes, where SGLang's
#        native stream, the default, repeats the whole text so far in every event); its requests
#        ask for usage (stream_options.include_usage, as InferenceX's client does), without which
#        the tap, which cannot ask, has no token counts. EXTRA_BODY=JSON: bench_serving's
#        --extra-request-body for every run; S_BACKEND=NAME the backend of the other arms' runs
#        (direct, proxy, tap, attached, ...; default sglang).
#        PYSAMPLE=1 samples the server's HTTP process's Python stacks run by run
#        (scripts/gpu/pysample: S/pysample/RUN.folded; with PYSAMPLE_MODE=profile, cProfile: RUN.prof.txt).
#        SIDES="keyedtog": one tap for the whole run, keyed by swapping its packet sockets' filter
#        (scripts/gpu/tap_toggle.py) in turns of KEY_MS (here 4000 by default): no process started,
#        no /health or /server_info at a turn's start, the turns measured from the swap; the tap's
#        own cost alone, and several times the turns of a run.
#        TOG_TAPS=N keys N taps of the port at once (default 1), each copying every segment into
#        its own ring: what each tap pays again, N times over, above the host's noise.
#        TOG_DRAIN=drain keys N rings of benches/ring_drain.c instead (the tap's filter and ring,
#        no reader's work; a little dearer than the tap's own copy on the dev VM: BENCHMARKS.md),
#        =touch the same with every byte read: what part of the cost is the copy in the send;
#        =bpf N eBPF programs on the cgroup egress hook instead of packet sockets, each keeping the
#        same bytes in a BPF ring buffer, and =packet N packet rings, both keyed by signals
#        (detached or off the packet hook while off: on − off their whole cost; BENCHMARKS.md).
#        TAP_PROMPTS=N: the tap arm's runs have N prompts whatever RUN_S makes the others'.
#        KEY_RANGE=0.5 gives the keyed arms' runs input and output lengths from 128 to 256 (bench_serving's
#        --random-range-ratio; default 1.0, all 256), so that their requests leave lockstep.
#   VCPU="7 12" first times a Python loop on each of those CPUs with a busy loop on every other CPU
#   in turn (scripts/gpu/vcpu_pairs.py): which vCPUs share a physical core, which this VM hides.
#   S's knobs: BENCH_TIMEOUT=S ends a bench_serving run after S seconds (300, or 2 x RUN_S but
#   not past DEADLINE_S less 60 s; a killed run leaves no results of bench_serving's, but the keyed
#   arm's stamps are kept); DEADLINE_S=N starts no round that would end past N seconds from the script's start
#   (the summary still prints: set it below the command's timeout), and with RUN_S shortens the
#   runs so that one round fits; SERVER_EXTRA / SERVER_ENV add
#   server flags / environment; ISOLATE=1 pins the server's HTTP process alone on a CPU (scripts/gpu/server_procs.py);
#   WARM_FULL=N runs N full-size benchmarks straight to the server before the measured ones (its
#   cost per token drifts down over its first minutes), of WARM_PROMPTS prompts (PROMPTS); with
#   RUN_S=S the measured runs get as many prompts as the first warm-up's throughput serves in S s; COMPILED=1 first runs proxy-bench (a compiled client, a thread per stream and one
#   thread for all) against the real server, straight and through the proxy, COMPILED_ROUNDS waves
#   each (4); PAIRS=0 then skips bench_serving.
#   M's knobs: M_THREADS="1 2 default" runs proxy.sh once per proxy thread count
#   (SGLANG_SUPERVISOR_PROXY_THREADS), M_STREAMS="64 256" once per stream count; M_ENV="FLOOR=1" adds the
#   floor (benches/epoll_relay.c) after each; WAKE=1 runs benches/wake_cost.c (a writer's kernel time per write by how its reader
#   waits); TCPOP=1 runs benches/tcp_op_cost.c (one event's send + recv on loopback TCP, no wake-up);
#   M_ENV="FLOOR=uring URING_MIN_WAIT_US=200 URING_RELAY=BINDIR/uring_relay" adds benches/uring_relay.c
#   (built here with -static: the host has no liburing-dev) after epoll_relay;
#   SWEEPS="0 1000" runs proxy.sh once per sweep period (µs; 0: no sweeps), FAIR_SWEEPS
#   likewise proxy_fair.sh; M_ENV (more environment for those), M_ROUNDS (7), NO_OAI=1 skips the
#   /v1/completions run, LOG_PATH=1 adds log_path.sh, M_ONE=1 proxy.sh at one stream (200 requests),
#   M1024=1 proxy.sh at 1024 streams.
# Needs dev-device/ (a copy of shared/sglang-device) next to it.
set -u
BINDIR=$(realpath "${1:?bin dir}"); B=$(realpath "${2:?bundle}"); O=$(realpath -m "${3:?outdir}"); PHASES=${4:-M E S}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$O"
exec > >(tee "$O/summary.txt") 2>&1
say() { echo "[acceptance $(date +%T.%3N)] $*"; }
ulimit -n "$(ulimit -Hn)"
uname -r; nproc; lscpu | grep -iE "numa|model name|^cpu\(s\)|mhz|thread|core|socket"; echo "SMT siblings: $(cat /sys/devices/system/cpu/cpu*/topology/thread_siblings_list 2>/dev/null | sort -u | tr '\n' ' ')"
which perf strace py-spy gdb 2>/dev/null; python3 -c 'import importlib.util as u; print("uvloop", bool(u.find_spec("uvloop")), "httptools", bool(u.find_spec("httptools")), "h11", bool(u.find_spec("h11")))'
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -2
# the knobs this run was given, so that a summary says what it measured
env | grep -E '^(SIDES|CONCS|PAIRS|RUN_S|KEY_MS|KEY_RANGE|KEYED_BACKEND|S_BACKEND|EXTRA_BODY|TOG_TAPS|TOG_DRAIN|PIN|PIN_[A-Z]+|ISOLATE|WARM_FULL|WARM_PROMPTS|PROMPTS|TAP_PROMPTS|GRAPH_BS|BENCH_TIMEOUT|DEADLINE_S|SPLIT_VIA|SX_VIA|X[0-9]_ENV|SERVER_EXTRA|SERVER_ENV|CPU_TRACE_[A-Z_]+|PYSAMPLE[A-Z_]*|VCPU|SGLANG_SUPERVISOR_[A-Z_]*)=' | sort | tr '\n' ' '; echo

case ${SPLIT_VIA:-proxy} in proxy|relay|x[0-9]) ;; *) echo "SPLIT_VIA=$SPLIT_VIA: expected proxy, relay or x1..x9" >&2; exit 2 ;; esac

if [[ " $PHASES " == *" M "* ]]; then
  mkdir -p "$HERE/target/release"
  for b in sglang-supervisor sglang-replay proxy-bench; do cp "$BINDIR/$b" "$HERE/target/release/$b"; done
  if [ -n "${WAKE:-}" ]; then  # what a reader's habits cost a writer on this host (benches/wake_cost.c)
    cc -O2 -o "$O/wake_cost" "$HERE/benches/wake_cost.c" && for gap in 20 100; do for t in 0 -1 100 250 500 1000; do
      taskset -c 0,1 "$O/wake_cost" 20000 "$gap" "$t"; done; done 2>&1 | grep writer
  fi
  if [ -n "${TCPOP:-}" ]; then  # one event's send and recv on loopback TCP, nobody to wake (benches/tcp_op_cost.c)
    cc -O2 -o "$O/tcp_op_cost" "$HERE/benches/tcp_op_cost.c" && for n in 200 2000; do taskset -c 0 "$O/tcp_op_cost" 200000 "$n"; done
  fi
  for c in ${CLIENTS:-threads}; do for t in ${SWEEPS:-1000}; do for n in ${M_THREADS:-default}; do for st in ${M_STREAMS:-256}; do
    # the proxy's sweep period and thread count (default: a quarter of the cores), side by side
    say "M: proxy.sh $st streams, sweep $t us, proxy threads $n, client: $c"
    (cd "$HERE" && env PROXY_BENCH_CLIENT=$c SGLANG_SUPERVISOR_PROXY_SWEEP_US=$t SGLANG_SUPERVISOR_PROXY_THREADS=$n ${M_ENV:-} \
      timeout 120 benches/proxy.sh "$st" 256 "${M_ROUNDS:-7}" 2000)
  done; done; done; done
  # one stream, a new connection per request (as bench_serving): the TTFT the proxy adds, median and p99
  [ -n "${M_ONE:-}" ] && { say "M: proxy.sh 1 stream, 200 requests of 16 tokens"; (cd "$HERE" && env ${M_ENV:-} timeout 120 benches/proxy.sh 1 16 200 1000); }
  [ -n "${M1024:-}" ] && { say "M: proxy.sh 1024 streams"; (cd "$HERE" && timeout 150 benches/proxy.sh 1024 256 5 4000); }
  [ -z "${NO_OAI:-}" ] && { say "M: proxy.sh 256 streams, OpenAI completions"; (cd "$HERE" && timeout 120 benches/proxy.sh 256 256 5 2000 /v1/completions); }
  for t in ${FAIR_SWEEPS-1000}; do
    say "M: proxy_fair.sh 1024 streams, 100 scrapes/s, sweep $t us"
    (cd "$HERE" && env SGLANG_SUPERVISOR_PROXY_SWEEP_US=$t ${M_ENV:-} timeout 150 benches/proxy_fair.sh 1024 "${FAIR_ROUNDS:-11}" 10000 100)
  done
  if [ -n "${LOG_PATH:-}" ]; then say "M: log_path.sh"; (cd "$HERE" && timeout 150 benches/log_path.sh 5 256); fi
fi

# VCPU="7 12": which CPUs slow these when busy (scripts/gpu/vcpu_pairs.py), before the server starts
[ -n "${VCPU:-}" ] && timeout 300 python3 "$HERE/scripts/gpu/vcpu_pairs.py" $VCPU --window "${VCPU_WINDOW:-0.6}"
echo "somaxconn $(cat /proc/sys/net/core/somaxconn), tcp_max_syn_backlog $(cat /proc/sys/net/ipv4/tcp_max_syn_backlog), syncookies $(cat /proc/sys/net/ipv4/tcp_syncookies), abort_on_overflow $(cat /proc/sys/net/ipv4/tcp_abort_on_overflow)"
if [ -n "${SOMAXCONN:-}" ]; then  # listen queues are sized when the server listens: set before it starts
  sysctl -w net.core.somaxconn="$SOMAXCONN" net.ipv4.tcp_max_syn_backlog="$SOMAXCONN" || echo "could not set somaxconn"
fi
# shellcheck source=/dev/null
source "$HERE/dev-device/serve.sh"
# ring_drain_start and ring_drain_check_drops, the benches' own (the repository is here whole)
# shellcheck source=benches/tap_attach.sh
source "$HERE/benches/tap_attach.sh"
install_bundle "$B" || exit 1
eval "$(print_env)"
PORT=30000
SERVER=(python3 -m sglang.launch_server --model-path "$B/tiny-llama" --load-format dummy --host 127.0.0.1 --port $PORT
        --attention-backend triton --sampling-backend pytorch --grammar-backend none --enable-metrics
        --cuda-graph-backend-prefill disabled --mem-fraction-static 0.8 ${GRAPH_BS:+--cuda-graph-max-bs $GRAPH_BS})
# SERVER_EXTRA: more server flags, e.g. "--log-requests --log-requests-level 0
# --enable-request-time-stats-logging" with SERVER_ENV="SGLANG_LOG_MS=1" to stamp each request's
# arrival at the tokenizer manager (ms) and its wait in the scheduler (scripts/gpu/arrivals.py)
read -r -a extra <<< "${SERVER_EXTRA:-}"; SERVER+=("${extra[@]}")
[ -n "${SERVER_ENV:-}" ] && SERVER=(env ${SERVER_ENV} "${SERVER[@]}")
if [ -n "${PYSAMPLE:-}" ]; then
  mkdir -p "$O/S/pysample"
  SERVER=(env "PYTHONPATH=$HERE/scripts/gpu/pysample:$PYTHONPATH" "PYSAMPLE_DIR=$O/S/pysample" "${SERVER[@]}")
fi
if [ "${PIN:-}" = auto ]; then  # half the allowed CPUs to the server, a quarter each to client and supervisor
  PIN=$(python3 -c 'import os; c=sorted(os.sched_getaffinity(0)); n=len(c); j=lambda l: ",".join(map(str,l)); print(j(c[:n//2]), j(c[n//2:3*n//4]), j(c[3*n//4:]))')
fi
[ -n "${PIN:-}" ] && echo "pinning server / client / supervisor to: $PIN"
read -r PIN_SERVER PIN_CLIENT PIN_SUP <<< "${PIN:-}"
[ -n "${PIN_SERVER:-}" ] && SERVER=(taskset -c "$PIN_SERVER" "${SERVER[@]}")
SUP_PREFIX=(); [ -n "${PIN_SUP:-}" ] && SUP_PREFIX=(taskset -c "$PIN_SUP")
CLIENT_PREFIX=(); [ -n "${PIN_CLIENT:-}" ] && CLIENT_PREFIX=(taskset -c "$PIN_CLIENT")
MET=127.0.0.1:9411
post() { python3 -c 'import sys,urllib.request; print(urllib.request.urlopen(urllib.request.Request(sys.argv[1], data=b"", method="POST"), timeout=60).read().decode())' "$1"; }
start_sup() { # start_sup DIR
  "${SUP_PREFIX[@]}" "$BINDIR/sglang-supervisor" run --events "$1/events.jsonl" --log-file "$1/server.log" --no-tee --grace 30s \
    --ready-timeout 6m --proxy-addr 127.0.0.1:0 --requests-log "$1/requests.jsonl" --metrics-addr $MET \
    --power-csv "$1/power.csv" --report "$1/report.json" -- "${SERVER[@]}" 2> "$1/supervisor.err" &
  SUP=$!
  local end=$(( $(date +%s) + 360 ))
  while [ "$(date +%s)" -lt "$end" ]; do
    grep -q '"event":"ready"' "$1/events.jsonl" 2>/dev/null && break
    grep -q '"event":"exited"' "$1/events.jsonl" 2>/dev/null && return 1
    sleep 0.2
  done
  PPORT=$(grep -o '"proxy":"[^"]*"' "$1/events.jsonl" | cut -d'"' -f4 | cut -d: -f2)
  say "ready after $(grep -o '"event":"ready"[^}]*' "$1/events.jsonl" | grep -o '"elapsed_s":[0-9.]*'); proxy on $PPORT"
}
procs() { python3 "$HERE/scripts/gpu/server_procs.py" "$@"; }  # the server tree's CPU, per process
http_pid() { procs stats "$SUP" | python3 -c 'import json, sys; print(json.load(sys.stdin)["main"]["pid"])'; }  # the server's HTTP process
tap_start() { # tap_start NAME [--tap]: a second supervisor attached to the server's port (run --upstream), pid in TAPSUP
  # (NAME starts with "tap-": the summary reads every S/c*-*-*.jsonl as a benchmark result);
  # without --tap it measures nothing: the control arm, started and stopped the same way
  local measure=(); [ "${2:-}" = --tap ] && measure=(--tap --requests-log "$P/$1-requests.jsonl")
  "${SUP_PREFIX[@]}" "$BINDIR/sglang-supervisor" run --upstream "http://127.0.0.1:$PORT" --ready-on http "${measure[@]}" \
    --metrics-addr none --gpu-backend none --no-preflight --no-tee --events "$P/$1-events.jsonl" -- sleep 100000 2> "$P/$1.err" &
  TAPSUP=$!
  for _ in $(seq 300); do grep -q '"event":"ready"' "$P/$1-events.jsonl" 2>/dev/null && return 0; sleep 0.05; done
  say "tap $1: not ready"; tail -5 "$P/$1.err"; kill -KILL "$TAPSUP"; return 1
}
keyer() { # keyer NAME STOPFILE [--tap|--mix]: the tap (tap_start NAME-K --tap) on for a turn, then off for a turn,
  # until STOPFILE exists; each on-turn's "START READY END" (its process's start, its ready event,
  # its exit) goes to $P/NAME.keys. --mix: the on-turns alternate the tap and its control (no
  # --tap), each line ending "tap" or "ctl". A turn lasts KEY_MS (8000) to 1.5 x KEY_MS ms at random: long
  # enough that the tap, which follows only connections it saw open, watches every request for
  # most of it (keyed.py leaves out the rest); random, since the requests of a fixed-length
  # benchmark end in waves, and a fixed period could beat with them.
  local k=0 t0 t1 how kind
  # a turn ends early once STOPFILE exists: the run is over, and its drain is not measured
  turn() { local n=$(( (${KEY_MS:-8000} + RANDOM % (${KEY_MS:-8000} / 2)) / 200 )); while [ "$n" -gt 0 ] && [ ! -e "$1" ]; do sleep 0.2; n=$((n - 1)); done; }
  while [ ! -e "$2" ]; do
    how=${3:-}; kind=
    if [ "$how" = --mix ]; then
      if [ $((k % 2)) = 0 ]; then how=--tap; kind=" tap"; else how=; kind=" ctl"; fi
    fi
    t0=$(date +%s.%N)
    tap_start "$1-$k" "$how" || break
    t1=$(date +%s.%N)
    turn "$2"
    kill -TERM "$TAPSUP"; wait "$TAPSUP"
    echo "$t0 $t1 $(date +%s.%N)$kind" >> "$P/$1.keys"
    k=$((k + 1))
    [ -e "$2" ] || turn "$2"
  done
}
# the host's TCP counters that say whether connections waited on a full listen queue (SYNs
# dropped and sent again a second later) or were resent: "name=value ..."
tcpstat() { awk '/^(Tcp|TcpExt):/ { if (!h[$1]++) { for (i = 2; i <= NF; i++) n[$1, i] = $i } else { for (i = 2; i <= NF; i++) if (n[$1, i] ~ /^(ListenOverflows|ListenDrops|TCPSynRetrans|TCPTimeouts|RetransSegs|ActiveOpens|PassiveOpens|TCPReqQFullDrop|TCPReqQFullDoCookies|TCPLossProbes|TCPFastRetrans|TCPBacklogDrop|TCPRcvQDrop)$/) printf "%s=%s ", n[$1, i], $i } }' /proc/net/netstat /proc/net/snmp
  # and the kernel's per-CPU receive backlogs (loopback's too): packets dropped as a backlog was
  # full (netdev_max_backlog), and passes cut short with work left (hex, summed over CPUs)
  local d=0 q=0 _c drop sq _r
  while read -r _c drop sq _r; do d=$((d + 16#$drop)); q=$((q + 16#$sq)); done < /proc/net/softnet_stat
  printf "BacklogDrops=%d SoftirqSqueezed=%d " "$d" "$q"; }
stop_sup() { kill -TERM "$SUP"; wait "$SUP"; say "supervisor exit $?"; }
bench() { # bench PORT BACKEND CONC PROMPTS OUTFILE [RANGE]
  # CLIENT_STAMPS=1: each request's send time and its head's return, from inside the client
  # BARRIER="DIR N": hold the warm-up's answer until N benchmarks have theirs (split arm)
  # CHUNKS=1: when each event of each request came in (OUTFILE.chunks, OUTFILE.begun; keyed arm)
  local stamps=()
  if [ -n "${CLIENT_STAMPS:-}${BARRIER:-}${CHUNKS:-}" ]; then
    stamps=(env "PYTHONPATH=$HERE/scripts/gpu/clientstamps:$PYTHONPATH" ${CLIENT_STAMPS:+"BENCH_STAMPS=$5.stamps"} ${BARRIER:+"BENCH_BARRIER=$BARRIER"} ${CHUNKS:+"BENCH_CHUNKS=$5"})
  fi
  "${CLIENT_PREFIX[@]}" "${stamps[@]}" timeout -k 30 "${BENCH_TIMEOUT:-300}" python3 -m sglang.bench_serving --backend "$2" --host 127.0.0.1 --port "$1" --model "$B/tiny-llama" \
    --tokenizer "$B/tiny-llama" --dataset-name "${DATASET:-random}" --dataset-path "$B/tiny-llama/sharegpt_mini.json" \
    --random-input-len 256 --random-output-len 256 --random-range-ratio "${6:-1.0}" --num-prompts "$4" \
    --max-concurrency "$3" --seed "${SEED:-1}" --disable-tqdm --output-details ${EXTRA_BODY:+--extra-request-body "$EXTRA_BODY"} \
    --output-file "$5" > "$5.txt" 2>&1
  local rc=$?
  if [ "$rc" != 0 ] && grep -qE "No module named|ImportError" "$5.txt"; then
    PYTHONPATH="$HERE/dev-device/stubs-fallback:$PYTHONPATH" timeout -k 30 "${BENCH_TIMEOUT:-300}" python3 -m sglang.bench_serving --backend "$2" \
      --host 127.0.0.1 --port "$1" --model "$B/tiny-llama" --tokenizer "$B/tiny-llama" --dataset-name "${DATASET:-random}" \
      --dataset-path "$B/tiny-llama/sharegpt_mini.json" --random-input-len 256 --random-output-len 256 \
      --random-range-ratio "${6:-1.0}" --num-prompts "$4" --max-concurrency "$3" --seed "${SEED:-1}" --disable-tqdm \
      --output-details ${EXTRA_BODY:+--extra-request-body "$EXTRA_BODY"} --output-file "$5" > "$5.txt" 2>&1; rc=$?
  fi
  [ "$rc" = 0 ] || { say "bench_serving $2 failed rc=$rc"; tail -5 "$5.txt"; }
}

if [[ " $PHASES " == *" E "* ]]; then
  P=$O/E; mkdir -p "$P"
  say "E: start"
  if start_sup "$P"; then
    for backend in sglang sglang-oai sglang-oai-chat vllm; do
      post "http://$MET/-/window/start?name=$backend" > /dev/null
      n0=$(wc -l < "$P/requests.jsonl" 2>/dev/null || echo 0)
      bench "$PPORT" "$backend" 32 256 "$P/bench-$backend.jsonl" 0.5
      post "http://$MET/-/window/stop?bench_result=$P/bench-$backend.jsonl" > "$P/window-$backend.json" 2>&1
      python3 - "$P" "$backend" "$n0" <<'PY'
import json, sys, statistics as st
p, name, n0 = sys.argv[1], sys.argv[2], int(sys.argv[3])
b = [json.loads(l.replace("Infinity", "1e999")) for l in open(f"{p}/bench-{name}.jsonl")][-1]
recs = [json.loads(l) for l in open(f"{p}/requests.jsonl")][n0:]
w = json.load(open(f"{p}/window-{name}.json"))
# the window stopped with ?bench_result=: its figures over the benchmark's own span
req = (w.get("bench") or {}).get("requests") or w.get("requests", {})
span = (w.get("bench") or {}).get("span")
print(f"{name}: span {json.dumps(span)}")
tp = (w.get("bench") or {}).get("power") or w.get("traffic_power") or {}
print(f"{name}: power over the span: valid {tp.get('power_valid')} {tp.get('reasons')} energy {tp.get('total_gpu_energy_j')} J, counter {(tp.get('energy_counter') or {}).get('total_gpu_energy_j')} J, J/output token {tp.get('joules_per_output_token')}")
ok = [r for r in recs if r["status"] == 200 and not r.get("error")]
ours = sorted(r["completion_tokens"] for r in ok if r["completion_tokens"] is not None)
theirs = sorted(x for x in b["output_lens"])
# the warm-up request goes through the proxy too: it is the first one logged
warm = sorted(ok, key=lambda r: r["start_unix"])[0]
body = sorted(ok, key=lambda r: r["start_unix"])[1:]
ours_b = sorted(r["completion_tokens"] for r in body)
print(f"{name}: requests logged {len(recs)} (incl. warm-up), bench completed {b['completed']}; null token counts: {sum(r['completion_tokens'] is None for r in ok)}")
print(f"{name}: per-request completion tokens equal to bench_serving output_lens (sorted multisets): {ours_b == theirs}; totals {sum(ours_b)} vs {b['total_output_tokens']}")
print(f"{name}: prompt tokens (server) total {sum(r['prompt_tokens'] or 0 for r in body)} vs bench input_lens total {sum(b['input_lens'])}")
for k, ref in [("output_throughput", "output_throughput"), ("duration", "duration"), ("completed", "completed"), ("median_ttft_ms", "median_ttft_ms"), ("median_tpot_ms", "median_tpot_ms"), ("median_itl_ms", "median_itl_ms"), ("median_e2el_ms", "median_e2e_latency_ms")]:
    v, r = req.get(k), b.get(ref)
    d = f"{(v / r - 1) * 100:+.2f} %" if isinstance(v, (int, float)) and r else "n/a"
    print(f"{name}: window {k} {v} vs bench {r} ({d})")
def pairs(label, a, c):
    a, c = sorted(a), sorted(c); n = min(len(a), len(c))
    d = [(a[i] - c[i]) * 1000 for i in range(n)]
    print(f"{name}: {label} sorted pairs proxy-minus-client: median {st.median(d):+.3f} ms, min {min(d):+.3f}, max {max(d):+.3f} (n={n})")
pairs("TTFT", [r["ttft_s"] for r in body], [t for t in b["ttfts"] if t])
pairs("E2E", [r["e2e_s"] for r in body], [t + sum(i) for t, i in zip(b["ttfts"], b["itls"]) if t])
print(f"{name}: window keys: {sorted(w.keys())}; power: {json.dumps(w.get('power', {}))[:300]}")
PY
    done
  else
    say "E: not ready"; tail -20 "$P/supervisor.err"; kill -KILL "$SUP"
  fi
fi

if [[ " $PHASES " == *" S "* ]]; then
  P=$O/S; mkdir -p "$P"
  say "S: start (the E phase's server when it ran)"
  if { [ -n "${SUP:-}" ] && kill -0 "$SUP" 2>/dev/null; } || start_sup "$P"; then
    bench "$PPORT" sglang 32 64 "$P/warm.jsonl"   # JIT and graphs warm before timing anything
    if [ -n "${ISOLATE:-}" ] && [ -n "${PIN_SERVER:-}" ]; then
      # the server's HTTP process (its bottleneck under load) alone on a CPU, its SMT siblings idle
      line=$(procs isolate "$SUP" "$PIN_SERVER"); echo "$line"
      idle=$(echo "$line" | sed -n 's/.*left idle: \[\([0-9, ]*\)\].*/\1/p' | tr -d ' ')
      if [ -n "$idle" ]; then
        drop() { python3 -c 'import sys; d=set(sys.argv[2].split(",")); print(",".join(c for c in sys.argv[1].split(",") if c not in d))' "$1" "$idle"; }
        PIN_CLIENT=$(drop "$PIN_CLIENT"); PIN_SUP=$(drop "$PIN_SUP")
        CLIENT_PREFIX=(taskset -c "$PIN_CLIENT"); SUP_PREFIX=(taskset -c "$PIN_SUP")
        taskset -a -p -c "$PIN_SUP" "$SUP" > /dev/null
        echo "client now on $PIN_CLIENT, supervisor on $PIN_SUP"
      fi
    fi
    for k in $(seq "${WARM_FULL:-0}"); do
      # full-size runs straight to the server before any measured one: its HTTP process's CPU per
      # token fell from the first round to the last in every eighth-session call (mean over the
      # arms 106 -> 81, 78 -> 69, 91 -> 87 us), a drift two or three rotations cannot cancel
      w0=$(procs stats "$SUP")
      DATASET=random-ids bench "$PORT" sglang "${CONCS%% *}" "${WARM_PROMPTS:-${PROMPTS:-1024}}" "$P/warmfull-$k.jsonl"
      w1=$(procs stats "$SUP")
      python3 - "$P/warmfull-$k.jsonl" "$w0" "$w1" <<'PY'
import json, sys
b = [json.loads(l.replace("Infinity", "1e999")) for l in open(sys.argv[1])][-1]
a, z = json.loads(sys.argv[2]), json.loads(sys.argv[3])
t = lambda j: sum(v["utime"] + v["stime"] for k, v in j["by"].items() if k == "python3")
print(f"warm-up run: out {b['output_throughput']:.1f} tok/s; HTTP process {(t(z) - t(a)) / z['hz'] / (b['total_output_tokens'] or 1) * 1e6:.1f} us per output token")
PY
    done
    # the arms each round runs, in the order of its first rotation
    read -r -a arms <<< "${SIDES:-direct proxy}"
    if [ -n "${RUN_S:-}" ] && [ -f "$P/warmfull-1.jsonl" ]; then
      # runs of about RUN_S seconds whatever the card (the H100 host ran at 10k tokens/s, the
      # H200 at 17k): the prompts from the warm-up's throughput, 256 output tokens each. With
      # DEADLINE_S, no more than a round of every arm can take by then, as the check before each
      # round reckons it (256 tokens a prompt, 5 s more a run, 30 s to spare, 10 s for what
      # comes first): a cold machine's server ready after 159 s instead of 69 left a call with
      # no round at all, where a shorter one fitted
      fits=$([ -n "${DEADLINE_S:-}" ] && echo $(( (DEADLINE_S - SECONDS - 40) / ${#arms[@]} - 5 )) || echo 0)
      PROMPTS=$(python3 -c 'import json, sys
b = [json.loads(l.replace("Infinity", "1e999")) for l in open(sys.argv[1])][-1]
mean_out = 256 * (1 + float(sys.argv[3])) / 2  # KEY_RANGE shortens the keyed runs
n = float(sys.argv[2]) * b["output_throughput"] / mean_out
fits = float(sys.argv[4])
if fits > 0:
    n = min(n, fits * b["output_throughput"] / 256)
print(max(1024, int(n) // 256 * 256))' "$P/warmfull-1.jsonl" "$RUN_S" "${KEY_RANGE:-1.0}" "$fits")
      [ "$fits" -gt 0 ] && say "S: at most ${fits} s a run fits before DEADLINE_S=$DEADLINE_S (by 256 tokens a prompt)"
      # a warm-up can run faster than the long run after it (20.5k against 17.7k tokens/s on the
      # H100 host): unless told otherwise, a run may take twice RUN_S before it is stopped, but
      # not past DEADLINE_S less a minute (a timeout past the call's own limit never fires, and
      # then the stamps it would save are lost with the call)
      if [ -z "${BENCH_TIMEOUT:-}" ]; then
        BENCH_TIMEOUT=$((2 * ${RUN_S%.*}))
        if [ -n "${DEADLINE_S:-}" ] && [ $((DEADLINE_S - SECONDS - 60)) -lt "$BENCH_TIMEOUT" ]; then
          BENCH_TIMEOUT=$((DEADLINE_S - SECONDS - 60 > 60 ? DEADLINE_S - SECONDS - 60 : 60))
        fi
      fi
      say "S: $PROMPTS prompts a run (RUN_S=$RUN_S at the warm-up's throughput), stopped after $BENCH_TIMEOUT s"
    fi
    s0=$(procs stats "$SUP"); sleep 3; s1=$(procs stats "$SUP")
    python3 - "$s0" "$s1" <<'PY'
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
tick = lambda j, k: (j["by"].get(k) or {}).get("utime", 0) + (j["by"].get(k) or {}).get("stime", 0)
print("idle server over 3 s, CPU by process: " + ", ".join(f"{k} {(tick(b, k) - tick(a, k)) / b['hz'] / 3:.2f} core" for k in sorted(b["by"])))
PY
    RPORT=30007; RELAY=""
    if [[ " ${SIDES:-} ${SPLIT_VIA:-} ${SX_VIA:-} " == *" relay "* ]]; then
      "${SUP_PREFIX[@]}" "$BINDIR/tcp-relay" 127.0.0.1:$RPORT 127.0.0.1:$PORT & RELAY=$!
    fi
    declare -A XPORT XSUP
    for side in ${SIDES:-} ${SPLIT_VIA:-} $([[ " ${SIDES:-} " == *" sx "* ]] && echo "${SX_VIA:-x1}"); do
      [[ $side == x[0-9] ]] && [ -z "${XSUP[$side]:-}" ] || continue
      # another supervisor in front of the same server, its proxy tuned by the environment in
      # X1_ENV, X2_ENV ... (e.g. "SGLANG_SUPERVISOR_PROXY_SWEEP_US=1000")
      envname=${side^^}_ENV
      env ${!envname:-} "${SUP_PREFIX[@]}" "$BINDIR/sglang-supervisor" run --upstream "http://127.0.0.1:$PORT" \
        --ready-on http --proxy-addr 127.0.0.1:0 --metrics-addr none --gpu-backend none --no-preflight --no-tee \
        --events "$P/$side-events.jsonl" --requests-log "$P/$side-requests.jsonl" -- sleep 100000 2> "$P/$side.err" &
      XSUP[$side]=$!
      for _ in $(seq 100); do grep -q '"proxy":' "$P/$side-events.jsonl" 2>/dev/null && break; sleep 0.1; done
      XPORT[$side]=$(grep -o '"proxy":"[^"]*"' "$P/$side-events.jsonl" | head -1 | cut -d'"' -f4 | cut -d: -f2)
      say "arm $side: proxy on ${XPORT[$side]}, environment: ${!envname:-}"
    done
    if [ -n "${COMPILED:-}" ]; then
      # A compiled client against the real server (benches' proxy-bench): waves of CONC streams of
      # 256 tokens, straight and through the proxy alternately, per client kind; with the server's
      # main (HTTP) process's CPU per event written in each arm. bench_serving's own loop is out.
      main_pid=$(http_pid)
      for conc in ${CONCS:-256 512}; do for c in ${COMPILED_CLIENTS:-one-thread threads}; do
        say "C: proxy-bench c=$conc client $c (server main pid $main_pid)"
        "${CLIENT_PREFIX[@]}" env PROXY_BENCH_CLIENT=$c timeout 200 "$BINDIR/proxy-bench" "127.0.0.1:$PORT" "127.0.0.1:$PPORT" \
          "$conc" 256 "${COMPILED_ROUNDS:-4}" "$SUP" /generate "$main_pid"
      done; done
    fi
    # a run's length (the last one's, once one ran), to tell whether one more round fits
    # DEADLINE_S; before any, what the warm-ups' throughput says PROMPTS x 256 tokens take (a
    # flat 60 s left no round in a call whose runs took 20 s), at least 10 s
    run_s=$(python3 -c 'import json, sys
b = [json.loads(l.replace("Infinity", "1e999")) for l in open(sys.argv[1])][-1]
print(max(10, int(float(sys.argv[2]) * 256 / b["output_throughput"]) + 5))' \
      "$( [ -f "$P/warmfull-1.jsonl" ] && echo "$P/warmfull-1.jsonl" || echo "$P/warm.jsonl")" "${PROMPTS:-1024}" 2>/dev/null || echo 60)
    for conc in ${CONCS:-256 512}; do
      for i in $(seq "${PAIRS:-4}"); do
        if [ -n "${DEADLINE_S:-}" ] && [ $((SECONDS + ${#arms[@]} * run_s + 30)) -gt "$DEADLINE_S" ]; then
          say "S: round $i of c=$conc would end past DEADLINE_S=$DEADLINE_S (${SECONDS} s gone, ${run_s} s a run): no more rounds"
          break 2
        fi
        # each round rotates the arms (a Latin square; ABBA for two), so a drift of the host cancels
        order=(); n=${#arms[@]}
        for k in $(seq 0 $((n - 1))); do order+=("${arms[$(( (k + i - 1) % n ))]}"); done
        [ "$n" = 2 ] && [ $((i % 2)) = 0 ] && order=("${arms[1]}" "${arms[0]}")
        for side in "${order[@]}"; do
          CPUPID=$SUP
          case $side in proxy) port=$PPORT ;; relay) port=$RPORT ;; x[0-9]) port=${XPORT[$side]}; CPUPID=${XSUP[$side]} ;; *) port=$PORT ;; esac
          # the tap arm: straight to the server, watched by a second supervisor's tap for this run only
          [ "$side" = tap ] && { tap_start "tap-c$conc-$i" --tap || continue; CPUPID=$TAPSUP; }
          [ "$side" = attached ] && { tap_start "tap-c$conc-$i-attached" || continue; CPUPID=$TAPSUP; }
          # the split arm's "supervisor CPU" is that of the hop its second half goes through
          [ "$side" = split ] && [[ ${SPLIT_VIA:-} == x[0-9] ]] && CPUPID=${XSUP[$SPLIT_VIA]}
          if [ "$side" = sx ]; then case ${SX_VIA:-x1} in relay) CPUPID=$RELAY ;; *) CPUPID=${XSUP[${SX_VIA:-x1}]} ;; esac; fi
          post "http://127.0.0.1:$PORT/flush_cache" > /dev/null 2>&1 || true
          cpu0=$(awk '{print $14+$15}' "/proc/$CPUPID/stat"); by0=$(procs stats "$SUP"); net0=$(tcpstat)
          # a window per run: the server's own batch series (running requests, decode throughput)
          # over it, whichever path the client took
          post "http://$MET/-/window/start?name=c$conc-$side-$i" > /dev/null
          [ -n "${PYSAMPLE:-}" ] && echo "start c$conc-$side-$i" > "$P/pysample/m" && mv "$P/pysample/m" "$P/pysample/mark"
          t_run=$SECONDS; w_run=$(date +%s.%N)
          if [ "$side" = keyed ] || [ "$side" = keyedctl ] || [ "$side" = keyedmix ] || [ "$side" = keyedtog ]; then
            # one run straight to the server, the tap keyed on and off beside it every few seconds:
            # each on-turn against the off-turns around it (scripts/gpu/keyed.py), so a drift
            # between runs, which sequential pairs cannot tell from the tap, cancels. keyedctl is
            # its control: the same supervisor started and stopped in turns, without --tap.
            halves=("$side"); stopf=$P/$side-c$conc-$i.stop
            case $side in keyed) how=--tap ;; keyedmix) how=--mix ;; *) how= ;; esac
            if [ "$side" = keyedtog ]; then
              # one tap for the whole run, its filter swapped off and on in turns (tap_toggle.py)
              # TOG_TAPS=N: N such taps of the port, keyed together (each copies every segment);
              # TOG_DRAIN=drain|touch|bpf|packet: N rings of benches/ring_drain.c instead, the copy without the tap
              togsups=()
              if [ -n "${TOG_DRAIN:-}" ]; then
                # (=bpf, =packet: eBPF programs or packet rings keyed by signals, not by their filter)
                case $TOG_DRAIN in bpf|packet) drain_how=(drain "$TOG_DRAIN") ;; *) drain_how=("$TOG_DRAIN" packet) ;; esac
                cc -O2 -o "$O/ring_drain" "$HERE/benches/ring_drain.c" 2>> "$P/ring_drain.err" ||
                  { say "ring_drain did not build: $(tail -2 "$P/ring_drain.err")"; continue; }
                ring_drain_start "[acceptance $(date +%T.%3N)]" "$P/ring_drain.err" \
                  "${SUP_PREFIX[@]}" "$O/ring_drain" "$PORT" "${TOG_TAPS:-1}" "${drain_how[@]}" || continue
                togsups+=("$drain")
              else
                for t in $(seq "${TOG_TAPS:-1}"); do
                  tap_start "tap-$side-c$conc-$i-tog$t" --tap || break; togsups+=("$TAPSUP"); done
                if [ "${#togsups[@]}" != "${TOG_TAPS:-1}" ]; then kill -TERM "${togsups[@]}" 2>/dev/null; wait "${togsups[@]}" 2>/dev/null; continue; fi
              fi
              togsup=$(IFS=,; echo "${togsups[*]}")
              by=(); case ${TOG_DRAIN:-} in bpf|packet) by=(--signals) ;; esac
              "${SUP_PREFIX[@]}" python3 "$HERE/scripts/gpu/tap_toggle.py" "${by[@]}" "$togsup" "$stopf" "$P/tap-$side-c$conc-$i.keys" "${KEY_MS:-4000}" & keyer_pid=$!
            else
              keyer "tap-$side-c$conc-$i" "$stopf" $how & keyer_pid=$!
            fi
            # the HTTP process's CPU beside it, on the supervisor's CPUs: what the tap costs it
            main_pid=$(http_pid)
            "${SUP_PREFIX[@]}" python3 "$HERE/scripts/gpu/cpu_trace.py" "$main_pid" "$P/c$conc-$side-$i.jsonl.cpu" "$stopf" & cpu_pid=$!
            # an OpenAI stream carries its token counts only when asked (InferenceX's client asks;
            # bench_serving does not): the tap, which cannot ask, counts them then
            usage=; case ${KEYED_BACKEND:-sglang} in sglang|sglang-native) ;; *) usage='{"stream_options":{"include_usage":true}}' ;; esac
            # KEY_RANGE<1: input and output lengths from KEY_RANGE x 256 to 256, so the requests leave lockstep
            # (with fixed lengths they end in waves, and a turn's rate depends on where its edges fall)
            EXTRA_BODY=${EXTRA_BODY:-$usage} CHUNKS=1 DATASET=random-ids bench "$PORT" "${KEYED_BACKEND:-sglang}" "$conc" "${PROMPTS:-1024}" "$P/c$conc-$side-$i.jsonl" "${KEY_RANGE:-1.0}"
            touch "$stopf"; wait "$keyer_pid" "$cpu_pid"
            # (ring_drain's drops said, not fatal, as its count line is: the run's other figures stand)
            [ "$side" = keyedtog ] && { kill -TERM "${togsups[@]}"; wait "${togsups[@]}"; [ -n "${TOG_DRAIN:-}" ] && { tail -1 "$P/ring_drain.err"; ring_drain_check_drops "[acceptance $(date +%T.%3N)]" "$P/ring_drain.err"; }; }
            python3 "$HERE/scripts/gpu/keyed.py" "$conc" "$P/c$conc-$side-$i.jsonl" "$P/tap-$side-c$conc-$i.keys"
            # what the tap recorded over its turns (requests cut by a turn's edge end as errors)
            [ "$side" != keyedctl ] && { [ "$side" != keyedtog ] || [ -z "${TOG_DRAIN:-}" ]; } && cat "$P"/tap-"$side"-c"$conc"-"$i"-*-requests.jsonl 2>/dev/null | TAPS=$([ "$side" = keyedtog ] && echo "${TOG_TAPS:-1}" || echo 1) python3 -c '
import json, os, sys
r = [json.loads(l) for l in sys.stdin]
ok = [x for x in r if not x.get("error")]
tokens = sum(x.get("completion_tokens") or 0 for x in ok)
n = int(os.environ["TAPS"])
print(f"    the tap over its turns: {len(r)} records, {len(ok)} whole, {tokens} tokens in them" + (f" (its {n} taps together)" if n > 1 else ""))'
            rm -f "$P"/tap-"$side"-c"$conc"-"$i"-*-requests.jsonl
          elif [ "$side" = split ] || [ "$side" = aa ] || [ "$side" = sx ]; then
            # half the streams straight, half through the proxy, at once, against the same server:
            # both halves see the same batches and the same host, so a drift of either cancels
            # within the run; the seeds (their prompts) change sides every round. "aa" is the
            # control: both halves straight (aad, aap), so what two halves of one run differ by
            # with no proxy at all is measured beside what the proxy's half differs by.
            halves=(splitd splitp); seeds=(1 2); [ $((i % 2)) = 0 ] && seeds=(2 1)
            # SPLIT_VIA=x1 (or relay) puts the second half through that arm instead of the proxy
            case ${SPLIT_VIA:-proxy} in proxy) via=$PPORT ;; relay) via=$RPORT ;; *) via=${XPORT[$SPLIT_VIA]} ;; esac
            [ "$side" = aa ] && { halves=(aad aap); via=$PORT; }
            [ "$side" = sx ] && { halves=(sxd sxp); case ${SX_VIA:-x1} in relay) via=$RPORT ;; *) via=${XPORT[${SX_VIA:-x1}]} ;; esac; }
            bar=$(mktemp -d)
            # which half starts first changes every round too: in the control (twelfth session)
            # the half started second had the higher median E2E in all three rounds at c=256
            half() { BARRIER="$bar 2" SEED=${seeds[$1]} DATASET=random-ids bench "$2" sglang $((conc / 2)) $((${PROMPTS:-1024} / 2)) "$P/c$conc-${halves[$1]}-$i.jsonl"; }
            if [ $((i % 2)) = 1 ]; then
              half 0 "$PORT" & half_d=$!; half 1 "$via" & half_p=$!
            else
              half 1 "$via" & half_p=$!; half 0 "$PORT" & half_d=$!
            fi
            wait "$half_d" "$half_p"; rm -rf "$bar"  # not a bare wait: the supervisor is a child too
          else
            halves=("$side")
            # (the tap arm's runs: TAP_PROMPTS, when RUN_S sizes the keyed arm's for minutes)
            n=${PROMPTS:-1024}; [ "$side" = tap ] && n=${TAP_PROMPTS:-$n}
            DATASET=random-ids bench "$port" "${S_BACKEND:-sglang}" "$conc" "$n" "$P/c$conc-$side-$i.jsonl"
          fi
          run_s=$((SECONDS - t_run + 5))
          echo "c$conc-$side-$i $w_run $(date +%s.%N) $conc" >> "$P/runs.tsv"
          post "http://$MET/-/window/stop" > "$P/c$conc-$side-$i.window.json" 2>&1
          [ -n "${PYSAMPLE:-}" ] && echo stop > "$P/pysample/m" && mv "$P/pysample/m" "$P/pysample/mark" && sleep 1
          cpu1=$(awk '{print $14+$15}' "/proc/$CPUPID/stat"); by1=$(procs stats "$SUP"); net1=$(tcpstat)
          [ "$side" = attached ] && { kill -TERM "$TAPSUP"; wait "$TAPSUP"; }
          if [ "$side" = tap ]; then
            kill -TERM "$TAPSUP"; wait "$TAPSUP"
            python3 "$HERE/scripts/gpu/tap_vs_bench.py" "$P/tap-c$conc-$i-requests.jsonl" "$P/c$conc-tap-$i.jsonl" "c$conc-tap-$i"
          fi
          for half in "${halves[@]}"; do
          [ "$half" != "$side" ] && cp "$P/c$conc-$side-$i.window.json" "$P/c$conc-$half-$i.window.json"
          # a run stopped by BENCH_TIMEOUT left no result of bench_serving's (a keyed run's stamps
          # are read above all the same)
          [ -f "$P/c$conc-$half-$i.jsonl" ] || { say "c$conc-$half-$i: no bench_serving result (stopped by its timeout)"; continue; }
          python3 - "$P/c$conc-$half-$i.jsonl" "$half" "$conc" "$i" "$cpu0" "$cpu1" "$by0" "$by1" "$net0" "$net1" <<'PY'
import json, sys, os, statistics as st
f, side, conc, i, c0, c1, by0, by1, net0, net1 = sys.argv[1:]
b = [json.loads(l.replace("Infinity", "1e999")) for l in open(f)][-1]
hz = os.sysconf("SC_CLK_TCK")
j0, j1 = json.loads(by0), json.loads(by1)
t = lambda j, k, f="both": (j["by"].get(k) or {}).get("utime", 0) * (f != "s") + (j["by"].get(k) or {}).get("stime", 0) * (f != "u")
s0 = sum(t(j0, k) for k in j0["by"]); s1 = sum(t(j1, k) for k in j1["by"])
tokens = b["total_output_tokens"] or 1
PAIR = {"splitd": "splitp", "splitp": "splitd", "aad": "aap", "aap": "aad", "sxd": "sxp", "sxp": "sxd"}
if side in PAIR:  # the CPU read over a split run served both halves' tokens
    other = f.replace(f"-{side}-", f"-{PAIR[side]}-")
    tokens += [json.loads(l.replace("Infinity", "1e999")) for l in open(other)][-1]["total_output_tokens"] if os.path.exists(other) else 0
print(f"S c={conc} round {i} {side:6s}: out {b['output_throughput']:.1f} tok/s, median E2E {b['median_e2e_latency_ms']:.1f} ms, median TPOT {b['median_tpot_ms']:.3f} ms, median TTFT {b['median_ttft_ms']:.2f} ms, completed {b['completed']}, supervisor CPU {(float(c1)-float(c0))/hz:.2f} s, server CPU {(float(s1)-float(s0))/hz:.2f} s, over {b['duration']:.2f} s")
print(f"    server CPU per output token by process (user + system): " + ", ".join(f"{k} {(t(j1, k) - t(j0, k)) / hz / tokens * 1e6:.1f} us ({(t(j1, k, 'u') - t(j0, k, 'u')) / hz / tokens * 1e6:.1f} + {(t(j1, k, 's') - t(j0, k, 's')) / hz / tokens * 1e6:.1f})" for k in sorted(j1["by"])))
m0, m1 = j0["main"], j1["main"]
busy = {n: v - m0["threads"].get(n, 0) for n, v in m1["threads"].items() if v - m0["threads"].get(n, 0) > 0}
print(f"    HTTP process: {(m1['vcsw'] - m0['vcsw']) / tokens:.3f} voluntary and {(m1['nvcsw'] - m0['nvcsw']) / tokens:.3f} involuntary context switches per output token; its busy threads (s): " + ", ".join(f"{n} {v / hz:.2f}" for n, v in sorted(busy.items(), key=lambda x: -x[1])[:4]))
n0, n1 = (dict(kv.split("=") for kv in n.split()) for n in (net0, net1))
print("    TCP over the run: " + ", ".join(f"{k} {int(v) - int(n0.get(k, 0))}" for k, v in n1.items()))
# where the time went, per request (bench_serving's own details): the ITLs, how the tokens
# came in (chunks per request: SGLang sends one event per step; fewer means merged steps)
itl = sorted(x for r in b.get("itls", []) for x in r)
chunks = [len(set(r)) for r in b.get("itls", [])]
ttft = sorted(t for t in b.get("ttfts", []) if t)
q = lambda v, p: v[min(len(v) - 1, int(p * len(v)))] * 1000 if v else float("nan")
print(f"    ITL p50 {q(itl, .5):.2f} p90 {q(itl, .9):.2f} p99 {q(itl, .99):.2f} max {q(itl, 1):.1f} ms; TTFT p10 {q(ttft, .1):.1f} p50 {q(ttft, .5):.1f} p90 {q(ttft, .9):.1f} p99 {q(ttft, .99):.1f} ms; distinct ITL values per request (median) {st.median(chunks) if chunks else 0}, chunks per request (median) {st.median([len(r) + 1 for r in b.get('itls', [])] or [0])}")
try:
    w = json.load(open(f.replace(".jsonl", ".window.json")))
    d = (w.get("server_batches") or {}).get("decode") or {}
    pf = (w.get("server_batches") or {}).get("prefill") or {}
    g = lambda m, k: (m.get(k) or {})
    print(f"    server (its log, over the run): decode lines {d.get('samples')}, running requests mean {g(d,'running_requests').get('mean')} max {g(d,'running_requests').get('max')}, queued mean {g(d,'queued_requests').get('mean')}, decode tok/s mean {json.dumps({k: v.get('mean') for k, v in d.items() if 'throughput' in k and isinstance(v, dict)})}, cuda graph share {d.get('cuda_graph_share')}; prefill lines {pf.get('samples')}")
except Exception as e:
    print(f"    server batches: n/a ({e})")
PY
          done
        done
      done
    done
    python3 - "$P" <<'PY'
import glob, json, math, re, statistics as st, sys
# Student's t, 97.5th percentile, 1 to 12 degrees of freedom (then the 12th: a slight overstatement)
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179]
runs = {}
for f in sorted(glob.glob(f"{sys.argv[1]}/c*-*-*.jsonl")):
    conc, side, i = re.search(r"c(\d+)-(\w+)-(\d+)\.jsonl$", f).groups()
    b = [json.loads(l.replace("Infinity", "1e999")) for l in open(f)][-1]
    runs.setdefault(int(conc), {}).setdefault(side, {})[int(i)] = b
keys = [("output_throughput", "out tok/s"), ("median_e2e_latency_ms", "median E2E ms"), ("median_tpot_ms", "median TPOT ms"), ("median_ttft_ms", "median TTFT ms")]
for conc, sides in sorted(runs.items()):
    for arm in [a for a in sides if a not in ("direct", "splitd", "aad", "sxd")]:
        # the split arm's proxied half is held against its own direct half, run for run (the
        # control's second half against its first)
        base = {"splitp": "splitd", "aap": "aad", "sxp": "sxd"}.get(arm, "attached" if "attached" in sides else "direct")
        if arm == base: continue
        d = sides.get(base, {})
        p = sides[arm]
        both = sorted(set(d) & set(p))
        for k, label in keys:
            dv, pv = [d[i][k] for i in both], [p[i][k] for i in both]
            if not both: continue
            ratios = [b / a for a, b in zip(dv, pv)]
            # the paired rounds' ratio as a geometric mean with a 95 % interval (Student's t over
            # the log ratios): what "within 1 %" can be judged against
            logs = [math.log(r) for r in ratios]
            gm = math.exp(st.mean(logs))
            if len(logs) > 1:
                half = T975[min(len(logs) - 1, len(T975)) - 1] * st.stdev(logs) / math.sqrt(len(logs))
                ci = f"95 % interval {math.exp(st.mean(logs) - half):.4f}..{math.exp(st.mean(logs) + half):.4f}"
            else:
                ci = "one pair: no interval"
            print(f"S c={conc} {label}: {base} median {st.median(dv):.2f} (runs {', '.join(f'{x:.1f}' for x in dv)}), "
                  f"{arm} median {st.median(pv):.2f} (runs {', '.join(f'{x:.1f}' for x in pv)}); "
                  f"{arm}/{base} of medians {st.median(pv) / st.median(dv):.4f}, median of round ratios {st.median(ratios):.4f}, "
                  f"geometric mean of round ratios {gm:.4f}, {ci} ({len(logs)} pairs)")
PY
    for conc in ${CONCS:-256 512}; do for side in keyed keyedctl keyedmix keyedtog; do  # keyed runs' turns pooled
      keyed=(); for k in "$P"/tap-$side-c"$conc"-*.keys; do
        [ -f "$k" ] || continue; i=${k##*-}; keyed+=("$P/c$conc-$side-${i%.keys}.jsonl" "$k"); done
      [ ${#keyed[@]} -gt 2 ] && { echo "$side:"; python3 "$HERE/scripts/gpu/keyed.py" "$conc" "${keyed[@]}"; }
    done; done
    [ -n "${PYSAMPLE:-}" ] && { sleep 0.3; python3 "$HERE/scripts/gpu/pysample/compare.py" "$P/pysample" 40; }
    # with the server's request log on (SERVER_EXTRA, see above): where each run's requests waited
    grep -q "Receive: obj=" "$P/server.log" 2>/dev/null && python3 "$HERE/scripts/gpu/arrivals.py" "$P/server.log" "$P/runs.tsv"
  else
    say "S: not ready"; tail -20 "$P/supervisor.err"; kill -KILL "$SUP"
  fi
fi
[ -n "${RELAY:-}" ] && kill "$RELAY" 2>/dev/null
for x in "${XSUP[@]:-}"; do kill -TERM "$x" 2>/dev/null; done
if [ -n "${SUP:-}" ] && kill -0 "$SUP" 2>/dev/null; then stop_sup; fi
if [[ " $PHASES " == *" E "* ]]; then
  P=$O/E
  for backend in sglang vllm; do
    say "E: report --bench-result ($backend), offline from the run's files"
    "$BINDIR/sglang-supervisor" report --events "$P/events.jsonl" --requests-log "$P/requests.jsonl" \
      --power-csv "$P/power.csv" --bench-result "$P/bench-$backend.jsonl" > "$P/report-span-$backend.json" 2> "$P/report-span-$backend.err"
    echo "rc=$?"; python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); w=[w for w in r.get("windows",[]) if w.get("name")=="bench"]; print(json.dumps(w)[:1500])' "$P/report-span-$backend.json"
  done
fi
[ -n "${PACK_JIT:-}" ] && cache_pack "$O/jit-cache.tar.xz" >/dev/null 2>&1
# few files come back: the jit cache and one archive of the rest
tar -C "$O" --exclude jit-cache.tar.xz --exclude "S/c*-*-*.jsonl" --exclude "*.chunks" -czf "$O/../acceptance-files.tar.gz" . 2>/dev/null
[ -f "$O/jit-cache.tar.xz" ] && mv "$O/jit-cache.tar.xz" "$O/../"
say "done"
exit 0
