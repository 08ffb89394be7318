//! Parser cost per byte of real SGLang output, against framing alone (the floor any tee pays).
//! `cargo bench -p sglang-supervisor --bench log_parse`
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use sglang_supervisor::logs::parse::{
    is_plain, BatchKind, LogEvent, LogParser, LogSink, LoopbackClients, AFTER_READY,
};
use sglang_supervisor::logs::tee::LineFramer;

const DIR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/sglang-0.5.14-h200"
);

/// The steady state of a serving log: recorded batch and access lines.
fn steady() -> Vec<u8> {
    let mut all = Vec::new();
    for run in ["A_nograph", "B_decode_graph", "F_tokworkers2"] {
        let log = std::fs::read_to_string(format!("{DIR}/{run}/server.log")).unwrap_or_default();
        for l in log
            .lines()
            .filter(|l| l.contains(" batch, ") || l.contains("INFO:     127.0.0.1"))
        {
            all.extend_from_slice(l.as_bytes());
            all.push(b'\n');
        }
    }
    all
}

/// One whole real startup, server_args line included.
fn startup() -> Vec<u8> {
    std::fs::read(format!("{DIR}/A_nograph/server.log")).unwrap_or_default()
}

/// Counts what it gets, like the reader's sink it keeps batch lines as borrowed text.
struct Count(usize);

impl LogSink for Count {
    fn event(&mut self, _: LogEvent) {
        self.0 += 1;
    }
    fn batch(&mut self, _: BatchKind, _: Option<&str>, body: &[u8]) {
        self.0 += body.len();
    }
}

/// The steady state with every client elsewhere (a server behind a load balancer on another
/// host): access lines whose client is read, not told by its first bytes.
fn steady_remote() -> Vec<u8> {
    let text =
        String::from_utf8_lossy(&steady()).replace("INFO:     127.0.0.1:", "INFO:     10.1.2.3:");
    text.into_bytes()
}

/// The steady state of a run measured by the proxy, once the server is ready: every client at
/// the proxy's source, whose access lines are read to tell it from a loopback client that
/// bypassed the proxy.
fn steady_proxied() -> Vec<u8> {
    let text =
        String::from_utf8_lossy(&steady()).replace("INFO:     127.0.0.1:", "INFO:     127.0.0.2:");
    let ready = format!(
        "[2026-12-02 09:20:21] INFO:     127.0.0.1:40002 - \"GET {AFTER_READY} HTTP/1.1\" 200 OK\n"
    );
    (ready + &text).into_bytes()
}

fn bench(c: &mut Criterion) {
    let proxied = LoopbackClients::Told {
        but: Some(std::net::Ipv4Addr::new(127, 0, 0, 2)),
    };
    let corpora = [
        ("steady", steady(), LoopbackClients::Skipped),
        ("steady_remote", steady_remote(), LoopbackClients::Skipped),
        ("steady_proxied", steady_proxied(), proxied),
        ("startup", startup(), LoopbackClients::Skipped),
    ];
    for (name, data, loopback) in corpora {
        bench_corpus(c, name, &data, loopback);
    }
}

fn bench_corpus(c: &mut Criterion, name: &str, data: &[u8], loopback: LoopbackClients) {
    let mut g = c.benchmark_group(format!("log_{name}"));
    g.throughput(Throughput::Bytes(data.len() as u64));
    g.bench_function("frame_only", |b| {
        b.iter(|| {
            let mut f = LineFramer::new(1 << 20);
            let mut n = 0usize;
            for chunk in data.chunks(256 * 1024) {
                f.feed(chunk, |l, _| n += l.len());
            }
            n
        })
    });
    // What the reader does: one plain check per chunk, lines parsed with the chunk's hint.
    g.bench_function("frame_and_parse", |b| {
        b.iter(|| {
            let mut f = LineFramer::new(1 << 20);
            let mut p = LogParser::telling(loopback);
            let mut sink = Count(0);
            for chunk in data.chunks(256 * 1024) {
                f.feed_hinted(chunk, is_plain(chunk), |l, t, plain| {
                    p.line_hinted(l, t, plain, &mut sink)
                });
            }
            p.flush(&mut sink);
            sink.0
        })
    });
    // Lines one by one, without a hint (each line checks itself).
    g.bench_function("frame_and_parse_per_line", |b| {
        b.iter(|| {
            let mut f = LineFramer::new(1 << 20);
            let mut p = LogParser::telling(loopback);
            let mut sink = Count(0);
            for chunk in data.chunks(256 * 1024) {
                f.feed(chunk, |l, t| p.line(l, t, &mut sink));
            }
            p.flush(&mut sink);
            sink.0
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
