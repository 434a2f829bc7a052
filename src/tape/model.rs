//! The tape of one training step, as plain data: what analysis reads and export writes.
//!
//! The recorder fills flat, reused buffers on the hot path and turns them into a [`StepTape`]
//! once per step, so these types may allocate freely.

use serde::{Deserialize, Serialize};

use crate::engine::{TensorId, TensorRole};

/// The version of the JSON schema of [`StepTape`] (see `docs/tape-schema.md`).
pub const TAPE_SCHEMA_VERSION: u32 = 1;

/// Where a tensor came from: output `output` of op `op` (indices within the step).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Producer {
    /// Index of the producing op in [`StepTape::ops`].
    pub op: u32,
    /// Which of the op's outputs.
    pub output: u8,
}

/// One tensor the step touched.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorRecord {
    /// The handle's id (unique in the process, not across steps).
    pub id: TensorId,
    /// Logical size: elements x dtype size.
    pub bytes: u64,
    /// The dtype, as Burn prints it (`F32`, `Bool(U8)`, ...).
    pub dtype: String,
    /// The shape.
    pub shape: Vec<usize>,
    /// Whether it was created as a module parameter.
    pub role: TensorRole,
    /// The op of this step that made it; `None` for tensors from before the step (parameters,
    /// optimizer state, inputs made outside `SpillBackend`'s ops).
    pub producer: Option<Producer>,
}

/// One op call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpRecord {
    /// The Burn ops-trait method (`float_matmul`, `conv2d_weight_backward`, ...).
    pub name: String,
    /// Tensor ids read, in argument order.
    pub inputs: Vec<TensorId>,
    /// Tensor ids produced, in result order.
    pub outputs: Vec<TensorId>,
    /// Start, in nanoseconds since the step began, on a clock that stops while the recorder
    /// appends ops and drops (so that the gaps between ops are the program's own host work).
    pub start_ns: u64,
    /// Wall duration of the call (including any restore it waited for).
    pub duration_ns: u64,
    /// A small number identifying the calling thread.
    pub thread: u64,
}

/// A tensor's last handle dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DropRecord {
    /// The tensor.
    pub id: TensorId,
    /// The number of ops recorded before the drop (so 0 = before the first op).
    pub after_ops: u32,
}

/// Everything one step did, in order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepTape {
    /// Schema version ([`TAPE_SCHEMA_VERSION`]).
    pub version: u32,
    /// The step's number on its device, from 0.
    pub step: u64,
    /// Whether the step was bounded by markers (`step_begin`) or found by period detection.
    pub marked: bool,
    /// The ops, in call order.
    pub ops: Vec<OpRecord>,
    /// Every tensor an op read or produced, each once.
    pub tensors: Vec<TensorRecord>,
    /// Tensors whose last handle dropped during the step.
    pub drops: Vec<DropRecord>,
    /// Duration of the step in nanoseconds, on the ops' clock (the recorder's own time left out).
    pub duration_ns: u64,
    /// Resident bytes per tier after each recorded op (absent in tapes written before it
    /// existed).
    #[serde(default)]
    pub tiers: Vec<TierSample>,
}

/// Bytes resident in each tier at one moment, for the "resident bytes" counter of
/// [`to_perfetto`](crate::tape::to_perfetto).
///
/// `t_ns` is on the tape's clock: nanoseconds since the step began, like
/// [`OpRecord::start_ns`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierSample {
    /// When the sample was taken, in nanoseconds since the step began.
    pub t_ns: u64,
    /// Bytes on the device.
    pub device: u64,
    /// Bytes in host buffers.
    pub host: u64,
    /// Bytes in spill files.
    pub disk: u64,
}
