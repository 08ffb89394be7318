//! The pre-flight audit: the server's flags checked against the SGLang it would import, before
//! anything starts (a refused launch exits 126).
use crate::cli::RunArgs;
use anyhow::Result;
use serde_json::{json, Value};
use std::ffi::OsString;
use std::time::Instant;

/// The launch arguments inside COMMAND (after `-m sglang.launch_server` or `sglang serve`).
/// The interpreter and the arguments of an SGLang launch (`PY -m sglang.launch_server ARGS`, or
/// `sglang serve ARGS` whose script names its interpreter on the `#!` line).
fn launch_args(command: &[OsString]) -> Option<(String, Vec<String>)> {
    let argv: Vec<String> = command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let at = argv.windows(2).position(|w| {
        (w[0] == "-m" && w[1] == "sglang.launch_server")
            || (w[0].ends_with("sglang") && w[1] == "serve")
    })?;
    let python = if argv[at] == "-m" {
        argv[..at]
            .iter()
            .rev()
            .find(|a| !a.starts_with('-'))?
            .clone()
    } else {
        script_interpreter(&argv[at]).unwrap_or_else(|| "python3".into())
    };
    Some((python, argv[at + 2..].to_vec()))
}

/// The interpreter a console script runs under, from its `#!` line.
fn script_interpreter(script: &str) -> Option<String> {
    let path = if script.contains('/') {
        std::path::PathBuf::from(script)
    } else {
        std::env::split_paths(&std::env::var_os("PATH")?)
            .map(|d| d.join(script))
            .find(|p| p.is_file())?
    };
    let mut head = [0u8; 256];
    let n = std::io::Read::read(&mut std::fs::File::open(path).ok()?, &mut head).ok()?;
    let line = std::str::from_utf8(&head[..n]).ok()?.lines().next()?;
    let words: Vec<&str> = line.strip_prefix("#!")?.split_whitespace().collect();
    match words.as_slice() {
        [env, py, ..] if env.ends_with("/env") => Some(py.to_string()),
        [py, ..] => Some(py.to_string()),
        [] => None,
    }
}

/// What the pre-flight found: whether to refuse the launch (exit 126), and its `preflight` event.
pub struct Preflight {
    pub reject: bool,
    pub event: Value,
}

/// Audit the flags before anything starts.
/// By default the flags come from a static read of the SGLang package the launch's interpreter
/// would import (a fraction of a second, nothing imported); `--flags-schema` names another
/// source. Runs before the async runtime exists: it waits on a Python subprocess.
pub fn preflight(args: &RunArgs) -> Result<Option<Preflight>> {
    if args.no_preflight {
        return Ok(None);
    }
    let Some((python, launch)) = launch_args(&args.command) else {
        if args.flags_schema.is_some() {
            tracing::warn!("pre-flight: COMMAND is not `python3 -m sglang.launch_server ...` or `sglang serve ...`; skipped");
        }
        return Ok(None);
    };
    let t = Instant::now();
    let schema = match &args.flags_schema {
        // Asked for by name: a source that cannot be read is an error.
        Some(src) => crate::flags::load(src, crate::flags::Placement::Subprocess)?,
        // Our own default: when it cannot read the flags, the launch itself decides.
        None => match crate::flags::load_installed(&python) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("pre-flight skipped: {e:#}");
                return Ok(None);
            }
        },
    };
    let audit = sglang_python::audit::audit(&schema, None, &launch);
    let env: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| k.starts_with("SGLANG_") && !k.starts_with("SGLANG_SUPERVISOR_"))
        .collect();
    let status = sglang_python::audit::exit_status(&audit.verdicts, &[]);
    // What is worth saying, once: logged here and recorded in the event.
    let mut flags: Vec<_> = audit
        .verdicts
        .iter()
        .filter(|v| v.status != sglang_python::audit::Status::Ok)
        .cloned()
        .collect();
    let mut env: Vec<_> = sglang_python::audit::audit_env(&schema, None, &env)
        .into_iter()
        .filter(|e| e.status != "ok")
        .collect();
    crate::flags::redact(&mut flags, &mut env);
    let version = schema.version.as_deref().unwrap_or("?");
    for v in &flags {
        let (what, note) = (v.status.as_str(), v.note());
        if v.status.fails() {
            tracing::error!("pre-flight: {what} {} ({note})", v.flag);
        } else {
            tracing::warn!("pre-flight: {what} {} ({note})", v.flag);
        }
    }
    for e in env.iter().filter(|e| e.status != "unchecked") {
        let to = e
            .replacement
            .as_deref()
            .map(|r| format!(" (use {r})"))
            .unwrap_or_default();
        tracing::warn!(
            "pre-flight: environment variable {} is {} in SGLang {version}{to}: SGLang ignores it",
            e.name,
            e.status
        );
    }
    for u in &audit.unexpanded {
        tracing::warn!(
            "pre-flight: {u} reached the command unexpanded; its flags were not audited"
        );
    }
    tracing::info!(
        "pre-flight: {} flags checked against SGLang {version} in {:?}",
        audit.verdicts.len(),
        t.elapsed()
    );
    let event = json!({
        "sglang_version": schema.version, "method": schema.method, "checked": audit.verdicts.len(),
        "flags": flags, "env": env, "unexpanded": audit.unexpanded, "rejected": status == 2,
        "duration_s": crate::events::round_ms(t.elapsed().as_secs_f64()),
    });
    Ok(Some(Preflight {
        reject: status == 2,
        event,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_launch_interpreter_is_found_for_both_launch_forms() {
        let os = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            launch_args(&os(&[
                "/opt/venv/bin/python3",
                "-u",
                "-m",
                "sglang.launch_server",
                "--tp",
                "2"
            ])),
            Some((
                "/opt/venv/bin/python3".to_string(),
                vec!["--tp".to_string(), "2".to_string()]
            ))
        );
        let dir = std::env::temp_dir().join(format!("sglsup-shebang-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (shebang, want) in [
            ("#!/opt/venv/bin/python3.12\n", "/opt/venv/bin/python3.12"),
            ("#!/usr/bin/env python3\n", "python3"),
        ] {
            let script = dir.join("sglang");
            std::fs::write(&script, format!("{shebang}import sys\n")).unwrap();
            let got = launch_args(&os(&[
                script.to_str().unwrap(),
                "serve",
                "--model-path",
                "m",
            ]));
            assert_eq!(got.map(|g| g.0), Some(want.to_string()), "{shebang}");
        }
        let _ = std::fs::remove_dir_all(dir);
        assert_eq!(launch_args(&os(&["sglang-replay", "--port", "1"])), None);
    }
}
