//! Time windows: a step cut into runs of ops, each checked for whether the bytes the plan moves
//! in it can cross the link in the time its ops compute.
//!
//! The plan is the offline replay of the recorded step under the spill threshold with the
//! configured policy ([`replay_per_op`](super::simulate::replay_per_op)), so the planned
//! resident bytes stay under the threshold by construction. A window whose planned bytes exceed
//! the measured bandwidth times its compute time is saturated: the moves there cannot hide
//! behind compute, and ops will stall however early prefetches start.

use serde::{Deserialize, Serialize};

use super::simulate::Replay;
use super::victim::Bandwidth;
use crate::tape::StepTape;

/// One window of a step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Window {
    /// Index of its first op in the tape.
    pub first_op: u32,
    /// How many ops it spans.
    pub ops: u32,
    /// The ops' measured compute time, in nanoseconds.
    pub compute_ns: u64,
    /// Bytes the plan moves during it (both directions).
    pub planned_bytes: u64,
    /// Bytes the link carries in `compute_ns` at the measured bandwidth.
    pub capacity_bytes: u64,
}

impl Window {
    /// Whether the planned moves exceed what the link carries meanwhile.
    pub fn saturated(&self) -> bool {
        self.planned_bytes > self.capacity_bytes
    }
}

/// Cuts `tape` into windows of `window_ops` ops (at least 1) and checks each against
/// `bandwidth`, given the bytes the plan moves before each op (`moved_per_op`, as long as the
/// tape's ops).
pub fn cut(
    tape: &StepTape,
    moved_per_op: &[u64],
    window_ops: u32,
    bandwidth: Bandwidth,
) -> Vec<Window> {
    let size = window_ops.max(1) as usize;
    tape.ops
        .chunks(size)
        .zip(moved_per_op.chunks(size))
        .enumerate()
        .map(|(i, (ops, moved))| {
            let compute_ns: u64 = ops.iter().map(|op| op.duration_ns).sum();
            let capacity = bandwidth.bytes_per_sec * compute_ns as f64 / 1e9;
            Window {
                first_op: (i * size) as u32,
                ops: ops.len() as u32,
                compute_ns,
                planned_bytes: moved.iter().sum(),
                capacity_bytes: capacity.min(u64::MAX as f64) as u64,
            }
        })
        .collect()
}

/// How busy the link would be over a whole step if every victim were moved: the link time of
/// the moves a `replay` of the step makes (each move's latency, and the bytes at the link's
/// rate) over the `compute_seconds` of its ops, at most 1. A move made while the link is idle
/// overlaps the ops' compute and costs them nothing; one made on a saturated link delays the
/// moves the ops wait for by all its time; in between, it waits behind the others about as
/// often as the link is busy. The drop decision reads it ([`crate::policy::recompute`]).
/// The replay moves what swapping would, so drops do not lower the figure they are decided by.
pub fn link_utilization(replay: &Replay, compute_seconds: f64, link: Bandwidth) -> f64 {
    if replay.moves == 0 {
        return 0.0;
    }
    let busy = replay.bytes_moved() as f64 / link.bytes_per_sec
        + replay.moves as f64 * link.latency.as_secs_f64();
    if compute_seconds > 0.0 {
        (busy / compute_seconds).min(1.0)
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tape::OpRecord;

    fn tape(durations: &[u64]) -> StepTape {
        StepTape {
            ops: durations
                .iter()
                .map(|&duration_ns| OpRecord {
                    name: "op".into(),
                    inputs: vec![],
                    outputs: vec![],
                    start_ns: 0,
                    duration_ns,
                    thread: 1,
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn windows_compare_planned_bytes_with_bandwidth_times_compute() {
        // 1 GB/s = 1 byte per ns.
        let link = Bandwidth {
            bytes_per_sec: 1e9,
            latency: std::time::Duration::ZERO,
        };
        let t = tape(&[100, 100, 50, 50, 10]);
        let w = cut(&t, &[150, 0, 0, 101, 5], 2, link);
        assert_eq!(w.len(), 3);
        assert_eq!((w[0].first_op, w[0].ops, w[0].compute_ns), (0, 2, 200));
        assert_eq!((w[0].planned_bytes, w[0].capacity_bytes), (150, 200));
        assert!(!w[0].saturated());
        assert_eq!((w[1].planned_bytes, w[1].capacity_bytes), (101, 100));
        assert!(w[1].saturated());
        assert_eq!(
            (w[2].ops, w[2].planned_bytes, w[2].capacity_bytes),
            (1, 5, 10)
        );
        assert!(
            cut(&t, &[0; 5], 0, link).len() == 5,
            "a window of 0 ops is one op"
        );
    }

    #[test]
    fn link_utilization_counts_latency_and_bytes_against_compute() {
        // 1 GB/s and 1 us a move: 2 moves of 500 bytes take 1 us of bytes and 2 of latency.
        let link = Bandwidth {
            bytes_per_sec: 1e9,
            latency: std::time::Duration::from_micros(1),
        };
        let replay = Replay {
            bytes_out: 500,
            bytes_in: 500,
            over_budget_ops: 0,
            moves: 2,
        };
        assert!((link_utilization(&replay, 12e-6, link) - 0.25).abs() < 1e-12);
        assert_eq!(link_utilization(&replay, 1e-6, link), 1.0, "saturated");
        assert_eq!(link_utilization(&Replay::default(), 1e-6, link), 0.0);
        assert_eq!(link_utilization(&replay, 0.0, link), 1.0);
    }

    /// The troubleshooting guide's "host bandwidth saturated": a burst of moves before one op
    /// saturates a short window; a longer prefetch window (the knob) spreads it over more
    /// compute, and no window saturates. Bytes that exceed the link over the whole step stay
    /// saturated at any window.
    #[test]
    fn a_longer_window_hides_a_burst_but_not_a_step_beyond_the_link() {
        let link = Bandwidth {
            bytes_per_sec: 1e9,
            latency: std::time::Duration::ZERO,
        };
        let t = tape(&[100; 8]);
        let burst = [0, 0, 0, 500, 0, 0, 0, 0];
        let saturated = |moved: &[u64], window| {
            cut(&t, moved, window, link)
                .iter()
                .filter(|w| w.saturated())
                .count()
        };
        assert_eq!(saturated(&burst, 2), 1);
        assert_eq!(saturated(&burst, 8), 0);
        let beyond = [150; 8]; // 1200 bytes over 800 ns of compute
        assert_eq!(saturated(&beyond, 2), 4);
        assert_eq!(saturated(&beyond, 8), 1);
    }
}
