//! A window over the run: per-GPU statistics between two edges, each edge a reading of every GPU
//! (energy counter included) taken on the caller's thread, so the window is bracketed by counter
//! readings and power samples whatever the sampling rate. Named windows, the traffic window and
//! the run's first reading all open (and close) this way.
use super::stats::{thread_cpu_time, Stats};
use super::{unix_now, Shared};
use crate::gpu::{GpuError, Want};
use crate::inferencex;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub(super) struct EdgeWindow {
    /// Unix seconds, once the opening readings are in.
    pub start_unix: f64,
    pub stats: Vec<Stats>,
}

/// A window after its closing edge.
pub(super) struct Closed {
    pub span: (f64, f64),
    pub stats: Vec<Stats>,
}

impl EdgeWindow {
    /// Read every GPU (blocks for those reads); the span starts once they are taken.
    pub fn open(sh: &Shared) -> EdgeWindow {
        let mut stats = vec![Stats::default(); sh.latest.len()];
        read_edge(sh, &mut stats);
        EdgeWindow {
            start_unix: unix_now(),
            stats,
        }
    }

    /// The span ends now, before the closing readings, which are added to the statistics.
    pub fn close(mut self, sh: &Shared) -> Closed {
        let end_unix = span_end_now();
        read_edge(sh, &mut self.stats);
        Closed {
            span: (self.start_unix, end_unix),
            stats: self.stats,
        }
    }
}

/// One reading of every GPU with the energy counter, each folded into its statistics.
fn read_edge(sh: &Shared, stats: &mut [Stats]) {
    for (index, st) in (0u32..).zip(stats.iter_mut()) {
        let want = Want {
            energy: true,
            processes: false,
            identity: st.identity.is_none(),
        };
        let cpu0 = thread_cpu_time();
        match sh.probe.sample(index, want) {
            Ok(s) => {
                sh.csv.write(index, unix_now(), &s);
                sh.remember_identity(index, &s);
                st.update(
                    sh.t0.elapsed().as_secs_f64(),
                    thread_cpu_time().saturating_sub(cpu0),
                    &s,
                );
            }
            Err(e) => {
                st.errors += 1;
                if let GpuError::Gone { why, .. } = e {
                    st.gone = Some(why);
                }
            }
        }
    }
}

/// A span's end taken now, before the closing reads. The closing rows are written with
/// timestamps floored to the millisecond: wait until that floor has passed this instant, so they
/// bracket it and anything that ended before it (a response the window counts), as InferenceX
/// reads the CSV. Waits at most a millisecond.
pub(super) fn span_end_now() -> f64 {
    let now = unix_now();
    let deadline = Instant::now() + Duration::from_millis(5);
    while inferencex::csv_time(unix_now()) < now && Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(100));
    }
    now
}
