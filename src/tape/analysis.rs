//! What one recorded step says about the next: the data-flow DAG, each tensor's live interval and
//! uses, where backward starts, the saved activations, the critical path and the peak live bytes.
//!
//! Everything here is computed once per step from a finished [`StepTape`], off the hot path, so it
//! may allocate freely; it is plain data (serde `Serialize`) so that export can write it next to
//! the tape. Indices are op indices within the step (positions in [`StepTape::ops`]).
//!
//! The analysis never panics on a malformed tape (an id missing from [`StepTape::tensors`], a
//! drop of an unknown tensor, a producer that does not match the ops): it trusts the op list, which
//! is what actually ran, and treats whatever it cannot place as unknown (0 bytes, not a parameter).

use std::collections::HashMap;

use serde::Serialize;

use super::model::{StepTape, TensorRecord};
use crate::engine::{TensorId, TensorRole};

/// The op name Burn's autodiff uses to create the root gradient (`Gradients::new` calls
/// `B::float_ones(loss.shape(), ..., loss.dtype())`).
const ROOT_GRADIENT_OP: &str = "float_ones";

/// One data-flow edge: op `from_op` produced `tensor`, op `to_op` uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Edge {
    /// The tensor carried along the edge.
    pub tensor: TensorId,
    /// The producing op.
    pub from_op: u32,
    /// The using op (always after `from_op`).
    pub to_op: u32,
}

/// One tensor's life within the step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TensorLife {
    /// The handle's id.
    pub id: TensorId,
    /// Logical bytes (0 when the tape has no record of the tensor).
    pub bytes: u64,
    /// Whether it was created as a module parameter.
    pub parameter: bool,
    /// The op of this step that produced it; `None` for tensors from before the step.
    pub producer: Option<u32>,
    /// The first op where it exists: its producer, or its first use for a tensor from before the
    /// step.
    pub first: u32,
    /// The last op that uses it; `None` when nothing in the step uses it.
    pub last_use: Option<u32>,
    /// When its last handle dropped during the step, as [`DropRecord::after_ops`]: the number of
    /// ops recorded before the drop. `None` when it outlived the step.
    ///
    /// [`DropRecord::after_ops`]: super::model::DropRecord::after_ops
    pub dropped_after: Option<u32>,
    /// Every op that uses it, sorted, each once. The producer is not a use.
    pub uses: Vec<u32>,
    /// First op during which it holds memory: its producer, or 0 for a tensor from before the
    /// step (it already exists when the step begins).
    pub live_from: u32,
    /// Last op during which it holds memory: the later of its last use and its drop, or the last
    /// op of the step when it is not dropped during the step.
    pub live_to: u32,
}

impl TensorLife {
    /// Whether the tensor holds memory while op `op` runs.
    pub fn is_live_at(&self, op: u32) -> bool {
        self.live_from <= op && op <= self.live_to
    }
}

/// The longest chain of dependent ops, by measured duration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CriticalPath {
    /// The ops on it, in order.
    pub ops: Vec<u32>,
    /// The sum of their `duration_ns`.
    pub duration_ns: u64,
}

/// The most bytes alive at once during the step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PeakLive {
    /// The peak.
    pub bytes: u64,
    /// The first op at which the peak is reached; `None` for an empty step.
    pub at_op: Option<u32>,
}

/// The analysis of one step. Build it with [`StepAnalysis::new`].
///
/// ```
/// use burn::backend::{Autodiff, Flex};
/// use burn::tensor::Tensor;
/// use burn_spill::SpillBackend;
/// use burn_spill::tape::StepAnalysis;
///
/// let device = Default::default();
/// {
///     let _step = SpillBackend::<Flex>::step(&device);
///     let x = Tensor::<Autodiff<SpillBackend<Flex>>, 1>::from_floats([1.0, 2.0], &device)
///         .require_grad();
///     let _grads = x.clone().exp().sum().backward();
/// }
/// let tape = SpillBackend::<Flex>::last_step(&device).unwrap();
/// let analysis = StepAnalysis::new(&tape);
/// assert!(analysis.backward_start.is_some());
/// let x = tape.ops[0].outputs[0]; // from_floats made it
/// // The exp's output is saved for backward, so x's next use after op 0 is the exp (op 1).
/// assert_eq!(analysis.next_use(x, 0), Some(1));
/// # SpillBackend::<Flex>::record_tape(&device, false);
/// ```
#[derive(Debug, Clone, Serialize)]
pub struct StepAnalysis {
    /// The step's number ([`StepTape::step`]).
    pub step: u64,
    /// How many ops the step ran.
    pub op_count: u32,
    /// Per op, the ops that produced its inputs within the step (sorted, each once).
    pub predecessors: Vec<Vec<u32>>,
    /// Per op, the ops that use its outputs (sorted, each once).
    pub successors: Vec<Vec<u32>>,
    /// Every data-flow edge, ordered by `to_op` then input position; one per (tensor, using op).
    pub edges: Vec<Edge>,
    /// Every tensor an op touched, in order of first appearance.
    pub tensors: Vec<TensorLife>,
    /// The op that created the root gradient, where backward begins; see
    /// [`StepAnalysis::new`] for the heuristic. `None` when the step has no backward (or the
    /// heuristic did not find it).
    pub backward_start: Option<u32>,
    /// Non-parameter tensors produced before `backward_start` and used at or after it: what
    /// autodiff kept from the forward for the backward. In order of first appearance.
    pub saved_activations: Vec<TensorId>,
    /// The total bytes of `saved_activations`.
    pub saved_activation_bytes: u64,
    /// The critical path by measured duration.
    pub critical_path: CriticalPath,
    /// The peak of live bytes.
    pub peak: PeakLive,
    /// Live bytes while each op runs (see [`TensorLife::live_from`] and [`TensorLife::live_to`]).
    pub live_bytes: Vec<u64>,
    /// Tensor id to position in `tensors`.
    #[serde(skip)]
    index: HashMap<TensorId, usize>,
}

/// What the first pass over the ops learns about one tensor.
struct Scan {
    producer: Option<u32>,
    first: u32,
    uses: Vec<u32>,
}

impl StepAnalysis {
    /// Analyses one step.
    ///
    /// # Where backward starts
    ///
    /// Burn's autodiff starts backward by creating the root gradient with `float_ones` (no tensor
    /// inputs) on the loss's shape and dtype; the loss is then a sink: produced, read by nothing
    /// yet. So `backward_start` is the first op that
    /// - is named `float_ones`, has no inputs and one output, and
    /// - whose output has the dtype and shape of some tensor produced earlier in the step that no
    ///   op has consumed yet. A consumer is an op that reads it and produces a tensor; ops with no
    ///   tensor output (`float_into_data`, reading the loss for a log line) create no data flow.
    ///
    /// Limits: a forward `ones` with no inputs on the shape of a tensor that is still unconsumed
    /// at that point (say a `[batch, seq]` mask made right after the `[batch, seq]` input was
    /// uploaded and before its first use) is taken for the root; a loss that some op reads before
    /// backward (`loss * 1.0` for a metric, gradient scaling done as an op on the loss) hides the
    /// root unless another sink has the same shape; only the first backward of a step is found;
    /// a backend other than autodiff that never calls `float_ones` gives `None`.
    pub fn new(tape: &StepTape) -> Self {
        let op_count = u32::try_from(tape.ops.len()).unwrap_or(u32::MAX);
        let records: HashMap<TensorId, &TensorRecord> = {
            let mut map = HashMap::with_capacity(tape.tensors.len());
            for record in &tape.tensors {
                // The recorder lists each tensor once; on a hand-edited tape the first wins.
                map.entry(record.id).or_insert(record);
            }
            map
        };

        // Pass 1: producers and uses, from the op list (what actually ran). A tensor first seen
        // as an output was produced here; first seen as an input, it is from before the step.
        let mut order: Vec<TensorId> = Vec::new();
        let mut scans: HashMap<TensorId, Scan> = HashMap::new();
        let mut predecessors: Vec<Vec<u32>> = vec![Vec::new(); tape.ops.len()];
        let mut successors: Vec<Vec<u32>> = vec![Vec::new(); tape.ops.len()];
        let mut edges = Vec::new();
        for (i, op) in tape.ops.iter().enumerate().take(op_count as usize) {
            let i = i as u32;
            // An output that already exists is an in-place write of it. The decorator gives every
            // output a fresh handle, so this does not happen today; counting it as a use keeps the
            // write ordered after the producer if it ever does.
            for (slot, &id) in op.inputs.iter().chain(op.outputs.iter()).enumerate() {
                let scan = scans.entry(id).or_insert_with(|| {
                    order.push(id);
                    // Inputs come first, so an id first met among the outputs is new here.
                    let produced_here = slot >= op.inputs.len();
                    Scan {
                        producer: produced_here.then_some(i),
                        first: i,
                        uses: Vec::new(),
                    }
                });
                if scan.producer == Some(i) {
                    continue;
                }
                if scan.uses.last() == Some(&i) {
                    continue; // the same tensor twice in one op (`x * x`) is one use
                }
                scan.uses.push(i);
                if let Some(from) = scan.producer {
                    edges.push(Edge {
                        tensor: id,
                        from_op: from,
                        to_op: i,
                    });
                    predecessors[i as usize].push(from);
                    successors[from as usize].push(i);
                }
            }
        }
        for list in predecessors.iter_mut().chain(successors.iter_mut()) {
            list.sort_unstable();
            list.dedup();
        }

        let mut drops: HashMap<TensorId, u32> = HashMap::new();
        for drop in &tape.drops {
            // One handle drops last, once; should a tape list two, the later one stands.
            let entry = drops.entry(drop.id).or_insert(drop.after_ops);
            *entry = (*entry).max(drop.after_ops);
        }

        let last_op = op_count.saturating_sub(1);
        let mut tensors = Vec::with_capacity(order.len());
        let mut index = HashMap::with_capacity(order.len());
        for id in order {
            let Some(scan) = scans.remove(&id) else {
                continue;
            };
            let record = records.get(&id);
            let dropped_after = drops.get(&id).copied();
            let last_use = scan.uses.last().copied();
            let last_touch = last_use.unwrap_or(scan.first);
            let live_to = match dropped_after {
                // Dropped after `n` ops: it still held memory during op `n - 1`.
                Some(n) => last_touch.max(n.saturating_sub(1)).min(last_op),
                None => last_op,
            };
            index.insert(id, tensors.len());
            tensors.push(TensorLife {
                id,
                bytes: record.map_or(0, |r| r.bytes),
                parameter: record.is_some_and(|r| r.role == TensorRole::Parameter),
                producer: scan.producer,
                first: scan.first,
                last_use,
                dropped_after,
                uses: scan.uses,
                live_from: scan.producer.unwrap_or(0),
                live_to,
            });
        }

        let backward_start = find_backward_start(tape, &records, &tensors, &index);
        let (saved_activations, saved_activation_bytes) = match backward_start {
            Some(start) => {
                let saved: Vec<&TensorLife> = tensors
                    .iter()
                    .filter(|t| {
                        !t.parameter
                            && t.producer.is_some_and(|p| p < start)
                            && t.last_use.is_some_and(|u| u >= start)
                    })
                    .collect();
                (
                    saved.iter().map(|t| t.id).collect(),
                    saved
                        .iter()
                        .map(|t| t.bytes)
                        .fold(0u64, u64::saturating_add),
                )
            }
            None => (Vec::new(), 0),
        };

        let critical_path = critical_path(tape, &predecessors);
        let live_bytes = live_bytes(op_count, &tensors);
        let peak = live_bytes
            .iter()
            .enumerate()
            // `max_by_key` keeps the last maximum; the first is the one to report, so compare on
            // (bytes, reversed index).
            .max_by_key(|&(i, &b)| (b, std::cmp::Reverse(i)))
            .map_or(PeakLive::default(), |(i, &b)| PeakLive {
                bytes: b,
                at_op: Some(i as u32),
            });

        Self {
            step: tape.step,
            op_count,
            predecessors,
            successors,
            edges,
            tensors,
            backward_start,
            saved_activations,
            saved_activation_bytes,
            critical_path,
            peak,
            live_bytes,
            index,
        }
    }

    /// The life of tensor `id`, if an op of the step touched it.
    pub fn tensor(&self, id: TensorId) -> Option<&TensorLife> {
        self.index.get(&id).map(|&i| &self.tensors[i])
    }

    /// The ops that produced op `op`'s inputs within the step (empty for an unknown op).
    pub fn predecessors_of(&self, op: u32) -> &[u32] {
        self.predecessors
            .get(op as usize)
            .map_or(&[], Vec::as_slice)
    }

    /// The ops that use op `op`'s outputs (empty for an unknown op).
    pub fn successors_of(&self, op: u32) -> &[u32] {
        self.successors.get(op as usize).map_or(&[], Vec::as_slice)
    }

    /// The first op strictly after `at_op` that uses tensor `id`; `None` when nothing later in
    /// the step uses it (or the step never touched it).
    pub fn next_use(&self, id: TensorId, at_op: u32) -> Option<u32> {
        let uses = &self.tensor(id)?.uses;
        let after = uses.partition_point(|&u| u <= at_op);
        uses.get(after).copied()
    }

    /// How many ops after `at_op` tensor `id` is next used (`next_use - at_op`, so at least 1).
    pub fn next_use_distance(&self, id: TensorId, at_op: u32) -> Option<u32> {
        self.next_use(id, at_op).map(|u| u - at_op)
    }

    /// Bytes alive while op `op` runs; `None` past the end of the step.
    pub fn live_bytes_at(&self, op: u32) -> Option<u64> {
        self.live_bytes.get(op as usize).copied()
    }
}

/// The heuristic documented on [`StepAnalysis::new`], in one pass: a count of unconsumed
/// produced tensors per (dtype, shape), checked at each `float_ones` candidate.
fn find_backward_start(
    tape: &StepTape,
    records: &HashMap<TensorId, &TensorRecord>,
    tensors: &[TensorLife],
    index: &HashMap<TensorId, usize>,
) -> Option<u32> {
    let key = |id: &TensorId| {
        records
            .get(id)
            .map(|r| (r.dtype.as_str(), r.shape.as_slice()))
    };
    let life = |id: &TensorId| index.get(id).map(|&i| &tensors[i]);
    let mut sinks: HashMap<(&str, &[usize]), u32> = HashMap::new();
    let mut consumed: std::collections::HashSet<TensorId> = std::collections::HashSet::new();
    for (i, op) in tape.ops.iter().enumerate() {
        let i = u32::try_from(i).ok()?;
        if op.name == ROOT_GRADIENT_OP
            && op.inputs.is_empty()
            && let [out] = op.outputs.as_slice()
            && let Some(k) = key(out)
            && sinks.get(&k).is_some_and(|&n| n > 0)
        {
            return Some(i);
        }
        if !op.outputs.is_empty() {
            for id in &op.inputs {
                let produced_in_step = life(id).is_some_and(|t| t.producer.is_some());
                if produced_in_step
                    && consumed.insert(*id)
                    && let Some(k) = key(id)
                    && let Some(n) = sinks.get_mut(&k)
                {
                    *n = n.saturating_sub(1);
                }
            }
        }
        for id in &op.outputs {
            if life(id).is_some_and(|t| t.producer == Some(i))
                && let Some(k) = key(id)
            {
                *sinks.entry(k).or_insert(0) += 1;
            }
        }
    }
    None
}

/// The longest path through the DAG, each op weighted by its duration. Recorded order is a
/// topological order (a tensor is produced before it is used), so one forward pass suffices.
///
/// Edges are data flow only: two ops on one stream that do not share a tensor may still have run
/// one after the other, so the path is a lower bound on the step's time, and what it tells is
/// which chain of ops no amount of overlap can shorten.
fn critical_path(tape: &StepTape, predecessors: &[Vec<u32>]) -> CriticalPath {
    let n = predecessors.len();
    let mut finish = vec![0u64; n];
    let mut via: Vec<Option<u32>> = vec![None; n];
    for i in 0..n {
        // Ties go to the earliest predecessor so the path is deterministic.
        let best = predecessors[i].iter().filter(|&&p| (p as usize) < i).fold(
            None::<(u64, u32)>,
            |best, &p| match best {
                Some((f, _)) if f >= finish[p as usize] => best,
                _ => Some((finish[p as usize], p)),
            },
        );
        let before = best.map_or(0, |(f, _)| f);
        via[i] = best.map(|(_, p)| p);
        finish[i] = before.saturating_add(tape.ops[i].duration_ns);
    }
    let Some((end, &duration_ns)) = finish
        .iter()
        .enumerate()
        .max_by_key(|&(i, &f)| (f, std::cmp::Reverse(i)))
    else {
        return CriticalPath::default();
    };
    let mut ops = vec![end as u32];
    let mut at = end;
    while let Some(p) = via[at] {
        ops.push(p);
        at = p as usize;
    }
    ops.reverse();
    CriticalPath { ops, duration_ns }
}

/// Live bytes per op, with a difference array: each tensor adds its bytes at `live_from` and
/// removes them after `live_to`.
fn live_bytes(op_count: u32, tensors: &[TensorLife]) -> Vec<u64> {
    let n = op_count as usize;
    let mut delta = vec![0i128; n + 1];
    for t in tensors {
        let (from, to) = (t.live_from as usize, t.live_to as usize);
        if from >= n || to < from {
            continue;
        }
        delta[from] += i128::from(t.bytes);
        delta[to + 1] -= i128::from(t.bytes);
    }
    let mut live = Vec::with_capacity(n);
    let mut running = 0i128;
    for d in delta.iter().take(n) {
        running += d;
        live.push(u64::try_from(running).unwrap_or(u64::MAX));
    }
    live
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::tape::model::{DropRecord, OpRecord, Producer, TAPE_SCHEMA_VERSION};

    /// Builds a tape op by op: tensors are declared with their shape the first time they appear.
    #[derive(Default)]
    pub(crate) struct TapeBuilder {
        pub(crate) tape: StepTape,
    }

    impl TapeBuilder {
        pub(crate) fn new() -> Self {
            Self {
                tape: StepTape {
                    version: TAPE_SCHEMA_VERSION,
                    marked: true,
                    ..StepTape::default()
                },
            }
        }

        fn note(&mut self, id: TensorId, shape: &[usize], dtype: &str, role: TensorRole) {
            if self.tape.tensors.iter().all(|t| t.id != id) {
                self.tape.tensors.push(TensorRecord {
                    id,
                    bytes: shape.iter().product::<usize>() as u64 * 4,
                    dtype: dtype.to_string(),
                    shape: shape.to_vec(),
                    role,
                    producer: None,
                });
            }
        }

        /// A parameter (from before the step), declared before its first use.
        pub(crate) fn param(&mut self, id: TensorId, shape: &[usize]) -> &mut Self {
            self.note(id, shape, "F32", TensorRole::Parameter);
            self
        }

        /// A non-parameter tensor from before the step, declared before its first use.
        pub(crate) fn before(&mut self, id: TensorId, shape: &[usize]) -> &mut Self {
            self.note(id, shape, "F32", TensorRole::Other);
            self
        }

        /// An op; outputs are F32 with the given shapes.
        pub(crate) fn op(
            &mut self,
            name: &str,
            inputs: &[TensorId],
            outputs: &[(TensorId, &[usize])],
            duration_ns: u64,
        ) -> &mut Self {
            let index = self.tape.ops.len() as u32;
            for (slot, &(id, shape)) in outputs.iter().enumerate() {
                self.note(id, shape, "F32", TensorRole::Other);
                if let Some(t) = self.tape.tensors.iter_mut().find(|t| t.id == id) {
                    t.producer.get_or_insert(Producer {
                        op: index,
                        output: slot as u8,
                    });
                }
            }
            let start_ns = self
                .tape
                .ops
                .last()
                .map_or(0, |o| o.start_ns + o.duration_ns);
            self.tape.ops.push(OpRecord {
                name: name.to_string(),
                inputs: inputs.to_vec(),
                outputs: outputs.iter().map(|&(id, _)| id).collect(),
                start_ns,
                duration_ns,
                thread: 1,
            });
            self
        }

        /// The last handle of `id` dropped now (after the ops recorded so far).
        pub(crate) fn drop_now(&mut self, id: TensorId) -> &mut Self {
            let after_ops = self.tape.ops.len() as u32;
            self.tape.drops.push(DropRecord { id, after_ops });
            self
        }

        pub(crate) fn build(&self) -> StepTape {
            self.tape.clone()
        }
    }

    /// A tiny training step of a linear model with a loss, in the shape Burn records it:
    ///
    /// ```text
    ///  0 float_from_data        -> x[4,3]          (the batch)
    ///  1 float_matmul  x, w     -> h[4,2]
    ///  2 float_add     h, b     -> y[4,2]
    ///  3 float_mean    y        -> loss[1]
    ///  4 float_ones             -> g_loss[1]       (root gradient: backward starts here)
    ///  5 float_expand  g_loss   -> g_y[4,2]
    ///  6 float_sum_dim g_y      -> g_b[1,2]
    ///  7 float_matmul  x, g_y   -> g_w[3,2]        (x saved for backward)
    ///  8 float_sub     w, g_w   -> w2[3,2]         (optimizer)
    ///  9 float_sub     b, g_b   -> b2[1,2]
    /// ```
    /// Parameters w = 10 [3,2], b = 11 [1,2]. Drops: x after op 7, h after op 2, y after op 3,
    /// g_loss after 5, g_y after 7, g_w after 8, g_b after 9, w and b after the optimizer.
    pub(crate) fn linear_step() -> StepTape {
        let mut b = TapeBuilder::new();
        b.param(10, &[3, 2]).param(11, &[1, 2]);
        b.op("float_from_data", &[], &[(1, &[4, 3])], 5)
            .op("float_matmul", &[1, 10], &[(2, &[4, 2])], 40)
            .op("float_add", &[2, 11], &[(3, &[4, 2])], 10)
            .drop_now(2)
            .op("float_mean", &[3], &[(4, &[1])], 10)
            .drop_now(3)
            .op("float_ones", &[], &[(5, &[1])], 1)
            .op("float_expand", &[5], &[(6, &[4, 2])], 3)
            .drop_now(5)
            .op("float_sum_dim", &[6], &[(7, &[1, 2])], 7)
            .op("float_matmul", &[1, 6], &[(8, &[3, 2])], 30)
            .drop_now(1)
            .drop_now(6)
            .op("float_sub", &[10, 8], &[(12, &[3, 2])], 4)
            .drop_now(8)
            .drop_now(10)
            .op("float_sub", &[11, 7], &[(13, &[1, 2])], 2)
            .drop_now(7)
            .drop_now(11);
        b.build()
    }

    #[test]
    fn dag_has_an_edge_per_tensor_and_use() {
        let a = StepAnalysis::new(&linear_step());
        assert_eq!(a.op_count, 10);
        assert_eq!(a.predecessors_of(0), &[] as &[u32]);
        assert_eq!(a.predecessors_of(1), &[0], "w is from before the step");
        assert_eq!(a.predecessors_of(2), &[1]);
        assert_eq!(
            a.predecessors_of(4),
            &[] as &[u32],
            "the root has no inputs"
        );
        assert_eq!(a.predecessors_of(7), &[0, 5]);
        assert_eq!(a.predecessors_of(8), &[7]);
        assert_eq!(a.successors_of(0), &[1, 7]);
        assert_eq!(a.successors_of(5), &[6, 7]);
        assert_eq!(a.successors_of(99), &[] as &[u32]);
        assert!(a.edges.contains(&Edge {
            tensor: 1,
            from_op: 0,
            to_op: 7
        }));
        assert!(
            a.edges.iter().all(|e| e.tensor != 10 && e.tensor != 11),
            "parameters come from before the step: no producing op, no edge"
        );
        assert_eq!(a.edges.len(), 9);
        assert!(a.edges.iter().all(|e| e.from_op < e.to_op));
    }

    #[test]
    fn a_tensor_used_twice_by_one_op_is_one_use_and_one_edge() {
        let mut b = TapeBuilder::new();
        b.op("float_from_data", &[], &[(1, &[2])], 1)
            .op("float_mul", &[1, 1], &[(2, &[2])], 1);
        let a = StepAnalysis::new(&b.build());
        assert_eq!(a.tensor(1).map(|t| t.uses.clone()), Some(vec![1]));
        assert_eq!(a.edges.len(), 1);
        assert_eq!(a.predecessors_of(1), &[0]);
    }

    #[test]
    fn live_intervals_uses_and_drops() {
        let a = StepAnalysis::new(&linear_step());
        let x = a.tensor(1).cloned().unwrap();
        assert_eq!(x.producer, Some(0));
        assert_eq!(x.first, 0);
        assert_eq!(x.uses, vec![1, 7]);
        assert_eq!(x.last_use, Some(7));
        assert_eq!(x.dropped_after, Some(8));
        assert_eq!((x.live_from, x.live_to), (0, 7));
        assert_eq!(x.bytes, 48);
        assert!(!x.parameter);

        let w = a.tensor(10).cloned().unwrap();
        assert!(w.parameter);
        assert_eq!(w.producer, None);
        assert_eq!(w.first, 1, "first use for a tensor from before the step");
        assert_eq!(w.uses, vec![1, 8]);
        assert_eq!(w.live_from, 0, "it exists when the step begins");
        assert_eq!(w.live_to, 8);

        // The updated parameter is never dropped in the step: live to the end.
        let w2 = a.tensor(12).cloned().unwrap();
        assert_eq!(
            (w2.producer, w2.last_use, w2.dropped_after),
            (Some(8), None, None)
        );
        assert_eq!((w2.live_from, w2.live_to), (8, 9));

        // The loss is never dropped during the step (the caller holds it).
        let loss = a.tensor(4).cloned().unwrap();
        assert_eq!(loss.uses, Vec::<u32>::new());
        assert_eq!(loss.live_to, 9);
        assert!(a.tensor(999).is_none());
        assert!(a.tensor(3).unwrap().is_live_at(3));
        assert!(!a.tensor(3).unwrap().is_live_at(4));
    }

    #[test]
    fn a_drop_later_than_the_last_use_extends_the_interval() {
        let mut b = TapeBuilder::new();
        b.op("float_from_data", &[], &[(1, &[2])], 1)
            .op("float_exp", &[1], &[(2, &[2])], 1)
            .op("float_exp", &[2], &[(3, &[2])], 1)
            .op("float_exp", &[3], &[(4, &[2])], 1)
            .drop_now(1);
        let a = StepAnalysis::new(&b.build());
        let x = a.tensor(1).unwrap();
        assert_eq!(x.last_use, Some(1));
        assert_eq!(x.live_to, 3, "held until dropped after op 3");
    }

    #[test]
    fn next_use_is_strictly_after() {
        let a = StepAnalysis::new(&linear_step());
        assert_eq!(a.next_use(1, 0), Some(1));
        assert_eq!(a.next_use(1, 1), Some(7));
        assert_eq!(a.next_use(1, 3), Some(7));
        assert_eq!(a.next_use(1, 7), None);
        assert_eq!(a.next_use_distance(1, 3), Some(4));
        assert_eq!(a.next_use_distance(10, 0), Some(1));
        assert_eq!(a.next_use_distance(10, 1), Some(7));
        assert_eq!(a.next_use(999, 0), None);
    }

    #[test]
    fn backward_starts_at_the_root_gradient() {
        let a = StepAnalysis::new(&linear_step());
        assert_eq!(a.backward_start, Some(4));
    }

    #[test]
    fn a_forward_ones_is_not_the_root() {
        // A `float_ones` in forward with the shape of nothing unconsumed (a mask), then the loss.
        let mut b = TapeBuilder::new();
        b.op("float_from_data", &[], &[(1, &[4, 2])], 1)
            .op("float_ones", &[], &[(2, &[2, 2])], 1)
            .op("float_matmul", &[1, 2], &[(3, &[4, 2])], 1)
            .op("float_sum", &[3], &[(4, &[1])], 1)
            .op("float_ones", &[], &[(5, &[1])], 1)
            .op("float_expand", &[5], &[(6, &[4, 2])], 1)
            .op("float_mul", &[6, 1], &[(7, &[4, 2])], 1);
        let a = StepAnalysis::new(&b.build());
        assert_eq!(a.backward_start, Some(4));
    }

    #[test]
    fn a_consumed_tensor_of_the_loss_shape_is_not_a_sink() {
        let mut b = TapeBuilder::new();
        b.op("float_from_data", &[], &[(1, &[1])], 1)
            .op("float_exp", &[1], &[(2, &[3])], 1)
            // Forward: the only [1] tensor so far is consumed, so this is a scale, not the root.
            .op("float_ones", &[], &[(3, &[1])], 1)
            .op("float_mul", &[2, 3], &[(4, &[3])], 1)
            .op("float_sum", &[4], &[(5, &[1])], 1)
            .op("float_ones", &[], &[(6, &[1])], 1);
        assert_eq!(StepAnalysis::new(&b.build()).backward_start, Some(5));
    }

    #[test]
    fn a_forward_ones_on_an_unconsumed_shape_is_taken_for_the_root() {
        // The documented limit: a mask made right after the batch it matches, before the batch is
        // used, looks like the root gradient of a loss of the batch's shape.
        let mut b = TapeBuilder::new();
        b.op("float_from_data", &[], &[(1, &[4, 8])], 1)
            .op("float_ones", &[], &[(2, &[4, 8])], 1)
            .op("float_mul", &[1, 2], &[(3, &[4, 8])], 1)
            .op("float_sum", &[3], &[(4, &[1])], 1)
            .op("float_ones", &[], &[(5, &[1])], 1);
        assert_eq!(StepAnalysis::new(&b.build()).backward_start, Some(1));
    }

    #[test]
    fn reading_the_loss_to_the_host_does_not_consume_it() {
        let mut b = TapeBuilder::new();
        b.op("float_from_data", &[], &[(1, &[3])], 1)
            .op("float_sum", &[1], &[(2, &[1])], 1)
            .op("float_into_data", &[2], &[], 1)
            .op("float_ones", &[], &[(3, &[1])], 1);
        let a = StepAnalysis::new(&b.build());
        assert_eq!(a.backward_start, Some(3));
    }

    #[test]
    fn dtype_must_match_the_loss() {
        let mut b = TapeBuilder::new();
        b.op("float_from_data", &[], &[(1, &[3])], 1)
            .op("float_sum", &[1], &[(2, &[1])], 1)
            .op("float_ones", &[], &[(3, &[1])], 1);
        let mut tape = b.build();
        if let Some(t) = tape.tensors.iter_mut().find(|t| t.id == 2) {
            t.dtype = "F16".into();
        }
        assert_eq!(StepAnalysis::new(&tape).backward_start, None);
    }

    #[test]
    fn no_backward_without_a_root() {
        let mut b = TapeBuilder::new();
        b.op("float_from_data", &[], &[(1, &[3])], 1)
            .op("float_sum", &[1], &[(2, &[1])], 1);
        let a = StepAnalysis::new(&b.build());
        assert_eq!(a.backward_start, None);
        assert!(a.saved_activations.is_empty());
        assert_eq!(a.saved_activation_bytes, 0);
    }

    #[test]
    fn saved_activations_are_forward_tensors_read_in_backward() {
        let a = StepAnalysis::new(&linear_step());
        // x (1) is read by op 7; parameters w, b are read by the optimizer but are parameters.
        assert_eq!(a.saved_activations, vec![1]);
        assert_eq!(a.saved_activation_bytes, 48);
    }

    #[test]
    fn state_from_before_the_step_is_not_a_saved_activation() {
        // Optimizer state (from before the step, not a parameter) read after the root, and a
        // forward tensor read only in forward.
        let mut b = TapeBuilder::new();
        b.param(10, &[2]).before(20, &[2]);
        b.op("float_mul", &[10, 10], &[(1, &[2])], 1)
            .op("float_exp", &[1], &[(2, &[2])], 1)
            .op("float_sum", &[2], &[(3, &[1])], 1)
            .op("float_ones", &[], &[(4, &[1])], 1)
            .op("float_mul", &[4, 2], &[(5, &[2])], 1)
            .op("float_add", &[20, 5], &[(6, &[2])], 1);
        let a = StepAnalysis::new(&b.build());
        assert_eq!(a.backward_start, Some(3));
        assert_eq!(a.saved_activations, vec![2]);
        assert_eq!(a.saved_activation_bytes, 8);
        assert!(!a.tensor(20).unwrap().parameter);
    }

    #[test]
    fn critical_path_follows_the_longest_chain_by_duration() {
        let a = StepAnalysis::new(&linear_step());
        // 0 (5) -> 1 (40) -> 2 (10) -> 3 (10): 65, a dead end (the loss feeds nothing).
        // 4 (1) -> 5 (3) -> 7 (30) -> 8 (4): 38; 0 (5) -> 7 (30) -> 8 (4): 39.
        assert_eq!(a.critical_path.ops, vec![0, 1, 2, 3]);
        assert_eq!(a.critical_path.duration_ns, 65);

        let mut b = TapeBuilder::new();
        b.op("a", &[], &[(1, &[1])], 10)
            .op("b", &[], &[(2, &[1])], 1)
            .op("c", &[1], &[(3, &[1])], 1)
            .op("d", &[2], &[(4, &[1])], 100)
            .op("e", &[3, 4], &[(5, &[1])], 1);
        let a = StepAnalysis::new(&b.build());
        assert_eq!(a.critical_path.ops, vec![1, 3, 4]);
        assert_eq!(a.critical_path.duration_ns, 102);
    }

    #[test]
    fn peak_live_bytes_and_where() {
        let a = StepAnalysis::new(&linear_step());
        // Op 1: x 48 + w 24 + b 8 + h 32 + (y not yet) = 112.
        assert_eq!(a.live_bytes_at(0), Some(48 + 24 + 8));
        assert_eq!(a.live_bytes_at(1), Some(112));
        // Op 2: x, w, b, h, y = 144 (h dropped after op 2).
        assert_eq!(a.live_bytes_at(2), Some(144));
        // Op 3: x, w, b, y, loss 4 = 116.
        assert_eq!(a.live_bytes_at(3), Some(116));
        // Op 7: x 48, w 24, b 8, loss 4, g_y 32, g_b 8, g_w 24 = 148 (g_loss dropped after 5).
        assert_eq!(a.live_bytes_at(7), Some(148));
        assert_eq!(a.peak.bytes, 148);
        assert_eq!(a.peak.at_op, Some(7));
        assert_eq!(a.live_bytes_at(10), None);
        assert_eq!(a.live_bytes.len(), 10);
        // Op 9: b 8, loss 4, g_b 8, w2 24, b2 8 = 52.
        assert_eq!(a.live_bytes_at(9), Some(52));
    }

    #[test]
    fn the_first_op_of_an_equal_peak_is_reported() {
        let mut b = TapeBuilder::new();
        b.op("float_from_data", &[], &[(1, &[2])], 1)
            .op("float_exp", &[1], &[(2, &[2])], 1)
            .drop_now(1)
            .op("float_exp", &[2], &[(3, &[2])], 1)
            .drop_now(2);
        let a = StepAnalysis::new(&b.build());
        assert_eq!(a.live_bytes, vec![8, 16, 16]);
        assert_eq!(
            a.peak,
            PeakLive {
                bytes: 16,
                at_op: Some(1)
            }
        );
    }

    #[test]
    fn empty_and_malformed_tapes_do_not_panic() {
        let a = StepAnalysis::new(&StepTape::default());
        assert_eq!(a.op_count, 0);
        assert_eq!(a.peak, PeakLive::default());
        assert_eq!(a.critical_path, CriticalPath::default());
        assert_eq!(a.live_bytes_at(0), None);

        // Ids without records, a drop of an unknown tensor, a drop before anything ran.
        let tape = StepTape {
            ops: vec![OpRecord {
                name: "float_exp".into(),
                inputs: vec![1],
                outputs: vec![2],
                start_ns: 0,
                duration_ns: 3,
                thread: 1,
            }],
            drops: vec![
                DropRecord {
                    id: 77,
                    after_ops: 0,
                },
                DropRecord {
                    id: 1,
                    after_ops: 0,
                },
            ],
            ..StepTape::default()
        };
        let a = StepAnalysis::new(&tape);
        let t = a.tensor(1).unwrap();
        assert_eq!((t.bytes, t.live_to), (0, 0));
        assert!(a.tensor(77).is_none());
        assert_eq!(a.critical_path.duration_ns, 3);
    }

    #[test]
    fn analysis_serialises() {
        let a = StepAnalysis::new(&linear_step());
        let json = serde_json::to_value(&a).unwrap();
        assert_eq!(json["backward_start"], 4);
        assert_eq!(json["peak"]["bytes"], 148);
        assert!(json.get("index").is_none());
        assert_eq!(json["edges"][0]["from_op"], 0);
    }
}
