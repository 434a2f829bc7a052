//! Per-device accounting of live tensor handles and their bytes.
//!
//! Every `SpillTensor` reports its creation and its last drop here, so the ledger always knows
//! how many distinct tensors are alive on a device and how many bytes they describe
//! (elements x dtype size). It returns to zero when every handle is gone, which the tests use
//! to prove that nothing leaks.

use std::sync::atomic::{AtomicU64, Ordering};

/// What a tensor is for, as far as burn-spill can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TensorRole {
    /// Created inside `Backend::memory_persistent_allocations` (module parameters at init or load).
    Parameter,
    /// Everything else: activations, gradients, optimizer state, temporaries.
    Other,
}

/// A snapshot of what is alive on one device.
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

/// Lock-free counters for one device.
///
/// Atomics rather than a mutex: handles are created on every op and dropped on any thread
/// (autodiff's backward, dataloader workers, metric threads), so this must be cheap and never
/// block.
#[derive(Debug, Default)]
pub struct Ledger {
    tensors: AtomicU64,
    bytes: AtomicU64,
    parameter_tensors: AtomicU64,
    parameter_bytes: AtomicU64,
    peak_bytes: AtomicU64,
    created_total: AtomicU64,
}

impl Ledger {
    /// Records a new live tensor of `bytes` bytes.
    pub fn on_create(&self, bytes: u64, role: TensorRole) {
        self.tensors.fetch_add(1, Ordering::Relaxed);
        self.created_total.fetch_add(1, Ordering::Relaxed);
        let now = self.bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak_bytes.fetch_max(now, Ordering::Relaxed);
        if role == TensorRole::Parameter {
            self.parameter_tensors.fetch_add(1, Ordering::Relaxed);
            self.parameter_bytes.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// Records that the last handle of a tensor of `bytes` bytes is gone.
    pub fn on_drop(&self, bytes: u64, role: TensorRole) {
        self.tensors.fetch_sub(1, Ordering::Relaxed);
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
        if role == TensorRole::Parameter {
            self.parameter_tensors.fetch_sub(1, Ordering::Relaxed);
            self.parameter_bytes.fetch_sub(bytes, Ordering::Relaxed);
        }
    }

    /// A consistent-enough snapshot (each counter is read atomically on its own).
    pub fn summary(&self) -> LiveSummary {
        LiveSummary {
            tensors: self.tensors.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            parameter_tensors: self.parameter_tensors.load(Ordering::Relaxed),
            parameter_bytes: self.parameter_bytes.load(Ordering::Relaxed),
            peak_bytes: self.peak_bytes.load(Ordering::Relaxed),
            created_total: self.created_total.load(Ordering::Relaxed),
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
        ledger.on_drop(100, TensorRole::Other);
        ledger.on_drop(50, TensorRole::Parameter);
        let s = ledger.summary();
        assert_eq!(
            (s.tensors, s.bytes, s.parameter_tensors, s.parameter_bytes),
            (0, 0, 0, 0)
        );
        assert_eq!(s.peak_bytes, 150);
        assert_eq!(s.created_total, 2);
    }
}
