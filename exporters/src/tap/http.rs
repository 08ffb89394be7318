//! HTTP/1.1 read off one TCP connection's two byte streams, as a client and a server exchanged
//! them: requests (head and body framing), and the answers to them in order (1xx skipped, HEAD
//! and 204/304 without a body, chunked framing removed, a body that ends with the connection).
//! Nothing is copied but a head that arrives in pieces.
use std::collections::VecDeque;

/// Longest head read (request or answer); past it the connection is no longer read.
const MAX_HEAD: usize = 64 << 10;
/// Headers read per head (hyper's default is 100).
const MAX_HEADERS: usize = 100;

/// What the two byte streams said, in the order it was read.
#[derive(Debug, PartialEq, Eq)]
pub enum Http<'a> {
    /// A request's head was read (its first byte came with the segment that began it).
    Request { method: &'a str, path: &'a str },
    /// The answer to the oldest open request began (a final status, not 1xx).
    Answer { status: u16, stream: bool },
    /// Bytes of that answer's body, its framing removed.
    Body(&'a [u8]),
    /// That answer ended.
    End,
}

/// Why a connection can no longer be read as HTTP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unreadable {
    #[error("a head that is not HTTP/1.x")]
    BadHead,
    #[error("a head over {MAX_HEAD} bytes")]
    HeadTooLong,
    #[error("a malformed chunked body")]
    BadChunk,
    #[error("an answer with no request open")]
    AnswerWithoutRequest,
    #[error("the connection switched protocols")]
    Upgraded,
    /// Not a fault: the server closed its side, so nothing more can be read.
    #[error("the server closed the connection")]
    ServerClosed,
}

/// How a body's end is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Length(u64),
    Chunked(Chunk),
    UntilClose,
}

/// Where a chunked body's reader stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    Size {
        n: u64,
        digits: bool,
    },
    Extension {
        n: u64,
    },
    Data(u64),
    DataEnd {
        cr: bool,
    },
    /// Trailer lines; `chars`: of the current line, a blank line ends the body.
    Trailer {
        chars: usize,
    },
}

/// One direction's reader: a head being gathered, or a body being passed.
#[derive(Debug)]
enum Side {
    Head(Vec<u8>),
    Body(Framing),
}

/// One connection's HTTP, both directions.
#[derive(Debug)]
pub struct Exchange {
    client: Side,
    server: Side,
    /// Open requests, oldest first: whether each was a HEAD (its answer has no body).
    open: VecDeque<bool>,
    /// Set once the connection cannot be read any more.
    lost: Option<Unreadable>,
}

impl Default for Exchange {
    fn default() -> Self {
        Exchange {
            client: Side::Head(Vec::new()),
            server: Side::Head(Vec::new()),
            open: VecDeque::new(),
            lost: None,
        }
    }
}

impl Exchange {
    /// Forgets all open requests but the newest: a joined connection's older ones were
    /// answered out of the tap's sight.
    pub fn keep_newest(&mut self) {
        while self.open.len() > 1 {
            self.open.pop_front();
        }
    }

    pub fn lost(&self) -> Option<Unreadable> {
        self.lost
    }

    /// Bytes kept of heads that arrived in pieces (their buffers' size).
    pub fn buffered(&self) -> usize {
        let size = |s: &Side| match s {
            Side::Head(b) => b.capacity(),
            Side::Body(_) => 0,
        };
        size(&self.client) + size(&self.server)
    }

    /// Whether a request's head has begun and not yet been read whole.
    pub fn client_mid_head(&self) -> bool {
        matches!(&self.client, Side::Head(b) if !b.is_empty())
    }

    /// Whether the server is inside an answer's head or body.
    pub fn answering(&self) -> bool {
        match &self.server {
            Side::Head(b) => !b.is_empty(),
            Side::Body(_) => true,
        }
    }

    /// Bytes the client sent, in order.
    pub fn client_bytes(&mut self, data: &[u8], on: &mut impl FnMut(Http<'_>)) {
        self.bytes(true, data, on);
    }

    /// Bytes the server sent, in order.
    pub fn server_bytes(&mut self, data: &[u8], on: &mut impl FnMut(Http<'_>)) {
        self.bytes(false, data, on);
    }

    /// One direction's bytes: heads gathered and read, bodies passed (a request's read past, an
    /// answer's to `on`, then its end).
    fn bytes(&mut self, from_client: bool, mut data: &[u8], on: &mut impl FnMut(Http<'_>)) {
        while !data.is_empty() && self.lost.is_none() {
            let side = if from_client {
                &mut self.client
            } else {
                &mut self.server
            };
            match side {
                Side::Body(framing) => {
                    let passed = if from_client {
                        skip_body(framing, data)
                    } else {
                        pass_body(framing, data, on)
                    };
                    match passed {
                        Ok((used, ended)) => {
                            data = &data[used..];
                            if ended {
                                *side = Side::Head(Vec::new());
                                if !from_client {
                                    on(Http::End);
                                }
                            }
                        }
                        Err(e) => self.lost = Some(e),
                    }
                }
                Side::Head(held) => match gather(held, data) {
                    Err(e) => self.lost = Some(e),
                    Ok(None) => return,
                    Ok(Some(used)) => {
                        let head = std::mem::take(held);
                        data = &data[used..];
                        if from_client {
                            self.read_request(&head, on);
                        } else {
                            self.read_answer(&head, on);
                        }
                    }
                },
            }
        }
    }

    fn read_request(&mut self, head: &[u8], on: &mut impl FnMut(Http<'_>)) {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        let (Ok(httparse::Status::Complete(_)), Some(method), Some(target)) =
            (req.parse(head), req.method, req.path)
        else {
            self.lost = Some(Unreadable::BadHead);
            return;
        };
        let path = target.split('?').next().unwrap_or(target);
        self.open.push_back(method.eq_ignore_ascii_case("HEAD"));
        on(Http::Request { method, path });
        if method.eq_ignore_ascii_case("CONNECT") || header(req.headers, "upgrade").is_some() {
            // What follows an accepted upgrade is not HTTP; what follows a refused one is, but
            // the two cannot be told apart from here without the answer: stop reading.
            self.lost = Some(Unreadable::Upgraded);
            return;
        }
        self.client = match framing(req.headers) {
            Some(Framing::UntilClose) | None => Side::Head(Vec::new()),
            Some(Framing::Length(0)) => Side::Head(Vec::new()),
            Some(f) => Side::Body(f),
        };
    }

    fn read_answer(&mut self, head: &[u8], on: &mut impl FnMut(Http<'_>)) {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut headers);
        let (Ok(httparse::Status::Complete(_)), Some(status)) = (resp.parse(head), resp.code)
        else {
            self.lost = Some(Unreadable::BadHead);
            return;
        };
        if status == 101 {
            self.lost = Some(Unreadable::Upgraded);
            return;
        }
        if (100..200).contains(&status) {
            return; // an interim answer (100 Continue): the final one follows
        }
        let Some(was_head) = self.open.pop_front() else {
            self.lost = Some(Unreadable::AnswerWithoutRequest);
            return;
        };
        let stream = header(resp.headers, "content-type").is_some_and(|v| {
            v.get(..17)
                .is_some_and(|p| p.eq_ignore_ascii_case(b"text/event-stream"))
        });
        on(Http::Answer { status, stream });
        let bodiless = was_head || status == 204 || status == 304;
        match framing(resp.headers) {
            _ if bodiless => on(Http::End),
            None => {
                self.lost = Some(Unreadable::BadHead);
            }
            Some(Framing::Length(0)) => on(Http::End),
            Some(f) => self.server = Side::Body(f),
        }
    }

    /// The server closed its side: an answer that runs until the close ends here. Returns
    /// whether an answer was cut short (a head, or a body with a length or chunks, unfinished).
    pub fn server_closed(&mut self, on: &mut impl FnMut(Http<'_>)) -> bool {
        let cut = match std::mem::replace(&mut self.server, Side::Head(Vec::new())) {
            Side::Body(Framing::UntilClose) => {
                on(Http::End);
                false
            }
            Side::Body(_) => true,
            Side::Head(held) => !held.is_empty(),
        };
        self.lost.get_or_insert(Unreadable::ServerClosed);
        cut
    }
}

/// Whether `data` begins with a whole HTTP/1.x request line, `METHOD /TARGET HTTP/1.x` and its
/// CRLF: where a keep-alive connection that opened before the tap can be followed from. A JSON
/// body cannot look like one (a raw CR or LF stands only between its tokens), so a segment that
/// does is a request's start.
pub fn starts_request(data: &[u8]) -> bool {
    let Some(end) = memchr::memchr(b'\n', &data[..data.len().min(8192)]) else {
        return false;
    };
    let Some(line) = data[..end].strip_suffix(b"\r") else {
        return false;
    };
    let mut parts = line.split(|&b| b == b' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    (1..=16).contains(&method.len())
        && method.iter().all(u8::is_ascii_uppercase)
        && target.first() == Some(&b'/')
        && target.iter().all(|&b| b > b' ' && b < 0x7f)
        && matches!(version, b"HTTP/1.1" | b"HTTP/1.0")
}

/// Whether `data` begins an answer's status line (`HTTP/1.1 200`).
pub fn starts_answer(data: &[u8]) -> bool {
    data.len() >= 12
        && matches!(&data[..9], b"HTTP/1.1 " | b"HTTP/1.0 ")
        && data[9..12].iter().all(u8::is_ascii_digit)
}

/// Gathers a head: returns how much of `data` completed it, or None when more is needed.
fn gather(held: &mut Vec<u8>, data: &[u8]) -> Result<Option<usize>, Unreadable> {
    let before = held.len();
    // The blank line may straddle segments: look from three bytes back.
    let from = before.saturating_sub(3);
    let room = MAX_HEAD.saturating_sub(before);
    let take = data.len().min(room);
    held.extend_from_slice(&data[..take]);
    match memchr::memmem::find(&held[from..], b"\r\n\r\n") {
        Some(at) => {
            let end = from + at + 4;
            held.truncate(end);
            Ok(Some(end - before))
        }
        None if take < data.len() || held.len() >= MAX_HEAD => Err(Unreadable::HeadTooLong),
        None => Ok(None),
    }
}

fn header<'h>(headers: &'h [httparse::Header<'_>], name: &str) -> Option<&'h [u8]> {
    headers
        .iter()
        .rev()
        .find(|h| h.name.eq_ignore_ascii_case(name))
        .map(|h| h.value)
}

/// A message's framing (RFC 9112 §6.3): chunked when the last coding is chunked, else its
/// length, else until the close (None: a length that is not a number).
fn framing(headers: &[httparse::Header<'_>]) -> Option<Framing> {
    if let Some(te) = header(headers, "transfer-encoding") {
        let last = te.rsplit(|&c| c == b',').next().unwrap_or(te);
        if last.trim_ascii().eq_ignore_ascii_case(b"chunked") {
            return Some(Framing::Chunked(Chunk::Size {
                n: 0,
                digits: false,
            }));
        }
        return Some(Framing::UntilClose);
    }
    match header(headers, "content-length") {
        Some(v) => std::str::from_utf8(v)
            .ok()?
            .trim()
            .parse()
            .ok()
            .map(Framing::Length),
        None => Some(Framing::UntilClose),
    }
}

/// A request body, read past. Returns how much was used and whether the body ended.
fn skip_body(framing: &mut Framing, data: &[u8]) -> Result<(usize, bool), Unreadable> {
    pass_body(framing, data, &mut |_| {})
}

/// A body's bytes, framing removed, to `on`. Returns how much was used and whether it ended.
fn pass_body(
    framing: &mut Framing,
    data: &[u8],
    on: &mut impl FnMut(Http<'_>),
) -> Result<(usize, bool), Unreadable> {
    match framing {
        Framing::UntilClose => {
            on(Http::Body(data));
            Ok((data.len(), false))
        }
        Framing::Length(left) => {
            let take = (*left).min(data.len() as u64) as usize;
            if take > 0 {
                on(Http::Body(&data[..take]));
            }
            *left -= take as u64;
            Ok((take, *left == 0))
        }
        Framing::Chunked(state) => dechunk(state, data, on),
    }
}

/// Chunked framing removed (RFC 9112 §7.1); a bare LF is taken for CRLF, as hyper does.
fn dechunk(
    state: &mut Chunk,
    data: &[u8],
    on: &mut impl FnMut(Http<'_>),
) -> Result<(usize, bool), Unreadable> {
    let mut i = 0;
    while i < data.len() {
        let c = data[i];
        *state = match *state {
            Chunk::Size { n, digits } => match (c as char).to_digit(16) {
                Some(d) => {
                    let n = n
                        .checked_mul(16)
                        .and_then(|n| n.checked_add(d as u64))
                        .ok_or(Unreadable::BadChunk)?;
                    Chunk::Size { n, digits: true }
                }
                None if !digits => return Err(Unreadable::BadChunk),
                None if matches!(c, b';' | b' ' | b'\t' | b'\r') => Chunk::Extension { n },
                None if c == b'\n' => after_size(n),
                None => return Err(Unreadable::BadChunk),
            },
            Chunk::Extension { n } if c == b'\n' => after_size(n),
            Chunk::Extension { n } => Chunk::Extension { n },
            Chunk::Data(left) => {
                let take = left.min((data.len() - i) as u64) as usize;
                on(Http::Body(&data[i..i + take]));
                i += take;
                let left = left - take as u64;
                *state = if left == 0 {
                    Chunk::DataEnd { cr: false }
                } else {
                    Chunk::Data(left)
                };
                continue;
            }
            Chunk::DataEnd { cr: false } if c == b'\r' => Chunk::DataEnd { cr: true },
            Chunk::DataEnd { .. } if c == b'\n' => Chunk::Size {
                n: 0,
                digits: false,
            },
            Chunk::DataEnd { .. } => return Err(Unreadable::BadChunk),
            Chunk::Trailer { chars } if c == b'\n' => {
                if chars == 0 {
                    return Ok((i + 1, true));
                }
                Chunk::Trailer { chars: 0 }
            }
            Chunk::Trailer { chars } if c == b'\r' => Chunk::Trailer { chars },
            Chunk::Trailer { chars } => Chunk::Trailer { chars: chars + 1 },
        };
        i += 1;
    }
    Ok((i, false))
}

fn after_size(n: u64) -> Chunk {
    if n == 0 {
        Chunk::Trailer { chars: 0 }
    } else {
        Chunk::Data(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_line_is_told_from_body_bytes_and_answers() {
        for yes in [
            &b"POST /generate HTTP/1.1\r\nHost: h\r\n\r\n"[..],
            b"GET /v1/models?x=1 HTTP/1.0\r\n",
        ] {
            assert!(starts_request(yes), "{}", String::from_utf8_lossy(yes));
        }
        for no in [
            &b"POST /generate HTTP/1.1"[..], // the line goes on in the next segment
            b"POST /generate HTTP/1.1\n",
            b"post /generate HTTP/1.1\r\n",
            b"POST generate HTTP/1.1\r\n",
            b"POST /a b HTTP/1.1\r\n",
            b"POST /generate HTTP/2\r\n",
            b"{\"text\":\"POST /generate HTTP/1.1\r\n",
            b"HTTP/1.1 200 OK\r\n",
            b"",
        ] {
            assert!(!starts_request(no), "{}", String::from_utf8_lossy(no));
        }
        assert!(starts_answer(b"HTTP/1.1 200 OK\r\n"));
        assert!(!starts_answer(b"data: HTTP/1.1 200"));
        assert!(!starts_answer(b"HTTP/1.1 2"));
    }

    /// What a run of client and server pieces reads as, in order (bodies joined per answer).
    #[derive(Debug, PartialEq, Eq)]
    enum Seen {
        Request(String, String),
        Answer(u16, bool),
        Body(Vec<u8>),
        End,
    }

    fn read(pieces: &[(bool, &[u8])]) -> (Vec<Seen>, Option<Unreadable>) {
        let mut x = Exchange::default();
        let mut seen = Vec::new();
        let mut on = |h: Http<'_>| match h {
            Http::Request { method, path } => seen.push(Seen::Request(method.into(), path.into())),
            Http::Answer { status, stream } => seen.push(Seen::Answer(status, stream)),
            Http::Body(b) => match seen.last_mut() {
                Some(Seen::Body(v)) => v.extend_from_slice(b),
                _ => seen.push(Seen::Body(b.to_vec())),
            },
            Http::End => seen.push(Seen::End),
        };
        for (from_client, bytes) in pieces {
            if *from_client {
                x.client_bytes(bytes, &mut on);
            } else {
                x.server_bytes(bytes, &mut on);
            }
        }
        (seen, x.lost())
    }

    /// Every way of cutting `bytes` into two pieces reads the same as the whole.
    fn cut_anywhere(from_client: bool, bytes: &[u8], other: &[(bool, &[u8])]) -> Vec<Seen> {
        let mut whole = other.to_vec();
        whole.push((from_client, bytes));
        let (expect, lost) = read(&whole);
        assert_eq!(lost, None);
        for at in 0..bytes.len() {
            let mut cut = other.to_vec();
            cut.push((from_client, &bytes[..at]));
            cut.push((from_client, &bytes[at..]));
            assert_eq!(read(&cut).0, expect, "cut at {at}");
        }
        expect
    }

    const SSE: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n14;ext=1\r\ndata: {\"text\":\"a\"}\n\n\r\nE\r\ndata: [DONE]\n\n\r\n0\r\nx-trailer: 1\r\n\r\n";

    #[test]
    fn a_chunked_stream_reads_as_its_events_however_its_segments_are_cut() {
        let req: &[u8] = b"POST /generate?x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n\r\n{}{}";
        let seen = cut_anywhere(false, SSE, &[(true, req)]);
        assert_eq!(
            seen,
            vec![
                Seen::Request("POST".into(), "/generate".into()),
                Seen::Answer(200, true),
                Seen::Body(b"data: {\"text\":\"a\"}\n\ndata: [DONE]\n\n".to_vec()),
                Seen::End,
            ]
        );
    }

    #[test]
    fn pipelined_requests_with_bodies_are_answered_in_order_and_head_answers_have_no_body() {
        let reqs: &[u8] = b"POST /v1/completions HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n3\r\n{}\n\r\n0\r\n\r\nHEAD /generate HTTP/1.1\r\n\r\nGET /health HTTP/1.1\r\n\r\n";
        let answers: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n";
        let seen = cut_anywhere(false, answers, &[(true, reqs)]);
        assert_eq!(
            seen,
            vec![
                Seen::Request("POST".into(), "/v1/completions".into()),
                Seen::Request("HEAD".into(), "/generate".into()),
                Seen::Request("GET".into(), "/health".into()),
                Seen::Answer(200, false),
                Seen::Body(b"{}".to_vec()),
                Seen::End,
                Seen::Answer(200, false),
                Seen::End,
                Seen::Answer(204, false),
                Seen::End,
            ]
        );
        cut_anywhere(true, reqs, &[]);
    }

    #[test]
    fn a_body_without_length_ends_when_the_server_closes_and_a_cut_one_is_said_cut() {
        let mut x = Exchange::default();
        let mut ends = 0;
        let mut on = |h: Http<'_>| ends += (h == Http::End) as usize;
        x.client_bytes(b"GET /generate HTTP/1.1\r\n\r\n", &mut on);
        x.server_bytes(b"HTTP/1.0 200 OK\r\n\r\nall of it", &mut on);
        assert!(!x.server_closed(&mut on), "ended by the close");
        assert_eq!(ends, 1);
        assert_eq!(
            x.lost(),
            Some(Unreadable::ServerClosed),
            "a close, not a fault"
        );
        let mut x = Exchange::default();
        x.client_bytes(b"GET /generate HTTP/1.1\r\n\r\n", &mut |_| {});
        x.server_bytes(
            b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nhalf",
            &mut |_| {},
        );
        assert!(x.server_closed(&mut |_| {}), "cut short");
    }

    #[test]
    fn what_is_not_http_stops_the_reading_with_its_reason() {
        for (pieces, why) in [
            (vec![(true, &b"\x16\x03\x01 tls hello\r\n\r\n"[..])], Unreadable::BadHead),
            (
                vec![(false, &b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"[..])],
                Unreadable::AnswerWithoutRequest,
            ),
            (
                vec![
                    (true, &b"GET / HTTP/1.1\r\n\r\n"[..]),
                    (false, b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"),
                ],
                Unreadable::BadChunk,
            ),
            (
                vec![(true, &b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\n\r\n"[..])],
                Unreadable::Upgraded,
            ),
            (
                vec![(true, &b"GET /generate HTTP/1.1\r\nx: "[..]), (true, &[b'a'; MAX_HEAD])],
                Unreadable::HeadTooLong,
            ),
            (
                vec![
                    (true, &b"GET / HTTP/1.1\r\n\r\n"[..]),
                    (false, b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nfffffffffffffffff\r\n"),
                ],
                Unreadable::BadChunk,
            ),
        ] {
            assert_eq!(read(&pieces).1, Some(why), "{pieces:?}");
        }
    }

    use crate::tap::tcp::tests::Rng;

    /// A random keep-alive exchange: requests (bodies by length or chunks, HEAD among them) and
    /// their answers (by length, chunks with extensions and trailers, 1xx before, 204/304).
    fn exchange(rng: &mut Rng) -> (Vec<u8>, Vec<u8>) {
        let (mut c, mut s) = (Vec::new(), Vec::new());
        for _ in 0..1 + rng.below(4) {
            let head = rng.below(5) == 0;
            let method = if head { "HEAD" } else { "POST" };
            match rng.below(3) {
                0 => c.extend_from_slice(
                    format!("{method} /generate HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc").as_bytes(),
                ),
                1 => c.extend_from_slice(
                    format!("{method} /v1/completions?x HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n2;e=1\r\nab\r\n0\r\nt: 1\r\n\r\n").as_bytes(),
                ),
                _ => c.extend_from_slice(format!("{method} /health HTTP/1.1\r\n\r\n").as_bytes()),
            }
            if rng.below(4) == 0 {
                s.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
            }
            match (head, rng.below(4)) {
                (true, _) => s.extend_from_slice(b"HTTP/1.1 200 OK\r\ncontent-length: 99\r\n\r\n"),
                (_, 0) => s.extend_from_slice(b"HTTP/1.1 204 No Content\r\n\r\n"),
                (_, 1) => {
                    s.extend_from_slice(b"HTTP/1.1 304 Not Modified\r\ncontent-length: 5\r\n\r\n")
                }
                (_, 2) => s.extend_from_slice(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nbody"),
                _ => s.extend_from_slice(SSE),
            }
        }
        (c, s)
    }

    /// Cuts `b` into random pieces.
    fn pieces<'b>(rng: &mut Rng, b: &'b [u8]) -> Vec<&'b [u8]> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < b.len() {
            let most = if rng.below(2) == 0 { 8 } else { 200 };
            let n = 1 + rng.below(most);
            let end = (at + n).min(b.len());
            out.push(&b[at..end]);
            at = end;
        }
        out
    }

    #[test]
    fn random_exchanges_read_the_same_however_cut_and_junk_never_panics() {
        let mut rng = Rng(7);
        for round in 0..3000 {
            let (c, s) = exchange(&mut rng);
            let (whole, lost) = read(&[(true, &c[..]), (false, &s[..])]);
            assert_eq!(lost, None, "round {round}");
            let ends = whole.iter().filter(|h| **h == Seen::End).count();
            let requests = whole
                .iter()
                .filter(|h| matches!(h, Seen::Request(..)))
                .count();
            assert_eq!(ends, requests, "every request answered once, round {round}");
            // The client's pieces all before the server's (answers follow requests), each cut
            // anywhere.
            let mut cut: Vec<(bool, &[u8])> = pieces(&mut rng, &c)
                .into_iter()
                .map(|p| (true, p))
                .collect();
            cut.extend(pieces(&mut rng, &s).into_iter().map(|p| (false, p)));
            assert_eq!(read(&cut).0, whole, "round {round}");
            // Bytes changed, dropped or added anywhere: a reading or a reason, never a panic,
            // and no more kept than two heads.
            let (mut c, mut s) = (c, s);
            for _ in 0..1 + rng.below(6) {
                let v = if rng.below(2) == 0 { &mut c } else { &mut s };
                let i = rng.below(v.len());
                match rng.below(3) {
                    0 => v[i] = rng.next() as u8,
                    1 => {
                        v.remove(i);
                    }
                    _ => v.insert(i, b"\r\n:;0fF \t"[rng.below(9)]),
                }
            }
            let mut x = Exchange::default();
            let mut on = |_: Http<'_>| {};
            let (pc, ps) = (pieces(&mut rng, &c), pieces(&mut rng, &s));
            let (mut i, mut j) = (0, 0);
            while i < pc.len() || j < ps.len() {
                if j == ps.len() || (i < pc.len() && rng.below(2) == 0) {
                    x.client_bytes(pc[i], &mut on);
                    i += 1;
                } else {
                    x.server_bytes(ps[j], &mut on);
                    j += 1;
                }
                assert!(x.buffered() <= 4 * MAX_HEAD);
            }
            x.server_closed(&mut on);
        }
    }
}
