//! The step and its plan: step boundaries, the per-step counters, the use plan rebuilt from
//! the tape, and where spilled tensors are due under it.

use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::engine::slot::Tier;
use crate::policy::plan::{KeyAt, NextUse, UsePlan};
use crate::policy::prefetch::WastedFor;
use crate::stats::{SpillStats, StepStats};

use super::{DeviceEngine, Limits, lock};
use crate::engine::index::Index;

/// Counters at the start of the current step, to report the step's own numbers.
#[derive(Default)]
pub(super) struct StepCounters {
    pub(super) step: Option<u64>,
    pub(super) start: SpillStats,
    pub(super) last: Option<StepStats>,
}

/// A plan and a position in a step: turns next uses into absolute positions. It holds the
/// plan as it was given: an `Arc` where it outlives the call, a borrow on the per-op path,
/// where each clone of the `Arc` is two more atomic read-modify-writes.
pub(super) struct Placement<P = Arc<UsePlan>> {
    pub(super) plan: P,
    pub(super) step: u64,
    pub(super) now: u32,
}

impl<P: Deref<Target = UsePlan>> Placement<P> {
    /// The absolute position `d` ops from now (a distance past the end of the step lands in
    /// the next one, whose positions restart at 0).
    pub(super) fn absolute(&self, d: u32) -> u64 {
        let left = self.plan.len().saturating_sub(self.now);
        if d < left || left == 0 {
            crate::engine::index::absolute(self.step, self.now.saturating_add(d))
        } else {
            crate::engine::index::absolute(self.step + 1, d - left)
        }
    }

    pub(super) fn due_of(&self, next: NextUse) -> Option<u64> {
        match next {
            NextUse::In(d) => Some(self.absolute(d)),
            NextUse::Never | NextUse::Unknown => None,
        }
    }

    /// Where a spilled tensor next used at `next` is placed for the prefetch scan: `lead` ops
    /// before its use (the lead it earned by arriving late), so that the scan finds it once
    /// the window reaches that far and no sooner.
    pub(super) fn due_with_lead(&self, next: NextUse, lead: u32) -> Option<u64> {
        match next {
            NextUse::In(d) => Some(self.absolute(d.saturating_sub(lead))),
            NextUse::Never | NextUse::Unknown => None,
        }
    }

    /// Where a spilled tensor fetched `ahead` ops before its use at `next` is placed for a
    /// prefetch scan that looks `reach` ops ahead: where the scan finds it once it is due and no
    /// sooner. With `ahead` the reach plus a lead, that is [`due_with_lead`](Self::due_with_lead);
    /// a tensor fetched nearer its use after wasted prefetches is placed past its use, so that
    /// the scans before it is due pass it by.
    pub(super) fn due_within(&self, next: NextUse, ahead: u32, reach: u32) -> Option<u64> {
        match next {
            NextUse::In(d) => Some(self.absolute(d.saturating_add(reach).saturating_sub(ahead))),
            NextUse::Never | NextUse::Unknown => None,
        }
    }

    /// The next use of the tensor keyed `key`, as a wasted prefetch of it is recorded for, and
    /// how many ops from now it is (`None` where the plan knows no next use).
    pub(super) fn wasted_use(&self, key: KeyAt) -> Option<(WastedFor, u32)> {
        let next = self.plan.next_use(key, self.step, self.now);
        Some((
            WastedFor::use_of(&self.plan, key.key, self.now, next)?,
            next.distance()?,
        ))
    }

    /// Where the spilled tensor keyed `key`, with `lead`, is placed for the prefetch scan (see
    /// [`due_with_lead`](Self::due_with_lead)).
    pub(super) fn due(&self, key: Option<KeyAt>, lead: u32) -> Option<u64> {
        self.due_with_lead(self.plan.next_use(key?, self.step, self.now), lead)
    }
}

impl DeviceEngine {
    /// Closes the current step and opens a marked one; recording starts if it was off.
    pub fn step_begin(&self) {
        if !self.recorder.is_enabled() {
            self.recorder.set_enabled(true);
        }
        self.recorder.boundary(true);
        self.in_marked_step.store(true, Ordering::Relaxed);
        self.step_closed();
    }

    /// Closes the step's counters and refreshes the plan at a marked boundary, rather than at
    /// the next op, so that `stats().last_step` is up to date at once.
    pub(super) fn step_closed(&self) {
        if self.limits().planning() {
            self.step_changed(self.recorder.position().0);
        }
        self.check_pool();
    }

    /// Closes the current marked step. Without a matching `step_begin` it only warns: the tape
    /// is left as it is.
    pub fn step_end(&self) {
        if !self.in_marked_step.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                target: "burn_spill::tape",
                "step_end without step_begin; ignored (the tape is unchanged)"
            );
            return;
        }
        self.recorder.boundary(false);
        self.step_closed();
    }

    /// The use plan in force, if the tape has recorded a step.
    pub fn plan(&self) -> Option<Arc<UsePlan>> {
        self.plan.get().0
    }

    /// The use plan in force with the number it was put in force under (read together, under
    /// the plan's lock): what a remembered next use is checked against.
    pub(super) fn plan_and_generation(&self) -> (Option<Arc<UsePlan>>, u64) {
        self.plan.get()
    }

    /// On a new step: closes the previous step's counters, and rebuilds the plan when the tape
    /// recorded a step or diverged since it was built.
    pub(super) fn step_changed(&self, step: u64) {
        // Runs before every op: the same step is told apart without the lock.
        if self.step_seen.load(Ordering::Acquire) == step + 1 {
            return;
        }
        {
            let mut steps = lock(&self.steps);
            if steps.step == Some(step) {
                return;
            }
            let now = self.ledger.stats();
            let peak = self.ledger.take_step_peak();
            if let Some(previous) = steps.step {
                let planned = self.plan().map_or(0, |p| p.recorded_peak());
                let mut stats = step_stats(previous, &steps.start, &now, planned, peak);
                (stats.windows, stats.saturated_windows) = *lock(&self.windows);
                steps.last = Some(stats);
            }
            steps.step = Some(step);
            steps.start = now;
            self.step_seen.store(step + 1, Ordering::Release);
        }
        let epoch = self.recorder.plan_epoch();
        let mut built = lock(&self.plan_epoch);
        if *built == Some(epoch) {
            return;
        }
        // A divergence found while verifying leaves only the old recording; one found by
        // comparing two recordings comes with a fresh tape, which is the truth now.
        let diverged =
            built.is_some_and(|(tapes, divergences)| divergences != epoch.1 && tapes == epoch.0);
        *built = Some(epoch);
        drop(built);
        let (previous, last) = self.recorder.last_two();
        let plan = match last {
            // A divergence makes the recorded step stale until the next one is recorded.
            Some(_) if diverged => None,
            Some(tape) => {
                self.check_windows(&tape);
                self.choose_behaviour(&tape);
                let mut plan = UsePlan::from_tape(&tape, previous.as_deref());
                if let Some(old) = self.plan() {
                    plan.inherit_carried(&old);
                }
                Some(Arc::new(plan))
            }
            None => None,
        };
        if plan.is_none() {
            lock(&self.leads).clear();
            lock(&self.wasted).clear();
        }
        let headroom = plan
            .as_ref()
            .map_or(0, |p| p.max_headroom().saturating_add(1));
        let has_plan = plan.is_some();
        self.plan.set(plan);
        self.plan_headroom.store(headroom, Ordering::Relaxed);
        // Spilled tensors are placed by the plan in force.
        let placement = self.placement();
        let mut index = lock(&self.index);
        self.order_index(&mut index, has_plan);
        let leads = lock(&self.leads);
        for (id, key) in index.spilled_keys() {
            let lead = leads.get(&key.key).copied().unwrap_or(0);
            let due = placement.as_ref().and_then(|p| p.due(Some(key), lead));
            index.set_due(id, due);
        }
    }

    /// Lets the index drop its queues of last use while a plan ranks the victims, and has it
    /// keep them otherwise (see [`Index::keep_order`]).
    pub(super) fn order_index(&self, index: &mut Index, has_plan: bool) {
        let planning = self.with_limits(Limits::planning);
        index.keep_order(!(planning && has_plan));
    }

    /// The plan and where the step stands, to place spilled tensors by their next use.
    pub(super) fn placement(&self) -> Option<Placement> {
        let limits = self.limits();
        if !limits.planning() || limits.prefetch_window == 0 {
            return None;
        }
        let (step, now) = self.recorder.position();
        Some(Placement {
            plan: self.plan()?,
            step,
            now,
        })
    }

    /// Replays the recorded step with the policy in force under the budget (with a plan the
    /// engine keeps only the headroom the next ops need), and checks each window of
    /// `prefetch_window` ops against the measured host link: a window whose planned moves exceed
    /// bandwidth x compute time is saturated (logged, and counted in the step stats). The
    /// whole step's figure is the link's utilization the drop decision reads.
    pub(super) fn check_windows(&self, tape: &crate::tape::StepTape) {
        let limits = self.limits();
        let capacity = limits.budget.unwrap_or(limits.high_water);
        let (replay, moved) = crate::policy::simulate::replay_per_op(tape, capacity, limits.policy);
        let windows = crate::policy::windows::cut(
            tape,
            &moved,
            limits.prefetch_window.max(1),
            self.restore_bandwidth(Tier::Device),
        );
        let saturated = windows.iter().filter(|w| w.saturated()).count() as u32;
        if saturated > 0 {
            tracing::info!(target: "burn_spill::plan", saturated, windows = windows.len(),
                planned_bytes = replay.bytes_moved(),
                "the planned moves exceed the measured bandwidth in some windows; expect stalls");
        }
        *lock(&self.windows) = (windows.len() as u32, saturated);
        let compute_seconds = limits.rebuild_times.compute_seconds(tape);
        let op_seconds = compute_seconds / tape.ops.len().max(1) as f64;
        self.op_seconds
            .store(op_seconds.to_bits(), Ordering::Relaxed);
        let utilization = crate::policy::windows::link_utilization(
            &replay,
            compute_seconds,
            self.restore_bandwidth(Tier::Device),
        );
        self.link_utilization
            .store(utilization.to_bits(), Ordering::Relaxed);
    }

    /// What the last finished step did (needs a tape-driven policy or prefetch, which track
    /// steps).
    pub fn last_step_stats(&self) -> Option<StepStats> {
        lock(&self.steps).last
    }
}

/// The difference of two counter snapshots, as one step's numbers.
pub(super) fn step_stats(
    step: u64,
    start: &SpillStats,
    end: &SpillStats,
    planned_peak: u64,
    actual_peak: u64,
) -> StepStats {
    let diff = |a: crate::MoveStats, b: crate::MoveStats| b.since(&a);
    StepStats {
        step,
        prefetch_hits: end.prefetch_hits.saturating_sub(start.prefetch_hits),
        prefetch_misses: end.prefetch_misses.saturating_sub(start.prefetch_misses),
        stall_time: end.stall_time.saturating_sub(start.stall_time),
        device_to_host: diff(start.device_to_host, end.device_to_host),
        host_to_device: diff(start.host_to_device, end.host_to_device),
        host_to_disk: diff(start.host_to_disk, end.host_to_disk),
        disk_to_device: diff(start.disk_to_device, end.disk_to_device),
        planned_peak_device_bytes: planned_peak,
        actual_peak_device_bytes: actual_peak,
        windows: 0,
        saturated_windows: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::index::absolute;
    use crate::tape::{OpRecord, StepTape};

    /// A placement in step `step`, `now` ops into a plan of `len` ops.
    fn placement(len: usize, step: u64, now: u32) -> Placement {
        let op = || OpRecord {
            name: "op".into(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            start_ns: 0,
            duration_ns: 1,
            thread: 1,
        };
        let tape = StepTape {
            ops: (0..len).map(|_| op()).collect(),
            ..Default::default()
        };
        Placement {
            plan: Arc::new(UsePlan::from_tape(&tape, None)),
            step,
            now,
        }
    }

    #[test]
    fn a_lead_places_a_spilled_tensor_that_many_ops_before_its_use() {
        let p = placement(10, 3, 8);
        let next = NextUse::In(5);
        assert_eq!(
            p.due_with_lead(next, 0),
            Some(absolute(4, 3)),
            "its use, next step"
        );
        assert_eq!(p.due_with_lead(next, 3), Some(absolute(4, 0)));
        assert_eq!(
            p.due_with_lead(next, 4),
            Some(absolute(3, 9)),
            "back across the step boundary"
        );
        assert_eq!(
            p.due_with_lead(next, 64),
            Some(absolute(3, 8)),
            "no earlier than now"
        );
        assert_eq!(p.due_with_lead(NextUse::Never, 3), None);
        assert_eq!(p.due_with_lead(next, 0), p.due_of(next));
    }

    #[test]
    fn a_tensor_fetched_nearer_its_use_is_placed_where_the_scan_finds_it_then() {
        let p = placement(10, 3, 8);
        let next = NextUse::In(5);
        // Reach 4 and lead 2: found 6 ops before its use, as with its lead alone.
        assert_eq!(p.due_within(next, 6, 4), p.due_with_lead(next, 2));
        // Fetched 1 op ahead, by a scan that looks 4 ahead: placed 3 ops past its use, which
        // such a scan reaches 1 op before the use.
        assert_eq!(p.due_within(next, 1, 4), Some(absolute(4, 6)));
        assert_eq!(p.due_within(NextUse::Never, 1, 4), None);
    }

    /// The settle weighs the link against the checked step's ops, timed as rebuilds are.
    #[test]
    fn the_step_check_learns_how_long_an_op_takes() {
        let engine = DeviceEngine::default();
        engine.limits.set(Limits {
            budget: Some(1 << 20),
            ..Limits::default()
        });
        assert_eq!(engine.pace().op_seconds, 0.0, "no step checked yet");
        let op = |duration_ns| OpRecord {
            name: "op".into(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            start_ns: 0,
            duration_ns,
            thread: 1,
        };
        let tape = StepTape {
            ops: vec![op(1_000), op(3_000)],
            ..Default::default()
        };
        engine.check_windows(&tape);
        assert!((engine.pace().op_seconds - 2e-6).abs() < 1e-12);
    }
}
