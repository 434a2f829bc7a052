//! Two small models and their synthetic data, generic over the backend, shared by the main
//! example and the tests: a CNN (conv, batch norm, pools, linear) and a GPT-style Transformer
//! encoder with a causal mask. Both train the same way on `B` and on `SpillBackend<B>`, which
//! is what the differential tests compare.
#![allow(dead_code)]

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::attention::generate_autoregressive_mask;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::pool::{AdaptiveAvgPool2d, AdaptiveAvgPool2dConfig, MaxPool2d, MaxPool2dConfig};
use burn::nn::transformer::{
    TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput,
};
use burn::nn::{
    BatchNorm, BatchNormConfig, Embedding, EmbeddingConfig, Linear, LinearConfig, PaddingConfig2d,
    Relu,
};
use burn::optim::{AdamConfig, GradientsAccumulator, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};

/// Image size and classes of the synthetic CNN task.
pub const IMAGE: usize = 16;
pub const CLASSES: usize = 4;

#[derive(Module, Debug)]
pub struct SmallCnn<B: Backend> {
    conv1: Conv2d<B>,
    norm1: BatchNorm<B>,
    pool: MaxPool2d,
    conv2: Conv2d<B>,
    norm2: BatchNorm<B>,
    gap: AdaptiveAvgPool2d,
    head: Linear<B>,
    relu: Relu,
}

impl<B: Backend> SmallCnn<B> {
    pub fn new(device: &B::Device) -> Self {
        Self {
            conv1: Conv2dConfig::new([3, 8], [3, 3])
                .with_padding(PaddingConfig2d::Same)
                .init(device),
            norm1: BatchNormConfig::new(8).init(device),
            pool: MaxPool2dConfig::new([2, 2]).with_strides([2, 2]).init(),
            conv2: Conv2dConfig::new([8, 16], [3, 3])
                .with_padding(PaddingConfig2d::Same)
                .init(device),
            norm2: BatchNormConfig::new(16).init(device),
            gap: AdaptiveAvgPool2dConfig::new([1, 1]).init(),
            head: LinearConfig::new(16, CLASSES).init(device),
            relu: Relu::new(),
        }
    }

    /// Logits `[batch, CLASSES]` for images `[batch, 3, IMAGE, IMAGE]`.
    pub fn forward(&self, images: Tensor<B, 4>) -> Tensor<B, 2> {
        let x = self
            .relu
            .forward(self.norm1.forward(self.conv1.forward(images)));
        let x = self.pool.forward(x);
        let skip = x.clone();
        let x = self.relu.forward(self.norm2.forward(self.conv2.forward(x)));
        // A residual-style add of the pooled input, repeated to 16 channels.
        let x = x + skip.repeat_dim(1, 2);
        let x = self.gap.forward(x);
        self.head.forward(x.flatten(1, 3))
    }

    /// Mean cross-entropy of the logits against `labels`.
    pub fn loss(&self, images: Tensor<B, 4>, labels: Tensor<B, 1, Int>) -> Tensor<B, 1> {
        let logits = self.forward(images);
        CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits, labels)
    }
}

/// A deterministic, learnable batch: the label is the brightest of four image quadrants.
pub fn cnn_batch<B: Backend>(
    batch: usize,
    seed: usize,
    device: &B::Device,
) -> (Tensor<B, 4>, Tensor<B, 1, Int>) {
    let mut pixels = Vec::with_capacity(batch * 3 * IMAGE * IMAGE);
    let mut labels = Vec::with_capacity(batch);
    for b in 0..batch {
        let label = (b * 7 + seed * 3) % CLASSES;
        labels.push(label as i64);
        for c in 0..3 {
            for y in 0..IMAGE {
                for x in 0..IMAGE {
                    let quadrant = (y >= IMAGE / 2) as usize * 2 + (x >= IMAGE / 2) as usize;
                    let noise = ((b * 31 + c * 17 + y * 13 + x * 7 + seed * 5) % 23) as f32 / 23.0;
                    let bright = if quadrant == label { 1.0 } else { 0.0 };
                    pixels.push(bright + 0.5 * noise - 0.25);
                }
            }
        }
    }
    let images = Tensor::from_data(TensorData::new(pixels, [batch, 3, IMAGE, IMAGE]), device);
    let labels = Tensor::from_data(TensorData::new(labels, [batch]), device);
    (images, labels)
}

/// Sizes of the small Transformer.
pub const VOCAB: usize = 16;
pub const SEQ: usize = 12;

#[derive(Module, Debug)]
pub struct TinyGpt<B: Backend> {
    tokens: Embedding<B>,
    positions: Embedding<B>,
    encoder: TransformerEncoder<B>,
    head: Linear<B>,
}

impl<B: Backend> TinyGpt<B> {
    pub fn new(device: &B::Device) -> Self {
        let d_model = 32;
        Self {
            tokens: EmbeddingConfig::new(VOCAB, d_model).init(device),
            positions: EmbeddingConfig::new(SEQ, d_model).init(device),
            encoder: TransformerEncoderConfig::new(d_model, 64, 4, 2)
                .with_dropout(0.1)
                .with_norm_first(true)
                .init(device),
            head: LinearConfig::new(d_model, VOCAB).init(device),
        }
    }

    /// Next-token logits `[batch, seq, VOCAB]` for tokens `[batch, seq]`.
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [batch, seq] = tokens.dims();
        let device = tokens.device();
        let positions = Tensor::<B, 1, Int>::arange(0..seq as i64, &device)
            .reshape([1, seq])
            .repeat_dim(0, batch);
        let x = self.tokens.forward(tokens) + self.positions.forward(positions);
        let mask = generate_autoregressive_mask::<B>(batch, seq, &device);
        let x = self
            .encoder
            .forward(TransformerEncoderInput::new(x).mask_attn(mask));
        self.head.forward(x)
    }

    /// Logits `[batch * (seq - 1), VOCAB]` for predicting token t+1 from tokens up to t, and
    /// the matching targets.
    pub fn next_token_logits(
        &self,
        tokens: Tensor<B, 2, Int>,
    ) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
        let [batch, seq] = tokens.dims();
        let inputs = tokens.clone().slice([0..batch, 0..seq - 1]);
        let targets = tokens
            .slice([0..batch, 1..seq])
            .reshape([batch * (seq - 1)]);
        let logits = self.forward(inputs).reshape([batch * (seq - 1), VOCAB]);
        (logits, targets)
    }

    /// Mean cross-entropy of the next-token predictions.
    pub fn loss(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 1> {
        let (logits, targets) = self.next_token_logits(tokens);
        CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits, targets)
    }
}

/// Sequences that count up by a per-row stride modulo `VOCAB`: learnable from the context.
pub fn gpt_batch<B: Backend>(batch: usize, seed: usize, device: &B::Device) -> Tensor<B, 2, Int> {
    let mut tokens = Vec::with_capacity(batch * SEQ);
    for b in 0..batch {
        let start = (b * 5 + seed * 3) % VOCAB;
        let stride = 1 + (b + seed) % 3;
        for t in 0..SEQ {
            tokens.push(((start + t * stride) % VOCAB) as i64);
        }
    }
    Tensor::from_data(TensorData::new(tokens, [batch, SEQ]), device)
}

/// The data of every float parameter of a module, in visiting order.
pub fn parameter_data<B: Backend, M: Module<B>>(module: &M) -> Vec<TensorData> {
    struct Collect(Vec<TensorData>);
    impl<B: Backend> ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.push(param.val().into_data());
        }
    }
    let mut collect = Collect(Vec::new());
    module.visit(&mut collect);
    collect.0
}

/// What a training run produced: the loss of each step and the final parameters.
pub struct TrainRun {
    pub losses: Vec<f32>,
    pub parameters: Vec<TensorData>,
}

/// Trains the CNN for `steps` Adam steps with a plain loop.
pub fn train_cnn<B: AutodiffBackend>(device: &B::Device, steps: usize, batch: usize) -> TrainRun {
    train_cnn_observed::<B>(device, steps, batch, |_| {})
}

/// [`train_cnn`], calling `after_step(step)` after each optimizer step.
pub fn train_cnn_observed<B: AutodiffBackend>(
    device: &B::Device,
    steps: usize,
    batch: usize,
    mut after_step: impl FnMut(usize),
) -> TrainRun {
    B::seed(device, 7);
    let mut model = SmallCnn::<B>::new(device);
    let mut optim = AdamConfig::new().init();
    let mut losses = Vec::with_capacity(steps);
    for step in 0..steps {
        let (images, labels) = cnn_batch::<B>(batch, step, device);
        let loss = model.loss(images, labels);
        losses.push(loss.clone().into_scalar().elem());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-2, model, grads);
        after_step(step);
    }
    TrainRun {
        losses,
        parameters: parameter_data(&model),
    }
}

/// [`train_cnn_observed`] with `micro_batches` batches per optimizer step, their gradients
/// summed by burn-optim's `GradientsAccumulator` (the losses of every micro-batch are kept).
pub fn train_cnn_accumulating<B: AutodiffBackend>(
    device: &B::Device,
    steps: usize,
    batch: usize,
    micro_batches: usize,
    mut after_step: impl FnMut(usize),
) -> TrainRun {
    B::seed(device, 7);
    let mut model = SmallCnn::<B>::new(device);
    let mut optim = AdamConfig::new().init();
    let mut losses = Vec::with_capacity(steps * micro_batches);
    for step in 0..steps {
        let mut accumulator = GradientsAccumulator::new();
        for micro in 0..micro_batches {
            let (images, labels) = cnn_batch::<B>(batch, step * micro_batches + micro, device);
            let loss = model.loss(images, labels);
            losses.push(loss.clone().into_scalar().elem());
            accumulator.accumulate(&model, GradientsParams::from_grads(loss.backward(), &model));
        }
        model = optim.step(1e-2, model, accumulator.grads());
        after_step(step);
    }
    TrainRun {
        losses,
        parameters: parameter_data(&model),
    }
}

/// Trains the Transformer for `steps` Adam steps with a plain loop (dropout on, seeded).
pub fn train_gpt<B: AutodiffBackend>(device: &B::Device, steps: usize, batch: usize) -> TrainRun {
    train_gpt_observed::<B>(device, steps, batch, |_| {})
}

/// [`train_gpt`], calling `after_step(step)` after each optimizer step.
pub fn train_gpt_observed<B: AutodiffBackend>(
    device: &B::Device,
    steps: usize,
    batch: usize,
    mut after_step: impl FnMut(usize),
) -> TrainRun {
    B::seed(device, 11);
    let mut model = TinyGpt::<B>::new(device);
    let mut optim = AdamConfig::new().init();
    let mut losses = Vec::with_capacity(steps);
    for step in 0..steps {
        let loss = model.loss(gpt_batch::<B>(batch, step, device));
        losses.push(loss.clone().into_scalar().elem());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(3e-3, model, grads);
        after_step(step);
    }
    TrainRun {
        losses,
        parameters: parameter_data(&model),
    }
}

use burn::tensor::ElementConversion;
