//! Which tensors each tier holds, coldest first, and which are pinned by a running op.
//!
//! Victim choice reads this; it holds weak references so that it never keeps a tensor alive, and
//! it is only ever locked while no tensor's own lock is held (see `DeviceEngine`).
//!
//! Every op touches its inputs and outputs, so the order per tier is a queue rather than a
//! sorted tree: a touch appends the tensor again with a new stamp, and the entry it had is left
//! behind, stale, to be skipped when read and dropped when the queue grows to twice the live
//! tensors. A tier's order is therefore the order of last use (device) or of arrival (host,
//! disk).
//!
//! Only a victim pass without a plan (or under LRU) reads that order; while a plan ranks the
//! victims the engine turns the queues off ([`Index::keep_order`]), and touches only restamp
//! the entry: keeping the queues cost a tenth of the engine's work per op under pressure.

use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, Weak};

use super::DeviceEngine;
use super::slot::{TensorId, Tier};
use crate::fast_hash::{FastMap, FastSet};
use crate::policy::plan::{KeyAt, NextUseMemo, PlanKey};

/// A tensor the engine can move. The adapter implements it for its handle.
pub trait Spillable: Send + Sync {
    /// Moves the bytes off the device: to a host buffer, or on to the spill file when the host
    /// tier is full. Returns the tier they went to, or `None` (and changes nothing) when the
    /// tensor is not on the device or is busy in an op.
    fn evict(&self, engine: &DeviceEngine) -> Option<Tier>;
    /// Moves the bytes from the host buffer to the spill file. Returns false when the tensor is
    /// not on the host, is busy, or the write failed (it then stays on the host).
    fn demote_to_disk(&self, engine: &DeviceEngine) -> bool;
    /// Brings the bytes back to the device ahead of need (run by a transfer worker). Returns
    /// false when they were not on the host or disk, or could not be read (the op that needs
    /// them then restores them itself and reports the error).
    fn prefetch(&self, engine: &DeviceEngine) -> bool;
    /// Evicts the tensors of `batch` (this one among them) to the host in one transfer where
    /// the adapter can: one read of them all, one contiguous host buffer. Returns, in order,
    /// where each went (as [`evict`](Self::evict)). The default moves them one by one.
    fn evict_batch(
        &self,
        batch: &[Arc<dyn Spillable>],
        engine: &DeviceEngine,
    ) -> Vec<Option<Tier>> {
        batch.iter().map(|v| v.evict(engine)).collect()
    }
    /// The tensor as `Any`, so that an adapter can find its own handles in a batch.
    fn as_any(&self) -> &dyn std::any::Any;
    /// Notes that the index now holds this tensor, so that its drop removes it from there.
    fn mark_indexed(&self);
    /// What dropping this tensor now would rely on: its recipe's inputs and the cost of a
    /// rebuild. `None` (the default) when it has no recipe or an input is gone.
    fn rebuild_plan(&self) -> Option<RebuildPlan> {
        None
    }
    /// Frees the device bytes and keeps the recipe, holding alive the inputs `leaves` names (of
    /// its recipe, or of the recipes of inputs recomputed as ghosts: see [`RebuildInput`]), to
    /// rebuild them when next used; `transient` is the ghosts' bytes, which the rebuild makes
    /// and lets go. Returns false (and changes nothing) when the tensor is not on the device,
    /// is busy, or an input it relies on is gone.
    fn drop_for_rebuild(
        &self,
        _engine: &DeviceEngine,
        _leaves: &[TensorId],
        _transient: u64,
    ) -> bool {
        false
    }
}

/// What a tensor's recipe needs, for the engine's decision to drop it.
#[derive(Debug, Clone)]
pub struct RebuildPlan {
    /// The recipe's inputs, in argument order, each once.
    pub inputs: smallvec::SmallVec<[RebuildInput; 3]>,
    /// The op's time as last measured (`depth` and `inputs_off_device` are the decision's, from
    /// the inputs it relies on).
    pub rebuild: crate::policy::recompute::Rebuild,
    /// The op's FLOPs and bytes, from its shapes, to model its time on a device.
    pub cost: crate::plan::cost::OpCost,
}

/// One input of a recipe, as the decision to drop sees it: the tensor the program holds, if it
/// still does, and how it could be recomputed if it did not (a ghost).
#[derive(Debug, Clone)]
pub struct RebuildInput {
    /// Its id.
    pub id: TensorId,
    /// Its bytes.
    pub bytes: u64,
    /// While the program holds it (and no op consumed it in place): where its bytes are.
    pub alive: Option<AliveInput>,
    /// Its own recipe, kept with the recipe that reads it, so that it can be recomputed for a
    /// rebuild once the program has let it go.
    pub ghost: Option<Box<GhostPlan>>,
}

/// Where an input a program still holds has its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AliveInput {
    /// Dropped itself: how many dropped tensors its own recipe depended on then.
    pub dropped_depth: Option<u32>,
    /// In the host tier, on disk, or leaving the device.
    pub off_device: bool,
}

/// How an input the program has let go would be recomputed: its op, run again on its own
/// inputs.
#[derive(Debug, Clone)]
pub struct GhostPlan {
    /// The op's inputs, in argument order, each once.
    pub inputs: smallvec::SmallVec<[RebuildInput; 3]>,
    /// The op's time as last measured.
    pub op_time: std::time::Duration,
    /// Its FLOPs and bytes.
    pub cost: crate::plan::cost::OpCost,
}

struct Entry {
    victim: Weak<dyn Spillable>,
    bytes: u64,
    tier: Tier,
    last_use: u64,
    pins: u32,
    /// The tensor's name in the use plan, once it has one.
    key: Option<KeyAt>,
    /// A prefetch for it is queued or running.
    in_flight: bool,
    /// It came back by prefetch and no op has read it since.
    prefetched: bool,
    /// While spilled: the absolute position (see [`absolute`]) from which a prefetch wants it
    /// (its next use, less any lead it earned), if known.
    due: Option<u64>,
    /// The stamp of its current place in its tier's queue (older places are stale).
    stamp: u64,
    /// Dropped from the device, to be rebuilt when next used: in no tier's queue until then.
    dropped: bool,
    /// While dropped: the absolute position of the use that rebuilds it, if the plan knows it.
    rebuild_at: Option<u64>,
    /// Its next use as the last victim pass looked it up (see [`NextUseMemo`]).
    next_use: Option<NextUseMemo>,
}

impl Entry {
    fn new(victim: Weak<dyn Spillable>, bytes: u64, tier: Tier) -> Self {
        Self {
            victim,
            bytes,
            tier,
            last_use: 0,
            pins: 0,
            key: None,
            in_flight: false,
            prefetched: false,
            due: None,
            stamp: 0,
            dropped: false,
            rebuild_at: None,
            next_use: None,
        }
    }
}

/// A position that orders across steps: the step in the high bits, the op in the low ones.
pub(crate) fn absolute(step: u64, op: u32) -> u64 {
    (step << 32) | u64::from(op)
}

/// What the engine knows of an unpinned resident tensor, for the victim policy: borrowed from
/// its entry (a victim pass shows every resident, and copying the key and the memo out of each
/// took a third of the pass).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Resident<'a> {
    pub id: TensorId,
    pub bytes: u64,
    pub last_use: u64,
    pub key: Option<&'a KeyAt>,
    /// Brought back by a prefetch and not read yet.
    pub prefetched: bool,
    /// Its next use as an earlier victim pass looked it up.
    pub next_use: Option<&'a NextUseMemo>,
}

impl<'a> Resident<'a> {
    fn of(id: TensorId, e: &'a Entry) -> Self {
        Self {
            id,
            bytes: e.bytes,
            last_use: e.last_use,
            key: e.key.as_ref(),
            prefetched: e.prefetched,
            next_use: e.next_use.as_ref(),
        }
    }
}

/// A spilled tensor that is not yet on its way back.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spilled {
    pub id: TensorId,
    pub bytes: u64,
    pub tier: Tier,
    pub key: KeyAt,
}

/// What an op's read of a tensor tells the prefetcher.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct InputNote {
    /// It was on the device thanks to a prefetch.
    pub prefetched: bool,
    /// Its key before this read (the one a prefetch would have been planned with).
    pub key_before: Option<KeyAt>,
}

/// A candidate victim, upgraded so it stays alive while it is moved.
pub(crate) struct Candidate {
    pub id: TensorId,
    pub bytes: u64,
    pub victim: Arc<dyn Spillable>,
}

#[derive(Default)]
pub(crate) struct Index {
    entries: FastMap<TensorId, Entry>,
    /// (stamp, id) per tier, oldest first, stale places included (see the module doc). The
    /// disk tier is never a source of victims.
    cold: [VecDeque<(u64, TensorId)>; 3],
    /// The last stamp given.
    stamp: u64,
    /// The queues in `cold` are not kept (see [`Index::keep_order`]): the order is the
    /// entries' stamps, sorted when read.
    unordered: bool,
    /// (due, id) of spilled tensors whose next use is known: what the prefetcher reads, so
    /// that it looks at the few tensors due soon rather than at every spilled one.
    due: BTreeSet<(u64, TensorId)>,
    /// (rebuild position, id) of dropped tensors whose next use is known: the settle keeps
    /// room for those rebuilt within its reach.
    rebuilds: BTreeSet<(u64, TensorId)>,
    /// Output bytes learnt per op signature (see `DeviceEngine::begin_op`). Not the index's
    /// own job, but every op that reads the index reads these too: one lock, not two.
    output_sizes: FastMap<u64, u64>,
    /// The last room pass that found no victim, and the tensors touched since.
    fruitless: Option<FruitlessRoom>,
    /// The engine's clock: the next tick [`next_tick`](Self::next_tick) gives (a use's time,
    /// for LRU order). Kept here, under the index's lock that every use of it takes anyway.
    tick: u64,
}

/// A room pass (tensors next used after `beyond` leave to let a prefetch in) that found no
/// victim, in `step` under the plan numbered `plan`. Until one of the tensors `touched` since
/// (read, made, unpinned or back on the device) is next used after `beyond`, a pass for that
/// room or a later one finds none either: an untouched tensor's next use stays where it was.
#[derive(Debug)]
struct FruitlessRoom {
    step: u64,
    plan: u64,
    beyond: u64,
    touched: Vec<TensorId>,
}

/// Touched tensors a remembered fruitless room pass keeps at most: past that, it is forgotten
/// (the next pass looks at every tensor again) rather than grow while no room is asked for.
const MAX_TOUCHED: usize = 1024;

/// Notes that `id` may have become a victim, while a fruitless room pass is remembered (a field
/// of the index, borrowed beside the entry being changed).
fn touch(fruitless: &mut Option<FruitlessRoom>, id: TensorId) {
    if let Some(room) = fruitless {
        if room.touched.len() >= MAX_TOUCHED {
            *fruitless = None;
        } else {
            room.touched.push(id);
        }
    }
}

/// Output sizes are keyed by op and input sizes; a step's worth of distinct keys is a few
/// thousand, so this bound only guards against unbounded shape churn.
const MAX_OUTPUT_SIZES: usize = 1 << 16;

impl Index {
    /// A new tick of the engine's clock (the time of a use, for LRU order).
    pub fn next_tick(&mut self) -> u64 {
        let tick = self.tick;
        self.tick += 1;
        tick
    }

    /// The output bytes learnt for an op signature, if any.
    pub fn learnt_output(&self, signature: u64) -> Option<u64> {
        self.output_sizes.get(&signature).copied()
    }

    /// Learns an op signature's output bytes. Returns whether the learnt sizes were cleared
    /// first (the map was full).
    pub fn learn_output(&mut self, signature: u64, bytes: u64) -> bool {
        let full = self.output_sizes.len() >= MAX_OUTPUT_SIZES;
        if full {
            self.output_sizes.clear();
        }
        self.output_sizes.insert(signature, bytes);
        full
    }

    /// Puts `id` (an entry of `tier`) at the back of its tier's queue.
    fn enqueue(&mut self, id: TensorId, tier: Tier) {
        let Some(entry) = self.entries.get_mut(&id) else {
            return;
        };
        self.stamp += 1;
        entry.stamp = self.stamp;
        self.push_place(id, tier);
    }

    /// Appends `id`'s new place (the last stamp given, already in its entry) to `tier`'s queue,
    /// dropping the stale places once they outnumber the live ones.
    fn push_place(&mut self, id: TensorId, tier: Tier) {
        if self.unordered {
            return;
        }
        let queue = &mut self.cold[tier.index()];
        queue.push_back((self.stamp, id));
        if queue.len() > 2 * self.entries.len() + 64 {
            let entries = &self.entries;
            queue.retain(|&(stamp, id)| is_current(entries, tier, stamp, id).is_some());
        }
    }

    /// The tensors of `tier`, oldest first.
    fn in_order(&self, tier: Tier) -> impl Iterator<Item = (TensorId, &Entry)> {
        let queue = (!self.unordered).then(|| self.cold[tier.index()].iter().copied());
        let sorted = self.unordered.then(|| self.places_by_stamp(tier));
        queue
            .into_iter()
            .flatten()
            .chain(sorted.into_iter().flatten())
            .filter_map(move |(stamp, id)| Some((id, is_current(&self.entries, tier, stamp, id)?)))
    }

    /// The current places of `tier`'s tensors, oldest first: its queue without stale places.
    fn places_by_stamp(&self, tier: Tier) -> Vec<(u64, TensorId)> {
        let mut places: Vec<_> = self
            .entries
            .iter()
            .filter(|(_, e)| e.tier == tier && !e.dropped)
            .map(|(&id, e)| (e.stamp, id))
            .collect();
        places.sort_unstable();
        places
    }

    /// Keeps each tier's queue in order of use (`true`, the default) or lets it go, when only
    /// a plan ranks victims. Taken up again, the queues are rebuilt from the entries' stamps,
    /// in the order they would have had; in between, a read of the order sorts the stamps.
    pub fn keep_order(&mut self, keep: bool) {
        let ordered = !self.unordered;
        if keep == ordered {
            return;
        }
        self.unordered = !keep;
        for tier in [Tier::Device, Tier::Host, Tier::Disk] {
            self.cold[tier.index()] = if keep {
                self.places_by_stamp(tier).into()
            } else {
                VecDeque::new()
            };
        }
    }

    /// What an op does to one tensor it reads, in one lookup: adds it if new (as an entry of
    /// `tier`), marks it used at `tick`, pins it, and with `note` = (step, position, slot)
    /// notes the read (see `note_entry`).
    pub fn admit_input(
        &mut self,
        id: TensorId,
        bytes: u64,
        tier: Tier,
        tick: u64,
        victim: impl FnOnce() -> Weak<dyn Spillable>,
        note: Option<(u64, u32, u16)>,
    ) -> InputNote {
        let entry = self
            .entries
            .entry(id)
            .or_insert_with(|| Entry::new(victim(), bytes, tier));
        entry.last_use = tick;
        // Pinned, it is no victim: its unpinning counts as the touch.
        entry.pins += 1;
        let read = match note {
            Some((step, now, slot)) => Self::note_entry(entry, step, now, slot),
            None => InputNote::default(),
        };
        self.stamp += 1;
        entry.stamp = self.stamp;
        let tier = entry.tier;
        self.push_place(id, tier);
        read
    }

    /// What an op does to one tensor it produced (and what registering a new tensor does), in
    /// one lookup: adds it if new (on the device), marks it used at `tick` and, with `key`,
    /// names it in the use plan.
    pub fn admit_output(
        &mut self,
        id: TensorId,
        bytes: u64,
        tick: u64,
        victim: impl FnOnce() -> Weak<dyn Spillable>,
        key: Option<KeyAt>,
    ) {
        let entry = self
            .entries
            .entry(id)
            .or_insert_with(|| Entry::new(victim(), bytes, Tier::Device));
        entry.last_use = tick;
        if key.is_some() {
            entry.key = key;
        }
        touch(&mut self.fruitless, id);
        self.stamp += 1;
        entry.stamp = self.stamp;
        let tier = entry.tier;
        self.push_place(id, tier);
    }

    /// Marks a tensor back on the device and used at `tick` (one place in the queue, not two).
    pub fn arrived(&mut self, id: TensorId, tick: u64) {
        if let Some(entry) = self.entries.get_mut(&id) {
            entry.last_use = tick;
            self.set_tier(id, Tier::Device);
        }
    }

    /// Marks a tensor dropped from the device (to be rebuilt by the use at absolute position
    /// `rebuild_at`, if known): no tier offers it as a victim until it arrives again.
    pub fn mark_dropped(&mut self, id: TensorId, rebuild_at: Option<u64>) {
        let Some(entry) = self.entries.get_mut(&id) else {
            return;
        };
        entry.dropped = true;
        if let Some(old) = std::mem::replace(&mut entry.rebuild_at, rebuild_at) {
            self.rebuilds.remove(&(old, id));
        }
        if let Some(at) = rebuild_at {
            self.rebuilds.insert((at, id));
        }
    }

    /// Bytes of the dropped tensors to be rebuilt at absolute positions `from` to `until`,
    /// both included.
    pub fn rebuild_bytes_between(&self, from: u64, until: u64) -> u64 {
        if self.rebuilds.is_empty() || until < from {
            return 0;
        }
        self.rebuilds
            .range((from, TensorId::MIN)..=(until, TensorId::MAX))
            .filter_map(|(_, id)| self.entries.get(id).map(|e| e.bytes))
            .sum()
    }

    pub fn set_tier(&mut self, id: TensorId, tier: Tier) {
        let Some(entry) = self.entries.get_mut(&id) else {
            return;
        };
        entry.tier = tier;
        entry.dropped = false;
        if let Some(at) = entry.rebuild_at.take() {
            self.rebuilds.remove(&(at, id));
        }
        if tier == Tier::Device
            && let Some(due) = entry.due.take()
        {
            self.due.remove(&(due, id));
        }
        if tier == Tier::Device {
            touch(&mut self.fruitless, id);
        }
        self.enqueue(id, tier);
    }

    pub fn unpin(&mut self, id: TensorId) {
        if let Some(entry) = self.entries.get_mut(&id) {
            entry.pins = entry.pins.saturating_sub(1);
            if entry.pins == 0 {
                touch(&mut self.fruitless, id);
            }
        }
    }

    /// Remembers that a room pass for tensors next used after `beyond` found no victim, in
    /// `step` under plan `plan` (see [`FruitlessRoom`]).
    pub fn remember_fruitless_room(&mut self, step: u64, plan: u64, beyond: u64) {
        self.fruitless = Some(FruitlessRoom {
            step,
            plan,
            beyond,
            touched: Vec::new(),
        });
    }

    pub fn forget_fruitless_room(&mut self) {
        self.fruitless = None;
    }

    /// Whether a remembered fruitless pass covers a room for tensors next used after `beyond`
    /// in `step` under plan `plan` (the same room or a later one), and still holds: `takes`,
    /// shown each tensor touched since as a device victim pass would show it (with the pass's
    /// own `beyond`), would take none. The list then starts again empty; a tensor taken
    /// forgets the pass.
    pub fn still_fruitless(
        &mut self,
        step: u64,
        plan: u64,
        beyond: u64,
        mut takes: impl FnMut(&Resident, u64) -> bool,
    ) -> bool {
        let Index {
            entries, fruitless, ..
        } = self;
        let Some(room) = fruitless else {
            return false;
        };
        if room.step != step || room.plan != plan || room.beyond > beyond {
            return false;
        }
        let taken = room.touched.iter().any(|&id| {
            entries
                .get(&id)
                .filter(|e| Self::offered(Tier::Device, e))
                .is_some_and(|e| takes(&Resident::of(id, e), room.beyond))
        });
        if taken {
            *fruitless = None;
        } else {
            room.touched.clear();
        }
        !taken
    }

    /// Whether a victim pass of `tier` shows `e`.
    fn offered(tier: Tier, e: &Entry) -> bool {
        e.tier == tier && !e.dropped && e.pins == 0 && !e.in_flight
    }

    pub fn remove(&mut self, id: TensorId) {
        let Some(entry) = self.entries.remove(&id) else {
            return;
        };
        if let Some(due) = entry.due {
            self.due.remove(&(due, id));
        }
        if let Some(at) = entry.rebuild_at {
            self.rebuilds.remove(&(at, id));
        }
    }

    /// The tier tensor `id` is in, if indexed.
    #[cfg(test)]
    pub fn tier_of(&self, id: TensorId) -> Option<Tier> {
        self.entries.get(&id).map(|e| e.tier)
    }

    /// The key of a tensor, if it has one.
    pub fn key_of(&self, id: TensorId) -> Option<KeyAt> {
        self.entries.get(&id).and_then(|e| e.key)
    }

    /// Sets (or clears) the position from which a spilled tensor is due for a prefetch.
    pub fn set_due(&mut self, id: TensorId, due: Option<u64>) {
        let Some(entry) = self.entries.get_mut(&id) else {
            return;
        };
        // The prefetch scan places the tensors near the window again after every op, mostly
        // where they already are: then the ordered set is left alone.
        if due.is_some() && entry.due == due && entry.tier != Tier::Device {
            return;
        }
        if let Some(old) = entry.due.take() {
            self.due.remove(&(old, id));
        }
        if entry.tier != Tier::Device
            && let Some(due) = due
        {
            entry.due = Some(due);
            self.due.insert((due, id));
        }
    }

    /// If `id` came back by prefetch and is leaving again unread, clears that and returns the
    /// key it was prefetched under: the prefetch was wasted.
    pub fn take_unread_prefetch(&mut self, id: TensorId) -> Option<KeyAt> {
        let entry = self.entries.get_mut(&id)?;
        std::mem::take(&mut entry.prefetched).then_some(entry.key?)
    }

    /// Notes that input `slot` of the op at position `now` of step `step` reads `entry`: a
    /// tensor not keyed in this step is named after this read, and a prefetched one counts as a
    /// hit.
    fn note_entry(entry: &mut Entry, step: u64, now: u32, slot: u16) -> InputNote {
        let note = InputNote {
            prefetched: std::mem::take(&mut entry.prefetched),
            key_before: entry.key,
        };
        if entry.key.is_none_or(|k| k.step != step) {
            entry.key = Some(KeyAt {
                step,
                key: PlanKey::Input { op: now, slot },
            });
        }
        note
    }

    /// Shows `visit` each unpinned live tensor of `tier` not in `tried`, in no particular order
    /// (the victim policies rank them all: walking the tier's queue in LRU order would also walk
    /// its stale places, with a lookup each). A next use `visit` returns is kept with the tensor
    /// for later passes (see [`NextUseMemo`]).
    pub fn visit_unpinned(
        &mut self,
        tier: Tier,
        tried: &FastSet<TensorId>,
        mut visit: impl FnMut(&Resident) -> Option<NextUseMemo>,
    ) {
        for (&id, e) in self.entries.iter_mut() {
            if !Self::offered(tier, e) || (!tried.is_empty() && tried.contains(&id)) {
                continue;
            }
            if let Some(memo) = visit(&Resident::of(id, e)) {
                e.next_use = Some(memo);
            }
        }
    }

    /// Upgrades the given tensors (those still alive), in order.
    pub fn upgrade(&self, ids: impl IntoIterator<Item = TensorId>) -> Vec<Candidate> {
        ids.into_iter()
            .filter_map(|id| {
                let entry = self.entries.get(&id)?;
                let victim = entry.victim.upgrade()?;
                Some(Candidate {
                    id,
                    bytes: entry.bytes,
                    victim,
                })
            })
            .collect()
    }

    /// The dropped tensors to be rebuilt at absolute positions up to `until`, with their keys
    /// and bytes.
    pub fn rebuilds_until(&self, until: u64) -> Vec<(TensorId, KeyAt, u64)> {
        self.rebuilds
            .range(..=(until, TensorId::MAX))
            .filter_map(|&(_, id)| {
                let e = self.entries.get(&id)?;
                Some((id, e.key?, e.bytes))
            })
            .collect()
    }

    /// Spilled tensors with a key, no prefetch under way and placed at or before `until`
    /// (absolute; see `set_due`), soonest first.
    pub fn due_until(&self, until: u64) -> Vec<Spilled> {
        self.due
            .range(..=(until, TensorId::MAX))
            .filter_map(|&(_, id)| {
                let e = &self.entries[&id];
                let key = e.key.filter(|_| !e.in_flight && e.tier != Tier::Device)?;
                Some(Spilled {
                    id,
                    bytes: e.bytes,
                    tier: e.tier,
                    key,
                })
            })
            .collect()
    }

    /// Every spilled tensor with a key (to place them all again under a new plan).
    pub fn spilled_keys(&self) -> Vec<(TensorId, KeyAt)> {
        [Tier::Host, Tier::Disk]
            .into_iter()
            .flat_map(|tier| self.in_order(tier))
            .filter_map(|(id, e)| Some((id, e.key?)))
            .collect()
    }

    /// Marks a prefetch of `id` as queued; returns the tensor, or `None` if it is gone.
    pub fn start_flight(&mut self, id: TensorId) -> Option<Arc<dyn Spillable>> {
        let entry = self.entries.get_mut(&id)?;
        let victim = entry.victim.upgrade()?;
        entry.in_flight = true;
        Some(victim)
    }

    /// Ends a prefetch of `id`; an arrived tensor is on the device, used now, and a hit-to-be.
    pub fn end_flight(&mut self, id: TensorId, arrived: bool, tick: u64) {
        let Some(entry) = self.entries.get_mut(&id) else {
            return;
        };
        entry.in_flight = false;
        if arrived {
            entry.prefetched = true;
            self.arrived(id, tick);
        }
    }

    /// Tensors indexed, in every tier.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The coldest unpinned live tensors of `tier`, not in `tried`, until their bytes reach
    /// `want` (at least one when any exists).
    pub fn coldest(&self, tier: Tier, want: u64, tried: &FastSet<TensorId>) -> Vec<Candidate> {
        if tier == Tier::Disk {
            return Vec::new();
        }
        let mut picked = Vec::new();
        let mut bytes = 0u64;
        for (id, entry) in self.in_order(tier) {
            if bytes >= want && !picked.is_empty() {
                break;
            }
            if entry.pins > 0 || entry.in_flight || tried.contains(&id) {
                continue;
            }
            if let Some(victim) = entry.victim.upgrade() {
                bytes += entry.bytes;
                picked.push(Candidate {
                    id,
                    bytes: entry.bytes,
                    victim,
                });
            }
        }
        picked
    }
}

/// The entry of `id` if `stamp` is its current place in `tier`'s queue.
fn is_current(
    entries: &FastMap<TensorId, Entry>,
    tier: Tier,
    stamp: u64,
    id: TensorId,
) -> Option<&Entry> {
    entries
        .get(&id)
        .filter(|e| e.stamp == stamp && e.tier == tier && !e.dropped)
}

#[cfg(test)]
pub(crate) mod tests {
    #[test]
    fn output_sizes_are_learnt_per_signature_and_bounded() {
        let mut index = Index::default();
        assert_eq!(index.learnt_output(7), None);
        index.learn_output(7, 1024);
        index.learn_output(8, 64);
        assert_eq!(
            (index.learnt_output(7), index.learnt_output(8)),
            (Some(1024), Some(64))
        );
        index.learn_output(7, 2048);
        assert_eq!(
            index.learnt_output(7),
            Some(2048),
            "a changed size replaces the old"
        );
        for signature in 100..100 + MAX_OUTPUT_SIZES as u64 {
            index.learn_output(signature, 1);
        }
        assert!(
            index.output_sizes.len() <= MAX_OUTPUT_SIZES,
            "the map stays bounded"
        );
        assert_eq!(index.learnt_output(7), None, "a full map starts over");
    }

    use super::*;

    /// A tensor the engine's tests index: it moves and drops nothing.
    pub(crate) struct Fake;

    impl Spillable for Fake {
        fn evict(&self, _: &DeviceEngine) -> Option<Tier> {
            Some(Tier::Host)
        }
        fn demote_to_disk(&self, _: &DeviceEngine) -> bool {
            true
        }
        fn prefetch(&self, _: &DeviceEngine) -> bool {
            true
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
        fn mark_indexed(&self) {}
    }

    #[test]
    fn a_due_set_again_is_placed_once_and_moves_when_it_changes() {
        let alive: Arc<dyn Spillable> = Arc::new(Fake);
        let mut index = Index::default();
        let key = KeyAt {
            step: 0,
            key: PlanKey::Produced { op: 0, slot: 0 },
        };
        index.admit_output(1, 10, 0, || Arc::downgrade(&alive), Some(key));
        index.set_tier(1, Tier::Host);
        let due = |index: &Index, until| {
            index
                .due_until(until)
                .iter()
                .map(|s| s.id)
                .collect::<Vec<_>>()
        };
        index.set_due(1, Some(5));
        index.set_due(1, Some(5));
        assert_eq!(due(&index, 5), vec![1], "placed once");
        index.set_due(1, Some(8));
        assert!(due(&index, 7).is_empty(), "moved from 5");
        assert_eq!(due(&index, 8), vec![1]);
        index.set_due(1, None);
        assert!(due(&index, u64::MAX - 1).is_empty(), "cleared");
        index.set_due(1, Some(8));
        index.set_tier(1, Tier::Device);
        index.set_due(1, Some(8));
        assert!(
            due(&index, u64::MAX - 1).is_empty(),
            "a tensor on the device is not due"
        );
    }

    #[test]
    fn dropped_tensors_count_by_where_they_are_rebuilt_until_they_are_back_or_gone() {
        let alive: Arc<dyn Spillable> = Arc::new(Fake);
        let mut index = Index::default();
        for (id, bytes) in [(1, 10), (2, 20), (3, 40), (4, 80)] {
            index.admit_output(id, bytes, 0, || Arc::downgrade(&alive), None);
        }
        index.mark_dropped(1, Some(5));
        index.mark_dropped(2, Some(7));
        index.mark_dropped(3, Some(9));
        index.mark_dropped(4, None);
        assert_eq!(index.rebuild_bytes_between(5, 7), 30, "both ends included");
        assert_eq!(index.rebuild_bytes_between(6, 100), 60);
        assert_eq!(index.rebuild_bytes_between(7, 6), 0);
        index.mark_dropped(3, Some(6));
        assert_eq!(index.rebuild_bytes_between(8, 9), 0, "moved from 9");
        assert_eq!(index.rebuild_bytes_between(6, 6), 40);
        index.set_tier(2, Tier::Device);
        assert_eq!(
            index.rebuild_bytes_between(0, 100),
            50,
            "rebuilt: back on the device"
        );
        index.remove(1);
        assert_eq!(
            index.rebuild_bytes_between(0, 100),
            40,
            "its last handle gone"
        );
        assert_eq!(index.rebuilds.len(), 1);
    }

    #[test]
    fn coldest_first_skipping_pinned_dead_and_tried() {
        let alive: Vec<Arc<dyn Spillable>> = (0..4)
            .map(|_| Arc::new(Fake) as Arc<dyn Spillable>)
            .collect();
        let dead: Weak<dyn Spillable> = Arc::downgrade(&(Arc::new(Fake) as Arc<dyn Spillable>));
        let mut index = Index::default();
        for (i, v) in alive.iter().enumerate() {
            index.admit_output(i as u64, 10, i as u64, || Arc::downgrade(v), None);
        }
        index.admit_output(9, 10, 0, || dead.clone(), None);
        index.admit_output(0, 10, 100, || Arc::downgrade(&alive[0]), None); // now the hottest
        index.admit_input(1, 10, Tier::Device, 1, || Arc::downgrade(&alive[1]), None); // pinned
        let ids = |c: Vec<Candidate>| c.iter().map(|c| c.id).collect::<Vec<_>>();
        assert_eq!(
            ids(index.coldest(Tier::Device, 15, &FastSet::default())),
            vec![2, 3]
        );
        assert_eq!(
            ids(index.coldest(Tier::Device, 1000, &FastSet::from_iter([2]))),
            vec![3, 0]
        );
        index.unpin(1);
        index.set_tier(1, Tier::Host);
        assert_eq!(
            ids(index.coldest(Tier::Host, 1, &FastSet::default())),
            vec![1]
        );
        index.remove(1);
        assert!(index.coldest(Tier::Host, 1, &FastSet::default()).is_empty());
        assert_eq!(index.len(), 4);
    }

    #[test]
    fn a_fruitless_room_pass_holds_until_a_tensor_touched_since_would_be_taken() {
        let alive: Vec<Arc<dyn Spillable>> = (0..4)
            .map(|_| Arc::new(Fake) as Arc<dyn Spillable>)
            .collect();
        let weak = |id: u64| Arc::downgrade(&alive[id as usize]);
        // The tensors `still_fruitless` shows, none taken.
        let shown = |index: &mut Index, step, plan, beyond| {
            let mut seen = Vec::new();
            let still = index.still_fruitless(step, plan, beyond, |r, pass_beyond| {
                assert_eq!(pass_beyond, 40, "checked against the pass's own room");
                seen.push(r.id);
                false
            });
            still.then_some(seen)
        };
        let mut index = Index::default();
        index.admit_output(0, 10, 0, || weak(0), None);
        index.set_tier(0, Tier::Host);
        index.admit_output(1, 10, 0, || weak(1), None);
        assert_eq!(shown(&mut index, 3, 7, 50), None, "none remembered");

        index.remember_fruitless_room(3, 7, 40);
        index.admit_output(2, 10, 1, || weak(2), None);
        index.admit_input(1, 10, Tier::Device, 2, || weak(1), None);
        index.admit_input(1, 10, Tier::Device, 2, || weak(1), None);
        index.unpin(1);
        index.admit_input(3, 10, Tier::Device, 2, || weak(3), None);
        index.set_tier(0, Tier::Device);
        index.set_tier(2, Tier::Host);
        assert_eq!(
            shown(&mut index, 3, 7, 40),
            Some(vec![0]),
            "back on the device; not what was made and left, nor what is still pinned"
        );
        index.unpin(1);
        index.unpin(3);
        assert_eq!(
            shown(&mut index, 3, 7, 60),
            Some(vec![1, 3]),
            "unpinned, once the last pin went; a later room is covered too"
        );
        assert_eq!(shown(&mut index, 3, 7, 40), Some(Vec::new()));
        for (step, plan, beyond) in [(4, 7, 40), (3, 8, 40), (3, 7, 39)] {
            assert_eq!(
                shown(&mut index, step, plan, beyond),
                None,
                "not in another step, under another plan, or for an earlier room"
            );
        }

        index.set_tier(2, Tier::Device);
        assert!(!index.still_fruitless(3, 7, 40, |r, _| r.id == 2));
        assert_eq!(
            shown(&mut index, 3, 7, 40),
            None,
            "a tensor it would take forgets the pass"
        );

        index.remember_fruitless_room(3, 7, 40);
        for _ in 0..MAX_TOUCHED {
            index.set_tier(1, Tier::Device);
        }
        assert!(index.fruitless.is_some(), "kept until the list is full");
        index.set_tier(1, Tier::Device);
        assert_eq!(
            shown(&mut index, 3, 7, 40),
            None,
            "forgotten rather than grown past its bound"
        );
        index.remember_fruitless_room(3, 7, 40);
        index.forget_fruitless_room();
        assert_eq!(shown(&mut index, 3, 7, 40), None);
    }

    #[test]
    fn without_its_queues_a_tier_keeps_its_order_and_gets_them_back_in_it() {
        let alive: Vec<Arc<dyn Spillable>> = (0..4)
            .map(|_| Arc::new(Fake) as Arc<dyn Spillable>)
            .collect();
        let touch = |index: &mut Index, id: u64, tick: u64| {
            index.admit_output(id, 10, tick, || Arc::downgrade(&alive[id as usize]), None);
        };
        let ids = |c: Vec<Candidate>| c.iter().map(|c| c.id).collect::<Vec<_>>();
        let coldest = |index: &Index| ids(index.coldest(Tier::Device, 1000, &FastSet::default()));
        let mut index = Index::default();
        for id in 0..4 {
            touch(&mut index, id, id);
        }
        index.keep_order(false);
        for (tick, id) in [(10, 0), (11, 2), (12, 0)] {
            touch(&mut index, id, tick);
        }
        index.set_tier(3, Tier::Host);
        assert_eq!(coldest(&index), vec![1, 2, 0], "sorted from the stamps");
        assert!(
            index.cold.iter().all(VecDeque::is_empty),
            "no queue is kept meanwhile"
        );
        index.keep_order(true);
        assert_eq!(
            index.cold[Tier::Device.index()].len(),
            3,
            "rebuilt with one place per tensor"
        );
        assert_eq!(coldest(&index), vec![1, 2, 0]);
        touch(&mut index, 1, 20);
        assert_eq!(coldest(&index), vec![2, 0, 1], "and kept again");
        assert_eq!(
            ids(index.coldest(Tier::Host, 1000, &FastSet::default())),
            vec![3]
        );
    }

    #[test]
    fn touches_leave_stale_places_that_are_skipped_and_compacted() {
        let alive: Vec<Arc<dyn Spillable>> = (0..3)
            .map(|_| Arc::new(Fake) as Arc<dyn Spillable>)
            .collect();
        let mut index = Index::default();
        for (i, v) in alive.iter().enumerate() {
            index.admit_output(i as u64, 10, i as u64, || Arc::downgrade(v), None);
        }
        // Touch 0 and 1 many times, 1 last: the order is 2, 0, 1.
        for tick in 10..1_000 {
            let id = tick % 2;
            index.admit_output(id, 10, tick, || Arc::downgrade(&alive[id as usize]), None);
        }
        let ids = |c: Vec<Candidate>| c.iter().map(|c| c.id).collect::<Vec<_>>();
        assert_eq!(
            ids(index.coldest(Tier::Device, 1000, &FastSet::default())),
            vec![2, 0, 1]
        );
        assert!(
            index.cold[Tier::Device.index()].len() <= 2 * 3 + 64 + 1,
            "stale places are dropped as the queue grows"
        );
        let mut unpinned = 0;
        index.visit_unpinned(Tier::Device, &FastSet::default(), |_| {
            unpinned += 1;
            None
        });
        assert_eq!(unpinned, 3);
    }
}
