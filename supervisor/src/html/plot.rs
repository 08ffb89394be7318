//! The report's plots: plotters drawing to SVG strings, inlined in the page. Axes and text are
//! drawn in a placeholder colour that becomes `currentColor`, so one SVG reads in both themes.
use plotters::coord::Shift;
use plotters::prelude::*;

/// Drawn as this, then replaced by `currentColor` (the page's text colour).
const INK: RGBColor = RGBColor(1, 2, 3);
const INK_HEX: &str = "#010203";
/// Series colours readable on a light and a dark background.
pub const PALETTE: &[RGBColor] = &[
    RGBColor(66, 133, 244),
    RGBColor(234, 134, 50),
    RGBColor(52, 168, 83),
    RGBColor(214, 69, 65),
    RGBColor(155, 106, 214),
    RGBColor(23, 170, 178),
    RGBColor(190, 150, 30),
    RGBColor(140, 140, 140),
];
/// JIT compilation, wherever it is marked.
pub const JIT: RGBColor = RGBColor(214, 69, 65);
const W: u32 = 900;
/// Points drawn per line at most (a one-hour, 100 ms power series is 36,000).
const MAX_POINTS: usize = 1200;

pub type Series = (String, Vec<(f64, f64)>);

fn font(size: u32) -> TextStyle<'static> {
    ("sans-serif", size).into_font().color(&INK)
}

fn svg(
    height: u32,
    draw: impl FnOnce(&DrawingArea<SVGBackend<'_>, Shift>) -> Result<(), String>,
) -> String {
    let mut buf = String::new();
    let result = {
        let root = SVGBackend::with_string(&mut buf, (W, height)).into_drawing_area();
        draw(&root).and_then(|()| root.present().map_err(|e| e.to_string()))
    };
    match result {
        Ok(()) => buf.replace(INK_HEX, "currentColor"),
        Err(e) => format!("<p class=\"note\">plot failed: {}</p>", super::esc(&e)),
    }
}

/// Every `k`-th point, the last kept: the shape survives, the page stays small. Points that are
/// not finite are not drawn (the plotting library loops forever on an infinite range).
pub fn thin(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let points: Vec<(f64, f64)> = points.iter().copied().filter(finite).collect();
    drawn(points.len(), |i| points[i])
}

/// The points drawn of `len`, each made by `point` from its index: every k-th, and the last. What
/// [`thin`] returns (up to MAX_POINTS + 1 points) it returns unchanged: `cdf_points` thins before
/// `lines` is given the points.
fn drawn<T>(len: usize, point: impl Fn(usize) -> T) -> Vec<T> {
    let k = if len <= MAX_POINTS + 1 {
        1
    } else {
        len.div_ceil(MAX_POINTS)
    };
    let mut out: Vec<T> = (0..len).step_by(k).map(&point).collect();
    if k > 1 {
        out.push(point(len - 1));
    }
    out
}

fn finite(p: &(f64, f64)) -> bool {
    p.0.is_finite() && p.1.is_finite()
}

/// The axes' ranges over the finite points; `None` when there are none, or when the ranges
/// themselves are not finite (values near f64::MAX: no power or time is).
fn bounds(series: &[Series]) -> Option<((f64, f64), (f64, f64))> {
    let pts = series.iter().flat_map(|s| s.1.iter()).filter(|p| finite(p));
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, 0.0f64, f64::MIN);
    for (x, y) in pts {
        x0 = x0.min(*x);
        x1 = x1.max(*x);
        y0 = y0.min(*y);
        y1 = y1.max(*y);
    }
    if x1 < x0 {
        return None;
    }
    let x1 = if x1 > x0 { x1 } else { x0 + 1.0 };
    let y1 = if y1 > y0 { y1 * 1.05 } else { y0 + 1.0 };
    [x1 - x0, y1 - y0]
        .iter()
        .all(|r| r.is_finite())
        .then_some(((x0, x1), (y0, y1)))
}

/// Lines over time, `shade`d spans (windows) behind them.
pub fn lines(
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
    shade: &[(f64, f64, String)],
) -> String {
    let Some(((x0, x1), (y0, y1))) = bounds(series) else {
        return "<p class=\"note\">no data</p>".into();
    };
    svg(300, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, font(15))
            .margin(8)
            .x_label_area_size(34)
            .y_label_area_size(60)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .axis_style(INK)
            .bold_line_style(INK.mix(0.12))
            .light_line_style(TRANSPARENT)
            .label_style(font(11))
            .x_desc(x_desc)
            .y_desc(y_desc)
            .draw()
            .map_err(|e| e.to_string())?;
        for (a, b, name) in shade {
            let (a, b) = (a.max(x0), b.min(x1));
            if b <= a {
                continue;
            }
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(a, y0), (b, y1)],
                    INK.mix(0.07).filled(),
                )))
                .map_err(|e| e.to_string())?;
            chart
                .draw_series(std::iter::once(Text::new(
                    name.clone(),
                    (a, y1 * 0.97),
                    font(11),
                )))
                .map_err(|e| e.to_string())?;
        }
        for (i, (name, pts)) in series.iter().enumerate() {
            let c = PALETTE[i % PALETTE.len()];
            chart
                .draw_series(LineSeries::new(thin(pts), c.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label(name.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(3))
                });
        }
        chart
            .configure_series_labels()
            .label_font(font(11))
            .border_style(INK.mix(0.3))
            .background_style(TRANSPARENT)
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(|e| e.to_string())
    })
}

/// Empirical CDFs of one latency per window (seconds in, milliseconds drawn).
pub fn cdf(title: &str, series: Vec<(String, Vec<f64>)>) -> String {
    let lines_of: Vec<Series> = series
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(name, mut v)| {
            v.retain(|x| x.is_finite());
            v.sort_by(f64::total_cmp);
            (format!("{name} (n={})", v.len()), cdf_points(&v))
        })
        .collect();
    if lines_of.is_empty() {
        return format!("<p class=\"note\">{}: no requests</p>", super::esc(title));
    }
    lines(title, "ms", "fraction of requests", &lines_of, &[])
}

/// The empirical CDF of sorted values (seconds) as at most [`MAX_POINTS`] (+1) points in ms: the
/// same points [`thin`] would keep of all of them, without making all of them first (a long
/// run's inter-token latencies are millions).
fn cdf_points(sorted: &[f64]) -> Vec<(f64, f64)> {
    let n = sorted.len();
    drawn(n, |i| (sorted[i] * 1000.0, (i + 1) as f64 / n as f64))
}

/// One bar of a Gantt row: `[start, end]` seconds, its label.
pub struct Bar {
    pub start: f64,
    pub end: f64,
    pub label: String,
    pub jit: bool,
}

/// Rows of bars against time; `jit` spans marked across the whole chart.
pub fn gantt(title: &str, rows: &[(String, Vec<Bar>)], jit: &[(f64, f64)]) -> String {
    let x1 = rows
        .iter()
        .flat_map(|r| r.1.iter().map(|b| b.end))
        .chain(jit.iter().map(|j| j.1))
        .fold(1.0f64, f64::max);
    let n = rows.len().max(1) as i32;
    svg(70 + 34 * n as u32, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, font(15))
            .margin(8)
            .x_label_area_size(34)
            .y_label_area_size(10)
            .build_cartesian_2d(0f64..x1 * 1.02, 0f64..n as f64)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .axis_style(INK)
            .bold_line_style(INK.mix(0.12))
            .light_line_style(TRANSPARENT)
            .disable_y_mesh()
            .y_labels(0)
            .label_style(font(11))
            .x_desc("seconds since spawn")
            .draw()
            .map_err(|e| e.to_string())?;
        chart
            .draw_series(
                jit.iter().map(|(a, b)| {
                    Rectangle::new([(*a, 0.0), (*b, n as f64)], JIT.mix(0.18).filled())
                }),
            )
            .map_err(|e| e.to_string())?;
        for (i, (name, bars)) in rows.iter().enumerate() {
            // Top row first.
            let y = (n - 1 - i as i32) as f64;
            for (k, b) in bars.iter().enumerate() {
                let c = if b.jit {
                    JIT
                } else {
                    PALETTE[k % PALETTE.len()]
                };
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [
                            (b.start, y + 0.2),
                            (b.end.max(b.start + x1 * 0.002), y + 0.8),
                        ],
                        c.mix(0.85).filled(),
                    )))
                    .map_err(|e| e.to_string())?;
                if (b.end - b.start) > x1 * 0.06 {
                    chart
                        .draw_series(std::iter::once(Text::new(
                            b.label.clone(),
                            (b.start + x1 * 0.004, y + 0.62),
                            font(10),
                        )))
                        .map_err(|e| e.to_string())?;
                }
            }
            chart
                .draw_series(std::iter::once(Text::new(
                    name.clone(),
                    (x1 * 0.002, y + 0.98),
                    font(10),
                )))
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_that_are_not_finite_or_near_the_largest_float_are_not_drawn() {
        let with_inf: Vec<Series> = vec![(
            "GPU 0".into(),
            vec![
                (0.0, 100.0),
                (1.0, f64::INFINITY),
                (2.0, 200.0),
                (f64::NAN, 1.0),
            ],
        )];
        let svg = lines("power", "s", "W", &with_inf, &[]);
        assert!(svg.contains("<svg"), "the finite points are drawn: {svg}");
        assert_eq!(thin(&with_inf[0].1), [(0.0, 100.0), (2.0, 200.0)]);
        // 1.79e308 W is finite, but the axis padded by 5 % is not
        let huge: Vec<Series> = vec![("GPU 0".into(), vec![(0.0, 1.79e308), (1.0, 1.0)])];
        assert_eq!(bounds(&huge), None);
        assert!(lines("power", "s", "W", &huge, &[]).contains("no data"));
    }

    #[test]
    fn a_cdf_thinned_as_it_is_made_draws_the_points_of_one_made_whole_and_thinned() {
        for n in [
            1,
            2,
            MAX_POINTS,
            MAX_POINTS + 1,
            2 * MAX_POINTS + 7,
            5_100_000,
        ] {
            let sorted: Vec<f64> = (0..n).map(|i| i as f64 * 1e-6).collect();
            let whole: Vec<(f64, f64)> = sorted
                .iter()
                .enumerate()
                .map(|(i, x)| (x * 1000.0, (i + 1) as f64 / n as f64))
                .collect();
            let made = cdf_points(&sorted);
            assert_eq!(made, thin(&whole), "n = {n}");
            // `lines` thins again what it is given: the points drawn are these
            assert_eq!(thin(&made), made, "n = {n}");
            assert!(made.len() <= MAX_POINTS + 1, "n = {n}: {}", made.len());
        }
    }
}
