//! The default metrics port on a GPU node: clear of dcgm-exporter (9400), and when taken (a
//! second supervisor on the node), the next free port, said and recorded; a port the user
//! named is never moved: taken, the start fails (125) naming the process that holds it.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)]
mod common;
use common::*;
use serde_json::Value;
use sglang_supervisor::metrics_addr::DEFAULT_METRICS_ADDR;
use sglang_supervisor_tests::http;
use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const DCGM_EXPORTER_ADDR: &str = "127.0.0.1:9400";

/// A real process named `dcgm-exporter` (python3 under that name, so /proc says so) listening
/// on the given addresses (with SO_REUSEADDR, as Go servers do: a TIME_WAIT left by an earlier
/// run does not stop it); the ones it could take (another holder may have them already).
struct FakeExporter {
    child: std::process::Child,
    held: Vec<String>,
    dir: std::path::PathBuf,
}

impl FakeExporter {
    fn start(addrs: &[&str]) -> FakeExporter {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("fake-dcgm-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("dcgm-exporter");
        // The interpreter itself, not a wrapper (pyenv's shim would look for `dcgm-exporter`).
        let python = Command::new("python3")
            .args([
                "-c",
                "import os, sys; print(os.path.realpath(sys.executable))",
            ])
            .output()
            .unwrap();
        let python = String::from_utf8(python.stdout).unwrap();
        std::os::unix::fs::symlink(python.trim(), &exe).unwrap();
        let script = "import socket, sys, time\n\
            held = []\n\
            for a in sys.argv[1:]:\n\
            \x20   h, p = a.rsplit(':', 1)\n\
            \x20   s = socket.socket()\n\
            \x20   s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
            \x20   try:\n\
            \x20       s.bind((h, int(p))); s.listen(); held.append((a, s))\n\
            \x20   except OSError:\n\
            \x20       pass\n\
            print(' '.join(a for a, _ in held), flush=True)\n\
            time.sleep(600)\n";
        let mut child = Command::new(&exe)
            .arg("-c")
            .arg(script)
            .args(addrs)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let held: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        assert!(!held.is_empty(), "the fake exporter took none of {addrs:?}");
        FakeExporter { child, held, dir }
    }

    fn holds(&self, addr: &str) -> bool {
        self.held.iter().any(|a| a == addr)
    }

    fn name(&self) -> String {
        format!("dcgm-exporter (pid {})", self.child.id())
    }
}

impl Drop for FakeExporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn events(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn wait_event(path: &std::path::Path, name: &str) -> Value {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(e) = events(path).into_iter().find(|e| e["event"] == name) {
            return e;
        }
        assert!(Instant::now() < end, "no {name} event: {:?}", events(path));
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn with_dcgm_exporter_on_9400_and_on_the_default_port_run_serves_on_the_next_free_port_and_records_it(
) {
    assert_eq!(DEFAULT_METRICS_ADDR, "127.0.0.1:19400");
    let fake = FakeExporter::start(&[DCGM_EXPORTER_ADDR, DEFAULT_METRICS_ADDR]);
    let dir = std::env::temp_dir().join(format!("sglsup-default-port-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ev = dir.join("events.jsonl");
    let port = free_port();
    // No --metrics-addr: the default, as a user on a GPU node gets it.
    let sup = Command::new(supervisor_bin())
        .args(["run", "--no-tee", "--events"])
        .arg(&ev)
        .args([
            "--",
            replay_bin(),
            "--speed",
            "50",
            "--port",
            &port.to_string(),
        ])
        .env_remove("SGLANG_SUPERVISOR_METRICS_ADDR")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut sup = KillOnDrop(sup);
    let held = &fake.held;
    let listening = wait_event(&ev, "listening");
    let metrics = listening["metrics"].as_str().unwrap().to_string();
    assert_ne!(metrics, DCGM_EXPORTER_ADDR, "{listening}");
    // The default port is held (by the fake, or by whoever held it before this test).
    let taken = &listening["metrics_default_taken"];
    let port: u16 = metrics.rsplit(':').next().unwrap().parse().unwrap();
    assert!(
        (19401..=19416).contains(&port),
        "{listening}; fake held {held:?}"
    );
    assert_eq!(taken["addr"], DEFAULT_METRICS_ADDR, "{listening}");
    if fake.holds(DEFAULT_METRICS_ADDR) {
        assert_eq!(taken["holder"], fake.name().as_str(), "{listening}");
    }
    let (status, _) = http(&metrics, "GET", "/-/healthy", "");
    assert!(status.contains("200"), "{status}");
    wait_event(&ev, "ready");
    let (status, _) = http(&metrics, "GET", "/-/ready", "");
    assert!(status.contains("200"), "{status}");
    unsafe { libc::kill(sup.0.id() as i32, libc::SIGTERM) };
    let out = sup.0.wait_with_output_timeout();
    assert_eq!(out.0, Some(143));
    if fake.holds(DEFAULT_METRICS_ADDR) {
        let warn = out.1.lines().find(|l| l.contains("is taken")).unwrap_or("");
        assert!(
            warn.contains(&fake.name()) && warn.contains(&metrics),
            "one line naming the holder and the new port: {}",
            out.1
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A supervisor that a failed assertion must not leave running (it holds a port).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

trait WaitOutput {
    fn wait_with_output_timeout(&mut self) -> (Option<i32>, String);
}

impl WaitOutput for std::process::Child {
    fn wait_with_output_timeout(&mut self) -> (Option<i32>, String) {
        let end = Instant::now() + Duration::from_secs(30);
        while self.try_wait().unwrap().is_none() {
            if Instant::now() > end {
                let _ = self.kill();
                panic!("supervisor did not stop within 30 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut err = String::new();
        std::io::Read::read_to_string(self.stderr.as_mut().unwrap(), &mut err).unwrap();
        (self.wait().unwrap().code(), err)
    }
}

#[test]
fn a_named_metrics_port_held_by_dcgm_exporter_fails_the_start_naming_it() {
    let addr = format!("127.0.0.1:{}", free_port());
    let fake = FakeExporter::start(&[&addr]);
    assert!(fake.holds(&addr), "the fake took {addr}");
    let out = Command::new(supervisor_bin())
        .args(["run", "--metrics-addr", &addr, "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let err = String::from_utf8_lossy(&out.stderr);
    // One line says it all (ROCm SMI's own start-up chatter may come before it).
    let line = err
        .lines()
        .find(|l| l.contains("cannot listen"))
        .unwrap_or("");
    assert!(
        line.contains(&addr) && line.contains(&fake.name()) && line.contains("--metrics-addr"),
        "{err}"
    );
}
