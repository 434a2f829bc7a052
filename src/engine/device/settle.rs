//! After an op: the device brought under its watermark and the host under its limit, on the
//! op's thread or as jobs for the transfer workers, and those jobs run.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::engine::ledger::Direction;
use crate::engine::slot::Tier;
use crate::engine::transfer::{Job, Lane};
use crate::policy::handoff::{self, MoveHistory};
use crate::policy::plan::UsePlan;
use crate::policy::prefetch as decide;
use crate::policy::victim::Takes;

use super::ample::UntrackedOp;
use super::evict::Eviction;
use super::prefetch::Room;
use super::step::Placement;
use super::{DeviceEngine, Limits, lock};

/// What the eviction job on the transfer worker works toward: the latest op's wish.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct SettleGoal {
    pub(super) target: u64,
    /// The next ops' room, made first and from tensors used after them only (see
    /// [`SettlePoint::ahead`]).
    pub(super) ahead: Option<Room>,
    /// See [`SettlePoint::spares_until`].
    pub(super) spares_until: Option<u64>,
    pub(super) room: Option<Room>,
    /// See [`SettlePoint::early`].
    pub(super) early: Option<Room>,
    /// Bumped at every change, so that a goal set while the job finished is not lost.
    pub(super) generation: u64,
}

/// Above `trigger` device bytes, eviction after an op brings the device down to `target`, and
/// to `ahead`'s level with the tensors that allows.
#[derive(Debug, Clone, Copy)]
pub(super) struct SettlePoint {
    pub(super) trigger: u64,
    pub(super) target: u64,
    /// With a plan, when the device was above the target as the point was taken: the room the
    /// next few ops need, made from tensors used after them (see
    /// [`settle_ahead`](crate::policy::prefetch::settle_ahead)), so that those ops run without
    /// a pass of their own.
    pub(super) ahead: Option<Room>,
    /// With a plan: the absolute position up to which the ops the target makes room for run.
    /// The pass to the target leaves alone the tensors they read ([`Takes::AllButReadUntil`]);
    /// without a plan, only the next op's ([`Takes::AllButNextOp`]).
    pub(super) spares_until: Option<u64>,
    /// Under a `both` behaviour that makes room early, when no eviction is under way: the room
    /// the step's coming peak needs, from tensors used after it (see
    /// [`early_room`](crate::policy::prefetch::early_room)). Below the target, it sets the
    /// trigger.
    pub(super) early: Option<Room>,
}

impl SettlePoint {
    /// What the pass down to the target may take.
    fn takes(&self) -> Takes<u64> {
        takes_to_target(self.spares_until)
    }

    /// The lowest level an eviction that `committed` device bytes set off may bring the
    /// device to.
    fn lowest(&self, committed: u64) -> u64 {
        let settled = match self.ahead {
            Some(ahead) if committed > self.trigger => ahead.level.min(self.target),
            _ => self.target,
        };
        self.early.map_or(settled, |early| early.level.min(settled))
    }
}

/// What a settle's pass down to its target may take (see [`SettlePoint::spares_until`]).
fn takes_to_target(spares_until: Option<u64>) -> Takes<u64> {
    spares_until.map_or(Takes::AllButNextOp, Takes::AllButReadUntil)
}

/// Bytes one background eviction job moves before it lets queued prefetches run.
pub(super) const SETTLE_SLICE_BYTES: u64 = 4 << 20;

impl DeviceEngine {
    /// Runs after every op while a budget is in force: prefetches what the plan says is needed
    /// soon and brings the device under the high watermark (down to the low one) and the host
    /// tier under its limit, on the workers when the engine is asynchronous (and between ops on
    /// the calling thread otherwise).
    pub fn after_op(self: &Arc<Self>) {
        self.with_limits(|limits| {
            let Some(budget) = limits.budget else {
                return;
            };
            self.watch_pool(limits.pool_margin);
            if !self.ample_after_op(self.settle_floor(limits, budget)) {
                self.after_op_when_tight(limits);
            }
        });
    }

    /// `after_op` for an op that ran untracked, with what its start read of the limits.
    pub fn after_untracked_op(self: &Arc<Self>, op: UntrackedOp) {
        self.watch_pool(op.pool_margin);
        if !self.ample_after_op(op.settle_floor) {
            self.with_limits(|limits| self.after_op_when_tight(limits));
        }
    }

    /// Returns the inner backend's free pool pages when it holds `margin` more than it uses.
    fn watch_pool(&self, margin: u64) {
        self.pool.after_op(
            self.ledger.resident(Tier::Device),
            self.ledger.device_arrivals(),
            margin,
            self.queues(),
        );
    }

    /// Whether memory is ample after an op: nothing off the device to bring back (or to
    /// demote) or to rebuild, and the device under `settle_floor`, every settle point the plan
    /// could set for the ops' own room. Most ops of a run that fits end here. A dropped tensor
    /// counts as off the device: the room for its rebuild comes from the settle, below that
    /// floor.
    fn ample_after_op(&self, settle_floor: u64) -> bool {
        self.off_device() == 0 && self.device_committed() <= settle_floor
    }

    /// The rest of `after_op` once memory is not ample: prefetch and settle.
    fn after_op_when_tight(self: &Arc<Self>, limits: &Limits) {
        let off_device = self.ledger.resident(Tier::Host) + self.ledger.resident(Tier::Disk);
        if off_device == 0 {
            // Only the device is near its budget: settling is a comparison or an eviction (whose
            // time is a stall), not the prefetch scans that cost an op its time.
            self.settle_after_op(limits);
        } else {
            self.ledger
                .engine_work(true, || self.settle_after_op(limits));
        }
    }

    /// `after_op` while memory is tight: prefetch, then settle and make room for the first
    /// prefetch left out, here or on a worker.
    fn settle_after_op(self: &Arc<Self>, limits: &Limits) {
        // Read once for the settle point and the prefetch scan, and lent to both: each read
        // and each clone of the plan's `Arc` is an atomic read-modify-write on every op.
        let plan = self.plan();
        let plan = plan.as_deref();
        let point = self.settle_point_under(limits, plan);
        let room = match plan {
            Some(plan) if limits.planning() && limits.prefetch_window > 0 => {
                self.prefetch_ahead(limits, plan)
            }
            _ => None,
        };
        if !limits.asynchronous {
            self.settle_at(limits, point);
            if let Some(room) = room {
                self.make_room_for(room);
            }
            return;
        }
        let committed = self.device_committed();
        if committed > point.trigger || room.is_some() {
            let lowest = room.map_or(point.lowest(committed), |r| {
                r.level.min(point.lowest(committed))
            });
            if self.cheaper_here(Direction::DeviceToHost, committed.saturating_sub(lowest)) {
                if committed > point.trigger {
                    self.settle_to(point);
                }
                if let Some(room) = room {
                    self.make_room_for(room);
                }
            } else {
                let (target, ahead, spares_until, early) = if committed > point.trigger {
                    (point.target, point.ahead, point.spares_until, point.early)
                } else {
                    (u64::MAX, None, None, None)
                };
                {
                    // A job already queued takes the new goal when it runs.
                    let mut goal = lock(&self.settle_goal);
                    goal.target = target;
                    goal.ahead = ahead;
                    goal.spares_until = spares_until;
                    goal.room = room;
                    goal.early = early;
                    goal.generation += 1;
                }
                if !self.settle_queued.swap(true, Ordering::AcqRel) {
                    self.transfers.submit(self, Lane::Transfer, Job::Settle);
                }
            }
        }
        self.queue_overflow(limits);
    }

    /// Whether moving `bytes` in `direction` is likely cheaper than handing the move to a
    /// worker: waking a sleeping thread and switching to it costs a few microseconds on each
    /// side (more on a busy machine, where the worker is scheduled late: the wait is measured),
    /// more than a small copy on a CPU backend (where a restore is a buffer handover). The
    /// decision is [`handoff::cheaper_on_op_thread`] over this direction's measured moves.
    pub(super) fn cheaper_here(&self, direction: Direction, bytes: u64) -> bool {
        let history = self.move_history(direction);
        handoff::cheaper_on_op_thread(history, bytes, self.transfers.handoff_latency())
    }

    /// The ledger's moves in `direction`, as the policy's decisions read them.
    fn move_history(&self, direction: Direction) -> MoveHistory {
        let moves = self.ledger.moves(direction);
        MoveHistory {
            count: moves.count,
            bytes: moves.bytes,
            time: moves.time,
            fastest: moves.fastest,
        }
    }

    /// Has the I/O worker move the host tier's overflow to disk, unless it is queued already.
    pub(super) fn queue_overflow(self: &Arc<Self>, limits: &Limits) {
        if let Some(limit) = limits.host_limit
            && self.ledger.resident(Tier::Host) > limit
            && !self.overflow_queued.swap(true, Ordering::AcqRel)
        {
            self.transfers.submit(self, Lane::Io, Job::Overflow);
        }
    }

    /// Runs one worker job.
    pub(crate) fn run_job(self: &Arc<Self>, job: Job) {
        match job {
            Job::Prefetch {
                victim,
                id,
                bytes,
                queued_at,
            } => {
                let arrived = victim.prefetch(self);
                self.learn_transfer_ops(queued_at);
                let mut index = lock(&self.index);
                let tick = index.next_tick();
                index.end_flight(id, arrived, tick);
                drop(index);
                self.inflight_in.fetch_sub(bytes, Ordering::Relaxed);
            }
            Job::Settle => {
                let goal = *lock(&self.settle_goal);
                // A slice at a time, so that prefetches queued meanwhile go first.
                // The next ops' room first: from tensors used after them, it reaches the
                // target in the same pass (one left short goes on to the target with any).
                let ahead = match goal.ahead {
                    Some(ahead) => {
                        let takes = Takes::UsedAfter(ahead.beyond);
                        self.evict_until_within(ahead.level, SETTLE_SLICE_BYTES, takes)
                    }
                    None => Eviction::Reached,
                };
                let mut outcome = match ahead {
                    Eviction::Sliced => Eviction::Sliced,
                    _ => self.evict_until_within(
                        goal.target,
                        SETTLE_SLICE_BYTES,
                        takes_to_target(goal.spares_until),
                    ),
                };
                if let (Eviction::Reached, Some(room)) = (outcome, goal.room) {
                    outcome = self.evict_until_within(
                        room.level,
                        SETTLE_SLICE_BYTES,
                        Takes::UsedAfter(room.beyond),
                    );
                }
                // The peak's room last: nothing the next ops wait for depends on it.
                if let (Eviction::Reached | Eviction::NoVictims, Some(early)) =
                    (outcome, goal.early)
                {
                    outcome = self.evict_until_within(
                        early.level,
                        SETTLE_SLICE_BYTES,
                        Takes::UsedAfter(early.beyond),
                    );
                }
                if outcome == Eviction::Sliced {
                    // Still marked queued: the rest goes behind whatever came meanwhile.
                    self.transfers.submit(self, Lane::Transfer, Job::Settle);
                } else {
                    self.settle_queued.store(false, Ordering::Release);
                    // A goal set while this ran, which found the job queued, is not lost.
                    if lock(&self.settle_goal).generation != goal.generation
                        && !self.settle_queued.swap(true, Ordering::AcqRel)
                    {
                        self.transfers.submit(self, Lane::Transfer, Job::Settle);
                    }
                }
                self.queue_overflow(&self.limits());
            }
            Job::Overflow => {
                self.overflow_queued.store(false, Ordering::Release);
                self.spill_host_overflow(&self.limits());
            }
        }
    }

    /// When eviction after an op starts, and where it brings the device.
    ///
    /// Before a plan exists: above the high watermark (the preset's spill threshold), down to
    /// the low one (its cache ratio), leaving headroom so that the next ops rarely wait for an
    /// eviction. With a plan the tape corrects those guesses (under every policy: the policy
    /// picks the victims, the plan says how much room is needed): the recorded step says how
    /// many bytes the next ops will add (as many ops as a move takes to land), and the device is
    /// kept exactly that far under the budget. Any more headroom would only move bytes the step
    /// still needs (Belady's MIN evicts only when an op needs the room), except from tensors
    /// used after the next few ops, which an eviction that runs anyway takes along (`ahead`).
    pub(super) fn settle_point(&self, limits: &Limits) -> SettlePoint {
        self.settle_point_under(limits, self.plan().as_deref())
    }

    /// [`settle_point`](Self::settle_point) under `plan`, the plan in force.
    fn settle_point_under(&self, limits: &Limits, plan: Option<&UsePlan>) -> SettlePoint {
        let planned = match (limits.budget, plan) {
            (Some(budget), Some(plan)) if limits.planning() => {
                // As far ahead as a move takes to land, or as the link falls behind the ops:
                // an eviction for an op further away can still run after this one, when it
                // is known to be needed.
                let (step, now) = self.recorder.position();
                let transfer_ops = self.transfer_ops.load(Ordering::Relaxed);
                let pace = self.pace();
                let transfer_ops = decide::settle_lookahead(plan, now, transfer_ops, pace);
                let mut target = decide::settle_target(budget, plan, now, transfer_ops);
                let drops = self.recompute_behaviour(limits).may_drop();
                if drops {
                    target = target.saturating_sub(self.rebuild_bytes_due(
                        plan,
                        step,
                        now,
                        transfer_ops,
                    ));
                }
                // Looked for only when an eviction runs (most ops under a budget run none).
                let placement = Placement { plan, step, now };
                let committed = self.device_committed();
                let ahead = (committed > target).then(|| {
                    let (level, after) = decide::settle_ahead(budget, plan, now, transfer_ops);
                    Room {
                        level,
                        beyond: placement.absolute(after),
                    }
                });
                // While an eviction job is queued the link is busy: room made early would
                // only queue behind it.
                let early = self
                    .early_room_pacing(limits)
                    .filter(|_| !self.settle_queued.load(Ordering::Acquire))
                    .and_then(|paced| decide::early_room(budget, plan, now, committed, pace, paced))
                    .filter(|&(level, _)| committed > level)
                    .map(|(level, after)| Room {
                        level,
                        beyond: placement.absolute(after),
                    });
                Some((target, ahead, placement.absolute(transfer_ops), early))
            }
            _ => None,
        };
        match planned {
            Some((target, ahead, spares_until, early)) => SettlePoint {
                trigger: early.map_or(target, |early| early.level.min(target)),
                target,
                ahead,
                spares_until: Some(spares_until),
                early,
            },
            None => SettlePoint {
                trigger: limits.high_water,
                target: limits.low_water,
                ahead: None,
                spares_until: None,
                early: None,
            },
        }
    }

    /// How fast victims have left the device, and how fast the last checked step's ops ran.
    pub(super) fn pace(&self) -> decide::Pace {
        decide::Pace {
            evict_seconds_per_byte: self
                .move_history(Direction::DeviceToHost)
                .seconds_per_byte(),
            op_seconds: f64::from_bits(self.op_seconds.load(Ordering::Relaxed)),
        }
    }

    /// The device level at or under which no settle point triggers, whatever the position: the
    /// budget less the plan's largest headroom, or the high watermark before a plan exists
    /// (see [`settle_point`](Self::settle_point)).
    pub(super) fn settle_floor(&self, limits: &Limits, budget: u64) -> u64 {
        match self.plan_headroom.load(Ordering::Relaxed) {
            plus_one if plus_one > 0 && limits.planning() => budget.saturating_sub(plus_one - 1),
            _ => limits.high_water,
        }
    }

    /// Brings the device under the high watermark (down to the low one) and the host tier under
    /// its limit, on the calling thread.
    pub fn settle(&self) {
        let limits = self.limits();
        if limits.budget.is_none() {
            return;
        }
        self.settle_at(&limits, self.settle_point(&limits));
    }

    /// Bytes of the dropped tensors rebuilt within [`decide::rebuild_reach`] of position `now`:
    /// room the settle keeps beside the ops' own.
    fn rebuild_bytes_due(&self, plan: &UsePlan, step: u64, now: u32, transfer_ops: u32) -> u64 {
        let placement = Placement { plan, step, now };
        let (from, until) = (
            placement.absolute(0),
            placement.absolute(decide::rebuild_reach(transfer_ops)),
        );
        lock(&self.index).rebuild_bytes_between(from, until)
    }

    /// Evicts down to `point`'s target, and on to its `ahead` level with the tensors that
    /// allows. The ahead part goes first: the policy ranks tensors used after the next ops
    /// first anyway, so that one pass usually reaches both levels, where the target first
    /// would make every settling two passes.
    fn settle_to(&self, point: SettlePoint) {
        if let Some(ahead) = point.ahead {
            self.make_room_for(ahead);
        }
        self.make_room(point.target, point.takes());
        if let Some(early) = point.early {
            self.make_room_for(early);
        }
    }

    pub(super) fn settle_at(&self, limits: &Limits, point: SettlePoint) {
        if self.device_committed() > point.trigger {
            self.settle_to(point);
        } else {
            self.spill_host_overflow(limits);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::engine::TensorRole;
    use crate::engine::device::test_support::op;
    use crate::engine::index::Spillable;
    use crate::engine::slot::TensorId;
    use crate::policy::PolicyKind;
    use crate::policy::plan::{KeyAt, PlanKey, UsePlan};
    use crate::tape::StepTape;

    const KIB: u64 = 1024;

    /// A tensor whose eviction the ledger counts, as a real handle's is.
    struct Counted;

    impl Spillable for Counted {
        fn evict(&self, engine: &DeviceEngine) -> Option<Tier> {
            let to_host = Direction::DeviceToHost;
            engine
                .ledger()
                .on_move(to_host, KIB, TensorRole::Other, Duration::ZERO);
            Some(Tier::Host)
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
        fn mark_indexed(&self) {}
    }

    /// Tensors 1-5 come from before the step: op 1 reads 1, the last op (11) reads 2-5 and
    /// what ops 0-10 make, 1 KiB a tensor, so that each op grows the device by 1 KiB.
    fn plan() -> UsePlan {
        let made: Vec<TensorId> = (100..=110).collect();
        let mut ops: Vec<_> = made
            .iter()
            .enumerate()
            .map(|(i, &id)| op(if i == 1 { vec![1] } else { Vec::new() }, vec![id]))
            .collect();
        ops.push(op(
            [2, 3, 4, 5].into_iter().chain(made).collect(),
            Vec::new(),
        ));
        let tensors = (1..=5)
            .chain(100..=110)
            .map(|id| crate::tape::TensorRecord {
                id,
                bytes: KIB,
                dtype: "F32".into(),
                shape: vec![256],
                role: TensorRole::Other,
                producer: (id >= 100).then(|| crate::tape::Producer {
                    op: (id - 100) as u32,
                    output: 0,
                }),
            })
            .collect();
        let tape = StepTape {
            ops,
            tensors,
            ..Default::default()
        };
        UsePlan::from_tape(&tape, None)
    }

    /// A step's tape of `ops` over the tensors `ids`, of 1 KiB each unless `sizes` says.
    fn tape_of(
        ops: Vec<crate::tape::OpRecord>,
        ids: &[TensorId],
        sizes: &[(TensorId, u64)],
    ) -> StepTape {
        let tensors = ids
            .iter()
            .map(|&id| crate::tape::TensorRecord {
                id,
                bytes: sizes
                    .iter()
                    .find(|(of, _)| *of == id)
                    .map_or(KIB, |(_, bytes)| *bytes),
                dtype: "F32".into(),
                shape: vec![256],
                role: TensorRole::Other,
                producer: None,
            })
            .collect();
        StepTape {
            ops,
            tensors,
            ..Default::default()
        }
    }

    /// An engine at the start of `plan`'s step under `limits`, with the plan in force.
    fn engine_with(limits: Limits, plan: UsePlan) -> Arc<DeviceEngine> {
        let engine = Arc::new(DeviceEngine::default());
        engine.limits.set(limits);
        // As putting the plan in force does: the level under which no op settles.
        engine
            .plan_headroom
            .store(plan.max_headroom() + 1, Ordering::Relaxed);
        engine.plan.set(Some(Arc::new(plan)));
        engine
    }

    /// Puts 1 KiB tensors on the device, each read next at (op, input slot) of step 0 (all
    /// `tensor`, which the index holds weakly).
    fn on_device(
        engine: &DeviceEngine,
        tensor: &Arc<dyn Spillable>,
        reads: &[(TensorId, u32, u16)],
    ) {
        for &(id, op, slot) in reads {
            engine.ledger().on_create(KIB, TensorRole::Other);
            let key = KeyAt {
                step: 0,
                key: PlanKey::Input { op, slot },
            };
            let mut index = lock(&engine.index);
            index.admit_output(id, KIB, id, || Arc::downgrade(tensor), Some(key));
        }
    }

    /// Limits with `budget`, ranked by next use, with a prefetch window of `window` ops.
    fn limits(budget: u64, window: u32, asynchronous: bool) -> Limits {
        Limits {
            budget: Some(budget),
            high_water: budget,
            policy: PolicyKind::NextUse,
            prefetch_window: window,
            asynchronous,
            ..Limits::default()
        }
    }

    /// An engine at the start of [`plan`]'s step, with tensors 1-5 on the device, and a budget
    /// 0.5 KiB short of what op 0 needs beside them.
    fn engine_before_op_0(asynchronous: bool, tensor: &Arc<dyn Spillable>) -> Arc<DeviceEngine> {
        // Op 0, next, makes 1 KiB: the target is the budget less that.
        let budget = 5 * KIB + KIB / 2;
        let engine = engine_with(limits(budget, 0, asynchronous), plan());
        let reads = [(1, 1, 0), (2, 11, 0), (3, 11, 1), (4, 11, 2), (5, 11, 3)];
        on_device(&engine, tensor, &reads);
        engine
    }

    /// Where tensors 1-5 are after settling.
    fn assert_settled_ahead(engine: &DeviceEngine) {
        let index = lock(&engine.index);
        let tier = |id| index.tier_of(id);
        assert_eq!(tier(1), Some(Tier::Device), "op 1 reads it: it stays");
        assert!(
            [2, 3, 4, 5]
                .into_iter()
                .all(|id| tier(id) == Some(Tier::Host)),
            "the tensors read last all go, where the target alone asked for one"
        );
        assert_eq!(engine.device_committed(), KIB);
    }

    /// Before an op that needs more than the budget by itself, no settle can make its room: one
    /// that took the op's inputs would only make the op bring them back. The pass that admits
    /// an op may take any tensor but the ones it pins.
    #[test]
    fn a_settle_leaves_what_the_next_op_reads_even_short_of_its_target() {
        // Op 0 reads 1 and 2 and makes 100; op 1 reads 3 and makes 101: 1 KiB each.
        let ops = vec![op(vec![1, 2], vec![100]), op(vec![3], vec![101])];
        let plan = UsePlan::from_tape(&tape_of(ops, &[1, 2, 3, 100, 101], &[]), None);
        let tensor: Arc<dyn Spillable> = Arc::new(Counted);
        // Op 0 needs 3 KiB; the target before it is the budget less its 1 KiB output: 1 KiB.
        let engine = engine_with(limits(2 * KIB, 0, false), plan);
        on_device(&engine, &tensor, &[(1, 0, 0), (2, 0, 1), (3, 1, 0)]);
        engine.settle();
        let tier = |id| lock(&engine.index).tier_of(id);
        assert_eq!(tier(3), Some(Tier::Host), "op 1 reads it: it goes");
        assert_eq!(
            (tier(1), tier(2)),
            (Some(Tier::Device), Some(Tier::Device)),
            "op 0 reads them: they stay, short of the target"
        );
        assert_eq!(engine.device_committed(), 2 * KIB);
        // Without pins, the admitting pass takes them.
        assert!(engine.make_room(0, Takes::Any));
        assert_eq!((tier(1), tier(2)), (Some(Tier::Host), Some(Tier::Host)));
    }

    /// The input of an op that needs more than the budget by itself is brought back before it
    /// when it fits beside what the ops before it need: the room that op's output needs could
    /// not be kept anyway.
    #[test]
    fn an_op_over_the_budget_by_itself_gets_its_spilled_input_prefetched() {
        // Op 0 reads 1 and 2 and makes 100 (2 KiB): 4 KiB in all. Op 1 reads 3.
        let ops = vec![op(vec![1, 2], vec![100]), op(vec![3], Vec::new())];
        let plan = UsePlan::from_tape(&tape_of(ops, &[1, 2, 3, 100], &[(100, 2 * KIB)]), None);
        let issued = |budget: u64| {
            let tensor: Arc<dyn Spillable> = Arc::new(Counted);
            let engine = engine_with(limits(budget, 4, false), plan.clone());
            // 1 on the device and 2 on the host, read by op 0, the next; 3 on the device.
            on_device(&engine, &tensor, &[(1, 0, 0), (2, 0, 1), (3, 1, 0)]);
            Counted.evict(&engine);
            {
                let mut index = lock(&engine.index);
                index.set_tier(2, Tier::Host);
                index.set_due(2, Some(crate::engine::index::absolute(0, 0)));
            }
            engine.after_op();
            engine.ledger().stats().prefetches_issued
        };
        // Op 0 fits 4 KiB: the room for its output is kept, which 3 KiB beside it would not
        // leave (3 goes first, by a room pass).
        assert_eq!(issued(4 * KIB), 0);
        // Over a budget of 3.5 KiB by itself: no room to keep, and 3 KiB fits the budget.
        assert_eq!(issued(7 * KIB / 2), 1);
    }

    /// With a plan, a settle makes room for the ops up to its lookahead and takes none of the
    /// tensors they read: such a tensor would come back before they are done, its op waiting
    /// for its copy out and in again. Without a plan, only the next op's inputs stay.
    #[test]
    fn a_settle_leaves_what_the_ops_it_makes_room_for_read() {
        let tensor: Arc<dyn Spillable> = Arc::new(Counted);
        let moved = |takes: Takes<u64>| {
            let engine = engine_with(limits(8 * KIB, 0, false), plan());
            // 1 is read by op 1, 2 and 3 by op 11; the engine is at op 0.
            on_device(&engine, &tensor, &[(1, 1, 0), (2, 11, 0), (3, 11, 1)]);
            engine.make_room(0, takes);
            let index = lock(&engine.index);
            [1, 2, 3]
                .into_iter()
                .filter(|&id| index.tier_of(id) == Some(Tier::Host))
                .collect::<Vec<TensorId>>()
        };
        let until = |op| crate::engine::index::absolute(0, op);
        assert_eq!(
            moved(Takes::AllButNextOp),
            vec![1, 2, 3],
            "op 1 is not the next op"
        );
        assert_eq!(
            moved(Takes::AllButReadUntil(until(1))),
            vec![2, 3],
            "op 1 is among the ops it makes room for"
        );
        assert_eq!(
            moved(Takes::AllButReadUntil(until(11))),
            Vec::<TensorId>::new()
        );

        // The settle point spares up to the ops it makes room for: as far as a move takes to
        // land.
        let engine = engine_with(limits(8 * KIB, 0, false), plan());
        engine.transfer_ops.store(2, Ordering::Relaxed);
        let point = engine.settle_point(&engine.limits());
        assert_eq!(point.spares_until, Some(until(2)));
        assert_eq!(point.takes(), Takes::AllButReadUntil(until(2)));
        let unplanned = Arc::new(DeviceEngine::default());
        unplanned.limits.set(limits(8 * KIB, 0, false));
        let point = unplanned.settle_point(&unplanned.limits());
        assert_eq!(
            point.takes(),
            Takes::AllButNextOp,
            "no plan: the next op's inputs only"
        );
    }

    #[test]
    fn a_settling_eviction_goes_on_for_the_next_ops_with_tensors_used_after_them() {
        let tensor: Arc<dyn Spillable> = Arc::new(Counted);
        let engine = engine_before_op_0(false, &tensor);
        engine.settle();
        assert_settled_ahead(&engine);
    }

    /// Has `engine` drop its victims to be rebuilt rather than move them.
    fn dropping(engine: &DeviceEngine) {
        let limits = engine.limits();
        engine.limits.set(Limits {
            recompute: crate::policy::RecomputeMode::Recompute,
            ..limits
        });
    }

    /// Feeds the engine's recorder `rounds` repetitions of an unmarked step of `ops` ops (each
    /// op told apart by its output's width), as a loop without markers runs them.
    fn run_unmarked(engine: &DeviceEngine, ops: usize, rounds: usize) {
        engine.recorder.set_enabled(true);
        for _ in 0..rounds {
            for i in 0..ops {
                let shape = [i + 1];
                let view = crate::tape::TensorView {
                    id: 1,
                    bytes: 4,
                    dtype: "F32",
                    shape: &shape,
                    role: TensorRole::Other,
                };
                engine.recorder.record_op(
                    "float_exp",
                    [view].into_iter(),
                    [view].into_iter(),
                    std::time::Instant::now(),
                    1,
                    [0; 3],
                );
            }
        }
    }

    /// Steps the period detector cut are dropped in (the position counts their ops as a marked
    /// step's) only under a plan made from a step of their period: a plan from another one, as
    /// shorter repetitions inside the step are confirmed first, would be read out of place.
    #[test]
    fn a_step_the_period_detector_cut_drops_only_under_a_plan_of_its_length() {
        let plan_len = plan().len() as usize;
        for (period, drops) in [(plan_len, true), (plan_len - 1, false)] {
            let engine = engine_with(limits(6 * KIB, 0, false), plan());
            dropping(&engine);
            assert!(
                engine.drop_context(&engine.limits()).is_none(),
                "no step known yet"
            );
            run_unmarked(&engine, period, 12);
            assert_eq!(engine.recorder.found_period(), Some(period as u64));
            assert_eq!(
                engine.drop_context(&engine.limits()).is_some(),
                drops,
                "a period of {period} ops under a plan of {plan_len}"
            );
        }
    }

    /// An engine at the start of [`plan`]'s step under `both` with a 6 KiB budget, which has
    /// chosen `behaviour` for the plan.
    fn engine_under(
        behaviour: crate::policy::recompute::Behaviour,
        asynchronous: bool,
    ) -> Arc<DeviceEngine> {
        let limits = Limits {
            recompute: crate::policy::RecomputeMode::Both,
            ..limits(6 * KIB, 0, asynchronous)
        };
        let engine = engine_with(limits, plan());
        engine.behaviour.land(0, behaviour);
        assert_eq!(engine.chosen_behaviour(&engine.limits()), Some(behaviour));
        engine
    }

    /// How the settle makes room early: set by the config in every mode; otherwise chosen per
    /// plan under `recompute` and `both` (paced under `recompute` and none under `both` until
    /// a choice lands), and paced under `swap`, which chooses nothing.
    #[test]
    fn room_is_made_early_as_configured_or_as_the_plan_chose() {
        use crate::policy::RecomputeMode::{Both, Recompute, Swap};
        use crate::policy::recompute::{Behaviour, EarlyRoom, RebuildRoom};
        let at_once = Behaviour::new(Recompute, RebuildRoom::AtSettle).evicting_early();
        for mode in [Swap, Recompute, Both] {
            let engine = engine_with(
                Limits {
                    recompute: mode,
                    ..limits(6 * KIB, 0, false)
                },
                plan(),
            );
            let before = engine.early_room_pacing(&engine.limits());
            assert_eq!(
                before,
                (mode != Both).then_some(true),
                "{mode}, nothing chosen"
            );
            engine.behaviour.land(0, at_once);
            let chosen = engine.early_room_pacing(&engine.limits());
            let expected = if mode == Swap {
                Some(true)
            } else {
                Some(false)
            };
            assert_eq!(chosen, expected, "{mode}, at once chosen");
            for early in [EarlyRoom::Off, EarlyRoom::AtOnce, EarlyRoom::Paced] {
                let limits = Limits {
                    early_room: Some(early),
                    ..engine.limits()
                };
                assert_eq!(
                    engine.early_room_pacing(&limits),
                    early.pacing(),
                    "{mode}, {early}"
                );
            }
            let unlimited = Limits {
                budget: None,
                ..engine.limits()
            };
            assert_eq!(
                engine.early_room_pacing(&unlimited),
                None,
                "{mode}, no budget"
            );
        }
    }

    /// Moves measured at `fixed` each plus `per_kib` (a 4-byte one tells the fixed cost; each
    /// pair leaves the ledger's tiers as they were).
    fn measure_moves(engine: &DeviceEngine, fixed: Duration, per_kib: Duration) {
        let moves = [(4, fixed)].into_iter().chain([(KIB, fixed + per_kib); 4]);
        for (bytes, took) in moves {
            let ledger = engine.ledger();
            ledger.on_move(Direction::DeviceToHost, bytes, TensorRole::Other, took);
            ledger.on_move(Direction::HostToDevice, bytes, TensorRole::Other, took);
        }
    }

    /// A device that drops its victims goes on for the next ops' room too: one pass for
    /// several ops, where a pass at nearly every op cost the op thread three times the passes
    /// (`docs/overhead.md`).
    #[test]
    fn a_device_that_drops_its_victims_goes_on_for_the_next_ops_too() {
        let tensor: Arc<dyn Spillable> = Arc::new(Counted);
        let engine = engine_before_op_0(false, &tensor);
        dropping(&engine);
        let point = engine.settle_point(&engine.limits());
        assert_eq!(
            tensors_over(&engine, point.target),
            1,
            "the target asks for one"
        );
        engine.settle();
        assert_settled_ahead(&engine);
    }

    /// How many 1 KiB tensors leave before the device is at `target`: what a settle's pass to
    /// its target alone takes, whatever its ahead part takes beside it.
    fn tensors_over(engine: &DeviceEngine, target: u64) -> u64 {
        engine
            .device_committed()
            .saturating_sub(target)
            .div_ceil(KIB)
    }

    /// A tensor dropped to be rebuilt comes back at its op with no prefetch to make room for
    /// it: the settle keeps that room too once the op is within its reach, as it keeps the
    /// room of the ops' outputs.
    #[test]
    fn a_settle_keeps_room_for_the_rebuilds_of_the_next_ops() {
        let target_takes = |rebuilt_at: u32| {
            let tensor: Arc<dyn Spillable> = Arc::new(Counted);
            let engine = engine_before_op_0(false, &tensor);
            dropping(&engine);
            // Tensor 6 (1 KiB) was dropped: its bytes are on no tier until op `rebuilt_at`.
            {
                let mut index = lock(&engine.index);
                index.admit_output(6, KIB, 6, || Arc::downgrade(&tensor), None);
                index.mark_dropped(6, Some(crate::engine::index::absolute(0, rebuilt_at)));
            }
            tensors_over(&engine, engine.settle_point(&engine.limits()).target)
        };
        // Before any move the reach is the next op and the one after it (ops 0 and 1).
        assert_eq!(decide::rebuild_reach(0), 1);
        assert_eq!(target_takes(0), 2, "op 0's output and the rebuild: two go");
        assert_eq!(target_takes(1), 2);
        assert_eq!(target_takes(2), 1, "beyond the reach: op 0's output only");
    }

    /// The settle after an op keeps the room for a rebuild within its reach even when nothing
    /// else is off the device and the device is under the level below which the ops' own room
    /// never asks for an eviction.
    #[test]
    fn a_rebuild_due_soon_keeps_the_settle_after_an_op_from_its_ample_exit() {
        // Op 0 reads 1 and 2, op 1 rebuilds 6 (dropped, larger than the room the ops
        // themselves ever ask for) and reads it, op 2 reads 3: each makes 1 KiB.
        let rebuilt = 100 * KIB;
        let ops = vec![
            op(vec![1, 2], vec![100]),
            op(vec![6], vec![101]),
            op(vec![3], vec![102]),
        ];
        let tape = tape_of(ops, &[1, 2, 3, 6, 100, 101, 102], &[(6, rebuilt)]);
        let plan = UsePlan::from_tape(&tape, None);
        let tensor: Arc<dyn Spillable> = Arc::new(Counted);
        // The device holds 1-3, and the budget leaves the ops' own room beside them.
        let budget = 3 * KIB + plan.max_headroom();
        assert!(plan.max_headroom() < rebuilt);
        let engine = engine_with(limits(budget, 0, false), plan);
        dropping(&engine);
        on_device(&engine, &tensor, &[(1, 0, 0), (2, 0, 1), (3, 2, 0)]);
        engine.ledger().on_create(rebuilt, TensorRole::Other);
        engine
            .ledger()
            .on_dropped_for_rebuild(rebuilt, TensorRole::Other);
        {
            let mut index = lock(&engine.index);
            index.admit_output(6, rebuilt, 6, || Arc::downgrade(&tensor), None);
            index.mark_dropped(6, Some(crate::engine::index::absolute(0, 1)));
        }
        engine.after_op();
        let tier = |id| lock(&engine.index).tier_of(id);
        assert_eq!(
            tier(3),
            Some(Tier::Host),
            "the room for 6's rebuild at op 1"
        );
        assert_eq!((tier(1), tier(2)), (Some(Tier::Device), Some(Tier::Device)));
    }

    /// Where the link empties the device slower than the ops grow it, the settle makes the
    /// room of the ops it would fall behind for now: their evictions spread over the ops
    /// before them instead of each op waiting for its own.
    #[test]
    fn a_settle_makes_room_ahead_for_the_ops_a_slow_link_would_fall_behind() {
        let target_takes = |fixed: Duration, evict_per_kib: Duration| {
            let tensor: Arc<dyn Spillable> = Arc::new(Counted);
            let engine = engine_before_op_0(false, &tensor);
            // The recorded step's ops at 1.5 ms each.
            measure_moves(&engine, fixed, evict_per_kib);
            engine
                .op_seconds
                .store(1.5e-3f64.to_bits(), Ordering::Relaxed);
            tensors_over(&engine, engine.settle_point(&engine.limits()).target)
        };
        // Ops 0-10 each grow the device by 1 KiB. At 0.1 ms a KiB the link keeps up: op 0's
        // room only (the target is the budget less 1 KiB).
        let micros = Duration::from_micros;
        assert_eq!(target_takes(micros(10), micros(100)), 1);
        // At 1 ms a KiB, op 1's 2 KiB take 2 ms to leave, more than op 0's 1.5 ms: its room
        // too. Op 2's 3 KiB take as long as ops 0 and 1 run: left to its own settle.
        assert_eq!(target_takes(micros(10), micros(1000)), 2);
        // Moves that take 2 ms whatever their size: a fixed cost per move, not a pace per
        // byte, so no stretch of ops outgrows the link by its bytes.
        assert_eq!(target_takes(micros(2000), Duration::ZERO), 1);
    }

    #[test]
    fn an_asynchronous_engine_goes_on_for_the_next_ops_on_the_op_thread_too() {
        let tensor: Arc<dyn Spillable> = Arc::new(Counted);
        let engine = engine_before_op_0(true, &tensor);
        // Moves measured as nearly free: an eviction is cheaper here than handed to a worker.
        for direction in [Direction::DeviceToHost, Direction::HostToDevice].repeat(64) {
            engine
                .ledger()
                .on_move(direction, KIB, TensorRole::Other, Duration::from_nanos(1));
        }
        assert!(engine.cheaper_here(Direction::DeviceToHost, 4 * KIB));
        engine.after_op();
        assert_settled_ahead(&engine);
    }

    #[test]
    fn a_room_pass_that_found_no_victim_runs_again_once_a_tensor_it_could_take_is_made() {
        let tensor: Arc<dyn Spillable> = Arc::new(Counted);
        let engine = engine_before_op_0(false, &tensor);
        // Room for a prefetch used at op 11: tensors 2-5 are read there and 1 before it, so
        // none is used after it.
        let room = Room {
            level: 0,
            beyond: crate::engine::index::absolute(0, 11),
        };
        let on_device = |engine: &DeviceEngine| engine.device_committed();
        engine.make_room_for(room);
        assert_eq!(on_device(&engine), 5 * KIB, "no victim");
        engine.make_room_for(room);
        assert_eq!(on_device(&engine), 5 * KIB, "still none");
        let generation = engine.plan_and_generation().1;
        assert!(
            lock(&engine.index).still_fruitless(0, generation, room.beyond, |_, _| true),
            "the pass is remembered, and nothing touched since"
        );

        // A tensor with no known next use, made after the pass: a victim pass takes it.
        let made: Arc<dyn Spillable> = Arc::new(Counted);
        engine.ledger().on_create(KIB, TensorRole::Other);
        lock(&engine.index).admit_output(6, KIB, 6, || Arc::downgrade(&made), None);
        engine.make_room_for(room);
        assert_eq!(lock(&engine.index).tier_of(6), Some(Tier::Host));
        assert_eq!(on_device(&engine), 5 * KIB);
        assert!(
            lock(&engine.index).still_fruitless(0, generation, room.beyond, |_, _| true),
            "a pass that took the last victim there was is remembered too"
        );
    }

    #[test]
    fn the_transfer_worker_goes_on_for_the_next_ops_too() {
        let tensor: Arc<dyn Spillable> = Arc::new(Counted);
        let engine = engine_before_op_0(true, &tensor);
        engine.after_op();
        engine.quiesce();
        assert_settled_ahead(&engine);
    }

    /// The transfer worker's settle leaves what the ops it makes room for read, as the op
    /// thread's does. Dropping victims, the engine makes no room ahead: the pass to the target
    /// is the settle's only one.
    #[test]
    fn the_transfer_workers_settle_leaves_what_its_ops_read_too() {
        use crate::policy::recompute::RecomputeMode;
        let tensor: Arc<dyn Spillable> = Arc::new(Counted);
        // Ops 0-2 make 1 KiB each: with moves taking 2 ops to land, the settle makes their
        // room, and its target is 3.5 KiB less 3, which the tensors read by op 11 alone do not
        // reach.
        let limits = Limits {
            recompute: RecomputeMode::Recompute,
            ..limits(7 * KIB / 2, 0, true)
        };
        let engine = engine_with(limits, plan());
        engine.transfer_ops.store(2, Ordering::Relaxed);
        let reads = [(1, 1, 0), (2, 11, 0), (3, 11, 1), (4, 11, 2), (5, 11, 3)];
        on_device(&engine, &tensor, &reads);
        engine.after_op();
        engine.quiesce();
        let index = lock(&engine.index);
        assert_eq!(
            index.tier_of(1),
            Some(Tier::Device),
            "op 1 reads it: it stays, short of the target"
        );
        assert!(
            [2, 3, 4, 5]
                .into_iter()
                .all(|id| index.tier_of(id) == Some(Tier::Host))
        );
    }

    /// Under a behaviour of `both` that keeps the state on the device, a pass takes the step's
    /// activations first, however the policy ranks them, and the state only when they fall
    /// short and the pass takes tensors needed soon too (never for a prefetch's room).
    #[test]
    fn a_behaviour_that_keeps_the_state_moves_activations_first() {
        use crate::policy::recompute::{Behaviour, RebuildRoom, RecomputeMode};
        let moved_with = |keeps_state: bool, want_kib: u64, takes: Takes<u64>| {
            let tensor: Arc<dyn Spillable> = Arc::new(Counted);
            let swap = Behaviour::new(RecomputeMode::Swap, RebuildRoom::AtSettle);
            let behaviour = if keeps_state {
                swap.keeping_state()
            } else {
                swap
            };
            let engine = engine_under(behaviour, false);
            // The state (2-5, from before the step) was used less recently than the
            // activations (100 and 101, made by ops 0 and 1); op 11 reads them all.
            on_device(
                &engine,
                &tensor,
                &[(2, 11, 0), (3, 11, 1), (4, 11, 2), (5, 11, 3)],
            );
            for (id, op) in [(100, 0), (101, 1)] {
                engine.ledger().on_create(KIB, TensorRole::Other);
                let key = KeyAt {
                    step: 0,
                    key: PlanKey::Produced { op, slot: 0 },
                };
                let victim = || Arc::downgrade(&tensor);
                lock(&engine.index).admit_output(id, KIB, id, victim, Some(key));
            }
            engine.make_room(6 * KIB - want_kib * KIB, takes);
            let index = lock(&engine.index);
            [2, 3, 4, 5, 100, 101]
                .into_iter()
                .filter(|&id| index.tier_of(id) == Some(Tier::Host))
                .collect::<Vec<TensorId>>()
        };
        assert_eq!(
            moved_with(false, 2, Takes::Any),
            vec![2, 3],
            "all read by op 11: the least recently used go"
        );
        assert_eq!(moved_with(true, 2, Takes::Any), vec![100, 101]);
        assert_eq!(
            moved_with(true, 3, Takes::Any),
            vec![2, 100, 101],
            "the state goes when the activations fall short"
        );
        assert_eq!(
            moved_with(true, 3, Takes::AllButNextOp),
            vec![2, 100, 101],
            "a settle between ops takes it too"
        );
        assert_eq!(
            moved_with(true, 3, Takes::UsedAfter(0)),
            vec![100, 101],
            "room for a prefetch is not made with the state"
        );
    }

    /// Under a behaviour of `both` that makes room early, on a link slower than the ops, the
    /// settle evicts now what the step's peak needs the room of, from tensors used after it,
    /// though its target asks for nothing yet; not on a fast link, not while an eviction job is
    /// queued, and never under the same behaviour without it. `swap` and `recompute` make it a
    /// share at a time.
    #[test]
    fn a_behaviour_that_evicts_early_makes_the_peaks_room_on_a_slow_link() {
        use crate::policy::recompute::{Behaviour, RebuildRoom, RecomputeMode};
        let swap = Behaviour::new(RecomputeMode::Swap, RebuildRoom::AtSettle);
        // Under `both` with `behaviour`, or under `mode` itself.
        let run_as = |behaviour: Option<Behaviour>,
                      mode: RecomputeMode,
                      evict_per_kib: Duration,
                      job_queued: bool,
                      worker: bool| {
            let tensor: Arc<dyn Spillable> = Arc::new(Counted);
            let engine = match behaviour {
                Some(behaviour) => engine_under(behaviour, worker),
                None => engine_with(
                    Limits {
                        recompute: mode,
                        ..limits(6 * KIB, 0, worker)
                    },
                    plan(),
                ),
            };
            // Tensors 1-5 on the device (op 1 reads 1, op 11 reads 2-5): 5 KiB, the budget
            // less op 0's room, so the target asks for nothing. Ops 0-10 each make 1 KiB: the
            // peak is at op 10, 11 KiB over the level now.
            on_device(
                &engine,
                &tensor,
                &[(1, 1, 0), (2, 11, 0), (3, 11, 1), (4, 11, 2), (5, 11, 3)],
            );
            measure_moves(&engine, Duration::from_micros(10), evict_per_kib);
            engine
                .op_seconds
                .store(1.5e-3f64.to_bits(), Ordering::Relaxed);
            engine.settle_queued.store(job_queued, Ordering::Relaxed);
            let point = engine.settle_point(&engine.limits());
            if worker {
                // Evictions this slow go to the transfer worker's settle job.
                engine.after_op();
                engine.quiesce();
            } else {
                engine.settle();
            }
            let index = lock(&engine.index);
            let moved: Vec<TensorId> = (1..=5)
                .filter(|&id| index.tier_of(id) == Some(Tier::Host))
                .collect();
            (point.early.map(|room| room.level), moved)
        };
        let run = |evicts_early: bool, evict_per_kib: Duration, job_queued: bool, worker: bool| {
            let behaviour = if evicts_early {
                swap.evicting_early()
            } else {
                swap
            };
            let both = RecomputeMode::Both;
            run_as(Some(behaviour), both, evict_per_kib, job_queued, worker)
        };
        let settled = |evicts_early, evict_per_kib, job_queued| {
            run(evicts_early, evict_per_kib, job_queued, false)
        };
        let ms = Duration::from_millis;
        // 10 KiB must leave before op 10; at 2 ms a KiB that is 20 ms against the 15 ms that
        // ops 0-9 run: down to nothing (the budget is under the peak's room), taking what op 11
        // reads, never what op 1 does.
        assert_eq!(settled(true, ms(2), false), (Some(0), vec![2, 3, 4, 5]));
        assert_eq!(
            settled(false, ms(2), false),
            (None, vec![]),
            "not without it"
        );
        assert_eq!(
            settled(true, ms(2), true),
            (None, vec![]),
            "not while an eviction job is queued"
        );
        // At 0.1 ms a KiB the 10 KiB leave in 1 ms: the settle's own room in time suffices.
        let fast = Duration::from_micros(100);
        assert_eq!(
            settled(true, fast, false),
            (None, vec![]),
            "not on a fast link"
        );
        assert_eq!(
            run(true, ms(2), false, true),
            (Some(0), vec![2, 3, 4, 5]),
            "the transfer worker's settle job makes it too"
        );
        // A share at a time: at 40 ms a KiB, the settle's horizon of 64 ops of 1.5 ms moves
        // 2.4 KiB, so one pass takes three of the four.
        let mode = |mode, evict_per_kib| run_as(None, mode, evict_per_kib, false, false);
        let slow = ms(40);
        let (level, moved) = mode(RecomputeMode::Swap, slow);
        assert!(
            level.is_some_and(|level| level > 2 * KIB && level < 3 * KIB),
            "{level:?}"
        );
        assert_eq!(moved.len(), 3, "{moved:?}");
        assert!(!moved.contains(&1));
        let paced = Some(swap.pacing_early());
        let both = RecomputeMode::Both;
        assert_eq!(
            run_as(paced, both, slow, false, false),
            (level, moved.clone()),
            "`both` paces as `swap` does under that behaviour"
        );
        assert_eq!(
            mode(RecomputeMode::Swap, ms(2)),
            (Some(0), vec![2, 3, 4, 5]),
            "a share larger than what must leave is all of it"
        );
        assert_eq!(
            mode(RecomputeMode::Recompute, slow),
            (level, moved),
            "`recompute` makes it as `swap` does (these tensors have no recipe to drop by)"
        );
    }
}
