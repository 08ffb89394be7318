//! The power CSV (`nvidia-smi --format=csv` layout) and its energy sidecar, streamed as samples
//! come, and the rows written kept per GPU (timestamp and power as the CSV has them, and the
//! counter readings), so that InferenceX's verdict can be asked over any span of the run on
//! exactly what the CSV holds. Memory stays bounded: past `MAX_KEPT_ROWS` rows per GPU (29 h at
//! 10 Hz) the oldest half is let go (the CSV keeps everything). The GPU memory used is the last
//! column (`memory.used [MiB]`); `read_series` reads it back for the report's plot.
use super::lock;
use crate::gpu::GpuSample;
use crate::inferencex::{self, CounterEnergy, Reading, Readings, Verdict, MAX_SAMPLE_GAP_S};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::sync::Mutex;

/// Rows kept per GPU for verdicts over spans of the run (16 bytes each: 16 MiB per GPU at most).
/// An 8-GPU node sampled at 10 Hz keeps 1.3 kB more a second until then (29 h).
pub const MAX_KEPT_ROWS: usize = 1 << 20;

/// The header `nvidia-smi --query-gpu=timestamp,index,power.draw,temperature.gpu,clocks.current.sm,
/// clocks.current.memory,utilization.gpu,utilization.memory,memory.used --format=csv` prints.
/// `memory.used` came last, after the rest: readers that take columns by position (files from
/// before it have the first eight only) read the same columns as before.
pub const CSV_HEADER: &str = "timestamp, index, power.draw [W], temperature.gpu, clocks.current.sm [MHz], clocks.current.memory [MHz], utilization.gpu [%], utilization.memory [%], memory.used [MiB]";

/// The CSV files being written and the rows kept from them.
pub(super) struct PowerCsv {
    csv: Option<Mutex<BufWriter<File>>>,
    /// The counter readings next to the CSV (`<stem>_energy.csv`).
    energy_csv: Option<Mutex<BufWriter<File>>>,
    kept: Vec<Mutex<Kept>>,
}

/// What is kept per GPU for verdicts over spans: the CSV's rows and counter readings.
#[derive(Debug, Default)]
struct Kept {
    /// (CSV timestamp, power as written; NaN for `[N/A]`: an Option would make each row 24
    /// bytes, not 16)
    power: Vec<(f64, f64)>,
    /// (CSV timestamp, counter joules)
    energy: Vec<(f64, f64)>,
    /// The first row kept after older ones were let go.
    trimmed_from: Option<f64>,
}

impl PowerCsv {
    /// For `gpus` GPUs; each file given gets its header at once.
    pub fn create(
        gpus: usize,
        csv: Option<File>,
        energy_csv: Option<File>,
    ) -> std::io::Result<PowerCsv> {
        let with_header = |f: Option<File>, header: &str| -> std::io::Result<_> {
            match f {
                Some(f) => {
                    let mut w = BufWriter::new(f);
                    writeln!(w, "{header}")?;
                    Ok(Some(Mutex::new(w)))
                }
                None => Ok(None),
            }
        };
        Ok(PowerCsv {
            csv: with_header(csv, CSV_HEADER)?,
            energy_csv: with_header(energy_csv, inferencex::ENERGY_CSV_HEADER)?,
            kept: (0..gpus).map(|_| Mutex::new(Kept::default())).collect(),
        })
    }

    /// A row of the power CSV (and of the energy sidecar when the counter was read), kept for
    /// verdicts over spans with the very values written.
    pub fn write(&self, index: u32, unix_s: f64, s: &GpuSample) {
        if let Some(csv) = &self.csv {
            let _ = lock(csv).write_all(csv_row(unix_s, s).as_bytes());
        }
        let t = inferencex::csv_time(unix_s);
        let power = s
            .power_w
            .or(s.power_avg_w)
            .and_then(|w| format!("{w:.2}").parse::<f64>().ok());
        if let (Some(e), Some(csv)) = (s.energy_j, &self.energy_csv) {
            let _ = writeln!(
                lock(csv),
                "{}, {}, {e:.3}",
                nvidia_smi_timestamp(unix_s),
                s.index
            );
        }
        let Some(k) = self.kept.get(index as usize) else {
            return;
        };
        let mut k = lock(k);
        for rows in [k.power.len(), k.energy.len()] {
            if rows >= MAX_KEPT_ROWS {
                k.power.drain(..MAX_KEPT_ROWS / 2);
                let from = k.power.first().map_or(t, |r| r.0);
                k.energy.retain(|r| r.0 >= from);
                k.trimmed_from = Some(from);
            }
        }
        k.power.push((t, power.unwrap_or(f64::NAN)));
        if let Some(e) = s.energy_j {
            k.energy.push((t, e));
        }
    }

    pub fn flush(&self) {
        for csv in [&self.csv, &self.energy_csv].into_iter().flatten() {
            let _ = lock(csv).flush();
        }
    }

    /// InferenceX's verdict and the counter over `span`, from the rows kept.
    pub fn over_span(
        &self,
        span: (f64, f64),
        expected_gpus: Option<usize>,
    ) -> (Verdict, Option<CounterEnergy>) {
        let mut readings = Readings::new(span, expected_gpus, MAX_SAMPLE_GAP_S);
        let mut reads = Vec::with_capacity(self.kept.len());
        // Each GPU is locked only while its rows are read.
        for (i, k) in self.kept.iter().enumerate() {
            let id = i.to_string();
            let k = lock(k);
            for &(t, p) in &k.power {
                readings.add(Reading {
                    unix_s: Some(t),
                    gpu: Some(&id),
                    power_w: (!p.is_nan()).then_some(p),
                });
            }
            reads.push(k.energy.clone());
        }
        let v = readings.verdict();
        (v, inferencex::counter_energy(&reads, span))
    }

    /// Where the kept rows of every GPU begin, when older ones were let go after `start`.
    pub fn kept_from(&self, start: f64) -> Option<f64> {
        self.kept
            .iter()
            .filter_map(|k| lock(k).trimmed_from)
            .fold(None, |m: Option<f64>, t| Some(m.map_or(t, |m| m.max(t))))
            .filter(|t| *t > start)
    }
}

fn csv_row(unix_s: f64, s: &GpuSample) -> String {
    let na = || "[N/A]".to_string();
    let power = s
        .power_w
        .or(s.power_avg_w)
        .map_or_else(na, |w| format!("{w:.2} W"));
    let temp = s.temperature_c.map_or_else(na, |t| format!("{t:.0}"));
    let mhz = |hz: Option<u64>| hz.map_or_else(na, |h| format!("{} MHz", h / 1_000_000));
    let pct = |r: Option<f64>| r.map_or_else(na, |r| format!("{:.0} %", r * 100.0));
    // nvidia-smi's whole MiB (bytes >> 20).
    let mib = s
        .memory_used_bytes
        .map_or_else(na, |b| format!("{} MiB", b >> 20));
    format!(
        "{}, {}, {power}, {temp}, {}, {}, {}, {}, {mib}\n",
        nvidia_smi_timestamp(unix_s),
        s.index,
        mhz(s.sm_clock_hz),
        mhz(s.memory_clock_hz),
        pct(s.utilization),
        pct(s.memory_utilization)
    )
}

/// Per GPU id, (unix seconds, value) in file order.
pub type PerGpu = std::collections::BTreeMap<String, Vec<(f64, f64)>>;

/// A power CSV's series, per GPU, as the report's plots draw them.
#[derive(Debug, PartialEq)]
pub struct GpuSeries {
    /// Power (W), or InferenceX's reasons the file has no power series (a column missing).
    pub power: Result<PerGpu, Vec<&'static str>>,
    /// Memory used (MiB); `None` when the header has no timestamp or no `memory.used [MiB]`
    /// column, as in power CSVs written before memory was recorded.
    pub memory_mib: Option<PerGpu>,
    /// The earliest timestamp of any row, with a value or not: where the plots' time starts.
    pub first_unix_s: Option<f64>,
}

/// The power and `memory.used` series of a power CSV's lines: ours, or an nvidia-smi capture
/// (`1234 MiB`, or bare `1234` with `--format=csv,nounits`). Columns are found by name
/// (timestamp, power and GPU id as InferenceX finds them), wherever they are; a row without a
/// GPU id is GPU `?`; a cell that is empty, unparseable or `[N/A]` is no point (nor is a
/// negative memory reading: a negative power is drawn, as the verdict's reader sees it).
/// One pass, a line at a time: 16 bytes a point is what is held.
pub fn series_of_lines<S: AsRef<str>>(lines: impl Iterator<Item = S>) -> GpuSeries {
    let mut lines = lines.filter(|l| !l.as_ref().is_empty());
    let header = inferencex::header(&mut lines);
    let power_cols = inferencex::power_columns(&header);
    let (time, _, gpu) = inferencex::columns(&header);
    let used = header.iter().position(|h| {
        let h = h.to_ascii_lowercase();
        h == "memory.used [mib]" || h == "memory.used"
    });
    let mut out = GpuSeries {
        power: power_cols
            .as_ref()
            .map(|_| PerGpu::new())
            .map_err(Clone::clone),
        memory_mib: time.and(used).map(|_| PerGpu::new()),
        first_unix_s: None,
    };
    if out.power.is_err() && out.memory_mib.is_none() {
        return out;
    }
    let Some(time) = time else {
        return out;
    };
    for l in lines {
        let f = inferencex::fields(l.as_ref());
        let cell = |i: usize| f.get(i).map_or("", |s| s.trim());
        // An infinite time (300 digits) is no point either: the plots' axis is made from them.
        let Some(t) = inferencex::parse_timestamp(cell(time)).filter(|t| t.is_finite()) else {
            continue;
        };
        out.first_unix_s = Some(out.first_unix_s.map_or(t, |f: f64| f.min(t)));
        let id = gpu.map_or("", cell);
        let id = if id.is_empty() { "?" } else { id };
        if let (Ok(series), Ok((_, p, _))) = (&mut out.power, &power_cols) {
            if let Some(w) = inferencex::parse_power(cell(*p)) {
                push(series, id, (t, w));
            }
        }
        if let (Some(series), Some(m)) = (&mut out.memory_mib, used) {
            let used = inferencex::parse_power(cell(m)).filter(|m| m.is_finite() && *m >= 0.0);
            if let Some(mib) = used {
                push(series, id, (t, mib));
            }
        }
    }
    out
}

/// A point of a GPU's series; only its first allocates its id.
fn push(series: &mut PerGpu, id: &str, point: (f64, f64)) {
    match series.get_mut(id) {
        Some(points) => points.push(point),
        None => {
            series.insert(id.to_string(), vec![point]);
        }
    }
}

/// [`series_of_lines`] of a file, read a line at a time, or InferenceX's reasons the file
/// cannot be read at all (missing, empty, unreadable).
pub fn read_series(path: &std::path::Path) -> Result<GpuSeries, Vec<&'static str>> {
    inferencex::read_csv_lines(path, |lines| series_of_lines(lines))
}

/// `2026/12/02 09:19:31.105` (UTC), nvidia-smi's timestamp format: milliseconds floored, as
/// `inferencex::csv_time` reads them back.
pub fn nvidia_smi_timestamp(unix_s: f64) -> String {
    let secs = unix_s.floor();
    let ms = ((unix_s - secs) * 1000.0).floor() as u32;
    // Outside years 1-9999 (not a clock reading) the epoch stands in.
    let t = time::OffsetDateTime::from_unix_timestamp(secs as i64)
        .ok()
        .filter(|t| t.year() >= 1)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!(
        "{:04}/{:02}/{:02} {:02}:{:02}:{:02}.{ms:03}",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_rows_match_nvidia_smis_layout() {
        let s = GpuSample {
            index: 3,
            power_w: Some(123.456),
            temperature_c: Some(33.0),
            sm_clock_hz: Some(1_980_000_000),
            utilization: Some(0.5),
            ..GpuSample::default()
        };
        assert_eq!(
            csv_row(1_796_210_437.105, &s),
            "2026/12/02 11:20:37.105, 3, 123.46 W, 33, 1980 MHz, [N/A], 50 %, [N/A], [N/A]\n",
            "memory used absent: [N/A], never 0 MiB"
        );
        let s = GpuSample {
            memory_used_bytes: Some((1234 << 20) + 1023),
            ..s
        };
        assert_eq!(
            csv_row(1_796_210_437.105, &s),
            "2026/12/02 11:20:37.105, 3, 123.46 W, 33, 1980 MHz, [N/A], 50 %, [N/A], 1234 MiB\n",
            "nvidia-smi's whole MiB, last"
        );
        assert_eq!(
            CSV_HEADER.split(", ").count(),
            csv_row(0.0, &s).split(", ").count()
        );
    }

    #[test]
    fn memory_used_reads_from_new_headers_and_nvidia_smi_captures_and_is_none_for_old_ones() {
        let new = format!(
            "{CSV_HEADER}\n2026/12/02 11:20:37.105, 0, 1.00 W, 33, [N/A], [N/A], [N/A], [N/A], 1234 MiB\n\
             2026/12/02 11:20:37.205, 1, 1.00 W, 33, [N/A], [N/A], [N/A], [N/A], [N/A]\n"
        );
        let s = series_of_lines(new.lines());
        let memory = s.memory_mib.unwrap();
        assert_eq!(
            memory.into_iter().collect::<Vec<_>>(),
            [("0".to_string(), vec![(1_796_210_437.105, 1234.0)])],
            "GPU 1's [N/A] is no point, never 0"
        );
        assert_eq!(s.power.unwrap().len(), 2);
        assert_eq!(s.first_unix_s, Some(1_796_210_437.105));
        // nvidia-smi's own capture (`--format=csv,nounits`, memory.used third, no index).
        let smi = "timestamp, power.draw [W], memory.used [MiB], memory.total [MiB]\n\
                   2026/12/02 09:19:31.105, 82.35, 512, 143771\n";
        let s = series_of_lines(smi.lines());
        assert_eq!(s.memory_mib.unwrap()["?"], [(1_796_203_171.105, 512.0)]);
        assert_eq!(s.power, Err(vec!["gpu_identity_column_missing"]));
        // The header written before memory was recorded: no memory series, not zeros.
        let old = "timestamp, index, power.draw [W], temperature.gpu, clocks.current.sm [MHz], clocks.current.memory [MHz], utilization.gpu [%], utilization.memory [%]\n\
                   2026/12/02 11:20:37.105, 0, 1.00 W, 33, [N/A], [N/A], [N/A], [N/A]\n";
        let s = series_of_lines(old.lines());
        assert_eq!(s.memory_mib, None);
        assert_eq!(s.power.unwrap()["0"], [(1_796_210_437.105, 1.0)]);
        assert_eq!(series_of_lines("".lines()).memory_mib, None);
    }

    /// The same series from a file read a line at a time as from its whole text; a file that
    /// cannot be read says why, as InferenceX's reader does.
    #[test]
    fn a_power_csv_file_gives_the_series_of_its_text() {
        let dir = std::env::temp_dir().join(format!("series-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("gpu.csv");
        let s = GpuSample {
            power_w: Some(400.0),
            memory_used_bytes: Some(80 << 30),
            ..GpuSample::default()
        };
        let mut text = format!("{CSV_HEADER}\r\n");
        for i in 0..5 {
            text += &csv_row(
                1_796_210_437.0 + f64::from(i) / 10.0,
                &GpuSample {
                    index: i % 2,
                    ..s.clone()
                },
            );
        }
        std::fs::write(&path, &text).unwrap();
        let from_file = read_series(&path).unwrap();
        assert_eq!(from_file, series_of_lines(text.lines()));
        assert_eq!(from_file.power.as_ref().unwrap()["0"].len(), 3);
        assert_eq!(from_file.memory_mib.as_ref().unwrap()["1"][0].1, 81920.0);
        assert_eq!(
            read_series(&dir.join("absent.csv")),
            Err(vec!["telemetry_file_missing"])
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// InferenceX's reader (ours) gives the same verdict on rows with the memory column as on
    /// the same rows without it.
    #[test]
    fn the_memory_column_leaves_the_power_reading_unchanged() {
        let s = GpuSample {
            index: 2,
            power_w: Some(412.345),
            memory_used_bytes: Some(80 << 30),
            ..GpuSample::default()
        };
        let rows: String = (0..4)
            .map(|i| csv_row(1_796_210_437.105 + f64::from(i), &s))
            .collect();
        let with = format!("{CSV_HEADER}\n{rows}");
        let old_header = CSV_HEADER.trim_end_matches(", memory.used [MiB]");
        let without = format!("{old_header}\n{}", rows.replace(", 81920 MiB", ""));
        assert!(without.lines().nth(1).unwrap().ends_with("[N/A]"));
        let span = (1_796_210_437.5, 1_796_210_439.5);
        let verdict =
            |text: &str| inferencex::verdict_of_text(text, span, Some(1), MAX_SAMPLE_GAP_S);
        let (a, b) = (verdict(&with), verdict(&without));
        assert_eq!(a, b);
        assert_eq!(a.power_valid, 1, "{a:?}");
        assert_eq!(a.avg_power_w, Some(412.35));
    }

    #[test]
    fn timestamps_are_utc_calendar_dates_with_floored_milliseconds() {
        for (unix_s, want) in [
            (0.0, "1970/01/01 00:00:00.000"),
            (951_782_400.999_9, "2000/02/29 00:00:00.999"), // a leap day of a century year
            (4_107_542_399.5, "2100/02/28 23:59:59.500"),   // 2100 is not a leap year
            (4_107_542_400.0, "2100/03/01 00:00:00.000"),
            (1_796_210_437.105, "2026/12/02 11:20:37.105"),
            (1_798_761_599.001_5, "2026/12/31 23:59:59.001"),
        ] {
            assert_eq!(nvidia_smi_timestamp(unix_s), want, "{unix_s}");
        }
    }

    /// Every week from 1970 to 2200: what we write reads back (through the CSV reader's own
    /// calendar arithmetic) as the instant it stands for.
    #[test]
    fn timestamps_read_back_to_the_csv_time_they_stand_for() {
        let mut t = 45_296.789;
        while t < 7_258_118_400.0 {
            let text = nvidia_smi_timestamp(t);
            assert_eq!(
                inferencex::parse_timestamp(&text),
                Some(inferencex::csv_time(t)),
                "{text}"
            );
            t += 86_400.0 * 7.0 + 1.0;
        }
    }
}
