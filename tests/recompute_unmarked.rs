//! Recompute in steps no marker bounds: once the period detector has confirmed the step's
//! period and a plan was made from a step of that period, the position counts each step's
//! ops as a marked step's, and victims are dropped as in marked steps. Its own process: the
//! recorder must never have seen a marker (markers bound the steps from the first one on).

#[path = "budgeted/mod.rs"]
mod budgeted;
mod common;
#[path = "../examples/common/small_models.rs"]
mod small_models;

use budgeted::{at_30_percent_for_steps, gpt};
use burn::backend::{Autodiff, Flex};
use burn_spill::{PolicyKind, RecomputeMode, SpillBackend, SpillConfig};

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
