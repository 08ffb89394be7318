//! Every start of a thread or a process the supervisor makes, refused in turn: the run ends with
//! a clear error (exit 125) or goes on without what was refused, never a panic or a hang; it ends
//! with its terminal event; it leaves no process; and the supervisor's own messages still reach
//! the terminal. The refusal is injected by a preloaded library (`tests/stubs/refuse_task.c`)
//! that fails the Nth `pthread_create`/`fork`/`posix_spawn` with EAGAIN, as the OS does at the
//! limit on processes and threads: deterministic where `thread_limit.rs`'s real limit depends on
//! what else the user runs at that moment.
#![allow(clippy::disallowed_methods, clippy::unwrap_used)]
mod common;
use common::*;
use std::process::Command;
use std::time::{Duration, Instant};

fn refuse_task_lib() -> &'static std::path::PathBuf {
    static LIB: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    LIB.get_or_init(|| build_stub("refuse_task.c", "librefuse_task.so"))
}

struct Outcome {
    start: usize,
    code: i32,
    spawned: bool,
    last_line: String,
}

/// Runs the supervisor once per start, refusing that one, until a run makes fewer starts; checks
/// each run and returns what each did.
fn sweep(name: &str, extra: &[&str]) -> Vec<Outcome> {
    let dir = temp_dir(name);
    let mut outcomes = Vec::new();
    for n in 1.. {
        let events = dir.join(format!("events-{n}.jsonl"));
        let tag = format!("{name}-{}-{n}", std::process::id());
        let started = Instant::now();
        // The preload goes to the supervisor alone (through `env`), not to `timeout`.
        let out = Command::new("timeout")
            .args(["-s", "KILL", "20", "env"])
            .arg(format!("LD_PRELOAD={}", refuse_task_lib().display()))
            .arg(format!("SGLSUP_REFUSE_TASK={n}"))
            .arg(supervisor_bin())
            .args(["run", "--no-tee", "--ready-timeout", "1s", "--grace", "1s"])
            .args(extra)
            .arg("--events")
            .arg(&events)
            .args(["--", "sleep", "30"])
            .env("REPLAY_TAG", &tag)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        if !stderr.contains(&format!("refuse_task: refused start {n} ")) {
            // This run made fewer than n starts: every one has been refused once.
            break;
        }
        let last_line = stderr.lines().last().unwrap_or("").to_string();
        let elapsed = started.elapsed();
        let code = out.status.code();
        assert!(
            elapsed < Duration::from_secs(15) && code.is_some(),
            "{name}, start {n} refused: hung (killed after {elapsed:?}): {last_line}"
        );
        let code = code.unwrap();
        assert!(
            !stderr.contains("panicked"),
            "{name}, start {n} refused: a panic: {stderr}"
        );
        assert!(
            code == 125 || code == 124,
            "{name}, start {n} refused: exit {code}, not 125 (could not start) or 124 (the server never became ready): {stderr}"
        );
        let written = std::fs::read_to_string(&events).unwrap_or_default();
        assert!(
            written
                .lines()
                .last()
                .is_some_and(|l| l.contains(r#""event":"exited""#)),
            "{name}, start {n} refused: the events file does not end with `exited`: {written}"
        );
        let spawned = written.contains(r#""event":"spawned""#);
        if spawned {
            // Our own messages were not lost with a refused writer thread.
            assert!(
                stderr.contains("spawned the server"),
                "{name}, start {n} refused: the supervisor's messages are missing: {stderr}"
            );
        }
        if code == 125 {
            assert!(
                last_line.starts_with("sglang-supervisor: error: ")
                    && last_line.contains("the limit on processes and threads is reached"),
                "{name}, start {n} refused: the error does not say what was refused and what to do: {last_line}"
            );
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while !tagged_processes(&tag).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(
            tagged_processes(&tag),
            Vec::<i32>::new(),
            "{name}, start {n} refused: processes outlived the run"
        );
        outcomes.push(Outcome {
            start: n,
            code,
            spawned,
            last_line,
        });
    }
    let _ = std::fs::remove_dir_all(&dir);
    let seen: Vec<_> = outcomes
        .iter()
        .map(|o| (o.start, o.code, o.spawned))
        .collect();
    eprintln!("{name}: start refused, exit status, server started: {seen:?}");
    assert!(
        outcomes.len() >= 10,
        "{name}: only {} starts seen: is the preload working?",
        outcomes.len()
    );
    outcomes
}

fn refused_with(outcomes: &[Outcome], words: &str) -> bool {
    outcomes
        .iter()
        .any(|o| o.code == 125 && o.last_line.contains(words))
}

#[test]
fn every_refused_start_of_a_bare_run_ends_it_cleanly_or_is_done_without() {
    let outcomes = sweep(
        "refuse-bare",
        &["--metrics-addr", "none", "--gpu-backend", "none"],
    );
    for words in [
        "cannot start the pre-flight's thread",
        "cannot start the supervisor's threads",
        "cannot start the async runtime",
        // A reaper refused would leave the server's exit unseen: nothing is started then.
        "the thread that collects exit statuses could not be started",
        "cannot start \"sleep\": Resource temporarily unavailable",
        "cannot start a thread to read the server's output",
    ] {
        assert!(
            refused_with(&outcomes, words),
            "no run refused with {words:?}"
        );
    }
    // And refusals the run carries on without (the sentinel, the parser thread, the terminal's
    // writer, the start-up profile): the server was started and stopped at its ready timeout.
    assert!(outcomes.iter().filter(|o| o.code == 124).count() >= 3);
}

#[test]
fn every_refused_start_with_the_proxy_the_gpu_sampler_and_metrics_ends_it_cleanly_or_is_done_without(
) {
    let nvml = stub_lib().display().to_string();
    let outcomes = sweep(
        "refuse-full",
        &[
            "--proxy-addr",
            "127.0.0.1:0",
            "--metrics-addr",
            "127.0.0.1:0",
            "--gpu-backend",
            "nvml",
            "--nvml-lib",
            &nvml,
        ],
    );
    for words in [
        "cannot start the GPU sampler's threads",
        // A shard's runtime was dropped inside the async runtime: a panic, before.
        "cannot start the proxy's threads",
    ] {
        assert!(
            refused_with(&outcomes, words),
            "no run refused with {words:?}"
        );
    }
}
