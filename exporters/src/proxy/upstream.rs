//! The upstream side of one client connection. Each client connection gets its own upstream
//! connection, opened when the client connects, reused for its requests and closed with it, so
//! the server sees the connections it would see from the client directly: the same accepts at
//! the same moments, the same keep-alive, the same close when the client leaves (a shared pool
//! kept connections the client had closed, and skipped the accepts a direct client costs the
//! server; a connection opened at the first request reached the server only after the request was
//! read, and its connect was added to every time to first token). One difference is left on
//! purpose: a client that leaves before its upstream connect is made stops that connect, where a
//! direct client's finished handshake would reach the server's accept queue; a connect outliving
//! its client held a socket until the kernel's SYN timeout when the server was slow to accept.
//!
//! The upstream connection is driven by the task that serves its client connection, not by a
//! task of its own: hyper's client hands a response body over one chunk at a time through a
//! channel, so a connection task of its own meant two task wake-ups and one client write per SSE
//! event. Driven here, the events one read brought are given in turn within one poll of the
//! client connection ([`Driven`]) and leave in one write, as a direct connection or a byte relay
//! gives them.
use super::sweep::{SweepSwitch, UpstreamSocket};
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::{handshake, Connection, SendRequest};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use sglang_probes::sync::lock;
use std::future::{poll_fn, Future};
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::oneshot::error::TryRecvError;

type Driver<B> = Pin<Box<Connection<TokioIo<UpstreamSocket>, B>>>;

/// One upstream connection: the handle requests are sent on and the future that does its I/O.
struct Conn<B: Body + 'static> {
    sender: SendRequest<B>,
    /// `None` once the connection has ended (a finished future is not polled again).
    driver: Option<Driver<B>>,
    /// Read the socket in sweeps (while an answer streams) or as data arrives.
    swept: SweepSwitch,
}

impl<B> Conn<B>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// Do the connection's pending I/O (send the request, read the answer into its body).
    fn drive(&mut self, cx: &mut Context<'_>) {
        if let Some(d) = self.driver.as_mut() {
            if let Poll::Ready(r) = d.as_mut().poll(cx) {
                if let Err(e) = r {
                    tracing::debug!("proxy upstream connection: {e}");
                }
                self.driver = None;
            }
        }
    }

    /// Ready for the next request (the previous answer is fully read), or ended.
    fn ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), hyper::Error>> {
        self.drive(cx);
        self.sender.poll_ready(cx)
    }
}

pub(crate) struct Upstream<B: Body + 'static> {
    /// `host:port` to connect to.
    addr: String,
    /// The address to connect from (`None`: the kernel's choice).
    source: Option<Ipv4Addr>,
    /// The connection of this client connection; lent out while a request is on it (HTTP/1.1
    /// has one request at a time on a connection, and hyper serves a client connection in order).
    conn: Mutex<Option<Slot<B>>>,
}

/// The kept connection: being opened (the client has connected), idle, or still sending the
/// previous request's body (the server answered before reading all of it), driven by a task of
/// its own until it is sent: nothing else polls it, and the client's next request is read only
/// after that body.
enum Slot<B: Body + 'static> {
    Opening(Opening<B>),
    Idle(Conn<B>),
    Finishing(tokio::sync::oneshot::Receiver<Conn<B>>),
}

/// The connection being opened for a client that has just connected. Dropped with the client
/// connection (or with the request waiting on it), it stops the connect: a client that leaves
/// while the server is slow to accept leaves no socket behind, as a direct client that gives up
/// closes its own.
struct Opening<B: Body + 'static> {
    done: tokio::sync::oneshot::Receiver<Result<Conn<B>, String>>,
    task: tokio::task::AbortHandle,
}

impl<B: Body + 'static> Drop for Opening<B> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The upstream connection, lent to one request until its response body has been read to the
/// end; a body dropped before its end closes the connection (the server sees the client leave).
pub(crate) struct Lent<B: Body + 'static> {
    home: Arc<Upstream<B>>,
    conn: Option<Conn<B>>,
    finished: bool,
}

impl<B: Body + 'static> Drop for Lent<B> {
    fn drop(&mut self) {
        if let (true, Some(c)) = (self.finished, self.conn.take()) {
            if c.driver.is_some() {
                *lock(&self.home.conn) = Some(Slot::Idle(c));
            }
        }
    }
}

impl<B> Lent<B>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// The answer was read to its end: a request body the server has not taken whole yet (it
    /// answered first) is sent on by a task, as a direct client goes on sending it.
    fn finish(&mut self, cx: Option<&mut Context<'_>>) {
        self.finished = true;
        // The next answer's head and first event are read as they arrive; driven once more, the
        // socket goes back to the reactor now (hyper's idle read may have left a sweep waiting).
        if let Some(c) = self.conn.as_mut() {
            c.swept.set(false);
            if let Some(cx) = cx {
                c.drive(cx);
            }
        }
        let Some(c) = self
            .conn
            .take_if(|c| c.driver.is_some() && !c.sender.is_ready())
        else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        *lock(&self.home.conn) = Some(Slot::Finishing(rx));
        rt.spawn(async move {
            let mut c = c;
            if poll_fn(|cx| c.ready(cx)).await.is_ok() {
                let _ = tx.send(c);
            }
        });
    }
}

impl<B> Upstream<B>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// `source`: the address its connections come from (`None`: the kernel's choice).
    pub(crate) fn new(addr: String, source: Option<Ipv4Addr>) -> Self {
        Upstream {
            addr,
            source,
            conn: Mutex::new(None),
        }
    }

    /// Start opening the upstream connection now, as the client has just connected: the server
    /// accepts it when a direct client's connection would reach it, and the first request does
    /// not wait for a connect. A connection that fails to open is opened again at the request
    /// (whose answer then says why); one nobody asks for is closed with the client's.
    pub(crate) fn open_early(&self) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (tx, done) = tokio::sync::oneshot::channel();
        let (addr, source) = (self.addr.clone(), self.source);
        let task = rt
            .spawn(async move {
                let _ = tx.send(connect(&addr, source).await);
            })
            .abort_handle();
        *lock(&self.conn) = Some(Slot::Opening(Opening { done, task }));
    }

    /// Send `req` on this client connection's upstream connection, opening it when there is none
    /// or the server closed it. The answer's body comes with the connection that reads it.
    pub(crate) async fn send(
        self: &Arc<Self>,
        req: Request<B>,
    ) -> Result<(Response<Incoming>, Lent<B>), String> {
        let slot = lock(&self.conn).take();
        let kept = match slot {
            // Opened (or failed) before the request came: a failure then is old news (the
            // server may be up now), so the request connects again. Still opening: the request
            // waits for it and takes its outcome, as a direct client's request waits on its
            // connect (connecting again would double the time to a failure).
            Some(Slot::Opening(mut o)) => match o.done.try_recv() {
                Ok(Ok(c)) => Some(c),
                Ok(Err(_)) | Err(TryRecvError::Closed) => None,
                Err(TryRecvError::Empty) => match (&mut o.done).await {
                    Ok(Ok(c)) => Some(c),
                    Ok(Err(e)) => return Err(e),
                    Err(_) => None,
                },
            },
            Some(Slot::Idle(c)) => Some(c),
            // Still sending the last request's body: the next request waits for it, as on a
            // direct connection.
            Some(Slot::Finishing(rx)) => rx.await.ok(),
            None => None,
        };
        let mut conn = match kept {
            Some(mut c) => match poll_fn(|cx| c.ready(cx)).await {
                Ok(()) => c,
                Err(_) => connect(&self.addr, self.source).await?,
            },
            None => connect(&self.addr, self.source).await?,
        };
        let mut answer = std::pin::pin!(conn.sender.send_request(req));
        let resp = poll_fn(|cx| {
            conn.drive(cx);
            answer.as_mut().poll(cx)
        })
        .await
        .map_err(|e| format!("upstream http://{}: {e}", self.addr))?;
        let lent = Lent {
            home: self.clone(),
            conn: Some(conn),
            finished: false,
        };
        Ok((resp, lent))
    }
}

/// Open a connection to the server at `addr` (`host:port`) for one client connection, from
/// `source` where one is given.
async fn connect<B>(addr: &str, source: Option<Ipv4Addr>) -> Result<Conn<B>, String>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let cannot = |e: std::io::Error| format!("upstream http://{addr}: cannot connect: {e}");
    let addrs = sglang_probes::resolve::resolve_addr(addr)
        .await
        .map_err(cannot)?;
    let stream = match source {
        Some(source) => connect_from(source, &addrs).await,
        None => TcpStream::connect(&addrs[..]).await,
    }
    .map_err(cannot)?;
    let _ = stream.set_nodelay(true);
    let (socket, swept) = UpstreamSocket::new(stream);
    let (sender, driver) = handshake(TokioIo::new(socket))
        .await
        .map_err(|e| format!("upstream http://{addr}: {e}"))?;
    Ok(Conn {
        sender,
        driver: Some(Box::pin(driver)),
        swept,
    })
}

/// A connection from `source` to the first of `addrs` that takes it. Never from another source:
/// the supervisor reads any other loopback client in the server's log as one that bypassed the
/// proxy.
async fn connect_from(source: Ipv4Addr, addrs: &[SocketAddr]) -> std::io::Result<TcpStream> {
    let mut last = None;
    for &addr in addrs {
        match bound_to(source)?.connect(addr).await {
            Ok(stream) => return Ok(stream),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("the name resolved to no address")))
}

/// A TCP socket bound to `source`, its port left to the connect where the kernel can (Linux
/// 4.2 on): bound first, a source's ports would run out at the ephemeral range's size, whatever
/// the servers connected to.
pub(crate) fn bound_to(source: Ipv4Addr) -> std::io::Result<TcpSocket> {
    use nix::sys::socket::{setsockopt, sockopt::IpBindAddressNoPort};
    let socket = TcpSocket::new_v4()?;
    let _ = setsockopt(&socket, IpBindAddressNoPort, &true);
    socket.bind(SocketAddr::from((source, 0)))?;
    Ok(socket)
}

/// An answer's body read by the client connection's own task: each poll drives the upstream
/// connection and gives the next chunk it has read. Chunks stay as the server framed them (one
/// client chunk per server chunk, byte for byte on the wire): hyper's server polls the body again
/// while it can buffer, so what one read brought still leaves in one write. Joining them changed
/// what the benchmark client parses (fewer, larger chunks than SGLang sends).
pub(crate) struct Driven<B: Body + 'static> {
    body: Incoming,
    lent: Lent<B>,
    /// The server's connection failed: given after one more poll, in which hyper writes the
    /// chunks it holds for the client.
    failed: Deferred<hyper::Error>,
}

impl<B> Driven<B>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    pub(crate) fn new(body: Incoming, mut lent: Lent<B>) -> Self {
        // An answer without a body (204, 304, HEAD) is read already; hyper may never poll it.
        if body.is_end_stream() {
            lent.finish(None);
        }
        Driven {
            body,
            lent,
            failed: Deferred::default(),
        }
    }
}

impl<B> Body for Driven<B>
where
    B: Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        if let Some(p) = this.failed.poll(cx) {
            return p;
        }
        // The body asks the connection for more only when polled empty: one more round after a
        // first empty poll lets the connection answer that ask from what it has read.
        let mut asked = false;
        loop {
            if let Some(c) = this.lent.conn.as_mut() {
                c.drive(cx);
            }
            match Pin::new(&mut this.body).poll_frame(cx) {
                Poll::Ready(Some(Err(e))) => {
                    this.failed.set(e);
                    return this.failed.poll(cx).unwrap_or(Poll::Pending);
                }
                Poll::Ready(Some(frame)) => {
                    // The first event went out as it came; the rest are read in sweeps
                    // (sweep.rs: the server's writes then wake no one).
                    if let Some(c) = this.lent.conn.as_ref() {
                        c.swept.set(true);
                    }
                    if this.body.is_end_stream() {
                        // Polled again, the body would say so; a body whose length is reached
                        // may not be.
                        if let Some(c) = this.lent.conn.as_mut() {
                            c.drive(cx);
                        }
                        this.lent.finish(Some(cx));
                    }
                    return Poll::Ready(Some(frame));
                }
                Poll::Ready(None) => {
                    this.lent.finish(Some(cx));
                    return Poll::Ready(None);
                }
                Poll::Pending if !asked => asked = true,
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        !self.failed.holds() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// An error that follows data given in the same poll. hyper drops what it has buffered for the
/// client when a body fails, so the error waits one poll, in which the connection writes what it
/// holds: the client gets everything the server sent, as over a direct connection.
pub(crate) struct Deferred<E> {
    error: Option<E>,
    waited: bool,
}

impl<E> Default for Deferred<E> {
    fn default() -> Self {
        Deferred {
            error: None,
            waited: false,
        }
    }
}

impl<E> Deferred<E> {
    pub(crate) fn set(&mut self, e: E) {
        self.error = Some(e);
        self.waited = false;
    }

    pub(crate) fn holds(&self) -> bool {
        self.error.is_some()
    }

    /// `None` when no error waits; else one `Pending` (woken at once), then the error.
    pub(crate) fn poll<T>(&mut self, cx: &mut Context<'_>) -> Option<Poll<Option<Result<T, E>>>> {
        self.error.as_ref()?;
        if !self.waited {
            self.waited = true;
            cx.waker().wake_by_ref();
            return Some(Poll::Pending);
        }
        self.error.take().map(|e| Poll::Ready(Some(Err(e))))
    }
}

#[cfg(test)]
mod tests {
    use super::super::sweep::{counts, on_a_shard};
    use super::*;
    use http_body_util::{BodyExt, Full};
    use std::io::{Read, Write};
    use std::time::Duration;

    /// The body's last frame drives the connection while the switch still says swept, and
    /// hyper's idle keep-alive read then waits for a sweep: at the answer's end the socket must go
    /// back to the reactor, or the shard's timer fires every period while the connection idles.
    #[test]
    fn a_kept_connection_idle_after_a_swept_answer_leaves_nothing_in_the_sweep() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.set_nodelay(true).unwrap();
            let mut b = [0u8; 4096];
            let _ = s.read(&mut b).unwrap();
            s.write_all(
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n",
            )
            .unwrap();
            for i in 2..5 {
                std::thread::sleep(Duration::from_millis(20));
                s.write_all(format!("9\r\ndata: {i}\n\n\r\n").as_bytes())
                    .unwrap();
            }
            std::thread::sleep(Duration::from_millis(20));
            s.write_all(b"0\r\n\r\n").unwrap();
            std::thread::sleep(Duration::from_millis(500));
        });
        on_a_shard(Some(5), async move {
            let up = Arc::new(Upstream::<Full<Bytes>>::new(addr.to_string(), None));
            let req = Request::post("/generate")
                .header("host", "x")
                .body(Full::new(Bytes::from_static(b"{}")))
                .unwrap();
            let (resp, lent) = up.send(req).await.unwrap();
            let mut body = Driven::new(resp.into_body(), lent);
            let mut got = Vec::new();
            while let Some(f) = body.frame().await {
                got.extend_from_slice(f.unwrap().data_ref().unwrap());
            }
            assert_eq!(got.len(), 36);
            drop(body);
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert_eq!(counts(), Some((0, 0)), "(live, pending)");
        });
        server.join().unwrap();
    }

    /// Connections to a server on IPv4 loopback come from the proxy's own source, which the
    /// server's access log then shows; the source is chosen only for such a server.
    #[test]
    fn connections_to_a_server_on_loopback_come_from_the_proxys_own_source() {
        use crate::proxy::{upstream_source, LOOPBACK_SOURCE};
        assert_eq!(
            upstream_source("http://127.0.0.1:30000"),
            Some(LOOPBACK_SOURCE)
        );
        assert_eq!(
            upstream_source("http://127.9.9.9:1/x"),
            Some(LOOPBACK_SOURCE)
        );
        for elsewhere in [
            "http://[::1]:30000",
            "http://localhost:1",
            "http://192.0.2.1:1",
            "x",
        ] {
            assert_eq!(upstream_source(elsewhere), None, "{elsewhere}");
        }
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let peer = l.accept().unwrap().1;
            drop(l);
            peer
        });
        on_a_shard(None, async move {
            let up = Upstream::<Full<Bytes>>::new(addr.to_string(), Some(LOOPBACK_SOURCE));
            up.open_early();
            tokio::time::sleep(Duration::from_millis(100)).await;
        });
        let peer = server.join().unwrap();
        assert_eq!(peer.ip(), std::net::IpAddr::V4(LOOPBACK_SOURCE));
        assert_ne!(peer.port(), 0);
    }

    /// The client connected before the server listened: the early open fails, and the request
    /// opens the connection again instead of failing with it.
    #[test]
    fn an_upstream_that_could_not_be_opened_when_the_client_connected_is_opened_at_its_request() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        on_a_shard(None, async move {
            let up = Arc::new(Upstream::<Full<Bytes>>::new(addr.to_string(), None));
            up.open_early();
            // the refused connect has come back before the server listens
            while matches!(&*lock(&up.conn), Some(Slot::Opening(o)) if o.done.is_empty()) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let l = std::net::TcpListener::bind(addr).unwrap();
            let server = std::thread::spawn(move || answer_ok_once(&l));
            let req = Request::get("/health")
                .header("host", "x")
                .body(Full::new(Bytes::new()))
                .unwrap();
            let (resp, lent) = up.send(req).await.expect("opened at the request");
            let body = Driven::new(resp.into_body(), lent).collect().await.unwrap();
            assert_eq!(&body.to_bytes()[..], b"ok");
            tokio::task::spawn_blocking(move || server.join().unwrap())
                .await
                .unwrap();
        });
    }

    /// Accept one connection, read its request and answer `ok` (kept open a moment after).
    fn answer_ok_once(l: &std::net::TcpListener) {
        let (mut s, _) = l.accept().unwrap();
        let mut b = [0u8; 4096];
        let _ = s.read(&mut b).unwrap();
        s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
    }

    /// A server that closes the first connection it accepts (the early-opened one) after
    /// `close_after` without a request, as a keep-alive timeout would (`rst`: with a reset instead
    /// of a FIN), and answers `ok` on the second.
    fn closes_the_first_connection(
        close_after: Duration,
        rst: bool,
    ) -> (std::net::SocketAddr, std::thread::JoinHandle<()>) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (first, _) = l.accept().unwrap();
            std::thread::sleep(close_after);
            if rst {
                let zero = nix::libc::linger {
                    l_onoff: 1,
                    l_linger: 0,
                };
                // SAFETY: a valid socket and a linger struct of the size given
                let r = unsafe {
                    nix::libc::setsockopt(
                        std::os::fd::AsRawFd::as_raw_fd(&first),
                        nix::libc::SOL_SOCKET,
                        nix::libc::SO_LINGER,
                        (&zero as *const nix::libc::linger).cast(),
                        std::mem::size_of::<nix::libc::linger>() as nix::libc::socklen_t,
                    )
                };
                assert_eq!(r, 0);
            }
            drop(first);
            answer_ok_once(&l);
        });
        (addr, server)
    }

    fn early_connection_closed_then_a_request(sweep_ms: Option<u64>, rst: bool) {
        let (addr, server) = closes_the_first_connection(Duration::from_millis(100), rst);
        on_a_shard(sweep_ms, async move {
            let up = Arc::new(Upstream::<Full<Bytes>>::new(addr.to_string(), None));
            up.open_early();
            tokio::time::sleep(Duration::from_millis(400)).await;
            let req = Request::post("/generate")
                .header("host", "x")
                .body(Full::new(Bytes::from_static(b"{}")))
                .unwrap();
            let (resp, lent) = up
                .send(req)
                .await
                .expect("opened again: the server closed the idle early connection");
            let body = Driven::new(resp.into_body(), lent).collect().await.unwrap();
            assert_eq!(&body.to_bytes()[..], b"ok");
        });
        server.join().unwrap();
    }

    /// The server closes the early-opened connection before the client's first request (a
    /// keep-alive timeout): the request opens another, it does not fail.
    #[test]
    fn an_early_connection_the_server_closed_before_the_first_request_is_opened_again() {
        early_connection_closed_then_a_request(None, false);
    }

    #[test]
    fn an_early_connection_the_server_reset_before_the_first_request_is_opened_again() {
        early_connection_closed_then_a_request(None, true);
    }

    #[test]
    fn an_early_connection_closed_before_the_first_request_is_opened_again_in_sweeps() {
        early_connection_closed_then_a_request(Some(1), false);
    }

    /// A request that comes while the early connect is still under way, to a server whose listen
    /// queue is full (it never accepts): it fails after one connect timeout, as a direct client's
    /// connect does, not after a second connect of its own (twice the ~127 s a direct client
    /// waits at the kernel's default). The timeout is made short (one SYN retry, 3 s) in a network
    /// namespace of its own: the test runs itself again under `unshare -n` as root.
    #[test]
    #[allow(clippy::disallowed_methods)] // the test itself again, in a namespace: not a server
    fn a_request_waiting_on_an_early_connect_that_fails_fails_after_one_connect_timeout() {
        const NAME: &str =
            "proxy::upstream::tests::a_request_waiting_on_an_early_connect_that_fails_fails_after_one_connect_timeout";
        if std::env::var_os("SYN_RETRIES_ONE").is_none() {
            let exe = std::env::current_exe().unwrap();
            let script = "ip link set lo up && echo 1 > /proc/sys/net/ipv4/tcp_syn_retries && exec \"$0\" --exact \"$1\" --nocapture";
            let out = std::process::Command::new("unshare")
                .args(["-n", "sh", "-c", script])
                .arg(&exe)
                .arg(NAME)
                .env("SYN_RETRIES_ONE", "1")
                .output()
                .expect("unshare (util-linux) and ip (iproute2), as scripts/setup.sh installs");
            let text = String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success() && text.contains("1 passed"), "{text}");
            return;
        }
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        // listen() again with a backlog of 0: one connection fills it, later SYNs are dropped
        // SAFETY: listen(2) on a socket this test owns
        let r = unsafe { nix::libc::listen(std::os::fd::AsRawFd::as_raw_fd(&l), 0) };
        assert_eq!(r, 0);
        let addr = l.local_addr().unwrap();
        let _filler = std::net::TcpStream::connect(addr).unwrap();
        let direct = std::thread::spawn(move || {
            let t = std::time::Instant::now();
            (std::net::TcpStream::connect(addr).is_err(), t.elapsed())
        });
        let (proxied, took) = on_a_shard(None, async move {
            let up = Arc::new(Upstream::<Full<Bytes>>::new(addr.to_string(), None));
            let t = std::time::Instant::now();
            up.open_early();
            // the client's request right after it connected
            tokio::time::sleep(Duration::from_millis(20)).await;
            let req = Request::get("/health")
                .header("host", "x")
                .body(Full::new(Bytes::new()))
                .unwrap();
            (up.send(req).await.err(), t.elapsed())
        });
        let (direct_failed, direct_took) = direct.join().unwrap();
        assert!(direct_failed, "the direct connect to a full queue fails");
        assert!(proxied.is_some(), "the proxied request fails too");
        assert!(
            took < direct_took + Duration::from_secs(1),
            "the proxied request failed after {took:?}, a direct connect after {direct_took:?}"
        );
    }
}
