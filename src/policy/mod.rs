//! Decisions: which tensor leaves a tier when room is needed, and what comes back early.
//!
//! - The use plan ([`UsePlan`]): from a recorded step, when each tensor of the next step is used.
//! - The victim policies ([`Lru`], [`NextUsePolicy`], [`CostAware`]) as ranks over
//!   [`Candidate`]s; [`PolicyKind`] picks one in a `SpillConfig`.
//! - Offline replay of a recorded step under a budget ([`replay`]), with Belady's MIN for
//!   reference: what a budget costs in bytes moved, before training.
//! - The step in windows of ops, each checked against the measured bandwidth.
//! - When the inner allocator's free pages go back to the driver.
//! - Whether a victim is moved or dropped to be recomputed ([`RecomputeMode`]).
//!
//! Nothing here names a Burn type; everything is unit-tested on synthetic tapes.

pub(crate) mod ample;
pub(crate) mod handoff;
pub(crate) mod plan;
pub(crate) mod pool;
pub(crate) mod prefetch;
pub mod recompute;
pub(crate) mod simulate;
pub(crate) mod victim;
pub(crate) mod windows;

pub use plan::{KeyAt, NextUse, PlanKey, UsePlan};
pub use recompute::RecomputeMode;
pub use simulate::{Replay, replay};
pub use victim::{Bandwidth, Candidate, CostAware, Lru, NextUsePolicy, VictimPolicy};

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::SpillError;

/// The victim policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    /// Evict the tensor whose last use (as an op input or output) is oldest.
    #[default]
    Lru,
    /// Evict the tensor whose next use on the tape is furthest away (Belady's rule).
    NextUse,
    /// Evict the tensor with the lowest cost to bring back per byte freed and per op of
    /// distance to its next use, from measured bandwidth per direction.
    CostAware,
}

impl PolicyKind {
    /// The names `FromStr` accepts.
    pub const ACCEPTED: &'static str = "lru, next_use, cost_aware";
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyKind::Lru => f.write_str("lru"),
            PolicyKind::NextUse => f.write_str("next_use"),
            PolicyKind::CostAware => f.write_str("cost_aware"),
        }
    }
}

impl FromStr for PolicyKind {
    type Err = SpillError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().replace('-', "_").as_str() {
            "lru" => Ok(PolicyKind::Lru),
            "next_use" | "nextuse" | "belady" => Ok(PolicyKind::NextUse),
            "cost_aware" | "costaware" => Ok(PolicyKind::CostAware),
            _ => Err(SpillError::InvalidValue {
                field: "policy",
                value: s.to_string(),
                accepted: Self::ACCEPTED,
            }),
        }
    }
}
