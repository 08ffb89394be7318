//! `--events`: one JSON object per line, written and flushed as it happens (a recipe may `tail -f`
//! it, and `wait --events` reads it). Every line has `ts` (RFC 3339 UTC) and `event` first.
//!
//! [`Event`] is the contract (DESIGN.md, `tests/tests/events_contract.rs`): `run` writes it, and
//! `wait` and the report read it back through the same type.
use crate::redact::Secrets;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sglang_probes::sync::lock;
use std::fs::File;
use std::io::Write;
use std::sync::Mutex;
use std::time::{Instant, SystemTime};

/// A startup phase, as SGLang's log reveals it (`snake_case` in the events).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PhaseName {
    InitDistributedBegin,
    InitDistributedEnd,
    LoadWeightsBegin,
    LoadWeightsEnd,
    KvCacheAllocated,
    MemoryPoolEnd,
    CudaGraphBegin,
    CudaGraphEnd,
    MaxTotalNumTokens,
    HttpUp,
    Warmup,
}

/// What a phase measures between its begin and its end (`load_weights_end` - `load_weights_begin`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    InitDistributed,
    LoadWeights,
    MemoryPool,
    CudaGraph,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::InitDistributed => "init_distributed",
            Stage::LoadWeights => "load_weights",
            Stage::MemoryPool => "memory_pool",
            Stage::CudaGraph => "cuda_graph",
        }
    }
}

impl PhaseName {
    pub fn as_str(self) -> &'static str {
        match self {
            PhaseName::InitDistributedBegin => "init_distributed_begin",
            PhaseName::InitDistributedEnd => "init_distributed_end",
            PhaseName::LoadWeightsBegin => "load_weights_begin",
            PhaseName::LoadWeightsEnd => "load_weights_end",
            PhaseName::KvCacheAllocated => "kv_cache_allocated",
            PhaseName::MemoryPoolEnd => "memory_pool_end",
            PhaseName::CudaGraphBegin => "cuda_graph_begin",
            PhaseName::CudaGraphEnd => "cuda_graph_end",
            PhaseName::MaxTotalNumTokens => "max_total_num_tokens",
            PhaseName::HttpUp => "http_up",
            PhaseName::Warmup => "warmup",
        }
    }

    /// The stage this phase opens, if it opens one.
    pub fn begins(self) -> Option<Stage> {
        match self {
            PhaseName::InitDistributedBegin => Some(Stage::InitDistributed),
            PhaseName::LoadWeightsBegin => Some(Stage::LoadWeights),
            PhaseName::CudaGraphBegin => Some(Stage::CudaGraph),
            _ => None,
        }
    }

    /// The stage this phase closes, if it closes one.
    pub fn ends(self) -> Option<Stage> {
        match self {
            PhaseName::InitDistributedEnd => Some(Stage::InitDistributed),
            PhaseName::LoadWeightsEnd => Some(Stage::LoadWeights),
            PhaseName::MemoryPoolEnd => Some(Stage::MemoryPool),
            PhaseName::CudaGraphEnd => Some(Stage::CudaGraph),
            _ => None,
        }
    }

    /// Whether a scheduler rank whose last phase is this one has nothing left to start (its
    /// memory is allocated, and its graphs captured if it captures any).
    pub fn settles_a_rank(self) -> bool {
        matches!(
            self,
            PhaseName::KvCacheAllocated
                | PhaseName::MemoryPoolEnd
                | PhaseName::CudaGraphEnd
                | PhaseName::MaxTotalNumTokens
        )
    }

    /// "stopped in cuda graph capture", "stopped after load weights" (ready-timeout diagnoses).
    pub fn describe_stop(self) -> String {
        match self.begins() {
            Some(Stage::CudaGraph) => "stopped in cuda graph capture".into(),
            Some(Stage::LoadWeights) => "stopped in weight loading".into(),
            Some(Stage::InitDistributed) => "stopped in distributed init".into(),
            Some(Stage::MemoryPool) => "stopped in memory_pool".into(),
            None => {
                let name = self.as_str();
                let base = name.strip_suffix("_end").unwrap_or(name);
                format!("stopped after {}", base.replace('_', " "))
            }
        }
    }
}

/// Why the server is, or is being, stopped (`fatal.reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FatalReason {
    // Read in the server's log.
    SchedulerException,
    DetokenizerException,
    InitFailed,
    SchedulerDied,
    CudaOom,
    WatchdogTimeout,
    SubprocessCrashed,
    ArgparseError,
    ChildSigquit,
    UvicornWorkerDied,
    // Decided by the supervisor.
    ReadyTimeout,
    Exited,
    ExitedBeforeReady,
    /// The pre-flight audit refused the launch (exit 126).
    PreflightRejected,
    /// The server could not be started (exit 125).
    SpawnFailed,
    /// The supervisor could not set up what the run needs (a port in use, a file it cannot
    /// write): exit 125, the server never started.
    SupervisorFailed,
    /// A reason written by another version of the supervisor.
    #[serde(other)]
    Other,
}

impl FatalReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FatalReason::SchedulerException => "scheduler_exception",
            FatalReason::DetokenizerException => "detokenizer_exception",
            FatalReason::InitFailed => "init_failed",
            FatalReason::SchedulerDied => "scheduler_died",
            FatalReason::CudaOom => "cuda_oom",
            FatalReason::WatchdogTimeout => "watchdog_timeout",
            FatalReason::SubprocessCrashed => "subprocess_crashed",
            FatalReason::ArgparseError => "argparse_error",
            FatalReason::ChildSigquit => "child_sigquit",
            FatalReason::UvicornWorkerDied => "uvicorn_worker_died",
            FatalReason::ReadyTimeout => "ready_timeout",
            FatalReason::Exited => "exited",
            FatalReason::ExitedBeforeReady => "exited_before_ready",
            FatalReason::PreflightRejected => "preflight_rejected",
            FatalReason::SpawnFailed => "spawn_failed",
            FatalReason::SupervisorFailed => "supervisor_failed",
            FatalReason::Other => "other",
        }
    }
}

impl std::fmt::Display for FatalReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a forwarded signal went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SignalTarget {
    /// The server's main process.
    Main,
    /// The server's process group (`--signal-group`).
    Group,
    /// SIGKILL to the whole tree (a second signal).
    Tree,
}

/// One line of `--events`. Field names are the contract; extensions only add.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The pre-flight audit of the server's flags (free-form: the audit's own record).
    Preflight(Map<String, Value>),
    Spawned {
        pid: i32,
        argv: Vec<String>,
        /// Lets `wait` tell a live run from a finished one (absent in events of old versions).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        supervisor_pid: Option<u32>,
    },
    Listening {
        metrics: Option<String>,
        proxy: Option<String>,
        /// The default metrics port was taken: `{addr, holder}` (the port used is `metrics`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        metrics_default_taken: Option<Value>,
    },
    ServerArgs {
        args: Map<String, Value>,
    },
    Deprecation {
        flag: Option<String>,
        replacement: Option<String>,
        message: String,
    },
    Warning {
        message: String,
    },
    Phase {
        name: PhaseName,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rank: Option<String>,
        elapsed_s: f64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        duration_s: Option<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
        /// Seconds within the stage (`_end` phases, `warmup`) with a JIT compiler process running
        /// in the server's tree (the start-up profiler's /proc samples).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        jit_s: Option<f64>,
    },
    Ready {
        elapsed_s: f64,
        url: String,
        /// Multi-node launches only (`--nnodes` > 1).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node_rank: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        nnodes: Option<u32>,
    },
    ServerInfo {
        version: Value,
        #[serde(default)]
        max_total_num_tokens: Value,
    },
    Fatal {
        reason: FatalReason,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rank: Option<String>,
        excerpt: String,
    },
    Signal {
        signal: String,
        target: SignalTarget,
    },
    Leftover {
        pids: Vec<i32>,
    },
    /// A measurement window (power and/or requests, the server's batch series under
    /// `server_batches`, a torch-profiler capture under `profile`); free-form.
    Window(Map<String, Value>),
    RequestsSummary(Map<String, Value>),
    GpuTeardown(Map<String, Value>),
    Power(Map<String, Value>),
    /// Where the start's wall time went (segments, JIT compilers); at readiness, or at the exit
    /// of a server that never got ready. Free-form (`startup::StartupProfile::summary`).
    StartupProfile(Map<String, Value>),
    /// The server's `Prefill batch`/`Decode batch` series over the whole run, at exit; free-form
    /// (`server_series::ServerSeries::summary`).
    ServerBatches(Map<String, Value>),
    /// A torch-profiler capture: the trace files (one per TP rank) and the server's answers;
    /// free-form (`profile::Profiler::stop`).
    Profile(Map<String, Value>),
    /// The last event of every run, whatever ended it.
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
        elapsed_s: f64,
        requested: bool,
        exit_status: i32,
        #[serde(default)]
        log: Value,
        /// Who wrote the run (lets `wait` tell a live run from a finished one).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        supervisor_pid: Option<u32>,
    },
    /// An event this version does not know (written by a newer supervisor).
    #[serde(other)]
    Unknown,
}

impl Event {
    /// A free-form event from a JSON object (anything else becomes an empty object).
    pub fn object(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    /// The `event` name.
    pub fn name(&self) -> &'static str {
        match self {
            Event::Preflight(_) => "preflight",
            Event::Spawned { .. } => "spawned",
            Event::Listening { .. } => "listening",
            Event::ServerArgs { .. } => "server_args",
            Event::Deprecation { .. } => "deprecation",
            Event::Warning { .. } => "warning",
            Event::Phase { .. } => "phase",
            Event::Ready { .. } => "ready",
            Event::ServerInfo { .. } => "server_info",
            Event::Fatal { .. } => "fatal",
            Event::Signal { .. } => "signal",
            Event::Leftover { .. } => "leftover",
            Event::Window(_) => "window",
            Event::RequestsSummary(_) => "requests_summary",
            Event::GpuTeardown(_) => "gpu_teardown",
            Event::Power(_) => "power",
            Event::StartupProfile(_) => "startup_profile",
            Event::ServerBatches(_) => "server_batches",
            Event::Profile(_) => "profile",
            Event::Exited { .. } => "exited",
            Event::Unknown => "unknown",
        }
    }

    /// One line of an events file (`None` for anything that is not an event).
    pub fn parse_line(line: &str) -> Option<Event> {
        serde_json::from_str(line.trim()).ok()
    }
}

pub struct Events {
    file: Option<Mutex<File>>,
    path: Option<String>,
    t0: Instant,
    /// A copy of every event, kept when a report will be built from them at exit.
    kept: Option<Mutex<Vec<Value>>>,
    /// Secret values of the run, replaced wherever they appear in an event (a quoted traceback).
    secrets: Secrets,
}

impl Events {
    pub fn new(file: Option<File>, path: Option<String>, t0: Instant, keep: bool) -> Self {
        Events {
            file: file.map(Mutex::new),
            path,
            t0,
            kept: keep.then(|| Mutex::new(Vec::new())),
            secrets: Secrets::default(),
        }
    }

    pub fn with_secrets(mut self, secrets: Secrets) -> Self {
        self.secrets = secrets;
        self
    }

    /// Every event so far (empty unless created with `keep`).
    pub fn kept(&self) -> Vec<Value> {
        self.kept
            .as_ref()
            .map(|k| lock(k).clone())
            .unwrap_or_default()
    }

    /// From now on `elapsed_s` counts from `t0` (the spawn; events before it say 0).
    pub fn restart_clock(&mut self, t0: Instant) {
        self.t0 = t0;
    }

    /// Seconds since the child was spawned (the `elapsed_s` of every event).
    pub fn elapsed(&self, at: Instant) -> f64 {
        round_ms(at.saturating_duration_since(self.t0).as_secs_f64())
    }

    pub fn emit(&self, event: Event) {
        let name = event.name();
        let fields = match serde_json::to_value(&event) {
            Ok(Value::Object(m)) => m,
            Ok(_) => Map::new(),
            Err(e) => {
                tracing::error!("cannot serialise event {name}: {e}");
                return;
            }
        };
        // `ts` then `event` first, as the contract promises; serde puts the tag first of the rest.
        let mut obj = Map::with_capacity(fields.len() + 1);
        obj.insert(
            "ts".into(),
            Value::String(humantime::format_rfc3339_micros(SystemTime::now()).to_string()),
        );
        obj.extend(fields);
        tracing::trace!(target: "events", event = name, "event emitted");
        let line = match serde_json::to_vec(&obj) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("cannot serialise event {name}: {e}");
                return;
            }
        };
        let mut line = match self.secrets.redact(&line) {
            std::borrow::Cow::Borrowed(_) => line,
            std::borrow::Cow::Owned(redacted) => {
                if let Ok(Value::Object(o)) = serde_json::from_slice(&redacted) {
                    obj = o;
                }
                redacted
            }
        };
        if let Some(k) = &self.kept {
            lock(k).push(Value::Object(obj));
        }
        let Some(file) = &self.file else { return };
        line.push(b'\n');
        let mut f = lock(file);
        // One write per line: a reader never sees half an event unless the disk is full.
        if let Err(e) = f.write_all(&line) {
            tracing::error!(
                "writing event {name} to {}: {e}",
                self.path.as_deref().unwrap_or("?")
            );
        }
    }
}

/// Millisecond precision is what the events promise; more digits are noise.
pub fn round_ms(s: f64) -> f64 {
    (s * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_with_their_contract_names() {
        let evs = [
            Event::Phase {
                name: PhaseName::CudaGraphEnd,
                rank: Some("TP1".into()),
                elapsed_s: 3.5,
                duration_s: Some(1.25),
                detail: None,
                jit_s: Some(0.5),
            },
            Event::Fatal {
                reason: FatalReason::ReadyTimeout,
                rank: None,
                excerpt: "x".into(),
            },
            Event::Ready {
                elapsed_s: 1.0,
                url: "http://127.0.0.1:1".into(),
                node_rank: Some(1),
                nnodes: Some(2),
            },
            Event::StartupProfile(Event::object(serde_json::json!({"samples": 3}))),
            Event::ServerBatches(Event::object(serde_json::json!({"decode": {"lines": 1}}))),
            Event::Profile(Event::object(serde_json::json!({"ok": true, "traces": []}))),
        ];
        for e in evs {
            let text = serde_json::to_string(&e).unwrap();
            assert!(
                text.starts_with(&format!(r#"{{"event":"{}""#, e.name())),
                "{text}"
            );
            assert_eq!(Event::parse_line(&text), Some(e.clone()), "{text}");
        }
        let v = serde_json::to_value(Event::Phase {
            name: PhaseName::LoadWeightsEnd,
            rank: None,
            elapsed_s: 1.0,
            duration_s: None,
            detail: None,
            jit_s: None,
        })
        .unwrap();
        assert_eq!(
            v,
            serde_json::json!({"event": "phase", "name": "load_weights_end", "elapsed_s": 1.0})
        );
    }

    #[test]
    fn unknown_events_and_reasons_are_read_not_refused() {
        assert_eq!(
            Event::parse_line(r#"{"ts":"x","event":"startup_attribution","a":1}"#),
            Some(Event::Unknown)
        );
        assert!(matches!(
            Event::parse_line(r#"{"event":"fatal","reason":"new_reason","excerpt":"e"}"#),
            Some(Event::Fatal {
                reason: FatalReason::Other,
                ..
            })
        ));
        assert_eq!(Event::parse_line("not json"), None);
    }

    #[test]
    fn phase_names_serialise_as_their_str_and_describe_where_a_rank_stopped() {
        for p in [
            PhaseName::InitDistributedBegin,
            PhaseName::MaxTotalNumTokens,
        ] {
            assert_eq!(
                serde_json::to_value(p).unwrap(),
                Value::String(p.as_str().into())
            );
        }
        assert_eq!(
            PhaseName::CudaGraphBegin.describe_stop(),
            "stopped in cuda graph capture"
        );
        assert_eq!(
            PhaseName::LoadWeightsEnd.describe_stop(),
            "stopped after load weights"
        );
    }
}
