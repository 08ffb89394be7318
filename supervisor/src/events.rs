//! `--events`: one JSON object per line, written and flushed as it happens (a recipe may `tail -f`
//! it, and `wait --events` reads it). Every line has `ts` (RFC 3339 UTC) and `event` first.
use crate::redact::Secrets;
use serde_json::{Map, Value};
use sglang_probes::sync::lock;
use std::fs::File;
use std::io::Write;
use std::sync::Mutex;
use std::time::{Instant, SystemTime};

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

    /// Seconds since the child was spawned (the `elapsed_s` of every event).
    pub fn elapsed(&self, at: Instant) -> f64 {
        round_ms(at.saturating_duration_since(self.t0).as_secs_f64())
    }

    pub fn emit(&self, event: &str, fields: Value) {
        let mut obj = Map::with_capacity(8);
        obj.insert(
            "ts".into(),
            Value::String(humantime::format_rfc3339_micros(SystemTime::now()).to_string()),
        );
        obj.insert("event".into(), Value::String(event.into()));
        if let Value::Object(f) = fields {
            obj.extend(f);
        }
        tracing::trace!(target: "events", event, "event emitted");
        let line = match serde_json::to_vec(&obj) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("cannot serialise event {event}: {e}");
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
                "writing event {event} to {}: {e}",
                self.path.as_deref().unwrap_or("?")
            );
        }
    }
}

/// Millisecond precision is what the events promise; more digits are noise.
pub fn round_ms(s: f64) -> f64 {
    (s * 1000.0).round() / 1000.0
}
