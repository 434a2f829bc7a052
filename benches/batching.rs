//! Batched eviction: how close many small tensors come to the bandwidth of one large one.
//!
//! ```text
//! cargo bench --bench batching
//! ```
//!
//! Each round makes the tensors under a roomy budget, then drops the budget to zero, which
//! evicts them all in one pass: 256 tensors of 4 KiB (evicted in batches: one transaction read,
//! one host buffer per batch), and one tensor of 1 MiB. The time of that reconfiguration is the
//! eviction time. The summary prints the median over rounds of small/large time for the same
//! bytes (1.0 = small tensors move at the large one's bandwidth), and criterion times both.

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

/// Makes the tensors under a roomy budget and times their eviction by a budget of zero.
fn eviction_time(count: usize, elements: usize) -> (Duration, u64) {
    let device = Default::default();
    Spill::configure(&device, SpillConfig::default().device_budget_bytes(1 << 30)).unwrap();
    let kept = tensors(count, elements);
    let before = Spill::stats(&device).eviction_batches;
    let start = Instant::now();
    Spill::configure(
        &device,
        SpillConfig::default()
            .device_budget_bytes(0)
            .asynchronous(false),
    )
    .unwrap();
    let took = start.elapsed();
    let batches = Spill::stats(&device).eviction_batches - before;
    drop(kept);
    (took, batches)
}

fn main() {
    let smoke = std::env::args().any(|a| a == "--test");
    let rounds = if smoke { 1 } else { 31 };
    let mut criterion = Criterion::default().configure_from_args();
    if !smoke {
        let mut group = criterion.benchmark_group("evict_1MiB");
        group.bench_function("256 x 4KiB", |b| {
            b.iter_custom(|n| (0..n).map(|_| eviction_time(COUNT, SMALL).0).sum())
        });
        group.bench_function("1 x 1MiB", |b| {
            b.iter_custom(|n| (0..n).map(|_| eviction_time(1, COUNT * SMALL).0).sum())
        });
        group.finish();
    }
    let mut ratios = Vec::new();
    let mut batches = 0;
    for _ in 0..rounds {
        let (small, b) = eviction_time(COUNT, SMALL);
        let (large, _) = eviction_time(1, COUNT * SMALL);
        batches = b;
        ratios.push(small.as_secs_f64() / large.as_secs_f64());
    }
    ratios.sort_by(f64::total_cmp);
    Spill::configure(&Default::default(), SpillConfig::default()).unwrap();
    println!();
    println!("| eviction of 1 MiB | batches | time vs one 1 MiB tensor (median) |");
    println!("| --- | --- | --- |");
    println!(
        "| {COUNT} x 4 KiB | {batches} | {:.2} |",
        ratios[ratios.len() / 2]
    );
    criterion.final_summary();
}
