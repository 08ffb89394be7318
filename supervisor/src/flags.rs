//! The `flags` commands: the audit, diff and dump of SGLang's launch flags (python crate), with
//! their output formats and exit statuses.
use crate::child::{self, ExitStatus, SpawnSpec};
use crate::cli::{
    CompareFormat, FlagsAuditArgs, FlagsCommand, FlagsDiffArgs, FlagsDumpArgs, PythonPlacement,
};
use crate::redact::{is_secret_name, REDACTED};
use anyhow::{Context, Result};
use serde_json::{json, Value};
use sglang_python::audit::{audit, audit_env, exit_status, EnvVerdict, Status, Verdict};
use sglang_python::recipe::Launch;
use sglang_python::schema::{Schema, Source, FLAGS_PY};
use std::fmt::Write as _;
use std::io::Read;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
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

/// The process group of the Python subprocess running now (0: none), and whether the run was
/// stopped: a stop during the pre-flight takes the whole group, what the import started with it.
static PYTHON_GROUP: AtomicI32 = AtomicI32::new(0);
static PYTHON_STOPPED: AtomicBool = AtomicBool::new(false);

/// Kill the running Python subprocess's group, and any started from now on (a stopped run).
pub fn kill_python() {
    PYTHON_STOPPED.store(true, Ordering::SeqCst);
    let group = PYTHON_GROUP.swap(0, Ordering::SeqCst);
    if group > 0 {
        let _ = child::send_signal(-group, libc::SIGKILL);
    }
}

/// Run a Python subprocess to its end and return its stdout; a failure is one line from stderr.
fn python_subprocess(python: &str, args: &[&str]) -> Result<Vec<u8>> {
    let mut argv: Vec<std::ffi::OsString> = vec![python.into()];
    argv.extend(args.iter().map(std::ffi::OsString::from));
    let spawned = child::spawn(
        SpawnSpec {
            argv: &argv,
            // Its own group: past the timeout, whatever it started goes with it.
            new_process_group: true,
            die_with_parent: true,
            stdin: Stdio::null(),
            stdout: Stdio::piped(),
            stderr: Stdio::piped(),
        },
        &[],
    )
    .map_err(|e| {
        // A program that could not start for want of threads or memory is no wrong path.
        let what = if e.is_resource_limit() {
            ""
        } else {
            " (give a python3 path, a venv, a .whl, a source tree or a saved .json)"
        };
        anyhow::anyhow!("--sglang {python}: cannot run it{what}: {e}")
    })?;
    // Published before the look at PYTHON_STOPPED: a stop either sees the group or is seen here.
    PYTHON_GROUP.store(spawned.pid, Ordering::SeqCst);
    if PYTHON_STOPPED.load(Ordering::SeqCst) {
        let _ = child::send_signal(-spawned.pid, libc::SIGKILL);
    }
    // Its output is read here, not on threads of its own: a thread refused at the limit on
    // threads would leave the interpreter running (and `std::thread::spawn` would panic).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("a runtime to wait for the interpreter")?;
    let limit = match PYTHON_TIMEOUT_MS.load(Ordering::Relaxed) {
        0 => Duration::MAX,
        ms => Duration::from_millis(ms),
    };
    let (out_fd, err_fd, exit) = (spawned.stdout, spawned.stderr, spawned.exit);
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let (waited, all_read) = rt.block_on(async {
        let mut reads = std::pin::pin!(async {
            tokio::join!(
                read_pipe(out_fd, &mut stdout),
                read_pipe(err_fd, &mut stderr)
            )
        });
        let mut exited = std::pin::pin!(tokio::time::timeout(limit, exit));
        let mut all_read = false;
        // Read while waiting for the exit, so a full pipe cannot stall the interpreter.
        let waited = loop {
            tokio::select! {
                w = &mut exited => break w,
                _ = &mut reads, if !all_read => all_read = true,
            }
        };
        // Something it left running may hold its pipes open: what came so far is its answer.
        if waited.is_ok() && !all_read {
            all_read = tokio::time::timeout(PIPE_GRACE, &mut reads).await.is_ok();
        }
        (waited, all_read)
    });
    let _ = PYTHON_GROUP.compare_exchange(spawned.pid, 0, Ordering::SeqCst, Ordering::SeqCst);
    if waited.is_err() || !all_read {
        // Past the timeout, or a leftover still holding the pipes: the group goes.
        let _ = child::send_signal(-spawned.pid, libc::SIGKILL);
    }
    let status = match waited {
        Ok(st) => st.ok(),
        Err(_) => {
            anyhow::bail!(
                "{python} did not finish reading SGLang's flags within {} and was killed (a hung interpreter or import?): raise --preflight-timeout (SGLANG_SUPERVISOR_PREFLIGHT_TIMEOUT), or pass --no-preflight",
                humantime::format_duration(limit)
            );
        }
    };
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

/// Secret values (`--api-key sk-...`) never reach the output; returns them, for the messages
/// that quote them (argparse's error).
pub fn redact(verdicts: &mut [Verdict], env: &mut [EnvVerdict]) -> Vec<String> {
    let mut secrets = Vec::new();
    for x in verdicts {
        if is_secret_name(&x.flag.trim_start_matches('-').replace('-', "_")) && x.value.is_some() {
            if let Some(v) = x.value.replace(REDACTED.into()) {
                x.message = x.message.take().map(|m| m.replace(&v, REDACTED));
                secrets.push(v);
            }
        }
    }
    for e in env {
        if is_secret_name(&e.name) {
            e.value = REDACTED.into();
        }
    }
    secrets.retain(|s| !s.is_empty());
    secrets
}

/// One launch audited: where it runs, its verdicts and variables, and what argparse stops at.
pub struct LaunchAudit {
    pub launch: Launch,
    /// `None` for a launch given on the command line (`-- ARGS`, `run`'s COMMAND).
    pub line: Option<usize>,
    pub verdicts: Vec<Verdict>,
    pub env: Vec<EnvVerdict>,
    pub unexpanded: Vec<String>,
    /// argparse's first error (or `--help`), as it would print it.
    pub error: Option<String>,
    /// 0 parses, 1 deprecated flags or ignored variables, 2 would fail.
    pub status: i32,
}

impl LaunchAudit {
    /// The launch as a command line, secrets redacted.
    pub fn command(&self) -> String {
        let mut argv: Vec<String> = self
            .launch
            .launcher()
            .iter()
            .filter(|w| !w.is_empty())
            .map(|w| w.to_string())
            .collect();
        argv.extend(crate::redact::redact_argv(&self.launch.args));
        argv.iter()
            .map(|w| {
                if w.is_empty() || w.contains(char::is_whitespace) {
                    format!("'{}'", w.replace('\'', "'\\''"))
                } else {
                    w.clone()
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    pub fn to_json(&self) -> Value {
        json!({"line": self.line, "command": self.command(), "args": crate::redact::redact_argv(&self.launch.args),
               "status": self.status, "error": self.error,
               "flags": self.verdicts, "env": self.env, "unexpanded": self.unexpanded})
    }

    fn where_(&self) -> String {
        self.line
            .map_or_else(|| "the launch".to_string(), |l| format!("line {l}"))
    }
}

/// Audit each launch against `schema`; variables environ.py does not define are looked for
/// where the package reads them itself (`os.environ`, `os.getenv`, ...).
pub fn audit_launches(
    schema: &Schema,
    baseline: Option<&Schema>,
    launches: Vec<(Option<usize>, Launch)>,
    placement: Placement,
) -> Result<Vec<LaunchAudit>> {
    let mut out = Vec::new();
    for (line, launch) in launches {
        let result = audit(schema, baseline, &launch.args);
        let mut env = audit_env(schema, baseline, &launch.env);
        direct_reads(schema, &mut env, placement);
        let mut verdicts = result.verdicts;
        let secrets = redact(&mut verdicts, &mut env);
        let error = result.error.map(|mut e| {
            for v in &secrets {
                e = e.replace(v, REDACTED);
            }
            e
        });
        let status = exit_status(&verdicts, &env);
        let a = LaunchAudit {
            launch,
            line,
            verdicts,
            env,
            unexpanded: result.unexpanded,
            error,
            status,
        };
        // Nothing checked and flags hidden in variables: this launch was seen, not read.
        if a.verdicts.is_empty() && !a.unexpanded.is_empty() {
            anyhow::bail!(
                "{}: every flag of the launch is in {}, expanded only at run time: nothing could be audited (audit the expanded command: `flags audit -- ARGS`)",
                a.where_(),
                a.unexpanded.join(" ")
            );
        }
        out.push(a);
    }
    Ok(out)
}

/// Mark the `unknown` variables the package reads itself (outside environ.py) as known.
fn direct_reads(schema: &Schema, env: &mut [EnvVerdict], placement: Placement) {
    let names: Vec<&str> = env
        .iter()
        .filter(|e| matches!(e.status, "unknown" | "removed"))
        .map(|e| e.name.as_str())
        .collect();
    let Some(root) = schema.root.as_deref() else {
        return;
    };
    if names.is_empty() || !std::path::Path::new(root).exists() {
        return;
    }
    let req = json!({"root": root, "names": names}).to_string();
    let found: std::collections::BTreeMap<String, String> =
        match run_module(placement, None, "env_reads", Some(&req))
            .map_err(|e| e.to_string())
            .and_then(|(text, _)| serde_json::from_str(&text).map_err(|e| e.to_string()))
        {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!("looking for the package's own reads of {names:?}: {e}");
                return;
            }
        };
    for e in env.iter_mut() {
        if let Some(file) = found.get(&e.name) {
            e.status = "ok";
            e.replacement = None;
            e.read_by = Some(file.clone());
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
    let launches: Vec<(Option<usize>, Launch)> = match &a.recipe {
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
            sglang_python::recipe::launches(&text)
                .with_context(|| format!("{}", path.display()))?
                .into_iter()
                .map(|l| (Some(l.line), l))
                .collect()
        }
        None if !a.args.is_empty() => vec![(
            None,
            Launch {
                program: "sglang".into(),
                args: a.args.clone(),
                env: Vec::new(),
                line: 0,
            },
        )],
        None => anyhow::bail!("give a recipe file or the launch arguments after `--`"),
    };
    let audits = audit_launches(&schema, baseline.as_ref(), launches, placement)?;
    let status = audits.iter().map(|l| l.status).max().unwrap_or(0);
    let version = schema.version.as_deref().unwrap_or("?");
    match a.format {
        CompareFormat::Json => {
            // `flags`, `env`, `unexpanded`: every launch's together (one launch: its own).
            let all = |f: fn(&LaunchAudit) -> Value| -> Vec<Value> {
                audits
                    .iter()
                    .flat_map(|l| f(l).as_array().cloned().unwrap_or_default())
                    .collect()
            };
            let out = json!({"sglang_version": schema.version, "baseline_version": baseline.as_ref().and_then(|b| b.version.clone()),
                             "status": status,
                             "flags": all(|l| json!(l.verdicts)), "env": all(|l| json!(l.env)), "unexpanded": all(|l| json!(l.unexpanded)),
                             "launches": audits.iter().map(LaunchAudit::to_json).collect::<Vec<_>>()});
            crate::stdout::println(serde_json::to_string_pretty(&out)?)?;
        }
        f => {
            let md = f == CompareFormat::Markdown;
            let several = audits.len() > 1;
            for (k, l) in audits.iter().enumerate() {
                let mut out = String::new();
                if several {
                    let head = format!("{}: {}", l.where_(), l.command());
                    let gap = if k > 0 { "\n" } else { "" };
                    if md {
                        let _ = writeln!(out, "{gap}**{head}**\n");
                    } else {
                        let _ = writeln!(out, "{gap}== {head}");
                    }
                }
                render_launch(&mut out, l, md);
                // Each launch's rows before its summary on stderr, as a terminal shows them.
                crate::stdout::print(out)?;
                eprintln!(
                    "{}{} flags checked against SGLang {version}: {}",
                    if several {
                        format!("{}: ", l.where_())
                    } else {
                        String::new()
                    },
                    l.verdicts.len(),
                    match l.status {
                        0 => "the launch will parse".to_string(),
                        1 => "the launch will parse, with deprecated flags or ignored variables"
                            .to_string(),
                        _ => format!(
                            "THE LAUNCH WILL FAIL to parse ({})",
                            l.error.as_deref().unwrap_or("see above")
                        ),
                    }
                );
            }
        }
    }
    Ok(status)
}

/// One launch's rows, as text or a Markdown table.
fn render_launch(out: &mut String, l: &LaunchAudit, md: bool) {
    if md {
        out.push_str("| flag | value | status | note |\n|---|---|---|---|\n");
    }
    for v in &l.verdicts {
        let (note, status) = (v.note(), v.status.as_str());
        let value = v.value.clone().unwrap_or_default();
        if md {
            let _ = writeln!(out, "| `{}` | {} | {} | {} |", v.flag, value, status, note);
        } else {
            let _ = writeln!(
                out,
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
    for e in &l.env {
        let note = e
            .replacement
            .as_deref()
            .map(|r| format!("use {r}"))
            .or_else(|| e.read_by.as_deref().map(|f| format!("read by {f}")))
            .unwrap_or_default();
        if md {
            let _ = writeln!(
                out,
                "| `{}` (env) | {} | {} | {note} |",
                e.name, e.value, e.status
            );
        } else {
            let note = if note.is_empty() {
                note
            } else {
                format!("  ({note})")
            };
            let _ = writeln!(out, "{:<15} {}={}{note}", e.status, e.name, e.value);
        }
    }
    for u in &l.unexpanded {
        let _ = writeln!(
            out,
            "{}{u} is expanded only at run time: the flags it carries are not audited",
            if md { "\n> " } else { "note: " }
        );
    }
}

fn diff_command(a: &FlagsDiffArgs) -> Result<i32> {
    let d = sglang_python::diff::diff(
        &load(&a.from, Placement::from(&a.python))?,
        &load(&a.to, Placement::from(&a.python))?,
    );
    match a.format {
        CompareFormat::Json => crate::stdout::println(serde_json::to_string_pretty(&d)?)?,
        CompareFormat::Markdown => crate::stdout::print(diff_markdown(&d))?,
        CompareFormat::Text => {
            let mut out = String::new();
            let _ = writeln!(
                out,
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
                let _ = writeln!(out, "{title} ({}): {}", items.len(), items.join(" "));
            }
            for x in d["deprecated"].as_array().into_iter().flatten() {
                let _ = writeln!(
                    out,
                    "newly deprecated: {} → {}",
                    x["flag"].as_str().unwrap_or(""),
                    x["replacement"].as_str().unwrap_or("(no replacement)")
                );
            }
            for x in d["changed"].as_array().into_iter().flatten() {
                let _ = writeln!(
                    out,
                    "changed: {} {}: {} → {}",
                    x["flag"].as_str().unwrap_or(""),
                    x["field"].as_str().unwrap_or(""),
                    x["from"],
                    x["to"]
                );
            }
            crate::stdout::print(out)?;
        }
    }
    Ok(0)
}

/// The diff as Markdown: a heading, the added/removed option strings as lists, the deprecations
/// and changes as tables.
fn diff_markdown(d: &Value) -> String {
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
        crate::stdout::println(serde_json::to_string_pretty(&raw)?)?;
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
    crate::stdout::println(serde_json::to_string_pretty(
        &json!({"sglang_version": s.version, "method": s.method, "env": s.env.as_ref().map(|e| e.iter().map(|v| json!({"name": v.name, "deprecated": v.deprecated, "replacement": v.replacement})).collect::<Vec<_>>()), "options": options}),
    )?)?;
    Ok(0)
}

/// The SGLang launches in `run`'s COMMAND, each with the interpreter whose SGLang it will load:
/// the command itself (`PY -m sglang.launch_server ARGS` or `sglang serve ARGS`, behind any
/// prefix: `numactl …`, `srun …`, `timeout N`, `env A=B`), or the launches of a bash recipe it
/// runs (`bash recipe.sh`, `bash -c "…"`). An unreadable recipe: a warning, and no launches.
pub fn command_launches(command: &[std::ffi::OsString]) -> Vec<(String, Launch)> {
    match launches_in_command(command) {
        Ok(found) => found.into_iter().map(|l| (interpreter_of(&l), l)).collect(),
        Err(sglang_python::recipe::RecipeError::NotFound) => Vec::new(),
        Err(e) => {
            tracing::warn!("pre-flight: the launch in COMMAND's script cannot be read: {e}");
            Vec::new()
        }
    }
}

/// [`command_launches`] without the interpreters, quietly: `NotFound` where COMMAND runs none
/// this reads.
pub fn launches_in_command(
    command: &[std::ffi::OsString],
) -> Result<Vec<Launch>, sglang_python::recipe::RecipeError> {
    use sglang_python::recipe::RecipeError::NotFound;
    let argv: Vec<String> = command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if let Some(l) = sglang_python::recipe::launch_in_argv(&argv) {
        return Ok(vec![l]);
    }
    let shell = argv
        .first()
        .is_some_and(|a| matches!(a.rsplit('/').next(), Some("bash" | "sh" | "dash" | "zsh")));
    if !shell {
        return Err(NotFound);
    }
    let text = match argv.iter().position(|a| a == "-c") {
        Some(i) => argv.get(i + 1).cloned(),
        // Only a regular file: a FIFO (`bash <(…)`, `bash /dev/stdin`) read here would be read
        // up before the shell gets it, or block until its writer ends.
        None => argv[1..]
            .iter()
            .find(|a| !a.starts_with('-'))
            .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file()))
            .and_then(|p| std::fs::read_to_string(p).ok()),
    };
    sglang_python::recipe::launches(&text.ok_or(NotFound)?)
}

/// The interpreter a launch runs: its word (a `$VAR` from our environment), or the `#!` line of
/// the `sglang` script.
fn interpreter_of(l: &Launch) -> String {
    let word = l.program.trim_start_matches("${").trim_end_matches('}');
    let word = match word.strip_prefix('$') {
        Some(var) => std::env::var(var).unwrap_or_else(|_| "python3".into()),
        None => l.program.clone(),
    };
    if word.rsplit('/').next() == Some("sglang") {
        script_interpreter(&word).unwrap_or_else(|| "python3".into())
    } else {
        word
    }
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

/// `run`'s pre-flight: audit every launch in COMMAND before anything starts. Returns whether to
/// refuse the launch (exit 126) and the `preflight` event; `None` when COMMAND launches no SGLang
/// or (by default) its flags cannot be read. By default the flags come from a static read of the
/// SGLang package the launch's interpreter would import (a fraction of a second, nothing
/// imported); `flags_schema` names another source. Runs before the async runtime exists.
pub fn preflight(
    command: &[std::ffi::OsString],
    flags_schema: Option<&str>,
) -> Result<Option<(bool, Value)>> {
    let launches = command_launches(command);
    if launches.is_empty() {
        if flags_schema.is_some() {
            tracing::warn!("pre-flight: COMMAND is not `python3 -m sglang.launch_server ...` or `sglang serve ...`; skipped");
        }
        return Ok(None);
    }
    let t = std::time::Instant::now();
    let own_env: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| k.starts_with("SGLANG_") && !k.starts_with("SGLANG_SUPERVISOR_"))
        .collect();
    let mut audits = Vec::new();
    let mut schemas: Vec<(String, Schema)> = Vec::new();
    for (python, mut launch) in launches {
        let key = flags_schema.unwrap_or(&python).to_string();
        if !schemas.iter().any(|(k, _)| *k == key) {
            let schema = match flags_schema {
                // Asked for by name: a source that cannot be read is an error.
                Some(src) => load(src, Placement::Subprocess)?,
                // Our own default: when it cannot read the flags, the launch itself decides.
                None => match load_installed(&python) {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!("pre-flight skipped for {python}: {e:#}");
                        continue;
                    }
                },
            };
            schemas.push((key.clone(), schema));
        }
        let Some((_, schema)) = schemas.iter().find(|(k, _)| *k == key) else {
            continue;
        };
        // The variables SGLang will see: ours, then the launch's own (`env A=B`, exports).
        let mut env = own_env.clone();
        env.extend(std::mem::take(&mut launch.env));
        launch.env = env;
        let line = (launch.line > 0).then_some(launch.line);
        audits.extend(audit_launches(
            schema,
            None,
            vec![(line, launch)],
            Placement::Subprocess,
        )?);
    }
    let Some((_, schema)) = schemas.first() else {
        return Ok(None);
    };
    let version = schema.version.as_deref().unwrap_or("?");
    for l in &audits {
        let at = l.line.map(|n| format!(" (line {n})")).unwrap_or_default();
        for v in l.verdicts.iter().filter(|v| v.status != Status::Ok) {
            let (what, note) = (v.status.as_str(), v.note());
            if v.status.fails() {
                tracing::error!("pre-flight{at}: {what} {} ({note})", v.flag);
            } else {
                tracing::warn!("pre-flight{at}: {what} {} ({note})", v.flag);
            }
        }
        for e in l
            .env
            .iter()
            .filter(|e| !matches!(e.status, "ok" | "unchecked"))
        {
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
        for u in &l.unexpanded {
            tracing::warn!(
                "pre-flight{at}: {u} reached the command unexpanded; its flags were not audited"
            );
        }
    }
    let checked: usize = audits.iter().map(|l| l.verdicts.len()).sum();
    tracing::info!(
        "pre-flight: {checked} flags of {} launch(es) checked against SGLang {version} in {:?}",
        audits.len(),
        t.elapsed()
    );
    let reject = audits.iter().any(|l| l.status == 2);
    // What is worth saying, once: the event keeps the flags and variables that are not plain ok.
    let notable = |l: &LaunchAudit| -> (Vec<Verdict>, Vec<EnvVerdict>) {
        (
            l.verdicts
                .iter()
                .filter(|v| v.status != Status::Ok)
                .cloned()
                .collect(),
            l.env.iter().filter(|e| e.status != "ok").cloned().collect(),
        )
    };
    let (flags, env): (Vec<_>, Vec<_>) = audits.iter().map(notable).unzip();
    let event = json!({
        "sglang_version": schema.version, "method": schema.method, "checked": checked,
        "flags": flags.concat(), "env": env.concat(),
        "unexpanded": audits.iter().flat_map(|l| l.unexpanded.clone()).collect::<Vec<_>>(),
        "error": audits.iter().find_map(|l| l.error.clone()),
        "launches": audits.iter().map(|l| { let (f, e) = notable(l); json!({"line": l.line, "command": l.command(), "status": l.status, "error": l.error, "flags": f, "env": e, "unexpanded": l.unexpanded}) }).collect::<Vec<_>>(),
        "rejected": reject,
        "duration_s": crate::events::round_ms(t.elapsed().as_secs_f64()),
    });
    Ok(Some((reject, event)))
}

/// How long the interpreter's pipes may stay open after it exited (a process it left behind).
const PIPE_GRACE: Duration = Duration::from_secs(2);

/// Append all a child's pipe gives into `out` until its writers close it (nothing for no pipe, or
/// one that cannot be read); what came stays in `out` if this is dropped before the end.
async fn read_pipe(fd: Option<std::os::fd::OwnedFd>, out: &mut Vec<u8>) {
    use tokio::io::AsyncReadExt;
    let Some(mut pipe) = fd.and_then(|fd| tokio::net::unix::pipe::Receiver::from_owned_fd(fd).ok())
    else {
        return;
    };
    let mut chunk = vec![0; 64 << 10];
    while let Ok(n @ 1..) = pipe.read(&mut chunk).await {
        out.extend_from_slice(&chunk[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    fn found(v: &[&str]) -> Vec<(String, Vec<String>)> {
        command_launches(&os(v))
            .into_iter()
            .map(|(py, l)| (py, l.args))
            .collect()
    }

    #[test]
    fn the_launch_interpreter_is_found_for_every_launch_form() {
        let tp = vec!["--tp".to_string(), "2".to_string()];
        for argv in [
            &[
                "/opt/venv/bin/python3",
                "-u",
                "-m",
                "sglang.launch_server",
                "--tp",
                "2",
            ][..],
            &[
                "numactl",
                "--cpunodebind=0",
                "/opt/venv/bin/python3",
                "-m",
                "sglang.launch_server",
                "--tp",
                "2",
            ],
            &[
                "timeout",
                "3600",
                "/opt/venv/bin/python3",
                "-m",
                "sglang.launch_server",
                "--tp",
                "2",
            ],
            &[
                "srun",
                "--ntasks=1",
                "/opt/venv/bin/python3",
                "-m",
                "sglang.launch_server",
                "--tp",
                "2",
            ],
            &[
                "env",
                "A=B",
                "/opt/venv/bin/python3",
                "-m",
                "sglang.launch_server",
                "--tp",
                "2",
            ],
            &[
                "bash",
                "-c",
                "exec /opt/venv/bin/python3 -m sglang.launch_server --tp 2 2>&1",
            ],
        ] {
            assert_eq!(
                found(argv),
                [("/opt/venv/bin/python3".to_string(), tp.clone())],
                "{argv:?}"
            );
        }
        let dir = std::env::temp_dir().join(format!("sglsup-shebang-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (shebang, want) in [
            ("#!/opt/venv/bin/python3.12\n", "/opt/venv/bin/python3.12"),
            ("#!/usr/bin/env python3\n", "python3"),
        ] {
            let script = dir.join("sglang");
            std::fs::write(&script, format!("{shebang}import sys\n")).unwrap();
            let got = command_launches(&os(&[
                script.to_str().unwrap(),
                "serve",
                "--model-path",
                "m",
            ]));
            assert_eq!(
                got.first().map(|g| g.0.clone()),
                Some(want.to_string()),
                "{shebang}"
            );
        }
        // A recipe run by bash: each of its launches.
        let recipe = dir.join("r.sh");
        std::fs::write(
            &recipe,
            "if [ -n \"$PD\" ]; then\n  python3 -m sglang.launch_server --tp 4\nelse\n  python3 -m sglang.launch_server --tp 8\nfi\n",
        )
        .unwrap();
        let got = command_launches(&os(&["bash", recipe.to_str().unwrap()]));
        assert_eq!(got.iter().map(|(_, l)| l.line).collect::<Vec<_>>(), [2, 4]);
        // A script that is a FIFO (`bash <(…)`) is left to the shell, unread: read here, it
        // would be used up (or block until its writer ends).
        let fifo = dir.join("r.fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let command = os(&["bash", fifo.to_str().unwrap()]);
        std::thread::spawn(move || tx.send(command_launches(&command).len()));
        assert_eq!(rx.recv_timeout(std::time::Duration::from_secs(5)), Ok(0));
        let _ = std::fs::remove_dir_all(dir);
        assert!(found(&["sglang-replay", "--port", "1"]).is_empty());
    }
}
