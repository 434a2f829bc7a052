//! Prefetch: spilled tensors due within the window queued back to the device soonest first,
//! while they fit beside the room the ops before their use need.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::engine::index::Spilled;
use crate::engine::ledger::Direction;
use crate::engine::slot::{TensorId, Tier};
use crate::engine::transfer::{Job, Lane};
use crate::policy::plan::{NextUse, UsePlan};
use crate::policy::prefetch::{self as decide, WastedFor};
use crate::policy::recompute::RebuildRoom;

use super::step::Placement;
use super::{DeviceEngine, Limits, lock};

/// One turn of the prefetch walk: a spilled tensor to bring back, or a dropped tensor whose
/// rebuild takes room the walk keeps from later prefetches ([`RebuildRoom::InPrefetchWalk`]).
enum Turn {
    Prefetch(Spilled),
    Rebuild { id: TensorId, bytes: u64 },
}

impl Turn {
    fn id(&self) -> TensorId {
        match self {
            Turn::Prefetch(spilled) => spilled.id,
            Turn::Rebuild { id, .. } => *id,
        }
    }

    fn bytes(&self) -> u64 {
        match self {
            Turn::Prefetch(spilled) => spilled.bytes,
            Turn::Rebuild { bytes, .. } => *bytes,
        }
    }
}

/// Room a prefetch waits for: the device level at which it fits, to be reached by evicting
/// only tensors next used after `beyond` (an absolute position; see [`crate::engine::index::absolute`]).
/// Evicting a tensor needed before the prefetched one would only trade one move for another
/// (Belady's rule: the furthest next use leaves first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Room {
    pub(super) level: u64,
    pub(super) beyond: u64,
}

impl DeviceEngine {
    /// Queues prefetches for spilled tensors whose next use falls within the window (plus the
    /// lead each has earned by arriving late), soonest first, while they fit: a tensor fits
    /// when the room the ops up to its use will need is left free beside it (so that it is not
    /// evicted again before its use). Returns the room to make for the first one left out.
    pub(super) fn prefetch_ahead(
        self: &Arc<Self>,
        limits: &Limits,
        plan: &UsePlan,
    ) -> Option<Room> {
        let (step, now) = self.recorder.position();
        let window = limits.prefetch_window.min(plan.len());
        let reach = decide::reach(window, self.transfer_ops.load(Ordering::Relaxed));
        let placement = Placement { plan, step, now };
        let rebuild_room = self.rebuild_room(limits);
        // A tensor is due within the reach plus its lead, and each is placed its lead before
        // its use: the scan looks as far as the reach. Where the behaviour says so, rebuilds
        // due within the reach take their turn too, as prefetches that move nothing.
        let mut due: Vec<(u32, Turn)> = {
            let mut index = lock(&self.index);
            let soon = index.due_until(placement.absolute(reach));
            let rebuilds = if rebuild_room == RebuildRoom::InPrefetchWalk {
                index.rebuilds_until(placement.absolute(reach))
            } else {
                Vec::new()
            };
            if soon.is_empty() && rebuilds.is_empty() {
                return None;
            }
            let leads = lock(&self.leads);
            let wasted = lock(&self.wasted);
            let mut due = Vec::new();
            for s in soon {
                let lead = leads.get(&s.key.key).copied().unwrap_or(0);
                let next_use = plan.next_use(s.key, step, now);
                let wasted =
                    WastedFor::use_of(plan, s.key.key, now, next_use).and_then(|w| wasted.get(&w));
                if decide::is_due(next_use, reach, lead, wasted) {
                    due.push((next_use.distance_or(u32::MAX), Turn::Prefetch(s)));
                } else {
                    // Placed under an older position, plan or lead, or fetched nearer its use
                    // since a waste: placed where this scan finds it once it is due.
                    let ahead = decide::ahead(reach, lead, wasted);
                    index.set_due(s.id, placement.due_within(next_use, ahead, reach));
                }
            }
            for (id, key, bytes) in rebuilds {
                if let NextUse::In(d) = plan.next_use(key, step, now)
                    && decide::is_rebuild_due(d, reach)
                {
                    due.push((d, Turn::Rebuild { id, bytes }));
                }
            }
            due
        };
        due.sort_by_key(|(d, turn)| (*d, turn.id()));
        let headroom = match due.last() {
            Some((furthest, _)) => plan.headroom_curve(now, furthest + 1),
            None => return None,
        };
        let budget = limits.budget.unwrap_or(u64::MAX);
        let mut used = self.device_committed();
        for (d, turn) in due {
            let fits = decide::use_fits(plan, budget, now, d);
            let mut ceiling = decide::ceiling(budget, &headroom, d, fits);
            if rebuild_room == RebuildRoom::BesidePrefetches {
                let rebuilt_first = lock(&self.index)
                    .rebuild_bytes_between(placement.absolute(0), placement.absolute(d));
                ceiling = decide::ceiling_beside_rebuilds(ceiling, rebuilt_first);
            }
            if used + turn.bytes() > ceiling {
                // Room for the soonest one left out is made by evicting tensors used after it;
                // the later ones wait for their turn.
                return Some(Room {
                    level: ceiling.saturating_sub(turn.bytes()),
                    beyond: placement.absolute(d),
                });
            }
            let spilled = match turn {
                Turn::Prefetch(spilled) => spilled,
                Turn::Rebuild { bytes, .. } => {
                    // Its op rebuilds it; the room it takes is kept from later prefetches.
                    used += bytes;
                    continue;
                }
            };
            let Some(victim) = lock(&self.index).start_flight(spilled.id) else {
                continue;
            };
            used += spilled.bytes;
            self.inflight_in.fetch_add(spilled.bytes, Ordering::Relaxed);
            self.ledger.on_prefetch_issued();
            let lane = match spilled.tier {
                Tier::Disk => Lane::Io,
                _ => Lane::Transfer,
            };
            let job = Job::Prefetch {
                victim,
                id: spilled.id,
                bytes: spilled.bytes,
                queued_at: (step, now),
            };
            let direction = match spilled.tier {
                Tier::Disk => Direction::DiskToDevice,
                _ => Direction::HostToDevice,
            };
            if limits.asynchronous && !self.cheaper_here(direction, spilled.bytes) {
                self.transfers.submit(self, lane, job);
            } else {
                // Synchronous engine, or a move cheaper than a hand-off: it runs here, between
                // ops.
                self.run_job(job);
            }
        }
        None
    }

    /// Folds the ops that passed while one prefetch was queued and moved into the running worst
    /// case, which decays by an eighth per sample so that one slow transfer is forgotten.
    pub(super) fn learn_transfer_ops(&self, (step, at): (u64, u32)) {
        let (now_step, now) = self.recorder.position();
        if now_step != step {
            return;
        }
        let old = self.transfer_ops.load(Ordering::Relaxed);
        self.transfer_ops.store(
            decide::learn_transfer_ops(old, now.saturating_sub(at)),
            Ordering::Relaxed,
        );
    }
}
