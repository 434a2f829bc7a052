//! Recompute in steps no marker bounds: once the period detector has confirmed the step's
//! period and a plan was made from a step of that period, the position counts each step's
//! ops as a marked step's, and victims are dropped as in marked steps. Checked on the tiny
//! GPT and on random op programs repeated as steps. Its own process: the recorder must never
//! have seen a marker (markers bound the steps from the first one on).

#[path = "budgeted/mod.rs"]
mod budgeted;
mod common;
mod programs;
#[path = "../examples/common/small_models.rs"]
mod small_models;

use std::cell::Cell;

use budgeted::{at_30_percent_for_steps, gpt};
use burn::backend::{Autodiff, Flex};
use burn_spill::{PolicyKind, RecomputeMode, SpillBackend, SpillConfig};
use common::{ExclusiveDevice, Plain, Spill};
use programs::{Inst, Outcome, compare, program, run, run_grad};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

type Trained = Autodiff<Flex>;
type Spilled = Autodiff<SpillBackend<Flex>>;

/// A config that drops every victim it may (recompute only), with the plan that the memory
/// rule needs (a tape-driven policy, prefetching).
fn dropping(config: SpillConfig) -> SpillConfig {
    config
        .policy(PolicyKind::NextUse)
        .prefetch_window(2)
        .recompute(RecomputeMode::Recompute)
}

/// Unmarked steps drop once their period is found: the run trains identically to plain Flex
/// within the budget (both checked by the harness) and rebuilds what it dropped. The first
/// steps go to finding the period (the detector confirms shorter repetitions inside the step
/// first), so the run is longer than the marked tests' five steps.
#[test]
fn unmarked_steps_drop_once_their_period_is_found_and_train_identically() {
    let stats = at_30_percent_for_steps(gpt::<Trained>, gpt::<Spilled>, 4, 30, &dropping, false);
    let r = &stats.recompute;
    eprintln!(
        "unmarked: dropped {}, rebuilt {} ({} chained); moved d->h {} B; tape {:?}",
        r.dropped,
        r.rebuilt,
        r.chained_rebuilds,
        stats.device_to_host.bytes,
        SpillBackend::<Flex>::tape_counters(&Default::default()),
    );
    assert!(r.dropped > 0, "nothing dropped: {r:?}");
    assert!(r.rebuilt > 0, "nothing rebuilt: {r:?}");
    assert_eq!(
        r.dropped_now_bytes, 0,
        "every drop rebuilt or let go: {r:?}"
    );
}

/// The GPT trained on a thread of its own, after the calling thread ran an op, as a program
/// that sets up on one thread and trains on another does. The calling thread lives on, and
/// runs `after` between steps (the harness's warm-up measure) while the trainer waits.
fn gpt_on_a_trainer_thread(
    device: &burn::tensor::Device<Flex>,
    steps: usize,
    batch: usize,
    after: &mut dyn FnMut(usize),
) -> small_models::TrainRun {
    // The set-up: this thread's op comes first, so that it is the first stepping thread.
    let setup = burn::tensor::Tensor::<Spilled, 1>::ones([4], device).exp();
    let (step_done, steps_done) = std::sync::mpsc::channel::<usize>();
    let (go_on, resume) = std::sync::mpsc::channel::<()>();
    let run = std::thread::scope(|s| {
        let trainer = s.spawn(move || {
            gpt::<Spilled>(device, steps, batch, &mut |step| {
                step_done.send(step).expect("the set-up thread waits");
                resume.recv().expect("the set-up thread answers");
            })
        });
        for step in steps_done {
            after(step);
            go_on.send(()).expect("the trainer waits");
        }
        trainer.join().expect("the trainer trained")
    });
    drop(setup);
    run
}

/// A program that ran an op on one thread and trains on another, unmarked, while the first
/// only waits: the trainer takes the idle thread's place as the stepping thread, its steps
/// are found and victims dropped, and it trains identically to plain Flex within the budget.
/// (The waiting thread is alive, so before, the trainer's ops were only other threads' ops:
/// no step was found and nothing dropped.)
#[test]
fn a_trainer_thread_beside_an_idle_set_up_thread_has_its_steps_found_and_drops() {
    let stats = at_30_percent_for_steps(
        gpt::<Trained>,
        gpt_on_a_trainer_thread,
        4,
        40,
        &dropping,
        false,
    );
    let r = &stats.recompute;
    let tape = SpillBackend::<Flex>::tape_counters(&Default::default());
    eprintln!(
        "trainer thread: dropped {}, rebuilt {}; tape {tape:?}",
        r.dropped, r.rebuilt
    );
    assert!(r.dropped > 0, "nothing dropped: {r:?}; tape {tape:?}");
    assert_eq!(
        r.dropped_now_bytes, 0,
        "every drop rebuilt or let go: {r:?}"
    );
}

/// Runs of each program: the detector reports a period once two repetitions follow the first
/// ops, and a plan is made from a step it cut; the rest run under that plan.
const REPETITIONS: usize = 12;

/// Programs drawn: 48 by default, `UNMARKED_PROGRAMS_CASES` to change it.
fn program_cases() -> u32 {
    std::env::var("UNMARKED_PROGRAMS_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48)
}

/// Runs `program` [`REPETITIONS`] times without markers on `SpillBackend<Flex>` under `config`
/// and a budget of `percent` of the registers' peak bytes, each run compared with plain
/// Flex's; then nothing is left alive, on any tier or dropped. Returns how many tensors were
/// dropped.
fn repeated_unmarked(
    program: &[Inst],
    grad: bool,
    percent: u64,
    config: SpillConfig,
    what: &str,
) -> u64 {
    let device = Default::default();
    let plain = if grad {
        run_grad::<Autodiff<Plain>>(program)
    } else {
        run::<Plain>(program)
    };
    let budget = plain.peak_bytes * percent / 100;
    let what = format!("{what}, budget {budget} B");
    Spill::configure(&device, config.device_budget_bytes(budget)).unwrap();
    let before = Spill::stats(&device);
    for repetition in 0..REPETITIONS {
        let spilled: Outcome = if grad {
            run_grad::<Autodiff<Spill>>(program)
        } else {
            run::<Spill>(program)
        };
        compare(&format!("{what}, run {repetition}"), &plain, &spilled);
    }
    let live = Spill::live(&device);
    assert_eq!(
        (live.tensors, live.bytes),
        (0, 0),
        "{what}: tensors left alive"
    );
    let stats = Spill::stats(&device);
    assert_eq!(
        (
            stats.resident.device,
            stats.resident.host,
            stats.resident.disk
        ),
        (0, 0, 0),
        "{what}: bytes left on a tier"
    );
    assert_eq!(
        stats.recompute.dropped_now_bytes, 0,
        "{what}: a dropped tensor is still counted"
    );
    stats.recompute.dropped - before.recompute.dropped
}

/// Random op programs (those of `tests/tiers_programs.rs`) repeated as unmarked steps under a
/// small budget with victims dropped, with and without `Autodiff`, synchronous and
/// asynchronous: every run reads plain Flex's bits and the ledger returns to zero. Over all
/// programs, some victims must have been dropped (a program whose budget never binds, or whose
/// period the detector has not confirmed in time, drops none).
#[test]
fn random_programs_repeated_without_markers_drop_and_match_flex() {
    let mut runner = TestRunner::new(Config {
        cases: program_cases(),
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (
        program(40),
        0u64..100,
        any::<bool>(),
        prop_oneof![Just(RecomputeMode::Recompute), Just(RecomputeMode::Both)],
        1usize..4,
        any::<bool>(),
    );
    let (dropped, dropping_programs) = (Cell::new(0u64), Cell::new(0u32));
    runner
        .run(
            &strategy,
            |(program, percent, grad, mode, window, asynchronous)| {
                let _device = ExclusiveDevice::take();
                let what = format!(
                    "unmarked, {percent}% of the peak, autodiff {grad}, recompute {mode}, \
                     window {window}, async {asynchronous}"
                );
                let config = SpillConfig::default()
                    .unlimited_host()
                    .policy(PolicyKind::NextUse)
                    .prefetch_window(window)
                    .recompute(mode)
                    .asynchronous(asynchronous);
                let dropped_here = repeated_unmarked(&program, grad, percent, config, &what);
                dropped.set(dropped.get() + dropped_here);
                dropping_programs.set(dropping_programs.get() + u32::from(dropped_here > 0));
                Ok(())
            },
        )
        .unwrap();
    eprintln!(
        "random unmarked programs: {} of {} dropped, {} tensors in all",
        dropping_programs.get(),
        program_cases(),
        dropped.get()
    );
    assert!(dropped.get() > 0, "no program dropped a tensor");
}
