//! The metrics HTTP server: `/metrics` (Prometheus text 0.0.4, or OpenMetrics when the `Accept`
//! header asks), `/-/ready` (200 only while the SGLang server is ready), `/-/healthy`.
use crate::listen::{spawn_accept_loop, Limits};
use crate::metrics::{render, Shared};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use sglang_probes::sampler::SamplerHandle;
use sglang_probes::sync::off_runtime;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    // The I/O error is said in the message, not chained: the chain would say it twice.
    #[error("cannot listen on {addr} for metrics: {error} ({hint}: pass --metrics-addr HOST:PORT, or none)", hint = bind_hint(error))]
    Bind { addr: String, error: std::io::Error },
}

/// What a failed bind most likely means, for the error line.
pub(crate) fn bind_hint(error: &std::io::Error) -> &'static str {
    use std::io::ErrorKind;
    match error.kind() {
        ErrorKind::AddrInUse => "another process holds the port",
        ErrorKind::AddrNotAvailable => "the host is not an address of this machine",
        ErrorKind::PermissionDenied => "ports below 1024 need privileges",
        ErrorKind::InvalidInput => "that is not HOST:PORT",
        _ if error.raw_os_error().is_none() => "the host does not resolve",
        _ => "the address cannot be listened on",
    }
}

impl ServeError {
    /// The address is held by another listener (a process the caller may name).
    pub fn addr_in_use(&self) -> bool {
        matches!(self, ServeError::Bind { error, .. } if in_use(error))
    }
}

/// A bind failed because another listener holds the address (ours: metrics and proxy alike).
pub(crate) fn in_use(error: &std::io::Error) -> bool {
    error.kind() == std::io::ErrorKind::AddrInUse
}

/// A scraper needs one connection; a flood of idle ones evicts its own oldest, not a scrape.
const METRICS_LIMITS: Limits = Limits {
    max_connections: 64,
    header_timeout: Duration::from_secs(10),
    evict_oldest: true,
};

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A listening address as it is bound: `:PORT` (no host) means loopback, so that nothing we
/// serve is exposed beyond the machine unless a host is named.
pub fn with_host(addr: &str) -> std::borrow::Cow<'_, str> {
    match addr.strip_prefix(':') {
        Some(port) => format!("127.0.0.1:{port}").into(),
        None => addr.into(),
    }
}

/// Bind a listener (`addr` as [`with_host`] reads it) and say where it landed.
pub async fn bind(addr: &str) -> std::io::Result<(TcpListener, SocketAddr)> {
    let addr = with_host(addr);
    let mut last = None;
    // Not tokio's lookup_host: it would panic if refused its resolver thread.
    let found = sglang_probes::resolve::resolve_addr(addr.as_ref()).await?;
    for a in found {
        match listen(a) {
            Ok(l) => {
                let local = l.local_addr()?;
                return Ok((l, local));
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other(format!("{addr} names no address"))))
}

/// A listener with a deep backlog: past the connection cap, newcomers wait there (the kernel
/// caps it at net.core.somaxconn) instead of having their SYNs dropped.
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(4096)
}

/// Bind now (so a port in use is an error at start), serve in the background.
pub async fn start(
    addr: &str,
    registry: Arc<Registry>,
    shared: Arc<Shared>,
) -> Result<SocketAddr, ServeError> {
    let (listener, local) = bind(addr).await.map_err(|error| ServeError::Bind {
        addr: addr.to_string(),
        error,
    })?;
    spawn_accept_loop(listener, METRICS_LIMITS, "metrics", move |stream| {
        let (registry, shared) = (registry.clone(), shared.clone());
        async move {
            let svc = service_fn(move |req| handle(req, registry.clone(), shared.clone()));
            if let Err(e) = METRICS_LIMITS
                .http1()
                .serve_connection(TokioIo::new(stream), svc)
                .await
            {
                tracing::debug!("metrics connection: {e}");
            }
        }
    });
    Ok(local)
}

fn reply(status: StatusCode, ctype: &str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(ctype) {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

/// A query parameter's value, percent-decoded (`+` is a space).
fn query_param(req: &Request<Incoming>, key: &str) -> Option<String> {
    let q = req.uri().query()?;
    let raw = q
        .split('&')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))?;
    let b = raw.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match b[i] {
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    Some(String::from_utf8_lossy(&out).into_owned())
}

/// Power over a window's traffic span (its `requests` carry the span): InferenceX's verdict and
/// trapezoid, the counter beside it, and energy per request and token over that same span.
fn traffic_power(s: &SamplerHandle, requests: &serde_json::Value) -> Option<serde_json::Value> {
    let f = |k: &str| requests.get(k).and_then(serde_json::Value::as_f64);
    let span = (
        f("benchmark_start_time_unix")?,
        f("benchmark_end_time_unix")?,
    );
    if span.1 <= span.0 {
        return None;
    }
    let p = s.power_over(span);
    let n = |k: &str| requests.get(k).and_then(serde_json::Value::as_u64);
    let per_token = sglang_probes::inferencex::per_token(
        &p.inferencex,
        n("completed"),
        n("total_input_tokens"),
        n("total_output_tokens"),
    );
    let mut v = serde_json::to_value(&p).ok()?;
    for (k, x) in per_token {
        v[k] = x.into();
    }
    Some(v)
}

/// `POST /-/window/start?name=NAME` opens a measurement window: energy counters are read at once
/// on every GPU, and the proxy starts a latency window. `POST /-/window/stop` closes both and
/// answers `{name, power, requests, traffic_power}` (each present when there is a sampler / a
/// proxy / both): `power` over the window's wall span, `traffic_power` over its requests' span
/// (first start → last end) with energy per token. `?bench_result=PATH` (a bench_serving or
/// InferenceX benchmark_serving result) adds `bench`: the same recomputed over the benchmark's own
/// span (see `report --bench-result`). A start while a window is open first closes that one as a
/// stop would (its `window` event is written) and answers it as `closed` beside `started`.
async fn window(req: &Request<Incoming>, shared: &Arc<Shared>) -> Response<Full<Bytes>> {
    let json = "application/json";
    let (sampler, requests, parts) = (shared.sampler(), shared.requests(), shared.window_parts());
    if sampler.is_none() && requests.is_none() && parts.is_empty() {
        return reply(
            StatusCode::SERVICE_UNAVAILABLE,
            json,
            "{\"error\":\"nothing to measure: no GPU sampler and no --proxy-addr\"}\n".into(),
        );
    }
    if req.uri().path() == "/-/window/start" {
        let name = req
            .uri()
            .query()
            .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("name=")))
            .unwrap_or("window")
            .to_string();
        // A window still open is closed and recorded (a `window` event) before the new one
        // opens: a sweep whose stop went missing keeps every window, each over its own span.
        let closed = close_window(shared, None).await;
        if let Some(r) = &requests {
            r.window_start(&name);
        }
        for p in &parts {
            p.start(&name);
        }
        if let Some(s) = sampler {
            let n = name.clone();
            // Counter reads take milliseconds per GPU: off the async threads.
            let _ = off_runtime(move || s.window_start(&n)).await;
        }
        let mut v = serde_json::json!({ "started": name });
        if let Some(c) = closed {
            v["closed"] = c;
        }
        return reply(StatusCode::OK, json, format!("{v}\n"));
    }
    match close_window(shared, query_param(req, "bench_result")).await {
        Some(v) => reply(StatusCode::OK, json, format!("{v}\n")),
        None => reply(
            StatusCode::CONFLICT,
            json,
            "{\"error\":\"no window in progress: POST /-/window/start?name=... first\"}\n".into(),
        ),
    }
}

/// Close the window in progress, if any: its JSON, also handed to the window sink (the `window`
/// event); `None` when no window was open.
async fn close_window(
    shared: &Arc<Shared>,
    bench_result: Option<String>,
) -> Option<serde_json::Value> {
    let (sampler, requests, parts) = (shared.sampler(), shared.requests(), shared.window_parts());
    let gpus = sampler.as_ref().map(|s| s.latest().len());
    let power = match sampler {
        Some(s) => off_runtime(move || s.window_stop()).await.flatten(),
        None => None,
    };
    // Blocking: the tap's settle waits (milliseconds) for its ring to be read up to the close.
    let reqs = match requests {
        Some(r) => off_runtime(move || r.window_stop(gpus)).await.flatten(),
        None => None,
    };
    let more: Vec<_> = parts.iter().filter_map(|p| p.stop()).collect();
    let name = power
        .as_ref()
        .map(|(n, _)| n.clone())
        .or_else(|| reqs.as_ref().map(|(n, _)| n.clone()))
        .or_else(|| more.first().map(|(n, _, _)| n.clone()));
    let name = name?;
    let mut v = serde_json::json!({ "name": name });
    if let Some((_, p)) = power {
        v["power"] = serde_json::to_value(&p).unwrap_or_default();
    }
    if let Some((_, r)) = reqs {
        if let Some(s) = shared.sampler() {
            let r2 = r.clone();
            if let Some(Some(t)) = off_runtime(move || traffic_power(&s, &r2)).await {
                v["traffic_power"] = t;
            }
        }
        v["requests"] = r;
    }
    for (_, key, part) in more {
        v[key] = part;
    }
    if let Some(path) = bench_result {
        v["bench"] = match shared.bench_hook() {
            Some(hook) => off_runtime(move || hook(&path)).await.unwrap_or_else(
                || serde_json::json!({"error": "the benchmark's evaluation failed (a panic: see the log)"}),
            ),
            None => serde_json::json!({"error": "no benchmark evaluation in this process"}),
        };
    }
    if let Some(sink) = shared.window_sink() {
        sink(v.clone());
    }
    Some(v)
}

/// `POST /-/profile/start?steps=N` / `POST /-/profile/stop`: the server's torch profiler, driven
/// by the lifecycle (which knows the server, its key and the trace directory).
async fn profile(req: &Request<Incoming>, shared: &Arc<Shared>) -> Response<Full<Bytes>> {
    let json = "application/json";
    let Some(hook) = shared.profile_hook() else {
        return reply(
            StatusCode::SERVICE_UNAVAILABLE,
            json,
            "{\"error\":\"profiling is off: run with --profile-dir DIR (or --report)\"}\n".into(),
        );
    };
    let call = if req.uri().path() == "/-/profile/start" {
        let steps = query_param(req, "steps");
        let parsed = steps.as_deref().map(str::parse::<u64>).transpose();
        match parsed {
            Ok(steps) => crate::metrics::ProfileCall::Start { steps },
            Err(_) => return reply(
                StatusCode::BAD_REQUEST,
                json,
                "{\"error\":\"steps must be a whole number of forward steps, e.g. ?steps=20\"}\n"
                    .into(),
            ),
        }
    } else {
        crate::metrics::ProfileCall::Stop
    };
    let (code, v) = hook(call).await;
    reply(
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        json,
        format!("{v}\n"),
    )
}

async fn handle(
    req: Request<Incoming>,
    registry: Arc<Registry>,
    shared: Arc<Shared>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let text = "text/plain; charset=utf-8";
    Ok(match req.uri().path() {
        "/metrics" => {
            let om = req
                .headers()
                .get(hyper::header::ACCEPT)
                .and_then(|a| a.to_str().ok())
                .is_some_and(|a| a.contains("application/openmetrics-text"));
            shared.refresh_upstream().await;
            match render(&registry, &shared, om) {
                Ok(body) => {
                    let ctype = if om {
                        OPENMETRICS
                    } else {
                        prometheus_client::encoding::prometheus_text::CONTENT_TYPE
                    };
                    reply(StatusCode::OK, ctype, body)
                }
                Err(e) => reply(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    text,
                    format!("encoding metrics: {e}\n"),
                ),
            }
        }
        "/-/ready" if shared.is_ready() => reply(StatusCode::OK, text, "ready\n".into()),
        "/-/ready" => reply(StatusCode::SERVICE_UNAVAILABLE, text, "not ready\n".into()),
        "/-/healthy" => reply(StatusCode::OK, text, "healthy\n".into()),
        "/-/window/start" | "/-/window/stop" if req.method() != hyper::Method::POST => {
            reply(StatusCode::METHOD_NOT_ALLOWED, text, "use POST\n".into())
        }
        "/-/window/start" | "/-/window/stop" => window(&req, &shared).await,
        "/-/profile/start" | "/-/profile/stop" if req.method() != hyper::Method::POST => {
            reply(StatusCode::METHOD_NOT_ALLOWED, text, "use POST\n".into())
        }
        "/-/profile/start" | "/-/profile/stop" => profile(&req, &shared).await,
        _ => reply(
            StatusCode::NOT_FOUND,
            text,
            "not found: try /metrics, /-/ready, /-/healthy\n".into(),
        ),
    })
}
