//! The log path: read the child's pipes, write every byte to the log file, copy to the terminal
//! without ever blocking the child, and feed lines to the parser.
//!
//! One blocking thread per pipe. Per chunk read: one `write` to the log file (shared by both
//! streams under a lock, so the file keeps arrival order), a non-blocking hand-off to a terminal
//! writer thread (a bounded queue: when the terminal is slower than the child, the terminal copy
//! drops chunks and counts them; the log file never does), then line framing and parsing in place.
use super::parse::{batch_fields, BatchKind, LogEvent, LogParser, LogSink, ParseStats};
use crate::redact::{Secrets, StreamRedactor};
use serde_json::{Map, Value};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// Bytes read per `read` call (the pipe is enlarged to match).
const CHUNK: usize = 256 * 1024;
/// Longest line handed to the parser; the rest of a longer line is logged but not parsed.
pub const MAX_PARSED_LINE: usize = 1024 * 1024;
/// Chunks the terminal copy may fall behind before it drops (bounded memory: 16 × 256 KiB).
const TERMINAL_QUEUE_CHUNKS: usize = 16;
/// When a multi-line message is open and the pipe is quiet this long, close it.
const CAPTURE_IDLE_MS: i32 = 200;
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

/// The last bytes of output (both streams), for "what did it print before it died".
pub struct Tail {
    buf: Vec<u8>,
}

impl Tail {
    fn push(&mut self, bytes: &[u8]) {
        let bytes = &bytes[bytes.len().saturating_sub(TAIL_BYTES)..];
        let overflow = (self.buf.len() + bytes.len()).saturating_sub(TAIL_BYTES);
        if overflow > 0 {
            self.buf.drain(..overflow);
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The last `n` complete lines, lossily decoded.
    pub fn last_lines(&self, n: usize) -> Vec<String> {
        let text = String::from_utf8_lossy(&self.buf);
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
    /// (kind, rank, text after `Decode batch,`); a handful of ranks, so a Vec beats a map.
    latest: Vec<(BatchKind, Option<String>, String)>,
}

impl Batches {
    fn record(&mut self, kind: BatchKind, rank: Option<&str>, body: &str) {
        self.count[kind as usize] += 1;
        match self
            .latest
            .iter_mut()
            .find(|(k, r, _)| *k == kind && r.as_deref() == rank)
        {
            Some((_, _, text)) => {
                text.clear();
                text.push_str(body);
            }
            None => self
                .latest
                .push((kind, rank.map(str::to_string), body.to_string())),
        }
    }

    /// The latest batch line's fields per (kind, rank).
    pub fn latest(&self) -> Vec<(BatchKind, Option<&str>, Map<String, Value>)> {
        self.latest
            .iter()
            .map(|(k, r, t)| (*k, r.as_deref(), batch_fields(t)))
            .collect()
    }
}

/// The reader's sink: events to the lifecycle, batches folded into `Shared::batches`.
struct ReaderSink<'a> {
    events: &'a UnboundedSender<Timed>,
    batches: &'a Mutex<Batches>,
}

impl LogSink for ReaderSink<'_> {
    fn event(&mut self, event: LogEvent) {
        // The receiver is gone only when the supervisor is shutting down.
        let _ = self.events.send(Timed {
            at: Instant::now(),
            event,
        });
    }

    fn batch(&mut self, kind: BatchKind, rank: Option<&str>, body: &str) {
        lock(self.batches).record(kind, rank, body);
    }
}

pub struct Shared {
    /// `--redact-log`: secret values replaced in everything the readers pass on.
    redact: Option<Secrets>,
    pub log: Mutex<LogFile>,
    pub tail: Mutex<Tail>,
    pub batches: Mutex<Batches>,
}

impl Shared {
    pub fn new(log: LogFile, redact: Option<Secrets>) -> Arc<Self> {
        Arc::new(Shared {
            redact: redact.filter(|s| !s.is_empty()),
            log: Mutex::new(log),
            tail: Mutex::new(Tail {
                buf: Vec::with_capacity(TAIL_BYTES),
            }),
            batches: Mutex::new(Batches::default()),
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Our stdout or stderr, written by one thread from a bounded queue. Both the child's output and
/// our own messages go through it, so a stalled terminal (a full pipe nobody reads) can block
/// neither the child nor the supervisor: past the queue's bound, chunks are dropped and counted.
pub struct TerminalCopy {
    tx: Option<SyncSender<Vec<u8>>>,
    pending: Arc<AtomicU64>,
    pub dropped: Arc<AtomicU64>,
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
        let (tx, rx) = sync_channel::<Vec<u8>>(TERMINAL_QUEUE_CHUNKS);
        let (d, p) = (dropped.clone(), pending.clone());
        let started = std::thread::Builder::new()
            .name(format!("terminal-{fd}"))
            .spawn(move || {
                // SAFETY: dup of our own stdout/stderr; the File owns the duplicate.
                let dup = unsafe { libc::dup(fd) };
                let mut out: Option<File> = (dup >= 0).then(|| {
                    // SAFETY: `dup` is a fresh descriptor we own.
                    unsafe { std::os::fd::FromRawFd::from_raw_fd(dup) }
                });
                for chunk in rx {
                    let ok = out.as_mut().is_some_and(|o| o.write_all(&chunk).is_ok());
                    if !ok {
                        // A closed terminal (EPIPE) must not stop anything: count and move on.
                        out = None;
                        d.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    }
                    p.fetch_sub(1, Ordering::Release);
                }
            });
        match started {
            Ok(_) => TerminalCopy {
                tx: Some(tx),
                pending,
                dropped,
            },
            Err(_) => TerminalCopy {
                tx: None,
                pending,
                dropped,
            },
        }
    }

    pub fn offer(&self, bytes: &[u8]) {
        let Some(tx) = &self.tx else {
            self.dropped
                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            return;
        };
        self.pending.fetch_add(1, Ordering::Acquire);
        if let Err(TrySendError::Full(c) | TrySendError::Disconnected(c)) =
            tx.try_send(bytes.to_vec())
        {
            self.pending.fetch_sub(1, Ordering::Release);
            self.dropped.fetch_add(c.len() as u64, Ordering::Relaxed);
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
    max: usize,
}

impl LineFramer {
    pub fn new(max: usize) -> Self {
        LineFramer {
            partial: Vec::new(),
            truncated: false,
            max,
        }
    }

    pub fn feed(&mut self, chunk: &[u8], mut line: impl FnMut(&[u8], bool)) {
        let mut start = 0;
        for nl in memchr::memchr_iter(b'\n', chunk) {
            let piece = &chunk[start..nl];
            if self.partial.is_empty() && !self.truncated {
                if piece.len() > self.max {
                    line(&piece[..self.max], true);
                } else {
                    line(piece, false);
                }
            } else {
                self.append(piece);
                line(&self.partial, self.truncated);
                self.partial.clear();
                self.truncated = false;
            }
            start = nl + 1;
        }
        if start < chunk.len() {
            self.append(&chunk[start..]);
        }
    }

    fn append(&mut self, bytes: &[u8]) {
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
    let raw = fd.as_raw_fd();
    // Fewer, larger reads when the child writes fast. Failure only costs speed.
    // SAFETY: fcntl on our own pipe descriptor.
    unsafe { libc::fcntl(raw, libc::F_SETPIPE_SZ, CHUNK as libc::c_int) };
    let mut file = File::from(fd);
    let mut buf = vec![0u8; CHUNK];
    let mut framer = LineFramer::new(MAX_PARSED_LINE);
    let mut parser = LogParser::new();
    let mut bytes = 0u64;
    let mut emit = ReaderSink {
        events,
        batches: &shared.batches,
    };
    let mut redactor = shared.redact.clone().map(StreamRedactor::new);
    loop {
        if parser.capturing() && !readable_within(raw, CAPTURE_IDLE_MS) {
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
        let chunk = match &mut redactor {
            None => std::borrow::Cow::Borrowed(&buf[..n]),
            Some(r) => std::borrow::Cow::Owned(r.feed(&buf[..n])),
        };
        pass_on(
            &chunk,
            shared,
            terminal,
            &mut framer,
            &mut parser,
            &mut emit,
        );
    }
    if let Some(r) = &mut redactor {
        let held = r.finish();
        pass_on(&held, shared, terminal, &mut framer, &mut parser, &mut emit);
    }
    framer.finish(|line, truncated| parser.line(line, truncated, &mut emit));
    parser.flush(&mut emit);
    StreamStats {
        bytes,
        parse: parser.stats,
    }
}

/// One chunk, once: to the log file, the terminal copy, the tail, and the parser.
fn pass_on(
    chunk: &[u8],
    shared: &Shared,
    terminal: Option<&TerminalCopy>,
    framer: &mut LineFramer,
    parser: &mut LogParser,
    emit: &mut ReaderSink<'_>,
) {
    if chunk.is_empty() {
        return;
    }
    lock(&shared.log).write(chunk);
    if let Some(t) = terminal {
        t.offer(chunk);
    }
    lock(&shared.tail).push(chunk);
    framer.feed(chunk, |line, truncated| parser.line(line, truncated, emit));
}

fn readable_within(fd: i32, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let rc = unsafe { libc::poll(&mut p, 1, ms) };
    rc != 0
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

    #[test]
    fn tail_keeps_the_last_lines() {
        let mut t = Tail { buf: Vec::new() };
        for i in 0..10_000 {
            t.push(format!("line {i}\n").as_bytes());
        }
        assert_eq!(t.last_lines(2), ["line 9998", "line 9999"]);
        assert!(t.buf.len() <= TAIL_BYTES);
    }
}
