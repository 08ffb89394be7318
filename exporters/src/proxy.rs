//! A streaming-transparent reverse proxy in front of the server that measures each generation
//! request itself, whatever the benchmark client: TTFT, inter-token latency, TPOT and E2E with
//! bench_serving's definitions (DESIGN.md, Definitions).
//!
//! Every response frame is forwarded the moment it arrives (no buffering; hyper's backpressure
//! holds the upstream read while the client is slow). Measurement happens on the frame as it
//! passes: the SSE events of `/generate`, `/v1/completions` and `/v1/chat/completions` are parsed
//! incrementally for the token counts SGLang reports (`meta_info.completion_tokens`, `usage`).
//! A client that goes away drops the response body, which closes the upstream request.
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Body, Bytes, Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use serde_json::Value;
use std::io::Write;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Instant, SystemTime};

/// SGLang's own bucket edges (reference/sglang.md §3), so the two sets of histograms compare.
pub const TTFT_BUCKETS: &[f64] = &[
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
    400.0,
];
/// TTFT's edges plus 600, 1200, 1800, 2400 (SGLang's e2e histogram).
pub const E2E_BUCKETS: &[f64] = &[
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
    400.0, 600.0, 1200.0, 1800.0, 2400.0,
];
pub const ITL_BUCKETS: &[f64] = &[
    0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2,
    0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0,
];
/// Largest non-streamed body kept for its token counts (it is forwarded whole regardless).
const MAX_BODY_KEPT: usize = 8 << 20;
/// Largest single SSE event kept while it is incomplete.
const MAX_EVENT: usize = 4 << 20;
/// Inter-token gaps kept per request for the requests log.
const MAX_ITL_KEPT: usize = 65_536;

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("cannot listen on {addr} for the proxy: {source} (pass another --proxy-addr)")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
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
}

impl ProxyMetrics {
    pub fn register(registry: &mut Registry) -> Arc<ProxyMetrics> {
        let m = ProxyMetrics {
            ttft: Family::new_with_constructor(|| Histogram::new(TTFT_BUCKETS.iter().copied())),
            itl: Family::new_with_constructor(|| Histogram::new(ITL_BUCKETS.iter().copied())),
            tpot: Family::new_with_constructor(|| Histogram::new(ITL_BUCKETS.iter().copied())),
            e2e: Family::new_with_constructor(|| Histogram::new(E2E_BUCKETS.iter().copied())),
            prompt_tokens: Family::default(),
            completion_tokens: Family::default(),
            requests: Family::default(),
        };
        registry.register(
            "request_ttft_seconds",
            "Time to first token, measured by the proxy",
            m.ttft.clone(),
        );
        registry.register(
            "request_inter_token_seconds",
            "Inter-token latency (chunk gap / tokens in the chunk)",
            m.itl.clone(),
        );
        registry.register(
            "request_tpot_seconds",
            "Time per output token after the first",
            m.tpot.clone(),
        );
        registry.register(
            "request_e2e_seconds",
            "End-to-end request latency",
            m.e2e.clone(),
        );
        registry.register(
            "request_prompt_tokens",
            "Prompt tokens reported by the server",
            m.prompt_tokens.clone(),
        );
        registry.register(
            "request_completion_tokens",
            "Completion tokens reported by the server",
            m.completion_tokens.clone(),
        );
        registry.register("requests", "Requests through the proxy", m.requests.clone());
        Arc::new(m)
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tpot_s: Option<f64>,
    pub e2e_s: f64,
    #[serde(default)]
    pub itl_s: Vec<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

pub struct Proxy {
    upstream: Uri,
    client: Client<HttpConnector, Incoming>,
    metrics: Arc<ProxyMetrics>,
    stats: Arc<crate::report::RequestStats>,
    log: Option<Mutex<std::fs::File>>,
    /// Measured requests in flight, and where busy/idle transitions go (`--window-from-proxy`).
    in_flight: std::sync::atomic::AtomicUsize,
    traffic: Option<Mutex<std::sync::mpsc::Sender<bool>>>,
}

/// Bind now, serve in the background; `upstream` like `http://127.0.0.1:30000`.
pub async fn start(
    addr: &str,
    upstream: &str,
    metrics: Arc<ProxyMetrics>,
    stats: Arc<crate::report::RequestStats>,
    requests_log: Option<std::fs::File>,
    traffic_window: Option<sglang_probes::sampler::SamplerHandle>,
) -> Result<SocketAddr, ProxyError> {
    let (listener, local) = crate::server::bind(addr)
        .await
        .map_err(|source| ProxyError::Bind {
            addr: addr.to_string(),
            source,
        })?;
    let upstream: Uri = upstream.parse().map_err(|e| ProxyError::Bind {
        addr: upstream.to_string(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("bad upstream URL: {e}"),
        ),
    })?;
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1024)
        .build(connector);
    // Busy/idle transitions are handled in order on one thread: each reads energy counters
    // (milliseconds per GPU), which must never delay a request.
    let traffic = traffic_window.and_then(|sampler| {
        let (tx, rx) = std::sync::mpsc::channel::<bool>();
        std::thread::Builder::new()
            .name("traffic-window".into())
            .spawn(move || {
                for busy in rx {
                    if busy {
                        sampler.traffic_busy();
                    } else {
                        sampler.traffic_idle();
                    }
                }
            })
            .ok()
            .map(|_| Mutex::new(tx))
    });
    let proxy = Arc::new(Proxy {
        upstream,
        client,
        metrics,
        stats,
        log: requests_log.map(Mutex::new),
        in_flight: std::sync::atomic::AtomicUsize::new(0),
        traffic,
    });
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let p = proxy.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| p.clone().forward(req));
                if let Err(e) = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await
                {
                    tracing::debug!("proxy connection: {e}");
                }
            });
        }
    });
    Ok(local)
}

type ProxyBody = BoxBody<Bytes, hyper::Error>;

/// Hop-by-hop headers (RFC 9110 §7.6.1) are the proxy's own business on each side.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "transfer-encoding",
];

fn measured_endpoint(path: &str) -> Option<&'static str> {
    match path {
        "/generate" => Some("/generate"),
        "/v1/completions" => Some("/v1/completions"),
        "/v1/chat/completions" => Some("/v1/chat/completions"),
        _ => None,
    }
}

impl Proxy {
    async fn forward(
        self: Arc<Self>,
        req: Request<Incoming>,
    ) -> Result<Response<ProxyBody>, hyper::Error> {
        let sent = Instant::now();
        let endpoint = measured_endpoint(req.uri().path());
        if endpoint.is_some() {
            self.enter();
        }
        let (mut parts, body) = req.into_parts();
        let path_q = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        let mut uri = self.upstream.clone().into_parts();
        uri.path_and_query = path_q.parse().ok();
        parts.uri = match Uri::from_parts(uri) {
            Ok(u) => u,
            Err(e) => {
                return Ok(self.error_response(
                    endpoint,
                    sent,
                    format!("bad request path {path_q:?}: {e}"),
                ))
            }
        };
        for h in HOP_BY_HOP {
            parts.headers.remove(*h);
        }
        if let Some(auth) = self.upstream.authority() {
            if let Ok(v) = hyper::header::HeaderValue::from_str(auth.as_str()) {
                parts.headers.insert(hyper::header::HOST, v);
            }
        }
        match self.client.request(Request::from_parts(parts, body)).await {
            Ok(resp) => {
                let (mut parts, body) = resp.into_parts();
                for h in HOP_BY_HOP {
                    parts.headers.remove(*h);
                }
                let Some(endpoint) = endpoint else {
                    return Ok(Response::from_parts(parts, body.boxed()));
                };
                let stream = parts
                    .headers
                    .get(hyper::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.starts_with("text/event-stream"));
                let rec =
                    Recorder::new(self.clone(), endpoint, parts.status.as_u16(), stream, sent);
                Ok(Response::from_parts(
                    parts,
                    Measured {
                        inner: body,
                        rec: Some(rec),
                    }
                    .boxed(),
                ))
            }
            Err(e) => {
                Ok(self.error_response(endpoint, sent, format!("upstream {}: {e}", self.upstream)))
            }
        }
    }

    fn enter(&self) {
        if self
            .in_flight
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            == 0
        {
            self.signal_traffic(true);
        }
    }

    fn leave(&self) {
        if self
            .in_flight
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst)
            == 1
        {
            self.signal_traffic(false);
        }
    }

    fn signal_traffic(&self, busy: bool) {
        if let Some(tx) = &self.traffic {
            let _ = tx.lock().unwrap_or_else(|p| p.into_inner()).send(busy);
        }
    }

    /// The upstream failed: a clear 502 for the client, counted, and the proxy carries on.
    fn error_response(
        &self,
        endpoint: Option<&'static str>,
        sent: Instant,
        why: String,
    ) -> Response<ProxyBody> {
        tracing::warn!("proxy: {why}");
        let e2e = sent.elapsed().as_secs_f64();
        let label = ReqLabels {
            endpoint: endpoint.unwrap_or("other").into(),
            status: "502".into(),
        };
        self.metrics.requests.get_or_create(&label).inc();
        if let Some(ep) = endpoint {
            self.leave();
            self.log(&RequestRecord {
                ts: now_rfc3339(),
                start_unix: crate::report::unix_now() - e2e,
                endpoint: ep.into(),
                status: 502,
                stream: false,
                ttft_s: None,
                tpot_s: None,
                e2e_s: e2e,
                itl_s: Vec::new(),
                prompt_tokens: None,
                completion_tokens: None,
                error: Some(why.clone()),
            });
        }
        let body =
            serde_json::json!({"error": {"message": why, "type": "bad_gateway", "code": 502}})
                .to_string();
        let mut r = Response::new(
            Full::new(Bytes::from(body))
                .map_err(|never| match never {})
                .boxed(),
        );
        *r.status_mut() = StatusCode::BAD_GATEWAY;
        r.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/json"),
        );
        r
    }

    /// Count a finished request in the report windows and write its requests-log line.
    fn log(&self, r: &RequestRecord) {
        self.stats.record(r);
        let Some(f) = &self.log else { return };
        let Ok(mut line) = serde_json::to_vec(r) else {
            return;
        };
        line.push(b'\n');
        let mut f = f.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = f.write_all(&line) {
            tracing::error!("writing the requests log: {e}");
        }
    }
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_micros(SystemTime::now()).to_string()
}

/// Follows one measured response as its frames pass.
struct Recorder {
    proxy: Arc<Proxy>,
    endpoint: &'static str,
    status: u16,
    stream: bool,
    sent: Instant,
    sse: SseTokens,
    first_token: Option<Instant>,
    last_chunk: Option<Instant>,
    last_token_at: Option<Instant>,
    itl: Vec<f64>,
    body: Vec<u8>,
    body_truncated: bool,
}

impl Recorder {
    fn new(
        proxy: Arc<Proxy>,
        endpoint: &'static str,
        status: u16,
        stream: bool,
        sent: Instant,
    ) -> Self {
        Recorder {
            proxy,
            endpoint,
            status,
            stream,
            sent,
            sse: SseTokens::default(),
            first_token: None,
            last_chunk: None,
            last_token_at: None,
            itl: Vec::new(),
            body: Vec::new(),
            body_truncated: false,
        }
    }

    fn on_data(&mut self, data: &[u8]) {
        let now = Instant::now();
        if !self.stream {
            let room = MAX_BODY_KEPT.saturating_sub(self.body.len());
            self.body_truncated |= data.len() > room;
            self.body.extend_from_slice(&data[..data.len().min(room)]);
            self.last_chunk = Some(now);
            return;
        }
        let Recorder {
            sse,
            first_token,
            last_chunk,
            last_token_at,
            itl,
            ..
        } = self;
        sse.feed(data, |tokens| {
            *last_chunk = Some(now);
            if first_token.is_none() {
                *first_token = Some(now);
            } else if let Some(prev) = *last_token_at {
                // bench_serving: the chunk gap divided by the tokens it carries, once per token.
                let gap = now.duration_since(prev).as_secs_f64() / tokens as f64;
                for _ in 0..tokens {
                    if itl.len() < MAX_ITL_KEPT {
                        itl.push(gap);
                    }
                }
            }
            *last_token_at = Some(now);
        });
    }

    fn finish(mut self, error: Option<String>) {
        let end = self.last_chunk.unwrap_or_else(Instant::now);
        let e2e = end.duration_since(self.sent).as_secs_f64();
        if !self.stream && !self.body.is_empty() && !self.body_truncated {
            if let Ok(v) = serde_json::from_slice::<Value>(&self.body) {
                // /generate answers a batch of prompts with a list: the counts add up.
                let items: Vec<&Value> = v
                    .as_array()
                    .map_or_else(|| vec![&v], |a| a.iter().collect());
                let add =
                    |acc: Option<u64>, n: Option<u64>| n.map(|n| acc.unwrap_or(0) + n).or(acc);
                self.sse.completion_tokens = items
                    .iter()
                    .fold(None, |acc, it| add(acc, completion_of(it)));
                self.sse.prompt_tokens = items.iter().fold(None, |acc, it| add(acc, prompt_of(it)));
            }
        }
        // Streams report their counts cumulatively; the last one is the total.
        let completion = self.sse.completion();
        let ttft = if self.stream {
            self.first_token
                .map(|t| t.duration_since(self.sent).as_secs_f64())
        } else {
            None
        };
        let tpot = match (ttft, completion) {
            (Some(t), Some(n)) if n > 1 => Some((e2e - t) / (n - 1) as f64),
            _ => None,
        };
        let status = if error.is_some() {
            "aborted".to_string()
        } else {
            self.status.to_string()
        };
        let labels = ReqLabels {
            endpoint: self.endpoint.into(),
            status,
        };
        let m = &self.proxy.metrics;
        m.requests.get_or_create(&labels).inc();
        if error.is_none() {
            m.e2e.get_or_create(&labels).observe(e2e);
            if let Some(t) = ttft {
                m.ttft.get_or_create(&labels).observe(t);
            }
            if let Some(t) = tpot {
                m.tpot.get_or_create(&labels).observe(t);
            }
            let h = m.itl.get_or_create(&labels);
            for g in &self.itl {
                h.observe(*g);
            }
            if let Some(n) = self.sse.prompt_tokens {
                m.prompt_tokens.get_or_create(&labels).inc_by(n);
            }
            if let Some(n) = completion {
                m.completion_tokens.get_or_create(&labels).inc_by(n);
            }
        }
        let rec = RequestRecord {
            ts: now_rfc3339(),
            start_unix: crate::report::unix_now() - e2e,
            endpoint: self.endpoint.into(),
            status: self.status,
            stream: self.stream,
            ttft_s: ttft,
            tpot_s: tpot,
            e2e_s: e2e,
            itl_s: std::mem::take(&mut self.itl),
            prompt_tokens: self.sse.prompt_tokens,
            completion_tokens: completion,
            error,
        };
        self.proxy.log(&rec);
        self.proxy.leave();
    }
}

/// The token accounting of a streamed (SSE) response, fed its bytes as they arrive, in pieces of
/// any size: events end at a blank line; each `data:` JSON chunk that carries generated tokens is
/// reported with how many (the growth of `meta_info.completion_tokens`, else one per chunk with
/// text, as OpenAI streams one token per chunk). Reported counts (`usage`) are kept.
#[derive(Debug, Default)]
pub struct SseTokens {
    pending: Vec<u8>,
    /// Tokens seen in chunks so far.
    pub tokens_seen: u64,
    /// The server's own counts, when it reported them.
    pub completion_tokens: Option<u64>,
    pub prompt_tokens: Option<u64>,
}

impl SseTokens {
    /// Feed bytes; `on_chunk(tokens)` for every event that carries tokens (`tokens` ≥ 1).
    pub fn feed(&mut self, data: &[u8], mut on_chunk: impl FnMut(u64)) {
        self.pending.extend_from_slice(data);
        while let Some(end) = find_event_end(&self.pending) {
            let event: Vec<u8> = self.pending.drain(..end.0 + end.1).collect();
            self.on_event(&event[..end.0], &mut on_chunk);
        }
        if self.pending.len() > MAX_EVENT {
            self.pending.clear();
        }
    }

    fn on_event(&mut self, event: &[u8], on_chunk: &mut impl FnMut(u64)) {
        let text = String::from_utf8_lossy(event);
        for line in text.lines() {
            let Some(data) = line.strip_prefix("data:") else {
                continue;
            };
            let data = data.trim();
            if data == "[DONE]" || data.is_empty() {
                continue;
            }
            let Ok(v) = serde_json::from_str::<Value>(data) else {
                continue;
            };
            if let Some(n) = completion_of(&v) {
                self.completion_tokens = Some(n);
            }
            if let Some(n) = prompt_of(&v) {
                self.prompt_tokens = Some(n);
            }
            let reported = v["meta_info"]["completion_tokens"].as_u64();
            let has_text = chunk_text(&v).is_some_and(|t| !t.is_empty());
            let new_tokens = match reported {
                Some(n) => n.saturating_sub(self.tokens_seen),
                None => u64::from(has_text),
            };
            if new_tokens == 0 && !has_text {
                continue;
            }
            self.tokens_seen += new_tokens.max(1);
            on_chunk(new_tokens.max(1));
        }
    }

    /// Streams report their counts cumulatively; the last one is the total.
    pub fn completion(&self) -> Option<u64> {
        self.completion_tokens
            .or((self.tokens_seen > 0).then_some(self.tokens_seen))
    }
}

/// Token counts as SGLang reports them: `meta_info` (native API) or `usage` (OpenAI API).
fn completion_of(v: &Value) -> Option<u64> {
    v["meta_info"]["completion_tokens"]
        .as_u64()
        .or_else(|| v["usage"]["completion_tokens"].as_u64())
}

fn prompt_of(v: &Value) -> Option<u64> {
    v["meta_info"]["prompt_tokens"]
        .as_u64()
        .or_else(|| v["usage"]["prompt_tokens"].as_u64())
}

/// The generated text of an SSE chunk: `/generate` (`text`), completions (`choices[].text`),
/// chat (`choices[].delta.content`).
fn chunk_text(v: &Value) -> Option<&str> {
    v["text"]
        .as_str()
        .or_else(|| v["choices"][0]["text"].as_str())
        .or_else(|| v["choices"][0]["delta"]["content"].as_str())
}

/// End of the first SSE event in `b`: (index of the blank line, its length).
fn find_event_end(b: &[u8]) -> Option<(usize, usize)> {
    let lf = b.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = b.windows(4).position(|w| w == b"\r\n\r\n").map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(c)) => Some(if a.0 <= c.0 { a } else { c }),
        (a, c) => a.or(c),
    }
}

/// The upstream body, measured as it passes.
struct Measured {
    inner: Incoming,
    rec: Option<Recorder>,
}

impl Body for Measured {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(d), Some(r)) = (frame.data_ref(), this.rec.as_mut()) {
                    r.on_data(d);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                if let Some(r) = this.rec.take() {
                    r.finish(Some(format!("upstream body: {e}")));
                }
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                if let Some(r) = this.rec.take() {
                    r.finish(None);
                }
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Measured {
    fn drop(&mut self) {
        // Dropped before the end: the client went away (dropping `inner` aborts the upstream).
        if let Some(r) = self.rec.take() {
            r.finish(Some("client disconnected".into()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_split_on_blank_lines_of_either_kind() {
        assert_eq!(find_event_end(b"data: x\n\ndata: y"), Some((7, 2)));
        assert_eq!(find_event_end(b"data: x\r\n\r\n"), Some((7, 4)));
        assert_eq!(find_event_end(b"data: x\n"), None);
    }

    #[test]
    fn chunk_text_reads_every_api_shape() {
        let g: Value = serde_json::json!({"text": "a", "meta_info": {"completion_tokens": 1}});
        let c: Value = serde_json::json!({"choices": [{"text": "b"}]});
        let ch: Value = serde_json::json!({"choices": [{"delta": {"content": "c"}}]});
        assert_eq!(
            (chunk_text(&g), chunk_text(&c), chunk_text(&ch)),
            (Some("a"), Some("b"), Some("c"))
        );
        assert_eq!(
            chunk_text(&serde_json::json!({"choices": [{"delta": {}}]})),
            None
        );
    }
}
