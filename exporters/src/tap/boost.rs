//! The tap thread's scheduling priority: normal while it keeps up, raised while blocks queue in
//! the ring. Raised all the time, its wake-ups (one per block) preempt the client or the server
//! on a small host: +50 µs median TTFT at one stream on two cores (BENCHMARKS.md, "The tap").
//! Never raised, a host saturated by the benchmark starves it until the ring fills and segments
//! are lost (1 024 streams on two cores). Raising it only when it falls behind keeps both.
//!
//! Two steps: a nice value first, then real time. A nice value is a weight, not a guarantee: on
//! a 16-core host running 2 048 benchmark threads the thread at nice −10 waited runnable up to
//! 1.3 s in a second and the ring overflowed; at SCHED_FIFO it waited at most 26 ms. Real time
//! is bounded by the kernel's throttle (sched_rt_runtime_us) and by the thread itself, which
//! blocks in `poll` as soon as it is read up.

use std::time::{Duration, Instant};

/// Blocks found already waiting, one after another, before the nice value is raised.
const BEHIND: u32 = 4;
/// ... and before the thread goes real time (an eighth of the default ring).
const BEHIND_RT: u32 = 32;
/// The nice value while behind (needs CAP_SYS_NICE, which root has; without it nothing changes).
const RAISED: libc::c_int = -10;
/// The real-time priority while far behind: the lowest, above every normal thread only.
const RT_PRIORITY: libc::c_int = 1;
/// How long the ring stays read up before the priority comes down: lowered at the first pass
/// that found nothing waiting, the next wait at normal priority overflowed the ring again.
const HOLD: Duration = Duration::from_secs(1);

/// Where the thread stands; every change is made in [`Boost::after_pass`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Level {
    Normal,
    Nice,
    RealTime,
}

pub(super) struct Boost {
    level: Level,
    /// Passes in a row that found another block waiting.
    behind: u32,
    /// Since when every pass found the ring read up (while raised).
    read_up_since: Option<Instant>,
    /// The thread's nice value before it was raised, restored after (a supervisor started under
    /// `nice 5` stays at 5).
    before: libc::c_int,
    /// Whether the thread started under the normal policy: one started real time (`chrt`) is
    /// left as it was.
    normal_policy: bool,
    /// Whether a refused raise was reported (once a run).
    refusal_told: bool,
}

impl Boost {
    pub(super) fn new() -> Self {
        Boost {
            level: Level::Normal,
            behind: 0,
            read_up_since: None,
            before: nice_now(),
            // SAFETY: sched_getscheduler on this thread's own id.
            normal_policy: unsafe { libc::sched_getscheduler(libc::gettid()) } == libc::SCHED_OTHER,
            refusal_told: false,
        }
    }

    /// After each pass over the ring: whether another block was already waiting.
    pub(super) fn after_pass(&mut self, waiting: bool, now: Instant) {
        if waiting {
            self.behind = self.behind.saturating_add(1);
            self.read_up_since = None;
        } else {
            self.behind = 0;
            self.read_up_since.get_or_insert(now);
        }
        let held = self
            .read_up_since
            .is_some_and(|t| now.duration_since(t) >= HOLD);
        let want = match self.level {
            Level::Normal if self.behind >= BEHIND && self.before > RAISED => Level::Nice,
            Level::Nice if self.behind >= BEHIND_RT && self.normal_policy => Level::RealTime,
            Level::Nice | Level::RealTime if held => Level::Normal,
            level => level,
        };
        if want != self.level {
            self.level = self.change_to(want);
            if self.level < want && !self.refusal_told {
                self.refusal_told = true;
                tracing::warn!(
                    "tap: behind the ring, and its thread's priority could not be raised to {want:?} (it needs CAP_SYS_NICE): segments may be lost on a busy host"
                );
            }
        }
    }

    /// The system calls from the current level to `want`; returns the level reached (a call
    /// refused for want of CAP_SYS_NICE leaves it where it was).
    fn change_to(&self, want: Level) -> Level {
        match (self.level, want) {
            (Level::Normal, Level::Nice) if set_nice(RAISED) => Level::Nice,
            (Level::Nice, Level::RealTime) if set_policy(libc::SCHED_FIFO, RT_PRIORITY) => {
                Level::RealTime
            }
            // Back to the normal policy (at the raised nice value), then down from there.
            (Level::RealTime, Level::Normal) if !set_policy(libc::SCHED_OTHER, 0) => {
                Level::RealTime
            }
            (Level::RealTime | Level::Nice, Level::Normal) if set_nice(self.before) => {
                Level::Normal
            }
            (Level::RealTime, Level::Normal) => Level::Nice,
            (level, _) => level,
        }
    }

    #[cfg(test)]
    fn level(&self) -> Level {
        self.level
    }
}

/// This thread's nice value; whether it was set.
fn set_nice(n: libc::c_int) -> bool {
    // SAFETY: setpriority on this thread's own id.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, n) == 0 }
}

/// This thread's scheduling policy; whether it was set (real time needs CAP_SYS_NICE or an
/// RLIMIT_RTPRIO).
fn set_policy(policy: libc::c_int, priority: libc::c_int) -> bool {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: sched_setscheduler on this thread's own id with a valid sched_param.
    unsafe { libc::sched_setscheduler(libc::gettid(), policy, &param) == 0 }
}

fn nice_now() -> libc::c_int {
    // SAFETY: getpriority on this thread's own id (errno is not needed: -1 is a valid answer
    // only for a thread at -1, which this one never is).
    unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy_now() -> libc::c_int {
        // SAFETY: sched_getscheduler on this thread's own id.
        unsafe { libc::sched_getscheduler(libc::gettid()) }
    }

    /// `n` passes, each finding a block waiting or not, `step` apart from `t`; returns the time
    /// after them.
    fn passes(b: &mut Boost, n: u32, waiting: bool, t: Instant, step: Duration) -> Instant {
        let mut t = t;
        for _ in 0..n {
            b.after_pass(waiting, t);
            t += step;
        }
        t
    }

    #[test]
    fn the_priority_rises_in_two_steps_while_blocks_queue_and_comes_down_after_a_second_read_up() {
        std::thread::spawn(|| {
            let ms = Duration::from_millis(1);
            let mut b = Boost::new();
            let t = passes(&mut b, BEHIND - 1, true, Instant::now(), ms);
            assert!(
                b.level() == Level::Normal && nice_now() == 0,
                "a few blocks waiting are not falling behind"
            );
            let t = passes(&mut b, 1, true, t, ms);
            if b.level() == Level::Normal {
                eprintln!("SKIPPED the raise: no CAP_SYS_NICE here");
                return;
            }
            assert_eq!(nice_now(), RAISED);
            let t = passes(&mut b, BEHIND_RT - BEHIND, true, t, ms);
            assert_eq!(b.level(), Level::RealTime, "far behind: real time");
            assert_eq!(policy_now(), libc::SCHED_FIFO);
            // Read up, but not for long: a burst's next wait must not overflow the ring.
            let t = passes(&mut b, 100, false, t, ms * 8);
            assert_eq!(b.level(), Level::RealTime, "held through 800 ms read up");
            let t = passes(&mut b, 1, true, t, ms);
            passes(&mut b, 127, false, t, ms * 8);
            assert_eq!(b.level(), Level::Normal, "down after a second read up");
            assert_eq!(policy_now(), libc::SCHED_OTHER);
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
            let t = passes(&mut b, BEHIND, true, Instant::now(), Duration::ZERO);
            passes(&mut b, 2, false, t, HOLD);
            assert_eq!(nice_now(), 5, "not left at 0 (higher than it started)");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_thread_started_real_time_keeps_its_policy() {
        std::thread::spawn(|| {
            if !set_policy(libc::SCHED_RR, 2) {
                eprintln!("SKIPPED: no CAP_SYS_NICE here");
                return;
            }
            let mut b = Boost::new();
            let t = passes(&mut b, BEHIND_RT, true, Instant::now(), Duration::ZERO);
            assert_ne!(b.level(), Level::RealTime);
            passes(&mut b, 2, false, t, HOLD);
            assert_eq!(policy_now(), libc::SCHED_RR, "not put back to SCHED_OTHER");
        })
        .join()
        .unwrap();
    }
}
