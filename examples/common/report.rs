//! The end of a run: the plain-vs-spilled table on stdout, and on request the JSON report, the
//! plot next to it, and the verdict of `--verify` as the exit code.

use std::path::{Path, PathBuf};
use std::time::Duration;

use burn_spill::MoveStats;
use serde::Serialize;

use super::cli::{SpillArgs, exit_usage};
use super::experiment::Outcome;
use super::svg;
pub use super::units::bytes;

fn millis(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn moves(m: &MoveStats) -> String {
    if m.count == 0 {
        return "none".into();
    }
    format!(
        "{} tensors, {} in {}",
        m.count,
        bytes(m.bytes),
        millis(m.time)
    )
}

/// Spilled median step time over plain median step time.
pub fn step_ratio(outcome: &Outcome) -> Option<f64> {
    let plain = outcome.plain.median_step()?.as_secs_f64();
    let spilled = outcome.spilled.median_step()?.as_secs_f64();
    (plain > 0.0).then(|| spilled / plain)
}

/// What the example ran, for the heading and the report.
pub struct RunDescription<M> {
    pub example: &'static str,
    /// One line: the model and its data.
    pub title: String,
    /// The model's configuration, serialised into the report as is.
    pub model: M,
    pub batch: usize,
    pub steps: usize,
}

/// Prints the table, writes the report, plot and verdict; returns the process exit code.
pub fn finish<M: Serialize>(run: &RunDescription<M>, args: &SpillArgs, outcome: &Outcome) -> i32 {
    print_table(run, args, outcome);
    if let Some(path) = &args.report {
        let plot = write_plot(path, run, outcome);
        write_report(path, run, args, outcome, plot.as_deref());
        println!("report: {}", path.display());
        if let Some(plot) = plot {
            println!("plot:   {}", plot.display());
        }
    }
    if let Some(path) = &args.trace
        && path.exists()
    {
        println!("trace:  {} (open in ui.perfetto.dev)", path.display());
    }
    match &outcome.verify {
        Some(v) if !v.matched() => {
            eprintln!("error: --verify: the plain and spilled runs differ: {v:?}");
            1
        }
        _ => 0,
    }
}

fn print_table<M>(run: &RunDescription<M>, args: &SpillArgs, outcome: &Outcome) {
    let stats = &outcome.stats;
    let plain_peak = outcome.plain_peak_device_bytes;
    println!("\n{}", run.title);
    println!(
        "batch {}, {} steps on {}; budget {} = {}, host limit {}, preset {}, policy {}\n",
        run.batch,
        run.steps,
        args.backend,
        args.budget,
        outcome.budget_bytes.map_or("unlimited".into(), bytes),
        outcome.host_limit_bytes.map_or("unlimited".into(), bytes),
        outcome.preset,
        outcome.policy,
    );
    let saving = if plain_peak > 0 {
        format!(
            "{} ({:.0}% of plain)",
            bytes(stats.peak.device),
            100.0 * stats.peak.device as f64 / plain_peak as f64
        )
    } else {
        bytes(stats.peak.device)
    };
    let median = |log: &super::step_log::RunLog| log.median_step().map_or("-".into(), millis);
    let ratio = step_ratio(outcome).map_or(String::new(), |r| format!(" (x{r:.2})"));
    let loss = |log: &super::step_log::RunLog| match (log.losses.first(), log.losses.last()) {
        (Some(first), Some(last)) => format!("{first:.4} -> {last:.4}"),
        _ => "-".into(),
    };
    let verify = match &outcome.verify {
        None => "not checked (pass --verify)".to_string(),
        Some(v) if v.matched() => format!(
            "identical: {} losses and {} parameter tensors, bit for bit",
            v.steps_compared, v.parameters_compared
        ),
        Some(v) => format!(
            "DIFFERENT: loss {:?}, parameters {:?}",
            v.first_loss_mismatch, v.first_parameter_mismatch
        ),
    };
    let mut rows: Vec<[String; 3]> = vec![
        ["peak device bytes".into(), bytes(plain_peak), saving],
        ["peak host bytes".into(), "-".into(), bytes(stats.peak.host)],
        ["peak disk bytes".into(), "-".into(), bytes(stats.peak.disk)],
        [
            "device -> host".into(),
            "-".into(),
            moves(&stats.device_to_host),
        ],
        [
            "host -> device".into(),
            "-".into(),
            moves(&stats.host_to_device),
        ],
        [
            "host -> disk".into(),
            "-".into(),
            moves(&stats.host_to_disk),
        ],
        [
            "disk -> device".into(),
            "-".into(),
            moves(&stats.disk_to_device),
        ],
        ["stall time".into(), "-".into(), millis(stats.stall_time)],
        [
            "over-budget ops".into(),
            "-".into(),
            stats.over_budget_ops.to_string(),
        ],
        [
            "step time (median)".into(),
            median(&outcome.plain),
            format!("{}{ratio}", median(&outcome.spilled)),
        ],
        [
            "loss (first -> last)".into(),
            loss(&outcome.plain),
            loss(&outcome.spilled),
        ],
        ["verify".into(), String::new(), verify],
    ];
    // What the spilled run dropped and rebuilt instead of moving, and the behaviour its plan
    // chose (`--recompute`).
    if args.recompute.may_drop() {
        let r = &stats.recompute;
        let chose = r
            .behaviour
            .map_or("nothing chosen".to_string(), |b| format!("chose: {b}"));
        // After the over-budget ops, before the step times.
        rows.insert(
            rows.len() - 3,
            [
                format!("recompute ({})", args.recompute),
                "-".into(),
                format!(
                    "dropped {}, rebuilt {} in {}; {chose}",
                    r.dropped,
                    r.rebuilt,
                    millis(r.rebuild_time)
                ),
            ],
        );
    }
    // What the allocator itself holds, where the backend reports it (CubeCL): on a GPU, an
    // out-of-memory is about reserved bytes, not the tensors' own.
    if let Some(pool) = &stats.pool {
        let plain = outcome.plain_peak_reserved_bytes;
        let spilled = match plain {
            Some(p) if p > 0 => format!(
                "{} ({:.0}% of plain)",
                bytes(pool.peak_reserved),
                100.0 * pool.peak_reserved as f64 / p as f64
            ),
            _ => bytes(pool.peak_reserved),
        };
        rows.insert(
            1,
            [
                "peak reserved (allocator)".into(),
                plain.map_or("-".into(), bytes),
                spilled,
            ],
        );
    }
    let header = ["", "plain", "spilled"];
    let widths: Vec<usize> = (0..3)
        .map(|c| {
            rows.iter()
                .map(|r| r[c].chars().count())
                .chain([header[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: [&str; 3]| {
        println!(
            "| {:<w0$} | {:>w1$} | {:>w2$} |",
            cells[0],
            cells[1],
            cells[2],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2]
        )
    };
    line(header);
    println!(
        "|{}|{}:|{}:|",
        "-".repeat(widths[0] + 2),
        "-".repeat(widths[1] + 1),
        "-".repeat(widths[2] + 1)
    );
    for row in &rows {
        line([&row[0], &row[1], &row[2]]);
    }
    if outcome.plain.losses.len() < outcome.spilled.losses.len() {
        println!(
            "\n(plain trained {} of the {} steps, enough to time it; --verify trains all of them)",
            outcome.plain.losses.len(),
            outcome.spilled.losses.len()
        );
    }
}

/// The plot goes next to the report: `out/report.json` -> `out/report.svg`.
fn write_plot<M>(report: &Path, run: &RunDescription<M>, outcome: &Outcome) -> Option<PathBuf> {
    let Some(tape) = &outcome.tape else {
        eprintln!("note: no whole spilled step was recorded (train at least 2 steps); no plot");
        return None;
    };
    let path = report.with_extension("svg");
    let title = format!(
        "{}: resident bytes per tier over one spilled step",
        run.title
    );
    let text = svg::resident_plot(
        tape,
        outcome.budget_bytes,
        outcome.plain_peak_device_bytes,
        &title,
    );
    write_or_exit(&path, &text, "--report");
    Some(path)
}

#[derive(Serialize)]
struct Report<'a, M: Serialize> {
    example: &'static str,
    title: &'a str,
    model: &'a M,
    backend: String,
    batch: usize,
    steps: usize,
    budget_flag: String,
    host_limit_flag: String,
    spill_dir: Option<&'a Path>,
    /// Spilled median step time / plain median step time.
    step_time_ratio: Option<f64>,
    plot: Option<&'a Path>,
    trace: Option<&'a Path>,
    #[serde(flatten)]
    outcome: &'a Outcome,
}

fn write_report<M: Serialize>(
    path: &Path,
    run: &RunDescription<M>,
    args: &SpillArgs,
    outcome: &Outcome,
    plot: Option<&Path>,
) {
    let report = Report {
        example: run.example,
        title: &run.title,
        model: &run.model,
        backend: args.backend.to_string(),
        batch: run.batch,
        steps: run.steps,
        budget_flag: args.budget.to_string(),
        host_limit_flag: args.host_limit.to_string(),
        spill_dir: args.spill_dir.as_deref(),
        step_time_ratio: step_ratio(outcome),
        plot,
        trace: args.trace.as_deref().filter(|p| p.exists()),
        outcome,
    };
    let json = serde_json::to_string_pretty(&report).expect("the report serialises");
    write_or_exit(path, &json, "--report");
}

fn write_or_exit(path: &Path, text: &str, flag: &str) {
    if let Err(e) = std::fs::write(path, text) {
        exit_usage(&format!("{flag}: cannot write {}: {e}", path.display()));
    }
}
