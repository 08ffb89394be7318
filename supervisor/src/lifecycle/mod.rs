//! `run`, in four steps: open the services (files, signals, metrics, GPU sampler, proxy), spawn
//! the server, supervise it until it exits, tear down. What the lifecycle *decides* (readiness,
//! stops, signals, the exit status) is the state machine in [`machine`]; this module carries out
//! its actions and records what the server's log says.
//!
//! The supervising task runs on the main thread, which is also the thread that spawned the child:
//! PR_SET_PDEATHSIG fires when the *spawning thread* exits.
mod machine;
mod preflight;
mod signals;
mod unseen;

pub use machine::{signal_name, Stop};
pub use preflight::{preflight_unless_stopped, Preflight};

use crate::child::{self, ExitStatus, SpawnSpec};
use crate::cli::{ReadyOn, RunArgs};
use crate::events::{round_ms, Event, Events, FatalReason, PhaseName, Stage};
use crate::exit;
use crate::logs::parse::{LogEvent, LoopbackClients, AFTER_READY};
use crate::logs::tee::{self, LogFile, Shared, StreamStats, Timed};
use crate::readiness::{self, Evidence, Node};
use crate::redact::{redact_argv, Secrets};
use crate::sentinel::Sentinel;
use crate::server_series::ServerSeries;
use crate::startup::StartupProfile;
use anyhow::Result;
use machine::{Action, Input, Machine, Settings};
use serde_json::{json, Map, Value};
use sglang_exporters::metrics as exporters;
use sglang_exporters::tap::TapRead;
use sglang_probes::http::HttpUrl;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::time::sleep_until;
use unseen::{Uncounted, Unseen, TAP_ELSEWHERE};

/// How long the log threads may take to drain after the tree is dead.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(3);
/// How long teardown waits for killed processes to disappear before calling them leftovers.
const KILL_WAIT: Duration = Duration::from_secs(2);
/// `/server_info` after readiness: one cheap request.
const INFO_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the GPUs may take to list no process of the dead server (the driver frees memory
/// asynchronously).
const GPU_RELEASE_WAIT: Duration = Duration::from_secs(5);
/// A second `Child process [N] died` before readiness means uvicorn's kill loop.
const WORKER_DEATHS_FATAL: u32 = 2;
/// Distinct warnings reported as events (the rest are counted).
const MAX_WARNING_EVENTS: usize = 200;

/// The server URL: `--health-url`, `--upstream`, else `--host`/`--port` from the server's argv.
pub fn server_url(args: &RunArgs) -> Result<HttpUrl> {
    server_address(args).map(|(url, ..)| url)
}

/// The server URL and where it was read, also in words.
fn server_address(args: &RunArgs) -> Result<(HttpUrl, readiness::AddressFrom, &'static str)> {
    let given = [
        ("--health-url", &args.health_url),
        ("--upstream", &args.upstream),
    ]
    .into_iter()
    .find_map(|(flag, v)| Some((flag, v.as_deref()?)));
    let (url, from) = readiness::server_url(&server_words(&args.command), given.map(|(_, u)| u))?;
    let words = match (from, given) {
        (readiness::AddressFrom::Given, Some((flag, _))) => flag,
        (readiness::AddressFrom::Port, _) => "the server's --port",
        _ => "SGLang's default port, the command having no --port",
    };
    Ok((url, from, words))
}

/// The words the server's own flags are read from: the launch's arguments where COMMAND runs
/// one (`… python3 -m sglang.launch_server ARGS`, `sglang serve ARGS`), so that a wrapper's
/// flags (`mpirun --host`, `docker --host`) are not taken for the server's; else all of it.
fn server_words(command: &[OsString]) -> Vec<String> {
    let argv = argv_text(command);
    match sglang_python::recipe::launch_in_argv(&argv) {
        Some(launch) => launch.args,
        None => argv,
    }
}

/// Where COMMAND gives no --port but the server's port may be set where this run does not read
/// it: what to say, and what to pass. A script COMMAND runs that launches the server with one
/// (`bash recipe.sh`, `--port $PORT`), whose value is not taken (what bash makes of it, `"$@"`
/// after it, a branch not taken, `$PORT` from elsewhere, is not read here); or the launch's
/// `--config FILE`. The server's log says later where it listens.
fn port_not_read(command: &[OsString], url: &HttpUrl) -> Option<String> {
    use crate::server_argv::{last, CONFIG, PORT};
    let launches = crate::flags::launches_in_command(command).ok()?;
    let polled = format!(
        "it checks readiness and measures at {}, SGLang's default",
        url.base()
    );
    let pass = |port: &str| {
        format!(
            "--health-url http://{}:{port}, or --upstream with --proxy-addr or --tap",
            url.host
        )
    };
    let Some(given) = launches.iter().find_map(|l| last(&l.args, &PORT)) else {
        let config = launches.iter().find_map(|l| last(&l.args, &CONFIG))?;
        return Some(format!(
            "the server's --config {config} may set its port, which this run does not read: \
             {polled}. If the file sets another, pass {}",
            pass("PORT")
        ));
    };
    let port = match given.trim().parse::<u16>() {
        Ok(p) if p == url.port => return None,
        Ok(p) => p.to_string(),
        Err(_) => "PORT".to_string(),
    };
    Some(format!(
        "the script COMMAND runs launches the server with --port {given}, which this run does \
         not read from a script: {polled}. Pass {}",
        pass(&port)
    ))
}

/// `--metrics-addr` and `--proxy-addr`, checked before anything starts: each must be an address,
/// and not the server's own (the server could not take its port, the proxy would forward to
/// itself).
pub fn check_listen_addrs(args: &RunArgs) -> Result<()> {
    let (url, _, from) = server_address(args)?;
    let mut servers = vec![(url, from)];
    if let Some(u) = args
        .upstream
        .as_deref()
        .and_then(|u| HttpUrl::parse(u).ok())
    {
        servers.push((u, "--upstream"));
    }
    let flags = [
        (
            "--metrics-addr",
            args.metrics_addr
                .as_deref()
                .filter(|v| !crate::metrics_addr::is_off(v)),
        ),
        ("--proxy-addr", args.proxy_addr.as_deref()),
    ];
    for (flag, value) in flags {
        let Some(value) = value else { continue };
        let addr = crate::listen_addr::parse(flag, value)?;
        for (server, from) in &servers {
            crate::listen_addr::check_not_server(flag, value, &addr, (server, from))?;
        }
    }
    Ok(())
}

fn argv_text(command: &[OsString]) -> Vec<String> {
    command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

/// Open a file we write (log, events, requests log). Opened non-blocking so that a FIFO with no
/// reader is an error at once instead of a silent hang; blocking again once open.
fn create(path: &Path, what: &str) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ENXIO) {
                anyhow::anyhow!(
                    "the {what} {} is a FIFO with no reader: start its reader first, or give a regular file",
                    path.display()
                )
            } else {
                anyhow::anyhow!(
                    "cannot create the {what} {} ({e}): check the directory exists and is writable",
                    path.display()
                )
            }
        })?;
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let fd = f.as_raw_fd();
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
    Ok(f)
}

/// `--report` is written at exit: a path we could not write is found now, not then. Opened
/// for writing (not truncated); a file that did not exist is created and removed again.
fn check_writable(path: &Path, what: &str) -> Result<()> {
    let refuse = |why: String| {
        anyhow::anyhow!(
            "cannot write the {what} {} ({why}): give a writable path",
            path.display()
        )
    };
    if path.is_dir() {
        return Err(refuse("it is a directory".into()));
    }
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .write(true)
        .create(!existed)
        .truncate(false)
        .open(path)
        .map_err(|e| refuse(e.to_string()))?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// COMMAND as text, and the secret values its events must never carry: from it, from the
/// launches of a script it runs (`bash recipe.sh` with `--api-key sk-…` in it, which the
/// server logs in its arguments), and from our env.
fn command_and_secrets(args: &RunArgs) -> (Vec<String>, Secrets) {
    let argv = argv_text(&args.command);
    let mut words = argv.clone();
    for launch in crate::flags::launches_in_command(&args.command).unwrap_or_default() {
        words.extend(launch.args);
    }
    let secrets = Secrets::from_run(&words, std::env::vars());
    (argv, secrets)
}

/// The events of a run that never got as far as a server: `fatal` then the terminal `exited`,
/// so `wait --events` and the report see it end.
fn record_end_without_server(
    events: &Events,
    reason: FatalReason,
    excerpt: String,
    exit_status: i32,
) {
    events.emit(Event::Fatal {
        reason,
        rank: None,
        excerpt,
    });
    events.emit(Event::Exited {
        code: None,
        signal: None,
        elapsed_s: 0.0,
        requested: false,
        exit_status,
        log: Value::Null,
        supervisor_pid: Some(std::process::id()),
    });
}

/// `--report` and `--report-html`, from the events kept (see [`keeps_events`]).
fn write_report(args: &RunArgs, events: &Events) {
    crate::report::write_at_exit(args, &events.kept());
}

/// Whether the events are kept for a report at exit.
fn keeps_events(args: &RunArgs) -> bool {
    args.report.is_some() || args.report_html.is_some()
}

/// A refused launch still leaves its `preflight` event, and an end, where `--events` points.
pub fn record_rejection(args: &RunArgs, event: Value) {
    record_without_server(
        args,
        Some(event),
        FatalReason::PreflightRejected,
        "the server's flags would fail to parse; not launched".into(),
        exit::PREFLIGHT_REJECTED,
    );
}

/// The supervisor could not start its own machinery (before any server): the run still ends
/// with its terminal events, so `wait --events` does not wait for a server that never comes.
pub fn record_not_started(args: &RunArgs, preflight: Option<Value>, e: &anyhow::Error) {
    record_without_server(
        args,
        preflight,
        FatalReason::SupervisorFailed,
        format!("{e:#}"),
        exit::SUPERVISOR_FAILED,
    );
}

fn record_without_server(
    args: &RunArgs,
    preflight: Option<Value>,
    reason: FatalReason,
    excerpt: String,
    exit_status: i32,
) {
    let events = events_without_server(args, preflight);
    record_end_without_server(&events, reason, excerpt, exit_status);
    write_report(args, &events);
}

/// A stopping signal came during the pre-flight: the run ends as a requested stop (128 + the
/// signal), with its `exited` event and report, the server never started.
pub fn record_stopped_before_start(args: &RunArgs, sig: i32) -> i32 {
    record_stopped(args, &events_without_server(args, None), sig)
}

/// The `exited` event and report of a run stopped before its server started (128 + `sig`).
fn record_stopped(args: &RunArgs, events: &Events, sig: i32) -> i32 {
    let exit_status = exit::signalled(sig);
    events.emit(Event::Exited {
        code: None,
        signal: None,
        elapsed_s: 0.0,
        requested: true,
        exit_status,
        log: Value::Null,
        supervisor_pid: Some(std::process::id()),
    });
    write_report(args, events);
    exit_status
}

/// The events file of a run that starts no server, with its `preflight` event when there is one.
fn events_without_server(args: &RunArgs, preflight: Option<Value>) -> Events {
    let file = match args.events.as_deref().map(|p| create(p, "events file")) {
        Some(Err(e)) => {
            tracing::error!("{e:#}");
            None
        }
        Some(Ok(f)) => Some(f),
        None => None,
    };
    let events = Events::new(
        file,
        args.events.as_ref().map(|p| p.display().to_string()),
        Instant::now(),
        keeps_events(args),
    )
    .with_secrets(command_and_secrets(args).1);
    if let Some(p) = preflight {
        events.emit(Event::Preflight(Event::object(p)));
    }
    events
}

/// Everything the run opens before the server starts; any of it can fail, and then nothing runs.
struct Services {
    log_file: Option<File>,
    url: HttpUrl,
    /// Where `url` was read (the command's --port, SGLang's default, ...).
    url_from: readiness::AddressFrom,
    signals: signals::Signals,
    metrics: Arc<exporters::Shared>,
    sampler: Option<sglang_probes::sampler::Sampler>,
    metrics_addr: Option<SocketAddr>,
    /// The default metrics port was taken: where and by whom (for the `listening` event).
    metrics_default_taken: Option<Value>,
    proxy_addr: Option<SocketAddr>,
    /// Where the proxy's connections to the server come from, where it chose.
    proxy_source: Option<std::net::Ipv4Addr>,
    /// What the proxy measures (and whether its clients named clients of their own).
    proxy_metrics: Arc<sglang_exporters::proxy::ProxyMetrics>,
    /// `--tap`: reading the server's traffic until the server is down.
    tap: Option<sglang_exporters::tap::TapHandle>,
    /// The server's batch series (log lines, metrics, windows).
    series: Arc<ServerSeries>,
    /// Where the start's time goes (the process tree sampled until readiness).
    startup: Arc<StartupProfile>,
    /// The torch-profiler trace directory, and whether the server must be told (None: off).
    trace_dir: Option<(PathBuf, bool)>,
}

/// The address `--tap` copies: the upstream's when one is named, else the server's.
fn tapped(args: &RunArgs, url: &HttpUrl) -> Result<HttpUrl> {
    match args.upstream.as_deref() {
        Some(u) => HttpUrl::parse(u).map_err(|e| anyhow::anyhow!("--upstream {u:?}: {e}")),
        None => Ok(url.clone()),
    }
}

async fn open_services(args: &RunArgs) -> Result<Services> {
    if let Some(p) = &args.report {
        check_writable(p, "report")?;
    }
    if let Some(p) = &args.report_html {
        check_writable(p, "HTML report")?;
    }
    let log_file = args
        .log_file
        .as_deref()
        .map(|p| create(p, "log file"))
        .transpose()?;
    let (url, url_from, _) = server_address(args)?;
    if url_from == readiness::AddressFrom::DefaultPort {
        if let Some(said) = port_not_read(&args.command, &url) {
            tracing::warn!("{said}");
        }
    }
    // Past a file-size limit (RLIMIT_FSIZE) a write fails with EFBIG instead of killing us: the
    // log file reports it and the child's pipes keep being drained.
    // SAFETY: setting a signal disposition; no handler runs.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    if let Err(e) = child::become_subreaper() {
        tracing::warn!("cannot become a child subreaper ({e}): descendants that call setsid may escape teardown");
    }
    // Signals are caught from before the spawn on, so none is lost in between.
    let signals = signals::Signals::install()?;
    // The metrics port is bound before the spawn: a port in use is a start-up error, not a
    // surprise an hour into the benchmark.
    let metrics = Arc::new(exporters::Shared::default());
    metrics.update(|st| st.state = "starting");
    // GPU sampling starts before the server, so the window covers its whole start.
    let sampler = crate::gpu::start_sampler(args)?;
    metrics.set_gpus(sampler.as_ref().map(|s| s.handle()));
    let mut registry = exporters::registry(metrics.clone());
    let series = crate::server_series::register(&mut registry, &metrics);
    let startup = crate::startup::register(&mut registry);
    let proxy_metrics = sglang_exporters::proxy::ProxyMetrics::register(&mut registry);
    let proxy_metrics_kept = proxy_metrics.clone();
    let tap_metrics = sglang_exporters::tap::TapMetrics::register(&mut registry);
    let metrics_listener = crate::metrics_addr::serve(
        args.metrics_addr.as_deref(),
        Arc::new(registry),
        metrics.clone(),
    )
    .await?;
    let mut proxy_source = None;
    let (proxy_addr, tap) = if args.proxy_addr.is_some() || args.tap {
        let log = args
            .requests_log
            .as_deref()
            .map(|p| create(p, "requests log"))
            .transpose()?;
        let stats = Arc::new(sglang_exporters::report::RequestStats::default());
        metrics.set_requests(Some(stats.clone()));
        let traffic = if args.window_from_proxy {
            sampler.as_ref().map(|s| s.handle())
        } else {
            None
        };
        match &args.proxy_addr {
            Some(addr) => {
                let upstream = args.upstream.clone().unwrap_or_else(|| url.base());
                proxy_source = sglang_exporters::proxy::upstream_source(&upstream);
                let proxy = sglang_exporters::proxy::start(
                    addr,
                    &upstream,
                    proxy_source,
                    proxy_metrics,
                    stats,
                    log,
                    traffic,
                )
                .await
                .map_err(|e| proxy_bind_error(addr, e))?;
                (Some(proxy), None)
            }
            None => {
                let target = tapped(args, &url)?;
                if args.tap_interface == "lo" {
                    warn_tap_misses(&target.host);
                }
                let tap = sglang_exporters::tap::start(sglang_exporters::tap::TapConfig {
                    port: target.port,
                    iface: args.tap_interface.clone(),
                    metrics: proxy_metrics,
                    stats,
                    requests_log: log,
                    traffic_window: traffic,
                    tap_metrics,
                })?;
                (None, Some(tap))
            }
        }
    } else {
        (None, None)
    };
    Ok(Services {
        log_file,
        url,
        url_from,
        signals,
        metrics,
        sampler,
        metrics_addr: metrics_listener.addr,
        metrics_default_taken: metrics_listener.default_taken,
        proxy_addr,
        proxy_source,
        proxy_metrics: proxy_metrics_kept,
        tap,
        series,
        startup,
        trace_dir: crate::profile::trace_dir(args),
    })
}

/// `--tap` on `lo` sees only clients on this machine: said when the server's address is one
/// that other hosts' clients reach, or that is not this machine's at all. The name is looked up
/// on a thread of its own, left running: a slow resolver neither holds up the launch nor the
/// exit.
fn warn_tap_misses(host: &str) {
    use crate::listen_addr::Route;
    let host = host.to_string();
    let said = std::thread::Builder::new()
        .name("tap-route".into())
        .spawn(move || {
            let whose = match crate::listen_addr::route(&host) {
                Route::Loopback => return,
                Route::ThisHost => "clients on other hosts come",
                Route::Away => "its clients come",
                Route::Unresolved => "it did not resolve here, and clients on other hosts would come",
            };
            tracing::warn!(
                "--tap copies loopback only, and the server is reached at {host}: {whose} in on another interface ({TAP_ELSEWHERE})"
            );
        });
    if let Err(e) = said {
        tracing::debug!("no thread to look up the server's host for the loopback warning: {e}");
    }
}

/// An interface the kernel says is down (`/sys/class/net/IFACE/operstate`).
fn is_down(iface: &str) -> bool {
    std::fs::read_to_string(format!("/sys/class/net/{iface}/operstate"))
        .is_ok_and(|s| s.trim() == "down")
}

/// A taken proxy port's error names its holder (another supervisor given the same address).
fn proxy_bind_error(addr: &str, e: sglang_exporters::proxy::ProxyError) -> anyhow::Error {
    match crate::port_holder::holder_of(addr, e.addr_in_use()) {
        Some(who) => anyhow::anyhow!(
            "cannot listen on {addr} for the proxy: the port is held by {who}; pass another \
             --proxy-addr (HOST:0 takes any free port)"
        ),
        None => e.into(),
    }
}

/// The server, in its own process group, with the profiler's trace directory in its
/// environment when it must be told.
fn spawn_server(
    args: &RunArgs,
    trace_dir: Option<&(PathBuf, bool)>,
) -> Result<child::Spawned, child::SpawnError> {
    let env: Vec<(&str, &std::ffi::OsStr)> = trace_dir
        .filter(|(_, tell)| *tell)
        .map(|(d, _)| (crate::profile::DIR_ENV, d.as_os_str()))
        .into_iter()
        .collect();
    child::spawn(
        SpawnSpec {
            argv: &args.command,
            new_process_group: true,
            die_with_parent: true,
            stdin: Stdio::null(),
            stdout: Stdio::piped(),
            stderr: Stdio::piped(),
        },
        &env,
    )
}

/// Run the server to the end; returns the exit status of `run`.
pub async fn run(args: RunArgs, preflight: Option<Value>) -> Result<i32> {
    // The events file first: from here on, every way the run can end is recorded in it.
    let events_file = args
        .events
        .as_deref()
        .map(|p| create(p, "events file"))
        .transpose()?;
    let (argv, secrets) = command_and_secrets(&args);
    let mut events = Events::new(
        events_file,
        args.events.as_ref().map(|p| p.display().to_string()),
        Instant::now(),
        keeps_events(&args),
    )
    .with_secrets(secrets.clone());
    if let Some(p) = preflight {
        events.emit(Event::Preflight(Event::object(p)));
    }
    let fail = |events: &Events, reason, e: anyhow::Error| {
        record_end_without_server(events, reason, format!("{e:#}"), exit::SUPERVISOR_FAILED);
        write_report(&args, events);
        e
    };
    // 1. Open the services.
    let mut services = match open_services(&args).await {
        Ok(s) => s,
        Err(e) => return Err(fail(&events, FatalReason::SupervisorFailed, e)),
    };
    // A stop that came after the pre-flight, before the handlers were ours (install hands those
    // over at once): the user asked for no server, so none is launched.
    if let Ok(sig) = services.signals.rx.try_recv() {
        tracing::warn!(
            "stopped by {} before the server started; it was not started",
            signal_name(sig)
        );
        return Ok(record_stopped(&args, &events, sig));
    }
    // 2. Spawn, the sentinel first: no moment of the server's life goes unwatched.
    let sentinel = match Sentinel::start() {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!("no sentinel ({e}): if the supervisor is killed, the server's workers may outlive it");
            None
        }
    };
    let t0 = Instant::now();
    let spawned = match spawn_server(&args, services.trace_dir.as_ref()) {
        Ok(s) => s,
        Err(e) => return Err(fail(&events, FatalReason::SpawnFailed, e.into())),
    };
    events.restart_clock(t0);
    let events = Arc::new(events);
    let pid = spawned.pid;
    events.emit(Event::Spawned {
        pid,
        argv: redact_argv(&argv),
        supervisor_pid: Some(std::process::id()),
    });
    // 3. Supervise until the child exits. What could not start after the spawn takes the
    //    server down with it.
    let log_file = services.log_file.take();
    let watch = Watch::start(
        &args,
        &services,
        log_file,
        spawned,
        events.clone(),
        secrets,
        sentinel,
    );
    let mut watch = match watch {
        Ok(w) => w,
        Err(e) => {
            child::kill_tree(pid, &[], KILL_WAIT).await;
            return Err(fail(&events, FatalReason::SupervisorFailed, e));
        }
    };
    services.startup.start(pid, t0, watch.exclude.clone());
    let node = Node::from_argv(&server_words(&args.command));
    let mut s = Supervision::new(
        args,
        events,
        pid,
        services.url.clone(),
        node,
        &services,
        &mut watch,
        t0,
    );
    let tap = services.tap.take();
    let status = s.supervise(&mut watch, services.signals).await;
    // What the tap copied before the server went down is read before the report is made.
    if let Some(tap) = tap {
        let read = sglang_probes::sync::off_runtime(move || tap.stop()).await;
        s.after_tap(read);
    }
    // 4. Tear down.
    s.teardown(status, watch, services.sampler).await
}

/// The child's output readers, its exit and the sentinel: what watches the running server.
struct Watch {
    /// The pipes' readers, then the log parser thread (when there is one): the order to join.
    readers: Vec<std::thread::JoinHandle<StreamStats>>,
    log_rx: mpsc::UnboundedReceiver<Timed>,
    exit_rx: tokio::sync::oneshot::Receiver<ExitStatus>,
    shared: Arc<Shared>,
    sentinel: Option<Sentinel>,
    /// Our own helper processes, never part of the server's tree.
    exclude: Vec<i32>,
    /// The requests the run's measuring misses, counted by the supervision (taken by it); the
    /// log parsers were told which loopback clients to tell of from it.
    unseen: Option<Unseen>,
}

impl Watch {
    fn start(
        args: &RunArgs,
        services: &Services,
        log_file: Option<File>,
        spawned: child::Spawned,
        events: Arc<Events>,
        secrets: Secrets,
        mut sentinel: Option<Sentinel>,
    ) -> Result<Watch> {
        let pid = spawned.pid;
        if let Some(s) = &mut sentinel {
            s.arm(pid);
        }
        let window_events = events.clone();
        services.metrics.set_window_sink(Arc::new(move |w| {
            window_events.emit(Event::Window(Event::object(w)))
        }));
        let (bench_sampler, bench_log) = (
            services.sampler.as_ref().map(|s| s.handle()),
            args.requests_log.clone(),
        );
        services.metrics.set_bench_hook(Arc::new(move |path| {
            crate::bench::live(path, bench_sampler.as_ref(), bench_log.as_deref())
        }));
        let trace_dir = services.trace_dir.as_ref().map(|(d, _)| d.as_path());
        crate::profile::setup(args, trace_dir, &services.url, &events, &services.metrics);
        tracing::info!(pid, url = %services.url.base(), "spawned the server");
        if services.metrics_addr.is_some() || services.proxy_addr.is_some() {
            let addr = |a: Option<SocketAddr>| a.map(|a| a.to_string());
            events.emit(Event::Listening {
                metrics: addr(services.metrics_addr),
                proxy: addr(services.proxy_addr),
                metrics_default_taken: services.metrics_default_taken.clone(),
            });
            if let Some(a) = services.metrics_addr {
                tracing::info!("metrics on http://{a}/metrics");
            }
            if let Some(a) = services.proxy_addr {
                // where its connections come from says whether loopback bypasses are counted
                let from = services
                    .proxy_source
                    .map_or(String::new(), |s| format!(" from {s}"));
                tracing::info!(
                    "latency-measuring proxy on http://{a} → {}{from}",
                    services.url.base()
                );
            }
        }
        let exclude: Vec<i32> = sentinel.iter().map(|s| s.pid).collect();
        let unseen = Unseen::new(
            args,
            services.proxy_addr,
            services.proxy_source,
            &services.url.host,
        )
        .map(|u| u.forwarded_when(services.proxy_metrics.clone()));
        let (log_tx, log_rx) = mpsc::unbounded_channel::<Timed>();
        let shared = Shared::telling(
            LogFile::new(
                log_file,
                args.log_file.as_ref().map(|p| p.display().to_string()),
            )
            .warn_to(log_tx.clone()),
            args.redact_log.then_some(secrets),
            services.series.clone(),
            unseen
                .as_ref()
                .map_or(LoopbackClients::Skipped, Unseen::loopback_clients),
        );
        let tee_to = |fd| (!args.no_tee).then(|| tee::terminal(fd));
        let pipes = [
            (tee::Stream::Stdout, spawned.stdout, tee_to(1)),
            (tee::Stream::Stderr, spawned.stderr, tee_to(2)),
        ]
        .into_iter()
        .filter_map(|(stream, fd, term)| Some((stream, fd?, term)))
        .collect();
        let readers = tee::spawn_log_threads(pipes, &shared, &log_tx).map_err(|e| {
            anyhow::anyhow!(
                "cannot start a thread to read the server's output: {e}{}",
                sglang_probes::sync::start_hint(&e)
            )
        })?;
        Ok(Watch {
            readers,
            log_rx,
            exit_rx: spawned.exit,
            shared,
            sentinel,
            exclude,
            unseen,
        })
    }
}

/// Per-rank startup progress ("main" for unprefixed lines), for timings, timeout diagnoses and
/// the readiness of a node that serves no API.
#[derive(Debug, Default)]
struct RankProgress {
    last: Option<(PhaseName, f64)>,
    begun: HashMap<Stage, f64>,
}

/// What the log told us, and what the run has set up around the server.
struct Supervision {
    args: RunArgs,
    events: Arc<Events>,
    pid: i32,
    url: HttpUrl,
    /// Where `url` was read: a log that says the server listens elsewhere is a clear warning
    /// where it came from SGLang's default, not from the command.
    url_from: readiness::AddressFrom,
    node: Node,
    machine: Machine,
    http_up_at: Option<f64>,
    /// When the server became ready (readiness confirmed by a request of ours).
    ready_at: Option<f64>,
    /// The server logged its ready line, which SGLang writes once its warm-up is done.
    ready_line_read: bool,
    fatal: Option<(FatalReason, String)>,
    last_traceback: Option<String>,
    ranks: BTreeMap<String, RankProgress>,
    seen_warnings: HashSet<String>,
    seen_deprecations: HashSet<String>,
    warnings_suppressed: u64,
    worker_deaths: u32,
    check_tx: mpsc::UnboundedSender<Result<&'static str, String>>,
    check_rx: Option<mpsc::UnboundedReceiver<Result<&'static str, String>>>,
    /// The `--on-ready` command's exit, when it comes while the server runs.
    on_ready_tx: mpsc::UnboundedSender<ExitStatus>,
    on_ready_rx: Option<mpsc::UnboundedReceiver<ExitStatus>>,
    metrics: Arc<exporters::Shared>,
    exclude: Vec<i32>,
    /// `enable_metrics` from the resolved args: whether the server has a `/metrics` to re-expose.
    upstream_metrics: Option<bool>,
    /// Where the start's time goes: phase marks, JIT seconds per stage.
    startup: Arc<StartupProfile>,
    /// The generation requests the run's measuring misses, where it misses some (the proxy, a
    /// tap on one interface).
    unseen: Option<Unseen>,
}

impl Supervision {
    #[allow(clippy::too_many_arguments)]
    fn new(
        args: RunArgs,
        events: Arc<Events>,
        pid: i32,
        url: HttpUrl,
        node: Node,
        services: &Services,
        watch: &mut Watch,
        t0: Instant,
    ) -> Self {
        let (check_tx, check_rx) = mpsc::unbounded_channel();
        let (on_ready_tx, on_ready_rx) = mpsc::unbounded_channel();
        let machine = Machine::new(
            Settings {
                pid,
                grace: args.grace,
                signal_group: args.signal_group,
                poll_from_start: args.ready_on == ReadyOn::Http,
                node,
                ready_deadline: t0 + args.ready_timeout,
            },
            Instant::now(),
        );
        if let Some((rank, nnodes)) = node.multi() {
            tracing::info!("node rank {rank} of {nnodes}");
        }
        let unseen = watch.unseen.take();
        Supervision {
            args,
            events,
            pid,
            url,
            url_from: services.url_from,
            node,
            machine,
            http_up_at: None,
            ready_at: None,
            ready_line_read: false,
            fatal: None,
            last_traceback: None,
            ranks: BTreeMap::new(),
            seen_warnings: HashSet::new(),
            seen_deprecations: HashSet::new(),
            warnings_suppressed: 0,
            worker_deaths: 0,
            check_tx,
            check_rx: Some(check_rx),
            on_ready_tx,
            on_ready_rx: Some(on_ready_rx),
            metrics: services.metrics.clone(),
            exclude: watch.exclude.clone(),
            upstream_metrics: None,
            startup: services.startup.clone(),
            unseen,
        }
    }

    fn now_s(&self) -> f64 {
        self.events.elapsed(Instant::now())
    }

    /// Until the child exits: every input goes through the machine, its actions are carried out.
    async fn supervise(&mut self, watch: &mut Watch, mut signals: signals::Signals) -> ExitStatus {
        let mut check_rx = match self.check_rx.take() {
            Some(rx) => rx,
            None => mpsc::unbounded_channel().1,
        };
        let mut on_ready_rx = match self.on_ready_rx.take() {
            Some(rx) => rx,
            None => mpsc::unbounded_channel().1,
        };
        let actions = self.machine.tick(Instant::now());
        self.apply(actions).await;
        loop {
            let deadline = self.machine.deadline().map(tokio::time::Instant::from_std);
            let far = tokio::time::Instant::now() + Duration::from_secs(86400 * 365);
            tokio::select! {
                biased;
                st = &mut watch.exit_rx => {
                    return st.unwrap_or_else(|_| {
                        tracing::error!("lost track of the child's exit status");
                        ExitStatus::Signal(libc::SIGKILL)
                    });
                }
                Some(t) = watch.log_rx.recv() => self.on_log(t).await,
                Some(sig) = signals.rx.recv() => self.input(Input::Signal(sig)).await,
                Some(r) = check_rx.recv() => self.input(Input::Checked(r)).await,
                Some(st) = on_ready_rx.recv() => self.on_ready_finished(st),
                _ = sleep_until(deadline.unwrap_or(far)), if deadline.is_some() => {
                    let actions = self.machine.tick(Instant::now());
                    self.apply(actions).await;
                }
            }
        }
    }

    async fn input(&mut self, input: Input) {
        let actions = self.machine.on(input, Instant::now());
        self.apply(actions).await;
    }

    async fn apply(&mut self, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::Check(evidence) => self.check(evidence),
                Action::Send { dest, sig } => {
                    child::send_signal(dest, sig);
                    if sig != libc::SIGCONT {
                        tracing::info!(
                            "{} sent to the server; SIGKILL in {:?} if it is still running",
                            signal_name(sig),
                            self.args.grace
                        );
                    }
                }
                Action::KillTree { note_live } => {
                    if note_live {
                        self.machine.note_killed_live(!child::has_exited(self.pid));
                    } else if matches!(self.machine.stop(), Some(Stop::Requested(_))) {
                        tracing::warn!("SIGKILL to the whole process tree");
                    }
                    child::kill_tree(self.pid, &self.exclude, Duration::ZERO).await;
                }
                Action::BecomeReady => self.become_ready(),
                Action::ReadyTimedOut => self.on_ready_timeout(),
                Action::Unconfirmed(why) => tracing::warn!(
                    "the log says ready but HTTP does not confirm it ({why}); polling /health"
                ),
                Action::Emit(ev) => self.events.emit(ev),
            }
        }
    }

    fn check(&self, evidence: Evidence) {
        let (url, tx) = (self.url.clone(), self.check_tx.clone());
        tokio::spawn(async move {
            let _ = tx.send(readiness::check(&url, evidence).await);
        });
    }

    async fn on_log(&mut self, t: Timed) {
        let at = self.events.elapsed(t.at);
        match t.event {
            LogEvent::Ready => {
                self.ready_line_read = true;
                if let Some(u) = &mut self.unseen {
                    u.ready_line();
                }
                self.input(Input::ReadyLine).await
            }
            LogEvent::ServerArgs(args) => {
                self.startup.mark("server_args", at);
                let mut info = args_info(&args);
                if let Some((rank, nnodes)) = self.node.multi() {
                    info.push(("node_rank".into(), rank.to_string()));
                    info.push(("nnodes".into(), nnodes.to_string()));
                }
                self.metrics.update(|st| st.args_info = info);
                self.upstream_metrics = args.get("enable_metrics").and_then(Value::as_bool);
                let size =
                    |k: &str| args.get(k).and_then(Value::as_u64).unwrap_or(1).max(1) as usize;
                if let Some(sampler) = self.metrics.sampler() {
                    // A node of a multi-node launch drives its share of the GPUs.
                    let nnodes = self.node.nnodes.max(1) as usize;
                    let gpus = size("tp_size") * size("pp_size");
                    sampler.set_expected_gpus((gpus / nnodes).max(1));
                }
                if let Some(u) = &mut self.unseen {
                    u.server_args(&args);
                }
                self.events.emit(Event::ServerArgs { args });
            }
            LogEvent::Deprecation {
                flag,
                replacement,
                message,
            } => {
                if self.seen_deprecations.insert(message.clone()) {
                    tracing::warn!("deprecated: {message}");
                    self.events.emit(Event::Deprecation {
                        flag,
                        replacement,
                        message,
                    });
                }
            }
            LogEvent::Warning { message } => self.warn(message),
            LogEvent::Phase {
                name,
                rank,
                reported_s,
                detail,
            } => self.on_phase(name, rank, reported_s, detail, at).await,
            // Batches and retractions are folded into `Shared::batches`/`series` by the
            // readers; none arrive here.
            LogEvent::Batch { .. } | LogEvent::Retraction { .. } => {}
            LogEvent::Traceback { excerpt } => self.last_traceback = Some(excerpt),
            LogEvent::ServerProcess => self.worker_replaced(),
            LogEvent::WorkerDied { line } => {
                self.worker_replaced();
                self.worker_deaths += 1;
                self.warn(line.clone());
                if self.worker_deaths >= WORKER_DEATHS_FATAL && !self.machine.is_ready() {
                    let excerpt = format!(
                        "{line}\nuvicorn keeps killing tokenizer workers that miss its health check \
                         (SGLANG_UVICORN_WORKER_HEALTHCHECK_TIMEOUT, default 10 s; a worker needs 20-35 s to \
                         import sglang). Set SGLANG_UVICORN_WORKER_HEALTHCHECK_TIMEOUT=180 in the server's environment."
                    );
                    self.on_fatal(FatalReason::UvicornWorkerDied, None, excerpt)
                        .await;
                }
            }
            LogEvent::Fatal {
                reason,
                rank,
                excerpt,
            } => self.on_fatal(reason, rank, excerpt).await,
            LogEvent::Client { addr } => self.on_client(addr),
        }
    }

    /// A worker process began or was lost: once the server is ready, the one uvicorn starts in
    /// its place warms itself up from loopback again, after the loopback count began.
    fn worker_replaced(&mut self) {
        if let Some(u) = self.unseen.as_mut().filter(|_| self.ready_line_read) {
            u.loopback_off(Uncounted::WorkerAgain);
        }
    }

    /// The server's log says uvicorn listens on `port`, not on the port measured. With a port
    /// from the command, a router in front of the server: the log logs the router's requests
    /// from loopback, none of which went around the proxy. With SGLang's default, the command
    /// gives its port in a way not read (a script, a variable, `--config`): the run checks
    /// readiness and measures at the wrong port, and the user is told how to name it.
    fn server_elsewhere(&mut self, port: u16) {
        if let Some(u) = &mut self.unseen {
            u.loopback_off(Uncounted::OtherPort {
                logged: port,
                measured: self.url.port,
            });
        }
        if self.url_from == readiness::AddressFrom::DefaultPort {
            let (host, at) = (&self.url.host, self.url.base());
            self.warn_ours(format!(
                "the server's log says it listens on port {port}, but this run checks readiness \
                 and measures at {at}, SGLang's default: no --port could be read from the \
                 command (a script, a variable or --config sets it). Pass --health-url \
                 http://{host}:{port}, or --upstream http://{host}:{port} with --proxy-addr or \
                 --tap"
            ));
        }
    }

    /// A generation request in the server's access log: one this run cannot measure when its
    /// route is one the run's measuring misses (a tap on `lo` copies only this machine's own
    /// traffic, one on another interface misses it, the proxy sees only what is sent to it).
    /// The first is said at once, the count at the end ([`Self::teardown`]).
    fn on_client(&mut self, addr: std::net::IpAddr) {
        if let Some(message) = self.unseen.as_mut().and_then(|u| u.request(addr)) {
            self.warn_ours(message);
        }
    }

    /// A tap that read no segment of the port measured nothing: the report says why, not only
    /// with an empty table. On `lo` or `any` our own readiness request to that port crossed it,
    /// so the server's traffic went elsewhere; a named interface sees only clients on other
    /// hosts (this machine's own traffic to it goes over `lo`), and none came, or it is down.
    fn after_tap(&mut self, read: Option<TapRead>) {
        let Some(TapRead {
            port,
            iface,
            segments: 0,
        }) = read
        else {
            return;
        };
        // A run never ready had no requests to measure.
        if self.ready_at.is_none() || self.node.serves_no_api() {
            return;
        }
        let why = match iface.as_str() {
            "lo" | "any" if port == self.url.port => "not even the supervisor's own readiness request: the server's traffic crosses another interface (--tap-interface any takes every one)",
            "lo" | "any" => return, // readiness was read from another port: nothing proven
            _ if is_down(&iface) => "the interface is down (clients on this machine reach the server over lo; --tap-interface any takes every interface)",
            _ => "no client on another host sent a request over it (clients on this machine reach the server over lo; --tap-interface any takes every interface)",
        };
        let message = format!(
            "--tap read no packet of port {port} on interface {iface:?} over the whole run, so no request was measured: {why}"
        );
        self.warn_ours(message);
    }

    /// A warning of the supervisor's own: on the console too, where the server's warnings
    /// ([`Self::warn`]) already are, in its log.
    fn warn_ours(&mut self, message: String) {
        tracing::warn!("{message}");
        self.warn(message);
    }

    fn warn(&mut self, message: String) {
        if self.seen_warnings.contains(&message) {
            return;
        }
        if self.seen_warnings.len() >= MAX_WARNING_EVENTS {
            self.warnings_suppressed += 1;
            return;
        }
        self.events.emit(Event::Warning {
            message: message.clone(),
        });
        self.seen_warnings.insert(message);
    }

    async fn on_phase(
        &mut self,
        name: PhaseName,
        rank: Option<String>,
        reported_s: Option<f64>,
        detail: Option<String>,
        at: f64,
    ) {
        self.startup.mark(name.as_str(), at);
        let key = rank.clone().unwrap_or_else(|| "main".into());
        let progress = self.ranks.entry(key).or_default();
        progress.last = Some((name, at));
        let (mut duration_s, mut jit_s) = (None, None);
        if let Some(stage) = name.begins() {
            progress.begun.insert(stage, at);
        } else if let Some(stage) = name.ends() {
            let begun = progress.begun.get(&stage).copied();
            jit_s = begun.map(|b| round_ms(self.startup.jit_within(b, at)));
            let measured = begun.map(|b| at - b);
            if let Some(d) = reported_s.or(measured) {
                duration_s = Some(round_ms(d));
                // Across ranks the slowest one is what the server waited for.
                let base = stage.as_str();
                self.metrics
                    .update(|st| match st.phases.iter_mut().find(|(p, _)| p == base) {
                        Some((_, v)) => *v = v.max(round_ms(d)),
                        None => st.phases.push((base.to_string(), round_ms(d))),
                    });
            }
            // SGLang logs no "memory pool begin": the pool is built right after the weights load.
            if stage == Stage::LoadWeights {
                progress.begun.insert(Stage::MemoryPool, at);
            }
        }
        if name == PhaseName::HttpUp {
            self.http_up_at = Some(at);
            let logged = detail.as_deref().and_then(|u| HttpUrl::parse(u).ok());
            if let Some(HttpUrl { port, .. }) = logged.filter(|l| l.port != self.url.port) {
                self.server_elsewhere(port);
            }
        }
        self.events.emit(Event::Phase {
            name,
            rank,
            elapsed_s: at,
            duration_s,
            detail,
            jit_s,
        });
        if self.node.serves_no_api() {
            let last: BTreeMap<String, PhaseName> = self
                .ranks
                .iter()
                .filter_map(|(r, p)| p.last.map(|(n, _)| (r.clone(), n)))
                .collect();
            if readiness::ranks_settled(&last) {
                self.input(Input::RanksSettled).await;
            }
        }
    }

    async fn on_fatal(&mut self, reason: FatalReason, rank: Option<String>, excerpt: String) {
        // While a stop is under way, crash reports are the stop's own echo (SIGINT makes SGLang
        // report its detokenizer "crashed with -9"): keep them, but as warnings.
        if self.machine.requested() {
            self.warn(excerpt);
            return;
        }
        self.events.emit(Event::Fatal {
            reason,
            rank: rank.clone(),
            excerpt: excerpt.clone(),
        });
        if self.fatal.is_none() {
            self.fatal = Some((reason, excerpt.clone()));
        }
        if self.machine.is_ready() || self.machine.stop().is_some() {
            tracing::error!(%reason, rank = rank.as_deref(), "fatal: {excerpt}");
            return;
        }
        tracing::error!(
            %reason,
            rank = rank.as_deref(),
            "fatal before readiness, stopping the server:\n{excerpt}"
        );
        self.input(Input::Fatal).await;
    }

    fn on_ready_timeout(&mut self) {
        let now = self.now_s();
        let mut parts: Vec<String> = self
            .ranks
            .iter()
            .filter_map(|(rank, p)| {
                p.last
                    .map(|(name, at)| format!("{rank} {} {}", name.describe_stop(), ago(now - at)))
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
        self.events.emit(Event::Fatal {
            reason: FatalReason::ReadyTimeout,
            rank: None,
            excerpt: excerpt.clone(),
        });
        self.fatal = Some((FatalReason::ReadyTimeout, excerpt));
    }

    fn become_ready(&mut self) {
        let at = self.now_s();
        self.ready_at = Some(at);
        self.metrics.update(|st| {
            st.state = "ready";
            st.ready_seconds = Some(at);
        });
        if !self.node.serves_no_api() {
            // The version and the server's own view of its args, for the report (one cheap
            // request). After the ready line, its access line also tells the log parsers that
            // the warm-up is logged: ready by HTTP alone may be before it (an older SGLang's
            // /health answers 200 at once), and then it is the plain request, which starts
            // no count of loopback clients.
            let path = match self.ready_line_read {
                true => AFTER_READY,
                false => "/server_info",
            };
            let (info_url, ev) = (self.url.with_path(path), self.events.clone());
            tokio::spawn(async move {
                if let Ok((200, body)) =
                    sglang_probes::http::get_body(&info_url, INFO_TIMEOUT, 4 << 20).await
                {
                    if let Ok(Value::Object(m)) = serde_json::from_slice::<Value>(&body) {
                        let pick = |k: &str| m.get(k).cloned().unwrap_or(Value::Null);
                        ev.emit(Event::ServerInfo {
                            version: pick("version"),
                            max_total_num_tokens: pick("max_total_num_tokens"),
                        });
                    }
                }
            });
        }
        if self.upstream_metrics != Some(false) && !self.node.serves_no_api() {
            // fetched by our own scrapes, when there are any: never on a timer of ours
            self.metrics
                .fetch_upstream_from(Some(self.url.with_path("/metrics")));
        }
        if let Some(up) = self.http_up_at {
            self.metrics
                .update(|st| st.phases.push(("warmup".into(), round_ms(at - up))));
            self.events.emit(Event::Phase {
                name: PhaseName::Warmup,
                rank: None,
                elapsed_s: at,
                duration_s: Some(round_ms(at - up)),
                detail: None,
                jit_s: Some(round_ms(self.startup.jit_within(up, at))),
            });
        }
        self.startup.mark("ready", at);
        self.finish_startup_profile(at);
        let multi = self.node.multi();
        self.events.emit(Event::Ready {
            elapsed_s: at,
            url: self.url.base(),
            node_rank: multi.map(|m| m.0),
            nnodes: multi.map(|m| m.1),
        });
        match multi {
            Some((rank, n)) => tracing::info!(
                "server ready after {at:.3} s at {} (node rank {rank} of {n})",
                self.url.base()
            ),
            None => tracing::info!("server ready after {at:.3} s at {}", self.url.base()),
        }
        if let Some(cmd) = self.args.on_ready.clone() {
            if let Err(e) = run_on_ready(&cmd, self.on_ready_tx.clone()) {
                self.warn_ours(format!(
                    "the --on-ready command could not start ({e}): {cmd}"
                ));
            }
        }
    }

    /// The `--on-ready` command (often the benchmark) ended while the server ran: a failure is a
    /// warning of the run, in its events and report, not only a line on the console.
    fn on_ready_finished(&mut self, st: ExitStatus) {
        let cmd = self.args.on_ready.clone().unwrap_or_default();
        if st == ExitStatus::Code(0) {
            tracing::info!("the --on-ready command finished (exit code 0)");
        } else {
            let how = describe_status(st);
            self.warn_ours(format!("the --on-ready command failed ({how}): {cmd}"));
        }
    }

    /// The start-up profile, once: at readiness, or at the exit of a server never ready.
    fn finish_startup_profile(&self, at: f64) {
        if let Some(p) = self.startup.finish(at) {
            self.events.emit(Event::StartupProfile(Event::object(p)));
        }
    }

    /// The child exited without a stop of ours: say why, from what it printed.
    fn diagnose_exit(&mut self, status: ExitStatus, shared: &Shared) {
        if self.machine.stop().is_some() || self.fatal.is_some() {
            return;
        }
        let ready = self.machine.is_ready();
        if ready && status == ExitStatus::Code(0) {
            return;
        }
        let reason = if ready {
            FatalReason::Exited
        } else {
            FatalReason::ExitedBeforeReady
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
            if ready {
                "after readiness"
            } else {
                "before it was ready"
            }
        );
        tracing::error!("{excerpt}");
        self.events.emit(Event::Fatal {
            reason,
            rank: None,
            excerpt,
        });
    }

    /// After the child's exit: the rest of the tree, the readers, the measurements, the last
    /// events and the report.
    async fn teardown(
        mut self,
        status: ExitStatus,
        mut watch: Watch,
        sampler: Option<sglang_probes::sampler::Sampler>,
    ) -> Result<i32> {
        let exited_at = Instant::now();
        // a dead server's series are not re-exposed, nor its port asked for them
        self.metrics.fetch_upstream_from(None);
        // The main process is gone: whatever it leaves behind goes too, at once.
        let leftover = child::kill_tree(self.pid, &watch.exclude, KILL_WAIT).await;
        let stats = join_readers(std::mem::take(&mut watch.readers)).await;
        while let Ok(t) = watch.log_rx.try_recv() {
            self.on_log(t).await;
        }
        if let Some(total) = self.unseen.as_ref().and_then(Unseen::total) {
            self.warn_ours(total);
        }
        if !leftover.is_empty() {
            self.events.emit(Event::Leftover {
                pids: leftover.clone(),
            });
            tracing::error!(?leftover, "processes of the server tree survived SIGKILL");
        }
        self.diagnose_exit(status, &watch.shared);
        self.finish_startup_profile(self.events.elapsed(exited_at));
        if watch.shared.series.seen() {
            let batches = watch.shared.series.summary();
            self.events
                .emit(Event::ServerBatches(Event::object(batches)));
        }
        self.record_windows(sampler).await;
        let requested = self.machine.requested();
        let exit_status = self.machine.exit_status(status.shell_code());
        let (code, signal) = match status {
            ExitStatus::Code(c) => (Some(c), None),
            ExitStatus::Signal(n) => (None, Some(n)),
        };
        self.metrics.update(|st| {
            st.state = if requested || status == ExitStatus::Code(0) {
                "exited"
            } else {
                "failed"
            };
            st.exit_code = Some(i64::from(exit_status));
        });
        let log = self.log_summary(&watch.shared, &stats);
        self.events.emit(Event::Exited {
            code,
            signal,
            elapsed_s: self.events.elapsed(exited_at),
            requested,
            exit_status,
            log,
            supervisor_pid: Some(std::process::id()),
        });
        tracing::info!(?status, exit_status, requested, "server exited");
        write_report(&self.args, &self.events);
        if let Some(sen) = watch.sentinel.take() {
            sen.disarm().await;
        }
        Ok(exit_status)
    }

    /// The whole run's request figures (the traffic window's and `requests_summary`), the GPU
    /// teardown check and the power window.
    async fn record_windows(&mut self, sampler: Option<sglang_probes::sampler::Sampler>) {
        let requests = self
            .metrics
            .requests()
            .and_then(|r| r.run_summary(sampler.as_ref().map(|s| s.gpu_count())));
        if self.args.window_from_proxy {
            let power = sampler
                .as_ref()
                .and_then(|smp| smp.handle().traffic_close());
            if power.is_some() || requests.is_some() {
                let mut w = Map::new();
                w.insert("name".into(), json!("proxy-traffic"));
                if let Some(p) = power.and_then(|p| serde_json::to_value(p).ok()) {
                    w.insert("power".into(), p);
                }
                if let Some(r) = &requests {
                    w.insert("requests".into(), r.clone());
                }
                self.events.emit(Event::Window(w));
            }
        }
        if let Some(summary) = requests {
            self.events
                .emit(Event::RequestsSummary(Event::object(summary)));
        }
        if let Some(sampler) = sampler {
            // Blocking driver calls and a bounded wait: off the async threads.
            let done = sglang_probes::sync::off_runtime(move || {
                let teardown = crate::gpu::teardown_check(&sampler, GPU_RELEASE_WAIT);
                (teardown, sampler.stop())
            })
            .await;
            if let Some((teardown, window)) = done {
                if teardown["clean"] == false {
                    tracing::error!("GPU memory still held after the server exited: {teardown}");
                }
                self.events
                    .emit(Event::GpuTeardown(Event::object(teardown)));
                match serde_json::to_value(&window) {
                    Ok(v) => self.events.emit(Event::Power(Event::object(v))),
                    Err(e) => tracing::error!("cannot serialise the power window: {e}"),
                }
            }
        }
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
        if let Some(e) = &log.error {
            tracing::error!(
                "{e}: {} bytes of the server's output are missing from the log file (see the \
                 exited event's log)",
                log.lost
            );
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

/// Waits for the log threads in order: the readers, then the parser thread, which ends once it
/// has parsed every read they handed it. So when this returns, every event is in `log_rx`.
/// Polled rather than joined on a thread: that thread could be refused, and a reader whose pipe a
/// process outside the tree holds open never ends.
async fn join_readers(readers: Vec<std::thread::JoinHandle<StreamStats>>) -> Vec<StreamStats> {
    let end = tokio::time::Instant::now() + DRAIN_TIMEOUT;
    let mut stats = Vec::with_capacity(readers.len());
    for r in readers {
        while !r.is_finished() {
            if tokio::time::Instant::now() >= end {
                tracing::warn!("the child's output pipes are still open (a process outside the tree holds them); not waiting further");
                return Vec::new();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stats.extend(r.join().ok());
    }
    stats
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

/// Starts `sh -c CMD`; its exit goes to `done`.
fn run_on_ready(cmd: &str, done: mpsc::UnboundedSender<ExitStatus>) -> Result<(), String> {
    let argv: Vec<OsString> = vec!["sh".into(), "-c".into(), cmd.into()];
    match child::spawn(
        SpawnSpec {
            argv: &argv,
            new_process_group: false,
            die_with_parent: false,
            stdin: Stdio::null(),
            stdout: Stdio::inherit(),
            stderr: Stdio::inherit(),
        },
        &[],
    ) {
        Ok(s) => {
            tokio::spawn(async move {
                if let Ok(st) = s.exit.await {
                    let _ = done.send(st);
                }
            });
            Ok(())
        }
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_servers_flags_are_read_from_its_launch_not_from_a_wrapper_in_front_of_it() {
        let words = |v: &[&str]| server_words(&v.iter().map(OsString::from).collect::<Vec<_>>());
        let wrapped = [
            "mpirun",
            "--host",
            "n1,n2",
            "python3",
            "-m",
            "sglang.launch_server",
            "--port",
            "8000",
        ];
        assert_eq!(words(&wrapped), ["--port", "8000"]);
        let (url, from) = readiness::server_url(&words(&wrapped), None).unwrap();
        assert_eq!(
            (url.base(), from),
            ("http://127.0.0.1:8000".into(), readiness::AddressFrom::Port)
        );
        let node = Node::from_argv(&words(&[
            "torchrun",
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "sglang",
            "serve",
            "--tp",
            "8",
        ]));
        assert_eq!(node, Node::default());
        // no launch to be seen (a script, another server): all of the command
        assert_eq!(
            words(&["./serve.sh", "--port", "1"]),
            ["./serve.sh", "--port", "1"]
        );
    }

    /// `run -- bash recipe.sh` (InferenceX's shape): the port is the script's, which the run
    /// does not take (bash may make another of it), but says at start, with what to pass.
    #[test]
    fn a_port_set_where_the_run_does_not_read_it_is_named_at_start_with_the_flag_to_pass() {
        let dir = std::env::temp_dir().join(format!("sglsup-script-port-{}", std::process::id()));
        let url = HttpUrl::parse("http://127.0.0.1:30000").unwrap();
        let said = |script: &str| port_not_read(&["bash".into(), recipe(&dir, script)], &url);
        assert_eq!(
            said("PORT=${PORT:-8888}\npython3 -m sglang.launch_server --port=$PORT &\n").unwrap(),
            "the script COMMAND runs launches the server with --port $PORT, which this run does \
             not read from a script: it checks readiness and measures at http://127.0.0.1:30000, \
             SGLang's default. Pass --health-url http://127.0.0.1:PORT, or --upstream with \
             --proxy-addr or --tap"
        );
        assert!(said("sglang serve --port 8888\n").unwrap().contains(
            "--port 8888, which this run does not read from a script: it checks \
                       readiness and measures at http://127.0.0.1:30000, SGLang's default. Pass \
                       --health-url http://127.0.0.1:8888,"
        ));
        assert_eq!(said("sglang serve --tp 8\n"), None);
        assert_eq!(said("sglang serve --port 30000\n"), None);
        // a --config file may set it, in a script or in COMMAND itself
        let config = "the server's --config c.yaml may set its port, which this run does not \
                      read: it checks readiness and measures at http://127.0.0.1:30000, SGLang's \
                      default. If the file sets another, pass --health-url \
                      http://127.0.0.1:PORT, or --upstream with --proxy-addr or --tap";
        assert_eq!(said("sglang serve --config c.yaml\n").unwrap(), config);
        let direct: Vec<OsString> = ["sglang", "serve", "--config", "c.yaml"]
            .map(OsString::from)
            .to_vec();
        assert_eq!(port_not_read(&direct, &url).unwrap(), config);
        // a launch COMMAND runs itself gives its --port, read: nothing to say
        let direct: Vec<OsString> = ["sglang", "serve", "--tp", "8"]
            .map(OsString::from)
            .to_vec();
        assert_eq!(port_not_read(&direct, &url), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// `dir`/r.sh holding `script`, `dir` made where missing.
    fn recipe(dir: &Path, script: &str) -> OsString {
        std::fs::create_dir_all(dir).unwrap();
        let path = dir.join("r.sh");
        std::fs::write(&path, script).unwrap();
        path.into()
    }

    #[test]
    fn an_api_key_written_in_the_servers_script_is_a_secret_as_one_on_the_command_line() {
        let dir = std::env::temp_dir().join(format!("sglsup-script-key-{}", std::process::id()));
        let recipe = recipe(
            &dir,
            "python3 -m sglang.launch_server --api-key sk-in-the-recipe --port 8000 &\n",
        );
        let recipe = std::path::PathBuf::from(recipe);
        let argv = [
            "sglang-supervisor",
            "run",
            "--",
            "bash",
            recipe.to_str().unwrap(),
        ];
        let crate::cli::Command::Run(args) = crate::cli::parse_from(argv).unwrap().command else {
            panic!("not a run")
        };
        let (command, secrets) = command_and_secrets(&args);
        assert_eq!(command, ["bash", recipe.to_str().unwrap()]);
        assert_eq!(
            &*secrets.redact(b"server_args=ServerArgs(api_key='sk-in-the-recipe')"),
            b"server_args=ServerArgs(api_key='<redacted>')"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn ago_reads_naturally() {
        assert_eq!(ago(14.0 * 60.0 + 3.0), "14m ago");
        assert_eq!(ago(3.0), "3s ago");
    }

    #[test]
    fn a_fifo_with_no_reader_is_an_error_not_a_hang() {
        let dir = std::env::temp_dir().join(format!("sglsup-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("log");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo on a fresh path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = create(&fifo, "log file").unwrap_err().to_string();
        assert!(err.contains("FIFO with no reader"), "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn an_unwritable_report_path_is_refused_up_front() {
        assert!(check_writable(Path::new("/sys/kernel/r.json"), "report").is_err());
        assert!(check_writable(&std::env::temp_dir(), "report").is_err());
        assert!(check_writable(Path::new("/nonexistent-dir/r.json"), "report").is_err());
        assert!(check_writable(&std::env::temp_dir().join("r.json"), "report").is_ok());
    }
}
