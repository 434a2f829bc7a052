//! Quantized tensor ops: forwarded to `B`, except the metadata and read methods written by hand.

use burn_backend::ops::*;
use burn_backend::quantization::QuantScheme;
use burn_backend::{Backend, ExecutionError, Scalar, TensorData};
use burn_std::{BoolDType, FloatDType, IntDType, Shape, Slice};
use std::future::Future;

use crate::SpillTensor;
use crate::backend::tensor::Primitive;

use crate::SpillBackend;
use crate::backend::forward::forward_ops;

impl<B: Backend> QTensorOps<Self> for SpillBackend<B> {
    forward_ops! { QTensorOps;
        fn q_from_data(data: {TensorData}, device: {&B::Device}) -> Quant;
        fn quantize(tensor: Float, scheme: {&QuantScheme}, qparams: QParams) -> Quant;
        fn quantize_dynamic(tensor: Float, scheme: {&QuantScheme}) -> Quant;
        fn dequantize(tensor: Quant, dtype: {FloatDType}) -> Float;
        fn q_to_device(tensor: Quant, device: {&B::Device}) -> Quant;
        fn q_reshape(tensor: Quant, shape: {Shape}) -> Quant;
        fn q_detach(tensor: Quant) -> Quant;
        fn q_set_require_grad(tensor: Quant, require_grad: {bool}) -> Quant;
        fn q_expand(tensor: Quant, shape: {Shape}) -> Quant;
        fn q_transpose(tensor: Quant) -> Quant;
        fn q_swap_dims(tensor: Quant, dim1: {usize}, dim2: {usize}) -> Quant;
        fn q_permute(tensor: Quant, axes: {&[usize]}) -> Quant;
        fn q_flip(tensor: Quant, axes: {&[usize]}) -> Quant;
        fn q_select(tensor: Quant, dim: {usize}, indices: Int) -> Quant;
        fn q_slice(tensor: Quant, slices: {&[Slice]}) -> Quant;
        fn q_gather(dim: {usize}, tensor: Quant, indices: Int) -> Quant;
        fn q_repeat_dim(tensor: Quant, dim: {usize}, times: {usize}) -> Quant;
        fn q_add(lhs: Quant, rhs: Quant) -> Prim;
        fn q_add_scalar(lhs: Quant, rhs: {Scalar}) -> Prim;
        fn q_clamp_min(tensor: Quant, min: {Scalar}) -> Prim;
        fn q_clamp_max(tensor: Quant, max: {Scalar}) -> Prim;
        fn q_clamp(tensor: Quant, min: {Scalar}, max: {Scalar}) -> Prim;
        fn q_sub(lhs: Quant, rhs: Quant) -> Prim;
        fn q_sub_scalar(lhs: Quant, rhs: {Scalar}) -> Prim;
        fn q_mul(lhs: Quant, rhs: Quant) -> Prim;
        fn q_mul_scalar(lhs: Quant, rhs: {Scalar}) -> Prim;
        fn q_div(lhs: Quant, rhs: Quant) -> Prim;
        fn q_div_scalar(lhs: Quant, rhs: {Scalar}) -> Prim;
        fn q_matmul(lhs: Prim, rhs: Prim) -> Prim;
        fn q_neg(tensor: Quant) -> Prim;
        fn q_recip(tensor: Quant) -> Prim;
        fn q_sum(tensor: Quant) -> Prim;
        fn q_sum_dim(tensor: Quant, dim: {usize}) -> Prim;
        fn q_prod(tensor: Quant) -> Prim;
        fn q_prod_dim(tensor: Quant, dim: {usize}) -> Prim;
        fn q_mean(tensor: Quant) -> Prim;
        fn q_mean_dim(tensor: Quant, dim: {usize}) -> Prim;
        fn q_cumsum(tensor: Quant, dim: {usize}) -> Prim;
        fn q_cumprod(tensor: Quant, dim: {usize}) -> Prim;
        fn q_cummin(tensor: Quant, dim: {usize}) -> Prim;
        fn q_cummax(tensor: Quant, dim: {usize}) -> Prim;
        fn q_exp(tensor: Quant) -> Prim;
        fn q_log(tensor: Quant) -> Prim;
        fn q_log1p(tensor: Quant) -> Prim;
        fn q_powf(lhs: Quant, rhs: Quant) -> Prim;
        fn q_powi(lhs: Quant, rhs: Int) -> Prim;
        fn q_powi_scalar(lhs: Quant, rhs: {Scalar}) -> Prim;
        fn q_powf_scalar(tensor: Quant, value: {Scalar}) -> Prim;
        fn q_sqrt(tensor: Quant) -> Prim;
        fn q_abs(tensor: Quant) -> Quant;
        fn q_cos(tensor: Quant) -> Prim;
        fn q_sin(tensor: Quant) -> Prim;
        fn q_tan(tensor: Quant) -> Prim;
        fn q_cosh(tensor: Quant) -> Prim;
        fn q_sinh(tensor: Quant) -> Prim;
        fn q_tanh(tensor: Quant) -> Prim;
        fn q_erf(tensor: Quant) -> Prim;
        fn q_cat(tensors: VecQuant, dim: {usize}) -> Quant;
        fn q_argmax(tensor: Quant, dim: {usize}, out_dtype: {IntDType}) -> Int;
        fn q_argtopk(tensor: Quant, dim: {usize}, k: {usize}, out_dtype: {IntDType}) -> Int;
        fn q_topk(tensor: Quant, dim: {usize}, k: {usize}) -> Quant;
        fn q_argmin(tensor: Quant, dim: {usize}, out_dtype: {IntDType}) -> Int;
        fn q_max(tensor: Quant) -> Quant;
        fn q_max_dim(tensor: Quant, dim: {usize}) -> Quant;
        fn q_max_dim_with_indices(tensor: Quant, dim: {usize}, out_dtype: {IntDType}) -> (Quant, Int);
        fn q_min(tensor: Quant) -> Quant;
        fn q_min_dim(tensor: Quant, dim: {usize}) -> Quant;
        fn q_min_dim_with_indices(tensor: Quant, dim: {usize}, out_dtype: {IntDType}) -> (Quant, Int);
        fn q_max_abs(tensor: Quant) -> Quant;
        fn q_max_abs_dim(tensor: Quant, dim: {usize}) -> Quant;
        fn q_any(tensor: Quant, out_dtype: {BoolDType}) -> Bool;
        fn q_any_dim(tensor: Quant, dim: {usize}, out_dtype: {BoolDType}) -> Bool;
        fn q_all(tensor: Quant, out_dtype: {BoolDType}) -> Bool;
        fn q_all_dim(tensor: Quant, dim: {usize}, out_dtype: {BoolDType}) -> Bool;
        fn q_sort(tensor: Quant, dim: {usize}, descending: {bool}) -> Quant;
        fn q_sort_with_indices(tensor: Quant, dim: {usize}, descending: {bool}, out_dtype: {IntDType}) -> (Quant, Int);
        fn q_argsort(tensor: Quant, dim: {usize}, descending: {bool}, out_dtype: {IntDType}) -> Int;
    }

    fn q_device(tensor: &SpillTensor<B>) -> B::Device {
        tensor.device()
    }

    fn q_is_require_grad(tensor: &SpillTensor<B>) -> bool {
        tensor.with_primitive(|p| match p {
            Primitive::Quantized(p) => B::q_is_require_grad(p),
            _ => false,
        })
    }

    fn q_into_data(
        tensor: SpillTensor<B>,
    ) -> impl Future<Output = Result<TensorData, ExecutionError>> + Send {
        tensor.read_ordered(SpillTensor::into_quantized, B::q_into_data)
    }
}
