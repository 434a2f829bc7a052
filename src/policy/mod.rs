//! Victim choice: which tensor leaves a tier when room is needed.
//!
//! Only least-recently-used exists for now; the tape-driven policies (next use, cost aware)
//! arrive with the tape. The engine's index keeps each tier ordered by last use, so LRU is
//! "take from the cold end".

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
}

impl PolicyKind {
    /// The names `FromStr` accepts.
    pub const ACCEPTED: &'static str = "lru";
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyKind::Lru => f.write_str("lru"),
        }
    }
}

impl FromStr for PolicyKind {
    type Err = SpillError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "lru" => Ok(PolicyKind::Lru),
            _ => Err(SpillError::InvalidValue {
                field: "policy",
                value: s.to_string(),
                accepted: Self::ACCEPTED,
            }),
        }
    }
}
