//! Training-step time through `SpillBackend` at budgets of 100%, 75%, 50% and 30% of the plain
//! peak, against the plain backend, for the examples' ResNet-18 and GPT, measured in one run.
//! Prints a markdown table of the spilled / plain ratios at the end, then the composition
//! table (`budgets/composition.rs`): Burn's gradient checkpointing, burn-spill and both at the
//! same peak, gradient accumulation, and bf16 and f16 (each in a child process).
//!
//! ```text
//! cargo bench --bench budgets            # Flex, CPU-sized models, about two minutes
//! cargo bench --bench budgets -- --test  # smoke run, seconds
//! BURN_SPILL_BENCH_BACKEND=cuda BURN_SPILL_BENCH_SIZE=large \
//!     cargo bench --features cuda --bench budgets   # what scripts/gpu-bench.sh runs
//! ```
//!
//! How it measures:
//! - The plain peak is measured through `SpillBackend` with no budget (it only counts bytes),
//!   over two steps, so the second step holds Adam's state next to the activations.
//! - Each budget is applied to the same spilled trainer with the model's preset (the
//!   watermarks spill below the budget too, as they do for a user), after two warm-up steps.
//! - Criterion times steps of each side on its own (`<model>_step/plain`, `.../spill_50`).
//! - The summary's ratio is the median over rounds of alternating single steps (plain then
//!   spilled, then the other way round), so that drift on a shared machine hits both alike.

#[path = "../examples/common/mod.rs"]
mod common;
#[path = "budgets/composition.rs"]
mod composition;
#[cfg(feature = "collective")]
#[path = "budgets/data_parallel.rs"]
mod data_parallel;

use std::time::{Duration, Instant};

use burn::backend::Autodiff;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn_spill::{Preset, SpillBackend, SpillConfig};
use common::backends::{BackendKind, BackendTask, run_on};
use common::gpt_model::GptConfig;
use common::report::bytes;
use common::resnet_model::ResNetConfig;
use common::synthetic::{ImageTask, SequenceTask};
use common::trainers::{GptTrainer, ResNetTrainer, Trained, Trainer};
use composition::{CompositionRow, Rounds};
use criterion::Criterion;

/// The budgets, in percent of the plain peak, and whether restores are verified
/// (`SpillConfig::verify_restores`): its cost is the 30% row against the 30% verified row.
const BUDGETS: [(u64, bool); 5] = [
    (100, false),
    (75, false),
    (50, false),
    (30, false),
    (30, true),
];

/// One training step at a time, whatever the model.
trait Stepper {
    fn step(&mut self) -> f32;
}

impl<A: AutodiffBackend, M: Trained<A>> Stepper for Trainer<A, M> {
    fn step(&mut self) -> f32 {
        Trainer::step(self)
    }
}

/// A model at bench size and its data.
enum Model {
    ResNet(ResNetConfig, ImageTask, usize),
    Gpt(GptConfig, SequenceTask, usize),
}

impl Model {
    /// Both models at `size`: `small` fits a few seconds of CPU, `large` is for a GPU.
    fn suite(large: bool) -> Vec<(&'static str, Model)> {
        let (width, batch_images) = if large { (64, 128) } else { (8, 16) };
        let resnet = ResNetConfig {
            depth: 18,
            width,
            image_size: if large { 32 } else { 16 },
            classes: 10,
        };
        let images = ImageTask {
            image_size: resnet.image_size,
            classes: resnet.classes,
            seed: 1,
        };
        let gpt = if large {
            GptConfig {
                vocab: 256,
                seq_len: 256,
                d_model: 512,
                heads: 8,
                layers: 6,
                dropout: 0.1,
            }
        } else {
            GptConfig {
                vocab: 32,
                seq_len: 32,
                d_model: 64,
                heads: 4,
                layers: 2,
                dropout: 0.1,
            }
        };
        let sequences = SequenceTask {
            vocab: gpt.vocab,
            seq_len: gpt.seq_len,
            seed: 2,
        };
        vec![
            ("resnet18", Model::ResNet(resnet, images, batch_images)),
            (
                "gpt",
                Model::Gpt(gpt, sequences, if large { 16 } else { 8 }),
            ),
        ]
    }

    fn preset(&self) -> Preset {
        match self {
            Model::ResNet(..) => Preset::Cnn,
            Model::Gpt(..) => Preset::Transformer,
        }
    }

    fn trainer<A: AutodiffBackend>(&self, device: &A::Device) -> Box<dyn Stepper> {
        self.accumulating_trainer::<A>(device, 1)
    }

    /// [`data_parallel::PEERS`] peers training this model on one device through
    /// burn-collective, each on its share of the batch.
    #[cfg(feature = "collective")]
    fn data_parallel<A: AutodiffBackend>(&self, device: &A::Device) -> Box<dyn Stepper> {
        use common::gpt_model::Gpt;
        use common::resnet_model::ResNet;
        use data_parallel::{DataParallel, PEERS};
        match self {
            Model::ResNet(config, task, batch) => Box::new(DataParallel::new::<A, ResNet<A>>(
                config,
                task.clone(),
                (*batch / PEERS).max(1),
                device,
            )),
            Model::Gpt(config, task, batch) => Box::new(DataParallel::new::<A, Gpt<A>>(
                config,
                task.clone(),
                (*batch / PEERS).max(1),
                device,
            )),
        }
    }

    /// A trainer whose optimizer step sums the gradients of `micro_batches` batches.
    fn accumulating_trainer<A: AutodiffBackend>(
        &self,
        device: &A::Device,
        micro_batches: usize,
    ) -> Box<dyn Stepper> {
        match self {
            Model::ResNet(config, task, batch) => Box::new(
                ResNetTrainer::<A>::new(config, task.clone(), *batch, device)
                    .accumulating(micro_batches),
            ),
            Model::Gpt(config, task, batch) => Box::new(
                GptTrainer::<A>::new(config, task.clone(), *batch, device)
                    .accumulating(micro_batches),
            ),
        }
    }
}

/// One row of the summary.
struct Row {
    model: &'static str,
    percent: u64,
    verified: bool,
    budget: u64,
    plain_peak: u64,
    spilled_peak: u64,
    moved_per_step: u64,
    paired_ratio: f64,
    criterion_ratio: Option<f64>,
}

fn timed(stepper: &mut dyn Stepper) -> f64 {
    let start = Instant::now();
    stepper.step();
    start.elapsed().as_secs_f64()
}

/// Median spilled / plain ratio over `rounds` alternating single steps.
fn paired_ratio(plain: &mut dyn Stepper, spilled: &mut dyn Stepper, rounds: usize) -> f64 {
    let mut ratios: Vec<f64> = (0..rounds)
        .map(|round| {
            // Alternate who goes first: a cache warmed by one must not favour the other.
            let (p, s) = if round % 2 == 0 {
                let p = timed(plain);
                (p, timed(spilled))
            } else {
                let s = timed(spilled);
                (timed(plain), s)
            };
            s / p
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    ratios[rounds / 2]
}

/// Criterion's mean (ns) of one benchmark of this run.
fn mean_ns(id: &str) -> Option<f64> {
    let dir = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let path = format!("{dir}/criterion/{id}/new/estimates.json");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    json["mean"]["point_estimate"].as_f64()
}

struct Suite<'a> {
    criterion: &'a mut Criterion,
    large: bool,
    /// Paired rounds per budget (criterion's `--test` mode makes it a smoke run).
    rounds: usize,
    warmup: usize,
}

impl BackendTask for Suite<'_> {
    type Output = (Vec<Row>, Vec<CompositionRow>);

    fn run<B: Backend>(self, device: B::Device) -> Self::Output {
        let mut rows = Vec::new();
        let mut composed = Vec::new();
        for (name, model) in Model::suite(self.large) {
            let configure = |config: SpillConfig| {
                SpillBackend::<B>::configure(&device, config).expect("a valid bench config")
            };
            let mut plain = model.trainer::<Autodiff<B>>(&device);
            configure(SpillConfig::default());
            let mut spilled = model.trainer::<Autodiff<SpillBackend<B>>>(&device);
            for _ in 0..2 {
                plain.step();
                spilled.step();
            }
            let plain_peak = SpillBackend::<B>::stats(&device).peak.device;

            let group = format!("{name}_step");
            self.criterion
                .benchmark_group(&group)
                .bench_function("plain", |b| b.iter(|| plain.step()));
            for (percent, verified) in BUDGETS {
                let budget = plain_peak * percent / 100;
                configure(
                    SpillConfig::preset(model.preset())
                        .device_budget_bytes(budget)
                        .verify_restores(verified),
                );
                for _ in 0..self.warmup {
                    spilled.step();
                }
                let bench = format!("spill_{percent}{}", if verified { "_verified" } else { "" });
                self.criterion
                    .benchmark_group(&group)
                    .bench_function(&bench, |b| b.iter(|| spilled.step()));
                SpillBackend::<B>::reset_peaks(&device);
                let before = SpillBackend::<B>::stats(&device).device_to_host.bytes;
                let paired_ratio = paired_ratio(&mut *plain, &mut *spilled, self.rounds);
                let stats = SpillBackend::<B>::stats(&device);
                rows.push(Row {
                    model: name,
                    percent,
                    verified,
                    budget,
                    plain_peak,
                    spilled_peak: stats.peak.device,
                    moved_per_step: (stats.device_to_host.bytes - before) / self.rounds as u64,
                    paired_ratio,
                    criterion_ratio: mean_ns(&format!("{group}/{bench}"))
                        .zip(mean_ns(&format!("{group}/plain")))
                        .map(|(s, p)| s / p),
                });
            }
            drop(spilled);
            drop(plain);
            configure(SpillConfig::default());
            composed.extend(composition::rows::<B>(&device, name, &model, self.rounds()));
        }
        (rows, composed)
    }
}

impl Suite<'_> {
    fn rounds(&self) -> Rounds {
        Rounds {
            paired: self.rounds,
            warmup: self.warmup,
        }
    }
}

/// The composition rows in one half-precision dtype: what a child process measures.
struct DtypeSuite {
    dtype: burn::tensor::FloatDType,
    large: bool,
    rounds: Rounds,
}

impl BackendTask for DtypeSuite {
    type Output = Vec<CompositionRow>;

    fn run<B: Backend>(self, device: B::Device) -> Vec<CompositionRow> {
        // Before any tensor of this process: the device's default dtype is fixed at first use.
        if let Err(e) = burn::tensor::backend::set_default_float_dtype::<B>(&device, self.dtype) {
            eprintln!("error: {:?} on this backend: {e:?}", self.dtype);
            std::process::exit(1);
        }
        Model::suite(self.large)
            .iter()
            .flat_map(|(name, model)| {
                composition::dtype_rows::<B>(&device, name, model, self.dtype, self.rounds)
            })
            .collect()
    }
}

fn main() {
    let test_mode = std::env::args().any(|a| a == "--test");
    let backend = std::env::var("BURN_SPILL_BENCH_BACKEND")
        .unwrap_or_else(|_| BackendKind::DEFAULT_NAME.into());
    let backend = BackendKind::parse(&backend).unwrap_or_else(|e| {
        eprintln!("error: BURN_SPILL_BENCH_BACKEND: {e}");
        std::process::exit(2)
    });
    let large = match std::env::var("BURN_SPILL_BENCH_SIZE").as_deref() {
        Ok("large") => true,
        Ok("small") | Err(_) => false,
        Ok(other) => {
            eprintln!(
                "error: BURN_SPILL_BENCH_SIZE: `{other}` is not a size; accepted: small, large"
            );
            std::process::exit(2)
        }
    };
    let rounds = Rounds {
        paired: if test_mode { 1 } else { 21 },
        warmup: if test_mode { 0 } else { 2 },
    };
    if let Ok(dtype) = std::env::var(composition::DTYPE_VAR) {
        let dtype = composition::parse_dtype(&dtype).unwrap_or_else(|e| {
            eprintln!("error: {}: {e}", composition::DTYPE_VAR);
            std::process::exit(2)
        });
        let rows = run_on(
            backend,
            None,
            DtypeSuite {
                dtype,
                large,
                rounds,
            },
        );
        composition::print_for_parent(&rows);
        return;
    }
    let mut criterion = Criterion::default()
        .configure_from_args()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    let (rows, mut composed) = run_on(
        backend,
        None,
        Suite {
            criterion: &mut criterion,
            large,
            rounds: rounds.paired,
            warmup: rounds.warmup,
        },
    );
    for dtype in ["bf16", "f16"] {
        composed.extend(composition::rows_of_child(dtype));
    }
    criterion.final_summary();

    println!(
        "\nStep time, spilled / plain, on {backend} ({} models)\n",
        if large { "large" } else { "small" }
    );
    println!(
        "| model | budget | budget bytes | plain peak | spilled peak | device->host per step | paired ratio | criterion ratio |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {}%{} | {} | {} | {} | {} | {:.3} | {} |",
            r.model,
            r.percent,
            if r.verified { " verified" } else { "" },
            bytes(r.budget),
            bytes(r.plain_peak),
            bytes(r.spilled_peak),
            bytes(r.moved_per_step),
            r.paired_ratio,
            r.criterion_ratio.map_or("-".into(), |x| format!("{x:.3}")),
        );
    }
    composition::print_table(&composed);
}
