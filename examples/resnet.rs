//! Train a ResNet on synthetic labelled images through burn-train's `Learner`, once on the plain
//! backend and once through `SpillBackend` under a device budget, and print what the budget
//! saved and cost.
//!
//! ```text
//! cargo run --release --example resnet
//! cargo run --release --example resnet -- --depth 50 --budget 30% --verify --report out/resnet.json
//! cargo run --release --example resnet -- --help
//! ```
//!
//! The changes from plain Burn training code are the backend type, `Autodiff<SpillBackend<B>>`
//! where the plain run has `Autodiff<B>` (see `common/experiment.rs`), and one line on the
//! `SupervisedTraining`, `.with_spill_steps()`, which marks every step for the tape (see
//! `common/learner.rs`).

mod common;

use clap::Parser;
use common::backends::run_on;
use common::cli::{self, SpillArgs};
use common::experiment::{Experiment, Workload, run_only_side};
use common::learner::{train_resnet, train_resnet_marked};
use common::report::{RunDescription, finish};
use common::resnet_model::{DEPTHS, ResNetConfig};
use common::step_log::StepLog;
use common::synthetic::ImageTask;

use burn::backend::Autodiff;
use burn::tensor::TensorData;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn_spill::{Preset, SpillBackend};

/// ResNet training, plain against spilled.
///
/// The defaults (ResNet-18 at a quarter of the paper's width on 32x32 images) finish in about a
/// minute on two CPU cores in release.
#[derive(Parser, Debug)]
#[command(version)]
struct Cli {
    /// ResNet depth: 18 and 34 use basic blocks, 50, 101 and 152 bottleneck blocks.
    #[arg(long, default_value_t = 18, value_parser = parse_depth)]
    depth: usize,

    /// Channels of the first stage (the paper uses 64; later stages double it).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    width: u16,

    /// Side of the square input images; up to 64 uses the CIFAR stem, above it the ImageNet one.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(4..))]
    image_size: u16,

    /// Number of classes of the synthetic images.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(2..))]
    classes: u16,

    /// Images per batch.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
    batch: u32,

    /// Training steps (batches) of the spilled run.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    steps: u32,

    /// Seed of the weights and the data.
    #[arg(long, default_value_t = 42)]
    seed: u64,

    #[command(flatten)]
    spill: SpillArgs,
}

fn parse_depth(value: &str) -> Result<usize, String> {
    value
        .parse()
        .ok()
        .filter(|d| DEPTHS.contains(d))
        .ok_or_else(|| format!("`{value}` is not a ResNet depth; accepted: 18, 34, 50, 101, 152"))
}

struct ResNetRun {
    config: ResNetConfig,
    task: ImageTask,
    batch: usize,
}

impl Workload for ResNetRun {
    fn preset(&self) -> Preset {
        Preset::Cnn
    }

    fn train<A: AutodiffBackend>(
        &self,
        device: &A::Device,
        steps: usize,
        log: &StepLog,
    ) -> Vec<TensorData> {
        train_resnet::<A>(&self.config, &self.task, self.batch, steps, device, log)
    }

    /// The spilled run trains under burn-spill's strategy for burn-train, which marks every
    /// step (`.with_spill_steps()` on the `SupervisedTraining`).
    fn train_spilled<B: Backend>(
        &self,
        device: &B::Device,
        steps: usize,
        log: &StepLog,
    ) -> Vec<TensorData> {
        type Spilled<B> = Autodiff<SpillBackend<B>>;
        train_resnet_marked::<Spilled<B>>(&self.config, &self.task, self.batch, steps, device, log)
    }

    fn marks_steps(&self) -> bool {
        true
    }
}

impl AsMut<SpillArgs> for Cli {
    fn as_mut(&mut self) -> &mut SpillArgs {
        &mut self.spill
    }
}

fn main() {
    let cli: Cli = cli::parse();
    let config = ResNetConfig {
        depth: cli.depth,
        width: cli.width.into(),
        image_size: cli.image_size.into(),
        classes: cli.classes.into(),
    };
    let run = ResNetRun {
        task: ImageTask {
            image_size: config.image_size,
            classes: config.classes,
            seed: cli.seed,
        },
        config,
        batch: cli.batch as usize,
    };
    let steps = cli.steps as usize;
    if run_only_side(&run, &cli.spill, steps) {
        return;
    }
    let outcome = run_on(
        cli.spill.backend,
        cli.spill.pool_pages,
        Experiment {
            workload: &run,
            args: &cli.spill,
            steps,
        },
    );
    let description = RunDescription {
        example: "resnet",
        title: format!(
            "ResNet-{} (width {}) on {}x{} synthetic images, {} classes",
            run.config.depth,
            run.config.width,
            run.config.image_size,
            run.config.image_size,
            run.config.classes
        ),
        model: run.config.clone(),
        batch: run.batch,
        steps,
    };
    std::process::exit(finish(&description, &cli.spill, &outcome));
}
