//! `flags` on the real SGLang releases from PyPI (scripts/fetch-sglang.sh): the static reader on
//! the wheels 0.5.14, 0.5.19, 0.5.20 and 0.5.23 against the real parser dumps, the recipes of the
//! issue, bad input, and import mode on a venv where SGLang 0.5.23 really imports.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)] // test code: a panic is the failure report
mod common;
use common::*;
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

const VERSIONS: [&str; 4] = ["0.5.14", "0.5.19", "0.5.20", "0.5.23"];

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn wheel(v: &str) -> String {
    let dir = std::env::var_os("SGLANG_WHEELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/sglang-wheels"));
    let found = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}; run scripts/fetch-sglang.sh", dir.display()))
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            let n = p.file_name().unwrap().to_string_lossy().into_owned();
            n.starts_with(&format!("sglang-{v}-")) && n.ends_with(".whl")
        });
    found
        .unwrap_or_else(|| {
            panic!(
                "no sglang {v} wheel in {}; run scripts/fetch-sglang.sh",
                dir.display()
            )
        })
        .to_string_lossy()
        .into_owned()
}

fn venv_python() -> String {
    let venv = std::env::var_os("SGLANG_IMPORT_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/sglang-venv"));
    assert!(
        venv.join(".complete").exists(),
        "{}: no SGLang venv; run scripts/fetch-sglang.sh",
        venv.display()
    );
    venv.join("bin/python3").to_string_lossy().into_owned()
}

fn recipe(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/recipes")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

fn dump_fixture(v: &str) -> Value {
    let p =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("fixtures/flags/sglang-{v}.json"));
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// (option strings, dest, deprecated, replacement, const_value) of every option, in parser order.
fn shape(options: &[Value]) -> Vec<(Value, Value, bool, Value, Value)> {
    options
        .iter()
        .filter(|a| a["dest"] != "help")
        .map(|a| {
            let deprecated =
                a["deprecated"].as_bool().unwrap_or(false) || a["deprecated"].is_object();
            let replacement = a["new_flag"].clone();
            let replacement = if replacement.is_null() {
                a["deprecated"]["new_flag"].clone()
            } else {
                replacement
            };
            (
                a["option_strings"].clone(),
                a["dest"].clone(),
                deprecated,
                replacement,
                a["const_value"].clone(),
            )
        })
        .collect()
}

fn static_dump(source: &str) -> Value {
    let out = flags(&["dump", "--sglang", source, "--raw"]).expect_success("flags dump --raw");
    json_of(&out)
}

#[test]
fn static_mode_on_each_wheel_equals_the_real_parser_dump() {
    for v in VERSIONS {
        let got = static_dump(&wheel(v));
        assert_eq!(got["sglang_version"], v);
        assert_eq!(got["method"], "static");
        let want = dump_fixture(v);
        let (g, w) = (
            shape(got["actions"].as_array().unwrap()),
            shape(want["actions"].as_array().unwrap()),
        );
        assert_eq!(g.len(), w.len(), "{v}: number of options");
        for (a, b) in g.iter().zip(&w) {
            assert_eq!(
                a, b,
                "{v}: option strings (order included), dest and deprecation"
            );
        }
        // Defaults and choices are evaluated where they are literals or named constants, and
        // then equal the real parser's; the rest is marked unresolved, never guessed.
        let (mut equal, mut unresolved) = (0, 0);
        for (a, b) in got["actions"]
            .as_array()
            .unwrap()
            .iter()
            .zip(want["actions"].as_array().unwrap())
        {
            for field in ["default", "choices", "nargs", "type"] {
                if a[field].get("unresolved").is_some() {
                    unresolved += 1;
                } else {
                    assert_eq!(a[field], b[field], "{v} {} {field}", b["option_strings"]);
                    equal += 1;
                }
            }
        }
        assert!(
            equal > unresolved * 20,
            "{v}: {equal} equal, {unresolved} unresolved"
        );
        assert!(
            got["env"].as_array().unwrap().len() > 300,
            "{v}: SGLANG_* variables from environ.py"
        );
    }
}

#[test]
fn an_unpacked_tree_reads_like_its_wheel() {
    let dir = std::env::temp_dir().join(format!("sglsup-tree-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let st = Command::new("python3")
        .args(["-m", "zipfile", "-e", &wheel("0.5.20")])
        .arg(&dir)
        .status()
        .unwrap();
    assert!(st.success());
    let from_tree = static_dump(dir.to_str().unwrap());
    let from_wheel = static_dump(&wheel("0.5.20"));
    assert_eq!(from_tree["actions"], from_wheel["actions"]);
    assert_eq!(from_tree["sglang_version"], "0.5.20", "from the dist-info");
    // The `sglang` package directory itself names the same tree.
    let pkg = static_dump(dir.join("sglang").to_str().unwrap());
    assert_eq!(pkg["actions"], from_wheel["actions"]);
    // The same module in a subprocess of python3 (a binary built without embedded-python).
    let out = flags(&[
        "dump",
        "--raw",
        "--subprocess",
        "--sglang",
        &wheel("0.5.20"),
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("subprocess of python3"));
    assert_eq!(json_of(&out)["actions"], from_wheel["actions"]);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn qwen_recipe_on_0_5_19_parses_with_aliases_deprecations_and_an_abbreviation() {
    let out = flags(&[
        "audit",
        "--sglang",
        &wheel("0.5.19"),
        "--format",
        "json",
        &recipe("qwen3.5_fp8_h200.sh"),
    ]);
    assert_eq!(out.status.code(), Some(1), "worst is deprecated");
    let v = json_of(&out);
    let all = v["flags"].as_array().unwrap();
    assert_eq!(all.len(), 22);
    assert!(all.iter().all(|f| !matches!(
        f["status"].as_str().unwrap(),
        "ambiguous" | "unknown" | "removed" | "invalid_choice" | "missing_value"
    )));
    let f = |name: &str| all.iter().find(|x| x["flag"] == name).unwrap().clone();
    assert_eq!(f("--expert-parallel-size")["status"], "alias");
    assert_eq!(f("--expert-parallel-size")["canonical"], "--ep-size");
    assert_eq!(f("--cuda-graph-max-bs")["status"], "deprecated");
    assert_eq!(
        f("--cuda-graph-max-bs")["replacement"],
        "--cuda-graph-max-bs-decode"
    );
    assert_eq!(
        f("--enable-flashinfer-allreduce-fusion")["status"],
        "deprecated"
    );
    assert_eq!(
        f("--enable-flashinfer-allreduce-fusion")["replacement"],
        "--flashinfer-allreduce-fusion-backend=auto"
    );
    assert_eq!(f("--tp")["status"], "abbrev");
    assert_eq!(f("--tp")["canonical"], "--tp-size");
    assert_eq!(
        f("--context-length")["value"],
        "$((ISL + OSL + 20))",
        "one shell word"
    );
    // Markdown for a PR body: a table with a row per flag.
    let md = flags(&[
        "audit",
        "--sglang",
        &wheel("0.5.19"),
        "--format",
        "markdown",
        &recipe("qwen3.5_fp8_h200.sh"),
    ]);
    let text = String::from_utf8_lossy(&md.stdout);
    assert!(
        text.starts_with("| flag | value | status | note |"),
        "{text}"
    );
    assert_eq!(text.lines().filter(|l| l.starts_with("| `--")).count(), 22);
}

#[test]
fn dsr1_recipe_on_0_5_20_is_ambiguous_with_the_fix_from_0_5_19() {
    let out = flags(&[
        "audit",
        "--sglang",
        &wheel("0.5.20"),
        "--baseline",
        &wheel("0.5.19"),
        "--format",
        "json",
        &recipe("dsr1_fp8_mi325x.sh"),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let v = json_of(&out);
    assert_eq!(
        (v["sglang_version"].as_str(), v["baseline_version"].as_str()),
        (Some("0.5.20"), Some("0.5.19"))
    );
    let bs = v["flags"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["flag"] == "--cuda-graph-max-bs")
        .unwrap();
    assert_eq!(bs["status"], "ambiguous");
    assert_eq!(bs["value"], "128");
    assert_eq!(
        bs["candidates"],
        serde_json::json!(["--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill"])
    );
    assert_eq!(bs["message"], "ambiguous option: --cuda-graph-max-bs=128 could match --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill");
    assert_eq!(bs["replacement"], "--cuda-graph-max-bs-decode=128");
    // The recipe's exported SGLANG_* variables, checked against 0.5.20's environ.py.
    let env = v["env"].as_array().unwrap();
    let names: Vec<&str> = env.iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["SGLANG_USE_AITER", "SGLANG_AITER_MLA_PERSIST"]);
    assert!(env.iter().all(|e| e["status"] != "unchecked"));
    // Not in environ.py, but the aiter backend reads it itself (get_bool_env_var): known.
    assert_eq!(env[1]["status"], "ok");
    assert_eq!(
        env[1]["read_by"],
        "sglang/srt/layers/attention/aiter_backend.py"
    );
    // Removed (the baseline had it, with its replacement) versus unknown.
    let v = json_of(&flags(&[
        "audit",
        "--sglang",
        &wheel("0.5.20"),
        "--baseline",
        &wheel("0.5.19"),
        "--format",
        "json",
        "--",
        "--stream-output",
        "--no-such-flag",
    ]));
    assert_eq!(v["flags"][0]["status"], "removed");
    assert_eq!(
        v["flags"][0]["replacement"],
        "--incremental-streaming-output"
    );
    assert_eq!(v["flags"][1]["status"], "unknown");
    // Without a baseline, a flag 0.5.20 lost is just unknown.
    let v = json_of(&flags(&[
        "audit",
        "--sglang",
        &wheel("0.5.20"),
        "--format",
        "json",
        "--",
        "--stream-output",
    ]));
    assert_eq!(v["flags"][0]["status"], "unknown");
}

#[test]
fn environment_variables_are_checked_against_environ_py() {
    let dir = std::env::temp_dir().join(format!("sglsup-env-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let r = dir.join("r.sh");
    std::fs::write(
        &r,
        "export SGLANG_ENABLE_TORCH_INFERENCE_MODE=1\nexport SGLANG_GC_LOG=1\nexport SGLANG_NO_SUCH_VARIABLE=1\npython3 -m sglang.launch_server --model-path m\n",
    )
    .unwrap();
    let out = flags(&[
        "audit",
        "--sglang",
        &wheel("0.5.19"),
        "--format",
        "json",
        r.to_str().unwrap(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "the launch parses; a variable is ignored"
    );
    let v = json_of(&out);
    let st: Vec<(&str, &str)> = v["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        st,
        [
            ("SGLANG_ENABLE_TORCH_INFERENCE_MODE", "ok"),
            ("SGLANG_GC_LOG", "deprecated"),
            ("SGLANG_NO_SUCH_VARIABLE", "unknown")
        ]
    );
    assert_eq!(v["env"][1]["replacement"], "SGLANG_LOG_GC");
    // Read directly by the package (os.environ / os.getenv outside environ.py), in the wheel
    // and in an installed tree alike; a variable nobody reads stays unknown.
    for source in [wheel("0.5.20"), venv_python()] {
        let r2 = dir.join("r2.sh");
        std::fs::write(
            &r2,
            "export SGLANG_AITER_MLA_PERSIST=1\nexport SGLANG_NO_SUCH_VARIABLE=1\npython3 -m sglang.launch_server --model-path m\n",
        )
        .unwrap();
        let v = json_of(&flags(&[
            "audit",
            "--sglang",
            &source,
            "--format",
            "json",
            r2.to_str().unwrap(),
        ]));
        let st: Vec<&str> = v["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["status"].as_str().unwrap())
            .collect();
        assert_eq!(st, ["ok", "unknown"], "{source}: {}", v["env"]);
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn diff_0_5_19_to_0_5_20_from_the_wheels() {
    let v = json_of(&flags(&[
        "diff",
        "--from",
        &wheel("0.5.19"),
        "--to",
        &wheel("0.5.20"),
        "--format",
        "json",
    ]));
    let removed: Vec<&str> = v["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect();
    assert_eq!(removed.len(), 23, "{removed:?}");
    for f in ["--cuda-graph-max-bs", "--cuda-graph-bs", "--stream-output"] {
        assert!(removed.contains(&f), "{f}");
    }
    assert_eq!(v["added"].as_array().unwrap().len(), 15);
    // Nothing unresolved is reported as a change.
    assert!(
        !v["changed"].to_string().contains("unresolved"),
        "{}",
        v["changed"]
    );
}

#[test]
fn bad_sources_and_recipes_are_one_line_errors() {
    let dir = std::env::temp_dir().join(format!("sglsup-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let junk = dir.join("sglang-9.9.9-py3-none-any.whl");
    std::fs::write(&junk, "not a zip").unwrap();
    let no_launch = dir.join("no-launch.sh");
    std::fs::write(&no_launch, "#!/bin/bash\necho hello\n").unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "--sglang".into(),
                junk.to_string_lossy().into(),
                "--".into(),
                "--tp".into(),
                "2".into(),
            ],
            "not a readable wheel",
        ),
        (
            vec![
                "--sglang".into(),
                "/nonexistent/bin/python3".into(),
                "--".into(),
                "--tp".into(),
                "2".into(),
            ],
            "cannot run it",
        ),
        (
            vec![
                "--sglang".into(),
                "python3".into(),
                "--".into(),
                "--tp".into(),
                "2".into(),
            ],
            "cannot import SGLang",
        ),
        (
            vec![
                "--sglang".into(),
                dir.to_string_lossy().into(),
                "--".into(),
                "--tp".into(),
                "2".into(),
            ],
            "neither a virtual environment",
        ),
        (
            vec![
                "--sglang".into(),
                wheel("0.5.20"),
                no_launch.to_string_lossy().into(),
            ],
            "no SGLang launch in the recipe",
        ),
    ];
    for (args, want) in cases {
        let mut a = vec!["audit".to_string()];
        a.extend(args);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let out = Command::new(supervisor_bin())
            .arg("flags")
            .args(&a)
            .env("RUST_LOG", "off")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{a:?}: {err}");
        assert!(err.contains(want), "{a:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{a:?}: one line: {err}");
        assert!(
            !err.contains("Traceback") && !err.contains("panicked"),
            "{err}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Import mode on a venv where SGLang 0.5.23 really imports (torch and all): in-process through
/// the embedded interpreter (the venv is Python 3.11 like it) and through a subprocess; both must
/// equal the static read of the same wheel and the real parser dump.
#[test]
fn import_mode_on_a_real_sglang_install_equals_static_mode_and_the_dump() {
    let py = venv_python();
    let out = flags(&["dump", "--sglang", &py, "--raw"]).expect_success("flags dump --raw");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("embedded Python 3.11"), "in-process: {err}");
    let imported = json_of(&out);
    assert_eq!(imported["method"], "import");
    assert_eq!(imported["sglang_version"], "0.5.23");
    let stat = static_dump(&wheel("0.5.23"));
    assert_eq!(
        shape(imported["actions"].as_array().unwrap()),
        shape(stat["actions"].as_array().unwrap())
    );
    assert_eq!(
        shape(imported["actions"].as_array().unwrap()),
        shape(dump_fixture("0.5.23")["actions"].as_array().unwrap())
    );
    assert_eq!(imported["env"], stat["env"]);
    // Forced into a subprocess (what `run`'s pre-flight does with an interpreter as SOURCE).
    let out = Command::new(supervisor_bin())
        .args(["flags", "dump", "--raw", "--subprocess", "--sglang", &py])
        .env("RUST_LOG", "info")
        .output()
        .unwrap()
        .expect_success("flags dump --subprocess");
    assert!(String::from_utf8_lossy(&out.stderr).contains("subprocess of"));
    assert_eq!(json_of(&out)["actions"], imported["actions"]);
    // Timings of the split: interpreter start, import, parser build.
    let t = &imported["timings"];
    assert!(
        t["import_s"].as_f64().unwrap() > 0.0 && t["parser_s"].as_f64().unwrap() > 0.0,
        "{t}"
    );
}

/// `run`'s default pre-flight: a static read of the SGLang the launch's interpreter would import.
#[test]
fn run_preflight_reads_the_launch_interpreters_sglang_by_default() {
    let py = venv_python();
    let dir = std::env::temp_dir().join(format!("sglsup-pre-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ev = dir.join("events.jsonl");
    let t = std::time::Instant::now();
    let out = Command::new(supervisor_bin())
        .args(["run", "--metrics-addr", "none", "--no-tee", "--events"])
        .arg(&ev)
        .args([
            "--",
            &py,
            "-m",
            "sglang.launch_server",
            "--model-path",
            "m",
            "--cuda-graph-max-bs",
            "8",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(126), "{err}");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(5),
        "seconds, not minutes: {:?}",
        t.elapsed()
    );
    assert!(err.contains("ambiguous") && err.contains("0.5.23"), "{err}");
    let events = std::fs::read_to_string(&ev).unwrap();
    let first: Value = serde_json::from_str(events.lines().next().unwrap()).unwrap();
    assert_eq!(first["event"], "preflight");
    assert_eq!(first["rejected"], true);
    assert_eq!(first["flags"][0]["status"], "ambiguous");
    assert!(!events.contains("\"spawned\""), "nothing was launched");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn dump_describes_each_deprecation_as_the_contract_says() {
    let out = flags(&["dump", "--sglang", &wheel("0.5.19")]).expect_success("flags dump");
    let v = json_of(&out);
    let opt = |flag: &str| {
        v["options"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| {
                o["option_strings"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|s| s == flag)
            })
            .unwrap()
            .clone()
    };
    let bs = &opt("--cuda-graph-max-bs")["deprecated"];
    assert_eq!(bs["kind"], "action_class");
    assert_eq!(bs["replacement"], "--cuda-graph-max-bs-decode");
    assert_eq!(bs["maps_to_dest"], "cuda_graph_max_bs_decode");
    let fusion = &opt("--enable-flashinfer-allreduce-fusion")["deprecated"];
    assert_eq!(fusion["kind"], "help_text");
    assert_eq!(
        fusion["replacement"],
        "--flashinfer-allreduce-fusion-backend=auto"
    );
    let pcg = &opt("--disable-piecewise-cuda-graph")["deprecated"];
    assert_eq!(
        (pcg["maps_to_dest"].as_str(), pcg["const"].as_str()),
        (Some("cuda_graph_backend_prefill"), Some("disabled"))
    );
    assert!(opt("--tp-size")["deprecated"].is_null());
    assert_eq!(
        opt("--tp-size")["aliases"],
        serde_json::json!(["--tensor-parallel-size"])
    );
}

#[test]
fn parser_registries_are_read_statically_so_choices_are_checked() {
    // --reasoning-parser / --tool-call-parser choices come from registries (a dict's keys, or a
    // helper function from 0.5.23 on): static mode reads them, so a typo is caught without torch.
    for v in VERSIONS {
        let out = flags(&[
            "audit",
            "--sglang",
            &wheel(v),
            "--format",
            "json",
            "--",
            "--reasoning-parser",
            "qwen3",
            "--tool-call-parser",
            "qwen3-coder-typo",
        ]);
        assert_eq!(out.status.code(), Some(2), "{v}");
        let j = json_of(&out);
        assert_eq!(j["flags"][0]["status"], "ok", "{v}");
        assert_eq!(j["flags"][1]["status"], "invalid_choice", "{v}");
        assert!(
            j["flags"][1]["message"]
                .as_str()
                .unwrap()
                .contains("'qwen3_coder'"),
            "{v}: {}",
            j["flags"][1]
        );
    }
}

/// What Python's own argparse decides on SGLang `v`'s real parser, per argv
/// (tests/oracle/argparse_oracle.py): 0.5.23 imports in the venv; 0.5.19 and 0.5.20 are their
/// unpacked wheels on the same venv with the packages their import needs (fetch-sglang.sh).
fn argparse_oracle(v: &str, argvs: &[Vec<String>]) -> Vec<Value> {
    let mut cmd = Command::new(venv_python());
    cmd.arg(workspace().join("tests/oracle/argparse_oracle.py"))
        .arg("torchvision");
    if v != "0.5.23" {
        let parsers = std::env::var_os("SGLANG_PARSERS_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace().join("target/sglang-parsers"));
        assert!(
            parsers.join(".complete").exists(),
            "{}: run scripts/fetch-sglang.sh",
            parsers.display()
        );
        cmd.env(
            "PYTHONPATH",
            format!(
                "{}:{}",
                parsers.join(v).display(),
                parsers.join("deps").display()
            ),
        );
    }
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(serde_json::to_string(argvs).unwrap().as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let v_out = json_of(&out);
    assert_eq!(
        v_out["sglang_version"], v,
        "the oracle imported the wrong SGLang"
    );
    v_out["results"].as_array().unwrap().clone()
}

/// Our verdict on one launch (`flags audit -- ARGS` against the real parser's dump) next to
/// argparse's: both fail with the same message, or both parse; `--help` is a failed launch.
fn assert_same_as_argparse(v: &str, schema: &str, argv: &[String], truth: &Value) {
    let mut a = vec!["audit", "--sglang", schema, "--format", "json", "--"];
    a.extend(argv.iter().map(String::as_str));
    let out = flags(&a);
    let ours = json_of(&out);
    let launch = &ours["launches"][0];
    let case = format!("{v} {argv:?}: argparse {truth}, ours {launch}");
    if truth["help"] == true {
        assert_eq!(out.status.code(), Some(2), "{case}");
        assert!(
            launch["flags"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["status"] == "help"),
            "{case}"
        );
    } else if truth["exit"] == 0 {
        assert!(matches!(out.status.code(), Some(0 | 1)), "{case}");
        assert!(launch["error"].is_null(), "{case}");
    } else {
        assert_eq!(out.status.code(), Some(2), "{case}");
        assert_eq!(launch["error"], truth["error"], "{case}");
    }
}

#[test]
fn every_argparse_case_is_decided_as_the_real_parser_decides_it() {
    let cases: &[&[&str]] = &[
        &["--tp", "8"],
        &["--trust-remote-code=1"],
        &["--trust-remote-code="],
        &["--trust-remote-code", "yes"],
        &["-tp", "8"],
        &["-tp=8"],
        &["--tp", "8", "extra"],
        &["--nope", "x", "--tp", "2", "y"],
        &["--enable-expert-distribution-metrics"],
        &[
            "--enable-expert-distribution-metrics",
            "--cuda-graph-max-bs",
            "8",
        ],
        &["--help"],
        &["--hel"],
        &["-h"],
        &["-hx"],
        &["--nope", "--help"],
        &["--help", "--cuda-graph-max-bs", "8"],
        &["--tp", "8x", "--help"],
        &["--tp", "8x"],
        &["--tp", "8_0"],
        &["--tp", " 8 "],
        &["--tp", "+8"],
        &["--tp", "-1"],
        &["--tp", "8.0"],
        &["--port="],
        &["--mem-fraction-static", "0.8x"],
        &["--mem-fraction-static", "inf"],
        &["--mem-fraction-static", "1e-1"],
        &["--mem-fraction-static", ".5"],
        &["--mem-fraction-static", "1_0.5"],
        &["--mem-fraction-static", "-.5"],
        &["--log-requests-level", "5"],
        &["--log-requests-level", "01"],
        &["--attention-backend", "nope"],
        &["--tp"],
        &["--tp", "--port", "1"],
        &["--dp", "2", "-1"],
        &["-"],
        &["-x y"],
        &["--api-key", "a b"],
        &["--cuda-graph-max-bs", "8"],
        &["--cuda-graph-max-bs=8"],
        &["--enable-flashinfer-allreduce-fusion"],
        &["--stream-output"],
        &["--disable-cuda-graph", "--tp", "2"],
    ];
    let argvs: Vec<Vec<String>> = cases
        .iter()
        .map(|c| {
            ["--model-path", "m"]
                .iter()
                .chain(c.iter())
                .map(|s| s.to_string())
                .collect()
        })
        .collect();
    for v in ["0.5.19", "0.5.20", "0.5.23"] {
        let truth = argparse_oracle(v, &argvs);
        let schema = workspace().join(format!("tests/fixtures/flags/sglang-{v}.json"));
        for (argv, t) in argvs.iter().zip(&truth) {
            assert_same_as_argparse(v, schema.to_str().unwrap(), argv, t);
        }
    }
    // The static read of a wheel carries what a retired flag stops the launch with.
    let out = flags(&[
        "audit",
        "--sglang",
        &wheel("0.5.19"),
        "--format",
        "json",
        "--",
        "--enable-expert-distribution-metrics",
    ]);
    let j = json_of(&out);
    assert_eq!(j["flags"][0]["status"], "retired");
    assert_eq!(
        j["launches"][0]["error"],
        argparse_oracle(
            "0.5.19",
            &[vec![
                "--model-path".into(),
                "m".into(),
                "--enable-expert-distribution-metrics".into()
            ]]
        )[0]["error"]
    );
}

/// The recipe shapes the real recipes use: every launch is found, at its line, with its
/// arguments, and each launch's verdict is argparse's on those arguments.
#[test]
fn every_launch_shape_of_the_real_recipes_is_read_and_judged_as_argparse_does() {
    // (fixture, the lines of its launches)
    let shapes: &[(&str, &[u64])] = &[
        ("launch_bash_array.sh", &[15]),
        ("launch_sglang_python_var.sh", &[4]),
        ("launch_prefixes.sh", &[4, 5, 6, 7, 8, 9]),
        ("launch_cmd_string.sh", &[7]),
        ("launch_after_multiline_strings.sh", &[14]),
        ("launch_if_else.sh", &[4, 7]),
    ];
    for v in ["0.5.19", "0.5.20"] {
        let mut argvs = Vec::new();
        let mut ours = Vec::new();
        for (file, lines) in shapes {
            let out = flags(&[
                "audit",
                "--sglang",
                &wheel(v),
                "--format",
                "json",
                &recipe(file),
            ]);
            let j = json_of(&out);
            let launches = j["launches"].as_array().unwrap();
            let got: Vec<u64> = launches
                .iter()
                .map(|l| l["line"].as_u64().unwrap())
                .collect();
            assert_eq!(&got, lines, "{v} {file}");
            let worst = launches.iter().map(|l| l["status"].as_i64().unwrap()).max();
            assert_eq!(
                out.status.code().map(i64::from),
                worst,
                "{v} {file}: the worst launch's"
            );
            for l in launches {
                assert!(
                    !l["flags"].as_array().unwrap().is_empty(),
                    "{v} {file}: read"
                );
                let args: Vec<String> = l["args"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| a.as_str().unwrap().to_string())
                    .collect();
                assert!(
                    args.iter().all(|a| !a.starts_with('$') || a == "$MODEL"),
                    "{v} {file}: {args:?}"
                );
                argvs.push(args);
                ours.push((file.to_string(), l.clone()));
            }
        }
        let truth = argparse_oracle(v, &argvs);
        for ((file, l), t) in ours.iter().zip(&truth) {
            let case = format!("{v} {file} line {}: argparse {t}, ours {l}", l["line"]);
            if t["help"] == true || t["exit"] != 0 {
                assert_eq!(l["status"], 2, "{case}");
            } else {
                assert!(l["status"].as_i64().unwrap() < 2, "{case}");
            }
            if t["help"] != true {
                assert_eq!(l["error"], t["error"], "{case}");
            }
        }
    }
}
