//! The log path: read the child's pipes, write every byte to the log file, copy to the terminal
//! without ever blocking the child, and feed lines to the parser.
//!
//! One blocking thread per pipe. Per chunk read: one `write` to the log file (shared by both
//! streams under a lock, so the file keeps arrival order), a non-blocking hand-off to a terminal
//! writer thread (a bounded queue: when a terminal or pipe is slower than the child, the terminal
//! copy drops chunks and counts them; the log file never does, nor a copy to a file or /dev/null,
//! which cannot stall), then the same buffer to one parser thread for both pipes (line framing
//! and parsing, in read order), so that reading and writing overlap parsing instead of adding to
//! it. The parser's queue is bounded and never drops: a parser that falls behind makes the
//! readers wait, a few reads ahead at most. When the OS refuses the parser thread, each reader
//! parses its own reads in place.
use super::parse::{
    batch_fields, is_plain, BatchKind, LogEvent, LogParser, LogSink, LoopbackClients, ParseStats,
};
use crate::events::FatalReason;
use crate::redact::{Secrets, StreamRedactor};
use crate::server_series::ServerSeries;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use serde_json::{Map, Value};
use sglang_probes::sync::lock;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{
    sync_channel, Receiver, RecvTimeoutError, SendError, SyncSender, TrySendError,
};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

/// Bytes read per `read` call (the pipe is enlarged to match).
const CHUNK: usize = 256 * 1024;
/// Longest line handed to the parser; the rest of a longer line is logged but not parsed.
pub const MAX_PARSED_LINE: usize = 1024 * 1024;
/// Chunks the terminal copy may fall behind before it drops (bounded memory: 16 × 256 KiB).
const TERMINAL_QUEUE_CHUNKS: usize = 16;
/// Read buffers kept for reuse by whoever held them last (terminal writer, parser), at most.
const SPARE_BUFFERS: usize = 8;
/// When a multi-line message is open and the pipe is quiet this long, close it.
const CAPTURE_IDLE_MS: u16 = 200;
/// The same, for the parser thread's waits.
const CAPTURE_IDLE: Duration = Duration::from_millis(CAPTURE_IDLE_MS as u64);
/// Bytes of recent output kept in memory for diagnoses.
const TAIL_BYTES: usize = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// A parsed event with the moment its line arrived.
#[derive(Debug)]
pub struct Timed {
    pub at: Instant,
    pub event: LogEvent,
}

/// The log file, shared by both readers.
pub struct LogFile {
    file: Option<File>,
    pub path: Option<String>,
    pub written: u64,
    pub lost: u64,
    pub error: Option<String>,
    /// Where the first failed write is said as a `warning` event, as it happens.
    warn: Option<UnboundedSender<Timed>>,
}

impl LogFile {
    pub fn new(file: Option<File>, path: Option<String>) -> Self {
        LogFile {
            file,
            path,
            written: 0,
            lost: 0,
            error: None,
            warn: None,
        }
    }

    /// Say a failed write on `events` too (the lifecycle writes it as a `warning` event).
    pub fn warn_to(mut self, events: UnboundedSender<Timed>) -> Self {
        self.warn = Some(events);
        self
    }

    fn write(&mut self, bytes: &[u8]) {
        let Some(f) = &mut self.file else { return };
        if self.error.is_some() {
            self.lost += bytes.len() as u64;
            return;
        }
        // write_all by hand: after a partial write, the bytes that did land are counted as written.
        let mut rest = bytes;
        let failed = loop {
            if rest.is_empty() {
                break None;
            }
            match f.write(rest) {
                Ok(0) => break Some(std::io::Error::from(std::io::ErrorKind::WriteZero)),
                Ok(n) => {
                    self.written += n as u64;
                    rest = &rest[n..];
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Some(e),
            }
        };
        match failed {
            None => {}
            Some(e) => {
                // Keep draining the child's pipes: a full disk must not freeze the server.
                let msg = format!(
                    "writing the log file {}: {e}",
                    self.path.as_deref().unwrap_or("?")
                );
                let message = format!(
                    "{msg}; the child keeps running, further log bytes are counted as lost"
                );
                tracing::error!("{message}");
                if let Some(tx) = &self.warn {
                    let _ = tx.send(Timed {
                        at: Instant::now(),
                        event: LogEvent::Warning { message },
                    });
                }
                self.error = Some(msg);
                self.lost += rest.len() as u64;
            }
        }
    }
}

/// The last bytes of output (both streams), for "what did it print before it died": a ring, so
/// each byte is copied once however the reads fall.
pub struct Tail {
    buf: Vec<u8>,
    /// Where the next byte goes once `buf` is full (then also where the oldest byte is).
    at: usize,
}

impl Tail {
    fn new() -> Self {
        Tail {
            buf: Vec::with_capacity(TAIL_BYTES),
            at: 0,
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        let mut bytes = &bytes[bytes.len().saturating_sub(TAIL_BYTES)..];
        if self.buf.len() < TAIL_BYTES {
            let room = TAIL_BYTES - self.buf.len();
            let (now, rest) = bytes.split_at(bytes.len().min(room));
            self.buf.extend_from_slice(now);
            bytes = rest;
        }
        while !bytes.is_empty() {
            let n = bytes.len().min(TAIL_BYTES - self.at);
            self.buf[self.at..self.at + n].copy_from_slice(&bytes[..n]);
            self.at = (self.at + n) % TAIL_BYTES;
            bytes = &bytes[n..];
        }
    }

    /// The kept bytes, oldest first.
    fn bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.buf.len());
        v.extend_from_slice(&self.buf[self.at..]);
        v.extend_from_slice(&self.buf[..self.at]);
        v
    }

    /// The last `n` complete lines, lossily decoded.
    pub fn last_lines(&self, n: usize) -> Vec<String> {
        let bytes = self.bytes();
        let text = String::from_utf8_lossy(&bytes);
        let lines: Vec<&str> = text.lines().collect();
        // The first line may be cut in the middle: skip it unless it is all we have.
        let start = usize::from(lines.len() > n && self.buf.len() == TAIL_BYTES);
        let from = lines.len().saturating_sub(n).max(start);
        lines[from..]
            .iter()
            .map(|l| l.rsplit('\r').next().unwrap_or(l).to_string())
            .collect()
    }
}

/// The latest `Prefill batch` / `Decode batch` fields per rank, and how many were seen. Batch
/// lines are the bulk of a busy log: they update this in place instead of travelling as events,
/// so a flood of them costs no memory.
#[derive(Default)]
pub struct Batches {
    pub count: [u64; 2],
    /// A handful of ranks, so a Vec beats a map.
    latest: Vec<LatestBatch>,
}

struct LatestBatch {
    kind: BatchKind,
    rank: Option<String>,
    /// The text after `Decode batch,`, as it came (decoded only when read).
    body: Vec<u8>,
    /// Recorded since the last [`Batches::publish`].
    fresh: bool,
}

impl Batches {
    fn record(&mut self, kind: BatchKind, rank: Option<&str>, body: &[u8]) {
        self.count[kind as usize] += 1;
        self.keep(kind, rank, body);
    }

    fn keep(&mut self, kind: BatchKind, rank: Option<&str>, body: &[u8]) {
        match self
            .latest
            .iter_mut()
            .find(|b| b.kind == kind && b.rank.as_deref() == rank)
        {
            Some(b) => {
                b.body.clear();
                b.body.extend_from_slice(body);
                b.fresh = true;
            }
            None => self.latest.push(LatestBatch {
                kind,
                rank: rank.map(str::to_string),
                body: body.to_vec(),
                fresh: true,
            }),
        }
    }

    /// Move what was recorded here since the last call into `to` (one lock per read chunk
    /// instead of one per line).
    /// The fresh lines also go to `series` (one per kind and rank per read: see server_series).
    fn publish(&mut self, to: &Mutex<Batches>, series: &ServerSeries) {
        if self.count == [0, 0] {
            return;
        }
        series.count(self.count);
        for b in self.latest.iter().filter(|b| b.fresh) {
            series.record(b.kind, b.rank.as_deref(), &b.body);
        }
        let mut to = lock(to);
        to.count[0] += self.count[0];
        to.count[1] += self.count[1];
        self.count = [0, 0];
        for b in self.latest.iter_mut().filter(|b| b.fresh) {
            b.fresh = false;
            to.keep(b.kind, b.rank.as_deref(), &b.body);
        }
    }

    /// The latest batch line's fields per (kind, rank).
    pub fn latest(&self) -> Vec<(BatchKind, Option<&str>, Map<String, Value>)> {
        self.latest
            .iter()
            .map(|b| {
                let text = String::from_utf8_lossy(&b.body);
                (b.kind, b.rank.as_deref(), batch_fields(&text))
            })
            .collect()
    }
}

/// The parser's sink: events to the lifecycle, batches kept here and published to
/// `Shared::batches` after each chunk.
struct ReaderSink<'a> {
    events: &'a UnboundedSender<Timed>,
    batches: Batches,
    series: &'a ServerSeries,
    /// When the lines being parsed were read (the parser may run a few reads behind).
    at: Instant,
}

impl LogSink for ReaderSink<'_> {
    fn event(&mut self, event: LogEvent) {
        // Memory pressure is counted with the server's series; retractions go no further.
        match &event {
            LogEvent::Retraction { requests, line } => {
                self.series.pressure(Some(*requests), line);
                return;
            }
            LogEvent::Fatal {
                reason: FatalReason::CudaOom,
                excerpt,
                ..
            } => self.series.pressure(None, excerpt),
            _ => {}
        }
        // The receiver is gone only when the supervisor is shutting down.
        let _ = self.events.send(Timed { at: self.at, event });
    }

    fn batch(&mut self, kind: BatchKind, rank: Option<&str>, body: &[u8]) {
        self.batches.record(kind, rank, body);
    }
}

pub struct Shared {
    /// `--redact-log`: secret values replaced in everything the readers pass on.
    redact: Option<Secrets>,
    pub log: Mutex<LogFile>,
    pub tail: Mutex<Tail>,
    pub batches: Mutex<Batches>,
    pub series: Arc<ServerSeries>,
    /// Which loopback clients the parsers tell of.
    loopback: LoopbackClients,
}

impl Shared {
    pub fn new(log: LogFile, redact: Option<Secrets>, series: Arc<ServerSeries>) -> Arc<Self> {
        Shared::telling(log, redact, series, LoopbackClients::Skipped)
    }

    /// [`Shared::new`], whose parsers tell of the loopback clients `loopback` names.
    pub fn telling(
        log: LogFile,
        redact: Option<Secrets>,
        series: Arc<ServerSeries>,
        loopback: LoopbackClients,
    ) -> Arc<Self> {
        Arc::new(Shared {
            redact: redact.filter(|s| !s.is_empty()),
            log: Mutex::new(log),
            tail: Mutex::new(Tail::new()),
            batches: Mutex::new(Batches::default()),
            series,
            loopback,
        })
    }
}

/// Our stdout or stderr, written by one thread from a bounded queue. Both the child's output and
/// our own messages go through it, so a stalled terminal (a full pipe nobody reads) can block
/// neither the child nor the supervisor: past the queue's bound, chunks are dropped and counted.
///
/// A reader's chunk is not copied: the queue holds the read buffer itself (shared with the parser,
/// which parses it meanwhile); whichever of them is done with it last hands it back for reuse.
pub struct TerminalCopy {
    tx: Option<SyncSender<(Arc<Vec<u8>>, usize)>>,
    /// Where the writer thread was refused (the limit on threads reached): the fd, written by the
    /// caller itself, so that nothing is lost for want of a thread (`write_in_place`).
    in_place: Option<Mutex<InPlace>>,
    /// Our fd is a regular file or a device such as /dev/null: a write there finishes, so the
    /// queue waits for room instead of dropping (only a terminal or a pipe can stall for ever).
    lossless: bool,
    pending: Arc<AtomicU64>,
    pub dropped: Arc<AtomicU64>,
}

/// Where the terminal's bytes go when its writer thread was refused.
enum InPlace {
    /// A file, or a pipe or terminal opened again without blocking.
    Write(File),
    /// A socket (systemd's journal stream, a socketpair): sent without waiting.
    Send(File),
}

/// Read buffers handed back by their last holder, so a busy log does not allocate (and fault in)
/// a fresh 256 KiB buffer per read.
static SPARE: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// A `CHUNK`-byte buffer to read into: one handed back, or a new one.
fn spare_buffer() -> Vec<u8> {
    lock(&SPARE).pop().unwrap_or_else(|| vec![0; CHUNK])
}

/// Done with `chunk`: a read buffer goes back for reuse if this was its last holder. `into_inner`
/// (not `try_unwrap`) so that, of two holders letting go at once, exactly one gets it back.
fn recycle(chunk: Arc<Vec<u8>>) {
    if let Some(buf) = Arc::into_inner(chunk) {
        let mut spare = lock(&SPARE);
        if buf.len() == CHUNK && spare.len() < SPARE_BUFFERS {
            spare.push(buf);
        }
    }
}

/// The process-wide writers of fd 1 and fd 2.
pub fn terminal(fd: i32) -> &'static TerminalCopy {
    static OUT: OnceLock<TerminalCopy> = OnceLock::new();
    static ERR: OnceLock<TerminalCopy> = OnceLock::new();
    let cell = if fd == 1 { &OUT } else { &ERR };
    cell.get_or_init(|| TerminalCopy::start(if fd == 1 { 1 } else { 2 }))
}

impl TerminalCopy {
    fn start(fd: i32) -> TerminalCopy {
        let dropped = Arc::new(AtomicU64::new(0));
        let pending = Arc::new(AtomicU64::new(0));
        let (tx, rx) = sync_channel::<(Arc<Vec<u8>>, usize)>(TERMINAL_QUEUE_CHUNKS);
        let (d, p) = (dropped.clone(), pending.clone());
        let mut out = dup_ours(fd);
        let lossless = out.as_ref().is_some_and(cannot_stall);
        let started = std::thread::Builder::new()
            .name(format!("terminal-{fd}"))
            .spawn(move || {
                for (chunk, n) in rx {
                    let ok = out
                        .as_mut()
                        .is_some_and(|o| o.write_all(&chunk[..n]).is_ok());
                    if !ok {
                        // A closed terminal (EPIPE) must not stop anything: count and move on.
                        out = None;
                        d.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    p.fetch_sub(1, Ordering::Release);
                    recycle(chunk);
                }
            });
        let (tx, in_place) = match started {
            Ok(_) => (Some(tx), None),
            Err(_) => (None, in_place_writer(fd, lossless).map(Mutex::new)),
        };
        TerminalCopy {
            tx,
            in_place,
            lossless,
            pending,
            dropped,
        }
    }

    /// Without the writer thread: write here. A file or /dev/null takes it all; a pipe or a
    /// terminal (opened without blocking) takes what it has room for now, the rest dropped and
    /// counted, as the queue would.
    fn write_in_place(&self, bytes: &[u8]) {
        let mut rest = bytes;
        if let Some(out) = &self.in_place {
            let mut out = lock(out);
            while !rest.is_empty() {
                let written = match &mut *out {
                    InPlace::Write(f) => f.write(rest),
                    InPlace::Send(s) => {
                        use nix::sys::socket::{send, MsgFlags};
                        let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
                        send(s.as_raw_fd(), rest, flags).map_err(std::io::Error::from)
                    }
                };
                match written {
                    Ok(n) if n > 0 => rest = &rest[n..],
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    _ => break,
                }
            }
        }
        self.dropped.fetch_add(rest.len() as u64, Ordering::Relaxed);
    }

    pub fn offer(&self, bytes: &[u8]) {
        self.offer_shared(Arc::new(bytes.to_vec()), bytes.len());
    }

    /// Queue `chunk[..n]` for the terminal, or drop it (counted) when the queue is full.
    fn offer_shared(&self, chunk: Arc<Vec<u8>>, n: usize) {
        let Some(tx) = &self.tx else {
            self.write_in_place(&chunk[..n]);
            recycle(chunk);
            return;
        };
        self.pending.fetch_add(1, Ordering::Acquire);
        if self.lossless {
            if let Err(SendError((_, n))) = tx.send((chunk, n)) {
                self.pending.fetch_sub(1, Ordering::Release);
                self.dropped.fetch_add(n as u64, Ordering::Relaxed);
            }
        } else if let Err(TrySendError::Full((_, n)) | TrySendError::Disconnected((_, n))) =
            tx.try_send((chunk, n))
        {
            self.pending.fetch_sub(1, Ordering::Release);
            self.dropped.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// Wait (bounded) until everything queued was written: called once before exiting.
    pub fn flush(&self, timeout: Duration) {
        let end = Instant::now() + timeout;
        while self.pending.load(Ordering::Acquire) > 0 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// A copy of our stdout (`fd` 1) or stderr (2).
fn dup_ours(fd: i32) -> Option<File> {
    let d = if fd == 1 {
        nix::unistd::dup(std::io::stdout())
    } else {
        nix::unistd::dup(std::io::stderr())
    };
    d.ok().map(File::from)
}

/// Our fd 1 or 2 for writing in place once its writer thread was refused: a file as it is; a
/// pipe or a terminal opened again without blocking, so that a full one refuses the write
/// (dropped, counted) instead of stopping the caller, who may be the supervisor's own loop; a
/// socket, which cannot be opened again (ENXIO), sent to with MSG_DONTWAIT.
fn in_place_writer(fd: i32, lossless: bool) -> Option<InPlace> {
    use std::os::unix::fs::FileTypeExt;
    if lossless {
        return dup_ours(fd).map(InPlace::Write);
    }
    let reopened = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(format!("/proc/self/fd/{fd}"));
    match reopened {
        Ok(f) => Some(InPlace::Write(f)),
        Err(_) => dup_ours(fd)
            .filter(|f| f.metadata().is_ok_and(|m| m.file_type().is_socket()))
            .map(InPlace::Send),
    }
}

/// A regular file, or a device that is not a terminal (/dev/null): writes there complete.
fn cannot_stall(f: &File) -> bool {
    use std::io::IsTerminal;
    use std::os::unix::fs::FileTypeExt;
    f.metadata().is_ok_and(|m| {
        let t = m.file_type();
        t.is_file() || t.is_block_device() || (t.is_char_device() && !f.is_terminal())
    })
}

/// `tracing` writes our own messages through the stderr queue.
pub struct StderrWriter;

impl Write for StderrWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        terminal(2).offer(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Splits a byte stream into lines without copying complete lines; a partial line is kept up to
/// `max` bytes and the excess is dropped from parsing (never from the log).
pub struct LineFramer {
    partial: Vec<u8>,
    truncated: bool,
    /// Every piece of `partial` came from a chunk known to be plain.
    partial_plain: bool,
    max: usize,
}

impl LineFramer {
    pub fn new(max: usize) -> Self {
        LineFramer {
            partial: Vec::new(),
            truncated: false,
            partial_plain: false,
            max,
        }
    }

    pub fn feed(&mut self, chunk: &[u8], mut line: impl FnMut(&[u8], bool)) {
        self.feed_hinted(chunk, false, |l, truncated, _| line(l, truncated));
    }

    /// [`feed`](Self::feed), where `plain` says the whole chunk is known [`is_plain`]; each line
    /// comes with whether it is known plain (a line joined across chunks: if all its chunks were).
    pub fn feed_hinted(
        &mut self,
        chunk: &[u8],
        plain: bool,
        mut line: impl FnMut(&[u8], bool, bool),
    ) {
        let mut start = 0;
        for nl in memchr::memchr_iter(b'\n', chunk) {
            let piece = &chunk[start..nl];
            if self.partial.is_empty() && !self.truncated {
                if piece.len() > self.max {
                    line(&piece[..self.max], true, plain);
                } else {
                    line(piece, false, plain);
                }
            } else {
                self.append(piece, plain);
                line(&self.partial, self.truncated, self.partial_plain);
                self.partial.clear();
                self.truncated = false;
            }
            start = nl + 1;
        }
        if start < chunk.len() {
            self.append(&chunk[start..], plain);
        }
    }

    fn append(&mut self, bytes: &[u8], plain: bool) {
        if self.partial.is_empty() && !self.truncated {
            self.partial_plain = plain;
        } else {
            self.partial_plain &= plain;
        }
        let room = self.max.saturating_sub(self.partial.len());
        if bytes.len() > room {
            self.truncated = true;
        }
        self.partial
            .extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    /// End of stream: the last line had no newline.
    pub fn finish(&mut self, mut line: impl FnMut(&[u8], bool)) {
        if !self.partial.is_empty() || self.truncated {
            line(&self.partial, self.truncated);
        }
        self.partial = Vec::new();
        self.truncated = false;
    }
}

/// What one log thread saw, returned when it ends: a reader counts its pipe's bytes (and its
/// lines when it parses them itself), the parser thread the lines of both pipes. Summed.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct StreamStats {
    pub bytes: u64,
    #[serde(flatten)]
    pub parse: ParseStats,
}

/// Reads queued for the parser thread, at most. Past this the readers wait for it: memory stays
/// bounded, and the log file runs at most this many reads (and the one being parsed) ahead of
/// the parser.
const PARSE_QUEUE_CHUNKS: usize = 4;

/// What a reader hands the parser thread, in the order it read.
enum ToParser {
    /// `chunk[..n]`, read from `stream` at `at`.
    Chunk {
        stream: Stream,
        chunk: Arc<Vec<u8>>,
        n: usize,
        at: Instant,
    },
    /// `stream`'s pipe closed: its last line and its open message are due now, not at the end of
    /// the other pipe.
    End(Stream),
}

/// One pipe's lines: framed across reads, parsed in order, events and batches passed on.
struct LineState<'a> {
    framer: LineFramer,
    parser: LogParser,
    sink: ReaderSink<'a>,
}

impl<'a> LineState<'a> {
    fn new(events: &'a UnboundedSender<Timed>, shared: &'a Shared) -> Self {
        LineState {
            framer: LineFramer::new(MAX_PARSED_LINE),
            parser: LogParser::telling(shared.loopback),
            sink: ReaderSink {
                events,
                batches: Batches::default(),
                series: &shared.series,
                at: Instant::now(),
            },
        }
    }

    /// One read, made at `at`.
    fn feed(&mut self, bytes: &[u8], at: Instant, shared: &Shared) {
        self.sink.at = at;
        // One SIMD pass over the chunk spares every line of it its own UTF-8 and `\r`/ESC checks.
        let plain = is_plain(bytes);
        let (parser, sink) = (&mut self.parser, &mut self.sink);
        self.framer
            .feed_hinted(bytes, plain, |line, truncated, plain| {
                parser.line_hinted(line, truncated, plain, sink)
            });
        self.sink.batches.publish(&shared.batches, &shared.series);
    }

    /// The pipe went quiet with a multi-line message open: close it now, not at the next line.
    fn idle(&mut self) {
        self.sink.at = Instant::now();
        self.parser.flush(&mut self.sink);
    }

    /// The pipe closed: its last line (it had no newline), its open message, its counters.
    fn finish(mut self, shared: &Shared) -> ParseStats {
        let (parser, sink) = (&mut self.parser, &mut self.sink);
        self.framer
            .finish(|line, truncated| parser.line(line, truncated, sink));
        self.idle();
        self.sink.batches.publish(&shared.batches, &shared.series);
        self.parser.stats
    }
}

/// Where a reader's reads go to be parsed.
enum Parsing<'a> {
    /// To the parser thread; a send waits while its queue is full.
    Thread(SyncSender<ToParser>, Stream),
    /// Here, between reads: no parser thread could be started.
    Inline(Box<LineState<'a>>),
    /// The parser thread ended early (only a bug would do that): the log goes on, unparsed.
    Off,
}

impl Parsing<'_> {
    fn chunk(&mut self, chunk: Arc<Vec<u8>>, n: usize, at: Instant, shared: &Shared) {
        match self {
            Parsing::Thread(tx, stream) => {
                let stream = *stream;
                if tx
                    .send(ToParser::Chunk {
                        stream,
                        chunk,
                        n,
                        at,
                    })
                    .is_err()
                {
                    tracing::error!("the log parser thread ended early; the log file and the terminal copy go on, unparsed");
                    *self = Parsing::Off;
                }
            }
            Parsing::Inline(lines) => {
                lines.feed(&chunk[..n], at, shared);
                recycle(chunk);
            }
            Parsing::Off => recycle(chunk),
        }
    }

    /// The pipe closed. Parsing in place, its counters; else the parser thread counts.
    fn finish(self, shared: &Shared) -> ParseStats {
        match self {
            Parsing::Thread(tx, stream) => {
                // Gone only if it ended early (already reported).
                let _ = tx.send(ToParser::End(stream));
                ParseStats::default()
            }
            Parsing::Inline(lines) => lines.finish(shared),
            Parsing::Off => ParseStats::default(),
        }
    }
}

/// A reader learns, before its first read, where its reads go: `Some` is the parser thread's
/// queue, `None` (or no word: the start failed after this reader) says to parse in place.
type ParserWord = std::sync::mpsc::Receiver<Option<SyncSender<ToParser>>>;

/// Start the log threads: one reader per pipe, then one parser thread for both pipes. Returned in
/// the order to join them: the parser, which ends after the readers, last. A refused reader is an
/// error; a refused parser thread is not (each reader then parses its own reads), and asking for
/// it last lets a run whose thread limit allows the readers only go on.
pub fn spawn_log_threads(
    pipes: Vec<(Stream, OwnedFd, Option<&'static TerminalCopy>)>,
    shared: &Arc<Shared>,
    events: &UnboundedSender<Timed>,
) -> std::io::Result<Vec<std::thread::JoinHandle<StreamStats>>> {
    start(pipes, shared, events, true)
}

/// [`spawn_log_threads`]; `parser_thread: false` tries no parser thread (as if refused).
fn start(
    pipes: Vec<(Stream, OwnedFd, Option<&'static TerminalCopy>)>,
    shared: &Arc<Shared>,
    events: &UnboundedSender<Timed>,
    parser_thread: bool,
) -> std::io::Result<Vec<std::thread::JoinHandle<StreamStats>>> {
    let mut threads = Vec::new();
    let mut words = Vec::new();
    for (stream, fd, terminal) in pipes {
        let (word, heard) = std::sync::mpsc::channel();
        threads.push(spawn_reader(
            stream,
            fd,
            shared.clone(),
            terminal,
            events.clone(),
            heard,
        )?);
        words.push(word);
    }
    let (tx, rx) = sync_channel(PARSE_QUEUE_CHUNKS);
    let parser = parser_thread.then(|| spawn_parser(rx, shared.clone(), events.clone()));
    let tx = match parser {
        Some(Ok(handle)) => {
            threads.push(handle);
            Some(tx)
        }
        Some(Err(e)) => {
            tracing::warn!("no log parser thread ({e}): each reader parses its own output");
            None
        }
        None => None,
    };
    for word in words {
        // A reader gone already (it panicked) needs no word.
        let _ = word.send(tx.clone());
    }
    Ok(threads)
}

/// Read `fd` to its end on a new thread.
fn spawn_reader(
    stream: Stream,
    fd: OwnedFd,
    shared: Arc<Shared>,
    terminal: Option<&'static TerminalCopy>,
    events: UnboundedSender<Timed>,
    word: ParserWord,
) -> std::io::Result<std::thread::JoinHandle<StreamStats>> {
    let name = match stream {
        Stream::Stdout => "child-stdout",
        Stream::Stderr => "child-stderr",
    };
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let parsing = match word.recv() {
                Ok(Some(tx)) => Parsing::Thread(tx, stream),
                _ => Parsing::Inline(Box::new(LineState::new(&events, &shared))),
            };
            read_loop(fd, &shared, terminal, parsing)
        })
}

fn spawn_parser(
    rx: Receiver<ToParser>,
    shared: Arc<Shared>,
    events: UnboundedSender<Timed>,
) -> std::io::Result<std::thread::JoinHandle<StreamStats>> {
    std::thread::Builder::new()
        .name("log-parser".into())
        .spawn(move || parse_loop(&rx, &shared, &events))
}

fn read_loop(
    fd: OwnedFd,
    shared: &Shared,
    terminal: Option<&TerminalCopy>,
    mut parsing: Parsing<'_>,
) -> StreamStats {
    // Fewer, larger reads when the child writes fast. Failure only costs speed.
    let _ = nix::fcntl::fcntl(
        &fd,
        nix::fcntl::FcntlArg::F_SETPIPE_SZ(CHUNK as libc::c_int),
    );
    let mut file = File::from(fd);
    let mut buf = spare_buffer();
    let mut bytes = 0u64;
    let mut redactor = shared.redact.clone().map(StreamRedactor::new);
    loop {
        if closed_idle(&mut parsing, &file) {
            continue;
        }
        let Some(n) = read_some(&mut file, &mut buf) else {
            break;
        };
        let at = Instant::now();
        bytes += n as u64;
        let (chunk, len) = match &mut redactor {
            // The buffer itself goes on to the terminal queue and the parser: no copy.
            None => (Arc::new(std::mem::take(&mut buf)), n),
            Some(r) => {
                let red = r.feed(&buf[..n]);
                let len = red.len();
                (Arc::new(red), len)
            }
        };
        pass_on(chunk, len, at, shared, terminal, &mut parsing);
        if buf.is_empty() {
            buf = spare_buffer();
        }
    }
    if let Some(r) = &mut redactor {
        let held = r.finish();
        let len = held.len();
        pass_on(
            Arc::new(held),
            len,
            Instant::now(),
            shared,
            terminal,
            &mut parsing,
        );
    }
    StreamStats {
        bytes,
        parse: parsing.finish(shared),
    }
}

/// One read; `None` at the end of the pipe (or an error, reported: the pipe is done either way).
fn read_some(file: &mut File, buf: &mut [u8]) -> Option<usize> {
    loop {
        match file.read(buf) {
            Ok(0) => return None,
            Ok(n) => return Some(n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::error!("reading the child's output: {e}");
                return None;
            }
        }
    }
}

/// Parsing in place with a message open, the pipe quiet for a while: the message is closed (true).
/// The parser thread watches for quiet itself, without holding up the reads.
fn closed_idle(parsing: &mut Parsing<'_>, file: &File) -> bool {
    let Parsing::Inline(lines) = parsing else {
        return false;
    };
    let quiet = lines.parser.capturing() && !readable_within(file, CAPTURE_IDLE_MS);
    if quiet {
        lines.idle();
    }
    quiet
}

/// One chunk (`chunk[..n]`, read at `at`), once: to the log file, the terminal copy, the tail,
/// and the parser.
fn pass_on(
    chunk: Arc<Vec<u8>>,
    n: usize,
    at: Instant,
    shared: &Shared,
    terminal: Option<&TerminalCopy>,
    parsing: &mut Parsing<'_>,
) {
    let bytes = &chunk[..n];
    if bytes.is_empty() {
        return;
    }
    lock(&shared.log).write(bytes);
    if let Some(t) = terminal {
        t.offer_shared(chunk.clone(), n);
    }
    lock(&shared.tail).push(bytes);
    parsing.chunk(chunk, n, at, shared);
}

/// The parser thread: both pipes' reads in the order they were read, until both readers are done.
fn parse_loop(
    rx: &Receiver<ToParser>,
    shared: &Shared,
    events: &UnboundedSender<Timed>,
) -> StreamStats {
    let mut pipes = Pipes::new(events, shared);
    loop {
        let got = match pipes.idle_deadline() {
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(at) => rx.recv_timeout(at.saturating_duration_since(Instant::now())),
        };
        match got {
            Ok(msg) => pipes.take(msg, shared),
            // Only when nothing is queued: a pipe whose reads wait in the queue is not quiet.
            Err(RecvTimeoutError::Timeout) => pipes.close_idle(),
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    StreamStats {
        bytes: 0,
        parse: pipes.finish(shared),
    }
}

/// The parser thread's state: each pipe's lines (until its `End`), when each was last fed, and
/// the counters of the pipes that ended.
struct Pipes<'a> {
    lines: [Option<LineState<'a>>; 2],
    /// When each pipe's last read was parsed: it is quiet from then on.
    fed: [Instant; 2],
    ended: ParseStats,
}

impl<'a> Pipes<'a> {
    fn new(events: &'a UnboundedSender<Timed>, shared: &'a Shared) -> Self {
        Pipes {
            lines: [(); 2].map(|()| Some(LineState::new(events, shared))),
            fed: [Instant::now(); 2],
            ended: ParseStats::default(),
        }
    }

    fn take(&mut self, msg: ToParser, shared: &Shared) {
        match msg {
            ToParser::Chunk {
                stream,
                chunk,
                n,
                at,
            } => {
                if let Some(lines) = &mut self.lines[stream as usize] {
                    lines.feed(&chunk[..n], at, shared);
                }
                self.fed[stream as usize] = Instant::now();
                recycle(chunk);
            }
            ToParser::End(stream) => {
                if let Some(lines) = self.lines[stream as usize].take() {
                    self.ended.add(&lines.finish(shared));
                }
            }
        }
    }

    /// When the first pipe with a multi-line message open will have been quiet long enough.
    fn idle_deadline(&self) -> Option<Instant> {
        self.lines
            .iter()
            .zip(&self.fed)
            .filter(|(l, _)| l.as_ref().is_some_and(|l| l.parser.capturing()))
            .map(|(_, at)| *at + CAPTURE_IDLE)
            .min()
    }

    fn close_idle(&mut self) {
        let now = Instant::now();
        for (lines, at) in self.lines.iter_mut().zip(&self.fed) {
            match lines {
                Some(l) if l.parser.capturing() && now >= *at + CAPTURE_IDLE => l.idle(),
                _ => {}
            }
        }
    }

    /// Both readers are gone. One that ended without its `End` (it panicked): its lines so far
    /// still count.
    fn finish(self, shared: &Shared) -> ParseStats {
        let mut stats = self.ended;
        for lines in self.lines.into_iter().flatten() {
            stats.add(&lines.finish(shared));
        }
        stats
    }
}

fn readable_within(fd: &impl AsFd, ms: u16) -> bool {
    let mut p = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    // An error counts as readable: the read that follows reports it.
    poll(&mut p, PollTimeout::from(ms)) != Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(chunks: &[&[u8]], max: usize) -> Vec<(Vec<u8>, bool)> {
        let mut f = LineFramer::new(max);
        let mut out = Vec::new();
        for c in chunks {
            f.feed(c, |l, t| out.push((l.to_vec(), t)));
        }
        f.finish(|l, t| out.push((l.to_vec(), t)));
        out
    }

    #[test]
    fn framer_joins_lines_across_chunks_and_keeps_the_last_unterminated_line() {
        let out = frame(&[b"ab", b"c\nde", b"f\n\ng"], 100);
        assert_eq!(
            out,
            [
                (b"abc".to_vec(), false),
                (b"def".to_vec(), false),
                (b"".to_vec(), false),
                (b"g".to_vec(), false)
            ]
        );
    }

    #[test]
    fn framer_bounds_long_lines_and_marks_them() {
        let out = frame(&[b"0123456789", b"abcdef", b"\nok\n"], 8);
        assert_eq!(out, [(b"01234567".to_vec(), true), (b"ok".to_vec(), false)]);
        let out = frame(&[b"0123456789abc\nok"], 8);
        assert_eq!(out, [(b"01234567".to_vec(), true), (b"ok".to_vec(), false)]);
    }

    /// Events and stats of `data` through the reader's path (chunk hints, framer, fast path),
    /// cut into chunks at `cuts`.
    fn reader_path(data: &[u8], cuts: &[usize], max: usize) -> (Vec<LogEvent>, ParseStats) {
        let mut f = LineFramer::new(max);
        let mut p = LogParser::new();
        let mut out = Vec::new();
        let mut sink = |e| out.push(e);
        let mut from = 0;
        for &to in cuts.iter().chain([&data.len()]) {
            let chunk = &data[from..to];
            f.feed_hinted(chunk, is_plain(chunk), |l, t, plain| {
                p.line_hinted(l, t, plain, &mut sink)
            });
            from = to;
        }
        f.finish(|l, t| p.line(l, t, &mut sink));
        p.flush(&mut sink);
        (out, p.stats)
    }

    /// The same lines, each read whole as text by the full parser (no fast path, no hints).
    fn reference(data: &[u8], max: usize) -> (Vec<LogEvent>, ParseStats) {
        let mut p = LogParser::new();
        let mut out = Vec::new();
        let mut sink = |e| out.push(e);
        let mut lines: Vec<&[u8]> = data.split(|&b| b == b'\n').collect();
        if lines.last() == Some(&&b""[..]) {
            lines.pop();
        }
        for l in lines {
            p.stats.lines += 1;
            if l.len() > max {
                p.stats.truncated_lines += 1;
            }
            let l = &l[..l.len().min(max)];
            p.line_full(l.strip_suffix(b"\r").unwrap_or(l), &mut sink);
        }
        p.flush(&mut sink);
        (out, p.stats)
    }

    /// Lines every branch of the fast path and its fallbacks must agree on.
    fn tricky() -> Vec<u8> {
        let mut v = Vec::new();
        for l in [
            // A line that is not plain, then a plain one: a read that cuts the first after its
            // odd byte leaves a plain rest, which must not make the whole line pass as plain.
            &b"[2026-12-02 08:45:01 TP2] Decode batch, \xff: 1, #running-req: 2"[..],
            b"[2026-12-02 08:45:02 TP0] Decode batch, #running-req: 32, token usage: 0.02, cuda graph: True",
            b"[2026-12-02 08:45:02.123 DP1 TP3] Prefill batch [7], #new-seq: 1, #new-token: 510",
            b"[2026-12-02 08:45:02] Decode batch",
            b"[2026-12-02 08:45:02 TP1] Decode batch, #running-req: \xff\xfe bad, cuda graph: False",
            b"[2026-12-02 08:45:02 TP0] Decode batch, #running-req: 1\r",
            b"[2026-12-02 08:45:02 TP0] Decode batch, x: 1\rPrefill batch, y: 2",
            b"\x1b[33m[2026-12-02 08:45:02 TP0] Decode batch, colour: 1\x1b[0m",
            b"[2026-12-02 08:45:02 TP0] Decode batch, usage: \xc3\xa9t\xc3\xa9",
            b"[2026-12-02 08:45:03] INFO:     127.0.0.1:50312 - \"GET /health HTTP/1.1\" 200 OK",
            b"[2026-12-02 08:45:03] INFO:     [pid 12] Child process [12] died",
            b"[2026-12-02 08:45:03] INFO:     Uvicorn running on http://0.0.0.0:30000",
            b"INFO:     127.0.0.1:50312 - \"GET /ready to roll! HTTP/1.1\" 200 OK",
            b"[2026-12-02 08:45:04 TP0] Scheduler hit an exception: Traceback (most recent call last):",
            b"  File \"x.py\", line 1, in <module>",
            b"[2026-12-02 08:45:04 TP0] Decode batch, closes: the capture",
            b"Traceback (most recent call last):",
            b"  File \"y.py\", line 2",
            b"[2026-12-02 08:45:05 TP0] INFO:     127.0.0.1:1 - \"GET / HTTP/1.1\" 200",
            b"RuntimeError: CUDA out of memory",
            b"[2026-12-02 08:45:05 TP0] Load weight begin. avail mem=70.1 GB",
            b"[2026-12-02 08:45:06] The server is fired up and ready to roll!",
            b"[2026-12-02 08:45:0 TP0] Decode batch, not: a prefix",
            b"[2026-12-02 08:45:07 tp0] Decode batch, lower: rank",
            b"  0%|          | 0/8\rCapturing batches (bs=32):  12%|\xe2\x96\x88 | 1/8",
            b"",
            b"[2026-12-02 08:45:08 TP3] Decode batch, \x1b[1mbold\x1b[0m: 1, #running-req: 5",
            b"[2026-12-02 08:45:08 TP0] Decode batch, no: newline at the end",
        ] {
            v.extend_from_slice(l);
            v.push(b'\n');
        }
        v.pop();
        v
    }

    #[test]
    fn reader_path_gives_the_full_parsers_events_wherever_the_reads_split_the_lines() {
        let data = tricky();
        let want = reference(&data, MAX_PARSED_LINE);
        assert!(want.0.iter().any(|e| matches!(e, LogEvent::Batch { .. })));
        assert!(want.0.iter().any(|e| matches!(e, LogEvent::Fatal { .. })));
        assert!(want.1.non_utf8_lines > 0 && want.1.progress_lines > 0);
        // Every split in two, and every split in three around the first 200 bytes.
        for a in 0..=data.len() {
            assert_eq!(
                reader_path(&data, &[a], MAX_PARSED_LINE),
                want,
                "cut at {a}"
            );
        }
        for a in 0..200 {
            for b in a..a + 200 {
                assert_eq!(
                    reader_path(&data, &[a, b], MAX_PARSED_LINE),
                    want,
                    "cuts {a} {b}"
                );
            }
        }
        // With a line limit that truncates, too.
        let want = reference(&data, 60);
        for a in 0..=data.len() {
            assert_eq!(reader_path(&data, &[a], 60), want, "cut at {a}, max 60");
        }
    }

    #[test]
    fn reader_path_gives_the_full_parsers_events_on_every_recorded_log_in_any_chunking() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/sglang-0.5.14-h200"
        );
        let mut seen = 0;
        for run in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let Ok(data) = std::fs::read(run.path().join("server.log")) else {
                continue;
            };
            seen += 1;
            let want = reference(&data, MAX_PARSED_LINE);
            // Chunk sizes from a fixed pseudo-random sequence, 1 byte to 4 KiB.
            for seed in 1..=8u64 {
                let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                let mut cuts = Vec::new();
                let mut at = 0;
                loop {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    at += 1 + (x % (if seed % 2 == 0 { 64 } else { 4096 })) as usize;
                    if at >= data.len() {
                        break;
                    }
                    cuts.push(at);
                }
                assert_eq!(
                    reader_path(&data, &cuts, MAX_PARSED_LINE),
                    want,
                    "{} seed {seed}",
                    run.path().display()
                );
            }
        }
        assert!(seen >= 5, "fixtures not found under {dir}");
    }

    /// What the log threads pass on, gathered once they are all joined.
    struct Passed {
        events: Vec<LogEvent>,
        stats: StreamStats,
        batches: Batches,
    }

    /// `inputs` (stdout's, then stderr's) written into pipes in pieces of 1 byte to 64 KiB, read
    /// by the log threads with a parser thread or parsing in place.
    fn through_pipes(inputs: &[&[u8]], parser_thread: bool) -> Passed {
        let shared = Shared::new(
            LogFile::new(None, None),
            None,
            Arc::new(ServerSeries::default()),
        );
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut pipes = Vec::new();
        let mut writers = Vec::new();
        for (data, stream) in inputs.iter().zip([Stream::Stdout, Stream::Stderr]) {
            let (r, w) = nix::unistd::pipe().unwrap();
            pipes.push((stream, r, None));
            let data = data.to_vec();
            writers.push(std::thread::spawn(move || {
                write_in_pieces(File::from(w), &data)
            }));
        }
        let threads = start(pipes, &shared, &tx, parser_thread).unwrap();
        assert_eq!(threads.len(), inputs.len() + usize::from(parser_thread));
        drop(tx);
        writers.into_iter().for_each(|w| w.join().unwrap());
        let mut stats = StreamStats::default();
        for t in threads {
            let s = t.join().unwrap();
            stats.bytes += s.bytes;
            stats.parse.add(&s.parse);
        }
        // Every event is there once the threads are joined: nothing comes later.
        let mut events = Vec::new();
        while let Ok(t) = rx.try_recv() {
            events.push(t.event);
        }
        assert!(rx.is_closed());
        let batches = std::mem::take(&mut *lock(&shared.batches));
        Passed {
            events,
            stats,
            batches,
        }
    }

    /// The reference's events split the way the reader's sink splits them: batch lines kept
    /// (counted, latest per kind and rank), retractions to the series, the rest as events.
    fn as_passed(data: &[u8]) -> (Vec<LogEvent>, Batches, ParseStats) {
        let (all, stats) = reference(data, MAX_PARSED_LINE);
        let mut batches = Batches::default();
        let mut events = Vec::new();
        for e in all {
            match e {
                LogEvent::Batch { kind, rank, fields } => {
                    batches.count[kind as usize] += 1;
                    let body = Value::Object(fields).to_string();
                    batches.keep(kind, rank.as_deref(), body.as_bytes());
                }
                LogEvent::Retraction { .. } => {}
                e => events.push(e),
            }
        }
        (events, batches, stats)
    }

    /// The kinds and ranks of the latest batch lines (their fields are checked by the tests
    /// above; here what matters is which line was last).
    fn latest_keys(b: &Batches) -> Vec<(BatchKind, Option<&str>)> {
        b.latest
            .iter()
            .map(|l| (l.kind, l.rank.as_deref()))
            .collect()
    }

    fn write_in_pieces(mut w: File, data: &[u8]) {
        let mut x = data.len() as u64 | 1;
        let mut rest = data;
        while !rest.is_empty() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let n = rest.len().min(1 + (x % 65536) as usize);
            w.write_all(&rest[..n]).unwrap();
            rest = &rest[n..];
        }
    }

    fn fixture_logs() -> Vec<Vec<u8>> {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/sglang-0.5.14-h200"
        );
        let mut logs: Vec<Vec<u8>> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|run| std::fs::read(run.path().join("server.log")).ok())
            .collect();
        assert!(logs.len() >= 5, "fixtures not found under {dir}");
        logs.push(tricky());
        logs
    }

    #[test]
    fn log_threads_give_the_full_parsers_events_with_or_without_a_parser_thread() {
        for data in fixture_logs() {
            let (events, batches, stats) = as_passed(&data);
            for parser_thread in [true, false] {
                let got = through_pipes(&[&data], parser_thread);
                let why = format!("parser thread: {parser_thread}");
                assert_eq!(got.events, events, "{why}");
                assert_eq!(got.stats.parse, stats, "{why}");
                assert_eq!(got.stats.bytes, data.len() as u64, "{why}");
                assert_eq!(got.batches.count, batches.count, "{why}");
                assert_eq!(latest_keys(&got.batches), latest_keys(&batches), "{why}");
            }
        }
    }

    #[test]
    fn one_parser_thread_keeps_each_pipes_lines_apart_and_in_order() {
        let logs = fixture_logs();
        let (out, err) = (&logs[0], logs.last().unwrap());
        let (mut events, out_batches, mut stats) = as_passed(out);
        let (err_events, err_batches, err_stats) = as_passed(err);
        events.extend(err_events);
        stats.add(&err_stats);
        // The two pipes' events interleave as their reads fell: compared in one order.
        let key = |e: &LogEvent| format!("{e:?}");
        events.sort_by_key(key);
        for parser_thread in [true, false] {
            let mut got = through_pipes(&[out, err], parser_thread);
            got.events.sort_by_key(key);
            assert_eq!(got.events, events, "parser thread: {parser_thread}");
            assert_eq!(got.stats.parse, stats);
            assert_eq!(got.stats.bytes, (out.len() + err.len()) as u64);
            let counts = [0, 1].map(|k| out_batches.count[k] + err_batches.count[k]);
            assert_eq!(got.batches.count, counts);
        }
    }

    #[test]
    fn an_open_traceback_is_closed_when_the_pipe_goes_quiet_with_or_without_a_parser_thread() {
        for parser_thread in [true, false] {
            let shared = Shared::new(
                LogFile::new(None, None),
                None,
                Arc::new(ServerSeries::default()),
            );
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let (r, w) = nix::unistd::pipe().unwrap();
            let threads =
                start(vec![(Stream::Stderr, r, None)], &shared, &tx, parser_thread).unwrap();
            let mut w = File::from(w);
            w.write_all(b"Traceback (most recent call last):\n  File \"x.py\", line 1\n")
                .unwrap();
            let since = Instant::now();
            let event = loop {
                if let Ok(t) = rx.try_recv() {
                    break t.event;
                }
                assert!(
                    since.elapsed().as_secs() < 5,
                    "no event while the pipe is open"
                );
                std::thread::sleep(Duration::from_millis(5));
            };
            assert!(matches!(event, LogEvent::Traceback { .. }), "{event:?}");
            // Not before the pipe was quiet for the idle time.
            assert!(since.elapsed() >= CAPTURE_IDLE - Duration::from_millis(20));
            drop(w);
            for t in threads {
                t.join().unwrap();
            }
        }
    }

    #[test]
    fn batches_published_per_chunk_equal_batches_recorded_per_line() {
        let lines: [(BatchKind, Option<&str>, &[u8]); 5] = [
            (BatchKind::Decode, Some("TP0"), b" a: 1"),
            (BatchKind::Decode, Some("TP1"), b" a: 2"),
            (BatchKind::Prefill, None, b" b: 3"),
            (BatchKind::Decode, Some("TP0"), b" a: 4"),
            (BatchKind::Decode, Some("TP1"), b" a: \xff"),
        ];
        let mut direct = Batches::default();
        let shared = Mutex::new(Batches::default());
        let mut local = Batches::default();
        let series = ServerSeries::default();
        for (i, (k, r, b)) in lines.iter().enumerate() {
            direct.record(*k, *r, b);
            local.record(*k, *r, b);
            if i % 2 == 1 {
                local.publish(&shared, &series);
            }
        }
        local.publish(&shared, &series);
        // Every line is counted; the series samples one per (kind, rank) per hand-over.
        let run = series.summary();
        assert_eq!(
            (&run["decode"]["lines"], &run["decode"]["samples"]),
            (&4.into(), &4.into())
        );
        local.record(BatchKind::Decode, Some("TP0"), b" a: 5");
        local.record(BatchKind::Decode, Some("TP0"), b" a: 6");
        local.publish(&Mutex::new(Batches::default()), &series);
        let run = series.summary();
        assert_eq!(
            (&run["decode"]["lines"], &run["decode"]["samples"]),
            (&6.into(), &5.into())
        );
        let shared = shared.into_inner().unwrap();
        assert_eq!(shared.count, direct.count);
        assert_eq!(shared.count, [1, 4]);
        assert_eq!(shared.latest(), direct.latest());
        assert_eq!(shared.latest()[1].2["a"], serde_json::json!("\u{fffd}"));
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        let mut t = Tail::new();
        for i in 0..10_000 {
            t.push(format!("line {i}\n").as_bytes());
        }
        assert_eq!(t.last_lines(2), ["line 9998", "line 9999"]);
        assert!(t.buf.len() <= TAIL_BYTES);
        // Pushes of every size, around and past the ring's size, keep exactly the last bytes.
        let all: Vec<u8> = (0..400_000u32).map(|i| (i % 251) as u8).collect();
        for step in [
            1,
            7,
            4096,
            TAIL_BYTES - 1,
            TAIL_BYTES,
            TAIL_BYTES + 3,
            200_000,
        ] {
            let mut t = Tail::new();
            for piece in all.chunks(step) {
                t.push(piece);
            }
            assert_eq!(t.bytes(), all[all.len() - TAIL_BYTES..], "step {step}");
        }
        let mut t = Tail::new();
        t.push(b"short");
        assert_eq!(t.bytes(), b"short");
    }
}
