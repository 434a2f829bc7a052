//! A line chart of the resident bytes per tier over one recorded step, written as SVG text by
//! hand (a plotting crate would be most of the examples' build time for one chart).

use std::fmt::Write;

use burn_spill::tape::{StepTape, TierSample};

use super::units::bytes;

const WIDTH: f64 = 900.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
/// More points than pixels only make the file big; buckets keep each one's maximum, so that
/// peaks survive the thinning.
const MAX_POINTS: usize = 2 * (WIDTH as usize);

/// A tier's name, its colour, and how to read it from a sample.
type Series = (&'static str, &'static str, fn(&TierSample) -> u64);

/// The plot of `tape`'s tier samples, with the budget and the plain peak as reference lines.
pub fn resident_plot(tape: &StepTape, budget: Option<u64>, plain_peak: u64, title: &str) -> String {
    let samples = thin(&tape.tiers);
    let end_ns = tape
        .duration_ns
        .max(samples.last().map_or(1, |s| s.t_ns))
        .max(1);
    let top_bytes = samples
        .iter()
        .map(|s| s.device.max(s.host).max(s.disk))
        .chain([plain_peak, budget.unwrap_or(0)])
        .max()
        .unwrap_or(1)
        .max(1) as f64
        * 1.08;
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |t_ns: u64| LEFT + plot_w * t_ns as f64 / end_ns as f64;
    let y = |b: u64| TOP + plot_h * (1.0 - b as f64 / top_bytes);

    let mut svg = open(WIDTH, HEIGHT, title);

    // Axes, gridlines and labels.
    for i in 0..=5 {
        let b = (top_bytes / 1.08 * i as f64 / 5.0) as u64;
        let yy = y(b);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#e5e5e5"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            WIDTH - RIGHT,
            LEFT - 6.0,
            yy + 4.0,
            bytes(b)
        );
    }
    for i in 0..=5 {
        let t = end_ns * i / 5;
        let xx = x(t);
        let _ = writeln!(
            svg,
            r#"<text x="{xx:.1}" y="{:.1}" text-anchor="middle">{:.1}</text>"#,
            HEIGHT - BOTTOM + 16.0,
            t as f64 / 1e6
        );
    }
    let _ = writeln!(
        svg,
        r##"<line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#333"/><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{:.1}" stroke="#333"/>"##,
        TOP + plot_h,
        WIDTH - RIGHT,
        TOP + plot_h,
        TOP + plot_h
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">time in the step (ms)</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 10.0
    );

    // Reference lines.
    let mut legend: Vec<(&str, String, &str)> = Vec::new();
    let hline = |svg: &mut String, b: u64, color: &str, dash: &str| {
        let _ = writeln!(
            svg,
            r#"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="{color}" stroke-dasharray="{dash}"/>"#,
            WIDTH - RIGHT,
            yy = y(b)
        );
    };
    hline(&mut svg, plain_peak, "#777777", "2,3");
    legend.push((
        "#777777",
        format!("plain peak {}", bytes(plain_peak)),
        "2,3",
    ));
    if let Some(b) = budget {
        hline(&mut svg, b, "#d62728", "6,4");
        legend.push(("#d62728", format!("budget {}", bytes(b)), "6,4"));
    }

    // One step line per tier: a sample holds until the next one.
    let series: [Series; 3] = [
        ("device", "#1f77b4", |s| s.device),
        ("host", "#ff7f0e", |s| s.host),
        ("disk", "#2ca02c", |s| s.disk),
    ];
    for (name, color, value) in series {
        let peak = samples.iter().map(value).max().unwrap_or(0);
        if peak == 0 && name != "device" {
            continue;
        }
        let mut points = String::new();
        let mut last: Option<u64> = None;
        for s in &samples {
            if let Some(prev) = last {
                let _ = write!(points, "{:.1},{:.1} ", x(s.t_ns), y(prev));
            }
            let _ = write!(points, "{:.1},{:.1} ", x(s.t_ns), y(value(s)));
            last = Some(value(s));
        }
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"#,
            points.trim_end()
        );
        legend.push((color, format!("{name} (peak {})", bytes(peak)), ""));
    }

    // The legend sits in the top right corner on a white box, over whatever lines run there.
    let lx = WIDTH - RIGHT - 230.0;
    let _ = writeln!(
        svg,
        r##"<rect x="{:.1}" y="{:.1}" width="226" height="{:.1}" fill="white" fill-opacity="0.85" stroke="#cccccc"/>"##,
        lx - 6.0,
        TOP - 4.0,
        16.0 * legend.len() as f64 + 6.0
    );
    for (i, (color, label, dash)) in legend.iter().enumerate() {
        let ly = TOP + 8.0 + 16.0 * i as f64;
        let _ = writeln!(
            svg,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 24.0,
            lx + 30.0,
            ly + 4.0,
            escape(label)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// At most [`MAX_POINTS`] samples: consecutive samples are merged, keeping each tier's maximum
/// and the first sample's time.
fn thin(samples: &[TierSample]) -> Vec<TierSample> {
    if samples.len() <= MAX_POINTS {
        return samples.to_vec();
    }
    samples
        .chunks(samples.len().div_ceil(MAX_POINTS))
        .map(|chunk| TierSample {
            t_ns: chunk[0].t_ns,
            device: chunk.iter().map(|s| s.device).max().unwrap_or(0),
            host: chunk.iter().map(|s| s.host).max().unwrap_or(0),
            disk: chunk.iter().map(|s| s.disk).max().unwrap_or(0),
        })
        .collect()
}

/// A white SVG canvas of `width` x `height` with `title` centred on top; close it with
/// `</svg>`.
pub fn open(width: f64, height: f64, title: &str) -> String {
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="22" font-size="14" text-anchor="middle">{}</text>"#,
        width / 2.0,
        escape(title)
    );
    svg
}

pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
