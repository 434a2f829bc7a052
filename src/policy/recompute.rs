//! Swap or recompute: whether a victim's bytes are moved off the device or dropped, to be
//! rebuilt from the inputs of the op that made it when it is next used.
//!
//! The rule for memory (why a recipe can never hold more than swapping would): a tensor is
//! dropped only when every input of its recipe is alive now and, by the use plan, still read at
//! or after the tensor's own next use in this step, so the recipe keeps nothing alive that the
//! program itself would not keep alive until then; and only when the op at that use, with the
//! recipe's inputs beside it, fits the budget (the rebuild needs them on the device there).
//! Without a plan, or outside a marked step (whose positions the plan is read at), nothing is
//! dropped. A dropped
//! tensor holds its inputs until it is rebuilt or dropped itself (so a plan that was wrong costs
//! memory, never data), and chains of dropped tensors are at most [`MAX_REBUILD_DEPTH`] deep when
//! each is dropped.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::victim::Bandwidth;
use crate::SpillError;
use crate::plan::cost::{KernelModel, OpCost};

/// What the engine may do with a victim on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecomputeMode {
    /// Always move its bytes to the host or disk (the default until `both` is measured
    /// better on the benchmarks' models).
    #[default]
    Swap,
    /// Drop every victim that has a recipe whose inputs stay alive, whatever the cost (as DTR
    /// does); the others are moved.
    Recompute,
    /// Per victim, whichever is cheaper: moving its bytes out and back, or rebuilding it.
    Both,
}

impl RecomputeMode {
    /// The names `FromStr` accepts.
    pub const ACCEPTED: &'static str = "swap, recompute, both";

    /// Whether victims may be dropped at all (so ops keep recipes).
    pub fn may_drop(self) -> bool {
        self != RecomputeMode::Swap
    }
}

impl fmt::Display for RecomputeMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RecomputeMode::Swap => "swap",
            RecomputeMode::Recompute => "recompute",
            RecomputeMode::Both => "both",
        })
    }
}

impl FromStr for RecomputeMode {
    type Err = SpillError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().replace('-', "_").as_str() {
            "swap" | "swap_only" => Ok(RecomputeMode::Swap),
            "recompute" | "recompute_only" | "dtr" => Ok(RecomputeMode::Recompute),
            "both" | "swap+recompute" | "swap_and_recompute" => Ok(RecomputeMode::Both),
            _ => Err(SpillError::InvalidValue {
                field: "recompute",
                value: s.to_string(),
                accepted: Self::ACCEPTED,
            }),
        }
    }
}

/// The ops whose outputs keep a recipe: pure elementwise ops (no randomness, no state outside
/// their inputs), named as Burn's ops traits name them. The forwarding tables mark exactly
/// these rows `#[recompute]` (checked when a marked op runs), and the planner's simulation
/// reads the list to know which of a tape's tensors could be rebuilt.
pub const RECOMPUTABLE_OPS: [&str; 30] = [
    "float_add",
    "float_add_scalar",
    "float_clamp_min",
    "float_clamp_max",
    "float_clamp",
    "float_sub",
    "float_sub_scalar",
    "float_mul",
    "float_mul_scalar",
    "float_div",
    "float_div_scalar",
    "float_neg",
    "float_recip",
    "float_mask_where",
    "float_mask_fill",
    "float_cast",
    "float_exp",
    "float_log",
    "float_log1p",
    "float_powf_scalar",
    "float_sqrt",
    "float_abs",
    "float_cos",
    "float_sin",
    "float_tanh",
    "float_erf",
    "relu",
    "gelu",
    "sigmoid",
    "leaky_relu",
];

/// Whether the op named `name` keeps a recipe for its output.
pub fn is_recomputable(name: &str) -> bool {
    RECOMPUTABLE_OPS.contains(&name)
}

/// The profile that times rebuilds on a CubeCL backend (wgpu, CUDA) when none is configured:
/// the built-in with the slowest device memory, so that a rebuild is not taken for cheaper
/// than it is on a faster card (its ops' measured durations are dispatch times, and the card
/// is not known).
pub const ASYNC_DEFAULT_PROFILE: &str = "rtx4090-pcie4";

/// How deep a chain of dropped tensors may be when one more is dropped: a rebuild runs this
/// many ops at most before the op that needs it.
pub const MAX_REBUILD_DEPTH: u32 = 4;

/// What rebuilding one victim costs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rebuild {
    /// The op's time: as last measured, or modelled (see [`RebuildTimes`]).
    pub op_time: Duration,
    /// How many dropped tensors its inputs already depend on, itself not counted.
    pub depth: u32,
}

/// Where the op time of a rebuild comes from when [`RecomputeMode::Both`] weighs it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum RebuildTimes {
    /// The op's own duration when it last ran: its compute time on a synchronous backend
    /// (Flex, NdArray), where an op returns once its result is there.
    #[default]
    Measured,
    /// The op's kernel on a device's figures, from its FLOPs and bytes: for asynchronous
    /// backends (CubeCL: wgpu, CUDA), whose ops return once their kernels are queued, so that a
    /// measured duration is a dispatch time and says nothing of the kernel's.
    Modelled(KernelModel),
}

impl RebuildTimes {
    /// The time to weigh for an op that last took `measured` on the host and costs `cost`.
    pub fn op_time(&self, measured: Duration, cost: &OpCost) -> Duration {
        match self {
            RebuildTimes::Measured => measured,
            RebuildTimes::Modelled(model) => Duration::from_secs_f64(model.seconds(cost)),
        }
    }
}

/// What the engine knows of a victim when it decides.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Victim {
    /// Its bytes.
    pub bytes: u64,
    /// Moving bytes off the device, as measured.
    pub evict: Bandwidth,
    /// Bringing them back, as measured.
    pub restore: Bandwidth,
    /// Whether a prefetch will bring it back before its op needs it (its next use is known and
    /// beyond the prefetch window), so that the restore costs the op nothing.
    pub restore_hidden: bool,
}

/// Whether to drop `victim` (to be rebuilt by `rebuild`) rather than move it. The caller has
/// checked the memory rule (see the module docs).
pub fn prefer_recompute(mode: RecomputeMode, victim: &Victim, rebuild: &Rebuild) -> bool {
    if rebuild.depth >= MAX_REBUILD_DEPTH {
        return false;
    }
    match mode {
        RecomputeMode::Swap => false,
        RecomputeMode::Recompute => true,
        RecomputeMode::Both => {
            let restore = if victim.restore_hidden {
                0.0
            } else {
                victim.restore.seconds(victim.bytes)
            };
            let transfer = victim.evict.seconds(victim.bytes) + restore;
            // A deeper chain may have to rebuild its dropped inputs too: each counts as one
            // more op of about this one's cost (DTR's neighbourhood, bounded by the depth).
            let recompute = rebuild.op_time.as_secs_f64() * f64::from(rebuild.depth + 1);
            recompute < transfer
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn victim(bytes: u64, hidden: bool) -> Victim {
        let link = Bandwidth {
            bytes_per_sec: 1e9,
            latency: Duration::from_micros(10),
        };
        Victim {
            bytes,
            evict: link,
            restore: link,
            restore_hidden: hidden,
        }
    }

    fn rebuild(micros: u64, depth: u32) -> Rebuild {
        Rebuild {
            op_time: Duration::from_micros(micros),
            depth,
        }
    }

    #[test]
    fn modes_parse_and_unknown_names_list_the_accepted_ones() {
        assert_eq!(
            "swap".parse::<RecomputeMode>().unwrap(),
            RecomputeMode::Swap
        );
        assert_eq!(
            " Recompute ".parse::<RecomputeMode>().unwrap(),
            RecomputeMode::Recompute
        );
        assert_eq!(
            "both".parse::<RecomputeMode>().unwrap(),
            RecomputeMode::Both
        );
        let error = "sometimes"
            .parse::<RecomputeMode>()
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("sometimes") && error.contains(RecomputeMode::ACCEPTED),
            "{error}"
        );
        for mode in [
            RecomputeMode::Swap,
            RecomputeMode::Recompute,
            RecomputeMode::Both,
        ] {
            assert_eq!(mode.to_string().parse::<RecomputeMode>().unwrap(), mode);
        }
    }

    #[test]
    fn swap_never_drops_and_recompute_always_does_within_the_depth() {
        let big = victim(1 << 30, false);
        assert!(!prefer_recompute(RecomputeMode::Swap, &big, &rebuild(1, 0)));
        let tiny = victim(4, true);
        assert!(prefer_recompute(
            RecomputeMode::Recompute,
            &tiny,
            &rebuild(1_000_000, 0)
        ));
        assert!(!prefer_recompute(
            RecomputeMode::Recompute,
            &tiny,
            &rebuild(1, MAX_REBUILD_DEPTH)
        ));
    }

    #[test]
    fn both_takes_the_cheaper_and_counts_a_hidden_restore_as_free() {
        // 1 MB at 1 GB/s: 1 ms each way, plus 10 us per transfer.
        let mb = victim(1_000_000, false);
        assert!(prefer_recompute(
            RecomputeMode::Both,
            &mb,
            &rebuild(1_500, 0)
        ));
        assert!(!prefer_recompute(
            RecomputeMode::Both,
            &mb,
            &rebuild(2_500, 0)
        ));
        // Only the eviction counts when a prefetch hides the restore.
        let hidden = victim(1_000_000, true);
        assert!(!prefer_recompute(
            RecomputeMode::Both,
            &hidden,
            &rebuild(1_500, 0)
        ));
        // A chain one deep counts the op twice.
        assert!(!prefer_recompute(
            RecomputeMode::Both,
            &mb,
            &rebuild(1_500, 1)
        ));
    }

    /// On an asynchronous backend the measured time is a dispatch time: a slow host's 3 ms
    /// for a 1 MB add says nothing of its kernel, which on an H200 reads and writes 3 MB in
    /// under 4 us (plus its launch), far below the 2 ms round trip over a 1 GB/s link.
    #[test]
    fn modelled_times_come_from_the_op_and_decide_instead_of_dispatch_times() {
        use crate::plan::DeviceProfile;
        use crate::plan::cost::{MatrixDtype, TensorView, cost_of};
        let shape = [250_000usize];
        let view = |id| TensorView {
            id,
            bytes: 1_000_000,
            dtype: MatrixDtype::F32,
            shape: &shape,
        };
        let cost = cost_of("float_add", &[view(1), view(2)], &[view(3)]);
        assert_eq!(cost.bytes, 3_000_000);
        let h200 = DeviceProfile::builtin("h200-pcie5").unwrap();
        let model = KernelModel::of(&h200);
        let dispatch = Duration::from_millis(3);
        assert_eq!(RebuildTimes::Measured.op_time(dispatch, &cost), dispatch);
        let modelled = RebuildTimes::Modelled(model).op_time(dispatch, &cost);
        let expected =
            h200.launch_us * 1e-6 + 3e6 / (h200.hbm_gb_per_s * 1e9 * h200.memory_efficiency);
        assert!(
            (modelled.as_secs_f64() - expected).abs() < 1e-9,
            "{modelled:?}"
        );
        let mb = victim(1_000_000, false);
        let decide =
            |op_time| prefer_recompute(RecomputeMode::Both, &mb, &Rebuild { op_time, depth: 0 });
        assert!(
            !decide(dispatch),
            "the dispatch time makes a move look cheaper"
        );
        assert!(
            decide(modelled),
            "the kernel is cheaper than the round trip"
        );
        // The default for unknown cards has the slowest memory of the built-ins.
        let slow = KernelModel::of(&DeviceProfile::builtin(ASYNC_DEFAULT_PROFILE).unwrap());
        assert!(RebuildTimes::Modelled(slow).op_time(dispatch, &cost) > modelled);
    }
}
