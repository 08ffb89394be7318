//! Per-request measurement: the timing of the frames and events that pass, turned into one
//! [`RequestRecord`] when the response ends, with bench_serving's definitions (DESIGN.md,
//! Definitions). State stays local to the request; the shared histograms, counters and windows
//! are touched once, at the end.
use super::body_counts::BodyCounts;
use super::spin::Held;
use super::sse::{Api, EventInfo};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::time::Instant;

/// Latency bucket edges, 1 ms to 60 s at ten per decade (1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8):
/// an H200's TTFT (tens of ms) and ITL (a few ms) fall across many buckets, so quantiles from
/// them are within about 12 % instead of bucket artefacts. Same names as SGLang's series.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.00125, 0.0015, 0.002, 0.0025, 0.003, 0.004, 0.005, 0.006, 0.008, 0.01, 0.0125, 0.015,
    0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6,
    0.8, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.5, 15.0, 20.0, 25.0, 30.0,
    40.0, 50.0, 60.0,
];
/// End-to-end requests run longer: the latency edges, then SGLang's long tail up to 40 minutes.
pub const E2E_BUCKETS: &[f64] = &[
    0.001, 0.00125, 0.0015, 0.002, 0.0025, 0.003, 0.004, 0.005, 0.006, 0.008, 0.01, 0.0125, 0.015,
    0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6,
    0.8, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.5, 15.0, 20.0, 25.0, 30.0,
    40.0, 50.0, 60.0, 80.0, 100.0, 200.0, 400.0, 600.0, 1200.0, 1800.0, 2400.0,
];
/// Inter-token gaps kept per request for the requests log.
const MAX_ITL_KEPT: usize = 65_536;
/// Prompts of a batch `/generate` stream followed one by one (past it, counts are unknown).
const MAX_BATCH: usize = 65_536;

/// One prompt of a batch `/generate` stream: its latest counts, and the count at its last output.
#[derive(Clone, Copy, Default)]
struct BatchItem {
    completion: Option<u64>,
    prompt: Option<u64>,
    at_last_output: u64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReqLabels {
    pub endpoint: String,
    pub status: String,
}

/// The proxy's series, registered in the supervisor's registry.
#[derive(Clone, Debug)]
pub struct ProxyMetrics {
    pub ttft: Family<ReqLabels, Histogram>,
    pub itl: Family<ReqLabels, Histogram>,
    pub tpot: Family<ReqLabels, Histogram>,
    pub e2e: Family<ReqLabels, Histogram>,
    pub prompt_tokens: Family<ReqLabels, Counter>,
    pub completion_tokens: Family<ReqLabels, Counter>,
    pub requests: Family<ReqLabels, Counter>,
    /// A measured request came through the proxy naming a client of its own with a port
    /// (X-Forwarded-For, Forwarded): a server that trusts the header logs that client, not the
    /// proxy, so the clients in its access log no longer tell a proxied request from one that
    /// went around the proxy.
    pub forwarded_client: Arc<std::sync::atomic::AtomicBool>,
}

impl ProxyMetrics {
    pub fn register(registry: &mut Registry) -> Arc<ProxyMetrics> {
        let latency = || Histogram::new(LATENCY_BUCKETS.iter().copied());
        let m = ProxyMetrics {
            ttft: Family::new_with_constructor(latency),
            itl: Family::new_with_constructor(latency),
            tpot: Family::new_with_constructor(latency),
            e2e: Family::new_with_constructor(|| Histogram::new(E2E_BUCKETS.iter().copied())),
            prompt_tokens: Family::default(),
            completion_tokens: Family::default(),
            requests: Family::default(),
            forwarded_client: Default::default(),
        };
        let r = registry;
        let ttft_help = "Time to first token, measured by the proxy";
        r.register("request_ttft_seconds", ttft_help, m.ttft.clone());
        let itl_help = "Inter-token latency as bench_serving records it";
        r.register("request_inter_token_seconds", itl_help, m.itl.clone());
        let tpot_help = "Time per output token after the first";
        r.register("request_tpot_seconds", tpot_help, m.tpot.clone());
        r.register(
            "request_e2e_seconds",
            "End-to-end request latency",
            m.e2e.clone(),
        );
        let prompt_help = "Prompt tokens reported by the server";
        r.register(
            "request_prompt_tokens",
            prompt_help,
            m.prompt_tokens.clone(),
        );
        let completion_help = "Completion tokens reported by the server";
        r.register(
            "request_completion_tokens",
            completion_help,
            m.completion_tokens.clone(),
        );
        r.register("requests", "Requests through the proxy", m.requests.clone());
        Arc::new(m)
    }

    /// One finished request into the series: the only time a request touches shared state here.
    /// A request that failed after the server answered is `aborted`; one the proxy answered
    /// itself keeps its status (502).
    pub(super) fn observe(&self, r: &RequestRecord) {
        let labels = ReqLabels {
            endpoint: r.endpoint.clone(),
            status: if r.error.is_some() && r.status < 400 {
                "aborted".into()
            } else {
                r.status.to_string()
            },
        };
        self.requests.get_or_create(&labels).inc();
        if r.error.is_some() {
            return;
        }
        self.e2e.get_or_create(&labels).observe(r.e2e_s);
        if let Some(t) = r.ttft_s {
            self.ttft.get_or_create(&labels).observe(t);
        }
        if let Some(t) = r.tpot_s {
            self.tpot.get_or_create(&labels).observe(t);
        }
        if !r.itl_s.is_empty() {
            let h = self.itl.get_or_create(&labels);
            for g in &r.itl_s {
                h.observe(*g);
            }
        }
        if let Some(n) = r.prompt_tokens {
            self.prompt_tokens.get_or_create(&labels).inc_by(n);
        }
        if let Some(n) = r.completion_tokens {
            self.completion_tokens.get_or_create(&labels).inc_by(n);
        }
    }
}

/// One completed request, as the requests log and the report see it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RequestRecord {
    /// When the request completed (RFC 3339).
    pub ts: String,
    /// When the proxy received it (unix seconds): with `e2e_s`, the request's span.
    pub start_unix: f64,
    pub endpoint: String,
    pub status: u16,
    pub stream: bool,
    /// Absent where it does not apply (not streamed, fewer than two tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpot_s: Option<f64>,
    pub e2e_s: f64,
    #[serde(default)]
    pub itl_s: Vec<f64>,
    /// The server's own counts; null when it did not give them (never guessed, never 0).
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The error of a request whose client left while its answer streamed (the proxy: the body was
/// dropped; the tap: the client's FIN or RST).
pub const CLIENT_LEFT: &str = "client disconnected";
/// The error of a request whose client left before its answer began (status 499).
pub const CLIENT_LEFT_EARLY: &str = "client disconnected before the response";

/// Where a finished request goes: the series, the windows, the requests log.
pub trait Sink: Send + Sync {
    fn finished(&self, r: RequestRecord);
}

/// Follows one measured response as its frames pass.
pub struct Recorder {
    sink: Arc<dyn Sink>,
    metrics: Arc<ProxyMetrics>,
    endpoint: &'static str,
    api: Api,
    status: u16,
    stream: bool,
    sent: Instant,
    sent_unix: f64,
    first_output: Option<Instant>,
    last_output: Option<Instant>,
    last_frame: Option<Instant>,
    /// The server's completion count at the last output event (bench_serving's ITL split).
    tokens_at_last_output: u64,
    completion_tokens: Option<u64>,
    prompt_tokens: Option<u64>,
    server_error: bool,
    /// A batch `/generate` stream's prompts (events with `index`): the counts are their sums.
    batch: Vec<BatchItem>,
    batch_overflow: bool,
    itl: Vec<f64>,
    /// A non-streamed answer's counts, read as its bytes pass.
    body: BodyCounts,
    /// Keeps the shard spinning until the request is recorded (`spin`).
    _in_flight: Held,
}

pub struct Started {
    pub endpoint: &'static str,
    pub api: Api,
    pub sent: Instant,
    pub sent_unix: f64,
    pub in_flight: Held,
}

impl Recorder {
    pub fn new(
        sink: Arc<dyn Sink>,
        metrics: Arc<ProxyMetrics>,
        started: Started,
        status: u16,
        stream: bool,
    ) -> Self {
        Recorder {
            sink,
            metrics,
            endpoint: started.endpoint,
            api: started.api,
            status,
            stream,
            sent: started.sent,
            sent_unix: started.sent_unix,
            first_output: None,
            last_output: None,
            last_frame: None,
            tokens_at_last_output: 0,
            completion_tokens: None,
            prompt_tokens: None,
            server_error: false,
            batch: Vec::new(),
            batch_overflow: false,
            itl: Vec::new(),
            body: BodyCounts::default(),
            _in_flight: started.in_flight,
        }
    }

    pub fn api(&self) -> Api {
        self.api
    }

    /// A frame arrived at `now` (streams: its events follow through [`Recorder::on_event`]).
    pub fn on_frame(&mut self, data: &[u8], now: Instant) {
        self.last_frame = Some(now);
        if !self.stream {
            self.body.feed(data);
        }
    }

    /// One SSE event, received at `now`: bench_serving's TTFT and ITL, the server's counts.
    pub fn on_event(&mut self, e: EventInfo, now: Instant) {
        self.server_error |= e.error;
        if e.prompt_tokens.is_some() {
            self.prompt_tokens = e.prompt_tokens;
        }
        if e.completion_tokens.is_some() {
            self.completion_tokens = e.completion_tokens;
        }
        let item = match e.index.map(|i| i as usize) {
            Some(i) if i < MAX_BATCH => {
                if self.batch.len() <= i {
                    self.batch.resize(i + 1, BatchItem::default());
                }
                let item = &mut self.batch[i];
                item.completion = e.completion_tokens.or(item.completion);
                item.prompt = e.prompt_tokens.or(item.prompt);
                Some(i)
            }
            Some(_) => {
                self.batch_overflow = true;
                None
            }
            None => None,
        };
        if !e.output {
            return;
        }
        let at_last = match item {
            Some(i) => &mut self.batch[i].at_last_output,
            None => &mut self.tokens_at_last_output,
        };
        let Some(prev) = self.last_output else {
            self.first_output = Some(now);
            self.last_output = Some(now);
            *at_last = e.completion_tokens.unwrap_or(1);
            return;
        };
        let gap = now.duration_since(prev).as_secs_f64();
        match (self.api, e.completion_tokens) {
            // Native: the gap split over the new tokens, once per token; no new token, no gap.
            (Api::Generate, Some(n)) => {
                let new = n.saturating_sub(*at_last);
                if new == 0 {
                    return;
                }
                *at_last = n;
                let each = gap / new as f64;
                let room = MAX_ITL_KEPT.saturating_sub(self.itl.len());
                self.itl
                    .extend(std::iter::repeat_n(each, (new as usize).min(room)));
            }
            // OpenAI: the raw gap between chunks carrying output.
            _ => {
                if self.itl.len() < MAX_ITL_KEPT {
                    self.itl.push(gap);
                }
            }
        }
        self.last_output = Some(now);
    }

    /// The response ended (`error`: how it did not end well).
    pub fn finish(self, error: Option<String>) {
        self.finish_at(error, Instant::now());
    }

    /// The response ended at `end` unless a frame came later (the tap: a segment's own time).
    pub fn finish_at(mut self, error: Option<String>, end: Instant) {
        let end = self.last_frame.unwrap_or(end);
        let e2e = end.duration_since(self.sent).as_secs_f64();
        if !self.stream {
            (self.completion_tokens, self.prompt_tokens) = std::mem::take(&mut self.body).finish();
        }
        if self.batch_overflow {
            (self.completion_tokens, self.prompt_tokens) = (None, None);
        } else if !self.batch.is_empty() {
            // Prompts never answered (no event) leave the sum unknown, like a missing count.
            self.completion_tokens = self.batch.iter().map(|b| b.completion).sum();
            self.prompt_tokens = self.batch.iter().map(|b| b.prompt).sum();
        }
        let ttft = self
            .first_output
            .map(|t| t.duration_since(self.sent).as_secs_f64());
        let tpot = match (ttft, self.completion_tokens) {
            (Some(t), Some(n)) if n > 1 => Some((e2e - t) / (n - 1) as f64),
            _ => None,
        };
        let error = error.or_else(|| {
            self.server_error
                .then(|| "the server reported an error in the stream".to_string())
        });
        let rec = RequestRecord {
            ts: humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string(),
            start_unix: self.sent_unix,
            endpoint: self.endpoint.into(),
            status: self.status,
            stream: self.stream,
            ttft_s: ttft,
            tpot_s: tpot,
            e2e_s: e2e,
            itl_s: std::mem::take(&mut self.itl),
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.completion_tokens,
            error,
        };
        self.metrics.observe(&rec);
        self.sink.finished(rec);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    struct Collect(Mutex<Vec<RequestRecord>>);
    impl Sink for Collect {
        fn finished(&self, r: RequestRecord) {
            self.0.lock().unwrap().push(r);
        }
    }

    #[test]
    fn a_batch_generate_stream_counts_every_prompt() {
        let sink = Arc::new(Collect(Mutex::new(Vec::new())));
        let metrics = ProxyMetrics::register(&mut Registry::default());
        let t0 = Instant::now();
        let started = Started {
            endpoint: "/generate",
            api: Api::Generate,
            sent: t0,
            sent_unix: 0.0,
            in_flight: Held::enter(),
        };
        let mut r = Recorder::new(sink.clone(), metrics, started, 200, true);
        // Two prompts (4 and 6 prompt tokens), 3 tokens each, their events interleaved.
        for (k, (i, p)) in [(0, 4), (1, 6), (0, 4), (1, 6), (0, 4), (1, 6)]
            .iter()
            .enumerate()
        {
            let n = k / 2 + 1;
            let e = format!(
                r#"data: {{"text":"t{n}","meta_info":{{"prompt_tokens":{p},"completion_tokens":{n}}},"index":{i}}}"#
            );
            let at = t0 + std::time::Duration::from_millis(10 * (k as u64 + 1));
            r.on_event(
                super::super::sse::scan_event(Api::Generate, e.as_bytes()),
                at,
            );
        }
        r.finish(None);
        let rec = sink.0.lock().unwrap().pop().unwrap();
        assert_eq!(rec.completion_tokens, Some(6));
        assert_eq!(rec.prompt_tokens, Some(10));
        // One gap per token after the first: each prompt's new tokens, not lost to the other's.
        assert_eq!(rec.itl_s.len(), 5, "{:?}", rec.itl_s);
    }

    #[test]
    fn latency_edges_resolve_one_millisecond_to_a_minute_at_ten_per_decade() {
        for edges in [LATENCY_BUCKETS, E2E_BUCKETS] {
            assert!(edges.windows(2).all(|w| w[0] < w[1]), "increasing");
            assert_eq!(edges[0], 0.001);
            for w in edges.windows(2).filter(|w| w[1] <= 60.0) {
                assert!(w[1] / w[0] <= 1.34, "{} -> {}: too coarse", w[0], w[1]);
            }
        }
        assert_eq!(LATENCY_BUCKETS.last(), Some(&60.0));
        assert_eq!(E2E_BUCKETS.last(), Some(&2400.0));
        // The H200's median TTFT (63 ms) and its ITL (a few ms) land between close edges.
        for v in [0.063, 0.004, 0.0125] {
            let i = LATENCY_BUCKETS.iter().position(|e| *e >= v).unwrap();
            assert!(i > 0 && LATENCY_BUCKETS[i] / LATENCY_BUCKETS[i - 1] <= 1.34);
        }
    }
}
