//! Commands that print a result, when standard output cannot take it: a full device is the
//! supervisor's own failure (one error line, exit 125), a closed pipe ends them quietly.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)] // test code: a panic is the failure report
mod common;
use common::*;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn real(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/real-h200-supervised")
        .join(name)
        .display()
        .to_string()
}

fn compare_fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/compare")
        .join(name)
        .display()
        .to_string()
}

/// Commands with a result on stdout, one of each way they print.
fn printing_commands() -> Vec<Vec<String>> {
    vec![
        vec!["completions".into(), "bash".into()],
        vec!["man".into()],
        vec!["report".into(), "--events".into(), real("R_events.jsonl")],
        vec![
            "compare".into(),
            compare_fixture("bench_serving_v0.5.14.jsonl"),
            compare_fixture("bench_serving_v0.5.19.jsonl"),
        ],
    ]
}

fn run_with_stdout(args: &[String], stdout: Stdio) -> Output {
    Command::new(supervisor_bin())
        .args(args)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

#[test]
fn a_full_stdout_is_one_error_line_and_exit_125_not_a_panic() {
    for args in printing_commands() {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let out = run_with_stdout(&args, Stdio::from(full));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(sglang_supervisor::exit::SUPERVISOR_FAILED),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: {err}");
        assert!(
            lines[0].starts_with("sglang-supervisor: error: writing to standard output: "),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn a_closed_pipe_on_stdout_ends_the_command_quietly() {
    for args in printing_commands() {
        let mut fds = [0; 2];
        // Close-on-exec: a child the other test spawns meanwhile must not inherit the read end
        // (it kept the pipe open, and the write this test expects to fail went through).
        // SAFETY: a fresh pipe; both ends are owned below and closed exactly once.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // The reader is gone before the first write, as after `| head` has had its lines.
        drop(read);
        let out = run_with_stdout(&args, Stdio::from(write));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{args:?}: {err}");
        assert!(err.is_empty(), "{args:?}: {err}");
    }
}
