//! What the subcommands read must be a regular file: a device (/dev/zero) or a FIFO nobody
//! writes is refused at once with a one-line error, where reading it took gigabytes of memory or
//! blocked past `wait --timeout`.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)] // test code: a panic is the failure report
mod common;
use common::*;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn a_device_or_a_fifo_is_refused_at_once_by_compare_report_and_wait() {
    let dir = std::env::temp_dir().join(format!("sglsup-input-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
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
