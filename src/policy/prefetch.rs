//! Prefetch and settle decisions as pure functions of the plan and the engine's figures: which
//! spilled tensors are due (and which are kept back after a wasted prefetch), how high a
//! prefetch may fill the device, where the device is kept
//! after an op, and how the engine learns how far ahead a move must start. The engine and the
//! dry-run simulation ([`crate::plan`]) both call these, so that the simulation predicts what
//! the engine does rather than what a copy of it would.

use super::plan::{MAX_HEADROOM_LOOKAHEAD, NextUse, PeakAhead, PlanKey, UsePlan};

/// The largest lead a late tensor's prefetch trigger moves to, in ops beyond the window.
pub const MAX_LEAD: u32 = 64;

/// How many ops ahead prefetches are looked for: the window, plus as many ops as a move has
/// been taking to land.
pub fn reach(window: u32, transfer_ops: u32) -> u32 {
    window + transfer_ops
}

/// How many ops before its use a spilled tensor is fetched: the `reach`, plus the `lead` it
/// earned by arriving late before, brought nearer by its `wasted` prefetches.
pub fn ahead(reach: u32, lead: u32, wasted: Option<&Wasted>) -> u32 {
    let ahead = reach.saturating_add(lead);
    wasted.map_or(ahead, |w| w.ahead(ahead))
}

/// Whether a spilled tensor next used `next_use` ops away is due for a prefetch now (see
/// [`ahead`]).
pub fn is_due(next_use: NextUse, reach: u32, lead: u32, wasted: Option<&Wasted>) -> bool {
    matches!(next_use, NextUse::In(d) if d <= ahead(reach, lead, wasted))
}

/// The device level a prefetch for a use `distance` ops away may fill the device up to: the
/// budget, less the room the ops up to that use need (`headroom`, from
/// [`UsePlan::headroom_curve`]), so that the prefetched tensor is not evicted again before its
/// use. Past the curve's end its last value holds.
///
/// When the op at that use needs more than the budget by itself (`use_fits` false, see
/// [`use_fits`]), only the ops before it count: that op runs over the budget whether its
/// inputs come early or at its start, so room kept for it holds nothing back, and a tensor
/// fetched by the op itself is a wait for the whole move.
pub fn ceiling(budget: u64, headroom: &[u64], distance: u32, use_fits: bool) -> u64 {
    let counted = if use_fits {
        Some(distance as usize)
    } else {
        (distance as usize).checked_sub(1)
    };
    let ahead = counted
        .map(|k| headroom.get(k).or(headroom.last()).copied().unwrap_or(0))
        .unwrap_or(0);
    budget.saturating_sub(ahead)
}

/// A prefetch's [`ceiling`] where room for rebuilds is made beside prefetches
/// ([`RebuildRoom::BesidePrefetches`](super::recompute::RebuildRoom)): less the bytes of the
/// dropped tensors rebuilt before the prefetched tensor's use (`rebuilt_first`). The plan's
/// headroom counts what the recorded step made, in which those tensors stayed on the device;
/// their rebuilds make them again, and a device filled by prefetches would have to evict for
/// them while their op waits.
pub fn ceiling_beside_rebuilds(ceiling: u64, rebuilt_first: u64) -> u64 {
    ceiling.saturating_sub(rebuilt_first)
}

/// Whether a dropped tensor rebuilt `distance` ops from now takes its turn in the prefetch walk
/// that looks `reach` ops ahead, where rebuilds go there
/// ([`RebuildRoom::InPrefetchWalk`](super::recompute::RebuildRoom)): within the reach, as a
/// prefetch (a rebuild earns no lead: it never arrives late, its op waits for it).
pub fn is_rebuild_due(distance: u32, reach: u32) -> bool {
    distance <= reach
}

/// Whether the op `distance` ops after position `now` (wrapping into the next step) fits
/// `budget` by itself: its inputs and outputs, as the plan recorded them.
pub fn use_fits(plan: &UsePlan, budget: u64, now: u32, distance: u32) -> bool {
    plan.op_bytes(position_after(plan, now, distance)) <= budget
}

/// The position in the step of the op `distance` ops after position `now` (wrapping into the
/// next step).
fn position_after(plan: &UsePlan, now: u32, distance: u32) -> u32 {
    let len = u64::from(plan.len().max(1));
    ((u64::from(now) + u64::from(distance)) % len) as u32
}

/// Which use of a tensor a [`Wasted`] record is for: the tensor's plan key and the position in
/// the step of the use its wasted prefetches were fetched for. A waste says the device was too
/// full before that use; a parameter read in the forward and again by the optimizer may be
/// crowded out before the one and not the other. Kept per tensor (until 2026-12-06), the
/// GPT-125M's biases and layer-norm weights, wasted in its crowded forward at 25% of the peak,
/// were fetched two ops before their optimizer updates too, and there queued behind the
/// embedding's 154 MB moments: 3 ms of stall each (`docs/planner.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WastedFor {
    key: PlanKey,
    use_at: u32,
}

impl WastedFor {
    /// The use `next_use` ops after position `now` of the tensor keyed `key` (`None` where the
    /// plan knows no next use: nothing is fetched for it, so no waste is kept).
    pub fn use_of(plan: &UsePlan, key: PlanKey, now: u32, next_use: NextUse) -> Option<Self> {
        match next_use {
            NextUse::In(distance) => Some(Self {
                key,
                use_at: position_after(plan, now, distance),
            }),
            NextUse::Never | NextUse::Unknown => None,
        }
    }
}

/// The most times wasted prefetches halve how far ahead a tensor is fetched: enough to bring
/// any reach (a window of a few thousand ops) down to the next op.
pub const MAX_HALVINGS: u32 = 16;

/// A tensor's wasted prefetches for one of its uses ([`WastedFor`]): brought back and evicted
/// again before that use, the device too full between the two. From then on the tensor is
/// fetched nearer that use: half as far ahead for each waste, and no further ahead than where
/// it was last evicted (down to the op before its use), so that it lands where the device has
/// room for it instead of moving twice. A prefetch kept from the tensor altogether (as one was
/// for a few steps after each waste, until 2026-12-06) makes its op wait for the whole move: in
/// the GPT's optimizer, which streams its state over the link with room to spare near each use,
/// each Adam update waited about 190 µs for a moment fetched at its op (`docs/planner.md`, "A
/// wasted prefetch comes nearer").
#[derive(Debug, Clone, Copy, Default)]
pub struct Wasted {
    halvings: u32,
    /// The fewest ops before its use that a prefetch of it was evicted at, less one.
    within: Option<u32>,
}

impl Wasted {
    /// One more of its prefetches was wasted, evicted `left` ops before its use (`None` where
    /// the plan does not know).
    pub fn strike(&mut self, left: Option<u32>) {
        self.halvings = (self.halvings + 1).min(MAX_HALVINGS);
        if let Some(left) = left {
            let within = left.saturating_sub(1).max(1);
            self.within = Some(self.within.map_or(within, |w| w.min(within)));
        }
    }

    /// How far ahead of its use (in ops) the tensor is fetched, where it would be fetched
    /// `ahead` ops early with no waste: halved for each waste, no further than where it was
    /// evicted, at least 1.
    pub fn ahead(&self, ahead: u32) -> u32 {
        (ahead >> self.halvings)
            .min(self.within.unwrap_or(u32::MAX))
            .max(1)
    }
}

/// A tensor that arrived late is asked for earlier next step (Capuchin's rule): its lead
/// doubles, from 1 up to [`MAX_LEAD`].
pub fn lead_after_late(lead: u32) -> u32 {
    (lead.saturating_mul(2)).clamp(1, MAX_LEAD)
}

/// Folds one prefetch that took `took` ops from queueing to landing into the running worst
/// case `old`, which decays by an eighth per sample so that one slow transfer is forgotten.
pub fn learn_transfer_ops(old: u32, took: u32) -> u32 {
    let decayed = old - old.div_ceil(8).min(old);
    took.min(MAX_LEAD).max(decayed)
}

/// Where the device is brought after the op at position `now`, once a plan exists: the budget
/// less the bytes the ops ahead add, as far ahead as a move takes to land (an eviction for an
/// op further away can still run after this one, when it is known to be needed). Any more
/// headroom would only move bytes the step still needs (Belady's MIN evicts only when an op
/// needs the room).
pub fn settle_target(budget: u64, plan: &UsePlan, now: u32, transfer_ops: u32) -> u64 {
    budget.saturating_sub(plan.headroom(now, 1 + transfer_ops))
}

/// How many ops ahead of the next one (as [`settle_target`] counts its `transfer_ops`) the
/// settle also keeps room for the tensors dropped to be rebuilt there. A rebuild's bytes come
/// back at its op with no prefetch to make room for them first: left to that op, the room is an
/// eviction it waits for, on a link the moves keep busy. Made as far ahead as the outputs'
/// room, and one op further, it is a settle's eviction the ops run beside. (Chosen on the
/// planner's predictions for the five built-in devices, ResNet-50, the GPT and the small
/// models, `both` and `recompute` at 50/33/25% of the peak: 30 of 110 figures better, by up to
/// 8.2 points, 8 worse, by at most 0.9; keeping room for every rebuild within the prefetch
/// reach instead held prefetches back and cost the GPT up to 72 points at 25%.)
pub fn rebuild_reach(transfer_ops: u32) -> u32 {
    transfer_ops.saturating_add(1)
}

/// How fast the device's victims leave against how fast its ops run: what
/// [`settle_lookahead`] weighs.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Pace {
    /// Seconds one byte of eviction takes beyond each move's fixed cost, as moves so far took
    /// (0 before any; see `MoveHistory::seconds_per_byte`).
    pub evict_seconds_per_byte: f64,
    /// Seconds an op of the recorded step computes, on average (0 before one is recorded).
    pub op_seconds: f64,
}

/// How many ops beyond the next one the settle after position `now` makes room for (the
/// `transfer_ops` that [`settle_target`] and [`settle_ahead`] take): as many as a prefetch
/// takes to land (`transfer_ops`, learnt), and further while the link is the slower side.
///
/// Room made just in time holds when the victims leave faster than the ops grow the device.
/// Where a stretch of ops needs more room than the link can empty while the ops before it run
/// (a forward pass whose activations outgrow a PCIe link), each op waits for its own
/// evictions, queued behind the ones before. Room for op `k` ahead is then made now: the bytes
/// the ops up to it add, at the measured eviction pace, take longer than the `k` ops before
/// it compute. Those moves spread over the ops that run while the link would be idle. On a
/// link fast against the ops (a CPU backend, whose moves are buffer handovers) no op
/// qualifies, and the settle stays just in time (Belady's MIN, which evicts only when an op
/// needs the room). Looks at most [`MAX_HEADROOM_LOOKAHEAD`] ops ahead, the plan's horizon.
///
/// The pace is per byte, without the moves' fixed cost: counted per byte, a latency makes a
/// stretch of small tensors look as slow to empty as one of tensors many times their size, and
/// the dry run then had small models (the `policies` bench's CNN and Transformer on
/// `h200-pcie5`) make room 64 ops ahead and lose up to 59 points of step time.
pub fn settle_lookahead(plan: &UsePlan, now: u32, transfer_ops: u32, pace: Pace) -> u32 {
    transfer_ops.max(link_lookahead(plan, now, pace))
}

/// The furthest op `k` ahead (0 when none) that needs more room than the ops before it, room
/// that cannot be made in time from its own settle (see [`settle_lookahead`]).
fn link_lookahead(plan: &UsePlan, now: u32, pace: Pace) -> u32 {
    let Pace {
        evict_seconds_per_byte: per_byte,
        op_seconds,
    } = pace;
    if !(per_byte > 0.0 && op_seconds > 0.0) {
        return 0;
    }
    // No stretch needs more than the plan's largest headroom: ops further than that takes to
    // evict are never behind, so the walk stops there (most ops of a CPU backend walk none).
    let horizon = plan.max_headroom() as f64 * per_byte / op_seconds;
    if horizon <= 1.0 {
        return 0;
    }
    // The op at `horizon` itself is not behind; truncated, one past it (no libm call per op).
    let walk = (horizon as u32)
        .saturating_add(1)
        .min(MAX_HEADROOM_LOOKAHEAD);
    let (mut furthest, mut before) = (0, 0);
    for (k, need) in plan.headroom_steps(now, walk).enumerate() {
        // An op that needs no more than the ones before it is covered by their room.
        if k > 0 && need > before && need as f64 * per_byte > k as f64 * op_seconds {
            furthest = k as u32;
        }
        before = need;
    }
    furthest
}

/// Room for the step's coming peak, made early while the link to the host is idle: the device
/// level to evict down to (the budget less the room the ops need at their most over the next
/// whole step, [`UsePlan::peak_ahead`]) and how many ops ahead that most is reached (only
/// tensors used after it may go). `None` when the link can make that room in time on its own:
/// the bytes that must leave before the peak (`committed` device bytes plus its room, less the
/// budget) take no longer at the measured eviction pace than the ops before it compute.
///
/// Why: the settle looks at most [`MAX_HEADROOM_LOOKAHEAD`] ops ahead, and where a forward
/// pass's activations outgrow a PCIe link, its evictions queue behind each other and the
/// backward waits behind them, while the link sat idle through the optimizer's last ops and
/// the forward's first. What Belady's MIN evicts for the peak anyway (tensors used after it,
/// the optimizer's state first) can leave then. On a CPU backend, whose moves are buffer
/// handovers, the link is rarely behind and little leaves early.
///
/// `paced`: each pass takes at most [`EARLY_PASS_OPS`] ops' worth of link time off the device
/// (at the measured pace), and the next pass, once those have left, takes the next share.
pub fn early_room(
    budget: u64,
    plan: &UsePlan,
    now: u32,
    committed: u64,
    pace: Pace,
    paced: bool,
) -> Option<(u64, u32)> {
    let Pace {
        evict_seconds_per_byte: per_byte,
        op_seconds,
    } = pace;
    if !(per_byte > 0.0 && op_seconds > 0.0) {
        return None;
    }
    let PeakAhead { room, after } = plan.peak_ahead(now);
    let must_leave = (committed + room).saturating_sub(budget);
    if must_leave as f64 * per_byte <= f64::from(after) * op_seconds {
        return None;
    }
    let level = budget.saturating_sub(room);
    if !paced {
        return Some((level, after));
    }
    // Saturating: a pace of nearly nothing per byte would make a share of every byte.
    let share = (f64::from(EARLY_PASS_OPS) * op_seconds / per_byte) as u64;
    Some((level.max(committed.saturating_sub(share)), after))
}

/// The most link time, in ops, one paced early pass ([`early_room`]) sends off the device:
/// the settle's horizon ([`MAX_HEADROOM_LOOKAHEAD`]). An eviction the next ops need queues
/// behind what an early pass sent; paced, it waits at most about as long as the ops the settle
/// makes room for run. Sent at once, ResNet-50 at batch 2 stalled longer in its forward with
/// the same bytes moved (2.86 to 4.55 ms): swap-only with room made early at once went from
/// +22.0 to +30.7% at 33% of its peak on `h200-pcie5`, and paced to +21.8% (1 to 128 ops per
/// pass gave +21.8%; 256 and more, +44.6% at 25%). `swap` and `recompute` pace it; on the GPTs
/// a pass sent at once is faster under `both`, so `both` has either (see
/// `policy::recompute::BEHAVIOURS`).
pub const EARLY_PASS_OPS: u32 = MAX_HEADROOM_LOOKAHEAD;

/// How many ops beyond [`settle_target`]'s an eviction pass that runs anyway also makes room
/// for (see [`settle_ahead`]).
pub const SETTLE_AHEAD_OPS: u32 = 8;

/// Where an eviction pass that [`settle_target`] set off goes on to, and how many ops away a
/// tensor's next use must be for it to be taken there: the room [`SETTLE_AHEAD_OPS`] more ops
/// need. A pass ranks every resident tensor, which costs the op thread more than the few
/// victims it moves, and while the step grows nearly every op would set one off; going on for
/// the next ops' room lets them run without one. Only tensors used after those ops go, so
/// nothing they read moves early: what leaves is what Belady's MIN would evict for them.
///
/// A device that drops its victims goes on too. It once did not (the CNN at 30% with
/// recompute on then ran an op that was over the budget by itself 32 B further over; it runs
/// no further over now), and without it nearly every op of a step that grows set off a pass of
/// its own: the tiny Transformer at 30% ran 42 passes a step under `recompute` against swap's
/// 15, now 14 (`docs/overhead.md`).
pub fn settle_ahead(budget: u64, plan: &UsePlan, now: u32, transfer_ops: u32) -> (u64, u32) {
    let lookahead = 1 + transfer_ops + SETTLE_AHEAD_OPS;
    (
        budget.saturating_sub(plan.headroom(now, lookahead)),
        lookahead,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefetch_keeping_rebuild_room_fills_the_device_that_much_less() {
        let ceiling = ceiling(100, &[10, 20, 30], 1, true);
        assert_eq!(ceiling, 80);
        assert_eq!(ceiling_beside_rebuilds(ceiling, 0), 80);
        assert_eq!(ceiling_beside_rebuilds(ceiling, 25), 55);
        assert_eq!(
            ceiling_beside_rebuilds(ceiling, 500),
            0,
            "never below empty"
        );
    }

    #[test]
    fn each_wasted_prefetch_halves_how_far_ahead_the_tensor_is_fetched() {
        let mut wasted = Wasted::default();
        assert!(is_due(NextUse::In(100), 90, 10, None));
        assert!(is_due(NextUse::In(100), 90, 10, Some(&wasted)));
        wasted.strike(None);
        assert_eq!(ahead(90, 10, Some(&wasted)), 50);
        assert!(is_due(NextUse::In(50), 90, 10, Some(&wasted)));
        assert!(!is_due(NextUse::In(51), 90, 10, Some(&wasted)));
        wasted.strike(None);
        assert_eq!(ahead(90, 10, Some(&wasted)), 25);
        for _ in 0..40 {
            wasted.strike(None);
        }
        // Never nearer than the op before the use, which still gets its prefetch.
        assert_eq!(wasted.ahead(100), 1);
        assert_eq!(wasted.ahead(1 << 16), 1);
        assert!(is_due(NextUse::In(1), 90, 10, Some(&wasted)));
        assert!(!is_due(NextUse::In(2), 90, 10, Some(&wasted)));
    }

    #[test]
    fn a_wasted_prefetch_is_fetched_after_where_it_was_evicted() {
        let mut wasted = Wasted::default();
        // Evicted 20 ops before its use: next time it comes within 19, though half the reach
        // is 50.
        wasted.strike(Some(20));
        assert_eq!(ahead(90, 10, Some(&wasted)), 19);
        // A later waste further from the use keeps the nearer bound; halving goes on.
        wasted.strike(Some(40));
        assert_eq!(ahead(90, 10, Some(&wasted)), 19);
        wasted.strike(Some(30));
        assert_eq!(
            ahead(90, 10, Some(&wasted)),
            12,
            "a hundred halved three times"
        );
        wasted.strike(Some(0));
        assert_eq!(
            ahead(90, 10, Some(&wasted)),
            1,
            "never nearer than the op before"
        );
    }

    #[test]
    fn the_ceiling_leaves_the_room_the_ops_up_to_the_use_need() {
        let headroom = [10, 30, 30, 50];
        assert_eq!(ceiling(100, &headroom, 0, true), 90);
        assert_eq!(ceiling(100, &headroom, 3, true), 50);
        // Past the curve its last value holds; an empty curve asks for nothing.
        assert_eq!(ceiling(100, &headroom, 9, true), 50);
        assert_eq!(ceiling(100, &[], 9, true), 100);
        assert_eq!(ceiling(20, &headroom, 3, true), 0);
        // A use that is over the budget by itself keeps no room for itself, only for the ops
        // before it.
        assert_eq!(ceiling(100, &headroom, 3, false), 70);
        assert_eq!(ceiling(100, &headroom, 0, false), 100);
    }

    #[test]
    fn a_use_fits_when_its_op_s_inputs_and_outputs_do() {
        const KIB: u64 = 1024;
        // Op 0 reads 1 and 2 and makes 3 (3 KiB in all); op 1 reads 3 and makes 4 (2 KiB).
        let t = crate::plan::tests::tape(
            &[("float_add", &[1, 2], &[3]), ("float_exp", &[3], &[4])],
            &[(1, KIB), (2, KIB), (3, KIB), (4, KIB)],
            &[],
        );
        let plan = UsePlan::from_tape(&t, None);
        assert!(use_fits(&plan, 3 * KIB, 0, 0));
        assert!(!use_fits(&plan, 2 * KIB, 0, 0));
        assert!(use_fits(&plan, 2 * KIB, 0, 1));
        // One op on from the last is the next step's first.
        assert!(!use_fits(&plan, 2 * KIB, 1, 1));
    }

    #[test]
    fn the_settle_looks_as_far_ahead_as_the_link_falls_behind_the_ops() {
        const KIB: u64 = 1024;
        const MS: f64 = 1e-3;
        // Op k's room is k + 1 KiB, and 6 KiB from op 5 on, into the next step.
        let plan = UsePlan::from_tape(&crate::plan::tests::growing_tape(), None);
        let pace = |evict_ms_per_kib: f64, op_ms: f64| Pace {
            evict_seconds_per_byte: evict_ms_per_kib * MS / KIB as f64,
            op_seconds: op_ms * MS,
        };
        // Nothing measured yet: as far as a prefetch takes to land.
        assert_eq!(settle_lookahead(&plan, 0, 0, Pace::default()), 0);
        assert_eq!(settle_lookahead(&plan, 0, 3, Pace::default()), 3);
        // A link ten times faster than the ops grow the device: just in time.
        assert_eq!(settle_lookahead(&plan, 0, 0, pace(0.1, 1.0)), 0);
        // A KiB leaves in 1 ms and an op takes 1.5: op 1's 2 KiB take 2 ms, longer than op
        // 0's 1.5; op 2's 3 KiB take 3 ms, as long as ops 0 and 1 run.
        assert_eq!(settle_lookahead(&plan, 0, 0, pace(1.0, 1.5)), 1);
        // A prefetch that takes longer to land still sets it.
        assert_eq!(settle_lookahead(&plan, 0, 3, pace(1.0, 1.5)), 3);
        // A link slower than every op: every op's room up to op 5, the last that grows the
        // device (op 6 frees it all; the next step's ops grow it less than that).
        assert_eq!(settle_lookahead(&plan, 0, 0, pace(2.0, 1.0)), 5);
        // Ops timed at next to nothing: the walk still stops at the plan's horizon.
        let instant_ops = Pace {
            evict_seconds_per_byte: 1.0,
            op_seconds: f64::MIN_POSITIVE,
        };
        assert_eq!(settle_lookahead(&plan, 0, 0, instant_ops), 5);
    }

    #[test]
    fn room_for_the_peak_is_made_early_only_when_the_link_would_fall_behind() {
        const KIB: u64 = 1024;
        const MS: f64 = 1e-3;
        // Op k's room is k + 1 KiB, and 6 KiB from op 5 on: the peak is 5 ops ahead of op 0.
        let plan = UsePlan::from_tape(&crate::plan::tests::growing_tape(), None);
        let PeakAhead { room, after } = plan.peak_ahead(0);
        assert_eq!((room, after), (6 * KIB, 5));
        let pace = |evict_ms_per_kib: f64, op_ms: f64| Pace {
            evict_seconds_per_byte: evict_ms_per_kib * MS / KIB as f64,
            op_seconds: op_ms * MS,
        };
        let budget = 8 * KIB;
        // 6 KiB on the device: 4 KiB must leave before the peak.
        let committed = 6 * KIB;
        // Nothing measured yet: nothing early.
        assert_eq!(
            early_room(budget, &plan, 0, committed, Pace::default(), false),
            None
        );
        // 4 KiB leave in 0.4 ms, the 5 ops before the peak run 5 ms: in time without it.
        assert_eq!(
            early_room(budget, &plan, 0, committed, pace(0.1, 1.0), false),
            None
        );
        // 4 KiB leave in 8 ms: down to the budget less the peak's room, from tensors used
        // after the peak.
        assert_eq!(
            early_room(budget, &plan, 0, committed, pace(2.0, 1.0), false),
            Some((2 * KIB, 5))
        );
        // Paced, a pass takes what leaves while the settle's horizon of ops runs: 64 ops of
        // 1 ms, at 32 ms a KiB, are 2 KiB; at 64 ms a KiB, 1 KiB. A share past what must
        // leave is what must leave.
        let paced = |evict_ms_per_kib| {
            early_room(
                budget,
                &plan,
                0,
                committed,
                pace(evict_ms_per_kib, 1.0),
                true,
            )
        };
        assert_eq!(paced(32.0), Some((4 * KIB, 5)));
        assert_eq!(paced(64.0), Some((5 * KIB, 5)));
        assert_eq!(paced(2.0), Some((2 * KIB, 5)));
        // Only what must leave counts: with 2 KiB on the device nothing must.
        assert_eq!(
            early_room(budget, &plan, 0, 2 * KIB, pace(2.0, 1.0), false),
            None
        );
    }

    #[test]
    fn leads_double_to_a_cap_and_the_transfer_estimate_decays() {
        assert_eq!(lead_after_late(0), 1);
        assert_eq!(lead_after_late(8), 16);
        assert_eq!(lead_after_late(MAX_LEAD), MAX_LEAD);
        assert_eq!(learn_transfer_ops(0, 3), 3);
        assert_eq!(learn_transfer_ops(16, 0), 14);
        assert_eq!(learn_transfer_ops(1, 0), 0);
        assert_eq!(learn_transfer_ops(0, 1000), MAX_LEAD);
        assert!(is_due(NextUse::In(5), 4, 1, None));
        assert!(!is_due(NextUse::In(6), 4, 1, None));
        assert!(!is_due(NextUse::Never, 4, 1, None));
    }
}
