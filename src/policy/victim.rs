//! The victim policies: which resident tensors leave a tier first.
//!
//! Each policy turns what is known of a candidate into a rank; the engine evicts in ascending
//! rank order (ties by least recent use). Without a plan every next use is
//! [`NextUse::Unknown`] and every policy ranks like LRU.

use std::time::Duration;

use super::PolicyKind;
use super::plan::NextUse;
use crate::engine::TensorId;

/// What the policy may know of one candidate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// The tensor.
    pub id: TensorId,
    /// Its bytes.
    pub bytes: u64,
    /// The engine's clock at its last use (larger = more recent).
    pub last_use: u64,
    /// How far away its next use is.
    pub next_use: NextUse,
    /// What rebuilding it would cost the ops, when it may be dropped instead of moved (under
    /// [`RecomputeMode::Both`](super::RecomputeMode::Both)): `CostAware` weighs the cheaper of
    /// the two ways back.
    pub rebuild: Option<Duration>,
}

/// Measured cost of bringing bytes back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bandwidth {
    /// Bytes per second of the restore direction.
    pub bytes_per_sec: f64,
    /// Fixed cost of one transfer (call, allocation, synchronisation).
    pub latency: Duration,
}

impl Bandwidth {
    /// Assumed before anything moved: a PCIe-class host link.
    pub const HOST_DEFAULT: Bandwidth = Bandwidth {
        bytes_per_sec: 10e9,
        latency: Duration::from_micros(10),
    };
    /// Assumed before anything moved: an NVMe-class disk.
    pub const DISK_DEFAULT: Bandwidth = Bandwidth {
        bytes_per_sec: 1e9,
        latency: Duration::from_micros(50),
    };

    /// Bandwidth measured from `bytes` moved in `time`, or `fallback` before enough moved to
    /// tell (a few KiB in a few microseconds says little).
    pub fn measured(bytes: u64, time: Duration, fallback: Bandwidth) -> Bandwidth {
        if bytes < (1 << 20) || time.is_zero() {
            return fallback;
        }
        Bandwidth {
            bytes_per_sec: bytes as f64 / time.as_secs_f64(),
            latency: fallback.latency,
        }
    }

    /// Seconds to bring `bytes` back.
    pub fn seconds(&self, bytes: u64) -> f64 {
        self.latency.as_secs_f64() + bytes as f64 / self.bytes_per_sec
    }
}

/// A victim policy.
pub trait VictimPolicy {
    /// The candidate's rank: lower leaves first.
    fn rank(&self, candidate: &Candidate) -> f64;
}

/// Least recently used first.
#[derive(Debug, Clone, Copy, Default)]
pub struct Lru;

impl VictimPolicy for Lru {
    fn rank(&self, c: &Candidate) -> f64 {
        c.last_use as f64
    }
}

/// Furthest next use first (Belady's rule); unknown next uses count as `unknown` ops away.
#[derive(Debug, Clone, Copy)]
pub struct NextUsePolicy {
    /// Distance assumed for a tensor the plan cannot place (one step is a good guess).
    pub unknown: u32,
}

impl VictimPolicy for NextUsePolicy {
    fn rank(&self, c: &Candidate) -> f64 {
        -f64::from(c.next_use.distance_or(self.unknown))
    }
}

/// Lowest `cost to bring back / (bytes x distance to next use)` first: big tensors used late
/// are cheap to have away per byte freed; small tensors pay the per-transfer latency. The cost
/// to bring back is the cheaper of a restore and, for a tensor that may be dropped, a rebuild.
#[derive(Debug, Clone, Copy)]
pub struct CostAware {
    /// Distance assumed for a tensor the plan cannot place.
    pub unknown: u32,
    /// Cost of bringing a tensor back.
    pub bandwidth: Bandwidth,
}

impl VictimPolicy for CostAware {
    fn rank(&self, c: &Candidate) -> f64 {
        let distance = c.next_use.distance_or(self.unknown);
        if distance == u32::MAX {
            return 0.0;
        }
        let freed = c.bytes.max(1) as f64 * f64::from(distance.max(1));
        let moved = self.bandwidth.seconds(c.bytes);
        let back = c.rebuild.map_or(moved, |r| moved.min(r.as_secs_f64()));
        back / freed
    }
}

/// The policy in force, matched once per pass rather than called through a pointer for each
/// candidate (a pass ranks every resident tensor).
enum Ranking {
    Lru(Lru),
    NextUse(NextUsePolicy),
    CostAware(CostAware),
}

impl Ranking {
    fn rank(&self, c: &Candidate) -> f64 {
        match self {
            Ranking::Lru(policy) => policy.rank(c),
            Ranking::NextUse(policy) => policy.rank(c),
            Ranking::CostAware(policy) => policy.rank(c),
        }
    }
}

/// Orders `candidates` for eviction under `kind`. With `plan_len` `None` (no plan) every policy
/// is LRU. The reference [`first_in_order`] is tested against (which is what the engine and the
/// replay use: they need only the front of the order).
#[cfg(test)]
pub fn order(
    kind: PolicyKind,
    plan_len: Option<u32>,
    bandwidth: Bandwidth,
    candidates: &mut [Candidate],
) {
    let Some(len) = plan_len else {
        return sort_by(&Lru, candidates);
    };
    match kind {
        PolicyKind::Lru => sort_by(&Lru, candidates),
        PolicyKind::NextUse => sort_by(&NextUsePolicy { unknown: len }, candidates),
        PolicyKind::CostAware => sort_by(
            &CostAware {
                unknown: len,
                bandwidth,
            },
            candidates,
        ),
    }
}

/// The first candidates in `kind`'s order (the tests' `order` sorts them all) whose bytes reach
/// `want`, at least one if any, and their bytes. Ranks are computed once, and only the front of
/// the order is sorted: the engine asks for a few victims among hundreds of resident tensors on
/// every op.
pub fn first_in_order(
    kind: PolicyKind,
    plan_len: Option<u32>,
    bandwidth: Bandwidth,
    candidates: &[Candidate],
    want: u64,
) -> (Vec<TensorId>, u64) {
    let ranking = match (plan_len, kind) {
        (None, _) | (Some(_), PolicyKind::Lru) => Ranking::Lru(Lru),
        (Some(len), PolicyKind::NextUse) => Ranking::NextUse(NextUsePolicy { unknown: len }),
        (Some(len), PolicyKind::CostAware) => Ranking::CostAware(CostAware {
            unknown: len,
            bandwidth,
        }),
    };
    let mut keyed: Vec<(f64, u64, TensorId, u64)> = candidates
        .iter()
        .map(|c| (ranking.rank(c), c.last_use, c.id, c.bytes))
        .collect();
    let cmp = |a: &(f64, u64, TensorId, u64), b: &(f64, u64, TensorId, u64)| {
        a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2))
    };
    let n = keyed.len();
    let mut front = n.min(8);
    loop {
        if front < n {
            keyed.select_nth_unstable_by(front, cmp);
        }
        keyed[..front].sort_unstable_by(cmp);
        let mut bytes = 0u64;
        let mut picked = Vec::new();
        for k in &keyed[..front] {
            if bytes >= want && !picked.is_empty() {
                return (picked, bytes);
            }
            bytes += k.3;
            picked.push(k.2);
        }
        if front == n || bytes >= want {
            return (picked, bytes);
        }
        front = n.min(front * 4);
    }
}

/// Which resident tensors an eviction pass may take, besides those a running op has pinned.
/// `P` is how the caller counts positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takes<P> {
    /// Any: room for the op being admitted, whose inputs are pinned.
    Any,
    /// Any but those the op about to run reads ([`read_by_next_op`]): a pass between ops.
    AllButNextOp,
    /// Any but those the op about to run reads or the ops up to position `P` read: a pass
    /// between ops that makes room for the ops up to `P` (a settle, with a plan). Such a
    /// tensor comes back before those ops are done: its eviction makes room for them only
    /// until its own use, and costs a round trip on a link that the settle's other moves keep
    /// busy, so that its use waits for its copy out and back in. Without it, a settle whose
    /// ops' room is most of the budget (a lookahead of hundreds of ops) sends out every tensor
    /// but the next op's: on the GPT-125M at 25% of its peak, a residual read two ops later
    /// waited 27 ms behind the forward's evictions (`docs/planner.md`, "A settle spares what
    /// its own ops read").
    AllButReadUntil(P),
    /// Only those next used after position `P` (or never, or at no known position), and never
    /// those [`needed_soon`]: room for a prefetch, or for the next ops.
    UsedAfter(P),
}

impl<P: Copy> Takes<P> {
    /// The position a victim's next use must be after, if any.
    pub fn beyond(self) -> Option<P> {
        match self {
            Takes::UsedAfter(beyond) | Takes::AllButReadUntil(beyond) => Some(beyond),
            Takes::Any | Takes::AllButNextOp => None,
        }
    }

    /// Whether tensors needed soon are taken once the others fall short.
    pub fn takes_soon(self) -> bool {
        !matches!(self, Takes::UsedAfter(_))
    }

    /// Whether a tensor next used at `next_use` is left alone for the op about to run.
    pub fn spares(self, next_use: NextUse) -> bool {
        matches!(self, Takes::AllButNextOp | Takes::AllButReadUntil(_)) && read_by_next_op(next_use)
    }
}

/// Whether a resident tensor is read by the op at the position the engine is at (between ops,
/// the op about to run). A pass between ops never takes one ([`Takes::AllButNextOp`]): that op
/// brings it back before it runs, so moving it out lowers no peak (an op holds its inputs on the
/// device while it runs) and costs a round trip; Belady's MIN evicts only what the op about to
/// run does not read. This matters before an op that needs more than the budget by itself: no
/// eviction can make its room, and one that takes its inputs only makes it wait for them. The
/// pass that admits an op leaves its inputs alone by their pins instead, which hold whatever
/// the plan says.
pub fn read_by_next_op(next_use: NextUse) -> bool {
    next_use == NextUse::In(0)
}

/// Whether a resident tensor is needed soon: within the prefetch `window` plus the `lead` it
/// earned, or brought back for a use that has not come yet. Such tensors leave only when
/// nothing else is left ([`pick`]). The lead is asked for only when it decides: a victim pass
/// asks this of every resident tensor, and a lead is a map lookup.
pub fn needed_soon(
    prefetched: bool,
    next_use: NextUse,
    window: u32,
    lead: impl FnOnce() -> u32,
) -> bool {
    prefetched
        || match next_use {
            NextUse::In(d) if d <= window => true,
            NextUse::In(d) => d <= window.saturating_add(lead()),
            NextUse::Never | NextUse::Unknown => false,
        }
}

/// The candidates of one pass, by how readily they leave.
#[derive(Debug, Default)]
pub struct Classes {
    /// Not needed soon: they leave first, in the policy's order.
    pub later: Vec<Candidate>,
    /// The step's state, under a behaviour that keeps it on the device
    /// ([`Behaviour::keeps_state`](super::recompute::Behaviour::keeps_state)), needed soon or
    /// not: they leave last, and only for a pass that takes `soon` too (never for a
    /// prefetch's room or ahead of the next ops).
    pub kept: Vec<Candidate>,
    /// Needed soon ([`needed_soon`]): they leave last, and only when the pass takes them.
    pub soon: Vec<Candidate>,
}

/// The victims that free `want` bytes: the first of `classes.later` in `kind`'s order, then,
/// when those fall short and `takes` takes tensors needed soon, the first of `classes.soon`,
/// then of `classes.kept`.
pub fn pick<P: Copy>(
    kind: PolicyKind,
    plan_len: Option<u32>,
    bandwidth: Bandwidth,
    classes: &Classes,
    want: u64,
    takes: Takes<P>,
) -> Vec<TensorId> {
    let (mut picked, mut taken) = first_in_order(kind, plan_len, bandwidth, &classes.later, want);
    let short = |picked: &[TensorId], taken: u64| taken < want || picked.is_empty();
    if takes.takes_soon() && short(&picked, taken) {
        let rest = want - taken.min(want);
        let (more, bytes) = first_in_order(kind, plan_len, bandwidth, &classes.soon, rest);
        picked.extend(more);
        taken += bytes;
    }
    if takes.takes_soon() && short(&picked, taken) && !classes.kept.is_empty() {
        let rest = want - taken.min(want);
        picked.extend(first_in_order(kind, plan_len, bandwidth, &classes.kept, rest).0);
    }
    picked
}

#[cfg(test)]
fn sort_by(policy: &impl VictimPolicy, candidates: &mut [Candidate]) {
    candidates.sort_by(|a, b| {
        policy
            .rank(a)
            .total_cmp(&policy.rank(b))
            .then(a.last_use.cmp(&b.last_use))
            .then(a.id.cmp(&b.id))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(id: u64, bytes: u64, last_use: u64, next_use: NextUse) -> Candidate {
        Candidate {
            id,
            bytes,
            last_use,
            next_use,
            rebuild: None,
        }
    }

    fn ids(kind: PolicyKind, plan: Option<u32>, mut cs: Vec<Candidate>) -> Vec<u64> {
        order(kind, plan, Bandwidth::HOST_DEFAULT, &mut cs);
        cs.iter().map(|c| c.id).collect()
    }

    #[test]
    fn needed_soon_is_within_the_window_plus_the_lead_which_is_asked_only_past_the_window() {
        let unasked = || -> u32 { panic!("the lead decides nothing here") };
        assert!(
            needed_soon(false, NextUse::In(4), 4, unasked),
            "at the window's edge"
        );
        assert!(
            needed_soon(true, NextUse::Never, 4, unasked),
            "brought back, not yet read"
        );
        assert!(!needed_soon(false, NextUse::Never, 4, unasked));
        assert!(!needed_soon(false, NextUse::Unknown, 4, unasked));
        assert!(
            needed_soon(false, NextUse::In(6), 4, || 2),
            "within its lead"
        );
        assert!(
            !needed_soon(false, NextUse::In(7), 4, || 2),
            "past its lead"
        );
        assert!(
            needed_soon(false, NextUse::In(u32::MAX), u32::MAX - 1, || u32::MAX),
            "the window plus the lead saturates"
        );
    }

    #[test]
    fn without_a_plan_every_policy_is_lru() {
        let cs = vec![
            c(1, 10, 5, NextUse::Unknown),
            c(2, 10, 1, NextUse::Unknown),
            c(3, 10, 3, NextUse::Unknown),
        ];
        for kind in [PolicyKind::Lru, PolicyKind::NextUse, PolicyKind::CostAware] {
            assert_eq!(ids(kind, None, cs.clone()), vec![2, 3, 1], "{kind}");
        }
    }

    #[test]
    fn next_use_evicts_the_furthest_first_and_never_before_all() {
        let cs = vec![
            c(1, 10, 1, NextUse::In(2)),
            c(2, 10, 2, NextUse::In(9)),
            c(3, 10, 3, NextUse::Never),
            c(4, 10, 4, NextUse::Unknown),
        ];
        assert_eq!(
            ids(PolicyKind::NextUse, Some(5), cs.clone()),
            vec![3, 2, 4, 1]
        );
        assert_eq!(ids(PolicyKind::Lru, Some(5), cs), vec![1, 2, 3, 4]);
    }

    #[test]
    fn cost_aware_prefers_big_late_tensors_over_small_ones() {
        // Same distance: the 1 MiB tensor frees more per microsecond of latency than 1 KiB.
        let cs = vec![
            c(1, 1 << 10, 1, NextUse::In(10)),
            c(2, 1 << 20, 2, NextUse::In(10)),
            c(3, 1 << 20, 3, NextUse::In(2)),
            c(4, 16, 4, NextUse::Never),
        ];
        assert_eq!(ids(PolicyKind::CostAware, Some(20), cs), vec![4, 2, 3, 1]);
    }

    #[test]
    fn cost_aware_score_is_cost_over_bytes_times_distance() {
        let policy = CostAware {
            unknown: 100,
            bandwidth: Bandwidth {
                bytes_per_sec: 1e6,
                latency: Duration::from_millis(1),
            },
        };
        // cost = 1 ms + 1000 B / 1e6 B/s = 2 ms; over 1000 B x 4 ops.
        let score = policy.rank(&c(1, 1000, 0, NextUse::In(4)));
        assert!((score - 0.002 / 4000.0).abs() < 1e-15, "{score}");
        let unknown = policy.rank(&c(1, 1000, 0, NextUse::Unknown));
        assert!((unknown - 0.002 / 100_000.0).abs() < 1e-15, "{unknown}");
    }

    #[test]
    fn cost_aware_weighs_the_cheaper_of_a_restore_and_a_rebuild() {
        // 1 MiB at 10 GB/s plus 10 us: about 115 us back by the link.
        let later = c(1, 1 << 20, 1, NextUse::In(20));
        let sooner = |rebuild: Option<Duration>| Candidate {
            rebuild,
            ..c(2, 1 << 20, 2, NextUse::In(10))
        };
        let order = |kind, rebuild| ids(kind, Some(30), vec![later, sooner(rebuild)]);
        assert_eq!(order(PolicyKind::CostAware, None), vec![1, 2]);
        // Rebuilt in 5 us, the sooner one is cheaper to have away.
        let cheap = Some(Duration::from_micros(5));
        assert_eq!(order(PolicyKind::CostAware, cheap), vec![2, 1]);
        // A rebuild dearer than the link changes nothing; the other policies never weigh it.
        let dear = Some(Duration::from_secs(1));
        assert_eq!(order(PolicyKind::CostAware, dear), vec![1, 2]);
        assert_eq!(order(PolicyKind::NextUse, cheap), vec![1, 2]);
    }

    #[test]
    fn the_front_of_the_order_matches_the_full_sort() {
        // Pseudo-random candidates: ranks tie often, sizes vary.
        let cs: Vec<Candidate> = (0..200u64)
            .map(|i| {
                let next_use = match i % 5 {
                    0 => NextUse::Never,
                    1 => NextUse::Unknown,
                    _ => NextUse::In(((i * 37) % 50) as u32),
                };
                c(i, 1 + (i * 7919) % 5000, (i * 104729) % 97, next_use)
            })
            .collect();
        for kind in [PolicyKind::Lru, PolicyKind::NextUse, PolicyKind::CostAware] {
            for plan in [None, Some(60)] {
                let mut sorted = cs.clone();
                order(kind, plan, Bandwidth::HOST_DEFAULT, &mut sorted);
                for want in [0, 1, 4000, 50_000, 400_000, u64::MAX] {
                    let mut expected = Vec::new();
                    let mut bytes = 0;
                    for c in &sorted {
                        if bytes >= want && !expected.is_empty() {
                            break;
                        }
                        bytes += c.bytes;
                        expected.push(c.id);
                    }
                    let (got, got_bytes) =
                        first_in_order(kind, plan, Bandwidth::HOST_DEFAULT, &cs, want);
                    assert_eq!(got, expected, "{kind} {plan:?} want {want}");
                    assert_eq!(got_bytes, bytes);
                }
            }
        }
        let none = first_in_order(PolicyKind::Lru, None, Bandwidth::HOST_DEFAULT, &[], 5);
        assert_eq!(none, (Vec::new(), 0));
    }

    #[test]
    fn measured_bandwidth_needs_enough_bytes() {
        let fallback = Bandwidth::HOST_DEFAULT;
        assert_eq!(
            Bandwidth::measured(10, Duration::from_nanos(1), fallback),
            fallback
        );
        let m = Bandwidth::measured(4 << 20, Duration::from_millis(2), fallback);
        assert!((m.bytes_per_sec - (4 << 20) as f64 / 0.002).abs() < 1.0);
    }
}
