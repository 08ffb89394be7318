//! The `--events` contract of DESIGN.md, checked on events the supervisor wrote for a real SGLang
//! 0.5.14 server on an H200 (tests/fixtures/real-h200-supervised) and on a fresh replay run.
#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
mod common;
use common::*;
use serde_json::Value;
use std::time::Duration;

const PHASES: &[&str] = &[
    "init_distributed_begin",
    "init_distributed_end",
    "load_weights_begin",
    "load_weights_end",
    "kv_cache_allocated",
    "memory_pool_end",
    "cuda_graph_begin",
    "cuda_graph_end",
    "max_total_num_tokens",
    "http_up",
    "warmup",
];

fn check(e: &Value) {
    let ts = e["ts"].as_str().unwrap_or_else(|| panic!("no ts: {e}"));
    assert!(
        ts.len() >= 20 && ts.ends_with('Z') && ts.as_bytes()[10] == b'T',
        "RFC 3339 UTC: {ts}"
    );
    // Every line reads back as the supervisor's own `Event` type (the H200 call-3 fixture's
    // `power_window` predates it).
    let typed = sglang_supervisor::events::Event::parse_line(&e.to_string());
    match typed {
        Some(sglang_supervisor::events::Event::Unknown) => {
            assert_eq!(e["event"], "power_window", "not an Event: {e}")
        }
        Some(t) => assert_eq!(t.name(), e["event"].as_str().unwrap(), "{e}"),
        None => panic!("does not read back as an Event: {e}"),
    }
    let has = |k: &str| e.get(k).is_some();
    let num = |k: &str| e[k].is_number();
    match e["event"].as_str().unwrap() {
        "spawned" => assert!(e["pid"].is_i64() && e["argv"].is_array(), "{e}"),
        "phase" => {
            let name = e["name"].as_str().unwrap();
            assert!(PHASES.contains(&name), "phase name {name}");
            assert!(num("elapsed_s"), "{e}");
            if name.ends_with("_end") || name == "warmup" {
                assert!(num("duration_s"), "{name} carries duration_s: {e}");
            }
            // The start-up profiler's share of the stage (absent in events of old versions).
            if has("jit_s") {
                assert!(
                    (name.ends_with("_end") || name == "warmup") && num("jit_s"),
                    "jit_s only on a stage's end: {e}"
                );
            }
            if has("rank") {
                assert!(e["rank"].as_str().unwrap().split(' ').all(|p| p
                    .trim_end_matches(|c: char| c.is_ascii_digit())
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c == '_')));
            }
        }
        "server_args" => assert!(e["args"].is_object(), "{e}"),
        "deprecation" => assert!(
            has("flag") && has("replacement") && e["message"].is_string(),
            "{e}"
        ),
        "warning" => assert!(e["message"].is_string(), "{e}"),
        "ready" => assert!(
            num("elapsed_s") && e["url"].as_str().unwrap().starts_with("http://"),
            "{e}"
        ),
        "fatal" => assert!(e["reason"].is_string() && e["excerpt"].is_string(), "{e}"),
        "signal" => assert!(
            e["signal"].as_str().unwrap().starts_with("SIG") && e["target"].is_string(),
            "{e}"
        ),
        "exited" => {
            assert!(
                has("code") && has("signal") && num("elapsed_s") && e["requested"].is_boolean(),
                "{e}"
            );
            assert!(e["exit_status"].is_i64(), "{e}");
        }
        "leftover" => assert!(e["pids"].is_array(), "{e}"),
        // Extensions of the contract (DESIGN.md: "extend freely").
        "power" => assert!(
            e["power_valid"].is_u64() && e["reasons"].is_array() && e["gpus"].is_array(),
            "{e}"
        ),
        "gpu_teardown" => assert!(e["clean"].is_boolean() && e["gpus"].is_array(), "{e}"),
        // The H200 call-3 fixture predates the combined `window` event.
        "power_window" => assert!(
            e["name"].is_string() && e["power_valid"].is_u64() && e["gpus"].is_array(),
            "{e}"
        ),
        "listening" => assert!(e["metrics"].is_string() || e["proxy"].is_string(), "{e}"),
        "window" => assert!(
            e["name"].is_string()
                && (e["power"].is_object()
                    || e["requests"].is_object()
                    || e["server_batches"].is_object()
                    || e["profile"].is_object()),
            "{e}"
        ),
        "startup_profile" => assert!(
            e["segments"].is_array() && e["jit"]["wall_s"].is_number() && e["samples"].is_u64(),
            "{e}"
        ),
        "profile" => assert!(e["ok"].is_boolean() && e["traces"].is_array(), "{e}"),
        "server_batches" => assert!(
            e["decode"]["lines"].is_u64()
                && e["prefill"]["lines"].is_u64()
                && e["pressure"]["retractions"].is_u64()
                && e["series"]["t_s"].is_array(),
            "{e}"
        ),
        "requests_summary" => assert!(e["completed"].is_u64() && e["errors"].is_u64(), "{e}"),
        "server_info" => assert!(e.get("version").is_some(), "{e}"),
        other => panic!("event {other} is not in the contract"),
    }
}

#[test]
fn events_from_the_real_h200_run_follow_the_contract() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/real-h200-supervised/A_events.jsonl");
    let events: Vec<Value> = std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    events.iter().for_each(check);
    let names: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(names.first(), Some(&"spawned"));
    assert_eq!(names.last(), Some(&"exited"));
    let ex = events.last().unwrap();
    assert_eq!(
        (
            ex["exit_status"].as_i64(),
            ex["requested"].as_bool(),
            ex["signal"].as_i64()
        ),
        (Some(143), Some(true), Some(9))
    );
}

#[test]
fn events_of_the_real_failure_and_power_runs_follow_the_contract() {
    for f in ["G_events.jsonl", "P_events.jsonl", "R_events.jsonl"] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/real-h200-supervised")
            .join(f);
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .for_each(|e| check(&e));
    }
}

/// The power CSV written on the H200 reads like nvidia-smi's, and integrating it the way the
/// InferenceX aggregation does (trapezoids over power.draw) gives the window's energy.
#[test]
fn the_real_power_csv_integrates_to_the_windows_energy() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/real-h200-supervised");
    let csv = std::fs::read_to_string(dir.join("P_power.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next().unwrap(),
        "timestamp, index, power.draw [W], temperature.gpu, clocks.current.sm [MHz], clocks.current.memory [MHz], utilization.gpu [%], utilization.memory [%]"
    );
    let mut pts = Vec::new();
    for l in lines {
        let c: Vec<&str> = l.split(", ").collect();
        assert_eq!(c.len(), 8, "{l}");
        let (date, time) = c[0].split_once(' ').unwrap();
        let hms: Vec<f64> = time.split(':').map(|x| x.parse().unwrap()).collect();
        assert_eq!(date, "2026/12/02");
        let t = hms[0] * 3600.0 + hms[1] * 60.0 + hms[2];
        pts.push((t, c[2].trim_end_matches(" W").parse::<f64>().unwrap()));
    }
    let integral: f64 = pts
        .windows(2)
        .map(|w| (w[1].0 - w[0].0) * (w[0].1 + w[1].1) / 2.0)
        .sum();
    let ev: Vec<Value> = std::fs::read_to_string(dir.join("P_events.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let power = ev.iter().find(|e| e["event"] == "power").unwrap();
    let counter = power["gpus"][0]["energy_j"].as_f64().unwrap();
    assert!(
        (integral - counter).abs() / counter < 0.03,
        "CSV integral {integral:.1} J vs counter {counter:.1} J"
    );
    assert_eq!(power["power_valid"], 1);
}

#[test]
fn events_of_a_replayed_run_follow_the_contract() {
    let mut run = Run::start(
        "contract",
        Opts {
            replay: &["--speed", "50", "--ranks", "DP0 TP0 EP0,DP0 TP1 EP1"],
            ..Default::default()
        },
    );
    run.wait_event("ready", Duration::from_secs(60));
    run.stop_by_sigterm();
    let events = run.events();
    events.iter().for_each(check);
    assert!(events.iter().any(|e| e["rank"] == "DP0 TP1 EP1"));
    let pool = events
        .iter()
        .find(|e| e["name"] == "memory_pool_end" && e["rank"] == "DP0 TP1 EP1")
        .unwrap();
    assert!(
        pool["duration_s"].is_number(),
        "measured from load_weights_end: {pool}"
    );
    // The start-up profiler's additions: jit_s on the warm-up, one profile, before `ready`.
    let warmup = events.iter().find(|e| e["name"] == "warmup").unwrap();
    assert!(warmup["jit_s"].is_number(), "{warmup}");
    let at = |name: &str| events.iter().position(|e| e["event"] == name);
    let profiles = events
        .iter()
        .filter(|e| e["event"] == "startup_profile")
        .count();
    assert_eq!(profiles, 1);
    assert!(at("startup_profile") < at("ready"));
}

/// On the H200, bench_serving ran through the proxy: the proxy's own per-request figures
/// (requests log) agree with what bench_serving measured on the client side.
#[test]
fn the_real_proxy_measurements_agree_with_bench_serving() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/real-h200-supervised");
    std::fs::read_to_string(dir.join("B_events.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .for_each(|e| check(&e));
    let bench: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("B_bench_details.json")).unwrap())
            .unwrap();
    let recs: Vec<Value> = std::fs::read_to_string(dir.join("B_requests.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let n = bench["completed"].as_u64().unwrap() as usize;
    // bench_serving's warm-up request went through the proxy first.
    let recs = &recs[recs.len() - n..];
    let mut ours: Vec<f64> = recs.iter().map(|r| r["ttft_s"].as_f64().unwrap()).collect();
    let mut theirs: Vec<f64> = bench["ttfts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    ours.sort_by(f64::total_cmp);
    theirs.sort_by(f64::total_cmp);
    let worst = ours
        .iter()
        .zip(&theirs)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    assert!(
        worst < 0.010,
        "TTFT per request within 10 ms of bench_serving's, worst {worst}"
    );
    let med = |mut v: Vec<f64>| sglang_supervisor_tests::median(&mut v);
    let itl_ours = med(recs
        .iter()
        .flat_map(|r| {
            r["itl_s"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
        })
        .collect());
    let itl_theirs = med(bench["itls"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()))
        .collect());
    assert!(
        (itl_ours - itl_theirs).abs() / itl_theirs < 0.05,
        "ITL {itl_ours} vs {itl_theirs}"
    );
    let tpot = med(recs.iter().map(|r| r["tpot_s"].as_f64().unwrap()).collect()) * 1000.0;
    assert!(
        (tpot - bench["median_tpot_ms"].as_f64().unwrap()).abs() < 0.1,
        "TPOT {tpot} ms"
    );
    let tokens: u64 = recs
        .iter()
        .map(|r| r["completion_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(tokens, bench["total_output_tokens"].as_u64().unwrap());
}
