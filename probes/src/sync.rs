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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_for_want_of_files_says_ulimit_n_and_one_for_want_of_threads_ulimit_u() {
        let files = std::io::Error::from_raw_os_error(nix::libc::EMFILE);
        assert!(start_hint(&files).contains("ulimit -n"));
        let threads = std::io::Error::from_raw_os_error(nix::libc::EAGAIN);
        assert!(start_hint(&threads).contains("ulimit -u"));
    }
}
