//! The victim policies on real training: for the small CNN and the small Transformer at budgets
//! of 100/75/50/30% of the plain peak, each policy's step-time ratio against plain Flex and the
//! bytes it moved per step, in one run; and those bytes against Belady's MIN computed offline on
//! the same recorded step (`burn_spill::policy::replay`). Prints a markdown table at the end.
//!
//! ```text
//! cargo bench --bench policies            # about a minute on two cores
//! cargo bench --bench policies -- --test  # smoke run: one round per configuration
//! POLICIES_SAVE_TAPES=target/plan cargo bench --bench policies  # also saves the two steps
//! ```
//!
//! How it measures:
//! - The plain peak is the device peak of the spilled trainer with no budget (it only counts).
//! - Each configuration trains a plain model and a spilled one side by side from the same seed,
//!   with a step marker around each spilled step; warm-up steps let the tape find the repeating
//!   step (Adam's first step differs) and the leads settle.
//! - Step-time ratio: the median over rounds of one plain and one spilled step, alternating
//!   which goes first, so that drift on a shared machine hits both alike.
//! - Bytes moved: the spilled device's traffic in the last measured step (all four directions).
//! - MIN: the last recorded step replayed offline under the same budget with Belady's rule, and
//!   under the preset's spill threshold (where the engine brings the device after each op, to
//!   keep headroom for the next op); "replay" is the same replay with the policy itself.
//!   Runtime bytes can exceed the replay's because the engine keeps that headroom and moves
//!   ahead of need.
//! - Every loss of the spilled run is compared bit for bit with the plain run.
//!
//! A second table compares swap only, recompute only and both (`SpillConfig::recompute`) at 50%
//! and 30% under `next_use`: step time, bytes moved and the rebuilds per step with their time.
//! A third gives the dry-run planner's prediction for the same recorded steps on `h200-pcie5`
//! (`burn_spill::plan::dry_run_over_budget`, `cost_aware`) at 50%, 33% and 25% of the step's
//! unlimited peak there, per mode: the step-time overhead, the bytes moved and the rebuilds
//! (and under `both` and `recompute`, the behaviour their dry run chose: `RecomputeMode::Both`).
//! These models are tiny, so on an H200 their kernels are launch-bound; the GPU-scale models'
//! predictions are `scripts/plan-gpu-scale.sh`'s (docs/planner.md).
//!
//! Criterion also times the CNN step on plain Flex and under each policy at 50%.

#[path = "../examples/common/small_models.rs"]
mod small_models;

use std::time::{Duration, Instant};

use burn::backend::{Autodiff, Flex};
use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{Adam, AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Tensor};
use burn_spill::plan::{DeviceProfile, dry_run_over_budget};
use burn_spill::policy::replay;
use burn_spill::tape::StepTape;
use burn_spill::{DeviceBudget, PolicyKind, RecomputeMode, SpillBackend, SpillConfig};
use criterion::Criterion;
use small_models::{SmallCnn, TinyGpt, cnn_batch, gpt_batch};

type Plain = Autodiff<Flex>;
type Spilled = Autodiff<SpillBackend<Flex>>;
type Spill = SpillBackend<Flex>;

const BUDGETS_PERCENT: [u64; 4] = [100, 75, 50, 30];
const POLICIES: [PolicyKind; 3] = [PolicyKind::Lru, PolicyKind::NextUse, PolicyKind::CostAware];
const WARM_UP_STEPS: usize = 5;
const RECOMPUTE_BUDGETS_PERCENT: [u64; 2] = [50, 30];
const RECOMPUTE_MODES: [RecomputeMode; 3] = [
    RecomputeMode::Swap,
    RecomputeMode::Recompute,
    RecomputeMode::Both,
];

/// A model the bench can train: its loss on step `step`'s batch and its learning rate.
trait Trained<B: AutodiffBackend>: AutodiffModule<B> + Clone {
    const NAME: &'static str;
    const LEARNING_RATE: f64;
    fn init(device: &B::Device) -> Self;
    fn step_loss(&self, step: usize, device: &B::Device) -> Tensor<B, 1>;
    fn config() -> SpillConfig;
}

impl<B: AutodiffBackend> Trained<B> for SmallCnn<B> {
    const NAME: &'static str = "cnn";
    const LEARNING_RATE: f64 = 1e-2;
    fn init(device: &B::Device) -> Self {
        SmallCnn::new(device)
    }
    fn step_loss(&self, step: usize, device: &B::Device) -> Tensor<B, 1> {
        let (images, labels) = cnn_batch::<B>(8, step, device);
        self.loss(images, labels)
    }
    fn config() -> SpillConfig {
        SpillConfig::cnn()
    }
}

impl<B: AutodiffBackend> Trained<B> for TinyGpt<B> {
    const NAME: &'static str = "transformer";
    const LEARNING_RATE: f64 = 3e-3;
    fn init(device: &B::Device) -> Self {
        TinyGpt::new(device)
    }
    fn step_loss(&self, step: usize, device: &B::Device) -> Tensor<B, 1> {
        self.loss(gpt_batch::<B>(8, step, device))
    }
    fn config() -> SpillConfig {
        SpillConfig::transformer()
    }
}

/// A model, its optimizer and its step count.
struct Trainer<B: AutodiffBackend, M: Trained<B>> {
    model: Option<M>,
    optim: OptimizerAdaptor<Adam, M, B>,
    step: usize,
    device: B::Device,
}

impl<B: AutodiffBackend, M: Trained<B>> Trainer<B, M> {
    fn new(seed: u64) -> Self {
        let device = B::Device::default();
        B::seed(&device, seed);
        let model = M::init(&device);
        // Parameters are initialised lazily, at first use: draw them now, while the seed holds,
        // so that two trainers made one after the other start from the same weights.
        small_models::parameter_data::<B, M>(&model);
        Self {
            model: Some(model),
            optim: AdamConfig::new().init(),
            step: 0,
            device,
        }
    }

    /// One training step: its loss and wall time.
    fn step(&mut self) -> (f32, Duration) {
        let start = Instant::now();
        // Dropout draws from the backend's one global generator, and the plain and spilled
        // steps interleave: each step starts from its own seed so both draw the same masks.
        B::seed(&self.device, 1_000 + self.step as u64);
        let model = self.model.take().expect("a model between steps");
        let loss = model.step_loss(self.step, &self.device);
        let value: f32 = loss.clone().into_scalar().elem();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        self.model = Some(self.optim.step(M::LEARNING_RATE, model, grads));
        self.step += 1;
        (value, start.elapsed())
    }
}

/// One spilled step between markers.
fn marked_step<M: Trained<Spilled>>(trainer: &mut Trainer<Spilled, M>) -> (f32, Duration) {
    let device = Default::default();
    Spill::step_begin(&device);
    let out = trainer.step();
    Spill::step_end(&device);
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The plain peak: the spilled trainer's device peak with no budget, over three steps.
fn plain_peak<M: Trained<Spilled>>() -> u64 {
    let device = Default::default();
    Spill::configure(&device, SpillConfig::default()).unwrap();
    let mut trainer = Trainer::<Spilled, M>::new(7);
    for _ in 0..3 {
        trainer.step();
    }
    drop(trainer);
    Spill::stats(&device).peak.device
}

struct Row {
    model: &'static str,
    percent: u64,
    policy: PolicyKind,
    recompute: RecomputeMode,
    ratio: f64,
    moved: u64,
    min: u64,
    /// MIN under the spill threshold, where the engine brings the device after each op.
    min_at_threshold: u64,
    simulated: u64,
    hit_rate: Option<f64>,
    /// Rebuilds per measured step, and their time per step.
    rebuilt: f64,
    rebuild_time: Duration,
    /// Under `both` and `recompute`: the behaviour their dry run chose for the last plan.
    behaviour: Option<burn_spill::policy::recompute::Behaviour>,
}

fn measure<M>(
    percent: u64,
    policy: PolicyKind,
    recompute: RecomputeMode,
    peak: u64,
    rounds: usize,
) -> Row
where
    M: Trained<Spilled> + TrainedPair,
{
    let device = Default::default();
    let budget = peak * percent / 100;
    let config = M::config()
        .policy(policy)
        .recompute(recompute)
        .device_budget_bytes(budget);
    let threshold = (budget as f64 * config.get_spill_threshold()) as u64;
    Spill::configure(&device, config).unwrap();
    let mut plain = Trainer::<Plain, M::Plain>::new(7);
    let mut spilled = Trainer::<Spilled, M>::new(7);
    for _ in 0..WARM_UP_STEPS {
        let (p, _) = plain.step();
        let (s, _) = marked_step(&mut spilled);
        assert_eq!(p.to_bits(), s.to_bits(), "losses differ in warm-up");
    }
    let before = Spill::stats(&device);
    let mut ratios = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let ((p, plain_time), (s, spilled_time)) = if round % 2 == 0 {
            let p = plain.step();
            (p, marked_step(&mut spilled))
        } else {
            let s = marked_step(&mut spilled);
            (plain.step(), s)
        };
        assert_eq!(p.to_bits(), s.to_bits(), "losses differ at round {round}");
        ratios.push(spilled_time.as_secs_f64() / plain_time.as_secs_f64());
    }
    let after = Spill::stats(&device);
    let tape = Spill::last_step(&device).expect("the tape recorded a step");
    let min = replay(&tape, budget, PolicyKind::NextUse).bytes_moved();
    let min_at_threshold = replay(&tape, threshold, PolicyKind::NextUse).bytes_moved();
    let simulated = replay(&tape, budget, policy).bytes_moved();
    let hits = after.prefetch_hits - before.prefetch_hits;
    let misses = after.prefetch_misses - before.prefetch_misses;
    let rebuilds = after.recompute.since(&before.recompute);
    Row {
        model: M::NAME,
        percent,
        policy,
        recompute,
        rebuilt: rebuilds.rebuilt as f64 / rounds as f64,
        rebuild_time: rebuilds.rebuild_time / rounds as u32,
        behaviour: after.recompute.behaviour,
        ratio: median(ratios),
        moved: after.last_step.map_or(0, |s| s.bytes_moved()),
        min,
        min_at_threshold,
        simulated,
        hit_rate: (hits + misses > 0).then(|| hits as f64 / (hits + misses) as f64),
    }
}

/// Names the plain-backend twin of a spilled model type.
trait TrainedPair {
    type Plain: Trained<Plain>;
}

impl TrainedPair for SmallCnn<Spilled> {
    type Plain = SmallCnn<Plain>;
}

impl TrainedPair for TinyGpt<Spilled> {
    type Plain = TinyGpt<Plain>;
}

fn rows_for<M>(rounds: usize) -> Vec<Row>
where
    M: Trained<Spilled> + TrainedPair,
{
    let peak = plain_peak::<M>();
    let mut rows = Vec::new();
    for percent in BUDGETS_PERCENT {
        for policy in POLICIES {
            rows.push(measure::<M>(
                percent,
                policy,
                RecomputeMode::Swap,
                peak,
                rounds,
            ));
        }
    }
    rows
}

/// Swap only, recompute only and both, under the tape-driven policy, where memory binds.
fn recompute_rows_for<M>(rounds: usize) -> Vec<Row>
where
    M: Trained<Spilled> + TrainedPair,
{
    let peak = plain_peak::<M>();
    let mut rows = Vec::new();
    for percent in RECOMPUTE_BUDGETS_PERCENT {
        for mode in RECOMPUTE_MODES {
            rows.push(measure::<M>(
                percent,
                PolicyKind::NextUse,
                mode,
                peak,
                rounds,
            ));
        }
    }
    rows
}

fn print_recompute_summary(rows: &[Row]) {
    println!();
    println!(
        "| model | budget | recompute | step time vs plain | bytes moved / step | rebuilds / step | rebuild time / step | prefetch hits |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for r in rows {
        println!(
            "| {} | {}% | {}{} | {:.3} | {} | {:.1} | {:.1} us | {} |",
            r.model,
            r.percent,
            r.recompute,
            r.behaviour.map_or(String::new(), |b| format!(" ({b})")),
            r.ratio,
            r.moved,
            r.rebuilt,
            r.rebuild_time.as_secs_f64() * 1e6,
            r.hit_rate
                .map_or("-".into(), |h| format!("{:.1}%", h * 100.0)),
        );
    }
}

const PREDICTED_PROFILE: &str = "h200-pcie5";
const PREDICTED_BUDGETS_PERCENT: [u64; 3] = [50, 33, 25];

/// The planner's predicted overhead of `tape` on [`PREDICTED_PROFILE`] per budget and mode,
/// under `config` (the model's preset) with `cost_aware`.
fn print_predicted(model: &str, tape: &StepTape, config: SpillConfig) {
    let profile = DeviceProfile::builtin(PREDICTED_PROFILE).unwrap();
    let config = config.policy(PolicyKind::CostAware);
    let unlimited = dry_run_over_budget(
        tape,
        &profile,
        &config.clone().device_budget(DeviceBudget::Unlimited),
    )
    .expect("a valid config");
    for percent in PREDICTED_BUDGETS_PERCENT {
        let budget = unlimited.unlimited_peak * percent / 100;
        let cells: Vec<String> = RECOMPUTE_MODES
            .iter()
            .map(|&mode| {
                let run = dry_run_over_budget(
                    tape,
                    &profile,
                    &config.clone().recompute(mode).device_budget_bytes(budget),
                )
                .expect("a valid config");
                let chose = run
                    .chose
                    .map_or(String::new(), |behaviour| format!("; {behaviour}"));
                format!(
                    "{:+.1}% ({} B, {} rebuilds{chose})",
                    run.overhead * 100.0,
                    run.simulated.traffic.total(),
                    run.simulated.rebuilds
                )
            })
            .collect();
        println!("| {model} | {percent}% | {} |", cells.join(" | "));
    }
}

fn ratio_of(moved: u64, min: u64) -> String {
    match (moved, min) {
        (0, 0) => "1.00".into(),
        (_, 0) => "n/a (MIN moves 0)".into(),
        _ => format!("{:.2}", moved as f64 / min as f64),
    }
}

fn print_summary(rows: &[Row]) {
    println!();
    println!(
        "| model | budget | policy | step time vs plain | bytes moved / step | Belady MIN | moved / MIN | moved / MIN at threshold | replay / MIN | prefetch hits |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for r in rows {
        println!(
            "| {} | {}% | {} | {:.3} | {} | {} | {} | {} | {} | {} |",
            r.model,
            r.percent,
            r.policy,
            r.ratio,
            r.moved,
            r.min,
            ratio_of(r.moved, r.min),
            ratio_of(r.moved, r.min_at_threshold),
            ratio_of(r.simulated, r.min),
            r.hit_rate
                .map_or("-".into(), |h| format!("{:.1}%", h * 100.0)),
        );
    }
}

fn criterion_steps(c: &mut Criterion) {
    let device = Default::default();
    let peak = plain_peak::<SmallCnn<Spilled>>();
    let mut group = c.benchmark_group("cnn_step_at_50_percent");
    let mut plain = Trainer::<Plain, SmallCnn<Plain>>::new(7);
    group.bench_function("plain", |b| b.iter(|| plain.step()));
    for policy in POLICIES {
        Spill::configure(
            &device,
            SpillConfig::cnn()
                .policy(policy)
                .device_budget_bytes(peak / 2),
        )
        .unwrap();
        let mut spilled = Trainer::<Spilled, SmallCnn<Spilled>>::new(7);
        for _ in 0..WARM_UP_STEPS {
            marked_step(&mut spilled);
        }
        group.bench_function(policy.to_string(), |b| b.iter(|| marked_step(&mut spilled)));
    }
    group.finish();
    Spill::configure(&device, SpillConfig::default()).unwrap();
}

fn main() {
    let smoke = std::env::args().any(|a| a == "--test");
    let rounds = if smoke { 1 } else { 15 };
    let mut criterion = Criterion::default().configure_from_args();
    if !smoke {
        criterion_steps(&mut criterion);
    }
    let mut rows = rows_for::<SmallCnn<Spilled>>(rounds);
    rows.extend(rows_for::<TinyGpt<Spilled>>(rounds));
    let device = Default::default();
    let mut recompute_rows = recompute_rows_for::<SmallCnn<Spilled>>(rounds);
    let cnn_tape = Spill::last_step(&device).expect("the CNN's step was recorded");
    recompute_rows.extend(recompute_rows_for::<TinyGpt<Spilled>>(rounds));
    let gpt_tape = Spill::last_step(&device).expect("the Transformer's step was recorded");
    Spill::configure(&device, SpillConfig::default()).unwrap();
    if let Some(dir) = std::env::var_os("POLICIES_SAVE_TAPES") {
        // The recorded steps the predicted table comes from, for the `plan` example.
        let dir = std::path::PathBuf::from(dir);
        std::fs::create_dir_all(&dir).expect("the tape directory can be made");
        for (name, tape) in [("cnn", &cnn_tape), ("transformer", &gpt_tape)] {
            let path = dir.join(format!("{name}.json"));
            std::fs::write(&path, burn_spill::tape::to_json(tape))
                .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        }
    }
    print_summary(&rows);
    print_recompute_summary(&recompute_rows);
    println!();
    println!(
        "Predicted on {PREDICTED_PROFILE} (dry run, cost_aware): overhead over unlimited, bytes moved, rebuilds"
    );
    println!();
    println!("| model | budget | swap | recompute | both |");
    println!("| --- | --- | --- | --- | --- |");
    print_predicted(
        SmallCnn::<Spilled>::NAME,
        &cnn_tape,
        SmallCnn::<Spilled>::config(),
    );
    print_predicted(
        TinyGpt::<Spilled>::NAME,
        &gpt_tape,
        TinyGpt::<Spilled>::config(),
    );
    criterion.final_summary();
}
