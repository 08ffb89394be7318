//! Command line (the contract is in DESIGN.md: names here are relied on by scripts).
use clap::error::ErrorKind;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(
    name = "sglang-supervisor",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("SGLANG_SUPERVISOR_COMMIT"), ")"),
    about = "Supervise an SGLang server: launch, lossless log tee, log parsing, readiness, fail-fast, teardown",
    long_about = None,
    after_help = "Every option can also be set in the environment, as its [env: ...] says; a \
                  switch there is true or false (yes or no, on or off, 1 or 0), and empty is unset."
)]
pub struct Cli {
    /// Format of the supervisor's own messages on stderr (filter them with RUST_LOG).
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "SGLANG_SUPERVISOR_LOG_FORMAT"
    )]
    pub log_format: LogFormat,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run COMMAND (the SGLang server) under supervision until it exits or is stopped.
    ///
    /// Exit status: the child's code (128+N if it died of signal N); 128+N after a stop you asked
    /// for with signal N (143 for SIGTERM), even though SGLang ends its drain by SIGKILLing itself;
    /// 1 when a fatal log line made us stop a live server; 124 not ready within --ready-timeout;
    /// 125 the supervisor itself failed (bad options, spawn failed, log file unwritable).
    Run(Box<RunArgs>),

    /// One reading of every GPU: index, uuid, name, power, energy, memory, utilization,
    /// temperature, clocks, compute processes. Absent readings are left out, never 0.
    /// With `auto` or `none` and no GPU: `[]` and exit 0; a named backend that cannot load: exit 125.
    Probe(ProbeArgs),

    /// SGLang's launch flags: audit a launch (or a bash recipe) against a version's real parser,
    /// diff two versions, dump a schema. SOURCE is a python3 or a venv (import mode: its SGLang is
    /// imported and its real parser read), a .whl or a source tree (static mode: read with
    /// Python's ast, nothing imported), or a saved schema .json.
    #[command(subcommand)]
    Flags(FlagsCommand),

    /// Wait until a server is ready: follow a supervisor's --events file (ready → 0, failed →
    /// its exit status with the diagnosis on stderr) or poll a URL (/ready, else /health).
    /// Not ready within --timeout: 124.
    Wait(WaitArgs),

    /// Compare two runs, in any pairing of: bench_serving result files as written (JSON lines,
    /// `Infinity`/`NaN`, with or without --output-details), InferenceX raw or aggregated result
    /// JSON (one result or the array), our --report files.
    ///
    /// Each bench_serving line is a window named by its --max-concurrency (c32, c64; `rps4` by
    /// request rate without one); a rerun at the same concurrency appended later replaces the
    /// earlier line (the last line is the run). InferenceX results are windows by `conc`, a
    /// report's windows by name. Windows are matched by name; those on one side only are listed;
    /// one window against one window is compared whatever their names.
    ///
    /// Per matched window: metric, baseline, candidate, signed delta, better/worse, or ≈ inside
    /// the --noise band; latencies in ms (seconds inputs converted). Then identity changes
    /// (SGLang version, image), resolved args that changed, by path for nested ones
    /// (`cuda_graph_config.decode.backend: full → disabled`; a bench_serving file carries them
    /// in server_info), new/gone deprecations, startup time. A different model, GPU count,
    /// ISL/OSL or precision is refused (one line naming the field, exit 2) unless --force.
    Compare(CompareArgs),

    /// Rebuild a run's --report JSON from its --events file, and with --bench-result add a window
    /// over exactly the benchmark's own span: request figures from the requests log, power from
    /// the power CSV with InferenceX's rules (aggregate_power.py: trapezoid interpolated at the
    /// span's edges, 3 s gap limit, no bracketing slack, its reason codes), the hardware counter
    /// beside it (from the CSV's `_energy.csv` sidecar). Prints the JSON (or writes --output).
    /// Exit 0; 2 for bad input (a file that cannot be read or is not what it should be).
    Report(ReportArgs),

    /// Print a completion script for SHELL, e.g.
    /// `sglang-supervisor completions bash > /etc/bash_completion.d/sglang-supervisor`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },

    /// Print the man page (roff), e.g. `sglang-supervisor man > /usr/local/share/man/man1/sglang-supervisor.1`.
    Man,

    /// Internal: the watchdog that kills the server's tree if the supervisor dies.
    #[command(hide = true, name = "__sentinel")]
    Sentinel {
        /// The run's marker variable (see proctree).
        #[arg(long)]
        marker: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum FlagsCommand {
    /// One verdict per flag: ok, alias, abbrev, deprecated, ambiguous, unknown, removed,
    /// invalid_choice, missing_value. Exit 0 all fine, 1 deprecations (or SGLANG_* variables the version ignores), 2 the launch would fail.
    Audit(FlagsAuditArgs),
    /// Option strings added and removed, new deprecations, changed defaults/choices/arity/type.
    Diff(FlagsDiffArgs),
    /// The schema, normalised (option strings, dest, canonical, aliases, nargs, choices, deprecation).
    Dump(FlagsDumpArgs),
}

#[derive(Debug, Args)]
pub struct FlagsAuditArgs {
    /// The SGLang version to check against. SOURCE is a python3 or a venv (import mode: its
    /// SGLang is imported and its real parser read), a .whl or an unpacked source /
    /// site-packages tree (static mode: sources read with Python's ast, nothing imported, no
    /// torch needed), or a saved schema .json.
    #[arg(
        long,
        env = "SGLANG_SUPERVISOR_SGLANG",
        value_name = "SOURCE",
        default_value = "python3"
    )]
    pub sglang: String,
    /// The version the recipe worked with: names removed flags and where they went.
    #[arg(long, value_name = "SOURCE", env = "SGLANG_SUPERVISOR_FLAGS_BASELINE")]
    pub baseline: Option<String>,
    #[arg(
        long,
        value_enum,
        default_value = "text",
        env = "SGLANG_SUPERVISOR_FLAGS_FORMAT"
    )]
    pub format: CompareFormat,
    /// A bash recipe with the launch in it (`python3 -m sglang.launch_server ...` / `sglang serve ...`);
    /// `-` reads it from stdin.
    #[arg(value_name = "RECIPE.sh")]
    pub recipe: Option<PathBuf>,
    /// Or the launch arguments themselves, after `--`.
    #[arg(last = true, value_name = "ARGS")]
    pub args: Vec<String>,
    #[command(flatten)]
    pub python: PythonPlacement,
}

#[derive(Debug, Args)]
pub struct PythonPlacement {
    /// Run the introspection module in a subprocess of the Python (python3 on PATH for static
    /// mode) instead of the interpreter embedded in this binary. Automatic when the target
    /// interpreter's version differs from the embedded one, or the binary has none.
    #[arg(long, env = "SGLANG_SUPERVISOR_FLAGS_SUBPROCESS", value_parser = switch)]
    pub subprocess: bool,
}

#[derive(Debug, Args)]
pub struct FlagsDiffArgs {
    #[arg(long, value_name = "SOURCE", env = "SGLANG_SUPERVISOR_FLAGS_FROM")]
    pub from: String,
    #[arg(long, value_name = "SOURCE", env = "SGLANG_SUPERVISOR_FLAGS_TO")]
    pub to: String,
    #[arg(
        long,
        value_enum,
        default_value = "text",
        env = "SGLANG_SUPERVISOR_FLAGS_FORMAT"
    )]
    pub format: CompareFormat,
    #[command(flatten)]
    pub python: PythonPlacement,
}

#[derive(Debug, Args)]
pub struct FlagsDumpArgs {
    #[arg(
        long,
        env = "SGLANG_SUPERVISOR_SGLANG",
        value_name = "SOURCE",
        default_value = "python3"
    )]
    pub sglang: String,
    #[arg(
        long,
        value_enum,
        default_value = "json",
        env = "SGLANG_SUPERVISOR_FLAGS_FORMAT"
    )]
    pub format: CompareFormat,
    /// Print the parser's actions as read (argparse's fields, the shape of a saved dump, usable
    /// as a SOURCE later), with the SGLANG_* variables and, in import mode, the timings.
    #[arg(long, env = "SGLANG_SUPERVISOR_FLAGS_RAW", value_parser = switch)]
    pub raw: bool,
    #[command(flatten)]
    pub python: PythonPlacement,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CompareFormat {
    Text,
    Markdown,
    Json,
}

/// `compare --format`: the table formats, or a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CompareOutput {
    Text,
    Markdown,
    Json,
    /// A page: the Markdown table above the two runs side by side (start-up, batch series).
    Html,
}

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// A bench_serving result file (.jsonl), an InferenceX result or aggregate (.json), or a
    /// --report of ours.
    pub baseline: PathBuf,
    /// The same kinds as BASELINE, in any pairing with it.
    pub candidate: PathBuf,
    #[arg(
        long,
        value_enum,
        default_value = "text",
        env = "SGLANG_SUPERVISOR_COMPARE_FORMAT"
    )]
    pub format: CompareOutput,
    /// Compare even when model, GPU count, ISL/OSL or precision differ. Models are matched by
    /// their last path component (`/models/X` and `org/X` are the same model).
    #[arg(long, env = "SGLANG_SUPERVISOR_COMPARE_FORCE", value_parser = switch)]
    pub force: bool,
    /// The noise band in percent: a change whose size is within it prints ≈, not better/worse.
    #[arg(long, value_name = "PCT", default_value_t = 1.0, value_parser = parse_noise, env = "SGLANG_SUPERVISOR_COMPARE_NOISE")]
    pub noise: f64,
}

fn parse_noise(s: &str) -> Result<f64, String> {
    match s.trim_end_matches('%').parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
        _ => Err(format!(
            "expected a percentage >= 0 such as 1 or 2.5, got {s:?}"
        )),
    }
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The --events file of the run (JSON lines).
    #[arg(long, value_name = "FILE", env = "SGLANG_SUPERVISOR_EVENTS")]
    pub events: PathBuf,

    /// A benchmark result: bench_serving's (`--output-file`, JSON lines: the last line) or
    /// InferenceX benchmark_serving.py's (`--save-result`). Its span is
    /// `benchmark_start_time_unix` → `benchmark_end_time_unix` when present; else (SGLang's
    /// bench_serving) its `duration`, ending at the end of the last request in --requests-log.
    #[arg(long, value_name = "FILE", env = "SGLANG_SUPERVISOR_BENCH_RESULT")]
    pub bench_result: Option<PathBuf>,

    /// The run's --requests-log: request figures over the benchmark's span come from it.
    #[arg(long, value_name = "FILE", env = "SGLANG_SUPERVISOR_REQUESTS_LOG")]
    pub requests_log: Option<PathBuf>,

    /// The run's --power-csv (or any nvidia-smi --format=csv capture with timestamp, index and
    /// power.draw): power over the benchmark's span. Naive timestamps are read as UTC (what `run`
    /// writes). The counter readings are read from `<stem>_energy.csv` next to it when present.
    #[arg(long, value_name = "FILE", env = "SGLANG_SUPERVISOR_POWER_CSV")]
    pub power_csv: Option<PathBuf>,

    /// GPUs the server used (InferenceX's expected_num_gpus, tp × pp). Default: from the
    /// events' server_args; unknown leaves the count unchecked.
    #[arg(long, value_name = "N", env = "SGLANG_SUPERVISOR_EXPECTED_GPUS")]
    pub expected_gpus: Option<usize>,

    /// Name of the benchmark's window in the report.
    #[arg(
        long,
        default_value = "bench",
        value_name = "NAME",
        env = "SGLANG_SUPERVISOR_REPORT_NAME"
    )]
    pub name: String,

    /// Write the report here instead of printing it.
    #[arg(
        long,
        short,
        value_name = "FILE",
        env = "SGLANG_SUPERVISOR_REPORT_OUTPUT"
    )]
    pub output: Option<PathBuf>,

    /// Also write the report as one self-contained HTML page here (plots from --power-csv and
    /// --requests-log when given).
    #[arg(
        long,
        value_name = "FILE",
        env = "SGLANG_SUPERVISOR_REPORT_HTML_OUTPUT"
    )]
    pub html: Option<PathBuf>,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["events", "url"])))]
pub struct WaitArgs {
    /// The --events file of a running `sglang-supervisor run` (it may not exist yet).
    #[arg(long, value_name = "FILE", env = "SGLANG_SUPERVISOR_WAIT_EVENTS")]
    pub events: Option<PathBuf>,

    /// The server's base URL, e.g. http://127.0.0.1:30000.
    #[arg(long, value_name = "URL", env = "SGLANG_SUPERVISOR_WAIT_URL")]
    pub url: Option<String>,

    #[arg(long, default_value = "60m", value_parser = parse_timeout, value_name = "DUR", env = "SGLANG_SUPERVISOR_WAIT_TIMEOUT")]
    pub timeout: Duration,

    /// With --url: the server's --api-key (its /ready and /model_info answer 401 without it).
    #[arg(
        long,
        env = "SGLANG_SUPERVISOR_API_KEY",
        value_name = "KEY",
        hide_env_values = true
    )]
    pub api_key: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GpuBackendArg {
    /// The first of NVML, ROCm SMI, sysfs that sees a GPU; else none.
    Auto,
    /// NVIDIA NVML (libnvidia-ml.so.1, loaded at run time).
    Nvml,
    /// AMD ROCm SMI (librocm_smi64, loaded at run time).
    Rocm,
    /// AMD amdgpu sysfs files (no energy counter: energy is integrated from power).
    Sysfs,
    /// No GPU sampling.
    None,
}

/// GPU options shared by `run` and `probe`.
#[derive(Debug, Clone, Args)]
pub struct GpuArgs {
    /// Which GPU library to read.
    #[arg(
        long,
        value_enum,
        default_value = "auto",
        env = "SGLANG_SUPERVISOR_GPU_BACKEND"
    )]
    pub gpu_backend: GpuBackendArg,

    /// Load NVML from this file instead of the system's libnvidia-ml.so.1.
    #[arg(long, env = "SGLANG_SUPERVISOR_NVML_LIB", value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,

    /// Load ROCm SMI from this file instead of librocm_smi64.so.{1,7} / /opt/rocm/lib.
    #[arg(long, env = "SGLANG_SUPERVISOR_ROCM_LIB", value_name = "PATH")]
    pub rocm_lib: Option<PathBuf>,

    /// Root of the sysfs tree read by the sysfs backend (for tests and containers).
    #[arg(
        long,
        env = "SGLANG_SUPERVISOR_SYSFS_ROOT",
        value_name = "DIR",
        hide = true
    )]
    pub sysfs_root: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ProbeArgs {
    #[command(flatten)]
    pub gpu: GpuArgs,

    /// Print a JSON array instead of a table.
    #[arg(long, env = "SGLANG_SUPERVISOR_PROBE_JSON", value_parser = switch)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReadyOn {
    /// SGLang's ready line, confirmed at once by one HTTP request (`/ready`, else `/model_info`).
    Log,
    /// Poll `/health` at most once a second (for servers that print no ready line).
    Http,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Write all child output here, byte for byte, stdout and stderr interleaved in arrival order.
    #[arg(long, env = "SGLANG_SUPERVISOR_LOG_FILE", value_name = "PATH")]
    pub log_file: Option<PathBuf>,

    /// Write lifecycle events here as JSON lines (spawned, phase, server_args, ready, fatal, exited...).
    #[arg(long, env = "SGLANG_SUPERVISOR_EVENTS", value_name = "PATH")]
    pub events: Option<PathBuf>,

    /// Give up if the server is not ready within this long (e.g. 90s, 20m, 1h): tear down, exit 124.
    #[arg(long, default_value = "60m", value_parser = parse_timeout, env = "SGLANG_SUPERVISOR_READY_TIMEOUT", value_name = "DUR")]
    pub ready_timeout: Duration,

    /// After forwarding a stop signal, wait this long before SIGKILLing the whole process tree.
    #[arg(long, default_value = "30s", value_parser = parse_duration, env = "SGLANG_SUPERVISOR_GRACE", value_name = "DUR")]
    pub grace: Duration,

    /// How readiness is decided.
    #[arg(
        long,
        value_enum,
        default_value = "log",
        env = "SGLANG_SUPERVISOR_READY_ON"
    )]
    pub ready_on: ReadyOn,

    /// Server base URL for readiness checks. Default: --host/--port of the launch in COMMAND
    /// (`… python3 -m sglang.launch_server ARGS`, `sglang serve ARGS`: a wrapper's own flags
    /// in front of it are not read), else found anywhere in COMMAND, spelled any way SGLang's
    /// argparse takes them (`--port=N`, `--po N`; the last one given; a wrapper's `--` ends
    /// nothing) (0.0.0.0 means 127.0.0.1), else SGLang's default
    /// http://127.0.0.1:30000. A port set in a script COMMAND runs (`bash recipe.sh`, `--port
    /// $PORT`; what bash makes of it is unknown here) or in the launch's `--config` file is not
    /// read: the run says so at start, and again if the server's log names another port.
    #[arg(long, env = "SGLANG_SUPERVISOR_HEALTH_URL", value_name = "URL")]
    pub health_url: Option<String>,

    /// The server's address as the proxy's upstream (also used for readiness when --health-url is unset).
    #[arg(long, env = "SGLANG_SUPERVISOR_UPSTREAM", value_name = "URL")]
    pub upstream: Option<String>,

    /// Forward stop signals to the server's whole process group instead of its main process.
    /// (SGLang drains from its main process, whose workers must keep running meanwhile.)
    #[arg(long, env = "SGLANG_SUPERVISOR_SIGNAL_GROUP", value_parser = switch)]
    pub signal_group: bool,

    /// Run this shell command once when the server is ready (e.g. start the benchmark). If it
    /// fails while the server runs (a nonzero exit, a signal), that is a warning of the run, in
    /// its events and report; the run's exit status stays the server's.
    #[arg(long, env = "SGLANG_SUPERVISOR_ON_READY", value_name = "CMD")]
    pub on_ready: Option<String>,

    /// Serve Prometheus metrics (/metrics, /-/ready, /-/healthy) here; `none` disables.
    /// Port 0 picks a free port (the `listening` event says which); `:PORT` is loopback. Name
    /// a host (0.0.0.0) to expose it beyond the machine (in a container: 0.0.0.0:19400).
    /// A named address that is taken fails the start (125, naming the holder); the default,
    /// taken, moves to the next free of the 16 ports after it (said in the `listening` event).
    /// Unless the server runs without `--enable-metrics`, a scrape here also fetches the
    /// server's own `sglang:*` series (about every 5 s at most, waiting 100 ms at most for them;
    /// never while nobody scrapes).
    ///
    /// [default: 127.0.0.1:19400]
    #[arg(long, env = "SGLANG_SUPERVISOR_METRICS_ADDR", value_name = "ADDR")]
    pub metrics_addr: Option<String>,

    /// Serve a latency-measuring reverse proxy in front of the server here (off by default);
    /// point the benchmark client at it. Port 0 picks a free port (see the `listening` event);
    /// `:PORT` is loopback. The server's own port is refused before launching (125). A generation
    /// request that the server's access log shows going straight to the server, not through
    /// the proxy, is a warning in the run's events and report, and the run's end says how many
    /// such requests went unmeasured: from a client elsewhere, from this machine's own address,
    /// and, where the proxy reaches the server at an IPv4 loopback address (its connections
    /// then come from 127.0.0.2, as the server's log shows; not with --upstream, nor where
    /// 127.0.0.2 cannot be bound), from any other loopback address once the server has logged
    /// its ready line (after its warm-up). That count is a floor: with N tokenizer workers, the
    /// first N-1 such requests are taken for the other workers' warm-ups; loopback clients are
    /// not counted before the server's arguments are logged, nor after a second server start in
    /// the run or a worker started again once ready (a worker lost or begun, a ready line more
    /// than the workers), nor where the log's uvicorn listens on another port than the one
    /// measured (a router's worker), nor where ready came by HTTP before the ready line; and once a proxied
    /// request names a client of its own with a port (X-Forwarded-For, Forwarded), which a
    /// server trusting it logs instead of the proxy, nothing more is counted. Where the count
    /// stops, the run says so on stderr, and why.
    #[arg(long, env = "SGLANG_SUPERVISOR_PROXY_ADDR", value_name = "ADDR")]
    pub proxy_addr: Option<String>,

    /// Measure the server's generation requests from a copy of its TCP traffic instead of a
    /// proxy: the client talks to the server's own port with nothing in between, and the same
    /// figures (requests log, request_* series, windows, report) come from the segments' kernel
    /// time stamps. Needs CAP_NET_RAW (root, or a container's default NET_RAW). An OpenAI stream
    /// whose client did not ask for usage has no token counts this way (null; the proxy asks).
    /// A keep-alive connection already open when the tap starts is measured from its next
    /// request (the one in flight then is not seen). The server pays for the kernel's copy of
    /// each segment in its own send: on SGLang's native stream (every chunk resends the text so
    /// far) against a saturated server, about 1 % of its HTTP process's CPU and some 3 % of its
    /// throughput (0.1 to 6 %; H100 host, c=128); on OpenAI chat streams (InferenceX's path)
    /// 0.6 % of that CPU, yet some 3 % of the throughput (0.9 to 4.6 %; H100 hosts, c=128, nine
    /// runs), part of it as more time in the server's own code (not measured where that process
    /// has headroom: a GPU-bound model).
    /// The kernel's ring is SGLANG_SUPERVISOR_TAP_RING_MB MiB (1 to 4096, default 32; a value
    /// out of range, here or in the readers' count below, is refused: 125); what it
    /// has no room for is counted (tap_dropped_packets_total) and its requests end as errors.
    /// With CAP_SYS_NICE (root has it; a container needs `--cap-add SYS_NICE`) the reading
    /// thread is raised (nice −10, then SCHED_FIFO 1) while blocks of segments queue.
    /// SGLANG_SUPERVISOR_TAP_READERS=N (1 to 16, default 1) reads with N threads, each with a
    /// ring of that size, the kernel hashing each connection to one of them: for more segments
    /// a second than one thread reads (where the kernel refuses the group, one reader). On a
    /// 16-core host one reader lost segments at 512k a second, four kept every one.
    /// SGLANG_SUPERVISOR_TAP=0 (false, no, off) is --tap not given.
    #[arg(long, env = "SGLANG_SUPERVISOR_TAP", value_parser = switch)]
    pub tap: bool,

    /// With --tap: where the copy is taken: `lo` (clients on this machine), `any` (clients on
    /// other hosts too), or an interface's name. With `any`, a connection this machine
    /// translates on its way to a container (a DNAT rule publishing its port to other hosts,
    /// with or without masquerade or SNAT of the client's address) passes twice, before and
    /// after translation: the copy (the same first sequence number, with the same TCP
    /// timestamp or client port, and another client or server address) is not measured,
    /// counted in tap_copied_connections_total and said once (a connection begun before the
    /// tap too, from the request it is joined at). A client that sends no TCP timestamps
    /// (Windows' default) is known by its port alone: where NAT changed that too, its copy is
    /// measured twice. A relay's onward leg (docker-proxy's, for clients on this machine) is a
    /// connection of its own: `any` measures both legs, `lo` the client's alone. A run whose
    /// tap read nothing there (not even our own readiness request) says so in its warnings and
    /// report; so does one whose server's access log shows a generation request the tap did not see
    /// (on `lo`, from a client elsewhere; on a named interface, from this machine's own addresses,
    /// loopback included once the server is ready, as for --proxy-addr: their requests cross lo),
    /// and at its end how many such requests went unmeasured.
    #[arg(
        long,
        env = "SGLANG_SUPERVISOR_TAP_INTERFACE",
        value_name = "IFACE",
        default_value = "lo"
    )]
    pub tap_interface: String,

    /// With --proxy-addr or --tap: one JSON line per measured generation request (ttft_s,
    /// tpot_s, e2e_s, itl_s, token counts, error), flushed per line.
    #[arg(long, env = "SGLANG_SUPERVISOR_REQUESTS_LOG", value_name = "PATH")]
    pub requests_log: Option<PathBuf>,

    /// With --proxy-addr or --tap: a measurement window that follows the request traffic, from
    /// the first generation request to the moment the last one finished (reported as
    /// `proxy-traffic`).
    #[arg(long, env = "SGLANG_SUPERVISOR_WINDOW_FROM_PROXY", value_parser = switch)]
    pub window_from_proxy: bool,

    #[command(flatten)]
    pub gpu: GpuArgs,

    /// GPU sampling period (instant and average power, memory, utilization, clocks).
    #[arg(long, default_value = "100ms", value_parser = parse_interval, env = "SGLANG_SUPERVISOR_SAMPLE_INTERVAL", value_name = "DUR")]
    pub sample_interval: Duration,

    /// How often the (costly, ~3.6 ms on an H200) energy counter is read between the window's
    /// edges, where it is always read. The window's energy is exact whatever this is.
    #[arg(long, default_value = "5s", value_parser = parse_duration, env = "SGLANG_SUPERVISOR_ENERGY_INTERVAL", value_name = "DUR")]
    pub energy_interval: Duration,

    /// Stream GPU samples here in the layout of `nvidia-smi --query-gpu=timestamp,index,
    /// power.draw,temperature.gpu,clocks.current.sm,clocks.current.memory,utilization.gpu,
    /// utilization.memory,memory.used --format=csv` (power.draw holds the instant power where the
    /// GPU has it; memory.used, last, in MiB).
    /// Every energy-counter reading goes to `<stem>_energy.csv` beside it (for `report
    /// --bench-result`).
    #[arg(long, env = "SGLANG_SUPERVISOR_POWER_CSV", value_name = "PATH")]
    pub power_csv: Option<PathBuf>,

    /// Write a JSON report here at exit (also after failures and signals): identity, startup
    /// phases, deprecations and warnings, fatal diagnosis, measurement windows (latency from the
    /// proxy, power from the probes, InferenceX field names), teardown. Has a schema_version.
    #[arg(long, env = "SGLANG_SUPERVISOR_REPORT", value_name = "PATH")]
    pub report: Option<PathBuf>,

    /// Write the report as one self-contained HTML page here at exit: start-up Gantt per rank
    /// with the JIT share, GPU power and memory over time (from --power-csv), latency
    /// distributions (from --requests-log), the server's batch series, flags audit, teardown. No
    /// network needed.
    #[arg(long, env = "SGLANG_SUPERVISOR_REPORT_HTML", value_name = "PATH")]
    pub report_html: Option<PathBuf>,

    /// Where the server writes torch-profiler traces: set as SGLANG_TORCH_PROFILER_DIR in its
    /// environment (unless that is set already: then that directory is used). Enables
    /// `POST /-/profile/start?steps=N` and `POST /-/profile/stop` on the metrics address, which
    /// drive SGLang's /start_profile and /stop_profile and list the traces (one per TP rank) in a
    /// `profile` event and the report. Default with --report or --report-html: `<stem>-profiles`
    /// beside the report.
    #[arg(long, env = "SGLANG_SUPERVISOR_PROFILE_DIR", value_name = "DIR")]
    pub profile_dir: Option<PathBuf>,

    /// Profile the measurement window of this name: its start and stop drive the server's
    /// profiler (needs a trace directory: --profile-dir or a report).
    #[arg(long, env = "SGLANG_SUPERVISOR_PROFILE_WINDOW", value_name = "NAME")]
    pub profile_window: Option<String>,

    /// With --profile-window: profile this many forward steps (SGLang's num_steps), not the
    /// whole window.
    #[arg(long, env = "SGLANG_SUPERVISOR_PROFILE_STEPS", value_name = "N")]
    pub profile_steps: Option<u64>,

    /// Pre-flight source. When COMMAND is an SGLang launch (`PY -m sglang.launch_server`,
    /// `sglang serve`), its flags are audited before launching: a flag that would fail to parse
    /// stops the launch with exit 126; deprecated flags and unknown SGLANG_* variables are logged
    /// and recorded as a `preflight` event. By default the flags come from a static read of the
    /// SGLang package COMMAND's interpreter would import (well under a second, nothing
    /// imported). This names another SOURCE instead: a python3 or venv (import mode), a .whl, a
    /// source tree, or a saved schema .json.
    #[arg(long, env = "SGLANG_SUPERVISOR_FLAGS_SCHEMA", value_name = "SOURCE")]
    pub flags_schema: Option<String>,

    /// Give the pre-flight's Python this long; past it, it is killed and the launch goes on
    /// unaudited (with --flags-schema: exit 125).
    #[arg(long, default_value = "60s", value_parser = parse_duration, env = "SGLANG_SUPERVISOR_PREFLIGHT_TIMEOUT", value_name = "DUR")]
    pub preflight_timeout: Duration,

    /// Skip the pre-flight flag audit.
    #[arg(long, env = "SGLANG_SUPERVISOR_NO_PREFLIGHT", value_parser = switch)]
    pub no_preflight: bool,

    /// Do not copy the child's output to our stdout/stderr (the log file still gets every byte).
    #[arg(long, env = "SGLANG_SUPERVISOR_NO_TEE", value_parser = switch)]
    pub no_tee: bool,

    /// Replace secret values (what follows --api-key / --admin-api-key and the like in COMMAND,
    /// and secret-named environment variables such as HF_TOKEN) with `<redacted>` in the log
    /// file and the terminal copy too. Without it those are the child's exact bytes; events,
    /// metrics and reports never carry secrets either way.
    #[arg(long, env = "SGLANG_SUPERVISOR_REDACT_LOG", value_parser = switch)]
    pub redact_log: bool,

    /// The server command, run as argv (no shell), e.g. `python3 -m sglang.launch_server --model-path M`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// The longest any duration option may be: a deadline that far is still on the clock (a larger
/// one overflowed it after the spawn), and no run lasts a year.
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);
/// The shortest sampling period: below it the sampler is a busy loop.
const MIN_INTERVAL: Duration = Duration::from_millis(10);

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d =
        humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 500ms, 30s, 20m, 1h)"))?;
    if d > MAX_DURATION {
        return Err(format!("{s} is too long: at most 365d"));
    }
    Ok(d)
}

/// A timeout: a duration longer than zero. `0s` is refused rather than given a meaning: tools
/// disagree on it (never wait, or wait forever), and a wait of nothing could only say it timed out.
pub fn parse_timeout(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(format!(
            "{s} would not wait at all: give a duration longer than zero, e.g. 30s or 20m"
        ));
    }
    Ok(d)
}

/// A sampling period: a duration of at least 10 ms.
pub fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < MIN_INTERVAL {
        return Err(format!(
            "{s} is too short: at least 10ms (shorter would busy-loop)"
        ));
    }
    Ok(d)
}

/// The command line (this process's), parsed and checked: see [`parse_from`].
pub fn parse() -> Result<Cli, clap::Error> {
    parse_from(std::env::args_os())
}

/// Parses `args` and checks what clap's own rules cannot: whether an option was given on the
/// command line or only set in the environment. `--tap` and `--proxy-addr` exclude each other
/// wherever they come from; the options that only mean something with them (`--tap-interface`,
/// `--requests-log`, `--window-from-proxy`) are refused on a command line without them, but
/// left unused when they come from the environment, so that an exported default never breaks a
/// run that measures nothing.
pub fn parse_from<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let mut command = Cli::command();
    let argv: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let matches = command
        .try_get_matches_from_mut(&argv)
        .map_err(|e| match e.kind() {
            ErrorKind::InvalidUtf8 => name_the_bytes(&command, e, &argv),
            _ => name_the_environment(&command, e, &argv),
        })?;
    match matches.subcommand() {
        Some(("run", run)) => {
            check_measure_options(&mut command, run)?;
            let outputs = [
                "log_file",
                "events",
                "report",
                "report_html",
                "requests_log",
                "power_csv",
            ];
            check_distinct_files(&mut command, "run", run, &outputs, &outputs)?;
        }
        Some(("report", report)) => {
            let outputs = ["output", "html"];
            let all = [
                "output",
                "html",
                "events",
                "bench_result",
                "requests_log",
                "power_csv",
            ];
            check_distinct_files(&mut command, "report", report, &outputs, &all)?;
        }
        _ => {}
    }
    Cli::from_arg_matches(&matches)
}

/// Refuses two options naming one file where one of them writes it (`writers`, checked against
/// `all`): one would corrupt or replace the other (a log and the events interleaved, a report
/// written over its own input). Devices (/dev/null) and other non-regular files are left alone.
fn check_distinct_files(
    command: &mut clap::Command,
    subcommand: &str,
    matches: &ArgMatches,
    writers: &[&str],
    all: &[&str],
) -> Result<(), clap::Error> {
    let file = |id: &str| -> Option<(PathBuf, PathBuf)> {
        let given = matches.get_one::<PathBuf>(id)?;
        if std::fs::metadata(given).is_ok_and(|m| !m.is_file()) {
            return None;
        }
        // The same file however it is named: relative, through `..` or a symbolic link.
        let abs = std::path::absolute(given).ok()?;
        let same = abs.canonicalize().ok().or_else(|| {
            let parent = abs.parent()?.canonicalize().ok()?;
            Some(parent.join(abs.file_name()?))
        });
        Some((given.clone(), same.unwrap_or(abs)))
    };
    for (i, &w) in writers.iter().enumerate() {
        let Some((given, same)) = file(w) else {
            continue;
        };
        // (two writers are one pair: said once, from the first)
        let others = all
            .iter()
            .filter(|&&id| id != w && !writers[..i].contains(&id));
        for &id in others {
            if file(id).is_some_and(|(_, other)| other == same) {
                let (a, b) = (
                    given_as(command, subcommand, matches, w),
                    given_as(command, subcommand, matches, id),
                );
                return Err(command.error(
                    ErrorKind::ArgumentConflict,
                    format!(
                        "{a} and {b} both name {}: each is a file of its own (one would \
                         overwrite or interleave with the other); give them different paths",
                        given.display()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A value clap refuses that came from the environment, not the command line: the error names
/// the variable and what it holds, so that an exported setting is found without a search.
fn name_the_environment(command: &clap::Command, e: clap::Error, argv: &[OsString]) -> clap::Error {
    use clap::error::{ContextKind, ContextValue};
    if !matches!(
        e.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        return e;
    }
    let Some(ContextValue::String(invalid)) = e.get(ContextKind::InvalidArg) else {
        return e;
    };
    let long = invalid.split(' ').next().unwrap_or_default();
    // On the command line (ours, before `--`), the flag's own value is the one refused.
    let mut ours = argv
        .iter()
        .take_while(|a| *a != "--")
        .filter_map(|a| a.to_str());
    if ours.any(|a| a == long || a.starts_with(&format!("{long}="))) {
        return e;
    }
    let refused = match e.get(ContextKind::InvalidValue) {
        Some(ContextValue::String(v)) => Some(v.as_str()),
        _ => None,
    };
    // The options of that name, in any subcommand, set in the environment: the one that holds
    // the refused value, else the only one.
    let mut set: Vec<(&str, OsString)> = Vec::new();
    for arg in every_argument(command) {
        let var = arg.get_env().and_then(|v| v.to_str());
        let value = var.and_then(std::env::var_os);
        if let (Some(var), Some(value)) = (var, value) {
            if arg.get_long().is_some_and(|l| format!("--{l}") == long)
                && !set.iter().any(|(v, _)| *v == var)
            {
                set.push((var, value));
            }
        }
    }
    let holds = |value: &OsString| refused.is_some_and(|r| value.to_str() == Some(r));
    let Some((var, value)) = set
        .iter()
        .find(|(_, value)| holds(value))
        .or_else(|| set.first().filter(|_| set.len() == 1))
    else {
        return e;
    };
    let text = value.to_string_lossy();
    let shown: String = text.chars().take(64).collect();
    let cut = if text.chars().count() > 64 { "…" } else { "" };
    let line = error_line(&e);
    let mut command = command.clone();
    command.error(
        e.kind(),
        format!("{line}: it comes from the environment ({var}={shown:?}{cut}); set it right, or unset it"),
    )
}

/// clap's "invalid UTF-8 was detected in one or more arguments" names neither the word nor
/// whether it came from the environment: this says which (a word of ours before `--`, else a
/// variable of ours); the server's command after `--` may hold any bytes.
fn name_the_bytes(command: &clap::Command, e: clap::Error, argv: &[OsString]) -> clap::Error {
    let shown = |v: &OsString| format!("{:?}", v.to_string_lossy());
    let word = argv
        .iter()
        .skip(1)
        .take_while(|a| *a != "--")
        .find(|a| a.to_str().is_none());
    let variable = || {
        every_argument(command)
            .into_iter()
            .filter_map(|arg| arg.get_env()?.to_str())
            .find_map(|var| Some((var, std::env::var_os(var).filter(|v| v.to_str().is_none())?)))
    };
    let line = match (word, word.is_none().then(variable).flatten()) {
        (Some(w), _) => format!(
            "the argument {} is not valid UTF-8 (shown with U+FFFD for the bytes that are not); \
             give it as text",
            shown(w)
        ),
        (None, Some((var, v))) => format!(
            "the environment variable {var} is not valid UTF-8 ({var}={}, shown with U+FFFD for \
             the bytes that are not); set it right, or unset it",
            shown(&v)
        ),
        (None, None) => return e,
    };
    let mut command = command.clone();
    command.error(ErrorKind::InvalidUtf8, line)
}

/// Every argument of `command` and of its subcommands, at any depth.
fn every_argument(command: &clap::Command) -> Vec<&clap::Arg> {
    let mut all: Vec<&clap::Arg> = command.get_arguments().collect();
    for sub in command.get_subcommands() {
        all.extend(every_argument(sub));
    }
    all
}

/// A switch's value from the environment (on the command line, the flag alone is true): see
/// [`sglang_exporters::switch`].
fn switch(v: &str) -> Result<bool, String> {
    sglang_exporters::switch(v)
        .ok_or_else(|| "a switch is true or false (yes or no, on or off, 1 or 0)".into())
}

/// Option `id` of `subcommand` as the user gave it: `--flag`, or `--flag (from VARIABLE)` where
/// its variable set it, so that an exported setting is found without a search.
fn given_as(command: &clap::Command, subcommand: &str, matches: &ArgMatches, id: &str) -> String {
    let arg = command
        .find_subcommand(subcommand)
        .and_then(|c| c.get_arguments().find(|a| a.get_id() == id));
    let flag = match arg.and_then(clap::Arg::get_long) {
        Some(long) => format!("--{long}"),
        None => id.to_string(),
    };
    match (matches.value_source(id), arg.and_then(clap::Arg::get_env)) {
        (Some(clap::parser::ValueSource::EnvVariable), Some(env)) => {
            format!("{flag} (from {})", env.to_string_lossy())
        }
        _ => flag,
    }
}

fn check_measure_options(command: &mut clap::Command, run: &ArgMatches) -> Result<(), clap::Error> {
    use clap::parser::ValueSource;
    let from = |command: &clap::Command, id: &str| given_as(command, "run", run, id);
    let tap = run.get_flag("tap");
    let proxy = run.get_one::<String>("proxy_addr").is_some();
    let spin = sglang_exporters::proxy::spin::SPIN;
    if let Some(v) = std::env::var_os(spin).filter(|_| proxy) {
        // Not UTF-8 is none of the words either.
        if let Err(why) = switch(&v.to_string_lossy()) {
            return Err(command.error(
                ErrorKind::InvalidValue,
                format!("{spin}={v:?}: {why}; set it right, or unset it"),
            ));
        }
    }
    if tap && proxy {
        return Err(command.error(
            ErrorKind::ArgumentConflict,
            format!(
                "{} cannot be used with {}: the tap measures the server's own port, the proxy a \
                 port in front of it; keep one",
                from(command, "tap"),
                from(command, "proxy_addr"),
            ),
        ));
    }
    let needs = [
        ("tap_interface", "--tap-interface", tap, "--tap"),
        (
            "requests_log",
            "--requests-log",
            tap || proxy,
            "--tap or --proxy-addr",
        ),
        (
            "window_from_proxy",
            "--window-from-proxy",
            tap || proxy,
            "--tap or --proxy-addr",
        ),
    ];
    for (id, flag, met, what) in needs {
        if !met && run.value_source(id) == Some(ValueSource::CommandLine) {
            return Err(command.error(
                ErrorKind::MissingRequiredArgument,
                format!("{flag} needs {what} (it measures nothing without one)"),
            ));
        }
    }
    Ok(())
}

/// A command-line error on one line, like every other error of ours. clap puts what a message
/// names on the lines after it (the missing arguments after "were not provided:", a `tip:`):
/// they are kept, joined, so the line still says which option is wrong.
pub fn error_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let mut lines = text.lines();
    let mut out = lines
        .next()
        .unwrap_or("bad command line")
        .trim_start_matches("error: ")
        .to_string();
    let mut listed = Vec::new();
    let mut tips = Vec::new();
    for line in lines.take_while(|l| !l.starts_with("Usage:")) {
        let l = line.trim();
        if let Some(tip) = l.strip_prefix("tip:") {
            tips.push(tip.trim());
        } else if !l.is_empty() && out.ends_with(':') {
            listed.push(l);
        }
    }
    if !listed.is_empty() {
        out = format!("{out} {}", listed.join(", "));
    }
    for tip in tips {
        out = format!("{out} ({tip})");
    }
    out
}

/// `completions SHELL`: the script on standard output.
pub fn print_completions(shell: clap_complete::Shell) -> anyhow::Result<()> {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "sglang-supervisor", &mut script);
    Ok(crate::stdout::print(script)?)
}

/// `man`: the roff page on standard output.
pub fn print_man_page() -> anyhow::Result<()> {
    let page = clap_mangen::Man::new(<Cli as clap::CommandFactory>::command());
    let mut roff = Vec::new();
    page.render(&mut roff)
        .map_err(|e| anyhow::anyhow!("rendering the man page: {e}"))?;
    Ok(crate::stdout::print(roff)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn a_command_line_error_is_one_line_that_names_what_is_missing() {
        let e = Cli::try_parse_from(["s", "run"]).unwrap_err();
        assert_eq!(
            error_line(&e),
            "the following required arguments were not provided: <COMMAND>..."
        );
        let e = Cli::try_parse_from(["s", "wait"]).unwrap_err();
        let line = error_line(&e);
        assert!(line.starts_with("the following required arguments were not provided: "));
        assert!(!line.ends_with(':') && !line.contains('\n'), "{line}");
        let e = Cli::try_parse_from(["s", "run", "--gracee", "1s", "--", "x"]).unwrap_err();
        assert_eq!(
            error_line(&e),
            "unexpected argument '--gracee' found (a similar argument exists: '--grace') \
             (to pass '--gracee' as a value, use '-- --gracee')"
        );
        let e = Cli::try_parse_from(["s", "run", "--grace", "soon", "--", "x"]).unwrap_err();
        assert!(
            error_line(&e).starts_with("invalid value 'soon' for '--grace <DUR>': "),
            "{}",
            error_line(&e)
        );
    }

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_option_of_every_subcommand_can_be_set_from_the_environment() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for a in cmd.get_arguments() {
                let builtin = matches!(a.get_id().as_str(), "help" | "version");
                if !a.is_positional() && !builtin && !a.is_hide_set() && a.get_env().is_none() {
                    missing.push(format!("{path} --{}", a.get_id()));
                }
            }
            for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "sglang-supervisor", &mut missing);
        assert!(missing.is_empty(), "options without `env`: {missing:?}");
    }

    #[test]
    fn run_takes_the_command_after_double_dash_with_its_own_flags() {
        let cli = Cli::try_parse_from([
            "s",
            "run",
            "--grace",
            "5s",
            "--",
            "python3",
            "-m",
            "sglang.launch_server",
            "--port",
            "1",
        ])
        .unwrap();
        let Command::Run(r) = cli.command else {
            panic!()
        };
        assert_eq!(r.grace, Duration::from_secs(5));
        assert_eq!(r.ready_timeout, Duration::from_secs(3600));
        assert_eq!(
            r.command,
            ["python3", "-m", "sglang.launch_server", "--port", "1"]
        );
        assert!(Cli::try_parse_from(["s", "run", "--grace", "soon", "--", "x"]).is_err());
    }

    #[test]
    fn durations_that_overflow_the_clock_or_busy_loop_are_refused_at_parse() {
        for opt in [
            "--ready-timeout",
            "--grace",
            "--energy-interval",
            "--preflight-timeout",
        ] {
            let e = Cli::try_parse_from(["s", "run", opt, "18446744073709551615s", "--", "x"])
                .unwrap_err();
            assert!(e.to_string().contains("too long"), "{opt}: {e}");
        }
        let e = Cli::try_parse_from([
            "s",
            "wait",
            "--url",
            "u",
            "--timeout",
            "18446744073709551615s",
        ])
        .unwrap_err();
        assert!(e.to_string().contains("too long"), "{e}");
        for bad in ["0", "0s", "9ms"] {
            let e =
                Cli::try_parse_from(["s", "run", "--sample-interval", bad, "--", "x"]).unwrap_err();
            assert!(e.to_string().contains("at least 10ms"), "{bad}: {e}");
        }
        assert!(Cli::try_parse_from(["s", "run", "--sample-interval", "10ms", "--", "x"]).is_ok());
        assert!(Cli::try_parse_from(["s", "run", "--ready-timeout", "365d", "--", "x"]).is_ok());
    }
}
