//! Whether a dry run may move the step's state, and the least budget that keeps it on the
//! device.
//!
//! The engine treats every tensor alike: parameters and an optimizer's moments leave the device
//! when the policy ranks them first. DTR's simulator does not: its budgets are a share of the
//! baseline's peak with the weights counted in it and never evicted (they have no parent op
//! to recompute them from). [`StateResidency::Pinned`] predicts a step under that accounting,
//! so that a recompute-only row can be set beside DTR's published overheads.

use crate::fast_hash::{FastMap as HashMap, FastSet as HashSet};

use serde::Serialize;

use crate::engine::TensorId;
use crate::tape::StepTape;

/// Which tensors a dry run may move or drop.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StateResidency {
    /// As the engine runs: any tensor may leave the device.
    #[default]
    Movable,
    /// The step's state stays on the device, inside the budget, as DTR's constants do: the
    /// tensors from before the step (parameters, optimizer state, the batch) and those alive
    /// at its end (their updates, handed to the next step). Only what the step makes and
    /// frees (activations, gradients, temporaries) may move or be dropped. The engine has no
    /// such mode: this is for comparing with results published under that accounting.
    Pinned,
}

/// The step's state: the tensors from before it and the ones it leaves alive.
pub(crate) fn state_tensors(tape: &StepTape) -> HashSet<TensorId> {
    let dropped: HashSet<TensorId> = tape.drops.iter().map(|d| d.id).collect();
    tape.tensors
        .iter()
        .filter(|t| t.producer.is_none() || !dropped.contains(&t.id))
        .map(|t| t.id)
        .collect()
}

/// What each op needs on the device with the state kept there: the state alive as it runs
/// (from before the step and not yet freed, or made by an earlier op) and the op's own other
/// inputs and outputs. Yields `(op, state bytes, all bytes)`.
fn pinned_needs(tape: &StepTape) -> Vec<(usize, u64, u64)> {
    let state = state_tensors(tape);
    let sizes: HashMap<TensorId, u64> = tape.tensors.iter().map(|t| (t.id, t.bytes)).collect();
    let size = |id: &TensorId| sizes.get(id).copied().unwrap_or(0);
    // State freed after op k (a source the step lets go) stops counting from op k on.
    let mut freed_after = vec![0u64; tape.ops.len() + 1];
    for d in &tape.drops {
        if state.contains(&d.id) {
            let at = (d.after_ops as usize).min(tape.ops.len());
            freed_after[at] += size(&d.id);
        }
    }
    let mut alive: u64 = tape
        .tensors
        .iter()
        .filter(|t| t.producer.is_none())
        .map(|t| t.bytes)
        .sum();
    let mut needs = Vec::with_capacity(tape.ops.len());
    for (i, op) in tape.ops.iter().enumerate() {
        alive -= freed_after[i].min(alive);
        let mut seen: Vec<TensorId> = Vec::new();
        let mut own = 0u64;
        let mut made_state = 0u64;
        for id in op.inputs.iter().chain(&op.outputs) {
            if seen.contains(id) {
                continue;
            }
            seen.push(*id);
            if !state.contains(id) {
                own += size(id);
            } else if op.outputs.contains(id) && !op.inputs.contains(id) {
                made_state += size(id);
            }
        }
        alive += made_state;
        needs.push((i, alive, alive + own));
    }
    needs
}

/// The smallest budget that keeps the state on the device and fits every op beside it, with
/// the op that needs it: `(op, state bytes at it, bytes in all)`.
pub(crate) fn pinned_floor(tape: &StepTape) -> Option<(usize, u64, u64)> {
    pinned_needs(tape)
        .into_iter()
        .max_by_key(|&(op, _, needed)| (needed, std::cmp::Reverse(op)))
}
