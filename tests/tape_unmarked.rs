//! Counting the ops of an unmarked stream under a budget while memory is ample (one op in so
//! many checked all the same), and verifying them all again once it binds. Its own process:
//! the test needs a recorder that never saw a marker, and leaves one that a marked test would
//! diverge from.

mod common;

use burn::backend::{Autodiff, Flex};
use burn::tensor::Tensor;
use burn_spill::tape::COUNT_AFTER_VERIFIED_OPS;
use burn_spill::{SpillBackend, SpillConfig};
use common::ExclusiveDevice;
use common::tiny_program::tiny_step;

type Spill = SpillBackend<Flex>;
type B = Autodiff<Spill>;

/// Runs unmarked tiny steps of `rows` rows until the tape counts their ops (past the
/// period's confirmation and the ops it must hold for: the tiny step is 16 ops).
fn until_counted(device: &<Flex as burn::tensor::backend::BackendTypes>::Device, rows: usize) {
    let counted = Spill::tape_counters(device).counted_ops;
    for _ in 0..COUNT_AFTER_VERIFIED_OPS / 16 + 50 {
        tiny_step(device, rows);
    }
    let counters = Spill::tape_counters(device);
    assert_eq!(counters.auto_period, Some(16), "{counters:?}");
    assert!(counters.verifying);
    assert!(counters.counted_ops > counted, "{counters:?}");
}

#[test]
fn under_a_budget_that_never_binds_an_unmarked_stream_is_counted_and_checked() {
    let _device = ExclusiveDevice::take();
    let device = Default::default();
    // No step is recorded in full again within the test: only verified ops can see a change.
    let config = SpillConfig::default()
        .tape_resample_steps(1 << 20)
        .device_budget_bytes(4096);
    Spill::configure(&device, config).unwrap();
    Spill::record_tape(&device, true);
    until_counted(&device, 3);

    // Counted, one op in `CHECK_ONE_IN` is checked: a grown batch is a divergence within a few
    // steps, while memory is still ample.
    let before = Spill::tape_counters(&device);
    let steps = (0..20)
        .position(|_| {
            tiny_step(&device, 5);
            Spill::tape_counters(&device).divergences > before.divergences
        })
        .expect("the grown batch is seen while counted");
    assert!(steps < 20);
    for _ in 0..40 {
        tiny_step(&device, 5);
    }
    assert_eq!(Spill::tape_counters(&device).auto_period, Some(16));
    let tape = Spill::last_step(&device).unwrap();
    assert!(
        tape.tensors.iter().any(|t| t.shape == vec![5, 2]),
        "the new shapes are on the tape"
    );

    // Memory binds (a tensor made on another thread, whose ops are no part of the stream):
    // every op is verified again, so the step that shrinks the batch diverges.
    until_counted(&device, 5);
    let ballast = std::thread::scope(|s| {
        s.spawn(|| Tensor::<B, 1>::ones([900], &device))
            .join()
            .unwrap()
    });
    tiny_step(&device, 5);
    let bound = Spill::tape_counters(&device);
    tiny_step(&device, 3);
    let shrunk = Spill::tape_counters(&device);
    assert_eq!(bound.counted_ops, shrunk.counted_ops, "nothing counted");
    assert_eq!(shrunk.divergences, bound.divergences + 1, "{shrunk:?}");
    let peak = Spill::stats(&device).peak.device;
    assert!(peak <= 4096, "the budget held: {peak}");
    drop(ballast);
    Spill::record_tape(&device, false);
}
