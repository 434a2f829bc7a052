//! Hand-written training steps (forward, backward, Adam) for the two example models: the
//! transformer example's loop and the `budgets` benchmark drive these one step at a time. (The
//! resnet example trains through burn-train's `Learner` instead; see `learner.rs`.)

use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{Adam, AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, TensorData};

use super::gpt_model::{Gpt, GptConfig};
use super::resnet_model::{ResNet, ResNetConfig};
use super::synthetic::{ImageTask, SequenceTask};

/// Adam's learning rates: large enough that the loss visibly falls within a few dozen steps.
pub const GPT_LR: f64 = 3e-3;
pub const RESNET_LR: f64 = 1e-3;

/// The model is moved into the optimizer and back each step, so it lives in an `Option`.
pub struct GptTrainer<A: AutodiffBackend> {
    model: Option<Gpt<A>>,
    optim: OptimizerAdaptor<Adam, Gpt<A>, A>,
    task: SequenceTask,
    batch: usize,
    step: u64,
    device: A::Device,
}

impl<A: AutodiffBackend> GptTrainer<A> {
    /// Seeds the backend (initial weights and dropout) before building the model, so that two
    /// trainers made with the same arguments on any two backends draw the same numbers.
    pub fn new(config: &GptConfig, task: SequenceTask, batch: usize, device: &A::Device) -> Self {
        A::seed(device, task.seed);
        Self {
            model: Some(config.init(device)),
            optim: AdamConfig::new().init(),
            task,
            batch,
            step: 0,
            device: device.clone(),
        }
    }

    /// One training step on the next batch; returns its loss.
    pub fn step(&mut self) -> f32 {
        let model = self
            .model
            .take()
            .expect("the model is put back after every step");
        let tokens = self.task.batch::<A>(&self.next_indices(), &self.device);
        let loss = model.loss(tokens);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        self.model = Some(self.optim.step(GPT_LR, model, grads));
        self.step += 1;
        loss.into_scalar().elem()
    }

    /// Step n trains on items n*batch .. (n+1)*batch: every batch is new data.
    fn next_indices(&self) -> Vec<u64> {
        let first = self.step * self.batch as u64;
        (first..first + self.batch as u64).collect()
    }

    pub fn parameters(&self) -> Vec<TensorData> {
        parameter_data(self.model.as_ref().expect("present between steps"))
    }
}

pub struct ResNetTrainer<A: AutodiffBackend> {
    model: Option<ResNet<A>>,
    optim: OptimizerAdaptor<Adam, ResNet<A>, A>,
    task: ImageTask,
    batch: usize,
    step: u64,
    device: A::Device,
}

impl<A: AutodiffBackend> ResNetTrainer<A> {
    pub fn new(config: &ResNetConfig, task: ImageTask, batch: usize, device: &A::Device) -> Self {
        A::seed(device, task.seed);
        Self {
            model: Some(config.init(device)),
            optim: AdamConfig::new().init(),
            task,
            batch,
            step: 0,
            device: device.clone(),
        }
    }

    pub fn step(&mut self) -> f32 {
        let model = self
            .model
            .take()
            .expect("the model is put back after every step");
        let (images, labels) = self.task.batch::<A>(&self.next_indices(), &self.device);
        let (_, loss) = model.forward_loss(images, labels);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        self.model = Some(self.optim.step(RESNET_LR, model, grads));
        self.step += 1;
        loss.into_scalar().elem()
    }

    fn next_indices(&self) -> Vec<u64> {
        let first = self.step * self.batch as u64;
        (first..first + self.batch as u64).collect()
    }
}

/// The data of every float parameter of a module, in visiting order: what `--verify` compares
/// bit for bit.
pub use super::small_models::parameter_data;
