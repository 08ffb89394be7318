//! Background GPU sampling: one thread per GPU (staggered), so a slow driver call on one GPU
//! never delays another, and nothing else in the process ever waits for the driver.
//!
//! Each tick reads the cheap values (instant and average power, memory, utilization, clocks,
//! temperature: microseconds each). The energy counter costs ~3.6 ms per read on an H200, so it
//! is read at the window's edges and every `energy_interval` in between: the counter is
//! cumulative, so the window's energy stays exact at a fraction of the cost. Per GPU the sampler
//! keeps the latest sample (for `/metrics`), running window statistics, and streams rows to the
//! power CSV, keeping what it wrote so that InferenceX's verdict (`crate::inferencex`) can be
//! asked over any span of the run — a window, its traffic, a benchmark's own span — on exactly
//! what the CSV holds.
//!
//! `stats`: the running statistics; `window`: windows between two edge readings; `thread`: the
//! sampling thread; `csv`: the power CSV and the rows kept from it.
mod csv;
mod stats;
mod thread;
mod window;

pub use csv::{
    nvidia_smi_timestamp, read_series, series_of_lines, GpuSeries, PerGpu, CSV_HEADER,
    MAX_KEPT_ROWS,
};
pub use stats::GpuWindow;

use crate::gpu::{GpuError, GpuProbe, GpuSample, Want};
use crate::inferencex::{CounterEnergy, Verdict};
use csv::PowerCsv;
use serde::Serialize;
use stats::Stats;
use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};
use window::{span_end_now, Closed, EdgeWindow};

pub use crate::inferencex::MAX_SAMPLE_GAP_S;

#[derive(Debug, Clone)]
pub struct SamplerConfig {
    pub interval: Duration,
    pub energy_interval: Duration,
}

/// A sample with when it was taken.
#[derive(Debug, Clone, Serialize)]
pub struct TimedSample {
    /// Seconds since the sampler started (monotonic clock).
    pub mono_s: f64,
    /// Wall clock, seconds since the Unix epoch.
    pub unix_s: f64,
    pub sample: GpuSample,
}

/// The window over all GPUs, with InferenceX's `power_valid` verdict over its span (exactly
/// what `aggregate_power.py` says on the power CSV and this span: no bracketing slack).
#[derive(Debug, Clone, Serialize)]
pub struct PowerWindow {
    pub duration_s: f64,
    /// The span (unix seconds) the verdict and the energies cover.
    pub benchmark_start_time_unix: f64,
    pub benchmark_end_time_unix: f64,
    pub power_valid: u8,
    pub reasons: Vec<&'static str>,
    /// The hardware counter's delta where every GPU has one, else the instant-power integral.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_gpu_energy_j: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub avg_total_gpu_power_w: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub avg_power_w: Option<f64>,
    /// InferenceX's trapezoid (interpolated at the edges) over the same span.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_gpu_energy_trapezoid_j: Option<f64>,
    /// The kept rows began after the span's start (a run beyond `MAX_KEPT_ROWS`): the verdict
    /// covers the span from here on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict_from_unix: Option<f64>,
    /// The full verdict: per GPU samples, largest gap, trapezoid energy, issues.
    pub inferencex: Verdict,
    pub gpus: Vec<GpuWindow>,
}

/// Power over a span of the run: InferenceX's verdict and trapezoid energy (its field names:
/// `power_valid`, `reasons`, `total_gpu_energy_j`, ...) and beside it the hardware counter over
/// the readings that bracket the span (absent where none do).
#[derive(Debug, Clone, Serialize)]
pub struct SpanPower {
    #[serde(flatten)]
    pub inferencex: Verdict,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub energy_counter: Option<CounterEnergy>,
}

struct Shared {
    probe: Box<dyn GpuProbe>,
    config: SamplerConfig,
    t0: Instant,
    latest: Vec<Mutex<Option<TimedSample>>>,
    /// (uuid, name) of each GPU, read once (the driver is asked for it on the first sample only).
    identity: Vec<OnceLock<(Option<String>, Option<String>)>>,
    /// The run's statistics, per GPU.
    stats: Vec<Mutex<Stats>>,
    csv: PowerCsv,
    /// The run's span starts here (after the first reading of every GPU), unix seconds.
    start_unix: Mutex<f64>,
    stop: AtomicBool,
    wake: (Mutex<()>, Condvar),
    /// A named measurement window in progress (`POST /-/window/start`), with its own statistics.
    window: Mutex<Option<ActiveWindow>>,
    /// GPUs the server should use (tp × pp from its resolved args), when known.
    expected_gpus: Mutex<Option<usize>>,
    traffic: Mutex<Option<TrafficWindow>>,
}

impl Shared {
    fn remember_identity(&self, index: u32, s: &GpuSample) {
        if let Some(id) = self.identity.get(index as usize) {
            if s.uuid.is_some() || s.name.is_some() {
                let _ = id.set((s.uuid.clone(), s.name.clone()));
            }
        }
    }

    /// A window's figures: per GPU from its statistics, the verdict and the trapezoid from the
    /// kept rows over its span.
    fn summarize(&self, closed: Closed) -> PowerWindow {
        let unix_span = closed.span;
        let verdict_from = self.csv.kept_from(unix_span.0);
        let expected = *lock(&self.expected_gpus);
        let (verdict, _) = self
            .csv
            .over_span((verdict_from.unwrap_or(unix_span.0), unix_span.1), expected);
        let duration_s = unix_span.1 - unix_span.0;
        let gpus: Vec<GpuWindow> = (0u32..)
            .zip(&closed.stats)
            .map(|(i, st)| st.gpu_window(i))
            .collect();
        let total = gpus.iter().map(|g| g.energy_j).sum::<Option<f64>>();
        let avg_total = total.map(|e| e / duration_s.max(f64::EPSILON));
        PowerWindow {
            duration_s,
            benchmark_start_time_unix: unix_span.0,
            benchmark_end_time_unix: unix_span.1,
            power_valid: verdict.power_valid,
            reasons: verdict.reasons.clone(),
            total_gpu_energy_j: total,
            avg_total_gpu_power_w: avg_total,
            avg_power_w: avg_total.map(|w| w / gpus.len().max(1) as f64),
            total_gpu_energy_trapezoid_j: verdict.total_gpu_energy_j,
            verdict_from_unix: verdict_from,
            inferencex: verdict,
            gpus,
        }
    }
}

struct ActiveWindow {
    name: String,
    window: EdgeWindow,
}

/// The window that follows request traffic (`--window-from-proxy`): opened by the first request,
/// checkpointed (counters read) each time the server goes idle, closed at the last checkpoint.
struct TrafficWindow {
    window: EdgeWindow,
    /// The window as if it had closed at the last idle moment.
    checkpoint: Option<Closed>,
}

pub struct Sampler {
    shared: Arc<Shared>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// A cheap handle on a running sampler: the latest samples (for scrapes; never calls the
/// driver) and named measurement windows.
#[derive(Clone)]
pub struct SamplerHandle(Arc<Shared>);

impl SamplerHandle {
    /// The latest sample of each GPU, with its identity (uuid, name) although the driver is asked
    /// for it only once.
    pub fn latest(&self) -> Vec<Option<TimedSample>> {
        (self.0.latest.iter().zip(&self.0.identity))
            .map(|(m, id)| {
                let mut t = lock(m).clone()?;
                if let Some((uuid, name)) = id.get() {
                    t.sample.uuid = t.sample.uuid.or_else(|| uuid.clone());
                    t.sample.name = t.sample.name.or_else(|| name.clone());
                }
                Some(t)
            })
            .collect()
    }

    /// How many GPUs the server is expected to use: a different number of sampled GPUs makes
    /// power invalid (`expected_gpu_count_mismatch`), as in the InferenceX aggregation.
    pub fn set_expected_gpus(&self, n: usize) {
        *lock(&self.0.expected_gpus) = Some(n);
    }

    /// Open a window named `name` (replacing one in progress). Each GPU is read at once, energy
    /// counter included, so the window is bracketed by counter readings and by power samples
    /// (blocks for those reads); the span starts once they are taken.
    pub fn window_start(&self, name: &str) {
        let window = EdgeWindow::open(&self.0);
        *lock(&self.0.window) = Some(ActiveWindow {
            name: name.to_string(),
            window,
        });
    }

    /// Power over any span of the run so far (unix seconds): InferenceX's verdict on the rows
    /// the power CSV holds for it, and the counter over the readings that bracket it.
    pub fn power_over(&self, span: (f64, f64)) -> SpanPower {
        let expected = *lock(&self.0.expected_gpus);
        let (inferencex, energy_counter) = self.0.csv.over_span(span, expected);
        SpanPower {
            inferencex,
            energy_counter,
        }
    }

    /// Requests started arriving: open the traffic window (once; later bursts continue it).
    pub fn traffic_busy(&self) {
        if lock(&self.0.traffic).is_some() {
            return;
        }
        let window = EdgeWindow::open(&self.0);
        *lock(&self.0.traffic) = Some(TrafficWindow {
            window,
            checkpoint: None,
        });
    }

    /// No request in flight: remember the window as if it ended now (counters read).
    pub fn traffic_idle(&self) {
        let Some(snapshot) = lock(&self.0.traffic).as_ref().map(|t| t.window.clone()) else {
            return;
        };
        let closed = snapshot.close(&self.0);
        if let Some(t) = lock(&self.0.traffic).as_mut() {
            t.checkpoint = Some(closed);
        }
    }

    /// The traffic window from the first request to the last idle checkpoint.
    pub fn traffic_close(&self) -> Option<PowerWindow> {
        let t = lock(&self.0.traffic).take()?;
        Some(self.0.summarize(t.checkpoint?))
    }

    /// Close the window in progress with a last counter reading; `None` if none was open.
    pub fn window_stop(&self) -> Option<(String, PowerWindow)> {
        let w = lock(&self.0.window).take()?;
        let closed = w.window.close(&self.0);
        Some((w.name, self.0.summarize(closed)))
    }
}

impl std::fmt::Debug for SamplerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SamplerHandle({} GPUs)", self.0.latest.len())
    }
}

pub(crate) use crate::sync::lock;

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl Sampler {
    /// Start one sampling thread per GPU of `probe`. `csv`: the power CSV to stream rows to.
    pub fn start(
        probe: Box<dyn GpuProbe>,
        config: SamplerConfig,
        csv: Option<File>,
    ) -> std::io::Result<Sampler> {
        Self::start_with_energy_csv(probe, config, csv, None)
    }

    /// As `start`, also writing every counter reading to `energy_csv` (`ENERGY_CSV_HEADER`), so
    /// that a span's counter energy can be recomputed later (`report --bench-result`).
    pub fn start_with_energy_csv(
        probe: Box<dyn GpuProbe>,
        config: SamplerConfig,
        csv: Option<File>,
        energy_csv: Option<File>,
    ) -> std::io::Result<Sampler> {
        let n = probe.device_count() as usize;
        let shared = Arc::new(Shared {
            probe,
            config,
            t0: Instant::now(),
            latest: (0..n).map(|_| Mutex::new(None)).collect(),
            identity: (0..n).map(|_| OnceLock::new()).collect(),
            stats: (0..n).map(|_| Mutex::new(Stats::default())).collect(),
            csv: PowerCsv::create(n, csv, energy_csv)?,
            start_unix: Mutex::new(0.0),
            stop: AtomicBool::new(false),
            wake: (Mutex::new(()), Condvar::new()),
            window: Mutex::new(None),
            expected_gpus: Mutex::new(None),
            traffic: Mutex::new(None),
        });
        // One reading of every GPU before the threads start: the run's span begins once every
        // GPU has a sample (and a counter reading) at or before it.
        let first = EdgeWindow::open(&shared);
        for (m, st) in shared.stats.iter().zip(first.stats) {
            *lock(m) = st;
        }
        *lock(&shared.start_unix) = first.start_unix;
        let mut threads = Vec::with_capacity(n);
        for i in 0..n {
            let sh = shared.clone();
            let offset = sh.config.interval.mul_f64(i as f64 / n.max(1) as f64);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("gpu-sampler-{i}"))
                    .spawn(move || thread::run(&sh, i as u32, offset))?,
            );
        }
        Ok(Sampler { shared, threads })
    }

    pub fn backend(&self) -> &'static str {
        self.shared.probe.backend()
    }

    pub fn gpu_count(&self) -> usize {
        self.shared.latest.len()
    }

    /// A handle for scrapes and measurement windows.
    pub fn handle(&self) -> SamplerHandle {
        SamplerHandle(self.shared.clone())
    }

    /// One fresh reading of everything, processes included, on the calling thread.
    pub fn probe_now(&self, index: u32) -> Result<GpuSample, GpuError> {
        self.shared.probe.sample(index, Want::ALL)
    }

    /// Stop (each thread takes a last sample with the energy counter, closing the window) and
    /// return the window's figures.
    pub fn stop(mut self) -> PowerWindow {
        let end = span_end_now();
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake.1.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let sh = &self.shared;
        sh.csv.flush();
        let stats = sh.stats.iter().map(|m| lock(m).clone()).collect();
        sh.summarize(Closed {
            span: (*lock(&sh.start_unix), end),
            stats,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inferencex;
    use std::sync::atomic::AtomicU64;

    /// A scripted GPU: power ramps, the energy counter follows it (and can be reset), calls can
    /// stall or fail.
    struct Fake {
        calls: AtomicU64,
        stall_at: Option<(u64, u64)>,
        reset_at: Option<u64>,
        gone_at: Option<u64>,
        no_power: bool,
    }

    impl GpuProbe for Fake {
        fn backend(&self) -> &'static str {
            "fake"
        }
        fn device_count(&self) -> u32 {
            1
        }
        fn sample(&self, index: u32, want: Want) -> Result<GpuSample, GpuError> {
            let n = self.calls.fetch_add(1, Ordering::SeqCst);
            if let Some((at, ms)) = self.stall_at {
                if n == at {
                    std::thread::sleep(Duration::from_millis(ms));
                }
            }
            if self.gone_at.is_some_and(|g| n >= g) {
                return Err(GpuError::Gone {
                    index,
                    why: "fell off the bus".into(),
                });
            }
            let base = if self.reset_at.is_some_and(|r| n >= r) {
                0.0
            } else {
                1000.0
            };
            Ok(GpuSample {
                index,
                name: want.identity.then(|| "Fake H200".into()),
                uuid: want.identity.then(|| "GPU-fa4e".into()),
                power_w: (!self.no_power).then_some(100.0),
                power_avg_w: (!self.no_power).then_some(100.0),
                energy_j: want.energy.then_some(base + n as f64),
                ..GpuSample::default()
            })
        }
    }

    fn fake() -> Fake {
        Fake {
            calls: AtomicU64::new(0),
            stall_at: None,
            reset_at: None,
            gone_at: None,
            no_power: false,
        }
    }

    fn window(f: Fake, run_ms: u64) -> PowerWindow {
        let cfg = SamplerConfig {
            interval: Duration::from_millis(10),
            energy_interval: Duration::from_millis(50),
        };
        let s = Sampler::start(Box::new(f), cfg, None).unwrap();
        std::thread::sleep(Duration::from_millis(run_ms));
        s.stop()
    }

    #[test]
    fn steady_sampling_is_valid_and_integrates_power() {
        let w = window(fake(), 300);
        assert_eq!(w.power_valid, 1, "{w:?}");
        let g = &w.gpus[0];
        assert!(g.samples > 10 && g.achieved_hz > 30.0, "{g:?}");
        assert_eq!(g.energy_source, "counter");
        let span = g.energy_from_instant_power_j / 100.0;
        assert!(
            (span - w.duration_s).abs() < 0.1,
            "100 W over the run: {g:?}"
        );
        assert_eq!(g.name.as_deref(), Some("Fake H200"));
    }

    #[test]
    fn the_latest_samples_carry_the_identity_read_once() {
        let f = fake();
        let s = Sampler::start(
            Box::new(f),
            SamplerConfig {
                interval: Duration::from_millis(10),
                energy_interval: Duration::from_millis(50),
            },
            None,
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let latest = s.handle().latest();
        let t = latest[0].as_ref().unwrap();
        assert!(t.mono_s > 0.05, "a sample well after the first: {t:?}");
        assert_eq!(t.sample.uuid.as_deref(), Some("GPU-fa4e"));
        assert_eq!(t.sample.name.as_deref(), Some("Fake H200"));
        let _ = s.stop();
    }

    #[test]
    fn a_short_stall_is_the_largest_gap_but_within_the_rule() {
        let w = window(
            Fake {
                stall_at: Some((5, 400)),
                ..fake()
            },
            600,
        );
        assert!(w.gpus[0].max_gap_s >= 0.39, "{w:?}");
        assert_eq!(w.power_valid, 1, "400 ms is within the 3 s rule");
    }

    #[test]
    fn a_stall_beyond_3_s_voids_power_with_the_inferencex_reason() {
        let w = window(
            Fake {
                stall_at: Some((5, 3100)),
                ..fake()
            },
            3300,
        );
        assert!(w.gpus[0].max_gap_s > MAX_SAMPLE_GAP_S, "{w:?}");
        assert_eq!(w.power_valid, 0);
        assert_eq!(w.reasons, ["sampling_gap_exceeded"]);
    }

    #[test]
    fn a_counter_reset_is_counted_not_subtracted() {
        let w = window(
            Fake {
                reset_at: Some(15),
                ..fake()
            },
            300,
        );
        let g = &w.gpus[0];
        assert_eq!(g.energy_counter_resets, 1, "{g:?}");
        assert!(g.energy_j.unwrap() >= 0.0);
    }

    #[test]
    fn a_gpu_that_disappears_is_reported_and_voids_power() {
        let w = window(
            Fake {
                gone_at: Some(5),
                ..fake()
            },
            200,
        );
        assert_eq!(w.gpus[0].gone.as_deref(), Some("fell off the bus"));
        assert_eq!(w.power_valid, 0);
        assert_eq!(
            w.reasons,
            ["benchmark_window_not_bracketed"],
            "its samples stop before the run's end, as in the CSV InferenceX would read"
        );
    }

    #[test]
    fn missing_power_is_absent_and_invalid_never_zero() {
        let w = window(
            Fake {
                no_power: true,
                ..fake()
            },
            100,
        );
        assert_eq!(w.gpus[0].peak_power_w, None);
        assert_eq!(w.total_gpu_energy_trapezoid_j, None);
        assert_eq!(
            w.reasons,
            ["invalid_power_sample", "no_usable_power_samples"],
            "[N/A] rows, as InferenceX reads them"
        );
    }

    #[test]
    fn a_named_window_is_bracketed_by_counter_reads_and_measured_apart() {
        let cfg = SamplerConfig {
            interval: Duration::from_millis(10),
            energy_interval: Duration::from_secs(60),
        };
        let s = Sampler::start(Box::new(fake()), cfg, None).unwrap();
        let h = s.handle();
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            h.latest()[0].as_ref().unwrap().sample.energy_j.is_some(),
            "the last counter reading stays in the cache"
        );
        assert!(h.window_stop().is_none(), "no window open yet");
        h.window_start("bench");
        std::thread::sleep(Duration::from_millis(200));
        let (name, w) = h.window_stop().unwrap();
        assert_eq!(name, "bench");
        let g = &w.gpus[0];
        assert_eq!(
            g.energy_source, "counter",
            "edges read the counter even with a 60 s energy interval"
        );
        assert!(g.samples >= 10 && w.duration_s < 0.3, "{w:?}");
        let run = s.stop();
        assert!(run.gpus[0].samples > g.samples);
    }

    #[test]
    fn a_gpu_count_other_than_the_servers_voids_power() {
        let cfg = SamplerConfig {
            interval: Duration::from_millis(10),
            energy_interval: Duration::from_millis(50),
        };
        let s = Sampler::start(Box::new(fake()), cfg, None).unwrap();
        s.handle().set_expected_gpus(8);
        std::thread::sleep(Duration::from_millis(100));
        let w = s.stop();
        assert_eq!(
            w.reasons,
            ["expected_gpu_count_mismatch"],
            "1 GPU sampled for a tp=8 server"
        );
    }

    #[test]
    fn the_traffic_window_ends_at_the_last_idle_checkpoint() {
        let cfg = SamplerConfig {
            interval: Duration::from_millis(10),
            energy_interval: Duration::from_secs(60),
        };
        let s = Sampler::start(Box::new(fake()), cfg, None).unwrap();
        let h = s.handle();
        assert!(h.traffic_close().is_none());
        h.traffic_busy();
        std::thread::sleep(Duration::from_millis(100));
        h.traffic_idle();
        h.traffic_busy(); // a second burst continues the same window
        std::thread::sleep(Duration::from_millis(100));
        h.traffic_idle();
        std::thread::sleep(Duration::from_millis(300)); // idle tail: not part of the window
        let w = h.traffic_close().unwrap();
        assert!((0.18..0.28).contains(&w.duration_s), "{}", w.duration_s);
        assert_eq!(w.gpus[0].energy_source, "counter");
        let _ = s.stop();
    }

    #[test]
    fn a_window_is_bracketed_without_slack_even_at_a_slow_rate() {
        let cfg = SamplerConfig {
            interval: Duration::from_secs(1),
            energy_interval: Duration::from_secs(60),
        };
        let s = Sampler::start(Box::new(fake()), cfg, None).unwrap();
        let h = s.handle();
        std::thread::sleep(Duration::from_millis(50));
        h.window_start("w");
        std::thread::sleep(Duration::from_millis(200));
        let (_, w) = h.window_stop().unwrap();
        assert_eq!(w.reasons, Vec::<&str>::new(), "{w:?}");
        let e = w.total_gpu_energy_trapezoid_j.unwrap();
        assert!((e - 100.0 * w.duration_s).abs() < 1e-6, "{e} {w:?}");
        // the counter brackets the window through its edge reads
        let over = h.power_over((w.benchmark_start_time_unix, w.benchmark_end_time_unix));
        assert!(over.energy_counter.is_some());
        assert_eq!(over.inferencex, w.inferencex);
        let _ = s.stop();
    }

    #[test]
    fn the_kept_rows_are_the_csvs_rows() {
        let dir = std::env::temp_dir().join(format!("sampler-kept-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (csv, energy) = (dir.join("p.csv"), dir.join("p_energy.csv"));
        let cfg = SamplerConfig {
            interval: Duration::from_millis(10),
            energy_interval: Duration::from_millis(50),
        };
        let s = Sampler::start_with_energy_csv(
            Box::new(fake()),
            cfg,
            Some(File::create(&csv).unwrap()),
            Some(File::create(&energy).unwrap()),
        )
        .unwrap();
        let h = s.handle();
        std::thread::sleep(Duration::from_millis(100));
        h.window_start("w");
        std::thread::sleep(Duration::from_millis(150));
        let (_, w) = h.window_stop().unwrap();
        let run = s.stop();
        for (span, live) in [
            (
                (w.benchmark_start_time_unix, w.benchmark_end_time_unix),
                &w.inferencex,
            ),
            (
                (run.benchmark_start_time_unix, run.benchmark_end_time_unix),
                &run.inferencex,
            ),
        ] {
            let mut offline = inferencex::verdict_of_csv(&csv, span, None, MAX_SAMPLE_GAP_S);
            // Samples written after the window closed (within 3 s of its end) count in the CSV
            // read later, not at the close; nothing else can differ.
            offline.gpus[0].samples = live.gpus[0].samples;
            assert_eq!(&offline, live);
            assert_eq!(live.power_valid, 1, "{live:?}");
        }
        let reads = inferencex::parse_energy_csv(&std::fs::read_to_string(&energy).unwrap());
        let c = inferencex::counter_energy(
            &reads,
            (w.benchmark_start_time_unix, w.benchmark_end_time_unix),
        )
        .unwrap();
        assert!(c.total_gpu_energy_j > 0.0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
