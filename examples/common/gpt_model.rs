//! A GPT-style decoder from burn-nn layers: token and position embeddings, a pre-norm
//! `TransformerEncoder` run with an autoregressive (causal) mask, which is what makes an
//! encoder stack a decoder-only language model, a final layer norm, and a linear LM head.

use burn::module::Module;
use burn::nn::attention::generate_autoregressive_mask;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::transformer::{
    TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput,
};
use burn::nn::{Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

#[derive(Clone, Debug, serde::Serialize)]
pub struct GptConfig {
    pub vocab: usize,
    /// The longest sequence (the position embedding's size).
    pub seq_len: usize,
    pub d_model: usize,
    pub heads: usize,
    pub layers: usize,
    /// Dropout on attention and feed-forward outputs. It draws from the backend's seeded
    /// generator, so plain and spilled runs drop the same units.
    pub dropout: f64,
}

impl GptConfig {
    pub fn init<B: Backend>(&self, device: &B::Device) -> Gpt<B> {
        Gpt {
            tokens: EmbeddingConfig::new(self.vocab, self.d_model).init(device),
            positions: EmbeddingConfig::new(self.seq_len, self.d_model).init(device),
            blocks: TransformerEncoderConfig::new(
                self.d_model,
                4 * self.d_model,
                self.heads,
                self.layers,
            )
            .with_dropout(self.dropout)
            .with_norm_first(true)
            .init(device),
            norm: LayerNormConfig::new(self.d_model).init(device),
            head: LinearConfig::new(self.d_model, self.vocab).init(device),
        }
    }
}

#[derive(Module, Debug)]
pub struct Gpt<B: Backend> {
    tokens: Embedding<B>,
    positions: Embedding<B>,
    blocks: TransformerEncoder<B>,
    /// Pre-norm blocks leave their output unnormalised; GPT-2 normalises once before the head.
    norm: LayerNorm<B>,
    head: Linear<B>,
}

impl<B: Backend> Gpt<B> {
    /// Next-token logits `[batch, seq, vocab]` for tokens `[batch, seq]`.
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [batch, seq] = tokens.dims();
        let device = tokens.device();
        let positions = Tensor::<B, 1, Int>::arange(0..seq as i64, &device)
            .reshape([1, seq])
            .repeat_dim(0, batch);
        let x = self.tokens.forward(tokens) + self.positions.forward(positions);
        let mask = generate_autoregressive_mask::<B>(batch, seq, &device);
        let x = self
            .blocks
            .forward(TransformerEncoderInput::new(x).mask_attn(mask));
        self.head.forward(self.norm.forward(x))
    }

    /// Mean cross-entropy of predicting token t+1 from tokens 0..=t, over every position.
    pub fn loss(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 1> {
        let [batch, seq] = tokens.dims();
        let inputs = tokens.clone().slice([0..batch, 0..seq - 1]);
        let targets = tokens
            .slice([0..batch, 1..seq])
            .reshape([batch * (seq - 1)]);
        let logits = self.forward(inputs);
        let vocab = logits.dims()[2];
        let logits = logits.reshape([batch * (seq - 1), vocab]);
        CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits, targets)
    }
}
