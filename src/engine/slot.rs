//! The residency state of one tensor: which tier holds its bytes.
//!
//! `D` is the device payload (the inner backend's primitive) and `H` the host buffer; the engine
//! never looks inside either, so it is tested with fakes. Transitions are made by
//! [`DeviceEngine`](super::DeviceEngine), which keeps the ledger in step with them.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, TryLockError};

use super::cold::ColdRecord;

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
    /// In a host buffer, with the checksum taken when it left the device (when restores are
    /// verified).
    Host {
        /// The bytes.
        copy: H,
        /// Their CRC32 at eviction.
        crc: Option<u32>,
    },
    /// In the spill file.
    Disk(ColdRecord),
    /// Being moved by a transfer worker, which holds the bytes; `from` still counts them.
    InFlight {
        /// The tier the bytes are counted in until they arrive.
        from: Tier,
    },
    /// Taken by an op that consumed the last handle; the handle is about to drop.
    Taken,
    /// Dropped from the device with no copy anywhere: the adapter rebuilds the bytes from the
    /// recipe it keeps (the op that made them and its inputs) when they are next used.
    Dropped,
}

impl<D, H> Residency<D, H> {
    /// The tier holding the bytes (`None` once taken or dropped).
    pub fn tier(&self) -> Option<Tier> {
        match self {
            Residency::Device(_) => Some(Tier::Device),
            Residency::Host { .. } => Some(Tier::Host),
            Residency::Disk(_) => Some(Tier::Disk),
            Residency::InFlight { from } => Some(*from),
            Residency::Taken | Residency::Dropped => None,
        }
    }
}

/// What the engine needs to know about a tensor to move it.
#[derive(Clone, Copy)]
pub struct SlotInfo<'a> {
    /// The tensor's id.
    pub id: TensorId,
    /// Its logical size in bytes.
    pub bytes: u64,
    /// Whether it is a parameter.
    pub role: super::TensorRole,
    /// Its dtype and shape as the adapter describes them, stored in spill records and checked
    /// on read. Formatted only when a record is written or read: most moves stay on the host,
    /// and formatting it for each was an allocation per move.
    pub meta: &'a dyn Fn() -> String,
}

impl std::fmt::Debug for SlotInfo<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotInfo")
            .field("id", &self.id)
            .field("bytes", &self.bytes)
            .field("role", &self.role)
            .field("meta", &(self.meta)())
            .finish()
    }
}

/// [`Slot::tier_unless_dropped`]'s code for a dropped tensor (the tiers are their index).
const DROPPED: u8 = 3;

/// The code of `state` that [`Slot::tier_unless_dropped`] reads.
fn tier_code<D, H>(state: &Residency<D, H>) -> u8 {
    match state {
        Residency::Dropped => DROPPED,
        // Taken only just before the handle drops: counted where it was, on the device.
        state => state.tier().unwrap_or(Tier::Device) as u8,
    }
}

/// One tensor's residency behind its lock, with the signal a transfer worker gives when bytes
/// it carried have arrived, and its tier readable without the lock.
#[derive(Debug)]
pub struct Slot<D, H> {
    state: Mutex<Residency<D, H>>,
    arrived: Condvar,
    /// The state's tier, as `tier_code` gives it, written as each lock of the state ends: an
    /// op notes its inputs' tiers without locking them (a lock and an unlock were two atomic
    /// read-modify-writes per input).
    tier: AtomicU8,
}

/// The state, locked; the slot's lock-free tier is brought up to date as the lock ends.
pub struct SlotGuard<'a, D, H> {
    guard: MutexGuard<'a, Residency<D, H>>,
    tier: &'a AtomicU8,
}

impl<D, H> Deref for SlotGuard<'_, D, H> {
    type Target = Residency<D, H>;

    fn deref(&self) -> &Residency<D, H> {
        &self.guard
    }
}

impl<D, H> DerefMut for SlotGuard<'_, D, H> {
    fn deref_mut(&mut self) -> &mut Residency<D, H> {
        &mut self.guard
    }
}

impl<D, H> Drop for SlotGuard<'_, D, H> {
    fn drop(&mut self) {
        // Still under the lock (the mutex's guard drops after this): every change of the state
        // is published before another thread can lock it.
        self.tier.store(tier_code(&self.guard), Ordering::Relaxed);
    }
}

impl<D, H> Slot<D, H> {
    /// A slot holding `state`.
    pub fn new(state: Residency<D, H>) -> Self {
        Self {
            tier: AtomicU8::new(tier_code(&state)),
            state: Mutex::new(state),
            arrived: Condvar::new(),
        }
    }

    fn guard<'a>(&'a self, guard: MutexGuard<'a, Residency<D, H>>) -> SlotGuard<'a, D, H> {
        SlotGuard {
            guard,
            tier: &self.tier,
        }
    }

    /// Locks the state. A poisoned lock comes from a panic in a read or upload of the payload
    /// (reported by that panic); the state is still one of the tiers.
    pub fn lock(&self) -> SlotGuard<'_, D, H> {
        self.guard(self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Locks the state unless someone holds it (a busy tensor is a poor victim).
    pub fn try_lock(&self) -> Option<SlotGuard<'_, D, H>> {
        match self.state.try_lock() {
            Ok(guard) => Some(self.guard(guard)),
            Err(TryLockError::Poisoned(e)) => Some(self.guard(e.into_inner())),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// Locks the state once no transfer holds the bytes; returns how long it waited.
    pub fn lock_settled(&self) -> (SlotGuard<'_, D, H>, std::time::Duration) {
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if !matches!(*guard, Residency::InFlight { .. }) {
            return (self.guard(guard), std::time::Duration::ZERO);
        }
        let start = std::time::Instant::now();
        while matches!(*guard, Residency::InFlight { .. }) {
            guard = self.arrived.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
        (self.guard(guard), start.elapsed())
    }

    /// The tier holding the bytes as the last lock of the state left them, without locking it;
    /// `None` when they were dropped to be rebuilt. Another thread may change it at once, as
    /// it could right after a locked read.
    pub fn tier_unless_dropped(&self) -> Option<Tier> {
        match self.tier.load(Ordering::Relaxed) {
            DROPPED => None,
            code => Some(Tier::ALL[usize::from(code)]),
        }
    }

    /// Wakes the ops waiting for this slot's bytes.
    pub fn notify_arrived(&self) {
        self.arrived.notify_all();
    }

    /// The state, for a drop (no one else can hold the lock). It bypasses the guard, so a
    /// change made through it is not published to
    /// [`tier_unless_dropped`](Self::tier_unless_dropped): only for a slot about to go.
    pub fn get_mut(&mut self) -> &mut Residency<D, H> {
        self.state.get_mut().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tier_read_without_the_lock_follows_every_change_made_under_it() {
        let slot: Slot<u32, u32> = Slot::new(Residency::Device(7));
        assert_eq!(slot.tier_unless_dropped(), Some(Tier::Device));
        *slot.lock() = Residency::Host { copy: 7, crc: None };
        assert_eq!(slot.tier_unless_dropped(), Some(Tier::Host));
        {
            let mut state = slot.try_lock().expect("no one holds it");
            *state = Residency::InFlight { from: Tier::Disk };
            assert_eq!(
                slot.tier_unless_dropped(),
                Some(Tier::Host),
                "published as the lock ends"
            );
        }
        assert_eq!(
            slot.tier_unless_dropped(),
            Some(Tier::Disk),
            "counted where it was"
        );
        *slot.lock() = Residency::Dropped;
        assert_eq!(slot.tier_unless_dropped(), None);
        *slot.lock() = Residency::Device(8);
        let (mut state, _) = slot.lock_settled();
        *state = Residency::Taken;
        drop(state);
        assert_eq!(slot.tier_unless_dropped(), Some(Tier::Device));
    }
}
