//! The batch search: from steps recorded at two batch sizes, the step at any other batch size
//! (each dimension, byte count and duration linear in the batch, as they are in a model whose
//! activations scale with it), and the largest batch whose predicted overhead stays under a
//! limit at a budget.

use std::collections::HashMap;

use serde::Serialize;

use crate::engine::TensorId;
use crate::tape::{StepTape, TensorRecord};
use crate::{SpillConfig, SpillError};

use super::{DeviceProfile, DryRun, dry_run};

/// The answer of [`max_batch`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BatchSearch {
    /// The largest batch within the limit; `None` when not even a batch of 1 is.
    pub batch: Option<u64>,
    /// Its dry run.
    pub run: Option<DryRun>,
    /// Every batch tried, with its predicted overhead (`None` where the budget is below what
    /// one op needs).
    pub tried: Vec<(u64, Option<f64>)>,
}

fn error(reason: String) -> SpillError {
    SpillError::BatchSearch { reason }
}

/// Which ops two tapes pair up: all of them (`Ops::All`), or the stepping thread's only
/// (`Ops::Stepping`), whose order is the program's; other threads' ops (a metrics thread's reads)
/// land in a recording or not, depending on timing.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ops {
    All,
    Stepping,
}

/// The indices of `tape`'s ops that `which` pairs.
fn paired_ops(tape: &StepTape, which: Ops) -> Vec<usize> {
    match which {
        Ops::All => (0..tape.ops.len()).collect(),
        Ops::Stepping => crate::policy::plan::positions_of(tape)
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.map(|_| i))
            .collect(),
    }
}

/// The pairs of op indices (`small`'s, `large`'s) of the same op in two recordings of one
/// program. Fails when the two tapes are not the same program.
fn op_pairs(
    small: &StepTape,
    large: &StepTape,
    which: Ops,
) -> Result<Vec<(usize, usize)>, SpillError> {
    let (a, b) = (paired_ops(small, which), paired_ops(large, which));
    if a.len() != b.len() {
        let whose = if which == Ops::Stepping {
            " on the stepping thread"
        } else {
            ""
        };
        return Err(error(format!(
            "the tapes have {} and {} ops{whose}: they are not the same program at two batch \
             sizes; record the same training step with only the batch size changed (and not at \
             batch 1, where autodiff skips the reductions over the batch)",
            a.len(),
            b.len()
        )));
    }
    Ok(a.into_iter().zip(b).collect())
}

/// For each tensor of `large`, its counterpart in `small`: the tensor at the same op and
/// argument position (ops as `which` pairs them). Fails when the two tapes are not the same
/// program.
fn counterparts(
    small: &StepTape,
    large: &StepTape,
    which: Ops,
) -> Result<HashMap<TensorId, TensorId>, SpillError> {
    let mut map = HashMap::new();
    for (i, j) in op_pairs(small, large, which)? {
        let (a, b) = (&small.ops[i], &large.ops[j]);
        if a.name != b.name
            || a.inputs.len() != b.inputs.len()
            || a.outputs.len() != b.outputs.len()
        {
            return Err(error(format!(
                "op {i} is `{}` in one tape and `{}` in the other: they are not the same program \
                 at two batch sizes; record the same training step with only the batch size changed",
                a.name, b.name
            )));
        }
        for (s, l) in a
            .inputs
            .iter()
            .chain(&a.outputs)
            .zip(b.inputs.iter().chain(&b.outputs))
        {
            map.entry(*l).or_insert(*s);
        }
    }
    Ok(map)
}

/// `value` at batch `batch`, on the line through (`b1`, `v1`) and (`b2`, `v2`), at least 0.
fn line(v1: u64, v2: u64, b1: u64, b2: u64, batch: u64) -> u64 {
    let (v1, v2, b1, b2, b) = (
        v1 as i128,
        v2 as i128,
        b1 as i128,
        b2 as i128,
        batch as i128,
    );
    let v = v1 + (v2 - v1) * (b - b1) / (b2 - b1);
    v.max(0) as u64
}

/// One tape of the program `tapes` recorded several times, each op's duration (and the gap
/// before it) the median of its recordings: a steadier basis for the `measured` profile than
/// one step on a shared machine. The first tape gives the tensors and drops.
///
/// # Errors
/// [`SpillError::BatchSearch`] when `tapes` is empty or they are not the same program.
pub fn median_tape(tapes: &[StepTape]) -> Result<StepTape, SpillError> {
    let first = tapes
        .first()
        .ok_or_else(|| error("no tapes to take the median of; give at least one".into()))?;
    for other in &tapes[1..] {
        // Op by op, every thread's: the median is taken per op index.
        counterparts(first, other, Ops::All)?;
    }
    let median = |mut v: Vec<u64>| {
        v.sort_unstable();
        v[v.len() / 2]
    };
    let mut merged = first.clone();
    // Each op keeps its duration and the gap before it; starts are laid out again from those.
    let gap = |t: &StepTape, i: usize| {
        let previous_end = i
            .checked_sub(1)
            .map_or(0, |p| t.ops[p].start_ns + t.ops[p].duration_ns);
        t.ops[i].start_ns.saturating_sub(previous_end)
    };
    let mut clock = 0u64;
    for i in 0..merged.ops.len() {
        let duration = median(tapes.iter().map(|t| t.ops[i].duration_ns).collect());
        clock += median(tapes.iter().map(|t| gap(t, i)).collect());
        merged.ops[i].start_ns = clock;
        merged.ops[i].duration_ns = duration;
        clock += duration;
    }
    let tail = median(
        tapes
            .iter()
            .map(|t| {
                let end = t.ops.last().map_or(0, |o| o.start_ns + o.duration_ns);
                t.duration_ns.saturating_sub(end)
            })
            .collect(),
    );
    merged.duration_ns = clock + tail;
    merged.tiers.clear();
    Ok(merged)
}

/// The step at batch `batch`, from `small` recorded at batch `small_batch` and `large` at
/// `large_batch` (the same program): every dimension, tensor size and op duration on the line
/// through the two recordings.
///
/// # Errors
/// [`SpillError::BatchSearch`] when the batch sizes are not two different positive numbers or
/// the tapes are not the same program (other op counts, names or tensor ranks).
pub fn scale_tape(
    small: &StepTape,
    small_batch: u64,
    large: &StepTape,
    large_batch: u64,
    batch: u64,
) -> Result<StepTape, SpillError> {
    if small_batch == 0 || large_batch == 0 || small_batch == large_batch || batch == 0 {
        return Err(error(format!(
            "batch sizes {small_batch} and {large_batch} (asked: {batch}): give two different \
             positive batch sizes, one per tape, and ask for a positive one"
        )));
    }
    // The stepping thread's ops: another thread's few ops (a metrics read) may be in one
    // recording and not the other; those keep the larger recording's sizes and times.
    let map = counterparts(small, large, Ops::Stepping)?;
    let pairs = op_pairs(small, large, Ops::Stepping)?;
    let by_id: HashMap<TensorId, &TensorRecord> = small.tensors.iter().map(|t| (t.id, t)).collect();
    let at = |v1: u64, v2: u64| line(v1, v2, small_batch, large_batch, batch);
    let mut scaled = large.clone();
    for t in &mut scaled.tensors {
        let Some(s) = map.get(&t.id).and_then(|id| by_id.get(id)) else {
            continue;
        };
        if s.shape.len() != t.shape.len() {
            return Err(error(format!(
                "tensor {} has rank {} in one tape and {} in the other: they are not the same \
                 program at two batch sizes",
                t.id,
                s.shape.len(),
                t.shape.len()
            )));
        }
        let elements: u64 = t.shape.iter().map(|&d| d as u64).product();
        let shape: Vec<usize> = s
            .shape
            .iter()
            .zip(&t.shape)
            .map(|(&a, &b)| at(a as u64, b as u64) as usize)
            .collect();
        let new_elements: u64 = shape.iter().map(|&d| d as u64).product();
        t.bytes = match t.bytes.checked_div(elements) {
            Some(per_element) => per_element * new_elements,
            None => at(s.bytes, t.bytes),
        };
        t.shape = shape;
    }
    for (i, j) in pairs {
        scaled.ops[j].duration_ns = at(small.ops[i].duration_ns, scaled.ops[j].duration_ns);
    }
    scaled.duration_ns = at(small.duration_ns, large.duration_ns);
    // Resident bytes per tier were measured at one batch size only.
    scaled.tiers.clear();
    Ok(scaled)
}

/// The largest batch whose predicted overhead on `profile` under `config` (its budget in
/// bytes or as a fraction of the device) is at most `overhead_limit` (0.10 = 10%), from two
/// recordings of the same step at batch sizes `small_batch` < `large_batch`. Searches upward
/// by doubling and then by bisection, up to 2^20.
///
/// # Errors
/// [`SpillError::BatchSearch`] as [`scale_tape`], or for a negative or non-finite limit.
pub fn max_batch(
    small: &StepTape,
    small_batch: u64,
    large: &StepTape,
    large_batch: u64,
    profile: &DeviceProfile,
    config: &SpillConfig,
    overhead_limit: f64,
) -> Result<BatchSearch, SpillError> {
    if !(overhead_limit.is_finite() && overhead_limit >= 0.0) {
        return Err(error(format!(
            "overhead limit {overhead_limit}: give a fraction of 0 or more (0.10 = 10%)"
        )));
    }
    let mut tried = Vec::new();
    let mut within = |batch: u64| -> Result<Option<DryRun>, SpillError> {
        let tape = scale_tape(small, small_batch, large, large_batch, batch)?;
        match dry_run(&tape, profile, config) {
            Ok(run) => {
                tried.push((batch, Some(run.overhead)));
                Ok((run.overhead <= overhead_limit).then_some(run))
            }
            Err(SpillError::PlanBudget { .. }) => {
                tried.push((batch, None));
                Ok(None)
            }
            Err(e) => Err(e),
        }
    };
    const LARGEST: u64 = 1 << 20;
    // (good, bad): the largest batch known within the limit, the smallest known over it.
    let (mut good, mut bad): (Option<(u64, DryRun)>, u64) = (None, LARGEST + 1);
    let mut batch = large_batch.max(small_batch);
    loop {
        match within(batch)? {
            Some(run) => {
                good = Some((batch, run));
                if batch >= LARGEST {
                    break;
                }
                batch = (batch * 2).min(LARGEST);
            }
            None => {
                bad = batch;
                break;
            }
        }
    }
    let mut low = good.as_ref().map_or(0, |(b, _)| *b);
    while bad - low > 1 {
        let mid = low + (bad - low) / 2;
        match within(mid)? {
            Some(run) => {
                low = mid;
                good = Some((mid, run));
            }
            None => bad = mid,
        }
    }
    tried.sort_by_key(|(b, _)| *b);
    Ok(BatchSearch {
        batch: good.as_ref().map(|(b, _)| *b),
        run: good.map(|(_, r)| r),
        tried,
    })
}
