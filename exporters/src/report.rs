//! The numbers a benchmark PR quotes, computed from the proxy's own measurements over a window:
//! bench_serving's result fields (`completed`, `total_token_throughput`, `median_ttft_ms`, ...)
//! and InferenceX's aggregated ones (`tput_per_gpu`, `median_ttft` in seconds, `median_intvty`).
use crate::proxy::RequestRecord;
use serde_json::{Map, Value};
use sglang_probes::sync::lock;
use std::sync::Mutex;
use std::time::SystemTime;

/// Inter-token gaps kept per window; past this, a uniform reservoir sample (memory stays bounded
/// on runs of millions of tokens; percentiles stay unbiased).
const MAX_ITL_VALUES: usize = 1 << 20;

/// The requests of one window (or of the whole run). A window counts the requests that *started*
/// inside it; its `duration` runs from the first of those requests' start to the last one's end,
/// bench_serving's benchmark duration, and every throughput divides by it. The window's own wall
/// length is `window_duration_s`.
#[derive(Debug, Default, Clone)]
pub struct LatencyWindow {
    /// When the window was opened (None: the whole run, every request counts).
    opened_unix: Option<f64>,
    closed_unix: Option<f64>,
    /// The traffic span: first counted request's start, last one's end.
    first_start: Option<f64>,
    last_end: Option<f64>,
    completed: u64,
    errors: u64,
    input_tokens: u64,
    output_tokens: u64,
    /// Completed requests whose count the server did not give: totals are then unknown.
    input_unknown: u64,
    output_unknown: u64,
    ttft: Reservoir,
    tpot: Reservoir,
    e2e: Reservoir,
    itl: Reservoir,
}

/// Per-request values kept for percentiles: every one up to `cap`, then a uniform sample of them
/// (reservoir sampling), so memory stays bounded however long the run. The mean stays exact.
#[derive(Debug, Default, Clone)]
struct Reservoir {
    kept: Vec<f64>,
    seen: u64,
    sum: f64,
    rng: u64,
}

/// Requests kept exactly per series (TTFT, TPOT, E2E): far above a benchmark point's count.
const MAX_REQUEST_VALUES: usize = 1 << 16;

impl Reservoir {
    fn push(&mut self, v: f64, cap: usize) {
        self.seen += 1;
        self.sum += v;
        if self.kept.len() < cap {
            self.kept.push(v);
            return;
        }
        // xorshift: this value takes a slot with probability cap/seen.
        if self.rng == 0 {
            self.rng = 0x9E37_79B9_7F4A_7C15;
        }
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let j = (self.rng % self.seen) as usize;
        if j < self.kept.len() {
            self.kept[j] = v;
        }
    }
}

pub(crate) fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl LatencyWindow {
    pub fn starting_now() -> Self {
        Self::opened_at(unix_now())
    }

    pub fn opened_at(unix_s: f64) -> Self {
        LatencyWindow {
            opened_unix: Some(unix_s),
            ..Default::default()
        }
    }

    pub fn close_at(&mut self, unix_s: f64) {
        self.closed_unix = Some(unix_s);
    }

    /// Count a finished request, if it started inside the window.
    pub fn record(&mut self, r: &RequestRecord) {
        if self.opened_unix.is_some_and(|o| r.start_unix < o) {
            return;
        }
        let end = r.start_unix + r.e2e_s;
        self.first_start = Some(
            self.first_start
                .map_or(r.start_unix, |s| s.min(r.start_unix)),
        );
        self.last_end = Some(self.last_end.map_or(end, |e| e.max(end)));
        if r.error.is_some() || r.status >= 400 {
            self.errors += 1;
            return;
        }
        self.completed += 1;
        match r.prompt_tokens {
            Some(n) => self.input_tokens += n,
            None => self.input_unknown += 1,
        }
        match r.completion_tokens {
            Some(n) => self.output_tokens += n,
            None => self.output_unknown += 1,
        }
        self.e2e.push(r.e2e_s, MAX_REQUEST_VALUES);
        if let Some(t) = r.ttft_s {
            self.ttft.push(t, MAX_REQUEST_VALUES);
        }
        if let Some(t) = r.tpot_s {
            self.tpot.push(t, MAX_REQUEST_VALUES);
        }
        for &g in &r.itl_s {
            self.itl.push(g, MAX_ITL_VALUES);
        }
    }

    /// The traffic span (first start, last end) of the requests counted, if any.
    pub fn traffic_span(&self) -> Option<(f64, f64)> {
        Some((self.first_start?, self.last_end?))
    }

    /// The summary, with throughput per GPU when the GPU count is known. Token totals and the
    /// throughputs built on them are absent when any completed request's count is unknown.
    pub fn summary(&self, gpus: Option<usize>) -> Value {
        let mut m = Map::new();
        m.insert("completed".into(), self.completed.into());
        m.insert("errors".into(), self.errors.into());
        if let (Some(o), Some(c)) = (self.opened_unix, self.closed_unix) {
            m.insert("window_duration_s".into(), (c - o).max(0.0).into());
        }
        let input = (self.input_unknown == 0).then_some(self.input_tokens);
        let output = (self.output_unknown == 0).then_some(self.output_tokens);
        for (k, v) in [
            ("total_input_tokens", input),
            ("total_output_tokens", output),
        ] {
            if let Some(v) = v {
                m.insert(k.into(), v.into());
            }
        }
        for (k, n) in [
            ("requests_without_prompt_tokens", self.input_unknown),
            ("requests_without_completion_tokens", self.output_unknown),
        ] {
            if n > 0 {
                m.insert(k.into(), n.into());
            }
        }
        if let Some((start, end)) = self.traffic_span() {
            let duration = end - start;
            m.insert("duration".into(), duration.into());
            m.insert("benchmark_start_time_unix".into(), start.into());
            m.insert("benchmark_end_time_unix".into(), end.into());
            if duration > 0.0 {
                let per_s = |n: u64| n as f64 / duration;
                m.insert("request_throughput".into(), per_s(self.completed).into());
                let per_gpu = gpus.filter(|g| *g > 0).map(|g| g as f64);
                let rates = [
                    ("input_throughput", "input_tput_per_gpu", input),
                    ("output_throughput", "output_tput_per_gpu", output),
                    (
                        "total_token_throughput",
                        "tput_per_gpu",
                        input.zip(output).map(|(i, o)| i + o),
                    ),
                ];
                for (name, per_gpu_name, tokens) in rates {
                    let Some(rate) = tokens.map(per_s) else {
                        continue;
                    };
                    m.insert(name.into(), rate.into());
                    if let Some(g) = per_gpu {
                        m.insert(per_gpu_name.into(), (rate / g).into());
                    }
                }
            }
        }
        for (name, values) in [
            ("ttft", &self.ttft),
            ("tpot", &self.tpot),
            ("itl", &self.itl),
            ("e2el", &self.e2e),
        ] {
            if values.kept.is_empty() {
                continue; // absent, never 0
            }
            let mut v = values.kept.clone();
            v.sort_by(f64::total_cmp);
            let mean = values.sum / values.seen as f64;
            let stats = [
                ("mean", mean),
                ("median", quantile(&v, 0.5)),
                ("p90", quantile(&v, 0.9)),
                ("p99", quantile(&v, 0.99)),
                ("p99.9", quantile(&v, 0.999)),
            ];
            for (stat, s) in stats {
                m.insert(format!("{stat}_{name}_ms"), (s * 1000.0).into());
                m.insert(format!("{stat}_{name}"), s.into());
                if name == "tpot" && s > 0.0 {
                    m.insert(format!("{stat}_intvty"), (1.0 / s).into());
                }
            }
        }
        Value::Object(m)
    }
}

/// Linear interpolation between order statistics (numpy's default, as bench_serving uses).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// The figures of the requests that started inside `[start, end]` (unix seconds), fed one at a
/// time: a benchmark's own span read back from a requests log too large to hold.
pub struct SpanSummary {
    window: LatencyWindow,
    end: f64,
}

impl SpanSummary {
    pub fn new((start, end): (f64, f64)) -> Self {
        SpanSummary {
            window: LatencyWindow::opened_at(start),
            end,
        }
    }

    pub fn add(&mut self, r: &RequestRecord) {
        if r.start_unix <= self.end {
            self.window.record(r);
        }
    }

    pub fn summary(mut self, gpus: Option<usize>) -> Value {
        self.window.close_at(self.end);
        self.window.summary(gpus)
    }
}

/// The proxy's request statistics: the whole run, and the named window in progress.
#[derive(Debug, Default)]
pub struct RequestStats {
    run: Mutex<LatencyWindow>,
    window: Mutex<Option<(String, LatencyWindow)>>,
    settle: std::sync::OnceLock<Settle>,
}

/// Waits until every request that ended by a time (unix seconds) has been recorded: the tap
/// reads its segments a few milliseconds after they pass.
pub struct Settle(pub Box<dyn Fn(f64) + Send + Sync>);

impl std::fmt::Debug for Settle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Settle")
    }
}

impl RequestStats {
    pub fn record(&self, r: &RequestRecord) {
        lock(&self.run).record(r);
        if let Some((_, w)) = lock(&self.window).as_mut() {
            w.record(r);
        }
    }

    pub fn window_start(&self, name: &str) {
        *lock(&self.window) = Some((name.to_string(), LatencyWindow::starting_now()));
    }

    /// Whoever records late (the tap) says how to wait for it; set once.
    pub fn settle_with(&self, settle: Settle) {
        let _ = self.settle.set(settle);
    }

    pub fn window_stop(&self, gpus: Option<usize>) -> Option<(String, Value)> {
        let end = unix_now();
        if let Some(Settle(wait)) = self.settle.get() {
            wait(end);
        }
        let (name, mut w) = lock(&self.window).take()?;
        w.close_at(end);
        Some((name, w.summary(gpus)))
    }

    /// The whole run so far (None before the first request).
    pub fn run_summary(&self, gpus: Option<usize>) -> Option<Value> {
        let w = lock(&self.run);
        (w.completed + w.errors > 0).then(|| w.summary(gpus))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request received at `start` (unix seconds).
    fn rec(start: f64, ttft: f64, e2e: f64, n: u64) -> RequestRecord {
        RequestRecord {
            ts: String::new(),
            start_unix: start,
            endpoint: "/generate".into(),
            status: 200,
            stream: true,
            ttft_s: Some(ttft),
            tpot_s: Some((e2e - ttft) / (n - 1) as f64),
            e2e_s: e2e,
            itl_s: vec![(e2e - ttft) / (n - 1) as f64; (n - 1) as usize],
            prompt_tokens: Some(100),
            completion_tokens: Some(n),
            error: None,
        }
    }

    #[test]
    fn summary_has_bench_serving_and_inferencex_names() {
        let mut w = LatencyWindow::opened_at(1000.0);
        for i in 1..=9 {
            w.record(&rec(1000.0 + i as f64, 0.01 * i as f64, 1.0, 11));
        }
        w.record(&RequestRecord {
            error: Some("client disconnected".into()),
            ..rec(1000.5, 0.1, 0.2, 2)
        });
        w.close_at(1030.0);
        let s = w.summary(Some(8));
        assert_eq!(s["completed"], 9);
        assert_eq!(s["errors"], 1);
        assert_eq!(s["total_output_tokens"], 99);
        assert!((s["median_ttft_ms"].as_f64().unwrap() - 50.0).abs() < 1e-9);
        assert!(
            (s["median_ttft"].as_f64().unwrap() - 0.05).abs() < 1e-12,
            "seconds, InferenceX style"
        );
        assert!(
            (s["p90_ttft_ms"].as_f64().unwrap() - 82.0).abs() < 1e-9,
            "numpy-style interpolation"
        );
        // Traffic from 1000.5 (first start) to 1010.0 (last end): 9.5 s, not the 30 s window.
        assert_eq!(s["duration"], 9.5);
        assert_eq!(s["window_duration_s"], 30.0);
        assert!((s["total_token_throughput"].as_f64().unwrap() - 999.0 / 9.5).abs() < 1e-9);
        assert!((s["tput_per_gpu"].as_f64().unwrap() - 999.0 / 9.5 / 8.0).abs() < 1e-9);
        assert!(s["median_intvty"].as_f64().unwrap() > 0.0);
        assert!(
            LatencyWindow::default()
                .summary(None)
                .get("median_ttft_ms")
                .is_none(),
            "absent, never 0"
        );
    }

    #[test]
    fn a_window_counts_only_the_requests_that_started_inside_it() {
        let mut w = LatencyWindow::opened_at(100.0);
        w.record(&rec(99.0, 0.1, 5.0, 11)); // started before, ended inside: not this window's
        w.record(&rec(101.0, 0.1, 2.0, 11));
        w.record(&rec(102.0, 0.1, 2.0, 11));
        let s = w.summary(None);
        assert_eq!(s["completed"], 2);
        assert_eq!(s["benchmark_start_time_unix"], 101.0);
        assert_eq!(s["benchmark_end_time_unix"], 104.0);
        assert_eq!(s["duration"], 3.0);
        assert_eq!(s["output_throughput"], 22.0 / 3.0);
    }

    #[test]
    fn unknown_token_counts_make_totals_absent_never_zero() {
        let mut w = LatencyWindow::opened_at(0.0);
        w.record(&rec(1.0, 0.1, 1.0, 11));
        w.record(&RequestRecord {
            prompt_tokens: None,
            ..rec(1.5, 0.1, 1.0, 11)
        });
        let s = w.summary(Some(1));
        assert_eq!(s["total_output_tokens"], 22);
        assert!(s.get("total_input_tokens").is_none(), "{s}");
        assert!(s.get("total_token_throughput").is_none(), "{s}");
        assert!(s.get("tput_per_gpu").is_none(), "{s}");
        assert_eq!(s["requests_without_prompt_tokens"], 1);
        assert!(s["output_tput_per_gpu"].as_f64().unwrap() > 0.0);
    }

    #[test]
    fn a_span_read_back_from_a_requests_log_selects_by_start() {
        let recs = [
            rec(9.0, 0.1, 1.0, 3),
            rec(10.0, 0.1, 1.0, 3),
            rec(12.0, 0.1, 3.0, 3),
        ];
        let mut span = SpanSummary::new((10.0, 12.0));
        recs.iter().for_each(|r| span.add(r));
        let s = span.summary(None);
        assert_eq!(s["completed"], 2);
        assert_eq!(s["duration"], 5.0);
        assert_eq!(s["window_duration_s"], 2.0);
    }

    #[test]
    fn memory_is_bounded_and_the_mean_exact_past_the_cap() {
        let mut r = Reservoir::default();
        let n = 4 * MAX_REQUEST_VALUES as u64;
        for i in 0..n {
            r.push(i as f64, MAX_REQUEST_VALUES);
        }
        assert_eq!(r.kept.len(), MAX_REQUEST_VALUES);
        assert_eq!(r.sum / r.seen as f64, (n - 1) as f64 / 2.0);
        // A uniform sample of 0..n: its median is near n/2.
        let mut v = r.kept.clone();
        v.sort_by(f64::total_cmp);
        let med = quantile(&v, 0.5) / n as f64;
        assert!((med - 0.5).abs() < 0.02, "{med}");
    }
}
