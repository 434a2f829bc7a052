//! Per-op overhead of `SpillBackend<Flex>` against plain `Flex`, and one training step of the
//! small CNN and of the tiny Transformer, measured in the same run, three times: unconfigured
//! (every op is a flag check), configured with a budget that never binds (the default LRU
//! policy, the engine asynchronous), and the same budget with the Transformer preset, whose
//! tape records in its default mode (steps found in the unmarked op stream, then verified, one
//! in a hundred recorded): what a user who sets a budget pays while memory is ample. Prints a
//! markdown table of the ratios at the end, then paired step ratios, among them the preset's
//! with its steps marked, as burn-train's `Learner` integration marks them (the tape then
//! counts the ops of a verified step while memory is ample instead of verifying each).
//!
//! With `--features wgpu` it also measures the two configured settings on `SpillBackend<Wgpu>`
//! against plain `Wgpu` (on lavapipe where there is no GPU), paired: the host time an op's
//! dispatch takes (what a GPU user pays per op, since the host thread is what keeps a GPU fed)
//! and the training steps, each synchronised. With `--features cuda` and
//! `BURN_SPILL_BENCH_BACKEND=cuda` it measures those rows on `SpillBackend<Cuda>` only (the Flex
//! rows need no GPU, so a GPU's time is not spent on them).
//!
//! ```text
//! cargo bench --bench overhead
//! cargo bench --bench overhead --features wgpu
//! BURN_SPILL_BENCH_BACKEND=cuda cargo bench --bench overhead --features cuda
//! ```

#[path = "../examples/common/small_models.rs"]
mod small_models;

use std::hint::black_box;
use std::time::{Duration, Instant};

use burn::backend::{Autodiff, Flex};
use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{Adam, AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use burn_spill::{SpillBackend, SpillConfig};
use criterion::{BatchSize, Criterion};
use small_models::{SmallCnn, TinyGpt, cnn_batch, gpt_batch};

type Spill = SpillBackend<Flex>;

/// A budget far above anything these benchmarks hold: it never binds.
const AMPLE_BUDGET: u64 = 1 << 40;

fn float_input<B: Backend>(rows: usize, cols: usize) -> B::FloatTensorPrimitive {
    let values: Vec<f32> = (0..rows * cols).map(|i| (i % 17) as f32 * 0.25).collect();
    B::float_from_data(TensorData::new(values, [rows, cols]), &Default::default())
}

fn bench_add<B: Backend>(c: &mut Criterion, id: &str) {
    c.benchmark_group("add_16x16").bench_function(id, |b| {
        b.iter_batched(
            || (float_input::<B>(16, 16), float_input::<B>(16, 16)),
            |(x, y)| black_box(B::float_add(x, y)),
            BatchSize::SmallInput,
        )
    });
}

fn bench_matmul<B: Backend>(c: &mut Criterion, id: &str) {
    c.benchmark_group("matmul_64x64").bench_function(id, |b| {
        b.iter_batched(
            || (float_input::<B>(64, 64), float_input::<B>(64, 64)),
            |(x, y)| black_box(B::float_matmul(x, y)),
            BatchSize::SmallInput,
        )
    });
}

/// A model the bench trains: its loss on a fixed batch.
trait Model<B: AutodiffBackend>: AutodiffModule<B> + Clone {
    fn init(device: &B::Device) -> Self;
    fn batch_loss(&self, device: &B::Device) -> Tensor<B, 1>;
}

impl<B: AutodiffBackend> Model<B> for SmallCnn<B> {
    fn init(device: &B::Device) -> Self {
        SmallCnn::new(device)
    }
    fn batch_loss(&self, device: &B::Device) -> Tensor<B, 1> {
        let (images, labels): (Tensor<B, 4>, Tensor<B, 1, Int>) = cnn_batch::<B>(16, 0, device);
        self.loss(images, labels)
    }
}

impl<B: AutodiffBackend> Model<B> for TinyGpt<B> {
    fn init(device: &B::Device) -> Self {
        TinyGpt::new(device)
    }
    fn batch_loss(&self, device: &B::Device) -> Tensor<B, 1> {
        self.loss(gpt_batch::<B>(8, 0, device))
    }
}

/// A model with its optimizer: one call of `step` is one training step.
struct Trainer<B: AutodiffBackend, M: Model<B>> {
    model: Option<M>,
    optim: OptimizerAdaptor<Adam, M, B>,
    device: B::Device,
}

impl<B: AutodiffBackend, M: Model<B>> Trainer<B, M> {
    fn new() -> Self {
        let device = Default::default();
        B::seed(&device, 1);
        Self {
            model: Some(M::init(&device)),
            optim: AdamConfig::new().init(),
            device,
        }
    }

    fn step(&mut self) {
        let model = self
            .model
            .take()
            .expect("model is put back after every step");
        let loss = model.batch_loss(&self.device);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        self.model = Some(self.optim.step(1e-3, model, grads));
    }
}

fn bench_step<B: AutodiffBackend, M: Model<B>>(c: &mut Criterion, group: &str, id: &str) {
    let mut trainer = Trainer::<B, M>::new();
    c.benchmark_group(group)
        .bench_function(id, |b| b.iter(|| trainer.step()));
}

/// The median over `rounds` of the time of `run(true)` over that of `run(false)`, alternating
/// which goes first (a cache warmed by one must not favour the other), after three warm-up
/// calls of each.
fn paired(rounds: usize, run: &mut dyn FnMut(bool)) -> f64 {
    for _ in 0..3 {
        run(false);
        run(true);
    }
    let mut time = |side: bool| {
        let start = Instant::now();
        run(side);
        start.elapsed().as_secs_f64()
    };
    let mut ratios: Vec<f64> = (0..rounds)
        .map(|round| {
            let (off, on) = if round % 2 == 0 {
                let off = time(false);
                (off, time(true))
            } else {
                let on = time(true);
                (time(false), on)
            };
            on / off
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    ratios[rounds / 2]
}

/// Step-time ratio with the tape on / off for the spilled CNN, from alternating single steps on
/// one trainer. With `resample` 1 every step is recorded in full; with 100 the steps after the
/// first two only have their op signatures verified.
fn paired_recording_ratio(rounds: usize, resample: u64) -> f64 {
    let device = Default::default();
    configure(SpillConfig::default().tape_resample_steps(resample));
    let mut trainer = Trainer::<Autodiff<Spill>, SmallCnn<_>>::new();
    let mut step = |record: bool| {
        if record {
            Spill::record_tape(&device, true);
            Spill::step_begin(&device);
        }
        trainer.step();
        if record {
            Spill::step_end(&device);
            Spill::record_tape(&device, false);
        }
    };
    let ratio = paired(rounds, &mut step);
    configure(SpillConfig::default());
    ratio
}

/// Which op a per-op row times.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[derive(Clone, Copy)]
enum Op {
    Add16,
    Matmul64,
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
impl Op {
    fn size(self) -> usize {
        match self {
            Op::Add16 => 16,
            Op::Matmul64 => 64,
        }
    }

    fn run<B: Backend>(
        self,
        x: B::FloatTensorPrimitive,
        y: B::FloatTensorPrimitive,
    ) -> B::FloatTensorPrimitive {
        match self {
            Op::Add16 => B::float_add(x, y),
            Op::Matmul64 => B::float_matmul(x, y),
        }
    }
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
/// The host time of `n` dispatches of `op` on fresh inputs (made and synchronised before the
/// clock starts; the outputs are synchronised and dropped after it stops), in seconds.
fn time_ops<B: Backend>(op: Op, n: usize) -> f64 {
    let device = Default::default();
    let inputs: Vec<_> = (0..n)
        .map(|_| {
            (
                float_input::<B>(op.size(), op.size()),
                float_input::<B>(op.size(), op.size()),
            )
        })
        .collect();
    B::sync(&device).expect("the device syncs");
    let start = Instant::now();
    let outputs: Vec<_> = inputs.into_iter().map(|(x, y)| op.run::<B>(x, y)).collect();
    let took = start.elapsed().as_secs_f64();
    B::sync(&device).expect("the device syncs");
    drop(outputs);
    took
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
/// Paired per-op rows of `SpillBackend<P>` against `P`: the median ratio and the median time
/// added per op (ns) over `rounds` alternating batches of `n` ops.
fn paired_op<P: Backend>(op: Op, rounds: usize, n: usize) -> (f64, f64) {
    let mut pairs: Vec<(f64, f64)> = Vec::with_capacity(rounds);
    for round in 0..rounds + 3 {
        let (off, on) = if round % 2 == 0 {
            let off = time_ops::<P>(op, n);
            (off, time_ops::<SpillBackend<P>>(op, n))
        } else {
            let on = time_ops::<SpillBackend<P>>(op, n);
            (time_ops::<P>(op, n), on)
        };
        if round >= 3 {
            pairs.push((off, on));
        }
    }
    let mut ratios: Vec<f64> = pairs.iter().map(|(off, on)| on / off).collect();
    let mut added: Vec<f64> = pairs
        .iter()
        .map(|(off, on)| (on - off) * 1e9 / n as f64)
        .collect();
    ratios.sort_by(f64::total_cmp);
    added.sort_by(f64::total_cmp);
    (ratios[rounds / 2], added[rounds / 2])
}

/// Paired training-step ratio of `SpillBackend<P>` against `P` (the same model on each: `Plain`
/// and `Spilled` are its two instances), each step synchronised. With `marked`, the spilled
/// side marks its steps as burn-train's `Learner` integration does (the tape then finds its
/// steps by the markers, not by the period of the op stream).
fn paired_step<P: Backend, Plain, Spilled>(rounds: usize, marked: bool) -> f64
where
    Plain: Model<Autodiff<P>>,
    Spilled: Model<Autodiff<SpillBackend<P>>>,
{
    let mut plain = Trainer::<Autodiff<P>, Plain>::new();
    let mut spill = Trainer::<Autodiff<SpillBackend<P>>, Spilled>::new();
    let device: P::Device = Default::default();
    let spill_device: burn::tensor::Device<SpillBackend<P>> = Default::default();
    paired(rounds, &mut |spilled| {
        if spilled {
            if marked {
                SpillBackend::<P>::step_begin(&spill_device);
            }
            spill.step();
            if marked {
                SpillBackend::<P>::step_end(&spill_device);
            }
            SpillBackend::<P>::sync(&spill_device).expect("the device syncs");
        } else {
            plain.step();
            P::sync(&device).expect("the device syncs");
        }
    })
}

/// The configured rows on `SpillBackend<B>` against `B`, a CubeCL backend named `name` (see the
/// module doc), printed as a table.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn cubecl_rows<B: Backend>(name: &str, rounds: usize) {
    let device = Default::default();
    println!(
        "\nOn {name}: median over {rounds} alternating rounds, SpillBackend<{name}> against {name}"
    );
    println!(
        "| spilled side | add 16x16 added (ns/op) | add ratio | matmul 64x64 added (ns/op) | matmul ratio | cnn step | transformer step |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (setting, (_, what)) in SETTINGS.iter().enumerate().skip(1) {
        SpillBackend::<B>::configure(
            &device,
            match setting {
                1 => SpillConfig::default().device_budget_bytes(AMPLE_BUDGET),
                _ => SpillConfig::transformer().device_budget_bytes(AMPLE_BUDGET),
            },
        )
        .expect("a valid config");
        if setting < 2 {
            SpillBackend::<B>::record_tape(&device, false);
        }
        let (add_ratio, add_ns) = paired_op::<B>(Op::Add16, rounds, 200);
        let (mm_ratio, mm_ns) = paired_op::<B>(Op::Matmul64, rounds, 200);
        let cnn = paired_step::<B, SmallCnn<_>, SmallCnn<_>>(rounds, false);
        let gpt = paired_step::<B, TinyGpt<_>, TinyGpt<_>>(rounds, false);
        println!(
            "| {what} | {add_ns:+.0} | {add_ratio:.4} | {mm_ns:+.0} | {mm_ratio:.4} | {cnn:.4} | {gpt:.4} |"
        );
    }
}

fn configure(config: SpillConfig) {
    Spill::configure(&Default::default(), config).expect("a valid config");
}

/// Reads criterion's point estimate (mean, ns) of one benchmark from this run's output.
fn mean_ns(id: &str) -> Option<f64> {
    let dir = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let path = format!("{dir}/criterion/{id}/new/estimates.json");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    json["mean"]["point_estimate"].as_f64()
}

/// The benchmarks of one setting of the spilled side, `spill_id` naming its rows.
fn bench_all(c: &mut Criterion, spill_id: &str, with_plain: bool) {
    if with_plain {
        bench_add::<Flex>(c, "flex");
        bench_matmul::<Flex>(c, "flex");
        bench_step::<Autodiff<Flex>, SmallCnn<_>>(c, "cnn_train_step", "flex");
        bench_step::<Autodiff<Flex>, TinyGpt<_>>(c, "transformer_train_step", "flex");
    }
    bench_add::<Spill>(c, spill_id);
    bench_matmul::<Spill>(c, spill_id);
    bench_step::<Autodiff<Spill>, SmallCnn<_>>(c, "cnn_train_step", spill_id);
    bench_step::<Autodiff<Spill>, TinyGpt<_>>(c, "transformer_train_step", spill_id);
}

const SETTINGS: [(&str, &str); 3] = [
    ("spill", "unconfigured"),
    ("spill_ample", "configured, budget never binding"),
    (
        "spill_ample_preset",
        "configured with the Transformer preset (tape on), never binding",
    ),
];

/// Configures the spilled side for one of [`SETTINGS`]. The preset turns the tape on, and a
/// later `configure` leaves it on: the other settings turn it off, so that each measures itself.
fn configure_setting(setting: usize) {
    configure(match setting {
        0 => SpillConfig::default(),
        1 => SpillConfig::default().device_budget_bytes(AMPLE_BUDGET),
        _ => SpillConfig::transformer().device_budget_bytes(AMPLE_BUDGET),
    });
    if setting < 2 {
        Spill::record_tape(&Default::default(), false);
    }
}

fn main() {
    match std::env::var("BURN_SPILL_BENCH_BACKEND").as_deref() {
        Err(_) | Ok("flex") => {}
        #[cfg(feature = "cuda")]
        Ok("cuda") => {
            cubecl_rows::<burn::backend::Cuda>("Cuda", 31);
            return;
        }
        Ok(other) => {
            eprintln!(
                "error: BURN_SPILL_BENCH_BACKEND: `{other}` is not a backend this build measures alone; accepted: flex{}",
                if cfg!(feature = "cuda") {
                    ", cuda"
                } else {
                    " (cuda needs --features cuda)"
                }
            );
            std::process::exit(2)
        }
    }
    let mut c = Criterion::default()
        .configure_from_args()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for (setting, (id, _)) in SETTINGS.iter().enumerate() {
        configure_setting(setting);
        bench_all(&mut c, id, setting == 0);
    }
    c.final_summary();

    println!("\n| benchmark | spilled side | plain (ns) | spill (ns) | added (ns) | ratio |");
    println!("|---|---|---:|---:|---:|---:|");
    for name in [
        "add_16x16",
        "matmul_64x64",
        "cnn_train_step",
        "transformer_train_step",
    ] {
        for (id, what) in SETTINGS {
            if let (Some(plain), Some(spill)) = (
                mean_ns(&format!("{name}/flex")),
                mean_ns(&format!("{name}/{id}")),
            ) {
                println!(
                    "| {name} | {what} | {plain:.0} | {spill:.0} | {:.0} | {:.4} |",
                    spill - plain,
                    spill / plain
                );
            }
        }
    }
    let rounds = 101;
    println!("\nPaired: median spill/plain ratio over {rounds} alternating steps");
    for (setting, (_, what)) in SETTINGS.iter().enumerate() {
        configure_setting(setting);
        println!(
            "- {what}: cnn_train_step {:.4}, transformer_train_step {:.4}",
            paired_step::<Flex, SmallCnn<_>, SmallCnn<_>>(rounds, false),
            paired_step::<Flex, TinyGpt<_>, TinyGpt<_>>(rounds, false)
        );
    }
    // Marked steps, as a `Learner` marks them: under a budget the tape then only counts the
    // ops of its verified steps while memory is ample (see README, the tape).
    configure_setting(SETTINGS.len() - 1);
    println!(
        "- {}, steps marked: cnn_train_step {:.4}, transformer_train_step {:.4}",
        SETTINGS[SETTINGS.len() - 1].1,
        paired_step::<Flex, SmallCnn<_>, SmallCnn<_>>(rounds, true),
        paired_step::<Flex, TinyGpt<_>, TinyGpt<_>>(rounds, true)
    );
    configure(SpillConfig::default());
    println!(
        "- cnn_train_step, tape recording every step in full: median on/off ratio = {:.4}",
        paired_recording_ratio(rounds, 1)
    );
    println!(
        "- cnn_train_step, tape with the default resampling (verify steps, record every 100th): median on/off ratio = {:.4}",
        paired_recording_ratio(rounds, 100)
    );
    #[cfg(feature = "wgpu")]
    cubecl_rows::<burn::backend::Wgpu>("Wgpu", 31);
}
