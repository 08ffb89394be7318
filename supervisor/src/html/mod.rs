//! The run report as one self-contained HTML page (`run --report-html`, `report --html`): inline
//! CSS and inline SVG plots, no script, nothing fetched; light or dark as the reader's system
//! prefers. Built from the JSON report, plus the power CSV and the requests log when given.
pub mod plot;

use plot::{Bar, Series};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// Files beside the report that hold series the report only summarises.
#[derive(Debug, Default, Clone, Copy)]
pub struct Inputs<'a> {
    pub power_csv: Option<&'a Path>,
    pub requests_log: Option<&'a Path>,
}

/// The sections every page has, in order (a test checks the DOM for each id).
pub const SECTIONS: &[(&str, &str)] = &[
    ("identity", "Run"),
    ("startup", "Start-up"),
    ("gpu", "GPU power and memory over time"),
    ("latency", "Latency and throughput per window"),
    ("batches", "The server's batch series"),
    ("flags", "Flags audit and deprecations"),
    ("profiles", "Torch-profiler traces"),
    ("teardown", "Teardown"),
];

const STYLE: &str = "
:root{color-scheme:light dark;--bg:#ffffff;--fg:#1d232b;--muted:#5d6773;--line:#d9dee4;--card:#f6f8fa}
@media (prefers-color-scheme:dark){:root{--bg:#12161c;--fg:#e3e8ee;--muted:#9aa5b1;--line:#2c343e;--card:#1a2028}}
body{background:var(--bg);color:var(--fg);font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:960px;padding:16px}
h1{font-size:20px}h2{font-size:17px;border-bottom:1px solid var(--line);padding-bottom:4px;margin-top:28px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid var(--line);padding:3px 8px;text-align:left;vertical-align:top}
th{background:var(--card)}.note{color:var(--muted)}.advice{background:var(--card);border-left:4px solid #d64541;padding:8px 12px}
svg{max-width:100%;height:auto;display:block;margin:6px 0}code{font-size:12px}
.pair{display:grid;grid-template-columns:1fr 1fr;gap:16px}.pair>div{min-width:0}
";

/// HTML-escaped text.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => "—".into(),
        Value::String(s) => esc(s),
        Value::Number(n) => n.as_f64().filter(|x| x.fract() != 0.0).map_or_else(
            || n.to_string(),
            |x| format!("{:.4}", x).trim_end_matches('0').to_string(),
        ),
        other => esc(&other.to_string()),
    }
}

fn table(head: &[&str], rows: &[Vec<String>]) -> String {
    let mut h = String::from("<table>");
    if head.iter().any(|c| !c.is_empty()) {
        h.push_str("<tr>");
        for c in head {
            let _ = write!(h, "<th>{}</th>", esc(c));
        }
        h.push_str("</tr>");
    }
    for r in rows {
        h.push_str("<tr>");
        for c in r {
            let _ = write!(h, "<td>{c}</td>");
        }
        h.push_str("</tr>");
    }
    h.push_str("</table>");
    h
}

fn section(id: &str, body: &str) -> String {
    let title = SECTIONS.iter().find(|s| s.0 == id).map_or(id, |s| s.1);
    format!("<section id=\"{id}\"><h2>{title}</h2>{body}</section>\n")
}

fn identity(r: &Value) -> String {
    let id = &r["identity"];
    let rows: Vec<Vec<String>> = [
        "sglang_version",
        "model",
        "tp",
        "dp",
        "ep",
        "pp",
        "attention_backend",
        "quantization",
        "gpu_name",
        "gpu_count",
        "image",
    ]
    .iter()
    .filter(|k| !id[**k].is_null())
    .map(|k| vec![esc(k), text(&id[*k])])
    .collect();
    table(&["", ""], &rows)
}

/// Gantt rows: the supervisor's segments (with the JIT share), then each rank's phases.
fn startup(r: &Value) -> String {
    let st = &r["startup"];
    let mut out = format!(
        "<p>Ready: <b>{}</b> after <b>{} s</b>.</p>",
        text(&st["ready"]),
        text(&st["time_to_ready_s"])
    );
    let profile = &st["profile"];
    let mut rows: Vec<(String, Vec<Bar>)> = Vec::new();
    if let Some(segs) = profile["segments"].as_array() {
        let bars = segs
            .iter()
            .filter_map(|s| {
                Some(Bar {
                    start: s["start_s"].as_f64()?,
                    end: s["end_s"].as_f64()?,
                    label: s["name"].as_str()?.replace('_', " "),
                    jit: false,
                })
            })
            .collect();
        rows.push(("segments".into(), bars));
    }
    let jit: Vec<(f64, f64)> = profile["jit"]["intervals"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|i| Some((i[0].as_f64()?, i[1].as_f64()?)))
                .collect()
        })
        .unwrap_or_default();
    if !jit.is_empty() {
        let bars = jit
            .iter()
            .map(|(a, b)| Bar {
                start: *a,
                end: *b,
                label: "JIT".into(),
                jit: true,
            })
            .collect();
        rows.push(("compilers".into(), bars));
    }
    let mut ranks: BTreeMap<String, Vec<Bar>> = BTreeMap::new();
    for p in st["phases"].as_array().into_iter().flatten() {
        let (Some(end), Some(d), Some(name)) = (
            p["elapsed_s"].as_f64(),
            p["duration_s"].as_f64(),
            p["name"].as_str(),
        ) else {
            continue;
        };
        let rank = p["rank"].as_str().unwrap_or("main").to_string();
        ranks.entry(rank).or_default().push(Bar {
            start: end - d,
            end,
            label: name.trim_end_matches("_end").replace('_', " "),
            jit: false,
        });
    }
    rows.extend(ranks);
    if rows.is_empty() {
        out.push_str("<p class=\"note\">no start-up phases were logged</p>");
        return out;
    }
    out.push_str(&plot::gantt(
        "Start-up per rank (shaded red: compilers running)",
        &rows,
        &jit,
    ));
    if let Some(j) = profile.get("jit").filter(|j| j.is_object()) {
        let _ = write!(
            out,
            "<p>JIT compilation: <b>{} s</b> of wall time ({}% of the start), {} compiler processes, {} CPU s.</p>",
            text(&j["wall_s"]),
            j["share"].as_f64().map_or("—".into(), |s| format!("{:.0}", s * 100.0)),
            text(&j["processes"]),
            text(&j["cpu_s"])
        );
        let rows: Vec<Vec<String>> = profile["segments"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| {
                [
                    "name",
                    "duration_s",
                    "jit_s",
                    "compiler_processes",
                    "compiler_cpu_s",
                ]
                .iter()
                .map(|k| text(&s[*k]))
                .collect()
            })
            .collect();
        out.push_str(&table(
            &[
                "segment",
                "seconds",
                "JIT seconds",
                "compilers",
                "compiler CPU s",
            ],
            &rows,
        ));
        if let Some(a) = profile["advice"].as_str() {
            let _ = write!(out, "<p class=\"advice\">{}</p>", esc(a));
        }
    }
    out
}

/// Window spans (unix seconds) from their request spans.
fn window_spans(r: &Value) -> Vec<(f64, f64, String)> {
    r["windows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|w| w["name"] != "run")
        .filter_map(|w| {
            let q = &w["requests"];
            Some((
                q["benchmark_start_time_unix"].as_f64()?,
                q["benchmark_end_time_unix"].as_f64()?,
                w["name"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// GPU power, then memory used, per GPU over time from the power CSV, on one time axis (from the
/// CSV's first sample), the windows shaded on both; each plot in its own `<div id=...>`
/// (`gpu-power`, `gpu-memory`), or one line saying why there is none.
fn gpu(r: &Value, inputs: &Inputs) -> String {
    use sglang_probes::sampler::{read_series, PerGpu};
    let Some(csv) = inputs.power_csv else {
        return "<p class=\"note\">No power or memory series: give the run's power CSV (--power-csv).</p>"
            .into();
    };
    let path = esc(&csv.display().to_string());
    let series = match read_series(csv) {
        Ok(series) => series,
        Err(why) => {
            let why = why.join(", ");
            return format!(
                "<div id=\"gpu-power\"><p class=\"note\">{path}: unusable ({why})</p></div>\
                 <div id=\"gpu-memory\"><p class=\"note\">No GPU memory series: {path} could \
                 not be read ({why}).</p></div>"
            );
        }
    };
    let t0 = series.first_unix_s.unwrap_or(f64::MAX);
    let shade: Vec<(f64, f64, String)> = window_spans(r)
        .into_iter()
        .map(|(a, b, n)| (a - t0, b - t0, n))
        .collect();
    let x = "seconds since the first sample";
    // One line per GPU, in seconds from the first sample.
    let lines = |per: PerGpu, scale: f64| -> Vec<Series> {
        per.into_iter()
            .map(|(id, mut pts)| {
                pts.iter_mut().for_each(|p| *p = (p.0 - t0, p.1 * scale));
                (format!("GPU {id}"), pts)
            })
            .collect()
    };
    let power = match series.power {
        Ok(per) => plot::lines(
            "GPU power (windows shaded)",
            x,
            "W",
            &lines(per, 1.0),
            &shade,
        ),
        Err(why) => format!(
            "<p class=\"note\">{path}: unusable ({})</p>",
            why.join(", ")
        ),
    };
    let memory = match series.memory_mib {
        None => "<p class=\"note\">No GPU memory series: this power CSV has no memory.used column (written before memory was recorded).</p>".to_string(),
        Some(per) if per.is_empty() => "<p class=\"note\">No GPU memory series: the GPU library gave no memory reading ([N/A] in the power CSV).</p>".to_string(),
        Some(per) => plot::lines("GPU memory used (windows shaded)", x, "GiB", &lines(per, 1.0 / 1024.0), &shade),
    };
    format!("<div id=\"gpu-power\">{power}</div><div id=\"gpu-memory\">{memory}</div>")
}

fn latency(r: &Value, inputs: &Inputs) -> String {
    let windows: Vec<&Value> = r["windows"].as_array().into_iter().flatten().collect();
    let mut out = String::new();
    let rows: Vec<Vec<String>> = windows
        .iter()
        .filter(|w| w["requests"].is_object())
        .map(|w| {
            let q = &w["requests"];
            let mut row = vec![text(&w["name"])];
            for k in [
                "completed",
                "request_throughput",
                "output_throughput",
                "tput_per_gpu",
                "median_ttft_ms",
                "p99_ttft_ms",
                "median_tpot_ms",
                "median_itl_ms",
                "median_e2el_ms",
            ] {
                row.push(text(&q[k]));
            }
            row.push(text(&w["power"]["total_gpu_energy_j"]));
            row
        })
        .collect();
    if rows.is_empty() {
        out.push_str("<p class=\"note\">No request figures (run with --proxy-addr).</p>");
    } else {
        out.push_str(&table(
            &[
                "window",
                "completed",
                "req/s",
                "out tok/s",
                "tok/s/GPU",
                "TTFT p50 ms",
                "TTFT p99 ms",
                "TPOT p50 ms",
                "ITL p50 ms",
                "E2E p50 ms",
                "energy J",
            ],
            &rows,
        ));
    }
    let Some(log) = inputs.requests_log else {
        out.push_str("<p class=\"note\">Distributions need the requests log (--requests-log).</p>");
        return out;
    };
    let mut spans = window_spans(r);
    if spans.is_empty() {
        spans.push((f64::MIN, f64::MAX, "all requests".into()));
    }
    type Pick = fn(&sglang_exporters::proxy::RequestRecord, &mut Vec<f64>);
    let metrics: [(&str, Pick); 4] = [
        ("TTFT", |q, v| v.extend(q.ttft_s)),
        ("TPOT", |q, v| v.extend(q.tpot_s)),
        ("ITL", |q, v| v.extend_from_slice(&q.itl_s)),
        ("E2E", |q, v| v.push(q.e2e_s)),
    ];
    // values[metric][window], gathered in one pass: no record is kept
    let mut values: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); spans.len()]; metrics.len()];
    let read = crate::bench::for_each_request(log, |q| {
        if q.error.is_some() {
            return;
        }
        for (w, (a, b, _)) in spans.iter().enumerate() {
            if q.start_unix >= *a && q.start_unix <= *b {
                for (m, (_, pick)) in metrics.iter().enumerate() {
                    pick(&q, &mut values[m][w]);
                }
            }
        }
    });
    if let Err(e) = read {
        return out + &format!("<p class=\"note\">{}</p>", esc(&e));
    }
    for ((name, _), per_window) in metrics.iter().zip(values) {
        let series: Vec<(String, Vec<f64>)> = spans
            .iter()
            .map(|(_, _, w)| w.clone())
            .zip(per_window)
            .collect();
        out.push_str(&plot::cdf(
            &format!("{name} distribution per window"),
            series,
        ));
    }
    out
}

fn batches(r: &Value) -> String {
    let s = &r["server_batch_series"];
    let Some(t) = s["t_s"].as_array() else {
        return "<p class=\"note\">The server logged no batch lines.</p>".into();
    };
    let t0 = s["t0_unix"].as_f64().unwrap_or(0.0);
    let col = |k: &str, kind: &str| -> Vec<(f64, f64)> {
        t.iter()
            .zip(s[k].as_array().into_iter().flatten())
            .zip(s["kind"].as_array().into_iter().flatten())
            .filter(|(_, k)| k.as_str() == Some(kind))
            .filter_map(|((t, v), _)| Some((t.as_f64()?, v.as_f64()?)))
            .collect()
    };
    let shade: Vec<(f64, f64, String)> = window_spans(r)
        .into_iter()
        .map(|(a, b, n)| (a - t0, b - t0, n))
        .collect();
    let x = "seconds since the first batch line";
    let mut out = plot::lines(
        "Requests (decode lines)",
        x,
        "requests",
        &[
            ("running".into(), col("running", "decode")),
            ("queued".into(), col("queued", "decode")),
        ],
        &shade,
    );
    out += &plot::lines(
        "Throughput the server logged",
        x,
        "tokens/s",
        &[
            ("gen (decode)".into(), col("throughput", "decode")),
            ("input (prefill)".into(), col("throughput", "prefill")),
        ],
        &shade,
    );
    out += &plot::lines(
        "KV cache token usage",
        x,
        "ratio",
        &[
            ("decode".into(), col("token_usage", "decode")),
            ("prefill".into(), col("token_usage", "prefill")),
        ],
        &shade,
    );
    let rows: Vec<Vec<String>> = r["windows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|w| w["server_batches"].is_object())
        .map(|w| {
            let b = &w["server_batches"];
            let mmm = |v: &Value| {
                format!(
                    "{} / {} / {}",
                    text(&v["min"]),
                    text(&v["mean"]),
                    text(&v["max"])
                )
            };
            vec![
                text(&w["name"]),
                mmm(&b["decode"]["running_requests"]),
                mmm(&b["decode"]["queued_requests"]),
                mmm(&b["decode"]["token_usage"]),
                mmm(&b["decode"]["gen_throughput"]),
                text(&b["decode"]["cuda_graph_share"]),
                text(&b["pressure"]["retracted_requests"]),
                text(&b["pressure"]["cuda_oom"]),
            ]
        })
        .collect();
    out += &table(
        &[
            "window",
            "running min/mean/max",
            "queued",
            "token usage",
            "gen tok/s",
            "CUDA graph share",
            "retracted",
            "CUDA OOM",
        ],
        &rows,
    );
    out
}

fn flags(r: &Value) -> String {
    let mut out = String::new();
    let pf = &r["preflight"];
    match pf["flags"].as_array() {
        Some(f) if !f.is_empty() => {
            let rows: Vec<Vec<String>> = f
                .iter()
                .map(|x| {
                    ["flag", "status", "canonical", "replacement", "message"]
                        .iter()
                        .map(|k| text(&x[*k]))
                        .collect()
                })
                .collect();
            out += &table(
                &["flag", "status", "canonical", "replacement", "message"],
                &rows,
            );
        }
        Some(_) => {
            let _ = write!(
                out,
                "<p>Pre-flight: {} flags checked against SGLang {}: all accepted.</p>",
                text(&pf["checked"]),
                text(&pf["sglang_version"])
            );
        }
        None => out.push_str("<p class=\"note\">No pre-flight audit in this run.</p>"),
    }
    let deps: Vec<Vec<String>> = r["deprecations"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| {
            vec![
                text(&d["flag"]),
                text(&d["replacement"]),
                text(&d["message"]),
            ]
        })
        .collect();
    if deps.is_empty() {
        out.push_str("<p>The server logged no deprecation.</p>");
    } else {
        out += &table(&["deprecated", "replacement", "message"], &deps);
    }
    out
}

fn profiles(r: &Value) -> String {
    let mut rows = Vec::new();
    for p in r["profiles"].as_array().into_iter().flatten() {
        for t in p["traces"].as_array().into_iter().flatten() {
            rows.push(vec![
                text(&p["name"]),
                text(&t["rank"]),
                format!("<code>{}</code>", text(&t["file"])),
                text(&t["bytes"]),
                text(&p["stop"]["status"]),
            ]);
        }
        if p["traces"].as_array().is_none_or(|t| t.is_empty()) {
            rows.push(vec![
                text(&p["name"]),
                "—".into(),
                "no trace written".into(),
                "0".into(),
                text(&p["stop"]["status"]),
            ]);
        }
    }
    if rows.is_empty() {
        return "<p class=\"note\">No profile was captured (POST /-/profile/start?steps=N, or --profile-window NAME).</p>".into();
    }
    table(
        &[
            "capture",
            "TP rank",
            "trace",
            "bytes",
            "/stop_profile status",
        ],
        &rows,
    ) + "<p class=\"note\">Open a trace in Perfetto (ui.perfetto.dev) or chrome://tracing.</p>"
}

fn teardown(r: &Value) -> String {
    let t = &r["teardown"];
    let mut out = format!(
        "<p>Exit status <b>{}</b>{}.</p>",
        text(&t["exited"]["exit_status"]),
        if t["exited"]["requested"] == true {
            " (a requested stop)"
        } else {
            ""
        }
    );
    if let Some(f) = r["fatal"].as_object() {
        let _ = write!(
            out,
            "<p>Fatal: <b>{}</b></p><pre>{}</pre>",
            text(&f["reason"].clone()),
            text(&f["excerpt"].clone())
        );
    }
    if !t["gpu"].is_null() {
        let _ = write!(
            out,
            "<p>GPU memory given back: {}</p>",
            text(&t["gpu"]["clean"])
        );
    }
    out
}

/// The page of one report.
pub fn page(report: &Value, inputs: &Inputs) -> String {
    let title = format!(
        "sglang-supervisor report — {}",
        report["identity"]["model"].as_str().unwrap_or("run")
    );
    let mut body = format!("<h1>{}</h1>\n", esc(&title));
    body += &section("identity", &identity(report));
    body += &section("startup", &startup(report));
    body += &section("gpu", &gpu(report, inputs));
    body += &section("latency", &latency(report, inputs));
    body += &section("batches", &batches(report));
    body += &section("flags", &flags(report));
    body += &section("profiles", &profiles(report));
    body += &section("teardown", &teardown(report));
    document(&title, &body)
}

fn document(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\">\
         <title>{}</title><style>{STYLE}</style></head><body>\n{body}<p class=\"note\">sglang-supervisor {}</p></body></html>\n",
        esc(title),
        env!("CARGO_PKG_VERSION")
    )
}

/// Two reports side by side, the comparison table above them.
pub fn compare_page(base: &Value, cand: &Value, table_md: &str) -> String {
    let col = |r: &Value, label: &str| {
        format!(
            "<div><h2>{label}</h2>{}{}{}</div>",
            identity(r),
            startup(r),
            batches(r)
        )
    };
    let body = format!(
        "<h1>sglang-supervisor compare</h1><section id=\"compare\"><pre>{}</pre></section><div class=\"pair\">{}{}</div>",
        esc(table_md),
        col(base, "baseline"),
        col(cand, "candidate")
    );
    document("sglang-supervisor compare", &body)
}

/// Write atomically; see `atomic_write` for links and devices.
pub fn write(path: &Path, html: &str) -> std::io::Result<()> {
    crate::atomic_write::write(path, html.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_page_has_every_section_inline_svg_and_nothing_fetched() {
        let r = json!({
            "identity": {"model": "/m<x>", "tp": 1},
            "startup": {"ready": true, "time_to_ready_s": 4.0,
                "phases": [{"name": "cuda_graph_end", "rank": "TP0", "elapsed_s": 3.0, "duration_s": 2.0}],
                "profile": {"segments": [{"name": "cuda_graph_capture", "start_s": 1.0, "end_s": 3.0, "duration_s": 2.0, "jit_s": 1.5}],
                            "jit": {"wall_s": 1.5, "share": 0.37, "processes": 3, "cpu_s": 0.8, "intervals": [[1.2, 2.7]]},
                            "advice": "persist ~/.cache"}},
            "windows": [{"name": "c4", "requests": {"completed": 3, "benchmark_start_time_unix": 10.0, "benchmark_end_time_unix": 12.0},
                         "server_batches": {"decode": {"running_requests": {"min": 1, "mean": 2, "max": 3}}, "pressure": {}}}],
            "server_batch_series": {"t0_unix": 9.0, "t_s": [0.0, 1.0, 2.0], "kind": ["decode", "decode", "prefill"],
                "running": [1, 3, 0], "queued": [0, 1, 0], "token_usage": [0.1, 0.2, 0.1], "throughput": [100.0, 300.0, 50.0]},
            "deprecations": [{"flag": "--x", "replacement": "--y", "message": "m"}],
            "teardown": {"exited": {"exit_status": 143, "requested": true}},
        });
        let html = page(&r, &Inputs::default());
        for (id, _) in SECTIONS {
            assert!(html.contains(&format!("<section id=\"{id}\">")), "{id}");
        }
        assert!(
            html.matches("<svg").count() >= 4,
            "gantt and three batch plots"
        );
        assert!(html.contains("/m&lt;x&gt;"), "escaped");
        assert!(!html.contains(" src=") && !html.contains("href=") && !html.contains("url("));
        assert!(!html.contains("<script"));
        assert!(!html.contains("#010203"), "axis ink is currentColor");
        assert!(html.contains("persist ~/.cache"));
    }

    #[test]
    fn a_window_distribution_counts_the_request_that_opened_its_span() {
        // Three requests as the proxy logged them in a failed run: the window's span starts at
        // the first one's start, which a fast float parser read back one ULP before it.
        let starts = [
            1_796_289_988.837_783_3,
            1_796_289_988.846_714_5,
            1_796_289_988.868_510_7,
        ];
        let e2e = [0.008_707_077, 0.021_484_463, 0.034_898_625];
        let mut log = String::new();
        for (s, e) in starts.iter().zip(e2e) {
            log += &json!({"ts": "", "start_unix": s, "endpoint": "/generate", "status": 200,
                "stream": true, "ttft_s": 0.002, "e2e_s": e, "itl_s": [0.002],
                "prompt_tokens": 2, "completion_tokens": 4})
            .to_string();
            log.push('\n');
        }
        let path =
            std::env::temp_dir().join(format!("sglsup-html-span-{}.jsonl", std::process::id()));
        std::fs::write(&path, log).unwrap();
        // The report holds the window's span as the run computed it, never re-read.
        let r = json!({"windows": [{"name": "c1", "requests": {"completed": 3,
            "benchmark_start_time_unix": starts[0], "benchmark_end_time_unix": starts[2] + e2e[2]}}]});
        let html = page(
            &r,
            &Inputs {
                requests_log: Some(&path),
                ..Default::default()
            },
        );
        let _ = std::fs::remove_file(&path);
        assert!(
            html.contains("c1 (n=3)"),
            "{:?}",
            html.match_indices("c1 (n=")
                .map(|(i, _)| &html[i..i + 8])
                .collect::<Vec<_>>()
        );
    }

    /// The GPU section's two plots from one power CSV: the new header (memory.used last) gives
    /// power and memory per GPU; the old one (no memory column) and a CSV of `[N/A]` memory give
    /// the power plot and one line saying why there is no memory plot.
    #[test]
    fn the_gpu_section_plots_memory_used_under_power_from_new_csvs_and_says_why_not_for_old_ones() {
        let dir = std::env::temp_dir().join(format!("html-gpu-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let old_header = "timestamp, index, power.draw [W], temperature.gpu, clocks.current.sm [MHz], clocks.current.memory [MHz], utilization.gpu [%], utilization.memory [%]";
        let rows = |memory: &dyn Fn(u32, u32) -> String| -> String {
            let mut out = String::new();
            for i in 0..20u32 {
                for g in 0..2 {
                    out += &format!(
                        "1970/01/01 00:00:{:02}.{:03}, {g}, {}.00 W, 33, 1980 MHz, 3201 MHz, 42 %, 7 %{}\n",
                        10 + i / 10,
                        (i % 10) * 100,
                        100 + i,
                        memory(i, g)
                    );
                }
            }
            out
        };
        let new = format!(
            "{}\n{}",
            sglang_probes::sampler::CSV_HEADER,
            rows(&|i, g| format!(", {} MiB", 1024 * (g + 1) + 10 * i))
        );
        let na = format!(
            "{}\n{}",
            sglang_probes::sampler::CSV_HEADER,
            rows(&|_, _| ", [N/A]".into())
        );
        let old = format!("{old_header}\n{}", rows(&|_, _| String::new()));
        let r = json!({"windows": [{"name": "c8", "requests": {"benchmark_start_time_unix": 10.5, "benchmark_end_time_unix": 11.2}}]});
        let section_of = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            gpu(
                &r,
                &Inputs {
                    power_csv: Some(&path),
                    requests_log: None,
                },
            )
        };
        let html = section_of("new.csv", &new);
        let (power, memory) = html.split_once("<div id=\"gpu-memory\">").unwrap();
        for (part, caption) in [
            (power, "GPU power (windows shaded)"),
            (memory, "GPU memory used (windows shaded)"),
        ] {
            assert_eq!(part.matches("<svg").count(), 1, "{part}");
            assert!(part.contains(caption), "{part}");
            // plotters writes a text's content on a line of its own
            let label = |t: &str| part.contains(&format!(">\n{t}\n</text>"));
            assert!(label("GPU 0") && label("GPU 1"), "a line per GPU: {part}");
            assert!(label("c8"), "the window shaded and named: {part}");
        }
        assert!(memory.contains(">\nGiB\n</text>"), "{memory}");
        for (name, text, why) in [
            ("old.csv", &old, "has no memory.used column"),
            ("na.csv", &na, "gave no memory reading"),
        ] {
            let html = section_of(name, text);
            let (power, memory) = html.split_once("<div id=\"gpu-memory\">").unwrap();
            assert_eq!(power.matches("<svg").count(), 1, "{name}: {power}");
            assert!(!memory.contains("<svg"), "{name}: {memory}");
            assert_eq!(memory.matches("<p class=\"note\">").count(), 1, "{name}");
            assert!(memory.contains(why), "{name}: {memory}");
        }
        // A file that cannot be read at all says so under memory too, not that a column is missing.
        let missing = dir.join("absent.csv");
        let html = gpu(
            &r,
            &Inputs {
                power_csv: Some(&missing),
                requests_log: None,
            },
        );
        let (_, memory) = html.split_once("<div id=\"gpu-memory\">").unwrap();
        assert!(
            memory.contains("could not be read (telemetry_file_missing)"),
            "{memory}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
