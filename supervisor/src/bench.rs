//! A benchmark's own span: read a bench_serving / InferenceX benchmark_serving result, find the
//! span it measured, and recompute over exactly that span the request figures (from the requests
//! log) and power (InferenceX's verdict and trapezoid, the hardware counter beside it). Used by
//! `report --bench-result` (offline, from files) and `POST /-/window/stop?bench_result=PATH`
//! (live, from the sampler's kept rows); both assemble the same JSON here.
//!
//! The span: `benchmark_start_time_unix` → `benchmark_end_time_unix` when the result has them
//! (InferenceX's benchmark_serving.py writes them). SGLang's bench_serving does not: then the
//! span ends at the end of the last request in the requests log and lasts the result's
//! `duration` (bench_serving's duration runs from before its first request to after its last
//! response; the proxy sees each request a little after the client sent it, so this span covers
//! the benchmark's requests). The JSON says which (`span.source`) and how many requests of the log
//! started inside it next to the result's `completed`.
use serde_json::{json, Map, Value};
use sglang_exporters::proxy::RequestRecord;
use sglang_probes::inferencex::{self, BenchFields};
use sglang_probes::sampler::SpanPower;
use std::path::Path;

/// A benchmark result as read.
#[derive(Debug, Clone)]
pub struct BenchResult {
    pub path: String,
    pub fields: BenchFields,
}

/// Read a result file (one JSON document, or JSON lines: the last line), tolerating Python's
/// `NaN`/`Infinity`. The error is one line naming the file and what to do.
pub fn load(path: &Path) -> Result<BenchResult, String> {
    let text = crate::input_file::read_to_string(path).map_err(|e| {
        format!(
            "--bench-result {}: cannot read it ({e}); pass the JSON file bench_serving or benchmark_serving.py saved (--save-result)",
            path.display()
        )
    })?;
    let v = crate::pyjson::parse_result(&text).map_err(|e| {
        format!(
            "--bench-result {}: not JSON ({e}); pass the result file bench_serving / benchmark_serving.py wrote",
            path.display()
        )
    })?;
    let Some(o) = v.as_object() else {
        return Err(format!(
            "--bench-result {}: expected one benchmark result object (an aggregated array is not a single run's result)",
            path.display()
        ));
    };
    Ok(BenchResult {
        path: path.display().to_string(),
        fields: fields(o),
    })
}

/// The fields InferenceX reads, with its types: numbers for the span and duration, integers for
/// the counts (a `256.0` is not a count).
pub fn fields(o: &Map<String, Value>) -> BenchFields {
    let num = |k: &str| o.get(k).and_then(Value::as_f64);
    let int = |k: &str| o.get(k).and_then(Value::as_i64);
    BenchFields {
        start_unix: num("benchmark_start_time_unix"),
        end_unix: num("benchmark_end_time_unix"),
        duration: num("duration"),
        completed: int("completed"),
        total_input_tokens: int("total_input_tokens"),
        total_output_tokens: int("total_output_tokens"),
    }
}

/// The longest requests-log line read (64 MiB: a request of 4M tokens and their ITLs); a
/// longer one counts as a line that is not a request.
const MAX_RECORD_LINE: usize = 64 << 20;

/// What a benchmark's span is found from: a request's times, outcome and output tokens. Its
/// ITLs, most of a record's bytes, are checked but not kept: a sweep's log of 8k-token requests
/// holds hundreds of MB of them, and the span needs none. Every field of [`RequestRecord`] is
/// read with its type, so a line is a request here exactly when it is one there.
#[derive(Debug, Clone, serde::Deserialize)]
#[allow(dead_code)] // read to check the line as RequestRecord would, not used
pub struct SpanRecord {
    ts: Text,
    pub start_unix: f64,
    endpoint: Text,
    pub status: u16,
    stream: bool,
    #[serde(default)]
    ttft_s: Option<f64>,
    #[serde(default)]
    tpot_s: Option<f64>,
    pub e2e_s: f64,
    #[serde(default)]
    itl_s: Numbers,
    prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    #[serde(default)]
    error: Option<Text>,
}

/// A string checked and not kept.
#[derive(Debug, Clone)]
struct Text;

impl<'de> serde::Deserialize<'de> for Text {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Any;
        impl serde::de::Visitor<'_> for Any {
            type Value = Text;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Text, E> {
                Ok(Text)
            }
        }
        d.deserialize_str(Any)
    }
}

/// A list of numbers checked one by one and not kept.
#[derive(Debug, Clone, Default)]
struct Numbers;

impl<'de> serde::Deserialize<'de> for Numbers {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Each;
        impl<'de> serde::de::Visitor<'de> for Each {
            type Value = Numbers;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of numbers")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Numbers, A::Error> {
                while seq.next_element::<f64>()?.is_some() {}
                Ok(Numbers)
            }
        }
        d.deserialize_seq(Each)
    }
}

impl SpanRecord {
    fn failed(&self) -> bool {
        self.error.is_some() || self.status >= 400
    }
}

/// A line of the log that is a request: its times are numbers, and none of its durations is
/// negative (a hand-edited or foreign line; one would pull every mean below what was measured).
trait Request: serde::de::DeserializeOwned {
    /// Its start, E2E, TTFT and TPOT.
    fn times(&self) -> (f64, f64, Option<f64>, Option<f64>);

    fn timed(&self) -> bool {
        let (start, e2e, ttft, tpot) = self.times();
        let duration = |d: f64| d.is_finite() && d >= 0.0;
        start.is_finite() && duration(e2e) && ttft.is_none_or(duration) && tpot.is_none_or(duration)
    }
}

impl Request for SpanRecord {
    fn times(&self) -> (f64, f64, Option<f64>, Option<f64>) {
        (self.start_unix, self.e2e_s, self.ttft_s, self.tpot_s)
    }
}

impl Request for RequestRecord {
    fn times(&self) -> (f64, f64, Option<f64>, Option<f64>) {
        (self.start_unix, self.e2e_s, self.ttft_s, self.tpot_s)
    }
}

/// The requests log, opened for reading, or the one-line error.
struct Log<'a> {
    path: &'a Path,
    file: std::fs::File,
}

impl<'a> Log<'a> {
    fn open(path: &'a Path) -> Result<Log<'a>, String> {
        let file = crate::input_file::open(path).map_err(|e| Log::cannot(path, &e))?;
        Ok(Log { path, file })
    }

    fn cannot(path: &Path, e: &dyn std::fmt::Display) -> String {
        format!(
            "--requests-log {}: cannot read it ({e}); pass the file `run --requests-log` wrote",
            path.display()
        )
    }
}

/// Each request of a requests log (JSON lines), one at a time, to `each`, from its start: up to
/// `upto` bytes, or (None) to its end; returns how many lines were not requests and how many bytes
/// were read. A day's log is hundreds of MB: nothing of it is held here.
fn each_request<T: Request>(
    log: &Log,
    upto: Option<u64>,
    mut each: impl FnMut(T),
) -> Result<(usize, u64), String> {
    use sglang_probes::lines::{CappedLines, Line};
    use std::io::{Read, Seek};
    let cannot = |e: &dyn std::fmt::Display| Log::cannot(log.path, e);
    let mut file = &log.file;
    file.seek(std::io::SeekFrom::Start(0))
        .map_err(|e| cannot(&e))?;
    let reader = std::io::BufReader::with_capacity(1 << 16, file.take(upto.unwrap_or(u64::MAX)));
    let mut bad = 0;
    for (i, line) in CappedLines::new(reader, MAX_RECORD_LINE).enumerate() {
        let line = match line.map_err(|e| cannot(&e))? {
            Line::Text(t) => t,
            Line::TooLong => {
                bad += 1;
                continue;
            }
        };
        // A byte-order mark an editor left in front of the first record.
        let line = if i == 0 {
            line.trim_start_matches('\u{feff}')
        } else {
            &line
        };
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<T>(line) {
            Ok(r) if r.timed() => each(r),
            _ => bad += 1,
        }
    }
    // Read to its end (or `upto`): where the file's offset stands is how much that was.
    let read = file.stream_position().map_err(|e| cannot(&e))?;
    Ok((bad, read))
}

/// Each record of a requests log in turn, none kept: what a reader that wants a few figures of
/// each needs (a long run's log holds every inter-token latency). Returns how many lines were
/// not requests.
pub fn for_each_request(path: &Path, each: impl FnMut(RequestRecord)) -> Result<usize, String> {
    Ok(each_request(&Log::open(path)?, None, each)?.0)
}

/// A requests log as first read for a benchmark's span: what of each request the span is found
/// from, how many lines were not requests, and how much of the file that was. The file stays
/// open: the second read is of the same file (renamed, replaced or deleted since, as a rotated
/// log is) and of the same bytes (a live run appends).
pub struct SpanLog<'a> {
    log: Log<'a>,
    pub records: Vec<SpanRecord>,
    pub bad: usize,
    len: u64,
}

impl<'a> SpanLog<'a> {
    pub fn read(path: &'a Path) -> Result<SpanLog<'a>, String> {
        let log = Log::open(path)?;
        let mut records = Vec::new();
        let (bad, len) = each_request(&log, None, |r| records.push(r))?;
        Ok(SpanLog {
            log,
            records,
            bad,
            len,
        })
    }

    /// The request figures over a span, the same bytes read again a request at a time: the
    /// ITLs are held only as the window keeps them.
    pub fn summary(&self, span: (f64, f64), gpus: Option<usize>) -> Result<Value, String> {
        let mut figures = sglang_exporters::report::SpanSummary::new(span);
        each_request(&self.log, Some(self.len), |r: RequestRecord| {
            figures.add(&r)
        })?;
        Ok(figures.summary(gpus))
    }
}

/// The benchmark's span and where it came from. `Err`: no span can be had (one line, what to do).
pub fn span(b: &BenchResult, records: Option<&[SpanRecord]>) -> Result<(f64, f64, Value), String> {
    let f = &b.fields;
    if let (Some(s), Some(e)) = (f.start_unix, f.end_unix) {
        return Ok((s, e, json!({"source": "bench_result"})));
    }
    let Some(duration) = f.duration.filter(|d| d.is_finite() && *d > 0.0) else {
        return Err(format!(
            "--bench-result {}: neither benchmark_start_time_unix/benchmark_end_time_unix nor a duration; pass a bench_serving or benchmark_serving.py result",
            b.path
        ));
    };
    let Some(records) = records.filter(|r| !r.is_empty()) else {
        return Err(format!(
            "--bench-result {}: has no benchmark_start_time_unix/benchmark_end_time_unix (SGLang's bench_serving); pass --requests-log too, the span is derived from its requests",
            b.path
        ));
    };
    let Some((end, matched)) = derived_end(records, duration, f) else {
        return Err(format!(
            "--bench-result {}: no run of {} requests in the requests log fits it; pass the requests log of the run that served this benchmark",
            b.path,
            f.completed.unwrap_or(0)
        ));
    };
    let start = end - duration;
    let inside = records
        .iter()
        .filter(|r| r.start_unix >= start && r.start_unix <= end)
        .count();
    Ok((
        start,
        end,
        json!({
            "source": "derived: the result's duration, ending at the end of the run of requests that matches it in the requests log",
            "matched_by": matched,
            "requests_in_span": inside,
            "completed_in_result": f.completed,
        }),
    ))
}

/// Where a result without its own times ended, in a requests log that may hold several
/// benchmarks (a sweep) and their warm-up requests: of every run of `completed` successful
/// requests consecutive by start, the ones whose completion tokens add up to the result's
/// `total_output_tokens` (when both are known), then the one whose span (first start to last
/// end) is closest to the result's `duration`, the latest on a tie. Returns its last end and what
/// matched. Without `completed`, the log's last end.
fn derived_end(
    records: &[SpanRecord],
    duration: f64,
    f: &BenchFields,
) -> Option<(f64, &'static str)> {
    let end_of = |r: &SpanRecord| r.start_unix + r.e2e_s;
    let mut ok: Vec<&SpanRecord> = records.iter().filter(|r| !r.failed()).collect();
    ok.sort_by(|a, b| a.start_unix.total_cmp(&b.start_unix));
    let n = f
        .completed
        .and_then(|c| usize::try_from(c).ok())
        .filter(|c| *c > 0);
    let Some(n) = n.filter(|n| *n <= ok.len()) else {
        let last = records.iter().map(end_of).fold(f64::NEG_INFINITY, f64::max);
        return last
            .is_finite()
            .then_some((last, "the log's last request (no completed count)"));
    };
    // Sliding window over runs of n: token sums by prefix sums, the last end by a monotonic deque.
    let mut prefix = vec![Some(0u64)];
    for r in &ok {
        let prev = prefix.last().copied().flatten();
        prefix.push(prev.zip(r.completion_tokens).map(|(a, b)| a + b));
    }
    let want_tokens = f.total_output_tokens.and_then(|t| u64::try_from(t).ok());
    let mut best: Option<(bool, f64, f64)> = None; // (tokens match, -|span - duration|, end)
    let mut deque: std::collections::VecDeque<usize> = std::collections::VecDeque::new();
    for j in 0..ok.len() {
        while deque
            .back()
            .is_some_and(|&k| end_of(ok[k]) <= end_of(ok[j]))
        {
            deque.pop_back();
        }
        deque.push_back(j);
        if j + 1 < n {
            continue;
        }
        let i = j + 1 - n;
        while deque.front().is_some_and(|&k| k < i) {
            deque.pop_front();
        }
        let end = deque.front().map(|&k| end_of(ok[k]))?;
        let tokens = prefix[j + 1].zip(prefix[i]).map(|(b, a)| b - a);
        let matches = want_tokens.is_some() && tokens == want_tokens;
        let key = (matches, -(end - ok[i].start_unix - duration).abs(), end);
        if best.is_none_or(|b| (key.0, key.1) >= (b.0, b.1)) {
            best = Some(key);
        }
    }
    best.map(|(m, _, end)| {
        let how = if m {
            "completed count, total output tokens and duration"
        } else {
            "completed count and duration"
        };
        (end, how)
    })
}

/// The bench window's JSON: name, the result's path, the span, request figures over it (when the
/// requests log is given, with the count of its lines that were not requests), power over it
/// (when telemetry is), with InferenceX's energy per token.
pub fn assemble(
    name: &str,
    b: &BenchResult,
    (start, end, source): (f64, f64, Value),
    requests: Option<&SpanLog>,
    power: Option<SpanPower>,
    gpus: Option<usize>,
) -> Value {
    let mut w = json!({
        "name": name,
        "bench_result": b.path,
        "span": {
            "benchmark_start_time_unix": start,
            "benchmark_end_time_unix": end,
            "duration": end - start,
        },
    });
    if let (Some(o), Some(src)) = (w["span"].as_object_mut(), source.as_object()) {
        o.extend(src.clone());
    }
    if let Some(log) = requests {
        // (read once already for the span: an error now is the file changing under us)
        let mut r = log
            .summary((start, end), gpus)
            .unwrap_or_else(|e| json!({ "error": e }));
        if log.bad > 0 {
            r["requests_log_bad_lines"] = log.bad.into();
        }
        w["requests"] = r;
    }
    if let Some(p) = power {
        // InferenceX's own checks of the result come first, as in aggregate_power.py.
        let f = &b.fields;
        let bench_fields = BenchFields {
            start_unix: Some(start),
            end_unix: Some(end),
            ..f.clone()
        };
        let leading = match inferencex::bench_reasons(&bench_fields) {
            Ok((_, r)) => r,
            Err(r) => vec![r],
        };
        let verdict = p.inferencex.with_leading_reasons(&leading);
        let count = |n: Option<i64>| n.and_then(|n| u64::try_from(n).ok());
        let per_token = inferencex::per_token(
            &verdict,
            count(f.completed),
            count(f.total_input_tokens),
            count(f.total_output_tokens),
        );
        let mut v = serde_json::to_value(SpanPower {
            inferencex: verdict,
            energy_counter: p.energy_counter,
        })
        .unwrap_or(Value::Null);
        for (k, x) in per_token {
            v[k] = x.into();
        }
        w["power"] = v;
    }
    w
}

/// Power over a span from files: the power CSV, and the counter readings of its sidecar when
/// there is one (`<stem>_energy.csv`, written by `run --power-csv`).
pub fn power_from_files(csv: &Path, span: (f64, f64), expected: Option<usize>) -> SpanPower {
    let inferencex = inferencex::verdict_of_csv(csv, span, expected, inferencex::MAX_SAMPLE_GAP_S);
    let energy_counter = std::fs::read_to_string(inferencex::energy_sidecar(csv))
        .ok()
        .and_then(|t| inferencex::counter_energy(&inferencex::parse_energy_csv(&t), span));
    SpanPower {
        inferencex,
        energy_counter,
    }
}

/// `POST /-/window/stop?bench_result=PATH`: the bench window from the live sampler's kept rows and
/// the requests log (`run --requests-log`), or `{"error": ...}` saying what is wrong.
pub fn live(
    path: &str,
    sampler: Option<&sglang_probes::sampler::SamplerHandle>,
    requests_log: Option<&Path>,
) -> Value {
    let eval = || -> Result<Value, String> {
        let b = load(Path::new(path))?;
        let requests = requests_log.map(SpanLog::read).transpose()?;
        let span = span(&b, requests.as_ref().map(|l| l.records.as_slice()))?;
        let power = sampler.map(|s| s.power_over((span.0, span.1)));
        let gpus = sampler.map(|s| s.latest().len()).filter(|n| *n > 0);
        let mut w = assemble("bench", &b, span, requests.as_ref(), power, gpus);
        if requests_log.is_none() {
            w["requests_note"] =
                "no --requests-log in this run: the request figures over the benchmark's span need it"
                    .into();
        }
        Ok(w)
    };
    eval().unwrap_or_else(|e| json!({ "error": e }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(start: f64, e2e: f64, tokens: u64) -> RequestRecord {
        RequestRecord {
            ts: String::new(),
            start_unix: start,
            endpoint: "/generate".into(),
            status: 200,
            stream: true,
            ttft_s: Some(0.01),
            tpot_s: None,
            e2e_s: e2e,
            itl_s: Vec::new(),
            prompt_tokens: Some(10),
            completion_tokens: Some(tokens),
            error: None,
        }
    }

    /// What the span is found from, as read back from the lines the proxy wrote.
    /// The requests of a requests log, whole, and how many lines were not requests.
    fn read_requests_log(path: &Path) -> Result<(Vec<RequestRecord>, usize), String> {
        let mut records = Vec::new();
        let bad = for_each_request(path, |r| records.push(r))?;
        Ok((records, bad))
    }

    fn span_records(log: &[RequestRecord]) -> Vec<SpanRecord> {
        log.iter()
            .map(|r| serde_json::from_slice(&serde_json::to_vec(r).unwrap()).unwrap())
            .collect()
    }

    fn result(duration: f64, completed: i64, tokens: i64) -> BenchResult {
        BenchResult {
            path: "bench.jsonl".into(),
            fields: BenchFields {
                duration: Some(duration),
                completed: Some(completed),
                total_output_tokens: Some(tokens),
                ..Default::default()
            },
        }
    }

    #[test]
    fn a_sweeps_first_benchmark_is_found_in_a_log_that_holds_the_next_one_too() {
        // Warm-up, benchmark A (4 requests, 2 s), warm-up, benchmark B (4 requests, 3 s).
        let log = [
            req(100.0, 0.5, 7),
            req(101.0, 1.0, 10),
            req(101.1, 1.5, 20),
            req(101.2, 1.8, 30),
            req(101.3, 1.7, 40),
            req(110.0, 0.5, 7),
            req(111.0, 2.0, 11),
            req(111.2, 2.5, 21),
            req(111.4, 2.8, 31),
            req(111.6, 2.4, 41),
        ];
        let log = span_records(&log);
        let (start, end, source) = span(&result(2.05, 4, 100), Some(&log)).unwrap();
        assert_eq!(end, 103.0, "benchmark A's last end, not the log's");
        assert!((start - 100.95).abs() < 1e-9);
        assert_eq!(source["requests_in_span"], 4, "{source}");
        assert_eq!(
            source["matched_by"],
            "completed count, total output tokens and duration"
        );
        let (_, end, _) = span(&result(3.3, 4, 104), Some(&log)).unwrap();
        assert_eq!(end, 114.2, "benchmark B");
    }

    #[test]
    fn a_span_record_reads_a_requests_outcome_without_its_itls() {
        let mut ok = req(100.0, 0.5, 7);
        ok.itl_s = vec![0.01; 4096];
        let mut left = req(101.0, 0.5, 7);
        left.error = Some("client disconnected".into());
        let mut refused = req(102.0, 0.5, 7);
        refused.status = 503;
        let read = span_records(&[ok, left, refused]);
        let failed: Vec<bool> = read.iter().map(SpanRecord::failed).collect();
        assert_eq!(failed, [false, true, true]);
        assert_eq!(read[0].completion_tokens, Some(7));
        assert_eq!((read[0].start_unix, read[0].e2e_s), (100.0, 0.5));
    }

    #[test]
    fn the_figures_are_read_from_the_same_bytes_as_the_span_though_the_log_grows() {
        // A live run's proxy appends while `window/stop?bench_result=` reads the log twice.
        let path =
            std::env::temp_dir().join(format!("sglsup-spanlog-{}.jsonl", std::process::id()));
        let line = |r: &RequestRecord| [serde_json::to_vec(r).unwrap(), b"\n".to_vec()].concat();
        let first: Vec<u8> = [req(100.0, 0.5, 7), req(100.5, 0.5, 7)]
            .iter()
            .flat_map(line)
            .collect();
        std::fs::write(&path, first).unwrap();
        let log = SpanLog::read(&path).unwrap();
        // a request begun inside the span, logged after the first read
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        std::io::Write::write_all(&mut file, &line(&req(100.7, 0.1, 7))).unwrap();
        let figures = log.summary((100.0, 101.0), None).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!((log.records.len(), log.bad), (2, 0));
        assert_eq!(figures["completed"], 2, "{figures}");
    }

    #[test]
    fn the_figures_come_from_the_file_first_read_though_its_name_now_holds_another() {
        // A rotated log: renamed away and replaced (or deleted) between the two reads.
        let dir = std::env::temp_dir().join(format!("sglsup-spanlog-rot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("requests.jsonl");
        let text: Vec<u8> = [req(100.0, 0.5, 7), req(100.5, 0.5, 7)]
            .iter()
            .flat_map(|r| [serde_json::to_vec(r).unwrap(), b"\n".to_vec()].concat())
            .collect();
        std::fs::write(&path, &text).unwrap();
        let log = SpanLog::read(&path).unwrap();
        std::fs::rename(&path, dir.join("requests.jsonl.1")).unwrap();
        std::fs::write(&path, b"").unwrap();
        let figures = log.summary((100.0, 101.0), None).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(figures["completed"], 2, "{figures}");
    }

    #[test]
    fn a_file_that_says_it_is_empty_is_read_to_its_end() {
        // /proc files (and some network filesystems) give a size of 0 for what they hold
        let (records, bad) = read_requests_log(Path::new("/proc/self/status")).unwrap();
        assert!(records.is_empty());
        assert!(
            bad > 5,
            "every line of /proc/self/status read, none a request: {bad}"
        );
    }

    #[test]
    fn a_line_with_a_negative_duration_is_counted_as_no_request() {
        let dir = std::env::temp_dir().join(format!("sglsup-reqlog-neg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("requests.jsonl");
        let good = serde_json::to_value(req(100.0, 0.5, 7)).unwrap();
        let mut text = format!("{good}\n");
        for (field, value) in [("e2e_s", -1.0), ("ttft_s", -5.0), ("tpot_s", -0.001)] {
            let mut bad = good.clone();
            bad[field] = json!(value);
            text.push_str(&format!("{bad}\n"));
        }
        let mut zero = good.clone();
        zero["ttft_s"] = json!(0.0);
        text.push_str(&format!("{zero}\n"));
        std::fs::write(&log, text).unwrap();
        let (records, bad) = read_requests_log(&log).unwrap();
        assert_eq!((records.len(), bad), (2, 3));
        let span = SpanLog::read(&log).unwrap();
        assert_eq!((span.records.len(), span.bad), (2, 3));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_line_is_a_request_for_the_span_exactly_when_it_is_one_for_the_figures() {
        let good = serde_json::to_value(req(100.0, 0.5, 7)).unwrap();
        let mut lines = vec![good.clone()];
        for (field, value) in [
            ("ts", Value::Null),
            ("endpoint", json!(3)),
            ("stream", json!("yes")),
            ("status", json!(70_000)),
            ("error", json!({"why": "x"})),
            ("itl_s", json!([0.1, "0.2"])),
            ("itl_s", Value::Null),
            ("ttft_s", json!("fast")),
            ("prompt_tokens", json!(-1)),
            ("completion_tokens", json!(1.5)),
        ] {
            let mut bad = good.clone();
            bad[field] = value;
            lines.push(bad);
        }
        let mut missing = good.clone();
        missing.as_object_mut().unwrap().remove("stream");
        lines.push(missing);
        for line in &lines {
            let text = line.to_string();
            let full = serde_json::from_str::<RequestRecord>(&text).is_ok();
            let light = serde_json::from_str::<SpanRecord>(&text).is_ok();
            assert_eq!(light, full, "{text}");
        }
        assert!(serde_json::from_str::<SpanRecord>(&good.to_string()).is_ok());
    }

    #[test]
    fn without_token_totals_the_duration_decides() {
        let log = span_records(&[req(100.0, 0.5, 7), req(101.0, 1.0, 10), req(101.1, 1.0, 10)]);
        let mut b = result(1.1, 2, 0);
        b.fields.total_output_tokens = None;
        let (_, end, source) = span(&b, Some(&log)).unwrap();
        assert_eq!(end, 102.1);
        assert_eq!(source["matched_by"], "completed count and duration");
    }

    #[test]
    fn a_requests_log_that_is_no_regular_file_is_refused_and_odd_lines_are_counted() {
        let dir = std::env::temp_dir().join(format!("sglsup-reqlog-odd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let err = read_requests_log(&dir).unwrap_err();
        assert!(err.contains("not a regular file"), "{err}");
        let fifo = dir.join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        // refused before it is opened: opening a FIFO nobody writes would block
        assert!(read_requests_log(&fifo)
            .unwrap_err()
            .contains("not a regular file"));
        let log = dir.join("requests.jsonl");
        let mut text = b"\xef\xbb\xbf".to_vec(); // a byte-order mark before the first record
        for s in [1.0, 2.0] {
            text.extend(serde_json::to_vec(&req(1_796_289_988.0 + s, 0.5, 4)).unwrap());
            text.extend(b"\r\n");
        }
        text.extend(b"not json\n");
        std::fs::write(&log, &text).unwrap();
        let (records, bad) = read_requests_log(&log).unwrap();
        assert_eq!((records.len(), bad), (2, 1));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_requests_log_reads_back_the_exact_times_the_proxy_wrote() {
        // A start the proxy logged that a fast (not round-trip) float parser reads one ULP low,
        // then a sweep of unix times like it (about one in eight misread so).
        let mut starts = vec![1_796_289_988.837_783_3];
        starts.extend((0..20_000).map(|i| 1_796_289_988.0 + f64::from(i) * 0.000_123_7));
        let mut text = Vec::new();
        for (i, s) in starts.iter().enumerate() {
            // Written as the proxy writes a line.
            text.extend(
                serde_json::to_vec(&req(*s, 0.01 + f64::from(i as u32) * 1e-7, 4)).unwrap(),
            );
            text.push(b'\n');
        }
        let path = std::env::temp_dir().join(format!("sglsup-reqlog-{}.jsonl", std::process::id()));
        std::fs::write(&path, text).unwrap();
        let (back, bad) = read_requests_log(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!((back.len(), bad), (starts.len(), 0));
        let misread: Vec<(f64, f64)> = starts
            .iter()
            .zip(&back)
            .filter(|(s, r)| s.to_bits() != r.start_unix.to_bits())
            .map(|(s, r)| (*s, r.start_unix))
            .take(3)
            .collect();
        assert!(misread.is_empty(), "written, read back: {misread:?}");
        for (i, r) in back.iter().enumerate() {
            let e2e = 0.01 + f64::from(i as u32) * 1e-7;
            assert_eq!(r.e2e_s.to_bits(), e2e.to_bits(), "e2e {e2e}");
        }
    }
}
