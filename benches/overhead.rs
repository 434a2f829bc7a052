//! Per-op overhead of `SpillBackend<Flex>` against plain `Flex`, and one training step of the
//! small CNN, measured in the same run. Prints a markdown table of the ratios at the end.
//!
//! ```text
//! cargo bench --bench overhead
//! ```

#[path = "../examples/common/small_models.rs"]
mod small_models;

use std::hint::black_box;
use std::time::{Duration, Instant};

use burn::backend::{Autodiff, Flex};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{Adam, AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use burn_spill::{SpillBackend, SpillConfig};
use criterion::{BatchSize, Criterion};
use small_models::{SmallCnn, cnn_batch};

type Spill = SpillBackend<Flex>;

fn float_input<B: Backend>(rows: usize, cols: usize) -> B::FloatTensorPrimitive {
    let values: Vec<f32> = (0..rows * cols).map(|i| (i % 17) as f32 * 0.25).collect();
    B::float_from_data(TensorData::new(values, [rows, cols]), &Default::default())
}

fn bench_add<B: Backend>(c: &mut Criterion, id: &str) {
    c.benchmark_group("add_16x16").bench_function(id, |b| {
        b.iter_batched(
            || (float_input::<B>(16, 16), float_input::<B>(16, 16)),
            |(x, y)| black_box(B::float_add(x, y)),
            BatchSize::SmallInput,
        )
    });
}

fn bench_matmul<B: Backend>(c: &mut Criterion, id: &str) {
    c.benchmark_group("matmul_64x64").bench_function(id, |b| {
        b.iter_batched(
            || (float_input::<B>(64, 64), float_input::<B>(64, 64)),
            |(x, y)| black_box(B::float_matmul(x, y)),
            BatchSize::SmallInput,
        )
    });
}

/// The small CNN with its optimizer and one fixed batch: one call of `step` is one training step.
struct CnnTrainer<B: AutodiffBackend> {
    model: Option<SmallCnn<B>>,
    optim: OptimizerAdaptor<Adam, SmallCnn<B>, B>,
    images: Tensor<B, 4>,
    labels: Tensor<B, 1, Int>,
}

impl<B: AutodiffBackend> CnnTrainer<B> {
    fn new() -> Self {
        let device = Default::default();
        B::seed(&device, 1);
        let (images, labels) = cnn_batch::<B>(16, 0, &device);
        Self {
            model: Some(SmallCnn::new(&device)),
            optim: AdamConfig::new().init(),
            images,
            labels,
        }
    }

    fn step(&mut self) {
        let model = self
            .model
            .take()
            .expect("model is put back after every step");
        let loss = model.loss(self.images.clone(), self.labels.clone());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        self.model = Some(self.optim.step(1e-3, model, grads));
    }
}

fn bench_cnn_step<B: AutodiffBackend>(c: &mut Criterion, id: &str) {
    let mut trainer = CnnTrainer::<B>::new();
    c.benchmark_group("cnn_train_step")
        .bench_function(id, |b| b.iter(|| trainer.step()));
}

/// Step-time ratio spill / plain from alternating single steps, so that machine drift (other
/// processes, frequency changes) hits both sides alike; returns the median over `rounds`.
fn paired_step_ratio(rounds: usize) -> f64 {
    let mut plain = CnnTrainer::<Autodiff<Flex>>::new();
    let mut spill = CnnTrainer::<Autodiff<Spill>>::new();
    for _ in 0..3 {
        plain.step();
        spill.step();
    }
    let time = |f: &mut dyn FnMut()| {
        let start = Instant::now();
        f();
        start.elapsed().as_secs_f64()
    };
    let mut ratios: Vec<f64> = (0..rounds)
        .map(|round| {
            // Alternate which side goes first: a cache warmed by one must not favour the other.
            let (p, s) = if round % 2 == 0 {
                let p = time(&mut || plain.step());
                (p, time(&mut || spill.step()))
            } else {
                let s = time(&mut || spill.step());
                (time(&mut || plain.step()), s)
            };
            s / p
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    ratios[rounds / 2]
}

/// Step-time ratio with the tape on / off for the spilled CNN, from alternating single steps on
/// one trainer. With `resample` 1 every step is recorded in full; with 100 the steps after the
/// first two only have their op signatures verified.
fn paired_recording_ratio(rounds: usize, resample: u64) -> f64 {
    let device = Default::default();
    SpillBackend::<Flex>::configure(
        &device,
        SpillConfig::default().tape_resample_steps(resample),
    )
    .expect("a valid config");
    let mut trainer = CnnTrainer::<Autodiff<Spill>>::new();
    let mut step = |record: bool| {
        if record {
            SpillBackend::<Flex>::record_tape(&device, true);
        }
        let start = Instant::now();
        if record {
            SpillBackend::<Flex>::step_begin(&device);
        }
        trainer.step();
        if record {
            SpillBackend::<Flex>::step_end(&device);
        }
        let took = start.elapsed().as_secs_f64();
        if record {
            SpillBackend::<Flex>::record_tape(&device, false);
        }
        took
    };
    for _ in 0..3 {
        step(false);
        step(true);
    }
    let mut ratios: Vec<f64> = (0..rounds)
        .map(|round| {
            let (off, on) = if round % 2 == 0 {
                let off = step(false);
                (off, step(true))
            } else {
                let on = step(true);
                (step(false), on)
            };
            on / off
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    SpillBackend::<Flex>::configure(&device, SpillConfig::default()).expect("a valid config");
    ratios[rounds / 2]
}

/// Reads criterion's point estimate (mean, ns) of one benchmark from this run's output.
fn mean_ns(id: &str) -> Option<f64> {
    let dir = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let path = format!("{dir}/criterion/{id}/new/estimates.json");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    json["mean"]["point_estimate"].as_f64()
}

fn main() {
    let mut c = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    bench_add::<Flex>(&mut c, "flex");
    bench_add::<Spill>(&mut c, "spill");
    bench_matmul::<Flex>(&mut c, "flex");
    bench_matmul::<Spill>(&mut c, "spill");
    bench_cnn_step::<Autodiff<Flex>>(&mut c, "flex");
    bench_cnn_step::<Autodiff<Spill>>(&mut c, "spill");
    c.final_summary();

    println!("\n| benchmark | plain (ns) | spill (ns) | added (ns) | ratio |");
    println!("|---|---:|---:|---:|---:|");
    for name in ["add_16x16", "matmul_64x64", "cnn_train_step"] {
        if let (Some(plain), Some(spill)) = (
            mean_ns(&format!("{name}/flex")),
            mean_ns(&format!("{name}/spill")),
        ) {
            println!(
                "| {name} | {plain:.0} | {spill:.0} | {:.0} | {:.4} |",
                spill - plain,
                spill / plain
            );
        }
    }
    let rounds = 101;
    println!(
        "\ncnn_train_step, paired: median spill/plain ratio over {rounds} alternating steps = {:.4}",
        paired_step_ratio(rounds)
    );
    println!(
        "cnn_train_step, tape recording every step in full: median on/off ratio over {rounds} alternating steps = {:.4}",
        paired_recording_ratio(rounds, 1)
    );
    println!(
        "cnn_train_step, tape with the default resampling (verify steps, record every 100th): median on/off ratio over {rounds} alternating steps = {:.4}",
        paired_recording_ratio(rounds, 100)
    );
}
