//! examples/docker: no container engine runs here, so the Dockerfile's build step (the script it
//! RUNs) runs against the Python of the real SGLang wheels, and its entrypoint's options run the
//! real binary in front of the replay server.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)]
mod common;
mod deploy;
use common::ExpectSuccess;
use deploy::{repo, Deployed};
use std::path::PathBuf;
use std::process::Command;

/// The Dockerfile's instructions, continuation lines joined.
fn dockerfile() -> Vec<String> {
    let text = std::fs::read_to_string(repo().join("examples/docker/Dockerfile")).unwrap();
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
        match line.strip_suffix('\\') {
            Some(part) => cur.push_str(part),
            None => {
                cur.push_str(line);
                if !cur.trim().is_empty() {
                    out.push(cur.trim().to_string());
                }
                cur.clear();
            }
        }
    }
    out
}

fn exec_form(instruction: &str) -> Vec<String> {
    let line = dockerfile()
        .into_iter()
        .find(|l| l.starts_with(instruction))
        .unwrap_or_else(|| panic!("no {instruction} in the Dockerfile"));
    serde_json::from_str(line[instruction.len()..].trim()).unwrap()
}

fn venv_python() -> PathBuf {
    let venv = repo().join("target/sglang-venv");
    assert!(
        venv.join(".complete").exists(),
        "{}: no SGLang venv; run scripts/fetch-sglang.sh",
        venv.display()
    );
    venv.join("bin/python3")
}

#[test]
fn the_dockerfiles_build_step_embeds_the_python_it_is_given_and_installs_a_runnable_binary() {
    let run = dockerfile()
        .into_iter()
        .find(|l| l.starts_with("RUN") && l.contains("build.sh"))
        .expect("the Dockerfile builds with examples/docker/build.sh");
    assert!(
        run.contains("/src/examples/docker/build.sh python3"),
        "{run}"
    );
    assert!(
        dockerfile()
            .iter()
            .any(|l| l == "ARG SGLANG_IMAGE=lmsysorg/sglang:v0.5.14-cu130"),
        "the image tag it was written for"
    );
    let prefix = std::env::temp_dir().join(format!("sglsup-docker-{}", std::process::id()));
    let out = Command::new("bash")
        .arg(repo().join("examples/docker/build.sh"))
        .arg(venv_python())
        .env("PREFIX", &prefix)
        .output()
        .unwrap()
        .expect_success("examples/docker/build.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The wheels' Python is Debian's 3.11: the embedded interpreter must be exactly it.
    assert!(
        stdout.contains("in-process (embedded Python 3.11"),
        "{stdout}"
    );
    assert!(stdout.contains("needs GLIBC_2."), "{stdout}");
    let bin = prefix.join("bin/sglang-supervisor");
    let v = Command::new(&bin).arg("--version").output().unwrap();
    assert!(String::from_utf8_lossy(&v.stdout).starts_with("sglang-supervisor "));
    let _ = std::fs::remove_dir_all(&prefix);
}

#[test]
fn the_dockerfiles_entrypoint_serves_metrics_on_every_interface_and_stops_with_143() {
    let entrypoint = exec_form("ENTRYPOINT");
    assert_eq!(
        entrypoint[..2],
        ["sglang-supervisor", "run"],
        "{entrypoint:?}"
    );
    let cmd = exec_form("CMD");
    assert_eq!(
        cmd[..4],
        ["--", "python3", "-m", "sglang.launch_server"],
        "{cmd:?}"
    );
    let mut run = Deployed::start("docker-entrypoint", &entrypoint[2..], &cmd[4..]);
    assert_eq!(run.named_metrics, "0.0.0.0:19400");
    let exposed = dockerfile()
        .into_iter()
        .find(|l| l.starts_with("EXPOSE"))
        .unwrap();
    assert!(
        exposed.split_whitespace().any(|p| p == "19400"),
        "{exposed}"
    );
    assert!(run.metrics.starts_with("0.0.0.0:"), "{}", run.metrics);
    run.wait_event("ready");
    assert!(run.get("/-/ready").contains("200"));
    assert_eq!(run.stop(), Some(143));
}
