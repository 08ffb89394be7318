//! `compare BASELINE CANDIDATE`: the image-bump table without hand work. Inputs, in any pairing:
//! bench_serving result files as it writes them (JSON lines, Python's `Infinity`/`NaN`, with or
//! without `--output-details`), InferenceX raw and aggregated result JSON (one result or the
//! array), and our `--report` files. Windows are matched by name / concurrency; latencies are
//! kept and printed in ms whatever the input's unit; mismatched identities are refused unless
//! `--force`.
use crate::cli::{CompareArgs, CompareFormat, CompareOutput};
use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// (field, label, higher is better). Latencies are ms, as bench_serving prints them.
const METRICS: &[(&str, &str, bool)] = &[
    ("tput_per_gpu", "Total tok/s/GPU", true),
    ("output_tput_per_gpu", "Output tok/s/GPU", true),
    ("total_token_throughput", "Total tok/s", true),
    ("output_throughput", "Output tok/s", true),
    ("request_throughput", "Requests/s", true),
    ("median_ttft_ms", "Median TTFT (ms)", false),
    ("p99_ttft_ms", "P99 TTFT (ms)", false),
    ("median_tpot_ms", "Median TPOT (ms)", false),
    ("median_itl_ms", "Median ITL (ms)", false),
    ("median_e2el_ms", "Median E2E (ms)", false),
    ("p99_e2el_ms", "P99 E2E (ms)", false),
    ("median_intvty", "Median interactivity (tok/s/user)", true),
    (
        "energy_per_output_token_j",
        "Energy per output token (J)",
        false,
    ),
];

/// Identity fields that must agree (unless --force).
const IDENTITY: &[&str] = &["model", "gpu_count", "isl", "osl", "precision"];

/// Resolved args whose change says nothing about the image (ports, seeds, paths of this run), and
/// the parts of bench_serving's `server_info` that are state, not configuration.
const NOISY_ARGS: &[&str] = &[
    "host",
    "port",
    "random_seed",
    "nccl_port",
    "dist_init_addr",
    "file_storage_path",
    "internal_states",
    "version",
];

/// Latency statistics as bench_serving / InferenceX name them (`p99.9_ttft`).
const STATS: &[&str] = &["mean", "median", "std", "p90", "p95", "p99", "p99.9"];
const LATENCIES: &[&str] = &["ttft", "tpot", "itl", "e2el"];

/// One input, normalised.
#[derive(Debug, Default)]
pub struct RunData {
    pub identity: Map<String, Value>,
    /// (window key: "c8", "rps4", or a report's window name; metric → value), in file order.
    pub windows: Vec<(String, BTreeMap<String, f64>)>,
    pub args: Map<String, Value>,
    pub deprecations: Vec<String>,
    pub startup_s: Option<f64>,
}

impl RunData {
    /// A later result for the same key replaces the earlier one: bench_serving appends reruns to
    /// the same file, and the last line is the run.
    fn put_window(&mut self, key: String, metrics: BTreeMap<String, f64>) {
        match self.windows.iter_mut().find(|(k, _)| *k == key) {
            Some(w) => w.1 = metrics,
            None => self.windows.push((key, metrics)),
        }
    }

    fn window(&self, key: &str) -> Option<&BTreeMap<String, f64>> {
        self.windows.iter().find(|(k, _)| k == key).map(|(_, m)| m)
    }
}

/// A finite number, from a JSON number or a numeric string (`--metadata tp=8` writes strings).
/// NaN and infinities are no measurement: absent, never 0.
fn num(v: &Value) -> Option<f64> {
    v.as_f64()
        .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
        .filter(|x: &f64| x.is_finite())
}

/// The JSON values of a file: one document (a report, an InferenceX result or array) or JSON
/// lines (bench_serving appends one result per run).
fn parse_values(text: &str) -> Result<Vec<Value>> {
    let values = crate::pyjson::values(text).context(
        "not JSON or JSON lines (expected a bench_serving result file, an InferenceX result \
             or aggregate, or a --report of sglang-supervisor)",
    )?;
    if values.is_empty() {
        bail!("empty: no result in it (did the benchmark finish writing?)");
    }
    Ok(values)
}

fn load(path: &Path) -> Result<RunData> {
    let what = || {
        format!(
            "{} (expected a bench_serving result, an InferenceX result or aggregate, or a \
             --report of sglang-supervisor)",
            path.display()
        )
    };
    let text = crate::input_file::read_to_string(path).with_context(what)?;
    parse_run(&text).with_context(what)
}

fn is_report(v: &Value) -> bool {
    v.get("schema_version").is_some() && v.get("windows").is_some()
}

/// A run from the text of a report of ours, a bench_serving result file (JSON lines), or an
/// InferenceX result (raw or aggregated, alone or in an array).
pub fn parse_run(text: &str) -> Result<RunData> {
    let values = parse_values(text)?;
    if let [v] = values.as_slice() {
        if is_report(v) {
            return from_report(v);
        }
    }
    let mut run = RunData::default();
    for (n, v) in values.iter().enumerate() {
        let items: Vec<&Value> = match v {
            Value::Array(a) => a.iter().collect(),
            other => vec![other],
        };
        for it in items {
            let Some(o) = it.as_object().filter(|o| !is_report(it) && !o.is_empty()) else {
                bail!(
                    "value {} is not a benchmark result object (a report must be alone in its \
                     file; results are objects, one per line or in one array)",
                    n + 1
                );
            };
            add_result(&mut run, o);
        }
    }
    let known = |m: &BTreeMap<String, f64>| METRICS.iter().any(|(k, _, _)| m.contains_key(*k));
    if !run.windows.iter().any(|(_, m)| known(m)) {
        bail!(
            "no benchmark metrics in it (expected fields such as median_ttft_ms, \
             output_throughput or tput_per_gpu)"
        );
    }
    Ok(run)
}

/// A count as JSON: `8`, not `8.0`, in the refusal and the output.
fn count(x: f64) -> Value {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        json!(x as i64)
    } else {
        json!(x)
    }
}

/// GPUs a server uses, from its resolved args (a report's server_args, bench_serving's
/// server_info): TP × PP, × DP unless DP attention runs inside the TP group.
fn gpus_of_args(args: &Map<String, Value>) -> Option<f64> {
    let tp = args.get("tp_size").and_then(num)?;
    let pp = args.get("pp_size").and_then(num).unwrap_or(1.0);
    let dp_attention = args.get("enable_dp_attention").and_then(Value::as_bool) == Some(true);
    let dp = match args.get("dp_size").and_then(num) {
        Some(dp) if !dp_attention => dp,
        _ => 1.0,
    };
    Some(tp * pp * dp)
}

/// One bench_serving line / InferenceX result into the run: a window and the identity.
fn add_result(run: &mut RunData, o: &Map<String, Value>) {
    // bench_serving stores the server's /server_info (its resolved args) in every line.
    let info = o.get("server_info").and_then(Value::as_object);
    if let Some(info) = info {
        run.args = info.clone();
        if let Some(v) = info.get("version").filter(|v| !v.is_null()) {
            run.identity.insert("sglang_version".into(), v.clone());
        }
    }
    let field = |k: &str| o.get(k).filter(|v| !v.is_null());
    // InferenceX multi-node aggregates count prefill and decode GPUs apart.
    let split = field("num_prefill_gpu")
        .and_then(num)
        .zip(field("num_decode_gpu").and_then(num))
        .map(|(p, d)| p + d);
    let gpus = split
        .or_else(|| {
            ["tp", "tp_size"]
                .iter()
                .find_map(|k| field(k).and_then(num))
        })
        .or_else(|| info.and_then(gpus_of_args));
    if let Some(g) = gpus {
        run.identity.insert("gpu_count".into(), count(g));
    }
    let model = field("model").or_else(|| field("model_id")).or_else(|| {
        info.and_then(|i| i.get("model_path"))
            .filter(|v| !v.is_null())
    });
    if let Some(m) = model {
        run.identity.insert("model".into(), m.clone());
    }
    for k in ["isl", "osl", "precision", "hw", "image"] {
        if let Some(x) = field(k) {
            run.identity.insert(k.into(), x.clone());
        }
    }
    // bench_serving's random datasets: the lengths asked for are the ISL/OSL InferenceX records.
    let random = field("dataset_name")
        .and_then(Value::as_str)
        .is_some_and(|d| d.starts_with("random"));
    if random {
        for (k, name) in [("random_input_len", "isl"), ("random_output_len", "osl")] {
            if let Some(x) = field(k) {
                run.identity.entry(name).or_insert_with(|| x.clone());
            }
        }
    }
    run.put_window(window_key(o), result_metrics(o, gpus));
}

/// `c{max concurrency}`; without one `rps{request rate}`; else `all`.
fn window_key(o: &Map<String, Value>) -> String {
    if let Some(c) = o
        .get("conc")
        .or_else(|| o.get("max_concurrency"))
        .and_then(num)
    {
        format!("c{c}")
    } else if let Some(r) = o.get("request_rate").and_then(num) {
        format!("rps{r}")
    } else {
        "all".into()
    }
}

/// `median_ttft` (InferenceX aggregates: seconds) → Some("median_ttft_ms").
fn seconds_latency_in_ms(k: &str) -> Option<String> {
    let (stat, what) = k.rsplit_once('_')?;
    (STATS.contains(&stat) && LATENCIES.contains(&what)).then(|| format!("{k}_ms"))
}

/// A result object (bench_serving, InferenceX raw or aggregated, our report's window) as one
/// window's metrics under one set of names: latencies in ms (`median_e2el_ms`), throughputs as
/// InferenceX names them, per GPU when the GPU count is known.
fn result_metrics(o: &Map<String, Value>, gpus: Option<f64>) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    for (k, v) in o {
        let Some(x) = num(v) else { continue };
        if let Some(base) = k.strip_suffix("_ms") {
            // bench_serving says e2e_latency where InferenceX says e2el; the ms value wins.
            m.insert(format!("{}_ms", base.replace("e2e_latency", "e2el")), x);
        } else if let Some(ms) = seconds_latency_in_ms(k) {
            m.entry(ms).or_insert(x * 1000.0);
        } else {
            m.insert(k.clone(), x);
        }
    }
    // bench_serving's name for total_token_throughput.
    if let Some(t) = m.get("total_throughput").copied() {
        m.entry("total_token_throughput".into()).or_insert(t);
    }
    // InferenceX's interactivity: 1000 / TPOT in ms.
    if let Some(t) = m.get("median_tpot_ms").copied().filter(|t| *t > 0.0) {
        m.entry("median_intvty".into()).or_insert(1000.0 / t);
    }
    if let Some(g) = gpus.filter(|g| *g > 0.0) {
        for (total, per_gpu) in [
            ("total_token_throughput", "tput_per_gpu"),
            ("output_throughput", "output_tput_per_gpu"),
        ] {
            if let Some(t) = m.get(total).copied() {
                m.entry(per_gpu.into()).or_insert(t / g);
            }
        }
    }
    m
}

fn from_report(v: &Value) -> Result<RunData> {
    // What `run --report` / `report` always write, so that a look-alike is refused, not read as
    // a run without windows.
    if !(v["schema_version"].is_u64() && v["windows"].is_array() && v["identity"].is_object()) {
        bail!(
            "not a report of sglang-supervisor (expected its schema_version, identity object and \
             windows array, as `run --report` writes them)"
        );
    }
    let id = &v["identity"];
    let mut run = RunData {
        args: v["server_args"].as_object().cloned().unwrap_or_default(),
        ..Default::default()
    };
    for k in ["model", "gpu_count", "gpu_name", "sglang_version", "image"] {
        if !id[k].is_null() {
            run.identity.insert(k.into(), id[k].clone());
        }
    }
    // The GPUs the server used (its resolved args), not those the host has: a TP 1 run on an
    // 8-GPU node compares with a TP 1 run elsewhere. The probe's count is the fallback.
    if let Some(g) = gpus_of_args(&run.args) {
        run.identity.insert("gpu_count".into(), count(g));
    }
    run.deprecations = v["deprecations"]
        .as_array()
        .map(|d| {
            d.iter()
                .filter_map(|x| x["message"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    run.startup_s = num(&v["startup"]["time_to_ready_s"]);
    for w in v["windows"].as_array().into_iter().flatten() {
        let Some(name) = w["name"].as_str() else {
            continue;
        };
        let mut m = w["requests"]
            .as_object()
            .map(|o| result_metrics(o, None))
            .unwrap_or_default();
        // Energy over the same traffic span as the tokens: a live window's `traffic_power`, a
        // benchmark-span window's `power`; else the wall window's energy over its tokens.
        let per_token = num(&w["traffic_power"]["joules_per_output_token"])
            .or_else(|| num(&w["power"]["joules_per_output_token"]));
        let energy = num(&w["power"]["total_gpu_energy_j"]);
        let out = m.get("total_output_tokens").copied();
        let fallback = energy.zip(out.filter(|o| *o > 0.0)).map(|(e, o)| e / o);
        if let Some(j) = per_token.or(fallback) {
            m.insert("energy_per_output_token_j".into(), j);
        }
        if !m.is_empty() {
            run.put_window(name.to_string(), m);
        }
    }
    Ok(run)
}

fn delta(base: f64, cand: f64) -> Option<f64> {
    (base != 0.0).then(|| (cand - base) / base.abs() * 100.0)
}

/// Better/worse, or `≈` when the change is inside the noise band (percent).
fn verdict(d: f64, higher_better: bool, noise: f64) -> &'static str {
    if d.abs() <= noise {
        "≈"
    } else if (d > 0.0) == higher_better {
        "↑ better"
    } else {
        "↓ worse"
    }
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn fmt_num(x: f64) -> String {
    if x.abs() >= 100.0 {
        format!("{x:.1}")
    } else if x.abs() >= 1.0 {
        format!("{x:.3}")
    } else {
        format!("{x:.4}")
    }
}

fn show(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "None".into(),
        other => other.to_string(),
    }
}

/// One compared figure: both sides (absent stays absent), the signed delta and the verdict.
fn row(b: Option<f64>, c: Option<f64>, higher_better: bool, noise: f64) -> Map<String, Value> {
    let d = b.zip(c).and_then(|(b, c)| delta(b, c));
    let mut r = Map::new();
    r.insert("baseline".into(), json!(b));
    r.insert("candidate".into(), json!(c));
    r.insert("delta_pct".into(), json!(d.map(round1)));
    r.insert(
        "verdict".into(),
        json!(d.map(|d| verdict(d, higher_better, noise))),
    );
    r
}

/// The same model under another directory (`/models/X` vs `org/X`) is the same model.
fn same_identity(k: &str, a: &Value, b: &Value) -> bool {
    if let (Some(x), Some(y)) = (num(a), num(b)) {
        return (x - y).abs() < 1e-9;
    }
    match (k, a.as_str(), b.as_str()) {
        ("model", Some(x), Some(y)) => {
            let base = |s: &'_ str| {
                s.trim_end_matches('/')
                    .rsplit('/')
                    .next()
                    .map(str::to_owned)
            };
            base(x) == base(y)
        }
        _ => a == b,
    }
}

/// Nested args as `path.to.leaf → value` (arrays are leaves), so a change inside
/// `cuda_graph_config` reads `cuda_graph_config.decode.backend: full → disabled`.
fn flatten(path: String, v: &Value, out: &mut BTreeMap<String, Value>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, x) in m {
                flatten(format!("{path}.{k}"), x, out);
            }
        }
        _ => {
            out.insert(path, v.clone());
        }
    }
}

fn flat_args(args: &Map<String, Value>) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for (k, v) in args {
        if !NOISY_ARGS.contains(&k.as_str()) {
            flatten(k.clone(), v, &mut out);
        }
    }
    out
}

fn args_changed(base: &Map<String, Value>, cand: &Map<String, Value>) -> Vec<Value> {
    let (a, b) = (flat_args(base), flat_args(cand));
    let paths: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    paths
        .into_iter()
        .filter(|p| a.get(*p) != b.get(*p))
        .map(|p| {
            // A side without the arg has no key at all (not null: None is a value SGLang uses).
            let mut r = Map::new();
            r.insert("arg".into(), json!(p));
            if let Some(v) = a.get(p) {
                r.insert("baseline".into(), v.clone());
            }
            if let Some(v) = b.get(p) {
                r.insert("candidate".into(), v.clone());
            }
            Value::Object(r)
        })
        .collect()
}

fn window_rows(bm: &BTreeMap<String, f64>, cm: &BTreeMap<String, f64>, noise: f64) -> Vec<Value> {
    METRICS
        .iter()
        .filter_map(|(f, label, hb)| {
            let (b, c) = (bm.get(*f).copied(), cm.get(*f).copied());
            if b.is_none() && c.is_none() {
                return None;
            }
            let mut r = row(b, c, *hb, noise);
            r.insert("metric".into(), json!(f));
            r.insert("label".into(), json!(label));
            Some(Value::Object(r))
        })
        .collect()
}

/// Build the comparison (the JSON form; text and markdown render it). `noise` is the band in
/// percent inside which a change prints `≈`.
pub fn compare(base: &RunData, cand: &RunData, force: bool, noise: f64) -> Result<Value, String> {
    let mut identity_changed = Vec::new();
    let keys: BTreeSet<&String> = base.identity.keys().chain(cand.identity.keys()).collect();
    for k in keys {
        let (Some(a), Some(b)) = (base.identity.get(k), cand.identity.get(k)) else {
            continue;
        };
        if same_identity(k, a, b) {
            continue;
        }
        if IDENTITY.contains(&k.as_str()) && !force {
            return Err(format!(
                "refusing to compare: {k} differs ({} vs {}); pass --force to compare anyway",
                show(a),
                show(b)
            ));
        }
        identity_changed.push(json!({"field": k, "baseline": a, "candidate": b}));
    }
    let mut windows = Vec::new();
    let mut only_base = Vec::new();
    for (key, bm) in &base.windows {
        match cand.window(key) {
            Some(cm) => windows.push(json!({"window": key, "rows": window_rows(bm, cm, noise)})),
            None => only_base.push(key.clone()),
        }
    }
    let mut only_cand: Vec<String> = cand
        .windows
        .iter()
        .filter(|(k, _)| base.window(k).is_none())
        .map(|(k, _)| k.clone())
        .collect();
    // One result against one result under different names (a bench_serving line against a
    // report's single window): that is the comparison that was meant.
    if windows.is_empty() && base.windows.len() == 1 && cand.windows.len() == 1 {
        let ((bk, bm), (ck, cm)) = (&base.windows[0], &cand.windows[0]);
        windows.push(json!({"window": bk, "candidate_window": ck,
                            "rows": window_rows(bm, cm, noise)}));
        (only_base, only_cand) = (Vec::new(), Vec::new());
    }
    let args = if base.args.is_empty() || cand.args.is_empty() {
        Value::Null // nothing to diff against: not "every arg changed"
    } else {
        Value::Array(args_changed(&base.args, &cand.args))
    };
    let new_dep: Vec<&String> = cand
        .deprecations
        .iter()
        .filter(|d| !base.deprecations.contains(d))
        .collect();
    let gone_dep: Vec<&String> = base
        .deprecations
        .iter()
        .filter(|d| !cand.deprecations.contains(d))
        .collect();
    Ok(json!({
        "baseline": base.identity, "candidate": cand.identity,
        "noise_pct": noise,
        "identity_changed": identity_changed,
        "windows": windows,
        "windows_only_in_baseline": only_base,
        "windows_only_in_candidate": only_cand,
        "args_changed": args,
        "deprecations_new": new_dep, "deprecations_removed": gone_dep,
        "startup_s": row(base.startup_s, cand.startup_s, false, noise),
    }))
}

fn pct(v: &Value) -> String {
    v.as_f64()
        .map_or_else(|| "n/a".into(), |d| format!("{d:+.1}%"))
}

fn side(v: &Value) -> String {
    v.as_f64().map_or_else(|| "n/a".into(), fmt_num)
}

pub fn render(c: &Value, format: CompareFormat) -> String {
    let mut out = String::new();
    let md = format == CompareFormat::Markdown;
    let text = |v: &Value| v.as_str().unwrap_or("").to_string();
    let changed_ids = c["identity_changed"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for i in &changed_ids {
        out.push_str(&format!(
            "{}: {} → {}\n",
            text(&i["field"]),
            show(&i["baseline"]),
            show(&i["candidate"])
        ));
    }
    if !changed_ids.is_empty() {
        out.push('\n');
    }
    for w in c["windows"].as_array().into_iter().flatten() {
        let mut name = text(&w["window"]);
        if let Some(cw) = w["candidate_window"].as_str() {
            name = format!("{name} (baseline) vs {cw} (candidate)");
        }
        if md {
            out.push_str(&format!(
                "### {name}\n\n| Metric | Baseline | Candidate | Δ | |\n|---|---:|---:|---:|---|\n"
            ));
        } else {
            out.push_str(&format!(
                "== {name}\n{:<36} {:>12} {:>12} {:>8}\n",
                "metric", "baseline", "candidate", "delta"
            ));
        }
        for r in w["rows"].as_array().into_iter().flatten() {
            let (b, cnd) = (side(&r["baseline"]), side(&r["candidate"]));
            let (label, d, v) = (text(&r["label"]), pct(&r["delta_pct"]), text(&r["verdict"]));
            if md {
                out.push_str(&format!("| {label} | {b} | {cnd} | {d} | {v} |\n"));
            } else {
                out.push_str(&format!("{label:<36} {b:>12} {cnd:>12} {d:>8} {v}\n"));
            }
        }
        out.push('\n');
    }
    if c["windows"].as_array().is_none_or(|w| w.is_empty()) {
        out.push_str("no window or concurrency is in both inputs\n\n");
    }
    for (key, title) in [
        ("windows_only_in_baseline", "Only in the baseline"),
        ("windows_only_in_candidate", "Only in the candidate"),
    ] {
        let list: Vec<String> = c[key].as_array().into_iter().flatten().map(text).collect();
        if !list.is_empty() {
            out.push_str(&format!("{title}: {}\n", list.join(", ")));
        }
    }
    let s = &c["startup_s"];
    if s["baseline"].is_number() || s["candidate"].is_number() {
        out.push_str(&format!(
            "Startup (spawn → ready): {} s → {} s ({}) {}\n",
            side(&s["baseline"]),
            side(&s["candidate"]),
            pct(&s["delta_pct"]),
            text(&s["verdict"])
        ));
    }
    let absent = || "(absent)".to_string();
    match c["args_changed"].as_array() {
        None => out.push_str("\nResolved server args: not compared (one input carries none)\n"),
        Some(changed) if !changed.is_empty() => {
            out.push_str(if md {
                "\n**Resolved server args that changed**\n\n"
            } else {
                "\nResolved server args that changed:\n"
            });
            for a in changed {
                out.push_str(&format!(
                    "- `{}`: {} → {}\n",
                    text(&a["arg"]),
                    a.get("baseline").map_or_else(absent, show),
                    a.get("candidate").map_or_else(absent, show)
                ));
            }
        }
        Some(_) => {}
    }
    for (key, title) in [
        ("deprecations_new", "New deprecation warnings"),
        ("deprecations_removed", "Deprecation warnings gone"),
    ] {
        let list = c[key].as_array().cloned().unwrap_or_default();
        if !list.is_empty() {
            out.push_str(&format!("\n{title}:\n"));
            for d in list {
                out.push_str(&format!("- {}\n", text(&d)));
            }
        }
    }
    out
}

/// The `compare` command; returns the exit status (2 for refused identities).
pub fn command(args: &CompareArgs) -> Result<i32> {
    // An input that is not a run (a log, an empty file, JSON of another shape) is bad input.
    let (base, cand) = match (load(&args.baseline), load(&args.candidate)) {
        (Ok(b), Ok(c)) => (b, c),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("sglang-supervisor: compare: {e:#}");
            return Ok(crate::exit::BAD_INPUT);
        }
    };
    match compare(&base, &cand, args.force, args.noise) {
        Err(why) => {
            eprintln!("sglang-supervisor: {why}");
            Ok(crate::exit::BAD_INPUT)
        }
        Ok(c) => {
            match args.format {
                CompareOutput::Json => crate::stdout::println(serde_json::to_string_pretty(&c)?)?,
                CompareOutput::Html => {
                    let table = render(&c, CompareFormat::Markdown);
                    let raw = |p: &std::path::Path| -> Value {
                        std::fs::read(p)
                            .ok()
                            .and_then(|b| serde_json::from_slice(&b).ok())
                            .unwrap_or(Value::Null)
                    };
                    crate::stdout::print(crate::html::compare_page(
                        &raw(&args.baseline),
                        &raw(&args.candidate),
                        &table,
                    ))?
                }
                CompareOutput::Text => crate::stdout::print(render(&c, CompareFormat::Text))?,
                CompareOutput::Markdown => {
                    crate::stdout::print(render(&c, CompareFormat::Markdown))?
                }
            }
            Ok(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inferencex(tput: f64, ttft: f64, conc: u64, model: &str) -> Value {
        json!({"hw": "h200", "conc": conc, "model": model, "isl": 1024, "osl": 1024, "precision": "fp8", "tp": 8,
               "tput_per_gpu": tput, "output_tput_per_gpu": tput / 9.0, "median_ttft": ttft, "median_tpot": 0.00868, "median_e2el": 8.18})
    }

    fn run_of(v: &Value) -> RunData {
        parse_run(&v.to_string()).unwrap()
    }

    #[test]
    fn the_image_bump_table_from_the_reference_pr() {
        // qwen3.5 H200 v0.5.14 → v0.5.19, c4 (reference/inferencex.md §4).
        let base = run_of(&json!([
            inferencex(486.9, 0.345, 4, "qwen3.5"),
            inferencex(900.0, 0.5, 8, "qwen3.5")
        ]));
        let mut cand = inferencex(543.0, 0.222, 4, "qwen3.5");
        cand["median_tpot"] = json!(0.00787);
        let out = compare(&base, &run_of(&cand), false, 1.0).unwrap();
        assert_eq!(out["windows"].as_array().unwrap().len(), 1);
        assert_eq!(out["windows_only_in_baseline"], json!(["c8"]));
        let rows = out["windows"][0]["rows"].as_array().unwrap();
        let row = |m: &str| rows.iter().find(|r| r["metric"] == m).unwrap().clone();
        assert_eq!(row("tput_per_gpu")["delta_pct"], 11.5);
        assert_eq!(row("tput_per_gpu")["verdict"], "↑ better");
        assert_eq!(row("median_ttft_ms")["delta_pct"], -35.7);
        assert_eq!(row("median_ttft_ms")["verdict"], "↑ better");
        // Seconds in, ms out.
        assert!((row("median_tpot_ms")["baseline"].as_f64().unwrap() - 8.68).abs() < 1e-9);
        let text = render(&out, CompareFormat::Markdown);
        assert!(
            text.contains("| Total tok/s/GPU | 486.9 | 543.0 | +11.5% | ↑ better |"),
            "{text}"
        );
        assert!(
            text.contains("| Median TTFT (ms) | 345.0 | 222.0 | -35.7% | ↑ better |"),
            "{text}"
        );
        // A different model is refused, naming the field.
        let other = run_of(&inferencex(543.0, 0.222, 4, "dsr1"));
        let err = compare(&base, &other, false, 1.0).unwrap_err();
        assert!(err.contains("model differs (qwen3.5 vs dsr1)"), "{err}");
        assert!(compare(&base, &other, true, 1.0).is_ok());
    }

    #[test]
    fn a_reports_gpu_count_is_the_servers_not_the_hosts() {
        let report = json!({"schema_version": 1, "windows": [],
            "identity": {"model": "m", "gpu_count": 8},
            "server_args": {"tp_size": 1, "pp_size": 1, "dp_size": 1}});
        assert_eq!(
            from_report(&report).unwrap().identity["gpu_count"],
            json!(1)
        );
        let no_args = json!({"schema_version": 1, "windows": [], "identity": {"gpu_count": 8}});
        assert_eq!(
            from_report(&no_args).unwrap().identity["gpu_count"],
            json!(8)
        );
    }

    #[test]
    fn nested_args_differ_by_path_and_one_sided_args_say_absent() {
        let base = json!({"cuda_graph_config": {"decode": {"backend": "full", "max_bs": 256}}, "port": 1, "old": 1});
        let cand = json!({"cuda_graph_config": {"decode": {"backend": "disabled", "max_bs": 256}}, "port": 2, "new": null});
        let changed = args_changed(base.as_object().unwrap(), cand.as_object().unwrap());
        assert_eq!(
            changed,
            vec![
                json!({"arg": "cuda_graph_config.decode.backend", "baseline": "full", "candidate": "disabled"}),
                json!({"arg": "new", "candidate": null}),
                json!({"arg": "old", "baseline": 1}),
            ]
        );
    }

    #[test]
    fn a_change_inside_the_noise_band_is_neither_better_nor_worse() {
        assert_eq!(verdict(0.9, true, 1.0), "≈");
        assert_eq!(verdict(-1.0, false, 1.0), "≈");
        assert_eq!(verdict(1.1, true, 1.0), "↑ better");
        assert_eq!(verdict(1.1, false, 1.0), "↓ worse");
        assert_eq!(verdict(0.5, true, 0.0), "↑ better");
    }
}
