//! The sampling thread of one GPU: an absolute schedule of cheap readings, the energy counter
//! every `energy_interval`, each sample folded into the run's statistics and the windows open,
//! written to the CSV and cached for scrapes.
use super::stats::thread_cpu_time;
use super::{lock, unix_now, Shared, TimedSample};
use crate::gpu::{GpuError, GpuSample, Want};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

pub(super) fn run(sh: &Shared, index: u32, offset: Duration) {
    let interval = sh.config.interval;
    let mut next = sh.t0 + offset;
    let mut next_energy = sh.t0;
    let mut identity_done = false;
    let mut failures = 0u32;
    loop {
        let stopping = sh.stop.load(Ordering::SeqCst);
        let now = Instant::now();
        let want = Want {
            energy: stopping || now >= next_energy,
            processes: false,
            identity: !identity_done,
        };
        let cpu0 = thread_cpu_time();
        let result = sh.probe.sample(index, want);
        let cpu = thread_cpu_time().saturating_sub(cpu0);
        let at = Instant::now();
        let mono_s = at.duration_since(sh.t0).as_secs_f64();
        let unix_s = unix_now();
        match result {
            Ok(sample) => {
                failures = 0;
                if !identity_done {
                    sh.remember_identity(index, &sample);
                    identity_done = true;
                }
                if want.energy {
                    next_energy = at + sh.config.energy_interval;
                }
                record(sh, index, mono_s, cpu, &sample);
                sh.csv.write(index, unix_s, &sample);
                let mut latest = lock(&sh.latest[index as usize]);
                let mut sample = sample;
                // The counter is read every energy interval; between reads, scrapes see the last
                // reading (a counter that holds still briefly), never a gap in the series.
                if sample.energy_j.is_none() {
                    sample.energy_j = latest.as_ref().and_then(|t| t.sample.energy_j);
                }
                *latest = Some(TimedSample {
                    mono_s,
                    unix_s,
                    sample,
                });
            }
            Err(GpuError::Gone { why, .. }) => {
                tracing::error!(index, "GPU gone: {why}; no further samples from it");
                let mut st = lock(&sh.stats[index as usize]);
                st.gone = Some(why);
                st.errors += 1;
                return;
            }
            Err(e) => {
                failures += 1;
                lock(&sh.stats[index as usize]).errors += 1;
                tracing::warn!(index, "GPU sample failed: {e}");
                if failures >= 3 {
                    if let Err(e) = sh.probe.reinit() {
                        tracing::warn!("re-initialising the GPU library failed: {e}");
                    }
                }
            }
        }
        if stopping {
            return;
        }
        // Absolute schedule; ticks missed while a call was slow are counted, not replayed.
        next += interval;
        let now = Instant::now();
        if next < now {
            let behind = now.duration_since(next).as_nanos() / interval.as_nanos().max(1);
            lock(&sh.stats[index as usize]).missed_ticks += behind as u64 + 1;
            next += interval * (behind as u32 + 1);
        }
        let g = lock(&sh.wake.0);
        let _unused =
            sh.wake
                .1
                .wait_timeout_while(g, next.saturating_duration_since(Instant::now()), |_| {
                    !sh.stop.load(Ordering::SeqCst) && Instant::now() < next
                });
    }
}

/// Fold a sample into the run's statistics and those of the windows open.
fn record(sh: &Shared, index: u32, t: f64, cpu: Duration, s: &GpuSample) {
    let i = index as usize;
    lock(&sh.stats[i]).update(t, cpu, s);
    if let Some(st) = lock(&sh.window)
        .as_mut()
        .and_then(|w| w.window.stats.get_mut(i))
    {
        st.update(t, cpu, s);
    }
    if let Some(st) = lock(&sh.traffic)
        .as_mut()
        .and_then(|w| w.window.stats.get_mut(i))
    {
        st.update(t, cpu, s);
    }
}
