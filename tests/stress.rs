//! Stress: four threads run random op programs on one device at once, 10,000 ops each, handing
//! tensors to each other to drop, with the asynchronous workers on and the device reconfigured
//! under them every few milliseconds (budgets from 0 to 512 KiB, host limits 0, 16 KiB and none,
//! every policy). Every value read must be the bits plain Flex computes for the same program, and
//! the ledger must be back to zero at the end.
//!
//! A watchdog fails the test when no op completes for 30 s (a deadlock), naming how far each
//! thread got, instead of letting CI hang.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use burn_spill::{PolicyKind, SpillConfig};
use common::{ExclusiveDevice, Plain, Spill, input};

const THREADS: usize = 4;
const OPS_PER_THREAD: u64 = 10_000;
/// No op completing for this long is a deadlock.
const STALL_LIMIT: Duration = Duration::from_secs(30);
/// Live tensors a thread keeps at most; the oldest go first.
const POOL: usize = 24;

/// xorshift64*: each thread's program is fixed by its seed, on both backends.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }
}

/// Where a thread's tensors go to be dropped by another thread, and where it receives theirs.
struct Neighbours<B: Backend> {
    give: Option<Sender<Tensor<B, 2>>>,
    take: Option<Receiver<Tensor<B, 2>>>,
}

/// One thread's program: `ops` random ops over a pool of 16x16 f32 tensors (creations, sums,
/// products, matmuls, activations, transposed views, clones, drops, hand-offs to the neighbour,
/// reads). Returns every value it read, in order, and the pool's values at the end. What the
/// neighbour is handed is gone from this thread's pool either way, so the program's values do
/// not depend on when the neighbour drops it.
fn program<B: Backend>(
    seed: u64,
    ops: u64,
    device: &B::Device,
    neighbours: Neighbours<B>,
    progress: &AtomicU64,
) -> Vec<TensorData> {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut pool: Vec<Tensor<B, 2>> = (0..4)
        .map(|i| input::<B>(seed as usize * 97 + i, 16, 16, device))
        .collect();
    let mut reads = Vec::new();
    for op in 0..ops {
        if let Some(take) = &neighbours.take {
            // Tensors the neighbour handed over are dropped here, on a thread that never used them.
            while let Ok(foreign) = take.try_recv() {
                drop(foreign);
            }
        }
        let a = pool[rng.below(pool.len())].clone();
        let b = pool[rng.below(pool.len())].clone();
        let made = match rng.below(12) {
            0 => Some(input::<B>(
                (seed * 1_000_003 + op) as usize % 10_007,
                16,
                16,
                device,
            )),
            1 => Some(a + b),
            2 => Some((a * b).tanh()),
            3 => Some(a.matmul(b).mul_scalar(1.0 / 16.0)),
            4 => Some(a.sin()),
            5 => Some(a.mul_scalar(0.5).add_scalar(0.25)),
            // A strided view: never evicted on Flex, which must not block anyone.
            6 => Some(a.swap_dims(0, 1)),
            7 => Some(a),
            8 => {
                if pool.len() > 2 {
                    pool.swap_remove(rng.below(pool.len()));
                }
                None
            }
            9 => {
                if pool.len() > 2 {
                    let given = pool.swap_remove(rng.below(pool.len()));
                    if let Some(give) = &neighbours.give {
                        // The neighbour may have finished; then it is dropped here.
                        let _ = give.send(given);
                    }
                }
                None
            }
            10 => {
                reads.push(a.into_data());
                None
            }
            _ => Some((a - b).abs().sqrt()),
        };
        if let Some(t) = made {
            pool.push(t);
            if pool.len() > POOL {
                pool.remove(0);
            }
        }
        progress.fetch_add(1, Ordering::Relaxed);
    }
    reads.extend(pool.into_iter().map(Tensor::into_data));
    reads
}

/// The configurations the controller cycles through while the programs run.
fn configurations(spill_dir: &std::path::Path) -> Vec<SpillConfig> {
    let mut configs = Vec::new();
    for (i, budget) in [0u64, 8 << 10, 64 << 10, 512 << 10].into_iter().enumerate() {
        for (j, host) in [None, Some(0), Some(16 << 10)].into_iter().enumerate() {
            let policy = [PolicyKind::Lru, PolicyKind::NextUse, PolicyKind::CostAware][(i + j) % 3];
            let mut config = SpillConfig::default()
                .device_budget_bytes(budget)
                .spill_dir(spill_dir)
                .policy(policy)
                .prefetch_window((i + j) % 4)
                .asynchronous(true);
            if let Some(host) = host {
                config = config.host_limit_bytes(host);
            }
            configs.push(config);
        }
    }
    configs
}

#[test]
fn four_threads_with_foreign_drops_and_changing_budgets_match_flex() {
    let _device = ExclusiveDevice::take();
    let ops = std::env::var("STRESS_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(OPS_PER_THREAD);

    // The oracle: each program alone on plain Flex.
    let plain_device = Default::default();
    let expected: Vec<Vec<TensorData>> = (0..THREADS as u64)
        .map(|seed| {
            let none = Neighbours::<Plain> {
                give: None,
                take: None,
            };
            program::<Plain>(seed, ops, &plain_device, none, &AtomicU64::new(0))
        })
        .collect();

    let spill_dir = tempfile::tempdir().unwrap();
    let configs = configurations(spill_dir.path());
    let device: burn::tensor::Device<Spill> = Default::default();
    Spill::configure(&device, configs[0].clone()).unwrap();
    let progress: Arc<Vec<AtomicU64>> = Arc::new((0..THREADS).map(|_| AtomicU64::new(0)).collect());
    let done = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(THREADS + 1));

    // A ring: thread i hands tensors to thread i + 1.
    let (gives, takes): (Vec<_>, Vec<_>) = (0..THREADS).map(|_| channel()).unzip();
    let mut takes: Vec<Option<Receiver<Tensor<Spill, 2>>>> = takes.into_iter().map(Some).collect();
    takes.rotate_right(1);
    let workers: Vec<_> = gives
        .into_iter()
        .zip(takes)
        .enumerate()
        .map(|(i, (give, take))| {
            let (progress, start) = (progress.clone(), start.clone());
            std::thread::spawn(move || {
                let device = Default::default();
                let neighbours = Neighbours {
                    give: Some(give),
                    take,
                };
                start.wait();
                program::<Spill>(i as u64, ops, &device, neighbours, &progress[i])
            })
        })
        .collect();
    let controller = {
        let (done, configs) = (done.clone(), configs.clone());
        std::thread::spawn(move || {
            let device = Default::default();
            let mut applied = 0usize;
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(15));
                let config = configs[applied % configs.len()].clone();
                Spill::configure(&device, config).expect("every configuration is valid");
                applied += 1;
            }
            applied
        })
    };
    start.wait();

    // The watchdog: the test fails, naming where each thread is, if no op completes for
    // STALL_LIMIT; the stuck threads are left behind, and the test binary exits with the failure.
    let mut last = (0u64, Instant::now());
    while workers.iter().any(|w| !w.is_finished()) {
        std::thread::sleep(Duration::from_millis(100));
        let total: u64 = progress.iter().map(|p| p.load(Ordering::Relaxed)).sum();
        if total != last.0 {
            last = (total, Instant::now());
        } else if last.1.elapsed() > STALL_LIMIT {
            let each: Vec<u64> = progress.iter().map(|p| p.load(Ordering::Relaxed)).collect();
            done.store(true, Ordering::Relaxed);
            panic!(
                "no op completed for {STALL_LIMIT:?}: a deadlock; ops done per thread {each:?} of {ops}"
            );
        }
    }
    done.store(true, Ordering::Relaxed);
    let applied = controller.join().expect("the controller thread");
    let results: Vec<Vec<TensorData>> = workers
        .into_iter()
        .map(|w| w.join().expect("a program thread panicked"))
        .collect();
    eprintln!(
        "{THREADS} threads x {ops} ops, {applied} reconfigurations; moved: {:?}",
        Spill::stats(&device).device_to_host
    );
    for (thread, (plain, spilled)) in expected.iter().zip(&results).enumerate() {
        assert_eq!(plain.len(), spilled.len(), "thread {thread}: reads");
        for (i, (p, s)) in plain.iter().zip(spilled).enumerate() {
            assert!(
                p.dtype == s.dtype && p.shape == s.shape && p.as_bytes() == s.as_bytes(),
                "thread {thread}: read {i} differs from plain Flex"
            );
        }
    }
    assert!(applied > 0, "the budget changed mid-run");

    let stats = Spill::stats(&device);
    let live = Spill::live(&device);
    assert_eq!(
        (live.tensors, live.bytes),
        (0, 0),
        "the ledger is back to zero"
    );
    assert_eq!(
        (
            stats.resident.device,
            stats.resident.host,
            stats.resident.disk
        ),
        (0, 0, 0)
    );
    assert!(stats.device_to_host.count > 0 && stats.disk_to_device.count > 0);
    Spill::configure(&device, SpillConfig::default()).unwrap();
}
