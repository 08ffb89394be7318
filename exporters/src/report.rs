//! The numbers a benchmark PR quotes, computed from the proxy's own measurements over a window:
//! bench_serving's result fields (`completed`, `total_token_throughput`, `median_ttft_ms`, ...)
//! and InferenceX's aggregated ones (`tput_per_gpu`, `median_ttft` in seconds, `median_intvty`).
use crate::proxy::RequestRecord;
use serde_json::{Map, Value};
use std::sync::Mutex;
use std::time::SystemTime;

/// Inter-token gaps kept per window; past this, a uniform reservoir sample (memory stays bounded
/// on runs of millions of tokens; percentiles stay unbiased).
const MAX_ITL_VALUES: usize = 1 << 20;

#[derive(Debug, Default, Clone)]
pub struct LatencyWindow {
    start_unix: Option<f64>,
    end_unix: Option<f64>,
    completed: u64,
    errors: u64,
    input_tokens: u64,
    output_tokens: u64,
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

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl LatencyWindow {
    pub fn starting_now() -> Self {
        LatencyWindow {
            start_unix: Some(unix_now()),
            ..Default::default()
        }
    }

    pub fn record(&mut self, r: &RequestRecord) {
        let now = unix_now();
        self.start_unix.get_or_insert(now - r.e2e_s);
        self.end_unix = Some(now);
        if r.error.is_some() || r.status >= 400 {
            self.errors += 1;
            return;
        }
        self.completed += 1;
        self.input_tokens += r.prompt_tokens.unwrap_or(0);
        self.output_tokens += r.completion_tokens.unwrap_or(0);
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

    /// The summary, with throughput per GPU when the GPU count is known.
    pub fn summary(&self, gpus: Option<usize>) -> Value {
        let mut m = Map::new();
        let start = self.start_unix.unwrap_or_else(unix_now);
        let end = self.end_unix.unwrap_or_else(unix_now).max(start);
        let duration = end - start;
        m.insert("completed".into(), self.completed.into());
        m.insert("errors".into(), self.errors.into());
        m.insert("duration".into(), duration.into());
        m.insert("benchmark_start_time_unix".into(), start.into());
        m.insert("benchmark_end_time_unix".into(), end.into());
        m.insert("total_input_tokens".into(), self.input_tokens.into());
        m.insert("total_output_tokens".into(), self.output_tokens.into());
        if duration > 0.0 {
            let out = self.output_tokens as f64 / duration;
            let total = (self.input_tokens + self.output_tokens) as f64 / duration;
            let input = self.input_tokens as f64 / duration;
            m.insert(
                "request_throughput".into(),
                (self.completed as f64 / duration).into(),
            );
            m.insert("output_throughput".into(), out.into());
            m.insert("total_token_throughput".into(), total.into());
            if let Some(g) = gpus.filter(|g| *g > 0) {
                m.insert("tput_per_gpu".into(), (total / g as f64).into());
                m.insert("output_tput_per_gpu".into(), (out / g as f64).into());
                m.insert("input_tput_per_gpu".into(), (input / g as f64).into());
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

/// The proxy's request statistics: the whole run, and the named window in progress.
#[derive(Debug, Default)]
pub struct RequestStats {
    run: Mutex<LatencyWindow>,
    window: Mutex<Option<(String, LatencyWindow)>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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

    pub fn window_stop(&self, gpus: Option<usize>) -> Option<(String, Value)> {
        let (name, mut w) = lock(&self.window).take()?;
        w.end_unix = Some(unix_now());
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

    fn rec(ttft: f64, e2e: f64, n: u64) -> RequestRecord {
        RequestRecord {
            ts: String::new(),
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
        let mut w = LatencyWindow::starting_now();
        for i in 1..=9 {
            w.record(&rec(0.01 * i as f64, 1.0, 11));
        }
        w.record(&RequestRecord {
            error: Some("client disconnected".into()),
            ..rec(0.1, 0.2, 2)
        });
        w.end_unix = w.start_unix.map(|s| s + 10.0);
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
        assert!((s["total_token_throughput"].as_f64().unwrap() - 99.9).abs() < 1e-6);
        assert!((s["tput_per_gpu"].as_f64().unwrap() - 99.9 / 8.0).abs() < 1e-6);
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
