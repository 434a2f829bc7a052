//! Whether a primitive comes back from the host in the very layout it left in.
//!
//! Burn's `TensorData` is always contiguous, so a strided view (a transpose, a permuted or
//! flipped tensor) spilled and restored returns contiguous. Its values are the same, but the
//! inner backend's kernels may take another path on another layout (a matmul reading a
//! transposed operand accumulates in another order), and results would drift by an ulp from
//! the plain backend's. So strided views of backends whose layout can be read stay on the
//! device; they usually share their buffer with the tensor they view anyway, so evicting them
//! would free little.
//!
//! Flex tensors and unfused CubeCL tensors (wgpu, CUDA) have readable strides. Backends whose
//! layout cannot be read from here are treated as contiguous; for fused CubeCL tensors, whose
//! layout Fusion decides lazily, `tests/cubecl.rs` shows that a spilled and restored transposed
//! view gives bit-identical results downstream.
//!
//! Unevictable tensors are counted in `SpillStats::unevictable_device_bytes`.

use burn_backend::Backend;

use super::tensor::Primitive;

/// True when host round trips keep the primitive's layout (so it may be evicted).
pub(crate) fn round_trips_exactly<B: Backend>(primitive: &Primitive<B>) -> bool {
    #[cfg(feature = "flex")]
    {
        use std::any::Any;
        let any: &dyn Any = match primitive {
            Primitive::Float(p) => p,
            Primitive::Int(p) => p,
            Primitive::Bool(p) => p,
            Primitive::Quantized(p) => p,
        };
        if let Some(tensor) = any.downcast_ref::<burn_flex::FlexTensor>() {
            return tensor.is_contiguous() && flex_can_read(tensor);
        }
        if let Some(q) = any.downcast_ref::<burn_flex::FlexQTensor>() {
            return q.tensor().is_contiguous();
        }
    }
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    {
        let any: &dyn std::any::Any = match primitive {
            Primitive::Float(p) => p,
            Primitive::Int(p) => p,
            Primitive::Bool(p) => p,
            Primitive::Quantized(p) => p,
        };
        if let Some(contiguous) = super::cubecl::is_contiguous(any) {
            return contiguous;
        }
    }
    let _ = primitive;
    true
}

/// Flex reads a tensor that fills its whole buffer by handing the buffer over, but copies one
/// that starts inside it, and that copy rejects Flex32 and `Bool(U32)`. Such a view must stay
/// where it is, so that reading it fails exactly as on plain Flex instead of succeeding from
/// our own copy.
#[cfg(feature = "flex")]
fn flex_can_read(tensor: &burn_flex::FlexTensor) -> bool {
    use burn_backend::DType;
    use burn_std::BoolStore;
    let dtype = tensor.dtype();
    // The dtype first: it settles almost every tensor without reading the buffer.
    !matches!(dtype, DType::Flex32 | DType::Bool(BoolStore::U32))
        || (tensor.layout().start_offset() == 0
            && tensor.bytes().len() == tensor.layout().num_elements() * dtype.size())
}
