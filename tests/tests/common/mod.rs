//! Helpers for running the real `sglang-supervisor` binary against the replay server.
#![allow(dead_code, clippy::disallowed_methods, clippy::unwrap_used)]
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A raw HTTP/1.1 POST of `body` to `path` (kept alive, no content type): what a test writes on
/// a socket of its own.
pub fn post_request(path: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/sglang-0.5.14-h200")
        .join(name)
}

/// Write an executable `/bin/sh` script of `body` at `path` (a fake interpreter or server).
#[allow(dead_code)] // not every test binary that includes common uses it
pub fn shell_script(path: &std::path::Path, body: &str) {
    std::fs::write(path, format!("#!/bin/sh\n{body}")).unwrap();
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
}

pub fn supervisor_bin() -> PathBuf {
    // target/<profile>/deps/<test> → target/<profile>/sglang-supervisor
    let mut p = std::env::current_exe().unwrap();
    p.pop();
    p.pop();
    let bin = p.join("sglang-supervisor");
    assert!(
        bin.exists(),
        "{} is missing: build it first (`cargo build --release --workspace --bins`; \
         scripts/test.sh does)",
        bin.display()
    );
    static FRESH: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    FRESH.get_or_init(|| assert_built_after_its_sources(&bin));
    bin
}

/// `cargo test` (`-p sglang-supervisor-tests`, or even `--workspace`) builds this package's
/// binaries, not the supervisor's: a binary older than a source it is built from would pass or
/// fail tests for code that is not there (it happened: a sampler change "tested" on the binary
/// before it).
fn assert_built_after_its_sources(bin: &Path) {
    fn newest(path: &Path, skip: &[&str], found: &mut Option<(std::time::SystemTime, PathBuf)>) {
        let Ok(meta) = std::fs::metadata(path) else {
            return;
        };
        if meta.is_dir() {
            for entry in std::fs::read_dir(path).into_iter().flatten().flatten() {
                let name = entry.file_name();
                if !skip.iter().any(|s| name == **s) {
                    newest(&entry.path(), skip, found);
                }
            }
        } else if let Ok(t) = meta.modified() {
            if found.as_ref().is_none_or(|(newest, _)| t > *newest) {
                *found = Some((t, path.to_path_buf()));
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = None;
    for part in [
        "supervisor",
        "probes",
        "exporters",
        "python",
        "Cargo.toml",
        "Cargo.lock",
    ] {
        newest(
            &root.join(part),
            &["benches", "target", "__pycache__"],
            &mut found,
        );
    }
    let built = std::fs::metadata(bin).and_then(|m| m.modified()).unwrap();
    if let Some((t, source)) = found {
        assert!(
            t <= built,
            "{} is older than {}: build it first (`cargo build --release --workspace --bins`; \
             scripts/test.sh does)",
            bin.display(),
            source.display()
        );
    }
}

/// Compile `tests/stubs/<src>` (stand-ins for libnvidia-ml and librocm_smi64, so the real
/// loading code paths run without a GPU) into a shared library named `name` (once per test binary).
pub fn build_stub(src: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sglsup-stubs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lib = dir.join(name);
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("stubs")
        .join(src);
    let st = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .unwrap();
    assert!(st.success(), "compiling {}", src.display());
    lib
}

/// The NVML stub (`tests/stubs/nvml_stub.c`), for `--nvml-lib`.
pub fn stub_lib() -> &'static PathBuf {
    static LIB: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    LIB.get_or_init(|| build_stub("nvml_stub.c", "libnvidia-ml.so.1"))
}

/// The ROCm SMI stub (`tests/stubs/rocm_smi_stub.c`), for `--rocm-lib`.
pub fn rocm_stub() -> &'static PathBuf {
    static LIB: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    LIB.get_or_init(|| build_stub("rocm_smi_stub.c", "librocm_smi64.so.1"))
}

pub fn replay_bin() -> &'static str {
    env!("CARGO_BIN_EXE_sglang-replay")
}

/// A fresh, empty directory under the temp dir, named for the test and this process.
pub fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sglsup-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A port free now, below Linux's ephemeral range: a port the kernel hands out can be taken by
/// any outgoing connection (every test's HTTP) between this pick and the server's bind.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let seed = std::process::id().wrapping_mul(2654435761);
    loop {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let port = 2000 + (seed.wrapping_add(n.wrapping_mul(7919)) % 10000) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// One supervised replay run in its own temp dir, tagged so its processes can be found.
pub struct Run {
    pub dir: PathBuf,
    pub child: Child,
    pub tag: String,
    pub port: u16,
    started: Instant,
}

pub struct Opts<'a> {
    pub supervisor: &'a [&'a str],
    pub replay: &'a [&'a str],
    /// Extra environment of the supervisor (and so of the server).
    pub env: &'a [(&'a str, &'a str)],
    pub stdout: Stdio,
    pub stderr: Stdio,
    /// Runs in the supervisor's process before exec (close its stdout, ...).
    pub pre_exec: Option<fn() -> std::io::Result<()>>,
    /// A command the supervisor runs under (`unshare -p -f`, ...).
    pub wrap: &'a [&'a str],
    /// A command the server runs under (`ip netns exec NS`: the server on another host).
    pub server_wrap: &'a [&'a str],
}

impl Default for Opts<'_> {
    fn default() -> Self {
        Opts {
            supervisor: &[],
            replay: &[],
            env: &[],
            stdout: Stdio::null(),
            stderr: Stdio::null(),
            pre_exec: None,
            wrap: &[],
            server_wrap: &[],
        }
    }
}

impl Run {
    pub fn start(name: &str, opts: Opts<'_>) -> Run {
        let tag = format!(
            "{name}-{}-{}",
            std::process::id(),
            Instant::now().elapsed().as_nanos()
        );
        let dir = std::env::temp_dir().join(format!("sglsup-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_port();
        let mut cmd = match opts.wrap.split_first() {
            Some((w, rest)) => {
                let mut c = Command::new(w);
                c.args(rest).arg(supervisor_bin());
                c
            }
            None => Command::new(supervisor_bin()),
        };
        cmd.arg("run").arg("--events").arg(dir.join("events.jsonl"));
        if !opts.supervisor.contains(&"--log-file") {
            cmd.arg("--log-file").arg(dir.join("server.log"));
        }
        if let Some(f) = opts.pre_exec {
            // SAFETY: the test's hook only makes async-signal-safe calls.
            unsafe { std::os::unix::process::CommandExt::pre_exec(&mut cmd, f) };
        }
        cmd
            // `{port}` in a supervisor option stands for the replay server's port.
            .args(
                opts.supervisor
                    .iter()
                    .map(|a| a.replace("{port}", &port.to_string())),
            )
            // Tests run in parallel: each gets its own metrics port unless it names one.
            .args(if opts.supervisor.contains(&"--metrics-addr") {
                &[][..]
            } else {
                &["--metrics-addr", "127.0.0.1:0"][..]
            })
            .arg("--")
            .args(opts.server_wrap)
            .arg(replay_bin())
            .arg("--port")
            .arg(port.to_string())
            .arg("--record")
            .arg(dir.join("record.log"))
            .args(opts.replay)
            .envs(opts.env.iter().copied())
            .env("REPLAY_TAG", &tag)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(opts.stdout)
            .stderr(opts.stderr);
        let child = cmd.spawn().unwrap();
        Run {
            dir,
            child,
            tag,
            port,
            started: Instant::now(),
        }
    }

    pub fn events(&self) -> Vec<Value> {
        events_at(&self.dir.join("events.jsonl"))
    }

    pub fn events_named(&self, name: &str) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|e| e["event"] == name)
            .collect()
    }

    /// The messages of the run's warnings so far that contain `needle`.
    pub fn warnings_with(&self, needle: &str) -> Vec<String> {
        self.events_named("warning")
            .iter()
            .filter_map(|w| w["message"].as_str())
            .filter(|m| m.contains(needle))
            .map(String::from)
            .collect()
    }

    /// The first warning that contains `needle`, waited for.
    pub fn wait_warning(&self, needle: &str, timeout: Duration) -> String {
        let end = Instant::now() + timeout;
        loop {
            if let Some(w) = self.warnings_with(needle).into_iter().next() {
                return w;
            }
            assert!(
                Instant::now() < end,
                "no warning with {needle:?} in {timeout:?}: {:#?}",
                self.events_named("warning")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn wait_event(&self, name: &str, timeout: Duration) -> Value {
        wait_event_at(&self.dir.join("events.jsonl"), name, timeout)
    }

    /// Start a run with the latency proxy on a free port (`--proxy-addr 127.0.0.1:0`) and the
    /// replay server at 50× (`opts.supervisor` and `opts.replay` add to those), and wait until it
    /// is ready: the run, the proxy's address and the metrics endpoint's.
    pub fn start_with_proxy(name: &str, opts: Opts<'_>) -> (Run, String, String) {
        let supervisor = [&["--proxy-addr", "127.0.0.1:0"], opts.supervisor].concat();
        let replay = [&["--speed", "50"], opts.replay].concat();
        let run = Run::start(
            name,
            Opts {
                supervisor: &supervisor,
                replay: &replay,
                ..opts
            },
        );
        let t = Duration::from_secs(60);
        let l = run.wait_event("listening", t);
        run.wait_event("ready", t);
        let addr = |k: &str| l[k].as_str().unwrap().to_string();
        (run, addr("proxy"), addr("metrics"))
    }

    /// SIGTERM the supervisor and see it exit as a terminated run does (143) within 60 s.
    pub fn stop_by_sigterm(&mut self) {
        self.signal(libc::SIGTERM);
        assert_eq!(self.wait(Duration::from_secs(60)), 143);
    }

    pub fn signal(&self, sig: i32) {
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// Wait for the supervisor to exit; its exit status.
    pub fn wait(&mut self, timeout: Duration) -> i32 {
        let end = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.code().unwrap_or_else(|| {
                    128 + std::os::unix::process::ExitStatusExt::signal(&st).unwrap_or(0)
                });
            }
            if Instant::now() >= end {
                let _ = self.child.kill();
                panic!(
                    "supervisor still running after {timeout:?}; events: {:#?}",
                    self.events()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Processes (other than the supervisor) that carry this run's tag in their environment.
    pub fn survivors(&self) -> Vec<i32> {
        tagged_processes(&self.tag)
    }

    pub fn assert_no_survivors(&self) {
        // Zombies may take a moment to be reaped by whoever inherits them.
        let end = Instant::now() + Duration::from_secs(2);
        loop {
            let left = self.survivors();
            if left.is_empty() {
                return;
            }
            if Instant::now() >= end {
                for p in &left {
                    unsafe { libc::kill(*p, libc::SIGKILL) };
                }
                panic!("processes of the tree survived: {left:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The log file has exactly the bytes the child wrote (checked by SHA-256 and length).
    pub fn assert_log_is_exact(&self) {
        let (log, rec) = (self.dir.join("server.log"), self.dir.join("record.log"));
        let (a, b) = (file_len(&log), file_len(&rec));
        assert_eq!(a, b, "log file length differs from what the child wrote");
        assert_eq!(
            sha256_file(&log, a),
            sha256_file(&rec, b),
            "log file bytes differ from what the child wrote"
        );
    }

    /// After a fault at byte N, the log holds exactly the child's first N bytes.
    pub fn assert_log_is_a_prefix(&self, log: &std::path::Path) -> (u64, u64) {
        let rec = self.dir.join("record.log");
        let (n, total) = (file_len(log), file_len(&rec));
        assert!(n < total, "the fault cut the log: {n} of {total}");
        assert_eq!(
            sha256_file(log, n),
            sha256_file(&rec, n),
            "the log is the child's first {n} bytes"
        );
        (n, total)
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for p in self.survivors() {
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The events in an events file so far (none while it does not exist).
pub fn events_at(path: &std::path::Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    // Only whole lines: a large event (server_args, 11 KB) may be read while being written.
    let whole = text.rfind('\n').map_or("", |i| &text[..i]);
    whole
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad event line {l:?}: {e}")))
        .collect()
}

/// The first `name` event of an events file, waited for up to `timeout`.
pub fn wait_event_at(path: &std::path::Path, name: &str, timeout: Duration) -> Value {
    let end = Instant::now() + timeout;
    loop {
        if let Some(e) = events_at(path).into_iter().find(|e| e["event"] == name) {
            return e;
        }
        assert!(
            Instant::now() < end,
            "no {name} event within {timeout:?}; events: {:#?}",
            events_at(path)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn sha256(b: &[u8]) -> String {
    format!("{:x}", Sha256::digest(b))
}

pub fn file_len(p: &std::path::Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

/// SHA-256 of the first `n` bytes of a file, streamed (logs of a gigabyte stay out of memory).
pub fn sha256_file(p: &std::path::Path, n: u64) -> String {
    use std::io::Read;
    let mut f = std::fs::File::open(p).unwrap().take(n);
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let k = f.read(&mut buf).unwrap();
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
    }
    format!("{:x}", h.finalize())
}

/// Every process with the tag in its environment, our own helpers included.
pub fn tagged_any(tag: &str) -> Vec<(i32, String, String)> {
    let needle = format!("REPLAY_TAG={tag}");
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or("")
            .to_string();
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .unwrap_or_default()
            .trim()
            .to_string();
        if env.split(|&b| b == 0).any(|kv| kv == needle.as_bytes()) {
            out.push((pid, state, comm));
        }
    }
    out
}

/// Live processes of the run (zombies and our own sentinel left out).
pub fn tagged_processes(tag: &str) -> Vec<i32> {
    tagged_any(tag)
        .into_iter()
        .filter(|(_, state, comm)| state != "Z" && comm != "sglang-supervis")
        .map(|(pid, _, _)| pid)
        .collect()
}

/// RFC 3339 `2026-12-02T11:07:26.739155Z` → ns since the epoch.
pub fn humantime_to_ns(ts: &str) -> u128 {
    let (date, time) = ts.trim_end_matches('Z').split_once('T').unwrap();
    let d: Vec<i64> = date.split('-').map(|x| x.parse().unwrap()).collect();
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let t: Vec<i64> = hms.split(':').map(|x| x.parse().unwrap()).collect();
    let (y, m, day) = (d[0], d[1], d[2]);
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    let secs = days * 86400 + t[0] * 3600 + t[1] * 60 + t[2];
    let frac_ns: u128 = format!("{frac:0<9}")[..9].parse().unwrap();
    secs as u128 * 1_000_000_000 + frac_ns
}

/// `sglang-supervisor flags ARGS`, with its info messages on stderr (which way the module ran).
pub fn flags(args: &[&str]) -> std::process::Output {
    Command::new(supervisor_bin())
        .arg("flags")
        .args(args)
        .env("RUST_LOG", "info")
        .output()
        .unwrap()
}

/// A finished command's output, held to have succeeded:
/// `cmd.output().unwrap().expect_success(what)`.
pub trait ExpectSuccess {
    /// The output itself; a failure panics naming `what`, the exit status and both streams.
    fn expect_success(self, what: &str) -> Output;
}

impl ExpectSuccess for Output {
    #[track_caller]
    fn expect_success(self, what: &str) -> Output {
        assert!(
            self.status.success(),
            "{what}: {}; stderr: {}; stdout: {}",
            self.status,
            String::from_utf8_lossy(&self.stderr).trim_end(),
            String::from_utf8_lossy(&self.stdout).trim_end()
        );
        self
    }
}

/// The JSON a command printed; a failure shows both of its streams.
pub fn json_of(o: &std::process::Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {} / {}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

/// Events carrying output in a stream of `n` tokens where every `merge`th event holds two.
pub fn output_events(n: u64, merge: u64) -> u64 {
    let (mut done, mut events) = (0, 0);
    while done < n {
        events += 1;
        done += if events % merge == 0 { 2 } else { 1 }.min(n - done);
    }
    events
}

/// One request of the endpoint matrix.
pub struct Case {
    pub path: &'static str,
    pub body: String,
    pub streamed: bool,
    /// The server's answer carries token counts (not an OpenAI stream that did not ask).
    pub counted: bool,
}

/// Every generation endpoint, streamed and not, usage asked for or not, `n` tokens each (the
/// matrix the proxy and the tap are both held to).
pub fn matrix(n: u64) -> Vec<Case> {
    let gen = |stream: bool| {
        format!(
            r#"{{"text":"a b c d","sampling_params":{{"max_new_tokens":{n}}},"stream":{stream}}}"#
        )
    };
    let cmpl =
        |extra: &str| format!(r#"{{"model":"m","prompt":"a b c d","max_tokens":{n}{extra}}}"#);
    let chat = |extra: &str| {
        format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"a b c d"}}],"max_tokens":{n}{extra}}}"#
        )
    };
    let stream = r#","stream":true"#;
    let usage = r#","stream":true,"stream_options":{"include_usage":true}"#;
    let continuous =
        r#","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}"#;
    let case = |path, body, streamed, counted| Case {
        path,
        body,
        streamed,
        counted,
    };
    vec![
        case("/generate", gen(true), true, true),
        case("/generate", gen(false), false, true),
        case("/v1/completions", cmpl(stream), true, false),
        case("/v1/completions", cmpl(usage), true, true),
        case("/v1/completions", cmpl(continuous), true, true),
        case("/v1/completions", cmpl(""), false, true),
        case("/v1/chat/completions", chat(stream), true, false),
        case("/v1/chat/completions", chat(usage), true, true),
        case("/v1/chat/completions", chat(""), false, true),
    ]
}

/// linux/capability.h's bit of CAP_NET_RAW (not in the libc crate).
pub const CAP_NET_RAW: u32 = 13;

/// Whether this process may open a packet socket (CAP_NET_RAW effective).
pub fn has_net_raw() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_NET_RAW) != 0)
}

/// Another host, as far as this machine's routing goes: a network namespace joined to ours by
/// a veth pair, its end at `there`, ours at `here`. Its clients come in on the veth, never on
/// `lo`, and their address is no address of this machine. Gone (with the pair) on drop.
pub struct OtherHost {
    names: Namespaces,
    pub here: String,
    pub there: String,
    /// This machine's end of the link to it.
    pub iface: String,
}

impl OtherHost {
    /// `None`, said as SKIPPED for `test`, where namespaces cannot be made (no CAP_SYS_ADMIN or
    /// CAP_NET_ADMIN, no `ip`).
    pub fn new(test: &str) -> Option<OtherHost> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 60;
        let pid = std::process::id();
        if Command::new("curl").arg("--version").output().is_err() {
            eprintln!("SKIPPED {test}: no curl to be the other host's client (scripts/setup.sh installs it)");
            return None;
        }
        let ns = format!("sglsup-{pid}-{n}");
        // 198.18.0.0/15 is for benchmarking networks: a /30 per namespace, told apart by the
        // process (512 apart) and the namespace within it.
        let block = (pid % 512) * 64 + n;
        let at = |i: u32| std::net::Ipv4Addr::from(0xC612_0000 + block * 4 + i).to_string();
        let (here, there) = (at(1), at(2));
        let veth_here = format!("sg{}h{n}", pid % 100_000);
        let steps = [
            format!("link add {veth_here} type veth peer name eth1 netns {ns}"),
            format!("addr add {here}/30 dev {veth_here}"),
            format!("link set {veth_here} up"),
            format!("-n {ns} addr add {there}/30 dev eth1"),
            format!("-n {ns} link set eth1 up"),
            format!("-n {ns} link set lo up"),
        ]
        .map(|w| w.split(' ').map(String::from).collect());
        let host = OtherHost {
            names: Namespaces::make(test, &[ns], &steps)?,
            here,
            there,
            iface: veth_here,
        };
        Some(host)
    }

    /// POST `body` to `http://{addr}{path}` from the other host: the HTTP status ("000" for
    /// none).
    pub fn post(&self, addr: &str, path: &str, body: &str) -> String {
        self.curl(
            &["-H", "content-type: application/json", "-d", body],
            addr,
            path,
        )
    }

    /// `ip netns exec NS`: what a command runs after to run on the other host.
    pub fn run_there(&self) -> [&str; 4] {
        ["ip", "netns", "exec", &self.names.0[0]]
    }

    /// GET `http://{addr}{path}` from the other host: the HTTP status.
    pub fn get(&self, addr: &str, path: &str) -> String {
        self.curl(&[], addr, path)
    }

    fn curl(&self, args: &[&str], addr: &str, path: &str) -> String {
        curl_in(&self.names.0[0], args, addr, path)
    }
}

/// `http://{addr}{path}` by curl in namespace `ns`: the HTTP status ("000" for none).
fn curl_in(ns: &str, args: &[&str], addr: &str, path: &str) -> String {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "curl",
            "-s",
            "-o",
            "/dev/null",
            "-m",
            "30",
        ])
        .args(["-w", "%{http_code}"])
        .args(args)
        .arg(format!("http://{addr}{path}"))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A process a test starts beside the run (a relay, say), its output thrown away, killed when
/// dropped: a failing test's panic leaves none behind holding the harness's pipes.
pub struct Beside(std::process::Child);

impl Beside {
    pub fn start(program: &str, args: &[&str]) -> Beside {
        Beside(
            Command::new(program)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    }
}

impl Drop for Beside {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Network namespaces made by `ip` steps, all deleted on drop (their links with them); None,
/// said as SKIPPED for `test`, where a step fails (no CAP_NET_ADMIN, no `ip`).
struct Namespaces(Vec<String>);

impl Namespaces {
    fn make(test: &str, names: &[String], steps: &[Vec<String>]) -> Option<Namespaces> {
        remove_stale_namespaces();
        let made = Namespaces(Vec::new());
        let made = names.iter().try_fold(made, |mut made, ns| {
            made.0.push(ns.clone());
            ip_step(test, &["netns", "add", ns]).then_some(made)
        })?;
        for step in steps {
            let step: Vec<&str> = step.iter().map(String::as_str).collect();
            if !ip_step(test, &step) {
                return None; // drop removes what was made
            }
        }
        Some(made)
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

/// One `ip` command; false, said as SKIPPED for `test`, where it fails.
fn ip_step(test: &str, step: &[&str]) -> bool {
    let out = Command::new("ip").args(step).output();
    if out.as_ref().is_ok_and(|o| o.status.success()) {
        return true;
    }
    let why = out.map_or_else(
        |e| e.to_string(),
        |o| String::from_utf8_lossy(&o.stderr).trim().to_string(),
    );
    eprintln!(
        "SKIPPED {test}: no namespaces to be had here (`ip {}`: {why})",
        step.join(" ")
    );
    false
}

/// A router between two other hosts, each a network namespace of its own: the client's
/// ([`Router::CLIENT`]) reaches the router at [`Router::FRONT`], the router reaches the
/// server's at [`Router::SERVER`] from [`Router::BACK`]; forwarding is on in the router's
/// namespace alone. Gone on drop.
pub struct Router {
    names: Namespaces,
}

impl Router {
    pub const CLIENT: &'static str = "10.77.1.2";
    pub const FRONT: &'static str = "10.77.1.1";
    /// The router's address on the server's side (a masquerading router's for its clients').
    pub const BACK: &'static str = "10.77.2.1";
    pub const SERVER: &'static str = "10.77.2.2";

    pub fn new(test: &str) -> Option<Router> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pid = std::process::id();
        let [r, c, s] = ["r", "c", "s"].map(|k| format!("sglsup-{pid}-{k}{n}"));
        let v = |words: &str| -> Vec<String> {
            let words = words
                .replace("{r}", &r)
                .replace("{c}", &c)
                .replace("{s}", &s);
            words.split(' ').map(String::from).collect()
        };
        let steps = [
            "-n {r} link add fa type veth peer name eth1 netns {c}",
            "-n {r} link add fb type veth peer name eth1 netns {s}",
            "-n {r} addr add 10.77.1.1/30 dev fa",
            "-n {r} addr add 10.77.2.1/30 dev fb",
            "-n {c} addr add 10.77.1.2/30 dev eth1",
            "-n {s} addr add 10.77.2.2/30 dev eth1",
            "-n {r} link set fa up",
            "-n {r} link set fb up",
            "-n {r} link set lo up",
            "-n {c} link set eth1 up",
            "-n {c} link set lo up",
            "-n {s} link set eth1 up",
            "-n {s} link set lo up",
            "-n {c} route add default via 10.77.1.1",
            "-n {s} route add default via 10.77.2.1",
            "netns exec {r} sysctl -qw net.ipv4.ip_forward=1",
        ]
        .map(v);
        let names = Namespaces::make(test, &[r, c, s], &steps)?;
        Some(Router { names })
    }

    /// `ip netns exec NS` for the router's (0), the client's (1) or the server's (2).
    fn exec(&self, k: usize) -> [&str; 4] {
        ["ip", "netns", "exec", &self.names.0[k]]
    }

    /// What a command runs after to run on the router.
    pub fn on_router(&self) -> [&str; 4] {
        self.exec(0)
    }

    /// What a command runs after to run on the server's host.
    pub fn on_server(&self) -> [&str; 4] {
        self.exec(2)
    }

    /// Loads nftables `rules` in the router (`nft -f -`); the error where it fails.
    pub fn nft(&self, rules: &str) -> Result<(), String> {
        use std::io::Write;
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.names.0[0], "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| e.to_string())?;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(rules.as_bytes())
            .map_err(|e| e.to_string())?;
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        out.status
            .success()
            .then_some(())
            .ok_or_else(|| String::from_utf8_lossy(&out.stderr).into_owned())
    }

    /// POST `body` to `http://{addr}{path}` from the client's host: the HTTP status.
    pub fn client_post(&self, addr: &str, path: &str, body: &str) -> String {
        curl_in(
            &self.names.0[1],
            &["-H", "content-type: application/json", "-d", body],
            addr,
            path,
        )
    }
}

/// Namespaces of test processes that are gone (killed before their drop ran).
fn remove_stale_namespaces() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let pid = name
            .strip_prefix("sglsup-")
            .and_then(|r| r.split('-').next());
        if pid.is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists()) {
            let _ = Command::new("ip").args(["netns", "del", name]).output();
        }
    }
}
