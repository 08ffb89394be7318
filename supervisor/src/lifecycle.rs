//! `run`: spawn, watch, decide readiness, fail fast, forward signals, tear down, exit status.
//!
//! Everything happens on one task driven by `tokio::select!` over: parsed log events (from the
//! reader threads), the child's exit (from the reaper), signals, the ready deadline, the grace
//! deadline and readiness probe results. The task runs on the main thread, which is also the
//! thread that spawned the child: PR_SET_PDEATHSIG fires when the *spawning thread* exits.
use crate::child::{self, ExitStatus, SpawnSpec};
use crate::cli::{ReadyOn, RunArgs};
use crate::events::{round_ms, Events};
use crate::logs::parse::LogEvent;
use crate::logs::tee::{self, LogFile, Shared, StreamStats, Timed};
use crate::redact::{redact_argv, Secrets};
use crate::sentinel::Sentinel;
use anyhow::{Context, Result};
use serde_json::{json, Value};
use sglang_exporters::metrics as exporters;
use sglang_probes::http::{get_status, HttpUrl};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::fs::File;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tokio::time::sleep_until;

/// How long the readers may take to drain after the tree is dead.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(3);
/// How long teardown waits for killed processes to disappear before calling them leftovers.
const KILL_WAIT: Duration = Duration::from_secs(2);
/// Readiness confirmation after the ready line: retries this long before falling back to /health.
const CONFIRM_FOR: Duration = Duration::from_secs(5);
/// `/health` runs a one-token generation (~1 s on a real server): never faster, always bounded.
const HEALTH_PERIOD: Duration = Duration::from_secs(1);
const HEALTH_TIMEOUT: Duration = Duration::from_secs(3);
/// The server's own `/metrics` is fetched this often, with this timeout.
const UPSTREAM_METRICS_PERIOD: Duration = Duration::from_secs(5);
const UPSTREAM_METRICS_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the GPUs may take to list no process of the dead server (the driver frees memory
/// asynchronously).
const GPU_RELEASE_WAIT: Duration = Duration::from_secs(5);
/// After a fatal line, how long the child may take to end itself before we kill its tree.
const FATAL_SELF_EXIT: Duration = Duration::from_millis(300);
/// A second `Child process [N] died` before readiness means uvicorn's kill loop.
const WORKER_DEATHS_FATAL: u32 = 2;
/// Distinct warnings reported as events (the rest are counted).
const MAX_WARNING_EVENTS: usize = 200;

/// Why we are stopping the server, if we are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Requested(i32),
    Fatal,
    ReadyTimeout,
}

#[derive(Debug)]
enum Probe {
    Confirmed(&'static str),
    ConfirmFailed(String),
    Health(Result<u16, String>),
}

/// Per-rank startup progress ("main" for unprefixed lines), for timings and timeout diagnoses.
#[derive(Debug, Default)]
struct RankProgress {
    last: Option<(&'static str, f64)>,
    begun: HashMap<&'static str, f64>,
}

struct Supervision {
    args: RunArgs,
    events: Arc<Events>,
    pid: i32,
    url: HttpUrl,
    stop: Option<Stop>,
    /// We SIGKILLed the server while it was still alive because of a fatal line.
    killed_live: bool,
    ready: bool,
    probing: bool,
    health_polling: bool,
    http_up_at: Option<f64>,
    fatal: Option<(String, String)>,
    last_traceback: Option<String>,
    ranks: BTreeMap<String, RankProgress>,
    seen_warnings: HashSet<String>,
    seen_deprecations: HashSet<String>,
    warnings_suppressed: u64,
    worker_deaths: u32,
    probe_tx: mpsc::UnboundedSender<Probe>,
    metrics: Arc<exporters::Shared>,
    /// Our own helper processes, never part of the server's tree.
    exclude: Vec<i32>,
    grace_deadline: Option<tokio::time::Instant>,
    /// `enable_metrics` from the resolved args: whether the server has a `/metrics` to re-expose.
    upstream_metrics: Option<bool>,
    next_health: Option<tokio::time::Instant>,
    /// Where the start's time goes (process tree sampled until readiness).
    startup: Arc<crate::startup::StartupProfile>,
}

/// The server URL: `--health-url`, `--upstream`, else `--host`/`--port` from the server's argv.
pub fn server_url(args: &RunArgs) -> Result<HttpUrl> {
    let (mut host, mut port) = ("127.0.0.1".to_string(), 30000u16);
    let (mut api_key, mut admin_key) = (None, None);
    let argv: Vec<String> = args
        .command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) => (f, Some(v.to_string())),
            None => (a.as_str(), None),
        };
        if !matches!(flag, "--host" | "--port" | "--api-key" | "--admin-api-key") {
            continue;
        }
        let Some(v) = inline.or_else(|| it.next().cloned()) else {
            continue;
        };
        if flag == "--host" {
            host = v;
        } else if flag == "--api-key" {
            api_key = Some(v);
        } else if flag == "--admin-api-key" {
            admin_key = Some(v);
        } else {
            port = v.parse().with_context(|| {
                format!("the server command has --port {v:?}, which is not a port number")
            })?;
        }
    }
    let host = match host.as_str() {
        "0.0.0.0" | "" => "127.0.0.1".to_string(),
        "::" | "[::]" => "[::1]".to_string(),
        h if h.contains(':') && !h.starts_with('[') => format!("[{h}]"),
        h => h.to_string(),
    };
    // Our readiness GETs (/ready, /model_info) are guarded when the server has a key.
    let bearer = api_key.or(admin_key).map(sglang_probes::http::Bearer);
    if let Some(u) = args.health_url.as_deref().or(args.upstream.as_deref()) {
        let base = HttpUrl::parse(u).with_context(|| format!("--health-url/--upstream {u:?}"))?;
        return Ok(HttpUrl {
            bearer,
            ..base.with_path("/")
        });
    }
    Ok(HttpUrl {
        host,
        port,
        path: "/".into(),
        bearer,
        tls: false,
    })
}

fn create(path: &std::path::Path, what: &str) -> Result<File> {
    File::create(path).with_context(|| {
        format!(
            "cannot create the {what} {} (check the directory exists and is writable)",
            path.display()
        )
    })
}

/// Run the server to the end; returns the exit status of `run`.
/// Exit status when the pre-flight audit rejects the server's flags.
pub const EXIT_PREFLIGHT: i32 = 126;

/// The launch arguments inside COMMAND (after `-m sglang.launch_server` or `sglang serve`).
/// The interpreter and the arguments of an SGLang launch (`PY -m sglang.launch_server ARGS`, or
/// `sglang serve ARGS` whose script names its interpreter on the `#!` line).
fn launch_args(command: &[OsString]) -> Option<(String, Vec<String>)> {
    let argv: Vec<String> = command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let at = argv.windows(2).position(|w| {
        (w[0] == "-m" && w[1] == "sglang.launch_server")
            || (w[0].ends_with("sglang") && w[1] == "serve")
    })?;
    let python = if argv[at] == "-m" {
        argv[..at]
            .iter()
            .rev()
            .find(|a| !a.starts_with('-'))?
            .clone()
    } else {
        script_interpreter(&argv[at]).unwrap_or_else(|| "python3".into())
    };
    Some((python, argv[at + 2..].to_vec()))
}

/// The interpreter a console script runs under, from its `#!` line.
fn script_interpreter(script: &str) -> Option<String> {
    let path = if script.contains('/') {
        std::path::PathBuf::from(script)
    } else {
        std::env::split_paths(&std::env::var_os("PATH")?)
            .map(|d| d.join(script))
            .find(|p| p.is_file())?
    };
    let mut head = [0u8; 256];
    let n = std::io::Read::read(&mut std::fs::File::open(path).ok()?, &mut head).ok()?;
    let line = std::str::from_utf8(&head[..n]).ok()?.lines().next()?;
    let words: Vec<&str> = line.strip_prefix("#!")?.split_whitespace().collect();
    match words.as_slice() {
        [env, py, ..] if env.ends_with("/env") => Some(py.to_string()),
        [py, ..] => Some(py.to_string()),
        [] => None,
    }
}

/// What the pre-flight found: whether to refuse the launch (exit 126), and its `preflight` event.
pub struct Preflight {
    pub reject: bool,
    pub event: Value,
}

/// Audit the flags before anything starts.
/// By default the flags come from a static read of the SGLang package the launch's interpreter
/// would import (a fraction of a second, nothing imported); `--flags-schema` names another
/// source. Runs before the async runtime exists: it waits on a Python subprocess.
pub fn preflight(args: &RunArgs) -> Result<Option<Preflight>> {
    if args.no_preflight {
        return Ok(None);
    }
    let Some((python, launch)) = launch_args(&args.command) else {
        if args.flags_schema.is_some() {
            tracing::warn!("pre-flight: COMMAND is not `python3 -m sglang.launch_server ...` or `sglang serve ...`; skipped");
        }
        return Ok(None);
    };
    let t = Instant::now();
    let schema = match &args.flags_schema {
        // Asked for by name: a source that cannot be read is an error.
        Some(src) => crate::flags::load(src, crate::flags::Placement::Subprocess)?,
        // Our own default: when it cannot read the flags, the launch itself decides.
        None => match crate::flags::load_installed(&python) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("pre-flight skipped: {e:#}");
                return Ok(None);
            }
        },
    };
    let audit = sglang_python::audit::audit(&schema, None, &launch);
    let env: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| k.starts_with("SGLANG_") && !k.starts_with("SGLANG_SUPERVISOR_"))
        .collect();
    let status = sglang_python::audit::exit_status(&audit.verdicts, &[]);
    // What is worth saying, once: logged here and recorded in the event.
    let mut flags: Vec<_> = audit
        .verdicts
        .iter()
        .filter(|v| v.status != sglang_python::audit::Status::Ok)
        .cloned()
        .collect();
    let mut env: Vec<_> = sglang_python::audit::audit_env(&schema, None, &env)
        .into_iter()
        .filter(|e| e.status != "ok")
        .collect();
    crate::flags::redact(&mut flags, &mut env);
    let version = schema.version.as_deref().unwrap_or("?");
    for v in &flags {
        let (what, note) = (v.status.as_str(), v.note());
        if v.status.fails() {
            tracing::error!("pre-flight: {what} {} ({note})", v.flag);
        } else {
            tracing::warn!("pre-flight: {what} {} ({note})", v.flag);
        }
    }
    for e in env.iter().filter(|e| e.status != "unchecked") {
        let to = e
            .replacement
            .as_deref()
            .map(|r| format!(" (use {r})"))
            .unwrap_or_default();
        tracing::warn!(
            "pre-flight: environment variable {} is {} in SGLang {version}{to}: SGLang ignores it",
            e.name,
            e.status
        );
    }
    for u in &audit.unexpanded {
        tracing::warn!(
            "pre-flight: {u} reached the command unexpanded; its flags were not audited"
        );
    }
    tracing::info!(
        "pre-flight: {} flags checked against SGLang {version} in {:?}",
        audit.verdicts.len(),
        t.elapsed()
    );
    let event = json!({
        "sglang_version": schema.version, "method": schema.method, "checked": audit.verdicts.len(),
        "flags": flags, "env": env, "unexpanded": audit.unexpanded, "rejected": status == 2,
        "duration_s": crate::events::round_ms(t.elapsed().as_secs_f64()),
    });
    Ok(Some(Preflight {
        reject: status == 2,
        event,
    }))
}

/// COMMAND as text, and the secret values its events must never carry (from it and our env).
fn command_and_secrets(args: &RunArgs) -> (Vec<String>, Secrets) {
    let argv: Vec<String> = args
        .command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let secrets = Secrets::from_run(&argv, std::env::vars());
    (argv, secrets)
}

/// A refused launch still leaves its `preflight` event where `--events` points.
pub fn record_rejection(args: &RunArgs, event: Value) {
    if let Some(path) = &args.events {
        match File::create(path) {
            Ok(f) => Events::new(
                Some(f),
                Some(path.display().to_string()),
                Instant::now(),
                false,
            )
            .with_secrets(command_and_secrets(args).1)
            .emit("preflight", event),
            Err(e) => tracing::error!("cannot write the events file {}: {e}", path.display()),
        }
    }
}

pub async fn run(args: RunArgs, preflight: Option<Value>) -> Result<i32> {
    let log_file = args
        .log_file
        .as_deref()
        .map(|p| create(p, "log file"))
        .transpose()?;
    let events_file = args
        .events
        .as_deref()
        .map(|p| create(p, "events file"))
        .transpose()?;
    let url = server_url(&args)?;
    // Past a file-size limit (RLIMIT_FSIZE) a write fails with EFBIG instead of killing us: the
    // log file reports it and the child's pipes keep being drained.
    // SAFETY: setting a signal disposition; no handler runs.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    if let Err(e) = child::become_subreaper() {
        tracing::warn!("cannot become a child subreaper ({e}): descendants that call setsid may escape teardown");
    }
    // Signals are caught from before the spawn on, so none is lost in between.
    let (sig_tx, mut sig_rx) = mpsc::unbounded_channel::<i32>();
    for (kind, num) in [
        (SignalKind::interrupt(), libc::SIGINT),
        (SignalKind::terminate(), libc::SIGTERM),
        (SignalKind::hangup(), libc::SIGHUP),
        (SignalKind::quit(), libc::SIGQUIT),
    ] {
        let mut stream = signal(kind).context("installing signal handlers")?;
        let tx = sig_tx.clone();
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                if tx.send(num).is_err() {
                    break;
                }
            }
        });
    }

    // The metrics port is bound before the spawn: a port in use is a start-up error, not a
    // surprise an hour into the benchmark.
    let metrics = Arc::new(exporters::Shared::default());
    metrics.update(|st| st.state = "starting");
    // GPU sampling starts before the server, so the window covers its whole start.
    let sampler = crate::gpu::start_sampler(&args)?;
    metrics.set_gpus(sampler.as_ref().map(|s| s.handle()));
    let mut registry = exporters::registry(metrics.clone());
    let series = crate::server_series::register(&mut registry, &metrics);
    let startup = crate::startup::register(&mut registry);
    let proxy_metrics = sglang_exporters::proxy::ProxyMetrics::register(&mut registry);
    let metrics_addr = match args.metrics_addr.as_str() {
        "none" | "" => None,
        addr => {
            Some(sglang_exporters::server::start(addr, Arc::new(registry), metrics.clone()).await?)
        }
    };
    let proxy_addr = match &args.proxy_addr {
        None => None,
        Some(addr) => {
            let log = args
                .requests_log
                .as_deref()
                .map(|p| create(p, "requests log"))
                .transpose()?;
            let upstream = args.upstream.clone().unwrap_or_else(|| url.base());
            let stats = Arc::new(sglang_exporters::report::RequestStats::default());
            metrics.set_requests(Some(stats.clone()));
            let traffic = if args.window_from_proxy {
                sampler.as_ref().map(|s| s.handle())
            } else {
                None
            };
            Some(
                sglang_exporters::proxy::start(addr, &upstream, proxy_metrics, stats, log, traffic)
                    .await?,
            )
        }
    };
    let trace_dir = crate::profile::trace_dir(&args);
    let profiler_env: Vec<(&str, &std::ffi::OsStr)> = trace_dir
        .iter()
        .filter(|(_, tell)| *tell)
        .map(|(d, _)| (crate::profile::DIR_ENV, d.as_os_str()))
        .collect();
    let t0 = Instant::now();
    let spawned = child::spawn_with_env(
        SpawnSpec {
            argv: &args.command,
            new_process_group: true,
            die_with_parent: true,
            stdin: Stdio::null(),
            stdout: Stdio::piped(),
            stderr: Stdio::piped(),
        },
        &profiler_env,
    )?;
    let pid = spawned.pid;
    let (argv_text, secrets) = command_and_secrets(&args);
    let events = Arc::new(
        Events::new(
            events_file,
            args.events.as_ref().map(|p| p.display().to_string()),
            t0,
            args.report.is_some() || args.report_html.is_some(),
        )
        .with_secrets(secrets.clone()),
    );
    if let Some(p) = preflight {
        events.emit("preflight", p);
    }
    let trace_dir = trace_dir.map(|(d, _)| d);
    crate::profile::setup(&args, trace_dir.as_deref(), &url, &events, &metrics);
    let window_events = events.clone();
    metrics.set_window_sink(Arc::new(move |w| window_events.emit("window", w)));
    let (bench_sampler, bench_log) = (
        sampler.as_ref().map(|s| s.handle()),
        args.requests_log.clone(),
    );
    metrics.set_bench_hook(Arc::new(move |path| {
        crate::bench::live(path, bench_sampler.as_ref(), bench_log.as_deref())
    }));
    events.emit(
        "spawned",
        json!({"pid": pid, "argv": redact_argv(&argv_text), "supervisor_pid": std::process::id()}),
    );
    tracing::info!(pid, url = %url.base(), "spawned the server");
    if metrics_addr.is_some() || proxy_addr.is_some() {
        let addr = |a: Option<std::net::SocketAddr>| a.map(|a| a.to_string());
        events.emit(
            "listening",
            json!({"metrics": addr(metrics_addr), "proxy": addr(proxy_addr)}),
        );
        if let Some(a) = metrics_addr {
            tracing::info!("metrics on http://{a}/metrics");
        }
        if let Some(a) = proxy_addr {
            tracing::info!("latency-measuring proxy on http://{a} → {}", url.base());
        }
    }

    let sentinel = match Sentinel::start(pid) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!("no sentinel ({e}): if the supervisor is SIGKILLed, the server's workers may outlive it");
            None
        }
    };
    let exclude: Vec<i32> = sentinel.iter().map(|s| s.pid).collect();
    startup.start(pid, t0, exclude.clone());

    let shared = Shared::new(
        LogFile::new(
            log_file,
            args.log_file.as_ref().map(|p| p.display().to_string()),
        ),
        args.redact_log.then_some(secrets),
        series.clone(),
    );
    let (log_tx, mut log_rx) = mpsc::unbounded_channel::<Timed>();
    let tee_to = |fd| (!args.no_tee).then(|| tee::terminal(fd));
    let mut readers = Vec::new();
    for (stream, fd, term) in [
        (tee::Stream::Stdout, spawned.stdout, tee_to(1)),
        (tee::Stream::Stderr, spawned.stderr, tee_to(2)),
    ] {
        if let Some(fd) = fd {
            readers.push(
                tee::spawn_reader(stream, fd, shared.clone(), term, log_tx.clone())
                    .context("starting a log reader thread")?,
            );
        }
    }
    drop(log_tx);

    let (probe_tx, mut probe_rx) = mpsc::unbounded_channel();
    let health_polling = args.ready_on == ReadyOn::Http;
    let ready_deadline = tokio::time::Instant::from_std(t0 + args.ready_timeout);
    let mut s = Supervision {
        events,
        pid,
        url,
        stop: None,
        killed_live: false,
        ready: false,
        probing: false,
        health_polling,
        http_up_at: None,
        fatal: None,
        last_traceback: None,
        ranks: BTreeMap::new(),
        seen_warnings: HashSet::new(),
        seen_deprecations: HashSet::new(),
        warnings_suppressed: 0,
        worker_deaths: 0,
        probe_tx,
        metrics: metrics.clone(),
        exclude: exclude.clone(),
        grace_deadline: None,
        upstream_metrics: None,
        next_health: health_polling.then(tokio::time::Instant::now),
        args,
        startup,
    };

    let mut exit_rx = spawned.exit;
    let status: ExitStatus = loop {
        let far = tokio::time::Instant::now() + Duration::from_secs(86400 * 365);
        tokio::select! {
            biased;
            st = &mut exit_rx => {
                break st.unwrap_or_else(|_| {
                    tracing::error!("lost track of the child's exit status");
                    ExitStatus::Signal(libc::SIGKILL)
                });
            }
            Some(t) = log_rx.recv() => s.on_log(t).await,
            Some(sig) = sig_rx.recv() => s.on_signal(sig).await,
            Some(p) = probe_rx.recv() => s.on_probe(p).await,
            _ = sleep_until(ready_deadline), if !s.ready && s.stop.is_none() => s.on_ready_timeout(),
            _ = sleep_until(s.grace_deadline.unwrap_or(far)), if s.grace_deadline.is_some() => {
                s.grace_deadline = None;
                if s.stop == Some(Stop::Fatal) {
                    s.killed_live = !child::has_exited(pid);
                } else {
                    tracing::warn!("grace period of {:?} is over: SIGKILL to the whole process tree", s.args.grace);
                }
                child::kill_tree(pid, &exclude, Duration::ZERO).await;
            }
            _ = sleep_until(s.next_health.unwrap_or(far)), if s.next_health.is_some() && !s.ready && s.stop.is_none() => {
                s.next_health = None;
                s.poll_health();
            }
        }
    };
    let exited_at = Instant::now();

    // The main process is gone: whatever it leaves behind goes too, at once.
    let leftover = child::kill_tree(pid, &exclude, KILL_WAIT).await;
    let stats = join_readers(readers).await;
    while let Ok(t) = log_rx.try_recv() {
        s.on_log(t).await;
    }
    if !leftover.is_empty() {
        s.events.emit("leftover", json!({"pids": leftover}));
        tracing::error!(?leftover, "processes of the server tree survived SIGKILL");
    }
    s.diagnose_exit(status, &shared);
    // The whole run's request figures: the traffic window's and the requests_summary event.
    let requests = metrics
        .requests()
        .and_then(|r| r.run_summary(sampler.as_ref().map(|s| s.gpu_count())));
    if s.args.window_from_proxy {
        let power = sampler
            .as_ref()
            .and_then(|smp| smp.handle().traffic_close());
        if power.is_some() || requests.is_some() {
            let mut w = json!({"name": "proxy-traffic"});
            if let Some(p) = power.and_then(|p| serde_json::to_value(p).ok()) {
                w["power"] = p;
            }
            if let Some(r) = &requests {
                w["requests"] = r.clone();
            }
            s.events.emit("window", w);
        }
    }
    if let Some(summary) = requests {
        s.events.emit("requests_summary", summary);
    }
    if let Some(p) = s.startup.finish(s.events.elapsed(exited_at)) {
        s.events.emit("startup_profile", p);
    }
    if series.seen() {
        s.events.emit("server_batches", series.summary());
    }
    if let Some(sampler) = sampler {
        // Blocking driver calls and a bounded wait: off the async threads.
        let done = tokio::task::spawn_blocking(move || {
            let teardown = crate::gpu::teardown_check(&sampler, GPU_RELEASE_WAIT);
            (teardown, sampler.stop())
        })
        .await;
        if let Ok((teardown, window)) = done {
            if teardown["clean"] == false {
                tracing::error!("GPU memory still held after the server exited: {teardown}");
            }
            s.events.emit("gpu_teardown", teardown);
            match serde_json::to_value(&window) {
                Ok(v) => s.events.emit("power", v),
                Err(e) => tracing::error!("cannot serialise the power window: {e}"),
            }
        }
    }

    let requested = matches!(s.stop, Some(Stop::Requested(_)));
    let exit_status = match s.stop {
        Some(Stop::Requested(sig)) => 128 + sig,
        Some(Stop::ReadyTimeout) => 124,
        Some(Stop::Fatal) if s.killed_live => 1,
        _ => status.shell_code(),
    };
    let (code, signal) = match status {
        ExitStatus::Code(c) => (Some(c), None),
        ExitStatus::Signal(n) => (None, Some(n)),
    };
    s.metrics.update(|st| {
        st.state = if requested || status == ExitStatus::Code(0) {
            "exited"
        } else {
            "failed"
        };
        st.exit_code = Some(i64::from(exit_status));
    });
    let log = s.log_summary(&shared, &stats);
    s.events.emit(
        "exited",
        json!({"code": code, "signal": signal, "elapsed_s": s.events.elapsed(exited_at), "requested": requested,
               "exit_status": exit_status, "log": log}),
    );
    tracing::info!(?status, exit_status, requested, "server exited");
    crate::report::write_at_exit(&s.args, &s.events.kept());
    if let Some(sen) = sentinel {
        sen.disarm().await;
    }
    Ok(exit_status)
}

async fn join_readers(readers: Vec<std::thread::JoinHandle<StreamStats>>) -> Vec<StreamStats> {
    let joined = tokio::task::spawn_blocking(move || {
        readers
            .into_iter()
            .filter_map(|r| r.join().ok())
            .collect::<Vec<_>>()
    });
    match tokio::time::timeout(DRAIN_TIMEOUT, joined).await {
        Ok(Ok(stats)) => stats,
        _ => {
            tracing::warn!("the child's output pipes are still open (a process outside the tree holds them); not waiting further");
            Vec::new()
        }
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGKILL => "SIGKILL",
        _ => "signal",
    }
}

/// "cuda_graph_begin" → "in cuda graph capture"; "load_weights_end" → "after load weights".
fn describe_phase(name: &str) -> String {
    if let Some(base) = name.strip_suffix("_begin") {
        let what = match base {
            "cuda_graph" => "cuda graph capture",
            "load_weights" => "weight loading",
            "init_distributed" => "distributed init",
            other => other,
        };
        format!("stopped in {what}")
    } else if let Some(base) = name.strip_suffix("_end") {
        format!("stopped after {}", base.replace('_', " "))
    } else {
        format!("stopped after {}", name.replace('_', " "))
    }
}

fn ago(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    if s >= 3600 {
        format!("{}h{}m ago", s / 3600, (s % 3600) / 60)
    } else if s >= 60 {
        format!("{}m ago", s / 60)
    } else {
        format!("{s}s ago")
    }
}

impl Supervision {
    fn now_s(&self) -> f64 {
        self.events.elapsed(Instant::now())
    }

    async fn on_log(&mut self, t: Timed) {
        let at = self.events.elapsed(t.at);
        match t.event {
            LogEvent::Ready => {
                if self.args.ready_on == ReadyOn::Log
                    && !self.ready
                    && !self.probing
                    && self.stop.is_none()
                {
                    self.probing = true;
                    let (url, tx) = (self.url.clone(), self.probe_tx.clone());
                    tokio::spawn(async move {
                        let _ = tx.send(confirm_ready(url).await);
                    });
                }
            }
            LogEvent::ServerArgs(args) => {
                self.startup.mark("server_args", at);
                self.metrics.update(|st| st.args_info = args_info(&args));
                self.upstream_metrics = args.get("enable_metrics").and_then(Value::as_bool);
                let size =
                    |k: &str| args.get(k).and_then(Value::as_u64).unwrap_or(1).max(1) as usize;
                if let Some(sampler) = self.metrics.sampler() {
                    sampler.set_expected_gpus(size("tp_size") * size("pp_size"));
                }
                self.events.emit("server_args", json!({"args": args}));
            }
            LogEvent::Deprecation {
                flag,
                replacement,
                message,
            } => {
                if self.seen_deprecations.insert(message.clone()) {
                    self.events.emit(
                        "deprecation",
                        json!({"flag": flag, "replacement": replacement, "message": message}),
                    );
                    tracing::warn!("deprecated: {message}");
                }
            }
            LogEvent::Warning { message } => self.warn(message),
            LogEvent::Phase {
                name,
                rank,
                reported_s,
                detail,
            } => self.on_phase(name, rank, reported_s, detail, at),
            // Batches and retractions are folded into `Shared::batches`/`series` by the readers.
            LogEvent::Batch { .. } | LogEvent::Retraction { .. } => {}
            LogEvent::Traceback { excerpt } => self.last_traceback = Some(excerpt),
            LogEvent::WorkerDied { line } => {
                self.worker_deaths += 1;
                self.warn(line.clone());
                if self.worker_deaths >= WORKER_DEATHS_FATAL && !self.ready {
                    let excerpt = format!(
                        "{line}\nuvicorn keeps killing tokenizer workers that miss its health check \
                         (SGLANG_UVICORN_WORKER_HEALTHCHECK_TIMEOUT, default 10 s; a worker needs 20-35 s to \
                         import sglang). Set SGLANG_UVICORN_WORKER_HEALTHCHECK_TIMEOUT=180 in the server's environment."
                    );
                    self.on_fatal("uvicorn_worker_died", None, excerpt).await;
                }
            }
            LogEvent::Fatal {
                reason,
                rank,
                excerpt,
            } => self.on_fatal(reason, rank, excerpt).await,
        }
    }

    fn warn(&mut self, message: String) {
        if self.seen_warnings.contains(&message) {
            return;
        }
        if self.seen_warnings.len() >= MAX_WARNING_EVENTS {
            self.warnings_suppressed += 1;
            return;
        }
        self.events.emit("warning", json!({"message": message}));
        self.seen_warnings.insert(message);
    }

    fn on_phase(
        &mut self,
        name: &'static str,
        rank: Option<String>,
        reported_s: Option<f64>,
        detail: Option<String>,
        at: f64,
    ) {
        self.startup.mark(name, at);
        let key = rank.clone().unwrap_or_else(|| "main".into());
        let progress = self.ranks.entry(key).or_default();
        progress.last = Some((name, at));
        let mut fields = json!({"name": name, "rank": rank, "elapsed_s": at});
        if let Some(base) = name.strip_suffix("_begin") {
            progress.begun.insert(base, at);
        } else if let Some(base) = name.strip_suffix("_end") {
            let measured = progress.begun.get(base).map(|b| at - b);
            if let Some(b) = progress.begun.get(base) {
                fields["jit_s"] = json!(round_ms(self.startup.jit_within(*b, at)));
            }
            if let Some(d) = reported_s.or(measured) {
                fields["duration_s"] = json!(round_ms(d));
                // Across ranks the slowest one is what the server waited for.
                self.metrics
                    .update(|st| match st.phases.iter_mut().find(|(p, _)| p == base) {
                        Some((_, v)) => *v = v.max(round_ms(d)),
                        None => st.phases.push((base.to_string(), round_ms(d))),
                    });
            }
            // SGLang logs no "memory pool begin": the pool is built right after the weights load.
            if base == "load_weights" {
                progress.begun.insert("memory_pool", at);
            }
        }
        if name == "http_up" {
            self.http_up_at = Some(at);
        }
        if let Some(d) = detail {
            fields["detail"] = json!(d);
        }
        if rank.is_none() {
            if let Value::Object(m) = &mut fields {
                m.remove("rank");
            }
        }
        self.events.emit("phase", fields);
    }

    async fn on_fatal(&mut self, reason: &'static str, rank: Option<String>, excerpt: String) {
        // While a stop is under way, crash reports are the stop's own echo (SIGINT makes SGLang
        // report its detokenizer "crashed with -9"): keep them, but as warnings.
        if matches!(self.stop, Some(Stop::Requested(_))) {
            self.warn(excerpt);
            return;
        }
        let mut fields = json!({"reason": reason, "excerpt": excerpt});
        if let Some(r) = &rank {
            fields["rank"] = json!(r);
        }
        self.events.emit("fatal", fields);
        let first = self.fatal.is_none();
        if first {
            self.fatal = Some((reason.to_string(), excerpt.clone()));
        }
        if self.ready || self.stop.is_some() {
            tracing::error!(reason, rank = rank.as_deref(), "fatal: {excerpt}");
            return;
        }
        tracing::error!(
            reason,
            rank = rank.as_deref(),
            "fatal before readiness, stopping the server:\n{excerpt}"
        );
        self.stop = Some(Stop::Fatal);
        // The child often ends itself within milliseconds (argparse exits 2, SGLang SIGKILLs its
        // tree after `Received sigquit`): its own status is the truer one, so it gets a moment.
        self.grace_deadline = Some(tokio::time::Instant::now() + FATAL_SELF_EXIT);
    }

    async fn on_signal(&mut self, sig: i32) {
        let name = signal_name(sig);
        if self.stop.is_some() {
            // A second signal: stop waiting for a graceful drain.
            self.events
                .emit("signal", json!({"signal": name, "target": "tree"}));
            tracing::warn!("{name} again: SIGKILL to the whole process tree");
            child::kill_tree(self.pid, &self.exclude, Duration::ZERO).await;
            return;
        }
        self.stop = Some(Stop::Requested(sig));
        self.metrics.update(|st| st.state = "stopping");
        let (target, dest) = if self.args.signal_group {
            ("group", -self.pid)
        } else {
            ("main", self.pid)
        };
        child::send_signal(dest, sig);
        self.events
            .emit("signal", json!({"signal": name, "target": target}));
        tracing::info!(
            "{name} forwarded to the server's {target}; SIGKILL in {:?} if it is still running",
            self.args.grace
        );
        self.grace_deadline = Some(tokio::time::Instant::now() + self.args.grace);
    }

    fn on_ready_timeout(&mut self) {
        let now = self.now_s();
        let mut parts: Vec<String> = self
            .ranks
            .iter()
            .filter_map(|(rank, p)| {
                p.last
                    .map(|(name, at)| format!("{rank} {} {}", describe_phase(name), ago(now - at)))
            })
            .collect();
        if parts.is_empty() {
            parts.push("no startup phase was logged".into());
        }
        let excerpt = format!(
            "not ready after {}: {}",
            humantime::format_duration(self.args.ready_timeout),
            parts.join("; ")
        );
        tracing::error!("{excerpt}; stopping the server");
        self.events.emit(
            "fatal",
            json!({"reason": "ready_timeout", "excerpt": excerpt}),
        );
        self.fatal = Some(("ready_timeout".into(), excerpt));
        self.stop = Some(Stop::ReadyTimeout);
        let dest = if self.args.signal_group {
            -self.pid
        } else {
            self.pid
        };
        child::send_signal(dest, libc::SIGTERM);
        self.grace_deadline = Some(tokio::time::Instant::now() + self.args.grace);
    }

    async fn on_probe(&mut self, p: Probe) {
        match p {
            Probe::Confirmed(path) => {
                self.probing = false;
                tracing::debug!("ready line confirmed by GET {path}");
                self.become_ready();
            }
            Probe::ConfirmFailed(why) => {
                self.probing = false;
                tracing::warn!(
                    "the log says ready but HTTP does not confirm it ({why}); polling /health"
                );
                self.health_polling = true;
                self.next_health = Some(tokio::time::Instant::now());
            }
            Probe::Health(r) => match r {
                Ok(200) => self.become_ready(),
                other => {
                    tracing::debug!("GET /health: {other:?}");
                    self.next_health = Some(tokio::time::Instant::now() + HEALTH_PERIOD);
                }
            },
        }
    }

    fn poll_health(&self) {
        let (url, tx) = (self.url.with_path("/health"), self.probe_tx.clone());
        tokio::spawn(async move {
            let r = get_status(&url, HEALTH_TIMEOUT)
                .await
                .map_err(|e| e.to_string());
            let _ = tx.send(Probe::Health(r));
        });
    }

    fn become_ready(&mut self) {
        if self.ready || self.stop.is_some() {
            return;
        }
        self.ready = true;
        let at = self.now_s();
        self.metrics.update(|st| {
            st.state = "ready";
            st.ready_seconds = Some(at);
        });
        // The version and the server's own view of its args, for the report (one cheap request).
        let (info_url, ev) = (self.url.with_path("/server_info"), self.events.clone());
        tokio::spawn(async move {
            if let Ok((200, body)) =
                sglang_probes::http::get_body(&info_url, HEALTH_TIMEOUT, 4 << 20).await
            {
                if let Ok(Value::Object(m)) = serde_json::from_slice::<Value>(&body) {
                    let pick = |k: &str| m.get(k).cloned().unwrap_or(Value::Null);
                    ev.emit("server_info", json!({"version": pick("version"), "max_total_num_tokens": pick("max_total_num_tokens")}));
                }
            }
        });
        if self.upstream_metrics != Some(false) {
            tokio::spawn(fetch_upstream_metrics(
                self.url.with_path("/metrics"),
                self.metrics.clone(),
            ));
        }
        if let Some(up) = self.http_up_at {
            self.metrics
                .update(|st| st.phases.push(("warmup".into(), round_ms(at - up))));
            self.events.emit(
                "phase",
                json!({"name": "warmup", "elapsed_s": at, "duration_s": round_ms(at - up),
                       "jit_s": round_ms(self.startup.jit_within(up, at))}),
            );
        }
        self.startup.mark("ready", at);
        if let Some(p) = self.startup.finish(at) {
            self.events.emit("startup_profile", p);
        }
        self.events
            .emit("ready", json!({"elapsed_s": at, "url": self.url.base()}));
        tracing::info!("server ready after {at:.3} s at {}", self.url.base());
        if let Some(cmd) = &self.args.on_ready {
            run_on_ready(cmd);
        }
    }

    /// The child exited without a stop of ours: say why, from what it printed.
    fn diagnose_exit(&mut self, status: ExitStatus, shared: &Shared) {
        if self.stop.is_some() || self.fatal.is_some() {
            return;
        }
        if self.ready && status == ExitStatus::Code(0) {
            return;
        }
        let reason = if self.ready {
            "exited"
        } else {
            "exited_before_ready"
        };
        let excerpt = self.last_traceback.clone().unwrap_or_else(|| {
            let lines = shared
                .tail
                .lock()
                .map(|t| t.last_lines(15))
                .unwrap_or_default();
            if lines.is_empty() {
                "(no output)".into()
            } else {
                lines.join("\n")
            }
        });
        let excerpt = format!(
            "the server exited with {} {}\n{excerpt}",
            describe_status(status),
            if self.ready {
                "after readiness"
            } else {
                "before it was ready"
            }
        );
        tracing::error!("{excerpt}");
        self.events
            .emit("fatal", json!({"reason": reason, "excerpt": excerpt}));
    }

    fn log_summary(&self, shared: &Shared, stats: &[StreamStats]) -> Value {
        let log = shared.log.lock().unwrap_or_else(|p| p.into_inner());
        let dropped: u64 = [1, 2]
            .map(|fd| {
                tee::terminal(fd)
                    .dropped
                    .load(std::sync::atomic::Ordering::Relaxed)
            })
            .iter()
            .sum();
        if dropped > 0 {
            tracing::warn!("the terminal was too slow: {dropped} bytes were left out of the terminal copy (the log file has them)");
        }
        let batches = shared.batches.lock().map(|b| b.count).unwrap_or_default();
        let sum = |f: fn(&StreamStats) -> u64| stats.iter().map(f).sum::<u64>();
        json!({
            "bytes": sum(|s| s.bytes),
            "lines": sum(|s| s.parse.lines),
            "progress_lines": sum(|s| s.parse.progress_lines),
            "non_utf8_lines": sum(|s| s.parse.non_utf8_lines),
            "truncated_lines": sum(|s| s.parse.truncated_lines),
            "log_file_bytes": log.written,
            "log_file_lost_bytes": log.lost,
            "log_file_error": log.error,
            "terminal_dropped_bytes": dropped,
            "prefill_batches": batches[0],
            "decode_batches": batches[1],
            "warnings_suppressed": self.warnings_suppressed,
            "orphans_reaped": child::orphans_reaped(),
            "supervisor_max_rss_kb": max_rss_kb(),
            "supervisor_cpu_s": cpu_seconds(),
        })
    }
}

/// Our own peak resident memory (the supervisor must never perturb the benchmark it watches).
fn max_rss_kb() -> Option<i64> {
    // SAFETY: getrusage fills a plain struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer.
    (unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } == 0).then_some(ru.ru_maxrss)
}

/// Our own CPU time (user + system), all threads.
fn cpu_seconds() -> Option<f64> {
    // SAFETY: getrusage fills a plain struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return None;
    }
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    Some(round_ms(t(ru.ru_utime) + t(ru.ru_stime)))
}

fn describe_status(s: ExitStatus) -> String {
    match s {
        ExitStatus::Code(c) => format!("exit code {c}"),
        ExitStatus::Signal(n) => format!("signal {n} ({})", signal_name(n)),
    }
}

/// Resolved args worth a label on `server_args_info` (strings and numbers; unset ones left out).
const INFO_ARGS: &[&str] = &[
    "model_path",
    "served_model_name",
    "tp_size",
    "pp_size",
    "dp_size",
    "ep_size",
    "attention_backend",
    "mem_fraction_static",
    "dtype",
    "kv_cache_dtype",
    "quantization",
    "context_length",
    "chunked_prefill_size",
    "max_running_requests",
    "load_format",
];

fn args_info(args: &serde_json::Map<String, Value>) -> Vec<(String, String)> {
    INFO_ARGS
        .iter()
        .filter_map(|k| {
            let v = match args.get(*k)? {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                _ => return None,
            };
            Some((k.to_string(), v))
        })
        .collect()
}

/// Keep a cached copy of the server's own `/metrics` (short timeout, every few seconds), so a
/// scrape of ours never waits on the server. Ends with the process.
async fn fetch_upstream_metrics(url: HttpUrl, metrics: Arc<exporters::Shared>) {
    loop {
        match sglang_probes::http::get_body(&url, UPSTREAM_METRICS_TIMEOUT, 16 << 20).await {
            Ok((200, body)) => {
                metrics.set_upstream(Some(String::from_utf8_lossy(&body).into_owned()), true)
            }
            Ok((code, _)) => {
                tracing::debug!("GET {url}: {code}");
                metrics.set_upstream(None, false);
            }
            Err(e) => {
                tracing::debug!("{e}");
                metrics.set_upstream(None, false);
            }
        }
        tokio::time::sleep(UPSTREAM_METRICS_PERIOD).await;
    }
}

/// The ready line is a claim; one cheap request confirms it (`/ready` on 0.5.20+, where a 404
/// means "older version", then `/model_info`), retried briefly.
async fn confirm_ready(url: HttpUrl) -> Probe {
    let deadline = Instant::now() + CONFIRM_FOR;
    let mut last = String::new();
    while Instant::now() < deadline {
        match get_status(&url.with_path("/ready"), HEALTH_TIMEOUT).await {
            Ok(200) => return Probe::Confirmed("/ready"),
            Ok(404) => match get_status(&url.with_path("/model_info"), HEALTH_TIMEOUT).await {
                Ok(200) => return Probe::Confirmed("/model_info"),
                Ok(code) => last = format!("GET /model_info answered {code}"),
                Err(e) => last = e.to_string(),
            },
            Ok(code) => last = format!("GET /ready answered {code}"),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Probe::ConfirmFailed(last)
}

fn run_on_ready(cmd: &str) {
    let argv: Vec<OsString> = vec!["sh".into(), "-c".into(), cmd.into()];
    match child::spawn(SpawnSpec {
        argv: &argv,
        new_process_group: false,
        die_with_parent: false,
        stdin: Stdio::null(),
        stdout: Stdio::inherit(),
        stderr: Stdio::inherit(),
    }) {
        Ok(s) => {
            tokio::spawn(async move {
                if let Ok(st) = s.exit.await {
                    tracing::info!(?st, "--on-ready command finished");
                }
            });
        }
        Err(e) => tracing::error!("--on-ready: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn run_args(cmd: &[&str]) -> RunArgs {
        let mut v = vec!["s", "run", "--"];
        v.extend_from_slice(cmd);
        match Cli::try_parse_from(v).unwrap().command {
            Command::Run(r) => *r,
            _ => unreachable!(),
        }
    }

    #[test]
    fn the_launch_interpreter_is_found_for_both_launch_forms() {
        let os = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            launch_args(&os(&[
                "/opt/venv/bin/python3",
                "-u",
                "-m",
                "sglang.launch_server",
                "--tp",
                "2"
            ])),
            Some((
                "/opt/venv/bin/python3".to_string(),
                vec!["--tp".to_string(), "2".to_string()]
            ))
        );
        let dir = std::env::temp_dir().join(format!("sglsup-shebang-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (shebang, want) in [
            ("#!/opt/venv/bin/python3.12\n", "/opt/venv/bin/python3.12"),
            ("#!/usr/bin/env python3\n", "python3"),
        ] {
            let script = dir.join("sglang");
            std::fs::write(&script, format!("{shebang}import sys\n")).unwrap();
            let got = launch_args(&os(&[
                script.to_str().unwrap(),
                "serve",
                "--model-path",
                "m",
            ]));
            assert_eq!(got.map(|g| g.0), Some(want.to_string()), "{shebang}");
        }
        let _ = std::fs::remove_dir_all(dir);
        assert_eq!(launch_args(&os(&["sglang-replay", "--port", "1"])), None);
    }

    #[test]
    fn server_url_comes_from_the_command_with_sglang_defaults() {
        assert_eq!(
            server_url(&run_args(&["python3", "-m", "sglang.launch_server"]))
                .unwrap()
                .base(),
            "http://127.0.0.1:30000"
        );
        assert_eq!(
            server_url(&run_args(&["x", "--host", "0.0.0.0", "--port=8000"]))
                .unwrap()
                .base(),
            "http://127.0.0.1:8000"
        );
        assert_eq!(
            server_url(&run_args(&["x", "--host=::", "--port", "1"]))
                .unwrap()
                .base(),
            "http://[::1]:1"
        );
        assert!(server_url(&run_args(&["x", "--port", "http"])).is_err());
    }

    #[test]
    fn phase_descriptions_read_naturally() {
        assert_eq!(
            describe_phase("cuda_graph_begin"),
            "stopped in cuda graph capture"
        );
        assert_eq!(
            describe_phase("load_weights_end"),
            "stopped after load weights"
        );
        assert_eq!(ago(14.0 * 60.0 + 3.0), "14m ago");
    }
}
