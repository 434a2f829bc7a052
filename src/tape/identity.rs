//! Identity across steps: which tensor of step N+1 plays the part a tensor played in step N.
//!
//! Tensor ids are unique in the process, so step N+1 never reuses step N's ids; what stays the
//! same from step to step is the program. A tensor is named by where it first appears: an output
//! by (producer op index, output index), a tensor from before the step by (first use op index,
//! input slot). Two steps that run the same program pair their tensors by those names, which is
//! what lets a policy plan step N+1 from step N's tape.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use serde::Serialize;

use super::model::{OpRecord, StepTape, TensorRecord};
use crate::engine::TensorId;

/// Where two steps stop running the same program.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[error(
    "the step diverges from the previous one at op {at_op}: expected {expected}, found {found}"
)]
pub struct Divergence {
    /// The first op index where the steps differ (the shorter step's length when one step is a
    /// prefix of the other).
    pub at_op: u32,
    /// What the previous step did there.
    pub expected: String,
    /// What the next step did there.
    pub found: String,
}

/// A tensor's name within its step, which its twin in another step shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Position {
    /// Output `output` of op `op`.
    Produced {
        /// The producing op.
        op: u32,
        /// Which output.
        output: u32,
    },
    /// From before the step; first read as input `slot` of op `op`.
    FromBefore {
        /// The first op that reads it.
        op: u32,
        /// Which input.
        slot: u32,
    },
}

/// Every tensor of `tape` by its [`Position`]: the first place it appears in the op list.
pub fn positions(tape: &StepTape) -> HashMap<TensorId, Position> {
    let mut map = HashMap::with_capacity(tape.tensors.len());
    for (i, op) in tape.ops.iter().enumerate() {
        let op_index = i as u32;
        for (slot, &id) in op.inputs.iter().enumerate() {
            map.entry(id).or_insert(Position::FromBefore {
                op: op_index,
                slot: slot as u32,
            });
        }
        for (output, &id) in op.outputs.iter().enumerate() {
            map.entry(id).or_insert(Position::Produced {
                op: op_index,
                output: output as u32,
            });
        }
    }
    map
}

/// Checks that `next` runs the same op sequence as `prev`: at every index the same op name, the
/// same number of inputs and outputs, and outputs of the same dtypes and shapes.
///
/// Input shapes are not compared on their own: an input is either an earlier output (compared
/// there) or a tensor from before the step, whose change (a smaller last batch) shows in the
/// outputs of the op that reads it.
///
/// # Errors
/// The first [`Divergence`], or one at the shorter length when one step is a prefix of the other.
pub fn same_program(prev: &StepTape, next: &StepTape) -> Result<(), Divergence> {
    let prev_records = records(prev);
    let next_records = records(next);
    for (i, (a, b)) in prev.ops.iter().zip(&next.ops).enumerate() {
        let same = a.name == b.name
            && a.inputs.len() == b.inputs.len()
            && a.outputs.len() == b.outputs.len()
            && a.outputs
                .iter()
                .zip(&b.outputs)
                .all(|(x, y)| meta(&prev_records, *x) == meta(&next_records, *y));
        if !same {
            return Err(Divergence {
                at_op: i as u32,
                expected: describe(a, &prev_records),
                found: describe(b, &next_records),
            });
        }
    }
    if prev.ops.len() != next.ops.len() {
        let at = prev.ops.len().min(next.ops.len());
        let side = |tape: &StepTape, recs: &HashMap<TensorId, &TensorRecord>| {
            tape.ops.get(at).map_or_else(
                || format!("the end of the step ({} ops)", tape.ops.len()),
                |op| describe(op, recs),
            )
        };
        return Err(Divergence {
            at_op: at as u32,
            expected: side(prev, &prev_records),
            found: side(next, &next_records),
        });
    }
    Ok(())
}

/// Pairs every tensor of `next` with its twin in `prev`: the tensor at the same [`Position`].
///
/// Returns a map from `next`'s ids to `prev`'s ids, covering every tensor an op of `next` touched.
///
/// Beyond [`same_program`], the data flow must match: wherever `next` reads a tensor, `prev` must
/// read that tensor's twin, and two tensors of `next` cannot share a twin. A tensor read where
/// `prev` read a different one (a cached tensor reused instead of recomputed, a parameter tied
/// in one step and not the other) would make the twins' uses disagree, so it is a divergence too.
///
/// # Errors
/// A [`Divergence`] at the first op whose sequence or data flow differs.
pub fn twins(prev: &StepTape, next: &StepTape) -> Result<HashMap<TensorId, TensorId>, Divergence> {
    same_program(prev, next)?;
    let mut forward: HashMap<TensorId, TensorId> = HashMap::with_capacity(next.tensors.len());
    let mut backward: HashMap<TensorId, TensorId> = HashMap::with_capacity(next.tensors.len());
    for (i, (a, b)) in prev.ops.iter().zip(&next.ops).enumerate() {
        let slots = a
            .inputs
            .iter()
            .zip(&b.inputs)
            .enumerate()
            .map(|(s, pair)| ("input", s, pair))
            .chain(
                a.outputs
                    .iter()
                    .zip(&b.outputs)
                    .enumerate()
                    .map(|(s, pair)| ("output", s, pair)),
            );
        for (kind, slot, (&old, &new)) in slots {
            let clash = match forward.entry(new) {
                Entry::Occupied(e) if *e.get() != old => Some(format!(
                    "{kind} {slot} is tensor {new}, whose twin is {}, not {old}",
                    e.get()
                )),
                Entry::Occupied(_) => None,
                Entry::Vacant(e) => match backward.entry(old) {
                    Entry::Occupied(o) => Some(format!(
                        "{kind} {slot} is tensor {new}, but {old} is already the twin of {}",
                        o.get()
                    )),
                    Entry::Vacant(o) => {
                        o.insert(new);
                        e.insert(old);
                        None
                    }
                },
            };
            if let Some(found) = clash {
                return Err(Divergence {
                    at_op: i as u32,
                    expected: format!("{kind} {slot} to be the twin of tensor {old}"),
                    found,
                });
            }
        }
    }
    Ok(forward)
}

fn records(tape: &StepTape) -> HashMap<TensorId, &TensorRecord> {
    let mut map = HashMap::with_capacity(tape.tensors.len());
    for record in &tape.tensors {
        map.entry(record.id).or_insert(record);
    }
    map
}

/// The (dtype, shape) of a tensor, `None` when the tape has no record of it.
fn meta<'a>(
    records: &HashMap<TensorId, &'a TensorRecord>,
    id: TensorId,
) -> Option<(&'a str, &'a [usize])> {
    records
        .get(&id)
        .map(|r| (r.dtype.as_str(), r.shape.as_slice()))
}

/// `float_matmul(2 inputs) -> [F32 [4, 2]]`: what the divergence message shows of an op.
fn describe(op: &OpRecord, records: &HashMap<TensorId, &TensorRecord>) -> String {
    let outputs: Vec<String> = op
        .outputs
        .iter()
        .map(|&id| match meta(records, id) {
            Some((dtype, shape)) => format!("{dtype} {shape:?}"),
            None => "unknown".to_string(),
        })
        .collect();
    format!(
        "{}({} inputs) -> [{}]",
        op.name,
        op.inputs.len(),
        outputs.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tape::analysis::tests::{TapeBuilder, linear_step};

    /// `linear_step` with every id shifted by `by`, as the next step would record it.
    fn shifted(tape: &StepTape, by: TensorId) -> StepTape {
        let mut next = tape.clone();
        next.step += 1;
        for op in &mut next.ops {
            op.inputs.iter_mut().for_each(|id| *id += by);
            op.outputs.iter_mut().for_each(|id| *id += by);
        }
        next.tensors.iter_mut().for_each(|t| t.id += by);
        next.drops.iter_mut().for_each(|d| d.id += by);
        next
    }

    #[test]
    fn positions_name_tensors_by_where_they_first_appear() {
        let p = positions(&linear_step());
        assert_eq!(p[&1], Position::Produced { op: 0, output: 0 });
        assert_eq!(p[&10], Position::FromBefore { op: 1, slot: 1 });
        assert_eq!(p[&11], Position::FromBefore { op: 2, slot: 1 });
        assert_eq!(p[&8], Position::Produced { op: 7, output: 0 });
        assert_eq!(p.len(), 12);
    }

    #[test]
    fn twins_pair_outputs_and_tensors_from_before_the_step() {
        let prev = linear_step();
        let next = shifted(&prev, 100);
        assert_eq!(same_program(&prev, &next), Ok(()));
        let map = twins(&prev, &next).unwrap();
        assert_eq!(map.len(), 12);
        assert!(map.iter().all(|(n, p)| *n == *p + 100));
        // A parameter of step N+1 is the optimizer's output of step N in practice; its twin is
        // still the parameter at the same position of step N.
        assert_eq!(map.get(&110), Some(&10));
    }

    #[test]
    fn twins_with_unrelated_ids_follow_positions() {
        // Next step: ids in a scrambled order; positions still pair them.
        let mut a = TapeBuilder::new();
        a.param(5, &[2]);
        a.op("float_from_data", &[], &[(1, &[2])], 1)
            .op("float_mul", &[1, 5], &[(2, &[2]), (3, &[2])], 1)
            .op("float_add", &[3, 2], &[(4, &[2])], 1);
        let mut b = TapeBuilder::new();
        b.param(40, &[2]);
        b.op("float_from_data", &[], &[(30, &[2])], 1)
            .op("float_mul", &[30, 40], &[(20, &[2]), (10, &[2])], 1)
            .op("float_add", &[10, 20], &[(99, &[2])], 1);
        let map = twins(&a.build(), &b.build()).unwrap();
        let expected: HashMap<TensorId, TensorId> =
            [(30, 1), (40, 5), (20, 2), (10, 3), (99, 4)].into();
        assert_eq!(map, expected);
    }

    #[test]
    fn a_different_op_name_diverges_there() {
        let prev = linear_step();
        let mut next = shifted(&prev, 100);
        next.ops[2].name = "float_sub".into();
        let d = same_program(&prev, &next).unwrap_err();
        assert_eq!(d.at_op, 2);
        assert_eq!(d.expected, "float_add(2 inputs) -> [F32 [4, 2]]");
        assert_eq!(d.found, "float_sub(2 inputs) -> [F32 [4, 2]]");
        assert_eq!(twins(&prev, &next).unwrap_err(), d);
        assert!(d.to_string().contains("at op 2"));
    }

    #[test]
    fn a_different_output_shape_or_dtype_diverges() {
        let prev = linear_step();
        let mut next = shifted(&prev, 100);
        if let Some(t) = next.tensors.iter_mut().find(|t| t.id == 103) {
            t.shape = vec![3, 2]; // a smaller last batch
        }
        let d = same_program(&prev, &next).unwrap_err();
        assert_eq!(d.at_op, 2);
        assert_eq!(d.found, "float_add(2 inputs) -> [F32 [3, 2]]");

        let mut next = shifted(&prev, 100);
        if let Some(t) = next.tensors.iter_mut().find(|t| t.id == 104) {
            t.dtype = "F16".into();
        }
        assert_eq!(same_program(&prev, &next).unwrap_err().at_op, 3);
    }

    #[test]
    fn a_different_arity_diverges() {
        let prev = linear_step();
        let mut next = shifted(&prev, 100);
        next.ops[5].inputs.push(110);
        let d = same_program(&prev, &next).unwrap_err();
        assert_eq!(d.at_op, 5);
        assert!(d.found.contains("(2 inputs)"), "{}", d.found);

        let mut next = shifted(&prev, 100);
        next.ops[5].outputs.push(555);
        let d = same_program(&prev, &next).unwrap_err();
        assert_eq!(d.at_op, 5);
        assert!(d.found.ends_with("unknown]"), "{}", d.found);
    }

    #[test]
    fn a_length_difference_diverges_at_the_shorter_end() {
        let prev = linear_step();
        let mut next = shifted(&prev, 100);
        next.ops.pop();
        let d = same_program(&prev, &next).unwrap_err();
        assert_eq!(d.at_op, 9);
        assert_eq!(d.expected, "float_sub(2 inputs) -> [F32 [1, 2]]");
        assert_eq!(d.found, "the end of the step (9 ops)");
        let d = same_program(&next, &prev).unwrap_err();
        assert_eq!(d.expected, "the end of the step (9 ops)");
    }

    #[test]
    fn different_data_flow_with_the_same_ops_diverges() {
        // prev: the add reads (1, 2); next: it reads (1, 1) — the same op sequence, but the twin
        // of tensor 1 cannot be both 1 and 2.
        let mut a = TapeBuilder::new();
        a.op("float_from_data", &[], &[(1, &[2])], 1)
            .op("float_exp", &[1], &[(2, &[2])], 1)
            .op("float_add", &[1, 2], &[(3, &[2])], 1);
        let mut b = TapeBuilder::new();
        b.op("float_from_data", &[], &[(11, &[2])], 1)
            .op("float_exp", &[11], &[(12, &[2])], 1)
            .op("float_add", &[11, 11], &[(13, &[2])], 1);
        let (a, b) = (a.build(), b.build());
        assert_eq!(same_program(&a, &b), Ok(()));
        let d = twins(&a, &b).unwrap_err();
        assert_eq!(d.at_op, 2);
        assert_eq!(d.expected, "input 1 to be the twin of tensor 2");
        assert_eq!(d.found, "input 1 is tensor 11, whose twin is 1, not 2");

        // Two tensors of next sharing one twin: prev reads one parameter twice, next two.
        let mut a = TapeBuilder::new();
        a.param(7, &[2]);
        a.op("float_mul", &[7, 7], &[(1, &[2])], 1);
        let mut b = TapeBuilder::new();
        b.param(8, &[2]).param(9, &[2]);
        b.op("float_mul", &[8, 9], &[(1, &[2])], 1);
        let d = twins(&a.build(), &b.build()).unwrap_err();
        assert_eq!(d.at_op, 0);
        assert_eq!(
            d.found,
            "input 1 is tensor 9, but 7 is already the twin of 8"
        );
    }

    #[test]
    fn empty_steps_are_the_same_program() {
        assert_eq!(
            same_program(&StepTape::default(), &StepTape::default()),
            Ok(())
        );
        assert!(
            twins(&StepTape::default(), &StepTape::default())
                .unwrap()
                .is_empty()
        );
    }
}
