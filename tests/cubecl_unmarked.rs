//! Recompute in steps no marker bounds, on the CubeCL path (wgpu on lavapipe in CI; CUDA with
//! `--features cuda`): once the period detector has confirmed the step's period, victims are
//! dropped and rebuilt as in marked steps (`tests/recompute_unmarked.rs` on Flex). On CubeCL a
//! rebuild runs the kernel again on the op thread's stream and a drop on a worker frees on that
//! stream, behind the op thread's queued kernels; only a run with no markers at all reaches
//! that through the period detector's steps. Its own process: a device's recorder must never
//! have seen a marker (markers bound the steps from the first one on), and `tests/cubecl.rs`
//! marks its steps.
#![cfg(any(feature = "wgpu", feature = "cuda"))]

mod cubecl_support;
#[path = "../examples/common/small_models.rs"]
mod small_models;

use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn_spill::{PolicyKind, RecomputeMode, SpillBackend, SpillConfig};

use cubecl_support::*;
use small_models::train_gpt_observed;

/// Steps of each run: the first go to finding the period (the detector confirms shorter
/// repetitions inside the step first), as on Flex.
const STEPS: usize = 30;
/// The batch of the tiny GPT: small, so that thirty steps three times over stay short on
/// lavapipe.
const BATCH: usize = 4;

/// Trains the tiny GPT without step markers on plain `I`, on `SpillBackend<I>` with no budget
/// (bit for bit: nothing drains the stream where plain does not), then at 30% of that run's
/// peak dropping every victim it may, asynchronous: it matches plain (bit for bit where the
/// backend does not round by drain points), drops and rebuilds, leaves nothing dropped, and
/// stays within the budget.
fn unmarked_steps_drop_and_match_plain<I: Backend>(what: &str) {
    let device = I::Device::default();
    let _reset = Reset::<I>(device.clone());
    let plain = train_gpt_observed::<Autodiff<I>>(&device, STEPS, BATCH, |_| {});

    SpillBackend::<I>::configure(&device, SpillConfig::default()).unwrap();
    SpillBackend::<I>::reset_peaks(&device);
    let unlimited = train_gpt_observed::<Autodiff<SpillBackend<I>>>(&device, STEPS, BATCH, |_| {});
    assert_identical(&plain, &unlimited, &format!("{what}: no budget"));
    let budget = SpillBackend::<I>::stats(&device).peak.device * 3 / 10;

    let config = SpillConfig::default()
        .device_budget_bytes(budget)
        .policy(PolicyKind::NextUse)
        .prefetch_window(2)
        .recompute(RecomputeMode::Recompute)
        .asynchronous(true);
    SpillBackend::<I>::configure(&device, config).unwrap();
    let before = SpillBackend::<I>::stats(&device);
    let spilled = train_gpt_observed::<Autodiff<SpillBackend<I>>>(&device, STEPS, BATCH, |step| {
        if step == 0 {
            // The first step teaches the engine each op's output size.
            SpillBackend::<I>::reset_peaks(&device);
        }
    });
    let stats = SpillBackend::<I>::stats(&device);
    let recompute = stats.since(&before).recompute;
    eprintln!(
        "{what}: budget {budget} B, peak {} B, {recompute:?}, tape {:?}",
        stats.peak.device,
        SpillBackend::<I>::tape_counters(&device),
    );
    assert_matches_plain::<I>(&plain, &spilled, &format!("{what}: at 30% ({budget} B)"));
    assert!(
        recompute.dropped > 0,
        "{what}: nothing dropped: {recompute:?}"
    );
    assert!(
        recompute.rebuilt > 0,
        "{what}: nothing rebuilt: {recompute:?}"
    );
    assert_eq!(
        recompute.dropped_now_bytes, 0,
        "{what}: every drop rebuilt or let go: {recompute:?}"
    );
    let allowed = budget.max(stats.largest_over_budget_op_bytes);
    assert!(
        stats.peak.device <= allowed,
        "{what}: device peak {} above the budget {budget} and above the largest over-budget op \
         ({} B)",
        stats.peak.device,
        stats.largest_over_budget_op_bytes
    );
}

macro_rules! unmarked_test {
    ($name:ident, $backend:ty) => {
        #[test]
        fn $name() {
            if !available::<$backend>(stringify!($name)) {
                return;
            }
            let _lock = exclusive();
            unmarked_steps_drop_and_match_plain::<$backend>(stringify!($name));
        }
    };
}

#[cfg(feature = "wgpu")]
unmarked_test!(wgpu_unfused_drops_in_unmarked_steps, WgpuUnfused);
#[cfg(all(feature = "wgpu", feature = "fusion"))]
unmarked_test!(wgpu_fused_drops_in_unmarked_steps, WgpuFused);
#[cfg(feature = "cuda")]
unmarked_test!(cuda_unfused_drops_in_unmarked_steps, CudaUnfused);
#[cfg(all(feature = "cuda", feature = "fusion"))]
unmarked_test!(cuda_fused_drops_in_unmarked_steps, CudaFused);
