//! GPUs from the supervisor's side: opening the backend `--gpu-backend` names, the `probe`
//! command, and the sampler's lifetime within `run` (start before the spawn, stop after exit,
//! then check that the GPUs were given back).
use crate::cli::{GpuArgs, GpuBackendArg, ProbeArgs, RunArgs};
use anyhow::{Context, Result};
use sglang_probes::gpu::{self, Backend, GpuProbe, GpuSample, Want};
use sglang_probes::sampler::{Sampler, SamplerConfig};
use std::time::{Duration, Instant};

pub fn open(args: &GpuArgs) -> Result<Option<Box<dyn GpuProbe>>> {
    let backend = match args.gpu_backend {
        GpuBackendArg::Auto => Backend::Auto,
        GpuBackendArg::Nvml => Backend::Nvml,
        GpuBackendArg::Rocm => Backend::Rocm,
        GpuBackendArg::Sysfs => Backend::Sysfs,
        GpuBackendArg::None => Backend::None,
    };
    let at = gpu::Locations {
        nvml_lib: args.nvml_lib.as_deref().map(|p| p.as_os_str()),
        rocm_lib: args.rocm_lib.as_deref().map(|p| p.as_os_str()),
        sysfs_root: args.sysfs_root.as_deref(),
    };
    gpu::open(backend, &at)
        .with_context(|| "--gpu-backend: the named GPU library cannot be used (use --gpu-backend auto or none to run without it)")
}

/// `probe`: one reading of every GPU.
pub fn probe_command(args: &ProbeArgs) -> Result<()> {
    use std::fmt::Write as _;
    let samples: Vec<GpuSample> = match open(&args.gpu)? {
        None => Vec::new(),
        Some(p) => (0..p.device_count())
            .map(|i| {
                p.sample(i, Want::ALL)
                    .with_context(|| format!("reading GPU {i} through {}", p.backend()))
            })
            .collect::<Result<_>>()?,
    };
    if args.json {
        crate::stdout::println(serde_json::to_string_pretty(&samples)?)?;
        return Ok(());
    }
    let mut out = String::new();
    if samples.is_empty() {
        out.push_str("no GPU found\n");
    }
    let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    for s in &samples {
        let _ = writeln!(
            out,
            "GPU {} {} {}: power {} W (1 s avg {} W), energy {} J, memory {}/{} MiB, util {}, {} °C, SM {} MHz, processes {}",
            s.index,
            opt(s.name.clone()),
            opt(s.uuid.clone()),
            opt(s.power_w.map(|w| format!("{w:.1}"))),
            opt(s.power_avg_w.map(|w| format!("{w:.1}"))),
            opt(s.energy_j.map(|j| format!("{j:.1}"))),
            opt(s.memory_used_bytes.map(|b| (b >> 20).to_string())),
            opt(s.memory_total_bytes.map(|b| (b >> 20).to_string())),
            opt(s.utilization.map(|u| format!("{:.0} %", u * 100.0))),
            opt(s.temperature_c.map(|t| format!("{t:.0}"))),
            opt(s.sm_clock_hz.map(|h| (h / 1_000_000).to_string())),
            opt(s.processes.as_ref().map(|p| p.iter().map(|p| p.pid.to_string()).collect::<Vec<_>>().join(","))),
        );
    }
    crate::stdout::print(out)?;
    Ok(())
}

/// Start sampling for `run` (None when there is no GPU or sampling is off).
pub fn start_sampler(args: &RunArgs) -> Result<Option<Sampler>> {
    let Some(probe) = open(&args.gpu)? else {
        if let Some(p) = &args.power_csv {
            tracing::warn!(
                "--power-csv {}: no GPU to sample, the file stays empty",
                p.display()
            );
        }
        return Ok(None);
    };
    let csv = args
        .power_csv
        .as_deref()
        .map(|p| {
            std::fs::File::create(p)
                .with_context(|| format!("cannot create the power CSV {}", p.display()))
        })
        .transpose()?;
    // The counter readings beside the CSV, so a span's counter energy can be recomputed later.
    let energy_csv = args
        .power_csv
        .as_deref()
        .map(|p| {
            let e = sglang_probes::inferencex::energy_sidecar(p);
            std::fs::File::create(&e)
                .with_context(|| format!("cannot create the energy sidecar {}", e.display()))
        })
        .transpose()?;
    let cfg = SamplerConfig {
        interval: args.sample_interval,
        energy_interval: args.energy_interval,
    };
    let s = Sampler::start_with_energy_csv(probe, cfg, csv, energy_csv).map_err(|e| {
        anyhow::anyhow!(
            "cannot start the GPU sampler's threads: {e}{}",
            sglang_probes::sync::start_hint(&e)
        )
    })?;
    tracing::info!(gpus = s.gpu_count(), backend = s.backend(), interval = ?args.sample_interval, "sampling GPUs");
    Ok(Some(s))
}

/// After the server is gone: which GPUs still list compute processes or hold memory. The driver
/// frees a dead process's memory asynchronously, so this waits (bounded) for it to go.
pub fn teardown_check(sampler: &Sampler, wait: Duration) -> serde_json::Value {
    let end = Instant::now() + wait;
    loop {
        let readings: Vec<GpuSample> = (0..sampler.gpu_count() as u32)
            .filter_map(|i| sampler.probe_now(i).ok())
            .collect();
        let busy = readings
            .iter()
            .any(|s| s.processes.as_ref().is_some_and(|p| !p.is_empty()));
        if !busy || Instant::now() >= end {
            let gpus: Vec<serde_json::Value> = readings
                .iter()
                .map(|s| {
                    serde_json::json!({"index": s.index, "memory_used_bytes": s.memory_used_bytes,
                                       "processes": s.processes})
                })
                .collect();
            return serde_json::json!({"clean": !busy, "gpus": gpus});
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
