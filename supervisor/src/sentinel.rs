//! If the supervisor is SIGKILLed, PR_SET_PDEATHSIG takes the server's main process down, but its
//! scheduler and detokenizer live on (a real orphaned scheduler went on to take 128 GiB of GPU
//! memory). So a tiny helper process holds the read end of a pipe from us: when that pipe reaches
//! end-of-file without our "done" byte, we are gone, and it SIGKILLs the server's process group.
use crate::child::{send_signal, spawn, SpawnSpec};
use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::process::Stdio;

/// Our end of the pipe. `disarm` on a normal exit; dropping it without (i.e. dying) fires it.
pub struct Sentinel {
    pub pid: i32,
    pipe: Option<std::fs::File>,
    exit: tokio::sync::oneshot::Receiver<crate::child::ExitStatus>,
}

impl Sentinel {
    pub fn start(pgid: i32) -> std::io::Result<Sentinel> {
        let exe = std::env::current_exe()?;
        let argv: Vec<OsString> = vec![
            exe.into(),
            "__sentinel".into(),
            "--pgid".into(),
            pgid.to_string().into(),
        ];
        let s = spawn(SpawnSpec {
            argv: &argv,
            new_process_group: false,
            die_with_parent: false,
            stdin: Stdio::piped(),
            stdout: Stdio::null(),
            stderr: Stdio::inherit(),
        })
        .map_err(std::io::Error::other)?;
        let pipe = s.stdin.map(|fd: OwnedFd| std::fs::File::from(fd));
        Ok(Sentinel {
            pid: s.pid,
            pipe,
            exit: s.exit,
        })
    }

    /// The server tree is gone: tell the sentinel to exit without killing anything, and reap it
    /// (left unreaped, it would become a zombie of whoever inherits it).
    pub async fn disarm(mut self) {
        if let Some(mut p) = self.pipe.take() {
            let _ = p.write_all(b"d");
        }
        if tokio::time::timeout(std::time::Duration::from_secs(1), self.exit)
            .await
            .is_err()
        {
            tracing::debug!(pid = self.pid, "the sentinel did not exit within 1 s");
        }
    }
}

/// The sentinel process itself.
pub fn sentinel_main(pgid: i32) -> i32 {
    // Terminal signals go to the supervisor's group, which includes us: only the supervisor acts.
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
        // SAFETY: setting a signal to SIG_IGN.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
    let mut b = [0u8; 1];
    let disarmed = loop {
        match std::io::stdin().read(&mut b) {
            Ok(0) => break false,
            Ok(_) => break b[0] == b'd',
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break false,
        }
    };
    if !disarmed && pgid > 1 {
        send_signal(-pgid, libc::SIGKILL);
    }
    0
}
