//! Shared by the deployment tests (Docker, Kubernetes): the supervisor run with the options a
//! deployment file gives it, in front of the replay server, and what its listeners answer.
#![allow(dead_code, clippy::unwrap_used, clippy::disallowed_methods)]
use crate::common::{free_port, replay_bin, supervisor_bin};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether the replay server has its node-rank mode (`--node-rank N`: logs like a node of rank N,
/// serves only SGLang's dummy health server) and the supervisor its readiness for such a node
/// (both from branch `core`). Without them a rank-1 launch replays node 0 and is ready as such:
/// the tests then check everything but `ready.node_rank`, and say so.
pub fn node_rank_mode() -> bool {
    let help = Command::new(replay_bin()).arg("--help").output().unwrap();
    let has = String::from_utf8_lossy(&help.stdout).contains("--node-rank");
    if !has {
        eprintln!("NOT CHECKED: ready.node_rank (sglang-replay has no --node-rank mode yet)");
    }
    has
}

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
    events: PathBuf,
    /// The --metrics-addr the deployment named, and the one this run got instead.
    pub named_metrics: String,
    pub metrics: String,
}

impl Deployed {
    /// `launch` is what follows `python3 -m sglang.launch_server` (its --port moved to a free one).
    pub fn start(name: &str, options: &[String], launch: &[String]) -> Deployed {
        let dir = std::env::temp_dir().join(format!("sglsup-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // Files go where the deployment mounts its output volume (/out): here, a temp dir. Its
        // own --events stays (the events the test follows).
        let mut options: Vec<String> = options
            .iter()
            .map(|o| match o.strip_prefix("/out/") {
                Some(file) => dir.join(file).display().to_string(),
                None => o.clone(),
            })
            .collect();
        if !options.iter().any(|o| o == "--events") {
            options.extend([
                "--events".into(),
                dir.join("events.jsonl").display().to_string(),
            ]);
        }
        let events = options[options.iter().position(|o| o == "--events").unwrap() + 1].clone();
        let i = options
            .iter()
            .position(|o| o == "--metrics-addr")
            .expect("the deployment names --metrics-addr");
        let named_metrics = options[i + 1].clone();
        let host = named_metrics.rsplit_once(':').unwrap().0.to_string();
        // The host as named (0.0.0.0 in a container), a free port: tests run side by side.
        options[i + 1] = format!("{host}:{}", free_port());
        // The replay server takes the flags it knows only before the first one it does not:
        // those go first (the port a free one), SGLang's others after, accepted and ignored.
        let mut rest = launch.to_vec();
        let mut launch = vec!["--port".to_string(), free_port().to_string()];
        for flag in ["--port", "--nnodes", "--node-rank"] {
            if let Some(i) = rest.iter().position(|a| a == flag) {
                let pair: Vec<String> = rest.drain(i..(i + 2).min(rest.len())).collect();
                if flag != "--port" {
                    launch.extend(pair);
                }
            }
        }
        launch.extend(rest);
        let child = Command::new(supervisor_bin())
            .arg("run")
            .args(&options)
            .arg("--no-tee")
            .args(["--", replay_bin(), "--speed", "50"])
            .args(&launch)
            .env_remove("SGLANG_SUPERVISOR_METRICS_ADDR")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
            .spawn()
            .unwrap();
        let mut d = Deployed {
            child,
            events: PathBuf::from(events),
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

    pub fn wait_event(&mut self, name: &str) -> Value {
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            let text = std::fs::read_to_string(&self.events).unwrap_or_default();
            if let Some(e) = text
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find(|e| e["event"] == name)
            {
                return e;
            }
            let stderr = std::fs::read_to_string(self.dir.join("stderr")).unwrap_or_default();
            assert!(
                Instant::now() < end && !stderr.contains("cannot") && !stderr.contains("error:"),
                "no {name} event: {text}\nstderr: {stderr}"
            );
            if let Some(st) = self.child.try_wait().unwrap() {
                panic!("the supervisor exited ({st}) before {name}: {text}\nstderr: {stderr}");
            }
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
