//! Background GPU sampling: one thread per GPU (staggered), so a slow driver call on one GPU
//! never delays another, and nothing else in the process ever waits for the driver.
//!
//! Each tick reads the cheap values (instant and average power, memory, utilization, clocks,
//! temperature: microseconds each). The energy counter costs ~3.6 ms per read on an H200, so it
//! is read at the window's edges and every `energy_interval` in between: the counter is
//! cumulative, so the window's energy stays exact at a fraction of the cost. Per GPU the sampler
//! keeps the latest sample (for `/metrics`), running window statistics, and streams rows to the
//! power CSV. It also keeps the rows it wrote (timestamp and power, as the CSV has them, and the
//! counter readings), so that InferenceX's verdict (`crate::inferencex`) can be asked over any
//! span of the run — a window, its traffic, a benchmark's own span — on exactly what the CSV
//! holds. Memory stays bounded: past `MAX_KEPT_ROWS` rows per GPU (29 h at 10 Hz) the oldest half
//! is let go (the CSV keeps everything).
use crate::gpu::{GpuError, GpuProbe, GpuSample, Want};
use crate::inferencex::{self, CounterEnergy, Row, Telemetry, Verdict};
use crate::sync::lock;
use serde::Serialize;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

pub use crate::inferencex::MAX_SAMPLE_GAP_S;

/// Rows kept per GPU for verdicts over spans of the run (16 bytes each).
pub const MAX_KEPT_ROWS: usize = 1 << 20;

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

/// Running statistics of one GPU over the window.
#[derive(Debug, Default, Clone)]
struct Stats {
    samples: u64,
    power_samples: u64,
    errors: u64,
    gone: Option<String>,
    first_s: Option<f64>,
    last_s: Option<f64>,
    max_gap_s: f64,
    missed_ticks: u64,
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
    identity: Option<(Option<String>, Option<String>)>,
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

/// What the sampler keeps per GPU for verdicts over spans: the CSV's rows and counter readings.
#[derive(Debug, Default)]
struct Kept {
    /// (CSV timestamp, power as written; None for `[N/A]`)
    power: Vec<(f64, Option<f64>)>,
    /// (CSV timestamp, counter joules)
    energy: Vec<(f64, f64)>,
    /// The first row kept after older ones were let go.
    trimmed_from: Option<f64>,
}

struct Shared {
    probe: Box<dyn GpuProbe>,
    config: SamplerConfig,
    t0: Instant,
    latest: Vec<Mutex<Option<TimedSample>>>,
    stats: Vec<Mutex<Stats>>,
    csv: Option<Mutex<BufWriter<File>>>,
    /// The counter readings next to the CSV (`<stem>_energy.csv`).
    energy_csv: Option<Mutex<BufWriter<File>>>,
    kept: Vec<Mutex<Kept>>,
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

struct ActiveWindow {
    name: String,
    start_unix: f64,
    stats: Vec<Stats>,
}

/// The window that follows request traffic (`--window-from-proxy`): opened by the first request,
/// checkpointed (counters read) each time the server goes idle, closed at the last checkpoint.
struct TrafficWindow {
    start_unix: f64,
    stats: Vec<Stats>,
    /// (end in unix seconds, the statistics as they were then, last edge read included)
    checkpoint: Option<(f64, Vec<Stats>)>,
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
    pub fn latest(&self) -> Vec<Option<TimedSample>> {
        self.0.latest.iter().map(|m| lock(m).clone()).collect()
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
        let n = self.0.latest.len();
        let mut w = ActiveWindow {
            name: name.to_string(),
            start_unix: 0.0,
            stats: vec![Stats::default(); n],
        };
        for (i, st) in w.stats.iter_mut().enumerate() {
            edge_sample(&self.0, i as u32, st);
        }
        w.start_unix = unix_now();
        *lock(&self.0.window) = Some(w);
    }

    /// Power over any span of the run so far (unix seconds): InferenceX's verdict on the rows
    /// the power CSV holds for it, and the counter over the readings that bracket it.
    pub fn power_over(&self, span: (f64, f64)) -> SpanPower {
        let (inferencex, energy_counter) = over_span(&self.0, span);
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
        let n = self.0.latest.len();
        let mut stats = vec![Stats::default(); n];
        for (i, st) in stats.iter_mut().enumerate() {
            edge_sample(&self.0, i as u32, st);
        }
        *lock(&self.0.traffic) = Some(TrafficWindow {
            start_unix: unix_now(),
            stats,
            checkpoint: None,
        });
    }

    /// No request in flight: remember the window as if it ended now (counters read).
    pub fn traffic_idle(&self) {
        let Some(mut snapshot) = lock(&self.0.traffic).as_ref().map(|t| t.stats.clone()) else {
            return;
        };
        let end_unix = span_end_now();
        for (i, st) in snapshot.iter_mut().enumerate() {
            edge_sample(&self.0, i as u32, st);
        }
        if let Some(t) = lock(&self.0.traffic).as_mut() {
            t.checkpoint = Some((end_unix, snapshot));
        }
    }

    /// The traffic window from the first request to the last idle checkpoint.
    pub fn traffic_close(&self) -> Option<PowerWindow> {
        let t = lock(&self.0.traffic).take()?;
        let (end_unix, stats) = t.checkpoint?;
        Some(summarize_stats(&self.0, stats, (t.start_unix, end_unix)))
    }

    /// Close the window in progress with a last counter reading; `None` if none was open.
    pub fn window_stop(&self) -> Option<(String, PowerWindow)> {
        let mut w = lock(&self.0.window).take()?;
        let end_unix = span_end_now();
        for (i, st) in w.stats.iter_mut().enumerate() {
            edge_sample(&self.0, i as u32, st);
        }
        Some((
            w.name,
            summarize_stats(&self.0, w.stats, (w.start_unix, end_unix)),
        ))
    }
}

/// One reading with the energy counter, taken on the caller's thread at a window's edge.
fn edge_sample(sh: &Shared, index: u32, st: &mut Stats) {
    let want = Want {
        energy: true,
        processes: false,
        identity: st.identity.is_none(),
    };
    let cpu0 = thread_cpu_time();
    match sh.probe.sample(index, want) {
        Ok(s) => {
            keep(sh, index, unix_now(), &s);
            update(
                st,
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

impl std::fmt::Debug for SamplerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SamplerHandle({} GPUs)", self.0.latest.len())
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A span's end taken now, before the closing reads. The closing rows are written with
/// timestamps floored to the millisecond: wait until that floor has passed this instant, so they
/// bracket it and anything that ended before it (a response the window counts), as InferenceX
/// reads the CSV. Waits at most a millisecond.
fn span_end_now() -> f64 {
    let now = unix_now();
    let deadline = Instant::now() + Duration::from_millis(5);
    while inferencex::csv_time(unix_now()) < now && Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(100));
    }
    now
}

/// A row of the power CSV (and of the energy sidecar when the counter was read), kept for
/// verdicts over spans with the very values written.
fn keep(sh: &Shared, index: u32, unix_s: f64, s: &GpuSample) {
    if let Some(csv) = &sh.csv {
        let _ = lock(csv).write_all(csv_row(unix_s, s).as_bytes());
    }
    let t = inferencex::csv_time(unix_s);
    let power = s
        .power_w
        .or(s.power_avg_w)
        .and_then(|w| format!("{w:.2}").parse::<f64>().ok());
    if let (Some(e), Some(csv)) = (s.energy_j, &sh.energy_csv) {
        let _ = writeln!(
            lock(csv),
            "{}, {}, {e:.3}",
            nvidia_smi_timestamp(unix_s),
            s.index
        );
    }
    let Some(k) = sh.kept.get(index as usize) else {
        return;
    };
    let mut k = lock(k);
    for rows in [k.power.len(), k.energy.len()] {
        if rows >= MAX_KEPT_ROWS {
            k.power.drain(..MAX_KEPT_ROWS / 2);
            let from = k.power.first().map_or(t, |r| r.0);
            k.energy.retain(|r| r.0 >= from);
            k.trimmed_from = Some(from);
        }
    }
    k.power.push((t, power));
    if let Some(e) = s.energy_j {
        k.energy.push((t, e));
    }
}

/// InferenceX's verdict and the counter over `span`, from the rows kept.
fn over_span(sh: &Shared, span: (f64, f64)) -> (Verdict, Option<CounterEnergy>) {
    let margin = MAX_SAMPLE_GAP_S + 1.0;
    let mut rows = Vec::new();
    let mut reads = Vec::with_capacity(sh.kept.len());
    for (i, k) in sh.kept.iter().enumerate() {
        let k = lock(k);
        let id = i.to_string();
        rows.extend(
            k.power
                .iter()
                .filter(|r| r.0 >= span.0 - margin && r.0 <= span.1 + margin)
                .map(|&(t, p)| Row {
                    unix_s: Some(t),
                    gpu: Some(id.clone()),
                    power_w: p,
                }),
        );
        reads.push(k.energy.clone());
    }
    let expected = *lock(&sh.expected_gpus);
    let v = inferencex::verdict(&Telemetry::Rows(rows), span, expected, MAX_SAMPLE_GAP_S);
    (v, inferencex::counter_energy(&reads, span))
}

/// The header `nvidia-smi --query-gpu=timestamp,index,power.draw,temperature.gpu,clocks.current.sm,
/// clocks.current.memory,utilization.gpu,utilization.memory --format=csv` prints.
pub const CSV_HEADER: &str = "timestamp, index, power.draw [W], temperature.gpu, clocks.current.sm [MHz], clocks.current.memory [MHz], utilization.gpu [%], utilization.memory [%]";

fn csv_row(unix_s: f64, s: &GpuSample) -> String {
    let na = || "[N/A]".to_string();
    let power = s
        .power_w
        .or(s.power_avg_w)
        .map_or_else(na, |w| format!("{w:.2} W"));
    let temp = s.temperature_c.map_or_else(na, |t| format!("{t:.0}"));
    let mhz = |hz: Option<u64>| hz.map_or_else(na, |h| format!("{} MHz", h / 1_000_000));
    let pct = |r: Option<f64>| r.map_or_else(na, |r| format!("{:.0} %", r * 100.0));
    format!(
        "{}, {}, {power}, {temp}, {}, {}, {}, {}\n",
        nvidia_smi_timestamp(unix_s),
        s.index,
        mhz(s.sm_clock_hz),
        mhz(s.memory_clock_hz),
        pct(s.utilization),
        pct(s.memory_utilization)
    )
}

/// `2026/12/02 09:19:31.105` (UTC), nvidia-smi's timestamp format.
pub fn nvidia_smi_timestamp(unix_s: f64) -> String {
    let secs = unix_s.floor() as i64;
    let ms = ((unix_s - secs as f64) * 1000.0).floor() as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z.rem_euclid(146097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}/{m:02}/{d:02} {:02}:{:02}:{:02}.{ms:03}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// CPU time of the calling thread (what one sample costs us, driver calls included).
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(
        ts.tv_sec.max(0) as u64,
        ts.tv_nsec.clamp(0, 999_999_999) as u32,
    )
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
        let with_header = |f: Option<File>, header: &str| -> std::io::Result<_> {
            match f {
                Some(f) => {
                    let mut w = BufWriter::new(f);
                    writeln!(w, "{header}")?;
                    Ok(Some(Mutex::new(w)))
                }
                None => Ok(None),
            }
        };
        let csv = with_header(csv, CSV_HEADER)?;
        let energy_csv = with_header(energy_csv, inferencex::ENERGY_CSV_HEADER)?;
        let shared = Arc::new(Shared {
            probe,
            config,
            t0: Instant::now(),
            latest: (0..n).map(|_| Mutex::new(None)).collect(),
            stats: (0..n).map(|_| Mutex::new(Stats::default())).collect(),
            csv,
            energy_csv,
            kept: (0..n).map(|_| Mutex::new(Kept::default())).collect(),
            start_unix: Mutex::new(0.0),
            stop: AtomicBool::new(false),
            wake: (Mutex::new(()), Condvar::new()),
            window: Mutex::new(None),
            expected_gpus: Mutex::new(None),
            traffic: Mutex::new(None),
        });
        // One reading of every GPU before the threads start: the run's span begins once every
        // GPU has a sample (and a counter reading) at or before it.
        for i in 0..n {
            edge_sample(&shared, i as u32, &mut lock(&shared.stats[i]));
        }
        *lock(&shared.start_unix) = unix_now();
        let mut threads = Vec::with_capacity(n);
        for i in 0..n {
            let sh = shared.clone();
            let offset = sh.config.interval.mul_f64(i as f64 / n.max(1) as f64);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("gpu-sampler-{i}"))
                    .spawn(move || run(&sh, i as u32, offset))?,
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
        for csv in [&self.shared.csv, &self.shared.energy_csv]
            .into_iter()
            .flatten()
        {
            let _ = lock(csv).flush();
        }
        let sh = &self.shared;
        let stats = sh.stats.iter().map(|m| lock(m).clone()).collect();
        summarize_stats(sh, stats, (*lock(&sh.start_unix), end))
    }
}

fn run(sh: &Shared, index: u32, offset: Duration) {
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
                identity_done = true;
                if want.energy {
                    next_energy = at + sh.config.energy_interval;
                }
                record(sh, index, mono_s, cpu, &sample);
                keep(sh, index, unix_s, &sample);
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

fn record(sh: &Shared, index: u32, t: f64, cpu: Duration, s: &GpuSample) {
    update(&mut lock(&sh.stats[index as usize]), t, cpu, s);
    if let Some(w) = lock(&sh.window).as_mut() {
        if let Some(st) = w.stats.get_mut(index as usize) {
            update(st, t, cpu, s);
        }
    }
    if let Some(w) = lock(&sh.traffic).as_mut() {
        if let Some(st) = w.stats.get_mut(index as usize) {
            update(st, t, cpu, s);
        }
    }
}

/// Fold one sample into running statistics (the run's, or a window's).
fn update(st: &mut Stats, t: f64, cpu: Duration, s: &GpuSample) {
    st.samples += 1;
    st.cpu_busy += cpu;
    if st.identity.is_none() && (s.name.is_some() || s.uuid.is_some()) {
        st.identity = Some((s.uuid.clone(), s.name.clone()));
    }
    if let Some(prev) = st.last_s {
        st.max_gap_s = st.max_gap_s.max(t - prev);
    }
    st.first_s.get_or_insert(t);
    st.last_s = Some(t);
    let power = s.power_w.or(s.power_avg_w);
    if let Some(p) = power {
        st.power_samples += 1;
        st.power_sum_w += p;
        st.peak_w = Some(st.peak_w.map_or(p, |m: f64| m.max(p)));
        if let Some((t0, p0)) = st.last_power {
            st.instant_integral_j += (t - t0) * (p + p0) / 2.0;
        }
        st.last_power = Some((t, p));
    }
    if let Some(p) = s.power_avg_w {
        st.peak_avg_w = Some(st.peak_avg_w.map_or(p, |m: f64| m.max(p)));
        if let Some((t0, p0)) = st.last_avg_power {
            st.avg_integral_j += (t - t0) * (p + p0) / 2.0;
        }
        st.last_avg_power = Some((t, p));
    }
    if let Some(e) = s.energy_j {
        st.energy_reads += 1;
        st.energy_first.get_or_insert(e);
        if let Some(prev) = st.energy_prev {
            if e >= prev {
                st.energy_counted_j += e - prev;
            } else {
                // A counter that goes backwards was reset (or wrapped): count from its new value.
                st.energy_resets += 1;
                st.energy_counted_j += e;
            }
        }
        st.energy_prev = Some(e);
    }
}

/// A window's figures: per GPU from its statistics, the verdict and the trapezoid from the kept
/// rows over `unix_span`.
fn summarize_stats(sh: &Shared, all: Vec<Stats>, unix_span: (f64, f64)) -> PowerWindow {
    let verdict_from = sh
        .kept
        .iter()
        .filter_map(|k| lock(k).trimmed_from)
        .fold(None, |m: Option<f64>, t| Some(m.map_or(t, |m| m.max(t))))
        .filter(|t| *t > unix_span.0);
    let (verdict, _) = over_span(sh, (verdict_from.unwrap_or(unix_span.0), unix_span.1));
    let duration_s = unix_span.1 - unix_span.0;
    let mut gpus = Vec::new();
    for (i, st) in all.into_iter().enumerate() {
        let span = match (st.first_s, st.last_s) {
            (Some(a), Some(b)) if b > a => b - a,
            _ => 0.0,
        };
        let has_counter = st.energy_reads >= 2;
        let energy_j = if has_counter {
            Some(st.energy_counted_j)
        } else if st.power_samples >= 2 {
            Some(st.instant_integral_j)
        } else {
            None
        };
        let (uuid, name) = st.identity.clone().unwrap_or_default();
        gpus.push(GpuWindow {
            index: i as u32,
            uuid,
            name,
            samples: st.samples,
            achieved_hz: if span > 0.0 {
                (st.samples.saturating_sub(1)) as f64 / span
            } else {
                0.0
            },
            max_gap_s: (st.max_gap_s * 1000.0).round() / 1000.0,
            energy_j,
            energy_source: if has_counter {
                "counter"
            } else {
                "instant_power_integral"
            },
            energy_from_instant_power_j: st.instant_integral_j,
            energy_from_average_power_j: st.avg_integral_j,
            energy_counter_resets: st.energy_resets,
            avg_power_w: (span > 0.0)
                .then(|| energy_j.map(|e| e / span))
                .flatten()
                .or_else(|| {
                    (st.power_samples > 0).then(|| st.power_sum_w / st.power_samples as f64)
                }),
            peak_power_w: st.peak_w,
            peak_average_power_w: st.peak_avg_w,
            errors: st.errors,
            gone: st.gone.clone(),
            cpu_ms_per_sample: if st.samples > 0 {
                st.cpu_busy.as_secs_f64() * 1000.0 / st.samples as f64
            } else {
                0.0
            },
        });
    }
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

#[cfg(test)]
mod tests {
    use super::*;
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
            let mut offline =
                inferencex::verdict(&inferencex::read_csv(&csv), span, None, MAX_SAMPLE_GAP_S);
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

    #[test]
    fn csv_rows_match_nvidia_smis_layout() {
        let s = GpuSample {
            index: 3,
            power_w: Some(123.456),
            temperature_c: Some(33.0),
            sm_clock_hz: Some(1_980_000_000),
            utilization: Some(0.5),
            ..GpuSample::default()
        };
        assert_eq!(
            csv_row(1_796_210_437.105, &s),
            "2026/12/02 11:20:37.105, 3, 123.46 W, 33, 1980 MHz, [N/A], 50 %, [N/A]\n"
        );
    }
}
