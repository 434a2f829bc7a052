//! Training in f16: parameters, activations and gradients in F16 on plain Flex and through
//! `SpillBackend<Flex>` under 30% of the plain peak, bit for bit, spilled tensors keeping their
//! dtype. (A device's default dtype is set once per process, before any tensor: hence a test
//! binary per dtype.)

#[path = "budgeted/mod.rs"]
mod budgeted;
mod common;
#[path = "../examples/common/small_models.rs"]
mod small_models;

#[test]
fn cnn_and_transformer_train_identically_in_f16_at_30_percent() {
    budgeted::in_half_precision(burn::tensor::FloatDType::F16);
}
