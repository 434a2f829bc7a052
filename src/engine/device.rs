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

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, RwLock, Weak};
use std::time::Instant;

use super::disk::DiskStore;
use super::index::{Index, Spillable};
use super::ledger::{Direction, Ledger};
use super::slot::{Residency, SlotInfo, TensorId, Tier};
use crate::SpillError;
use crate::stats::SpillStats;
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
    inputs: Vec<TensorId>,
    /// Bytes of the evictable inputs (the others are in the ledger's unevictable count).
    evictable_input_bytes: u64,
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
    estimates: Mutex<HashMap<u64, u64>>,
    warned_ops: Mutex<HashSet<&'static str>>,
    recorder: Recorder,
    /// Whether the current step was opened by `step_begin` and not yet closed.
    in_marked_step: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while one of these is held leaves plain bookkeeping that is still consistent
    // enough to keep going (and the panic itself is what the user sees).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl DeviceEngine {
    /// The counters.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
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
        self.tracking
            .store(limits.budget.is_some(), Ordering::Relaxed);
        *self.limits.write().unwrap_or_else(|e| e.into_inner()) = limits;
        self.ledger.reset_peaks();
        self.settle();
        Ok(())
    }

    /// Stats with the limits filled in.
    pub fn stats(&self) -> SpillStats {
        let limits = self.limits();
        SpillStats {
            device_budget_bytes: limits.budget,
            host_limit_bytes: limits.host_limit,
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
        let tick = self.tick.fetch_add(1, Ordering::Relaxed);
        let mut ids = Vec::with_capacity(inputs.len());
        let (mut input_bytes, mut to_restore, mut largest) = (0u64, 0u64, 0u64);
        let mut evictable_input_bytes = 0u64;
        let mut hasher = DefaultHasher::new();
        name.hash(&mut hasher);
        hint.hash(&mut hasher);
        {
            let mut index = lock(&self.index);
            for input in inputs {
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
        if self.ledger.resident(Tier::Device) > target {
            self.make_room(target);
        }
        Some(OpTicket {
            name,
            budget,
            strict: limits.strict,
            signature,
            inputs: ids,
            evictable_input_bytes,
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

    /// Brings the device under the high watermark (down to the low one) and the host tier under
    /// its limit. Runs after every op while a budget is in force.
    pub fn settle(&self) {
        let limits = self.limits();
        if limits.budget.is_none() {
            return;
        }
        if self.ledger.resident(Tier::Device) > limits.high_water {
            self.make_room(limits.low_water);
        } else {
            self.spill_host_overflow(&limits);
        }
    }

    /// Evicts the coldest unpinned tensors until device bytes are at most `target`. Returns
    /// whether it got there.
    pub fn make_room(&self, target: u64) -> bool {
        let mut tried = HashSet::new();
        let reached = loop {
            let resident = self.ledger.resident(Tier::Device);
            if resident <= target {
                break true;
            }
            let candidates = lock(&self.index).coldest(Tier::Device, resident - target, &tried);
            if candidates.is_empty() {
                break false;
            }
            let mut moved = Vec::new();
            for c in &candidates {
                tried.insert(c.id);
                if self.ledger.resident(Tier::Device) <= target {
                    break;
                }
                if c.victim.evict_to_host(self) {
                    moved.push(c.id);
                }
            }
            let mut index = lock(&self.index);
            for id in moved {
                index.set_tier(id, Tier::Host);
            }
            drop(index);
            // Dropping the upgraded handles may run a handle's drop, which takes the index lock.
            drop(candidates);
        };
        self.spill_host_overflow(&self.limits());
        reached
    }

    fn spill_host_overflow(&self, limits: &Limits) {
        let Some(limit) = limits.host_limit else {
            return;
        };
        let mut tried = HashSet::new();
        loop {
            let resident = self.ledger.resident(Tier::Host);
            if resident <= limit {
                return;
            }
            let candidates = lock(&self.index).coldest(Tier::Host, resident - limit, &tried);
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

    /// Device to host: `read` turns the device payload into a host buffer, or gives it back
    /// with the reason it could not.
    pub fn evict_slot<D, H>(
        &self,
        slot: &mut Residency<D, H>,
        info: SlotInfo<'_>,
        read: impl FnOnce(&D) -> Result<H, String>,
    ) -> bool {
        let Residency::Device(payload) = &*slot else {
            return false;
        };
        let start = Instant::now();
        match read(payload) {
            Ok(host) => {
                let device = std::mem::replace(slot, Residency::Host(host));
                self.moved(Direction::DeviceToHost, info, start);
                // Freeing the device tensor is not part of the move's time either.
                drop(device);
                true
            }
            Err(why) => {
                tracing::warn!(target: "burn_spill::engine", id = info.id, error = %why,
                    "could not read tensor off the device; it stays there");
                false
            }
        }
    }

    /// Host to disk. A write error leaves the tensor on the host (over the host limit).
    pub fn demote_slot<D, H: AsRef<[u8]>>(
        &self,
        slot: &mut Residency<D, H>,
        info: SlotInfo<'_>,
    ) -> bool {
        let Residency::Host(host) = &*slot else {
            return false;
        };
        let start = Instant::now();
        let mut disk = lock(&self.disk);
        let Some((_, store)) = disk.as_mut() else {
            return false;
        };
        match store.write(info.id, info.meta, host.as_ref()) {
            Ok(record) => {
                drop(disk);
                let host = std::mem::replace(slot, Residency::Disk(record));
                self.moved(Direction::HostToDisk, info, start);
                // Freeing the host buffer is memory management, not the move: keep it out of
                // the move's time.
                drop(host);
                true
            }
            Err(error) => {
                let file = store.file_path().display().to_string();
                drop(disk);
                self.ledger.on_disk_write_error();
                tracing::warn!(target: "burn_spill::engine", id = info.id, file, %error,
                    "spill-file write failed; the tensor stays on the host, over the host limit");
                false
            }
        }
    }

    /// Host or disk to device. `upload` makes the device payload from a host buffer and `alloc`
    /// an empty host buffer of a given length for a record to be read into. Returns whether
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
        match std::mem::replace(slot, Residency::Taken) {
            Residency::Host(host) => {
                *slot = Residency::Device(upload(host));
                self.moved(Direction::HostToDevice, info, start);
                true
            }
            Residency::Disk(record) => {
                let mut host = alloc(record.payload_len as usize);
                {
                    let disk = lock(&self.disk);
                    let (_, store) = disk.as_ref().unwrap_or_else(|| {
                        panic!("burn-spill: tensor {} is on disk but the device has no spill file; this is a bug", info.id)
                    });
                    if let Err(error) = store.read_into(&record, info.id, info.meta, host.as_mut())
                    {
                        let file = store.file_path().display().to_string();
                        let offset = record.offset;
                        drop(disk);
                        *slot = Residency::Disk(record);
                        panic!(
                            "burn-spill: tensor {} cannot be restored from spill file {file} at offset {offset}: {error}",
                            info.id
                        );
                    }
                }
                *slot = Residency::Device(upload(host));
                self.moved(Direction::DiskToDevice, info, start);
                // Freeing the extent (which may shrink the file) is not part of the move's time.
                if let Some((_, store)) = lock(&self.disk).as_mut() {
                    store.free(&record);
                }
                true
            }
            other => {
                *slot = other;
                false
            }
        }
    }

    /// Marks a restored tensor as on the device and used now.
    pub fn restored(&self, id: TensorId) {
        let tick = self.tick.fetch_add(1, Ordering::Relaxed);
        let mut index = lock(&self.index);
        index.set_tier(id, Tier::Device);
        index.touch(id, tick);
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
            Residency::Disk(record) => {
                if let Some((_, store)) = lock(&self.disk).as_mut() {
                    store.free(&record);
                }
                Tier::Disk
            }
        };
        self.ledger.on_drop(bytes, role, Some(tier));
    }

    fn moved(&self, direction: Direction, info: SlotInfo<'_>, start: Instant) {
        let took = start.elapsed();
        self.ledger.on_move(direction, info.bytes, info.role, took);
        tracing::debug!(target: "burn_spill::engine", id = info.id, bytes = info.bytes,
            ?direction, micros = took.as_micros() as u64, "moved");
    }
}
