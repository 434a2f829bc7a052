//! What a step hands to the next: its tensors alive at the end (updated parameters, optimizer
//! state) paired with the next step's tensors from before it, from one recorded step.
//!
//! A repeating step's end state is the next step's start, but one tape does not say which
//! tensor becomes which: the pairs are found by shape, dtype and role, in order (the i-th
//! surviving `[128, 64, 3, 3]` F32 parameter made is the i-th such parameter the step reads
//! first). Tensors of equal size and kind are interchangeable to a simulation of bytes, so a
//! wrong pairing among them only shifts when one of them is used.

use std::collections::{HashMap, HashSet};

use crate::engine::TensorId;
use crate::policy::plan::UsePlan;
use crate::tape::StepTape;

/// `(alive at the end, its counterpart from before the step)`, for every tensor that has one.
pub(crate) fn pairs(tape: &StepTape) -> Vec<(TensorId, TensorId)> {
    let dropped: HashSet<TensorId> = tape.drops.iter().map(|d| d.id).collect();
    let kind = |t: &crate::tape::TensorRecord| (t.shape.clone(), t.dtype.clone(), t.role);
    // Sources in the order the step first reads them.
    let mut first_read: HashMap<TensorId, usize> = HashMap::new();
    for (i, op) in tape.ops.iter().enumerate() {
        for id in &op.inputs {
            first_read.entry(*id).or_insert(i);
        }
    }
    let mut sources: Vec<&crate::tape::TensorRecord> = tape
        .tensors
        .iter()
        .filter(|t| t.producer.is_none())
        .collect();
    sources.sort_by_key(|t| (first_read.get(&t.id).copied().unwrap_or(usize::MAX), t.id));
    let mut by_kind: HashMap<_, std::collections::VecDeque<TensorId>> = HashMap::new();
    for s in sources {
        by_kind.entry(kind(s)).or_default().push_back(s.id);
    }
    // Survivors in the order they were made.
    let mut survivors: Vec<&crate::tape::TensorRecord> = tape
        .tensors
        .iter()
        .filter(|t| t.producer.is_some() && !dropped.contains(&t.id))
        .collect();
    survivors.sort_by_key(|t| t.producer.map(|p| (p.op, p.output)));
    survivors
        .into_iter()
        .filter_map(|t| Some((t.id, by_kind.get_mut(&kind(t))?.pop_front()?)))
        .collect()
}

/// The plan of `tape` as a repeating step: with the hand-over from one step to the next that
/// `pairs` describes, so that a survivor's next use is its counterpart's first use in the next
/// step.
pub(crate) fn repeating_plan(tape: &StepTape, pairs: &[(TensorId, TensorId)]) -> UsePlan {
    // The step before, as the plan sees it: the same tape one step earlier, where each
    // survivor carries the id its counterpart has in this one (and the counterpart a fresh id).
    let fresh = tape.tensors.iter().map(|t| t.id).max().unwrap_or(0) + 1;
    let mut rename: HashMap<TensorId, TensorId> = HashMap::new();
    for (k, (survivor, source)) in pairs.iter().enumerate() {
        rename.insert(*survivor, *source);
        rename.insert(*source, fresh + k as u64);
    }
    let mut previous = tape.clone();
    let mut current = tape.clone();
    current.step = previous.step + 1;
    for op in &mut previous.ops {
        for id in op.inputs.iter_mut().chain(op.outputs.iter_mut()) {
            if let Some(new) = rename.get(id) {
                *id = *new;
            }
        }
    }
    UsePlan::from_tape(&current, Some(&previous))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TensorRole;
    use crate::tape::{DropRecord, OpRecord, Producer, TensorRecord};

    fn t(id: u64, shape: &[usize], producer: Option<u32>) -> TensorRecord {
        TensorRecord {
            id,
            bytes: shape.iter().product::<usize>() as u64 * 4,
            dtype: "F32".into(),
            shape: shape.to_vec(),
            role: TensorRole::Other,
            producer: producer.map(|op| Producer { op, output: 0 }),
        }
    }

    /// Two weights w1 [4] and w2 [8] read in that order; the step makes their updates w2'
    /// then w1', and drops w1 and w2.
    #[test]
    fn survivors_pair_with_the_sources_of_their_kind_and_are_used_next_step() {
        let op = |name: &str, inputs: &[u64], outputs: &[u64]| OpRecord {
            name: name.into(),
            inputs: inputs.to_vec(),
            outputs: outputs.to_vec(),
            start_ns: 0,
            duration_ns: 1,
            thread: 1,
        };
        let tape = StepTape {
            step: 3,
            ops: vec![
                op("a", &[1], &[3]),
                op("b", &[2, 3], &[4]),
                op("update", &[2], &[5]),
                op("update", &[1], &[6]),
            ],
            tensors: vec![
                t(1, &[4], None),
                t(2, &[8], None),
                t(3, &[4], Some(0)),
                t(4, &[8], Some(1)),
                t(5, &[8], Some(2)),
                t(6, &[4], Some(3)),
            ],
            drops: [1, 2, 3, 4]
                .iter()
                .map(|&id| DropRecord { id, after_ops: 4 })
                .collect(),
            ..Default::default()
        };
        let pairs = pairs(&tape);
        assert_eq!(pairs, vec![(5, 2), (6, 1)]);
        let plan = repeating_plan(&tape, &pairs);
        // w1' (made at op 3) is read first at op 0 of the next step: one op after the end.
        let key = crate::policy::plan::PlanKey::Produced { op: 3, slot: 0 };
        let at = crate::policy::plan::KeyAt { step: 4, key };
        assert_eq!(plan.next_use(at, 4, 3), crate::policy::plan::NextUse::In(1));
    }
}
