//! Proxy overhead, side by side: the same streamed load sent alternately straight to the server
//! and through the supervisor's proxy. Per side: median and p99 TTFT, median E2E, the largest
//! inter-chunk gap of each stream (median over streams and the worst); and the supervisor's CPU
//! time per forwarded SSE event, read from /proc around the proxied rounds only.
//! usage: proxy-bench DIRECT PROXY [STREAMS=64] [TOKENS=256] [ROUNDS=5] [SUPERVISOR_PID] [PATH]
//!        [SERVER_PID]
//! PROXY_BENCH_CLIENT=one-thread runs every stream on one thread (as bench_serving's asyncio loop
//! does) instead of a thread per stream, blocked between events.
//! PROXY_BENCH_ABBA=1 sends the rounds in ABBA order (the proxied side first in every other
//! pair), so that neither side always follows the other; PROXY_BENCH_TTFTS=FILE appends each
//! stream's TTFT to FILE as `direct MS` or `proxy MS`, for a pooled percentile over several runs.
//! PATH: /generate (default), /v1/completions or /v1/chat/completions. With SERVER_PID, the
//! server's own CPU per event it wrote in the direct rounds is printed beside the proxy's: the
//! floor a userspace forwarder of the same bytes over loopback cannot go below by much (a write
//! per event, and the wake-up of the reader it delivers to).
use sglang_supervisor_tests::{median, stat_cpu_ticks, Dechunk};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// One streamed request timed as bench_serving times it (from the request written).
struct Stream {
    ttft: f64,
    e2e: f64,
    max_gap: f64,
    events: u64,
}

/// What the reads of one answer told: bench_serving's timings, kept per read.
struct Timing {
    t0: Instant,
    first: Option<Instant>,
    last: Instant,
    max_gap: Duration,
    events: u64,
    carry: Vec<u8>,
    dechunk: Dechunk,
}

impl Timing {
    fn new(t0: Instant) -> Self {
        Timing {
            t0,
            first: None,
            last: t0,
            max_gap: Duration::ZERO,
            events: 0,
            carry: Vec::with_capacity(64 << 10),
            dechunk: Dechunk::default(),
        }
    }

    fn read(&mut self, bytes: &[u8]) {
        let now = Instant::now();
        // Events are counted in the body as sent (the chunk framing taken off: a proxy may cut a
        // server's chunk in two where it arrived in two reads), and an event's "data: " may be
        // split between reads: count over the last read's tail too.
        self.dechunk.feed(bytes, &mut self.carry);
        let k = self.carry.windows(6).filter(|w| w == b"data: ").count() as u64;
        self.carry.drain(..self.carry.len().saturating_sub(5));
        if k > 0 {
            if self.first.is_some() {
                self.max_gap = self.max_gap.max(now - self.last);
            } else {
                self.first = Some(now);
            }
            self.last = now;
            self.events += k;
        }
    }

    fn end(self) -> Stream {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        Stream {
            ttft: self.first.map_or(f64::NAN, |f| ms(f - self.t0)),
            e2e: ms(self.t0.elapsed()),
            max_gap: ms(self.max_gap),
            events: self.events,
        }
    }
}

fn request(path: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// One stream on a thread of its own, blocked in `read` between events: every event written
/// to it wakes a thread.
fn one(addr: &str, path: &str, body: &str) -> std::io::Result<Stream> {
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let t0 = Instant::now();
    s.write_all(request(path, body).as_bytes())?;
    let mut buf = vec![0u8; 64 << 10];
    let mut timing = Timing::new(t0);
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        timing.read(&buf[..n]);
    }
    Ok(timing.end())
}

/// All streams on one thread, as bench_serving's asyncio loop runs them (`PROXY_BENCH_CLIENT=one-thread`):
/// a busy thread is not woken by each event written to it.
async fn one_async(addr: String, path: String, body: String) -> std::io::Result<Stream> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(&addr).await?;
    s.set_nodelay(true)?;
    let t0 = Instant::now();
    s.write_all(request(&path, &body).as_bytes()).await?;
    let mut buf = vec![0u8; 64 << 10];
    let mut timing = Timing::new(t0);
    loop {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        timing.read(&buf[..n]);
    }
    Ok(timing.end())
}

fn round(addr: &str, path: &str, streams: usize, tokens: usize) -> Vec<Stream> {
    let body = match path {
        "/generate" => format!(
            // ignore_eos: a real SGLang (a dummy model) then gives every stream its full length
            r#"{{"text":"x","sampling_params":{{"max_new_tokens":{tokens},"ignore_eos":true}},"stream":true}}"#
        ),
        "/v1/chat/completions" => format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"x"}}],"max_tokens":{tokens},"stream":true}}"#
        ),
        _ => format!(r#"{{"model":"m","prompt":"x","max_tokens":{tokens},"stream":true}}"#),
    };
    if std::env::var("PROXY_BENCH_CLIENT").as_deref() == Ok("one-thread") {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return Vec::new();
        };
        return rt.block_on(async {
            let tasks: Vec<_> = (0..streams)
                .map(|_| tokio::spawn(one_async(addr.into(), path.into(), body.clone())))
                .collect();
            let mut done = Vec::with_capacity(streams);
            for t in tasks {
                if let Ok(Ok(s)) = t.await {
                    done.push(s);
                }
            }
            done
        });
    }
    let handles: Vec<_> = (0..streams)
        .map(|_| {
            let (a, p, b) = (addr.to_string(), path.to_string(), body.clone());
            std::thread::spawn(move || one(&a, &p, &b))
        })
        .collect();
    handles
        .into_iter()
        .filter_map(|h| h.join().ok()?.ok())
        .collect()
}

/// utime + stime of a process, in seconds.
fn cpu_s(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let ticks = stat_cpu_ticks(&stat)? as f64;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some(ticks / hz)
}

fn pct(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

#[derive(Default)]
struct Side {
    ttft: Vec<f64>,
    e2e: Vec<f64>,
    gap: Vec<f64>,
    events: u64,
    failed: usize,
}

impl Side {
    fn add(&mut self, r: Vec<Stream>, expected: usize) {
        self.failed += expected - r.len();
        for s in r {
            self.ttft.push(s.ttft);
            self.e2e.push(s.e2e);
            self.gap.push(s.max_gap);
            self.events += s.events;
        }
    }
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 3 {
        eprintln!("usage: proxy-bench DIRECT PROXY [STREAMS=64] [TOKENS=256] [ROUNDS=5] [SUPERVISOR_PID] [PATH]");
        std::process::exit(2);
    }
    let num = |i: usize, d: usize| a.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (streams, tokens, rounds) = (num(3, 64), num(4, 256), num(5, 5));
    let pid = a
        .get(6)
        .and_then(|s| s.parse::<u32>().ok())
        .filter(|p| *p > 0);
    let path = a.get(7).map_or("/generate", |s| s.as_str());
    let server = a
        .get(8)
        .and_then(|s| s.parse::<u32>().ok())
        .filter(|p| *p > 0);
    let (mut server_cpu, mut server_cpu_proxied) = (0.0, 0.0);
    let (mut d, mut p) = (Side::default(), Side::default());
    let mut cpu = 0.0;
    let abba = std::env::var("PROXY_BENCH_ABBA").as_deref() == Ok("1");
    for i in 0..rounds {
        let direct_first = !abba || i % 2 == 0;
        for proxied in [!direct_first, direct_first] {
            if proxied {
                let before = pid.and_then(cpu_s);
                let server_before = server.and_then(cpu_s);
                p.add(round(&a[2], path, streams, tokens), streams);
                if let (Some(b), Some(after)) = (before, pid.and_then(cpu_s)) {
                    cpu += after - b;
                }
                if let (Some(b), Some(after)) = (server_before, server.and_then(cpu_s)) {
                    server_cpu_proxied += after - b;
                }
            } else {
                let before = server.and_then(cpu_s);
                d.add(round(&a[1], path, streams, tokens), streams);
                if let (Some(b), Some(after)) = (before, server.and_then(cpu_s)) {
                    server_cpu += after - b;
                }
            }
        }
    }
    if let Ok(file) = std::env::var("PROXY_BENCH_TTFTS") {
        let mut out = String::new();
        for (name, side) in [("direct", &d), ("proxy", &p)] {
            for t in &side.ttft {
                out.push_str(&format!("{name} {t:.6}\n"));
            }
        }
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&file)
            .and_then(|mut f| f.write_all(out.as_bytes()));
        if let Err(e) = appended {
            eprintln!("proxy-bench: cannot append the TTFTs to {file}: {e}");
            std::process::exit(1);
        }
    }
    println!(
        "{rounds} rounds x {streams} concurrent streams x {tokens} tokens on {path}, alternating"
    );
    let line = |name: &str, s: &mut Side| {
        let (t50, t99) = (median(&mut s.ttft), pct(&mut s.ttft, 0.99));
        let e50 = median(&mut s.e2e);
        let (g50, gmax) = (median(&mut s.gap), pct(&mut s.gap, 1.0));
        println!(
            "{name}: TTFT median {t50:.3} ms p99 {t99:.3} ms | E2E median {e50:.2} ms | max gap per stream median {g50:.2} ms worst {gmax:.2} ms | {} events, {} failed",
            s.events, s.failed
        );
        (t50, t99, e50, g50, gmax)
    };
    let dd = line("direct", &mut d);
    let pp = line("proxy ", &mut p);
    println!(
        "added by the proxy: median E2E {:+.3} % ({:+.3} ms), median TTFT {:+.1} us, p99 TTFT {:+.1} us, median max gap {:+.3} ms",
        (pp.2 / dd.2 - 1.0) * 100.0,
        pp.2 - dd.2,
        (pp.0 - dd.0) * 1000.0,
        (pp.1 - dd.1) * 1000.0,
        pp.3 - dd.3
    );
    if pid.is_some() && p.events > 0 {
        println!(
            "supervisor CPU in the proxied rounds: {cpu:.2} s for {} events = {:.2} us per event",
            p.events,
            cpu * 1e6 / p.events as f64
        );
    }
    if server.is_some() && d.events > 0 {
        println!(
            "server CPU in the direct rounds: {server_cpu:.2} s for {} events = {:.2} us per event written (the server's own cost, for scale)",
            d.events,
            server_cpu * 1e6 / d.events as f64
        );
    }
    // The proxy must not make the server work harder: a reader asleep in epoll costs each
    // write of the server a wake-up, a busy one does not.
    if server.is_some() && p.events > 0 {
        println!(
            "server CPU in the proxied rounds: {server_cpu_proxied:.2} s for {} events = {:.2} us per event written",
            p.events,
            server_cpu_proxied * 1e6 / p.events as f64
        );
    }
}
