//! The signals `run` listens to. Stopping signals (INT, TERM, HUP, QUIT) are counted, not just
//! noticed: tokio wakes us once for several deliveries, and two SIGTERMs back to back must be
//! two (the second skips the grace). Stray ones (USR1, USR2, ALRM) would kill us by default: they
//! are caught and ignored; WINCH and PIPE are ignored already.
use anyhow::{Context, Result};
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::OnceLock;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

/// The signals that stop a run (and, caught apart, its pre-flight).
pub const STOPPING: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// Deliveries of each stopping signal (in `STOPPING`'s order) not yet handed to a run's loop.
/// One set of handlers for the whole process, from the pre-flight on: signal-hook cannot give a
/// signal back its default action, so a handler removed after the pre-flight would leave SIGTERM
/// ignored until the run's own were in, and a stop sent in between lost (the server launched).
static PENDING: [AtomicU32; 4] = [const { AtomicU32::new(0) }; 4];
/// The first stopping signal caught (0: none): what a stop during the pre-flight is said to be.
static FIRST: AtomicI32 = AtomicI32::new(0);
static CAUGHT: OnceLock<Result<(), String>> = OnceLock::new();

/// Count the stopping signals from now on (once per process; later calls only report).
pub fn catch() -> Result<()> {
    CAUGHT
        .get_or_init(|| {
            for (i, num) in STOPPING.into_iter().enumerate() {
                // SAFETY: the action only touches atomics (async-signal-safe).
                unsafe {
                    signal_hook_registry::register(num, move || {
                        let _ = FIRST.compare_exchange(0, num, Ordering::SeqCst, Ordering::SeqCst);
                        PENDING[i].fetch_add(1, Ordering::SeqCst);
                    })
                }
                .map_err(|e| format!("installing the handler of signal {num}: {e}"))?;
            }
            Ok(())
        })
        .clone()
        .map_err(anyhow::Error::msg)
}

/// The first stopping signal caught since [`catch`], if any.
pub fn first_caught() -> Option<i32> {
    match FIRST.load(Ordering::SeqCst) {
        0 => None,
        sig => Some(sig),
    }
}

/// Stopping signals, as they arrive (one item per delivery).
pub struct Signals {
    pub rx: mpsc::UnboundedReceiver<i32>,
}

impl Signals {
    pub fn install() -> Result<Signals> {
        let (tx, rx) = mpsc::unbounded_channel::<i32>();
        // Counted before tokio's stream exists (from the pre-flight on) so no delivery goes uncounted.
        catch()?;
        for (i, num) in STOPPING.into_iter().enumerate() {
            let count = &PENDING[i];
            let mut stream =
                signal(SignalKind::from_raw(num)).context("installing signal handlers")?;
            // Those that came before the stream (since the pre-flight) are handed over now, into
            // the channel at once, so the run sees them before it spawns the server; later ones
            // wake the stream, and one counted here is not counted again there.
            for _ in 0..count.swap(0, Ordering::SeqCst) {
                let _ = tx.send(num);
            }
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
