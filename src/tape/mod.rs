//! The tape: each training step's ops, tensors and drops, recorded per device.
//!
//! A per-device recorder fills it on the hot path; a finished step is plain data
//! ([`StepTape`]).

pub(crate) mod analysis;
pub(crate) mod export;
pub(crate) mod identity;
pub(crate) mod model;
pub(crate) mod period;
pub(crate) mod recorder;

pub use analysis::{CriticalPath, Edge, PeakLive, StepAnalysis, TensorLife};
pub use export::{TapeFormat, from_json, render, to_dot, to_json, to_perfetto, write_file};
pub use identity::{Divergence, Position, positions, same_program, twins};
pub use model::{
    DropRecord, OpRecord, Producer, StepTape, TAPE_SCHEMA_VERSION, TensorRecord, TierSample,
};
pub use period::{PeriodDetector, op_signature};
pub use recorder::{CHECK_ONE_IN, COUNT_AFTER_VERIFIED_OPS, TapeCounters};
pub(crate) use recorder::{Recorder, TensorView};
