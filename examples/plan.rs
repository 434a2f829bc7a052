//! The dry-run planner on the command line: a recorded step (`--save-tape` of the resnet or
//! transformer example) predicted on a device before any GPU time is spent.
//!
//! ```text
//! cargo run --release --example resnet -- --save-tape out/step.json
//! cargo run --release --example plan -- out/step.json --device h200-pcie5 --budget 40GiB
//! cargo run --release --example plan -- out/step.json --device h200-pcie5 --sweep
//! cargo run --release --example plan -- out/b8.json out/b16.json --batches 8,16 \
//!     --device h200-pcie5 --budget 40GiB --max-batch --overhead 10%
//! ```
//!
//! Prints a table; for one budget, also the step's time and moves by phase (forward, backward,
//! optimizer) with each phase's floor, where the step has a backward. `--sweep` also writes an SVG of predicted overhead against budget (next to
//! the tape, or at `--svg`). A bad tape, profile, budget or pair of tapes is one line on stderr
//! and exit code 2.

#[path = "common/logging.rs"]
mod logging;
// `predict_own_step` is for the training examples.
#[allow(dead_code)]
#[path = "common/plan_report.rs"]
mod plan_report;
#[allow(dead_code)] // `resident_plot` is for the training examples.
#[path = "common/svg.rs"]
mod svg;
#[path = "common/units.rs"]
mod units;
#[path = "common/usage.rs"]
mod usage;

use std::path::{Path, PathBuf};
use std::str::FromStr;

use burn_spill::plan::{
    self, Assumptions, DryRun, ExtraRecipes, RecipeClass, SWEEP_FRACTIONS, StateResidency,
};
use burn_spill::policy::recompute::{EarlyRoom, RebuildRoom};
use burn_spill::tape::StepTape;
use burn_spill::{DeviceBudget, PolicyKind, Preset, RecomputeMode, SpillConfig, parse_bytes};
use usage::exit_usage;

/// Predict peak memory, bytes moved and step time of a recorded step under a budget on a
/// device.
#[derive(clap::Parser, Debug)]
#[command(version)]
struct Cli {
    /// The recorded step, as JSON (`--save-tape` of the resnet and transformer examples). With
    /// `--max-batch`: the step at the smaller batch.
    tape: PathBuf,

    /// With `--max-batch`: the same step recorded at the larger batch.
    larger: Option<PathBuf>,

    /// The device: h200-pcie5, h100-pcie5, a100-pcie4, rtx4090-pcie4, gh200-c2c, or a
    /// profile JSON file (docs/device-profiles.md).
    #[arg(long, default_value = "h200-pcie5")]
    device: String,

    /// The device budget: bytes (`40GiB`), a percentage of the step's unlimited peak (`30%`;
    /// with `--max-batch`, of the device's memory), or `unlimited`.
    #[arg(long, default_value = "unlimited")]
    budget: String,

    /// Predict at 100% of the step's peak down to 10% (or at `--fractions`), and write the SVG.
    #[arg(long)]
    sweep: bool,

    /// The budgets of `--sweep`, in percent of the step's peak (`50,33,25`).
    #[arg(long, value_parser = parse_fractions)]
    fractions: Option<Fractions>,

    /// Find the largest batch whose predicted overhead stays under `--overhead` at `--budget`,
    /// from two tapes and `--batches`.
    #[arg(long)]
    max_batch: bool,

    /// The batch sizes of the two tapes, as `SMALL,LARGE`.
    #[arg(long, value_parser = parse_batches)]
    batches: Option<(u64, u64)>,

    /// The overhead limit of `--max-batch` (`10%`).
    #[arg(long, default_value = "10%", value_parser = parse_percent)]
    overhead: f64,

    /// Watermarks and prefetch window: cnn, rnn, transformer or gan.
    #[arg(long, default_value = "transformer", value_parser = parse_preset)]
    preset: Preset,

    /// The victim policy (default: the preset's): lru, next_use or cost_aware.
    #[arg(long, value_parser = parse_policy)]
    policy: Option<PolicyKind>,

    /// Whether victims are moved or dropped and rebuilt: swap, recompute or both (default:
    /// swap).
    #[arg(long, value_parser = parse_recompute, default_value = "swap")]
    recompute: RecomputeMode,

    /// Where room for rebuilds is made ahead: at_settle, beside_prefetches or
    /// in_prefetch_walk (default: chosen per budget under recompute and both).
    #[arg(long, value_parser = parse_rebuild_room)]
    rebuild_room: Option<RebuildRoom>,

    /// How many ops ahead spilled tensors are brought back (default: the preset's).
    #[arg(long)]
    prefetch_window: Option<usize>,

    /// The host tier's limit in bytes (default: unlimited).
    #[arg(long, value_parser = parse_size)]
    host_limit: Option<u64>,

    /// Predict the synchronous engine (moves between ops, on the op's thread).
    #[arg(long)]
    sync: bool,

    /// Whether the step's state leaves the device last and only to admit an op (`on`), or
    /// moves like any tensor (`off`); default: chosen under `--recompute both`, moved
    /// otherwise (`SpillConfig::keep_state`).
    #[arg(long, value_parser = parse_switch)]
    keep_state: Option<bool>,

    /// How room is made early for the step's peak: off, at_once or paced; default: chosen per
    /// budget under `--recompute both` and `recompute`, paced under swap
    /// (`SpillConfig::early_room`).
    #[arg(long, value_parser = parse_early_room)]
    early_room: Option<EarlyRoom>,

    /// Keep the step's state on the device, inside the budget: the tensors from before it
    /// (parameters, optimizer state, the batch) and those it leaves alive. DTR's simulator
    /// accounts this way; the engine itself moves state like any tensor. Not with
    /// `--max-batch`.
    #[arg(long)]
    pin_state: bool,

    /// Predict as if the engine kept recipes for these classes of ops too, comma-separated:
    /// matmul, reductions, views, convolutions. A what-if: the engine rebuilds elementwise
    /// ops only. Not with `--max-batch`.
    #[arg(long, value_delimiter = ',', value_parser = parse_recipe_class)]
    what_if_recipes: Vec<RecipeClass>,

    /// Where `--sweep` writes its SVG (default: next to the tape, `.plan.svg`).
    #[arg(long)]
    svg: Option<PathBuf>,
}

fn parse_recipe_class(value: &str) -> Result<RecipeClass, String> {
    value
        .parse()
        .map_err(|e: burn_spill::SpillError| e.to_string())
}

fn parse_switch(value: &str) -> Result<bool, String> {
    match value {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("`{value}` is neither `on` nor `off`")),
    }
}

fn parse_batches(value: &str) -> Result<(u64, u64), String> {
    let bad = || format!("`{value}` is not two batch sizes; accepted: SMALL,LARGE such as 8,16");
    let (a, b) = value.split_once(',').ok_or_else(bad)?;
    let (a, b): (u64, u64) = (
        a.trim().parse().map_err(|_| bad())?,
        b.trim().parse().map_err(|_| bad())?,
    );
    (a > 0 && b > a).then_some((a, b)).ok_or_else(bad)
}

/// Budgets as fractions of the step's peak (a type of its own: clap reads a `Vec` as repeated
/// flags).
#[derive(Clone, Debug)]
struct Fractions(Vec<f64>);

fn parse_fractions(value: &str) -> Result<Fractions, String> {
    value
        .split(',')
        .map(|p| {
            p.trim()
                .parse::<f64>()
                .ok()
                .filter(|p| p.is_finite() && *p > 0.0)
                .map(|p| p / 100.0)
        })
        .collect::<Option<Vec<f64>>>()
        .filter(|v| !v.is_empty())
        .map(Fractions)
        .ok_or_else(|| {
            format!(
                "`{value}` is not a list of percentages; accepted: numbers above 0 such as 50,33,25"
            )
        })
}

fn parse_percent(value: &str) -> Result<f64, String> {
    value
        .trim()
        .strip_suffix('%')
        .and_then(|p| p.trim().parse::<f64>().ok())
        .filter(|p| p.is_finite() && *p >= 0.0)
        .map(|p| p / 100.0)
        .ok_or_else(|| format!("`{value}` is not a percentage; accepted: 0% or more, such as 10%"))
}

fn parse_size(value: &str) -> Result<u64, String> {
    parse_bytes(value)
        .ok_or_else(|| format!("`{value}` is not a size; accepted: bytes such as 512MiB or 1.5GB"))
}

fn parse_preset(value: &str) -> Result<Preset, String> {
    Preset::from_str(value)
        .map_err(|_| format!("`{value}` is not a preset; accepted: {}", Preset::ACCEPTED))
}

fn parse_recompute(value: &str) -> Result<RecomputeMode, String> {
    RecomputeMode::from_str(value).map_err(|_| {
        format!(
            "`{value}` is not a recompute mode; accepted: {}",
            RecomputeMode::ACCEPTED
        )
    })
}

fn parse_rebuild_room(value: &str) -> Result<RebuildRoom, String> {
    RebuildRoom::from_str(value).map_err(|_| {
        format!(
            "`{value}` is not a place for rebuild room; accepted: {}",
            RebuildRoom::ACCEPTED
        )
    })
}

fn parse_early_room(value: &str) -> Result<EarlyRoom, String> {
    EarlyRoom::from_str(value).map_err(|_| {
        format!(
            "`{value}` is not a way to make room early; accepted: {}",
            EarlyRoom::ACCEPTED
        )
    })
}

fn parse_policy(value: &str) -> Result<PolicyKind, String> {
    PolicyKind::from_str(value).map_err(|_| {
        format!(
            "`{value}` is not a policy; accepted: {}",
            PolicyKind::ACCEPTED
        )
    })
}

/// A budget as given: bytes, a fraction (of the step's peak, or of the device), or none.
enum Budget {
    Unlimited,
    Bytes(u64),
    Fraction(f64),
}

fn budget(value: &str) -> Budget {
    let v = value.trim();
    if v.eq_ignore_ascii_case("unlimited") {
        return Budget::Unlimited;
    }
    if v.ends_with('%') {
        return match parse_percent(v) {
            Ok(f) if f > 0.0 => Budget::Fraction(f),
            _ => exit_usage(&format!(
                "--budget: `{value}` is not a budget; accepted: bytes such as 40GiB, a percentage above 0 such as 30%, or `unlimited`"
            )),
        };
    }
    match parse_bytes(v) {
        Some(b) => Budget::Bytes(b),
        None => exit_usage(&format!(
            "--budget: `{value}` is not a budget; accepted: bytes such as 40GiB, a percentage such as 30%, or `unlimited`"
        )),
    }
}

fn read_tape(path: &Path) -> StepTape {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| exit_usage(&format!("cannot read the tape {}: {e}", path.display())));
    burn_spill::tape::from_json(&text)
        .unwrap_or_else(|e| exit_usage(&format!("{}: {e}", path.display())))
}

fn config(cli: &Cli) -> SpillConfig {
    let mut config = SpillConfig::preset(cli.preset)
        .asynchronous(!cli.sync)
        .recompute(cli.recompute);
    if let Some(policy) = cli.policy {
        config = config.policy(policy);
    }
    if let Some(window) = cli.prefetch_window {
        config = config.prefetch_window(window);
    }
    if let Some(room) = cli.rebuild_room {
        config = config.rebuild_room(room);
    }
    if let Some(keep) = cli.keep_state {
        config = config.keep_state(keep);
    }
    if let Some(early) = cli.early_room {
        config = config.early_room(early);
    }
    match cli.host_limit {
        Some(limit) => config.host_limit_bytes(limit),
        None => config.unlimited_host(),
    }
}

fn or_exit<T>(result: Result<T, burn_spill::SpillError>) -> T {
    result.unwrap_or_else(|e| exit_usage(&e.to_string()))
}

fn main() {
    let cli: Cli = usage::parse_flags();
    let profile = plan_report::profile(&cli.device, None)
        .unwrap_or_else(|e| exit_usage(&format!("--device: {e}")));
    let config = config(&cli);
    let tape = read_tape(&cli.tape);

    let assumptions = Assumptions {
        state: if cli.pin_state {
            StateResidency::Pinned
        } else {
            StateResidency::Movable
        },
        extra_recipes: cli.what_if_recipes.iter().copied().collect(),
    };
    if cli.max_batch {
        if cli.pin_state {
            exit_usage(
                "--pin-state predicts one tape; --max-batch moves the state as the engine does",
            );
        }
        if !assumptions.extra_recipes.is_empty() {
            exit_usage("--what-if-recipes predicts one tape; --max-batch predicts the engine");
        }
        let (Some(larger), Some((small, large))) = (&cli.larger, cli.batches) else {
            exit_usage(
                "--max-batch needs two tapes (the step at two batch sizes) and --batches SMALL,LARGE",
            )
        };
        let larger = read_tape(larger);
        let config = match budget(&cli.budget) {
            Budget::Unlimited => config.device_budget(DeviceBudget::Unlimited),
            Budget::Bytes(b) => config.device_budget_bytes(b),
            Budget::Fraction(f) if f <= 1.0 => config.device_budget_fraction(f),
            Budget::Fraction(_) => exit_usage(
                "--budget: with --max-batch a percentage is of the device's memory: at most 100%",
            ),
        };
        let found = or_exit(plan::max_batch(
            &tape,
            small,
            &larger,
            large,
            &profile,
            &config,
            cli.overhead,
        ));
        println!("batch  predicted overhead on {}", profile.name);
        for (batch, overhead) in &found.tried {
            match overhead {
                Some(o) => println!("{batch:>5}  {:.1}%", o * 100.0),
                None => {
                    println!("{batch:>5}  does not fit (an op alone needs more than the budget)")
                }
            }
        }
        match (&found.batch, &found.run) {
            (Some(batch), Some(run)) => {
                println!(
                    "largest batch within {:.1}% overhead: {batch}",
                    cli.overhead * 100.0
                );
                print!("{}", plan_report::table(std::slice::from_ref(run)));
            }
            _ => println!(
                "no batch stays within {:.1}% overhead at this budget",
                cli.overhead * 100.0
            ),
        }
        return;
    }

    let runs: Vec<DryRun> = if cli.sweep {
        let fractions = cli
            .fractions
            .as_ref()
            .map_or(SWEEP_FRACTIONS.to_vec(), |f| f.0.clone());
        or_exit(plan::sweep_assuming(
            &tape,
            &profile,
            &config,
            &fractions,
            assumptions,
        ))
    } else {
        let config = match budget(&cli.budget) {
            Budget::Unlimited => config.device_budget(DeviceBudget::Unlimited),
            Budget::Bytes(b) => config.device_budget_bytes(b),
            Budget::Fraction(f) => {
                let peak = or_exit(plan::dry_run(&tape, &profile, &config)).unlimited_peak;
                config.device_budget_bytes((peak as f64 * f) as u64)
            }
        };
        vec![or_exit(plan::dry_run_assuming(
            &tape,
            &profile,
            &config,
            assumptions,
        ))]
    };
    if assumptions.extra_recipes != ExtraRecipes::NONE {
        println!(
            "assuming recipes the engine does not keep, for: {}",
            assumptions.extra_recipes
        );
    }
    print!("{}", plan_report::table(&runs));
    if let [run] = runs.as_slice()
        && run.budget != u64::MAX
        && let Some(phases) = plan::phases(&tape, run, &profile)
    {
        print!("{}", plan_report::phases_table(&phases));
    }
    if cli.sweep {
        let path = cli
            .svg
            .clone()
            .unwrap_or_else(|| cli.tape.with_extension("plan.svg"));
        let title = format!(
            "{}: predicted overhead on {} ({} ops)",
            cli.tape.display(),
            profile.name,
            tape.ops.len()
        );
        match std::fs::write(&path, plan_report::overhead_svg(&runs, &title)) {
            Ok(()) => println!("wrote {}", path.display()),
            Err(e) => exit_usage(&format!("cannot write {}: {e}", path.display())),
        }
    }
}
