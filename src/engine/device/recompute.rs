//! Dropping a victim to be rebuilt instead of moving it: the memory rule checked against the
//! plan, the policy's decision asked, the adapter told to drop; and under `both`, the
//! behaviour each plan runs with.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::engine::index::{Candidate, RebuildPlan};
use crate::engine::ledger::Direction;
use crate::engine::slot::Tier;
use crate::engine::transfer::on_worker;
use crate::plan::{self, DeviceProfile};
use crate::policy::PolicyKind;
use crate::policy::plan::{KeyAt, NextUse, UsePlan};
use crate::policy::recompute::{
    self, Behaviour, Chain, OnOpThread, Rebuild, RebuildRoom, RebuildTimes, RecomputeMode, Victim,
};
use crate::policy::victim::Bandwidth;
use crate::tape::StepTape;

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

    /// Whether victims are ranked by the cheaper of a move and a rebuild (`both` or
    /// `recompute` under `cost_aware`, on a busy link: see [`recompute::ranks_by_rebuild`]).
    pub(super) fn weighs_rebuilds(&self) -> bool {
        recompute::ranks_by_rebuild(self.mode, self.policy, self.link_utilization)
    }
}

/// The behaviour `both` runs the steps of the plan in force with: none until a plan has
/// chosen one of [`recompute::BEHAVIOURS`] (weighing each victim meanwhile). The choice is a
/// dry run of the recorded step per behaviour, which takes a second or more on a step of
/// thousands of ops, so it runs on a thread of its own while the steps go on; a choice made
/// for a plan or limits no longer in force is discarded. A plan made from a new recording of
/// the same program (the tape records a step again every `tape_resample_steps`) keeps the
/// choice made for it.
#[derive(Default)]
pub(super) struct BehaviourCell {
    /// One plus the chosen behaviour's place in [`recompute::BEHAVIOURS`] (0: none yet).
    code: AtomicU8,
    /// Counts the choices started and forgotten: a choice lands only if none started since.
    generation: AtomicU64,
    /// The latest choice started.
    choosing: Mutex<Choosing>,
}

/// The latest choice started: the step it was made for, and the thread making it.
#[derive(Default)]
struct Choosing {
    tape: Option<Arc<StepTape>>,
    thread: Option<JoinHandle<()>>,
}

impl BehaviourCell {
    /// The behaviour chosen, if one was.
    fn get(&self) -> Option<Behaviour> {
        let code = self.code.load(Ordering::Relaxed);
        let at = usize::from(code).checked_sub(1)?;
        recompute::BEHAVIOURS.get(at).copied()
    }

    /// Sets `behaviour` if no choice started or was forgotten since `generation`'s.
    pub(super) fn land(&self, generation: u64, behaviour: Behaviour) {
        let at = recompute::BEHAVIOURS
            .iter()
            .position(|b| *b == behaviour)
            .unwrap_or(0);
        let _current = lock(&self.choosing);
        if self.generation.load(Ordering::Relaxed) == generation {
            self.code.store(at as u8 + 1, Ordering::Relaxed);
        }
    }

    /// Starts a choice for `tape` in `choosing` (this cell's, locked): the generation it lands
    /// under, or `None` when the latest choice was started for a recording of the same program
    /// under the same limits (it stands, or is under way).
    fn start(&self, choosing: &mut Choosing, tape: &Arc<StepTape>) -> Option<u64> {
        if choosing
            .tape
            .as_ref()
            .is_some_and(|last| crate::tape::same_program(last, tape).is_ok())
        {
            return None;
        }
        choosing.tape = Some(tape.clone());
        Some(self.generation.fetch_add(1, Ordering::Relaxed) + 1)
    }

    /// Discards the choice in force and any under way (new limits call for a new one).
    pub(super) fn forget(&self) {
        let mut choosing = lock(&self.choosing);
        choosing.tape = None;
        self.generation.fetch_add(1, Ordering::Relaxed);
        self.code.store(0, Ordering::Relaxed);
    }

    /// Waits for the latest choice under way, if any.
    pub(super) fn settle(&self) {
        let choosing = lock(&self.choosing).thread.take();
        if let Some(thread) = choosing
            && thread.join().is_err()
        {
            tracing::warn!(target: "burn_spill::plan",
                "choosing the behaviour of a plan failed; it keeps the one in force");
        }
    }
}

impl DeviceEngine {
    /// What the engine does with its victims under `limits`: the configured mode, or under
    /// `both` the victims of the behaviour the plan in force was given (weighing each victim,
    /// `both`, before one was).
    pub(crate) fn recompute_behaviour(&self, limits: &Limits) -> RecomputeMode {
        self.chosen_behaviour(limits)
            .map_or(limits.recompute, |behaviour| behaviour.victims)
    }

    /// Where room for rebuilds is made ahead: under `both` and `recompute`, as the behaviour
    /// the plan in force chose (within what the config allows); otherwise, and before a plan
    /// chose, where the config says (by the settle only by default).
    pub(super) fn rebuild_room(&self, limits: &Limits) -> RebuildRoom {
        let configured = limits.rebuild_room.unwrap_or(RebuildRoom::AtSettle);
        self.chosen_behaviour(limits)
            .map_or(configured, |behaviour| behaviour.rebuild_room)
    }

    /// Whether the device's victim passes keep the step's state for last: as the config says,
    /// or under `both` as the behaviour of the plan in force says (the state moving before
    /// one was chosen).
    pub(super) fn keeps_state(&self, limits: &Limits) -> bool {
        match limits.keep_state {
            Some(keep) => keep,
            None => self
                .chosen_behaviour(limits)
                .is_some_and(|behaviour| behaviour.keeps_state),
        }
    }

    /// Whether the settle makes room early for the step's coming peak, and whether a share at a
    /// time (`Some(paced)`, see [`early_room`](crate::policy::prefetch::early_room)), with a
    /// budget: as the config says when it sets it; otherwise as the behaviour the plan in force
    /// chose under `both` and `recompute`; before one was chosen, a share at a time under
    /// `swap` and `recompute` (their rule before `recompute` chose) and not under `both`.
    pub(super) fn early_room_pacing(&self, limits: &Limits) -> Option<bool> {
        limits.budget?;
        if let Some(early) = limits.early_room {
            return early.pacing();
        }
        match self.chosen_behaviour(limits) {
            Some(behaviour) => behaviour.early_room().pacing(),
            None => (limits.recompute != RecomputeMode::Both).then_some(true),
        }
    }

    /// Under `both` and `recompute` with a budget, once a plan chose it: the behaviour the
    /// planned steps run with (what [`crate::RecomputeStats::behaviour`] reports).
    pub(super) fn chosen_behaviour(&self, limits: &Limits) -> Option<Behaviour> {
        if limits.recompute == RecomputeMode::Swap || limits.budget.is_none() {
            return None;
        }
        self.behaviour.get()
    }

    /// Sets the device profile `both` dry-runs its steps on (`None`: this machine as
    /// measured).
    pub fn set_rebuild_profile(&self, profile: Option<DeviceProfile>) {
        *lock(&self.rebuild_profile) = profile.map(Arc::new);
    }

    /// Under `both` and `recompute`, with a budget: chooses the behaviour the steps of the plan
    /// made from `tape` run with, by dry-running `tape` with each the mode may choose
    /// ([`recompute::candidates`]) on the configured profile (or this machine as measured:
    /// links and op times as this run saw them) and taking the fastest. Starts where the plan
    /// is made, once per plan, and lands when the dry runs are done (see [`BehaviourCell`]).
    pub(super) fn choose_behaviour(&self, tape: &Arc<StepTape>) {
        let limits = self.limits();
        let Some(budget) = limits.budget else { return };
        let candidates = recompute::candidates(
            limits.recompute,
            limits.rebuild_room,
            limits.keep_state,
            limits.early_room,
        );
        // Nothing to choose: `swap`, or a config that fixes every choice.
        if candidates.len() < 2 {
            return;
        }
        let profile = match lock(&self.rebuild_profile).clone() {
            Some(profile) => profile,
            None => Arc::new(DeviceProfile::measured(&self.ledger.stats())),
        };
        let settings = plan::Settings {
            budget,
            host_limit: limits.host_limit,
            policy: limits.policy,
            prefetch_window: limits.prefetch_window,
            asynchronous: limits.asynchronous,
            // The mode that chooses; each candidate sets the rest.
            recompute: limits.recompute,
            rebuild_room: RebuildRoom::AtSettle,
            keeps_lineage: !self.queues().fuses_ops(),
            state: plan::StateResidency::Movable,
            keeps_state: false,
            evicts_early: false,
            paces_early: false,
            // The engine's own recipes: it predicts what it will do.
            extra_recipes: plan::ExtraRecipes::NONE,
        };
        let cell = self.behaviour.clone();
        let mut choosing = lock(&cell.choosing);
        let Some(generation) = cell.start(&mut choosing, tape) else {
            return;
        };
        let tape = tape.clone();
        let choose = {
            let cell = cell.clone();
            move || {
                let op_seconds = plan::cost::op_seconds(&tape, &profile);
                let gaps = plan::cost::host_gaps(&tape, &profile);
                let chosen = plan::behaviour::choose(
                    &tape,
                    &profile,
                    &op_seconds,
                    &gaps,
                    settings,
                    &candidates,
                );
                tracing::info!(target: "burn_spill::plan", mode = %limits.recompute,
                    behaviour = %chosen.behaviour, profile = %profile.name,
                    predicted = ?chosen.predicted,
                    "the planned steps run with the behaviour the dry run predicts fastest");
                cell.land(generation, chosen.behaviour);
            }
        };
        // A thread that cannot start leaves the behaviour in force.
        match std::thread::Builder::new()
            .name("burn-spill-behaviour".into())
            .spawn(choose)
        {
            Ok(thread) => choosing.thread = Some(thread),
            Err(error) => tracing::warn!(target: "burn_spill::plan", %error,
                "no thread to choose the behaviour of a plan; it keeps the one in force"),
        }
    }

    /// The context for dropping victims in an eviction pass of the device tier, or `None` when
    /// nothing may be dropped (swap only, or no plan yet to tell that the inputs stay alive).
    pub(super) fn drop_context(&self, limits: &Limits) -> Option<DropContext> {
        // The memory rule reads the plan at the step's position: that of a marked step, or of
        // a step the period detector cut at the period the plan's own step has (a plan from a
        // step of another period, shorter repetitions found first, would be read out of place).
        let mode = self.recompute_behaviour(limits);
        if !mode.may_drop() || !limits.planning() {
            return None;
        }
        let plan = self.plan()?;
        let positions_kept = self.in_marked_step.load(Ordering::Relaxed)
            || self.recorder.found_period() == Some(u64::from(plan.len()));
        if !positions_kept {
            return None;
        }
        let (step, now) = self.recorder.position();
        let moves = self.ledger.moves(Direction::DeviceToHost);
        Some(DropContext {
            mode,
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
        let Some((victim, rebuild, chain)) = self.drop_terms(candidate, context) else {
            return false;
        };
        recompute::prefer_recompute(context.mode, &victim, &rebuild)
            && candidate
                .victim
                .drop_for_rebuild(self, &chain.leaves, chain.ghost_bytes)
    }

    /// What a rebuild of `candidate` would cost the ops if it were dropped now, when victims
    /// are ranked by the cheaper of a move and a rebuild ([`DropContext::weighs_rebuilds`]): the
    /// victim policy ranks it by the cheaper of the two ways back. `None` when it may not be
    /// dropped, or would be moved if taken.
    pub(super) fn rebuild_cost(
        &self,
        candidate: &Candidate,
        context: &DropContext,
    ) -> Option<Duration> {
        if !context.weighs_rebuilds() {
            return None;
        }
        let (victim, rebuild, _) = self.drop_terms(candidate, context)?;
        // Only a victim that would be dropped is worth its rebuild's cost: one that would be
        // moved costs its move.
        recompute::prefer_recompute(context.mode, &victim, &rebuild)
            .then(|| Duration::from_secs_f64(recompute::exposed_rebuild_seconds(&victim, &rebuild)))
    }

    /// What moving `candidate` and rebuilding it would cost, if it has a recipe and the memory
    /// rule holds, with what the rebuild relies on.
    fn drop_terms(
        &self,
        candidate: &Candidate,
        context: &DropContext,
    ) -> Option<(Victim, Rebuild, Chain)> {
        let recipe = candidate.victim.rebuild_plan()?;
        let (next_use, chain) = self.memory_rule(candidate, &recipe, context)?;
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
            op_time: context.times.op_time(recipe.rebuild.op_time, &recipe.cost) + chain.ghost_time,
            depth: chain.depth,
            inputs_off_device: chain.inputs_off_device,
        };
        Some((victim, rebuild, chain))
    }

    /// The memory rule: the distance to the candidate's next use in this step, with what its
    /// rebuild relies on ([`recompute::chain`]: inputs the program reads again at or after that
    /// use, so that holding them holds nothing the program would have let go, and ghosts
    /// recomputed from those), if the op at that use, with the rebuild's inputs and ghosts
    /// beside it, still fits the budget (a rebuild never takes an op over a budget it fits
    /// under when its inputs are moved).
    fn memory_rule(
        &self,
        candidate: &Candidate,
        recipe: &RebuildPlan,
        context: &DropContext,
    ) -> Option<(u32, Chain)> {
        let (plan, step, now) = (&context.plan, context.step, context.now);
        let index = lock(&self.index);
        let NextUse::In(distance) = plan.next_use(index.key_of(candidate.id)?, step, now) else {
            return None;
        };
        let rebuilt_at = now.checked_add(distance).filter(|&at| at < plan.len())?;
        let mut outlives = |input| {
            index
                .key_of(input)
                .is_some_and(|key| matches!(plan.next_use(key, step, rebuilt_at), NextUse::In(_)))
        };
        let op_time = |measured, cost: &_| context.times.op_time(measured, cost);
        let chain = recompute::chain(&recipe.inputs, &mut outlives, &op_time)?;
        let beside = chain.leaf_bytes.saturating_add(chain.ghost_bytes);
        if plan.op_bytes(rebuilt_at).saturating_add(beside) > context.budget {
            return None;
        }
        Some((distance, chain))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::recompute::BEHAVIOURS;

    /// A step of `ops` adds.
    fn step(ops: usize) -> Arc<StepTape> {
        let op = |i: usize| crate::tape::OpRecord {
            name: "float_add".into(),
            inputs: vec![i as u64],
            outputs: vec![i as u64 + 1],
            start_ns: 0,
            duration_ns: 1,
            thread: 1,
        };
        Arc::new(StepTape {
            ops: (0..ops).map(op).collect(),
            ..Default::default()
        })
    }

    #[test]
    fn a_choice_lands_unless_another_started_or_the_limits_changed_since() {
        let cell = BehaviourCell::default();
        let start = |tape: &Arc<StepTape>| cell.start(&mut lock(&cell.choosing), tape);
        assert_eq!(cell.get(), None, "none before a plan");
        let first = start(&step(1)).unwrap();
        cell.land(first, BEHAVIOURS[2]);
        assert_eq!(cell.get(), Some(BEHAVIOURS[2]));
        let older = start(&step(2)).unwrap();
        let newer = start(&step(3)).unwrap();
        cell.land(newer, BEHAVIOURS[3]);
        cell.land(older, BEHAVIOURS[1]);
        assert_eq!(
            cell.get(),
            Some(BEHAVIOURS[3]),
            "the older choice is discarded"
        );
        let stale = start(&step(4)).unwrap();
        cell.forget();
        assert_eq!(cell.get(), None, "new limits forget the choice");
        cell.land(stale, BEHAVIOURS[4]);
        assert_eq!(cell.get(), None, "and the one under way");
        cell.settle();
    }

    #[test]
    fn a_new_recording_of_the_same_program_keeps_its_choice() {
        let cell = BehaviourCell::default();
        let start = |tape: &Arc<StepTape>| cell.start(&mut lock(&cell.choosing), tape);
        assert!(start(&step(5)).is_some());
        assert_eq!(start(&step(5)), None, "the same program: no new dry runs");
        assert!(start(&step(6)).is_some(), "another program is chosen for");
        cell.forget();
        assert!(start(&step(6)).is_some(), "and so is any after new limits");
    }
}
