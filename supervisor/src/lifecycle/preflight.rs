//! The pre-flight audit: the server's flags checked against the SGLang it would import, before
//! anything starts (a refused launch exits 126). The audit itself is `flags::preflight`.
use super::signals;
use crate::cli::RunArgs;
use anyhow::{anyhow, Result};
use serde_json::Value;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

/// What the pre-flight found: whether to refuse the launch (exit 126), and its `preflight` event.
pub struct Preflight {
    pub reject: bool,
    pub event: Value,
}

/// Audit the flags of every launch in COMMAND before anything starts (flags.rs), with the
/// stopping signals caught while it runs (an import may take a minute, before the run's own
/// loop exists): `Err(signal)` when one arrives first, so the run can still end with its
/// events instead of dying without a word. The audit goes on on its own thread until the
/// process exits; its interpreter's group is killed (PDEATHSIG alone reaches only the
/// interpreter, not what it started). The signals stay caught after it: one that comes later,
/// before the run's loop, reaches that loop (signals.rs).
pub fn preflight_unless_stopped(
    args: &RunArgs,
) -> std::result::Result<Result<Option<Preflight>>, i32> {
    if args.no_preflight {
        return Ok(Ok(None));
    }
    if let Err(e) = signals::catch() {
        tracing::warn!("pre-flight: cannot catch the stopping signals ({e:#}); one would stop the supervisor without its events");
    }
    let (command, schema) = (args.command.clone(), args.flags_schema.clone());
    let (tx, rx) = mpsc::channel();
    let outcome = std::thread::Builder::new()
        .name("preflight".into())
        .spawn(move || {
            let found = crate::flags::preflight(&command, schema.as_deref());
            let _ = tx.send(found.map(|f| f.map(|(reject, event)| Preflight { reject, event })));
        })
        .map_err(|e| {
            anyhow!(
                "cannot start the pre-flight's thread: {e}{}",
                sglang_probes::sync::start_hint(&e)
            )
        })
        .map(|_| wait_unless_stopped(&rx));
    // One that came between the last look and the answer is still ours to act on.
    let stopped = match &outcome {
        Ok(Err(sig)) => Some(*sig),
        _ => signals::first_caught(),
    };
    if let Some(sig) = stopped {
        crate::flags::kill_python();
        return Err(sig);
    }
    match outcome {
        Ok(Ok(found)) => Ok(found),
        Ok(Err(sig)) => Err(sig),
        Err(e) => Ok(Err(e)),
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
            Err(RecvTimeoutError::Timeout) => {
                if let Some(sig) = signals::first_caught() {
                    return Err(sig);
                }
            }
        }
    }
}
