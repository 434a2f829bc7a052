//! `SpillStats`: what burn-spill did on one device, as a plain value for logs and reports.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Count, bytes and time of the moves in one direction between tiers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveStats {
    /// How many tensors moved.
    pub count: u64,
    /// How many bytes moved.
    pub bytes: u64,
    /// Wall time spent moving them: reads, copies, checksums, writes and uploads. Freeing what
    /// was moved from (a device tensor, a host buffer, a file extent) is not counted.
    pub time: Duration,
    /// The quickest single move of the run (an upper bound on a move's fixed cost), if any
    /// moved. [`since`](Self::since) keeps the later snapshot's figure: it is not a difference.
    #[serde(default)]
    pub fastest: Option<Duration>,
}

/// Bytes per tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierBytes {
    /// On the device (the inner backend's primitives).
    pub device: u64,
    /// In host buffers owned by burn-spill.
    pub host: u64,
    /// In spill files.
    pub disk: u64,
}

/// A snapshot of one device's tiers and of the traffic between them.
///
/// ```
/// use burn::backend::Flex;
/// use burn_spill::SpillBackend;
/// let stats = SpillBackend::<Flex>::stats(&Default::default());
/// assert!(stats.resident.device <= stats.peak.device);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SpillStats {
    /// The budget in force, in bytes (`None` = unlimited).
    pub device_budget_bytes: Option<u64>,
    /// The host-tier limit in force (`None` = unlimited).
    pub host_limit_bytes: Option<u64>,
    /// Resident bytes per tier now.
    pub resident: TierBytes,
    /// The most bytes each tier has held since the device was configured (or the last
    /// [`reset_peaks`](crate::SpillBackend::reset_peaks)).
    pub peak: TierBytes,
    /// Of `resident`, the bytes of tensors tagged as parameters.
    pub parameter_resident: TierBytes,
    /// Live tensors (clones of a handle count once).
    pub live_tensors: u64,
    /// Live tensors tagged as parameters.
    pub parameter_tensors: u64,
    /// Bytes spilled off the device right now (host + disk), parameters excluded.
    pub spilled_other_bytes: u64,
    /// Bytes spilled off the device right now (host + disk), parameters only.
    pub spilled_parameter_bytes: u64,
    /// Device to host (evictions).
    pub device_to_host: MoveStats,
    /// Host to device (restores from the host tier).
    pub host_to_device: MoveStats,
    /// Host to disk (the host tier overflowing).
    pub host_to_disk: MoveStats,
    /// Disk to device (restores from spill files).
    pub disk_to_device: MoveStats,
    /// Ops that ran over the budget because their own inputs and outputs, plus the bytes that
    /// may not be evicted, were larger than it.
    pub over_budget_ops: u64,
    /// The most device bytes held during an over-budget op since the peaks were last reset.
    pub largest_over_budget_op_bytes: u64,
    /// Device bytes that may not be evicted because a host round trip would change their memory
    /// layout (strided views such as transposes on backends whose layout burn-spill can read).
    pub unevictable_device_bytes: u64,
    /// Ops whose outputs were larger than estimated before they ran, so the device held more
    /// than the budget until the eviction after the op. The estimate is learned per op and input
    /// shapes, so these happen on the first step and stop once shapes repeat.
    pub estimate_misses: u64,
    /// Spill-file writes that failed; each left its tensor on the host, over the host limit.
    pub disk_write_errors: u64,
    /// Total time spent moving bytes in all directions.
    pub time_moving: Duration,
    /// Time ops spent waiting for bytes: moves done on the op's own thread plus waits for
    /// transfers still in flight. Moves done by the transfer workers are not stalls.
    pub stall_time: Duration,
    /// Time the engine's own decisions took on the op threads while memory was tight: after
    /// ops with something off the device (prefetch scans, victim passes, settling) and making
    /// room before ops, less the moves and waits `stall_time` counts. Estimated: one of these
    /// works in four, drawn at random, is timed and counts four times (two clock reads around
    /// each were a tenth of the engine's cost per op). The dry-run planner's `measured` profile
    /// takes its cost per op from this.
    #[serde(default)]
    pub engine_time: Duration,
    /// Ops after which that work ran with something off the device (prefetch scans, settling).
    #[serde(default)]
    pub engine_ops: u64,
    /// Op inputs that were on the device because a prefetch brought them back in time.
    pub prefetch_hits: u64,
    /// Op inputs that were spilled (or still on their way) when the op needed them.
    pub prefetch_misses: u64,
    /// Prefetches sent to the transfer workers.
    pub prefetches_issued: u64,
    /// Evictions of several small tensors in one transfer (one read, one host buffer; on Flex,
    /// tensors that own their buffer alone are handed to the host tier as they are, uncopied).
    pub eviction_batches: u64,
    /// Tensors evicted as part of a batch (each is also counted in `device_to_host`).
    pub batched_evictions: u64,
    /// What the last finished step did (`None` before the tape has cut a step).
    pub last_step: Option<StepStats>,
    /// The inner allocator's own figures, where the backend reports them (CubeCL: wgpu, CUDA);
    /// `None` elsewhere. The tiers above count tensors' bytes; this is what the device holds.
    pub pool: Option<PoolStats>,
    /// Each cold store (the spill file, a remote store), in the order writes try them. Their
    /// bytes together are `resident.disk`.
    #[serde(default)]
    pub cold_tiers: Vec<ColdTierStats>,
    /// Tensors dropped from the device to be rebuilt instead of moved
    /// ([`SpillConfig::recompute`](crate::SpillConfig::recompute)).
    #[serde(default)]
    pub recompute: RecomputeStats,
    /// Whether ops are tracked (pinned, indexed, counted against the budget one by one): true
    /// once the device neared its budget after `configure`. Until then memory is ample, and
    /// ops run untracked, at almost the cost of an unconfigured device.
    #[serde(default)]
    pub ops_tracked: bool,
}

/// What dropping and rebuilding tensors did on one device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecomputeStats {
    /// Tensors dropped from the device (each drop once; a tensor can be dropped again after it
    /// was rebuilt).
    pub dropped: u64,
    /// Their bytes.
    pub dropped_bytes: u64,
    /// Rebuilds: ops run again to bring a dropped tensor back.
    pub rebuilt: u64,
    /// Their bytes.
    pub rebuilt_bytes: u64,
    /// Of those rebuilds, the ones another rebuild needed first (an input of its recipe was
    /// dropped too).
    #[serde(default)]
    pub chained_rebuilds: u64,
    /// Ops the rebuilds ran again for inputs the program had let go (ghosts, recomputed from
    /// their own recipes for the rebuild and let go again).
    #[serde(default)]
    pub ghosts_recomputed: u64,
    /// The time those ops took on the calling thread (on an asynchronous backend, their
    /// dispatch).
    pub rebuild_time: Duration,
    /// Bytes of the tensors that are dropped now (in no tier).
    pub dropped_now_bytes: u64,
    /// Under [`RecomputeMode::Both`](crate::RecomputeMode::Both) and
    /// [`RecomputeMode::Recompute`](crate::RecomputeMode::Recompute) with a budget, once a step
    /// is planned: how the planned steps treat their victims, as the mode chose from a dry run
    /// of the recorded step (see [`Behaviour`](crate::policy::recompute::Behaviour); under
    /// `recompute`, where room for rebuilds is made and how room is made early). `None` otherwise, and where the config leaves
    /// nothing to choose.
    #[serde(default)]
    pub behaviour: Option<crate::policy::recompute::Behaviour>,
}

impl RecomputeStats {
    /// The counts since `earlier` (`dropped_now_bytes` is this one's).
    pub fn since(&self, earlier: &RecomputeStats) -> RecomputeStats {
        RecomputeStats {
            dropped: self.dropped.saturating_sub(earlier.dropped),
            dropped_bytes: self.dropped_bytes.saturating_sub(earlier.dropped_bytes),
            rebuilt: self.rebuilt.saturating_sub(earlier.rebuilt),
            rebuilt_bytes: self.rebuilt_bytes.saturating_sub(earlier.rebuilt_bytes),
            chained_rebuilds: self
                .chained_rebuilds
                .saturating_sub(earlier.chained_rebuilds),
            ghosts_recomputed: self
                .ghosts_recomputed
                .saturating_sub(earlier.ghosts_recomputed),
            rebuild_time: self.rebuild_time.saturating_sub(earlier.rebuild_time),
            dropped_now_bytes: self.dropped_now_bytes,
            behaviour: self.behaviour,
        }
    }
}

/// One cold store as it measured itself.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ColdTierStats {
    /// What it is: the spill file's path, a server's address.
    pub store: String,
    /// Records held now.
    pub records: u64,
    /// Bytes it holds for them now (payloads and their descriptions).
    pub bytes_used: u64,
    /// Payload bytes written to it, and the time the writes took.
    pub written: MoveStats,
    /// Payload bytes read from it, and the time the reads took.
    pub read: MoveStats,
}

/// The inner backend's memory pool as its allocator reports it, summed over every stream
/// burn-spill's threads used on the device.
///
/// `reserved` is what runs a GPU out of memory: pages the allocator holds from the driver,
/// whether tensors use them or not. Peaks are the highest readings: the pool is read when the
/// device's bytes moved by the cleanup margin, at step boundaries and for every `stats()`, so
/// the reserved peak is exact up to the growth since the last reading, the in-use peak within
/// one margin (see `SpillConfig::pool_cleanup_margin_bytes`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolStats {
    /// Bytes in live allocations now.
    pub in_use: u64,
    /// Bytes reserved from the driver now.
    pub reserved: u64,
    /// The highest in-use reading since the peaks were last reset.
    pub peak_in_use: u64,
    /// The highest reserved reading since the peaks were last reset.
    pub peak_reserved: u64,
    /// Streams (queues) summed.
    pub streams: u32,
    /// Cleanups burn-spill asked of the allocator.
    pub cleanups: u64,
    /// Reserved bytes those cleanups returned to the driver.
    pub returned_bytes: u64,
}

impl MoveStats {
    /// The moves counted since `earlier`.
    pub fn since(&self, earlier: &MoveStats) -> MoveStats {
        MoveStats {
            count: self.count.saturating_sub(earlier.count),
            bytes: self.bytes.saturating_sub(earlier.bytes),
            time: self.time.saturating_sub(earlier.time),
            fastest: self.fastest,
        }
    }
}

impl SpillStats {
    /// What happened since `earlier` (a snapshot of the same device): the counters (moves,
    /// over-budget ops, estimate misses, write errors, times, prefetches, batches) as
    /// differences; the limits, the resident bytes, the peaks and the rest as they are now.
    ///
    /// ```
    /// use burn::backend::Flex;
    /// use burn_spill::SpillBackend;
    /// let device = Default::default();
    /// let before = SpillBackend::<Flex>::stats(&device);
    /// // ... train ...
    /// let run = SpillBackend::<Flex>::stats(&device).since(&before);
    /// assert_eq!(run.device_to_host.count, 0);
    /// ```
    pub fn since(&self, earlier: &SpillStats) -> SpillStats {
        SpillStats {
            device_to_host: self.device_to_host.since(&earlier.device_to_host),
            host_to_device: self.host_to_device.since(&earlier.host_to_device),
            host_to_disk: self.host_to_disk.since(&earlier.host_to_disk),
            disk_to_device: self.disk_to_device.since(&earlier.disk_to_device),
            over_budget_ops: self.over_budget_ops.saturating_sub(earlier.over_budget_ops),
            estimate_misses: self.estimate_misses.saturating_sub(earlier.estimate_misses),
            disk_write_errors: self
                .disk_write_errors
                .saturating_sub(earlier.disk_write_errors),
            time_moving: self.time_moving.saturating_sub(earlier.time_moving),
            stall_time: self.stall_time.saturating_sub(earlier.stall_time),
            engine_time: self.engine_time.saturating_sub(earlier.engine_time),
            engine_ops: self.engine_ops.saturating_sub(earlier.engine_ops),
            prefetch_hits: self.prefetch_hits.saturating_sub(earlier.prefetch_hits),
            prefetch_misses: self.prefetch_misses.saturating_sub(earlier.prefetch_misses),
            prefetches_issued: self
                .prefetches_issued
                .saturating_sub(earlier.prefetches_issued),
            eviction_batches: self
                .eviction_batches
                .saturating_sub(earlier.eviction_batches),
            batched_evictions: self
                .batched_evictions
                .saturating_sub(earlier.batched_evictions),
            recompute: self.recompute.since(&earlier.recompute),
            ..self.clone()
        }
    }

    /// `prefetch_hits / (prefetch_hits + prefetch_misses)`, or `None` when no spilled tensor
    /// was read.
    pub fn prefetch_hit_rate(&self) -> Option<f64> {
        let total = self.prefetch_hits + self.prefetch_misses;
        (total > 0).then(|| self.prefetch_hits as f64 / total as f64)
    }
}

/// What one step did: the difference of the counters between its boundaries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepStats {
    /// The step's number (the tape's step counter).
    pub step: u64,
    /// Prefetch hits during the step.
    pub prefetch_hits: u64,
    /// Prefetch misses during the step.
    pub prefetch_misses: u64,
    /// Time ops waited for bytes during the step.
    pub stall_time: Duration,
    /// Evictions.
    pub device_to_host: MoveStats,
    /// Restores from the host tier.
    pub host_to_device: MoveStats,
    /// Host tier overflow.
    pub host_to_disk: MoveStats,
    /// Restores from spill files.
    pub disk_to_device: MoveStats,
    /// The device peak the plan expected: the peak of the recorded step the plan was learned
    /// from (0 without a plan).
    pub planned_peak_device_bytes: u64,
    /// The device peak during this step.
    pub actual_peak_device_bytes: u64,
    /// Windows the plan in force cut the step into (see `prefetch_window`).
    pub windows: u32,
    /// Of those, windows whose planned moves exceed what the measured bandwidth carries in
    /// their compute time: the link is saturated there and ops will stall.
    pub saturated_windows: u32,
}

impl StepStats {
    /// Bytes the step moved in all four directions.
    pub fn bytes_moved(&self) -> u64 {
        self.device_to_host.bytes
            + self.host_to_device.bytes
            + self.host_to_disk.bytes
            + self.disk_to_device.bytes
    }
}
