//! Fault injection with real processes (RELIABILITY.md): for each fault, nothing hangs, the exit
//! status is the right one, the log file holds exactly what the child wrote up to the fault, and
//! no process is left. Faults already proven elsewhere (crash per phase, hang, SIGTERM ignored,
//! setsid grandchildren, SIGINT twice, supervisor SIGKILLed, port in use, dead upstream, NVML
//! errors) are listed in RELIABILITY.md with their tests.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)] // test code: a panic is the failure report; it runs the binary directly
mod common;
use common::*;
use serde_json::Value;
use sglang_supervisor_tests::post_timed;
use std::process::Stdio;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(120);

fn exited(run: &Run) -> Value {
    run.events_named("exited").pop().expect("an exited event")
}

/// The child's stdout/stderr keep being drained after the log file fails: the child finishes
/// its flood and exits by itself with its own status.
fn assert_child_finished_undisturbed(run: &mut Run) -> Value {
    assert_eq!(run.wait(T), 0, "the child's own exit status");
    let ex = exited(run);
    assert_eq!(ex["code"], 0, "{ex}");
    run.assert_no_survivors();
    ex
}

#[test]
fn disk_full_at_the_first_byte_is_reported_and_the_child_runs_on() {
    // /dev/full: every write fails with ENOSPC, as on a full disk.
    let mut run = Run::start(
        "devfull",
        Opts {
            supervisor: &["--log-file", "/dev/full"],
            replay: &[
                "--speed",
                "50",
                "--flood-bytes",
                "20000000",
                "--exit-after-ready",
                "0:0",
            ],
            stderr: Stdio::piped(),
            ..Default::default()
        },
    );
    let ex = assert_child_finished_undisturbed(&mut run);
    let log = &ex["log"];
    assert!(
        log["log_file_error"]
            .as_str()
            .unwrap()
            .contains("No space left on device"),
        "{log}"
    );
    assert!(
        log["log_file_lost_bytes"].as_u64().unwrap() > 20_000_000,
        "{log}"
    );
    assert!(
        log["bytes"].as_u64().unwrap() > 20_000_000,
        "all read: {log}"
    );
    let mut err = String::new();
    std::io::Read::read_to_string(run.child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(
        err.contains("writing the log file /dev/full"),
        "reported: {err}"
    );
}

#[test]
fn a_file_size_limit_mid_stream_keeps_an_exact_prefix_and_drains_the_child() {
    let mut run = Run::start(
        "fsize",
        Opts {
            replay: &[
                "--speed",
                "20",
                "--flood-bytes",
                "200000000",
                "--exit-after-ready",
                "0:0",
            ],
            ..Default::default()
        },
    );
    // Once the child is writing, cap the supervisor's file size ahead of what the log holds:
    // RLIMIT_FSIZE makes its next writes fail with EFBIG (SIGXFSZ is ignored), mid-stream. The
    // child's own limit is untouched (limits are per process).
    let log = run.dir.join("server.log");
    let end = Instant::now() + T;
    while file_len(&log) < 1_000_000 {
        assert!(Instant::now() < end, "no output");
        std::thread::sleep(Duration::from_millis(5));
    }
    // The margin outlasts a descheduled test thread (the flood writes ~0.5 GB/s): the cap must
    // lie ahead of the log when it takes effect, yet well inside the 200 MB.
    let cap = file_len(&log) + 20_000_000;
    let lim = libc::rlimit {
        rlim_cur: cap,
        rlim_max: libc::RLIM_INFINITY,
    };
    let rc = unsafe {
        libc::prlimit(
            run.child.id() as i32,
            libc::RLIMIT_FSIZE,
            &lim,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
    let ex = assert_child_finished_undisturbed(&mut run);
    let (n, total) = run.assert_log_is_a_prefix(&log);
    assert!(n <= cap, "{n} > {cap}");
    let l = &ex["log"];
    assert!(
        l["log_file_error"]
            .as_str()
            .unwrap()
            .contains("File too large"),
        "{l}"
    );
    assert_eq!(
        l["log_file_bytes"], n,
        "what landed is counted as written: {l}"
    );
    assert_eq!(
        n + l["log_file_lost_bytes"].as_u64().unwrap(),
        total,
        "every byte is either in the file or counted as lost: {l}"
    );
}

#[test]
fn closed_stdout_and_stderr_change_nothing() {
    fn close_stdio() -> std::io::Result<()> {
        unsafe {
            libc::close(1);
            libc::close(2);
        }
        Ok(())
    }
    let mut run = Run::start(
        "closed-stdio",
        Opts {
            replay: &[
                "--speed",
                "50",
                "--flood-bytes",
                "5000000",
                "--exit-after-ready",
                "3:0",
            ],
            pre_exec: Some(close_stdio),
            ..Default::default()
        },
    );
    assert_eq!(run.wait(T), 3);
    assert_eq!(exited(&run)["code"], 3);
    // The log file did not get the terminal copy (it would if it had taken descriptor 1: Rust's
    // runtime puts /dev/null on closed standard descriptors before main).
    run.assert_log_is_exact();
    run.assert_no_survivors();
}

#[test]
fn a_terminal_reader_that_goes_away_changes_nothing() {
    let mut run = Run::start(
        "epipe",
        Opts {
            replay: &[
                "--speed",
                "50",
                "--flood-bytes",
                "20000000",
                "--exit-after-ready",
                "0:0",
            ],
            stdout: Stdio::piped(),
            stderr: Stdio::piped(),
            ..Default::default()
        },
    );
    // The reader reads a little, then leaves: writes to the terminal now fail with EPIPE.
    let mut out = run.child.stdout.take().unwrap();
    let mut buf = [0u8; 4096];
    let _ = std::io::Read::read(&mut out, &mut buf);
    drop(out);
    drop(run.child.stderr.take());
    assert_eq!(run.wait(T), 0);
    run.assert_log_is_exact();
    run.assert_no_survivors();
}

#[test]
fn a_gigabyte_of_log_is_copied_byte_for_byte() {
    let mut run = Run::start(
        "gigabyte",
        Opts {
            supervisor: &["--no-tee"],
            replay: &[
                "--speed",
                "50",
                "--flood-bytes",
                "1073741824",
                "--exit-after-ready",
                "0:0",
            ],
            ..Default::default()
        },
    );
    assert_eq!(run.wait(Duration::from_secs(300)), 0);
    let ex = exited(&run);
    assert!(ex["log"]["bytes"].as_u64().unwrap() > 1 << 30, "{ex}");
    assert_eq!(ex["log"]["log_file_lost_bytes"], 0);
    run.assert_log_is_exact();
    run.assert_no_survivors();
}

#[test]
fn an_upstream_that_dies_mid_stream_is_an_error_record_and_the_proxy_survives() {
    let reqlog = std::env::temp_dir().join(format!("sglsup-cut-{}.jsonl", std::process::id()));
    let reqlog_s = reqlog.to_str().unwrap().to_string();
    let mut run = Run::start(
        "cut-stream",
        Opts {
            supervisor: &["--proxy-addr", "127.0.0.1:0", "--requests-log", &reqlog_s],
            replay: &["--speed", "50", "--cut-stream-after", "5"],
            ..Default::default()
        },
    );
    let proxy = run.wait_event("listening", T)["proxy"]
        .as_str()
        .unwrap()
        .to_string();
    run.wait_event("ready", T);
    for _ in 0..3 {
        // The client sees the stream end early (a broken chunked body), never a hang.
        let t = Instant::now();
        let r = post_timed(
            &proxy,
            "/generate",
            r#"{"text":"x","sampling_params":{"max_new_tokens":50},"stream":true}"#,
        );
        assert!(t.elapsed() < Duration::from_secs(10));
        if let Ok(r) = r {
            assert!(!r.body.contains("[DONE]"), "{}", r.body);
        }
    }
    let end = Instant::now() + Duration::from_secs(20);
    let recs = loop {
        let text = std::fs::read_to_string(&reqlog).unwrap_or_default();
        let recs: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if recs.len() >= 3 || Instant::now() > end {
            break recs;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(recs.len(), 3);
    for r in &recs {
        assert!(
            r["error"].is_string(),
            "an upstream failure is recorded as one: {r}"
        );
        assert_eq!(r["completion_tokens"], 5, "tokens seen before the cut: {r}");
    }
    // The proxy still serves: a non-streamed request goes through.
    let ok = post_timed(
        &proxy,
        "/generate",
        r#"{"text":"x","sampling_params":{"max_new_tokens":3}}"#,
    )
    .unwrap();
    assert!(ok.status.contains("200"), "{}", ok.status);
    run.signal(libc::SIGTERM);
    assert_eq!(run.wait(T), 143);
    run.assert_log_is_exact();
    run.assert_no_survivors();
    let _ = std::fs::remove_file(reqlog);
}

/// Our stderr (where the flood goes) to `out`, a 64 MiB flood: the terminal copy's dropped bytes, and the run's events.
fn flood_with_stderr_to(name: &str, out: std::fs::File) -> Value {
    let mut run = Run::start(
        name,
        Opts {
            replay: &[
                "--speed",
                "50",
                "--flood-bytes",
                "67108864",
                "--exit-after-ready",
                "0:0",
            ],
            stderr: out.into(),
            ..Default::default()
        },
    );
    assert_eq!(run.wait(Duration::from_secs(120)), 0);
    exited(&run)
}

#[test]
fn a_terminal_copy_to_a_regular_file_loses_nothing() {
    use std::os::unix::fs::OpenOptionsExt;
    let path = std::env::temp_dir().join(format!("sglsup-tee-{}.out", std::process::id()));
    // O_SYNC: a file slower than the child (every write waits for the disk), which made the old
    // copy drop two thirds of the flood; the supervisor's fd shares the open file's flags.
    let slow = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_SYNC)
        .open(&path)
        .unwrap();
    let ex = flood_with_stderr_to("tee-file", slow);
    let len = std::fs::metadata(&path).unwrap().len();
    let _ = std::fs::remove_file(&path);
    assert_eq!(ex["log"]["terminal_dropped_bytes"], 0, "{ex}");
    assert!(len >= 64 << 20, "the copy has every byte: {len}");
}

#[test]
fn a_terminal_copy_to_dev_null_loses_nothing() {
    let ex = flood_with_stderr_to("tee-null", std::fs::File::create("/dev/null").unwrap());
    assert_eq!(ex["log"]["terminal_dropped_bytes"], 0, "{ex}");
}

/// `run` of `py -m sglang.launch_server` with its pre-flight through `py` (a fake interpreter)
/// bounded by `timeout`: what it printed and how long it took.
fn launch_with_preflight(py: &std::path::Path, timeout: &str) -> (std::process::Output, Duration) {
    let t0 = Instant::now();
    let out = std::process::Command::new(supervisor_bin())
        .args(["run", "--metrics-addr", "none", "--gpu-backend", "none"])
        .args(["--", py.to_str().unwrap(), "-m", "sglang.launch_server"])
        .env("SGLANG_SUPERVISOR_PREFLIGHT_TIMEOUT", timeout)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (out, t0.elapsed())
}

/// Processes whose command line holds `marker`.
fn processes_with(marker: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
        })
        .count()
}

#[test]
fn a_hung_preflight_interpreter_is_killed_at_the_timeout_and_the_launch_goes_on() {
    let dir = std::env::temp_dir().join(format!("sglsup-hung-py-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let py = dir.join("python3");
    // Asked to read the flags (`-c ...`) it hangs; asked to launch, it exits at once.
    let marker = format!("1000.{}", std::process::id());
    shell_script(
        &py,
        &format!("case \"$1\" in -c) exec sleep {marker};; esac\nexit 0\n"),
    );
    let (out, took) = launch_with_preflight(&py, "1s");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("did not finish reading SGLang's flags within 1s"),
        "{stderr}"
    );
    assert!(
        stderr.contains("--preflight-timeout"),
        "says what to do: {stderr}"
    );
    assert_eq!(out.status.code(), Some(0), "the launch went on: {stderr}");
    assert!(took < Duration::from_secs(10), "bounded: {took:?}");
    assert_eq!(
        processes_with(&marker),
        0,
        "the hung interpreter was killed"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn an_interpreter_that_leaves_a_process_holding_its_pipes_gives_its_own_error_soon() {
    let dir = temp_dir("leftover-py");
    let py = dir.join("python3");
    // Asked to read the flags it fails at once, leaving a process behind that holds its stderr.
    let marker = format!("1000.{}", std::process::id() + 1);
    shell_script(
        &py,
        &format!(
            "case \"$1\" in -c) sleep {marker} & echo \"ModuleNotFoundError: No module named 'sglang'\" >&2; exit 1;; esac\nexit 0\n"
        ),
    );
    let (out, took) = launch_with_preflight(&py, "30s");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Its own message, not "hung" (the reads, not the exit, were waiting), and not after 30 s.
    assert!(
        stderr.contains("cannot import SGLang's parser (ModuleNotFoundError"),
        "{stderr}"
    );
    assert!(!stderr.contains("did not finish reading"), "{stderr}");
    assert!(took < Duration::from_secs(10), "bounded: {took:?}");
    assert_eq!(
        processes_with(&marker),
        0,
        "what the interpreter left was killed"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_log_file_that_takes_no_writes_is_a_warning_event_while_the_run_goes_on_and_in_the_report() {
    // /dev/full (ENOSPC) works for every user; /proc/version (EIO) where it opens for writing.
    let mut files = vec!["/dev/full"];
    if std::fs::OpenOptions::new()
        .write(true)
        .open("/proc/version")
        .is_ok()
    {
        files.push("/proc/version");
    }
    for file in files {
        let dir = temp_dir("log-no-writes");
        let (events, report) = (dir.join("events.jsonl"), dir.join("report.json"));
        let mut sup = std::process::Command::new(supervisor_bin())
            .args([
                "run",
                "--no-tee",
                "--no-preflight",
                "--metrics-addr",
                "none",
            ])
            .args(["--log-file", file, "--events"])
            .arg(&events)
            .arg("--report")
            .arg(&report)
            .args(["--", "sh", "-c", "echo one line; sleep 3"])
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Said as it happens, while the server still runs: not only at the end.
        let warning = wait_event_at(&events, "warning", Duration::from_secs(2));
        assert!(sup.try_wait().unwrap().is_none(), "{file}: still running");
        let message = warning["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("writing the log file {file}")) && message.contains("lost"),
            "{message}"
        );
        assert_eq!(
            sup.wait().unwrap().code(),
            Some(0),
            "the server's own status"
        );
        let r: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        assert!(
            r["warnings"]
                .as_array()
                .unwrap()
                .iter()
                .any(|w| w == message),
            "{file}: in the report's warnings: {}",
            r["warnings"]
        );
        let log = &r["teardown"]["exited"]["log"];
        assert!(
            log["log_file_error"].as_str().unwrap().contains(file),
            "{log}"
        );
        assert_eq!(log["log_file_lost_bytes"], 9, "'one line\\n' lost: {log}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
