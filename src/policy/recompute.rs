//! Swap or recompute: whether a victim's bytes are moved off the device or dropped, to be
//! rebuilt from the inputs of the op that made it when it is next used.
//!
//! The rule for memory (why a recipe can never hold more than swapping would, [`chain`]): a
//! tensor is dropped only when each input of its recipe is either alive now and, by the use
//! plan, still read at or after the tensor's own next use in this step (so the recipe holds
//! nothing the program itself would not keep alive until then), or recomputable from its own
//! recipe, kept beside it as lineage, from inputs that are (a ghost: it holds no bytes, and the
//! rebuild recomputes it and lets it go); and only when the op at that use, with those inputs
//! and the ghosts beside it, fits the budget (the rebuild needs them on the device there).
//! Without a plan, or outside a step whose positions the plan is read at (a marked step, or one
//! the period detector cut at the period of the plan's own step), nothing is dropped. A dropped
//! tensor holds the inputs it relies on until it is rebuilt or dropped itself (so a plan that was
//! wrong costs memory, never data), chains of dropped tensors are at most [`MAX_REBUILD_DEPTH`]
//! deep when each is dropped, and ghosts at most [`MAX_GHOST_CHAIN`].
//!
//! The rule for time ([`RecomputeMode::Both`]): what either choice costs the ops, not the
//! device. A rebuild runs on their stream; a move runs on the link, and costs them only the
//! link time they wait for: all of a copy made on the op's thread, and of a copy a worker makes
//! behind them the share the link is busy ([`move_exposures`]). On an idle link moving is free
//! and wins; on a busy one an elementwise rebuild, a few HBM passes, wins.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use super::PolicyKind;
use super::victim::Bandwidth;
use crate::SpillError;
use crate::engine::TensorId;
use crate::engine::index::RebuildInput;
use crate::plan::cost::{self, KernelModel, OpCost};
use crate::tape::StepTape;

/// What the engine may do with a victim on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecomputeMode {
    /// Always move its bytes to the host or disk (the default until `both` is measured
    /// better on the benchmarks' models).
    #[default]
    Swap,
    /// Drop every victim that has a recipe whose inputs stay alive, whatever the cost (as DTR
    /// does); the others are moved. Under `cost_aware`, on a busy link, the victims are chosen
    /// by the cheaper way back, a rebuild for those it may drop (see [`ranks_by_rebuild`]).
    /// Where room for rebuilds is made ahead ([`RebuildRoom`]) and how room is made early for
    /// the step's peak ([`EarlyRoom`]) each plan's dry run chooses, as `both`'s does (see
    /// [`candidates`]), unless the config sets them.
    Recompute,
    /// Each plan's steps run the way a dry run of the recorded step predicts fastest (see
    /// [`fastest_behaviour`]): as `swap`, as `recompute`, or weighing each victim, whichever
    /// costs the ops less time: the link time of moving its bytes out and back that they wait
    /// for (see [`move_exposures`]), or rebuilding it; each either moving the step's state
    /// like any tensor or keeping it on the device while other victims suffice
    /// ([`Behaviour::keeps_state`]). The dry run runs on the
    /// [`rebuild_profile`](crate::SpillConfig::rebuild_profile) (by default this machine as
    /// measured on a synchronous backend), once per plan; the choice is in
    /// [`RecomputeStats::behaviour`](crate::RecomputeStats::behaviour).
    Both,
}

impl RecomputeMode {
    /// The names `FromStr` accepts.
    pub const ACCEPTED: &'static str = "swap, recompute, both";

    /// Whether victims may be dropped at all (so ops keep recipes).
    pub fn may_drop(self) -> bool {
        self != RecomputeMode::Swap
    }
}

impl fmt::Display for RecomputeMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RecomputeMode::Swap => "swap",
            RecomputeMode::Recompute => "recompute",
            RecomputeMode::Both => "both",
        })
    }
}

impl FromStr for RecomputeMode {
    type Err = SpillError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().replace('-', "_").as_str() {
            "swap" | "swap_only" => Ok(RecomputeMode::Swap),
            "recompute" | "recompute_only" | "dtr" => Ok(RecomputeMode::Recompute),
            "both" | "swap+recompute" | "swap_and_recompute" => Ok(RecomputeMode::Both),
            _ => Err(SpillError::InvalidValue {
                field: "recompute",
                value: s.to_string(),
                accepted: Self::ACCEPTED,
            }),
        }
    }
}

/// The ops whose outputs keep a recipe: pure elementwise ops (no randomness, no state outside
/// their inputs), named as Burn's ops traits name them. The forwarding tables mark exactly
/// these rows `#[recompute]` (checked when a marked op runs), and the planner's simulation
/// reads the list to know which of a tape's tensors could be rebuilt.
pub const RECOMPUTABLE_OPS: [&str; 30] = [
    "float_add",
    "float_add_scalar",
    "float_clamp_min",
    "float_clamp_max",
    "float_clamp",
    "float_sub",
    "float_sub_scalar",
    "float_mul",
    "float_mul_scalar",
    "float_div",
    "float_div_scalar",
    "float_neg",
    "float_recip",
    "float_mask_where",
    "float_mask_fill",
    "float_cast",
    "float_exp",
    "float_log",
    "float_log1p",
    "float_powf_scalar",
    "float_sqrt",
    "float_abs",
    "float_cos",
    "float_sin",
    "float_tanh",
    "float_erf",
    "relu",
    "gelu",
    "sigmoid",
    "leaky_relu",
];

/// Whether the op named `name` keeps a recipe for its output.
pub fn is_recomputable(name: &str) -> bool {
    RECOMPUTABLE_OPS.contains(&name)
}

/// The recomputable ops a backend that runs several ops in one kernel does not rebuild (see
/// [`rebuilds_exactly`]).
pub const NOT_REBUILT_WHEN_FUSED: [&str; 4] = [
    "float_add",
    "float_add_scalar",
    "float_sub",
    "float_sub_scalar",
];

/// Whether a rebuild of the op named `name` gives the bits its first run gave, on a backend
/// that runs several ops in one kernel (`fuses_ops`: burn-fusion over wgpu or CUDA) or on one
/// that runs each op alone.
///
/// Alone, an op's kernel reads its inputs from memory and writes its output, so running it
/// again on the same inputs gives the same bits. Fused, the shader compiler optimises across
/// the ops of one kernel: it may contract a multiply and the add it feeds into one fused
/// multiply-add, rounded once (naga marks nothing `NoContraction`, NVRTC contracts by
/// default), and Mesa may divide by a square root as a multiply by an approximate reciprocal
/// square root. Two sides of a rebuild are exposed to that:
/// - the op that reads the rebuilt tensor: the rebuild runs just before it, and in one kernel
///   with it the compiler could fuse the two, where the first run, long before, was not. The
///   adapter runs the fusion stream's queued ops, the rebuild last, before that op is
///   registered (`backend/recipe.rs`). Without that, `tests/cubecl.rs`'s fused GPT with
///   recompute lost bit-identity in about half its runs (one step's loss one ulp off, on
///   lavapipe), and in every run when only layer norm's square roots were dropped; with it,
///   in none of 10 runs, nor of 5 with only square roots dropped;
/// - the op that made its inputs: an add or subtract may have run in one kernel with the
///   multiply that made its input, contracted, and a rebuild from the stored product cannot
///   contract it. Those ops ([`NOT_REBUILT_WHEN_FUSED`]) keep no recipe on such a backend.
pub fn rebuilds_exactly(name: &str, fuses_ops: bool) -> bool {
    !(fuses_ops && NOT_REBUILT_WHEN_FUSED.contains(&name))
}

/// The profile that times rebuilds on a CubeCL backend (wgpu, CUDA) when none is configured:
/// the built-in with the slowest device memory, so that a rebuild is not taken for cheaper
/// than it is on a faster card (its ops' measured durations are dispatch times, and the card
/// is not known).
pub const ASYNC_DEFAULT_PROFILE: &str = "rtx4090-pcie4";

/// How deep a chain of dropped tensors may be when one more is dropped: a rebuild runs this
/// many ops at most before the op that needs it.
pub const MAX_REBUILD_DEPTH: u32 = 4;

/// How many ghosts deep a recipe may reach. A recipe keeps, beside each input, that input's
/// own recipe (so that a rebuild can recompute an input the program has let go: a ghost) only
/// while the input's recipe reaches fewer than this many ghosts deep itself. This bounds the
/// ops one rebuild recomputes, and the recipes kept for it: without a bound, a parameter's
/// recipe (the optimizer's update) would keep every earlier step's. On the planner's GPT-125M
/// tapes, chains of 2, 4 and 8 let the same tensors be dropped (`docs/planner.md`).
pub const MAX_GHOST_CHAIN: u32 = 4;

/// What a rebuild relies on, as [`chain`] chose it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Chain {
    /// The inputs held alive while the tensor is dropped, each once: the recipe's own, and
    /// those of the ghosts.
    pub leaves: SmallVec<[TensorId; 4]>,
    /// Their bytes.
    pub leaf_bytes: u64,
    /// Bytes of the ghosts the rebuild recomputes and lets go again: on the device beside the
    /// leaves while it runs.
    pub ghost_bytes: u64,
    /// How many ops it runs for them.
    pub ghost_ops: u32,
    /// Their time, as `op_time` gave it.
    pub ghost_time: Duration,
    /// One more than the deepest chain of dropped tensors among the leaves (0 when none is
    /// dropped): see [`Rebuild::depth`].
    pub depth: u32,
    /// Bytes of the leaves off the device now: see [`Rebuild::inputs_off_device`].
    pub inputs_off_device: u64,
}

/// The memory rule over a recipe's `inputs`: an input the program holds and reads again at or
/// after the rebuild (`outlives`) is held until then, a leaf, which costs no memory the program
/// would not hold anyway; any other is recomputed from its own recipe during the rebuild (a
/// ghost), its inputs under the same rule. An input that is neither makes the tensor one that
/// may not be dropped (`None`). `op_time` times a ghost's op from its measured time and cost.
pub fn chain(
    inputs: &[RebuildInput],
    outlives: &mut impl FnMut(TensorId) -> bool,
    op_time: &impl Fn(Duration, &OpCost) -> Duration,
) -> Option<Chain> {
    let mut chain = Chain::default();
    add_inputs(&mut chain, inputs, outlives, op_time)?;
    Some(chain)
}

fn add_inputs(
    chain: &mut Chain,
    inputs: &[RebuildInput],
    outlives: &mut impl FnMut(TensorId) -> bool,
    op_time: &impl Fn(Duration, &OpCost) -> Duration,
) -> Option<()> {
    for input in inputs {
        if let Some(alive) = input.alive
            && outlives(input.id)
        {
            if chain.leaves.contains(&input.id) {
                continue;
            }
            chain.leaves.push(input.id);
            chain.leaf_bytes += input.bytes;
            if let Some(depth) = alive.dropped_depth {
                chain.depth = chain.depth.max(depth + 1);
            }
            if alive.off_device {
                chain.inputs_off_device += input.bytes;
            }
            continue;
        }
        let ghost = input.ghost.as_deref()?;
        add_inputs(chain, &ghost.inputs, outlives, op_time)?;
        chain.ghost_bytes += input.bytes;
        chain.ghost_ops += 1;
        chain.ghost_time += op_time(ghost.op_time, &ghost.cost);
    }
    Some(())
}

/// What rebuilding one victim costs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rebuild {
    /// The op's time: as last measured, or modelled (see [`RebuildTimes`]).
    pub op_time: Duration,
    /// How many dropped tensors its inputs already depend on, itself not counted.
    pub depth: u32,
    /// Bytes of the recipe's inputs that are off the device now (in the host tier, on disk, or
    /// leaving): the rebuild brings them back when the op that needs it comes, which no
    /// prefetch plans for, so the op waits for them.
    pub inputs_off_device: u64,
}

/// Where the op time of a rebuild comes from when [`RecomputeMode::Both`] weighs it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum RebuildTimes {
    /// The op's own duration when it last ran: its compute time on a synchronous backend
    /// (Flex, NdArray), where an op returns once its result is there.
    #[default]
    Measured,
    /// The op's kernel on a device's figures, from its FLOPs and bytes: for asynchronous
    /// backends (CubeCL: wgpu, CUDA), whose ops return once their kernels are queued, so that a
    /// measured duration is a dispatch time and says nothing of the kernel's.
    Modelled(KernelModel),
}

impl RebuildTimes {
    /// The time to weigh for an op that last took `measured` on the host and costs `cost`.
    pub fn op_time(&self, measured: Duration, cost: &OpCost) -> Duration {
        match self {
            RebuildTimes::Measured => measured,
            RebuildTimes::Modelled(model) => Duration::from_secs_f64(model.seconds(cost)),
        }
    }

    /// The seconds `tape`'s ops compute, timed the same way: what the link's utilization over
    /// the step is measured against (a recorded duration on an asynchronous backend is a
    /// dispatch, which would make the link look busier than it is).
    pub fn compute_seconds(&self, tape: &StepTape) -> f64 {
        match self {
            RebuildTimes::Measured => tape.ops.iter().map(|op| op.duration_ns as f64 * 1e-9).sum(),
            RebuildTimes::Modelled(model) => {
                let by_id: HashMap<_, _> = tape.tensors.iter().map(|t| (t.id, t)).collect();
                tape.ops
                    .iter()
                    .map(|op| model.seconds(&cost::op_cost(op, |id| by_id.get(&id).copied())))
                    .sum()
            }
        }
    }
}

/// What the engine knows of a victim when it decides.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Victim {
    /// Its bytes.
    pub bytes: u64,
    /// Moving bytes off the device, as measured.
    pub evict: Bandwidth,
    /// Bringing them back, as measured.
    pub restore: Bandwidth,
    /// The share of the eviction's link time the ops pay for: all of it when it is made on
    /// the op's thread (room for the op about to run, a synchronous engine, or a copy cheaper
    /// there than a worker's), otherwise the link's utilization (see [`move_exposures`]).
    pub evict_exposure: f64,
    /// The same for bringing it back: all of it when no prefetch brings it ahead of its use
    /// (its next use is unknown or within the prefetch window) or the prefetch runs on the
    /// op's thread, otherwise the link's utilization.
    pub restore_exposure: f64,
}

/// Whether the op's thread waits for each of a victim's two copies: the eviction being made
/// now, and the restore a prefetch would make (a synchronous engine makes both there; an
/// asynchronous one makes a copy there when it is cheaper than waking a worker).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OnOpThread {
    /// The eviction.
    pub evict: bool,
    /// The restore.
    pub restore: bool,
}

/// The shares of a victim's eviction and restore link times that the ops pay for (see
/// [`Victim`]): for copies made where `on_op_thread` says, of a tensor next used `distance`
/// ops later, with a prefetch window of `prefetch_window` ops, on a link busy for
/// `link_utilization` of the step (the link time of the moves a replay of the step makes,
/// over the time its ops compute, at most 1).
pub fn move_exposures(
    link_utilization: f64,
    on_op_thread: OnOpThread,
    distance: u32,
    prefetch_window: u32,
) -> (f64, f64) {
    let behind_the_ops = |on_op_thread: bool| if on_op_thread { 1.0 } else { link_utilization };
    let prefetched = prefetch_window > 0 && distance > prefetch_window;
    let restore = if prefetched {
        behind_the_ops(on_op_thread.restore)
    } else {
        1.0
    };
    (behind_the_ops(on_op_thread.evict), restore)
}

/// The link utilization (see [`move_exposures`]) from which a mode that drops victims
/// ([`RecomputeMode::Both`] and [`RecomputeMode::Recompute`]) ranks them by the cheaper of a
/// move and a rebuild.
///
/// With the link busy most of the step, every byte not moved shortens it, and a cheap rebuild
/// should go before a move of a tensor used later. With the link mostly idle, moves hide behind
/// the ops, while a rebuild's bytes come back when its op comes, and the room for them is an
/// eviction that op waits for: taking droppable tensors first then costs more than the moves it
/// saves. Chosen on the planner's predictions (`scripts/plan-gpu-scale.sh`, cost_aware, window
/// 512, at 50/33/25% of the peak): ResNet-50 on `gh200-c2c`, whose link is busy 31-51% of its
/// steps, went from +12.4% to +31.4% at 33% when ranked by rebuilds; on `h200-pcie5` and
/// `a100-pcie4`, busy 87-100%, ResNet-50 at 50% went from +10.0% to +3.3% and from +32.0% to
/// +19.2%. Recompute-only, ranked the same way (`scripts/plan-modes.sh`, 2026-12-07): ResNet-50
/// at batch 16 on `h200-pcie5` from +40.5 / +65.3 / +83.5% to +2.3 / +41.1 / +60.7%, and
/// ranked on `gh200-c2c`'s idle link too, ResNet-50 at batch 2 and 33% from +11.4% to +30.8%.
pub const RANK_REBUILDS_FROM_UTILIZATION: f64 = 0.8;

/// Whether victims are ranked by the cheaper of a move and a rebuild: when `mode` drops
/// victims, under [`CostAware`](super::victim::CostAware) (the only policy that weighs what
/// bringing a tensor back costs, so the only one a rebuild's cost could reorder), on a link
/// busy at least [`RANK_REBUILDS_FROM_UTILIZATION`] of the step.
///
/// Recompute-only drops every victim the memory rule lets it drop, but which tensors become
/// victims is the ranking's: ranked by the policy alone, a tensor used later goes first and is
/// moved, while a droppable one whose rebuild costs next to nothing stays. Ranked by the way
/// each comes back (its rebuild, if it may be dropped, else its move), the cheap rebuilds go
/// first, as DTR ranks its evictions by the cost of recomputing them. `both`'s behaviours that
/// drop every victim they may rank them alike.
pub fn ranks_by_rebuild(mode: RecomputeMode, policy: PolicyKind, link_utilization: f64) -> bool {
    mode.may_drop()
        && policy == PolicyKind::CostAware
        && link_utilization >= RANK_REBUILDS_FROM_UTILIZATION
}

/// How the steps of one plan treat their victims under [`RecomputeMode::Both`], as chosen
/// by [`fastest_behaviour`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Behaviour {
    /// Which victims are dropped: `swap` none, `recompute` every one the memory rule allows,
    /// `both` those whose rebuild costs the ops less time than their move (see
    /// [`prefer_recompute`]).
    pub victims: RecomputeMode,
    /// Where room for the dropped tensors' rebuilds is made ahead of their ops.
    pub rebuild_room: RebuildRoom,
    /// Whether the step's state (parameters, an optimizer's state, the batch, and their
    /// updates: [`UsePlan::is_state`](super::plan::UsePlan::is_state)) leaves the device only
    /// when the other victims fall short. The state's next use is far (an optimizer reads it
    /// at the step's end), so a policy ranks it first; brought back all at once for the
    /// optimizer's short ops, it can cost more stall than moving activations the backward's
    /// compute hides.
    #[serde(default)]
    pub keeps_state: bool,
    /// Whether the settle also makes room early for the step's coming peak while no eviction
    /// is under way ([`early_room`](super::prefetch::early_room)): on a link slower than the
    /// ops, the forward's evictions then start in the optimizer's last ops instead of queueing
    /// behind each other, at the cost of moving some tensors a just-in-time settle would not.
    #[serde(default)]
    pub evicts_early: bool,
    /// With `evicts_early`: whether each early pass sends only a share of that room, what the
    /// link moves while the settle's horizon of ops runs, so that the evictions the next ops
    /// need do not queue behind all of it (`paced` in [`early_room`](super::prefetch::early_room)).
    #[serde(default)]
    pub paces_early: bool,
}

/// Where the engine makes room ahead for the rebuilds of dropped tensors. A rebuild's bytes
/// come back at its op with no move to announce them; room not made before is an eviction that
/// op waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RebuildRoom {
    /// Only the settle after each op, for the rebuilds due within its reach
    /// (`rebuild_reach` in `src/policy/prefetch.rs`); prefetches fill the device as they would
    /// without drops.
    AtSettle,
    /// Also each prefetch, which leaves room for the rebuilds due before its tensor's use
    /// (`ceiling_beside_rebuilds` in `src/policy/prefetch.rs`).
    BesidePrefetches,
    /// Also the prefetch walk, in which a rebuild due within the prefetch reach takes its turn
    /// by its use, as a prefetch of its bytes that moves nothing: one that does not fit stops
    /// the walk, and room is made for it by evicting tensors used after it, as for a prefetch.
    InPrefetchWalk,
}

impl RebuildRoom {
    /// The names `FromStr` accepts.
    pub const ACCEPTED: &'static str = "at_settle, beside_prefetches, in_prefetch_walk";
}

impl fmt::Display for RebuildRoom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RebuildRoom::AtSettle => "at_settle",
            RebuildRoom::BesidePrefetches => "beside_prefetches",
            RebuildRoom::InPrefetchWalk => "in_prefetch_walk",
        })
    }
}

impl FromStr for RebuildRoom {
    type Err = SpillError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().replace('-', "_").as_str() {
            "at_settle" | "settle" => Ok(RebuildRoom::AtSettle),
            "beside_prefetches" => Ok(RebuildRoom::BesidePrefetches),
            "in_prefetch_walk" => Ok(RebuildRoom::InPrefetchWalk),
            _ => Err(SpillError::InvalidValue {
                field: "rebuild_room",
                value: s.to_string(),
                accepted: Self::ACCEPTED,
            }),
        }
    }
}

/// How the settle makes room early for the step's coming peak while no eviction is under way
/// ([`early_room`](super::prefetch::early_room)): not at all, all the room at once, or a share
/// at a time (what the link moves while the settle's horizon of ops runs). Which is fastest
/// depends on the step: on the recorded GPTs the room sent at once wins, on ResNet-50 at
/// batch 16 a share at a time does (`docs/planner.md`), so `both` and `recompute` choose it per
/// plan by their dry run unless the config sets it
/// ([`SpillConfig::early_room`](crate::SpillConfig::early_room)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EarlyRoom {
    /// The settle makes only the room the next ops need.
    Off,
    /// One early pass sends all the room the peak needs.
    AtOnce,
    /// Each early pass sends a share of it.
    Paced,
}

impl EarlyRoom {
    /// The names `FromStr` accepts.
    pub const ACCEPTED: &'static str = "off, at_once, paced";

    /// What the engine's settle reads: `None` when no room is made early, otherwise whether a
    /// share at a time.
    pub fn pacing(self) -> Option<bool> {
        match self {
            EarlyRoom::Off => None,
            EarlyRoom::AtOnce => Some(false),
            EarlyRoom::Paced => Some(true),
        }
    }
}

impl fmt::Display for EarlyRoom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EarlyRoom::Off => "off",
            EarlyRoom::AtOnce => "at_once",
            EarlyRoom::Paced => "paced",
        })
    }
}

impl FromStr for EarlyRoom {
    type Err = SpillError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().replace('-', "_").as_str() {
            "off" | "none" => Ok(EarlyRoom::Off),
            "at_once" => Ok(EarlyRoom::AtOnce),
            "paced" => Ok(EarlyRoom::Paced),
            _ => Err(SpillError::InvalidValue {
                field: "early_room",
                value: s.to_string(),
                accepted: Self::ACCEPTED,
            }),
        }
    }
}

impl Behaviour {
    /// Whether `both` may run this behaviour when the config sets where room for rebuilds is
    /// made (`room`, see [`SpillConfig::rebuild_room`](crate::SpillConfig::rebuild_room)),
    /// whether the state is kept (`keep_state`, see
    /// [`SpillConfig::keep_state`](crate::SpillConfig::keep_state)) or how room is made early
    /// (`early`, see [`SpillConfig::early_room`](crate::SpillConfig::early_room)): always when
    /// it sets none; otherwise when the behaviour makes room there or drops nothing, keeps the
    /// state as set and makes room early as set.
    pub fn allowed_by(
        &self,
        room: Option<RebuildRoom>,
        keep_state: Option<bool>,
        early: Option<EarlyRoom>,
    ) -> bool {
        room.is_none_or(|room| room == self.rebuild_room || !self.victims.may_drop())
            && keep_state.is_none_or(|keep| keep == self.keeps_state)
            && early.is_none_or(|early| early == self.early_room())
    }

    /// How this behaviour makes room early for the step's peak.
    pub fn early_room(&self) -> EarlyRoom {
        match (self.evicts_early, self.paces_early) {
            (false, _) => EarlyRoom::Off,
            (true, false) => EarlyRoom::AtOnce,
            (true, true) => EarlyRoom::Paced,
        }
    }

    /// This behaviour, making room early as `early` says.
    pub const fn with_early_room(self, early: EarlyRoom) -> Self {
        Behaviour {
            evicts_early: !matches!(early, EarlyRoom::Off),
            paces_early: matches!(early, EarlyRoom::Paced),
            ..self
        }
    }

    /// `victims`, with room for rebuilds made where `rebuild_room` says, the state moving as
    /// any tensor.
    pub const fn new(victims: RecomputeMode, rebuild_room: RebuildRoom) -> Self {
        Behaviour {
            victims,
            rebuild_room,
            keeps_state: false,
            evicts_early: false,
            paces_early: false,
        }
    }

    /// This behaviour, also making room early for the step's coming peak.
    pub const fn evicting_early(self) -> Self {
        Behaviour {
            evicts_early: true,
            ..self
        }
    }

    /// This behaviour, also making room early for the step's coming peak a share at a time.
    pub const fn pacing_early(self) -> Self {
        Behaviour {
            evicts_early: true,
            paces_early: true,
            ..self
        }
    }

    /// This behaviour, keeping the step's state on the device while other victims suffice.
    pub const fn keeping_state(self) -> Self {
        Behaviour {
            keeps_state: true,
            ..self
        }
    }
}

impl fmt::Display for Behaviour {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.victims {
            RecomputeMode::Both => "weighs each victim",
            RecomputeMode::Swap => "moves every victim",
            RecomputeMode::Recompute => "drops every victim it may",
        })?;
        if self.victims.may_drop() {
            f.write_str(match self.rebuild_room {
                RebuildRoom::AtSettle => "",
                RebuildRoom::BesidePrefetches => ", prefetches leaving room for rebuilds",
                RebuildRoom::InPrefetchWalk => ", rebuilds in the prefetch walk",
            })?;
        }
        if self.keeps_state {
            f.write_str(", keeping the state on the device")?;
        }
        if self.evicts_early {
            f.write_str(", making room early for the peak")?;
        }
        if self.paces_early {
            f.write_str(", a share at a time")?;
        }
        Ok(())
    }
}

/// The ways [`RecomputeMode::Both`] can run the steps of a plan, in the order a tie goes:
/// weighing each victim's move against its rebuild first, then moving every victim, then
/// dropping every victim the memory rule allows; each dropping one with room for rebuilds made
/// by the settle only, beside prefetches, or in the prefetch walk (moving every victim
/// rebuilds nothing, so where room for rebuilds is made changes nothing); then each of those
/// seven keeping the step's state on the device while other victims suffice; then each of
/// those fourteen making room early for the step's peak at once; then a share at a time.
pub const BEHAVIOURS: [Behaviour; 42] = {
    const SEVEN: [Behaviour; 7] = [
        Behaviour::new(RecomputeMode::Both, RebuildRoom::AtSettle),
        Behaviour::new(RecomputeMode::Both, RebuildRoom::BesidePrefetches),
        Behaviour::new(RecomputeMode::Both, RebuildRoom::InPrefetchWalk),
        Behaviour::new(RecomputeMode::Swap, RebuildRoom::AtSettle),
        Behaviour::new(RecomputeMode::Recompute, RebuildRoom::AtSettle),
        Behaviour::new(RecomputeMode::Recompute, RebuildRoom::BesidePrefetches),
        Behaviour::new(RecomputeMode::Recompute, RebuildRoom::InPrefetchWalk),
    ];
    let mut all = [SEVEN[0]; 42];
    let mut i = 0;
    while i < 7 {
        let behaviour = SEVEN[i];
        all[i] = behaviour;
        all[7 + i] = behaviour.keeping_state();
        all[14 + i] = behaviour.evicting_early();
        all[21 + i] = behaviour.keeping_state().evicting_early();
        all[28 + i] = behaviour.pacing_early();
        all[35 + i] = behaviour.keeping_state().pacing_early();
        i += 1;
    }
    all
};

/// Which of [`BEHAVIOURS`] `both` runs the steps of a plan with, from the step time a dry run
/// of the recorded step predicts for each (`predicted`, in seconds): the fastest, a tie going
/// to the earlier in [`BEHAVIOURS`]. `None` when nothing was predicted.
///
/// Why `both` does not run one rule: the weighing prices one victim at a time, its move
/// against its rebuild, and cannot see what a drop does to the rest of the step: a rebuild's
/// bytes come back at its op with no move to announce them, so room not made ahead is an
/// eviction the op waits for, and the tensors that are not moved change which ones the link
/// moves instead. Making that room ahead pays while the budget leaves room to spare and holds
/// prefetches back, at a far higher cost, in a tight one. Over a whole step no one behaviour
/// is fastest at every budget. Measured on the planner (`h200-pcie5`, cost_aware, window 512;
/// a GPT of 125M parameters and ResNet-50 at batch 2; overhead at 50, 33 and 25% of the peak;
/// since 2026-12-06, with wasted prefetches fetched nearer instead of benched):
///
/// | behaviour | GPT | ResNet-50 |
/// | --- | --- | --- |
/// | weighs each victim | +110.6, +187.1, +226.3% | +3.5, +15.1, +22.0% |
/// | the same, room beside prefetches | +102.7, +181.5, +255.7% | +3.5, +11.6, +69.7% |
/// | the same, rebuilds in the prefetch walk | +77.2, +207.4, +258.2% | +3.5, +11.0, +18.0% |
/// | moves every victim | +108.1, +195.7, +274.2% | +12.8, +21.8, +45.2% |
/// | drops every victim it may | +108.9, +190.0, +226.1% | +10.1, +16.8, +23.0% |
/// | the same, room beside prefetches | +106.8, +184.8, +255.4% | +10.1, +15.1, +67.6% |
/// | the same, rebuilds in the prefetch walk | +106.8, +211.5, +258.0% | +10.1, +13.1, +19.8% |
///
/// Keeping the state on the device is a choice of its own: it pays where the budget leaves
/// the activations room beside the state, which at 25-50% of these batch-2 steps it does not
/// (the GPT's Adam state is 63% of its peak). `both`'s best, moving the state / with the
/// behaviours that keep it (2026-12-06; `h200-pcie5`, cost_aware, window 512, at 80, 70, 60
/// and 50% of the peak; `docs/planner.md`):
///
/// | step | moving the state | keeping it too |
/// | --- | --- | --- |
/// | GPT, batch 2 | +37.4, +34.8, +70.8, +84.7% | +30.5, +34.8, +70.8, +84.7% |
/// | GPT, batch 8 | +32.0, +29.4, +42.2, +55.9% | +12.5, +20.7, +27.7, +42.7% |
/// | GPT, batch 16 | +21.0, +21.0, +36.4, +48.5% | +10.0, +16.5, +27.2, +35.0% |
/// | ResNet-50, batch 2 | +2.4, +4.6, +9.2, +3.5% | +0.7, +1.6, +3.4, +3.5% |
/// | ResNet-50, batch 16 | +17.5, +1.8, +7.7, +16.9% | +15.6, +1.8, +7.7, +16.9% |
///
/// A behaviour keeping the state is taken over the fastest that moves it only when predicted
/// at least [`KEEP_STATE_MARGIN`] faster: keeping the state moves more and smaller
/// activations, and the dry run does not count the engine's own work per move. On Flex
/// (`benches/policies.rs`, the `measured` profile) the tiny Transformer at 30% of its peak was
/// predicted 0.15% faster keeping the state and ran 1.73-1.74 of plain against 1.56 moving
/// it; the GPU-scale gains above are 1.7% of the step and more.
pub fn fastest_behaviour(predicted: &[(Behaviour, f64)]) -> Option<Behaviour> {
    let fastest_where = |keeps_state: bool| {
        let mut fastest: Option<(Behaviour, f64)> = None;
        for &behaviour in BEHAVIOURS.iter().filter(|b| b.keeps_state == keeps_state) {
            let Some(&(_, seconds)) = predicted.iter().find(|(b, _)| *b == behaviour) else {
                continue;
            };
            if fastest.is_none_or(|(_, best)| seconds < best) {
                fastest = Some((behaviour, seconds));
            }
        }
        fastest
    };
    match (fastest_where(false), fastest_where(true)) {
        (Some((_, moving)), Some((keeping, kept))) if kept < moving * (1.0 - KEEP_STATE_MARGIN) => {
            Some(keeping)
        }
        (Some((moving, _)), _) => Some(moving),
        (None, keeping) => keeping.map(|(behaviour, _)| behaviour),
    }
}

/// How much faster (a share of the step) a behaviour keeping the state must be predicted than
/// the fastest moving it, for [`fastest_behaviour`] to take it.
pub const KEEP_STATE_MARGIN: f64 = 0.01;

/// The behaviours a plan's dry run chooses among under `mode`, in the order a tie goes, given
/// what the config sets (see [`Behaviour::allowed_by`]). `both` chooses among all of
/// [`BEHAVIOURS`] it allows. `recompute` keeps its rule (every victim it may drop is dropped,
/// and the state moved or kept as the config says, by default moved) and chooses how it
/// schedules that: where room for rebuilds is made ahead (by the settle, also beside
/// prefetches, or also in the prefetch walk) and how room is made early for the peak (a share
/// at a time, at once, or not), each as the config leaves it free; its rule before it chose
/// first (by the settle, a share at a time), so that a tie keeps it. `swap` chooses nothing:
/// it makes room early as the config says, by default a share at a time.
///
/// Why `recompute` chooses that much: where and when room is made is a matter of scheduling,
/// not of which victims are dropped, and no one way is fastest on every step (`h200-pcie5`,
/// cost_aware, window 512, overhead at 50 / 33 / 25% of the peak; `docs/planner.md`):
///
/// | early room (room for rebuilds by the settle) | GPT b8 | ResNet-50 b16 |
/// | --- | --- | --- |
/// | off | +55.9 / +80.2 / +96.4% | +17.1 / +52.8 / +69.6% |
/// | at once | +26.5 / +60.1 / +84.9% | +10.3 / +56.9 / +78.7% |
/// | a share at a time | +31.0 / +63.2 / +90.5% | +2.3 / +41.1 / +60.7% |
///
/// and, each with the early room chosen, the batch-2 GPT at 50% of its peak is +75.8% with
/// room for rebuilds made by the settle and +68.6% with room also made beside prefetches,
/// ResNet-50 at batch 16 and 25% +60.7% and +57.0% (in the prefetch walk).
pub fn candidates(
    mode: RecomputeMode,
    room: Option<RebuildRoom>,
    keep_state: Option<bool>,
    early: Option<EarlyRoom>,
) -> Vec<Behaviour> {
    match mode {
        RecomputeMode::Both => BEHAVIOURS
            .iter()
            .copied()
            .filter(|behaviour| behaviour.allowed_by(room, keep_state, early))
            .collect(),
        RecomputeMode::Recompute => {
            let rooms = [
                RebuildRoom::AtSettle,
                RebuildRoom::BesidePrefetches,
                RebuildRoom::InPrefetchWalk,
            ];
            let ways = [EarlyRoom::Paced, EarlyRoom::AtOnce, EarlyRoom::Off];
            rooms
                .into_iter()
                .filter(|r| room.is_none_or(|room| room == *r))
                .flat_map(|r| {
                    let rule = Behaviour {
                        keeps_state: keep_state.unwrap_or(false),
                        ..Behaviour::new(RecomputeMode::Recompute, r)
                    };
                    ways.into_iter()
                        .filter(|way| early.is_none_or(|early| early == *way))
                        .map(move |way| rule.with_early_room(way))
                })
                .collect()
        }
        RecomputeMode::Swap => Vec::new(),
    }
}

/// Which of `mode`'s [`candidates`] a plan's steps run with, from the step time a dry run
/// predicts for each (`predicted`, in seconds, in the candidates' order): under `both` as
/// [`fastest_behaviour`] decides; under `recompute` the fastest, a tie going to the earlier.
/// `None` when nothing was predicted.
pub fn chosen_from(mode: RecomputeMode, predicted: &[(Behaviour, f64)]) -> Option<Behaviour> {
    if mode == RecomputeMode::Both {
        return fastest_behaviour(predicted);
    }
    let mut fastest: Option<(Behaviour, f64)> = None;
    for &(behaviour, seconds) in predicted {
        if fastest.is_none_or(|(_, best)| seconds < best) {
            fastest = Some((behaviour, seconds));
        }
    }
    fastest.map(|(behaviour, _)| behaviour)
}

/// Whether to drop `victim` (to be rebuilt by `rebuild`) rather than move it. The caller has
/// checked the memory rule (see the module docs).
pub fn prefer_recompute(mode: RecomputeMode, victim: &Victim, rebuild: &Rebuild) -> bool {
    if rebuild.depth >= MAX_REBUILD_DEPTH {
        return false;
    }
    match mode {
        RecomputeMode::Swap => false,
        RecomputeMode::Recompute => true,
        RecomputeMode::Both => {
            exposed_rebuild_seconds(victim, rebuild) < exposed_move_seconds(victim)
        }
    }
}

/// The time a move of `victim` out and back costs the ops: the share of each copy's link time
/// that does not overlap their compute.
pub fn exposed_move_seconds(victim: &Victim) -> f64 {
    victim.evict.seconds(victim.bytes) * victim.evict_exposure
        + victim.restore.seconds(victim.bytes) * victim.restore_exposure
}

/// The time a rebuild costs the ops: it runs on the ops' stream, before the op that needs it,
/// after its inputs that are off the device now are brought back on demand.
pub fn exposed_rebuild_seconds(victim: &Victim, rebuild: &Rebuild) -> f64 {
    // A deeper chain may have to rebuild its dropped inputs too: each counts as one more op of
    // about this one's cost (DTR's neighbourhood, bounded by the depth).
    let ops = rebuild.op_time.as_secs_f64() * f64::from(rebuild.depth + 1);
    let inputs = if rebuild.inputs_off_device > 0 {
        victim.restore.seconds(rebuild.inputs_off_device)
    } else {
        0.0
    };
    ops + inputs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::AliveInput;

    fn victim(bytes: u64, hidden: bool) -> Victim {
        let link = Bandwidth {
            bytes_per_sec: 1e9,
            latency: Duration::from_micros(10),
        };
        Victim {
            bytes,
            evict: link,
            restore: link,
            evict_exposure: 1.0,
            restore_exposure: if hidden { 0.0 } else { 1.0 },
        }
    }

    fn rebuild(micros: u64, depth: u32) -> Rebuild {
        Rebuild {
            op_time: Duration::from_micros(micros),
            depth,
            inputs_off_device: 0,
        }
    }

    /// An input of `bytes`, alive (dropped `dropped` deep, or off the device) or not, with
    /// `ghost` as its recipe's inputs if it keeps one.
    fn input(
        id: TensorId,
        bytes: u64,
        alive: Option<AliveInput>,
        ghost: Option<Vec<RebuildInput>>,
    ) -> RebuildInput {
        RebuildInput {
            id,
            bytes,
            alive,
            ghost: ghost.map(|inputs| {
                Box::new(crate::engine::GhostPlan {
                    inputs: inputs.into_iter().collect(),
                    op_time: Duration::from_micros(id),
                    cost: cost::elementwise(0, 0, 0, crate::plan::cost::MatrixDtype::F32),
                })
            }),
        }
    }

    const RESIDENT: Option<AliveInput> = Some(AliveInput {
        dropped_depth: None,
        off_device: false,
    });

    #[test]
    fn a_chain_holds_inputs_read_at_the_rebuild_and_recomputes_the_others_as_ghosts() {
        let op_time = |measured: Duration, _: &OpCost| measured;
        let outlives_all_but = |dead: &'static [TensorId]| move |id| !dead.contains(&id);
        // x (1) is read at the rebuild; a = f(x) (2) is not, but keeps its recipe: a ghost.
        let a = || input(2, 200, RESIDENT, Some(vec![input(1, 100, RESIDENT, None)]));
        let chain = chain(&[a()], &mut outlives_all_but(&[2]), &op_time).unwrap();
        assert_eq!(chain.leaves.as_slice(), &[1]);
        assert_eq!(
            (chain.leaf_bytes, chain.ghost_bytes, chain.ghost_ops),
            (100, 200, 1)
        );
        assert_eq!(chain.ghost_time, Duration::from_micros(2));
        // Read at the rebuild, a is held itself and nothing is recomputed.
        let held = super::chain(&[a()], &mut outlives_all_but(&[]), &op_time).unwrap();
        assert_eq!(held.leaves.as_slice(), &[2]);
        assert_eq!((held.ghost_bytes, held.ghost_ops), (0, 0));
        // Gone from the program (or consumed in place), a is still recomputed from x.
        let gone = || input(2, 200, None, Some(vec![input(1, 100, RESIDENT, None)]));
        assert_eq!(
            super::chain(&[gone()], &mut outlives_all_but(&[]), &op_time)
                .unwrap()
                .leaves
                .as_slice(),
            &[1]
        );
        // Without a recipe kept, an input not read at the rebuild makes the tensor one that
        // may not be dropped; so does a ghost whose own input is not read there.
        let bare = input(2, 200, RESIDENT, None);
        assert_eq!(
            super::chain(&[bare], &mut outlives_all_but(&[2]), &op_time),
            None
        );
        assert_eq!(
            super::chain(&[a()], &mut outlives_all_but(&[1, 2]), &op_time),
            None
        );
    }

    #[test]
    fn a_chain_counts_each_leaf_once_and_reads_depth_and_bytes_off_the_device_from_leaves() {
        let op_time = |measured: Duration, _: &OpCost| measured;
        let dropped = Some(AliveInput {
            dropped_depth: Some(2),
            off_device: false,
        });
        let off = Some(AliveInput {
            dropped_depth: None,
            off_device: true,
        });
        // t = g(a, y), a = f(x, y) a ghost: x and y are held once, y read by both.
        let inputs = [
            input(
                3,
                300,
                None,
                Some(vec![input(1, 100, dropped, None), input(2, 50, off, None)]),
            ),
            input(2, 50, off, None),
        ];
        let chain = chain(&inputs, &mut |_| true, &op_time).unwrap();
        assert_eq!(chain.leaves.as_slice(), &[1, 2]);
        assert_eq!(chain.leaf_bytes, 150);
        assert_eq!(chain.ghost_bytes, 300);
        assert_eq!(chain.depth, 3, "one more than the dropped leaf's chain");
        assert_eq!(chain.inputs_off_device, 50);
    }

    #[test]
    fn modes_parse_and_unknown_names_list_the_accepted_ones() {
        assert_eq!(
            "swap".parse::<RecomputeMode>().unwrap(),
            RecomputeMode::Swap
        );
        assert_eq!(
            " Recompute ".parse::<RecomputeMode>().unwrap(),
            RecomputeMode::Recompute
        );
        assert_eq!(
            "both".parse::<RecomputeMode>().unwrap(),
            RecomputeMode::Both
        );
        let error = "sometimes"
            .parse::<RecomputeMode>()
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("sometimes") && error.contains(RecomputeMode::ACCEPTED),
            "{error}"
        );
        for mode in [
            RecomputeMode::Swap,
            RecomputeMode::Recompute,
            RecomputeMode::Both,
        ] {
            assert_eq!(mode.to_string().parse::<RecomputeMode>().unwrap(), mode);
        }
    }

    #[test]
    fn swap_never_drops_and_recompute_always_does_within_the_depth() {
        let big = victim(1 << 30, false);
        assert!(!prefer_recompute(RecomputeMode::Swap, &big, &rebuild(1, 0)));
        let tiny = victim(4, true);
        assert!(prefer_recompute(
            RecomputeMode::Recompute,
            &tiny,
            &rebuild(1_000_000, 0)
        ));
        assert!(!prefer_recompute(
            RecomputeMode::Recompute,
            &tiny,
            &rebuild(1, MAX_REBUILD_DEPTH)
        ));
    }

    #[test]
    fn both_takes_the_cheaper_and_counts_a_hidden_restore_as_free() {
        // 1 MB at 1 GB/s: 1 ms each way, plus 10 us per transfer.
        let mb = victim(1_000_000, false);
        assert!(prefer_recompute(
            RecomputeMode::Both,
            &mb,
            &rebuild(1_500, 0)
        ));
        assert!(!prefer_recompute(
            RecomputeMode::Both,
            &mb,
            &rebuild(2_500, 0)
        ));
        // Only the eviction counts when a prefetch hides the restore.
        let hidden = victim(1_000_000, true);
        assert!(!prefer_recompute(
            RecomputeMode::Both,
            &hidden,
            &rebuild(1_500, 0)
        ));
        // A chain one deep counts the op twice.
        assert!(!prefer_recompute(
            RecomputeMode::Both,
            &mb,
            &rebuild(1_500, 1)
        ));
    }

    #[test]
    fn victims_are_ranked_by_rebuilds_when_they_may_be_dropped_under_cost_aware_on_a_busy_link() {
        let cost_aware = PolicyKind::CostAware;
        for mode in [RecomputeMode::Both, RecomputeMode::Recompute] {
            assert!(ranks_by_rebuild(mode, cost_aware, 1.0), "{mode:?}");
            assert!(
                ranks_by_rebuild(mode, cost_aware, RANK_REBUILDS_FROM_UTILIZATION),
                "{mode:?}"
            );
            // On a mostly idle link moves hide behind the ops: the policy's order stands.
            assert!(!ranks_by_rebuild(mode, cost_aware, 0.5), "{mode:?}");
            // The other policies never read a rebuild's cost: nothing is priced for them.
            assert!(
                !ranks_by_rebuild(mode, PolicyKind::NextUse, 1.0),
                "{mode:?}"
            );
            assert!(!ranks_by_rebuild(mode, PolicyKind::Lru, 1.0), "{mode:?}");
        }
        // Nothing is dropped, so a rebuild's cost is nothing to rank by.
        assert!(!ranks_by_rebuild(RecomputeMode::Swap, cost_aware, 1.0));
    }

    #[test]
    fn both_runs_the_behaviour_predicted_fastest_and_weighs_on_a_tie() {
        use RebuildRoom::{AtSettle, BesidePrefetches, InPrefetchWalk};
        use RecomputeMode::{Both, Recompute, Swap};
        let weigh = Behaviour::new(Both, AtSettle);
        let weigh_beside = Behaviour::new(Both, BesidePrefetches);
        let swap = Behaviour::new(Swap, AtSettle);
        let drop = Behaviour::new(Recompute, AtSettle);
        let drop_in_walk = Behaviour::new(Recompute, InPrefetchWalk);
        assert_eq!(
            fastest_behaviour(&[(weigh, 2.0), (swap, 1.5), (drop, 1.8), (weigh_beside, 1.7)]),
            Some(swap)
        );
        assert_eq!(
            fastest_behaviour(&[(drop_in_walk, 1.0), (swap, 1.5), (weigh, 2.0)]),
            Some(drop_in_walk),
            "the order of the predictions does not matter"
        );
        assert_eq!(
            fastest_behaviour(&[(swap, 1.0), (weigh_beside, 1.0), (weigh, 1.0), (drop, 1.0)]),
            Some(weigh),
            "a tie keeps weighing, with room for rebuilds made by the settle"
        );
        assert_eq!(fastest_behaviour(&[(swap, 1.0), (drop, 1.0)]), Some(swap));
        assert_eq!(
            fastest_behaviour(&[(Behaviour::new(Swap, InPrefetchWalk), 0.5), (swap, 1.0)]),
            Some(swap),
            "only the behaviours `both` runs are chosen"
        );
        assert_eq!(fastest_behaviour(&[]), None);
        assert_eq!(
            weigh_beside.to_string(),
            "weighs each victim, prefetches leaving room for rebuilds"
        );
        assert_eq!(
            drop_in_walk.to_string(),
            "drops every victim it may, rebuilds in the prefetch walk"
        );
        assert_eq!(swap.to_string(), "moves every victim");
        assert_eq!(
            swap.keeping_state().to_string(),
            "moves every victim, keeping the state on the device"
        );
        assert_eq!(
            fastest_behaviour(&[(swap, 1.0), (swap.keeping_state(), 1.0)]),
            Some(swap),
            "a tie moves the state as any tensor"
        );
        assert_eq!(
            fastest_behaviour(&[(swap, 1.0), (drop.keeping_state(), 0.5)]),
            Some(drop.keeping_state())
        );
        assert_eq!(
            fastest_behaviour(&[(swap, 1.0), (drop, 0.995), (swap.keeping_state(), 0.991)]),
            Some(drop),
            "keeping the state must be predicted a margin faster than the fastest moving it"
        );
        assert_eq!(
            fastest_behaviour(&[(swap, 1.0), (drop, 0.995), (swap.keeping_state(), 0.98)]),
            Some(swap.keeping_state())
        );
        assert_eq!(
            fastest_behaviour(&[(swap.keeping_state(), 1.0), (drop.keeping_state(), 0.9)]),
            Some(drop.keeping_state()),
            "with only the behaviours keeping it (the config asks), the fastest of them"
        );
        for (i, a) in BEHAVIOURS.iter().enumerate() {
            assert!(!BEHAVIOURS[i + 1..].contains(a), "{a} twice");
            assert!(a.victims.may_drop() || a.rebuild_room == AtSettle, "{a:?}");
            assert!(a.evicts_early || !a.paces_early, "{a:?}");
        }
    }

    #[test]
    fn a_configured_rebuild_room_limits_what_both_may_choose() {
        use RebuildRoom::{AtSettle, BesidePrefetches, InPrefetchWalk};
        for room in [AtSettle, BesidePrefetches, InPrefetchWalk] {
            assert_eq!(room.to_string().parse::<RebuildRoom>().unwrap(), room);
            let allowed: Vec<_> = BEHAVIOURS
                .iter()
                .filter(|b| b.allowed_by(Some(room), None, None))
                .collect();
            assert_eq!(
                allowed.len(),
                18,
                "{room}: weighing, moving, dropping, each keeping the state or not, each making \
                 room early at once, a share at a time or not"
            );
            assert_eq!(allowed.iter().filter(|b| b.keeps_state).count(), 9);
            assert_eq!(allowed.iter().filter(|b| b.evicts_early).count(), 12);
            assert_eq!(allowed.iter().filter(|b| b.paces_early).count(), 6);
            assert!(
                allowed
                    .iter()
                    .all(|b| b.rebuild_room == room || !b.victims.may_drop())
            );
        }
        assert!(BEHAVIOURS.iter().all(|b| b.allowed_by(None, None, None)));
        for keep in [false, true] {
            let allowed: Vec<_> = BEHAVIOURS
                .iter()
                .filter(|b| b.allowed_by(None, Some(keep), None))
                .collect();
            assert_eq!(allowed.len(), 21, "keep_state {keep}");
            assert!(allowed.iter().all(|b| b.keeps_state == keep));
        }
        let err = "anywhere".parse::<RebuildRoom>().unwrap_err().to_string();
        assert!(
            err.contains("anywhere") && err.contains(RebuildRoom::ACCEPTED),
            "{err}"
        );
    }

    #[test]
    fn recompute_chooses_where_and_when_room_is_made_and_swap_nothing() {
        use EarlyRoom::{AtOnce, Off, Paced};
        use RebuildRoom::{AtSettle, BesidePrefetches, InPrefetchWalk};
        for early in [Off, AtOnce, Paced] {
            assert_eq!(early.to_string().parse::<EarlyRoom>().unwrap(), early);
            let behaviour = Behaviour::new(RecomputeMode::Both, AtSettle).with_early_room(early);
            assert_eq!(behaviour.early_room(), early);
            let set = candidates(RecomputeMode::Both, None, None, Some(early));
            assert_eq!(set.len(), 14, "{early}");
            assert!(set.iter().all(|b| b.early_room() == early), "{early}");
        }
        assert_eq!(" At-Once ".parse::<EarlyRoom>().unwrap(), AtOnce);
        let err = "soon".parse::<EarlyRoom>().unwrap_err().to_string();
        assert!(
            err.contains("soon") && err.contains(EarlyRoom::ACCEPTED),
            "{err}"
        );

        assert!(candidates(RecomputeMode::Swap, None, None, None).is_empty());
        assert_eq!(
            candidates(RecomputeMode::Both, None, None, None),
            BEHAVIOURS
        );
        let rule = Behaviour::new(RecomputeMode::Recompute, AtSettle);
        let chosen_among = candidates(RecomputeMode::Recompute, None, None, None);
        assert_eq!(chosen_among.len(), 9, "{chosen_among:?}");
        assert_eq!(
            chosen_among[..3],
            [rule.pacing_early(), rule.evicting_early(), rule],
            "the rule before the choice first, so that a tie keeps it"
        );
        for room in [AtSettle, BesidePrefetches, InPrefetchWalk] {
            for early in [Off, AtOnce, Paced] {
                let way = Behaviour::new(RecomputeMode::Recompute, room).with_early_room(early);
                assert!(chosen_among.contains(&way), "{way}");
            }
        }
        assert!(
            chosen_among
                .iter()
                .all(|b| b.victims == RecomputeMode::Recompute && !b.keeps_state),
            "recompute drops every victim it may and moves the state unless told: {chosen_among:?}"
        );
        let configured = candidates(
            RecomputeMode::Recompute,
            Some(InPrefetchWalk),
            Some(true),
            None,
        );
        assert_eq!(configured.len(), 3);
        assert!(
            configured
                .iter()
                .all(|b| b.rebuild_room == InPrefetchWalk && b.keeps_state),
            "{configured:?}"
        );
        assert_eq!(
            candidates(RecomputeMode::Recompute, None, None, Some(Off)),
            [
                rule,
                Behaviour::new(RecomputeMode::Recompute, BesidePrefetches),
                Behaviour::new(RecomputeMode::Recompute, InPrefetchWalk)
            ]
        );
        assert_eq!(
            candidates(RecomputeMode::Recompute, Some(AtSettle), None, Some(Off)),
            [rule]
        );

        let (paced, at_once, off) = (rule.pacing_early(), rule.evicting_early(), rule);
        let mode = RecomputeMode::Recompute;
        assert_eq!(
            chosen_from(mode, &[(paced, 1.0), (at_once, 0.9), (off, 0.95)]),
            Some(at_once)
        );
        assert_eq!(
            chosen_from(mode, &[(paced, 1.0), (at_once, 1.0), (off, 1.0)]),
            Some(paced),
            "a tie goes to the earlier"
        );
        assert_eq!(chosen_from(mode, &[]), None);
    }

    #[test]
    fn a_step_s_compute_is_timed_as_rebuilds_are() {
        use crate::plan::DeviceProfile;
        // Two 1 MB adds, recorded at 1 us each.
        let t = crate::plan::tests::tape(
            &[("float_add", &[1, 2], &[3]), ("float_add", &[3, 2], &[4])],
            &[(1, 1 << 20), (2, 1 << 20), (3, 1 << 20), (4, 1 << 20)],
            &[],
        );
        assert!((RebuildTimes::Measured.compute_seconds(&t) - 2e-6).abs() < 1e-12);
        let model = KernelModel::of(&DeviceProfile::builtin("h200-pcie5").unwrap());
        let by_id: HashMap<_, _> = t.tensors.iter().map(|r| (r.id, r)).collect();
        let one = model.seconds(&cost::op_cost(&t.ops[0], |id| by_id.get(&id).copied()));
        assert!(one > 0.0);
        let modelled = RebuildTimes::Modelled(model).compute_seconds(&t);
        assert!(
            (modelled - 2.0 * one).abs() < 1e-12,
            "{modelled} vs 2 x {one}"
        );
    }

    #[test]
    fn a_backend_that_fuses_ops_rebuilds_no_add_or_subtract() {
        for name in RECOMPUTABLE_OPS {
            assert!(rebuilds_exactly(name, false), "{name} alone");
            assert_eq!(
                rebuilds_exactly(name, true),
                !NOT_REBUILT_WHEN_FUSED.contains(&name),
                "{name} fused"
            );
        }
        assert!(!rebuilds_exactly("float_add_scalar", true));
        assert!(rebuilds_exactly("float_sqrt", true));
        for name in NOT_REBUILT_WHEN_FUSED {
            assert!(is_recomputable(name), "{name} is a recomputable op");
        }
    }

    #[test]
    fn a_copy_behind_the_ops_costs_them_the_link_s_busy_share_and_one_on_their_thread_all() {
        let worker = OnOpThread {
            evict: false,
            restore: false,
        };
        // Next used 10 ops on, beyond a window of 4: a prefetch brings it back.
        assert_eq!(move_exposures(0.25, worker, 10, 4), (0.25, 0.25));
        let here = OnOpThread {
            evict: true,
            restore: true,
        };
        assert_eq!(move_exposures(0.25, here, 10, 4), (1.0, 1.0));
        // Within the window, or with no prefetching, the op waits for its restore.
        assert_eq!(move_exposures(0.25, worker, 3, 4), (0.25, 1.0));
        assert_eq!(move_exposures(0.25, worker, 10, 0), (0.25, 1.0));
    }

    #[test]
    fn both_moves_on_an_idle_link_drops_on_a_busy_one_and_counts_inputs_to_bring_back() {
        let at = |exposure: f64| Victim {
            evict_exposure: exposure,
            restore_exposure: exposure,
            ..victim(1_000_000, false)
        };
        // 1 MB at 1 GB/s plus 10 us: 1.01 ms each way, against a 100 us rebuild.
        let decide = |victim: &Victim, rebuild: &Rebuild| {
            prefer_recompute(RecomputeMode::Both, victim, rebuild)
        };
        assert!(
            !decide(&at(0.01), &rebuild(100, 0)),
            "20 us of exposed link time"
        );
        assert!(
            decide(&at(0.5), &rebuild(100, 0)),
            "1.01 ms of exposed link time"
        );
        let input_away = Rebuild {
            inputs_off_device: 1_000_000,
            ..rebuild(100, 0)
        };
        assert!(
            (exposed_rebuild_seconds(&at(0.5), &input_away) - 1.11e-3).abs() < 1e-9,
            "the rebuild waits for its input's 1.01 ms restore"
        );
        assert!(!decide(&at(0.5), &input_away));
        assert!(decide(&at(1.0), &input_away), "2.02 ms on a saturated link");
    }

    /// On an asynchronous backend the measured time is a dispatch time: a slow host's 3 ms
    /// for a 1 MB add says nothing of its kernel, which on an H200 reads and writes 3 MB in
    /// under 4 us (plus its launch), far below the 2 ms round trip over a 1 GB/s link.
    #[test]
    fn modelled_times_come_from_the_op_and_decide_instead_of_dispatch_times() {
        use crate::plan::DeviceProfile;
        use crate::plan::cost::{MatrixDtype, TensorView, cost_of};
        let shape = [250_000usize];
        let view = |id| TensorView {
            id,
            bytes: 1_000_000,
            dtype: MatrixDtype::F32,
            shape: &shape,
        };
        let cost = cost_of("float_add", &[view(1), view(2)], &[view(3)]);
        assert_eq!(cost.bytes, 3_000_000);
        let h200 = DeviceProfile::builtin("h200-pcie5").unwrap();
        let model = KernelModel::of(&h200);
        let dispatch = Duration::from_millis(3);
        assert_eq!(RebuildTimes::Measured.op_time(dispatch, &cost), dispatch);
        let modelled = RebuildTimes::Modelled(model).op_time(dispatch, &cost);
        let expected =
            h200.launch_us * 1e-6 + 3e6 / (h200.hbm_gb_per_s * 1e9 * h200.memory_efficiency);
        assert!(
            (modelled.as_secs_f64() - expected).abs() < 1e-9,
            "{modelled:?}"
        );
        let mb = victim(1_000_000, false);
        let decide = |op_time| {
            prefer_recompute(
                RecomputeMode::Both,
                &mb,
                &Rebuild {
                    op_time,
                    ..rebuild(0, 0)
                },
            )
        };
        assert!(
            !decide(dispatch),
            "the dispatch time makes a move look cheaper"
        );
        assert!(
            decide(modelled),
            "the kernel is cheaper than the round trip"
        );
        // The default for unknown cards has the slowest memory of the built-ins.
        let slow = KernelModel::of(&DeviceProfile::builtin(ASYNC_DEFAULT_PROFILE).unwrap());
        assert!(RebuildTimes::Modelled(slow).op_time(dispatch, &cost) > modelled);
    }
}
