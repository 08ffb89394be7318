//! Every start of a thread or a process the supervisor makes, refused in turn: the run ends with
//! a clear error (exit 125) or goes on without what was refused, never a panic or a hang; it ends
//! with its terminal event; it leaves no process; and the supervisor's own messages still reach
//! the terminal. The refusal is injected by a preloaded library (`tests/stubs/refuse_task.c`)
//! that fails the Nth `pthread_create`/`fork`/`posix_spawn` with EAGAIN, as the OS does at the
//! limit on processes and threads: deterministic where `thread_limit.rs`'s real limit depends on
//! what else the user runs at that moment.
#![allow(clippy::disallowed_methods, clippy::unwrap_used)]
mod common;
use common::*;
use std::process::Command;
use std::time::{Duration, Instant};

fn refuse_task_lib() -> &'static std::path::PathBuf {
    static LIB: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    LIB.get_or_init(|| build_stub("refuse_task.c", "librefuse_task.so"))
}

struct Outcome {
    start: usize,
    code: i32,
    spawned: bool,
    last_line: String,
}

/// One configuration to sweep: the supervisor's options, the server, the exit statuses a run
/// may end with besides 125, and whether its stdout and stderr are a terminal nobody reads.
struct Case<'a> {
    name: &'a str,
    options: &'a [&'a str],
    server: &'a [&'a str],
    ends: &'a [i32],
    terminal: Terminal,
}

/// What the supervisor's stdout and stderr are.
#[derive(PartialEq)]
enum Terminal {
    /// Pipes the test reads.
    Pipe,
    /// A pseudo-terminal nobody reads.
    Stalled,
    /// One end of a socket pair the test reads (systemd's journal stream is a socket).
    Socket,
}

/// A pseudo-terminal whose reading end is held and never read: writes to it stall once it is
/// full, as a `tmux` pane or an `ssh` session whose client is suspended does.
fn stalled_terminal() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
    use std::os::fd::FromRawFd;
    let (mut leader, mut follower) = (0, 0);
    let rc = unsafe {
        libc::openpty(
            &mut leader,
            &mut follower,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    unsafe {
        (
            std::os::fd::OwnedFd::from_raw_fd(leader),
            std::os::fd::OwnedFd::from_raw_fd(follower),
        )
    }
}

/// Runs the supervisor once per start, refusing that one, until a run makes fewer starts; checks
/// each run and returns what each did.
fn sweep(case: &Case<'_>) -> Vec<Outcome> {
    let name = case.name;
    let dir = temp_dir(name);
    let mut outcomes = Vec::new();
    for n in 1.. {
        let events = dir.join(format!("events-{n}.jsonl"));
        let note = dir.join(format!("refused-{n}"));
        let tag = format!("{name}-{}-{n}", std::process::id());
        let started = Instant::now();
        // The preload goes to the supervisor alone (through `env`), not to `timeout`.
        let mut cmd = Command::new("timeout");
        cmd.args(["-s", "KILL", "20", "env"])
            .arg(format!("LD_PRELOAD={}", refuse_task_lib().display()))
            .arg(format!("SGLSUP_REFUSE_TASK={n}"))
            .arg(format!("SGLSUP_REFUSE_NOTE={}", note.display()))
            .arg(supervisor_bin())
            .args(["run", "--grace", "1s"])
            .args(case.options)
            .arg("--events")
            .arg(&events)
            .arg("--")
            .args(case.server)
            .env("REPLAY_TAG", &tag);
        let mut _terminal_reader = None;
        let mut socket_reader = None;
        match case.terminal {
            Terminal::Pipe => {}
            Terminal::Stalled => {
                let (reader, terminal) = stalled_terminal();
                cmd.stdin(std::process::Stdio::null())
                    .stdout(terminal.try_clone().unwrap())
                    .stderr(terminal);
                _terminal_reader = Some(reader);
            }
            Terminal::Socket => {
                let (mut ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
                let theirs = std::os::fd::OwnedFd::from(theirs);
                cmd.stdin(std::process::Stdio::null())
                    .stdout(theirs.try_clone().unwrap())
                    .stderr(theirs);
                socket_reader = Some(std::thread::spawn(move || {
                    let mut text = String::new();
                    let _ = std::io::Read::read_to_string(&mut ours, &mut text);
                    text
                }));
            }
        }
        let out = cmd.output().unwrap();
        drop(cmd); // our copies of the socket's end, so its reader sees the end
        let from_socket = socket_reader.map(|r| r.join().unwrap());
        let refused = std::fs::read_to_string(&note).unwrap_or_default();
        if !refused.contains(&format!("refuse_task: refused start {n} ")) {
            // This run made fewer than n starts: every one has been refused once.
            break;
        }
        let stderr =
            from_socket.unwrap_or_else(|| String::from_utf8_lossy(&out.stderr).to_string());
        let last_line = stderr.lines().last().unwrap_or("").to_string();
        let elapsed = started.elapsed();
        let code = out.status.code();
        assert!(
            elapsed < Duration::from_secs(15) && code.is_some(),
            "{name}, start {n} refused: hung (killed after {elapsed:?}): {last_line}"
        );
        let code = code.unwrap();
        let written = std::fs::read_to_string(&events).unwrap_or_default();
        assert!(
            !stderr.contains("panicked") && !written.contains("panicked"),
            "{name}, start {n} refused: a panic: {stderr}{written}"
        );
        assert!(
            code == 125 || case.ends.contains(&code),
            "{name}, start {n} refused: exit {code}, not 125 (could not start) or one of {:?}: {stderr}",
            case.ends
        );
        assert!(
            written
                .lines()
                .last()
                .is_some_and(|l| l.contains(r#""event":"exited""#)),
            "{name}, start {n} refused: the events file does not end with `exited`: {written}"
        );
        let spawned = written.contains(r#""event":"spawned""#);
        if case.terminal != Terminal::Stalled {
            if spawned {
                // Our own messages were not lost with a refused writer thread.
                assert!(
                    stderr.contains("spawned the server"),
                    "{name}, start {n} refused: the supervisor's messages are missing: {stderr}"
                );
            }
            if code == 125 {
                assert!(
                    last_line.starts_with("sglang-supervisor: error: ")
                        && last_line.contains("the limit on processes and threads is reached"),
                    "{name}, start {n} refused: the error does not say what was refused and what to do: {last_line}"
                );
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while !tagged_processes(&tag).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(
            tagged_processes(&tag),
            Vec::<i32>::new(),
            "{name}, start {n} refused: processes outlived the run"
        );
        outcomes.push(Outcome {
            start: n,
            code,
            spawned,
            last_line,
        });
    }
    let _ = std::fs::remove_dir_all(&dir);
    let seen: Vec<_> = outcomes
        .iter()
        .map(|o| (o.start, o.code, o.spawned))
        .collect();
    eprintln!("{name}: start refused, exit status, server started: {seen:?}");
    assert!(
        outcomes.len() >= 10,
        "{name}: only {} starts seen: is the preload working?",
        outcomes.len()
    );
    outcomes
}

/// Some run of the sweep ended 125 with each of `lines` in its error line.
fn assert_refused_with(outcomes: &[Outcome], lines: &[&str]) {
    for words in lines {
        assert!(
            outcomes
                .iter()
                .any(|o| o.code == 125 && o.last_line.contains(words)),
            "no run refused with {words:?}"
        );
    }
}

/// A run with nothing but the server: ready or not within a second, no metrics, no GPUs.
const BARE: [&str; 6] = [
    "--ready-timeout",
    "1s",
    "--metrics-addr",
    "none",
    "--gpu-backend",
    "none",
];

#[test]
fn every_refused_start_of_a_bare_run_ends_it_cleanly_or_is_done_without() {
    let outcomes = sweep(&Case {
        name: "refuse-bare",
        options: &[&["--no-tee"][..], &BARE].concat(),
        server: &["sleep", "30"],
        ends: &[124],
        terminal: Terminal::Pipe,
    });
    assert_refused_with(
        &outcomes,
        &[
            "cannot start the pre-flight's thread",
            "cannot start the supervisor's threads",
            "cannot start the async runtime",
            // A reaper refused would leave the server's exit unseen: nothing is started then.
            "the thread that collects exit statuses could not be started",
            "cannot start \"sleep\": Resource temporarily unavailable",
            "cannot start a thread to read the server's output",
        ],
    );
    // And refusals the run carries on without (the sentinel, the parser thread, the terminal's
    // writer, the start-up profile): the server was started and stopped at its ready timeout.
    assert!(outcomes.iter().filter(|o| o.code == 124).count() >= 3);
}

#[test]
fn every_refused_start_with_the_proxy_the_gpu_sampler_and_metrics_ends_it_cleanly_or_is_done_without(
) {
    let nvml = stub_lib().display().to_string();
    let outcomes = sweep(&Case {
        name: "refuse-full",
        options: &[
            "--no-tee",
            "--ready-timeout",
            "1s",
            "--proxy-addr",
            "127.0.0.1:0",
            "--metrics-addr",
            "127.0.0.1:0",
            "--gpu-backend",
            "nvml",
            "--nvml-lib",
            &nvml,
        ],
        server: &["sleep", "30"],
        ends: &[124],
        terminal: Terminal::Pipe,
    });
    assert_refused_with(
        &outcomes,
        &[
            "cannot start the GPU sampler's threads",
            // A shard's runtime was dropped inside the async runtime: a panic, before.
            "cannot start the proxy's threads",
        ],
    );
}

/// A server named by host name that becomes ready and exits by itself: readiness is probed, and
/// the proxy connects, through a name lookup (tokio's panicked when refused its thread).
fn replay_by_name(port: &str, flood: &str) -> Vec<String> {
    [
        replay_bin(),
        "--host",
        "localhost",
        "--port",
        port,
        "--speed",
        "50",
        "--flood-bytes",
        flood,
        "--exit-after-ready",
        "0:1",
    ]
    .map(String::from)
    .to_vec()
}

/// Sweeps a run of a replay server named by host that becomes ready, writes `flood` bytes and
/// exits 0 by itself, with `extra` options, and checks that some run got that far.
fn sweep_a_ready_server(name: &str, flood: &str, extra: &[&str], terminal: Terminal) {
    let port = free_port().to_string();
    let server = replay_by_name(&port, flood);
    let server: Vec<&str> = server.iter().map(String::as_str).collect();
    let mut options = vec![
        "--ready-timeout",
        "10s",
        "--metrics-addr",
        "none",
        "--gpu-backend",
        "none",
    ];
    options.extend_from_slice(extra);
    let outcomes = sweep(&Case {
        name,
        options: &options,
        server: &server,
        ends: &[0],
        terminal,
    });
    assert!(outcomes.iter().any(|o| o.code == 0), "no run became ready");
}

#[test]
fn every_refused_start_of_a_run_whose_server_is_named_by_host_and_becomes_ready_ends_cleanly() {
    sweep_a_ready_server(
        "refuse-ready",
        "0",
        &["--proxy-addr", "127.0.0.1:0"],
        Terminal::Pipe,
    );
}

#[test]
fn every_refused_start_with_a_terminal_nobody_reads_ends_without_a_hang() {
    sweep_a_ready_server("refuse-stalled", "5000000", &[], Terminal::Stalled);
}

#[test]
fn every_refused_start_of_a_flags_dump_through_an_interpreter_is_one_line_never_a_panic() {
    let dir = temp_dir("refuse-flags");
    let mut codes = Vec::new();
    for n in 1.. {
        let note = dir.join(format!("refused-{n}"));
        let out = Command::new("timeout")
            .args(["-s", "KILL", "20", "env"])
            .arg(format!("LD_PRELOAD={}", refuse_task_lib().display()))
            .arg(format!("SGLSUP_REFUSE_TASK={n}"))
            .arg(format!("SGLSUP_REFUSE_NOTE={}", note.display()))
            .arg(supervisor_bin())
            .args(["flags", "dump", "--sglang", "python3"])
            .output()
            .unwrap();
        if !std::fs::read_to_string(&note)
            .unwrap_or_default()
            .contains(&format!("refused start {n} "))
        {
            break;
        }
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        let last = stderr.lines().last().unwrap_or("");
        let code = out.status.code();
        assert!(!stderr.contains("panicked"), "start {n} refused: {stderr}");
        // The interpreter has no SGLang here: 125 either way, with one line saying why.
        assert_eq!(code, Some(125), "start {n} refused: {stderr}");
        assert!(last.starts_with("sglang-supervisor: error: "), "{last}");
        if last.contains("Resource temporarily unavailable") {
            assert!(
                last.contains("ulimit -u") && !last.contains("give a python3 path"),
                "start {n} refused: a limit is not a wrong path: {last}"
            );
        }
        codes.push(n);
    }
    let _ = std::fs::remove_dir_all(&dir);
    // The reaper, the interpreter's fork and the runtime's threads at least.
    assert!(codes.len() >= 3, "only {codes:?} refused");
}

#[test]
fn every_refused_start_with_stdout_and_stderr_on_a_socket_keeps_the_messages() {
    let outcomes = sweep(&Case {
        name: "refuse-socket",
        options: &BARE,
        server: &["sleep", "30"],
        ends: &[124],
        terminal: Terminal::Socket,
    });
    assert!(outcomes.iter().any(|o| o.code == 124));
}
