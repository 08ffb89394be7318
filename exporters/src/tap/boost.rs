//! The tap thread's scheduling priority: normal while it keeps up, raised while blocks queue in
//! the ring (and fewer naps then: `Boost::naps`). Raised all the time, its wake-ups preempt the client or the server
//! on a small host: +50 µs median TTFT at one stream on two cores (BENCHMARKS.md, "The tap").
//! Never raised, a host saturated by the benchmark starves it until the ring fills and segments
//! are lost (1 024 streams on two cores). Raising it only when it falls behind keeps both.
//!
//! Two steps, by how many blocks wait: a nice value at 4 (fewer in a small ring), real time at
//! an eighth of the ring (32 of the default 256). A nice value is a weight, not a
//! guarantee: on two cores running 2 048 benchmark threads the thread at nice −10 waited
//! runnable up to 1.3 s in a second and the ring overflowed; under SCHED_FIFO it waited at most
//! 26 ms. Each step comes down a second after the last queue that called for it, whatever
//! shorter queues came since. Real time that does not stop the drops (a load one thread cannot
//! read) is given up for [`FUTILE_PAUSE`]: the thread would take a core from the benchmark and
//! lose segments all the same.

use std::time::{Duration, Instant};

use super::ring::Naps;

/// The nice value while behind (needs CAP_SYS_NICE, which root has).
const RAISED: libc::c_int = -10;
/// The real-time priority while far behind: the lowest, above every normal thread only.
const RT_PRIORITY: libc::c_int = 1;
/// How long after the last queue that called for a step it is kept: lowered at the first pass
/// that found the ring read up, the next wait at normal priority overflowed it again.
const HOLD: Duration = Duration::from_secs(1);
/// Checks (one a second) in a row with drops at real time before real time is given up.
const FUTILE_CHECKS: u32 = 3;
/// How long real time is not tried again after it did not help.
const FUTILE_PAUSE: Duration = Duration::from_secs(30);

/// Where the thread stands; every change is made in [`Boost::change_to`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Level {
    Normal,
    Nice,
    RealTime,
}

pub(super) struct Boost {
    level: Level,
    /// Blocks waiting at which the nice value is raised, and at which the thread goes real time.
    pub(super) nice_at: usize,
    pub(super) rt_at: usize,
    /// When a pass last found `nice_at` blocks or more waiting, and `rt_at` or more.
    last_deep: Option<Instant>,
    last_very_deep: Option<Instant>,
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
    /// Checks in a row that found drops while at real time; real time not tried before this.
    futile_checks: u32,
    rt_paused_until: Option<Instant>,
}

impl Boost {
    /// For a ring of `blocks` blocks.
    pub(super) fn new(blocks: usize) -> Self {
        let nice_at = (blocks / 64).clamp(2, 4);
        Boost {
            level: Level::Normal,
            nice_at,
            rt_at: (blocks / 8).clamp(nice_at + 1, 32),
            last_deep: None,
            last_very_deep: None,
            before: nice_now(),
            // SAFETY: sched_getscheduler on this thread's own id.
            normal_policy: unsafe { libc::sched_getscheduler(libc::gettid()) } == libc::SCHED_OTHER,
            nice_refused: false,
            rt_refused: false,
            futile_checks: 0,
            rt_paused_until: None,
        }
    }

    /// After each pass over the ring: how many blocks wait (counted up to `rt_at`).
    pub(super) fn after_pass(&mut self, queued: usize, now: Instant) {
        if queued >= self.nice_at {
            self.last_deep = Some(now);
        }
        if queued >= self.rt_at {
            self.last_very_deep = Some(now);
        }
        let within =
            |t: Option<Instant>| t.is_some_and(|t| now.saturating_duration_since(t) < HOLD);
        let rt_allowed =
            self.normal_policy && !self.rt_refused && self.rt_paused_until.is_none_or(|t| now >= t);
        let stay_real_time = self.level == Level::RealTime && within(self.last_very_deep);
        let want = if queued >= self.rt_at && rt_allowed || stay_real_time {
            Level::RealTime
        } else if self.level > Level::Normal && within(self.last_deep) || queued >= self.nice_at {
            Level::Nice
        } else {
            Level::Normal
        };
        self.change_to(want);
    }

    /// Once a second: whether the ring dropped segments since the last check. Real time that
    /// goes on dropping is given up (and said once).
    pub(super) fn after_check(&mut self, dropped: bool, now: Instant) {
        if self.level != Level::RealTime || !dropped {
            self.futile_checks = 0;
            return;
        }
        self.futile_checks += 1;
        if self.futile_checks >= FUTILE_CHECKS {
            self.futile_checks = 0;
            if self.rt_paused_until.is_none() {
                tracing::warn!(
                    "tap: the ring kept overflowing with its thread at real-time priority: this load is more than one thread reads; the thread steps down so as not to take a core from the benchmark (segments are lost: see tap_dropped_packets_total)"
                );
            }
            self.rt_paused_until = Some(now + FUTILE_PAUSE);
            self.last_very_deep = None;
            self.change_to(Level::Nice);
        }
    }

    /// The system calls from the current level to `want`. A raise the kernel refuses is
    /// remembered (not tried again) and said once; a nice value the thread may not or need not
    /// take (started at −10 or below) leaves Nice the same as Normal.
    fn change_to(&mut self, want: Level) {
        let nice_allowed = !self.nice_refused && self.before > RAISED;
        let want = if want == Level::Nice && !nice_allowed {
            Level::Normal
        } else {
            want
        };
        let from = self.level;
        if want == from {
            return;
        }
        if from == Level::RealTime && !set_policy(libc::SCHED_OTHER, 0) {
            return; // cannot happen: lowering one's own policy needs no privilege
        }
        self.level = match want {
            Level::RealTime if set_policy(libc::SCHED_FIFO, RT_PRIORITY) => Level::RealTime,
            Level::RealTime => {
                self.rt_refused = true;
                self.refused(want);
                from.min(Level::Nice)
            }
            // From real time the nice value may still be the raised one, or never raised.
            Level::Nice if set_nice(RAISED) => Level::Nice,
            Level::Nice => {
                self.nice_refused = true;
                self.refused(want);
                Level::Normal
            }
            Level::Normal if set_nice(self.before) => Level::Normal,
            // A nice value at least as high as the start is never refused; kept, if it were.
            Level::Normal => Level::Nice,
        };
    }

    fn refused(&self, want: Level) {
        if self.nice_refused as u8 + self.rt_refused as u8 == 1 {
            tracing::warn!(
                "tap: behind the ring, and its thread's priority could not be raised to {want:?} (it needs CAP_SYS_NICE, and real time a cgroup that allows it): segments may be lost on a busy host"
            );
        }
    }

    #[cfg(test)]
    fn level(&self) -> Level {
        self.level
    }

    /// When its reader naps rather than sleeping on the socket: after each block at the normal
    /// priority; at a nice value only while blocks come at least a nap apart (raised for a second
    /// after a lag, at a low rate its naps would wake it more often than blocks would, and preempt
    /// the benchmark more readily); never at real time (its wake-ups preempt whatever runs on its
    /// CPU, and far behind it reads without waiting).
    pub(super) fn naps(&self) -> Naps {
        match self.level {
            Level::Normal => Naps::AfterEachBlock,
            Level::Nice => Naps::WhileBlocksComeFast,
            Level::RealTime => Naps::Never,
        }
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

    /// Runs `f` on a thread of its own (priorities are per thread) unless the raise is refused
    /// here, which it says.
    fn on_own_thread(f: fn()) {
        std::thread::spawn(move || {
            if !set_nice(-1) || !set_policy(libc::SCHED_FIFO, RT_PRIORITY) {
                eprintln!("SKIPPED: no CAP_SYS_NICE here");
                return;
            }
            assert!(set_policy(libc::SCHED_OTHER, 0) && set_nice(0));
            f()
        })
        .join()
        .unwrap();
    }

    const MS: Duration = Duration::from_millis(1);
    /// The default ring's thresholds (256 blocks).
    const NICE_AT: usize = 4;
    const RT_AT: usize = 32;

    #[test]
    fn the_thresholds_follow_the_rings_size() {
        let b = Boost::new(256);
        assert_eq!((b.nice_at, b.rt_at), (NICE_AT, RT_AT));
        let b = Boost::new(8);
        assert_eq!(
            (b.nice_at, b.rt_at),
            (2, 3),
            "a 1 MiB ring still reaches real time"
        );
    }

    #[test]
    fn the_priority_rises_with_the_queue_and_comes_down_a_second_after_the_last_deep_one() {
        on_own_thread(|| {
            let mut b = Boost::new(256);
            let t = passes(&mut b, 50, NICE_AT - 1, Instant::now(), MS);
            assert!(
                b.level() == Level::Normal && nice_now() == 0,
                "a few blocks waiting are a busy ring read in time"
            );
            assert_eq!(b.naps(), Naps::AfterEachBlock);
            let t = passes(&mut b, 1, NICE_AT, t, MS);
            assert_eq!((b.level(), nice_now()), (Level::Nice, RAISED));
            assert_eq!(b.naps(), Naps::WhileBlocksComeFast);
            let t = passes(&mut b, 1, RT_AT, t, MS);
            assert_eq!(b.level(), Level::RealTime, "far behind: real time");
            assert_eq!(policy_now(), libc::SCHED_FIFO);
            assert_eq!(
                b.naps(),
                Naps::Never,
                "at real time it sleeps on the socket"
            );
            // Read up but for a block waiting now and then: that holds nothing up.
            let mut t = t;
            for _ in 0..20 {
                t = passes(&mut b, 9, 0, t, MS * 10);
                t = passes(&mut b, 1, 1, t, MS * 10);
            }
            assert_eq!(
                b.level(),
                Level::Normal,
                "down a second after the last deep queue"
            );
            assert_eq!((policy_now(), nice_now()), (libc::SCHED_OTHER, 0));
            // A deep queue again, then 800 ms calm: still raised.
            let t = passes(&mut b, 1, NICE_AT, t, MS);
            passes(&mut b, 80, 0, t, MS * 10);
            assert_eq!(b.level(), Level::Nice, "held through 800 ms read up");
        });
    }

    #[test]
    fn real_time_is_held_only_by_queues_that_call_for_it() {
        on_own_thread(|| {
            let mut b = Boost::new(256);
            let mut t = passes(&mut b, 1, RT_AT, Instant::now(), MS);
            assert_eq!(b.level(), Level::RealTime);
            // A queue deep enough for the nice value every 500 ms, for 3 s.
            for _ in 0..6 {
                t = passes(&mut b, 1, NICE_AT, t, MS);
                t = passes(&mut b, 50, 0, t, MS * 10);
            }
            assert_eq!(
                b.level(),
                Level::Nice,
                "real time gone a second after its last queue"
            );
            assert_eq!((policy_now(), nice_now()), (libc::SCHED_OTHER, RAISED));
        });
    }

    #[test]
    fn real_time_that_does_not_stop_the_drops_is_given_up_for_a_while() {
        on_own_thread(|| {
            let mut b = Boost::new(256);
            let mut t = Instant::now();
            for _ in 0..FUTILE_CHECKS {
                t = passes(&mut b, 100, RT_AT, t, MS * 10);
                assert_eq!(b.level(), Level::RealTime);
                b.after_check(true, t);
            }
            assert_eq!(b.level(), Level::Nice, "it stepped down");
            assert_eq!(policy_now(), libc::SCHED_OTHER);
            let t = passes(&mut b, 100, RT_AT, t, MS * 10);
            assert_eq!(b.level(), Level::Nice, "and stays down for a while");
            passes(&mut b, 1, RT_AT, t + FUTILE_PAUSE, MS);
            assert_eq!(b.level(), Level::RealTime, "then real time is tried again");
        });
    }

    #[test]
    fn a_thread_started_nicer_returns_to_its_own_nice_value() {
        on_own_thread(|| {
            assert!(set_nice(5));
            let mut b = Boost::new(256);
            let t = passes(&mut b, 1, RT_AT, Instant::now(), Duration::ZERO);
            passes(&mut b, 2, 0, t, HOLD);
            assert_eq!((b.level(), nice_now()), (Level::Normal, 5), "not left at 0");
        });
    }

    #[test]
    fn a_thread_started_real_time_keeps_its_policy() {
        on_own_thread(|| {
            assert!(set_policy(libc::SCHED_RR, 2));
            let mut b = Boost::new(256);
            let t = passes(&mut b, 1, RT_AT, Instant::now(), Duration::ZERO);
            assert_ne!(b.level(), Level::RealTime);
            passes(&mut b, 2, 0, t, HOLD);
            assert_eq!(policy_now(), libc::SCHED_RR, "not put back to SCHED_OTHER");
        });
    }

    #[test]
    fn a_thread_started_at_nice_minus_ten_still_goes_real_time_when_far_behind() {
        on_own_thread(|| {
            assert!(set_nice(-12));
            let mut b = Boost::new(256);
            let t = passes(&mut b, 1, NICE_AT, Instant::now(), Duration::ZERO);
            assert_eq!(nice_now(), -12, "not lowered to -10 by a raise");
            let t = passes(&mut b, 1, RT_AT, t, Duration::ZERO);
            assert_eq!(b.level(), Level::RealTime);
            passes(&mut b, 2, 0, t, HOLD);
            assert_eq!((policy_now(), nice_now()), (libc::SCHED_OTHER, -12));
        });
    }

    #[test]
    fn a_thread_started_from_the_raised_one_does_not_inherit_real_time() {
        on_own_thread(|| {
            assert!(set_policy(libc::SCHED_FIFO, RT_PRIORITY));
            let child = std::thread::spawn(policy_now).join().unwrap();
            assert_eq!(child, libc::SCHED_OTHER);
        });
    }
}
