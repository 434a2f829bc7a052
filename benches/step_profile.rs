//! A target for a sampling profiler: trains the small CNN or the tiny Transformer on
//! `SpillBackend<Flex>` at a budget given as a percentage of the plain peak (or unconfigured),
//! for a number of steps, and prints the mean spilled step time. Nothing else runs, so a
//! profile of it is a profile of the engine's per-op path and the model's kernels.
//!
//! ```text
//! cargo bench --bench step_profile -- transformer 30 300
//! perf record -F 2000 -o perf.data target/release/deps/step_profile-* transformer 30 300
//! perf report -i perf.data --no-children --sort symbol
//! ```
//!
//! On a shared machine, `scripts/instructions-per-step.sh` (callgrind) compares builds by the
//! instructions a step executes instead of its time.
//!
//! With `add` in place of the model it runs that many 16x16 adds (thousands) on the bare
//! `SpillBackend<Flex>` instead: a profile of one op's path with nothing else around it
//! (`step_profile add 1000 2000`: two million adds at a budget that never binds). With
//! `batched` it runs them as criterion's `iter_batched` does in `benches/overhead.rs` (a batch
//! of inputs, then their adds, the batch growing), an unmarked stream whose period keeps
//! changing: `plain`, `none`, or any budget for the Transformer preset at one that never binds
//! (`step_profile batched 200 200`).
//!
//! Arguments: the model (`cnn`, `transformer` or `add`), the budget in percent of the plain peak
//! (`none` for an unconfigured device, `plain` for plain `Flex` without the decorator: the
//! profile to subtract; above 100 never binds), the number of steps, then any
//! of `unmarked` to train without step markers (the tape finds the steps itself) and `record`
//! to record every step in full (by default the tape records one step in a hundred once
//! steps repeat, and only checks the others): a profile of the recorder; `sync` runs the
//! engine synchronously (every move on the op's thread, no transfer workers).

#[path = "../examples/common/small_models.rs"]
mod small_models;

use std::time::Instant;

use burn::backend::{Autodiff, Flex};
use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{Adam, AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor};
use burn_spill::{SpillBackend, SpillConfig};
use small_models::{SmallCnn, TinyGpt, cnn_batch, gpt_batch};

type Spill = SpillBackend<Flex>;
type Spilled = Autodiff<Spill>;
type Plain = Autodiff<Flex>;

trait Model<B: AutodiffBackend>: AutodiffModule<B> + Clone {
    fn init(device: &B::Device) -> Self;
    fn batch_loss(&self) -> Tensor<B, 1>;
}

/// The preset each model's spilled runs are configured with.
trait Preset {
    fn config() -> SpillConfig;
}

impl<B: AutodiffBackend> Model<B> for SmallCnn<B> {
    fn init(device: &B::Device) -> Self {
        SmallCnn::new(device)
    }
    fn batch_loss(&self) -> Tensor<B, 1> {
        let (images, labels): (Tensor<B, 4>, Tensor<B, 1, Int>) =
            cnn_batch::<B>(8, 0, &Default::default());
        self.loss(images, labels)
    }
}

impl<B: Backend> Preset for SmallCnn<B> {
    fn config() -> SpillConfig {
        SpillConfig::cnn()
    }
}

impl<B: AutodiffBackend> Model<B> for TinyGpt<B> {
    fn init(device: &B::Device) -> Self {
        TinyGpt::new(device)
    }
    fn batch_loss(&self) -> Tensor<B, 1> {
        self.loss(gpt_batch::<B>(8, 0, &Default::default()))
    }
}

impl<B: Backend> Preset for TinyGpt<B> {
    fn config() -> SpillConfig {
        SpillConfig::transformer()
    }
}

/// Trains `steps` steps of `M` on `B`; `markers` brackets each step with the spilled device's
/// step markers (off for plain runs and for `unmarked`, where the tape finds the steps itself).
/// Returns the mean step time in ms.
fn train<B: AutodiffBackend, M: Model<B>>(steps: usize, markers: bool) -> f64 {
    let device = Default::default();
    B::seed(&device, 1);
    let mut model = Some(M::init(&device));
    let mut optim: OptimizerAdaptor<Adam, M, B> = AdamConfig::new().init();
    let start = Instant::now();
    for _ in 0..steps {
        if markers {
            Spill::step_begin(&Default::default());
        }
        let m = model.take().expect("a model between steps");
        let loss = m.batch_loss();
        let grads = GradientsParams::from_grads(loss.backward(), &m);
        model = Some(optim.step(1e-3, m, grads));
        if markers {
            Spill::step_end(&Default::default());
        }
    }
    start.elapsed().as_secs_f64() * 1e3 / steps as f64
}

fn run<M: Model<Spilled> + Preset>(
    budget_percent: Option<u64>,
    steps: usize,
    unmarked: bool,
    record: bool,
    synchronous: bool,
) {
    let resample = |config: SpillConfig| {
        let config = config.asynchronous(!synchronous);
        if record {
            config.tape_resample_steps(1)
        } else {
            config
        }
    };
    let device = Default::default();
    let peak = match budget_percent {
        Some(percent) => {
            // The plain peak: what the counters of an unconfigured device see in a few steps.
            Spill::configure(&device, SpillConfig::default()).expect("a valid config");
            train::<Spilled, M>(4, !unmarked);
            let peak = Spill::stats(&device).peak.device;
            let budget = peak * percent / 100;
            Spill::configure(&device, resample(M::config().device_budget_bytes(budget)))
                .expect("a valid config");
            println!("plain peak {peak} B, budget {budget} B ({percent}%)");
            Some(peak)
        }
        None => {
            Spill::configure(&device, resample(SpillConfig::default())).expect("a valid config");
            None
        }
    };
    let ms = train::<Spilled, M>(steps, !unmarked);
    let stats = Spill::stats(&device);
    let tape = Spill::tape_counters(&device);
    let ops = Spill::last_step(&device).map(|step| step.ops.len());
    println!(
        "{steps} steps, {ms:.3} ms per step; moved {} B to the host, {} B back; peak {} B (plain {peak:?}); ops in the last recorded step {ops:?}; tape {tape:?}",
        stats.device_to_host.bytes, stats.host_to_device.bytes, stats.peak.device
    );
    println!(
        "over-budget ops {} (largest {} B), estimate misses {}, unevictable now {} B",
        stats.over_budget_ops,
        stats.largest_over_budget_op_bytes,
        stats.estimate_misses,
        stats.unevictable_device_bytes
    );
    println!(
        "prefetch hits {} of {} spilled inputs ({:.1}%), {} issued; per step: stalls {:.3} ms, engine {:.3} ms",
        stats.prefetch_hits,
        stats.prefetch_hits + stats.prefetch_misses,
        stats.prefetch_hit_rate().unwrap_or(1.0) * 100.0,
        stats.prefetches_issued,
        stats.stall_time.as_secs_f64() * 1e3 / steps as f64,
        stats.engine_time.as_secs_f64() * 1e3 / steps as f64,
    );
    let recompute = &stats.recompute;
    if recompute.dropped > 0 {
        println!(
            "dropped {} ({} B), rebuilt {} ({} B, {} chained); per step: rebuilds {:.3} ms",
            recompute.dropped,
            recompute.dropped_bytes,
            recompute.rebuilt,
            recompute.rebuilt_bytes,
            recompute.chained_rebuilds,
            recompute.rebuild_time.as_secs_f64() * 1e3 / steps as f64,
        );
    }
    let rate = |m: &burn_spill::MoveStats| m.bytes as f64 / m.time.as_secs_f64().max(1e-12) / 1e9;
    println!(
        "moves: {} to the host at {:.2} GB/s, {} back at {:.2} GB/s (as the engine measures them)",
        stats.device_to_host.count,
        rate(&stats.device_to_host),
        stats.host_to_device.count,
        rate(&stats.host_to_device),
    );
}

/// Runs `thousands` thousand 16x16 adds, each on two fresh inputs; the budget as for a model,
/// in percent of what the inputs and output of one add hold.
fn run_adds(budget_percent: Option<u64>, thousands: usize) {
    use burn::tensor::TensorData;
    use burn::tensor::ops::FloatTensorOps;
    let device = Default::default();
    let one_add = 3 * 16 * 16 * 4;
    let config = match budget_percent {
        Some(percent) => SpillConfig::default().device_budget_bytes(one_add * percent / 100),
        None => SpillConfig::default(),
    };
    Spill::configure(&device, config).expect("a valid config");
    let values: Vec<f32> = (0..256).map(|i| (i % 17) as f32 * 0.25).collect();
    let input = || Spill::float_from_data(TensorData::new(values.clone(), [16, 16]), &device);
    let start = Instant::now();
    for _ in 0..thousands * 1000 {
        std::hint::black_box(Spill::float_add(input(), input()));
    }
    let ns = start.elapsed().as_nanos() as f64 / (thousands * 1000) as f64;
    println!("{thousands}k adds (two uploads each), {ns:.0} ns per add and its inputs");
}

/// Runs about `thousands` thousand 16x16 adds the way criterion's `iter_batched` does (as
/// `benches/overhead.rs` measures them): a batch of fresh inputs, then their adds, with the
/// batch growing by one every ten batches, so that the unmarked op stream's period keeps
/// changing. `preset`: the device is configured with the Transformer preset (tape on) at a
/// budget that never binds; otherwise unconfigured, or plain `Flex` when `plain`. Prints the
/// time per add, inputs not counted (as criterion counts it).
fn run_batched_adds<B: Backend>(thousands: usize, configure: Option<SpillConfig>) {
    use burn::tensor::TensorData;
    let device = Default::default();
    if let Some(config) = configure {
        Spill::configure(&Default::default(), config).expect("a valid config");
    }
    let values: Vec<f32> = (0..256).map(|i| (i % 17) as f32 * 0.25).collect();
    let input = || B::float_from_data(TensorData::new(values.clone(), [16, 16]), &device);
    let (mut adds, mut batch, mut timed) = (0, 1, std::time::Duration::ZERO);
    while adds < thousands * 1000 {
        for _ in 0..10 {
            let inputs: Vec<_> = (0..batch).map(|_| (input(), input())).collect();
            let start = Instant::now();
            let outputs: Vec<_> = inputs
                .into_iter()
                .map(|(x, y)| std::hint::black_box(B::float_add(x, y)))
                .collect();
            timed += start.elapsed();
            drop(outputs);
            adds += batch;
        }
        batch += 1;
    }
    println!(
        "{adds} adds in batches growing to {batch}: {:.0} ns per add",
        timed.as_nanos() as f64 / adds as f64
    );
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let model = args.first().map_or("transformer", String::as_str);
    let plain = args.get(1).is_some_and(|b| b == "plain");
    let budget = match args.get(1).map(String::as_str) {
        None | Some("none") | Some("plain") => None,
        Some(p) => Some(p.parse().expect("a budget in percent, or `none`")),
    };
    let steps = args
        .get(2)
        .map_or(200, |s| s.parse().expect("a step count"));
    let flags = args.get(3..).unwrap_or_default();
    let unmarked = flags.iter().any(|a| a == "unmarked");
    let record = flags.iter().any(|a| a == "record");
    let synchronous = flags.iter().any(|a| a == "sync");
    if let Some(other) = flags
        .iter()
        .find(|a| !["unmarked", "record", "sync"].contains(&a.as_str()))
    {
        panic!("unknown flag `{other}`: `unmarked`, `record` or `sync`");
    }
    match model {
        "cnn" | "transformer" if plain => {
            let ms = match model {
                "cnn" => train::<Plain, SmallCnn<Plain>>(steps, false),
                _ => train::<Plain, TinyGpt<Plain>>(steps, false),
            };
            println!("{steps} steps, {ms:.3} ms per step on plain Flex");
        }
        "add" if plain => panic!("`add` has no plain run: `overhead` pairs adds with plain"),
        "add" => run_adds(budget, steps),
        "batched" if plain => run_batched_adds::<Flex>(steps, None),
        "batched" => run_batched_adds::<Spill>(
            steps,
            Some(match budget {
                Some(_) => SpillConfig::transformer().device_budget_bytes(1 << 40),
                None => SpillConfig::default(),
            }),
        ),
        "cnn" => run::<SmallCnn<Spilled>>(budget, steps, unmarked, record, synchronous),
        "transformer" => run::<TinyGpt<Spilled>>(budget, steps, unmarked, record, synchronous),
        other => panic!("unknown model `{other}`: `cnn`, `transformer`, `add` or `batched`"),
    }
}
