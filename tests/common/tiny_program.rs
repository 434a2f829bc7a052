//! The small program the tape's tests run: its ops are listed in `tests/tape.rs`
//! (`a_marked_step_records_every_op_in_order`).

use burn::backend::{Autodiff, Flex};
use burn::tensor::{Tensor, TensorData};
use burn_spill::SpillBackend;

type B = Autodiff<SpillBackend<Flex>>;

/// The hand-derived program: w [2,2] (requires grad), x [3,2], y = tanh(x w), loss = sum(y),
/// then backward and the gradient of w read and dropped.
pub fn tiny_step(device: &<Flex as burn::tensor::backend::BackendTypes>::Device, rows: usize) {
    let w = Tensor::<B, 2>::from_data(TensorData::new(vec![1f32, 2., 3., 4.], [2, 2]), device)
        .require_grad();
    let x_values: Vec<f32> = (0..rows * 2).map(|i| (i % 3) as f32).collect();
    let x = Tensor::<B, 2>::from_data(TensorData::new(x_values, [rows, 2]), device);
    let loss = x.matmul(w.clone()).tanh().sum();
    let grads = loss.backward();
    drop(w.grad(&grads));
}
