//! examples/slurm/sglang-multinode.sbatch on a real 2-node Slurm (Debian's slurm-wlm, two slurmd
//! on this machine: scripts/slurm-local-cluster.sh): one supervisor per node under srun, the
//! replay server in node-rank mode behind each, readiness of every node awaited with `wait`, a
//! benchmark window on node 0, teardown; and `scancel`, which SIGTERMs every process of the
//! step (servers included) and SIGKILLs KillWait (10 s) later: both supervisors must end the
//! run themselves, 143 (a requested stop), before that, leaving no process.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)]
mod common;
mod deploy;
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const NODES: usize = 2;
/// The local cluster's KillWait (scripts/slurm-local-cluster.sh).
const KILL_WAIT: Duration = Duration::from_secs(10);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Starts the local cluster once per test binary; false (said on stderr) only when Slurm cannot
/// run here at all: not installed (`scripts/setup.sh` installs it), or no root and no sudo.
fn slurm() -> bool {
    static UP: OnceLock<bool> = OnceLock::new();
    *UP.get_or_init(|| {
        // The cluster script runs the controller and node daemons; the jobs need the client.
        let installed = ["slurmctld", "slurmd", "sbatch"]
            .iter()
            .all(|b| Command::new(b).arg("-V").output().is_ok());
        let root = unsafe { libc::geteuid() } == 0;
        let sudo = || {
            Command::new("sudo")
                .args(["-n", "true"])
                .status()
                .is_ok_and(|s| s.success())
        };
        if !installed || !(root || sudo()) {
            eprintln!(
                "SKIPPED: Slurm cannot run here ({}): run scripts/setup.sh as root",
                if installed {
                    "neither root nor sudo"
                } else {
                    "slurmctld, slurmd or sbatch is not installed"
                }
            );
            return false;
        }
        Command::new(repo().join("scripts/slurm-local-cluster.sh"))
            .args(["start", &NODES.to_string()])
            .output()
            .unwrap()
            .expect_success("the local Slurm cluster did not start");
        true
    })
}

/// A port P with P+1 free too (node 1 of a one-host cluster takes P+1: NODE_PORT_STRIDE=1),
/// below Linux's ephemeral range: the job binds it seconds later, and a port the kernel hands out
/// for outgoing connections (every test's HTTP) could be taken by then.
fn free_pair() -> u16 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    let seed = std::process::id().wrapping_mul(7919) ^ now.map_or(0, |d| d.subsec_nanos());
    loop {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let p = 20000 + (seed.wrapping_add(n.wrapping_mul(7907)) % 12000) as u16;
        let free = |p: u16| std::net::TcpListener::bind(("0.0.0.0", p)).is_ok();
        if free(p) && free(p + 1) {
            return p;
        }
    }
}

struct Job {
    id: String,
    out: PathBuf,
    tag: String,
}

impl Job {
    /// sbatch the example with the replay server (`server_args`) as SGLang and `bench` as the
    /// benchmark.
    fn submit(name: &str, bench: &str, server_args: &str) -> Job {
        let tag = format!("slurm-{name}-{}", std::process::id());
        let out = std::env::temp_dir().join(format!("sglsup-{tag}"));
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(&out).unwrap();
        let port = |p: u16| p.to_string();
        let sbatch = Command::new("sbatch")
            .arg("--parsable")
            .arg(format!("--output={}/job.out", out.display()))
            .arg(repo().join("examples/slurm/sglang-multinode.sbatch"))
            .env("SUPERVISOR", supervisor_bin())
            .env("SERVER", replay_bin())
            .env("SERVER_ARGS", server_args)
            .env("PORT", port(free_pair()))
            .env("METRICS_PORT", port(free_pair()))
            .env("PROXY_PORT", port(free_pair()))
            .env("NODE_PORT_STRIDE", "1")
            .env("READY_TIMEOUT", "60s")
            .env("OUT", &out)
            .env("BENCH", bench)
            // Every process of the job inherits it: how leftovers are found.
            .env("REPLAY_TAG", &tag)
            .output()
            .unwrap()
            .expect_success("sbatch");
        let id = String::from_utf8(sbatch.stdout).unwrap().trim().to_string();
        Job { id, out, tag }
    }

    fn job_out(&self) -> String {
        std::fs::read_to_string(self.out.join("job.out")).unwrap_or_default()
    }

    fn node_file(&self, n: usize, name: &str) -> PathBuf {
        self.out.join(format!("node{n}")).join(name)
    }

    fn events(&self, n: usize) -> Vec<Value> {
        std::fs::read_to_string(self.node_file(n, "events.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    fn event(&self, n: usize, name: &str) -> Option<Value> {
        self.events(n).into_iter().find(|e| e["event"] == name)
    }

    fn exit_status(&self, n: usize) -> Option<i32> {
        std::fs::read_to_string(self.node_file(n, "exit_status"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    }

    fn wait_until(&self, what: &str, timeout: Duration, done: impl Fn() -> bool) {
        let end = Instant::now() + timeout;
        while !done() {
            assert!(
                Instant::now() < end,
                "{what}: not within {timeout:?}; job output:\n{}",
                self.job_out()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn gone(&self) -> bool {
        let q = Command::new("squeue")
            .args(["-h", "-j", &self.id])
            .output()
            .unwrap();
        String::from_utf8_lossy(&q.stdout).trim().is_empty()
    }

    /// `JobState` and `ExitCode` as slurmctld keeps them after the end.
    fn final_state(&self) -> (String, String) {
        let s = Command::new("scontrol")
            .args(["show", "job", &self.id])
            .output()
            .unwrap();
        let s = String::from_utf8_lossy(&s.stdout).to_string();
        let field = |k: &str| {
            s.split_whitespace()
                .find_map(|w| w.strip_prefix(k))
                .unwrap_or_default()
                .to_string()
        };
        (field("JobState="), field("ExitCode="))
    }

    fn assert_both_nodes_ready(&self) {
        for n in 0..NODES {
            let ready = self.event(n, "ready").unwrap();
            if n > 0 && deploy::node_rank_mode() {
                // Node rank >= 1 serves no API: readiness from its ranks and the health server.
                assert_eq!(ready["node_rank"], n, "{ready}");
                assert_eq!(ready["nnodes"], NODES, "{ready}");
            }
        }
    }

    /// Both supervisors ended the run: 143, a requested stop, node 0's server drained.
    fn assert_both_stopped_cleanly(&self) {
        self.assert_both_stopped(true)
    }

    fn assert_both_stopped(&self, drained: bool) {
        for n in 0..NODES {
            assert_eq!(
                self.exit_status(n),
                Some(143),
                "node {n}: {}",
                self.job_out()
            );
            let exited = self.event(n, "exited").unwrap();
            assert_eq!(exited["requested"], true, "node {n}: {exited}");
            assert_eq!(exited["exit_status"], 143, "node {n}: {exited}");
            // Node 0 runs the API and its graceful drain (a node of rank >= 1 has no
            // tokenizer manager, so no drain of its own to log).
            if n == 0 {
                let log = std::fs::read_to_string(self.node_file(n, "server.log")).unwrap();
                assert_eq!(log.contains("SIGTERM received"), drained, "node {n}: {log}");
            }
            let report: Value =
                serde_json::from_slice(&std::fs::read(self.node_file(n, "report.json")).unwrap())
                    .unwrap();
            assert_eq!(report["teardown"]["exited"]["exit_status"], 143, "node {n}");
        }
    }

    fn assert_no_process_left(&self) {
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            let left: Vec<_> = tagged_any(&self.tag)
                .into_iter()
                .filter(|(_, state, _)| state != "Z")
                .collect();
            if left.is_empty() {
                return;
            }
            if Instant::now() > end {
                for (pid, _, _) in &left {
                    unsafe { libc::kill(*pid, libc::SIGKILL) };
                }
                panic!("processes of the job survived it: {left:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if !self.gone() {
            let _ = Command::new("scancel")
                .args(["-s", "KILL", &self.id])
                .status();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.out);
        }
    }
}

#[test]
fn sbatch_runs_a_supervisor_per_node_benchmarks_on_node_0_and_tears_down_with_143() {
    if !slurm() {
        return;
    }
    let bench = "for i in 1 2 3; do curl -fsS -H 'Content-Type: application/json' \
        -d '{\"text\":\"hi\",\"sampling_params\":{\"max_new_tokens\":4}}' \
        http://127.0.0.1:$PROXY_PORT/generate > /dev/null; done";
    let job = Job::submit("bench", bench, "--speed 50");
    job.wait_until("the job's end", Duration::from_secs(120), || job.gone());
    assert!(
        job.job_out().contains("all 2 nodes ready"),
        "{}",
        job.job_out()
    );
    job.assert_both_nodes_ready();
    // The benchmark's window, on node 0: its three requests, measured by node 0's proxy.
    let window: Value =
        serde_json::from_slice(&std::fs::read(job.out.join("window.json")).unwrap()).unwrap();
    assert_eq!(window["name"], "bench", "{window}");
    assert_eq!(window["requests"]["completed"], 3, "{window}");
    job.assert_both_stopped_cleanly();
    assert_eq!(
        job.final_state(),
        ("COMPLETED".into(), "0:0".into()),
        "{}",
        job.job_out()
    );
    job.assert_no_process_left();
}

#[test]
fn scancel_ends_both_supervisors_with_143_within_kill_wait_and_leaves_no_process() {
    if !slurm() {
        return;
    }
    // A benchmark that would run for ten minutes: the job is cancelled in the middle of it.
    let job = Job::submit("scancel", "sleep 600", "--speed 50");
    job.wait_until("every node ready", Duration::from_secs(90), || {
        job.job_out().contains("all 2 nodes ready")
    });
    job.assert_both_nodes_ready();
    let cancelled = Instant::now();
    Command::new("scancel")
        .arg(&job.id)
        .output()
        .unwrap()
        .expect_success("scancel");
    job.wait_until("both supervisors' exit", KILL_WAIT, || {
        (0..NODES).all(|n| job.exit_status(n).is_some())
    });
    let took = cancelled.elapsed();
    assert!(
        took < KILL_WAIT,
        "{took:?}: Slurm's SIGKILL would have come first"
    );
    job.assert_both_stopped_cleanly();
    job.wait_until("the job's end", KILL_WAIT, || job.gone());
    assert_eq!(job.final_state().0, "CANCELLED", "{}", job.job_out());
    job.assert_no_process_left();
}

#[test]
fn scancel_of_servers_that_ignore_sigterm_still_ends_143_by_the_supervisors_before_kill_wait() {
    if !slurm() {
        return;
    }
    // The supervisors' --grace (KillWait - 2 s) runs out, they SIGKILL their trees themselves.
    let job = Job::submit("deaf", "sleep 600", "--speed 50 --ignore-sigterm");
    job.wait_until("every node ready", Duration::from_secs(90), || {
        job.job_out().contains("all 2 nodes ready")
    });
    let cancelled = Instant::now();
    assert!(Command::new("scancel")
        .arg(&job.id)
        .status()
        .unwrap()
        .success());
    job.wait_until("both supervisors' exit", KILL_WAIT, || {
        (0..NODES).all(|n| job.exit_status(n).is_some())
    });
    let took = cancelled.elapsed();
    assert!(
        took >= KILL_WAIT - Duration::from_secs(3) && took < KILL_WAIT,
        "{took:?}: the grace period, then the supervisors' own SIGKILL, before Slurm's"
    );
    job.assert_both_stopped(false);
    job.wait_until("the job's end", KILL_WAIT, || job.gone());
    job.assert_no_process_left();
}
