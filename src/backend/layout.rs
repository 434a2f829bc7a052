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
//! Flex also picks a kernel's path by where a tensor sits in its buffer: a unary op on a view
//! that starts at offset 0 and fills its buffer keeps the view's strides, one on a view inside a
//! larger buffer writes a contiguous output. A contiguous slice inside its source's buffer comes
//! back as a buffer of its own, so a transpose of it, negated, would keep transposed strides
//! where plain Flex's result is contiguous, and a matmul reading that accumulates in another
//! order. So a Flex tensor leaves the device only when it is contiguous and fills its buffer
//! from the start (`tests/tiers_layout.rs`).
//!
//! Flex tensors and unfused CubeCL tensors (wgpu, CUDA) have readable strides. A CubeCL slice
//! is a handle onto its own bytes of the buffer, not an offset the kernels read, so only its
//! strides matter. Backends whose layout cannot be read from here are treated as contiguous;
//! for fused CubeCL tensors, whose layout Fusion decides lazily, `tests/cubecl.rs` shows that a
//! spilled and restored transposed view gives bit-identical results downstream.
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
            return tensor.is_contiguous() && fills_its_buffer(tensor);
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

/// Whether a Flex tensor starts at the beginning of its buffer and covers all of it: the
/// layout a restored tensor has. Flex's kernels take other paths on a view inside a larger
/// buffer, and copy it on a read (a copy that rejects Flex32 and `Bool(U32)`, so such a view
/// must fail to read exactly as on plain Flex instead of succeeding from our own copy).
#[cfg(feature = "flex")]
fn fills_its_buffer(tensor: &burn_flex::FlexTensor) -> bool {
    tensor.layout().start_offset() == 0
        && tensor.bytes().len() == tensor.layout().num_elements() * tensor.dtype().size()
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use burn_backend::TensorData;
    use burn_backend::ops::FloatTensorOps;
    use burn_flex::Flex;

    use super::*;

    fn float(tensor: burn_flex::FlexTensor) -> Primitive<Flex> {
        Primitive::Float(tensor)
    }

    #[test]
    fn a_flex_tensor_leaves_the_device_only_contiguous_and_filling_its_buffer() {
        let device = Default::default();
        let values: Vec<f32> = (0..24).map(|v| v as f32).collect();
        let whole = Flex::float_from_data(TensorData::new(values, [2, 3, 4]), &device);
        assert!(round_trips_exactly(&float(whole.clone())), "a whole buffer");
        let transposed = Flex::float_swap_dims(whole.clone(), 1, 2);
        assert!(!round_trips_exactly(&float(transposed)), "strided");
        let second = Flex::float_slice(whole.clone(), &[(1..2).into()]);
        assert!(second.is_contiguous());
        assert!(
            !round_trips_exactly(&float(second)),
            "contiguous, but it starts inside the buffer"
        );
        let first = Flex::float_slice(whole, &[(0..1).into()]);
        assert!(
            !round_trips_exactly(&float(first)),
            "contiguous from the start, but the buffer goes on"
        );
    }
}
