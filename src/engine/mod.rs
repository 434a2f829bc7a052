//! The Burn-free part of burn-spill: bookkeeping that works on any payload.
//!
//! Nothing here names a Burn type. The adapter in [`crate::backend`] identifies devices with a
//! [`DeviceKey`] and reports handle creations and drops to the device's [`Ledger`].

pub mod ledger;
pub mod registry;

pub use ledger::{Ledger, LiveSummary, TensorRole};
pub use registry::{DeviceKey, ledger_for};
