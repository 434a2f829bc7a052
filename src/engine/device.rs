//! `DeviceEngine`: the budget, the tiers and the moves of one device.
//!
//! An op tells the engine what it is about to read ([`DeviceEngine::begin_op`]); the engine pins
//! those inputs and evicts the coldest other tensors until the inputs that must come back plus
//! the op's estimated output fit the budget. After the op ([`DeviceEngine::end_op`]) the outputs
//! join the index, the estimate learns the real output size, and ([`DeviceEngine::settle`]) the
//! device is brought back under the high watermark.
//!
//! Lock order: a tensor's own lock may be held while taking the disk lock, never the reverse;
//! the index lock is only taken while holding neither (victims are upgraded under the index lock
//! and moved after it is released), so a handle may drop on any thread at any time.

use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant};

use super::disk::{DiskRecord, DiskStore};
use super::index::{Candidate, Index, Spillable};
use super::ledger::{Direction, Ledger};
use super::pool::PoolWatch;
use super::queues::{DeviceQueues, SingleQueue};
use super::slot::{Residency, Slot, SlotInfo, TensorId, Tier};
use super::transfer::{Job, Lane, Transfers, on_worker};
use crate::SpillError;
use crate::fast_hash::{FastHasher, FastMap, FastSet};
use crate::policy::PolicyKind;
use crate::policy::plan::{KeyAt, NextUse, PlanKey, UsePlan};
use crate::policy::victim::{self, Bandwidth};
use crate::stats::{SpillStats, StepStats};
use crate::tape::Recorder;

/// The resolved limits of one device, in bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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
}

impl Limits {
    /// Whether the engine keys tensors for the use plan (a tape-driven policy or prefetch).
    pub fn planning(&self) -> bool {
        self.policy != PolicyKind::Lru || self.prefetch_window > 0
    }
}

/// One tensor an op reads.
pub struct OpInput {
    /// Its id.
    pub id: TensorId,
    /// Its bytes.
    pub bytes: u64,
    /// The tier holding it now.
    pub tier: Tier,
    /// Whether it may be moved off the device (strided views may not).
    pub evictable: bool,
    /// The handle, for the index.
    pub victim: Weak<dyn Spillable>,
}

/// One tensor an op produced.
pub struct OpOutput {
    /// Its id.
    pub id: TensorId,
    /// Its bytes.
    pub bytes: u64,
    /// Whether it may be moved off the device.
    pub evictable: bool,
    /// The handle, for the index.
    pub victim: Weak<dyn Spillable>,
}

/// What `begin_op` learned, handed back to `end_op`.
#[derive(Debug)]
pub struct OpTicket {
    name: &'static str,
    budget: u64,
    strict: bool,
    signature: u64,
    inputs: smallvec::SmallVec<[TensorId; 4]>,
    /// Bytes of the evictable inputs (the others are in the ledger's unevictable count).
    evictable_input_bytes: u64,
    /// The step and the op's position in it, for the outputs' plan keys.
    step: u64,
    position: u32,
    planning: bool,
}

/// Estimates are keyed by op and input sizes; a step's worth of distinct keys is a few
/// thousand, so this bound only guards against unbounded shape churn.
const MAX_ESTIMATES: usize = 1 << 16;

/// The engine of one device.
#[derive(Default)]
pub struct DeviceEngine {
    ledger: Ledger,
    limits: RwLock<Limits>,
    tracking: AtomicBool,
    tick: AtomicU64,
    index: Mutex<Index>,
    disk: Mutex<Option<(PathBuf, DiskStore)>>,
    estimates: Mutex<FastMap<u64, u64>>,
    warned_ops: Mutex<HashSet<&'static str>>,
    recorder: Recorder,
    /// Whether the current step was opened by `step_begin` and not yet closed.
    in_marked_step: AtomicBool,
    /// The use plan learned from the last recorded step, and the recorder's plan epoch it was
    /// built at.
    plan: RwLock<Option<Arc<UsePlan>>>,
    plan_epoch: Mutex<Option<(u64, u64)>>,
    /// Extra ops of lead per plan key, grown each time that tensor arrived late.
    leads: Mutex<FastMap<PlanKey, u32>>,
    /// Plan keys whose prefetch was wasted: the step until which they are not prefetched, and
    /// how many times it was wasted.
    benched: Mutex<FastMap<PlanKey, Bench>>,
    transfers: Transfers,
    /// Bytes on their way to the device (counted there by budget decisions).
    inflight_in: AtomicU64,
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
    /// The inner backend's device queues, installed by the adapter on first use.
    queues: OnceLock<Arc<dyn DeviceQueues>>,
    /// The inner allocator's figures and cleanups.
    pool: PoolWatch,
}

/// Counters at the start of the current step, to report the step's own numbers.
#[derive(Default)]
struct StepCounters {
    step: Option<u64>,
    start: SpillStats,
    last: Option<StepStats>,
}

/// The largest lead a late tensor's prefetch trigger moves to, in ops beyond the window.
const MAX_LEAD: u32 = 64;

/// A plan and a position in a step: turns next uses into absolute positions.
struct Placement {
    plan: Arc<UsePlan>,
    step: u64,
    now: u32,
}

impl Placement {
    /// The absolute position `d` ops from now (a distance past the end of the step lands in
    /// the next one, whose positions restart at 0).
    fn absolute(&self, d: u32) -> u64 {
        let left = self.plan.len().saturating_sub(self.now);
        if d < left || left == 0 {
            super::index::absolute(self.step, self.now.saturating_add(d))
        } else {
            super::index::absolute(self.step + 1, d - left)
        }
    }

    fn due_of(&self, next: NextUse) -> Option<u64> {
        match next {
            NextUse::In(d) => Some(self.absolute(d)),
            NextUse::Never | NextUse::Unknown => None,
        }
    }

    /// When the tensor keyed `key` is next used, absolutely.
    fn due(&self, key: Option<KeyAt>) -> Option<u64> {
        self.due_of(self.plan.next_use(key?, self.step, self.now))
    }
}

/// What the eviction job on the transfer worker works toward: the latest op's wish.
#[derive(Debug, Clone, Copy, Default)]
struct SettleGoal {
    target: u64,
    room: Option<Room>,
    /// Bumped at every change, so that a goal set while the job finished is not lost.
    generation: u64,
}

/// Above `trigger` device bytes, eviction after an op brings the device down to `target`.
#[derive(Debug, Clone, Copy)]
struct SettlePoint {
    trigger: u64,
    target: u64,
}

/// Room a prefetch waits for: the device level at which it fits, to be reached by evicting
/// only tensors next used after `beyond` (an absolute position; see [`super::index::absolute`]).
/// Evicting a tensor needed before the prefetched one would only trade one move for another
/// (Belady's rule: the furthest next use leaves first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Room {
    level: u64,
    beyond: u64,
}

/// How an eviction pass ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Eviction {
    /// The device is at or under the target.
    Reached,
    /// It moved its share of bytes and stopped short.
    Sliced,
    /// Nothing more could be evicted.
    Stuck,
}

/// Tensors up to this size are evicted in batches (one read, one host buffer): their
/// per-transfer cost is more than their bytes'.
const BATCH_TENSOR_MAX: u64 = 256 << 10;

/// The most bytes one batch carries.
const BATCH_BYTES: u64 = 4 << 20;

/// Steps a tensor whose prefetch was wasted (evicted again before its use) is not prefetched;
/// each further waste doubles it, up to 64 times as long.
const BENCHED_STEPS: u64 = 4;
const MAX_BENCH_DOUBLINGS: u32 = 6;

/// A tensor kept from prefetch after wasted ones.
#[derive(Debug, Clone, Copy, Default)]
struct Bench {
    until: u64,
    strikes: u32,
}

/// What handing a move to a worker costs at least (a wake-up and two context switches): moves
/// measured to take less (or less than the measured wait for a worker, when that is longer) run
/// on the op's thread, between ops.
const HANDOFF_COST: Duration = Duration::from_micros(20);

/// Moves of a direction measured before their mean time is trusted.
const MEASURED_MOVES: u64 = 16;

/// Bytes one background eviction job moves before it lets queued prefetches run.
const SETTLE_SLICE_BYTES: u64 = 4 << 20;

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

    /// Closes the current step and opens a marked one; recording starts if it was off.
    pub fn step_begin(&self) {
        if !self.recorder.is_enabled() {
            self.recorder.set_enabled(true);
        }
        self.recorder.boundary(true);
        self.in_marked_step.store(true, Ordering::Relaxed);
        self.step_closed();
    }

    /// Closes the step's counters and refreshes the plan at a marked boundary, rather than at
    /// the next op, so that `stats().last_step` is up to date at once.
    fn step_closed(&self) {
        if self.limits().planning() {
            self.step_changed(self.recorder.position().0);
        }
        self.check_pool();
    }

    /// Closes the current marked step. Without a matching `step_begin` it only warns: the tape
    /// is left as it is.
    pub fn step_end(&self) {
        if !self.in_marked_step.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                target: "burn_spill::tape",
                "step_end without step_begin; ignored (the tape is unchanged)"
            );
            return;
        }
        self.recorder.boundary(false);
        self.step_closed();
    }

    /// Whether a budget is in force (otherwise ops skip the engine entirely).
    pub fn is_tracking(&self) -> bool {
        self.tracking.load(Ordering::Relaxed)
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.limits
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Installs new limits. The disk store is created when the host tier is capped or a spill
    /// directory was given (so a bad directory is reported now, not mid-training); `spill_base`
    /// `None` means the system temp dir.
    pub fn apply(&self, limits: Limits, spill_base: Option<&Path>) -> Result<(), SpillError> {
        self.quiesce();
        let wants_disk =
            limits.budget.is_some() && (limits.host_limit.is_some() || spill_base.is_some());
        {
            let mut disk = lock(&self.disk);
            let base = spill_base.map_or_else(std::env::temp_dir, Path::to_path_buf);
            let records = disk.as_ref().map_or(0, |(_, store)| store.records());
            let same_base = matches!(&*disk, Some((current, _)) if *current == base);
            if wants_disk && !same_base {
                if let Some((_, store)) = disk.as_ref()
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
                *disk = Some((base, store));
            } else if !wants_disk && records == 0 {
                // No disk tier any more: remove the old directory now. One that still holds
                // records stays until they are restored or dropped.
                *disk = None;
            }
        }
        if limits.budget.is_some() && limits.planning() && !self.recorder.is_enabled() {
            // The plan is learned from the tape.
            self.recorder.set_enabled(true);
        }
        self.tracking
            .store(limits.budget.is_some(), Ordering::Relaxed);
        *self.limits.write().unwrap_or_else(|e| e.into_inner()) = limits;
        self.reset_peaks();
        self.settle();
        Ok(())
    }

    /// Stats with the limits filled in, once the transfer workers are idle.
    pub fn stats(&self) -> SpillStats {
        self.quiesce();
        let limits = self.limits();
        SpillStats {
            device_budget_bytes: limits.budget,
            host_limit_bytes: limits.host_limit,
            last_step: self.last_step_stats(),
            pool: self.pool.stats(self.queues()),
            ..self.ledger.stats()
        }
    }

    /// The spill file, once one exists.
    pub fn spill_file(&self) -> Option<PathBuf> {
        lock(&self.disk)
            .as_ref()
            .map(|(_, s)| s.file_path().to_path_buf())
    }

    /// Test hook: the next `n` spill-file writes fail as if the disk were full.
    pub fn fail_next_disk_writes(&self, n: u32) {
        if let Some((_, store)) = lock(&self.disk).as_mut() {
            store.fail_next_writes(n);
        }
    }

    /// Adds a newly created tensor to the index (only while tracking).
    pub fn register(&self, id: TensorId, bytes: u64, victim: Weak<dyn Spillable>) {
        let tick = self.tick.fetch_add(1, Ordering::Relaxed);
        lock(&self.index).insert_or_touch(id, bytes, Tier::Device, tick, || victim);
    }

    /// Forgets a dropped tensor.
    pub fn unregister(&self, id: TensorId) {
        lock(&self.index).remove(id);
    }

    /// Pins `inputs` and evicts other tensors until the inputs that must be restored plus the
    /// estimated output fit the budget. `hint` folds in the non-tensor arguments that decide
    /// the output size. Returns `None` when no budget is in force.
    pub fn begin_op(&self, name: &'static str, inputs: &[OpInput], hint: u64) -> Option<OpTicket> {
        let limits = self.limits();
        let budget = limits.budget?;
        let planning = limits.planning();
        let (step, position) = self.recorder.position();
        if planning {
            self.step_changed(step);
        }
        let has_plan = planning && self.plan().is_some();
        let (mut hits, mut misses) = (0u64, 0u64);
        let mut late = Vec::new();
        let tick = self.tick.fetch_add(1, Ordering::Relaxed);
        let mut ids = smallvec::SmallVec::<[TensorId; 4]>::new();
        let (mut input_bytes, mut to_restore, mut largest) = (0u64, 0u64, 0u64);
        let mut evictable_input_bytes = 0u64;
        let mut hasher = FastHasher::default();
        name.hash(&mut hasher);
        hint.hash(&mut hasher);
        {
            let mut index = lock(&self.index);
            for (slot, input) in inputs.iter().enumerate() {
                input.bytes.hash(&mut hasher);
                if input.evictable {
                    index.insert_or_touch(input.id, input.bytes, input.tier, tick, || {
                        input.victim.clone()
                    });
                    index.pin(input.id);
                }
                if ids.contains(&input.id) {
                    ids.push(input.id);
                    continue;
                }
                if input.evictable && planning {
                    let note = index.note_input(input.id, step, position, slot as u16);
                    if input.tier != Tier::Device {
                        misses += 1;
                        if let Some(key) = note.key_before.filter(|_| has_plan) {
                            late.push(key.key);
                        }
                    } else if note.prefetched {
                        hits += 1;
                    }
                } else if input.evictable && input.tier != Tier::Device {
                    misses += 1;
                }
                ids.push(input.id);
                input_bytes += input.bytes;
                if input.evictable {
                    evictable_input_bytes += input.bytes;
                }
                largest = largest.max(input.bytes);
                if input.tier != Tier::Device {
                    to_restore += input.bytes;
                }
            }
        }
        self.ledger.on_prefetch_outcome(hits, misses);
        if !late.is_empty() && limits.prefetch_window > 0 {
            // Capuchin's rule: a tensor that came late is asked for earlier next step.
            let mut leads = lock(&self.leads);
            for key in late {
                let lead = leads.entry(key).or_default();
                *lead = (*lead * 2).clamp(1, MAX_LEAD);
            }
        }
        let signature = hasher.finish();
        let estimate = lock(&self.estimates)
            .get(&signature)
            .copied()
            .unwrap_or(largest);
        if input_bytes > budget && limits.strict {
            self.finish_pins(&ids);
            panic!(
                "burn-spill (strict): op `{name}` needs {input_bytes} bytes of inputs on the device, \
                 more than the device budget of {budget} bytes; raise the budget or turn strict mode off"
            );
        }
        let target = budget.saturating_sub(to_restore.saturating_add(estimate));
        if self.device_committed() > target {
            self.make_room(target);
        }
        Some(OpTicket {
            name,
            budget,
            strict: limits.strict,
            signature,
            inputs: ids,
            evictable_input_bytes,
            step,
            position,
            planning,
        })
    }

    /// Unpins the inputs, indexes the outputs, learns the output size and counts an op that ran
    /// over the budget. Call it while the consumed inputs are still counted (before they drop),
    /// so that the device bytes seen here are the op's real peak.
    pub fn end_op(&self, ticket: OpTicket, outputs: &[OpOutput]) {
        let tick = self.tick.fetch_add(1, Ordering::Relaxed);
        let (mut output_bytes, mut evictable_output_bytes) = (0u64, 0u64);
        {
            let mut index = lock(&self.index);
            for id in &ticket.inputs {
                index.unpin(*id);
            }
            for (i, out) in outputs.iter().enumerate() {
                if out.evictable {
                    index.insert_or_touch(out.id, out.bytes, Tier::Device, tick, || {
                        out.victim.clone()
                    });
                    if ticket.planning {
                        index.set_key(
                            out.id,
                            KeyAt {
                                step: ticket.step,
                                key: PlanKey::Produced {
                                    op: ticket.position,
                                    slot: i as u16,
                                },
                            },
                        );
                    }
                }
                if !outputs[..i].iter().any(|o| o.id == out.id) {
                    output_bytes += out.bytes;
                    if out.evictable {
                        evictable_output_bytes += out.bytes;
                    }
                }
            }
        }
        {
            let mut estimates = lock(&self.estimates);
            if estimates.len() >= MAX_ESTIMATES {
                estimates.clear();
            }
            estimates.insert(ticket.signature, output_bytes);
        }
        let resident = self.ledger.resident(Tier::Device);
        if resident > ticket.budget {
            // What no eviction could have freed: this op's own tensors and the unevictable ones.
            let unavoidable =
                ticket.evictable_input_bytes + evictable_output_bytes + self.ledger.unevictable();
            if unavoidable > ticket.budget {
                self.over_budget(&ticket, resident);
            } else {
                self.ledger.on_estimate_miss();
            }
        }
    }

    /// Ends an op that produced no tensor (a read, a metadata query).
    pub fn end_op_without_outputs(&self, ticket: OpTicket) {
        self.finish_pins(&ticket.inputs);
    }

    fn finish_pins(&self, ids: &[TensorId]) {
        let mut index = lock(&self.index);
        for id in ids {
            index.unpin(*id);
        }
    }

    fn over_budget(&self, ticket: &OpTicket, held: u64) {
        self.ledger.on_over_budget(held);
        if ticket.strict {
            panic!(
                "burn-spill (strict): op `{}` needed {held} bytes on the device (its inputs and outputs \
                 plus {} bytes that may not be evicted), more than the device budget of {} bytes; \
                 raise the budget or turn strict mode off",
                ticket.name,
                self.ledger.unevictable(),
                ticket.budget
            );
        }
        if lock(&self.warned_ops).insert(ticket.name) {
            tracing::warn!(
                target: "burn_spill::budget",
                op = ticket.name,
                held_bytes = held,
                budget_bytes = ticket.budget,
                "op needs more device memory than the budget and runs over it (logged once per op kind)"
            );
        }
    }

    /// Device bytes that count against the budget: resident plus on their way in.
    fn device_committed(&self) -> u64 {
        self.ledger.resident(Tier::Device) + self.inflight_in.load(Ordering::Relaxed)
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

    /// The use plan in force, if the tape has recorded a step.
    pub fn plan(&self) -> Option<Arc<UsePlan>> {
        self.plan.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// On a new step: closes the previous step's counters, and rebuilds the plan when the tape
    /// recorded a step or diverged since it was built.
    fn step_changed(&self, step: u64) {
        {
            let mut steps = lock(&self.steps);
            if steps.step == Some(step) {
                return;
            }
            let now = self.ledger.stats();
            let peak = self.ledger.take_step_peak();
            if let Some(previous) = steps.step {
                let planned = self.plan().map_or(0, |p| p.recorded_peak());
                let mut stats = step_stats(previous, &steps.start, &now, planned, peak);
                (stats.windows, stats.saturated_windows) = *lock(&self.windows);
                steps.last = Some(stats);
            }
            steps.step = Some(step);
            steps.start = now;
        }
        let epoch = self.recorder.plan_epoch();
        let mut built = lock(&self.plan_epoch);
        if *built == Some(epoch) {
            return;
        }
        // A divergence found while verifying leaves only the old recording; one found by
        // comparing two recordings comes with a fresh tape, which is the truth now.
        let diverged =
            built.is_some_and(|(tapes, divergences)| divergences != epoch.1 && tapes == epoch.0);
        *built = Some(epoch);
        drop(built);
        let (previous, last) = self.recorder.last_two();
        let plan = match last {
            // A divergence makes the recorded step stale until the next one is recorded.
            Some(_) if diverged => None,
            Some(tape) => {
                self.check_windows(&tape);
                let mut plan = UsePlan::from_tape(&tape, previous.as_deref());
                if let Some(old) = self.plan() {
                    plan.inherit_carried(&old);
                }
                Some(Arc::new(plan))
            }
            None => None,
        };
        if plan.is_none() {
            lock(&self.leads).clear();
            lock(&self.benched).clear();
        }
        *self.plan.write().unwrap_or_else(|e| e.into_inner()) = plan;
        // Spilled tensors are placed by the plan in force.
        let placement = self.placement();
        let mut index = lock(&self.index);
        for (id, key) in index.spilled_keys() {
            let due = placement.as_ref().and_then(|p| p.due(Some(key)));
            index.set_due(id, due);
        }
    }

    /// The plan and where the step stands, to place spilled tensors by their next use.
    fn placement(&self) -> Option<Placement> {
        let limits = self.limits();
        if !limits.planning() || limits.prefetch_window == 0 {
            return None;
        }
        let (step, now) = self.recorder.position();
        Some(Placement {
            plan: self.plan()?,
            step,
            now,
        })
    }

    /// Replays the recorded step with the policy in force under the budget (with a plan the
    /// engine keeps only the headroom the next ops need), and checks each window of
    /// `prefetch_window` ops against the measured host link: a window whose planned moves exceed
    /// bandwidth x compute time is saturated (logged, and counted in the step stats).
    fn check_windows(&self, tape: &crate::tape::StepTape) {
        let limits = self.limits();
        let capacity = limits.budget.unwrap_or(limits.high_water);
        let (replay, moved) = crate::policy::simulate::replay_per_op(tape, capacity, limits.policy);
        let windows = crate::policy::windows::cut(
            tape,
            &moved,
            limits.prefetch_window.max(1),
            self.restore_bandwidth(Tier::Device),
        );
        let saturated = windows.iter().filter(|w| w.saturated()).count() as u32;
        if saturated > 0 {
            tracing::info!(target: "burn_spill::plan", saturated, windows = windows.len(),
                planned_bytes = replay.bytes_moved(),
                "the planned moves exceed the measured bandwidth in some windows; expect stalls");
        }
        *lock(&self.windows) = (windows.len() as u32, saturated);
    }

    /// What the last finished step did (needs a tape-driven policy or prefetch, which track
    /// steps).
    pub fn last_step_stats(&self) -> Option<StepStats> {
        lock(&self.steps).last
    }

    /// Runs after every op while a budget is in force: prefetches what the plan says is needed
    /// soon and brings the device under the high watermark (down to the low one) and the host
    /// tier under its limit, on the workers when the engine is asynchronous (and between ops on
    /// the calling thread otherwise).
    pub fn after_op(self: &Arc<Self>) {
        let limits = self.limits();
        if limits.budget.is_none() {
            return;
        }
        self.pool.after_op(
            self.ledger.resident(Tier::Device),
            self.ledger.device_arrivals(),
            limits.pool_margin,
            self.queues(),
        );
        let point = self.settle_point(&limits);
        let room = if limits.planning() && limits.prefetch_window > 0 {
            self.prefetch_ahead(&limits)
        } else {
            None
        };
        if !limits.asynchronous {
            self.settle_at(&limits, point);
            if let Some(room) = room {
                self.make_room_for(room);
            }
            return;
        }
        let committed = self.device_committed();
        if committed > point.trigger || room.is_some() {
            let lowest = room.map_or(point.target, |r| r.level.min(point.target));
            if self.cheaper_here(Direction::DeviceToHost, committed.saturating_sub(lowest)) {
                if committed > point.trigger {
                    self.make_room(point.target);
                }
                if let Some(room) = room {
                    self.make_room_for(room);
                }
            } else {
                let target = if committed > point.trigger {
                    point.target
                } else {
                    u64::MAX
                };
                {
                    // A job already queued takes the new goal when it runs.
                    let mut goal = lock(&self.settle_goal);
                    goal.target = target;
                    goal.room = room;
                    goal.generation += 1;
                }
                if !self.settle_queued.swap(true, Ordering::AcqRel) {
                    self.transfers.submit(self, Lane::Transfer, Job::Settle);
                }
            }
        }
        self.queue_overflow(&limits);
    }

    /// Whether moving `bytes` in `direction` is likely cheaper than handing the move to a
    /// worker: waking a sleeping thread and switching to it costs a few microseconds on each
    /// side (more on a busy machine, where the worker is scheduled late: the wait is measured),
    /// more than a small copy on a CPU backend (where a restore is a buffer handover). The
    /// estimate is the measured mean time of such a move, scaled up for larger ones; until
    /// enough moves were measured the worker takes them.
    fn cheaper_here(&self, direction: Direction, bytes: u64) -> bool {
        let moves = self.ledger.moves(direction);
        if moves.count < MEASURED_MOVES {
            return false;
        }
        let mean_bytes = (moves.bytes / moves.count).max(1);
        let scale = (bytes as f64 / mean_bytes as f64).max(1.0);
        let estimate = (moves.time / moves.count as u32).mul_f64(scale);
        estimate < HANDOFF_COST.max(self.transfers.handoff_latency())
    }

    /// Has the I/O worker move the host tier's overflow to disk, unless it is queued already.
    fn queue_overflow(self: &Arc<Self>, limits: &Limits) {
        if let Some(limit) = limits.host_limit
            && self.ledger.resident(Tier::Host) > limit
            && !self.overflow_queued.swap(true, Ordering::AcqRel)
        {
            self.transfers.submit(self, Lane::Io, Job::Overflow);
        }
    }

    /// Queues prefetches for spilled tensors whose next use falls within the window (plus the
    /// lead each has earned by arriving late), soonest first, while they fit: a tensor fits
    /// when the room the ops up to its use will need is left free beside it (so that it is not
    /// evicted again before its use). Returns the room to make for the first one left out.
    fn prefetch_ahead(self: &Arc<Self>, limits: &Limits) -> Option<Room> {
        let plan = self.plan()?;
        let (step, now) = self.recorder.position();
        let window = limits.prefetch_window.min(plan.len());
        let reach = window + self.transfer_ops.load(Ordering::Relaxed);
        let placement = Placement {
            plan: plan.clone(),
            step,
            now,
        };
        let mut due: Vec<(u32, super::index::Spilled)> = {
            let mut index = lock(&self.index);
            let soon = index.due_until(placement.absolute(reach + MAX_LEAD));
            if soon.is_empty() {
                return None;
            }
            let leads = lock(&self.leads);
            let benched = lock(&self.benched);
            let mut due = Vec::new();
            for s in soon {
                if benched.get(&s.key.key).is_some_and(|b| b.until > step) {
                    continue;
                }
                let lead = leads.get(&s.key.key).copied().unwrap_or(0);
                match plan.next_use(s.key, step, now) {
                    NextUse::In(d) if d <= reach.saturating_add(lead) => {
                        due.push((d, s));
                    }
                    // Placed under an older position or plan: place it again.
                    other => index.set_due(s.id, placement.due_of(other)),
                }
            }
            due
        };
        due.sort_by_key(|(d, s)| (*d, s.id));
        let headroom = match due.last() {
            Some((furthest, _)) => plan.headroom_curve(now, furthest + 1),
            None => return None,
        };
        let budget = limits.budget.unwrap_or(u64::MAX);
        let mut used = self.device_committed();
        for (d, spilled) in due {
            let ahead = headroom.get(d as usize).or(headroom.last()).copied();
            let ceiling = budget.saturating_sub(ahead.unwrap_or(0));
            if used + spilled.bytes > ceiling {
                // Room for the soonest one left out is made by evicting tensors used after it;
                // the later ones wait for their turn.
                return Some(Room {
                    level: ceiling.saturating_sub(spilled.bytes),
                    beyond: placement.absolute(d),
                });
            }
            let Some(victim) = lock(&self.index).start_flight(spilled.id) else {
                continue;
            };
            used += spilled.bytes;
            self.inflight_in.fetch_add(spilled.bytes, Ordering::Relaxed);
            self.ledger.on_prefetch_issued();
            let lane = match spilled.tier {
                Tier::Disk => Lane::Io,
                _ => Lane::Transfer,
            };
            let job = Job::Prefetch {
                victim,
                id: spilled.id,
                bytes: spilled.bytes,
                queued_at: (step, now),
            };
            let direction = match spilled.tier {
                Tier::Disk => Direction::DiskToDevice,
                _ => Direction::HostToDevice,
            };
            if limits.asynchronous && !self.cheaper_here(direction, spilled.bytes) {
                self.transfers.submit(self, lane, job);
            } else {
                // Synchronous engine, or a move cheaper than a hand-off: it runs here, between
                // ops.
                self.run_job(job);
            }
        }
        None
    }

    /// Runs one worker job.
    pub(crate) fn run_job(self: &Arc<Self>, job: Job) {
        match job {
            Job::Prefetch {
                victim,
                id,
                bytes,
                queued_at,
            } => {
                let arrived = victim.prefetch(self);
                self.learn_transfer_ops(queued_at);
                let tick = self.tick.fetch_add(1, Ordering::Relaxed);
                lock(&self.index).end_flight(id, arrived, tick);
                self.inflight_in.fetch_sub(bytes, Ordering::Relaxed);
            }
            Job::Settle => {
                let goal = *lock(&self.settle_goal);
                // A slice at a time, so that prefetches queued meanwhile go first.
                let mut outcome = self.evict_until_within(goal.target, SETTLE_SLICE_BYTES, None);
                if let (Eviction::Reached, Some(room)) = (outcome, goal.room) {
                    outcome =
                        self.evict_until_within(room.level, SETTLE_SLICE_BYTES, Some(room.beyond));
                }
                if outcome == Eviction::Sliced {
                    // Still marked queued: the rest goes behind whatever came meanwhile.
                    self.transfers.submit(self, Lane::Transfer, Job::Settle);
                } else {
                    self.settle_queued.store(false, Ordering::Release);
                    // A goal set while this ran, which found the job queued, is not lost.
                    if lock(&self.settle_goal).generation != goal.generation
                        && !self.settle_queued.swap(true, Ordering::AcqRel)
                    {
                        self.transfers.submit(self, Lane::Transfer, Job::Settle);
                    }
                }
                self.queue_overflow(&self.limits());
            }
            Job::Overflow => {
                self.overflow_queued.store(false, Ordering::Release);
                self.spill_host_overflow(&self.limits());
            }
        }
    }

    /// Folds the ops that passed while one prefetch was queued and moved into the running worst
    /// case, which decays by an eighth per sample so that one slow transfer is forgotten.
    fn learn_transfer_ops(&self, (step, at): (u64, u32)) {
        let (now_step, now) = self.recorder.position();
        if now_step != step {
            return;
        }
        let took = now.saturating_sub(at).min(MAX_LEAD);
        let old = self.transfer_ops.load(Ordering::Relaxed);
        let decayed = old - old.div_ceil(8).min(old);
        self.transfer_ops
            .store(took.max(decayed), Ordering::Relaxed);
    }

    /// When eviction after an op starts, and where it brings the device.
    ///
    /// Before a plan exists: above the high watermark (the preset's spill threshold), down to
    /// the low one (its cache ratio), leaving headroom so that the next ops rarely wait for an
    /// eviction. With a plan the tape corrects those guesses (under every policy: the policy
    /// picks the victims, the plan says how much room is needed): the recorded step says how
    /// many bytes the next ops will add (as many ops as a move takes to land), and the device is
    /// kept exactly that far under the budget. Any more headroom would only move bytes the step
    /// still needs (Belady's MIN evicts only when an op needs the room).
    fn settle_point(&self, limits: &Limits) -> SettlePoint {
        let planned = match (limits.budget, self.plan()) {
            (Some(budget), Some(plan)) if limits.planning() => {
                // As far ahead as a move takes to land: an eviction for an op further away
                // can still run after this one, when it is known to be needed.
                let (_, now) = self.recorder.position();
                let lookahead = 1 + self.transfer_ops.load(Ordering::Relaxed);
                let ahead = plan.headroom(now, lookahead);
                Some(budget.saturating_sub(ahead))
            }
            _ => None,
        };
        match planned {
            Some(target) => SettlePoint {
                trigger: target,
                target,
            },
            None => SettlePoint {
                trigger: limits.high_water,
                target: limits.low_water,
            },
        }
    }

    /// Brings the device under the high watermark (down to the low one) and the host tier under
    /// its limit, on the calling thread.
    pub fn settle(&self) {
        let limits = self.limits();
        if limits.budget.is_none() {
            return;
        }
        self.settle_at(&limits, self.settle_point(&limits));
    }

    fn settle_at(&self, limits: &Limits, point: SettlePoint) {
        if self.device_committed() > point.trigger {
            self.make_room(point.target);
        } else {
            self.spill_host_overflow(limits);
        }
    }

    /// Evicts by the policy until device bytes (with those in flight to it) are at most
    /// `target`, then spills host overflow to disk (left to the I/O worker, queued by the next
    /// `after_op`, when the engine is asynchronous). Returns whether it got there. On an op's
    /// thread the time it takes is stall time: the op waits for it.
    pub fn make_room(&self, target: u64) -> bool {
        let start = Instant::now();
        let mut reached = self.evict_until(target);
        let limits = self.limits();
        if !reached && limits.asynchronous && !on_worker() {
            // The tensors left may be busy in a worker's move (an eviction that will free them,
            // a prefetch): let the workers finish, then try again.
            self.quiesce();
            reached = self.evict_until(target);
        }
        if !limits.asynchronous {
            self.spill_host_overflow(&limits);
        }
        if !on_worker() {
            self.ledger.on_stall(start.elapsed());
        }
        reached
    }

    /// Makes `room` for a prefetch on the calling thread, as far as the tensors it may evict
    /// allow (the prefetch waits for another op otherwise).
    fn make_room_for(&self, room: Room) {
        if self.device_committed() <= room.level {
            return;
        }
        let start = Instant::now();
        self.evict_until_within(room.level, u64::MAX, Some(room.beyond));
        if !on_worker() {
            self.ledger.on_stall(start.elapsed());
        }
    }

    fn evict_until(&self, target: u64) -> bool {
        self.evict_until_within(target, u64::MAX, None) == Eviction::Reached
    }

    /// [`evict_until`](Self::evict_until), stopping once `slice` bytes moved, and taking only
    /// tensors next used after absolute position `beyond` when given.
    fn evict_until_within(&self, target: u64, slice: u64, beyond: Option<u64>) -> Eviction {
        let mut tried = FastSet::default();
        let mut evicted = 0u64;
        loop {
            let committed = self.device_committed();
            if committed <= target {
                return Eviction::Reached;
            }
            if evicted >= slice {
                return Eviction::Sliced;
            }
            let candidates = self.victims(Tier::Device, committed - target, &tried, beyond);
            if candidates.is_empty() {
                return Eviction::Stuck;
            }
            let mut moved = Vec::with_capacity(candidates.len());
            let mut batch: Vec<&Candidate> = Vec::with_capacity(candidates.len());
            tried.reserve(candidates.len());
            let mut batch_bytes = 0u64;
            let mut yielded = false;
            for (i, c) in candidates.iter().enumerate() {
                if slice != u64::MAX && self.transfers.urgent_waiting() {
                    // A prefetch came in: an op is about to need it more than this eviction.
                    yielded = true;
                    break;
                }
                tried.insert(c.id);
                if c.bytes <= BATCH_TENSOR_MAX {
                    // Small tensors go together: one read, one host buffer.
                    batch.push(c);
                    batch_bytes += c.bytes;
                    let last = i + 1 == candidates.len();
                    let enough = self.device_committed().saturating_sub(batch_bytes) <= target;
                    if !(last || enough || batch_bytes >= BATCH_BYTES) {
                        continue;
                    }
                    if self.device_committed() <= target {
                        break;
                    }
                    evicted += self.evict_together(&batch, &mut moved);
                    batch.clear();
                    batch_bytes = 0;
                    continue;
                }
                if self.device_committed() <= target {
                    break;
                }
                if c.victim.evict_to_host(self) {
                    moved.push(c.id);
                    evicted += c.bytes;
                }
            }
            if !batch.is_empty() && self.device_committed() > target {
                evicted += self.evict_together(&batch, &mut moved);
            }
            let placement = self.placement();
            let mut index = lock(&self.index);
            let mut wasted = Vec::new();
            for id in moved {
                wasted.extend(index.take_unread_prefetch(id));
                index.set_tier(id, Tier::Host);
                let due = placement.as_ref().and_then(|p| p.due(index.key_of(id)));
                index.set_due(id, due);
            }
            drop(index);
            if !wasted.is_empty() {
                // Brought back and evicted again unread: the device is too full between the
                // prefetch and the use. Those tensors wait for their op for a few steps (a
                // wasted prefetch moves bytes twice for nothing), then are tried again, waiting
                // longer each time it happens again.
                let step = self.recorder.position().0;
                let mut benched = lock(&self.benched);
                for key in wasted {
                    let bench = benched.entry(key).or_default();
                    bench.until = step + (BENCHED_STEPS << bench.strikes.min(MAX_BENCH_DOUBLINGS));
                    bench.strikes += 1;
                }
            }
            // Dropping the upgraded handles may run a handle's drop, which takes the index lock.
            drop(candidates);
            if yielded {
                return Eviction::Sliced;
            }
        }
    }

    /// Evicts `batch` in one transfer (or one by one when it is a single tensor), noting which
    /// moved; returns their bytes.
    fn evict_together(&self, batch: &[&Candidate], moved: &mut Vec<TensorId>) -> u64 {
        let [first, ..] = batch else {
            return 0;
        };
        if batch.len() == 1 {
            if first.victim.evict_to_host(self) {
                moved.push(first.id);
                return first.bytes;
            }
            return 0;
        }
        let victims: Vec<Arc<dyn Spillable>> = batch.iter().map(|c| c.victim.clone()).collect();
        let flags = first.victim.evict_batch(&victims, self);
        let mut bytes = 0;
        for (c, ok) in batch.iter().zip(flags) {
            if ok {
                moved.push(c.id);
                bytes += c.bytes;
            }
        }
        bytes
    }

    /// The next victims of `tier` worth `want` bytes, in the policy's order. Without a plan (or
    /// under LRU) the coldest first. Tensors whose next use is within the prefetch window are
    /// taken only when nothing else is left. With `beyond`, only tensors next used after that
    /// absolute position are taken (those with no known next use count as used last).
    fn victims(
        &self,
        tier: Tier,
        want: u64,
        tried: &FastSet<TensorId>,
        beyond: Option<u64>,
    ) -> Vec<Candidate> {
        let limits = self.limits();
        let plan = match self.plan() {
            Some(plan) if limits.planning() => plan,
            _ => return lock(&self.index).coldest(tier, want, tried),
        };
        let (step, now) = self.recorder.position();
        let placement = Placement {
            plan: plan.clone(),
            step,
            now,
        };
        let bandwidth = self.restore_bandwidth(tier);
        let residents = lock(&self.index).unpinned(tier, tried);
        let window = limits.prefetch_window.min(plan.len());
        let leads = lock(&self.leads);
        // Needed within the window (plus the lead it earned), or brought back for a use that has
        // not come yet: such tensors leave only when nothing else is left.
        let (mut later, mut soon) = (Vec::new(), Vec::new());
        for r in &residents {
            let next_use = r
                .key
                .map_or(NextUse::Unknown, |k| plan.next_use(k, step, now));
            if let (Some(beyond), Some(due)) = (beyond, placement.due_of(next_use))
                && due <= beyond
            {
                continue;
            }
            let lead = r.key.and_then(|k| leads.get(&k.key)).copied().unwrap_or(0);
            let candidate = victim::Candidate {
                id: r.id,
                bytes: r.bytes,
                last_use: r.last_use,
                next_use,
            };
            let needed_soon =
                r.prefetched || matches!(next_use, NextUse::In(d) if d <= window + lead);
            if needed_soon {
                soon.push(candidate);
            } else {
                later.push(candidate);
            }
        }
        let first = |candidates: &[victim::Candidate], want: u64| {
            victim::first_in_order(limits.policy, Some(plan.len()), bandwidth, candidates, want)
        };
        let (mut picked, taken) = first(&later, want);
        if beyond.is_none() && (taken < want || picked.is_empty()) {
            picked.extend(first(&soon, want - taken.min(want)).0);
        }
        drop(leads);
        lock(&self.index).upgrade(picked)
    }

    /// What bringing a tensor back from where a victim of `tier` goes costs, as measured.
    fn restore_bandwidth(&self, tier: Tier) -> Bandwidth {
        let (direction, fallback) = match tier {
            Tier::Device => (Direction::HostToDevice, Bandwidth::HOST_DEFAULT),
            _ => (Direction::DiskToDevice, Bandwidth::DISK_DEFAULT),
        };
        let moves = self.ledger.moves(direction);
        let mut bandwidth = Bandwidth::measured(moves.bytes, moves.time, fallback);
        // The fixed cost of a transfer is at most what the fastest one took (on a CPU backend a
        // restore is a buffer handover, far below a PCIe round trip).
        if moves.count >= MEASURED_MOVES
            && let Some(fastest) = self.ledger.fastest_move(direction)
        {
            bandwidth.latency = bandwidth.latency.min(fastest);
        }
        bandwidth
    }

    fn spill_host_overflow(&self, limits: &Limits) {
        let Some(limit) = limits.host_limit else {
            return;
        };
        let mut tried = FastSet::default();
        loop {
            let resident = self.ledger.resident(Tier::Host);
            if resident <= limit {
                return;
            }
            let candidates = self.victims(Tier::Host, resident - limit, &tried, None);
            if candidates.is_empty() {
                return;
            }
            let mut moved = Vec::new();
            for c in &candidates {
                tried.insert(c.id);
                if self.ledger.resident(Tier::Host) <= limit {
                    break;
                }
                if c.victim.demote_to_disk(self) {
                    moved.push(c.id);
                }
            }
            let mut index = lock(&self.index);
            for id in moved {
                index.set_tier(id, Tier::Disk);
            }
            drop(index);
            drop(candidates);
        }
    }

    /// Device to host. The payload is cloned under the tensor's lock (a reference count on
    /// every backend), read without it, and swapped for the host copy only if the tensor is
    /// still on the device then (an op may have consumed it meanwhile; its bytes never change).
    pub fn evict_slot<D: Clone, H>(
        &self,
        slot: &Slot<D, H>,
        info: SlotInfo<'_>,
        read: impl FnOnce(&D) -> Result<H, String>,
    ) -> bool {
        let payload = {
            let Some(state) = slot.try_lock() else {
                return false;
            };
            let Residency::Device(payload) = &*state else {
                return false;
            };
            payload.clone()
        };
        let start = Instant::now();
        let host = match read(&payload) {
            Ok(host) => host,
            Err(why) => {
                tracing::warn!(target: "burn_spill::engine", id = info.id, error = %why,
                    "could not read tensor off the device; it stays there");
                return false;
            }
        };
        let moved = self.install_evicted(slot, info, host, start.elapsed());
        drop(payload);
        moved
    }

    /// Puts a host copy that took `took` to read in place of the device payload, if the tensor
    /// is still on the device (an op may have consumed it meanwhile; its bytes never change).
    pub fn install_evicted<D, H>(
        &self,
        slot: &Slot<D, H>,
        info: SlotInfo<'_>,
        host: H,
        took: Duration,
    ) -> bool {
        let mut state = slot.lock();
        if !matches!(*state, Residency::Device(_)) {
            return false;
        }
        let device = std::mem::replace(&mut *state, Residency::Host(host));
        // The ledger moves with the state, under its lock, so no other move of this tensor
        // can be counted in between.
        self.moved(Direction::DeviceToHost, info, took);
        drop(state);
        // Freeing the device tensor is not part of the move's time.
        drop(device);
        true
    }

    /// Counts one batched eviction of `tensors` tensors.
    pub fn batched(&self, tensors: u64) {
        self.ledger.on_batch(tensors);
    }

    /// Host to disk. The buffer is taken out (the slot is in flight meanwhile) and written
    /// without the tensor's lock. A write error puts it back on the host (over the host limit).
    pub fn demote_slot<D, H: AsRef<[u8]>>(&self, slot: &Slot<D, H>, info: SlotInfo<'_>) -> bool {
        let host = {
            let Some(mut state) = slot.try_lock() else {
                return false;
            };
            match std::mem::replace(&mut *state, Residency::InFlight { from: Tier::Host }) {
                Residency::Host(host) => host,
                other => {
                    *state = other;
                    return false;
                }
            }
        };
        let start = Instant::now();
        let written = {
            let mut disk = lock(&self.disk);
            match disk.as_mut() {
                None => Err(None),
                Some((_, store)) => store
                    .write(info.id, info.meta, host.as_ref())
                    .map_err(|e| Some((e, store.file_path().display().to_string()))),
            }
        };
        match written {
            Ok(record) => {
                let mut state = slot.lock();
                *state = Residency::Disk(record);
                self.moved(Direction::HostToDisk, info, start.elapsed());
                drop(state);
                slot.notify_arrived();
                // Freeing the host buffer is memory management, not the move.
                drop(host);
                true
            }
            Err(error) => {
                *slot.lock() = Residency::Host(host);
                slot.notify_arrived();
                if let Some((error, file)) = error {
                    self.ledger.on_disk_write_error();
                    tracing::warn!(target: "burn_spill::engine", id = info.id, file, %error,
                        "spill-file write failed; the tensor stays on the host, over the host limit");
                }
                false
            }
        }
    }

    /// Reads a spill record into `into`; the error names the file and offset.
    fn read_record(
        &self,
        record: &DiskRecord,
        info: SlotInfo<'_>,
        into: &mut [u8],
    ) -> Result<(), String> {
        let disk = lock(&self.disk);
        let Some((_, store)) = disk.as_ref() else {
            return Err(format!(
                "tensor {} is on disk but the device has no spill file; this is a bug",
                info.id
            ));
        };
        store
            .read_into(record, info.id, info.meta, into)
            .map_err(|error| {
                format!(
                    "tensor {} cannot be restored from spill file {} at offset {}: {error}",
                    info.id,
                    store.file_path().display(),
                    record.offset
                )
            })
    }

    fn free_record(&self, record: &DiskRecord) {
        if let Some((_, store)) = lock(&self.disk).as_mut() {
            store.free(record);
        }
    }

    /// Host or disk to device, for the op that needs the bytes now (it holds the tensor's lock,
    /// having waited for any transfer in flight). `upload` makes the device payload from a host
    /// buffer and `alloc` an empty host buffer for a record to be read into. Returns whether
    /// anything moved.
    ///
    /// # Panics
    /// When a spill record cannot be read or fails its checksum: the panic names the tensor id,
    /// the file and the offset. The record is kept, so nothing is overwritten.
    pub fn restore_slot<D, H: AsMut<[u8]>>(
        &self,
        slot: &mut Residency<D, H>,
        info: SlotInfo<'_>,
        upload: impl FnOnce(H) -> D,
        alloc: impl FnOnce(usize) -> H,
    ) -> bool {
        let start = Instant::now();
        let moved = match std::mem::replace(slot, Residency::Taken) {
            Residency::Host(host) => {
                *slot = Residency::Device(upload(host));
                self.moved(Direction::HostToDevice, info, start.elapsed());
                true
            }
            Residency::Disk(record) => {
                let mut host = alloc(record.payload_len as usize);
                if let Err(error) = self.read_record(&record, info, host.as_mut()) {
                    *slot = Residency::Disk(record);
                    panic!("burn-spill: {error}");
                }
                *slot = Residency::Device(upload(host));
                self.moved(Direction::DiskToDevice, info, start.elapsed());
                // Freeing the extent (which may shrink the file) is not part of the move's time.
                self.free_record(&record);
                true
            }
            other => {
                *slot = other;
                false
            }
        };
        if moved {
            self.ledger.on_stall(start.elapsed());
        }
        moved
    }

    /// Host or disk to device ahead of need, on a worker: the bytes are taken out (the slot is
    /// in flight, and an op that needs them waits), copied without the tensor's lock, and put
    /// in as a device payload. A record that cannot be read goes back to disk untouched: the op
    /// that needs it then reports the error.
    pub fn prefetch_slot<D, H: AsMut<[u8]>>(
        &self,
        slot: &Slot<D, H>,
        info: SlotInfo<'_>,
        upload: impl FnOnce(H) -> D,
        alloc: impl FnOnce(usize) -> H,
    ) -> bool {
        let taken = {
            let mut state = slot.lock();
            let from = match &*state {
                Residency::Host(_) => Tier::Host,
                Residency::Disk(_) => Tier::Disk,
                _ => return false,
            };
            std::mem::replace(&mut *state, Residency::InFlight { from })
        };
        let start = Instant::now();
        let (host, record) = match taken {
            Residency::Host(host) => (host, None),
            Residency::Disk(record) => {
                let mut host = alloc(record.payload_len as usize);
                if let Err(error) = self.read_record(&record, info, host.as_mut()) {
                    tracing::warn!(target: "burn_spill::transfer", id = info.id, %error,
                        "prefetch could not read a spill record; the op needing it will retry");
                    *slot.lock() = Residency::Disk(record);
                    slot.notify_arrived();
                    return false;
                }
                (host, Some(record))
            }
            _ => unreachable!("matched above"),
        };
        let payload = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| upload(host)));
        let Ok(payload) = payload else {
            // The bytes are gone with the panic; never leave the op waiting forever.
            *slot.lock() = Residency::Taken;
            slot.notify_arrived();
            panic!(
                "burn-spill: uploading tensor {} failed on the transfer worker",
                info.id
            );
        };
        let direction = if record.is_some() {
            Direction::DiskToDevice
        } else {
            Direction::HostToDevice
        };
        let mut state = slot.lock();
        *state = Residency::Device(payload);
        self.moved(direction, info, start.elapsed());
        drop(state);
        slot.notify_arrived();
        if let Some(record) = record {
            self.free_record(&record);
        }
        true
    }

    /// Marks a restored tensor as on the device and used now.
    pub fn restored(&self, id: TensorId) {
        let tick = self.tick.fetch_add(1, Ordering::Relaxed);
        let mut index = lock(&self.index);
        index.arrived(id, tick);
    }

    /// Accounts for a dropped tensor's bytes wherever they were, freeing its spill record.
    pub fn drop_slot<D, H>(
        &self,
        slot: Residency<D, H>,
        bytes: u64,
        role: super::TensorRole,
        evictable: bool,
    ) {
        if !evictable {
            self.ledger.on_unevictable(bytes, false);
        }
        let tier = match slot {
            Residency::Device(_) | Residency::Taken => Tier::Device,
            Residency::Host(_) => Tier::Host,
            Residency::InFlight { from } => from,
            Residency::Disk(record) => {
                self.free_record(&record);
                Tier::Disk
            }
        };
        self.ledger.on_drop(bytes, role, Some(tier));
    }

    /// Counts an op's wait for a transfer in flight.
    pub fn stalled(&self, waited: Duration) {
        if !waited.is_zero() {
            self.ledger.on_stall(waited);
        }
    }

    fn moved(&self, direction: Direction, info: SlotInfo<'_>, took: Duration) {
        self.ledger.on_move(direction, info.bytes, info.role, took);
        tracing::debug!(target: "burn_spill::engine", id = info.id, bytes = info.bytes,
            ?direction, micros = took.as_micros() as u64, "moved");
    }
}

/// The difference of two counter snapshots, as one step's numbers.
fn step_stats(
    step: u64,
    start: &SpillStats,
    end: &SpillStats,
    planned_peak: u64,
    actual_peak: u64,
) -> StepStats {
    let diff = |a: crate::MoveStats, b: crate::MoveStats| crate::MoveStats {
        count: b.count.saturating_sub(a.count),
        bytes: b.bytes.saturating_sub(a.bytes),
        time: b.time.saturating_sub(a.time),
    };
    StepStats {
        step,
        prefetch_hits: end.prefetch_hits.saturating_sub(start.prefetch_hits),
        prefetch_misses: end.prefetch_misses.saturating_sub(start.prefetch_misses),
        stall_time: end.stall_time.saturating_sub(start.stall_time),
        device_to_host: diff(start.device_to_host, end.device_to_host),
        host_to_device: diff(start.host_to_device, end.host_to_device),
        host_to_disk: diff(start.host_to_disk, end.host_to_disk),
        disk_to_device: diff(start.disk_to_device, end.disk_to_device),
        planned_peak_device_bytes: planned_peak,
        actual_peak_device_bytes: actual_peak,
        windows: 0,
        saturated_windows: 0,
    }
}
