//! The dry-run planner against reality: for the small CNN, the tiny Transformer and the
//! examples' ResNet-18 and GPT on Flex, the step time and bytes moved that
//! `burn_spill::plan::dry_run` predicts with the `measured` profile, from one step recorded
//! with a budget that never binds, next to what training measures at 100%, 50% and 30% of the
//! plain peak. Prints a markdown table at the end.
//!
//! ```text
//! cargo bench --bench planner            # a few minutes on two cores
//! cargo bench --bench planner -- --test  # smoke run: one round per budget
//! ```
//!
//! How it measures:
//! - The plain peak is the spilled trainer's device peak with no budget (it only counts).
//! - The tape: five marked steps with a budget of ten times the peak (configured, never
//!   binding), after warm-up steps, merged into one whose op durations (this machine's op
//!   times) and gaps between ops (the host's own work) are the medians of the five
//!   (`plan::median_tape`).
//! - Each budget: a fresh trainer, warm-up steps (the engine learns its plan and leads), then
//!   measured marked steps: the median step time, and the bytes the last step moved (all four
//!   directions, from `SpillStats::last_step`).
//! - The `measured` profile takes its link figures from the 30% run's moves (run first), so
//!   every row predicts with the same bandwidths.
//! - Criterion times one dry run of each model's tape at 30% (the planner's own cost).

#[path = "../examples/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use burn::backend::{Autodiff, Flex};
use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{Adam, AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Tensor};
use burn_spill::plan::{DeviceProfile, dry_run_over_budget, median_tape};
use burn_spill::tape::StepTape;
use burn_spill::{SpillBackend, SpillConfig, SpillStats};
use common::gpt_model::GptConfig;
use common::resnet_model::ResNetConfig;
use common::small_models::{SmallCnn, TinyGpt, cnn_batch, gpt_batch};
use common::synthetic::{ImageTask, SequenceTask};
use common::trainers::{GptTrainer, ResNetTrainer};
use common::units::bytes;
use criterion::Criterion;

type Spilled = Autodiff<SpillBackend<Flex>>;
type Spill = SpillBackend<Flex>;
type Dev = burn::tensor::Device<Spilled>;

/// Budgets in percent of the plain peak, the first measured first (its moves give the
/// profile's bandwidths).
const BUDGETS_PERCENT: [u64; 3] = [30, 50, 100];
const WARM_UP_STEPS: usize = 5;

/// One training step of a model on the spilled backend.
type Step = Box<dyn FnMut() -> f32>;

/// A small model trained with Adam, one step per call.
fn small_model_step<M, F>(init: fn(&Dev) -> M, loss: F, lr: f64) -> Step
where
    M: AutodiffModule<Spilled> + Clone + 'static,
    F: Fn(&M, usize, &Dev) -> Tensor<Spilled, 1> + 'static,
{
    let device = Default::default();
    <Spilled as Backend>::seed(&device, 7);
    let mut model = Some(init(&device));
    let mut optim: OptimizerAdaptor<Adam, M, Spilled> = AdamConfig::new().init();
    let mut step = 0usize;
    Box::new(move || {
        <Spilled as Backend>::seed(&device, 1_000 + step as u64);
        let m = model.take().expect("a model between steps");
        let loss = loss(&m, step, &device);
        let value: f32 = loss.clone().into_scalar().elem();
        let grads = GradientsParams::from_grads(loss.backward(), &m);
        model = Some(optim.step(lr, m, grads));
        step += 1;
        value
    })
}

/// The four models, each as a fresh step function and its preset's config.
/// A model's name, a maker of its fresh step function, and its preset's config.
type Model = (&'static str, fn() -> Step, fn() -> SpillConfig);

/// A recorded tape with what predicted it at 30%, for criterion.
type Planned = (&'static str, StepTape, SpillConfig, DeviceProfile);

fn models() -> Vec<Model> {
    fn cnn() -> Step {
        small_model_step(
            SmallCnn::new,
            |m: &SmallCnn<Spilled>, s, d| {
                let (images, labels) = cnn_batch::<Spilled>(8, s, d);
                m.loss(images, labels)
            },
            1e-2,
        )
    }
    fn transformer() -> Step {
        small_model_step(
            TinyGpt::new,
            |m: &TinyGpt<Spilled>, s, d| m.loss(gpt_batch::<Spilled>(8, s, d)),
            3e-3,
        )
    }
    fn resnet18() -> Step {
        let config = ResNetConfig {
            depth: 18,
            width: 8,
            image_size: 16,
            classes: 10,
        };
        let task = ImageTask {
            image_size: config.image_size,
            classes: config.classes,
            seed: 1,
        };
        let mut trainer = ResNetTrainer::<Spilled>::new(&config, task, 16, &Default::default());
        Box::new(move || trainer.step())
    }
    fn gpt() -> Step {
        let config = GptConfig {
            vocab: 32,
            seq_len: 32,
            d_model: 64,
            heads: 4,
            layers: 2,
            dropout: 0.1,
        };
        let task = SequenceTask {
            vocab: config.vocab,
            seq_len: config.seq_len,
            seed: 2,
        };
        let mut trainer = GptTrainer::<Spilled>::new(&config, task, 8, &Default::default());
        Box::new(move || trainer.step())
    }
    vec![
        (
            "cnn",
            cnn as fn() -> Step,
            SpillConfig::cnn as fn() -> SpillConfig,
        ),
        ("tiny transformer", transformer, SpillConfig::transformer),
        ("resnet18", resnet18, SpillConfig::cnn),
        ("gpt", gpt, SpillConfig::transformer),
    ]
}

fn marked(step: &mut Step) -> Duration {
    let device = Default::default();
    let start = Instant::now();
    Spill::step_begin(&device);
    step();
    Spill::step_end(&device);
    start.elapsed()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

struct Measured {
    step_seconds: f64,
    bytes: u64,
    /// Evicted and restored in the last step.
    out_in: (u64, u64),
    stats: SpillStats,
}

/// Trains a fresh model under `config` and measures `rounds` marked steps after warm-up.
fn train(make: fn() -> Step, config: SpillConfig, rounds: usize) -> Measured {
    let device = Default::default();
    Spill::configure(&device, config).unwrap();
    let mut step = make();
    for _ in 0..WARM_UP_STEPS {
        marked(&mut step);
    }
    let times: Vec<f64> = (0..rounds)
        .map(|_| marked(&mut step).as_secs_f64())
        .collect();
    let stats = Spill::stats(&device);
    let out_in = stats.last_step.map_or((0, 0), |s| {
        (
            s.device_to_host.bytes + s.host_to_disk.bytes,
            s.host_to_device.bytes + s.disk_to_device.bytes,
        )
    });
    Measured {
        step_seconds: median(times),
        bytes: stats.last_step.map_or(0, |s| s.bytes_moved()),
        out_in,
        stats,
    }
}

fn plain_peak(make: fn() -> Step) -> u64 {
    let device = Default::default();
    Spill::configure(&device, SpillConfig::default()).unwrap();
    let mut step = make();
    for _ in 0..3 {
        step();
    }
    drop(step);
    Spill::stats(&device).peak.device
}

/// Marked steps recorded with a budget that never binds, as one tape of their median op
/// times, and their median step time.
fn record(make: fn() -> Step, config: SpillConfig, peak: u64) -> (StepTape, f64) {
    let device = Default::default();
    Spill::configure(&device, config.device_budget_bytes(peak.saturating_mul(10))).unwrap();
    let mut step = make();
    for _ in 0..WARM_UP_STEPS {
        marked(&mut step);
    }
    let (mut tapes, mut times) = (Vec::new(), Vec::new());
    for _ in 0..RECORDED_STEPS {
        times.push(marked(&mut step).as_secs_f64());
        let tape = Spill::fullest_recent_step(&device).expect("a recorded step");
        tapes.push((*tape).clone());
    }
    (median_tape(&tapes).expect("one program"), median(times))
}

/// Steps recorded for the tape: each op's time is its median over them.
const RECORDED_STEPS: usize = 5;

struct Row {
    model: &'static str,
    percent: u64,
    measured: f64,
    predicted: f64,
    measured_bytes: u64,
    predicted_bytes: u64,
    measured_out_in: (u64, u64),
    predicted_out_in: (u64, u64),
    over_budget_ops: u64,
}

fn rows(rounds: usize) -> (Vec<Row>, Vec<Planned>) {
    let mut rows = Vec::new();
    let mut tapes = Vec::new();
    for (name, make, preset) in models() {
        let peak = plain_peak(make);
        let (tape, recorded_step) = record(make, preset(), peak);
        let mut profile = None;
        for percent in BUDGETS_PERCENT {
            let config = preset().device_budget_bytes(peak * percent / 100);
            let measured = train(make, config.clone(), rounds);
            let profile = profile.get_or_insert_with(|| DeviceProfile::measured(&measured.stats));
            // Where the budget is below one op (the CNN's at 30%), the engine runs it over the
            // budget, and so does the prediction.
            let predicted = dry_run_over_budget(&tape, profile, &config).expect("a valid config");
            rows.push(Row {
                model: name,
                percent,
                measured: measured.step_seconds,
                predicted: predicted.simulated.step_seconds,
                measured_bytes: measured.bytes,
                predicted_bytes: predicted.simulated.traffic.total(),
                measured_out_in: measured.out_in,
                predicted_out_in: {
                    let t = predicted.simulated.traffic;
                    (
                        t.device_to_host + t.device_to_disk,
                        t.host_to_device + t.disk_to_device,
                    )
                },
                over_budget_ops: predicted.simulated.over_budget_ops,
            });
            if percent == 30 {
                tapes.push((name, tape.clone(), config, profile.clone()));
            }
        }
        eprintln!(
            "{name}: recorded step {:.2} ms, tape {} ops",
            recorded_step * 1e3,
            tape.ops.len()
        );
    }
    Spill::configure(&Default::default(), SpillConfig::default()).unwrap();
    (rows, tapes)
}

fn off_by(predicted: f64, measured: f64) -> String {
    if measured == 0.0 {
        return if predicted == 0.0 {
            "0%".into()
        } else {
            "n/a".into()
        };
    }
    format!("{:+.0}%", 100.0 * (predicted / measured - 1.0))
}

fn print_table(rows: &[Row]) {
    println!(
        "\n| model | budget | measured step | predicted step | off by | measured bytes/step | predicted bytes/step | off by | out / in measured | out / in predicted | ops over budget (predicted) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {}% | {:.2} ms | {:.2} ms | {} | {} | {} | {} | {} / {} | {} / {} | {} |",
            r.model,
            r.percent,
            r.measured * 1e3,
            r.predicted * 1e3,
            off_by(r.predicted, r.measured),
            bytes(r.measured_bytes),
            bytes(r.predicted_bytes),
            off_by(r.predicted_bytes as f64, r.measured_bytes as f64),
            bytes(r.measured_out_in.0),
            bytes(r.measured_out_in.1),
            bytes(r.predicted_out_in.0),
            bytes(r.predicted_out_in.1),
            r.over_budget_ops,
        );
    }
}

fn main() {
    let smoke = std::env::args().any(|a| a == "--test");
    let (rows, tapes) = rows(if smoke { 1 } else { 9 });
    let mut criterion = Criterion::default().configure_from_args();
    if smoke {
        criterion = criterion
            .sample_size(10)
            .measurement_time(Duration::from_millis(200));
    }
    for (name, tape, config, profile) in &tapes {
        criterion.bench_function(&format!("dry_run/{name}_30"), |b| {
            b.iter(|| dry_run_over_budget(tape, profile, config).unwrap())
        });
    }
    criterion.final_summary();
    print_table(&rows);
}
