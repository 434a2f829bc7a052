//! The inner backend's device queues, as the engine sees them: which queue the calling thread
//! submits to, running a worker's device work on an op thread's queue, and the allocator's own
//! figures for the queues burn-spill used.
//!
//! Why workers borrow an op thread's queue: CubeCL (wgpu, CUDA) gives every OS thread its own
//! stream and, on wgpu, every stream its own memory pool, and a queued kernel holds raw buffers,
//! not handles. A worker that uploaded or freed device memory on its own stream would put the
//! bytes in a pool whose next allocation is not ordered against the op thread's queued kernels:
//! a buffer freed by the op thread while its kernels are still queued would be handed out at
//! once to the worker's next upload and overwritten before those kernels ran. On the op
//! thread's stream every upload, read and free of a worker is ordered exactly as it would be if
//! the op thread had done it itself, which is what the synchronous engine does and what plain
//! `B` does. The adapter (`crate::backend::queues`) implements this with CubeCL's stream
//! override; backends without streams ignore it.

/// Bytes of the inner backend's memory pool, summed over the queues burn-spill's threads used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolUsage {
    /// Bytes in live allocations (what the tensors really occupy, without padding).
    pub in_use: u64,
    /// Bytes the allocator holds from the driver: what runs a GPU out of memory.
    pub reserved: u64,
    /// How many queues were summed.
    pub queues: u32,
}

/// Holds a device's exclusive-work lock (see [`DeviceQueues::exclusive`]) until dropped.
pub struct ExclusiveWork(
    #[allow(dead_code)]
    parking_lot::ArcReentrantMutexGuard<parking_lot::RawMutex, parking_lot::RawThreadId, ()>,
);

/// A reentrant lock for device work that must not interleave across threads.
#[derive(Debug, Default, Clone)]
pub struct ExclusiveLock(std::sync::Arc<parking_lot::ReentrantMutex<()>>);

impl ExclusiveLock {
    /// Takes the lock (again, on a thread that holds it).
    pub fn lock(&self) -> ExclusiveWork {
        ExclusiveWork(self.0.lock_arc())
    }
}

/// What the engine needs of the inner backend's queues. Burn-free: the adapter implements it.
pub trait DeviceQueues: Send + Sync {
    /// The queue the calling thread submits device work to now.
    fn current(&self) -> u64;
    /// Runs `work` on the calling thread as if it were submitting to `queue`.
    fn run_on(&self, queue: u64, work: &mut dyn FnMut());
    /// Remembers the calling thread's queue as one whose pool holds this device's tensors.
    fn note_current(&self);
    /// The pool's figures over every remembered queue, where the backend reports them.
    fn usage(&self) -> Option<PoolUsage>;
    /// Asks the allocator to return free pages to the driver, on every remembered queue.
    fn cleanup(&self);
    /// The device's memory size, where the backend reports it.
    fn total_memory(&self) -> Option<u64>;
    /// For backends whose tensors decide lazily, from their clone counts, whether an op may
    /// consume their buffer (burn-fusion: a count of one at registration means "read-write", and
    /// the buffer is freed after the op): a lock that every touch of a primitive on any thread
    /// (cloning it into an op and running the op, reading it, dropping it) holds, so that one
    /// thread's count check and the registration that relies on it never interleave with
    /// another thread's. `None` for backends that need no such lock.
    fn exclusive(&self) -> Option<ExclusiveWork>;
    /// Whether the backend may run several ops in one kernel (burn-fusion), where the shader
    /// compiler optimises across them: what an op computes may then depend on the ops beside
    /// it (see [`rebuilds_exactly`](crate::policy::recompute::rebuilds_exactly)).
    fn fuses_ops(&self) -> bool;
}

/// A backend with one queue and no pool figures (the engine's unit tests, CPU backends before
/// the adapter installs its own).
#[derive(Debug, Default)]
pub struct SingleQueue;

impl DeviceQueues for SingleQueue {
    fn current(&self) -> u64 {
        0
    }

    fn run_on(&self, _queue: u64, work: &mut dyn FnMut()) {
        work()
    }

    fn note_current(&self) {}

    fn usage(&self) -> Option<PoolUsage> {
        None
    }

    fn cleanup(&self) {}

    fn total_memory(&self) -> Option<u64> {
        None
    }

    fn exclusive(&self) -> Option<ExclusiveWork> {
        None
    }

    fn fuses_ops(&self) -> bool {
        false
    }
}
