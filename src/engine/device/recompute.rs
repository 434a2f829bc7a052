//! Dropping a victim to be rebuilt instead of moving it: the memory rule checked against the
//! plan, the policy's decision asked, the adapter told to drop.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::engine::index::{Candidate, RebuildPlan};
use crate::engine::ledger::Direction;
use crate::engine::slot::Tier;
use crate::engine::transfer::on_worker;
use crate::policy::PolicyKind;
use crate::policy::plan::{KeyAt, NextUse, UsePlan};
use crate::policy::recompute::{self, OnOpThread, Rebuild, RebuildTimes, RecomputeMode, Victim};
use crate::policy::victim::Bandwidth;

use super::step::Placement;
use super::{DeviceEngine, Limits, lock};

/// What one eviction pass needs to decide drops: read once per pass.
pub(super) struct DropContext {
    mode: RecomputeMode,
    policy: PolicyKind,
    budget: u64,
    plan: Arc<UsePlan>,
    step: u64,
    now: u32,
    prefetch_window: u32,
    evict: Bandwidth,
    restore: Bandwidth,
    link_utilization: f64,
    asynchronous: bool,
    times: RebuildTimes,
}

impl DropContext {
    /// The absolute position (see [`crate::engine::index::absolute`]) of the use that rebuilds
    /// a tensor keyed `key` if it is dropped now, when the plan knows it.
    pub(super) fn rebuild_at(&self, key: Option<KeyAt>) -> Option<u64> {
        let next = self.plan.next_use(key?, self.step, self.now);
        let placement = Placement {
            plan: self.plan.clone(),
            step: self.step,
            now: self.now,
        };
        placement.due_of(next)
    }

    /// Whether victims are ranked by the cheaper of a move and a rebuild (`both` under
    /// `cost_aware`, on a busy link: see [`recompute::ranks_by_rebuild`]).
    pub(super) fn weighs_rebuilds(&self) -> bool {
        recompute::ranks_by_rebuild(self.mode, self.policy, self.link_utilization)
    }
}

impl DeviceEngine {
    /// The context for dropping victims in an eviction pass of the device tier, or `None` when
    /// nothing may be dropped (swap only, or no plan yet to tell that the inputs stay alive).
    pub(super) fn drop_context(&self, limits: &Limits) -> Option<DropContext> {
        // The memory rule reads the plan at the step's position, which a marked step counts
        // (outside one, found by the period detector, the position is not kept per op).
        let marked = self.in_marked_step.load(Ordering::Relaxed);
        if !limits.recompute.may_drop() || !limits.planning() || !marked {
            return None;
        }
        let plan = self.plan()?;
        let (step, now) = self.recorder.position();
        let moves = self.ledger.moves(Direction::DeviceToHost);
        Some(DropContext {
            mode: limits.recompute,
            policy: limits.policy,
            budget: limits.budget?,
            plan,
            step,
            now,
            prefetch_window: limits.prefetch_window,
            evict: Bandwidth::measured(moves.bytes, moves.time, Bandwidth::HOST_DEFAULT),
            restore: self.restore_bandwidth(Tier::Device),
            link_utilization: f64::from_bits(self.link_utilization.load(Ordering::Relaxed)),
            asynchronous: limits.asynchronous,
            times: limits.rebuild_times,
        })
    }

    /// Drops `candidate` from the device if it has a recipe, the memory rule holds and the
    /// policy prefers rebuilding it to moving it. Returns whether it was dropped (the caller
    /// marks it in the index).
    pub(super) fn try_drop(&self, candidate: &Candidate, context: &DropContext) -> bool {
        let Some((victim, rebuild)) = self.drop_terms(candidate, context) else {
            return false;
        };
        recompute::prefer_recompute(context.mode, &victim, &rebuild)
            && candidate.victim.drop_for_rebuild(self)
    }

    /// What a rebuild of `candidate` would cost the ops if it were dropped now, when the mode
    /// weighs rebuilds against moves (`both`): the victim policy ranks it by the cheaper of
    /// the two ways back. `None` when it may not be dropped, or would be moved if taken.
    pub(super) fn rebuild_cost(
        &self,
        candidate: &Candidate,
        context: &DropContext,
    ) -> Option<Duration> {
        if !context.weighs_rebuilds() {
            return None;
        }
        let (victim, rebuild) = self.drop_terms(candidate, context)?;
        // Only a victim that would be dropped is worth its rebuild's cost: one that would be
        // moved costs its move.
        recompute::prefer_recompute(context.mode, &victim, &rebuild)
            .then(|| Duration::from_secs_f64(recompute::exposed_rebuild_seconds(&victim, &rebuild)))
    }

    /// What moving `candidate` and rebuilding it would cost, if it has a recipe and the memory
    /// rule holds.
    fn drop_terms(
        &self,
        candidate: &Candidate,
        context: &DropContext,
    ) -> Option<(Victim, Rebuild)> {
        let recipe = candidate.victim.rebuild_plan()?;
        let next_use = self.next_use_if_inputs_outlive_it(candidate, &recipe, context)?;
        // A worker's copy runs behind the ops; on the op's thread, the op waits for it.
        let on_op_thread = OnOpThread {
            evict: !on_worker(),
            restore: !context.asynchronous
                || self.cheaper_here(Direction::HostToDevice, candidate.bytes),
        };
        let (evict_exposure, restore_exposure) = recompute::move_exposures(
            context.link_utilization,
            on_op_thread,
            next_use,
            context.prefetch_window,
        );
        let victim = Victim {
            bytes: candidate.bytes,
            evict: context.evict,
            restore: context.restore,
            evict_exposure,
            restore_exposure,
        };
        let rebuild = Rebuild {
            op_time: context.times.op_time(recipe.rebuild.op_time, &recipe.cost),
            ..recipe.rebuild
        };
        Some((victim, rebuild))
    }

    /// The memory rule: the distance to the candidate's next use in this step, if every input
    /// of its recipe is read again at or after that use (so the program keeps them alive until
    /// the rebuild, and the recipe holds nothing the program would have let go), and if the op
    /// at that use, with the recipe's inputs beside it for the rebuild, still fits the budget
    /// (a rebuild never takes an op over a budget it fits under when its inputs are moved).
    fn next_use_if_inputs_outlive_it(
        &self,
        candidate: &Candidate,
        recipe: &RebuildPlan,
        context: &DropContext,
    ) -> Option<u32> {
        let (plan, step, now) = (&context.plan, context.step, context.now);
        let index = lock(&self.index);
        let NextUse::In(distance) = plan.next_use(index.key_of(candidate.id)?, step, now) else {
            return None;
        };
        let rebuilt_at = now.checked_add(distance).filter(|&at| at < plan.len())?;
        if plan.op_bytes(rebuilt_at).saturating_add(recipe.input_bytes) > context.budget {
            return None;
        }
        let outlives = |input| {
            index
                .key_of(input)
                .is_some_and(|key| matches!(plan.next_use(key, step, rebuilt_at), NextUse::In(_)))
        };
        recipe
            .inputs
            .iter()
            .all(|&input| outlives(input))
            .then_some(distance)
    }
}
