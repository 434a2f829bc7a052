//! Activation ops: all forwarded so `B`'s fused kernels run instead of the decomposed defaults.

use burn_backend::ops::*;
use burn_backend::{Backend, Scalar};

use crate::SpillBackend;
use crate::backend::forward::forward_ops;

impl<B: Backend> ActivationOps<Self> for SpillBackend<B> {
    forward_ops! { ActivationOps;
        #[recompute]
        fn leaky_relu(tensor: Float, negative_slope: {Scalar}) -> Float;
        #[recompute]
        fn relu(tensor: Float) -> Float;
        fn relu_backward(output: Float, grad: Float) -> Float;
        #[recompute]
        fn gelu(tensor: Float) -> Float;
        fn prelu(tensor: Float, alpha: Float) -> Float;
        fn gelu_backward(x: Float, grad: Float) -> Float;
        #[recompute]
        fn sigmoid(tensor: Float) -> Float;
        fn sigmoid_backward(output: Float, grad: Float) -> Float;
        fn hard_sigmoid(tensor: Float, alpha: {Scalar}, beta: {Scalar}) -> Float;
        fn log_sigmoid(tensor: Float) -> Float;
        fn softmax(tensor: Float, dim: {usize}) -> Float;
        fn log_softmax(tensor: Float, dim: {usize}) -> Float;
        fn softmin(tensor: Float, dim: {usize}) -> Float;
        fn log_sigmoid_backward(x: Float, grad: Float) -> Float;
    }
}
