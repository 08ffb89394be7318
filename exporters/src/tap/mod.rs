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
mod copies;
pub mod http;
pub mod ring;
pub mod tcp;

use crate::proxy::{
    Api, EventStream, Held, Ledger, ProxyMetrics, Recorder, Sink, Started, CLIENT_LEFT,
    CLIENT_LEFT_EARLY,
};
use crate::report::{RequestStats, Settle};
use copies::Copies;
use http::{Exchange, Http};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use ring::{Interface, Packet, Ring};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tcp::{End, Segment, Stream};

/// Connections followed at once; past it new ones are not measured (and counted).
const MAX_CONNECTIONS: usize = 1 << 16;
/// Bytes kept across all connections at most: segments held behind holes, heads that came in
/// pieces, and open requests' entries. Each connection's own bounds (8 MiB behind a hole per
/// direction, 64 KiB per head) times [`MAX_CONNECTIONS`] would be terabytes.
const MAX_BUFFERED: usize = 64 << 20;
/// Requests open on one connection at most (pipelined and not yet answered).
const MAX_OPEN: usize = 4096;
/// After a pass for room that freed nothing, how long until the next one.
const ROOM_PASS_AFTER_NONE: Duration = Duration::from_millis(100);
/// Why a connection's open requests end when the tap's memory for it ran out.
const FULL: &str = "the tap's memory for held segments and unfinished heads was full; this \
                    connection was not read further";
/// Why a connection's open requests end when too many were pipelined.
const TOO_MANY_OPEN: &str = "more than 4096 requests were open on the connection at once; the tap \
                             stopped reading it";
/// Checks (one a second) that a hole may stay at one place before it is taken for a loss.
const HOLE_CHECKS: u32 = 3;
/// Why a connection's open requests end when segments of it were lost.
const LOST: &str = "the tap lost segments of this connection (its ring was full)";
/// Why, when bytes never came and the ring dropped nothing while the connection was open (lost
/// before the tap: a receive backlog's drop, or on the wire with `--tap-interface any`).
const MISSED: &str = "bytes of this connection never passed the tap (its ring dropped none)";
/// A connection silent this long with nothing open is forgotten (a keep-alive connection reused
/// after it is joined again at its next request; the table's size is bounded apart, by
/// [`MAX_CONNECTIONS`]).
const IDLE: Duration = Duration::from_secs(3600);

#[derive(Debug, thiserror::Error)]
pub enum TapError {
    #[error("cannot tap port {port} on {iface}: {error}{hint}", hint = hint(.error))]
    Open {
        port: u16,
        iface: String,
        error: std::io::Error,
    },
    #[error("cannot start the tap's thread: {0}{hint}", hint = sglang_probes::sync::start_hint(.0))]
    Thread(std::io::Error),
    /// A tap setting from the environment that cannot be used: refused, not replaced by the
    /// default, so that a run never measures with a ring or readers other than those asked for.
    #[error("{0}: set it within that range, or unset it for the default")]
    Setting(String),
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
    /// Translated copies of connections followed (on every interface): not followed.
    pub copied_connections: Counter,
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
        registry.register(
            "tap_copied_connections",
            "Connections to the server's port not measured because, with --tap-interface any, they were the address-translated (DNAT, SNAT, masquerade) copies of connections measured: the same first sequence number with the same TCP timestamp or client port, another client or server address",
            m.copied_connections.clone(),
        );
        Arc::new(m)
    }
}

/// Running until dropped.
pub struct TapHandle {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// Segments of the port read, by every reader.
    segments: Arc<AtomicU64>,
    port: u16,
    iface: String,
}

/// What a stopped tap read over its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TapRead {
    pub port: u16,
    pub iface: String,
    /// Segments of the port (payload, SYN, FIN or RST). None read: the interface never carried the
    /// port's traffic, not even the supervisor's own readiness request.
    pub segments: u64,
}

impl TapHandle {
    /// Stops the tap after it has read every segment already copied (and waits for that).
    pub fn stop(mut self) -> TapRead {
        self.halt();
        TapRead {
            port: self.port,
            iface: std::mem::take(&mut self.iface),
            segments: self.segments.load(Ordering::Relaxed),
        }
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for TapHandle {
    fn drop(&mut self) {
        self.halt();
    }
}

/// A whole number from 1 to `max` read from the environment variable `var` (unset: `default`).
struct Setting {
    var: &'static str,
    max: usize,
    default: usize,
    /// What the number is, for the refusal: "a count".
    what: &'static str,
}

impl Setting {
    fn read(&self) -> Result<usize, TapError> {
        let set = std::env::var(self.var).ok();
        self.parse(set.as_deref()).map_err(TapError::Setting)
    }

    /// The value `set` (`None`: unset), or why it cannot be used.
    fn parse(&self, set: Option<&str>) -> Result<usize, String> {
        let Some(v) = set else {
            return Ok(self.default);
        };
        match v.trim().parse::<usize>() {
            Ok(n) if (1..=self.max).contains(&n) => Ok(n),
            _ => Err(format!(
                "{}={v:?} is not {} from 1 to {}",
                self.var, self.what, self.max
            )),
        }
    }
}

/// Ring size in MiB (default 32: a third of a second of a fast server's streams at 100 MB/s, and
/// at least 2 s of a slow one's, blocks being handed over every [`ring::BLOCK_TIMEOUT_MS`] at the
/// latest).
const RING_MB: Setting = Setting {
    var: "SGLANG_SUPERVISOR_TAP_RING_MB",
    max: 4096,
    default: 32,
    what: "a size in MiB",
};

/// Readers: each reads a ring of its own of the ring's size, the connections hashed among them
/// by the kernel ([`Ring::open_group`]).
const READERS: Setting = Setting {
    var: "SGLANG_SUPERVISOR_TAP_READERS",
    max: 16,
    default: 1,
    what: "a count",
};

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
    let members = READERS.read()?;
    // Each reader's ring is the whole size (one connection's segments all go to one of them),
    // 4 GiB over all at most.
    let blocks = (RING_MB.read()? * ring::BLOCKS_PER_MB).min(4096 * ring::BLOCKS_PER_MB / members);
    let ledger = Ledger::new(metrics, stats.clone(), requests_log, traffic_window);
    let interface = Interface::parse(&iface);
    let open = || -> std::io::Result<_> {
        let (rings, from) = Ring::open_group(port, &interface, blocks, members).or_else(|e| {
            // A kernel that refuses the group: one reader does.
            if members == 1 || e.kind() != std::io::ErrorKind::Unsupported {
                return Err(e);
            }
            tracing::warn!("tap: {members} readers: {e}; one reader instead");
            Ring::open_group(port, &interface, blocks, 1)
        })?;
        let mut opened = Vec::with_capacity(rings.len());
        for ring in rings {
            let drops = ring.drop_counter()?;
            opened.push((ring, drops));
        }
        Ok((opened, from))
    };
    let (rings, from) = match open() {
        Ok(opened) => opened,
        Err(error) => return Err(TapError::Open { port, iface, error }),
    };
    let members = rings.len();
    let all_buffered = Arc::new(AtomicUsize::new(0));
    let read_through: Vec<Arc<AtomicU64>> =
        rings.iter().map(|_| Arc::new(AtomicU64::new(0))).collect();
    let seen = read_through.clone();
    stats.settle_with(Settle(Box::new(move |end| settle(&seen, end))));
    let stop = Arc::new(AtomicBool::new(false));
    let mut handle = TapHandle {
        stop: stop.clone(),
        threads: Vec::with_capacity(rings.len()),
        segments: Arc::new(AtomicU64::new(0)),
        port,
        iface,
    };
    // One table of the SYNs followed for every reader: a translated copy's segments may be
    // hashed to another reader than its original's.
    let followed = Arc::new(std::sync::Mutex::new(copies::Followed::default()));
    for (k, ((ring, drops), read_through)) in rings.into_iter().zip(read_through).enumerate() {
        let mut conns = Connections::new(
            port,
            ledger.clone(),
            tap_metrics.clone(),
            RingDrops::new(Box::new(drops)),
        );
        if interface == Interface::Any {
            conns.copies = Some(Copies::sharing(&followed));
        }
        conns.share(members, &all_buffered);
        let reader = Reader {
            conns,
            read_through,
            from,
            segments: handle.segments.clone(),
        };
        let halt = stop.clone();
        let name = if members > 1 {
            format!("tap-{k}")
        } else {
            "tap".into()
        };
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || reader.run(ring, &halt))
            .map_err(TapError::Thread)?;
        handle.threads.push(thread);
    }
    Ok(handle)
}

/// How long a block of segments may wait in the ring before the kernel hands it over
/// ([`ring::BLOCK_TIMEOUT_MS`]), with room for a timer that ticks in jiffies (10 ms at HZ=100)
/// and fires late on a busy host, and for a stamp taken before the segment reached the ring.
const HANDOVER: Duration = Duration::from_millis(2 * ring::BLOCK_TIMEOUT_MS as u64 + 10);
/// A window's close waits at most this long for the tap to have read up to it.
const MAX_SETTLE: Duration = Duration::from_millis(200);
/// A stop reads a ring that is behind for this long at most.
const MAX_DRAIN: Duration = Duration::from_secs(1);

/// Waits until every reader has read every segment stamped before `end` (unix seconds), or
/// gives up after [`MAX_SETTLE`] (a ring that never empties).
fn settle(read_through: &[Arc<AtomicU64>], end: f64) {
    let want = (end * 1e9) as u64;
    let deadline = Instant::now() + MAX_SETTLE;
    while read_through
        .iter()
        .any(|r| r.load(Ordering::Acquire) < want)
    {
        if Instant::now() >= deadline {
            tracing::warn!(
                "tap: a window closed before the tap had read up to its end (its ring is behind); requests that ended in the window's last moments may be missing from it"
            );
            return;
        }
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
    /// Every segment stamped before this (unix ns) has been read.
    read_through: Arc<AtomicU64>,
    /// Segments stamped before this are left: until its group was complete, each ring had them.
    /// None once one stamped after it was read (a wall clock stepped back must not blind it).
    from: Option<SystemTime>,
    /// Segments read, added once per block.
    segments: Arc<AtomicU64>,
}

impl Reader {
    fn run(mut self, mut ring: Ring, stop: &AtomicBool) {
        let mut last_check = Instant::now();
        let mut boost = boost::Boost::new(ring.blocks());
        // At a stop: when it was seen, and the count of blocks read by which everything that
        // passed before it is read (those waiting then, and the one being filled if a packet is
        // in it). Not until a pass finds nothing: a client writing every few milliseconds (or
        // retrying a dead server) keeps blocks coming, and the stop waited for it to end (30 s
        // in review); nor a fixed hand-over time, which a late kernel timer overruns. A ring
        // far behind, or a block the kernel never hands over, is waited for [`MAX_DRAIN`].
        let mut stop_seen: Option<(Instant, u64)> = None;
        loop {
            if stop_seen.is_none() && stop.load(Ordering::SeqCst) {
                let upto = ring.blocks_read() + ring.blocks_holding_the_past() as u64;
                stop_seen = Some((Instant::now(), upto));
            }
            let drained_too_long = stop_seen.is_some_and(|(t, _)| t.elapsed() >= MAX_DRAIN);
            // The clocks are read once per block: a segment's monotonic time is derived from
            // its wall-clock stamp (the recorder's times are monotonic).
            let (now_wall, now) = (SystemTime::now(), Instant::now());
            let wait = if stop_seen.is_some() {
                Duration::from_millis(ring::BLOCK_TIMEOUT_MS as u64)
            } else {
                Duration::from_millis(20)
            };
            let (conns, from) = (&mut self.conns, &mut self.from);
            ring.set_naps(boost.naps());
            let mut segments = 0;
            let read = ring.next_block(wait, |p| {
                segments += 1;
                if from.is_some_and(|f| p.at < f) {
                    return;
                }
                *from = None;
                conns.packet(p, now_wall, now);
            });
            if segments > 0 {
                self.segments.fetch_add(segments, Ordering::Relaxed);
            }
            self.after_pass(&ring, &mut boost);
            if let Err(e) = read {
                tracing::error!("tap: reading the ring: {e}; the tap stops");
                break;
            }
            if stop_seen.is_some_and(|(_, upto)| ring.blocks_read() >= upto) {
                break;
            }
            if drained_too_long {
                tracing::warn!(
                    "tap: stopped with blocks of segments still unread after {MAX_DRAIN:?} (its ring was behind); requests in them end as errors"
                );
                break;
            }
            if last_check.elapsed() >= Duration::from_secs(1) {
                last_check = Instant::now();
                boost.after_check(self.count_drops() > 0, last_check);
                self.conns.forget_idle(Instant::now());
                self.conns.warn_given_up();
            }
        }
        self.read_through.store(u64::MAX, Ordering::Release);
        self.conns
            .close_all("the tap stopped while the request was open");
        // What the tap gave up since the last check, said even for a run shorter than one.
        self.conns.warn_given_up();
        // The last second's drops too (a run's end is where a lagging ring overflows), those
        // read by the close included.
        self.count_drops();
    }

    /// What each pass leaves to check: whether the ring is read up (the window watermark and
    /// the drop baseline move only then) and how many blocks wait (the thread's priority).
    fn after_pass(&mut self, ring: &Ring, boost: &mut boost::Boost) {
        // No block waiting: every block handed over is read, and the one being filled holds
        // only what came in the last hand-over time. Checked after every block, not only
        // after an idle wait: while other streams run a block comes every few milliseconds,
        // the wait never ends idle, and each window close waited its whole limit.
        let checked = SystemTime::now();
        let waiting = ring.blocks_waiting(1);
        let queued = [boost.rt_at, boost.nice_at]
            .into_iter()
            .find(|&n| ring.blocks_waiting(n))
            .unwrap_or(waiting as usize);
        boost.after_pass(queued, Instant::now());
        if waiting {
            return;
        }
        // Stored, not raised to the maximum: after the wall clock steps back, a watermark left
        // ahead would let windows close without waiting.
        let upto = checked.checked_sub(HANDOVER).map_or(0, unix_nanos);
        self.read_through.store(upto, Ordering::Release);
        // The drop count, kept if the ring is still read up after it: every drop in it came
        // before any segment still unread, so a connection whose SYN is read later cannot have
        // its own drops in its baseline. Not read on busy passes (a system call that takes the
        // lock the kernel takes for every packet).
        let drops = self.conns.drops.total();
        if !ring.blocks_waiting(1) {
            self.conns.drops.settled = drops;
        }
    }

    /// Segments the kernel had no room for since the last count (the count resets as it is read).
    fn count_drops(&mut self) -> u64 {
        let drops = self.conns.drops.untold();
        if drops > 0 {
            // Measured on a 16-core host: at 512k segments a second one reader lost segments
            // whatever its ring, four kept every one (BENCHMARKS.md, "The tap's readers").
            tracing::warn!(
                "tap: the ring had no room for {drops} segments: for a sustained rate read with more \
                 threads (SGLANG_SUPERVISOR_TAP_READERS=4), for bursts raise SGLANG_SUPERVISOR_TAP_RING_MB"
            );
            self.conns.tap_metrics.dropped_packets.inc_by(drops);
        }
        drops
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
    /// Where each direction waited behind a hole at the last check, and for how many checks
    /// running it has waited at the same place.
    hole: (Option<u32>, Option<u32>, u32),
    /// The client has sent bytes.
    used: bool,
    /// The ring's drop total when the connection opened: whether a hole in it can be the
    /// ring's doing.
    drops_at_open: u64,
    /// Its SYN's sequence number; None when it was joined: followed from a request, not from
    /// its SYN (it opened before the tap, or was forgotten).
    syn: Option<u32>,
}

/// The ring's dropped segments. The kernel resets its count as it is read, so this one reader
/// keeps the total: read where a hole must be told from a client leaving, and once a second for
/// the warning and the metric.
struct RingDrops {
    read: Box<dyn FnMut() -> u64 + Send>,
    total: u64,
    told: u64,
    /// The total at the last moment the ring was read up: a new connection's baseline
    /// (`drops_at_open`). The running total would not do: a ring behind drops a connection's
    /// segments before its SYN is read.
    settled: u64,
}

impl RingDrops {
    fn new(read: Box<dyn FnMut() -> u64 + Send>) -> Self {
        RingDrops {
            read,
            total: 0,
            told: 0,
            settled: 0,
        }
    }

    /// Every drop so far (one system call).
    fn total(&mut self) -> u64 {
        self.total += (self.read)();
        self.total
    }

    /// The drops since the last call, for the warning.
    fn untold(&mut self) -> u64 {
        let total = self.total();
        total - std::mem::replace(&mut self.told, total)
    }
}

struct Connections {
    port: u16,
    map: HashMap<(End, End), Conn, tcp::KeyHasher>,
    /// What the connections keep ([`Conn::buffered`]), summed.
    buffered: usize,
    ledger: Arc<Ledger>,
    metrics: Arc<ProxyMetrics>,
    tap_metrics: Arc<TapMetrics>,
    /// Since the last warning: connections given up for memory, idle ones forgotten to make
    /// room, new ones not followed.
    over_memory: u64,
    evicted: u64,
    refused: u64,
    /// When a pass for room may run again, after one that freed nothing.
    next_room_pass: Option<Instant>,
    /// Passes for room run (each is one walk over the map).
    room_passes: u64,
    /// This reader's share of [`MAX_CONNECTIONS`] (a connection is one reader's whole).
    max_connections: usize,
    /// What all readers' connections keep, against [`MAX_BUFFERED`]: one connection may need
    /// most of it, whichever reader it was hashed to. This reader's part as last added in.
    all_buffered: Arc<AtomicUsize>,
    published: usize,
    drops: RingDrops,
    /// With the tap on every interface: the connections a copy would repeat ([`copies`]).
    copies: Option<Copies>,
}

impl Connections {
    fn new(port: u16, ledger: Arc<Ledger>, tap_metrics: Arc<TapMetrics>, drops: RingDrops) -> Self {
        let metrics = ledger.metrics().clone();
        Connections {
            port,
            map: HashMap::with_hasher(tcp::KeyHasher::new()),
            buffered: 0,
            ledger,
            metrics,
            tap_metrics,
            over_memory: 0,
            evicted: 0,
            refused: 0,
            next_room_pass: None,
            room_passes: 0,
            max_connections: MAX_CONNECTIONS,
            all_buffered: Arc::new(AtomicUsize::new(0)),
            published: 0,
            drops,
            copies: None,
        }
    }

    /// One of `readers`: a share of the connections each, and one count of held bytes for all.
    fn share(&mut self, readers: usize, all_buffered: &Arc<AtomicUsize>) {
        self.max_connections = MAX_CONNECTIONS / readers.max(1);
        self.all_buffered = all_buffered.clone();
    }

    /// Adds what this reader keeps now into the count for all readers (an atomic operation
    /// only when it changed: in-order streams keep nothing).
    fn publish(&mut self) {
        if self.buffered != self.published {
            if self.buffered > self.published {
                self.all_buffered
                    .fetch_add(self.buffered - self.published, Ordering::Relaxed);
            } else {
                self.all_buffered
                    .fetch_sub(self.published - self.buffered, Ordering::Relaxed);
            }
            self.published = self.buffered;
        }
    }

    /// A connection out of the map, what it kept taken off the sum.
    fn remove(&mut self, key: &(End, End)) -> Option<Conn> {
        let c = self.map.remove(key)?;
        self.buffered = self.buffered.saturating_sub(c.buffered());
        Some(c)
    }

    /// Says (one line each, at most once a check) what the tap gave up since the last call.
    fn warn_given_up(&mut self) {
        let port = self.port;
        let n = std::mem::take(&mut self.over_memory);
        if n > 0 {
            tracing::warn!(
                "tap: {n} connections to port {port} were no longer read: segments held behind \
                 holes and unfinished heads filled the tap's {} MiB (their open requests end as \
                 errors; see tap_unread_connections_total)",
                MAX_BUFFERED >> 20
            );
        }
        let n = std::mem::take(&mut self.evicted);
        if n > 0 {
            tracing::warn!(
                "tap: {n} idle connections to port {port} were forgotten to follow new ones \
                 ({} at most per reader; a connection flood?): they are measured again from \
                 their next request",
                self.max_connections
            );
        }
        if let Some(line) = self.copies.as_mut().and_then(|c| c.tell(self.port)) {
            tracing::warn!("{line}");
        }
        let n = std::mem::take(&mut self.refused);
        if n > 0 {
            tracing::warn!(
                "tap: {n} new connections to port {port} were not measured: {} connections \
                 with requests open are followed already (per reader)",
                self.max_connections
            );
        }
    }

    fn packet(&mut self, p: Packet<'_>, now_wall: SystemTime, now: Instant) {
        self.read_segment(p, now_wall, now);
        self.publish();
    }

    fn read_segment(&mut self, p: Packet<'_>, now_wall: SystemTime, now: Instant) {
        let Some(mut seg) = tcp::segment(p.ip) else {
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
            // A SYN sent again (its first copy passed the tap, then waited on a full listen
            // queue) is the same connection: reopening it would end a Fast Open request.
            let again = self.map.get(&key).is_some_and(|c| c.syn == Some(seg.seq));
            if again {
                self.resent(key, &seg, at.at);
            } else {
                if self.copy(key, seg.seq, &seg, at.at) {
                    // a connection on its ends whose close went unseen is over: not fed the
                    // copy's bytes
                    self.replaced(&key);
                    return;
                }
                if !self.opened(key, &seg, at.at) {
                    self.refused(key, seg.seq, &seg);
                    return;
                }
            }
            if seg.payload.is_empty() {
                return;
            }
            // TCP Fast Open: the request came in the SYN, its bytes numbered from the next one.
            seg.seq = seg.seq.wrapping_add(1);
            seg.syn = false;
        }
        let Some(conn) = self.map.get_mut(&key) else {
            if let Some(copies) = &mut self.copies {
                if copies.skipped(&key, &seg, to_server, at.at) {
                    return;
                }
            }
            // Begun before the tap, forgotten, or not the server's. A keep-alive connection is
            // followed from the next request it carries (the one in flight, if any, is not seen).
            if to_server && seg.ack && !(seg.syn || seg.rst) && http::starts_request(seg.payload) {
                // Joined on every interface, a translated copy carries the same request at the
                // same sequence number: known as the SYN's would be.
                let isn = seg.seq.wrapping_sub(1);
                if !self.copy(key, isn, &seg, at.at) {
                    if self.joined(key, &seg, at.at) {
                        self.read_segment(p, now_wall, now);
                    } else {
                        self.refused(key, isn, &seg);
                    }
                }
            }
            return;
        };
        conn.last_seen = at.at;
        if conn.unread {
            // Nothing of it is read or kept any more (reading a FIN's bytes held them again
            // behind the hole): its FINs, in whatever order, and its RST only say it is gone.
            let side = if to_server {
                &mut conn.up
            } else {
                &mut conn.down
            };
            side.closed |= seg.fin;
            // Either side's close will do: a FIN held behind the hole was forgotten with it,
            // and the connection waited an hour for a second one.
            if seg.rst || conn.up.closed || conn.down.closed {
                self.remove(&key);
            }
            return;
        }
        // Once: a SYN-ACK seen again (a retransmission, or forged) does not move the stream back.
        if seg.syn && !to_server && !conn.down.started() {
            conn.down.start(seg.seq);
        }
        // A connection joined at a request: the server's side from the answer's first byte, and
        // before it the tail of an answer from before the tap (a non-pipelining client sent this
        // request once that answer had come whole).
        if !to_server && conn.awaits_first_answer() {
            if http::starts_answer(seg.payload) {
                conn.down.start(seg.seq.wrapping_sub(1));
            } else {
                if seg.fin || seg.rst {
                    if let Some(mut c) = self.remove(&key) {
                        c.end_all(
                            &self.ledger,
                            "the connection closed before the answer ended",
                        );
                    }
                }
                return;
            }
        }
        let client_was_open = !conn.up.closed;
        let before = conn.buffered();
        let gone = if p.truncated {
            Some("the tap could not copy a whole segment")
        } else if !to_server && !conn.down.started() && !seg.payload.is_empty() {
            // An answer after a handshake whose SYN-ACK the ring had no room for (or never saw):
            // it cannot be read, and the requests would wait until the client left (a wrong 499).
            Some(conn.why_missing(self.drops.total()))
        } else {
            conn.read(&seg, to_server, at, &self.ledger, &self.metrics)
        };
        // What is kept is bounded across connections, not only per connection: the one that
        // grows past the bound is given up (and counted), the others read on.
        let after = conn.buffered();
        // Across readers: what the others keep, as they last added it in.
        let others = self
            .all_buffered
            .load(Ordering::Relaxed)
            .saturating_sub(self.published);
        let total = others + self.buffered.saturating_sub(before) + after;
        let gone = gone.or(if conn.open.len() > MAX_OPEN {
            Some(TOO_MANY_OPEN)
        } else if after > before && total > MAX_BUFFERED {
            self.over_memory += 1;
            Some(FULL)
        } else {
            None
        });
        if let Some(why) = gone {
            conn.give_up(&self.ledger, &self.tap_metrics.unread_connections, why);
        }
        if conn.awaits_first_answer() && conn.open.len() > 1 {
            // (the ring's count is a system call: read only here)
            conn.end_unseen_answers(&self.ledger, self.drops.total());
        }
        // The client's FIN read in order, or its RST: it left, and what it left open ends now,
        // as the proxy records it. These waited for the server's next segment (its answer
        // drawing the client's RST, or its close: a 502 "server closed") and were stamped then.
        // With a hole, and the ring dropping segments while the connection was open, the
        // client did not leave early: it had every byte, each of which passed the tap first.
        // A hole the ring did not make (a reordered segment, a receive backlog's drop that the
        // client has too) is no such evidence: the client left.
        if to_server && ((client_was_open && conn.up.closed) || seg.rst) {
            let drops = self.drops.total();
            // A joined connection whose answer never began, the ring dropping meanwhile: the
            // answer was lost (the client had it, and closed its pooled connection later).
            let unseen = conn.awaits_first_answer() && conn.ring_dropped(drops);
            if conn.lost_to_the_ring(drops) || (unseen && conn.has_open()) {
                conn.give_up(&self.ledger, &self.tap_metrics.unread_connections, LOST);
            } else {
                conn.client_left(&self.ledger);
            }
        }
        // Counted once all of the above changed what it keeps.
        self.buffered = self.buffered.saturating_sub(before) + conn.buffered();
        if seg.rst || (conn.up.closed && conn.down.closed) {
            if let Some(mut c) = self.remove(&key) {
                let why = if seg.rst {
                    "the connection was reset"
                } else {
                    "the connection closed before the answer ended"
                };
                c.end_all(&self.ledger, why);
            }
        }
    }

    /// Whether a new connection is a translated copy of one followed (the tap on every
    /// interface): each counted once, its SYN seen again (on a bridge and its port) not.
    fn copy(&mut self, key: (End, End), isn: u32, seg: &Segment<'_>, at: Instant) -> bool {
        let Some(copies) = &mut self.copies else {
            return false;
        };
        let copy = copies.at_syn(key, copies::Ids::of(isn, seg), at);
        if copy == Some(true) {
            self.tap_metrics.copied_connections.inc();
        }
        copy.is_some()
    }

    /// A connection's SYN sent again: its copy may carry its new timestamp.
    fn resent(&mut self, key: (End, End), seg: &Segment<'_>, at: Instant) {
        if let Some(copies) = &mut self.copies {
            copies.resent(key, copies::Ids::of(seg.seq, seg), at);
        }
    }

    /// A new connection that could not be followed: its copy, if any, is not a copy.
    fn refused(&mut self, key: (End, End), isn: u32, seg: &Segment<'_>) {
        if let Some(copies) = &mut self.copies {
            copies.refused(key, copies::Ids::of(isn, seg));
        }
    }

    /// A SYN: its connection is followed (false when there is no room).
    fn opened(&mut self, key: (End, End), seg: &Segment<'_>, at: Instant) -> bool {
        self.replaced(&key);
        self.follow(key, seg.seq, at, false)
    }

    /// A new connection's SYN on `key`'s ends: the one followed there, if any, is over.
    fn replaced(&mut self, key: &(End, End)) {
        if let Some(mut old) = self.remove(key) {
            old.end_all(&self.ledger, "the connection was replaced by a new one");
        }
    }

    /// A connection the tap did not see open, from the request that starts `seg`; false when
    /// there is no room to follow it. A client that pipelined across the tap's start (sent a
    /// request before it and this one right after) has that first answer taken for this
    /// request's: no client in use pipelines.
    fn joined(&mut self, key: (End, End), seg: &Segment<'_>, at: Instant) -> bool {
        self.follow(key, seg.seq.wrapping_sub(1), at, true)
    }

    /// Follows a connection whose client's bytes start after `isn` (a SYN's sequence number);
    /// false when [`MAX_CONNECTIONS`] are followed and none could be forgotten.
    fn follow(&mut self, key: (End, End), isn: u32, at: Instant, joined: bool) -> bool {
        // A pass over a full map that freed nothing is not run again for a while: each would
        // cost a millisecond, for every segment of every connection that could not be followed.
        let full = self.max_connections;
        if self.map.len() >= full && self.next_room_pass.is_none_or(|t| at >= t) {
            self.make_room();
            self.next_room_pass = (self.map.len() >= full).then_some(at + ROOM_PASS_AFTER_NONE);
        }
        if self.map.len() >= full {
            // Counted once a connection: a SYN is; a joined connection's every request would be
            // (one not seen open was not counted before either).
            if !joined {
                self.refused += 1;
                self.tap_metrics.unread_connections.inc();
            }
            return false;
        }
        let mut up = Stream::default();
        up.start(isn);
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
                hole: (None, None, 0),
                used: false,
                drops_at_open: self.drops.settled,
                syn: (!joined).then_some(isn),
            },
        );
        true
    }

    /// At its share of [`MAX_CONNECTIONS`], up to a sixteenth of them with nothing open and
    /// nothing kept are forgotten: first those no longer read, then those whose client never sent a byte (a
    /// SYN flood or a port scan leaves only these), then idle keep-alive ones; oldest first.
    /// Refusing the new one instead let a flood of SYNs that are never followed up keep the
    /// tap from measuring any new connection for [`IDLE`]. Done in batches: one pass over the
    /// map for every sixteenth of them opened.
    fn make_room(&mut self) {
        self.room_passes += 1;
        let mut idle: Vec<(u8, Instant, (End, End))> = self
            .map
            .iter()
            .filter(|(_, c)| {
                c.unread || (!c.has_open() && c.buffered() == 0 && !c.http.answering())
            })
            .map(|(k, c)| {
                let rank = if c.unread { 0 } else { 1 + c.used as u8 };
                (rank, c.last_seen, *k)
            })
            .collect();
        let evict = (self.max_connections / 16).max(1);
        if idle.len() > evict {
            idle.select_nth_unstable_by_key(evict - 1, |e| (e.0, e.1));
            idle.truncate(evict);
        }
        for (rank, _, key) in idle {
            if let Some(mut c) = self.remove(&key) {
                c.end_all(
                    &self.ledger,
                    "the connection was forgotten to follow new ones",
                );
                if rank > 0 {
                    self.evicted += 1;
                    self.tap_metrics.unread_connections.inc();
                }
            }
        }
    }

    /// Called about once a second: connections silent for [`IDLE`] with nothing open are
    /// forgotten, and one whose hole (a segment the ring had no room for) has stayed at one place
    /// for [`HOLE_CHECKS`] checks stops being read.
    fn forget_idle(&mut self, now: Instant) {
        if let Some(copies) = &mut self.copies {
            copies.forget_idle(now, IDLE);
        }
        let drops = self.drops.total();
        let (ledger, tap_metrics) = (&self.ledger, &self.tap_metrics);
        let buffered = &mut self.buffered;
        for c in self.map.values_mut().filter(|c| !c.unread) {
            // A hole is a loss once the same place has waited three checks running (about 3
            // s): a client on another host gets a lost segment sent again within its RTO, and
            // two short holes in a row are no loss.
            let at = (c.up.hole_at(), c.down.hole_at());
            let checks = if at.0.is_none() && at.1.is_none() {
                0
            } else if (at.0, at.1) == (c.hole.0, c.hole.1) {
                c.hole.2 + 1
            } else {
                1
            };
            c.hole = (at.0, at.1, checks);
            if checks >= HOLE_CHECKS {
                *buffered = buffered.saturating_sub(c.buffered());
                c.give_up(
                    ledger,
                    &tap_metrics.unread_connections,
                    c.why_missing(drops),
                );
            }
        }
        self.map.retain(|_, c| {
            // A request may wait longer than any limit for its answer (a queued non-streamed
            // generation), and keep-alive probes are pure ACKs the filter drops: only a
            // connection with nothing open is forgotten for its silence.
            let idle = !c.has_open() && now.saturating_duration_since(c.last_seen) > IDLE;
            if idle {
                *buffered = buffered.saturating_sub(c.buffered());
                c.end_all(ledger, "the connection went silent");
            }
            !idle
        });
        self.publish();
    }

    /// Every connection's open requests end (`why`; lost segments for one with a hole that
    /// the ring may have made, which would never have been read through).
    fn close_all(&mut self, why: &'static str) {
        self.buffered = 0;
        self.publish();
        let drops = self.drops.total();
        for (_, mut c) in self.map.drain() {
            if c.lost_to_the_ring(drops) {
                c.give_up(&self.ledger, &self.tap_metrics.unread_connections, LOST);
            } else {
                c.end_all(&self.ledger, why);
            }
        }
    }
}

impl Conn {
    /// A segment's bytes into its connection; returns why the connection cannot be read further.
    fn read(
        &mut self,
        seg: &Segment<'_>,
        to_server: bool,
        at: Stamp,
        ledger: &Arc<Ledger>,
        metrics: &Arc<ProxyMetrics>,
    ) -> Option<&'static str> {
        let Conn {
            up,
            down,
            http,
            open,
            answer,
            head_began,
            used,
            ..
        } = self;
        let read = if to_server {
            *used |= !seg.payload.is_empty();
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
                    ledger.failed_at(
                        s,
                        502,
                        "the server closed the connection before answering".into(),
                        at.at,
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

    /// Joined, and no answer begun on it since: the server's side is not followed yet.
    fn awaits_first_answer(&self) -> bool {
        self.syn.is_none() && !self.down.started()
    }

    /// Bytes are missing before some it holds, in either direction.
    fn has_hole(&self) -> bool {
        self.up.has_hole() || self.down.has_hole()
    }

    /// A request is open on it (answered or waiting).
    fn has_open(&self) -> bool {
        self.answer.is_some() || !self.open.is_empty()
    }

    /// Whether the ring dropped segments since the connection's baseline (`drops`: its total
    /// now): only then can a hole in it be the ring's doing.
    fn ring_dropped(&self, drops: u64) -> bool {
        drops > self.drops_at_open
    }

    /// Why bytes it waits for never came.
    fn why_missing(&self, drops: u64) -> &'static str {
        if self.ring_dropped(drops) {
            LOST
        } else {
            MISSED
        }
    }

    /// Its open requests wait behind a hole the ring made: when its client leaves, or the tap
    /// stops, they end as lost segments.
    fn lost_to_the_ring(&self, drops: u64) -> bool {
        self.has_hole() && self.has_open() && self.ring_dropped(drops)
    }

    /// What it keeps beyond its own size: segments behind holes, heads that came in pieces, and
    /// its open requests' entries.
    fn buffered(&self) -> usize {
        self.up.held_bytes()
            + self.down.held_bytes()
            + self.http.buffered()
            + self.open.len() * std::mem::size_of::<Option<Started>>()
    }

    /// It is not read any more: its open requests end as errors (`why`), what it kept goes, and
    /// it is counted in `tap_unread_connections_total`.
    fn give_up(&mut self, ledger: &Ledger, unread: &Counter, why: &str) {
        unread.inc();
        self.unread = true;
        self.up.forget();
        self.down.forget();
        self.http = Exchange::default();
        self.end_all(ledger, why);
    }

    /// The client closed its side with requests open: it left (a FIN is a disconnect to the
    /// server too: uvicorn reads it so, and SGLang aborts the request), with the proxy's errors.
    fn client_left(&mut self, ledger: &Ledger) {
        self.end_with(ledger, CLIENT_LEFT, CLIENT_LEFT_EARLY);
    }

    /// Joined, no answer begun, and a second request read: a client that does not pipeline sent
    /// it after an answer the tap never saw (the ring dropped it, or the join was on a copy of
    /// a request answered before the tap). The older ones end; the newest is followed.
    fn end_unseen_answers(&mut self, ledger: &Ledger, drops: u64) {
        let why = self.why_missing(drops);
        while self.open.len() > 1 {
            if let Some(Some(s)) = self.open.pop_front() {
                ledger.failed_at(s, 499, why.to_string(), self.last_seen);
            }
        }
        self.http.keep_newest();
    }

    /// Every open request ends as an error (`why`), the one being answered too.
    fn end_all(&mut self, ledger: &Ledger, why: &str) {
        self.end_with(ledger, why, why);
    }

    /// The answer being read ends with `answering`, the requests not yet answered with
    /// `waiting` (status 499), at the connection's last segment.
    fn end_with(&mut self, ledger: &Ledger, answering: &str, waiting: &str) {
        if let Some(a) = self.answer.take() {
            finish(a, self.last_seen, Some(answering.to_string()));
        }
        for s in self.open.drain(..).flatten() {
            ledger.failed_at(s, 499, waiting.to_string(), self.last_seen);
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
                    a.events.read(data, |e| rec.on_event(e, at.at));
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
    a.rec.finish_at(error, at);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    const PORT: u16 = 30000;

    const LO: [u8; 4] = [127, 0, 0, 1];

    /// An IPv4 TCP segment between 127.0.0.1:`src` and 127.0.0.1:`dst`.
    fn packet(src: u16, dst: u16, seq: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
        packet4(LO, LO, src, dst, seq, flags, payload)
    }

    fn packet4(
        sip: [u8; 4],
        dip: [u8; 4],
        src: u16,
        dst: u16,
        seq: u32,
        flags: u8,
        payload: &[u8],
    ) -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 6, 0, 0];
        p.extend_from_slice(&sip);
        p.extend_from_slice(&dip);
        p.extend_from_slice(&src.to_be_bytes());
        p.extend_from_slice(&dst.to_be_bytes());
        p.extend_from_slice(&seq.to_be_bytes());
        p.extend_from_slice(&[0, 0, 0, 0, 5 << 4, flags, 0xff, 0xff, 0, 0, 0, 0]);
        p.extend_from_slice(payload);
        let len = p.len() as u16;
        p[2..4].copy_from_slice(&len.to_be_bytes());
        p
    }

    /// A [`packet4`] given a timestamp option (TSval `ts`), as Linux sends.
    fn stamped(mut p: Vec<u8>, ts: u32) -> Vec<u8> {
        let mut options = vec![1, 1, 8, 10];
        options.extend_from_slice(&ts.to_be_bytes());
        options.extend_from_slice(&[0; 4]);
        p[32] = 8 << 4;
        p.splice(40..40, options);
        let len = p.len() as u16;
        p[2..4].copy_from_slice(&len.to_be_bytes());
        p
    }

    const SYN: u8 = 0x02;
    const ACK: u8 = 0x10;
    const FIN: u8 = 0x01;
    const RST: u8 = 0x04;

    /// The tap's connections fed segments by hand, its records in a requests log.
    struct Wire {
        conns: Connections,
        /// Segments the ring "dropped": what the kernel's count would say next.
        dropped: Arc<AtomicU64>,
        log: std::path::PathBuf,
        t: SystemTime,
    }

    impl Wire {
        fn new(name: &str) -> Wire {
            let log = std::env::temp_dir().join(format!(
                "sglsup-tapunit-{name}-{}.jsonl",
                std::process::id()
            ));
            let file = std::fs::File::create(&log).unwrap();
            let metrics = ProxyMetrics::register(&mut Registry::default());
            let stats = Arc::new(RequestStats::default());
            let ledger = Ledger::new(metrics, stats, Some(file), None);
            let tap = Arc::new(TapMetrics::default());
            let dropped = Arc::new(AtomicU64::new(0));
            let count = dropped.clone();
            let drops = RingDrops::new(Box::new(move || count.swap(0, Ordering::SeqCst)));
            Wire {
                conns: Connections::new(PORT, ledger, tap, drops),
                dropped,
                log,
                t: SystemTime::now(),
            }
        }

        fn raw(&mut self, ip: &[u8]) {
            self.t += Duration::from_micros(100);
            let p = Packet {
                at: self.t,
                ip,
                truncated: false,
            };
            self.conns.packet(p, SystemTime::now(), Instant::now());
        }

        fn records(&self) -> Vec<Value> {
            std::fs::read_to_string(&self.log)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect()
        }

        fn unread(&self) -> u64 {
            self.conns.tap_metrics.unread_connections.get()
        }
    }

    impl Drop for Wire {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.log);
        }
    }

    /// One connection's two sequence spaces, as its client and server number them.
    struct Flow {
        port: u16,
        c: u32,
        s: u32,
    }

    impl Flow {
        /// The handshake (SYN, SYN-ACK, ACK).
        fn open(w: &mut Wire, port: u16, c: u32, s: u32) -> Flow {
            w.raw(&packet(port, PORT, c, SYN, b""));
            w.raw(&packet(PORT, port, s, SYN | ACK, b""));
            w.raw(&packet(port, PORT, c.wrapping_add(1), ACK, b""));
            Flow {
                port,
                c: c.wrapping_add(1),
                s: s.wrapping_add(1),
            }
        }

        /// A connection whose handshake the tap never saw (open before it started).
        fn unseen(port: u16) -> Flow {
            Flow {
                port,
                c: 5000,
                s: 9000,
            }
        }

        /// A connection whose request's answer waits behind a hole: the server's first byte
        /// never reached the tap (`ring_dropped`: because the ring had no room for it).
        fn holed(w: &mut Wire, port: u16, ring_dropped: bool) -> Flow {
            let mut f = Flow::open(w, port, 1000, 2000);
            f.client(w, 0, REQ);
            f.s += 1;
            if ring_dropped {
                w.dropped.fetch_add(1, Ordering::SeqCst);
            }
            f.server(w, 0, OK);
            f
        }

        fn client(&mut self, w: &mut Wire, flags: u8, data: &[u8]) {
            w.raw(&packet(self.port, PORT, self.c, ACK | flags, data));
            self.c = self
                .c
                .wrapping_add(data.len() as u32 + (flags & FIN) as u32);
        }

        fn server(&mut self, w: &mut Wire, flags: u8, data: &[u8]) {
            w.raw(&packet(PORT, self.port, self.s, ACK | flags, data));
            self.s = self
                .s
                .wrapping_add(data.len() as u32 + (flags & FIN) as u32);
        }
    }

    const REQ: &[u8] = b"POST /generate HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n{}";
    const OK: &[u8] =
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";

    #[test]
    fn a_plain_exchange_is_one_record() {
        let mut w = Wire::new("plain");
        let mut f = Flow::open(&mut w, 40000, u32::MAX - 10, 7);
        f.client(&mut w, 0, REQ);
        f.server(&mut w, 0, OK);
        let r = w.records();
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(r[0]["status"], 200);
        assert!(r[0]["error"].is_null(), "{r:?}");
    }

    /// A whole exchange on a connection between `c` and `s`, from its SYN (first sequence
    /// number `isn`), then a second request on it.
    fn exchange4(w: &mut Wire, (c, cport): ([u8; 4], u16), s: [u8; 4], isn: u32) {
        w.raw(&packet4(c, s, cport, PORT, isn, SYN, b""));
        w.raw(&packet4(s, c, PORT, cport, 900, SYN | ACK, b""));
        w.raw(&packet4(c, s, cport, PORT, isn + 1, ACK, REQ));
        w.raw(&packet4(s, c, PORT, cport, 901, ACK, OK));
        let next = isn + 1 + REQ.len() as u32;
        w.raw(&packet4(c, s, cport, PORT, next, ACK, REQ));
        w.raw(&packet4(s, c, PORT, cport, 901 + OK.len() as u32, ACK, OK));
    }

    /// This machine (198.51.100.1; documentation addresses) on every interface, a container
    /// behind it at 203.0.113.2, a client elsewhere at .9.
    const HERE: [u8; 4] = [198, 51, 100, 1];
    const CONTAINER: [u8; 4] = [203, 0, 113, 2];
    const ELSEWHERE: [u8; 4] = [203, 0, 113, 9];

    fn on_every_interface(name: &str) -> Wire {
        let mut w = Wire::new(name);
        w.conns.copies = Some(Copies::default());
        w
    }

    fn copied(w: &Wire) -> u64 {
        w.conns.tap_metrics.copied_connections.get()
    }

    #[test]
    fn on_every_interface_a_connection_and_its_translated_copy_are_measured_once() {
        // A DNAT rule: the client's connection to this machine, then the same after
        // translation, to the container (same client end, same first sequence number).
        let mut w = on_every_interface("translated");
        exchange4(&mut w, (ELSEWHERE, 40001), HERE, 10);
        exchange4(&mut w, (ELSEWHERE, 40001), CONTAINER, 10);
        assert_eq!(w.records().len(), 2, "{:?}", w.records());
        assert_eq!(copied(&w), 1);
        // Its SYN seen again (a bridge, then its port) is the same copy, not counted again.
        w.raw(&packet4(ELSEWHERE, CONTAINER, 40001, PORT, 10, SYN, b""));
        assert_eq!(copied(&w), 1);
        // A client here that reaches the container right after (an output DNAT rule: no copy
        // before it) is measured.
        exchange4(&mut w, (HERE, 40003), CONTAINER, 50);
        assert_eq!(w.records().len(), 4, "{:?}", w.records());
        // Traffic routed through to the container with no copy before it is measured.
        exchange4(&mut w, (ELSEWHERE, 40002), CONTAINER, 77);
        assert_eq!(w.records().len(), 6, "{:?}", w.records());
        assert_eq!(copied(&w), 1);
        // On one interface (lo, or one named) every connection on the port is followed.
        let mut w = Wire::new("translated-named");
        exchange4(&mut w, (ELSEWHERE, 40001), HERE, 10);
        exchange4(&mut w, (ELSEWHERE, 40001), CONTAINER, 10);
        assert_eq!(w.records().len(), 4, "{:?}", w.records());
    }

    #[test]
    fn on_every_interface_a_connection_begun_before_the_tap_and_its_copy_are_measured_once() {
        // Joined at a request, on both sides of a DNAT rule: the same bytes at the same
        // sequence number.
        let mut w = on_every_interface("translated-joined");
        for s in [HERE, CONTAINER] {
            w.raw(&packet4(ELSEWHERE, s, 40001, PORT, 5000, ACK, REQ));
            w.raw(&packet4(s, ELSEWHERE, PORT, 40001, 900, ACK, OK));
        }
        assert_eq!(w.records().len(), 1, "{:?}", w.records());
        assert_eq!(copied(&w), 1);
        // its next request too is the copy's
        let next = 5000 + REQ.len() as u32;
        w.raw(&packet4(ELSEWHERE, CONTAINER, 40001, PORT, next, ACK, REQ));
        w.raw(&packet4(
            CONTAINER,
            ELSEWHERE,
            PORT,
            40001,
            900 + OK.len() as u32,
            ACK,
            OK,
        ));
        assert_eq!(w.records().len(), 1, "{:?}", w.records());
        // both gone quiet for an hour, then a request each: the copy, forgotten with its
        // original, is known again at it
        w.conns
            .forget_idle(Instant::now() + IDLE + Duration::from_secs(1));
        let then = next + REQ.len() as u32;
        for s in [HERE, CONTAINER] {
            w.raw(&packet4(ELSEWHERE, s, 40001, PORT, then, ACK, REQ));
        }
        assert_eq!(copied(&w), 2, "{:?}", w.records());
        // another connection joined is measured
        w.raw(&packet4(ELSEWHERE, CONTAINER, 40002, PORT, 9000, ACK, REQ));
        w.raw(&packet4(CONTAINER, ELSEWHERE, PORT, 40002, 900, ACK, OK));
        assert_eq!(w.records().len(), 2, "{:?}", w.records());
        assert_eq!(copied(&w), 2);
    }

    #[test]
    fn on_every_interface_a_connection_its_reader_had_no_room_for_leaves_its_copy_measured() {
        // Two readers, one table of SYNs followed: the first full of open requests.
        let followed = Arc::new(std::sync::Mutex::new(copies::Followed::default()));
        let mut full = Wire::new("copies-full");
        full.conns.copies = Some(Copies::sharing(&followed));
        full.conns.max_connections = 1;
        full.raw(&packet4(ELSEWHERE, HERE, 40000, PORT, 9, ACK, REQ));
        full.raw(&packet4(ELSEWHERE, HERE, 40001, PORT, 10, SYN, b""));
        assert_eq!(full.conns.refused, 1);
        // Its copy, hashed to the other reader, is the one measured.
        let mut room = Wire::new("copies-room");
        room.conns.copies = Some(Copies::sharing(&followed));
        exchange4(&mut room, (ELSEWHERE, 40001), CONTAINER, 10);
        assert_eq!(room.records().len(), 2, "{:?}", room.records());
        assert_eq!(copied(&room), 0);
    }

    #[test]
    fn on_every_interface_a_copy_on_the_ends_of_a_connection_whose_close_went_unseen_ends_it() {
        let mut w = on_every_interface("translated-stale");
        // a request on the container's side whose answer and close were never seen
        w.raw(&packet4(ELSEWHERE, CONTAINER, 40001, PORT, 5000, ACK, REQ));
        // the client's port used again: its new connection, then the translated copy
        exchange4(&mut w, (ELSEWHERE, 40001), HERE, 10);
        w.raw(&packet4(ELSEWHERE, CONTAINER, 40001, PORT, 10, SYN, b""));
        let before = w.records().len();
        w.raw(&packet4(
            CONTAINER,
            ELSEWHERE,
            PORT,
            40001,
            900,
            SYN | ACK,
            b"",
        ));
        w.raw(&packet4(ELSEWHERE, CONTAINER, 40001, PORT, 11, ACK, REQ));
        w.raw(&packet4(CONTAINER, ELSEWHERE, PORT, 40001, 901, ACK, OK));
        let r = w.records();
        assert_eq!(r.len(), before, "the copy's answer fed nothing: {r:?}");
        // the stale request ended, as an error, when its ends were reused
        assert!(
            r.iter().any(|r| r["error"]
                .as_str()
                .is_some_and(|e| e.contains("replaced by a new one"))),
            "{r:?}"
        );
        assert_eq!(copied(&w), 1);
    }

    #[test]
    fn on_every_interface_a_syn_sent_again_finds_its_masqueraded_copy_by_its_new_timestamp() {
        // The first SYN dropped on its way through (NAT out of ports), the second translated
        // to the container with the router's address and another port.
        let mut w = on_every_interface("translated-resent");
        let syn = |w: &mut Wire, ts| {
            w.raw(&stamped(
                packet4(ELSEWHERE, HERE, 40001, PORT, 10, SYN, b""),
                ts,
            ));
        };
        syn(&mut w, 1000);
        syn(&mut w, 2000);
        let router = [198, 51, 100, 254];
        w.raw(&stamped(
            packet4(router, CONTAINER, 50001, PORT, 10, SYN, b""),
            2000,
        ));
        assert_eq!(copied(&w), 1);
        assert_eq!(w.conns.map.len(), 1);
    }

    #[test]
    fn a_request_sent_in_the_syn_tcp_fast_open_is_read() {
        let mut w = Wire::new("fastopen");
        w.raw(&packet(40300, PORT, 100, SYN, REQ));
        w.raw(&packet(PORT, 40300, 700, SYN | ACK, b""));
        let mut f = Flow {
            port: 40300,
            c: 101 + REQ.len() as u32,
            s: 701,
        };
        // The SYN again, as a client does when its first waited on a full listen queue.
        w.raw(&packet(40300, PORT, 100, SYN, REQ));
        f.client(&mut w, 0, b"");
        f.server(&mut w, 0, OK);
        let r = w.records();
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(r[0]["status"] == 200 && r[0]["error"].is_null(), "{r:?}");
    }

    fn ok(status: u16) -> Vec<u8> {
        format!("HTTP/1.1 {status} X\r\ncontent-length: 2\r\n\r\n{{}}").into_bytes()
    }

    fn statuses(w: &Wire) -> Vec<(u64, Option<String>)> {
        w.records()
            .iter()
            .map(|r| {
                (
                    r["status"].as_u64().unwrap(),
                    r["error"].as_str().map(String::from),
                )
            })
            .collect()
    }

    // The next five were found by a hostile review of the join (helper-9); each failed before.

    #[test]
    fn a_joined_requests_answer_lost_by_the_ring_is_a_loss_not_the_next_answer() {
        let mut w = Wire::new("joined-drop");
        let mut f = Flow::unseen(40500);
        f.client(&mut w, 0, REQ);
        // Its answer: dropped by the ring (no hole: the server side has not begun).
        w.dropped.fetch_add(1, Ordering::SeqCst);
        f.s += ok(200).len() as u32;
        f.client(&mut w, 0, REQ);
        f.server(&mut w, 0, &ok(201));
        f.client(&mut w, 0, REQ);
        f.server(&mut w, 0, &ok(202));
        let got = statuses(&w);
        assert_eq!(got, [(499, Some(LOST.into())), (201, None), (202, None)]);
        // The same loss, then the client closes its pooled connection: lost, not "left".
        let mut w = Wire::new("joined-drop-fin");
        let mut f = Flow::unseen(40501);
        f.client(&mut w, 0, REQ);
        w.dropped.fetch_add(1, Ordering::SeqCst);
        f.s += ok(200).len() as u32;
        f.client(&mut w, FIN, b"");
        f.server(&mut w, FIN, b"");
        assert_eq!(statuses(&w), [(499, Some(LOST.to_string()))]);
    }

    #[test]
    fn a_join_on_a_resent_copy_of_an_answered_request_does_not_shift_the_answers() {
        let mut w = Wire::new("joined-resent");
        let mut f = Flow::unseen(40502);
        let at = f.c;
        f.client(&mut w, 0, REQ);
        // The copy again: its answer passed before the tap started.
        f.c = at.wrapping_add(REQ.len() as u32);
        f.client(&mut w, 0, REQ);
        f.server(&mut w, 0, &ok(201));
        f.client(&mut w, 0, REQ);
        f.server(&mut w, 0, &ok(202));
        let got = statuses(&w);
        assert_eq!(got, [(499, Some(MISSED.into())), (201, None), (202, None)]);
    }

    #[test]
    fn a_client_pipelining_across_the_tap_start_costs_one_misread_record_then_is_given_up() {
        // A documented limit: request 1 went before the tap, request 2 after; answer 1 is taken
        // for request 2's, and answer 2, with no request left, stops the reading.
        let mut w = Wire::new("joined-pipelined");
        let mut f = Flow::unseen(40503);
        f.client(&mut w, 0, REQ);
        f.server(&mut w, 0, &ok(200));
        f.server(&mut w, 0, &ok(201));
        assert_eq!(statuses(&w), [(200, None)]);
        assert_eq!(w.unread(), 1);
    }

    #[test]
    fn a_reset_carrying_a_request_line_is_no_request() {
        let mut w = Wire::new("joined-rst");
        w.raw(&packet(40504, PORT, 777, RST | ACK, REQ));
        w.raw(&packet(40505, PORT, 777, 0, REQ));
        assert_eq!(statuses(&w), []);
        assert!(w.conns.map.is_empty());
    }

    #[test]
    fn with_the_table_full_of_open_requests_a_refusal_is_counted_once_and_rarely_rescans() {
        let mut w = Wire::new("joined-full");
        for i in 0..MAX_CONNECTIONS {
            let ip = [127, 0, 1 + (i >> 16) as u8, 2];
            w.raw(&packet4(ip, LO, i as u16, PORT, 9, ACK, REQ));
        }
        assert_eq!(w.conns.map.len(), MAX_CONNECTIONS);
        // A Fast Open SYN is refused once, not again as a join.
        w.raw(&packet(40506, PORT, 100, SYN, REQ));
        assert_eq!(w.conns.refused, 1);
        // 2 000 requests on a pooled connection that cannot be followed, 100 µs apart: a few
        // passes over the table, not one per segment, and not counted per request.
        let passes = w.conns.room_passes;
        let mut seq = 1000u32;
        for _ in 0..2000 {
            w.raw(&packet(40507, PORT, seq, ACK, REQ));
            seq = seq.wrapping_add(REQ.len() as u32);
        }
        let more = w.conns.room_passes - passes;
        assert!(more <= 3, "{more} passes over the table");
        assert_eq!(w.conns.refused, 1);
    }

    #[test]
    fn a_keep_alive_connection_opened_before_the_tap_is_followed_from_its_next_request() {
        let mut w = Wire::new("joined");
        // No handshake seen: the tap starts with the connection idle between two answers.
        let mut f = Flow::unseen(40200);
        // The last chunk of an answer from before the tap, and the client's ACK: nothing to read.
        f.server(&mut w, 0, b"0\r\n\r\n");
        f.client(&mut w, 0, b"");
        assert!(w.conns.map.is_empty());
        for _ in 0..2 {
            f.client(&mut w, 0, REQ);
            f.server(&mut w, 0, OK);
        }
        let r = w.records();
        assert_eq!(r.len(), 2, "{r:?}");
        assert!(
            r.iter().all(|r| r["status"] == 200 && r["error"].is_null()),
            "{r:?}"
        );
    }

    #[test]
    fn a_joined_connections_old_answer_tail_is_skipped_until_the_answer_begins() {
        let mut w = Wire::new("joined-tail");
        let mut f = Flow::unseen(40201);
        f.client(&mut w, 0, REQ);
        // A segment of the server's that does not begin an answer (a retransmitted tail).
        f.server(&mut w, 0, b"data: [DONE]\n\n");
        f.server(&mut w, 0, OK);
        let r = w.records();
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(r[0]["error"].is_null(), "{r:?}");
        // From there it is read as any other: its server closing before the next answer ends
        // that request with an error.
        f.client(&mut w, 0, REQ);
        f.server(&mut w, FIN, b"");
        let r = w.records();
        assert_eq!(r.len(), 2, "{r:?}");
        assert!(r[1]["error"].is_string(), "{r:?}");
    }

    #[test]
    fn a_joined_connection_whose_server_closes_before_answering_ends_its_request() {
        let mut w = Wire::new("joined-close");
        let mut f = Flow::unseen(40203);
        f.client(&mut w, 0, REQ);
        f.server(&mut w, FIN, b"");
        assert!(w.conns.map.is_empty());
        let r = w.records();
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(r[0]["error"].is_string(), "{r:?}");
    }

    #[test]
    fn a_request_body_segment_of_an_unseen_connection_is_not_taken_for_a_request() {
        let mut w = Wire::new("joined-body");
        let mut f = Flow::unseen(40202);
        // JSON cannot hold a raw CRLF inside a string: no body segment reads as a request line.
        f.client(&mut w, 0, br#"{"text":"POST /generate HTTP/1.1\r\n"}"#);
        f.client(&mut w, 0, b"\"POST /generate HTTP/1.1\r\nHost: h\r\n\r\n");
        f.client(&mut w, 0, b"post /generate HTTP/1.1\r\n\r\n");
        assert!(w.conns.map.is_empty());
        assert!(w.records().is_empty());
    }

    #[test]
    fn a_connection_with_a_request_open_is_not_forgotten_for_its_silence() {
        let mut w = Wire::new("silent");
        let mut f = Flow::open(&mut w, 40100, 1, 2);
        f.client(&mut w, 0, REQ);
        let mut idle = Flow::open(&mut w, 40101, 1, 2);
        idle.client(&mut w, 0, REQ);
        idle.server(&mut w, 0, OK);
        // Past the silence limit: the one waiting for its answer stays, the idle one goes.
        w.conns
            .forget_idle(Instant::now() + IDLE + Duration::from_secs(1));
        assert_eq!(w.conns.map.len(), 1);
        f.server(&mut w, 0, OK);
        let r = w.records();
        assert_eq!(r.len(), 2, "{r:?}");
        assert!(r.iter().all(|r| r["error"].is_null()), "{r:?}");
    }

    #[test]
    fn a_request_ended_by_its_client_ends_at_its_segment_not_when_the_tap_read_it() {
        let mut w = Wire::new("endtime");
        // The segments are stamped 100 us apart, 5 s before the tap reads them (a ring behind).
        w.t -= Duration::from_secs(5);
        let mut f = Flow::open(&mut w, 40200, 1, 2);
        f.client(&mut w, 0, REQ);
        f.client(&mut w, FIN, b"");
        let r = w.records();
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(r[0]["status"], 499, "{r:?}");
        let e2e = r[0]["e2e_s"].as_f64().unwrap();
        assert!(
            e2e < 0.001,
            "e2e {e2e}: the FIN's own time, not the reading's"
        );
    }

    /// What every connection keeps: segments behind holes, heads in pieces, open requests.
    fn kept(w: &Wire) -> usize {
        w.conns.map.values().map(Conn::buffered).sum()
    }

    #[test]
    fn segments_held_behind_holes_and_heads_in_pieces_are_bounded_across_connections() {
        let mut w = Wire::new("held");
        let seg = vec![b'x'; 60_000];
        // Each connection loses one byte and leaves 7.8 MB behind the hole: under the bound of
        // one direction, and 190 MB in all.
        for i in 0..24 {
            let mut f = Flow::open(&mut w, 41000 + i, 1000, 2000);
            f.c += 1;
            for _ in 0..130 {
                f.client(&mut w, 0, &seg);
            }
        }
        assert!(kept(&w) <= MAX_BUFFERED, "{} bytes held", kept(&w));
        let unread = w.unread();
        assert!(unread > 0);
        // Heads that never end, 60 kB each: 72 MB for 1200 connections.
        for i in 0..1200 {
            let mut f = Flow::open(&mut w, 20000 + i, 1000, 2000);
            f.client(&mut w, 0, b"POST /generate HTTP/1.1\r\nx: ");
            f.client(&mut w, 0, &seg);
        }
        assert!(kept(&w) <= MAX_BUFFERED, "{} bytes held", kept(&w));
        assert!(w.unread() > unread);
        assert_eq!(kept(&w), w.conns.buffered, "the running count is exact");
    }

    #[test]
    fn a_connection_given_up_for_a_hole_keeps_nothing_of_it() {
        let mut w = Wire::new("hole");
        let mut f = Flow::holed(&mut w, 41000, true);
        assert!(kept(&w) > 0);
        let now = Instant::now();
        for _ in 1..HOLE_CHECKS {
            w.conns.forget_idle(now);
        }
        assert_eq!(
            w.unread(),
            0,
            "a hole is not a loss until it has stayed a while"
        );
        w.conns.forget_idle(now);
        assert_eq!(w.unread(), 1);
        assert_eq!(
            kept(&w),
            0,
            "the held segments go with the connection's reading"
        );
        f.server(&mut w, 0, OK);
        assert_eq!(kept(&w), 0, "and nothing more is held");
        let r = w.records();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0]["error"], LOST, "{r:?}");
        // Its FINs still end it.
        f.client(&mut w, FIN, b"");
        f.server(&mut w, FIN, b"");
        assert!(w.conns.map.is_empty());
    }

    /// A connection held behind a 1-byte hole with `segments` segments of 60 kB after it, on `w`.
    fn behind_a_hole(w: &mut Wire, port: u16, segments: usize) {
        let seg = vec![b'x'; 60_000];
        let mut f = Flow::open(w, port, 1000, 2000);
        f.c += 1;
        for _ in 0..segments {
            f.client(w, 0, &seg);
        }
    }

    // The next two were found by a hostile review of the readers (helper-10).

    #[test]
    fn one_of_sixteen_readers_holds_what_one_connection_may_hold() {
        let mut w = Wire::new("share-16");
        w.conns.share(16, &Arc::new(AtomicUsize::new(0)));
        behind_a_hole(&mut w, 41000, 130);
        assert_eq!(
            w.unread(),
            0,
            "a lone connection given up ({} held)",
            kept(&w)
        );
    }

    #[test]
    fn readers_share_one_bound_on_held_bytes() {
        let all = Arc::new(AtomicUsize::new(0));
        let mut a = Wire::new("share-a");
        a.conns.share(2, &all);
        let mut b = Wire::new("share-b");
        b.conns.share(2, &all);
        // Reader a: eight connections of 7.8 MB behind holes (62.4 MB); reader b: one more.
        for k in 0..8 {
            behind_a_hole(&mut a, 41100 + k, 130);
        }
        assert_eq!(a.unread(), 0);
        behind_a_hole(&mut b, 41200, 130);
        assert_eq!(b.unread(), 1, "past 64 MiB over both readers");
        assert!(all.load(Ordering::Relaxed) <= MAX_BUFFERED);
        assert_eq!(all.load(Ordering::Relaxed), kept(&a) + kept(&b));
    }

    #[test]
    fn the_reader_count_is_one_unless_set_and_a_bad_value_is_named() {
        assert_eq!(READERS.parse(None), Ok(1));
        assert_eq!(READERS.parse(Some("4")), Ok(4));
        for bad in ["0", "17", "two", ""] {
            let why = READERS.parse(Some(bad)).unwrap_err();
            assert!(
                why.contains("SGLANG_SUPERVISOR_TAP_READERS") && why.contains("1 to 16"),
                "{why}"
            );
        }
    }

    #[test]
    fn the_ring_size_is_read_in_mib_and_a_bad_value_is_named_not_ignored() {
        assert_eq!(RING_MB.parse(None), Ok(32));
        assert_eq!(RING_MB.parse(Some(" 128 ")), Ok(128));
        for bad in ["0", "4097", "32MB", "", "-1"] {
            let why = RING_MB.parse(Some(bad)).unwrap_err();
            assert!(
                why.contains(&format!("{bad:?}")) && why.contains("1 to 4096"),
                "{why}"
            );
        }
    }

    #[test]
    fn the_too_many_open_reason_names_the_bound_in_force() {
        assert!(
            TOO_MANY_OPEN.starts_with(&format!("more than {MAX_OPEN} requests")),
            "{TOO_MANY_OPEN}"
        );
    }

    #[test]
    fn a_client_that_leaves_with_a_hole_behind_it_is_a_loss_not_a_disconnect() {
        let mut w = Wire::new("hole-fin");
        let mut f = Flow::holed(&mut w, 41000, true);
        // The client read the whole answer (it passed the tap first) and closed.
        f.client(&mut w, FIN, b"");
        let r = w.records();
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(r[0]["error"], LOST, "{r:?}");
        assert_eq!(
            w.unread(),
            1,
            "counted as a connection the tap could not read"
        );
    }

    #[test]
    fn a_hole_the_ring_did_not_make_is_a_client_that_left_or_bytes_missed_never_a_full_ring() {
        let mut w = Wire::new("hole-not-ring");
        // The ring dropped segments earlier, then was read up (as the reader marks it): those
        // drops are no evidence against connections opened after.
        w.dropped.store(7, Ordering::SeqCst);
        let read_up = w.conns.drops.total();
        w.conns.drops.settled = read_up;
        // A segment late (reordered across CPUs) when the client resets mid-answer: it left.
        let mut f = Flow::holed(&mut w, 41000, false);
        f.client(&mut w, RST, b"");
        let r = w.records();
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(
            (r[0]["status"].as_u64(), r[0]["error"].as_str()),
            (Some(499), Some(CLIENT_LEFT_EARLY)),
            "{r:?}"
        );
        assert_eq!(w.unread(), 0);
        // A hole that stays with nothing dropped by the ring: bytes missed before the tap.
        Flow::holed(&mut w, 41001, false);
        let now = Instant::now();
        for _ in 0..HOLE_CHECKS {
            w.conns.forget_idle(now);
        }
        let r = w.records();
        assert_eq!(r.len(), 2, "{r:?}");
        assert_eq!(r[1]["error"], MISSED, "{r:?}");
        assert_eq!(w.unread(), 1);
    }

    /// The ring is a whole ring behind (when it drops): a connection's answer is dropped while
    /// its SYN still waits unread, and the drop count is read (the once-a-second check, another
    /// connection's close) before the SYN is reached. Found by the second review.
    #[test]
    fn a_drop_read_before_a_lagging_reader_reaches_the_syn_still_counts_against_the_ring() {
        type CountRead = fn(&mut Wire);
        let reads: [(&str, CountRead); 3] = [
            ("the warning's count", |w| {
                w.conns.drops.untold();
            }),
            ("the hole check", |w| w.conns.forget_idle(Instant::now())),
            ("another close", |w| {
                w.conns.drops.total();
            }),
        ];
        for (read, count) in reads {
            for end in ["client's FIN", "hole checks", "stop"] {
                let mut w = Wire::new("lagging");
                w.dropped.store(1, Ordering::SeqCst);
                count(&mut w);
                let mut f = Flow::holed(&mut w, 41000, false);
                match end {
                    "client's FIN" => f.client(&mut w, FIN, b""),
                    "hole checks" => {
                        (0..HOLE_CHECKS).for_each(|_| w.conns.forget_idle(Instant::now()))
                    }
                    _ => w.conns.close_all("stopped"),
                }
                let r = w.records();
                assert_eq!(r.len(), 1, "{read}, {end}: {r:?}");
                assert_eq!(r[0]["error"], LOST, "{read}, {end}: {r:?}");
                assert_eq!(w.unread(), 1, "{read}, {end}");
            }
        }
    }

    #[test]
    fn requests_open_behind_a_hole_when_the_tap_stops_are_a_loss() {
        let mut w = Wire::new("hole-stop");
        Flow::holed(&mut w, 41000, true);
        let mut waiting = Flow::open(&mut w, 41001, 1000, 2000);
        waiting.client(&mut w, 0, REQ);
        w.conns.close_all("stopped");
        let mut errors: Vec<String> = w
            .records()
            .iter()
            .map(|r| r["error"].as_str().unwrap_or_default().to_string())
            .collect();
        errors.sort();
        assert_eq!(errors, vec!["stopped".to_string(), LOST.to_string()]);
        assert_eq!(w.unread(), 1, "the lost one is counted as unread");
    }

    #[test]
    fn a_syn_flood_does_not_keep_the_tap_from_following_real_connections() {
        let mut w = Wire::new("flood");
        // A connection with a request open before the flood, answered after it.
        let mut before = Flow::open(&mut w, 40000, 1, 2);
        before.client(&mut w, 0, REQ);
        // SYNs that are never followed by anything, from more ends than the tap follows.
        for i in 0..MAX_CONNECTIONS + 5000 {
            let ip = [127, 0, 1 + (i >> 16) as u8, 2];
            w.raw(&packet4(ip, LO, i as u16, PORT, 9, SYN, b""));
        }
        assert!(w.conns.map.len() <= MAX_CONNECTIONS);
        let mut during = Flow::open(&mut w, 40001, 1, 2);
        during.client(&mut w, 0, REQ);
        during.server(&mut w, 0, OK);
        before.server(&mut w, 0, OK);
        let r = w.records();
        assert_eq!(r.len(), 2, "{r:?}");
        assert!(r.iter().all(|r| r["status"] == 200 && r["error"].is_null()));
    }

    #[test]
    fn answers_whose_syn_ack_the_tap_missed_are_an_error_not_a_client_that_left() {
        let mut w = Wire::new("synack");
        w.raw(&packet(40000, PORT, 100, SYN, b""));
        // The server's SYN-ACK is not in the ring, which had no room for it.
        w.dropped.store(1, Ordering::SeqCst);
        let mut f = Flow {
            port: 40000,
            c: 101,
            s: 501,
        };
        f.client(&mut w, 0, REQ);
        f.server(&mut w, 0, OK);
        f.client(&mut w, FIN, b"");
        f.server(&mut w, FIN, b"");
        let r = w.records();
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(r[0]["error"], LOST, "{r:?}");
        assert_eq!(w.unread(), 1);
    }

    #[test]
    fn requests_pipelined_without_end_are_bounded_per_connection() {
        let mut w = Wire::new("pipelined");
        let mut f = Flow::open(&mut w, 40000, 1, 2);
        let req: &[u8] = b"POST /generate HTTP/1.1\r\n\r\n";
        for _ in 0..MAX_OPEN / 16 + 10 {
            f.client(&mut w, 0, &req.repeat(16));
        }
        let open = w.conns.map.values().map(|c| c.open.len()).max();
        assert!(open <= Some(MAX_OPEN), "{open:?}");
        assert_eq!(w.unread(), 1);
    }

    /// A segment of `f` sent later than the ones after it: its sequence number, then the flow
    /// moves past it.
    fn skip(seq: &mut u32, data: &[u8]) -> u32 {
        let at = *seq;
        *seq = seq.wrapping_add(data.len() as u32);
        at
    }

    #[test]
    fn edge_cases_of_tcp_and_http_each_give_the_right_record() {
        let mut w = Wire::new("edges");
        let status = |r: &Value| {
            (
                r["status"].as_u64().unwrap(),
                r["error"].as_str().map(String::from),
            )
        };
        // Both sequence spaces wrap inside the exchange; the server's FIN (with the answer's
        // last bytes) comes before the segment in front of it.
        let mut f = Flow::open(&mut w, 40000, u32::MAX - 20, u32::MAX - 30);
        f.client(&mut w, 0, REQ);
        let (a, b) = OK.split_at(40);
        let first = skip(&mut f.s, a);
        f.server(&mut w, FIN, b);
        w.raw(&packet(PORT, 40000, first, ACK, a));
        f.client(&mut w, FIN, b"");
        let r = w.records();
        assert_eq!(
            r.iter().map(status).collect::<Vec<_>>(),
            [(200, None)],
            "{r:?}"
        );
        assert!(w.conns.map.is_empty(), "both FINs read: forgotten");
        // A RST from the server in the middle of a chunked answer: an error record.
        let mut f = Flow::open(&mut w, 40001, 5, 6);
        f.client(&mut w, 0, REQ);
        f.server(&mut w, 0, &SSE_ANSWER[..120]);
        f.server(&mut w, RST, b"");
        let r = w.records();
        assert_eq!(
            status(&r[1]).1.as_deref(),
            Some("the connection was reset"),
            "{r:?}"
        );
        // On one keep-alive connection: 100 Continue then the answer, a HEAD, a 204 and a 304,
        // a chunked stream with extensions and trailers, a head in many pieces; another
        // connection's exchange interleaved with it.
        let mut f = Flow::open(&mut w, 40002, 1 << 31, 77);
        let mut g = Flow::open(&mut w, 40003, 3, 4);
        let expect = EXPECT_100;
        f.client(&mut w, 0, expect.head);
        g.client(&mut w, 0, REQ);
        f.server(&mut w, 0, b"HTTP/1.1 100 Continue\r\n\r\n");
        f.client(&mut w, 0, expect.body);
        g.server(&mut w, 0, OK);
        f.server(&mut w, 0, OK);
        f.client(&mut w, 0, b"HEAD /generate HTTP/1.1\r\n\r\n");
        f.server(&mut w, 0, b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n");
        f.client(&mut w, 0, REQ);
        f.server(&mut w, 0, b"HTTP/1.1 204 No Content\r\n\r\n");
        f.client(&mut w, 0, REQ);
        f.server(
            &mut w,
            0,
            b"HTTP/1.1 304 Not Modified\r\ncontent-length: 2\r\n\r\n",
        );
        for piece in REQ.chunks(3) {
            f.client(&mut w, 0, piece);
        }
        for piece in SSE_ANSWER.chunks(17) {
            f.server(&mut w, 0, piece);
        }
        f.client(&mut w, 0, REQ);
        f.server(&mut w, 0, OK);
        let r = w.records();
        let got: Vec<_> = r[2..].iter().map(status).collect();
        assert_eq!(
            got,
            [
                (200, None),
                (200, None),
                (200, None),
                (204, None),
                (304, None),
                (200, None),
                (200, None)
            ],
            "{r:?}"
        );
        assert_eq!(r[7]["stream"], true);
        assert_eq!(w.unread(), 0);
    }

    struct Expect100 {
        head: &'static [u8],
        body: &'static [u8],
    }

    const EXPECT_100: Expect100 = Expect100 {
        head: b"POST /generate HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n",
        body: b"{}",
    };

    const SSE_ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n14;ext=\"x\"\r\ndata: {\"text\":\"a\"}\n\n\r\n15\r\ndata: {\"text\":\"ab\"}\n\n\r\nE\r\ndata: [DONE]\n\n\r\n0\r\nx-trailer: 1\r\n\r\n";

    /// A connection's segments: from the client or not, and their bytes.
    type Segs = Vec<(bool, Vec<u8>)>;

    /// Connections fed their exchange in random pieces, some lost, repeated, reordered, flagged
    /// at random or replaced by junk: no panic, the running count of what is kept exact, never
    /// more records than measured requests, and every one recorded once the tap stops.
    #[test]
    fn random_segments_on_many_connections_never_panic_and_keep_the_counts() {
        let mut rng = crate::tap::tcp::tests::Rng(99);
        let mut w = Wire::new("fuzz");
        let mut measured = 0;
        for round in 0..300 {
            let mut flows: Vec<(Flow, Segs)> = Vec::new();
            for k in 0..1 + rng.below(6) {
                let port = 1000 + (round * 8 + k) as u16 % 20000;
                let f = Flow::open(&mut w, port, rng.next() as u32, rng.next() as u32);
                let mut segs = Vec::new();
                for _ in 0..1 + rng.below(4) {
                    let (req, ans) = match rng.below(3) {
                        0 => (REQ, OK),
                        1 => (REQ, SSE_ANSWER),
                        _ => (&b"GET /health HTTP/1.1\r\n\r\n"[..], OK),
                    };
                    measured += (req == REQ) as usize;
                    for piece in req.chunks(1 + rng.below(60)) {
                        segs.push((true, piece.to_vec()));
                    }
                    for piece in ans.chunks(1 + rng.below(60)) {
                        segs.push((false, piece.to_vec()));
                    }
                }
                flows.push((f, segs));
            }
            // Interleaved across connections, each connection's segments perturbed.
            let mut left: usize = flows.iter().map(|f| f.1.len()).sum();
            let mut next = vec![0; flows.len()];
            while left > 0 {
                let i = rng.below(flows.len());
                let (f, segs) = &mut flows[i];
                let Some((to_server, data)) = segs.get(next[i]).cloned() else {
                    continue;
                };
                next[i] += 1;
                left -= 1;
                let seq = if to_server { &mut f.c } else { &mut f.s };
                let at = *seq;
                *seq = seq.wrapping_add(data.len() as u32);
                let (src, dst) = if to_server {
                    (f.port, PORT)
                } else {
                    (PORT, f.port)
                };
                let mut flags = ACK;
                let mut at = at;
                let mut data = data;
                match rng.below(60) {
                    0 => continue, // lost
                    1 => at = rng.next() as u32,
                    2 => flags |= FIN,
                    3 => flags |= RST,
                    4 => flags |= SYN,
                    5 => data = (0..rng.below(100)).map(|_| rng.next() as u8).collect(),
                    6 => {
                        let p = packet(src, dst, at, flags, &data);
                        w.raw(&p); // repeated
                    }
                    7 => at = at.wrapping_sub(rng.below(50) as u32), // overlapping
                    _ => {}
                }
                let mut p = packet(src, dst, at, flags, &data);
                if rng.below(200) == 0 {
                    p.truncate(rng.below(p.len()));
                }
                w.raw(&p);
                if rng.below(500) == 0 {
                    w.conns.forget_idle(Instant::now());
                }
                assert_eq!(kept(&w), w.conns.buffered, "round {round}");
            }
            for (mut f, _) in flows {
                if rng.below(2) == 0 {
                    f.client(&mut w, FIN, b"");
                    f.server(&mut w, FIN, b"");
                }
            }
        }
        assert!(w.records().len() <= measured);
        w.conns.close_all("stopped");
        assert_eq!(w.conns.buffered, 0);
        let r = w.records();
        assert!(
            r.len() <= measured,
            "{} records for {measured} requests",
            r.len()
        );
        assert!(
            r.len() > measured / 4,
            "{} records for {measured} requests",
            r.len()
        );
    }
}
