//! sglang-replay: plays back recorded real SGLang output (tests/fixtures/) with its timing, and
//! serves the HTTP endpoints a real server has, so the supervisor can be tested end to end without
//! a GPU. Fault modes reproduce what real servers do when they fail.
//!
//! Like SGLang it runs a small process tree (a "scheduler" and a "detokenizer" child), logs to
//! stderr, answers SIGTERM by draining and then SIGKILLing itself (exit 137), SIGINT by exit 0,
//! and after a scheduler crash prints the traceback, `Received sigquit ...` and SIGKILLs itself.
#![allow(clippy::disallowed_methods)] // a test program: it spawns its own children directly
use anyhow::{Context, Result};
use clap::Parser;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const DEFAULT_LOG: &[u8] =
    include_bytes!("../../fixtures/sglang-0.5.14-h200/B_decode_graph/server.log");
const DEFAULT_SERVER_INFO: &str =
    include_str!("../../fixtures/sglang-0.5.14-h200/B_decode_graph/server_info.json");
const DEFAULT_MODEL_INFO: &str =
    include_str!("../../fixtures/sglang-0.5.14-h200/B_decode_graph/model_info.json");
const DEFAULT_METRICS: &str =
    include_str!("../../fixtures/sglang-0.5.14-h200/B_decode_graph/metrics.txt");
/// The real scheduler traceback of the FA3 failure (fixture C_fail_fa3), without its header line.
const CRASH_TRACEBACK: &str = "Traceback (most recent call last):
  File \"/tmp/site/sglang/srt/managers/scheduler.py\", line 4211, in run_scheduler_process
    scheduler = Scheduler(
                ^^^^^^^^^^
  File \"/tmp/site/sglang/srt/layers/attention/flashattention_backend.py\", line 184, in __init__
    from sgl_kernel.flash_attn import (
  File \"/tmp/site/sgl_kernel/flash_attn.py\", line 10, in <module>
    raise ImportError(
ImportError: Can not import FA3 in sgl_kernel. Please check your installation.
";

#[derive(Parser, Debug)]
#[command(
    about = "Replay recorded SGLang output and serve its HTTP API (test double for sglang.launch_server)"
)]
struct Args {
    /// Recorded server.log to replay (default: the embedded B_decode_graph run).
    #[arg(long)]
    log: Option<PathBuf>,
    /// Directory with server_info.json / model_info.json / metrics.txt (default: embedded).
    #[arg(long)]
    fixture_dir: Option<PathBuf>,
    /// Time scale: 1 = as recorded, 100 = a hundred times faster.
    #[arg(long, default_value_t = 1.0)]
    speed: f64,
    /// Longest pause between two lines, in seconds (after scaling).
    #[arg(long, default_value_t = 5.0)]
    max_gap: f64,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 30000)]
    port: u16,
    /// SGLang version to imitate: /ready exists from 0.5.20 on.
    #[arg(long, default_value = "0.5.14")]
    version: String,
    /// Rank prefixes for scheduler lines, e.g. "TP0,TP1" or "DP0 TP0 EP0,DP0 TP1 EP1": each
    /// scheduler line is printed once per rank with that prefix.
    #[arg(long)]
    ranks: Option<String>,
    /// Timestamps with milliseconds (as with SGLANG_LOG_MS).
    #[arg(long)]
    log_ms: bool,
    /// uvicorn access lines go to stdout (as in SGLang); default: everything on stderr.
    #[arg(long)]
    access_log_stdout: bool,
    /// Crash in this phase (init, load_weights, kv_cache, cuda_graph, http_up): scheduler
    /// traceback, `Received sigquit`, then SIGKILL of itself, like SGLang.
    #[arg(long)]
    crash_in: Option<String>,
    /// Which rank crashes (a prefix from --ranks); default: the unprefixed scheduler.
    #[arg(long)]
    crash_rank: Option<String>,
    /// Stop printing in this phase and hang (HTTP keeps answering 503 / refusing).
    #[arg(long)]
    hang_in: Option<String>,
    /// Ignore SIGTERM (and SIGINT).
    #[arg(long)]
    ignore_sigterm: bool,
    /// Start grandchildren that ignore SIGTERM: one in our group, one in a new session.
    #[arg(long)]
    grandchildren: bool,
    /// Print argparse's usage and `sglang serve: error: MSG`, exit 2.
    #[arg(long)]
    argparse_error: Option<String>,
    /// After readiness, write this many bytes of realistic log lines as fast as possible.
    #[arg(long, default_value_t = 0)]
    flood_bytes: u64,
    /// After readiness, write lines with invalid UTF-8 and ANSI colour codes.
    #[arg(long)]
    invalid_utf8: bool,
    /// After readiness, write one line of this many bytes (newline only at its end).
    #[arg(long, default_value_t = 0)]
    huge_line: u64,
    /// Exit by itself with this code this many seconds after readiness (e.g. "0:2").
    #[arg(long)]
    exit_after_ready: Option<String>,
    /// Print the ready line `--ready-lines` times (multi-worker servers print it per worker).
    #[arg(long, default_value_t = 1)]
    ready_lines: u32,
    /// Answer /health 200 this many seconds before the ready line is printed (an older SGLang,
    /// whose /health did not wait for its warm-up).
    #[arg(long, default_value_t = 0.0)]
    healthy_before_ready_line: f64,
    /// Write the wall-clock time (ns since epoch) of the ready line here, just before printing it.
    #[arg(long)]
    ready_stamp: Option<PathBuf>,
    /// Also write every byte printed (both streams, in order) here, for byte-exact comparisons.
    #[arg(long)]
    record: Option<PathBuf>,
    /// Streaming answers stop after this many tokens: the connection is closed mid-stream, with
    /// no terminating chunk (a server dying under load).
    #[arg(long)]
    cut_stream_after: Option<u64>,
    /// Require `Authorization: Bearer KEY` on every path but /health* and /metrics, answering
    /// 401 otherwise (SGLang's api-key middleware).
    #[arg(long)]
    api_key: Option<String>,
    /// With --api-key: the 401 is sent before the request body is read (the body is read after
    /// it, and the connection kept), as a middleware that rejects on the headers does.
    #[arg(long)]
    reject_before_body: bool,
    /// Time per generated token, in microseconds (a real server at high concurrency: 10-20 ms).
    #[arg(long, default_value_t = 2000)]
    token_gap_us: u64,
    /// Every Nth streamed event carries two tokens, as a busy SGLang merges them (0: never).
    #[arg(long, default_value_t = 0)]
    merge_every: u64,
    /// Write streamed events in lockstep, at each multiple of this many microseconds on one clock
    /// for all streams, as SGLang's one HTTP thread writes every running request's event after
    /// each decode step (0: each stream on its own, `--token-gap-us` after its previous event).
    #[arg(long, default_value_t = 0)]
    step_us: u64,
    /// A chat answer's first N tokens are `reasoning_content` (a reasoning parser's output).
    #[arg(long, default_value_t = 0)]
    reasoning_tokens: u64,
    /// Node rank of a multi-node launch. N >= 1 plays a worker node as SGLang 0.5.14 runs it
    /// (`engine.py`: `node_rank >= 1` → schedulers only, then `launch_dummy_health_check_server`):
    /// the server args, the scheduler lines of its local TP ranks (no batch lines, no
    /// `max_total_num_tokens`: tp_rank 0 logs those), no uvicorn or ready line; then only
    /// `/health`, `/health_generate` and `/ping` answer (200), everything else 404.
    #[arg(long, default_value_t = 0)]
    node_rank: u32,
    /// Number of nodes of the launch (with --node-rank).
    #[arg(long, default_value_t = 1)]
    nnodes: u32,
    /// Internal: run as a worker process that sleeps until killed.
    #[arg(long, hide = true)]
    worker: Option<String>,
    /// Everything else (SGLang flags we accept and ignore).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    rest: Vec<String>,
}

static SIGNAL: AtomicI32 = AtomicI32::new(0);
/// Where the next `/stop_profile` writes its trace.
static PROFILE_DIR: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);
/// `--cut-stream-after` (0: never).
static CUT_STREAM_AFTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static READY: AtomicBool = AtomicBool::new(false);
static HTTP_UP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
}

/// Both output streams, plus the optional record of everything, under one lock (order kept).
struct Out {
    record: Option<File>,
}

fn out() -> &'static Mutex<Out> {
    static O: OnceLock<Mutex<Out>> = OnceLock::new();
    O.get_or_init(|| Mutex::new(Out { record: None }))
}

fn emit(to_stdout: bool, bytes: &[u8]) {
    let mut o = out().lock().unwrap_or_else(|p| p.into_inner());
    let fd = if to_stdout { 1 } else { 2 };
    let mut off = 0;
    while off < bytes.len() {
        // SAFETY: writing our own buffer to our own fd.
        let n = unsafe { libc::write(fd, bytes[off..].as_ptr().cast(), bytes.len() - off) };
        if n <= 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        off += n as usize;
    }
    if let Some(r) = &mut o.record {
        let _ = r.write_all(&bytes[..off]);
    }
}

/// SGLang's log timestamp: `2026-12-02 08:44:01` (UTC), with `.mmm` under SGLANG_LOG_MS.
fn now_ts(ms: bool) -> String {
    let now = SystemTime::now();
    let t = if ms {
        humantime::format_rfc3339_millis(now).to_string()
    } else {
        humantime::format_rfc3339_seconds(now).to_string()
    };
    t.trim_end_matches('Z').replacen('T', " ", 1)
}

fn log_line(args: &Args, rank: Option<&str>, msg: &str) {
    let prefix = match rank {
        Some(r) => format!("[{} {r}] ", now_ts(args.log_ms)),
        None => format!("[{}] ", now_ts(args.log_ms)),
    };
    emit(false, format!("{prefix}{msg}\n").as_bytes());
}

/// Recorded line → (timestamp seconds, rank-less message) when it has the standard prefix.
fn split_recorded(line: &str) -> Option<(i64, &str)> {
    let b = line.as_bytes();
    if b.len() < 21 || b[0] != b'[' || b[20] != b']' {
        return None;
    }
    let t = &line[12..20];
    let secs = t[0..2].parse::<i64>().ok()? * 3600
        + t[3..5].parse::<i64>().ok()? * 60
        + t[6..8].parse::<i64>().ok()?;
    Some((secs, line.get(22..).unwrap_or("")))
}

const SCHEDULER_LINES: &[&str] = &[
    "Init torch distributed",
    "Load weight",
    "KV Cache is allocated",
    "Memory pool end",
    "Capture ",
    "max_total_num_tokens=",
    "Decode batch",
    "Prefill batch",
    "Tree cache initialized",
    "Disable prefill CUDA graph",
];

fn phase_of(msg: &str) -> Option<&'static str> {
    [
        ("Init torch distributed begin", "init"),
        ("Load weight begin", "load_weights"),
        ("KV Cache is allocated", "kv_cache"),
        ("CUDA graph begin", "cuda_graph"),
        ("Uvicorn running on", "http_up"),
    ]
    .iter()
    .find(|(frag, _)| msg.contains(frag))
    .map(|(_, p)| *p)
}

fn sleep_interruptible(d: Duration) {
    let end = Instant::now() + d;
    while Instant::now() < end {
        if SIGNAL.load(Ordering::SeqCst) != 0 {
            return;
        }
        std::thread::sleep(
            Duration::from_millis(5).min(end.saturating_duration_since(Instant::now())),
        );
    }
}

fn main() {
    let args = Args::parse();
    CUT_STREAM_AFTER.store(args.cut_stream_after.unwrap_or(0), Ordering::Relaxed);
    MERGE_EVERY.store(args.merge_every, Ordering::Relaxed);
    STEP_US.store(args.step_us, Ordering::Relaxed);
    TOKEN_GAP_US.store(args.token_gap_us, Ordering::Relaxed);
    REASONING_TOKENS.store(args.reasoning_tokens, Ordering::Relaxed);
    if let Some(role) = &args.worker {
        worker_main(role);
    }
    let Err(e) = run(args);
    eprintln!("sglang-replay: {e:#}");
    std::process::exit(1);
}

/// A worker (scheduler / detokenizer / grandchild): named like SGLang's, sleeps until killed.
fn worker_main(role: &str) -> ! {
    let (name, ignore_term, new_session) = match role {
        "scheduler" => ("sglang::schedul", false, false),
        "detokenizer" => ("sglang::detoken", false, false),
        "stubborn" => ("stubborn", true, false),
        "stubborn-setsid" => ("stubborn-setsid", true, true),
        _ => ("worker", false, false),
    };
    // SAFETY: plain libc calls on our own process.
    unsafe {
        if new_session {
            libc::setsid();
        }
        if ignore_term {
            libc::signal(libc::SIGTERM, libc::SIG_IGN);
            libc::signal(libc::SIGINT, libc::SIG_IGN);
        }
        if let Ok(c) = std::ffi::CString::new(name) {
            libc::prctl(libc::PR_SET_NAME, c.as_ptr(), 0, 0, 0);
        }
    }
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

fn spawn_worker(role: &str) -> Result<u32> {
    let exe = std::env::current_exe()?;
    let child = Command::new(exe)
        .arg("--worker")
        .arg(role)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("spawning worker {role}"))?;
    Ok(child.id())
}

fn run(args: Args) -> Result<std::convert::Infallible> {
    if let Some(p) = &args.record {
        out().lock().unwrap_or_else(|p| p.into_inner()).record =
            Some(File::create(p).context("--record")?);
    }
    // SAFETY: installing a handler that only stores to an atomic.
    unsafe {
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        for sig in [libc::SIGTERM, libc::SIGINT] {
            libc::signal(
                sig,
                if args.ignore_sigterm {
                    libc::SIG_IGN
                } else {
                    handler
                },
            );
        }
    }
    // Version-specific behaviour of a flag removed in 0.5.20 (reference section 4, 5b): 0.5.19
    // accepts it with a yellow deprecation warning printed without timestamp (logging's
    // lastResort); 0.5.20's argparse prefix matching finds two candidates and exits 2.
    let uses_removed = args
        .rest
        .iter()
        .any(|a| a == "--cuda-graph-max-bs" || a.starts_with("--cuda-graph-max-bs="));
    if uses_removed && version_at_least(&args.version, 0, 5, 20) {
        emit(
            false,
            b"usage: sglang serve [-h] --model-path MODEL_PATH [--tokenizer-path TOKENIZER_PATH]\n",
        );
        let written = args
            .rest
            .iter()
            .find(|a| a.starts_with("--cuda-graph-max-bs"))
            .map_or("--cuda-graph-max-bs", String::as_str);
        emit(false, format!("sglang serve: error: ambiguous option: {written} could match --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill\n").as_bytes());
        std::process::exit(2);
    }
    if uses_removed {
        emit(false, b"\x1b[1;33m'--cuda-graph-max-bs' is deprecated and will be removed in a future release. Use '--cuda-graph-max-bs-decode' instead.\x1b[0m\n");
    }
    if let Some(msg) = &args.argparse_error {
        emit(false, b"usage: sglang serve [-h] --model-path MODEL_PATH [--tokenizer-path TOKENIZER_PATH]\n                    [--host HOST] [--port PORT] [--tp-size TP_SIZE]\n");
        emit(false, format!("sglang serve: error: {msg}\n").as_bytes());
        std::process::exit(2);
    }
    let log = match &args.log {
        Some(p) => std::fs::read(p).with_context(|| format!("reading --log {}", p.display()))?,
        None => DEFAULT_LOG.to_vec(),
    };
    let fixture = |name: &str, default: &str| -> String {
        args.fixture_dir
            .as_ref()
            .and_then(|d| std::fs::read_to_string(d.join(name)).ok())
            .unwrap_or_else(|| default.to_string())
    };
    let http = Arc::new(HttpFixtures {
        server_info: fixture("server_info.json", DEFAULT_SERVER_INFO),
        model_info: fixture("model_info.json", DEFAULT_MODEL_INFO),
        metrics: fixture("metrics.txt", DEFAULT_METRICS),
        has_ready: version_at_least(&args.version, 0, 5, 20),
        access_stdout: args.access_log_stdout,
        forwarded_allow_ips: std::env::var("FORWARDED_ALLOW_IPS")
            .unwrap_or_else(|_| "127.0.0.1".into()),
        log_ms: args.log_ms,
        api_key: args.api_key.clone(),
        reject_before_body: args.reject_before_body,
        dummy_health: args.node_rank >= 1,
    });

    let mut workers = vec![spawn_worker("scheduler")?, spawn_worker("detokenizer")?];
    if args.grandchildren {
        workers.push(spawn_worker("stubborn")?);
        workers.push(spawn_worker("stubborn-setsid")?);
    }
    let worker_node = args.node_rank >= 1;
    let ranks: Vec<Option<String>> = match &args.ranks {
        Some(r) => r.split(',').map(|s| Some(s.trim().to_string())).collect(),
        // One TP rank per node: node N's scheduler is TP N.
        None if worker_node => vec![Some(format!("TP{}", args.node_rank))],
        None => vec![None],
    };

    let mut prev_ts: Option<i64> = None;
    let mut ready_printed = false;
    for raw in log.split_inclusive(|&b| b == b'\n') {
        check_signal(&args, &workers);
        let text = String::from_utf8_lossy(raw);
        let line = text.trim_end_matches('\n');
        let Some((ts, msg)) = split_recorded(line) else {
            emit(false, raw);
            continue;
        };
        if let Some(p) = prev_ts {
            let gap = ((ts - p).max(0) as f64 / args.speed).min(args.max_gap);
            sleep_interruptible(Duration::from_secs_f64(gap));
            check_signal(&args, &workers);
        }
        prev_ts = Some(ts);
        // Recorded access lines of the original run's /health polling are replaced by our own.
        if msg.starts_with("INFO:     127.0.0.1:") {
            continue;
        }
        if worker_node {
            // Schedulers ready (their lines are done): the dummy health server, silently.
            if msg.contains("Uvicorn running on") || msg.contains("fired up and ready") {
                READY.store(true, Ordering::SeqCst);
                start_http(&args, http.clone())?;
                continue;
            }
            let scheduler = SCHEDULER_LINES.iter().any(|f| msg.starts_with(f))
                && !msg.starts_with("Decode batch")
                && !msg.starts_with("Prefill batch")
                && !msg.starts_with("max_total_num_tokens=");
            if !scheduler && !msg.starts_with("server_args=") {
                continue;
            }
        }
        if msg.contains("The server is fired up and ready to roll!") {
            if ready_printed {
                continue;
            }
            ready_printed = true;
            announce_ready(&args);
            after_ready(&args, &workers);
            continue;
        }
        // With several ranks, the resolved args say so (tp_size = number of TP ranks, on all
        // nodes).
        let tp = ranks
            .iter()
            .filter(|r| r.as_deref().is_some_and(|r| r.contains("TP")))
            .count()
            .max(1)
            * args.nnodes.max(1) as usize;
        if msg.starts_with("server_args=") && version_at_least(&args.version, 0, 5, 19) {
            // 0.5.19+ logs `resolved_dict()`: the dict repr of what /server_info serves.
            let mut resolved = http.server_info_args();
            resolved["tp_size"] = tp.into();
            log_line(
                &args,
                None,
                &format!("server_args={}", python_repr(&resolved)),
            );
            continue;
        }
        if msg.starts_with("server_args=") && tp > 1 {
            log_line(
                &args,
                None,
                &msg.replacen("tp_size=1,", &format!("tp_size={tp},"), 1)
                    .replacen(
                        "nnodes=1, node_rank=0",
                        &format!("nnodes={}, node_rank={}", args.nnodes, args.node_rank),
                        1,
                    ),
            );
            continue;
        }
        // uvicorn names where it listens: here, not where the recorded run did
        let listening;
        let msg = match msg.find("Uvicorn running on ") {
            Some(i) => {
                start_http(&args, http.clone())?;
                let host = match args.host.contains(':') {
                    true => format!("[{}]", args.host),
                    false => args.host.clone(),
                };
                listening = format!(
                    "{}Uvicorn running on http://{host}:{} (Press CTRL+C to quit)",
                    &msg[..i],
                    args.port
                );
                listening.as_str()
            }
            None => msg,
        };
        if msg.starts_with("SIGTERM received")
            || msg.starts_with("Gracefully exiting")
            || msg.starts_with("kill_process_tree")
        {
            // The recorded stop belongs to the recorded run; ours happens when we are signalled.
            continue;
        }
        let phase = phase_of(msg);
        if SCHEDULER_LINES.iter().any(|f| msg.starts_with(f)) {
            for r in &ranks {
                log_line(&args, r.as_deref(), msg);
            }
        } else {
            log_line(&args, None, msg);
        }
        if let Some(p) = phase {
            if args.crash_in.as_deref() == Some(p) {
                crash(&args, &workers);
            }
            if args.hang_in.as_deref() == Some(p) {
                loop {
                    check_signal(&args, &workers);
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }
    // End of the recording: stay up (ready or, e.g. after the uvicorn worker-kill loop, not)
    // until signalled, like a server.
    {
        loop {
            check_signal(&args, &workers);
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn version_at_least(v: &str, a: u32, b: u32, c: u32) -> bool {
    let p: Vec<u32> = v.split('.').filter_map(|x| x.parse().ok()).collect();
    (
        p.first().copied().unwrap_or(0),
        p.get(1).copied().unwrap_or(0),
        p.get(2).copied().unwrap_or(0),
    ) >= (a, b, c)
}

fn announce_ready(args: &Args) {
    READY.store(true, Ordering::SeqCst);
    if args.healthy_before_ready_line > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(args.healthy_before_ready_line));
    }
    if let Some(p) = &args.ready_stamp {
        let ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let _ = std::fs::write(p, ns.to_string());
    }
    let prefix = if args.ready_lines > 1 {
        "INFO:     "
    } else {
        ""
    };
    for _ in 0..args.ready_lines.max(1) {
        log_line(
            args,
            None,
            &format!("{prefix}The server is fired up and ready to roll!"),
        );
    }
}

fn after_ready(args: &Args, workers: &[u32]) {
    if args.invalid_utf8 {
        emit(
            false,
            b"[2026-12-02 09:23:13] bytes \xff\xfe\xc3 not UTF-8\n",
        );
        emit(false, b"\x1b[1;33mcoloured \x1b[0mwarning\n");
    }
    if args.huge_line > 0 {
        let block = vec![b'x'; 1 << 20];
        let mut left = args.huge_line;
        while left > 0 {
            let n = left.min(block.len() as u64) as usize;
            emit(false, &block[..n]);
            left -= n as u64;
        }
        emit(false, b"\n");
    }
    if args.flood_bytes > 0 {
        let line = b"[2026-12-02 09:22:00] Decode batch, #running-req: 8, #token: 4436, token usage: 0.00, cuda graph: False, gen throughput (token/s): 2275.55, #queue-req: 0\n";
        let block: Vec<u8> = line
            .iter()
            .copied()
            .cycle()
            .take(line.len() * 512)
            .collect();
        let mut left = args.flood_bytes;
        while left > 0 {
            let n = left.min(block.len() as u64) as usize;
            emit(false, &block[..n]);
            left -= n as u64;
        }
    }
    if let Some(spec) = &args.exit_after_ready {
        let (code, secs) = spec.split_once(':').unwrap_or((spec, "0"));
        sleep_interruptible(Duration::from_secs_f64(secs.parse().unwrap_or(0.0)));
        check_signal(args, workers);
        for &w in workers {
            // SAFETY: kill our own children.
            unsafe { libc::kill(w as i32, libc::SIGKILL) };
        }
        // Exit holding the output lock: a line another thread has written to the terminal but not
        // yet to the record would make the record shorter than the log (seen once under load).
        let _quiet = out().lock().unwrap_or_else(|p| p.into_inner());
        std::process::exit(code.parse().unwrap_or(0));
    }
}

/// React to SIGTERM / SIGINT the way SGLang 0.5.14 does.
fn check_signal(args: &Args, workers: &[u32]) {
    match SIGNAL.swap(0, Ordering::SeqCst) {
        libc::SIGTERM => {
            log_line(
                args,
                None,
                "SIGTERM received. signum=None frame=None. Draining requests and shutting down...",
            );
            std::thread::sleep(Duration::from_secs_f64((2.0 / args.speed).min(2.0)));
            log_line(args, None, "Gracefully exiting... Remaining number of requests 0. Remaining requests remaining_rids=[].");
            let me = std::process::id();
            log_line(
                args,
                None,
                &format!(
                    "kill_process_tree called: parent_pid={me}, include_parent=True, pid={me}"
                ),
            );
            for &w in workers {
                // SAFETY: kill our own children, then ourselves, as SGLang's kill_process_tree does.
                unsafe { libc::kill(w as i32, libc::SIGKILL) };
            }
            // SAFETY: as above.
            unsafe { libc::kill(me as i32, libc::SIGKILL) };
        }
        libc::SIGINT => {
            log_line(args, None, "Shutting down");
            for &w in workers {
                // SAFETY: kill our own children.
                unsafe { libc::kill(w as i32, libc::SIGKILL) };
            }
            std::process::exit(0);
        }
        _ => {}
    }
}

fn crash(args: &Args, _workers: &[u32]) -> ! {
    let rank = args.crash_rank.as_deref();
    log_line(
        args,
        rank,
        &format!("Scheduler hit an exception: {}", CRASH_TRACEBACK.trim_end()),
    );
    emit(false, b"\n");
    log_line(
        args,
        None,
        "Received sigquit from a child process. It usually means the child failed.",
    );
    let me = std::process::id();
    log_line(
        args,
        None,
        &format!("kill_process_tree called: parent_pid={me}, include_parent=True, pid={me}"),
    );
    // SGLang kills its tree with SIGKILL, itself included; the workers are the supervisor's
    // problem from here (as with a real SGLang whose children it did not reach).
    // SAFETY: kill ourselves.
    unsafe { libc::kill(me as i32, libc::SIGKILL) };
    std::process::exit(137);
}

/// Python's repr of a JSON value (dict repr of `resolved_dict()` as 0.5.19+ logs it).
fn python_repr(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => {
            let mut out = String::from("'");
            for c in s.chars() {
                match c {
                    '\\' => out.push_str("\\\\"),
                    '\'' => out.push_str("\\'"),
                    '\n' => out.push_str("\\n"),
                    '\t' => out.push_str("\\t"),
                    c if (c as u32) < 0x20 => out.push_str(&format!("\\x{:02x}", c as u32)),
                    c => out.push(c),
                }
            }
            out.push('\'');
            out
        }
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(python_repr).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(m) => format!(
            "{{{}}}",
            m.iter()
                .map(|(k, v)| format!(
                    "{}: {}",
                    python_repr(&Value::String(k.clone())),
                    python_repr(v)
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

struct HttpFixtures {
    server_info: String,
    model_info: String,
    metrics: String,
    has_ready: bool,
    access_stdout: bool,
    /// uvicorn's FORWARDED_ALLOW_IPS: the peers whose forwarded client it logs.
    forwarded_allow_ips: String,
    log_ms: bool,
    api_key: Option<String>,
    reject_before_body: bool,
    /// A worker node's dummy health server (`--node-rank` >= 1).
    dummy_health: bool,
}

impl HttpFixtures {
    /// The resolved args: /server_info without the keys it adds to them.
    fn server_info_args(&self) -> serde_json::Value {
        let mut v: serde_json::Value = serde_json::from_str(&self.server_info).unwrap_or_default();
        if let Some(m) = v.as_object_mut() {
            for k in [
                "launch_command",
                "max_total_num_tokens",
                "max_req_input_len",
                "startup_time",
                "internal_states",
                "version",
                "status",
            ] {
                m.remove(k);
            }
        }
        v
    }
}

fn start_http(args: &Args, fx: Arc<HttpFixtures>) -> Result<()> {
    if HTTP_UP.swap(true, Ordering::SeqCst) {
        return Ok(());
    }
    let listener = TcpListener::bind((args.host.as_str(), args.port))
        .with_context(|| format!("binding {}:{}", args.host, args.port))?;
    // std listens with a backlog of 128: a proxy that connects 256 streams at once would see
    // SYNs dropped (a 1 s retry) where SGLang's uvicorn (backlog 2048) takes them all. A second
    // listen() sets the backlog (the kernel caps it at somaxconn).
    // SAFETY: listen(2) on a socket we own; no memory is passed.
    unsafe { libc::listen(std::os::fd::AsRawFd::as_raw_fd(&listener), 2048) };
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let fx = fx.clone();
            std::thread::spawn(move || {
                let _ = serve(conn, &fx);
            });
        }
    });
    Ok(())
}

fn serve(conn: TcpStream, fx: &HttpFixtures) -> Result<()> {
    conn.set_nodelay(true)?;
    // The client as uvicorn writes it (`"%s:%d" % client`): `::1:5000` for IPv6, no brackets.
    let peer = conn
        .peer_addr()
        .map(|a| format!("{}:{}", a.ip(), a.port()))
        .unwrap_or_default();
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut w = conn;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line)? == 0 {
            return Ok(());
        }
        let mut parts = request_line.split_whitespace();
        let (method, path) = (
            parts.next().unwrap_or("").to_string(),
            parts.next().unwrap_or("/").to_string(),
        );
        let mut len = 0usize;
        let mut close = false;
        let mut bearer = None;
        let mut forwarded_for = None;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h)? == 0 {
                return Ok(());
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let lower = h.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                len = v.trim().parse().unwrap_or(0);
            }
            if lower == "connection: close" {
                close = true;
            }
            if lower.starts_with("authorization: bearer ") {
                bearer = Some(h["authorization: bearer ".len()..].to_string());
            }
            if let Some(v) = lower.strip_prefix("x-forwarded-for:") {
                forwarded_for = v.rsplit(',').next().map(|c| c.trim().to_string());
            }
        }
        // uvicorn's proxy headers, on by default and trusting FORWARDED_ALLOW_IPS (127.0.0.1
        // unless set; `*` trusts every peer): the forwarded client stands for the peer, with
        // the port it names (`IP:PORT`) or 0.
        let peer_ip = peer.rsplit_once(':').map_or(peer.as_str(), |(ip, _)| ip);
        let trusts = fx
            .forwarded_allow_ips
            .split(',')
            .any(|t| t.trim() == "*" || t.trim() == peer_ip);
        let client = match forwarded_for.filter(|_| trusts) {
            Some(c) if c.matches(':').count() == 1 => c,
            Some(c) => format!("{c}:0"),
            None => peer.clone(),
        };
        let open = path.starts_with("/health") || path.starts_with("/metrics");
        let mut body = vec![0u8; len.min(64 << 20)];
        let early = fx.reject_before_body
            && !open
            && fx
                .api_key
                .as_ref()
                .is_some_and(|k| bearer.as_deref() != Some(k.as_str()));
        if early {
            respond(
                &mut w,
                401,
                "application/json",
                r#"{"error":"Unauthorized"}"#,
            )?;
        }
        reader.read_exact(&mut body)?;
        if early {
            continue;
        }
        if fx.dummy_health {
            // uvicorn at log level warning: no access line.
            let code = match path.split('?').next().unwrap_or("") {
                "/health" | "/health_generate" | "/ping" if method == "GET" => 200,
                _ => 404,
            };
            respond(&mut w, code, "text/plain", "")?;
            if close {
                return Ok(());
            }
            continue;
        }
        let status = match &fx.api_key {
            Some(k) if !open && bearer.as_deref() != Some(k.as_str()) => respond(
                &mut w,
                401,
                "application/json",
                r#"{"error":"Unauthorized"}"#,
            )?,
            _ => route(&method, &path, &body, fx, &mut w)?,
        };
        let access = format!(
            "[{}] INFO:     {client} - \"{method} {path} HTTP/1.1\" {status}\n",
            now_ts(fx.log_ms),
            status = status_text(status)
        );
        emit(fx.access_stdout, access.as_bytes());
        if close {
            return Ok(());
        }
    }
}

fn status_text(code: u16) -> String {
    let reason = match code {
        200 => "OK",
        401 => "Unauthorized",
        404 => "Not Found",
        503 => "Service Unavailable",
        _ => "",
    };
    format!("{code} {reason}").trim_end().to_string()
}

fn respond(w: &mut TcpStream, code: u16, ctype: &str, body: &str) -> Result<u16> {
    let head = format!(
        "HTTP/1.1 {}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\n\r\n",
        status_text(code),
        body.len()
    );
    w.write_all(head.as_bytes())?;
    w.write_all(body.as_bytes())?;
    Ok(code)
}

fn route(
    method: &str,
    path: &str,
    body: &[u8],
    fx: &HttpFixtures,
    w: &mut TcpStream,
) -> Result<u16> {
    let ready = READY.load(Ordering::SeqCst);
    let path = path.split('?').next().unwrap_or(path);
    match (method, path) {
        ("GET", "/health" | "/health_generate") => {
            respond(w, if ready { 200 } else { 503 }, "text/plain", "")
        }
        ("GET", "/ready") if fx.has_ready => {
            respond(w, if ready { 200 } else { 503 }, "application/json", "{}")
        }
        ("GET", "/model_info" | "/get_model_info") => {
            respond(w, 200, "application/json", &fx.model_info)
        }
        ("GET", "/server_info" | "/get_server_info") => {
            respond(w, 200, "application/json", &fx.server_info)
        }
        ("GET", "/metrics") => respond(
            w,
            200,
            "text/plain; version=0.0.4; charset=utf-8",
            &fx.metrics,
        ),
        ("GET", "/v1/models") => respond(
            w,
            200,
            "application/json",
            r#"{"object":"list","data":[{"id":"/models/tiny-llama","object":"model","owned_by":"sglang","max_model_len":4096}]}"#,
        ),
        ("POST", "/generate" | "/v1/completions" | "/v1/chat/completions") if ready => {
            generate(path, body, w)
        }
        // SGLang's torch profiler as seen on the H200: the start is accepted, the stop answers
        // 500, and a trace is written anyway (one per rank, here TP-0).
        ("POST", "/start_profile") => {
            let dir = serde_json::from_slice::<serde_json::Value>(body)
                .ok()
                .and_then(|v| v["output_dir"].as_str().map(str::to_string))
                .or_else(|| std::env::var("SGLANG_TORCH_PROFILER_DIR").ok())
                .unwrap_or_else(|| "/tmp".into());
            *PROFILE_DIR.lock().unwrap_or_else(|p| p.into_inner()) = Some(dir);
            respond(w, 200, "text/plain", "Start profiling.\n")
        }
        ("POST", "/stop_profile") => {
            if let Some(dir) = PROFILE_DIR.lock().unwrap_or_else(|p| p.into_inner()).take() {
                let name = format!(
                    "{}-TP-0.trace.json.gz",
                    now_ts(false).replace([' ', ':'], "-")
                );
                std::fs::write(std::path::Path::new(&dir).join(name), vec![0x1f; 4096])?;
            }
            respond(
                w,
                500,
                "application/json",
                r#"{"detail":"Internal Server Error"}"#,
            )
        }
        ("POST", _) => respond(
            w,
            503,
            "application/json",
            r#"{"error":"server not ready"}"#,
        ),
        _ => respond(w, 404, "application/json", r#"{"detail":"Not Found"}"#),
    }
}

/// Answers with SGLang 0.5.14's shapes, byte for byte as recorded (fixtures/http): `/generate`
/// streams cumulative text, `output_ids` and `meta_info`; OpenAI streams carry `usage` only when
/// asked (a last event with `"choices":[]`, or in every event with `continuous_usage_stats`); a
/// chat stream opens with a role delta. Like a real server, some events carry several tokens
/// (`--merge-every`), and with `--reasoning-tokens N` a chat answer's first N tokens are
/// `reasoning_content`. Ids and timestamps derive from the prompt, so the same request gives
/// the same bytes.
fn generate(path: &str, body: &[u8], w: &mut TcpStream) -> Result<u16> {
    let req: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let native = path == "/generate";
    let chat = path == "/v1/chat/completions";
    let stream = req["stream"].as_bool().unwrap_or(false);
    let n = if native {
        req["sampling_params"]["max_new_tokens"].as_u64()
    } else {
        req["max_tokens"].as_u64()
    }
    .unwrap_or(8)
    // A whole answer may run to megabytes, as one with logprobs does (a measuring hop must count
    // it without holding it); a stream stays short.
    .clamp(1, if stream { 4096 } else { 1 << 21 });
    let prompt_text = if chat {
        req["messages"][0]["content"].as_str().unwrap_or("")
    } else {
        req["text"]
            .as_str()
            .or(req["prompt"].as_str())
            .unwrap_or("")
    };
    let prompt = prompt_text.split_whitespace().count().max(1) as u64;
    let g = Gen {
        id: format!("{:032x}", fnv(format!("{path}{prompt_text}{n}").as_bytes())),
        created: 1_796_228_819,
        chat,
        prompt,
        n,
        reasoning: if chat {
            REASONING_TOKENS.load(Ordering::Relaxed).min(n)
        } else {
            0
        },
    };
    let usage = req["stream_options"]["include_usage"].as_bool() == Some(true);
    let continuous = req["stream_options"]["continuous_usage_stats"].as_bool() == Some(true);
    let token_gap = Duration::from_micros(TOKEN_GAP_US.load(Ordering::Relaxed));
    if !stream {
        std::thread::sleep(token_gap * n as u32);
        let body = if native {
            g.native(n)
        } else {
            g.openai_whole()
        };
        return respond(w, 200, "application/json", &body);
    }
    w.write_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n",
    )?;
    let mut send = |data: &str| -> Result<()> {
        let frame = format!("data: {data}\n\n");
        w.write_all(format!("{:x}\r\n{frame}\r\n", frame.len()).as_bytes())?;
        w.flush()?;
        Ok(())
    };
    if chat {
        send(&g.chat_role())?;
    }
    let merge = MERGE_EVERY.load(Ordering::Relaxed);
    let (mut done, mut chunk) = (0u64, 0u64);
    while done < n {
        chunk += 1;
        let take = if merge > 0 && chunk % merge == 0 {
            2
        } else {
            1
        }
        .min(n - done);
        pace(token_gap, take);
        let from = done;
        done += take;
        let event = if native {
            g.native(done)
        } else {
            g.openai_chunk(from, done, continuous)
        };
        send(&event)?;
        let cut = CUT_STREAM_AFTER.load(Ordering::Relaxed);
        if cut > 0 && (from..done).contains(&(cut - 1)) {
            w.shutdown(std::net::Shutdown::Both)?;
            anyhow::bail!("stream cut after {cut} tokens (--cut-stream-after)");
        }
    }
    if chat {
        send(&g.chat_finish())?;
    }
    if usage && !native {
        send(&g.usage_only())?;
    }
    send("[DONE]")?;
    w.write_all(b"0\r\n\r\n")?;
    Ok(200)
}

/// `--token-gap-us`, `--merge-every` (0: one token per event) and `--reasoning-tokens`.
static TOKEN_GAP_US: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(2000);
static MERGE_EVERY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static STEP_US: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Wait before a streamed event carrying `tokens` tokens: `gap` per token, or with `--step-us`
/// until the `tokens`-th step boundary from now, the same instants for every stream.
fn pace(gap: Duration, tokens: u64) {
    let step = STEP_US.load(Ordering::Relaxed);
    if step == 0 {
        return std::thread::sleep(gap * tokens as u32);
    }
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    let now = epoch.elapsed().as_micros() as u64;
    let due = (now / step + tokens) * step;
    std::thread::sleep(Duration::from_micros(due - now));
}
static REASONING_TOKENS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn fnv(b: &[u8]) -> u128 {
    b.iter()
        .fold(0x6c62272e07bb014262b821756295c58du128, |h, &c| {
            (h ^ c as u128).wrapping_mul(0x0000000001000000000000000000013b)
        })
}

/// One answer's parts in SGLang's JSON layout (fields in its order).
struct Gen {
    id: String,
    created: u64,
    chat: bool,
    prompt: u64,
    n: u64,
    reasoning: u64,
}

fn token(i: u64) -> String {
    const SYL: [&str; 8] = [
        " tok",
        "ou",
        " zai",
        "bi",
        " Grap",
        "\\\"q\\\"",
        " 29",
        "na",
    ];
    SYL[(i % 8) as usize].to_string()
}

fn tokens(from: u64, to: u64) -> String {
    (from..to).map(token).collect()
}

impl Gen {
    fn native(&self, upto: u64) -> String {
        let ids: Vec<String> = (0..upto).map(|i| (100 + i).to_string()).collect();
        let finish = if upto == self.n {
            format!(r#"{{"type":"length","length":{}}}"#, self.n)
        } else {
            "null".into()
        };
        let tail = if upto == self.n {
            r#","e2e_latency":0.134"#
        } else {
            ""
        };
        format!(
            r#"{{"text":"{}","output_ids":[{}],"meta_info":{{"id":"{}","finish_reason":{finish},"prompt_tokens":{},"weight_version":"default","num_retractions":0,"reasoning_tokens":0,"completion_tokens":{upto},"cached_tokens":0,"cached_tokens_details":{{"device":0,"host":0}},"dp_rank":null{tail}}}}}"#,
            tokens(0, upto),
            ids.join(","),
            self.id,
            self.prompt
        )
    }

    fn head(&self) -> String {
        let object = if self.chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        format!(
            r#"{{"id":"{}","object":"{object}","created":{},"model":"model","choices":"#,
            self.id, self.created
        )
    }

    fn usage(&self, completion: u64, details: bool) -> String {
        let d = if details {
            r#","prompt_tokens_details":null"#
        } else {
            ""
        };
        format!(
            r#"{{"prompt_tokens":{},"total_tokens":{},"completion_tokens":{completion}{d},"reasoning_tokens":{}}}"#,
            self.prompt,
            self.prompt + completion,
            completion.min(self.reasoning)
        )
    }

    fn chat_role(&self) -> String {
        format!(
            r#"{}[{{"index":0,"delta":{{"reasoning_content":null,"role":"assistant","content":""}},"logprobs":null,"finish_reason":null,"matched_stop":null}}]}}"#,
            self.head()
        )
    }

    fn openai_chunk(&self, from: u64, to: u64, continuous: bool) -> String {
        let last = to == self.n;
        let finish = if last && !self.chat {
            r#""length""#
        } else {
            "null"
        };
        let choice = if self.chat {
            let delta = if to <= self.reasoning {
                format!(
                    r#"{{"reasoning_content":"{}","content":null}}"#,
                    tokens(from, to)
                )
            } else {
                let from = from.max(self.reasoning);
                format!(
                    r#"{{"reasoning_content":null,"content":"{}"}}"#,
                    tokens(from, to)
                )
            };
            format!(
                r#"{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":{finish},"matched_stop":null}}"#
            )
        } else {
            format!(
                r#"{{"index":0,"text":"{}","logprobs":null,"finish_reason":{finish},"matched_stop":null}}"#,
                tokens(from, to)
            )
        };
        let usage = if continuous {
            self.usage(to, true)
        } else {
            "null".into()
        };
        if self.chat && !continuous {
            format!("{}[{choice}]}}", self.head())
        } else {
            format!(r#"{}[{choice}],"usage":{usage}}}"#, self.head())
        }
    }

    fn chat_finish(&self) -> String {
        format!(
            r#"{}[{{"index":0,"delta":{{"reasoning_content":null}},"logprobs":null,"finish_reason":"length","matched_stop":null}}]}}"#,
            self.head()
        )
    }

    fn usage_only(&self) -> String {
        format!(
            r#"{}[],"usage":{}}}"#,
            self.head(),
            self.usage(self.n, false)
        )
    }

    fn openai_whole(&self) -> String {
        let text = tokens(self.reasoning, self.n);
        let usage = self.usage(self.n, true);
        if self.chat {
            let reasoning = if self.reasoning > 0 {
                format!(r#""{}""#, tokens(0, self.reasoning))
            } else {
                "null".into()
            };
            format!(
                r#"{{"id":"{}","object":"chat.completion","created":{},"model":"model","choices":[{{"index":0,"message":{{"role":"assistant","content":"{text}","reasoning_content":{reasoning},"tool_calls":null}},"logprobs":null,"finish_reason":"length","matched_stop":null}}],"usage":{usage},"metadata":{{"weight_version":"default"}}}}"#,
                self.id, self.created
            )
        } else {
            format!(
                r#"{{"id":"{}","object":"text_completion","created":{},"model":"model","choices":[{{"index":0,"text":"{text}","logprobs":null,"finish_reason":"length","matched_stop":null}}],"usage":{usage},"metadata":{{"weight_version":"default"}}}}"#,
                self.id, self.created
            )
        }
    }
}
