//! Real training through `Autodiff<SpillBackend<Flex>>` against `Autodiff<Flex>`: a custom loop
//! and burn-train's `Learner`, for a small CNN and a small Transformer, bit for bit.

#[path = "../examples/common/small_models.rs"]
mod small_models;

use std::sync::Arc;

use burn::backend::{Autodiff, Flex};
use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::AdamConfig;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use burn::train::{
    ClassificationOutput, InferenceStep, Learner, LearningComponentsTypes, SupervisedTraining,
    TrainOutput, TrainStep,
};
use burn_spill::{SpillBackend, SpillConfig, WithSpillSteps};
use small_models::*;

type Plain = Autodiff<Flex>;

/// Flex's random generator is process-global: tests that seed it and then initialise a model
/// must not interleave, or the draws of one test land in the other.
static RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn rng_lock() -> std::sync::MutexGuard<'static, ()> {
    RNG.lock().unwrap_or_else(|e| e.into_inner())
}
type Spilled = Autodiff<SpillBackend<Flex>>;

fn assert_runs_identical(plain: &TrainRun, spilled: &TrainRun) {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&plain.losses),
        bits(&spilled.losses),
        "losses differ: {:?} vs {:?}",
        plain.losses,
        spilled.losses
    );
    assert_params_identical(&plain.parameters, &spilled.parameters);
}

fn assert_params_identical(plain: &[TensorData], spilled: &[TensorData]) {
    assert_eq!(plain.len(), spilled.len(), "number of parameters differs");
    for (i, (p, s)) in plain.iter().zip(spilled).enumerate() {
        assert_eq!(
            (p.dtype, &p.shape),
            (s.dtype, &s.shape),
            "parameter {i}: dtype or shape differs"
        );
        assert!(
            p.as_bytes() == s.as_bytes(),
            "parameter {i} {:?}: values differ",
            p.shape
        );
    }
}

#[test]
fn cnn_custom_loop_is_bit_identical() {
    let _rng = rng_lock();
    let device = Default::default();
    let plain = train_cnn::<Plain>(&device, 5, 8);
    let spilled = train_cnn::<Spilled>(&device, 5, 8);
    assert!(
        plain.losses[4] < plain.losses[0],
        "the CNN should learn: {:?}",
        plain.losses
    );
    assert_runs_identical(&plain, &spilled);
}

#[test]
fn transformer_custom_loop_is_bit_identical() {
    let _rng = rng_lock();
    let device = Default::default();
    let plain = train_gpt::<Plain>(&device, 5, 4);
    let spilled = train_gpt::<Spilled>(&device, 5, 4);
    assert_runs_identical(&plain, &spilled);
}

// ---- burn-train's Learner ------------------------------------------------------------------

#[derive(Clone, Debug)]
/// One dataset item: the seed its synthetic batch is generated from.
struct SeedItem {
    seed: usize,
}

#[derive(Clone, Debug)]
pub struct CnnBatch<B: Backend> {
    pub images: Tensor<B, 4>,
    pub labels: Tensor<B, 1, Int>,
}

#[derive(Clone, Default)]
struct CnnBatcher;

impl<B: Backend> Batcher<B, SeedItem, CnnBatch<B>> for CnnBatcher {
    fn batch(&self, items: Vec<SeedItem>, device: &B::Device) -> CnnBatch<B> {
        let (images, labels) = cnn_batch::<B>(items.len(), items[0].seed, device);
        CnnBatch { images, labels }
    }
}

impl<B: AutodiffBackend> TrainStep for SmallCnn<B> {
    type Input = CnnBatch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: CnnBatch<B>) -> TrainOutput<ClassificationOutput<B>> {
        let output = self.forward(batch.images.clone());
        let loss = self.loss(batch.images, batch.labels.clone());
        TrainOutput::new(
            self,
            loss.backward(),
            ClassificationOutput::new(loss, output, batch.labels),
        )
    }
}

impl<B: Backend> InferenceStep for SmallCnn<B> {
    type Input = CnnBatch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: CnnBatch<B>) -> ClassificationOutput<B> {
        let output = self.forward(batch.images.clone());
        let loss = self.loss(batch.images, batch.labels.clone());
        ClassificationOutput::new(loss, output, batch.labels)
    }
}

/// One epoch of five batches through `SupervisedTraining::launch`; returns the final parameters.
fn cnn_learner_run<B: Strategy>(dir: &std::path::Path) -> Vec<TensorData> {
    cnn_learner::<B>(dir, LearnerRun::epoch_of(20), false)
}

/// How a `Learner` run is set up: the training items (batches of 4), epochs, accumulation.
#[derive(Clone, Copy, Debug)]
struct LearnerRun {
    items: usize,
    epochs: usize,
    accumulation: Option<usize>,
}

impl LearnerRun {
    fn epoch_of(items: usize) -> Self {
        Self {
            items,
            epochs: 1,
            accumulation: None,
        }
    }
}

/// A backend the tests train on, and how its `SupervisedTraining` is set up.
trait Strategy: AutodiffBackend {
    /// Installs burn-spill's marked strategy when `marked` (plain Flex has none to install).
    fn install<LC>(training: SupervisedTraining<LC>, marked: bool) -> SupervisedTraining<LC>
    where
        LC: LearningComponentsTypes<Backend = Self> + 'static;
}

impl Strategy for Plain {
    fn install<LC>(training: SupervisedTraining<LC>, _marked: bool) -> SupervisedTraining<LC>
    where
        LC: LearningComponentsTypes<Backend = Self> + 'static,
    {
        training
    }
}

impl Strategy for Spilled {
    fn install<LC>(training: SupervisedTraining<LC>, marked: bool) -> SupervisedTraining<LC>
    where
        LC: LearningComponentsTypes<Backend = Self> + 'static,
    {
        if marked {
            training.with_spill_steps()
        } else {
            training
        }
    }
}

/// Trains the CNN through `SupervisedTraining::launch` (validating on 4 items after each
/// epoch); returns the final parameters.
fn cnn_learner<B: Strategy>(
    dir: &std::path::Path,
    run: LearnerRun,
    marked: bool,
) -> Vec<TensorData> {
    let device = B::Device::default();
    B::seed(&device, 3);
    let items: Vec<_> = (0..run.items).map(|seed| SeedItem { seed }).collect();
    let train = DataLoaderBuilder::new(CnnBatcher)
        .batch_size(4)
        .build(InMemDataset::new(items.clone()));
    let valid = DataLoaderBuilder::new(CnnBatcher)
        .batch_size(4)
        .build(InMemDataset::new(items[..4].to_vec()));
    let model = SmallCnn::<B>::new(&device);
    let learner = Learner::new(model, AdamConfig::new().init(), 1e-2);
    let mut training = SupervisedTraining::new(dir, Arc::clone(&train), valid)
        .num_epochs(run.epochs)
        .with_application_logger(None);
    if let Some(n) = run.accumulation {
        training = training.grads_accumulation(n);
    }
    let result = B::install(training, marked).launch(learner);
    parameter_data(&result.model)
}

#[derive(Clone, Default)]
struct GptBatcher;

#[derive(Clone, Debug)]
pub struct GptBatch<B: Backend> {
    pub tokens: Tensor<B, 2, Int>,
}

impl<B: Backend> Batcher<B, SeedItem, GptBatch<B>> for GptBatcher {
    fn batch(&self, items: Vec<SeedItem>, device: &B::Device) -> GptBatch<B> {
        GptBatch {
            tokens: gpt_batch::<B>(items.len(), items[0].seed, device),
        }
    }
}

fn gpt_output<B: Backend>(model: &TinyGpt<B>, batch: GptBatch<B>) -> ClassificationOutput<B> {
    let (logits, targets) = model.next_token_logits(batch.tokens);
    let loss = CrossEntropyLossConfig::new()
        .init(&logits.device())
        .forward(logits.clone(), targets.clone());
    ClassificationOutput::new(loss, logits, targets)
}

impl<B: AutodiffBackend> TrainStep for TinyGpt<B> {
    type Input = GptBatch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: GptBatch<B>) -> TrainOutput<ClassificationOutput<B>> {
        let output = gpt_output(self, batch);
        TrainOutput::new(self, output.loss.backward(), output)
    }
}

impl<B: Backend> InferenceStep for TinyGpt<B> {
    type Input = GptBatch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: GptBatch<B>) -> ClassificationOutput<B> {
        gpt_output(self, batch)
    }
}

/// The Transformer through `SupervisedTraining::launch`: one epoch of five batches.
fn gpt_learner_run<B: AutodiffBackend>(dir: &std::path::Path) -> Vec<TensorData> {
    let device = B::Device::default();
    B::seed(&device, 4);
    let items: Vec<_> = (0..20).map(|seed| SeedItem { seed }).collect();
    let train = DataLoaderBuilder::new(GptBatcher)
        .batch_size(4)
        .build(InMemDataset::new(items.clone()));
    let valid = DataLoaderBuilder::new(GptBatcher)
        .batch_size(4)
        .build(InMemDataset::new(items[..4].to_vec()));
    let learner = Learner::new(TinyGpt::<B>::new(&device), AdamConfig::new().init(), 3e-3);
    let result = SupervisedTraining::new(dir, train, valid)
        .num_epochs(1)
        .launch(learner);
    parameter_data(&result.model)
}

#[test]
fn transformer_learner_run_is_bit_identical() {
    let _rng = rng_lock();
    let dir = tempfile::tempdir().unwrap();
    let plain = gpt_learner_run::<Plain>(&dir.path().join("plain"));
    let spilled = gpt_learner_run::<Spilled>(&dir.path().join("spilled"));
    assert_params_identical(&plain, &spilled);
}

#[test]
fn cnn_learner_run_is_bit_identical() {
    let _rng = rng_lock();
    let dir = tempfile::tempdir().unwrap();
    let plain = cnn_learner_run::<Plain>(&dir.path().join("plain"));
    let spilled = cnn_learner_run::<Spilled>(&dir.path().join("spilled"));
    assert_params_identical(&plain, &spilled);

    // The Learner really trained: the parameters moved away from their seeded initial values.
    let device = Default::default();
    <Plain as Backend>::seed(&device, 3);
    let initial = parameter_data(&SmallCnn::<Plain>::new(&device));
    assert_eq!(initial.len(), plain.len());
    assert!(
        initial
            .iter()
            .zip(&plain)
            .any(|(i, p)| i.as_bytes() != p.as_bytes()),
        "the Learner did not train"
    );
}

/// A `Learner` user writes no step markers: the tape finds the training step in the op stream
/// (the period of forward, backward and optimizer ops) and cuts the steps itself.
#[test]
fn learner_steps_are_found_without_markers() {
    let _rng = rng_lock(); // every test of this binary that runs ops on the device holds it
    let device = Default::default();
    SpillBackend::<Flex>::record_tape(&device, true);
    let dir = tempfile::tempdir().unwrap();
    let _ = cnn_learner::<Spilled>(dir.path(), LearnerRun::epoch_of(48), false);
    let counters = SpillBackend::<Flex>::tape_counters(&device);
    let tape = SpillBackend::<Flex>::last_step(&device);
    SpillBackend::<Flex>::record_tape(&device, false);
    let tape = tape.expect("the op stream was cut into steps");
    assert!(!tape.marked);
    assert!(counters.steps >= 2, "{counters:?}");
    // The last step cut during training is one whole step, though it may start anywhere in
    // the loop (the cut falls where the period was confirmed): it makes one batch, runs the
    // convolutions forward and backward, and Adam's update (the square root of its second
    // moment). (After training the validation ops diverge from the period, which is why the
    // counters may show no period any more.)
    assert_one_training_step(&tape);
}

/// The tape holds one whole training step of the CNN: it makes one batch, runs the
/// convolutions forward and backward, and Adam's update (the square root of its second
/// moment), and no validation forward.
fn assert_one_training_step(tape: &burn_spill::tape::StepTape) {
    let names: Vec<&str> = tape.ops.iter().map(|o| o.name.as_str()).collect();
    let count = |op: &str| names.iter().filter(|n| **n == op).count();
    assert_eq!(count("int_from_data"), 1, "one batch per step: {names:?}");
    assert!(count("conv2d") > 0);
    // This TrainStep runs the forward twice (once for the output, once inside the loss), and
    // backward once, through the loss.
    assert_eq!(
        count("conv2d"),
        2 * count("conv2d_weight_backward"),
        "{names:?}"
    );
    assert!(count("float_sqrt") > 0, "Adam's update is in the step");
}

/// burn-spill's strategy marks every step of a `Learner` run exactly: two epochs of five
/// batches are ten steps, each one whole training step (batch, forward, backward, Adam), the
/// last one closed, and validation in none of them. On an unconfigured device nothing moves,
/// and the model trains exactly as under burn-train's own loop.
#[test]
fn learner_with_spill_steps_marks_every_step() {
    let _rng = rng_lock();
    let device = Default::default();
    let dir = tempfile::tempdir().unwrap();
    let run = LearnerRun {
        epochs: 2,
        ..LearnerRun::epoch_of(20)
    };
    let plain = cnn_learner::<Plain>(&dir.path().join("plain"), run, true);
    let before = SpillBackend::<Flex>::tape_counters(&device);
    let moved_before = SpillBackend::<Flex>::stats(&device).device_to_host.count;
    let spilled = cnn_learner::<Spilled>(&dir.path().join("spilled"), run, true);
    let after = SpillBackend::<Flex>::tape_counters(&device);
    let tape = SpillBackend::<Flex>::last_step(&device).expect("a marked step was recorded");
    SpillBackend::<Flex>::record_tape(&device, false);
    assert_params_identical(&plain, &spilled);
    assert_eq!(after.steps - before.steps, 10, "{before:?} then {after:?}");
    assert_eq!(
        SpillBackend::<Flex>::stats(&device).device_to_host.count,
        moved_before,
        "an unconfigured device moves nothing"
    );
    assert!(tape.marked);
    assert_one_training_step(&tape);
}

/// With burn-train's gradient accumulation (4 batches per optimizer step) under a budget of
/// 30% of the peak, the marked strategy trains bit-identically to plain Flex under burn-train's
/// own loop, a step being the four batches of one optimizer step.
#[test]
fn learner_with_spill_steps_and_accumulation_is_bit_identical_at_30_percent() {
    let _rng = rng_lock();
    let device = Default::default();
    let dir = tempfile::tempdir().unwrap();
    let run = LearnerRun {
        items: 32,
        epochs: 2,
        accumulation: Some(4),
    };
    let plain = cnn_learner::<Plain>(&dir.path().join("plain"), run, true);
    SpillBackend::<Flex>::configure(&device, SpillConfig::default()).unwrap();
    SpillBackend::<Flex>::reset_peaks(&device);
    let unlimited = cnn_learner::<Spilled>(&dir.path().join("unlimited"), run, true);
    assert_params_identical(&plain, &unlimited);
    let budget = SpillBackend::<Flex>::stats(&device).peak.device * 3 / 10;

    let _unconfigure = Unconfigure;
    SpillBackend::<Flex>::configure(&device, SpillConfig::default().device_budget_bytes(budget))
        .unwrap();
    let before = SpillBackend::<Flex>::stats(&device);
    let steps_before = SpillBackend::<Flex>::tape_counters(&device).steps;
    let spilled = cnn_learner::<Spilled>(&dir.path().join("spilled"), run, true);
    let after = SpillBackend::<Flex>::stats(&device);
    let steps = SpillBackend::<Flex>::tape_counters(&device).steps - steps_before;
    SpillBackend::<Flex>::record_tape(&device, false);
    assert_params_identical(&plain, &spilled);
    assert!(
        after.device_to_host.bytes > before.device_to_host.bytes,
        "the budget of {budget} B made it spill"
    );
    // 8 batches an epoch, 4 per optimizer step.
    assert_eq!(steps, 4);
}

/// Puts the device back to unlimited when a test that configured it ends, passed or failed.
struct Unconfigure;

impl Drop for Unconfigure {
    fn drop(&mut self) {
        let device = Default::default();
        SpillBackend::<Flex>::configure(&device, SpillConfig::default()).unwrap();
    }
}
