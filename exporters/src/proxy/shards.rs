//! The proxy's connections run on threads of their own, each a single-threaded runtime that
//! accepts connections from the proxy's one listening socket (`listen::SharedListener`) and owns
//! them from accept to close. A new connection is read by the first thread to wake, and an SSE
//! event costs one wake-up of the one thread that reads and forwards it. On the supervisor's work-stealing runtime every event
//! also woke idle workers to look for work: measured at 32 streams, one event at a time, the
//! supervisor's CPU per event grew with its workers (19.9 µs with one, 28.1 with two, 42.2 with
//! four: BENCHMARKS.md, "Proxy threads").
use std::future::Future;
use std::pin::Pin;
use tokio::sync::mpsc;

/// A connection's work, built on the shard that runs it (its sockets register with that
/// thread's reactor).
type Job = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

pub(crate) struct Shards {
    queues: Vec<mpsc::UnboundedSender<Job>>,
}

/// A quarter of the cores, two to four: on the 16-core H200 host two shards saturated at 1024
/// streams of 250 events/s each (+13 ms on the largest inter-chunk gap), and a thread per core
/// would compete with the server and the benchmark client. Never one: the scheduler shares a
/// busy core per thread, and a server of hundreds of threads starved a lone proxy thread on two
/// cores (+650 ms on the largest gap per stream); idle shards cost nothing.
/// `SGLANG_SUPERVISOR_PROXY_THREADS=N` (1 to 64) overrides it, to measure one count against
/// another on a given host; anything else there is ignored.
pub(crate) fn shard_count() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let from_env = std::env::var("SGLANG_SUPERVISOR_PROXY_THREADS").ok();
    shard_count_for(cores, from_env.as_deref())
}

fn shard_count_for(cores: usize, from_env: Option<&str>) -> usize {
    match from_env.and_then(|v| v.trim().parse::<usize>().ok()) {
        Some(n @ 1..=64) => n,
        _ => (cores / 4).clamp(2, 4),
    }
}

impl Shards {
    /// Start `n` shard threads. They end when this is dropped (with the accept loop).
    pub(crate) fn start(n: usize) -> std::io::Result<Self> {
        let mut queues = Vec::with_capacity(n);
        let sweep_period = super::sweep::period();
        let spin = super::spin::enabled();
        for i in 0..n.max(1) {
            let (tx, mut rx) = mpsc::unbounded_channel::<Job>();
            // The runtime is built on its thread: one built here and then refused its thread
            // would be dropped here, inside the caller's runtime, which tokio forbids (a panic).
            let (built_tx, built_rx) = std::sync::mpsc::sync_channel(1);
            std::thread::Builder::new()
                .name(format!("proxy-{i}"))
                .spawn(move || {
                    let rt = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt,
                        Err(e) => {
                            let _ = built_tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = built_tx.send(Ok(()));
                    rt.block_on(async move {
                        if let Some(period) = sweep_period {
                            // Tasks of this runtime run on this thread: the sweeper is this shard's.
                            tokio::spawn(super::sweep::run(period));
                        }
                        if spin {
                            tokio::spawn(super::spin::run());
                        }
                        while let Some(job) = rx.recv().await {
                            tokio::spawn(job());
                        }
                    });
                })?;
            built_rx.recv().unwrap_or_else(|_| {
                Err(std::io::Error::other("a proxy thread ended at its start"))
            })?;
            queues.push(tx);
        }
        Ok(Shards { queues })
    }

    /// How many shards there are (`start`'s `n`, at least one).
    pub(crate) fn len(&self) -> usize {
        self.queues.len()
    }

    /// Run the future `make` builds on shard `i` (of [`len`](Self::len)): the proxy gives each
    /// shard its accept loop, with that shard's share of the connections (`listen::Spread`).
    /// Nothing waits for it: a shard's jobs last as long as the shard.
    pub(crate) fn spawn_on<M, F>(&self, i: usize, make: M)
    where
        M: FnOnce() -> F + Send + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        let job: Job = Box::new(move || Box::pin(make()));
        // A shard gone (its thread ended) takes no more jobs.
        if let Some(queue) = self.queues.get(i) {
            let _ = queue.send(job);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::oneshot;

    #[tokio::test]
    async fn a_job_runs_on_the_shard_it_names() {
        let shards = Shards::start(2).unwrap();
        assert_eq!(shards.len(), 2);
        let mut names = Vec::new();
        for i in [0, 1, 1, 0] {
            let (tx, rx) = oneshot::channel();
            shards.spawn_on(i, move || async move {
                tokio::task::yield_now().await;
                let name = std::thread::current().name().map(str::to_string);
                let _ = tx.send(name);
            });
            names.push(rx.await.unwrap().unwrap());
        }
        assert_eq!(names, ["proxy-0", "proxy-1", "proxy-1", "proxy-0"]);
    }

    #[tokio::test]
    async fn a_socket_made_on_a_shard_is_served_by_that_shards_reactor() {
        let shards = Shards::start(1).unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            use std::io::{Read, Write};
            let (mut s, _) = listener.accept().unwrap();
            let mut b = [0u8; 4];
            s.read_exact(&mut b).unwrap();
            s.write_all(&b).unwrap();
        });
        let (tx, rx) = oneshot::channel();
        shards.spawn_on(0, move || async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(b"ping").await.unwrap();
            let mut b = [0u8; 4];
            s.read_exact(&mut b).await.unwrap();
            let _ = tx.send(b);
        });
        assert_eq!(&rx.await.unwrap(), b"ping");
        server.join().unwrap();
    }

    #[test]
    fn the_thread_count_is_a_quarter_of_the_cores_two_to_four_unless_the_environment_names_one() {
        assert_eq!(shard_count_for(2, None), 2);
        assert_eq!(shard_count_for(16, None), 4);
        assert_eq!(shard_count_for(128, None), 4);
        assert_eq!(shard_count_for(16, Some("1")), 1);
        assert_eq!(shard_count_for(2, Some(" 8 ")), 8);
        for ignored in ["0", "65", "-1", "two", ""] {
            assert_eq!(shard_count_for(16, Some(ignored)), 4, "{ignored:?}");
        }
    }
}
