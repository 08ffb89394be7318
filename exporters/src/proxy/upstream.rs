//! The upstream side of one client connection. Each client connection gets its own upstream
//! connection, opened at its first request, reused for its next ones and closed with it, so the
//! server sees exactly the connections it would see from the client directly: the same accepts,
//! the same keep-alive, the same close when the client leaves (a shared pool kept connections
//! the client had closed, and skipped the accepts a direct client costs the server).
use hyper::body::Incoming;
use hyper::client::conn::http1::{handshake, SendRequest};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use sglang_probes::sync::lock;
use std::sync::Mutex;

pub(crate) struct Upstream<B> {
    /// `host:port` to connect to.
    addr: String,
    /// The connection of this client connection; taken while a request is on it (HTTP/1.1 has
    /// one request at a time on a connection, and hyper serves a client connection in order).
    conn: Mutex<Option<SendRequest<B>>>,
}

impl<B> Upstream<B>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    pub(crate) fn new(addr: String) -> Self {
        Upstream {
            addr,
            conn: Mutex::new(None),
        }
    }

    /// Send `req` on this client connection's upstream connection, opening it when there is none
    /// or the server closed it.
    pub(crate) async fn send(&self, req: Request<B>) -> Result<Response<Incoming>, String> {
        let kept = lock(&self.conn).take();
        let mut sender = match kept {
            Some(mut s) => match s.ready().await {
                Ok(()) => s,
                Err(_) => self.connect().await?,
            },
            None => self.connect().await?,
        };
        let resp = sender.send_request(req).await;
        // The next request of this client connection waits in `ready` until this response ends.
        *lock(&self.conn) = Some(sender);
        resp.map_err(|e| format!("upstream http://{}: {e}", self.addr))
    }

    async fn connect(&self) -> Result<SendRequest<B>, String> {
        let stream = tokio::net::TcpStream::connect(&self.addr)
            .await
            .map_err(|e| format!("upstream http://{}: cannot connect: {e}", self.addr))?;
        let _ = stream.set_nodelay(true);
        let (sender, conn) = handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("upstream http://{}: {e}", self.addr))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("proxy upstream connection: {e}");
            }
        });
        Ok(sender)
    }
}
