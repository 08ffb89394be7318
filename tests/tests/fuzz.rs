//! Every parser that reads outside input, fuzzed for a fixed budget per run: the corpus in
//! `fuzz/corpus/<target>/` first (crashes found earlier live there as regression inputs), then
//! seeded mutants of it. `FUZZ_SECONDS` sets the budget per target (default 3), `FUZZ_SEED` the
//! seed (default: fixed, so a CI failure reproduces). Longer runs: `scripts/fuzz.sh`.
#![allow(clippy::unwrap_used)] // test code: a panic is the failure report
use sglang_supervisor_tests::fuzzing::{fuzz, TARGETS};
use std::time::Duration;

fn run(target: &str) {
    let secs: f64 = std::env::var("FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let seed: u64 = std::env::var("FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261202);
    let harness = TARGETS.iter().find(|(n, _)| *n == target).unwrap().1;
    let ran = fuzz(target, harness, Duration::from_secs_f64(secs), seed);
    assert!(ran > 100, "{target}: only {ran} inputs in {secs} s");
    eprintln!("{target}: {ran} inputs, no failure");
}

#[test]
fn fuzz_log_line_parser() {
    run("log_line");
}

#[test]
fn fuzz_server_args_python_literals() {
    run("server_args");
}

#[test]
fn fuzz_recipe_extractor_and_audit() {
    run("recipe");
}

#[test]
fn fuzz_proxy_sse_token_accounting() {
    run("sse");
}

#[test]
fn fuzz_report_and_inferencex_readers() {
    run("run_json");
}

#[test]
fn fuzz_saved_flag_schemas() {
    run("flag_schema");
}

#[test]
fn fuzz_non_streamed_answer_token_counts() {
    run("body_counts");
}

#[test]
fn every_target_has_a_test_here() {
    let src = include_str!("fuzz.rs");
    for (name, _) in TARGETS {
        assert!(src.contains(&format!("run(\"{name}\")")), "{name}");
    }
}
