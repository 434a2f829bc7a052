//! The comparison both examples make: the same seeded training on plain `Autodiff<B>` and on
//! `Autodiff<SpillBackend<B>>` under a budget, with what each run used and how long it took.
//!
//! Three runs, in this order:
//! 1. plain, on `B` itself: its step times are the baseline (with `--verify` it trains every
//!    step and its losses and final parameters are the oracle; otherwise a few steps suffice);
//! 2. a short unlimited run through `SpillBackend`, which only counts bytes, to measure the plain
//!    peak (`B` cannot report its memory use, and a budget such as `30%` is relative to it);
//! 3. spilled, under the budget, with step markers for the tape when a report, trace, tape or
//!    plan is wanted or the run may drop victims (`--recompute recompute` or `both`), or always
//!    where the workload's loop marks its steps itself.

use std::sync::Arc;

use burn::backend::Autodiff;
use burn::tensor::TensorData;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn_spill::tape::{StepTape, TapeFormat, render};
use burn_spill::verify::{self, Snapshot, VerifyReport};
use burn_spill::{PolicyKind, Preset, SpillBackend, SpillConfig, SpillError, SpillStats};

use super::backends::BackendTask;
use super::cli::{SpillArgs, exit_usage};
use super::step_log::{RunLog, StepLog};

/// Steps the plain run trains when it is only timed: enough intervals for a median.
const TIMING_STEPS: usize = 6;

/// Steps of the peak measurement: the second step already holds the optimizer's state next to
/// the activations, and later steps repeat it.
const PEAK_STEPS: usize = 2;

/// A seeded training job that can run on any autodiff backend.
pub trait Workload {
    /// The preset for this kind of model, unless `--preset` says otherwise.
    fn preset(&self) -> Preset;

    /// Trains `steps` steps from the fixed seed, reporting each step to `log`, and returns the
    /// final parameters. Two calls with the same `steps` must compute the same numbers on any
    /// two backends that compute bit-identically.
    fn train<A: AutodiffBackend>(
        &self,
        device: &A::Device,
        steps: usize,
        log: &StepLog,
    ) -> Vec<TensorData>;

    /// [`train`](Self::train) on `Autodiff<SpillBackend<B>>`: a workload whose loop marks every
    /// step for the tape itself trains here with its markers, and says so in
    /// [`marks_steps`](Self::marks_steps).
    fn train_spilled<B: Backend>(
        &self,
        device: &B::Device,
        steps: usize,
        log: &StepLog,
    ) -> Vec<TensorData> {
        self.train::<Autodiff<SpillBackend<B>>>(device, steps, log)
    }

    /// Whether [`train_spilled`](Self::train_spilled) marks the steps itself (the experiment
    /// then adds no markers of its own).
    fn marks_steps(&self) -> bool {
        false
    }
}

/// Where the plain and spilled runs agreed.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Verification {
    pub steps_compared: usize,
    pub losses_match: bool,
    /// The first step whose losses differ, with both values.
    pub first_loss_mismatch: Option<String>,
    pub parameters_compared: usize,
    pub parameters_match: bool,
    /// The first parameter tensor that differs, and how.
    pub first_parameter_mismatch: Option<String>,
}

impl Verification {
    pub fn matched(&self) -> bool {
        self.losses_match && self.parameters_match
    }
}

/// Everything the report and the table need.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Outcome {
    pub preset: Preset,
    pub policy: PolicyKind,
    pub plain: RunLog,
    pub spilled: RunLog,
    /// Peak device bytes of the unlimited run through `SpillBackend`.
    pub plain_peak_device_bytes: u64,
    /// The plain run's peak reserved bytes as `B`'s allocator reports them (CubeCL only).
    pub plain_peak_reserved_bytes: Option<u64>,
    pub budget_bytes: Option<u64>,
    pub host_limit_bytes: Option<u64>,
    /// The spilled run's stats (peaks from its configuration on).
    pub stats: SpillStats,
    pub verify: Option<Verification>,
    /// One recorded spilled step, when the tape was on.
    #[serde(skip)]
    pub tape: Option<Arc<StepTape>>,
}

/// The whole comparison for one workload, as a task for [`run_on`](super::backends::run_on).
pub struct Experiment<'a, W> {
    pub workload: &'a W,
    pub args: &'a SpillArgs,
    pub steps: usize,
}

impl<W: Workload> BackendTask for Experiment<'_, W> {
    type Output = Outcome;

    fn run<B: Backend>(self, device: B::Device) -> Outcome {
        let Self {
            workload,
            args,
            steps,
        } = self;
        let plain_steps = if args.verify {
            steps
        } else {
            steps.min(TIMING_STEPS)
        };
        // The allocator's reserved bytes of the plain run, where `B` reports them (CubeCL):
        // read at every step and at the end (a plain run never returns pages, so the last
        // reading is its peak unless the allocator cleans by itself).
        let plain_reserved = Arc::new(std::sync::Mutex::new(None::<u64>));
        let sample = {
            let (device, reserved) = (device.clone(), plain_reserved.clone());
            move || {
                if let Some(usage) = SpillBackend::<B>::inner_pool_usage(&device) {
                    let mut peak = reserved.lock().unwrap();
                    *peak = Some(peak.unwrap_or(0).max(usage.reserved));
                }
            }
        };
        let plain_log = StepLog::new("plain", plain_steps).on_step_begin(sample.clone());
        let plain_params = workload.train::<Autodiff<B>>(&device, plain_steps, &plain_log);
        sample();
        let plain = plain_log.finish();
        let plain_peak_reserved = *plain_reserved.lock().unwrap();
        // The plain run's pages go back, so that the spilled run's pool starts from nothing.
        B::memory_cleanup(&device);

        let plain_peak = measure_plain_peak::<B, W>(workload, &device, steps.min(PEAK_STEPS));
        SpillBackend::<B>::memory_cleanup(&device);

        let SpilledConfig {
            config,
            preset,
            policy,
            budget,
            host_limit,
        } = spilled_config(args, workload.preset(), plain_peak);
        configure::<B>(&device, config.clone());

        let marker = device.clone();
        let end_marker = device.clone();
        let resident = device.clone();
        let mut spilled_log = StepLog::new("spilled", steps)
            .resident(move || Some(SpillBackend::<B>::stats(&resident).resident.device));
        // A run that may drop marks its steps as one that wants the tape: the memory rule reads
        // the plan at the step's position, which marked steps give from the first plan on
        // (unmarked, the tape, which this loop leaves off, would first have to find the period).
        let marks = args.wants_tape() || config.get_recompute().may_drop();
        if marks && !workload.marks_steps() {
            // Marked steps are recorded exactly; without the markers the tape stays off and the
            // spilled step time carries no recording cost.
            spilled_log = spilled_log
                .on_step_begin(move || SpillBackend::<B>::step_begin(&marker))
                .on_run_end(move || SpillBackend::<B>::step_end(&end_marker));
        }
        let spilled_params = workload.train_spilled::<B>(&device, steps, &spilled_log);
        let spilled = spilled_log.finish();
        let stats = SpillBackend::<B>::stats(&device);
        let tape = SpillBackend::<B>::fullest_recent_step(&device);
        for (flag, path, format) in [
            ("--trace", &args.trace, TapeFormat::Perfetto),
            ("--save-tape", &args.save_tape, TapeFormat::Json),
        ] {
            let Some(path) = path else { continue };
            match &tape {
                Some(tape) => {
                    if let Err(e) = burn_spill::tape::write_file(path, &render(tape, format)) {
                        exit_usage(&format!("{flag}: {e}"))
                    }
                }
                None => eprintln!(
                    "note: {flag}: no whole step was recorded (train at least 2 steps); {} not written",
                    path.display()
                ),
            }
        }
        if let (Some(device_name), Some(tape)) = (&args.plan, &tape) {
            match super::plan_report::predict_own_step(tape, device_name, &stats, &config) {
                Ok(table) => print!("{table}"),
                Err(e) => exit_usage(&format!("--plan: {e}")),
            }
        }
        SpillBackend::<B>::record_tape(&device, false);
        // Back to unlimited: restores nothing (the spilled run's tensors are gone) but removes
        // the spill directory now rather than at exit.
        configure::<B>(&device, SpillConfig::default());

        let verify = args
            .verify
            .then(|| compare(&plain, &spilled, &plain_params, &spilled_params));
        Outcome {
            preset,
            policy,
            plain,
            spilled,
            plain_peak_device_bytes: plain_peak,
            plain_peak_reserved_bytes: plain_peak_reserved,
            budget_bytes: budget,
            host_limit_bytes: host_limit,
            stats,
            verify,
            tape,
        }
    }
}

/// The spilled run's configuration from the flags, with what the report names.
struct SpilledConfig {
    config: SpillConfig,
    preset: Preset,
    /// The preset's policy unless `--policy` overrides it.
    policy: PolicyKind,
    budget: Option<u64>,
    host_limit: Option<u64>,
}

fn spilled_config(args: &SpillArgs, default_preset: Preset, plain_peak: u64) -> SpilledConfig {
    let preset = args.preset.unwrap_or(default_preset);
    let budget = args.budget.resolve(plain_peak);
    let host_limit = args.host_limit.resolve(plain_peak);
    let mut config = SpillConfig::preset(preset);
    if let Some(policy) = args.policy {
        config = config.policy(policy);
    }
    let policy = config.get_policy();
    config = match budget {
        Some(bytes) => config.device_budget_bytes(bytes),
        None => config.device_budget(burn_spill::DeviceBudget::Unlimited),
    };
    config = match host_limit {
        Some(bytes) => config.host_limit_bytes(bytes),
        None => config.unlimited_host(),
    };
    if let Some(dir) = &args.spill_dir {
        config = config.spill_dir(dir);
    }
    config = config
        .verify_restores(args.verify_restores)
        .recompute(args.recompute);
    if let Some(profile) = &args.rebuild_profile {
        config = config.rebuild_profile(profile.clone());
    }
    if let Some(early) = args.early_room {
        config = config.early_room(early);
    }
    SpilledConfig {
        config,
        preset,
        policy,
        budget,
        host_limit,
    }
}

/// One side of the comparison alone in this process (`--only plain|spilled`), for runs that
/// must not hold both sides' memory: under a memory cap (`scripts/ram-capped.sh`) each side gets
/// a process of its own. Trains every step and returns the losses. The spilled side takes its
/// budget and host limit in bytes: the plain peak they could be relative to is not measured
/// here (that would hold the plain run's memory).
pub struct OneSide<'a, W> {
    pub workload: &'a W,
    pub args: &'a SpillArgs,
    pub steps: usize,
    pub side: Side,
}

/// Which side `--only` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    Plain,
    Spilled,
}

impl Side {
    pub fn parse(value: &str) -> Result<Self, String> {
        match value {
            "plain" => Ok(Self::Plain),
            "spilled" => Ok(Self::Spilled),
            _ => Err(format!("`{value}` is not a side; accepted: plain, spilled")),
        }
    }
}

/// Runs the side `--only` names and prints its outcome as one JSON line, if the flag was
/// given; returns whether it did.
pub fn run_only_side<W: Workload>(workload: &W, args: &SpillArgs, steps: usize) -> bool {
    let Some(side) = args.only else {
        return false;
    };
    let task = OneSide {
        workload,
        args,
        steps,
        side,
    };
    let outcome = super::backends::run_on(args.backend, args.pool_pages, task);
    println!(
        "{}",
        serde_json::to_string(&outcome).expect("the outcome serialises")
    );
    true
}

/// What `--only` prints, as one JSON line.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SideOutcome {
    pub side: Side,
    pub losses: Vec<f32>,
    /// The spilled side's stats.
    pub stats: Option<SpillStats>,
    /// The process's resident-set peak (`VmHWM`), where the OS reports it (Linux).
    pub resident_peak_bytes: Option<u64>,
}

/// This process's resident-set peak from `/proc/self/status` (`None` off Linux).
fn resident_peak_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

impl<W: Workload> BackendTask for OneSide<'_, W> {
    type Output = SideOutcome;

    fn run<B: Backend>(self, device: B::Device) -> SideOutcome {
        let Self {
            workload,
            args,
            steps,
            side,
        } = self;
        if side == Side::Plain {
            let log = StepLog::new("plain", steps);
            drop(workload.train::<Autodiff<B>>(&device, steps, &log));
            return SideOutcome {
                side,
                losses: log.finish().losses,
                stats: None,
                resident_peak_bytes: resident_peak_bytes(),
            };
        }
        for (flag, amount) in [("--budget", args.budget), ("--host-limit", args.host_limit)] {
            if amount.needs_plain_peak() {
                exit_usage(&format!(
                    "{flag} {amount}: --only spilled does not measure the plain peak; give bytes"
                ));
            }
        }
        configure::<B>(&device, spilled_config(args, workload.preset(), 0).config);
        let log = StepLog::new("spilled", steps);
        drop(workload.train_spilled::<B>(&device, steps, &log));
        let losses = log.finish().losses;
        let stats = SpillBackend::<B>::stats(&device);
        configure::<B>(&device, SpillConfig::default());
        SideOutcome {
            side,
            losses,
            stats: Some(stats),
            resident_peak_bytes: resident_peak_bytes(),
        }
    }
}

/// Peak device bytes of the workload through `SpillBackend` with no budget: every tensor is
/// counted and none moves, so this is the plain run's peak as burn-spill counts bytes.
fn measure_plain_peak<B: Backend, W: Workload>(
    workload: &W,
    device: &B::Device,
    steps: usize,
) -> u64 {
    configure::<B>(device, SpillConfig::default());
    SpillBackend::<B>::reset_peaks(device);
    let log = StepLog::new("peak", steps);
    drop(workload.train::<Autodiff<SpillBackend<B>>>(device, steps, &log));
    log.finish();
    SpillBackend::<B>::stats(device).peak.device
}

fn configure<B: Backend>(device: &B::Device, config: SpillConfig) {
    // The examples read the `BURN_SPILL_*` variables as flags (`cli.rs`), for the spilled run
    // only: the library must not apply them again, here or to the plain peak's measurement.
    if let Err(e) = SpillBackend::<B>::configure_without_env(device, config) {
        let flag = match e {
            SpillError::SpillDir { .. } | SpillError::SpillDirInUse { .. } => "--spill-dir",
            _ => "configuration",
        };
        exit_usage(&format!("{flag}: {e}"));
    }
}

/// The library's own comparison (`burn_spill::verify`), over the losses step by step and the
/// final parameters tensor by tensor.
fn compare(
    plain: &RunLog,
    spilled: &RunLog,
    plain_params: &[TensorData],
    spilled_params: &[TensorData],
) -> Verification {
    let losses = |log: &RunLog| {
        let mut snapshot = Snapshot::new();
        for (step, loss) in log.losses.iter().enumerate() {
            snapshot.data(
                format!("loss at step {step}"),
                TensorData::new(vec![*loss], [1]),
            );
        }
        snapshot
    };
    let parameters = |tensors: &[TensorData]| {
        let mut snapshot = Snapshot::new();
        for (i, data) in tensors.iter().enumerate() {
            snapshot.data(format!("parameter tensor {i}"), data.clone());
        }
        snapshot
    };
    let losses = verify::compare(&losses(plain), &losses(spilled));
    let parameters = verify::compare(&parameters(plain_params), &parameters(spilled_params));
    let describe = |report: &VerifyReport| report.first_difference.as_ref().map(|d| d.to_string());
    Verification {
        steps_compared: losses.compared,
        losses_match: losses.is_identical(),
        first_loss_mismatch: describe(&losses),
        parameters_compared: parameters.compared,
        parameters_match: parameters.is_identical(),
        first_parameter_mismatch: describe(&parameters),
    }
}
