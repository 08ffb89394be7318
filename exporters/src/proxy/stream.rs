//! The upstream body on its way to the client, measured as it passes. Frames are forwarded as
//! they arrive and without copying; events are found with a byte scan. When the proxy asked the
//! server for usage on the client's behalf, the one usage-only event is cut out so the client
//! receives exactly the bytes a direct connection gives.
use super::record::Recorder;
use super::sse::{event_end, scan_event, Api, EventInfo};
use super::upstream::{Deferred, Driven};
use super::UpstreamBody;
use hyper::body::{Body, Bytes, Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

/// Largest incomplete SSE event held: past it the event is forwarded unread.
const MAX_EVENT: usize = 4 << 20;

pub struct Measured {
    inner: Driven<UpstreamBody>,
    rec: Option<Recorder>,
    stream: bool,
    events: EventStream,
    /// The upstream ended while bytes were held: they go out, then the end.
    ended: bool,
    /// The upstream failed while bytes were held: they go out, then the error.
    failed: Deferred<hyper::Error>,
}

/// The SSE events of one response, found in frames cut anywhere, and what of each frame goes to
/// the client.
#[derive(Debug)]
pub struct EventStream {
    api: Api,
    /// Cut the usage-only event out (the client did not ask for usage; the proxy did).
    drop_usage: bool,
    /// The start of an event not yet ended (held back from the client only when `drop_usage`).
    carry: Vec<u8>,
    /// How much of `carry` is known to hold no event end.
    scanned: usize,
    /// Inside an event too large to hold: forwarded unread until its end.
    unread: bool,
    /// The last bytes of that event seen, for an end split across frames.
    edge: Vec<u8>,
}

impl EventStream {
    pub fn new(api: Api, drop_usage: bool) -> Self {
        EventStream {
            api,
            drop_usage,
            carry: Vec::new(),
            scanned: 0,
            unread: false,
            edge: Vec::new(),
        }
    }

    /// Inside an oversized event: where in `data` what follows its end starts, if it ends here.
    fn unread_end(&mut self, data: &[u8]) -> Option<usize> {
        let off = self.edge.len();
        let mut probe = std::mem::take(&mut self.edge);
        probe.extend_from_slice(&data[..data.len().min(2)]);
        if let Some((_, next)) = event_end(&probe).filter(|&(_, n)| n > off) {
            return Some(next - off);
        }
        if let Some((_, next)) = event_end(data) {
            return Some(next);
        }
        probe.extend_from_slice(&data[data.len().min(2)..]);
        self.edge = probe[probe.len().saturating_sub(2)..].to_vec();
        None
    }

    /// Read a frame's events; returns what the client gets of it (the same bytes, without
    /// copying, unless an event is cut out or held back).
    pub fn pass(&mut self, data: Bytes, mut on_event: impl FnMut(EventInfo)) -> Bytes {
        if !self.drop_usage {
            self.read(&data, on_event);
            return data;
        }
        if self.unread {
            let Some(next) = self.unread_end(&data) else {
                return data;
            };
            self.unread = false;
            if next == data.len() {
                return data;
            }
            let rest = self.pass(data.slice(next..), on_event);
            return if rest.len() == data.len() - next {
                data
            } else {
                join(&data[..next], &rest)
            };
        }
        if self.carry.is_empty() {
            // The common case: the frame holds whole events.
            let (pos, cut) = self.read_whole(&data, &mut on_event);
            return match cut {
                None => data.slice(..pos),
                Some((a, b)) => join(&data[..a], &data[b..pos]),
            };
        }
        // An event spans frames: read it from the carried bytes.
        self.carry.extend_from_slice(&data);
        let mut out = Vec::new();
        self.read_carried(&mut on_event, Some(&mut out));
        Bytes::from(out)
    }

    /// Read a frame's events when none is cut (the proxy when it asked the server for nothing,
    /// the tap): nothing is copied but the start of an event the frame does not end.
    pub fn read(&mut self, mut data: &[u8], mut on_event: impl FnMut(EventInfo)) {
        if self.unread {
            let Some(next) = self.unread_end(data) else {
                return;
            };
            self.unread = false;
            data = &data[next..];
        }
        if self.carry.is_empty() {
            self.read_whole(data, &mut on_event);
            return;
        }
        self.carry.extend_from_slice(data);
        self.read_carried(&mut on_event, None);
    }

    /// The events of a frame read with nothing carried, in place; the unended rest is carried.
    /// Returns where the last whole event ends, and where the usage-only event lies if one came.
    fn read_whole(
        &mut self,
        data: &[u8],
        on_event: &mut impl FnMut(EventInfo),
    ) -> (usize, Option<(usize, usize)>) {
        let (mut pos, mut usage) = (0, None);
        while let Some((end, next)) = event_end(&data[pos..]) {
            let info = scan_event(self.api, &data[pos..pos + end]);
            on_event(info);
            if info.usage_only {
                usage = Some((pos, pos + next));
            }
            pos += next;
        }
        if pos < data.len() {
            self.carry.extend_from_slice(&data[pos..]);
            self.scanned = 0;
        }
        (pos, usage)
    }

    /// The events that end in the carried bytes; `keep` gets what of them goes to the client
    /// (all but the usage-only event), and the start of an event too large to hold.
    fn read_carried(
        &mut self,
        on_event: &mut impl FnMut(EventInfo),
        mut keep: Option<&mut Vec<u8>>,
    ) {
        let (mut pos, mut from) = (0, self.scanned);
        while let Some((end, next)) = event_end(&self.carry[from..]) {
            let (end, next) = (from + end, from + next);
            let info = scan_event(self.api, &self.carry[pos..end]);
            on_event(info);
            if let Some(out) = keep.as_deref_mut().filter(|_| !info.usage_only) {
                out.extend_from_slice(&self.carry[pos..next]);
            }
            (pos, from) = (next, next);
        }
        self.carry.drain(..pos);
        // The blank line may straddle the next frame: rescan the last two bytes.
        self.scanned = self.carry.len().saturating_sub(2);
        if self.carry.len() > MAX_EVENT {
            // Forwarded as it comes until its end, read only from its start (the usage-only
            // event, small, is still cut when it comes).
            tracing::warn!("proxy: an SSE event over {MAX_EVENT} bytes is forwarded unread");
            let held = std::mem::take(&mut self.carry);
            on_event(scan_event(self.api, &held));
            self.scanned = 0;
            self.unread = true;
            self.edge = held[held.len() - 2..].to_vec();
            if let Some(out) = keep {
                out.extend_from_slice(&held);
            }
        }
    }

    /// The stream ended: an unterminated last event is still read; returns the bytes held back.
    pub fn finish(&mut self, mut on_event: impl FnMut(EventInfo)) -> Option<Bytes> {
        let held = std::mem::take(&mut self.carry);
        if !held.is_empty() {
            on_event(scan_event(self.api, &held));
        }
        (self.drop_usage && !held.is_empty()).then(|| Bytes::from(held))
    }

    fn holds(&self) -> bool {
        self.drop_usage && !self.carry.is_empty()
    }
}

impl Measured {
    pub(crate) fn new(
        inner: Driven<UpstreamBody>,
        rec: Recorder,
        stream: bool,
        drop_usage: bool,
    ) -> Self {
        let events = EventStream::new(rec.api(), drop_usage && stream);
        let mut m = Measured {
            inner,
            rec: Some(rec),
            stream,
            events,
            ended: false,
            failed: Deferred::default(),
        };
        // An answer without a body (HEAD, 204, 304) is whole with its head: hyper never polls
        // such a body, and one dropped unpolled would be recorded as a client that left.
        if m.inner.is_end_stream() {
            m.finish(None);
        }
        m
    }

    fn pass(&mut self, data: Bytes) -> Bytes {
        let now = Instant::now();
        let Some(rec) = self.rec.as_mut() else {
            return data;
        };
        rec.on_frame(&data, now);
        if !self.stream {
            return data;
        }
        self.events.pass(data, |e| rec.on_event(e, now))
    }

    fn flush(&mut self) -> Option<Bytes> {
        let now = Instant::now();
        match self.rec.as_mut() {
            Some(rec) => self.events.finish(|e| rec.on_event(e, now)),
            None => self.events.finish(|_| {}),
        }
    }

    fn finish(&mut self, error: Option<String>) {
        if let Some(r) = self.rec.take() {
            r.finish(error);
        }
    }
}

fn join(a: &[u8], b: &[u8]) -> Bytes {
    let mut v = Vec::with_capacity(a.len() + b.len());
    v.extend_from_slice(a);
    v.extend_from_slice(b);
    Bytes::from(v)
}

impl Body for Measured {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        loop {
            if let Some(p) = this.failed.poll(cx) {
                return p;
            }
            if this.ended {
                this.finish(None);
                return Poll::Ready(None);
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    let frame = match frame.into_data() {
                        Ok(data) => {
                            let out = this.pass(data);
                            if this.inner.is_end_stream() {
                                // hyper may never poll again once the length is reached.
                                let tail = this.flush();
                                this.finish(None);
                                let out = match tail {
                                    Some(t) => join(&out, &t),
                                    None => out,
                                };
                                return Poll::Ready(Some(Ok(Frame::data(out))));
                            }
                            if out.is_empty() {
                                continue; // everything held or cut: nothing to send yet
                            }
                            Frame::data(out)
                        }
                        Err(other) => other,
                    };
                    return Poll::Ready(Some(Ok(frame)));
                }
                Poll::Ready(Some(Err(e))) => {
                    // What the server sent of its last event still reaches the client, as it
                    // would over a direct connection.
                    let tail = this.flush();
                    this.finish(Some(format!("upstream body: {e}")));
                    if let Some(tail) = tail {
                        this.failed.set(e);
                        return Poll::Ready(Some(Ok(Frame::data(tail))));
                    }
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    this.ended = true;
                    if let Some(tail) = this.flush() {
                        return Poll::Ready(Some(Ok(Frame::data(tail))));
                    }
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rec.is_none() && !self.events.holds() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        if self.events.drop_usage {
            SizeHint::default() // the length changes
        } else {
            self.inner.size_hint()
        }
    }
}

impl Drop for Measured {
    fn drop(&mut self) {
        // Dropped before the end: the client went away (dropping `inner` aborts the upstream).
        self.finish(Some(super::CLIENT_LEFT.into()));
    }
}

#[cfg(test)]
mod attack_tests {
    use super::*;

    const TEXT: &str = r#"data: {"id":"a","object":"text_completion","choices":[{"index":0,"text":" hi","logprobs":null,"finish_reason":null}],"usage":null}"#;
    const USAGE: &str = r#"data: {"id":"a","object":"text_completion","choices":[],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2}}"#;

    /// Feed `frames`; returns what the client got and the events seen.
    fn run(api: Api, drop_usage: bool, frames: &[&[u8]]) -> (Vec<u8>, Vec<EventInfo>) {
        let mut s = EventStream::new(api, drop_usage);
        let (mut out, mut ev) = (Vec::new(), Vec::new());
        for f in frames {
            out.extend_from_slice(&s.pass(Bytes::copy_from_slice(f), |e| ev.push(e)));
        }
        if let Some(t) = s.finish(|e| ev.push(e)) {
            out.extend_from_slice(&t);
        }
        (out, ev)
    }

    fn stream(nl: &str) -> (String, String) {
        let all = format!("{TEXT}{nl}{nl}{TEXT}{nl}{nl}{USAGE}{nl}{nl}data: [DONE]{nl}{nl}");
        let client = format!("{TEXT}{nl}{nl}{TEXT}{nl}{nl}data: [DONE]{nl}{nl}");
        (all, client)
    }

    /// What `read` sees of frames (the tap's way, nothing returned).
    fn read_all(api: Api, frames: &[&[u8]]) -> Vec<EventInfo> {
        let mut s = EventStream::new(api, false);
        let mut ev = Vec::new();
        for f in frames {
            s.read(f, |e| ev.push(e));
        }
        let _ = s.finish(|e| ev.push(e));
        ev
    }

    #[test]
    fn read_sees_the_events_pass_sees_however_the_frames_are_cut() {
        let mut big = b"data: {\"text\":\"".to_vec();
        big.extend(std::iter::repeat_n(b'a', MAX_EVENT + 5));
        big.extend_from_slice(b"\",\"meta_info\":{\"completion_tokens\":7}}\n\ndata: [DONE]\n\n");
        for nl in ["\n", "\r\n"] {
            let (all, _) = stream(nl);
            let b = all.as_bytes();
            for at in 0..=b.len() {
                let frames = [&b[..at], &b[at..]];
                let (_, passed) = run(Api::Completions, false, &frames);
                assert_eq!(read_all(Api::Completions, &frames), passed, "split at {at}");
            }
            let bytes: Vec<&[u8]> = b.chunks(1).collect();
            assert_eq!(
                read_all(Api::Completions, &bytes),
                run(Api::Completions, false, &bytes).1
            );
        }
        for size in [1 << 20, 4099, 3] {
            let frames: Vec<&[u8]> = big.chunks(size).collect();
            let (_, passed) = run(Api::Generate, false, &frames);
            assert_eq!(read_all(Api::Generate, &frames), passed, "frames of {size}");
        }
    }

    #[test]
    fn crlf_events_split_at_every_byte_lose_only_the_usage_event() {
        for nl in ["\n", "\r\n"] {
            let (all, client) = stream(nl);
            let frames: Vec<&[u8]> = all.as_bytes().chunks(1).collect();
            let (out, ev) = run(Api::Completions, true, &frames);
            assert_eq!(String::from_utf8(out).unwrap(), client, "nl {nl:?}");
            assert_eq!(ev.iter().filter(|e| e.output).count(), 2);
            assert_eq!(ev.iter().filter(|e| e.usage_only).count(), 1);
            assert_eq!(ev.iter().filter(|e| e.done).count(), 1);
        }
    }

    #[test]
    fn a_usage_event_split_anywhere_across_two_frames_is_cut() {
        for nl in ["\n", "\r\n"] {
            let (all, client) = stream(nl);
            let b = all.as_bytes();
            for at in 0..=b.len() {
                let (out, ev) = run(Api::Completions, true, &[&b[..at], &b[at..]]);
                assert_eq!(String::from_utf8(out).unwrap(), client, "split at {at}");
                assert_eq!(ev.iter().filter(|e| e.usage_only).count(), 1);
                let (same, _) = run(Api::Completions, false, &[&b[..at], &b[at..]]);
                assert_eq!(same, b, "unchanged when not rewritten, split at {at}");
            }
        }
    }

    #[test]
    fn comments_event_lines_and_data_without_space_are_read() {
        let s = concat!(
            ": keepalive\n\n",
            "event: message\nid: 1\ndata:{\"choices\": [{\"index\": 0, \"text\": \"x\"}]}\n\n",
            "data:{\"choices\": [], \"usage\": {\"prompt_tokens\": 3, \"completion_tokens\": 2}}\n\n",
            "data:[DONE]\n\n"
        );
        let (out, ev) = run(Api::Completions, true, &[s.as_bytes()]);
        let want = s.replace(
            "data:{\"choices\": [], \"usage\": {\"prompt_tokens\": 3, \"completion_tokens\": 2}}\n\n",
            "",
        );
        assert_eq!(String::from_utf8(out).unwrap(), want);
        assert_eq!(ev.iter().filter(|e| e.output).count(), 1);
        let u = ev.iter().find(|e| e.usage_only).unwrap();
        assert_eq!((u.prompt_tokens, u.completion_tokens), (Some(3), Some(2)));
        assert!(ev.iter().any(|e| e.done));
    }

    #[test]
    fn an_oversized_event_in_an_unrewritten_stream_is_forwarded_once() {
        // /generate (never rewritten) with one event over MAX_EVENT, arriving in 1 MiB frames.
        let mut all = b"data: {\"text\":\"".to_vec();
        all.extend(std::iter::repeat_n(b'a', MAX_EVENT + (1 << 20)));
        all.extend_from_slice(b"\",\"meta_info\":{\"completion_tokens\":7}}\n\ndata: [DONE]\n\n");
        let frames: Vec<&[u8]> = all.chunks(1 << 20).collect();
        let (out, _) = run(Api::Generate, false, &frames);
        assert_eq!(out.len(), all.len(), "bytes duplicated or lost");
        assert!(out == all);
    }

    #[test]
    fn an_oversized_event_does_not_let_the_usage_event_through() {
        let mut all = b"data: {\"choices\":[{\"index\":0,\"text\":\"".to_vec();
        all.extend(std::iter::repeat_n(b'a', MAX_EVENT + (1 << 20)));
        all.extend_from_slice(b"\"}],\"usage\":null}\n\n");
        let client_len = all.len();
        all.extend_from_slice(USAGE.as_bytes());
        all.extend_from_slice(b"\n\n");
        let mut client = all[..client_len].to_vec();
        client.extend_from_slice(b"data: [DONE]\n\n");
        all.extend_from_slice(b"data: [DONE]\n\n");
        let frames: Vec<&[u8]> = all.chunks(1 << 20).collect();
        let (out, ev) = run(Api::Completions, true, &frames);
        assert_eq!(ev.iter().filter(|e| e.usage_only).count(), 1, "counts read");
        assert_eq!(
            out.len(),
            client.len(),
            "the usage event reached the client"
        );
        assert!(out == client);
    }

    #[test]
    fn the_end_of_an_oversized_event_is_found_however_it_is_cut() {
        for nl in ["\n", "\r\n"] {
            let mut all = b"data: {\"choices\":[{\"index\":0,\"text\":\"".to_vec();
            all.extend(std::iter::repeat_n(b'a', MAX_EVENT + 16));
            all.extend_from_slice(format!("\"}}]}}{nl}{nl}").as_bytes());
            let client_len = all.len();
            all.extend_from_slice(format!("{USAGE}{nl}{nl}{TEXT}{nl}{nl}").as_bytes());
            let mut client = all[..client_len].to_vec();
            client.extend_from_slice(format!("{TEXT}{nl}{nl}").as_bytes());
            let head = MAX_EVENT;
            for at in head + 2..all.len() {
                let frames = [
                    &all[..head],
                    &all[head..head + 2],
                    &all[head + 2..at],
                    &all[at..],
                ];
                let (out, ev) = run(Api::Completions, true, &frames);
                assert!(out == client, "cut at {at}, nl {nl:?}");
                assert_eq!(ev.iter().filter(|e| e.usage_only).count(), 1, "at {at}");
                assert_eq!(ev.iter().filter(|e| e.output).count(), 2, "at {at}");
                let (same, _) = run(Api::Completions, false, &frames);
                assert!(same == all, "unchanged when not rewritten, cut at {at}");
            }
        }
    }

    #[test]
    fn an_error_event_with_spaces_after_colons_is_seen() {
        let e = br#"data: {"object": "error", "message": "x", "code": 400}"#;
        assert!(scan_event(Api::Chat, e).error);
    }
}

#[cfg(test)]
mod cut_tests {
    use super::*;
    use crate::proxy::record::{ProxyMetrics, RequestRecord, Sink, Started};
    use http_body_util::{BodyExt, Full};
    use std::sync::{Arc, Mutex};
    use tokio::io::AsyncWriteExt;

    struct Collect(Mutex<Vec<RequestRecord>>);
    impl Sink for Collect {
        fn finished(&self, r: RequestRecord) {
            self.0.lock().unwrap().push(r);
        }
    }

    #[tokio::test]
    async fn an_upstream_cut_mid_event_still_gives_the_client_what_it_sent() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let whole = "data: {\"choices\":[{\"index\":0,\"text\":\" a\"}],\"usage\":null}\n\n";
        let half = "data: {\"choices\":[{\"index\":0,\"te";
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = tokio::io::AsyncReadExt::read(&mut s, &mut buf).await;
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
            let mut out = head.to_string();
            for c in [whole, half] {
                out.push_str(&format!("{:x}\r\n{c}\r\n", c.len()));
            }
            s.write_all(out.as_bytes()).await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }); // closed without the last chunk
        let upstream = Arc::new(crate::proxy::upstream::Upstream::new(
            addr.to_string(),
            None,
        ));
        let req = hyper::Request::get("/")
            .header("host", addr.to_string())
            .body(http_body_util::Either::Right(Full::new(Bytes::new())))
            .unwrap();
        let (resp, lent) = upstream.send(req).await.unwrap();
        let sink = Arc::new(Collect(Mutex::new(Vec::new())));
        let started = Started {
            endpoint: "/v1/completions",
            api: Api::Completions,
            sent: Instant::now(),
            sent_unix: 0.0,
            in_flight: super::super::spin::Held::enter(),
        };
        let metrics = ProxyMetrics::register(&mut Default::default());
        let rec = Recorder::new(sink.clone(), metrics, started, 200, true);
        let mut body = Measured::new(Driven::new(resp.into_body(), lent), rec, true, true);
        let mut got = Vec::new();
        let mut failed = false;
        while let Some(f) = body.frame().await {
            match f {
                Ok(f) => got.extend_from_slice(&f.into_data().unwrap_or_default()),
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        assert!(failed, "the cut is an error for the client too");
        assert_eq!(String::from_utf8_lossy(&got), format!("{whole}{half}"));
        drop(body);
        let recs = sink.0.lock().unwrap();
        assert_eq!(recs.len(), 1);
        assert!(recs[0].error.is_some());
    }
}
