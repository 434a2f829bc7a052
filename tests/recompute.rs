//! Recompute instead of swap (`SpillConfig::recompute`): tensors dropped from the device and
//! rebuilt from their recipes give bit-identical values and gradients, a chain of dropped
//! tensors is rebuilt recursively, the ledger returns to zero, and real models train
//! identically at 30% of their peak with Burn's own checkpointing above or not.

#[path = "budgeted/mod.rs"]
mod budgeted;
mod common;
#[path = "../examples/common/small_models.rs"]
mod small_models;

use budgeted::{at_30_percent_marked_with, cnn, gpt};
use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::backend::{Autodiff, Flex};
use burn::tensor::{Distribution, Tensor, TensorData};
use burn_spill::policy::recompute::{EarlyRoom, RebuildRoom};
use burn_spill::{PolicyKind, RecomputeMode, SpillBackend, SpillConfig, SpillStats};
use common::{ExclusiveDevice, Plain, Spill, assert_same_data};

/// Trains at 30% of the peak with each step marked (drops need the step's positions).
fn marked(
    plain: budgeted::Trainer,
    spilled: budgeted::Trainer,
    batch: usize,
    shape: &dyn Fn(SpillConfig) -> SpillConfig,
) -> SpillStats {
    at_30_percent_marked_with(plain, spilled, batch, shape, true)
}

/// A config that drops every victim it may (recompute only), with the plan that the memory
/// rule needs (a tape-driven policy, prefetching).
fn dropping(config: SpillConfig) -> SpillConfig {
    config
        .policy(PolicyKind::NextUse)
        .prefetch_window(2)
        .recompute(RecomputeMode::Recompute)
}

fn report(what: &str, stats: &SpillStats) {
    let r = &stats.recompute;
    eprintln!(
        "{what}: dropped {} ({} B), rebuilt {} ({} B, {} chained, {} ghosts) in {:?}; moved d->h {} B, h->d {} B",
        r.dropped,
        r.dropped_bytes,
        r.rebuilt,
        r.rebuilt_bytes,
        r.chained_rebuilds,
        r.ghosts_recomputed,
        r.rebuild_time,
        stats.device_to_host.bytes,
        stats.host_to_device.bytes
    );
}

/// One step of a program in which `a = exp(x)` and `b = tanh(a)` are both dropped while other
/// work fills a small budget (they are the tensors used furthest away then): `b` is read first,
/// so rebuilding it rebuilds `a` from `x` first; `a` is read after `b`, and `x` after `a`, so
/// the memory rule lets both be dropped, and the ops at their uses are small enough to fit
/// with the recipes' inputs. Returns the reads.
fn chain_step<B: burn::tensor::backend::Backend>(device: &B::Device) -> Vec<TensorData> {
    let x = Tensor::<B, 2>::from_data(
        TensorData::new((0..64).map(|i| i as f32 / 32.0 - 1.0).collect(), [8, 8]),
        device,
    );
    let a = x.clone().exp();
    let b = a.clone().tanh();
    // Work between the producers and the uses that needs the room they take.
    let f1 = x.clone().mul_scalar(3.0);
    let f2 = f1.clone().sin();
    let f3 = f2.mul(f1);
    let f3_read = f3.into_data();
    let b_read = b.into_data();
    let e = a.sqrt();
    let c = e + x.clone();
    vec![f3_read, b_read, c.into_data(), x.into_data()]
}

/// Runs `step` on `SpillBackend<Flex>` under `config` as four marked steps (the plan the drops
/// need exists from the second), each checked bit for bit against `plain`; then checks that the
/// ledger is back to zero. Returns the run's stats.
fn marked_steps(
    what: &str,
    config: SpillConfig,
    plain: &[TensorData],
    step: impl Fn(&burn::tensor::Device<Spill>) -> Vec<TensorData>,
) -> SpillStats {
    let device = Default::default();
    Spill::configure(&device, config).unwrap();
    let before = Spill::stats(&device);
    for n in 0..4 {
        Spill::step_begin(&device);
        let out = step(&device);
        Spill::step_end(&device);
        assert_eq!(plain.len(), out.len(), "{what}: number of reads");
        for (i, (p, s)) in plain.iter().zip(&out).enumerate() {
            assert_same_data(p, s, &format!("{what}, step {n}, read {i}"));
        }
    }
    let stats = Spill::stats(&device).since(&before);
    report(what, &stats);
    assert_eq!(
        stats.recompute.dropped_now_bytes, 0,
        "{what}: a dropped tensor left counted"
    );
    let live = Spill::live(&device);
    assert_eq!(
        (live.tensors, live.bytes),
        (0, 0),
        "{what}: tensors left alive"
    );
    let resident = (
        stats.resident.device,
        stats.resident.host,
        stats.resident.disk,
    );
    assert_eq!(resident, (0, 0, 0), "{what}: bytes left on a tier");
    Spill::configure(&device, SpillConfig::default()).unwrap();
    stats
}

/// Runs `step` as [`marked_steps`] does, synchronously and asynchronously, at a budget of 768
/// bytes (room for one op on tensors of 256 B with a rebuild's input and one more beside it,
/// not for all) with every victim dropped that may be; checks each run with `check`, given
/// the run's name and stats.
fn dropping_at_768_bytes(
    name: &str,
    step: fn(&burn::tensor::Device<Spill>) -> Vec<TensorData>,
    plain: &[TensorData],
    check: impl Fn(&str, &SpillStats),
) {
    for asynchronous in [false, true] {
        let config =
            dropping(SpillConfig::default().device_budget_bytes(768)).asynchronous(asynchronous);
        let what = format!("{name}, async {asynchronous}");
        check(&what, &marked_steps(&what, config, plain, step));
    }
}

#[test]
fn a_chain_of_dropped_tensors_is_rebuilt_recursively_and_exactly() {
    let _device = ExclusiveDevice::take();
    let plain = chain_step::<Plain>(&Default::default());
    dropping_at_768_bytes("chain", chain_step::<Spill>, &plain, |what, stats| {
        let r = &stats.recompute;
        assert!(
            r.dropped >= 2 && r.rebuilt >= 2,
            "{what}: the chain was not dropped and rebuilt: {r:?}"
        );
        assert!(
            r.chained_rebuilds > 0,
            "{what}: no rebuild needed another first: {r:?}"
        );
    });
}

/// One step in which `b = exp(x) * 2` is dropped while other work fills a small budget, after
/// the program has let `exp(x)` go (the multiply consumed it): the rebuild of `b` recomputes
/// `exp(x)` from `x`, which is read after `b`, as a ghost. Returns the reads.
fn ghost_step<B: burn::tensor::backend::Backend>(device: &B::Device) -> Vec<TensorData> {
    let x = Tensor::<B, 2>::from_data(
        TensorData::new((0..64).map(|i| i as f32 / 32.0 - 1.0).collect(), [8, 8]),
        device,
    );
    let b = x.clone().exp().mul_scalar(2.0);
    let f1 = x.clone().mul_scalar(3.0);
    let f2 = f1.clone().sin();
    let f3 = f2.mul(f1);
    let f3_read = f3.into_data();
    let b_read = b.into_data();
    let c = x.clone().add_scalar(1.0);
    vec![f3_read, b_read, c.into_data(), x.into_data()]
}

#[test]
fn an_input_the_program_let_go_is_recomputed_for_a_rebuild() {
    let _device = ExclusiveDevice::take();
    let plain = ghost_step::<Plain>(&Default::default());
    dropping_at_768_bytes("ghost", ghost_step::<Spill>, &plain, |what, stats| {
        let r = &stats.recompute;
        assert!(
            r.dropped >= 1 && r.rebuilt >= 1,
            "{what}: `b` was not dropped and rebuilt: {r:?}"
        );
        assert!(
            r.ghosts_recomputed > 0,
            "{what}: no rebuild recomputed `exp(x)`: {r:?}"
        );
    });
}

/// The chain under `Autodiff`: gradients through dropped and rebuilt tensors.
#[test]
fn gradients_through_dropped_tensors_are_identical() {
    fn grads<B: burn::tensor::backend::AutodiffBackend>(device: &B::Device) -> Vec<TensorData> {
        let x = Tensor::<B, 2>::from_data(
            TensorData::new((0..64).map(|i| i as f32 / 40.0 - 0.8).collect(), [8, 8]),
            device,
        )
        .require_grad();
        let w = Tensor::<B, 2>::from_data(
            TensorData::new(
                (0..64).map(|i| ((i * 7) % 13) as f32 / 13.0).collect(),
                [8, 8],
            ),
            device,
        )
        .require_grad();
        let h = x.clone().matmul(w.clone());
        let g = burn::tensor::activation::gelu(h.clone());
        let s = burn::tensor::activation::sigmoid(g.clone() * 0.5 + h.clone());
        let loss = (s * g).sum();
        let grads = loss.backward();
        vec![
            loss.into_data(),
            x.grad(&grads).unwrap().into_data(),
            w.grad(&grads).unwrap().into_data(),
        ]
    }
    let _device = ExclusiveDevice::take();
    let plain = grads::<Autodiff<Plain>>(&Default::default());
    let config = dropping(SpillConfig::default().device_budget_bytes(1024));
    let stats = marked_steps("autodiff", config, &plain, grads::<Autodiff<Spill>>);
    assert!(
        stats.recompute.rebuilt > 0,
        "nothing was rebuilt: {:?}",
        stats.recompute
    );
}

/// Random ops have no recipe: a tensor made by `random` and read after pressure keeps its
/// values (it is moved, never rebuilt).
#[test]
fn random_outputs_are_never_rebuilt() {
    fn step<B: burn::tensor::backend::Backend>(device: &B::Device) -> Vec<TensorData> {
        B::seed(device, 7);
        let r = Tensor::<B, 2>::random([8, 8], Distribution::Uniform(-1.0, 1.0), device);
        let e = r.clone().exp();
        // Work that needs the room `r` and `e` take: both are victims, `e` has a recipe.
        let f1 = Tensor::<B, 2>::ones([8, 8], device).mul_scalar(3.0);
        let f2 = f1.clone().sin();
        let f3 = f2.mul(f1);
        vec![f3.into_data(), e.into_data(), r.into_data()]
    }
    assert!(!burn_spill::policy::recompute::is_recomputable(
        "float_random"
    ));
    let _device = ExclusiveDevice::take();
    let plain = step::<Plain>(&Default::default());
    let config = dropping(SpillConfig::default().device_budget_bytes(768));
    let stats = marked_steps("random", config, &plain, step::<Spill>);
    // Under pressure that drops what has a recipe, the random tensor is moved instead.
    assert!(
        stats.recompute.dropped > 0 && stats.device_to_host.count > 0,
        "no pressure: {stats:?}"
    );
}

type Trained = Autodiff<Flex>;
type Spilled = Autodiff<SpillBackend<Flex>>;

#[test]
fn cnn_trains_identically_with_recompute_at_30_percent() {
    let stats = marked(cnn::<Trained>, cnn::<Spilled>, 8, &dropping);
    report("cnn", &stats);
    assert_eq!(stats.recompute.dropped_now_bytes, 0);
}

#[test]
fn transformer_trains_identically_with_recompute_at_30_percent() {
    let stats = marked(gpt::<Trained>, gpt::<Spilled>, 4, &dropping);
    report("transformer", &stats);
    assert!(
        stats.recompute.rebuilt > 0,
        "the transformer rebuilt nothing: {:?}",
        stats.recompute
    );
    // The planned steps ran with the way of making room early its dry run predicted fastest,
    // dropping every victim it may.
    let chose = stats.recompute.behaviour;
    eprintln!("transformer, recompute chose: {chose:?}");
    assert!(
        chose.is_some_and(|b| b.victims == RecomputeMode::Recompute && !b.keeps_state),
        "{chose:?}"
    );
}

#[test]
fn transformer_with_both_swap_and_recompute_trains_identically_at_30_percent() {
    let both = |config: SpillConfig| dropping(config).recompute(RecomputeMode::Both);
    let stats = marked(gpt::<Trained>, gpt::<Spilled>, 4, &both);
    report("transformer, both", &stats);
    // The planned steps ran with what the dry run of the recorded step predicted fastest.
    let chose = stats.recompute.behaviour;
    eprintln!("transformer, both chose: {chose:?}");
    assert!(
        chose.is_some_and(|b| burn_spill::policy::recompute::BEHAVIOURS.contains(&b)),
        "{chose:?}"
    );
}

/// The step's state kept on the device (`SpillConfig::keep_state`): moved last, and only to
/// admit an op. Under swap only it trains identically within the budget; under `both`, set,
/// the behaviour each plan chooses keeps it.
#[test]
fn keeping_the_state_on_the_device_trains_identically_at_30_percent() {
    let swap_keeping = |config: SpillConfig| {
        config
            .policy(PolicyKind::NextUse)
            .prefetch_window(2)
            .keep_state(true)
    };
    let stats = marked(gpt::<Trained>, gpt::<Spilled>, 4, &swap_keeping);
    report("transformer, swap keeping the state", &stats);
    assert_eq!(stats.recompute.behaviour, None, "swap only chooses nothing");
    assert_eq!(stats.recompute.dropped, 0, "swap only drops nothing");

    let both_keeping = |config: SpillConfig| {
        dropping(config)
            .recompute(RecomputeMode::Both)
            .keep_state(true)
    };
    let stats = marked(gpt::<Trained>, gpt::<Spilled>, 4, &both_keeping);
    report("transformer, both keeping the state", &stats);
    let chose = stats.recompute.behaviour;
    assert!(chose.is_some_and(|b| b.keeps_state), "{chose:?}");
}

/// Room for rebuilds made ahead in each place the config can name (`SpillConfig::rebuild_room`):
/// recompute only trains identically with each, and drops.
#[test]
fn recompute_with_room_for_rebuilds_made_anywhere_trains_identically_at_30_percent() {
    for room in [
        RebuildRoom::AtSettle,
        RebuildRoom::BesidePrefetches,
        RebuildRoom::InPrefetchWalk,
    ] {
        let shape = move |config: SpillConfig| dropping(config).rebuild_room(room);
        let stats = marked(gpt::<Trained>, gpt::<Spilled>, 4, &shape);
        report(
            &format!("transformer, recompute, rebuild room {room}"),
            &stats,
        );
        assert!(
            stats.recompute.rebuilt > 0,
            "{room}: nothing rebuilt: {:?}",
            stats.recompute
        );
        let chose = stats.recompute.behaviour;
        assert!(
            chose.is_some_and(|b| b.victims == RecomputeMode::Recompute && b.rebuild_room == room),
            "{room}: {chose:?}"
        );
    }
}

/// `both` with a card's figures: each rebuild is timed as its kernel on the named profile,
/// not by its measured time. On an H200, whose memory is about 90 times faster than its link,
/// elementwise outputs are rebuilt rather than moved; on a made-up card with the same link
/// and memory a million times slower, none is. Training stays exact on both.
#[test]
fn both_times_rebuilds_on_the_configured_profile_and_trains_identically() {
    let run = |profile: String| {
        let both = move |config: SpillConfig| {
            dropping(config)
                .recompute(RecomputeMode::Both)
                .rebuild_profile(profile.clone())
        };
        marked(gpt::<Trained>, gpt::<Spilled>, 4, &both)
    };
    let h200 = run("h200-pcie5".into());
    report("transformer, both on h200-pcie5", &h200);
    assert!(
        h200.recompute.rebuilt > 0,
        "an H200's kernel times make rebuilds cheap: {:?}",
        h200.recompute
    );
    let dir = tempfile::tempdir().unwrap();
    let slow = dir.path().join("slow-memory.json");
    let mut card = burn_spill::plan::DeviceProfile::builtin("h200-pcie5").unwrap();
    card.name = "slow-memory".into();
    card.hbm_gb_per_s = 0.001;
    std::fs::write(&slow, serde_json::to_string(&card).unwrap()).unwrap();
    let stats = run(slow.display().to_string());
    report("transformer, both on slow memory", &stats);
    assert_eq!(
        stats.recompute.dropped, 0,
        "a rebuild at 1 MB/s is dearer than any move: {:?}",
        stats.recompute
    );
}

/// `both` and recompute-only under the presets' policy (`cost_aware`), on a card whose kernels
/// take next to no time: the ops' modelled compute is so short that the link is busy the whole
/// step, so victims are ranked by the cheaper of moving and rebuilding them
/// (`policy::recompute::ranks_by_rebuild`) and elementwise outputs, nearly free to rebuild, go
/// first and are dropped. Training stays exact. (Recompute-only rebuilds ranked or not: that
/// the ranking picks the cheap rebuild first is the dry run's test,
/// `plan::tests::modes_that_drop_take_the_victim_cheaper_to_rebuild_than_the_one_a_move_would_take`;
/// this one checks that the engine's ranked path trains exactly.)
#[test]
fn victims_ranked_by_the_cheaper_way_back_train_identically() {
    let dir = tempfile::tempdir().unwrap();
    let fast = dir.path().join("fast-memory.json");
    let mut card = burn_spill::plan::DeviceProfile::builtin("h200-pcie5").unwrap();
    card.name = "fast-memory".into();
    card.hbm_gb_per_s = 1e9;
    card.launch_us = 0.0;
    std::fs::write(&fast, serde_json::to_string(&card).unwrap()).unwrap();
    let profile = fast.display().to_string();
    for mode in [RecomputeMode::Both, RecomputeMode::Recompute] {
        let profile = profile.clone();
        let ranked = move |config: SpillConfig| {
            dropping(config)
                .policy(PolicyKind::CostAware)
                .recompute(mode)
                .rebuild_profile(profile.clone())
        };
        let stats = marked(gpt::<Trained>, gpt::<Spilled>, 4, &ranked);
        report(&format!("transformer, {mode:?} ranked by cost"), &stats);
        assert!(
            stats.recompute.rebuilt > 0,
            "{mode:?}: cheap rebuilds rank first: {:?}",
            stats.recompute
        );
    }
}

/// Burn's checkpointing recomputes above burn-spill; burn-spill's drops must not change it.
#[test]
fn transformer_with_balanced_checkpointing_and_recompute_trains_identically() {
    type PlainCheckpointed = Autodiff<Flex, BalancedCheckpointing>;
    type SpilledCheckpointed = Autodiff<SpillBackend<Flex>, BalancedCheckpointing>;
    let stats = marked(
        gpt::<PlainCheckpointed>,
        gpt::<SpilledCheckpointed>,
        4,
        &dropping,
    );
    report("transformer, balanced checkpointing", &stats);
}

/// The memory rule in numbers: with recompute on, no tier holds more at its peak than with
/// swap only (recipes hold only inputs the program keeps alive anyway, and a dropped tensor is
/// in no tier), and the ledger is back to zero after each run.
#[test]
fn no_tier_holds_more_with_recompute_than_with_swap_only() {
    // Held around all the runs: another test's run between two of them changed what the later
    // one started from (under load, in three of six runs of this binary, the recompute run's
    // host peak came out 16 KiB above the swap run's).
    let _device = ExclusiveDevice::take();
    for (name, plain, spilled, batch) in [
        (
            "cnn",
            cnn::<Trained> as budgeted::Trainer,
            cnn::<Spilled> as budgeted::Trainer,
            8,
        ),
        ("transformer", gpt::<Trained>, gpt::<Spilled>, 4),
    ] {
        // Synchronous, with room made early as swap only makes it and room for rebuilds made
        // by the settle (recompute chooses both per plan otherwise): the runs are
        // deterministic, so they differ only by the drops.
        let swap_only = |config: SpillConfig| {
            dropping(config)
                .recompute(RecomputeMode::Swap)
                .asynchronous(false)
                .early_room(EarlyRoom::Paced)
        };
        let with_drops = |config: SpillConfig| {
            dropping(config)
                .asynchronous(false)
                .early_room(EarlyRoom::Paced)
                .rebuild_room(RebuildRoom::AtSettle)
        };
        // The first marked run of a process measures a lower unlimited peak (the tape is not
        // on yet): it only warms up, so that both runs below get the same budget.
        marked(plain, spilled, batch, &swap_only);
        let swap = marked(plain, spilled, batch, &swap_only);
        let recompute = marked(plain, spilled, batch, &with_drops);
        assert_eq!(swap.device_budget_bytes, recompute.device_budget_bytes);
        report(&format!("{name}, swap only"), &swap);
        report(&format!("{name}, recompute"), &recompute);
        eprintln!(
            "{name}: peaks (device, host, disk) swap {:?}, recompute {:?}",
            swap.peak, recompute.peak
        );
        assert!(
            recompute.recompute.dropped > 0,
            "{name}: nothing was dropped"
        );
        assert_eq!(
            recompute.recompute.behaviour, None,
            "{name}: nothing to choose once the config sets where and when room is made"
        );
        assert!(
            recompute.peak.device <= swap.peak.device.max(recompute.device_budget_bytes.unwrap()),
            "{name}: device peak {:?} vs {:?}",
            recompute.peak,
            swap.peak
        );
        assert!(
            recompute.peak.host <= swap.peak.host && recompute.peak.disk <= swap.peak.disk,
            "{name}: peaks {:?} with recompute, {:?} with swap only",
            recompute.peak,
            swap.peak
        );
        let live = Spill::live(&Default::default());
        assert_eq!(
            (live.tensors, live.bytes),
            (0, 0),
            "{name}: tensors left alive"
        );
    }
}
