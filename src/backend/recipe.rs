//! Recipes: how a tensor made by a pure op is rebuilt, bit for bit, after it was dropped from
//! the device: the op's kernel run again by `B` on the same inputs.
//!
//! A recipe is kept only for the rows marked `#[recompute]` in the forwarding tables (pure
//! elementwise ops: no randomness, no state outside the inputs), and only while the device
//! may drop victims. It refers to its inputs weakly, so it keeps no tensor alive; beside each
//! input that has a recipe of its own it keeps that recipe (its lineage, a few ops deep at
//! most: [`MAX_GHOST_CHAIN`]), so that once the program has let the input go, or consumed it in
//! place, a rebuild can still recompute it (a ghost) from inputs that are alive. When the
//! engine drops the tensor the recipe holds the inputs the rebuild relies on (its own, and its
//! ghosts') until the rebuild; ghosts are recomputed for the rebuild alone and let go.
//! On a backend that runs several ops in one kernel no lineage is kept: there a chain of ops
//! recomputed one by one could round differently from the kernel that first ran them (see
//! [`rebuilds_exactly`](crate::policy::recompute::rebuilds_exactly)).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use burn_backend::{Backend, TensorMetadata};
use smallvec::SmallVec;

use super::tensor::{Handle, Primitive, SpillTensor};
use crate::engine::{AliveInput, GhostPlan, RebuildInput, RebuildPlan, Residency, TensorId, Tier};
use crate::plan::cost::{self, MatrixDtype, OpCost};
use crate::policy::recompute::{MAX_GHOST_CHAIN, Rebuild};

/// Runs the op again on its inputs' primitives (in argument order).
pub(crate) type Rerun<B> = dyn Fn(&mut RecipeArgs<B>) -> Primitive<B> + Send + Sync;

/// The op that made a tensor, to run again. Made as `Recipe<B, F>` for the op's closure `F`
/// and kept as `Arc<Recipe<B>>`: the closure lives in the recipe's own allocation, and the
/// recipes of the tensors it made inputs for share it as their lineage.
pub(crate) struct Recipe<B: Backend, R: ?Sized = Rerun<B>> {
    op: &'static str,
    /// The tensor arguments, in order (an input read twice is here twice).
    inputs: SmallVec<[RecipeInput<B>; 3]>,
    /// While the tensor is dropped: the inputs its rebuild relies on (its own and its ghosts').
    held: Mutex<SmallVec<[Arc<Handle<B>>; 3]>>,
    /// The op's time when it last ran, in nanoseconds.
    op_nanos: AtomicU64,
    /// When dropped: how many dropped tensors its inputs depended on then.
    depth: AtomicU32,
    /// When dropped: bytes of the ghosts its rebuild recomputes and lets go.
    transient: AtomicU64,
    /// The output's bytes, elements and dtype, to price the op once its tensor is gone.
    output_bytes: u64,
    output_elements: u64,
    output_dtype: MatrixDtype,
    /// How many ghosts deep its lineage reaches (0: it keeps none).
    ghost_reach: u32,
    /// Last, as an unsized field must be.
    rerun: R,
}

/// One tensor argument of a recipe.
pub(crate) struct RecipeInput<B: Backend> {
    id: TensorId,
    bytes: u64,
    handle: Weak<Handle<B>>,
    /// The argument's own recipe, to recompute it once the program has let it go.
    lineage: Option<Arc<Recipe<B>>>,
}

/// The input primitives a [`Rerun`] takes, in argument order.
pub(crate) struct RecipeArgs<B: Backend> {
    op: &'static str,
    primitives: std::vec::IntoIter<Primitive<B>>,
}

impl<B: Backend> RecipeArgs<B> {
    fn next(&mut self) -> Primitive<B> {
        self.primitives.next().unwrap_or_else(|| {
            panic!(
                "burn-spill: the recipe of `{}` ran out of inputs; this is a bug in burn-spill",
                self.op
            )
        })
    }

    fn wrong_kind(&self) -> ! {
        panic!(
            "burn-spill: the recipe of `{}` got an input of another kind; this is a bug in burn-spill",
            self.op
        )
    }

    pub(crate) fn float(&mut self) -> B::FloatTensorPrimitive {
        match self.next() {
            Primitive::Float(p) => p,
            _ => self.wrong_kind(),
        }
    }

    pub(crate) fn bool(&mut self) -> B::BoolTensorPrimitive {
        match self.next() {
            Primitive::Bool(p) => p,
            _ => self.wrong_kind(),
        }
    }
}

impl<B: Backend> Recipe<B> {
    /// The recipe of an op that ran on `inputs` in `took` and made `output`, which `rerun`
    /// runs again.
    pub(crate) fn shared<F>(
        op: &'static str,
        inputs: SmallVec<[RecipeInput<B>; 3]>,
        output: &SpillTensor<B>,
        rerun: F,
        took: Duration,
    ) -> Arc<Self>
    where
        F: Fn(&mut RecipeArgs<B>) -> Primitive<B> + Send + Sync + 'static,
    {
        let ghost_reach = inputs
            .iter()
            .filter_map(|i| i.lineage.as_ref().map(|l| l.ghost_reach + 1))
            .max()
            .unwrap_or(0);
        let dtype = output.dtype();
        // From the bytes: the shape would be cloned to count its elements.
        let output_elements = output.bytes() / (dtype.size() as u64).max(1);
        Arc::new(Recipe {
            op,
            inputs,
            held: Mutex::new(SmallVec::new()),
            op_nanos: AtomicU64::new(took.as_nanos().min(u64::MAX as u128) as u64),
            depth: AtomicU32::new(0),
            transient: AtomicU64::new(0),
            output_bytes: output.bytes(),
            output_elements,
            output_dtype: matrix_dtype(dtype),
            ghost_reach,
            rerun,
        })
    }

    fn held(&self) -> std::sync::MutexGuard<'_, SmallVec<[Arc<Handle<B>>; 3]>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Lets go of the inputs held for a rebuild (the tensor is gone).
    pub(super) fn release_held(&self) {
        drop(self.take_held());
    }

    /// The inputs held for a rebuild, no longer held (the caller drops them outside any lock:
    /// their handles' drops may take locks).
    fn take_held(&self) -> SmallVec<[Arc<Handle<B>>; 3]> {
        self.transient.store(0, Ordering::Relaxed);
        std::mem::take(&mut *self.held())
    }

    /// The op's FLOPs and bytes (every op that keeps a recipe is elementwise).
    fn cost(&self) -> OpCost {
        let input_bytes = self
            .inputs
            .iter()
            .enumerate()
            .filter(|(k, i)| !self.inputs[..*k].iter().any(|seen| seen.id == i.id))
            .map(|(_, i)| i.bytes)
            .sum();
        cost::elementwise(
            input_bytes,
            self.output_bytes,
            self.output_elements,
            self.output_dtype,
        )
    }

    /// The inputs as the drop decision sees them, each once (see [`RebuildInput`]).
    fn plan_inputs(&self) -> SmallVec<[RebuildInput; 3]> {
        let mut planned: SmallVec<[RebuildInput; 3]> = SmallVec::new();
        for input in &self.inputs {
            if planned.iter().any(|p| p.id == input.id) {
                continue;
            }
            let ghost = input.lineage.as_ref().map(|lineage| {
                Box::new(GhostPlan {
                    inputs: lineage.plan_inputs(),
                    op_time: Duration::from_nanos(lineage.op_nanos.load(Ordering::Relaxed)),
                    cost: lineage.cost(),
                })
            });
            planned.push(RebuildInput {
                id: input.id,
                bytes: input.bytes,
                alive: input.handle.upgrade().and_then(|h| alive(&h)),
                ghost,
            });
        }
        planned
    }

    /// Adds to `held` the inputs named in `leaves` that a rebuild of this recipe relies on,
    /// upgraded, following the lineage of the others. False when one is gone or has neither.
    /// Each state is read under its lock after the upgrade, and an op decides to consume a
    /// handle in place under that lock too, by its reference count: so either the op saw this
    /// reference, or this sees the input taken.
    fn hold_leaves(&self, leaves: &[TensorId], held: &mut SmallVec<[Arc<Handle<B>>; 3]>) -> bool {
        for input in &self.inputs {
            if leaves.contains(&input.id) {
                if held.iter().any(|h| h.id() == input.id) {
                    continue;
                }
                let Some(handle) = input.handle.upgrade() else {
                    return false;
                };
                if matches!(*handle.slot().lock(), Residency::Taken) {
                    return false;
                }
                held.push(handle);
            } else if !input
                .lineage
                .as_ref()
                .is_some_and(|lineage| lineage.hold_leaves(leaves, held))
            {
                return false;
            }
        }
        true
    }

    /// Runs this op again on `leaves` (the held inputs' primitives), recomputing the inputs
    /// that are not among them from their lineage first. `owner` and `ghosts` are for the
    /// panic and the count.
    ///
    /// # Panics
    /// When an input is neither held nor recomputable: a bug, named with the tensor, its op and
    /// the input.
    fn run(
        &self,
        leaves: &[(TensorId, Primitive<B>)],
        owner: TensorId,
        ghosts: &mut u64,
    ) -> Primitive<B> {
        let mut primitives = Vec::with_capacity(self.inputs.len());
        for input in &self.inputs {
            if let Some((_, primitive)) = leaves.iter().find(|(id, _)| *id == input.id) {
                primitives.push(primitive.clone());
            } else if let Some(lineage) = &input.lineage {
                let ghost = lineage.run(leaves, owner, ghosts);
                *ghosts += 1;
                primitives.push(ghost);
            } else {
                panic!(
                    "burn-spill: tensor {owner} was dropped to be rebuilt, but input {} of `{}` \
                     in its recipe is gone (neither held nor recomputable); this is a bug in burn-spill",
                    input.id, self.op
                );
            }
        }
        (self.rerun)(&mut RecipeArgs {
            op: self.op,
            primitives: primitives.into_iter(),
        })
    }
}

/// Where the bytes of an input a program still holds are, or `None` when an op consumed it in
/// place (its values are gone with its buffer).
fn alive<B: Backend>(input: &Handle<B>) -> Option<AliveInput> {
    let dropped = {
        let state = input.slot().lock();
        match &*state {
            Residency::Taken => return None,
            Residency::Dropped => true,
            Residency::Host { .. }
            | Residency::Disk(_)
            | Residency::InFlight { from: Tier::Device } => {
                return Some(AliveInput {
                    dropped_depth: None,
                    off_device: true,
                });
            }
            _ => false,
        }
    };
    Some(AliveInput {
        dropped_depth: dropped
            .then(|| input.recipe().map(|r| r.depth.load(Ordering::Relaxed)))
            .flatten(),
        off_device: false,
    })
}

fn matrix_dtype(dtype: burn_backend::DType) -> MatrixDtype {
    match dtype {
        burn_backend::DType::F16 => MatrixDtype::F16,
        burn_backend::DType::BF16 => MatrixDtype::Bf16,
        _ => MatrixDtype::F32,
    }
}

impl<B: Backend> Handle<B> {
    /// The drop decision's view of this tensor's recipe (see [`RebuildPlan`]).
    pub(super) fn rebuild_plan(&self) -> Option<RebuildPlan> {
        let recipe = self.recipe()?;
        Some(RebuildPlan {
            inputs: recipe.plan_inputs(),
            rebuild: Rebuild {
                op_time: Duration::from_nanos(recipe.op_nanos.load(Ordering::Relaxed)),
                depth: 0,
                inputs_off_device: 0,
            },
            cost: recipe.cost(),
        })
    }

    /// Frees the device bytes and holds the inputs named in `leaves` until the rebuild (see
    /// [`Spillable::drop_for_rebuild`](crate::engine::Spillable::drop_for_rebuild)).
    pub(super) fn drop_for_rebuild(&self, leaves: &[TensorId], transient: u64) -> bool {
        let Some(recipe) = self.recipe() else {
            return false;
        };
        let mut inputs = SmallVec::new();
        if !recipe.hold_leaves(leaves, &mut inputs) {
            return false;
        }
        let depth = chain_depth(&inputs);
        // Dropping a lazy backend's primitive may register a free (see `DeviceQueues::exclusive`).
        let _exclusive = self.engine().queues().exclusive();
        let Some(mut state) = self.slot().try_lock() else {
            return false;
        };
        if !matches!(*state, Residency::Device(_)) {
            return false;
        }
        let device = std::mem::replace(&mut *state, Residency::Dropped);
        recipe.depth.store(depth, Ordering::Relaxed);
        recipe.transient.store(transient, Ordering::Relaxed);
        *recipe.held() = inputs;
        self.engine()
            .ledger()
            .on_dropped_for_rebuild(self.bytes, self.role());
        drop(state);
        tracing::debug!(target: "burn_spill::engine", id = self.id(), op = recipe.op,
            bytes = self.bytes, transient, "dropped, to be rebuilt");
        drop(device);
        true
    }

    /// The held inputs of a dropped tensor, for the op that will rebuild it to make resident
    /// and pin (empty when it is not dropped).
    pub(super) fn held_inputs(&self) -> SmallVec<[SpillTensor<B>; 3]> {
        match self.recipe() {
            Some(recipe) => recipe
                .held()
                .iter()
                .map(|h| SpillTensor::from_handle(h.clone()))
                .collect(),
            None => SmallVec::new(),
        }
    }

    /// Bytes of the ghosts a rebuild of this dropped tensor recomputes beside it (0 when it
    /// is not dropped, or relies on none).
    pub(super) fn rebuild_transient_bytes(&self) -> u64 {
        self.recipe()
            .map_or(0, |recipe| recipe.transient.load(Ordering::Relaxed))
    }

    /// Runs the recipe of a dropped tensor again and puts the result on the device (its
    /// held inputs first made resident, rebuilt themselves if they were dropped; its ghosts
    /// recomputed from them). Another thread that rebuilt it first wins; this result is then
    /// let go.
    ///
    /// # Panics
    /// When an input is gone or the op gives another dtype or shape: a bug, named with the
    /// tensor, its op and the input.
    pub(super) fn rebuild(&self) {
        let Some(recipe) = self.recipe() else {
            panic!(
                "burn-spill: tensor {} ({:?} {:?}) was dropped from the device without a recipe \
                 to rebuild it; this is a bug in burn-spill",
                self.id(),
                self.dtype(),
                self.shape()
            );
        };
        // The held inputs are read under the state's lock, as a drop writes them: a tensor
        // another thread rebuilt meanwhile is left as it is.
        let inputs = {
            let state = self.slot().lock();
            if !matches!(*state, Residency::Dropped) {
                return;
            }
            recipe.held().clone()
        };
        let chained = inputs
            .iter()
            .filter(|i| matches!(*i.slot().lock(), Residency::Dropped))
            .count();
        self.engine().ledger().on_chained_rebuild(chained as u64);
        let leaves: SmallVec<[(TensorId, Primitive<B>); 3]> = inputs
            .iter()
            .map(|input| {
                let primitive =
                    SpillTensor::from_handle(input.clone()).with_primitive(Clone::clone);
                (input.id(), primitive)
            })
            .collect();
        let exclusive = self.engine().queues().exclusive();
        let start = Instant::now();
        let mut ghosts = 0;
        let rebuilt = recipe.run(&leaves, self.id(), &mut ghosts);
        let took = start.elapsed();
        drop(leaves);
        run_alone(&rebuilt);
        drop(exclusive);
        self.check_rebuilt(&rebuilt, recipe.op);
        let mut state = self.slot().lock();
        // What the drop held is taken under the state's lock, as a drop writes it: a later drop
        // of the rebuilt tensor holds its own, which this rebuild must not let go of.
        let (lost_race, released) = if matches!(*state, Residency::Dropped) {
            *state = Residency::Device(rebuilt);
            self.engine()
                .ledger()
                .on_rebuilt(self.bytes, self.role(), took);
            self.engine().ledger().on_ghosts_recomputed(ghosts);
            (None, recipe.take_held())
        } else {
            (Some(rebuilt), SmallVec::new())
        };
        drop(state);
        drop(lost_race);
        // Measured with its ghosts: what the last rebuild took.
        if ghosts == 0 {
            recipe.op_nanos.store(
                took.as_nanos().min(u64::MAX as u128) as u64,
                Ordering::Relaxed,
            );
        }
        // The inputs are the program's again (dropping them may run their handles' drops).
        drop(released);
        drop(inputs);
        tracing::debug!(target: "burn_spill::engine", id = self.id(), op = recipe.op,
            ghosts, micros = took.as_micros() as u64, "rebuilt");
        self.after_rebuild();
    }
}

/// Runs a fused backend's queued ops, the rebuild's last among them, before the op that reads
/// the rebuilt tensor is registered: in one kernel with that op, the shader compiler could
/// optimise across the two (see [`rebuilds_exactly`](crate::policy::recompute::rebuilds_exactly)).
fn run_alone<B: Backend>(rebuilt: &Primitive<B>) {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if let Primitive::Float(p) = rebuilt {
        super::cubecl::run_queued_fused_ops(p);
    }
    let _ = rebuilt;
}

/// How many dropped tensors a recipe with these inputs depends on: one more than the deepest
/// dropped input's chain, 0 when none is dropped.
fn chain_depth<B: Backend>(inputs: &[Arc<Handle<B>>]) -> u32 {
    inputs
        .iter()
        .filter(|i| matches!(*i.slot().lock(), Residency::Dropped))
        .filter_map(|i| i.recipe().map(|r| r.depth.load(Ordering::Relaxed) + 1))
        .max()
        .unwrap_or(0)
}

/// The inputs an op's scope notes for its recipe.
pub(crate) type RecipeInputs<B> = SmallVec<[RecipeInput<B>; 3]>;

/// Notes `tensor` as the next input of a recipe: weakly, with its own recipe as lineage when
/// `ghosts` allows it and that recipe reaches fewer than [`MAX_GHOST_CHAIN`] ghosts deep.
pub(crate) fn recipe_input<B: Backend>(
    inputs: &mut RecipeInputs<B>,
    tensor: &SpillTensor<B>,
    ghosts: bool,
) {
    let lineage = if ghosts {
        tensor
            .shared_recipe()
            .filter(|recipe| recipe.ghost_reach < MAX_GHOST_CHAIN)
    } else {
        None
    };
    inputs.push(RecipeInput {
        id: tensor.id(),
        bytes: tensor.bytes(),
        handle: tensor.weak_handle(),
        lineage,
    });
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use burn_backend::TensorData;
    use burn_backend::ops::FloatTensorOps;
    use burn_flex::Flex;

    use super::*;

    fn tensor() -> SpillTensor<Flex> {
        let values: Vec<f32> = (0..4).map(|v| v as f32).collect();
        SpillTensor::from_float(Flex::float_from_data(
            TensorData::new(values, [2, 2]),
            &Default::default(),
        ))
    }

    /// The recipe of `exp(input)` made as `output`, keeping lineage.
    fn exp_recipe(input: &SpillTensor<Flex>, output: &SpillTensor<Flex>) -> Arc<Recipe<Flex>> {
        let mut inputs = RecipeInputs::new();
        recipe_input(&mut inputs, input, true);
        Recipe::shared(
            "float_exp",
            inputs,
            output,
            |args: &mut RecipeArgs<Flex>| Primitive::Float(Flex::float_exp(args.float())),
            Duration::ZERO,
        )
    }

    #[test]
    fn lineage_is_kept_only_up_to_the_ghost_chain_bound() {
        let mut tensors = vec![tensor()];
        let mut reaches = Vec::new();
        for _ in 0..MAX_GHOST_CHAIN + 2 {
            let output = tensor();
            let recipe = exp_recipe(tensors.last().unwrap(), &output);
            reaches.push(recipe.ghost_reach);
            output.set_recipe(recipe);
            tensors.push(output);
        }
        // The first reads a tensor without a recipe; each later one keeps the one before as
        // lineage until that reaches the bound, and then starts again.
        let bound = MAX_GHOST_CHAIN;
        let expected: Vec<u32> = (0..bound + 2).map(|k| k % (bound + 1)).collect();
        assert_eq!(reaches, expected);
    }

    #[test]
    #[should_panic(expected = "in its recipe is gone (neither held nor recomputable)")]
    fn a_rebuild_missing_an_input_it_cannot_recompute_panics_naming_it() {
        let input = tensor();
        let output = tensor();
        let recipe = exp_recipe(&input, &output);
        drop(input);
        // The input has no recipe of its own, and nothing holds it.
        recipe.run(&[], output.id(), &mut 0);
    }
}
