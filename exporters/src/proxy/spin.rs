//! A shard that polls its sockets without sleeping while it has requests in flight.
//!
//! A writer pays for waking a reader blocked in `epoll_wait`: on the H200 host 6.3–7.0 µs of
//! kernel time per 256-byte write, against 2.1–2.6 µs when the reader is busy
//! (`benches/wake_cost.c`, BENCHMARKS.md "What the proxy costs the server it reads"). SGLang
//! writes every event from one Python thread, the bottleneck of a fast server, so a proxy that
//! sleeps between events makes the server slower. With `SGLANG_SUPERVISOR_PROXY_SPIN=1` each
//! shard runs a task that, while a measured request is in flight on that shard, yields without
//! end: the runtime then polls its reactor with a zero timeout between tasks instead of sleeping
//! in it, so the server's writes find nobody to wake. That costs the shard's thread a core while
//! requests run and nothing when none do. Off by default: a core per shard is the user's to give.
use std::cell::Cell;
use std::future::poll_fn;
use std::task::{Poll, Waker};

/// The switch that makes shards spin.
pub const SPIN: &str = "SGLANG_SUPERVISOR_PROXY_SPIN";

/// Whether shards spin, from [`SPIN`] (a [`crate::switch`]; a value that is none, which `run`
/// refuses before the proxy starts, is off).
pub(crate) fn enabled() -> bool {
    std::env::var(SPIN).is_ok_and(|v| crate::switch(&v) == Some(true))
}

thread_local! {
    /// Measured requests in flight on this thread.
    static IN_FLIGHT: Cell<usize> = const { Cell::new(0) };
    /// The spinner, parked while none are.
    static PARKED: Cell<Option<Waker>> = const { Cell::new(None) };
}

#[cfg(test)]
thread_local! {
    /// Turns of the spinner on this thread.
    static TURNS: Cell<u64> = const { Cell::new(0) };
}

/// A measured request in flight on this thread, from the moment it is read until it is
/// recorded. Dropped on the thread that made it: a connection lives on one shard.
pub struct Held(());

impl Held {
    pub(crate) fn enter() -> Self {
        let _ = IN_FLIGHT.try_with(|n| {
            n.set(n.get() + 1);
            if n.get() == 1 {
                if let Some(w) = PARKED.try_with(Cell::take).ok().flatten() {
                    w.wake();
                }
            }
        });
        Held(())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = IN_FLIGHT.try_with(|n| n.set(n.get().saturating_sub(1)));
    }
}

/// The shard's spinner: yields while requests are in flight on this thread, parks when none are.
pub(crate) async fn run() {
    loop {
        poll_fn(|cx| {
            if IN_FLIGHT.try_with(Cell::get).unwrap_or(0) > 0 {
                Poll::Ready(())
            } else {
                let _ = PARKED.try_with(|p| p.set(Some(cx.waker().clone())));
                Poll::Pending
            }
        })
        .await;
        #[cfg(test)]
        TURNS.with(|t| t.set(t.get() + 1));
        // Deferred until the reactor has been polled (with no timeout, as a task is waiting).
        tokio::task::yield_now().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn turns() -> u64 {
        TURNS.with(Cell::get)
    }

    #[test]
    fn the_spinner_turns_only_while_a_request_is_in_flight_and_sockets_are_still_served() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            tokio::spawn(run());
            tokio::time::sleep(Duration::from_millis(20)).await;
            let idle = turns();
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert_eq!(turns(), idle, "no request in flight: parked");

            let held = Held::enter();
            // A socket on the same thread is still read while the spinner turns.
            let (mut a, mut b) = tokio::net::UnixStream::pair().unwrap();
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let writer = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(10));
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move { a.write_all(b"event").await.unwrap() });
            });
            let mut got = [0u8; 5];
            tokio::time::timeout(Duration::from_secs(5), b.read_exact(&mut got))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(&got, b"event");
            writer.join().unwrap();
            let spinning = turns();
            assert!(spinning > idle + 100, "{idle} -> {spinning}: it spun");

            let second = Held::enter();
            drop(held);
            tokio::time::sleep(Duration::from_millis(5)).await;
            assert!(
                turns() > spinning,
                "one request still in flight: still spinning"
            );
            drop(second);
            tokio::time::sleep(Duration::from_millis(5)).await;
            let parked = turns();
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert!(turns() <= parked + 1, "none in flight: parked again");
        });
    }
}
