//! `UsePlan`: when each tensor of a repeating step is used, learned from one recorded step.
//!
//! Tensor ids are new every step, so the plan names tensors by position instead: the output
//! `slot` of the op at position `op` ([`PlanKey::Produced`]), or, for a tensor from before the
//! step (a parameter, optimizer state), the input `slot` of the op that first reads it
//! ([`PlanKey::Input`]). The engine gives each live tensor such a key as the step runs, tagged
//! with the step it was given in ([`KeyAt`]), and asks the plan how far away its next use is.
//!
//! Positions count the ops of the stepping thread only (the thread that defines steps in the
//! recorder), so that a metrics thread's ops cannot shift them.

use std::collections::HashMap;

use crate::fast_hash::FastMap;

use crate::tape::StepTape;

/// A tensor's name in the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PlanKey {
    /// Output `slot` of the op at position `op`.
    Produced {
        /// Position of the producing op.
        op: u32,
        /// Which output.
        slot: u16,
    },
    /// A tensor from before the step, first read as input `slot` of the op at position `op`.
    Input {
        /// Position of the first op reading it.
        op: u32,
        /// Which input of that op.
        slot: u16,
    },
}

/// A key and the step (the recorder's step counter) it was given in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyAt {
    /// The step.
    pub step: u64,
    /// The key.
    pub key: PlanKey,
}

/// How far away a tensor's next use is, in ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextUse {
    /// In this many ops (0 = the op running now).
    In(u32),
    /// Not in this step nor the next: the best victim there is.
    Never,
    /// The plan cannot tell (no plan, a key from an older step, a program that changed).
    Unknown,
}

/// A tensor's next use as looked up at one position, kept so that later victim passes of the
/// same step need not look it up again: the plan is fixed, and positions only advance, so the
/// same next use lies that many ops closer (see [`at`](Self::at)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NextUseMemo {
    /// Which plan answered (a number the engine gives each plan it puts in force).
    pub plan: u64,
    /// The step and position it was asked at.
    pub step: u64,
    pub now: u32,
    /// The key it was asked for.
    pub key: KeyAt,
    /// The answer.
    pub next: NextUse,
}

impl NextUseMemo {
    /// What [`UsePlan::next_use`] answers for `key` at position `now` of `step` under plan
    /// `plan`, if this memo can tell: the same plan, key and step, at or after the position it
    /// was asked at, and no further on than the use it found (past it, the next use is another).
    #[inline]
    pub fn at(&self, plan: u64, key: KeyAt, step: u64, now: u32) -> Option<NextUse> {
        if self.plan != plan || self.step != step || self.key != key || now < self.now {
            return None;
        }
        let passed = now - self.now;
        match self.next {
            NextUse::In(d) if passed <= d => Some(NextUse::In(d - passed)),
            NextUse::In(_) => None,
            // No use left in this step nor the next (or none the plan can tell): still none.
            other => Some(other),
        }
    }
}

impl NextUse {
    /// The distance in ops, when there is a use the plan knows of.
    pub fn distance(self) -> Option<u32> {
        match self {
            NextUse::In(d) => Some(d),
            NextUse::Never | NextUse::Unknown => None,
        }
    }

    /// The distance, with `Never` as `u32::MAX` and `Unknown` as `unknown`.
    pub fn distance_or(self, unknown: u32) -> u32 {
        match self {
            NextUse::In(d) => d,
            NextUse::Never => u32::MAX,
            NextUse::Unknown => unknown,
        }
    }
}

/// The uses of every keyed tensor of one step, and which tensors a step hands to the next.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsePlan {
    len: u32,
    /// Positions (sorted, each once) where each key is read.
    uses: FastMap<PlanKey, Vec<u32>>,
    /// Tensors produced in a step and read in the next one: their key there.
    carried: FastMap<PlanKey, PlanKey>,
    /// The most device bytes the recorded step held (its own "planned" peak).
    recorded_peak: u64,
    /// Per position: the bytes its op allocates for new outputs, and the bytes whose last
    /// handle drops between it and the next op (other threads' ops and drops fold into the
    /// stepping thread's position before them).
    growth: Vec<Growth>,
    /// The largest [`headroom`](Self::headroom) at any position and lookahead.
    max_headroom: u64,
    /// Per position: [`peak_ahead`](Self::peak_ahead).
    peaks_ahead: Vec<PeakAhead>,
    /// Per position: the bytes its op needs on the device by itself (distinct inputs and
    /// outputs).
    op_bytes: Vec<u64>,
    /// `uses` and `carried` resolved per key, so that [`next_use`](Self::next_use) (asked for
    /// every resident at every victim pass, for every spilled tensor in the prefetch scan)
    /// takes one lookup: where the key's reads in this step and in the next lie in `arena`.
    resolved: FastMap<PlanKey, ResolvedUses>,
    arena: Vec<u32>,
}

/// A key's reads in its own step and in the next, as ranges of [`UsePlan`]'s arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ResolvedUses {
    this_step: (u32, u32),
    next_step: (u32, u32),
}

/// What one position does to the live bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Growth {
    allocated: u64,
    freed: u64,
}

/// The most positions [`UsePlan::headroom`] looks ahead.
pub const MAX_HEADROOM_LOOKAHEAD: u32 = 64;

/// Maps a tape's op indices to positions: ops of the stepping thread get consecutive positions,
/// the others none.
pub(crate) fn positions_of(tape: &StepTape) -> Vec<Option<u32>> {
    let mut per_thread: HashMap<u64, usize> = HashMap::new();
    for op in &tape.ops {
        *per_thread.entry(op.thread).or_default() += 1;
    }
    // The stepping thread runs the step; others (metrics, loaders) run a few ops beside it.
    let main = per_thread
        .into_iter()
        .max_by_key(|&(thread, n)| (n, std::cmp::Reverse(thread)))
        .map(|(thread, _)| thread);
    let mut next = 0u32;
    tape.ops
        .iter()
        .map(|op| {
            (Some(op.thread) == main).then(|| {
                next += 1;
                next - 1
            })
        })
        .collect()
}

/// Each tensor of a tape with its key there, and the positions that read it.
pub(crate) fn keys_and_uses(tape: &StepTape) -> (u32, HashMap<u64, (PlanKey, Vec<u32>)>) {
    let positions = positions_of(tape);
    let mut by_id: HashMap<u64, (PlanKey, Vec<u32>)> = HashMap::new();
    for (op, pos) in tape.ops.iter().zip(&positions) {
        let Some(pos) = *pos else { continue };
        for (slot, id) in op.inputs.iter().enumerate() {
            let entry = by_id.entry(*id).or_insert_with(|| {
                (
                    PlanKey::Input {
                        op: pos,
                        slot: slot as u16,
                    },
                    Vec::new(),
                )
            });
            if entry.1.last() != Some(&pos) {
                entry.1.push(pos);
            }
        }
        for (slot, id) in op.outputs.iter().enumerate() {
            // An op may hand back one of its inputs; the tensor keeps its first key.
            by_id.entry(*id).or_insert_with(|| {
                (
                    PlanKey::Produced {
                        op: pos,
                        slot: slot as u16,
                    },
                    Vec::new(),
                )
            });
        }
    }
    let len = positions.iter().flatten().count() as u32;
    (len, by_id)
}

/// Per position of `tape`'s stepping thread, the bytes its op needs by itself.
fn op_bytes_of(tape: &StepTape, len: u32) -> Vec<u64> {
    let bytes: HashMap<u64, u64> = tape.tensors.iter().map(|t| (t.id, t.bytes)).collect();
    let mut out = vec![0; len as usize];
    for (op, position) in tape.ops.iter().zip(positions_of(tape)) {
        let Some(p) = position else { continue };
        let mut seen: Vec<u64> = Vec::with_capacity(op.inputs.len() + op.outputs.len());
        for id in op.inputs.iter().chain(&op.outputs) {
            if !seen.contains(id) {
                seen.push(*id);
                out[p as usize] += bytes.get(id).copied().unwrap_or(0);
            }
        }
    }
    out
}

/// The room a step's ops need at their most, seen from one position (see
/// [`UsePlan::peak_ahead`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeakAhead {
    /// Bytes the ops add to the live bytes, at most, before any of their own frees make up
    /// for it.
    pub room: u64,
    /// How many ops after the position the most is reached (0: at the position's own op).
    pub after: u32,
}

/// [`UsePlan::peak_ahead`] for every position, over a window of one step that wraps: the
/// live level's highest point ahead of each position less the level there, by a sliding
/// window maximum (a monotonic queue) over the step written twice, in linear time.
fn peaks_ahead(growth: &[Growth]) -> Vec<PeakAhead> {
    let len = growth.len();
    if len == 0 {
        return Vec::new();
    }
    // level[t]: net bytes added by the positions before t; high[t]: the level at t's op, its
    // outputs made and nothing after it freed yet.
    let mut level = Vec::with_capacity(2 * len + 1);
    let mut high = Vec::with_capacity(2 * len);
    level.push(0i64);
    for t in 0..2 * len {
        let g = growth[t % len];
        high.push(level[t] + g.allocated as i64);
        level.push(level[t] + g.allocated as i64 - g.freed as i64);
    }
    let mut out = vec![PeakAhead::default(); len];
    // Positions in the window, by falling `high` (the front is the window's highest).
    let mut window: std::collections::VecDeque<usize> = std::collections::VecDeque::new();
    // Walk backwards: the window of `now` is `now..now + len`.
    for now in (0..2 * len).rev() {
        while window.back().is_some_and(|&t| high[t] <= high[now]) {
            window.pop_back();
        }
        window.push_back(now);
        while window.front().is_some_and(|&t| t >= now + len) {
            window.pop_front();
        }
        if now < len {
            let top = window[0];
            out[now] = PeakAhead {
                room: (high[top] - level[now]).max(0) as u64,
                after: (top - now) as u32,
            };
        }
    }
    out
}

/// Per position of `tape`'s stepping thread, the bytes allocated and freed there.
fn growth_of(tape: &StepTape, len: u32) -> Vec<Growth> {
    let mut growth = vec![Growth::default(); len as usize];
    if growth.is_empty() {
        return growth;
    }
    let bytes: HashMap<u64, u64> = tape.tensors.iter().map(|t| (t.id, t.bytes)).collect();
    let size = |id: &u64| bytes.get(id).copied().unwrap_or(0);
    // The stepping thread's position each tape op falls at (or after, for other threads').
    let mut at = Vec::with_capacity(tape.ops.len());
    let mut current = 0usize;
    for (op, position) in tape.ops.iter().zip(positions_of(tape)) {
        if let Some(p) = position {
            current = p as usize;
        }
        at.push(current);
        let new: u64 = op
            .outputs
            .iter()
            .filter(|id| !op.inputs.contains(id))
            .map(size)
            .sum();
        growth[current].allocated += new;
    }
    for drop in &tape.drops {
        // `after_ops` ops ran before the drop: it frees after op `after_ops - 1`.
        if let Some(&p) = (drop.after_ops as usize)
            .checked_sub(1)
            .and_then(|i| at.get(i))
        {
            growth[p].freed += size(&drop.id);
        }
    }
    growth
}

impl UsePlan {
    /// The plan of `tape`. With `previous`, the tape of the step just before it running the same
    /// number of ops, the plan also learns which tensors one step hands to the next (updated
    /// parameters, optimizer state).
    pub fn from_tape(tape: &StepTape, previous: Option<&StepTape>) -> Self {
        let (len, by_id) = keys_and_uses(tape);
        let mut carried = FastMap::default();
        // Positions only line up between recordings of the same program (Adam's first step, for
        // one, has fewer ops than the ones after it).
        if let Some(previous) = previous.filter(|p| p.step + 1 == tape.step)
            && let (previous_len, before) = keys_and_uses(previous)
            && previous_len == len
        {
            for (id, (key, _)) in &by_id {
                if let PlanKey::Input { .. } = key
                    && let Some((from @ PlanKey::Produced { .. }, _)) = before.get(id)
                {
                    carried.insert(*from, *key);
                }
            }
        }
        let recorded_peak = tape.tiers.iter().map(|s| s.device).max().unwrap_or(0);
        let mut plan = Self {
            len,
            uses: by_id.into_values().collect(),
            carried,
            recorded_peak,
            growth: growth_of(tape, len),
            max_headroom: 0,
            peaks_ahead: Vec::new(),
            op_bytes: op_bytes_of(tape, len),
            resolved: FastMap::default(),
            arena: Vec::new(),
        };
        plan.resolve();
        // Headroom only grows with the lookahead, so the longest one bounds every other.
        plan.max_headroom = (0..len)
            .map(|now| plan.headroom(now, MAX_HEADROOM_LOOKAHEAD))
            .max()
            .unwrap_or(0);
        plan.peaks_ahead = peaks_ahead(&plan.growth);
        plan
    }

    /// The most room the ops of one whole step from position `now` on (wrapping into the next
    /// step) need at any moment, as [`headroom`](Self::headroom) counts it with no limit on the
    /// lookahead, and how many ops after `now` they need it. Unlike `headroom`, read once per
    /// position from a table the plan builds, so it costs an op nothing to ask.
    pub fn peak_ahead(&self, now: u32) -> PeakAhead {
        match self.peaks_ahead.len() {
            0 => PeakAhead::default(),
            len => self.peaks_ahead[now as usize % len],
        }
    }

    /// The most room the plan ever asks to keep free ([`headroom`](Self::headroom) at its
    /// largest): a device this far under its budget needs no settling at any position.
    pub fn max_headroom(&self) -> u64 {
        self.max_headroom
    }

    /// The most bytes the next `lookahead` ops (from position `now`, wrapping into the next
    /// step) add to the live bytes at any moment: each op's new outputs, less what earlier ones
    /// in that stretch freed. Keeping this much free is enough for them to run without evicting,
    /// as far as the recorded step tells; restores of spilled inputs come on top (prefetch
    /// counts them itself).
    pub fn headroom(&self, now: u32, lookahead: u32) -> u64 {
        // Runs after every op: walks the curve without collecting it.
        self.headroom_steps(now, lookahead).last().unwrap_or(0)
    }

    /// [`headroom`](Self::headroom) for every lookahead from 1 to `lookahead` (at least 1, at
    /// most 64): element `k` is the room the ops up to `now + k` need.
    pub fn headroom_curve(&self, now: u32, lookahead: u32) -> Vec<u64> {
        self.headroom_steps(now, lookahead).collect()
    }

    /// [`headroom_curve`](Self::headroom_curve) as it is walked, without collecting it.
    pub fn headroom_steps(&self, now: u32, lookahead: u32) -> impl Iterator<Item = u64> + '_ {
        let n = lookahead.clamp(1, MAX_HEADROOM_LOOKAHEAD) as usize;
        let len = self.growth.len();
        let (mut level, mut need) = (0i64, 0i64);
        // Wrapped by hand, not by a division per element: this runs after every op.
        let mut at = if len == 0 { 0 } else { now as usize % len };
        (0..n).map(move |_| {
            if len == 0 {
                return 0;
            }
            let g = self.growth[at];
            at += 1;
            if at == len {
                at = 0;
            }
            need = need.max(level + g.allocated as i64);
            level += g.allocated as i64 - g.freed as i64;
            need.max(0) as u64
        })
    }

    /// Ops per step (of the stepping thread).
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Whether the plan saw no op.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most device bytes the recorded step held.
    pub fn recorded_peak(&self) -> u64 {
        self.recorded_peak
    }

    /// Whether `key` names the step's state: a tensor from before the step (a parameter, an
    /// optimizer's state, the batch) or one the step hands to the next (their updates). What a
    /// behaviour that keeps the state on the device moves last.
    pub fn is_state(&self, key: PlanKey) -> bool {
        matches!(key, PlanKey::Input { .. }) || self.carried.contains_key(&key)
    }

    /// What the tensors a step hands to the next are called there.
    #[cfg(test)]
    pub(crate) fn carried(&self) -> &FastMap<PlanKey, PlanKey> {
        &self.carried
    }

    /// Keeps `older`'s hand-over map when this plan could not learn one (its step did not
    /// follow a recorded step) and both describe the same number of ops.
    pub fn inherit_carried(&mut self, older: &UsePlan) {
        if self.carried.is_empty() && self.len == older.len {
            self.carried = older.carried.clone();
            self.resolve();
        }
    }

    /// Fills `resolved` from `uses` and `carried` (every key either names).
    fn resolve(&mut self) {
        let mut arena = Vec::new();
        let mut push = |uses: &[u32]| {
            let start = arena.len() as u32;
            arena.extend_from_slice(uses);
            (start, arena.len() as u32)
        };
        let keys: Vec<PlanKey> = self
            .uses
            .keys()
            .chain(self.carried.keys())
            .copied()
            .collect();
        let mut resolved = FastMap::default();
        for key in keys {
            if resolved.contains_key(&key) {
                continue;
            }
            let this_step = push(self.uses(key));
            let next_step = push(self.next_step_uses(key));
            resolved.insert(
                key,
                ResolvedUses {
                    this_step,
                    next_step,
                },
            );
        }
        self.resolved = resolved;
        self.arena = arena;
    }

    /// A key's reads in its own step and in the next (both empty for a key the plan does not
    /// know).
    fn resolved_uses(&self, key: PlanKey) -> (&[u32], &[u32]) {
        match self.resolved.get(&key) {
            Some(r) => (
                &self.arena[r.this_step.0 as usize..r.this_step.1 as usize],
                &self.arena[r.next_step.0 as usize..r.next_step.1 as usize],
            ),
            None => (&[], &[]),
        }
    }

    /// The bytes the op at `position` needs on the device by itself (its distinct inputs and
    /// outputs), as recorded; 0 past the step.
    pub fn op_bytes(&self, position: u32) -> u64 {
        self.op_bytes.get(position as usize).copied().unwrap_or(0)
    }

    /// The positions where `key` is read in a step.
    pub fn uses(&self, key: PlanKey) -> &[u32] {
        self.uses.get(&key).map_or(&[], Vec::as_slice)
    }

    /// The key's reads in the step after the one it was given in.
    fn next_step_uses(&self, key: PlanKey) -> &[u32] {
        match key {
            PlanKey::Input { .. } => self.uses(key),
            PlanKey::Produced { .. } => self.carried.get(&key).map_or(&[], |k| self.uses(*k)),
        }
    }

    /// How far the next use of the tensor keyed `at` is from position `now` of step `step`.
    pub fn next_use(&self, at: KeyAt, step: u64, now: u32) -> NextUse {
        // Uses are sorted: the first at or after `now` is found by bisection.
        let first_from = |uses: &[u32]| {
            let at = uses.partition_point(|&u| u < now);
            uses.get(at).map(|u| u - now)
        };
        if at.step == step {
            let (this_step, next_step) = self.resolved_uses(at.key);
            if let Some(d) = first_from(this_step) {
                return NextUse::In(d);
            }
            return match next_step.first() {
                Some(&first) => NextUse::In(self.len.saturating_sub(now) + first),
                None => NextUse::Never,
            };
        }
        if at.step + 1 == step {
            // Keyed last step and not read yet in this one (a read would have keyed it anew).
            return match first_from(self.resolved_uses(at.key).1) {
                Some(d) => NextUse::In(d),
                None => NextUse::Unknown,
            };
        }
        NextUse::Unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tape::{OpRecord, Producer, TensorRecord};

    fn op(name: &str, inputs: &[u64], outputs: &[u64], thread: u64) -> OpRecord {
        OpRecord {
            name: name.into(),
            inputs: inputs.to_vec(),
            outputs: outputs.to_vec(),
            start_ns: 0,
            duration_ns: 1,
            thread,
        }
    }

    fn tape(step: u64, ops: Vec<OpRecord>) -> StepTape {
        let mut tensors = Vec::new();
        for (i, o) in ops.iter().enumerate() {
            for (slot, id) in o.outputs.iter().enumerate() {
                tensors.push(TensorRecord {
                    id: *id,
                    bytes: 4,
                    dtype: "F32".into(),
                    shape: vec![1],
                    role: crate::TensorRole::Other,
                    producer: Some(Producer {
                        op: i as u32,
                        output: slot as u8,
                    }),
                });
            }
        }
        StepTape {
            step,
            ops,
            tensors,
            ..Default::default()
        }
    }

    /// w (from before) -> a = f(w, x); b = g(a); w' = h(w, b): w' is carried to the next step
    /// where it is read as w.
    fn two_steps() -> (StepTape, StepTape) {
        let first = tape(
            3,
            vec![
                op("x", &[], &[10], 1),
                op("f", &[1, 10], &[11], 1),
                op("metric", &[11], &[99], 2),
                op("g", &[11], &[12], 1),
                op("h", &[1, 12], &[13], 1),
            ],
        );
        let second = tape(
            4,
            vec![
                op("x", &[], &[20], 1),
                op("f", &[13, 20], &[21], 1),
                op("g", &[21], &[22], 1),
                op("h", &[13, 22], &[23], 1),
            ],
        );
        (first, second)
    }

    #[test]
    fn positions_skip_other_threads_and_keys_follow_them() {
        let (first, _) = two_steps();
        let plan = UsePlan::from_tape(&first, None);
        assert_eq!(plan.len(), 4);
        let w = PlanKey::Input { op: 1, slot: 0 };
        assert_eq!(plan.uses(w), &[1, 3]);
        let a = PlanKey::Produced { op: 1, slot: 0 };
        assert_eq!(
            plan.uses(a),
            &[2],
            "the metric thread's read is not a position"
        );
        assert!(plan.carried().is_empty());
    }

    #[test]
    fn next_use_within_the_step_across_it_and_never() {
        let (first, second) = two_steps();
        let plan = UsePlan::from_tape(&second, Some(&first));
        let produced_w = PlanKey::Produced { op: 3, slot: 0 };
        let input_w = PlanKey::Input { op: 1, slot: 0 };
        assert_eq!(plan.carried().get(&produced_w), Some(&input_w));

        let w = KeyAt {
            step: 7,
            key: input_w,
        };
        assert_eq!(plan.next_use(w, 7, 2), NextUse::In(1));
        // After its last read this step, its next read is op 1 of the next step: 4 - 3 + 1.
        assert_eq!(plan.next_use(w, 7, 4), NextUse::In(1));
        // The updated weight, made at op 3, is read at op 1 of the next step...
        let w2 = KeyAt {
            step: 7,
            key: produced_w,
        };
        assert_eq!(plan.next_use(w2, 7, 4), NextUse::In(1));
        // ...and, keyed last step, from the start of this one.
        assert_eq!(plan.next_use(w2, 8, 0), NextUse::In(1));
        // The last op's other output is never read.
        let b = KeyAt {
            step: 7,
            key: PlanKey::Produced { op: 2, slot: 0 },
        };
        assert_eq!(plan.next_use(b, 7, 3), NextUse::In(0));
        assert_eq!(plan.next_use(b, 7, 4), NextUse::Never);
        // Older keys are unknown.
        assert_eq!(plan.next_use(w, 9, 0), NextUse::Unknown);
    }

    /// Wherever a memo answers, it answers what the plan does; it answers at every later
    /// position of its step up to the use it found, and never for another plan, step or key.
    #[test]
    fn a_next_use_memo_agrees_with_the_plan_wherever_it_answers() {
        let (first, second) = two_steps();
        let plan = UsePlan::from_tape(&second, Some(&first));
        let keys = [
            PlanKey::Input { op: 1, slot: 0 },
            PlanKey::Produced { op: 3, slot: 0 },
            PlanKey::Produced { op: 2, slot: 0 },
            PlanKey::Produced { op: 1, slot: 0 },
        ];
        let mut answered = 0;
        for key in keys {
            for keyed in [7, 8] {
                let key = KeyAt { step: keyed, key };
                for asked in 0..=plan.len() {
                    let memo = NextUseMemo {
                        plan: 5,
                        step: 8,
                        now: asked,
                        key,
                        next: plan.next_use(key, 8, asked),
                    };
                    for now in 0..=plan.len() {
                        let truth = plan.next_use(key, 8, now);
                        match memo.at(5, key, 8, now) {
                            Some(next) => {
                                assert_eq!(next, truth, "{key:?} asked at {asked}, now {now}");
                                answered += 1;
                            }
                            None => assert!(
                                now < asked
                                    || matches!(memo.next, NextUse::In(d) if now - asked > d),
                                "{key:?} asked at {asked} could answer at {now}"
                            ),
                        }
                    }
                    assert_eq!(memo.at(6, key, 8, asked), None, "another plan");
                    assert_eq!(memo.at(5, key, 9, asked), None, "another step");
                    let other = KeyAt { step: 9, ..key };
                    assert_eq!(memo.at(5, other, 8, asked), None, "another key");
                }
            }
        }
        assert!(answered > 50, "the memo answered {answered} times");
    }

    #[test]
    fn headroom_is_the_highest_growth_ahead() {
        // Each op makes a 4-byte output; drops free bytes between ops.
        let mut first = two_steps().0;
        // 4 positions (x, f, g, h); 10 (x's output) drops after g (tape ops 0..=3 ran).
        first.drops.push(crate::tape::DropRecord {
            id: 10,
            after_ops: 4,
        });
        let plan = UsePlan::from_tape(&first, None);
        // From position 0: x +4, f +4 (the metric's +4 folds into f) = 12 by the end of f.
        assert_eq!(plan.headroom(0, 2), 12);
        // From g: g +4, then frees 4, h +4: never more than 4 ahead of now.
        assert_eq!(plan.headroom(2, 2), 4);
        // Wrapping into the next step: h +4, x +4.
        assert_eq!(plan.headroom(3, 2), 8);
        // At least one op is looked at.
        assert_eq!(plan.headroom(1, 0), 8);
        // g adds 4 more before x's output is freed after it.
        assert_eq!(plan.headroom_curve(0, 3), vec![4, 12, 16]);
        // A whole step ahead, from the table: 16 at g, reached first there (h ties it).
        assert_eq!(plan.peak_ahead(0), PeakAhead { room: 16, after: 2 });
        assert_eq!(plan.peak_ahead(4), plan.peak_ahead(0), "positions wrap");
        for now in 0..plan.len() {
            let PeakAhead { room, after } = plan.peak_ahead(now);
            assert_eq!(room, plan.headroom(now, plan.len()), "at {now}");
            assert_eq!(
                plan.headroom(now, after + 1),
                room,
                "reached {after} ops on"
            );
            if after > 0 {
                assert!(plan.headroom(now, after) < room, "first reached there");
            }
        }
    }

    #[test]
    fn the_hand_over_map_needs_consecutive_steps_and_can_be_inherited() {
        let (first, mut second) = two_steps();
        second.step = 9;
        let mut plan = UsePlan::from_tape(&second, Some(&first));
        assert!(plan.carried().is_empty());
        // The updated weight, made at op 3: without the map its next read is unknown to the plan.
        let w2 = KeyAt {
            step: 9,
            key: PlanKey::Produced { op: 3, slot: 0 },
        };
        assert_eq!(plan.next_use(w2, 9, 4), NextUse::Never);
        second.step = 4;
        let learned = UsePlan::from_tape(&second, Some(&first));
        plan.inherit_carried(&learned);
        assert_eq!(plan.carried(), learned.carried());
        assert_eq!(
            plan.next_use(w2, 9, 4),
            NextUse::In(1),
            "an inherited map answers next uses at once"
        );
        // A previous step of another length (another program) teaches nothing.
        let mut shorter = first.clone();
        shorter.ops.pop();
        assert!(
            UsePlan::from_tape(&second, Some(&shorter))
                .carried()
                .is_empty()
        );
    }
}
