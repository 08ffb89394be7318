//! The one way the workspace takes a mutex.

use std::sync::{Mutex, MutexGuard};

/// Lock `m`, going on past poisoning: every mutex here guards plain data (maps, counters, file
/// handles) that a panicking holder cannot leave half-updated in a way worse than losing it, and
/// a measurement tool must keep measuring.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
