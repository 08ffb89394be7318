use sglang_probes::sync::THREAD_LIMIT_HINT;
use sglang_supervisor::cli::{self, Command, LogFormat};
use sglang_supervisor::logs::tee::{terminal, StderrWriter};
use sglang_supervisor::{compare, flags, gpu, lifecycle, report, rlimits, sentinel, wait};
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

/// The supervisor's own failures (bad options included) exit 125, so they never look like the
/// server's own exit status.
const EXIT_SUPERVISOR_FAILED: u8 = sglang_supervisor::exit::SUPERVISOR_FAILED as u8;

fn main() -> ExitCode {
    let cli = match cli::parse() {
        Ok(c) => c,
        Err(e) if e.use_stderr() => {
            eprintln!(
                "sglang-supervisor: error: {} (see --help)",
                cli::error_line(&e)
            );
            return ExitCode::from(EXIT_SUPERVISOR_FAILED);
        }
        Err(e) => {
            // --help, --version
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
    };
    init_tracing(cli.log_format);
    rlimits::raise_nofile();
    let code = dispatch(cli.command);
    flush_terminal();
    code
}

/// What is still queued for the terminal goes out now, unless the terminal is stalled.
fn flush_terminal() {
    for fd in [1, 2] {
        terminal(fd).flush(Duration::from_secs(2));
    }
}

fn dispatch(command: Command) -> ExitCode {
    if !matches!(command, Command::Run(_) | Command::Sentinel { .. }) {
        // Commands that print a result end quietly when their reader goes away (`| head`), as
        // Unix tools do; `run` keeps ignoring SIGPIPE, a closed terminal must not stop a server.
        // SAFETY: restoring a default disposition before any thread is started.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    match command {
        Command::Completions { shell } => match cli::print_completions(shell) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(e),
        },
        Command::Man => match cli::print_man_page() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(e),
        },
        Command::Sentinel { marker } => ExitCode::from(sentinel::sentinel_main(&marker) as u8),
        Command::Flags(cmd) => match flags::command(&cmd) {
            Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
            Err(e) => fail(e),
        },
        Command::Compare(args) => match compare::command(&args) {
            Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
            Err(e) => fail(e),
        },
        Command::Report(args) => match report::command(&args) {
            Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
            Err(e) => fail(e),
        },
        Command::Wait(args) => {
            // A current-thread runtime starts no thread: nothing for the OS to refuse at its build.
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => return fail(anyhow::anyhow!("cannot start the async runtime: {e}")),
            };
            match rt.block_on(wait::run(&args)) {
                Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
                Err(e) => fail(e),
            }
        }
        Command::Probe(args) => match gpu::probe_command(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(e),
        },
        Command::Run(args) => {
            if let Err(e) = lifecycle::check_listen_addrs(&args) {
                lifecycle::record_not_started(&args, None, &e);
                return fail(e);
            }
            flags::bound_python(args.preflight_timeout);
            let found = match lifecycle::preflight_unless_stopped(&args) {
                Ok(found) => found,
                Err(sig) => {
                    let code = lifecycle::record_stopped_before_start(&args, sig);
                    flush_terminal();
                    eprintln!(
                        "sglang-supervisor: stopped by {} during the pre-flight; the server was not started",
                        lifecycle::signal_name(sig)
                    );
                    return ExitCode::from(code.clamp(0, 255) as u8);
                }
            };
            let preflight = match found {
                Ok(Some(p)) if p.reject => {
                    lifecycle::record_rejection(&args, p.event);
                    flush_terminal();
                    eprintln!("sglang-supervisor: the server's flags would fail to parse (see above); not launching. Fix them, or pass --no-preflight");
                    return ExitCode::from(sglang_supervisor::exit::PREFLIGHT_REJECTED as u8);
                }
                Ok(p) => p.map(|p| p.event),
                Err(e) => {
                    // A pre-flight that could not run (a --flags-schema that cannot be read, an
                    // import past --preflight-timeout) still ends the run with its terminal events.
                    lifecycle::record_not_started(&args, None, &e);
                    return fail(e);
                }
            };
            let threads = runtime_threads();
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(threads).enable_all();
            // One more than the workers: the build runs on a thread of its own (`build_runtime`).
            let rt = match threads_available(threads + 1).and_then(|()| build_runtime(builder)) {
                Ok(rt) => rt,
                Err(e) => {
                    lifecycle::record_not_started(&args, preflight, &e);
                    return fail(e);
                }
            };
            // block_on runs `run` on this (main) thread, which spawns the child: PDEATHSIG is tied
            // to the spawning thread, and this one lives until we exit.
            match rt.block_on(lifecycle::run(*args, preflight)) {
                Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
                Err(e) => fail(e),
            }
        }
    }
}

/// Whether the OS gives `n` more threads now: tokio's runtime, refused one of its workers, panics
/// and then waits forever for the ones it started, so that is found out before.
fn threads_available(n: usize) -> anyhow::Result<()> {
    // Each waits for the gate, so all `n` exist at once, as the runtime's workers will.
    let gate = std::sync::Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
    let mut started = Vec::with_capacity(n);
    let mut refused = None;
    for _ in 0..n {
        let g = gate.clone();
        let spawned = std::thread::Builder::new().spawn(move || {
            let (open, cv) = &*g;
            let mut o = sglang_probes::sync::lock(open);
            while !*o {
                o = cv
                    .wait(o)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        });
        match spawned {
            Ok(t) => started.push(t),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    *sglang_probes::sync::lock(&gate.0) = true;
    gate.1.notify_all();
    started.into_iter().for_each(|t| drop(t.join()));
    match refused {
        None => Ok(()),
        Some(e) => Err(anyhow::anyhow!(
            "cannot start the supervisor's threads: {e}{THREAD_LIMIT_HINT}"
        )),
    }
}

/// tokio panics when the OS refuses it a thread (the limit on processes and threads reached),
/// then, unwinding, waits forever for the workers it did start: the build runs on a thread of its
/// own, whose panic is reported here by the hook (it runs before the unwinding), so the run ends
/// with an error instead of hanging (a refusal the pre-check could not see: the count of the
/// user's tasks changed in between).
fn build_runtime(mut builder: tokio::runtime::Builder) -> anyhow::Result<tokio::runtime::Runtime> {
    build_off_thread(move || builder.build())
}

/// Runs `build` on a thread of its own and returns what it built, or why it failed or panicked,
/// without waiting for that thread to finish unwinding (tokio's may never).
fn build_off_thread<T: Send + 'static>(
    build: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    const BUILDER: &str = "runtime-build";
    let (tx, rx) = std::sync::mpsc::sync_channel::<Result<T, String>>(1);
    // The hook is the process's: a panic of any other thread goes on to the hook there was.
    let previous = std::sync::Arc::new(std::panic::take_hook());
    let others = previous.clone();
    let panicked = tx.clone();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().name() != Some(BUILDER) {
            return others(info);
        }
        let why = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("a thread could not be started");
        let _ = panicked.try_send(Err(why.to_string()));
    }));
    let spawned = std::thread::Builder::new()
        .name(BUILDER.into())
        .spawn(move || {
            let _ = tx.send(build().map_err(|e| e.to_string()));
        });
    let built = match spawned {
        Ok(_) => rx
            .recv()
            .unwrap_or_else(|_| Err("the async runtime could not be built".into())),
        Err(e) => Err(e.to_string()),
    };
    // Ours is dropped first, so the hook there was is had back whole.
    drop(std::panic::take_hook());
    match std::sync::Arc::try_unwrap(previous) {
        Ok(hook) => std::panic::set_hook(hook),
        Err(shared) => std::panic::set_hook(Box::new(move |info| shared(info))),
    }
    built.map_err(|why| anyhow::anyhow!("cannot start the async runtime: {why}{THREAD_LIMIT_HINT}"))
}

fn fail(e: anyhow::Error) -> ExitCode {
    // Our queued messages first, so the error is the last line.
    flush_terminal();
    eprintln!("sglang-supervisor: error: {e:#}");
    ExitCode::from(EXIT_SUPERVISOR_FAILED)
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only for a person at a terminal who did not ask for none (https://no-color.org).
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(|| StderrWriter)
        .with_target(false);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// Async worker threads: two. The proxy's connections run on threads of their own
/// (`sglang_exporters::proxy`), so what is left here (the metrics server, the lifecycle, the
/// sampler's hand-offs) never needs more, and idle workers woken to steal work cost CPU.
fn runtime_threads() -> usize {
    2
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// What tokio does when refused its second worker: it panics, and unwinding waits forever
    /// for the first (here a guard whose drop never returns).
    struct DropsNever;
    impl Drop for DropsNever {
        fn drop(&mut self) {
            loop {
                std::thread::park();
            }
        }
    }

    /// The panic hook is the process's: one of these tests at a time sets it.
    static HOOK: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn a_build_that_panics_and_never_finishes_unwinding_is_an_error_not_a_hang() {
        let _hook = HOOK
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let built = build_off_thread(|| -> std::io::Result<()> {
                let _first_worker = DropsNever;
                panic!(
                    "OS can't spawn worker thread: Resource temporarily unavailable (os error 11)"
                );
            });
            let _ = tx.send(built.map_err(|e| e.to_string()));
        });
        let err = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("build_off_thread hung while the build's thread unwound")
            .unwrap_err();
        assert!(
            err.starts_with("cannot start the async runtime: OS can't spawn worker thread"),
            "{err}"
        );
        assert!(err.contains(THREAD_LIMIT_HINT), "{err}");
    }

    #[test]
    fn another_threads_panic_during_the_build_is_not_taken_for_the_builds() {
        let _hook = HOOK
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let built = build_off_thread(|| {
            // A panic elsewhere while the build runs: its own, reported by the hook there was.
            let other = std::thread::spawn(|| panic!("an unrelated panic"));
            assert!(other.join().is_err());
            Ok(5)
        });
        assert_eq!(built.unwrap(), 5);
    }

    #[test]
    fn a_build_that_succeeds_or_fails_gives_its_value_or_its_error() {
        let _hook = HOOK
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        assert_eq!(build_off_thread(|| Ok(7)).unwrap(), 7);
        let err =
            build_off_thread(|| -> std::io::Result<()> { Err(std::io::Error::other("no epoll")) })
                .unwrap_err();
        assert!(err.to_string().contains("no epoll"), "{err}");
        let rt = build_runtime(tokio::runtime::Builder::new_current_thread()).unwrap();
        assert_eq!(rt.block_on(async { 1 + 1 }), 2);
    }
}
