//! The one way the workspace takes a mutex, and what a refused thread means.

use std::sync::{Mutex, MutexGuard};

/// Lock `m`, going on past poisoning: every mutex here guards plain data (maps, counters, file
/// handles) that a panicking holder cannot leave half-updated in a way worse than losing it, and
/// a measurement tool must keep measuring.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a refused thread means and what to do, for every place that starts threads (the
/// supervisor's runtime, the proxy's shards).
pub const THREAD_LIMIT_HINT: &str =
    " (the limit on processes and threads is reached: `ulimit -u`, or the cgroup's pids.max; raise it or end other processes)";

/// What a thread or runtime refused with `e` means: out of threads (`THREAD_LIMIT_HINT`), or out
/// of file descriptors (a runtime takes a few: its epoll set and its wake-up eventfd).
pub fn start_hint(e: &std::io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(e) if e == nix::libc::EMFILE || e == nix::libc::ENFILE => {
            " (the limit on open files is reached: `ulimit -n`; raise it, or pass fewer SGLANG_SUPERVISOR_PROXY_THREADS)"
        }
        _ => THREAD_LIMIT_HINT,
    }
}

/// Runs `f` (blocking: driver calls, file reads, bounded waits) on a thread of its own and awaits
/// its value; `None` if it panicked. Where the OS refuses the thread, `f` runs here instead, on
/// the async thread that awaits it: slower, but done. (tokio's `spawn_blocking` panics when it is
/// refused its first thread: a run at the limit on threads would end in a panic.)
pub async fn off_runtime<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let job = std::sync::Arc::new(Mutex::new(Some(f)));
    let (tx, rx) = tokio::sync::oneshot::channel();
    let theirs = job.clone();
    let started = std::thread::Builder::new()
        .name("off-runtime".into())
        .spawn(move || {
            if let Some(f) = lock(&theirs).take() {
                let _ = tx.send(f());
            }
        });
    match started {
        Ok(_) => rx.await.ok(),
        Err(e) => {
            tracing::debug!("no thread for a blocking step ({e}); running it in place");
            let f = lock(&job).take()?;
            // As on its thread: a panic is `None`, not the caller's unwinding.
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).ok()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_blocking_step_gives_its_value_and_a_panicking_one_none() {
        assert_eq!(off_runtime(|| 6 * 7).await, Some(42));
        assert_eq!(off_runtime(|| -> u8 { panic!("step failed") }).await, None);
    }

    #[test]
    fn a_refusal_for_want_of_files_says_ulimit_n_and_one_for_want_of_threads_ulimit_u() {
        let files = std::io::Error::from_raw_os_error(nix::libc::EMFILE);
        assert!(start_hint(&files).contains("ulimit -n"));
        let threads = std::io::Error::from_raw_os_error(nix::libc::EAGAIN);
        assert!(start_hint(&threads).contains("ulimit -u"));
    }
}
