//! When the OS refuses a thread or a process at any step of a start (the limit on processes and
//! threads reached), the run ends with a clear error and its terminal events, never a panic or a
//! hang, and leaves no process: nothing started is left running when something after it fails.
//! Swept over every limit from 1 up to one that lets the server start, as an unprivileged user
//! (root is not held to RLIMIT_NPROC).
#![allow(clippy::disallowed_methods, clippy::unwrap_used)]
mod common;
use common::*;
use std::process::Command;
use std::time::{Duration, Instant};

const NOBODY: &str = "65534";

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

#[test]
fn every_thread_or_process_limit_ends_the_run_cleanly_and_leaves_no_process() {
    if unsafe { libc::geteuid() } != 0 {
        // The sweep runs the supervisor as another user, which needs root; CI runs as root.
        panic!("this test needs root (setpriv to an unprivileged user); run the suite as root");
    }
    // Orphans of a run (its sentinel) come back to this process, which reaps them: a zombie of the
    // unprivileged user would count against the next run's limit.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) };
    let dir = temp_dir("thread-limit");
    // The unprivileged user writes its events and pid files here.
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    // A copy the unprivileged user can run wherever the checkout is (a home may be closed to it).
    let bin = dir.join("sglang-supervisor");
    std::fs::copy(supervisor_bin(), &bin).unwrap();
    std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut outcomes = Vec::new();
    for limit in 1..=14 {
        let pid_file = dir.join(format!("child-{limit}.pid"));
        let events = dir.join(format!("events-{limit}.jsonl"));
        let child = format!("echo $$ > {}; exec sleep 30", pid_file.display());
        let started = Instant::now();
        let out = Command::new("timeout")
            .args(["-s", "KILL", "20", "prlimit"])
            .arg(format!("--nproc={limit}:{limit}"))
            .args([
                "setpriv",
                "--reuid",
                NOBODY,
                "--regid",
                NOBODY,
                "--clear-groups",
                "--",
            ])
            .arg(&bin)
            .args([
                "run",
                "--no-tee",
                "--metrics-addr",
                "none",
                "--gpu-backend",
                "none",
            ])
            .args(["--ready-timeout", "1s", "--grace", "1s", "--events"])
            .arg(&events)
            .args(["--", "sh", "-c", &child])
            .output()
            .unwrap();
        let code = out.status.code();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        let last = stderr.lines().last().unwrap_or("").to_string();
        assert!(
            started.elapsed() < Duration::from_secs(15) && code.is_some(),
            "limit {limit}: hung (killed after {:?}): {last}",
            started.elapsed()
        );
        let code = code.unwrap();
        assert!(
            code == 125 || code == 124,
            "limit {limit}: exit {code}, not 125 (could not start) or 124 (the server, a shell that never becomes ready, timed out): {stderr}"
        );
        let child_pid = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok());
        if let Some(p) = child_pid {
            assert!(
                !alive(p),
                "limit {limit}: the server ({p}) outlived the run"
            );
        }
        let written = std::fs::read_to_string(&events).unwrap_or_default();
        let spawned = written.contains(r#""event":"spawned""#);
        let terminal = written
            .lines()
            .last()
            .map(|l| l.contains(r#""event":"exited""#));
        assert_eq!(
            terminal,
            Some(true),
            "limit {limit}: the events file does not end with `exited`"
        );
        if code == 125 {
            assert!(
                last.contains("Resource temporarily unavailable") || last.contains("limit"),
                "limit {limit}: the error does not say what was refused: {last}"
            );
        }
        outcomes.push((limit, code, spawned));
        reap_orphans();
    }
    // The sweep covered the three kinds of step: refused before the spawn (no server), after it
    // (a server that was started, then taken down), and a start that went through.
    eprintln!("limit, exit status, server started: {outcomes:?}");
    assert!(outcomes.iter().any(|&(_, c, spawned)| c == 125 && !spawned));
    assert!(outcomes.iter().any(|&(_, c, spawned)| c == 125 && spawned));
    assert!(outcomes.iter().any(|&(_, c, _)| c == 124));
    // The copy of the binary is 70 MB: a passing run leaves nothing (a failing one keeps it all).
    let _ = std::fs::remove_dir_all(&dir);
}

/// Reap every orphan that has ended, waiting up to 5 s for the ones still running to end.
fn reap_orphans() {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let mut status = 0;
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid > 0 {
            continue;
        }
        if pid < 0 || Instant::now() > end {
            return; // ECHILD: none left
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
