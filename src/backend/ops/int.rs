//! Int tensor ops: forwarded to `B`, except the metadata and read methods written by hand.

use burn_backend::ops::*;
use burn_backend::tensor::IndexingUpdateOp;
use burn_backend::{Backend, Distribution, ExecutionError, Scalar, TensorData};
use burn_std::{BoolDType, FloatDType, IntDType, Shape, Slice};
use std::future::Future;
use std::ops::Range;

use crate::SpillTensor;

use crate::SpillBackend;
use crate::backend::forward::forward_ops;

impl<B: Backend> IntTensorOps<Self> for SpillBackend<B> {
    forward_ops! { IntTensorOps;
        fn int_empty(shape: {Shape}, device: {&B::Device}, dtype: {IntDType}) -> Int;
        fn int_from_data(data: {TensorData}, device: {&B::Device}) -> Int;
        fn int_to_device(tensor: Int, device: {&B::Device}) -> Int;
        fn int_reshape(tensor: Int, shape: {Shape}) -> Int;
        fn int_slice(tensor: Int, slices: {&[Slice]}) -> Int;
        fn int_slice_assign(tensor: Int, slices: {&[Slice]}, value: Int) -> Int;
        fn int_into_float(tensor: Int, out_dtype: {FloatDType}) -> Float;
        fn int_mask_where(tensor: Int, mask: Bool, value: Int) -> Int;
        fn int_mask_fill(tensor: Int, mask: Bool, value: {Scalar}) -> Int;
        fn int_gather(dim: {usize}, tensor: Int, indices: Int) -> Int;
        fn int_scatter_add(dim: {usize}, tensor: Int, indices: Int, value: Int) -> Int;
        fn int_scatter_nd(data: Int, indices: Int, values: Int, reduction: {IndexingUpdateOp}) -> Int;
        fn int_gather_nd(data: Int, indices: Int) -> Int;
        fn int_select(tensor: Int, dim: {usize}, indices: Int) -> Int;
        fn int_select_add(tensor: Int, dim: {usize}, indices: Int, value: Int) -> Int;
        fn int_repeat_dim(tensor: Int, dim: {usize}, times: {usize}) -> Int;
        fn int_cat(tensors: VecInt, dim: {usize}) -> Int;
        fn int_equal(lhs: Int, rhs: Int, out_dtype: {BoolDType}) -> Bool;
        fn int_not_equal(lhs: Int, rhs: Int, out_dtype: {BoolDType}) -> Bool;
        fn int_equal_elem(lhs: Int, rhs: {Scalar}, out_dtype: {BoolDType}) -> Bool;
        fn int_not_equal_elem(lhs: Int, rhs: {Scalar}, out_dtype: {BoolDType}) -> Bool;
        fn int_greater(lhs: Int, rhs: Int, out_dtype: {BoolDType}) -> Bool;
        fn int_greater_elem(lhs: Int, rhs: {Scalar}, out_dtype: {BoolDType}) -> Bool;
        fn int_greater_equal(lhs: Int, rhs: Int, out_dtype: {BoolDType}) -> Bool;
        fn int_greater_equal_elem(lhs: Int, rhs: {Scalar}, out_dtype: {BoolDType}) -> Bool;
        fn int_lower(lhs: Int, rhs: Int, out_dtype: {BoolDType}) -> Bool;
        fn int_lower_elem(lhs: Int, rhs: {Scalar}, out_dtype: {BoolDType}) -> Bool;
        fn int_lower_equal(lhs: Int, rhs: Int, out_dtype: {BoolDType}) -> Bool;
        fn int_lower_equal_elem(lhs: Int, rhs: {Scalar}, out_dtype: {BoolDType}) -> Bool;
        fn int_add(lhs: Int, rhs: Int) -> Int;
        fn int_add_scalar(lhs: Int, rhs: {Scalar}) -> Int;
        fn int_powi(lhs: Int, rhs: Int) -> Int;
        fn int_powi_scalar(lhs: Int, rhs: {Scalar}) -> Int;
        fn int_powi_scalar_impl(lhs: Int, rhs: {Scalar}) -> Int;
        fn int_clamp_min(tensor: Int, min: {Scalar}) -> Int;
        fn int_clamp_max(tensor: Int, max: {Scalar}) -> Int;
        fn int_clamp(tensor: Int, min: {Scalar}, max: {Scalar}) -> Int;
        fn int_sub(lhs: Int, rhs: Int) -> Int;
        fn int_sub_scalar(lhs: Int, rhs: {Scalar}) -> Int;
        fn int_mul(lhs: Int, rhs: Int) -> Int;
        fn int_mul_scalar(lhs: Int, rhs: {Scalar}) -> Int;
        fn int_div(lhs: Int, rhs: Int) -> Int;
        fn int_div_scalar(lhs: Int, rhs: {Scalar}) -> Int;
        fn int_remainder(lhs: Int, rhs: Int) -> Int;
        fn int_remainder_scalar(lhs: Int, rhs: {Scalar}) -> Int;
        fn int_matmul(lhs: Int, rhs: Int) -> Int;
        fn int_neg(tensor: Int) -> Int;
        fn int_zeros(shape: {Shape}, device: {&B::Device}, dtype: {IntDType}) -> Int;
        fn int_ones(shape: {Shape}, device: {&B::Device}, dtype: {IntDType}) -> Int;
        fn int_full(shape: {Shape}, fill_value: {Scalar}, device: {&B::Device}, dtype: {IntDType}) -> Int;
        fn int_sum(tensor: Int) -> Int;
        fn int_sum_dim(tensor: Int, dim: {usize}) -> Int;
        fn int_prod(tensor: Int) -> Int;
        fn int_prod_dim(tensor: Int, dim: {usize}) -> Int;
        fn int_mean(tensor: Int) -> Int;
        fn int_mean_dim(tensor: Int, dim: {usize}) -> Int;
        fn int_cumsum(tensor: Int, dim: {usize}) -> Int;
        fn int_cumprod(tensor: Int, dim: {usize}) -> Int;
        fn int_cummin(tensor: Int, dim: {usize}) -> Int;
        fn int_cummax(tensor: Int, dim: {usize}) -> Int;
        fn int_argmax(tensor: Int, dim: {usize}) -> Int;
        fn int_argtopk(tensor: Int, dim: {usize}, k: {usize}) -> Int;
        fn int_topk(tensor: Int, dim: {usize}, k: {usize}) -> Int;
        fn int_argmin(tensor: Int, dim: {usize}) -> Int;
        fn int_max(tensor: Int) -> Int;
        fn int_max_dim(tensor: Int, dim: {usize}) -> Int;
        fn int_max_dim_with_indices(tensor: Int, dim: {usize}) -> (Int, Int);
        fn int_max_abs(tensor: Int) -> Int;
        fn int_max_abs_dim(tensor: Int, dim: {usize}) -> Int;
        fn int_min(tensor: Int) -> Int;
        fn int_min_dim(tensor: Int, dim: {usize}) -> Int;
        fn int_min_dim_with_indices(tensor: Int, dim: {usize}) -> (Int, Int);
        fn int_abs(tensor: Int) -> Int;
        fn int_transpose(tensor: Int) -> Int;
        fn int_swap_dims(tensor: Int, dim1: {usize}, dim2: {usize}) -> Int;
        fn int_permute(tensor: Int, axes: {&[usize]}) -> Int;
        fn int_flip(tensor: Int, axes: {&[usize]}) -> Int;
        fn int_random(shape: {Shape}, distribution: {Distribution}, device: {&B::Device}, dtype: {IntDType}) -> Int;
        fn int_arange_step(range: {Range<i64>}, step: {usize}, device: {&B::Device}, dtype: {IntDType}) -> Int;
        fn int_arange(range: {Range<i64>}, device: {&B::Device}, dtype: {IntDType}) -> Int;
        fn int_any(tensor: Int, out_dtype: {BoolDType}) -> Bool;
        fn int_any_dim(tensor: Int, dim: {usize}, out_dtype: {BoolDType}) -> Bool;
        fn int_all(tensor: Int, out_dtype: {BoolDType}) -> Bool;
        fn int_all_dim(tensor: Int, dim: {usize}, out_dtype: {BoolDType}) -> Bool;
        fn int_sign(tensor: Int) -> Int;
        fn int_expand(tensor: Int, shape: {Shape}) -> Int;
        fn int_sort(tensor: Int, dim: {usize}, descending: {bool}) -> Int;
        fn int_sort_with_indices(tensor: Int, dim: {usize}, descending: {bool}) -> (Int, Int);
        fn int_argsort(tensor: Int, dim: {usize}, descending: {bool}) -> Int;
        fn bitwise_and(lhs: Int, rhs: Int) -> Int;
        fn bitwise_and_scalar(lhs: Int, rhs: {Scalar}) -> Int;
        fn bitwise_or(lhs: Int, rhs: Int) -> Int;
        fn bitwise_or_scalar(lhs: Int, rhs: {Scalar}) -> Int;
        fn bitwise_xor(lhs: Int, rhs: Int) -> Int;
        fn bitwise_xor_scalar(lhs: Int, rhs: {Scalar}) -> Int;
        fn bitwise_not(tensor: Int) -> Int;
        fn bitwise_left_shift(lhs: Int, rhs: Int) -> Int;
        fn bitwise_left_shift_scalar(lhs: Int, rhs: {Scalar}) -> Int;
        fn bitwise_right_shift(lhs: Int, rhs: Int) -> Int;
        fn bitwise_right_shift_scalar(lhs: Int, rhs: {Scalar}) -> Int;
        fn int_cast(tensor: Int, dtype: {IntDType}) -> Int;
        fn int_unfold(tensor: Int, dim: {usize}, size: {usize}, step: {usize}) -> Int;
    }

    fn int_device(tensor: &SpillTensor<B>) -> B::Device {
        tensor.device()
    }

    fn int_into_data(
        tensor: SpillTensor<B>,
    ) -> impl Future<Output = Result<TensorData, ExecutionError>> + Send {
        tensor.read_ordered(SpillTensor::into_int, B::int_into_data)
    }
}
