//! `compare BASELINE CANDIDATE`: the image-bump table without hand work. Inputs are our
//! `--report` files or InferenceX result JSON (one result, or the aggregated array); windows are
//! matched by name / concurrency; mismatched identities are refused unless `--force`.
use crate::cli::{CompareArgs, CompareFormat};
use anyhow::{Context, Result};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// (field, label, higher is better)
const METRICS: &[(&str, &str, bool)] = &[
    ("tput_per_gpu", "Total tok/s/GPU", true),
    ("output_tput_per_gpu", "Output tok/s/GPU", true),
    ("total_token_throughput", "Total tok/s", true),
    ("output_throughput", "Output tok/s", true),
    ("median_ttft", "Median TTFT (s)", false),
    ("p99_ttft", "P99 TTFT (s)", false),
    ("median_tpot", "Median TPOT (s)", false),
    ("median_itl", "Median ITL (s)", false),
    ("median_e2el", "Median E2E (s)", false),
    ("p99_e2el", "P99 E2E (s)", false),
    ("median_intvty", "Median interactivity (tok/s/user)", true),
    (
        "energy_per_output_token_j",
        "Energy per output token (J)",
        false,
    ),
];

/// Identity fields that must agree (unless --force).
const IDENTITY: &[&str] = &["model", "gpu_count", "isl", "osl", "precision"];

/// Resolved args whose change says nothing about the image (ports, seeds, paths of this run).
const NOISY_ARGS: &[&str] = &[
    "host",
    "port",
    "random_seed",
    "nccl_port",
    "dist_init_addr",
    "file_storage_path",
];

/// One input, normalised.
#[derive(Debug, Default)]
pub struct RunData {
    pub identity: Map<String, Value>,
    /// window key ("c8", or a report's window name) → metric → value
    pub windows: BTreeMap<String, BTreeMap<String, f64>>,
    pub args: Map<String, Value>,
    pub deprecations: Vec<String>,
    pub startup_s: Option<f64>,
}

fn num(v: &Value) -> Option<f64> {
    v.as_f64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
}

/// A bench_serving / InferenceX result object as one window's metrics (seconds, per GPU).
fn result_metrics(o: &Map<String, Value>, gpus: Option<f64>) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    for (k, v) in o {
        let Some(x) = num(v) else { continue };
        // bench_serving's *_ms fields → InferenceX's seconds without the suffix.
        if let Some(base) = k.strip_suffix("_ms") {
            m.entry(base.replace("e2e_latency", "e2el"))
                .or_insert(x / 1000.0);
        } else {
            m.insert(k.clone(), x);
        }
    }
    if let Some(g) = gpus.filter(|g| *g > 0.0) {
        if !m.contains_key("tput_per_gpu") {
            if let Some(t) = m.get("total_token_throughput").copied() {
                m.insert("tput_per_gpu".into(), t / g);
            }
        }
        if !m.contains_key("output_tput_per_gpu") {
            if let Some(t) = m.get("output_throughput").copied() {
                m.insert("output_tput_per_gpu".into(), t / g);
            }
        }
    }
    m
}

fn load(path: &Path) -> Result<RunData> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse_run(&text).with_context(|| path.display().to_string())
}

/// A run from the text of a report of ours, an InferenceX result, or an array of those.
pub fn parse_run(text: &str) -> Result<RunData> {
    let v: Value = serde_json::from_str(text).context("not JSON")?;
    if v.get("schema_version").is_some() && v.get("windows").is_some() {
        return Ok(from_report(&v));
    }
    let items: Vec<&Value> = match &v {
        Value::Array(a) => a.iter().collect(),
        Value::Object(_) => vec![&v],
        _ => anyhow::bail!("expected a report, an InferenceX result or an array of them"),
    };
    let mut run = RunData::default();
    for it in items {
        let Some(o) = it.as_object() else { continue };
        let conc = o
            .get("conc")
            .or_else(|| o.get("max_concurrency"))
            .and_then(num);
        let key = conc.map_or_else(|| "all".to_string(), |c| format!("c{c}"));
        let gpus = ["tp", "tp_size"]
            .iter()
            .find_map(|k| o.get(*k).and_then(num));
        for (k, name) in [
            ("model", "model"),
            ("isl", "isl"),
            ("osl", "osl"),
            ("precision", "precision"),
            ("hw", "hw"),
            ("image", "image"),
        ] {
            if let Some(x) = o.get(k).filter(|x| !x.is_null()) {
                run.identity.insert(name.into(), x.clone());
            }
        }
        if let Some(g) = gpus {
            run.identity.insert("gpu_count".into(), json!(g));
        }
        run.windows.insert(key, result_metrics(o, gpus));
    }
    Ok(run)
}

fn from_report(v: &Value) -> RunData {
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
        let energy = num(&w["power"]["total_gpu_energy_j"]);
        let out = m.get("total_output_tokens").copied();
        if let (Some(e), Some(o)) = (energy, out.filter(|o| *o > 0.0)) {
            m.insert("energy_per_output_token_j".into(), e / o);
        }
        if !m.is_empty() {
            run.windows.insert(name.to_string(), m);
        }
    }
    run
}

fn delta(base: f64, cand: f64) -> Option<f64> {
    (base != 0.0).then(|| (cand - base) / base.abs() * 100.0)
}

fn verdict(d: f64, higher_better: bool) -> &'static str {
    if d.abs() < 0.05 {
        "="
    } else if (d > 0.0) == higher_better {
        "↑ better"
    } else {
        "↓ worse"
    }
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

/// Build the comparison (the JSON form; text and markdown render it).
pub fn compare(base: &RunData, cand: &RunData, force: bool) -> Result<Value, String> {
    for k in IDENTITY {
        if let (Some(a), Some(b)) = (base.identity.get(*k), cand.identity.get(*k)) {
            let same = match (num(a), num(b)) {
                (Some(x), Some(y)) => (x - y).abs() < 1e-9,
                _ => a == b,
            };
            if !same && !force {
                return Err(format!(
                    "refusing to compare: {k} differs ({} vs {}); pass --force to compare anyway",
                    show(a),
                    show(b)
                ));
            }
        }
    }
    let mut windows = Vec::new();
    for (key, bm) in &base.windows {
        let Some(cm) = cand.windows.get(key) else {
            continue;
        };
        let rows: Vec<Value> = METRICS
            .iter()
            .filter_map(|(f, label, hb)| {
                let (b, c) = (*bm.get(*f)?, *cm.get(*f)?);
                let d = delta(b, c);
                Some(
                    json!({"metric": f, "label": label, "baseline": b, "candidate": c,
                            "delta_pct": d.map(|d| (d * 10.0).round() / 10.0),
                            "verdict": d.map(|d| verdict(d, *hb))}),
                )
            })
            .collect();
        windows.push(json!({"window": key, "rows": rows}));
    }
    let mut args_changed = Vec::new();
    let keys: std::collections::BTreeSet<&String> =
        base.args.keys().chain(cand.args.keys()).collect();
    for k in keys {
        if NOISY_ARGS.contains(&k.as_str()) {
            continue;
        }
        let (a, b) = (
            base.args.get(k).unwrap_or(&Value::Null),
            cand.args.get(k).unwrap_or(&Value::Null),
        );
        if a != b {
            args_changed.push(json!({"arg": k, "baseline": a, "candidate": b}));
        }
    }
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
        "windows": windows,
        "args_changed": args_changed,
        "deprecations_new": new_dep, "deprecations_removed": gone_dep,
        "startup_s": {"baseline": base.startup_s, "candidate": cand.startup_s,
                      "delta_pct": base.startup_s.zip(cand.startup_s).and_then(|(a, b)| delta(a, b)).map(|d| (d * 10.0).round() / 10.0)},
    }))
}

fn pct(v: &Value) -> String {
    v.as_f64()
        .map_or_else(|| "n/a".into(), |d| format!("{d:+.1}%"))
}

pub fn render(c: &Value, format: CompareFormat) -> String {
    let mut out = String::new();
    let md = format == CompareFormat::Markdown;
    for w in c["windows"].as_array().into_iter().flatten() {
        if md {
            out.push_str(&format!(
                "### {}\n\n| Metric | Baseline | Candidate | Δ | |\n|---|---:|---:|---:|---|\n",
                w["window"].as_str().unwrap_or("")
            ));
        } else {
            out.push_str(&format!(
                "== {}\n{:<36} {:>12} {:>12} {:>8}\n",
                w["window"].as_str().unwrap_or(""),
                "metric",
                "baseline",
                "candidate",
                "delta"
            ));
        }
        for r in w["rows"].as_array().into_iter().flatten() {
            let (b, cnd) = (
                fmt_num(r["baseline"].as_f64().unwrap_or(f64::NAN)),
                fmt_num(r["candidate"].as_f64().unwrap_or(f64::NAN)),
            );
            let (label, d, v) = (
                r["label"].as_str().unwrap_or(""),
                pct(&r["delta_pct"]),
                r["verdict"].as_str().unwrap_or(""),
            );
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
    let s = &c["startup_s"];
    if s["baseline"].is_number() || s["candidate"].is_number() {
        out.push_str(&format!(
            "Startup (spawn → ready): {} s → {} s ({})\n",
            s["baseline"].as_f64().map_or("n/a".into(), fmt_num),
            s["candidate"].as_f64().map_or("n/a".into(), fmt_num),
            pct(&s["delta_pct"])
        ));
    }
    let changed = c["args_changed"].as_array().cloned().unwrap_or_default();
    if !changed.is_empty() {
        out.push_str(if md {
            "\n**Resolved server args that changed**\n\n"
        } else {
            "\nResolved server args that changed:\n"
        });
        for a in changed {
            out.push_str(&format!(
                "- `{}` {} → {}\n",
                a["arg"].as_str().unwrap_or(""),
                show(&a["baseline"]),
                show(&a["candidate"])
            ));
        }
    }
    for (key, title) in [
        ("deprecations_new", "New deprecation warnings"),
        ("deprecations_removed", "Deprecation warnings gone"),
    ] {
        let list = c[key].as_array().cloned().unwrap_or_default();
        if !list.is_empty() {
            out.push_str(&format!("\n{title}:\n"));
            for d in list {
                out.push_str(&format!("- {}\n", d.as_str().unwrap_or("")));
            }
        }
    }
    out
}

/// The `compare` command; returns the exit status (2 for refused identities).
pub fn command(args: &CompareArgs) -> Result<i32> {
    let (base, cand) = (load(&args.baseline)?, load(&args.candidate)?);
    match compare(&base, &cand, args.force) {
        Err(why) => {
            eprintln!("sglang-supervisor: {why}");
            Ok(2)
        }
        Ok(c) => {
            match args.format {
                CompareFormat::Json => println!("{}", serde_json::to_string_pretty(&c)?),
                f => print!("{}", render(&c, f)),
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

    #[test]
    fn the_image_bump_table_from_the_reference_pr() {
        // qwen3.5 H200 v0.5.14 → v0.5.19, c4 (reference/inferencex.md §4).
        let dir = std::env::temp_dir().join(format!("sglsup-cmp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (b, c) = (dir.join("b.json"), dir.join("c.json"));
        std::fs::write(
            &b,
            json!([
                inferencex(486.9, 0.345, 4, "qwen3.5"),
                inferencex(900.0, 0.5, 8, "qwen3.5")
            ])
            .to_string(),
        )
        .unwrap();
        let mut cand = inferencex(543.0, 0.222, 4, "qwen3.5");
        cand["median_tpot"] = json!(0.00787);
        std::fs::write(&c, cand.to_string()).unwrap();
        let out = compare(&load(&b).unwrap(), &load(&c).unwrap(), false).unwrap();
        assert_eq!(
            out["windows"].as_array().unwrap().len(),
            1,
            "only c4 is in both"
        );
        let rows = out["windows"][0]["rows"].as_array().unwrap();
        let row = |m: &str| rows.iter().find(|r| r["metric"] == m).unwrap().clone();
        assert_eq!(row("tput_per_gpu")["delta_pct"], 11.5);
        assert_eq!(row("tput_per_gpu")["verdict"], "↑ better");
        assert_eq!(row("median_ttft")["delta_pct"], -35.7);
        assert_eq!(row("median_ttft")["verdict"], "↑ better");
        let text = render(&out, CompareFormat::Markdown);
        assert!(
            text.contains("| Total tok/s/GPU | 486.9 | 543.0 | +11.5% | ↑ better |"),
            "{text}"
        );
        // A different model is refused, naming the field.
        std::fs::write(&c, inferencex(543.0, 0.222, 4, "dsr1").to_string()).unwrap();
        let err = compare(&load(&b).unwrap(), &load(&c).unwrap(), false).unwrap_err();
        assert!(err.contains("model differs (qwen3.5 vs dsr1)"), "{err}");
        assert!(compare(&load(&b).unwrap(), &load(&c).unwrap(), true).is_ok());
        let _ = std::fs::remove_dir_all(dir);
    }
}
