//! # burn-spill
//!
//! A [Burn](https://burn.dev) backend decorator that lets a model train in less device memory
//! than it needs. `SpillBackend<B>` wraps any Burn 0.21 backend `B`; swap it in under `Autodiff`
//! and give the device a budget:
//!
//! ```
//! use burn::backend::{Autodiff, Flex};
//! use burn_spill::{SpillBackend, SpillConfig};
//!
//! type B = Autodiff<SpillBackend<Flex>>; // was Autodiff<Flex>; the same with Cuda or Wgpu
//! let device = Default::default();
//! SpillBackend::<Flex>::configure(&device, SpillConfig::transformer().device_budget_bytes(20 << 30))?;
//! // ... build the model on `B` and train as before ...
//! # SpillBackend::<Flex>::configure(&device, SpillConfig::default())?;
//! # Ok::<(), burn_spill::SpillError>(())
//! ```
//!
//! Every tensor gets its own [`SpillTensor`] handle whose metadata is cached, and every op is
//! forwarded to `B`'s own kernel, so results are bit-identical to running on `B`. Before each op
//! the op's inputs are brought back to the device and the coldest other tensors are moved to
//! host memory (and from there, past the host limit, to a spill file) until the op fits the
//! budget. [`SpillBackend::stats`] tells what moved.
//!
//! The root holds what a training loop needs: the backend and its handle, [`SpillConfig`] and
//! its presets, [`SpillStats`], [`SpillError`], the step markers ([`SpillBackend::step`]) and
//! burn-train's marked strategy ([`WithSpillSteps`]). The recorded steps and their analysis are
//! in [`tape`]; the use plan, the victim policies and offline replay in [`policy`]; checking a
//! program of your own against the plain backend, bit for bit, in [`verify`].

#![warn(missing_docs)]

mod backend;
mod config;
mod engine;
mod error;
mod fast_hash;
pub mod plan;
pub mod policy;
mod stats;
pub mod tape;
pub use backend::verify;

pub use backend::learner::{SpillSteps, SpillStrategy, WithSpillSteps};
pub use backend::tensor::{SpillTensor, TensorKind};
pub use backend::{SpillBackend, StepGuard};
pub use config::{
    DeviceBudget, ENV_BUDGET, ENV_DIR, ENV_EARLY_ROOM, ENV_HOST_LIMIT, ENV_KEEP_STATE, ENV_POLICY,
    ENV_PRESET, ENV_REBUILD_PROFILE, ENV_REBUILD_ROOM, ENV_RECOMPUTE, ENV_REMOTE, ENV_TIER_ORDER,
    ENV_VERIFY, Preset, SpillConfig, TierOrder, parse_bytes,
};
pub use engine::{LiveSummary, PoolUsage, TensorId, TensorRole, Tier};
pub use error::SpillError;
pub use policy::{PolicyKind, RecomputeMode};
pub use stats::{
    ColdTierStats, MoveStats, PoolStats, RecomputeStats, SpillStats, StepStats, TierBytes,
};
