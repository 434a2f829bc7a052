//! The tape-driven engine on real training: every policy with prefetching trains bit-identically
//! to plain Flex, and after the first step of a repeated loop nearly every spilled tensor an op
//! reads was brought back ahead of time. Also: handles dropped while their transfer is in
//! flight lose nothing and leak nothing, and the bad-input rules of the prefetch window.

mod common;
#[path = "../examples/common/small_models.rs"]
mod small_models;

use burn::backend::{Autodiff, Flex};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::Backend as _;
use burn::tensor::{ElementConversion, Tensor, TensorData};
use burn_spill::policy::replay;
use burn_spill::{PolicyKind, SpillBackend, SpillConfig, SpillStats};
use common::ExclusiveDevice;
use small_models::*;

type Plain = Autodiff<Flex>;
type Spilled = Autodiff<SpillBackend<Flex>>;
type Spill = SpillBackend<Flex>;

fn assert_identical(plain: &TrainRun, spilled: &TrainRun, what: &str) {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&plain.losses),
        bits(&spilled.losses),
        "{what}: losses differ"
    );
    for (i, (p, s)) in plain.parameters.iter().zip(&spilled.parameters).enumerate() {
        assert!(
            p.dtype == s.dtype && p.shape == s.shape && p.as_bytes() == s.as_bytes(),
            "{what}: parameter {i} differs"
        );
    }
}

const STEPS: usize = 7;

/// The spilled CNN's device peak with no budget.
fn unlimited_peak(device: &burn::tensor::Device<Flex>) -> u64 {
    Spill::configure(device, SpillConfig::default()).unwrap();
    train_cnn::<Spilled>(device, 2, 8);
    Spill::stats(device).peak.device
}

/// Trains the CNN under `config` with a step marker at the top of every iteration, as a custom
/// loop would (the model is made before the first marker). Returns the run, the stats when the
/// steps start to repeat and at the end.
///
/// The steps repeat from the third iteration: Adam's first step runs fewer ops than the ones
/// after it (it creates its moments), so the tape confirms the repeating program by comparing
/// the second and third iterations. The hit rate is counted from there.
fn train_marked(config: SpillConfig) -> (TrainRun, SpillStats, SpillStats) {
    let device = Default::default();
    Spill::configure(&device, config).unwrap();
    Spilled::seed(&device, 7);
    let mut model = SmallCnn::<Spilled>::new(&device);
    let mut optim = AdamConfig::new().init();
    let mut losses = Vec::new();
    let mut after_first = None;
    for step in 0..STEPS {
        Spill::step_begin(&device);
        if after_first.is_none() && Spill::tape_counters(&device).verifying {
            after_first = Some(Spill::stats(&device));
        }
        let (images, labels) = cnn_batch::<Spilled>(8, step, &device);
        let loss = model.loss(images, labels);
        losses.push(loss.clone().into_scalar().elem());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-2, model, grads);
    }
    Spill::step_end(&device);
    let end = Spill::stats(&device);
    let run = TrainRun {
        losses,
        parameters: parameter_data(&model),
    };
    (
        run,
        after_first.expect("the tape found the repeating step"),
        end,
    )
}

/// Every policy, at 75%, 50% and 30% of the peak, trains identically, moves at most 1.1x
/// Belady's MIN in the last step, and prefetches at least 95% of the spilled reads once steps
/// repeat (at 30% some of the CNN's ops need more than the budget by themselves: 95.9-96.2%):
/// in each configuration with the moves between ops on the op's thread (where the rate
/// measures the plan alone), and over all configurations together on the transfer workers (one
/// may read as few as 16 spilled tensors).
#[test]
fn every_policy_prefetches_ahead_and_trains_identically() {
    let _device = ExclusiveDevice::take();
    let device = Default::default();
    let reference = train_cnn::<Plain>(&device, STEPS, 8);
    let peak = unlimited_peak(&device);
    let mut low = Vec::new();
    let mut async_reads = (0u64, 0u64);
    for asynchronous in [false, true] {
        for percent in [75, 50, 30] {
            for policy in [PolicyKind::Lru, PolicyKind::NextUse, PolicyKind::CostAware] {
                let what = format!(
                    "{policy} at {percent}% of the peak, {}",
                    if asynchronous {
                        "asynchronous"
                    } else {
                        "synchronous"
                    }
                );
                let budget = peak * percent / 100;
                let config = SpillConfig::cnn()
                    .policy(policy)
                    .asynchronous(asynchronous)
                    .device_budget_bytes(budget);
                let (run, first, end) = train_marked(config);
                assert_identical(&reference, &run, &what);
                let hits = end.prefetch_hits - first.prefetch_hits;
                let misses = end.prefetch_misses - first.prefetch_misses;
                let rate = hits as f64 / (hits + misses).max(1) as f64;
                let last = end.last_step.expect("steps were marked");
                // The last step's traffic against Belady's MIN on its own tape and budget.
                let tape = Spill::last_step(&device).expect("a recorded step");
                let min = replay(&tape, budget, PolicyKind::NextUse).bytes_moved();
                let moved = last.device_to_host.bytes + last.host_to_device.bytes;
                let to_min = moved as f64 / min.max(1) as f64;
                eprintln!(
                    "{what}: {hits} hits, {misses} misses ({:.1}%) once steps repeat; \
                     {} prefetches; last step: moved d->h {} B, h->d {} B ({to_min:.2}x MIN), \
                     stall {:?}, peak planned {} B / actual {} B, {} of {} windows saturated",
                    rate * 100.0,
                    end.prefetches_issued - first.prefetches_issued,
                    last.device_to_host.bytes,
                    last.host_to_device.bytes,
                    last.stall_time,
                    last.planned_peak_device_bytes,
                    last.actual_peak_device_bytes,
                    last.saturated_windows,
                    last.windows,
                );
                assert!(end.device_to_host.count > 0, "{what}: nothing was spilled");
                // The plan sizes the room by what the next ops allocate, so the engine moves
                // about what Belady's MIN moves (measured 0.84-1.00x in every configuration).
                if to_min > 1.1 {
                    low.push(format!(
                        "{what}: moved {moved} B, {to_min:.2}x MIN ({min} B)"
                    ));
                }
                assert!(
                    end.prefetches_issued > first.prefetches_issued,
                    "{what}: nothing was prefetched"
                );
                assert!(last.planned_peak_device_bytes > 0, "{what}: no plan");
                assert!(last.windows > 0, "{what}: no windows");
                // Between ops on the op's thread the rate measures the plan alone: each
                // configuration must reach 95%. Asynchronously it also depends on the OS
                // scheduling the workers in time for the moves not cheap enough to run between
                // ops (on Flex, few are), and one configuration may read as few as 16 spilled
                // tensors, so one late arrival is 6%: the asynchronous runs are judged together.
                if asynchronous {
                    async_reads.0 += hits;
                    async_reads.1 += misses;
                } else if rate < 0.95 {
                    low.push(format!(
                        "{what}: prefetch hit rate {rate:.3} once steps repeat"
                    ));
                }
            }
        }
    }
    Spill::configure(&device, SpillConfig::default()).unwrap();
    assert!(low.is_empty(), "{low:#?}");
    let (hits, misses) = async_reads;
    let rate = hits as f64 / (hits + misses).max(1) as f64;
    // Measured 100% over the six at 75% and 50%, idle and with two CPU hogs beside the test (the
    // engine measures how late a busy machine schedules its workers and keeps such moves on the
    // op's thread), and 95.9-96.2% at 30%, as synchronously.
    assert!(
        rate >= 0.95,
        "asynchronous prefetch hit rate {rate:.3} over every policy and budget ({hits} hits, {misses} misses)"
    );
}

#[test]
fn a_zero_window_turns_prefetch_off_and_a_long_one_is_clamped() {
    let _device = ExclusiveDevice::take();
    let device = Default::default();
    let reference = train_cnn::<Plain>(&device, STEPS, 8);
    let peak = unlimited_peak(&device);
    let budget = peak / 2;

    // The counters live as long as the device: compare with their values before.
    let before = Spill::stats(&device);
    let (run, _, end) = train_marked(
        SpillConfig::cnn()
            .device_budget_bytes(budget)
            .prefetch_window(0),
    );
    assert_identical(&reference, &run, "window 0");
    assert_eq!(
        end.prefetches_issued, before.prefetches_issued,
        "window 0 prefetched"
    );
    assert_eq!(end.prefetch_hits, before.prefetch_hits);

    let (run, first, end) = train_marked(
        SpillConfig::cnn()
            .device_budget_bytes(budget)
            .prefetch_window(1 << 30),
    );
    assert_identical(&reference, &run, "window longer than the step");
    assert!(end.prefetches_issued > first.prefetches_issued);
    Spill::configure(&device, SpillConfig::default()).unwrap();
}

#[test]
fn handles_dropped_while_in_flight_lose_nothing_and_leak_nothing() {
    let _device = ExclusiveDevice::take();
    let device = Default::default();
    let data = |i: usize| TensorData::new((0..4096).map(|x| (x + i) as f32).collect(), [4096]);
    // One step: 24 tensors of 16 KiB, each read again a few ops later; the budget holds four.
    let step = |keep: bool| -> Vec<TensorData> {
        let made: Vec<Tensor<Spill, 1>> = (0..24)
            .map(|i| Tensor::from_data(data(i), &device))
            .collect();
        let mut out = Vec::new();
        for (i, t) in made.into_iter().enumerate() {
            let doubled = t.clone() + t;
            if keep && i % 5 == 0 {
                out.push(doubled.into_data());
            }
        }
        out
    };
    Spill::configure(
        &device,
        SpillConfig::default()
            .policy(PolicyKind::NextUse)
            .prefetch_window(4)
            .device_budget_bytes(4 * (16 << 10))
            .host_limit_bytes(64 << 10),
    )
    .unwrap();
    let expected: Vec<TensorData> = (0..24)
        .filter(|i| i % 5 == 0)
        .map(|i| {
            let t = Tensor::<Flex, 1>::from_data(data(i), &Default::default());
            (t.clone() + t).into_data()
        })
        .collect();
    for round in 0..6 {
        Spill::step_begin(&device);
        let out = step(true);
        Spill::step_end(&device);
        assert_eq!(out, expected, "round {round}");
        // The same program, but every handle dropped at once, prefetches still in flight.
        Spill::step_begin(&device);
        drop(step(false));
        Spill::step_end(&device);
    }
    let stats = Spill::stats(&device);
    assert!(stats.prefetches_issued > 0, "nothing was prefetched");
    let live = Spill::live(&device);
    assert_eq!((live.tensors, live.bytes), (0, 0), "tensors leaked");
    assert_eq!(
        (
            stats.resident.device,
            stats.resident.host,
            stats.resident.disk
        ),
        (0, 0, 0),
        "bytes left on a tier"
    );
    assert_eq!(
        Spill::spill_file(&device).map(|f| f.metadata().unwrap().len()),
        Some(0)
    );
    Spill::configure(&device, SpillConfig::default()).unwrap();
}

#[test]
fn presets_pick_cost_aware_and_unknown_policies_are_named() {
    assert_eq!(SpillConfig::cnn().get_policy(), PolicyKind::CostAware);
    assert_eq!(
        SpillConfig::transformer().get_policy(),
        PolicyKind::CostAware
    );
    assert_eq!(
        "next-use".parse::<PolicyKind>().unwrap(),
        PolicyKind::NextUse
    );
    let error = "belady2".parse::<PolicyKind>().unwrap_err().to_string();
    for name in ["belady2", "lru", "next_use", "cost_aware"] {
        assert!(error.contains(name), "{error}");
    }
}
