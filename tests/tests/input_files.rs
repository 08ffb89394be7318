//! The files the subcommands read and write. What they read must be a regular file: a device
//! (/dev/zero) or a FIFO nobody writes is refused at once with a one-line error, where reading
//! it took gigabytes of memory or blocked past `wait --timeout`. Two options may not name one
//! file that one of them writes: the events and the log interleaved, a report replaced its input.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)] // test code: a panic is the failure report
mod common;
use common::*;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn a_device_or_a_fifo_is_refused_at_once_by_compare_report_and_wait() {
    let dir = temp_dir("input-files");
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let fx = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/real-h200-supervised");
    let (report, events) = (fx.join("R_report.json"), fx.join("A_events.jsonl"));
    let p = |p: &Path| p.to_str().unwrap().to_string();
    for bad in [Path::new("/dev/zero"), &fifo] {
        let b = p(bad);
        for (args, code) in [
            (vec!["compare".into(), p(&report), b.clone()], 2),
            (vec!["report".into(), "--events".into(), b.clone()], 2),
            (
                vec![
                    "report".into(),
                    "--events".into(),
                    p(&events),
                    "--bench-result".into(),
                    b.clone(),
                ],
                2,
            ),
            (
                vec![
                    "wait".into(),
                    "--events".into(),
                    b.clone(),
                    "--timeout".into(),
                    "30s".into(),
                ],
                125,
            ),
        ] {
            let t = Instant::now();
            // (under `timeout`: a regression blocks on the FIFO, and fails here, not hangs)
            let out = Command::new("timeout")
                .args(["-s", "KILL", "10"])
                .arg(supervisor_bin())
                .args(&args)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{args:?}: {:?}",
                t.elapsed()
            );
            assert!(err.contains("not a regular file"), "{args:?}: {err}");
            assert!(err.contains(&b), "{args:?} names the file: {err}");
            assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn two_options_naming_one_file_are_refused_before_anything_runs() {
    let dir = temp_dir("same-file");
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    let marker = dir.join("ran");
    let run = |opts: &[&str], env: &[(&str, &str)]| {
        let out = Command::new(supervisor_bin())
            .current_dir(&dir)
            .args([
                "run",
                "--gpu-backend",
                "none",
                "--no-preflight",
                "--metrics-addr",
                "none",
            ])
            .args(opts)
            .args(["--", "touch", marker.to_str().unwrap()])
            .envs(env.iter().copied())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for (opts, env, says) in [
        (
            &["--log-file", "same.txt", "--events", "same.txt"][..],
            &[][..],
            "--log-file and --events both name same.txt",
        ),
        (
            &["--events", "sub/../e.jsonl", "--report", "e.jsonl"],
            &[],
            "--events and --report both name sub/../e.jsonl",
        ),
        (
            &["--log-file", "e.jsonl"],
            &[("SGLANG_SUPERVISOR_EVENTS", "./e.jsonl")],
            "--log-file and --events (from SGLANG_SUPERVISOR_EVENTS) both name e.jsonl",
        ),
    ] {
        let (code, err) = run(opts, env);
        assert_eq!(code, Some(125), "{opts:?}: {err}");
        assert!(err.contains(says), "{opts:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(!marker.exists(), "{opts:?}: the command ran");
        assert!(!dir.join("same.txt").exists() && !dir.join("e.jsonl").exists());
    }
    // (a device is no file of ours: both may discard)
    let (code, err) = run(&["--log-file", "/dev/null", "--events", "/dev/null"], &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(marker.exists());

    // `report` writing over its own input
    let events = dir.join("ev.jsonl");
    let fx = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/real-h200-supervised");
    std::fs::copy(fx.join("A_events.jsonl"), &events).unwrap();
    let before = std::fs::read(&events).unwrap();
    let out = Command::new(supervisor_bin())
        .current_dir(&dir)
        .args(["report", "--events", "ev.jsonl", "-o", "./ev.jsonl"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("--output and --events both name ./ev.jsonl"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&events).unwrap(),
        before,
        "the input is unchanged"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
