//! A streaming-transparent reverse proxy in front of the server that measures each generation
//! request itself, whatever the benchmark client: TTFT, inter-token latency, TPOT and E2E with
//! bench_serving's definitions, and the server's exact token counts (DESIGN.md, Definitions).
//!
//! Every response frame is forwarded the moment it arrives, without copying (hyper's
//! backpressure holds the upstream read while the client is slow); events are read with a byte
//! scan ([`sse`]), per-request state stays in the response's body ([`record::Recorder`]) and
//! touches shared state once, when the request ends. An OpenAI stream whose client did not ask
//! for usage is sent upstream with `stream_options.include_usage` so the server's counts are
//! known, and the usage-only event it adds is cut from the client's copy ([`stream::Measured`]):
//! the client receives the same bytes as over a direct connection. A client that goes away drops
//! the response body, which closes the upstream request.
mod body_counts;
mod ledger;
mod record;
mod shards;
pub mod spin;
mod sse;
mod stream;
mod sweep;
mod upstream;
pub use body_counts::BodyCounts;
pub use hyper::body::Bytes;
pub use ledger::Ledger;
pub use record::{ProxyMetrics, ReqLabels, RequestRecord, E2E_BUCKETS, LATENCY_BUCKETS};
pub(crate) use record::{Recorder, Sink, Started, CLIENT_LEFT, CLIENT_LEFT_EARLY};
pub(crate) use spin::Held;
pub use sse::{event_end, scan_event, Api, EventInfo};
pub use stream::EventStream;

use crate::listen::{
    connection_permits, proxy_connection_cap, spawn_accept_loop_sharing, Limits, SharedListener,
    Spread,
};
use http_body_util::{combinators::BoxBody, BodyExt, Either, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use shards::{shard_count, Shards};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use upstream::{Driven, Upstream};

/// Largest OpenAI request body read whole to ask for usage; larger ones pass through unread
/// (their token counts may then be unknown).
const MAX_REWRITTEN_BODY: u64 = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    // The I/O error is said in the message, not chained: the chain would say it twice.
    #[error("cannot listen on {addr} for the proxy: {error} (pass another --proxy-addr)")]
    Bind { addr: String, error: std::io::Error },
    #[error("the proxy cannot forward to {url}: {reason} (expected http://HOST[:PORT])")]
    Upstream { url: String, reason: String },
    #[error("cannot share the proxy's listening socket {addr} between its threads: {error}")]
    Listener { addr: String, error: std::io::Error },
    #[error("cannot start the proxy's threads: {0}{hint}", hint = sglang_probes::sync::start_hint(.0))]
    Threads(std::io::Error),
}

impl ProxyError {
    /// The address is held by another listener (a process the caller may name).
    pub fn addr_in_use(&self) -> bool {
        matches!(self, ProxyError::Bind { error, .. } if crate::server::in_use(error))
    }
}

type UpstreamBody = Either<Prefixed, Full<Bytes>>;
type ProxyBody = BoxBody<Bytes, hyper::Error>;

pub struct Proxy {
    upstream: Uri,
    /// `host:port` of the server, for each client connection's own upstream connection.
    upstream_addr: String,
    /// Where those connections come from ([`upstream_source`]).
    source: Option<Ipv4Addr>,
    ledger: Arc<Ledger>,
}

/// The address the proxy's connections to a server on IPv4 loopback come from, so that the
/// server's access log tells its requests from any other loopback client's: one logged from
/// elsewhere on loopback went straight to the server (the supervisor counts those).
pub const LOOPBACK_SOURCE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// Where the proxy's connections to the server at `upstream` (a URL) come from:
/// [`LOOPBACK_SOURCE`] when the URL names an IPv4 loopback address and that source can be bound
/// here (not where `lo` was cut down to 127.0.0.1 alone); `None` (the kernel's choice) else.
pub fn upstream_source(upstream: &str) -> Option<Ipv4Addr> {
    let uri: Uri = upstream.parse().ok()?;
    let lo = uri.host()?.parse::<Ipv4Addr>().ok()?.is_loopback();
    (lo && upstream::bound_to(LOOPBACK_SOURCE).is_ok()).then_some(LOOPBACK_SOURCE)
}

/// Bind now, serve in the background; `upstream` like `http://127.0.0.1:30000`, `source` where
/// the connections to it come from ([`upstream_source`]: the caller reads the server's log by
/// it, so it is asked once and given here).
pub async fn start(
    addr: &str,
    upstream: &str,
    source: Option<Ipv4Addr>,
    metrics: Arc<ProxyMetrics>,
    stats: Arc<crate::report::RequestStats>,
    requests_log: Option<std::fs::File>,
    traffic_window: Option<sglang_probes::sampler::SamplerHandle>,
) -> Result<SocketAddr, ProxyError> {
    let (listener, local) = crate::server::bind(addr)
        .await
        .map_err(|error| ProxyError::Bind {
            addr: addr.to_string(),
            error,
        })?;
    let upstream: Uri = upstream.parse().map_err(|e| ProxyError::Upstream {
        url: upstream.to_string(),
        reason: format!("not a URL ({e})"),
    })?;
    let upstream_addr = match (upstream.host(), upstream.port_u16()) {
        (Some(h), Some(p)) => format!("{h}:{p}"),
        (Some(h), None) => format!("{h}:80"),
        _ => {
            return Err(ProxyError::Upstream {
                url: upstream.to_string(),
                reason: "it names no host".to_string(),
            })
        }
    };
    let proxy = Arc::new(Proxy {
        source,
        upstream,
        upstream_addr,
        ledger: Ledger::new(metrics, stats, requests_log, traffic_window),
    });
    // Benchmark clients keep connections idle between requests (SGLang's own server closes
    // them after 5 s); a minute covers any pause of theirs.
    let limits = Limits {
        max_connections: proxy_connection_cap(),
        header_timeout: Duration::from_secs(60),
        evict_oldest: false,
    };
    let shards = Shards::start(shard_count()).map_err(ProxyError::Threads)?;
    // Every thread accepts from the one listening socket and serves what it accepts: a
    // connection is read by the first thread to wake. Accepted on the supervisor's runtime and
    // handed over, each connection woke two threads one after the other (about 0.2 ms more to a
    // first token on the dev VM). One accept queue: a connection never waits on a thread that has
    // no room under the cap while another has (one listener per thread did: `SO_REUSEPORT`).
    let listener = Arc::new(listener.into_std().map_err(|error| ProxyError::Listener {
        addr: local.to_string(),
        error,
    })?);
    let permits = connection_permits(&limits);
    // Shard i's accept loop counts its connections in slot i of the group.
    for (i, spread) in Spread::group(shards.len()).into_iter().enumerate() {
        let (proxy, permits, listener) = (proxy.clone(), permits.clone(), listener.clone());
        shards.spawn_on(i, move || async move {
            let listener = match SharedListener::new(listener) {
                Ok(l) => l,
                Err(e) => {
                    return tracing::warn!("proxy: a thread cannot wait on the listener: {e}")
                }
            };
            spawn_accept_loop_sharing(
                listener,
                limits,
                permits,
                Some(spread),
                "proxy",
                move |stream| serve_client(proxy.clone(), limits, stream),
            );
        });
    }
    // The threads end when `shards` is dropped: with the supervisor's runtime, as before.
    tokio::spawn(async move {
        let _threads = shards;
        std::future::pending::<()>().await
    });
    Ok(local)
}

/// One client connection, on the thread that accepted it, with its own upstream connection.
async fn serve_client(proxy: Arc<Proxy>, limits: Limits, stream: tokio::net::TcpStream) {
    let _ = stream.set_nodelay(true);
    let up = Arc::new(Upstream::new(proxy.upstream_addr.clone(), proxy.source));
    up.open_early();
    let svc = service_fn(move |req| proxy.clone().forward(req, up.clone()));
    if let Err(e) = limits
        .http1()
        .serve_connection(TokioIo::new(stream), svc)
        .await
    {
        tracing::debug!("proxy connection: {e}");
    }
}

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

/// Whether a request's forwarding headers name a client with a port (`X-Forwarded-For:
/// 10.0.0.1:5555`, `Forwarded: for="[::1]:80"`). A server that trusts them (uvicorn's
/// FORWARDED_ALLOW_IPS) logs that client and port; one named without a port is logged with port
/// 0, which the supervisor knows for a forwarded client.
fn names_a_client_with_a_port(headers: &hyper::HeaderMap) -> bool {
    let with_port = |client: &str| {
        let c = client.trim().trim_matches('"');
        match c.strip_prefix('[') {
            Some(v6) => v6.contains("]:"),
            None => c.matches(':').count() == 1,
        }
    };
    // read as uvicorn reads them: Latin-1, every byte a character (a value that is not
    // visible ASCII is still read, and a client named in it still counts)
    let values = |name| {
        headers.get_all(name).into_iter().map(|v| {
            v.as_bytes()
                .iter()
                .map(|&b| char::from(b))
                .collect::<String>()
        })
    };
    values("x-forwarded-for").any(|v| v.split(',').any(with_port))
        || values("forwarded").any(|v| {
            v.split([',', ';'])
                .filter_map(|kv| kv.trim().strip_prefix("for="))
                .any(with_port)
        })
}

/// The generation endpoints the proxy and the tap measure, by path (no query).
pub fn measured_endpoint(path: &str) -> Option<(&'static str, Api)> {
    match path {
        "/generate" => Some(("/generate", Api::Generate)),
        "/v1/completions" => Some(("/v1/completions", Api::Completions)),
        "/v1/chat/completions" => Some(("/v1/chat/completions", Api::Chat)),
        _ => None,
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl Proxy {
    async fn forward(
        self: Arc<Self>,
        req: Request<Incoming>,
        upstream: Arc<Upstream<UpstreamBody>>,
    ) -> Result<Response<ProxyBody>, hyper::Error> {
        let started = measured_endpoint(req.uri().path()).map(|(endpoint, api)| Started {
            endpoint,
            api,
            sent: Instant::now(),
            sent_unix: unix_now(),
            in_flight: spin::Held::enter(),
        });
        if started.is_some() {
            self.ledger.enter();
            if names_a_client_with_a_port(req.headers()) {
                self.ledger.forwarded_client();
            }
        }
        // Until the response starts, a client that leaves drops this future: still recorded.
        let mut pending = Pending {
            proxy: &self,
            started,
        };
        let (mut parts, body) = req.into_parts();
        // Origin form on the upstream connection, as the client sent it.
        let path_q = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        parts.uri = match path_q.parse::<Uri>() {
            Ok(u) => u,
            Err(e) => {
                let why = format!("bad request path {path_q:?}: {e}");
                return Ok(self.error_response(pending.started.take(), why));
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
        let (body, asked_usage) = match pending.started.as_ref().map(|s| s.api) {
            Some(Api::Completions | Api::Chat) => match ask_for_usage(&mut parts, body).await {
                Ok(b) => b,
                Err(why) => return Ok(self.error_response(pending.started.take(), why)),
            },
            _ => (Either::Left(Prefixed::new(None, body)), false),
        };
        let (resp, lent) = match upstream.send(Request::from_parts(parts, body)).await {
            Ok(answer) => answer,
            Err(why) => return Ok(self.error_response(pending.started.take(), why)),
        };
        let (mut parts, body) = resp.into_parts();
        let body = Driven::new(body, lent);
        for h in HOP_BY_HOP {
            parts.headers.remove(*h);
        }
        let Some(started) = pending.started.take() else {
            return Ok(Response::from_parts(parts, body.boxed()));
        };
        let stream = parts
            .headers
            .get(hyper::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if asked_usage && stream {
            parts.headers.remove(hyper::header::CONTENT_LENGTH);
        }
        let sink: Arc<dyn Sink> = self.ledger.clone();
        let rec = Recorder::new(
            sink,
            self.ledger.metrics().clone(),
            started,
            parts.status.as_u16(),
            stream,
        );
        let body = stream::Measured::new(body, rec, stream, asked_usage);
        Ok(Response::from_parts(parts, body.boxed()))
    }

    /// The request could not be forwarded: a clear 502 for the client, counted, and the proxy
    /// carries on.
    fn error_response(&self, started: Option<Started>, why: String) -> Response<ProxyBody> {
        tracing::warn!("proxy: {why}");
        if let Some(s) = started {
            self.ledger.failed(s, 502, why.clone());
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
}

/// A measured request not yet answered: dropped armed (the client left while the request was
/// read or the server had not yet answered, and hyper dropped the handler), it is recorded with
/// an error (status 499, as nginx logs a client that closed the request) and leaves the
/// in-flight count.
struct Pending<'a> {
    proxy: &'a Proxy,
    started: Option<Started>,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.started.take() {
            let why = CLIENT_LEFT_EARLY.to_string();
            self.proxy.ledger.failed(s, 499, why);
        }
    }
}

#[derive(serde::Deserialize)]
struct StreamFlags {
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
}

#[derive(serde::Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

/// An OpenAI request: when it streams without asking for usage, ask for it (the answer's
/// usage-only event is then cut from the client's copy). Returns the body to send upstream and
/// whether usage was asked on the client's behalf. A body without a length (chunked) is read up
/// to the same limit as one with; past it, what was read goes on followed by the rest, unread.
async fn ask_for_usage(
    parts: &mut hyper::http::request::Parts,
    mut body: Incoming,
) -> Result<(UpstreamBody, bool), String> {
    let len = parts
        .headers
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if len.is_some_and(|n| n > MAX_REWRITTEN_BODY) {
        return Ok((Either::Left(Prefixed::new(None, body)), false));
    }
    let mut read = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("reading the client's request body: {e}"))?;
        if let Ok(data) = frame.into_data() {
            read.extend_from_slice(&data);
        }
        if read.len() as u64 > MAX_REWRITTEN_BODY {
            return Ok((Either::Left(Prefixed::new(Some(read.into()), body)), false));
        }
    }
    let bytes = Bytes::from(read);
    let body = with_usage_asked(&bytes);
    let asked = body.is_some();
    let body = body.unwrap_or(bytes);
    parts
        .headers
        .insert(hyper::header::CONTENT_LENGTH, body.len().into());
    Ok((Either::Right(Full::new(body)), asked))
}

/// The client's request body, with what was already read of it in front.
pub struct Prefixed {
    head: Option<Bytes>,
    rest: Incoming,
}

impl Prefixed {
    fn new(head: Option<Bytes>, rest: Incoming) -> Self {
        Prefixed { head, rest }
    }
}

impl hyper::body::Body for Prefixed {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        if let Some(h) = this.head.take() {
            return std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(h))));
        }
        std::pin::Pin::new(&mut this.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.head.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match &self.head {
            None => self.rest.size_hint(),
            Some(_) => hyper::body::SizeHint::default(),
        }
    }
}

/// The request body with `stream_options.include_usage: true`, if it streams without it.
pub fn with_usage_asked(body: &[u8]) -> Option<Bytes> {
    let flags: StreamFlags = serde_json::from_slice(body).ok()?;
    if flags.stream != Some(true)
        || flags.stream_options.as_ref().and_then(|o| o.include_usage) == Some(true)
    {
        return None;
    }
    if memchr::memmem::find(body, b"\"stream_options\"").is_none() {
        // Inserted as the first key: the client's bytes stay as they are.
        let open = body.iter().position(|&c| c == b'{')?;
        let mut v = Vec::with_capacity(body.len() + 40);
        v.extend_from_slice(&body[..=open]);
        v.extend_from_slice(br#""stream_options":{"include_usage":true}"#);
        let rest = &body[open + 1..];
        if rest.trim_ascii_start().first() != Some(&b'}') {
            v.push(b',');
        }
        v.extend_from_slice(rest);
        return Some(Bytes::from(v));
    }
    // stream_options is there (null, or without include_usage): set it in the parsed object.
    let mut obj: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(body).ok()?;
    let opts = obj
        .entry("stream_options")
        .or_insert_with(|| serde_json::json!({}));
    if !opts.is_object() {
        *opts = serde_json::json!({});
    }
    opts["include_usage"] = true.into();
    serde_json::to_vec(&obj).ok().map(Bytes::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a client named with a port is logged as a real-looking client by a server that
    /// trusts the header: one without is logged with port 0.
    #[test]
    fn a_forwarding_header_names_a_client_with_a_port_only_where_it_has_one() {
        let with = |pairs: &[(&'static str, &str)]| {
            let mut h = hyper::HeaderMap::new();
            for (k, v) in pairs {
                h.append(*k, v.parse().unwrap());
            }
            names_a_client_with_a_port(&h)
        };
        assert!(with(&[("x-forwarded-for", "127.0.0.1:5555")]));
        assert!(with(&[("x-forwarded-for", "10.0.0.1, 127.0.0.1:5555")]));
        assert!(with(&[("x-forwarded-for", "[::1]:80")]));
        assert!(with(&[(
            "forwarded",
            "for=\"[2001:db8::1]:4711\";proto=http"
        )]));
        assert!(with(&[("forwarded", "for=192.0.2.60:80")]));
        for none in ["127.0.0.1", "::1", "10.0.0.1, 2001:db8::1", "[::1]"] {
            assert!(!with(&[("x-forwarded-for", none)]), "{none}");
        }
        assert!(!with(&[("forwarded", "for=192.0.2.60;proto=http")]));
        assert!(!with(&[("x-real-ip", "127.0.0.1:1")]));
        // bytes past ASCII, read as Latin-1; U+00A0 is white space to both uvicorn and this
        let mut h = hyper::HeaderMap::new();
        let v = hyper::header::HeaderValue::from_bytes(b"\xa0127.0.0.1:7777, \xe9").unwrap();
        h.append("x-forwarded-for", v);
        assert!(names_a_client_with_a_port(&h));
        assert!(!with(&[]));
    }

    #[test]
    fn usage_is_asked_only_for_streams_that_did_not_ask() {
        let b = with_usage_asked(br#"{"model":"m","prompt":"hi","stream":true}"#).unwrap();
        assert_eq!(
            &b[..],
            br#"{"stream_options":{"include_usage":true},"model":"m","prompt":"hi","stream":true}"#
        );
        assert!(
            with_usage_asked(br#"{"prompt":"hi"}"#).is_none(),
            "not streamed"
        );
        assert!(
            with_usage_asked(br#"{"stream":true,"stream_options":{"include_usage":true}}"#)
                .is_none(),
            "already asked"
        );
        let kept = with_usage_asked(
            br#"{"stream":true,"stream_options":{"continuous_usage_stats":true}}"#,
        )
        .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&kept).unwrap();
        assert_eq!(
            v["stream_options"],
            serde_json::json!({"continuous_usage_stats": true, "include_usage": true})
        );
        let null = with_usage_asked(br#"{"stream":true,"stream_options":null}"#).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&null).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert!(with_usage_asked(b"not json").is_none());
    }

    #[test]
    #[ignore = "SGLang's pydantic coerces \"stream\":\"true\" / 1 to a stream; the proxy reads only a JSON bool, so such streams are not asked for usage and their counts stay null"]
    fn a_stream_flag_sglang_coerces_is_asked_for_usage() {
        assert!(with_usage_asked(br#"{"prompt":"hi","stream":"true"}"#).is_some());
        assert!(with_usage_asked(br#"{"prompt":"hi","stream":1}"#).is_some());
    }
}

/// Every proxied request ends with exactly one record, made before the client holds the last
/// byte of its answer: a check right after the client's read (or a shutdown then) finds it,
/// whatever frames the answer and whoever closes first.
#[cfg(test)]
mod exactly_once_tests {
    use super::*;
    use serde_json::Value;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    const JSON: &str = r#"{"text":"a b","meta_info":{"prompt_tokens":2,"completion_tokens":2}}"#;
    const EVENTS: [&str; 3] = [
        r#"data: {"text":" a","meta_info":{"prompt_tokens":2,"completion_tokens":1}}"#,
        r#"data: {"text":" a b","meta_info":{"prompt_tokens":2,"completion_tokens":2}}"#,
        "data: [DONE]",
    ];

    /// How the fake server frames its answer.
    #[derive(Clone, Copy, Debug)]
    enum Framing {
        Length,
        Chunked,
        /// Chunked, and the connection closed right after the last chunk.
        ChunkedThenClose,
        /// No length: the body ends when the server closes.
        Eof,
        /// 204, no body.
        NoContent,
        /// The answer to a HEAD: a length, no body.
        Head,
    }

    fn answer(f: Framing) -> (Vec<u8>, bool) {
        let chunked = || {
            let mut s = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n".to_string();
            for e in EVENTS {
                let frame = format!("{e}\n\n");
                s += &format!("{:x}\r\n{frame}\r\n", frame.len());
            }
            s + "0\r\n\r\n"
        };
        let (s, close) = match f {
            Framing::Length => (
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{JSON}",
                    JSON.len()
                ),
                false,
            ),
            Framing::Chunked => (chunked(), false),
            Framing::ChunkedThenClose => (chunked(), true),
            Framing::Eof => (
                format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n{JSON}"),
                true,
            ),
            Framing::NoContent => ("HTTP/1.1 204 No Content\r\n\r\n".to_string(), false),
            Framing::Head => (
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                    JSON.len()
                ),
                false,
            ),
        };
        (s.into_bytes(), close)
    }

    /// A server that answers every request on a connection with `f`'s framing.
    async fn server(f: Framing) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        // One request: its head, then its content-length body.
                        let head_end = loop {
                            if let Some(i) = memchr::memmem::find(&buf, b"\r\n\r\n") {
                                break i + 4;
                            }
                            match s.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        };
                        let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
                        let len: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map_or(0, |v| v.trim().parse().unwrap());
                        while buf.len() < head_end + len {
                            match s.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        buf.drain(..head_end + len);
                        let (bytes, close) = answer(f);
                        if s.write_all(&bytes).await.is_err() || close {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    /// How the client asks and leaves.
    #[derive(Clone, Copy, Debug)]
    enum Client {
        /// `Connection: close`, read to EOF.
        CloseReadToEof,
        /// Keep-alive, read up to the answer's last byte, then close at once.
        LeaveAtLastByte,
    }

    /// One `/generate` through the proxy; returns the answer's bytes once the client has them.
    async fn ask(proxy: SocketAddr, c: Client, f: Framing) -> Vec<u8> {
        let mut s = TcpStream::connect(proxy).await.unwrap();
        let (method, body) = match f {
            Framing::Head => ("HEAD", ""),
            _ => ("POST", r#"{"text":"a b","stream":true}"#),
        };
        let conn = match c {
            Client::CloseReadToEof => "Connection: close\r\n",
            Client::LeaveAtLastByte => "",
        };
        let req = format!(
            "{method} /generate HTTP/1.1\r\nHost: x\r\n{conn}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut got = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            if matches!(c, Client::LeaveAtLastByte) && complete(&got, f) {
                return got; // dropped here: closed right after the last byte
            }
            let n = s.read(&mut chunk).await.unwrap();
            if n == 0 {
                return got;
            }
            got.extend_from_slice(&chunk[..n]);
        }
    }

    /// The whole answer is in `got` (the proxy answers chunked unless the length is known).
    fn complete(got: &[u8], f: Framing) -> bool {
        let Some(head_end) = memchr::memmem::find(got, b"\r\n\r\n") else {
            return false;
        };
        match f {
            Framing::NoContent | Framing::Head => true,
            Framing::Length => got.len() - (head_end + 4) == JSON.len(),
            _ => got.ends_with(b"0\r\n\r\n"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_proxied_request_is_recorded_once_before_its_client_has_the_last_byte() {
        let dir = std::env::temp_dir().join(format!("sglsup-once-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut n = 0;
        for f in [
            Framing::Length,
            Framing::Chunked,
            Framing::ChunkedThenClose,
            Framing::Eof,
            Framing::NoContent,
            Framing::Head,
        ] {
            let upstream = server(f).await;
            let log_path = dir.join(format!("{f:?}.jsonl"));
            let log = std::fs::File::create(&log_path).unwrap();
            let stats = Arc::new(crate::report::RequestStats::default());
            let metrics = ProxyMetrics::register(&mut Default::default());
            let proxy = start(
                "127.0.0.1:0",
                &format!("http://{upstream}"),
                None,
                metrics,
                stats.clone(),
                Some(log),
                None,
            )
            .await
            .unwrap();
            let mut asked = 0;
            for c in [Client::CloseReadToEof, Client::LeaveAtLastByte] {
                for _ in 0..20 {
                    let got = ask(proxy, c, f).await;
                    assert!(
                        complete(&got, f),
                        "{f:?} {c:?}: {}",
                        String::from_utf8_lossy(&got)
                    );
                    asked += 1;
                    // No wait: the record is there by the time the client has its answer.
                    let lines = std::fs::read_to_string(&log_path).unwrap();
                    let recs: Vec<Value> = lines
                        .lines()
                        .map(|l| serde_json::from_str(l).unwrap())
                        .collect();
                    assert_eq!(recs.len(), asked, "{f:?} {c:?}: {lines}");
                    let last = &recs[asked - 1];
                    assert!(last.get("error").is_none(), "{f:?} {c:?}: {last}");
                    let run = stats.run_summary(None).unwrap();
                    assert_eq!(run["completed"], asked, "{f:?} {c:?}: {run}");
                    assert_eq!(run["errors"], 0, "{f:?} {c:?}: {run}");
                    n += 1;
                }
            }
            // Nothing more comes later (a second record at drop, say).
            tokio::time::sleep(Duration::from_millis(100)).await;
            let lines = std::fs::read_to_string(&log_path).unwrap().lines().count();
            assert_eq!(lines, asked, "{f:?}: records after the answers");
        }
        assert_eq!(n, 240);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// SGLang sends one chunk per event; a client parses what it is sent. Chunks that arrive in
    /// one read (here all of them, in one write) reach the client as the server framed them, byte
    /// for byte on the wire (but the hex case of the sizes): not joined into one chunk.
    #[tokio::test]
    async fn chunks_that_arrive_together_reach_the_client_framed_as_the_server_framed_them() {
        let upstream = server(Framing::Chunked).await;
        let metrics = ProxyMetrics::register(&mut Default::default());
        let stats = Arc::new(crate::report::RequestStats::default());
        let proxy = start(
            "127.0.0.1:0",
            &format!("http://{upstream}"),
            None,
            metrics,
            stats,
            None,
            None,
        )
        .await
        .unwrap();
        let got = ask(proxy, Client::CloseReadToEof, Framing::Chunked).await;
        let (sent, _) = answer(Framing::Chunked);
        let body = |b: &[u8]| b[memchr::memmem::find(b, b"\r\n\r\n").unwrap() + 4..].to_vec();
        // hyper writes a chunk's size in upper-case hex, h11 (uvicorn) in lower-case.
        assert_eq!(
            String::from_utf8_lossy(&body(&got)).to_lowercase(),
            String::from_utf8_lossy(&body(&sent)).to_lowercase()
        );
    }

    /// An upstream the proxy cannot use is said as such, not as a failure to listen (which
    /// would send the user to --proxy-addr).
    #[tokio::test]
    async fn an_upstream_without_a_host_is_named_as_the_upstream_not_as_the_listen_address() {
        let metrics = ProxyMetrics::register(&mut Default::default());
        let stats = Arc::new(crate::report::RequestStats::default());
        for (url, says) in [("/generate", "names no host"), ("http://[::1", "not a URL")] {
            let e = start(
                "127.0.0.1:0",
                url,
                None,
                metrics.clone(),
                stats.clone(),
                None,
                None,
            )
            .await
            .unwrap_err();
            let msg = e.to_string();
            assert!(matches!(e, ProxyError::Upstream { .. }), "{url}: {msg}");
            assert!(msg.contains(url) && msg.contains(says), "{url}: {msg}");
            assert!(
                !msg.contains("--proxy-addr") && !e.addr_in_use(),
                "{url}: {msg}"
            );
        }
    }
}
