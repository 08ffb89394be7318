//! SGLang's log, line by line, into `LogEvent`s.
//!
//! Formats (see `shared/reference/sglang.md` section 1): `[YYYY-MM-DD HH:MM:SS(.mmm)?( RANK)*] msg`
//! with rank parts from `DP PP ATTN_CP MOE_DP TP EP` in any combination, no level name; uvicorn
//! lines put `INFO:     ` in the message; many lines carry no prefix at all (Python warnings,
//! tracebacks, NCCL warnings, tqdm bars rewriting one line with `\r`). Messages can span lines
//! (a scheduler traceback follows its header line unprefixed), so the parser keeps a little state:
//! one open capture, closed by the next prefixed line, by the exception line of a bare
//! traceback, by end of input, or by [`LogParser::flush`] when the stream goes quiet.
use super::pyliteral::parse_server_args;
use crate::events::{FatalReason, PhaseName};
use crate::redact::redact_value;
use aho_corasick::AhoCorasick;
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::OnceLock;

/// What one or more log lines meant.
#[derive(Debug, Clone, PartialEq)]
pub enum LogEvent {
    /// `The server is fired up and ready to roll!` (any prefix: multi-worker servers add `INFO:`).
    Ready,
    /// The resolved server args, parsed and redacted.
    ServerArgs(Map<String, Value>),
    Deprecation {
        flag: Option<String>,
        replacement: Option<String>,
        message: String,
    },
    Warning {
        message: String,
    },
    /// A startup phase; `reported_s` is the duration SGLang itself printed (`elapsed=`).
    Phase {
        name: PhaseName,
        rank: Option<String>,
        reported_s: Option<f64>,
        detail: Option<String>,
    },
    Batch {
        kind: BatchKind,
        rank: Option<String>,
        fields: Map<String, Value>,
    },
    /// Something that ends the server; `excerpt` quotes the lines that say why.
    Fatal {
        reason: FatalReason,
        rank: Option<String>,
        excerpt: String,
    },
    /// A traceback that matched no fatal pattern (kept for diagnosis if the child dies later).
    Traceback {
        excerpt: String,
    },
    /// uvicorn's `Started server process [N]`: a worker process began (at the start, or when
    /// uvicorn replaces one).
    ServerProcess,
    /// uvicorn's `Child process [N] died`: a tokenizer worker killed by uvicorn's health check.
    WorkerDied {
        line: String,
    },
    /// `KV cache pool is full. Retract requests. #retracted_reqs: N, ...`: memory pressure.
    Retraction {
        requests: u64,
        line: String,
    },
    /// A uvicorn access line of a generation request (one the proxy and the tap measure) from
    /// a client whose address is not loopback, or on loopback as [`LoopbackClients`] says:
    /// every such line (the supervisor counts those it could not measure).
    Client {
        addr: IpAddr,
    },
}

/// Distinct client hosts kept per stream, whose next lines are told by a comparison: enough for
/// a benchmark's clients, bounded whatever the traffic (more are read in full, line by line).
pub const MAX_CLIENTS: usize = 16;

/// The request the supervisor sends once the server is ready, where its ready line was read
/// (SGLang writes it after its warm-up). SGLang's own warm-up requests come from loopback and
/// are logged before, so before this request's access line, on the same pipe (uvicorn logs a
/// request before answering it): loopback clients are told only after that line. The ready
/// line comes on the other pipe, which may be read first.
pub const AFTER_READY: &str = "/server_info?from=sglang-supervisor";

/// Which loopback clients' generation requests a parser tells of.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LoopbackClients {
    /// None: a `127.…` access line costs a comparison.
    #[default]
    Skipped,
    /// Each after the access line of [`AFTER_READY`], but those from `but` (the proxy's source).
    Told { but: Option<Ipv4Addr> },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BatchKind {
    Prefill,
    Decode,
}

impl BatchKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BatchKind::Prefill => "prefill",
            BatchKind::Decode => "decode",
        }
    }
}

/// Where parsed lines go. Batch lines are the bulk of a busy log, so they get their own method
/// with borrowed bytes (not even UTF-8-checked: a plain ASCII line never is): a sink can keep the
/// latest per rank without allocating per line, and parse the fields ([`batch_fields`], after a
/// lossy decoding) only when someone asks. Any `FnMut(LogEvent)` is a sink that receives batches as
/// parsed `LogEvent::Batch` events.
pub trait LogSink {
    fn event(&mut self, event: LogEvent);
    fn batch(&mut self, kind: BatchKind, rank: Option<&str>, body: &[u8]) {
        self.event(LogEvent::Batch {
            kind,
            rank: rank.map(str::to_string),
            fields: batch_fields(&String::from_utf8_lossy(body)),
        });
    }
}

impl<F: FnMut(LogEvent)> LogSink for F {
    fn event(&mut self, event: LogEvent) {
        self(event)
    }
}

/// Timestamp, rank prefix and message of one line. `ts` is `None` for unprefixed lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineHead<'a> {
    pub ts: Option<&'a str>,
    pub rank: Option<&'a str>,
    pub msg: &'a str,
}

/// Where the parts of a prefixed line lie: `[` ts `]`-or-rank, rank, message.
struct HeadSpans {
    ts_end: usize,
    /// Index of the closing `]`; a rank lies in `ts_end + 1..close` when `close > ts_end`.
    close: usize,
}

/// The byte-level reading of `[2026-12-02 08:44:01.123 DP0 TP3 EP3] msg` behind [`split_head`]
/// (all it accepts is ASCII, so its indices are char boundaries of any `str` it was given).
fn head_spans(b: &[u8]) -> Option<HeadSpans> {
    // "[YYYY-MM-DD HH:MM:SS" is 20 bytes: matched against a template, one byte class each.
    const TEMPLATE: &[u8; 20] = b"[0000-00-00 00:00:00";
    let head = b.get(..20).filter(|_| b.len() >= 21)?;
    if !head.iter().zip(TEMPLATE).all(|(&c, &t)| {
        if t == b'0' {
            c.is_ascii_digit()
        } else {
            c == t
        }
    }) {
        return None;
    }
    let mut i = 20;
    if b.get(i) == Some(&b'.') {
        let ms = b.get(i + 1..i + 4);
        if !ms.is_some_and(|m| m.iter().all(u8::is_ascii_digit)) {
            return None;
        }
        i += 4;
    }
    let ts_end = i;
    // Rank parts: " NAME<digits>" where NAME is [A-Z_]+.
    while b.get(i) == Some(&b' ') {
        let mut j = i + 1;
        while b
            .get(j)
            .is_some_and(|c| c.is_ascii_uppercase() || *c == b'_')
        {
            j += 1;
        }
        let name_len = j - i - 1;
        let d0 = j;
        while b.get(j).is_some_and(u8::is_ascii_digit) {
            j += 1;
        }
        if name_len == 0 || j == d0 {
            return None;
        }
        i = j;
    }
    if b.get(i) != Some(&b']') {
        return None;
    }
    Some(HeadSpans { ts_end, close: i })
}

impl HeadSpans {
    /// Start of the message: after the `]` and one space.
    fn msg_start(&self, b: &[u8]) -> usize {
        self.close + 1 + usize::from(b.get(self.close + 1) == Some(&b' '))
    }
}

/// Split `[2026-12-02 08:44:01.123 DP0 TP3 EP3] msg`. Anything else is an unprefixed line.
pub fn split_head(line: &str) -> LineHead<'_> {
    match head_spans(line.as_bytes()) {
        None => LineHead {
            ts: None,
            rank: None,
            msg: line,
        },
        Some(h) => LineHead {
            ts: Some(&line[1..h.ts_end]),
            rank: (h.close > h.ts_end).then(|| &line[h.ts_end + 1..h.close]),
            msg: &line[h.msg_start(line.as_bytes())..],
        },
    }
}

/// ASCII without `\r` or ESC: a line the fast path may read as bytes, exactly as the full path
/// would read it as text (no lossy decoding, no progress-bar rewrite, no colour to strip).
pub fn is_plain(b: &[u8]) -> bool {
    b.is_ascii() && memchr::memchr2(b'\r', 0x1b, b).is_none()
}

/// Remove ANSI CSI sequences (`ESC [ ... final`) such as the yellow of deprecation warnings.
pub fn strip_ansi(s: &str) -> Cow<'_, str> {
    if memchr::memchr(0x1b, s.as_bytes()).is_none() {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            if chars.peek() == Some(&'[') {
                chars.next();
                // Parameters and intermediates, then one final byte in @..~.
                for f in chars.by_ref() {
                    if ('@'..='~').contains(&f) {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    Cow::Owned(out)
}

/// Substring patterns, found in one pass per line.
#[derive(Clone, Copy)]
enum Pat {
    Ready,
    Deprecated,
    Uvicorn,
    SchedulerDied,
    Oom,
    Watchdog,
    ArgparseError,
    PyWarning,
    WorkerDied,
    ServerProcess,
    SchedulerExc,
    DetokExc,
    InitFailed,
    Sigquit,
    SubprocessCrashed,
    Traceback,
    Retract,
}

const PATTERNS: &[(&str, Pat)] = &[
    ("ready to roll!", Pat::Ready),
    (" deprecated", Pat::Deprecated),
    ("Uvicorn running on", Pat::Uvicorn),
    ("scheduler died during initialization", Pat::SchedulerDied),
    ("CUDA out of memory", Pat::Oom),
    ("OutOfMemoryError", Pat::Oom),
    ("watchdog timeout", Pat::Watchdog),
    (": error: ", Pat::ArgparseError),
    ("Warning:", Pat::PyWarning),
    ("Child process [", Pat::WorkerDied),
    ("Started server process [", Pat::ServerProcess),
    ("Scheduler hit an exception", Pat::SchedulerExc),
    ("DetokenizerManager hit an exception", Pat::DetokExc),
    ("Initialization failed", Pat::InitFailed),
    ("Received sigquit from a child process", Pat::Sigquit),
    ("crashed with exit code", Pat::SubprocessCrashed),
    ("Traceback (most recent call last)", Pat::Traceback),
    ("#retracted_reqs: ", Pat::Retract),
];

fn matcher() -> &'static AhoCorasick {
    static M: OnceLock<AhoCorasick> = OnceLock::new();
    M.get_or_init(|| {
        // The patterns are fixed ASCII literals; building cannot fail for them.
        #[allow(clippy::expect_used)]
        AhoCorasick::builder()
            .kind(Some(aho_corasick::AhoCorasickKind::DFA))
            .build(PATTERNS.iter().map(|(p, _)| p))
            .expect("static patterns")
    })
}

/// Lines kept from an open capture: its first line plus the last `CAPTURE_TAIL`.
const CAPTURE_TAIL: usize = 40;
/// Lines of a traceback quoted in an excerpt (after its header line).
const EXCERPT_LINES: usize = 12;
/// Characters kept of any one quoted line.
const EXCERPT_LINE_CHARS: usize = 500;

struct Capture {
    reason: Option<FatalReason>,
    rank: Option<String>,
    /// Started by a bare `Traceback (most recent call last):` line: ends at its exception line.
    bare_traceback: bool,
    first: String,
    tail: VecDeque<String>,
    skipped: usize,
}

impl Capture {
    fn push(&mut self, line: &str) {
        if self.tail.len() == CAPTURE_TAIL {
            self.tail.pop_front();
            self.skipped += 1;
        }
        self.tail.push_back(clip(line));
    }

    fn excerpt(&self) -> String {
        let mut lines: Vec<&str> = self.tail.iter().map(String::as_str).collect();
        while lines.last().is_some_and(|l| l.trim().is_empty()) {
            lines.pop();
        }
        let from = lines.len().saturating_sub(EXCERPT_LINES);
        let mut out = self.first.clone();
        if from > 0 || self.skipped > 0 {
            out.push_str("\n  ...");
        }
        for l in &lines[from..] {
            out.push('\n');
            out.push_str(l);
        }
        out
    }
}

fn clip(s: &str) -> String {
    match s.char_indices().nth(EXCERPT_LINE_CHARS) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// Counters about the lines seen, for the final report.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ParseStats {
    pub lines: u64,
    /// Lines that rewrote themselves with `\r` (tqdm bars).
    pub progress_lines: u64,
    pub non_utf8_lines: u64,
    /// Lines longer than the framer's limit: parsed on their first part only (still logged whole).
    pub truncated_lines: u64,
}

impl ParseStats {
    /// Another parser's counts added to these (the report sums every pipe's).
    pub fn add(&mut self, other: &ParseStats) {
        self.lines += other.lines;
        self.progress_lines += other.progress_lines;
        self.non_utf8_lines += other.non_utf8_lines;
        self.truncated_lines += other.truncated_lines;
    }
}

/// Parser state for one stream (stdout or stderr: a traceback never spans both).
#[derive(Default)]
pub struct LogParser {
    capture: Option<Capture>,
    /// Client hosts, as logged, whose generation requests were read, each with its address
    /// (none for what is no address), whose requests are told ([`LogEvent::Client`]) as
    /// [`LogParser::tells`] says: their next lines are read by a comparison, with no parsing.
    clients: Vec<(Box<[u8]>, Option<IpAddr>)>,
    loopback: LoopbackClients,
    /// The access line of [`AFTER_READY`] was read: loopback clients are told from here on.
    after_ready: bool,
    pub stats: ParseStats,
}

impl LogParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// A parser that tells of loopback clients as `loopback` says.
    pub fn telling(loopback: LoopbackClients) -> Self {
        LogParser {
            loopback,
            ..Self::default()
        }
    }

    /// True while a multi-line message is open (the reader then wakes up to flush it when quiet).
    pub fn capturing(&self) -> bool {
        self.capture.is_some()
    }

    /// Close an open capture (the stream ended or went quiet).
    pub fn flush(&mut self, out: &mut impl LogSink) {
        if let Some(c) = self.capture.take() {
            let excerpt = c.excerpt();
            out.event(match c.reason {
                Some(reason) => LogEvent::Fatal {
                    reason,
                    rank: c.rank,
                    excerpt,
                },
                None => LogEvent::Traceback { excerpt },
            });
        }
    }

    /// One line without its `\n`. `truncated`: the framer cut it at its length limit.
    pub fn line(&mut self, raw: &[u8], truncated: bool, out: &mut impl LogSink) {
        self.line_hinted(raw, truncated, false, out)
    }

    /// [`line`](Self::line), where `plain` says the caller already knows the line is
    /// [`is_plain`] (the reader checks a whole chunk at once); `false` means "not known".
    pub fn line_hinted(
        &mut self,
        raw: &[u8],
        truncated: bool,
        plain: bool,
        out: &mut impl LogSink,
    ) {
        self.stats.lines += 1;
        if truncated {
            self.stats.truncated_lines += 1;
        }
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        if (plain || is_plain(raw)) && self.hot(raw, out) {
            return;
        }
        self.line_full(raw, out);
    }

    /// Every line's reading as text (what [`hot`](Self::hot) shortcuts for its lines); `raw`
    /// without its `\r\n`, counted already.
    pub(crate) fn line_full(&mut self, raw: &[u8], out: &mut impl LogSink) {
        let text = match std::str::from_utf8(raw) {
            Ok(s) => Cow::Borrowed(s),
            Err(_) => {
                self.stats.non_utf8_lines += 1;
                String::from_utf8_lossy(raw)
            }
        };
        // A tqdm bar rewrites itself with `\r`: only its last state is a line worth reading.
        let text: &str = match memchr::memrchr(b'\r', text.as_bytes()) {
            Some(i) => {
                self.stats.progress_lines += 1;
                &text[i + 1..]
            }
            None => &text,
        };
        let clean = strip_ansi(text);
        self.classify(&clean, out);
    }

    /// The bulk of a serving log, read as bytes: a prefixed batch line or uvicorn access line
    /// (`raw` is plain). Does exactly what [`classify`](Self::classify) does with it and returns
    /// true; any other line returns false untouched.
    fn hot(&mut self, raw: &[u8], out: &mut impl LogSink) -> bool {
        let Some(h) = head_spans(raw) else {
            return false;
        };
        let msg = &raw[h.msg_start(raw)..];
        // Neither form starts like a phase (`phase` goes by the first byte) or `server_args=`.
        let (kind, rest) = if let Some(r) = msg.strip_prefix(b"Decode batch") {
            (BatchKind::Decode, r)
        } else if let Some(r) = msg.strip_prefix(b"Prefill batch") {
            (BatchKind::Prefill, r)
        } else if let Some(client) = access_client(msg) {
            if self.capture.is_some() {
                self.flush(out);
            }
            self.client(client, out);
            return true;
        } else {
            return false;
        };
        if self.capture.is_some() {
            self.flush(out);
        }
        // Skip an optional ` [iter]` and the first comma.
        let body = memchr::memchr(b',', rest).map_or(&b""[..], |i| &rest[i + 1..]);
        let rank = (h.close > h.ts_end)
            .then(|| std::str::from_utf8(&raw[h.ts_end + 1..h.close]).ok())
            .flatten();
        out.batch(kind, rank, body);
        true
    }

    /// An access line's client (`HOST:PORT` first in `access`), told for each request that is
    /// one the proxy and the tap measure from a client not on loopback, or on loopback as
    /// [`LoopbackClients`] says. The common case, `127.…` (`::ffff:127.…` from a server on
    /// `::`) with loopback skipped, costs a comparison or two; a client read
    /// before, a comparison or a few and the request's path; past [`MAX_CLIENTS`] hosts, a
    /// new one is read in full on each line, and still told.
    #[inline]
    fn client(&mut self, access: &[u8], out: &mut impl LogSink) {
        if !self.after_ready {
            if self.loopback != LoopbackClients::Skipped && is_after_ready(access) {
                self.after_ready = true;
                return;
            }
            if access.starts_with(b"127.") || access.starts_with(b"::ffff:127.") {
                return;
            }
        }
        // The port and the request (` - "POST /generate …`) after a host read before.
        let after = |host: &[u8]| {
            let r = access.strip_prefix(host)?.strip_prefix(b":")?;
            let digits = r.iter().take_while(|b| b.is_ascii_digit()).count();
            (digits > 0 && r.get(digits).is_none_or(|&b| b == b' ')).then(|| r.split_at(digits))
        };
        match self
            .clients
            .iter()
            .find_map(|(h, addr)| Some((after(h)?, *addr)))
        {
            Some(((port, request), Some(addr)))
                if self.tells(addr) && told_request(port, request) =>
            {
                out.event(LogEvent::Client { addr });
            }
            Some(_) => {}
            None => self.new_client(access, out),
        }
    }

    #[cold]
    fn new_client(&mut self, access: &[u8], out: &mut impl LogSink) {
        // `HOST:PORT - "METHOD PATH HTTP/1.1" STATUS`
        let end = memchr::memchr(b' ', access).unwrap_or(access.len());
        let Some((host, port)) = host_port(&access[..end]) else {
            return;
        };
        // A host is kept once it sends a measured request: probes from elsewhere take no place.
        if !told_request(port, &access[end..]) {
            return;
        }
        // One address may be logged in more than one form (`::ffff:10.0.0.9`, `10.0.0.9`); a
        // link-local one with its interface (`fe80::1%eth0`), which an address does not hold.
        let addr = std::str::from_utf8(host)
            .ok()
            .and_then(|h| {
                let h = h.trim_start_matches('[').trim_end_matches(']');
                h[..h.find('%').unwrap_or(h.len())].parse::<IpAddr>().ok()
            })
            .map(|ip| ip.to_canonical());
        // The hosts kept are bounded whatever the traffic; one past them is read each time.
        if self.clients.len() < MAX_CLIENTS {
            self.clients.push((host.into(), addr));
        }
        if let Some(addr) = addr.filter(|&a| self.tells(a)) {
            out.event(LogEvent::Client { addr });
        }
    }

    /// Whether a generation request from `addr` (canonical) is told of.
    fn tells(&self, addr: IpAddr) -> bool {
        if !addr.is_loopback() {
            return true;
        }
        match self.loopback {
            LoopbackClients::Told { but } => self.after_ready && but.map(IpAddr::V4) != Some(addr),
            LoopbackClients::Skipped => false,
        }
    }

    fn classify(&mut self, line: &str, out: &mut impl LogSink) {
        let head = split_head(line);
        if let Some(c) = &mut self.capture {
            if head.ts.is_none() {
                c.push(line);
                if c.reason.is_none() {
                    c.reason = fatal_in_traceback_line(line);
                }
                if c.bare_traceback && is_exception_line(line) {
                    self.flush(out);
                }
                return;
            }
            self.flush(out);
        }
        let msg = head.msg;
        let rank = || head.rank.map(str::to_string);

        // Prefix-anchored forms first: they are cheap and the server_args line is long.
        if head.ts.is_some() {
            if let Some(args) = msg.strip_prefix("server_args=") {
                let mut map = parse_server_args(args).unwrap_or_else(|| {
                    let mut m = Map::new();
                    m.insert("_unparsed".into(), Value::String(args.to_string()));
                    m
                });
                let mut v = Value::Object(std::mem::take(&mut map));
                redact_value(&mut v);
                if let Value::Object(m) = v {
                    out.event(LogEvent::ServerArgs(m));
                }
                return;
            }
            if let Some(ev) = phase(msg, head.rank) {
                out.event(ev);
                return;
            }
            if let Some((kind, body)) = batch(msg) {
                out.batch(kind, head.rank, body.as_bytes());
                return;
            }
            // uvicorn access lines (`INFO:     127.0.0.1:50312 - "GET /health ..." 200`) are half of
            // a busy log and mean nothing to us but their client: skip them before the pattern scan.
            if let Some(client) = access_client(msg.as_bytes()) {
                self.client(client, out);
                return;
            }
        }

        let mut found: Option<Pat> = None;
        for m in matcher().find_iter(line) {
            let p = PATTERNS[m.pattern().as_usize()].1;
            // Earlier patterns in the table win; they are the more specific.
            if found.is_none_or(|f| (p as usize) < (f as usize)) {
                found = Some(p);
            }
        }
        let Some(pat) = found else { return };
        let fatal = |reason| LogEvent::Fatal {
            reason,
            rank: head.rank.map(str::to_string),
            excerpt: clip(line),
        };
        match pat {
            Pat::Ready => out.event(LogEvent::Ready),
            Pat::Uvicorn => out.event(LogEvent::Phase {
                name: PhaseName::HttpUp,
                rank: rank(),
                reported_s: None,
                // where the server that writes this log listens
                detail: after(msg, "Uvicorn running on ").map(str::to_string),
            }),
            Pat::Deprecated if msg.contains(" is deprecated") => out.event(deprecation(msg)),
            Pat::Deprecated => {}
            Pat::SchedulerExc | Pat::DetokExc | Pat::InitFailed => {
                let reason = match pat {
                    Pat::SchedulerExc => FatalReason::SchedulerException,
                    Pat::DetokExc => FatalReason::DetokenizerException,
                    _ => FatalReason::InitFailed,
                };
                self.open(Some(reason), rank(), line, false);
            }
            Pat::Traceback if head.ts.is_none() && msg.starts_with("Traceback") => {
                self.open(None, None, line, true);
            }
            Pat::Traceback => {}
            Pat::Sigquit => out.event(fatal(FatalReason::ChildSigquit)),
            Pat::SchedulerDied => out.event(fatal(FatalReason::SchedulerDied)),
            Pat::Oom => out.event(fatal(FatalReason::CudaOom)),
            Pat::Watchdog => out.event(fatal(FatalReason::WatchdogTimeout)),
            Pat::SubprocessCrashed if msg.starts_with("Subprocess ") => {
                out.event(fatal(FatalReason::SubprocessCrashed))
            }
            Pat::SubprocessCrashed => {}
            // argparse prints with `print`, never through logging: a prefixed line is something else.
            Pat::ArgparseError if head.ts.is_none() && is_argparse_error(msg) => {
                out.event(fatal(FatalReason::ArgparseError))
            }
            Pat::ArgparseError => {}
            Pat::WorkerDied if msg.contains("] died") => {
                out.event(LogEvent::WorkerDied { line: clip(line) })
            }
            Pat::WorkerDied => {}
            Pat::ServerProcess => out.event(LogEvent::ServerProcess),
            Pat::PyWarning if is_python_warning(msg) => {
                out.event(LogEvent::Warning {
                    message: clip(msg.trim()),
                });
            }
            Pat::PyWarning => {}
            Pat::Retract => out.event(LogEvent::Retraction {
                requests: after(msg, "#retracted_reqs: ")
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0),
                line: clip(line),
            }),
        }
    }

    fn open(&mut self, reason: Option<FatalReason>, rank: Option<String>, line: &str, bare: bool) {
        self.capture = Some(Capture {
            reason,
            rank,
            bare_traceback: bare,
            first: clip(line),
            tail: VecDeque::new(),
            skipped: 0,
        });
    }
}

fn fatal_in_traceback_line(line: &str) -> Option<FatalReason> {
    if line.contains("scheduler died during initialization") {
        Some(FatalReason::SchedulerDied)
    } else if line.contains("CUDA out of memory") || line.contains("OutOfMemoryError") {
        Some(FatalReason::CudaOom)
    } else if line.contains("Initialization failed") {
        Some(FatalReason::InitFailed)
    } else {
        None
    }
}

/// The last line of a bare traceback: `SomeError: message` at column 0.
fn is_exception_line(line: &str) -> bool {
    !line.is_empty()
        && !line.starts_with([' ', '\t'])
        && !line.starts_with("Traceback")
        && !line.starts_with("During handling of the above exception")
        && !line.starts_with("The above exception was the direct cause")
}

/// `sglang serve: error: ...`, `launch_server.py: error: ...` (argparse's `parser.error`).
fn is_argparse_error(msg: &str) -> bool {
    match msg.find(": error: ") {
        Some(i) => {
            let prog = &msg[..i];
            !prog.is_empty()
                && prog.len() <= 80
                && prog
                    .chars()
                    .all(|c| c.is_alphanumeric() || " ._-/".contains(c))
        }
        None => false,
    }
}

/// `path.py:976: UserWarning: text` or NCCL's `[rank0]:[W1202 ...] ... Warning: ...`.
fn is_python_warning(msg: &str) -> bool {
    if msg.starts_with("[rank") {
        return true;
    }
    msg.split_once(": ").is_some_and(|(_, rest)| {
        rest.split_once(':')
            .is_some_and(|(kind, _)| kind.ends_with("Warning") && !kind.contains(' '))
    })
}

fn deprecation(msg: &str) -> LogEvent {
    let text = msg.trim();
    // Python warnings carry `path:line: UserWarning: ` in front of the text.
    let text = text
        .find("Warning: ")
        .map(|i| &text[i + 9..])
        .unwrap_or(text);
    let quoted = |s: &str| -> Option<String> {
        let a = s.find(['\'', '`'])?;
        let q = s[a..].chars().next()?;
        let rest = &s[a + 1..];
        rest.find(q).map(|b| rest[..b].to_string())
    };
    let flag = if let Some(rest) = text.strip_prefix("Environment variable ") {
        rest.split_whitespace().next().map(str::to_string)
    } else {
        let before = &text[..text.find(" is deprecated").unwrap_or(text.len())];
        quoted(before).or_else(|| {
            before
                .split_whitespace()
                .find(|w| w.starts_with("--"))
                .map(str::to_string)
        })
    };
    let after = &text[text.find(" is deprecated").unwrap_or(0)..];
    let lower = after.to_ascii_lowercase();
    let replacement = lower.find("use ").and_then(|i| {
        let rest = &after[i + 4..];
        quoted(rest.split_whitespace().next().unwrap_or(""))
            .or_else(|| {
                rest.split_whitespace()
                    .next()
                    .map(|w| w.trim_end_matches(['.', ',', ';']).to_string())
            })
            .filter(|w| !w.is_empty() && w != "the" && w != "a")
    });
    LogEvent::Deprecation {
        flag,
        replacement,
        message: clip(text),
    }
}

fn elapsed(msg: &str) -> Option<f64> {
    let i = msg
        .find("elapsed=")
        .map(|i| i + 8)
        .or_else(|| msg.find("elapsed: ").map(|i| i + 9))?;
    let num: &str = msg[i..]
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .next()?;
    num.parse().ok()
}

fn after<'a>(msg: &'a str, key: &str) -> Option<&'a str> {
    let i = msg.find(key)? + key.len();
    msg[i..].split([',', ' ']).next().filter(|s| !s.is_empty())
}

fn phase(msg: &str, rank: Option<&str>) -> Option<LogEvent> {
    let ev = |name, reported_s, detail: Option<String>| {
        Some(LogEvent::Phase {
            name,
            rank: rank.map(str::to_string),
            reported_s,
            detail,
        })
    };
    let first = *msg.as_bytes().first()?;
    match first {
        b'I' if msg.starts_with("Init torch distributed begin") => {
            ev(PhaseName::InitDistributedBegin, None, None)
        }
        b'I' if msg.starts_with("Init torch distributed end") => {
            ev(PhaseName::InitDistributedEnd, elapsed(msg), None)
        }
        b'L' if msg.starts_with("Load weight begin") => ev(
            PhaseName::LoadWeightsBegin,
            None,
            after(msg, "avail mem=").map(|m| format!("avail_mem_gb={m}")),
        ),
        b'L' if msg.starts_with("Load weight end") => ev(
            PhaseName::LoadWeightsEnd,
            elapsed(msg),
            after(msg, "mem usage=").map(|m| format!("mem_usage_gb={m}")),
        ),
        b'K' if msg.starts_with("KV Cache is allocated") => ev(
            PhaseName::KvCacheAllocated,
            None,
            after(msg, "#tokens: ").map(|t| format!("tokens={t}")),
        ),
        b'M' if msg.starts_with("Memory pool end") => ev(PhaseName::MemoryPoolEnd, None, None),
        b'm' if msg.starts_with("max_total_num_tokens=") => ev(
            PhaseName::MaxTotalNumTokens,
            None,
            after(msg, "max_total_num_tokens=").map(str::to_string),
        ),
        b'C' if msg.starts_with("Capture") => {
            let lower = msg.to_ascii_lowercase();
            let g = lower.find("cuda graph")?;
            let what = msg["Capture".len()..g].trim();
            let detail = (!what.is_empty()).then(|| what.to_string());
            let tail = &lower[g..];
            if tail.starts_with("cuda graph begin") {
                ev(PhaseName::CudaGraphBegin, None, detail)
            } else if tail.starts_with("cuda graph end") {
                ev(PhaseName::CudaGraphEnd, elapsed(msg), detail)
            } else {
                None
            }
        }
        _ => None,
    }
}

fn batch(msg: &str) -> Option<(BatchKind, &str)> {
    let (kind, rest) = if let Some(r) = msg.strip_prefix("Decode batch") {
        (BatchKind::Decode, r)
    } else {
        (BatchKind::Prefill, msg.strip_prefix("Prefill batch")?)
    };
    // Skip an optional ` [iter]` and the first comma.
    Some((kind, rest.split_once(',').map(|(_, r)| r).unwrap_or("")))
}

/// `#running-req: 32, token usage: 0.02, cuda graph: True, ...` as typed JSON fields.
pub fn batch_fields(rest: &str) -> Map<String, Value> {
    let mut m = Map::new();
    for part in rest.split(", ") {
        let Some((k, v)) = part.split_once(": ") else {
            continue;
        };
        let v = v.trim();
        let val = match v {
            "True" => Value::Bool(true),
            "False" => Value::Bool(false),
            _ => match v.parse::<f64>().ok().and_then(serde_json::Number::from_f64) {
                Some(n) if v.contains('.') => Value::Number(n),
                Some(_) => v
                    .parse::<i64>()
                    .map(Value::from)
                    .unwrap_or(Value::String(v.to_string())),
                None => Value::String(v.to_string()),
            },
        };
        m.insert(k.trim().to_string(), val);
    }
    m
}

/// What follows the level of a uvicorn access line (`INFO:     127.0.0.1:50312 - "GET …`),
/// starting with its client as uvicorn writes it (`"%s:%d" % client`: `::1:50312` for IPv6,
/// empty when unknown); `None` for any other line.
fn access_client(msg: &[u8]) -> Option<&[u8]> {
    let rest = msg.strip_prefix(b"INFO:     ")?;
    // An IPv4 client starts with a digit: the bulk of a busy log is told by one byte.
    if rest.first().is_some_and(u8::is_ascii_digit) {
        return Some(rest);
    }
    // Else a word ending in `:PORT`, or none, then ` - "`: never any `WORD - "…` message.
    let end = memchr::memchr(b' ', rest)?;
    let client = &rest[..end];
    let addressed = client.is_empty() || host_port(client).is_some();
    (addressed && rest[end..].starts_with(b" - \"")).then_some(rest)
}

/// Whether an access line (from its client on) is the supervisor's [`AFTER_READY`] request's.
fn is_after_ready(access: &[u8]) -> bool {
    let end = memchr::memchr(b' ', access).unwrap_or(access.len());
    access[end..]
        .strip_prefix(b" - \"GET ")
        .and_then(|r| r.strip_prefix(AFTER_READY.as_bytes()))
        .is_some_and(|r| r.starts_with(b" "))
}

/// A client as uvicorn writes it, `HOST:PORT` (`::1:50312` for IPv6), split at its last colon;
/// `None` unless PORT is digits.
fn host_port(client: &[u8]) -> Option<(&[u8], &[u8])> {
    let colon = memchr::memrchr(b':', client)?;
    let port = &client[colon + 1..];
    (!port.is_empty() && port.iter().all(u8::is_ascii_digit)).then_some((&client[..colon], port))
}

/// Whether an access line's request from `PORT` is one to tell of: one the proxy and the tap
/// measure ([`measured_request`]) over a connection of its own. Port 0 is no TCP peer:
/// uvicorn's proxy headers put a forwarded client there (X-Forwarded-For from 127.0.0.1), the
/// request having come over a local connection.
fn told_request(port: &[u8], request: &[u8]) -> bool {
    port.iter().any(|&b| b != b'0') && measured_request(request)
}

/// Whether the request of an access line (` - "METHOD PATH HTTP/1.1" …`) is one the proxy and
/// the tap measure.
fn measured_request(request: &[u8]) -> bool {
    // Each is a POST: a probe's or a scrape's GET is told by four bytes.
    let Some(line) = request.strip_prefix(b" - \"POST ") else {
        return false;
    };
    let path = line.split(|&b| b == b' ').next().unwrap_or_default();
    let path = &path[..memchr::memchr(b'?', path).unwrap_or(path.len())];
    std::str::from_utf8(path).is_ok_and(|p| sglang_exporters::proxy::measured_endpoint(p).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn events(lines: &[&str]) -> Vec<LogEvent> {
        let mut p = LogParser::new();
        let mut out = Vec::new();
        for l in lines {
            p.line(l.as_bytes(), false, &mut |e| out.push(e));
        }
        p.flush(&mut |e| out.push(e));
        out
    }

    #[test]
    fn heads_with_and_without_ms_and_every_rank_combination() {
        let h = split_head("[2026-12-02 08:44:01] hello");
        assert_eq!(
            h,
            LineHead {
                ts: Some("2026-12-02 08:44:01"),
                rank: None,
                msg: "hello"
            }
        );
        let h = split_head("[2026-12-02 08:44:01.123 DP0 PP1 ATTN_CP0 MOE_DP1 TP3 EP3] x");
        assert_eq!(h.ts, Some("2026-12-02 08:44:01.123"));
        assert_eq!(h.rank, Some("DP0 PP1 ATTN_CP0 MOE_DP1 TP3 EP3"));
        assert_eq!(h.msg, "x");
        assert_eq!(split_head("[2026-12-02 08:44:01 TP12]").rank, Some("TP12"));
        for bad in [
            "[rank0]:[W1202 09:22:08.104886580 ProcessGroupNCCL.cpp:1575] Warning",
            "[2026-12-02 08:44:01 tp0] x",
            "[2026-12-02 08:44:01.12] x",
            "[2026-12-02 08:44:01 TP] x",
            "plain",
            "[2026-12-02 08:44:01",
        ] {
            assert_eq!(split_head(bad).ts, None, "{bad}");
        }
    }

    #[test]
    fn ready_line_matches_with_uvicorn_prefix_and_without() {
        assert_eq!(
            events(&["[2026-12-02 09:23:08] The server is fired up and ready to roll!"]),
            [LogEvent::Ready]
        );
        assert_eq!(
            events(&["[2026-12-02 09:41:27] INFO:     The server is fired up and ready to roll!"]),
            [LogEvent::Ready]
        );
        assert_eq!(events(&["[2026-12-02 09:20:20] INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)"]),
                   [LogEvent::Phase { name: PhaseName::HttpUp, rank: None, reported_s: None,
                                      detail: Some("http://127.0.0.1:30000".into()) }]);
    }

    #[test]
    fn server_args_both_forms_are_parsed_and_redacted() {
        let ev = events(&["[2026-12-02 09:19:56] server_args=ServerArgs(model_path='/m', tp_size=1, api_key='sk-secret', hf_token=None)"]);
        let LogEvent::ServerArgs(m) = &ev[0] else {
            panic!("{ev:?}")
        };
        assert_eq!(
            Value::Object(m.clone()),
            json!({"model_path": "/m", "tp_size": 1, "api_key": "<redacted>", "hf_token": null})
        );
        let ev = events(&["[2026-12-02 09:19:56 TP0] server_args={'model_path': '/m', 'admin_api_key': 'x', 'max_prefill_tokens': 16384}"]);
        let LogEvent::ServerArgs(m) = &ev[0] else {
            panic!("{ev:?}")
        };
        assert_eq!(
            Value::Object(m.clone()),
            json!({"model_path": "/m", "admin_api_key": "<redacted>", "max_prefill_tokens": 16384})
        );
    }

    #[test]
    fn deprecations_with_and_without_colour_and_timestamp() {
        let want = LogEvent::Deprecation {
            flag: Some("--cuda-graph-max-bs".into()),
            replacement: Some("--cuda-graph-max-bs-decode".into()),
            message: "'--cuda-graph-max-bs' is deprecated and will be removed in a future release. Use '--cuda-graph-max-bs-decode' instead.".into(),
        };
        let text = "'--cuda-graph-max-bs' is deprecated and will be removed in a future release. Use '--cuda-graph-max-bs-decode' instead.";
        assert_eq!(
            events(&[&format!("[2026-12-02 08:44:01] \x1b[1;33m{text}\x1b[0m")]),
            std::slice::from_ref(&want)
        );
        assert_eq!(events(&[&format!("\x1b[1;33m{text}\x1b[0m")]), [want]);
        let ev = events(&["[2026-12-02 08:44:01] The command line argument '--disable-cuda-graph' is deprecated and will be removed in future versions."]);
        assert!(
            matches!(&ev[0], LogEvent::Deprecation { flag: Some(f), replacement: None, .. } if f == "--disable-cuda-graph"),
            "{ev:?}"
        );
        let ev = events(&["[2026-12-02 08:44:01] --enable-flashinfer-allreduce-fusion is deprecated. Please use --flashinfer-allreduce-fusion-backend=auto instead."]);
        assert!(
            matches!(&ev[0], LogEvent::Deprecation { flag: Some(f), replacement: Some(r), .. }
            if f == "--enable-flashinfer-allreduce-fusion" && r == "--flashinfer-allreduce-fusion-backend=auto"),
            "{ev:?}"
        );
        let ev = events(&["/tmp/site/sglang/srt/environ.py:976: UserWarning: Environment variable SGL_LOG is deprecated, please use SGLANG_LOG"]);
        assert!(
            matches!(&ev[0], LogEvent::Deprecation { flag: Some(f), replacement: Some(r), .. } if f == "SGL_LOG" && r == "SGLANG_LOG"),
            "{ev:?}"
        );
    }

    #[test]
    fn phases_carry_rank_duration_and_detail() {
        let ev = events(&[
            "[2026-12-02 09:20:16 TP1] Init torch distributed ends. elapsed=0.25 s, mem usage=0.09 GB",
            "[2026-12-02 09:20:20 TP1] Load weight end. elapsed=0.24 s, type=LlamaForCausalLM, avail mem=139.10 GB, mem usage=0.02 GB.",
            "[2026-12-02 09:20:20] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 132287100, K size: 63.08 GB, V size: 63.08 GB",
            "[2026-12-02 09:23:04] Capture target decode CUDA graph begin. backend=full, num_tokens_per_bs=1, bs=[1, 2], avail mem=11.38 GB",
            "[2026-12-02 09:23:06] Capture target decode CUDA graph end. elapsed=2.01 s, mem usage=0.04 GB, avail mem=11.34 GB.",
            "[2026-12-02 09:23:06] Capture cuda graph end. Time elapsed: 12.50 s. mem usage=1.2 GB",
            "[2026-12-02 09:20:20] max_total_num_tokens=132287100, chunked_prefill_size=8192",
        ]);
        let names: Vec<_> = ev
            .iter()
            .map(|e| match e {
                LogEvent::Phase { name, .. } => name.as_str(),
                _ => "?",
            })
            .collect();
        assert_eq!(
            names,
            [
                "init_distributed_end",
                "load_weights_end",
                "kv_cache_allocated",
                "cuda_graph_begin",
                "cuda_graph_end",
                "cuda_graph_end",
                "max_total_num_tokens"
            ]
        );
        assert!(
            matches!(&ev[1], LogEvent::Phase { rank: Some(r), reported_s: Some(s), .. } if r == "TP1" && (*s - 0.24).abs() < 1e-9)
        );
        assert!(
            matches!(&ev[2], LogEvent::Phase { detail: Some(d), .. } if d == "tokens=132287100")
        );
        assert!(matches!(&ev[3], LogEvent::Phase { detail: Some(d), .. } if d == "target decode"));
        assert!(
            matches!(&ev[5], LogEvent::Phase { reported_s: Some(s), .. } if (*s - 12.5).abs() < 1e-9)
        );
        assert!(matches!(&ev[6], LogEvent::Phase { detail: Some(d), .. } if d == "132287100"));
    }

    #[test]
    fn batch_lines_become_typed_fields() {
        let ev = events(&["[2026-12-02 08:45:02 TP0] Decode batch, #running-req: 32, #token: 18432, token usage: 0.02, cuda graph: True, gen throughput (token/s): 3120.55, #queue-req: 0"]);
        let LogEvent::Batch { kind, rank, fields } = &ev[0] else {
            panic!("{ev:?}")
        };
        assert_eq!((*kind, rank.as_deref()), (BatchKind::Decode, Some("TP0")));
        assert_eq!(
            Value::Object(fields.clone()),
            json!({"#running-req": 32, "#token": 18432, "token usage": 0.02,
            "cuda graph": true, "gen throughput (token/s)": 3120.55, "#queue-req": 0})
        );
        let ev = events(&["[2026-12-02 09:22:00] Prefill batch, #new-seq: 1, #new-token: 510, #cached-token: 2, token usage: 0.00, #running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: False, input throughput (token/s): 1108.22"]);
        assert!(
            matches!(&ev[0], LogEvent::Batch { kind: BatchKind::Prefill, fields, .. } if fields["#new-token"] == json!(510))
        );
    }

    #[test]
    fn scheduler_traceback_is_one_fatal_closed_by_the_next_prefixed_line() {
        let ev = events(&[
            "[2026-12-02 09:24:34 TP1] Scheduler hit an exception: Traceback (most recent call last):",
            "  File \"/tmp/site/sgl_kernel/flash_attn.py\", line 8, in <module>",
            "ImportError: cannot import name 'flash_ops' from 'sgl_kernel'",
            "",
            "During handling of the above exception, another exception occurred:",
            "",
            "Traceback (most recent call last):",
            "  File \"x.py\", line 10, in <module>",
            "ImportError: Can not import FA3 in sgl_kernel. Please check your installation.",
            "",
            "[2026-12-02 09:24:34] Received sigquit from a child process. It usually means the child failed.",
        ]);
        assert_eq!(ev.len(), 2, "{ev:?}");
        let LogEvent::Fatal {
            reason,
            rank,
            excerpt,
        } = &ev[0]
        else {
            panic!("{ev:?}")
        };
        assert_eq!(
            (reason.as_str(), rank.as_deref()),
            ("scheduler_exception", Some("TP1"))
        );
        assert!(excerpt.starts_with("[2026-12-02 09:24:34 TP1] Scheduler hit an exception"));
        assert!(
            excerpt.ends_with(
                "ImportError: Can not import FA3 in sgl_kernel. Please check your installation."
            ),
            "{excerpt}"
        );
        assert!(matches!(
            &ev[1],
            LogEvent::Fatal {
                reason: FatalReason::ChildSigquit,
                ..
            }
        ));
    }

    #[test]
    fn bare_traceback_ends_at_its_exception_line_and_names_known_causes() {
        let ev = events(&[
            "Traceback (most recent call last):",
            "  File \"/x/engine.py\", line 1, in _launch",
            "RuntimeError: Rank 0 scheduler died during initialization (exit code: -9). If exit code is -9 (SIGKILL), a common cause is the OS OOM killer.",
            "next unrelated line",
        ]);
        assert_eq!(ev.len(), 1, "{ev:?}");
        assert!(
            matches!(&ev[0], LogEvent::Fatal { reason: FatalReason::SchedulerDied, excerpt, .. } if excerpt.contains("RuntimeError: Rank 0"))
        );
        let ev = events(&[
            "Traceback (most recent call last):",
            "  File \"a\", line 1",
            "ValueError: boom",
        ]);
        assert!(
            matches!(&ev[0], LogEvent::Traceback { excerpt } if excerpt.ends_with("ValueError: boom"))
        );
    }

    #[test]
    fn single_line_fatals_and_worker_deaths() {
        let cases = [
            ("sglang serve: error: ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill", "argparse_error"),
            ("launch_server.py: error: unrecognized arguments: --stream-output", "argparse_error"),
            ("[2026-12-02 09:24:34] Received sigquit from a child process. It usually means the child failed.", "child_sigquit"),
            ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", "cuda_oom"),
            ("[2026-12-02 09:24:34] Subprocess detokenizer (pid=12) crashed with exit code -9. Triggering SIGQUIT for cleanup...", "subprocess_crashed"),
        ];
        for (line, want) in cases {
            let ev = events(&[line]);
            assert!(
                matches!(&ev[..], [LogEvent::Fatal { reason, .. }] if reason.as_str() == want),
                "{line}: {ev:?}"
            );
        }
        assert!(matches!(
            &events(&["[2026-12-02 09:33:23] INFO:     Child process [2870] died"])[..],
            [LogEvent::WorkerDied { .. }]
        ));
        assert_eq!(
            events(&["[2026-12-02 09:33:24] INFO:     Started server process [2871]"]),
            [LogEvent::ServerProcess]
        );
        // "error:" inside ordinary text is not argparse.
        assert!(events(&["[2026-12-02 09:23:13] [http_server] Error: Either text, input_ids or input_embeds should be provided."]).is_empty());
        assert!(events(&["[2026-12-02 09:23:13] request failed: error: timeout [x]"]).is_empty());
    }

    #[test]
    fn warnings_progress_bars_and_garbage() {
        let ev = events(&[
            "/tmp/site/torchao/quantization/quant_api.py:1731: SyntaxWarning: invalid escape sequence '\\.'",
            "[rank0]:[W1202 09:22:08.104886580 ProcessGroupNCCL.cpp:1575] Warning: WARNING: destroy_process_group() was not called",
            "  warnings.warn(",
        ]);
        assert_eq!(ev.len(), 2, "{ev:?}");
        assert!(ev.iter().all(|e| matches!(e, LogEvent::Warning { .. })));
        let bar = "  0%|          | 0/8 [00:00<?, ?it/s]\rCapturing batches (bs=32 avail_mem=11.37 GB):  12%|█▎ | 1/8".repeat(300);
        let mut p = LogParser::new();
        let mut n = 0;
        p.line(bar.as_bytes(), false, &mut |_| n += 1);
        p.line(b"\xff\xfe[2026-12-02 09:23:13] \xc3", false, &mut |_| {
            n += 1
        });
        assert_eq!(n, 0);
        assert_eq!(
            p.stats,
            ParseStats {
                lines: 2,
                progress_lines: 1,
                non_utf8_lines: 1,
                truncated_lines: 0
            }
        );
    }

    #[test]
    fn retraction_lines_carry_how_many_requests_were_retracted() {
        let line = "[2026-12-02 09:30:00 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 7, #new_tokens_gained: 4096, #new_token_ratio: 0.7000 -> 0.8500";
        assert!(
            matches!(&events(&[line])[..], [LogEvent::Retraction { requests: 7, line: l }] if l == line)
        );
    }

    #[test]
    fn access_lines_are_skipped_whole_whatever_their_path_says() {
        let line = "[2026-12-02 09:20:21] INFO:     127.0.0.1:39496 - \"GET /x: error: Warning: is deprecated HTTP/1.1\" 503";
        assert!(events(&[line]).is_empty());
        let v6 =
            "[2026-12-02 09:20:21] INFO:     [::1]:39496 - \"GET /ready to roll! HTTP/1.1\" 200 OK";
        assert!(events(&[v6]).is_empty());
    }

    /// Loopback clients are told only where asked, and only after the supervisor's request
    /// made once the server was ready: SGLang's own warm-up comes from loopback before it.
    #[test]
    fn loopback_clients_are_told_after_the_request_made_once_ready_but_the_proxys_source() {
        let access = |client: &str, request: &str| {
            format!("[2026-12-02 09:20:21] INFO:     {client} - \"{request} HTTP/1.1\" 200 OK")
        };
        let generate = |client: &str| access(client, "POST /generate");
        let after_ready = access("127.0.0.1:40002", &format!("GET {AFTER_READY}"));
        let lines = [
            // the warm-up, and a look-alike of the marker that is not it
            generate("127.0.0.1:39558"),
            access(
                "127.0.0.1:40001",
                "GET /server_info?from=sglang-supervisor-x",
            ),
            generate("127.0.0.1:39559"),
            after_ready.clone(),
            generate("127.0.0.1:39560"),
            generate("127.0.0.2:39561"),
            generate("::ffff:127.0.0.2:39562"),
            generate("::ffff:127.0.0.1:39563"),
            generate("::1:39564"),
            access("127.0.0.1:39565", "GET /health"),
            generate("127.0.0.1:39566"),
            generate("192.0.2.7:1"),
        ];
        let told = |loopback| {
            let mut p = LogParser::telling(loopback);
            let mut out = Vec::new();
            for l in &lines {
                p.line(l.as_bytes(), false, &mut |e| match e {
                    LogEvent::Client { addr } => out.push(addr.to_string()),
                    other => panic!("{other:?}"),
                });
            }
            out
        };
        let but = Some(Ipv4Addr::new(127, 0, 0, 2));
        assert_eq!(
            told(LoopbackClients::Told { but }),
            ["127.0.0.1", "127.0.0.1", "::1", "127.0.0.1", "192.0.2.7"]
        );
        assert_eq!(
            told(LoopbackClients::Told { but: None }),
            [
                "127.0.0.1",
                "127.0.0.2",
                "127.0.0.2",
                "127.0.0.1",
                "::1",
                "127.0.0.1",
                "192.0.2.7"
            ]
        );
        assert_eq!(told(LoopbackClients::Skipped), ["192.0.2.7"]);
        // the marker read as text (coloured) arms it too
        let mut p = LogParser::telling(LoopbackClients::Told { but });
        let coloured = after_ready.replace("INFO", "\x1b[32mINFO\x1b[0m");
        let mut n = 0;
        for l in [coloured, generate("127.0.0.1:1")] {
            p.line(l.as_bytes(), false, &mut |_| n += 1);
        }
        assert_eq!(n, 1);
    }

    #[test]
    fn each_generation_request_of_a_client_not_on_loopback_is_told_by_either_reading() {
        let access = |client: &str| {
            format!("[2026-12-02 09:20:21] INFO:     {client} - \"POST /generate HTTP/1.1\" 200 OK")
        };
        // uvicorn writes `"%s:%d" % client`: IPv6 without brackets, mapped IPv4 as such.
        let lines: Vec<String> = [
            "127.0.0.1:39496",
            "::1:5000",
            "::ffff:127.0.0.1:5000",
            "",
            // uvicorn's proxy headers: a forwarded client, over a local connection.
            "203.0.113.9:0",
            "192.0.2.7:1",
            "192.0.2.7:2",
            "fd00::5:443",
            "::ffff:10.0.0.9:80",
            "[fd00::5]:444",
            // A forwarded client, however its port is written; a link-local one, with its scope.
            "203.0.113.9:00",
            "fe80::7%eth0:5000",
        ]
        .iter()
        .map(|c| access(c))
        // A probe from elsewhere is no measured request; the same client's next one is.
        .chain([
            "[2026-12-02 09:20:21] INFO:     198.51.100.3:9 - \"GET /health HTTP/1.1\" 200 OK".into(),
            "[2026-12-02 09:20:21] INFO:     198.51.100.3:9 - \"GET /metrics HTTP/1.1\" 200 OK".into(),
        ])
        // Coloured, the same line is read as text rather than by the byte shortcut.
        .chain(["[2026-12-02 09:20:21] \x1b[32mINFO\x1b[0m:     198.51.100.3:9 - \"POST /v1/chat/completions?x=1 HTTP/1.1\" 200".into()])
        .collect();
        let told: Vec<String> = events(&lines.iter().map(String::as_str).collect::<Vec<_>>())
            .into_iter()
            .map(|e| match e {
                LogEvent::Client { addr } => addr.to_string(),
                other => panic!("{other:?}"),
            })
            .collect();
        // Each request, whichever form its address is logged in, read the first time or after.
        assert_eq!(
            told,
            [
                "192.0.2.7",
                "192.0.2.7",
                "fd00::5",
                "10.0.0.9",
                "fd00::5",
                "fe80::7",
                "198.51.100.3"
            ]
        );
        // However many clients come, each request of theirs is told; loopback in the form a
        // server on `::` logs takes no place among the hosts kept.
        let many: Vec<String> = (0..MAX_CLIENTS + 5)
            .map(|i| access(&format!("::ffff:127.0.0.{i}:80")))
            .chain((0..MAX_CLIENTS + 5).map(|i| access(&format!("10.0.1.{i}:80"))))
            .chain((0..MAX_CLIENTS + 5).map(|i| access(&format!("10.0.1.{i}:81"))))
            .collect();
        let mut p = LogParser::new();
        let mut n = 0;
        for l in &many {
            p.line(l.as_bytes(), false, &mut |_| n += 1);
        }
        assert_eq!(n, 2 * (MAX_CLIENTS + 5));
        assert_eq!(p.clients.len(), MAX_CLIENTS);
        // A host read before: a longer host that starts like it, its forwarded clients (port 0)
        // and its probes are told apart from its requests.
        let known = [
            access("10.0.2.1:80"),
            access("10.0.2.12:80"),
            access("10.0.2.1:0"),
            "[2026-12-02 09:20:21] INFO:     10.0.2.1:81 - \"GET /health HTTP/1.1\" 200 OK".into(),
            access("10.0.2.1:82"),
        ];
        let told: Vec<String> = events(&known.iter().map(String::as_str).collect::<Vec<_>>())
            .into_iter()
            .map(|e| format!("{e:?}"))
            .collect();
        assert_eq!(told.len(), 3, "{told:?}");
        assert!(
            told[1].contains("10.0.2.12") && told[2].contains("10.0.2.1 "),
            "{told:?}"
        );
        // A message shaped like an access line but for its client is read as any other.
        let oom = "[2026-12-02 09:20:21] INFO:     Started - \"RuntimeError: CUDA out of memory\"";
        assert!(
            matches!(events(&[oom])[..], [LogEvent::Fatal { .. }]),
            "{:?}",
            events(&[oom])
        );
        // uvicorn's other lines are no access lines.
        let up = "[2026-12-02 09:20:21] INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)";
        assert!(matches!(
            events(&[up])[..],
            [LogEvent::Phase {
                name: PhaseName::HttpUp,
                ..
            }]
        ));
    }
}
