//! `DeviceEngine`: the budget, the tiers and the moves of one device.
//!
//! An op tells the engine what it is about to read ([`DeviceEngine::begin_op`]); the engine pins
//! those inputs and evicts the coldest other tensors until the inputs that must come back plus
//! the op's estimated output fit the budget. After the op ([`DeviceEngine::end_op`]) the outputs
//! join the index, the estimate learns the real output size, and ([`DeviceEngine::settle`]) the
//! device is brought back under the high watermark.
//!
//! This file holds the engine's state and configuration; each job is a file of its own:
//! [`admit`] (one op, before and after `B` runs it), [`ample`] (ops untracked while memory is
//! ample), [`settle`] (after an op, and the workers'
//! jobs), [`prefetch`], [`evict`] (victims and eviction passes), [`recompute`] (a victim
//! dropped to be rebuilt instead of moved), [`moves`] (one slot between tiers), [`step`] (the
//! step and its plan) and [`limits_cell`] (the limits, read per op without a lock).
//!
//! Lock order: a tensor's own lock may be held while taking the cold-tier lock, never the
//! reverse;
//! the index lock is only taken while holding neither (victims are upgraded under the index lock
//! and moved after it is released), so a handle may drop on any thread at any time.

mod admit;
mod ample;
mod evict;
mod known_sizes;
mod limits_cell;
mod moves;
mod plan_cell;
mod prefetch;
mod recompute;
mod settle;
mod step;

/// What the device engine's tests share.
#[cfg(test)]
mod test_support {
    use crate::engine::slot::TensorId;
    use crate::tape::OpRecord;

    /// An op of a test's tape that reads `inputs` and makes `outputs`.
    pub(super) fn op(inputs: Vec<TensorId>, outputs: Vec<TensorId>) -> OpRecord {
        OpRecord {
            name: "op".into(),
            inputs,
            outputs,
            start_ns: 0,
            duration_ns: 1,
            thread: 1,
        }
    }
}

use crate::policy::prefetch::{Wasted, WastedFor};
pub use admit::{OpInput, OpOutput, OpTicket};
pub use ample::UntrackedOp;
use limits_cell::LimitsCell;
pub use moves::HandOver;
use plan_cell::PlanCell;
use settle::SettleGoal;
use step::StepCounters;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use crate::SpillError;
use crate::engine::cold_tiers::ColdTiers;
use crate::engine::disk::DiskStore;
use crate::engine::index::{Index, Spillable};
use crate::engine::ledger::Ledger;
use crate::engine::pool::PoolWatch;
use crate::engine::queues::{DeviceQueues, SingleQueue};
use crate::engine::slot::{TensorId, Tier};
use crate::engine::transfer::Transfers;
use crate::fast_hash::FastMap;
use crate::policy::plan::PlanKey;
use crate::policy::recompute::RebuildTimes;
use crate::policy::{PolicyKind, RecomputeMode};
use crate::stats::SpillStats;
use crate::tape::Recorder;

/// The resolved limits of one device, in bytes. `Copy`: the per-op path reads them twice an
/// op, and a copy costs less than counting a shared reference (two atomic operations).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Limits {
    /// Hard device budget (`None` = unlimited: nothing is tracked or moved).
    pub budget: Option<u64>,
    /// Host-tier cap (`None` = unlimited).
    pub host_limit: Option<u64>,
    /// After an op, spill when device bytes exceed this...
    pub high_water: u64,
    /// ...down to this.
    pub low_water: u64,
    /// Panic instead of running over the budget.
    pub strict: bool,
    /// Which tensors leave first.
    pub policy: PolicyKind,
    /// How many ops ahead spilled tensors are brought back (0 = no prefetch).
    pub prefetch_window: u32,
    /// Whether evictions after ops, host overflow and prefetches run on the transfer workers.
    pub asynchronous: bool,
    /// Free pages go back to the driver once the inner pool reserves this many bytes beyond
    /// those in use (where the backend reports its pool).
    pub pool_margin: u64,
    /// Whether host copies are checksummed at eviction and checked when they leave the host
    /// (see [`crate::engine::integrity`]).
    pub verify_restores: bool,
    /// Whether spills try the remote tier before the spill file.
    pub remote_first: bool,
    /// Whether victims may be dropped and rebuilt instead of moved.
    pub recompute: RecomputeMode,
    /// Where a rebuild's op time comes from when `recompute` weighs it against a move.
    pub rebuild_times: RebuildTimes,
    /// Where room for rebuilds is made ahead, when the config sets it (under `both`, it
    /// limits the behaviours a plan may choose).
    pub rebuild_room: Option<crate::policy::recompute::RebuildRoom>,
    /// Whether the step's state stays on the device while other victims suffice, when the
    /// config sets it (under `both`, it limits the behaviours a plan may choose; unset, `both`
    /// chooses and the other modes move the state).
    pub keep_state: Option<bool>,
    /// How room is made early for the step's peak, when the config sets it (unset, `both` and
    /// `recompute` choose per plan and `swap` makes it a share at a time).
    pub early_room: Option<crate::policy::recompute::EarlyRoom>,
}

impl Limits {
    /// Whether the engine keys tensors for the use plan (a tape-driven policy or prefetch).
    pub fn planning(&self) -> bool {
        self.policy != PolicyKind::Lru || self.prefetch_window > 0
    }
}

/// The engine of one device.
#[derive(Default)]
pub struct DeviceEngine {
    ledger: Ledger,
    limits: LimitsCell,
    tracking: AtomicBool,
    index: Mutex<Index>,
    /// The spill file and any remote store, in the order writes try them.
    cold: Mutex<ColdTiers>,
    warned_ops: Mutex<HashSet<&'static str>>,
    recorder: Recorder,
    /// Whether the current step was opened by `step_begin` and not yet closed.
    in_marked_step: AtomicBool,
    /// The use plan learned from the last recorded step, with the generation it was put in
    /// force under.
    plan: PlanCell,
    /// The plan's [`UsePlan::max_headroom`] plus one, 0 without a plan: read after every op
    /// without taking the plan's lock.
    plan_headroom: AtomicU64,
    plan_epoch: Mutex<Option<(u64, u64)>>,
    /// The step the per-step counters were last closed for, plus one (0 before the first).
    step_seen: AtomicU64,
    /// Extra ops of lead per plan key, grown each time that tensor arrived late. A spilled
    /// tensor is placed for the prefetch scan its lead before its use (see `Placement::due`).
    leads: Mutex<FastMap<PlanKey, u32>>,
    /// Uses of plan keys whose prefetch was wasted, and how many times: how much nearer that
    /// use they are fetched.
    wasted: Mutex<FastMap<WastedFor, Wasted>>,
    transfers: Transfers,
    /// Bytes on their way to the device (counted there by budget decisions).
    inflight_in: AtomicU64,
    /// Bytes reserved by admitted ops that have not ended yet (their inputs to restore and
    /// their estimated outputs): an op on another thread, admitted meanwhile, must count them,
    /// or both ops' bytes land on a device that had room for one.
    /// Written only under the index's lock (see `add_reserved`).
    reserved_for_ops: AtomicU64,
    settle_queued: AtomicBool,
    /// Where the queued eviction job brings the device: set after every op that wants one.
    settle_goal: Mutex<SettleGoal>,
    /// How many ops a prefetch takes from queueing to arrival, recently at worst (decaying):
    /// every trigger moves that much earlier.
    transfer_ops: AtomicU32,
    overflow_queued: AtomicBool,
    steps: Mutex<StepCounters>,
    /// The plan's time windows: how many, and how many are saturated.
    windows: Mutex<(u32, u32)>,
    /// How busy the link would be over the last checked step if every victim were moved (an
    /// `f64`'s bits): what the drop decision weighs a move's link time by.
    link_utilization: AtomicU64,
    /// Under `recompute = both`: the behaviour chosen for the plan in force (see
    /// [`recompute::BehaviourCell`]).
    behaviour: Arc<recompute::BehaviourCell>,
    /// The device profile `both` dry-runs a recorded step on to choose its behaviour (the
    /// configured `rebuild_profile`, or the backend's default); `None` for this machine as
    /// measured.
    rebuild_profile: Mutex<Option<Arc<crate::plan::DeviceProfile>>>,
    /// The average op time of the last checked step (an `f64`'s seconds, as bits), timed as
    /// rebuilds are: how fast the ops grow the device, against which the settle weighs how
    /// fast the link empties it (see `policy::prefetch::settle_lookahead`).
    op_seconds: AtomicU64,
    /// The inner backend's device queues, installed by the adapter on first use.
    queues: OnceLock<Arc<dyn DeviceQueues>>,
    /// The inner allocator's figures and cleanups.
    pool: PoolWatch,
    /// Whether ops run untracked while memory is ample, and what they made.
    ample: ample::Ample,
    /// Which learnt output sizes the index holds, read without its lock.
    known_sizes: known_sizes::KnownSizes,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while one of these is held leaves plain bookkeeping that is still consistent
    // enough to keep going (and the panic itself is what the user sees).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

thread_local! {
    /// The engine whose queues last noted this thread's queue (most threads use one device).
    static NOTED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl DeviceEngine {
    /// The counters.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Installs the inner backend's queues unless some are installed already.
    pub fn install_queues(&self, make: impl FnOnce() -> Arc<dyn DeviceQueues>) {
        self.queues.get_or_init(make);
    }

    /// The inner backend's device queues (one queue until the adapter installs them).
    pub fn queues(&self) -> &dyn DeviceQueues {
        static SINGLE: SingleQueue = SingleQueue;
        match self.queues.get() {
            Some(queues) => queues.as_ref(),
            None => &SINGLE,
        }
    }

    /// Remembers the calling thread's device queue as one holding this device's tensors (once
    /// per thread while it keeps to this device).
    pub fn note_thread(&self) {
        let me = self as *const Self as usize;
        if NOTED.with(|n| n.replace(me)) != me {
            self.queues().note_current();
        }
    }

    /// Reads the inner pool and returns its free pages if it holds more than the margin
    /// beyond what is in use.
    fn check_pool(&self) {
        let limits = self.limits();
        if limits.budget.is_some() {
            self.pool.check(
                self.ledger.resident(Tier::Device),
                self.ledger.device_arrivals(),
                limits.pool_margin,
                self.queues(),
            );
        }
    }

    /// Returns every free page of the inner pool to the driver, on every queue this device's
    /// threads used, once the workers are idle (`SpillBackend::memory_cleanup`).
    pub fn return_pool_pages(&self) {
        self.quiesce();
        self.pool.cleanup_now(self.queues());
    }

    /// Lowers the ledger's and the pool's peaks to what is held now.
    pub fn reset_peaks(&self) {
        self.ledger.reset_peaks();
        self.pool.reset_peaks(self.queues());
    }

    /// The tape recorder of this device.
    pub fn recorder(&self) -> &Recorder {
        &self.recorder
    }

    /// Whether a budget is in force (otherwise ops skip the engine entirely).
    pub fn is_tracking(&self) -> bool {
        self.tracking.load(Ordering::Relaxed)
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.limits.get()
    }

    /// Runs `f` on the limits in force without copying them (the per-op paths' read).
    pub fn with_limits<R>(&self, f: impl FnOnce(&Limits) -> R) -> R {
        self.limits.with(f)
    }

    /// Installs new limits. The disk store is created when the host tier is capped or a spill
    /// directory was given (so a bad directory is reported now, not mid-training); `spill_base`
    /// `None` means the system temp dir. `remote` is the remote cold tier's URL, if one is
    /// configured (it takes part only while a budget is in force).
    pub fn apply(
        &self,
        limits: Limits,
        spill_base: Option<&Path>,
        remote: Option<&str>,
    ) -> Result<(), SpillError> {
        self.quiesce();
        // A remote tier falls back to the spill file when it fails, so it wants one too.
        let wants_disk = limits.budget.is_some()
            && (limits.host_limit.is_some() || spill_base.is_some() || remote.is_some());
        {
            let mut cold = lock(&self.cold);
            set_up_remote(&mut cold, &limits, remote)?;
            let base = spill_base.map_or_else(std::env::temp_dir, Path::to_path_buf);
            let records = cold.disk_records();
            let same_base = matches!(cold.disk(), Some((current, _)) if *current == base);
            if wants_disk && !same_base {
                if let Some((_, store)) = cold.disk()
                    && records > 0
                {
                    return Err(SpillError::SpillDirInUse {
                        current: store.dir().to_path_buf(),
                        requested: base,
                        records,
                    });
                }
                let store = DiskStore::create(&base).map_err(|source| SpillError::SpillDir {
                    path: base.clone(),
                    source,
                })?;
                cold.set_disk(Some((base, store)));
            } else if !wants_disk && records == 0 {
                // No disk tier any more: remove the old directory now. One that still holds
                // records stays until they are restored or dropped.
                cold.set_disk(None);
            }
        }
        if limits.budget.is_some() && limits.planning() && !self.recorder.is_enabled() {
            // The plan is learned from the tape.
            self.recorder.set_enabled(true);
        }
        self.tracking
            .store(limits.budget.is_some(), Ordering::Relaxed);
        self.limits.set(limits);
        let has_plan = self.plan().is_some();
        // What `both` chose was for the old limits: choose again for the plan in force.
        self.behaviour.forget();
        if let (_, Some(tape)) = self.recorder.last_two()
            && has_plan
        {
            self.choose_behaviour(&tape);
        }
        {
            let mut index = lock(&self.index);
            self.order_index(&mut index, has_plan);
            // New limits (a shorter prefetch window) may offer tensors a pass found none of.
            index.forget_fruitless_room();
        }
        self.reset_ample();
        self.reset_peaks();
        self.settle();
        Ok(())
    }

    /// Stats with the limits filled in, once the transfer workers are idle.
    pub fn stats(&self) -> SpillStats {
        self.quiesce();
        let limits = self.limits();
        let mut stats = SpillStats {
            device_budget_bytes: limits.budget,
            host_limit_bytes: limits.host_limit,
            last_step: self.last_step_stats(),
            pool: self.pool.stats(self.queues()),
            cold_tiers: lock(&self.cold).stats(),
            ops_tracked: limits.budget.is_some() && self.tracks_all(),
            ..self.ledger.stats()
        };
        self.behaviour.settle();
        stats.recompute.behaviour = self.chosen_behaviour(&limits);
        stats
    }

    /// The spill file, once one exists.
    pub fn spill_file(&self) -> Option<PathBuf> {
        lock(&self.cold)
            .disk()
            .map(|(_, s)| s.file_path().to_path_buf())
    }

    /// Test hook: the next `n` spill-file writes fail as if the disk were full.
    pub fn fail_next_disk_writes(&self, n: u32) {
        lock(&self.cold).fail_next_disk_writes(n);
    }

    /// Adds a newly created tensor to the index (only while tracking).
    pub fn register(&self, id: TensorId, bytes: u64, victim: Weak<dyn Spillable>) {
        let mut index = lock(&self.index);
        let tick = index.next_tick();
        index.admit_output(id, bytes, tick, || victim, None);
    }

    /// Forgets a dropped tensor.
    pub fn unregister(&self, id: TensorId) {
        lock(&self.index).remove(id);
    }

    /// The workers of this device.
    pub(crate) fn transfers(&self) -> &Transfers {
        &self.transfers
    }

    /// Waits until the transfer workers have nothing queued or running, so counters and tiers
    /// are settled. Returns at once on a worker.
    pub fn quiesce(&self) {
        self.transfers.quiesce();
    }
}

/// Connects the remote tier the limits ask for (with a budget in force), keeps the one already
/// connected to the same URL, and removes one no longer wanted once it holds no records.
fn set_up_remote(
    cold: &mut ColdTiers,
    limits: &Limits,
    remote: Option<&str>,
) -> Result<(), SpillError> {
    let wanted = limits.budget.and(remote);
    let records = cold.remote_records();
    match (wanted, cold.remote_url()) {
        (Some(url), Some(current)) if current == url => {
            cold.set_remote_first(limits.remote_first);
            Ok(())
        }
        (Some(url), current) => {
            if let Some(current) = current
                && records > 0
            {
                return Err(SpillError::RemoteTier {
                    url: current.to_string(),
                    reason: format!(
                        "{records} tensors are stored there, so the remote tier cannot move to \
                         {url}; configure it before training or drop those tensors first"
                    ),
                });
            }
            let store = connect_remote(url)?;
            cold.set_remote(Some((url.to_string(), store)), limits.remote_first);
            Ok(())
        }
        (None, Some(_)) if records == 0 => {
            cold.set_remote(None, false);
            Ok(())
        }
        // A store that still holds records stays until they are restored or dropped.
        (None, _) => Ok(()),
    }
}

#[cfg(feature = "remote")]
fn connect_remote(url: &str) -> Result<Box<dyn crate::engine::cold::ColdStore>, SpillError> {
    use crate::engine::remote::{RemoteSetupError, RemoteStore};
    match RemoteStore::connect(url) {
        Ok(store) => Ok(Box::new(store)),
        Err(RemoteSetupError::BadUrl(_)) => Err(SpillError::InvalidValue {
            field: "remote_tier",
            value: url.to_string(),
            accepted: crate::config::REMOTE_ACCEPTED,
        }),
        Err(RemoteSetupError::Unreachable(reason) | RemoteSetupError::Authentication(reason)) => {
            Err(SpillError::RemoteTier {
                url: crate::engine::remote::hide_password(url),
                reason,
            })
        }
    }
}

#[cfg(not(feature = "remote"))]
fn connect_remote(url: &str) -> Result<Box<dyn crate::engine::cold::ColdStore>, SpillError> {
    Err(SpillError::RemoteTier {
        url: url.to_string(),
        reason: "burn-spill was built without its `remote` cargo feature; enable it for a remote \
                 tier"
            .into(),
    })
}
