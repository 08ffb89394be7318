//! The `flags` commands: the audit, diff and dump of SGLang's launch flags (python crate), with
//! their output formats and exit statuses.
use crate::child::{self, ExitStatus, SpawnSpec};
use crate::cli::{
    CompareFormat, FlagsAuditArgs, FlagsCommand, FlagsDiffArgs, FlagsDumpArgs, PythonPlacement,
};
use crate::redact::{is_secret_name, REDACTED};
use anyhow::{Context, Result};
use serde_json::{json, Value};
use sglang_python::audit::{audit, audit_env, exit_status, EnvVerdict, Verdict};
use sglang_python::schema::{Schema, Source, FLAGS_PY};
use std::io::Read;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub fn command(cmd: &FlagsCommand) -> Result<i32> {
    match cmd {
        FlagsCommand::Audit(a) => audit_command(a),
        FlagsCommand::Diff(a) => diff_command(a),
        FlagsCommand::Dump(a) => dump_command(a),
    }
}

/// Where the flags module may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// In the embedded interpreter when it can serve the source, else in a subprocess.
    PreferEmbedded,
    /// Always in a subprocess: `run`'s pre-flight must not leave torch and SGLang loaded in the
    /// supervisor for the hours of the benchmark it watches.
    Subprocess,
}

impl From<&PythonPlacement> for Placement {
    fn from(p: &PythonPlacement) -> Self {
        if p.subprocess {
            Placement::Subprocess
        } else {
            Placement::PreferEmbedded
        }
    }
}

/// A schema from any SOURCE: a saved `.json`; a `.whl` or source tree read statically; or a
/// Python interpreter (or venv) whose SGLang is imported, so that its site-packages count.
pub fn load(source: &str, placement: Placement) -> Result<Schema> {
    Ok(load_raw(source, placement)?.0)
}

/// [`load`], with the JSON the schema was read from (the module's output, or the saved file).
pub fn load_raw(source: &str, placement: Placement) -> Result<(Schema, Value)> {
    let t = std::time::Instant::now();
    // What starting the target interpreter costs (a trivial run of it): the first of the split.
    let mut started = None;
    let (text, how) = match Source::parse(source)? {
        Source::Json(p) => (
            std::fs::read_to_string(&p).with_context(|| format!("reading the flag schema {p}"))?,
            "saved schema".to_string(),
        ),
        Source::Static(path) => run_module(placement, None, "static", Some(&path))?,
        Source::Interpreter(py) => {
            let probe = std::time::Instant::now();
            let target = probe_interpreter(&py)?;
            started = Some(probe.elapsed());
            run_module(placement, Some((&py, &target)), "import", None)?
        }
    };
    parsed(&text, source, &how, t, started)
}

/// The flags of the SGLang `python` would import, read statically (in a subprocess of it: the
/// same `sys.path`, `PYTHONPATH` included, and nothing imported): what `run`'s pre-flight uses.
pub fn load_installed(python: &str) -> Result<Schema> {
    let t = std::time::Instant::now();
    let out = python_subprocess(python, &["-c", FLAGS_PY, "installed"])?;
    let how = "the package it imports, read statically in a subprocess";
    Ok(parsed(&String::from_utf8_lossy(&out), python, how, t, None)?.0)
}

/// The schema in `text`, with the whole read's timings added to the module's, logged once.
fn parsed(
    text: &str,
    source: &str,
    how: &str,
    t: std::time::Instant,
    started: Option<std::time::Duration>,
) -> Result<(Schema, Value)> {
    let (schema, mut raw) = Schema::parse(text, source)?;
    if let Some(timings) = raw.get_mut("timings").and_then(Value::as_object_mut) {
        let s = |d: std::time::Duration| json!(crate::events::round_ms(d.as_secs_f64()));
        timings.insert("total_s".into(), s(t.elapsed()));
        if let Some(d) = started {
            timings.insert("interpreter_start_s".into(), s(d));
        }
    }
    tracing::info!(
        "SGLang {} flags from {source}: {} options, {how}, {:?}",
        schema.version.as_deref().unwrap_or("?"),
        schema.options.len(),
        t.elapsed()
    );
    Ok((schema, raw))
}

/// What a target interpreter is: its version, stdlib home and import path.
#[cfg_attr(not(feature = "embedded-python"), allow(dead_code))] // read to decide on embedding
struct Interpreter {
    version: [u32; 3],
    base_prefix: String,
    path: Vec<String>,
}

const PROBE_PY: &str = "import sys, json; print(json.dumps([list(sys.version_info[:3]), sys.base_prefix, [p for p in sys.path if p]]))";

fn probe_interpreter(python: &str) -> Result<Interpreter> {
    let out = python_subprocess(python, &["-c", PROBE_PY])?;
    let v: ([u32; 3], String, Vec<String>) = serde_json::from_slice(&out).with_context(|| {
        format!("--sglang {python}: it did not answer like a Python 3 interpreter")
    })?;
    Ok(Interpreter {
        version: v.0,
        base_prefix: v.1,
        path: v.2,
    })
}

/// Run the flags module's `schema(mode, arg)`: embedded where allowed and possible, otherwise in a
/// subprocess of the target interpreter (import) or of `python3` (static). Returns its JSON and
/// how it ran.
fn run_module(
    placement: Placement,
    target: Option<(&str, &Interpreter)>,
    mode: &str,
    arg: Option<&str>,
) -> Result<(String, String)> {
    #[cfg(feature = "embedded-python")]
    if placement == Placement::PreferEmbedded {
        use sglang_python::embedded::{self, EmbedError};
        let mine = embedded::version();
        let dotted = |v: [u32; 3]| format!("{}.{}.{}", v[0], v[1], v[2]);
        let attempt = match target {
            Some((py, t)) if t.version != mine => Err(EmbedError::Unavailable(format!(
                "{py} is Python {}, the embedded interpreter {}",
                dotted(t.version),
                dotted(mine)
            ))),
            Some((_, t)) => embedded::schema(Some(&t.base_prefix), Some(&t.path), mode, arg),
            None => embedded::schema(None, None, mode, arg),
        };
        match attempt {
            Ok((text, init)) => {
                return Ok((
                    text,
                    format!("embedded Python {} (started in {init:?})", dotted(mine)),
                ))
            }
            Err(EmbedError::Failed {
                message,
                clean: true,
            }) => anyhow::bail!(one_line_failure(target.map(|t| t.0), &message)),
            Err(EmbedError::Failed { message, .. }) => {
                tracing::info!("in the embedded interpreter: {message}; trying a subprocess");
            }
            Err(EmbedError::Unavailable(why)) => {
                tracing::info!("{why}: running the flags module in a subprocess instead");
            }
        }
    }
    let _ = placement;
    let python = target.map_or("python3", |t| t.0);
    let mut args = vec!["-c", FLAGS_PY, mode];
    args.extend(arg);
    let out = python_subprocess(python, &args)?;
    Ok((
        String::from_utf8_lossy(&out).into_owned(),
        format!("subprocess of {python}"),
    ))
}

/// The one line a user reads when the module fails: what to do about a Python without SGLang.
fn one_line_failure(python: Option<&str>, msg: &str) -> String {
    match python {
        Some(py) if msg.contains("No module named 'sglang'") || msg.contains("has no sglang") => format!(
            "{py} cannot import SGLang's parser ({msg}): pass the interpreter or venv SGLang is installed in, a .whl, a source tree or a saved schema .json"
        ),
        Some(py) => format!("{py} could not build SGLang's parser: {msg} (install what SGLang's import needs there, or read its wheel or source tree statically)"),
        None => msg.to_string(),
    }
}

/// How long a Python subprocess may run, in ms (0: unbounded). `run` bounds its pre-flight
/// (--preflight-timeout); the `flags` commands wait as long as the import takes.
static PYTHON_TIMEOUT_MS: AtomicU64 = AtomicU64::new(0);

/// Bound every Python subprocess from now on (`run`'s pre-flight).
pub fn bound_python(timeout: Duration) {
    let ms = u64::try_from(timeout.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    PYTHON_TIMEOUT_MS.store(ms, Ordering::Relaxed);
}

/// Run a Python subprocess to its end and return its stdout; a failure is one line from stderr.
fn python_subprocess(python: &str, args: &[&str]) -> Result<Vec<u8>> {
    let mut argv: Vec<std::ffi::OsString> = vec![python.into()];
    argv.extend(args.iter().map(std::ffi::OsString::from));
    let spawned = child::spawn(SpawnSpec {
        argv: &argv,
        // Its own group: past the timeout, whatever it started goes with it.
        new_process_group: true,
        die_with_parent: true,
        stdin: Stdio::null(),
        stdout: Stdio::piped(),
        stderr: Stdio::piped(),
    })
    .with_context(|| format!("--sglang {python}: cannot run it (give a python3 path, a venv, a .whl, a source tree or a saved .json)"))?;
    let read = |fd: Option<std::os::fd::OwnedFd>| -> Vec<u8> {
        let mut out = Vec::new();
        if let Some(fd) = fd {
            let _ = std::fs::File::from(fd).read_to_end(&mut out);
        }
        out
    };
    let (out_fd, err_fd) = (spawned.stdout, spawned.stderr);
    let out_thread = std::thread::spawn(move || read(out_fd));
    let err_thread = std::thread::spawn(move || read(err_fd));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .context("a runtime to wait for the interpreter")?;
    let limit = match PYTHON_TIMEOUT_MS.load(Ordering::Relaxed) {
        0 => Duration::MAX,
        ms => Duration::from_millis(ms),
    };
    let status = match rt.block_on(async { tokio::time::timeout(limit, spawned.exit).await }) {
        Ok(st) => st.ok(),
        Err(_) => {
            let _ = child::send_signal(-spawned.pid, libc::SIGKILL);
            anyhow::bail!(
                "{python} did not finish reading SGLang's flags within {} and was killed (a hung interpreter or import?): raise --preflight-timeout (SGLANG_SUPERVISOR_PREFLIGHT_TIMEOUT), or pass --no-preflight",
                humantime::format_duration(limit)
            );
        }
    };
    let stdout = out_thread.join().unwrap_or_default();
    let stderr = err_thread.join().unwrap_or_default();
    if status != Some(ExitStatus::Code(0)) {
        let stderr = String::from_utf8_lossy(&stderr);
        let last = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no message");
        let target = (args.get(2) != Some(&"static")).then_some(python);
        anyhow::bail!(one_line_failure(
            target,
            &format!(
                "{last} (exit {})",
                status.map_or("?".into(), |s| format!("{s:?}"))
            )
        ));
    }
    Ok(stdout)
}

/// Secret values (`--api-key sk-...`) never reach the output.
pub fn redact(verdicts: &mut [Verdict], env: &mut [EnvVerdict]) {
    for x in verdicts {
        if is_secret_name(&x.flag.trim_start_matches('-').replace('-', "_")) && x.value.is_some() {
            x.value = Some(REDACTED.into());
        }
    }
    for e in env {
        if is_secret_name(&e.name) {
            e.value = REDACTED.into();
        }
    }
}

fn audit_command(a: &FlagsAuditArgs) -> Result<i32> {
    let placement = Placement::from(&a.python);
    let schema = load(&a.sglang, placement)?;
    let baseline = a
        .baseline
        .as_deref()
        .map(|b| load(b, placement))
        .transpose()?;
    let (args, env) = match &a.recipe {
        Some(path) => {
            let text = if path.as_os_str() == "-" {
                let mut t = String::new();
                std::io::stdin()
                    .read_to_string(&mut t)
                    .context("reading the recipe from stdin")?;
                t
            } else {
                std::fs::read_to_string(path)
                    .with_context(|| format!("reading the recipe {}", path.display()))?
            };
            let l = sglang_python::recipe::extract(&text)
                .with_context(|| format!("{}", path.display()))?;
            (l.args, l.env)
        }
        None if !a.args.is_empty() => (a.args.clone(), Vec::new()),
        None => anyhow::bail!("give a recipe file or the launch arguments after `--`"),
    };
    let result = audit(&schema, baseline.as_ref(), &args);
    let mut verdicts = result.verdicts;
    let mut env = audit_env(&schema, baseline.as_ref(), &env);
    redact(&mut verdicts, &mut env);
    let status = exit_status(&verdicts, &env);
    match a.format {
        CompareFormat::Json => {
            let out = json!({"sglang_version": schema.version, "baseline_version": baseline.as_ref().and_then(|b| b.version.clone()),
                             "flags": verdicts, "env": env, "unexpanded": result.unexpanded});
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
            for e in &env {
                let note = e
                    .replacement
                    .as_deref()
                    .map(|r| format!("use {r}"))
                    .unwrap_or_default();
                if md {
                    println!(
                        "| `{}` (env) | {} | {} | {note} |",
                        e.name, e.value, e.status
                    );
                } else {
                    let note = if note.is_empty() {
                        note
                    } else {
                        format!("  ({note})")
                    };
                    println!("{:<15} {}={}{note}", e.status, e.name, e.value);
                }
            }
            for u in &result.unexpanded {
                println!(
                    "{}{u} is expanded only at run time: the flags it carries are not audited",
                    if md { "\n> " } else { "note: " }
                );
            }
            let version = schema.version.as_deref().unwrap_or("?");
            eprintln!(
                "{} flags checked against SGLang {version}: {}",
                verdicts.len(),
                match status {
                    0 => "the launch will parse",
                    1 => "the launch will parse, with deprecated flags or ignored variables",
                    _ => "THE LAUNCH WILL FAIL to parse",
                }
            );
        }
    }
    Ok(status)
}

fn diff_command(a: &FlagsDiffArgs) -> Result<i32> {
    let d = sglang_python::diff::diff(
        &load(&a.from, Placement::from(&a.python))?,
        &load(&a.to, Placement::from(&a.python))?,
    );
    match a.format {
        CompareFormat::Json => println!("{}", serde_json::to_string_pretty(&d)?),
        CompareFormat::Markdown => print!("{}", diff_markdown(&d)),
        CompareFormat::Text => {
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

/// The diff as Markdown: a heading, the added/removed option strings as lists, the deprecations
/// and changes as tables.
fn diff_markdown(d: &Value) -> String {
    use std::fmt::Write;
    let s = |v: &Value| v.as_str().unwrap_or("?").to_string();
    let cell = |v: &Value| format!("`{}`", v.to_string().replace('|', "\\|"));
    let mut out = format!("## SGLang {} → {}\n", s(&d["from"]), s(&d["to"]));
    for (k, title) in [("added", "Added"), ("removed", "Removed")] {
        let items: Vec<&str> = d[k]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let _ = write!(out, "\n### {title} ({})\n\n", items.len());
        for i in items {
            let _ = writeln!(out, "- `{i}`");
        }
    }
    let deprecated = d["deprecated"].as_array().cloned().unwrap_or_default();
    if !deprecated.is_empty() {
        out.push_str("\n### Newly deprecated\n\n| flag | replacement |\n|---|---|\n");
        for x in &deprecated {
            let r = x["replacement"]
                .as_str()
                .map_or("(none)".into(), |r| format!("`{r}`"));
            let _ = writeln!(out, "| `{}` | {r} |", s(&x["flag"]));
        }
    }
    let changed = d["changed"].as_array().cloned().unwrap_or_default();
    if !changed.is_empty() {
        out.push_str("\n### Changed\n\n| flag | field | from | to |\n|---|---|---|---|\n");
        for x in &changed {
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {} |",
                s(&x["flag"]),
                s(&x["field"]),
                cell(&x["from"]),
                cell(&x["to"])
            );
        }
    }
    out
}

/// How a flag is deprecated, as the contract's `deprecated {kind, replacement, maps_to_dest, const}`.
fn deprecation(o: &sglang_python::schema::Opt) -> Value {
    let by_class = o
        .action
        .as_deref()
        .is_some_and(|a| a.starts_with("Deprecated"));
    json!({"kind": if by_class { "action_class" } else { "help_text" }, "action": o.action,
           "replacement": o.replacement, "maps_to_dest": o.dest, "const": o.const_value})
}

fn dump_command(a: &FlagsDumpArgs) -> Result<i32> {
    let (s, raw) = load_raw(&a.sglang, Placement::from(&a.python))?;
    if a.raw {
        println!("{}", serde_json::to_string_pretty(&raw)?);
        return Ok(0);
    }
    let options: Vec<Value> = s
        .options
        .iter()
        .map(|o| {
            json!({"option_strings": o.option_strings, "dest": o.dest, "canonical": o.canonical(),
                   "aliases": o.option_strings.iter().filter(|x| x.as_str() != o.canonical()).collect::<Vec<_>>(),
                   "nargs": o.nargs.as_argparse(), "type": o.kind, "default": o.default, "choices": o.choices, "help": o.help,
                   "deprecated": if o.deprecated { deprecation(o) } else { Value::Null }})
        })
        .collect();
    println!(
        "{}",
        serde_json::to_string_pretty(
            &json!({"sglang_version": s.version, "method": s.method, "env": s.env.as_ref().map(|e| e.iter().map(|v| json!({"name": v.name, "deprecated": v.deprecated, "replacement": v.replacement})).collect::<Vec<_>>()), "options": options})
        )?
    );
    Ok(0)
}
