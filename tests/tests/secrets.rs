//! Secrets (`--api-key`, `--admin-api-key`, tokens in the environment) never appear in events,
//! metrics, reports or audit output; with `--redact-log` not in the log file or the terminal copy
//! either, which are otherwise the child's exact bytes. Listeners are on loopback by default.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)] // test code: a panic is the failure report
mod common;
use common::*;
use sglang_supervisor_tests::http;
use std::process::{Command, Stdio};
use std::time::Duration;

const API_KEY: &str = "sk-live-4f9a2c7e1b";
const ADMIN_KEY: &str = "adm-7d3e9b1c55";
const HF_TOKEN: &str = "hf_QwErTy123456";

/// A child that prints every secret the way real output does: in a traceback-like line, in a
/// JSON dump, and split across two writes with a pause between (two separate pipe reads), then
/// fails, so that the fatal diagnosis quotes its last lines.
const LEAKY: &str = r#"echo "server_args=ServerArgs(api_key='$2', admin_api_key='$4')"
echo "{\"hf_token\": \"$HF_TOKEN\"}" >&2
sleep 0.2
printf 'Traceback: key=%s' "$(printf %s "$2" | cut -c1-6)"; sleep 0.3; printf '%s\n' "$(printf %s "$2" | cut -c7-)"
sleep 0.2
echo "RuntimeError: bad key $2 for token $HF_TOKEN" >&2
exit 1"#;

fn leaky_run(dir: &std::path::Path, redact: bool) -> (std::process::Output, String) {
    let log = dir.join(if redact { "redacted.log" } else { "exact.log" });
    let mut cmd = Command::new(supervisor_bin());
    cmd.args(["run", "--metrics-addr", "none", "--events"])
        .arg(dir.join(if redact { "ev-r.jsonl" } else { "ev.jsonl" }))
        .arg("--report")
        .arg(dir.join(if redact {
            "report-r.json"
        } else {
            "report.json"
        }))
        .arg("--log-file")
        .arg(&log);
    if redact {
        cmd.arg("--redact-log");
    }
    let out = cmd
        .args([
            "--",
            "sh",
            "-c",
            LEAKY,
            "sh",
            "--api-key",
            API_KEY,
            "--admin-api-key",
            ADMIN_KEY,
        ])
        .env("HF_TOKEN", HF_TOKEN)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (out, std::fs::read_to_string(log).unwrap())
}

fn contains_secret(text: &str) -> Option<&'static str> {
    [API_KEY, ADMIN_KEY, HF_TOKEN]
        .into_iter()
        .find(|s| text.contains(s))
}

#[test]
fn secrets_never_reach_events_or_reports_and_redact_log_covers_the_log_and_terminal() {
    let dir = std::env::temp_dir().join(format!("sglsup-secrets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    // Without --redact-log: the log file and the terminal copy are the child's exact bytes...
    let (out, log) = leaky_run(&dir, false);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        log.contains(API_KEY) && log.contains(HF_TOKEN),
        "exact bytes: {log}"
    );
    // ...and yet the events (argv, the fatal diagnosis quoting the traceback) and the report
    // carry none of them.
    for f in ["ev.jsonl", "report.json"] {
        let text = std::fs::read_to_string(dir.join(f)).unwrap();
        assert_eq!(contains_secret(&text), None, "{f}: {text}");
        assert!(
            text.contains("<redacted>"),
            "{f}: redacted, not dropped: {text}"
        );
    }
    let ev = std::fs::read_to_string(dir.join("ev.jsonl")).unwrap();
    assert!(
        ev.contains("RuntimeError: bad key <redacted>"),
        "the diagnosis keeps its words: {ev}"
    );

    // With --redact-log: the log file and the terminal copy lose the secrets, even the one split
    // across two reads, and keep everything else.
    let (out, log) = leaky_run(&dir, true);
    assert_eq!(out.status.code(), Some(1));
    let terminal = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(contains_secret(&log), None, "log: {log}");
    assert_eq!(contains_secret(&terminal), None, "terminal: {terminal}");
    assert!(
        log.contains("Traceback: key=<redacted>\n"),
        "split secret: {log}"
    );
    assert!(
        log.contains("server_args=ServerArgs(api_key='<redacted>', admin_api_key='<redacted>')"),
        "{log}"
    );
    assert!(
        terminal.contains("RuntimeError: bad key <redacted> for token <redacted>"),
        "{terminal}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn secrets_in_argv_and_environment_never_reach_metrics() {
    let run = Run::start(
        "secret-metrics",
        Opts {
            replay: &[
                "--speed",
                "50",
                "--api-key",
                API_KEY,
                "--admin-api-key",
                ADMIN_KEY,
            ],
            env: &[("HF_TOKEN", HF_TOKEN)],
            ..Default::default()
        },
    );
    let metrics = run.wait_event("listening", Duration::from_secs(60))["metrics"]
        .as_str()
        .unwrap()
        .to_string();
    run.wait_event("ready", Duration::from_secs(60));
    let (_, body) = http(&metrics, "GET", "/metrics", "");
    assert!(body.contains("sglang_supervisor_"), "{body}");
    assert_eq!(contains_secret(&body), None, "{body}");
    let events = std::fs::read_to_string(run.dir.join("events.jsonl")).unwrap();
    assert_eq!(contains_secret(&events), None, "{events}");
}

#[test]
fn audit_output_never_carries_secret_values() {
    for format in ["text", "json", "markdown"] {
        let out = Command::new(supervisor_bin())
            .args(["flags", "audit", "--sglang"])
            .arg(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("fixtures/flags/sglang-0.5.20.json"),
            )
            .args([
                "--format",
                format,
                "--",
                "--api-key",
                API_KEY,
                "--admin-api-key",
                ADMIN_KEY,
            ])
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(contains_secret(&text), None, "{format}: {text}");
        assert!(text.contains("<redacted>"), "{format}: {text}");
    }
}

#[test]
fn listeners_are_on_loopback_by_default() {
    let help = Command::new(supervisor_bin())
        .args(["run", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("[default: 127.0.0.1:19400]"),
        "metrics default: {help}"
    );
    // The metrics listener a run really opens, with only a port given.
    let run = Run::start(
        "loopback",
        Opts {
            supervisor: &["--metrics-addr", ":0", "--proxy-addr", ":0"],
            replay: &["--speed", "50"],
            ..Default::default()
        },
    );
    let l = run.wait_event("listening", Duration::from_secs(60));
    for k in ["metrics", "proxy"] {
        assert!(l[k].as_str().unwrap().starts_with("127.0.0.1:"), "{k}: {l}");
    }
}

#[test]
fn a_server_with_an_api_key_is_confirmed_ready_with_that_key() {
    // Like SGLang with --api-key: every path but /health* and /metrics answers 401 without it.
    let run = Run::start(
        "api-key-ready",
        Opts {
            replay: &["--speed", "50", "--api-key", API_KEY],
            ..Default::default()
        },
    );
    run.wait_event("ready", Duration::from_secs(60));
    let info = run.wait_event("server_info", Duration::from_secs(10));
    assert!(
        !info["max_total_num_tokens"].is_null(),
        "/server_info read with the key: {info}"
    );
    let warnings = run.events_named("warning");
    assert!(
        warnings.iter().all(|w| !w.to_string().contains("401")),
        "{warnings:?}"
    );
    let events = std::fs::read_to_string(run.dir.join("events.jsonl")).unwrap();
    assert_eq!(contains_secret(&events), None, "{events}");
}

#[test]
fn redact_log_covers_secret_names_by_pattern_not_by_list() {
    // Names beyond any fixed list: *_KEY, *SECRET*, *_PAT, *_TOKEN, *PASSWORD*.
    let vars = [
        ("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMIK7MDENG"),
        ("GITHUB_PAT", "github_pat_11ABCDEFG"),
        ("WANDB_API_KEY", "wandb-0123456789"),
        ("SLACK_BOT_TOKEN", "xoxb-1234-5678"),
        ("DB_PASSWORD_PLAIN", "hunter2-hunter2"),
    ];
    let dir = std::env::temp_dir().join(format!("sglsup-pattern-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("server.log");
    let out = Command::new(supervisor_bin())
        .args([
            "run",
            "--metrics-addr",
            "none",
            "--redact-log",
            "--log-file",
        ])
        .arg(&log)
        .args(["--", "sh", "-c", "env; echo done"])
        .envs(vars)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = std::fs::read_to_string(&log).unwrap();
    let terminal = String::from_utf8_lossy(&out.stdout);
    for (name, value) in vars {
        assert!(
            text.contains(&format!("{name}=<redacted>")),
            "{name}: {text}"
        );
        assert!(!text.contains(value), "{name}'s value in the log");
        assert!(!terminal.contains(value), "{name}'s value on the terminal");
    }
    assert!(text.contains("done"));
    let _ = std::fs::remove_dir_all(dir);
}
