//! Float tensor ops: forwarded to `B`, except the metadata and read methods written by hand.

use burn_backend::ops::*;
use burn_backend::tensor::IndexingUpdateOp;
use burn_backend::{Backend, Distribution, ExecutionError, Scalar, TensorData};
use burn_std::{BoolDType, FloatDType, IntDType, Shape, Slice};
use std::future::Future;

use crate::SpillTensor;
use crate::backend::tensor::Primitive;

use crate::SpillBackend;
use crate::backend::forward::forward_ops;

impl<B: Backend> FloatTensorOps<Self> for SpillBackend<B> {
    forward_ops! { FloatTensorOps;
        fn float_from_data(data: {TensorData}, device: {&B::Device}) -> Float;
        fn float_random(shape: {Shape}, distribution: {Distribution}, device: {&B::Device}, dtype: {FloatDType}) -> Float;
        fn float_zeros(shape: {Shape}, device: {&B::Device}, dtype: {FloatDType}) -> Float;
        fn float_ones(shape: {Shape}, device: {&B::Device}, dtype: {FloatDType}) -> Float;
        fn float_full(shape: {Shape}, fill_value: {Scalar}, device: {&B::Device}, dtype: {FloatDType}) -> Float;
        fn float_to_device(tensor: Float, device: {&B::Device}) -> Float;
        fn float_into_int(tensor: Float, out_dtype: {IntDType}) -> Int;
        fn float_empty(shape: {Shape}, device: {&B::Device}, dtype: {FloatDType}) -> Float;
        fn float_repeat_dim(tensor: Float, dim: {usize}, times: {usize}) -> Float;
        #[recompute]
        fn float_add(lhs: Float, rhs: Float) -> Float;
        #[recompute]
        fn float_add_scalar(lhs: Float, rhs: {Scalar}) -> Float;
        #[recompute]
        fn float_clamp_min(tensor: Float, min: {Scalar}) -> Float;
        #[recompute]
        fn float_clamp_max(tensor: Float, max: {Scalar}) -> Float;
        #[recompute]
        fn float_clamp(tensor: Float, min: {Scalar}, max: {Scalar}) -> Float;
        #[recompute]
        fn float_sub(lhs: Float, rhs: Float) -> Float;
        #[recompute]
        fn float_sub_scalar(lhs: Float, rhs: {Scalar}) -> Float;
        #[recompute]
        fn float_mul(lhs: Float, rhs: Float) -> Float;
        #[recompute]
        fn float_mul_scalar(lhs: Float, rhs: {Scalar}) -> Float;
        #[recompute]
        fn float_div(lhs: Float, rhs: Float) -> Float;
        #[recompute]
        fn float_div_scalar(lhs: Float, rhs: {Scalar}) -> Float;
        fn float_remainder(lhs: Float, rhs: Float) -> Float;
        fn float_remainder_scalar(lhs: Float, rhs: {Scalar}) -> Float;
        fn float_matmul(lhs: Float, rhs: Float) -> Float;
        fn float_cross(lhs: Float, rhs: Float, dim: {usize}) -> Float;
        #[recompute]
        fn float_neg(tensor: Float) -> Float;
        #[recompute]
        fn float_recip(tensor: Float) -> Float;
        fn float_transpose(tensor: Float) -> Float;
        fn float_swap_dims(tensor: Float, dim1: {usize}, dim2: {usize}) -> Float;
        fn float_permute(tensor: Float, axes: {&[usize]}) -> Float;
        fn float_flip(tensor: Float, axes: {&[usize]}) -> Float;
        fn float_reshape(tensor: Float, shape: {Shape}) -> Float;
        fn float_gather(dim: {usize}, tensor: Float, indices: Int) -> Float;
        fn float_scatter_add(dim: {usize}, tensor: Float, indices: Int, value: Float) -> Float;
        fn float_scatter_nd(data: Float, indices: Int, values: Float, reduction: {IndexingUpdateOp}) -> Float;
        fn float_gather_nd(data: Float, indices: Int) -> Float;
        fn float_select(tensor: Float, dim: {usize}, indices: Int) -> Float;
        fn float_select_add(tensor: Float, dim: {usize}, indices: Int, value: Float) -> Float;
        fn float_slice(tensor: Float, slices: {&[Slice]}) -> Float;
        fn float_slice_assign(tensor: Float, slices: {&[Slice]}, value: Float) -> Float;
        #[recompute]
        fn float_mask_where(tensor: Float, mask: Bool, value: Float) -> Float;
        #[recompute]
        fn float_mask_fill(tensor: Float, mask: Bool, value: {Scalar}) -> Float;
        fn float_equal(lhs: Float, rhs: Float, out_dtype: {BoolDType}) -> Bool;
        fn float_not_equal(lhs: Float, rhs: Float, out_dtype: {BoolDType}) -> Bool;
        fn float_equal_elem(lhs: Float, rhs: {Scalar}, out_dtype: {BoolDType}) -> Bool;
        fn float_not_equal_elem(lhs: Float, rhs: {Scalar}, out_dtype: {BoolDType}) -> Bool;
        fn float_greater(lhs: Float, rhs: Float, out_dtype: {BoolDType}) -> Bool;
        fn float_greater_elem(lhs: Float, rhs: {Scalar}, out_dtype: {BoolDType}) -> Bool;
        fn float_greater_equal(lhs: Float, rhs: Float, out_dtype: {BoolDType}) -> Bool;
        fn float_greater_equal_elem(lhs: Float, rhs: {Scalar}, out_dtype: {BoolDType}) -> Bool;
        fn float_lower(lhs: Float, rhs: Float, out_dtype: {BoolDType}) -> Bool;
        fn float_lower_elem(lhs: Float, rhs: {Scalar}, out_dtype: {BoolDType}) -> Bool;
        fn float_lower_equal(lhs: Float, rhs: Float, out_dtype: {BoolDType}) -> Bool;
        fn float_lower_equal_elem(lhs: Float, rhs: {Scalar}, out_dtype: {BoolDType}) -> Bool;
        fn float_detach(tensor: Float) -> Float;
        fn float_set_require_grad(tensor: Float, require_grad: {bool}) -> Float;
        fn float_sum(tensor: Float) -> Float;
        fn float_sum_dim(tensor: Float, dim: {usize}) -> Float;
        fn float_prod(tensor: Float) -> Float;
        fn float_prod_dim(tensor: Float, dim: {usize}) -> Float;
        fn float_mean(tensor: Float) -> Float;
        fn float_mean_dim(tensor: Float, dim: {usize}) -> Float;
        fn float_cumsum(tensor: Float, dim: {usize}) -> Float;
        fn float_cumprod(tensor: Float, dim: {usize}) -> Float;
        fn float_cummin(tensor: Float, dim: {usize}) -> Float;
        fn float_cummax(tensor: Float, dim: {usize}) -> Float;
        #[recompute]
        fn float_cast(tensor: Float, dtype: {FloatDType}) -> Float;
        #[recompute]
        fn float_exp(tensor: Float) -> Float;
        #[recompute]
        fn float_log(tensor: Float) -> Float;
        #[recompute]
        fn float_log1p(tensor: Float) -> Float;
        fn float_powf(lhs: Float, rhs: Float) -> Float;
        fn float_powi(lhs: Float, rhs: Int) -> Float;
        fn float_powi_scalar(lhs: Float, rhs: {Scalar}) -> Float;
        fn float_powi_scalar_impl(lhs: Float, rhs: {Scalar}) -> Float;
        #[recompute]
        fn float_powf_scalar(tensor: Float, value: {Scalar}) -> Float;
        fn float_powf_scalar_impl(tensor: Float, value: {Scalar}) -> Float;
        #[recompute]
        fn float_sqrt(tensor: Float) -> Float;
        #[recompute]
        fn float_abs(tensor: Float) -> Float;
        #[recompute]
        fn float_cos(tensor: Float) -> Float;
        #[recompute]
        fn float_sin(tensor: Float) -> Float;
        fn float_tan(tensor: Float) -> Float;
        fn float_cosh(tensor: Float) -> Float;
        fn float_sinh(tensor: Float) -> Float;
        #[recompute]
        fn float_tanh(tensor: Float) -> Float;
        fn float_acos(tensor: Float) -> Float;
        fn float_acosh(tensor: Float) -> Float;
        fn float_asin(tensor: Float) -> Float;
        fn float_asinh(tensor: Float) -> Float;
        fn float_atan(tensor: Float) -> Float;
        fn float_atanh(tensor: Float) -> Float;
        fn float_atan2(lhs: Float, rhs: Float) -> Float;
        fn float_round(tensor: Float) -> Float;
        fn float_floor(tensor: Float) -> Float;
        fn float_ceil(tensor: Float) -> Float;
        fn float_trunc(tensor: Float) -> Float;
        #[recompute]
        fn float_erf(tensor: Float) -> Float;
        fn float_cat(tensors: VecFloat, dim: {usize}) -> Float;
        fn float_argmax(tensor: Float, dim: {usize}, out_dtype: {IntDType}) -> Int;
        fn float_argtopk(tensor: Float, dim: {usize}, k: {usize}, out_dtype: {IntDType}) -> Int;
        fn float_topk(tensor: Float, dim: {usize}, k: {usize}) -> Float;
        fn float_argmin(tensor: Float, dim: {usize}, out_dtype: {IntDType}) -> Int;
        fn float_max(tensor: Float) -> Float;
        fn float_max_dim(tensor: Float, dim: {usize}) -> Float;
        fn float_max_dim_with_indices(tensor: Float, dim: {usize}, indices_dtype: {IntDType}) -> (Float, Int);
        fn float_min(tensor: Float) -> Float;
        fn float_min_dim(tensor: Float, dim: {usize}) -> Float;
        fn float_min_dim_with_indices(tensor: Float, dim: {usize}, indices_dtype: {IntDType}) -> (Float, Int);
        fn float_max_abs(tensor: Float) -> Float;
        fn float_max_abs_dim(tensor: Float, dim: {usize}) -> Float;
        fn float_any(tensor: Float, out_dtype: {BoolDType}) -> Bool;
        fn float_any_dim(tensor: Float, dim: {usize}, out_dtype: {BoolDType}) -> Bool;
        fn float_all(tensor: Float, out_dtype: {BoolDType}) -> Bool;
        fn float_all_dim(tensor: Float, dim: {usize}, out_dtype: {BoolDType}) -> Bool;
        fn float_sign(tensor: Float) -> Float;
        fn float_expand(tensor: Float, shape: {Shape}) -> Float;
        fn float_sort(tensor: Float, dim: {usize}, descending: {bool}) -> Float;
        fn float_sort_with_indices(tensor: Float, dim: {usize}, descending: {bool}, indices_dtype: {IntDType}) -> (Float, Int);
        fn float_argsort(tensor: Float, dim: {usize}, descending: {bool}, out_dtype: {IntDType}) -> Int;
        fn float_grid_sample_2d(tensor: Float, grid: Float, options: {GridSampleOptions}) -> Float;
        fn float_unfold(tensor: Float, dim: {usize}, size: {usize}, step: {usize}) -> Float;
        fn float_is_nan(tensor: Float, out_dtype: {BoolDType}) -> Bool;
        fn float_is_inf(tensor: Float, out_dtype: {BoolDType}) -> Bool;
    }

    fn float_device(tensor: &SpillTensor<B>) -> B::Device {
        tensor.device()
    }

    fn float_is_require_grad(tensor: &SpillTensor<B>) -> bool {
        tensor.with_primitive(|p| match p {
            Primitive::Float(p) => B::float_is_require_grad(p),
            _ => false,
        })
    }

    fn float_into_data(
        tensor: SpillTensor<B>,
    ) -> impl Future<Output = Result<TensorData, ExecutionError>> + Send {
        tensor.read_ordered(SpillTensor::into_float, B::float_into_data)
    }
}
