//! Training the ResNet through burn-train's `Learner` (`SupervisedTraining::launch`), the way a
//! Burn user would, wired to the example's [`StepLog`]:
//! - the batcher runs on the training thread as each step begins, so it marks step starts;
//! - a metric sees every step's loss, synced to the CPU bit for bit, and logs it;
//! - the Learner's own terminal renderer is replaced by one that draws nothing, because the
//!   step log's progress bar already shows the loss, the step time and the resident bytes;
//! - the spilled run trains under burn-spill's strategy (`.with_spill_steps()`), which marks
//!   every step for the tape; the plain run under burn-train's own loop.

use std::sync::Arc;

use burn::backend::Flex;
use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{Adam, AdamConfig};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use burn::train::logger::InMemoryMetricLogger;
use burn::train::metric::{Adaptor, Metric, MetricMetadata, MetricName, SerializedEntry};
use burn::train::renderer::{
    EvaluationName, EvaluationProgress, MetricState, MetricsRenderer, MetricsRendererEvaluation,
    MetricsRendererTraining, ProgressType, TrainingProgress,
};
use burn::train::{
    ClassificationOutput, InferenceStep, Learner, LearningComponentsMarker, SupervisedTraining,
    TrainOutput, TrainStep,
};
use burn_spill::{SpillSteps, WithSpillSteps};

use super::resnet_model::{ResNet, ResNetConfig};
use super::step_log::StepLog;
use super::synthetic::ImageTask;
use super::trainers::{RESNET_LR, parameter_data};

#[derive(Clone, Debug)]
pub struct ImageBatch<B: Backend> {
    pub images: Tensor<B, 4>,
    pub labels: Tensor<B, 1, Int>,
}

/// Items are indices into the synthetic task; a batch is generated from them on demand.
#[derive(Clone)]
struct ImageBatcher {
    task: ImageTask,
    log: Option<StepLog>,
}

impl<B: Backend> Batcher<B, u64, ImageBatch<B>> for ImageBatcher {
    fn batch(&self, items: Vec<u64>, device: &B::Device) -> ImageBatch<B> {
        // The data loader has no worker threads, so this runs on the training thread right
        // before the step that consumes the batch.
        if let Some(log) = &self.log {
            log.begin_step();
        }
        let (images, labels) = self.task.batch::<B>(&items, device);
        ImageBatch { images, labels }
    }
}

impl<B: AutodiffBackend> TrainStep for ResNet<B> {
    type Input = ImageBatch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: ImageBatch<B>) -> TrainOutput<ClassificationOutput<B>> {
        let (logits, loss) = self.forward_loss(batch.images, batch.labels.clone());
        TrainOutput::new(
            self,
            loss.backward(),
            ClassificationOutput::new(loss, logits, batch.labels),
        )
    }
}

impl<B: Backend> InferenceStep for ResNet<B> {
    type Input = ImageBatch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: ImageBatch<B>) -> ClassificationOutput<B> {
        let (logits, loss) = self.forward_loss(batch.images, batch.labels.clone());
        ClassificationOutput::new(loss, logits, batch.labels)
    }
}

/// A step's loss exactly as computed. (burn-train's `LossInput` keeps its tensor private.)
pub struct ExactLoss(f32);

// The Learner syncs every step's output to a `ClassificationOutput<Flex>` (by a transaction
// that copies the bytes) before metrics see it, whatever backend trained.
impl Adaptor<ExactLoss> for ClassificationOutput<Flex> {
    fn adapt(&self) -> ExactLoss {
        let loss = self.loss.clone().into_data();
        ExactLoss(loss.iter::<f32>().next().expect("the loss has one element"))
    }
}

/// Hands each step's loss to the step log, in step order.
#[derive(Clone)]
struct LossToLog {
    log: StepLog,
    name: MetricName,
}

impl Metric for LossToLog {
    type Input = ExactLoss;

    fn name(&self) -> MetricName {
        self.name.clone()
    }

    fn update(&mut self, loss: &ExactLoss, _metadata: &MetricMetadata) -> SerializedEntry {
        self.log.record_loss(loss.0);
        SerializedEntry::new(format!("{:.4}", loss.0), loss.0.to_string())
    }

    fn clear(&mut self) {}
}

/// Draws nothing: see the module docs.
struct QuietRenderer;

impl MetricsRendererTraining for QuietRenderer {
    fn update_train(&mut self, _state: MetricState) {}
    fn update_valid(&mut self, _state: MetricState) {}
    fn render_train(&mut self, _item: TrainingProgress, _progress: Vec<ProgressType>) {}
    fn render_valid(&mut self, _item: TrainingProgress, _progress: Vec<ProgressType>) {}
}

impl MetricsRendererEvaluation for QuietRenderer {
    fn update_test(&mut self, _name: EvaluationName, _state: MetricState) {}
    fn render_test(&mut self, _item: EvaluationProgress, _progress: Vec<ProgressType>) {}
}

impl MetricsRenderer for QuietRenderer {
    fn manual_close(&mut self) {}
    fn register_metric(&mut self, _definition: burn::train::metric::MetricDefinition) {}
}

/// What the ResNet's `Learner` is made of: backend, learning rate, model, optimizer.
type ResNetComponents<A> =
    LearningComponentsMarker<A, f64, ResNet<A>, OptimizerAdaptor<Adam, ResNet<A>, A>>;

/// Trains the ResNet for one epoch of `steps` batches of `batch` images with Adam through
/// `SupervisedTraining::launch` under burn-train's own loop, and returns the final parameters.
pub fn train_resnet<A: AutodiffBackend>(
    config: &ResNetConfig,
    task: &ImageTask,
    batch: usize,
    steps: usize,
    device: &A::Device,
    log: &StepLog,
) -> Vec<TensorData> {
    let (training, learner, _dir) = resnet_training::<A>(config, task, batch, steps, device, log);
    parameter_data(&training.launch(learner).model)
}

/// [`train_resnet`] under burn-spill's strategy, which marks every step for the tape.
pub fn train_resnet_marked<A: AutodiffBackend + SpillSteps>(
    config: &ResNetConfig,
    task: &ImageTask,
    batch: usize,
    steps: usize,
    device: &A::Device,
    log: &StepLog,
) -> Vec<TensorData> {
    let (training, learner, _dir) = resnet_training::<A>(config, task, batch, steps, device, log);
    parameter_data(&training.with_spill_steps().launch(learner).model)
}

/// The seeded model, the data and the training set-up, ready to launch (with the directory
/// the Learner writes nothing to, which must outlive the run).
fn resnet_training<A: AutodiffBackend>(
    config: &ResNetConfig,
    task: &ImageTask,
    batch: usize,
    steps: usize,
    device: &A::Device,
    log: &StepLog,
) -> (
    SupervisedTraining<ResNetComponents<A>>,
    Learner<ResNetComponents<A>>,
    tempfile::TempDir,
) {
    // Seed before the model is built: initial weights draw from the backend's generator.
    A::seed(device, task.seed);
    let model = config.init::<A>(device);
    let train = DataLoaderBuilder::new(ImageBatcher {
        task: task.clone(),
        log: Some(log.clone()),
    })
    .batch_size(batch)
    .build(InMemDataset::new((0..(steps * batch) as u64).collect()));
    // No validation: an empty split keeps the epoch to the training steps being compared.
    let valid = DataLoaderBuilder::new(ImageBatcher {
        task: task.clone(),
        log: None,
    })
    .batch_size(batch)
    .build(InMemDataset::new(Vec::new()));
    // The Learner wants a directory for checkpoints and logs; nothing is written to it here
    // (no file checkpointer, in-memory metric log, no application logger).
    let dir = tempfile::tempdir().expect("a temporary directory for the Learner");
    let learner = Learner::new(model, AdamConfig::new().init(), RESNET_LR);
    let training = SupervisedTraining::new(dir.path(), train, valid)
        .num_epochs(1)
        .with_application_logger(None)
        .with_metric_logger(InMemoryMetricLogger::new())
        .renderer(QuietRenderer)
        .metric_train(LossToLog {
            log: log.clone(),
            name: Arc::new("exact loss".into()),
        });
    (training, learner, dir)
}
