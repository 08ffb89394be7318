//! The signals `run` listens to. Stopping signals (INT, TERM, HUP, QUIT) are counted, not just
//! noticed: tokio wakes us once for several deliveries, and two SIGTERMs back to back must be
//! two (the second skips the grace). Stray ones (USR1, USR2, ALRM) would kill us by default: they
//! are caught and ignored; WINCH and PIPE are ignored already.
use anyhow::{Context, Result};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

/// The signals that stop a run (and, caught apart, its pre-flight).
pub const STOPPING: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// Stopping signals, as they arrive (one item per delivery).
pub struct Signals {
    pub rx: mpsc::UnboundedReceiver<i32>,
}

impl Signals {
    pub fn install() -> Result<Signals> {
        let (tx, rx) = mpsc::unbounded_channel::<i32>();
        for num in STOPPING {
            // Installed before tokio's stream so no delivery goes uncounted.
            let count = Arc::new(AtomicU32::new(0));
            let c = count.clone();
            // SAFETY: the action only increments an atomic (async-signal-safe).
            unsafe {
                signal_hook_registry::register(num, move || {
                    c.fetch_add(1, Ordering::SeqCst);
                })
            }
            .with_context(|| format!("installing the handler of signal {num}"))?;
            let mut stream =
                signal(SignalKind::from_raw(num)).context("installing signal handlers")?;
            let tx = tx.clone();
            tokio::spawn(async move {
                while stream.recv().await.is_some() {
                    for _ in 0..count.swap(0, Ordering::SeqCst) {
                        if tx.send(num).is_err() {
                            return;
                        }
                    }
                }
            });
        }
        for num in [libc::SIGUSR1, libc::SIGUSR2, libc::SIGALRM] {
            let mut stream =
                signal(SignalKind::from_raw(num)).context("installing signal handlers")?;
            tokio::spawn(async move {
                while stream.recv().await.is_some() {
                    tracing::info!(
                        "{} ignored (SIGINT, SIGTERM, SIGHUP or SIGQUIT stop the server)",
                        super::signal_name(num)
                    );
                }
            });
        }
        Ok(Signals { rx })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn two_deliveries_before_the_loop_looks_are_two_signals() {
        let mut s = Signals::install().unwrap();
        // raise() runs the handlers before it returns: both deliveries happen before the
        // stream is polled, which is where tokio alone merges them into one.
        unsafe {
            libc::raise(libc::SIGHUP);
            libc::raise(libc::SIGHUP);
        }
        for _ in 0..2 {
            let got = tokio::time::timeout(Duration::from_secs(5), s.rx.recv()).await;
            assert_eq!(got.ok().flatten(), Some(libc::SIGHUP));
        }
    }
}
