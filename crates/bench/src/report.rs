//! The HTML report of a load benchmark: one self-contained file (inline SVG plots drawn with
//! `plotters`' SVG backend, no script, no external file) beside the tables printed to stdout,
//! for people to look at.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;

/// One plot of the report.
pub enum Chart {
    /// Distribution of latency samples (milliseconds).
    Histogram { title: String, samples_ms: Vec<f64> },
    /// One bar per case (label, value): the closed-loop benchmarks' throughput per case.
    Bars {
        title: String,
        y_label: String,
        bars: Vec<(String, f64)>,
    },
    /// A series of (x, y) points joined by a line.
    Line {
        title: String,
        x_label: String,
        y_label: String,
        points: Vec<(f64, f64)>,
    },
}

/// A report: a title, the run's description and tables as text, and the plots.
pub struct Report {
    pub title: String,
    pub text: String,
    pub charts: Vec<Chart>,
}

const SIZE: (u32, u32) = (720, 360);

/// Writes the report to `path` as one HTML file.
pub fn write(report: &Report, path: &Path) -> anyhow::Result<()> {
    let html = html(report)?;
    std::fs::write(path, html).with_context(|| format!("writing the report {}", path.display()))
}

/// The report as an HTML document with each chart as an inline `<svg>`.
pub fn html(report: &Report) -> anyhow::Result<String> {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>\
         <style>body{{font-family:sans-serif;margin:2em;max-width:60em}}\
         pre{{background:#f4f4f4;padding:1em;overflow-x:auto}}\
         figure{{margin:1.5em 0}}</style></head><body>\n<h1>{title}</h1>\n<pre>{text}</pre>\n",
        title = escape(&report.title),
        text = escape(&report.text),
    );
    for chart in &report.charts {
        let (title, svg) = match chart {
            Chart::Histogram { title, samples_ms } => (title, histogram_svg(title, samples_ms)?),
            Chart::Line {
                title,
                x_label,
                y_label,
                points,
            } => (title, line_svg(title, x_label, y_label, points)?),
            Chart::Bars {
                title,
                y_label,
                bars,
            } => (title, bars_svg(title, y_label, bars)?),
        };
        let _ = write!(
            out,
            "<figure class=\"chart\"><figcaption>{}</figcaption>\n{svg}\n</figure>\n",
            escape(title)
        );
    }
    out.push_str("</body></html>\n");
    Ok(out)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Bins of equal width over [min, max] of `samples`: (bin start, count), and the width.
pub fn bins(samples: &[f64], count: usize) -> (Vec<(f64, u32)>, f64) {
    let lo = samples.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = samples.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if samples.is_empty() || !lo.is_finite() || !hi.is_finite() {
        return (Vec::new(), 1.0);
    }
    // All equal: one bin around the value.
    let width = if hi > lo {
        (hi - lo) / count as f64
    } else {
        lo.abs().max(1e-3) * 0.1
    };
    let n = if hi > lo { count } else { 1 };
    let mut out: Vec<(f64, u32)> = (0..n).map(|i| (lo + i as f64 * width, 0)).collect();
    for &v in samples {
        let i = (((v - lo) / width) as usize).min(n - 1);
        out[i].1 += 1;
    }
    (out, width)
}

fn histogram_svg(title: &str, samples: &[f64]) -> anyhow::Result<String> {
    let (bins, width) = bins(samples, 40);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let x0 = bins.first().map_or(0.0, |b| b.0);
        let x1 = bins.last().map_or(1.0, |b| b.0 + width);
        let y1 = bins.iter().map(|b| b.1).max().unwrap_or(1).max(1);
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(x0..x1, 0u32..y1 + y1 / 10 + 1)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc("ms")
            .y_desc("samples")
            .draw()
            .map_err(plot_err)?;
        chart
            .draw_series(
                bins.iter().map(|&(x, c)| {
                    Rectangle::new([(x, 0), (x + width, c)], BLUE.mix(0.6).filled())
                }),
            )
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}

/// Writes a closed-loop benchmark's report (its run description and table as text, and one
/// bar chart of `y_label` per case) to `path`, and says where.
pub fn write_cases(
    path: &Path,
    title: &str,
    text: String,
    y_label: &str,
    bars: Vec<(String, f64)>,
) -> anyhow::Result<()> {
    let report = Report {
        title: title.into(),
        text,
        charts: vec![Chart::Bars {
            title: format!("{y_label} by case"),
            y_label: y_label.into(),
            bars,
        }],
    };
    write(&report, path)?;
    println!("\nreport: {}", path.display());
    Ok(())
}

fn bars_svg(title: &str, y_label: &str, bars: &[(String, f64)]) -> anyhow::Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let n = bars.len().max(1) as f64;
        let y1 = bars.iter().map(|b| b.1).fold(0.0, f64::max);
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(10)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..n, 0.0..(y1 * 1.25).max(1.0))
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_desc(y_label)
            .draw()
            .map_err(plot_err)?;
        chart
            .draw_series(bars.iter().enumerate().map(|(i, &(_, v))| {
                let x = i as f64;
                Rectangle::new([(x + 0.15, 0.0), (x + 0.85, v)], BLUE.mix(0.6).filled())
            }))
            .map_err(plot_err)?;
        // Each case's name and value above its bar.
        chart
            .draw_series(bars.iter().enumerate().map(|(i, (name, v))| {
                Text::new(
                    format!("{name}: {v:.1}"),
                    (i as f64 + 0.15, v + y1 * 0.04),
                    ("sans-serif", 12),
                )
            }))
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}

fn line_svg(
    title: &str,
    x_label: &str,
    y_label: &str,
    points: &[(f64, f64)],
) -> anyhow::Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let x0 = points.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
        let x1 = points.iter().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
        let y1 = points.iter().map(|p| p.1).fold(0.0, f64::max);
        let (x0, x1) = if x0.is_finite() && x1 > x0 {
            (x0, x1)
        } else {
            (0.0, 1.0)
        };
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(x0..x1, 0.0..(y1 * 1.1).max(1.0))
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .draw()
            .map_err(plot_err)?;
        chart
            .draw_series(LineSeries::new(points.iter().copied(), RED.stroke_width(2)))
            .map_err(plot_err)?;
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 3, RED.filled())))
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}

fn plot_err<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> anyhow::Error {
    anyhow::anyhow!("drawing the report's plot: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bins_count_every_sample_once() {
        let (b, w) = bins(&[1.0, 2.0, 2.5, 3.0, 5.0], 4);
        assert_eq!(w, 1.0);
        assert_eq!(
            b,
            vec![(1.0, 1), (2.0, 2), (3.0, 1), (4.0, 1)],
            "the maximum falls in the last bin"
        );
        let (b, _) = bins(&[7.0, 7.0], 10);
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].1, 2);
        assert!(bins(&[], 10).0.is_empty());
    }

    #[test]
    fn the_report_is_one_html_file_with_an_svg_per_chart() {
        let r = Report {
            title: "bench <http>".into(),
            text: "requests 3 ok".into(),
            charts: vec![
                Chart::Histogram {
                    title: "TTFT".into(),
                    samples_ms: vec![1.0, 2.0, 2.0, 4.0],
                },
                Chart::Line {
                    title: "tokens/s over time".into(),
                    x_label: "s".into(),
                    y_label: "tokens/s".into(),
                    points: vec![(0.0, 10.0), (1.0, 30.0), (2.0, 20.0)],
                },
            ],
        };
        let h = html(&r).expect("report");
        assert!(h.starts_with("<!DOCTYPE html>"));
        assert!(h.contains("<title>bench &lt;http&gt;</title>"));
        assert_eq!(h.matches("<svg").count(), 2);
        // The background and the histogram's bars, and the line with its three points.
        assert!(h.matches("<rect").count() > 3);
        assert!(h.contains("<polyline"));
        assert!(h.matches("<circle").count() >= 3);
        assert!(!h.contains("<script") && !h.contains("href=\"http"));
    }

    #[test]
    fn a_closed_loop_report_has_a_bar_and_a_label_per_case() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("r.html");
        let cases = vec![
            ("no adapter".to_string(), 120.0),
            ("churn".to_string(), 80.5),
        ];
        write_cases(
            &path,
            "lmi bench lora",
            "| table |".into(),
            "decode tok/s",
            cases,
        )
        .expect("report");
        let h = std::fs::read_to_string(&path).expect("written");
        assert_eq!(h.matches("<svg").count(), 1);
        // The background and the two bars.
        assert_eq!(h.matches("<rect").count(), 3, "{h}");
        assert!(h.contains("no adapter: 120.0") && h.contains("churn: 80.5"));
    }
}
