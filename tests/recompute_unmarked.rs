//! Recompute in steps no marker bounds: the period detector finds them, but a dropped tensor
//! needs the step's position per op, so such steps move their victims, and the device says so
//! once. Its own process: the recorder must never have seen a marker (run after the marked
//! tests of `tests/recompute.rs`, this run was not planned within its five steps), and the
//! warning is given once per device.

#[path = "budgeted/mod.rs"]
mod budgeted;
mod common;
#[path = "../examples/common/small_models.rs"]
mod small_models;

use budgeted::{at_30_percent_marked_with, gpt};
use burn::backend::{Autodiff, Flex};
use burn_spill::{PolicyKind, RecomputeMode, SpillBackend, SpillConfig};

type Trained = Autodiff<Flex>;
type Spilled = Autodiff<SpillBackend<Flex>>;

/// A config that would drop every victim it may (recompute only), with the plan that the
/// memory rule needs (a tape-driven policy, prefetching).
fn dropping(config: SpillConfig) -> SpillConfig {
    config
        .policy(PolicyKind::NextUse)
        .prefetch_window(2)
        .recompute(RecomputeMode::Recompute)
}

/// The warnings a run logs, captured on this thread (where the engine plans, at an op).
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Steps no marker bounds (the period detector finds them) drop nothing, since the memory rule
/// reads the step's position: the run trains identically, moving its victims, and says once
/// that its steps must be marked for recompute to drop.
#[test]
fn unmarked_steps_drop_nothing_and_say_so() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let stats = tracing::subscriber::with_default(subscriber, || {
        at_30_percent_marked_with(gpt::<Trained>, gpt::<Spilled>, 4, &dropping, false)
    });
    let r = &stats.recompute;
    eprintln!(
        "unmarked: dropped {}, rebuilt {}; moved d->h {} B",
        r.dropped, r.rebuilt, stats.device_to_host.bytes
    );
    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert_eq!(stats.recompute.dropped, 0, "{log}");
    // Warned as the plan is made, on the op's thread (the dry runs that choose its behaviour
    // land later, on their own thread: under a loaded machine after the run's last step).
    let warnings: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("the steps are not marked"))
        .collect();
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(
        warnings[0].contains("step_begin") && warnings[0].contains("recompute"),
        "{log}"
    );
}
