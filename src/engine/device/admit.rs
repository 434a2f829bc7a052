//! Admitting one op: its inputs pinned and counted, room made for them and its estimated
//! output before `B` runs it, and after it the outputs indexed, the estimate learnt and an op
//! over the budget reported.

use std::hash::Hasher;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use crate::engine::index::{Index, Spillable};
use crate::engine::slot::{TensorId, Tier};
use crate::fast_hash::FastHasher;
use crate::policy::plan::{KeyAt, PlanKey};
use crate::policy::victim::Takes;

use super::{DeviceEngine, lock};
use crate::policy::prefetch::lead_after_late;

/// One tensor an op reads.
pub struct OpInput {
    /// Its id.
    pub id: TensorId,
    /// Its bytes.
    pub bytes: u64,
    /// The tier holding it now.
    pub tier: Tier,
    /// Whether it may be moved off the device (strided views may not).
    pub evictable: bool,
    /// The handle, for the index when it does not hold the tensor yet; `None` when the handle
    /// says the index holds it (a weak reference made and dropped for nothing was two atomic
    /// read-modify-writes per input).
    pub victim: Option<Weak<dyn Spillable>>,
    /// Dropped from the device: it is rebuilt before the op runs, so its bytes count as bytes
    /// that come back (its `tier` says `Device`).
    pub dropped: bool,
    /// When dropped: bytes of the ghosts its rebuild recomputes and lets go, on the device
    /// while it runs.
    pub rebuild_transient: u64,
    /// Not read by the op itself: an input of a dropped one's recipe, pinned and made
    /// resident for the rebuild (not a read the plan or the prefetch hit rate counts).
    pub for_rebuild: bool,
}

/// One tensor an op produced.
pub struct OpOutput {
    /// Its id.
    pub id: TensorId,
    /// Its bytes.
    pub bytes: u64,
    /// Whether it may be moved off the device.
    pub evictable: bool,
    /// The handle, for the index.
    pub victim: Weak<dyn Spillable>,
}

/// What `begin_op` learned, handed back to `end_op`.
#[derive(Debug)]
pub struct OpTicket {
    name: &'static str,
    budget: u64,
    strict: bool,
    signature: u64,
    /// The output size learnt for this signature before, if any.
    learnt: Option<u64>,
    /// Bytes reserved at admission (inputs to restore, the estimated output), released when
    /// the op ends (its inputs and outputs are in the ledger by then).
    reserved: u64,
    inputs: smallvec::SmallVec<[TensorId; 4]>,
    /// The engine's clock when the op was admitted: its inputs' and outputs' last use.
    tick: u64,
    /// Bytes of the evictable inputs (the others are in the ledger's unevictable count).
    evictable_input_bytes: u64,
    /// The step and the op's position in it, for the outputs' plan keys.
    step: u64,
    position: u32,
    planning: bool,
}

/// The key output sizes are learnt under: the op, the arguments that decide its output size
/// (`hint`) and its inputs' sizes in order. Op names are `&'static str`s, so the name's address
/// and length identify the op within the process (one word to hash, not one per letter).
pub(super) fn op_signature(
    name: &'static str,
    hint: u64,
    input_bytes: impl Iterator<Item = u64>,
) -> u64 {
    let mut hasher = FastHasher::default();
    hasher.write_u64(name.as_ptr() as u64 ^ (name.len() as u64) << 48);
    hasher.write_u64(hint);
    for bytes in input_bytes {
        hasher.write_u64(bytes);
    }
    hasher.finish()
}

impl DeviceEngine {
    /// Pins `inputs` and evicts other tensors until the inputs that must be restored plus the
    /// estimated output fit the budget. `hint` folds in the non-tensor arguments that decide
    /// the output size; `known_output` is the output's size where the arguments give it (an op
    /// that creates a tensor from a shape and dtype), used until one is learnt. Returns `None`
    /// when no budget is in force.
    pub fn begin_op(
        &self,
        name: &'static str,
        inputs: &[OpInput],
        hint: u64,
        known_output: Option<u64>,
    ) -> Option<OpTicket> {
        let (budget, planning, prefetching, strict) = self.with_limits(|limits| {
            let budget = limits.budget?;
            Some((
                budget,
                limits.planning(),
                limits.prefetch_window > 0,
                limits.strict,
            ))
        })?;
        let (step, position) = self.recorder.position();
        if planning {
            self.step_changed(step);
        }
        let has_plan = planning && self.plan_headroom.load(Ordering::Relaxed) > 0;
        let (mut hits, mut misses) = (0u64, 0u64);
        let mut late = Vec::new();
        let tick;
        let mut ids = smallvec::SmallVec::<[TensorId; 4]>::new();
        let (mut input_bytes, mut to_restore, mut largest) = (0u64, 0u64, 0u64);
        let mut evictable_input_bytes = 0u64;
        let signature = op_signature(name, hint, inputs.iter().map(|i| i.bytes));
        let (learnt, estimate, reserved);
        // Inputs the index takes in now: marked as indexed once their entry exists, and let go
        // after the index's lock (a handle's drop takes it).
        let mut newly_indexed = smallvec::SmallVec::<[Arc<dyn Spillable>; 2]>::new();
        {
            let mut index = lock(&self.index);
            tick = index.next_tick();
            for (slot, input) in inputs.iter().enumerate() {
                let first = !ids.contains(&input.id);
                let note = input.evictable.then(|| {
                    let reads = first && planning && !input.for_rebuild;
                    let at = reads.then_some((step, position, slot as u16));
                    index.admit_input(
                        input.id,
                        input.bytes,
                        input.tier,
                        tick,
                        || {
                            let victim = input.victim.clone().unwrap_or_else(|| {
                                panic!(
                                    "burn-spill: tensor {} says it is indexed but the index does \
                                     not hold it; this is a bug in burn-spill",
                                    input.id
                                )
                            });
                            // Marked only now that its entry exists, so that an op on another
                            // thread that reads the mark finds the entry.
                            if let Some(handle) = victim.upgrade() {
                                handle.mark_indexed();
                                newly_indexed.push(handle);
                            }
                            victim
                        },
                        at,
                    )
                });
                if !first {
                    ids.push(input.id);
                    continue;
                }
                if input.for_rebuild || input.dropped {
                    // Rebuilt, not brought back: neither a prefetch hit nor a miss.
                } else if let (Some(note), true) = (note, planning) {
                    if input.tier != Tier::Device {
                        misses += 1;
                        if let Some(key) = note.key_before.filter(|_| has_plan) {
                            late.push(key.key);
                        }
                    } else if note.prefetched {
                        hits += 1;
                    }
                } else if input.evictable && input.tier != Tier::Device {
                    misses += 1;
                }
                ids.push(input.id);
                input_bytes += input.bytes;
                if input.evictable {
                    evictable_input_bytes += input.bytes;
                }
                largest = largest.max(input.bytes);
                if input.tier != Tier::Device || input.dropped {
                    to_restore += input.bytes + input.rebuild_transient;
                }
            }
            learnt = index.learnt_output(signature);
            estimate = learnt.or(known_output).unwrap_or(largest);
            // The inputs to restore and the output are reserved before room is made, so that
            // ops admitted on other threads meanwhile count them too (and this op counts
            // theirs): two ops may both make room for both, never neither for the other. An op
            // that strict mode refuses below reserves nothing.
            reserved = if input_bytes > budget && strict {
                0
            } else {
                to_restore.saturating_add(estimate)
            };
            self.add_reserved(&mut index, reserved);
        }
        drop(newly_indexed);
        self.ledger.on_prefetch_outcome(hits, misses);
        if !late.is_empty() && prefetching {
            self.lengthen_leads(&late);
        }
        if input_bytes > budget && strict {
            self.finish_pins(&ids);
            panic!(
                "burn-spill (strict): op `{name}` needs {input_bytes} bytes of inputs on the device, \
                 more than the device budget of {budget} bytes; raise the budget or turn strict mode off"
            );
        }
        if self.device_committed() > budget {
            // The op's inputs are pinned: the pass may take any other tensor.
            self.ledger
                .engine_work(false, || self.make_room(budget, Takes::Any));
        }
        Some(OpTicket {
            name,
            budget,
            strict,
            signature,
            learnt,
            tick,
            reserved,
            inputs: ids,
            evictable_input_bytes,
            step,
            position,
            planning,
        })
    }

    /// Unpins the inputs, indexes the outputs, learns the output size and counts an op that ran
    /// over the budget. Call it while the consumed inputs are still counted (before they drop),
    /// so that the device bytes seen here are the op's real peak.
    ///
    /// The outputs are taken by value: a new one's weak handle moves into the index (a clone
    /// would be one more atomic read-modify-write per output).
    pub fn end_op(&self, ticket: OpTicket, outputs: impl IntoIterator<Item = OpOutput>) {
        let tick = ticket.tick;
        let (mut output_bytes, mut evictable_output_bytes) = (0u64, 0u64);
        let mut counted = smallvec::SmallVec::<[TensorId; 2]>::new();
        {
            let mut index = lock(&self.index);
            self.release_reserved(&mut index, ticket.reserved);
            for id in &ticket.inputs {
                index.unpin(*id);
            }
            for (i, out) in outputs.into_iter().enumerate() {
                // An op may return the same tensor twice: its bytes count once.
                if !counted.contains(&out.id) {
                    counted.push(out.id);
                    output_bytes += out.bytes;
                    if out.evictable {
                        evictable_output_bytes += out.bytes;
                    }
                }
                if out.evictable {
                    let key = ticket.planning.then_some(KeyAt {
                        step: ticket.step,
                        key: PlanKey::Produced {
                            op: ticket.position,
                            slot: i as u16,
                        },
                    });
                    index.admit_output(out.id, out.bytes, tick, || out.victim, key);
                }
            }
            // Most ops repeat a learnt size: the map is written only when it changes.
            if ticket.learnt != Some(output_bytes) {
                self.learn_output(&mut index, ticket.signature, output_bytes);
            }
        }
        let resident = self.ledger.resident(Tier::Device);
        if resident > ticket.budget {
            // What no eviction could have freed: this op's own tensors and the unevictable ones.
            let unavoidable =
                ticket.evictable_input_bytes + evictable_output_bytes + self.ledger.unevictable();
            if unavoidable > ticket.budget {
                self.over_budget(&ticket, resident);
            } else {
                self.ledger.on_estimate_miss();
            }
        }
    }

    /// Ends an op that produced no tensor (a read, a metadata query).
    pub fn end_op_without_outputs(&self, ticket: OpTicket) {
        let mut index = lock(&self.index);
        self.release_reserved(&mut index, ticket.reserved);
        for id in &ticket.inputs {
            index.unpin(*id);
        }
    }

    /// Adds `bytes` to the bytes reserved by running ops. Every writer holds the index's lock
    /// (`_locked`), so a load and a store do what a read-modify-write would, without its
    /// atomic instruction; readers ([`device_committed`](Self::device_committed)) read it
    /// without the lock.
    fn add_reserved(&self, _locked: &mut Index, bytes: u64) {
        let now = self.reserved_for_ops.load(Ordering::Relaxed);
        self.reserved_for_ops.store(now + bytes, Ordering::Relaxed);
    }

    /// Gives back bytes [`add_reserved`](Self::add_reserved) reserved (same rule: the index's
    /// lock is held).
    fn release_reserved(&self, _locked: &mut Index, bytes: u64) {
        let now = self.reserved_for_ops.load(Ordering::Relaxed);
        debug_assert!(now >= bytes, "released {bytes} of {now} reserved bytes");
        self.reserved_for_ops
            .store(now.saturating_sub(bytes), Ordering::Relaxed);
    }

    pub(super) fn finish_pins(&self, ids: &[TensorId]) {
        let mut index = lock(&self.index);
        for id in ids {
            index.unpin(*id);
        }
    }

    pub(super) fn over_budget(&self, ticket: &OpTicket, held: u64) {
        self.ledger.on_over_budget(held);
        if ticket.strict {
            panic!(
                "burn-spill (strict): op `{}` needed {held} bytes on the device (its inputs and outputs \
                 plus {} bytes that may not be evicted), more than the device budget of {} bytes; \
                 raise the budget or turn strict mode off",
                ticket.name,
                self.ledger.unevictable(),
                ticket.budget
            );
        }
        if lock(&self.warned_ops).insert(ticket.name) {
            tracing::warn!(
                target: "burn_spill::budget",
                op = ticket.name,
                held_bytes = held,
                budget_bytes = ticket.budget,
                "op needs more device memory than the budget and runs over it (logged once per op kind)"
            );
        }
    }

    /// Learns `signature`'s output size in the index (locked by the caller) and in the memo of
    /// known sizes.
    pub(super) fn learn_output(&self, index: &mut Index, signature: u64, bytes: u64) {
        match index.learnt_output(signature) {
            Some(learnt) if learnt == bytes => {}
            learnt => {
                if let Some(learnt) = learnt {
                    self.known_sizes.remove(signature, learnt);
                }
                if index.learn_output(signature, bytes) {
                    self.known_sizes.clear();
                }
            }
        }
        self.known_sizes.insert(signature, bytes);
    }

    /// Device bytes that count against the budget: resident, on their way in, and reserved
    /// for the outputs of ops running now.
    pub(super) fn device_committed(&self) -> u64 {
        self.ledger.resident(Tier::Device)
            + self.inflight_in.load(Ordering::Relaxed)
            + self.reserved_for_ops.load(Ordering::Relaxed)
    }
}

impl DeviceEngine {
    /// Capuchin's rule: a tensor that came late is asked for earlier next step. Its key's lead
    /// grows, and any spilled tensor under a key whose lead grew is placed again that much
    /// earlier (the prefetch scan finds a tensor where it was placed; see `Placement::due`).
    fn lengthen_leads(&self, late: &[PlanKey]) {
        let mut grown = smallvec::SmallVec::<[PlanKey; 4]>::new();
        {
            let mut leads = lock(&self.leads);
            for key in late {
                let lead = leads.entry(*key).or_default();
                let longer = lead_after_late(*lead);
                if longer != *lead {
                    *lead = longer;
                    grown.push(*key);
                }
            }
        }
        // Leads stop growing at their cap, after which most late arrivals change nothing and
        // the index is not locked.
        if grown.is_empty() {
            return;
        }
        let Some(placement) = self.placement() else {
            return;
        };
        // The index before the leads, as every pass that holds both takes them.
        let mut index = lock(&self.index);
        let leads = lock(&self.leads);
        for (id, key) in index.spilled_keys() {
            if grown.contains(&key.key) {
                let lead = leads.get(&key.key).copied().unwrap_or(0);
                index.set_due(id, placement.due(Some(key), lead));
            }
        }
    }
}

/// Leads, as this file lengthens them and the prefetch scan reads them: on Flex a move lands
/// before the next op, so no training run arrives late enough to test them.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::device::Limits;
    use crate::engine::device::test_support::op;
    use crate::engine::index::absolute;
    use crate::engine::index::tests::Fake;
    use crate::policy::PolicyKind;
    use crate::policy::plan::UsePlan;
    use crate::policy::prefetch::MAX_LEAD;
    use crate::tape::StepTape;

    /// A plan of 10 ops where op 0 makes tensors 1 and 2, op 8 reads 1 and op 9 reads 2.
    fn plan() -> UsePlan {
        let mut ops = vec![op(Vec::new(), vec![1, 2])];
        ops.extend((1..8).map(|_| op(Vec::new(), Vec::new())));
        ops.push(op(vec![1], Vec::new()));
        ops.push(op(vec![2], Vec::new()));
        let tape = StepTape {
            ops,
            ..Default::default()
        };
        UsePlan::from_tape(&tape, None)
    }

    fn produced(slot: u16) -> KeyAt {
        KeyAt {
            step: 0,
            key: PlanKey::Produced { op: 0, slot },
        }
    }

    /// Where the prefetch scan finds spilled tensor `id` (the first position it is due at).
    fn due_at(engine: &DeviceEngine, id: TensorId) -> Option<u32> {
        let index = lock(&engine.index);
        (0..10).find(|&at| index.due_until(absolute(0, at)).iter().any(|s| s.id == id))
    }

    /// A synchronous engine with a prefetch window of 2 ops, at op 0 of the plan's step, with
    /// tensors 1 and 2 (keyed as the plan's outputs of op 0) spilled and placed at their uses.
    fn engine_with_spilled(tensor: &Arc<dyn Spillable>) -> Arc<DeviceEngine> {
        let engine = Arc::new(DeviceEngine::default());
        engine.limits.set(Limits {
            budget: Some(1 << 20),
            policy: PolicyKind::NextUse,
            prefetch_window: 2,
            asynchronous: false,
            ..Limits::default()
        });
        engine.plan.set(Some(Arc::new(plan())));
        let placement = engine.placement().expect("a plan and prefetching");
        let mut index = lock(&engine.index);
        for (id, slot) in [(1, 0), (2, 1)] {
            index.admit_output(id, 64, 0, || Arc::downgrade(tensor), Some(produced(slot)));
            index.set_tier(id, Tier::Host);
            index.set_due(id, placement.due(Some(produced(slot)), 0));
        }
        drop(index);
        engine
    }

    #[test]
    fn an_op_reserves_room_for_the_rebuild_of_a_dropped_input_and_its_ghosts() {
        let tensor: Arc<dyn Spillable> = Arc::new(Fake);
        let engine = DeviceEngine::default();
        engine.limits.set(Limits {
            budget: Some(1 << 20),
            asynchronous: false,
            ..Limits::default()
        });
        let input = |id, dropped, rebuild_transient, for_rebuild| OpInput {
            id,
            bytes: 100,
            tier: Tier::Device,
            evictable: true,
            victim: Some(Arc::downgrade(&tensor)),
            dropped,
            rebuild_transient,
            for_rebuild,
        };
        // A dropped input rebuilt from a held one, with 300 bytes of ghosts, and a resident
        // input: the rebuilt tensor and its ghosts are reserved, with the output (largest
        // input, 100, before a size is learnt).
        let inputs = [
            input(1, true, 300, false),
            input(2, false, 0, true),
            input(3, false, 0, false),
        ];
        let ticket = engine
            .begin_op("float_add", &inputs, 0, None)
            .expect("a budget");
        assert_eq!(ticket.reserved, 100 + 300 + 100);
        assert_eq!(engine.device_committed(), 500);
        engine.end_op(ticket, []);
        assert_eq!(engine.device_committed(), 0, "released when the op ends");
    }

    /// A tensor that remembers whether the index marked it.
    #[derive(Default)]
    struct Marked(std::sync::atomic::AtomicBool);

    impl Spillable for Marked {
        fn evict(&self, _: &DeviceEngine) -> Option<Tier> {
            None
        }
        fn demote_to_disk(&self, _: &DeviceEngine) -> bool {
            false
        }
        fn prefetch(&self, _: &DeviceEngine) -> bool {
            false
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
        fn mark_indexed(&self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }

    fn budgeted_engine() -> DeviceEngine {
        let engine = DeviceEngine::default();
        engine.limits.set(Limits {
            budget: Some(1 << 20),
            asynchronous: false,
            ..Limits::default()
        });
        engine
    }

    fn resident_input(id: TensorId, victim: Option<Weak<dyn Spillable>>) -> OpInput {
        OpInput {
            id,
            bytes: 100,
            tier: Tier::Device,
            evictable: true,
            victim,
            dropped: false,
            rebuild_transient: 0,
            for_rebuild: false,
        }
    }

    #[test]
    fn an_input_is_marked_indexed_once_its_entry_exists_and_then_needs_no_weak_handle() {
        let marked = Arc::new(Marked::default());
        let tensor: Arc<dyn Spillable> = marked.clone();
        let engine = budgeted_engine();
        let first = [resident_input(1, Some(Arc::downgrade(&tensor)))];
        let ticket = engine
            .begin_op("float_exp", &first, 0, None)
            .expect("a budget");
        assert!(
            marked.0.load(Ordering::Relaxed),
            "marked as the index took it in"
        );
        engine.end_op(ticket, []);
        // Marked, it comes without a weak handle: the index finds its entry.
        let again = [resident_input(1, None)];
        let ticket = engine
            .begin_op("float_exp", &again, 0, None)
            .expect("a budget");
        engine.end_op(ticket, []);
        assert_eq!(lock(&engine.index).len(), 1);
    }

    #[test]
    #[should_panic(expected = "says it is indexed but the index does not hold it")]
    fn an_input_marked_indexed_that_the_index_lacks_is_a_bug_named() {
        let engine = budgeted_engine();
        let _ = engine.begin_op("float_exp", &[resident_input(7, None)], 0, None);
    }

    #[test]
    fn a_late_key_places_its_spilled_tensors_earlier_up_to_the_cap() {
        let tensor: Arc<dyn Spillable> = Arc::new(Fake);
        let engine = engine_with_spilled(&tensor);
        assert_eq!(
            (due_at(&engine, 1), due_at(&engine, 2)),
            (Some(8), Some(9)),
            "at their uses"
        );
        let late = [produced(0).key];
        engine.lengthen_leads(&late);
        assert_eq!(due_at(&engine, 1), Some(7), "a lead of one op");
        engine.lengthen_leads(&late);
        assert_eq!(due_at(&engine, 1), Some(6), "the lead doubled");
        assert_eq!(due_at(&engine, 2), Some(9), "a key that was not late stays");
        while lock(&engine.leads)[&produced(0).key] < MAX_LEAD {
            engine.lengthen_leads(&late);
        }
        assert_eq!(due_at(&engine, 1), Some(0), "no earlier than now");
        // At the cap a late arrival changes nothing: a tensor placed elsewhere stays there.
        lock(&engine.index).set_due(1, Some(absolute(0, 5)));
        engine.lengthen_leads(&late);
        assert_eq!(due_at(&engine, 1), Some(5));
    }

    #[test]
    fn the_prefetch_scan_takes_a_tensor_its_lead_before_the_window() {
        let tensor: Arc<dyn Spillable> = Arc::new(Fake);
        let engine = engine_with_spilled(&tensor);
        // Used 8 and 9 ops from now, past the window of 2: neither is due.
        assert_eq!(
            engine.prefetch_ahead(&engine.limits(), &engine.plan().expect("a plan")),
            None
        );
        assert_eq!((due_at(&engine, 1), due_at(&engine, 2)), (Some(8), Some(9)));
        // Tensor 1 came late four times: a lead of 8 ops brings its use within reach.
        for _ in 0..4 {
            engine.lengthen_leads(&[produced(0).key]);
        }
        assert_eq!(
            engine.prefetch_ahead(&engine.limits(), &engine.plan().expect("a plan")),
            None
        );
        assert_eq!(due_at(&engine, 1), None, "prefetched: on the device");
        assert_eq!(due_at(&engine, 2), Some(9), "still waits for its window");
    }
}
