//! Real training under a device budget of 30% of the plain peak: a small CNN and a small
//! Transformer, 5 Adam steps each, bit-identical to plain Flex, with the device peak held to the
//! budget except for ops that alone need more than it (counted and bounded).

#[path = "budgeted/mod.rs"]
mod budgeted;
mod common;
#[path = "../examples/common/small_models.rs"]
mod small_models;

use budgeted::{Trainer, accumulating_cnn, assert_identical, at_30_percent, cnn, gpt};
use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::backend::{Autodiff, Flex};
use burn_spill::{SpillBackend, SpillConfig};
use common::ExclusiveDevice;
use small_models::*;

type Plain = Autodiff<Flex>;
type Spilled = Autodiff<SpillBackend<Flex>>;

#[test]
fn cnn_trains_identically_at_30_percent_of_its_peak() {
    at_30_percent(cnn::<Plain>, cnn::<Spilled>, 8, None);
}

#[test]
fn transformer_trains_identically_at_30_percent_of_its_peak() {
    at_30_percent(gpt::<Plain>, gpt::<Spilled>, 4, None);
}

/// Burn's own gradient checkpointing under burn-spill: `Autodiff<SpillBackend<Flex>,
/// BalancedCheckpointing>` against `Autodiff<Flex, BalancedCheckpointing>`.
type PlainCheckpointed = Autodiff<Flex, BalancedCheckpointing>;
type SpilledCheckpointed = Autodiff<SpillBackend<Flex>, BalancedCheckpointing>;

#[test]
fn cnn_with_balanced_checkpointing_trains_identically_at_30_percent() {
    at_30_percent(
        cnn::<PlainCheckpointed>,
        cnn::<SpilledCheckpointed>,
        8,
        None,
    );
}

#[test]
fn transformer_with_balanced_checkpointing_trains_identically_at_30_percent() {
    at_30_percent(
        gpt::<PlainCheckpointed>,
        gpt::<SpilledCheckpointed>,
        4,
        None,
    );
}

/// Gradient accumulation in a custom loop: 4 micro-batches per Adam step, their gradients
/// held (and spilled) across the micro-batches by burn-optim's `GradientsAccumulator`.
#[test]
fn cnn_with_gradient_accumulation_trains_identically_at_30_percent() {
    let plain: Trainer = accumulating_cnn::<Plain>;
    at_30_percent(plain, accumulating_cnn::<Spilled>, 4, None);
}

#[test]
fn cnn_trains_identically_with_the_host_tier_capped_to_disk() {
    let stats = at_30_percent(cnn::<Plain>, cnn::<Spilled>, 8, Some(16 << 10));
    assert!(stats.host_to_disk.count > 0 && stats.disk_to_device.count > 0);
    assert_eq!(stats.disk_write_errors, 0);
}

/// The host limit is hard: an eviction that the host tier has no room for goes on to disk at
/// once, so the host never holds more than the limit, at 0, at a few KiB and at half of what the
/// host held with no limit, synchronous and asynchronous.
#[test]
fn the_host_tier_never_holds_more_than_its_limit() {
    let _device = ExclusiveDevice::take();
    let device = Default::default();
    let reference = cnn::<Plain>(&device, 3, 8, &mut |_| {});
    SpillBackend::<Flex>::configure(&device, SpillConfig::default()).unwrap();
    assert_identical(&reference, &cnn::<Spilled>(&device, 3, 8, &mut |_| {}));
    let budget = SpillBackend::<Flex>::stats(&device).peak.device * 3 / 10;
    let at_budget = SpillConfig::default().device_budget_bytes(budget);
    SpillBackend::<Flex>::configure(&device, at_budget.clone()).unwrap();
    assert_identical(&reference, &cnn::<Spilled>(&device, 3, 8, &mut |_| {}));
    let unlimited_host_peak = SpillBackend::<Flex>::stats(&device).peak.host;
    assert!(unlimited_host_peak > 0, "nothing was spilled");
    for asynchronous in [true, false] {
        for limit in [0, 16 << 10, unlimited_host_peak / 2] {
            let config = at_budget
                .clone()
                .asynchronous(asynchronous)
                .host_limit_bytes(limit);
            SpillBackend::<Flex>::configure(&device, config).unwrap();
            let before = SpillBackend::<Flex>::stats(&device);
            let run = cnn::<Spilled>(&device, 3, 8, &mut |_| {});
            let stats = SpillBackend::<Flex>::stats(&device);
            eprintln!(
                "asynchronous {asynchronous}, host limit {limit} B: host peak {} B (unlimited {unlimited_host_peak} B), \
                 {} written to disk",
                stats.peak.host,
                stats.host_to_disk.count - before.host_to_disk.count
            );
            assert_identical(&reference, &run);
            assert!(
                stats.peak.host <= limit,
                "host peak {} B over the limit of {limit} B",
                stats.peak.host
            );
            assert!(stats.host_to_disk.count > before.host_to_disk.count);
            assert_eq!(stats.disk_write_errors, before.disk_write_errors);
            drop(run);
        }
    }
}

/// Burn 0.21 initialises a `Param` on its first use, so a model's first step creates its
/// parameters under the budget: ops that make a tensor from nothing (random, zeros, ones,
/// arange, from_data) are sized from their shape and dtype before they run the first time, and
/// none of them lands on a device with no room for it.
#[test]
fn lazily_initialised_parameters_are_sized_before_they_are_made() {
    use burn::nn::{Linear, LinearConfig};
    use burn::tensor::{Int, Tensor};
    type Forward = SpillBackend<Flex>;
    let _device = ExclusiveDevice::take();
    let device = Default::default();
    // Four 64x64 f32 weights of 16 KiB each; the budget has room for two.
    let budget = 40 << 10;
    SpillBackend::<Flex>::configure(&device, SpillConfig::default().device_budget_bytes(budget))
        .unwrap();
    let before = SpillBackend::<Flex>::stats(&device);
    let layers: Vec<Linear<Forward>> = (0..4)
        .map(|_| LinearConfig::new(64, 64).init(&device))
        .collect();
    assert_eq!(
        SpillBackend::<Flex>::live(&device).tensors,
        before.live_tensors,
        "the parameters are not made yet"
    );
    let mut x = Tensor::<Forward, 2>::ones([1, 64], &device);
    for layer in &layers {
        x = layer.forward(x);
    }
    let positions = Tensor::<Forward, 1, Int>::arange(0..4096, &device);
    let table = Tensor::<Forward, 2>::from_data([[0.5f32; 64]; 64], &device);
    let zeros = Tensor::<Forward, 2>::zeros([64, 64], &device);
    let stats = SpillBackend::<Flex>::stats(&device);
    assert_eq!(
        stats.estimate_misses - before.estimate_misses,
        0,
        "every created tensor was sized before it was made"
    );
    assert!(
        stats.peak.device <= budget,
        "device peak {} B over the budget {budget} B",
        stats.peak.device
    );
    assert!(stats.device_to_host.count > before.device_to_host.count);
    drop((x, positions, table, zeros, layers));
}

#[test]
fn ledger_is_empty_after_a_budgeted_run() {
    let _device = ExclusiveDevice::take();
    let device = Default::default();
    SpillBackend::<Flex>::configure(
        &device,
        SpillConfig::default()
            .device_budget_bytes(0)
            .host_limit_bytes(0),
    )
    .unwrap();
    let run = cnn::<Spilled>(&device, 2, 4, &mut |_| {});
    drop(run);
    let live = SpillBackend::<Flex>::live(&device);
    let stats = SpillBackend::<Flex>::stats(&device);
    assert_eq!((live.tensors, live.bytes), (0, 0));
    assert_eq!(
        (
            stats.resident.device,
            stats.resident.host,
            stats.resident.disk
        ),
        (0, 0, 0)
    );
    let file = SpillBackend::<Flex>::spill_file(&device).expect("a disk tier");
    assert_eq!(
        std::fs::metadata(file).unwrap().len(),
        0,
        "every record was freed"
    );
}

#[test]
fn spilled_parameters_are_told_apart() {
    let _device = ExclusiveDevice::take();
    let device = Default::default();
    SpillBackend::<Flex>::configure(&device, SpillConfig::default().device_budget_bytes(0))
        .unwrap();
    let model = SmallCnn::<SpillBackend<Flex>>::new(&device);
    let (images, _) = cnn_batch::<SpillBackend<Flex>>(2, 0, &device);
    let _logits = model.forward(images);
    let stats = SpillBackend::<Flex>::stats(&device);
    let live = SpillBackend::<Flex>::live(&device);
    assert!(
        live.parameter_tensors > 0,
        "parameters made at init are tagged"
    );
    assert_eq!(stats.parameter_tensors, live.parameter_tensors);
    // Budget 0: after the forward every parameter is off the device, counted as a parameter.
    assert_eq!(stats.parameter_resident.device, 0);
    assert_eq!(stats.spilled_parameter_bytes, live.parameter_bytes);
    assert_eq!(stats.parameter_resident.host, live.parameter_bytes);
    assert!(
        stats.spilled_other_bytes > 0,
        "activations are counted apart"
    );
    assert_eq!(
        stats.spilled_other_bytes + stats.spilled_parameter_bytes,
        stats.resident.host + stats.resident.disk
    );
    drop(model);
}

/// The CNN trained with batches that grow mid-run, calling `after(step)` after each step.
fn cnn_growing<B: burn::tensor::backend::AutodiffBackend>(
    device: &B::Device,
    batches: &[usize],
    mut after: impl FnMut(usize),
) -> TrainRun {
    use burn::optim::{AdamConfig, GradientsParams, Optimizer};
    use burn::tensor::ElementConversion;
    B::seed(device, 7);
    let mut model = SmallCnn::<B>::new(device);
    let mut optim = AdamConfig::new().init();
    let mut losses = Vec::new();
    for (step, &batch) in batches.iter().enumerate() {
        let (images, labels) = cnn_batch::<B>(batch, step, device);
        let loss = model.loss(images, labels);
        losses.push(loss.clone().into_scalar().elem());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-2, model, grads);
        after(step);
    }
    TrainRun {
        losses,
        parameters: parameter_data(&model),
    }
}

/// A budget that never binds while the batch is small and binds once it grows: the engine's
/// fast path for ample memory moves nothing in the small steps, and from the first large step
/// on the budget is honoured as in a run that was tight from the start (bit-identical results,
/// the device peak within the budget once the new op sizes are learnt).
#[test]
fn a_budget_that_starts_to_bind_mid_run_is_honoured() {
    let _device = ExclusiveDevice::take();
    let device = Default::default();
    let batches = [2, 2, 2, 2, 16, 16, 16, 16];
    let small_steps = 4;
    let reference = cnn_growing::<Plain>(&device, &batches, |_| {});

    SpillBackend::<Flex>::configure(&device, SpillConfig::default()).unwrap();
    let mut small_peak = 0;
    let unlimited = cnn_growing::<Spilled>(&device, &batches, |step| {
        if step + 1 == small_steps {
            small_peak = SpillBackend::<Flex>::stats(&device).peak.device;
        }
    });
    assert_identical(&reference, &unlimited);
    let large_peak = SpillBackend::<Flex>::stats(&device).peak.device;
    assert!(
        large_peak > 3 * small_peak,
        "{small_peak} B then {large_peak} B"
    );
    // Far above the small steps' peak (and their plan's headroom), well under the large ones'.
    let budget = large_peak / 2;
    assert!(budget > 2 * small_peak);

    SpillBackend::<Flex>::configure(&device, SpillConfig::default().device_budget_bytes(budget))
        .unwrap();
    // The device's counters run over the whole process (other tests trained on it before).
    let before = SpillBackend::<Flex>::stats(&device);
    assert!(!before.ops_tracked, "a fresh budget starts untracked");
    let mut moved_while_small = None;
    let mut tracked_while_small = None;
    let run = cnn_growing::<Spilled>(&device, &batches, |step| {
        if step + 1 == small_steps {
            let now = SpillBackend::<Flex>::stats(&device);
            moved_while_small = Some(now.device_to_host.count - before.device_to_host.count);
            tracked_while_small = Some(now.ops_tracked);
        }
        if step == small_steps {
            // The first large step teaches the engine the new op sizes; measure the rest.
            SpillBackend::<Flex>::reset_peaks(&device);
        }
    });
    let stats = SpillBackend::<Flex>::stats(&device);
    eprintln!(
        "small peak {small_peak} B, large peak {large_peak} B, budget {budget} B; spilled peak \
         after the first large step {} B, moved d->h {}, over-budget ops {}",
        stats.peak.device,
        stats.device_to_host.count - before.device_to_host.count,
        stats.over_budget_ops - before.over_budget_ops
    );
    assert_identical(&reference, &run);
    assert_eq!(
        moved_while_small,
        Some(0),
        "nothing moves while memory is ample"
    );
    assert_eq!(
        tracked_while_small,
        Some(false),
        "ops run untracked while memory is ample"
    );
    assert!(stats.ops_tracked, "ops are tracked once the budget binds");
    assert!(
        stats.device_to_host.count > before.device_to_host.count,
        "nothing was spilled once it bound"
    );
    // No op of this model alone needs more than the budget, so none may run over it.
    assert_eq!(stats.over_budget_ops, before.over_budget_ops);
    assert!(
        stats.peak.device <= budget,
        "device peak {} above the budget {budget}",
        stats.peak.device
    );
}
