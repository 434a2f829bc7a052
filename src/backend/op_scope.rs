//! `OpScope`: what one op call does around `B`'s kernel when a budget is in force or the tape
//! records.
//!
//! The forwarding macro makes one per call: it notes the input handles, asks the engine to make
//! room (restores come back within the budget, the running op's inputs are never evicted),
//! takes the primitives, wraps the outputs, and on drop hands the outputs to the engine, lets
//! the consumed inputs go and settles the device under its watermark; when the device's tape
//! records, it also records the op. On an unconfigured device every step is a flag check and
//! nothing is allocated.

use std::cell::RefCell;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use burn_backend::{Backend, DType, Shape, TensorMetadata};
use smallvec::SmallVec;

use super::device::device_key;
use super::recipe::{Recipe, RecipeArgs, RecipeInputs, recipe_input};
use super::tensor::{Primitive, RetiredHandle, SpillTensor, TensorKind};
use crate::engine::{
    DeviceEngine, OpInput, OpOutput, OpTicket, TensorId, TensorRole, Tier, UntrackedOp, engine_ref,
};
use crate::fast_hash::FastHasher;
use crate::policy::recompute::{self, RebuildTimes};
use crate::tape::TensorView;
use crate::tape::recorder::OpSignature;

/// What the tape needs of one tensor, held until the op is recorded.
struct TapeEntry {
    id: TensorId,
    bytes: u64,
    dtype: &'static str,
    shape: Shape,
    role: TensorRole,
}

impl TapeEntry {
    fn of<B: Backend>(tensor: &SpillTensor<B>) -> Self {
        Self {
            id: tensor.id(),
            bytes: tensor.bytes(),
            dtype: dtype_name(tensor.dtype()),
            shape: tensor.shape(),
            role: tensor.role(),
        }
    }

    fn view(&self) -> TensorView<'_> {
        TensorView {
            id: self.id,
            bytes: self.bytes,
            dtype: self.dtype,
            shape: self.shape.as_slice(),
            role: self.role,
        }
    }
}

/// A dtype's name without formatting (the quantization scheme is left out).
fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F64 => "F64",
        DType::F32 => "F32",
        DType::Flex32 => "Flex32",
        DType::F16 => "F16",
        DType::BF16 => "BF16",
        DType::I64 => "I64",
        DType::I32 => "I32",
        DType::I16 => "I16",
        DType::I8 => "I8",
        DType::U64 => "U64",
        DType::U32 => "U32",
        DType::U16 => "U16",
        DType::U8 => "U8",
        DType::Bool(burn_std::BoolStore::Native) => "Bool(Native)",
        DType::Bool(burn_std::BoolStore::U8) => "Bool(U8)",
        DType::Bool(burn_std::BoolStore::U32) => "Bool(U32)",
        DType::QFloat(_) => "QFloat",
    }
}

thread_local! {
    /// Entry buffers lent to the op scopes of this thread, so recording does not allocate per op.
    static SCRATCH: RefCell<Vec<Vec<TapeEntry>>> = const { RefCell::new(Vec::new()) };
}

fn lend() -> Vec<TapeEntry> {
    SCRATCH.with(|s| s.borrow_mut().pop()).unwrap_or_default()
}

fn give_back(mut entries: Vec<TapeEntry>) {
    entries.clear();
    SCRATCH.with(|s| s.borrow_mut().push(entries));
}

/// The recording of one op: the engine whose recorder is on, and what the recorder needs of
/// the op.
struct Recording {
    /// `None` when it is the scope's own engine.
    engine: Option<&'static Arc<DeviceEngine>>,
    taken: Taken,
}

/// What a recording takes of an op.
enum Taken {
    /// The step is recorded in full: the op's start and its tensors.
    Full {
        started: Instant,
        inputs: Vec<TapeEntry>,
        outputs: Vec<TapeEntry>,
    },
    /// The recorder only verifies (most steps of a run that repeats): the op's signature,
    /// built from its outputs as they are made, so nothing is collected or copied.
    Verified(OpSignature),
    /// The recorder verifies, and no decision reads the plan while this op runs (the device
    /// has a budget and memory is ample): the op is only counted (see
    /// [`Recorder::count_op`](crate::tape::recorder::Recorder::count_op)).
    Counted,
}

/// What the arguments of an op that creates a tensor from nothing say of its size.
#[derive(Default)]
struct CreatedSize {
    elements: Option<u64>,
    element_bytes: Option<u64>,
    bytes: Option<u64>,
}

impl CreatedSize {
    /// The created tensor's bytes, where the arguments tell them.
    fn bytes(&self) -> Option<u64> {
        self.bytes.or_else(|| {
            let (elements, size) = (self.elements?, self.element_bytes?);
            Some(elements.saturating_mul(size))
        })
    }
}

pub(crate) struct OpScope<B: Backend> {
    name: &'static str,
    /// Set once an input or output lives on a device with a budget.
    engine: Option<&'static Arc<DeviceEngine>>,
    // Ops read and make a few tensors: these stay off the heap.
    inputs: SmallVec<[OpInput; 4]>,
    /// Non-tensor arguments that decide the output size (shapes, dtypes, data lengths).
    hints: Option<FastHasher>,
    /// The size those arguments give a tensor created from nothing.
    created: CreatedSize,
    /// The output's bytes, where the op says them from its inputs' shapes (see
    /// `output_size.rs`): what room is made for before its size is learnt.
    known_output: Option<u64>,
    ticket: Option<OpTicket>,
    outputs: SmallVec<[OpOutput; 2]>,
    retired: SmallVec<[RetiredHandle<B>; 4]>,
    recording: Option<Recording>,
    /// Whether this op is pure, so that its output may keep a recipe (see `recipe.rs`).
    recomputable: bool,
    /// Whether its recipe records how long the op took: only where rebuilds are weighed by
    /// their measured times (`RebuildTimes::Measured`). Where they are modelled (CubeCL, or a
    /// configured rebuild profile) a measured time is never read, so the op's thread is spared
    /// the two clock reads around the op.
    times_recipe: bool,
    /// Its tensor arguments, for the recipe: noted once the device is known to drop victims.
    recipe_inputs: Option<RecipeInputs<B>>,
    /// Whether the recipe keeps its inputs' recipes, so that a rebuild may recompute inputs
    /// the program let go (not on a backend that runs several ops in one kernel: see
    /// `recipe.rs`).
    keeps_lineage: bool,
    /// Whether the engine was asked if this op runs untracked (see `engine::device::ample`).
    decided: bool,
    /// The op runs untracked: memory is ample, so its inputs are not pinned, it reserves
    /// nothing, and its outputs are only listed for the index.
    untracked: Option<UntrackedOp>,
    /// An untracked op's input sizes and output bytes, to learn its output size.
    untracked_inputs: SmallVec<[u64; 4]>,
    untracked_output_bytes: u64,
}

impl<B: Backend> OpScope<B> {
    pub(crate) fn new(name: &'static str) -> Self {
        Self {
            name,
            engine: None,
            inputs: SmallVec::new(),
            hints: None,
            created: CreatedSize::default(),
            known_output: None,
            ticket: None,
            outputs: SmallVec::new(),
            retired: SmallVec::new(),
            recording: None,
            recomputable: false,
            times_recipe: false,
            recipe_inputs: None,
            keeps_lineage: false,
            decided: false,
            untracked: None,
            untracked_inputs: SmallVec::new(),
            untracked_output_bytes: 0,
        }
    }

    /// The scope of a pure op (a `#[recompute]` row), whose output may be rebuilt by running
    /// it again.
    pub(crate) fn recomputable(name: &'static str) -> Self {
        debug_assert!(
            recompute::is_recomputable(name),
            "`{name}` is marked #[recompute] but not in RECOMPUTABLE_OPS"
        );
        let mut scope = Self::new(name);
        scope.recomputable = true;
        scope
    }

    /// Starts recording this op if `engine` records; returns the recording.
    fn recording_for(&mut self, engine: &'static Arc<DeviceEngine>) -> Option<&mut Recording> {
        if self.recording.is_none() && engine.recorder().is_enabled() {
            let own = self.engine.is_some_and(|e| Arc::ptr_eq(e, engine));
            let recorder = engine.recorder();
            let taken = if recorder.signatures_only() {
                // Only under a budget: without one the user configured the device to watch
                // its tape, and every op is verified (divergences are counted op by op). The
                // engine's flags first: a tracked op then skips the thread check.
                if engine.is_tracking() && !engine.tracks_all() && recorder.may_count_op() {
                    Taken::Counted
                } else {
                    Taken::Verified(OpSignature::new(self.name))
                }
            } else {
                Taken::Full {
                    started: Instant::now(),
                    inputs: lend(),
                    outputs: lend(),
                }
            };
            self.recording = Some(Recording {
                engine: (!own).then_some(engine),
                taken,
            });
        }
        self.recording.as_mut()
    }

    /// Notes an input the op will read.
    pub(crate) fn input(&mut self, tensor: &SpillTensor<B>) {
        let tracking = tensor.engine().is_tracking();
        if tracking && self.engine.is_none() {
            self.engine = Some(tensor.engine());
        }
        if tracking && !self.decided {
            // An output larger than the inputs must fit too, or the op runs tracked.
            self.decide(tensor.bytes().max(self.known_output.unwrap_or(0)));
        }
        if self.recomputable {
            self.recipe_input(tensor);
        }
        if let Some(Recording {
            taken: Taken::Full { inputs, .. },
            ..
        }) = self.recording_for(tensor.engine())
        {
            inputs.push(TapeEntry::of(tensor));
        }
        if !tracking {
            return;
        }
        if self.untracked.is_some() {
            self.untracked_inputs.push(tensor.bytes());
            return;
        }
        self.pinned_input(tensor, false);
    }

    /// Asks the scope's engine whether this op runs untracked, `first_bytes` being its first
    /// input or the tensor it creates (0 when unknown). An untracked op keeps no recipe: its
    /// device drops nothing while memory is ample.
    fn decide(&mut self, first_bytes: u64) {
        self.decided = true;
        if let Some(engine) = &self.engine {
            self.untracked = engine.begin_untracked(first_bytes);
        }
        if self.untracked.is_some() {
            self.recomputable = false;
        }
    }

    /// Notes `tensor` for the engine to pin and make resident: an input of the op, or (with
    /// `for_rebuild`) an input of a dropped input's recipe. A dropped tensor brings its
    /// recipe's inputs along, so that the rebuild's inputs are within the budget too.
    fn pinned_input(&mut self, tensor: &SpillTensor<B>, for_rebuild: bool) {
        let evictable = tensor.evictable();
        let tier = tensor.tier_unless_dropped();
        self.inputs.push(OpInput {
            id: tensor.id(),
            bytes: tensor.bytes(),
            tier: tier.unwrap_or(Tier::Device),
            evictable,
            // The engine marks it once it indexes it (see `DeviceEngine::begin_op`).
            victim: (evictable && !tensor.is_indexed()).then(|| tensor.victim()),
            dropped: tier.is_none(),
            rebuild_transient: if tier.is_none() {
                tensor.rebuild_transient_bytes()
            } else {
                0
            },
            for_rebuild,
        });
        if tier.is_none() {
            for input in tensor.rebuild_inputs() {
                self.pinned_input(&input, true);
            }
        }
    }

    /// Notes a tensor argument of a pure op for its output's recipe, once the device may drop
    /// victims and a rebuild on it gives the first run's bits (otherwise the op keeps no
    /// recipe, and this costs one check per op).
    fn recipe_input(&mut self, tensor: &SpillTensor<B>) {
        if self.recipe_inputs.is_none() {
            let engine = tensor.engine();
            let (drops, measured) = if engine.is_tracking() {
                engine.with_limits(|limits| {
                    (
                        engine.recompute_behaviour(limits).may_drop(),
                        matches!(limits.rebuild_times, RebuildTimes::Measured),
                    )
                })
            } else {
                (false, false)
            };
            let fuses_ops = engine.queues().fuses_ops();
            let keeps = drops && recompute::rebuilds_exactly(self.name, fuses_ops);
            if !keeps {
                self.recomputable = false;
                return;
            }
            self.times_recipe = measured;
            self.keeps_lineage = !fuses_ops;
            self.recipe_inputs = Some(SmallVec::new());
        }
        if let Some(inputs) = &mut self.recipe_inputs {
            recipe_input(inputs, tensor, self.keeps_lineage);
        }
    }

    /// Whether the output will keep a recipe: the op is pure and its device drops victims.
    pub(crate) fn keeps_recipe(&self) -> bool {
        self.recipe_inputs.is_some()
    }

    /// Whether the recipe records the op's time (see `times_recipe`).
    pub(crate) fn times_recipe(&self) -> bool {
        self.keeps_recipe() && self.times_recipe
    }

    /// Gives `output` its recipe: `rerun` runs the op again, which took `took` this time
    /// (zero when untimed: see [`times_recipe`](Self::times_recipe)).
    pub(crate) fn recipe<F>(&mut self, output: &SpillTensor<B>, took: Duration, rerun: F)
    where
        F: Fn(&mut RecipeArgs<B>) -> Primitive<B> + Send + Sync + 'static,
    {
        if let Some(inputs) = self.recipe_inputs.take()
            && output.evictable()
        {
            output.set_recipe(Recipe::shared(self.name, inputs, output, rerun, took));
        }
    }

    /// Notes the device a creating op allocates on.
    pub(crate) fn device(&mut self, device: &B::Device) {
        if self.engine.is_none() || self.recording.is_none() {
            let engine = engine_ref(device_key::<B>(device));
            if self.engine.is_none() && engine.is_tracking() {
                self.engine = Some(engine);
            }
            self.recording_for(engine);
        }
    }

    /// Notes an argument that decides the output size.
    pub(crate) fn hint(&mut self, value: &impl Hash) {
        value.hash(self.hints.get_or_insert_with(FastHasher::default));
    }

    /// Notes the element count of the tensor a creating op makes (a shape, a range).
    pub(crate) fn created_elements(&mut self, elements: u64) {
        self.created.elements = Some(elements);
    }

    /// Notes the dtype of the tensor a creating op makes.
    pub(crate) fn created_dtype(&mut self, dtype: DType) {
        self.created.element_bytes = Some(dtype.size() as u64);
    }

    /// Notes the bytes of the data a creating op uploads.
    pub(crate) fn created_bytes(&mut self, bytes: u64) {
        self.created.bytes = Some(bytes);
    }

    /// Notes the output's bytes, as the op's inputs' shapes give them (`bytes`), where `first`
    /// (its first tensor input) lives on a device with a budget. Called before the inputs are
    /// noted; elsewhere the shapes are not read.
    pub(crate) fn known_output(
        &mut self,
        first: &SpillTensor<B>,
        bytes: impl FnOnce() -> Option<u64>,
    ) {
        if first.engine().is_tracking() {
            self.known_output = bytes();
        }
    }

    /// Makes room for the noted inputs and the estimated output.
    pub(crate) fn begin(&mut self) {
        if self.engine.is_some() && !self.decided {
            // An op that creates a tensor from nothing: sized by its arguments.
            self.decide(self.created.bytes().unwrap_or(0));
        }
        if self.untracked.is_some() {
            return;
        }
        if let Some(engine) = &self.engine {
            let hint = self.hints.as_ref().map_or(0, Hasher::finish);
            // An op with tensor inputs has its output size learnt from them (or, for the ops
            // that can outgrow them, given by their shapes); one that creates a tensor from
            // nothing is sized by its arguments from the first call.
            let known = if self.inputs.is_empty() {
                self.created.bytes()
            } else {
                self.known_output
            };
            self.ticket = engine.begin_op(self.name, &self.inputs, hint, known);
        }
    }

    /// The device's exclusive-work lock while `B` runs the op, on backends that need one
    /// (see [`DeviceQueues::exclusive`](crate::engine::DeviceQueues::exclusive)). Only a
    /// device with a budget has workers to exclude.
    pub(crate) fn exclusive(&self) -> Option<crate::engine::ExclusiveWork> {
        self.engine.as_ref()?.queues().exclusive()
    }

    /// The primitive of an input, restored if it was spilled.
    #[inline]
    pub(crate) fn take(&mut self, tensor: SpillTensor<B>) -> Primitive<B> {
        // Consumed inputs stay alive until the op's outputs are counted (budget) and the op is
        // recorded before their drops (tape).
        let keeps_retired = self.engine.is_some() || self.recording.is_some();
        let retired = &mut self.retired;
        tensor.take_primitive(|handle| {
            if keeps_retired {
                retired.push(handle);
            }
        })
    }

    #[inline]
    pub(crate) fn take_float(&mut self, tensor: SpillTensor<B>) -> B::FloatTensorPrimitive {
        tensor.expect_kind(TensorKind::Float);
        match self.take(tensor) {
            Primitive::Float(p) => p,
            _ => unreachable!("kind checked above"),
        }
    }

    #[inline]
    pub(crate) fn take_int(&mut self, tensor: SpillTensor<B>) -> B::IntTensorPrimitive {
        tensor.expect_kind(TensorKind::Int);
        match self.take(tensor) {
            Primitive::Int(p) => p,
            _ => unreachable!("kind checked above"),
        }
    }

    #[inline]
    pub(crate) fn take_bool(&mut self, tensor: SpillTensor<B>) -> B::BoolTensorPrimitive {
        tensor.expect_kind(TensorKind::Bool);
        match self.take(tensor) {
            Primitive::Bool(p) => p,
            _ => unreachable!("kind checked above"),
        }
    }

    #[inline]
    pub(crate) fn take_quantized(&mut self, tensor: SpillTensor<B>) -> B::QuantizedTensorPrimitive {
        tensor.expect_kind(TensorKind::Quantized);
        match self.take(tensor) {
            Primitive::Quantized(p) => p,
            _ => unreachable!("kind checked above"),
        }
    }

    /// Notes an output the op produced.
    pub(crate) fn output(&mut self, tensor: SpillTensor<B>) -> SpillTensor<B> {
        let tracking = tensor.engine().is_tracking();
        if tracking && self.engine.is_none() {
            // Known only from its output: the op ran without a ticket, and its outputs are
            // indexed when the scope ends.
            self.engine = Some(tensor.engine());
            self.decided = true;
        }
        if let Some(recording) = self.recording_for(tensor.engine()) {
            match &mut recording.taken {
                Taken::Full { outputs, .. } => outputs.push(TapeEntry::of(&tensor)),
                Taken::Verified(signature) => {
                    signature.output(dtype_name(tensor.dtype()), tensor.shape_dims());
                }
                Taken::Counted => {}
            }
        }
        if !tracking {
            return tensor;
        }
        let engine = tensor.engine();
        let evictable = tensor.evictable();
        if self.untracked.is_some()
            && let Some(own) = &self.engine
            && Arc::ptr_eq(own, engine)
        {
            self.untracked_output_bytes += tensor.bytes();
            if let Some(place) =
                engine.note_untracked_output(tensor.id(), tensor.bytes(), evictable, || {
                    tensor.victim()
                })
            {
                tensor.mark_listed(place);
            }
            return tensor;
        }
        if evictable {
            tensor.mark_indexed();
        }
        match &self.engine {
            Some(own) if !Arc::ptr_eq(own, engine) => {
                // `*_to_device`: the output lives on another device, with its own engine.
                if evictable {
                    engine.register(tensor.id(), tensor.bytes(), tensor.victim());
                }
                return tensor;
            }
            Some(_) => {}
            None => unreachable!("set above: the output's engine tracks"),
        }
        self.outputs.push(OpOutput {
            id: tensor.id(),
            bytes: tensor.bytes(),
            evictable,
            victim: tensor.victim(),
        });
        tensor
    }
}

impl<B: Backend> OpScope<B> {
    /// Hands the op to its recorder: in full, or its signature only.
    fn record(&self, recording: Recording) {
        let engine = match (&recording.engine, &self.engine) {
            (Some(engine), _) | (None, Some(engine)) => engine,
            (None, None) => unreachable!("a recording's engine is its own or the scope's"),
        };
        let recorder = engine.recorder();
        let resident =
            || [Tier::Device, Tier::Host, Tier::Disk].map(|tier| engine.ledger().resident(tier));
        match recording.taken {
            Taken::Full {
                started,
                inputs,
                outputs,
            } => {
                recorder.record_op(
                    self.name,
                    inputs.iter().map(TapeEntry::view),
                    outputs.iter().map(TapeEntry::view),
                    started,
                    started.elapsed().as_nanos() as u64,
                    resident(),
                );
                give_back(inputs);
                give_back(outputs);
            }
            Taken::Verified(signature) => {
                recorder.record_verified_op(self.name, signature, resident());
            }
            Taken::Counted => {
                recorder.count_op(self.name);
            }
        }
    }
}

impl<B: Backend> Drop for OpScope<B> {
    fn drop(&mut self) {
        if let Some(recording) = self.recording.take()
            && !std::thread::panicking()
        {
            self.record(recording);
        }
        let Some(engine) = self.engine.take() else {
            self.retired.clear();
            return;
        };
        if let Some(untracked) = self.untracked {
            // Released before anything else: a switch to tracking waits for untracked ops.
            engine.end_untracked();
            if !std::thread::panicking() {
                let hint = self.hints.as_ref().map_or(0, Hasher::finish);
                engine.learn_untracked(
                    self.name,
                    hint,
                    &self.untracked_inputs,
                    self.untracked_output_bytes,
                );
                self.retired.clear();
                engine.after_untracked_op(untracked);
            }
            return;
        }
        let ticket = self.ticket.take();
        if std::thread::panicking() {
            // The op failed: release the pins, move nothing.
            if let Some(ticket) = ticket {
                engine.end_op_without_outputs(ticket);
            }
            return;
        }
        match ticket {
            Some(ticket) => engine.end_op(ticket, self.outputs.drain(..)),
            None => {
                for out in self.outputs.drain(..).filter(|o| o.evictable) {
                    engine.register(out.id, out.bytes, out.victim);
                }
            }
        }
        self.retired.clear();
        engine.after_op();
    }
}
