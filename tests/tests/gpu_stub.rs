//! GPU probing through the real nvml-wrapper code path, against a scripted libnvidia-ml.so built
//! from tests/stubs/nvml_stub.c for these tests.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)] // test code: a panic is the failure report
mod common;
use common::*;
use serde_json::Value;
use sglang_supervisor_tests::http;
use std::process::{Command, Output};
use std::time::Duration;

fn probe_rocm(lib: &std::path::Path, env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(supervisor_bin());
    c.args(["probe", "--json", "--gpu-backend", "rocm", "--rocm-lib"])
        .arg(lib);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

#[test]
fn rocm_smi_readings_through_our_own_bindings() {
    let out = probe_rocm(rocm_stub(), &[("STUB_RSMI_GPUS", "2")]).expect_success("probe (ROCm)");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2);
    let g = &v[1];
    assert_eq!(g["name"], "AMD Instinct MI325X (stub)");
    assert_eq!(g["power_avg_w"], 500.0, "µW → W");
    assert!(
        g.get("power_w").is_none(),
        "5.2.3 has no current socket power: absent"
    );
    // count × resolution (15.3 µJ): ~1000 J at start, never the raw tick count.
    let e = g["energy_j"].as_f64().unwrap();
    assert!((1000.0..1100.0).contains(&e), "{e}");
    assert_eq!(g["memory_used_bytes"], 4u64 << 30, "VRAM used of GPU 1");
    assert_eq!(v[0]["memory_used_bytes"], 3u64 << 30, "VRAM used of GPU 0");
    assert_eq!(g["memory_total_bytes"], 274877906944u64);
    assert_eq!(g["utilization"], 0.88);
    assert_eq!(g["temperature_c"], 51.0);
    // rsmi_init's INIT_ERROR (a host without an AMD GPU): no GPU, not a crash.
    let out = probe_rocm(rocm_stub(), &[("STUB_RSMI_INIT_STATUS", "8")])
        .expect_success("probe (ROCm), rsmi_init failing");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
}

#[test]
fn debians_real_librocm_smi64_on_a_host_without_amd_gpu_means_no_gpu() {
    let real = std::path::Path::new("/usr/lib/librocm_smi64.so.1");
    assert!(
        real.exists(),
        "install Debian's librocm-smi64-1 (scripts/setup.sh does) to run this test"
    );
    let out = probe_rocm(real, &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
    // The library prints "Exception caught: rsmi_init." and "Failed to open drm root directory"
    // itself on such a host (seen with Python's ctypes); none of it reaches the user's stderr.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains("rsmi_init") && !err.contains("drm root"),
        "the ROCm library's own noise reached stderr: {err}"
    );
    // And through auto-detection, by name, as a user would have it.
    let auto = Command::new(supervisor_bin())
        .args(["probe", "--json"])
        .output()
        .unwrap();
    assert_eq!(auto.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&auto.stdout).trim(), "[]");
}

#[test]
fn sysfs_backend_under_run_integrates_power_without_a_counter() {
    let root = std::env::temp_dir().join(format!("sglsup-sysfs-run-{}", std::process::id()));
    let dev = root.join("class/drm/card0/device");
    std::fs::create_dir_all(dev.join("hwmon/hwmon0")).unwrap();
    std::fs::write(dev.join("vendor"), "0x1002\n").unwrap();
    std::fs::write(dev.join("hwmon/hwmon0/power1_average"), "400000000\n").unwrap();
    std::fs::write(dev.join("mem_info_vram_total"), "274877906944\n").unwrap();
    let root_s = root.to_str().unwrap().to_string();
    let mut run = Run::start(
        "sysfs",
        Opts {
            supervisor: &[
                "--gpu-backend",
                "sysfs",
                "--sysfs-root",
                &root_s,
                "--sample-interval",
                "20ms",
            ],
            replay: &["--speed", "50", "--exit-after-ready", "0:0.5"],
            ..Default::default()
        },
    );
    assert_eq!(run.wait(Duration::from_secs(60)), 0);
    let g = &run.events_named("power").pop().unwrap()["gpus"][0];
    assert_eq!(g["energy_source"], "instant_power_integral");
    assert_eq!(g["peak_power_w"], 400.0);
    let _ = std::fs::remove_dir_all(root);
}

fn probe(env: &[(&str, &str)], extra: &[&str]) -> Output {
    let mut c = Command::new(supervisor_bin());
    c.arg("probe").arg("--nvml-lib").arg(stub_lib()).args(extra);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// `probe --json` that succeeded, parsed.
fn probe_json(env: &[(&str, &str)]) -> Value {
    let out = probe(env, &["--json"]).expect_success("probe --json");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn probe_reads_every_field_and_leaves_unsupported_ones_out() {
    let v = probe_json(&[
        ("STUB_NVML_GPUS", "2"),
        ("STUB_NVML_PROCS", "4242:2147483648"),
    ]);
    let gpus = v.as_array().unwrap();
    assert_eq!(gpus.len(), 2);
    let g = &gpus[1];
    assert_eq!(g["index"], 1);
    assert_eq!(g["name"], "NVIDIA H200 (stub)");
    assert_eq!(g["uuid"], "GPU-00000000-0000-0000-0000-000000000001");
    assert_eq!(g["power_w"], 150.0, "instant power field, mW → W");
    assert_eq!(g["power_avg_w"], 135.0);
    assert!(g["energy_j"].as_f64().unwrap() >= 5000.0);
    assert_eq!(g["memory_total_bytes"], 150754820096u64);
    assert_eq!(g["utilization"], 0.42);
    assert_eq!(g["temperature_c"], 33.0);
    assert_eq!(g["sm_clock_hz"], 1_980_000_000u64);
    assert_eq!(
        g["processes"],
        serde_json::json!([{"pid": 4242, "used_memory_bytes": 2147483648u64}])
    );
    // The stub lacks nvmlDeviceGetCurrentClocksThrottleReasons: absent, not 0.
    assert!(g.get("throttle_reasons").is_none(), "{g}");
    let text = probe(&[], &[]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("GPU 0 NVIDIA H200 (stub)"));
}

#[test]
fn no_gpu_is_an_empty_answer_and_a_broken_named_backend_exit_125() {
    let out = probe(&[("STUB_NVML_GPUS", "0")], &["--json"]).expect_success("probe, no GPU");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
    let out = probe(
        &[("STUB_NVML_INIT_FAIL", "1")],
        &["--json", "--gpu-backend", "auto"],
    )
    .expect_success("auto: no usable NVML is no GPU");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
    let out = probe(&[("STUB_NVML_INIT_FAIL", "1")], &["--gpu-backend", "nvml"]);
    assert_eq!(out.status.code(), Some(125));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains("driver is not loaded"), "{err}");
}

fn run_with_stub(name: &str, env: &[(&str, &str)], replay: &[&str]) -> (Run, Vec<Value>) {
    let lib = stub_lib().to_str().unwrap().to_string();
    run_sampled(
        name,
        &["--nvml-lib", &lib, "--gpu-backend", "nvml"],
        env,
        replay,
    )
}

/// A replayed run sampled through `backend` (its options) at 50 Hz, stopped with SIGTERM; the
/// power CSV's lines.
fn run_sampled(
    name: &str,
    backend: &[&str],
    env: &[(&str, &str)],
    replay: &[&str],
) -> (Run, Vec<Value>) {
    let csv = std::env::temp_dir().join(format!("sglsup-{name}-{}.csv", std::process::id()));
    let csv_s = csv.to_str().unwrap().to_string();
    let mut run = Run::start(
        name,
        Opts {
            supervisor: &[
                backend,
                &[
                    "--sample-interval",
                    "20ms",
                    "--energy-interval",
                    "200ms",
                    "--power-csv",
                    &csv_s,
                ],
            ]
            .concat(),
            replay: &[&["--speed", "50"], replay].concat(),
            env,
            ..Default::default()
        },
    );
    run.wait_event("ready", Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(600));
    run.stop_by_sigterm();
    let rows: Vec<Value> = std::fs::read_to_string(&csv)
        .unwrap()
        .lines()
        .map(|l| Value::String(l.to_string()))
        .collect();
    let _ = std::fs::remove_file(csv);
    (run, rows)
}

#[test]
fn sampled_run_writes_power_and_memory_used_per_gpu_to_the_csv_and_an_exact_energy_window() {
    let (run, rows) = run_with_stub(
        "gpu-ok",
        &[("STUB_NVML_GPUS", "2"), ("STUB_NVML_MEM_USED_MIB", "1234")],
        &["--ranks", "TP0,TP1"],
    );
    let power = run.events_named("power").pop().unwrap();
    assert_eq!(power["power_valid"], 1, "{power}");
    assert_eq!(power["gpus"].as_array().unwrap().len(), 2);
    for g in power["gpus"].as_array().unwrap() {
        assert_eq!(g["energy_source"], "counter");
        let counter = g["energy_j"].as_f64().unwrap();
        let integral = g["energy_from_instant_power_j"].as_f64().unwrap();
        assert!(
            (counter - integral).abs() / counter < 0.03,
            "counter {counter} J vs integral {integral} J"
        );
        assert!(g["achieved_hz"].as_f64().unwrap() > 20.0, "{g}");
        assert_eq!(g["peak_power_w"], 150.0);
    }
    let teardown = run.events_named("gpu_teardown").pop().unwrap();
    assert_eq!(teardown["clean"], true, "{teardown}");
    assert_eq!(rows[0].as_str().unwrap(), sglang_probes_csv_header());
    assert!(rows.len() > 20);
    for row in &rows[1..] {
        let row = row.as_str().unwrap();
        let cols: Vec<&str> = row.split(", ").collect();
        assert_eq!(cols.len(), 9, "{row}");
        assert!(
            cols[0].len() == 23 && cols[0].as_bytes()[4] == b'/',
            "nvidia-smi timestamp: {row}"
        );
        // NVML's memory used (v2, the driver's reserved 64 MiB not counted), per GPU, last.
        let mib = match cols[1] {
            "0" => "1234 MiB",
            "1" => "2468 MiB",
            other => panic!("GPU {other}: {row}"),
        };
        assert_eq!(
            &cols[2..],
            ["150.00 W", "33", "1980 MHz", "3201 MHz", "42 %", "7 %", mib],
            "{row}"
        );
    }
}

fn sglang_probes_csv_header() -> &'static str {
    "timestamp, index, power.draw [W], temperature.gpu, clocks.current.sm [MHz], clocks.current.memory [MHz], utilization.gpu [%], utilization.memory [%], memory.used [MiB]"
}

/// ROCm SMI's VRAM in use (`rsmi_dev_memory_usage_get`, RSMI_MEM_TYPE_VRAM) reaches the same
/// column, in nvidia-smi's format.
#[test]
fn rocm_vram_used_per_gpu_is_the_csvs_memory_column() {
    let lib = rocm_stub().to_str().unwrap().to_string();
    let (_, rows) = run_sampled(
        "rocm-mem",
        &["--rocm-lib", &lib, "--gpu-backend", "rocm"],
        &[("STUB_RSMI_GPUS", "2")],
        &["--ranks", "TP0,TP1"],
    );
    assert_eq!(rows[0].as_str().unwrap(), sglang_probes_csv_header());
    assert!(rows.len() > 20);
    for row in &rows[1..] {
        let row = row.as_str().unwrap();
        let cols: Vec<&str> = row.split(", ").collect();
        let mib = match cols[1] {
            "0" => "3072 MiB",
            "1" => "4096 MiB",
            other => panic!("GPU {other}: {row}"),
        };
        assert_eq!(cols[2], "500.00 W", "{row}");
        assert_eq!(cols.get(8), Some(&mib), "{row}");
    }
}

/// A library that gives no memory reading leaves it absent: `[N/A]` in the CSV (as nvidia-smi
/// writes it), no `memory_used_bytes` from `probe`, never 0. For NVML and for ROCm SMI.
#[test]
fn memory_used_the_library_does_not_give_is_na_in_the_csv_and_absent_never_zero() {
    let (_, rows) = run_with_stub("gpu-nomem", &[("STUB_NVML_MEMORY", "none")], &[]);
    assert!(rows.len() > 20);
    for row in &rows[1..] {
        let row = row.as_str().unwrap();
        assert!(row.ends_with(", 7 %, [N/A]"), "{row}");
    }
    let out = probe(&[("STUB_NVML_MEMORY", "none")], &["--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v[0].get("memory_used_bytes").is_none(), "{v}");
    assert!(v[0].get("memory_total_bytes").is_none(), "{v}");
    assert_eq!(v[0]["power_w"], 150.0, "the rest is read");
    let out = probe_rocm(rocm_stub(), &[("STUB_RSMI_NO_MEMORY", "1")]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v[0].get("memory_used_bytes").is_none(), "{v}");
    assert_eq!(v[0]["memory_total_bytes"], 274877906944u64);
}

/// A driver without nvmlDeviceGetMemoryInfo_v2 (before R510) still gives memory, through v1,
/// whose `used` counts the driver's reserved memory (64 MiB in the stub) as such drivers do.
#[test]
fn nvml_memory_falls_back_to_the_v1_call_where_v2_is_missing() {
    let v = probe_json(&[
        ("STUB_NVML_GPUS", "2"),
        ("STUB_NVML_MEM_USED_MIB", "1000"),
        ("STUB_NVML_MEMORY", "v1"),
    ]);
    assert_eq!(v[0]["memory_used_bytes"], (1000u64 + 64) << 20);
    assert_eq!(v[1]["memory_used_bytes"], (2000u64 + 64) << 20);
    assert_eq!(v[1]["memory_total_bytes"], 150754820096u64);
    let v2 = probe(&[("STUB_NVML_MEM_USED_MIB", "1000")], &["--json"]);
    let v2: Value = serde_json::from_slice(&v2.stdout).unwrap();
    assert_eq!(
        v2[0]["memory_used_bytes"],
        1000u64 << 20,
        "v2: reserved apart"
    );
}

#[test]
fn a_gpu_lost_mid_run_is_reported_and_voids_power() {
    let (run, _) = run_with_stub(
        "gpu-lost",
        &[
            ("STUB_NVML_GPUS", "2"),
            ("STUB_NVML_LOST_INDEX", "1"),
            ("STUB_NVML_LOST_AFTER_MS", "300"),
        ],
        &["--ranks", "TP0,TP1"],
    );
    let power = run.events_named("power").pop().unwrap();
    assert_eq!(power["power_valid"], 0);
    assert!(
        power["reasons"]
            .as_array()
            .unwrap()
            .contains(&Value::from("benchmark_window_not_bracketed")),
        "InferenceX's reason: the lost GPU's samples stop before the run's end: {power}"
    );
    assert!(
        power["gpus"][1]["gone"]
            .as_str()
            .unwrap()
            .contains("GPU_IS_LOST"),
        "{power}"
    );
    assert!(power["gpus"][0]["gone"].is_null(), "the other GPU goes on");
}

#[test]
fn without_an_energy_counter_energy_comes_from_integrated_power() {
    let (run, _) = run_with_stub("gpu-noenergy", &[("STUB_NVML_NO_ENERGY", "1")], &[]);
    let g = &run.events_named("power").pop().unwrap()["gpus"][0];
    assert_eq!(g["energy_source"], "instant_power_integral");
    assert_eq!(g["energy_j"], g["energy_from_instant_power_j"]);
}

#[test]
fn gpu_memory_still_held_after_exit_is_reported() {
    let lib = stub_lib().to_str().unwrap().to_string();
    let mut c = Command::new(supervisor_bin());
    c.args([
        "run",
        "--no-tee",
        "--metrics-addr",
        "none",
        "--gpu-backend",
        "nvml",
        "--nvml-lib",
        &lib,
        "--events",
    ]);
    let ev = std::env::temp_dir().join(format!("sglsup-held-{}.jsonl", std::process::id()));
    c.arg(&ev)
        .args(["--", "true"])
        .env("STUB_NVML_PROCS", "4242:1073741824");
    let out = c.output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let events: Vec<Value> = std::fs::read_to_string(&ev)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let t = events
        .iter()
        .find(|e| e["event"] == "gpu_teardown")
        .unwrap();
    assert_eq!(t["clean"], false);
    assert_eq!(t["gpus"][0]["processes"][0]["pid"], 4242);
    let _ = std::fs::remove_file(ev);
}

#[test]
fn measurement_windows_over_http_are_bracketed_by_energy_counter_reads() {
    let lib = stub_lib().to_str().unwrap().to_string();
    let mut run = Run::start(
        "gpu-window",
        Opts {
            supervisor: &[
                "--nvml-lib",
                &lib,
                "--gpu-backend",
                "nvml",
                "--sample-interval",
                "20ms",
                "--energy-interval",
                "1h",
            ],
            replay: &["--speed", "50"],
            env: &[("STUB_NVML_GPUS", "2")],
            ..Default::default()
        },
    );
    let addr = run.wait_event("listening", Duration::from_secs(60))["metrics"]
        .as_str()
        .unwrap()
        .to_string();
    run.wait_event("ready", Duration::from_secs(60));
    assert!(
        http(&addr, "POST", "/-/window/stop", "").0.contains("409"),
        "nothing to stop yet"
    );
    assert!(http(&addr, "GET", "/-/window/start?name=x", "")
        .0
        .contains("405"));
    let (st, body) = http(&addr, "POST", "/-/window/start?name=bench-c8", "");
    assert!(st.contains("200"), "{st} {body}");
    std::thread::sleep(Duration::from_millis(500));
    let (st, body) = http(&addr, "POST", "/-/window/stop", "");
    assert!(st.contains("200"), "{st} {body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["name"], "bench-c8");
    assert!(v.get("requests").is_none(), "no proxy in this run");
    let w = &v["power"];
    // The replayed server runs tp=1 while 2 GPUs are sampled: InferenceX's rule voids that.
    assert_eq!(w["power_valid"], 0, "{w}");
    assert_eq!(
        w["reasons"],
        serde_json::json!(["expected_gpu_count_mismatch"])
    );
    assert!(
        (0.45..1.5).contains(&w["duration_s"].as_f64().unwrap()),
        "{w}"
    );
    for g in w["gpus"].as_array().unwrap() {
        // With a 1 h energy interval, only the window's edges read the counter: still exact.
        assert_eq!(g["energy_source"], "counter", "{g}");
        let (c, i) = (
            g["energy_j"].as_f64().unwrap(),
            g["energy_from_instant_power_j"].as_f64().unwrap(),
        );
        assert!((c - i).abs() / c < 0.05, "counter {c} vs integral {i}");
    }
    let ev = run.events_named("window");
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0]["name"], "bench-c8");
    run.stop_by_sigterm();
}

/// Every series the Grafana dashboard queries is one the supervisor really exports (GPUs through
/// the NVML stub, requests through the proxy).
#[test]
fn the_grafana_dashboard_queries_only_series_that_exist() {
    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../dashboards/sglang-supervisor.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let lib = stub_lib().to_str().unwrap().to_string();
    let mut run = Run::start(
        "dashboard",
        Opts {
            supervisor: &[
                "--nvml-lib",
                &lib,
                "--gpu-backend",
                "nvml",
                "--proxy-addr",
                "127.0.0.1:0",
            ],
            replay: &["--speed", "50"],
            ..Default::default()
        },
    );
    let l = run.wait_event("listening", Duration::from_secs(60));
    run.wait_event("ready", Duration::from_secs(60));
    let proxy = l["proxy"].as_str().unwrap().to_string();
    sglang_supervisor_tests::post_timed(
        &proxy,
        "/generate",
        r#"{"text":"a","sampling_params":{"max_new_tokens":4},"stream":true}"#,
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let (_, body) = http(l["metrics"].as_str().unwrap(), "GET", "/metrics", "");
    let mut checked = 0;
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            for (i, _) in expr.match_indices("sglang_supervisor_") {
                let name: String = expr[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                // Only set once the server has exited (a running server has no exit code).
                if name == "sglang_supervisor_child_exit_code" {
                    continue;
                }
                assert!(
                    body.contains(&format!("\n{name}")),
                    "the dashboard queries {name}, which /metrics does not have"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 15, "{checked}");
    run.stop_by_sigterm();
}

/// The driver is asked for uuid and name once; every later scrape still has them, under our
/// label names and dcgm-exporter's (`UUID`, `modelName`, `gpu`), so dashboards can join the two.
#[test]
fn gpu_series_carry_the_sampled_memory_used_and_uuid_and_model_under_ours_and_dcgm_exporters_label_names(
) {
    let lib = stub_lib().to_str().unwrap().to_string();
    let mut run = Run::start(
        "gpu-labels",
        Opts {
            supervisor: &[
                "--nvml-lib",
                &lib,
                "--gpu-backend",
                "nvml",
                "--sample-interval",
                "20ms",
            ],
            replay: &["--speed", "50"],
            env: &[("STUB_NVML_GPUS", "2"), ("STUB_NVML_MEM_USED_MIB", "1000")],
            ..Default::default()
        },
    );
    let l = run.wait_event("listening", Duration::from_secs(60));
    run.wait_event("ready", Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(300)); // many samples after the first
    let (_, body) = http(l["metrics"].as_str().unwrap(), "GET", "/metrics", "");
    for gpu in 0..2 {
        let uuid = format!("GPU-00000000-0000-0000-0000-00000000000{gpu}");
        let want = format!(
            r#"{{gpu="{gpu}",uuid="{uuid}",name="NVIDIA H200 (stub)",UUID="{uuid}",modelName="NVIDIA H200 (stub)"}}"#
        );
        // The memory the sampler read (1000 MiB × (index + 1) in the stub), in bytes.
        let used = (1000u64 * (gpu + 1)) << 20;
        let series = format!("sglang_supervisor_gpu_memory_used_bytes{want} ");
        let value = body
            .lines()
            .find_map(|l| l.strip_prefix(&series))
            .and_then(|v| v.parse::<f64>().ok());
        assert_eq!(value, Some(used as f64), "GPU {gpu} in:\n{body}");
        for series in [
            "sglang_supervisor_gpu_power_watts",
            "sglang_supervisor_gpu_memory_used_bytes",
            "sglang_supervisor_gpu_energy_joules_total",
        ] {
            assert!(
                body.contains(&format!("\n{series}{want} ")),
                "{series}{want} missing from:\n{body}"
            );
        }
    }
    let gpu_lines = body
        .lines()
        .filter(|l| l.starts_with("sglang_supervisor_gpu_"))
        .count();
    assert!(gpu_lines >= 10, "{body}");
    assert!(
        !body.contains(r#"uuid="""#) && !body.contains(r#"name="""#),
        "no GPU series with empty identity labels:\n{body}"
    );
    run.stop_by_sigterm();
}

#[test]
fn the_report_has_identity_startup_windows_and_teardown() {
    let lib = stub_lib().to_str().unwrap().to_string();
    let dir = std::env::temp_dir().join(format!("sglsup-report-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let report = dir.join("report.json");
    let report_s = report.to_str().unwrap().to_string();
    let (csv, requests) = (dir.join("gpu_metrics.csv"), dir.join("requests.jsonl"));
    let (csv_s, requests_s) = (
        csv.to_str().unwrap().to_string(),
        requests.to_str().unwrap().to_string(),
    );
    let mut run = Run::start(
        "report",
        Opts {
            supervisor: &[
                "--nvml-lib",
                &lib,
                "--gpu-backend",
                "nvml",
                "--proxy-addr",
                "127.0.0.1:0",
                "--report",
                &report_s,
                "--power-csv",
                &csv_s,
                "--requests-log",
                &requests_s,
            ],
            replay: &["--speed", "50"],
            env: &[("IMAGE", "lmsysorg/sglang:v0.5.14-cu130")],
            ..Default::default()
        },
    );
    let l = run.wait_event("listening", Duration::from_secs(60));
    run.wait_event("ready", Duration::from_secs(60));
    let (proxy, metrics) = (
        l["proxy"].as_str().unwrap().to_string(),
        l["metrics"].as_str().unwrap().to_string(),
    );
    assert!(http(&metrics, "POST", "/-/window/start?name=c1", "")
        .0
        .contains("200"));
    for _ in 0..3 {
        sglang_supervisor_tests::post_timed(
            &proxy,
            "/generate",
            r#"{"text":"a b","sampling_params":{"max_new_tokens":8},"stream":true}"#,
        )
        .unwrap();
    }
    // The benchmark's own result (InferenceX's fields): its span is that of the 2nd and 3rd requests.
    let reqs: Vec<Value> = std::fs::read_to_string(&requests)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let start = reqs[1]["start_unix"].as_f64().unwrap() - 0.001;
    let end = reqs[2]["start_unix"].as_f64().unwrap() + reqs[2]["e2e_s"].as_f64().unwrap();
    let bench = dir.join("bench.json");
    std::fs::write(
        &bench,
        serde_json::json!({"benchmark_start_time_unix": start, "benchmark_end_time_unix": end,
                           "duration": end - start, "completed": 2, "total_input_tokens": 4,
                           "total_output_tokens": 16})
        .to_string(),
    )
    .unwrap();
    let (st, body) = http(
        &metrics,
        "POST",
        &format!("/-/window/stop?bench_result={}", bench.display()),
        "",
    );
    assert!(st.contains("200"), "{body}");
    let stop: Value = serde_json::from_str(&body).unwrap();
    let traffic = &stop["traffic_power"];
    assert_eq!(traffic["power_valid"], 1, "{stop}");
    assert_eq!(
        traffic["benchmark_start_time_unix"], stop["requests"]["benchmark_start_time_unix"],
        "power over the requests' own span"
    );
    assert!(traffic["joules_per_output_token"].is_number(), "{traffic}");
    assert!(
        traffic["energy_counter"]["total_gpu_energy_j"].is_number(),
        "{traffic}"
    );
    let live = &stop["bench"];
    assert_eq!(live["requests"]["completed"], 2, "{live}");
    assert_eq!(live["power"]["power_valid"], 1, "{live}");
    run.stop_by_sigterm();
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(r["schema_version"], 1);
    let id = &r["identity"];
    assert_eq!(
        (
            id["model"].as_str(),
            id["tp"].as_i64(),
            id["gpu_count"].as_i64()
        ),
        (Some("/models/tiny-llama"), Some(1), Some(1))
    );
    assert_eq!(id["gpu_name"], "NVIDIA H200 (stub)");
    assert_eq!(id["image"], "lmsysorg/sglang:v0.5.14-cu130");
    assert!(id["sglang_version"].is_string(), "from /server_info: {id}");
    assert_eq!(r["startup"]["ready"], true);
    assert!(r["startup"]["phases"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["name"] == "cuda_graph_end"));
    assert!(r["deprecations"]
        .as_array()
        .unwrap()
        .iter()
        .any(|d| d["flag"] == "SGL_LOG"));
    let windows = r["windows"].as_array().unwrap();
    assert_eq!(windows[0]["name"], "c1");
    assert_eq!(windows[0]["requests"]["completed"], 3);
    assert!(
        windows[0]["requests"]["tput_per_gpu"].is_number(),
        "per GPU, with the GPU count known"
    );
    assert_eq!(windows[0]["power"]["power_valid"], 1);
    assert_eq!(windows[1]["name"], "run");
    assert!(windows[1]["power"]["total_gpu_energy_j"].is_number());
    assert_eq!(r["teardown"]["exited"]["exit_status"], 143);
    assert_eq!(r["teardown"]["gpu"]["clean"], true);
    // The same benchmark recomputed afterwards from the files: one implementation, one answer.
    let out = std::process::Command::new(supervisor_bin())
        .arg("report")
        .arg("--events")
        .arg(run.dir.join("events.jsonl"))
        .arg("--bench-result")
        .arg(&bench)
        .arg("--power-csv")
        .arg(&csv)
        .arg("--requests-log")
        .arg(&requests)
        .output()
        .unwrap()
        .expect_success("report");
    let offline: Value = serde_json::from_slice(&out.stdout).unwrap();
    let offline = offline["windows"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    for k in [
        "power_valid",
        "reasons",
        "total_gpu_energy_j",
        "joules_per_output_token",
    ] {
        assert_eq!(
            offline["power"][k], live["power"][k],
            "{k}: {offline} {live}"
        );
    }
    assert_eq!(offline["requests"], live["requests"]);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn window_from_proxy_spans_the_request_traffic_only() {
    let lib = stub_lib().to_str().unwrap().to_string();
    let mut run = Run::start(
        "traffic",
        Opts {
            supervisor: &[
                "--nvml-lib",
                &lib,
                "--gpu-backend",
                "nvml",
                "--proxy-addr",
                "127.0.0.1:0",
                "--window-from-proxy",
                "--sample-interval",
                "20ms",
                "--energy-interval",
                "1h",
            ],
            replay: &["--speed", "50"],
            ..Default::default()
        },
    );
    let proxy = run.wait_event("listening", Duration::from_secs(60))["proxy"]
        .as_str()
        .unwrap()
        .to_string();
    run.wait_event("ready", Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(300)); // idle before: not in the window
    let t = std::time::Instant::now();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let p = proxy.clone();
            std::thread::spawn(move || {
                for _ in 0..3 {
                    sglang_supervisor_tests::post_timed(
                        &p,
                        "/generate",
                        r#"{"text":"x","sampling_params":{"max_new_tokens":40},"stream":true}"#,
                    )
                    .unwrap();
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|h| h.join().unwrap());
    let busy = t.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(600)); // idle after: not in the window either
    run.stop_by_sigterm();
    let w = run
        .events_named("window")
        .into_iter()
        .find(|w| w["name"] == "proxy-traffic")
        .unwrap();
    assert_eq!(w["requests"]["completed"], 12);
    let d = w["power"]["duration_s"].as_f64().unwrap();
    assert!(
        d > busy * 0.8 && d < busy + 0.25,
        "window {d} s for {busy} s of traffic"
    );
    assert_eq!(w["power"]["gpus"][0]["energy_source"], "counter");
    assert_eq!(w["power"]["power_valid"], 1, "{w}");
}
