//! Random op programs (proptest) run on plain Flex and on `SpillBackend<Flex>` under device
//! budgets from zero to unlimited and host limits of zero (everything spilled goes on to disk)
//! and unlimited: every read and every register left at the end must be bit-identical, and the
//! ledger must be back to zero once the program's tensors are gone.
//!
//! A program is a list of instructions over a small register file of live tensors of mixed
//! kinds and dtypes (f32, f16, bf16; i32, i64; bool), all rank 3 so one register type holds
//! them: `[1, 1, 4]` stands in for a vector, `[1, 3, 4]` for a matrix. Instructions create from
//! explicit data, run unary/binary/scalar math, matmul, reshape, swap dims, slice, reduce,
//! compare, mask, cast between dtypes and kinds, argmax, concatenate, take a max with indices,
//! clone registers (shared handles, one clone then consumed by an add), drop registers (also on
//! another thread), and read registers (alone, consuming or not, or several in a
//! `Transaction`). Register operands are indices taken modulo the live registers and resolved
//! against the tensors' metadata (kind, dtype, shape), so every generated program is valid; an
//! instruction that finds no fitting operand falls back to a simpler form. Each run keeps a log
//! of what it executed, and the logs of the two backends must agree before the data is compared.
//! The instruction set and the machine that runs it are in `tests/programs/`, which
//! `tests/recompute_unmarked.rs` shares.
//!
//! The properties:
//! - every program under budgets {0, 64 B, half the registers' peak bytes, unlimited} x host
//!   limits {0, unlimited}, plus a run on the never-configured device;
//! - the same under `Autodiff`, with the f32 creations requiring grad: loss and gradients;
//! - one run under a small budget and small host limit drawn by the generator (host and disk
//!   tiers both in use), with reconfigurations of the device in the middle of the program;
//! - three steps under a small budget with victims dropped and rebuilt from their recipes
//!   (recompute only, or the cheaper of moving and rebuilding), with and without `Autodiff`.
//!
//! Configuration is process-global per device, so every test holds `LOCK` for its whole run and
//! resets the device to `SpillConfig::default()` when it ends (also when it fails).

mod common;
mod programs;

use burn::backend::Autodiff;
use burn::tensor::{Tensor, TensorData};
use burn_spill::policy::recompute::RebuildRoom;
use burn_spill::{PolicyKind, RecomputeMode, SpillConfig};
use common::{ExclusiveDevice, Plain, Spill};
use programs::*;
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------------
// The comparison under every budget.
// ---------------------------------------------------------------------------------------------

const UNLIMITED: Option<u64> = None;

/// Runs `f` on `SpillBackend<Flex>` configured with `budget` and `host`, then checks that the
/// ledger is back to zero and that the tiers really were used.
fn configured(
    budget: Option<u64>,
    host: Option<u64>,
    asynchronous: bool,
    f: impl FnOnce() -> Outcome,
) -> Outcome {
    let config = SpillConfig::default().asynchronous(asynchronous);
    configured_with(config, budget, host, true, f)
}

/// `configured`; `moves` = false skips the checks of what moved, for programs that reconfigure
/// the device themselves.
fn configured_with(
    config: SpillConfig,
    budget: Option<u64>,
    host: Option<u64>,
    moves: bool,
    f: impl FnOnce() -> Outcome,
) -> Outcome {
    let dev = Default::default();
    let asynchronous = config.is_asynchronous();
    let config = match budget {
        Some(b) => config.device_budget_bytes(b),
        None => config,
    };
    let config = match host {
        Some(h) => config.host_limit_bytes(h),
        None => config.unlimited_host(),
    };
    Spill::configure(&dev, config).unwrap();
    let before = Spill::stats(&dev);
    let out = f();
    let after = Spill::stats(&dev);
    let live = Spill::live(&dev);
    let what = format!("budget {budget:?}, host limit {host:?}, async {asynchronous}");
    assert_eq!(
        (live.tensors, live.bytes),
        (0, 0),
        "{what}: tensors left alive"
    );
    assert_eq!(
        (
            after.resident.device,
            after.resident.host,
            after.resident.disk
        ),
        (0, 0, 0),
        "{what}: bytes left on a tier"
    );
    assert_eq!(after.live_tensors, 0, "{what}: live tensors in stats");
    assert_eq!(
        after.disk_write_errors, before.disk_write_errors,
        "{what}: disk write errors"
    );
    let moved = |s: &burn_spill::SpillStats| {
        (
            s.device_to_host.count,
            s.host_to_device.count,
            s.host_to_disk.count,
            s.disk_to_device.count,
        )
    };
    if !moves {
        return out;
    }
    match (budget, host) {
        (None, _) => assert_eq!(moved(&before), moved(&after), "{what}: something moved"),
        (Some(0), _) => {
            assert!(
                after.device_to_host.count > before.device_to_host.count,
                "{what}: nothing was spilled"
            );
            // Asynchronously the I/O worker may not reach a tensor before the program drops it.
            if host == Some(0) && !asynchronous {
                assert!(
                    after.host_to_disk.count > before.host_to_disk.count,
                    "{what}: nothing went to disk"
                );
            }
        }
        _ => {}
    }
    if host == Some(0) && budget.is_some() && !asynchronous {
        // Past the limit of 0 every spilled tensor goes on to disk, so none stays on the host
        // between ops; restores come from disk. (Asynchronously, the I/O worker moves them a
        // little later, so an op may find one still on the host: that is allowed.)
        assert_eq!(
            after.host_to_device.count, before.host_to_device.count,
            "{what}: a restore came from the host tier"
        );
    }
    out
}

fn budgets(plain: &Outcome) -> [Option<u64>; 4] {
    [
        Some(0),
        Some(64),
        Some((plain.peak_bytes / 2).max(1)),
        UNLIMITED,
    ]
}

fn check_program(program: &[Inst]) {
    let _device = ExclusiveDevice::take();
    let plain = run::<Plain>(program);
    let unconfigured = run::<Spill>(program);
    compare("unconfigured", &plain, &unconfigured);
    let live = Spill::live(&Default::default());
    assert_eq!(
        (live.tensors, live.bytes),
        (0, 0),
        "unconfigured: tensors left alive"
    );
    for budget in budgets(&plain) {
        for host in [UNLIMITED, Some(0)] {
            for asynchronous in [true, false] {
                let spill = configured(budget, host, asynchronous, || run::<Spill>(program));
                compare(
                    &format!("budget {budget:?}, host limit {host:?}, async {asynchronous}"),
                    &plain,
                    &spill,
                );
            }
        }
    }
}

/// Runs `program` three times as marked steps, so that the second and third run have a plan
/// from the tape to evict and prefetch by; every run must match.
fn repeated<B: burn::tensor::backend::Backend>(
    run: impl Fn() -> Outcome,
    what: &str,
    plain: &Outcome,
) -> Outcome {
    let dev = Default::default();
    let mut last = None;
    for step in 0..3 {
        Spill::step_begin(&dev);
        let out = run();
        Spill::step_end(&dev);
        compare(&format!("{what}, step {step}"), plain, &out);
        last = Some(out);
    }
    let _ = std::marker::PhantomData::<B>;
    last.expect("three steps ran")
}

/// Runs under a budget and host limit of the generator's choice (both small, so the host tier
/// fills and overflows to disk while other tensors sit on the host), with the policy of the
/// generator's choice and prefetching, three steps in a row.
fn check_program_mixed_tiers(
    program: &[Inst],
    budget: u64,
    host: u64,
    grad: bool,
    policy: PolicyKind,
    window: usize,
) {
    let _device = ExclusiveDevice::take();
    let what = format!(
        "budget {budget}, host limit {host}, autodiff {grad}, {policy}, prefetch window {window}"
    );
    let config = SpillConfig::default()
        .policy(policy)
        .prefetch_window(window);
    if grad {
        let plain = run_grad::<Autodiff<Plain>>(program);
        let spill = configured_with(config, Some(budget), Some(host), false, || {
            repeated::<Spill>(|| run_grad::<Autodiff<Spill>>(program), &what, &plain)
        });
        compare(&what, &plain, &spill);
    } else {
        let plain = run::<Plain>(program);
        let spill = configured_with(config, Some(budget), Some(host), false, || {
            repeated::<Spill>(|| run::<Spill>(program), &what, &plain)
        });
        compare(&what, &plain, &spill);
    }
}

/// Runs with victims dropped and rebuilt from their recipes (recompute only, or per victim the
/// cheaper of that and a move), under a budget of the generator's choice, three steps in a row
/// so that the plan the memory rule needs exists from the second.
fn check_program_recompute(
    program: &[Inst],
    budget: u64,
    grad: bool,
    mode: RecomputeMode,
    window: usize,
    room: Option<RebuildRoom>,
) {
    let _device = ExclusiveDevice::take();
    let what = format!(
        "budget {budget}, autodiff {grad}, recompute {mode}, window {window}, rebuild room {room:?}"
    );
    let mut config = SpillConfig::default()
        .policy(PolicyKind::NextUse)
        .prefetch_window(window)
        .recompute(mode);
    if let Some(room) = room {
        config = config.rebuild_room(room);
    }
    let check = |spill: &Outcome, plain: &Outcome| {
        compare(&what, plain, spill);
        let stats = Spill::stats(&Default::default());
        assert_eq!(
            stats.recompute.dropped_now_bytes, 0,
            "{what}: a dropped tensor is still counted"
        );
    };
    if grad {
        let plain = run_grad::<Autodiff<Plain>>(program);
        let spill = configured_with(config, Some(budget), None, false, || {
            repeated::<Spill>(|| run_grad::<Autodiff<Spill>>(program), &what, &plain)
        });
        check(&spill, &plain);
    } else {
        let plain = run::<Plain>(program);
        let spill = configured_with(config, Some(budget), None, false, || {
            repeated::<Spill>(|| run::<Spill>(program), &what, &plain)
        });
        check(&spill, &plain);
    }
}

fn check_program_grad(program: &[Inst]) {
    let _device = ExclusiveDevice::take();
    let plain = run_grad::<Autodiff<Plain>>(program);
    for budget in budgets(&plain) {
        for host in [UNLIMITED, Some(0)] {
            let spill = configured(budget, host, true, || run_grad::<Autodiff<Spill>>(program));
            compare(
                &format!("autodiff, budget {budget:?}, host limit {host:?}"),
                &plain,
                &spill,
            );
        }
    }
}

/// Cases per property: 400 by default, so that a CI run checks 400 x (17 + 8 + 1 + 1) = 10,800
/// program x configuration runs (each program of the first property runs unconfigured and under
/// 4 budgets x 2 host limits x sync/async; of the second under 4 budgets x 2 host limits; of the
/// third under its drawn tiers, repeated; of the fourth with recompute, repeated). About 20 s in debug. `TIERS_PROGRAMS_CASES=5000` for
/// a long hunt.
fn cases() -> u32 {
    std::env::var("TIERS_PROGRAMS_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        max_shrink_iters: 1024,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_programs_match_flex_under_every_budget(program in program(60)) {
        check_program(&program);
    }

    #[test]
    fn random_programs_under_autodiff_give_the_same_gradients(program in program(40)) {
        check_program_grad(&program);
    }

    #[test]
    fn random_programs_with_host_and_disk_both_in_use(
        program in program_with_reconfigure(60),
        budget in 0u64..1024,
        host in 0u64..512,
        grad in any::<bool>(),
        policy in prop_oneof![
            Just(PolicyKind::Lru),
            Just(PolicyKind::NextUse),
            Just(PolicyKind::CostAware)
        ],
        window in 0usize..6,
    ) {
        check_program_mixed_tiers(&program, budget, host, grad, policy, window);
    }

    #[test]
    fn random_programs_with_recompute_match_flex(
        program in program(60),
        budget in 0u64..1024,
        grad in any::<bool>(),
        mode in prop_oneof![Just(RecomputeMode::Recompute), Just(RecomputeMode::Both)],
        window in 0usize..4,
        room in prop_oneof![
            Just(None),
            Just(Some(RebuildRoom::AtSettle)),
            Just(Some(RebuildRoom::BesidePrefetches)),
            Just(Some(RebuildRoom::InPrefetchWalk)),
        ],
    ) {
        check_program_recompute(&program, budget, grad, mode, window, room);
    }
}

/// Found by `random_programs_with_recompute_match_flex` in one run of the whole suite (one
/// element of read 12 one ulp off under `both`, asynchronous), kept as it was shrunk; it failed
/// again, rarely, in later runs. The cause was not recompute: when the engine happened to move
/// the slice of instruction 9 (a view inside its source's buffer) before instruction 16
/// transposed it, it came back as a buffer of its own, the negation of instruction 26 kept the
/// transposed strides, and the matmul of instruction 36 read them in another order. Such
/// views now stay on the device (`tests/tiers_layout.rs` shows the chain deterministically).
#[test]
fn a_recompute_program_that_once_failed() {
    let program = vec![
        Inst::Create {
            ty: Ty::Bool,
            shape: 1,
            seed: 3801618829,
        },
        Inst::Create {
            ty: Ty::Float {
                i: 1,
                via_cast: false,
            },
            shape: 1,
            seed: 1973243633,
        },
        Inst::Create {
            ty: Ty::Bool,
            shape: 2,
            seed: 3461226847,
        },
        Inst::CloneMutate { a: 211, b: 144 },
        Inst::Create {
            ty: Ty::Float {
                i: 0,
                via_cast: true,
            },
            shape: 2,
            seed: 846604944,
        },
        Inst::Unary {
            op: Unary::Neg,
            a: 4,
            keep: false,
        },
        Inst::Create {
            ty: Ty::Bool,
            shape: 1,
            seed: 3442580098,
        },
        Inst::Slice {
            a: 160,
            dim: 40,
            from_start: true,
        },
        Inst::Cast { a: 168, to: 182 },
        Inst::Slice {
            a: 100,
            dim: 141,
            from_start: false,
        },
        Inst::Cast { a: 95, to: 3 },
        Inst::Bools {
            op: BoolOp::And,
            a: 239,
            b: 116,
        },
        Inst::Unary {
            op: Unary::Neg,
            a: 50,
            keep: false,
        },
        Inst::Unary {
            op: Unary::Exp,
            a: 31,
            keep: false,
        },
        Inst::Scalar {
            op: ScalarOp::Clamp,
            a: 148,
            v: -16,
            keep: true,
        },
        Inst::Create {
            ty: Ty::Int { i: 1 },
            shape: 2,
            seed: 1339876967,
        },
        Inst::SwapDims { a: 255, pair: 166 },
        Inst::MaskWhere {
            m: 155,
            a: 8,
            b: 74,
        },
        Inst::CloneMutate { a: 234, b: 203 },
        Inst::Reshape {
            a: 121,
            to: 239,
            keep: false,
        },
        Inst::Slice {
            a: 204,
            dim: 88,
            from_start: false,
        },
        Inst::Cat {
            a: 207,
            b: 138,
            dim: 156,
        },
        Inst::Create {
            ty: Ty::Float {
                i: 2,
                via_cast: false,
            },
            shape: 0,
            seed: 3445011534,
        },
        Inst::Create {
            ty: Ty::Float {
                i: 1,
                via_cast: false,
            },
            shape: 0,
            seed: 4269437185,
        },
        Inst::SwapDims { a: 251, pair: 84 },
        Inst::Slice {
            a: 193,
            dim: 2,
            from_start: true,
        },
        Inst::Unary {
            op: Unary::Neg,
            a: 20,
            keep: true,
        },
        Inst::Matmul { a: 84, b: 57 },
        Inst::Create {
            ty: Ty::Float {
                i: 0,
                via_cast: true,
            },
            shape: 2,
            seed: 1345364298,
        },
        Inst::Slice {
            a: 143,
            dim: 97,
            from_start: true,
        },
        Inst::MaxWithIndices { a: 244, dim: 104 },
        Inst::ReadMany {
            a: 166,
            b: 165,
            c: 25,
        },
        Inst::Bools {
            op: BoolOp::Or,
            a: 63,
            b: 50,
        },
        Inst::Unary {
            op: Unary::Tanh,
            a: 32,
            keep: false,
        },
        Inst::DropOnThread { a: 228 },
        Inst::Scalar {
            op: ScalarOp::Add,
            a: 162,
            v: -113,
            keep: false,
        },
        Inst::Matmul { a: 183, b: 205 },
        Inst::Reduce {
            a: 109,
            dim: 174,
            mean: false,
        },
        Inst::Scalar {
            op: ScalarOp::Mul,
            a: 70,
            v: 3,
            keep: true,
        },
    ];
    check_program_recompute(&program, 448, true, RecomputeMode::Both, 3, None);
}

/// A fixed program that touches every instruction, so a change that breaks one shows up without
/// relying on the generator's luck.
#[test]
fn a_program_with_every_instruction() {
    let f = |i, via_cast| Ty::Float { i, via_cast };
    let program = vec![
        Inst::Create {
            ty: f(0, false),
            shape: 2,
            seed: 1,
        },
        Inst::Create {
            ty: f(0, false),
            shape: 2,
            seed: 2,
        },
        Inst::Create {
            ty: f(1, true),
            shape: 1,
            seed: 3,
        },
        Inst::Create {
            ty: f(2, false),
            shape: 1,
            seed: 4,
        },
        Inst::Create {
            ty: Ty::Int { i: 0 },
            shape: 2,
            seed: 5,
        },
        Inst::Create {
            ty: Ty::Int { i: 1 },
            shape: 2,
            seed: 6,
        },
        Inst::Create {
            ty: Ty::Bool,
            shape: 2,
            seed: 7,
        },
        Inst::Unary {
            op: Unary::SqrtAbs,
            a: 0,
            keep: true,
        },
        Inst::Unary {
            op: Unary::Exp,
            a: 2,
            keep: false,
        },
        Inst::Binary {
            op: Binary::Add,
            a: 0,
            b: 1,
            keep: false,
        },
        Inst::Binary {
            op: Binary::Max,
            a: 4,
            b: 5,
            keep: true,
        },
        Inst::Scalar {
            op: ScalarOp::Mul,
            a: 0,
            v: -3,
            keep: false,
        },
        Inst::Matmul { a: 0, b: 1 },
        Inst::Reshape {
            a: 0,
            to: 3,
            keep: true,
        },
        Inst::SwapDims { a: 1, pair: 1 },
        Inst::Slice {
            a: 1,
            dim: 2,
            from_start: false,
        },
        Inst::Reduce {
            a: 0,
            dim: 1,
            mean: true,
        },
        Inst::Compare {
            op: Cmp::Greater,
            a: 0,
            b: 1,
        },
        Inst::MaskWhere { m: 6, a: 0, b: 1 },
        Inst::MaskFill { m: 6, a: 4, v: 9 },
        Inst::Cast { a: 2, to: 1 },
        Inst::Argmax { a: 0, dim: 2 },
        Inst::Bools {
            op: BoolOp::And,
            a: 6,
            b: 6,
        },
        Inst::Clone { a: 0 },
        Inst::CloneMutate { a: 0, b: 1 },
        Inst::Read { a: 3, keep: true },
        Inst::Read { a: 4, keep: false },
        Inst::Drop { a: 1 },
        Inst::DropOnThread { a: 2 },
        Inst::ReadMany { a: 0, b: 3, c: 5 },
        Inst::MaxWithIndices { a: 1, dim: 1 },
        Inst::Cat { a: 0, b: 0, dim: 0 },
    ];
    check_program(&program);
    check_program_grad(&program);
}

#[test]
fn the_register_file_holds_spill_handles_that_really_move() {
    // The property tests would pass vacuously if registers never left the device; look at one.
    let _device = ExclusiveDevice::take();
    let dev = Default::default();
    Spill::configure(
        &dev,
        SpillConfig::default()
            .device_budget_bytes(0)
            .unlimited_host(),
    )
    .unwrap();
    let a = Tensor::<Spill, 3>::from_data(TensorData::new(vec![1.0f32; 4], [1, 1, 4]), &dev);
    let b = a.clone().exp();
    let on = |t: &Tensor<Spill, 3>| t.clone().into_primitive().tensor().residency();
    assert_eq!(on(&a), burn_spill::Tier::Host);
    assert_eq!(on(&b), burn_spill::Tier::Host);
    Spill::configure(
        &dev,
        SpillConfig::default()
            .device_budget_bytes(0)
            .host_limit_bytes(0),
    )
    .unwrap();
    let c = b.clone() + a.clone();
    assert_eq!(on(&c), burn_spill::Tier::Disk);
    assert_eq!(on(&a), burn_spill::Tier::Disk);
}
