//! The main example: train a small CNN and a small Transformer on Flex, once plain and once
//! through `SpillBackend`, and print the losses side by side. They must match bit for bit.
//!
//! ```text
//! cargo run --release --example train
//! ```

#[path = "common/small_models.rs"]
mod small_models;

use burn::backend::{Autodiff, Flex};
use burn_spill::SpillBackend;
use small_models::{TrainRun, train_cnn, train_gpt};

type Plain = Autodiff<Flex>;
type Spilled = Autodiff<SpillBackend<Flex>>; // the one-line type swap

fn print_side_by_side(name: &str, plain: &TrainRun, spilled: &TrainRun) -> bool {
    println!("\n{name}");
    println!(
        "{:>5}  {:>12}  {:>12}  same",
        "step", "plain loss", "spilled loss"
    );
    let mut all_same = true;
    for (step, (p, s)) in plain.losses.iter().zip(&spilled.losses).enumerate() {
        let same = p.to_bits() == s.to_bits();
        all_same &= same;
        println!(
            "{step:>5}  {p:>12.6}  {s:>12.6}  {}",
            if same { "yes" } else { "NO" }
        );
    }
    let params_same = plain.parameters.len() == spilled.parameters.len()
        && plain
            .parameters
            .iter()
            .zip(&spilled.parameters)
            .all(|(p, s)| p.as_bytes() == s.as_bytes() && p.shape == s.shape);
    println!(
        "final parameters identical: {}",
        if params_same { "yes" } else { "NO" }
    );
    all_same && params_same
}

fn main() {
    let steps = std::env::var("STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let device = Default::default();

    let cnn_plain = train_cnn::<Plain>(&device, steps, 16);
    let cnn_spilled = train_cnn::<Spilled>(&device, steps, 16);
    let gpt_plain = train_gpt::<Plain>(&device, steps, 8);
    let gpt_spilled = train_gpt::<Spilled>(&device, steps, 8);

    let cnn_ok = print_side_by_side(
        "small CNN (16x16 images, 4 classes)",
        &cnn_plain,
        &cnn_spilled,
    );
    let gpt_ok = print_side_by_side("tiny GPT (2 layers, causal mask)", &gpt_plain, &gpt_spilled);
    let live = SpillBackend::<Flex>::live(&device);
    println!(
        "\nburn-spill ledger: {} tensors created, peak {} bytes live",
        live.created_total, live.peak_bytes
    );
    if !(cnn_ok && gpt_ok) {
        eprintln!("plain and spilled runs differ");
        std::process::exit(1);
    }
}
