//! `--report`: one JSON document written at exit (on failures and signals too), built from the
//! events of the run — the events are the single record of what happened; the report arranges
//! them for a benchmark PR: identity, startup, what the log warned about, the measurement windows
//! (latency from the proxy, power from the probes, with InferenceX's field names), and teardown.
use crate::cli::ReportArgs;
use crate::events::Event;
use serde_json::{json, Map, Value};
use std::path::Path;

/// Bumped when a field changes meaning or disappears.
pub const SCHEMA_VERSION: u32 = 1;

fn all<'a>(events: &'a [Value], name: &str) -> impl Iterator<Item = &'a Value> + 'a {
    let name = name.to_string();
    events.iter().filter(move |e| e["event"] == name.as_str())
}

fn first<'a>(events: &'a [Value], name: &str) -> Option<&'a Value> {
    all(events, name).next()
}

/// Without the `ts`/`event` keys every event has.
fn body(e: &Value) -> Value {
    let mut m = e.as_object().cloned().unwrap_or_default();
    m.remove("event");
    Value::Object(m)
}

pub fn build(events: &[Value]) -> Value {
    let args = first(events, "server_args")
        .map(|e| e["args"].clone())
        .unwrap_or(Value::Null);
    let info = first(events, "server_info").cloned().unwrap_or(Value::Null);
    let power = first(events, "power");
    let gpus = power.and_then(|p| p["gpus"].as_array());
    let arg = |k: &str| args.get(k).cloned().unwrap_or(Value::Null);
    let image = ["IMAGE", "SGLANG_IMAGE", "CONTAINER_IMAGE", "DOCKER_IMAGE"]
        .iter()
        .find_map(|k| std::env::var(k).ok());
    let identity = json!({
        "sglang_version": info.get("version").cloned().unwrap_or(Value::Null),
        "model": arg("model_path"),
        "served_model_name": arg("served_model_name"),
        "tp": arg("tp_size"), "ep": arg("ep_size"), "dp": arg("dp_size"), "pp": arg("pp_size"),
        "attention_backend": arg("attention_backend"),
        "mem_fraction_static": arg("mem_fraction_static"),
        "kv_cache_dtype": arg("kv_cache_dtype"),
        "quantization": arg("quantization"),
        "gpu_name": gpus.and_then(|g| g.first()).map(|g| g["name"].clone()).unwrap_or(Value::Null),
        "gpu_count": gpus.map(|g| g.len()),
        "image": image,
        "argv": first(events, "spawned").map(|e| e["argv"].clone()).unwrap_or(Value::Null),
    });
    let phases: Vec<Value> = all(events, "phase").map(body).collect();
    // Read through the events' own type, as `run` wrote them.
    let ready =
        first(events, "ready").and_then(|r| serde_json::from_value::<Event>(r.clone()).ok());
    let (time_to_ready_s, node_rank, nnodes) = match &ready {
        Some(Event::Ready {
            elapsed_s,
            node_rank,
            nnodes,
            ..
        }) => (Some(*elapsed_s), *node_rank, *nnodes),
        _ => (None, None, None),
    };
    let startup = json!({
        "ready": ready.is_some(),
        "time_to_ready_s": time_to_ready_s,
        // Multi-node launches: which node this report is of.
        "node_rank": node_rank,
        "nnodes": nnodes,
        "phases": phases,
        // Where the start's time went: segments, JIT compilation, what to do about it.
        "profile": first(events, "startup_profile").map(body),
    });
    let mut windows: Vec<Value> = all(events, "window").map(body).collect();
    let run_requests = first(events, "requests_summary").map(body);
    // The server's batch series: its aggregates go to the run window, its points stand apart.
    let mut batches = first(events, "server_batches").map(body);
    let batch_series = batches
        .as_mut()
        .and_then(|b| b.as_object_mut()?.remove("series"));
    if let Some(b) = batches.as_mut().and_then(Value::as_object_mut) {
        b.remove("ts");
    }
    if power.is_some() || run_requests.is_some() || batches.is_some() {
        let mut w = Map::new();
        w.insert("name".into(), "run".into());
        if let Some(p) = power {
            w.insert("power".into(), body(p));
        }
        if let Some(r) = run_requests {
            w.insert("requests".into(), r);
        }
        if let Some(b) = batches {
            w.insert("server_batches".into(), b);
        }
        windows.push(Value::Object(w));
    }
    let exited = first(events, "exited").map(body);
    json!({
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "sglang-supervisor", "version": env!("CARGO_PKG_VERSION")},
        "identity": identity,
        "server_args": args,
        "startup": startup,
        "deprecations": all(events, "deprecation").map(body).collect::<Vec<_>>(),
        "preflight": first(events, "preflight").map(body),
        // Torch-profiler captures: the traces (one per TP rank) with their sizes.
        "profiles": all(events, "profile").map(body).collect::<Vec<_>>(),
        "warnings": all(events, "warning").map(|e| e["message"].clone()).collect::<Vec<_>>(),
        "fatal": first(events, "fatal").map(body),
        "listening": first(events, "listening").map(body),
        "windows": windows,
        "server_batch_series": batch_series,
        "teardown": {
            "exited": exited,
            "leftover": first(events, "leftover").map(|e| e["pids"].clone()),
            "gpu": first(events, "gpu_teardown").map(body),
        },
    })
}

/// Exit status of `report` for bad input.
pub const EXIT_BAD_INPUT: i32 = crate::exit::BAD_INPUT;

/// GPUs the server used, from its resolved args (tp × pp), as the run's sampler expects them.
fn expected_gpus(events: &[Value]) -> Option<usize> {
    let args = &first(events, "server_args")?["args"];
    let size = |k: &str| args.get(k).and_then(Value::as_u64).unwrap_or(1) as usize;
    args.get("tp_size")?;
    Some(size("tp_size") * size("pp_size"))
}

/// The events of a run, one JSON object per line (other lines skipped).
/// `empty_ok`: an empty file is no run's events (a report over a benchmark's span from the
/// other files alone), not a wrong file.
fn read_events(path: &Path, empty_ok: bool) -> Result<Vec<Value>, String> {
    let text = crate::input_file::read(path).map_err(|e| {
        format!(
            "--events {}: cannot read it ({e}); pass the file `run --events` wrote",
            path.display()
        )
    })?;
    let text = String::from_utf8_lossy(&text);
    if text.trim().is_empty() {
        if empty_ok {
            return Ok(Vec::new());
        }
        return Err(format!(
            "--events {}: it is empty; pass the JSON-lines file `run --events` wrote (every run \
             writes at least its `exited` event), or --bench-result for a report of its span",
            path.display()
        ));
    }
    let events: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v.get("event").is_some_and(Value::is_string))
        .collect();
    // Ours, not only shaped like them: at least one line is an event `run` writes.
    let ours =
        |v: &Value| serde::Deserialize::deserialize(v).is_ok_and(|e: Event| e != Event::Unknown);
    if !events.iter().any(ours) {
        return Err(format!(
            "--events {}: no event of `run` in it (spawned, ready, exited, ...); pass the \
             JSON-lines file `run --events` wrote",
            path.display()
        ));
    }
    Ok(events)
}

/// The bench window `report --bench-result` adds, from files.
fn bench_window(args: &ReportArgs, events: &[Value]) -> Result<Option<Value>, String> {
    let Some(path) = &args.bench_result else {
        return Ok(None);
    };
    let b = crate::bench::load(path)?;
    let requests = args
        .requests_log
        .as_deref()
        .map(|p| match crate::bench::SpanLog::read(p)? {
            log if log.records.is_empty() => Err(format!(
                "--requests-log {}: no request in it ({} lines without a finite start_unix \
                 and e2e_s, or with a negative duration); pass the file `run --requests-log` \
                 wrote while the benchmark ran",
                p.display(),
                log.bad
            )),
            log => Ok(log),
        })
        .transpose()?;
    let span = crate::bench::span(&b, requests.as_ref().map(|l| l.records.as_slice()))?;
    let expected = args.expected_gpus.or_else(|| expected_gpus(events));
    let power = match &args.power_csv {
        Some(csv) if let Err(e) = crate::input_file::open(csv) => {
            return Err(format!(
                "--power-csv {}: cannot read it ({e}); pass the CSV `run --power-csv` wrote",
                csv.display()
            ));
        }
        Some(csv) => Some(crate::bench::power_from_files(
            csv,
            (span.0, span.1),
            expected,
        )),
        None => None,
    };
    let gpus = expected.or_else(|| {
        power
            .as_ref()
            .map(|p| p.inferencex.observed_gpu_count)
            .filter(|n| *n > 0)
    });
    Ok(Some(crate::bench::assemble(
        &args.name,
        &b,
        span,
        requests.as_ref(),
        power,
        gpus,
    )))
}

/// `report`: the report of a run from its events, with a window over a benchmark's own span.
pub fn command(args: &ReportArgs) -> anyhow::Result<i32> {
    let built = read_events(&args.events, args.bench_result.is_some()).and_then(|events| {
        let mut r = build(&events);
        if let Some(w) = bench_window(args, &events)? {
            if let Some(ws) = r["windows"].as_array_mut() {
                ws.push(w);
            }
        }
        Ok(r)
    });
    let report = match built {
        Ok(r) => r,
        Err(why) => {
            eprintln!("sglang-supervisor: report: {why}");
            return Ok(EXIT_BAD_INPUT);
        }
    };
    if let Some(path) = &args.html {
        let inputs = crate::html::Inputs {
            power_csv: args.power_csv.as_deref(),
            requests_log: args.requests_log.as_deref(),
        };
        crate::html::write(path, &crate::html::page(&report, &inputs))
            .map_err(|e| anyhow::anyhow!("cannot write the HTML report {}: {e}", path.display()))?;
    }
    match &args.output {
        Some(path) => write(path, &report)
            .map_err(|e| anyhow::anyhow!("cannot write the report {}: {e}", path.display()))?,
        None => crate::stdout::println(serde_json::to_string_pretty(&report)?)?,
    }
    Ok(0)
}

/// `run --report` and `--report-html`, from the run's events.
pub fn write_at_exit(args: &crate::cli::RunArgs, events: &[Value]) {
    if args.report.is_none() && args.report_html.is_none() {
        return;
    }
    let report = build(events);
    if let Some(path) = &args.report {
        match write(path, &report) {
            Ok(()) => tracing::info!("report written to {}", path.display()),
            Err(e) => tracing::error!("cannot write the report {}: {e}", path.display()),
        }
    }
    if let Some(path) = &args.report_html {
        let inputs = crate::html::Inputs {
            power_csv: args.power_csv.as_deref(),
            requests_log: args.requests_log.as_deref(),
        };
        match crate::html::write(path, &crate::html::page(&report, &inputs)) {
            Ok(()) => tracing::info!("HTML report written to {}", path.display()),
            Err(e) => tracing::error!("cannot write the HTML report {}: {e}", path.display()),
        }
    }
}

/// Write atomically (a reader never sees half a report); see `atomic_write` for links and devices.
pub fn write(path: &Path, report: &Value) -> std::io::Result<()> {
    let text = serde_json::to_vec_pretty(report).map_err(std::io::Error::other)?;
    crate::atomic_write::write(path, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arranges_the_events_of_a_run() {
        let ev: Vec<Value> = [
            json!({"event": "spawned", "pid": 5, "argv": ["python3"]}),
            json!({"event": "server_args", "args": {"model_path": "/m", "tp_size": 8, "api_key": "<redacted>"}}),
            json!({"event": "phase", "name": "load_weights_end", "rank": "TP0", "elapsed_s": 3.0, "duration_s": 1.0}),
            json!({"event": "deprecation", "flag": "--x", "replacement": "--y", "message": "m"}),
            json!({"event": "ready", "elapsed_s": 48.2, "url": "http://127.0.0.1:30000"}),
            json!({"event": "server_info", "version": "0.5.14"}),
            json!({"event": "window", "name": "c8", "requests": {"completed": 64, "median_ttft": 0.03}}),
            json!({"event": "power", "power_valid": 1, "gpus": [{"index": 0, "name": "NVIDIA H200"}]}),
            json!({"event": "exited", "code": null, "signal": 9, "exit_status": 143, "requested": true}),
        ]
        .into();
        let r = build(&ev);
        assert_eq!(r["schema_version"], 1);
        assert_eq!(r["identity"]["model"], "/m");
        assert_eq!(r["identity"]["tp"], 8);
        assert_eq!(r["identity"]["sglang_version"], "0.5.14");
        assert_eq!(r["identity"]["gpu_name"], "NVIDIA H200");
        assert_eq!(r["server_args"]["api_key"], "<redacted>");
        assert_eq!(r["startup"]["time_to_ready_s"], 48.2);
        assert_eq!(r["windows"][0]["requests"]["median_ttft"], 0.03);
        assert_eq!(r["windows"][1]["name"], "run");
        assert_eq!(r["windows"][1]["power"]["power_valid"], 1);
        assert_eq!(r["teardown"]["exited"]["exit_status"], 143);
        assert!(r["fatal"].is_null());
    }
}
