//! The passive tap: the server's requests measured from a copy of its TCP traffic, with nothing
//! between the benchmark client and the server.
//!
//! Any hop costs each event a send and a receive more (6.6 µs of kernel work on the dev VM, 10–14
//! µs for a relay that does nothing on the H200 host: BENCHMARKS.md "Below the floor"), paid on
//! the latency the benchmark reports. The tap copies each segment of the server's port into a
//! ring the kernel shares with it ([`ring`]); one thread wakes per block of segments, puts each
//! connection's bytes back in order ([`tcp`]), reads HTTP/1.1 from them ([`http`]) and measures
//! each generation request exactly as the proxy does ([`crate::proxy`]'s recorder and SSE scan),
//! with the kernel's time stamp of each segment as its time. The tap cannot change a request,
//! so an OpenAI stream whose client did not ask for usage has no token counts (absent, never
//! guessed). Segments the ring had no room for are counted; a connection that lost bytes ends
//! its open requests as errors and is not read further.
mod boost;
pub mod http;
pub mod ring;
pub mod tcp;

use crate::proxy::{Api, EventStream, Held, Ledger, ProxyMetrics, Recorder, Sink, Started};
use crate::report::{RequestStats, Settle};
use http::{Exchange, Http};
use hyper::body::Bytes;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use ring::{Interface, Packet, Ring};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tcp::{End, Segment, Stream};

/// Connections followed at once; past it new ones are not measured (and counted).
const MAX_CONNECTIONS: usize = 1 << 16;
/// Why a connection's open requests end when segments of it were lost.
const LOST: &str = "the tap lost segments of this connection (its ring was full)";
/// A connection silent this long with nothing open is forgotten.
const IDLE: Duration = Duration::from_secs(600);

#[derive(Debug, thiserror::Error)]
pub enum TapError {
    #[error("cannot tap port {port} on {iface}: {error}{hint}", hint = hint(.error))]
    Open {
        port: u16,
        iface: String,
        error: std::io::Error,
    },
    #[error("cannot start the tap's thread: {0}")]
    Thread(std::io::Error),
}

fn hint(e: &std::io::Error) -> &'static str {
    if e.kind() == std::io::ErrorKind::PermissionDenied {
        " (the tap needs CAP_NET_RAW: run as root, in a container with NET_RAW (Docker's default), \
         or `setcap cap_net_raw+ep` on the binary; or measure with --proxy-addr instead)"
    } else {
        ""
    }
}

/// The tap's own series: what it could not see.
#[derive(Clone, Debug, Default)]
pub struct TapMetrics {
    /// Segments the kernel dropped because the ring was full.
    pub dropped_packets: Counter,
    /// Connections whose bytes could not all be read (lost segments, not HTTP, too many).
    pub unread_connections: Counter,
}

impl TapMetrics {
    pub fn register(registry: &mut Registry) -> Arc<TapMetrics> {
        let m = TapMetrics::default();
        registry.register(
            "tap_dropped_packets",
            "Segments of the server's port the tap's ring had no room for",
            m.dropped_packets.clone(),
        );
        registry.register(
            "tap_unread_connections",
            "Connections to the server the tap could not read whole (their open requests end as errors)",
            m.unread_connections.clone(),
        );
        Arc::new(m)
    }
}

/// Running until dropped.
pub struct TapHandle {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TapHandle {
    /// Stops the tap after it has read every segment already copied (and waits for that).
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for TapHandle {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Ring size in MiB, from `SGLANG_SUPERVISOR_TAP_RING_MB` (default 32: a third of a second of a
/// fast server's streams at 100 MB/s, and at least 2 s of a slow one's, blocks being handed over
/// every [`ring::BLOCK_TIMEOUT_MS`] at the latest).
fn ring_blocks() -> usize {
    let mb = std::env::var("SGLANG_SUPERVISOR_TAP_RING_MB")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|&n: &usize| (1..=4096).contains(&n))
        .unwrap_or(32);
    mb * ring::BLOCKS_PER_MB
}

/// Where the tap is ready to measure (`--tap`): the server's port, the interface, and where
/// finished requests go (as for the proxy).
pub struct TapConfig {
    pub port: u16,
    pub iface: String,
    pub metrics: Arc<ProxyMetrics>,
    pub stats: Arc<RequestStats>,
    pub requests_log: Option<std::fs::File>,
    pub traffic_window: Option<sglang_probes::sampler::SamplerHandle>,
    pub tap_metrics: Arc<TapMetrics>,
}

/// Opens the tap on the server's port now, and reads it on a thread of its own.
pub fn start(cfg: TapConfig) -> Result<TapHandle, TapError> {
    let TapConfig {
        port,
        iface,
        metrics,
        stats,
        requests_log,
        traffic_window,
        tap_metrics,
    } = cfg;
    let ledger = Ledger::new(metrics, stats.clone(), requests_log, traffic_window);
    let read_through = Arc::new(AtomicU64::new(0));
    let seen = read_through.clone();
    stats.settle_with(Settle(Box::new(move |end| settle(&seen, end))));
    let ring = Ring::open(port, &Interface::parse(&iface), ring_blocks())
        .map_err(|error| TapError::Open { port, iface, error })?;
    let stop = Arc::new(AtomicBool::new(false));
    let halt = stop.clone();
    let reader = Reader {
        conns: Connections::new(port, ledger, tap_metrics.clone()),
        tap_metrics,
        read_through,
    };
    let thread = std::thread::Builder::new()
        .name("tap".into())
        .spawn(move || reader.run(ring, &halt))
        .map_err(TapError::Thread)?;
    Ok(TapHandle {
        stop,
        thread: Some(thread),
    })
}

/// How long a block of segments may wait in the ring before the kernel hands it over
/// ([`ring::BLOCK_TIMEOUT_MS`]), and a margin for the timer.
const HANDOVER: Duration = Duration::from_millis(ring::BLOCK_TIMEOUT_MS as u64 + 2);
/// A window's close waits at most this long for the tap to have read up to it.
const MAX_SETTLE: Duration = Duration::from_millis(200);

/// Waits until the tap has read every segment stamped before `end` (unix seconds), or gives up
/// after [`MAX_SETTLE`] (a ring that never empties).
fn settle(read_through: &AtomicU64, end: f64) {
    let want = (end * 1e9) as u64;
    let deadline = Instant::now() + MAX_SETTLE;
    while read_through.load(Ordering::Acquire) < want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The tap's thread: the ring read block by block into the connections.
struct Reader {
    conns: Connections,
    tap_metrics: Arc<TapMetrics>,
    /// Every segment stamped before this (unix ns) has been read.
    read_through: Arc<AtomicU64>,
}

impl Reader {
    fn run(mut self, mut ring: Ring, stop: &AtomicBool) {
        let mut last_check = Instant::now();
        let mut boost = boost::Boost::new();
        loop {
            let stopping = stop.load(Ordering::SeqCst);
            // The clocks are read once per block: a segment's monotonic time is derived from
            // its wall-clock stamp (the recorder's times are monotonic).
            let (now_wall, now) = (SystemTime::now(), Instant::now());
            let wait = if stopping {
                HANDOVER
            } else {
                Duration::from_millis(20)
            };
            let conns = &mut self.conns;
            let read = ring.next_block(wait, |p| conns.packet(p, now_wall, now));
            // No block waiting: every block handed over is read, and the one being filled holds
            // only what came in the last hand-over time. Checked after every block, not only
            // after an idle wait: while other streams run a block comes every few milliseconds,
            // the wait never ends idle, and each window close waited its whole limit.
            let checked = SystemTime::now();
            let waiting = ring.block_waiting();
            boost.after_pass(waiting);
            if !waiting {
                let upto = checked.checked_sub(HANDOVER).map_or(0, unix_nanos);
                self.read_through.fetch_max(upto, Ordering::Release);
            }
            match read {
                Ok(true) => {}
                Ok(false) => {
                    if stopping {
                        break;
                    }
                }
                Err(e) => {
                    tracing::error!("tap: reading the ring: {e}; the tap stops");
                    break;
                }
            }
            if last_check.elapsed() >= Duration::from_secs(1) {
                last_check = Instant::now();
                let drops = ring.drops();
                if drops > 0 {
                    tracing::warn!("tap: the ring had no room for {drops} segments (raise SGLANG_SUPERVISOR_TAP_RING_MB)");
                    self.tap_metrics.dropped_packets.inc_by(drops);
                }
                self.conns.forget_idle(Instant::now());
            }
        }
        self.read_through.store(u64::MAX, Ordering::Release);
        self.conns
            .close_all("the tap stopped while the request was open");
    }
}

/// When a segment passed, in both clocks.
#[derive(Clone, Copy)]
struct Stamp {
    at: Instant,
    unix: f64,
}

impl Stamp {
    fn of(at: SystemTime, now_wall: SystemTime, now: Instant) -> Stamp {
        let mono = match now_wall.duration_since(at) {
            Ok(ago) => now.checked_sub(ago).unwrap_or(now),
            Err(ahead) => now + ahead.duration(),
        };
        let unix = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        Stamp { at: mono, unix }
    }
}

/// A measured answer being read.
struct Answer {
    rec: Recorder,
    events: EventStream,
    stream: bool,
}

/// One client connection to the server.
struct Conn {
    up: Stream,
    down: Stream,
    http: Exchange,
    /// One entry per request read and not yet answered, in order; None: not measured.
    open: VecDeque<Option<Started>>,
    answer: Option<Answer>,
    /// When the head being gathered began (its first segment's time).
    head_began: Option<Stamp>,
    last_seen: Instant,
    /// Not read any more (lost bytes, not HTTP): its packets are ignored until it closes.
    unread: bool,
    /// Bytes were waiting behind a hole at the last check.
    hole_seen: bool,
}

struct Connections {
    port: u16,
    map: HashMap<(End, End), Conn>,
    ledger: Arc<Ledger>,
    metrics: Arc<ProxyMetrics>,
    tap_metrics: Arc<TapMetrics>,
}

impl Connections {
    fn new(port: u16, ledger: Arc<Ledger>, tap_metrics: Arc<TapMetrics>) -> Self {
        let metrics = ledger.metrics().clone();
        Connections {
            port,
            map: HashMap::new(),
            ledger,
            metrics,
            tap_metrics,
        }
    }

    fn packet(&mut self, p: Packet<'_>, now_wall: SystemTime, now: Instant) {
        let Some(seg) = tcp::segment(p.ip) else {
            return;
        };
        // The server's end: the one on its port (a client on the same port number as the
        // server, on another host, reads as the client).
        let to_server = seg.dst.port == self.port;
        let key = if to_server {
            (seg.src, seg.dst)
        } else {
            (seg.dst, seg.src)
        };
        let at = Stamp::of(p.at, now_wall, now);
        if seg.syn && !seg.ack && to_server {
            self.opened(key, &seg, at.at);
            return;
        }
        let Some(conn) = self.map.get_mut(&key) else {
            return; // begun before the tap, forgotten, or not the server's
        };
        conn.last_seen = at.at;
        if conn.unread && !(seg.rst || seg.fin) {
            return;
        }
        if seg.syn && !to_server {
            conn.down.start(seg.seq);
        }
        let client_was_open = !conn.up.closed;
        let gone = if p.truncated {
            Some("the tap could not copy a whole segment")
        } else {
            self.read(&key, &seg, to_server, at)
        };
        let Some(conn) = self.map.get_mut(&key) else {
            return;
        };
        if let Some(why) = gone {
            if !conn.unread {
                conn.unread = true;
                self.tap_metrics.unread_connections.inc();
                conn.end_all(&self.ledger, why);
            }
        }
        // The client's FIN read in order, or its RST: it left, and what it left open ends now,
        // as the proxy records it. These waited for the server's next segment (its answer
        // drawing the client's RST, or its close: a 502 "server closed") and were stamped then.
        if to_server && ((client_was_open && conn.up.closed) || seg.rst) {
            conn.client_left(&self.ledger);
        }
        if seg.rst || (conn.up.closed && conn.down.closed) {
            if let Some(mut c) = self.map.remove(&key) {
                let why = if seg.rst {
                    "the connection was reset"
                } else {
                    "the connection closed before the answer ended"
                };
                c.end_all(&self.ledger, why);
            }
        }
    }

    fn opened(&mut self, key: (End, End), seg: &Segment<'_>, at: Instant) {
        if let Some(mut old) = self.map.remove(&key) {
            old.end_all(&self.ledger, "the connection was replaced by a new one");
        }
        if self.map.len() >= MAX_CONNECTIONS {
            self.tap_metrics.unread_connections.inc();
            return;
        }
        let mut up = Stream::default();
        up.start(seg.seq);
        self.map.insert(
            key,
            Conn {
                up,
                down: Stream::default(),
                http: Exchange::default(),
                open: VecDeque::new(),
                answer: None,
                head_began: None,
                last_seen: at,
                unread: false,
                hole_seen: false,
            },
        );
    }

    /// A segment's bytes into its connection; returns why the connection cannot be read further.
    fn read(
        &mut self,
        key: &(End, End),
        seg: &Segment<'_>,
        to_server: bool,
        at: Stamp,
    ) -> Option<&'static str> {
        let conn = self.map.get_mut(key)?;
        let (ledger, metrics) = (&self.ledger, &self.metrics);
        let Conn {
            up,
            down,
            http,
            open,
            answer,
            head_began,
            ..
        } = conn;
        let read = if to_server {
            // A request's time is that of the segment its head began in.
            let mut began = match head_began {
                Some(b) if http.client_mid_head() => *b,
                _ => at,
            };
            let r = up.accept(seg.seq, seg.payload, seg.fin, &mut |bytes| {
                http.client_bytes(bytes, &mut |h| {
                    if let Http::Request { path, .. } = h {
                        open.push_back(measured(ledger, path, began));
                        began = at;
                    }
                })
            });
            *head_began = Some(began);
            r
        } else {
            let was_closed = down.closed;
            let r = down.accept(seg.seq, seg.payload, seg.fin, &mut |bytes| {
                http.server_bytes(bytes, &mut |h| {
                    on_answer(h, open, answer, ledger, metrics, at)
                })
            });
            // Once, at the FIN: the server's later segments (ACKs of the client's FIN) are no
            // second close.
            if down.closed && !was_closed && r.is_ok() {
                let cut =
                    http.server_closed(&mut |h| on_answer(h, open, answer, ledger, metrics, at));
                if let Some(a) = answer.take() {
                    let why = cut.then(|| "the server closed the connection mid-answer".into());
                    finish(a, at.at, why);
                }
                for s in open.drain(..).flatten() {
                    ledger.failed(
                        s,
                        502,
                        "the server closed the connection before answering".into(),
                    );
                }
            }
            r
        };
        if read.is_err() {
            return Some(LOST);
        }
        // A server that closed its side ended the connection's HTTP, it did not make it
        // unreadable: counting it made every `Connection: close` request (and each of the
        // supervisor's own probes) an unread connection in tap_unread_connections_total.
        match http.lost() {
            None | Some(http::Unreadable::ServerClosed) => None,
            Some(_) => Some("the connection's bytes are not HTTP/1.1 the tap can read"),
        }
    }

    /// Called about once a second: connections silent for [`IDLE`] are forgotten, and one whose
    /// hole (a segment the ring had no room for) was already there a check ago stops being read.
    fn forget_idle(&mut self, now: Instant) {
        let (ledger, tap_metrics) = (&self.ledger, &self.tap_metrics);
        for c in self.map.values_mut().filter(|c| !c.unread) {
            let hole = c.up.has_hole() || c.down.has_hole();
            if hole && c.hole_seen {
                c.unread = true;
                tap_metrics.unread_connections.inc();
                c.end_all(ledger, LOST);
            }
            c.hole_seen = hole;
        }
        self.map.retain(|_, c| {
            let idle = now.saturating_duration_since(c.last_seen) > IDLE;
            if idle {
                c.end_all(ledger, "the connection went silent");
            }
            !idle
        });
    }

    fn close_all(&mut self, why: &'static str) {
        for (_, mut c) in self.map.drain() {
            c.end_all(&self.ledger, why);
        }
    }
}

impl Conn {
    /// The client closed its side with requests open: it left (a FIN is a disconnect to the
    /// server too: uvicorn reads it so, and SGLang aborts the request), with the proxy's errors.
    fn client_left(&mut self, ledger: &Ledger) {
        if let Some(a) = self.answer.take() {
            finish(a, self.last_seen, Some("client disconnected".into()));
        }
        for s in self.open.drain(..).flatten() {
            ledger.failed(s, 499, "client disconnected before the response".into());
        }
    }

    /// Every open request ends as an error (`why`), the one being answered too.
    fn end_all(&mut self, ledger: &Ledger, why: &str) {
        if let Some(a) = self.answer.take() {
            finish(a, self.last_seen, Some(why.to_string()));
        }
        for s in self.open.drain(..).flatten() {
            ledger.failed(s, 499, why.to_string());
        }
    }
}

/// A request whose head was read: measured when its path is a generation endpoint.
fn measured(ledger: &Ledger, path: &str, began: Stamp) -> Option<Started> {
    let (endpoint, api) = crate::proxy::measured_endpoint(path)?;
    ledger.enter();
    Some(Started {
        endpoint,
        api,
        sent: began.at,
        sent_unix: began.unix,
        in_flight: Held::enter(),
    })
}

fn on_answer(
    h: Http<'_>,
    open: &mut VecDeque<Option<Started>>,
    answer: &mut Option<Answer>,
    ledger: &Arc<Ledger>,
    metrics: &Arc<ProxyMetrics>,
    at: Stamp,
) {
    match h {
        Http::Request { .. } => {}
        Http::Answer { status, stream } => {
            if let Some(Some(started)) = open.pop_front() {
                let api: Api = started.api;
                let sink: Arc<dyn Sink> = ledger.clone();
                let rec = Recorder::new(sink, metrics.clone(), started, status, stream);
                *answer = Some(Answer {
                    rec,
                    events: EventStream::new(api, false),
                    stream,
                });
            }
        }
        Http::Body(data) => {
            if let Some(a) = answer {
                a.rec.on_frame(data, at.at);
                if a.stream {
                    let rec = &mut a.rec;
                    a.events
                        .pass(Bytes::copy_from_slice(data), |e| rec.on_event(e, at.at));
                }
            }
        }
        Http::End => {
            if let Some(a) = answer.take() {
                finish(a, at.at, None);
            }
        }
    }
}

fn finish(mut a: Answer, at: Instant, error: Option<String>) {
    let rec = &mut a.rec;
    let _ = a.events.finish(|e| rec.on_event(e, at));
    a.rec.finish(error);
}
