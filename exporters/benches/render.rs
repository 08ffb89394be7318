//! `/metrics` rendering cost: 8 GPUs' cached samples, proxy histograms for three endpoints, and
//! the server's own `sglang:*` text (the recorded 0.5.14 output, 61 KB) appended — against the
//! floor of copying that upstream text alone.
//! `cargo bench -p sglang-exporters --bench render`
use criterion::{criterion_group, criterion_main, Criterion};
use sglang_exporters::metrics::{registry, render, Shared};
use sglang_exporters::proxy::{ProxyMetrics, ReqLabels};
use sglang_probes::gpu::{GpuError, GpuProbe, GpuSample, Want};
use sglang_probes::sampler::{Sampler, SamplerConfig};
use std::sync::Arc;
use std::time::Duration;

struct EightGpus;

impl GpuProbe for EightGpus {
    fn backend(&self) -> &'static str {
        "bench"
    }
    fn device_count(&self) -> u32 {
        8
    }
    fn sample(&self, index: u32, _: Want) -> Result<GpuSample, GpuError> {
        Ok(GpuSample {
            index,
            uuid: Some(format!("GPU-{index:08x}-c447-14d9-868b-aa48e1ed5cae")),
            name: Some("NVIDIA H200".into()),
            power_w: Some(612.5),
            power_avg_w: Some(600.1),
            energy_j: Some(1.5e6),
            memory_used_bytes: Some(133 << 30),
            memory_total_bytes: Some(141 << 30),
            utilization: Some(0.97),
            temperature_c: Some(61.0),
            sm_clock_hz: Some(1_980_000_000),
            ..GpuSample::default()
        })
    }
}

fn bench(c: &mut Criterion) {
    let upstream = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/sglang-0.5.14-h200/B_decode_graph/metrics.txt"
    ))
    .unwrap_or_default();
    let shared = Arc::new(Shared::default());
    shared.update(|s| {
        s.state = "ready";
        s.ready_seconds = Some(48.2);
        s.phases = vec![
            ("cuda_graph".into(), 2.0),
            ("load_weights".into(), 0.12),
            ("warmup".into(), 1.2),
        ];
        s.args_info = vec![
            ("model_path".into(), "/models/x".into()),
            ("tp_size".into(), "8".into()),
        ];
    });
    let cfg = SamplerConfig {
        interval: Duration::from_secs(3600),
        energy_interval: Duration::from_secs(3600),
    };
    let sampler = Sampler::start(Box::new(EightGpus), cfg, None).unwrap_or_else(|e| panic!("{e}"));
    std::thread::sleep(Duration::from_millis(200));
    shared.set_gpus(Some(sampler.handle()));
    let mut reg = registry(shared.clone());
    let pm = ProxyMetrics::register(&mut reg);
    for ep in ["/generate", "/v1/completions", "/v1/chat/completions"] {
        let l = ReqLabels {
            endpoint: ep.into(),
            status: "200".into(),
        };
        for i in 0..1000 {
            pm.ttft.get_or_create(&l).observe(0.05 * (i % 40) as f64);
            pm.itl.get_or_create(&l).observe(0.001 * (i % 30) as f64);
            pm.e2e.get_or_create(&l).observe(0.5 * (i % 20) as f64);
            pm.tpot.get_or_create(&l).observe(0.002 * (i % 10) as f64);
        }
    }
    let mut g = c.benchmark_group("metrics");
    g.bench_function("copy_upstream_text_only (floor)", |b| {
        b.iter(|| upstream.clone())
    });
    g.bench_function("render_ours_only", |b| {
        b.iter(|| render(&reg, &shared, false).map(|s| s.len()))
    });
    shared.set_upstream(Some(upstream.clone()), true);
    g.bench_function("render_ours_plus_upstream_0.0.4", |b| {
        b.iter(|| render(&reg, &shared, false).map(|s| s.len()))
    });
    g.bench_function("render_ours_plus_upstream_openmetrics", |b| {
        b.iter(|| render(&reg, &shared, true).map(|s| s.len()))
    });
    g.finish();
    let _ = sampler.stop();
}

criterion_group!(benches, bench);
criterion_main!(benches);
