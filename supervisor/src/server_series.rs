//! The server's own time series, read from its log's `Prefill batch` / `Decode batch` lines (with
//! or without `--enable-metrics`): running and queued requests, token usage, throughput, CUDA
//! graph on/off, per rank; and what it logged about memory pressure (retractions, CUDA OOM).
//!
//! Cost: the log readers hand over, once per read from the pipe, the latest batch line of each
//! (kind, rank) they saw in it, and only those are parsed here. At a real server's pace (a decode
//! line every 40 steps per rank) that is every line; in a flood it is one line per rank per read,
//! so the per-line hot path stays a prefix check and a copy. Memory is bounded: aggregates, plus
//! a series thinned by halving when it fills (the HTML report draws it).
use crate::logs::parse::{batch_fields, BatchKind};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use serde::Serialize;
use serde_json::{json, Map, Value};
use sglang_probes::sync;
use std::sync::{Arc, Mutex};

/// Points kept of the series (both kinds together); past this every other one is dropped.
const MAX_POINTS: usize = 4096;

/// What one batch line said (a field the line lacks is `None`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Sample {
    pub running: Option<f64>,
    pub queued: Option<f64>,
    pub token_usage: Option<f64>,
    /// `gen throughput (token/s)` of a decode line, `input throughput (token/s)` of a prefill.
    pub throughput: Option<f64>,
    pub cuda_graph: Option<bool>,
}

impl Sample {
    pub fn from_body(body: &[u8]) -> Sample {
        let f = batch_fields(&String::from_utf8_lossy(body));
        let num = |keys: &[&str]| keys.iter().find_map(|k| f.get(*k).and_then(Value::as_f64));
        Sample {
            running: num(&["#running-req"]),
            queued: num(&["#queue-req"]),
            // SWA/mamba models print `full token usage`.
            token_usage: num(&["token usage", "full token usage"]),
            throughput: num(&["gen throughput (token/s)", "input throughput (token/s)"]),
            // `cpu graph` / `npu graph` on other devices.
            cuda_graph: f
                .iter()
                .find(|(k, _)| k.ends_with(" graph"))
                .and_then(|(_, v)| v.as_bool()),
        }
    }
}

/// min / mean / max of one field.
#[derive(Debug, Clone, Copy, Default)]
struct Agg {
    n: u64,
    sum: f64,
    min: f64,
    max: f64,
}

impl Agg {
    fn add(&mut self, v: Option<f64>) {
        let Some(v) = v.filter(|v| v.is_finite()) else {
            return;
        };
        if self.n == 0 || v < self.min {
            self.min = v;
        }
        if self.n == 0 || v > self.max {
            self.max = v;
        }
        self.n += 1;
        self.sum += v;
    }

    fn json(&self) -> Value {
        if self.n == 0 {
            return Value::Null;
        }
        let r = |x: f64| (x * 1000.0).round() / 1000.0;
        json!({"min": r(self.min), "mean": r(self.sum / self.n as f64), "max": r(self.max)})
    }
}

/// Aggregates of one kind's samples.
#[derive(Debug, Clone, Copy, Default)]
struct KindStats {
    samples: u64,
    running: Agg,
    queued: Agg,
    token_usage: Agg,
    throughput: Agg,
    graph: Agg,
}

impl KindStats {
    fn add(&mut self, s: &Sample) {
        self.samples += 1;
        self.running.add(s.running);
        self.queued.add(s.queued);
        self.token_usage.add(s.token_usage);
        self.throughput.add(s.throughput);
        self.graph.add(s.cuda_graph.map(f64::from));
    }

    fn json(&self, throughput_name: &str) -> Value {
        let mut m = Map::new();
        m.insert("samples".into(), self.samples.into());
        m.insert("running_requests".into(), self.running.json());
        m.insert("queued_requests".into(), self.queued.json());
        m.insert("token_usage".into(), self.token_usage.json());
        m.insert(throughput_name.into(), self.throughput.json());
        // The share of lines with the graph on (a decode that falls off its graphs shows here).
        let share = (self.graph.n > 0)
            .then(|| (self.graph.sum / self.graph.n as f64 * 1000.0).round() / 1000.0);
        m.insert("cuda_graph_share".into(), json!(share));
        Value::Object(m)
    }
}

/// What the server logged about memory pressure.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Pressure {
    /// `KV cache pool is full. Retract requests.` lines.
    pub retractions: u64,
    /// Requests they retracted (`#retracted_reqs: N`).
    pub retracted_requests: u64,
    /// CUDA out-of-memory errors.
    pub cuda_oom: u64,
    /// The first such line, quoted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first: Option<String>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Stats {
    kinds: [KindStats; 2],
}

impl Stats {
    fn json(&self, lines: Option<[u64; 2]>, pressure: &Pressure) -> Value {
        let mut v = json!({
            "prefill": self.kinds[BatchKind::Prefill as usize].json("input_throughput"),
            "decode": self.kinds[BatchKind::Decode as usize].json("gen_throughput"),
            "pressure": pressure,
        });
        if let Some([p, d]) = lines {
            v["prefill"]["lines"] = p.into();
            v["decode"]["lines"] = d.into();
        }
        v
    }
}

#[derive(Debug, Default)]
struct Window {
    name: String,
    stats: Stats,
    pressure: Pressure,
}

/// One point of the kept series (columns in the event, to stay small).
#[derive(Debug, Clone)]
struct Point {
    unix: f64,
    kind: BatchKind,
    sample: Sample,
}

#[derive(Debug, Default)]
struct Inner {
    /// Batch lines seen, exactly (not only the sampled ones).
    lines: [u64; 2],
    latest: Vec<(BatchKind, Option<String>, Sample)>,
    run: Stats,
    pressure: Pressure,
    window: Option<Window>,
    points: Vec<Point>,
    /// Keep one point in `stride` (doubles each time the series fills).
    stride: u64,
    offered: u64,
}

#[derive(Debug, Default)]
pub struct ServerSeries {
    inner: Mutex<Inner>,
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

impl ServerSeries {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        sync::lock(&self.inner)
    }

    /// Batch lines counted by a reader since its last hand-over (all of them, sampled or not).
    pub fn count(&self, lines: [u64; 2]) {
        let mut i = self.lock();
        i.lines[0] += lines[0];
        i.lines[1] += lines[1];
    }

    /// The latest line of one (kind, rank) in a read: `body` is the text after `Decode batch,`.
    pub fn record(&self, kind: BatchKind, rank: Option<&str>, body: &[u8]) {
        self.record_at(kind, rank, Sample::from_body(body), unix_now());
    }

    fn record_at(&self, kind: BatchKind, rank: Option<&str>, sample: Sample, unix: f64) {
        let mut i = self.lock();
        match i
            .latest
            .iter_mut()
            .find(|(k, r, _)| *k == kind && r.as_deref() == rank)
        {
            Some(l) => l.2 = sample,
            None => i.latest.push((kind, rank.map(str::to_string), sample)),
        }
        i.run.kinds[kind as usize].add(&sample);
        if let Some(w) = &mut i.window {
            w.stats.kinds[kind as usize].add(&sample);
        }
        i.stride = i.stride.max(1);
        i.offered += 1;
        if i.offered.is_multiple_of(i.stride) {
            if i.points.len() >= MAX_POINTS {
                let mut n = 0;
                i.points.retain(|_| {
                    n += 1;
                    n % 2 == 0
                });
                i.stride *= 2;
            }
            i.points.push(Point { unix, kind, sample });
        }
    }

    /// A pressure line: `retracted` requests (0 for an OOM), quoting `line`.
    pub fn pressure(&self, retracted: Option<u64>, line: &str) {
        let mut i = self.lock();
        let bump = |p: &mut Pressure| {
            match retracted {
                Some(n) => {
                    p.retractions += 1;
                    p.retracted_requests += n;
                }
                None => p.cuda_oom += 1,
            }
            if p.first.is_none() {
                p.first = Some(line.chars().take(300).collect());
            }
        };
        bump(&mut i.pressure);
        if let Some(w) = &mut i.window {
            bump(&mut w.pressure);
        }
    }

    /// The whole run: aggregates per kind, pressure, and the kept series (for the HTML report).
    pub fn summary(&self) -> Value {
        let i = self.lock();
        let mut v = i.run.json(Some(i.lines), &i.pressure);
        let t0 = i.points.first().map_or(0.0, |p| p.unix);
        let col = |f: &dyn Fn(&Point) -> Value| -> Vec<Value> { i.points.iter().map(f).collect() };
        let r3 = |x: Option<f64>| x.map(|x| (x * 1000.0).round() / 1000.0);
        v["series"] = json!({
            "t0_unix": t0,
            "t_s": col(&|p| json!(r3(Some(p.unix - t0)))),
            "kind": col(&|p| json!(p.kind.as_str())),
            "running": col(&|p| json!(p.sample.running)),
            "queued": col(&|p| json!(p.sample.queued)),
            "token_usage": col(&|p| json!(p.sample.token_usage)),
            "throughput": col(&|p| json!(r3(p.sample.throughput))),
            "cuda_graph": col(&|p| json!(p.sample.cuda_graph)),
        });
        v
    }

    /// True once any batch or pressure line was seen.
    pub fn seen(&self) -> bool {
        let i = self.lock();
        i.lines != [0, 0] || i.pressure != Pressure::default()
    }
}

impl sglang_exporters::metrics::WindowPart for ServerSeries {
    fn start(&self, name: &str) {
        self.lock().window = Some(Window {
            name: name.to_string(),
            ..Window::default()
        });
    }

    fn stop(&self) -> Option<(String, &'static str, Value)> {
        let w = self.lock().window.take()?;
        Some((w.name, "server_batches", w.stats.json(None, &w.pressure)))
    }
}

/// A series for this run: its metrics in `registry`, its window statistics in every window.
pub fn register(
    registry: &mut prometheus_client::registry::Registry,
    metrics: &sglang_exporters::metrics::Shared,
) -> Arc<ServerSeries> {
    let series = Arc::new(ServerSeries::default());
    registry.register_collector(Box::new(SeriesCollector(series.clone())));
    metrics.add_window_part(series.clone());
    series
}

/// `/metrics`: the latest batch line's figures per (kind, rank), line counts, pressure counts.
#[derive(Debug)]
pub struct SeriesCollector(pub Arc<ServerSeries>);

type Labels = Vec<(String, String)>;

fn family<M: EncodeMetric>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: Vec<(Labels, M)>,
) -> Result<(), std::fmt::Error> {
    let Some(first) = rows.first() else {
        return Ok(()); // unknown is absent, never 0
    };
    let mut fam = enc.encode_descriptor(name, help, None, first.1.metric_type())?;
    for (labels, m) in &rows {
        m.encode(fam.encode_family(labels)?)?;
    }
    Ok(())
}

impl Collector for SeriesCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let i = self.0.lock();
        if i.lines == [0, 0] && i.pressure == Pressure::default() {
            return Ok(());
        }
        let labels = |k: BatchKind, r: &Option<String>| -> Labels {
            vec![
                ("kind".into(), k.as_str().into()),
                ("rank".into(), r.clone().unwrap_or_default()),
            ]
        };
        let gauges = |f: &dyn Fn(&Sample) -> Option<f64>| -> Vec<(Labels, ConstGauge<f64>)> {
            i.latest
                .iter()
                .filter_map(|(k, r, s)| f(s).map(|v| (labels(*k, r), ConstGauge::new(v))))
                .collect()
        };
        let per_kind = |n: [u64; 2]| -> Vec<(Labels, ConstCounter<u64>)> {
            [BatchKind::Prefill, BatchKind::Decode]
                .iter()
                .map(|k| {
                    (
                        vec![("kind".to_string(), k.as_str().to_string())],
                        ConstCounter::new(n[*k as usize]),
                    )
                })
                .collect()
        };
        family(
            &mut enc,
            "server_batch_lines",
            "Prefill/Decode batch lines the server logged",
            per_kind(i.lines),
        )?;
        family(
            &mut enc,
            "server_running_requests",
            "Running requests, from the server's latest batch line",
            gauges(&|s| s.running),
        )?;
        family(
            &mut enc,
            "server_queued_requests",
            "Queued requests, from the server's latest batch line",
            gauges(&|s| s.queued),
        )?;
        family(
            &mut enc,
            "server_token_usage_ratio",
            "KV cache token usage, from the server's latest batch line",
            gauges(&|s| s.token_usage),
        )?;
        family(
            &mut enc,
            "server_throughput_tokens_per_second",
            "Gen (decode) or input (prefill) throughput the server logged last",
            gauges(&|s| s.throughput),
        )?;
        family(
            &mut enc,
            "server_cuda_graph",
            "1 when the server's latest batch line ran with its CUDA graph",
            gauges(&|s| s.cuda_graph.map(f64::from)),
        )?;
        let p = &i.pressure;
        for (name, help, v) in [
            (
                "server_retractions",
                "KV-cache-full retractions the server logged",
                p.retractions,
            ),
            (
                "server_retracted_requests",
                "Requests retracted (#retracted_reqs)",
                p.retracted_requests,
            ),
            (
                "server_cuda_oom",
                "CUDA out-of-memory errors the server logged",
                p.cuda_oom,
            ),
        ] {
            family(&mut enc, name, help, vec![(vec![], ConstCounter::new(v))])?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sglang_exporters::metrics::WindowPart;

    const DECODE: &[u8] = b" #running-req: 32, #token: 18432, token usage: 0.02, cuda graph: True, gen throughput (token/s): 3120.55, #queue-req: 4";

    #[test]
    fn a_batch_line_gives_running_queued_usage_throughput_and_graph() {
        assert_eq!(
            Sample::from_body(DECODE),
            Sample {
                running: Some(32.0),
                queued: Some(4.0),
                token_usage: Some(0.02),
                throughput: Some(3120.55),
                cuda_graph: Some(true)
            }
        );
        let p = Sample::from_body(b" #new-seq: 1, #new-token: 510, #cached-token: 2, full token usage: 0.5, #running-req: 0, #queue-req: 0, #pending-token: 0, npu graph: False, input throughput (token/s): 1108.22");
        assert_eq!(
            (p.token_usage, p.cuda_graph, p.throughput),
            (Some(0.5), Some(false), Some(1108.22))
        );
        assert_eq!(Sample::from_body(b"garbage \xff"), Sample::default());
    }

    #[test]
    fn windows_keep_min_mean_max_of_their_own_lines_and_pressure() {
        let s = ServerSeries::default();
        let at = |running: f64| Sample {
            running: Some(running),
            cuda_graph: Some(running > 1.0),
            ..Sample::default()
        };
        s.record_at(BatchKind::Decode, Some("TP0"), at(1.0), 1.0);
        s.start("c8");
        s.record_at(BatchKind::Decode, Some("TP0"), at(8.0), 2.0);
        s.record_at(BatchKind::Decode, Some("TP1"), at(6.0), 3.0);
        s.pressure(
            Some(3),
            "KV cache pool is full. Retract requests. #retracted_reqs: 3",
        );
        let (name, key, w) = s.stop().expect("a window was open");
        assert_eq!((name.as_str(), key), ("c8", "server_batches"));
        assert_eq!(
            w["decode"]["running_requests"],
            json!({"min": 6.0, "mean": 7.0, "max": 8.0})
        );
        assert_eq!(w["decode"]["cuda_graph_share"], json!(1.0));
        assert_eq!(w["pressure"]["retracted_requests"], json!(3));
        assert!(s.stop().is_none(), "closed once");
        let run = s.summary();
        assert_eq!(run["decode"]["running_requests"]["min"], json!(1.0));
        assert_eq!(run["decode"]["cuda_graph_share"], json!(0.667));
        assert_eq!(run["series"]["t_s"], json!([0.0, 1.0, 2.0]));
    }

    #[test]
    fn the_kept_series_stays_bounded_however_long_the_run() {
        let s = ServerSeries::default();
        for n in 0..(MAX_POINTS * 5) {
            s.record_at(BatchKind::Decode, None, Sample::default(), n as f64);
        }
        let pts = s.lock().points.len();
        assert!(pts <= MAX_POINTS && pts > MAX_POINTS / 4, "{pts}");
        assert_eq!(
            s.summary()["decode"]["samples"],
            json!(MAX_POINTS as u64 * 5),
            "aggregates see every sample"
        );
    }
}
