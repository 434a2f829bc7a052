//! Hand-written training steps (forward, backward, Adam) for the two example models: the
//! transformer example's loop and the `budgets` benchmark drive these one step at a time. (The
//! resnet example trains through burn-train's `Learner` instead; see `learner.rs`.)

use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{Adam, AdamConfig, GradientsAccumulator, GradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Tensor, TensorData};

use super::gpt_model::{Gpt, GptConfig};
use super::resnet_model::{ResNet, ResNetConfig};
use super::synthetic::{ImageTask, SequenceTask};

/// Adam's learning rates: large enough that the loss visibly falls within a few dozen steps.
pub const GPT_LR: f64 = 3e-3;
pub const RESNET_LR: f64 = 1e-3;

/// A model that a [`Trainer`] can train: how it is built, what data it learns, its loss.
pub trait Trained<A: AutodiffBackend>: AutodiffModule<A> + Sized {
    type Config;
    type Task: Clone;
    const LEARNING_RATE: f64;
    fn build(config: &Self::Config, device: &A::Device) -> Self;
    /// The seed of the weights and the data.
    fn seed(task: &Self::Task) -> u64;
    /// The loss on the items `indices` of `task`.
    fn loss_on(&self, task: &Self::Task, indices: &[u64], device: &A::Device) -> Tensor<A, 1>;
}

impl<A: AutodiffBackend> Trained<A> for Gpt<A> {
    type Config = GptConfig;
    type Task = SequenceTask;
    const LEARNING_RATE: f64 = GPT_LR;
    fn build(config: &GptConfig, device: &A::Device) -> Self {
        config.init(device)
    }
    fn seed(task: &SequenceTask) -> u64 {
        task.seed
    }
    fn loss_on(&self, task: &SequenceTask, indices: &[u64], device: &A::Device) -> Tensor<A, 1> {
        self.loss(task.batch::<A>(indices, device))
    }
}

impl<A: AutodiffBackend> Trained<A> for ResNet<A> {
    type Config = ResNetConfig;
    type Task = ImageTask;
    const LEARNING_RATE: f64 = RESNET_LR;
    fn build(config: &ResNetConfig, device: &A::Device) -> Self {
        config.init(device)
    }
    fn seed(task: &ImageTask) -> u64 {
        task.seed
    }
    fn loss_on(&self, task: &ImageTask, indices: &[u64], device: &A::Device) -> Tensor<A, 1> {
        let (images, labels) = task.batch::<A>(indices, device);
        self.forward_loss(images, labels).1
    }
}

/// A model with its optimizer and data, trained one step at a time. The model is moved into
/// the optimizer and back each step, so it lives in an `Option`.
pub struct Trainer<A: AutodiffBackend, M: Trained<A>> {
    model: Option<M>,
    optim: OptimizerAdaptor<Adam, M, A>,
    task: M::Task,
    batch: usize,
    /// Batches whose gradients one optimizer step sums (1: no accumulation).
    micro_batches: usize,
    step: u64,
    device: A::Device,
}

/// The transformer example's trainer.
pub type GptTrainer<A> = Trainer<A, Gpt<A>>;

/// The ResNet trainer of the `budgets` benchmark.
pub type ResNetTrainer<A> = Trainer<A, ResNet<A>>;

impl<A: AutodiffBackend, M: Trained<A>> Trainer<A, M> {
    /// Seeds the backend (initial weights and dropout) before building the model, so that two
    /// trainers made with the same arguments on any two backends draw the same numbers.
    pub fn new(config: &M::Config, task: M::Task, batch: usize, device: &A::Device) -> Self {
        A::seed(device, M::seed(&task));
        Self {
            model: Some(M::build(config, device)),
            optim: AdamConfig::new().init(),
            task,
            batch,
            micro_batches: 1,
            step: 0,
            device: device.clone(),
        }
    }

    /// Sums the gradients of `micro_batches` batches (burn-optim's `GradientsAccumulator`)
    /// before each optimizer step.
    pub fn accumulating(mut self, micro_batches: usize) -> Self {
        self.micro_batches = micro_batches.max(1);
        self
    }

    /// One training step on the next batch (or the next `micro_batches` batches); returns the
    /// last batch's loss.
    pub fn step(&mut self) -> f32 {
        let model = self
            .model
            .take()
            .expect("the model is put back after every step");
        if self.micro_batches == 1 {
            let loss = model.loss_on(&self.task, &self.next_indices(), &self.device);
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            self.model = Some(self.optim.step(M::LEARNING_RATE, model, grads));
            self.step += 1;
            return loss.into_scalar().elem();
        }
        let mut accumulator = GradientsAccumulator::new();
        let mut last_loss = 0.0;
        for _ in 0..self.micro_batches {
            let loss = model.loss_on(&self.task, &self.next_indices(), &self.device);
            accumulator.accumulate(&model, GradientsParams::from_grads(loss.backward(), &model));
            self.step += 1;
            last_loss = loss.into_scalar().elem();
        }
        self.model = Some(
            self.optim
                .step(M::LEARNING_RATE, model, accumulator.grads()),
        );
        last_loss
    }

    /// Batch n trains on items n*batch .. (n+1)*batch: every batch is new data.
    fn next_indices(&self) -> Vec<u64> {
        let first = self.step * self.batch as u64;
        (first..first + self.batch as u64).collect()
    }

    pub fn parameters(&self) -> Vec<TensorData> {
        parameter_data(self.model.as_ref().expect("present between steps"))
    }
}

/// The data of every float parameter of a module, in visiting order: what `--verify` compares
/// bit for bit.
pub use super::small_models::parameter_data;
