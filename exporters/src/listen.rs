//! The accept loop of our two listeners (metrics, proxy). A flood of connections must not starve
//! the supervisor: an accept error (EMFILE at the open-file limit) waits instead of spinning, at
//! most `max_connections` are served at once, and a client that sends no request head within
//! `header_timeout` (a fresh connection that stays silent, or a kept-alive one idle between
//! requests) is closed.
use hyper::server::conn::http1;
use hyper_util::rt::TokioTimer;
use sglang_probes::sync::lock;
use std::collections::VecDeque;
use std::future::Future;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

/// How long an accept error (no file descriptor left) waits before the next accept.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    /// At the cap, close the oldest connection to make room (metrics: scrapes are short, so the
    /// oldest is an idle one, and a scrape must not queue behind a flood) instead of leaving the
    /// newcomer in the backlog (the proxy: its oldest may be a stream being measured).
    pub evict_oldest: bool,
}

impl Limits {
    /// hyper's HTTP/1 server with the header (and so idle) timeout.
    pub fn http1(&self) -> http1::Builder {
        let mut b = http1::Builder::new();
        b.timer(TokioTimer::new())
            .header_read_timeout(self.header_timeout);
        b
    }
}

/// Connections that may be evicted, oldest first.
type Open = Arc<Mutex<VecDeque<(u64, oneshot::Sender<()>)>>>;

/// Accept on `listener` in the background and run `serve` on each connection, within `limits`.
pub fn spawn_accept_loop<F, Fut>(
    listener: TcpListener,
    limits: Limits,
    what: &'static str,
    serve: F,
) where
    F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    spawn_accept_loop_sharing(
        listener,
        limits,
        connection_permits(&limits),
        None,
        what,
        serve,
    );
}

/// The connection cap of `limits`, to share between the accept loops of one address's listeners.
pub fn connection_permits(limits: &Limits) -> Arc<Semaphore> {
    Arc::new(Semaphore::new(limits.max_connections.max(1)))
}

/// Where an accept loop takes its connections from.
pub trait Acceptor: Send + Sync + 'static {
    fn accept(&self) -> impl Future<Output = std::io::Result<TcpStream>> + Send;
}

impl Acceptor for TcpListener {
    async fn accept(&self) -> std::io::Result<TcpStream> {
        TcpListener::accept(self).await.map(|(s, _)| s)
    }
}

/// One listening socket accepted from by several threads, each from its own runtime: every
/// thread waits on the same accept queue (the kernel wakes them all for a connection, and the
/// first to accept takes it), so a connection never waits behind a thread that cannot take it,
/// and no other socket shares the address. The socket is closed when the last thread drops it.
pub struct SharedListener(AsyncFd<Shared>);

struct Shared(Arc<std::net::TcpListener>);

impl AsRawFd for Shared {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl SharedListener {
    /// Wait for connections on `listener` (non-blocking) from the current thread's runtime.
    pub fn new(listener: Arc<std::net::TcpListener>) -> std::io::Result<Self> {
        // SAFETY: the Arc keeps the listener, and so its descriptor, open and the same for as
        // long as the AsyncFd holds it.
        unsafe { AsyncFd::register_with_interest(Shared(listener), Interest::READABLE) }
            .map(SharedListener)
            .map_err(|e| e.into_parts().1)
    }
}

impl Acceptor for SharedListener {
    async fn accept(&self) -> std::io::Result<TcpStream> {
        loop {
            let mut ready = self.0.readable().await?;
            // Another thread may have taken the connection: then wait for the next one.
            if let Ok(accepted) = ready.try_io(|l| l.get_ref().0.accept()) {
                let (stream, _) = accepted?;
                stream.set_nonblocking(true)?;
                return TcpStream::from_std(stream);
            }
        }
    }
}

/// Threads accepting from one listener keep about the same number of connections each: the
/// kernel wakes them all for a connection and the first to run takes it, which on a busy host let
/// one of four threads take 699 of a burst of 1 024 (a hostile review, 2 cores). A thread holding
/// more than its share (the mean, plus `SPREAD_SLACK`) lets the others take the next connections,
/// for at most `SPREAD_WAIT` before it takes one anyway (the others may be busy or gone).
pub struct Spread {
    open: Arc<[AtomicUsize]>,
    me: usize,
}

const SPREAD_SLACK: usize = 8;
const SPREAD_WAIT: Duration = Duration::from_millis(4);

/// A connection counted in its thread's share while it is open.
pub struct Held(Arc<[AtomicUsize]>, usize);

impl Drop for Held {
    fn drop(&mut self) {
        self.0[self.1].fetch_sub(1, Ordering::Relaxed);
    }
}

impl Spread {
    /// One `Spread` per thread of a group of `n`.
    pub fn group(n: usize) -> Vec<Spread> {
        let open: Arc<[AtomicUsize]> = (0..n.max(1)).map(|_| AtomicUsize::new(0)).collect();
        (0..n.max(1))
            .map(|me| Spread {
                open: open.clone(),
                me,
            })
            .collect()
    }

    fn ahead(&self) -> bool {
        let mine = self.open[self.me].load(Ordering::Relaxed);
        let total: usize = self.open.iter().map(|c| c.load(Ordering::Relaxed)).sum();
        mine * self.open.len() > total + SPREAD_SLACK * self.open.len()
    }

    async fn wait_turn(&self) {
        let end = tokio::time::Instant::now() + SPREAD_WAIT;
        while self.ahead() && tokio::time::Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    fn hold(&self) -> Held {
        self.open[self.me].fetch_add(1, Ordering::Relaxed);
        Held(self.open.clone(), self.me)
    }
}

/// [`spawn_accept_loop`] on the current runtime (a proxy thread's own) from any [`Acceptor`],
/// its connections counted in `permits` with those of the other threads accepting from it.
pub fn spawn_accept_loop_sharing<A, F, Fut>(
    listener: A,
    limits: Limits,
    permits: Arc<Semaphore>,
    spread: Option<Spread>,
    what: &'static str,
    serve: F,
) where
    A: Acceptor,
    F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        let open: Open = Arc::default();
        let mut next_id = 0u64;
        let mut failing = false;
        loop {
            if let Some(spread) = &spread {
                spread.wait_turn().await;
            }
            // Without eviction, wait for room before accepting: the rest wait in the backlog.
            let early = if limits.evict_oldest {
                None
            } else {
                match permits.clone().acquire_owned().await {
                    Ok(p) => Some(p),
                    Err(_) => return,
                }
            };
            let stream = match listener.accept().await {
                Ok(s) => {
                    failing = false;
                    s
                }
                Err(e) => {
                    if !std::mem::replace(&mut failing, true) {
                        tracing::warn!("{what}: cannot accept a connection ({e}); retrying every {ACCEPT_BACKOFF:?}");
                    }
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            let permit = match early {
                Some(p) => p,
                None => match room(&permits, &open).await {
                    Some(p) => p,
                    None => return,
                },
            };
            next_id += 1;
            let id = next_id;
            let evicted = limits.evict_oldest.then(|| {
                let (tx, rx) = oneshot::channel();
                lock(&open).push_back((id, tx));
                rx
            });
            let held = spread.as_ref().map(Spread::hold);
            let conn = serve(stream);
            let open = open.clone();
            tokio::spawn(async move {
                match evicted {
                    Some(rx) => {
                        tokio::select! {
                            () = conn => {}
                            _ = rx => tracing::debug!("{what}: closed the oldest connection to make room"),
                        }
                        lock(&open).retain(|(i, _)| *i != id);
                    }
                    None => conn.await,
                }
                drop::<OwnedSemaphorePermit>(permit);
                drop(held);
            });
            // A proxy thread serves the connection it took (reads its request) before it takes
            // another; the other threads take the rest of a burst meanwhile.
            tokio::task::yield_now().await;
        }
    });
}

/// A permit, evicting the oldest connection when there is none.
async fn room(permits: &Arc<Semaphore>, open: &Open) -> Option<OwnedSemaphorePermit> {
    if let Ok(p) = permits.clone().try_acquire_owned() {
        return Some(p);
    }
    if let Some((_, tx)) = lock(open).pop_front() {
        let _ = tx.send(());
    }
    permits.clone().acquire_owned().await.ok()
}

/// Connections the proxy may hold: each takes two descriptors (client and upstream), and the
/// supervisor keeps some for itself (logs, /proc, GPU libraries).
pub fn proxy_connection_cap() -> usize {
    let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(1024, |(soft, _)| soft);
    let cap = soft.saturating_sub(256) / 2;
    usize::try_from(cap).unwrap_or(usize::MAX).clamp(32, 65536)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn threads_sharing_one_listener_take_each_connection_once_and_all_of_them() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let listener = Arc::new(listener);
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..3 {
            let (listener, tx) = (listener.clone(), tx.clone());
            on_a_thread_of_its_own(async move {
                let shared = SharedListener::new(listener).unwrap();
                while let Ok(s) = shared.accept().await {
                    if tx.send(s.peer_addr().unwrap()).is_err() {
                        return;
                    }
                }
            });
        }
        let clients: Vec<_> = (0..60)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        let mine: HashSet<_> = clients.iter().map(|c| c.local_addr().unwrap()).collect();
        let mut taken = Vec::new();
        while taken.len() < clients.len() {
            taken.push(rx.recv_timeout(Duration::from_secs(10)).unwrap());
        }
        assert_eq!(taken.iter().copied().collect::<HashSet<_>>(), mine);
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "a connection taken twice"
        );
    }

    /// Run `f` on a new thread's own single-threaded runtime, as a proxy thread runs.
    fn on_a_thread_of_its_own(f: impl Future<Output = ()> + Send + 'static) {
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(f)
        });
    }

    /// `n` threads sharing one listener as the proxy's do; each connection says which thread
    /// took it, gets one byte and stays open for `hold`.
    fn threads_on_one_listener(
        n: usize,
        cap: usize,
        hold: Duration,
    ) -> (std::net::SocketAddr, std::sync::mpsc::Receiver<usize>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let listener = Arc::new(listener);
        let limits = Limits {
            max_connections: cap,
            header_timeout: Duration::from_secs(60),
            evict_oldest: false,
        };
        let permits = connection_permits(&limits);
        let (tx, rx) = std::sync::mpsc::channel();
        for (i, spread) in Spread::group(n).into_iter().enumerate() {
            let (listener, permits, tx) = (listener.clone(), permits.clone(), tx.clone());
            on_a_thread_of_its_own(async move {
                let shared = SharedListener::new(listener).unwrap();
                spawn_accept_loop_sharing(
                    shared,
                    limits,
                    permits,
                    Some(spread),
                    "t",
                    move |mut s| {
                        let tx = tx.clone();
                        async move {
                            use tokio::io::AsyncWriteExt;
                            let _ = tx.send(i);
                            let _ = s.write_all(b"x").await;
                            tokio::time::sleep(hold).await;
                        }
                    },
                );
                std::future::pending::<()>().await
            });
        }
        (addr, rx)
    }

    #[test]
    fn a_burst_of_connections_spreads_over_the_threads_sharing_the_listener() {
        let (addr, rx) = threads_on_one_listener(4, 4096, Duration::from_secs(30));
        let clients: Vec<_> = (0..1024)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        let mut by_thread = [0usize; 4];
        for _ in 0..clients.len() {
            by_thread[rx.recv_timeout(Duration::from_secs(10)).unwrap()] += 1;
        }
        // A fair share is 256; without the spread one thread took 699 (two busy cores).
        let most = *by_thread.iter().max().unwrap();
        assert!(most <= 256 + 128, "{by_thread:?}");
    }

    #[test]
    fn under_a_small_cap_shared_by_many_threads_every_connection_is_served_at_once() {
        let (addr, _rx) = threads_on_one_listener(8, 4, Duration::ZERO);
        let clients: Vec<_> = (0..16)
            .map(|_| {
                std::thread::spawn(move || {
                    let mut worst = Duration::ZERO;
                    for _ in 0..100 {
                        let t = std::time::Instant::now();
                        let mut s = std::net::TcpStream::connect(addr).unwrap();
                        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                        let mut b = [0u8; 1];
                        std::io::Read::read_exact(&mut s, &mut b).unwrap();
                        worst = worst.max(t.elapsed());
                    }
                    worst
                })
            })
            .collect();
        let worst = clients
            .into_iter()
            .map(|c| c.join().unwrap())
            .max()
            .unwrap();
        assert!(worst < Duration::from_secs(1), "worst wait {worst:?}");
    }
}
