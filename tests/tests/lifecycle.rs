//! The lifecycle's edges, end to end with real processes and signals: every run ends with a
//! terminal event, `wait` follows the live run, signals (back to back, a stopped server, stray
//! ones), paths checked at start, `wait --url` with an API key, and a worker node of a
//! multi-node launch.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)] // test code
mod common;
use common::*;
use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(60);

fn tmp(name: &str) -> std::path::PathBuf {
    temp_dir(&format!("lc-{name}"))
}

/// `wait` with its stderr; (status, stderr, how long it took).
fn wait(args: &[&str]) -> (i32, String, Duration) {
    let t = Instant::now();
    let out = Command::new(supervisor_bin())
        .arg("wait")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        t.elapsed(),
    )
}

fn run_cmd(events: &std::path::Path, opts: &[&str], command: &[&str]) -> std::process::Output {
    Command::new(supervisor_bin())
        .args(["run", "--no-tee", "--metrics-addr", "none", "--events"])
        .arg(events)
        .args(opts)
        .arg("--")
        .args(command)
        .output()
        .unwrap()
}

#[test]
fn a_spawn_failure_and_a_port_in_use_end_with_a_terminal_event_wait_reads() {
    let dir = tmp("terminal");
    let ev = dir.join("events.jsonl");
    let out = run_cmd(&ev, &[], &["/nonexistent/sglang-server"]);
    assert_eq!(out.status.code(), Some(125));
    let evs = events_at(&ev);
    let last = evs.last().unwrap();
    assert_eq!(
        (last["event"].as_str(), last["exit_status"].as_i64()),
        (Some("exited"), Some(125)),
        "{evs:?}"
    );
    assert_eq!(evs[evs.len() - 2]["reason"], "spawn_failed");
    let (code, err, took) = wait(&["--events", ev.to_str().unwrap(), "--timeout", "30s"]);
    assert_eq!(code, 125, "{err}");
    assert!(took < Duration::from_secs(5), "{took:?}");

    // A metrics port in use: refused before anything starts, and recorded.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let out = Command::new(supervisor_bin())
        .args(["run", "--no-tee", "--metrics-addr", &addr, "--events"])
        .arg(&ev)
        .args(["--", "sleep", "30"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let evs = events_at(&ev);
    assert_eq!(evs[0]["reason"], "supervisor_failed", "{evs:?}");
    assert_eq!(evs[1]["exit_status"], 125);
    assert!(!evs.iter().any(|e| e["event"] == "spawned"));
    let (code, _, took) = wait(&["--events", ev.to_str().unwrap(), "--timeout", "30s"]);
    assert_eq!(code, 125);
    assert!(took < Duration::from_secs(5));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_proxy_addr_on_the_servers_own_port_is_refused_before_launching() {
    let dir = tmp("proxy-on-server-port");
    let ev = dir.join("events.jsonl");
    let marker = dir.join("launched");
    let port = free_port().to_string();
    let proxy = format!("127.0.0.1:{port}");
    // The "server" would leave a marker: it must never run.
    let out = run_cmd(
        &ev,
        &["--proxy-addr", &proxy],
        &[
            "sh",
            "-c",
            "touch \"$0\"; sleep 30",
            marker.to_str().unwrap(),
            "--port",
            &port,
        ],
    );
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err.trim_end();
    assert_eq!(line.lines().count(), 1, "one line: {err}");
    assert!(
        line.contains(&format!("--proxy-addr {proxy}"))
            && line.contains(&format!(
                "(http://127.0.0.1:{port}, from the server's --port)"
            ))
            && line.contains("another port"),
        "names both, where the server's was read, and what to do: {err}"
    );
    assert!(!marker.exists(), "the server was launched");
    let evs = events_at(&ev);
    assert!(!evs.iter().any(|e| e["event"] == "spawned"), "{evs:?}");
    assert_eq!(evs.last().unwrap()["exit_status"], 125, "{evs:?}");
    // A command without --port: SGLang's default, said as such.
    let out = run_cmd(
        &ev,
        &["--proxy-addr", "127.0.0.1:30000"],
        &[
            "sh",
            "-c",
            "touch \"$0\"; sleep 30",
            marker.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "(http://127.0.0.1:30000, from SGLang's default port, the command having no --port)"
        ),
        "{err}"
    );
    assert!(!marker.exists(), "the server was launched");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_garbage_metrics_addr_is_said_to_be_no_address_not_a_held_port() {
    let dir = tmp("metrics-garbage");
    let ev = dir.join("events.jsonl");
    let out = Command::new(supervisor_bin())
        .args(["run", "--no-tee", "--metrics-addr", "garbage", "--events"])
        .arg(&ev)
        .args(["--", "sleep", "30"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(
        err.contains("--metrics-addr \"garbage\" is not an address")
            && err.contains("HOST:PORT (e.g. 127.0.0.1:19400"),
        "says what is wrong and the accepted form: {err}"
    );
    assert!(!err.contains("hold"), "no port is held: {err}");
    assert_eq!(events_at(&ev).last().unwrap()["exit_status"], 125);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn wait_refuses_a_zero_timeout_and_a_short_one_ends_with_a_reason() {
    let dir = tmp("wait-zero");
    let ev = dir.join("never.jsonl");
    let ev = ev.to_str().unwrap();
    let (code, err, _) = wait(&["--events", ev, "--timeout", "0s"]);
    assert_eq!(code, 125, "bad input: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("--timeout") && err.contains("longer than zero"),
        "{err}"
    );
    // The shortest real timeout still says why it is not ready.
    let (code, err, _) = wait(&["--events", ev, "--timeout", "1ms"]);
    assert_eq!(code, 124, "{err}");
    assert!(err.contains("never created"), "{err}");
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let (code, err, _) = wait(&["--url", &url, "--timeout", "1ms"]);
    assert_eq!(code, 124, "{err}");
    assert!(!err.contains("()"), "an empty reason: {err}");
    assert!(err.contains("refused"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_preflight_refusal_ends_with_a_terminal_event() {
    let dir = tmp("preflight");
    let ev = dir.join("events.jsonl");
    let schema =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/flags/sglang-0.5.20.json");
    let out = run_cmd(
        &ev,
        &["--flags-schema", schema.to_str().unwrap()],
        &[
            "python3",
            "-m",
            "sglang.launch_server",
            "--model-path",
            "m",
            "--cuda-graph-max-bs",
            "8",
        ],
    );
    assert_eq!(out.status.code(), Some(126));
    let names: Vec<String> = events_at(&ev)
        .iter()
        .map(|e| e["event"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["preflight", "fatal", "exited"]);
    let (code, err, _) = wait(&["--events", ev.to_str().unwrap(), "--timeout", "30s"]);
    assert_eq!(code, 126, "{err}");
    assert!(err.contains("preflight_rejected"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_preflight_that_cannot_read_its_schema_ends_with_a_terminal_event() {
    let dir = tmp("preflight-missing");
    let ev = dir.join("events.jsonl");
    let missing = dir.join("no-such-schema.json");
    let out = run_cmd(
        &ev,
        &["--flags-schema", missing.to_str().unwrap()],
        &["python3", "-m", "sglang.launch_server", "--model-path", "m"],
    );
    assert_eq!(out.status.code(), Some(125));
    let events = events_at(&ev);
    let names: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["fatal", "exited"], "{events:?}");
    assert_eq!(events[0]["reason"], "supervisor_failed");
    assert!(
        events[0]["excerpt"]
            .as_str()
            .unwrap()
            .contains("no-such-schema.json"),
        "{events:?}"
    );
    // `wait` on that file returns at once with the run's status instead of waiting out its timeout.
    let t0 = Instant::now();
    let (code, err, _) = wait(&["--events", ev.to_str().unwrap(), "--timeout", "30s"]);
    assert_eq!(code, 125, "{err}");
    assert!(t0.elapsed() < Duration::from_secs(10));
    let _ = std::fs::remove_dir_all(dir);
}

/// Whether `pid` still runs (a zombie, killed and not yet reaped, does not).
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rsplit(')').next().map(|r| r.trim_start().chars().next()) != Some(Some('Z')))
        .unwrap_or(false)
}

#[test]
fn a_sigterm_during_a_hung_preflight_ends_the_run_with_its_exited_event_and_the_interpreter_gone() {
    let dir = tmp("preflight-sigterm");
    let ev = dir.join("events.jsonl");
    // The launch's interpreter hangs when asked for SGLang's flags, as an import stuck on a
    // network filesystem would; it says who it is first.
    let py = dir.join("python3");
    let pidfile = dir.join("python.pid");
    shell_script(
        &py,
        &format!("echo $$ > {}\nexec sleep 120\n", pidfile.display()),
    );
    let mut sup = Command::new(supervisor_bin())
        .args(["run", "--no-tee", "--metrics-addr", "none", "--events"])
        .arg(&ev)
        .args(["--report", dir.join("report.json").to_str().unwrap(), "--"])
        .arg(&py)
        .args(["-m", "sglang.launch_server", "--model-path", "m"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let pid = loop {
        if let Some(p) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            break p;
        }
        assert!(t0.elapsed() < T, "the pre-flight never ran the interpreter");
        std::thread::sleep(Duration::from_millis(20));
    };
    unsafe { libc::kill(sup.id() as i32, libc::SIGTERM) };
    let t1 = Instant::now();
    let status = sup.wait().unwrap();
    assert!(
        t1.elapsed() < Duration::from_secs(5),
        "took {:?} to stop",
        t1.elapsed()
    );
    assert_eq!(
        status.code(),
        Some(143),
        "a requested stop is 128 + SIGTERM"
    );
    let mut err = String::new();
    std::io::Read::read_to_string(&mut sup.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("SIGTERM during the pre-flight"), "{err}");
    let events = events_at(&ev);
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["event"], "exited");
    assert_eq!(events[0]["requested"], true);
    assert_eq!(events[0]["exit_status"], 143);
    let report: Value =
        serde_json::from_slice(&std::fs::read(dir.join("report.json")).unwrap()).unwrap();
    assert_eq!(report["teardown"]["exited"]["exit_status"], 143, "{report}");
    // The interpreter went with us (PDEATHSIG), and `wait` reads the end at once.
    let t2 = Instant::now();
    while running(pid) {
        assert!(
            t2.elapsed() < Duration::from_secs(5),
            "the pre-flight's interpreter {pid} outlived the supervisor"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (code, err, took) = wait(&["--events", ev.to_str().unwrap(), "--timeout", "30s"]);
    assert_eq!(code, 143, "{err}");
    assert!(took < Duration::from_secs(10));
    let _ = std::fs::remove_dir_all(dir);
}

/// The pid a fake interpreter wrote to `file`, once it has.
fn pid_in(file: &std::path::Path) -> i32 {
    let t0 = Instant::now();
    loop {
        if let Some(p) = std::fs::read_to_string(file)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            return p;
        }
        assert!(t0.elapsed() < T, "{} was never written", file.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_sigterm_during_a_preflight_takes_what_its_interpreter_started_with_it() {
    let dir = tmp("preflight-grandchild");
    // The import (here through --flags-schema, a python) starts a helper of its own and hangs:
    // PDEATHSIG reaches the interpreter only, not the helper.
    let py = dir.join("python3");
    let helper = dir.join("helper.pid");
    shell_script(
        &py,
        &format!(
            "sh -c 'echo $$ > {}; exec sleep 120' &\nexec sleep 120\n",
            helper.display()
        ),
    );
    let mut sup = Command::new(supervisor_bin())
        .args([
            "run",
            "--no-tee",
            "--metrics-addr",
            "none",
            "--flags-schema",
        ])
        .arg(&py)
        .args(["--events", dir.join("events.jsonl").to_str().unwrap(), "--"])
        .arg(&py)
        .args(["-m", "sglang.launch_server", "--model-path", "m"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = pid_in(&helper);
    unsafe { libc::kill(sup.id() as i32, libc::SIGTERM) };
    assert_eq!(sup.wait().unwrap().code(), Some(143));
    let t0 = Instant::now();
    while running(pid) {
        if t0.elapsed() > Duration::from_secs(5) {
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the pre-flight's helper {pid} outlived the stopped supervisor");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_sigterm_between_the_preflight_and_the_runs_handlers_stops_it_before_the_server_starts() {
    let dir = tmp("preflight-gap");
    let ev = dir.join("events.jsonl");
    // The pre-flight ends at once (no SGLang to read: skipped); the launch itself says who it is.
    let py = dir.join("python3");
    let server = dir.join("server.pid");
    shell_script(
        &py,
        &format!(
            "case \"$*\" in *launch_server*) echo $$ > {}; exec sleep 120;; esac\nexit 1\n",
            server.display()
        ),
    );
    // A FIFO report with no reader yet holds the run in its start-up checks, after the
    // pre-flight and before its own handlers: the gap a signal can fall in, held open.
    let report = dir.join("report.fifo");
    let c = std::ffi::CString::new(report.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let mut sup = Command::new(supervisor_bin())
        .args(["run", "--no-tee", "--metrics-addr", "none", "--events"])
        .arg(&ev)
        .arg("--report")
        .arg(&report)
        .arg("--")
        .arg(&py)
        .args(["-m", "sglang.launch_server", "--model-path", "m"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !ev.exists() {
        assert!(t0.elapsed() < T, "the run never got past its pre-flight");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    unsafe { libc::kill(sup.id() as i32, libc::SIGTERM) };
    std::thread::sleep(Duration::from_millis(200));
    // Now a reader: the start-up check, and whatever is written there at the end, go through.
    let r = report.clone();
    std::thread::spawn(move || loop {
        match std::fs::read(&r) {
            Ok(_)
                if r.metadata()
                    .map(|m| m.file_type().is_file())
                    .unwrap_or(true) =>
            {
                return
            }
            Ok(_) => {}
            Err(_) => return,
        }
    });
    let t1 = Instant::now();
    let status = loop {
        if let Some(st) = sup.try_wait().unwrap() {
            break Some(st);
        }
        if t1.elapsed() > Duration::from_secs(10) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let launched = std::fs::read_to_string(&server)
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok());
    if status.is_none() {
        let _ = sup.kill();
        let _ = sup.wait();
    }
    if let Some(p) = launched {
        unsafe { libc::kill(p, libc::SIGKILL) };
    }
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(143),
        "the SIGTERM was lost: the run went on (server launched: {launched:?})"
    );
    assert_eq!(launched, None, "the server was launched after the SIGTERM");
    let events = events_at(&ev);
    assert!(
        !events.iter().any(|e| e["event"] == "spawned"),
        "{events:?}"
    );
    let last = events.last().unwrap();
    assert_eq!(
        (&last["event"], &last["requested"], &last["exit_status"]),
        (
            &Value::from("exited"),
            &Value::from(true),
            &Value::from(143)
        ),
        "{events:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn wait_ignores_a_previous_runs_file_and_follows_the_run_that_replaces_it() {
    let dir = tmp("stale");
    let ev = dir.join("events.jsonl");
    // Yesterday's run: ready, then stopped; its supervisor is long gone.
    std::fs::write(
        &ev,
        concat!(
            r#"{"ts":"2026-01-01T00:00:00Z","event":"spawned","pid":1,"argv":[],"supervisor_pid":999999999}"#, "\n",
            r#"{"ts":"2026-01-01T00:01:00Z","event":"ready","elapsed_s":60.0,"url":"http://127.0.0.1:1"}"#, "\n",
            r#"{"ts":"2026-01-01T00:02:00Z","event":"exited","code":0,"signal":null,"elapsed_s":120.0,"requested":true,"exit_status":143}"#, "\n",
        ),
    )
    .unwrap();
    let (code, err, _) = wait(&["--events", ev.to_str().unwrap(), "--timeout", "2s"]);
    assert_eq!(code, 124, "a finished run is not this one: {err}");
    assert!(err.contains("finished run"), "{err}");
    // A waiter started now sees the new run that rewrites the file.
    let waiter = Command::new(supervisor_bin())
        .args(["wait", "--events", ev.to_str().unwrap(), "--timeout", "60s"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let port = free_port().to_string();
    let mut sup = Command::new(supervisor_bin())
        .args(["run", "--no-tee", "--metrics-addr", "none", "--events"])
        .arg(&ev)
        .args(["--", replay_bin(), "--speed", "50", "--port", &port])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = waiter.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    unsafe { libc::kill(sup.id() as i32, libc::SIGTERM) };
    assert_eq!(sup.wait().unwrap().code(), Some(143));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_second_sigterm_skips_the_grace() {
    let mut run = Run::start(
        "sigterm2",
        Opts {
            supervisor: &["--grace", "60s"],
            replay: &["--speed", "50", "--ignore-sigterm"],
            ..Default::default()
        },
    );
    run.wait_event("ready", T);
    let t = Instant::now();
    // Two deliveries the kernel holds pending at once are one signal by POSIX (they do not
    // queue); two it delivers are two even when our loop sees them together (the unit test
    // `signals::two_deliveries_before_the_loop_looks_are_two_signals`).
    run.signal(libc::SIGTERM);
    run.wait_event("signal", T);
    run.stop_by_sigterm();
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    let targets: Vec<Value> = run
        .events_named("signal")
        .iter()
        .map(|e| e["target"].clone())
        .collect();
    assert_eq!(targets, ["main", "tree"]);
    run.assert_no_survivors();
}

#[test]
fn a_stopped_server_is_continued_so_sigterm_is_not_a_full_grace() {
    let mut run = Run::start(
        "sigstop",
        Opts {
            supervisor: &["--grace", "60s"],
            replay: &["--speed", "50"],
            ..Default::default()
        },
    );
    let pid = run.wait_event("spawned", T)["pid"].as_i64().unwrap() as i32;
    run.wait_event("ready", T);
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    run.stop_by_sigterm();
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "the server drained instead of sitting out the 60 s grace: {:?}",
        t.elapsed()
    );
    assert_eq!(
        run.events_named("signal").len(),
        1,
        "one SIGTERM, no second signal needed"
    );
    run.assert_no_survivors();
}

#[test]
fn stray_signals_never_stop_the_supervisor() {
    let mut run = Run::start(
        "stray",
        Opts {
            replay: &["--speed", "50"],
            ..Default::default()
        },
    );
    run.wait_event("ready", T);
    for sig in [
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGALRM,
        libc::SIGWINCH,
        libc::SIGPIPE,
    ] {
        run.signal(sig);
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(run.child.try_wait().unwrap().is_none(), "still supervising");
    assert!(run.events_named("signal").is_empty(), "none was forwarded");
    run.stop_by_sigterm();
}

#[test]
fn an_unwritable_report_or_a_fifo_log_fails_at_start_with_one_line() {
    let dir = tmp("paths");
    let ev = dir.join("events.jsonl");
    let t = Instant::now();
    // Read-only even for root (sysfs).
    let out = run_cmd(
        &ev,
        &["--report", "/sys/kernel/report.json"],
        &["sleep", "30"],
    );
    assert_eq!(out.status.code(), Some(125));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot write the report /sys/kernel/report.json"),
        "{err}"
    );
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(!events_at(&ev).iter().any(|e| e["event"] == "spawned"));

    let fifo = dir.join("log.fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let t = Instant::now();
    let out = run_cmd(
        &ev,
        &["--log-file", fifo.to_str().unwrap()],
        &["sleep", "30"],
    );
    assert_eq!(out.status.code(), Some(125));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("FIFO with no reader"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(5));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn wait_url_uses_the_api_key_a_guarded_server_needs() {
    let mut run = Run::start(
        "apikey",
        Opts {
            replay: &[
                "--speed",
                "50",
                "--version",
                "0.5.20",
                "--api-key",
                "sekret",
            ],
            ..Default::default()
        },
    );
    run.wait_event("ready", T);
    let url = format!("http://127.0.0.1:{}", run.port);
    let (code, err, _) = wait(&["--url", &url, "--timeout", "2s"]);
    assert_eq!(code, 124, "{err}");
    assert!(err.contains("401") && err.contains("--api-key"), "{err}");
    let (code, err, _) = wait(&["--url", &url, "--api-key", "sekret", "--timeout", "10s"]);
    assert_eq!(code, 0, "{err}");
    run.stop_by_sigterm();
}

#[test]
fn a_worker_node_is_ready_from_its_ranks_and_the_dummy_health_server() {
    let report = std::env::temp_dir().join(format!("sglsup-node1-{}.json", std::process::id()));
    let report_arg = report.to_str().unwrap().to_string();
    let mut run = Run::start(
        "node1",
        Opts {
            supervisor: &["--report", &report_arg],
            replay: &["--speed", "50", "--nnodes", "2", "--node-rank", "1"],
            ..Default::default()
        },
    );
    let ready = run.wait_event("ready", T);
    assert_eq!(
        (ready["node_rank"].as_u64(), ready["nnodes"].as_u64()),
        (Some(1), Some(2))
    );
    let phases = run.events_named("phase");
    assert!(phases.iter().all(|p| p["rank"] == "TP1"), "{phases:?}");
    assert!(!phases.iter().any(|p| p["name"] == "http_up"));
    // The dummy health server: /health and /ping, nothing else.
    let url = format!("http://127.0.0.1:{}", run.port);
    let (code, err, _) = wait(&["--url", &url, "--timeout", "10s"]);
    assert_eq!(code, 0, "wait --url sees a worker node ready too: {err}");
    let server = format!("127.0.0.1:{}", run.port);
    let status = |path: &str| sglang_supervisor_tests::http(&server, "GET", path, "").0;
    assert!(status("/ping").contains(" 200"), "{}", status("/ping"));
    assert!(status("/v1/models").contains(" 404"));
    let metrics = run.wait_event("listening", T)["metrics"]
        .as_str()
        .unwrap()
        .to_string();
    let (_, body) = sglang_supervisor_tests::http(&metrics, "GET", "/metrics", "");
    assert!(
        body.lines()
            .any(|l| l.starts_with("sglang_supervisor_server_args_info")
                && l.contains("node_rank=\"1\"")
                && l.contains("nnodes=\"2\"")),
        "{body}"
    );
    run.stop_by_sigterm();
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(
        (&r["startup"]["node_rank"], &r["startup"]["nnodes"]),
        (&Value::from(1), &Value::from(2))
    );
    let _ = std::fs::remove_file(report);
}

#[test]
fn node_rank_zero_of_two_is_ready_as_today_and_says_which_node_it_is() {
    let mut run = Run::start(
        "node0",
        Opts {
            replay: &["--speed", "50", "--nnodes=2", "--node-rank=0"],
            ..Default::default()
        },
    );
    let ready = run.wait_event("ready", T);
    assert_eq!(
        (ready["node_rank"].as_u64(), ready["nnodes"].as_u64()),
        (Some(0), Some(2))
    );
    assert!(run
        .events_named("phase")
        .iter()
        .any(|p| p["name"] == "http_up"));
    run.stop_by_sigterm();
}
