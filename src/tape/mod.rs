//! The tape: each training step's ops, tensors and drops, recorded per device.
//!
//! [`recorder`] fills it on the hot path; [`model`] is the finished step as plain data.

pub mod analysis;
pub mod export;
pub mod identity;
pub mod model;
pub mod period;
pub mod recorder;

pub use analysis::{CriticalPath, Edge, PeakLive, StepAnalysis, TensorLife};
pub use export::{TapeFormat, from_json, render, to_dot, to_json, to_perfetto, write_file};
pub use identity::{Divergence, Position, positions, same_program, twins};
pub use model::{
    DropRecord, OpRecord, Producer, StepTape, TAPE_SCHEMA_VERSION, TensorRecord, TierSample,
};
pub use period::{PeriodDetector, op_signature};
pub use recorder::{Recorder, TapeCounters, TensorView};
