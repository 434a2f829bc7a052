//! Moving one tensor's slot between tiers (device, host, disk), with the ledger moved under the
//! slot's lock, and accounting for a dropped one wherever it was.

use std::time::{Duration, Instant};

use crate::engine::cold::ColdRecord;
use crate::engine::cold_tiers::ColdWriteError;
use crate::engine::integrity::{Place, check_host_copy, checksum};
use crate::engine::ledger::Direction;
use crate::engine::slot::{Residency, Slot, SlotInfo, TensorId, Tier};

use super::{DeviceEngine, lock};

/// What came of offering a tensor's device payload for a hand-over (see
/// [`DeviceEngine::hand_over_slot`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandOver {
    /// The payload became the host copy, which went to this tier.
    Moved(Tier),
    /// The tensor is busy or off the device: nothing was done.
    Stayed,
    /// The payload cannot be handed over (it shares its buffer, or the backend's memory is
    /// not burn-spill's to take): it stays, and a copy is the way off the device.
    Refused,
}

impl DeviceEngine {
    /// Device to host (or on to disk when the host tier is full, see
    /// [`install_evicted`](Self::install_evicted)). The payload is cloned under the tensor's
    /// lock (a reference count on every backend), read without it, and swapped for the copy
    /// only if the tensor is still on the device then (an op may have consumed it meanwhile;
    /// its bytes never change). Returns the tier the bytes went to.
    pub fn evict_slot<D: Clone, H: AsRef<[u8]>>(
        &self,
        slot: &Slot<D, H>,
        info: SlotInfo<'_>,
        read: impl FnOnce(&D) -> Result<H, String>,
    ) -> Option<Tier> {
        let payload = {
            let state = slot.try_lock()?;
            let Residency::Device(payload) = &*state else {
                return None;
            };
            payload.clone()
        };
        let start = Instant::now();
        let host = match read(&payload) {
            Ok(host) => host,
            Err(why) => {
                tracing::warn!(target: "burn_spill::engine", id = info.id, error = %why,
                    "could not read tensor off the device; it stays there");
                return None;
            }
        };
        let moved = self.install_evicted(slot, info, host, start.elapsed(), true);
        drop(payload);
        moved
    }

    /// Bytes the host tier can still take under its limit (`u64::MAX` without one).
    pub fn host_room(&self) -> u64 {
        match self.limits().host_limit {
            Some(limit) => limit.saturating_sub(self.ledger.resident(Tier::Host)),
            None => u64::MAX,
        }
    }

    /// Puts a host copy that took `took` to read in place of the device payload, if the tensor
    /// is still on the device (an op may have consumed it meanwhile; its bytes never change).
    ///
    /// The host limit is hard: the copy stays on the host only if `may_stay_on_host` and the
    /// host tier has room for it (taken atomically, so evictions on several threads never
    /// overshoot together); otherwise it is written to the spill file at once and the host
    /// buffer freed. So the host tier never holds more than its limit; what is in transit on
    /// the host is, per evicting thread, the one tensor or batch (at most [`BATCH_BYTES`]) being
    /// written. Should that write fail, the tensor stays on the host over the limit (counted in
    /// `disk_write_errors`, with a warning) rather than be lost. Returns the tier it went to.
    ///
    /// [`BATCH_BYTES`]: super::evict::BATCH_BYTES
    pub fn install_evicted<D, H: AsRef<[u8]>>(
        &self,
        slot: &Slot<D, H>,
        info: SlotInfo<'_>,
        host: H,
        took: Duration,
        may_stay_on_host: bool,
    ) -> Option<Tier> {
        let mut state = slot.lock();
        if !matches!(*state, Residency::Device(_)) {
            return None;
        }
        let (tier, freed) = self.install_locked(&mut state, info, host, took, may_stay_on_host);
        drop(state);
        // Freeing the device tensor (and a host copy written to disk) is not part of the move's
        // time, nor done under the lock.
        drop(freed);
        Some(tier)
    }

    /// Device to host by handing the device payload itself over, where the adapter can make
    /// it a host buffer without copying (`hand_over` gives the payload back when it cannot).
    /// Taken and installed under the tensor's lock, so no op can read or clone it in between;
    /// the rest is [`install_evicted`](Self::install_evicted)'s, host limit included.
    pub fn hand_over_slot<D, H: AsRef<[u8]>>(
        &self,
        slot: &Slot<D, H>,
        info: SlotInfo<'_>,
        hand_over: impl FnOnce(D) -> Result<H, D>,
    ) -> HandOver {
        let Some(mut state) = slot.try_lock() else {
            return HandOver::Stayed;
        };
        let Residency::Device(_) = &*state else {
            return HandOver::Stayed;
        };
        let start = Instant::now();
        let Residency::Device(payload) = std::mem::replace(&mut *state, Residency::Taken) else {
            unreachable!("checked under the same lock");
        };
        match hand_over(payload) {
            Ok(host) => {
                let (tier, freed) =
                    self.install_locked(&mut state, info, host, start.elapsed(), true);
                drop(state);
                drop(freed);
                HandOver::Moved(tier)
            }
            Err(payload) => {
                *state = Residency::Device(payload);
                HandOver::Refused
            }
        }
    }

    /// The body of a move off the device, under the tensor's lock with the payload still in
    /// the state (or taken by a hand-over): puts `host` on the host or writes it on to disk
    /// (see [`install_evicted`](Self::install_evicted)). Returns the tier and what the caller
    /// frees once the lock is released: the state it replaced, and the host copy when it went
    /// on to disk.
    fn install_locked<D, H: AsRef<[u8]>>(
        &self,
        state: &mut Residency<D, H>,
        info: SlotInfo<'_>,
        host: H,
        took: Duration,
        may_stay_on_host: bool,
    ) -> (Tier, (Residency<D, H>, Option<H>)) {
        let limits = self.limits();
        let limit = limits.host_limit;
        let may_stay = may_stay_on_host || limit.is_none();
        let checked = |host: &H| limits.verify_restores.then(|| checksum(host.as_ref()));
        // The checksum is part of the move's time. It is not taken for bytes that will not fit
        // the host (a spill record has its own).
        let room = limit.map_or(u64::MAX, |l| {
            l.saturating_sub(self.ledger.resident(Tier::Host))
        });
        let (crc, took) = if may_stay && room >= info.bytes {
            let start = Instant::now();
            let crc = checked(&host);
            (crc, took + start.elapsed())
        } else {
            (None, took)
        };
        // The ledger moves with the state, under its lock, so no other move of this tensor
        // can be counted in between.
        if may_stay
            && self
                .ledger
                .try_evict_to_host(info.bytes, info.role, took, limit)
        {
            // Another thread may have freed the room the checksum was skipped for.
            let crc = crc.or_else(|| checked(&host));
            let device = std::mem::replace(state, Residency::Host { copy: host, crc });
            trace_move(Direction::DeviceToHost, info, took);
            return (Tier::Host, (device, None));
        }
        let start = Instant::now();
        match self.write_record(info, host.as_ref()) {
            Ok(record) => {
                let device = std::mem::replace(state, Residency::Disk(record));
                let wrote = start.elapsed();
                self.ledger
                    .on_evict_through_host(info.bytes, info.role, took, wrote);
                trace_move(Direction::DeviceToHost, info, took);
                trace_move(Direction::HostToDisk, info, wrote);
                (Tier::Disk, (device, Some(host)))
            }
            Err(error) => {
                self.disk_write_failed(info, error);
                let crc = crc.or_else(|| checked(&host));
                let device = std::mem::replace(state, Residency::Host { copy: host, crc });
                self.ledger
                    .try_evict_to_host(info.bytes, info.role, took, None);
                (Tier::Host, (device, None))
            }
        }
    }

    /// Writes one record to the first cold store that takes it.
    fn write_record(&self, info: SlotInfo<'_>, bytes: &[u8]) -> Result<ColdRecord, ColdWriteError> {
        let meta = (info.meta)();
        lock(&self.cold).write(info.id, meta.as_bytes(), bytes)
    }

    fn disk_write_failed(&self, info: SlotInfo<'_>, error: ColdWriteError) {
        if let ColdWriteError::Failed { error, store } = error {
            self.ledger.on_disk_write_error();
            tracing::warn!(target: "burn_spill::engine", id = info.id, store, %error,
                "cold-tier write failed; the tensor stays on the host, over the host limit");
        }
    }

    /// Counts one batched eviction of `tensors` tensors.
    pub fn batched(&self, tensors: u64) {
        self.ledger.on_batch(tensors);
    }

    /// Host to disk. The buffer is taken out (the slot is in flight meanwhile) and written
    /// without the tensor's lock. A write error puts it back on the host (over the host limit).
    /// A host copy that no longer matches its checksum from eviction is not written: it stays
    /// on the host, and the op that restores it reports the mismatch.
    pub fn demote_slot<D, H: AsRef<[u8]>>(&self, slot: &Slot<D, H>, info: SlotInfo<'_>) -> bool {
        let (host, crc) = {
            let Some(mut state) = slot.try_lock() else {
                return false;
            };
            match std::mem::replace(&mut *state, Residency::InFlight { from: Tier::Host }) {
                Residency::Host { copy, crc } => (copy, crc),
                other => {
                    *state = other;
                    return false;
                }
            }
        };
        let start = Instant::now();
        let written = self
            .write_record(info, host.as_ref())
            .map(|record| match crc {
                // The record's checksum is the bytes' as written: they must still be those that
                // left the device (the place is only described for a mismatch).
                Some(expected) if expected != record.crc => {
                    let place = Place::OnTheWayToDisk {
                        record: &lock(&self.cold).locate(&record),
                    };
                    let mismatch =
                        check_host_copy(info.id, crc, host.as_ref(), Some(record.crc), place);
                    self.free_record(&record);
                    Err(mismatch.expect_err("the checksums differ"))
                }
                _ => Ok(record),
            });
        let written = match written {
            Ok(Err(mismatch)) => {
                tracing::error!(target: "burn_spill::engine", id = info.id, %mismatch,
                    "a host copy changed while spilled; it stays on the host and its restore will fail");
                *slot.lock() = Residency::Host { copy: host, crc };
                slot.notify_arrived();
                return false;
            }
            Ok(Ok(record)) => Ok(record),
            Err(error) => Err(error),
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
                *slot.lock() = Residency::Host { copy: host, crc };
                slot.notify_arrived();
                self.disk_write_failed(info, error);
                false
            }
        }
    }

    /// Reads a cold record into `into`; the error names the tensor and where the record is.
    pub(super) fn read_record(
        &self,
        record: &ColdRecord,
        info: SlotInfo<'_>,
        into: &mut [u8],
    ) -> Result<(), String> {
        let meta = (info.meta)();
        lock(&self.cold).read_into(record, info.id, meta.as_bytes(), into)
    }

    pub(super) fn free_record(&self, record: &ColdRecord) {
        lock(&self.cold).free(record);
    }

    /// Host or disk to device, for the op that needs the bytes now (it holds the tensor's lock,
    /// having waited for any transfer in flight). `upload` makes the device payload from a host
    /// buffer and `alloc` an empty host buffer for a record to be read into. Returns whether
    /// anything moved.
    ///
    /// # Panics
    /// When a spill record cannot be read or fails its checksum: the panic names the tensor id,
    /// the file and the offset. The record is kept, so nothing is overwritten.
    pub fn restore_slot<D, H: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        slot: &mut Residency<D, H>,
        info: SlotInfo<'_>,
        upload: impl FnOnce(H) -> D,
        alloc: impl FnOnce(usize) -> H,
    ) -> bool {
        let start = Instant::now();
        let moved = match std::mem::replace(slot, Residency::Taken) {
            Residency::Host { copy, crc } => {
                if let Err(mismatch) =
                    check_host_copy(info.id, crc, copy.as_ref(), None, Place::Host)
                {
                    *slot = Residency::Host { copy, crc };
                    panic!("burn-spill: {mismatch}");
                }
                *slot = Residency::Device(upload(copy));
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
    pub fn prefetch_slot<D, H: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        slot: &Slot<D, H>,
        info: SlotInfo<'_>,
        upload: impl FnOnce(H) -> D,
        alloc: impl FnOnce(usize) -> H,
    ) -> bool {
        let taken = {
            let mut state = slot.lock();
            let from = match &*state {
                Residency::Host { .. } => Tier::Host,
                Residency::Disk(_) => Tier::Disk,
                _ => return false,
            };
            std::mem::replace(&mut *state, Residency::InFlight { from })
        };
        let start = Instant::now();
        let (host, record) = match taken {
            Residency::Host { copy, crc } => {
                if let Err(mismatch) =
                    check_host_copy(info.id, crc, copy.as_ref(), None, Place::Host)
                {
                    tracing::warn!(target: "burn_spill::transfer", id = info.id, %mismatch,
                        "prefetch found a host copy changed while spilled; the op needing it will report it");
                    *slot.lock() = Residency::Host { copy, crc };
                    slot.notify_arrived();
                    return false;
                }
                (copy, None)
            }
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
        let mut index = lock(&self.index);
        let tick = index.next_tick();
        index.arrived(id, tick);
    }

    /// Accounts for a dropped tensor's bytes wherever they were, freeing its spill record.
    pub fn drop_slot<D, H>(
        &self,
        slot: &Residency<D, H>,
        bytes: u64,
        role: crate::engine::TensorRole,
        evictable: bool,
    ) {
        if !evictable {
            self.ledger.on_unevictable(bytes, false);
        }
        let tier = match slot {
            Residency::Device(_) | Residency::Taken => Tier::Device,
            Residency::Host { .. } => Tier::Host,
            Residency::InFlight { from } => *from,
            Residency::Disk(record) => {
                self.free_record(record);
                Tier::Disk
            }
            Residency::Dropped => return self.ledger.on_drop_while_dropped(bytes, role),
        };
        self.ledger.on_drop(bytes, role, Some(tier));
    }

    /// Counts an op's wait for a transfer in flight.
    pub fn stalled(&self, waited: Duration) {
        if !waited.is_zero() {
            self.ledger.on_stall(waited);
        }
    }

    pub(super) fn moved(&self, direction: Direction, info: SlotInfo<'_>, took: Duration) {
        self.ledger.on_move(direction, info.bytes, info.role, took);
        trace_move(direction, info, took);
    }
}

fn trace_move(direction: Direction, info: SlotInfo<'_>, took: Duration) {
    tracing::debug!(target: "burn_spill::engine", id = info.id, bytes = info.bytes,
        ?direction, micros = took.as_micros() as u64, "moved");
}
