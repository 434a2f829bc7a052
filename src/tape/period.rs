//! Step detection for code that never marks its steps: find the period of the op stream.
//!
//! A training loop runs the same program every step, so its stream of op signatures (name and
//! output shapes, see [`op_signature`]) becomes periodic once the loop is running. The
//! [`PeriodDetector`] is fed one signature per op and says when the most recent ops are two
//! identical repetitions, and of what length.
//!
//! How it works, what it reports and its limits are on [`PeriodDetector`].

use crate::fast_hash::FastMap;

/// The modulus of the rolling hash: the Mersenne prime 2^61 - 1.
const MODULUS: u64 = (1 << 61) - 1;

/// The base of the rolling hash, an arbitrary fixed element of the field (fixed so that the
/// detector is deterministic).
const BASE: u64 = 0x0d1c_5a3b_7e29_4f61 % MODULUS;

/// A signature for [`PeriodDetector::push`]: FNV-1a over the op name and its output shapes.
///
/// FNV rather than std's `DefaultHasher` because its output must not change between Rust
/// releases, so signatures written to a tape stay comparable.
pub fn op_signature<'a>(name: &str, output_shapes: impl IntoIterator<Item = &'a [usize]>) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(PRIME);
        }
    };
    eat(name.as_bytes());
    for shape in output_shapes {
        // A separator and the rank keep `[2, 3]` + `[4]` apart from `[2]` + `[3, 4]`.
        eat(&[0xff]);
        eat(&(shape.len() as u64).to_le_bytes());
        for &d in shape {
            eat(&(d as u64).to_le_bytes());
        }
    }
    h
}

/// A period being followed and the length of its current run.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    period: usize,
    /// The length of the longest suffix with this period (at least `period`).
    run: usize,
}

impl Candidate {
    /// How many ops in a row, ending now, equal the op one period before them.
    fn reach(&self) -> usize {
        self.run - self.period
    }

    /// Whether the run covers two whole repetitions.
    fn covers_two(&self) -> bool {
        self.run >= 2 * self.period
    }
}

/// Finds the period of a stream of op signatures.
///
/// # How it works
///
/// For each candidate period `p` the detector keeps the *run*: the length of the longest suffix
/// of the stream in which every op equals the op `p` before it. The last `2p` ops are two
/// identical repetitions exactly when the run is at least `2p`. Keeping a run for every `p` up to
/// the maximum would cost O(max) per op, so only a few candidates are followed (at most
/// [`PeriodDetector::MAX_CANDIDATES`]), found two ways:
/// - recurrences: when an op's signature was last seen `p` ops ago, `p` becomes a candidate. A
///   step that holds any signature exactly once (the loss, the root gradient, an optimizer
///   scalar) yields its period this way as soon as that op recurs;
/// - a round-robin sweep over all periods in range, [`PeriodDetector::SWEEP_PER_PUSH`] per op:
///   a period at which the current op repeats is proposed with its run. So a period is found
///   even when every signature of the step occurs several times, within
///   `(max - min + 1) / SWEEP_PER_PUSH` ops of the stream becoming periodic.
///
/// A new candidate's run is measured at once: its first ops one by one, then by galloping and a
/// binary search on rolling prefix hashes (inside a stretch of one repeated signature it is the
/// stretch, and with the candidates full a proposal is measured only if a probe shows it could
/// replace the weakest); from then on it is extended by exact comparison of one signature per
/// op, and dropped at the first mismatch. So a push costs O(candidates + sweep) signature
/// comparisons plus an O(log max) search for each new candidate (at most
/// `1 + SWEEP_PER_PUSH` per op, usually none). Memory is
/// bounded by three rings of `2 max + 1` words, a map of the signatures seen in the last `3 max`
/// ops, and the candidates.
///
/// # Which period is reported
///
/// Of all candidates, the one whose repetition reaches furthest back wins: the most ops in a row,
/// ending now, that each equal the op one period before them (`run - period`; ties: the smaller
/// period). It is reported only if its run covers two repetitions. Preferring the earliest start
/// rather than the smallest period matters because a step contains shorter repetitions of its
/// own: identical layers in the forward and backward, per-parameter optimizer updates. Their
/// repetition starts at their section of the current step, while the step's goes back to where
/// the loop started. (The raw run would not do: it counts the first period for free, so a long
/// period matching by chance for a few ops would beat a short one that has repeated for many.)
/// So once the step's period is a candidate (at the first recurrence of a signature that occurs
/// once per step, or when the sweep reaches it during the second step) nothing is reported until
/// the second full step ends, and from then on the step's period, even inside a stretch of
/// repeated layers.
///
/// A candidate that held the report back and then stopped repeating shows where the stream
/// broke (the op one period before the one that differed); from then on a candidate whose run
/// reaches back to that op, without covering two repetitions, is dropped and holds nothing back.
/// This is for a block of other ops inside a long periodic stream (a new model's
/// initialisation, an evaluation, another model's steps) followed by the same steps: the periods
/// that line the new steps up with the old ones across the block (the step plus the block, and
/// its multiples) repeat from the first new op, one step earlier than the step's own period
/// can, so they reach further back; but their reference is the old stream, and each ends at the
/// block just before covering two repetitions. Without the rule they would hold the step's
/// period back, one after another, until the stream had run past the longest period followed
/// (100,000 ops by default: a hundred steps of a small model, which a recorder that cuts steps
/// at the period records in full meanwhile). With it the step's period is reported within a
/// few repetitions of the new steps. The cost: a break shown inside a real step (a period that
/// lines two steps up across a marker op that only the step's own period repeats) lets a
/// repetition inside the step through until the step's period covers two repetitions, which a
/// caller that cuts steps handles as any early inner repetition (it diverges at the next
/// marker).
///
/// Multiples of a period are periods too; a stream of period 3 under a minimum of 4 is reported
/// as 6, the smallest multiple in range, since the last 12 ops are two repetitions of 6.
///
/// # Warm-up and limits
///
/// Ops before the repetition (model init, data loader start, a first step that creates
/// optimizer state) are simply not part of any run: the step's run starts after them and the
/// period is reported once two full repetitions follow the warm-up, whatever the warm-up's
/// length. What cannot be told apart without seeing the future: before the step's period is a
/// candidate, a repetition inside the step (two identical layers) is the best there is, so it is
/// reported; in the first step always, in the second until the step's period is found. A caller
/// that cuts steps should wait until a period has held for a full period before trusting it.
/// Periods below the minimum (default 4, so that `A A` or `A B A B` inside a step are not steps)
/// are reported only as their multiples in range; periods above the maximum never. A new
/// candidate's run comes from 61-bit polynomial hashes, so a wrong one needs a hash collision
/// (about 2^-61 per comparison); runs are extended by exact comparison only.
///
/// # Example
///
/// ```
/// use burn_spill::tape::{PeriodDetector, op_signature};
///
/// // A step of five ops, repeated.
/// let step = ["float_matmul", "float_add", "float_exp", "float_sum", "float_sqrt"];
/// let mut detector = PeriodDetector::default();
/// let mut found = None;
/// for name in step.iter().cycle().take(3 * step.len()) {
///     if let Some(period) = detector.push(op_signature(name, [[4usize, 4].as_slice()])) {
///         found = Some(period); // the last 2 * period ops are two identical steps
///     }
/// }
/// assert_eq!(found, Some(5));
/// ```
#[derive(Debug, Clone)]
pub struct PeriodDetector {
    min: usize,
    max: usize,
    /// Ring length: `2 max + 1`, enough for the prefix hashes of the last `2 max` ops.
    ring: usize,
    /// `s[k]` at `k % ring`; grows to `ring` and then wraps.
    sigs: Vec<u64>,
    /// `H[k]`, the hash of `s[0..k)`, at `k % ring`.
    prefix: Vec<u64>,
    /// `BASE^k` for `k < ring`, grown as the stream grows.
    pow: Vec<u64>,
    /// Signatures pushed so far.
    n: usize,
    /// `n % ring`, kept as the stream grows: ring positions are found from it by a subtraction
    /// (see [`slot`](Self::slot)), where `k % ring` took a division for every signature read.
    head: usize,
    /// Each signature's last position, pruned to the last `max` ops every `ring` pushes, and
    /// not kept up while observing (see [`resume`](Self::resume)).
    last_seen: FastMap<u64, usize>,
    /// The first position observed since the last resume, if any.
    observed_from: Option<usize>,
    /// How many ops in a row, ending with the last one, have the same signature.
    stretch: usize,
    candidates: Vec<Candidate>,
    /// While the candidates are full: the place and reach of the one with the shortest reach,
    /// found once for the proposals of one push (cleared when the candidates change).
    weakest: Option<(usize, usize)>,
    /// Whether the shortcuts are taken: runs measured without hashing where they can be (a
    /// stretch of one signature, exact comparisons first), a probe before measuring a proposal
    /// that could not be kept, and the weakest candidate found once per push. Off only in the
    /// test that checks they change no report.
    shortcuts: bool,
    /// The candidate that held the last report back (see "Which period is reported"), by its
    /// period.
    holding_back: Option<usize>,
    /// Where the stream broke, as a candidate that stopped repeating while it held the report
    /// back showed: the op one period before the one that differed. A candidate whose run
    /// reaches back to it holds nothing back.
    broken_at: Option<usize>,
    /// The next period the sweep checks.
    sweep: usize,
    period: Option<usize>,
}

impl Default for PeriodDetector {
    /// Periods from [`PeriodDetector::DEFAULT_MIN`] to [`PeriodDetector::DEFAULT_MAX`] ops.
    fn default() -> Self {
        Self::new(Self::DEFAULT_MIN, Self::DEFAULT_MAX)
    }
}

impl PeriodDetector {
    /// The default shortest period: shorter repetitions are inner loops, not steps.
    pub const DEFAULT_MIN: usize = 4;
    /// The default longest period: a large transformer step is a few tens of thousands of ops.
    pub const DEFAULT_MAX: usize = 100_000;
    /// How many candidate periods are followed at once.
    pub const MAX_CANDIDATES: usize = 32;
    /// How many periods the round-robin sweep checks per pushed op.
    pub const SWEEP_PER_PUSH: usize = 8;

    /// A detector for periods of `min_period..=max_period` ops. A minimum of 0 is taken as 1 and
    /// a maximum below the minimum as the minimum. Memory grows with the stream up to about
    /// `6 max` words (plus the signature map) and then stays there.
    pub fn new(min_period: usize, max_period: usize) -> Self {
        let min = min_period.max(1);
        let max = max_period.max(min);
        let ring = 2 * max + 1;
        Self {
            min,
            max,
            ring,
            sigs: Vec::new(),
            prefix: vec![0],
            pow: vec![1],
            n: 0,
            head: 0,
            last_seen: FastMap::default(),
            observed_from: None,
            stretch: 0,
            candidates: Vec::new(),
            weakest: None,
            shortcuts: true,
            holding_back: None,
            broken_at: None,
            sweep: min,
            period: None,
        }
    }

    /// Feeds the next op's signature. Returns `Some(period)` when the last `2 * period` ops are
    /// two identical repetitions and `period` is the current best period (see "Which period is
    /// reported" on [`PeriodDetector`]); `None` otherwise.
    pub fn push(&mut self, sig: u64) -> Option<usize> {
        let k = self.n;
        self.store(sig);
        self.weakest = None;

        // Extend the runs; a mismatch ends a candidate.
        let limit = self.run_limit();
        let sigs = &self.sigs;
        let ring = self.ring;
        let here = self.slot(k);
        let holding_back = self.holding_back;
        let mut broken_at = None;
        self.candidates.retain_mut(|c| {
            let same = sigs[here] == sigs[back(here, c.period, ring)];
            c.run = (c.run + 1).min(limit);
            if !same && holding_back == Some(c.period) {
                broken_at = Some(k - c.period);
            }
            same
        });
        if broken_at.is_some() {
            self.broken_at = broken_at;
            // They could neither be reported nor hold anything back: their places go free.
            let candidates = std::mem::take(&mut self.candidates);
            self.candidates = candidates
                .into_iter()
                .filter(|c| !self.ends_at_break(c))
                .collect();
        }

        // A recurrence proposes its distance.
        if let Some(q) = self.last_seen.insert(sig, k) {
            let p = k - q;
            // A candidate already is one (`propose` would keep it): in a periodic stream that is
            // nearly every op, and the run need not be measured again.
            if (self.min..=self.max).contains(&p) && !self.candidates.iter().any(|c| c.period == p)
            {
                self.consider(p);
            }
        }

        // The sweep proposes periods at which this op repeats, square or not yet: a step whose
        // signatures all recur within it becomes a candidate early in its second repetition, so
        // its long run can hold back the shorter repetitions inside it.
        let top = self.max.min(k);
        if top >= self.min {
            for _ in 0..Self::SWEEP_PER_PUSH {
                let p = self.sweep;
                self.sweep = if p >= top { self.min } else { p + 1 };
                if self.sig(k) != self.sig(k - p) || self.candidates.iter().any(|c| c.period == p) {
                    continue;
                }
                self.consider(p);
            }
        }

        if self.head == 0 {
            // Recurrences further back than `max` can never propose a period again.
            let (n, max) = (self.n, self.max);
            self.last_seen.retain(|_, &mut q| q + max >= n);
        }

        let furthest = |candidates: &mut dyn Iterator<Item = &Candidate>| {
            candidates
                .max_by_key(|c| (c.reach(), std::cmp::Reverse(c.period)))
                .copied()
        };
        let winner = furthest(&mut self.candidates.iter());
        let covering_two = furthest(&mut self.candidates.iter().filter(|c| c.covers_two()));
        (self.period, self.holding_back) = match (winner, covering_two) {
            (Some(w), _) if w.covers_two() => (Some(w.period), None),
            // `w` holds back a period that covers two repetitions.
            (Some(w), Some(_)) => (None, Some(w.period)),
            _ => (None, None),
        };
        self.period
    }

    /// Feeds the next op's signature without looking for periods: the stream is remembered
    /// (candidates found after [`resume`](Self::resume) measure their runs over it) at the cost
    /// of one hash step, where a push follows up to 40 candidate periods. For a caller that
    /// knows the period and checks it by other means.
    pub fn observe(&mut self, sig: u64) {
        self.observed_from.get_or_insert(self.n);
        self.store(sig);
        if self.period.is_some() || !self.candidates.is_empty() {
            // Their runs are not extended while observing.
            self.candidates.clear();
            self.weakest = None;
            self.period = None;
            self.holding_back = None;
        }
    }

    /// Looks for periods again after [`observe`](Self::observe): the last positions of the
    /// signatures observed (at most the last `max` ops) are added to those pushed before, so a
    /// period whose ops recur is proposed at its next recurrence and its run measured over the
    /// stream observed before. Costs O(ops observed), at most O(`max`), once. (A position the
    /// map keeps from before that is further back than `max` proposes nothing: its distance is
    /// out of range, as if it were gone.)
    pub fn resume(&mut self) {
        let observed = self.observed_from.take();
        if self.shortcuts {
            let from = observed
                .unwrap_or(self.n)
                .max(self.n.saturating_sub(self.max));
            for k in from..self.n {
                self.last_seen.insert(self.sig(k), k);
            }
        } else {
            // Rebuilt from the remembered stream alone: what the map above must match.
            self.last_seen.clear();
            for k in self.n.saturating_sub(self.max)..self.n {
                self.last_seen.insert(self.sig(k), k);
            }
        }
        self.candidates.clear();
        self.weakest = None;
        self.period = None;
        self.holding_back = None;
    }

    /// What the last [`push`](Self::push) returned.
    pub fn period(&self) -> Option<usize> {
        self.period
    }

    /// How many signatures have been pushed.
    pub fn pushed(&self) -> usize {
        self.n
    }

    /// The shortest and longest periods this detector reports.
    pub fn limits(&self) -> (usize, usize) {
        (self.min, self.max)
    }

    /// Forgets the stream (keeping the limits and the memory already allocated).
    pub fn reset(&mut self) {
        self.sigs.clear();
        self.prefix.clear();
        self.prefix.push(0); // H[0]; the slot may hold a wrapped H[ring]
        self.n = 0;
        self.observed_from = None;
        self.head = 0;
        self.stretch = 0;
        self.last_seen.clear();
        self.candidates.clear();
        self.weakest = None;
        self.holding_back = None;
        self.broken_at = None;
        self.sweep = self.min;
        self.period = None;
    }

    /// Appends `s[n]` and `H[n + 1]`, and counts the signature.
    fn store(&mut self, sig: u64) {
        let k = self.n;
        self.stretch = if k > 0 && self.sig(k - 1) == sig {
            self.stretch + 1
        } else {
            1
        };
        let next = if self.head + 1 == self.ring {
            0
        } else {
            self.head + 1
        };
        let h = add(mul(self.prefix[self.head], BASE), mix(sig));
        put(&mut self.sigs, self.head, self.ring, sig);
        put(&mut self.prefix, next, self.ring, h);
        if self.pow.len() < self.ring {
            let last = self.pow[self.pow.len() - 1];
            self.pow.push(mul(last, BASE));
        }
        self.n += 1;
        self.head = next;
    }

    /// The ring slot of position `k`, one of the last `ring` (`n - ring < k <= n`).
    fn slot(&self, k: usize) -> usize {
        back(self.head, self.n - k, self.ring)
    }

    fn sig(&self, k: usize) -> u64 {
        self.sigs[self.slot(k)]
    }

    /// The longest run that can be measured: the ops still in the rings.
    fn run_limit(&self) -> usize {
        self.n.min(self.ring - 1)
    }

    /// The hash of `s[i..j)`; both ends within the last `ring - 1` ops.
    fn hash(&self, i: usize, j: usize) -> u64 {
        let hi = self.prefix[self.slot(j)];
        let lo = mul(self.prefix[self.slot(i)], self.pow[j - i]);
        add(hi, MODULUS - lo)
    }

    /// Whether the last `r` ops repeat with period `p` (each equals the one `p` before it).
    fn periodic_suffix(&self, p: usize, r: usize) -> bool {
        let n = self.n;
        r <= self.run_limit() && self.hash(n - r, n - p) == self.hash(n - r + p, n)
    }

    /// The run of period `p` ending now, given a length `known` to be `p`-periodic (a
    /// `p`-periodic suffix stays periodic when shortened, so the predicate is monotone): by
    /// galloping out from that length (`known + 1`, `known + 2`, `known + 4`, ...) to the first length that fails, then a binary search below it. Most
    /// proposed periods fail at once or within a few ops, so this costs a few comparisons where
    /// a binary search over every length in the rings (up to `2 max`) took about 2 log2(max)
    /// hashes for each, which on a stream whose period keeps changing was most of an op's time.
    ///
    /// Inside a stretch of one signature longer than `p` the run is the stretch, with no hash:
    /// the ops of the stretch from its `p + 1`-th on each equal the one `p` before, and its
    /// `p`-th differs from the op just before the stretch. (In a batch of identical ops every
    /// shorter period repeats, and the sweep proposes each of them.)
    fn measure_run(&self, p: usize, known: usize) -> usize {
        let limit = self.run_limit();
        if limit <= p {
            return p;
        }
        if !self.shortcuts {
            return self.measure_run_by_hashes(p, known.clamp(p, limit));
        }
        if p < self.stretch {
            return self.stretch.min(limit);
        }
        let mut start = known.clamp(p, limit);
        if start == limit {
            return limit;
        }
        // The first ops past the known length one by one: adjacent in the ring, so cheaper
        // than hashes (two reads far apart each), and most runs end within them.
        let exact_end = start.saturating_add(EXACT_STEPS).min(limit);
        while start < exact_end {
            let at = self.n - start - 1;
            if self.sig(at) != self.sig(at + p) {
                return start;
            }
            start += 1;
        }
        self.measure_run_by_hashes(p, start)
    }

    /// The run of period `p` ending now, given that the last `start` ops are `p`-periodic, by
    /// galloping and a binary search on hashes (see [`measure_run`](Self::measure_run)).
    fn measure_run_by_hashes(&self, p: usize, start: usize) -> usize {
        let limit = self.run_limit();
        if start >= limit {
            return limit;
        }
        let mut periodic = start;
        let mut step = 1;
        let failed = loop {
            let probe = start.saturating_add(step).min(limit);
            if !self.periodic_suffix(p, probe) {
                break probe;
            }
            if probe == limit {
                return limit;
            }
            periodic = probe;
            step *= 2;
        };
        let (mut lo, mut hi) = (periodic, failed - 1);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if self.periodic_suffix(p, mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }

    /// Whether `c` has not covered two repetitions and its run reaches back to where the
    /// stream broke (see `broken_at`): it would end there before covering two.
    fn ends_at_break(&self, c: &Candidate) -> bool {
        !c.covers_two() && self.broken_at.is_some_and(|at| self.n - c.run <= at)
    }

    /// Measures the run of period `p` and proposes it, unless the candidates are full and one
    /// probe shows that it could not replace the weakest of them (as `propose` would find after
    /// the whole measurement: on a stream of few signatures most recurrences are such periods,
    /// and each full measurement is a few dozen hashes).
    /// `p` must not be a candidate already.
    fn consider(&mut self, p: usize) {
        if self.shortcuts && self.candidates.len() >= Self::MAX_CANDIDATES {
            let (_, reach) = self.weakest();
            // Replacing it takes a reach of one more, a run of `p + reach + 1`.
            let needed = p.saturating_add(reach).saturating_add(1);
            // The farthest pair of that run first, exactly: most such probes fail there.
            let n = self.n;
            if needed > self.run_limit()
                || self.sig(n - needed) != self.sig(n - needed + p)
                || !self.periodic_suffix(p, needed)
            {
                return;
            }
            let run = self.measure_run(p, needed);
            self.propose(p, run);
            return;
        }
        let run = self.measure_run(p, p);
        self.propose(p, run);
    }

    /// The place and reach of the candidate with the shortest reach (the first such), with
    /// the candidates full.
    fn weakest(&mut self) -> (usize, usize) {
        let find = |candidates: &[Candidate]| {
            candidates
                .iter()
                .enumerate()
                .map(|(at, c)| (at, c.reach()))
                .min_by_key(|&(_, reach)| reach)
                .expect("the candidates are full")
        };
        if !self.shortcuts {
            return find(&self.candidates);
        }
        *self.weakest.get_or_insert_with(|| find(&self.candidates))
    }

    /// Follows period `p`, not a candidate yet, with run `run`, evicting the shortest reach
    /// when full.
    fn propose(&mut self, p: usize, run: usize) {
        debug_assert!(self.candidates.iter().all(|c| c.period != p));
        if run <= p {
            return; // not even one op repeats at that distance
        }
        let new = Candidate { period: p, run };
        if self.ends_at_break(&new) {
            return;
        }
        if self.candidates.len() < Self::MAX_CANDIDATES {
            self.candidates.push(new);
            self.weakest = None;
            return;
        }
        let (at, reach) = self.weakest();
        if reach < new.reach() {
            self.candidates[at] = new;
            self.weakest = None;
        }
    }
}

/// How many ops past a known periodic length [`PeriodDetector::measure_run`] compares one by one
/// before it gallops on with hashes.
const EXACT_STEPS: usize = 32;

/// Writes `value` at `slot` of a ring that grows to `ring` entries and then wraps.
fn put(buf: &mut Vec<u64>, slot: usize, ring: usize, value: u64) {
    if buf.len() < ring {
        // Positions arrive in order, so while the ring is filling `slot == buf.len()`.
        buf.push(value);
    } else {
        buf[slot] = value;
    }
}

/// The slot `by` positions before `slot` in a ring of `ring` slots (`by <= ring`).
fn back(slot: usize, by: usize, ring: usize) -> usize {
    if slot >= by {
        slot - by
    } else {
        slot + ring - by
    }
}

/// A signature as a field element, mixed so that nearby signatures hash far apart.
fn mix(sig: u64) -> u64 {
    // splitmix64's finaliser.
    let mut z = sig.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) % MODULUS
}

/// `a * b mod 2^61 - 1` for `a, b < 2^61 - 1`.
fn mul(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    // 2^61 = 1 (mod 2^61 - 1): fold the high bits onto the low.
    let folded = (p as u64 & MODULUS) + (p >> 61) as u64;
    reduce(reduce(folded))
}

fn add(a: u64, b: u64) -> u64 {
    reduce(a + b)
}

fn reduce(x: u64) -> u64 {
    if x >= MODULUS { x - MODULUS } else { x }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pushes every signature; returns what each push reported.
    fn feed(d: &mut PeriodDetector, sigs: &[u64]) -> Vec<Option<usize>> {
        sigs.iter().map(|&s| d.push(s)).collect()
    }

    fn repeat(step: &[u64], times: usize) -> Vec<u64> {
        step.iter()
            .copied()
            .cycle()
            .take(step.len() * times)
            .collect()
    }

    /// The first push (1-based count) that reported something, and what.
    fn first_report(reports: &[Option<usize>]) -> Option<(usize, usize)> {
        reports
            .iter()
            .enumerate()
            .find_map(|(i, r)| r.map(|p| (i + 1, p)))
    }

    #[test]
    fn an_observed_stream_counts_toward_runs_found_after_resuming() {
        // Three identical layers and a head: the layer's period is found first.
        let step = [1, 2, 3, 1, 2, 3, 1, 2, 3, 9];
        let mut d = PeriodDetector::new(2, 100);
        feed(&mut d, &repeat(&step, 3));
        for &sig in &repeat(&step, 3) {
            d.observe(sig);
        }
        assert_eq!(d.period(), None, "observing reports nothing");
        d.resume();
        // Periods proposed now have their runs measured over the observed stream: a multiple
        // of the step is reported at once, and the step itself when the head recurs at its
        // distance, by the end of the first step after resuming.
        let reports = feed(&mut d, &step);
        assert!(
            reports.iter().all(|r| r.is_some_and(|p| p % 10 == 0)),
            "{reports:?}"
        );
        assert_eq!(reports.last(), Some(&Some(10)), "{reports:?}");

        // Without the observed stream (a fresh detector), two whole steps are needed.
        let mut fresh = PeriodDetector::new(2, 100);
        assert_eq!(feed(&mut fresh, &step).last(), Some(&None));
    }

    #[test]
    fn a_pure_repetition_is_found_after_two_periods() {
        let step = [1, 2, 3, 4, 5, 6, 7];
        let mut d = PeriodDetector::new(4, 100);
        let reports = feed(&mut d, &repeat(&step, 6));
        assert_eq!(first_report(&reports), Some((14, 7)));
        assert!(reports[13..].iter().all(|r| *r == Some(7)), "{reports:?}");
        assert_eq!(d.period(), Some(7));
        assert_eq!(d.pushed(), 42);
    }

    #[test]
    fn a_warm_up_prefix_is_skipped() {
        // Warm-up ops that share signatures with the step (a first step creating state, init
        // ops like the step's) and some that do not.
        let warm: Vec<u64> = vec![90, 91, 1, 2, 92, 3, 1, 93, 94, 95, 4, 96, 2];
        let step = [1, 2, 3, 4, 5, 6];
        let mut stream = warm.clone();
        stream.extend(repeat(&step, 5));
        let mut d = PeriodDetector::new(4, 1000);
        let reports = feed(&mut d, &stream);
        assert_eq!(first_report(&reports), Some((warm.len() + 12, 6)));
        assert!(reports[warm.len() + 11..].iter().all(|r| *r == Some(6)));
    }

    #[test]
    fn a_stream_that_never_repeats_reports_nothing() {
        let mut d = PeriodDetector::new(4, 64);
        assert!(
            feed(&mut d, &(0..20_000).collect::<Vec<u64>>())
                .iter()
                .all(Option::is_none)
        );
        assert_eq!(d.period(), None);
        // Memory stays bounded however long the stream.
        assert!(d.sigs.len() <= 129 && d.prefix.len() <= 129 && d.pow.len() <= 129);
        assert!(d.last_seen.len() <= 3 * 64 + 1, "{}", d.last_seen.len());
        assert!(d.candidates.is_empty());
    }

    #[test]
    fn an_inner_repetition_is_not_the_period() {
        // A B A B C: period 5. With the default minimum, 2 is never a candidate.
        let step = [10, 11, 10, 11, 12];
        let mut d = PeriodDetector::new(4, 100);
        let reports = feed(&mut d, &repeat(&step, 8));
        assert_eq!(first_report(&reports), Some((10, 5)));
        assert!(reports[9..].iter().all(|r| *r == Some(5)), "{reports:?}");

        // With a minimum of 1 the inner square `A B A B` is reported while it is all there is,
        // and the step takes over once two steps are seen, for good.
        let mut d = PeriodDetector::new(1, 100);
        let reports = feed(&mut d, &repeat(&step, 8));
        assert_eq!(reports[3], Some(2), "A B A B is two repetitions of A B");
        assert_eq!(reports[4], None, "C ends them");
        assert!(reports[9..].iter().all(|r| *r == Some(5)), "{reports:?}");
    }

    #[test]
    fn repeated_layers_do_not_beat_the_step_once_two_steps_are_seen() {
        // embed, 6 identical layers of 5 ops, loss, root, 6 layer backwards of 4 ops, 2
        // optimizer updates of identical shape.
        let mut step = vec![1, 2];
        for _ in 0..6 {
            step.extend([10, 11, 12, 13, 14]);
        }
        step.extend([3, 4]);
        for _ in 0..6 {
            step.extend([20, 21, 22, 23]);
        }
        step.extend([30, 31, 32, 30, 31, 32]);
        let len = step.len();
        let mut d = PeriodDetector::new(4, 10_000);
        let reports = feed(&mut d, &repeat(&step, 4));
        // In the first step the layers are the longest repetition there is.
        assert!(reports[..len].contains(&Some(5)));
        // In the second, inside the layers, the step's run is longer than the layers' run: no
        // layer period, only silence until the step is confirmed, then the step for good.
        assert!(
            reports[len..2 * len]
                .iter()
                .all(|r| r.is_none() || *r == Some(len))
        );
        assert!(
            reports[2 * len - 1..].iter().all(|r| *r == Some(len)),
            "{reports:?}"
        );
    }

    #[test]
    fn found_when_no_signature_is_unique_in_the_step() {
        // A B B A: every signature occurs twice, the distances between recurrences are 1 and 3,
        // never 4; only the sweep finds 4.
        let step = [1, 2, 2, 1];
        let mut d = PeriodDetector::new(4, 64);
        let reports = feed(&mut d, &repeat(&step, 40));
        let (at, p) = first_report(&reports).unwrap();
        assert_eq!(p, 4);
        // Within a full sweep of the periods after the second repetition.
        assert!(
            at <= 8 + 64 / PeriodDetector::SWEEP_PER_PUSH + 1,
            "found after {at} ops"
        );
        assert!(reports[at - 1..].iter().all(|r| *r == Some(4)));
    }

    #[test]
    fn periods_out_of_range_are_not_reported() {
        let step: Vec<u64> = (0..50).collect();
        let mut d = PeriodDetector::new(4, 20);
        assert!(feed(&mut d, &repeat(&step, 5)).iter().all(Option::is_none));
        // A period below the minimum shows as its smallest multiple in range.
        let mut d = PeriodDetector::new(4, 100);
        let reports = feed(&mut d, &repeat(&[1, 2, 3], 50));
        assert_eq!(first_report(&reports), Some((12, 6)));
        assert!(reports[11..].iter().all(|r| *r == Some(6)));
    }

    #[test]
    fn a_change_of_program_is_followed() {
        let mut stream = repeat(&[1, 2, 3, 4, 5], 6);
        stream.extend(repeat(&[1, 2, 3, 4, 5, 6, 7], 6));
        let mut d = PeriodDetector::new(4, 100);
        let reports = feed(&mut d, &stream);
        assert_eq!(reports[29], Some(5));
        assert_eq!(*reports.last().unwrap(), Some(7));
        assert!(
            reports[30 + 13..].iter().all(|r| *r == Some(7)),
            "{reports:?}"
        );
    }

    /// A fixed pseudo-random sequence (xorshift64), for the tests' streams.
    fn xorshift(mut state: u64) -> impl FnMut() -> u64 {
        move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        }
    }

    #[test]
    fn the_shortcuts_change_no_report() {
        // Streams of few signatures (stretches of one, batches of two kinds whose size keeps
        // changing, periodic patterns with rare changes): what the shortcuts are for, and where
        // candidates churn. Every push must report what the detector without them reports.
        let mut next = xorshift(0x2545_f491_4f6c_dd1d);
        for round in 0..24 {
            let (mut fast, mut slow) = (PeriodDetector::new(4, 48), PeriodDetector::new(4, 48));
            slow.shortcuts = false;
            let mut stream: Vec<u64> = Vec::new();
            let mut batch = 1;
            while stream.len() < 1500 {
                match round % 3 {
                    0 => {
                        // Criterion's batches: `batch` uploads, `batch` adds, growing now and then.
                        stream.extend(std::iter::repeat_n(1, 2 * batch));
                        stream.extend(std::iter::repeat_n(2, batch));
                        if next().is_multiple_of(4) {
                            batch = batch % 12 + 1;
                        }
                    }
                    1 => {
                        let sig = stream.last().copied().unwrap_or(0);
                        stream.push(if next().is_multiple_of(8) {
                            next() % 3
                        } else {
                            sig
                        });
                    }
                    _ => {
                        let period = 5 + round % 7;
                        let sig = if stream.len() >= period && !next().is_multiple_of(64) {
                            stream[stream.len() - period]
                        } else {
                            next() % 4
                        };
                        stream.push(sig);
                    }
                }
            }
            // Every other round pauses detection now and then, as the recorder does while it
            // verifies steps, and resumes it.
            let mut observing = false;
            for (at, &sig) in stream.iter().enumerate() {
                if round % 2 == 1 && next().is_multiple_of(50) {
                    observing = !observing;
                    if !observing {
                        fast.resume();
                        slow.resume();
                    }
                }
                if observing {
                    fast.observe(sig);
                    slow.observe(sig);
                } else {
                    assert_eq!(fast.push(sig), slow.push(sig), "round {round}, op {at}");
                }
            }
        }
    }

    #[test]
    fn the_period_is_found_past_the_ring_and_with_many_repeated_signatures() {
        // A long step (1000 ops) from only 10 distinct signatures plus one marker, far past the
        // ring's wrap; the period stays found.
        let mut step: Vec<u64> = (0..999).map(|i| (i * 7 % 10) as u64).collect();
        step.push(99);
        // The only unique signature ends the step, so the step's period becomes a candidate
        // through the sweep, within (1500 - 4 + 1) / 8 ops of the second step's start.
        let mut d = PeriodDetector::new(4, 1500);
        let reports = feed(&mut d, &repeat(&step, 12));
        assert_eq!(
            reports[998],
            Some(10),
            "the first step is 10-periodic but for its end"
        );
        // In the second step nothing longer than the layer is reported before the step is:
        // first the step's period (once the sweep proposes it) holds the layer's back. A period
        // that lines the second step up with the first (170) ends at the first step's marker
        // while it holds the report back, and the break it shows lets the layer's period through
        // (see "Which period is reported").
        assert!(
            reports[1000 + 200..1999]
                .iter()
                .all(|r| matches!(r, None | Some(10))),
            "{reports:?}"
        );
        assert!(reports[1999..].iter().all(|r| *r == Some(1000)));
        assert!(d.candidates.len() <= PeriodDetector::MAX_CANDIDATES);
    }

    /// Feeds six repetitions of `step` and checks that its period is reported within the
    /// first four and from then on.
    fn found_again_within_four_steps(d: &mut PeriodDetector, step: &[u64]) {
        let reports = feed(d, &repeat(step, 6));
        let (at, period) = first_report(&reports).expect("the period is found again");
        assert_eq!(period, step.len(), "{reports:?}");
        assert!(at <= 4 * step.len(), "found after {at} ops");
        assert!(
            reports[at - 1..].iter().all(|r| *r == Some(step.len())),
            "{reports:?}"
        );
    }

    #[test]
    fn a_block_inserted_into_a_long_periodic_stream_does_not_hide_its_period() {
        // A long run, a block of other ops, then the same steps again (see "Which period is
        // reported").
        let step: Vec<u64> = (100..150).collect();
        let block: Vec<u64> = (900..937).collect();
        let mut d = PeriodDetector::new(4, 2_000);
        feed(&mut d, &repeat(&step, 60));
        assert_eq!(d.period(), Some(50));
        feed(&mut d, &block);
        found_again_within_four_steps(&mut d, &step);

        // The same after a pause, the old stream only observed (the recorder's way).
        let mut paused = PeriodDetector::new(4, 2_000);
        feed(&mut paused, &repeat(&step, 3));
        for &sig in repeat(&step, 57).iter().chain(&block) {
            paused.observe(sig);
        }
        paused.resume();
        found_again_within_four_steps(&mut paused, &step);
    }

    #[test]
    fn reset_forgets_the_stream() {
        let mut d = PeriodDetector::new(4, 100);
        feed(&mut d, &repeat(&[1, 2, 3, 4, 5], 4));
        assert_eq!(d.period(), Some(5));
        d.reset();
        assert_eq!((d.period(), d.pushed()), (None, 0));
        let reports = feed(&mut d, &repeat(&[7, 8, 9, 10], 3));
        assert_eq!(first_report(&reports), Some((8, 4)));
    }

    #[test]
    fn limits_are_sanitised() {
        assert_eq!(PeriodDetector::new(0, 0).limits(), (1, 1));
        assert_eq!(PeriodDetector::new(10, 3).limits(), (10, 10));
        assert_eq!(PeriodDetector::default().limits(), (4, 100_000));
        let mut d = PeriodDetector::new(1, 1);
        assert_eq!(feed(&mut d, &[5, 5, 5]), vec![None, Some(1), Some(1)]);
    }

    #[test]
    fn signatures_tell_names_and_shapes_apart() {
        let a = op_signature("float_add", [&[2usize, 3][..]]);
        assert_eq!(a, op_signature("float_add", [&[2usize, 3][..]]));
        assert_ne!(a, op_signature("float_sub", [&[2usize, 3][..]]));
        assert_ne!(a, op_signature("float_add", [&[3usize, 2][..]]));
        assert_ne!(
            op_signature("split", [&[2usize, 3][..], &[4][..]]),
            op_signature("split", [&[2usize][..], &[3, 4][..]])
        );
        assert_ne!(op_signature("f", []), op_signature("f", [&[][..]]));
    }

    #[test]
    fn a_measured_run_is_the_longest_periodic_suffix() {
        // Streams over two or three signatures with stretches of one repeated, some longer than
        // the ring: runs of every length, from none past the period to the whole ring (a small
        // one, so the limit is hit).
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
        for round in 0..40 {
            let mut d = PeriodDetector::new(1, 24);
            let mut stream = Vec::new();
            for _ in 0..120 {
                let sticky = match round % 4 {
                    0 => 4,
                    2 => 64,
                    _ => 1,
                };
                // Every fourth stream repeats a short pattern with rare changes: runs longer than
                // the ops `measure_run` compares one by one before it gallops.
                let period = 3 + round % 5;
                let sig = if round % 4 == 3 && stream.len() >= period && !next().is_multiple_of(32)
                {
                    stream[stream.len() - period]
                } else if !next().is_multiple_of(sticky) {
                    stream.last().copied().unwrap_or(0)
                } else {
                    next() % 3
                };
                stream.push(sig);
                d.push(sig);
                let n = stream.len();
                for p in 1..=24.min(n) {
                    let limit = n.min(d.ring - 1);
                    let naive = (p..=limit)
                        .take_while(|&r| (n - r..n - p).all(|i| stream[i] == stream[i + p]))
                        .last()
                        .unwrap_or(p);
                    assert_eq!(d.measure_run(p, p), naive, "period {p} after {n} ops");
                    // From any length known to be periodic.
                    let known = p + (next() as usize) % (naive - p + 1);
                    assert_eq!(d.measure_run(p, known), naive, "period {p} from {known}");
                }
            }
        }
    }

    #[test]
    fn modular_arithmetic_is_reduced() {
        let m1 = MODULUS - 1;
        assert_eq!(mul(m1, m1), 1, "(-1)^2 = 1");
        assert_eq!(mul(m1, 2), MODULUS - 2);
        assert_eq!(add(m1, 1), 0);
        assert!(mix(u64::MAX) < MODULUS);
    }
}
