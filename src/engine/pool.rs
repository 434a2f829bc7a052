//! Watching the inner allocator's pool: its bytes in use and reserved, now and at peak, and
//! returning free pages to the driver when the pool holds more than it needs.
//!
//! Reading the pool is a round trip to the backend's device thread (CubeCL also flushes the
//! queue it reads), so it is not done per op. The ledger says when it is worth it: the pool's
//! reserved bytes can only grow with allocations, so it is read once the bytes that arrived on
//! the device since the last reading (created, restored, prefetched) reach the margin, and
//! pages can only be returnable after the device's bytes fell, so it is read too when they fell
//! by the margin below their last high; then pages are returned if the pool reserves more than
//! the margin beyond what is in use. It is also read at step boundaries and for every `stats()`.
//! A page is returned only when wholly free, so on a pool with large pages (CubeCL's smallest
//! sliced page is 8 MiB or more) reserved bytes stay above those in use by fragmentation.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::queues::{DeviceQueues, PoolUsage};
use crate::policy::pool::worth_returning_pages;
use crate::stats::PoolStats;

#[derive(Debug, Default)]
struct Readings {
    peak_in_use: u64,
    peak_reserved: u64,
    cleanups: u64,
    /// Bytes a cleanup gave back (reserved before less reserved after), over all cleanups.
    returned: u64,
}

/// The pool figures of one device and when to read them.
#[derive(Debug, Default)]
pub(crate) struct PoolWatch {
    readings: Mutex<Readings>,
    /// The ledger's device arrivals at the last reading.
    arrivals_at_reading: AtomicU64,
    /// The ledger's device bytes since the last reading: their highest.
    high_since: AtomicU64,
}

impl PoolWatch {
    fn lock(&self) -> std::sync::MutexGuard<'_, Readings> {
        self.readings.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// After an op with `device` bytes on the ledger and `arrivals` bytes ever arrived on the
    /// device: reads the pool (and returns pages) when `margin` bytes arrived since the last
    /// reading or the device's bytes fell by `margin` below their high since. Cheap otherwise:
    /// two atomics.
    pub fn after_op(&self, device: u64, arrivals: u64, margin: u64, queues: &dyn DeviceQueues) {
        // Read first: the device is rarely at a new high, and a read is cheaper than an update.
        let seen = self.high_since.load(Ordering::Relaxed);
        let high = if device > seen {
            self.high_since
                .fetch_max(device, Ordering::Relaxed)
                .max(device)
        } else {
            seen
        };
        let fell = high.saturating_sub(device) >= margin;
        let grew =
            arrivals.saturating_sub(self.arrivals_at_reading.load(Ordering::Relaxed)) >= margin;
        if fell || grew {
            self.check(device, arrivals, margin, queues);
        }
    }

    /// Reads the pool and returns its free pages if it reserves more than `margin` beyond the
    /// bytes in use.
    pub fn check(&self, device: u64, arrivals: u64, margin: u64, queues: &dyn DeviceQueues) {
        self.arrivals_at_reading.store(arrivals, Ordering::Relaxed);
        self.high_since.store(device, Ordering::Relaxed);
        let Some(before) = self.read(queues) else {
            return;
        };
        if worth_returning_pages(before, margin) {
            queues.cleanup();
            if let Some(after) = self.read(queues) {
                let mut readings = self.lock();
                readings.cleanups += 1;
                readings.returned += before.reserved.saturating_sub(after.reserved);
            }
        }
    }

    /// Returns free pages whatever the margin (`SpillBackend::memory_cleanup`).
    pub fn cleanup_now(&self, queues: &dyn DeviceQueues) {
        let before = self.read(queues);
        queues.cleanup();
        let after = self.read(queues);
        if let (Some(before), Some(after)) = (before, after) {
            let mut readings = self.lock();
            readings.cleanups += 1;
            readings.returned += before.reserved.saturating_sub(after.reserved);
        }
    }

    /// One reading, folded into the peaks.
    pub fn read(&self, queues: &dyn DeviceQueues) -> Option<PoolUsage> {
        let usage = queues.usage()?;
        let mut readings = self.lock();
        readings.peak_in_use = readings.peak_in_use.max(usage.in_use);
        readings.peak_reserved = readings.peak_reserved.max(usage.reserved);
        Some(usage)
    }

    /// Lowers the peaks to a fresh reading.
    pub fn reset_peaks(&self, queues: &dyn DeviceQueues) {
        let usage = queues.usage();
        let mut readings = self.lock();
        readings.peak_in_use = usage.map_or(0, |u| u.in_use);
        readings.peak_reserved = usage.map_or(0, |u| u.reserved);
    }

    /// The figures after a fresh reading; `None` where the backend reports no pool.
    pub fn stats(&self, queues: &dyn DeviceQueues) -> Option<PoolStats> {
        let now = self.read(queues)?;
        let readings = self.lock();
        Some(PoolStats {
            in_use: now.in_use,
            reserved: now.reserved,
            peak_in_use: readings.peak_in_use,
            peak_reserved: readings.peak_reserved,
            streams: now.queues,
            cleanups: readings.cleanups,
            returned_bytes: readings.returned,
        })
    }
}
