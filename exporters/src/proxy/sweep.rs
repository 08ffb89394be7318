//! Streaming answers are read in sweeps, not as each event arrives.
//!
//! A reader blocked on a socket makes every write to it wake the reader up, and the writer pays
//! for that wake-up in its `write`. SGLang writes its events from one Python thread that is the
//! bottleneck of a fast server, so a proxy that waits on each upstream socket made that thread
//! slower: on the H200 host the server's HTTP process spent 13–20 µs more CPU per output token
//! through the proxy, and its throughput was exactly one core over that cost
//! (`docs/real-gpu.md`, seventh session). `benches/wake_cost.c` measures a writer's kernel time
//! per write there: 6.3–7.0 µs to a reader blocked in `read`, 1.5–2.2 µs to one that reads every
//! millisecond. A busy benchmark client does not wait on its sockets and costs the server less.
//!
//! With sweeps on ([`period()`]), once an answer streams (after its first event: the time to
//! first token is not delayed), its upstream socket leaves the shard's reactor for a second epoll
//! set that nobody waits on: the server's writes to it wake no one. Every period the shard sweeps
//! that set once (one `epoll_wait` with no timeout, on a timer of its own) and wakes the answers
//! that have data; each reads all that came in one `read`. Each later event waits at most one
//! period.
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use std::cell::RefCell;
use std::future::poll_fn;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

/// How often streaming answers are read, from `SGLANG_SUPERVISOR_PROXY_SWEEP_US` (microseconds,
/// at most a second). Off by default: on the H200 the sweeps did not bring a real server's
/// throughput through the proxy to its direct figure, and on the replay benchmark they added up
/// to a period to every later event (`docs/real-gpu.md`, seventh session).
pub(crate) fn period() -> Option<Duration> {
    let us = std::env::var("SGLANG_SUPERVISOR_PROXY_SWEEP_US")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    (us > 0).then(|| Duration::from_micros(us.min(1_000_000)))
}

/// One shard's set of swept sockets and the answers waiting on them.
struct Sweeper {
    /// Tells a socket's registration apart from another shard's.
    id: u64,
    epoll: Epoll,
    /// By token: the answer to wake when its socket has data (`None`: not waiting).
    waiting: Vec<Option<Waker>>,
    free: Vec<usize>,
    /// Sockets in the set.
    live: usize,
    /// Answers waiting for a sweep: the timer runs only while there are some (a kept-alive
    /// connection that no one reads stays in the set without costing a wake-up per period).
    pending: usize,
    /// The sweep loop, parked while no answer waits.
    idle: Option<Waker>,
}

static SWEEPER_IDS: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static SWEEPER: RefCell<Option<Sweeper>> = const { RefCell::new(None) };
}

fn with_sweeper<T>(f: impl FnOnce(&mut Sweeper) -> T) -> Option<T> {
    SWEEPER.with(|s| s.borrow_mut().as_mut().map(f))
}

/// Sweep this thread's swept sockets every `period`, forever: run by each shard beside its
/// connections. Without an epoll set or a timer (refused by the OS), nothing is swept and
/// answers are read as their events arrive.
pub(crate) async fn run(period: Duration) {
    let Ok(epoll) = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC) else {
        return std::future::pending().await;
    };
    let flags = TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC;
    let Ok(timer) = TimerFd::new(ClockId::CLOCK_MONOTONIC, flags) else {
        return std::future::pending().await;
    };
    // SAFETY: `Tick` owns the timer's descriptor and gives the same one until it is dropped.
    let Ok(timer) = (unsafe { AsyncFd::register_with_interest(Tick(timer), Interest::READABLE) })
    else {
        return std::future::pending().await;
    };
    SWEEPER.with(|s| {
        *s.borrow_mut() = Some(Sweeper {
            id: SWEEPER_IDS.fetch_add(1, Ordering::Relaxed),
            epoll,
            waiting: Vec::new(),
            free: Vec::new(),
            live: 0,
            pending: 0,
            idle: None,
        })
    });
    let mut events = vec![EpollEvent::empty(); 256];
    let tick = TimeSpec::from_duration(period);
    loop {
        // Until an answer waits, no timer runs: an idle proxy never wakes.
        poll_fn(|cx| {
            with_sweeper(|s| {
                if s.pending > 0 {
                    Poll::Ready(())
                } else {
                    s.idle = Some(cx.waker().clone());
                    Poll::Pending
                }
            })
            .unwrap_or(Poll::Pending)
        })
        .await;
        if timer
            .get_ref()
            .0
            .set(Expiration::Interval(tick), TimerSetTimeFlags::empty())
            .is_err()
        {
            return std::future::pending().await;
        }
        while with_sweeper(|s| s.pending).unwrap_or(0) > 0 {
            let Ok(mut ready) = timer.readable().await else {
                return std::future::pending().await;
            };
            // Read the expirations (however many passed: one sweep does for all of them).
            let _ = ready.try_io(|t| t.get_ref().0.wait().map_err(io::Error::from));
            sweep(&mut events);
        }
        let _ = timer.get_ref().0.unset();
    }
}

/// The sweep's timer, as the reactor needs it.
struct Tick(TimerFd);

impl AsRawFd for Tick {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// Wake every answer whose socket has data, ended or failed.
fn sweep(events: &mut [EpollEvent]) {
    with_sweeper(|s| loop {
        let n = s.epoll.wait(events, EpollTimeout::ZERO).unwrap_or(0);
        for e in &events[..n] {
            if let Some(w) = s.waiting.get_mut(e.data() as usize).and_then(Option::take) {
                s.pending -= 1;
                w.wake();
            }
        }
        // A full batch may have left ready sockets behind; level-triggered, they show again.
        if n < events.len() {
            break;
        }
    });
}

/// An upstream socket: in the shard's reactor (every event read as it arrives), or swept.
/// [`SweepSwitch`] says which the answer wants; the switch happens at the next read.
pub(crate) struct UpstreamSocket {
    io: Io,
    want_swept: Arc<AtomicBool>,
}

enum Io {
    Reactor(TcpStream),
    Swept {
        std: std::net::TcpStream,
        sweeper: u64,
        token: usize,
    },
    /// Only while switching (or after a switch failed and the socket was lost with it).
    Gone,
}

/// Asks an [`UpstreamSocket`] to be swept from its next read on, or to go back to its reactor.
#[derive(Clone)]
pub(crate) struct SweepSwitch(Arc<AtomicBool>);

impl SweepSwitch {
    pub(crate) fn set(&self, swept: bool) {
        self.0.store(swept, Ordering::Relaxed);
    }
}

impl UpstreamSocket {
    pub(crate) fn new(stream: TcpStream) -> (Self, SweepSwitch) {
        let want_swept = Arc::new(AtomicBool::new(false));
        let switch = SweepSwitch(want_swept.clone());
        (
            UpstreamSocket {
                io: Io::Reactor(stream),
                want_swept,
            },
            switch,
        )
    }

    /// Take the socket out of the reactor into this thread's swept set, or back. A socket that
    /// cannot be swept (no sweeper on this thread, the OS refused) stays in the reactor.
    fn switch(&mut self, swept: bool) -> io::Result<()> {
        let change = match self.io {
            Io::Reactor(_) => swept && with_sweeper(|_| ()).is_some(),
            Io::Swept { .. } => !swept,
            Io::Gone => false,
        };
        if !change {
            return Ok(());
        }
        self.io = match std::mem::replace(&mut self.io, Io::Gone) {
            Io::Reactor(stream) => {
                let std = stream.into_std()?;
                match with_sweeper(|s| s.add(&std)) {
                    Some(Ok((sweeper, token))) => Io::Swept {
                        std,
                        sweeper,
                        token,
                    },
                    _ => Io::Reactor(TcpStream::from_std(std)?),
                }
            }
            Io::Swept {
                std,
                sweeper,
                token,
            } => {
                with_sweeper(|s| s.remove(sweeper, token, &std));
                Io::Reactor(TcpStream::from_std(std)?)
            }
            Io::Gone => Io::Gone,
        };
        Ok(())
    }

    fn reactor(&mut self) -> io::Result<&mut TcpStream> {
        self.switch(false)?;
        match &mut self.io {
            Io::Reactor(s) => Ok(s),
            _ => Err(gone()),
        }
    }
}

fn gone() -> io::Error {
    io::Error::new(
        io::ErrorKind::NotConnected,
        "upstream socket lost in a switch",
    )
}

impl Sweeper {
    fn add(&mut self, std: &std::net::TcpStream) -> io::Result<(u64, usize)> {
        let token = self.free.pop().unwrap_or_else(|| {
            self.waiting.push(None);
            self.waiting.len() - 1
        });
        let flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP;
        if let Err(e) = self.epoll.add(std, EpollEvent::new(flags, token as u64)) {
            self.free.push(token);
            return Err(e.into());
        }
        self.live += 1;
        Ok((self.id, token))
    }

    /// An answer waits for the next sweep (the loop starts its timer if it was idle).
    fn wait(&mut self, sweeper: u64, token: usize, waker: Waker) {
        if sweeper != self.id {
            return;
        }
        if let Some(w) = self.waiting.get_mut(token) {
            if w.replace(waker).is_none() {
                self.pending += 1;
                if let Some(idle) = self.idle.take() {
                    idle.wake();
                }
            }
        }
    }

    fn remove(&mut self, sweeper: u64, token: usize, std: &std::net::TcpStream) {
        if sweeper != self.id {
            return;
        }
        let _ = self.epoll.delete(std);
        if let Some(w) = self.waiting.get_mut(token) {
            if w.take().is_some() {
                self.pending -= 1;
            }
            self.free.push(token);
            self.live -= 1;
        }
    }
}

impl Drop for UpstreamSocket {
    fn drop(&mut self) {
        if let Io::Swept {
            std,
            sweeper,
            token,
        } = &self.io
        {
            with_sweeper(|s| s.remove(*sweeper, *token, std));
        }
    }
}

impl AsyncRead for UpstreamSocket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let swept = this.want_swept.load(Ordering::Relaxed);
        if let Err(e) = this.switch(swept) {
            return Poll::Ready(Err(e));
        }
        match &mut this.io {
            Io::Reactor(s) => Pin::new(s).poll_read(cx, buf),
            Io::Swept {
                std,
                sweeper,
                token,
            } => loop {
                match std.read(buf.initialize_unfilled()) {
                    Ok(n) => {
                        buf.advance(n);
                        return Poll::Ready(Ok(()));
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        let (sweeper, token) = (*sweeper, *token);
                        let waker = cx.waker().clone();
                        with_sweeper(|s| s.wait(sweeper, token, waker));
                        return Poll::Pending;
                    }
                    Err(e) => return Poll::Ready(Err(e)),
                }
            },
            Io::Gone => Poll::Ready(Err(gone())),
        }
    }
}

/// Writes (a request, the rest of its body) go through the reactor: a swept socket goes back.
impl AsyncWrite for UpstreamSocket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut().reactor() {
            Ok(s) => Pin::new(s).poll_write(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut().reactor() {
            Ok(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// Nothing is buffered here; hyper flushes at every turn, so this must not switch.
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Reactor(s) => Pin::new(s).poll_flush(cx),
            Io::Swept { std, .. } => Poll::Ready(std.flush()),
            Io::Gone => Poll::Ready(Err(gone())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut().reactor() {
            Ok(s) => Pin::new(s).poll_shutdown(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;
    use tokio::io::AsyncReadExt;

    /// A connected pair on loopback: the writer's std socket and the reader's tokio one.
    async fn pair() -> (std::net::TcpStream, TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let reader = TcpStream::connect(addr).await.unwrap();
        let (writer, _) = l.accept().unwrap();
        writer.set_nodelay(true).unwrap();
        (writer, reader)
    }

    /// Five events 2 ms apart, then how the reader got them: bytes per read and the time from
    /// the last write to the last read.
    async fn five_events(swept: bool) -> (Vec<usize>, Duration) {
        let (mut writer, reader) = pair().await;
        let (mut socket, switch) = UpstreamSocket::new(reader);
        switch.set(swept);
        let last_write = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            for _ in 0..5 {
                writer.write_all(b"data: {}\n\n").unwrap();
                std::thread::sleep(Duration::from_millis(2));
            }
            let at = Instant::now();
            std::thread::sleep(Duration::from_millis(100));
            drop(writer);
            at
        });
        let mut reads = Vec::new();
        let mut buf = [0u8; 4096];
        let mut got = 0;
        while got < 50 {
            let n = socket.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed early");
            reads.push(n);
            got += n;
        }
        let done = Instant::now();
        let at = last_write.join().unwrap();
        (reads, done.saturating_duration_since(at))
    }

    /// Run `f` on a single-threaded runtime, as on a shard, with a sweeper of that period or none.
    fn on_a_shard<F: std::future::Future>(sweep_ms: Option<u64>, f: F) -> F::Output {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            if let Some(ms) = sweep_ms {
                tokio::spawn(run(Duration::from_millis(ms)));
                tokio::task::yield_now().await;
            }
            f.await
        })
    }

    #[test]
    fn a_swept_socket_is_read_once_per_period_with_all_that_came_and_an_unswept_one_per_event() {
        on_a_shard(Some(50), async {
            let (swept_reads, late) = five_events(true).await;
            // The five events came within 8 ms: one sweep (or two, if one fell between) read them.
            assert!(swept_reads.len() <= 2, "{swept_reads:?}");
            assert!(late < Duration::from_millis(50 + 25), "{late:?}");
            let (reads, late) = five_events(false).await;
            assert_eq!(
                reads,
                vec![10; 5],
                "in the reactor every event is its own read"
            );
            assert!(late < Duration::from_millis(10), "{late:?}");
        });
    }

    #[test]
    fn without_a_sweeper_on_the_thread_a_socket_asked_to_be_swept_is_read_as_data_arrives() {
        on_a_shard(None, async {
            let (reads, late) = five_events(true).await;
            assert_eq!(reads, vec![10; 5]);
            assert!(late < Duration::from_millis(10), "{late:?}");
        });
    }

    #[test]
    fn a_swept_socket_goes_back_to_the_reactor_to_write_sees_the_peer_close_and_idle_costs_no_sweeps(
    ) {
        on_a_shard(Some(5), async {
            let (mut writer, reader) = pair().await;
            let (mut socket, switch) = UpstreamSocket::new(reader);
            switch.set(true);
            writer.write_all(b"one").unwrap();
            let mut buf = [0u8; 16];
            assert_eq!(socket.read(&mut buf).await.unwrap(), 3);
            assert!(matches!(socket.io, Io::Swept { .. }));
            // In the set but read by no one: the sweep loop parks, no timer runs.
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert_eq!(
                with_sweeper(|s| (s.live, s.pending, s.idle.is_some())),
                Some((1, 0, true))
            );
            use tokio::io::AsyncWriteExt;
            socket.write_all(b"back").await.unwrap();
            assert!(matches!(socket.io, Io::Reactor(_)));
            let mut back = [0u8; 4];
            writer.read_exact(&mut back).unwrap();
            assert_eq!(&back, b"back");
            // swept again at the next read; the peer's close ends it
            drop(writer);
            assert_eq!(socket.read(&mut buf).await.unwrap(), 0);
            assert!(matches!(socket.io, Io::Swept { .. }));
            assert_eq!(with_sweeper(|s| (s.live, s.pending)), Some((1, 0)));
            drop(socket);
            assert_eq!(with_sweeper(|s| s.live), Some(0), "dropped: out of the set");
        });
    }
}
