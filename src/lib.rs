//! # burn-spill
//!
//! A [Burn](https://burn.dev) backend decorator that lets a model train in less device memory
//! than it needs. `SpillBackend<B>` wraps any Burn 0.21 backend `B`; swap it in under `Autodiff`
//! and give the device a budget:
//!
//! ```ignore
//! type B = Autodiff<SpillBackend<Cuda>>; // was Autodiff<Cuda>
//! SpillBackend::<Cuda>::configure(&device, SpillConfig::transformer().device_budget_bytes(20 << 30))?;
//! ```
//!
//! Every tensor gets its own [`SpillTensor`] handle whose metadata is cached, and every op is
//! forwarded to `B`'s own kernel, so results are bit-identical to running on `B`. Before each op
//! the op's inputs are brought back to the device and the coldest other tensors are moved to
//! host memory (and from there, past the host limit, to a spill file) until the op fits the
//! budget. [`SpillBackend::stats`] tells what moved.

mod backend;
mod config;
mod engine;
mod error;
mod hashing;
mod policy;
mod stats;
mod tape;

pub use backend::learner::{SpillSteps, SpillStrategy, WithSpillSteps};
pub use backend::tensor::{SpillTensor, TensorKind};
pub use backend::{SpillBackend, StepGuard};
pub use config::{
    DeviceBudget, ENV_BUDGET, ENV_DIR, ENV_HOST_LIMIT, ENV_POLICY, ENV_PRESET, Preset, SpillConfig,
    parse_bytes,
};
pub use engine::PoolUsage;
pub use engine::{LiveSummary, TensorId, TensorRole, Tier};
pub use error::SpillError;
pub use policy::PolicyKind;
pub use policy::plan::{KeyAt, NextUse, PlanKey, UsePlan};
pub use policy::simulate::{Replay, replay};
pub use policy::victim::{Bandwidth, Candidate, CostAware, Lru, NextUsePolicy, VictimPolicy};
pub use stats::{MoveStats, PoolStats, SpillStats, StepStats, TierBytes};
pub use tape::{
    CriticalPath, Divergence, DropRecord, Edge, OpRecord, PeakLive, PeriodDetector, Position,
    Producer, StepAnalysis, StepTape, TAPE_SCHEMA_VERSION, TapeCounters, TapeFormat, TensorLife,
    TensorRecord, TierSample, from_json, op_signature, positions, render, same_program, to_dot,
    to_json, to_perfetto, twins, write_file,
};
