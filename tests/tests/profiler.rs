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
    run.stop_by_sigterm();
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

/// A start whose CUDA-graph capture runs from about 1 s to 3 s after spawn, ready at about 4 s.
const SHORT_START: &str = "\
[2026-12-02 10:00:00] server_args=ServerArgs(model_path='/models/tiny-llama', tp_size=1, port=30000)
[2026-12-02 10:00:00] Init torch distributed begin.
[2026-12-02 10:00:00] Init torch distributed ends. elapsed=0.25 s, mem usage=0.09 GB
[2026-12-02 10:00:00] Load weight begin. avail mem=139.13 GB
[2026-12-02 10:00:00] Load weight end. elapsed=0.12 s, type=LlamaForCausalLM, avail mem=139.10 GB, mem usage=0.02 GB.
[2026-12-02 10:00:00] KV Cache is allocated. #tokens: 1000, K size: 1.00 GB, V size: 1.00 GB
[2026-12-02 10:00:00] Memory pool end. avail mem=11.40 GB
[2026-12-02 10:00:01] Capture cuda graph begin. This can take up to several minutes. avail mem=11.38 GB
[2026-12-02 10:00:03] Capture cuda graph end. Time elapsed: 2.00 s. mem usage=0.04 GB. avail mem=11.34 GB.
[2026-12-02 10:00:03] INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)
[2026-12-02 10:00:04] The server is fired up and ready to roll!
";

/// Busy processes named like compilers: symlinks to sh (a process's name is the name it was
/// executed by).
fn fake_compilers(dir: &std::path::Path) {
    for name in ["nvcc", "cicc", "ptxas", "cc1plus", "ninja"] {
        let link = dir.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("/bin/sh", &link).unwrap();
    }
}

#[test]
fn compilers_running_during_cuda_graph_capture_are_attributed_to_it_and_stop_being_sampled_at_ready(
) {
    let dir = std::env::temp_dir().join(format!("sglsup-jit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    fake_compilers(&dir);
    let log = dir.join("server.log");
    std::fs::write(&log, SHORT_START).unwrap();
    // The server: a shell that starts the compilers in the background 1.2 s in (inside the
    // capture) for 1.4 s, then becomes the replay server (they are its children).
    let script = dir.join("server.sh");
    std::fs::write(
        &script,
        r#"d=$1; shift
busy='while :; do :; done'
( sleep 1.2
  "$d/ninja" -c 'sleep 1.4' &
  "$d/nvcc" -c "$busy" & a=$!
  "$d/cicc" -c "$busy" & b=$!
  sleep 0.6; "$d/ptxas" -c 'sleep 0.3'; "$d/cc1plus" -c 'sleep 0.3'
  sleep 0.2; kill $a $b ) &
exec "$@"
"#,
    )
    .unwrap();
    let report_path = dir.join("report.json");
    let port = free_port().to_string();
    let tag = format!("jit-{}", std::process::id());
    let events = dir.join("events.jsonl");
    let mut sup = std::process::Command::new(supervisor_bin())
        .args(["run", "--metrics-addr", "127.0.0.1:0", "--events"])
        .arg(&events)
        .arg("--report")
        .arg(&report_path)
        .args(["--", "sh"])
        .arg(&script)
        .arg(&dir)
        .arg(replay_bin())
        .args(["--port", &port, "--log"])
        .arg(&log)
        .env("REPLAY_TAG", &tag)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let read = || -> Vec<Value> {
        std::fs::read_to_string(&events)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let end = Instant::now() + T;
    let profile = loop {
        if let Some(p) = read().into_iter().find(|e| e["event"] == "startup_profile") {
            break p;
        }
        assert!(
            Instant::now() < end,
            "no startup_profile event: {:#?}",
            read()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let ev = read();
    // The same profile on /metrics (frozen at readiness).
    let listening = ev.iter().find(|e| e["event"] == "listening").unwrap();
    let (_, body) = http(
        listening["metrics"].as_str().unwrap(),
        "GET",
        "/metrics",
        "",
    );
    for want in [
        "sglang_supervisor_startup_segment_seconds{segment=\"cuda_graph_capture\"}",
        "sglang_supervisor_startup_jit_seconds{segment=\"cuda_graph_capture\"}",
        "sglang_supervisor_startup_compiler_processes{compiler=\"nvcc\"} 1",
        "sglang_supervisor_startup_compiler_cpu_seconds{compiler=\"nvcc\"}",
    ] {
        assert!(body.contains(want), "missing {want:?} in:\n{body}");
    }
    unsafe { libc::kill(sup.id() as i32, libc::SIGTERM) };
    assert_eq!(sup.wait().unwrap().code(), Some(143));
    assert!(ev.iter().any(|e| e["event"] == "ready"));
    assert!(tagged_processes(&tag).is_empty(), "the tree is gone");
    let seg = |n: &str| {
        profile["segments"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == n)
            .cloned()
            .unwrap_or_else(|| panic!("no segment {n}: {profile:#}"))
    };
    let capture = seg("cuda_graph_capture");
    let jit = capture["jit_s"].as_f64().unwrap();
    // Compilers ran 1.2 → 2.6 s, the capture 1 → 3 s: ~1.4 s, to a sample period either way.
    assert!((0.9..=1.9).contains(&jit), "{profile:#}");
    assert_eq!(seg("python_import")["jit_s"], json!(0.0), "{profile:#}");
    assert_eq!(seg("weight_load")["jit_s"], json!(0.0));
    let by = &profile["jit"]["by_compiler"];
    for c in ["nvcc", "cicc", "ninja"] {
        assert_eq!(by[c]["processes"], json!(1), "{c}: {profile:#}");
    }
    // The busy ones burnt CPU; the sleeping ones next to nothing.
    assert!(by["nvcc"]["cpu_s"].as_f64().unwrap() > 0.05, "{profile:#}");
    assert!(by["ninja"]["cpu_s"].as_f64().unwrap() < 0.05, "{profile:#}");
    assert!(profile["jit"]["wall_s"].as_f64().unwrap() >= jit);
    // Sampling stopped at ready: 4 Hz over about 4 s, and cheap.
    let samples = profile["samples"].as_u64().unwrap();
    assert!((8..=30).contains(&samples), "{profile:#}");
    assert!(profile["profiler_cpu_s"].as_f64().unwrap() < 0.5);
    // The capture's phase event carries its own JIT seconds.
    let end_ev = ev
        .iter()
        .find(|e| e["event"] == "phase" && e["name"] == "cuda_graph_end")
        .unwrap();
    assert!(end_ev["jit_s"].as_f64().unwrap() > 0.5, "{end_ev}");
    let report: Value = serde_json::from_slice(&std::fs::read(&report_path).unwrap()).unwrap();
    assert_eq!(report["startup"]["profile"]["jit"], profile["jit"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Debian's chromium, headless, offline: every request it would make goes nowhere (a dead
/// proxy, no name resolution) and is logged to a net log, which is read back.
fn chromium(args: &[&str], netlog: &std::path::Path) -> std::process::Output {
    let bin = ["chromium", "chromium-browser"]
        .into_iter()
        .find(|b| {
            std::process::Command::new("sh")
                .args(["-c", &format!("command -v {b}")])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .expect("chromium is missing: install Debian's chromium (scripts/setup.sh does)");
    std::process::Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--proxy-server=127.0.0.1:9",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--log-net-log={}", netlog.display()))
        .args(args)
        .output()
        .unwrap()
}

/// URLs the page asked for (the browser's own update and account checks left aside).
fn page_requests(netlog: &std::path::Path) -> Vec<String> {
    let text = std::fs::read_to_string(netlog).unwrap_or_default();
    let mut urls: Vec<String> = text
        .split("\"url\":\"")
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .filter(|u| {
            ![
                "google.com/",
                "googleapis.com/",
                "gvt1.com/",
                "file://",
                "data:",
            ]
            .iter()
            .any(|own| u.contains(own))
        })
        .map(str::to_string)
        .collect();
    urls.sort();
    urls.dedup();
    urls
}

/// The `<div id="{id}">` of a page and what it holds, up to the next `<div id=` or the
/// section's end.
fn div<'a>(page: &'a str, id: &str) -> Option<&'a str> {
    let (_, rest) = page.split_once(&format!("<div id=\"{id}\">"))?;
    let end = [rest.find("<div id="), rest.find("</section>")]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(rest.len());
    Some(&rest[..end])
}

#[test]
fn the_html_report_of_a_run_opens_offline_in_chromium_with_every_section_gpu_power_and_memory_plots_and_no_console_error(
) {
    let dec = |r: u32| {
        format!("] Decode batch, #running-req: {r}, #token: 900, token usage: 0.{r}, cuda graph: True, gen throughput (token/s): {}.0, #queue-req: 1", 100 * r)
    };
    let lines: Vec<(u64, String)> = (1..=6).map(|i| (40 + 5 * i, dec(i as u32))).collect();
    let after: Vec<(u64, &str)> = lines.iter().map(|(s, l)| (*s, l.as_str())).collect();
    let dir = std::env::temp_dir().join(format!("sglsup-html-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("server.log");
    std::fs::write(&log, start_then(&after)).unwrap();
    let (html, requests) = (dir.join("report.html"), dir.join("requests.jsonl"));
    let csv = dir.join("gpu_metrics.csv");
    let mut run = Run::start(
        "html",
        Opts {
            supervisor: &[
                "--report-html",
                html.to_str().unwrap(),
                "--proxy-addr",
                "127.0.0.1:0",
                "--requests-log",
                requests.to_str().unwrap(),
                // GPUs through the NVML stub: power and memory used in the power CSV.
                "--gpu-backend",
                "nvml",
                "--nvml-lib",
                stub_lib().to_str().unwrap(),
                "--sample-interval",
                "50ms",
                "--power-csv",
                csv.to_str().unwrap(),
            ],
            replay: &[
                "--speed",
                "50",
                "--ranks",
                "TP0",
                "--log",
                log.to_str().unwrap(),
            ],
            env: &[("STUB_NVML_MEM_USED_MIB", "1234")],
            ..Default::default()
        },
    );
    let listening = run.wait_event("listening", T);
    let (metrics, proxy) = (
        listening["metrics"].as_str().unwrap().to_string(),
        listening["proxy"].as_str().unwrap().to_string(),
    );
    run.wait_event("ready", T);
    http(&metrics, "POST", "/-/window/start?name=c1", "");
    for n in [4, 8, 16] {
        let body =
            format!(r#"{{"text":"a b","sampling_params":{{"max_new_tokens":{n}}},"stream":true}}"#);
        let t = sglang_supervisor_tests::post_timed(&proxy, "/generate", &body).unwrap();
        assert!(t.status.contains("200"), "{}", t.status);
    }
    scrape_until(&metrics, "server_batch_lines_total{kind=\"decode\"} 6");
    let (status, _) = http(&metrics, "POST", "/-/window/stop", "");
    assert!(status.contains("200"), "{status}");
    run.stop_by_sigterm();
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.len() < 2 << 20, "small: {} bytes", page.len());

    let netlog = dir.join("net.json");
    let url = format!("file://{}", html.display());
    let out = chromium(&["--dump-dom", &url], &netlog);
    let dom = String::from_utf8_lossy(&out.stdout);
    for id in [
        "identity", "startup", "gpu", "latency", "batches", "flags", "teardown",
    ] {
        assert!(
            dom.contains(&format!("<section id=\"{id}\">")),
            "section {id} missing"
        );
    }
    // Start-up Gantt, GPU power and memory, three latency CDFs (TPOT needs more tokens than
    // one), three batch plots.
    assert!(
        dom.matches("<svg").count() >= 8,
        "{} plots",
        dom.matches("<svg").count()
    );
    // GPU memory used, per GPU over time, under the power plot, the window shaded.
    let power = div(&dom, "gpu-power").expect("the power plot's div");
    let memory = div(&dom, "gpu-memory").expect("the memory plot's div");
    assert!(
        dom.find("<div id=\"gpu-power\">") < dom.find("<div id=\"gpu-memory\">"),
        "memory under power"
    );
    for (d, caption) in [
        (power, "GPU power (windows shaded)"),
        (memory, "GPU memory used (windows shaded)"),
    ] {
        assert_eq!(d.matches("<svg").count(), 1, "{d}");
        assert!(d.contains(caption), "{d}");
        assert!(
            d.contains("GPU 0") && d.contains("c1"),
            "GPU 0, window c1: {d}"
        );
    }
    assert!(
        std::fs::read_to_string(&csv)
            .unwrap()
            .lines()
            .nth(1)
            .unwrap()
            .ends_with(", 1234 MiB"),
        "the plot's source"
    );
    assert!(
        dom.contains("c1 (n=3)"),
        "the window's requests in the distributions"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let console: Vec<&str> = stderr.lines().filter(|l| l.contains(":CONSOLE")).collect();
    assert!(console.is_empty(), "console messages: {console:?}");
    assert_eq!(
        page_requests(&netlog),
        Vec::<String>::new(),
        "the page fetched something"
    );

    // The screenshot is kept for CI (target/ci-artifacts/).
    let artifacts = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/ci-artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let shot = artifacts.join("report-html.png");
    let _ = std::fs::remove_file(&shot);
    let out = chromium(
        &[
            "--window-size=1000,3800",
            &format!("--screenshot={}", shot.display()),
            &url,
        ],
        &dir.join("net2.json"),
    );
    assert!(
        shot.metadata().is_ok_and(|m| m.len() > 10_000),
        "no screenshot: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::copy(&html, artifacts.join("report.html")).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn report_html_from_files_old_and_new_power_csvs_and_compare_html_are_pages_with_their_sections() {
    let fx = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/real-h200-supervised");
    let dir = std::env::temp_dir().join(format!("sglsup-rhtml-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let html = dir.join("r.html");
    std::process::Command::new(supervisor_bin())
        .arg("report")
        .arg("--events")
        .arg(fx.join("B_events.jsonl"))
        .arg("--power-csv")
        .arg(fx.join("P_power.csv"))
        .arg("--html")
        .arg(&html)
        .arg("-o")
        .arg(dir.join("r.json"))
        .output()
        .unwrap()
        .expect_success("report --html");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("<section id=\"gpu\">") && page.contains("GPU power"));
    assert!(
        page.matches("<svg").count() >= 2,
        "start-up and power plots"
    );
    // P_power.csv was recorded before memory was: the power plot, and one line for memory.
    assert_eq!(div(&page, "gpu-power").unwrap().matches("<svg").count(), 1);
    let memory = div(&page, "gpu-memory").unwrap();
    assert!(
        !memory.contains("<svg") && memory.contains("no memory.used column"),
        "{memory}"
    );
    // The same CSV with memory.used appended (the header `run` writes now): both plots.
    let old = std::fs::read_to_string(fx.join("P_power.csv")).unwrap();
    let mut lines = old.lines();
    let mut new = format!("{}, memory.used [MiB]\n", lines.next().unwrap());
    for (i, l) in lines.enumerate() {
        new += &format!("{l}, {} MiB\n", 500 + i);
    }
    let new_csv = dir.join("new_power.csv");
    std::fs::write(&new_csv, new).unwrap();
    std::process::Command::new(supervisor_bin())
        .arg("report")
        .arg("--events")
        .arg(fx.join("B_events.jsonl"))
        .arg("--power-csv")
        .arg(&new_csv)
        .arg("--html")
        .arg(&html)
        .output()
        .unwrap()
        .expect_success("report --html");
    let page = std::fs::read_to_string(&html).unwrap();
    assert_eq!(div(&page, "gpu-power").unwrap().matches("<svg").count(), 1);
    let memory = div(&page, "gpu-memory").unwrap();
    assert_eq!(memory.matches("<svg").count(), 1, "{memory}");
    assert!(memory.contains("GPU memory used"), "{memory}");
    let out = std::process::Command::new(supervisor_bin())
        .args(["compare", "--format", "html", "--force"])
        .arg(dir.join("r.json"))
        .arg(fx.join("R_report.json"))
        .output()
        .unwrap()
        .expect_success("compare --format html");
    let cmp = String::from_utf8_lossy(&out.stdout);
    assert!(cmp.starts_with("<!DOCTYPE html>") && cmp.contains("<section id=\"compare\">"));
    assert!(cmp.contains("baseline") && cmp.contains("candidate"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn profile_start_stop_drive_sglang_with_its_key_and_judge_by_the_trace_files_not_the_500() {
    let dir = std::env::temp_dir().join(format!("sglsup-prof-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (traces, report) = (dir.join("traces"), dir.join("report.json"));
    let mut run = Run::start(
        "profile",
        Opts {
            supervisor: &[
                "--profile-dir",
                traces.to_str().unwrap(),
                "--profile-window",
                "w2",
                "--report",
                report.to_str().unwrap(),
            ],
            replay: &["--speed", "50", "--api-key", "sk-test-key"],
            ..Default::default()
        },
    );
    let metrics = run.wait_event("listening", T)["metrics"]
        .as_str()
        .unwrap()
        .to_string();
    run.wait_event("ready", T);
    // The server was told where to write: SGLANG_TORCH_PROFILER_DIR in its environment.
    let pid = run.events_named("spawned")[0]["pid"].as_i64().unwrap();
    let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let want = format!("SGLANG_TORCH_PROFILER_DIR={}", traces.display());
    assert!(env.split(|b| *b == 0).any(|kv| kv == want.as_bytes()));

    let (status, body) = http(&metrics, "POST", "/-/profile/start?steps=5", "");
    assert!(status.contains("200"), "{status} {body}");
    let started: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        started["server"]["answer"], "Start profiling.",
        "the key was accepted"
    );
    let (status, _) = http(&metrics, "POST", "/-/profile/start", "");
    assert!(status.contains("409"), "one capture at a time: {status}");
    let (status, body) = http(&metrics, "POST", "/-/profile/stop", "");
    assert!(status.contains("200"), "{status} {body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(
        v["stop"]["status"], 500,
        "the server's own answer is kept: {v}"
    );
    let t = &v["traces"][0];
    assert_eq!(
        (t["rank"].clone(), t["bytes"].clone()),
        (json!(0), json!(4096)),
        "{v}"
    );
    assert!(t["file"].as_str().unwrap().ends_with("-TP-0.trace.json.gz"));
    let (status, _) = http(&metrics, "POST", "/-/profile/start?steps=x", "");
    assert!(status.contains("400"), "{status}");

    // --profile-window: the window's start and stop drive a second capture.
    http(&metrics, "POST", "/-/window/start?name=w2", "");
    std::thread::sleep(Duration::from_millis(300));
    let (_, w) = http(&metrics, "POST", "/-/window/stop", "");
    assert!(w.contains("\"profile\""), "{w}");
    let end = Instant::now() + T;
    while run.events_named("profile").len() < 2 {
        assert!(Instant::now() < end, "no profile event for the window");
        std::thread::sleep(Duration::from_millis(100));
    }
    run.stop_by_sigterm();
    let r: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let profiles = r["profiles"].as_array().unwrap();
    assert_eq!(profiles.len(), 2);
    assert_eq!(profiles[1]["name"], "w2");
    assert_eq!(
        profiles[1]["traces"].as_array().unwrap().len(),
        1,
        "only the new file"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
