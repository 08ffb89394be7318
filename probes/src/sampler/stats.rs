//! Running statistics of one GPU over a span (the run, or a window), folded one sample at a time,
//! and the per-GPU figures they give.
use crate::gpu::GpuSample;
use serde::Serialize;
use std::time::Duration;

/// Running statistics of one GPU over a span.
#[derive(Debug, Default, Clone)]
pub(super) struct Stats {
    pub samples: u64,
    power_samples: u64,
    pub errors: u64,
    pub gone: Option<String>,
    first_s: Option<f64>,
    last_s: Option<f64>,
    max_gap_s: f64,
    pub missed_ticks: u64,
    last_power: Option<(f64, f64)>,
    last_avg_power: Option<(f64, f64)>,
    instant_integral_j: f64,
    avg_integral_j: f64,
    power_sum_w: f64,
    peak_w: Option<f64>,
    peak_avg_w: Option<f64>,
    energy_first: Option<f64>,
    energy_prev: Option<f64>,
    energy_counted_j: f64,
    energy_resets: u32,
    energy_reads: u64,
    cpu_busy: Duration,
    /// (uuid, name), from the first sample that has either.
    pub identity: Option<(Option<String>, Option<String>)>,
}

/// One GPU's figures over the window.
#[derive(Debug, Clone, Serialize)]
pub struct GpuWindow {
    pub index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub samples: u64,
    pub achieved_hz: f64,
    pub max_gap_s: f64,
    /// Energy over the window: the hardware counter's delta where there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub energy_j: Option<f64>,
    /// `counter` or `instant_power_integral` (no counter on this device).
    pub energy_source: &'static str,
    pub energy_from_instant_power_j: f64,
    pub energy_from_average_power_j: f64,
    pub energy_counter_resets: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub avg_power_w: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_power_w: Option<f64>,
    /// Peak of the driver's 1 s average: next to `peak_power_w` it shows what averaging hides.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_average_power_w: Option<f64>,
    pub errors: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gone: Option<String>,
    /// CPU time the sampler spent per sample of this GPU (driver calls included), milliseconds.
    pub cpu_ms_per_sample: f64,
}

impl Stats {
    /// Fold in one sample taken at `t` (seconds since the sampler started) that cost `cpu`.
    pub fn update(&mut self, t: f64, cpu: Duration, s: &GpuSample) {
        self.samples += 1;
        self.cpu_busy += cpu;
        if self.identity.is_none() && (s.name.is_some() || s.uuid.is_some()) {
            self.identity = Some((s.uuid.clone(), s.name.clone()));
        }
        if let Some(prev) = self.last_s {
            self.max_gap_s = self.max_gap_s.max(t - prev);
        }
        self.first_s.get_or_insert(t);
        self.last_s = Some(t);
        if let Some(p) = s.power_w.or(s.power_avg_w) {
            self.power_samples += 1;
            self.power_sum_w += p;
            self.peak_w = Some(self.peak_w.map_or(p, |m: f64| m.max(p)));
            if let Some((t0, p0)) = self.last_power {
                self.instant_integral_j += (t - t0) * (p + p0) / 2.0;
            }
            self.last_power = Some((t, p));
        }
        if let Some(p) = s.power_avg_w {
            self.peak_avg_w = Some(self.peak_avg_w.map_or(p, |m: f64| m.max(p)));
            if let Some((t0, p0)) = self.last_avg_power {
                self.avg_integral_j += (t - t0) * (p + p0) / 2.0;
            }
            self.last_avg_power = Some((t, p));
        }
        if let Some(e) = s.energy_j {
            self.energy_reads += 1;
            self.energy_first.get_or_insert(e);
            if let Some(prev) = self.energy_prev {
                if e >= prev {
                    self.energy_counted_j += e - prev;
                } else {
                    // A counter that goes backwards was reset (or wrapped): count from its new value.
                    self.energy_resets += 1;
                    self.energy_counted_j += e;
                }
            }
            self.energy_prev = Some(e);
        }
    }

    /// The figures of GPU `index` over the span these statistics cover.
    pub fn gpu_window(&self, index: u32) -> GpuWindow {
        let span = match (self.first_s, self.last_s) {
            (Some(a), Some(b)) if b > a => b - a,
            _ => 0.0,
        };
        let has_counter = self.energy_reads >= 2;
        let energy_j = if has_counter {
            Some(self.energy_counted_j)
        } else if self.power_samples >= 2 {
            Some(self.instant_integral_j)
        } else {
            None
        };
        let (uuid, name) = self.identity.clone().unwrap_or_default();
        GpuWindow {
            index,
            uuid,
            name,
            samples: self.samples,
            achieved_hz: if span > 0.0 {
                (self.samples.saturating_sub(1)) as f64 / span
            } else {
                0.0
            },
            max_gap_s: (self.max_gap_s * 1000.0).round() / 1000.0,
            energy_j,
            energy_source: if has_counter {
                "counter"
            } else {
                "instant_power_integral"
            },
            energy_from_instant_power_j: self.instant_integral_j,
            energy_from_average_power_j: self.avg_integral_j,
            energy_counter_resets: self.energy_resets,
            avg_power_w: (span > 0.0)
                .then(|| energy_j.map(|e| e / span))
                .flatten()
                .or_else(|| {
                    (self.power_samples > 0).then(|| self.power_sum_w / self.power_samples as f64)
                }),
            peak_power_w: self.peak_w,
            peak_average_power_w: self.peak_avg_w,
            errors: self.errors,
            gone: self.gone.clone(),
            cpu_ms_per_sample: if self.samples > 0 {
                self.cpu_busy.as_secs_f64() * 1000.0 / self.samples as f64
            } else {
                0.0
            },
        }
    }
}

/// CPU time of the calling thread (what one sample costs us, driver calls included).
pub(super) fn thread_cpu_time() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map_or(Duration::ZERO, Duration::from)
}
