//! A discrete-event simulation of one step on a device profile, with the engine's own
//! decisions.
//!
//! The compute stream runs the tape's ops in order, each for its device time
//! ([`super::cost`]). Device-to-host, host-to-device and disk transfers run on queues of their
//! own at the profile's bandwidths and latency (both link directions at the duplex rate while
//! the other one is busy). An op starts when the stream is free, its inputs are on the device
//! and the room it needs is free; the time it waits is the stall. An evicted tensor's device
//! bytes are freed when its copy has left.
//!
//! What to evict and what to prefetch are decided by the code the engine runs
//! ([`crate::policy::victim::pick`] and [`crate::policy::victim::needed_soon`] over candidates
//! ranked by the configured policy, [`crate::policy::prefetch`]'s due rule, prefetch ceiling,
//! settle target, late-arrival leads, nearer prefetches after wasted ones and transfer-ops
//! estimate, [`crate::policy::handoff`]'s choice of thread, and the [`UsePlan`]'s headroom),
//! fed with the simulated state instead of the engine's.
//!
//! Simplifications, each with its effect on the prediction:
//! - The step is its own plan (the engine plans step `n + 1` from step `n`): a repeating
//!   step's steady state. It runs a few times, each run starting where the one before ended
//!   (what survived it is paired with the next step's tensors from before it by
//!   [`carry::pairs`], and the plan knows their next use), and the last run is reported, so
//!   that leads and the transfer estimate have been learnt.
//! - One stream: ops of other threads run in tape order on it.
//! - A move the asynchronous engine finds cheaper than a hand-off to its worker
//!   ([`crate::policy::handoff`], fed with the simulated moves' times) runs on the op's thread:
//!   the next op waits for it. The worker's wake-up is taken at the engine's floor (the engine
//!   measures it, and a loaded machine only raises it). Such a prefetch has landed when the
//!   engine goes on, so it teaches the transfer-ops estimate that a move takes no ops.
//! - The engine's own decisions (victim passes, prefetch scans) cost the profile's
//!   `engine_op_us` after each op while something is off the device, as the engine measures
//!   it. The built-in GPUs leave it at 0: there the host runs ahead of the device and hides
//!   it; `measured` takes it from the engine's clock, since on a CPU backend it shows.

// The crate's hasher: `both` runs 42 of these dry runs per plan, and SipHash was a tenth of them.
use crate::fast_hash::{FastMap as HashMap, FastSet as HashSet};

use serde::Serialize;

use crate::engine::{AliveInput, GhostPlan, RebuildInput, TensorId};
use crate::plan::cost::MatrixDtype;
use crate::policy::PolicyKind;
use crate::policy::handoff::{self, MoveHistory};
use crate::policy::plan::{KeyAt, NextUse, PlanKey, UsePlan, keys_and_uses, positions_of};
use crate::policy::prefetch as decide;
use crate::policy::recompute::{self, OnOpThread, Rebuild, RebuildRoom, RecomputeMode, Victim};
use crate::policy::victim::{self, Bandwidth, Candidate, Takes};
use crate::policy::windows;
use crate::tape::StepTape;

use super::by_position::ByPosition;
use super::carry;
use super::profile::DeviceProfile;
use super::state::{self, StateResidency};
use super::what_if::ExtraRecipes;

/// What the simulated engine is configured with (resolved from a `SpillConfig`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    pub budget: u64,
    pub host_limit: Option<u64>,
    pub policy: PolicyKind,
    pub prefetch_window: u32,
    pub asynchronous: bool,
    pub recompute: RecomputeMode,
    /// Where room for rebuilds is made ahead (a behaviour `both` may choose).
    pub rebuild_room: RebuildRoom,
    /// Whether recipes keep their inputs' recipes, so that rebuilds may recompute ghosts (not
    /// on a backend that fuses ops: see `backend/recipe.rs`).
    pub keeps_lineage: bool,
    /// Whether the step's state may leave the device (the accounting: DTR's keeps it there).
    pub state: StateResidency,
    /// Whether the state leaves only when other victims fall short (a behaviour `both` may
    /// choose: [`Behaviour::keeps_state`](crate::policy::recompute::Behaviour::keeps_state)).
    pub keeps_state: bool,
    /// Whether the settle makes room early for the step's peak (a behaviour `both` may
    /// choose: [`Behaviour::evicts_early`](crate::policy::recompute::Behaviour::evicts_early)).
    pub evicts_early: bool,
    /// With `evicts_early`: a share at a time ([`Behaviour::paces_early`](crate::policy::recompute::Behaviour::paces_early)).
    pub paces_early: bool,
    /// Recipes assumed for ops the engine keeps none for (a what-if: the engine's own dry run
    /// assumes none).
    pub extra_recipes: ExtraRecipes,
}

/// Bytes moved in each direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Traffic {
    /// Evicted from the device into the host tier.
    pub device_to_host: u64,
    /// Evicted from the device straight to disk (the host tier full).
    pub device_to_disk: u64,
    /// Restored from the host tier.
    pub host_to_device: u64,
    /// Restored from disk.
    pub disk_to_device: u64,
}

impl Traffic {
    /// Every byte moved, both directions.
    pub fn total(&self) -> u64 {
        self.device_to_host + self.device_to_disk + self.host_to_device + self.disk_to_device
    }
}

/// The simulated step.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Simulated {
    /// Seconds from the first op's start to the last op's end.
    pub step_seconds: f64,
    /// Seconds the ops themselves ran.
    pub compute_seconds: f64,
    /// Seconds the stream waited for inputs or room.
    pub stall_seconds: f64,
    /// Seconds of the engine's own decisions on the op's thread (the profile's
    /// `engine_op_us` per op while something is off the device).
    pub engine_seconds: f64,
    /// The most bytes on the device (resident, in flight to it, or still leaving it).
    pub device_peak: u64,
    /// The most bytes in the host tier.
    pub host_peak: u64,
    /// Bytes per direction.
    pub traffic: Traffic,
    /// Tensors evicted.
    pub evictions: u64,
    /// Prefetches issued.
    pub prefetches: u64,
    /// Inputs found off the device by their op (restored on demand, or arriving late).
    pub late_inputs: u64,
    /// Inputs a prefetch brought in time.
    pub prefetch_hits: u64,
    /// Ops that ran with more than the budget on the device.
    pub over_budget_ops: u64,
    /// Windows of `prefetch_window` ops (at least 1) whose moves need more link time than
    /// their ops compute.
    pub saturated_windows: u32,
    /// Windows of the step.
    pub windows: u32,
    /// Tensors dropped from the device to be rebuilt instead of moved.
    pub drops: u64,
    /// Rebuilds: producing ops run again before the op that needed their output.
    pub rebuilds: u64,
    /// Seconds the stream spent on rebuilds (also in `compute_seconds`).
    pub rebuild_seconds: f64,
    /// The counters as each op began, and after the last one: what [`super::phases`] divides
    /// by phase.
    #[serde(skip)]
    pub(crate) marks: Vec<OpMark>,
}

/// The simulation's clock and running totals as an op begins (before it waits).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct OpMark {
    pub clock: f64,
    pub compute_seconds: f64,
    pub stall_seconds: f64,
    /// Bytes moves brought to the device so far (from the host tier or disk).
    pub to_device: u64,
    /// Bytes moves took off the device so far (to the host tier or disk).
    pub to_host: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Place {
    Device,
    /// Copying off the device; its device bytes are freed at `done`.
    Leaving {
        done: f64,
        to_disk: bool,
    },
    Host,
    Disk,
    /// Copying to the device, queued after op `from_op`.
    Arriving {
        done: f64,
        from_op: usize,
    },
    /// Dropped, to be rebuilt by its producing op when next used (no bytes anywhere).
    Dropped,
}

/// The latest victim pass of one kind that found no victim, by the absolute position the
/// tensors it could take are used after, and the tensors read or made resident since: a later
/// pass for tensors used after the same position or a later one finds none again unless one
/// of those could be taken (the engine keeps such a memo, `room_still_fruitless`; here it
/// only saves the walk, whose outcome it knows).
#[derive(Debug, Default)]
struct Fruitless {
    beyond: Option<u32>,
    touched: Vec<TensorId>,
}

impl Fruitless {
    fn touch(&mut self, id: TensorId) {
        if self.beyond.is_some() {
            self.touched.push(id);
        }
    }
}

/// The link and disk queues: when each is free.
#[derive(Debug, Clone, Copy, Default)]
struct Queues {
    to_host: f64,
    to_device: f64,
    disk: f64,
}

/// What the engine learns from step to step.
#[derive(Debug, Clone, Default)]
struct Learnt {
    leads: HashMap<PlanKey, u32>,
    transfer_ops: u32,
    /// The moves so far per direction (to host, to the device from host, from disk), as the
    /// engine's ledger counts them for [`handoff::cheaper_on_op_thread`].
    moves: Moves,
    /// Uses of tensors whose prefetch was wasted (evicted again unread), fetched nearer them.
    wasted: HashMap<decide::WastedFor, decide::Wasted>,
}

/// Move histories per direction.
#[derive(Debug, Clone, Copy, Default)]
struct Moves {
    to_host: MoveHistory,
    to_device: MoveHistory,
    from_disk: MoveHistory,
}

fn duration(seconds: f64) -> std::time::Duration {
    std::time::Duration::from_secs_f64(seconds.max(0.0))
}

struct Sim<'a> {
    tape: &'a StepTape,
    profile: &'a DeviceProfile,
    settings: Settings,
    op_seconds: &'a [f64],
    /// Host time before each op, and after the last.
    gaps: &'a (Vec<f64>, f64),
    plan: &'a UsePlan,
    keys: HashMap<TensorId, PlanKey>,
    /// Per op: the stepping thread's position at it, and after it.
    positions: Vec<u32>,
    positions_after: Vec<u32>,
    sizes: HashMap<TensorId, u64>,
    drops_after: HashMap<u32, Vec<TensorId>>,
    place: HashMap<TensorId, Place>,
    /// The stepping thread's position now: at an op, the op's; after it, the next.
    position: u32,
    /// The spilled tensors (host or disk) with a next use, each at that use less its lead: the
    /// prefetch scan after an op reads those up to its reach and no others (a tensor due is
    /// always among them: a prefetch's distance ahead is at most the reach plus the lead).
    spilled: ByPosition,
    /// The dropped tensors with a next use, each at that use.
    dropped: ByPosition,
    /// How many tensors are on disk, leaving the device or dropped (what keeps the engine's
    /// scans after an op from returning early, beside the host tier's bytes).
    off_device: usize,
    /// Tensors whose copy is under way (leaving or arriving), so that landing them does not
    /// scan every tensor.
    in_flight: Vec<TensorId>,
    last_use: HashMap<TensorId, u64>,
    prefetched: HashSet<TensorId>,
    /// The latest pass making room for a prefetch that found no victim (see [`Fruitless`]).
    room_fruitless: Fruitless,
    /// The latest early pass ([`decide::early_room`]) that found no victim.
    early_fruitless: Fruitless,
    /// Device bytes of tensors resident, arriving or leaving.
    device: u64,
    /// Of those, leaving (freed when their copies are done).
    leaving: u64,
    host: u64,
    queues: Queues,
    clock: f64,
    learnt: Learnt,
    moved_per_op: Vec<u64>,
    /// Per tensor made by a pure op: that op's index (its recipe).
    recipes: HashMap<TensorId, usize>,
    /// The tensors whose recipe the recipes of the tensors made from them keep (see
    /// [`lineage`]).
    lineage: HashSet<TensorId>,
    /// Per dropped tensor: the inputs its rebuild relies on, held while it is dropped (the
    /// others are recomputed as ghosts).
    drop_leaves: HashMap<TensorId, smallvec::SmallVec<[TensorId; 4]>>,
    /// Per dropped tensor: how many dropped tensors its recipe depended on when dropped.
    drop_depth: HashMap<TensorId, u32>,
    /// Tensors that never leave the device ([`StateResidency::Pinned`]'s state; empty
    /// otherwise).
    pinned_state: HashSet<TensorId>,
    /// How busy the link would be if every victim were moved, as the engine's step check
    /// finds it (what the drop decision weighs a move's link time by).
    link_utilization: f64,
    /// The ops' average time, as the engine's step check measures it (what the settle weighs
    /// the link's pace against).
    mean_op_seconds: f64,
    out: Simulated,
}

/// Simulates `tape` on `profile`, each op taking `op_seconds`, under `settings`.
pub(crate) fn simulate(
    tape: &StepTape,
    profile: &DeviceProfile,
    op_seconds: &[f64],
    gaps: &(Vec<f64>, f64),
    settings: Settings,
) -> Simulated {
    let pairs = carry::pairs(tape);
    let plan = carry::repeating_plan(tape, &pairs);
    let link_utilization = link_utilization(tape, profile, op_seconds, settings);
    let mut learnt = Learnt::default();
    let mut start = Start::default();
    let mut result = Simulated::default();
    // The step repeats: each run starts where the one before ended (what survived it, in the
    // tier it ended in, its copies still under way) and with what the engine learnt in it.
    // The last of a few is the steady state reported.
    for _ in 0..STEADY_STATE_RUNS {
        let mut sim = Sim::new(tape, profile, &plan, op_seconds, gaps, settings, learnt);
        sim.link_utilization = link_utilization;
        sim.run(&start);
        learnt = sim.learnt.clone();
        start = sim.hand_over(&pairs);
        result = sim.finish();
    }
    result
}

/// The engine's step check (`check_windows`) on the profile: how busy the link would be if
/// the moves of an offline replay of the step under the budget were all made, against the
/// ops' modelled compute. Only the ranking of victims that may be dropped reads it
/// ([`recompute::ranks_by_rebuild`]).
fn link_utilization(
    tape: &StepTape,
    profile: &DeviceProfile,
    op_seconds: &[f64],
    settings: Settings,
) -> f64 {
    if !settings.recompute.may_drop() || settings.budget == u64::MAX {
        return 0.0;
    }
    let replay = crate::policy::simulate::replay(tape, settings.budget, settings.policy);
    let link = Bandwidth {
        bytes_per_sec: profile.host_to_device_gb_per_s * 1e9,
        latency: std::time::Duration::from_secs_f64(profile.transfer_latency_us * 1e-6),
    };
    windows::link_utilization(&replay, op_seconds.iter().sum(), link)
}

/// The tensors made by pure ops (whose outputs keep a recipe in the engine), or by ops of the
/// classes `extra` assumes, with the index of the op that made each.
fn recipes(tape: &StepTape, extra: ExtraRecipes) -> HashMap<TensorId, usize> {
    tape.tensors
        .iter()
        .filter_map(|t| {
            let op = t.producer?.op as usize;
            let made_by = tape.ops.get(op)?;
            let single = made_by.outputs.len() == 1;
            let rebuildable =
                recompute::is_recomputable(&made_by.name) || extra.covers(&made_by.name);
            (single && rebuildable).then_some((t.id, op))
        })
        .collect()
}

/// The tensors with recipes that the recipes of the tensors made from them keep, as the engine
/// keeps lineage (`backend/recipe.rs`): those whose own recipe reaches fewer than
/// [`recompute::MAX_GHOST_CHAIN`] ghosts deep.
fn lineage(tape: &StepTape, recipes: &HashMap<TensorId, usize>) -> HashSet<TensorId> {
    let mut reach: HashMap<TensorId, u32> = HashMap::default();
    let mut kept = HashSet::default();
    for (i, op) in tape.ops.iter().enumerate() {
        let Some(&output) = op.outputs.first() else {
            continue;
        };
        if recipes.get(&output) != Some(&i) {
            continue;
        }
        let mut own = 0;
        for input in &op.inputs {
            if let Some(&r) = reach.get(input)
                && r < recompute::MAX_GHOST_CHAIN
            {
                kept.insert(*input);
                own = own.max(r + 1);
            }
        }
        reach.insert(output, own);
    }
    kept
}

/// Dropped tensors by the distance to their rebuild, soonest first.
struct RebuildsAhead {
    at: Vec<(u32, u64)>,
}

impl RebuildsAhead {
    /// Bytes rebuilt within `distance` ops, that one included.
    fn bytes_until(&self, distance: u32) -> u64 {
        self.at
            .iter()
            .take_while(|(d, _)| *d <= distance)
            .map(|(_, bytes)| bytes)
            .sum()
    }
}

/// What the rebuilds before one op gather: the inputs pinned, the tensors to restore (with
/// when their copies out land), the tensors rebuilt, when arriving inputs are in, and the
/// bytes of the ghosts recomputed.
struct RebuildWork {
    pinned: HashSet<TensorId>,
    to_restore: Vec<(TensorId, f64)>,
    rebuilt: Vec<TensorId>,
    ready: f64,
    transient: u64,
}

/// Runs of the step simulated before the one reported: enough for leads to settle.
const STEADY_STATE_RUNS: usize = 3;

/// Where a step starts: the tiers of the tensors the step before handed over, and its copies
/// still under way, on this step's clock.
#[derive(Debug, Clone, Default)]
struct Start {
    places: HashMap<TensorId, Place>,
    queues: Queues,
}

impl<'a> Sim<'a> {
    fn new(
        tape: &'a StepTape,
        profile: &'a DeviceProfile,
        plan: &'a UsePlan,
        op_seconds: &'a [f64],
        gaps: &'a (Vec<f64>, f64),
        settings: Settings,
        learnt: Learnt,
    ) -> Self {
        let (_, by_id) = keys_and_uses(tape);
        let keys = by_id.into_iter().map(|(id, (key, _))| (id, key)).collect();
        // An op sees the position of the stepping thread's ops before it; after it, the
        // recorder has counted it too.
        let mut ran = 0;
        let (mut positions, mut positions_after) = (Vec::new(), Vec::new());
        for p in positions_of(tape) {
            positions.push(ran);
            if p.is_some() {
                ran += 1;
            }
            positions_after.push(ran);
        }
        let mut drops_after: HashMap<u32, Vec<TensorId>> = HashMap::default();
        for d in &tape.drops {
            drops_after.entry(d.after_ops).or_default().push(d.id);
        }
        Self {
            tape,
            profile,
            settings,
            op_seconds,
            gaps,
            plan,
            keys,
            positions,
            positions_after,
            sizes: tape.tensors.iter().map(|t| (t.id, t.bytes)).collect(),
            drops_after,
            place: HashMap::default(),
            position: 0,
            spilled: ByPosition::default(),
            dropped: ByPosition::default(),
            off_device: 0,
            in_flight: Vec::new(),
            last_use: HashMap::default(),
            prefetched: HashSet::default(),
            room_fruitless: Fruitless::default(),
            early_fruitless: Fruitless::default(),
            device: 0,
            leaving: 0,
            host: 0,
            queues: Queues::default(),
            clock: 0.0,
            learnt,
            moved_per_op: vec![0; tape.ops.len()],
            recipes: HashMap::default(),
            drop_depth: HashMap::default(),
            lineage: HashSet::default(),
            drop_leaves: HashMap::default(),
            pinned_state: match settings.state {
                StateResidency::Movable => HashSet::default(),
                StateResidency::Pinned => state::state_tensors(tape),
            },
            link_utilization: 0.0,
            mean_op_seconds: op_seconds.iter().sum::<f64>() / op_seconds.len().max(1) as f64,
            out: Simulated::default(),
        }
        .with_recipes()
    }

    /// The recipes the engine keeps, and their lineage, when it may drop victims.
    fn with_recipes(mut self) -> Self {
        if self.settings.recompute.may_drop() {
            self.recipes = recipes(self.tape, self.settings.extra_recipes);
            if self.settings.keeps_lineage {
                self.lineage = lineage(self.tape, &self.recipes);
            }
        }
        self
    }

    /// How many ops beyond the next one the settle after position `now` makes room for, as
    /// the engine's `settle_point` decides it: from what prefetches took to land, and the
    /// evictions' pace so far against the ops'.
    fn settle_ops(&self, now: u32) -> u32 {
        decide::settle_lookahead(self.plan, now, self.learnt.transfer_ops, self.pace())
    }

    /// How fast evictions have left against how fast ops run, as the engine's `pace` reads it.
    fn pace(&self) -> decide::Pace {
        decide::Pace {
            evict_seconds_per_byte: self.learnt.moves.to_host.seconds_per_byte(),
            op_seconds: self.mean_op_seconds,
        }
    }

    /// Bytes of the dropped tensors rebuilt within [`decide::rebuild_reach`] of position `now`,
    /// as the engine's settle counts them.
    fn rebuild_room(&self, now: u32, transfer_ops: u32) -> u64 {
        let reach = decide::rebuild_reach(transfer_ops);
        self.dropped_used_within(now, reach)
            .filter(|&(d, _)| d <= reach)
            .map(|(_, id)| self.size(id))
            .sum()
    }

    /// The dropped tensors' rebuilds ahead of position `now`, as the engine's index keeps them.
    fn rebuilds_ahead(&self, now: u32) -> RebuildsAhead {
        let mut at: Vec<(u32, u64)> = self
            .dropped_used_within(now, u32::MAX)
            .map(|(d, id)| (d, self.size(id)))
            .collect();
        at.sort_unstable();
        RebuildsAhead { at }
    }

    /// The dropped tensors next used at most `within` ops after position `now`, with how far.
    fn dropped_used_within(&self, now: u32, within: u32) -> impl Iterator<Item = (u32, TensorId)> {
        self.dropped
            .until(u64::from(now) + u64::from(within))
            .filter_map(move |id| match self.next_use(id, now) {
                NextUse::In(d) => Some((d, id)),
                NextUse::Never | NextUse::Unknown => None,
            })
    }

    /// The spilled tensors due for a prefetch after position `now` with the scan's `reach`, and
    /// how far each one's use is (unsorted).
    fn due(&mut self, now: u32, reach: u32) -> Vec<(u32, TensorId)> {
        let mut due = Vec::new();
        let mut later = Vec::new();
        for id in self.spilled.until(u64::from(now) + u64::from(reach)) {
            match self.due_in(id, now, reach) {
                Some(distance) => due.push((distance, id)),
                None => later.push(id),
            }
        }
        // Placed from before a use already passed, or fetched nearer its use since a waste:
        // placed again from now.
        for id in later {
            if let Some(&place) = self.place.get(&id) {
                self.index_place(id, Some(place), Some(place));
            }
        }
        #[cfg(debug_assertions)]
        self.check_due(now, reach, &due);
        due
    }

    /// How far the use of spilled tensor `id` is from position `now`, when it is due for a
    /// prefetch with the scan's `reach` ([`decide::is_due`]).
    fn due_in(&self, id: TensorId, now: u32, reach: u32) -> Option<u32> {
        let next_use = self.next_use(id, now);
        let wasted = self
            .keys
            .get(&id)
            .and_then(|k| decide::WastedFor::use_of(self.plan, *k, now, next_use))
            .and_then(|w| self.learnt.wasted.get(&w));
        decide::is_due(next_use, reach, self.lead(id), wasted)
            .then(|| next_use.distance_or(u32::MAX))
    }

    /// What the index finds due is what a walk of every spilled tensor finds.
    #[cfg(debug_assertions)]
    fn check_due(&self, now: u32, reach: u32, found: &[(u32, TensorId)]) {
        let mut walked: Vec<(u32, TensorId)> = self
            .place
            .iter()
            .filter(|(_, p)| matches!(p, Place::Host | Place::Disk))
            .filter_map(|(&id, _)| Some((self.due_in(id, now, reach)?, id)))
            .collect();
        let mut found = found.to_vec();
        walked.sort_unstable();
        found.sort_unstable();
        assert_eq!(found, walked, "the due index missed a due tensor at {now}");
    }

    fn size(&self, id: TensorId) -> u64 {
        self.sizes.get(&id).copied().unwrap_or(0)
    }

    fn planning(&self) -> bool {
        self.settings.policy != PolicyKind::Lru || self.settings.prefetch_window > 0
    }

    fn next_use(&self, id: TensorId, now: u32) -> NextUse {
        match self.keys.get(&id) {
            Some(&key) => self.plan.next_use(KeyAt { step: 0, key }, 0, now),
            None => NextUse::Unknown,
        }
    }

    fn lead(&self, id: TensorId) -> u32 {
        self.keys
            .get(&id)
            .and_then(|k| self.learnt.leads.get(k))
            .copied()
            .unwrap_or(0)
    }

    /// Tensors from before the step: where the step before left them, or for those it did not
    /// hand over (the first step's, the batch) on the device in the order of first use while
    /// they fit under the first settle target, the rest in the host tier (or on disk past its
    /// limit).
    fn place_sources(&mut self, start: &Start) {
        self.queues = start.queues;
        let mut sources: Vec<(u32, TensorId, u64)> = Vec::new();
        for t in self.tape.tensors.iter().filter(|t| t.producer.is_none()) {
            let Some(&place) = start.places.get(&t.id) else {
                let first = match self.next_use(t.id, 0) {
                    NextUse::In(d) => d,
                    _ => u32::MAX,
                };
                sources.push((first, t.id, t.bytes));
                continue;
            };
            match place {
                Place::Device | Place::Arriving { .. } => self.device += t.bytes,
                Place::Leaving { to_disk, .. } => {
                    self.device += t.bytes;
                    self.leaving += t.bytes;
                    if !to_disk {
                        self.host += t.bytes;
                    }
                }
                Place::Host => self.host += t.bytes,
                Place::Disk | Place::Dropped => {}
            }
            if matches!(place, Place::Leaving { .. } | Place::Arriving { .. }) {
                self.in_flight.push(t.id);
            }
            self.set_place(t.id, place);
        }
        sources.sort();
        let room = if self.planning() && self.settings.budget != u64::MAX {
            decide::settle_target(self.settings.budget, self.plan, 0, self.settle_ops(0))
        } else {
            self.settings.budget
        };
        for (_, id, bytes) in sources {
            if self.device + bytes <= room || self.pinned_state.contains(&id) {
                self.device += bytes;
                self.set_place(id, Place::Device);
            } else if self.host_has_room(bytes) {
                self.host += bytes;
                self.set_place(id, Place::Host);
            } else {
                self.set_place(id, Place::Disk);
            }
        }
        self.out.host_peak = self.host;
        self.out.device_peak = self.device;
    }

    /// Where the next step starts: each survivor's tier, as its counterpart's, and the copies
    /// under way, with times on the next step's clock.
    fn hand_over(&self, pairs: &[(TensorId, TensorId)]) -> Start {
        let end = self.clock + self.gaps.1;
        let shift = |t: f64| (t - end).max(0.0);
        let places = pairs
            .iter()
            .filter_map(|(survivor, source)| {
                let place = match *self.place.get(survivor)? {
                    Place::Leaving { done, to_disk } => Place::Leaving {
                        done: shift(done),
                        to_disk,
                    },
                    Place::Arriving { done, .. } => Place::Arriving {
                        done: shift(done),
                        from_op: 0,
                    },
                    // Its recipe's inputs are this step's: the next one cannot rebuild it. The
                    // memory rule only drops tensors used again in the same step, so this is
                    // the rare tensor whose use the plan mispredicted; it starts there as spilled.
                    Place::Dropped => Place::Host,
                    other => other,
                };
                Some((*source, place))
            })
            .collect();
        Start {
            places,
            queues: Queues {
                to_host: shift(self.queues.to_host),
                to_device: shift(self.queues.to_device),
                disk: shift(self.queues.disk),
            },
        }
    }

    fn host_has_room(&self, bytes: u64) -> bool {
        self.settings
            .host_limit
            .is_none_or(|limit| self.host + bytes <= limit)
    }

    fn run(&mut self, start: &Start) {
        self.place_sources(start);
        self.drop_after(0);
        for i in 0..self.tape.ops.len() {
            self.mark();
            self.position = self.positions[i];
            self.run_op(i);
            self.position = self.positions_after[i];
            // Handles an op consumed drop as it returns, before the engine's work after it.
            self.drop_after(i as u32 + 1);
            if self.settings.budget != u64::MAX && self.planning() {
                self.after_op(i);
            }
        }
    }

    /// Copies that finished by `t` land: leaving bytes are freed, arriving ones are resident.
    fn retire(&mut self, t: f64, op: usize) {
        let mut landed = Vec::new();
        let place = &self.place;
        self.in_flight.retain(|id| match place.get(id) {
            Some(Place::Leaving { done, to_disk }) if *done <= t => {
                landed.push((*id, Some(*to_disk), 0));
                false
            }
            Some(Place::Arriving { done, from_op }) if *done <= t => {
                landed.push((*id, None, *from_op));
                false
            }
            Some(Place::Leaving { .. } | Place::Arriving { .. }) => true,
            // Landed by an earlier call, or freed.
            _ => false,
        });
        for &(_, to_disk, from_op) in &landed {
            if to_disk.is_none() {
                self.learnt.transfer_ops = decide::learn_transfer_ops(
                    self.learnt.transfer_ops,
                    op.saturating_sub(from_op) as u32,
                );
            }
        }
        for (id, to_disk, _) in landed {
            let bytes = self.size(id);
            match to_disk {
                Some(to_disk) => {
                    self.device -= bytes;
                    self.leaving -= bytes;
                    self.set_place(id, if to_disk { Place::Disk } else { Place::Host });
                }
                None => self.set_place(id, Place::Device),
            }
        }
    }

    /// Frees the tensors whose last handle dropped once `ops` ops had run.
    fn drop_after(&mut self, ops: u32) {
        if let Some(dropped) = self.drops_after.get(&ops).cloned() {
            for id in dropped {
                self.free(id);
            }
        }
    }

    fn free(&mut self, id: TensorId) {
        let bytes = self.size(id);
        let old = self.place.remove(&id);
        self.index_place(id, old, None);
        match old {
            Some(Place::Device | Place::Arriving { .. }) => self.device -= bytes,
            Some(Place::Leaving { to_disk, .. }) => {
                self.device -= bytes;
                self.leaving -= bytes;
                if !to_disk {
                    self.host -= bytes;
                }
            }
            Some(Place::Host) => self.host -= bytes,
            Some(Place::Disk | Place::Dropped) | None => {}
        }
        self.prefetched.remove(&id);
        self.drop_depth.remove(&id);
        self.drop_leaves.remove(&id);
    }

    /// Puts `id` in `place`, keeping the indexes of the scans after each op.
    fn set_place(&mut self, id: TensorId, place: Place) {
        let old = self.place.insert(id, place);
        self.index_place(id, old, Some(place));
        if place == Place::Device {
            self.touch(id);
        }
    }

    fn index_place(&mut self, id: TensorId, old: Option<Place>, new: Option<Place>) {
        let off_device = |p: Option<Place>| {
            matches!(
                p,
                Some(Place::Disk | Place::Leaving { .. } | Place::Dropped)
            )
        };
        self.off_device =
            self.off_device + usize::from(off_device(new)) - usize::from(off_device(old));
        match old {
            Some(Place::Host | Place::Disk) => self.spilled.remove(id),
            Some(Place::Dropped) => self.dropped.remove(id),
            _ => {}
        }
        if !matches!(new, Some(Place::Host | Place::Disk | Place::Dropped)) {
            return;
        }
        let NextUse::In(d) = self.next_use(id, self.position) else {
            return;
        };
        let at = u64::from(self.position) + u64::from(d);
        if new == Some(Place::Dropped) {
            self.dropped.place(id, at);
        } else {
            let lead = u64::from(self.lead(id));
            self.spilled.place(id, at.saturating_sub(lead));
        }
    }

    /// The earliest time both a link direction is free and `after` has passed, and how long
    /// `bytes` take on it then.
    fn link(&self, to_device: bool, after: f64, bytes: u64) -> (f64, f64) {
        let (own, other) = if to_device {
            (self.queues.to_device, self.queues.to_host)
        } else {
            (self.queues.to_host, self.queues.to_device)
        };
        let start = own.max(after);
        (
            start,
            self.profile.link_seconds(bytes, to_device, other > start),
        )
    }

    /// The engine's host work per move beyond the copy (the engine's own move times, which its
    /// decisions read, leave it out).
    fn move_host(&self) -> f64 {
        self.profile.move_host_us * 1e-6
    }

    /// Starts copying `id` off the device no earlier than `after`; returns when its bytes are
    /// freed.
    fn evict(&mut self, id: TensorId, after: f64, op: usize) -> f64 {
        let bytes = self.size(id);
        let to_disk = !self.host_has_room(bytes);
        let (start, took) = self.link(false, after, bytes);
        let done = start + took + self.move_host();
        self.queues.to_host = done;
        self.learnt.moves.to_host.add(bytes, duration(took));
        if to_disk {
            // The host buffer goes to disk behind the copy; the device is free once it is out.
            self.queues.disk = self.queues.disk.max(done) + self.profile.disk_seconds(bytes, true);
            self.out.traffic.device_to_disk += bytes;
        } else {
            self.host += bytes;
            self.out.host_peak = self.out.host_peak.max(self.host);
            self.out.traffic.device_to_host += bytes;
        }
        self.leaving += bytes;
        if self.prefetched.remove(&id)
            && let Some(&key) = self.keys.get(&id)
        {
            // Brought back and evicted again unread: the engine fetches it nearer its use, and
            // after where this one was evicted.
            let now = self.positions[op];
            let next_use = self.next_use(id, now);
            if let Some(for_use) = decide::WastedFor::use_of(self.plan, key, now, next_use) {
                let left = next_use.distance();
                self.learnt.wasted.entry(for_use).or_default().strike(left);
            }
        }
        self.set_place(id, Place::Leaving { done, to_disk });
        self.in_flight.push(id);
        self.out.evictions += 1;
        self.moved_per_op[op] += bytes;
        done
    }

    /// Starts bringing `id` back no earlier than `after`; returns when it is resident.
    fn restore(&mut self, id: TensorId, after: f64, op: usize) -> f64 {
        let bytes = self.size(id);
        let from_disk = self.place.get(&id) == Some(&Place::Disk);
        let mut ready = after;
        let mut read = 0.0;
        if from_disk {
            let start = self.queues.disk.max(after);
            read = self.profile.disk_seconds(bytes, false);
            ready = start + read;
            self.queues.disk = ready;
            self.out.traffic.disk_to_device += bytes;
        } else {
            self.host -= bytes;
            self.out.traffic.host_to_device += bytes;
        }
        let (start, took) = self.link(true, ready, bytes);
        let done = start + took + self.move_host();
        self.queues.to_device = done;
        if from_disk {
            self.learnt
                .moves
                .from_disk
                .add(bytes, duration(read + took));
        } else {
            self.learnt.moves.to_device.add(bytes, duration(took));
        }
        self.grow(bytes);
        self.set_place(id, Place::Arriving { done, from_op: op });
        self.in_flight.push(id);
        self.moved_per_op[op] += bytes;
        done
    }

    /// Victims among the resident, unpinned tensors that bring the device (less what is
    /// leaving) down to `target`, chosen as the engine's `victims` chooses them, of those `takes`
    /// allows.
    fn victims(
        &self,
        now: u32,
        want: u64,
        pinned: &HashSet<TensorId>,
        takes: Takes<u32>,
        waited_for: bool,
    ) -> Vec<TensorId> {
        let window = self.settings.prefetch_window.min(self.plan.len());
        let mut classes = victim::Classes::default();
        let mut ids: Vec<TensorId> = self
            .place
            .iter()
            .filter(|(id, p)| {
                **p == Place::Device && !pinned.contains(id) && !self.pinned_state.contains(id)
            })
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        for id in ids {
            let next_use = if self.planning() {
                self.next_use(id, now)
            } else {
                NextUse::Unknown
            };
            let used_before = match (takes.beyond(), next_use) {
                (Some(beyond), NextUse::In(d)) => now + d <= beyond,
                _ => false,
            };
            if used_before || takes.spares(next_use) {
                continue;
            }
            let mut candidate = Candidate {
                id,
                bytes: self.size(id),
                last_use: self.last_use.get(&id).copied().unwrap_or(0),
                next_use,
                rebuild: None,
            };
            if self.settings.keeps_state
                && self.planning()
                && self.keys.get(&id).is_some_and(|k| self.plan.is_state(*k))
            {
                classes.kept.push(candidate);
            } else if victim::needed_soon(self.prefetched.contains(&id), next_use, window, || {
                self.lead(id)
            }) {
                classes.soon.push(candidate);
            } else {
                candidate.rebuild = self.rebuild_cost(id, now, waited_for);
                classes.later.push(candidate);
            }
        }
        let bandwidth = Bandwidth {
            bytes_per_sec: self.profile.host_to_device_gb_per_s * 1e9,
            latency: std::time::Duration::from_secs_f64(self.profile.transfer_latency_us * 1e-6),
        };
        let plan_len = self.planning().then_some(self.plan.len());
        victim::pick(
            self.settings.policy,
            plan_len,
            bandwidth,
            &classes,
            want,
            takes,
        )
    }

    /// Evicts from now on until the device less what is leaving is at most `target`; returns
    /// when the last eviction's bytes are freed (now when nothing needed to go). `waited_for`:
    /// the op's thread waits for these evictions (what a drop saves the ops).
    fn evict_down_to(
        &mut self,
        target: u64,
        op: usize,
        now: u32,
        pinned: &HashSet<TensorId>,
        takes: Takes<u32>,
        waited_for: bool,
    ) -> f64 {
        let after = self.clock;
        let mut freed_at = after;
        let staying = self.device - self.leaving;
        if staying <= target {
            return freed_at;
        }
        for id in self.victims(now, staying - target, pinned, takes, waited_for) {
            if self.device - self.leaving <= target {
                break;
            }
            if self.try_drop(id, now, waited_for) {
                continue;
            }
            freed_at = freed_at.max(self.evict(id, after, op));
        }
        freed_at
    }

    /// The engine's drop decision for a victim (see `engine/device/recompute.rs`): it has a
    /// recipe, the memory rule holds (its next use is in this step and every input of the
    /// recipe is read at or after it) and the policy prefers a rebuild to a move. A dropped
    /// tensor's bytes are free at once.
    fn try_drop(&mut self, id: TensorId, now: u32, waited_for: bool) -> bool {
        let Some((victim, rebuild, chain)) = self.drop_terms(id, now, waited_for) else {
            return false;
        };
        if !recompute::prefer_recompute(self.settings.recompute, &victim, &rebuild) {
            return false;
        }
        self.device -= victim.bytes;
        self.prefetched.remove(&id);
        self.set_place(id, Place::Dropped);
        self.drop_depth.insert(id, rebuild.depth);
        self.drop_leaves.insert(id, chain.leaves);
        self.out.drops += 1;
        true
    }

    /// What a rebuild of `id` would cost the ops if it were dropped now, when victims are
    /// ranked by the cheaper of a move and a rebuild ([`recompute::ranks_by_rebuild`], see
    /// [`victim::CostAware`]).
    fn rebuild_cost(
        &self,
        id: TensorId,
        now: u32,
        waited_for: bool,
    ) -> Option<std::time::Duration> {
        if !recompute::ranks_by_rebuild(
            self.settings.recompute,
            self.settings.policy,
            self.link_utilization,
        ) {
            return None;
        }
        let (victim, rebuild, _) = self.drop_terms(id, now, waited_for)?;
        // Only a victim that would be dropped is worth its rebuild's cost (as in the engine).
        recompute::prefer_recompute(self.settings.recompute, &victim, &rebuild)
            .then(|| duration(recompute::exposed_rebuild_seconds(&victim, &rebuild)))
    }

    /// What moving `id` and rebuilding it would cost, if it may be dropped now: it has a
    /// recipe and the memory rule holds (see [`try_drop`](Self::try_drop)), with what the
    /// rebuild relies on.
    fn drop_terms(
        &self,
        id: TensorId,
        now: u32,
        waited_for: bool,
    ) -> Option<(Victim, Rebuild, recompute::Chain)> {
        let &producer = self.recipes.get(&id)?;
        let NextUse::In(distance) = self.next_use(id, now) else {
            return None;
        };
        let rebuilt_at = now
            .checked_add(distance)
            .filter(|&at| at < self.plan.len())?;
        let inputs = self.rebuild_inputs(producer);
        let mut outlives = |input| matches!(self.next_use(input, rebuilt_at), NextUse::In(_));
        let op_time = |measured, _: &_| measured;
        let chain = recompute::chain(&inputs, &mut outlives, &op_time)?;
        let beside = chain.leaf_bytes.saturating_add(chain.ghost_bytes);
        if self.plan.op_bytes(rebuilt_at).saturating_add(beside) > self.settings.budget {
            return None;
        }
        let evict = Bandwidth {
            bytes_per_sec: self.profile.device_to_host_gb_per_s * 1e9,
            latency: std::time::Duration::from_secs_f64(self.profile.transfer_latency_us * 1e-6),
        };
        let restore = Bandwidth {
            bytes_per_sec: self.profile.host_to_device_gb_per_s * 1e9,
            ..evict
        };
        let bytes = self.size(id);
        let on_op_thread = OnOpThread {
            evict: waited_for,
            restore: !self.settings.asynchronous
                || self.runs_here(self.learnt.moves.to_device, bytes),
        };
        let (evict_exposure, restore_exposure) = recompute::move_exposures(
            self.link_utilization,
            on_op_thread,
            distance,
            self.settings.prefetch_window,
        );
        let victim = Victim {
            bytes,
            evict,
            restore,
            evict_exposure,
            restore_exposure,
        };
        let rebuild = Rebuild {
            op_time: duration(self.op_seconds[producer]) + chain.ghost_time,
            depth: chain.depth,
            inputs_off_device: chain.inputs_off_device,
        };
        Some((victim, rebuild, chain))
    }

    /// The inputs of op `producer`'s recipe as the engine's decision sees them (see
    /// `Recipe::plan_inputs` in `backend/recipe.rs`): alive while the step holds them, with
    /// their own recipes as ghosts where the engine keeps that lineage.
    fn rebuild_inputs(&self, producer: usize) -> smallvec::SmallVec<[RebuildInput; 3]> {
        let mut planned: smallvec::SmallVec<[RebuildInput; 3]> = smallvec::SmallVec::new();
        for &input in &self.tape.ops[producer].inputs {
            if planned.iter().any(|p| p.id == input) {
                continue;
            }
            let alive = self.place.get(&input).map(|place| AliveInput {
                dropped_depth: match place {
                    Place::Dropped => self.drop_depth.get(&input).copied(),
                    _ => None,
                },
                off_device: matches!(place, Place::Host | Place::Disk | Place::Leaving { .. }),
            });
            let ghost = self
                .lineage
                .contains(&input)
                .then(|| self.recipes.get(&input))
                .flatten()
                .map(|&ghost_producer| {
                    Box::new(GhostPlan {
                        inputs: self.rebuild_inputs(ghost_producer),
                        // Already the op's modelled time on the profile: the decision's
                        // `op_time` here reads it as is, and never the cost.
                        op_time: duration(self.op_seconds[ghost_producer]),
                        cost: crate::plan::cost::elementwise(0, 0, 0, MatrixDtype::F32),
                    })
                });
            planned.push(RebuildInput {
                id: input,
                bytes: self.size(input),
                alive,
                ghost,
            });
        }
        planned
    }

    /// Plans the rebuild of a dropped `id` before op `op`: the inputs it relies on first
    /// (restored, or rebuilt in turn), its ghosts recomputed from them, then its producer on
    /// the stream. Returns the seconds the rebuilds take on the stream; `pinned` gains the
    /// inputs it relies on, `rebuilt` the tensors to put on the device once room is made for
    /// them, `transient` the ghosts' bytes, and `ready` when arriving inputs are in.
    fn rebuild(&mut self, id: TensorId, work: &mut RebuildWork) -> f64 {
        let producer = self.recipes[&id];
        let leaves = self.drop_leaves.get(&id).cloned().unwrap_or_default();
        let seconds = self.rerun(producer, &leaves, work);
        work.rebuilt.push(id);
        seconds
    }

    /// Op `producer` run again on `leaves`, the inputs not among them recomputed as ghosts.
    fn rerun(&mut self, producer: usize, leaves: &[TensorId], work: &mut RebuildWork) -> f64 {
        let mut seconds = self.op_seconds[producer];
        let inputs = self.tape.ops[producer].inputs.clone();
        for (k, &input) in inputs.iter().enumerate() {
            if inputs[..k].contains(&input) {
                continue;
            }
            if !leaves.contains(&input) {
                if let Some(&ghost) = self.recipes.get(&input)
                    && self.lineage.contains(&input)
                {
                    seconds += self.rerun(ghost, leaves, work);
                    work.transient += self.size(input);
                }
                continue;
            }
            if !work.pinned.insert(input) {
                continue;
            }
            match self.place.get(&input).copied() {
                Some(Place::Dropped) => seconds += self.rebuild(input, work),
                Some(Place::Host | Place::Disk) => work.to_restore.push((input, self.clock)),
                Some(Place::Leaving { done, .. }) => work.to_restore.push((input, done)),
                Some(Place::Arriving { done, .. }) => work.ready = work.ready.max(done),
                Some(Place::Device) | None => {}
            }
        }
        seconds
    }

    fn run_op(&mut self, i: usize) {
        let op = &self.tape.ops[i];
        self.clock += self.gaps.0[i];
        self.retire(self.clock, i);
        let inputs: Vec<TensorId> = {
            let mut seen = Vec::with_capacity(op.inputs.len());
            for id in &op.inputs {
                if !seen.contains(id) {
                    seen.push(*id);
                }
            }
            seen
        };
        let new_outputs: u64 = op
            .outputs
            .iter()
            .filter(|id| !inputs.contains(id) && !self.place.contains_key(id))
            .map(|id| self.size(*id))
            .sum();
        // When the inputs are all on the device, and when the room for the restores is free.
        let mut room_at = self.clock;
        let mut work = RebuildWork {
            pinned: inputs.iter().copied().collect(),
            to_restore: Vec::new(),
            rebuilt: Vec::new(),
            ready: self.clock,
            transient: 0,
        };
        let mut rebuild_seconds = 0.0;
        for &id in &inputs {
            match self.place.get(&id).copied() {
                Some(Place::Dropped) => rebuild_seconds += self.rebuild(id, &mut work),
                Some(Place::Device) => {
                    if self.prefetched.remove(&id) {
                        self.out.prefetch_hits += 1;
                    }
                }
                Some(Place::Arriving { done, .. }) => {
                    work.ready = work.ready.max(done);
                    // Read, so no longer an unread prefetch: the engine takes the mark at every
                    // read (`Index::admit_input`), landed or not. Left, its next eviction would
                    // count as a wasted prefetch and fetch it nearer its use still.
                    self.prefetched.remove(&id);
                    self.late(id);
                }
                Some(Place::Leaving { done, .. }) => {
                    // Out it goes, then back.
                    work.to_restore.push((id, done));
                    self.late(id);
                }
                Some(Place::Host | Place::Disk) => {
                    work.to_restore.push((id, self.clock));
                    self.late(id);
                }
                None => {
                    // Made before the step by something the tape did not see: resident.
                    self.grow(self.size(id));
                    self.set_place(id, Place::Device);
                }
            }
        }
        let RebuildWork {
            pinned,
            to_restore,
            rebuilt,
            mut ready,
            transient,
        } = work;
        let budget = self.settings.budget;
        let restore_bytes: u64 = to_restore.iter().map(|(id, _)| self.size(*id)).sum();
        let rebuilt_bytes: u64 = rebuilt.iter().map(|id| self.size(*id)).sum();
        // The ghosts are on the device while the rebuilds run, as the engine reserves them.
        let need = restore_bytes + rebuilt_bytes + transient + new_outputs;
        if self.device + need > budget {
            // Room first, on the op's thread: the op waits for the copies to leave.
            let target = budget.saturating_sub(need);
            let takes = Takes::Any;
            let evicted = self.evict_down_to(target, i, self.positions[i], &pinned, takes, true);
            let left = self.left_down_to(target);
            room_at = if left.is_finite() { left } else { evicted }.max(self.clock);
            ready = ready.max(room_at);
            if self.device - self.leaving + need > budget {
                self.out.over_budget_ops += 1;
            }
        }
        // The copies that make the room have left by the time the restores start.
        self.retire(room_at, i);
        for (id, after) in to_restore {
            if let Some(Place::Leaving { .. }) = self.place.get(&id) {
                // Its copy out lands first.
                self.retire(after, i);
            }
            let done = self.restore(id, after.max(room_at), i);
            ready = ready.max(done);
        }
        for id in rebuilt {
            // On the device once the room for it is made, as the engine rebuilds it.
            self.grow(self.size(id));
            self.set_place(id, Place::Device);
            self.drop_depth.remove(&id);
            self.drop_leaves.remove(&id);
            self.out.rebuilds += 1;
        }
        self.retire(ready, i);
        let start = ready.max(self.clock);
        self.out.stall_seconds += start - self.clock;
        // The rebuilds run on the stream before the op, once their inputs are in.
        self.out.rebuild_seconds += rebuild_seconds;
        self.out.compute_seconds += self.op_seconds[i] + rebuild_seconds;
        self.clock = start + rebuild_seconds + self.op_seconds[i];
        for id in &op.outputs {
            if !self.place.contains_key(id) {
                self.grow(self.size(*id));
                self.set_place(*id, Place::Device);
            }
            self.last_use.insert(*id, i as u64 + 1);
        }
        for id in &inputs {
            self.last_use.insert(*id, i as u64 + 1);
        }
        for &id in inputs.iter().chain(&op.outputs) {
            self.touch(id);
        }
    }

    /// A tensor read or made resident: a victim pass that found none may find it.
    fn touch(&mut self, id: TensorId) {
        self.room_fruitless.touch(id);
        self.early_fruitless.touch(id);
    }

    /// Evicts down to `level` from tensors used after `beyond` (room for a prefetch, or early
    /// for the step's peak: `early`), unless a pass of that kind found no victim for tensors
    /// used after `beyond` or earlier and no tensor read or made resident since could be one.
    /// Skipping such a pass changes nothing: it would find no victim again.
    fn evict_used_after(
        &mut self,
        early: bool,
        level: u64,
        beyond: u32,
        (op, now): (usize, u32),
        here: bool,
    ) -> f64 {
        if self.device - self.leaving <= level {
            // No pass runs, so nothing is learnt of one.
            return self.clock;
        }
        let memo = self.fruitless(early);
        // The touched tensors are weighed against the memo's own position: the earliest a pass
        // it covers may take tensors used after.
        let skip = memo
            .beyond
            .filter(|&fruitless| fruitless <= beyond)
            .is_some_and(|fruitless| {
                !memo
                    .touched
                    .iter()
                    .any(|&id| self.could_take(id, now, fruitless))
            });
        if skip {
            debug_assert!(
                self.victims(
                    now,
                    self.device - self.leaving - level,
                    &HashSet::default(),
                    Takes::UsedAfter(beyond),
                    here
                )
                .is_empty(),
                "a pass skipped as fruitless at {now} would take a victim"
            );
            self.fruitless_mut(early).touched.clear();
            return self.clock;
        }
        let moved = self.out.evictions + self.out.drops;
        let none = HashSet::default();
        let done = self.evict_down_to(level, op, now, &none, Takes::UsedAfter(beyond), here);
        let found_none = self.out.evictions + self.out.drops == moved;
        let memo = self.fruitless_mut(early);
        memo.beyond = found_none.then_some(beyond);
        memo.touched.clear();
        done
    }

    fn fruitless(&self, early: bool) -> &Fruitless {
        if early {
            &self.early_fruitless
        } else {
            &self.room_fruitless
        }
    }

    fn fruitless_mut(&mut self, early: bool) -> &mut Fruitless {
        if early {
            &mut self.early_fruitless
        } else {
            &mut self.room_fruitless
        }
    }

    /// Whether a pass for tensors used after `beyond` could take `id` (it may still not: a
    /// tensor needed soon is left, say), as [`Sim::victims`] shows it a candidate.
    fn could_take(&self, id: TensorId, now: u32, beyond: u32) -> bool {
        self.place.get(&id) == Some(&Place::Device)
            && !self.pinned_state.contains(&id)
            && !matches!(self.next_use(id, now), NextUse::In(d) if now + d <= beyond)
    }

    /// When enough of what is leaving the device has left for it to hold at most `target`
    /// (`f64::INFINITY` when even all of it is not enough).
    fn left_down_to(&self, target: u64) -> f64 {
        let mut leaving: Vec<(f64, u64)> = self
            .in_flight
            .iter()
            .filter_map(|id| match self.place.get(id) {
                Some(Place::Leaving { done, .. }) => Some((*done, self.size(*id))),
                _ => None,
            })
            .collect();
        leaving.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut device = self.device;
        let mut at = self.clock;
        for (done, bytes) in leaving {
            if device <= target {
                break;
            }
            device -= bytes;
            at = at.max(done);
        }
        if device <= target { at } else { f64::INFINITY }
    }

    /// Device bytes taken (an output, a restore started): the peak is sampled here.
    fn grow(&mut self, bytes: u64) {
        self.device += bytes;
        self.out.device_peak = self.out.device_peak.max(self.device);
    }

    /// An input was not on the device when its op came: Capuchin's rule asks for it earlier.
    fn late(&mut self, id: TensorId) {
        self.out.late_inputs += 1;
        if self.settings.prefetch_window > 0
            && let Some(&key) = self.keys.get(&id)
        {
            let lead = self.learnt.leads.entry(key).or_default();
            *lead = decide::lead_after_late(*lead);
        }
    }

    /// The engine's `after_op`: prefetch what is due, then settle the device at the plan's
    /// target and make room for the first prefetch that did not fit. The synchronous engine
    /// does all of it on the op's thread, the asynchronous one only the moves cheaper than a
    /// hand-off to its worker: the next op waits for those.
    fn after_op(&mut self, i: usize) {
        let now = self.positions_after[i];
        let budget = self.settings.budget;
        let none = HashSet::default();
        let asynchronous = self.settings.asynchronous;
        // A dropped tensor counts, as in the engine: the room for its rebuild is a settle's.
        let off_device = self.host > 0 || self.off_device > 0;
        if !off_device && self.device <= budget.saturating_sub(self.plan.max_headroom()) {
            // The engine's early exit: memory ample.
            return;
        }
        if off_device {
            // The engine's prefetch scans and settling (its cost per op is measured only here).
            let bookkeeping = self.profile.engine_op_us * 1e-6;
            self.out.engine_seconds += bookkeeping;
            self.clock += bookkeeping;
        }
        // When the moves the op's thread waits for are done.
        let mut here_done = self.clock;
        let mut room = None;
        if self.settings.prefetch_window > 0 {
            let window = self.settings.prefetch_window.min(self.plan.len());
            let reach = decide::reach(window, self.learnt.transfer_ops);
            let mut due = self.due(now, reach);
            // Rebuilds take their turn in the walk, as prefetches that move nothing.
            let mut rebuilds_in_walk: HashSet<TensorId> = HashSet::default();
            if self.settings.rebuild_room == RebuildRoom::InPrefetchWalk {
                for (d, id) in self.dropped_used_within(now, reach) {
                    if decide::is_rebuild_due(d, reach) {
                        rebuilds_in_walk.insert(id);
                        due.push((d, id));
                    }
                }
            }
            due.sort_unstable();
            if let Some(&(furthest, _)) = due.last() {
                let headroom = self.plan.headroom_curve(now, furthest + 1);
                let beside = (self.settings.rebuild_room == RebuildRoom::BesidePrefetches)
                    .then(|| self.rebuilds_ahead(now));
                // What is still leaving counts until it has left, as in the engine.
                let mut used = self.device;
                for (d, id) in due {
                    let bytes = self.size(id);
                    let fits = decide::use_fits(self.plan, budget, now, d);
                    let mut ceiling = decide::ceiling(budget, &headroom, d, fits);
                    if let Some(rebuilds) = &beside {
                        ceiling = decide::ceiling_beside_rebuilds(ceiling, rebuilds.bytes_until(d));
                    }
                    if used + bytes > ceiling {
                        room = Some((ceiling.saturating_sub(bytes), now + d));
                        break;
                    }
                    used += bytes;
                    if rebuilds_in_walk.contains(&id) {
                        continue;
                    }
                    let history = if self.place.get(&id) == Some(&Place::Disk) {
                        self.learnt.moves.from_disk
                    } else {
                        self.learnt.moves.to_device
                    };
                    let here = !asynchronous || self.runs_here(history, bytes);
                    let done = self.restore(id, self.clock, i);
                    self.prefetched.insert(id);
                    self.out.prefetches += 1;
                    if here {
                        // Done before the engine goes on (it learns that such a move takes no
                        // ops to land).
                        here_done = here_done.max(done);
                        self.retire(done, i);
                    }
                }
            }
        }
        let settle_ops = self.settle_ops(now);
        let mut target = decide::settle_target(budget, self.plan, now, settle_ops);
        if self.settings.recompute.may_drop() {
            target = target.saturating_sub(self.rebuild_room(now, settle_ops));
        }
        let committed = self.device - self.leaving;
        // Set off above the target, an eviction goes on to the next ops' room with tensors
        // used after them, as the engine's does.
        let ahead =
            (committed > target).then(|| decide::settle_ahead(budget, self.plan, now, settle_ops));
        // Room for the step's coming peak while nothing is leaving, as the engine's settle
        // point sets it when no eviction job is queued.
        let early = if self.settings.evicts_early && self.queues.to_host <= self.clock {
            decide::early_room(
                budget,
                self.plan,
                now,
                committed,
                self.pace(),
                self.settings.paces_early,
            )
            .filter(|&(level, _)| committed > level)
        } else {
            None
        };
        if committed > target || room.is_some() || early.is_some() {
            let settled = ahead.map_or(target, |(level, _)| level.min(target));
            let lowest = room.map_or(settled, |(level, _)| level.min(settled));
            // The peak's room counts too, as in the engine's `SettlePoint::lowest`.
            let lowest = early.map_or(lowest, |(level, _)| level.min(lowest));
            let history = self.learnt.moves.to_host;
            let here = !asynchronous || self.runs_here(history, committed.saturating_sub(lowest));
            // The ahead part first, as the engine's `settle_to` does.
            let mut done = self.clock;
            if let Some((level, after)) = ahead {
                let takes = Takes::UsedAfter(now + after);
                done = self.evict_down_to(level, i, now, &none, takes, here);
            }
            // Not the tensors the ops it makes room for read, as the engine's settle spares them.
            let takes = Takes::AllButReadUntil(now + settle_ops);
            done = done.max(self.evict_down_to(target, i, now, &none, takes, here));
            if let Some((level, beyond)) = room {
                done = done.max(self.evict_used_after(false, level, beyond, (i, now), here));
            }
            if let Some((level, after)) = early {
                done = done.max(self.evict_used_after(true, level, now + after, (i, now), here));
            }
            if here {
                here_done = here_done.max(done);
            }
        }
        self.out.stall_seconds += here_done - self.clock;
        self.clock = here_done;
    }

    /// The engine's choice for one asynchronous move: on the op's thread when it is cheaper
    /// than waking the worker (whose wake-up is taken at the engine's floor).
    fn runs_here(&self, history: MoveHistory, bytes: u64) -> bool {
        handoff::cheaper_on_op_thread(history, bytes, std::time::Duration::ZERO)
    }

    /// Notes the clock and the running totals (see [`OpMark`]).
    fn mark(&mut self) {
        let traffic = &self.out.traffic;
        let mark = OpMark {
            clock: self.clock,
            compute_seconds: self.out.compute_seconds,
            stall_seconds: self.out.stall_seconds,
            to_device: traffic.host_to_device + traffic.disk_to_device,
            to_host: traffic.device_to_host + traffic.device_to_disk,
        };
        self.out.marks.push(mark);
    }

    fn finish(mut self) -> Simulated {
        self.mark();
        self.out.step_seconds = self.clock + self.gaps.1;
        let size = self.settings.prefetch_window.max(1) as usize;
        let rate = self.profile.host_to_device_gb_per_s * 1e9;
        for (moved, seconds) in self
            .moved_per_op
            .chunks(size)
            .zip(self.op_seconds.chunks(size))
        {
            self.out.windows += 1;
            let capacity = rate * seconds.iter().sum::<f64>();
            if moved.iter().sum::<u64>() as f64 > capacity {
                self.out.saturated_windows += 1;
            }
        }
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::tests::{growing_tape, slow_device, tape};

    /// A synchronous dry run's settings under `budget`, ranked by next use, with a prefetch
    /// window of `window` ops, rebuild room made at the settle, the state moving like any
    /// tensor and no room made early: what the tests vary from.
    fn settings(budget: u64, window: u32, recompute: RecomputeMode) -> Settings {
        Settings {
            budget,
            host_limit: None,
            policy: PolicyKind::NextUse,
            prefetch_window: window,
            asynchronous: false,
            recompute,
            rebuild_room: RebuildRoom::AtSettle,
            keeps_lineage: true,
            state: StateResidency::Movable,
            keeps_state: false,
            evicts_early: false,
            paces_early: false,
            extra_recipes: ExtraRecipes::NONE,
        }
    }

    /// A step on the slow device, every op the same time: what the tests build a `Sim` from.
    struct Step {
        tape: StepTape,
        profile: DeviceProfile,
        plan: UsePlan,
        op_seconds: Vec<f64>,
        gaps: (Vec<f64>, f64),
    }

    impl Step {
        fn new(tape: StepTape, op_seconds: f64) -> Self {
            let plan = carry::repeating_plan(&tape, &carry::pairs(&tape));
            let ops = tape.ops.len();
            Self {
                profile: slow_device(),
                plan,
                op_seconds: vec![op_seconds; ops],
                gaps: (vec![0.0; ops], 0.0),
                tape,
            }
        }

        /// The growing tape, its ops 1.5 ms each (the settle's tests): ops 0-5 make tensors
        /// 10-15 (1 KiB each, so each grows the device by 1 KiB), all read by op 6.
        fn growing() -> Self {
            Self::new(growing_tape(), 1.5e-3)
        }

        /// A synchronous dry run under 4 KiB, ranked by next use, with no prefetch window.
        fn sim(&self, recompute: RecomputeMode, learnt: Learnt) -> Sim<'_> {
            let settings = settings(4 * 1024, 0, recompute);
            Sim::new(
                &self.tape,
                &self.profile,
                &self.plan,
                &self.op_seconds,
                &self.gaps,
                settings,
                learnt,
            )
        }
    }

    /// In the prefetch walk a rebuild due before a spilled tensor's use takes its room first:
    /// `d = exp(x)` is dropped and rebuilt at op 2, `s` is on the host and read at op 3. Under
    /// 7 KiB, with 3 KiB on the device and the ops up to op 3 making 3 KiB, `s` fits beside the
    /// ops' room but not beside `d`'s rebuild too: the walk that counts the rebuild holds `s`
    /// back (and makes room for it), and so does a ceiling that leaves room beside prefetches;
    /// the walk that leaves rebuilds to the settle prefetches it.
    #[test]
    fn lineage_is_kept_as_the_engine_keeps_it() {
        // x (1, made before the step) -> exp -> exp -> ... six deep, then a matmul of the last.
        let ids: Vec<u64> = (1..=8).collect();
        let mut ops: Vec<(&str, &[u64], &[u64])> = (0..6)
            .map(|k| ("float_exp", &ids[k..k + 1], &ids[k + 1..k + 2]))
            .collect();
        ops.push(("float_matmul", &ids[6..7], &ids[7..8]));
        let sizes: Vec<(u64, u64)> = ids.iter().map(|&id| (id, 64)).collect();
        let t = tape(&ops, &sizes, &[]);
        let recipes = recipes(&t, ExtraRecipes::NONE);
        assert!(!recipes.contains_key(&1) && !recipes.contains_key(&8));
        let kept = lineage(&t, &recipes);
        // Tensor 2's recipe reaches no ghost, 3's one, ... 6's four (the bound): the recipes of
        // 2 to 5 are kept by the ops that read them; 6's is not (7's would reach five deep), and
        // neither is 7's (the matmul that reads it keeps no recipe).
        let mut kept: Vec<u64> = kept.into_iter().collect();
        kept.sort_unstable();
        assert_eq!(kept, vec![2, 3, 4, 5]);
    }

    #[test]
    fn a_rebuild_in_the_prefetch_walk_holds_back_a_prefetch_used_after_it() {
        const KIB: u64 = 1024;
        let t = tape(
            &[
                ("float_exp", &[1], &[2]),
                ("float_neg", &[9], &[3]),
                ("float_add", &[2, 1], &[4]),
                ("float_add", &[6, 3], &[5]),
            ],
            &[1, 2, 3, 4, 5, 6, 9].map(|id| (id, KIB)),
            &[],
        );
        let profile = slow_device();
        let plan = carry::repeating_plan(&t, &carry::pairs(&t));
        let (op_seconds, gaps) = (vec![1e-6; 4], (vec![0.0; 4], 0.0));
        let prefetched = |rebuild_room| {
            let settings = Settings {
                rebuild_room,
                ..settings(7 * KIB, 8, RecomputeMode::Recompute)
            };
            let learnt = Learnt::default();
            let mut sim = Sim::new(&t, &profile, &plan, &op_seconds, &gaps, settings, learnt);
            for (id, place) in [
                (1, Place::Device),
                (2, Place::Dropped),
                (3, Place::Device),
                (6, Place::Host),
                (9, Place::Device),
            ] {
                sim.set_place(id, place);
            }
            sim.device = 3 * KIB;
            sim.host = KIB;
            sim.after_op(0);
            sim.prefetched.contains(&6)
        };
        assert!(
            prefetched(RebuildRoom::AtSettle),
            "the ops' room alone leaves room for `s`"
        );
        assert!(
            !prefetched(RebuildRoom::InPrefetchWalk),
            "`d`'s rebuild takes the room first"
        );
        assert!(
            !prefetched(RebuildRoom::BesidePrefetches),
            "`s`'s ceiling leaves room for `d`'s rebuild"
        );
    }

    #[test]
    fn the_rebuilds_ahead_count_up_to_the_use_they_are_asked_for() {
        let ahead = RebuildsAhead {
            at: vec![(2, 10), (2, 5), (7, 100)],
        };
        assert_eq!(ahead.bytes_until(1), 0);
        assert_eq!(ahead.bytes_until(2), 15, "that use included");
        assert_eq!(ahead.bytes_until(6), 15);
        assert_eq!(ahead.bytes_until(u32::MAX), 115);
    }

    /// The dry run makes room ahead for the ops a slow link would fall behind for as the
    /// engine's settle does: from the moves it simulated (their pace per byte, without each
    /// move's fixed cost) against the ops' mean time.
    #[test]
    fn the_settle_looks_ahead_from_the_simulated_moves_as_the_engine_does() {
        const KIB: u64 = 1024;
        let growing = Step::growing();
        let settle_ops = |to_host: MoveHistory| {
            let learnt = Learnt {
                moves: Moves {
                    to_host,
                    ..Moves::default()
                },
                ..Learnt::default()
            };
            growing.sim(RecomputeMode::Swap, learnt).settle_ops(0)
        };
        let at_per_kib = |micros: u64| {
            let mut history = MoveHistory::default();
            // A 4-byte move tells the fixed cost (10 µs), then 1 KiB ones.
            history.add(4, std::time::Duration::from_micros(10));
            for _ in 0..4 {
                history.add(KIB, std::time::Duration::from_micros(10 + micros));
            }
            history
        };
        assert_eq!(settle_ops(MoveHistory::default()), 0, "no move yet");
        assert_eq!(settle_ops(at_per_kib(100)), 0, "the link keeps up");
        // A KiB leaves in 1 ms and an op takes 1.5: op 1's room is made with op 0's.
        assert_eq!(settle_ops(at_per_kib(1000)), 1);
    }

    /// With recompute on, the dry run's settle keeps room for the rebuilds of dropped tensors
    /// within its reach, as the engine's does (`policy::prefetch::rebuild_reach`).
    #[test]
    fn the_settle_counts_the_rebuilds_within_its_reach_as_the_engine_does() {
        const KIB: u64 = 1024;
        let growing = Step::growing();
        let mut sim = growing.sim(RecomputeMode::Recompute, Learnt::default());
        sim.set_place(10, Place::Dropped);
        sim.set_place(11, Place::Device);
        sim.set_place(12, Place::Host);
        assert_eq!(
            sim.rebuild_room(6, 0),
            KIB,
            "rebuilt by the next op; moved or resident tensors are not counted"
        );
        assert_eq!(
            sim.rebuild_room(5, 0),
            KIB,
            "by the op after it: within the reach"
        );
        assert_eq!(
            sim.rebuild_room(4, 0),
            0,
            "two ops after the next: beyond it"
        );
        assert_eq!(
            sim.rebuild_room(4, 1),
            KIB,
            "unless moves take an op to land"
        );
    }

    /// An eviction that the settle target sets off goes on to the room the next ops need,
    /// taking only tensors used after them: the engine's `settle_ahead`, one pass for several
    /// ops' growth, on a device that drops its victims too, as the engine's does.
    #[test]
    fn an_eviction_goes_on_for_the_next_ops_with_tensors_used_after_them() {
        const KIB: u64 = 1024;
        // Sources 1 (read by op 1) and 2-5 (read by the last op); ops 0-10 each make a tensor
        // the last op reads, so that each grows the device by 1 KiB.
        let made: Vec<u64> = (100..=110).collect();
        let mut ops: Vec<(&str, Vec<u64>, Vec<u64>)> = made
            .iter()
            .enumerate()
            .map(|(i, &id)| {
                (
                    "float_exp",
                    if i == 1 { vec![1] } else { Vec::new() },
                    vec![id],
                )
            })
            .collect();
        ops.push((
            "float_add",
            [2, 3, 4, 5].into_iter().chain(made.clone()).collect(),
            Vec::new(),
        ));
        let ops: Vec<(&str, &[u64], &[u64])> = ops
            .iter()
            .map(|(name, i, o)| (*name, i.as_slice(), o.as_slice()))
            .collect();
        let sizes: Vec<(u64, u64)> = (1..=5)
            .chain(made.iter().copied())
            .map(|id| (id, KIB))
            .collect();
        let t = tape(&ops, &sizes, &[]);
        let profile = slow_device();
        let plan = carry::repeating_plan(&t, &carry::pairs(&t));
        let (op_seconds, gaps) = (vec![1e-6; ops.len()], (vec![0.0; ops.len()], 0.0));
        let budget = 6 * KIB;
        for recompute in [RecomputeMode::Swap, RecomputeMode::Recompute] {
            let settings = settings(budget, 0, recompute);
            let mut sim = Sim::new(
                &t,
                &profile,
                &plan,
                &op_seconds,
                &gaps,
                settings,
                Learnt::default(),
            );
            sim.place_sources(&Start::default());
            assert_eq!(sim.device, 5 * KIB, "the sources start on the device");
            // Op 0 made its tensor: 6 KiB, over the target (the budget less op 1's 1 KiB).
            sim.set_place(100, Place::Device);
            sim.device += KIB;
            sim.after_op(0);
            let now = sim.positions_after[0];
            let target = decide::settle_target(budget, &plan, now, 0);
            let (ahead, after) = decide::settle_ahead(budget, &plan, now, 0);
            assert!(ahead < target && after > 1, "the next ops grow the device");
            assert_eq!(
                sim.place.get(&1),
                Some(&Place::Device),
                "{recompute}: op 1 reads it: it stays"
            );
            let gone = [2, 3, 4, 5, 100]
                .iter()
                .filter(|id| !matches!(sim.place.get(id), Some(Place::Device)))
                .count();
            assert_eq!(
                gone, 5,
                "{recompute}: the tensors read last all go, where the target alone asked for \
                 one: {:?}",
                sim.place
            );
            assert_eq!(sim.device - sim.leaving, KIB);
        }
    }

    /// Under a behaviour that makes room early, the dry run's settle evicts what the step's
    /// peak needs the room of on a slow link, from tensors used after the peak, though the
    /// peak is beyond the settle's reach; as the engine's does
    /// (`a_behaviour_that_evicts_early_makes_the_peaks_room_on_a_slow_link`).
    #[test]
    fn room_for_the_peak_is_made_early_as_the_engine_makes_it() {
        const KIB: u64 = 1024;
        // Ops 0-69 read source 1 and make a tensor freed at once; ops 70-79 each make one the
        // last op (80) reads with sources 2-5: the peak is op 79's, 10 KiB over the level
        // before it, beyond the settle's 64 ops.
        let scratch: Vec<u64> = (200..270).collect();
        let made: Vec<u64> = (100..110).collect();
        let mut ops: Vec<(&str, Vec<u64>, Vec<u64>)> = scratch
            .iter()
            .map(|&id| ("float_exp", vec![1], vec![id]))
            .chain(made.iter().map(|&id| ("float_exp", Vec::new(), vec![id])))
            .collect();
        let last: Vec<u64> = [2, 3, 4, 5]
            .into_iter()
            .chain(made.iter().copied())
            .collect();
        ops.push(("float_add", last, Vec::new()));
        let ops: Vec<(&str, &[u64], &[u64])> = ops
            .iter()
            .map(|(name, i, o)| (*name, i.as_slice(), o.as_slice()))
            .collect();
        let ids = (1..=5)
            .chain(scratch.iter().copied())
            .chain(made.iter().copied());
        let sizes: Vec<(u64, u64)> = ids.map(|id| (id, KIB)).collect();
        let drops: Vec<(u64, u32)> = (scratch.iter().zip(1..))
            .chain(made.iter().map(|id| (id, 81)))
            .map(|(&id, after_ops)| (id, after_ops))
            .collect();
        let step = Step::new(tape(&ops, &sizes, &drops), 1.5e-3);
        let moved = |evicts_early: bool| {
            let mut sim = step.sim(RecomputeMode::Swap, Learnt::default());
            sim.settings.budget = 6 * KIB;
            sim.settings.evicts_early = evicts_early;
            sim.place_sources(&Start::default());
            assert_eq!(sim.device, 5 * KIB, "the sources start on the device");
            // Evictions measured at 10 µs each plus 20 ms a KiB: the 9 KiB that must leave
            // before the peak take longer than the 78 ops before it run.
            let to_host = &mut sim.learnt.moves.to_host;
            to_host.add(4, std::time::Duration::from_micros(10));
            for _ in 0..4 {
                to_host.add(KIB, std::time::Duration::from_micros(20_010));
            }
            sim.after_op(0);
            let mut gone: Vec<u64> = sim
                .place
                .iter()
                .filter(|(_, place)| !matches!(place, Place::Device))
                .map(|(id, _)| *id)
                .collect();
            gone.sort_unstable();
            gone
        };
        assert_eq!(
            moved(true),
            vec![2, 3, 4, 5],
            "not 1, which the next ops read"
        );
        assert_eq!(
            moved(false),
            Vec::<u64>::new(),
            "the settle's reach asks for nothing"
        );
    }

    /// A pass for tensors used after a position that found none is skipped while nothing read
    /// or made resident since could be taken, and runs again once something could.
    #[test]
    fn a_fruitless_pass_is_skipped_until_a_tensor_it_could_take_is_resident() {
        const KIB: u64 = 1024;
        // Sources 1-3 are all read by op 2; tensor 20 is known by its size alone (no use).
        let ops: [(&str, &[u64], &[u64]); 3] = [
            ("float_exp", &[1], &[10]),
            ("float_exp", &[2], &[11]),
            ("float_add", &[1, 2, 3], &[]),
        ];
        let sizes: Vec<(u64, u64)> = [1, 2, 3, 10, 11, 20].map(|id| (id, KIB)).to_vec();
        let step = Step::new(tape(&ops, &sizes, &[]), 1e-3);
        let mut sim = step.sim(RecomputeMode::Swap, Learnt::default());
        sim.settings.budget = 3 * KIB;
        for id in [1, 2, 3] {
            sim.grow(KIB);
            sim.set_place(id, Place::Device);
        }
        sim.host += KIB;
        sim.set_place(20, Place::Host);
        sim.evict_used_after(false, 0, 5, (0, 0), true);
        assert_eq!(
            sim.out.evictions, 0,
            "every resident tensor is read by op 2"
        );
        assert_eq!(sim.room_fruitless.beyond, Some(5));
        sim.evict_used_after(false, 0, 7, (0, 0), true);
        assert_eq!(sim.room_fruitless.beyond, Some(5), "covered, so skipped");
        assert_eq!(
            sim.early_fruitless.beyond, None,
            "the early passes keep their own memo"
        );
        // It comes back.
        sim.host -= KIB;
        sim.grow(KIB);
        sim.set_place(20, Place::Device);
        sim.evict_used_after(false, 0, 7, (0, 0), true);
        assert_eq!(sim.out.evictions, 1, "the tensor made resident is taken");
        assert!(matches!(sim.place[&20], Place::Leaving { .. }));
        assert_eq!(sim.room_fruitless.beyond, None, "that pass found a victim");
    }

    /// A prefetched tensor evicted again unread is fetched nearer its use, as the engine
    /// fetches it: half as far ahead for each waste.
    #[test]
    fn a_wasted_prefetch_brings_the_next_one_nearer_the_use() {
        // Tensor 1 comes from before the step and is read by the last op.
        let step = Step::new(
            tape(
                &[
                    ("float_exp", &[2], &[3]),
                    ("float_exp", &[3], &[4]),
                    ("float_exp", &[4], &[5]),
                    ("float_add", &[5, 1], &[6]),
                ],
                &[
                    (1, 1024),
                    (2, 1024),
                    (3, 1024),
                    (4, 1024),
                    (5, 1024),
                    (6, 1024),
                ],
                &[(2, 1), (3, 2), (4, 3), (5, 4)],
            ),
            1e-6,
        );
        let mut sim = step.roomy(2);
        sim.prefetched.insert(1);
        sim.evict(1, 0.0, 0);
        sim.retire(f64::INFINITY, 0);
        assert_eq!(sim.place.get(&1), Some(&Place::Host));
        sim.after_op(0);
        assert_eq!(
            sim.out.prefetches, 0,
            "two ops ahead is no longer near enough after a waste (the reach was two)"
        );
        sim.after_op(1);
        assert_eq!(sim.out.prefetches, 1, "one op ahead is");
    }

    impl Step {
        /// A dry run whose budget never binds (swap only, synchronous, ranked by next use) with
        /// a prefetch window of `window` ops, its sources placed: the wasted-prefetch tests'.
        fn roomy(&self, window: u32) -> Sim<'_> {
            let settings = settings(1 << 20, window, RecomputeMode::Swap);
            let mut sim = Sim::new(
                &self.tape,
                &self.profile,
                &self.plan,
                &self.op_seconds,
                &self.gaps,
                settings,
                Learnt::default(),
            );
            sim.place_sources(&Start::default());
            sim
        }
    }

    /// A tensor read by two ops of the step (a parameter read by the forward and by the
    /// optimizer): a waste before one use fetches it nearer that use only.
    #[test]
    fn a_wasted_prefetch_brings_only_that_use_nearer() {
        // Tensor 1 comes from before the step and is read by ops 4 and 7.
        let mut ops: Vec<(&str, Vec<u64>, Vec<u64>)> = (0..8)
            .map(|i| ("float_exp", Vec::new(), vec![10 + i]))
            .collect();
        ops[4].1 = vec![1];
        ops[7].1 = vec![1];
        let ops: Vec<(&str, &[u64], &[u64])> = ops
            .iter()
            .map(|(name, inputs, outputs)| (*name, &inputs[..], &outputs[..]))
            .collect();
        let sizes: Vec<(u64, u64)> = std::iter::once(1)
            .chain(10..18)
            .map(|id| (id, 1024))
            .collect();
        let step = Step::new(tape(&ops, &sizes, &[]), 1e-6);
        let mut sim = step.roomy(4);
        // Prefetched for op 7 and evicted unread at op 5, two ops before that use.
        sim.prefetched.insert(1);
        sim.evict(1, 0.0, 5);
        sim.retire(f64::INFINITY, 5);
        assert_eq!(sim.learnt.wasted.len(), 1);
        // After op 0, op 4 is 3 ops away, within the window: the waste before op 7 (which
        // brought that use within one op) does not hold this one back.
        sim.after_op(0);
        assert_eq!(sim.out.prefetches, 1, "fetched for op 4 as if never wasted");
    }

    /// A prefetch that lands after its op began was read all the same: the engine takes its
    /// mark at the read, so evicting it after its op is no waste.
    #[test]
    fn a_late_prefetch_read_by_its_op_is_no_waste() {
        // Tensor 1 comes from before the step and is read by op 0 and by op 2.
        let step = Step::new(
            tape(
                &[
                    ("float_exp", &[1], &[2]),
                    ("float_exp", &[2], &[3]),
                    ("float_add", &[3, 1], &[4]),
                ],
                &[(1, 1024), (2, 1024), (3, 1024), (4, 1024)],
                &[],
            ),
            1e-6,
        );
        let mut sim = step.roomy(2);
        sim.set_place(1, Place::Host);
        sim.device -= 1024;
        sim.host += 1024;
        // Fetched ahead of op 0, still on its way when op 0 comes.
        sim.restore(1, 0.0, 0);
        sim.prefetched.insert(1);
        sim.run_op(0);
        assert_eq!(sim.out.late_inputs, 1);
        sim.evict(1, sim.clock, 0);
        assert!(
            sim.learnt.wasted.is_empty(),
            "read by op 0 before this eviction: not wasted"
        );
    }

    /// A settle with a plan takes no tensor the ops it makes room for read (the engine's
    /// `Takes::AllButReadUntil`): it would come back before they are done.
    #[test]
    fn a_settle_takes_nothing_its_own_ops_read() {
        const KIB: u64 = 1024;
        let growing = Step::growing();
        let mut sim = growing.sim(RecomputeMode::Swap, Learnt::default());
        // 10 and 11 are read by op 6, the last; 20 by no op of the step.
        for id in [10, 11, 20] {
            sim.set_place(id, Place::Device);
        }
        sim.sizes.insert(20, KIB);
        let none = HashSet::default();
        let taken = |takes| {
            let mut ids = sim.victims(0, 3 * KIB, &none, takes, false);
            ids.sort_unstable();
            ids
        };
        assert_eq!(taken(Takes::AllButNextOp), vec![10, 11, 20]);
        assert_eq!(taken(Takes::AllButReadUntil(5)), vec![10, 11, 20]);
        assert_eq!(
            taken(Takes::AllButReadUntil(6)),
            vec![20],
            "op 6 is within the ops it makes room for"
        );
    }
}
