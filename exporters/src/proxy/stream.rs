//! The upstream body on its way to the client, measured as it passes. Frames are forwarded as
//! they arrive and without copying; events are found with a byte scan. When the proxy asked the
//! server for usage on the client's behalf, the one usage-only event is cut out so the client
//! receives exactly the bytes a direct connection gives.
use super::record::Recorder;
use super::sse::{event_end, scan_event, Api, EventInfo};
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

/// Largest incomplete SSE event held: past it the event is forwarded unread.
const MAX_EVENT: usize = 4 << 20;

pub struct Measured {
    inner: Incoming,
    rec: Option<Recorder>,
    stream: bool,
    events: EventStream,
    /// The upstream ended while bytes were held: they go out, then the end.
    ended: bool,
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
}

impl EventStream {
    pub fn new(api: Api, drop_usage: bool) -> Self {
        EventStream {
            api,
            drop_usage,
            carry: Vec::new(),
            scanned: 0,
        }
    }

    /// Read a frame's events; returns what the client gets of it (the same bytes, without
    /// copying, unless an event is cut out or held back).
    pub fn pass(&mut self, data: Bytes, mut on_event: impl FnMut(EventInfo)) -> Bytes {
        if self.carry.is_empty() {
            // The common case: the frame holds whole events.
            let mut pos = 0;
            let mut cut = None;
            while let Some((end, next)) = event_end(&data[pos..]) {
                let info = scan_event(self.api, &data[pos..pos + end]);
                on_event(info);
                if self.drop_usage && info.usage_only {
                    cut = Some((pos, pos + next));
                }
                pos += next;
            }
            if pos < data.len() {
                self.carry.extend_from_slice(&data[pos..]);
                self.scanned = 0;
            }
            if !self.drop_usage {
                return data;
            }
            return match cut {
                None => data.slice(..pos),
                Some((a, b)) => join(&data[..a], &data[b..pos]),
            };
        }
        // An event spans frames: read it from the carried bytes.
        self.carry.extend_from_slice(&data);
        let (mut pos, mut from) = (0, self.scanned);
        let mut out = Vec::new();
        while let Some((end, next)) = event_end(&self.carry[from..]) {
            let (end, next) = (from + end, from + next);
            let info = scan_event(self.api, &self.carry[pos..end]);
            on_event(info);
            if !(self.drop_usage && info.usage_only) {
                out.extend_from_slice(&self.carry[pos..next]);
            }
            (pos, from) = (next, next);
        }
        self.carry.drain(..pos);
        // The blank line may straddle the next frame: rescan the last two bytes.
        self.scanned = self.carry.len().saturating_sub(2);
        if self.carry.len() > MAX_EVENT {
            tracing::warn!("proxy: an SSE event over {MAX_EVENT} bytes is forwarded unread");
            self.drop_usage = false;
            out.append(&mut self.carry);
            self.scanned = 0;
            return Bytes::from(out);
        }
        if self.drop_usage {
            Bytes::from(out)
        } else {
            data
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
    pub fn new(inner: Incoming, rec: Recorder, stream: bool, drop_usage: bool) -> Self {
        let events = EventStream::new(rec.api(), drop_usage && stream);
        Measured {
            inner,
            rec: Some(rec),
            stream,
            events,
            ended: false,
        }
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
                    this.finish(Some(format!("upstream body: {e}")));
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
        self.finish(Some("client disconnected".into()));
    }
}
