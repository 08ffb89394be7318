//! Fuzz harnesses for every parser that reads outside input, and a small mutation fuzzer that runs
//! them in CI for a fixed budget (tests/tests/fuzz.rs). The same harnesses are the libFuzzer
//! targets in `fuzz/` (`cargo fuzz run NAME`, by hand, for longer). Each harness checks a
//! property beyond "does not panic" where the parser has one.
use sglang_exporters::proxy::{Api, BodyCounts, Bytes, EventStream};
use sglang_python::audit::audit;
use sglang_python::recipe;
use sglang_python::schema::Schema;
use sglang_supervisor::compare::{compare, parse_run, render};
use sglang_supervisor::logs::parse::{LogEvent, LogParser};
use sglang_supervisor::logs::pyliteral::parse_server_args;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A harness: one input, panics on a broken property.
pub type Harness = fn(&[u8]);

/// Every target: its name (the corpus folder under `fuzz/corpus/`) and its harness.
pub const TARGETS: [(&str, Harness); 7] = [
    ("log_line", log_line),
    ("server_args", server_args),
    ("recipe", recipe_launch),
    ("sse", sse),
    ("run_json", run_json),
    ("flag_schema", flag_schema),
    ("body_counts", body_counts),
];

/// A non-streamed answer's token counts, read as its bytes pass (whole, and in pieces cut where
/// the input says), against what serde_json reads from the whole body in memory.
pub fn body_counts(data: &[u8]) {
    let mut step = 1 + data.first().copied().unwrap_or(0) as usize % 7;
    let mut cut = BodyCounts::default();
    for piece in data.chunks(step) {
        cut.feed(piece);
        step = step * 5 % 11 + 1;
    }
    let mut whole = BodyCounts::default();
    whole.feed(data);
    let (whole, cut) = (whole.finish(), cut.finish());
    assert_eq!(whole, cut, "the counts depend on where the body was cut");
    // serde_json also rejects bad escapes and bad UTF-8 inside strings, which are not checked
    // here: where it did, only "no counts there, counts here" is allowed, never other counts.
    let want = BodyCounts::of_whole(data);
    let strings_ok = std::str::from_utf8(data).is_ok() && !data.contains(&b'\\');
    if strings_ok || want != (None, None) {
        assert_eq!(whole, want, "serde_json reads other counts");
    }
}

/// SGLang log lines, one per input line, through the parser the tee uses; then its flush.
pub fn log_line(data: &[u8]) {
    let mut parser = LogParser::new();
    let mut events = 0usize;
    let mut sink = |_e: LogEvent| events += 1;
    let lines: Vec<&[u8]> = data.split(|b| *b == b'\n').collect();
    for (i, line) in lines.iter().enumerate() {
        parser.line(line, i % 7 == 3, &mut sink);
    }
    parser.flush(&mut sink);
    assert_eq!(
        parser.stats.lines,
        lines.len() as u64,
        "every line is counted once"
    );
}

/// The Python-literal reader of `server_args=...`: what it returns is JSON-serialisable.
pub fn server_args(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(map) = parse_server_args(text) {
        assert!(serde_json::to_string(&map).is_ok());
    }
}

/// The bash recipe reader: no launch it finds swallows a shell operator, and the audit
/// of its arguments never panics.
pub fn recipe_launch(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(launches) = recipe::launches(text) else {
        return;
    };
    let schema = small_schema();
    for launch in launches {
        for a in &launch.args {
            // `\|`, `"|"`: a quoted or escaped operator is a word like any other.
            let literal = ["\\", "'", "\""]
                .iter()
                .any(|q| text.contains(&format!("{q}{a}")) || text.contains(&format!("{a}{q}")));
            assert!(
                literal || !matches!(a.as_str(), "|" | "&" | ";" | ">" | "<" | "&&" | "||"),
                "operator {a:?} taken as an argument"
            );
        }
        let a = audit(&schema, Some(&schema), &launch.args);
        assert!(a.verdicts.len() <= launch.args.len());
    }
}

/// SSE reading: the same bytes cut anywhere give the same events and the same bytes to the
/// client; without a cut-out event the client gets every byte, with it every byte but that event.
pub fn sse(data: &[u8]) {
    let api = [Api::Generate, Api::Completions, Api::Chat][data.len() % 3];
    for drop_usage in [false, true] {
        let feed = |cuts: &mut dyn FnMut(usize) -> usize| {
            let mut s = EventStream::new(api, drop_usage);
            let (mut events, mut out) = (Vec::new(), Vec::new());
            let mut at = 0;
            while at < data.len() {
                let end = (at + cuts(at)).min(data.len());
                let fwd = s.pass(Bytes::copy_from_slice(&data[at..end]), |e| events.push(e));
                out.extend_from_slice(&fwd);
                at = end;
            }
            if let Some(t) = s.finish(|e| events.push(e)) {
                out.extend_from_slice(&t);
            }
            (events, out)
        };
        let (whole_events, whole_out) = feed(&mut |_| usize::MAX);
        let mut step = 1 + data.first().copied().unwrap_or(0) as usize % 13;
        let (cut_events, cut_out) = feed(&mut |_| {
            step = step * 3 % 17 + 1;
            step
        });
        assert_eq!(
            whole_events, cut_events,
            "events depend on how the bytes were cut"
        );
        assert_eq!(whole_out, cut_out, "forwarded bytes depend on the cuts");
        let cut_out_events = whole_events.iter().filter(|e| e.usage_only).count();
        if !drop_usage || cut_out_events == 0 {
            assert_eq!(whole_out, data, "bytes lost or changed on their way");
        } else {
            assert!(whole_out.len() < data.len());
        }
    }
}

/// The readers of our reports, bench_serving and InferenceX results, then compare and every
/// rendering.
pub fn run_json(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(run) = parse_run(text) else {
        return;
    };
    if let Ok(c) = compare(&run, &run, false, 1.0) {
        for f in [
            sglang_supervisor::cli::CompareFormat::Text,
            sglang_supervisor::cli::CompareFormat::Markdown,
            sglang_supervisor::cli::CompareFormat::Json,
        ] {
            let _ = render(&c, f);
        }
    }
}

/// Saved flag schemas (`--sglang X.json`): read, then audited against.
pub fn flag_schema(data: &[u8]) {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let Ok(schema) = Schema::from_json(&v) else {
        return;
    };
    let args: Vec<String> = ["--tp", "2", "--cuda-graph-max-bs=8", "--model", "m", "--x"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let _ = audit(&schema, Some(&schema), &args);
    let _ = sglang_python::diff::diff(&schema, &schema);
}

fn small_schema() -> Schema {
    let v = serde_json::json!({"actions": [
        {"option_strings": ["--model-path", "--model"], "dest": "model_path", "nargs": null},
        {"option_strings": ["--tp-size", "--tp"], "dest": "tp_size", "nargs": null},
        {"option_strings": ["--cuda-graph-max-bs-decode"], "dest": "d", "nargs": null},
        {"option_strings": ["--cuda-graph-max-bs-prefill"], "dest": "p", "nargs": null},
        {"option_strings": ["--mode"], "dest": "mode", "nargs": "+", "choices": ["a", "b"]},
        {"option_strings": ["--flag"], "dest": "flag", "nargs": 0}
    ]});
    Schema::from_json(&v).unwrap_or_default()
}

/// The corpus of a target, in the repository.
pub fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target)
}

/// Tokens the mutator splices in: the syntax these parsers care about.
const TOKENS: &[&[u8]] = &[
    b"\n",
    b"\r\n",
    b"\n\n",
    b"'",
    b"\"",
    b"\\",
    b"(",
    b")",
    b"[",
    b"]",
    b"{",
    b"}",
    b"=",
    b",",
    b"data: ",
    b"[DONE]",
    b"$((",
    b"${",
    b"$(",
    b"|",
    b">",
    b"2>&1",
    b"&",
    b";",
    b"#",
    b"--",
    b"None",
    b"True",
    b"1e309",
    b"-0",
    b"\x1b[31m",
    b"\xff\xfe",
    b"[TP0]",
    b"[DP1 TP3 EP2]",
    b"server_args=ServerArgs(",
    b"Traceback (most recent call last):",
    b"python3 -m sglang.launch_server ",
    b"{\"meta_info\":{\"completion_tokens\":",
    b"\"usage\":{\"completion_tokens\":",
    b"18446744073709551615",
];

/// A small, seeded mutation fuzzer: the corpus first, then mutants of it until `budget` runs out.
/// Returns how many inputs ran. A failing input is written under `target/fuzz-failures/` and the
/// panic names it (add it to the corpus once fixed: it is then a regression test).
pub fn fuzz(target: &str, harness: Harness, budget: Duration, seed: u64) -> usize {
    let mut corpus: Vec<Vec<u8>> = std::fs::read_dir(corpus_dir(target))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| std::fs::read(e.path()).ok())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        !corpus.is_empty(),
        "no corpus for {target} in {}",
        corpus_dir(target).display()
    );
    corpus.sort();
    let mut ran = 0;
    for input in &corpus {
        check(target, harness, input);
        ran += 1;
    }
    let mut rng = seed ^ 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let end = Instant::now() + budget;
    while Instant::now() < end {
        let mut x = corpus[next() as usize % corpus.len()].clone();
        for _ in 0..1 + next() % 4 {
            mutate(&mut x, &corpus, &mut next);
        }
        check(target, harness, &x);
        ran += 1;
    }
    ran
}

fn mutate(x: &mut Vec<u8>, corpus: &[Vec<u8>], next: &mut impl FnMut() -> u64) {
    let pos = |n: &mut dyn FnMut() -> u64, len: usize| (n() as usize) % (len + 1);
    match next() % 7 {
        0 if !x.is_empty() => {
            let i = pos(next, x.len() - 1);
            x[i] ^= 1 << (next() % 8);
        }
        1 => {
            let i = pos(next, x.len());
            let t = TOKENS[next() as usize % TOKENS.len()];
            x.splice(i..i, t.iter().copied());
        }
        2 if !x.is_empty() => {
            let a = pos(next, x.len());
            let b = (a + 1 + next() as usize % 16).min(x.len());
            x.drain(a..b);
        }
        3 => {
            // Splice a piece of another input in.
            let o = &corpus[next() as usize % corpus.len()];
            let a = pos(next, o.len());
            let b = (a + next() as usize % 64).min(o.len());
            let i = pos(next, x.len());
            x.splice(i..i, o[a..b].iter().copied());
        }
        4 => {
            let n = pos(next, x.len());
            x.truncate(n);
        }
        5 if !x.is_empty() => {
            // Repeat a slice (deep nesting, long lines).
            let a = pos(next, x.len() - 1);
            let b = (a + 1 + next() as usize % 8).min(x.len());
            let piece = x[a..b].to_vec();
            for _ in 0..next() % 64 {
                x.splice(a..a, piece.iter().copied());
            }
        }
        _ => {
            let i = pos(next, x.len());
            x.insert(i, next() as u8);
        }
    }
}

fn check(target: &str, harness: Harness, input: &[u8]) {
    if std::panic::catch_unwind(|| harness(input)).is_err() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/fuzz-failures");
        let _ = std::fs::create_dir_all(&dir);
        let name = format!("{target}-{:016x}", fnv(input));
        let _ = std::fs::write(dir.join(&name), input);
        panic!(
            "{target}: harness failed on {} ({} bytes): {:?}",
            dir.join(name).display(),
            input.len(),
            String::from_utf8_lossy(&input[..input.len().min(400)])
        );
    }
}

fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, x| {
        (h ^ u64::from(*x)).wrapping_mul(0x100_0000_01b3)
    })
}
