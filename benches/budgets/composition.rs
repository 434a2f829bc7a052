//! The composition table of `benches/budgets.rs`: burn-spill beside Burn's own memory savers,
//! answering a user's question in one run: at the same peak device memory, is Burn's gradient
//! checkpointing (`BalancedCheckpointing`), burn-spill, or both together fastest here? Plus
//! gradient accumulation, half precision and (with the `collective` feature) two peers
//! all-reducing gradients, under burn-spill.
//!
//! Every row is a paired step-time ratio (alternating single steps, median) against its
//! reference, and the peak device bytes of the measured side as burn-spill counts them (a
//! plain run's are counted through an unlimited `SpillBackend`). bf16 and f16 run in a child
//! process each, because a device's default float dtype is set once per process.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::tensor::FloatDType;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn_spill::{SpillBackend, SpillConfig};
use serde::{Deserialize, Serialize};

use super::{Model, Stepper, paired_ratio};
use crate::common::report::bytes;

/// The environment variable that makes the bench a child measuring one dtype.
pub const DTYPE_VAR: &str = "BURN_SPILL_BENCH_DTYPE";

/// The prefix of a row a child prints for its parent.
const ROW_PREFIX: &str = "composition-row\t";

/// Steps that teach the engine the program (and fill Adam's state) before a measurement.
const WARMUP_STEPS: usize = 2;

/// One row of the composition table.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CompositionRow {
    pub model: String,
    /// What saves memory: `checkpointing`, `burn-spill`, `both`, ...
    pub setup: String,
    /// The device budget, when burn-spill has one.
    pub budget: Option<u64>,
    /// Peak device bytes of the measured side.
    pub peak: u64,
    /// Peak device bytes of the reference (plain, no memory saver).
    pub reference_peak: u64,
    /// Median step time of the measured side over the reference's.
    pub ratio: f64,
    /// What the ratio is against.
    pub reference: String,
}

/// How long a measurement runs.
#[derive(Clone, Copy)]
pub struct Rounds {
    pub paired: usize,
    pub warmup: usize,
}

type Checkpointed<B> = Autodiff<B, BalancedCheckpointing>;

/// Peak device bytes of `stepper` over the warm-up steps, as `device`'s engine counts them.
fn counted_peak<B: Backend>(device: &B::Device, stepper: &mut dyn Stepper) -> u64 {
    SpillBackend::<B>::reset_peaks(device);
    for _ in 0..WARMUP_STEPS {
        stepper.step();
    }
    SpillBackend::<B>::stats(device).peak.device
}

/// The paired ratio of `measured` against `reference` after warm-up, and `measured`'s peak
/// during the pairs.
fn measure<B: Backend>(
    device: &B::Device,
    reference: &mut dyn Stepper,
    measured: &mut dyn Stepper,
    rounds: Rounds,
) -> (f64, u64) {
    for _ in 0..rounds.warmup.max(WARMUP_STEPS) {
        measured.step();
    }
    SpillBackend::<B>::reset_peaks(device);
    let ratio = paired_ratio(reference, measured, rounds.paired);
    (ratio, SpillBackend::<B>::stats(device).peak.device)
}

fn configure<B: Backend>(device: &B::Device, model: &Model, budget: Option<u64>) {
    let config = match budget {
        Some(bytes) => SpillConfig::preset(model.preset()).device_budget_bytes(bytes),
        None => SpillConfig::default(),
    };
    SpillBackend::<B>::configure(device, config).expect("a valid bench config");
}

/// What a spilled row runs: described as `what`, under `budget`, with `micro_batches`
/// accumulated a step.
struct Setup {
    what: String,
    budget: u64,
    micro_batches: usize,
}

/// A spilled stepper set up as `setup` says, measured against `reference`.
fn spilled_row<B: Backend, A: AutodiffBackend<Device = B::Device>>(
    device: &B::Device,
    model: &Model,
    name: &str,
    setup: Setup,
    reference: (&mut dyn Stepper, u64, &str),
    rounds: Rounds,
) -> CompositionRow {
    let (reference, reference_peak, reference_name) = reference;
    let Setup {
        what: setup,
        budget,
        micro_batches,
    } = setup;
    configure::<B>(device, model, Some(budget));
    let mut measured = model.accumulating_trainer::<A>(device, micro_batches);
    let (ratio, peak) = measure::<B>(device, reference, &mut *measured, rounds);
    drop(measured);
    configure::<B>(device, model, None);
    CompositionRow {
        model: name.into(),
        setup,
        budget: Some(budget),
        peak,
        reference_peak,
        ratio,
        reference: reference_name.into(),
    }
}

/// The f32 rows of one model: checkpointing, burn-spill and both at checkpointing's peak and
/// at 30% of plain's, and 4 accumulated micro-batches at 30%.
pub fn rows<B: Backend>(
    device: &B::Device,
    name: &str,
    model: &Model,
    rounds: Rounds,
) -> Vec<CompositionRow> {
    type Spilled<B> = Autodiff<SpillBackend<B>>;
    configure::<B>(device, model, None);
    let plain_peak = counted_peak::<B>(device, &mut *model.trainer::<Spilled<B>>(device));
    let checkpointed_peak = counted_peak::<B>(
        device,
        &mut *model.trainer::<Checkpointed<SpillBackend<B>>>(device),
    );
    let mut plain = model.trainer::<Autodiff<B>>(device);
    for _ in 0..WARMUP_STEPS {
        plain.step();
    }
    let reference = "plain";
    let mut rows = Vec::new();

    let mut checkpointed = model.trainer::<Checkpointed<B>>(device);
    for _ in 0..WARMUP_STEPS {
        checkpointed.step();
    }
    rows.push(CompositionRow {
        model: name.into(),
        setup: "checkpointing".into(),
        budget: None,
        peak: checkpointed_peak,
        reference_peak: plain_peak,
        ratio: paired_ratio(&mut *plain, &mut *checkpointed, rounds.paired),
        reference: reference.into(),
    });
    drop(checkpointed);

    let thirty = plain_peak * 3 / 10;
    for (target, budget) in [("checkpointing's peak", checkpointed_peak), ("30%", thirty)] {
        rows.push(spilled_row::<B, Spilled<B>>(
            device,
            model,
            name,
            Setup {
                what: format!("burn-spill at {target}"),
                budget,
                micro_batches: 1,
            },
            (&mut *plain, plain_peak, reference),
            rounds,
        ));
        rows.push(spilled_row::<B, Checkpointed<SpillBackend<B>>>(
            device,
            model,
            name,
            Setup {
                what: format!("both at {target}"),
                budget,
                micro_batches: 1,
            },
            (&mut *plain, plain_peak, reference),
            rounds,
        ));
    }
    drop(plain);

    let micro_batches = 4;
    let accumulating_peak = counted_peak::<B>(
        device,
        &mut *model.accumulating_trainer::<Spilled<B>>(device, micro_batches),
    );
    let mut plain_accumulating = model.accumulating_trainer::<Autodiff<B>>(device, micro_batches);
    for _ in 0..WARMUP_STEPS {
        plain_accumulating.step();
    }
    rows.push(spilled_row::<B, Spilled<B>>(
        device,
        model,
        name,
        Setup {
            what: format!("burn-spill at 30%, {micro_batches} micro-batches a step"),
            budget: accumulating_peak * 3 / 10,
            micro_batches,
        },
        (
            &mut *plain_accumulating,
            accumulating_peak,
            "plain, same accumulation",
        ),
        rounds,
    ));
    drop(plain_accumulating);
    rows.extend(data_parallel_row::<B>(device, name, model, rounds));
    rows
}

/// Two peers all-reducing their gradients through burn-collective on one device, spilled at
/// 30% of their joint peak against the same on plain `B`.
#[cfg(feature = "collective")]
fn data_parallel_row<B: Backend>(
    device: &B::Device,
    name: &str,
    model: &Model,
    rounds: Rounds,
) -> Option<CompositionRow> {
    type Spilled<B> = Autodiff<SpillBackend<B>>;
    configure::<B>(device, model, None);
    let peak = counted_peak::<B>(device, &mut *model.data_parallel::<Spilled<B>>(device));
    let budget = peak * 3 / 10;
    let mut plain = model.data_parallel::<Autodiff<B>>(device);
    for _ in 0..WARMUP_STEPS {
        plain.step();
    }
    configure::<B>(device, model, Some(budget));
    let mut spilled = model.data_parallel::<Spilled<B>>(device);
    let (ratio, spilled_peak) = measure::<B>(device, &mut *plain, &mut *spilled, rounds);
    drop((plain, spilled));
    configure::<B>(device, model, None);
    Some(CompositionRow {
        model: name.into(),
        setup: format!(
            "burn-spill at 30%, {} peers all-reducing",
            super::data_parallel::PEERS
        ),
        budget: Some(budget),
        peak: spilled_peak,
        reference_peak: peak,
        ratio,
        reference: "plain, same peers".into(),
    })
}

#[cfg(not(feature = "collective"))]
fn data_parallel_row<B: Backend>(
    _device: &B::Device,
    name: &str,
    _model: &Model,
    _rounds: Rounds,
) -> Option<CompositionRow> {
    eprintln!("note: {name}: no data-parallel row (build with `--features collective`)");
    None
}

/// The rows of one model in `dtype` (run in a child process whose device defaults to it).
pub fn dtype_rows<B: Backend>(
    device: &B::Device,
    name: &str,
    model: &Model,
    dtype: FloatDType,
    rounds: Rounds,
) -> Vec<CompositionRow> {
    type Spilled<B> = Autodiff<SpillBackend<B>>;
    configure::<B>(device, model, None);
    let plain_peak = counted_peak::<B>(device, &mut *model.trainer::<Spilled<B>>(device));
    let mut plain = model.trainer::<Autodiff<B>>(device);
    for _ in 0..WARMUP_STEPS {
        plain.step();
    }
    vec![spilled_row::<B, Spilled<B>>(
        device,
        model,
        name,
        Setup {
            what: format!("burn-spill at 30%, {dtype:?}"),
            budget: plain_peak * 3 / 10,
            micro_batches: 1,
        },
        (&mut *plain, plain_peak, &format!("plain, {dtype:?}")),
        rounds,
    )]
}

/// Parses `BURN_SPILL_BENCH_DTYPE`.
pub fn parse_dtype(value: &str) -> Result<FloatDType, String> {
    match value {
        "bf16" => Ok(FloatDType::BF16),
        "f16" => Ok(FloatDType::F16),
        other => Err(format!("`{other}` is not a dtype; accepted: bf16, f16")),
    }
}

/// Prints rows for the parent process.
pub fn print_for_parent(rows: &[CompositionRow]) {
    for row in rows {
        println!(
            "{ROW_PREFIX}{}",
            serde_json::to_string(row).expect("a row serialises")
        );
    }
}

/// Runs this bench again in a child process for `dtype` and collects its rows; a child that
/// fails (an inner backend without the dtype) is reported and yields no rows.
pub fn rows_of_child(dtype: &str) -> Vec<CompositionRow> {
    let exe = std::env::current_exe().expect("the bench's own path");
    let output = std::process::Command::new(exe)
        .args(std::env::args().skip(1))
        .env(DTYPE_VAR, dtype)
        .output()
        .expect("the bench runs itself for a dtype");
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        eprintln!(
            "note: the {dtype} rows were not measured ({}): {}",
            output.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
        );
        return Vec::new();
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.strip_prefix(ROW_PREFIX))
        .map(|json| serde_json::from_str(json).expect("the child's row parses"))
        .collect()
}

/// The table, and the answer to the question at checkpointing's peak.
pub fn print_table(rows: &[CompositionRow]) {
    println!("\nComposition: memory savers side by side (paired step-time ratios)\n");
    println!("| model | setup | budget | peak device | reference peak | ratio | against |");
    println!("|---|---|---:|---:|---:|---:|---|");
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {} | {:.3} | {} |",
            r.model,
            r.setup,
            r.budget.map_or("-".into(), bytes),
            bytes(r.peak),
            bytes(r.reference_peak),
            r.ratio,
            r.reference
        );
    }
    let mut models: Vec<&str> = Vec::new();
    for row in rows {
        if !models.contains(&row.model.as_str()) {
            models.push(&row.model);
        }
    }
    for model in models {
        let at_same_peak: Vec<&CompositionRow> = rows
            .iter()
            .filter(|r| {
                r.model == model
                    && (r.setup == "checkpointing" || r.setup.ends_with("at checkpointing's peak"))
            })
            .collect();
        if let Some(fastest) = at_same_peak
            .iter()
            .min_by(|a, b| a.ratio.total_cmp(&b.ratio))
        {
            let each: Vec<String> = at_same_peak
                .iter()
                .map(|r| format!("{} {:.3}", r.setup, r.ratio))
                .collect();
            println!(
                "\n{model}: at checkpointing's peak ({}), fastest is {} ({})",
                bytes(at_same_peak[0].peak),
                fastest.setup,
                each.join(", ")
            );
        }
    }
}
