//! The Burn-free part of burn-spill: tiers, budget and bookkeeping that work on any payload.
//!
//! Nothing here names a Burn type. The adapter in [`crate::backend`] identifies devices with a
//! [`DeviceKey`], keeps each tensor's [`Residency`] in its handle, implements [`Spillable`] for
//! the handle, and asks the device's [`DeviceEngine`] to make room before ops and to move bytes.

pub(crate) mod at_exit;
pub mod cold;
pub mod cold_tiers;
pub mod device;
pub mod disk;
pub mod index;
pub(crate) mod integrity;
pub mod ledger;
pub(crate) mod pool;
pub mod queues;
pub mod registry;
#[cfg(feature = "remote")]
pub mod remote;
pub mod slot;
pub(crate) mod thread_counts;
pub mod transfer;

pub use device::{DeviceEngine, HandOver, Limits, OpInput, OpOutput, OpTicket, UntrackedOp};
pub use index::{AliveInput, GhostPlan, RebuildInput, RebuildPlan, Spillable};
pub use ledger::{LiveSummary, TensorRole};
pub use queues::{DeviceQueues, ExclusiveLock, ExclusiveWork, PoolUsage};
pub use registry::{DeviceKey, engine_ref};
pub use slot::{Residency, Slot, SlotGuard, SlotInfo, TensorId, Tier};
