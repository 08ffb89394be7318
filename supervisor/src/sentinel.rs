//! Whatever ends the supervisor (SIGKILL, its whole process group killed by `timeout -s KILL`,
//! a signal it does not handle, a crash), the server's tree must go with it: PR_SET_PDEATHSIG
//! takes only the server's main process, and a real orphaned scheduler went on to hold 128 GiB
//! of GPU memory. So a small helper process watches us:
//!
//! - it runs in its own session, so a signal to our process group or session misses it;
//! - it holds the read end of a pipe from us: end-of-file without our "done" byte means we died;
//! - it knows the tree without us: the run's marker variable every process we start inherits,
//!   the server's process group, and (pid, start time) snapshots of our descendants taken every
//!   second while we live (for a process that both left the group and cleared its environment);
//! - then it SIGKILLs every member and looks again, until none is left.
use crate::child::{spawn, SpawnSpec};
use crate::proctree::{self, Table, Tree};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, killpg, SigHandler, Signal};
use nix::unistd::Pid;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// How often the sentinel records our descendants while we live.
const SNAPSHOT_EVERY: Duration = Duration::from_secs(1);
/// How long it keeps killing after we died (a tree that forks faster than it dies).
const KILL_FOR_AT_MOST: Duration = Duration::from_secs(30);

/// Our end of the pipe. `disarm` on a normal exit; dropping it without (i.e. dying) fires it.
pub struct Sentinel {
    pub pid: i32,
    pipe: Option<std::fs::File>,
    exit: tokio::sync::oneshot::Receiver<crate::child::ExitStatus>,
}

impl Sentinel {
    /// Start it, and wait until it is in its own session (a group kill from then on misses it).
    /// Start it before the server, so no moment of the server's life is unwatched.
    pub fn start() -> std::io::Result<Sentinel> {
        let exe = std::env::current_exe()?;
        let argv: Vec<OsString> = vec![
            exe.into(),
            "__sentinel".into(),
            "--marker".into(),
            proctree::marker().into(),
        ];
        let s = spawn(
            SpawnSpec {
                argv: &argv,
                new_process_group: false,
                die_with_parent: false,
                stdin: Stdio::piped(),
                stdout: Stdio::piped(),
                stderr: Stdio::inherit(),
            },
            &[],
        )
        .map_err(std::io::Error::other)?;
        let mut ready = s
            .stdout
            .map(std::fs::File::from)
            .ok_or_else(|| std::io::Error::other("the sentinel's stdout pipe is missing"))?;
        let mut b = [0u8; 1];
        // Its one byte says it has called setsid (EOF: it failed to start).
        if ready.read(&mut b)? != 1 {
            return Err(std::io::Error::other("the sentinel exited at start"));
        }
        Ok(Sentinel {
            pid: s.pid,
            pipe: s.stdin.map(std::fs::File::from),
            exit: s.exit,
        })
    }

    /// Tell it the server's process group.
    pub fn arm(&mut self, pgid: i32) {
        if let Some(p) = &mut self.pipe {
            let _ = p.write_all(format!("g{pgid}\n").as_bytes());
        }
    }

    /// The server tree is gone: tell the sentinel to exit without killing anything, and reap it
    /// (left unreaped, it would become a zombie of whoever inherits it).
    pub async fn disarm(mut self) {
        if let Some(mut p) = self.pipe.take() {
            let _ = p.write_all(b"d");
        }
        if tokio::time::timeout(Duration::from_secs(1), self.exit)
            .await
            .is_err()
        {
            tracing::debug!(pid = self.pid, "the sentinel did not exit within 1 s");
        }
    }
}

/// The sentinel process itself.
pub fn sentinel_main(marker: &str) -> i32 {
    let _ = nix::unistd::setsid();
    // Nothing but our "done" byte or our death may end it; a stray signal must not.
    for sig in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGPIPE,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
        Signal::SIGALRM,
    ] {
        // SAFETY: setting a disposition to SIG_IGN; no handler runs.
        let _ = unsafe { nix::sys::signal::signal(sig, SigHandler::SigIgn) };
    }
    let _ = std::io::stdout().write_all(b"r");
    let _ = std::io::stdout().flush();
    let supervisor = nix::unistd::getppid().as_raw();
    let mut pgid = None;
    let mut known: Vec<(i32, u64)> = Vec::new();
    let mut stdin = std::io::stdin();
    let mut pending = Vec::new();
    let mut last_snapshot: Option<Instant> = None;
    loop {
        if last_snapshot.is_none_or(|t| t.elapsed() >= SNAPSHOT_EVERY) {
            // Cheap: no environments read, only the parent chain and the group.
            let tree = Tree {
                root: Some(supervisor),
                pgid,
                ..Tree::default()
            };
            known = Table::read()
                .members(&tree)
                .iter()
                .map(|p| (p.pid, p.start))
                .collect();
            last_snapshot = Some(Instant::now());
        }
        let mut fds = [PollFd::new(stdin.as_fd(), PollFlags::POLLIN)];
        match poll(
            &mut fds,
            PollTimeout::from(SNAPSHOT_EVERY.as_millis() as u16),
        ) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => break,
        }
        let mut buf = [0u8; 64];
        match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => pending.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
        if pending.contains(&b'd') {
            return 0;
        }
        while let Some(nl) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=nl).collect();
            if let Some(g) = std::str::from_utf8(&line)
                .ok()
                .and_then(|l| l.trim().strip_prefix('g')?.parse().ok())
            {
                pgid = Some(g);
            }
        }
    }
    // The supervisor is gone.
    let tree = Tree {
        root: None,
        pgid,
        marker: Some(marker),
        known: &known,
        exclude: &[supervisor],
    };
    kill_until_gone(&tree);
    0
}

/// SIGKILL the tree's members until two looks in a row find none running.
fn kill_until_gone(tree: &Tree<'_>) {
    let deadline = Instant::now() + KILL_FOR_AT_MOST;
    let mut empty_looks = 0;
    while empty_looks < 2 && Instant::now() < deadline {
        if let Some(g) = tree.pgid.filter(|&g| g > 1) {
            let _ = killpg(Pid::from_raw(g), Signal::SIGKILL);
        }
        let live: Vec<i32> = Table::read()
            .members(tree)
            .into_iter()
            .filter(|p| p.is_running())
            .map(|p| p.pid)
            .collect();
        if live.is_empty() {
            empty_looks += 1;
        } else {
            empty_looks = 0;
            for p in live {
                let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
