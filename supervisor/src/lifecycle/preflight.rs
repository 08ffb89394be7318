//! The pre-flight audit: the server's flags checked against the SGLang it would import, before
//! anything starts (a refused launch exits 126). The audit itself is `flags::preflight`.
use super::signals::STOPPING;
use crate::cli::RunArgs;
use anyhow::{anyhow, Result};
use serde_json::Value;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

/// What the pre-flight found: whether to refuse the launch (exit 126), and its `preflight` event.
pub struct Preflight {
    pub reject: bool,
    pub event: Value,
}

/// The last stopping signal that arrived during a pre-flight (0: none).
static CAUGHT: AtomicI32 = AtomicI32::new(0);

/// Audit the flags of every launch in COMMAND before anything starts (flags.rs), with the
/// stopping signals caught while it runs (an import may take a minute, before the run's own
/// handlers exist): `Err(signal)` when one arrives first, so the run can still end with its
/// events instead of dying without a word. The audit goes on on its own thread
/// until the process exits; its interpreter dies with us (it is spawned with PDEATHSIG).
pub fn preflight_unless_stopped(
    args: &RunArgs,
) -> std::result::Result<Result<Option<Preflight>>, i32> {
    if args.no_preflight {
        return Ok(Ok(None));
    }
    let mut ids = Vec::new();
    for sig in STOPPING {
        // SAFETY: the action only stores to an atomic (async-signal-safe).
        match unsafe { signal_hook_registry::register(sig, move || CAUGHT.store(sig, Ordering::SeqCst)) } {
            Ok(id) => ids.push(id),
            Err(e) => tracing::warn!("pre-flight: cannot catch signal {sig} ({e}); it would stop the supervisor without its events"),
        }
    }
    let (command, schema) = (args.command.clone(), args.flags_schema.clone());
    let (tx, rx) = mpsc::channel();
    let outcome = std::thread::Builder::new()
        .name("preflight".into())
        .spawn(move || {
            let found = crate::flags::preflight(&command, schema.as_deref());
            let _ = tx.send(found.map(|f| f.map(|(reject, event)| Preflight { reject, event })));
        })
        .map_err(|e| anyhow!("cannot start the pre-flight's thread: {e}"))
        .map(|_| wait_unless_stopped(&rx));
    for id in ids {
        signal_hook_registry::unregister(id);
    }
    // One that came between the last look and the unregistering is still ours to act on.
    match (outcome, CAUGHT.swap(0, Ordering::SeqCst)) {
        (Ok(Ok(found)), 0) => Ok(found),
        (Err(e), 0) => Ok(Err(e)),
        (Ok(Err(sig)), _) => Err(sig),
        (_, sig) => Err(sig),
    }
}

/// The pre-flight's answer, or the signal that came first (looked at every 10 ms).
fn wait_unless_stopped(
    rx: &mpsc::Receiver<Result<Option<Preflight>>>,
) -> std::result::Result<Result<Option<Preflight>>, i32> {
    loop {
        match rx.recv_timeout(Duration::from_millis(10)) {
            Ok(found) => return Ok(found),
            Err(RecvTimeoutError::Disconnected) => {
                return Ok(Err(anyhow!(
                    "the pre-flight ended without an answer (a panic in it?)"
                )))
            }
            Err(RecvTimeoutError::Timeout) => match CAUGHT.load(Ordering::SeqCst) {
                0 => {}
                sig => return Err(sig),
            },
        }
    }
}
