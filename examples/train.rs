//! The main example: train a small CNN and a small Transformer on Flex, once plain and once
//! through `SpillBackend` with a device budget of 30% of the run's own peak (and a host tier of
//! 10%, the rest going to a spill file), and print the losses side by side. They must match bit
//! for bit. The `BURN_SPILL_*` environment variables override the budget and tiers.
//!
//! ```text
//! cargo run --release --example train
//! BURN_SPILL_BUDGET=0 cargo run --release --example train   # spill everything after every op
//! ```

#[path = "common/logging.rs"]
mod logging;
#[path = "common/small_models.rs"]
mod small_models;

use burn::backend::{Autodiff, Flex};
use burn_spill::{SpillBackend, SpillConfig, SpillStats};
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

/// Trains once unlimited to learn the peak, then again under 30% of it; returns the budgeted
/// run, its stats and the unlimited peak.
fn budgeted(train: impl Fn() -> TrainRun) -> (TrainRun, SpillStats, u64) {
    let device = Default::default();
    let configure = |config: SpillConfig| {
        SpillBackend::<Flex>::configure(&device, config).unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(2)
        })
    };
    // The peak is measured unlimited whatever the environment says; the budgeted run below
    // takes the `BURN_SPILL_*` variables on top of its config.
    SpillBackend::<Flex>::configure_without_env(&device, SpillConfig::default())
        .expect("the default config is valid");
    drop(train());
    let peak = SpillBackend::<Flex>::stats(&device).peak.device;
    configure(
        SpillConfig::default()
            .device_budget_bytes(peak * 3 / 10)
            .host_limit_bytes(peak / 10),
    );
    let run = train();
    let stats = SpillBackend::<Flex>::stats(&device);
    configure(SpillConfig::default());
    (run, stats, peak)
}

fn print_memory(stats: &SpillStats, unlimited_peak: u64) {
    let kib = |b: u64| b as f64 / 1024.0;
    println!(
        "device peak {:.0} KiB with a budget of {:.0} KiB (unlimited: {:.0} KiB); \
         host limit {:.0} KiB",
        kib(stats.peak.device),
        kib(stats.device_budget_bytes.unwrap_or(u64::MAX)),
        kib(unlimited_peak),
        kib(stats.host_limit_bytes.unwrap_or(u64::MAX)),
    );
    println!(
        "moved: device->host {} ({:.0} KiB), host->device {}, host->disk {}, disk->device {}; \
         {:.1} ms moving; {} over-budget ops",
        stats.device_to_host.count,
        kib(stats.device_to_host.bytes),
        stats.host_to_device.count,
        stats.host_to_disk.count,
        stats.disk_to_device.count,
        stats.time_moving.as_secs_f64() * 1e3,
        stats.over_budget_ops,
    );
}

fn main() {
    logging::install();
    let steps = std::env::var("STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let device = Default::default();

    let cnn_plain = train_cnn::<Plain>(&device, steps, 16);
    let (cnn_spilled, cnn_stats, cnn_peak) = budgeted(|| train_cnn::<Spilled>(&device, steps, 16));
    let gpt_plain = train_gpt::<Plain>(&device, steps, 8);
    let (gpt_spilled, gpt_stats, gpt_peak) = budgeted(|| train_gpt::<Spilled>(&device, steps, 8));

    let cnn_ok = print_side_by_side(
        "small CNN (16x16 images, 4 classes)",
        &cnn_plain,
        &cnn_spilled,
    );
    print_memory(&cnn_stats, cnn_peak);
    let gpt_ok = print_side_by_side("tiny GPT (2 layers, causal mask)", &gpt_plain, &gpt_spilled);
    print_memory(&gpt_stats, gpt_peak);
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
