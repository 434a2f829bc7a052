//! Train a GPT-style decoder on a synthetic sequence task with a hand-written loop, once on the
//! plain backend and once through `SpillBackend` under a device budget, and print what the
//! budget saved and cost. The sequences count up by a hidden stride, so the loss falls from
//! ln(vocab) as the model learns to read the stride off the previous tokens.
//!
//! ```text
//! cargo run --release --example transformer
//! cargo run --release --example transformer -- --layers 6 --budget 30% --verify --report out/gpt.json
//! ```
//!
//! The loop marks each step (`SpillBackend::step_begin`/`step_end`) when a report, a trace, a
//! tape or a plan is asked for, or when the run may drop victims (`--recompute recompute` or
//! `both`: marked steps drop from the first plan on, unmarked ones once the tape has found
//! their period), which is what a custom loop does in place of the `Learner`'s detected steps.

mod common;

use clap::Parser;
use common::backends::run_on;
use common::cli::{self, SpillArgs};
use common::experiment::{Experiment, Workload, run_only_side};
use common::gpt_model::GptConfig;
use common::report::{RunDescription, finish};
use common::step_log::StepLog;
use common::synthetic::SequenceTask;
use common::trainers::GptTrainer;

use burn::tensor::TensorData;
use burn::tensor::backend::AutodiffBackend;
use burn_spill::Preset;

/// GPT training, plain against spilled.
#[derive(Parser, Debug)]
#[command(version)]
struct Cli {
    /// Transformer blocks.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
    layers: u16,

    /// Width of the residual stream (the feed-forward layers are 4x this).
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u16).range(1..))]
    d_model: u16,

    /// Attention heads; must divide --d-model.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
    heads: u16,

    /// Tokens per sequence.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(3..))]
    seq_len: u16,

    /// Vocabulary size of the synthetic task.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(3..))]
    vocab: u16,

    /// Dropout probability (seeded, so plain and spilled drop the same units).
    #[arg(long, default_value_t = 0.1)]
    dropout: f64,

    /// Sequences per batch.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    batch: u32,

    /// Training steps of the spilled run.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..))]
    steps: u32,

    /// Seed of the weights, the dropout and the data.
    #[arg(long, default_value_t = 42)]
    seed: u64,

    #[command(flatten)]
    spill: SpillArgs,
}

struct GptRun {
    config: GptConfig,
    task: SequenceTask,
    batch: usize,
}

impl Workload for GptRun {
    fn preset(&self) -> Preset {
        Preset::Transformer
    }

    fn train<A: AutodiffBackend>(
        &self,
        device: &A::Device,
        steps: usize,
        log: &StepLog,
    ) -> Vec<TensorData> {
        let mut trainer = GptTrainer::<A>::new(&self.config, self.task.clone(), self.batch, device);
        for _ in 0..steps {
            log.begin_step();
            log.record_loss(trainer.step());
        }
        log.end_run();
        trainer.parameters()
    }
}

impl AsMut<SpillArgs> for Cli {
    fn as_mut(&mut self) -> &mut SpillArgs {
        &mut self.spill
    }
}

fn main() {
    let cli: Cli = cli::parse();
    if !cli.d_model.is_multiple_of(cli.heads) {
        cli::exit_usage(&format!(
            "--heads: {} does not divide --d-model {}; accepted: a divisor of --d-model",
            cli.heads, cli.d_model
        ));
    }
    if !(0.0..1.0).contains(&cli.dropout) {
        cli::exit_usage(&format!(
            "--dropout: `{}` is not a probability; accepted: 0 <= p < 1",
            cli.dropout
        ));
    }
    let config = GptConfig {
        vocab: cli.vocab.into(),
        seq_len: cli.seq_len.into(),
        d_model: cli.d_model.into(),
        heads: cli.heads.into(),
        layers: cli.layers.into(),
        dropout: cli.dropout,
    };
    let run = GptRun {
        task: SequenceTask {
            vocab: config.vocab,
            seq_len: config.seq_len,
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
    let c = &run.config;
    let description = RunDescription {
        example: "transformer",
        title: format!(
            "GPT decoder ({} layers, d_model {}, {} heads) on counting sequences of {} tokens, vocab {}",
            c.layers, c.d_model, c.heads, c.seq_len, c.vocab
        ),
        model: c.clone(),
        batch: run.batch,
        steps,
    };
    std::process::exit(finish(&description, &cli.spill, &outcome));
}
