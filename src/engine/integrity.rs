//! Restore integrity: a checksum of a tensor's bytes taken when they leave the device for the
//! host tier, and checked when they leave the host again (for the device, or for the spill file,
//! whose own record checksum then carries the check to the restore from disk).
//!
//! The spill file's records are always checksummed (see [`super::disk`]); host buffers are only
//! when [`Limits::verify_restores`](super::Limits::verify_restores) is on, since a checksum is a
//! pass over the bytes at eviction and another at restore. The device copy made by an upload is
//! not read back: that would be a device read per restore.

use super::slot::TensorId;

/// The checksum of bytes leaving the device.
pub(crate) fn checksum(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// Where a tensor's bytes were when they failed the check.
pub(crate) enum Place<'a> {
    /// In a host buffer, about to be uploaded.
    Host,
    /// In a host buffer, written to a cold store at the given place.
    OnTheWayToDisk { record: &'a str },
}

/// Checks host `bytes` of tensor `id` against the checksum taken at eviction; the error names
/// the tensor, the tier and where the bytes were.
pub(crate) fn check_host_copy(
    id: TensorId,
    expected: Option<u32>,
    bytes: &[u8],
    got: Option<u32>,
    place: Place<'_>,
) -> Result<(), String> {
    let Some(expected) = expected else {
        return Ok(());
    };
    let got = got.unwrap_or_else(|| checksum(bytes));
    if got == expected {
        return Ok(());
    }
    let whereabouts = match place {
        Place::Host => String::new(),
        Place::OnTheWayToDisk { record } => {
            format!(", found while writing them to {record}")
        }
    };
    Err(format!(
        "tensor {id} failed its integrity check in the host tier: its {} bytes in the host buffer \
         at {:p} have CRC32 {got:#010x}, not the {expected:#010x} taken when they left the \
         device{whereabouts}; the host memory changed while the tensor was spilled (faulty RAM, \
         or a stray write into burn-spill's buffer)",
        bytes.len(),
        bytes.as_ptr(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_byte_fails_naming_tensor_tier_and_buffer() {
        let mut bytes = vec![7u8; 64];
        let crc = checksum(&bytes);
        assert!(check_host_copy(3, Some(crc), &bytes, None, Place::Host).is_ok());
        assert!(check_host_copy(3, None, &bytes, None, Place::Host).is_ok());
        bytes[17] ^= 1;
        let error = check_host_copy(3, Some(crc), &bytes, None, Place::Host).unwrap_err();
        assert!(
            error.contains("tensor 3") && error.contains("host tier"),
            "{error}"
        );
        assert!(error.contains(&format!("{:p}", bytes.as_ptr())), "{error}");
        let place = Place::OnTheWayToDisk {
            record: "spill file /x/tensors.spill at offset 96",
        };
        let error =
            check_host_copy(3, Some(crc), &bytes, Some(checksum(&bytes)), place).unwrap_err();
        assert!(error.contains("/x/tensors.spill at offset 96"), "{error}");
    }
}
