//! Where a run's time goes: the server's own batch series from its log, start-up attribution of
//! the process tree, the HTML report. The real binary against the replay server and real
//! processes.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)] // test code: a panic is the failure report
mod common;
use common::*;
use serde_json::{json, Value};
use sglang_supervisor_tests::http;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(60);

/// The recorded B_decode_graph start up to its ready line, then `after` (lines whose timestamps
/// put them that many recorded seconds after the ready line).
fn start_then(after: &[(u64, &str)]) -> String {
    let log = std::fs::read_to_string(fixture("B_decode_graph").join("server.log")).unwrap();
    let mut out = String::new();
    for line in log.lines() {
        out.push_str(line);
        out.push('\n');
        if line.contains("ready to roll") {
            break;
        }
    }
    // The ready line is at 09:23:08.
    for (secs, text) in after {
        let t = 8 + secs;
        out.push_str(&format!(
            "[2026-12-02 09:{:02}:{:02}{text}\n",
            23 + t / 60,
            t % 60
        ));
    }
    out
}

fn scrape_until(addr: &str, want: &str) -> String {
    let end = Instant::now() + T;
    loop {
        let (_, body) = http(addr, "GET", "/metrics", "");
        if body.contains(want) || Instant::now() > end {
            return body;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn batch_lines_become_metrics_window_statistics_and_a_run_summary_with_retractions() {
    let dec = |r: u32, q: u32, u: &str| {
        format!("] Decode batch, #running-req: {r}, #token: 900, token usage: {u}, cuda graph: True, gen throughput (token/s): {}.50, #queue-req: {q}", 100 * r)
    };
    let lines = [
        (100, dec(4, 0, "0.10")),
        (105, dec(8, 2, "0.20")),
        (110, "] KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_tokens_gained: 4096, #new_token_ratio: 0.7000 -> 0.8500".to_string()),
        (115, dec(12, 4, "0.30")),
    ];
    let after: Vec<(u64, &str)> = lines.iter().map(|(s, l)| (*s, l.as_str())).collect();
    let dir = std::env::temp_dir().join(format!("sglsup-batchlog-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("server.log");
    std::fs::write(&log, start_then(&after)).unwrap();
    let report_path = dir.join("report.json");
    let mut run = Run::start(
        "batches",
        Opts {
            supervisor: &["--report", report_path.to_str().unwrap()],
            // Scheduler lines (batch lines among them) get the TP0 prefix.
            replay: &[
                "--speed",
                "50",
                "--ranks",
                "TP0",
                "--log",
                log.to_str().unwrap(),
            ],
            ..Default::default()
        },
    );
    let addr = run.wait_event("listening", T)["metrics"]
        .as_str()
        .unwrap()
        .to_string();
    run.wait_event("ready", T);
    let (status, _) = http(&addr, "POST", "/-/window/start?name=c4", "");
    assert!(status.contains("200"), "{status}");
    let body = scrape_until(
        &addr,
        "sglang_supervisor_server_running_requests{kind=\"decode\",rank=\"TP0\"} 12",
    );
    for want in [
        "sglang_supervisor_server_running_requests{kind=\"decode\",rank=\"TP0\"} 12",
        "sglang_supervisor_server_queued_requests{kind=\"decode\",rank=\"TP0\"} 4",
        "sglang_supervisor_server_token_usage_ratio{kind=\"decode\",rank=\"TP0\"} 0.3",
        "sglang_supervisor_server_throughput_tokens_per_second{kind=\"decode\",rank=\"TP0\"} 1200.5",
        "sglang_supervisor_server_cuda_graph{kind=\"decode\",rank=\"TP0\"} 1",
        "sglang_supervisor_server_batch_lines_total{kind=\"decode\"} 3",
        "sglang_supervisor_server_retractions_total 1",
        "sglang_supervisor_server_retracted_requests_total 3",
        "sglang_supervisor_server_cuda_oom_total 0",
    ] {
        assert!(body.contains(want), "missing {want:?} in:\n{body}");
    }
    let (status, w) = http(&addr, "POST", "/-/window/stop", "");
    assert!(status.contains("200"), "{status}");
    let w: Value = serde_json::from_str(&w).unwrap();
    let sb = &w["server_batches"];
    assert_eq!(w["name"], "c4");
    assert_eq!(
        sb["decode"]["running_requests"],
        json!({"min": 4.0, "mean": 8.0, "max": 12.0}),
        "{w}"
    );
    assert_eq!(sb["decode"]["queued_requests"]["max"], json!(4.0));
    assert_eq!(sb["decode"]["cuda_graph_share"], json!(1.0));
    assert_eq!(sb["pressure"]["retracted_requests"], json!(3));
    assert!(sb["pressure"]["first"]
        .as_str()
        .unwrap()
        .contains("KV cache pool is full"));
    // Only the window's own lines: the warm-up's prefill before it is not in it.
    assert_eq!(sb["prefill"]["samples"], json!(0), "{w}");
    run.signal(libc::SIGTERM);
    assert_eq!(run.wait(T), 143);
    let ev = run.events_named("server_batches").pop().unwrap();
    assert_eq!(ev["decode"]["lines"], json!(3));
    assert_eq!(ev["prefill"]["lines"], json!(1), "the warm-up's prefill");
    assert_eq!(ev["series"]["running"].as_array().unwrap().len(), 4);
    let report: Value = serde_json::from_slice(&std::fs::read(&report_path).unwrap()).unwrap();
    let windows = report["windows"].as_array().unwrap();
    assert!(windows.iter().any(|w| w["name"] == "c4"
        && w["server_batches"]["decode"]["running_requests"]["max"] == json!(12.0)));
    let whole = windows.iter().find(|w| w["name"] == "run").unwrap();
    assert_eq!(whole["server_batches"]["pressure"]["retractions"], json!(1));
    assert_eq!(
        report["server_batch_series"]["kind"]
            .as_array()
            .unwrap()
            .len(),
        4
    );
    let _ = std::fs::remove_dir_all(&dir);
}
