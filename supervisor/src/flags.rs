//! The `flags` commands: the audit, diff and dump of SGLang's launch flags (python crate), with
//! their output formats and exit statuses.
use crate::child::{self, ExitStatus, SpawnSpec};
use crate::cli::{CompareFormat, FlagsAuditArgs, FlagsCommand, FlagsDiffArgs, FlagsDumpArgs};
use crate::redact::{is_secret_name, REDACTED};
use anyhow::{Context, Result};
use serde_json::{json, Value};
use sglang_python::audit::{audit, exit_status, Verdict};
use sglang_python::schema::{Schema, Source, INTROSPECT_PY};
use std::io::Read;
use std::process::Stdio;

pub fn command(cmd: &FlagsCommand) -> Result<i32> {
    match cmd {
        FlagsCommand::Audit(a) => audit_command(a),
        FlagsCommand::Diff(a) => diff_command(a),
        FlagsCommand::Dump(a) => dump_command(a),
    }
}

/// A schema from any SOURCE: a saved `.json`, or a Python interpreter whose SGLang is imported
/// (the introspection module runs in a subprocess of that interpreter, so its site-packages and
/// its Python version are the ones that count).
pub fn load(source: &str) -> Result<Schema> {
    match Source::parse(source)? {
        Source::Json(p) => Ok(Schema::load(&p)?),
        Source::Interpreter(py) => import_with(&py),
    }
}

fn import_with(python: &str) -> Result<Schema> {
    let t = std::time::Instant::now();
    let argv: Vec<std::ffi::OsString> = vec![python.into(), "-c".into(), INTROSPECT_PY.into()];
    let spawned = child::spawn(SpawnSpec {
        argv: &argv,
        new_process_group: false,
        die_with_parent: true,
        stdin: Stdio::null(),
        stdout: Stdio::piped(),
        stderr: Stdio::piped(),
    })
    .with_context(|| format!("--sglang {python}"))?;
    let read = |fd: Option<std::os::fd::OwnedFd>| -> Vec<u8> {
        let mut out = Vec::new();
        if let Some(fd) = fd {
            let _ = std::fs::File::from(fd).read_to_end(&mut out);
        }
        out
    };
    let err_thread = spawned
        .stderr
        .map(|fd| std::thread::spawn(move || read(Some(fd))));
    let stdout = read(spawned.stdout);
    let stderr = err_thread.and_then(|t| t.join().ok()).unwrap_or_default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .context("a runtime to wait for the interpreter")?;
    let status = rt.block_on(spawned.exit).ok();
    if status != Some(ExitStatus::Code(0)) {
        let tail: Vec<String> = String::from_utf8_lossy(&stderr)
            .lines()
            .rev()
            .take(3)
            .map(String::from)
            .collect();
        let tail: Vec<String> = tail.into_iter().rev().collect();
        anyhow::bail!(
            "{python} could not import SGLang's parser ({status:?}): {} (is SGLang installed for this interpreter? pass its venv's python3, or a saved schema .json)",
            tail.join(" | ")
        );
    }
    let schema = Schema::from_introspection(&stdout, python)?;
    tracing::info!(
        "imported SGLang {} with {python} in {:?}",
        schema.version.as_deref().unwrap_or("?"),
        t.elapsed()
    );
    Ok(schema)
}

/// Secret values (`--api-key sk-...`) never reach the output.
fn redact(mut v: Vec<Verdict>) -> Vec<Verdict> {
    for x in &mut v {
        if is_secret_name(&x.flag.trim_start_matches('-').replace('-', "_")) && x.value.is_some() {
            x.value = Some(REDACTED.into());
        }
    }
    v
}

fn audit_command(a: &FlagsAuditArgs) -> Result<i32> {
    let schema = load(&a.sglang)?;
    let baseline = a.baseline.as_deref().map(load).transpose()?;
    let (args, env) = match &a.recipe {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading the recipe {}", path.display()))?;
            let l = sglang_python::recipe::extract(&text)
                .with_context(|| format!("{}", path.display()))?;
            (l.args, l.env)
        }
        None if !a.args.is_empty() => (a.args.clone(), Vec::new()),
        None => anyhow::bail!("give a recipe file or the launch arguments after `--`"),
    };
    let verdicts = redact(audit(&schema, baseline.as_ref(), &args));
    let env: Vec<Value> = env
        .iter()
        .map(|(k, v)| json!({"name": k, "value": if is_secret_name(k) { REDACTED } else { v.as_str() }}))
        .collect();
    let status = exit_status(&verdicts);
    match a.format {
        CompareFormat::Json => {
            let out = json!({"sglang_version": schema.version, "baseline_version": baseline.as_ref().and_then(|b| b.version.clone()),
                             "flags": verdicts, "env": env});
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
        f => {
            let md = f == CompareFormat::Markdown;
            if md {
                println!("| flag | value | status | note |\n|---|---|---|---|");
            }
            for v in &verdicts {
                let (note, status) = (v.note(), v.status.as_str());
                let value = v.value.clone().unwrap_or_default();
                if md {
                    println!("| `{}` | {} | {} | {} |", v.flag, value, status, note);
                } else {
                    println!(
                        "{:<15} {} {}{}",
                        status,
                        v.flag,
                        value,
                        if note.is_empty() {
                            String::new()
                        } else {
                            format!("  ({note})")
                        }
                    );
                }
            }
            let version = schema.version.as_deref().unwrap_or("?");
            eprintln!(
                "{} flags checked against SGLang {version}: {}",
                verdicts.len(),
                match status {
                    0 => "the launch will parse",
                    1 => "the launch will parse, with deprecated flags",
                    _ => "THE LAUNCH WILL FAIL to parse",
                }
            );
        }
    }
    Ok(status)
}

fn diff_command(a: &FlagsDiffArgs) -> Result<i32> {
    let d = sglang_python::diff::diff(&load(&a.from)?, &load(&a.to)?);
    match a.format {
        CompareFormat::Json => println!("{}", serde_json::to_string_pretty(&d)?),
        _ => {
            println!(
                "SGLang {} → {}",
                d["from"].as_str().unwrap_or("?"),
                d["to"].as_str().unwrap_or("?")
            );
            for (k, title) in [("added", "added"), ("removed", "removed")] {
                let items: Vec<&str> = d[k]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                println!("{title} ({}): {}", items.len(), items.join(" "));
            }
            for x in d["deprecated"].as_array().into_iter().flatten() {
                println!(
                    "newly deprecated: {} → {}",
                    x["flag"].as_str().unwrap_or(""),
                    x["replacement"].as_str().unwrap_or("(no replacement)")
                );
            }
            for x in d["changed"].as_array().into_iter().flatten() {
                println!(
                    "changed: {} {}: {} → {}",
                    x["flag"].as_str().unwrap_or(""),
                    x["field"].as_str().unwrap_or(""),
                    x["from"],
                    x["to"]
                );
            }
        }
    }
    Ok(0)
}

fn dump_command(a: &FlagsDumpArgs) -> Result<i32> {
    let s = load(&a.sglang)?;
    let options: Vec<Value> = s
        .options
        .iter()
        .map(|o| {
            json!({"option_strings": o.option_strings, "dest": o.dest, "canonical": o.canonical(),
                   "aliases": o.option_strings.iter().filter(|x| x.as_str() != o.canonical()).collect::<Vec<_>>(),
                   "nargs": format!("{:?}", o.nargs), "type": o.kind, "default": o.default, "choices": o.choices, "help": o.help,
                   "deprecated": if o.deprecated { json!({"replacement": o.replacement}) } else { Value::Null }})
        })
        .collect();
    println!(
        "{}",
        serde_json::to_string_pretty(
            &json!({"sglang_version": s.version, "method": if a.sglang.ends_with(".json") { "saved schema" } else { "import" }, "options": options})
        )?
    );
    Ok(0)
}
