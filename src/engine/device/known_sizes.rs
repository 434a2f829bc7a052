//! Which learnt output sizes the index already holds, readable without its lock: an op run
//! while memory is ample learns its output size after every call, and nearly every call
//! repeats one learnt before, so the index's lock and map lookup are skipped when this says so.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::fast_hash::FastHasher;
use std::hash::Hasher;

/// Slots of the memo: a step's distinct op signatures are a few hundred to a few thousand, and
/// one that lost its slot to another only costs a lookup under the lock.
const SLOT_BITS: u32 = 12;
const SLOTS: usize = 1 << SLOT_BITS;

/// A direct-mapped set of (signature, bytes) pairs the index holds. A slot holds a 64-bit
/// digest of its pair and of the index's clear count, so a pair is taken for known only when
/// its digest is there: a wrong "known" needs a 64-bit collision, and costs only a size not
/// learnt again (the estimate of a later tracked op), never a value.
pub(super) struct KnownSizes {
    slots: Box<[AtomicU64]>,
    /// How many times the index's learnt sizes were cleared: digests of older pairs no longer
    /// match.
    clears: AtomicU64,
}

impl Default for KnownSizes {
    fn default() -> Self {
        Self {
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            clears: AtomicU64::new(0),
        }
    }
}

impl KnownSizes {
    fn digest(&self, signature: u64, bytes: u64) -> u64 {
        let mut hasher = FastHasher::default();
        hasher.write_u64(signature);
        hasher.write_u64(bytes);
        hasher.write_u64(self.clears.load(Ordering::Relaxed));
        // 0 marks an empty slot.
        hasher.finish() | 1
    }

    fn slot(&self, digest: u64) -> &AtomicU64 {
        // The high bits: the hasher's multiply leaves the low ones depending on few input bits.
        &self.slots[(digest >> (64 - SLOT_BITS)) as usize]
    }

    /// Whether the index holds `bytes` for `signature`, as far as this memo knows.
    pub(super) fn contains(&self, signature: u64, bytes: u64) -> bool {
        let digest = self.digest(signature, bytes);
        self.slot(digest).load(Ordering::Relaxed) == digest
    }

    /// Notes that the index holds `bytes` for `signature` now.
    pub(super) fn insert(&self, signature: u64, bytes: u64) {
        let digest = self.digest(signature, bytes);
        self.slot(digest).store(digest, Ordering::Relaxed);
    }

    /// Forgets that the index holds `bytes` for `signature` (it learnt another size for it).
    pub(super) fn remove(&self, signature: u64, bytes: u64) {
        let digest = self.digest(signature, bytes);
        let _ = self
            .slot(digest)
            .compare_exchange(digest, 0, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Forgets every pair: the index cleared its learnt sizes.
    pub(super) fn clear(&self) {
        self.clears.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_is_known_once_inserted_and_until_cleared() {
        let known = KnownSizes::default();
        assert!(!known.contains(7, 1024));
        known.insert(7, 1024);
        assert!(known.contains(7, 1024));
        assert!(!known.contains(7, 2048), "another size of the same op");
        assert!(!known.contains(8, 1024), "another op");
        known.remove(7, 2048);
        assert!(
            known.contains(7, 1024),
            "removing a pair it does not hold changes nothing"
        );
        known.remove(7, 1024);
        assert!(!known.contains(7, 1024), "the index learnt another size");
        known.insert(7, 1024);
        known.clear();
        assert!(!known.contains(7, 1024), "the index forgot it");
        known.insert(7, 1024);
        assert!(known.contains(7, 1024));
    }
}
