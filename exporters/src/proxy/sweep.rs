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
    // Below 50 µs a shard would sweep without pause while an answer waits.
    (us > 0).then(|| Duration::from_micros(us.clamp(50, 1_000_000)))
}

/// One shard's set of swept sockets and the answers waiting on them.
struct Sweeper {
    /// Tells a socket's registration apart from another shard's.
    id: u64,
    epoll: Epoll,
    /// By token: the answer to wake when its socket has data (`None`: not waiting).
    waiting: Vec<Option<Waker>>,
    /// Tokens of `waiting` no socket holds (the rest are the sockets in the set).
    free: Vec<usize>,
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

/// This thread's sweeper, if it has one (and its thread-locals are not being torn down).
fn with_sweeper<T>(f: impl FnOnce(&mut Sweeper) -> T) -> Option<T> {
    SWEEPER
        .try_with(|s| s.try_borrow_mut().ok()?.as_mut().map(f))
        .ok()
        .flatten()
}

/// The sweeps stopped (their timer failed): answers waiting for one are woken, and every swept
/// socket goes back to the reactor at its next read.
fn retire() -> std::future::Pending<()> {
    let gone = SWEEPER
        .try_with(|s| s.try_borrow_mut().ok().and_then(|mut s| s.take()))
        .ok()
        .flatten();
    if let Some(s) = gone {
        s.waiting.into_iter().flatten().for_each(Waker::wake);
    }
    std::future::pending()
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
            pending: 0,
            idle: None,
        })
    });
    // Grown to the set's size at a sweep (one `epoll_wait` must see every ready socket).
    let mut events = vec![EpollEvent::empty(); 64];
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
            return retire().await;
        }
        while with_sweeper(|s| s.pending).unwrap_or(0) > 0 {
            let Ok(mut ready) = timer.readable().await else {
                return retire().await;
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
fn sweep(events: &mut Vec<EpollEvent>) {
    let woken = with_sweeper(|s| {
        // One call sees every socket in the set: a second call would see the same ones again.
        let live = s.live();
        if events.len() < live {
            events.resize(live, EpollEvent::empty());
        }
        let n = s.epoll.wait(events, EpollTimeout::ZERO).unwrap_or(0);
        let mut woken = Vec::new();
        for e in &events[..n] {
            if let Some(w) = s.waiting.get_mut(e.data() as usize).and_then(Option::take) {
                s.pending -= 1;
                woken.push(w);
            }
        }
        woken
    });
    // Woken outside the borrow.
    woken.into_iter().flatten().for_each(Waker::wake);
}

/// An upstream socket: in the shard's reactor (every event read as it arrives), or swept.
/// [`SweepSwitch`] says which the answer wants; the switch happens at the next read.
pub(crate) struct UpstreamSocket {
    io: Io,
    want_swept: Arc<AtomicBool>,
    /// A write waits on the reactor: the socket stays there (leaving it drops that wait).
    write_blocked: bool,
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
                write_blocked: false,
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
                let waiter = with_sweeper(|s| s.remove(sweeper, token, &std)).flatten();
                let stream = TcpStream::from_std(std)?;
                // A read waiting for a sweep now waits on the reactor.
                if let Some(w) = waiter {
                    if stream
                        .poll_read_ready(&mut Context::from_waker(&w))
                        .is_ready()
                    {
                        w.wake();
                    }
                }
                Io::Reactor(stream)
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

    /// A write, through the reactor; one that waits keeps the socket there until it is done.
    fn write_with(
        &mut self,
        write: impl FnOnce(Pin<&mut TcpStream>) -> Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        let p = match self.reactor() {
            Ok(s) => write(Pin::new(s)),
            Err(e) => Poll::Ready(Err(e)),
        };
        self.write_blocked = p.is_pending();
        p
    }
}

fn gone() -> io::Error {
    io::Error::new(
        io::ErrorKind::NotConnected,
        "upstream socket lost in a switch",
    )
}

impl Sweeper {
    /// Sockets in the set.
    fn live(&self) -> usize {
        self.waiting.len() - self.free.len()
    }

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
        Ok((self.id, token))
    }

    /// An answer waits for the next sweep (the loop starts its timer if it was idle).
    /// `false`: the socket is not in this set (no sweep would wake it).
    fn wait(&mut self, sweeper: u64, token: usize, waker: Waker) -> bool {
        if sweeper != self.id {
            return false;
        }
        let Some(w) = self.waiting.get_mut(token) else {
            return false;
        };
        if w.replace(waker).is_none() {
            self.pending += 1;
            if let Some(idle) = self.idle.take() {
                idle.wake();
            }
        }
        true
    }

    fn remove(&mut self, sweeper: u64, token: usize, std: &std::net::TcpStream) -> Option<Waker> {
        if sweeper != self.id {
            return None;
        }
        let _ = self.epoll.delete(std);
        let w = self.waiting.get_mut(token)?;
        let waiter = w.take();
        if waiter.is_some() {
            self.pending -= 1;
        }
        self.free.push(token);
        waiter
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
        let swept = this.want_swept.load(Ordering::Relaxed) && !this.write_blocked;
        if let Err(e) = this.switch(swept) {
            return Poll::Ready(Err(e));
        }
        if let Io::Swept {
            std,
            sweeper,
            token,
        } = &mut this.io
        {
            // The part of hyper's buffer handed over is zeroed first: at most 16 KiB a read.
            let want = buf.remaining().min(16 << 10);
            loop {
                match std.read(buf.initialize_unfilled_to(want)) {
                    Ok(n) => {
                        buf.advance(n);
                        return Poll::Ready(Ok(()));
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        let (sweeper, token, waker) = (*sweeper, *token, cx.waker().clone());
                        if with_sweeper(|s| s.wait(sweeper, token, waker)) == Some(true) {
                            return Poll::Pending;
                        }
                        // No sweep will come (the sweeps stopped): wait on the reactor.
                        break;
                    }
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
            if let Err(e) = this.switch(false) {
                return Poll::Ready(Err(e));
            }
        }
        match &mut this.io {
            Io::Reactor(s) => Pin::new(s).poll_read(cx, buf),
            _ => Poll::Ready(Err(gone())),
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
        self.get_mut().write_with(|s| s.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .write_with(|s| s.poll_write_vectored(cx, bufs))
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

/// (live, pending) of this thread's sweeper.
#[cfg(test)]
pub(crate) fn counts() -> Option<(usize, usize)> {
    with_sweeper(|s| (s.live(), s.pending))
}

/// Run `f` on a single-threaded runtime, as on a shard, with a sweeper of that period or none.
#[cfg(test)]
pub(crate) fn on_a_shard<F: std::future::Future>(sweep_ms: Option<u64>, f: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a test runtime");
    rt.block_on(async {
        if let Some(ms) = sweep_ms {
            tokio::spawn(run(Duration::from_millis(ms)));
            tokio::task::yield_now().await;
        }
        f.await
    })
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

    /// A socket asked to be swept that has read its first bytes (`first`), so it is in the set.
    async fn swept_after(first: &[u8]) -> (std::net::TcpStream, UpstreamSocket) {
        let (mut writer, reader) = pair().await;
        let (mut socket, switch) = UpstreamSocket::new(reader);
        switch.set(true);
        writer.write_all(first).unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(socket.read(&mut buf).await.unwrap(), first.len());
        assert!(matches!(socket.io, Io::Swept { .. }));
        (writer, socket)
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
            let (mut writer, mut socket) = swept_after(b"one").await;
            let mut buf = [0u8; 16];
            // In the set but read by no one: the sweep loop parks, no timer runs.
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert_eq!(
                with_sweeper(|s| (s.live(), s.pending, s.idle.is_some())),
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
            assert_eq!(with_sweeper(|s| (s.live(), s.pending)), Some((1, 0)));
            drop(socket);
            assert_eq!(
                with_sweeper(|s| s.live()),
                Some(0),
                "dropped: out of the set"
            );
        });
    }

    /// More swept sockets with data at one sweep than a first events buffer holds: one
    /// `epoll_wait` must see them all (level-triggered, a second call would return the same ones
    /// again, for ever: the shard froze).
    #[test]
    fn a_hundred_sockets_ready_at_one_sweep_are_all_read_and_the_shard_goes_on() {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            on_a_shard(Some(5), async {
                let mut writers = Vec::new();
                let mut tasks = Vec::new();
                for _ in 0..100 {
                    let (w, mut socket) = swept_after(b"x").await;
                    writers.push(w);
                    tasks.push(tokio::spawn(async move {
                        let mut b = [0u8; 8];
                        socket.read(&mut b).await.unwrap()
                    }));
                }
                tokio::task::yield_now().await; // all 300 wait
                for w in &mut writers {
                    w.write_all(b"y").unwrap();
                }
                for t in tasks {
                    assert_eq!(t.await.unwrap(), 1);
                }
            });
            let _ = done_tx.send(());
        });
        done_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("shard frozen in sweep()");
    }

    /// hyper polls read, then write, in one turn: a write that takes the swept socket back to the
    /// reactor must hand the read's waiter over to it, or data from the server wakes no one.
    #[test]
    fn a_write_that_blocks_after_a_swept_read_keeps_the_read_waiting_on_the_reactor() {
        on_a_shard(Some(5), async {
            let (mut writer, mut socket) = swept_after(b"one").await;
            let woken = Arc::new(AtomicBool::new(false));
            struct Flag(Arc<AtomicBool>);
            impl std::task::Wake for Flag {
                fn wake(self: Arc<Self>) {
                    self.0.store(true, Ordering::SeqCst);
                }
            }
            let waker = Waker::from(Arc::new(Flag(woken.clone())));
            let mut cx = Context::from_waker(&waker);
            let mut pinned = Pin::new(&mut socket);
            let mut rb = [0u8; 16];
            let mut rbuf = ReadBuf::new(&mut rb);
            assert!(pinned.as_mut().poll_read(&mut cx, &mut rbuf).is_pending());
            // the peer reads nothing: fill the send buffer until a write blocks
            let big = vec![0u8; 1 << 20];
            loop {
                if pinned.as_mut().poll_write(&mut cx, &big).is_pending() {
                    break;
                }
            }
            // let delayed ACKs settle, fill what they freed, then start clean
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_millis(300)).await;
                while pinned.as_mut().poll_write(&mut cx, &big).is_ready() {}
            }
            let mut rb = [0u8; 16];
            let mut rbuf = ReadBuf::new(&mut rb);
            assert!(pinned.as_mut().poll_read(&mut cx, &mut rbuf).is_pending());
            assert!(pinned.as_mut().poll_write(&mut cx, &big).is_pending());
            woken.store(false, Ordering::SeqCst);
            writer.write_all(b"two").unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(woken.load(Ordering::SeqCst), "data arrived, nobody woken");
        });
    }
}
