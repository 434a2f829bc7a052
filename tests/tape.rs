//! The tape of real programs through `Autodiff<SpillBackend<Flex>>`: markers, re-recording on
//! divergence, unbalanced markers, and a small program whose tape is derived by hand.

mod common;

use burn::backend::{Autodiff, Flex};
use burn::tensor::{Tensor, TensorData};
use burn_spill::{SpillBackend, SpillConfig};
use common::ExclusiveDevice;

type Spill = SpillBackend<Flex>;
type B = Autodiff<Spill>;

/// The hand-derived program: w [2,2] (requires grad), x [3,2], y = tanh(x w), loss = sum(y),
/// then backward and the gradient of w read and dropped.
fn tiny_step(device: &<Flex as burn::tensor::backend::BackendTypes>::Device, rows: usize) {
    let w = Tensor::<B, 2>::from_data(TensorData::new(vec![1f32, 2., 3., 4.], [2, 2]), device)
        .require_grad();
    let x_values: Vec<f32> = (0..rows * 2).map(|i| (i % 3) as f32).collect();
    let x = Tensor::<B, 2>::from_data(TensorData::new(x_values, [rows, 2]), device);
    let loss = x.matmul(w.clone()).tanh().sum();
    let grads = loss.backward();
    drop(w.grad(&grads));
}

#[test]
fn a_marked_step_records_every_op_in_order() {
    let _device = ExclusiveDevice::take();
    let device = Default::default();
    Spill::configure(&device, SpillConfig::default().tape_resample_steps(1)).unwrap();
    {
        let _step = Spill::step(&device);
        tiny_step(&device, 3);
    }
    let tape = Spill::last_step(&device).expect("a finished step");
    let names: Vec<&str> = tape.ops.iter().map(|o| o.name.as_str()).collect();
    // Forward: two from_data, matmul, tanh, sum. Backward (Burn 0.21 autodiff): the root
    // gradient (ones like the loss), sum's backward (ones of the input shape times the
    // reshaped gradient), tanh's backward (1 - tanh(x)^2, recomputed from the saved matmul
    // output), matmul's backward for w (x^T @ grad).
    assert_eq!(
        names,
        [
            "float_from_data",
            "float_from_data",
            "float_matmul",
            "float_tanh",
            "float_sum",
            "float_ones",
            "float_ones",
            "float_reshape",
            "float_mul",
            "float_tanh",
            "float_powi_scalar",
            "float_neg",
            "float_add_scalar",
            "float_mul",
            "float_transpose",
            "float_matmul",
        ]
    );
    assert!(tape.marked);
    // Every tensor the step made has its producer, every drop refers to a known tensor.
    for (i, op) in tape.ops.iter().enumerate() {
        for (k, out) in op.outputs.iter().enumerate() {
            let t = tape.tensors.iter().find(|t| t.id == *out).unwrap();
            assert_eq!(
                t.producer.map(|p| (p.op as usize, p.output as usize)),
                Some((i, k))
            );
        }
    }
    assert!(
        tape.drops
            .iter()
            .all(|d| tape.tensors.iter().any(|t| t.id == d.id))
    );
    assert!(tape.ops.iter().all(|o| o.duration_ns > 0));
}

#[test]
fn a_changed_shape_is_a_divergence_and_the_next_step_is_recorded() {
    let _device = ExclusiveDevice::take();
    let device = Default::default();
    Spill::configure(&device, SpillConfig::default().tape_resample_steps(100)).unwrap();
    let before = Spill::tape_counters(&device);
    for _ in 0..3 {
        let _step = Spill::step(&device);
        tiny_step(&device, 3);
    }
    assert!(
        Spill::tape_counters(&device).verifying,
        "repeating steps are only verified"
    );
    let recorded = Spill::last_step(&device).unwrap().step;
    {
        let _step = Spill::step(&device);
        tiny_step(&device, 5); // the batch grows: shapes change
    }
    let after = Spill::tape_counters(&device);
    assert_eq!(after.divergences, before.divergences + 1);
    assert!(!after.verifying, "the next step is recorded in full");
    {
        let _step = Spill::step(&device);
        tiny_step(&device, 5);
    }
    let tape = Spill::last_step(&device).unwrap();
    assert!(tape.step > recorded);
    assert!(
        tape.tensors.iter().any(|t| t.shape == vec![5, 2]),
        "the new shapes are on the tape"
    );
}

#[test]
fn step_end_without_step_begin_only_warns() {
    let _device = ExclusiveDevice::take();
    let device = Default::default();
    Spill::configure(&device, SpillConfig::default().tape_resample_steps(1)).unwrap();
    {
        let _step = Spill::step(&device);
        tiny_step(&device, 3);
    }
    let tape = Spill::last_step(&device).unwrap();
    let counters = Spill::tape_counters(&device);
    Spill::step_end(&device);
    Spill::step_end(&device);
    assert_eq!(
        Spill::tape_counters(&device),
        counters,
        "unbalanced markers change nothing"
    );
    assert_eq!(*Spill::last_step(&device).unwrap(), *tape);
    // Markers then work as before.
    {
        let _step = Spill::step(&device);
        tiny_step(&device, 3);
    }
    assert_eq!(Spill::last_step(&device).unwrap().ops.len(), tape.ops.len());
    Spill::record_tape(&device, false);
}
