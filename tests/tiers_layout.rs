//! Views across tier moves: a tensor brought back from the host must lead Flex's kernels down
//! the same paths as the original did, or results drift by an ulp from plain Flex's.
//!
//! Flex picks a kernel's path from the operand's layout and from where it sits in its buffer: a
//! unary op on a view that starts at offset 0 and fills its buffer keeps the view's strides, one
//! on a view inside a larger buffer writes a contiguous output. A contiguous slice that starts
//! inside its source's buffer comes back from the host as a buffer of its own, so a transpose
//! of it, negated, would keep transposed strides where plain Flex's result is contiguous, and a
//! matmul reading it would accumulate in another order. Such views stay on the device.
//!
//! Every test holds [`common::ExclusiveDevice`] for its whole run.

mod common;

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use burn_spill::{SpillConfig, Tier};
use common::{ExclusiveDevice, Plain, Spill, assert_same_data};

/// A `[2, rows, cols]` f32 tensor whose values make a dot product's rounding depend on the
/// order it adds in.
fn ragged<B: Backend>(rows: usize, cols: usize, device: &B::Device) -> Tensor<B, 3> {
    let values: Vec<f32> = (0..2 * rows * cols)
        .map(|i| ((i * 7919) % 1009) as f32 / 97.0 - 5.0 + 1.0 / (i as f32 + 3.0))
        .collect();
    Tensor::from_data(TensorData::new(values, [2, rows, cols]), device)
}

/// The second half of `source` (a contiguous view inside its buffer), transposed, negated (the
/// transpose kept alive meanwhile, so `neg` cannot write in place), and multiplied by its own
/// transpose. `between` runs after the slice is made and before anything reads it.
fn product_of_a_negated_sliced_transpose<B: Backend>(
    source: Tensor<B, 3>,
    between: impl Fn(),
) -> (Tensor<B, 3>, TensorData) {
    let [_, rows, cols] = source.dims();
    let half = source.slice([1..2, 0..rows, 0..cols]);
    between();
    let transposed = half.clone().swap_dims(1, 2);
    let negated = transposed.clone().neg();
    let product = negated.clone().matmul(negated.transpose());
    drop(transposed);
    (half, product.into_data())
}

#[test]
fn a_slice_inside_its_buffer_stays_on_the_device_and_gives_plain_results() {
    let _device = ExclusiveDevice::take();
    let dev = Default::default();
    let (rows, cols) = (3, 4);
    let (_, plain) =
        product_of_a_negated_sliced_transpose(ragged::<Plain>(rows, cols, &dev), || {});

    Spill::configure(&dev, SpillConfig::default().device_budget_bytes(0)).unwrap();
    let source = ragged::<Spill>(rows, cols, &dev);
    // Under budget 0 every tensor the running op does not use is evicted after each op; the
    // slice's eviction (before the fix) had landed once the workers were idle (`stats` waits).
    let (half, spilled) = product_of_a_negated_sliced_transpose(source, || {
        let _ = Spill::stats(&dev);
    });
    assert_same_data(&plain, &spilled, "matmul of a negated, sliced transpose");
    // After every op under budget 0, with the workers idle: still on the device.
    let _ = Spill::stats(&dev);
    let residency = half.into_primitive().tensor().residency();
    assert_eq!(
        residency,
        Tier::Device,
        "a slice inside its buffer was moved"
    );
}
