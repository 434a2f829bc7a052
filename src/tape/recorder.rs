//! The recorder: appends every op of a device to the current step's tape.
//!
//! The hot path writes into flat buffers that are cleared, not freed, at each step boundary, so
//! after the first step an op records without allocating (unless it brings a tensor of a higher
//! rank than any before). At a boundary the buffers become a [`StepTape`], kept for analysis
//! and export; only the last few steps are kept.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use crate::fast_hash::{FastHasher, mix};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

use smallvec::SmallVec;

use super::model::{
    DropRecord, OpRecord, Producer, StepTape, TAPE_SCHEMA_VERSION, TensorRecord, TierSample,
};
use super::period::PeriodDetector;
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
    /// Resident bytes per tier (device, host, disk) when the op finished.
    resident: [u64; 3],
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
    tensors: HashMap<TensorId, RawTensor, BuildHasherDefault<FastHasher>>,
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
            tiers: self
                .ops
                .iter()
                .map(|op| TierSample {
                    t_ns: op.start_ns + op.duration_ns,
                    device: op.resident[0],
                    host: op.resident[1],
                    disk: op.resident[2],
                })
                .collect(),
        }
    }
}

/// Whether the current step is recorded in full or only checked against the last recording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Every op goes into the buffers.
    Record,
    /// Steps repeat: each op's signature is only compared with the recorded step's.
    Verify,
}

struct State {
    buffers: Buffers,
    step: u64,
    step_start: Instant,
    /// Nanoseconds the recorder itself worked in this step (appending ops and drops): the
    /// tape's clock stops meanwhile, so that its times are the program's, not the recorder's.
    recorder_ns: u64,
    /// Whether the current step was opened by a marker.
    marked: bool,
    finished: VecDeque<Arc<StepTape>>,
    mode: Mode,
    /// Signatures (name, output shapes and dtypes) of this step's ops so far.
    signatures: Vec<u64>,
    /// Signatures of the last recorded step.
    expected: Vec<u64>,
    /// Consecutive recorded steps with the same signatures.
    stable: u32,
    /// First op of this step whose signature differed from `expected` (in Verify mode).
    diverged_at: Option<u32>,
    steps_since_recorded: u64,
    resample_every: u64,
    divergences: u64,
    /// Whether step markers were ever used; until then steps are found automatically.
    markers_used: bool,
    /// Finds the period of an unmarked op stream.
    detector: Option<PeriodDetector>,
    /// Period detection is paused: a step of the confirmed period was verified in full, so
    /// verification itself watches the stream, and the detector only remembers it
    /// ([`PeriodDetector::observe`]) until a divergence resumes it. Resumed with that memory,
    /// it finds a longer real step at once when the paused period was a repetition inside it.
    detection_paused: bool,
    /// How many times detection resumed after a divergence.
    detection_resumed: u64,
    /// An unmarked stream ran three times the longest period the detector looks for without
    /// finding one, so its buffers were dropped, or its confirmed period broke: until a period
    /// or a marker comes, only signatures are collected. (Ops before a confirmed period are no
    /// step, so recording them in full, about 2 us an op, only fed buffers that are dropped; a
    /// marker that ends such a stretch closes a step that is counted, not kept. A shorter
    /// stretch before the first period is recorded in full, so that one ended by the first
    /// marker, a program's set-up, is kept as a step.)
    long_search: bool,
    /// A period the detector reported, and for how many ops in a row it has held.
    candidate: Option<(usize, usize)>,
    /// The confirmed period of an unmarked stream: a step is cut every this many ops.
    auto_period: Option<usize>,
    /// The thread whose ops define the steps: the one calling `step_begin`, or else the first
    /// that recorded. Ops of other threads (metric or data-loading workers) are recorded but
    /// their nondeterministic interleaving must not break verification or period detection.
    main_thread: Option<u64>,
    /// The stepping thread's liveness token (see [`thread_alive`]), so that ops of another
    /// thread can tell when it has exited: a loop that ended with its thread can no longer
    /// step, and the next thread to run an op takes its place (a new training run on a new
    /// thread would otherwise never have its steps found). `None` when the stepping thread was
    /// set while tearing down.
    main_alive: Option<Weak<()>>,
    /// Whether the stepping thread has run an op since it became the stepping thread.
    stepping_thread_ran_ops: bool,
    /// Ops other threads ran, by thread, in an unmarked stream, since the stepping thread had
    /// run `takeover_from` ops (see [`STEPPING_TAKEOVER_OPS`]).
    takeover: SmallVec<[(u64, u32); TAKEOVER_CANDIDATES]>,
    takeover_from: u64,
    /// Ops the stepping thread ran under the lock (recorded or verified, not counted).
    stepping_ops: u64,
    /// Ops of the stepping thread that matched the recorded step since the last divergence
    /// (or the last period confirmed): how long an unmarked stream's period has held (see
    /// [`COUNT_AFTER_VERIFIED_OPS`]).
    verified_ops: u64,
    /// Ops taken into steps as counted (see `absorb_counted`), for [`TapeCounters`].
    counted_ops: u64,
    /// Steps recorded in full so far.
    step_tapes: u64,
    /// Whether an op of this step went in without its inputs (see
    /// [`Recorder::record_verified_op`]): such a step is not kept as a tape.
    incomplete: bool,
}

/// What the recorder has seen, for stats and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TapeCounters {
    /// Steps closed (recorded or verified).
    pub steps: u64,
    /// Steps whose op sequence differed from the one before; each was recorded afresh.
    pub divergences: u64,
    /// Whether the current step is only being verified against the recorded one.
    pub verifying: bool,
    /// The period (in ops) found in an unmarked op stream, when steps are cut automatically.
    pub auto_period: Option<usize>,
    /// Ops of the stepping thread counted instead of verified (under a budget while memory is
    /// ample: see [`Recorder::count_op`]), so far.
    pub counted_ops: u64,
}

/// How many of an unmarked stream's ops must have matched the recorded step, since its period
/// was confirmed or last broke, before its ops may be counted instead of verified (see
/// [`Recorder::count_op`]). A counted stream is cut every period ops and only one op in
/// [`CHECK_ONE_IN`] is checked, at a place that need not fall on the real step's other ops, so
/// a period confirmed on a repetition inside the real step (identical layers, the optimizer's
/// update of same-shaped parameters) must first have been verified past any such run: the real
/// step's other ops break it within one real step. Runs of identical layers or updates in the
/// models measured here are at most a few thousand ops (the GPT-125M's whole step is 5,364).
pub const COUNT_AFTER_VERIFIED_OPS: u64 = 1 << 14;

/// While an unmarked stream's ops are counted, one in this many is verified all the same. Its
/// steps are cut by count alone, so a changed program (an evaluation loop, another model)
/// would otherwise go unseen until memory binds or a step is next recorded in full: checked,
/// it is a divergence within this many ops, at about a sixtieth of verifying every op. Prime,
/// so that the checked ops move through a step's positions from one step to the next. Marked
/// steps need none: each marker checks the step's number of ops.
pub const CHECK_ONE_IN: u32 = 61;

/// Ops another thread runs, while the stepping thread of an unmarked stream runs at most
/// [`STEPPING_TAKEOVER_OPS_BESIDE`], before it takes that thread's place. The first thread to
/// run an op steps, and it need not be the trainer: a program may set up on one thread (make
/// its model, load its weights) and train on another while the first only waits, or a data
/// loader's worker may make the first batch before the trainer's first op. Such a thread is
/// alive, so the trainer's ops would never define the steps. Small beside a training run: 8
/// steps of the tiny Transformer (979 ops), 22 of the small CNN (369), 1.5 of the GPT-125M
/// (5,364) go by before the trainer's steps are looked for.
pub const STEPPING_TAKEOVER_OPS: u32 = 1 << 13;

/// The stepping thread's ops that still let another thread take its place (see
/// [`STEPPING_TAKEOVER_OPS`]): a sixteenth, so that a data loader that became the stepping
/// thread, and runs a few ops a batch (one tensor made per sample, one stack), loses its place
/// to the trainer, and a trainer keeps its place unless another thread runs sixteen times its
/// ops.
pub const STEPPING_TAKEOVER_OPS_BESIDE: u32 = STEPPING_TAKEOVER_OPS / 16;

/// The most threads whose ops are counted toward a takeover at once (see
/// [`STEPPING_TAKEOVER_OPS`]); a thread beyond them waits for a place.
const TAKEOVER_CANDIDATES: usize = 4;

/// The default of [`Recorder::set_resample_every`]: a repeating step is recorded again every
/// this many steps (the design brief's figure).
pub const DEFAULT_RESAMPLE_STEPS: u64 = 100;

/// An op's signature: its name and its outputs' dtypes and shapes. Two steps of the same
/// program have the same signature sequence; a dynamic graph or a new shape breaks it. Names
/// and dtype names are `&'static str`s, so their addresses identify them within the process.
/// Built a few words at a time as the op's outputs are made (the hot path hashes with
/// [`mix`], FxHash's step, where SipHash's setup would cost more than the work).
#[derive(Clone, Copy, Debug)]
pub(crate) struct OpSignature(u64);

impl OpSignature {
    pub(crate) fn new(name: &'static str) -> Self {
        Self(mix(0, name.as_ptr() as u64 ^ (name.len() as u64) << 48))
    }

    /// Adds an output of dtype `dtype` (a dtype's static name) and shape `shape`.
    pub(crate) fn output(&mut self, dtype: &'static str, shape: &[usize]) {
        self.0 = mix(self.0, dtype.as_ptr() as u64);
        for &d in shape {
            self.0 = mix(self.0, d as u64);
        }
        self.0 = mix(self.0, u64::MAX);
    }

    fn output_view(&mut self, t: &TensorView<'_>) {
        self.output(t.dtype, t.shape);
    }

    fn finish(self) -> u64 {
        self.0
    }
}

impl State {
    /// Makes `thread` (the calling thread) the one whose ops define the steps.
    fn set_stepping_thread(&mut self, thread: u64) {
        if self.main_thread != Some(thread) {
            self.stepping_thread_ran_ops = false;
        }
        self.main_thread = Some(thread);
        self.main_alive = thread_alive();
        self.takeover.clear();
    }

    /// Counts an op of `thread`, not the stepping thread, toward taking its place. Returns
    /// whether `thread` takes it: in an unmarked stream, once it ran [`STEPPING_TAKEOVER_OPS`]
    /// while the stepping thread ran at most [`STEPPING_TAKEOVER_OPS_BESIDE`]. (Marked steps
    /// are the marking thread's, and a stepping thread whose ops are counted has repeated its
    /// confirmed period for thousands of ops: it is the trainer.)
    fn takes_over(&mut self, thread: u64) -> bool {
        if self.markers_used || self.may_count_ops() {
            return false;
        }
        if !self.takeover.is_empty()
            && self.stepping_ops - self.takeover_from > u64::from(STEPPING_TAKEOVER_OPS_BESIDE)
        {
            // The stepping thread is running: the count starts again.
            self.takeover.clear();
        }
        if self.takeover.is_empty() {
            self.takeover_from = self.stepping_ops;
        }
        let ops = match self.takeover.iter().position(|&(t, _)| t == thread) {
            Some(at) => {
                self.takeover[at].1 += 1;
                self.takeover[at].1
            }
            None if self.takeover.len() < TAKEOVER_CANDIDATES => {
                self.takeover.push((thread, 1));
                1
            }
            None => 0,
        };
        ops >= STEPPING_TAKEOVER_OPS
    }

    /// Whether the stepping thread is still running.
    fn stepping_thread_alive(&self) -> bool {
        self.main_alive
            .as_ref()
            .is_some_and(|alive| alive.strong_count() > 0)
    }

    /// Starts the step's clock.
    fn start_clock(&mut self) {
        self.step_start = Instant::now();
        self.recorder_ns = 0;
    }

    /// The step's clock at `at`: the time since the step started, less the recorder's own.
    fn clock_at(&self, at: Instant) -> u64 {
        (at.saturating_duration_since(self.step_start).as_nanos() as u64)
            .saturating_sub(self.recorder_ns)
    }

    /// Stops the step's clock for the recorder's own work since `entered`.
    fn pause_clock_since(&mut self, entered: Instant) {
        self.recorder_ns += entered.elapsed().as_nanos() as u64;
    }

    /// Closes the current step (see [`Recorder::boundary`]).
    fn close(&mut self, next_marked: bool) -> Option<Arc<StepTape>> {
        let state = self;
        let mut closed = None;
        // Only other threads' ops (metric or data-loading workers, in a gap between marked
        // steps or in a step opened for a batch that never came) make no step: counting one
        // would depend on when those threads happen to run. A program whose stepping thread
        // runs no op at all (it only marks) keeps every step with ops.
        let others_only = state.signatures.is_empty() && state.stepping_thread_ran_ops;
        match state.mode {
            Mode::Record if others_only => {}
            Mode::Record if !state.buffers.ops.is_empty() && !state.incomplete => {
                let duration = (state.step_start.elapsed().as_nanos() as u64)
                    .saturating_sub(state.recorder_ns);
                let tape = Arc::new(state.buffers.finish(state.step, state.marked, duration));
                state.step += 1;
                if state.finished.len() == KEPT_STEPS {
                    state.finished.pop_front();
                }
                state.finished.push_back(tape.clone());
                state.step_tapes += 1;
                closed = Some(tape);
                let repeats = !state.expected.is_empty() && state.expected == state.signatures;
                if !state.expected.is_empty() && !repeats {
                    state.divergences += 1;
                    state.restart_detection();
                } else if repeats {
                    state.verified_ops += state.signatures.len() as u64;
                }
                state.stable = if repeats { state.stable + 1 } else { 0 };
                std::mem::swap(&mut state.expected, &mut state.signatures);
                state.steps_since_recorded = 0;
                if state.stable >= 1 && state.resample_every > 1 {
                    state.mode = Mode::Verify;
                }
            }
            // A step with an op recorded without its inputs: counted, not kept; the next one
            // is recorded.
            Mode::Record if state.incomplete => state.step += 1,
            Mode::Record => {}
            Mode::Verify if state.signatures.is_empty() => {}
            Mode::Verify => {
                state.step += 1;
                state.steps_since_recorded += 1;
                let diverged =
                    state.diverged_at.is_some() || state.signatures.len() != state.expected.len();
                if diverged {
                    state.divergences += 1;
                    tracing::debug!(
                        target: "burn_spill::tape",
                        step = state.step - 1,
                        at_op = state.diverged_at.unwrap_or(state.expected.len() as u32),
                        "the op sequence diverged from the recorded step; recording the next step"
                    );
                    state.mode = Mode::Record;
                    state.stable = 0;
                    state.expected.clear();
                    state.restart_detection();
                } else {
                    state.verified_ops += state.signatures.len() as u64;
                    state.pause_detection();
                    if state.steps_since_recorded + 1 >= state.resample_every {
                        state.mode = Mode::Record;
                    }
                }
            }
        }
        state.buffers.clear();
        state.signatures.clear();
        state.diverged_at = None;
        state.incomplete = false;
        state.start_clock();
        state.marked = next_marked;
        closed
    }

    /// Takes the stepping thread's ops counted without their signatures (see
    /// [`Recorder::count_op`]) into the step, up to `ops` ops: each as the recorded step's op
    /// at its place, since only their number was checked; ops past the recorded step's end
    /// diverge.
    fn absorb_counted(&mut self, ops: usize) {
        let from = self.signatures.len();
        if ops <= from {
            return;
        }
        if let Some(recorded) = self.expected.get(from..ops.min(self.expected.len())) {
            // A paused detector remembers the stream for after a divergence: the counted ops
            // are taken to be the recorded ones, so it remembers those.
            if self.detection_paused
                && let Some(detector) = &mut self.detector
            {
                for &sig in recorded {
                    detector.observe(sig);
                }
            }
            self.signatures.extend_from_slice(recorded);
        }
        self.counted_ops += (ops - from) as u64;
        if self.signatures.len() < ops {
            self.diverged_at.get_or_insert(self.signatures.len() as u32);
            self.signatures.resize(ops, 0);
        }
        self.stepping_thread_ran_ops = true;
    }

    /// Whether the stepping thread's ops may be counted without their signatures (see
    /// [`Recorder::count_op`]): the step is verified, and steps are marked, or an unmarked
    /// stream's confirmed period has held for [`COUNT_AFTER_VERIFIED_OPS`] (it is then cut
    /// every period ops, counted).
    fn may_count_ops(&self) -> bool {
        let steps_known = self.markers_used
            || (self.auto_period.is_some()
                && self.detection_paused
                && self.verified_ops >= COUNT_AFTER_VERIFIED_OPS);
        self.mode == Mode::Verify && self.main_thread.is_some() && steps_known
    }

    /// The period a counted unmarked stream is cut at (0: none, steps are marked or not
    /// counted).
    fn counted_period(&self) -> u64 {
        match self.auto_period {
            Some(period) if !self.markers_used && self.may_count_ops() => period as u64,
            _ => 0,
        }
    }

    /// Whether an op needs only its signature now (see `Recorder::signatures_only`): the step
    /// is verified, or an unmarked stream has gone so long without a period that its buffers
    /// were dropped (see `long_search`).
    fn needs_signatures_only(&self) -> bool {
        self.mode == Mode::Verify
            || (self.long_search && !self.markers_used && self.auto_period.is_none())
    }

    /// Forgets the period of an unmarked stream, so that it is found again (the program
    /// changed).
    fn restart_detection(&mut self) {
        self.verified_ops = 0;
        if self.detection_paused {
            self.detection_paused = false;
            self.detection_resumed += 1;
            if let Some(detector) = &mut self.detector {
                detector.resume();
            }
        }
        if !self.markers_used && self.auto_period.is_some() {
            self.auto_period = None;
            self.candidate = None;
            // The stream is unmarked, and the ops up to the next confirmed period are no step:
            // only their signatures are collected (see `long_search`), as after a long search.
            self.long_search = true;
        }
    }

    /// After a verified step of an unmarked stream's confirmed period: the detector's work per
    /// op (a tenth of a small model's step) buys nothing while each op is compared with the
    /// recorded step anyway, so it stops until a divergence.
    fn pause_detection(&mut self) {
        if !self.markers_used && self.auto_period.is_some() {
            self.detection_paused = true;
            self.candidate = None;
        }
    }

    /// Cuts unmarked streams into steps. Every op's signature goes to the period detector; a
    /// reported period that held for a whole period is confirmed, and from then on a step is cut
    /// every `period` ops (the ops before the confirmation are not a step). The detector keeps
    /// running: the whole training step is often confirmed only after shorter repetitions inside
    /// it (identical layers, the optimizer's per-parameter updates), so a longer confirmed
    /// period replaces a shorter one. After a divergence any confirmed period is taken. Once a
    /// step of the confirmed period verifies, detection pauses (see `pause_detection`).
    fn auto_step(&mut self, sig: u64) {
        if self.markers_used {
            return;
        }
        if self.detection_paused {
            if let Some(detector) = &mut self.detector {
                detector.observe(sig);
            }
            if let Some(period) = self.auto_period
                && self.signatures.len() >= period
            {
                self.close(false);
            }
            return;
        }
        let detector = self.detector.get_or_insert_with(PeriodDetector::default);
        match detector.push(sig) {
            Some(period) => {
                let held = match self.candidate {
                    Some((p, held)) if p == period => held + 1,
                    _ => 1,
                };
                self.candidate = Some((period, held));
                if held >= period && period > self.auto_period.unwrap_or(0) {
                    self.auto_period = Some(period);
                    self.long_search = false;
                    self.verified_ops = 0;
                    // Not a step: whatever ran before, up to the confirmation.
                    self.buffers.clear();
                    self.incomplete = false;
                    self.signatures.clear();
                    self.expected.clear();
                    self.stable = 0;
                    self.mode = Mode::Record;
                    self.start_clock();
                    return;
                }
            }
            None => self.candidate = None,
        }
        match self.auto_period {
            Some(period) if self.signatures.len() >= period => {
                self.close(false);
            }
            Some(_) => {}
            None if self.signatures.len() > 3 * PeriodDetector::DEFAULT_MAX => {
                // No period yet and a long stream: keep detecting, but not the buffers.
                self.buffers.clear();
                self.signatures.clear();
                self.incomplete = false;
                self.long_search = true;
            }
            None => {}
        }
    }
}

/// The per-device recorder.
pub struct Recorder {
    enabled: AtomicBool,
    state: Mutex<State>,
    /// (step << 24) | ops of the stepping thread so far in it: where the running op stands.
    position: AtomicU64,
    /// Recorded steps finished so far and divergences seen, for the engine's plan.
    finished_count: AtomicU64,
    divergence_count: AtomicU64,
    /// Whether an op starting now needs only its signature, as of the last op or boundary: the
    /// step is verified, or an unmarked stream has searched so long for its period that its
    /// recording was dropped (see `State::long_search`).
    signatures_only: AtomicBool,
    /// Whether the stepping thread's ops may be counted instead of verified, as of the last op
    /// or boundary (see [`Recorder::count_op`]).
    may_count_ops: AtomicBool,
    /// Where a counted unmarked stream is cut into steps: its period in ops (0 when steps are
    /// marked or ops are not counted), as of the last op or boundary.
    counted_period: AtomicU64,
    /// The period in ops an unmarked stream is cut into steps at, once confirmed (0: none, or
    /// steps are marked), as of the last op or boundary (see [`Recorder::found_period`]).
    found_period: AtomicU64,
    /// Counted ops of an unmarked stream since one was checked (see [`CHECK_ONE_IN`]); only
    /// the stepping thread reads and writes it.
    counted_since_check: AtomicU32,
    /// The stepping thread's number (0 before one is known).
    main_thread: AtomicU64,
}

/// Ops per step the packed position can count; longer steps saturate (their tail shares one
/// position, which only blurs the plan there).
const POSITION_BITS: u32 = 24;

impl Default for Recorder {
    fn default() -> Self {
        Self {
            enabled: AtomicBool::new(false),
            state: Mutex::new(State {
                buffers: Buffers::default(),
                step: 0,
                step_start: Instant::now(),
                recorder_ns: 0,
                marked: false,
                finished: VecDeque::new(),
                mode: Mode::Record,
                signatures: Vec::new(),
                expected: Vec::new(),
                stable: 0,
                diverged_at: None,
                steps_since_recorded: 0,
                resample_every: DEFAULT_RESAMPLE_STEPS,
                divergences: 0,
                markers_used: false,
                detector: None,
                detection_paused: false,
                detection_resumed: 0,
                long_search: false,
                candidate: None,
                auto_period: None,
                main_thread: None,
                main_alive: None,
                stepping_thread_ran_ops: false,
                takeover: SmallVec::new(),
                takeover_from: 0,
                stepping_ops: 0,
                verified_ops: 0,
                counted_ops: 0,
                step_tapes: 0,
                incomplete: false,
            }),
            position: AtomicU64::new(0),
            finished_count: AtomicU64::new(0),
            divergence_count: AtomicU64::new(0),
            signatures_only: AtomicBool::new(false),
            may_count_ops: AtomicBool::new(false),
            counted_period: AtomicU64::new(0),
            found_period: AtomicU64::new(0),
            counted_since_check: AtomicU32::new(0),
            main_thread: AtomicU64::new(0),
        }
    }
}

thread_local! {
    /// The calling thread's number (0 until it first asks). A constant initialiser: the check
    /// is the caller's own, not a lazily initialised thread-local's (an op asks once or twice).
    static THREAD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

thread_local! {
    /// Lives as long as the calling thread: a recorder holds a weak reference to its stepping
    /// thread's.
    static ALIVE: Arc<()> = Arc::new(());
}

/// A weak reference to the calling thread's liveness token: it can no longer be upgraded once
/// the thread has exited. `None` while the thread's locals are torn down.
fn thread_alive() -> Option<Weak<()>> {
    ALIVE.try_with(Arc::downgrade).ok()
}

/// A small, stable number for the calling thread (never 0).
#[inline]
pub fn thread_number() -> u64 {
    THREAD.with(|number| {
        if number.get() == 0 {
            static NEXT: AtomicU64 = AtomicU64::new(1);
            number.set(NEXT.fetch_add(1, Ordering::Relaxed));
        }
        number.get()
    })
}

impl Recorder {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the step, the position in it and the counters readable without the lock.
    fn publish(&self, state: &State) {
        self.signatures_only
            .store(state.needs_signatures_only(), Ordering::Relaxed);
        self.may_count_ops
            .store(state.may_count_ops(), Ordering::Relaxed);
        self.counted_period
            .store(state.counted_period(), Ordering::Relaxed);
        let found = match state.auto_period {
            Some(period) if !state.markers_used => period as u64,
            _ => 0,
        };
        self.found_period.store(found, Ordering::Relaxed);
        self.main_thread
            .store(state.main_thread.unwrap_or(0), Ordering::Relaxed);
        let ops = (state.signatures.len() as u64).min((1 << POSITION_BITS) - 1);
        self.position
            .store((state.step << POSITION_BITS) | ops, Ordering::Relaxed);
        self.finished_count
            .store(state.step_tapes, Ordering::Relaxed);
        self.divergence_count
            .store(state.divergences, Ordering::Relaxed);
    }

    /// The current step and how many of its ops (of the stepping thread) have run: the position
    /// of the op about to run.
    pub fn position(&self) -> (u64, u32) {
        let packed = self.position.load(Ordering::Relaxed);
        (
            packed >> POSITION_BITS,
            (packed & ((1 << POSITION_BITS) - 1)) as u32,
        )
    }

    /// The period, in ops, at which steps no marker bounds are cut once the detector confirmed
    /// it: the position then counts the ops of such a step as a marked step's, from its first
    /// op. `None` before, and once a marker was seen (markers bound the steps from then on).
    pub fn found_period(&self) -> Option<u64> {
        match self.found_period.load(Ordering::Relaxed) {
            0 => None,
            period => Some(period),
        }
    }

    /// How many steps were recorded in full so far, and how many divergences were seen: when
    /// either changes, a plan built from the tape is out of date.
    pub fn plan_epoch(&self) -> (u64, u64) {
        (
            self.finished_count.load(Ordering::Relaxed),
            self.divergence_count.load(Ordering::Relaxed),
        )
    }

    /// The last two recorded steps, older first (either may be missing).
    pub fn last_two(&self) -> (Option<Arc<StepTape>>, Option<Arc<StepTape>>) {
        let state = self.lock();
        let n = state.finished.len();
        let at = |i: usize| state.finished.get(i).cloned();
        match n {
            0 => (None, None),
            1 => (None, at(0)),
            _ => (at(n - 2), at(n - 1)),
        }
    }

    /// Whether ops are being recorded.
    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Starts or stops recording. Starting opens a fresh (unmarked) step, and forgets whether
    /// steps were marked before and by which thread: until a marker comes, steps are found in
    /// the op stream of the first thread to run an op, or once that thread has exited of the
    /// next one (a marked loop's next `step_begin` marks again at once).
    pub fn set_enabled(&self, enabled: bool) {
        if enabled && !self.is_enabled() {
            let mut state = self.lock();
            // What a stop left half-done is no part of the fresh step.
            state.buffers.clear();
            state.signatures.clear();
            state.diverged_at = None;
            state.incomplete = false;
            state.start_clock();
            state.marked = false;
            state.markers_used = false;
            state.long_search = false;
            state.main_thread = None;
            state.main_alive = None;
            state.stepping_thread_ran_ops = false;
            state.takeover.clear();
            state.verified_ops = 0;
            self.publish(&state);
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
        resident: [u64; 3],
    ) {
        // Only ops that started while the step was recorded in full come here: the clock read
        // is theirs alone.
        let entered = Instant::now();
        let (mut guard, thread, main) = self.lock_for_op();
        let state = &mut *guard;
        if state.mode == Mode::Verify {
            drop(inputs);
            self.verify_op(state, main, name, outputs);
            return;
        }
        let op = RawOp {
            name,
            first_id: 0,
            inputs: 0,
            outputs: 0,
            start_ns: state.clock_at(started),
            duration_ns,
            thread,
            resident,
        };
        self.append_op(state, main, op, inputs, outputs);
        state.pause_clock_since(entered);
    }

    /// Appends one op whose inputs, outputs and time were not collected, because the recorder
    /// needed only signatures when it started ([`signatures_only`](Self::signatures_only)):
    /// verifying, or finding the period, needs only the op's signature, built as its outputs
    /// were made. If it records in full (a long search for a period, or a step boundary came
    /// in between), the op goes in without its tensors and this step is not kept as a tape.
    pub(crate) fn record_verified_op(
        &self,
        name: &'static str,
        signature: OpSignature,
        resident: [u64; 3],
    ) {
        let (mut guard, thread, main) = self.lock_for_op();
        let state = &mut *guard;
        if state.mode == Mode::Verify {
            self.verify_signature(state, main, signature.finish());
            return;
        }
        state.incomplete = true;
        let op = RawOp {
            name,
            first_id: state.buffers.ids.len() as u32,
            inputs: 0,
            outputs: 0,
            start_ns: 0,
            duration_ns: 0,
            thread,
            resident,
        };
        self.push_op(state, main, op, signature.finish());
    }

    /// Whether an op starting now on this thread may be counted instead of verified (see
    /// [`count_op`](Self::count_op)); in an unmarked stream, one op in [`CHECK_ONE_IN`] is not.
    pub(crate) fn may_count_op(&self) -> bool {
        if !(self.may_count_ops.load(Ordering::Relaxed)
            && self.main_thread.load(Ordering::Relaxed) == thread_number())
        {
            return false;
        }
        if self.counted_period.load(Ordering::Relaxed) == 0 {
            return true;
        }
        // An unmarked stream: one op in `CHECK_ONE_IN` is verified. Only the stepping thread
        // gets here, so a load and a store suffice.
        let since = self.counted_since_check.load(Ordering::Relaxed) + 1;
        let check = since >= CHECK_ONE_IN;
        self.counted_since_check
            .store(if check { 0 } else { since }, Ordering::Relaxed);
        !check
    }

    /// Counts one op of the stepping thread without its signature or the recorder's lock, where
    /// no decision reads the plan while the op runs (the device has a budget and memory is
    /// ample): a marked step is then checked against the recorded one by its number of ops
    /// only, and an unmarked stream is cut every period ops with one op in [`CHECK_ONE_IN`]
    /// verified. An op that changed goes unseen until an op is verified again (the first
    /// verified op that differs is the divergence) or the next step recorded in full differs.
    /// Only for an op that [`may_count_op`](Self::may_count_op) allowed as it started, on its
    /// thread. Returns `false` when the op was recorded after all (the recorder left
    /// verification since the op started), by its name.
    pub(crate) fn count_op(&self, name: &'static str) -> bool {
        const OPS: u64 = (1 << POSITION_BITS) - 1;
        // The thread was checked as the op started; the mode may have changed since, so it is
        // read again. Only the stepping thread counts, so the count cannot pass the field
        // between the check and the add.
        if self.may_count_ops.load(Ordering::Relaxed)
            && self.position.load(Ordering::Relaxed) & OPS < OPS
        {
            // The position is the count: a boundary publishes its own, and an op counted across
            // it lands in either step, as its place among the ops says.
            let counted = (self.position.fetch_add(1, Ordering::Relaxed) & OPS) + 1;
            let period = self.counted_period.load(Ordering::Relaxed);
            if period != 0 && counted >= period {
                self.cut_counted_step();
            }
            return true;
        }
        // Its signature was not built: recorded by name, it diverges if it is verified, which
        // only makes the next step recorded.
        self.record_verified_op(name, OpSignature::new(name), [0; 3]);
        false
    }

    /// Cuts a counted unmarked stream's step once its ops reach the period, as a verified op
    /// would have (see `State::auto_step`).
    fn cut_counted_step(&self) {
        let mut state = self.lock();
        self.absorb_counted(&mut state);
        if let Some(period) = state.auto_period
            && !state.markers_used
            && state.signatures.len() >= period
        {
            state.close(false);
        }
        self.publish(&state);
    }

    /// Takes the ops counted since the last verified one into the step (see
    /// [`State::absorb_counted`]).
    fn absorb_counted(&self, state: &mut State) {
        let (step, ops) = self.position();
        if step == state.step && state.mode == Mode::Verify {
            state.absorb_counted(ops as usize);
        }
    }

    /// Whether the recorder needs only op signatures now (it verifies a step, or has searched
    /// long for the period of an unmarked stream): an op starting now needs to collect its outputs only
    /// (see [`record_verified_op`](Self::record_verified_op)), and drops are not recorded.
    pub fn signatures_only(&self) -> bool {
        self.signatures_only.load(Ordering::Relaxed)
    }

    /// The state, the calling thread's number and whether it is the stepping thread (the
    /// first to record one, unless a marker named another; the calling thread takes the place
    /// of one that has exited, or in an unmarked stream of one that ran at most
    /// [`STEPPING_TAKEOVER_OPS_BESIDE`] ops while it ran [`STEPPING_TAKEOVER_OPS`]).
    fn lock_for_op(&self) -> (MutexGuard<'_, State>, u64, bool) {
        let thread = thread_number();
        let mut state = self.lock();
        let stepping = state.main_thread;
        let main = match stepping {
            Some(main) if main == thread => {
                state.stepping_ops += 1;
                true
            }
            // Read only by other threads' ops.
            Some(_) if state.stepping_thread_alive() && !state.takes_over(thread) => false,
            _ => {
                state.set_stepping_thread(thread);
                self.publish(&state);
                true
            }
        };
        (state, thread, main)
    }

    /// Compares one op's signature with the recorded step's (ops of other threads than the
    /// stepping one are left out: their interleaving is not deterministic).
    fn verify_op<'a>(
        &self,
        state: &mut State,
        main: bool,
        name: &'static str,
        outputs: impl ExactSizeIterator<Item = TensorView<'a>>,
    ) {
        let mut sig = OpSignature::new(name);
        for output in outputs {
            sig.output_view(&output);
        }
        self.verify_signature(state, main, sig.finish());
    }

    /// Compares the signature of the stepping thread's next op with the recorded step's.
    fn verify_signature(&self, state: &mut State, main: bool, sig: u64) {
        if !main {
            return;
        }
        self.absorb_counted(state);
        // Only the signature: the step is expected to repeat the recorded one.
        state.stepping_thread_ran_ops = true;
        let at = state.signatures.len();
        if state.diverged_at.is_none() && state.expected.get(at) != Some(&sig) {
            state.diverged_at = Some(at as u32);
        }
        state.signatures.push(sig);
        state.auto_step(sig);
        self.publish(state);
    }

    /// Puts one op with its tensors into the step's buffers; `op` comes with its name, time,
    /// thread and tiers, and its tensor ranges are filled in here.
    fn append_op<'a>(
        &self,
        state: &mut State,
        main: bool,
        mut op: RawOp,
        inputs: impl ExactSizeIterator<Item = TensorView<'a>>,
        outputs: impl ExactSizeIterator<Item = TensorView<'a>>,
    ) {
        let buffers = &mut state.buffers;
        let at = buffers.ops.len() as u32;
        op.first_id = buffers.ids.len() as u32;
        (op.inputs, op.outputs) = (inputs.len() as u16, outputs.len() as u16);
        for input in inputs {
            buffers.note_tensor(&input, None);
            buffers.ids.push(input.id);
        }
        let mut sig = OpSignature::new(op.name);
        for (i, output) in outputs.enumerate() {
            sig.output_view(&output);
            buffers.note_tensor(
                &output,
                Some(Producer {
                    op: at,
                    output: i as u8,
                }),
            );
            buffers.ids.push(output.id);
        }
        self.push_op(state, main, op, sig.finish());
    }

    /// Puts `op`, whose tensors are in the buffers already, with its signature `sig` into the
    /// step.
    fn push_op(&self, state: &mut State, main: bool, op: RawOp, sig: u64) {
        if main {
            state.stepping_thread_ran_ops = true;
            state.signatures.push(sig);
        }
        state.buffers.ops.push(op);
        if main {
            state.auto_step(sig);
        }
        self.publish(state);
    }

    /// Notes that a tensor's last handle dropped (only a step recorded in full keeps drops).
    /// Its few nanoseconds are left on the step's clock: timing them, to take them off, would
    /// cost two clock reads, more than the drop's record.
    pub fn record_drop(&self, id: TensorId) {
        if self.signatures_only() {
            return;
        }
        let mut state = self.lock();
        let after_ops = state.buffers.ops.len() as u32;
        state.buffers.drops.push(DropRecord { id, after_ops });
    }

    /// Sets how often a repeating step is recorded again in full (1 = every step).
    pub fn set_resample_every(&self, steps: u64) {
        self.lock().resample_every = steps.max(1);
    }

    /// Closes the current step (if it did anything) and opens the next. Returns the closed
    /// step's tape when it was recorded in full.
    ///
    /// A recorded step whose signatures match the one before makes the recorder switch to
    /// verifying: the following steps only compare each op's signature with the recording, and
    /// every `resample_every` steps one is recorded again. A verified step that differs (a
    /// dynamic graph, a new shape) is counted as a divergence and the next step is recorded.
    pub fn boundary(&self, next_marked: bool) -> Option<Arc<StepTape>> {
        let mut state = self.lock();
        self.absorb_counted(&mut state);
        if next_marked {
            state.set_stepping_thread(thread_number());
            state.markers_used = true;
            state.long_search = false;
            state.detector = None;
            state.detection_paused = false;
            state.auto_period = None;
            state.verified_ops = 0;
        }
        let closed = state.close(next_marked);
        self.publish(&state);
        closed
    }

    /// Steps, divergences and whether the recorder is only verifying now.
    pub fn counters(&self) -> TapeCounters {
        let state = self.lock();
        TapeCounters {
            steps: state.step,
            divergences: state.divergences,
            verifying: state.mode == Mode::Verify,
            auto_period: state.auto_period,
            counted_ops: state.counted_ops,
        }
    }

    /// The last finished step, if any.
    pub fn last_step(&self) -> Option<Arc<StepTape>> {
        self.lock().finished.back().cloned()
    }

    /// Of the finished steps kept, the one with the most ops (the last of equals): the
    /// training step, where a loop's last marked step holds only the reads of a batch that
    /// never came.
    pub fn fullest_step(&self) -> Option<Arc<StepTape>> {
        let state = self.lock();
        let most = state.finished.iter().map(|t| t.ops.len()).max()?;
        state
            .finished
            .iter()
            .rev()
            .find(|t| t.ops.len() == most)
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One dtype name for all of the tests' tensors: signatures identify dtypes by address.
    static F32: &str = "F32";

    /// The signature of an op `name` with one F32 output of `shape`, as an op scope builds it.
    fn signature(name: &'static str, shape: &[usize]) -> OpSignature {
        let mut sig = OpSignature::new(name);
        sig.output(F32, shape);
        sig
    }

    fn view(id: TensorId, shape: &[usize]) -> TensorView<'_> {
        TensorView {
            id,
            bytes: shape.iter().product::<usize>() as u64 * 4,
            dtype: F32,
            shape,
            role: TensorRole::Other,
        }
    }

    #[test]
    fn an_op_without_its_inputs_keeps_its_step_from_becoming_a_tape() {
        let rec = Recorder::default();
        rec.set_enabled(true);
        rec.set_resample_every(1);
        rec.boundary(true);
        // An op that began while the recorder verified, recorded once it records in full.
        assert!(!rec.signatures_only());
        rec.record_verified_op("float_exp", signature("float_exp", &[2, 3]), [0; 3]);
        assert!(
            rec.boundary(true).is_none(),
            "an incomplete step is not a tape"
        );
        assert_eq!(rec.counters().steps, 1, "but it is counted");
        let t0 = Instant::now();
        rec.record_op(
            "float_exp",
            [view(1, &[2, 3])].into_iter(),
            [view(2, &[2, 3])].into_iter(),
            t0,
            10,
            [0; 3],
        );
        let tape = rec.boundary(true).expect("the next step is recorded");
        assert_eq!(tape.ops[0].inputs, vec![1]);
    }

    /// A recorder that recorded two equal marked steps of `ops` (each an op `name` reading
    /// tensor `id - 1` and making `id`, both [2, 3]), so that it verifies the next ones.
    fn verifying(ops: &[(&'static str, TensorId)]) -> Recorder {
        let rec = Recorder::default();
        rec.set_enabled(true);
        rec.set_resample_every(100);
        let t0 = Instant::now();
        for _ in 0..2 {
            rec.boundary(true);
            for &(name, id) in ops {
                rec.record_op(
                    name,
                    [view(id - 1, &[2, 3])].into_iter(),
                    [view(id, &[2, 3])].into_iter(),
                    t0,
                    10,
                    [0; 3],
                );
            }
        }
        rec.boundary(true);
        rec
    }

    /// A recorder verifying steps of two ops (`float_exp` then `float_log`).
    fn verifying_two_ops() -> Recorder {
        let rec = verifying(&[("float_exp", 2), ("float_log", 3)]);
        assert!(rec.signatures_only() && rec.may_count_op());
        rec
    }

    #[test]
    fn counted_ops_check_a_step_by_their_number_and_place_the_ops_verified_after_them() {
        let rec = verifying_two_ops();
        assert!(rec.count_op("float_exp") && rec.count_op("float_log"));
        assert_eq!(rec.position().1, 2, "the position counts them");
        rec.boundary(true);
        assert_eq!(
            (rec.counters().divergences, rec.counters().verifying),
            (0, true),
            "as many ops as the recorded step: verified"
        );

        // Counted, then verified from the second op on (memory stopped being ample): the
        // verified op is compared with the recorded step's second op.
        assert!(rec.count_op("float_exp"));
        rec.record_verified_op("float_log", signature("float_log", &[2, 3]), [0; 3]);
        assert_eq!(rec.position().1, 2);
        rec.boundary(true);
        assert_eq!(rec.counters().divergences, 0, "it matched at its place");

        assert!(rec.count_op("float_exp"));
        rec.record_verified_op("float_log", signature("float_log", &[5, 3]), [0; 3]);
        rec.boundary(true);
        assert_eq!(
            (rec.counters().divergences, rec.counters().verifying),
            (1, false),
            "a changed op verified after counted ones diverges, and the next step is recorded"
        );
        assert!(
            !rec.may_count_op(),
            "a step recorded in full is not counted"
        );
    }

    #[test]
    fn ops_counted_after_the_recorded_end_diverge() {
        let rec = verifying_two_ops();
        for name in ["float_exp", "float_log", "float_exp"] {
            rec.record_verified_op(name, signature(name, &[2, 3]), [0; 3]);
        }
        assert!(rec.count_op("float_log"));
        rec.boundary(true);
        assert_eq!(rec.counters().divergences, 1);
    }

    #[test]
    fn a_counted_step_of_another_length_diverges() {
        for ops in [1, 3] {
            let rec = verifying_two_ops();
            for _ in 0..ops {
                assert!(rec.count_op("float_exp"));
            }
            rec.boundary(true);
            assert_eq!(rec.counters().divergences, 1, "{ops} ops counted");
        }
    }

    #[test]
    fn only_the_stepping_thread_counts() {
        let rec = verifying_two_ops();
        std::thread::scope(|scope| {
            scope.spawn(|| {
                assert!(!rec.may_count_op(), "another thread's op is verified");
                rec.record_verified_op("float_exp", signature("float_exp", &[9]), [0; 3]);
            });
        });
        assert_eq!(rec.position().1, 0);
        assert!(rec.count_op("float_exp") && rec.count_op("float_log"));
        rec.boundary(true);
        assert_eq!(rec.counters().divergences, 0);
    }

    #[test]
    fn verifying_steps_skip_drops_and_need_only_outputs() {
        let rec = verifying(&[("float_exp", 2)]);
        assert!(
            rec.signatures_only(),
            "two equal recorded steps make it verify"
        );
        rec.record_verified_op("float_exp", signature("float_exp", &[2, 3]), [0; 3]);
        rec.record_drop(2);
        assert!(rec.lock().buffers.drops.is_empty());
        rec.boundary(true);
        let counters = rec.counters();
        assert_eq!(counters.divergences, 0, "the verified step matched");
        assert!(counters.verifying);
        rec.record_verified_op("float_log", signature("float_log", &[2, 3]), [0; 3]);
        rec.boundary(true);
        assert_eq!(rec.counters().divergences, 1, "another op is a divergence");
        assert!(!rec.signatures_only());
    }

    #[test]
    fn a_step_becomes_a_tape_with_producers_and_drops() {
        let rec = Recorder::default();
        rec.set_enabled(true);
        rec.set_resample_every(1);
        let t0 = Instant::now();
        rec.record_op(
            "float_from_data",
            [].into_iter(),
            [view(1, &[2, 3])].into_iter(),
            t0,
            10,
            [0; 3],
        );
        rec.record_op(
            "float_exp",
            [view(1, &[2, 3])].into_iter(),
            [view(2, &[2, 3])].into_iter(),
            t0,
            20,
            [0; 3],
        );
        rec.record_drop(1);
        rec.record_op(
            "float_sum",
            [view(2, &[2, 3])].into_iter(),
            [view(3, &[1])].into_iter(),
            t0,
            5,
            [0; 3],
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
            [0; 3],
        );
        let next = rec.boundary(false).unwrap();
        assert!(next.marked && next.step == 1);
        assert_eq!(
            next.tensors[0].producer, None,
            "a tensor from before the step"
        );
        assert!(rec.boundary(false).is_none(), "an empty step is not a step");
    }

    /// A recorder that is on, recording a step in full every `resample` steps.
    fn recording(resample: u64) -> Recorder {
        let rec = Recorder::default();
        rec.set_enabled(true);
        rec.set_resample_every(resample);
        rec
    }

    /// One `float_exp` op, recorded in full, on the calling thread.
    fn exp_op(rec: &Recorder) {
        rec.record_op(
            "float_exp",
            [view(1, &[2])].into_iter(),
            [view(2, &[2])].into_iter(),
            Instant::now(),
            1,
            [0; 3],
        )
    }

    /// Runs `exp_op` on another thread (a metric or data-loading worker).
    fn exp_op_elsewhere(rec: &Recorder) {
        std::thread::scope(|s| {
            s.spawn(|| exp_op(rec));
        });
    }

    #[test]
    fn a_step_where_only_other_threads_ran_ops_is_no_step() {
        let rec = recording(1);
        rec.boundary(true);
        exp_op(&rec);
        rec.boundary(false);
        // A metric thread's op lands in the gap before the next marker.
        exp_op_elsewhere(&rec);
        rec.boundary(true);
        exp_op(&rec);
        rec.boundary(false);
        // A step opened for a batch that never came, where only the metric thread ran.
        rec.boundary(true);
        exp_op_elsewhere(&rec);
        rec.boundary(false);
        let counters = rec.counters();
        assert_eq!(
            counters.steps, 2,
            "two marked steps and no gap: {counters:?}"
        );
        assert_eq!(counters.divergences, 0, "{counters:?}");
        // The stepping thread's own ops in a gap still make a step.
        exp_op(&rec);
        rec.boundary(true);
        assert_eq!(rec.counters().steps, 3);
    }

    #[test]
    fn a_program_that_only_marks_on_its_thread_keeps_its_steps() {
        let rec = recording(1);
        for _ in 0..2 {
            rec.boundary(true);
            exp_op_elsewhere(&rec);
            rec.boundary(false);
        }
        assert_eq!(rec.counters().steps, 2);
    }

    #[test]
    fn recording_started_again_holds_nothing_of_the_stopped_step() {
        let rec = recording(100);
        for _ in 0..3 {
            rec.boundary(true);
            exp_op(&rec);
        }
        assert!(
            rec.signatures_only(),
            "stopped in the middle of a verified step"
        );
        rec.set_enabled(false);
        rec.set_enabled(true);
        let before = rec.counters();
        rec.boundary(true);
        assert_eq!(
            rec.counters().steps,
            before.steps,
            "the stopped step is not closed"
        );
        assert_eq!(rec.counters().divergences, before.divergences);
    }

    #[test]
    fn recording_started_again_finds_unmarked_steps_on_a_new_thread() {
        let rec = recording(1);
        rec.boundary(true);
        exp_op(&rec);
        rec.boundary(false);
        rec.set_enabled(false);
        rec.set_enabled(true);
        // Another program, unmarked, on another thread: a 5-op step, repeated.
        unmarked_steps_on_a_thread_that_exits(&rec, &FIVE_OP_STEP, 12);
        assert_eq!(rec.counters().auto_period, Some(5), "{:?}", rec.counters());
    }

    /// An unmarked program's step of five distinct ops (its period is 5).
    const FIVE_OP_STEP: [&str; 5] = [
        "float_exp",
        "float_log",
        "float_mul",
        "float_sum",
        "float_neg",
    ];

    /// Runs `names` as one unmarked step, `steps` times over, on a thread that has exited when
    /// this returns (joined: a scope alone may return before the thread's locals are gone).
    fn unmarked_steps_on_a_thread_that_exits(rec: &Recorder, names: &[&'static str], steps: usize) {
        std::thread::scope(|s| {
            let thread = s.spawn(|| {
                let t0 = Instant::now();
                for _ in 0..steps {
                    for &name in names {
                        let v = view(1, &[3]);
                        rec.record_op(name, [v].into_iter(), [v].into_iter(), t0, 1, [0; 3]);
                    }
                }
            });
            thread.join().expect("the thread ran its steps");
        });
    }

    #[test]
    fn the_next_thread_steps_once_the_stepping_thread_has_exited() {
        let rec = recording(1);
        unmarked_steps_on_a_thread_that_exits(&rec, &FIVE_OP_STEP, 12);
        assert_eq!(rec.counters().auto_period, Some(5), "{:?}", rec.counters());
        // Another training run on another thread, the recorder left on: its steps are found,
        // where before the exited thread stayed the stepping one and no later op counted.
        let second = [
            "float_exp",
            "float_tanh",
            "float_add",
            "float_mul",
            "float_sum",
            "float_neg",
            "float_abs",
        ];
        unmarked_steps_on_a_thread_that_exits(&rec, &second, 12);
        assert_eq!(rec.counters().auto_period, Some(7), "{:?}", rec.counters());
        // While a stepping thread runs, another thread's ops still step nothing.
        let steps = rec.counters().steps;
        exp_op(&rec);
        exp_op_elsewhere(&rec);
        for _ in 0..20 {
            exp_op_elsewhere(&rec);
        }
        let counters = rec.counters();
        assert!(
            counters.auto_period != Some(1) && counters.steps <= steps + 1,
            "a live stepping thread kept its place: {counters:?}"
        );
    }

    /// Runs `names` as one unmarked step, `steps` times over, on a trainer thread, with
    /// `loader_ops_per_step` ops of a data-loader thread before each step (the two take turns;
    /// with `loader_first`, the loader also runs the first op of all), while the calling
    /// thread only waits. Returns the trainer's thread number.
    fn unmarked_steps_beside(
        rec: &Recorder,
        names: &[&'static str],
        steps: usize,
        loader_ops_per_step: usize,
        loader_first: bool,
    ) -> u64 {
        std::thread::scope(|s| {
            let (to_loader, loader_turn) = std::sync::mpsc::channel::<bool>();
            let (to_trainer, trainer_turn) = std::sync::mpsc::channel::<()>();
            let loader = s.spawn(move || {
                if loader_first {
                    exp_op(rec);
                    to_trainer.send(()).expect("the trainer waits");
                }
                while loader_turn.recv() == Ok(true) {
                    for _ in 0..loader_ops_per_step {
                        exp_op(rec);
                    }
                    to_trainer.send(()).expect("the trainer waits");
                }
            });
            let trainer = s.spawn(move || {
                if loader_first {
                    trainer_turn.recv().expect("the loader answers");
                }
                let t0 = Instant::now();
                for _ in 0..steps {
                    if loader_ops_per_step > 0 {
                        to_loader.send(true).expect("the loader waits");
                        trainer_turn.recv().expect("the loader answers");
                    }
                    for &name in names {
                        let v = view(1, &[3]);
                        rec.record_op(name, [v].into_iter(), [v].into_iter(), t0, 1, [0; 3]);
                    }
                }
                to_loader.send(false).expect("the loader waits");
                thread_number()
            });
            let trainer = trainer.join().expect("the trainer ran its steps");
            loader.join().expect("the loader ran its batches");
            trainer
        })
    }

    /// Steps enough for a takeover, and a dozen more for the period to be found.
    fn steps_past_a_takeover(ops_a_step: usize) -> usize {
        (STEPPING_TAKEOVER_OPS as usize).div_ceil(ops_a_step) + 12
    }

    #[test]
    fn a_thread_that_runs_ops_while_the_stepping_thread_runs_none_takes_its_place() {
        // Alone, then with three data-loader ops before each five-op step (the trainer runs
        // more of them, and takes over).
        for loader_ops_per_step in [0, 3] {
            let rec = recording(1);
            // The program's set-up runs on this thread, which then only waits for its trainer.
            exp_op(&rec);
            let steps = steps_past_a_takeover(FIVE_OP_STEP.len());
            unmarked_steps_beside(&rec, &FIVE_OP_STEP, steps, loader_ops_per_step, false);
            let counters = rec.counters();
            assert_eq!(
                counters.auto_period,
                Some(5),
                "{loader_ops_per_step} loader ops a step: {counters:?}"
            );
        }
    }

    #[test]
    fn a_data_loader_that_ran_the_first_op_gives_its_place_to_the_trainer() {
        let rec = recording(1);
        // A 40-op step, and one loader op before each: a fortieth of the trainer's.
        let step: Vec<&'static str> = FIVE_OP_STEP.repeat(8);
        let trainer = unmarked_steps_beside(&rec, &step, steps_past_a_takeover(40), 1, true);
        assert_eq!(
            rec.main_thread.load(Ordering::Relaxed),
            trainer,
            "the trainer steps: {:?}",
            rec.counters()
        );
        assert!(rec.counters().auto_period.is_some(), "{:?}", rec.counters());
    }

    #[test]
    fn a_running_stepping_thread_keeps_its_place_beside_a_busier_thread() {
        let rec = recording(1);
        // This thread steps, with an eighth as many ops as another thread between each batch
        // of the other's: twice the ops a takeover needs in all, but never that many while
        // this one runs a sixteenth of them.
        exp_op(&rec);
        let rec = &rec;
        let batch = STEPPING_TAKEOVER_OPS / 8;
        std::thread::scope(|s| {
            let (go, turn) = std::sync::mpsc::channel::<bool>();
            let (done, finished) = std::sync::mpsc::channel::<()>();
            let other = s.spawn(move || {
                while turn.recv() == Ok(true) {
                    for _ in 0..batch {
                        exp_op(rec);
                    }
                    done.send(()).expect("the stepping thread waits");
                }
            });
            for _ in 0..16 {
                go.send(true).expect("the other thread waits");
                finished.recv().expect("the other thread answers");
                for _ in 0..batch / 8 {
                    exp_op(rec);
                }
            }
            go.send(false).expect("the other thread waits");
            other.join().expect("the other thread ran");
        });
        let stepping = rec.main_thread.load(Ordering::Relaxed);
        assert_eq!(stepping, thread_number(), "this thread still steps");
    }
}

#[cfg(test)]
mod verify_tests {
    use super::*;

    fn step(rec: &Recorder, shape: &[usize]) -> Option<Arc<StepTape>> {
        let view = TensorView {
            id: 1,
            bytes: 4,
            dtype: "F32",
            shape,
            role: TensorRole::Other,
        };
        let t0 = Instant::now();
        rec.record_op(
            "float_exp",
            [view].into_iter(),
            [view].into_iter(),
            t0,
            1,
            [0; 3],
        );
        rec.record_op(
            "float_sum",
            [view].into_iter(),
            [view].into_iter(),
            t0,
            1,
            [0; 3],
        );
        rec.boundary(true)
    }

    #[test]
    fn repeating_steps_are_verified_resampled_and_divergence_rerecords() {
        let rec = Recorder::default();
        rec.set_enabled(true);
        rec.set_resample_every(3);
        assert!(step(&rec, &[2]).is_some(), "step 0 recorded");
        assert!(
            step(&rec, &[2]).is_some(),
            "step 1 recorded, and it repeats step 0"
        );
        assert!(rec.counters().verifying);
        assert!(step(&rec, &[2]).is_none(), "step 2 only verified");
        assert!(step(&rec, &[2]).is_none(), "step 3 only verified");
        assert!(!rec.counters().verifying, "step 4 is a resample");
        assert!(step(&rec, &[2]).is_some(), "step 4 recorded again");
        assert!(rec.counters().verifying);
        // A new shape: the verified step diverges and the next one is recorded.
        assert!(step(&rec, &[3]).is_none());
        let c = rec.counters();
        assert_eq!((c.divergences, c.verifying, c.steps), (1, false, 6));
        let again = step(&rec, &[3]).expect("re-recorded after the divergence");
        assert_eq!(again.step, 6);
        assert_eq!(again.tensors[0].shape, vec![3]);
    }
}

#[cfg(test)]
mod auto_step_tests {
    use super::*;

    /// The dtype name of every op's output here (signatures tell dtypes apart by address).
    static F32: &str = "F32";

    /// Seven distinct ops: a step, or its first five another.
    const SEVEN_OPS: [&str; 7] = [
        "float_exp",
        "float_log",
        "float_mul",
        "float_sum",
        "float_neg",
        "float_abs",
        "float_sqrt",
    ];

    #[test]
    fn an_unmarked_stream_is_cut_at_its_period() {
        let rec = Recorder::default();
        rec.set_enabled(true);
        rec.set_resample_every(1);
        let names = [
            "float_exp",
            "float_log",
            "float_mul",
            "float_sum",
            "float_neg",
        ];
        let t0 = Instant::now();
        assert_eq!(rec.found_period(), None, "nothing found yet");
        // Warm-up ops that never repeat, then the 5-op step, 12 times.
        for w in 0..3usize {
            let warm = [w + 10];
            let view = TensorView {
                id: 1,
                bytes: 4,
                dtype: "F32",
                shape: &warm,
                role: TensorRole::Other,
            };
            rec.record_op(
                "float_from_data",
                [].into_iter(),
                [view].into_iter(),
                t0,
                1,
                [0; 3],
            );
        }
        for _ in 0..12 {
            for name in names {
                op(&rec, name, 3);
            }
        }
        let counters = rec.counters();
        assert_eq!(counters.auto_period, Some(5));
        let last = rec.last_step().expect("steps were cut");
        assert_eq!(last.ops.len(), 5);
        assert!(!last.marked);
        let mut seen: Vec<&str> = last.ops.iter().map(|o| o.name.as_str()).collect();
        seen.sort_unstable();
        let mut all = names.to_vec();
        all.sort_unstable();
        assert_eq!(seen, all, "one whole period, in some rotation");
        assert_eq!(counters.divergences, 0);
        // What the device reads to drop victims in such steps, as in marked ones.
        assert_eq!(rec.found_period(), Some(5));
        rec.boundary(true);
        assert_eq!(
            rec.found_period(),
            None,
            "a marker bounds the steps from now on"
        );
    }

    /// Records one op of an unmarked stream: `name`, with one output of shape `[width]`.
    fn op(rec: &Recorder, name: &'static str, width: usize) {
        let shape = [width];
        let view = TensorView {
            id: 1,
            bytes: 4,
            dtype: F32,
            shape: &shape,
            role: TensorRole::Other,
        };
        rec.record_op(
            name,
            [view].into_iter(),
            [view].into_iter(),
            Instant::now(),
            1,
            [0; 3],
        );
    }

    /// Whether detection is paused, and how many times it resumed.
    fn detection(rec: &Recorder) -> (bool, u64) {
        let state = rec.lock();
        (state.detection_paused, state.detection_resumed)
    }

    /// A recorder fed 12 steps of the first 5 of [`SEVEN_OPS`] (unmarked, each op recorded by
    /// `record`): it has found their period. Returns it with the step.
    fn after_five_op_steps(
        record: impl Fn(&Recorder, &'static str, usize),
    ) -> (Recorder, &'static [&'static str]) {
        let rec = Recorder::default();
        rec.set_enabled(true);
        let step = &SEVEN_OPS[..5];
        for _ in 0..12 {
            for name in step {
                record(&rec, name, 3);
            }
        }
        assert_eq!(rec.counters().auto_period, Some(5));
        (rec, step)
    }

    #[test]
    fn detection_pauses_while_steps_verify_and_resumes_when_the_program_changes() {
        let (rec, step) = after_five_op_steps(op);
        let longer = SEVEN_OPS;
        assert!(rec.counters().verifying);
        assert_eq!(
            detection(&rec),
            (true, 0),
            "a verified step pauses detection"
        );
        let verified = rec.counters().steps;
        for _ in 0..4 {
            for name in step {
                op(&rec, name, 3);
            }
        }
        assert_eq!(
            rec.counters().steps,
            verified + 4,
            "paused, steps are still cut at the period"
        );

        // A new program of 7 ops: a divergence, then its period is found.
        for _ in 0..12 {
            for name in longer {
                op(&rec, name, 4);
            }
        }
        let counters = rec.counters();
        assert!(counters.divergences >= 1);
        assert_eq!(counters.auto_period, Some(7), "the new period is found");
        assert_eq!(
            detection(&rec),
            (true, 1),
            "the divergence resumed detection, and the new period paused it again"
        );

        // Back to the first program.
        for _ in 0..12 {
            for name in step {
                op(&rec, name, 3);
            }
        }
        assert_eq!(rec.counters().auto_period, Some(5));
        assert_eq!(detection(&rec), (true, 2));
    }

    /// Records one op of an unmarked stream as the adapter does: its signature alone when
    /// that is all the recorder needs. Returns whether it went in full.
    fn adapter_op(rec: &Recorder, name: &'static str, width: usize) -> bool {
        if rec.signatures_only() {
            let mut signature = OpSignature::new(name);
            signature.output(F32, &[width]);
            rec.record_verified_op(name, signature, [0; 3]);
            false
        } else {
            op(rec, name, width);
            true
        }
    }

    /// A step of six identical 4-op layers (width 8) and a 2-op head (width 1), as (name,
    /// width) pairs: its layer repeats inside it.
    fn six_layers_and_a_head() -> impl Iterator<Item = (&'static str, usize)> {
        let layer = ["float_matmul", "float_add", "relu", "float_mul"];
        let layers = (0..6).flat_map(move |_| layer.map(|name| (name, 8)));
        layers.chain([("float_sum", 1), ("float_neg", 1)])
    }

    /// A recorder fed the first 5 of [`SEVEN_OPS`] (width 3, unmarked, as the adapter records
    /// them, with no step recorded in full once they verify) until it may count them: at a
    /// step's start. Returns it with the step's ops in the
    /// rotation its steps are cut in, and the ops it took.
    fn counting_five_op_steps() -> (Recorder, Vec<&'static str>, u64) {
        let rec = Recorder::default();
        rec.set_enabled(true);
        // No step recorded in full again: every op counted or checked.
        rec.set_resample_every(1 << 20);
        // The steps are cut where the period was confirmed: in some rotation of these ops.
        let mut stream = SEVEN_OPS[..5].iter().copied().cycle();
        let mut ops = 0;
        while !rec.may_count_op() {
            adapter_op(&rec, stream.next().unwrap(), 3);
            ops += 1;
            assert!(ops < 2 * COUNT_AFTER_VERIFIED_OPS, "never counted");
        }
        assert_eq!(
            rec.position(),
            (rec.counters().steps, 0),
            "at a step's start"
        );
        (rec, stream.take(5).collect(), ops)
    }

    /// Records one op as the adapter does under a budget while memory is ample: counted when
    /// the recorder allows it, else by its signature. Returns whether it was counted.
    fn ample_adapter_op(rec: &Recorder, name: &'static str, width: usize) -> bool {
        if rec.signatures_only() && rec.may_count_op() {
            return rec.count_op(name);
        }
        adapter_op(rec, name, width);
        false
    }

    #[test]
    fn an_unmarked_stream_is_counted_once_its_period_has_held_and_cut_at_it() {
        let (rec, step, ops) = counting_five_op_steps();
        assert!(
            ops > COUNT_AFTER_VERIFIED_OPS,
            "counted only once the period held for that many ops: after {ops}"
        );
        let before = rec.counters();
        assert_eq!(before.auto_period, Some(5));
        for name in step.iter().cycle().take(15) {
            assert!(rec.count_op(name));
        }
        let counted = rec.counters();
        assert_eq!(counted.steps, before.steps + 3, "cut every 5 ops counted");
        assert_eq!(counted.divergences, before.divergences);
        assert_eq!(counted.counted_ops, before.counted_ops + 15);
        assert_eq!(rec.position(), (counted.steps, 0));
        assert!(rec.may_count_op(), "and still counted");

        // Two ops counted, then verified (memory stopped being ample): the third op is
        // compared with the recorded step's third.
        assert!(rec.count_op(step[0]) && rec.count_op(step[1]));
        for name in &step[2..] {
            assert!(!adapter_op(&rec, name, 3), "verified");
        }
        assert_eq!(rec.counters().steps, counted.steps + 1, "cut at the period");
        assert_eq!(rec.counters().divergences, before.divergences);

        // A new program, verified: the first op that differs diverges, and detection, which
        // remembered the counted ops as the recorded step's, finds the new period.
        for _ in 0..12 {
            for name in SEVEN_OPS {
                adapter_op(&rec, name, 4);
            }
        }
        let after = rec.counters();
        assert!(after.divergences > before.divergences);
        assert_eq!(after.auto_period, Some(7), "{after:?}");
        assert!(
            !rec.may_count_op(),
            "the new period has not held long enough to be counted"
        );
    }

    #[test]
    fn a_counted_unmarked_stream_checks_one_op_in_so_many_and_sees_a_changed_program() {
        let (rec, step, _) = counting_five_op_steps();
        let before = rec.counters();
        let counted = step
            .iter()
            .cycle()
            .take(10 * CHECK_ONE_IN as usize)
            .filter(|&&name| ample_adapter_op(&rec, name, 3))
            .count();
        assert_eq!(
            counted,
            10 * (CHECK_ONE_IN as usize - 1),
            "one op in {CHECK_ONE_IN} verified, the others counted"
        );
        let unchanged = rec.counters();
        assert_eq!(unchanged.divergences, before.divergences);
        assert_eq!(unchanged.counted_ops, before.counted_ops + counted as u64);

        // Another program: a checked op differs, and the step it is in diverges.
        let mut ops = 0;
        while rec.counters().divergences == before.divergences {
            ample_adapter_op(&rec, SEVEN_OPS[ops % 7], 4);
            ops += 1;
            assert!(ops <= CHECK_ONE_IN as usize + 5, "unseen after {ops} ops");
        }
        assert!(!rec.may_count_op(), "the next step is recorded");
    }

    #[test]
    fn a_repetition_inside_the_step_is_not_counted_as_the_step() {
        // As in `a_repetition_inside_the_step_does_not_hide_the_step_when_detection_paused`:
        // the layer's period is confirmed and verified before the head breaks it. Counted, the
        // head would go unseen.
        let rec = Recorder::default();
        rec.set_enabled(true);
        let mut first_counted = None;
        for _ in 0..COUNT_AFTER_VERIFIED_OPS / 26 + 100 {
            for (name, width) in six_layers_and_a_head() {
                if rec.may_count_op() && first_counted.is_none() {
                    first_counted = Some(rec.counters());
                }
                adapter_op(&rec, name, width);
            }
        }
        let counters = first_counted.expect("counted once the real step held");
        assert_eq!(counters.auto_period, Some(26), "{counters:?}");
    }

    #[test]
    fn a_broken_period_collects_only_signatures_until_the_next_is_confirmed() {
        let (rec, _) = after_five_op_steps(|rec, name, width| {
            adapter_op(rec, name, width);
        });
        let longer = SEVEN_OPS;
        // A new program: the verified step of 5 ops diverges within its first 5 ops.
        let mut in_full = Vec::new();
        for _ in 0..12 {
            for name in longer {
                in_full.push((adapter_op(&rec, name, 4), rec.counters().auto_period));
            }
        }
        let counters = rec.counters();
        assert!(counters.divergences >= 1);
        assert_eq!(counters.auto_period, Some(7), "the new period is found");
        let confirmed = in_full
            .iter()
            .position(|&(_, period)| period == Some(7))
            .expect("confirmed within the stream");
        assert!(
            in_full[5..confirmed].iter().all(|&(full, _)| !full),
            "from the divergence to the confirmation only signatures: {in_full:?}"
        );
        assert!(
            in_full[confirmed..].iter().any(|&(full, _)| full),
            "a step of the new period is recorded in full"
        );
        let last = rec.last_step().expect("a recorded step");
        assert_eq!(last.ops.len(), 7, "the new step is kept as a tape");
    }

    #[test]
    fn a_long_unmarked_stream_without_a_period_needs_only_signatures_until_one_is_found() {
        let rec = Recorder::default();
        rec.set_enabled(true);
        assert!(
            !rec.signatures_only(),
            "a short stretch is recorded in full (a marker may end it)"
        );
        // No period: every op's shape is new.
        let long = 3 * PeriodDetector::DEFAULT_MAX + 1;
        for width in 1..=long {
            op(&rec, "float_exp", width);
        }
        assert!(rec.signatures_only(), "its buffers were dropped");
        rec.record_drop(7);
        assert!(rec.lock().buffers.drops.is_empty(), "drops are not kept");
        // A period then: recorded in full once confirmed.
        let step = [
            "float_exp",
            "float_log",
            "float_mul",
            "float_sum",
            "float_neg",
        ];
        let mut recorded_in_full = 0;
        for _ in 0..6 {
            for name in step {
                if rec.signatures_only() {
                    let mut signature = OpSignature::new(name);
                    signature.output(F32, &[3]);
                    rec.record_verified_op(name, signature, [0; 3]);
                } else {
                    recorded_in_full += 1;
                    op(&rec, name, 3);
                }
            }
        }
        let counters = rec.counters();
        assert_eq!(counters.auto_period, Some(5), "{counters:?}");
        assert!(recorded_in_full >= 5, "the steps after the confirmation");
        assert!(
            rec.last_step().is_some_and(|tape| tape.ops.len() == 5),
            "and kept as a tape"
        );

        // A marker ends the search.
        let marked = Recorder::default();
        marked.set_enabled(true);
        for width in 1..=long {
            op(&marked, "float_exp", width);
        }
        marked.boundary(true);
        assert!(!marked.signatures_only());
    }

    #[test]
    fn steps_are_found_again_after_a_block_of_other_ops_in_a_long_run() {
        // A long unmarked run, a block of other ops (a second model's initialisation, an
        // evaluation), then the same steps: the step's period is confirmed again within a few
        // steps (see "Which period is reported" on `PeriodDetector`), not after the stream has
        // run past the longest period followed (100,000 ops), every step recorded in full.
        let rec = Recorder::default();
        rec.set_enabled(true);
        let step = SEVEN_OPS;
        for _ in 0..200 {
            for name in step {
                op(&rec, name, 3);
            }
        }
        assert!(rec.counters().verifying);
        let before = rec.counters();
        for name in [
            "float_cos",
            "float_sin",
            "float_tanh",
            "float_erf",
            "float_round",
        ] {
            op(&rec, name, 9);
        }
        for _ in 0..40 {
            for name in step {
                op(&rec, name, 3);
            }
        }
        let after = rec.counters();
        assert_eq!(after.auto_period, Some(7), "{after:?}");
        assert!(after.verifying, "{after:?}");
        assert!(
            after.steps >= before.steps + 30,
            "steps are cut again within a few of the block: {before:?} then {after:?}"
        );
    }

    #[test]
    fn a_repetition_inside_the_step_does_not_hide_the_step_when_detection_paused() {
        // Six identical 4-op layers and a 2-op head: the layer's period is confirmed, recorded
        // twice and verified (detection pauses) before the head breaks it.
        let rec = Recorder::default();
        rec.set_enabled(true);
        for _ in 0..12 {
            for (name, width) in six_layers_and_a_head() {
                op(&rec, name, width);
            }
        }
        assert!(
            detection(&rec).1 >= 1,
            "detection paused on the layer, and the head's divergence resumed it"
        );
        assert_eq!(
            rec.counters().auto_period,
            Some(26),
            "the whole step is found"
        );
        assert!(detection(&rec).0, "the whole step pauses detection");
    }
}
