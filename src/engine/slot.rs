//! The residency state of one tensor: which tier holds its bytes.
//!
//! `D` is the device payload (the inner backend's primitive) and `H` the host buffer; the engine
//! never looks inside either, so it is tested with fakes. Transitions are made by
//! [`DeviceEngine`](super::DeviceEngine), which keeps the ledger in step with them.

use super::disk::DiskRecord;

/// A process-wide unique tensor id. Clones of a handle share it.
pub type TensorId = u64;

/// The three places a tensor's bytes can be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// The inner backend's primitive, ready for ops.
    Device = 0,
    /// A host buffer owned by burn-spill.
    Host = 1,
    /// A record in the spill file.
    Disk = 2,
}

impl Tier {
    /// All tiers, in index order.
    pub const ALL: [Tier; 3] = [Tier::Device, Tier::Host, Tier::Disk];

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// Where one tensor's bytes are now.
#[derive(Debug)]
pub enum Residency<D, H> {
    /// On the device.
    Device(D),
    /// In a host buffer.
    Host(H),
    /// In the spill file.
    Disk(DiskRecord),
    /// Taken by an op that consumed the last handle; the handle is about to drop.
    Taken,
}

impl<D, H> Residency<D, H> {
    /// The tier holding the bytes (`None` once taken).
    pub fn tier(&self) -> Option<Tier> {
        match self {
            Residency::Device(_) => Some(Tier::Device),
            Residency::Host(_) => Some(Tier::Host),
            Residency::Disk(_) => Some(Tier::Disk),
            Residency::Taken => None,
        }
    }
}

/// What the engine needs to know about a tensor to move it.
#[derive(Debug, Clone, Copy)]
pub struct SlotInfo<'a> {
    /// The tensor's id.
    pub id: TensorId,
    /// Its logical size in bytes.
    pub bytes: u64,
    /// Whether it is a parameter.
    pub role: super::TensorRole,
    /// Its dtype and shape as the adapter describes them, stored in spill records and checked
    /// on read.
    pub meta: &'a [u8],
}
