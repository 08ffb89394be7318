//! The tap thread's scheduling priority: normal while it keeps up, raised while blocks queue in
//! the ring. Raised all the time, its wake-ups (one per block) preempt the client or the server
//! on a small host: +50 µs median TTFT at one stream on two cores (BENCHMARKS.md, "The tap").
//! Never raised, a host saturated by the benchmark starves it until the ring fills and segments
//! are lost (1 024 streams on two cores). Raising it only when it falls behind keeps both.
//!
//! Two steps, by how many blocks wait: a nice value at [`BEHIND`], real time at [`BEHIND_RT`].
//! A nice value is a weight, not a guarantee: on two cores running 2 048 benchmark threads the
//! thread at nice −10 waited runnable up to 1.3 s in a second and the ring overflowed; under
//! SCHED_FIFO it waited at most 26 ms. Real time is bounded by the kernel's throttle
//! (sched_rt_runtime_us) and by the thread itself, which blocks in `poll` as soon as it is read
//! up; it comes down once no deep queue was seen for [`HOLD`], whatever short waits came since
//! (one block waiting now and then is a busy ring read in time, not a thread falling behind).

use std::time::{Duration, Instant};

/// Blocks waiting (beyond the one just read) at which the nice value is raised.
pub(super) const BEHIND: usize = 4;
/// ... and at which the thread goes real time: 4 MiB of 128 KiB blocks, an eighth of the
/// default ring.
pub(super) const BEHIND_RT: usize = 32;
/// The nice value while behind (needs CAP_SYS_NICE, which root has).
const RAISED: libc::c_int = -10;
/// The real-time priority while far behind: the lowest, above every normal thread only.
const RT_PRIORITY: libc::c_int = 1;
/// How long no deep queue must be seen before the priority comes down: lowered at the first
/// pass that found the ring read up, the next wait at normal priority overflowed it again.
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
    /// When a pass last found [`BEHIND`] blocks or more waiting.
    last_deep: Option<Instant>,
    /// The thread's nice value before it was raised, restored after (a supervisor started under
    /// `nice 5` stays at 5; one started at −10 or below is not "raised" to −10).
    before: libc::c_int,
    /// Whether the thread started under the normal policy: one started real time (`chrt`) is
    /// left as it was.
    normal_policy: bool,
    /// Raises the kernel refused (no CAP_SYS_NICE, a cgroup without real-time time): not tried
    /// again, and said once.
    nice_refused: bool,
    rt_refused: bool,
}

impl Boost {
    pub(super) fn new() -> Self {
        Boost {
            level: Level::Normal,
            last_deep: None,
            before: nice_now(),
            // SAFETY: sched_getscheduler on this thread's own id.
            normal_policy: unsafe { libc::sched_getscheduler(libc::gettid()) } == libc::SCHED_OTHER,
            nice_refused: false,
            rt_refused: false,
        }
    }

    /// After each pass over the ring: how many blocks wait (counted up to [`BEHIND_RT`]).
    pub(super) fn after_pass(&mut self, queued: usize, now: Instant) {
        if queued >= BEHIND {
            self.last_deep = Some(now);
        }
        let calm = self
            .last_deep
            .is_none_or(|t| now.saturating_duration_since(t) >= HOLD);
        let rt_allowed = self.normal_policy && !self.rt_refused;
        let nice_allowed = !self.nice_refused && self.before > RAISED;
        let want = if queued >= BEHIND_RT && rt_allowed {
            Level::RealTime
        } else if queued >= BEHIND && nice_allowed {
            self.level.max(Level::Nice)
        } else if calm {
            Level::Normal
        } else {
            self.level
        };
        if want != self.level {
            self.level = self.change_to(want);
        }
    }

    /// The system calls from the current level to `want`; returns the level reached. A raise
    /// the kernel refuses is remembered (not tried again) and said once.
    fn change_to(&mut self, want: Level) -> Level {
        let from = self.level;
        let reached = match want {
            Level::RealTime if set_policy(libc::SCHED_FIFO, RT_PRIORITY) => Level::RealTime,
            Level::RealTime => {
                self.rt_refused = true;
                from
            }
            Level::Nice if set_nice(RAISED) => Level::Nice,
            Level::Nice => {
                self.nice_refused = true;
                from
            }
            // Down: the normal policy first (at whatever nice value), then the nice value.
            Level::Normal if from == Level::RealTime && !set_policy(libc::SCHED_OTHER, 0) => from,
            Level::Normal if set_nice(self.before) => Level::Normal,
            Level::Normal => Level::Nice,
        };
        if reached < want && self.nice_refused as u8 + self.rt_refused as u8 == 1 {
            tracing::warn!(
                "tap: behind the ring, and its thread's priority could not be raised to {want:?} (it needs CAP_SYS_NICE, and real time a cgroup that allows it): segments may be lost on a busy host"
            );
        }
        reached
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
/// RLIMIT_RTPRIO). A thread started from this one would not inherit real time
/// (SCHED_RESET_ON_FORK).
fn set_policy(policy: libc::c_int, priority: libc::c_int) -> bool {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    let policy = if policy == libc::SCHED_OTHER {
        policy
    } else {
        policy | libc::SCHED_RESET_ON_FORK
    };
    // SAFETY: sched_setscheduler on this thread's own id with a valid sched_param.
    unsafe { libc::sched_setscheduler(libc::gettid(), policy, &param) == 0 }
}

fn nice_now() -> libc::c_int {
    // SAFETY: getpriority on this thread's own id. Its −1 error return is also a valid nice
    // value; errno is not checked because it can only fail for a thread that does not exist.
    unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy_now() -> libc::c_int {
        // SAFETY: sched_getscheduler on this thread's own id (the reset-on-fork flag masked).
        unsafe { libc::sched_getscheduler(libc::gettid()) & !libc::SCHED_RESET_ON_FORK }
    }

    /// `n` passes finding `queued` blocks waiting, `step` apart from `t`; the time after them.
    fn passes(b: &mut Boost, n: u32, queued: usize, t: Instant, step: Duration) -> Instant {
        let mut t = t;
        for _ in 0..n {
            b.after_pass(queued, t);
            t += step;
        }
        t
    }

    #[test]
    fn the_priority_rises_with_the_queue_and_comes_down_a_second_after_the_last_deep_one() {
        std::thread::spawn(|| {
            let ms = Duration::from_millis(1);
            let mut b = Boost::new();
            let t = passes(&mut b, 50, BEHIND - 1, Instant::now(), ms);
            assert!(
                b.level() == Level::Normal && nice_now() == 0,
                "a few blocks waiting are a busy ring read in time"
            );
            let t = passes(&mut b, 1, BEHIND, t, ms);
            if b.level() == Level::Normal {
                eprintln!("SKIPPED the raise: no CAP_SYS_NICE here");
                return;
            }
            assert_eq!(nice_now(), RAISED);
            let t = passes(&mut b, 1, BEHIND_RT, t, ms);
            assert_eq!(b.level(), Level::RealTime, "far behind: real time");
            assert_eq!(policy_now(), libc::SCHED_FIFO);
            // Read up but for a block waiting now and then: that does not hold it up.
            let mut t = t;
            for _ in 0..20 {
                t = passes(&mut b, 9, 0, t, ms * 10);
                t = passes(&mut b, 1, 1, t, ms * 10);
            }
            assert_eq!(
                b.level(),
                Level::Normal,
                "down a second after the last deep queue"
            );
            assert_eq!(policy_now(), libc::SCHED_OTHER);
            assert_eq!(nice_now(), 0, "back to its own nice value");
            // A deep queue again, then 800 ms calm: still raised.
            let t = passes(&mut b, 1, BEHIND, t, ms);
            passes(&mut b, 80, 0, t, ms * 10);
            assert_eq!(b.level(), Level::Nice, "held through 800 ms read up");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_thread_started_nicer_returns_to_its_own_nice_value() {
        std::thread::spawn(|| {
            assert!(set_nice(5));
            let mut b = Boost::new();
            let t = passes(&mut b, 1, BEHIND, Instant::now(), Duration::ZERO);
            passes(&mut b, 2, 0, t, HOLD);
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
            let t = passes(&mut b, 1, BEHIND_RT, Instant::now(), Duration::ZERO);
            assert_ne!(b.level(), Level::RealTime);
            passes(&mut b, 2, 0, t, HOLD);
            assert_eq!(policy_now(), libc::SCHED_RR, "not put back to SCHED_OTHER");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_thread_started_at_nice_minus_ten_still_goes_real_time_when_far_behind() {
        std::thread::spawn(|| {
            if !set_nice(-12) {
                eprintln!("SKIPPED: no CAP_SYS_NICE here");
                return;
            }
            let mut b = Boost::new();
            let t = passes(&mut b, 1, BEHIND, Instant::now(), Duration::ZERO);
            assert_eq!(nice_now(), -12, "not lowered to -10 by a raise");
            let t = passes(&mut b, 1, BEHIND_RT, t, Duration::ZERO);
            assert_eq!(b.level(), Level::RealTime);
            passes(&mut b, 2, 0, t, HOLD);
            assert_eq!((policy_now(), nice_now()), (libc::SCHED_OTHER, -12));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_thread_started_from_the_raised_one_does_not_inherit_real_time() {
        std::thread::spawn(|| {
            if !set_policy(libc::SCHED_FIFO, RT_PRIORITY) {
                eprintln!("SKIPPED: no CAP_SYS_NICE here");
                return;
            }
            let child = std::thread::spawn(policy_now).join().unwrap();
            assert_eq!(child, libc::SCHED_OTHER);
        })
        .join()
        .unwrap();
    }
}
