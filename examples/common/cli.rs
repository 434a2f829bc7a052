//! The flags both examples share, their parsers, and the one error format: a bad value is one
//! line on stderr naming the flag and what it accepts, and the exit code is 2.

use std::path::{Path, PathBuf};
use std::str::FromStr;

pub use super::usage::{exit_usage, parse_flags};
use burn_spill::policy::recompute::EarlyRoom;
use burn_spill::{
    ENV_BUDGET, ENV_DIR, ENV_EARLY_ROOM, ENV_HOST_LIMIT, ENV_POLICY, ENV_PRESET,
    ENV_REBUILD_PROFILE, ENV_RECOMPUTE, ENV_VERIFY, PolicyKind, Preset, RecomputeMode,
};

use super::backends::BackendKind;

/// Flags about where to train and how to spill.
#[derive(clap::Args, Clone, Debug)]
pub struct SpillArgs {
    /// The inner backend: flex, ndarray, wgpu or cuda (each needs its cargo feature).
    #[arg(long, default_value = BackendKind::DEFAULT_NAME, value_parser = BackendKind::parse)]
    pub backend: BackendKind,

    /// The spilled run's device budget: bytes (`512MiB`, `1.5GB`, `0`), a percentage of the
    /// plain run's measured peak (`30%`), or `unlimited`.
    #[arg(long, default_value = "30%", value_parser = Amount::parse_budget)]
    pub budget: Amount,

    /// Watermarks and prefetch window: cnn, rnn, transformer or gan (default: the model's own).
    #[arg(long, value_parser = parse_preset)]
    pub preset: Option<Preset>,

    /// Which tensors leave the device first (default: the preset's).
    #[arg(long, value_parser = parse_policy)]
    pub policy: Option<PolicyKind>,

    /// What the spilled run does with its victims: swap (moves them: the library's default),
    /// recompute (drops every one it may and rebuilds it at its next use, as DTR does) or both
    /// (each plan runs the way a dry run of the recorded step predicts fastest).
    #[arg(long, default_value = "swap", value_parser = parse_recompute)]
    pub recompute: RecomputeMode,

    /// The device profile a rebuild is timed on and, under recompute and both, the recorded
    /// step dry-run on: h200-pcie5, h100-pcie5, a100-pcie4, rtx4090-pcie4, gh200-c2c,
    /// measured, or a profile JSON file (default: measured on Flex and NdArray, rtx4090-pcie4
    /// on wgpu and CUDA).
    #[arg(long, value_parser = parse_plan_device)]
    pub rebuild_profile: Option<String>,

    /// How the spilled run makes room early for the step's coming peak: off, at_once or paced
    /// (default: chosen per plan under recompute and both, paced under swap).
    #[arg(long, value_parser = parse_early_room)]
    pub early_room: Option<EarlyRoom>,

    /// The host tier's limit, past which spilled bytes go to disk: bytes, a percentage of the
    /// plain run's peak, or `unlimited`.
    #[arg(long, default_value = "unlimited", value_parser = Amount::parse_host_limit)]
    pub host_limit: Amount,

    /// Where the spill file's private directory is made (default: the system temp dir). It is
    /// created if missing.
    #[arg(long, value_parser = parse_spill_dir)]
    pub spill_dir: Option<PathBuf>,

    /// How CubeCL's allocator carves wgpu memory into pages: sliced (CubeCL's default: tensors
    /// share large pages, which go back only when wholly free) or exclusive (a page per
    /// allocation, so freed bytes can be returned at once). Applies to both runs.
    #[arg(long, value_parser = super::backends::PoolPages::parse)]
    pub pool_pages: Option<super::backends::PoolPages>,

    /// Also compare every loss and the final parameters of the plain and spilled runs bit for
    /// bit (the plain run then trains every step, not only enough to time it); exit 1 if they
    /// differ.
    #[arg(long)]
    pub verify: bool,

    /// Check every restore of the spilled run against a CRC32 taken when the bytes left the
    /// device (`SpillConfig::verify_restores`); a mismatch panics naming the tensor.
    #[arg(long)]
    pub verify_restores: bool,

    /// Write a JSON report here, and next to it (same name, `.svg`) a plot of the resident
    /// bytes per tier over one spilled step.
    #[arg(long, value_parser = parse_output_file)]
    pub report: Option<PathBuf>,

    /// Write one spilled step as a Chrome/Perfetto trace here (open it in ui.perfetto.dev).
    #[arg(long, value_parser = parse_output_file)]
    pub trace: Option<PathBuf>,

    /// Write one spilled step's tape here as JSON (the input of the `plan` example).
    #[arg(long, value_parser = parse_output_file)]
    pub save_tape: Option<PathBuf>,

    /// Predict the recorded spilled step on a device (h200-pcie5, h100-pcie5, a100-pcie4,
    /// rtx4090-pcie4, gh200-c2c, measured, or a profile JSON file) at 100%, 50%, 33%, 25% and
    /// 10% of its peak, with the run's preset and policy.
    #[arg(long, value_parser = parse_plan_device)]
    pub plan: Option<String>,

    /// Run one side alone, every step, and print its losses (and the spilled side's stats) as
    /// one JSON line: plain or spilled. For memory-capped runs, where each side needs a process
    /// of its own; the spilled side then needs `--budget` and `--host-limit` in bytes.
    #[arg(long, value_parser = super::experiment::Side::parse)]
    pub only: Option<super::experiment::Side>,
}

impl SpillArgs {
    /// Whether the spilled run must record its steps (tape) for the plot or the trace.
    pub fn wants_tape(&self) -> bool {
        self.report.is_some()
            || self.trace.is_some()
            || self.save_tape.is_some()
            || self.plan.is_some()
    }
}

/// A size given as bytes or relative to the plain run's peak.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Amount {
    Unlimited,
    Bytes(u64),
    PercentOfPlainPeak(f64),
}

impl Amount {
    const BUDGET_ACCEPTED: &'static str = "a byte count such as 512MiB, 1.5GB or 0, a percentage of the plain run's peak such as 30%, or `unlimited`";

    pub fn parse_budget(value: &str) -> Result<Self, String> {
        Self::parse(value).ok_or_else(|| {
            format!(
                "`{value}` is not a budget; accepted: {}",
                Self::BUDGET_ACCEPTED
            )
        })
    }

    pub fn parse_host_limit(value: &str) -> Result<Self, String> {
        Self::parse(value).ok_or_else(|| {
            format!(
                "`{value}` is not a host limit; accepted: {}",
                Self::BUDGET_ACCEPTED
            )
        })
    }

    fn parse(value: &str) -> Option<Self> {
        let v = value.trim();
        if v.eq_ignore_ascii_case("unlimited") {
            return Some(Self::Unlimited);
        }
        if let Some(percent) = v.strip_suffix('%') {
            let p: f64 = percent.trim().parse().ok()?;
            return (p.is_finite() && p >= 0.0).then_some(Self::PercentOfPlainPeak(p));
        }
        burn_spill::parse_bytes(v).map(Self::Bytes)
    }

    /// Bytes, given the plain run's peak; `None` is unlimited.
    pub fn resolve(self, plain_peak: u64) -> Option<u64> {
        match self {
            Self::Unlimited => None,
            Self::Bytes(b) => Some(b),
            Self::PercentOfPlainPeak(p) => Some((plain_peak as f64 * p / 100.0) as u64),
        }
    }

    pub fn needs_plain_peak(self) -> bool {
        matches!(self, Self::PercentOfPlainPeak(_))
    }
}

impl std::fmt::Display for Amount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unlimited => f.write_str("unlimited"),
            Self::Bytes(b) => f.write_str(&super::report::bytes(*b)),
            Self::PercentOfPlainPeak(p) => write!(f, "{p}% of the plain peak"),
        }
    }
}

pub fn parse_preset(value: &str) -> Result<Preset, String> {
    Preset::from_str(value)
        .map_err(|_| format!("`{value}` is not a preset; accepted: {}", Preset::ACCEPTED))
}

pub fn parse_policy(value: &str) -> Result<PolicyKind, String> {
    PolicyKind::from_str(value).map_err(|_| {
        format!(
            "`{value}` is not a policy; accepted: {}",
            PolicyKind::ACCEPTED
        )
    })
}

pub fn parse_recompute(value: &str) -> Result<RecomputeMode, String> {
    RecomputeMode::from_str(value).map_err(|_| {
        format!(
            "`{value}` is not a recompute mode; accepted: {}",
            RecomputeMode::ACCEPTED
        )
    })
}

pub fn parse_early_room(value: &str) -> Result<EarlyRoom, String> {
    EarlyRoom::from_str(value).map_err(|_| {
        format!(
            "`{value}` is not a way to make room early; accepted: {}",
            EarlyRoom::ACCEPTED
        )
    })
}

/// Creates the directory now, so that a bad one fails before any training rather than when the
/// first tensor goes to disk, and checks that files can be made in it.
fn parse_spill_dir(value: &str) -> Result<PathBuf, String> {
    let dir = PathBuf::from(value);
    std::fs::create_dir_all(&dir)
        .and_then(|()| tempfile::tempdir_in(&dir).map(drop))
        .map_err(|e| {
            format!("cannot create or write `{value}`: {e}; accepted: a directory this user can create and write")
        })?;
    Ok(dir)
}

/// An output file whose directory exists or can be made (checked now, not after training).
fn parse_output_file(value: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(value);
    if value.is_empty() || path.file_name().is_none() {
        return Err(format!(
            "`{value}` is not a file path; accepted: a path such as out/report.json"
        ));
    }
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| {
        format!(
            "cannot create the directory `{}`: {e}; accepted: a path in a writable directory",
            parent.display()
        )
    })?;
    Ok(path)
}

/// A `--plan` device: checked before training, so that a typo does not cost a run.
fn parse_plan_device(value: &str) -> Result<String, String> {
    if value.trim().eq_ignore_ascii_case("measured") {
        return Ok(value.to_string());
    }
    burn_spill::plan::DeviceProfile::named_or_file(value)
        .map(|_| value.to_string())
        .map_err(|e| e.to_string())
}

/// Parses the command line, then the `BURN_SPILL_*` variables over the flags they replace; on a
/// bad flag or variable prints one line and exits with code 2 (help and version print as usual
/// and exit 0). Installs the log subscriber first, so that what follows can warn.
pub fn parse<T: clap::Parser + AsMut<SpillArgs>>() -> T {
    let mut args = parse_flags::<T>();
    apply_env_overrides(args.as_mut());
    args
}

/// The `BURN_SPILL_*` variables a user sets for any program work here too, for the spilled run
/// only, and mean what their flags mean (`BURN_SPILL_BUDGET=30%` is 30% of the plain peak, as
/// `--budget 30%` is): each one set replaces its flag, with a note on stderr. A bad value is a
/// usage error naming the variable. (The examples configure the device without the library's
/// own reading of the variables, which would also change the plain peak's measurement.)
fn apply_env_overrides(args: &mut SpillArgs) {
    let read = |var: &str| std::env::var(var).ok().filter(|v| !v.trim().is_empty());
    if let Some(v) = read(ENV_BUDGET) {
        args.budget = parsed(ENV_BUDGET, &v, Amount::parse_budget(&v));
    }
    if let Some(v) = read(ENV_HOST_LIMIT) {
        args.host_limit = parsed(ENV_HOST_LIMIT, &v, Amount::parse_host_limit(&v));
    }
    if let Some(v) = read(ENV_DIR) {
        args.spill_dir = Some(parsed(ENV_DIR, &v, parse_spill_dir(&v)));
    }
    if let Some(v) = read(ENV_POLICY) {
        args.policy = Some(parsed(ENV_POLICY, &v, parse_policy(&v)));
    }
    if let Some(v) = read(ENV_PRESET) {
        args.preset = Some(parsed(ENV_PRESET, &v, parse_preset(&v)));
    }
    if let Some(v) = read(ENV_RECOMPUTE) {
        args.recompute = parsed(ENV_RECOMPUTE, &v, parse_recompute(&v));
    }
    if let Some(v) = read(ENV_REBUILD_PROFILE) {
        args.rebuild_profile = Some(parsed(ENV_REBUILD_PROFILE, &v, parse_plan_device(&v)));
    }
    if let Some(v) = read(ENV_EARLY_ROOM) {
        args.early_room = Some(parsed(ENV_EARLY_ROOM, &v, parse_early_room(&v)));
    }
    if let Some(v) = read(ENV_VERIFY) {
        // The library's own reading of the switch, so that both accept the same words.
        let lookup = |name: &str| (name == ENV_VERIFY).then(|| v.clone());
        let on = burn_spill::SpillConfig::default()
            .with_overrides_from(lookup)
            .map(|config| config.is_verifying_restores())
            .map_err(|e| e.to_string());
        args.verify_restores = parsed(ENV_VERIFY, &v, on);
    }
}

/// The value of `var` parsed by its flag's parser, noted on stderr; exits 2 when it is bad.
fn parsed<T>(var: &str, value: &str, result: Result<T, String>) -> T {
    eprintln!("note: {var}={value} replaces its flag for the spilled run");
    result.unwrap_or_else(|e| exit_usage(&format!("{var}: {e}")))
}
