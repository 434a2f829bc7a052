//! # burn-spill
//!
//! A [Burn](https://burn.dev) backend decorator that lets a model train in less device memory
//! than it needs. `SpillBackend<B>` wraps any Burn 0.21 backend `B`; swap it in under `Autodiff`
//! and nothing else changes:
//!
//! ```ignore
//! type B = Autodiff<SpillBackend<Cuda>>; // was Autodiff<Cuda>
//! ```
//!
//! Every tensor gets its own [`SpillTensor`] handle whose metadata is cached, and every op is
//! forwarded to `B`'s own kernel, so results are bit-identical to running on `B`.

mod backend;
mod engine;

pub use backend::SpillBackend;
pub use backend::tensor::{SpillTensor, TensorId, TensorKind};
pub use engine::{LiveSummary, TensorRole};
