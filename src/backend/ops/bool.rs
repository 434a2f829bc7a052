//! Bool tensor ops: forwarded to `B`, except the metadata, read and `argwhere` methods written by hand.

use burn_backend::ops::*;
use burn_backend::{Backend, ExecutionError, Scalar, TensorData};
use burn_std::{BoolDType, FloatDType, IntDType, Shape, Slice};
use std::future::Future;

use crate::SpillTensor;

use crate::SpillBackend;
use crate::backend::forward::forward_ops;

impl<B: Backend> BoolTensorOps<Self> for SpillBackend<B> {
    forward_ops! { BoolTensorOps;
        fn bool_empty(shape: {Shape}, device: {&B::Device}, dtype: {BoolDType}) -> Bool;
        fn bool_zeros(shape: {Shape}, device: {&B::Device}, dtype: {BoolDType}) -> Bool;
        fn bool_ones(shape: {Shape}, device: {&B::Device}, dtype: {BoolDType}) -> Bool;
        fn bool_from_data(data: {TensorData}, device: {&B::Device}) -> Bool;
        fn bool_into_int(tensor: Bool, out_dtype: {IntDType}) -> Int;
        fn bool_into_float(tensor: Bool, out_dtype: {FloatDType}) -> Float;
        fn bool_to_device(tensor: Bool, device: {&B::Device}) -> Bool;
        fn bool_reshape(tensor: Bool, shape: {Shape}) -> Bool;
        fn bool_slice(tensor: Bool, slices: {&[Slice]}) -> Bool;
        fn bool_slice_assign(tensor: Bool, slices: {&[Slice]}, value: Bool) -> Bool;
        fn bool_mask_where(tensor: Bool, mask: Bool, value: Bool) -> Bool;
        fn bool_mask_fill(tensor: Bool, mask: Bool, value: {Scalar}) -> Bool;
        fn bool_gather(dim: {usize}, tensor: Bool, indices: Int) -> Bool;
        fn bool_scatter_or(dim: {usize}, tensor: Bool, indices: Int, value: Bool) -> Bool;
        fn bool_select(tensor: Bool, dim: {usize}, indices: Int) -> Bool;
        fn bool_select_or(tensor: Bool, dim: {usize}, indices: Int, value: Bool) -> Bool;
        fn bool_repeat_dim(tensor: Bool, dim: {usize}, times: {usize}) -> Bool;
        fn bool_cat(tensors: VecBool, dim: {usize}) -> Bool;
        fn bool_equal(lhs: Bool, rhs: Bool) -> Bool;
        fn bool_not_equal(lhs: Bool, rhs: Bool) -> Bool;
        fn bool_equal_elem(lhs: Bool, rhs: {Scalar}) -> Bool;
        fn bool_not_equal_elem(lhs: Bool, rhs: {Scalar}) -> Bool;
        fn bool_not(tensor: Bool) -> Bool;
        fn bool_and(lhs: Bool, rhs: Bool) -> Bool;
        fn bool_or(lhs: Bool, rhs: Bool) -> Bool;
        fn bool_xor(lhs: Bool, rhs: Bool) -> Bool;
        fn bool_transpose(tensor: Bool) -> Bool;
        fn bool_swap_dims(tensor: Bool, dim1: {usize}, dim2: {usize}) -> Bool;
        fn bool_permute(tensor: Bool, axes: {&[usize]}) -> Bool;
        fn bool_flip(tensor: Bool, axes: {&[usize]}) -> Bool;
        fn bool_any(tensor: Bool) -> Bool;
        fn bool_any_dim(tensor: Bool, dim: {usize}) -> Bool;
        fn bool_all(tensor: Bool) -> Bool;
        fn bool_all_dim(tensor: Bool, dim: {usize}) -> Bool;
        fn bool_expand(tensor: Bool, shape: {Shape}) -> Bool;
        fn bool_unfold(tensor: Bool, dim: {usize}, size: {usize}, step: {usize}) -> Bool;
    }

    fn bool_device(tensor: &SpillTensor<B>) -> B::Device {
        tensor.device()
    }

    fn bool_into_data(
        tensor: SpillTensor<B>,
    ) -> impl Future<Output = Result<TensorData, ExecutionError>> + Send {
        tensor.read_ordered(SpillTensor::into_bool, B::bool_into_data)
    }

    fn bool_argwhere(
        tensor: SpillTensor<B>,
        out_dtype: IntDType,
    ) -> impl Future<Output = SpillTensor<B>> + 'static + Send {
        let indices = B::bool_argwhere(tensor.into_bool(), out_dtype);
        async move { SpillTensor::from_int(indices.await) }
    }
}
