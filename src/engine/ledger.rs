//! Per-device accounting: live tensors, bytes per tier, peaks and the traffic between tiers.
//!
//! Every `SpillTensor` reports its creation, each move between tiers and its last drop here, so
//! the ledger always knows what is alive and where. It returns to zero when every handle is
//! gone, which the tests use to prove that nothing leaks.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::slot::Tier;
use super::thread_counts::ThreadCounts;
use crate::stats::{MoveStats, RecomputeStats, SpillStats, TierBytes};

/// What a tensor is for, as far as burn-spill can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TensorRole {
    /// Created inside `Backend::memory_persistent_allocations` (module parameters at init or load).
    Parameter,
    /// Everything else: activations, gradients, optimizer state, temporaries.
    Other,
}

/// A snapshot of what is alive on one device, wherever its bytes are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LiveSummary {
    /// Distinct live tensors (clones of a handle count once).
    pub tensors: u64,
    /// Sum of their logical sizes in bytes.
    pub bytes: u64,
    /// Live tensors tagged as parameters.
    pub parameter_tensors: u64,
    /// Bytes of live tensors tagged as parameters.
    pub parameter_bytes: u64,
    /// The largest `bytes` value seen since the ledger was created.
    pub peak_bytes: u64,
    /// Tensors created since the ledger was created.
    pub created_total: u64,
}

/// The four directions bytes move in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Eviction.
    DeviceToHost = 0,
    /// Restore from host.
    HostToDevice = 1,
    /// Host tier overflow.
    HostToDisk = 2,
    /// Restore from disk.
    DiskToDevice = 3,
}

impl Direction {
    /// The tiers it moves between.
    pub fn tiers(self) -> (Tier, Tier) {
        match self {
            Direction::DeviceToHost => (Tier::Device, Tier::Host),
            Direction::HostToDevice => (Tier::Host, Tier::Device),
            Direction::HostToDisk => (Tier::Host, Tier::Disk),
            Direction::DiskToDevice => (Tier::Disk, Tier::Device),
        }
    }
}

#[derive(Debug, Default)]
struct MoveCounter {
    count: AtomicU64,
    bytes: AtomicU64,
    nanos: AtomicU64,
    /// `u64::MAX` less the fastest move's nanoseconds (0: none yet), so that `fetch_max` keeps
    /// the fastest.
    fastest_complement: AtomicU64,
}

impl MoveCounter {
    fn snapshot(&self) -> MoveStats {
        MoveStats {
            count: self.count.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            time: Duration::from_nanos(self.nanos.load(Ordering::Relaxed)),
            fastest: self.fastest(),
        }
    }

    fn fastest(&self) -> Option<Duration> {
        match self.fastest_complement.load(Ordering::Relaxed) {
            0 => None,
            complement => Some(Duration::from_nanos(u64::MAX - complement)),
        }
    }
}

/// One in this many of the engine's works is timed (see [`Ledger::engine_work`]): two clock
/// reads around every op's work were a tenth of what the engine added to an op under a budget
/// (perf, the tiny Transformer of `benches/step_profile.rs` at 30% of its peak on Flex: 69 of
/// 892 us per step in `__vdso_clock_gettime`). Drawn at random rather than every n-th, so that
/// a program whose ops repeat with a period of n is not timed at one op of it only.
pub const ENGINE_WORK_SAMPLING: u32 = 4;

thread_local! {
    /// Nanoseconds this thread stalled, so that [`Ledger::engine_work`] can leave them out.
    static STALLED_HERE: Cell<u64> = const { Cell::new(0) };
}

/// Raises `peak` to `now` if higher. Peaks are rarely beaten, and a plain load is much cheaper
/// than `fetch_max`'s compare-and-swap loop on every tensor creation.
fn raise_peak(peak: &AtomicU64, now: u64) {
    if now > peak.load(Ordering::Relaxed) {
        peak.fetch_max(now, Ordering::Relaxed);
    }
}

/// Lock-free counters for one device.
///
/// Atomics rather than a mutex: handles are created on every op and dropped on any thread
/// (autodiff's backward, dataloader workers, metric threads), so this must be cheap and never
/// block.
#[derive(Debug, Default)]
pub struct Ledger {
    // Live tensors and their bytes are derived (created less released; the tiers plus the
    // dropped bytes) rather than counted: each shared counter is one more atomic
    // read-modify-write on every tensor's creation and drop, the engine's costliest
    // instructions while memory is ample. The counts that only grow and that no decision reads
    // at once are kept per thread (see `thread_counts`).
    growing: ThreadCounts<2>,
    parameter_tensors: AtomicU64,
    parameter_bytes: AtomicU64,
    peak_bytes: AtomicU64,
    /// See [`Ledger::device_arrivals`]. Shared: the pool watch reads it after every op.
    device_arrived: AtomicU64,
    tier: [AtomicU64; 3],
    tier_peak: [AtomicU64; 3],
    parameter_tier: [AtomicU64; 3],
    moves: [MoveCounter; 4],
    over_budget_ops: AtomicU64,
    largest_over_budget: AtomicU64,
    unevictable: AtomicU64,
    estimate_misses: AtomicU64,
    disk_write_errors: AtomicU64,
    stall_nanos: AtomicU64,
    /// See [`Ledger::engine_work`].
    engine_nanos: AtomicU64,
    engine_ops: AtomicU64,
    prefetch_hits: AtomicU64,
    prefetch_misses: AtomicU64,
    prefetch_issued: AtomicU64,
    step_peak_device: AtomicU64,
    batches: AtomicU64,
    batched_tensors: AtomicU64,
    dropped: AtomicU64,
    dropped_bytes: AtomicU64,
    dropped_now: AtomicU64,
    rebuilt: AtomicU64,
    rebuilt_bytes: AtomicU64,
    chained_rebuilds: AtomicU64,
    ghosts_recomputed: AtomicU64,
    rebuild_nanos: AtomicU64,
}

/// The counters of `Ledger::growing`: tensors created and tensors released (read for the
/// statistics only).
const CREATED: usize = 0;
const RELEASED: usize = 1;

impl Ledger {
    /// Records a new live tensor of `bytes` bytes on the device.
    pub fn on_create(&self, bytes: u64, role: TensorRole) {
        self.growing.add(CREATED, 1);
        if role == TensorRole::Parameter {
            self.parameter_tensors.fetch_add(1, Ordering::Relaxed);
            self.parameter_bytes.fetch_add(bytes, Ordering::Relaxed);
        }
        self.add_to_tier(Tier::Device, bytes, role);
        raise_peak(&self.peak_bytes, self.live_bytes());
    }

    /// Bytes of the live tensors, wherever they are: the tiers' bytes and the dropped ones.
    /// (A move between tiers on another thread counts its bytes twice, or not at all, for the
    /// instant between its two updates.)
    fn live_bytes(&self) -> u64 {
        self.tier
            .iter()
            .map(|t| t.load(Ordering::Relaxed))
            .sum::<u64>()
            + self.dropped_now.load(Ordering::Relaxed)
    }

    /// Live tensors: created less released.
    fn live_tensors(&self) -> u64 {
        let released = self.growing.total(RELEASED);
        // Read apart from `released`, a racing creation and drop may be seen in either order.
        self.growing.total(CREATED).saturating_sub(released)
    }

    /// Records a tensor dropped from the device, to be rebuilt when next used: its bytes are
    /// in no tier until then.
    pub fn on_dropped_for_rebuild(&self, bytes: u64, role: TensorRole) {
        self.remove_from_tier(Tier::Device, bytes, role);
        self.dropped.fetch_add(1, Ordering::Relaxed);
        self.dropped_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.dropped_now.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Records a dropped tensor rebuilt on the device by running its op again in `took`.
    pub fn on_rebuilt(&self, bytes: u64, role: TensorRole, took: Duration) {
        self.dropped_now.fetch_sub(bytes, Ordering::Relaxed);
        self.add_to_tier(Tier::Device, bytes, role);
        self.rebuilt.fetch_add(1, Ordering::Relaxed);
        self.rebuilt_bytes.fetch_add(bytes, Ordering::Relaxed);
        let nanos = took.as_nanos().min(u64::MAX as u128) as u64;
        self.rebuild_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Records that a rebuild found `inputs` of its recipe's inputs dropped too (each rebuilt
    /// first).
    pub fn on_chained_rebuild(&self, inputs: u64) {
        if inputs > 0 {
            self.chained_rebuilds.fetch_add(inputs, Ordering::Relaxed);
        }
    }

    /// Records that a rebuild recomputed `ghosts` inputs the program had let go (see
    /// `backend/recipe.rs`).
    pub fn on_ghosts_recomputed(&self, ghosts: u64) {
        if ghosts > 0 {
            self.ghosts_recomputed.fetch_add(ghosts, Ordering::Relaxed);
        }
    }

    /// Records that the last handle of a dropped tensor is gone (it was never rebuilt).
    pub fn on_drop_while_dropped(&self, bytes: u64, role: TensorRole) {
        self.dropped_now.fetch_sub(bytes, Ordering::Relaxed);
        self.on_drop(bytes, role, None);
    }

    /// Records that the last handle of a tensor is gone; `tier` is where its bytes were
    /// (`None` when an op had already taken them).
    pub fn on_drop(&self, bytes: u64, role: TensorRole, tier: Option<Tier>) {
        self.growing.add(RELEASED, 1);
        if role == TensorRole::Parameter {
            self.parameter_tensors.fetch_sub(1, Ordering::Relaxed);
            self.parameter_bytes.fetch_sub(bytes, Ordering::Relaxed);
        }
        if let Some(tier) = tier {
            self.remove_from_tier(tier, bytes, role);
        }
    }

    /// Records time an op spent waiting for bytes (a move on its own thread, or a transfer in
    /// flight).
    pub fn on_stall(&self, took: Duration) {
        let nanos = took.as_nanos().min(u64::MAX as u128) as u64;
        self.stall_nanos.fetch_add(nanos, Ordering::Relaxed);
        STALLED_HERE.with(|stalled| stalled.set(stalled.get().wrapping_add(nanos)));
    }

    /// Runs `work`, the engine's own work on an op's thread while memory is tight (victim
    /// passes, prefetch scans, settling), and counts its time less the stalls inside it (the
    /// moves it made there and its waits for transfers, which `stall_time` counts already).
    /// `after_op` says whether this is an op's work after it ran (counted in `engine_ops`) or
    /// room made before one. One work in [`ENGINE_WORK_SAMPLING`], drawn at random, is timed
    /// and counts for that many: the time is an estimate, unbiased, and exact in the count of
    /// ops.
    pub fn engine_work<R>(&self, after_op: bool, work: impl FnOnce() -> R) -> R {
        let result = if fastrand::u32(..ENGINE_WORK_SAMPLING) == 0 {
            let stalled_before = STALLED_HERE.with(Cell::get);
            let started = Instant::now();
            let result = work();
            let took = started.elapsed().as_nanos().min(u64::MAX as u128) as u64;
            let stalled = STALLED_HERE.with(Cell::get).wrapping_sub(stalled_before);
            let own = took.saturating_sub(stalled);
            self.engine_nanos.fetch_add(
                own.saturating_mul(u64::from(ENGINE_WORK_SAMPLING)),
                Ordering::Relaxed,
            );
            result
        } else {
            work()
        };
        if after_op {
            self.engine_ops.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    /// Records what the prefetcher achieved for an op's inputs: `hits` were on the device
    /// because a prefetch brought them, `misses` had to be brought back by the op itself.
    pub fn on_prefetch_outcome(&self, hits: u64, misses: u64) {
        if hits > 0 {
            self.prefetch_hits.fetch_add(hits, Ordering::Relaxed);
        }
        if misses > 0 {
            self.prefetch_misses.fetch_add(misses, Ordering::Relaxed);
        }
    }

    /// Records one batched eviction of `tensors` tensors.
    pub fn on_batch(&self, tensors: u64) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.batched_tensors.fetch_add(tensors, Ordering::Relaxed);
    }

    /// Records a prefetch sent to a transfer worker.
    pub fn on_prefetch_issued(&self) {
        self.prefetch_issued.fetch_add(1, Ordering::Relaxed);
    }

    /// Count, bytes and time of the moves in one direction so far.
    pub fn moves(&self, direction: Direction) -> MoveStats {
        self.moves[direction as usize].snapshot()
    }

    /// The fastest single move measured in `direction`: about the fixed cost of one transfer.
    pub fn fastest_move(&self, direction: Direction) -> Option<Duration> {
        self.moves[direction as usize].fastest()
    }

    /// Records a move between tiers.
    pub fn on_move(&self, direction: Direction, bytes: u64, role: TensorRole, took: Duration) {
        let (from, to) = direction.tiers();
        self.add_to_tier(to, bytes, role);
        self.remove_from_tier(from, bytes, role);
        self.count_move(direction, bytes, took);
    }

    fn count_move(&self, direction: Direction, bytes: u64, took: Duration) {
        let counter = &self.moves[direction as usize];
        counter.count.fetch_add(1, Ordering::Relaxed);
        counter.bytes.fetch_add(bytes, Ordering::Relaxed);
        let nanos = took.as_nanos().min(u128::from(u64::MAX - 1)) as u64;
        counter.nanos.fetch_add(nanos, Ordering::Relaxed);
        raise_peak(&counter.fastest_complement, u64::MAX - nanos);
    }

    /// Records an eviction to the host tier if the host then holds at most `limit` bytes
    /// (always without one); returns whether it did. The host's bytes are taken atomically, so
    /// evictions racing on several threads never take more than the limit between them.
    pub fn try_evict_to_host(
        &self,
        bytes: u64,
        role: TensorRole,
        took: Duration,
        limit: Option<u64>,
    ) -> bool {
        let host = &self.tier[Tier::Host.index()];
        let now = match limit {
            None => host.fetch_add(bytes, Ordering::Relaxed) + bytes,
            Some(limit) => {
                let fits = |held: u64| held.checked_add(bytes).filter(|&now| now <= limit);
                match host.fetch_update(Ordering::Relaxed, Ordering::Relaxed, fits) {
                    Ok(held) => held + bytes,
                    Err(_) => return false,
                }
            }
        };
        raise_peak(&self.tier_peak[Tier::Host.index()], now);
        if role == TensorRole::Parameter {
            self.parameter_tier[Tier::Host.index()].fetch_add(bytes, Ordering::Relaxed);
        }
        self.remove_from_tier(Tier::Device, bytes, role);
        self.count_move(Direction::DeviceToHost, bytes, took);
        true
    }

    /// Records an eviction that passed through a host buffer straight to disk (the host tier
    /// was full): counted as both moves, without the bytes ever counting on the host.
    pub fn on_evict_through_host(
        &self,
        bytes: u64,
        role: TensorRole,
        read_took: Duration,
        write_took: Duration,
    ) {
        self.add_to_tier(Tier::Disk, bytes, role);
        self.remove_from_tier(Tier::Device, bytes, role);
        self.count_move(Direction::DeviceToHost, bytes, read_took);
        self.count_move(Direction::HostToDisk, bytes, write_took);
    }

    /// Bytes resident in `tier` now.
    pub fn resident(&self, tier: Tier) -> u64 {
        self.tier[tier.index()].load(Ordering::Relaxed)
    }

    /// Bytes of tensors dropped from the device to be rebuilt, now.
    pub fn dropped_now(&self) -> u64 {
        self.dropped_now.load(Ordering::Relaxed)
    }

    /// Records device bytes that may not leave the device (strided views), now created (`true`)
    /// or dropped (`false`).
    pub fn on_unevictable(&self, bytes: u64, created: bool) {
        if created {
            self.unevictable.fetch_add(bytes, Ordering::Relaxed);
        } else {
            self.unevictable.fetch_sub(bytes, Ordering::Relaxed);
        }
    }

    /// Device bytes that may not leave the device.
    pub fn unevictable(&self) -> u64 {
        self.unevictable.load(Ordering::Relaxed)
    }

    /// Counts an op that ran over the budget while the device held `bytes`.
    pub fn on_over_budget(&self, bytes: u64) {
        self.over_budget_ops.fetch_add(1, Ordering::Relaxed);
        self.largest_over_budget.fetch_max(bytes, Ordering::Relaxed);
    }

    /// Counts an op whose outputs were larger than estimated.
    pub fn on_estimate_miss(&self) {
        self.estimate_misses.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a failed spill-file write.
    pub fn on_disk_write_error(&self) {
        self.disk_write_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Lowers each tier's peak to what it holds now.
    pub fn reset_peaks(&self) {
        for tier in Tier::ALL {
            let now = self.resident(tier);
            self.tier_peak[tier.index()].store(now, Ordering::Relaxed);
        }
        self.largest_over_budget.store(0, Ordering::Relaxed);
    }

    fn add_to_tier(&self, tier: Tier, bytes: u64, role: TensorRole) {
        let i = tier.index();
        let now = self.tier[i].fetch_add(bytes, Ordering::Relaxed) + bytes;
        raise_peak(&self.tier_peak[i], now);
        if tier == Tier::Device {
            raise_peak(&self.step_peak_device, now);
            self.device_arrived.fetch_add(bytes, Ordering::Relaxed);
        }
        if role == TensorRole::Parameter {
            self.parameter_tier[i].fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// Bytes that ever arrived on the device (created there, restored or prefetched): the
    /// allocations the inner pool served, so what its reserved bytes can have grown with.
    pub fn device_arrivals(&self) -> u64 {
        self.device_arrived.load(Ordering::Relaxed)
    }

    /// The device peak since the last call (or since creation), and starts the next period at
    /// the bytes resident now.
    pub fn take_step_peak(&self) -> u64 {
        self.step_peak_device
            .swap(self.resident(Tier::Device), Ordering::Relaxed)
    }

    fn remove_from_tier(&self, tier: Tier, bytes: u64, role: TensorRole) {
        let i = tier.index();
        self.tier[i].fetch_sub(bytes, Ordering::Relaxed);
        if role == TensorRole::Parameter {
            self.parameter_tier[i].fetch_sub(bytes, Ordering::Relaxed);
        }
    }

    /// A consistent-enough snapshot (each counter is read atomically on its own).
    pub fn summary(&self) -> LiveSummary {
        LiveSummary {
            tensors: self.live_tensors(),
            bytes: self.live_bytes(),
            parameter_tensors: self.parameter_tensors.load(Ordering::Relaxed),
            parameter_bytes: self.parameter_bytes.load(Ordering::Relaxed),
            peak_bytes: self.peak_bytes.load(Ordering::Relaxed),
            created_total: self.growing.total(CREATED),
        }
    }

    /// The counters as [`SpillStats`] (limits left for the caller to fill in).
    pub fn stats(&self) -> SpillStats {
        let tiers = |a: &[AtomicU64; 3]| TierBytes {
            device: a[0].load(Ordering::Relaxed),
            host: a[1].load(Ordering::Relaxed),
            disk: a[2].load(Ordering::Relaxed),
        };
        let resident = tiers(&self.tier);
        let parameter_resident = tiers(&self.parameter_tier);
        let moves: Vec<MoveStats> = self.moves.iter().map(MoveCounter::snapshot).collect();
        let spilled_parameter_bytes = parameter_resident.host + parameter_resident.disk;
        SpillStats {
            device_budget_bytes: None,
            host_limit_bytes: None,
            resident,
            peak: tiers(&self.tier_peak),
            parameter_resident,
            live_tensors: self.live_tensors(),
            parameter_tensors: self.parameter_tensors.load(Ordering::Relaxed),
            spilled_other_bytes: (resident.host + resident.disk)
                .saturating_sub(spilled_parameter_bytes),
            spilled_parameter_bytes,
            device_to_host: moves[0],
            host_to_device: moves[1],
            host_to_disk: moves[2],
            disk_to_device: moves[3],
            over_budget_ops: self.over_budget_ops.load(Ordering::Relaxed),
            largest_over_budget_op_bytes: self.largest_over_budget.load(Ordering::Relaxed),
            unevictable_device_bytes: self.unevictable.load(Ordering::Relaxed),
            estimate_misses: self.estimate_misses.load(Ordering::Relaxed),
            disk_write_errors: self.disk_write_errors.load(Ordering::Relaxed),
            time_moving: moves.iter().map(|m| m.time).sum(),
            stall_time: Duration::from_nanos(self.stall_nanos.load(Ordering::Relaxed)),
            engine_time: Duration::from_nanos(self.engine_nanos.load(Ordering::Relaxed)),
            engine_ops: self.engine_ops.load(Ordering::Relaxed),
            prefetch_hits: self.prefetch_hits.load(Ordering::Relaxed),
            prefetch_misses: self.prefetch_misses.load(Ordering::Relaxed),
            prefetches_issued: self.prefetch_issued.load(Ordering::Relaxed),
            eviction_batches: self.batches.load(Ordering::Relaxed),
            batched_evictions: self.batched_tensors.load(Ordering::Relaxed),
            last_step: None,
            pool: None,
            cold_tiers: Vec::new(),
            recompute: RecomputeStats {
                dropped: self.dropped.load(Ordering::Relaxed),
                dropped_bytes: self.dropped_bytes.load(Ordering::Relaxed),
                rebuilt: self.rebuilt.load(Ordering::Relaxed),
                rebuilt_bytes: self.rebuilt_bytes.load(Ordering::Relaxed),
                chained_rebuilds: self.chained_rebuilds.load(Ordering::Relaxed),
                ghosts_recomputed: self.ghosts_recomputed.load(Ordering::Relaxed),
                rebuild_time: Duration::from_nanos(self.rebuild_nanos.load(Ordering::Relaxed)),
                dropped_now_bytes: self.dropped_now.load(Ordering::Relaxed),
                // The engine's choice, not a counter: the engine fills it in.
                behaviour: None,
            },
            // The engine's mode, not a counter: the engine fills it in.
            ops_tracked: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_return_to_zero_and_keep_the_peak() {
        let ledger = Ledger::default();
        ledger.on_create(100, TensorRole::Other);
        ledger.on_create(50, TensorRole::Parameter);
        assert_eq!(ledger.summary().bytes, 150);
        assert_eq!(ledger.summary().parameter_bytes, 50);
        ledger.on_drop(100, TensorRole::Other, Some(Tier::Device));
        ledger.on_drop(50, TensorRole::Parameter, Some(Tier::Device));
        let s = ledger.summary();
        assert_eq!(
            (s.tensors, s.bytes, s.parameter_tensors, s.parameter_bytes),
            (0, 0, 0, 0)
        );
        assert_eq!(s.peak_bytes, 150);
        assert_eq!(s.created_total, 2);
    }

    #[test]
    fn moves_shift_bytes_between_tiers_and_split_parameters() {
        let ledger = Ledger::default();
        ledger.on_create(100, TensorRole::Other);
        ledger.on_create(40, TensorRole::Parameter);
        ledger.on_move(
            Direction::DeviceToHost,
            100,
            TensorRole::Other,
            Duration::from_micros(3),
        );
        ledger.on_move(
            Direction::DeviceToHost,
            40,
            TensorRole::Parameter,
            Duration::ZERO,
        );
        ledger.on_move(
            Direction::HostToDisk,
            40,
            TensorRole::Parameter,
            Duration::ZERO,
        );
        let s = ledger.stats();
        assert_eq!(
            (s.resident.device, s.resident.host, s.resident.disk),
            (0, 100, 40)
        );
        assert_eq!(
            (s.spilled_other_bytes, s.spilled_parameter_bytes),
            (100, 40)
        );
        assert_eq!(s.device_to_host.count, 2);
        assert_eq!(s.peak.device, 140);
        ledger.on_move(
            Direction::DiskToDevice,
            40,
            TensorRole::Parameter,
            Duration::ZERO,
        );
        ledger.reset_peaks();
        assert_eq!(ledger.stats().peak.device, 40);
        ledger.on_drop(100, TensorRole::Other, Some(Tier::Host));
        ledger.on_drop(40, TensorRole::Parameter, Some(Tier::Device));
        let s = ledger.stats();
        assert_eq!(
            (
                s.resident.device,
                s.resident.host,
                s.resident.disk,
                s.live_tensors
            ),
            (0, 0, 0, 0)
        );
        assert!(s.time_moving >= Duration::from_micros(3));
    }

    #[test]
    fn the_fastest_move_per_direction_is_kept() {
        let ledger = Ledger::default();
        assert_eq!(ledger.fastest_move(Direction::HostToDevice), None);
        for micros in [7, 2, 5] {
            ledger.on_create(10, TensorRole::Other);
            ledger.on_move(
                Direction::DeviceToHost,
                10,
                TensorRole::Other,
                Duration::ZERO,
            );
            ledger.on_move(
                Direction::HostToDevice,
                10,
                TensorRole::Other,
                Duration::from_micros(micros),
            );
        }
        assert_eq!(
            ledger.fastest_move(Direction::HostToDevice),
            Some(Duration::from_micros(2))
        );
        assert_eq!(
            ledger.fastest_move(Direction::DeviceToHost),
            Some(Duration::ZERO)
        );
        assert_eq!(ledger.fastest_move(Direction::DiskToDevice), None);
        // The snapshot carries it, and a difference of snapshots keeps the later figure.
        let stats = ledger.stats();
        assert_eq!(stats.host_to_device.fastest, Some(Duration::from_micros(2)));
        assert_eq!(stats.disk_to_device.fastest, None);
        let since = stats.since(&SpillStats::default());
        assert_eq!(since.host_to_device.fastest, Some(Duration::from_micros(2)));
    }

    #[test]
    fn engine_work_leaves_out_its_own_stalls_and_counts_ops_after_them() {
        let ledger = Ledger::default();
        // Work that is all stall (a move on the op's thread) adds no engine time; only the
        // work after an op counts as an engine op.
        let got = ledger.engine_work(true, || {
            ledger.on_stall(Duration::from_secs(3600));
            7
        });
        assert_eq!(got, 7);
        ledger.engine_work(false, || ledger.on_stall(Duration::from_secs(3600)));
        let stats = ledger.stats();
        assert_eq!(stats.engine_time, Duration::ZERO);
        assert_eq!(stats.engine_ops, 1);
        assert_eq!(stats.stall_time, Duration::from_secs(7200));
        // Stalls on another thread meanwhile are not this work's. One work in four is timed,
        // for four: 400 works of 100 us or more count 40 ms or more (under 20 ms only if fewer
        // than 50 of them were drawn, where 100 are expected: about once in 10^8 runs; counted
        // once each, the drawn ones would make about a quarter).
        for _ in 0..400 {
            ledger.engine_work(true, || {
                std::thread::scope(|s| {
                    s.spawn(|| ledger.on_stall(Duration::from_secs(3600)));
                });
                std::thread::sleep(Duration::from_micros(100));
            });
        }
        let stats = ledger.stats().since(&stats);
        assert!(stats.engine_time >= Duration::from_millis(20), "{stats:?}");
        assert_eq!(stats.engine_ops, 400);
    }
}
