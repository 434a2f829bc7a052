//! The host tier's buffers: a tensor's bytes with their dtype and shape, owned by burn-spill.

use std::sync::Arc;

use burn_backend::{Backend, DType, Shape, TensorData};
use burn_std::{AllocationProperty, Bytes};

use super::tensor::Primitive;

/// One spilled tensor in host memory. The dtype travels with the bytes, so restoring never
/// casts. Boxed, so that the residency state of every handle stays as small as the primitive.
pub(crate) struct HostTensor(Box<HostBytes>);

enum HostBytes {
    /// A buffer of its own, handed to the backend as it is on restore.
    Own(TensorData),
    /// A slice of a buffer shared by the tensors evicted in one batch.
    Shared {
        batch: Arc<Bytes>,
        start: usize,
        len: usize,
        shape: Shape,
        dtype: DType,
    },
}

/// Slices of one batch buffer start at this alignment, the widest any dtype needs.
const SLICE_ALIGN: usize = 16;

/// Copies the tensors of one batch (their bytes, shape and dtype) into one contiguous, aligned
/// host buffer and returns each one's view of it, in order.
pub(crate) fn pack<'a>(
    parts: impl IntoIterator<Item = (&'a [u8], Shape, DType)>,
) -> Vec<HostTensor> {
    let parts: Vec<_> = parts.into_iter().collect();
    let mut starts = Vec::with_capacity(parts.len());
    let mut total = 0usize;
    for (bytes, _, _) in &parts {
        starts.push(total);
        total = (total + bytes.len()).next_multiple_of(SLICE_ALIGN);
    }
    // Filled by appending (a zeroed buffer would write every byte twice); the gaps that keep
    // each slice aligned are zeros.
    let mut buffer = Bytes::from_elems(Vec::<u128>::with_capacity(total / SLICE_ALIGN));
    const GAP: [u8; SLICE_ALIGN] = [0; SLICE_ALIGN];
    for ((bytes, _, _), &start) in parts.iter().zip(&starts) {
        buffer.extend_from_byte_slice_aligned(&GAP[..start - buffer.len()], SLICE_ALIGN);
        buffer.extend_from_byte_slice_aligned(bytes, SLICE_ALIGN);
    }
    buffer.extend_from_byte_slice_aligned(&GAP[..total - buffer.len()], SLICE_ALIGN);
    let batch = Arc::new(buffer);
    parts
        .into_iter()
        .zip(starts)
        .map(|((bytes, shape, dtype), start)| {
            HostTensor(Box::new(HostBytes::Shared {
                batch: batch.clone(),
                start,
                len: bytes.len(),
                shape,
                dtype,
            }))
        })
        .collect()
}

impl HostTensor {
    fn own(data: TensorData) -> Self {
        Self(Box::new(HostBytes::Own(data)))
    }

    /// `len` zero bytes at the widest alignment that divides `len` (see [`zeroed`](Self::zeroed)).
    fn zeroed_bytes(len: usize) -> Bytes {
        if len.is_multiple_of(16) {
            Bytes::from_elems(vec![0u128; len / 16])
        } else if len.is_multiple_of(8) {
            Bytes::from_elems(vec![0u64; len / 8])
        } else if len.is_multiple_of(4) {
            Bytes::from_elems(vec![0u32; len / 4])
        } else if len.is_multiple_of(2) {
            Bytes::from_elems(vec![0u16; len / 2])
        } else {
            Bytes::from_elems(vec![0u8; len])
        }
    }

    /// A zeroed buffer of `len` bytes for a tensor of `shape` and `dtype`, for a spill record to
    /// be read into. It is allocated with the widest alignment that divides `len` (so at least
    /// the dtype's), which is what backends reinterpret the bytes with; zeroed memory comes
    /// from the allocator's zero pages, so it costs no pass over the bytes.
    pub(crate) fn zeroed(len: usize, shape: Shape, dtype: DType) -> Self {
        Self::own(TensorData::from_bytes(
            Self::zeroed_bytes(len),
            shape,
            dtype,
        ))
    }

    /// The tensor's data: its own buffer as it is, or its slice of a batch copied out (into an
    /// aligned buffer of its own).
    pub(crate) fn into_data(self) -> TensorData {
        match *self.0 {
            HostBytes::Own(data) => data,
            HostBytes::Shared {
                batch,
                start,
                len,
                shape,
                dtype,
            } => TensorData::from_bytes(aligned_copy(&batch[start..start + len]), shape, dtype),
        }
    }
}

impl HostTensor {
    /// The bytes of a buffer of its own, writable (`None` for a batch slice).
    pub(crate) fn own_bytes_mut(&mut self) -> Option<&mut [u8]> {
        match &mut *self.0 {
            HostBytes::Own(data) => Some(&mut data.bytes),
            HostBytes::Shared { .. } => None,
        }
    }
}

impl AsRef<[u8]> for HostTensor {
    fn as_ref(&self) -> &[u8] {
        match &*self.0 {
            HostBytes::Own(data) => data.as_bytes(),
            HostBytes::Shared {
                batch, start, len, ..
            } => &batch[*start..*start + *len],
        }
    }
}

impl AsMut<[u8]> for HostTensor {
    /// Only buffers of their own are written into (spill records are read into fresh zeroed
    /// buffers); a batch slice is never written.
    fn as_mut(&mut self) -> &mut [u8] {
        match &mut *self.0 {
            HostBytes::Own(data) => &mut data.bytes,
            HostBytes::Shared { .. } => {
                unreachable!("burn-spill: a batch slice is read-only; this is a bug")
            }
        }
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
        return Ok(HostTensor::own(data));
    }
    let read = match primitive.clone() {
        Primitive::Float(p) => burn_std::future::block_on(B::float_into_data(p)),
        Primitive::Int(p) => burn_std::future::block_on(B::int_into_data(p)),
        Primitive::Bool(p) => burn_std::future::block_on(B::bool_into_data(p)),
        Primitive::Quantized(p) => burn_std::future::block_on(B::q_into_data(p)),
    };
    let mut data = read.map_err(|e| format!("{e:?}"))?;
    check_read(&data, dtype, shape)?;
    if data.bytes.property() != AllocationProperty::Native {
        data.bytes = aligned_copy(data.as_bytes());
    }
    Ok(HostTensor::own(data))
}

/// Whether the backend read a tensor back with its own dtype and shape.
pub(crate) fn check_read(data: &TensorData, dtype: DType, shape: &Shape) -> Result<(), String> {
    if data.dtype != dtype || data.shape != *shape {
        return Err(format!(
            "the backend read it as {:?} {:?}, not its own {dtype:?} {:?}",
            data.dtype, data.shape, shape
        ));
    }
    Ok(())
}

/// Whether `B`'s tensors can be handed over to the host tier without a copy (see
/// [`hand_over`]): Flex's, whose memory is Rust's own. Without the `flex` feature no backend's
/// can, and `B` goes unasked.
#[cfg_attr(not(feature = "flex"), allow(clippy::extra_unused_type_parameters))]
pub(crate) fn hands_over<B: Backend>() -> bool {
    #[cfg(feature = "flex")]
    {
        use std::any::TypeId;
        TypeId::of::<B::FloatTensorPrimitive>() == TypeId::of::<burn_flex::FlexTensor>()
    }
    #[cfg(not(feature = "flex"))]
    {
        false
    }
}

/// Makes a device primitive the host tier's buffer without copying it, where its memory is
/// already host memory that it owns alone and holds exactly its bytes (a contiguous Flex
/// tensor with no view sharing its buffer). The primitive comes back unchanged otherwise, and
/// the caller copies instead.
///
/// Nothing aliases the result: the primitive is consumed, and its buffer had no other owner.
pub(crate) fn hand_over<B: Backend>(
    primitive: Primitive<B>,
    dtype: DType,
    shape: &Shape,
) -> Result<HostTensor, Primitive<B>> {
    let data = match primitive {
        Primitive::Float(p) => owned_flex_data(p, dtype, shape).map_err(Primitive::Float),
        Primitive::Int(p) => owned_flex_data(p, dtype, shape).map_err(Primitive::Int),
        Primitive::Bool(p) => owned_flex_data(p, dtype, shape).map_err(Primitive::Bool),
        quantized @ Primitive::Quantized(_) => Err(quantized),
    }?;
    Ok(HostTensor::own(data))
}

/// A Flex tensor's own buffer as `TensorData`, when it holds exactly the tensor's bytes and
/// nothing else shares it; `p` back otherwise (and always for other backends).
fn owned_flex_data<P: 'static>(p: P, dtype: DType, shape: &Shape) -> Result<TensorData, P> {
    #[cfg(feature = "flex")]
    {
        use std::any::Any;
        let mut held = Some(p);
        if let Some(flex) =
            (&mut held as &mut dyn Any).downcast_mut::<Option<burn_flex::FlexTensor>>()
        {
            let tensor = flex.take().expect("the primitive was just put in");
            let layout = tensor.layout();
            let exact = tensor.is_unique()
                && tensor.is_contiguous()
                && layout.start_offset() == 0
                && tensor.dtype() == dtype
                && layout.shape() == shape
                && tensor.bytes().len() == shape.num_elements() * dtype.size();
            if exact {
                // Unique, contiguous, exact: `into_data` unwraps the buffer without a copy.
                return Ok(tensor.into_data());
            }
            *flex = Some(tensor);
        }
        Err(held.expect("the primitive is still held"))
    }
    #[cfg(not(feature = "flex"))]
    {
        let _ = (dtype, shape);
        Err(p)
    }
}

/// Flex's `into_data` of a tensor whose buffer is shared (as it is while the handle keeps its
/// primitive) copies twice; a contiguous Flex tensor's bytes are read here with one copy. The
/// result is what `into_data` returns: the contiguous bytes, the shape and the dtype.
fn copy_flex<B: Backend>(
    primitive: &Primitive<B>,
    dtype: DType,
    shape: &Shape,
) -> Option<TensorData> {
    let bytes = flex_bytes(primitive, dtype, shape)?;
    Some(TensorData::from_bytes(
        aligned_copy(bytes),
        shape.clone(),
        dtype,
    ))
}

/// The bytes of a contiguous Flex tensor, borrowed from its buffer (`None` for other backends
/// and layouts).
pub(crate) fn flex_bytes<'a, B: Backend>(
    primitive: &'a Primitive<B>,
    dtype: DType,
    shape: &Shape,
) -> Option<&'a [u8]> {
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
        tensor.bytes().get(start..start + len)
    }
    #[cfg(not(feature = "flex"))]
    {
        let _ = (primitive, dtype, shape);
        None
    }
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use burn_backend::ops::FloatTensorOps;
    use burn_flex::{Flex, FlexTensor};

    use super::*;

    fn flex(values: &[f32], shape: [usize; 2]) -> FlexTensor {
        Flex::float_from_data(TensorData::new(values.to_vec(), shape), &Default::default())
    }

    fn float(tensor: FlexTensor) -> Primitive<Flex> {
        Primitive::Float(tensor)
    }

    #[test]
    fn a_flex_tensor_that_owns_its_buffer_is_handed_over_without_a_copy() {
        assert!(hands_over::<Flex>());
        let tensor = flex(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]);
        let buffer = tensor.bytes().as_ptr();
        let shape = Shape::from([2, 3]);
        let host = hand_over::<Flex>(float(tensor), DType::F32, &shape)
            .unwrap_or_else(|_| panic!("a unique contiguous tensor is handed over"));
        assert_eq!(
            host.as_ref().as_ptr(),
            buffer,
            "the same buffer, not a copy"
        );
        // Restoring gives the tensor back, on the same buffer again.
        let back = Flex::float_from_data(host.into_data(), &Default::default());
        assert_eq!(back.bytes().as_ptr(), buffer);
        assert_eq!(
            back.into_data().to_vec::<f32>().unwrap(),
            [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
        );
    }

    #[test]
    fn a_shared_or_strided_flex_tensor_comes_back_unchanged() {
        let shape = Shape::from([2, 3]);
        let tensor = flex(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]);
        let buffer = tensor.bytes().as_ptr();
        // A clone shares the buffer: handing it over would alias what the clone still reads.
        let clone = tensor.clone();
        let Err(Primitive::Float(back)) = hand_over::<Flex>(float(tensor), DType::F32, &shape)
        else {
            panic!("a shared buffer is not handed over");
        };
        assert_eq!(back.bytes().as_ptr(), buffer);
        drop(clone);
        // A transposed view is not contiguous: its bytes are not the tensor's in order.
        let transposed = Flex::float_swap_dims(back, 0, 1);
        let shape = Shape::from([3, 2]);
        assert!(hand_over::<Flex>(float(transposed), DType::F32, &shape).is_err());
        // Nor is a tensor described with another dtype or shape than its own.
        let tensor = flex(&[1.0, 2.0], [1, 2]);
        assert!(hand_over::<Flex>(float(tensor), DType::F16, &Shape::from([1, 2])).is_err());
    }
}
