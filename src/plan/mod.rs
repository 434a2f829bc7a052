//! The dry-run planner: from one recorded step, what a budget costs on a named device (peak
//! memory, bytes moved, step time and stall) before a GPU hour is spent.
//!
//! - [`DeviceProfile`]: a target device as data (built-ins `h200-pcie5`, `h100-pcie5`,
//!   `a100-pcie4`, `rtx4090-pcie4`, `gh200-c2c`, a JSON file, or `measured` for this machine).
//! - [`cost`]: each op's FLOPs and bytes from its shapes, and its device time on a profile.
//! - [`dry_run`]: a discrete-event simulation of the step on the profile, in which the engine's
//!   own decisions (victims, prefetches, headroom) choose what moves.
//! - [`sweep`] over budgets, and [`max_batch`]: the largest batch whose predicted overhead stays
//!   under a limit, from steps recorded at two batch sizes.
//! - [`dry_run_assuming`] and [`sweep_assuming`]: the same under [`Assumptions`] beyond the
//!   engine as it runs: the step's state kept on the device inside the budget
//!   ([`StateResidency::Pinned`]), as DTR's simulator counts it, and recipes for ops the engine
//!   keeps none for ([`RecipeClass`]), to ask what they would buy.
//!
//! ```no_run
//! use burn_spill::plan::{DeviceProfile, dry_run};
//! use burn_spill::SpillConfig;
//! let json = std::fs::read_to_string("step.json")?;
//! let tape = burn_spill::tape::from_json(&json)?;
//! let h200 = DeviceProfile::builtin("h200-pcie5")?;
//! let run = dry_run(&tape, &h200, &SpillConfig::transformer().device_budget_bytes(40 << 30))?;
//! println!("{:+.1}% step time, {} bytes moved", run.overhead * 100.0, run.simulated.traffic.total());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub(crate) mod behaviour;
mod by_position;
mod carry;
pub mod cost;
mod phases;
mod profile;
mod search;
mod simulate;
mod state;
mod what_if;

pub use phases::{Phase, PhaseFigures, phase_ops, phases};
pub use profile::{BUILTIN_PROFILES, DeviceProfile, MatrixTflops, OpTimes};
pub use search::{BatchSearch, max_batch, median_tape, scale_tape};
pub use simulate::{Simulated, Traffic};
pub use state::StateResidency;
pub use what_if::{Assumptions, ExtraRecipes, RecipeClass};

use serde::Serialize;

use crate::config::DeviceBudget;
use crate::policy::recompute::EarlyRoom;
use crate::tape::StepTape;
use crate::{SpillConfig, SpillError};

pub(crate) use simulate::Settings;
use simulate::simulate;

/// The prediction for one budget.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DryRun {
    /// The profile's name.
    pub profile: String,
    /// The device budget simulated, in bytes (`u64::MAX` for unlimited).
    pub budget: u64,
    /// The simulated step under the budget.
    pub simulated: Simulated,
    /// Under `recompute = both` or `recompute` with a budget, where the config leaves a
    /// choice: the behaviour the step runs with, the fastest of those the mode may choose
    /// ([`crate::policy::recompute::candidates`]: under `both` weighing each victim, moving
    /// every victim or dropping every victim it may, each with its ways of making room; under
    /// `recompute` where room for rebuilds is made and how room is made early), as the engine chooses it from the same dry run
    /// ([`crate::policy::recompute::chosen_from`]). `None` otherwise.
    pub chose: Option<crate::policy::recompute::Behaviour>,
    /// Where [`chose`](Self::chose) is set: each behaviour's predicted overhead (as
    /// [`overhead`](Self::overhead)), in the order of the mode's candidates. Empty otherwise.
    pub predicted_behaviours: Vec<(crate::policy::recompute::Behaviour, f64)>,
    /// The same step with unlimited device memory: nothing moves.
    pub unlimited_step_seconds: f64,
    /// Its device peak: the budget above which nothing moves.
    pub unlimited_peak: u64,
    /// Step time under the budget over the unlimited one, less 1 (0.08 = 8% slower).
    pub overhead: f64,
    /// The fewest bytes any policy could move at this budget (Belady's MIN replayed on the
    /// tape, both directions): what the simulated traffic compares to.
    pub belady_min_bytes: u64,
}

/// What each op needs on the device by itself: its distinct inputs and new outputs.
fn own_bytes(tape: &StepTape) -> impl Iterator<Item = (usize, u64)> + '_ {
    let sizes: std::collections::HashMap<_, _> =
        tape.tensors.iter().map(|t| (t.id, t.bytes)).collect();
    tape.ops.iter().enumerate().map(move |(i, op)| {
        let mut seen = Vec::with_capacity(op.inputs.len() + op.outputs.len());
        let mut bytes = 0u64;
        for id in op.inputs.iter().chain(&op.outputs) {
            if !seen.contains(id) {
                seen.push(*id);
                bytes += sizes.get(id).copied().unwrap_or(0);
            }
        }
        (i, bytes)
    })
}

/// The smallest budget every op of `tape` can run under: its largest op's own inputs and
/// outputs.
pub fn min_budget(tape: &StepTape) -> u64 {
    own_bytes(tape).map(|(_, b)| b).max().unwrap_or(0)
}

/// The budget `config` sets on `profile`'s device (`u64::MAX` for unlimited).
fn budget_of(config: &SpillConfig, profile: &DeviceProfile) -> u64 {
    match config.get_device_budget() {
        DeviceBudget::Unlimited => u64::MAX,
        DeviceBudget::Bytes(b) => b,
        DeviceBudget::Fraction(f) => (profile.memory_bytes as f64 * f) as u64,
    }
}

/// Predicts `tape` on `profile` under `config`'s budget, host limit, policy, prefetch window
/// and asynchrony. With recompute, the engine is predicted as it runs on a backend that runs
/// each op alone (Flex, or CubeCL without burn-fusion), where rebuilds may recompute ghosts.
///
/// # Errors
/// [`SpillError::PlanBudget`] when the budget is below what the largest op needs by itself
/// (its inputs and outputs), and the config's own validation errors.
pub fn dry_run(
    tape: &StepTape,
    profile: &DeviceProfile,
    config: &SpillConfig,
) -> Result<DryRun, SpillError> {
    dry_run_assuming(tape, profile, config, Assumptions::default())
}

/// [`dry_run`] under `assumptions` (a [`StateResidency`] converts into them): with the step's
/// state moving as the engine moves it ([`StateResidency::Movable`]) or kept on the device
/// inside the budget, as DTR's simulator keeps its constants ([`StateResidency::Pinned`]), and
/// with recipes assumed for the ops of [`Assumptions::extra_recipes`]' classes, which the
/// engine does not keep.
///
/// # Errors
/// As [`dry_run`]; with the state pinned, [`SpillError::PlanStateBudget`] when the budget is
/// below what some op needs beside the state alive as it runs.
pub fn dry_run_assuming(
    tape: &StepTape,
    profile: &DeviceProfile,
    config: &SpillConfig,
    assumptions: impl Into<Assumptions>,
) -> Result<DryRun, SpillError> {
    let assumptions = assumptions.into();
    let state = assumptions.state;
    let budget = budget_of(config, profile);
    // The largest op names the least budget that fits every op.
    if let Some((op, needed)) = own_bytes(tape).max_by_key(|&(i, b)| (b, std::cmp::Reverse(i)))
        && needed > budget
    {
        return Err(SpillError::PlanBudget {
            budget,
            op,
            name: tape.ops[op].name.clone(),
            needed,
        });
    }
    if state == StateResidency::Pinned
        && let Some((op, state_bytes, needed)) = state::pinned_floor(tape)
        && needed > budget
    {
        return Err(SpillError::PlanStateBudget {
            budget,
            op,
            name: tape.ops[op].name.clone(),
            state: state_bytes,
            needed,
        });
    }
    run(tape, profile, config, assumptions)
}

/// [`dry_run`], also under a budget below what the largest op needs: such ops run over it, as
/// they do in the engine unless it is strict, and are counted in
/// [`Simulated::over_budget_ops`].
///
/// # Errors
/// The config's own validation errors.
pub fn dry_run_over_budget(
    tape: &StepTape,
    profile: &DeviceProfile,
    config: &SpillConfig,
) -> Result<DryRun, SpillError> {
    run(tape, profile, config, Assumptions::default())
}

/// The dry run itself, whatever the budget.
fn run(
    tape: &StepTape,
    profile: &DeviceProfile,
    config: &SpillConfig,
    assumptions: Assumptions,
) -> Result<DryRun, SpillError> {
    config.validate()?;
    let budget = budget_of(config, profile);
    let op_seconds = cost::op_seconds(tape, profile);
    let gaps = cost::host_gaps(tape, profile);
    // How room is made early where the mode does not choose it, as the engine makes it.
    let early = config
        .get_early_room()
        .unwrap_or(match config.get_recompute() {
            crate::RecomputeMode::Both => EarlyRoom::Off,
            _ => EarlyRoom::Paced,
        });
    let settings = Settings {
        budget,
        host_limit: config.get_host_limit_bytes(),
        policy: config.get_policy(),
        prefetch_window: u32::try_from(config.get_prefetch_window()).unwrap_or(u32::MAX),
        asynchronous: config.is_asynchronous(),
        recompute: config.get_recompute(),
        rebuild_room: config
            .get_rebuild_room()
            .unwrap_or(crate::policy::recompute::RebuildRoom::AtSettle),
        // As the engine on a backend that runs each op alone (Flex, or CubeCL without fusion).
        keeps_lineage: true,
        state: assumptions.state,
        // Where `both` and `recompute` choose, each behaviour says (see `behaviour::choose`).
        keeps_state: config.get_keep_state().unwrap_or(false),
        evicts_early: early.pacing().is_some(),
        paces_early: early.pacing() == Some(true),
        extra_recipes: assumptions.extra_recipes,
    };
    let unlimited = simulate(
        tape,
        profile,
        &op_seconds,
        &gaps,
        Settings {
            budget: u64::MAX,
            ..settings
        },
    );
    let candidates = crate::policy::recompute::candidates(
        settings.recompute,
        config.get_rebuild_room(),
        config.get_keep_state(),
        config.get_early_room(),
    );
    let (simulated, chose, predicted_behaviours) = if budget == u64::MAX {
        (unlimited.clone(), None, Vec::new())
    } else if candidates.len() >= 2 {
        let chosen = behaviour::choose(tape, profile, &op_seconds, &gaps, settings, &candidates);
        (chosen.simulated, Some(chosen.behaviour), chosen.predicted)
    } else {
        let simulated = simulate(tape, profile, &op_seconds, &gaps, settings);
        (simulated, None, Vec::new())
    };
    let overhead_of = |seconds: f64| {
        if unlimited.step_seconds > 0.0 {
            seconds / unlimited.step_seconds - 1.0
        } else {
            0.0
        }
    };
    let overhead = overhead_of(simulated.step_seconds);
    let predicted_behaviours = predicted_behaviours
        .into_iter()
        .map(|(behaviour, seconds)| (behaviour, overhead_of(seconds)))
        .collect();
    let belady_min_bytes = if budget == u64::MAX {
        0
    } else {
        crate::policy::replay(tape, budget, crate::PolicyKind::NextUse).bytes_moved()
    };
    Ok(DryRun {
        profile: profile.name.clone(),
        budget,
        belady_min_bytes,
        unlimited_step_seconds: unlimited.step_seconds,
        unlimited_peak: unlimited.device_peak,
        overhead,
        simulated,
        chose,
        predicted_behaviours,
    })
}

/// [`dry_run`] at each fraction of the step's unlimited peak (1.0 = 100%), skipping fractions
/// below what the largest op needs by itself. [`SWEEP_FRACTIONS`] is the usual list.
///
/// # Errors
/// As [`dry_run`] (other than the budget).
pub fn sweep(
    tape: &StepTape,
    profile: &DeviceProfile,
    config: &SpillConfig,
    fractions: &[f64],
) -> Result<Vec<DryRun>, SpillError> {
    sweep_assuming(tape, profile, config, fractions, Assumptions::default())
}

/// [`sweep`] under `assumptions` (see [`dry_run_assuming`]). With the state pinned, fractions
/// below what an op needs beside it are skipped too.
///
/// # Errors
/// As [`sweep`].
pub fn sweep_assuming(
    tape: &StepTape,
    profile: &DeviceProfile,
    config: &SpillConfig,
    fractions: &[f64],
    assumptions: impl Into<Assumptions>,
) -> Result<Vec<DryRun>, SpillError> {
    let assumptions = assumptions.into();
    let peak = dry_run(
        tape,
        profile,
        &config.clone().device_budget(DeviceBudget::Unlimited),
    )?
    .unlimited_peak;
    let floor = match assumptions.state {
        StateResidency::Movable => min_budget(tape),
        StateResidency::Pinned => state::pinned_floor(tape).map_or(0, |(_, _, needed)| needed),
    };
    let mut runs = Vec::new();
    for &f in fractions {
        let budget = (peak as f64 * f) as u64;
        if budget < floor {
            continue;
        }
        runs.push(dry_run_assuming(
            tape,
            profile,
            &config.clone().device_budget_bytes(budget),
            assumptions,
        )?);
    }
    Ok(runs)
}

/// 100% of the unlimited peak down to 10%, in steps of 10.
pub const SWEEP_FRACTIONS: [f64; 10] = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1];

#[cfg(test)]
pub(crate) mod tests;
