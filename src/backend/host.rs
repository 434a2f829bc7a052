//! The host tier's buffers: a tensor's bytes with their dtype and shape, owned by burn-spill.

use burn_backend::{Backend, DType, Shape, TensorData};
use burn_std::{AllocationProperty, Bytes};

use super::tensor::Primitive;

/// One spilled tensor in host memory. The dtype travels with the bytes, so restoring never
/// casts. Boxed, so that the residency state of every handle stays as small as the primitive.
pub(crate) struct HostTensor(Box<TensorData>);

impl HostTensor {
    /// A zeroed buffer of `len` bytes for a tensor of `shape` and `dtype`, for a spill record to
    /// be read into. It is allocated with the widest alignment that divides `len` (so at least
    /// the dtype's), which is what backends reinterpret the bytes with; zeroed memory comes
    /// from the allocator's zero pages, so it costs no pass over the bytes.
    pub(crate) fn zeroed(len: usize, shape: Shape, dtype: DType) -> Self {
        let bytes = if len.is_multiple_of(16) {
            Bytes::from_elems(vec![0u128; len / 16])
        } else if len.is_multiple_of(8) {
            Bytes::from_elems(vec![0u64; len / 8])
        } else if len.is_multiple_of(4) {
            Bytes::from_elems(vec![0u32; len / 4])
        } else if len.is_multiple_of(2) {
            Bytes::from_elems(vec![0u16; len / 2])
        } else {
            Bytes::from_elems(vec![0u8; len])
        };
        Self(Box::new(TensorData::from_bytes(bytes, shape, dtype)))
    }

    pub(crate) fn into_data(self) -> TensorData {
        *self.0
    }
}

impl AsRef<[u8]> for HostTensor {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl AsMut<[u8]> for HostTensor {
    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.0.bytes
    }
}

/// One copy of `src` into a fresh allocation at the widest alignment `Bytes` uses.
/// (`TensorData::from_bytes_vec` would copy twice: a `Vec<u8>` is only byte-aligned, so it
/// realigns.)
fn aligned_copy(src: &[u8]) -> Bytes {
    let mut bytes = Bytes::from_elems(Vec::<u8>::new());
    bytes.extend_from_byte_slice(src);
    bytes
}

/// Reads a device primitive into a host buffer of our own, leaving the primitive as it is.
///
/// The read may land in the backend's staging memory (CubeCL reads into a per-stream pinned pool
/// that never shrinks), so anything not allocated by Rust's own allocator is copied out and the
/// staging buffer released at once. Flex tensors are copied straight out of their buffer.
pub(crate) fn read_to_host<B: Backend>(
    primitive: &Primitive<B>,
    dtype: DType,
    shape: &Shape,
) -> Result<HostTensor, String> {
    if let Some(data) = copy_flex(primitive, dtype, shape) {
        return Ok(HostTensor(Box::new(data)));
    }
    let read = match primitive.clone() {
        Primitive::Float(p) => burn_std::future::block_on(B::float_into_data(p)),
        Primitive::Int(p) => burn_std::future::block_on(B::int_into_data(p)),
        Primitive::Bool(p) => burn_std::future::block_on(B::bool_into_data(p)),
        Primitive::Quantized(p) => burn_std::future::block_on(B::q_into_data(p)),
    };
    let mut data = read.map_err(|e| format!("{e:?}"))?;
    if data.dtype != dtype || data.shape != *shape {
        return Err(format!(
            "the backend read it as {:?} {:?}, not its own {dtype:?} {:?}",
            data.dtype, data.shape, shape
        ));
    }
    if data.bytes.property() != AllocationProperty::Native {
        data.bytes = aligned_copy(data.as_bytes());
    }
    Ok(HostTensor(Box::new(data)))
}

/// Flex's `into_data` of a tensor whose buffer is shared (as it is while the handle keeps its
/// primitive) copies twice; a contiguous Flex tensor's bytes are read here with one copy. The
/// result is what `into_data` returns: the contiguous bytes, the shape and the dtype.
fn copy_flex<B: Backend>(
    primitive: &Primitive<B>,
    dtype: DType,
    shape: &Shape,
) -> Option<TensorData> {
    #[cfg(feature = "flex")]
    {
        use std::any::Any;
        let any: &dyn Any = match primitive {
            Primitive::Float(p) => p,
            Primitive::Int(p) => p,
            Primitive::Bool(p) => p,
            Primitive::Quantized(_) => return None,
        };
        let tensor = any.downcast_ref::<burn_flex::FlexTensor>()?;
        if !tensor.is_contiguous() || tensor.dtype() != dtype {
            return None;
        }
        let size = dtype.size();
        let start = tensor.layout().start_offset() * size;
        let len = shape.num_elements() * size;
        let bytes = tensor.bytes().get(start..start + len)?;
        Some(TensorData::from_bytes(
            aligned_copy(bytes),
            shape.clone(),
            dtype,
        ))
    }
    #[cfg(not(feature = "flex"))]
    {
        let _ = (primitive, dtype, shape);
        None
    }
}
