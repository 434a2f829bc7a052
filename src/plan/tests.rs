//! The dry run on synthetic steps whose answers are known.

use super::*;
use crate::tape::{DropRecord, OpRecord, Producer, TensorRecord};
use crate::{PolicyKind, RecomputeMode, TensorRole};

const MIB: u64 = 1 << 20;

/// A step of `ops` (name, inputs, outputs) over f32 vectors of `sizes` bytes; tensors no op
/// produced come from before the step.
pub(crate) fn tape(
    ops: &[(&str, &[u64], &[u64])],
    sizes: &[(u64, u64)],
    drops: &[(u64, u32)],
) -> StepTape {
    let tensors = sizes
        .iter()
        .map(|&(id, bytes)| TensorRecord {
            id,
            bytes,
            dtype: "F32".into(),
            shape: vec![(bytes / 4) as usize],
            role: TensorRole::Other,
            producer: ops
                .iter()
                .position(|(_, _, out)| out.contains(&id))
                .map(|op| Producer {
                    op: op as u32,
                    output: 0,
                }),
        })
        .collect();
    StepTape {
        version: crate::tape::TAPE_SCHEMA_VERSION,
        ops: ops
            .iter()
            .map(|(name, i, o)| OpRecord {
                name: name.to_string(),
                inputs: i.to_vec(),
                outputs: o.to_vec(),
                start_ns: 0,
                duration_ns: 1_000,
                thread: 1,
            })
            .collect(),
        tensors,
        drops: drops
            .iter()
            .map(|&(id, after_ops)| DropRecord { id, after_ops })
            .collect(),
        ..Default::default()
    }
}

/// A step whose ops 0-5 each make a 1 KiB tensor that op 6 reads and frees: op k's room is
/// k + 1 KiB, and 6 KiB from op 5 on, into the next step.
pub(crate) fn growing_tape() -> StepTape {
    const KIB: u64 = 1024;
    let made: Vec<u64> = (10..16).collect();
    let mut ops: Vec<(&str, &[u64], &[u64])> = made
        .iter()
        .map(|id| ("float_exp", &[][..], std::slice::from_ref(id)))
        .collect();
    ops.push(("float_sum", &made, &[]));
    let sizes: Vec<(u64, u64)> = made.iter().map(|&id| (id, KIB)).collect();
    let drops: Vec<(u64, u32)> = made.iter().map(|&id| (id, 7)).collect();
    tape(&ops, &sizes, &drops)
}

/// A device whose figures make times easy: 1 GB/s memory, a 1 GB/s link each way, no fixed
/// costs.
pub(super) fn slow_device() -> DeviceProfile {
    let mut p = DeviceProfile::builtin("a100-pcie4").unwrap();
    p.name = "slow".into();
    p.hbm_gb_per_s = 1.0;
    p.memory_efficiency = 1.0;
    p.host_to_device_gb_per_s = 1.0;
    p.device_to_host_gb_per_s = 1.0;
    p.duplex_gb_per_s = 1.0;
    p.transfer_latency_us = 0.0;
    p.launch_us = 0.0;
    p
}

/// Two 8 MiB inputs a, b; a is read first and last, b in the middle, around a long chain of
/// adds on c that make room scarce.
fn forward_and_back() -> StepTape {
    forward_and_back_of(8 * MIB)
}

/// [`forward_and_back`] with tensors of `size` bytes.
fn forward_and_back_of(size: u64) -> StepTape {
    tape(
        &[
            ("float_exp", &[1], &[3]),
            ("float_exp", &[2], &[4]),
            ("float_add", &[3, 4], &[5]),
            ("float_exp", &[5], &[6]),
            ("float_exp", &[6], &[7]),
            ("float_add", &[7, 2], &[8]),
            ("float_add", &[8, 1], &[9]),
        ],
        &[
            (1, size),
            (2, size),
            (3, size),
            (4, size),
            (5, size),
            (6, size),
            (7, size),
            (8, size),
            (9, size),
        ],
        &[(3, 3), (4, 3), (5, 4), (6, 5), (7, 6), (8, 7)],
    )
}

fn config(budget: u64) -> SpillConfig {
    SpillConfig::transformer()
        .device_budget_bytes(budget)
        .policy(PolicyKind::NextUse)
}

#[test]
fn unlimited_memory_moves_nothing_and_takes_the_ops_time() {
    let t = forward_and_back();
    let p = slow_device();
    let run = dry_run(&t, &p, &SpillConfig::default()).unwrap();
    // Each op reads and writes 8 MiB per tensor at 1 GB/s: 2 or 3 tensors' worth.
    let bytes: u64 = [2, 2, 3, 2, 2, 3, 3].iter().sum::<u64>() * 8 * MIB;
    let expected = bytes as f64 / 1e9;
    assert!((run.simulated.step_seconds - expected).abs() < 1e-9);
    assert_eq!(run.simulated.traffic, Traffic::default());
    assert_eq!(run.overhead, 0.0);
    assert_eq!(run.unlimited_peak, run.simulated.device_peak);
}

#[test]
fn a_budget_below_the_peak_moves_bytes_and_stays_within_it() {
    let t = forward_and_back();
    let p = slow_device();
    let unlimited = dry_run(&t, &p, &SpillConfig::default()).unwrap();
    for budget in [36 * MIB, 32 * MIB, 28 * MIB, 24 * MIB] {
        let run = dry_run(&t, &p, &config(budget)).unwrap();
        let sim = &run.simulated;
        assert!(budget < unlimited.unlimited_peak);
        assert_eq!(sim.over_budget_ops, 0, "{budget}: {sim:?}");
        assert!(sim.device_peak <= budget, "{budget}: {sim:?}");
        assert!(sim.traffic.total() > 0, "{budget}: {sim:?}");
        assert!(run.overhead >= 0.0);
        // What goes out comes back, or is never read again; and b, which no tensor of the step
        // is handed over as (a batch), may start the step on the host and come in without
        // going out.
        let b = 8 * MIB;
        assert!(
            sim.traffic.host_to_device <= sim.traffic.device_to_host + b,
            "{budget}: {sim:?}"
        );
    }
}

#[test]
fn a_budget_below_one_op_is_refused_with_the_op() {
    let t = forward_and_back();
    let err = dry_run(&t, &slow_device(), &config(20 * MIB)).unwrap_err();
    // The largest op (an add of two 8 MiB tensors into a third, the first at op 2) is named.
    assert!(
        matches!(err, SpillError::PlanBudget { op: 2, .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("float_add") && text.contains(&(24 * MIB).to_string()),
        "{text}"
    );
    assert_eq!(min_budget(&t), 24 * MIB);
}

/// Worked by hand, at a 100 MiB budget: `a` (16 MiB) is read only by the last op. Op 1 (the
/// adds of two 32 MiB tensors into a third) has no room for it beside them, so it leaves then.
/// Op 2 (an exp of 32 MiB, 64 ms at 1 GB/s) has room: a prefetch queued after op 1 brings `a`
/// back in 16 ms behind it, and op 3 waits for nothing. Without prefetch op 3 restores it on
/// demand and waits those 16 ms.
#[test]
fn prefetch_hides_a_restore_behind_compute() {
    let t = tape(
        &[
            ("float_exp", &[2], &[3]),
            ("float_add", &[3, 4], &[5]),
            ("float_exp", &[5], &[6]),
            ("float_add", &[6, 1], &[7]),
        ],
        &[
            (1, 16 * MIB),
            (2, 8 * MIB),
            (3, 32 * MIB),
            (4, 32 * MIB),
            (5, 32 * MIB),
            (6, 32 * MIB),
            (7, 32 * MIB),
        ],
        &[(2, 1), (3, 2), (4, 2), (5, 3)],
    );
    let p = slow_device();
    let with = dry_run(&t, &p, &config(100 * MIB)).unwrap();
    let without = dry_run(&t, &p, &config(100 * MIB).prefetch_window(0)).unwrap();
    let restore = 16.0 * MIB as f64 / 1e9;
    assert!(with.simulated.prefetch_hits >= 1, "{:?}", with.simulated);
    assert!(
        without.simulated.late_inputs >= 1,
        "{:?}",
        without.simulated
    );
    assert!(
        without.simulated.stall_seconds - with.simulated.stall_seconds >= restore * 0.99,
        "with {:?}\nwithout {:?}",
        with.simulated,
        without.simulated
    );
    assert!(with.overhead < without.overhead);
}

#[test]
fn a_faster_link_costs_less() {
    let t = forward_and_back();
    let slow = slow_device();
    let mut fast = slow.clone();
    fast.host_to_device_gb_per_s = 100.0;
    fast.device_to_host_gb_per_s = 100.0;
    fast.duplex_gb_per_s = 100.0;
    let budget = 24 * MIB;
    let a = dry_run(&t, &slow, &config(budget).asynchronous(false)).unwrap();
    let b = dry_run(&t, &fast, &config(budget).asynchronous(false)).unwrap();
    assert_eq!(a.simulated.traffic, b.simulated.traffic);
    assert!(b.overhead < a.overhead, "{} vs {}", b.overhead, a.overhead);
    assert!(a.overhead > 0.0);
}

/// [`forward_and_back_of`] `blocks` times over, each block's result dropped once made: a step
/// that moves a few tensors per block.
fn blocks_of(size: u64, blocks: u64) -> StepTape {
    let one = forward_and_back_of(size);
    let ops = one.ops.len() as u64;
    let mut t = StepTape {
        version: one.version,
        ..Default::default()
    };
    for b in 0..blocks {
        let shift = |id: u64| id + 10 * b;
        for op in &one.ops {
            let mut op = op.clone();
            op.inputs = op.inputs.iter().map(|&i| shift(i)).collect();
            op.outputs = op.outputs.iter().map(|&i| shift(i)).collect();
            t.ops.push(op);
        }
        for tensor in &one.tensors {
            let mut tensor = tensor.clone();
            tensor.id = shift(tensor.id);
            if let Some(p) = tensor.producer.as_mut() {
                p.op += (ops * b) as u32;
            }
            t.tensors.push(tensor);
        }
        for d in one.drops.iter().chain(&[DropRecord {
            id: 9,
            after_ops: ops as u32,
        }]) {
            t.drops.push(DropRecord {
                id: shift(d.id),
                after_ops: d.after_ops + (ops * b) as u32,
            });
        }
    }
    t
}

/// The asynchronous engine runs a move that takes less than waking its worker on the op's
/// thread, so with tiny tensors (8 KiB, 8 µs at 1 GB/s) it waits for its moves nearly as long
/// as the synchronous one does; with 8 MiB ones (8 ms) the worker takes them and the ops wait less.
#[test]
fn moves_cheaper_than_a_handoff_wait_on_the_ops_thread() {
    let p = slow_device();
    let predict = |size: u64, asynchronous: bool| {
        let t = blocks_of(size, 8);
        dry_run(&t, &p, &config(3 * size).asynchronous(asynchronous))
            .unwrap()
            .simulated
    };
    let (tiny_async, tiny_sync) = (predict(8 << 10, true), predict(8 << 10, false));
    let (big_async, big_sync) = (predict(8 * MIB, true), predict(8 * MIB, false));
    assert!(tiny_sync.evictions >= 16, "{tiny_sync:?}");
    // What it learnt from its first moves, which went to the worker, makes the asynchronous
    // engine's steady state differ a little from the synchronous one's.
    assert!(
        tiny_async.stall_seconds >= 0.9 * tiny_sync.stall_seconds,
        "async {tiny_async:?}\nsync {tiny_sync:?}"
    );
    assert!(
        big_async.step_seconds < big_sync.step_seconds,
        "async {big_async:?}\nsync {big_sync:?}"
    );
}

#[test]
fn sweep_runs_every_feasible_fraction() {
    let t = forward_and_back();
    let runs = sweep(&t, &slow_device(), &config(0), &SWEEP_FRACTIONS).unwrap();
    let peak = runs[0].unlimited_peak;
    assert_eq!(runs[0].budget, peak);
    assert!(runs.iter().all(|r| r.budget >= min_budget(&t)));
    // Worked by hand: the peak is 40 MiB (a, b, c, d and e at op 2), the floor 24 MiB (an add
    // of two 8 MiB tensors beside a and b... by itself, its three tensors): 100% down to 60%
    // run, 50% does not.
    assert_eq!(peak, 40 * MIB);
    assert!((4..=5).contains(&runs.len()), "{}", runs.len());
    assert!(runs.windows(2).all(|w| w[1].budget < w[0].budget));
}

fn batched(batch: u64) -> StepTape {
    let b = batch * MIB;
    let mut t = tape(
        &[
            ("float_matmul", &[1, 2], &[3]),
            ("float_exp", &[3], &[4]),
            ("float_add", &[4, 1], &[5]),
        ],
        &[(1, b), (2, MIB), (3, b), (4, b), (5, b)],
        &[(3, 2)],
    );
    for op in &mut t.ops {
        op.duration_ns = 1_000 * batch;
    }
    t
}

#[test]
fn a_tape_scales_linearly_in_the_batch() {
    let (small, large) = (batched(2), batched(4));
    let at8 = scale_tape(&small, 2, &large, 4, 8).unwrap();
    let expected = batched(8);
    for (a, b) in at8.tensors.iter().zip(&expected.tensors) {
        assert_eq!((a.bytes, &a.shape), (b.bytes, &b.shape), "tensor {}", a.id);
    }
    assert_eq!(at8.ops[1].duration_ns, 8_000);
}

/// A metrics thread's read that landed in one recording only (as ResNet-50's batch-2 tape once
/// held 3 reads from another thread) does not make the two tapes different programs.
#[test]
fn another_threads_ops_in_one_recording_do_not_stop_the_scaling() {
    let small = batched(2);
    let mut large = batched(4);
    large.ops.insert(
        2,
        OpRecord {
            name: "float_read".into(),
            inputs: vec![4],
            outputs: vec![],
            start_ns: 0,
            duration_ns: 500,
            thread: 2,
        },
    );
    let at8 = scale_tape(&small, 2, &large, 4, 8).unwrap();
    let expected = batched(8);
    for (a, b) in at8.tensors.iter().zip(&expected.tensors) {
        assert_eq!((a.bytes, &a.shape), (b.bytes, &b.shape), "tensor {}", a.id);
    }
    // The stepping thread's ops scale; the other thread's keeps its recorded time.
    assert_eq!(at8.ops[1].duration_ns, 8_000);
    assert_eq!(at8.ops[3].duration_ns, 8_000);
    assert_eq!(at8.ops[2].duration_ns, 500);
    // The median of several recordings still pairs every op.
    let err = median_tape(&[small, large]).unwrap_err().to_string();
    assert!(err.contains("same program"), "{err}");
}

#[test]
fn the_batch_search_finds_the_largest_batch_within_the_limit() {
    let (small, large) = (batched(2), batched(4));
    let p = slow_device();
    // Budget 24 MiB: batch b needs 3b MiB at its largest op, so b <= 8 runs at all.
    let found = max_batch(&small, 2, &large, 4, &p, &config(24 * MIB), 0.5).unwrap();
    let batch = found.batch.unwrap();
    assert!(batch <= 8, "{found:?}");
    assert!(found.run.as_ref().unwrap().overhead <= 0.5);
    // The next batch up is over the limit, or does not fit.
    let next = found.tried.iter().find(|(b, _)| *b == batch + 1).unwrap();
    assert!(next.1.is_none_or(|o| o > 0.5), "{found:?}");
}

#[test]
fn the_batch_search_refuses_tapes_of_different_programs() {
    let mut other = batched(4);
    other.ops[1].name = "float_log".into();
    let err = max_batch(
        &batched(2),
        2,
        &other,
        4,
        &slow_device(),
        &config(u64::MAX),
        0.1,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("float_log") && err.contains("same program"),
        "{err}"
    );
    other.ops.pop();
    let err = scale_tape(&batched(2), 2, &other, 4, 8)
        .unwrap_err()
        .to_string();
    assert!(err.contains("ops"), "{err}");
    let err = scale_tape(&batched(2), 2, &batched(4), 2, 8)
        .unwrap_err()
        .to_string();
    assert!(err.contains("two different"), "{err}");
}

#[test]
fn the_median_tape_takes_each_op_at_its_median() {
    let mut a = batched(2);
    let mut b = batched(2);
    let mut c = batched(2);
    for (t, d) in [(&mut a, 10), (&mut b, 30), (&mut c, 20)] {
        let mut start = 5;
        for op in &mut t.ops {
            op.start_ns = start;
            op.duration_ns = d;
            start += d + 5;
        }
        t.duration_ns = start;
    }
    let m = median_tape(&[a, b.clone(), c]).unwrap();
    assert!(m.ops.iter().all(|op| op.duration_ns == 20));
    assert_eq!(m.ops[1].start_ns, 5 + 20 + 5);
    assert_eq!(m.duration_ns, 3 * 25 + 5);
    let mut other = b;
    other.ops.pop();
    assert!(median_tape(&[m, other]).is_err());
    assert!(median_tape(&[]).is_err());
}

/// `b = exp(a)` is made first and read last, beside `a`, which is read just before it too:
/// under a budget that cannot hold both across the chain in the middle, `b` is the victim used
/// furthest away, and the simulation may drop it (its recipe's input outlives its next use) and
/// rebuild it at the end instead of moving it.
fn rebuild_at_the_end() -> StepTape {
    let size = 8 * MIB;
    tape(
        &[
            ("float_exp", &[1], &[2]),
            ("float_exp", &[3], &[4]),
            ("float_exp", &[4], &[5]),
            ("float_add", &[5, 3], &[6]),
            ("float_add", &[6, 1], &[7]),
            ("float_add", &[2, 1], &[8]),
            ("float_add", &[8, 7], &[9]),
        ],
        &[
            (1, size),
            (2, size),
            (3, size),
            (4, size),
            (5, size),
            (6, size),
            (7, size),
            (8, size),
            (9, size),
        ],
        &[
            (4, 3),
            (3, 4),
            (5, 4),
            (6, 5),
            (1, 6),
            (2, 6),
            (7, 7),
            (8, 7),
        ],
    )
}

#[test]
fn recompute_drops_and_rebuilds_within_the_budget_and_moves_less() {
    let t = rebuild_at_the_end();
    let mut p = slow_device();
    // Memory far faster than the link, as on a GPU: a rebuild is cheap next to a round trip.
    p.hbm_gb_per_s = 100.0;
    let budget = 32 * MIB;
    let with = |mode| {
        let run = dry_run(&t, &p, &config(budget).recompute(mode)).unwrap();
        run.simulated
    };
    let swap = with(RecomputeMode::Swap);
    let recompute = with(RecomputeMode::Recompute);
    let both = with(RecomputeMode::Both);
    assert_eq!((swap.drops, swap.rebuilds), (0, 0), "{swap:?}");
    assert!(swap.traffic.total() > 0, "the budget binds: {swap:?}");
    for sim in [&recompute, &both] {
        assert!(sim.drops > 0 && sim.rebuilds == sim.drops, "{sim:?}");
        assert!(sim.device_peak <= budget, "{sim:?}");
        assert_eq!(sim.over_budget_ops, 0, "{sim:?}");
        assert!(
            sim.traffic.total() < swap.traffic.total(),
            "{sim:?} vs {swap:?}"
        );
        assert!(sim.rebuild_seconds > 0.0);
    }
    assert!(
        both.step_seconds < swap.step_seconds,
        "both {} vs swap {}",
        both.step_seconds,
        swap.step_seconds
    );
}

#[test]
fn recompute_leaves_tensors_of_impure_ops_and_dead_inputs_alone() {
    let p = slow_device();
    let budget = 32 * MIB;
    // `b`'s producer renamed to a random op: it has no recipe.
    let mut random = rebuild_at_the_end();
    random.ops[0].name = "float_random".into();
    let run = dry_run(
        &random,
        &p,
        &config(budget).recompute(RecomputeMode::Recompute),
    )
    .unwrap();
    assert_eq!(run.simulated.drops, 0, "{:?}", run.simulated);
    // `b = exp(a)` with `a` gone right after: the recipe would keep `a` alive, so `b` moves.
    let size = 8 * MIB;
    let dead = tape(
        &[
            ("float_exp", &[1], &[2]),
            ("float_random", &[], &[3]),
            ("float_matmul", &[3, 3], &[4]),
            ("float_matmul", &[4, 3], &[6]),
            ("float_add", &[2, 6], &[5]),
        ],
        &[
            (1, size),
            (2, size),
            (3, size),
            (4, size),
            (5, size),
            (6, size),
        ],
        &[(1, 1), (4, 4), (3, 4), (2, 5), (6, 5)],
    );
    let run = dry_run(
        &dead,
        &p,
        &config(24 * MIB).recompute(RecomputeMode::Recompute),
    )
    .unwrap();
    assert_eq!(run.simulated.drops, 0, "{:?}", run.simulated);
    assert!(run.simulated.traffic.total() > 0, "{:?}", run.simulated);
}

#[test]
fn assumed_recipes_let_a_matmul_output_be_dropped_as_an_elementwise_one_is() {
    let p = slow_device();
    let budget = 32 * MIB;
    let elementwise = dry_run(
        &rebuild_at_the_end(),
        &p,
        &config(budget).recompute(RecomputeMode::Recompute),
    )
    .unwrap();
    assert!(
        elementwise.simulated.drops > 0,
        "{:?}",
        elementwise.simulated
    );
    // `b`'s producer renamed to a matrix product: the engine keeps no recipe for it.
    let mut product = rebuild_at_the_end();
    product.ops[0].name = "float_matmul".into();
    product.ops[0].inputs = vec![1, 1];
    let run = |extra: &[RecipeClass]| {
        let assumptions = Assumptions {
            state: StateResidency::Movable,
            extra_recipes: extra.iter().copied().collect(),
        };
        let config = config(budget).recompute(RecomputeMode::Recompute);
        dry_run_assuming(&product, &p, &config, assumptions)
            .unwrap()
            .simulated
    };
    let engine = run(&[]);
    assert_eq!(engine.drops, 0, "{engine:?}");
    let other_classes = run(&[RecipeClass::Reductions, RecipeClass::Views]);
    assert_eq!(other_classes.drops, 0, "{other_classes:?}");
    let assumed = run(&[RecipeClass::Matmul]);
    assert!(
        assumed.drops > 0 && assumed.rebuilds == assumed.drops,
        "{assumed:?}"
    );
    assert!(assumed.device_peak <= budget, "{assumed:?}");
    assert!(
        assumed.traffic.total() < engine.traffic.total(),
        "{assumed:?} vs {engine:?}"
    );
    // The rebuild runs on the stream and its time is counted.
    assert!(assumed.rebuild_seconds > 0.0, "{assumed:?}");
}

/// `x = exp(a)` and `y` (random: no recipe) compete for the one place an op needs: `y` is
/// used last, so a policy that weighs only moves takes it, and has to move it (it cannot be
/// rebuilt); `x` is used sooner but is far cheaper to rebuild than to bring back.
fn a_cheap_rebuild_against_a_later_move() -> StepTape {
    let size = 8 * MIB;
    tape(
        &[
            ("float_exp", &[1], &[2]),
            ("float_random", &[], &[3]),
            ("float_random", &[], &[4]),
            ("float_random", &[], &[5]),
            ("float_add", &[4, 5], &[6]),
            ("float_add", &[2, 1], &[7]),
            ("float_add", &[3, 7], &[8]),
        ],
        &[
            (1, size),
            (2, size),
            (3, size),
            (4, size),
            (5, size),
            (6, size),
            (7, size),
            (8, size),
        ],
        &[
            (4, 5),
            (5, 5),
            (6, 5),
            (1, 6),
            (2, 6),
            (3, 7),
            (7, 7),
            (8, 7),
        ],
    )
}

/// Ranked by the cheaper way back (`cost_aware`, the link busy), both modes that drop take
/// `x`, nearly free to rebuild, and move nothing; ranked by the policy's order alone (swap
/// only, or recompute-only under `next_use`), `y` goes first and has to move.
#[test]
fn modes_that_drop_take_the_victim_cheaper_to_rebuild_than_the_one_a_move_would_take() {
    let t = a_cheap_rebuild_against_a_later_move();
    let mut p = slow_device();
    // Memory far faster than the link: rebuilding `x` costs next to nothing.
    p.hbm_gb_per_s = 1000.0;
    // Five tensors live when the add makes a sixth: one has to go.
    let budget = 40 * MIB;
    let with = |mode, policy| {
        let config = config(budget)
            .policy(policy)
            .prefetch_window(0)
            .recompute(mode);
        dry_run(&t, &p, &config).unwrap().simulated
    };
    let swap = with(RecomputeMode::Swap, PolicyKind::CostAware);
    assert_eq!(swap.drops, 0, "`y` is the victim, and moves: {swap:?}");
    assert!(swap.traffic.total() > 0, "{swap:?}");
    let unranked = with(RecomputeMode::Recompute, PolicyKind::NextUse);
    assert_eq!(
        unranked.drops, 0,
        "by next use alone `y` is the victim, and moves: {unranked:?}"
    );
    assert!(unranked.traffic.total() > 0, "{unranked:?}");
    for mode in [RecomputeMode::Recompute, RecomputeMode::Both] {
        let ranked = with(mode, PolicyKind::CostAware);
        assert_eq!(
            (ranked.drops, ranked.rebuilds),
            (1, 1),
            "{mode:?}: {ranked:?}"
        );
        assert_eq!(ranked.traffic.total(), 0, "{mode:?}: {ranked:?}");
        assert!(ranked.device_peak <= budget, "{mode:?}: {ranked:?}");
        assert!(
            ranked.step_seconds < swap.step_seconds,
            "{mode:?} {} vs swap {}",
            ranked.step_seconds,
            swap.step_seconds
        );
    }
}

/// `both` runs each plan with the behaviour its dry run predicts fastest, so it is never
/// slower than swap only or recompute only: on memory far faster than the link it drops, and
/// on memory too slow to rebuild on it drops nothing.
#[test]
fn both_runs_the_behaviour_its_dry_run_predicts_fastest() {
    use crate::policy::recompute::BEHAVIOURS;
    let t = rebuild_at_the_end();
    let budget = 32 * MIB;
    for (hbm, drops) in [(100.0, true), (1e-3, false)] {
        let mut p = slow_device();
        p.hbm_gb_per_s = hbm;
        let run = |mode| dry_run(&t, &p, &config(budget).recompute(mode)).unwrap();
        let (swap, recompute, both) = (
            run(RecomputeMode::Swap),
            run(RecomputeMode::Recompute),
            run(RecomputeMode::Both),
        );
        assert_eq!(swap.chose, None, "swap only chooses nothing");
        let recompute_chose = recompute
            .chose
            .expect("`recompute` chose how to make room early");
        assert_eq!(recompute_chose.victims, RecomputeMode::Recompute);
        let chose = both.chose.expect("`both` chose a behaviour");
        assert!(BEHAVIOURS.contains(&chose), "{chose:?}");
        let fastest = swap
            .simulated
            .step_seconds
            .min(recompute.simulated.step_seconds);
        assert!(
            both.simulated.step_seconds <= fastest,
            "memory at {hbm} GB/s: both ({chose}) {} vs {fastest}",
            both.simulated.step_seconds
        );
        assert_eq!(
            both.simulated.drops > 0,
            drops,
            "memory at {hbm} GB/s: {chose}, {:?}",
            both.simulated
        );
    }
    let unlimited = dry_run(
        &t,
        &slow_device(),
        &config(u64::MAX).recompute(RecomputeMode::Both),
    )
    .unwrap();
    assert_eq!(unlimited.chose, None, "nothing to choose without a budget");
}

/// A 3 MiB weight `w` (1) read first and last, beside 8 MiB activations and one of 16 MiB
/// (5): 3 is read at ops 1 and 6 and stays alive between, where 4 to 8 come and go; the last
/// op makes the weight's 3 MiB update (9), which survives the step. The peak is 35 MiB (ops 2
/// and 3), the largest op alone needs 24 MiB (op 2: 4 and 5), and with the state (1 and 9)
/// kept on the device, 27 MiB (op 2 beside w).
fn weight_beside_activations() -> StepTape {
    tape(
        &[
            ("float_exp", &[1], &[3]),
            ("float_exp", &[3], &[4]),
            ("float_exp", &[4], &[5]),
            ("float_exp", &[5], &[6]),
            ("float_exp", &[6], &[7]),
            ("float_exp", &[7], &[8]),
            ("float_add", &[8, 3, 1], &[9]),
        ],
        &[
            (1, 3 * MIB),
            (3, 8 * MIB),
            (4, 8 * MIB),
            (5, 16 * MIB),
            (6, 8 * MIB),
            (7, 8 * MIB),
            (8, 8 * MIB),
            (9, 3 * MIB),
        ],
        &[(4, 3), (5, 4), (6, 5), (7, 6), (3, 7), (8, 7), (1, 7)],
    )
}

#[test]
fn pinned_state_stays_on_the_device_and_activations_move_instead() {
    let t = weight_beside_activations();
    let p = slow_device();
    assert_eq!(min_budget(&t), 24 * MIB);
    assert_eq!(state::pinned_floor(&t), Some((2, 3 * MIB, 27 * MIB)));
    let unlimited = dry_run(&t, &p, &SpillConfig::default()).unwrap();
    assert_eq!(unlimited.unlimited_peak, 35 * MIB);
    for policy in [PolicyKind::NextUse, PolicyKind::Lru, PolicyKind::CostAware] {
        let config = SpillConfig::transformer()
            .device_budget_bytes(27 * MIB)
            .policy(policy);
        let run = dry_run_assuming(&t, &p, &config, StateResidency::Pinned).unwrap();
        let sim = &run.simulated;
        assert_eq!(sim.over_budget_ops, 0, "{policy:?}: {sim:?}");
        assert!(sim.device_peak <= 27 * MIB, "{policy:?}: {sim:?}");
        // Only activations (8 and 16 MiB) moved: the 3 MiB weight and its update never did.
        let traffic = sim.traffic;
        assert!(traffic.device_to_host > 0, "{policy:?}: {sim:?}");
        for bytes in [
            traffic.device_to_host,
            traffic.device_to_disk,
            traffic.host_to_device,
            traffic.disk_to_device,
        ] {
            assert_eq!(bytes % (8 * MIB), 0, "{policy:?}: {sim:?}");
        }
    }
    // Moving the state as the engine does, the weight leaves too: it is tied with 3 on its
    // next use, and used less recently.
    let moved = dry_run(&t, &p, &config(27 * MIB)).unwrap().simulated;
    assert_ne!(moved.traffic.device_to_host % (8 * MIB), 0, "{moved:?}");
}

#[test]
fn a_budget_below_the_pinned_state_and_an_op_is_refused_with_both_figures() {
    let t = weight_beside_activations();
    let p = slow_device();
    // 26 MiB fits every op when the state may move, not op 2 beside the weight.
    dry_run(&t, &p, &config(26 * MIB)).unwrap();
    let err = dry_run_assuming(&t, &p, &config(26 * MIB), StateResidency::Pinned).unwrap_err();
    assert!(
        matches!(
            err,
            SpillError::PlanStateBudget {
                op: 2,
                state,
                needed,
                ..
            } if state == 3 * MIB && needed == 27 * MIB
        ),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("float_exp") && text.contains(&(27 * MIB).to_string()),
        "{text}"
    );
    // A sweep leaves out the fractions below that floor: 75% and 70% of 35 MiB (26.25 and
    // 24.5 MiB) fit every op alone, not beside the state.
    let fractions = [1.0, 0.9, 0.8, 0.75, 0.7];
    let pinned = sweep_assuming(&t, &p, &config(0), &fractions, StateResidency::Pinned).unwrap();
    assert_eq!(pinned.len(), 3, "{pinned:?}");
    assert!(pinned.iter().all(|r| r.budget >= 27 * MIB));
    assert_eq!(sweep(&t, &p, &config(0), &fractions).unwrap().len(), 5);
}

/// A 3 MiB weight `w` (1) read first and last; op 0 also makes a spare 8 MiB activation (10)
/// that only the last op reads, so that a pass early in the step has an activation to take
/// beside the weight. The peak is 43 MiB (ops 2 and 3: w, 3, 10 and 4 or 6 beside the 16 MiB
/// 5); the last op reads 6, 3, 10 and w and makes w's 3 MiB update (9).
fn weight_beside_a_spare_activation() -> StepTape {
    tape(
        &[
            ("float_exp", &[1], &[3, 10]),
            ("float_exp", &[3], &[4]),
            ("float_exp", &[4], &[5]),
            ("float_exp", &[5], &[6]),
            ("float_add", &[6, 3, 10, 1], &[9]),
        ],
        &[
            (1, 3 * MIB),
            (3, 8 * MIB),
            (10, 8 * MIB),
            (4, 8 * MIB),
            (5, 16 * MIB),
            (6, 8 * MIB),
            (9, 3 * MIB),
        ],
        &[(4, 3), (5, 4), (6, 5), (3, 5), (10, 5), (1, 5)],
    )
}

/// The behaviours that keep the state on the device move activations first (only 8 MiB
/// tensors move at 35 MiB, where moving the state lets the 3 MiB weight go too); on
/// [`weight_beside_activations`], below what op 2 needs beside the weight, the weight leaves
/// too rather than an op running over the budget.
#[test]
fn a_behaviour_keeping_the_state_moves_it_only_when_activations_fall_short() {
    let p = slow_device();
    let run = |t: &StepTape, budget: u64, keeps_state: bool| {
        let settings = Settings {
            budget,
            host_limit: None,
            policy: PolicyKind::NextUse,
            prefetch_window: 4,
            asynchronous: true,
            recompute: RecomputeMode::Swap,
            rebuild_room: crate::policy::recompute::RebuildRoom::AtSettle,
            keeps_lineage: true,
            state: StateResidency::Movable,
            keeps_state,
            evicts_early: false,
            paces_early: false,
            extra_recipes: super::what_if::ExtraRecipes::NONE,
        };
        let (op_seconds, gaps) = (cost::op_seconds(t, &p), cost::host_gaps(t, &p));
        simulate(t, &p, &op_seconds, &gaps, settings)
    };
    let spare = weight_beside_a_spare_activation();
    let kept = run(&spare, 35 * MIB, true);
    assert!(kept.traffic.device_to_host > 0, "{kept:?}");
    assert_eq!(kept.traffic.device_to_host % (8 * MIB), 0, "{kept:?}");
    assert_eq!(kept.traffic.host_to_device % (8 * MIB), 0, "{kept:?}");
    let moved = run(&spare, 35 * MIB, false);
    assert_ne!(moved.traffic.device_to_host % (8 * MIB), 0, "{moved:?}");
    let short = run(&weight_beside_activations(), 25 * MIB, true);
    assert_eq!(short.over_budget_ops, 0, "{short:?}");
    assert!(short.device_peak <= 25 * MIB, "{short:?}");
    assert_ne!(short.traffic.device_to_host % (8 * MIB), 0, "{short:?}");
}

/// `SpillConfig::keep_state` reaches the dry run: under swap only the state stays while the
/// activations suffice; under `both` the behaviour chosen keeps it as set, even below the
/// budget that fits the state beside every op.
#[test]
fn the_configured_keep_state_is_what_the_dry_run_follows() {
    let p = slow_device();
    let spare = weight_beside_a_spare_activation();
    let kept = dry_run(&spare, &p, &config(35 * MIB).keep_state(true)).unwrap();
    assert_eq!(
        kept.simulated.traffic.device_to_host % (8 * MIB),
        0,
        "{kept:?}"
    );
    assert!(kept.simulated.traffic.device_to_host > 0, "{kept:?}");
    let t = weight_beside_activations();
    for (budget, keep) in [(27 * MIB, true), (26 * MIB, true), (26 * MIB, false)] {
        let both = config(budget)
            .recompute(RecomputeMode::Both)
            .keep_state(keep);
        let run = dry_run(&t, &p, &both).unwrap();
        let chose = run.chose.expect("both chooses under a budget");
        assert_eq!(chose.keeps_state, keep, "{budget}: {chose:?}");
        assert_eq!(run.simulated.over_budget_ops, 0, "{budget}: {run:?}");
        assert_eq!(
            run.predicted_behaviours.len(),
            21,
            "{budget}: {:?}",
            run.predicted_behaviours
        );
    }
    // Unset, `both` dry-runs all forty-two behaviours.
    let both = dry_run(&t, &p, &config(26 * MIB).recompute(RecomputeMode::Both)).unwrap();
    assert_eq!(both.predicted_behaviours.len(), 42);
}

/// Op 0 reads sources 1-5 (2-5 of 8 MiB each); ops 1-70 read source 1 and make a small tensor
/// freed at once; ops 71-80 each make 8 MiB that op 81 reads, and op 82 reads sources 2-5
/// again: the peak is 70 ops away after op 0, beyond the settle's reach, and what must leave
/// for it takes longer on a link of 1 GB/s than the small ops before it run.
fn peak_beyond_the_settle() -> StepTape {
    const KIB: u64 = 1024;
    let scratch: Vec<u64> = (200..270).collect();
    let made: Vec<u64> = (100..110).collect();
    let mut ops: Vec<(&str, Vec<u64>, Vec<u64>)> = vec![("float_add", vec![1, 2, 3, 4, 5], vec![])];
    ops.extend(scratch.iter().map(|&id| ("float_exp", vec![1], vec![id])));
    ops.extend(made.iter().map(|&id| ("float_exp", Vec::new(), vec![id])));
    ops.push(("float_sum", made.clone(), Vec::new()));
    ops.push(("float_add", vec![2, 3, 4, 5], Vec::new()));
    let ops: Vec<(&str, &[u64], &[u64])> = ops
        .iter()
        .map(|(name, i, o)| (*name, i.as_slice(), o.as_slice()))
        .collect();
    let sizes: Vec<(u64, u64)> = std::iter::once((1, 64 * KIB))
        .chain(scratch.iter().map(|&id| (id, 64 * KIB)))
        .chain(
            [2, 3, 4, 5]
                .into_iter()
                .chain(made.iter().copied())
                .map(|id| (id, 8 * MIB)),
        )
        .collect();
    let drops: Vec<(u64, u32)> = (scratch.iter().zip(2..))
        .chain(made.iter().map(|id| (id, 82)))
        .map(|(&id, after_ops)| (id, after_ops))
        .collect();
    tape(&ops, &sizes, &drops)
}

/// `swap`'s dry run is `both`'s behaviour that moves every victim and makes room early a share
/// at a time, as the engine runs `swap`.
#[test]
fn swap_runs_as_moving_every_victim_with_room_made_early_a_share_at_a_time() {
    use crate::policy::recompute::{Behaviour, RebuildRoom};
    // Ops a hundred times faster than the link.
    let mut p = slow_device();
    p.hbm_gb_per_s = 100.0;
    let t = peak_beyond_the_settle();
    let swap = Behaviour::new(RecomputeMode::Swap, RebuildRoom::AtSettle);
    let mut early_mattered = false;
    for budget in [88 * MIB, 96 * MIB, 104 * MIB] {
        let alone = dry_run(&t, &p, &config(budget)).unwrap();
        let both = dry_run(&t, &p, &config(budget).recompute(RecomputeMode::Both)).unwrap();
        // `predicted_behaviours` holds overheads.
        let predicted = |behaviour| {
            both.predicted_behaviours
                .iter()
                .find(|(b, _)| *b == behaviour)
                .map(|(_, overhead)| *overhead)
                .unwrap()
        };
        assert_eq!(alone.overhead, predicted(swap.pacing_early()), "{budget}");
        early_mattered |= predicted(swap) != predicted(swap.pacing_early());
    }
    assert!(
        early_mattered,
        "a budget where room made early changes the step"
    );
}

/// `recompute` keeps its rule (every victim it may drop is dropped) and chooses per plan only
/// where room for rebuilds is made (by the settle, also beside prefetches, also in the prefetch
/// walk) and how room is made early for the peak (a share at a time, at once, not at all), the
/// fastest of the nine by its dry run, a tie going in that order; the config can set both, and
/// then nothing is chosen.
#[test]
fn recompute_chooses_where_and_when_room_is_made_by_its_dry_run() {
    use crate::policy::recompute::{EarlyRoom, RebuildRoom};
    let mut p = slow_device();
    p.hbm_gb_per_s = 100.0;
    let t = peak_beyond_the_settle();
    let mut way_mattered = false;
    for budget in [88 * MIB, 96 * MIB, 104 * MIB] {
        let recompute = config(budget).recompute(RecomputeMode::Recompute);
        let run = dry_run(&t, &p, &recompute).unwrap();
        let chose = run.chose.expect("recompute chooses under a budget");
        let ways: Vec<(RebuildRoom, EarlyRoom)> = run
            .predicted_behaviours
            .iter()
            .map(|(b, _)| (b.rebuild_room, b.early_room()))
            .collect();
        let mut expected = Vec::new();
        for room in [
            RebuildRoom::AtSettle,
            RebuildRoom::BesidePrefetches,
            RebuildRoom::InPrefetchWalk,
        ] {
            for early in [EarlyRoom::Paced, EarlyRoom::AtOnce, EarlyRoom::Off] {
                expected.push((room, early));
            }
        }
        assert_eq!(ways, expected, "{budget}");
        assert!(
            run.predicted_behaviours
                .iter()
                .all(|(b, _)| { b.victims == RecomputeMode::Recompute && !b.keeps_state }),
            "{budget}: {:?}",
            run.predicted_behaviours
        );
        let fastest = run
            .predicted_behaviours
            .iter()
            .map(|(_, overhead)| *overhead)
            .fold(f64::INFINITY, f64::min);
        let first_fastest = run
            .predicted_behaviours
            .iter()
            .find(|(_, overhead)| *overhead == fastest)
            .map(|(b, _)| *b);
        assert_eq!(Some(chose), first_fastest, "{budget}");
        assert_eq!(run.overhead, fastest, "{budget}");
        // Set, each way runs as predicted, with nothing chosen.
        for (behaviour, overhead) in &run.predicted_behaviours {
            let set = recompute
                .clone()
                .rebuild_room(behaviour.rebuild_room)
                .early_room(behaviour.early_room());
            let set = dry_run(&t, &p, &set).unwrap();
            assert_eq!((set.chose, set.overhead), (None, *overhead), "{budget}");
        }
        way_mattered |= run
            .predicted_behaviours
            .iter()
            .any(|(_, overhead)| *overhead != fastest);
    }
    assert!(
        way_mattered,
        "a budget where the way room is made changes the step"
    );
}
