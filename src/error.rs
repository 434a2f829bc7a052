//! `SpillError`: what went wrong with a configuration, and how to fix it.
//!
//! Ops cannot return errors in Burn, so this type only comes out of configuration calls
//! ([`SpillBackend::configure`](crate::SpillBackend::configure), [`SpillConfig`](crate::SpillConfig)
//! parsing) and of tape export and import. Faults during training that would lose data panic
//! instead, naming the tensor.

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

    /// The spill directory could not be created or written, or another user could tamper with
    /// it.
    #[error(
        "burn-spill: spill_dir {path:?} cannot be used: {source}; choose a directory this user \
         owns and can write (config `spill_dir` or BURN_SPILL_DIR)"
    )]
    SpillDir {
        /// The directory (or its parent) that failed.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// The remote cold tier could not be set up: the server is unreachable, refused the
    /// credentials, or another server holds this device's records.
    #[error("burn-spill: remote_tier {url}: {reason} (config `remote_tier` or BURN_SPILL_REMOTE)")]
    RemoteTier {
        /// The server's URL, any password hidden.
        url: String,
        /// What went wrong and how to fix it.
        reason: String,
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

    /// An exported tape (JSON, DOT, trace) could not be written.
    #[error(
        "burn-spill: cannot write {path:?}: {source}; give a file path inside an existing \
         directory you can write to"
    )]
    Export {
        /// The file that was to be written.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// A tape was asked for before any step was recorded on the device.
    #[error(
        "burn-spill: no step has been recorded on this device yet; mark steps with \
         `SpillBackend::step_begin` (or `step`) or turn recording on with `record_tape`"
    )]
    NoTape,

    /// A tape read back from JSON is not JSON or lacks the schema's structure.
    #[error(
        "burn-spill: the tape JSON is malformed: {source}; give the unchanged output of \
         `to_json` (schema in docs/tape-schema.md)"
    )]
    TapeJson {
        /// The parser's error, with line and column.
        #[source]
        source: serde_json::Error,
    },

    /// A tape read back from JSON has another schema version than this build reads.
    #[error(
        "burn-spill: the tape has schema version {found}, but this build reads version \
         {expected}; read it with the burn-spill version that wrote it, or record the step again"
    )]
    TapeVersion {
        /// The tape's `version`.
        found: u32,
        /// [`TAPE_SCHEMA_VERSION`](crate::tape::TAPE_SCHEMA_VERSION).
        expected: u32,
    },
    /// A device profile for the dry-run planner is unknown, does not parse, or holds a figure
    /// that is missing, negative or zero.
    #[error("burn-spill: device profile {profile}: {reason}")]
    Profile {
        /// The profile's name or file.
        profile: String,
        /// What was wrong and what is accepted.
        reason: String,
    },

    /// A dry run was asked for with a budget no op of the step can run under: the largest op's
    /// own inputs and outputs need more.
    #[error(
        "burn-spill: a device budget of {budget} bytes is below what op {op} (`{name}`) needs on its own ({needed} bytes of inputs and outputs); plan with a budget of at least {needed} bytes"
    )]
    PlanBudget {
        /// The budget asked for.
        budget: u64,
        /// The op's index on the tape.
        op: usize,
        /// The op's name.
        name: String,
        /// Its inputs and outputs.
        needed: u64,
    },

    /// A dry run with the step's state kept on the device
    /// ([`StateResidency::Pinned`](crate::plan::StateResidency::Pinned)) was asked for with a
    /// budget below what some op needs beside that state.
    #[error(
        "burn-spill: a device budget of {budget} bytes is below what op {op} (`{name}`) needs with the step's state kept on the device ({state} bytes of state alive then, {needed} bytes with its own inputs and outputs); plan with a budget of at least {needed} bytes, or let the state move"
    )]
    PlanStateBudget {
        /// The budget asked for.
        budget: u64,
        /// The op's index on the tape.
        op: usize,
        /// The op's name.
        name: String,
        /// Bytes of state alive as it runs.
        state: u64,
        /// That state and the op's own other inputs and outputs.
        needed: u64,
    },

    /// A batch search was given tapes it cannot compare.
    #[error("burn-spill: batch search: {reason}")]
    BatchSearch {
        /// What was wrong and what is accepted.
        reason: String,
    },
}
