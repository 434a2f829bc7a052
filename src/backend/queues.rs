//! The adapter's [`DeviceQueues`]: Burn's stream ids, and the inner allocator's figures through
//! a probe for the backend families that report them.
//!
//! Burn 0.21 keys device queues by `StreamId`, one per OS thread unless overridden (CubeCL's
//! streams, Fusion's queues); `StreamId::executes` runs a closure on another thread's stream.
//! Backends without streams (Flex, NdArray) ignore the id, so the same code serves them.

use std::any::Any;
use std::sync::{Arc, Mutex};

use burn_backend::Backend;
use burn_std::stream_id::StreamId;
use smallvec::SmallVec;

use super::device::device_key;
use crate::engine::{
    DeviceEngine, DeviceQueues, ExclusiveLock, ExclusiveWork, PoolUsage, engine_ref,
};

/// The inner allocator of one device, on the calling thread's stream.
pub(crate) trait PoolProbe: Send + Sync {
    /// Bytes in use and reserved on the calling thread's stream; `None` if unreadable.
    fn usage(&self) -> Option<(u64, u64)>;
    /// Returns the free pages of the calling thread's stream to the driver.
    fn cleanup(&self);
    /// The device's memory size, where the backend reports it.
    fn total_memory(&self) -> Option<u64>;
}

/// Burn's streams of one device, and the streams that hold its tensors.
pub(crate) struct StreamQueues {
    /// Streams of the threads that created tensors on the device.
    seen: Mutex<SmallVec<[u64; 4]>>,
    probe: Option<Box<dyn PoolProbe>>,
    /// For lazy (fused) backends, see [`DeviceQueues::exclusive`].
    exclusive: Option<ExclusiveLock>,
    /// See [`DeviceQueues::fuses_ops`].
    fuses_ops: bool,
}

impl StreamQueues {
    fn seen(&self) -> SmallVec<[u64; 4]> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl DeviceQueues for StreamQueues {
    fn current(&self) -> u64 {
        StreamId::current().value
    }

    fn run_on(&self, queue: u64, work: &mut dyn FnMut()) {
        StreamId { value: queue }.executes(work)
    }

    fn note_current(&self) {
        let stream = self.current();
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if !seen.contains(&stream) {
            seen.push(stream);
        }
    }

    fn usage(&self) -> Option<PoolUsage> {
        let probe = self.probe.as_ref()?;
        let streams = self.seen();
        if streams.is_empty() {
            return None;
        }
        let mut total = PoolUsage::default();
        for stream in streams {
            let (in_use, reserved) = StreamId { value: stream }.executes(|| probe.usage())?;
            total.in_use += in_use;
            total.reserved += reserved;
            total.queues += 1;
        }
        Some(total)
    }

    fn cleanup(&self) {
        let Some(probe) = self.probe.as_ref() else {
            return;
        };
        for stream in self.seen() {
            StreamId { value: stream }.executes(|| probe.cleanup());
        }
    }

    fn total_memory(&self) -> Option<u64> {
        self.probe.as_ref()?.total_memory()
    }

    fn exclusive(&self) -> Option<ExclusiveWork> {
        self.exclusive.as_ref().map(ExclusiveLock::lock)
    }

    fn fuses_ops(&self) -> bool {
        self.fuses_ops
    }
}

/// The engine of `device`, with its queues installed.
pub(crate) fn engine_with_queues<B: Backend>(device: &B::Device) -> &'static Arc<DeviceEngine> {
    let engine = engine_ref(device_key::<B>(device));
    engine.install_queues(|| {
        Arc::new(StreamQueues {
            seen: Mutex::new(SmallVec::new()),
            probe: probe_for(device),
            exclusive: decides_lazily::<B>(device).then(ExclusiveLock::default),
            fuses_ops: decides_lazily::<B>(device),
        })
    });
    engine
}

/// Whether `B` decides from clone counts, when an op is registered, whether the op may consume
/// its inputs' buffers: burn-fusion does (`FusionTensor::into_ir`), and names itself `fusion<..>`.
/// It is also what runs several ops in one kernel.
fn decides_lazily<B: Backend>(device: &B::Device) -> bool {
    B::name(device).starts_with("fusion<")
}

/// The pool probe of the backend families burn-spill knows (CubeCL: wgpu, CUDA; fused or not,
/// they share the runtime's client).
fn probe_for(device: &dyn Any) -> Option<Box<dyn PoolProbe>> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if let Some(probe) = super::cubecl::probe(device) {
        return Some(probe);
    }
    let _ = device;
    None
}

/// The pool of `device` on the calling thread's stream, where the backend reports it.
pub(crate) fn inner_pool_usage(device: &dyn Any) -> Option<PoolUsage> {
    let (in_use, reserved) = probe_for(device)?.usage()?;
    Some(PoolUsage {
        in_use,
        reserved,
        queues: 1,
    })
}
