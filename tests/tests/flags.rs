//! `flags` against the real argparse dumps of SGLang 0.5.14, 0.5.19, 0.5.20 and 0.5.23
//! (tests/fixtures/flags, from shared/fixtures/flags).
#![allow(clippy::unwrap_used, clippy::disallowed_methods)] // test code: a panic is the failure report
mod common;
use common::*;
use std::process::Command;

fn schema(v: &str) -> String {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("fixtures/flags/sglang-{v}.json"))
        .to_str()
        .unwrap()
        .to_string()
}

#[test]
fn a_recipe_with_cuda_graph_max_bs_fails_on_0_5_20_exactly_as_argparse_says() {
    let dir = std::env::temp_dir().join(format!("sglsup-flags-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let recipe = dir.join("dsr1_fp8_h200.sh");
    std::fs::write(
        &recipe,
        "#!/usr/bin/env bash\nexport SGLANG_HF_TOKEN=hf_secret\npython3 -m sglang.launch_server --model-path $MODEL --tp 8 \\\n  --cuda-graph-max-bs 128 --api-key sk-123 --ep 8 > $SERVER_LOG 2>&1 &\n",
    )
    .unwrap();
    let (s20, s19) = (schema("0.5.20"), schema("0.5.19"));
    let out = flags(&[
        "audit",
        "--sglang",
        &s20,
        "--baseline",
        &s19,
        "--format",
        "json",
        recipe.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "the launch would fail");
    let v = json_of(&out);
    assert_eq!(
        (v["sglang_version"].as_str(), v["baseline_version"].as_str()),
        (Some("0.5.20"), Some("0.5.19"))
    );
    let f = |name: &str| {
        v["flags"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["flag"] == name)
            .unwrap()
            .clone()
    };
    let bs = f("--cuda-graph-max-bs");
    assert_eq!(bs["status"], "ambiguous");
    assert_eq!(bs["message"], "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill");
    assert_eq!(
        bs["replacement"], "--cuda-graph-max-bs-decode",
        "from 0.5.19's deprecation trail"
    );
    assert_eq!(f("--tp")["status"], "abbrev");
    assert_eq!(f("--tp")["canonical"], "--tp-size");
    assert_eq!(f("--ep")["status"], "alias");
    assert_eq!(f("--api-key")["value"], "<redacted>");
    assert_eq!(
        v["env"][0]["value"], "<redacted>",
        "SGLANG_HF_TOKEN from the recipe"
    );
    assert_eq!(
        v["env"][0]["status"], "unchecked",
        "a dump without environ.py's variables"
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("sk-123")
            && !String::from_utf8_lossy(&out.stdout).contains("hf_secret")
    );
    // The `=value` form keeps it in argparse's message and in the replacement.
    let v = json_of(&flags(&[
        "audit",
        "--sglang",
        &s20,
        "--baseline",
        &s19,
        "--format",
        "json",
        "--",
        "--cuda-graph-max-bs=8",
    ]));
    assert_eq!(v["flags"][0]["message"], "ambiguous option: --cuda-graph-max-bs=8 could match --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill");
    assert_eq!(v["flags"][0]["replacement"], "--cuda-graph-max-bs-decode=8");
    // On 0.5.19 the same flag still works, deprecated.
    let out = flags(&[
        "audit",
        "--sglang",
        &s19,
        "--format",
        "json",
        "--",
        "--cuda-graph-max-bs",
        "128",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json_of(&out)["flags"][0]["status"], "deprecated");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn removed_unknown_choices_and_values() {
    let (s20, s19) = (schema("0.5.20"), schema("0.5.19"));
    let v = json_of(&flags(&[
        "audit",
        "--sglang",
        &s20,
        "--baseline",
        &s19,
        "--format",
        "json",
        "--",
        "--stream-output",
        "--no-such-flag",
        "--attention-backend",
        "fa9",
        "--model-path",
    ]));
    let st: Vec<&str> = v["flags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        st,
        ["removed", "unknown", "invalid_choice", "missing_value"]
    );
    assert!(v["flags"][2]["message"]
        .as_str()
        .unwrap()
        .starts_with("argument --attention-backend: invalid choice: 'fa9' (choose from 'triton',"));
}

#[test]
fn ep_aliases_exist_in_every_version() {
    for ver in ["0.5.14", "0.5.19", "0.5.20", "0.5.23"] {
        let out = flags(&[
            "audit",
            "--sglang",
            &schema(ver),
            "--format",
            "json",
            "--",
            "--expert-parallel-size",
            "8",
            "--ep",
            "8",
        ]);
        assert_eq!(out.status.code(), Some(0), "{ver}");
        let v = json_of(&out);
        assert!(
            v["flags"]
                .as_array()
                .unwrap()
                .iter()
                .all(|f| f["status"] == "alias" && f["canonical"] == "--ep-size"),
            "{ver}: {v}"
        );
    }
}

#[test]
fn diff_counts_match_the_reference_for_every_bump() {
    // reference/sglang.md §6: option-string changes per version bump.
    for (from, to, added, removed) in [
        ("0.5.14", "0.5.19", 91, 3),
        ("0.5.19", "0.5.20", 15, 23),
        ("0.5.20", "0.5.23", 50, 4),
    ] {
        let v = json_of(&flags(&[
            "diff",
            "--from",
            &schema(from),
            "--to",
            &schema(to),
            "--format",
            "json",
        ]));
        assert_eq!(
            v["added"].as_array().unwrap().len(),
            added,
            "{from}→{to} added"
        );
        assert_eq!(
            v["removed"].as_array().unwrap().len(),
            removed,
            "{from}→{to} removed"
        );
    }
    let v = json_of(&flags(&[
        "diff",
        "--from",
        &schema("0.5.19"),
        "--to",
        &schema("0.5.20"),
        "--format",
        "json",
    ]));
    let removed: Vec<&str> = v["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect();
    assert!(removed.contains(&"--cuda-graph-max-bs") && removed.contains(&"--stream-output"));
    let v = json_of(&flags(&[
        "diff",
        "--from",
        &schema("0.5.20"),
        "--to",
        &schema("0.5.23"),
        "--format",
        "json",
    ]));
    assert!(
        v["deprecated"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["flag"] == "--enable-dp-attention"),
        "{}",
        v["deprecated"]
    );
}

#[test]
fn an_interpreter_without_sglang_is_a_clear_error() {
    let out = flags(&["audit", "--sglang", "python3", "--", "--tp", "2"]);
    assert_eq!(out.status.code(), Some(125));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("No module named 'sglang'") && err.contains("saved schema .json"),
        "{err}"
    );
    let out = flags(&[
        "audit",
        "--sglang",
        "sglang-0.5.20-py3-none-any.whl",
        "--",
        "--tp",
        "2",
    ]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no such wheel file"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Import mode end to end through a real interpreter: a minimal package with SGLang's module
/// layout (`sglang.srt.server_args.ServerArgs.add_cli_args`) and a `Deprecated*` action class.
#[test]
fn import_mode_reads_the_parser_of_the_interpreters_sglang() {
    let dir = std::env::temp_dir().join(format!("sglsup-fakesgl-{}", std::process::id()));
    let pkg = dir.join("sglang/srt");
    std::fs::create_dir_all(&pkg).unwrap();
    std::fs::write(dir.join("sglang/__init__.py"), "__version__ = '9.9.9'\n").unwrap();
    std::fs::write(pkg.join("__init__.py"), "").unwrap();
    std::fs::write(
        pkg.join("server_args.py"),
        r#"import argparse
class DeprecatedAliasStoreAction(argparse.Action):
    def __init__(self, option_strings, dest, new_flag=None, **kw):
        self.new_flag = new_flag
        super().__init__(option_strings, dest, **kw)
    def __call__(self, parser, ns, values, option_string=None):
        setattr(ns, self.dest, values)
class ServerArgs:
    @staticmethod
    def add_cli_args(p):
        p.add_argument("--model-path", type=str, required=True)
        p.add_argument("--tp-size", "--tp", type=int, default=1)
        p.add_argument("--cuda-graph-max-bs-decode", type=int)
        p.add_argument("--cuda-graph-max-bs", dest="cuda_graph_max_bs_decode", type=int,
                       action=DeprecatedAliasStoreAction, new_flag="--cuda-graph-max-bs-decode")
        p.add_argument("--mode", choices=["a", "b"], default="a")
"#,
    )
    .unwrap();
    let out = Command::new(supervisor_bin())
        .args([
            "flags",
            "audit",
            "--sglang",
            "python3",
            "--format",
            "json",
            "--",
            "--model-path",
            "m",
            "--tp",
            "2",
            "--cuda-graph-max-bs",
            "8",
            "--mode",
            "c",
        ])
        .env("PYTHONPATH", &dir)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json_of(&out);
    assert_eq!(v["sglang_version"], "9.9.9");
    let st: Vec<&str> = v["flags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["status"].as_str().unwrap())
        .collect();
    assert_eq!(st, ["ok", "alias", "deprecated", "invalid_choice"]);
    assert_eq!(v["flags"][2]["replacement"], "--cuda-graph-max-bs-decode");
    // The same import as `run`'s pre-flight (it found a runtime-in-runtime panic on the H200).
    let out = Command::new(supervisor_bin())
        .args([
            "run",
            "--metrics-addr",
            "none",
            "--no-tee",
            "--flags-schema",
            "python3",
            "--",
            "python3",
            "-m",
            "sglang.launch_server",
            "--model-path",
            "m",
            "--mode",
            "c",
        ])
        .env("PYTHONPATH", &dir)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(126),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid choice: 'c'"));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn run_preflight_stops_a_launch_that_would_fail_to_parse() {
    let dir = std::env::temp_dir().join(format!("sglsup-preflight-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ev = dir.join("events.jsonl");
    let run = |extra: &[&str]| {
        Command::new(supervisor_bin())
            .args([
                "run",
                "--metrics-addr",
                "none",
                "--no-tee",
                "--flags-schema",
                &schema("0.5.20"),
                "--events",
            ])
            .arg(&ev)
            .args(extra)
            .args([
                "--",
                "python3",
                "-m",
                "sglang.launch_server",
                "--model-path",
                "m",
                "--cuda-graph-max-bs",
                "8",
            ])
            .output()
            .unwrap()
    };
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(126));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ambiguous")
            && err.contains("--cuda-graph-max-bs")
            && err.contains("--no-preflight"),
        "{err}"
    );
    let events = std::fs::read_to_string(&ev).unwrap();
    assert!(
        events.contains("\"preflight\"") && !events.contains("\"spawned\""),
        "the verdict is recorded, nothing was spawned: {events}"
    );
    // --no-preflight launches anyway (here python3 has no sglang: it fails by itself).
    let out = run(&["--no-preflight"]);
    assert_ne!(out.status.code(), Some(126));
    assert!(std::fs::read_to_string(&ev)
        .unwrap()
        .contains("\"spawned\""));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_parser_imported_on_the_h200_equals_the_one_imported_on_a_cpu() {
    // Two dump formats of the same 0.5.14 (one marks help-text deprecations, one does not).
    let v = json_of(&flags(&[
        "diff",
        "--from",
        &schema("0.5.14-import-on-h200"),
        "--to",
        &schema("0.5.14"),
        "--format",
        "json",
    ]));
    for k in ["added", "removed", "deprecated", "changed"] {
        assert!(v[k].as_array().unwrap().is_empty(), "{k}: {}", v[k]);
    }
}

#[test]
fn flags_diff_as_markdown_is_markdown_not_the_text_form() {
    let args = |fmt: &'static str| {
        [
            "diff".to_string(),
            "--from".into(),
            schema("0.5.19"),
            "--to".into(),
            schema("0.5.20"),
            "--format".into(),
            fmt.into(),
        ]
    };
    let run = |fmt| {
        let a = args(fmt);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let o = flags(&a).expect_success("flags diff");
        String::from_utf8(o.stdout).unwrap()
    };
    let (md, text) = (run("markdown"), run("text"));
    assert_ne!(md, text);
    assert!(md.starts_with("## SGLang 0.5.19 → 0.5.20\n"), "{md}");
    assert!(
        md.contains("\n### Removed (23)\n\n- `--cuda-graph-max-bs`\n")
            || md.contains("- `--cuda-graph-max-bs`\n"),
        "{md}"
    );
    assert!(
        md.contains("| flag | field | from | to |\n|---|---|---|---|\n"),
        "{md}"
    );
}

#[test]
fn flags_audit_reads_the_recipe_from_stdin_given_a_dash() {
    use std::io::Write;
    let mut child = Command::new(supervisor_bin())
        .args([
            "flags",
            "audit",
            "--sglang",
            &schema("0.5.20"),
            "--format",
            "json",
            "-",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"python3 -m sglang.launch_server --model-path m --cuda-graph-max-bs 128\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json_of(&out);
    assert!(
        v["flags"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["flag"] == "--cuda-graph-max-bs" && f["status"] == "ambiguous"),
        "{v}"
    );
}

#[test]
fn version_names_the_commit_and_completions_and_man_page_are_printed() {
    let out = Command::new(supervisor_bin())
        .arg("--version")
        .output()
        .unwrap();
    let v = String::from_utf8(out.stdout).unwrap();
    assert!(v.starts_with("sglang-supervisor 0."), "{v}");
    let commit = v
        .split_once('(')
        .unwrap()
        .1
        .trim_end()
        .trim_end_matches(')');
    assert!(
        commit == "unknown"
            || commit
                .trim_end_matches("-dirty")
                .chars()
                .all(|c| c.is_ascii_hexdigit()),
        "{v}"
    );
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(supervisor_bin())
            .args(["completions", shell])
            .output()
            .unwrap()
            .expect_success(&format!("completions {shell}"));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("ready-timeout") && text.contains("audit"),
            "{shell}"
        );
    }
    let out = Command::new(supervisor_bin()).arg("man").output().unwrap();
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && page.starts_with(".ie") || page.contains(".TH sglang-supervisor"),
        "{page:.300}"
    );
}

/// `run`'s pre-flight finds the launch behind whatever runs it, and inside `bash -c` and a bash
/// recipe (every launch of it); a launch that parses is not refused.
#[test]
fn run_preflight_reads_launches_behind_prefixes_and_in_bash_recipes() {
    let dir = std::env::temp_dir().join(format!("sglsup-pre-shapes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ev = dir.join("events.jsonl");
    let recipe = dir.join("r.sh");
    std::fs::write(
        &recipe,
        "if [ -n \"$PD\" ]; then\n  python3 -m sglang.launch_server --model-path m --tp 4\nelse\n  cmd=(python3 -m sglang.launch_server --model-path m -tp 8)\n  \"${cmd[@]}\"\nfi\n",
    )
    .unwrap();
    let run = |command: &[&str]| {
        let out = Command::new(supervisor_bin())
            .args([
                "run",
                "--metrics-addr",
                "none",
                "--no-tee",
                "--ready-timeout",
                "5s",
            ])
            .args(["--flags-schema", &schema("0.5.20"), "--events"])
            .arg(&ev)
            .arg("--")
            .args(command)
            .output()
            .unwrap();
        let events = std::fs::read_to_string(&ev).unwrap_or_default();
        let first: serde_json::Value =
            serde_json::from_str(events.lines().next().unwrap_or("null")).unwrap();
        (out.status.code(), first)
    };
    let bad = [
        "python3",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "m",
        "--trust-remote-code=1",
    ];
    for prefix in [
        &["timeout", "60"][..],
        &["env", "A=B"],
        &["numactl", "--cpunodebind=0"],
        &["nice", "-n", "5"],
    ] {
        let mut cmd: Vec<&str> = prefix.to_vec();
        cmd.extend(bad);
        let (code, first) = run(&cmd);
        assert_eq!(code, Some(126), "{cmd:?}");
        assert_eq!(first["event"], "preflight", "{cmd:?}");
        assert_eq!(
            first["error"],
            "argument --trust-remote-code: ignored explicit argument '1'"
        );
        assert_eq!(first["flags"][0]["status"], "unexpected_value");
    }
    let (code, first) = run(&["bash", "-c", &format!("exec {}", bad.join(" "))]);
    assert_eq!(
        (code, &first["rejected"]),
        (Some(126), &serde_json::json!(true))
    );
    // The recipe's second launch (built in an array) fails: refused, naming its line.
    let (code, first) = run(&["bash", recipe.to_str().unwrap()]);
    assert_eq!(code, Some(126), "{first}");
    let lines: Vec<&serde_json::Value> = first["launches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| &l["line"])
        .collect();
    assert_eq!(lines, [2, 5]);
    assert_eq!(
        first["launches"][1]["error"],
        "unrecognized arguments: -tp 8"
    );
    assert_eq!(first["launches"][0]["status"], 0);
    let _ = std::fs::remove_dir_all(dir);
}

/// A launch that is seen but cannot be read is an error naming its line, never "0 flags
/// checked ... the launch will parse".
#[test]
fn a_launch_seen_but_not_read_is_an_error_naming_its_line() {
    let dir = std::env::temp_dir().join(format!("sglsup-unread-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, text, want) in [
        (
            "kept.sh",
            "#!/bin/bash\ncmd=(python3 -m sglang.launch_server --tp 8)\nrun_logged cmd\n",
            "line 2: `cmd` holds an SGLang launch",
        ),
        (
            "hidden.sh",
            "#!/bin/bash\nARGS=\"--tp 8\"\npython3 -m sglang.launch_server $ARGS &\n",
            "line 3: every flag of the launch is in $ARGS",
        ),
        (
            "quote.sh",
            "#!/bin/bash\necho start\nNOTE='never closed\npython3 -m sglang.launch_server --tp 8\n",
            "line 3: unterminated '",
        ),
    ] {
        let r = dir.join(name);
        std::fs::write(&r, text).unwrap();
        let out = Command::new(supervisor_bin())
            .args(["flags", "audit", "--sglang", &schema("0.5.20")])
            .arg(&r)
            .env("RUST_LOG", "off")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{name}: {err}");
        assert!(err.contains(want), "{name}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{name}: one line: {err}");
        assert!(!err.contains("flags checked"), "{name}: {err}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A JSON file without a single option (an empty `actions`, or entries without option strings)
/// is no flag schema: `flags audit` and `run --flags-schema` refuse it (125), where they took it
/// and called every flag of a good launch unknown ("THE LAUNCH WILL FAIL", 126 for `run`).
#[test]
fn a_schema_without_options_is_refused_not_used_to_fail_a_launch() {
    let dir = temp_dir("flags-no-options");
    for (name, text) in [
        ("empty.json", r#"{"sglang_version": "x", "actions": []}"#),
        (
            "nameless.json",
            r#"{"actions": [{"dest": "model_path", "nargs": null}]}"#,
        ),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        let p = path.to_str().unwrap();
        let audit = flags(&["audit", "--sglang", p, "--", "--model-path", "m"]);
        let run = Command::new(supervisor_bin())
            .args(["run", "--gpu-backend", "none", "--metrics-addr", "none"])
            .args(["--flags-schema", p, "--"])
            .args(["python3", "-m", "sglang.launch_server", "--model-path", "m"])
            .output()
            .unwrap();
        for out in [audit, run] {
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(125), "{name}: {err}");
            assert!(
                err.contains(&format!("{p} is not a flag schema: no option in it")),
                "{name}: {err}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
