//! The proxy's per-event reading cost on real SGLang 0.5.14 answers (tests/fixtures/.../http):
//! each event arrives as its own frame, as uvicorn sends them; beside it the floor of only finding
//! where events end, and what the previous design paid (a JSON parse per event). The recorded
//! `/generate` answer has 64 tokens; benchmarks ask for 256, and SGLang's native stream repeats
//! the whole text and token ids so far in every event, so the same answer is also read extended
//! to 256 tokens (its text and ids repeated, every other byte as recorded).
//! `cargo bench -p sglang-exporters --bench sse`
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use sglang_exporters::proxy::{event_end, Api, BodyCounts, Bytes, EventStream};

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

/// The recorded cumulative `/generate` events extended to `rounds` times their tokens: event k of
/// round r holds the final text and ids r times, then event k's own, and counts 64r + k.
fn extended(frames: &[Bytes], rounds: usize) -> Vec<Bytes> {
    let split = |f: &Bytes| -> Option<(String, String, String)> {
        let s = std::str::from_utf8(f)
            .ok()?
            .strip_prefix(r#"data: {"text":""#)?;
        let (text, rest) = s.split_once(r#"","output_ids":["#)?;
        let (ids, meta) = rest.split_once(r#"],"meta_info":"#)?;
        Some((text.to_string(), ids.to_string(), meta.to_string()))
    };
    let events: Vec<_> = frames.iter().filter_map(split).collect();
    let Some((all_text, all_ids, _)) = events.last().cloned() else {
        return Vec::new();
    };
    let n = events.len();
    let mut out = Vec::new();
    for r in 0..rounds {
        for (k, (text, ids, meta)) in events.iter().enumerate() {
            let count = |m: &str| {
                m.replace(
                    &format!(r#""completion_tokens":{}"#, k + 1),
                    &format!(r#""completion_tokens":{}"#, r * n + k + 1),
                )
            };
            let (text, ids) = (
                format!("{}{text}", all_text.repeat(r)),
                format!("{}{ids}", format!("{all_ids},").repeat(r)),
            );
            out.push(Bytes::from(format!(
                r#"data: {{"text":"{text}","output_ids":[{ids}],"meta_info":{}"#,
                count(meta)
            )));
        }
    }
    out.extend(frames.iter().filter(|f| split(f).is_none()).cloned());
    out
}

fn bench(c: &mut Criterion) {
    let generate_256 = extended(&frames("default-generate_stream"), 4);
    assert_eq!(
        generate_256.len(),
        4 * 64 + 1,
        "the recorded answer's shape changed"
    );
    for (name, api, frames) in [
        ("default-generate_stream", Api::Generate, None),
        (
            "default-generate_stream, 256 tokens",
            Api::Generate,
            Some(generate_256),
        ),
        ("default-completions_stream", Api::Completions, None),
        ("default-chat_stream_usage", Api::Chat, None),
    ] {
        let frames = frames.unwrap_or_else(|| self::frames(name));
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

/// A whole (non-streamed) answer's counts: read as its frames pass, against what the previous
/// design paid (a copy of the body, then one JSON parse of it). The recorded `/generate` answer,
/// and the same with its text and ids repeated to about 4 MB (an answer with logprobs is that
/// large), in 64 KiB frames.
fn whole_answers(c: &mut Criterion) {
    let small = std::fs::read(format!("{FIXTURES}/default-generate.body")).unwrap_or_default();
    let text = r#"{"text":""#.to_string() + &" vu at jinuraipupe".repeat(100_000);
    let ids = (0..300_000)
        .map(|i| (100 + i).to_string())
        .collect::<Vec<_>>()
        .join(",");
    let big = format!(
        r#"{text}","output_ids":[{ids}],"meta_info":{{"prompt_tokens":3,"completion_tokens":300000}}}}"#
    );
    for (name, body) in [
        ("default-generate (whole)", small),
        ("4 MB answer", big.into_bytes()),
    ] {
        let mut g = c.benchmark_group(name);
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_function("BodyCounts::feed", |b| {
            b.iter(|| {
                let mut counts = BodyCounts::default();
                for frame in body.chunks(65536) {
                    counts.feed(frame);
                }
                counts.finish()
            })
        });
        g.bench_function("copy + serde_json (previous design)", |b| {
            b.iter(|| {
                let mut kept = Vec::new();
                for frame in body.chunks(65536) {
                    kept.extend_from_slice(frame);
                }
                let v = serde_json::from_slice::<serde_json::Value>(&kept).ok()?;
                v["meta_info"]["completion_tokens"].as_u64()
            })
        });
        g.finish();
    }
}

criterion_group!(benches, bench, whole_answers);
criterion_main!(benches);
