//! `SpillError`: what went wrong with a configuration, and how to fix it.
//!
//! Ops cannot return errors in Burn, so this type only comes out of configuration calls
//! ([`SpillBackend::configure`](crate::SpillBackend::configure), [`SpillConfig`](crate::SpillConfig)
//! parsing). Faults during training that would lose data panic instead, naming the tensor.

use std::path::PathBuf;

/// An invalid configuration value, or an environment that cannot host the spill tiers.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpillError {
    /// A field holds a value outside what it accepts.
    #[error("burn-spill: `{field}` = {value:?} is not valid; accepted: {accepted}")]
    InvalidValue {
        /// The configuration field or environment variable.
        field: &'static str,
        /// The rejected value, as given.
        value: String,
        /// What the field accepts.
        accepted: &'static str,
    },

    /// A budget was given as a fraction of device memory, but the size of the device's memory is
    /// unknown.
    #[error(
        "burn-spill: device_budget is a fraction ({fraction}) of device memory, but backend `{backend}` \
         cannot report its memory size; give the budget in bytes (`device_budget_bytes`) or set \
         `device_memory_bytes` in the config"
    )]
    DeviceMemoryUnknown {
        /// The requested fraction.
        fraction: f64,
        /// The inner backend's name.
        backend: String,
    },

    /// The spill directory could not be created or written.
    #[error(
        "burn-spill: spill_dir {path:?} cannot be used: {source}; choose a writable directory \
         (config `spill_dir` or BURN_SPILL_DIR)"
    )]
    SpillDir {
        /// The directory (or its parent) that failed.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// The spill directory was changed while tensors are stored in the old one.
    #[error(
        "burn-spill: cannot move the spill directory to {requested:?} while {records} tensors are \
         stored in {current:?}; configure the directory before training or drop those tensors first"
    )]
    SpillDirInUse {
        /// The directory holding records now.
        current: PathBuf,
        /// The directory asked for.
        requested: PathBuf,
        /// How many records it holds.
        records: usize,
    },
}
