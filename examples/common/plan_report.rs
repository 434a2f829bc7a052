//! The dry-run planner's output for the examples: the table of predictions per budget, the SVG
//! of predicted overhead against budget, and the `--plan DEVICE` prediction for an example's
//! own recorded step.

use std::fmt::Write as _;

use burn_spill::plan::{DeviceProfile, DryRun, PhaseFigures};
use burn_spill::tape::StepTape;
use burn_spill::{SpillConfig, SpillStats};

use super::units::bytes;

/// A `--device` / `--plan` value: a built-in profile, `measured` (this machine, from `stats`),
/// or a profile file.
pub fn profile(name: &str, stats: Option<&SpillStats>) -> Result<DeviceProfile, String> {
    if name.trim().eq_ignore_ascii_case("measured") {
        return match stats {
            Some(stats) => Ok(DeviceProfile::measured(stats)),
            None => Err(
                "`measured` needs the stats of a run on this machine; use `--plan measured` on \
                 the resnet or transformer example, or give a built-in profile or a file"
                    .into(),
            ),
        };
    }
    DeviceProfile::named_or_file(name).map_err(|e| e.to_string())
}

fn millis(seconds: f64) -> String {
    if seconds >= 1.0 {
        format!("{seconds:.2} s")
    } else if seconds >= 1e-3 {
        format!("{:.2} ms", seconds * 1e3)
    } else {
        format!("{:.1} µs", seconds * 1e6)
    }
}

/// The predictions as a table: one row per budget.
pub fn table(runs: &[DryRun]) -> String {
    let mut out = String::new();
    let Some(first) = runs.first() else {
        return "no budget to predict (each is below what the largest op needs)\n".into();
    };
    let _ = writeln!(
        out,
        "predicted on {}: unlimited step {}, device peak {}",
        first.profile,
        millis(first.unlimited_step_seconds),
        bytes(first.unlimited_peak)
    );
    let _ = writeln!(
        out,
        "{:>10} {:>7} {:>10} {:>10} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>9} {:>8} {:>10}",
        "budget",
        "of peak",
        "step",
        "stall",
        "overhead",
        "dev peak",
        "to host",
        "to device",
        "disk",
        "MIN moves",
        "saturated",
        "rebuilds",
        "rebuilding"
    );
    for r in runs {
        let s = &r.simulated;
        let of_peak = if r.budget == u64::MAX {
            "-".to_string()
        } else {
            format!(
                "{:.0}%",
                100.0 * r.budget as f64 / r.unlimited_peak.max(1) as f64
            )
        };
        let budget = if r.budget == u64::MAX {
            "unlimited".to_string()
        } else {
            bytes(r.budget)
        };
        let _ = writeln!(
            out,
            "{:>10} {:>7} {:>10} {:>10} {:>8.1}% {:>10} {:>10} {:>10} {:>10} {:>10} {:>9} {:>8} {:>10}",
            budget,
            of_peak,
            millis(s.step_seconds),
            millis(s.stall_seconds),
            r.overhead * 100.0,
            bytes(s.device_peak),
            bytes(s.traffic.device_to_host + s.traffic.device_to_disk),
            bytes(s.traffic.host_to_device + s.traffic.disk_to_device),
            bytes(s.traffic.device_to_disk + s.traffic.disk_to_device),
            bytes(r.belady_min_bytes),
            format!("{}/{}", s.saturated_windows, s.windows),
            s.rebuilds,
            millis(s.rebuild_seconds),
        );
    }
    // `both` and `recompute` run each budget's steps with the behaviour their dry run predicts
    // fastest.
    for r in runs {
        let Some(chose) = r.chose else { continue };
        let of_peak = 100.0 * r.budget as f64 / r.unlimited_peak.max(1) as f64;
        let _ = writeln!(out, "at {of_peak:.0}% chose: {chose}");
        for (behaviour, overhead) in &r.predicted_behaviours {
            let _ = writeln!(out, "    {:>+8.1}%  {behaviour}", overhead * 100.0);
        }
    }
    out
}

/// One run's time and moves by phase of the step, with each phase's floor (its compute, or its
/// moves at the link's full rate, whichever is longest): where a budget's overhead comes from.
pub fn phases_table(phases: &[PhaseFigures]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>10} {:>6} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "phase", "ops", "time", "compute", "stall", "to host", "to device", "floor"
    );
    for p in phases {
        let _ = writeln!(
            out,
            "{:>10} {:>6} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            p.phase.to_string(),
            p.ops,
            millis(p.seconds),
            millis(p.compute_seconds),
            millis(p.stall_seconds),
            bytes(p.to_host),
            bytes(p.to_device),
            millis(p.floor_seconds),
        );
    }
    out
}

/// Predicted overhead (%) against budget (% of the unlimited peak), as SVG.
pub fn overhead_svg(runs: &[DryRun], title: &str) -> String {
    const W: f64 = 720.0;
    const H: f64 = 400.0;
    const L: f64 = 70.0;
    const R: f64 = 20.0;
    const T: f64 = 40.0;
    const B: f64 = 50.0;
    let points: Vec<(f64, f64)> = runs
        .iter()
        .filter(|r| r.budget != u64::MAX)
        .map(|r| {
            (
                100.0 * r.budget as f64 / r.unlimited_peak.max(1) as f64,
                r.overhead * 100.0,
            )
        })
        .collect();
    let top = points.iter().map(|p| p.1).fold(1.0f64, f64::max) * 1.1;
    let x = |pct: f64| L + (W - L - R) * pct.clamp(0.0, 100.0) / 100.0;
    let y = |ov: f64| T + (H - T - B) * (1.0 - ov.max(0.0) / top);
    let mut svg = super::svg::open(W, H, title);
    for i in 0..=5 {
        let ov = top * i as f64 / 5.0;
        let _ = writeln!(
            svg,
            r##"<line x1="{L}" x2="{}" y1="{y}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{ov:.1}%</text>"##,
            W - R,
            L - 6.0,
            y(ov) + 4.0,
            y = y(ov)
        );
    }
    for pct in (0..=100).step_by(10) {
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle">{pct}%</text>"#,
            x(pct as f64),
            H - B + 18.0
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">device budget, % of the unlimited peak</text>"#,
        (L + W - R) / 2.0,
        H - 12.0
    );
    let _ = writeln!(
        svg,
        r#"<text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">predicted step-time overhead</text>"#,
        (T + H - B) / 2.0,
        (T + H - B) / 2.0
    );
    let path: Vec<String> = points
        .iter()
        .map(|&(p, o)| format!("{:.1},{:.1}", x(p), y(o)))
        .collect();
    let _ = writeln!(
        svg,
        r##"<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="{}"/>"##,
        path.join(" ")
    );
    for &(p, o) in &points {
        let _ = writeln!(
            svg,
            r##"<circle cx="{:.1}" cy="{:.1}" r="3" fill="#1f77b4"/>"##,
            x(p),
            y(o)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// The fractions of the step's peak `--plan` predicts at, with the run's own budget.
pub const PLAN_FRACTIONS: [f64; 5] = [1.0, 0.5, 0.33, 0.25, 0.1];

/// `--plan DEVICE` for an example: its own recorded step predicted on the device at
/// [`PLAN_FRACTIONS`] of the step's peak, with the run's preset and policy. Returns the
/// table, or why there is none.
pub fn predict_own_step(
    tape: &StepTape,
    device: &str,
    stats: &SpillStats,
    config: &SpillConfig,
) -> Result<String, String> {
    let profile = profile(device, Some(stats))?;
    let runs = burn_spill::plan::sweep(tape, &profile, config, &PLAN_FRACTIONS)
        .map_err(|e| e.to_string())?;
    Ok(table(&runs))
}
