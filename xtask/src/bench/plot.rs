//! A small SVG line chart (no fonts or system libraries needed): benchmarks draw their
//! figures with it.

use std::fmt::Write as _;

pub struct Series {
    pub name: String,
    pub color: &'static str,
    pub points: Vec<(f64, f64)>,
}

pub struct Chart<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub log_x: bool,
    pub log_y: bool,
}

const W: f64 = 760.0;
const H: f64 = 440.0;
const L: f64 = 80.0;
const R: f64 = 190.0;
const T: f64 = 40.0;
const B: f64 = 60.0;

fn tr(v: f64, log: bool) -> f64 {
    if log {
        v.max(1e-12).log10()
    } else {
        v
    }
}

fn label(v: f64) -> String {
    if v >= 1e6 {
        format!("{}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{}k", v / 1e3)
    } else if v >= 1.0 || v == 0.0 {
        format!("{v}")
    } else {
        format!("{v:.3}")
    }
}

/// Tick values: powers of ten on a log axis, five steps on a linear one.
fn ticks(lo: f64, hi: f64, log: bool) -> Vec<f64> {
    if log {
        (lo.floor() as i32..=hi.ceil() as i32)
            .map(|e| 10f64.powi(e))
            .collect()
    } else {
        (0..=5).map(|i| lo + (hi - lo) * i as f64 / 5.0).collect()
    }
}

pub fn svg(chart: &Chart, series: &[Series]) -> String {
    let pts = series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (x, y) in pts {
        let (x, y) = (tr(*x, chart.log_x), tr(*y, chart.log_y));
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if chart.log_y {
        y0 = y0.floor();
        y1 = y1.ceil();
    } else {
        y0 = 0.0;
        y1 *= 1.1;
    }
    if chart.log_x {
        x0 = x0.floor();
        x1 = x1.ceil();
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if y1 <= y0 {
        y1 = y0 + 1.0;
    }
    let px = |x: f64| L + (tr(x, chart.log_x) - x0) / (x1 - x0) * (W - L - R);
    let py = |y: f64| H - B - (tr(y, chart.log_y) - y0) / (y1 - y0) * (H - T - B);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/><text x="{}" y="24" text-anchor="middle" font-size="15">{}</text>"#,
        (W - R + L) / 2.0,
        chart.title
    );
    for t in ticks(x0, x1, chart.log_x) {
        let x = px(t);
        let _ = write!(
            s,
            r##"<line x1="{x}" y1="{}" x2="{x}" y2="{}" stroke="#ddd"/><text x="{x}" y="{}" text-anchor="middle">{}</text>"##,
            T,
            H - B,
            H - B + 16.0,
            label(t)
        );
    }
    for t in ticks(y0, y1, chart.log_y) {
        let y = py(t);
        let _ = write!(
            s,
            r##"<line x1="{L}" y1="{y}" x2="{}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
            W - R,
            L - 6.0,
            y + 4.0,
            label((t * 1000.0).round() / 1000.0)
        );
    }
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text><text transform="translate(18 {}) rotate(-90)" text-anchor="middle">{}</text>"#,
        (W - R + L) / 2.0,
        H - 18.0,
        chart.x_label,
        (H - B + T) / 2.0,
        chart.y_label
    );
    for (i, se) in series.iter().enumerate() {
        let path: Vec<String> = se
            .points
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y)))
            .collect();
        let _ = write!(
            s,
            r#"<polyline fill="none" stroke="{}" stroke-width="2.5" points="{}"/>"#,
            se.color,
            path.join(" ")
        );
        for (x, y) in &se.points {
            let _ = write!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="4" fill="{}"/>"#,
                px(*x),
                py(*y),
                se.color
            );
        }
        let ly = T + 20.0 + i as f64 * 22.0;
        let _ = write!(
            s,
            r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
            W - R + 15.0,
            W - R + 40.0,
            se.color,
            W - R + 46.0,
            ly + 4.0,
            se.name
        );
    }
    s.push_str("</svg>\n");
    s
}
