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
//! Backends whose layout cannot be read from here (everything but Flex for now) are treated as
//! contiguous.

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
            return tensor.is_contiguous();
        }
        if let Some(q) = any.downcast_ref::<burn_flex::FlexQTensor>() {
            return q.tensor().is_contiguous();
        }
    }
    #[cfg(not(feature = "flex"))]
    let _ = primitive;
    true
}
