//! The latency-measuring proxy end to end: real HTTP over loopback through the supervisor's proxy
//! to the replay server's SGLang-shaped `/generate` and `/v1/completions` streams.
#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
mod common;
use common::*;
use serde_json::Value;
use sglang_exporters::proxy::Api;
use sglang_supervisor_tests::{http, post_timed, stat_cpu_ticks, Timed};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(60);

fn post(addr: &str, path: &str, body: &str) -> Timed {
    post_timed(addr, path, body).unwrap()
}

fn start(name: &str, extra: &[&str]) -> (Run, String, String, std::path::PathBuf) {
    start_with(name, extra, &[], &[])
}

fn start_with(
    name: &str,
    extra: &[&str],
    replay_extra: &[&str],
    env: &[(&str, &str)],
) -> (Run, String, String, std::path::PathBuf) {
    let dir = std::env::temp_dir();
    let log = dir.join(format!(
        "sglsup-{name}-{}-requests.jsonl",
        std::process::id()
    ));
    let log_s = log.to_str().unwrap().to_string();
    let sup = [&["--requests-log", log_s.as_str()], extra].concat();
    let (run, proxy, metrics) = Run::start_with_proxy(
        name,
        Opts {
            supervisor: &sup,
            replay: replay_extra,
            env,
            stderr: std::fs::File::create(stderr_of(name)).unwrap().into(),
            ..Default::default()
        },
    );
    (run, proxy, metrics, log)
}

/// Where the supervisor started by [`start_with`] as `name` writes its own messages.
fn stderr_of(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("sglsup-{name}-{}-stderr.log", std::process::id()))
}

fn records(log: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn wait_records(log: &std::path::Path, n: usize) -> Vec<Value> {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let r = records(log);
        if r.len() >= n || Instant::now() > end {
            return r;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stop(mut run: Run) {
    run.stop_by_sigterm();
}

/// The payload of an HTTP/1.1 body, chunked or not.
fn dechunk(body: &str) -> String {
    let chunked = body
        .split_once("\r\n")
        .is_some_and(|(size, _)| usize::from_str_radix(size.trim(), 16).is_ok());
    if !chunked {
        return body.to_string();
    }
    String::from_utf8_lossy(&sglang_supervisor_tests::dechunked(body.as_bytes())).into_owned()
}

#[test]
fn every_endpoint_streamed_or_not_usage_asked_or_not_gets_exact_tokens_and_identical_bytes() {
    endpoint_matrix("proxy-matrix", &[]);
}

#[test]
fn read_in_sweeps_every_endpoint_still_gets_exact_tokens_and_identical_bytes() {
    // Streaming answers read once a millisecond after their first event (exporters' sweep.rs).
    endpoint_matrix(
        "proxy-matrix-swept",
        &[("SGLANG_SUPERVISOR_PROXY_SWEEP_US", "1000")],
    );
}

#[test]
fn with_spinning_shards_every_endpoint_still_gets_exact_tokens_and_identical_bytes() {
    // Shards poll without sleeping while a request is in flight (exporters' spin.rs).
    endpoint_matrix(
        "proxy-matrix-spin",
        &[("SGLANG_SUPERVISOR_PROXY_SPIN", "1")],
    );
}

/// CPU time (clock ticks) of the supervisor's threads named `name`.
fn thread_ticks(pid: u32, name: &str) -> u64 {
    let mut total = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        total += stat_cpu_ticks(&stat).unwrap_or(0);
    }
    total
}

#[test]
fn a_spinning_shard_uses_a_core_while_a_request_streams_and_none_when_idle() {
    let (run, proxy, _, _) = start_with(
        "proxy-spin-cpu",
        &[],
        &["--token-gap-us", "20000"],
        &[
            ("SGLANG_SUPERVISOR_PROXY_SPIN", "1"),
            ("SGLANG_SUPERVISOR_PROXY_THREADS", "1"),
        ],
    );
    let pid = run.child.id();
    let ticks_over = |ms: u64| {
        let t0 = thread_ticks(pid, "proxy-0");
        std::thread::sleep(Duration::from_millis(ms));
        thread_ticks(pid, "proxy-0") - t0
    };
    let idle_before = ticks_over(500);
    // 60 tokens 20 ms apart: some 1.2 s in flight.
    let body = r#"{"text":"a b","sampling_params":{"max_new_tokens":60},"stream":true}"#;
    let p = proxy.clone();
    let client = std::thread::spawn(move || post(&p, "/generate", body));
    std::thread::sleep(Duration::from_millis(150));
    let streaming = ticks_over(500);
    let answer = client.join().unwrap();
    assert!(answer.status.contains("200"), "{}", answer.status);
    std::thread::sleep(Duration::from_millis(100));
    let idle_after = ticks_over(500);
    // Clock ticks are 10 ms: 500 ms of a core is 50, shared with the rest of a 2-core machine.
    assert!(idle_before <= 5, "idle before: {idle_before} ticks");
    assert!(streaming >= 20, "while streaming: {streaming} ticks");
    assert!(idle_after <= 5, "idle after: {idle_after} ticks");
}

fn endpoint_matrix(name: &str, env: &[(&str, &str)]) {
    // Like a busy SGLang, every third event carries two tokens; chat answers start with four
    // reasoning tokens.
    let (run, proxy, _, log) = start_with(
        name,
        &[],
        &["--merge-every", "3", "--reasoning-tokens", "4"],
        env,
    );
    let direct = format!("127.0.0.1:{}", run.port);
    let n = 10u64;
    for (
        i,
        Case {
            path,
            body,
            streamed,
            ..
        },
    ) in matrix(n).iter().enumerate()
    {
        let via = post(&proxy, path, body);
        let straight = post(&direct, path, body);
        assert!(via.status.contains("200"), "{path} {body}: {}", via.status);
        assert_eq!(
            dechunk(&via.body),
            dechunk(&straight.body),
            "{path} {body}: the client must get the bytes a direct connection gives"
        );
        let asked = body.contains("include_usage");
        assert_eq!(
            via.body.contains(r#""choices":[],"usage""#),
            asked && *path != "/generate",
            "{path} {body}: a usage-only event exactly when the client asked"
        );
        let rec = wait_records(&log, i + 1).pop().unwrap();
        let what = format!("{path} {body}: {rec}");
        assert_eq!(rec["status"], 200, "{what}");
        assert!(rec.get("error").is_none(), "{what}");
        assert_eq!(rec["stream"], *streamed, "{what}");
        assert_eq!(rec["completion_tokens"], n, "{what}");
        assert_eq!(rec["prompt_tokens"], 4, "{what}");
        assert!(rec["e2e_s"].as_f64().unwrap() > 0.0, "{what}");
        assert!(rec["start_unix"].as_f64().unwrap() > 1e9, "{what}");
        if !streamed {
            assert!(rec.get("ttft_s").is_none(), "{what}");
            continue;
        }
        let ttft = rec["ttft_s"].as_f64().unwrap();
        let tpot = rec["tpot_s"].as_f64().unwrap();
        let e2e = rec["e2e_s"].as_f64().unwrap();
        assert!(
            (tpot - (e2e - ttft) / (n - 1) as f64).abs() < 1e-9,
            "{what}"
        );
        let itl = rec["itl_s"].as_array().unwrap().len() as u64;
        let expected = if *path == "/generate" {
            n - 1 // bench_serving's native split: one gap per token after the first event's
        } else {
            output_events(n, 3) - 1 // one per event with output; reasoning events count
        };
        assert_eq!(itl, expected, "{what}");
    }
    stop(run);
    let _ = std::fs::remove_file(log);
}

#[test]
fn streamed_generate_is_measured_like_bench_serving_and_passes_through_unchanged() {
    let (run, proxy, metrics, log) = start("proxy-gen", &[]);
    let body = r#"{"text":"The capital of France is","sampling_params":{"max_new_tokens":32},"stream":true}"#;
    let direct = post(&format!("127.0.0.1:{}", run.port), "/generate", body);
    let via = post(&proxy, "/generate", body);
    assert!(via.status.contains("200"), "{}", via.status);
    // Same SSE events either way (the proxy re-frames chunks, the data is the same).
    let events = |b: &str| {
        b.lines()
            .filter(|l| l.starts_with("data: "))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(events(&via.body), events(&direct.body));
    assert_eq!(events(&via.body).last().unwrap(), "data: [DONE]");
    let rec = wait_records(&log, 1).pop().unwrap();
    assert_eq!(rec["endpoint"], "/generate");
    assert_eq!(rec["stream"], true);
    assert_eq!(rec["completion_tokens"], 32);
    assert_eq!(
        rec["itl_s"].as_array().unwrap().len(),
        31,
        "one gap per token after the first"
    );
    let (ttft, e2e, tpot) = (
        rec["ttft_s"].as_f64().unwrap(),
        rec["e2e_s"].as_f64().unwrap(),
        rec["tpot_s"].as_f64().unwrap(),
    );
    assert!(
        (tpot - (e2e - ttft) / 31.0).abs() < 1e-9,
        "TPOT = (E2E - TTFT)/(n - 1)"
    );
    // The proxy sits between client and server: its times are within the client's.
    let client_ttft = via.first_text.unwrap().as_secs_f64();
    assert!(
        ttft <= client_ttft + 0.002 && ttft > 0.0,
        "proxy TTFT {ttft} vs client {client_ttft}"
    );
    assert!(
        e2e <= via.total.as_secs_f64() + 0.002,
        "proxy E2E {e2e} vs client {:?}",
        via.total
    );
    assert!(e2e > 0.03, "32 tokens 2 ms apart: {e2e}");
    // Histograms with SGLang's bucket edges on /metrics.
    let m = {
        let mut s = TcpStream::connect(&metrics).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut b = String::new();
        s.read_to_string(&mut b).unwrap();
        b
    };
    assert!(m.contains("sglang_supervisor_request_ttft_seconds_bucket{endpoint=\"/generate\",status=\"200\",le=\"0.1\"} 1"), "{m}");
    assert!(m.contains("sglang_supervisor_request_completion_tokens_total{endpoint=\"/generate\",status=\"200\"} 32"), "{m}");
    assert!(
        m.contains("sglang_supervisor_requests_total{endpoint=\"/generate\",status=\"200\"} 1"),
        "{m}"
    );
    stop(run);
    let _ = std::fs::remove_file(log);
}

/// `sglang-replay --step-us` (benches/proxy.sh's `STEP_US`) writes every stream's events at the
/// same instants, as SGLang's HTTP thread writes all running requests' events after each decode
/// step: two streams started apart get their tokens on one grid, a step apart.
#[test]
fn the_replay_server_in_steps_writes_every_stream_on_one_grid() {
    let step = 0.040;
    let (run, proxy, _, log) = start_with("replay-steps", &[], &["--step-us", "40000"], &[]);
    let body = r#"{"text":"x","sampling_params":{"max_new_tokens":10},"stream":true}"#;
    let first = {
        let proxy = proxy.clone();
        std::thread::spawn(move || post(&proxy, "/generate", body))
    };
    std::thread::sleep(Duration::from_millis(13));
    let second = post(&proxy, "/generate", body);
    let first = first.join().unwrap();
    assert!(first.status.contains("200") && second.status.contains("200"));
    let recs = wait_records(&log, 2);
    assert_eq!(recs.len(), 2);
    // Each event's arrival, as a phase within the step; tokens of one event share it.
    let mut phases = Vec::new();
    for r in &recs {
        let mut t = r["start_unix"].as_f64().unwrap() + r["ttft_s"].as_f64().unwrap();
        phases.push(t.rem_euclid(step));
        for gap in r["itl_s"].as_array().unwrap() {
            let gap = gap.as_f64().unwrap();
            assert!(gap < 1.5 * step, "a gap of {gap} s, the step is {step} s");
            t += gap;
            phases.push(t.rem_euclid(step));
        }
    }
    let apart = |p: f64| {
        let d = (p - phases[0]).rem_euclid(step);
        d.min(step - d)
    };
    let worst = phases.iter().copied().map(apart).fold(0.0, f64::max);
    assert!(
        worst < step / 4.0,
        "events {worst} s off the first one's phase (step {step} s): {phases:?}"
    );
    stop(run);
}

#[test]
fn openai_streams_and_plain_responses_take_counts_from_usage() {
    let (run, proxy, _, log) = start("proxy-openai", &[]);
    let r = post(
        &proxy,
        "/v1/completions",
        r#"{"model":"m","prompt":"a b c","max_tokens":5,"stream":true}"#,
    );
    assert!(r.status.contains("200"));
    let r = post(
        &proxy,
        "/generate",
        r#"{"text":"a b","sampling_params":{"max_new_tokens":7}}"#,
    );
    assert!(r.status.contains("200") && r.body.contains("meta_info"));
    // Any other path passes through untouched (and is not measured).
    let via = post(&proxy, "/v1/models", "");
    let direct = post(&format!("127.0.0.1:{}", run.port), "/v1/models", "");
    assert_eq!((via.status, via.body), (direct.status, direct.body));
    let recs = wait_records(&log, 2);
    assert_eq!(
        recs.len(),
        2,
        "only generation endpoints are logged: {recs:?}"
    );
    assert_eq!(
        (
            recs[0]["stream"].clone(),
            recs[0]["completion_tokens"].clone(),
            recs[0]["prompt_tokens"].clone()
        ),
        (true.into(), 5.into(), 3.into())
    );
    assert_eq!(recs[0]["itl_s"].as_array().unwrap().len(), 4);
    assert_eq!(
        (
            recs[1]["stream"].clone(),
            recs[1]["completion_tokens"].clone()
        ),
        (false.into(), 7.into())
    );
    assert!(recs[1].get("ttft_s").is_none(), "no TTFT without a stream");
    stop(run);
    let _ = std::fs::remove_file(log);
}

#[test]
fn five_hundred_twelve_concurrent_streams_all_complete() {
    let (run, proxy, _, log) = start("proxy-512", &[]);
    let threads: Vec<_> = (0..512)
        .map(|_| {
            let p = proxy.clone();
            std::thread::spawn(move || {
                post(
                    &p,
                    "/generate",
                    r#"{"text":"x","sampling_params":{"max_new_tokens":16},"stream":true}"#,
                )
            })
        })
        .collect();
    let results: Vec<Timed> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(results
        .iter()
        .all(|r| r.status.contains("200") && r.body.contains("data: [DONE]")));
    let recs = wait_records(&log, 512);
    assert_eq!(recs.len(), 512);
    assert!(recs
        .iter()
        .all(|r| r["completion_tokens"] == 16 && r.get("error").is_none()));
    stop(run);
    let _ = std::fs::remove_file(log);
}

#[test]
fn a_dead_upstream_is_a_clear_502_and_the_proxy_survives() {
    let closed = free_port();
    let upstream = format!("http://127.0.0.1:{closed}");
    // Readiness from the live replay, proxying to a port nobody listens on.
    let (run, proxy, _, log) = start(
        "proxy-502",
        &[
            "--upstream",
            &upstream,
            "--health-url",
            "http://127.0.0.1:{port}",
        ],
    );
    for _ in 0..3 {
        let r = post(&proxy, "/generate", r#"{"text":"x","stream":true}"#);
        assert!(r.status.contains("502"), "{}", r.status);
        let v: Value = serde_json::from_str(&r.body).unwrap();
        assert!(
            v["error"]["message"].as_str().unwrap().contains(&upstream),
            "{v}"
        );
    }
    let recs = wait_records(&log, 3);
    assert!(recs
        .iter()
        .all(|r| r["status"] == 502 && r["error"].is_string()));
    stop(run);
    let _ = std::fs::remove_file(log);
}

#[test]
fn a_client_that_leaves_mid_stream_aborts_the_request() {
    let (run, proxy, _, log) = start("proxy-abort", &[]);
    {
        let mut s = TcpStream::connect(&proxy).unwrap();
        let body = r#"{"text":"x","sampling_params":{"max_new_tokens":2000},"stream":true}"#;
        let req = post_request("/generate", body);
        s.write_all(req.as_bytes()).unwrap();
        let mut buf = [0u8; 1024];
        let _ = s.read(&mut buf).unwrap();
    } // dropped: the client is gone after the first bytes
    let rec = wait_records(&log, 1).pop().unwrap();
    assert_eq!(rec["error"], "client disconnected");
    assert!(
        rec["e2e_s"].as_f64().unwrap() < 3.0,
        "aborted early, not after 2000 tokens"
    );
    stop(run);
    let _ = std::fs::remove_file(log);
}

#[test]
fn a_window_reports_what_a_benchmark_pr_quotes() {
    let (run, proxy, metrics, log) = start("proxy-report", &[]);
    post(
        &proxy,
        "/generate",
        r#"{"text":"before","sampling_params":{"max_new_tokens":4},"stream":true}"#,
    );
    assert!(http(&metrics, "POST", "/-/window/start?name=c4", "")
        .0
        .contains("200"));
    for _ in 0..10 {
        post(
            &proxy,
            "/generate",
            r#"{"text":"a b c","sampling_params":{"max_new_tokens":20},"stream":true}"#,
        );
    }
    let (st, body) = http(&metrics, "POST", "/-/window/stop", "");
    assert!(st.contains("200"), "{st}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let r = &v["requests"];
    assert_eq!(v["name"], "c4");
    assert_eq!(r["completed"], 10, "only the window's requests: {r}");
    assert_eq!(r["total_output_tokens"], 200);
    assert_eq!(r["total_input_tokens"], 30);
    for k in [
        "median_ttft_ms",
        "p99_ttft_ms",
        "median_tpot_ms",
        "median_itl_ms",
        "median_e2el_ms",
        "median_ttft",
        "median_e2el",
        "output_throughput",
        "total_token_throughput",
    ] {
        assert!(r[k].is_number(), "{k} in {r}");
    }
    assert!(r.get("tput_per_gpu").is_none(), "no GPU count without GPUs");
    let mut run = run;
    run.stop_by_sigterm();
    let summary = run.events_named("requests_summary").pop().unwrap();
    assert_eq!(summary["completed"], 11, "the whole run");
    assert_eq!(run.events_named("window").len(), 1);
    let _ = std::fs::remove_file(log);
}

#[test]
fn a_window_start_while_one_is_open_closes_and_records_the_open_one() {
    let (run, proxy, metrics, log) = start("proxy-window-twice", &[]);
    let gen = r#"{"text":"a b","sampling_params":{"max_new_tokens":4},"stream":true}"#;
    assert!(http(&metrics, "POST", "/-/window/start?name=c1", "")
        .0
        .contains("200"));
    for _ in 0..3 {
        post(&proxy, "/generate", gen);
    }
    // No stop: the next start must not lose c1's three requests.
    let (st, body) = http(&metrics, "POST", "/-/window/start?name=c2", "");
    assert!(st.contains("200"), "{st} {body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["started"], "c2", "{v}");
    assert_eq!(v["closed"]["name"], "c1", "{v}");
    assert_eq!(v["closed"]["requests"]["completed"], 3, "{v}");
    for _ in 0..2 {
        post(&proxy, "/generate", gen);
    }
    let (st, body) = http(&metrics, "POST", "/-/window/stop", "");
    assert!(st.contains("200"), "{st}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["name"], "c2");
    assert_eq!(v["requests"]["completed"], 2, "only c2's requests: {v}");
    let mut run = run;
    run.stop_by_sigterm();
    let windows = run.events_named("window");
    let names: Vec<_> = windows.iter().map(|w| w["name"].clone()).collect();
    assert_eq!(names, ["c1", "c2"], "both windows recorded: {windows:?}");
    assert_eq!(windows[0]["requests"]["completed"], 3);
    let _ = std::fs::remove_file(log);
}

#[test]
fn a_large_request_body_streams_through() {
    let (run, proxy, _, log) = start("proxy-big", &[]);
    // A 32 MB prompt: the proxy streams it to the server without holding it.
    let prompt = "word ".repeat(32 << 20 >> 3);
    let body =
        format!(r#"{{"text":"{prompt}","sampling_params":{{"max_new_tokens":3}},"stream":true}}"#);
    let r = post(&proxy, "/generate", &body);
    assert!(r.status.contains("200"), "{}", r.status);
    let rec = wait_records(&log, 1).pop().unwrap();
    assert_eq!(rec["completion_tokens"], 3);
    assert_eq!(
        rec["prompt_tokens"],
        (32u64 << 20 >> 3),
        "the server saw every word"
    );
    stop(run);
    let _ = std::fs::remove_file(log);
}

#[test]
fn a_whole_answer_of_many_megabytes_is_counted_without_being_held() {
    // 1.5M tokens in one JSON answer (~16 MB: text and output_ids), past the 8 MiB the proxy
    // once kept of a body to count it (and gave up on beyond).
    let (run, proxy, _, log) = start_with("proxy-big-answer", &[], &["--token-gap-us", "0"], &[]);
    let n = 1_500_000u64;
    let body = format!(r#"{{"text":"one two three","sampling_params":{{"max_new_tokens":{n}}}}}"#);
    let r = post(&proxy, "/generate", &body);
    assert!(r.status.contains("200"), "{}", r.status);
    assert!(r.body.len() > 12 << 20, "{} bytes", r.body.len());
    let rec = wait_records(&log, 1).pop().unwrap();
    assert_eq!(rec["stream"], false);
    assert_eq!(
        (&rec["completion_tokens"], &rec["prompt_tokens"]),
        (&n.into(), &3.into()),
        "{rec}"
    );
    stop(run);
    let _ = std::fs::remove_file(log);
}

/// One supervised replay run with a proxied window "c1"; returns its report.
fn report_of(name: &str, replay_extra: &[&str]) -> Value {
    let dir = std::env::temp_dir().join(format!("sglsup-cmp-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let report = dir.join("report.json");
    let report_s = report.to_str().unwrap().to_string();
    let mut replay = vec!["--speed", "50"];
    replay.extend_from_slice(replay_extra);
    let run = Run::start(
        name,
        Opts {
            supervisor: &["--proxy-addr", "127.0.0.1:0", "--report", &report_s],
            replay: &replay,
            ..Default::default()
        },
    );
    let l = run.wait_event("listening", T);
    run.wait_event("ready", T);
    let (proxy, metrics) = (
        l["proxy"].as_str().unwrap().to_string(),
        l["metrics"].as_str().unwrap().to_string(),
    );
    http(&metrics, "POST", "/-/window/start?name=c1", "");
    for _ in 0..5 {
        post(
            &proxy,
            "/generate",
            r#"{"text":"a b c d","sampling_params":{"max_new_tokens":16},"stream":true}"#,
        );
    }
    http(&metrics, "POST", "/-/window/stop", "");
    stop(run);
    let v = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(dir);
    v
}

#[test]
fn compare_two_reports_gives_the_image_bump_table() {
    let base = report_of("cmp-base", &[]);
    // The replay takes its own options first; SGLang flags it does not know come last.
    let cand = report_of(
        "cmp-cand",
        &[
            "--version",
            "0.5.19",
            "--ranks",
            "TP0,TP1",
            "--cuda-graph-max-bs=8",
        ],
    );
    let dir = std::env::temp_dir().join(format!("sglsup-cmp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (b, c) = (dir.join("b.json"), dir.join("c.json"));
    std::fs::write(&b, base.to_string()).unwrap();
    std::fs::write(&c, cand.to_string()).unwrap();
    #[allow(clippy::disallowed_methods)]
    let out = std::process::Command::new(supervisor_bin())
        .arg("compare")
        .arg(&b)
        .arg(&c)
        .args(["--format", "markdown", "--force"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("### c1") && text.contains("| Median TTFT (ms) |"),
        "{text}"
    );
    assert!(text.contains("- `tp_size`: 1 → 2"), "{text}");
    assert!(
        text.contains("'--cuda-graph-max-bs' is deprecated"),
        "a new deprecation warning: {text}"
    );
    assert!(text.contains("Startup (spawn → ready)"), "{text}");
    // TP 1 → 2 is another GPU count: compared only with --force, and said.
    assert!(text.contains("gpu_count: 1 → 2\n"), "{text}");
    // Another model: refused in one line naming the field, exit 2.
    let mut other = base.clone();
    other["identity"]["model"] = Value::from("/models/other");
    std::fs::write(&c, other.to_string()).unwrap();
    #[allow(clippy::disallowed_methods)]
    let out = std::process::Command::new(supervisor_bin())
        .arg("compare")
        .arg(&b)
        .arg(&c)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("model differs"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

/// bench_serving's reading of one event, through a full JSON parse: the oracle for the byte scan.
fn json_output(api: Api, data: &str) -> bool {
    let Ok(v) = serde_json::from_str::<Value>(data) else {
        return false;
    };
    let nonempty = |v: &Value| v.as_str().is_some_and(|s| !s.is_empty());
    match api {
        Api::Generate => nonempty(&v["text"]),
        Api::Completions => nonempty(&v["choices"][0]["text"]),
        Api::Chat => {
            let d = &v["choices"][0]["delta"];
            nonempty(&d["content"]) || nonempty(&d["reasoning_content"])
        }
    }
}

#[test]
fn real_sglang_answers_are_read_exactly_however_they_are_cut() {
    use sglang_exporters::proxy::{Bytes, EventStream};
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/sglang-0.5.14-h200/http");
    // (recording, API, completion tokens the server reported, prompt tokens)
    let cases = [
        ("default-completions_stream", Api::Completions, None, None),
        (
            "default-completions_stream_usage",
            Api::Completions,
            Some(64),
            Some(36),
        ),
        ("default-chat_stream", Api::Chat, None, None),
        ("default-chat_stream_usage", Api::Chat, Some(64), Some(49)),
        ("default-generate_stream", Api::Generate, Some(64), Some(36)),
        (
            "incremental-generate_stream",
            Api::Generate,
            Some(64),
            Some(36),
        ),
        (
            "incremental-load_completions_stream_3",
            Api::Completions,
            None,
            None,
        ),
    ];
    for (name, api, completion, prompt) in cases {
        let body = std::fs::read(dir.join(format!("{name}.body"))).unwrap();
        let text = String::from_utf8_lossy(&body).to_string();
        let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
        let expected_output: Vec<bool> = events
            .iter()
            .map(|e| json_output(api, e.strip_prefix("data: ").unwrap_or(e)))
            .collect();
        let usage_event = events.iter().find(|e| e.contains(r#""choices":[]"#));
        for cut in [1, 7, 100, 4096, usize::MAX] {
            for drop_usage in [false, true] {
                let mut s = EventStream::new(api, drop_usage);
                let (mut infos, mut out) = (Vec::new(), Vec::new());
                for piece in body.chunks(cut.min(body.len())) {
                    out.extend_from_slice(
                        &s.pass(Bytes::copy_from_slice(piece), |e| infos.push(e)),
                    );
                }
                if let Some(t) = s.finish(|e| infos.push(e)) {
                    out.extend_from_slice(&t);
                }
                let what = format!("{name}, cut {cut}, drop_usage {drop_usage}");
                let output: Vec<bool> = infos.iter().map(|e| e.output).collect();
                assert_eq!(output, expected_output, "{what}: output events");
                assert_eq!(
                    infos.iter().rev().find_map(|e| e.completion_tokens),
                    completion,
                    "{what}"
                );
                assert_eq!(infos.iter().find_map(|e| e.prompt_tokens), prompt, "{what}");
                assert!(infos.last().unwrap().done, "{what}");
                let expected = match (drop_usage, usage_event) {
                    (true, Some(u)) => text.replace(&format!("{u}\n\n"), "").into_bytes(),
                    _ => body.clone(),
                };
                assert_eq!(out, expected, "{what}: forwarded bytes");
            }
        }
        if name == "default-chat_stream" {
            // SGLang merged tokens: 64 tokens in fewer output events. Never count by events.
            assert!(expected_output.iter().filter(|o| **o).count() < 64);
        }
    }
}

/// A keep-alive HTTP/1.1 upstream that answers every request `ok` and tells, per connection it
/// accepted, how many requests came on it and whether it was closed.
fn counting_upstream() -> (u16, std::sync::mpsc::Receiver<(usize, usize)>) {
    use std::io::BufRead;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for (id, conn) in l.incoming().flatten().enumerate() {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut w = conn.try_clone().unwrap();
                let mut r = std::io::BufReader::new(conn);
                let mut served = 0;
                'conn: loop {
                    let (mut len, mut empty) = (0, false);
                    loop {
                        let mut line = String::new();
                        if r.read_line(&mut line).unwrap_or(0) == 0 {
                            break 'conn; // closed by the proxy
                        }
                        empty |= line.starts_with("GET /empty ");
                        let l = line.trim_end().to_ascii_lowercase();
                        if let Some(v) = l.strip_prefix("content-length:") {
                            len = v.trim().parse().unwrap();
                        }
                        if l.is_empty() {
                            break;
                        }
                    }
                    let mut body = vec![0; len];
                    if r.read_exact(&mut body).is_err() {
                        break 'conn; // closed mid-body: not a request served
                    }
                    served += 1;
                    let answer: &[u8] = if empty {
                        b"HTTP/1.1 204 No Content\r\n\r\n"
                    } else {
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                    };
                    w.write_all(answer).unwrap();
                }
                tx.send((id, served)).unwrap();
            });
        }
    });
    (port, rx)
}

/// Of the connections `counting_upstream` saw closed, those that carried no request, counted up to
/// `n` or until `until`. The supervisor's own probes of the server (readiness, server info,
/// metrics) each come on a connection of their own with one request, so they are not counted.
fn closed_unused(
    closed: &std::sync::mpsc::Receiver<(usize, usize)>,
    n: usize,
    until: Instant,
) -> usize {
    let mut unused = 0;
    while unused < n {
        match closed.recv_timeout(until.saturating_duration_since(Instant::now())) {
            Ok((_, 0)) => unused += 1,
            Ok(_) => {}
            Err(_) => break,
        }
    }
    unused
}

/// A direct client's connection reaches the server when it connects, before any request; through
/// the proxy too, and it is closed with the client's even if no request came on it.
#[test]
fn the_server_sees_a_client_connection_when_it_connects_not_at_its_first_request() {
    let (port, closed) = counting_upstream();
    let upstream = format!("http://127.0.0.1:{port}");
    let (run, proxy, _, log) = start("proxy-early", &["--upstream", &upstream]);
    let client = TcpStream::connect(&proxy).unwrap();
    // long enough for the early connect to be made under a loaded CI machine: a client that
    // leaves before it is made stops it, and then the server sees nothing
    let soon = Instant::now() + Duration::from_secs(2);
    assert_eq!(
        closed_unused(&closed, 1, soon),
        0,
        "closed while the client is connected"
    );
    drop(client);
    let later = Instant::now() + Duration::from_secs(5);
    assert_eq!(
        closed_unused(&closed, 1, later),
        1,
        "the client's connection reached the server and was closed with it"
    );
    stop(run);
    let _ = std::fs::remove_file(log);
}

#[test]
fn the_server_sees_one_connection_per_client_connection_kept_and_closed_with_it() {
    let (port, closed) = counting_upstream();
    let upstream = format!("http://127.0.0.1:{port}");
    let (run, proxy, _, log) = start(
        "proxy-affine",
        &[
            "--upstream",
            &upstream,
            "--health-url",
            "http://127.0.0.1:{port}",
        ],
    );
    let mut clients: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(&proxy).unwrap())
        .collect();
    for round in 0..2 {
        for c in &mut clients {
            let body = format!(r#"{{"text":"round {round}"}}"#);
            let req = format!(
                "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            c.write_all(req.as_bytes()).unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 512];
            while !got.ends_with(b"ok") {
                let n = c.read(&mut buf).unwrap();
                assert!(n > 0, "proxy closed the client connection");
                got.extend_from_slice(&buf[..n]);
            }
            // An answer without a body keeps the upstream connection too.
            c.write_all(b"GET /empty HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            let mut got = Vec::new();
            while !got.ends_with(b"\r\n\r\n") {
                let n = c.read(&mut buf).unwrap();
                assert!(n > 0, "proxy closed the client connection");
                got.extend_from_slice(&buf[..n]);
            }
            assert!(got.starts_with(b"HTTP/1.1 204"), "{got:?}");
        }
    }
    // Nothing closed while the clients keep their connections.
    assert!(closed.recv_timeout(Duration::from_millis(300)).is_err());
    drop(clients);
    let mut seen: Vec<(usize, usize)> = (0..3)
        .map(|_| closed.recv_timeout(Duration::from_secs(5)).unwrap())
        .collect();
    seen.sort();
    // Exactly three upstream connections, four requests each, all closed with their clients.
    assert_eq!(seen, [(0, 4), (1, 4), (2, 4)]);
    assert!(closed.recv_timeout(Duration::from_millis(300)).is_err());
    let recs = wait_records(&log, 6);
    assert_eq!(recs.len(), 6, "{recs:?}");
    stop(run);
    let _ = std::fs::remove_file(log);
}

/// A supervisor given these proxy and metrics addresses: it must refuse at start (125); its
/// error.
fn refused_at_start(proxy: &str, metrics: &str) -> String {
    #[allow(clippy::disallowed_methods)]
    let out = std::process::Command::new(supervisor_bin())
        .args(["run", "--proxy-addr", proxy, "--metrics-addr", metrics])
        .args(["--gpu-backend", "none", "--no-preflight", "--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(125), "{err}");
    err
}

/// A second supervisor given a running one's proxy address fails at start, naming who holds the
/// port (once: the cause was printed twice, and the name cut at 15 characters), and the first
/// keeps serving every connection.
#[test]
fn a_second_supervisor_given_the_proxy_port_is_refused_at_start_and_the_first_serves_on() {
    let (run, proxy, _, log) = start("proxy-taken", &[]);
    let err = refused_at_start(&proxy, "none");
    assert!(
        err.contains(&proxy)
            && err.contains("--proxy-addr")
            && err.contains(&format!("sglang-supervisor (pid {})", run.child.id())),
        "{err}"
    );
    let body = r#"{"text":"x","sampling_params":{"max_new_tokens":4},"stream":true}"#;
    for _ in 0..32 {
        let r = post(&proxy, "/generate", body);
        assert!(r.status.contains("200"), "{}", r.status);
    }
    assert_eq!(wait_records(&log, 32).len(), 32);
    stop(run);
}

/// --proxy-addr and --metrics-addr given one port: the error says so, not that some other
/// process (itself, by pid) holds it.
#[test]
fn one_port_for_the_proxy_and_the_metrics_is_an_error_that_says_they_must_differ() {
    let addr = format!("127.0.0.1:{}", free_port());
    let err = refused_at_start(&addr, &addr);
    assert!(
        err.contains("this supervisor itself") && err.contains("must differ"),
        "{err}"
    );
}

/// The proxy's connections to a server on loopback come from 127.0.0.2, so a request from
/// any other loopback address went straight to the server: named at once and counted at the
/// end. The replay server's recorded warm-up, logged from 127.0.0.1 before the server was
/// ready, is not.
#[test]
fn a_loopback_client_that_goes_straight_to_the_server_is_named_and_counted_with_the_proxy() {
    let (run, proxy, log) = counting_bypasses("proxy-bypassed-here", &[]);
    let needle = "access log shows a generation request from";
    for _ in 0..3 {
        generate(&proxy);
    }
    assert_eq!(wait_records(&log, 3).len(), 3);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(run.warnings_with(needle), Vec::<String>::new());
    let server = format!("127.0.0.1:{}", run.port);
    for _ in 0..2 {
        generate(&server);
    }
    let said = run.wait_warning(needle, T);
    assert_eq!(
        said,
        format!(
            "the server's access log shows a generation request from 127.0.0.1, sent straight \
             to the server, not through the proxy at {proxy}: the requests log and the \
             request_* figures leave out this client's requests (point the client at the proxy)"
        )
    );
    // the proxy measured its own three, not the two that went around it
    assert_eq!(records(&log).len(), 3);
    stopped_having_counted(run, &log, "2 generation requests", "them");
}

/// A proxied run whose log parser counts loopback bypasses by now: the supervisor's request
/// made once ready was answered (its access line then follows), and the proxy's address and
/// its requests log.
fn counting_bypasses(name: &str, replay: &[&str]) -> (Run, String, std::path::PathBuf) {
    counting_bypasses_with(name, replay, &[])
}

/// [`counting_bypasses`] with more of the server's environment.
fn counting_bypasses_with(
    name: &str,
    replay: &[&str],
    env: &[(&str, &str)],
) -> (Run, String, std::path::PathBuf) {
    let (run, proxy, _, log) = start_with(name, &[], replay, env);
    run.wait_event("server_info", T);
    std::thread::sleep(Duration::from_millis(200));
    (run, proxy, log)
}

/// POST /generate through the proxy naming a client of its own (X-Forwarded-For), answered 200.
fn post_forwarded(proxy: &str, client: &str, body: &str) {
    let mut c = TcpStream::connect(proxy).unwrap();
    write!(
        c,
        "POST /generate HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: {client}\r\n\
         Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    c.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

const BYPASS_BODY: &str = r#"{"text":"a b","sampling_params":{"max_new_tokens":4},"stream":true}"#;

/// POST a short streamed /generate to `addr`, answered 200.
fn generate(addr: &str) {
    assert!(post(addr, "/generate", BYPASS_BODY).status.contains("200"));
}

/// The run counting bypasses over a replay of a real 0.5.14 start with two tokenizer workers,
/// its ready line printed `ready_lines` times: the run, the server's own address, the
/// requests log.
fn two_worker_start(name: &str, ready_lines: &str) -> (Run, String, std::path::PathBuf) {
    let log = common::fixture("F_tokworkers2/server.log");
    let replay = ["--log", log.to_str().unwrap(), "--ready-lines", ready_lines];
    let (run, _proxy, requests) = counting_bypasses(name, &replay);
    let server = format!("127.0.0.1:{}", run.port);
    (run, server, requests)
}

/// Stops the run and checks that it counted `requests` from 127.0.0.1 as unmeasured.
fn stopped_having_counted(mut run: Run, log: &std::path::Path, requests: &str, them: &str) {
    run.stop_by_sigterm();
    assert_eq!(
        run.warnings_with("went unmeasured"),
        [format!(
            "in all, {requests} from 127.0.0.1 went unmeasured: the requests log and the \
             request_* figures leave {them} out"
        )]
    );
    let _ = std::fs::remove_file(log);
}

/// A server that trusts forwarded headers from any peer (uvicorn's `FORWARDED_ALLOW_IPS=*`)
/// logs the client a proxied request names, here on loopback with a port: no address in its
/// log then tells a proxied request from one that went around the proxy, and none is claimed.
#[test]
fn a_proxied_request_naming_its_client_ends_the_count_rather_than_claim_a_bypass() {
    let env = [("FORWARDED_ALLOW_IPS", "*")];
    let (run, proxy, log) = counting_bypasses_with("proxy-forwarded-client", &[], &env);
    post_forwarded(&proxy, "127.0.0.1:5555", BYPASS_BODY);
    assert_eq!(wait_records(&log, 1).len(), 1);
    // the server logged the named client, as a loopback client with a port (the replay
    // server logs a request once answered, and the run's log file follows)
    let named = "127.0.0.1:5555 - \"POST /generate";
    let end = Instant::now() + T;
    let mut server_log = String::new();
    while !server_log.contains(named) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
        server_log = std::fs::read_to_string(run.dir.join("server.log")).unwrap_or_default();
    }
    assert!(server_log.contains(named), "{server_log}");
    std::thread::sleep(Duration::from_millis(300));
    let mut run = run;
    run.stop_by_sigterm();
    let claims: Vec<String> = ["generation request from", "went unmeasured"]
        .iter()
        .flat_map(|n| run.warnings_with(n))
        .collect();
    assert_eq!(claims, Vec::<String>::new());
    let _ = std::fs::remove_file(&log);
}

/// A server with two tokenizer workers (a real 0.5.14 start, replayed) warms up twice, and the
/// second warm-up may be logged after the request that starts the count: the first loopback
/// request after it is taken for that warm-up, never claimed as a bypass (the count is a floor).
#[test]
fn with_two_tokenizer_workers_the_first_loopback_request_counted_is_taken_for_the_second_warm_up() {
    let (run, server, requests) = two_worker_start("proxy-bypassed-tokworkers", "2");
    generate(&server);
    std::thread::sleep(Duration::from_millis(300));
    let needle = "access log shows a generation request from";
    assert_eq!(run.warnings_with(needle), Vec::<String>::new());
    generate(&server);
    run.wait_warning(needle, T);
    stopped_having_counted(run, &requests, "1 generation request", "it");
}

/// A ready line more than the server has tokenizer workers: uvicorn started a worker again,
/// whose warm-up may come after the count began. Loopback clients are counted no more.
#[test]
fn a_worker_started_again_ends_the_count_of_loopback_clients() {
    let (run, server, requests) = two_worker_start("proxy-bypassed-respawn", "3");
    for _ in 0..2 {
        generate(&server);
    }
    std::thread::sleep(Duration::from_millis(300));
    let mut run = run;
    run.stop_by_sigterm();
    assert_eq!(run.warnings_with("went unmeasured"), Vec::<String>::new());
    let said = std::fs::read_to_string(stderr_of("proxy-bypassed-respawn")).unwrap();
    assert!(
        said.contains(
            "loopback clients that go around the run's measuring are not counted since a server \
             worker started again after the server was ready"
        ),
        "{said}"
    );
    let _ = std::fs::remove_file(&requests);
    let _ = std::fs::remove_file(stderr_of("proxy-bypassed-respawn"));
}

/// A server behind a router of its own (here a byte relay on the port the run measures, the
/// server on another): the server logs the router's requests from loopback, and uvicorn says it
/// listens on another port than the run's. None of those is claimed to have bypassed the proxy.
#[test]
#[allow(clippy::disallowed_methods)] // the supervisor run as a user runs it, with a shell for its command
fn a_servers_log_from_behind_its_own_router_claims_no_bypass() {
    let dir = temp_dir("proxy-router-behind");
    let events = dir.join("events.jsonl");
    let (router, server) = (free_port(), free_port());
    let script = format!(
        "{} --port {server} --speed 50 & exec {} 127.0.0.1:{router} 127.0.0.1:{server}",
        replay_bin(),
        env!("CARGO_BIN_EXE_tcp-relay")
    );
    let mut sup = std::process::Command::new(supervisor_bin())
        .args([
            "run",
            "--proxy-addr",
            "127.0.0.1:0",
            "--metrics-addr",
            "none",
            "--events",
        ])
        .arg(&events)
        .arg("--log-file")
        .arg(dir.join("server.log"))
        // the run measures the router's port (its server's argv names it last)
        .args([
            "--",
            "sh",
            "-c",
            &script,
            "sh",
            "--port",
            &router.to_string(),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let proxy = wait_event_at(&events, "listening", T)["proxy"]
        .as_str()
        .unwrap()
        .to_string();
    wait_event_at(&events, "server_info", T);
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..2 {
        generate(&proxy);
    }
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: a signal to our own child, which has not been waited for yet.
    unsafe { libc::kill(sup.id() as i32, libc::SIGTERM) };
    assert_eq!(sup.wait().unwrap().code(), Some(143));
    let claims: Vec<Value> = events_at(&events)
        .into_iter()
        .filter(|e| e["event"] == "warning")
        .filter(|e| {
            let m = e["message"].as_str().unwrap_or_default();
            m.contains("generation request") || m.contains("unmeasured")
        })
        .collect();
    assert_eq!(claims, Vec::<Value>::new());
    // what would have been claimed: the router's requests, logged from loopback after the
    // supervisor's request made once ready
    let log = std::fs::read_to_string(dir.join("server.log")).unwrap();
    let after_ready = log.find("GET /server_info?from=sglang-supervisor").unwrap();
    assert_eq!(
        log[after_ready..].matches("- \"POST /generate").count(),
        2,
        "{log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Ready by HTTP alone, the server may not have logged its warm-up yet (an older SGLang's
/// /health answers 200 at once): the supervisor's request made once ready is then the plain
/// one, which starts no count of loopback clients.
#[test]
fn ready_by_http_alone_starts_no_count_of_loopback_clients() {
    let (mut run, proxy, _, log) = start_with(
        "proxy-ready-http",
        &["--ready-on", "http"],
        &["--healthy-before-ready-line", "2"],
        &[],
    );
    run.wait_event("server_info", T);
    std::thread::sleep(Duration::from_millis(200));
    generate(&proxy);
    let server = format!("127.0.0.1:{}", run.port);
    generate(&server);
    std::thread::sleep(Duration::from_millis(300));
    run.stop_by_sigterm();
    let server_log = std::fs::read_to_string(run.dir.join("server.log")).unwrap();
    assert!(
        server_log.contains("\"GET /server_info HTTP/1.1\""),
        "{server_log}"
    );
    assert!(
        !server_log.contains("from=sglang-supervisor"),
        "{server_log}"
    );
    assert_eq!(run.warnings_with("went unmeasured"), Vec::<String>::new());
    let _ = std::fs::remove_file(&log);
}

#[test]
fn a_client_elsewhere_that_goes_straight_to_the_server_is_named_with_the_proxy() {
    let test = "a_client_elsewhere_that_goes_straight_to_the_server...";
    let Some(other) = OtherHost::new(test) else {
        return;
    };
    let (mut run, proxy, _, log) = start_with("proxy-bypassed", &[], &["--host", "0.0.0.0"], &[]);
    let body = r#"{"text":"a b","sampling_params":{"max_new_tokens":4},"stream":true}"#;
    let needle = "access log shows a generation request from";
    // Through the proxy with a forwarded client: uvicorn logs it (port 0), yet the request
    // came through the proxy. And a probe from the other host straight to the server.
    post_forwarded(&proxy, "198.51.100.20", body);
    let server_there = format!("{}:{}", other.here, run.port);
    assert_eq!(other.get(&server_there, "/health"), "200");
    assert_eq!(wait_records(&log, 1).len(), 1);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(run.warnings_with(needle), Vec::<String>::new());
    // A generation request from there, straight to the server.
    assert_eq!(other.post(&server_there, "/generate", body), "200");
    let said = run.wait_warning(needle, T);
    assert!(
        said.contains(&format!("a generation request from {}, sent straight to the server, not through the proxy at {proxy}", other.there))
            && said.contains("point the client at the proxy"),
        "{said}"
    );
    // Only the proxied request is measured; a second one from there is not said again, nor
    // one from this machine's own address on the veth, straight to the server too (the proxy
    // reaches the server over loopback: its requests are logged from 127.0.0.1).
    assert_eq!(other.post(&server_there, "/generate", body), "200");
    assert!(post(&server_there, "/generate", body)
        .status
        .contains("200"));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(records(&log).len(), 1);
    run.stop_by_sigterm();
    assert_eq!(run.warnings_with(needle).len(), 1);
    // At the end, all three are counted; the forwarded client that came through the proxy is not.
    assert_eq!(
        run.warnings_with("went unmeasured"),
        [format!(
            "in all, 3 generation requests from 2 clients (the first {}) went unmeasured: the \
             requests log and the request_* figures leave them out",
            other.there
        )]
    );
    let _ = std::fs::remove_file(&log);
}
