//! The proxy's per-event reading cost on real SGLang 0.5.14 answers (tests/fixtures/.../http):
//! each event arrives as its own frame, as uvicorn sends them; beside it the floor of only finding
//! where events end, and what the previous design paid (a JSON parse per event).
//! `cargo bench -p sglang-exporters --bench sse`
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use sglang_exporters::proxy::{event_end, Api, Bytes, EventStream};

const FIXTURES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/sglang-0.5.14-h200/http"
);

fn frames(name: &str) -> Vec<Bytes> {
    let body = std::fs::read(format!("{FIXTURES}/{name}.body")).unwrap_or_default();
    let mut out = Vec::new();
    let mut rest = &body[..];
    while let Some((_, next)) = event_end(rest) {
        out.push(Bytes::copy_from_slice(&rest[..next]));
        rest = &rest[next..];
    }
    out
}

fn bench(c: &mut Criterion) {
    for (name, api) in [
        ("default-generate_stream", Api::Generate),
        ("default-completions_stream", Api::Completions),
        ("default-chat_stream_usage", Api::Chat),
    ] {
        let frames = frames(name);
        let mut g = c.benchmark_group(name);
        g.throughput(Throughput::Elements(frames.len() as u64));
        g.bench_function("event ends only (floor)", |b| {
            b.iter(|| frames.iter().filter(|f| event_end(f).is_some()).count())
        });
        g.bench_function("EventStream::pass", |b| {
            b.iter(|| {
                let mut s = EventStream::new(api, true);
                let mut n = 0u64;
                for f in &frames {
                    let out = s.pass(f.clone(), |e| n += u64::from(e.output));
                    std::hint::black_box(out);
                }
                n
            })
        });
        g.bench_function("serde_json per event (previous design)", |b| {
            b.iter(|| {
                frames
                    .iter()
                    .filter_map(|f| {
                        let d = f.strip_prefix(b"data: ")?;
                        serde_json::from_slice::<serde_json::Value>(d.trim_ascii()).ok()
                    })
                    .count()
            })
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
