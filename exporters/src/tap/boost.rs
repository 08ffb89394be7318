//! The tap thread's scheduling priority: normal while it keeps up, raised while blocks queue in
//! the ring. Raised all the time, its wake-ups (one per block) preempt the client or the server
//! on a small host: +50 µs median TTFT at one stream on two cores (BENCHMARKS.md, "The tap").
//! Never raised, a host saturated by the benchmark starves it until the ring fills and segments
//! are lost (1 024 streams on two cores). Raising it only when it falls behind keeps both.

/// Blocks found already waiting, one after another, before the priority is raised.
const BEHIND: u32 = 4;
/// The nice value while behind (needs CAP_SYS_NICE, which root has; without it nothing changes).
const RAISED: libc::c_int = -10;

pub(super) struct Boost {
    behind: u32,
    raised: bool,
    /// The thread's nice value before it was raised, restored after (a supervisor started under
    /// `nice 5` stays at 5).
    before: libc::c_int,
}

impl Boost {
    pub(super) fn new() -> Self {
        Boost {
            behind: 0,
            raised: false,
            before: nice_now(),
        }
    }

    /// After each pass over the ring: whether another block was already waiting.
    pub(super) fn after_pass(&mut self, waiting: bool) {
        if waiting {
            self.behind = self.behind.saturating_add(1);
            if self.behind >= BEHIND && !self.raised && self.before > RAISED {
                self.raised = set_nice(RAISED);
            }
        } else {
            self.behind = 0;
            if self.raised {
                self.raised = !set_nice(self.before);
            }
        }
    }

    #[cfg(test)]
    fn raised(&self) -> bool {
        self.raised
    }
}

/// This thread's nice value; whether it was set.
fn set_nice(n: libc::c_int) -> bool {
    // SAFETY: setpriority on this thread's own id.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, n) == 0 }
}

fn nice_now() -> libc::c_int {
    // SAFETY: getpriority on this thread's own id (errno is not needed: -1 is a valid answer
    // only for a thread at -1, which this one never is).
    unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_priority_is_raised_only_while_blocks_queue_and_lowered_when_the_ring_is_read_up() {
        std::thread::spawn(|| {
            let mut b = Boost::new();
            for _ in 0..BEHIND - 1 {
                b.after_pass(true);
            }
            assert!(
                !b.raised() && nice_now() == 0,
                "a few blocks waiting are not falling behind"
            );
            b.after_pass(true);
            if b.raised() {
                assert_eq!(nice_now(), RAISED);
            } else {
                eprintln!("SKIPPED the raise: no CAP_SYS_NICE here");
            }
            b.after_pass(false);
            assert!(!b.raised());
            assert_eq!(nice_now(), 0, "back to normal once read up");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_thread_started_nicer_returns_to_its_own_nice_value() {
        std::thread::spawn(|| {
            assert!(set_nice(5));
            let mut b = Boost::new();
            for _ in 0..BEHIND {
                b.after_pass(true);
            }
            b.after_pass(false);
            assert_eq!(nice_now(), 5, "not left at 0 (higher than it started)");
        })
        .join()
        .unwrap();
    }
}
