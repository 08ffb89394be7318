//! The log path: read the child's pipes, write every byte to the log file, copy to the terminal
//! without ever blocking the child, and feed lines to the parser.
//!
//! One blocking thread per pipe. Per chunk read: one `write` to the log file (shared by both
//! streams under a lock, so the file keeps arrival order), a non-blocking hand-off to a terminal
//! writer thread (a bounded queue: when a terminal or pipe is slower than the child, the terminal
//! copy drops chunks and counts them; the log file never does, nor a copy to a file or /dev/null,
//! which cannot stall), then line framing and parsing in place.
use super::parse::{batch_fields, is_plain, BatchKind, LogEvent, LogParser, LogSink, ParseStats};
use crate::events::FatalReason;
use crate::redact::{Secrets, StreamRedactor};
use crate::server_series::ServerSeries;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use serde_json::{Map, Value};
use sglang_probes::sync::lock;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SendError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// Bytes read per `read` call (the pipe is enlarged to match).
const CHUNK: usize = 256 * 1024;
/// Longest line handed to the parser; the rest of a longer line is logged but not parsed.
pub const MAX_PARSED_LINE: usize = 1024 * 1024;
/// Chunks the terminal copy may fall behind before it drops (bounded memory: 16 × 256 KiB).
const TERMINAL_QUEUE_CHUNKS: usize = 16;
/// Read buffers kept for reuse by whoever held them last, at most.
const SPARE_BUFFERS: usize = 8;
/// When a multi-line message is open and the pipe is quiet this long, close it.
const CAPTURE_IDLE_MS: u16 = 200;
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
}

impl LogFile {
    pub fn new(file: Option<File>, path: Option<String>) -> Self {
        LogFile {
            file,
            path,
            written: 0,
            lost: 0,
            error: None,
        }
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
                tracing::error!(
                    "{msg}; the child keeps running, further log bytes are counted as lost"
                );
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

/// The reader's sink: events to the lifecycle, batches kept here and published to
/// `Shared::batches` after each chunk.
struct ReaderSink<'a> {
    events: &'a UnboundedSender<Timed>,
    batches: Batches,
    series: &'a ServerSeries,
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
        let _ = self.events.send(Timed {
            at: Instant::now(),
            event,
        });
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
}

impl Shared {
    pub fn new(log: LogFile, redact: Option<Secrets>, series: Arc<ServerSeries>) -> Arc<Self> {
        Arc::new(Shared {
            redact: redact.filter(|s| !s.is_empty()),
            log: Mutex::new(log),
            tail: Mutex::new(Tail::new()),
            batches: Mutex::new(Batches::default()),
            series,
        })
    }
}

/// Our stdout or stderr, written by one thread from a bounded queue. Both the child's output and
/// our own messages go through it, so a stalled terminal (a full pipe nobody reads) can block
/// neither the child nor the supervisor: past the queue's bound, chunks are dropped and counted.
///
/// A reader's chunk is not copied: the queue holds the read buffer itself (shared with the reader,
/// which parses it meanwhile), and the writer hands finished buffers back for the next reads.
pub struct TerminalCopy {
    tx: Option<SyncSender<(Arc<Vec<u8>>, usize)>>,
    /// Our fd is a regular file or a device such as /dev/null: a write there finishes, so the
    /// queue waits for room instead of dropping (only a terminal or a pipe can stall for ever).
    lossless: bool,
    pending: Arc<AtomicU64>,
    pub dropped: Arc<AtomicU64>,
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
        let dup = if fd == 1 {
            nix::unistd::dup(std::io::stdout())
        } else {
            nix::unistd::dup(std::io::stderr())
        };
        let mut out: Option<File> = dup.ok().map(File::from);
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
        match started {
            Ok(_) => TerminalCopy {
                tx: Some(tx),
                lossless,
                pending,
                dropped,
            },
            Err(_) => TerminalCopy {
                tx: None,
                lossless,
                pending,
                dropped,
            },
        }
    }

    pub fn offer(&self, bytes: &[u8]) {
        self.offer_shared(Arc::new(bytes.to_vec()), bytes.len());
    }

    /// Queue `chunk[..n]` for the terminal, or drop it (counted) when the queue is full.
    fn offer_shared(&self, chunk: Arc<Vec<u8>>, n: usize) {
        let Some(tx) = &self.tx else {
            self.dropped.fetch_add(n as u64, Ordering::Relaxed);
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
    pub fn flush(&self, timeout: std::time::Duration) {
        let end = Instant::now() + timeout;
        while self.pending.load(Ordering::Acquire) > 0 && Instant::now() < end {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
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

/// What one reader saw, returned when its pipe closes.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct StreamStats {
    pub bytes: u64,
    #[serde(flatten)]
    pub parse: ParseStats,
}

/// Read `fd` to its end on a new thread.
pub fn spawn_reader(
    stream: Stream,
    fd: OwnedFd,
    shared: Arc<Shared>,
    terminal: Option<&'static TerminalCopy>,
    events: UnboundedSender<Timed>,
) -> std::io::Result<std::thread::JoinHandle<StreamStats>> {
    let name = match stream {
        Stream::Stdout => "child-stdout",
        Stream::Stderr => "child-stderr",
    };
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || read_loop(fd, &shared, terminal, &events))
}

fn read_loop(
    fd: OwnedFd,
    shared: &Shared,
    terminal: Option<&TerminalCopy>,
    events: &UnboundedSender<Timed>,
) -> StreamStats {
    // Fewer, larger reads when the child writes fast. Failure only costs speed.
    let _ = nix::fcntl::fcntl(
        &fd,
        nix::fcntl::FcntlArg::F_SETPIPE_SZ(CHUNK as libc::c_int),
    );
    let mut file = File::from(fd);
    let mut buf = spare_buffer();
    let mut framer = LineFramer::new(MAX_PARSED_LINE);
    let mut parser = LogParser::new();
    let mut bytes = 0u64;
    let mut emit = ReaderSink {
        events,
        batches: Batches::default(),
        series: &shared.series,
    };
    let mut redactor = shared.redact.clone().map(StreamRedactor::new);
    loop {
        if parser.capturing() && !readable_within(&file, CAPTURE_IDLE_MS) {
            parser.flush(&mut emit);
            continue;
        }
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::error!("reading the child's output: {e}");
                break;
            }
        };
        bytes += n as u64;
        match &mut redactor {
            None => {
                // The buffer itself goes to the terminal queue; reused here if the writer is done
                // with it by the time this chunk is parsed.
                let chunk = Arc::new(std::mem::take(&mut buf));
                pass_on(
                    &chunk,
                    n,
                    shared,
                    terminal,
                    &mut framer,
                    &mut parser,
                    &mut emit,
                );
                buf = Arc::into_inner(chunk).unwrap_or_else(spare_buffer);
            }
            Some(r) => {
                let red = r.feed(&buf[..n]);
                let len = red.len();
                pass_on(
                    &Arc::new(red),
                    len,
                    shared,
                    terminal,
                    &mut framer,
                    &mut parser,
                    &mut emit,
                );
            }
        }
    }
    if let Some(r) = &mut redactor {
        let held = r.finish();
        let len = held.len();
        pass_on(
            &Arc::new(held),
            len,
            shared,
            terminal,
            &mut framer,
            &mut parser,
            &mut emit,
        );
    }
    framer.finish(|line, truncated| parser.line(line, truncated, &mut emit));
    parser.flush(&mut emit);
    emit.batches.publish(&shared.batches, &shared.series);
    StreamStats {
        bytes,
        parse: parser.stats,
    }
}

/// One chunk (`chunk[..n]`), once: to the log file, the terminal copy, the tail, and the parser.
fn pass_on(
    chunk: &Arc<Vec<u8>>,
    n: usize,
    shared: &Shared,
    terminal: Option<&TerminalCopy>,
    framer: &mut LineFramer,
    parser: &mut LogParser,
    emit: &mut ReaderSink<'_>,
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
    // One SIMD pass over the chunk spares every line of it its own UTF-8 and `\r`/ESC checks.
    let plain = is_plain(bytes);
    framer.feed_hinted(bytes, plain, |line, truncated, plain| {
        parser.line_hinted(line, truncated, plain, emit)
    });
    emit.batches.publish(&shared.batches, &shared.series);
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
