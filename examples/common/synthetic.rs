//! Synthetic, seeded and learnable data: labelled images for the ResNet and counting sequences
//! for the GPT. Every item is a pure function of (seed, index), so a plain run and a spilled
//! run see exactly the same batches, and no data set has to be downloaded.

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

/// SplitMix64: a tiny, well-known generator, enough to make noise and labels reproducible
/// without tying the data to a `rand` version.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator for item `index` of the stream `seed` (independent streams per item, so a
    /// batch does not depend on which items came before it).
    pub fn for_item(seed: u64, index: u64) -> Self {
        let mut rng = Self(seed ^ 0x9E37_79B9_7F4A_7C15);
        rng.0 ^= rng.next_u64().wrapping_add(index);
        Self(rng.next_u64())
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in `[-0.5, 0.5)`.
    pub fn centered(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }
}

/// RGB images of one of `classes` patterns plus noise: class k is a diagonal wave whose
/// frequencies and phase depend on k, so the classes are separable but only after a few
/// convolutions have learnt the orientations.
#[derive(Clone, Debug)]
pub struct ImageTask {
    pub image_size: usize,
    pub classes: usize,
    pub seed: u64,
}

impl ImageTask {
    /// Pixels `[3, size, size]` (row-major) and the label of item `index`.
    pub fn item(&self, index: u64) -> (Vec<f32>, usize) {
        let mut rng = SplitMix64::for_item(self.seed, index);
        let label = rng.below(self.classes as u64) as usize;
        let size = self.image_size;
        let fx = 1.0 + (label % 3) as f32;
        let fy = 1.0 + ((label / 3) % 3) as f32;
        let phase = std::f32::consts::TAU * label as f32 / self.classes as f32;
        let mut pixels = Vec::with_capacity(3 * size * size);
        for c in 0..3 {
            for y in 0..size {
                for x in 0..size {
                    let u = (fx * x as f32 + fy * y as f32) / size as f32;
                    let wave = (std::f32::consts::TAU * u + phase + c as f32).sin();
                    pixels.push(0.5 * wave + 0.5 * rng.centered());
                }
            }
        }
        (pixels, label)
    }

    /// The images `[n, 3, size, size]` and labels `[n]` of items `indices`.
    pub fn batch<B: Backend>(
        &self,
        indices: &[u64],
        device: &B::Device,
    ) -> (Tensor<B, 4>, Tensor<B, 1, Int>) {
        let n = indices.len();
        let size = self.image_size;
        let mut pixels = Vec::with_capacity(n * 3 * size * size);
        let mut labels = Vec::with_capacity(n);
        for &index in indices {
            let (p, label) = self.item(index);
            pixels.extend(p);
            labels.push(label as i64);
        }
        (
            Tensor::from_data(TensorData::new(pixels, [n, 3, size, size]), device),
            Tensor::from_data(TensorData::new(labels, [n]), device),
        )
    }
}

/// Token sequences that count up from a random start by a random stride (1 to 4) modulo the
/// vocabulary. The first token is a guess (loss ln(vocab)) and the second narrows the stride
/// to one of four, but every later token follows from the two before it, so a model that
/// learns to attend to the previous tokens drives the loss well below ln(vocab).
#[derive(Clone, Debug)]
pub struct SequenceTask {
    pub vocab: usize,
    pub seq_len: usize,
    pub seed: u64,
}

impl SequenceTask {
    const MAX_STRIDE: u64 = 4;

    /// The tokens of item `index`.
    pub fn item(&self, index: u64) -> Vec<i64> {
        let mut rng = SplitMix64::for_item(self.seed, index);
        let vocab = self.vocab as u64;
        let start = rng.below(vocab);
        let stride = 1 + rng.below(Self::MAX_STRIDE.min(vocab - 1).max(1));
        (0..self.seq_len as u64)
            .map(|t| ((start + t * stride) % vocab) as i64)
            .collect()
    }

    /// Tokens `[n, seq_len]` of items `indices`.
    pub fn batch<B: Backend>(&self, indices: &[u64], device: &B::Device) -> Tensor<B, 2, Int> {
        let n = indices.len();
        let tokens: Vec<i64> = indices.iter().flat_map(|&i| self.item(i)).collect();
        Tensor::from_data(TensorData::new(tokens, [n, self.seq_len]), device)
    }
}
