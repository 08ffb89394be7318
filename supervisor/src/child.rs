//! The one way this program starts processes, the one thread that reaps them, and the process-tree
//! walk that lets teardown find every descendant (setsid ones included).
//!
//! Why one reaper: the supervisor is always a child subreaper (and may be PID 1), so orphans of
//! the server are re-parented to us and must be reaped, but `waitpid(-1)` would steal the status of
//! a child someone else waits for. So every status goes through this reaper: it peeks with
//! `WNOWAIT`, then takes the registry lock (which `spawn` holds from fork to registration), then
//! reaps exactly that pid and hands the status to whoever registered it.
use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("cannot start {program:?}: {source} (is it installed and on PATH? the command is run as argv, without a shell)")]
    Exec {
        program: String,
        source: std::io::Error,
    },
    #[error("no command given: put the server command after `--`")]
    Empty,
}

/// How a process ended, as `waitpid` told it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    Code(i32),
    Signal(i32),
}

impl ExitStatus {
    pub fn from_raw(status: i32) -> Self {
        if libc::WIFSIGNALED(status) {
            ExitStatus::Signal(libc::WTERMSIG(status))
        } else {
            ExitStatus::Code(libc::WEXITSTATUS(status))
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

fn reaper() -> &'static Reaper {
    static R: OnceLock<&'static Reaper> = OnceLock::new();
    R.get_or_init(|| {
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
        if let Err(e) = spawned {
            tracing::error!("cannot start the reaper thread: {e}; exit statuses will not be seen");
        }
        r
    })
}

fn lock(r: &Reaper) -> std::sync::MutexGuard<'_, Registry> {
    // A poisoned lock only means another thread panicked mid-update of a plain map: keep going.
    r.registry.lock().unwrap_or_else(|p| p.into_inner())
}

fn reap_forever(r: &'static Reaper) {
    loop {
        // SAFETY: siginfo_t is plain data; waitid fills it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid pointer to a siginfo_t; P_ALL ignores the id.
        let rc = unsafe { libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            // ECHILD: nothing to wait for until the next spawn.
            let g = lock(r);
            let _unused = r.has_children.wait_timeout(g, Duration::from_millis(500));
            continue;
        }
        // SAFETY: waitid succeeded with WEXITED, so si_pid is set.
        let pid = unsafe { info.si_pid() };
        if pid <= 0 {
            continue;
        }
        // Taking the lock first means a spawn in progress has registered its pid (or, if its exec
        // failed, std has already reaped it and the waitpid below finds nothing).
        let mut g = lock(r);
        let mut status = 0;
        // SAFETY: plain waitpid on one pid.
        let got = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if got != pid {
            continue;
        }
        match g.watchers.remove(&pid) {
            Some(tx) => {
                let _ = tx.send(ExitStatus::from_raw(status));
            }
            None => {
                g.orphans_reaped += 1;
                tracing::debug!(pid, status = ?ExitStatus::from_raw(status), "reaped an orphaned descendant");
            }
        }
    }
}

/// Orphans reaped so far (descendants re-parented to us that we collected).
pub fn orphans_reaped() -> u64 {
    lock(reaper()).orphans_reaped
}

/// Start a process. Every process this program starts goes through here.
pub fn spawn(spec: SpawnSpec<'_>) -> Result<Spawned, SpawnError> {
    spawn_with_env(spec, &[])
}

/// [`spawn`] with variables added to the inherited environment.
pub fn spawn_with_env(
    spec: SpawnSpec<'_>,
    env: &[(&str, &std::ffi::OsStr)],
) -> Result<Spawned, SpawnError> {
    let (program, args) = spec.argv.split_first().ok_or(SpawnError::Empty)?;
    let r = reaper();
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
    // SAFETY: signal() is async-signal-safe. The supervisor ignores SIGXFSZ (a file-size limit
    // must fail its log writes, not kill it); the child gets the default back, as it would have.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGXFSZ, libc::SIG_DFL);
            Ok(())
        });
    }
    if spec.die_with_parent {
        // SAFETY: getpid is async-signal-safe.
        let parent = unsafe { libc::getpid() };
        // SAFETY: only async-signal-safe calls (prctl, getppid, _exit) between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent may have died between fork and prctl: then nobody will signal us.
                if libc::getppid() != parent {
                    libc::_exit(137);
                }
                Ok(())
            });
        }
    }
    let mut g = lock(r);
    let mut child = cmd.spawn().map_err(|source| SpawnError::Exec {
        program: program.to_string_lossy().into_owned(),
        source,
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
    // SAFETY: plain prctl.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `/proc/PID/stat` fields we need.
#[derive(Debug, Clone, Copy)]
struct ProcStat {
    ppid: i32,
    pgid: i32,
    state: u8,
}

fn read_stat(pid: i32) -> Option<ProcStat> {
    let text = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    // comm is in parentheses and may contain anything: the fields follow the *last* ')'.
    let close = text.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(text.get(close + 2..)?).ok()?;
    let mut f = rest.split(' ');
    let state = f.next()?.bytes().next()?;
    let ppid = f.next()?.parse().ok()?;
    let pgid = f.next()?.parse().ok()?;
    Some(ProcStat { ppid, pgid, state })
}

fn all_pids() -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// Processes (zombies included) that descend from `root` or belong to process group `pgid`,
/// minus `exclude`.
pub fn tree_members(root: i32, pgid: Option<i32>, exclude: &[i32]) -> Vec<i32> {
    let stats: HashMap<i32, ProcStat> = all_pids()
        .into_iter()
        .filter_map(|p| Some((p, read_stat(p)?)))
        .collect();
    let mut out = Vec::new();
    for (&pid, st) in &stats {
        if pid == root || exclude.contains(&pid) {
            continue;
        }
        let in_group = pgid.is_some_and(|g| st.pgid == g);
        let mut seen = HashSet::new();
        let mut p = st.ppid;
        let mut descends = false;
        // Up the parent chain; the root may be PID 1 (we run as init), so walk to 0.
        while p > 0 && seen.insert(p) {
            if p == root {
                descends = true;
                break;
            }
            p = stats.get(&p).map_or(0, |s| s.ppid);
        }
        if descends || in_group {
            out.push(pid);
        }
    }
    out.sort_unstable();
    out
}

pub fn send_signal(pid: i32, sig: i32) -> bool {
    // SAFETY: plain kill(2).
    unsafe { libc::kill(pid, sig) == 0 }
}

/// SIGKILL the process group and every descendant of this process (except `exclude`); wait up to
/// `wait` for them to be gone, and return the pids that are still alive.
pub async fn kill_tree(pgid: i32, exclude: &[i32], wait: Duration) -> Vec<i32> {
    // SAFETY: getpid never fails.
    let me = unsafe { libc::getpid() };
    let deadline = Instant::now() + wait;
    loop {
        send_signal(-pgid, libc::SIGKILL);
        let members = tree_members(me, Some(pgid), exclude);
        for &p in &members {
            send_signal(p, libc::SIGKILL);
        }
        // Wait until they are reaped, not merely zombies: a GPU process whose main thread is a
        // zombie can still have threads tearing down its CUDA context (seen on a real H200).
        if members.is_empty() {
            return members;
        }
        if Instant::now() >= deadline {
            return members.into_iter().filter(|&p| is_running(p)).collect();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Not yet a plain zombie: running, or a zombie thread-group leader whose other threads still run.
pub fn is_running(pid: i32) -> bool {
    match read_stat(pid) {
        None => false,
        Some(s) if s.state == b'Z' || s.state == b'X' => {
            std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count()) > 1
        }
        Some(_) => true,
    }
}

/// Is this pid an exited, not yet reaped process (or gone)? Used to tell "the child exited by
/// itself" from "we stopped a live child" when both happen within a millisecond.
pub fn has_exited(pid: i32) -> bool {
    read_stat(pid).is_none_or(|s| s.state == b'Z' || s.state == b'X')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[tokio::test]
    async fn exit_codes_and_signals_are_reported() {
        let s = spawn(SpawnSpec {
            argv: &argv(&["sh", "-c", "exit 7"]),
            new_process_group: true,
            die_with_parent: true,
            stdin: Stdio::null(),
            stdout: Stdio::null(),
            stderr: Stdio::null(),
        })
        .unwrap();
        assert_eq!(s.exit.await.unwrap(), ExitStatus::Code(7));
        let s = spawn(SpawnSpec {
            argv: &argv(&["sh", "-c", "kill -9 $$"]),
            new_process_group: false,
            die_with_parent: false,
            stdin: Stdio::null(),
            stdout: Stdio::null(),
            stderr: Stdio::null(),
        })
        .unwrap();
        assert_eq!(s.exit.await.unwrap(), ExitStatus::Signal(9));
        assert_eq!(ExitStatus::Signal(9).shell_code(), 137);
    }

    #[test]
    fn missing_program_is_a_clear_error() {
        let e = spawn(SpawnSpec {
            argv: &argv(&["/nonexistent/server"]),
            new_process_group: true,
            die_with_parent: true,
            stdin: Stdio::null(),
            stdout: Stdio::null(),
            stderr: Stdio::null(),
        })
        .err()
        .unwrap();
        assert!(e.to_string().contains("/nonexistent/server"), "{e}");
    }

    #[test]
    fn stat_parsing_survives_odd_comm_names() {
        let me = std::process::id() as i32;
        let st = read_stat(me).unwrap();
        assert!(st.ppid > 0 && st.pgid > 0);
    }
}
