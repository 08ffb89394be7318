#!/usr/bin/env bash
# One planned call on the lent H200 (see docs/real-gpu.md): a real SGLang 0.5.14 server on the
# tiny dummy Llama, started and stopped under the supervisor in several ways.
#   usage (on the GPU machine, repo root): scripts/gpu/real_run.sh BIN BUNDLE OUTDIR [PHASES]
#   BIN     the x86-64 sglang-supervisor binary; BUNDLE the prepared .sgldev; OUTDIR gets the files.
#   PHASES  default "A C G K": A normal start + checks + SIGTERM; C failing start (fa3);
#           G main process SIGKILLed during start; K supervisor SIGKILLed after ready;
#           P probe + a 60 s sampled power window over a matmul load (scripts/gpu/matmul_load.py);
#           S flags (import/static/dump), default pre-flight, --api-key server under --redact-log;
#           J start-up attribution (compilers during the start), a torch-profiler capture of 20
#             steps under load, the HTML report (run it on a fresh machine, then with the JIT
#             caches carried: PACK_JIT=1).
# Needs dev-device/ (a copy of shared/sglang-device) next to it. Every phase writes
# OUTDIR/<phase>/{events.jsonl,server.log,supervisor.err,checks.txt} and the summary.
set -u
BIN=$(realpath "${1:?binary}"); B=$(realpath "${2:?bundle}"); O=$(realpath -m "${3:?outdir}"); PHASES=${4:-A C G K}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$O"
exec > >(tee "$O/summary.txt") 2>&1
# shellcheck source=/dev/null
source "$HERE/dev-device/serve.sh"
install_bundle "$B" || exit 1
eval "$(print_env)"
PORT=30000
SERVER=(python3 -m sglang.launch_server --model-path "$B/tiny-llama" --load-format dummy --host 127.0.0.1 --port $PORT
        --attention-backend triton --sampling-backend pytorch --grammar-backend none --enable-metrics
        --cuda-graph-backend-prefill disabled)
now() { date +%s.%N; }
sub() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.3f", a-b}'; }
get() { python3 -c 'import sys,urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' "$1"; }
post() { python3 -c 'import sys,urllib.request; urllib.request.urlopen(urllib.request.Request(sys.argv[1], data=sys.argv[2].encode(), headers={"content-type":"application/json"}), timeout=30).read()' "$1" "$2"; }
say() { echo "[real-run $(date +%T.%3N)] $*"; }
check() { # check NAME CONDITION-RESULT(0/1) DETAIL
  local verdict=FAIL; [ "$2" = 0 ] && verdict=ok
  echo "$verdict  $1  $3" | tee -a "$P/checks.txt"
}
wait_event() { # wait_event NAME TIMEOUT_S → 0 when seen
  local end=$(( $(date +%s) + $2 ))
  while [ "$(date +%s)" -lt "$end" ]; do
    grep -q "\"event\":\"$1\"" "$P/events.jsonl" 2>/dev/null && return 0
    grep -q '"event":"exited"' "$P/events.jsonl" 2>/dev/null && return 1
    sleep 0.05
  done
  return 1
}
gpu_procs() { nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null | grep -v '^$' || true; }
tree_left() { ps -eo pid,ppid,pgid,stat,etimes,rss,args | grep -E 'sglang|resource_tracker|multiprocessing' | grep -v -E 'grep|real_run' || true; }
start_sup() { # start_sup EXTRA_SERVER_ARGS...   (supervisor options: $SUP_EXTRA)
  # shellcheck disable=SC2086
  "$BIN" run --events "$P/events.jsonl" --log-file "$P/server.log" --grace 30s --ready-timeout 6m --no-tee ${SUP_EXTRA:-} \
    -- "${SERVER[@]}" "$@" 2> "$P/supervisor.err" &
  SUP=$!
  T_START=$(now)
}

nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv > "$O/gpu.txt" 2>&1
for phase in $PHASES; do
  P=$O/$phase; mkdir -p "$P"
  case $phase in
  A)
    say "A: normal start, checks, SIGTERM"
    start_sup
    if wait_event ready 360; then
      t_ready=$(now)
      ready_line=$(grep -n 'The server is fired up and ready to roll!' "$P/server.log" | head -1)
      check ready 0 "after $(sub $t_ready $T_START) s; line: $ready_line"
      get "http://127.0.0.1:$PORT/server_info" > "$P/server_info.json"
      get "http://127.0.0.1:$PORT/metrics" > "$P/metrics.txt"
      python3 - "$P" <<'PY' | tee -a "$P/checks.txt"
import json, sys
p = sys.argv[1]
ev = [json.loads(l) for l in open(f"{p}/events.jsonl")]
args = next(e["args"] for e in ev if e["event"] == "server_args")
info = json.load(open(f"{p}/server_info.json"))
common = [k for k in args if k in info]
diff = [k for k in common if args[k] != info[k] and args[k] != "<redacted>"]
only_log = [k for k in args if k not in info]
print(f"{'ok' if not diff else 'FAIL'}  server_args_vs_server_info  {len(common)} keys compared, {len(diff)} differ: "
      + ", ".join(f"{k}: log={args[k]!r} http={info[k]!r}" for k in diff[:8]) + f"; {len(only_log)} only in the log: {only_log[:8]}")
phases = [(e["name"], e.get("rank"), e["elapsed_s"], e.get("duration_s")) for e in ev if e["event"] == "phase"]
print("ok  phases  " + "; ".join(f"{n}@{t}s" + (f"({d}s)" if d is not None else "") for n, r, t, d in phases))
ready = next(e for e in ev if e["event"] == "ready")
print(f"ok  ready_event  elapsed_s={ready['elapsed_s']} ts={ready['ts']}")
PY
      for i in 1 2 3; do post "http://127.0.0.1:$PORT/generate" '{"text":"The capital of France is","sampling_params":{"max_new_tokens":32}}'; done
      tree_left > "$P/ps_before_stop.txt"; gpu_procs > "$P/gpu_before_stop.txt"
      t0=$(now); kill -TERM "$SUP"; wait "$SUP"; rc=$?; t1=$(now)
      check sigterm_exit_143 "$([ "$rc" = 143 ] && echo 0 || echo 1)" "rc=$rc after $(sub $t1 $t0) s"
      grep '"event":"exited"' "$P/events.jsonl" | tee -a "$P/checks.txt"
      grep -q '"event":"gpu_teardown","clean":true' "$P/events.jsonl"; check gpu_teardown_clean $? "$(grep '"event":"gpu_teardown"' "$P/events.jsonl" | cut -c1-300)"
      grep '"event":"power"' "$P/events.jsonl" | cut -c1-900 | tee -a "$P/checks.txt"
      sleep 1; left=$(tree_left); g=$(gpu_procs)
      check no_process_left "$([ -z "$left" ] && echo 0 || echo 1)" "$left"
      check no_gpu_memory_held "$([ -z "$g" ] && echo 0 || echo 1)" "$g"
    else
      check ready 1 "no ready event"; kill -KILL "$SUP" 2>/dev/null; wait "$SUP"
    fi
    ;;
  C)
    say "C: failing start (fa3 not in the bundle)"
    start_sup --attention-backend fa3
    wait "$SUP"; rc=$?; t1=$(now)
    check fails_nonzero "$([ "$rc" != 0 ] && echo 0 || echo 1)" "rc=$rc after $(sub $t1 $T_START) s"
    grep '"event":"fatal"' "$P/events.jsonl" | head -3 | cut -c1-1500 | tee -a "$P/checks.txt"
    grep -q 'ImportError: Can not import FA3' "$P/events.jsonl"; check fatal_quotes_importerror $? ""
    sleep 1; left=$(tree_left); g=$(gpu_procs)
    check no_process_left "$([ -z "$left" ] && echo 0 || echo 1)" "$left"
    check no_gpu_memory_held "$([ -z "$g" ] && echo 0 || echo 1)" "$g"
    ;;
  G)
    say "G: SIGKILL of the server's main process during start"
    start_sup
    if wait_event server_args 200; then
      sleep 20  # into the scheduler's start, as in the recorded G run (60 s in)
      main=$(grep -o '"event":"spawned","pid":[0-9]*' "$P/events.jsonl" | grep -o '[0-9]*$')
      tree_left > "$P/ps_before_kill.txt"
      t0=$(now); kill -KILL "$main"; wait "$SUP"; rc=$?; t1=$(now)
      left=$(tree_left); g=$(gpu_procs)
      check supervisor_done "$([ "$rc" = 137 ] && echo 0 || echo 1)" "rc=$rc, $(sub $t1 $t0) s after the kill"
      check no_process_left_at_once "$([ -z "$left" ] && echo 0 || echo 1)" "$left"
      check no_gpu_memory_held "$([ -z "$g" ] && echo 0 || echo 1)" "$g"
      grep '"event":"fatal"' "$P/events.jsonl" | cut -c1-600 | tee -a "$P/checks.txt"
    else
      check server_args_seen 1 ""; kill -KILL "$SUP"; wait "$SUP"
    fi
    ;;
  B)
    say "B: bench_serving through the proxy; proxy per-request figures vs bench_serving's own"
    SUP_EXTRA="--proxy-addr 127.0.0.1:0 --requests-log $P/requests.jsonl --metrics-addr 127.0.0.1:9400" start_sup
    if wait_event ready 360; then
      pport=$(grep -o '"proxy":"[^"]*"' "$P/events.jsonl" | cut -d'"' -f4 | cut -d: -f2)
      bench_args=(--backend sglang --host 127.0.0.1 --port "$pport" --model "$B/tiny-llama" --tokenizer "$B/tiny-llama"
        --dataset-name random --dataset-path "$B/tiny-llama/sharegpt_mini.json" --random-input-len 512 --random-output-len 128
        --random-range-ratio 1.0 --num-prompts 64 --max-concurrency 8 --seed 1 --disable-tqdm --output-details
        --output-file "$P/bench.jsonl")
      (sleep 4; get "http://127.0.0.1:9400/metrics" > "$P/metrics_during_bench.txt") &
      scrape=$!
      post "http://127.0.0.1:9400/-/window/start?name=bench" ""
      timeout 200 python3 -m sglang.bench_serving "${bench_args[@]}" > "$P/bench.txt" 2>&1; rc=$?
      if [ "$rc" != 0 ] && grep -qE "No module named|ImportError" "$P/bench.txt"; then
        PYTHONPATH="$HERE/dev-device/stubs-fallback:$PYTHONPATH" timeout 200 python3 -m sglang.bench_serving "${bench_args[@]}" > "$P/bench.txt" 2>&1; rc=$?
      fi
      python3 -c 'import sys,urllib.request; print(urllib.request.urlopen(urllib.request.Request(sys.argv[1], data=b"", method="POST"), timeout=30).read().decode())' \
        "http://127.0.0.1:9400/-/window/stop" > "$P/window.json" 2>&1
      cut -c1-700 "$P/window.json" | tee -a "$P/checks.txt"
      wait "$scrape"
      check bench_serving_via_proxy "$([ "$rc" = 0 ] && echo 0 || echo 1)" "rc=$rc; $(grep -E 'Successful requests|Median TTFT' "$P/bench.txt" | tr '\n' ' ')"
      grep -c 'sglang:' "$P/metrics_during_bench.txt" | sed 's/^/sglang: lines re-exposed during the bench: /' | tee -a "$P/checks.txt"
      python3 - "$P" <<'PY' | tee -a "$P/checks.txt"
import json, sys, statistics as st
p = sys.argv[1]
b = [json.loads(l) for l in open(f"{p}/bench.jsonl")][-1]
r = [json.loads(l) for l in open(f"{p}/requests.jsonl")]
r = [x for x in r if x.get("stream") and x["status"] == 200 and not x.get("error")]
# bench_serving's warm-up request goes through the proxy too: keep the last `completed` ones.
r = r[-b["completed"]:]
def cmp(name, ours, theirs):
    ours, theirs = sorted(ours), sorted(theirs)
    n = min(len(ours), len(theirs))
    d = [abs(ours[i] - theirs[i]) * 1000 for i in range(n)]
    print(f"ok  {name}  n={n} proxy median {st.median(ours)*1000:.3f} ms vs bench_serving {st.median(theirs)*1000:.3f} ms; "
          f"per-request (sorted pairs) |diff| median {st.median(d):.3f} ms, worst {max(d):.3f} ms")
cmp("ttft", [x["ttft_s"] for x in r], b["ttfts"])
itl_b = [g for row in b["itls"] for g in row]
itl_p = [g for x in r for g in x["itl_s"]]
print(f"ok  itl  proxy median {st.median(itl_p)*1000:.3f} ms (n={len(itl_p)}) vs bench_serving {st.median(itl_b)*1000:.3f} ms (n={len(itl_b)})")
print(f"ok  tpot  proxy median {st.median([x['tpot_s'] for x in r if x.get('tpot_s')])*1000:.3f} ms vs bench_serving median_tpot_ms {b['median_tpot_ms']:.3f}")
print(f"ok  e2e  proxy median {st.median([x['e2e_s'] for x in r])*1000:.3f} ms vs bench_serving median_e2e_latency_ms {b['median_e2e_latency_ms']:.3f}")
print(f"ok  tokens  proxy completion total {sum(x['completion_tokens'] for x in r)} vs bench_serving total_output_tokens {b['total_output_tokens']}")
PY
      t0=$(now); kill -TERM "$SUP"; wait "$SUP"; rc=$?
      check sigterm_exit_143 "$([ "$rc" = 143 ] && echo 0 || echo 1)" "rc=$rc after $(sub "$(now)" "$t0") s"
    else
      check ready 1 ""; kill -KILL "$SUP"; wait "$SUP"
    fi
    ;;
  R)
    say "R: millisecond log timestamps (SGLANG_LOG_MS=1): ready-line → ready-event lag; report; traffic window"
    export SGLANG_LOG_MS=1
    SUP_EXTRA="--proxy-addr 127.0.0.1:0 --window-from-proxy --report $P/report.json --requests-log $P/requests.jsonl" start_sup
    unset SGLANG_LOG_MS
    if wait_event ready 360; then
      date +%Z > "$P/tz.txt"
      pport=$(grep -o '"proxy":"[^"]*"' "$P/events.jsonl" | cut -d'"' -f4 | cut -d: -f2)
      for i in 1 2 3 4 5 6; do post "http://127.0.0.1:$pport/generate" '{"text":"The capital of France is","sampling_params":{"max_new_tokens":64},"stream":true}'; done
      sleep 1
      t0=$(now); kill -TERM "$SUP"; wait "$SUP"; rc=$?
      check sigterm_exit_143 "$([ "$rc" = 143 ] && echo 0 || echo 1)" "rc=$rc after $(sub "$(now)" "$t0") s"
      python3 - "$P" <<'PY' | tee -a "$P/checks.txt"
import json, sys, datetime, re
p = sys.argv[1]
ev = [json.loads(l) for l in open(f"{p}/events.jsonl")]
ready = next(e for e in ev if e["event"] == "ready")
line = next(l for l in open(f"{p}/server.log", errors="replace") if "ready to roll" in l)
m = re.match(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})", line)
tz = open(f"{p}/tz.txt").read().strip()
logged = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc)
evt = datetime.datetime.strptime(ready["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc)
lag = (evt - logged).total_seconds() * 1000
print(f"{'ok' if 0 <= lag < 50 else 'FAIL'}  ready_lag  log line {m.group(1)} ({tz}) → ready event {ready['ts']}: {lag:.1f} ms (log ms resolution; includes the HTTP confirmation)")
r = json.load(open(f"{p}/report.json"))
w = [x for x in r["windows"] if x["name"] == "proxy-traffic"]
print(f"{'ok' if w else 'FAIL'}  report  schema {r['schema_version']}, sglang {r['identity']['sglang_version']}, gpu {r['identity']['gpu_name']} x{r['identity']['gpu_count']}, ready {r['startup']['time_to_ready_s']} s, "
      + (f"proxy-traffic window {w[0]['power']['duration_s']:.2f} s power_valid {w[0]['power']['power_valid']} energy {w[0]['power']['total_gpu_energy_j']:.1f} J, {w[0]['requests']['completed']} requests median TTFT {w[0]['requests']['median_ttft_ms']:.2f} ms" if w else "no proxy-traffic window"))
PY
    else
      unset SGLANG_LOG_MS; check ready 1 ""; kill -KILL "$SUP"; wait "$SUP"
    fi
    ;;
  F)
    say "F: the real parser of the bundle's SGLang (import, dump_flags.py), then the pre-flight audit, timed"
    t0=$(now); python3 "$HERE/dev-device/dump_flags.py" "$P/schema.json" > "$P/dump.log" 2>&1; rc=$?; t1=$(now)
    check import_dump "$([ "$rc" = 0 ] && echo 0 || echo 1)" "rc=$rc in $(sub "$t1" "$t0") s ($(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["sglang_version"], len(d["actions"]), "actions")' "$P/schema.json" 2>&1))"
    # Import mode through our own introspection module, in this machine's python3 (the bundle's SGLang).
    t0=$(now); "$BIN" flags dump --sglang python3 > "$P/schema_ours.json" 2> "$P/dump_ours.err"; rc=$?; t1=$(now)
    check import_mode_ours "$([ "$rc" = 0 ] && echo 0 || echo 1)" "rc=$rc in $(sub "$t1" "$t0") s: $("$BIN" flags diff --from "$P/schema.json" --to python3 --format json 2>/dev/null | python3 -c 'import json,sys; d=json.load(sys.stdin); print({k: len(d[k]) for k in ("added","removed","deprecated","changed")}, "vs dump_flags.py")')"
    t0=$(now); "$BIN" flags audit --sglang python3 --format json -- "${SERVER[@]:3}" --cuda-graph-max-bs 8 --tp 1 > "$P/audit.json" 2> "$P/audit.err"; rc=$?; t1=$(now)
    check preflight_audit "$([ "$rc" = 1 ] && echo 0 || echo 1)" "rc=$rc (1: a deprecated flag) in $(sub "$t1" "$t0") s: $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print([(f["flag"], f["status"]) for f in d["flags"] if f["status"] != "ok"])' "$P/audit.json")"
    t0=$(now); "$BIN" run --no-tee --metrics-addr none --flags-schema python3 --events "$P/events.jsonl" -- "${SERVER[@]}" --attention-backend fa9 2> "$P/run.err"; rc=$?; t1=$(now)
    check preflight_rejects "$([ "$rc" = 126 ] && echo 0 || echo 1)" "rc=$rc in $(sub "$t1" "$t0") s: $(grep -o 'invalid choice[^;)]*' "$P/run.err" | head -1 | cut -c1-120)"
    ;;
  P)
    say "P: probe, then a 60 s sampled window over a known matmul load (no SGLang)"
    "$BIN" probe > "$P/probe.txt" 2>&1; "$BIN" probe --json > "$P/probe.json" 2>&1
    cat "$P/probe.txt"
    "$BIN" run --events "$P/events.jsonl" --log-file "$P/load.log" --no-tee --sample-interval 100ms \
      --power-csv "$P/power.csv" -- python3 "$HERE/scripts/gpu/matmul_load.py" 60 15 45 2> "$P/supervisor.err"
    rc=$?
    check load_run "$([ "$rc" = 0 ] && echo 0 || echo 1)" "rc=$rc"
    grep -E '"event":"(power|gpu_teardown|exited)"' "$P/events.jsonl" | cut -c1-1500 | tee -a "$P/checks.txt"
    python3 - "$P" <<'PY' | tee -a "$P/checks.txt"
import json, sys
p = sys.argv[1]
ev = [json.loads(l) for l in open(f"{p}/events.jsonl")]
w = next(e for e in ev if e["event"] == "power")
for g in w["gpus"]:
    c, i, a = g.get("energy_j"), g["energy_from_instant_power_j"], g["energy_from_average_power_j"]
    d = abs(c - i) / c * 100 if c else float("nan")
    print(f"{'ok' if d < 3 else 'FAIL'}  energy_counter_vs_instant_integral  GPU{g['index']}: counter {c:.1f} J, instant-power integral {i:.1f} J ({d:.2f} %), 1 s-average integral {a:.1f} J ({abs(c-a)/c*100:.2f} %); samples {g['samples']} at {g['achieved_hz']:.2f} Hz, max gap {g['max_gap_s']} s, peak instant {g.get('peak_power_w')} W vs peak 1 s average {g.get('peak_average_power_w')} W, sampler CPU {g['cpu_ms_per_sample']:.3f} ms/sample")
ex = next(e for e in ev if e["event"] == "exited")
cpu = ex["log"].get("supervisor_cpu_s")
print(f"ok  supervisor_cpu  {cpu} s over {w['duration_s']:.1f} s = {cpu / w['duration_s'] * 100:.3f} % of one core (whole supervisor, 1 GPU at 10 Hz)")
PY
    ;;
  K)
    say "K: the supervisor itself SIGKILLed after ready (PDEATHSIG + sentinel)"
    start_sup
    if wait_event ready 360; then
      tree_left > "$P/ps_before_kill.txt"; gpu_procs > "$P/gpu_before_kill.txt"
      t0=$(now); kill -KILL "$SUP"; wait "$SUP" 2>/dev/null
      for i in $(seq 40); do [ -z "$(tree_left)" ] && break; sleep 0.05; done; t1=$(now)
      left=$(tree_left); sleep 2; g=$(gpu_procs)
      check tree_gone_after_supervisor_sigkill "$([ -z "$left" ] && echo 0 || echo 1)" "$(sub $t1 $t0) s; $left"
      check no_gpu_memory_held "$([ -z "$g" ] && echo 0 || echo 1)" "$g"
    else
      check ready 1 ""; kill -KILL "$SUP"; wait "$SUP"
    fi
    ;;
  S)
    say "S: flags of the installed SGLang three ways (import in our binary, static of the installed tree, saved dump); default pre-flight; a real server with --api-key under --redact-log"
    t0=$(now); "$BIN" flags dump --raw --sglang python3 > "$P/import.json" 2> "$P/import.err"; rc=$?; t1=$(now)
    check import_mode "$([ "$rc" = 0 ] && echo 0 || echo 1)" "rc=$rc in $(sub "$t1" "$t0") s: $(grep -o 'options, .*' "$P/import.err" | head -1); timings $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("timings"))' "$P/import.json" 2>&1)"
    site=$(python3 -c 'import importlib.util, os; print(os.path.dirname(list(importlib.util.find_spec("sglang").submodule_search_locations)[0]))')
    t0=$(now); "$BIN" flags dump --raw --sglang "$site" > "$P/static.json" 2> "$P/static.err"; rc=$?; t1=$(now)
    check static_mode_installed_tree "$([ "$rc" = 0 ] && echo 0 || echo 1)" "rc=$rc in $(sub "$t1" "$t0") s ($site): $(grep -o 'options, .*' "$P/static.err" | head -1)"
    python3 - "$P" "$HERE/tests/fixtures/flags/sglang-0.5.14-import-on-h200.json" <<'PY' | tee -a "$P/checks.txt"
import json, sys
p, fixture = sys.argv[1], sys.argv[2]
shape = lambda d: [(a["option_strings"], a["dest"], bool(a.get("deprecated")), a.get("new_flag")) for a in d["actions"] if a["dest"] != "help"]
imp, st, fx = (json.load(open(f)) for f in (f"{p}/import.json", f"{p}/static.json", fixture))
for name, other in (("static_of_installed_tree", st), ("saved_h200_dump", fx)):
    a, b = shape(imp), shape(other)
    same = [x[0] for x in a] == [x[0] for x in b]
    dep = [x for x in a if x[2]] == [x for x in b if x[2]] if name != "saved_h200_dump" else sum(x[2] for x in a) >= sum(x[2] for x in b)
    print(f"{'ok' if same and dep else 'FAIL'}  import_vs_{name}  {len(a)} vs {len(b)} options, option strings in order equal: {same}, deprecations: {dep}")
PY
    t0=$(now); "$BIN" run --no-tee --metrics-addr none --events "$P/reject.jsonl" -- "${SERVER[@]}" --no-such-flag 1 2> "$P/reject.err"; rc=$?; t1=$(now)
    check default_preflight_rejects "$([ "$rc" = 126 ] && echo 0 || echo 1)" "rc=$rc in $(sub "$t1" "$t0") s: $(head -c 400 "$P/reject.jsonl")"
    SECRET=sk-h200-secret-4f9a2c
    SUP_EXTRA="--redact-log" HF_TOKEN=hf_h200tokenXYZ start_sup --api-key "$SECRET"
    if wait_event ready 360; then
      check ready_with_api_key 0 "after $(sub "$(now)" "$T_START") s; $(grep -o '"event":"preflight"[^}]*' "$P/events.jsonl" | head -c 300)"
      code=$(python3 -c 'import sys,urllib.request
r = urllib.request.Request(sys.argv[1], data=b"{\"text\":\"Hi\",\"sampling_params\":{\"max_new_tokens\":8}}", headers={"content-type":"application/json","authorization":"Bearer "+sys.argv[2]})
print(urllib.request.urlopen(r, timeout=30).status)' "http://127.0.0.1:$PORT/generate" "$SECRET" 2>&1 | tail -1)
      check generate_with_key "$([ "$code" = 200 ] && echo 0 || echo 1)" "status $code"
      grep -q '"event":"server_info"' "$P/events.jsonl"; check server_info_read_with_key $? ""
      kill -TERM "$SUP"; wait "$SUP"; rc=$?
      check sigterm_exit_143 "$([ "$rc" = 143 ] && echo 0 || echo 1)" "rc=$rc"
      n_log=$(grep -c -e "$SECRET" -e hf_h200tokenXYZ "$P/server.log"); n_red=$(grep -c '<redacted>' "$P/server.log")
      check no_secret_in_log "$([ "$n_log" = 0 ] && echo 0 || echo 1)" "$n_log lines with a secret, $n_red with <redacted>"
      n_ev=$(grep -c -e "$SECRET" -e hf_h200tokenXYZ "$P/events.jsonl" "$P/supervisor.err" | awk -F: '{s+=$2} END {print s}')
      check no_secret_in_events "$([ "$n_ev" = 0 ] && echo 0 || echo 1)" "$n_ev"
      sleep 1; left=$(tree_left); g=$(gpu_procs)
      check no_process_left "$([ -z "$left" ] && echo 0 || echo 1)" "$left"
      check no_gpu_memory_held "$([ -z "$g" ] && echo 0 || echo 1)" "$g"
    else
      check ready_with_api_key 1 "$(tail -5 "$P/supervisor.err")"; kill -KILL "$SUP" 2>/dev/null; wait "$SUP"
    fi
    ;;
  J)
    say "J: where the start's time goes (JIT compilers), a torch-profiler capture, the HTML report"
    SUP_EXTRA="--metrics-addr 127.0.0.1:9400 --report $P/report.json --report-html $P/report.html --profile-dir $P/traces --power-csv $P/power.csv --proxy-addr 127.0.0.1:8000 --requests-log $P/requests.jsonl" start_sup
    if wait_event ready 360; then
      python3 - "$P/events.jsonl" <<'PY' | tee -a "$P/checks.txt"
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
p = next(e for e in ev if e["event"] == "startup_profile")
j = p["jit"]
print(f"ok  startup_profile  ready {p['until_s']} s, JIT {j['wall_s']} s ({j['share']*100:.0f}%), {j['processes']} compiler processes, {j['cpu_s']} CPU s, by compiler {json.dumps(j['by_compiler'])}; {p['samples']} samples costing {p['profiler_cpu_s']} CPU s")
for s in p["segments"]:
    print(f"    {s['name']:<20} {s['duration_s']:>8} s  JIT {s['jit_s']:>8} s  compilers {s['compiler_processes']}")
PY
      call() { python3 -c 'import sys,urllib.request,urllib.error
try: r = urllib.request.urlopen(urllib.request.Request(sys.argv[1], data=b"", method="POST"), timeout=120); print(r.read().decode())
except urllib.error.HTTPError as e: print(e.read().decode())' "$1"; }
      call "http://127.0.0.1:9400/-/window/start?name=load" > /dev/null
      call "http://127.0.0.1:9400/-/profile/start?steps=20" > "$P/profile_start.json"
      python3 - <<'PY'
import json, threading, urllib.request
body = json.dumps({"text": "Once upon a time", "sampling_params": {"max_new_tokens": 64}, "stream": True}).encode()
def one():
    r = urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:8000/generate", data=body, headers={"content-type": "application/json"}), timeout=120)
    r.read()
ts = [threading.Thread(target=one) for _ in range(16)]
[t.start() for t in ts]; [t.join() for t in ts]
PY
      call "http://127.0.0.1:9400/-/profile/stop" > "$P/profile_stop.json"
      call "http://127.0.0.1:9400/-/window/stop" > "$P/window.json"
      check profile_traces "$(python3 -c 'import json,sys; v=json.load(open(sys.argv[1])); sys.exit(0 if v.get("ok") and v["traces"] else 1)' "$P/profile_stop.json"; echo $?)" \
        "$(python3 -c 'import json,sys; v=json.load(open(sys.argv[1])); print("stop answered", v.get("stop"), "traces", [(t["file"].rsplit("/",1)[-1], t["bytes"]) for t in v.get("traces", [])])' "$P/profile_stop.json" 2>&1)"
      check window_batches "$(grep -q server_batches "$P/window.json"; echo $?)" "$(head -c 600 "$P/window.json")"
    fi
    kill -TERM "$SUP"; wait "$SUP"
    check report_html "$([ -s "$P/report.html" ] && echo 0 || echo 1)" "$(stat -c %s "$P/report.html" 2>/dev/null) bytes"
    ;;
  esac
  pkill -KILL -f sglang.launch_server 2>/dev/null; pkill -KILL -f 'sglang::' 2>/dev/null
done
say "done"; grep -h -E '^(ok|FAIL)' "$O"/*/checks.txt
tar -C "$(dirname "$O")" -czf "$O.tar.gz" "$(basename "$O")" 2>/dev/null
# Keep the kernels compiled on this machine for the next call (optional).
[ -n "${PACK_JIT:-}" ] && cache_pack "$O/jit-cache.tar.xz" >/dev/null 2>&1
exit 0
