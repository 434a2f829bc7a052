//! Recipes: how a tensor made by a pure op is rebuilt, bit for bit, after it was dropped from
//! the device: the op's kernel run again by `B` on the same inputs.
//!
//! A recipe is kept only for the rows marked `#[recompute]` in the forwarding tables (pure
//! elementwise ops: no randomness, no state outside the inputs), and only while the device
//! may drop victims. It refers to its inputs weakly, so it keeps nothing alive; when the
//! engine drops the tensor the recipe holds its inputs until the rebuild. An input consumed in
//! place by a later op is gone by then (its handle was the last one), so the tensor is never
//! dropped against it.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use burn_backend::Backend;
use smallvec::SmallVec;

use super::tensor::{Handle, Primitive, SpillTensor};
use crate::engine::{RebuildPlan, Residency, Tier};
use crate::plan::cost::{self, MatrixDtype, TensorView};
use crate::policy::recompute::Rebuild;

/// Runs the op again on its inputs' primitives (in argument order).
pub(crate) type Rerun<B> = dyn Fn(&mut RecipeArgs<B>) -> Primitive<B> + Send + Sync;

/// The op that made a tensor, to run again. Made as `Recipe<B, F>` for the op's closure `F`
/// and kept boxed as `Recipe<B>`: the closure lives in the recipe's own allocation, so that
/// keeping a recipe costs one allocation, not two.
pub(crate) struct Recipe<B: Backend, R: ?Sized = Rerun<B>> {
    op: &'static str,
    /// The tensor arguments, in order (an input read twice is here twice).
    inputs: SmallVec<[Weak<Handle<B>>; 3]>,
    /// The inputs, held while the tensor is dropped.
    held: Mutex<SmallVec<[Arc<Handle<B>>; 3]>>,
    /// The op's time when it last ran, in nanoseconds.
    op_nanos: AtomicU64,
    /// When dropped: how many dropped tensors its inputs depended on then.
    depth: AtomicU32,
    /// Last, as an unsized field must be.
    rerun: R,
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
    /// The recipe of an op that ran on `inputs` in `took`, which `rerun` runs again.
    pub(crate) fn boxed<F>(
        op: &'static str,
        inputs: SmallVec<[Weak<Handle<B>>; 3]>,
        rerun: F,
        took: Duration,
    ) -> Box<Self>
    where
        F: Fn(&mut RecipeArgs<B>) -> Primitive<B> + Send + Sync + 'static,
    {
        Box::new(Recipe {
            op,
            inputs,
            held: Mutex::new(SmallVec::new()),
            op_nanos: AtomicU64::new(took.as_nanos().min(u64::MAX as u128) as u64),
            depth: AtomicU32::new(0),
            rerun,
        })
    }

    fn held(&self) -> std::sync::MutexGuard<'_, SmallVec<[Arc<Handle<B>>; 3]>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The inputs while they are alive and hold bytes somewhere (none taken by an op that
    /// consumed it in place), upgraded; `None` otherwise. Each state is read under its lock
    /// after the upgrade, and an op decides to consume a handle in place under that lock too,
    /// by its reference count: so either the op saw this reference, or this sees the input
    /// taken.
    fn live_inputs(&self) -> Option<SmallVec<[Arc<Handle<B>>; 3]>> {
        let mut live = SmallVec::new();
        for weak in &self.inputs {
            let input = weak.upgrade()?;
            if matches!(*input.slot().lock(), Residency::Taken) {
                return None;
            }
            live.push(input);
        }
        Some(live)
    }
}

impl<B: Backend> Handle<B> {
    /// The drop decision's view of this tensor's recipe (see [`RebuildPlan`]).
    pub(super) fn rebuild_plan(&self) -> Option<RebuildPlan> {
        let recipe = self.recipe()?;
        let inputs = recipe.live_inputs()?;
        let depth = chain_depth(&inputs);
        let ids: SmallVec<[_; 3]> = inputs.iter().map(|i| i.id()).collect();
        let views: SmallVec<[TensorView; 3]> = inputs.iter().map(|i| i.cost_view()).collect();
        let cost = cost::cost_of(recipe.op, &views, &[self.cost_view()]);
        let first_of_each = |k: &usize| !ids[..*k].contains(&ids[*k]);
        let input_bytes = views
            .iter()
            .enumerate()
            .filter(|(k, _)| first_of_each(k))
            .map(|(_, v)| v.bytes)
            .sum();
        let inputs_off_device = inputs
            .iter()
            .enumerate()
            .filter(|(k, input)| first_of_each(k) && leaves_or_left_the_device(input))
            .map(|(_, input)| input.bytes)
            .sum();
        drop(views);
        drop(inputs);
        Some(RebuildPlan {
            inputs: ids,
            input_bytes,
            rebuild: Rebuild {
                op_time: Duration::from_nanos(recipe.op_nanos.load(Ordering::Relaxed)),
                depth,
                inputs_off_device,
            },
            cost,
        })
    }

    /// What the cost model reads of this tensor.
    fn cost_view(&self) -> TensorView<'_> {
        let dtype = match self.dtype() {
            burn_backend::DType::F16 => MatrixDtype::F16,
            burn_backend::DType::BF16 => MatrixDtype::Bf16,
            _ => MatrixDtype::F32,
        };
        TensorView {
            id: self.id(),
            bytes: self.bytes,
            dtype,
            shape: self.shape().as_slice(),
        }
    }

    /// Frees the device bytes and holds the recipe's inputs until the rebuild (see
    /// [`Spillable::drop_for_rebuild`](crate::engine::Spillable::drop_for_rebuild)).
    pub(super) fn drop_for_rebuild(&self) -> bool {
        let Some(recipe) = self.recipe() else {
            return false;
        };
        let Some(inputs) = recipe.live_inputs() else {
            return false;
        };
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
        *recipe.held() = inputs;
        self.engine()
            .ledger()
            .on_dropped_for_rebuild(self.bytes, self.role());
        drop(state);
        tracing::debug!(target: "burn_spill::engine", id = self.id(), op = recipe.op,
            bytes = self.bytes, "dropped, to be rebuilt");
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

    /// Runs the recipe of a dropped tensor again and puts the result on the device (its
    /// inputs first made resident, rebuilt themselves if they were dropped). Another thread
    /// that rebuilt it first wins; this result is then let go.
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
        if inputs.len() != recipe.inputs.len() {
            let missing = recipe
                .inputs
                .iter()
                .position(|w| w.strong_count() == 0)
                .unwrap_or(inputs.len());
            panic!(
                "burn-spill: tensor {} was dropped to be rebuilt by `{}` but input {missing} of \
                 that op is gone; this is a bug in burn-spill",
                self.id(),
                recipe.op
            );
        }
        let chained = inputs
            .iter()
            .filter(|i| matches!(*i.slot().lock(), Residency::Dropped))
            .count();
        self.engine().ledger().on_chained_rebuild(chained as u64);
        let primitives: Vec<Primitive<B>> = inputs
            .iter()
            .map(|input| SpillTensor::from_handle(input.clone()).with_primitive(Clone::clone))
            .collect();
        let exclusive = self.engine().queues().exclusive();
        let start = Instant::now();
        let rebuilt = (recipe.rerun)(&mut RecipeArgs {
            op: recipe.op,
            primitives: primitives.into_iter(),
        });
        let took = start.elapsed();
        run_alone(&rebuilt);
        drop(exclusive);
        self.check_rebuilt(&rebuilt, recipe.op);
        let mut state = self.slot().lock();
        let lost_race = if matches!(*state, Residency::Dropped) {
            *state = Residency::Device(rebuilt);
            self.engine()
                .ledger()
                .on_rebuilt(self.bytes, self.role(), took);
            None
        } else {
            Some(rebuilt)
        };
        drop(state);
        drop(lost_race);
        recipe.op_nanos.store(
            took.as_nanos().min(u64::MAX as u128) as u64,
            Ordering::Relaxed,
        );
        // The inputs are the program's again (dropping them may run their handles' drops).
        let released = std::mem::take(&mut *recipe.held());
        drop(released);
        drop(inputs);
        tracing::debug!(target: "burn_spill::engine", id = self.id(), op = recipe.op,
            micros = took.as_micros() as u64, "rebuilt");
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

/// Whether `input`'s bytes are in the host tier or on disk, or being copied there: a rebuild
/// now would have to bring them back first.
fn leaves_or_left_the_device<B: Backend>(input: &Handle<B>) -> bool {
    matches!(
        *input.slot().lock(),
        Residency::Host { .. } | Residency::Disk(_) | Residency::InFlight { from: Tier::Device }
    )
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

/// The inputs an op's scope notes for its recipe: weak references to its tensor arguments.
pub(crate) type RecipeInputs<B> = SmallVec<[Weak<Handle<B>>; 3]>;

/// Notes `tensor` as the next input of a recipe.
pub(crate) fn recipe_input<B: Backend>(inputs: &mut RecipeInputs<B>, tensor: &SpillTensor<B>) {
    inputs.push(tensor.weak_handle());
}
