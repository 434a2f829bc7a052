//! Forward and backward through `Autodiff<SpillBackend<Flex>>` against `Autodiff<Flex>`, in f32,
//! f16 and bf16: values and gradients must be bit-identical.

use burn::backend::{Autodiff, Flex};
use burn::tensor::activation::{gelu, log_softmax, relu, sigmoid, softmax};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::module::conv2d;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{DType, FloatDType, Int, Tensor, TensorData};
use burn_spill::SpillBackend;

type Plain = Autodiff<Flex>;
type Spilled = Autodiff<SpillBackend<Flex>>;

/// A deterministic input in `dtype` (`from_data` converts to the device default, so cast after).
fn input<B: AutodiffBackend>(shape: [usize; 2], offset: f32, dtype: FloatDType) -> Tensor<B, 2> {
    let n = shape[0] * shape[1];
    let values: Vec<f32> = (0..n)
        .map(|i| ((i as f32 * 0.37 + offset).sin()) * 0.9)
        .collect();
    Tensor::<B, 2>::from_data(TensorData::new(values, shape), &Default::default()).cast(dtype)
}

/// A composite program touching matmul, reductions, activations, indexing, masking, conv and
/// layer norm; returns the loss and the gradients of both inputs.
fn program<B: AutodiffBackend>(dtype: FloatDType) -> Vec<TensorData> {
    let device = Default::default();
    let a = input::<B>([6, 8], 0.1, dtype).require_grad();
    let w = input::<B>([8, 8], 1.3, dtype).require_grad();

    let h = a.clone().matmul(w.clone());
    let h = gelu(h) + sigmoid(h_clone(&a)) * 0.5;
    let h = softmax(h, 1) + log_softmax(a.clone(), 1).exp();
    let idx =
        Tensor::<B, 2, Int>::from_data(TensorData::new(vec![0i64, 3, 7, 1, 2, 5], [6, 1]), &device);
    let picked = h.clone().gather(1, idx);
    let mask = h.clone().lower_elem(0.1);
    let masked = h.clone().mask_fill(mask, 0.0);
    let joined = Tensor::cat(vec![masked, picked.repeat_dim(1, 2)], 1);
    let sliced = joined.slice([1..5, 2..9]);
    let image = sliced.reshape([1, 1, 4, 7]);
    let kernel = input::<B>([2, 9], 0.7, dtype).reshape([2, 1, 3, 3]);
    let conv_out = relu(conv2d(
        image,
        kernel,
        None,
        ConvOptions::new([1, 1], [0, 0], [1, 1], 1),
    ));
    // Layer norm over the last axis, written with tensor ops so every dtype stays itself.
    let mean = conv_out.clone().mean_dim(3);
    let centered = conv_out - mean;
    let var = centered.clone().powi_scalar(2).mean_dim(3);
    let normed = centered / (var + 1e-5).sqrt();
    let loss = normed.powi_scalar(2).mean() + w.clone().abs().sum() * 0.01;

    let grads = loss.backward();
    vec![
        loss.into_data(),
        a.grad(&grads).expect("grad of a").into_data(),
        w.grad(&grads).expect("grad of w").into_data(),
    ]
}

fn h_clone<B: AutodiffBackend>(a: &Tensor<B, 2>) -> Tensor<B, 2> {
    // (`pad` would build its fill in the default dtype, so widen with a slice of `a` instead.)
    let square = a.clone().matmul(a.clone().transpose());
    Tensor::cat(vec![square, a.clone().slice([0..6, 0..2])], 1)
}

fn check(dtype: FloatDType) {
    let plain = program::<Plain>(dtype);
    let spilled = program::<Spilled>(dtype);
    assert_eq!(
        plain[1].dtype,
        DType::from(dtype),
        "the gradient should stay in {dtype:?}"
    );
    for (i, (p, s)) in plain.iter().zip(&spilled).enumerate() {
        assert_eq!(p.dtype, s.dtype, "{dtype:?} output {i}: dtype");
        assert_eq!(p.shape, s.shape, "{dtype:?} output {i}: shape");
        assert_eq!(p.as_bytes(), s.as_bytes(), "{dtype:?} output {i}: values");
    }
}

#[test]
fn forward_and_backward_match_in_f32_f16_bf16() {
    check(FloatDType::F32);
    check(FloatDType::F16);
    check(FloatDType::BF16);
}
