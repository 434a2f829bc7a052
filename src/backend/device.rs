//! Device identity and the parameter-allocation scope.

use std::any::TypeId;
use std::cell::Cell;

use burn_backend::{Backend, DeviceOps};

use crate::engine::DeviceKey;

/// The engine's key for `device` of inner backend `B`.
pub(crate) fn device_key<B: Backend>(device: &B::Device) -> DeviceKey {
    let id = device.id();
    DeviceKey {
        backend: TypeId::of::<B>(),
        kind: id.type_id,
        index: id.index_id,
    }
}

/// The device's memory size, where it can be known without naming the backend: the CPU
/// backends' device is the machine's RAM. Burn 0.21 has no backend method that reports memory.
pub(crate) fn device_memory_bytes<B: Backend>(device: &B::Device) -> Option<u64> {
    let name = B::name(device).to_ascii_lowercase();
    let cpu = ["flex", "ndarray", "cpu"].iter().any(|n| name.contains(n));
    if !cpu {
        return None;
    }
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Whether `B`'s ops return once their kernels are queued (CubeCL: wgpu, CUDA, fused or not,
/// name themselves `cubecl<..>` or `fusion<cubecl<..>>`), so that an op's host-side duration
/// is a dispatch time, not its kernel's.
pub(crate) fn dispatches_asynchronously<B: Backend>(device: &B::Device) -> bool {
    B::name(device).contains("cubecl<")
}

thread_local! {
    /// Depth of nested `Backend::memory_persistent_allocations` calls on this thread. Burn runs
    /// the closure inline on the caller's thread (CubeCL included), so a thread-local is exact.
    static PERSISTENT_DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Whether tensors created now are module parameters being initialised or loaded.
pub(crate) fn persistent_allocation_active() -> bool {
    PERSISTENT_DEPTH.with(|d| d.get() > 0)
}

/// Marks the current thread as inside `memory_persistent_allocations` until dropped, so a
/// panic inside the closure cannot leave the flag set.
pub(crate) struct PersistentScope(());

impl PersistentScope {
    pub(crate) fn enter() -> Self {
        PERSISTENT_DEPTH.with(|d| d.set(d.get() + 1));
        Self(())
    }
}

impl Drop for PersistentScope {
    fn drop(&mut self) {
        PERSISTENT_DEPTH.with(|d| d.set(d.get() - 1));
    }
}
