//! Torch-profiler captures through SGLang: `POST /-/profile/start?steps=N` and `/-/profile/stop`
//! (or `--profile-window NAME` around that window) call the server's `/start_profile` and
//! `/stop_profile` (with its key), and the traces it writes — one `*-TP-<rank>.trace.json.gz` per
//! rank, in the directory the supervisor gave it as `SGLANG_TORCH_PROFILER_DIR` — are listed with
//! their sizes in a `profile` event and the report.
//!
//! Success is judged by the trace files, not by the server's answers: on the H200 (SGLang
//! 0.5.14) `/stop_profile` answered HTTP 500 and wrote a 1 MB trace anyway.
use crate::events::{Event, Events};
use serde_json::{json, Value};
use sglang_exporters::metrics::{ProfileCall, WindowPart};
use sglang_probes::http::{post_json, HttpUrl};
use sglang_probes::sync;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Traces are written after `/stop_profile` answers ("This will take some time"): wait for them
/// this long at most, until their sizes hold still for `SETTLE`.
const COLLECT_FOR: Duration = Duration::from_secs(180);
const SETTLE: Duration = Duration::from_secs(2);

/// The environment variable SGLang reads for its trace directory.
pub const DIR_ENV: &str = "SGLANG_TORCH_PROFILER_DIR";

/// The trace directory of a run, and whether the server must be told (None: profiling off).
pub fn trace_dir(args: &crate::cli::RunArgs) -> Option<(PathBuf, bool)> {
    if let Some(d) = std::env::var_os(DIR_ENV).filter(|d| !d.is_empty()) {
        return Some((PathBuf::from(d), false));
    }
    if let Some(d) = &args.profile_dir {
        return Some((d.clone(), true));
    }
    let report = args.report.as_ref().or(args.report_html.as_ref())?;
    let stem = report.file_stem()?.to_string_lossy();
    Some((report.with_file_name(format!("{stem}-profiles")), true))
}

/// The metrics server's `/-/profile/*` routes and `--profile-window`, for this run.
pub fn setup(
    args: &crate::cli::RunArgs,
    dir: Option<&Path>,
    url: &HttpUrl,
    events: &Arc<Events>,
    metrics: &sglang_exporters::metrics::Shared,
) {
    let Some(dir) = dir else {
        if args.profile_window.is_some() {
            tracing::warn!("--profile-window needs a trace directory (--profile-dir or --report): not profiling");
        }
        return;
    };
    let p = Profiler::new(url.clone(), dir.to_path_buf(), events.clone());
    metrics.set_profile_hook(p.hook());
    if let Some(w) = &args.profile_window {
        metrics.add_window_part(ProfileWindow::new(p, w.clone(), args.profile_steps));
    }
}

struct Active {
    name: String,
    steps: Option<u64>,
    started: Instant,
    before: HashMap<PathBuf, u64>,
    start: Value,
}

pub struct Profiler {
    url: HttpUrl,
    pub dir: PathBuf,
    events: Arc<Events>,
    active: Mutex<Option<Active>>,
}

/// Files in `dir` and their sizes.
fn listing(dir: &Path) -> HashMap<PathBuf, u64> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| {
                let e = e.ok()?;
                let m = e.metadata().ok()?;
                m.is_file().then(|| (e.path(), m.len()))
            })
            .collect()
        })
        .unwrap_or_default()
}

/// The rank a trace's name gives (`...-TP-3.trace.json.gz` → 3).
fn rank_of(name: &str) -> Option<u64> {
    let i = name.rfind("-TP-")? + 4;
    name[i..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

fn answer(r: Result<(u16, Vec<u8>), sglang_probes::http::ProbeError>) -> Value {
    match r {
        Ok((status, body)) => json!({
            "status": status,
            "answer": String::from_utf8_lossy(&body[..body.len().min(2000)]).trim(),
        }),
        Err(e) => json!({"error": e.to_string()}),
    }
}

impl Profiler {
    pub fn new(url: HttpUrl, dir: PathBuf, events: Arc<Events>) -> Arc<Self> {
        Arc::new(Profiler {
            url,
            dir,
            events,
            active: Mutex::new(None),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Active>> {
        sync::lock(&self.active)
    }

    pub async fn start(&self, name: &str, steps: Option<u64>) -> (u16, Value) {
        if self.lock().is_some() {
            return (
                409,
                json!({"error": "a profile is being captured: POST /-/profile/stop first"}),
            );
        }
        if let Err(e) = std::fs::create_dir_all(&self.dir) {
            return (
                500,
                json!({"error": format!("cannot create the trace directory {}: {e}", self.dir.display())}),
            );
        }
        let before = listing(&self.dir);
        let mut body = json!({"output_dir": self.dir, "activities": ["CPU", "GPU"]});
        if let Some(n) = steps {
            body["num_steps"] = n.into();
        }
        let r = post_json(
            &self.url.with_path("/start_profile"),
            &body.to_string(),
            CALL_TIMEOUT,
            64 << 10,
        )
        .await;
        let start = answer(r);
        let ok = start["status"] == 200;
        if ok {
            *self.lock() = Some(Active {
                name: name.to_string(),
                steps,
                started: Instant::now(),
                before,
                start: start.clone(),
            });
        }
        let v = json!({"profiling": ok, "name": name, "steps": steps, "dir": self.dir, "server": start});
        (if ok { 200 } else { 502 }, v)
    }

    /// Stop (the server may have stopped by itself after `steps`), wait for the traces, record.
    pub async fn stop(&self) -> (u16, Value) {
        let Some(a) = self.lock().take() else {
            return (
                409,
                json!({"error": "no profile is being captured: POST /-/profile/start first"}),
            );
        };
        let r = post_json(
            &self.url.with_path("/stop_profile"),
            "{}",
            CALL_TIMEOUT,
            64 << 10,
        )
        .await;
        let stop = answer(r);
        let traces = self.collect(&a.before).await;
        let bytes: u64 = traces.iter().filter_map(|t| t["bytes"].as_u64()).sum();
        let ok = !traces.is_empty();
        let v = json!({
            "name": a.name, "steps": a.steps, "dir": self.dir, "ok": ok,
            "seconds": crate::events::round_ms(a.started.elapsed().as_secs_f64()),
            "start": a.start, "stop": stop, "traces": traces, "total_bytes": bytes,
            "judged_by": "trace files (the server's answers are kept beside them: /stop_profile may fail and still write)",
        });
        self.events.emit(Event::Profile(Event::object(v.clone())));
        if ok {
            tracing::info!(
                "profile {}: {} trace files in {}",
                a.name,
                traces.len(),
                self.dir.display()
            );
        } else {
            tracing::warn!(
                "profile {}: no trace file appeared in {} (server said {stop})",
                a.name,
                self.dir.display()
            );
        }
        (if ok { 200 } else { 502 }, v)
    }

    /// New or grown files in the directory, once their sizes hold still.
    async fn collect(&self, before: &HashMap<PathBuf, u64>) -> Vec<Value> {
        let end = Instant::now() + COLLECT_FOR;
        let mut last: HashMap<PathBuf, u64> = HashMap::new();
        let mut still_since = Instant::now();
        loop {
            let now: HashMap<PathBuf, u64> = listing(&self.dir)
                .into_iter()
                .filter(|(p, n)| before.get(p) != Some(n))
                .collect();
            if now != last {
                last = now;
                still_since = Instant::now();
            } else if !last.is_empty() && still_since.elapsed() >= SETTLE {
                break;
            }
            if Instant::now() >= end {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let mut traces: Vec<Value> = last
            .into_iter()
            .map(|(p, n)| {
                let name = p
                    .file_name()
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_default();
                json!({"file": p, "bytes": n, "rank": rank_of(&name)})
            })
            .collect();
        traces.sort_by(|a, b| a["file"].as_str().cmp(&b["file"].as_str()));
        traces
    }

    /// `POST /-/profile/...` on the metrics server.
    pub fn hook(self: &Arc<Self>) -> sglang_exporters::metrics::ProfileHook {
        let me = self.clone();
        Arc::new(move |call| {
            let me = me.clone();
            Box::pin(async move {
                match call {
                    ProfileCall::Start { steps } => {
                        let unix = SystemTime::now()
                            .duration_since(SystemTime::UNIX_EPOCH)
                            .map(|d| d.as_secs())
                            .unwrap_or_default();
                        me.start(&format!("profile-{unix}"), steps).await
                    }
                    ProfileCall::Stop => me.stop().await,
                }
            })
        })
    }
}

/// `--profile-window NAME`: the window of that name is profiled. Start and stop run in the
/// background (the stop after the start has answered); the `profile` event follows once the
/// traces are written.
pub struct ProfileWindow {
    pub profiler: Arc<Profiler>,
    pub name: String,
    pub steps: Option<u64>,
    starting: Mutex<Option<tokio::task::JoinHandle<(u16, Value)>>>,
}

impl ProfileWindow {
    pub fn new(profiler: Arc<Profiler>, name: String, steps: Option<u64>) -> Arc<Self> {
        Arc::new(ProfileWindow {
            profiler,
            name,
            steps,
            starting: Mutex::new(None),
        })
    }
}

impl WindowPart for ProfileWindow {
    fn start(&self, name: &str) {
        if name != self.name || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let (p, name, steps) = (self.profiler.clone(), name.to_string(), self.steps);
        let task = tokio::spawn(async move { p.start(&name, steps).await });
        *sync::lock(&self.starting) = Some(task);
    }

    fn stop(&self) -> Option<(String, &'static str, Value)> {
        let started = sync::lock(&self.starting).take()?;
        let p = self.profiler.clone();
        tokio::spawn(async move {
            if let Ok((200, _)) = started.await {
                p.stop().await;
            }
        });
        Some((
            self.name.clone(),
            "profile",
            json!({"stopping": true, "dir": self.profiler.dir, "note": "the traces follow in a `profile` event"}),
        ))
    }
}
