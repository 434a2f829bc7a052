//! Device profiles: the figures of a target machine the dry run times a step on (compute,
//! device memory and its bandwidth, the host link with its copy engines, the disk), as data a
//! user can write for their own card. The built-in figures and their sources are in
//! `docs/device-profiles.md`.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{SpillError, SpillStats};

/// Peak dense (no sparsity) matrix throughput per dtype, in TFLOP/s: what matmul, convolution
/// and attention run at.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatrixTflops {
    /// `F32` inputs, as the kernels run them (the plain FP32 rate unless
    /// [`DeviceProfile::f32_matmul_tf32`]).
    pub f32: f64,
    /// TF32 tensor cores (used for `F32` matrix ops when [`DeviceProfile::f32_matmul_tf32`]).
    pub tf32: f64,
    /// `F16` inputs.
    pub f16: f64,
    /// `BF16` inputs.
    pub bf16: f64,
}

/// Where an op's device time comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpTimes {
    /// From the op's FLOPs and bytes on this profile's figures ([`super::cost`]): for a target
    /// device, and for asynchronous backends whose recorded durations are dispatch times.
    #[default]
    Modelled,
    /// The tape's own durations: only meaningful for the machine and (synchronous) backend
    /// that recorded it ([`DeviceProfile::measured`]).
    Recorded,
}

/// A target device.
///
/// Figures are peaks; `compute_efficiency` and `memory_efficiency` say what fraction of them
/// real kernels reach. Every figure must be positive and finite, and the efficiencies at most 1.
///
/// ```
/// let h200 = burn_spill::plan::DeviceProfile::builtin("h200-pcie5").unwrap();
/// assert!(h200.hbm_gb_per_s > 4000.0);
/// let json = serde_json::to_string(&h200).unwrap();
/// assert_eq!(burn_spill::plan::DeviceProfile::from_json(&json, "copy").unwrap(), h200);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceProfile {
    /// Its name (`h200-pcie5`).
    pub name: String,
    /// Device memory, in bytes.
    pub memory_bytes: u64,
    /// Device memory bandwidth, GB/s (10^9 bytes per second).
    pub hbm_gb_per_s: f64,
    /// Matrix throughput per dtype.
    pub matrix_tflops: MatrixTflops,
    /// Plain (non-matrix) FP32 throughput, TFLOP/s: what elementwise and reduction ops run at
    /// when their arithmetic, not their bytes, bounds them.
    pub vector_tflops_f32: f64,
    /// Whether `F32` matrix ops run on TF32 tensor cores.
    #[serde(default)]
    pub f32_matmul_tf32: bool,
    /// Host-to-device copy bandwidth with pinned memory, one direction alone, GB/s.
    pub host_to_device_gb_per_s: f64,
    /// Device-to-host copy bandwidth with pinned memory, one direction alone, GB/s.
    pub device_to_host_gb_per_s: f64,
    /// Per direction when both copy directions run at once, GB/s.
    pub duplex_gb_per_s: f64,
    /// Fixed cost of one host-link transfer (call, DMA set-up), microseconds.
    pub transfer_latency_us: f64,
    /// Fixed cost of one kernel launch, microseconds.
    pub launch_us: f64,
    /// Spill-disk read bandwidth, GB/s.
    pub disk_read_gb_per_s: f64,
    /// Spill-disk write bandwidth, GB/s.
    pub disk_write_gb_per_s: f64,
    /// Fraction of peak FLOP/s kernels reach.
    pub compute_efficiency: f64,
    /// Fraction of peak memory bandwidth kernels reach.
    pub memory_efficiency: f64,
    /// Where op times come from.
    #[serde(default)]
    pub op_times: OpTimes,
    /// Host time the engine's own decisions add to an op while something is off the device
    /// (prefetch scans, victim passes, settling), microseconds. `measured` takes it from the engine's
    /// clock (`SpillStats::engine_time` over `engine_ops`). On a GPU this host work runs while
    /// the device works through the kernels queued before it, so the built-ins leave it at 0
    /// (the simulation assumes the host keeps the device fed).
    #[serde(default)]
    pub engine_op_us: f64,
    /// Host time the engine spends on each move beyond the copy itself (the tensor's slot, the
    /// index, the allocator), microseconds. `measured` takes it from what ops waited per move
    /// beyond the copies; the built-ins leave it at 0 (their latency covers a GPU copy's fixed
    /// cost). It lengthens a move, not the engine's estimate of one, which counts only copies.
    #[serde(default)]
    pub move_host_us: f64,
}

/// The built-in profiles' names.
pub const BUILTIN_PROFILES: [&str; 5] = [
    "h200-pcie5",
    "h100-pcie5",
    "a100-pcie4",
    "rtx4090-pcie4",
    "gh200-c2c",
];

/// What [`DeviceProfile::named_or_file`] accepts.
const ACCEPTED: &str = "h200-pcie5, h100-pcie5, a100-pcie4, rtx4090-pcie4, gh200-c2c, measured (from a recorded run), or a path to a profile JSON file (docs/device-profiles.md)";

/// What kernels reach of the peaks on the built-in profiles (see docs/device-profiles.md).
const COMPUTE_EFFICIENCY: f64 = 0.6;
const MEMORY_EFFICIENCY: f64 = 0.8;

const GB: f64 = 1e9;

/// The figures a built-in profile differs in.
struct Card {
    name: &'static str,
    memory_bytes: u64,
    hbm: f64,
    matrix: MatrixTflops,
    vector_f32: f64,
    h2d: f64,
    d2h: f64,
    duplex: f64,
    latency_us: f64,
    disk_read: f64,
    disk_write: f64,
}

/// Peak figures from NVIDIA's datasheets (dense, without sparsity); memory as `nvidia-smi`
/// reports it; link figures are measured pinned-memory copy rates, below the link's
/// theoretical rate. Sources, and which figures are least certain, in docs/device-profiles.md.
const CARDS: [Card; 5] = [
    // H200 NVL: 141 GB HBM3e at 4.8 TB/s; PCIe Gen5 x16 (64 GB/s per direction in theory).
    Card {
        name: "h200-pcie5",
        memory_bytes: 150_754_820_096,
        hbm: 4800.0,
        matrix: MatrixTflops {
            f32: 60.0,
            tf32: 417.5,
            f16: 835.5,
            bf16: 835.5,
        },
        vector_f32: 60.0,
        h2d: 55.0,
        d2h: 55.0,
        duplex: 50.0,
        latency_us: 6.0,
        disk_read: 12.0,
        disk_write: 10.0,
    },
    // H100 PCIe 80 GB: HBM2e at 2.0 TB/s; PCIe Gen5 x16.
    Card {
        name: "h100-pcie5",
        memory_bytes: 85_520_809_984,
        hbm: 2000.0,
        matrix: MatrixTflops {
            f32: 51.0,
            tf32: 378.0,
            f16: 756.5,
            bf16: 756.5,
        },
        vector_f32: 51.0,
        h2d: 55.0,
        d2h: 55.0,
        duplex: 50.0,
        latency_us: 6.0,
        disk_read: 12.0,
        disk_write: 10.0,
    },
    // A100 80 GB PCIe: HBM2e at 1,935 GB/s; PCIe Gen4 x16 (32 GB/s per direction in theory).
    Card {
        name: "a100-pcie4",
        memory_bytes: 85_899_345_920,
        hbm: 1935.0,
        matrix: MatrixTflops {
            f32: 19.5,
            tf32: 156.0,
            f16: 312.0,
            bf16: 312.0,
        },
        vector_f32: 19.5,
        h2d: 25.0,
        d2h: 25.0,
        duplex: 20.0,
        latency_us: 6.0,
        disk_read: 7.0,
        disk_write: 5.0,
    },
    // RTX 4090: 24 GB GDDR6X at 1,008 GB/s; FP16/BF16 with FP32 accumulate (what training
    // uses) at 165.2 TFLOP/s dense; PCIe Gen4 x16.
    Card {
        name: "rtx4090-pcie4",
        memory_bytes: 25_757_220_864,
        hbm: 1008.0,
        matrix: MatrixTflops {
            f32: 82.6,
            tf32: 82.6,
            f16: 165.2,
            bf16: 165.2,
        },
        vector_f32: 82.6,
        h2d: 24.0,
        d2h: 24.0,
        duplex: 20.0,
        latency_us: 6.0,
        disk_read: 7.0,
        disk_write: 5.0,
    },
    // GH200 (96 GB HBM3 at 4 TB/s): the host link is NVLink-C2C, 450 GB/s per direction in
    // theory.
    Card {
        name: "gh200-c2c",
        memory_bytes: 102_625_181_696,
        hbm: 4000.0,
        matrix: MatrixTflops {
            f32: 66.9,
            tf32: 494.7,
            f16: 989.4,
            bf16: 989.4,
        },
        vector_f32: 66.9,
        h2d: 346.0,
        d2h: 300.0,
        duplex: 170.0,
        latency_us: 6.0,
        disk_read: 12.0,
        disk_write: 10.0,
    },
];

impl DeviceProfile {
    /// A built-in profile by name ([`BUILTIN_PROFILES`]).
    ///
    /// # Errors
    /// [`SpillError::Profile`] for an unknown name, listing the accepted ones.
    pub fn builtin(name: &str) -> Result<Self, SpillError> {
        let wanted = name.trim().to_ascii_lowercase();
        let card = CARDS
            .iter()
            .find(|c| c.name == wanted)
            .ok_or_else(|| SpillError::Profile {
                profile: name.to_string(),
                reason: format!("no such profile; accepted: {ACCEPTED}"),
            })?;
        Ok(Self {
            name: card.name.to_string(),
            memory_bytes: card.memory_bytes,
            hbm_gb_per_s: card.hbm,
            matrix_tflops: card.matrix,
            vector_tflops_f32: card.vector_f32,
            f32_matmul_tf32: false,
            host_to_device_gb_per_s: card.h2d,
            device_to_host_gb_per_s: card.d2h,
            duplex_gb_per_s: card.duplex,
            transfer_latency_us: card.latency_us,
            launch_us: 3.0,
            disk_read_gb_per_s: card.disk_read,
            disk_write_gb_per_s: card.disk_write,
            compute_efficiency: COMPUTE_EFFICIENCY,
            memory_efficiency: MEMORY_EFFICIENCY,
            op_times: OpTimes::Modelled,
            engine_op_us: 0.0,
            move_host_us: 0.0,
        })
    }

    /// A built-in profile's name, or a JSON profile file's path (`measured` needs a recorded
    /// run: see [`measured`](Self::measured)).
    ///
    /// # Errors
    /// [`SpillError::Profile`] when it is neither, or the file does not hold a valid profile.
    pub fn named_or_file(name_or_path: &str) -> Result<Self, SpillError> {
        if let Ok(profile) = Self::builtin(name_or_path) {
            return Ok(profile);
        }
        let path = Path::new(name_or_path);
        if path.is_file() {
            return Self::load(path);
        }
        Err(SpillError::Profile {
            profile: name_or_path.to_string(),
            reason: format!("no such profile or file; accepted: {ACCEPTED}"),
        })
    }

    /// Reads a profile from a JSON file.
    ///
    /// # Errors
    /// [`SpillError::Profile`] when the file cannot be read or its profile is invalid.
    pub fn load(path: &Path) -> Result<Self, SpillError> {
        let text = std::fs::read_to_string(path).map_err(|e| SpillError::Profile {
            profile: path.display().to_string(),
            reason: format!("cannot read the file: {e}"),
        })?;
        Self::from_json(&text, &path.display().to_string())
    }

    /// Parses and validates a profile; `origin` names it in errors.
    ///
    /// # Errors
    /// [`SpillError::Profile`] naming the missing, unknown or out-of-range field.
    pub fn from_json(json: &str, origin: &str) -> Result<Self, SpillError> {
        let profile: Self = serde_json::from_str(json).map_err(|e| SpillError::Profile {
            profile: origin.to_string(),
            reason: format!("{e}; the fields are listed in docs/device-profiles.md"),
        })?;
        profile.validate().map_err(|reason| SpillError::Profile {
            profile: origin.to_string(),
            reason,
        })?;
        Ok(profile)
    }

    /// This machine, as a recorded run saw it: op times are the tape's own durations (which on
    /// a synchronous backend such as Flex are the ops' compute times), and from `stats` (a run
    /// on this machine that moved bytes; the run that recorded the tape never did if its
    /// budget did not bind): each link's measured bandwidth (a fallback where nothing of it
    /// moved yet), a move's fixed cost (the quickest move, plus what ops waited per move beyond
    /// the copies: the op thread's own work for a move) and the engine's own time per op while
    /// something is off the device.
    pub fn measured(stats: &SpillStats) -> Self {
        let links = [&stats.host_to_device, &stats.device_to_host];
        // The quickest move bounds a move's fixed cost from above; the rest of the moves' time
        // is what their bytes took, so that latency plus bytes over the rate adds up to the
        // measured time of the moves (counting the latency inside the rate too would count it
        // twice).
        let fastest: Vec<f64> = links
            .iter()
            .filter_map(|m| m.fastest)
            .map(|t| t.as_secs_f64())
            .collect();
        let quickest = if fastest.is_empty() {
            10e-6
        } else {
            fastest.iter().sum::<f64>() / fastest.len() as f64
        };
        // What ops waited beyond the copies themselves, per move: the op thread's own cost of
        // a move (its slot, index and allocator work) on a backend where moves run there.
        let moves = stats.host_to_device.count + stats.device_to_host.count;
        let beyond_copies = if moves > 0 {
            stats
                .stall_time
                .saturating_sub(stats.time_moving)
                .as_secs_f64()
                / moves as f64
        } else {
            0.0
        };

        let rate = |m: &crate::MoveStats, fallback: f64| {
            let time = m.time.as_secs_f64();
            if m.bytes < 1 << 20 || time <= 0.0 {
                return fallback;
            }
            let bytes_time = (time - m.count as f64 * quickest).max(time * 0.1);
            m.bytes as f64 / bytes_time / GB
        };
        let h2d = rate(&stats.host_to_device, 10.0);
        let d2h = rate(&stats.device_to_host, 10.0);
        let lat = quickest * 1e6;
        Self {
            name: "measured".to_string(),
            memory_bytes: stats.peak.device.max(1),
            // Op times are the recorded ones; these figures only keep the profile valid.
            hbm_gb_per_s: 20.0,
            matrix_tflops: MatrixTflops {
                f32: 0.1,
                tf32: 0.1,
                f16: 0.1,
                bf16: 0.1,
            },
            vector_tflops_f32: 0.05,
            f32_matmul_tf32: false,
            host_to_device_gb_per_s: h2d,
            device_to_host_gb_per_s: d2h,
            // Both directions share the machine's memory bus (and its two cores).
            duplex_gb_per_s: h2d.min(d2h) / 2.0,
            transfer_latency_us: lat.max(0.1),
            launch_us: 0.0,
            disk_read_gb_per_s: rate(&stats.disk_to_device, 1.0),
            disk_write_gb_per_s: rate(&stats.host_to_disk, 1.0),
            compute_efficiency: 1.0,
            memory_efficiency: 1.0,
            op_times: OpTimes::Recorded,
            move_host_us: beyond_copies * 1e6,
            engine_op_us: if stats.engine_ops > 0 {
                stats.engine_time.as_secs_f64() * 1e6 / stats.engine_ops as f64
            } else {
                0.0
            },
        }
    }

    /// Every figure positive and finite, efficiencies at most 1.
    fn validate(&self) -> Result<(), String> {
        if self.name.trim().is_empty() {
            return Err("`name` is empty; give the profile a name".into());
        }
        if self.memory_bytes == 0 {
            return Err("`memory_bytes` is 0; give the device memory in bytes".into());
        }
        let figures = [
            ("hbm_gb_per_s", self.hbm_gb_per_s),
            ("matrix_tflops.f32", self.matrix_tflops.f32),
            ("matrix_tflops.tf32", self.matrix_tflops.tf32),
            ("matrix_tflops.f16", self.matrix_tflops.f16),
            ("matrix_tflops.bf16", self.matrix_tflops.bf16),
            ("vector_tflops_f32", self.vector_tflops_f32),
            ("host_to_device_gb_per_s", self.host_to_device_gb_per_s),
            ("device_to_host_gb_per_s", self.device_to_host_gb_per_s),
            ("duplex_gb_per_s", self.duplex_gb_per_s),
            ("disk_read_gb_per_s", self.disk_read_gb_per_s),
            ("disk_write_gb_per_s", self.disk_write_gb_per_s),
            ("compute_efficiency", self.compute_efficiency),
            ("memory_efficiency", self.memory_efficiency),
        ];
        for (field, value) in figures {
            if !(value.is_finite() && value > 0.0) {
                return Err(format!(
                    "`{field}` = {value} is not valid; accepted: a positive, finite number"
                ));
            }
        }
        for (field, value) in [
            ("transfer_latency_us", self.transfer_latency_us),
            ("launch_us", self.launch_us),
            ("engine_op_us", self.engine_op_us),
            ("move_host_us", self.move_host_us),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(format!(
                    "`{field}` = {value} is not valid; accepted: a finite number of microseconds, 0 or more"
                ));
            }
        }
        for (field, value) in [
            ("compute_efficiency", self.compute_efficiency),
            ("memory_efficiency", self.memory_efficiency),
        ] {
            if value > 1.0 {
                return Err(format!(
                    "`{field}` = {value} is not valid; accepted: a fraction of the peak in (0, 1]"
                ));
            }
        }
        Ok(())
    }

    /// Seconds the host link takes for `bytes` in one direction, alone or beside the other.
    pub(crate) fn link_seconds(&self, bytes: u64, to_device: bool, duplex: bool) -> f64 {
        let rate = match (duplex, to_device) {
            (true, _) => self.duplex_gb_per_s,
            (false, true) => self.host_to_device_gb_per_s,
            (false, false) => self.device_to_host_gb_per_s,
        };
        self.transfer_latency_us * 1e-6 + bytes as f64 / (rate * GB)
    }

    /// Seconds the spill disk takes for `bytes`.
    pub(crate) fn disk_seconds(&self, bytes: u64, write: bool) -> f64 {
        let rate = if write {
            self.disk_write_gb_per_s
        } else {
            self.disk_read_gb_per_s
        };
        bytes as f64 / (rate * GB)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_is_valid_and_round_trips() {
        for name in BUILTIN_PROFILES {
            let p = DeviceProfile::builtin(name).unwrap();
            p.validate().unwrap();
            let json = serde_json::to_string_pretty(&p).unwrap();
            assert_eq!(DeviceProfile::from_json(&json, name).unwrap(), p);
        }
        // The GPU's memory is far faster than any host link: the reason recompute pays.
        let h200 = DeviceProfile::builtin("H200-PCIe5").unwrap();
        assert!(h200.hbm_gb_per_s / h200.host_to_device_gb_per_s > 75.0);
    }

    #[test]
    fn bad_profiles_name_the_field() {
        let err = DeviceProfile::builtin("tpu-v5").unwrap_err().to_string();
        assert!(
            err.contains("tpu-v5") && err.contains("h200-pcie5"),
            "{err}"
        );
        let mut p = serde_json::to_value(DeviceProfile::builtin("a100-pcie4").unwrap()).unwrap();
        p["hbm_gb_per_s"] = serde_json::json!(-1.0);
        let err = DeviceProfile::from_json(&p.to_string(), "mine.json")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("mine.json") && err.contains("hbm_gb_per_s"),
            "{err}"
        );
        p.as_object_mut().unwrap().remove("hbm_gb_per_s");
        let err = DeviceProfile::from_json(&p.to_string(), "mine.json")
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing field `hbm_gb_per_s`"), "{err}");
        p["hbm_gb_per_s"] = serde_json::json!(100.0);
        // The engine's host costs are optional, and 0 or more.
        p["move_host_us"] = serde_json::json!(2.0);
        assert_eq!(
            DeviceProfile::from_json(&p.to_string(), "mine.json")
                .unwrap()
                .move_host_us,
            2.0
        );
        p["engine_op_us"] = serde_json::json!(-0.5);
        let err = DeviceProfile::from_json(&p.to_string(), "mine.json")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("engine_op_us") && err.contains("0 or more"),
            "{err}"
        );
        p.as_object_mut().unwrap().remove("engine_op_us");
        p["compute_efficiency"] = serde_json::json!(1.5);
        let err = DeviceProfile::from_json(&p.to_string(), "mine.json")
            .unwrap_err()
            .to_string();
        assert!(err.contains("compute_efficiency"), "{err}");
        let err = DeviceProfile::named_or_file("/no/such/profile.json")
            .unwrap_err()
            .to_string();
        assert!(err.contains("accepted"), "{err}");
    }

    /// The measured profile splits the moves' time into a fixed cost (the quickest move) and
    /// bytes over a rate, so that replaying the same moves takes the time they took.
    #[test]
    fn the_measured_links_add_up_to_the_moves_time() {
        use std::time::Duration;
        let moves = |count, bytes, micros, fastest_micros| crate::MoveStats {
            count,
            bytes,
            time: Duration::from_micros(micros),
            fastest: Some(Duration::from_micros(fastest_micros)),
        };
        let stats = SpillStats {
            // 100 moves of 40 KiB in 1.2 ms, the quickest 4 µs; 50 of 80 KiB in 0.7 ms, 6 µs.
            host_to_device: moves(100, (100 * 40) << 10, 1_200, 4),
            device_to_host: moves(50, (50 * 80) << 10, 700, 6),
            ..Default::default()
        };
        let p = DeviceProfile::measured(&stats);
        assert!((p.transfer_latency_us - 5.0).abs() < 1e-9, "{p:?}");
        let replay = |count: u64, bytes: u64, to_device: bool| {
            count as f64 * p.link_seconds(bytes / count, to_device, false)
        };
        assert!((replay(100, (100 * 40) << 10, true) - 1.2e-3).abs() < 1e-9);
        assert!((replay(50, (50 * 80) << 10, false) - 0.7e-3).abs() < 1e-9);
    }
}
