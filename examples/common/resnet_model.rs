//! ResNet-18/34/50/101/152 (He et al., 2015) from burn-nn layers: basic blocks (two 3x3
//! convolutions) for 18 and 34, bottleneck blocks (1x1, 3x3, 1x1 with 4x expansion) for 50 and
//! deeper, batch norm after every convolution, and residual adds with a 1x1 projection where the
//! shape changes.
//!
//! Small images (up to 64 pixels, CIFAR-sized) get the CIFAR stem: one 3x3 convolution and no
//! max pool, so that a 32x32 image still has 4x4 pixels left in the last stage. Larger images
//! get the ImageNet stem (7x7 stride 2, then a 3x3 max pool).

use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::pool::{AdaptiveAvgPool2d, AdaptiveAvgPool2dConfig, MaxPool2d, MaxPool2dConfig};
use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig, PaddingConfig2d, Relu};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

/// The depths of the paper's table 1.
pub const DEPTHS: [usize; 5] = [18, 34, 50, 101, 152];

/// Which ResNet, for which images.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ResNetConfig {
    /// 18, 34, 50, 101 or 152.
    pub depth: usize,
    /// Channels of the first stage; the paper uses 64. The stages have 1x, 2x, 4x and 8x that
    /// (times 4 at the output of a bottleneck block).
    pub width: usize,
    pub image_size: usize,
    pub classes: usize,
}

impl ResNetConfig {
    /// Blocks per stage and whether they are bottlenecks; `None` for a depth not in the paper.
    pub fn layout(depth: usize) -> Option<([usize; 4], bool)> {
        Some(match depth {
            18 => ([2, 2, 2, 2], false),
            34 => ([3, 4, 6, 3], false),
            50 => ([3, 4, 6, 3], true),
            101 => ([3, 4, 23, 3], true),
            152 => ([3, 8, 36, 3], true),
            _ => return None,
        })
    }

    /// Images this small use the CIFAR stem.
    fn small_images(&self) -> bool {
        self.image_size <= 64
    }

    pub fn init<B: Backend>(&self, device: &B::Device) -> ResNet<B> {
        let (blocks, bottleneck) =
            Self::layout(self.depth).expect("the command line only accepts the paper's depths");
        let expansion = if bottleneck { 4 } else { 1 };
        let stem = if self.small_images() {
            ConvNorm::new([3, self.width], 3, 1, device)
        } else {
            ConvNorm::new([3, self.width], 7, 2, device)
        };
        let stem_pool = (!self.small_images()).then(|| {
            MaxPool2dConfig::new([3, 3])
                .with_strides([2, 2])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .init()
        });
        let mut layers = Vec::new();
        let mut channels = self.width;
        for (stage, count) in blocks.into_iter().enumerate() {
            let planes = self.width << stage;
            for i in 0..count {
                // The first block of stages 2-4 halves the resolution.
                let stride = if i == 0 && stage > 0 { 2 } else { 1 };
                layers.push(if bottleneck {
                    Block::Bottleneck(Bottleneck::new(channels, planes, stride, device))
                } else {
                    Block::Basic(BasicBlock::new(channels, planes, stride, device))
                });
                channels = planes * expansion;
            }
        }
        ResNet {
            stem,
            stem_pool,
            layers,
            pool: AdaptiveAvgPool2dConfig::new([1, 1]).init(),
            head: LinearConfig::new(channels, self.classes).init(device),
            relu: Relu::new(),
        }
    }
}

/// A convolution without bias followed by batch norm (the norm's shift makes a bias
/// redundant), padded to keep the size at stride 1.
#[derive(Module, Debug)]
pub struct ConvNorm<B: Backend> {
    conv: Conv2d<B>,
    norm: BatchNorm<B>,
}

impl<B: Backend> ConvNorm<B> {
    fn new(channels: [usize; 2], kernel: usize, stride: usize, device: &B::Device) -> Self {
        let pad = kernel / 2;
        Self {
            conv: Conv2dConfig::new(channels, [kernel, kernel])
                .with_stride([stride, stride])
                .with_padding(PaddingConfig2d::Explicit(pad, pad, pad, pad))
                .with_bias(false)
                .init(device),
            norm: BatchNormConfig::new(channels[1]).init(device),
        }
    }

    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        self.norm.forward(self.conv.forward(x))
    }
}

/// Two 3x3 convolutions and the residual add.
#[derive(Module, Debug)]
pub struct BasicBlock<B: Backend> {
    first: ConvNorm<B>,
    second: ConvNorm<B>,
    /// A 1x1 projection where the block changes the channels or the resolution.
    shortcut: Option<ConvNorm<B>>,
    relu: Relu,
}

impl<B: Backend> BasicBlock<B> {
    fn new(channels: usize, planes: usize, stride: usize, device: &B::Device) -> Self {
        Self {
            first: ConvNorm::new([channels, planes], 3, stride, device),
            second: ConvNorm::new([planes, planes], 3, 1, device),
            shortcut: (stride != 1 || channels != planes)
                .then(|| ConvNorm::new([channels, planes], 1, stride, device)),
            relu: Relu::new(),
        }
    }

    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let identity = match &self.shortcut {
            Some(projection) => projection.forward(x.clone()),
            None => x.clone(),
        };
        let y = self.relu.forward(self.first.forward(x));
        self.relu.forward(self.second.forward(y) + identity)
    }
}

/// 1x1 down to `planes`, 3x3 (carrying the stride), 1x1 up to `4 * planes`, and the residual
/// add: the block the deeper ResNets use to keep the 3x3 convolutions narrow.
#[derive(Module, Debug)]
pub struct Bottleneck<B: Backend> {
    reduce: ConvNorm<B>,
    spatial: ConvNorm<B>,
    expand: ConvNorm<B>,
    shortcut: Option<ConvNorm<B>>,
    relu: Relu,
}

impl<B: Backend> Bottleneck<B> {
    fn new(channels: usize, planes: usize, stride: usize, device: &B::Device) -> Self {
        let out = planes * 4;
        Self {
            reduce: ConvNorm::new([channels, planes], 1, 1, device),
            spatial: ConvNorm::new([planes, planes], 3, stride, device),
            expand: ConvNorm::new([planes, out], 1, 1, device),
            shortcut: (stride != 1 || channels != out)
                .then(|| ConvNorm::new([channels, out], 1, stride, device)),
            relu: Relu::new(),
        }
    }

    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let identity = match &self.shortcut {
            Some(projection) => projection.forward(x.clone()),
            None => x.clone(),
        };
        let y = self.relu.forward(self.reduce.forward(x));
        let y = self.relu.forward(self.spatial.forward(y));
        self.relu.forward(self.expand.forward(y) + identity)
    }
}

// The variants differ in size by a few hundred bytes of layer metadata; blocks are built once
// and held in a `Vec`, so boxing would only add an indirection to every forward.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum Block<B: Backend> {
    Basic(BasicBlock<B>),
    Bottleneck(Bottleneck<B>),
}

impl<B: Backend> Block<B> {
    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        match self {
            Block::Basic(block) => block.forward(x),
            Block::Bottleneck(block) => block.forward(x),
        }
    }
}

#[derive(Module, Debug)]
pub struct ResNet<B: Backend> {
    stem: ConvNorm<B>,
    stem_pool: Option<MaxPool2d>,
    layers: Vec<Block<B>>,
    pool: AdaptiveAvgPool2d,
    head: Linear<B>,
    relu: Relu,
}

impl<B: Backend> ResNet<B> {
    /// Logits `[batch, classes]` for images `[batch, 3, size, size]`.
    pub fn forward(&self, images: Tensor<B, 4>) -> Tensor<B, 2> {
        let mut x = self.relu.forward(self.stem.forward(images));
        if let Some(pool) = &self.stem_pool {
            x = pool.forward(x);
        }
        for block in &self.layers {
            x = block.forward(x);
        }
        self.head.forward(self.pool.forward(x).flatten(1, 3))
    }

    /// Logits and the mean cross-entropy against `labels`.
    pub fn forward_loss(
        &self,
        images: Tensor<B, 4>,
        labels: Tensor<B, 1, Int>,
    ) -> (Tensor<B, 2>, Tensor<B, 1>) {
        let logits = self.forward(images);
        let loss = CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits.clone(), labels);
        (logits, loss)
    }
}
