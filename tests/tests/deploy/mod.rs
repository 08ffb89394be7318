//! Shared by the deployment tests (Docker, Kubernetes): the supervisor run with the options a
//! deployment file gives it, in front of the replay server, and what its listeners answer.
#![allow(dead_code, clippy::unwrap_used, clippy::disallowed_methods)]
use crate::common::{free_port, replay_bin, supervisor_bin};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `sglang-supervisor run OPTIONS -- sglang-replay` (the options as a deployment names them,
/// with `--metrics-addr` moved to a free port on the same host), killed when dropped.
pub struct Deployed {
    child: Child,
    dir: PathBuf,
    /// The --metrics-addr the deployment named, and the one this run got instead.
    pub named_metrics: String,
    pub metrics: String,
}

impl Deployed {
    pub fn start(name: &str, options: &[String]) -> Deployed {
        let dir = std::env::temp_dir().join(format!("sglsup-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut options = options.to_vec();
        let i = options
            .iter()
            .position(|o| o == "--metrics-addr")
            .expect("the deployment names --metrics-addr");
        let named_metrics = options[i + 1].clone();
        let host = named_metrics.rsplit_once(':').unwrap().0.to_string();
        // The host as named (0.0.0.0 in a container), a free port: tests run side by side.
        options[i + 1] = format!("{host}:{}", free_port());
        let child = Command::new(supervisor_bin())
            .arg("run")
            .args(&options)
            .arg("--no-tee")
            .arg("--events")
            .arg(dir.join("events.jsonl"))
            .args([
                "--",
                replay_bin(),
                "--speed",
                "50",
                "--port",
                &free_port().to_string(),
            ])
            .env_remove("SGLANG_SUPERVISOR_METRICS_ADDR")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut d = Deployed {
            child,
            dir,
            named_metrics,
            metrics: String::new(),
        };
        d.metrics = d.wait_event("listening")["metrics"]
            .as_str()
            .unwrap()
            .to_string();
        d
    }

    pub fn wait_event(&self, name: &str) -> Value {
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            let text = std::fs::read_to_string(self.dir.join("events.jsonl")).unwrap_or_default();
            if let Some(e) = text
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find(|e| e["event"] == name)
            {
                return e;
            }
            assert!(Instant::now() < end, "no {name} event: {text}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// GET `path` on the metrics listener's port over loopback: the status line.
    pub fn get(&self, path: &str) -> String {
        let port = self.metrics.rsplit(':').next().unwrap();
        sglang_supervisor_tests::http(&format!("127.0.0.1:{port}"), "GET", path, "").0
    }

    /// SIGTERM (as `docker stop` and the kubelet send it): the exit status.
    pub fn stop(mut self) -> Option<i32> {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let end = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < end, "no exit within 30 s of SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
        self.child.wait().unwrap().code()
    }
}

impl Drop for Deployed {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
