//! Where a move runs: on the op's thread, between ops, or handed to a transfer worker.
//!
//! A hand-off costs a wake-up and two context switches; a move measured to take less runs
//! where it is asked for. On a CPU backend most moves are buffer handovers far below that; on
//! a GPU only small tensors are. The engine asks this before each asynchronous move and the
//! dry-run planner's simulation asks it with the moves it simulated, so both place moves alike.

use std::time::Duration;

/// What handing a move to a worker costs at least (a wake-up and two context switches): moves
/// measured to take less (or less than the measured wait for a worker, when that is longer) run
/// on the op's thread, between ops.
pub(crate) const HANDOFF_COST: Duration = Duration::from_micros(20);

/// Moves of a direction measured before their mean time is trusted.
pub(crate) const MEASURED_MOVES: u64 = 16;

/// The moves of one direction so far: how many, their bytes and their time, and the fastest
/// one's time (about the fixed cost of a move).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct MoveHistory {
    pub count: u64,
    pub bytes: u64,
    pub time: Duration,
    pub fastest: Option<Duration>,
}

impl MoveHistory {
    /// Counts one more move.
    pub fn add(&mut self, bytes: u64, took: Duration) {
        self.count += 1;
        self.bytes += bytes;
        self.time += took;
        self.fastest = Some(self.fastest.map_or(took, |fastest| fastest.min(took)));
    }

    /// Seconds per byte beyond each move's fixed cost (taken as the fastest move's time): the
    /// link's bandwidth without its latency, 0 before any move.
    pub fn seconds_per_byte(&self) -> f64 {
        if self.bytes == 0 {
            return 0.0;
        }
        let fixed = self.fastest.unwrap_or_default().as_secs_f64() * self.count as f64;
        (self.time.as_secs_f64() - fixed).max(0.0) / self.bytes as f64
    }
}

/// Whether moving `bytes` in a direction with this `history` is cheaper on the op's thread than
/// handing it to a worker whose measured wake-up takes `handoff_latency`: the mean move, scaled
/// up for a larger one, takes less than the hand-off. Until [`MEASURED_MOVES`] moves are known
/// every move goes to the worker.
pub(crate) fn cheaper_on_op_thread(
    history: MoveHistory,
    bytes: u64,
    handoff_latency: Duration,
) -> bool {
    if history.count < MEASURED_MOVES {
        return false;
    }
    let mean_bytes = (history.bytes / history.count).max(1);
    let scale = (bytes as f64 / mean_bytes as f64).max(1.0);
    let estimate = (history.time / history.count as u32).mul_f64(scale);
    estimate < HANDOFF_COST.max(handoff_latency)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn history(count: u64, bytes: u64, micros: u64) -> MoveHistory {
        MoveHistory {
            count,
            bytes,
            time: Duration::from_micros(micros),
            fastest: None,
        }
    }

    #[test]
    fn the_pace_per_byte_leaves_out_each_move_s_fixed_cost() {
        let mut h = MoveHistory::default();
        assert_eq!(h.seconds_per_byte(), 0.0);
        // 1 KiB in 2 µs and 3 KiB in 4 µs: the fastest move's 2 µs are taken as each one's
        // fixed cost, and the 2 µs left carry 4 KiB (the fastest move's own bytes count as
        // free, so the pace errs low).
        h.add(1 << 10, Duration::from_micros(2));
        h.add(3 << 10, Duration::from_micros(4));
        assert_eq!(h.fastest, Some(Duration::from_micros(2)));
        let per_kib = h.seconds_per_byte() * 1024.0;
        assert!((per_kib - 0.5e-6).abs() < 1e-12, "{per_kib}");
        // Moves that take the same time whatever their size (buffer handovers): no pace.
        let mut handovers = MoveHistory::default();
        handovers.add(1 << 10, Duration::from_micros(1));
        handovers.add(64 << 10, Duration::from_micros(1));
        assert_eq!(handovers.seconds_per_byte(), 0.0);
    }

    #[test]
    fn moves_go_to_the_worker_until_enough_are_measured() {
        let fast = history(MEASURED_MOVES - 1, 1 << 10, 1);
        assert!(!cheaper_on_op_thread(fast, 1, Duration::ZERO));
        let fast = history(MEASURED_MOVES, 1 << 10, 1);
        assert!(cheaper_on_op_thread(fast, 1, Duration::ZERO));
    }

    #[test]
    fn a_move_runs_here_while_its_scaled_mean_is_below_the_handoff() {
        // 16 moves of 1 KiB in 160 µs: 10 µs each.
        let h = history(16, 16 << 10, 160);
        assert!(cheaper_on_op_thread(h, 1 << 10, Duration::ZERO));
        // A smaller move is not assumed cheaper than the mean.
        assert!(cheaper_on_op_thread(h, 1, Duration::ZERO));
        // Twice the mean: 20 µs, not below the 20 µs floor.
        assert!(!cheaper_on_op_thread(h, 2 << 10, Duration::ZERO));
        // A slow wake-up raises the bar.
        assert!(cheaper_on_op_thread(h, 2 << 10, Duration::from_micros(50)));
    }
}
