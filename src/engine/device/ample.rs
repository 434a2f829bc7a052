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

/// The listed tensors, and the length at which the dropped ones are pruned.
#[derive(Default)]
struct Made {
    list: Vec<Listed>,
    prune_at: usize,
}

/// Entries the list may hold before it is first pruned.
const FIRST_PRUNE: usize = 1024;

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
    /// is the op's first input (0 for an op that creates a tensor from nothing). Returns
    /// whether it did: the caller then skips `begin_op`/`end_op`, lists the outputs with
    /// [`note_untracked_output`](Self::note_untracked_output) and calls
    /// [`end_untracked`](Self::end_untracked) when the op ends. When memory is not ample it
    /// switches to tracking (once) and returns false.
    pub fn begin_untracked(&self, input_bytes: u64) -> bool {
        let ample = &self.ample;
        if ample.mode.load(Ordering::Relaxed) == TRACKED {
            return false;
        }
        // Announce the op before reading the mode: a switch that stores its mode before it reads
        // the count sees this op, or this op sees the switch (both sequentially consistent).
        ample.in_flight.fetch_add(1, Ordering::SeqCst);
        if ample.mode.load(Ordering::SeqCst) != AMPLE {
            ample.in_flight.fetch_sub(1, Ordering::SeqCst);
            self.track_all();
            return false;
        }
        let limits = self.limits();
        let fits = limits.budget.is_some_and(|budget| {
            let estimate = ample
                .largest_output
                .load(Ordering::Relaxed)
                .max(input_bytes);
            stays_ample(
                self.off_device(),
                self.device_committed(),
                estimate,
                self.settle_floor(&limits, budget),
            )
        });
        if !fits {
            ample.in_flight.fetch_sub(1, Ordering::SeqCst);
            self.track_all();
            return false;
        }
        HELD_HERE.with(|held| held.set(held.get() + 1));
        if limits.planning() {
            // The step's counters and plan follow the steps as for a tracked op.
            self.step_changed(self.recorder.position().0);
        }
        true
    }

    /// Ends an op that [`begin_untracked`](Self::begin_untracked) started.
    pub fn end_untracked(&self) {
        HELD_HERE.with(|held| held.set(held.get().saturating_sub(1)));
        self.ample.in_flight.fetch_sub(1, Ordering::SeqCst);
    }

    /// Learns what an untracked op made: `name`, with the size-deciding arguments `hint`, read
    /// inputs of `input_bytes` and made `output_bytes`. Learnt as a tracked op's size is, so
    /// that once ops are tracked their outputs are estimated right from the first tracked step.
    pub fn learn_untracked(&self, name: &str, hint: u64, input_bytes: &[u64], output_bytes: u64) {
        let signature = op_signature(name, hint, input_bytes.iter().copied());
        let mut index = lock(&self.index);
        // Most ops repeat a learnt size: the map is written only when it changes.
        if index.learnt_output(signature) != Some(output_bytes) {
            index.learn_output(signature, output_bytes);
        }
    }

    /// Notes an output of an untracked op: its size for later estimates and, when it may leave
    /// the device, its handle for the index (made when tracking starts).
    pub fn note_untracked_output(
        &self,
        id: TensorId,
        bytes: u64,
        evictable: bool,
        victim: impl FnOnce() -> Weak<dyn Spillable>,
    ) {
        let largest = &self.ample.largest_output;
        if bytes > largest.load(Ordering::Relaxed) {
            largest.fetch_max(bytes, Ordering::Relaxed);
        }
        if !evictable {
            return;
        }
        let mut made = lock(&self.ample.made);
        made.list.push(Listed {
            id,
            bytes,
            victim: victim(),
        });
        if made.list.len() >= made.prune_at.max(FIRST_PRUNE) {
            // Dropped tensors leave their entries behind: prune once the list doubled, so that
            // it stays within twice the live tensors at an amortised O(1) a push.
            made.list.retain(|l| l.victim.strong_count() > 0);
            made.prune_at = 2 * made.list.len();
        }
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
        let listed = std::mem::take(&mut lock(&ample.made).list);
        let alive: Vec<_> = listed
            .into_iter()
            .filter_map(|l| l.victim.upgrade().map(|strong| (l, strong)))
            .collect();
        {
            let mut index = lock(&self.index);
            for (listed, strong) in &alive {
                // Marked while a strong handle is held: its drop, later, sees the mark and
                // leaves the index.
                strong.mark_indexed();
                let tick = self.tick.fetch_add(1, Ordering::Relaxed);
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
    /// The list is kept (its tensors are still unindexed), less the dropped ones.
    pub(super) fn reset_ample(&self) {
        let switch = lock(&self.ample.switch);
        let mut made = lock(&self.ample.made);
        made.list.retain(|l| l.victim.strong_count() > 0);
        made.prune_at = 2 * made.list.len();
        drop(made);
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
