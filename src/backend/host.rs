//! The host tier's buffers: a tensor's bytes with their dtype and shape, owned by burn-spill.

use burn_backend::{Backend, DType, Shape, TensorData};
use burn_std::AllocationProperty;

use super::tensor::Primitive;

/// One spilled tensor in host memory. The dtype travels with the bytes, so restoring never
/// casts.
pub(crate) struct HostTensor(TensorData);

impl HostTensor {
    /// Bytes read back from a spill record, for a tensor of `shape` and `dtype`.
    pub(crate) fn from_disk(bytes: Vec<u8>, shape: Shape, dtype: DType) -> Self {
        Self(TensorData::from_bytes_vec(bytes, shape, dtype))
    }

    pub(crate) fn into_data(self) -> TensorData {
        self.0
    }
}

impl AsRef<[u8]> for HostTensor {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// Reads a device primitive into a host buffer of our own.
///
/// The read may land in the backend's staging memory (CubeCL reads into a per-stream pinned pool
/// that never shrinks), so anything not allocated by Rust's own allocator is copied out and the
/// staging buffer released at once. Rust-allocated bytes (CPU backends) are kept as they are:
/// they already are a private buffer.
pub(crate) fn read_to_host<B: Backend>(
    primitive: Primitive<B>,
    dtype: DType,
    shape: &Shape,
) -> Result<HostTensor, String> {
    let read = match primitive {
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
        let owned = data.as_bytes().to_vec();
        data = TensorData::from_bytes_vec(owned, data.shape, data.dtype);
    }
    Ok(HostTensor(data))
}
