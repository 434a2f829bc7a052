//! Counting the ops of an unmarked stream under a budget while memory is ample, and verifying
//! them again once it binds. Its own process: the test needs a recorder that never saw a
//! marker, and leaves one that a marked test would diverge from.

mod common;

use burn::backend::{Autodiff, Flex};
use burn::tensor::Tensor;
use burn_spill::tape::COUNT_AFTER_VERIFIED_OPS;
use burn_spill::{SpillBackend, SpillConfig};
use common::ExclusiveDevice;
use common::tiny_program::tiny_step;

type Spill = SpillBackend<Flex>;
type B = Autodiff<Spill>;

#[test]
fn under_a_budget_that_never_binds_an_unmarked_stream_is_counted_once_its_period_has_held() {
    let _device = ExclusiveDevice::take();
    let device = Default::default();
    // No step is recorded in full again within the test: only verified ops can see a change.
    let config = SpillConfig::default()
        .tape_resample_steps(1 << 20)
        .device_budget_bytes(4096);
    Spill::configure(&device, config).unwrap();
    Spill::record_tape(&device, true);
    // The tiny step is 16 ops: past its period's confirmation and the ops it must hold for.
    for _ in 0..COUNT_AFTER_VERIFIED_OPS / 16 + 50 {
        tiny_step(&device, 3);
    }
    let before = Spill::tape_counters(&device);
    assert_eq!(before.auto_period, Some(16), "{before:?}");
    assert!(before.verifying);
    // Memory is ample, so the ops are only counted, cut every 16: the same ops on new shapes
    // go unseen.
    for _ in 0..3 {
        tiny_step(&device, 5);
    }
    let counted = Spill::tape_counters(&device);
    assert_eq!(counted.steps, before.steps + 3);
    assert_eq!(counted.divergences, before.divergences);

    // Memory binds (a tensor made on another thread, whose ops are no part of the stream):
    // ops are verified again, and the grown batch's first op diverges.
    let ballast = std::thread::scope(|s| {
        s.spawn(|| Tensor::<B, 1>::ones([900], &device))
            .join()
            .unwrap()
    });
    tiny_step(&device, 5);
    let bound = Spill::tape_counters(&device);
    assert_eq!(bound.divergences, before.divergences + 1, "{bound:?}");
    // The period is found again, and a step of the grown batch is recorded.
    for _ in 0..40 {
        tiny_step(&device, 5);
    }
    assert_eq!(Spill::tape_counters(&device).auto_period, Some(16));
    let tape = Spill::last_step(&device).unwrap();
    assert!(
        tape.tensors.iter().any(|t| t.shape == vec![5, 2]),
        "the new shapes are on the tape"
    );
    let peak = Spill::stats(&device).peak.device;
    assert!(peak <= 4096, "the budget held: {peak}");
    drop(ballast);
    Spill::record_tape(&device, false);
}
