//! `compare` on result files as their writers leave them (tests/fixtures/compare/README.md): a
//! bench_serving JSON lines file (`Infinity`, `NaN`, appended runs, one with --output-details),
//! InferenceX's raw and aggregated results, and our report, in any pairing.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)] // test code: a panic is the failure report
mod common;
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BASE: &str = "bench_serving_v0.5.14.jsonl";
const CAND: &str = "bench_serving_v0.5.19.jsonl";
const RAW: &str = "inferencex_raw_conc4.json";
const AGG: &str = "agg_bmk.json";

fn fx(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/compare")
        .join(name)
}

fn report() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/real-h200-supervised/R_report.json")
}

fn compare(base: &Path, cand: &Path, args: &[&str]) -> Output {
    Command::new(supervisor_bin())
        .arg("compare")
        .arg(base)
        .arg(cand)
        .args(args)
        .output()
        .unwrap()
}

fn ok_text(o: &Output) -> String {
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn window<'a>(c: &'a Value, name: &str) -> &'a Value {
    c["windows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["window"] == name)
        .unwrap_or_else(|| panic!("no window {name} in {c:#}"))
}

fn metric<'a>(w: &'a Value, m: &str) -> &'a Value {
    w["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["metric"] == m)
        .unwrap_or_else(|| panic!("no {m} in {w:#}"))
}

/// A copy of a fixture with one edit, in a temporary directory.
fn edited(name: &str, tag: &str, edit: impl Fn(String) -> String) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sglsup-cmp-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = if name == "report" { report() } else { fx(name) };
    let p = dir.join(src.file_name().unwrap());
    std::fs::write(&p, edit(std::fs::read_to_string(&src).unwrap())).unwrap();
    p
}

#[test]
fn bench_serving_jsonl_with_infinity_and_nan_is_read_as_written() {
    // The reported failure: strict JSON stops at bench_serving's `"request_rate": Infinity`.
    let text = std::fs::read_to_string(fx(BASE)).unwrap();
    let strict = serde_json::from_str::<Value>(&text)
        .unwrap_err()
        .to_string();
    let at = text.find("Infinity").unwrap() + 1;
    assert_eq!(strict, format!("expected value at line 1 column {at}"));
    let out = compare(&fx(BASE), &fx(CAND), &[]);
    let text = ok_text(&out);
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("sglang_version: 0.5.14 → 0.5.19"), "{text}");
    // c4 of the baseline is the line written with --output-details.
    assert!(
        text.contains(
            "Total tok/s/GPU                             486.9        543.0   +11.5% ↑ better"
        ),
        "{text}"
    );
}

#[test]
fn each_concurrency_is_a_window_and_a_rerun_appended_later_replaces_the_earlier_line() {
    let c = json_of(&compare(&fx(BASE), &fx(CAND), &["--format", "json"]));
    let names: Vec<&str> = c["windows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["window"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["c4", "c8"]);
    // The baseline file holds c8 twice: 610.0 tok/s/GPU first, then the rerun's 880.2.
    assert_eq!(metric(window(&c, "c8"), "tput_per_gpu")["baseline"], 880.2);
}

#[test]
fn windows_on_one_side_only_are_listed_not_dropped() {
    let c = json_of(&compare(&fx(BASE), &fx(CAND), &["--format", "json"]));
    assert_eq!(c["windows_only_in_baseline"], serde_json::json!(["c16"]));
    assert_eq!(c["windows_only_in_candidate"], serde_json::json!(["c32"]));
    let text = ok_text(&compare(&fx(BASE), &fx(CAND), &["--format", "markdown"]));
    assert!(text.contains("Only in the baseline: c16\n"), "{text}");
    assert!(text.contains("Only in the candidate: c32\n"), "{text}");
}

#[test]
fn latencies_are_ms_whatever_the_unit_of_the_input() {
    // bench_serving (ms) against InferenceX's aggregate (seconds) and raw result (ms) of the
    // same c4 run: the same milliseconds on both sides.
    for other in [AGG, RAW] {
        let text = ok_text(&compare(&fx(BASE), &fx(other), &["--format", "markdown"]));
        assert!(
            text.contains("| Median TTFT (ms) | 345.0 | 345.0 | +0.0% | ≈ |"),
            "{other}: {text}"
        );
        assert!(
            text.contains("| Median TPOT (ms) | 8.680 | 8.680 | +0.0% | ≈ |"),
            "{other}: {text}"
        );
        assert!(
            text.contains("| Median E2E (ms) | 8180.0 | 8180.0 | +0.0% | ≈ |"),
            "{other}: {text}"
        );
    }
}

#[test]
fn a_nan_metric_is_absent_never_zero() {
    // The candidate's c8 line has `"median_itl_ms": NaN`.
    let c = json_of(&compare(&fx(BASE), &fx(CAND), &["--format", "json"]));
    let itl = metric(window(&c, "c8"), "median_itl_ms");
    assert!(
        itl["candidate"].is_null() && itl["delta_pct"].is_null(),
        "{itl}"
    );
    assert!((itl["baseline"].as_f64().unwrap() - 9.52).abs() < 1e-9);
    let text = ok_text(&compare(&fx(BASE), &fx(CAND), &[]));
    assert!(
        text.contains("Median ITL (ms)                             9.520          n/a      n/a"),
        "{text}"
    );
}

#[test]
fn changes_inside_the_noise_band_print_approx() {
    let verdicts = |args: &[&str]| {
        let mut a = vec!["--format", "json"];
        a.extend_from_slice(args);
        let c = json_of(&compare(&fx(BASE), &fx(CAND), &a));
        let v = |w: &str| metric(window(&c, w), "tput_per_gpu")["verdict"].clone();
        (v("c4"), v("c8"))
    };
    // c4 +11.5 %, c8 +0.6 %.
    assert_eq!(
        verdicts(&[]),
        ("↑ better".into(), "≈".into()),
        "default 1 %"
    );
    assert_eq!(
        verdicts(&["--noise", "0"]),
        ("↑ better".into(), "↑ better".into())
    );
    assert_eq!(verdicts(&["--noise", "15"]), ("≈".into(), "≈".into()));
    let bad = compare(&fx(BASE), &fx(CAND), &["--noise=-1"]);
    assert_ne!(bad.status.code(), Some(0));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("expected a percentage >= 0"), "{err}");
}

#[test]
fn nested_resolved_args_differ_by_path() {
    // bench_serving keeps the server's /server_info (its resolved args) in every line.
    let text = ok_text(&compare(&fx(BASE), &fx(CAND), &[]));
    assert!(
        text.contains("- `cuda_graph_config.decode.backend`: full → disabled\n"),
        "{text}"
    );
    assert!(
        text.contains("- `chunked_prefill_size`: 16384 → 8192\n"),
        "{text}"
    );
    // Not the whole object as two blobs, and not the server's state.
    assert!(!text.contains("- `cuda_graph_config`:"), "{text}");
    assert!(!text.contains("internal_states"), "{text}");
    let changed = text
        .split("Resolved server args that changed:\n")
        .nth(1)
        .unwrap();
    assert_eq!(changed.lines().count(), 2, "{changed}");
}

#[test]
fn mismatched_gpu_counts_are_refused_without_force() {
    let tp4 = edited(CAND, "tp4", |t| {
        t.replace("\"tp_size\": 8", "\"tp_size\": 4")
    });
    let out = compare(&fx(BASE), &tp4, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("gpu_count differs (8 vs 4); pass --force"),
        "{err}"
    );
    // InferenceX's aggregate counts them by `tp`: refused the same way.
    let agg4 = edited(AGG, "agg4", |t| t.replace("\"tp\": 8", "\"tp\": 4"));
    let out = compare(&fx(BASE), &agg4, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("gpu_count differs (8 vs 4)"));
    let c = json_of(&compare(&fx(BASE), &tp4, &["--force", "--format", "json"]));
    assert!(
        c["identity_changed"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["field"] == "gpu_count"),
        "{c:#}"
    );
    let _ = std::fs::remove_dir_all(tp4.parent().unwrap());
    let _ = std::fs::remove_dir_all(agg4.parent().unwrap());
}

#[test]
fn any_pairing_of_bench_serving_inferencex_and_report_is_read() {
    let inputs = [fx(BASE), fx(RAW), fx(AGG), report()];
    for b in &inputs {
        for c in &inputs {
            // The report is of another model and GPU count: --force.
            let v = json_of(&compare(b, c, &["--force", "--format", "json"]));
            let listed = [
                "windows",
                "windows_only_in_baseline",
                "windows_only_in_candidate",
            ]
            .iter()
            .map(|k| v[*k].as_array().unwrap().len())
            .sum::<usize>();
            assert!(listed > 0, "{} vs {}: {v:#}", b.display(), c.display());
            if b == c {
                assert!(
                    !v["windows"].as_array().unwrap().is_empty(),
                    "{}",
                    b.display()
                );
            }
        }
    }
}

#[test]
fn a_report_window_named_by_concurrency_meets_the_bench_serving_line() {
    // The real report, its traffic window named as a benchmark script names it.
    let rep = edited("report", "rep", |t| {
        t.replace("\"proxy-traffic\"", "\"c4\"")
    });
    let text = ok_text(&compare(&rep, &fx(BASE), &["--force"]));
    assert!(text.contains("== c4\n"), "{text}");
    assert!(text.contains("Median TTFT (ms)"), "{text}");
    assert!(text.contains("Only in the baseline: run\n"), "{text}");
    assert!(text.contains("Only in the candidate: c8, c16\n"), "{text}");
    let _ = std::fs::remove_dir_all(rep.parent().unwrap());
}

#[test]
fn a_file_that_is_not_a_result_says_what_was_expected() {
    let cut = edited(BASE, "cut", |t| t[..200].to_string());
    let out = compare(&cut, &fx(CAND), &[]);
    assert_ne!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&cut.display().to_string()), "{err}");
    assert!(
        err.contains("expected a bench_serving result file"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(cut.parent().unwrap());
}

/// Files `compare` and `report` must refuse: a log, an empty file, JSON of another shape, a
/// report look-alike, events of nobody's run.
fn wrong_files(dir: &Path) -> Vec<(PathBuf, &'static str)> {
    let files = [
        (
            "server.log",
            "[2026-01-01 12:00:00] INFO The server is fired up and ready to roll!\n",
        ),
        ("empty.json", ""),
        ("other.json", "{\"foo\": 1, \"bar\": [1, 2]}\n"),
        (
            "lookalike.json",
            "{\"schema_version\": 1, \"windows\": \"none\"}\n",
        ),
        ("events-of-nobody.jsonl", "{\"event\": \"x\"}\n"),
    ];
    files
        .iter()
        .map(|(name, text)| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            (p, *name)
        })
        .collect()
}

/// One line on stderr naming the file, and exit 2 (bad input).
fn assert_refused(o: &Output, file: &Path, expected: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{}: {err}", file.display());
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(
        err.contains(&file.display().to_string()) && err.contains(expected),
        "names {} and what was expected ({expected}): {err}",
        file.display()
    );
    assert!(o.stdout.is_empty(), "no table of nothing");
}

#[test]
fn compare_and_report_refuse_a_file_that_is_not_theirs_naming_it() {
    let dir = temp_dir("cmp-wrong");
    for (f, _) in wrong_files(&dir) {
        // Either side, against a good input.
        assert_refused(
            &compare(&f, &fx(BASE), &[]),
            &f,
            "expected a bench_serving result",
        );
        assert_refused(
            &compare(&fx(BASE), &f, &[]),
            &f,
            "expected a bench_serving result",
        );
        let out = Command::new(supervisor_bin())
            .args(["report", "--events"])
            .arg(&f)
            .output()
            .unwrap();
        assert_refused(&out, &f, "`run --events`");
    }
    // A requests log that holds no request (with a result that needs it for its span).
    let events = dir.join("events.jsonl");
    std::fs::write(
        &events,
        "{\"ts\":\"2026-01-01T00:00:00Z\",\"event\":\"exited\",\"code\":0,\"signal\":null,\"elapsed_s\":1.0,\"requested\":false,\"exit_status\":0}\n",
    )
    .unwrap();
    let result = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/gpu/h200-c32-window/bench_serving_summary.json");
    for (f, name) in wrong_files(&dir) {
        if name == "events-of-nobody.jsonl" {
            continue;
        }
        let out = Command::new(supervisor_bin())
            .args(["report", "--events"])
            .arg(&events)
            .arg("--bench-result")
            .arg(&result)
            .arg("--requests-log")
            .arg(&f)
            .output()
            .unwrap();
        assert_refused(&out, &f, "`run --requests-log`");
    }
    let _ = std::fs::remove_dir_all(dir);
}
