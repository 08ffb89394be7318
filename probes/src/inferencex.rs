//! InferenceX's power verdict (`utils/aggregate_power.py`): the rules, reason codes and
//! integration method of the benchmark pipeline, as one accumulator of telemetry readings over a
//! span ([`Readings`]). The live sampler's windows (from the rows it kept) and the offline
//! `report --bench-result` (from the CSV, a line at a time) both feed it, so a window we call
//! valid is one InferenceX calls valid on the same CSV and span.
//!
//! The rules (per GPU, over the rows whose timestamps lie within `max_gap` of the span):
//! - rows with an unparseable timestamp anywhere: `invalid_timestamp_sample`; a power that is
//!   missing, `[N/A]` or negative: `invalid_power_sample`; an empty GPU id: `gpu_identity_missing`;
//! - fewer than two samples: `insufficient_power_samples`; the first sample after the span's start
//!   or the last before its end (no slack at all): `benchmark_window_not_bracketed`;
//! - a gap between consecutive samples, from the last at or before the start to the first at or
//!   after the end, over `max_gap` (3 s): `sampling_gap_exceeded`;
//! - another GPU count than expected: `expected_gpu_count_mismatch`.
//!
//! Readings at the same timestamp are averaged; energy is the trapezoid over the samples inside
//! the span with power linearly interpolated at both edges. Reasons keep their discovery order.
use serde::Serialize;
use std::collections::HashMap;
use std::path::Path;

/// The InferenceX aggregation voids a run whose samples are further apart than this.
pub const MAX_SAMPLE_GAP_S: f64 = 3.0;

pub const INTEGRATION_METHOD: &str = "per_device_trapezoidal_with_linear_boundary_interpolation";

/// One GPU's part of the verdict.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DeviceVerdict {
    pub id: String,
    /// Samples within `max_gap` of the span (after averaging equal timestamps); asked live at a
    /// window's close, those of the 3 s after it are still to come.
    pub samples: usize,
    /// Largest gap between the samples that matter (absent when not bracketed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_sample_gap_s: Option<f64>,
    /// Energy over the span (absent when not bracketed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub energy_j: Option<f64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub issues: Vec<&'static str>,
}

/// The verdict over one span.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Verdict {
    pub power_valid: u8,
    pub reasons: Vec<&'static str>,
    pub benchmark_start_time_unix: f64,
    pub benchmark_end_time_unix: f64,
    pub integration_method: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_gpu_count: Option<usize>,
    pub observed_gpu_count: usize,
    /// Trapezoid energy of all GPUs (absent unless every observed GPU has one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_gpu_energy_j: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub avg_total_gpu_power_w: Option<f64>,
    /// Per GPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub avg_power_w: Option<f64>,
    pub gpus: Vec<DeviceVerdict>,
}

impl Verdict {
    pub fn is_valid(&self) -> bool {
        self.power_valid == 1
    }

    fn empty(span: (f64, f64), expected: Option<usize>, reasons: Vec<&'static str>) -> Verdict {
        Verdict {
            power_valid: 0,
            reasons,
            benchmark_start_time_unix: span.0,
            benchmark_end_time_unix: span.1,
            integration_method: INTEGRATION_METHOD,
            expected_gpu_count: expected,
            observed_gpu_count: 0,
            total_gpu_energy_j: None,
            avg_total_gpu_power_w: None,
            avg_power_w: None,
            gpus: Vec::new(),
        }
    }

    /// Add reasons found elsewhere (the benchmark result's) in front, keeping the order, and
    /// recompute validity.
    pub fn with_leading_reasons(mut self, first: &[&'static str]) -> Verdict {
        let mut all: Vec<&'static str> = Vec::new();
        for r in first.iter().chain(self.reasons.iter()) {
            push_reason(&mut all, r);
        }
        self.power_valid = u8::from(all.is_empty());
        self.reasons = all;
        self
    }
}

fn push_reason(reasons: &mut Vec<&'static str>, r: &'static str) {
    if !reasons.contains(&r) {
        reasons.push(r);
    }
}

/// Numeric GPU ids first, in numeric order; then the others.
fn gpu_order(a: &str, b: &str) -> std::cmp::Ordering {
    let num = |s: &str| {
        (!s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
            .then(|| s.parse::<u128>().ok())
            .flatten()
    };
    match (num(a), num(b)) {
        (Some(x), Some(y)) => x.cmp(&y).then_with(|| a.cmp(b)),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => a.cmp(b),
    }
}

/// One reading as the verdict takes it: a CSV row, or a sample the sampler kept, borrowed.
#[derive(Debug, Clone, Copy)]
pub struct Reading<'a> {
    pub unix_s: Option<f64>,
    pub gpu: Option<&'a str>,
    pub power_w: Option<f64>,
}

/// The readings that count for a span, grouped per GPU as they are added: 16 bytes a reading
/// (a verdict over a day of 8 GPUs at 10 Hz holds 7 M of them), with the reasons found on the
/// way. Readings of equal timestamps stay apart until [`Readings::verdict`] averages them.
pub struct Readings {
    span: (f64, f64),
    expected_gpus: Option<usize>,
    max_gap_s: f64,
    reasons: Vec<&'static str>,
    missing_identity: bool,
    /// GPU → (timestamp, power) in the order added.
    per_gpu: HashMap<Box<str>, Vec<(f64, f64)>>,
    /// The span or a setting is unusable: the verdict is this, whatever is added.
    settled: Option<Verdict>,
}

impl Readings {
    /// For a verdict over `span` (unix seconds). `expected_gpus`: the GPU count the server uses
    /// (tp × pp), when known.
    pub fn new(span: (f64, f64), expected_gpus: Option<usize>, max_gap_s: f64) -> Readings {
        let mut r = Readings {
            span,
            expected_gpus,
            max_gap_s,
            reasons: Vec::new(),
            missing_identity: false,
            per_gpu: HashMap::new(),
            settled: None,
        };
        let (start, end) = span;
        if !start.is_finite() || !end.is_finite() || end <= start {
            r.settled = Some(Verdict::empty(
                span,
                expected_gpus,
                vec!["invalid_benchmark_window"],
            ));
        } else if !max_gap_s.is_finite() || max_gap_s <= 0.0 {
            r.settled = Some(Verdict::empty(
                span,
                expected_gpus,
                vec!["invalid_max_sample_gap"],
            ));
        } else if expected_gpus == Some(0) {
            push_reason(&mut r.reasons, "invalid_expected_gpu_count");
        }
        r
    }

    /// Whether a reading at `t` can count: within `max_gap` of the span.
    fn within(&self, t: f64) -> bool {
        t >= self.span.0 - self.max_gap_s && t <= self.span.1 + self.max_gap_s
    }

    /// One reading, in file order (reasons keep the order they are found in).
    pub fn add(&mut self, r: Reading<'_>) {
        if self.settled.is_some() {
            return;
        }
        let Some(t) = r.unix_s.filter(|t| t.is_finite()) else {
            push_reason(&mut self.reasons, "invalid_timestamp_sample");
            return;
        };
        if !self.within(t) {
            return;
        }
        let Some(p) = r.power_w.filter(|p| p.is_finite() && *p >= 0.0) else {
            push_reason(&mut self.reasons, "invalid_power_sample");
            return;
        };
        let Some(gpu) = r.gpu.filter(|g| !g.is_empty()) else {
            self.missing_identity = true;
            return;
        };
        // Looked up by the borrowed id: only a GPU's first reading allocates.
        match self.per_gpu.get_mut(gpu) {
            Some(readings) => readings.push((t, p)),
            None => {
                self.per_gpu.insert(gpu.into(), vec![(t, p)]);
            }
        }
    }

    /// The verdict once the readings are read: over them, or, when the telemetry could not be
    /// used at all, with its file-level reasons.
    pub fn verdict_after(self, read: Result<(), Vec<&'static str>>) -> Verdict {
        let why = match read {
            Ok(()) => return self.verdict(),
            Err(why) => why,
        };
        if let Some(v) = self.settled {
            return v;
        }
        let mut reasons = self.reasons;
        for r in why {
            push_reason(&mut reasons, r);
        }
        Verdict::empty(self.span, self.expected_gpus, reasons)
    }

    /// InferenceX's verdict on the readings added.
    pub fn verdict(self) -> Verdict {
        let Readings {
            span,
            expected_gpus,
            max_gap_s,
            mut reasons,
            missing_identity,
            per_gpu,
            settled,
        } = self;
        if let Some(v) = settled {
            return v;
        }
        if missing_identity {
            push_reason(&mut reasons, "gpu_identity_missing");
        }
        if per_gpu.is_empty() {
            push_reason(&mut reasons, "no_usable_power_samples");
            return Verdict::empty(span, expected_gpus, reasons);
        }
        let mut per_gpu: Vec<_> = per_gpu.into_iter().collect();
        per_gpu.sort_by(|a, b| gpu_order(&a.0, &b.0));
        if expected_gpus.is_some_and(|n| n > 0 && n != per_gpu.len()) {
            push_reason(&mut reasons, "expected_gpu_count_mismatch");
        }
        let gpus: Vec<DeviceVerdict> = per_gpu
            .into_iter()
            .map(|(id, readings)| {
                let d = device_verdict(&id, averaged(readings), span, max_gap_s);
                for r in &d.issues {
                    push_reason(&mut reasons, r);
                }
                d
            })
            .collect();
        let (start, end) = span;
        let total = gpus.iter().map(|g| g.energy_j).sum::<Option<f64>>();
        let avg_total = total.map(|e| e / (end - start));
        Verdict {
            power_valid: u8::from(reasons.is_empty()),
            reasons,
            benchmark_start_time_unix: start,
            benchmark_end_time_unix: end,
            integration_method: INTEGRATION_METHOD,
            expected_gpu_count: expected_gpus,
            observed_gpu_count: gpus.len(),
            total_gpu_energy_j: total,
            avg_total_gpu_power_w: avg_total,
            avg_power_w: avg_total.map(|w| w / gpus.len() as f64),
            gpus,
        }
    }
}

/// One GPU's readings in time order, those of one timestamp averaged (summed in the order
/// added). In place: a sampler's readings come sorted, and are not sorted again.
fn averaged(mut readings: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    if !readings.is_sorted_by(|a, b| a.0.total_cmp(&b.0).is_le()) {
        // Stable: readings of one timestamp keep the order they were added in.
        readings.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    let mut out = 0;
    let mut i = 0;
    while i < readings.len() {
        let t = readings[i].0;
        let (mut sum, mut n) = (0.0, 0u32);
        while i < readings.len() && readings[i].0.to_bits() == t.to_bits() {
            sum += readings[i].1;
            n += 1;
            i += 1;
        }
        readings[out] = (t, sum / f64::from(n));
        out += 1;
    }
    readings.truncate(out);
    readings
}

/// One GPU's part of the verdict, from its averaged samples in time order (at least one).
fn device_verdict(
    id: &str,
    samples: Vec<(f64, f64)>,
    span: (f64, f64),
    max_gap_s: f64,
) -> DeviceVerdict {
    let (start, end) = span;
    let mut d = DeviceVerdict {
        id: id.to_string(),
        samples: samples.len(),
        max_sample_gap_s: None,
        energy_j: None,
        issues: Vec::new(),
    };
    let (first, last) = (samples[0].0, samples[samples.len() - 1].0);
    if samples.len() < 2 {
        d.issues.push("insufficient_power_samples");
    } else if first > start || last < end {
        d.issues.push("benchmark_window_not_bracketed");
    } else {
        // From the last sample at or before the start to the first at or after the end.
        let lo = samples.partition_point(|s| s.0 <= start) - 1;
        let hi = samples.partition_point(|s| s.0 < end);
        let max_gap = samples[lo..=hi.min(samples.len() - 1)]
            .windows(2)
            .map(|w| w[1].0 - w[0].0)
            .fold(0.0, f64::max);
        d.max_sample_gap_s = Some(max_gap);
        if max_gap > max_gap_s {
            d.issues.push("sampling_gap_exceeded");
        }
        d.energy_j = Some(integrate(&samples, start, end));
    }
    d
}

/// InferenceX's verdict on a telemetry CSV file over `span`, read a line at a time: what it
/// holds is the readings within reach of the span (16 bytes each), not the file or its rows.
pub fn verdict_of_csv(
    path: &Path,
    span: (f64, f64),
    expected_gpus: Option<usize>,
    max_gap_s: f64,
) -> Verdict {
    let mut readings = Readings::new(span, expected_gpus, max_gap_s);
    let read = read_csv_rows(path, |r| readings.add(r));
    readings.verdict_after(read)
}

/// Power at `t`, linearly interpolated between the samples around it (`samples` bracket `t`).
fn power_at(samples: &[(f64, f64)], t: f64) -> f64 {
    let right = samples.partition_point(|s| s.0 < t);
    if right < samples.len() && (samples[right].0 - t).abs() <= 1e-9 {
        return samples[right].1;
    }
    let (Some(l), Some(r)) = (
        right.checked_sub(1).and_then(|i| samples.get(i)),
        samples.get(right),
    ) else {
        return f64::NAN; // unreachable for a bracketed span
    };
    l.1 + (t - l.0) / (r.0 - l.0) * (r.1 - l.1)
}

/// Trapezoid over `[start, end]`, interpolated at both edges.
fn integrate(samples: &[(f64, f64)], start: f64, end: f64) -> f64 {
    let mut prev = (start, power_at(samples, start));
    let mut e = 0.0;
    for &s in samples.iter().filter(|s| start < s.0 && s.0 < end) {
        e += (s.0 - prev.0) * (prev.1 + s.1) / 2.0;
        prev = s;
    }
    let last = (end, power_at(samples, end));
    e + (last.0 - prev.0) * (prev.1 + last.1) / 2.0
}

/// InferenceX's normalisation of a valid verdict by the benchmark's counts (absent when invalid
/// or a count is unknown or zero): `joules_per_successful_query`, `_input_token`,
/// `_output_token`, `_total_token`.
pub fn per_token(
    v: &Verdict,
    completed: Option<u64>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
) -> Vec<(&'static str, f64)> {
    let Some(e) = v.total_gpu_energy_j.filter(|_| v.is_valid()) else {
        return Vec::new();
    };
    let per = |n: Option<u64>| n.filter(|n| *n > 0).map(|n| e / n as f64);
    [
        ("joules_per_successful_query", per(completed)),
        ("joules_per_input_token", per(input_tokens)),
        ("joules_per_output_token", per(output_tokens)),
        (
            "joules_per_total_token",
            per(input_tokens.zip(output_tokens).map(|(i, o)| i + o)),
        ),
    ]
    .into_iter()
    .filter_map(|(k, v)| Some((k, v?)))
    .collect()
}

/// A benchmark result's fields, as the JSON gave them (absent: missing, not a number, or for the
/// counts not an integer).
#[derive(Debug, Clone, Default)]
pub struct BenchFields {
    pub start_unix: Option<f64>,
    pub end_unix: Option<f64>,
    pub duration: Option<f64>,
    pub completed: Option<i64>,
    pub total_input_tokens: Option<i64>,
    pub total_output_tokens: Option<i64>,
}

/// InferenceX's checks of the benchmark result: `Err` with `invalid_benchmark_window` when there
/// is no usable span, else the span and the reasons its fields give
/// (`benchmark_duration_mismatch` beyond max(0.5 s, 1 %), `invalid_*_count`).
pub fn bench_reasons(b: &BenchFields) -> Result<((f64, f64), Vec<&'static str>), &'static str> {
    let (Some(start), Some(end), Some(duration)) = (b.start_unix, b.end_unix, b.duration) else {
        return Err("invalid_benchmark_window");
    };
    if !(start.is_finite() && end.is_finite() && duration.is_finite())
        || end <= start
        || duration <= 0.0
    {
        return Err("invalid_benchmark_window");
    }
    let mut reasons = Vec::new();
    let span = end - start;
    if (duration - span).abs() > (span * 0.01).max(0.5) {
        reasons.push("benchmark_duration_mismatch");
    }
    for (n, why) in [
        (b.completed, "invalid_successful_query_count"),
        (b.total_input_tokens, "invalid_input_token_count"),
        (b.total_output_tokens, "invalid_output_token_count"),
    ] {
        if n.is_none_or(|n| n <= 0) {
            reasons.push(why);
        }
    }
    Ok(((start, end), reasons))
}

/// Energy from the hardware counter over the readings that bracket a span: from the last reading
/// at or before its start to the first at or after its end (a counter that goes backwards was
/// reset: counted from its new value).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CounterEnergy {
    pub total_gpu_energy_j: f64,
    /// The span the readings actually cover (over all GPUs).
    pub from_unix: f64,
    pub to_unix: f64,
    pub resets: u32,
}

/// `reads`: per GPU, (unix seconds, counter joules) in any order. Absent unless every GPU has
/// readings on both sides of the span.
pub fn counter_energy(reads: &[Vec<(f64, f64)>], span: (f64, f64)) -> Option<CounterEnergy> {
    if reads.is_empty() {
        return None;
    }
    let mut out = CounterEnergy {
        total_gpu_energy_j: 0.0,
        from_unix: f64::INFINITY,
        to_unix: f64::NEG_INFINITY,
        resets: 0,
    };
    for gpu in reads {
        let mut r = gpu.clone();
        r.sort_by(|a, b| a.0.total_cmp(&b.0));
        let lo = r.partition_point(|x| x.0 <= span.0).checked_sub(1)?;
        let hi = r.partition_point(|x| x.0 < span.1);
        if hi >= r.len() {
            return None;
        }
        for w in r[lo..=hi].windows(2) {
            if w[1].1 >= w[0].1 {
                out.total_gpu_energy_j += w[1].1 - w[0].1;
            } else {
                out.resets += 1;
                out.total_gpu_energy_j += w[1].1;
            }
        }
        out.from_unix = out.from_unix.min(r[lo].0);
        out.to_unix = out.to_unix.max(r[hi].0);
    }
    Some(out)
}

// ---------------------------------------------------------------------------------------------
// Reading telemetry files: the nvidia-smi CSV layout (what `--power-csv` writes and
// `nvidia-smi --query-gpu=... --format=csv` prints), columns found as InferenceX finds them.

/// Seconds since the epoch of a civil date-time read as UTC (the supervisor writes UTC; run
/// InferenceX with `TZ=UTC` on its files). Whole seconds plus microseconds, as Python adds them.
fn civil_to_unix(y: i64, mo: i64, d: i64, h: i64, mi: i64, s: i64, us: i64) -> Option<f64> {
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 61 {
        return None;
    }
    let y2 = if mo <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2.rem_euclid(400);
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    let secs = days * 86400 + h * 3600 + mi * 60 + s;
    Some(secs as f64 + us as f64 / 1e6)
}

/// The CSV's timestamp for a wall-clock time: floored to the millisecond, as written.
pub fn csv_time(unix_s: f64) -> f64 {
    let secs = unix_s.floor();
    let ms = ((unix_s - secs) * 1000.0).floor();
    secs + (ms * 1000.0) / 1e6
}

/// Digits at the front of `s` (at most `max`), with the rest.
fn digits(s: &str, min: usize, max: usize) -> Option<(i64, &str)> {
    let n = s.bytes().take(max).take_while(u8::is_ascii_digit).count();
    if n < min {
        return None;
    }
    Some((s[..n].parse().ok()?, &s[n..]))
}

/// `YYYY/MM/DD HH:MM:SS[.ffffff]` or ISO 8601 `YYYY-MM-DD[T ]HH:MM:SS[.ffffff][Z|±HH:MM]`.
fn parse_civil(v: &str, date_sep: char, time_sep: &[char]) -> Option<f64> {
    let (y, r) = digits(v, 4, 4)?;
    let r = r.strip_prefix(date_sep)?;
    let (mo, r) = digits(r, 1, 2)?;
    let r = r.strip_prefix(date_sep)?;
    let (d, r) = digits(r, 1, 2)?;
    let r = r.strip_prefix(time_sep)?;
    let (h, r) = digits(r, 1, 2)?;
    let r = r.strip_prefix(':')?;
    let (mi, r) = digits(r, 1, 2)?;
    let r = r.strip_prefix(':')?;
    let (s, mut r) = digits(r, 1, 2)?;
    let mut us = 0;
    if let Some(f) = r.strip_prefix('.') {
        let n = f.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 || n > 6 {
            return None;
        }
        us = f[..n].parse::<i64>().ok()? * 10i64.pow(6 - n as u32);
        r = &f[n..];
    }
    let mut offset = 0;
    if date_sep == '-' && !r.is_empty() {
        if r == "Z" {
            r = "";
        } else {
            let sign = match r.as_bytes()[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let (oh, rr) = digits(&r[1..], 2, 2)?;
            let rr = rr.strip_prefix(':').unwrap_or(rr);
            let (om, rr) = digits(rr, 2, 2)?;
            offset = sign * (oh * 3600 + om * 60);
            r = rr;
        }
    }
    if !r.is_empty() {
        return None;
    }
    civil_to_unix(y, mo, d, h, mi, s, us).map(|t| t - offset as f64)
}

/// The first `-?\d+(\.\d+)?` in `s` (leftmost), as a number.
fn first_number(s: &str) -> Option<(f64, bool)> {
    let b = s.as_bytes();
    let start = (0..b.len()).find(|&i| {
        b[i].is_ascii_digit() || (b[i] == b'-' && b.get(i + 1).is_some_and(u8::is_ascii_digit))
    })?;
    let mut end = start + 1;
    while end < b.len() && b[end].is_ascii_digit() {
        end += 1;
    }
    if b.get(end) == Some(&b'.') && b.get(end + 1).is_some_and(u8::is_ascii_digit) {
        end += 1;
        while end < b.len() && b[end].is_ascii_digit() {
            end += 1;
        }
    }
    let whole = start == 0 && end == b.len();
    Some((s[start..end].parse().ok()?, whole))
}

/// A timestamp cell: epoch seconds (or milliseconds past 1e12), nvidia-smi's format, ISO 8601.
pub fn parse_timestamp(v: &str) -> Option<f64> {
    let v = v.trim();
    if v.is_empty() {
        return None;
    }
    if let Some((n, true)) = first_number(v) {
        return Some(if n > 1e12 { n / 1000.0 } else { n });
    }
    parse_civil(v, '/', &[' '])
        .or_else(|| parse_civil(v, '-', &['T', ' ']))
        .filter(|t| t.is_finite())
}

/// A power cell (`412.34 W`, a bare number, `[N/A]`): its first number.
pub fn parse_power(v: &str) -> Option<f64> {
    let v = v.trim();
    if v.is_empty() || ["[n/a]", "n/a", "na"].contains(&v.to_ascii_lowercase().as_str()) {
        return None;
    }
    first_number(v).map(|(n, _)| n)
}

/// Fields of one CSV line (`skipinitialspace`, double quotes honoured).
pub(crate) fn fields(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let (mut quoted, mut at_start) = (false, true);
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if at_start && c == ' ' {
            continue;
        }
        if at_start && c == '"' {
            quoted = true;
            at_start = false;
            continue;
        }
        at_start = false;
        if quoted {
            if c == '"' {
                if chars.peek() == Some(&'"') {
                    cur.push('"');
                    chars.next();
                } else {
                    quoted = false;
                }
            } else {
                cur.push(c);
            }
        } else if c == ',' {
            out.push(std::mem::take(&mut cur));
            at_start = true;
        } else {
            cur.push(c);
        }
    }
    out.push(cur);
    out
}

/// The header's cells (trimmed), from the first of `lines` (empty ones already skipped).
pub(crate) fn header<S: AsRef<str>>(lines: &mut impl Iterator<Item = S>) -> Vec<String> {
    lines
        .next()
        .map(|h| {
            fields(h.as_ref())
                .into_iter()
                .map(|f| f.trim().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Timestamp, power and GPU-id columns, all three, or InferenceX's reasons for those missing.
pub(crate) fn power_columns(header: &[String]) -> Result<(usize, usize, usize), Vec<&'static str>> {
    let (time, power, gpu) = columns(header);
    let mut missing = Vec::new();
    for (col, why) in [
        (time, "timestamp_column_missing"),
        (power, "power_column_missing"),
        (gpu, "gpu_identity_column_missing"),
    ] {
        if col.is_none() {
            missing.push(why);
        }
    }
    match (time, power, gpu) {
        (Some(t), Some(p), Some(g)) => Ok((t, p, g)),
        _ => Err(missing),
    }
}

/// Timestamp, power and GPU-id columns, found as InferenceX finds them.
pub(crate) fn columns(header: &[String]) -> (Option<usize>, Option<usize>, Option<usize>) {
    let lower: Vec<String> = header.iter().map(|h| h.to_ascii_lowercase()).collect();
    let time = lower.iter().position(|h| h.contains("time"));
    let power = lower.iter().position(|h| {
        h.contains("power") && !["limit", "cap", "max", "min"].iter().any(|x| h.contains(x))
    });
    let gpu = lower.iter().position(|h| {
        ["index", "gpu", "gpu_id", "gpu_index", "card", "device"].contains(&h.trim())
    });
    (time, power, gpu)
}

/// Each row of a telemetry CSV's lines (any text they hold; bad rows give readings without
/// values), or the file-level reasons it cannot be used for.
fn csv_rows<S: AsRef<str>>(
    lines: impl Iterator<Item = S>,
    mut row: impl FnMut(Reading<'_>),
) -> Result<(), Vec<&'static str>> {
    let mut lines = lines.filter(|l| !l.as_ref().is_empty());
    let header = header(&mut lines);
    if header.iter().any(|c| too_long(c)) {
        return Err(vec!["telemetry_file_unreadable"]);
    }
    let (time, power, gpu) = power_columns(&header)?;
    for l in lines {
        let f = fields(l.as_ref());
        if f.iter().any(|c| too_long(c)) {
            return Err(vec!["telemetry_file_unreadable"]);
        }
        let cell = |i: usize| f.get(i).map_or("", |s| s.trim());
        row(Reading {
            unix_s: parse_timestamp(cell(time)),
            gpu: Some(cell(gpu)).filter(|g| !g.is_empty()),
            power_w: parse_power(cell(power)),
        });
    }
    Ok(())
}

/// InferenceX's verdict on a telemetry CSV's text over `span`.
#[cfg(test)]
pub(crate) fn verdict_of_text(
    text: &str,
    span: (f64, f64),
    expected_gpus: Option<usize>,
    max_gap_s: f64,
) -> Verdict {
    let mut readings = Readings::new(span, expected_gpus, max_gap_s);
    let read = csv_rows(text.lines(), |r| readings.add(r));
    readings.verdict_after(read)
}

/// Each row of a telemetry CSV file, a line at a time, or the file-level reasons it cannot be
/// used for.
fn read_csv_rows(path: &Path, row: impl FnMut(Reading<'_>)) -> Result<(), Vec<&'static str>> {
    read_csv_lines(path, |lines| csv_rows(lines, row))?
}

/// `read` over the lines of the telemetry CSV at `path`, or InferenceX's reasons the file cannot
/// be read: it cannot be opened, or a read failed part-way (`telemetry_file_unreadable`).
pub(crate) fn read_csv_lines<T>(
    path: &Path,
    read: impl FnOnce(&mut CsvLines) -> T,
) -> Result<T, Vec<&'static str>> {
    let mut lines = CsvLines::open(path)?;
    let out = read(&mut lines);
    if lines.failed {
        return Err(vec!["telemetry_file_unreadable"]);
    }
    Ok(out)
}

/// The longest line of a telemetry CSV read (16 MiB): InferenceX's reader (Python's `csv`)
/// refuses a field over 128 KiB, so a longer line cannot be a row it reads.
const MAX_CSV_LINE: usize = 16 << 20;

/// Python's `csv.field_size_limit()` default: InferenceX finds the file unreadable past it.
const MAX_CSV_FIELD: usize = 128 << 10;

/// A field Python's `csv` refuses (in characters, as it counts).
fn too_long(field: &str) -> bool {
    field.len() > MAX_CSV_FIELD && field.chars().count() > MAX_CSV_FIELD
}

/// A telemetry CSV file's lines, read a line at a time (`lines::CappedLines`). A read that fails
/// part-way, or a line too long for any CSV reader, ends them and sets `failed`.
pub(crate) struct CsvLines {
    lines: crate::lines::CappedLines<std::io::BufReader<std::fs::File>>,
    failed: bool,
}

impl CsvLines {
    /// The file's lines, or InferenceX's reason it cannot be read (missing, empty, unreadable).
    fn open(path: &Path) -> Result<CsvLines, Vec<&'static str>> {
        match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(vec!["telemetry_file_missing"])
            }
            Err(_) => return Err(vec!["telemetry_file_unreadable"]),
            Ok(m) if !m.is_file() => return Err(vec!["telemetry_file_missing"]),
            Ok(m) if m.len() == 0 => return Err(vec!["telemetry_file_empty"]),
            Ok(_) => {}
        }
        let file = std::fs::File::open(path).map_err(|_| vec!["telemetry_file_unreadable"])?;
        let reader = std::io::BufReader::with_capacity(1 << 16, file);
        Ok(CsvLines {
            lines: crate::lines::CappedLines::csv(reader, MAX_CSV_LINE),
            failed: false,
        })
    }
}

impl Iterator for CsvLines {
    type Item = String;

    fn next(&mut self) -> Option<String> {
        if self.failed {
            return None;
        }
        match self.lines.next()? {
            Ok(crate::lines::Line::Text(l)) => Some(l),
            Ok(crate::lines::Line::TooLong) | Err(_) => {
                self.failed = true;
                None
            }
        }
    }
}

/// Header of the energy-counter sidecar the sampler writes next to `--power-csv`
/// (`<stem>_energy.csv`): one row per counter reading, joules since the driver loaded.
pub const ENERGY_CSV_HEADER: &str = "timestamp, gpu, total_energy_consumption [J]";

/// Where the energy sidecar of a power CSV lies: `gpu_metrics.csv` → `gpu_metrics_energy.csv`.
pub fn energy_sidecar(csv: &Path) -> std::path::PathBuf {
    let stem = csv
        .file_stem()
        .map_or_else(|| "power".to_string(), |s| s.to_string_lossy().into_owned());
    csv.with_file_name(format!("{stem}_energy.csv"))
}

/// The counter readings of an energy sidecar, per GPU index (rows that do not parse are skipped).
pub fn parse_energy_csv(text: &str) -> Vec<Vec<(f64, f64)>> {
    let mut per: Vec<Vec<(f64, f64)>> = Vec::new();
    for line in text.lines().skip(1) {
        let f = fields(line);
        let (Some(t), Some(Ok(i)), Some(Ok(e))) = (
            f.first().and_then(|s| parse_timestamp(s)),
            f.get(1).map(|s| s.trim().parse::<usize>()),
            f.get(2).map(|s| s.trim().parse::<f64>()),
        ) else {
            continue;
        };
        if i >= 4096 || !e.is_finite() {
            continue;
        }
        if per.len() <= i {
            per.resize(i + 1, Vec::new());
        }
        per[i].push((t, e));
    }
    per
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The verdict over one GPU's (time, power) readings.
    fn verdict_of(pts: &[(f64, f64)], span: (f64, f64), expected: Option<usize>) -> Verdict {
        let mut r = Readings::new(span, expected, MAX_SAMPLE_GAP_S);
        for &(t, p) in pts {
            r.add(Reading {
                unix_s: Some(t),
                gpu: Some("0"),
                power_w: Some(p),
            });
        }
        r.verdict()
    }

    #[test]
    fn trapezoid_with_interpolated_edges() {
        let v = verdict_of(
            &[(0.0, 100.0), (1.0, 200.0), (2.0, 200.0)],
            (0.5, 1.5),
            Some(1),
        );
        assert_eq!(v.reasons, Vec::<&str>::new());
        // 150→200 over 0.5 s, 200 over 0.5 s
        assert!(
            (v.total_gpu_energy_j.unwrap() - 187.5).abs() < 1e-9,
            "{v:?}"
        );
        assert_eq!(v.gpus[0].max_sample_gap_s, Some(1.0));
    }

    #[test]
    fn no_bracketing_slack() {
        let v = verdict_of(&[(1.001, 100.0), (2.0, 100.0)], (1.0, 2.0), None);
        assert_eq!(v.reasons, ["benchmark_window_not_bracketed"]);
        assert_eq!(v.total_gpu_energy_j, None, "absent, never 0");
    }

    #[test]
    fn gaps_count_from_the_sample_before_the_start() {
        let v = verdict_of(&[(0.0, 1.0), (3.5, 1.0), (5.0, 1.0)], (3.0, 4.0), Some(1));
        assert_eq!(v.reasons, ["sampling_gap_exceeded"]);
    }

    #[test]
    fn cells_parse_as_inferencex_reads_them() {
        assert_eq!(
            parse_timestamp("2026/12/02 15:31:47.976"),
            Some(1_796_225_507.0 + 0.976)
        );
        assert_eq!(parse_timestamp("1796225507976"), Some(1_796_225_507.976));
        assert_eq!(
            parse_timestamp("2026-12-02T15:31:47+01:00"),
            Some(1_796_225_507.0 - 3600.0)
        );
        assert_eq!(parse_timestamp("yesterday"), None);
        assert_eq!(parse_power(" 77.72 W"), Some(77.72));
        assert_eq!(parse_power("[N/A]"), None);
        assert_eq!(parse_power("-5 W"), Some(-5.0));
        assert_eq!(csv_time(1_796_225_507.976_9), 1_796_225_507.0 + 0.976);
    }

    #[test]
    fn counter_brackets_or_is_absent() {
        let reads = vec![vec![(0.0, 10.0), (5.0, 60.0), (10.0, 110.0)]];
        let c = counter_energy(&reads, (1.0, 6.0)).unwrap();
        assert_eq!(
            (c.total_gpu_energy_j, c.from_unix, c.to_unix),
            (100.0, 0.0, 10.0)
        );
        assert_eq!(counter_energy(&reads, (1.0, 11.0)), None);
    }

    #[test]
    fn benchmark_fields_checked_as_inferencex_does() {
        let b = BenchFields {
            start_unix: Some(10.0),
            end_unix: Some(20.0),
            duration: Some(9.0),
            completed: Some(4),
            total_input_tokens: Some(0),
            total_output_tokens: Some(9),
        };
        assert_eq!(
            bench_reasons(&b),
            Ok((
                (10.0, 20.0),
                vec!["benchmark_duration_mismatch", "invalid_input_token_count"]
            ))
        );
        assert_eq!(
            bench_reasons(&BenchFields::default()),
            Err("invalid_benchmark_window")
        );
    }

    #[test]
    fn a_file_read_a_line_at_a_time_gives_the_verdict_of_its_whole_text() {
        let dir = std::env::temp_dir().join(format!("csv-lines-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("gpu.csv");
        // CRLF ends, an empty line, invalid UTF-8 in a cell that matters (the id), and a last
        // line without its newline
        let mut bytes = b"timestamp, index, power.draw [W]\r\n".to_vec();
        for (i, t) in [10.0, 11.0, 12.0, 13.0].iter().enumerate() {
            bytes.extend_from_slice(format!("{t}, 0, {} W\r\n", 100 + i).as_bytes());
            bytes.extend_from_slice(format!("{t}, 1").as_bytes());
            bytes.extend_from_slice(b"\xff, 50 W\n\n");
        }
        bytes.extend_from_slice(b"14.0, 0, 104 W");
        std::fs::write(&path, &bytes).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        let mut rows = Vec::new();
        csv_rows(text.lines(), |r| {
            rows.push((r.unix_s, r.gpu.map(String::from), r.power_w))
        })
        .unwrap();
        assert_eq!(rows.len(), 9);
        assert_eq!(rows[1].1.as_deref(), Some("1\u{fffd}"));
        let mut read = Vec::new();
        read_csv_rows(&path, |r| {
            read.push((r.unix_s, r.gpu.map(String::from), r.power_w))
        })
        .unwrap();
        assert_eq!(read, rows);
        let span = (10.5, 13.5);
        let v = verdict_of_csv(&path, span, Some(2), MAX_SAMPLE_GAP_S);
        assert_eq!(v, verdict_of_text(&text, span, Some(2), MAX_SAMPLE_GAP_S));
        assert_eq!(v.observed_gpu_count, 2);
        assert_eq!(
            verdict_of_csv(&dir.join("absent.csv"), span, None, MAX_SAMPLE_GAP_S).reasons,
            ["telemetry_file_missing"]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
