//! The dry-run planner on a step recorded from real training (the small CNN on Flex): the
//! `measured` profile reproduces the recorded step, its bytes follow what the engine moves at a
//! budget, a tape read back from JSON plans the same, and on a GPU profile the plan keeps every
//! budget it is given.

mod common;
#[path = "../examples/common/small_models.rs"]
mod small_models;

use std::sync::Arc;

use burn::backend::{Autodiff, Flex};
use burn_spill::plan::{DeviceProfile, SWEEP_FRACTIONS, dry_run, min_budget, sweep};
use burn_spill::tape::StepTape;
use burn_spill::{SpillBackend, SpillConfig, SpillStats};
use common::ExclusiveDevice;
use small_models::train_cnn_observed;

type Spilled = Autodiff<SpillBackend<Flex>>;
type Spill = SpillBackend<Flex>;

const BATCH: usize = 8;
const STEPS: usize = 8;

/// Trains the CNN under `config` with every step marked; returns the fullest recorded step
/// and the stats.
fn train(config: SpillConfig) -> (Arc<StepTape>, SpillStats) {
    let device = Default::default();
    Spill::configure(&device, config).unwrap();
    Spill::step_begin(&device);
    train_cnn_observed::<Spilled>(&device, STEPS, BATCH, |step| {
        Spill::step_end(&device);
        if step + 1 < STEPS {
            Spill::step_begin(&device);
        }
    });
    let tape = Spill::fullest_recent_step(&device).expect("a recorded step");
    let stats = Spill::stats(&device);
    Spill::configure(&device, SpillConfig::default()).unwrap();
    (tape, stats)
}

fn plain_peak() -> u64 {
    let device = Default::default();
    Spill::configure(&device, SpillConfig::default()).unwrap();
    Spill::reset_peaks(&device);
    train_cnn_observed::<Spilled>(&device, 3, BATCH, |_| {});
    Spill::stats(&device).peak.device
}

#[test]
fn the_planner_predicts_a_recorded_cnn_step() {
    let _device = ExclusiveDevice::take();
    let peak = plain_peak();
    // Synchronous, so that what the engine moves does not depend on the workers' timing.
    let preset = || SpillConfig::cnn().asynchronous(false);
    let (tape, _) = train(preset().device_budget_bytes(peak * 10));

    // With no limit the measured profile replays the recorded step: its ops, the host's gaps
    // between them, and nothing moved.
    let (_, stats) = train(preset().device_budget_bytes(peak / 2));
    let measured = DeviceProfile::measured(&stats);
    let unlimited = dry_run(&tape, &measured, &SpillConfig::default()).unwrap();
    let recorded = tape.duration_ns as f64 * 1e-9;
    assert!(
        (unlimited.simulated.step_seconds - recorded).abs() <= recorded * 0.01,
        "{} vs {recorded}",
        unlimited.simulated.step_seconds
    );
    assert_eq!(unlimited.simulated.traffic.total(), 0);

    // At half the peak the prediction moves about what the engine moved in its last step.
    let half = preset().device_budget_bytes(peak / 2);
    let predicted = dry_run(&tape, &measured, &half).unwrap();
    let actual = stats.last_step.expect("a finished step").bytes_moved();
    let predicted_bytes = predicted.simulated.traffic.total();
    assert!(actual > 0, "the engine moved nothing at half the peak");
    assert!(
        predicted_bytes.abs_diff(actual) * 4 <= actual,
        "predicted {predicted_bytes} B, the engine moved {actual} B"
    );

    // The tape read back from its JSON plans the same.
    let json = burn_spill::tape::to_json(&tape);
    let read = burn_spill::tape::from_json(&json).unwrap();
    assert_eq!(dry_run(&read, &measured, &half).unwrap(), predicted);

    // On a GPU profile every budget the tape's largest op fits is kept, and the least one
    // moves the most.
    let h100 = DeviceProfile::builtin("h100-pcie5").unwrap();
    let runs = sweep(&tape, &h100, &SpillConfig::cnn(), &SWEEP_FRACTIONS).unwrap();
    assert!(
        runs.len() >= 2,
        "{} budgets above the largest op",
        runs.len()
    );
    for run in &runs {
        assert!(run.budget >= min_budget(&tape));
        assert_eq!(run.simulated.over_budget_ops, 0, "{run:?}");
        assert!(run.simulated.device_peak <= run.budget, "{run:?}");
        assert!(run.overhead >= 0.0);
    }
    let (first, last) = (&runs[0], runs.last().unwrap());
    assert!(last.simulated.traffic.total() >= first.simulated.traffic.total());
    assert!(last.simulated.traffic.total() > 0);
}
