//! Batched eviction: how close many small tensors come to the bandwidth of one large one.
//!
//! ```text
//! cargo bench --bench batching
//! ```
//!
//! Each round makes the tensors under a roomy budget, then drops the budget to zero, which
//! evicts them all in one pass: 256 tensors of 4 KiB (evicted in batches: one transaction read,
//! one host buffer per batch), and one tensor of 1 MiB. The time of that reconfiguration is the
//! eviction time; the device-to-host move time the engine measured (`stats().device_to_host`:
//! the read and the copy into host memory, without choosing victims and updating the books) is
//! the transfer time. The summary prints the medians over rounds of small/large for both, for
//! the same bytes (1.0 = small tensors move at the large one's bandwidth), and criterion times
//! both evictions. The tensors own their Flex buffers, so each is handed to the host tier
//! without a copy: the transfer is the per-tensor cost of a move, not a copy's bandwidth.

use std::time::{Duration, Instant};

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};
use burn_spill::{SpillBackend, SpillConfig};
use criterion::Criterion;

type Spill = SpillBackend<Flex>;

const SMALL: usize = 1024; // f32 elements: 4 KiB
const COUNT: usize = 256; // 1 MiB in all

fn tensors(count: usize, elements: usize) -> Vec<Tensor<Spill, 1>> {
    let device = Default::default();
    (0..count)
        .map(|i| {
            let values: Vec<f32> = (0..elements).map(|x| (x + i) as f32).collect();
            Tensor::from_data(TensorData::new(values, [elements]), &device)
        })
        .collect()
}

/// What one eviction of all the tensors took.
struct Eviction {
    /// The whole reconfiguration that evicts them.
    total: Duration,
    /// The move time the engine measured (reads and copies).
    transfer: Duration,
    batches: u64,
}

/// Makes the tensors under a roomy budget and times their eviction by a budget of zero.
fn eviction_time(count: usize, elements: usize) -> Eviction {
    let device = Default::default();
    Spill::configure(&device, SpillConfig::default().device_budget_bytes(1 << 30)).unwrap();
    let kept = tensors(count, elements);
    let before = Spill::stats(&device);
    let start = Instant::now();
    Spill::configure(
        &device,
        SpillConfig::default()
            .device_budget_bytes(0)
            .asynchronous(false),
    )
    .unwrap();
    let total = start.elapsed();
    let after = Spill::stats(&device);
    drop(kept);
    Eviction {
        total,
        transfer: after.device_to_host.time - before.device_to_host.time,
        batches: after.eviction_batches - before.eviction_batches,
    }
}

fn main() {
    let smoke = std::env::args().any(|a| a == "--test");
    let rounds = if smoke { 1 } else { 31 };
    let mut criterion = Criterion::default().configure_from_args();
    if !smoke {
        let mut group = criterion.benchmark_group("evict_1MiB");
        group.bench_function("256 x 4KiB", |b| {
            b.iter_custom(|n| (0..n).map(|_| eviction_time(COUNT, SMALL).total).sum())
        });
        group.bench_function("1 x 1MiB", |b| {
            b.iter_custom(|n| (0..n).map(|_| eviction_time(1, COUNT * SMALL).total).sum())
        });
        group.finish();
    }
    let (mut totals, mut transfers) = (Vec::new(), Vec::new());
    let mut batches = 0;
    for _ in 0..rounds {
        let small = eviction_time(COUNT, SMALL);
        let large = eviction_time(1, COUNT * SMALL);
        batches = small.batches;
        totals.push(small.total.as_secs_f64() / large.total.as_secs_f64());
        transfers.push(small.transfer.as_secs_f64() / large.transfer.as_secs_f64());
    }
    Spill::configure(&Default::default(), SpillConfig::default()).unwrap();
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!();
    println!(
        "| eviction of 1 MiB | batches | transfer time vs one 1 MiB tensor | whole eviction vs one 1 MiB tensor |"
    );
    println!("| --- | --- | --- | --- |");
    println!(
        "| {COUNT} x 4 KiB | {batches} | {:.2} | {:.2} |",
        median(transfers),
        median(totals)
    );
    criterion.final_summary();
}
