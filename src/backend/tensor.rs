//! `SpillTensor<B>`: the one handle type behind float, int, bool and quantized tensors.
//!
//! A handle is a shared pointer to a [`Handle`] that caches everything metadata queries need
//! (id, shape, dtype, device), so `shape()`, `dtype()` and `*_device()` never touch the inner
//! tensor. When the last clone drops, the device's ledger learns it.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use burn_backend::quantization::QuantScheme;
use burn_backend::{Backend, DType, QTensorPrimitive, Shape, TensorMetadata, TensorPrimitive};
use burn_std::quantization::{QuantAcc, QuantPropagation};

use super::device::{device_key, persistent_allocation_active};
use crate::engine::{Ledger, TensorRole, ledger_for};

/// A process-wide unique tensor id. Clones of a handle share it.
pub type TensorId = u64;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

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
    bytes: u64,
    role: TensorRole,
    quant: Option<QuantFacts>,
    /// `None` only transiently, after an op took the primitive out of a unique handle.
    primitive: Mutex<Option<Primitive<B>>>,
    ledger: Arc<Ledger>,
}

impl<B: Backend> Handle<B> {
    fn lock(&self) -> MutexGuard<'_, Option<Primitive<B>>> {
        // A panic inside an inner op never happens while this lock is held (ops run on moved or
        // cloned primitives), so poisoning can only come from a panic in a metadata call of `B`;
        // the primitive itself is still intact.
        self.primitive.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn missing(&self) -> ! {
        panic!(
            "burn-spill: tensor {} ({:?}, {:?}, {:?}) has no primitive; this is a bug in burn-spill",
            self.id, self.kind, self.dtype, self.shape
        )
    }
}

impl<B: Backend> Drop for Handle<B> {
    fn drop(&mut self) {
        self.ledger.on_drop(self.bytes, self.role);
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
        let ledger = ledger_for(device_key::<B>(&device));
        ledger.on_create(bytes, role);
        Self {
            handle: Arc::new(Handle {
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                kind: primitive.kind(),
                shape,
                dtype,
                device,
                bytes,
                role,
                quant,
                primitive: Mutex::new(Some(primitive)),
                ledger,
            }),
        }
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

    pub(crate) fn from_tensor_primitive(
        p: TensorPrimitive<B>,
    ) -> TensorPrimitive<crate::SpillBackend<B>> {
        match p {
            TensorPrimitive::Float(f) => TensorPrimitive::Float(Self::from_float(f)),
            TensorPrimitive::QFloat(q) => TensorPrimitive::QFloat(Self::from_quantized(q)),
        }
    }

    /// The inner primitive for an op that consumes this handle: moved out when this is the last
    /// clone (so `B` can work in place), cloned otherwise.
    pub(crate) fn into_primitive(self) -> Primitive<B> {
        match Arc::try_unwrap(self.handle) {
            Ok(handle) => {
                let taken = handle.lock().take();
                taken.unwrap_or_else(|| handle.missing())
            }
            Err(shared) => {
                let guard = shared.lock();
                guard.as_ref().cloned().unwrap_or_else(|| shared.missing())
            }
        }
    }

    /// Runs `f` on a borrowed inner primitive (for `B` methods that take `&tensor`).
    pub(crate) fn with_primitive<R>(&self, f: impl FnOnce(&Primitive<B>) -> R) -> R {
        let guard = self.handle.lock();
        f(guard.as_ref().unwrap_or_else(|| self.handle.missing()))
    }

    fn kind_mismatch(&self, wanted: TensorKind) -> ! {
        panic!(
            "burn-spill: an op expected a {wanted:?} tensor but tensor {} is {:?}; this is a bug in burn-spill",
            self.handle.id, self.handle.kind
        )
    }

    pub(crate) fn into_float(self) -> B::FloatTensorPrimitive {
        if self.handle.kind != TensorKind::Float {
            self.kind_mismatch(TensorKind::Float)
        }
        match self.into_primitive() {
            Primitive::Float(p) => p,
            _ => unreachable!("kind checked above"),
        }
    }

    pub(crate) fn into_int(self) -> B::IntTensorPrimitive {
        if self.handle.kind != TensorKind::Int {
            self.kind_mismatch(TensorKind::Int)
        }
        match self.into_primitive() {
            Primitive::Int(p) => p,
            _ => unreachable!("kind checked above"),
        }
    }

    pub(crate) fn into_bool(self) -> B::BoolTensorPrimitive {
        if self.handle.kind != TensorKind::Bool {
            self.kind_mismatch(TensorKind::Bool)
        }
        match self.into_primitive() {
            Primitive::Bool(p) => p,
            _ => unreachable!("kind checked above"),
        }
    }

    pub(crate) fn into_quantized(self) -> B::QuantizedTensorPrimitive {
        if self.handle.kind != TensorKind::Quantized {
            self.kind_mismatch(TensorKind::Quantized)
        }
        match self.into_primitive() {
            Primitive::Quantized(p) => p,
            _ => unreachable!("kind checked above"),
        }
    }

    pub(crate) fn into_tensor_primitive(
        p: TensorPrimitive<crate::SpillBackend<B>>,
    ) -> TensorPrimitive<B> {
        match p {
            TensorPrimitive::Float(f) => TensorPrimitive::Float(f.into_float()),
            TensorPrimitive::QFloat(q) => TensorPrimitive::QFloat(q.into_quantized()),
        }
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

    /// Logical size in bytes: elements x dtype size.
    pub fn bytes(&self) -> u64 {
        self.handle.bytes
    }

    /// Whether the tensor was created as a module parameter.
    pub fn role(&self) -> TensorRole {
        self.handle.role
    }
}
