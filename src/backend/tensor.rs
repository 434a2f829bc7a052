//! `SpillTensor<B>`: the one handle type behind float, int, bool and quantized tensors.
//!
//! A handle is a shared pointer to a [`Handle`] that caches everything metadata queries need
//! (id, shape, dtype, device), so `shape()`, `dtype()` and `*_device()` never touch the inner
//! tensor. When the last clone drops, the device's ledger learns it.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use burn_backend::quantization::QuantScheme;
use burn_backend::{Backend, DType, QTensorPrimitive, Shape, TensorData, TensorMetadata};
use burn_std::quantization::{QuantAcc, QuantPropagation};

use super::device::persistent_allocation_active;
use super::host::{HostTensor, read_to_host};
use super::layout::round_trips_exactly;
use super::op_scope::OpScope;
use super::recipe::Recipe;
use crate::engine::{
    DeviceEngine, HandOver, RebuildPlan, Residency, Slot, SlotGuard, SlotInfo, Spillable, TensorId,
    TensorRole, Tier,
};

/// The first id of the next block of ids a thread takes.
static NEXT_ID_BLOCK: AtomicU64 = AtomicU64::new(1);

/// Ids a thread takes at once: one shared read-modify-write per this many tensors instead of
/// one per tensor.
const ID_BLOCK: u64 = 1024;

thread_local! {
    /// The next id this thread gives out and the end of its block.
    static IDS: std::cell::Cell<(TensorId, TensorId)> = const { std::cell::Cell::new((0, 0)) };
}

/// A process-wide unique tensor id. Ids increase along each thread's tensors; across threads
/// they say nothing of which tensor came first.
fn next_tensor_id() -> TensorId {
    IDS.with(|ids| {
        let (mut next, mut end) = ids.get();
        if next == end {
            next = NEXT_ID_BLOCK.fetch_add(ID_BLOCK, Ordering::Relaxed);
            end = next + ID_BLOCK;
        }
        ids.set((next + 1, end));
        next
    })
}

/// Which of Burn's four primitive kinds a handle holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TensorKind {
    /// `FloatTensorPrimitive`
    Float,
    /// `IntTensorPrimitive`
    Int,
    /// `BoolTensorPrimitive`
    Bool,
    /// `QuantizedTensorPrimitive`
    Quantized,
}

/// The inner backend's primitive, whichever kind it is.
pub(crate) enum Primitive<B: Backend> {
    Float(B::FloatTensorPrimitive),
    Int(B::IntTensorPrimitive),
    Bool(B::BoolTensorPrimitive),
    Quantized(B::QuantizedTensorPrimitive),
}

impl<B: Backend> Primitive<B> {
    fn kind(&self) -> TensorKind {
        match self {
            Primitive::Float(_) => TensorKind::Float,
            Primitive::Int(_) => TensorKind::Int,
            Primitive::Bool(_) => TensorKind::Bool,
            Primitive::Quantized(_) => TensorKind::Quantized,
        }
    }

    fn shape_dtype(&self) -> (Shape, DType) {
        match self {
            Primitive::Float(p) => (p.shape(), p.dtype()),
            Primitive::Int(p) => (p.shape(), p.dtype()),
            Primitive::Bool(p) => (p.shape(), p.dtype()),
            Primitive::Quantized(p) => (p.shape(), p.dtype()),
        }
    }

    fn device(&self) -> B::Device {
        match self {
            Primitive::Float(p) => B::float_device(p),
            Primitive::Int(p) => B::int_device(p),
            Primitive::Bool(p) => B::bool_device(p),
            Primitive::Quantized(p) => B::q_device(p),
        }
    }
}

impl<B: Backend> Clone for Primitive<B> {
    fn clone(&self) -> Self {
        match self {
            Primitive::Float(p) => Primitive::Float(p.clone()),
            Primitive::Int(p) => Primitive::Int(p.clone()),
            Primitive::Bool(p) => Primitive::Bool(p.clone()),
            Primitive::Quantized(p) => Primitive::Quantized(p.clone()),
        }
    }
}

/// Quantization facts of a quantized primitive, read once when it is wrapped.
#[derive(Debug, Clone, Copy)]
struct QuantFacts {
    acc_precision: QuantAcc,
    propagation: QuantPropagation,
}

/// The shared state behind all clones of one tensor.
pub(crate) struct Handle<B: Backend> {
    id: TensorId,
    kind: TensorKind,
    shape: Shape,
    dtype: DType,
    device: B::Device,
    pub(super) bytes: u64,
    role: TensorRole,
    quant: Option<QuantFacts>,
    /// Which tier holds the bytes; `Taken` only after an op took the primitive out of a unique
    /// handle that is about to drop, `InFlight` while a transfer worker carries them.
    state: Slot<Primitive<B>, HostTensor>,
    /// Its device's engine, which lives as long as the process (see `engine::registry`).
    engine: &'static Arc<DeviceEngine>,
    /// Whether the engine's index knows this tensor (so the drop must tell it).
    indexed: AtomicBool,
    /// Where the engine listed this tensor while memory was ample (`NOT_LISTED` otherwise), so
    /// that the drop takes it off the list (see `engine::device::ample`).
    listed_at: AtomicU32,
    /// Whether the bytes can leave the device and come back in the same layout.
    evictable: bool,
    /// How to rebuild the bytes after a drop, for outputs of pure ops while the device may
    /// drop victims (see `recipe.rs`).
    recipe: OnceLock<Arc<Recipe<B>>>,
}

type State<B> = Residency<Primitive<B>, HostTensor>;

impl<B: Backend> Handle<B> {
    fn lock(&self) -> SlotGuard<'_, Primitive<B>, HostTensor> {
        self.state.lock()
    }

    /// The lock an op reads the bytes under: it waits for a transfer in flight (stall time).
    #[inline]
    fn lock_for_use(&self) -> SlotGuard<'_, Primitive<B>, HostTensor> {
        let (guard, waited) = self.state.lock_settled();
        self.engine.stalled(waited);
        guard
    }

    /// Dtype and shape as written into spill records and checked when read back.
    fn meta(&self) -> String {
        format!("{:?} {:?} {:?}", self.kind, self.dtype, self.shape)
    }

    fn info<'a>(&self, meta: &'a dyn Fn() -> String) -> SlotInfo<'a> {
        SlotInfo {
            id: self.id,
            bytes: self.bytes,
            role: self.role,
            meta,
        }
    }

    /// Brings the bytes back to the device if they are on the host or on disk. Returns whether
    /// they moved (the caller then tells the index, after releasing the lock).
    fn restore_locked(&self, state: &mut State<B>) -> bool {
        if matches!(state, Residency::Device(_)) {
            return false;
        }
        let meta = || self.meta();
        self.engine.restore_slot(
            state,
            self.info(&meta),
            |host| self.upload(host),
            |len| HostTensor::zeroed(len, self.shape.clone(), self.dtype),
        )
    }

    fn upload(&self, host: HostTensor) -> Primitive<B> {
        let data: TensorData = host.into_data();
        let primitive = match self.kind {
            TensorKind::Float => Primitive::Float(B::float_from_data(data, &self.device)),
            TensorKind::Int => Primitive::Int(B::int_from_data(data, &self.device)),
            TensorKind::Bool => Primitive::Bool(B::bool_from_data(data, &self.device)),
            TensorKind::Quantized => Primitive::Quantized(B::q_from_data(data, &self.device)),
        };
        let (shape, dtype) = primitive.shape_dtype();
        if dtype != self.dtype || shape != self.shape {
            panic!(
                "burn-spill: restoring tensor {} gave {dtype:?} {:?}, not its own {:?} {:?}; \
                 the inner backend changed the bytes' type on upload",
                self.id, shape, self.dtype, self.shape
            );
        }
        primitive
    }

    fn after_restore(&self, moved: bool) {
        if moved && self.indexed.load(Ordering::Relaxed) {
            self.engine.restored(self.id);
        }
    }

    /// A clone of the device payload for a batched eviction, unless the tensor is busy, off the
    /// device or quantized (whose reads need the scheme: those go one by one).
    pub(super) fn batchable_payload(&self) -> Option<Primitive<B>> {
        if self.kind == TensorKind::Quantized {
            return None;
        }
        match &*self.state.try_lock()? {
            Residency::Device(p) => Some(p.clone()),
            _ => None,
        }
    }

    /// Offers the device payload to the host tier as it is (see [`super::host::hand_over`]):
    /// only backends whose memory is host memory take it.
    pub(super) fn hand_over(&self, engine: &DeviceEngine) -> HandOver {
        if !super::host::hands_over::<B>() {
            return HandOver::Refused;
        }
        let meta = || self.meta();
        engine.hand_over_slot(&self.state, self.info(&meta), |primitive| {
            super::host::hand_over::<B>(primitive, self.dtype, &self.shape)
        })
    }

    /// This tensor's bytes straight from `primitive`'s memory, where burn-spill can read it.
    pub(super) fn direct_bytes<'a>(&self, primitive: &'a Primitive<B>) -> Option<&'a [u8]> {
        super::host::flex_bytes(primitive, self.dtype, &self.shape)
    }

    pub(super) fn shape(&self) -> &Shape {
        &self.shape
    }

    pub(super) fn dtype(&self) -> DType {
        self.dtype
    }

    /// Whether a batched read gave this tensor's dtype and shape.
    pub(super) fn check(&self, data: &TensorData) -> Result<(), String> {
        super::host::check_read(data, self.dtype, &self.shape)
    }

    /// Puts a batch's host slice in place of the device payload, or writes it on to disk (see
    /// [`DeviceEngine::install_evicted`]).
    pub(super) fn install_evicted(
        &self,
        engine: &DeviceEngine,
        host: HostTensor,
        took: std::time::Duration,
        may_stay_on_host: bool,
    ) -> Option<Tier> {
        let meta = || self.meta();
        engine.install_evicted(&self.state, self.info(&meta), host, took, may_stay_on_host)
    }

    /// The tier holding the bytes now.
    fn tier(&self) -> Tier {
        self.lock().tier().unwrap_or(Tier::Device)
    }

    /// The tier holding the bytes now, or `None` when they were dropped to be rebuilt.
    fn tier_unless_dropped(&self) -> Option<Tier> {
        self.state.tier_unless_dropped()
    }

    /// The lock an op reads the bytes under, with them on the device: rebuilt first if they
    /// were dropped, restored if spilled. Returns whether they were restored (see
    /// [`after_restore`](Self::after_restore)).
    #[inline]
    fn lock_resident(&self) -> (SlotGuard<'_, Primitive<B>, HostTensor>, bool) {
        let mut state = self.lock_for_use();
        while matches!(*state, Residency::Dropped) {
            drop(state);
            self.rebuild();
            state = self.lock_for_use();
        }
        let moved = self.restore_locked(&mut state);
        (state, moved)
    }

    pub(super) fn slot(&self) -> &Slot<Primitive<B>, HostTensor> {
        &self.state
    }

    pub(super) fn recipe(&self) -> Option<&Recipe<B>> {
        self.recipe.get().map(Arc::as_ref)
    }

    pub(super) fn id(&self) -> TensorId {
        self.id
    }

    pub(super) fn role(&self) -> TensorRole {
        self.role
    }

    pub(super) fn engine(&self) -> &'static Arc<DeviceEngine> {
        self.engine
    }

    /// Tells the index a rebuilt tensor is on the device again.
    pub(super) fn after_rebuild(&self) {
        self.after_restore(true);
    }

    /// Panics unless a rebuild gave this tensor's dtype and shape. In debug builds also unless
    /// it gave a layout that round-trips exactly, as the original's did (only such outputs keep
    /// a recipe): another layout would lead the inner backend's kernels down other paths, and
    /// results downstream could drift by an ulp (see [`super::layout`]).
    pub(super) fn check_rebuilt(&self, rebuilt: &Primitive<B>, op: &str) {
        debug_assert!(
            round_trips_exactly(rebuilt),
            "burn-spill: rebuilding tensor {} with `{op}` gave a layout its original did not have; this is a bug in burn-spill",
            self.id
        );
        let (shape, dtype) = rebuilt.shape_dtype();
        if dtype != self.dtype || shape != self.shape || rebuilt.kind() != self.kind {
            panic!(
                "burn-spill: rebuilding tensor {} with `{op}` gave {:?} {dtype:?} {shape:?}, not its own {:?} {:?} {:?}; this is a bug in burn-spill",
                self.id,
                rebuilt.kind(),
                self.kind,
                self.dtype,
                self.shape
            );
        }
    }

    fn missing(&self) -> ! {
        panic!(
            "burn-spill: tensor {} ({:?}, {:?}, {:?}) is not on the device after a restore; this is a bug in burn-spill",
            self.id, self.kind, self.dtype, self.shape
        )
    }
}

impl<B: Backend> Drop for Handle<B> {
    fn drop(&mut self) {
        // Dropping a lazy backend's primitive may register a free (see `DeviceQueues::exclusive`).
        let _exclusive = self.engine.queues().exclusive();
        let state = self.state.get_mut();
        self.engine
            .drop_slot(state, self.bytes, self.role, self.evictable);
        // The bytes go now, under the exclusive-work lock (a field would drop after it).
        *state = Residency::Taken;
        if self.engine.recorder().is_enabled() {
            self.engine.recorder().record_drop(self.id);
        }
        if *self.indexed.get_mut() {
            self.engine.unregister(self.id);
        }
        let listed_at = *self.listed_at.get_mut();
        if listed_at != NOT_LISTED {
            self.engine.unlist(listed_at, self.id);
        }
        drop(_exclusive);
        // The recipe may outlive the handle, as the lineage of the recipes of tensors made from
        // this one: what it held for a rebuild goes now (its handles' drops take the lock
        // again, so after it).
        if let Some(recipe) = self.recipe.get() {
            recipe.release_held();
        }
    }
}

/// `Handle::listed_at` of a tensor the engine did not list.
const NOT_LISTED: u32 = u32::MAX;

impl<B: Backend> Spillable for Handle<B> {
    fn evict(&self, engine: &DeviceEngine) -> Option<Tier> {
        let _exclusive = engine.queues().exclusive();
        match self.hand_over(engine) {
            HandOver::Moved(tier) => return Some(tier),
            HandOver::Stayed => return None,
            HandOver::Refused => {}
        }
        let meta = || self.meta();
        engine.evict_slot(&self.state, self.info(&meta), |primitive| {
            read_to_host::<B>(primitive, self.dtype, &self.shape)
        })
    }

    fn demote_to_disk(&self, engine: &DeviceEngine) -> bool {
        let meta = || self.meta();
        engine.demote_slot(&self.state, self.info(&meta))
    }

    fn evict_batch(
        &self,
        batch: &[Arc<dyn Spillable>],
        engine: &DeviceEngine,
    ) -> Vec<Option<Tier>> {
        let _exclusive = engine.queues().exclusive();
        super::batch::evict_batch::<B>(batch, engine)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn mark_indexed(&self) {
        self.indexed.store(true, Ordering::Relaxed);
    }

    fn rebuild_plan(&self) -> Option<RebuildPlan> {
        Handle::rebuild_plan(self)
    }

    fn drop_for_rebuild(
        &self,
        _engine: &DeviceEngine,
        leaves: &[TensorId],
        transient: u64,
    ) -> bool {
        Handle::drop_for_rebuild(self, leaves, transient)
    }

    fn prefetch(&self, engine: &DeviceEngine) -> bool {
        let meta = || self.meta();
        engine.prefetch_slot(
            &self.state,
            self.info(&meta),
            |host| {
                let _exclusive = engine.queues().exclusive();
                self.upload(host)
            },
            |len| HostTensor::zeroed(len, self.shape.clone(), self.dtype),
        )
    }
}

/// The primitive of [`SpillBackend`](crate::SpillBackend) for every tensor kind.
///
/// Cloning is a reference-count increment. The inner primitive is moved into an op when this is
/// the only clone, so the inner backend may reuse the buffer in place exactly as it would
/// without burn-spill; when clones exist, the op gets a clone of the inner primitive instead.
pub struct SpillTensor<B: Backend> {
    handle: Arc<Handle<B>>,
}

impl<B: Backend> Clone for SpillTensor<B> {
    fn clone(&self) -> Self {
        Self {
            handle: self.handle.clone(),
        }
    }
}

impl<B: Backend> fmt::Debug for SpillTensor<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpillTensor")
            .field("id", &self.handle.id)
            .field("kind", &self.handle.kind)
            .field("shape", &self.handle.shape)
            .field("dtype", &self.handle.dtype)
            .field("device", &self.handle.device)
            .field("role", &self.handle.role)
            .finish()
    }
}

impl<B: Backend> TensorMetadata for SpillTensor<B> {
    fn dtype(&self) -> DType {
        self.handle.dtype
    }

    fn shape(&self) -> Shape {
        self.handle.shape.clone()
    }

    fn rank(&self) -> usize {
        self.handle.shape.num_dims()
    }
}

impl<B: Backend> QTensorPrimitive for SpillTensor<B> {
    fn scheme(&self) -> &QuantScheme {
        match &self.handle.dtype {
            DType::QFloat(scheme) => scheme,
            other => panic!(
                "burn-spill: scheme() asked of tensor {} whose dtype is {other:?}, not quantized",
                self.handle.id
            ),
        }
    }

    fn acc_precision(&self) -> QuantAcc {
        self.handle.quant.map_or(QuantAcc::F32, |q| q.acc_precision)
    }

    fn propagation(&self) -> QuantPropagation {
        self.handle
            .quant
            .map_or(QuantPropagation::Inhibit, |q| q.propagation)
    }

    fn default_scheme() -> QuantScheme {
        B::QuantizedTensorPrimitive::default_scheme()
    }
}

impl<B: Backend> SpillTensor<B> {
    fn wrap(primitive: Primitive<B>) -> Self {
        let (shape, dtype) = primitive.shape_dtype();
        let device = primitive.device();
        let quant = match &primitive {
            Primitive::Quantized(q) => Some(QuantFacts {
                acc_precision: q.acc_precision(),
                propagation: q.propagation(),
            }),
            _ => None,
        };
        let bytes = (shape.num_elements() as u64).saturating_mul(dtype.size() as u64);
        let role = if persistent_allocation_active() {
            TensorRole::Parameter
        } else {
            TensorRole::Other
        };
        let engine = super::queues::engine_with_queues::<B>(&device);
        // The thread that creates a tensor holds it in its stream's pool (CubeCL).
        engine.note_thread();
        engine.ledger().on_create(bytes, role);
        let evictable = round_trips_exactly(&primitive);
        if !evictable {
            engine.ledger().on_unevictable(bytes, true);
        }
        Self {
            handle: Arc::new(Handle {
                id: next_tensor_id(),
                kind: primitive.kind(),
                shape,
                dtype,
                device,
                bytes,
                role,
                quant,
                state: Slot::new(Residency::Device(primitive)),
                engine,
                indexed: AtomicBool::new(false),
                listed_at: AtomicU32::new(NOT_LISTED),
                evictable,
                recipe: OnceLock::new(),
            }),
        }
    }

    pub(super) fn from_handle(handle: Arc<Handle<B>>) -> Self {
        Self { handle }
    }

    /// A weak reference to the shared state, for a recipe that must not keep it alive.
    pub(super) fn weak_handle(&self) -> Weak<Handle<B>> {
        Arc::downgrade(&self.handle)
    }

    /// Gives this fresh output the recipe that rebuilds it.
    pub(crate) fn set_recipe(&self, recipe: Arc<Recipe<B>>) {
        // A fresh output has none yet; an op returning one of its inputs keeps the first.
        let _ = self.handle.recipe.set(recipe);
    }

    /// The held inputs of a dropped tensor (empty otherwise), for the op that rebuilds it.
    pub(crate) fn rebuild_inputs(&self) -> smallvec::SmallVec<[SpillTensor<B>; 3]> {
        self.handle.held_inputs()
    }

    /// Bytes of the ghosts the rebuild of this dropped tensor recomputes and lets go (see
    /// `recipe.rs`): room its op needs beside the rebuild's inputs.
    pub(crate) fn rebuild_transient_bytes(&self) -> u64 {
        self.handle.rebuild_transient_bytes()
    }

    /// This tensor's recipe, shared: the lineage a recipe reading it keeps.
    pub(crate) fn shared_recipe(&self) -> Option<Arc<Recipe<B>>> {
        self.handle.recipe.get().cloned()
    }

    /// The tier holding the bytes, or `None` when they were dropped to be rebuilt.
    pub(crate) fn tier_unless_dropped(&self) -> Option<Tier> {
        self.handle.tier_unless_dropped()
    }

    pub(crate) fn from_float(p: B::FloatTensorPrimitive) -> Self {
        Self::wrap(Primitive::Float(p))
    }

    pub(crate) fn from_int(p: B::IntTensorPrimitive) -> Self {
        Self::wrap(Primitive::Int(p))
    }

    pub(crate) fn from_bool(p: B::BoolTensorPrimitive) -> Self {
        Self::wrap(Primitive::Bool(p))
    }

    pub(crate) fn from_quantized(p: B::QuantizedTensorPrimitive) -> Self {
        Self::wrap(Primitive::Quantized(p))
    }

    /// The inner primitive for an op that consumes this handle, restored to the device first if
    /// it was spilled: moved out when this is the last clone (so `B` can work in place), cloned
    /// otherwise. A consumed handle goes to `retire`, emptied, so that an op scope can keep its
    /// bytes counted until the op's outputs exist. (Handed over rather than returned beside the
    /// primitive: a large primitive returned in a pair is copied twice more per op.)
    #[inline]
    pub(crate) fn take_primitive(mut self, retire: impl FnOnce(RetiredHandle<B>)) -> Primitive<B> {
        // No other clone and no weak reference (the engine's index or ample list, a recipe's
        // input): nothing else can reach the state, so its bytes are taken without the lock,
        // its two atomic read-modify-writes and the checks for a transfer in flight. This is
        // every consumed tensor of a device without a budget (270 instructions an op less on
        // the tiny Transformer, about 1% of its step on Flex); under a budget the engine holds
        // weak references to the tensors it may move.
        if let Some(handle) = Arc::get_mut(&mut self.handle) {
            let state = handle.state.get_mut();
            if matches!(state, Residency::Device(_)) {
                // The slot's lock-free tier needs no update: `Taken` reads as the device, as the
                // state it replaces does.
                let Residency::Device(primitive) = std::mem::replace(state, Residency::Taken)
                else {
                    unreachable!("matched above")
                };
                retire(RetiredHandle(self.handle));
                return primitive;
            }
        }
        // The last strong reference cannot gain a sibling except through the engine's weak
        // index, and an evictor that upgrades one finds the state `Taken` and lets it be. The
        // handle stays in its `Arc`: moving it out would copy the whole struct twice per op.
        let (mut state, moved) = self.handle.lock_resident();
        // Counted under the lock: a recipe upgrading its weak reference to this tensor reads
        // the state under it too, so it either counts here or finds the primitive taken.
        let unique = Arc::strong_count(&self.handle) == 1;
        let primitive = if unique {
            match std::mem::replace(&mut *state, Residency::Taken) {
                Residency::Device(p) => p,
                _ => self.handle.missing(),
            }
        } else {
            match &*state {
                Residency::Device(p) => p.clone(),
                _ => self.handle.missing(),
            }
        };
        drop(state);
        self.handle.after_restore(moved);
        if unique {
            retire(RetiredHandle(self.handle));
        }
        primitive
    }

    /// Runs `f` on a borrowed inner primitive (for `B` methods that take `&tensor`), restoring it
    /// first if it was spilled.
    pub(crate) fn with_primitive<R>(&self, f: impl FnOnce(&Primitive<B>) -> R) -> R {
        let (state, moved) = self.handle.lock_resident();
        let result = match &*state {
            Residency::Device(p) => f(p),
            _ => self.handle.missing(),
        };
        drop(state);
        self.handle.after_restore(moved);
        result
    }

    /// The device engine of this tensor.
    pub(crate) fn engine(&self) -> &'static Arc<DeviceEngine> {
        self.handle.engine
    }

    /// A weak reference for the engine's index, which must never keep a tensor alive.
    pub(crate) fn victim(&self) -> Weak<dyn Spillable> {
        let weak: Weak<Handle<B>> = Arc::downgrade(&self.handle);
        weak
    }

    /// Whether the engine may move this tensor off the device (see `layout.rs`).
    pub(crate) fn evictable(&self) -> bool {
        self.handle.evictable
    }

    /// Records where the engine listed this tensor while memory was ample. A tensor is listed
    /// once, as a fresh output: its drop empties only the place recorded here.
    pub(crate) fn mark_listed(&self, place: u32) {
        // A plain store: a swap here was one more atomic read-modify-write per tensor made while
        // memory is ample.
        debug_assert_eq!(
            self.handle.listed_at.load(Ordering::Relaxed),
            NOT_LISTED,
            "tensor {} listed twice",
            self.id()
        );
        self.handle.listed_at.store(place, Ordering::Relaxed);
    }

    /// Whether the engine's index holds this tensor (or will before any other thread can
    /// reach it: a fresh output is marked as its op indexes it).
    pub(crate) fn is_indexed(&self) -> bool {
        self.handle.indexed.load(Ordering::Relaxed)
    }

    /// Records that the engine's index now knows this tensor.
    pub(crate) fn mark_indexed(&self) {
        self.handle.indexed.store(true, Ordering::Relaxed);
    }

    /// Panics unless this handle holds a `wanted` primitive (a bug in burn-spill's tables).
    pub(crate) fn expect_kind(&self, wanted: TensorKind) {
        if self.handle.kind != wanted {
            self.kind_mismatch(wanted)
        }
    }

    fn kind_mismatch(&self, wanted: TensorKind) -> ! {
        panic!(
            "burn-spill: an op expected a {wanted:?} tensor but tensor {} is {:?}; this is a bug in burn-spill",
            self.handle.id, self.handle.kind
        )
    }

    /// The primitive of a tensor read outside the forwarding tables (reads, transactions): the
    /// read runs in its own op scope, so a restore stays within the budget.
    fn read_in_scope<T>(
        self,
        name: &'static str,
        take: impl FnOnce(&mut OpScope<B>, Self) -> T,
    ) -> T {
        let mut op = OpScope::new(name);
        op.input(&self);
        op.begin();
        take(&mut op, self)
    }

    /// Runs `read`, a read of this tensor's inner primitive by `B`, to completion now under the
    /// device's exclusive-work lock on backends that need one (their reads register work whose
    /// clone counts a worker must not change meanwhile); lazily otherwise, as `B` would.
    pub(crate) fn ordered_read<T: Send + 'static>(
        engine: &DeviceEngine,
        read: impl FnOnce() -> std::pin::Pin<Box<dyn Future<Output = T> + Send>>,
    ) -> std::pin::Pin<Box<dyn Future<Output = T> + Send>> {
        match engine.queues().exclusive() {
            Some(exclusive) => {
                let value = burn_std::future::block_on(read());
                drop(exclusive);
                Box::pin(std::future::ready(value))
            }
            None => read(),
        }
    }

    /// A read by `B` of this tensor's primitive, taken out by `take` (restored first, outside
    /// the exclusive-work lock: a prefetch in flight needs the lock to land), then read by
    /// `read` in [`ordered_read`](Self::ordered_read).
    pub(crate) fn read_ordered<P: Send + 'static, T: Send + 'static, F>(
        self,
        take: impl FnOnce(Self) -> P,
        read: impl FnOnce(P) -> F + Send + 'static,
    ) -> std::pin::Pin<Box<dyn Future<Output = T> + Send>>
    where
        F: Future<Output = T> + Send + 'static,
    {
        let engine = self.engine().clone();
        let primitive = take(self);
        Self::ordered_read(&engine, move || Box::pin(read(primitive)))
    }

    pub(crate) fn into_float(self) -> B::FloatTensorPrimitive {
        self.read_in_scope("float_read", OpScope::take_float)
    }

    pub(crate) fn into_int(self) -> B::IntTensorPrimitive {
        self.read_in_scope("int_read", OpScope::take_int)
    }

    pub(crate) fn into_bool(self) -> B::BoolTensorPrimitive {
        self.read_in_scope("bool_read", OpScope::take_bool)
    }

    pub(crate) fn into_quantized(self) -> B::QuantizedTensorPrimitive {
        self.read_in_scope("q_read", OpScope::take_quantized)
    }

    /// The process-wide id of this tensor (shared by its clones).
    pub fn id(&self) -> TensorId {
        self.handle.id
    }

    /// Which primitive kind this handle holds.
    pub fn kind(&self) -> TensorKind {
        self.handle.kind
    }

    /// The device the tensor lives on, from the cache.
    pub fn device(&self) -> B::Device {
        self.handle.device.clone()
    }

    /// The dimensions of the shape, without copying it (`shape()` returns an owned `Shape`).
    pub(crate) fn shape_dims(&self) -> &[usize] {
        self.handle.shape.as_slice()
    }

    /// Logical size in bytes: elements x dtype size.
    pub fn bytes(&self) -> u64 {
        self.handle.bytes
    }

    /// Whether the tensor was created as a module parameter.
    pub fn role(&self) -> TensorRole {
        self.handle.role
    }

    /// Which tier holds the tensor's bytes, once the device's transfer workers are idle (so
    /// that the answer does not depend on how far a background move has got).
    pub fn residency(&self) -> Tier {
        self.handle.engine.quiesce();
        self.handle.tier()
    }

    /// Test hook: changes this tensor's host copy as faulty memory would, so that tests can
    /// show a restore catching it (`SpillConfig::verify_restores`). A buffer of its own gets one
    /// byte flipped; a slice of a batch buffer, which its batch shares read-only, gets the
    /// checksum it is checked against flipped instead (the check sees the two the same way).
    /// Returns false when the tensor is not on the host.
    #[doc(hidden)]
    pub fn corrupt_host_copy_for_tests(&self) -> bool {
        self.handle.engine.quiesce();
        let mut state = self.handle.state.lock();
        let Residency::Host { copy, crc } = &mut *state else {
            return false;
        };
        match copy.own_bytes_mut() {
            Some(bytes) if !bytes.is_empty() => bytes[bytes.len() / 2] ^= 0x10,
            _ => *crc = crc.map(|c| c ^ 0x10),
        }
        true
    }
}

/// An emptied handle whose bytes an op consumed. Keeping it alive keeps those bytes counted on
/// the device until the op's outputs are counted too, which is what the device really holds
/// while the op runs.
pub(crate) struct RetiredHandle<B: Backend>(#[allow(dead_code)] Arc<Handle<B>>);

#[cfg(all(test, feature = "flex", debug_assertions))]
mod tests {
    use burn_backend::TensorData;
    use burn_backend::ops::FloatTensorOps;
    use burn_flex::Flex;

    use super::*;

    #[test]
    #[should_panic(expected = "gave a layout its original did not have")]
    fn a_rebuild_in_another_layout_is_caught_in_debug_builds() {
        let values: Vec<f32> = (0..9).map(|v| v as f32).collect();
        let original = Flex::float_from_data(TensorData::new(values, [3, 3]), &Default::default());
        let tensor = SpillTensor::<Flex>::from_float(original.clone());
        // Same dtype and shape, transposed strides.
        let transposed = Flex::float_swap_dims(original, 0, 1);
        tensor
            .handle
            .check_rebuilt(&Primitive::Float(transposed), "float_exp");
    }
}
