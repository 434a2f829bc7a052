//! The background workers of one device: a transfer thread for device <-> host moves and an I/O
//! thread for host <-> disk moves (and disk reads of prefetches).
//!
//! Ops hand them jobs and go on; a job's bytes are marked in flight in the tensor's slot, and an
//! op that needs them waits for them (counted as stall time). Workers take a tensor's lock only
//! to swap its state, never while copying, and never call into Autodiff: they work on the inner
//! backend's primitives only. A job runs on the device queue of the thread that queued it (see
//! [`super::queues`]): on CubeCL, where every thread has its own stream and memory pool, a
//! worker's uploads, reads and frees are then ordered with the op thread's queued kernels
//! exactly as if the op thread had made them.
//!
//! Workers start on the first job and live as long as the process (device engines are never
//! dropped). A job that panics is logged and the worker goes on.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::DeviceEngine;
use super::index::Spillable;
use super::slot::TensorId;

/// Work for a worker.
pub(crate) enum Job {
    /// Bring a spilled tensor back to the device ahead of its use.
    Prefetch {
        victim: Arc<dyn Spillable>,
        id: TensorId,
        bytes: u64,
        /// The step and position when it was queued, to learn how many ops a transfer takes.
        queued_at: (u64, u32),
    },
    /// Evict toward the engine's latest settle goal (which later ops may lower while this job
    /// waits).
    Settle,
    /// Move the host tier's overflow to disk.
    Overflow,
}

/// Which worker runs a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    /// Device <-> host.
    Transfer,
    /// Host <-> disk.
    Io,
}

/// A job as queued: the device queue of the thread that queued it (the job's device work runs
/// there), and the time it was queued when that woke the worker (a job queued behind others
/// waits for them, not for the hand-off).
struct Queued {
    job: Job,
    device_queue: u64,
    woke_at: Option<Instant>,
}

/// One worker's queue. Prefetches go first: an op is about to need their bytes, while an
/// eviction after an op only restores headroom.
#[derive(Default)]
struct Queue {
    urgent: VecDeque<Queued>,
    background: VecDeque<Queued>,
    started: bool,
    /// The worker is waiting for a job: only then is it woken (a wake is a system call).
    idle: bool,
}

#[derive(Default)]
struct Worker {
    queue: Mutex<Queue>,
    ready: Condvar,
}

impl Worker {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next job, waiting for one.
    fn next(&self) -> Queued {
        let mut queue = self.lock();
        loop {
            if let Some(job) = queue.urgent.pop_front() {
                return job;
            }
            if let Some(job) = queue.background.pop_front() {
                return job;
            }
            queue.idle = true;
            queue = self.ready.wait(queue).unwrap_or_else(|e| e.into_inner());
            queue.idle = false;
        }
    }
}

/// The two workers and the count of jobs not yet done.
#[derive(Default)]
pub(crate) struct Transfers {
    transfer: Worker,
    io: Worker,
    pending: Mutex<u64>,
    idle: Condvar,
    /// How long a job that wakes its worker waits from being queued to starting, in
    /// nanoseconds (a running average weighting the newest by an eighth): what handing a move
    /// to a worker costs, which grows when the machine is busy and the worker is scheduled late.
    handoff_nanos: AtomicU64,
}

thread_local! {
    static ON_WORKER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the calling thread is a transfer worker (its moves are not op stalls).
pub(crate) fn on_worker() -> bool {
    ON_WORKER.with(std::cell::Cell::get)
}

impl Transfers {
    fn lock_pending(&self) -> std::sync::MutexGuard<'_, u64> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `job` on `lane`, starting its worker if needed.
    pub fn submit(&self, engine: &Arc<DeviceEngine>, lane: Lane, job: Job) {
        *self.lock_pending() += 1;
        let worker = self.worker(lane);
        let mut queue = worker.lock();
        let wake = std::mem::take(&mut queue.idle);
        let queued = Queued {
            job,
            device_queue: engine.queues().current(),
            woke_at: wake.then(Instant::now),
        };
        match queued.job {
            Job::Prefetch { .. } => queue.urgent.push_back(queued),
            _ => queue.background.push_back(queued),
        }
        if !queue.started {
            queue.started = true;
            spawn(engine.clone(), lane);
        }
        drop(queue);
        if wake {
            worker.ready.notify_one();
        }
    }

    /// The measured wait from queueing a job that wakes its worker to the job's start (zero
    /// before any job ran).
    pub fn handoff_latency(&self) -> Duration {
        Duration::from_nanos(self.handoff_nanos.load(Ordering::Relaxed))
    }

    fn learn_handoff(&self, waited: Duration) {
        let sample = waited.as_nanos().min(u128::from(u64::MAX)) as u64;
        let old = self.handoff_nanos.load(Ordering::Relaxed);
        let new = if old == 0 {
            sample
        } else {
            old - old / 8 + sample / 8
        };
        self.handoff_nanos.store(new, Ordering::Relaxed);
    }

    /// Whether a prefetch waits for the transfer worker.
    pub fn urgent_waiting(&self) -> bool {
        !self.transfer.lock().urgent.is_empty()
    }

    fn worker(&self, lane: Lane) -> &Worker {
        match lane {
            Lane::Transfer => &self.transfer,
            Lane::Io => &self.io,
        }
    }

    fn done(&self) {
        let mut pending = self.lock_pending();
        *pending = pending.saturating_sub(1);
        if *pending == 0 {
            self.idle.notify_all();
        }
    }

    /// Waits until every queued job is done. Never call it from a worker or while holding a
    /// tensor's lock.
    pub fn quiesce(&self) {
        if on_worker() {
            return;
        }
        let mut pending = self.lock_pending();
        while *pending > 0 {
            pending = self.idle.wait(pending).unwrap_or_else(|e| e.into_inner());
        }
    }
}

fn spawn(engine: Arc<DeviceEngine>, lane: Lane) {
    let name = match lane {
        Lane::Transfer => "burn-spill-transfer",
        Lane::Io => "burn-spill-io",
    };
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            ON_WORKER.with(|w| w.set(true));
            loop {
                let queued = engine.transfers().worker(lane).next();
                if let Some(at) = queued.woke_at {
                    engine.transfers().learn_handoff(at.elapsed());
                }
                let mut job = Some(queued.job);
                let mut outcome = Ok(());
                // Everything the job does on the device, the drop of what it moved included,
                // runs on the queue of the op thread that queued it.
                engine.queues().run_on(queued.device_queue, &mut || {
                    if let Some(job) = job.take() {
                        outcome = catch_unwind(AssertUnwindSafe(|| engine.run_job(job)));
                    }
                });
                if let Err(panic) = outcome {
                    let what = panic
                        .downcast_ref::<String>()
                        .map(String::as_str)
                        .or_else(|| panic.downcast_ref::<&str>().copied())
                        .unwrap_or("(no message)");
                    tracing::error!(target: "burn_spill::transfer", worker = name, what,
                        "a transfer job panicked; the worker goes on");
                }
                engine.transfers().done();
            }
        })
        .unwrap_or_else(|e| panic!("burn-spill: cannot start the {name} thread: {e}"));
}
