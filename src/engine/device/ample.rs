//! While memory is ample: ops run untracked (no pins, no index, no reservation), the tensors
//! they make are only listed, and the first op that finds memory short indexes them all.
//!
//! The rule is [`policy::ample::stays_ample`](crate::policy::ample::stays_ample). The switch to
//! tracking is one-way until the next `configure`: a model whose step nears the budget once
//! will near it every step, and indexing its tensors once is cheaper than flapping.
//!
//! Untracked ops pin nothing, so nothing may be evicted while one runs: the switch first stops
//! new untracked ops, then waits for those running to end, then indexes the listed tensors, and
//! only then lets tracked ops (and their evictions) run.

use std::cell::Cell;
use std::sync::Mutex;
use std::sync::Weak;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use crate::engine::index::Spillable;
use crate::engine::slot::{TensorId, Tier};
use crate::policy::ample::stays_ample;

use super::admit::op_signature;
use super::{DeviceEngine, lock};

const AMPLE: u8 = 0;
const SWITCHING: u8 = 1;
const TRACKED: u8 = 2;

/// A tensor an untracked op made.
struct Listed {
    id: TensorId,
    bytes: u64,
    victim: Weak<dyn Spillable>,
}

/// The listed tensors: places that a tensor's drop empties again ([`DeviceEngine::unlist`]),
/// and the empty places that new entries reuse. A dropped tensor takes its entry (and the weak
/// reference in it) along at once: a weak reference left behind until a later prune would keep
/// the handle's allocation from being freed, and freeing thousands of them in one prune is
/// what makes the allocator slow.
#[derive(Default)]
struct Made {
    places: Vec<Option<Listed>>,
    empty: Vec<u32>,
}

impl Made {
    /// Lists `listed` in an empty place; returns the place.
    fn list(&mut self, listed: Listed) -> u32 {
        match self.empty.pop() {
            Some(place) => {
                self.places[place as usize] = Some(listed);
                place
            }
            None => {
                self.places.push(Some(listed));
                u32::try_from(self.places.len() - 1).expect("fewer than 4 billion live tensors")
            }
        }
    }

    /// Empties `place` if `id` is listed there (after a switch to tracking, or a fresh list, the
    /// place may be gone or hold another tensor).
    fn unlist(&mut self, place: u32, id: TensorId) {
        if let Some(slot) = self.places.get_mut(place as usize)
            && slot.as_ref().is_some_and(|listed| listed.id == id)
        {
            *slot = None;
            self.empty.push(place);
        }
    }
}

/// What an untracked op's end needs of the limits its start read (so that it need not read
/// them again).
#[derive(Debug, Clone, Copy)]
pub struct UntrackedOp {
    /// Above these device bytes, or with anything off the device, memory is no longer ample.
    pub(super) settle_floor: u64,
    /// `Limits::pool_margin`.
    pub(super) pool_margin: u64,
}

/// The ample-memory state of one device.
#[derive(Default)]
pub(super) struct Ample {
    /// `AMPLE`, `SWITCHING` (no new untracked op; the index is being completed) or `TRACKED`.
    mode: AtomicU8,
    /// Untracked ops running now.
    in_flight: AtomicU64,
    /// The largest output an op made on this device since it was configured: an untracked
    /// op's output estimate.
    largest_output: AtomicU64,
    made: Mutex<Made>,
    /// Held by the thread that switches to tracking; the others wait on it.
    switch: Mutex<()>,
}

thread_local! {
    /// Untracked ops this thread is inside now (an op's handle may drop inside another op).
    static HELD_HERE: Cell<u64> = const { Cell::new(0) };
}

impl DeviceEngine {
    /// Starts an op untracked when memory is ample (see the module doc), where `input_bytes`
    /// is the op's first input (0 for an op that creates a tensor from nothing). Returns what
    /// the op's end needs when it did: the caller then skips `begin_op`/`end_op`, lists the
    /// outputs with [`note_untracked_output`](Self::note_untracked_output) and calls
    /// [`end_untracked`](Self::end_untracked) and
    /// [`after_untracked_op`](Self::after_untracked_op) when the op ends. When memory is not
    /// ample it switches to tracking (once) and returns `None`.
    pub fn begin_untracked(&self, input_bytes: u64) -> Option<UntrackedOp> {
        let ample = &self.ample;
        if ample.mode.load(Ordering::Relaxed) == TRACKED {
            return None;
        }
        // Announce the op before reading the mode: a switch that stores its mode before it reads
        // the count sees this op, or this op sees the switch (both sequentially consistent).
        ample.in_flight.fetch_add(1, Ordering::SeqCst);
        if ample.mode.load(Ordering::SeqCst) != AMPLE {
            ample.in_flight.fetch_sub(1, Ordering::SeqCst);
            self.track_all();
            return None;
        }
        let (op, planning) = self.with_limits(|limits| {
            let op = limits.budget.map(|budget| UntrackedOp {
                settle_floor: self.settle_floor(limits, budget),
                pool_margin: limits.pool_margin,
            });
            (op, limits.planning())
        });
        let fits = op.is_some_and(|op| {
            let estimate = ample
                .largest_output
                .load(Ordering::Relaxed)
                .max(input_bytes);
            stays_ample(
                self.off_device(),
                self.device_committed(),
                estimate,
                op.settle_floor,
            )
        });
        if !fits {
            ample.in_flight.fetch_sub(1, Ordering::SeqCst);
            self.track_all();
            return None;
        }
        HELD_HERE.with(|held| held.set(held.get() + 1));
        if planning {
            // The step's counters and plan follow the steps as for a tracked op.
            self.step_changed(self.recorder.position().0);
        }
        op
    }

    /// Ends an op that [`begin_untracked`](Self::begin_untracked) started.
    pub fn end_untracked(&self) {
        HELD_HERE.with(|held| held.set(held.get().saturating_sub(1)));
        self.ample.in_flight.fetch_sub(1, Ordering::SeqCst);
    }

    /// Learns what an untracked op made: `name`, with the size-deciding arguments `hint`, read
    /// inputs of `input_bytes` and made `output_bytes`. Learnt as a tracked op's size is, so
    /// that once ops are tracked their outputs are estimated right from the first tracked step.
    pub fn learn_untracked(
        &self,
        name: &'static str,
        hint: u64,
        input_bytes: &[u64],
        output_bytes: u64,
    ) {
        let signature = op_signature(name, hint, input_bytes.iter().copied());
        // Nearly every call repeats a size learnt before: then the index is not even locked.
        if self.known_sizes.contains(signature, output_bytes) {
            return;
        }
        let mut index = lock(&self.index);
        self.learn_output(&mut index, signature, output_bytes);
    }

    /// Notes an output of an untracked op: its size for later estimates and, when it may leave
    /// the device, its handle for the index (made when tracking starts). Returns the place the
    /// handle is listed at, which its drop gives to [`unlist`](Self::unlist).
    pub fn note_untracked_output(
        &self,
        id: TensorId,
        bytes: u64,
        evictable: bool,
        victim: impl FnOnce() -> Weak<dyn Spillable>,
    ) -> Option<u32> {
        let largest = &self.ample.largest_output;
        if bytes > largest.load(Ordering::Relaxed) {
            largest.fetch_max(bytes, Ordering::Relaxed);
        }
        if !evictable {
            return None;
        }
        let victim = victim();
        Some(lock(&self.ample.made).list(Listed { id, bytes, victim }))
    }

    /// Takes tensor `id`, listed at `place` by
    /// [`note_untracked_output`](Self::note_untracked_output), off the list as it drops.
    pub fn unlist(&self, place: u32, id: TensorId) {
        lock(&self.ample.made).unlist(place, id);
    }

    /// Whether every tensor made on this device since it was configured is indexed (ops are
    /// tracked), as opposed to memory being ample.
    pub fn tracks_all(&self) -> bool {
        self.ample.mode.load(Ordering::Acquire) == TRACKED
    }

    /// Switches to tracking: stops untracked ops, waits for those running, indexes the tensors
    /// they made. Returns once every tensor is indexed (at once when that was done before).
    pub fn track_all(&self) {
        let ample = &self.ample;
        if ample.mode.load(Ordering::Acquire) == TRACKED {
            return;
        }
        let _switch = lock(&ample.switch);
        if ample.mode.load(Ordering::Acquire) == TRACKED {
            return;
        }
        ample.mode.store(SWITCHING, Ordering::SeqCst);
        let mine = HELD_HERE.with(Cell::get);
        while ample.in_flight.load(Ordering::SeqCst) > mine {
            std::thread::yield_now();
        }
        let listed = std::mem::take(&mut *lock(&ample.made));
        let alive: Vec<_> = listed
            .places
            .into_iter()
            .flatten()
            .filter_map(|l| l.victim.upgrade().map(|strong| (l, strong)))
            .collect();
        {
            let mut index = lock(&self.index);
            for (listed, strong) in &alive {
                // Marked while a strong handle is held: its drop, later, sees the mark and
                // leaves the index.
                strong.mark_indexed();
                let tick = index.next_tick();
                let victim = listed.victim.clone();
                index.admit_output(listed.id, listed.bytes, tick, || victim, None);
            }
        }
        tracing::debug!(
            target: "burn_spill::budget",
            indexed = alive.len(),
            "the device neared its budget: ops are tracked from now on"
        );
        // The strong handles drop after the index lock is released (a drop takes it).
        drop(alive);
        ample.mode.store(TRACKED, Ordering::Release);
    }

    /// After `configure`: ops start untracked again while memory is ample, unless bytes are off
    /// the device (their prefetches need tracking), and the largest output is learnt afresh.
    /// The list is kept: its tensors are still unindexed (the dropped ones took their entries
    /// along).
    pub(super) fn reset_ample(&self) {
        let switch = lock(&self.ample.switch);
        // A configuration learns its own largest output, so that what it does does not depend
        // on what ran on the device before it (until an op makes one, the estimate is its
        // first input, and the check after each op catches a larger output).
        self.ample.largest_output.store(0, Ordering::Relaxed);
        if self.off_device() == 0 {
            self.ample.mode.store(AMPLE, Ordering::SeqCst);
        } else {
            // Spilled bytes need tracking (their prefetches); `track_all` takes the lock itself.
            drop(switch);
            self.track_all();
        }
    }

    /// Bytes of this device's tensors that are not on it: spilled, or dropped to be rebuilt.
    pub(super) fn off_device(&self) -> u64 {
        self.ledger.resident(Tier::Host)
            + self.ledger.resident(Tier::Disk)
            + self.ledger.dropped_now()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::engine::index::tests::Fake;

    fn listed(id: TensorId, tensor: &Arc<dyn Spillable>) -> Listed {
        Listed {
            id,
            bytes: 8,
            victim: Arc::downgrade(tensor),
        }
    }

    #[test]
    fn a_dropped_tensor_takes_its_entry_along_and_its_place_is_reused() {
        let tensor: Arc<dyn Spillable> = Arc::new(Fake);
        let mut made = Made::default();
        let first = made.list(listed(1, &tensor));
        let second = made.list(listed(2, &tensor));
        assert_ne!(first, second);
        made.unlist(first, 1);
        assert!(made.places[first as usize].is_none());
        assert_eq!(
            Arc::weak_count(&tensor),
            1,
            "the weak reference of the dropped one went with its entry"
        );
        assert_eq!(
            made.list(listed(3, &tensor)),
            first,
            "an empty place is reused"
        );
        made.unlist(first, 1);
        assert!(
            made.places[first as usize]
                .as_ref()
                .is_some_and(|l| l.id == 3),
            "a stale place does not unlist the tensor that has it now"
        );
        made.unlist(99, 2);
        assert_eq!(
            (made.places.len(), made.empty.len()),
            (2, 0),
            "a place past the list changes nothing"
        );
    }

    #[test]
    fn the_switch_to_tracking_indexes_the_listed_tensors_still_alive() {
        let engine = DeviceEngine::default();
        let (kept, gone): (Arc<dyn Spillable>, Arc<dyn Spillable>) =
            (Arc::new(Fake), Arc::new(Fake));
        let listed_at = |id, tensor: &Arc<dyn Spillable>| {
            engine.note_untracked_output(id, 8, true, || Arc::downgrade(tensor))
        };
        assert!(listed_at(1, &kept).is_some());
        let gone_at = listed_at(2, &gone).expect("an evictable tensor is listed");
        assert_eq!(
            engine.note_untracked_output(3, 8, false, || Arc::downgrade(&kept)),
            None,
            "a tensor that cannot leave the device is not listed"
        );
        engine.unlist(gone_at, 2);
        drop(gone);
        engine.track_all();
        assert!(engine.tracks_all());
        assert_eq!(lock(&engine.index).len(), 1, "only the tensor still alive");
        assert_eq!(
            lock(&engine.ample.made).places.len(),
            0,
            "the list was handed to the index"
        );
    }
}
