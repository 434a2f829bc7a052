//! What `both` and `recompute` run the steps of a plan with: each behaviour the mode may
//! choose dry-run on the recorded step, and the fastest taken
//! ([`crate::policy::recompute::chosen_from`] decides).

use crate::policy::recompute::{self, Behaviour};
use crate::tape::StepTape;

use super::profile::DeviceProfile;
use super::simulate::{Settings, Simulated, simulate};

/// The behaviour chosen, its simulated step, and every behaviour's predicted step seconds.
#[derive(Debug, Clone)]
pub(crate) struct Chosen {
    pub behaviour: Behaviour,
    pub simulated: Simulated,
    pub predicted: Vec<(Behaviour, f64)>,
}

/// Simulates `tape` under `settings` with each of `candidates` (what
/// [`recompute::candidates`] gives `settings.recompute`, at least one; each sets which victims
/// are dropped, where room for rebuilds and early room are made and whether the state is kept)
/// and picks the fastest as `settings.recompute` does.
pub(crate) fn choose(
    tape: &StepTape,
    profile: &DeviceProfile,
    op_seconds: &[f64],
    gaps: &(Vec<f64>, f64),
    settings: Settings,
    candidates: &[Behaviour],
) -> Chosen {
    assert!(!candidates.is_empty(), "a choice among no behaviours");
    let mut runs: Vec<(Behaviour, Simulated)> = candidates
        .iter()
        .map(|&behaviour| {
            let settings = Settings {
                recompute: behaviour.victims,
                rebuild_room: behaviour.rebuild_room,
                keeps_state: behaviour.keeps_state,
                evicts_early: behaviour.evicts_early,
                paces_early: behaviour.paces_early,
                ..settings
            };
            (
                behaviour,
                simulate(tape, profile, op_seconds, gaps, settings),
            )
        })
        .collect();
    let predicted: Vec<(Behaviour, f64)> = runs
        .iter()
        .map(|(behaviour, sim)| (*behaviour, sim.step_seconds))
        .collect();
    let behaviour = recompute::chosen_from(settings.recompute, &predicted).unwrap_or(candidates[0]);
    let at = runs.iter().position(|(b, _)| *b == behaviour).unwrap_or(0);
    let (_, simulated) = runs.swap_remove(at);
    Chosen {
        behaviour,
        simulated,
        predicted,
    }
}
