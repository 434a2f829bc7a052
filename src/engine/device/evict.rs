//! Choosing victims by the policy (and the plan) and evicting them, alone or batched, until
//! the device is down to a target; the host tier's overflow demoted to disk.

use std::sync::Arc;
use std::time::Instant;

use crate::engine::index::{Candidate, Spillable};
use crate::engine::ledger::Direction;
use crate::engine::slot::{TensorId, Tier};
use crate::engine::transfer::on_worker;
use crate::fast_hash::FastSet;
use crate::policy::plan::{NextUse, NextUseMemo, UsePlan};
use crate::policy::victim::{self, Bandwidth, Takes};

use super::prefetch::Room;
use super::recompute::DropContext;
use super::step::Placement;
use super::{DeviceEngine, Limits, lock};
use crate::policy::handoff::MEASURED_MOVES;

/// How an eviction pass ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Eviction {
    /// The device is at or under the target.
    Reached,
    /// It moved its share of bytes and stopped short.
    Sliced,
    /// Short of the target, with victims left that could not be moved (busy in an op or a
    /// transfer).
    Stuck,
    /// Short of the target, with no victim left on the device: none was found, or every one
    /// found has left it. A pass for the same room now would find none.
    NoVictims,
}

/// Tensors up to this size are evicted in batches (one read, one host buffer): their
/// per-transfer cost is more than their bytes'.
pub(super) const BATCH_TENSOR_MAX: u64 = 256 << 10;

/// The most bytes one batch carries.
pub(super) const BATCH_BYTES: u64 = 4 << 20;

impl DeviceEngine {
    /// Evicts by the policy until device bytes (with those in flight to it) are at most
    /// `target`, taking what `takes` allows, then spills host overflow to disk (left to the I/O
    /// worker, queued by the next `after_op`, when the engine is asynchronous). Returns whether
    /// it got there. On an op's thread the time it takes is stall time: the op waits for it.
    pub(super) fn make_room(&self, target: u64, takes: Takes<u64>) -> bool {
        let start = Instant::now();
        let mut reached = self.evict_until(target, takes);
        let limits = self.limits();
        if !reached && limits.asynchronous && !on_worker() {
            // The tensors left may be busy in a worker's move (an eviction that will free them,
            // a prefetch): let the workers finish, then try again.
            self.quiesce();
            reached = self.evict_until(target, takes);
        }
        if !limits.asynchronous {
            self.spill_host_overflow(&limits);
        }
        if !on_worker() {
            self.ledger.on_stall(start.elapsed());
        }
        reached
    }

    /// Makes `room` for a prefetch on the calling thread, as far as the tensors it may evict
    /// allow (the prefetch waits for another op otherwise).
    ///
    /// Near a tight budget most such passes find no tensor used after the prefetched one, or
    /// take the last ones there are (on the small CNN at 30% of its peak, four in five found
    /// none, each a walk over every tensor): a pass that leaves no victim is remembered, and
    /// the next is skipped while no tensor touched since could be one (see
    /// [`room_still_fruitless`](Self::room_still_fruitless)). A tensor another thread brings
    /// back while the pass runs is not seen as touched: at worst a prefetch then waits until
    /// another touch, or the next step, lets a pass run.
    pub(super) fn make_room_for(&self, room: Room) {
        if self.device_committed() <= room.level {
            return;
        }
        // Only a pass that ranks by the plan leaves out tensors used before the room.
        let (plan, generation) = self.plan_and_generation();
        let plan = plan.filter(|_| self.with_limits(Limits::planning));
        let step = self.recorder.position().0;
        if let Some(plan) = &plan
            && self.room_still_fruitless(plan, generation, room)
        {
            return;
        }
        let start = Instant::now();
        let outcome = self.evict_until_within(room.level, u64::MAX, Takes::UsedAfter(room.beyond));
        if !on_worker() {
            self.ledger.on_stall(start.elapsed());
        }
        let mut index = lock(&self.index);
        if outcome == Eviction::NoVictims && plan.is_some() {
            index.remember_fruitless_room(step, generation, room.beyond);
        } else {
            index.forget_fruitless_room();
        }
    }

    /// Whether a room pass for `room` would find no victim: one found none before (in this
    /// step, under this plan, for a room as late or earlier), and no tensor touched since is
    /// one that pass would have taken (next used after its room and not needed soon: see
    /// [`victims`](Self::victims)).
    fn room_still_fruitless(&self, plan: &Arc<UsePlan>, generation: u64, room: Room) -> bool {
        let (step, now) = self.recorder.position();
        let window = self
            .with_limits(|limits| limits.prefetch_window)
            .min(plan.len());
        let placement = Placement {
            plan: plan.clone(),
            step,
            now,
        };
        let mut index = lock(&self.index);
        // Taken after the index, as a victim pass takes them, and only if a tensor needs them.
        let mut leads = None;
        index.still_fruitless(step, generation, room.beyond, |r, beyond| {
            let next_use = r
                .key
                .map_or(NextUse::Unknown, |k| plan.next_use(*k, step, now));
            if placement.due_of(next_use).is_some_and(|due| due <= beyond) {
                return false;
            }
            !victim::needed_soon(r.prefetched, next_use, window, || {
                let leads = leads.get_or_insert_with(|| lock(&self.leads));
                r.key.and_then(|k| leads.get(&k.key)).copied().unwrap_or(0)
            })
        })
    }

    pub(super) fn evict_until(&self, target: u64, takes: Takes<u64>) -> bool {
        self.evict_until_within(target, u64::MAX, takes) == Eviction::Reached
    }

    /// [`evict_until`](Self::evict_until), stopping once `slice` bytes moved, and taking what
    /// `takes` allows (its positions are absolute: see [`crate::engine::index::absolute`]).
    pub(super) fn evict_until_within(
        &self,
        target: u64,
        slice: u64,
        takes: Takes<u64>,
    ) -> Eviction {
        // Victims come from the index: every tensor must be in it before any may leave.
        self.track_all();
        let mut tried = FastSet::default();
        // Of the tensors tried, those that left the device (moved or dropped).
        let mut left = 0usize;
        let mut evicted = 0u64;
        let drops = self.drop_context(&self.limits());
        loop {
            let committed = self.device_committed();
            if committed <= target {
                return Eviction::Reached;
            }
            if evicted >= slice {
                return Eviction::Sliced;
            }
            let candidates = self.victims(
                Tier::Device,
                committed - target,
                &tried,
                takes,
                drops.as_ref(),
            );
            if candidates.is_empty() {
                return if left == tried.len() {
                    Eviction::NoVictims
                } else {
                    Eviction::Stuck
                };
            }
            let mut moved = Vec::with_capacity(candidates.len());
            let mut dropped = Vec::new();
            let mut batch: Vec<&Candidate> = Vec::with_capacity(candidates.len());
            tried.reserve(candidates.len());
            let mut batch_bytes = 0u64;
            let mut yielded = false;
            for (i, c) in candidates.iter().enumerate() {
                if slice != u64::MAX && self.transfers.urgent_waiting() {
                    // A prefetch came in: an op is about to need it more than this eviction.
                    yielded = true;
                    break;
                }
                tried.insert(c.id);
                if let Some(drops) = &drops
                    && self.try_drop(c, drops)
                {
                    // No bytes move: the tensor is rebuilt from its recipe when next used.
                    dropped.push(c.id);
                    evicted += c.bytes;
                    if self.device_committed() <= target {
                        break;
                    }
                    continue;
                }
                if c.bytes <= BATCH_TENSOR_MAX {
                    // Small tensors go together: one read, one host buffer.
                    batch.push(c);
                    batch_bytes += c.bytes;
                    let last = i + 1 == candidates.len();
                    let enough = self.device_committed().saturating_sub(batch_bytes) <= target;
                    if !(last || enough || batch_bytes >= BATCH_BYTES) {
                        continue;
                    }
                    if self.device_committed() <= target {
                        break;
                    }
                    evicted += self.evict_together(&batch, &mut moved);
                    batch.clear();
                    batch_bytes = 0;
                    continue;
                }
                if self.device_committed() <= target {
                    break;
                }
                if let Some(tier) = c.victim.evict(self) {
                    moved.push((c.id, tier));
                    evicted += c.bytes;
                }
            }
            if !batch.is_empty() && self.device_committed() > target {
                evicted += self.evict_together(&batch, &mut moved);
            }
            left += moved.len() + dropped.len();
            let placement = self.placement();
            let mut index = lock(&self.index);
            let leads = lock(&self.leads);
            let mut wasted = Vec::new();
            for id in dropped {
                wasted.extend(index.take_unread_prefetch(id));
                let rebuild_at = drops.as_ref().and_then(|d| d.rebuild_at(index.key_of(id)));
                index.mark_dropped(id, rebuild_at);
            }
            for (id, tier) in moved {
                wasted.extend(index.take_unread_prefetch(id));
                index.set_tier(id, tier);
                let key = index.key_of(id);
                let lead = key.and_then(|k| leads.get(&k.key)).copied().unwrap_or(0);
                let due = placement.as_ref().and_then(|p| p.due(key, lead));
                index.set_due(id, due);
            }
            drop(leads);
            drop(index);
            if !wasted.is_empty() {
                // Brought back and evicted again unread: the device is too full between the
                // prefetch and the use. Those tensors are fetched nearer that use from now on
                // (a wasted prefetch moves bytes twice for nothing), and after the point where
                // this one was evicted; their other uses keep their own records.
                let mut record = lock(&self.wasted);
                for key in wasted {
                    if let Some((for_use, left)) =
                        placement.as_ref().and_then(|p| p.wasted_use(key))
                    {
                        record.entry(for_use).or_default().strike(Some(left));
                    }
                }
            }
            // Dropping the upgraded handles may run a handle's drop, which takes the index lock.
            drop(candidates);
            if yielded {
                return Eviction::Sliced;
            }
        }
    }

    /// Evicts `batch` in one transfer (or one by one when it is a single tensor), noting which
    /// moved and where; returns their bytes.
    pub(super) fn evict_together(
        &self,
        batch: &[&Candidate],
        moved: &mut Vec<(TensorId, Tier)>,
    ) -> u64 {
        let [first, ..] = batch else {
            return 0;
        };
        if batch.len() == 1 {
            if let Some(tier) = first.victim.evict(self) {
                moved.push((first.id, tier));
                return first.bytes;
            }
            return 0;
        }
        let victims: Vec<Arc<dyn Spillable>> = batch.iter().map(|c| c.victim.clone()).collect();
        let tiers = first.victim.evict_batch(&victims, self);
        let mut bytes = 0;
        for (c, tier) in batch.iter().zip(tiers) {
            if let Some(tier) = tier {
                moved.push((c.id, tier));
                bytes += c.bytes;
            }
        }
        bytes
    }

    /// The next victims of `tier` worth `want` bytes, in the policy's order, of those `takes`
    /// allows (with no known next use a tensor counts as used last). Without a plan (or under
    /// LRU) the coldest first, of all. Tensors whose next use is within the prefetch window are
    /// taken only when nothing else is left. With `drops` that weigh rebuilds
    /// ([`DropContext::weighs_rebuilds`]), a tensor that may be dropped is ranked by the cheaper
    /// of moving and rebuilding it.
    pub(super) fn victims(
        &self,
        tier: Tier,
        want: u64,
        tried: &FastSet<TensorId>,
        takes: Takes<u64>,
        drops: Option<&DropContext>,
    ) -> Vec<Candidate> {
        let limits = self.limits();
        let (plan, generation) = match self.plan_and_generation() {
            (Some(plan), generation) if limits.planning() => (plan, generation),
            _ => return lock(&self.index).coldest(tier, want, tried),
        };
        let (step, now) = self.recorder.position();
        let placement = Placement {
            plan: plan.clone(),
            step,
            now,
        };
        let bandwidth = self.restore_bandwidth(tier);
        let window = limits.prefetch_window.min(plan.len());
        // Kept on the device, the state leaves it only when the other victims fall short (the
        // host tier's victims are not concerned).
        let keeps_state = tier == Tier::Device && self.keeps_state(&limits);
        // The index stays locked through the pass (the leads are taken under it, as the
        // prefetch scan takes them), so that each resident is read and its next use kept in one
        // visit.
        let mut index = lock(&self.index);
        let leads = lock(&self.leads);
        // Needed within the window (plus the lead it earned), or brought back for a use that has
        // not come yet: such tensors leave only when nothing else is left.
        // Sized for every entry at once: growing them a pass took a tenth of it.
        let mut classes = victim::Classes {
            later: Vec::with_capacity(index.len()),
            ..Default::default()
        };
        index.visit_unpinned(tier, tried, |r| {
            // A next use an earlier pass of this step looked up still holds unless the tensor
            // was read since: a pass every few ops would otherwise look up every resident again.
            let (next_use, looked_up) = match r.key.copied() {
                None => (NextUse::Unknown, None),
                Some(key) => match r.next_use.and_then(|m| m.at(generation, key, step, now)) {
                    Some(next) => (next, None),
                    None => {
                        let next = plan.next_use(key, step, now);
                        let memo = NextUseMemo {
                            plan: generation,
                            step,
                            now,
                            key,
                            next,
                        };
                        (next, Some(memo))
                    }
                },
            };
            let used_before = takes
                .beyond()
                .zip(placement.due_of(next_use))
                .is_some_and(|(beyond, due)| due <= beyond);
            if used_before || takes.spares(next_use) {
                return looked_up;
            }
            let lead = || r.key.and_then(|k| leads.get(&k.key)).copied().unwrap_or(0);
            let candidate = victim::Candidate {
                id: r.id,
                bytes: r.bytes,
                last_use: r.last_use,
                next_use,
                rebuild: None,
            };
            if keeps_state && r.key.is_some_and(|k| plan.is_state(k.key)) {
                classes.kept.push(candidate);
            } else if victim::needed_soon(r.prefetched, next_use, window, lead) {
                classes.soon.push(candidate);
            } else {
                classes.later.push(candidate);
            }
            looked_up
        });
        drop(leads);
        if let Some(drops) = drops.filter(|d| d.weighs_rebuilds()) {
            // A rebuild's cost reads its recipe's inputs and the plan under their own locks:
            // priced with the index let go (and the upgraded handles dropped before it is taken
            // again: a handle's drop takes it).
            let upgraded = index.upgrade(classes.later.iter().map(|c| c.id));
            drop(index);
            self.price_rebuilds(&mut classes.later, upgraded, drops);
            index = lock(&self.index);
        }
        let picked = victim::pick(
            limits.policy,
            Some(plan.len()),
            bandwidth,
            &classes,
            want,
            takes,
        );
        index.upgrade(picked)
    }

    /// Sets the rebuild cost of each of `later` that may be dropped (`upgraded`: those still
    /// alive, in the same order).
    fn price_rebuilds(
        &self,
        later: &mut [victim::Candidate],
        upgraded: Vec<Candidate>,
        drops: &DropContext,
    ) {
        let mut upgraded = upgraded.into_iter().peekable();
        for candidate in later {
            if let Some(alive) = upgraded.next_if(|u| u.id == candidate.id) {
                candidate.rebuild = self.rebuild_cost(&alive, drops);
            }
        }
    }

    /// What bringing a tensor back from where a victim of `tier` goes costs, as measured.
    pub(super) fn restore_bandwidth(&self, tier: Tier) -> Bandwidth {
        let (direction, fallback) = match tier {
            Tier::Device => (Direction::HostToDevice, Bandwidth::HOST_DEFAULT),
            _ => (Direction::DiskToDevice, Bandwidth::DISK_DEFAULT),
        };
        let moves = self.ledger.moves(direction);
        let mut bandwidth = Bandwidth::measured(moves.bytes, moves.time, fallback);
        if tier != Tier::Device
            && let Some(cold) = lock(&self.cold).first_throughput()
        {
            // A host victim goes to the first cold store: its own reads are what bringing it
            // back costs (a remote store's can be far from the spill file's).
            bandwidth = Bandwidth::measured(cold.read, cold.read_time, bandwidth);
        }
        // The fixed cost of a transfer is at most what the fastest one took (on a CPU backend a
        // restore is a buffer handover, far below a PCIe round trip).
        if moves.count >= MEASURED_MOVES
            && let Some(fastest) = self.ledger.fastest_move(direction)
        {
            bandwidth.latency = bandwidth.latency.min(fastest);
        }
        bandwidth
    }

    pub(super) fn spill_host_overflow(&self, limits: &Limits) {
        let Some(limit) = limits.host_limit else {
            return;
        };
        let mut tried = FastSet::default();
        loop {
            let resident = self.ledger.resident(Tier::Host);
            if resident <= limit {
                return;
            }
            let candidates = self.victims(Tier::Host, resident - limit, &tried, Takes::Any, None);
            if candidates.is_empty() {
                return;
            }
            let mut moved = Vec::new();
            for c in &candidates {
                tried.insert(c.id);
                if self.ledger.resident(Tier::Host) <= limit {
                    break;
                }
                if c.victim.demote_to_disk(self) {
                    moved.push(c.id);
                }
            }
            let mut index = lock(&self.index);
            for id in moved {
                index.set_tier(id, Tier::Disk);
            }
            drop(index);
            drop(candidates);
        }
    }
}
