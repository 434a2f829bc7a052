//! After an op: the device brought under its watermark and the host under its limit, on the
//! op's thread or as jobs for the transfer workers, and those jobs run.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::engine::ledger::Direction;
use crate::engine::slot::Tier;
use crate::engine::transfer::{Job, Lane};
use crate::policy::handoff::{self, MoveHistory};

use super::ample::UntrackedOp;
use super::evict::Eviction;
use super::prefetch::Room;
use super::{DeviceEngine, Limits, lock};

/// What the eviction job on the transfer worker works toward: the latest op's wish.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct SettleGoal {
    pub(super) target: u64,
    pub(super) room: Option<Room>,
    /// Bumped at every change, so that a goal set while the job finished is not lost.
    pub(super) generation: u64,
}

/// Above `trigger` device bytes, eviction after an op brings the device down to `target`.
#[derive(Debug, Clone, Copy)]
pub(super) struct SettlePoint {
    pub(super) trigger: u64,
    pub(super) target: u64,
}

/// Bytes one background eviction job moves before it lets queued prefetches run.
pub(super) const SETTLE_SLICE_BYTES: u64 = 4 << 20;

impl DeviceEngine {
    /// Runs after every op while a budget is in force: prefetches what the plan says is needed
    /// soon and brings the device under the high watermark (down to the low one) and the host
    /// tier under its limit, on the workers when the engine is asynchronous (and between ops on
    /// the calling thread otherwise).
    pub fn after_op(self: &Arc<Self>) {
        let limits = self.limits();
        let Some(budget) = limits.budget else {
            return;
        };
        self.watch_pool(limits.pool_margin);
        if !self.ample_after_op(self.settle_floor(&limits, budget)) {
            self.after_op_when_tight(&limits);
        }
    }

    /// `after_op` for an op that ran untracked, with what its start read of the limits.
    pub fn after_untracked_op(self: &Arc<Self>, op: UntrackedOp) {
        self.watch_pool(op.pool_margin);
        if !self.ample_after_op(op.settle_floor) {
            self.after_op_when_tight(&self.limits());
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
    /// demote), and the device under `settle_floor`, every settle point the plan could set.
    /// Most ops of a run that fits end here.
    fn ample_after_op(&self, settle_floor: u64) -> bool {
        let off_device = self.ledger.resident(Tier::Host) + self.ledger.resident(Tier::Disk);
        off_device == 0 && self.device_committed() <= settle_floor
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
        let point = self.settle_point(limits);
        let room = if limits.planning() && limits.prefetch_window > 0 {
            self.prefetch_ahead(limits)
        } else {
            None
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
            let lowest = room.map_or(point.target, |r| r.level.min(point.target));
            if self.cheaper_here(Direction::DeviceToHost, committed.saturating_sub(lowest)) {
                if committed > point.trigger {
                    self.make_room(point.target);
                }
                if let Some(room) = room {
                    self.make_room_for(room);
                }
            } else {
                let target = if committed > point.trigger {
                    point.target
                } else {
                    u64::MAX
                };
                {
                    // A job already queued takes the new goal when it runs.
                    let mut goal = lock(&self.settle_goal);
                    goal.target = target;
                    goal.room = room;
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
        let moves = self.ledger.moves(direction);
        let history = MoveHistory {
            count: moves.count,
            bytes: moves.bytes,
            time: moves.time,
        };
        handoff::cheaper_on_op_thread(history, bytes, self.transfers.handoff_latency())
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
                let tick = self.tick.fetch_add(1, Ordering::Relaxed);
                lock(&self.index).end_flight(id, arrived, tick);
                self.inflight_in.fetch_sub(bytes, Ordering::Relaxed);
            }
            Job::Settle => {
                let goal = *lock(&self.settle_goal);
                // A slice at a time, so that prefetches queued meanwhile go first.
                let mut outcome = self.evict_until_within(goal.target, SETTLE_SLICE_BYTES, None);
                if let (Eviction::Reached, Some(room)) = (outcome, goal.room) {
                    outcome =
                        self.evict_until_within(room.level, SETTLE_SLICE_BYTES, Some(room.beyond));
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
    /// still needs (Belady's MIN evicts only when an op needs the room).
    pub(super) fn settle_point(&self, limits: &Limits) -> SettlePoint {
        let planned = match (limits.budget, self.plan()) {
            (Some(budget), Some(plan)) if limits.planning() => {
                // As far ahead as a move takes to land: an eviction for an op further away
                // can still run after this one, when it is known to be needed.
                let (_, now) = self.recorder.position();
                let transfer_ops = self.transfer_ops.load(Ordering::Relaxed);
                Some(crate::policy::prefetch::settle_target(
                    budget,
                    &plan,
                    now,
                    transfer_ops,
                ))
            }
            _ => None,
        };
        match planned {
            Some(target) => SettlePoint {
                trigger: target,
                target,
            },
            None => SettlePoint {
                trigger: limits.high_water,
                target: limits.low_water,
            },
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

    pub(super) fn settle_at(&self, limits: &Limits, point: SettlePoint) {
        if self.device_committed() > point.trigger {
            self.make_room(point.target);
        } else {
            self.spill_host_overflow(limits);
        }
    }
}
