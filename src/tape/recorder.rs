//! The recorder: appends every op of a device to the current step's tape.
//!
//! The hot path writes into flat buffers that are cleared, not freed, at each step boundary, so
//! after the first step an op records without allocating (unless it brings a tensor of a higher
//! rank than any before). At a boundary the buffers become a [`StepTape`], kept for analysis
//! and export; only the last few steps are kept.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use super::model::{DropRecord, OpRecord, Producer, StepTape, TAPE_SCHEMA_VERSION, TensorRecord};
use crate::engine::{TensorId, TensorRole};

/// How many finished steps a recorder keeps.
const KEPT_STEPS: usize = 2;

/// A tensor as an op sees it, borrowed from the handle.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    /// The handle's id.
    pub id: TensorId,
    /// Logical bytes.
    pub bytes: u64,
    /// The dtype's name.
    pub dtype: &'static str,
    /// The shape.
    pub shape: &'a [usize],
    /// Parameter or not.
    pub role: TensorRole,
}

struct RawOp {
    name: &'static str,
    /// Range of this op's ids in `Buffers::ids`: inputs, then outputs.
    first_id: u32,
    inputs: u16,
    outputs: u16,
    start_ns: u64,
    duration_ns: u64,
    thread: u64,
}

struct RawTensor {
    bytes: u64,
    dtype: &'static str,
    /// Range in `Buffers::dims`.
    first_dim: u32,
    rank: u8,
    role: TensorRole,
    producer: Option<Producer>,
    /// Order of first appearance, so the finished tape lists tensors deterministically.
    order: u32,
}

#[derive(Default)]
struct Buffers {
    ops: Vec<RawOp>,
    ids: Vec<TensorId>,
    dims: Vec<usize>,
    tensors: HashMap<TensorId, RawTensor>,
    drops: Vec<DropRecord>,
}

impl Buffers {
    fn clear(&mut self) {
        self.ops.clear();
        self.ids.clear();
        self.dims.clear();
        self.tensors.clear();
        self.drops.clear();
    }

    fn note_tensor(&mut self, t: &TensorView<'_>, producer: Option<Producer>) {
        let order = self.tensors.len() as u32;
        let dims = &mut self.dims;
        self.tensors.entry(t.id).or_insert_with(|| {
            let first_dim = dims.len() as u32;
            dims.extend_from_slice(t.shape);
            RawTensor {
                bytes: t.bytes,
                dtype: t.dtype,
                first_dim,
                rank: t.shape.len() as u8,
                role: t.role,
                producer,
                order,
            }
        });
    }

    fn finish(&self, step: u64, marked: bool, duration_ns: u64) -> StepTape {
        let ops = self
            .ops
            .iter()
            .map(|op| {
                let ids = &self.ids[op.first_id as usize..];
                let (inputs, rest) = ids.split_at(op.inputs as usize);
                OpRecord {
                    name: op.name.to_string(),
                    inputs: inputs.to_vec(),
                    outputs: rest[..op.outputs as usize].to_vec(),
                    start_ns: op.start_ns,
                    duration_ns: op.duration_ns,
                    thread: op.thread,
                }
            })
            .collect();
        let mut tensors: Vec<(u32, TensorRecord)> = self
            .tensors
            .iter()
            .map(|(&id, t)| {
                let dims = &self.dims[t.first_dim as usize..t.first_dim as usize + t.rank as usize];
                (
                    t.order,
                    TensorRecord {
                        id,
                        bytes: t.bytes,
                        dtype: t.dtype.to_string(),
                        shape: dims.to_vec(),
                        role: t.role,
                        producer: t.producer,
                    },
                )
            })
            .collect();
        tensors.sort_by_key(|(order, _)| *order);
        StepTape {
            version: TAPE_SCHEMA_VERSION,
            step,
            marked,
            ops,
            tensors: tensors.into_iter().map(|(_, t)| t).collect(),
            drops: self.drops.clone(),
            duration_ns,
        }
    }
}

struct State {
    buffers: Buffers,
    step: u64,
    step_start: Instant,
    /// Whether the current step was opened by a marker.
    marked: bool,
    finished: VecDeque<Arc<StepTape>>,
}

/// The per-device recorder.
pub struct Recorder {
    enabled: AtomicBool,
    state: Mutex<State>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self {
            enabled: AtomicBool::new(false),
            state: Mutex::new(State {
                buffers: Buffers::default(),
                step: 0,
                step_start: Instant::now(),
                marked: false,
                finished: VecDeque::new(),
            }),
        }
    }
}

thread_local! {
    static THREAD: u64 = {
        use std::sync::atomic::AtomicU64;
        static NEXT: AtomicU64 = AtomicU64::new(1);
        NEXT.fetch_add(1, Ordering::Relaxed)
    };
}

/// A small, stable number for the calling thread.
pub fn thread_number() -> u64 {
    THREAD.with(|t| *t)
}

impl Recorder {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether ops are being recorded.
    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Starts or stops recording. Starting opens a fresh (unmarked) step.
    pub fn set_enabled(&self, enabled: bool) {
        if enabled && !self.is_enabled() {
            let mut state = self.lock();
            state.buffers.clear();
            state.step_start = Instant::now();
            state.marked = false;
        }
        self.enabled.store(enabled, Ordering::Relaxed);
    }

    /// Appends one op.
    pub fn record_op<'a>(
        &self,
        name: &'static str,
        inputs: impl ExactSizeIterator<Item = TensorView<'a>>,
        outputs: impl ExactSizeIterator<Item = TensorView<'a>>,
        started: Instant,
        duration_ns: u64,
    ) {
        let thread = thread_number();
        let mut state = self.lock();
        let start_ns = started
            .saturating_duration_since(state.step_start)
            .as_nanos() as u64;
        let buffers = &mut state.buffers;
        let op = buffers.ops.len() as u32;
        let first_id = buffers.ids.len() as u32;
        let (n_in, n_out) = (inputs.len(), outputs.len());
        for input in inputs {
            buffers.note_tensor(&input, None);
            buffers.ids.push(input.id);
        }
        for (i, output) in outputs.enumerate() {
            buffers.note_tensor(
                &output,
                Some(Producer {
                    op,
                    output: i as u8,
                }),
            );
            buffers.ids.push(output.id);
        }
        buffers.ops.push(RawOp {
            name,
            first_id,
            inputs: n_in as u16,
            outputs: n_out as u16,
            start_ns,
            duration_ns,
            thread,
        });
    }

    /// Notes that a tensor's last handle dropped.
    pub fn record_drop(&self, id: TensorId) {
        let mut state = self.lock();
        let after_ops = state.buffers.ops.len() as u32;
        state.buffers.drops.push(DropRecord { id, after_ops });
    }

    /// Closes the current step (if it recorded anything) and opens the next. Returns the closed
    /// step's tape.
    pub fn boundary(&self, next_marked: bool) -> Option<Arc<StepTape>> {
        let mut state = self.lock();
        let closed = if state.buffers.ops.is_empty() {
            None
        } else {
            let duration = state.step_start.elapsed().as_nanos() as u64;
            let tape = Arc::new(state.buffers.finish(state.step, state.marked, duration));
            state.step += 1;
            if state.finished.len() == KEPT_STEPS {
                state.finished.pop_front();
            }
            state.finished.push_back(tape.clone());
            Some(tape)
        };
        state.buffers.clear();
        state.step_start = Instant::now();
        state.marked = next_marked;
        closed
    }

    /// The last finished step, if any.
    pub fn last_step(&self) -> Option<Arc<StepTape>> {
        self.lock().finished.back().cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(id: TensorId, shape: &[usize]) -> TensorView<'_> {
        TensorView {
            id,
            bytes: shape.iter().product::<usize>() as u64 * 4,
            dtype: "F32",
            shape,
            role: TensorRole::Other,
        }
    }

    #[test]
    fn a_step_becomes_a_tape_with_producers_and_drops() {
        let rec = Recorder::default();
        rec.set_enabled(true);
        let t0 = Instant::now();
        rec.record_op(
            "float_from_data",
            [].into_iter(),
            [view(1, &[2, 3])].into_iter(),
            t0,
            10,
        );
        rec.record_op(
            "float_exp",
            [view(1, &[2, 3])].into_iter(),
            [view(2, &[2, 3])].into_iter(),
            t0,
            20,
        );
        rec.record_drop(1);
        rec.record_op(
            "float_sum",
            [view(2, &[2, 3])].into_iter(),
            [view(3, &[1])].into_iter(),
            t0,
            5,
        );
        let tape = rec.boundary(true).unwrap();
        assert_eq!(tape.ops.len(), 3);
        assert_eq!(tape.ops[1].inputs, vec![1]);
        assert_eq!(tape.ops[1].outputs, vec![2]);
        assert_eq!(
            tape.tensors.iter().map(|t| t.id).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        assert_eq!(
            tape.tensors[2].producer,
            Some(Producer { op: 2, output: 0 })
        );
        assert_eq!(tape.tensors[0].shape, vec![2, 3]);
        assert_eq!(
            tape.drops,
            vec![DropRecord {
                id: 1,
                after_ops: 2
            }]
        );
        assert!(!tape.marked && tape.step == 0);
        // The next step starts empty and marked.
        rec.record_op(
            "float_exp",
            [view(3, &[1])].into_iter(),
            [view(4, &[1])].into_iter(),
            t0,
            1,
        );
        let next = rec.boundary(false).unwrap();
        assert!(next.marked && next.step == 1);
        assert_eq!(
            next.tensors[0].producer, None,
            "a tensor from before the step"
        );
        assert!(rec.boundary(false).is_none(), "an empty step is not a step");
    }
}
