//! Where a start's wall time goes. While the server starts, a thread reads the process tree from
//! /proc a few times a second (stat files only; it stops at readiness or exit) and notes every
//! compiler process — `nvcc`, `cicc`, `ptxas`, `cc1plus`, `ninja`, ... that SGLang's JIT kernels,
//! flashinfer, tvm-ffi and Triton run — with its CPU time. The start is cut into segments at
//! the phase lines the log gives (Python import, scheduler spawn, weight load, KV allocation,
//! CUDA-graph capture, warm-up, ...) and each segment says how much of it compilers were running.
use crate::proctree::{Table, Tree};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use serde_json::{json, Map, Value};
use sglang_probes::sync;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often the tree is read while the server starts (4 Hz).
pub const PERIOD: Duration = Duration::from_millis(250);

/// Process names (`/proc/PID/comm`, at most 15 bytes) of compilers and build drivers.
const COMPILERS: &[&str] = &[
    "nvcc",
    "cicc",
    "ptxas",
    "cudafe++",
    "fatbinary",
    "nvlink",
    "cc1plus",
    "cc1",
    "ninja",
    "gcc",
    "g++",
    "c++",
    "cc",
    "clang",
    "clang++",
    "ld",
    "ld.lld",
    "collect2",
    "as",
    "hipcc",
];

/// Segments of a start: each ends at the first (`_begin`) or last (others) of its phase marks
/// and begins where the previous one that happened ended.
const SEGMENTS: &[(&str, &str)] = &[
    ("python_import", "server_args"),
    ("scheduler_spawn", "init_distributed_begin"),
    ("init_distributed", "load_weights_begin"),
    ("weight_load", "load_weights_end"),
    ("kv_allocation", "memory_pool_end"),
    ("before_cuda_graph", "cuda_graph_begin"),
    ("cuda_graph_capture", "cuda_graph_end"),
    ("http_start", "http_up"),
    ("warmup", "ready"),
];

/// What to do when compilation dominates: where the JIT caches live.
pub const JIT_ADVICE: &str = "JIT compilation took a large share of this start. Its results are \
cached on disk and reused by the next start when the caches survive: persist them between runs \
(a volume mounted over them) or bake them into the image (one start during the image build). \
SGLang: SGLANG_CACHE_DIR (~/.cache/sglang) and DeepGEMM SGLANG_DG_CACHE_DIR (~/.cache/deep_gemm); \
flashinfer: ~/.cache/flashinfer (FLASHINFER_WORKSPACE_BASE moves it); tvm-ffi: TVM_FFI_CACHE_DIR \
(~/.cache/tvm-ffi); Triton: TRITON_CACHE_DIR (~/.triton/cache); torch.compile: \
TORCHINDUCTOR_CACHE_DIR (/tmp/torchinductor_$USER). Keeping ~/.cache and ~/.triton covers the \
defaults.";

/// Share of the start above which the advice is given.
const ADVICE_SHARE: f64 = 0.2;

#[derive(Debug, Clone)]
struct Proc {
    comm: String,
    compiler: bool,
    first_s: f64,
    cpu_s: f64,
}

#[derive(Debug, Default)]
struct State {
    /// By (pid, start time in ticks): a reused pid is another process.
    procs: HashMap<(i32, u64), Proc>,
    /// Merged intervals (seconds since spawn) with a compiler running.
    busy: Vec<(f64, f64)>,
    samples: u64,
    /// Our own cost: CPU seconds spent reading /proc.
    cost_s: f64,
    last_sample_s: f64,
    /// Phase marks: name → (first, last) seconds since spawn.
    marks: HashMap<String, (f64, f64)>,
    done: Option<f64>,
}

/// The start-up profile of one run (shared with the sampling thread and the metrics collector).
#[derive(Debug, Default)]
pub struct StartupProfile {
    state: Mutex<State>,
    stop: AtomicBool,
    t0: Mutex<Option<Instant>>,
}

/// A process of the server's tree, as one sample saw it.
struct Seen {
    pid: i32,
    comm: String,
    cpu_ticks: u64,
    start_ticks: u64,
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no memory effects.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// The server's tree now, as teardown sees it ([`proctree`]: descendants of `root`, members of
/// its process group, processes of the previous sample that were re-parented away), minus
/// `exclude`. The marker variable is not read: one sample would read every process's environ.
fn tree(root: i32, exclude: &[i32], known: &[(i32, u64)]) -> Vec<Seen> {
    let table = Table::read();
    let mut procs = table.members(&Tree {
        root: Some(root),
        pgid: Some(root),
        marker: None,
        known,
        exclude,
    });
    procs.extend(table.get(root).copied());
    procs
        .into_iter()
        .map(|p| Seen {
            pid: p.pid,
            comm: p.comm.name().into_owned(),
            cpu_ticks: p.cpu_ticks,
            start_ticks: p.start,
        })
        .collect()
}

fn cpu_now() -> f64 {
    // SAFETY: clock_gettime fills a plain struct.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer; the thread's own CPU clock.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

fn r3(x: f64) -> f64 {
    // `+ 0.0`: an empty float sum is -0.0.
    (x * 1000.0).round() / 1000.0 + 0.0
}

impl StartupProfile {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        sync::lock(&self.state)
    }

    fn now_s(&self) -> f64 {
        let t0 = *sync::lock(&self.t0);
        t0.map_or(0.0, |t| t.elapsed().as_secs_f64())
    }

    /// Start sampling the tree of `root` (spawned at `t0`) on a thread of its own.
    pub fn start(self: &Arc<Self>, root: i32, t0: Instant, exclude: Vec<i32>) {
        *sync::lock(&self.t0) = Some(t0);
        let me = self.clone();
        let started = std::thread::Builder::new()
            .name("startup-profile".into())
            .spawn(move || {
                let hz = clock_ticks();
                let mut known = Vec::new();
                while !me.stop.load(Ordering::Relaxed) {
                    let c0 = cpu_now();
                    let procs = tree(root, &exclude, &known);
                    known = procs.iter().map(|p| (p.pid, p.start_ticks)).collect();
                    me.observe(t0.elapsed().as_secs_f64(), &procs, hz, cpu_now() - c0);
                    std::thread::sleep(PERIOD);
                }
            });
        if let Err(e) = started {
            tracing::warn!("no start-up profile (cannot start its thread: {e})");
        }
    }

    fn observe(&self, at: f64, procs: &[Seen], hz: f64, cost: f64) {
        let mut st = self.lock();
        if st.done.is_some() {
            return;
        }
        st.samples += 1;
        st.cost_s += cost;
        st.last_sample_s = at;
        let mut compiling = false;
        for s in procs {
            let compiler = COMPILERS.contains(&s.comm.as_str());
            compiling |= compiler;
            let p = st.procs.entry((s.pid, s.start_ticks)).or_insert(Proc {
                comm: s.comm.clone(),
                compiler,
                first_s: at,
                cpu_s: 0.0,
            });
            // A process may exec (python → ninja): the latest name is what it is.
            if p.comm != s.comm {
                p.comm = s.comm.clone();
                p.compiler |= compiler;
            }
            p.cpu_s = s.cpu_ticks as f64 / hz;
        }
        if compiling {
            let half = PERIOD.as_secs_f64() / 2.0;
            let (a, b) = ((at - half).max(0.0), at + half);
            match st.busy.last_mut() {
                Some(last) if last.1 >= a => last.1 = b,
                _ => st.busy.push((a, b)),
            }
        }
    }

    /// A phase line (or `server_args`, `http_up`, `ready`) at `at` seconds since spawn.
    pub fn mark(&self, name: &str, at: f64) {
        let mut st = self.lock();
        st.marks
            .entry(name.to_string())
            .and_modify(|m| m.1 = at)
            .or_insert((at, at));
    }

    /// Seconds compilers ran within `[from, to]`.
    pub fn jit_within(&self, from: f64, to: f64) -> f64 {
        overlap(&self.lock().busy, from, to)
    }

    /// Stop sampling; the profile up to `at` (readiness, or the exit). Once.
    pub fn finish(&self, at: f64) -> Option<Value> {
        self.stop.store(true, Ordering::Relaxed);
        {
            let mut st = self.lock();
            if st.done.is_some() || st.samples == 0 {
                return None;
            }
            st.done = Some(at);
        }
        Some(self.summary(at))
    }

    /// The profile up to `until` seconds since spawn.
    pub fn summary(&self, until: f64) -> Value {
        let st = self.lock();
        let until = st.done.unwrap_or(until);
        let segments = segments(&st.marks, until);
        let jit_wall: f64 = overlap(&st.busy, 0.0, until);
        let compilers: Vec<&Proc> = st.procs.values().filter(|p| p.compiler).collect();
        let mut by: BTreeMap<&str, (u64, f64)> = BTreeMap::new();
        for p in &compilers {
            let e = by.entry(p.comm.as_str()).or_default();
            e.0 += 1;
            e.1 += p.cpu_s;
        }
        let by_compiler: Map<String, Value> = by
            .iter()
            .map(|(k, (n, c))| (k.to_string(), json!({"processes": n, "cpu_s": r3(*c)})))
            .collect();
        let segs: Vec<Value> = segments
            .iter()
            .map(|(name, a, b)| {
                let started: Vec<&&Proc> = compilers
                    .iter()
                    .filter(|p| p.first_s >= *a && p.first_s < *b)
                    .collect();
                json!({
                    "name": name, "start_s": r3(*a), "end_s": r3(*b), "duration_s": r3(b - a),
                    "jit_s": r3(overlap(&st.busy, *a, *b)),
                    "compiler_processes": started.len(),
                    "compiler_cpu_s": r3(started.iter().map(|p| p.cpu_s).sum()),
                })
            })
            .collect();
        let share = if until > 0.0 { jit_wall / until } else { 0.0 };
        let mut v = json!({
            "until_s": r3(until),
            "ready": st.marks.contains_key("ready"),
            "sample_period_s": PERIOD.as_secs_f64(),
            "samples": st.samples,
            "profiler_cpu_s": r3(st.cost_s),
            "processes_seen": st.procs.len(),
            "segments": segs,
            "jit": {
                "wall_s": r3(jit_wall),
                "share": r3(share),
                "first_s": st.busy.first().map(|b| r3(b.0)),
                "last_s": st.busy.last().map(|b| r3(b.1.min(until))),
                "processes": compilers.len(),
                "cpu_s": r3(compilers.iter().map(|p| p.cpu_s).sum()),
                "by_compiler": by_compiler,
                // When compilers ran (merged; to half a sample period), for the Gantt chart.
                "intervals": st.busy.iter().map(|(a, b)| [r3(*a), r3(b.min(until))]).collect::<Vec<_>>(),
            },
        });
        if share >= ADVICE_SHARE {
            v["advice"] = JIT_ADVICE.into();
        }
        v
    }
}

/// Seconds of `busy` (sorted, disjoint) inside `[a, b]`.
fn overlap(busy: &[(f64, f64)], a: f64, b: f64) -> f64 {
    busy.iter()
        .map(|(x, y)| (y.min(b) - x.max(a)).max(0.0))
        .sum()
}

/// `(name, start, end)` of the segments the marks delimit, up to `until`; the time after the last
/// mark is `after_<last>` (a start that has not finished says where it is).
fn segments(marks: &HashMap<String, (f64, f64)>, until: f64) -> Vec<(String, f64, f64)> {
    let mut out = Vec::new();
    let mut at = 0.0f64;
    for (name, mark) in SEGMENTS {
        let Some(&(first, last)) = marks.get(*mark) else {
            continue;
        };
        let end = if mark.ends_with("_begin") {
            first
        } else {
            last
        };
        let end = end.max(at).min(until);
        out.push((name.to_string(), at, end));
        at = end;
    }
    if until > at + 1e-3 {
        let last = out.last().map_or("spawn".to_string(), |s| s.0.clone());
        out.push((format!("after_{last}"), at, until));
    }
    out
}

/// `/metrics` during and after the start: segment and JIT seconds, compiler processes and CPU.
#[derive(Debug)]
pub struct StartupCollector(pub Arc<StartupProfile>);

type Labels = Vec<(String, String)>;

fn gauges(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: Vec<(Labels, f64)>,
) -> Result<(), std::fmt::Error> {
    if rows.is_empty() {
        return Ok(());
    }
    let mut fam = enc.encode_descriptor(name, help, None, ConstGauge::new(0.0).metric_type())?;
    for (l, v) in rows {
        ConstGauge::new(v).encode(fam.encode_family(&l)?)?;
    }
    Ok(())
}

impl Collector for StartupCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if self.0.lock().samples == 0 {
            return Ok(());
        }
        let v = self.0.summary(self.0.now_s());
        let segs = v["segments"].as_array().cloned().unwrap_or_default();
        let rows = |k: &str| -> Vec<(Labels, f64)> {
            segs.iter()
                .filter_map(|s| {
                    let name = s["name"].as_str()?.to_string();
                    Some((vec![("segment".to_string(), name)], s[k].as_f64()?))
                })
                .collect()
        };
        gauges(
            &mut enc,
            "startup_segment_seconds",
            "Wall seconds of each start-up segment (from the phase lines)",
            rows("duration_s"),
        )?;
        gauges(
            &mut enc,
            "startup_jit_seconds",
            "Wall seconds within each start-up segment with a compiler process running",
            rows("jit_s"),
        )?;
        let by = v["jit"]["by_compiler"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        let per = |k: &str| -> Vec<(Labels, f64)> {
            by.iter()
                .filter_map(|(c, x)| {
                    Some((vec![("compiler".to_string(), c.clone())], x[k].as_f64()?))
                })
                .collect()
        };
        gauges(
            &mut enc,
            "startup_compiler_processes",
            "Compiler processes seen during the start, by name",
            per("processes"),
        )?;
        gauges(
            &mut enc,
            "startup_compiler_cpu_seconds",
            "CPU seconds of the compiler processes seen during the start (as last sampled)",
            per("cpu_s"),
        )?;
        Ok(())
    }
}

/// A profile for this run, its metrics in `registry`.
pub fn register(registry: &mut prometheus_client::registry::Registry) -> Arc<StartupProfile> {
    let p = Arc::new(StartupProfile::default());
    registry.register_collector(Box::new(StartupCollector(p.clone())));
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marks(m: &[(&str, f64)]) -> HashMap<String, (f64, f64)> {
        let mut out: HashMap<String, (f64, f64)> = HashMap::new();
        for (k, v) in m {
            out.entry(k.to_string())
                .and_modify(|e| e.1 = *v)
                .or_insert((*v, *v));
        }
        out
    }

    #[test]
    fn segments_follow_the_phase_lines_and_name_where_an_unfinished_start_stands() {
        let m = marks(&[
            ("server_args", 20.0),
            ("init_distributed_begin", 42.0),
            ("load_weights_begin", 44.5),
            ("load_weights_end", 44.7),
            ("memory_pool_end", 44.8),
            ("cuda_graph_begin", 44.9),
            ("cuda_graph_begin", 50.0),
            ("cuda_graph_end", 46.9),
            ("cuda_graph_end", 120.0),
            ("http_up", 121.0),
            ("ready", 135.0),
        ]);
        let s = segments(&m, 135.0);
        let names: Vec<&str> = s.iter().map(|x| x.0.as_str()).collect();
        assert_eq!(
            names,
            [
                "python_import",
                "scheduler_spawn",
                "init_distributed",
                "weight_load",
                "kv_allocation",
                "before_cuda_graph",
                "cuda_graph_capture",
                "http_start",
                "warmup"
            ]
        );
        // The first begin and the last end: every rank's capture is inside.
        assert_eq!((s[6].1, s[6].2), (44.9, 120.0));
        let s = segments(
            &marks(&[("server_args", 20.0), ("cuda_graph_begin", 44.9)]),
            60.0,
        );
        assert_eq!(
            s.iter().map(|x| x.0.as_str()).collect::<Vec<_>>(),
            [
                "python_import",
                "before_cuda_graph",
                "after_before_cuda_graph"
            ]
        );
    }

    #[test]
    fn compiler_time_is_split_over_the_segments_it_overlaps() {
        let p = StartupProfile::default();
        let stat = |pid, comm: &str, ticks| Seen {
            pid,
            comm: comm.into(),
            cpu_ticks: ticks,
            start_ticks: pid as u64,
        };
        p.mark("server_args", 1.0);
        p.mark("cuda_graph_begin", 2.0);
        p.mark("cuda_graph_end", 4.0);
        for i in 0..=20 {
            let at = i as f64 * 0.25;
            let mut procs = vec![stat(10, "python3", 100)];
            if (2.5..=4.5).contains(&at) {
                procs.push(stat(11, "nvcc", 50 + i));
                procs.push(stat(12, "cicc", 20));
            }
            p.observe(at, &procs, 100.0, 0.0);
        }
        p.mark("ready", 5.0);
        let v = p.finish(5.0).expect("sampled");
        let seg = |n: &str| {
            v["segments"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["name"] == n)
                .cloned()
                .unwrap()
        };
        // Busy from 2.375 to 4.625: 1.625 s inside the capture, 0.625 s in the warm-up.
        assert_eq!(seg("cuda_graph_capture")["jit_s"], json!(1.625));
        assert_eq!(seg("cuda_graph_capture")["compiler_processes"], json!(2));
        assert_eq!(seg("warmup")["jit_s"], json!(0.625));
        assert_eq!(seg("python_import")["jit_s"], json!(0.0));
        assert_eq!(v["jit"]["wall_s"], json!(2.25));
        assert_eq!(
            v["jit"]["by_compiler"]["nvcc"],
            json!({"processes": 1, "cpu_s": 0.68})
        );
        assert_eq!(v["jit"]["processes"], json!(2));
        assert!(v["advice"].as_str().unwrap().contains("TRITON_CACHE_DIR"));
        assert!(p.finish(6.0).is_none(), "once");
    }

    #[test]
    fn a_tree_is_sampled_with_names_and_cpu_time() {
        let me = std::process::id() as i32;
        let seen = tree(me, &[], &[]);
        let us = seen
            .iter()
            .find(|p| p.pid == me)
            .expect("the root is sampled");
        assert!(us.start_ticks > 0 && !us.comm.is_empty());
    }
}
