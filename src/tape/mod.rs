//! The tape: each training step's ops, tensors and drops, recorded per device.
//!
//! [`recorder`] fills it on the hot path; [`model`] is the finished step as plain data.

pub mod model;
pub mod recorder;

pub use model::{DropRecord, OpRecord, Producer, StepTape, TAPE_SCHEMA_VERSION, TensorRecord};
pub use recorder::{Recorder, TapeCounters, TensorView};
