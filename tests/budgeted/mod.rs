//! Training under a device budget of 30% of the plain peak, checked against plain Flex: the
//! measurement and the checks the training tests share (`mod budgeted;` in a test binary that
//! also mounts `small_models` and `common`).

#![allow(dead_code)] // each test binary uses some of these

use burn::tensor::TensorData;
use burn::tensor::backend::AutodiffBackend;
use burn_spill::{SpillBackend, SpillConfig, SpillStats};

use crate::common::ExclusiveDevice;
use crate::small_models::*;
use burn::backend::Flex;

pub fn assert_identical(plain: &TrainRun, spilled: &TrainRun) {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&plain.losses), bits(&spilled.losses), "losses differ");
    assert_eq!(plain.parameters.len(), spilled.parameters.len());
    for (i, (p, s)) in plain.parameters.iter().zip(&spilled.parameters).enumerate() {
        let same = |a: &TensorData, b: &TensorData| {
            a.dtype == b.dtype && a.shape == b.shape && a.as_bytes() == b.as_bytes()
        };
        assert!(same(p, s), "parameter {i} differs");
    }
}

pub type Trainer = fn(&burn::tensor::Device<Flex>, usize, usize, &mut dyn FnMut(usize)) -> TrainRun;

pub fn cnn<B: AutodiffBackend>(
    device: &B::Device,
    steps: usize,
    batch: usize,
    after: &mut dyn FnMut(usize),
) -> TrainRun {
    train_cnn_observed::<B>(device, steps, batch, after)
}

pub fn gpt<B: AutodiffBackend>(
    device: &B::Device,
    steps: usize,
    batch: usize,
    after: &mut dyn FnMut(usize),
) -> TrainRun {
    train_gpt_observed::<B>(device, steps, batch, after)
}

/// Trains plain, measures the spilled run's unlimited device peak, then trains at 30% of it
/// (host tier unlimited, or capped at `host_limit`) and checks results and the peak. Returns the
/// budgeted run's stats (counters from its start).
pub fn at_30_percent(
    plain: Trainer,
    spilled: Trainer,
    batch: usize,
    host_limit: Option<u64>,
) -> SpillStats {
    at_30_percent_with(plain, spilled, batch, &|config| match host_limit {
        Some(limit) => config.host_limit_bytes(limit),
        None => config,
    })
}

/// [`at_30_percent`] with the spilled run's config (the budget already in it) shaped by
/// `shape`: a host limit, a remote tier. Returns the budgeted run's stats, its counters counted
/// from its start.
pub fn at_30_percent_with(
    plain: Trainer,
    spilled: Trainer,
    batch: usize,
    shape: &dyn Fn(SpillConfig) -> SpillConfig,
) -> SpillStats {
    at_30_percent_marked_with(plain, spilled, batch, shape, false)
}

/// [`at_30_percent_with`], with each step of the budgeted run marked (`step_begin` /
/// `step_end`) when `marked`.
pub fn at_30_percent_marked_with(
    plain: Trainer,
    spilled: Trainer,
    batch: usize,
    shape: &dyn Fn(SpillConfig) -> SpillConfig,
    marked: bool,
) -> SpillStats {
    at_30_percent_for_steps(plain, spilled, batch, 5, shape, marked)
}

/// [`at_30_percent_marked_with`], each run `steps` steps long.
pub fn at_30_percent_for_steps(
    plain: Trainer,
    spilled: Trainer,
    batch: usize,
    steps: usize,
    shape: &dyn Fn(SpillConfig) -> SpillConfig,
    marked: bool,
) -> SpillStats {
    let _device = ExclusiveDevice::take();
    let device = Default::default();
    let reference = plain(&device, steps, batch, &mut |_| {});

    SpillBackend::<Flex>::configure(&device, SpillConfig::default()).unwrap();
    let unlimited = spilled(&device, steps, batch, &mut |_| {});
    assert_identical(&reference, &unlimited);
    let plain_peak = SpillBackend::<Flex>::stats(&device).peak.device;
    let budget = plain_peak * 3 / 10;

    let config = shape(SpillConfig::default().device_budget_bytes(budget));
    SpillBackend::<Flex>::configure(&device, config).unwrap();
    let before = SpillBackend::<Flex>::stats(&device);
    let mut after_warmup = None;
    if marked {
        SpillBackend::<Flex>::step_begin(&device);
    }
    let run = spilled(&device, steps, batch, &mut |step| {
        if marked {
            SpillBackend::<Flex>::step_end(&device);
            SpillBackend::<Flex>::step_begin(&device);
        }
        if step == 0 {
            // The first step teaches the engine each op's output size; measure the rest.
            SpillBackend::<Flex>::reset_peaks(&device);
            after_warmup = Some(SpillBackend::<Flex>::stats(&device));
        }
    });
    if marked {
        SpillBackend::<Flex>::step_end(&device);
    }
    let stats = SpillBackend::<Flex>::stats(&device);
    let warm = after_warmup.expect("the first step ran");
    eprintln!(
        "plain peak {plain_peak} B, budget {budget} B, spilled peak {} B, over-budget ops {} (largest {} B), unevictable now {} B, \
         estimate misses {} (after warm-up {}), moved d->h {} / h->d {} / h->disk {} / disk->d {}",
        stats.peak.device,
        stats.over_budget_ops - before.over_budget_ops,
        stats.largest_over_budget_op_bytes,
        stats.unevictable_device_bytes,
        stats.estimate_misses - before.estimate_misses,
        stats.estimate_misses - warm.estimate_misses,
        stats.device_to_host.count - before.device_to_host.count,
        stats.host_to_device.count - before.host_to_device.count,
        stats.host_to_disk.count - before.host_to_disk.count,
        stats.disk_to_device.count - before.disk_to_device.count,
    );

    assert_identical(&reference, &run);
    assert!(
        stats.device_to_host.count > before.device_to_host.count,
        "nothing was spilled"
    );
    assert!(
        stats.host_to_device.count + stats.disk_to_device.count
            > before.host_to_device.count + before.disk_to_device.count,
        "nothing was restored"
    );
    assert_eq!(
        stats.estimate_misses, warm.estimate_misses,
        "after the warm-up step every op's output size is known"
    );
    let allowed = budget.max(stats.largest_over_budget_op_bytes);
    assert!(
        stats.peak.device <= allowed,
        "device peak {} above the budget {budget} and above the largest over-budget op ({} B)",
        stats.peak.device,
        stats.largest_over_budget_op_bytes
    );
    stats.since(&before)
}

/// The CNN with 4 micro-batches accumulated per optimizer step (burn-optim's
/// `GradientsAccumulator`).
pub fn accumulating_cnn<B: AutodiffBackend>(
    device: &B::Device,
    steps: usize,
    batch: usize,
    after: &mut dyn FnMut(usize),
) -> TrainRun {
    train_cnn_accumulating::<B>(device, steps, batch, 4, after)
}

/// Sets the device's default float dtype to `dtype` (before any tensor of this process) and
/// trains the CNN and the Transformer in it at 30% of the plain peak.
pub fn in_half_precision(dtype: burn::tensor::FloatDType) {
    use burn::backend::Autodiff;
    type Plain = Autodiff<Flex>;
    type Spilled = Autodiff<SpillBackend<Flex>>;
    let device = Default::default();
    burn::tensor::backend::set_default_float_dtype::<Flex>(&device, dtype)
        .expect("the default dtype is set before any tensor exists");
    for (name, plain, spilled, batch) in [
        ("cnn", cnn::<Plain> as Trainer, cnn::<Spilled> as Trainer, 8),
        (
            "transformer",
            gpt::<Plain> as Trainer,
            gpt::<Spilled> as Trainer,
            4,
        ),
    ] {
        let stats = at_30_percent(plain, spilled, batch, None);
        let reference = plain(&device, 1, batch, &mut |_| {});
        assert!(
            reference
                .parameters
                .iter()
                .all(|p| p.dtype == burn::tensor::DType::from(dtype)),
            "{name}: the parameters are {dtype:?}"
        );
        assert!(stats.device_to_host.bytes > 0, "{name} spilled");
    }
}
