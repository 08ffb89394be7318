//! The one way this program starts processes, the one thread that reaps them, and the process-tree
//! walk that lets teardown find every descendant (setsid ones included).
//!
//! Why one reaper: the supervisor is always a child subreaper (and may be PID 1), so orphans of
//! the server are re-parented to us and must be reaped, but `waitpid(-1)` would steal the status of
//! a child someone else waits for. So every status goes through this reaper: it peeks with
//! `WNOWAIT`, then takes the registry lock (which `spawn` holds from fork to registration), then
//! reaps exactly that pid and hands the status to whoever registered it.
use crate::proctree::{self, Table, Tree};
use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::wait::{waitid, waitpid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use sglang_probes::sync::lock;
use std::collections::HashMap;
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// `cause` is said in the line, not chained as a source: the line would repeat it.
    #[error("cannot start {program:?}: {cause}{hint}", hint = exec_hint(.cause))]
    Exec {
        program: String,
        cause: std::io::Error,
    },
    #[error("no command given: put the server command after `--`")]
    Empty,
    /// The thread that collects exit statuses was refused when first needed.
    #[error("cannot start {program:?}: the thread that collects exit statuses could not be started: {cause}{hint}", hint = exec_hint(.cause))]
    NoReaper {
        program: String,
        cause: std::io::Error,
    },
}

impl SpawnError {
    /// Refused for want of processes, threads, files or memory: the program itself may be fine.
    pub fn is_resource_limit(&self) -> bool {
        match self {
            SpawnError::NoReaper { .. } => true,
            SpawnError::Exec { cause, .. } => limit_hint(cause).is_some(),
            SpawnError::Empty => false,
        }
    }
}

/// The limit a refused start ran into, said with what to do: processes and threads, open files,
/// or memory (the same command would start later). `None`: not a limit.
fn limit_hint(e: &std::io::Error) -> Option<&'static str> {
    match e.raw_os_error() {
        Some(nix::libc::EAGAIN) => Some(sglang_probes::sync::THREAD_LIMIT_HINT),
        Some(nix::libc::EMFILE | nix::libc::ENFILE) => Some(
            " (the limit on open files is reached: `ulimit -n`; raise it or close other files)",
        ),
        Some(nix::libc::ENOMEM) => Some(" (out of memory)"),
        _ => None,
    }
}

/// What a refused start means: a limit reached, or else the program not found or not runnable.
fn exec_hint(e: &std::io::Error) -> &'static str {
    limit_hint(e)
        .unwrap_or(" (is it installed and on PATH? the command is run as argv, without a shell)")
}

/// How a process ended, as `waitpid` told it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    Code(i32),
    Signal(i32),
}

impl ExitStatus {
    fn from_wait(status: WaitStatus) -> Option<Self> {
        match status {
            WaitStatus::Exited(_, code) => Some(ExitStatus::Code(code)),
            WaitStatus::Signaled(_, sig, _) => Some(ExitStatus::Signal(sig as i32)),
            _ => None,
        }
    }

    /// Shell convention: the code, or 128+N for signal N.
    pub fn shell_code(self) -> i32 {
        match self {
            ExitStatus::Code(c) => c,
            ExitStatus::Signal(s) => 128 + s,
        }
    }
}

/// What to start and how.
pub struct SpawnSpec<'a> {
    pub argv: &'a [OsString],
    /// Own process group (pgid = pid), so the whole server tree can be signalled at once.
    pub new_process_group: bool,
    /// SIGKILL the child when the spawning thread dies (a SIGKILLed supervisor leaves no server).
    /// Linux ties this to the *thread*: spawn from a thread that lives as long as the child.
    pub die_with_parent: bool,
    pub stdin: Stdio,
    pub stdout: Stdio,
    pub stderr: Stdio,
}

pub struct Spawned {
    pub pid: i32,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
    pub stdin: Option<OwnedFd>,
    /// Resolves when the reaper collected this process.
    pub exit: oneshot::Receiver<ExitStatus>,
}

struct Registry {
    watchers: HashMap<i32, oneshot::Sender<ExitStatus>>,
    /// Reaped orphans (not ours to report), kept only as a count.
    orphans_reaped: u64,
}

struct Reaper {
    registry: Mutex<Registry>,
    has_children: Condvar,
}

/// The one reaper, and why its thread could not be started if it could not (the OS's error
/// number): then no exit status would ever be seen, so nothing may be started.
fn reaper() -> (&'static Reaper, Option<i32>) {
    static R: OnceLock<(&'static Reaper, Option<i32>)> = OnceLock::new();
    *R.get_or_init(|| {
        let r: &'static Reaper = Box::leak(Box::new(Reaper {
            registry: Mutex::new(Registry {
                watchers: HashMap::new(),
                orphans_reaped: 0,
            }),
            has_children: Condvar::new(),
        }));
        let spawned = std::thread::Builder::new()
            .name("reaper".into())
            .spawn(move || reap_forever(r));
        let refused = spawned
            .err()
            .map(|e| e.raw_os_error().unwrap_or(nix::libc::EAGAIN));
        (r, refused)
    })
}

fn reap_forever(r: &'static Reaper) {
    loop {
        let pid = match waitid(Id::All, WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT) {
            Ok(ws) => match ws.pid() {
                Some(p) => p,
                None => continue,
            },
            Err(Errno::EINTR) => continue,
            Err(_) => {
                // ECHILD: nothing to wait for until the next spawn.
                let g = lock(&r.registry);
                let _unused = r.has_children.wait_timeout(g, Duration::from_millis(500));
                continue;
            }
        };
        // Taking the lock first means a spawn in progress has registered its pid (or, if its exec
        // failed, std has already reaped it and the waitpid below finds nothing).
        let mut g = lock(&r.registry);
        let Some(status) = waitpid(pid, Some(WaitPidFlag::WNOHANG))
            .ok()
            .and_then(ExitStatus::from_wait)
        else {
            continue;
        };
        match g.watchers.remove(&pid.as_raw()) {
            Some(tx) => {
                let _ = tx.send(status);
            }
            None => {
                g.orphans_reaped += 1;
                tracing::debug!(pid = pid.as_raw(), ?status, "reaped an orphaned descendant");
            }
        }
    }
}

/// Orphans reaped so far (descendants re-parented to us that we collected).
pub fn orphans_reaped() -> u64 {
    lock(&reaper().0.registry).orphans_reaped
}

/// Start a process. Every process this program starts goes through here.
/// `env`: variables added to the inherited environment (the profiler's trace directory).
pub fn spawn(spec: SpawnSpec<'_>, env: &[(&str, &std::ffi::OsStr)]) -> Result<Spawned, SpawnError> {
    let (program, args) = spec.argv.split_first().ok_or(SpawnError::Empty)?;
    let r = match reaper() {
        (r, None) => r,
        // A process whose exit nobody collects would be waited for forever.
        (_, Some(errno)) => {
            return Err(SpawnError::NoReaper {
                program: program.to_string_lossy().into_owned(),
                cause: std::io::Error::from_raw_os_error(errno),
            })
        }
    };
    #[allow(clippy::disallowed_methods)] // this is the one place allowed to build a Command
    let mut cmd = std::process::Command::new(program);
    cmd.args(args)
        .envs(env.iter().copied())
        .stdin(spec.stdin)
        .stdout(spec.stdout)
        .stderr(spec.stderr);
    if spec.new_process_group {
        cmd.process_group(0);
    }
    // Every process we start carries the run's marker, and so do its descendants: the sentinel
    // finds them by it after we are gone and they were re-parented away.
    cmd.env(proctree::marker(), "1");
    // SAFETY: only async-signal-safe calls (signal, setrlimit) between fork and exec. The
    // supervisor ignores SIGXFSZ (a file-size limit must fail its log writes, not kill it) and
    // raised its open-file limit; the child gets both back as they would have been.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::signal::signal(Signal::SIGXFSZ, nix::sys::signal::SigHandler::SigDfl)?;
            crate::rlimits::restore_nofile_for_child()
        });
    }
    if spec.die_with_parent {
        let parent = nix::unistd::getpid();
        // SAFETY: only async-signal-safe calls (prctl, getppid, _exit) between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
                // The parent may have died between fork and prctl: then nobody will signal us.
                if nix::unistd::getppid() != parent {
                    libc::_exit(137);
                }
                Ok(())
            });
        }
    }
    let mut g = lock(&r.registry);
    let mut child = cmd.spawn().map_err(|cause| SpawnError::Exec {
        program: program.to_string_lossy().into_owned(),
        cause,
    })?;
    let pid = child.id() as i32;
    let (tx, rx) = oneshot::channel();
    g.watchers.insert(pid, tx);
    drop(g);
    r.has_children.notify_all();
    Ok(Spawned {
        pid,
        stdout: child.stdout.take().map(OwnedFd::from),
        stderr: child.stderr.take().map(OwnedFd::from),
        stdin: child.stdin.take().map(OwnedFd::from),
        exit: rx,
    })
}

/// Make this process the subreaper of its descendants (orphans come to us, not to PID 1).
pub fn become_subreaper() -> std::io::Result<()> {
    nix::sys::prctl::set_child_subreaper(true).map_err(std::io::Error::from)
}

pub fn send_signal(pid: i32, sig: i32) -> bool {
    match Signal::try_from(sig) {
        Ok(sig) => kill(Pid::from_raw(pid), sig).is_ok(),
        Err(_) => false,
    }
}

/// SIGKILL the process group and every process of the server's tree (see `proctree`) except
/// `exclude`; wait up to `wait` for them to be gone, and return the pids that are still alive.
pub async fn kill_tree(pgid: i32, exclude: &[i32], wait: Duration) -> Vec<i32> {
    let tree = Tree {
        root: Some(nix::unistd::getpid().as_raw()),
        pgid: Some(pgid),
        marker: Some(proctree::marker()),
        known: &[],
        exclude,
    };
    let deadline = Instant::now() + wait;
    loop {
        if pgid > 1 {
            let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        }
        let members = Table::read().members(&tree);
        for p in &members {
            let _ = kill(Pid::from_raw(p.pid), Signal::SIGKILL);
        }
        // Wait until they are reaped, not merely zombies: a GPU process whose main thread is a
        // zombie can still have threads tearing down its CUDA context (seen on a real H200).
        if members.is_empty() {
            return Vec::new();
        }
        if Instant::now() >= deadline {
            return members
                .into_iter()
                .filter(|p| p.is_running())
                .map(|p| p.pid)
                .collect();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Is this process (anyone's, e.g. another run's supervisor) still running: present and not a
/// zombie.
pub fn is_running(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().bytes().next());
    !matches!(state, None | Some(b'Z' | b'X'))
}

/// Is this child of ours an exited, not yet reaped process (or gone)? Used to tell "the child
/// exited by itself" from "we stopped a live child" when both happen within a millisecond.
pub fn has_exited(pid: i32) -> bool {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT | WaitPidFlag::WNOHANG;
    !matches!(
        waitid(Id::Pid(Pid::from_raw(pid)), flags),
        Ok(WaitStatus::StillAlive)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    /// A refused fork is a limit, not a PATH question (found at `--nproc=4`: "is it installed
    /// and on PATH?", and the cause said twice).
    #[test]
    fn a_refused_fork_names_the_limit_and_says_its_cause_once() {
        let refused = SpawnError::Exec {
            program: "sh".into(),
            cause: std::io::Error::from_raw_os_error(nix::libc::EAGAIN),
        };
        let line = format!("{:#}", anyhow::Error::from(refused));
        assert!(
            line.contains("ulimit -u") && !line.contains("PATH"),
            "{line}"
        );
        assert_eq!(line.matches("os error 11").count(), 1, "{line}");
    }

    #[tokio::test]
    async fn exit_codes_and_signals_are_reported() {
        let s = spawn(
            SpawnSpec {
                argv: &argv(&["sh", "-c", "exit 7"]),
                new_process_group: true,
                die_with_parent: true,
                stdin: Stdio::null(),
                stdout: Stdio::null(),
                stderr: Stdio::null(),
            },
            &[],
        )
        .unwrap();
        assert_eq!(s.exit.await.unwrap(), ExitStatus::Code(7));
        let s = spawn(
            SpawnSpec {
                argv: &argv(&["sh", "-c", "kill -9 $$"]),
                new_process_group: false,
                die_with_parent: false,
                stdin: Stdio::null(),
                stdout: Stdio::null(),
                stderr: Stdio::null(),
            },
            &[],
        )
        .unwrap();
        assert_eq!(s.exit.await.unwrap(), ExitStatus::Signal(9));
        assert_eq!(ExitStatus::Signal(9).shell_code(), 137);
    }

    #[test]
    fn missing_program_is_a_clear_error() {
        let e = spawn(
            SpawnSpec {
                argv: &argv(&["/nonexistent/server"]),
                new_process_group: true,
                die_with_parent: true,
                stdin: Stdio::null(),
                stdout: Stdio::null(),
                stderr: Stdio::null(),
            },
            &[],
        )
        .err()
        .unwrap();
        let line = format!("{:#}", anyhow::Error::from(e));
        assert!(line.contains("/nonexistent/server"), "{line}");
        assert!(line.contains("is it installed and on PATH?"), "{line}");
        assert_eq!(line.matches("No such file").count(), 1, "{line}");
    }
}
