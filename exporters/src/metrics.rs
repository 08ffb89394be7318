//! The `/metrics` content: one `prometheus-client` registry whose collector reads, at scrape time,
//! the supervisor's status (updated by the lifecycle), the GPU sampler's cached samples and the
//! cached copy of the server's own `sglang:*` metrics. A scrape never calls NVML; it fetches the
//! server's `/metrics` about every [`UPSTREAM_MAX_AGE`] at most (see [`Shared::refresh_upstream`]).
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use sglang_probes::http::HttpUrl;
use sglang_probes::sampler::SamplerHandle;
use sglang_probes::sync::lock;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How old the copy of the server's series may be before a scrape of ours fetches it again.
pub const UPSTREAM_MAX_AGE: Duration = Duration::from_secs(5);
/// How long a fetch of the server's `/metrics` may take before it is given up.
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the scrape that starts a fetch waits for it before rendering the copy there is (the
/// fetch goes on for the next scrape): a server busy with a benchmark may take longer to answer,
/// and our scrape must not take its time.
pub const UPSTREAM_WAIT: Duration = Duration::from_millis(100);
/// A fetch is due this much before [`UPSTREAM_MAX_AGE`] has passed since the last one *began*: a
/// scraper whose period is exactly 5 s (Prometheus' timer, `examples/kubernetes/podmonitor.yaml`)
/// comes back 5 s ± a few ms after that start, and must find the copy due, not fresh.
const UPSTREAM_SLACK: Duration = Duration::from_millis(500);

/// Lifecycle states, exported one-hot as `server_state{state}`.
pub const STATES: &[&str] = &["starting", "ready", "stopping", "exited", "failed"];

/// What the lifecycle knows, as the exporter shows it.
#[derive(Debug, Default, Clone)]
pub struct Status {
    pub state: &'static str,
    pub ready_seconds: Option<f64>,
    /// (phase, seconds) of completed phases.
    pub phases: Vec<(String, f64)>,
    /// Selected resolved server args (already redacted) as label pairs.
    pub args_info: Vec<(String, String)>,
    pub exit_code: Option<i64>,
}

/// The server's own metrics as last fetched (text 0.0.4), and how that went.
#[derive(Debug, Default, Clone)]
pub struct Upstream {
    pub text: Option<String>,
    pub ok: Option<bool>,
    pub fetched_at: Option<Instant>,
}

/// Where the server's `/metrics` is, once it is ready to be asked, and the one fetch that may be
/// in flight.
#[derive(Debug)]
pub struct UpstreamSource {
    url: HttpUrl,
    /// Held by the one fetch in flight (owned by its task, not by the scrape that started it).
    fetching: Arc<tokio::sync::Mutex<()>>,
    /// When the last fetch began: the next is due [`UPSTREAM_MAX_AGE`] (less the slack) after.
    began: Mutex<Option<Instant>>,
}

impl UpstreamSource {
    fn due(&self) -> bool {
        lock(&self.began).is_none_or(|t| t.elapsed() + UPSTREAM_SLACK >= UPSTREAM_MAX_AGE)
    }
}

#[derive(Default)]
pub struct Shared {
    pub status: Mutex<Status>,
    pub upstream: Mutex<Upstream>,
    pub upstream_source: Mutex<Option<Arc<UpstreamSource>>>,
    pub gpus: Mutex<Option<SamplerHandle>>,
    pub window_sink: Mutex<Option<WindowSink>>,
    pub requests: Mutex<Option<Arc<crate::report::RequestStats>>>,
    pub bench_hook: Mutex<Option<BenchHook>>,
    pub window_parts: Mutex<Vec<Arc<dyn WindowPart>>>,
    pub profile_hook: Mutex<Option<ProfileHook>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

/// Receives each closed window as JSON.
pub type WindowSink = Arc<dyn Fn(serde_json::Value) + Send + Sync>;

/// Evaluates a benchmark result file (`POST /-/window/stop?bench_result=PATH`) into the JSON of a
/// window over the benchmark's own span (the lifecycle provides it; it may block on file reads).
pub type BenchHook = Arc<dyn Fn(&str) -> serde_json::Value + Send + Sync>;

/// `POST /-/profile/start?steps=N` and `/-/profile/stop`: what the lifecycle does with them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProfileCall {
    Start { steps: Option<u64> },
    Stop,
}

/// Drives the server's torch profiler; answers (HTTP status, JSON).
pub type ProfileHook = Arc<
    dyn Fn(
            ProfileCall,
        )
            -> std::pin::Pin<Box<dyn std::future::Future<Output = (u16, serde_json::Value)> + Send>>
        + Send
        + Sync,
>;

/// More that a measurement window reports (the server's own batch series): told when a window
/// opens, asked for its member of the window's JSON when it closes.
pub trait WindowPart: Send + Sync {
    fn start(&self, name: &str);
    /// (window name, member name, value) of the window that just closed; None when none was open.
    fn stop(&self) -> Option<(String, &'static str, serde_json::Value)>;
}

impl Shared {
    pub fn update(&self, f: impl FnOnce(&mut Status)) {
        f(&mut lock(&self.status));
    }

    pub fn is_ready(&self) -> bool {
        lock(&self.status).state == "ready"
    }

    pub fn set_gpus(&self, g: Option<SamplerHandle>) {
        *lock(&self.gpus) = g;
    }

    pub fn sampler(&self) -> Option<SamplerHandle> {
        lock(&self.gpus).clone()
    }

    pub fn set_requests(&self, r: Option<Arc<crate::report::RequestStats>>) {
        *lock(&self.requests) = r;
    }

    pub fn requests(&self) -> Option<Arc<crate::report::RequestStats>> {
        lock(&self.requests).clone()
    }

    /// Where a closed measurement window goes (the lifecycle writes it to the events file).
    pub fn set_window_sink(&self, sink: WindowSink) {
        *lock(&self.window_sink) = Some(sink);
    }

    pub fn window_sink(&self) -> Option<WindowSink> {
        lock(&self.window_sink).clone()
    }

    pub fn set_bench_hook(&self, hook: BenchHook) {
        *lock(&self.bench_hook) = Some(hook);
    }

    pub fn bench_hook(&self) -> Option<BenchHook> {
        lock(&self.bench_hook).clone()
    }

    pub fn set_profile_hook(&self, hook: ProfileHook) {
        *lock(&self.profile_hook) = Some(hook);
    }

    pub fn profile_hook(&self) -> Option<ProfileHook> {
        lock(&self.profile_hook).clone()
    }

    pub fn add_window_part(&self, part: Arc<dyn WindowPart>) {
        lock(&self.window_parts).push(part);
    }

    pub fn window_parts(&self) -> Vec<Arc<dyn WindowPart>> {
        lock(&self.window_parts).clone()
    }

    /// From now on (`Some`) a scrape of ours brings the server's own series with it; `None` when
    /// the server no longer answers (it is stopping or gone).
    pub fn fetch_upstream_from(&self, url: Option<HttpUrl>) {
        if url.is_none() {
            // nor is the copy of a server that no longer answers shown
            *lock(&self.upstream) = Upstream::default();
        }
        *lock(&self.upstream_source) = url.map(|url| {
            Arc::new(UpstreamSource {
                url,
                fetching: Arc::new(tokio::sync::Mutex::new(())),
                began: Mutex::new(None),
            })
        });
    }

    /// Brings the copy of the server's series up to date before a scrape renders it. Each fetch
    /// costs the server's HTTP process (the one that sets a benchmark's pace) a merge of every
    /// process's metric files, so the server is asked only as often as we are, about every
    /// [`UPSTREAM_MAX_AGE`] at most (counted from when a fetch began, less [`UPSTREAM_SLACK`]),
    /// and never while nobody reads ours. One scrape fetches and waits up to [`UPSTREAM_WAIT`]
    /// for it; the others that come meanwhile render the copy there is.
    pub async fn refresh_upstream(self: &Arc<Self>) {
        let Some(source) = lock(&self.upstream_source).clone() else {
            return;
        };
        if !source.due() {
            return;
        }
        let Ok(fetching) = source.fetching.clone().try_lock_owned() else {
            return;
        };
        if !source.due() {
            return; // fetched while this scrape looked
        }
        // Counted from the start, so a scrape that gives up (its client gone, its connection
        // evicted) cannot make the next one ask again at once.
        *lock(&source.began) = Some(Instant::now());
        let shared = self.clone();
        // A task of its own: dropping this scrape does not drop a fetch the server is already
        // paying for; the next scrape renders what it brings.
        let fetch = tokio::spawn(async move {
            let _fetching = fetching;
            let url = &source.url;
            match sglang_probes::http::get_body(url, UPSTREAM_TIMEOUT, 16 << 20).await {
                Ok((200, body)) => {
                    shared.set_upstream(Some(String::from_utf8_lossy(&body).into_owned()), true)
                }
                Ok((code, _)) => {
                    tracing::debug!("GET {url}: {code}");
                    shared.set_upstream(None, false);
                }
                Err(e) => {
                    tracing::debug!("{e}");
                    shared.set_upstream(None, false);
                }
            }
        });
        let _ = tokio::time::timeout(UPSTREAM_WAIT, fetch).await;
    }

    pub fn set_upstream(&self, text: Option<String>, ok: bool) {
        let mut u = lock(&self.upstream);
        if text.is_some() {
            u.text = text;
            // the age of the copy rendered, not of the last try: a failed fetch keeps the old
            // copy, and its age must show it
            u.fetched_at = Some(Instant::now());
        }
        u.ok = Some(ok);
    }

    /// The upstream text to append, if any.
    pub fn upstream_text(&self) -> Option<String> {
        lock(&self.upstream).text.clone()
    }
}

#[derive(Debug)]
struct StatusCollector(Arc<Shared>);

type Labels = Vec<(String, String)>;

fn gauge<
    L: prometheus_client::encoding::EncodeLabelSet,
    V: prometheus_client::encoding::EncodeGaugeValue + Copy + std::fmt::Debug + Send + Sync + 'static,
>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[(L, V)],
) -> Result<(), std::fmt::Error>
where
    ConstGauge<V>: EncodeMetric,
{
    if rows.is_empty() {
        return Ok(()); // a missing metric is absent, never 0
    }
    let g0 = ConstGauge::new(rows[0].1);
    let mut family = enc.encode_descriptor(name, help, None, g0.metric_type())?;
    for (labels, v) in rows {
        ConstGauge::new(*v).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

/// A GPU's labels: ours (`gpu`, `uuid`, `name`) and dcgm-exporter's names for the same values
/// (`UUID`, `modelName`; its `gpu` is ours), so its series and ours join on either.
type GpuLabels<'a> = [(&'static str, &'a str); 5];

fn gpu_labels<'a>(index: &'a str, s: &'a sglang_probes::gpu::GpuSample) -> GpuLabels<'a> {
    let uuid = s.uuid.as_deref().unwrap_or_default();
    let name = s.name.as_deref().unwrap_or_default();
    [
        ("gpu", index),
        ("uuid", uuid),
        ("name", name),
        ("UUID", uuid),
        ("modelName", name),
    ]
}

impl Collector for StatusCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let st = lock(&self.0.status).clone();
        gauge(
            &mut enc,
            "up",
            "1 while the supervisor runs",
            &[(Labels::new(), 1i64)],
        )?;
        gauge(
            &mut enc,
            "build_info",
            "sglang-supervisor build",
            &[([("version", env!("CARGO_PKG_VERSION"))], 1i64)],
        )?;
        let states: Vec<(Labels, i64)> = STATES
            .iter()
            .map(|s| {
                (
                    vec![("state".to_string(), s.to_string())],
                    i64::from(*s == st.state),
                )
            })
            .collect();
        gauge(
            &mut enc,
            "server_state",
            "Lifecycle state of the SGLang server (one-hot)",
            &states,
        )?;
        if let Some(r) = st.ready_seconds {
            gauge(
                &mut enc,
                "server_ready_seconds",
                "Seconds from spawn to readiness",
                &[(Labels::new(), r)],
            )?;
        }
        let phases: Vec<(Labels, f64)> = st
            .phases
            .iter()
            .map(|(p, s)| (vec![("phase".to_string(), p.clone())], *s))
            .collect();
        gauge(
            &mut enc,
            "startup_phase_seconds",
            "Duration of each completed startup phase",
            &phases,
        )?;
        if !st.args_info.is_empty() {
            gauge(
                &mut enc,
                "server_args_info",
                "Selected resolved server args (value 1)",
                &[(st.args_info.clone(), 1i64)],
            )?;
        }
        if let Some(c) = st.exit_code {
            gauge(
                &mut enc,
                "child_exit_code",
                "Exit status of the server (128+N for signal N)",
                &[(Labels::new(), c)],
            )?;
        }
        // (not the text: it is appended by `render`)
        let (ok, fetched_at) = {
            let u = lock(&self.0.upstream);
            (u.ok, u.fetched_at)
        };
        if let Some(ok) = ok {
            gauge(
                &mut enc,
                "upstream_scrape_ok",
                "1 if the last fetch of the server's /metrics succeeded",
                &[(Labels::new(), i64::from(ok))],
            )?;
        }
        if let Some(at) = fetched_at {
            gauge(
                &mut enc,
                "upstream_scrape_age_seconds",
                "Age of the re-exposed sglang:* series",
                &[(Labels::new(), at.elapsed().as_secs_f64())],
            )?;
        }
        let Some(gpus) = lock(&self.0.gpus).clone() else {
            return Ok(());
        };
        let samples: Vec<_> = gpus
            .latest()
            .into_iter()
            .flatten()
            .map(|t| (t.sample.index.to_string(), t.sample))
            .collect();
        let rows = |f: &dyn Fn(&sglang_probes::gpu::GpuSample) -> Option<f64>| {
            samples
                .iter()
                .filter_map(|(i, s)| f(s).map(|v| (gpu_labels(i, s), v)))
                .collect::<Vec<_>>()
        };
        gauge(
            &mut enc,
            "gpu_power_watts",
            "Instant GPU power",
            &rows(&|s| s.power_w.or(s.power_avg_w)),
        )?;
        gauge(
            &mut enc,
            "gpu_memory_used_bytes",
            "GPU memory used",
            &rows(&|s| s.memory_used_bytes.map(|b| b as f64)),
        )?;
        gauge(
            &mut enc,
            "gpu_memory_total_bytes",
            "GPU memory total",
            &rows(&|s| s.memory_total_bytes.map(|b| b as f64)),
        )?;
        gauge(
            &mut enc,
            "gpu_utilization_ratio",
            "GPU busy fraction",
            &rows(&|s| s.utilization),
        )?;
        gauge(
            &mut enc,
            "gpu_temperature_celsius",
            "GPU temperature",
            &rows(&|s| s.temperature_c),
        )?;
        gauge(
            &mut enc,
            "gpu_sm_clock_hertz",
            "GPU SM clock",
            &rows(&|s| s.sm_clock_hz.map(|h| h as f64)),
        )?;
        // The hardware energy counter, exported as a counter (set from the device, never summed by us).
        let energy = rows(&|s| s.energy_j);
        if !energy.is_empty() {
            let c0 = ConstCounter::new(0.0f64);
            let mut family = enc.encode_descriptor(
                "gpu_energy_joules",
                "GPU energy counter since driver load",
                None,
                c0.metric_type(),
            )?;
            for (l, v) in &energy {
                ConstCounter::new(*v).encode(family.encode_family(l)?)?;
            }
        }
        Ok(())
    }
}

/// A registry with the supervisor's metrics under `sglang_supervisor_`.
pub fn registry(shared: Arc<Shared>) -> Registry {
    let mut r = Registry::with_prefix("sglang_supervisor");
    r.register_collector(Box::new(StatusCollector(shared)));
    r
}

/// Prometheus text 0.0.4 (default) or OpenMetrics (what Prometheus itself asks for first), with
/// the upstream `sglang:*` series appended (before OpenMetrics' `# EOF`).
pub fn render(
    registry: &Registry,
    shared: &Shared,
    openmetrics: bool,
) -> Result<String, std::fmt::Error> {
    let mut out = String::with_capacity(64 * 1024);
    let upstream = shared.upstream_text();
    if openmetrics {
        prometheus_client::encoding::text::encode_registry(&mut out, registry)?;
        if let Some(up) = &upstream {
            push_openmetrics(&mut out, up);
        }
        prometheus_client::encoding::text::encode_eof(&mut out)?;
    } else {
        prometheus_client::encoding::prometheus_text::encode(&mut out, registry)?;
        if let Some(up) = &upstream {
            out.push_str(up);
            if !up.ends_with('\n') {
                out.push('\n');
            }
        }
    }
    Ok(out)
}

/// SGLang's text 0.0.4 as OpenMetrics. The sample lines are the same (Python's client already
/// names counter samples `_total`), but a counter *family* is named without `_total` (its
/// `# TYPE x_total counter` clashes with its own sample in a strict parser), a `x_created` gauge
/// family of a counter or histogram `x` clashes with the sample OpenMetrics reserves for it (left
/// out), HELP texts must escape `"`, and there must be no `# EOF` but ours. (A single bad line
/// makes Prometheus drop the whole scrape, ours included.)
fn push_openmetrics(out: &mut String, text: &str) {
    // Metadata lines are few: one look at them finds the families to rename or leave out.
    let mut counters: Vec<&str> = Vec::new();
    let mut families: Vec<&str> = Vec::new();
    for l in text.lines().filter(|l| l.starts_with("# TYPE ")) {
        let mut w = l["# TYPE ".len()..].split(' ');
        if let (Some(name), Some(kind)) = (w.next(), w.next()) {
            if kind == "counter" {
                counters.push(name);
            }
            if matches!(kind, "counter" | "histogram" | "summary") {
                families.push(name.strip_suffix("_total").unwrap_or(name));
            }
        }
    }
    let created: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" gauge"))
        .filter(|n| {
            n.strip_suffix("_created")
                .is_some_and(|b| families.contains(&b))
        })
        .collect();
    for line in text.lines() {
        if line.is_empty() || line == "# EOF" {
            continue;
        }
        if !created.is_empty() && created.contains(&metric_of(line)) {
            continue;
        }
        match metadata(line) {
            Some((head, name, rest)) => {
                out.push_str(head);
                let counter = counters.contains(&name);
                out.push_str(
                    name.strip_suffix("_total")
                        .filter(|_| counter)
                        .unwrap_or(name),
                );
                if head == "# HELP " {
                    push_help(out, rest);
                } else {
                    out.push_str(rest);
                }
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
}

/// `# HELP|TYPE|UNIT NAME REST` split as (`# HELP `, NAME, ` REST`).
fn metadata(line: &str) -> Option<(&str, &str, &str)> {
    let head = ["# HELP ", "# TYPE ", "# UNIT "]
        .into_iter()
        .find(|h| line.starts_with(h))?;
    let body = &line[head.len()..];
    let end = body.find(' ').unwrap_or(body.len());
    Some((head, &body[..end], &body[end..]))
}

/// The metric a line is about: a sample's name, or a metadata line's.
fn metric_of(line: &str) -> &str {
    if let Some((_, name, _)) = metadata(line) {
        return name;
    }
    let end = line.find(['{', ' ']).unwrap_or(line.len());
    &line[..end]
}

/// A HELP text (` text`), its `"` escaped as OpenMetrics wants.
fn push_help(out: &mut String, help: &str) {
    let mut prev_backslash = false;
    for c in help.chars() {
        if c == '"' && !prev_backslash {
            out.push('\\');
        }
        prev_backslash = c == '\\' && !prev_backslash;
        out.push(c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_counters_are_named_as_openmetrics_families_and_created_gauges_left_out() {
        let up = "# HELP sglang:x_total Total \"x\".\n# TYPE sglang:x_total counter\nsglang:x_total{a=\"1\"} 3.0\n# HELP sglang:x_created Created.\n# TYPE sglang:x_created gauge\nsglang:x_created{a=\"1\"} 1.7e9\n# HELP sglang:g_total A gauge.\n# TYPE sglang:g_total gauge\nsglang:g_total 1.0\n";
        let mut out = String::new();
        push_openmetrics(&mut out, up);
        assert_eq!(
            out,
            "# HELP sglang:x Total \\\"x\\\".\n# TYPE sglang:x counter\nsglang:x_total{a=\"1\"} 3.0\n# HELP sglang:g_total A gauge.\n# TYPE sglang:g_total gauge\nsglang:g_total 1.0\n"
        );
    }

    #[test]
    fn renders_status_and_leaves_unknown_values_out() {
        let shared = Arc::new(Shared::default());
        shared.update(|s| {
            s.state = "ready";
            s.ready_seconds = Some(48.2);
            s.phases = vec![("cuda_graph".into(), 2.0)];
            s.args_info = vec![
                ("model_path".into(), "/models/x".into()),
                ("tp_size".into(), "8".into()),
            ];
        });
        let reg = registry(shared.clone());
        let text = render(&reg, &shared, false).unwrap();
        assert!(text.contains("sglang_supervisor_up 1"), "{text}");
        assert!(
            text.contains("sglang_supervisor_server_state{state=\"ready\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("sglang_supervisor_server_state{state=\"starting\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("sglang_supervisor_server_ready_seconds 48.2"),
            "{text}"
        );
        assert!(
            text.contains("sglang_supervisor_startup_phase_seconds{phase=\"cuda_graph\"} 2.0"),
            "{text}"
        );
        assert!(
            text.contains(
                "sglang_supervisor_server_args_info{model_path=\"/models/x\",tp_size=\"8\"} 1"
            ),
            "{text}"
        );
        assert!(
            !text.contains("child_exit_code"),
            "absent until the child exits"
        );
        assert!(!text.contains("gpu_"), "no GPU: no GPU series at all");
        shared.set_upstream(
            Some("# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 3\n".into()),
            true,
        );
        let text = render(&reg, &shared, false).unwrap();
        assert!(text.ends_with("sglang:num_running_reqs 3\n"));
        assert!(text.contains("sglang_supervisor_upstream_scrape_ok 1"));
        let om = render(&reg, &shared, true).unwrap();
        assert!(om.ends_with("sglang:num_running_reqs 3\n# EOF\n"), "{om}");
        shared.set_upstream(
            Some("# HELP sglang:x Say \"hi\"\n# TYPE sglang:x gauge\nsglang:x 1\n# EOF\n".into()),
            true,
        );
        let om = render(&reg, &shared, true).unwrap();
        assert!(om.contains("# HELP sglang:x Say \\\"hi\\\"\n"), "{om}");
        assert_eq!(om.matches("# EOF").count(), 1);
    }

    /// A server whose `/metrics` answers after `delay`; counts the requests.
    async fn slow_metrics_server(
        delay: Duration,
    ) -> (HttpUrl, Arc<std::sync::atomic::AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = HttpUrl::parse(&format!("http://{}/metrics", l.local_addr().unwrap())).unwrap();
        let n = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = n.clone();
        tokio::spawn(async move {
            while let Ok((mut c, _)) = l.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = c.read(&mut buf).await;
                    tokio::time::sleep(delay).await;
                    let body = "sglang:num_running_reqs 3\n";
                    let _ = c
                        .write_all(
                            format!(
                                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                                body.len()
                            )
                            .as_bytes(),
                        )
                        .await;
                });
            }
        });
        (url, n)
    }

    #[tokio::test]
    async fn a_slow_server_holds_a_scrape_no_longer_than_the_wait_and_its_copy_comes_next() {
        let (url, fetched) = slow_metrics_server(Duration::from_millis(400)).await;
        let shared = Arc::new(Shared::default());
        shared.fetch_upstream_from(Some(url));
        let t = Instant::now();
        shared.refresh_upstream().await;
        assert!(
            t.elapsed() < UPSTREAM_WAIT + Duration::from_millis(50),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(shared.upstream_text(), None, "not there yet");
        tokio::time::sleep(Duration::from_millis(500)).await;
        shared.refresh_upstream().await;
        assert_eq!(
            shared.upstream_text().as_deref(),
            Some("sglang:num_running_reqs 3\n")
        );
        assert_eq!(fetched.load(std::sync::atomic::Ordering::SeqCst), 1);
        // a scraper every 5 s finds the copy due, not fresh (5 s less the slack from the start)
        let due = t + UPSTREAM_MAX_AGE - UPSTREAM_SLACK + Duration::from_millis(50);
        tokio::time::sleep(due.saturating_duration_since(Instant::now())).await;
        shared.refresh_upstream().await;
        assert_eq!(fetched.load(std::sync::atomic::Ordering::SeqCst), 2);
        // and a server gone takes its series with it
        shared.fetch_upstream_from(None);
        assert_eq!(shared.upstream_text(), None);
        shared.refresh_upstream().await;
        assert_eq!(fetched.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn abandoned_scrapes_neither_repeat_nor_lose_the_fetch() {
        // A scraper that gives up before the server answers (its timeout, a closed connection)
        // drops the handler's future: the fetch must go on, and must not be asked again at once.
        let (url, fetched) = slow_metrics_server(Duration::from_millis(300)).await;
        let shared = Arc::new(Shared::default());
        shared.fetch_upstream_from(Some(url));
        for _ in 0..10 {
            let _ =
                tokio::time::timeout(Duration::from_millis(20), shared.refresh_upstream()).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(fetched.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(
            shared.upstream_text().as_deref(),
            Some("sglang:num_running_reqs 3\n"),
            "the abandoned fetch's copy is kept for the next scrape"
        );
    }
}
