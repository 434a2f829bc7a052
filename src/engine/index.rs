//! Which tensors each tier holds, coldest first, and which are pinned by a running op.
//!
//! Victim choice reads this; it holds weak references so that it never keeps a tensor alive, and
//! it is only ever locked while no tensor's own lock is held (see `DeviceEngine`).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Weak};

use super::DeviceEngine;
use super::slot::{TensorId, Tier};

/// A tensor the engine can move. The adapter implements it for its handle.
pub trait Spillable: Send + Sync {
    /// Moves the bytes from the device to a host buffer. Returns false (and changes nothing)
    /// when the tensor is not on the device or is busy in an op.
    fn evict_to_host(&self, engine: &DeviceEngine) -> bool;
    /// Moves the bytes from the host buffer to the spill file. Returns false when the tensor is
    /// not on the host, is busy, or the write failed (it then stays on the host).
    fn demote_to_disk(&self, engine: &DeviceEngine) -> bool;
}

struct Entry {
    victim: Weak<dyn Spillable>,
    bytes: u64,
    tier: Tier,
    last_use: u64,
    pins: u32,
}

/// A candidate victim, upgraded so it stays alive while it is moved.
pub(crate) struct Candidate {
    pub id: TensorId,
    pub victim: Arc<dyn Spillable>,
}

#[derive(Default)]
pub(crate) struct Index {
    entries: HashMap<TensorId, Entry>,
    /// (last use, id) of the device and host tiers; the disk tier is never a source of victims.
    cold: [BTreeSet<(u64, TensorId)>; 2],
}

impl Index {
    fn order(&mut self, tier: Tier) -> Option<&mut BTreeSet<(u64, TensorId)>> {
        match tier {
            Tier::Device | Tier::Host => Some(&mut self.cold[tier.index()]),
            Tier::Disk => None,
        }
    }

    /// Adds a tensor, or marks it used now if present.
    pub fn insert_or_touch(
        &mut self,
        id: TensorId,
        bytes: u64,
        tier: Tier,
        tick: u64,
        victim: impl FnOnce() -> Weak<dyn Spillable>,
    ) {
        if self.entries.contains_key(&id) {
            self.touch(id, tick);
            return;
        }
        self.entries.insert(
            id,
            Entry {
                victim: victim(),
                bytes,
                tier,
                last_use: tick,
                pins: 0,
            },
        );
        if let Some(order) = self.order(tier) {
            order.insert((tick, id));
        }
    }

    pub fn touch(&mut self, id: TensorId, tick: u64) {
        let Some(entry) = self.entries.get_mut(&id) else {
            return;
        };
        let (old, tier) = (entry.last_use, entry.tier);
        entry.last_use = tick;
        if let Some(order) = self.order(tier) {
            order.remove(&(old, id));
            order.insert((tick, id));
        }
    }

    pub fn set_tier(&mut self, id: TensorId, tier: Tier) {
        let Some(entry) = self.entries.get_mut(&id) else {
            return;
        };
        let (old_tier, last_use) = (entry.tier, entry.last_use);
        entry.tier = tier;
        if let Some(order) = self.order(old_tier) {
            order.remove(&(last_use, id));
        }
        if let Some(order) = self.order(tier) {
            order.insert((last_use, id));
        }
    }

    pub fn pin(&mut self, id: TensorId) {
        if let Some(entry) = self.entries.get_mut(&id) {
            entry.pins += 1;
        }
    }

    pub fn unpin(&mut self, id: TensorId) {
        if let Some(entry) = self.entries.get_mut(&id) {
            entry.pins = entry.pins.saturating_sub(1);
        }
    }

    pub fn remove(&mut self, id: TensorId) {
        if let Some(entry) = self.entries.remove(&id)
            && let Some(order) = self.order(entry.tier)
        {
            order.remove(&(entry.last_use, id));
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The coldest unpinned live tensors of `tier`, not in `tried`, until their bytes reach
    /// `want` (at least one when any exists).
    pub fn coldest(&self, tier: Tier, want: u64, tried: &HashSet<TensorId>) -> Vec<Candidate> {
        let Some(order) = (match tier {
            Tier::Device | Tier::Host => Some(&self.cold[tier.index()]),
            Tier::Disk => None,
        }) else {
            return Vec::new();
        };
        let mut picked = Vec::new();
        let mut bytes = 0u64;
        for &(_, id) in order {
            if bytes >= want && !picked.is_empty() {
                break;
            }
            let entry = &self.entries[&id];
            if entry.pins > 0 || tried.contains(&id) {
                continue;
            }
            if let Some(victim) = entry.victim.upgrade() {
                bytes += entry.bytes;
                picked.push(Candidate { id, victim });
            }
        }
        picked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake;
    impl Spillable for Fake {
        fn evict_to_host(&self, _: &DeviceEngine) -> bool {
            true
        }
        fn demote_to_disk(&self, _: &DeviceEngine) -> bool {
            true
        }
    }

    #[test]
    fn coldest_first_skipping_pinned_dead_and_tried() {
        let alive: Vec<Arc<dyn Spillable>> = (0..4)
            .map(|_| Arc::new(Fake) as Arc<dyn Spillable>)
            .collect();
        let dead: Weak<dyn Spillable> = Arc::downgrade(&(Arc::new(Fake) as Arc<dyn Spillable>));
        let mut index = Index::default();
        for (i, v) in alive.iter().enumerate() {
            index.insert_or_touch(i as u64, 10, Tier::Device, i as u64, || Arc::downgrade(v));
        }
        index.insert_or_touch(9, 10, Tier::Device, 0, || dead.clone());
        index.touch(0, 100); // 0 becomes the hottest
        index.pin(1);
        let ids = |c: Vec<Candidate>| c.iter().map(|c| c.id).collect::<Vec<_>>();
        assert_eq!(
            ids(index.coldest(Tier::Device, 15, &HashSet::new())),
            vec![2, 3]
        );
        assert_eq!(
            ids(index.coldest(Tier::Device, 1000, &HashSet::from([2]))),
            vec![3, 0]
        );
        index.unpin(1);
        index.set_tier(1, Tier::Host);
        assert_eq!(ids(index.coldest(Tier::Host, 1, &HashSet::new())), vec![1]);
        index.remove(1);
        assert!(index.coldest(Tier::Host, 1, &HashSet::new()).is_empty());
        assert_eq!(index.len(), 4);
    }
}
