//! The CubeCL path, on wgpu (Mesa's lavapipe in CI): `SpillBackend<CubeBackend<WgpuRuntime>>`
//! (unfused) and, with the `fusion` feature, `SpillBackend<Fusion<CubeBackend<..>>>` (what
//! `burn::backend::Wgpu` is under burn's default features), each against the same plain backend
//! bit for bit.
//!
//! CubeCL gives every thread its own stream and, on wgpu, every stream its own memory pool, and
//! defers submission: the asynchronous engine's workers must order their device work with the
//! op thread's queued kernels (`src/engine/queues.rs`). A CPU backend cannot show any of this,
//! which is why these tests exist beside the Flex ones.
//!
//! Every test skips with a printed reason when no wgpu adapter can be opened (no Vulkan driver):
//! `.ci/run` installs lavapipe, so CI always runs them. With `--features cuda` the same suites
//! run on CUDA (`scripts/gpu-check.sh`), where fused kernels round by where the stream is
//! drained (see `rounds_by_drain_points`): there the trainings under a binding budget are held
//! to that rounding rather than to plain's bits, and the unbudgeted runs to plain's bits.
#![cfg(any(feature = "wgpu", feature = "cuda"))]

mod cubecl_support;
#[path = "../examples/common/small_models.rs"]
mod small_models;

use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use burn_spill::{PolicyKind, SpillBackend, SpillConfig, SpillStats};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use cubecl_support::*;
use small_models::{TrainRun, train_cnn_observed, train_gpt_observed};

#[derive(Clone, Copy, Debug)]
enum Model {
    Cnn,
    Gpt,
}

const STEPS: usize = 8;

/// Batch of the trained models: 32 by default (at 4, every prefetch is cheap enough to run on
/// the op thread and the workers' ordering goes untested), `CUBECL_BATCH` to change it.
fn batch() -> usize {
    std::env::var("CUBECL_BATCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32)
}

/// Trains `model` on `Autodiff<I>` (a plain backend or a spilled one), with a step marker after
/// every optimizer step so that the tape plans the next.
fn train<I: Backend>(model: Model, device: &I::Device, mark: impl Fn()) -> TrainRun {
    match model {
        Model::Cnn => train_cnn_observed::<Autodiff<I>>(device, STEPS, batch(), |_| mark()),
        Model::Gpt => train_gpt_observed::<Autodiff<I>>(device, STEPS, batch(), |_| mark()),
    }
}

/// The device peak of the spilled model with no budget, and its run.
fn unlimited_peak<I: Backend>(model: Model, device: &I::Device) -> (u64, TrainRun) {
    SpillBackend::<I>::configure(device, SpillConfig::default()).unwrap();
    SpillBackend::<I>::reset_peaks(device);
    let run = train::<SpillBackend<I>>(model, device, || {});
    (SpillBackend::<I>::stats(device).peak.device, run)
}

/// The plain run of `model`, 30% of its unlimited peak under `SpillBackend<I>`, and its preset.
fn plain_run_at_30_percent<I: Backend>(
    model: Model,
    device: &I::Device,
) -> (TrainRun, u64, SpillConfig) {
    let plain = train::<I>(model, device, || {});
    let (peak, unlimited) = unlimited_peak::<I>(model, device);
    // Nothing is evicted, so nothing drains the stream where plain does not: bit for bit on
    // every backend, fused CUDA included.
    assert_identical(&plain, &unlimited, &format!("{model:?} with no budget"));
    let budget = peak * 3 / 10;
    let preset = match model {
        Model::Cnn => SpillConfig::cnn(),
        Model::Gpt => SpillConfig::transformer(),
    };
    (plain, budget, preset)
}

/// Trains `model` on plain `I` and on `SpillBackend<I>` at 30% of its peak with the tape and
/// prefetch on, under every policy, asynchronous and synchronous: all bit-identical.
fn training_is_exact<I: Backend>(model: Model) -> Vec<(String, SpillStats)> {
    let device = I::Device::default();
    let _reset = Reset::<I>(device.clone());
    let (plain, budget, preset) = plain_run_at_30_percent::<I>(model, &device);
    let mut all = Vec::new();
    let start = SpillBackend::<I>::stats(&device);
    // `None`: LRU with no tape and no prefetch, so that the asynchronous workers only evict.
    for policy in [
        Some(PolicyKind::Lru),
        Some(PolicyKind::NextUse),
        Some(PolicyKind::CostAware),
        None,
    ] {
        for asynchronous in [true, false] {
            let name = policy.map_or("lru without tape or prefetch".into(), |p| p.to_string());
            let what = format!("{model:?} at 30% ({budget} B), {name}, async {asynchronous}");
            if let Ok(only) = std::env::var("CUBECL_ONLY")
                && !what.contains(&only)
            {
                continue;
            }
            let config = match policy {
                Some(policy) => preset.clone().policy(policy),
                None => preset.clone().policy(PolicyKind::Lru).prefetch_window(0),
            }
            .device_budget_bytes(budget)
            .asynchronous(asynchronous);
            SpillBackend::<I>::configure(&device, config).unwrap();
            let marked = policy.is_some();
            if !marked {
                // Earlier runs' markers turned the tape on.
                SpillBackend::<I>::record_tape(&device, false);
            }
            let before = SpillBackend::<I>::stats(&device);
            let spilled = train::<SpillBackend<I>>(model, &device, || {
                if marked {
                    SpillBackend::<I>::step_begin(&device)
                }
            });
            if marked {
                SpillBackend::<I>::step_end(&device);
            }
            let stats = SpillBackend::<I>::stats(&device);
            assert!(
                stats.device_to_host.count > before.device_to_host.count,
                "{what}: nothing was spilled"
            );
            assert_eq!(
                stats.prefetches_issued > before.prefetches_issued,
                marked,
                "{what}: prefetches"
            );
            assert_matches_plain::<I>(&plain, &spilled, &what);
            all.push((what, stats));
        }
    }
    // Informational (tests assert no timings): how long ops waited for bytes in each run, with
    // the workers on and off. The counters add up over runs; each line is its run's share.
    let mut before = start;
    for (what, stats) in &all {
        let pool = stats
            .pool
            .map_or("-".into(), |p| format!("{} B", p.peak_reserved));
        eprintln!(
            "{what}: stall {:.1} ms, {} evictions, {} prefetches, peak reserved {pool}",
            (stats.stall_time - before.stall_time).as_secs_f64() * 1e3,
            stats.device_to_host.count - before.device_to_host.count,
            stats.prefetches_issued - before.prefetches_issued
        );
        before = stats.clone();
    }
    all
}

/// Training at 30% with victims dropped and rebuilt from their recipes (with the preset's
/// prefetch), synchronous and asynchronous: a rebuild runs the kernel again on the op thread's
/// stream, and a drop on a worker frees on that stream too. The asynchronous runs weigh each
/// rebuild against a move (`both`) with the default GPU profile's kernel times, as a CubeCL
/// backend does unless told otherwise, under `next_use` and under `cost_aware` (the presets'
/// policy, which also ranks victims by the cheaper of the two while the link is busy: their
/// rebuild costs are read on the workers' passes too); the synchronous one drops what it may.
/// Two more asynchronous runs drop what they may with room for the rebuilds made beside the
/// prefetches and in the prefetch walk (`SpillConfig::rebuild_room`), which `both` may choose:
/// those change which prefetches the workers run, and when. The last keeps the step's state on
/// the device (`SpillConfig::keep_state`), which `both` may choose too: the workers then move
/// activations where they would have moved parameters and optimizer state.
fn training_with_recompute_is_exact<I: Backend>(model: Model) {
    use burn_spill::RecomputeMode;
    use burn_spill::policy::recompute::RebuildRoom;
    let device = I::Device::default();
    let _reset = Reset::<I>(device.clone());
    let (plain, budget, preset) = plain_run_at_30_percent::<I>(model, &device);
    for (asynchronous, mode, policy, room, keep_state) in [
        (true, RecomputeMode::Both, PolicyKind::NextUse, None, None),
        (
            false,
            RecomputeMode::Recompute,
            PolicyKind::NextUse,
            None,
            None,
        ),
        (true, RecomputeMode::Both, PolicyKind::CostAware, None, None),
        (
            true,
            RecomputeMode::Recompute,
            PolicyKind::CostAware,
            Some(RebuildRoom::BesidePrefetches),
            None,
        ),
        (
            true,
            RecomputeMode::Recompute,
            PolicyKind::CostAware,
            Some(RebuildRoom::InPrefetchWalk),
            None,
        ),
        (
            true,
            RecomputeMode::Recompute,
            PolicyKind::CostAware,
            None,
            Some(true),
        ),
    ] {
        let what = format!(
            "{model:?} at 30% ({budget} B), {mode}, {policy}, async {asynchronous}, rebuild room {room:?}, keep state {keep_state:?}"
        );
        let mut config = preset
            .clone()
            .policy(policy)
            .recompute(mode)
            .device_budget_bytes(budget)
            .asynchronous(asynchronous);
        if let Some(room) = room {
            config = config.rebuild_room(room);
        }
        if let Some(keep) = keep_state {
            config = config.keep_state(keep);
        }
        SpillBackend::<I>::configure(&device, config).unwrap();
        let before = SpillBackend::<I>::stats(&device);
        let spilled =
            train::<SpillBackend<I>>(model, &device, || SpillBackend::<I>::step_begin(&device));
        SpillBackend::<I>::step_end(&device);
        let stats = SpillBackend::<I>::stats(&device).since(&before);
        assert_matches_plain::<I>(&plain, &spilled, &what);
        eprintln!("{what}: {:?}", stats.recompute);
        assert!(
            stats.recompute.rebuilt > 0,
            "{what}: nothing was dropped and rebuilt: {:?}",
            stats.recompute
        );
        assert_eq!(stats.recompute.dropped_now_bytes, 0, "{what}");
    }
}

// ---------------------------------------------------------------------------------------------
// Random op programs.
// ---------------------------------------------------------------------------------------------

/// One instruction over a register file of f32 matrices and i32 vectors.
#[derive(Debug, Clone)]
enum Inst {
    Create {
        rows: usize,
        seed: u8,
    },
    Exp(usize),
    Add(usize, usize),
    MulScalar(usize, i8),
    Matmul(usize, usize),
    /// A strided view: a transpose is a stride change on CubeCL.
    Transpose(usize),
    Slice(usize),
    SumDim(usize),
    Argmax(usize),
    Clone(usize),
    /// Drops a register on another thread.
    DropElsewhere(usize),
    Read(usize),
}

/// How often [`inst_drawn`] draws each instruction, relative to the others.
struct Weights {
    create: u32,
    exp: u32,
    add: u32,
    mul_scalar: u32,
    matmul: u32,
    transpose: u32,
    slice: u32,
    sum_dim: u32,
    argmax: u32,
    clone: u32,
    drop_elsewhere: u32,
    read: u32,
}

/// Every instruction about as often as every other (creations, matmuls and views twice).
const EVERY_OP: Weights = Weights {
    create: 2,
    exp: 1,
    add: 1,
    mul_scalar: 1,
    matmul: 2,
    transpose: 2,
    slice: 1,
    sum_dim: 1,
    argmax: 1,
    clone: 1,
    drop_elsewhere: 1,
    read: 1,
};

fn inst() -> impl Strategy<Value = Inst> {
    inst_drawn(EVERY_OP)
}

fn inst_drawn(w: Weights) -> impl Strategy<Value = Inst> {
    let r = 0usize..16;
    prop_oneof![
        w.create => (1usize..5, any::<u8>()).prop_map(|(rows, seed)| Inst::Create { rows, seed }),
        w.exp => r.clone().prop_map(Inst::Exp),
        w.add => (r.clone(), r.clone()).prop_map(|(a, b)| Inst::Add(a, b)),
        w.mul_scalar => (r.clone(), any::<i8>()).prop_map(|(a, s)| Inst::MulScalar(a, s)),
        w.matmul => (r.clone(), r.clone()).prop_map(|(a, b)| Inst::Matmul(a, b)),
        w.transpose => r.clone().prop_map(Inst::Transpose),
        w.slice => r.clone().prop_map(Inst::Slice),
        w.sum_dim => r.clone().prop_map(Inst::SumDim),
        w.argmax => r.clone().prop_map(Inst::Argmax),
        w.clone => r.clone().prop_map(Inst::Clone),
        w.drop_elsewhere => r.clone().prop_map(Inst::DropElsewhere),
        w.read => r.prop_map(Inst::Read),
    ]
}

enum Reg<B: Backend> {
    F(Tensor<B, 2>),
    I(Tensor<B, 1, Int>),
}

/// How a program transposes a matrix with a dimension of 1 (a "thin" one).
///
/// Burn 0.21's fusion computes elementwise ops on such a transposed view wrongly in some
/// programs, depending on where the stream is drained (`fusion_miscompiles_after_a_read` and
/// `fusion_miscompiles_a_transposed_reduction` show it on plain fused wgpu). A read drains it,
/// and burn-spill reads whenever it evicts, so on a fused backend the spilled run meets the
/// miscompile at other places than plain does. The fused suites therefore reshape thin
/// matrices instead (the same values, contiguous); every other transpose stays a view.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Thin {
    Transpose,
    Reshape,
}

fn transposed<B: Backend>(t: Tensor<B, 2>, thin: Thin) -> Tensor<B, 2> {
    let [rows, cols] = t.dims();
    match thin {
        Thin::Reshape if rows == 1 || cols == 1 => t.reshape([cols, rows]),
        _ => t.transpose(),
    }
}

/// Runs `program` on `B`: every read in order, then every register left.
fn run<B: Backend>(program: &[Inst], thin: Thin) -> Vec<TensorData> {
    run_draining::<B>(program, thin, |_| false)
}

/// [`run`], with `B::sync` (which drains a lazy backend's stream: burn-fusion executes what it
/// has queued) after every instruction `drain_after` picks.
fn run_draining<B: Backend>(
    program: &[Inst],
    thin: Thin,
    drain_after: impl Fn(usize) -> bool,
) -> Vec<TensorData> {
    let device = B::Device::default();
    let mut regs: Vec<Reg<B>> = Vec::new();
    let mut out = Vec::new();
    let float = |regs: &[Reg<B>], k: usize| -> Option<Tensor<B, 2>> {
        let floats: Vec<_> = regs
            .iter()
            .filter_map(|r| match r {
                Reg::F(t) => Some(t.clone()),
                Reg::I(_) => None,
            })
            .collect();
        (!floats.is_empty()).then(|| floats[k % floats.len()].clone())
    };
    for (at, inst) in program.iter().enumerate() {
        let made = match *inst {
            Inst::Create { rows, seed } => {
                let values: Vec<f32> = (0..rows * 4)
                    .map(|i| ((i * 7 + seed as usize) % 17) as f32 * 0.125 - 1.0)
                    .collect();
                Some(Reg::F(Tensor::from_data(
                    TensorData::new(values, [rows, 4]),
                    &device,
                )))
            }
            Inst::Exp(a) => float(&regs, a).map(|t| Reg::F(t.clamp(-4.0, 4.0).exp())),
            Inst::Add(a, b) => match (float(&regs, a), float(&regs, b)) {
                (Some(x), Some(y)) if x.dims() == y.dims() => Some(Reg::F(x + y)),
                (Some(x), _) => Some(Reg::F(x.add_scalar(1.0))),
                _ => None,
            },
            Inst::MulScalar(a, s) => float(&regs, a).map(|t| Reg::F(t.mul_scalar(s as f32 / 64.0))),
            Inst::Matmul(a, b) => match (float(&regs, a), float(&regs, b)) {
                (Some(x), Some(y)) if x.dims()[1] == y.dims()[0] => Some(Reg::F(x.matmul(y))),
                (Some(x), _) => Some(Reg::F(x.clone().matmul(transposed(x, thin)))),
                _ => None,
            },
            Inst::Transpose(a) => float(&regs, a).map(|t| Reg::F(transposed(t, thin))),
            Inst::Slice(a) => float(&regs, a).map(|t| {
                let [rows, cols] = t.dims();
                Reg::F(t.slice([0..rows.div_ceil(2), 0..cols]))
            }),
            Inst::SumDim(a) => float(&regs, a).map(|t| Reg::F(t.sum_dim(1))),
            Inst::Argmax(a) => float(&regs, a).map(|t| Reg::I(t.argmax(1).flatten(0, 1))),
            Inst::Clone(a) if !regs.is_empty() => Some(match &regs[a % regs.len()] {
                Reg::F(t) => Reg::F(t.clone()),
                Reg::I(t) => Reg::I(t.clone()),
            }),
            Inst::DropElsewhere(a) if !regs.is_empty() => {
                let gone = regs.remove(a % regs.len());
                std::thread::spawn(move || drop(gone)).join().unwrap();
                None
            }
            Inst::Read(a) if !regs.is_empty() => {
                out.push(match &regs[a % regs.len()] {
                    Reg::F(t) => t.clone().into_data(),
                    Reg::I(t) => t.clone().into_data(),
                });
                None
            }
            _ => None,
        };
        if let Some(reg) = made {
            regs.push(reg);
            if regs.len() > 10 {
                regs.remove(0);
            }
        }
        if drain_after(at) {
            B::sync(&device).unwrap();
        }
    }
    for reg in regs {
        out.push(match reg {
            Reg::F(t) => t.into_data(),
            Reg::I(t) => t.into_data(),
        });
    }
    out
}

/// How the reads of `SpillBackend<I>` compare with plain `I`'s.
///
/// Plain `I` is the oracle, with exceptions that are upstream's. Burn 0.21's fusion computes
/// some programs wrongly, and which ones depends on where its stream is drained
/// (`fusion_miscompiles_after_a_read`, `fusion_miscompiles_a_transposed_reduction`). A read
/// drains it, and so does a drop on another thread (burn-fusion syncs the tensor's stream);
/// burn-spill reads whenever it evicts, so on a fused backend it drains at other places than
/// plain does. A spilled read that differs from plain is therefore allowed only when:
/// - it equals `R`'s (`I` without fusion) and plain `I`'s does not: plain was wrong; or
/// - plain `I` itself changes when its stream is drained after some instruction: the program
///   is one whose result fusion does not define, and nothing can be compared on it.
///
/// Both are counted and printed. On unfused backends neither happens, so every difference
/// fails; on fused ones every difference fails unless plain fused is shown wrong or unstable.
struct Oracle<'a> {
    plain: &'a [TensorData],
    reference: &'a dyn Fn() -> Vec<TensorData>,
    reference_reads: std::cell::OnceCell<Vec<TensorData>>,
    drain_sensitive: &'a dyn Fn() -> bool,
    drain_sensitive_seen: std::cell::OnceCell<bool>,
}

/// What [`Oracle::judge`] let pass that plain did not compute.
#[derive(Default, Debug, Clone, Copy)]
struct Excused {
    /// Reads where the spilled run was right and plain fused was not.
    plain_wrong: usize,
    /// Runs of programs whose plain result changes with where the stream is drained.
    drain_sensitive: usize,
}

impl Excused {
    fn add(&mut self, other: Excused) {
        self.plain_wrong += other.plain_wrong;
        self.drain_sensitive += other.drain_sensitive;
    }
}

impl<'a> Oracle<'a> {
    fn new(
        plain: &'a [TensorData],
        reference: &'a dyn Fn() -> Vec<TensorData>,
        drain_sensitive: &'a dyn Fn() -> bool,
    ) -> Self {
        Self {
            plain,
            reference,
            reference_reads: Default::default(),
            drain_sensitive,
            drain_sensitive_seen: Default::default(),
        }
    }

    fn judge(&self, spilled: &[TensorData], what: &str) -> Result<Excused, String> {
        if self.plain.len() != spilled.len() {
            return Err(format!(
                "{what}: {} reads on plain, {} spilled",
                self.plain.len(),
                spilled.len()
            ));
        }
        let mut excused = Excused::default();
        for (k, (p, s)) in self.plain.iter().zip(spilled).enumerate() {
            if same_read(p, s) {
                continue;
            }
            let reference = self.reference_reads.get_or_init(|| (self.reference)());
            match reference.get(k) {
                Some(r) if same_read(r, s) && !same_read(r, p) => excused.plain_wrong += 1,
                _ if *self
                    .drain_sensitive_seen
                    .get_or_init(|| (self.drain_sensitive)()) =>
                {
                    excused.drain_sensitive += 1;
                    return Ok(excused);
                }
                _ => {
                    return Err(format!(
                        "{what}: read {k} differs: plain {p:?}, spilled {s:?}"
                    ));
                }
            }
        }
        Ok(excused)
    }
}

fn same_read(a: &TensorData, b: &TensorData) -> bool {
    a.shape == b.shape && a.as_bytes() == b.as_bytes()
}

fn same_reads(a: &[TensorData], b: &[TensorData]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same_read(x, y))
}

/// Whether plain `I`'s reads of `program` change when its stream is drained after one
/// instruction, for some instruction, or after every one.
fn drain_sensitive<I: Backend>(program: &[Inst], thin: Thin, plain: &[TensorData]) -> bool {
    let differs = |reads: Vec<TensorData>| !same_reads(&reads, plain);
    differs(run_draining::<I>(program, thin, |_| true))
        || (0..program.len()).any(|p| differs(run_draining::<I>(program, thin, |at| at == p)))
}

fn report_excused(excused: Excused, name: &str) {
    if excused.plain_wrong + excused.drain_sensitive > 0 {
        println!(
            "{name}: {} reads where plain was wrong and the spilled run right; {} runs of \
             programs whose plain result depends on where the stream is drained",
            excused.plain_wrong, excused.drain_sensitive
        );
    }
}

/// Runs random programs on plain `I` and on `SpillBackend<I>` under budgets 0, 256 B and
/// unlimited, with host limits 0 and unlimited, asynchronous (restores verified where the host
/// tier is in use) and synchronous; `R` is `I`
/// without fusion (see [`Oracle`]), `thin` how thin matrices are transposed (see [`Thin`]).
fn random_programs_are_exact<I: Backend, R: Backend>(cases: u32, thin: Thin) {
    let device = I::Device::default();
    let _reset = Reset::<I>(device.clone());
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = proptest::collection::vec(inst(), 1..40);
    let excused = std::cell::Cell::new(Excused::default());
    runner
        .run(&strategy, |program| {
            let plain = run::<I>(&program, thin);
            let reference = || run::<R>(&program, thin);
            let unstable = || drain_sensitive::<I>(&program, thin, &plain);
            let oracle = Oracle::new(&plain, &reference, &unstable);
            for budget in [Some(0), Some(256), None] {
                for host in [None, Some(0)] {
                    for asynchronous in [true, false] {
                        // Verified restores on the asynchronous runs with a host tier: the
                        // checksum is taken of burn-spill's own copy, off the staging pool.
                        let verify = asynchronous && host.is_none();
                        let mut config = SpillConfig::default()
                            .asynchronous(asynchronous)
                            .verify_restores(verify);
                        if let Some(b) = budget {
                            config = config.device_budget_bytes(b);
                        }
                        if let Some(h) = host {
                            config = config.host_limit_bytes(h);
                        }
                        SpillBackend::<I>::configure(&device, config).unwrap();
                        let spilled = run::<SpillBackend<I>>(&program, thin);
                        let what = format!(
                            "budget {budget:?}, host {host:?}, async {asynchronous}, verified {verify}"
                        );
                        match oracle.judge(&spilled, &what) {
                            Ok(more) => {
                                let mut all = excused.get();
                                all.add(more);
                                excused.set(all);
                            }
                            Err(e) => return Err(TestCaseError::fail(e)),
                        }
                        let live = SpillBackend::<I>::live(&device);
                        prop_assert_eq!((live.tensors, live.bytes), (0, 0), "{}: left alive", what);
                    }
                }
            }
            Ok(())
        })
        .unwrap();
    report_excused(excused.get(), &I::name(&device));
}

/// Times a program runs as a step under a budget with drops: marked, the first step is
/// recorded and the plan made from it drops in the rest; unmarked, the detector must first
/// confirm the program's period.
const MARKED_STEPS: usize = 4;
const UNMARKED_STEPS: usize = 12;

/// What [`random_programs_with_drops_are_exact`] draws for each case.
#[derive(Debug, Clone)]
struct DropCase {
    program: Vec<Inst>,
    /// The budget, in percent of the program's own peak through `SpillBackend<I>`.
    percent: u64,
    both: bool,
    asynchronous: bool,
    marked: bool,
}

/// Weights toward the ops whose outputs keep recipes (see `RECOMPUTABLE_OPS`), so
/// that more victims may be dropped: most of all the scalar multiply, whose input is a
/// register the program keeps (a fused backend rebuilds only from inputs still alive, so the
/// exp of a clamp, whose clamped input is let go at once, is dropped only where recipes keep
/// their inputs' recipes; and it does not rebuild adds: see `rebuilds_exactly`).
const DROPPABLE: Weights = Weights {
    create: 2,
    exp: 2,
    add: 2,
    mul_scalar: 5,
    matmul: 1,
    transpose: 1,
    slice: 1,
    sum_dim: 1,
    argmax: 1,
    clone: 1,
    drop_elsewhere: 1,
    read: 1,
};

fn drop_case() -> impl Strategy<Value = DropCase> {
    (
        proptest::collection::vec(inst_drawn(DROPPABLE), 20..60),
        0u64..100,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(program, percent, both, asynchronous, marked)| DropCase {
            program,
            percent,
            both,
            asynchronous,
            marked,
        })
}

/// Runs `case`'s program repeated as steps on `SpillBackend<I>` under `recompute` or `both`, a
/// tape-ranked policy and a budget below the program's peak, marked or not, asynchronous or
/// not: every run is judged against plain `I` by [`Oracle`] (`R` is `I` without fusion), and
/// afterwards nothing is left alive or dropped. Returns what was dropped and rebuilt.
fn program_with_drops_is_exact<I: Backend, R: Backend>(
    case: &DropCase,
    thin: Thin,
    excused: &mut Excused,
) -> Result<burn_spill::RecomputeStats, String> {
    use burn_spill::RecomputeMode;
    let device = I::Device::default();
    let verbose = std::env::var_os("CUBECL_DROPS_VERBOSE").is_some();
    if verbose {
        // Before the run: a panic in burn-fusion's stream leaves it broken for every later
        // run, so proptest's shrinking cannot name the program that caused it.
        println!("case {case:?}");
    }
    let program = &case.program;
    let plain = run::<I>(program, thin);
    let reference = || run::<R>(program, thin);
    let unstable = || drain_sensitive::<I>(program, thin, &plain);
    let oracle = Oracle::new(&plain, &reference, &unstable);
    SpillBackend::<I>::configure(&device, SpillConfig::default()).unwrap();
    let _ = run::<SpillBackend<I>>(program, thin);
    let peak = SpillBackend::<I>::stats(&device).peak.device;
    let budget = peak * case.percent / 100;
    let mode = if case.both {
        RecomputeMode::Both
    } else {
        RecomputeMode::Recompute
    };
    let config = SpillConfig::default()
        .device_budget_bytes(budget)
        .policy(PolicyKind::NextUse)
        .prefetch_window(2)
        .recompute(mode)
        .asynchronous(case.asynchronous);
    SpillBackend::<I>::configure(&device, config).unwrap();
    let before = SpillBackend::<I>::stats(&device);
    let steps = if case.marked {
        MARKED_STEPS
    } else {
        UNMARKED_STEPS
    };
    for step in 0..steps {
        if case.marked {
            SpillBackend::<I>::step_begin(&device);
        }
        let spilled = run::<SpillBackend<I>>(program, thin);
        if case.marked {
            SpillBackend::<I>::step_end(&device);
        }
        let what = format!(
            "{mode}, budget {budget} B ({}% of {peak} B), async {}, marked {}, step {step}",
            case.percent, case.asynchronous, case.marked
        );
        excused.add(oracle.judge(&spilled, &what)?);
    }
    let stats = SpillBackend::<I>::stats(&device).since(&before);
    if verbose {
        println!(
            "{} ops, {}% of {peak} B, {mode}, async {}, marked {}: moved {}, {:?}",
            program.len(),
            case.percent,
            case.asynchronous,
            case.marked,
            stats.device_to_host.count,
            stats.recompute
        );
    }
    let live = SpillBackend::<I>::live(&device);
    if (live.tensors, live.bytes) != (0, 0) {
        return Err(format!("{live:?} left alive"));
    }
    if stats.recompute.dropped_now_bytes != 0 {
        return Err(format!("still dropped: {:?}", stats.recompute));
    }
    Ok(stats.recompute)
}

/// A program that drops on every backend: three scalar multiples of a matrix the program
/// keeps, made first and read last, under half its peak. Each is a victim (used last) whose
/// recipe's input is alive, so `recompute` drops it rather than move it.
fn program_that_drops() -> DropCase {
    use Inst::*;
    DropCase {
        program: vec![
            Create { rows: 4, seed: 1 },
            MulScalar(0, 3),
            MulScalar(0, 5),
            MulScalar(0, 7),
            Create { rows: 4, seed: 2 },
            Exp(4),
            Read(1),
            Read(2),
            Read(3),
        ],
        percent: 50,
        both: false,
        asynchronous: true,
        marked: true,
    }
}

/// [`program_with_drops_is_exact`] on [`program_that_drops`], then on random programs:
/// returns how many tensors were dropped and rebuilt by the fixed program, and by all.
/// (`random_programs_are_exact` runs each program once, so no plan exists there and nothing is
/// dropped: this is where rebuilds meet CubeCL's streams and deferred work on random programs.
/// Random programs drop on a few in three cases unfused, one in ten fused, where rebuilds
/// rely on inputs the program still holds: the fixed program makes sure drops are tested.)
fn random_programs_with_drops_are_exact<I: Backend, R: Backend>(
    cases: u32,
    thin: Thin,
) -> (burn_spill::RecomputeStats, u64) {
    let device = I::Device::default();
    let _reset = Reset::<I>(device.clone());
    let mut excused = Excused::default();
    let fixed = program_with_drops_is_exact::<I, R>(&program_that_drops(), thin, &mut excused)
        .unwrap_or_else(|e| panic!("the program that drops: {e}"));
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let excused = std::cell::RefCell::new(excused);
    let dropped = std::cell::Cell::new(fixed.dropped);
    runner
        .run(&drop_case(), |case| {
            let stats = program_with_drops_is_exact::<I, R>(&case, thin, &mut excused.borrow_mut())
                .map_err(TestCaseError::fail)?;
            dropped.set(dropped.get() + stats.dropped);
            Ok(())
        })
        .unwrap();
    report_excused(excused.into_inner(), &I::name(&device));
    (fixed, dropped.get())
}

/// Programs that once failed, run several times each under every configuration (a failure
/// that depends on timing does not show on every run), judged by [`Oracle`].
fn known_programs_are_exact<I: Backend, R: Backend>(rounds: usize, thin: Thin) -> Excused {
    use Inst::*;
    let device = I::Device::default();
    let _reset = Reset::<I>(device.clone());
    // CI, fused wgpu, budget 0: the last read differed. Plain fused wgpu is what was wrong
    // (`fusion_miscompiles_a_transposed_reduction` is its core); the spilled run was right.
    let programs = [
        vec![
            Create { rows: 1, seed: 0 },
            Create { rows: 1, seed: 0 },
            DropElsewhere(0),
            Create { rows: 2, seed: 0 },
            SumDim(1),
            Argmax(0),
            Matmul(0, 1),
            Transpose(6),
            Create { rows: 4, seed: 233 },
            Create { rows: 2, seed: 136 },
            SumDim(1),
            SumDim(2),
            Clone(11),
            Clone(8),
            Transpose(4),
            MulScalar(1, 52),
            Slice(0),
            Matmul(14, 4),
        ],
        // A longer hunt, fused wgpu, budget 256 B: the sixth read differed, [x, 1, 1, 1] for an
        // `exp` of a thin transposed view after a drop on another thread (which drains the
        // stream). Plain fused wgpu gets it as wrong with a read where burn-spill evicted.
        vec![
            Create { rows: 4, seed: 0 },
            SumDim(0),
            Add(2, 0),
            Create { rows: 1, seed: 0 },
            DropElsewhere(11),
            Transpose(10),
            Transpose(6),
            Exp(8),
            Matmul(7, 0),
            SumDim(0),
        ],
        // A longer hunt, fused wgpu, budget 256 B: the ninth read differed, [x, 1, 1, 1] for an
        // `exp` of a thin transposed view. Plain fused wgpu gets it as wrong with one read more
        // (`fusion_miscompiles_after_a_read`).
        miscompiled_after_a_read(),
    ];
    let mut excused = Excused::default();
    for program in &programs {
        let plain = run::<I>(program, thin);
        let reference = || run::<R>(program, thin);
        let unstable = || drain_sensitive::<I>(program, thin, &plain);
        let oracle = Oracle::new(&plain, &reference, &unstable);
        for round in 0..rounds {
            for budget in [Some(0), Some(256), None] {
                for asynchronous in [true, false] {
                    let mut config = SpillConfig::default().asynchronous(asynchronous);
                    if let Some(b) = budget {
                        config = config.device_budget_bytes(b);
                    }
                    SpillBackend::<I>::configure(&device, config).unwrap();
                    let spilled = run::<SpillBackend<I>>(program, thin);
                    let what = format!("round {round}, budget {budget:?}, async {asynchronous}");
                    excused.add(oracle.judge(&spilled, &what).unwrap());
                }
            }
        }
    }
    excused
}

/// The third program that once failed: as generated, its thin transposes are views.
fn miscompiled_after_a_read() -> Vec<Inst> {
    use Inst::*;
    vec![
        Create { rows: 1, seed: 0 },
        Transpose(0),
        Create { rows: 1, seed: 0 },
        Create { rows: 1, seed: 0 },
        Argmax(0),
        MulScalar(5, 0),
        Argmax(4),
        SumDim(11),
        Transpose(13),
        Argmax(2),
        SumDim(4),
        Argmax(1),
        MulScalar(9, 1),
        Create { rows: 1, seed: 0 },
        Transpose(10),
        Matmul(7, 2),
        Argmax(5),
        Matmul(2, 5),
        Transpose(12),
        Exp(3),
        MulScalar(4, 0),
    ]
}

/// Plain fused wgpu, no burn-spill: the program above with one read before its last
/// instruction disagrees with unfused wgpu (which agrees with itself with or without the
/// read). Any register's read does it: what matters is that the read drains the stream there.
/// Fails (and says so) the day the pinned Burn computes it right.
#[cfg(all(feature = "wgpu", feature = "fusion"))]
#[test]
fn fusion_miscompiles_after_a_read() {
    if !available::<WgpuFused>("wgpu_fused") {
        return;
    }
    let _lock = exclusive();
    let mut program = miscompiled_after_a_read();
    let unfused = run::<WgpuUnfused>(&program, Thin::Transpose);
    assert!(same_reads(
        &run::<WgpuFused>(&program, Thin::Transpose),
        &unfused
    ));
    program.insert(program.len() - 1, Inst::Read(0));
    let unfused_read = run::<WgpuUnfused>(&program, Thin::Transpose);
    assert!(
        same_reads(&unfused_read[1..], &unfused),
        "unfused, with the read"
    );
    assert!(
        !same_reads(&run::<WgpuFused>(&program, Thin::Transpose), &unfused_read),
        "plain fused wgpu computes this right now: the pinned Burn fixed it, so the fused \
         suites can transpose thin matrices again (`Thin`)"
    );
}

/// Plain fused wgpu, no burn-spill: burn-cubecl-fusion's code generator panics on this program
/// (`engine/codegen/ir.rs:500`, an index out of bounds) when the stream is drained after its
/// 15th instruction (or any of the 16th to 19th), and runs it without a drain. burn-spill's
/// reads for evictions drain the stream at other places than plain does, so its fused suites
/// can meet this panic (`random_programs_with_drops_match` found it, about once in 2,500 fused
/// cases). Ignored: the panic breaks burn-fusion's stream for every later op in the process, so
/// it runs alone (`cargo test --features wgpu,fusion --test cubecl
/// fusion_panics_when_drained_mid_program -- --ignored`); it fails (and says so) the day the
/// pinned Burn compiles the program.
#[cfg(all(feature = "wgpu", feature = "fusion"))]
#[test]
#[ignore = "breaks burn-fusion's stream for the rest of the process: run it alone"]
#[should_panic(expected = "burn-fusion panicked")]
fn fusion_panics_when_drained_mid_program() {
    use Inst::*;
    if !available::<WgpuFused>("wgpu_fused") {
        panic!("no wgpu adapter: nothing was shown");
    }
    let _lock = exclusive();
    let program = vec![
        MulScalar(10, 86),
        MulScalar(15, 26),
        Add(10, 5),
        Clone(0),
        Matmul(10, 3),
        MulScalar(7, 109),
        Argmax(12),
        Create { rows: 4, seed: 44 },
        Create { rows: 2, seed: 95 },
        Transpose(4),
        MulScalar(9, 82),
        MulScalar(7, -109),
        SumDim(7),
        Create { rows: 2, seed: 141 },
        Add(12, 15),
        MulScalar(9, 32),
        Clone(8),
        SumDim(9),
        MulScalar(4, 92),
        Exp(13),
        MulScalar(8, 9),
        Exp(14),
        Exp(10),
        Exp(10),
        Matmul(6, 7),
        Add(6, 3),
        MulScalar(1, -95),
        MulScalar(15, -119),
        SumDim(7),
        MulScalar(6, 35),
    ];
    let undrained = run::<WgpuFused>(&program, Thin::Reshape);
    assert_eq!(undrained.len(), 10, "the program runs without a drain");
    let drained = std::panic::catch_unwind(|| {
        run_draining::<WgpuFused>(&program, Thin::Reshape, |at| at == 14)
    });
    if drained.is_err() {
        panic!("burn-fusion panicked when drained after the 15th instruction");
    }
    panic!(
        "plain fused wgpu runs this program drained after its 15th instruction now: the pinned \
         Burn fixed it, so this test and the troubleshooting note can go"
    );
}

/// The core of the first program that once failed, on plain backends only: Burn 0.21's fusion computes
/// `t * 0.8125` from the wrong elements when `t` is the transpose of a reduction `s` that is
/// reduced again and dropped before `t` is used. Unfused CubeCL is right. This is why the
/// fused suites judge with [`Oracle`]; the test fails (and says so) the day the pinned Burn
/// computes it right, so that the exception can go.
#[cfg(all(feature = "wgpu", feature = "fusion"))]
fn fusion_miscompiles_a_transposed_reduction<I: Backend>() -> (Vec<f32>, Vec<f32>) {
    fn rows<B: Backend>(rows: usize, seed: usize) -> Tensor<B, 2> {
        let values: Vec<f32> = (0..rows * 4)
            .map(|i| ((i * 7 + seed) % 17) as f32 * 0.125 - 1.0)
            .collect();
        Tensor::from_data(TensorData::new(values, [rows, 4]), &Default::default())
    }
    let c = rows::<I>(2, 0);
    let s = c.clone().sum_dim(1);
    let t = s.clone().transpose();
    let e = rows::<I>(2, 136);
    let s_again = s.clone().sum_dim(1);
    drop(c);
    let e_t = e.clone().transpose();
    drop(s);
    let scaled = t.mul_scalar(0.8125).into_data().to_vec::<f32>().unwrap();
    drop((e, e_t, s_again));
    (scaled, vec![-0.875 * 0.8125, 0.375 * 0.8125])
}

/// Cases per backend: 24 by default; `CUBECL_PROGRAM_CASES` for a longer hunt.
fn program_cases() -> u32 {
    std::env::var("CUBECL_PROGRAM_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24)
}

// ---------------------------------------------------------------------------------------------
// Strided views and the pool's figures.
// ---------------------------------------------------------------------------------------------

/// A transposed view spilled and restored gives the matmul downstream the same bits as on
/// plain `I`: on unfused CubeCL the view is kept on the device (its strides are read); on fused
/// CubeCL, whose layout is decided lazily, it is spilled and comes back contiguous.
fn strided_view_round_trips<I: Backend>() -> SpillStats {
    let device = I::Device::default();
    let _reset = Reset::<I>(device.clone());
    fn program<B: Backend>(device: &B::Device) -> TensorData {
        let values: Vec<f32> = (0..64 * 48)
            .map(|i| ((i * 37) % 101) as f32 / 7.0 - 6.0)
            .collect();
        let a = Tensor::<B, 2>::from_data(TensorData::new(values, [64, 48]), device);
        let square: Vec<f32> = (0..64 * 64)
            .map(|i| ((i * 53) % 89) as f32 / 11.0 - 4.0)
            .collect();
        let b = Tensor::<B, 2>::from_data(TensorData::new(square, [64, 64]), device);
        let at = a.transpose();
        // Everything else is spilled between these ops at budget 0.
        let c = b.clone().matmul(b.clone());
        let d = at.matmul(c.transpose());
        d.into_data()
    }
    let plain = program::<I>(&device);
    SpillBackend::<I>::configure(&device, SpillConfig::default().device_budget_bytes(0)).unwrap();
    let spilled = program::<SpillBackend<I>>(&device);
    assert_eq!(
        plain.as_bytes(),
        spilled.as_bytes(),
        "the matmul on a restored view differs"
    );
    SpillBackend::<I>::stats(&device)
}

/// The pool's figures are read on CubeCL and returned pages show in them; a cleanup while
/// kernels are still queued frees nothing they read.
fn pool_is_reported<I: Backend>() {
    let device = I::Device::default();
    let _reset = Reset::<I>(device.clone());
    SpillBackend::<I>::configure(&device, SpillConfig::default().device_budget_bytes(1 << 20))
        .unwrap();
    let big: Vec<_> = (0..8)
        .map(|k| Tensor::<SpillBackend<I>, 2>::ones([256, 256], &device).mul_scalar(k as f32))
        .collect();
    let first = big.iter().cloned().reduce(|a, b| a + b).unwrap();
    let _ = first.into_data();
    let during = SpillBackend::<I>::stats(&device);
    let pool = during.pool.expect("CubeCL reports its pool");
    assert!(pool.streams >= 1);
    assert!(pool.reserved >= pool.in_use, "{pool:?}");
    assert!(pool.peak_reserved >= pool.reserved, "{pool:?}");
    assert!(pool.peak_in_use > 0, "{pool:?}");
    // Queued, not yet read: the cleanup must leave what these kernels read alone.
    let queued = big
        .iter()
        .cloned()
        .reduce(|a, b| a * 0.5 + b)
        .unwrap()
        .exp()
        .sum();
    drop(big);
    let before = SpillBackend::<I>::stats(&device).pool.unwrap();
    SpillBackend::<I>::memory_cleanup(&device);
    let after = SpillBackend::<I>::stats(&device).pool.unwrap();
    assert!(after.cleanups > before.cleanups, "{after:?}");
    assert!(
        after.reserved <= before.reserved,
        "cleanup grew the pool: {before:?} -> {after:?}"
    );
    // The same sum on plain `I`.
    let expected = (0..8)
        .map(|k| Tensor::<I, 2>::ones([256, 256], &device).mul_scalar(k as f32))
        .reduce(|a, b| a * 0.5 + b)
        .unwrap()
        .exp()
        .sum();
    assert_eq!(
        queued.into_data().as_bytes(),
        expected.into_data().as_bytes(),
        "a cleanup changed what queued kernels computed"
    );
}

/// The troubleshooting guide's "memory fragments": spilled and dropped tensors leave the pool
/// reserving pages nothing uses. Past `pool_cleanup_margin_bytes` the engine returns them by
/// itself (no `memory_cleanup` call); with a margin larger than the pool it never does.
fn pool_is_cleaned_past_its_margin<I: Backend>() {
    let device = I::Device::default();
    let _reset = Reset::<I>(device.clone());
    let churn = || {
        let tensors: Vec<_> = (0..8)
            .map(|k| Tensor::<SpillBackend<I>, 2>::ones([256, 256], &device).mul_scalar(k as f32))
            .collect();
        let sum = tensors.iter().cloned().reduce(|a, b| a + b).unwrap();
        drop(tensors);
        let _ = sum.into_data();
    };
    let cleanups = |margin: u64| {
        SpillBackend::<I>::configure(
            &device,
            SpillConfig::default()
                .device_budget_bytes(1 << 20)
                .pool_cleanup_margin_bytes(margin),
        )
        .unwrap();
        // No pool to report before this thread's stream has run anything.
        let before = SpillBackend::<I>::stats(&device)
            .pool
            .map_or(0, |p| p.cleanups);
        churn();
        let after = SpillBackend::<I>::stats(&device).pool.unwrap();
        (after.cleanups - before, after)
    };
    let (never, pool) = cleanups(1 << 40);
    assert_eq!(never, 0, "a margin above the pool never cleans: {pool:?}");
    let (cleaned, pool) = cleanups(64 << 10);
    assert!(
        cleaned > 0,
        "past a 64 KiB margin the pool is cleaned: {pool:?}"
    );
}

/// A budget as a fraction of device memory: CUDA reports its memory through CubeCL; wgpu does
/// not, and the fraction is refused with `DeviceMemoryUnknown` unless the memory is declared.
fn fraction_budgets<I: Backend>(memory_known: bool) {
    let device = I::Device::default();
    let _reset = Reset::<I>(device.clone());
    let result =
        SpillBackend::<I>::configure(&device, SpillConfig::default().device_budget_fraction(0.5));
    if memory_known {
        result.unwrap();
        let budget = SpillBackend::<I>::stats(&device)
            .device_budget_bytes
            .unwrap();
        assert!(budget > 0);
    } else {
        let err = result.unwrap_err();
        assert!(
            matches!(err, burn_spill::SpillError::DeviceMemoryUnknown { .. }),
            "{err}"
        );
        SpillBackend::<I>::configure(
            &device,
            SpillConfig::default()
                .device_budget_fraction(0.5)
                .device_memory_bytes(64 << 20),
        )
        .unwrap();
        assert_eq!(
            SpillBackend::<I>::stats(&device).device_budget_bytes,
            Some(32 << 20)
        );
    }
}

/// While a transposed view of an unfused CubeCL tensor is alive, its bytes are unevictable.
fn views_are_unevictable<I: Backend>() {
    let device = I::Device::default();
    let _reset = Reset::<I>(device.clone());
    SpillBackend::<I>::configure(&device, SpillConfig::default().device_budget_bytes(0)).unwrap();
    let a = Tensor::<SpillBackend<I>, 2>::ones([8, 4], &device);
    let view = a.transpose();
    let stats = SpillBackend::<I>::stats(&device);
    assert_eq!(stats.unevictable_device_bytes, 8 * 4 * 4, "{stats:?}");
    assert_eq!(view.dims(), [4, 8]);
}

/// The suite for one CubeCL backend; `fused` says whether its layout is lazy.
macro_rules! cubecl_suite {
    ($suite:ident, $backend:ty, reference: $reference:ty, fused: $fused:expr, memory_known: $known:expr) => {
        mod $suite {
            use super::*;

            fn skip() -> bool {
                !available::<$backend>(stringify!($suite))
            }

            fn thin() -> Thin {
                if $fused {
                    Thin::Reshape
                } else {
                    Thin::Transpose
                }
            }

            #[test]
            fn cnn_trains_bit_identically_at_30_percent() {
                if skip() {
                    return;
                }
                let _lock = exclusive();
                training_is_exact::<$backend>(Model::Cnn);
            }

            #[test]
            fn gpt_trains_bit_identically_at_30_percent() {
                if skip() {
                    return;
                }
                let _lock = exclusive();
                training_is_exact::<$backend>(Model::Gpt);
            }

            #[test]
            fn gpt_trains_bit_identically_with_recompute() {
                if skip() {
                    return;
                }
                let _lock = exclusive();
                training_with_recompute_is_exact::<$backend>(Model::Gpt);
            }

            #[test]
            fn random_programs_match_under_budgets() {
                if skip() {
                    return;
                }
                let _lock = exclusive();
                random_programs_are_exact::<$backend, $reference>(program_cases(), thin());
            }

            #[test]
            fn random_programs_with_drops_match() {
                if skip() {
                    return;
                }
                let _lock = exclusive();
                let (fixed, dropped) = random_programs_with_drops_are_exact::<$backend, $reference>(
                    program_cases(),
                    thin(),
                );
                println!(
                    "{}: the fixed program dropped {} and rebuilt {}; {dropped} dropped in all",
                    stringify!($suite),
                    fixed.dropped,
                    fixed.rebuilt
                );
                assert!(
                    fixed.rebuilt > 0,
                    "the fixed program rebuilt nothing: {fixed:?}"
                );
            }

            #[test]
            fn programs_that_once_failed_match() {
                if skip() {
                    return;
                }
                let _lock = exclusive();
                // As they failed: thin transposes as views.
                let excused = known_programs_are_exact::<$backend, $reference>(8, Thin::Transpose);
                report_excused(excused, stringify!($suite));
            }

            #[test]
            fn strided_views_round_trip_exactly() {
                if skip() {
                    return;
                }
                let _lock = exclusive();
                let stats = strided_view_round_trips::<$backend>();
                assert!(stats.device_to_host.count > 0, "nothing was spilled");
                if !$fused {
                    views_are_unevictable::<$backend>();
                }
            }

            #[test]
            fn pool_is_reported_and_cleaned() {
                if skip() {
                    return;
                }
                let _lock = exclusive();
                pool_is_reported::<$backend>();
            }

            #[test]
            fn pool_is_cleaned_past_its_margin() {
                if skip() {
                    return;
                }
                let _lock = exclusive();
                super::pool_is_cleaned_past_its_margin::<$backend>();
            }

            #[test]
            fn fraction_budgets_use_the_memory_the_backend_reports() {
                if skip() {
                    return;
                }
                let _lock = exclusive();
                fraction_budgets::<$backend>($known);
            }
        }
    };
}

#[cfg(feature = "wgpu")]
cubecl_suite!(wgpu_unfused, WgpuUnfused, reference: WgpuUnfused, fused: false, memory_known: false);
#[cfg(all(feature = "wgpu", feature = "fusion"))]
cubecl_suite!(wgpu_fused, WgpuFused, reference: WgpuUnfused, fused: true, memory_known: false);
#[cfg(feature = "cuda")]
cubecl_suite!(cuda_unfused, CudaUnfused, reference: CudaUnfused, fused: false, memory_known: true);
#[cfg(all(feature = "cuda", feature = "fusion"))]
cubecl_suite!(cuda_fused, CudaFused, reference: CudaUnfused, fused: true, memory_known: true);

/// Upstream's miscompile that [`Oracle`] allows for: wrong on plain fused wgpu, right unfused
/// and right on `SpillBackend` over fused wgpu at budget 0 (where the reduction is materialised
/// before the transpose is read).
#[cfg(all(feature = "wgpu", feature = "fusion"))]
#[test]
fn fused_wgpu_miscompiles_a_transposed_reduction() {
    if !available::<WgpuFused>("wgpu_fused") {
        return;
    }
    let _lock = exclusive();
    let device = burn::backend::wgpu::WgpuDevice::default();
    let _reset = Reset::<WgpuFused>(device.clone());
    let (unfused, right) = fusion_miscompiles_a_transposed_reduction::<WgpuUnfused>();
    assert_eq!(unfused, right, "unfused wgpu");
    let (fused, _) = fusion_miscompiles_a_transposed_reduction::<WgpuFused>();
    assert_ne!(
        fused, right,
        "plain fused wgpu computes this right now: the pinned Burn fixed it, so `Oracle` can \
         compare fused runs with plain alone again"
    );
    SpillBackend::<WgpuFused>::configure(&device, SpillConfig::default().device_budget_bytes(0))
        .unwrap();
    let (spilled, _) = fusion_miscompiles_a_transposed_reduction::<SpillBackend<WgpuFused>>();
    assert_eq!(spilled, right, "SpillBackend<fused wgpu> at budget 0");
}
