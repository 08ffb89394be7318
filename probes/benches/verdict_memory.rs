//! What a power verdict over a long span holds while it is made, and how long it takes: a day of
//! 8 GPUs sampled at 10 Hz (6.9 M readings), as the live sampler asks it at a run's end (the
//! kept samples added to `Readings`), and as `report --bench-result` asks it of a CSV file
//! (read a line at a time). Peak RSS is the kernel's high-water mark, reset before each
//! (`/proc/self/clear_refs`).
//!
//! `cargo bench -p sglang-probes --bench verdict_memory [-- GPUS HOURS]`
use sglang_probes::inferencex::{verdict_of_csv, Reading, Readings, MAX_SAMPLE_GAP_S};
use std::time::Instant;

fn high_water_kb() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Runs `f` and says its peak RSS above what was resident before it, and its time.
fn measure<T>(what: &str, readings: usize, f: impl FnOnce() -> T) -> T {
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let before = high_water_kb();
    let t = Instant::now();
    let out = f();
    let took = t.elapsed();
    match (reset, before, high_water_kb()) {
        (true, Some(b), Some(a)) => println!(
            "{what}: {:.1} MB above the samples ({:.1} bytes a reading), {:.0} ms",
            (a - b) as f64 / 1024.0,
            (a - b) as f64 * 1024.0 / readings as f64,
            took.as_secs_f64() * 1e3
        ),
        _ => println!(
            "{what}: {:.0} ms (no /proc high-water mark here)",
            took.as_secs_f64() * 1e3
        ),
    }
    out
}

/// The readings as `run --power-csv` writes them (epoch-second timestamps, which InferenceX's
/// reader takes too: the bench is about holding, not parsing dates).
fn write_csv(path: &std::path::Path, kept: &[Vec<(f64, f64)>]) {
    use std::io::Write;
    let mut w = std::io::BufWriter::new(std::fs::File::create(path).expect("a temp file"));
    let _ = writeln!(w, "timestamp, index, power.draw [W]");
    for i in 0..kept.first().map_or(0, Vec::len) {
        for (g, rows) in kept.iter().enumerate() {
            let _ = writeln!(w, "{:.3}, {g}, {:.2} W", rows[i].0, rows[i].1);
        }
    }
    w.flush().expect("the temp CSV written");
}

fn main() {
    let args: Vec<f64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let gpus = args.first().map_or(8, |g| *g as usize);
    let hours = args.get(1).copied().unwrap_or(24.0);
    let per_gpu = (hours * 36_000.0) as usize;
    let t0 = 1_796_000_000.0;
    let kept: Vec<Vec<(f64, f64)>> = (0..gpus)
        .map(|_| {
            (0..per_gpu)
                .map(|i| (t0 + i as f64 * 0.1, 300.0 + (i % 7) as f64))
                .collect()
        })
        .collect();
    let span = (t0 + 1.0, t0 + per_gpu as f64 * 0.1 - 1.0);
    let n = gpus * per_gpu;
    println!("{gpus} GPUs, {hours} h at 10 Hz: {n} readings");
    let ids: Vec<String> = (0..gpus).map(|i| i.to_string()).collect();
    let live = measure("live (Readings)", n, || {
        let mut r = Readings::new(span, Some(gpus), MAX_SAMPLE_GAP_S);
        for (rows, id) in kept.iter().zip(&ids) {
            for &(t, p) in rows {
                r.add(Reading {
                    unix_s: Some(t),
                    gpu: Some(id),
                    power_w: Some(p),
                });
            }
        }
        r.verdict()
    });
    let csv = std::env::temp_dir().join(format!("verdict-memory-{}.csv", std::process::id()));
    write_csv(&csv, &kept);
    let from_file = measure("a CSV file of them, read a line at a time", n, || {
        verdict_of_csv(&csv, span, Some(gpus), MAX_SAMPLE_GAP_S)
    });
    let _ = std::fs::remove_file(&csv);
    assert_eq!(
        live, from_file,
        "one verdict, whichever way the readings came"
    );
    println!(
        "energy {:?} J, valid {}",
        live.total_gpu_energy_j, live.power_valid
    );
}
