//! What `both` runs the steps of a plan with: each of its behaviours dry-run on the recorded
//! step, and the fastest taken ([`crate::policy::recompute::fastest_behaviour`] decides).

use crate::policy::recompute::{self, BEHAVIOURS, Behaviour, RebuildRoom};
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

/// Simulates `tape` under `settings` with each of [`BEHAVIOURS`] the config allows (where it
/// sets room for rebuilds to be made, `configured_room`, or whether the state is kept,
/// `configured_keep`) and picks the fastest (what
/// `settings.recompute` and `settings.rebuild_room` say is ignored: `both` is the mode that
/// chooses).
pub(crate) fn choose(
    tape: &StepTape,
    profile: &DeviceProfile,
    op_seconds: &[f64],
    gaps: &(Vec<f64>, f64),
    settings: Settings,
    configured_room: Option<RebuildRoom>,
    configured_keep: Option<bool>,
) -> Chosen {
    let mut runs: Vec<(Behaviour, Simulated)> = BEHAVIOURS
        .iter()
        .filter(|behaviour| behaviour.allowed_by(configured_room, configured_keep))
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
    let behaviour = recompute::fastest_behaviour(&predicted).unwrap_or(BEHAVIOURS[0]);
    let at = runs.iter().position(|(b, _)| *b == behaviour).unwrap_or(0);
    let (_, simulated) = runs.swap_remove(at);
    Chosen {
        behaviour,
        simulated,
        predicted,
    }
}
