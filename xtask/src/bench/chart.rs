//! The roofline chart: achieved GFLOP/s against arithmetic intensity (FLOP per byte of least
//! traffic), one marker per row, under each device's bandwidth roof (its copy kernel, measured
//! in the run) and compute roof (the CPU's multiply-add peak measured in the run, `peak.rs`; for
//! GPUs a table of known peaks; else the best rate measured).
//!
//! The SVG is written by hand: the chart is a few lines, markers and labels, and a plotting
//! crate would need system font libraries to place text.

use super::peak::Peak;
use super::report::Row;
use std::fmt::Write as _;

/// The known FP32 peak of a device, GFLOP/s, by its description ([`KNOWN_PEAKS`]).
pub fn known_peak(device: &str) -> Option<f64> {
    KNOWN_PEAKS.iter().find(|(name, _)| device.contains(name)).map(|k| k.1)
}

/// Known FP32 (non-tensor-core) peaks, GFLOP/s, by a substring of the device description.
const KNOWN_PEAKS: [(&str, f64); 6] = [
    ("H200", 66_900.0),
    ("H100", 66_900.0),
    ("A100", 19_500.0),
    ("L4", 30_300.0),
    ("RTX 4090", 82_600.0),
    ("T4", 8_100.0),
];

const PLOT_X: f64 = 80.0;
const PLOT_Y: f64 = 50.0;
const PLOT_W: f64 = 760.0;
const PLOT_H: f64 = 640.0;
const LEGEND_X: f64 = 880.0;
const LINE_H: f64 = 13.0;

fn colour(backend: &str) -> &'static str {
    match backend {
        "cpu" => "#1f77b4",
        "wgpu" => "#d95f02",
        "cuda" => "#1b9e77",
        _ => "#555555",
    }
}

/// A point of the chart.
struct Point<'a> {
    row: &'a Row,
    intensity: f64,
    gflops: f64,
}

/// One device's roofs.
struct Roof {
    backend: &'static str,
    device: String,
    bandwidth_gbps: f64,
    /// The traffic of the copy the bandwidth roof comes from.
    copy_bytes: f64,
    peak_gflops: f64,
    /// Where the compute roof comes from: `None` for the best rate measured (dashed).
    peak_source: Option<&'static str>,
}

/// Log-scale axis from `lo` to `hi` (powers of ten around the data).
struct Axis {
    lo: f64,
    hi: f64,
}

impl Axis {
    fn around(values: impl Iterator<Item = f64>) -> Axis {
        let (lo, hi) = values
            .filter(|v| v.is_finite() && *v > 0.0)
            .fold((f64::INFINITY, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
        if !lo.is_finite() {
            return Axis { lo: 0.01, hi: 100.0 };
        }
        let lo = 10f64.powf(lo.log10().floor());
        let hi = 10f64.powf(hi.log10().ceil()).max(lo * 10.0);
        Axis { lo, hi }
    }

    /// Where `v` falls, 0 (lo) to 1 (hi).
    fn frac(&self, v: f64) -> f64 {
        (v.max(self.lo).log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10())
    }

    fn decades(&self) -> impl Iterator<Item = f64> + '_ {
        let (a, b) = (self.lo.log10().round() as i32, self.hi.log10().round() as i32);
        (a..=b).map(|e| 10f64.powi(e))
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn fmt_num(v: f64) -> String {
    if v >= 1000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v >= 1.0 {
        format!("{v:.0}")
    } else {
        format!("{v}")
    }
}

/// The chart for `rows` as an SVG document; `cpu_peak`, where measured, is the CPU's compute
/// roof.
pub fn roofline(rows: &[Row], cpu_peak: Option<&Peak>) -> String {
    let points: Vec<Point> = rows
        .iter()
        .filter(|r| r.passed() && r.plot_flops > 0.0 && r.bytes > 0.0)
        .filter_map(|r| {
            let s = r.stats?;
            Some(Point { row: r, intensity: r.plot_flops / r.bytes, gflops: r.plot_flops / s.median_s / 1e9 })
        })
        .collect();
    let mut roofs: Vec<Roof> = Vec::new();
    for p in &points {
        let r = p.row;
        let roof = match roofs.iter_mut().position(|x| x.backend == r.backend) {
            Some(i) => &mut roofs[i],
            None => {
                let known = match cpu_peak {
                    Some(p) if r.backend == "cpu" => Some((p.gflops, "measured FMA peak")),
                    _ => known_peak(&r.device).map(|g| (g, "peak (known)")),
                };
                roofs.push(Roof {
                    backend: r.backend,
                    device: r.device.clone(),
                    bandwidth_gbps: 0.0,
                    copy_bytes: 0.0,
                    peak_gflops: known.map_or(0.0, |k| k.0),
                    peak_source: known.map(|k| k.1),
                });
                let last = roofs.len() - 1;
                &mut roofs[last]
            }
        };
        // The roof is the copy over the most bytes: small copies stay in cache and would put
        // the roof at cache bandwidth, which no large op reaches.
        if let (Some((_, bytes)), Some(gbps)) = (r.copy, r.copy_gbps)
            && bytes > roof.copy_bytes
        {
            roof.copy_bytes = bytes;
            roof.bandwidth_gbps = gbps;
        }
        if roof.peak_source.is_none() {
            roof.peak_gflops = roof.peak_gflops.max(p.gflops);
        }
    }

    let x_axis =
        Axis::around(points.iter().map(|p| p.intensity).chain(roofs.iter().map(|r| r.peak_gflops / r.bandwidth_gbps)));
    let y_axis = Axis::around(points.iter().map(|p| p.gflops).chain(roofs.iter().map(|r| r.peak_gflops)));
    let px = |v: f64| PLOT_X + x_axis.frac(v) * PLOT_W;
    let py = |v: f64| PLOT_Y + PLOT_H - y_axis.frac(v) * PLOT_H;

    let legend_lines = roofs.len() * 2 + points.len() + 4;
    let height = (PLOT_Y + PLOT_H + 60.0).max(PLOT_Y + legend_lines as f64 * LINE_H + 20.0);
    let width = 1420.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Arial, sans-serif" font-size="11">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="28" font-size="16" font-weight="bold">tilekit roofline: achieved GFLOP/s vs arithmetic intensity</text>"#,
        PLOT_X
    );
    // Grid and axes.
    let _ = writeln!(svg, r##"<g stroke="#dddddd" stroke-width="1">"##);
    for d in x_axis.decades() {
        let _ = writeln!(svg, r#"<line x1="{0:.1}" y1="{1}" x2="{0:.1}" y2="{2}"/>"#, px(d), PLOT_Y, PLOT_Y + PLOT_H);
    }
    for d in y_axis.decades() {
        let _ = writeln!(svg, r#"<line x1="{1}" y1="{0:.1}" x2="{2}" y2="{0:.1}"/>"#, py(d), PLOT_X, PLOT_X + PLOT_W);
    }
    let _ = writeln!(svg, "</g>");
    let _ = writeln!(
        svg,
        r#"<rect x="{PLOT_X}" y="{PLOT_Y}" width="{PLOT_W}" height="{PLOT_H}" fill="none" stroke="black"/>"#
    );
    for d in x_axis.decades() {
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            px(d),
            PLOT_Y + PLOT_H + 16.0,
            fmt_num(d)
        );
    }
    for d in y_axis.decades() {
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
            PLOT_X - 6.0,
            py(d) + 4.0,
            fmt_num(d)
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle" font-size="12">arithmetic intensity (FLOP per byte of least traffic)</text>"#,
        PLOT_X + PLOT_W / 2.0,
        PLOT_Y + PLOT_H + 36.0
    );
    let _ = writeln!(
        svg,
        r#"<text transform="translate(22,{}) rotate(-90)" text-anchor="middle" font-size="12">achieved GFLOP/s (median wall time)</text>"#,
        PLOT_Y + PLOT_H / 2.0
    );

    // Roofs: bandwidth (slope) up to the ridge, then compute (flat).
    for roof in &roofs {
        if roof.bandwidth_gbps <= 0.0 || roof.peak_gflops <= 0.0 {
            continue;
        }
        let c = colour(roof.backend);
        let ridge = roof.peak_gflops / roof.bandwidth_gbps;
        let x0 = x_axis.lo.max(y_axis.lo / roof.bandwidth_gbps);
        let dash = if roof.peak_source.is_some() { "" } else { r#" stroke-dasharray="6,4""# };
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{c}" stroke-width="2" stroke-opacity="0.6"{dash} points="{:.1},{:.1} {:.1},{:.1} {:.1},{:.1}"/>"#,
            px(x0),
            py(x0 * roof.bandwidth_gbps),
            px(ridge),
            py(roof.peak_gflops),
            px(x_axis.hi),
            py(roof.peak_gflops)
        );
    }

    // Markers, numbered; the legend on the right says what each number is.
    for (i, p) in points.iter().enumerate() {
        let (x, y) = (px(p.intensity), py(p.gflops));
        let c = colour(p.row.backend);
        let _ = match p.row.dtype {
            "f16" => writeln!(
                svg,
                r#"<rect x="{:.1}" y="{:.1}" width="8" height="8" fill="{c}" fill-opacity="0.8"/>"#,
                x - 4.0,
                y - 4.0
            ),
            "bf16" => writeln!(
                svg,
                r#"<polygon points="{:.1},{:.1} {:.1},{:.1} {:.1},{:.1}" fill="{c}" fill-opacity="0.8"/>"#,
                x,
                y - 5.0,
                x - 5.0,
                y + 4.0,
                x + 5.0,
                y + 4.0
            ),
            _ => writeln!(svg, r#"<circle cx="{x:.1}" cy="{y:.1}" r="4.5" fill="{c}" fill-opacity="0.8"/>"#),
        };
        let _ =
            writeln!(svg, r#"<text x="{:.1}" y="{:.1}" font-size="9" fill="{c}">{}</text>"#, x + 6.0, y - 3.0, i + 1);
    }

    // Legend.
    let mut ly = PLOT_Y + 4.0;
    let mut line = |svg: &mut String, text: &str, colour: &str, bold: bool| {
        let weight = if bold { r#" font-weight="bold""# } else { "" };
        let _ = writeln!(svg, r#"<text x="{LEGEND_X}" y="{ly:.1}" fill="{colour}"{weight}>{}</text>"#, esc(text));
        ly += LINE_H;
    };
    for roof in &roofs {
        let c = colour(roof.backend);
        let name: String = roof.device.chars().take(60).collect();
        line(&mut svg, &format!("{}: {name}", roof.backend), c, true);
        line(
            &mut svg,
            &format!(
                "   roofs: copy {:.1} GB/s (over {:.1} MB); {} {:.1} GFLOP/s",
                roof.bandwidth_gbps,
                roof.copy_bytes / 1e6,
                roof.peak_source.unwrap_or("best measured (dashed)"),
                roof.peak_gflops
            ),
            c,
            false,
        );
    }
    line(&mut svg, "markers: circle f32, square f16, triangle bf16", "black", false);
    line(&mut svg, "", "black", false);
    for (i, p) in points.iter().enumerate() {
        let r = p.row;
        let text =
            format!("{:>3} {} {} {} {} {}: {:.2} GFLOP/s", i + 1, r.backend, r.dtype, r.op, r.shape, r.suite, p.gflops);
        line(&mut svg, &text, colour(r.backend), false);
    }
    if points.is_empty() {
        line(&mut svg, "no row passed with a FLOP count: nothing to plot", "black", false);
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_spans_whole_decades() {
        let a = Axis::around([0.3, 42.0].into_iter());
        assert_eq!((a.lo, a.hi), (0.1, 100.0));
        assert!((a.frac(1.0) - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(a.decades().count(), 4);
    }

    #[test]
    fn empty_chart_is_still_an_svg() {
        let svg = roofline(&[], None);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("nothing to plot"));
    }
}
