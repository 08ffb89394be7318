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
