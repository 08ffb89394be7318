//! Whatever kills the supervisor, the server's whole tree (setsid'd grandchildren included) is
//! gone within 2 s: the sentinel, in its own session, finds it by the run's marker variable, the
//! process group and its snapshots, and kills until nothing is left.
#![allow(clippy::disallowed_methods, clippy::unwrap_used)]
mod common;
use common::*;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(30);
const LIMIT: Duration = Duration::from_secs(2);

fn own_process_group() -> std::io::Result<()> {
    // As `timeout` does: the supervisor leads a group that a group kill takes whole.
    unsafe { libc::setpgid(0, 0) };
    Ok(())
}

/// Start a run whose tree has a worker in a new session, kill the supervisor with `kill`, and
/// return how long until none of the tree's processes is left.
fn tree_gone_after(name: &str, kill: impl FnOnce(i32)) -> Duration {
    let mut run = Run::start(
        name,
        Opts {
            replay: &["--speed", "50", "--grandchildren"],
            pre_exec: Some(own_process_group),
            ..Default::default()
        },
    );
    run.wait_event("ready", T);
    let before = run.survivors();
    assert!(
        before.len() >= 5,
        "main, scheduler, detokenizer, two grandchildren, one in a new session: {before:?}"
    );
    // A sentinel snapshot has been taken (every second).
    std::thread::sleep(Duration::from_millis(1100));
    let t0 = Instant::now();
    kill(run.child.id() as i32);
    let _ = run.wait(T);
    loop {
        let left = run.survivors();
        if left.is_empty() {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < LIMIT,
            "{name}: the tree outlived the supervisor by {LIMIT:?}: {left:?} of {before:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_sigkilled_supervisor_takes_its_whole_tree_within_2s() {
    let took = tree_gone_after("death-kill", |pid| unsafe {
        libc::kill(pid, libc::SIGKILL);
    });
    eprintln!("SIGKILL: tree gone {took:?} after");
}

#[test]
fn a_group_kill_of_the_supervisor_takes_its_whole_tree_within_2s() {
    // `timeout -s KILL`: SIGKILL to the supervisor's whole process group.
    let took = tree_gone_after("death-group", |pid| unsafe {
        libc::kill(-pid, libc::SIGKILL);
    });
    eprintln!("group SIGKILL: tree gone {took:?} after");
}

#[test]
fn a_crashed_supervisor_takes_its_whole_tree_within_2s() {
    // A signal it does not handle and that ends it (a crash, an abort).
    let took = tree_gone_after("death-abrt", |pid| unsafe {
        libc::kill(pid, libc::SIGABRT);
    });
    eprintln!("SIGABRT: tree gone {took:?} after");
}

#[test]
fn in_a_pid_namespace_with_the_hosts_proc_only_our_tree_is_killed_or_reported() {
    // `unshare -p -f` without remounting /proc: /proc numbers the host's processes, kill(2) ours.
    if !std::process::Command::new("unshare")
        .args(["-p", "-f", "true"])
        .status()
        .is_ok_and(|s| s.success())
    {
        eprintln!("skipped: cannot create a PID namespace here");
        return;
    }
    let mut bystander = std::process::Command::new("sleep")
        .arg("300")
        .spawn()
        .unwrap();
    let mut run = Run::start(
        "pidns",
        Opts {
            replay: &[
                "--speed",
                "50",
                "--grandchildren",
                "--exit-after-ready",
                "3:0.2",
            ],
            wrap: &["unshare", "-p", "-f"],
            ..Default::default()
        },
    );
    assert_eq!(run.wait(T), 3);
    let events = run.events();
    assert!(
        run.events_named("leftover").is_empty(),
        "only our own tree may be reported: {events:#?}"
    );
    let exited = run.events_named("exited");
    assert_eq!(exited[0]["exit_status"], 3, "{events:#?}");
    run.assert_no_survivors();
    assert!(
        bystander.try_wait().unwrap().is_none(),
        "a host process was killed by teardown"
    );
    let _ = bystander.kill();
    let _ = bystander.wait();
}
