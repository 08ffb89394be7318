//! `wait`: for recipes that keep their own launch. Follows a supervisor's `--events` file, or
//! polls a server's URL with the readiness rule `run` uses, until the server is ready (exit 0),
//! failed (non-zero, the diagnosis on stderr) or the timeout passed (124).
use crate::cli::WaitArgs;
use crate::events::Event;
use crate::exit;
use crate::readiness::{self, Evidence};
use anyhow::{Context, Result};
use sglang_probes::http::{Bearer, HttpUrl};
use std::io::{ErrorKind, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

/// A finished run whose last event is older than this when `wait` starts is a previous run's
/// file, not the run the recipe is starting now.
const STALE_AFTER: Duration = Duration::from_secs(5);

pub async fn run(args: &WaitArgs) -> Result<i32> {
    if let Some(path) = &args.events {
        return follow_events(path, args.timeout).await;
    }
    let deadline = Instant::now() + args.timeout;
    let Some(url) = &args.url else {
        anyhow::bail!("give --events FILE or --url URL")
    };
    let mut base = HttpUrl::parse(url).with_context(|| format!("--url {url:?}"))?;
    base.bearer = args.api_key.clone().map(Bearer);
    // Asked at least once, so that even a short timeout ends with the server's own answer.
    let last = loop {
        // No log here: /ready, else (older versions, node rank >= 1) /health.
        match readiness::check(&base, Evidence::None).await {
            Ok(_) => {
                eprintln!("ready: {}", base.base());
                return Ok(0);
            }
            Err(why) if Instant::now() >= deadline => break why,
            Err(_) => {}
        }
        tokio::time::sleep(readiness::POLL_PERIOD).await;
    };
    eprintln!(
        "not ready within {}: {} ({last})",
        humantime::format_duration(args.timeout),
        base.base()
    );
    Ok(exit::TIMEOUT)
}

/// What the events of the run being followed say so far.
#[derive(Default)]
struct RunSeen {
    supervisor_pid: Option<u32>,
    ready: Option<(f64, String)>,
    fatal: Option<String>,
    exited: Option<i32>,
    /// When its last event was written.
    last_ts: Option<SystemTime>,
}

impl RunSeen {
    fn read(&mut self, line: &str) {
        let ts = serde_json::from_str::<serde_json::Value>(line)
            .ok()
            .and_then(|v| v["ts"].as_str().map(str::to_string))
            .and_then(|t| humantime::parse_rfc3339(&t).ok());
        let Some(ev) = Event::parse_line(line) else {
            return;
        };
        self.last_ts = ts.or(self.last_ts);
        match ev {
            // A new run in the same file starts over.
            Event::Spawned { supervisor_pid, .. } => {
                *self = RunSeen {
                    supervisor_pid,
                    last_ts: ts,
                    ..RunSeen::default()
                };
            }
            Event::Ready { elapsed_s, url, .. } => self.ready = Some((elapsed_s, url)),
            Event::Fatal {
                reason, excerpt, ..
            } if self.fatal.is_none() => self.fatal = Some(format!("{reason}: {excerpt}")),
            Event::Exited {
                exit_status,
                supervisor_pid,
                ..
            } => {
                self.exited = Some(exit_status);
                self.supervisor_pid = self.supervisor_pid.or(supervisor_pid);
            }
            _ => {}
        }
    }

    fn supervisor_alive(&self) -> bool {
        self.supervisor_pid
            .is_some_and(|p| crate::child::is_running(p as i32))
    }

    /// A run that ended (or whose supervisor died) well before we started watching.
    fn stale(&self, started: SystemTime) -> bool {
        let old = self.last_ts.is_none_or(|t| t + STALE_AFTER < started);
        (self.exited.is_some() || !self.supervisor_alive()) && old
    }
}

/// Read the events file as it grows; the file may not exist yet, and may be replaced or
/// truncated by a new run (then it is read again from its start).
async fn follow_events(path: &Path, timeout: Duration) -> Result<i32> {
    let deadline = Instant::now() + timeout;
    let started = SystemTime::now();
    let (mut offset, mut inode) = (0u64, None);
    // The file's first bytes as we read them: a run that rewrote the file past our offset
    // between two looks is seen by its different start.
    let mut head: Vec<u8> = Vec::new();
    let mut partial = Vec::new();
    let mut run = RunSeen::default();
    let mut first_read = true;
    let mut said_stale = false;
    // Read at least once: a short timeout still sees a run that is ready already.
    loop {
        let file = crate::input_file::open(path);
        if let Some(e) = file
            .as_ref()
            .err()
            .filter(|e| e.kind() == ErrorKind::InvalidInput)
        {
            // (a FIFO would block the wait past its timeout, a device never end)
            anyhow::bail!(
                "--events {}: {e}; pass the path that `run --events` writes",
                path.display()
            );
        }
        if let Ok(mut f) = file {
            let meta = f
                .metadata()
                .with_context(|| format!("reading {}", path.display()))?;
            let id = (meta.dev(), meta.ino());
            let mut now_head = vec![0u8; head.len()];
            let same_head =
                head.is_empty() || (f.read_exact(&mut now_head).is_ok() && now_head == head);
            if inode != Some(id) || meta.len() < offset || !same_head {
                // A new file, or this one rewritten: a new run, read from its start.
                if inode.is_some() {
                    first_read = false;
                }
                inode = Some(id);
                offset = 0;
                partial.clear();
                run = RunSeen::default();
                head.clear();
            }
            f.seek(SeekFrom::Start(offset))
                .with_context(|| format!("reading {}", path.display()))?;
            let mut buf = Vec::new();
            f.read_to_end(&mut buf)
                .with_context(|| format!("reading {}", path.display()))?;
            if offset == 0 {
                head = buf.iter().take(64).copied().collect();
            }
            offset += buf.len() as u64;
            partial.extend_from_slice(&buf);
            // Only whole lines: the writer may be mid-line.
            if let Some(end) = partial.iter().rposition(|&b| b == b'\n') {
                let lines: Vec<u8> = partial.drain(..=end).collect();
                for line in String::from_utf8_lossy(&lines).lines() {
                    run.read(line);
                }
            }
            // What was in the file before we looked belongs to a previous run unless its
            // supervisor is alive or it just ended.
            if first_read && run.stale(started) {
                if !said_stale {
                    eprintln!(
                        "{} holds a finished run; waiting for a new one",
                        path.display()
                    );
                    said_stale = true;
                }
            } else if let Some(status) = run.exited {
                match &run.ready {
                    Some(_) => eprintln!(
                        "the server was ready, then exited: {}",
                        run.fatal.as_deref().unwrap_or("no diagnosis in the events")
                    ),
                    None => eprintln!(
                        "the server exited before it was ready: {}",
                        run.fatal.as_deref().unwrap_or("no diagnosis in the events")
                    ),
                }
                return Ok(if status == 0 { 1 } else { status });
            } else if let Some((elapsed, url)) = &run.ready {
                if run.supervisor_alive() {
                    eprintln!("ready after {elapsed} s: {url}");
                    return Ok(0);
                }
            }
            if !run.stale(started) {
                first_read = false;
            }
        }
        if Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seen = match (inode, &run.fatal) {
        (None, _) => "the file was never created (is it the --events of a running `run`?)".into(),
        (Some(_), Some(f)) => f.clone(),
        (Some(_), None) => "no ready event in it yet".to_string(),
    };
    eprintln!(
        "not ready within {}: {}: {seen}",
        humantime::format_duration(timeout),
        path.display(),
    );
    Ok(exit::TIMEOUT)
}
