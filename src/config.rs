//! `SpillConfig`: the device budget, the tier limits, the presets and the environment overrides.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::SpillError;
use crate::plan::DeviceProfile;
use crate::plan::cost::KernelModel;
use crate::policy::recompute::{EarlyRoom, RebuildRoom, RebuildTimes};
use crate::policy::{PolicyKind, RecomputeMode};

/// How much device memory tensors may occupy.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceBudget {
    /// No limit: nothing is ever moved off the device (the default).
    #[default]
    Unlimited,
    /// At most this many bytes of tensors stay on the device. Zero is valid: every tensor not in
    /// use by the running op is spilled after each op.
    Bytes(u64),
    /// A fraction in (0, 1] of the device's memory. Needs a backend that can report its memory
    /// (the CPU backends report the machine's RAM) or [`SpillConfig::device_memory_bytes`].
    Fraction(f64),
}

/// A starting point for one kind of model: the watermarks below the budget and the prefetch
/// window. The tape corrects them once it has seen a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Preset {
    /// Convolutional nets: big activations, used once in backward, in reverse order.
    Cnn,
    /// Recurrent nets: many small, long-lived activations.
    Rnn,
    /// Transformers: large attention activations, medium reuse.
    Transformer,
    /// GANs: two models alternate, so half of the memory belongs to the idle one.
    Gan,
}

impl Preset {
    /// The names `FromStr` accepts.
    pub const ACCEPTED: &'static str = "cnn, rnn, transformer, gan";

    /// (cache ratio, spill threshold, prefetch window), from the design table.
    fn numbers(self) -> (f64, f64, usize) {
        match self {
            Preset::Cnn => (0.70, 0.85, 3),
            Preset::Rnn => (0.60, 0.75, 5),
            Preset::Transformer => (0.65, 0.80, 4),
            Preset::Gan => (0.50, 0.70, 2),
        }
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Preset::Cnn => "cnn",
            Preset::Rnn => "rnn",
            Preset::Transformer => "transformer",
            Preset::Gan => "gan",
        })
    }
}

impl FromStr for Preset {
    type Err = SpillError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cnn" => Ok(Preset::Cnn),
            "rnn" => Ok(Preset::Rnn),
            "transformer" => Ok(Preset::Transformer),
            "gan" => Ok(Preset::Gan),
            _ => Err(SpillError::InvalidValue {
                field: "preset",
                value: s.to_string(),
                accepted: Self::ACCEPTED,
            }),
        }
    }
}

/// What burn-spill may do with one device's tensors.
///
/// `Default` is an unlimited budget: nothing moves. Build one with the setters, start from a
/// preset, or deserialize it; [`SpillBackend::configure`](crate::SpillBackend::configure)
/// validates it and applies the `BURN_SPILL_*` environment variables on top.
///
/// ```
/// use burn_spill::SpillConfig;
/// let config = SpillConfig::cnn().device_budget_bytes(256 << 20).host_limit_bytes(1 << 30);
/// assert!(config.validate().is_ok());
/// ```
///
/// The two watermarks work below the budget: after an op, when resident bytes exceed
/// `spill_threshold` x budget, the coldest tensors are spilled until at most `cache_ratio` x
/// budget remain, leaving room so that the next ops rarely wait on an eviction. Before each op
/// the hard limit is the budget itself. Once the tape has a plan, the tape-driven policies
/// (`next_use`, `cost_aware`) replace both with the room the next ops will allocate, as the
/// recorded step tells.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SpillConfig {
    device_budget: DeviceBudget,
    device_memory_bytes: Option<u64>,
    host_limit_bytes: Option<u64>,
    spill_dir: Option<PathBuf>,
    policy: PolicyKind,
    strict: bool,
    preset: Option<Preset>,
    cache_ratio: f64,
    spill_threshold: f64,
    prefetch_window: usize,
    tape_resample_steps: u64,
    asynchronous: bool,
    verify_restores: bool,
    remote_tier: Option<String>,
    tier_order: TierOrder,
    pool_cleanup_margin_bytes: Option<u64>,
    recompute: RecomputeMode,
    rebuild_profile: Option<String>,
    rebuild_room: Option<RebuildRoom>,
    keep_state: Option<bool>,
    early_room: Option<EarlyRoom>,
}

/// Which cold store spilled bytes try first past the host tier, when a remote tier is
/// configured: the other one takes what the first fails to write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TierOrder {
    /// Device, host, remote, disk: the remote store first, the spill file when it fails
    /// (the default: a remote tier is configured because local memory or disk is short).
    #[default]
    RemoteThenDisk,
    /// Device, host, disk, remote: the spill file first, the remote store when a write to the
    /// file fails (a full disk).
    DiskThenRemote,
}

impl TierOrder {
    const ACCEPTED: &'static str = "`device,host,remote,disk` (or `remote,disk`) or `device,host,disk,remote` (or `disk,remote`)";
}

impl fmt::Display for TierOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TierOrder::RemoteThenDisk => "device,host,remote,disk",
            TierOrder::DiskThenRemote => "device,host,disk,remote",
        })
    }
}

impl FromStr for TierOrder {
    type Err = SpillError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let tiers: Vec<String> = s
            .split(',')
            .map(|t| t.trim().to_ascii_lowercase())
            .collect();
        let cold: Vec<&str> = tiers
            .iter()
            .map(String::as_str)
            .skip_while(|t| matches!(*t, "device" | "host"))
            .collect();
        let prefix = &tiers[..tiers.len() - cold.len()];
        let prefix_ok = prefix.is_empty() || prefix == ["device", "host"];
        match (prefix_ok, cold.as_slice()) {
            (true, ["remote", "disk"]) => Ok(TierOrder::RemoteThenDisk),
            (true, ["disk", "remote"]) => Ok(TierOrder::DiskThenRemote),
            _ => Err(SpillError::InvalidValue {
                field: "tier_order",
                value: s.to_string(),
                accepted: TierOrder::ACCEPTED,
            }),
        }
    }
}

impl Default for SpillConfig {
    fn default() -> Self {
        Self {
            device_budget: DeviceBudget::Unlimited,
            device_memory_bytes: None,
            host_limit_bytes: None,
            spill_dir: None,
            policy: PolicyKind::Lru,
            strict: false,
            preset: None,
            cache_ratio: 1.0,
            spill_threshold: 1.0,
            prefetch_window: 0,
            tape_resample_steps: 100,
            asynchronous: true,
            verify_restores: VERIFY_RESTORES_DEFAULT,
            remote_tier: None,
            tier_order: TierOrder::RemoteThenDisk,
            pool_cleanup_margin_bytes: None,
            recompute: RecomputeMode::Swap,
            rebuild_profile: None,
            rebuild_room: None,
            keep_state: None,
            early_room: None,
        }
    }
}

/// The environment variables read by [`SpillConfig::with_env_overrides`].
pub const ENV_BUDGET: &str = "BURN_SPILL_BUDGET";
/// Host-tier limit override.
pub const ENV_HOST_LIMIT: &str = "BURN_SPILL_HOST_LIMIT";
/// Spill directory override.
pub const ENV_DIR: &str = "BURN_SPILL_DIR";
/// Victim policy override.
pub const ENV_POLICY: &str = "BURN_SPILL_POLICY";
/// Preset override (applied first, so the other variables win over it).
pub const ENV_PRESET: &str = "BURN_SPILL_PRESET";
/// Environment variable overriding [`SpillConfig::remote_tier`].
pub const ENV_REMOTE: &str = "BURN_SPILL_REMOTE";
/// Environment variable overriding [`SpillConfig::tier_order`].
pub const ENV_TIER_ORDER: &str = "BURN_SPILL_TIER_ORDER";
/// Environment variable overriding [`SpillConfig::verify_restores`].
pub const ENV_VERIFY: &str = "BURN_SPILL_VERIFY";
/// Environment variable overriding [`SpillConfig::recompute`].
pub const ENV_RECOMPUTE: &str = "BURN_SPILL_RECOMPUTE";
/// Environment variable overriding [`SpillConfig::rebuild_profile`].
pub const ENV_REBUILD_PROFILE: &str = "BURN_SPILL_REBUILD_PROFILE";
/// Environment variable overriding [`SpillConfig::rebuild_room`].
pub const ENV_REBUILD_ROOM: &str = "BURN_SPILL_REBUILD_ROOM";
/// Environment variable overriding [`SpillConfig::keep_state`].
pub const ENV_KEEP_STATE: &str = "BURN_SPILL_KEEP_STATE";
/// Environment variable overriding [`SpillConfig::early_room`].
pub const ENV_EARLY_ROOM: &str = "BURN_SPILL_EARLY_ROOM";

/// What `remote_tier` accepts.
pub(crate) const REMOTE_ACCEPTED: &str = "a Redis URL: redis://[[user]:password@]host[:port][/db] or unix:///path (TLS, rediss://, is not built in)";

/// Whether `url` names a Redis server by one of the schemes its client takes.
fn is_remote_url(url: &str) -> bool {
    ["redis://", "unix://", "redis+unix://"]
        .iter()
        .any(|scheme| url.len() > scheme.len() && url.starts_with(scheme))
}

/// Whether restores are verified unless the config says otherwise.
const VERIFY_RESTORES_DEFAULT: bool = false;

impl SpillConfig {
    /// A config starting from `preset`'s numbers, with an unlimited budget.
    pub fn preset(preset: Preset) -> Self {
        Self::default().with_preset(preset)
    }

    /// Convolutional nets: cache ratio 70%, spill threshold 85%, prefetch window 3 ops.
    pub fn cnn() -> Self {
        Self::preset(Preset::Cnn)
    }

    /// Recurrent nets: cache ratio 60%, spill threshold 75%, prefetch window 5 ops.
    pub fn rnn() -> Self {
        Self::preset(Preset::Rnn)
    }

    /// Transformers: cache ratio 65%, spill threshold 80%, prefetch window 4 ops.
    pub fn transformer() -> Self {
        Self::preset(Preset::Transformer)
    }

    /// GANs: cache ratio 50%, spill threshold 70%, prefetch window 2 ops.
    pub fn gan() -> Self {
        Self::preset(Preset::Gan)
    }

    /// Replaces the watermarks and prefetch window with `preset`'s and picks the
    /// [`CostAware`](PolicyKind::CostAware) policy; the rest stays.
    pub fn with_preset(mut self, preset: Preset) -> Self {
        let (cache_ratio, spill_threshold, prefetch_window) = preset.numbers();
        self.preset = Some(preset);
        self.policy = PolicyKind::CostAware;
        self.cache_ratio = cache_ratio;
        self.spill_threshold = spill_threshold;
        self.prefetch_window = prefetch_window;
        self
    }

    /// Sets the device budget.
    pub fn device_budget(mut self, budget: DeviceBudget) -> Self {
        self.device_budget = budget;
        self
    }

    /// Sets the device budget in bytes (zero is valid).
    pub fn device_budget_bytes(self, bytes: u64) -> Self {
        self.device_budget(DeviceBudget::Bytes(bytes))
    }

    /// Sets the device budget as a fraction in (0, 1] of the device's memory.
    pub fn device_budget_fraction(self, fraction: f64) -> Self {
        self.device_budget(DeviceBudget::Fraction(fraction))
    }

    /// Tells burn-spill how much memory the device has, for fractional budgets on backends that
    /// cannot report it.
    pub fn device_memory_bytes(mut self, bytes: u64) -> Self {
        self.device_memory_bytes = Some(bytes);
        self
    }

    /// Caps the host tier: a hard limit. A tensor evicted while the host tier has no room for it
    /// goes straight on to disk, so the host tier never holds more than the cap
    /// (`SpillStats::peak.host` shows it). Zero sends every spilled tensor to disk. In transit, each
    /// evicting thread holds one tensor, or one batch of small tensors (at most 4 MiB), in a host
    /// buffer while it is written; a restore from disk reads into a buffer that is handed to the
    /// device. Only a failed disk write leaves a tensor on the host over the cap (counted in
    /// `disk_write_errors`), rather than lose it.
    pub fn host_limit_bytes(mut self, bytes: u64) -> Self {
        self.host_limit_bytes = Some(bytes);
        self
    }

    /// Removes the host-tier cap (the default).
    pub fn unlimited_host(mut self) -> Self {
        self.host_limit_bytes = None;
        self
    }

    /// The directory in which a fresh private spill directory is created (default: the system
    /// temp dir).
    pub fn spill_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.spill_dir = Some(dir.into());
        self
    }

    /// Sets the victim policy.
    pub fn policy(mut self, policy: PolicyKind) -> Self {
        self.policy = policy;
        self
    }

    /// Whether victims on the device may be dropped and rebuilt from the inputs of the op that
    /// made them instead of being moved (default [`RecomputeMode::Swap`]: always moved). Only
    /// outputs of pure elementwise ops whose inputs the program keeps alive until the dropped
    /// tensor's next use are dropped (see `burn_spill::policy::recompute`), and only once the
    /// tape has a plan. `BURN_SPILL_RECOMPUTE` overrides it.
    pub fn recompute(mut self, mode: RecomputeMode) -> Self {
        self.recompute = mode;
        self
    }

    /// See [`recompute`](Self::recompute).
    pub fn get_recompute(&self) -> RecomputeMode {
        self.recompute
    }

    /// The device profile whose figures time a rebuild when [`RecomputeMode::Both`] weighs it
    /// against a move (or victims are ranked by their rebuilds' cost: see
    /// [`ranks_by_rebuild`](crate::policy::recompute::ranks_by_rebuild)), and on which `both`
    /// dry-runs each recorded step to choose how the planned steps run (see
    /// [`RecomputeMode::Both`]): a built-in name (`h200-pcie5`, ...; see
    /// `docs/device-profiles.md`), a profile JSON file, or `measured` for the op's own
    /// measured duration (and this machine's measured links in the dry run). By default a
    /// synchronous backend (Flex, NdArray) uses the measured duration, and a CubeCL backend
    /// (wgpu, CUDA), whose ops return before their kernels run, the built-in
    /// [`ASYNC_DEFAULT_PROFILE`](crate::policy::recompute::ASYNC_DEFAULT_PROFILE).
    /// `BURN_SPILL_REBUILD_PROFILE` overrides it.
    pub fn rebuild_profile(mut self, name_or_path: impl Into<String>) -> Self {
        self.rebuild_profile = Some(name_or_path.into());
        self
    }

    /// See [`rebuild_profile`](Self::rebuild_profile) (`None` = the default for the backend).
    pub fn get_rebuild_profile(&self) -> Option<&str> {
        self.rebuild_profile.as_deref()
    }

    /// Where room for the rebuilds of dropped tensors is made ahead of their ops (see
    /// [`RebuildRoom`]): by the settle after each op only (`at_settle`), also beside each
    /// prefetch (`beside_prefetches`), or also in the prefetch walk (`in_prefetch_walk`). Under
    /// `recompute` and `both`, unset, each plan's dry run chooses it with the rest of its
    /// behaviour (`at_settle` until a plan has chosen), and set, they choose only among the
    /// behaviours that make room there. `BURN_SPILL_REBUILD_ROOM` overrides it.
    pub fn rebuild_room(mut self, room: RebuildRoom) -> Self {
        self.rebuild_room = Some(room);
        self
    }

    /// See [`rebuild_room`](Self::rebuild_room) (`None` = the default for the mode).
    pub fn get_rebuild_room(&self) -> Option<RebuildRoom> {
        self.rebuild_room
    }

    /// Whether the step's state stays on the device while other victims suffice: the tensors
    /// from before a step and those it hands to the next (parameters, an optimizer's state,
    /// the batch, and their updates), as the tape's plan knows them. Kept, they are the last
    /// victims (after those needed soon, and never to make room for a prefetch), so the
    /// budget holds as before; what moves is the step's activations. It pays where an
    /// optimizer would otherwise bring its whole state back in its short ops at the step's
    /// end, and the budget leaves the activations room beside the state (see
    /// `docs/planner.md`). Unset, `both` chooses per plan by its dry
    /// run, and `swap` and `recompute` move the state like any tensor; set, every mode follows
    /// it (`both` choosing among the behaviours that do). Needs a plan (a tape-driven policy).
    /// `BURN_SPILL_KEEP_STATE` (`1`/`0`, `true`/`false`, `on`/`off`) overrides it.
    pub fn keep_state(mut self, keep: bool) -> Self {
        self.keep_state = Some(keep);
        self
    }

    /// See [`keep_state`](Self::keep_state) (`None` = chosen under `both`, moved otherwise).
    pub fn get_keep_state(&self) -> Option<bool> {
        self.keep_state
    }

    /// How the settle makes room early for the step's coming peak while no eviction is under
    /// way (see [`EarlyRoom`]): not at all (`off`), all of it in one pass (`at_once`), or a
    /// share at a time (`paced`). Unset, `both` and `recompute` choose it per plan by their
    /// dry run of the recorded step, and `swap` makes it a share at a time; set, every mode
    /// follows it. Needs a plan (a tape-driven policy). `BURN_SPILL_EARLY_ROOM` overrides it.
    pub fn early_room(mut self, early: EarlyRoom) -> Self {
        self.early_room = Some(early);
        self
    }

    /// See [`early_room`](Self::early_room) (`None` = chosen under `both` and `recompute`,
    /// a share at a time under `swap`).
    pub fn get_early_room(&self) -> Option<EarlyRoom> {
        self.early_room
    }

    /// Where a rebuild's op time comes from on a backend whose ops are asynchronous or not.
    ///
    /// # Errors
    /// [`SpillError::InvalidValue`] when the profile is neither `measured`, a built-in nor a
    /// file; [`SpillError::Profile`] when the file holds no valid profile.
    pub fn rebuild_times(&self, asynchronous_backend: bool) -> Result<RebuildTimes, SpillError> {
        Ok(match self.rebuild_device_profile(asynchronous_backend)? {
            Some(profile) => RebuildTimes::Modelled(KernelModel::of(&profile)),
            None => RebuildTimes::Measured,
        })
    }

    /// The device profile [`rebuild_profile`](Self::rebuild_profile) names for a backend whose
    /// ops are asynchronous or not; `None` for `measured` (this machine, as a run measures it).
    ///
    /// # Errors
    /// As [`rebuild_times`](Self::rebuild_times).
    pub fn rebuild_device_profile(
        &self,
        asynchronous_backend: bool,
    ) -> Result<Option<DeviceProfile>, SpillError> {
        match self.rebuild_profile.as_deref() {
            Some(name) => rebuild_profile_named(name, "rebuild_profile"),
            None if asynchronous_backend => rebuild_profile_named(
                crate::policy::recompute::ASYNC_DEFAULT_PROFILE,
                "rebuild_profile",
            ),
            None => Ok(None),
        }
    }

    /// In strict mode an op that alone needs more than the budget panics instead of running.
    pub fn strict(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }

    /// After an op, spill down to this fraction of the budget (0, 1].
    pub fn cache_ratio(mut self, ratio: f64) -> Self {
        self.cache_ratio = ratio;
        self
    }

    /// After an op, start spilling when resident bytes exceed this fraction of the budget (0, 1].
    pub fn spill_threshold(mut self, ratio: f64) -> Self {
        self.spill_threshold = ratio;
        self
    }

    /// How many ops ahead spilled tensors are brought back to the device, once the tape has
    /// recorded a step (0 turns prefetching off; a window longer than the step is clamped to
    /// it). A tensor that still arrives late gets an extra op of lead each time, next step.
    pub fn prefetch_window(mut self, ops: usize) -> Self {
        self.prefetch_window = ops;
        self
    }

    /// Whether moves that ops need not wait for (evictions after an op, host overflow to disk,
    /// prefetches) run on background transfer workers (default) or on the op's own thread.
    pub fn asynchronous(mut self, on: bool) -> Self {
        self.asynchronous = on;
        self
    }

    /// See [`asynchronous`](Self::asynchronous).
    pub fn is_asynchronous(&self) -> bool {
        self.asynchronous
    }

    /// Whether every restore checks the tensor's bytes against a CRC32 taken when they left the
    /// device, from any tier: a host copy is checksummed at eviction and checked before it is
    /// uploaded again or written to disk (spill-file records carry their own CRC32, always
    /// checked). A mismatch panics naming the tensor id, the tier and where the bytes were.
    /// The device copy an upload makes is not read back. `BURN_SPILL_VERIFY` (`1`/`0`,
    /// `true`/`false`, `on`/`off`) overrides it. Its cost is one pass over the bytes at
    /// eviction and one at restore: on Flex at 30% of the plain peak, -0.3% (median of three
    /// runs) of a ResNet-18 step and +2.2% of a GPT step (`benches/budgets.rs`), which is why it
    /// is off by default; the README has the figures.
    pub fn verify_restores(mut self, on: bool) -> Self {
        self.verify_restores = on;
        self
    }

    /// See [`verify_restores`](Self::verify_restores).
    pub fn is_verifying_restores(&self) -> bool {
        self.verify_restores
    }

    /// A remote cold tier: spilled bytes past the host tier go to the Redis server at `url`
    /// (`redis://[[user]:password@]host[:port][/db]`), in the server's memory, before or after
    /// the spill file as [`tier_order`](Self::tier_order) says. For when host memory, not device
    /// memory, is what runs out and a neighbour has memory to spare. Needs the cargo feature
    /// `remote`; `configure` connects at once, so an unreachable server or a missing password
    /// is a `SpillError` then, not mid-training. `BURN_SPILL_REMOTE` overrides it.
    pub fn remote_tier(mut self, url: impl Into<String>) -> Self {
        self.remote_tier = Some(url.into());
        self
    }

    /// Removes the remote tier (the default).
    pub fn no_remote_tier(mut self) -> Self {
        self.remote_tier = None;
        self
    }

    /// See [`remote_tier`](Self::remote_tier).
    pub fn get_remote_tier(&self) -> Option<&str> {
        self.remote_tier.as_deref()
    }

    /// Which cold store spilled bytes try first when a remote tier is configured (default
    /// [`TierOrder::RemoteThenDisk`]). `BURN_SPILL_TIER_ORDER` overrides it.
    pub fn tier_order(mut self, order: TierOrder) -> Self {
        self.tier_order = order;
        self
    }

    /// See [`tier_order`](Self::tier_order).
    pub fn get_tier_order(&self) -> TierOrder {
        self.tier_order
    }

    /// On backends whose allocator reports its pool (CubeCL: wgpu, CUDA), free pages are
    /// returned to the driver once the pool reserves more than this many bytes beyond those in
    /// use (default: a tenth of the budget, at least 1 MiB). A spilled byte is only saved on a
    /// GPU once its page goes back: an out-of-memory is about reserved bytes, not used ones.
    /// Smaller margins return pages more often, at the cost of reallocating them.
    pub fn pool_cleanup_margin_bytes(mut self, bytes: u64) -> Self {
        self.pool_cleanup_margin_bytes = Some(bytes);
        self
    }

    /// See [`pool_cleanup_margin_bytes`](Self::pool_cleanup_margin_bytes) (`None` = the
    /// default, a tenth of the budget, at least 1 MiB).
    pub fn get_pool_cleanup_margin_bytes(&self) -> Option<u64> {
        self.pool_cleanup_margin_bytes
    }

    /// Once steps repeat, the tape only verifies each step's op sequence and records one step
    /// in full every `steps` steps (default 100; 1 records every step).
    pub fn tape_resample_steps(mut self, steps: u64) -> Self {
        self.tape_resample_steps = steps;
        self
    }

    /// See [`tape_resample_steps`](Self::tape_resample_steps).
    pub fn get_tape_resample_steps(&self) -> u64 {
        self.tape_resample_steps
    }

    /// The device budget.
    pub fn get_device_budget(&self) -> DeviceBudget {
        self.device_budget
    }

    /// The declared device memory size, if any.
    pub fn get_device_memory_bytes(&self) -> Option<u64> {
        self.device_memory_bytes
    }

    /// The host-tier cap (`None` = unlimited).
    pub fn get_host_limit_bytes(&self) -> Option<u64> {
        self.host_limit_bytes
    }

    /// The base spill directory (`None` = system temp dir).
    pub fn get_spill_dir(&self) -> Option<&PathBuf> {
        self.spill_dir.as_ref()
    }

    /// The victim policy.
    pub fn get_policy(&self) -> PolicyKind {
        self.policy
    }

    /// Whether strict mode is on.
    pub fn is_strict(&self) -> bool {
        self.strict
    }

    /// The preset this config started from, if any.
    pub fn get_preset(&self) -> Option<Preset> {
        self.preset
    }

    /// The low watermark as a fraction of the budget.
    pub fn get_cache_ratio(&self) -> f64 {
        self.cache_ratio
    }

    /// The high watermark as a fraction of the budget.
    pub fn get_spill_threshold(&self) -> f64 {
        self.spill_threshold
    }

    /// The prefetch window in ops.
    pub fn get_prefetch_window(&self) -> usize {
        self.prefetch_window
    }

    /// Checks every field; the error names the field, the value and what is accepted.
    pub fn validate(&self) -> Result<(), SpillError> {
        if let DeviceBudget::Fraction(f) = self.device_budget
            && !(f > 0.0 && f <= 1.0)
        {
            return Err(SpillError::InvalidValue {
                field: "device_budget",
                value: format!("fraction {f}"),
                accepted: "a fraction in (0, 1], a byte count, or unlimited",
            });
        }
        for (field, value) in [
            ("cache_ratio", self.cache_ratio),
            ("spill_threshold", self.spill_threshold),
        ] {
            if !(value > 0.0 && value <= 1.0) {
                return Err(SpillError::InvalidValue {
                    field,
                    value: value.to_string(),
                    accepted: "a fraction of the budget in (0, 1]",
                });
            }
        }
        if self.cache_ratio > self.spill_threshold {
            return Err(SpillError::InvalidValue {
                field: "cache_ratio",
                value: format!(
                    "{} (above spill_threshold {})",
                    self.cache_ratio, self.spill_threshold
                ),
                accepted: "a fraction no larger than spill_threshold",
            });
        }
        if self.tape_resample_steps == 0 {
            return Err(SpillError::InvalidValue {
                field: "tape_resample_steps",
                value: "0".into(),
                accepted: "a step count of at least 1",
            });
        }
        if let Some(url) = &self.remote_tier
            && !is_remote_url(url)
        {
            return Err(SpillError::InvalidValue {
                field: "remote_tier",
                value: url.clone(),
                accepted: REMOTE_ACCEPTED,
            });
        }
        if self.device_memory_bytes == Some(0) {
            return Err(SpillError::InvalidValue {
                field: "device_memory_bytes",
                value: "0".into(),
                accepted: "a positive byte count",
            });
        }
        if self.rebuild_profile.is_some() {
            self.rebuild_times(true)?;
        }
        Ok(())
    }

    /// Applies the `BURN_SPILL_*` environment variables on top of this config.
    pub fn with_env_overrides(self) -> Result<Self, SpillError> {
        self.with_overrides_from(|name| std::env::var(name).ok())
    }

    /// Applies overrides looked up by variable name (the environment, in
    /// [`with_env_overrides`](Self::with_env_overrides)). The preset goes first so that explicit
    /// variables win over it.
    pub fn with_overrides_from(
        mut self,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, SpillError> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        if let Some(v) = get(ENV_PRESET) {
            self = self.with_preset(v.parse().map_err(|e| rename(e, ENV_PRESET))?);
        }
        if let Some(v) = get(ENV_BUDGET) {
            self.device_budget = parse_budget(&v)?;
        }
        if let Some(v) = get(ENV_HOST_LIMIT) {
            self.host_limit_bytes = parse_limit(ENV_HOST_LIMIT, &v)?;
        }
        if let Some(v) = get(ENV_DIR) {
            self.spill_dir = Some(PathBuf::from(v));
        }
        if let Some(v) = get(ENV_POLICY) {
            self.policy = v.parse().map_err(|e| rename(e, ENV_POLICY))?;
        }
        if let Some(v) = get(ENV_VERIFY) {
            self.verify_restores = parse_switch(ENV_VERIFY, &v)?;
        }
        if let Some(v) = get(ENV_REMOTE) {
            let url = v.trim().to_string();
            if !is_remote_url(&url) {
                return Err(SpillError::InvalidValue {
                    field: ENV_REMOTE,
                    value: v,
                    accepted: REMOTE_ACCEPTED,
                });
            }
            self.remote_tier = Some(url);
        }
        if let Some(v) = get(ENV_TIER_ORDER) {
            self.tier_order = v.parse().map_err(|e| rename(e, ENV_TIER_ORDER))?;
        }
        if let Some(v) = get(ENV_RECOMPUTE) {
            self.recompute = v.parse().map_err(|e| rename(e, ENV_RECOMPUTE))?;
        }
        if let Some(v) = get(ENV_REBUILD_ROOM) {
            self.rebuild_room = Some(v.parse().map_err(|e| rename(e, ENV_REBUILD_ROOM))?);
        }
        if let Some(v) = get(ENV_KEEP_STATE) {
            self.keep_state = Some(parse_switch(ENV_KEEP_STATE, &v)?);
        }
        if let Some(v) = get(ENV_EARLY_ROOM) {
            self.early_room = Some(v.parse().map_err(|e| rename(e, ENV_EARLY_ROOM))?);
        }
        if let Some(v) = get(ENV_REBUILD_PROFILE) {
            rebuild_profile_named(&v, ENV_REBUILD_PROFILE)?;
            self.rebuild_profile = Some(v.trim().to_string());
        }
        Ok(self)
    }
}

/// What `rebuild_profile` accepts.
const REBUILD_PROFILE_ACCEPTED: &str = "`measured` (the op's own duration), a built-in device profile (h200-pcie5, h100-pcie5, a100-pcie4, rtx4090-pcie4, gh200-c2c) or the path of a profile JSON file (docs/device-profiles.md)";

/// The profile `name` (see [`SpillConfig::rebuild_profile`]; `None` for `measured`), an error
/// under `field` when it names nothing.
fn rebuild_profile_named(
    name: &str,
    field: &'static str,
) -> Result<Option<DeviceProfile>, SpillError> {
    let trimmed = name.trim();
    if trimmed.eq_ignore_ascii_case("measured") {
        return Ok(None);
    }
    let profile = if let Ok(profile) = DeviceProfile::builtin(trimmed) {
        profile
    } else if std::path::Path::new(trimmed).is_file() {
        DeviceProfile::load(std::path::Path::new(trimmed))?
    } else {
        return Err(SpillError::InvalidValue {
            field,
            value: name.to_string(),
            accepted: REBUILD_PROFILE_ACCEPTED,
        });
    };
    Ok(Some(profile))
}

/// Reports a parse error under the environment variable's name.
fn rename(error: SpillError, field: &'static str) -> SpillError {
    match error {
        SpillError::InvalidValue {
            value, accepted, ..
        } => SpillError::InvalidValue {
            field,
            value,
            accepted,
        },
        other => other,
    }
}

const BUDGET_ACCEPTED: &str = "`unlimited`, a byte count such as 1073741824, 512MiB, 2GiB, 1.5GB, or a fraction such as 0.5 or 50%";

fn parse_budget(value: &str) -> Result<DeviceBudget, SpillError> {
    let v = value.trim();
    let invalid = || SpillError::InvalidValue {
        field: ENV_BUDGET,
        value: value.to_string(),
        accepted: BUDGET_ACCEPTED,
    };
    if v.eq_ignore_ascii_case("unlimited") {
        return Ok(DeviceBudget::Unlimited);
    }
    if let Some(percent) = v.strip_suffix('%') {
        let p: f64 = percent.trim().parse().map_err(|_| invalid())?;
        let budget = DeviceBudget::Fraction(p / 100.0);
        return check_fraction(budget).ok_or_else(invalid);
    }
    if v.contains('.') && v.chars().all(|c| c.is_ascii_digit() || c == '.') {
        let f: f64 = v.parse().map_err(|_| invalid())?;
        return check_fraction(DeviceBudget::Fraction(f)).ok_or_else(invalid);
    }
    parse_bytes(v).map(DeviceBudget::Bytes).ok_or_else(invalid)
}

fn check_fraction(budget: DeviceBudget) -> Option<DeviceBudget> {
    match budget {
        DeviceBudget::Fraction(f) if f > 0.0 && f <= 1.0 => Some(budget),
        _ => None,
    }
}

fn parse_switch(field: &'static str, value: &str) -> Result<bool, SpillError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Ok(true),
        "0" | "false" | "off" | "no" => Ok(false),
        _ => Err(SpillError::InvalidValue {
            field,
            value: value.to_string(),
            accepted: "`1`, `true`, `on` or `yes` to turn it on; `0`, `false`, `off` or `no` to turn it off",
        }),
    }
}

fn parse_limit(field: &'static str, value: &str) -> Result<Option<u64>, SpillError> {
    let v = value.trim();
    if v.eq_ignore_ascii_case("unlimited") {
        return Ok(None);
    }
    parse_bytes(v).map(Some).ok_or(SpillError::InvalidValue {
        field,
        value: value.to_string(),
        accepted: "`unlimited` or a byte count such as 1073741824, 512MiB, 2GiB, 1.5GB",
    })
}

/// Parses a byte count: `123`, `123B`, `4KiB`/`4K` (1024), `4KB` (1000), up to `T`; decimals
/// are allowed with a unit (`1.5GB`). The same syntax the environment overrides accept.
///
/// ```
/// assert_eq!(burn_spill::parse_bytes("512MiB"), Some(512 << 20));
/// assert_eq!(burn_spill::parse_bytes("lots"), None);
/// ```
pub fn parse_bytes(value: &str) -> Option<u64> {
    let v = value.trim();
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let (number, unit) = v.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let multiplier: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return None,
    };
    if number.is_empty() {
        return None;
    }
    if number.contains('.') {
        if multiplier == 1 {
            return None;
        }
        let n: f64 = number.parse().ok()?;
        let bytes = (n * multiplier as f64).round();
        return (bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64)
            .then_some(bytes as u64);
    }
    number.parse::<u64>().ok()?.checked_mul(multiplier)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        }
    }

    #[test]
    fn sizes_parse_with_binary_and_decimal_units() {
        assert_eq!(parse_bytes("0"), Some(0));
        assert_eq!(parse_bytes("1024"), Some(1024));
        assert_eq!(parse_bytes("4KiB"), Some(4096));
        assert_eq!(parse_bytes("4k"), Some(4096));
        assert_eq!(parse_bytes("2 GiB"), Some(2 << 30));
        assert_eq!(parse_bytes("1.5GB"), Some(1_500_000_000));
        assert_eq!(parse_bytes("1.5"), None);
        assert_eq!(parse_bytes("lots"), None);
        assert_eq!(parse_bytes("5PB"), None);
    }

    #[test]
    fn presets_hold_the_design_table() {
        let c = SpillConfig::transformer();
        assert_eq!(
            (c.cache_ratio, c.spill_threshold, c.prefetch_window),
            (0.65, 0.80, 4)
        );
        assert_eq!(SpillConfig::gan().get_preset(), Some(Preset::Gan));
        for p in [Preset::Cnn, Preset::Rnn, Preset::Transformer, Preset::Gan] {
            SpillConfig::preset(p).validate().unwrap();
            assert_eq!(p.to_string().parse::<Preset>().unwrap(), p);
        }
    }

    #[test]
    fn env_overrides_apply_with_the_preset_first() {
        let c = SpillConfig::default()
            .with_overrides_from(env(&[
                (ENV_PRESET, "rnn"),
                (ENV_BUDGET, "64MiB"),
                (ENV_HOST_LIMIT, "0"),
                (ENV_DIR, "/tmp/x"),
                (ENV_POLICY, "LRU"),
                (ENV_RECOMPUTE, "Both"),
            ]))
            .unwrap();
        assert_eq!(c.get_preset(), Some(Preset::Rnn));
        assert_eq!(c.get_recompute(), RecomputeMode::Both);
        assert_eq!(c.get_device_budget(), DeviceBudget::Bytes(64 << 20));
        assert_eq!(c.get_host_limit_bytes(), Some(0));
        assert_eq!(c.get_spill_dir(), Some(&PathBuf::from("/tmp/x")));
        let f = SpillConfig::default()
            .with_overrides_from(env(&[(ENV_BUDGET, "50%")]))
            .unwrap();
        assert_eq!(f.get_device_budget(), DeviceBudget::Fraction(0.5));
    }

    #[test]
    fn bad_values_name_field_value_and_accepted() {
        let err = SpillConfig::default()
            .with_overrides_from(env(&[(ENV_PRESET, "vae")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("BURN_SPILL_PRESET") && err.contains("vae") && err.contains("transformer"),
            "{err}"
        );
        let err = SpillConfig::default()
            .with_overrides_from(env(&[(ENV_BUDGET, "1.5")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("BURN_SPILL_BUDGET") && err.contains("1.5"),
            "{err}"
        );
        let err = SpillConfig::default()
            .with_overrides_from(env(&[(ENV_POLICY, "mru")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("mru") && err.contains("lru"), "{err}");
        let err = SpillConfig::default()
            .with_overrides_from(env(&[(ENV_RECOMPUTE, "sometimes")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("BURN_SPILL_RECOMPUTE")
                && err.contains("sometimes")
                && err.contains("swap, recompute, both"),
            "{err}"
        );
        let err = SpillConfig::default()
            .with_overrides_from(env(&[(ENV_REBUILD_ROOM, "everywhere")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("BURN_SPILL_REBUILD_ROOM")
                && err.contains("everywhere")
                && err.contains(RebuildRoom::ACCEPTED),
            "{err}"
        );
        let room = SpillConfig::default()
            .with_overrides_from(env(&[(ENV_REBUILD_ROOM, " In-Prefetch-Walk ")]))
            .unwrap();
        assert_eq!(room.get_rebuild_room(), Some(RebuildRoom::InPrefetchWalk));
        assert_eq!(SpillConfig::default().get_rebuild_room(), None);
        assert_eq!(SpillConfig::default().get_keep_state(), None);
        assert_eq!(SpillConfig::default().get_early_room(), None);
        let err = SpillConfig::default()
            .with_overrides_from(env(&[(ENV_EARLY_ROOM, "early")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("BURN_SPILL_EARLY_ROOM")
                && err.contains("early")
                && err.contains(EarlyRoom::ACCEPTED),
            "{err}"
        );
        let early = SpillConfig::default()
            .early_room(EarlyRoom::Paced)
            .with_overrides_from(env(&[(ENV_EARLY_ROOM, " At-Once ")]))
            .unwrap();
        assert_eq!(early.get_early_room(), Some(EarlyRoom::AtOnce));
        let kept = SpillConfig::default()
            .keep_state(false)
            .with_overrides_from(env(&[(ENV_KEEP_STATE, " On ")]))
            .unwrap();
        assert_eq!(kept.get_keep_state(), Some(true));
        let err = SpillConfig::default()
            .with_overrides_from(env(&[(ENV_KEEP_STATE, "sometimes")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("BURN_SPILL_KEEP_STATE") && err.contains("sometimes"),
            "{err}"
        );
        let err = SpillConfig::default()
            .with_overrides_from(env(&[(ENV_REBUILD_PROFILE, "h300")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("BURN_SPILL_REBUILD_PROFILE")
                && err.contains("h300")
                && err.contains("measured")
                && err.contains("h200-pcie5"),
            "{err}"
        );
        for name in crate::plan::BUILTIN_PROFILES {
            assert!(REBUILD_PROFILE_ACCEPTED.contains(name), "{name}");
        }
        let err = SpillConfig::default()
            .rebuild_profile("h300")
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("rebuild_profile") && err.contains("h300"),
            "{err}"
        );
        for f in [0.0, -0.5, 1.01, f64::NAN] {
            let err = SpillConfig::default()
                .device_budget_fraction(f)
                .validate()
                .unwrap_err();
            assert!(err.to_string().contains("device_budget"), "{err}");
        }
        assert!(
            SpillConfig::default()
                .device_budget_fraction(1.0)
                .validate()
                .is_ok()
        );
        assert!(
            SpillConfig::default()
                .device_budget_bytes(0)
                .validate()
                .is_ok()
        );
        let err = SpillConfig::default()
            .cache_ratio(0.9)
            .spill_threshold(0.5)
            .validate();
        assert!(err.unwrap_err().to_string().contains("cache_ratio"));
    }

    /// Synchronous backends weigh an op's measured time, CubeCL backends the default GPU
    /// profile's model of it, and a configured profile (or `measured`) wins on both; a profile
    /// file is read, and a broken one names what is wrong with it.
    #[test]
    fn rebuild_times_follow_the_backend_unless_a_profile_is_set() {
        let model = |name: &str| {
            RebuildTimes::Modelled(KernelModel::of(&DeviceProfile::builtin(name).unwrap()))
        };
        let default = SpillConfig::default();
        assert_eq!(
            default.rebuild_times(false).unwrap(),
            RebuildTimes::Measured
        );
        assert_eq!(
            default.rebuild_times(true).unwrap(),
            model(crate::policy::recompute::ASYNC_DEFAULT_PROFILE)
        );
        let h200 = SpillConfig::default().rebuild_profile("h200-pcie5");
        assert_eq!(h200.rebuild_times(false).unwrap(), model("h200-pcie5"));
        assert_eq!(h200.rebuild_times(true).unwrap(), model("h200-pcie5"));
        let measured = SpillConfig::default()
            .with_overrides_from(env(&[(ENV_REBUILD_PROFILE, " Measured ")]))
            .unwrap();
        assert_eq!(
            measured.rebuild_times(true).unwrap(),
            RebuildTimes::Measured
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("card.json");
        let mut card = DeviceProfile::builtin("a100-pcie4").unwrap();
        card.hbm_gb_per_s = 1000.0;
        std::fs::write(&file, serde_json::to_string(&card).unwrap()).unwrap();
        let from_file = SpillConfig::default().rebuild_profile(file.display().to_string());
        assert_eq!(
            from_file.rebuild_times(true).unwrap(),
            RebuildTimes::Modelled(KernelModel::of(&card))
        );
        std::fs::write(&file, r#"{"name": "broken"}"#).unwrap();
        let err = from_file.validate().unwrap_err().to_string();
        assert!(
            err.contains("card.json") && err.contains("missing field"),
            "{err}"
        );
    }

    #[test]
    fn serde_round_trip_and_partial_documents() {
        let c = SpillConfig::cnn().device_budget_bytes(1 << 20).strict(true);
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<SpillConfig>(&json).unwrap(), c);
        let partial: SpillConfig =
            serde_json::from_str(r#"{"device_budget":{"fraction":0.25}}"#).unwrap();
        assert_eq!(partial.get_device_budget(), DeviceBudget::Fraction(0.25));
        assert_eq!(partial.get_cache_ratio(), 1.0);
    }

    /// Any string at all, and strings shaped like sizes, give a value or `None` /
    /// a `SpillError` naming the variable: never a panic.
    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        const VARIABLES: [&str; 12] = [
            ENV_PRESET,
            ENV_BUDGET,
            ENV_HOST_LIMIT,
            ENV_DIR,
            ENV_POLICY,
            ENV_VERIFY,
            ENV_REMOTE,
            ENV_TIER_ORDER,
            ENV_RECOMPUTE,
            ENV_REBUILD_PROFILE,
            ENV_KEEP_STATE,
            ENV_EARLY_ROOM,
        ];

        /// Strings near the accepted syntax, where parsers break: digits, dots, signs,
        /// exponents, units, percent signs, spaces and a few non-ASCII characters.
        fn size_like() -> impl Strategy<Value = String> {
            "[ 0-9.eE+-]{0,24}[kKmMgGtTiIbB% \u{e9}\u{212a}\u{ff10}]{0,5}"
        }

        fn any_value() -> impl Strategy<Value = String> {
            prop_oneof![
                any::<String>(),
                size_like(),
                "(?i) ?(unlimited|nan|inf|-inf|on|off|true|no|1|0)%? ?"
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2048))]

            #[test]
            fn parse_bytes_never_panics(value in any_value()) {
                if let Some(bytes) = parse_bytes(&value) {
                    // A value it accepts starts with a digit or a dot, after spaces.
                    let first = value.trim().chars().next();
                    prop_assert!(first.is_some_and(|c| c.is_ascii_digit() || c == '.'), "{value:?} -> {bytes}");
                }
            }

            #[test]
            fn byte_counts_and_units_round_trip(n in any::<u64>(), shift in 0u32..5) {
                prop_assert_eq!(parse_bytes(&n.to_string()), Some(n));
                let unit = ["B", "KiB", "MiB", "GiB", "TiB"][shift as usize];
                let expected = n.checked_mul(1 << (10 * shift));
                prop_assert_eq!(parse_bytes(&format!(" {n} {unit} ")), expected);
            }

            #[test]
            fn every_override_gives_a_config_or_an_error_naming_its_variable(
                variable in proptest::sample::select(VARIABLES.to_vec()),
                value in any_value(),
            ) {
                let lookup = |name: &str| (name == variable).then(|| value.clone());
                match SpillConfig::default().with_overrides_from(lookup) {
                    Ok(config) => {
                        // What an override accepts, validation accepts too.
                        prop_assert!(config.validate().is_ok(), "{variable}={value:?}");
                    }
                    Err(SpillError::InvalidValue { field, value: named, .. }) => {
                        prop_assert_eq!(field, variable);
                        prop_assert_eq!(named, value);
                    }
                    Err(other) => prop_assert!(false, "{variable}={value:?}: {other}"),
                }
            }
        }
    }
}
