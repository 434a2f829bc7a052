//! When an op may skip the engine's per-op tracking: memory is ample.
//!
//! Tracking an op (pinning its inputs, indexing its outputs in LRU order with their plan keys,
//! reserving room for its output) is what lets the engine evict and prefetch, and it costs
//! about half a microsecond an op. While the device is far from its budget none of it is used:
//! nothing is evicted and nothing is off the device to bring back. So the engine only lists the
//! tensors an op makes (to index them all at once later) as long as this rule holds before
//! every op, and indexes everything the first time it does not (see
//! `engine::device::ample`).

/// Whether an op may run untracked: nothing is off the device (no spilled or dropped tensor
/// to bring back, no prefetch to place) and the device's committed bytes plus the op's
/// estimated output stay at or under `floor`, the level under which no settle point triggers
/// (the high watermark, or the budget less the plan's largest headroom).
///
/// The estimate is the largest output seen on the device so far, or the op's first input if
/// larger: an op that makes a larger output than any before is the only one that can overshoot,
/// by at most its own output, and the check after it then starts tracking and settles the
/// device as usual.
pub fn stays_ample(off_device: u64, committed: u64, estimate: u64, floor: u64) -> bool {
    off_device == 0 && committed.saturating_add(estimate) <= floor
}

#[cfg(test)]
mod tests {
    use super::stays_ample;

    #[test]
    fn ample_only_with_nothing_off_the_device_and_the_output_under_the_floor() {
        assert!(stays_ample(0, 60, 40, 100), "exactly at the floor is ample");
        assert!(
            !stays_ample(0, 61, 40, 100),
            "one byte over the floor is not"
        );
        assert!(
            !stays_ample(1, 0, 0, 100),
            "a spilled byte needs tracking (prefetch)"
        );
        assert!(
            !stays_ample(0, u64::MAX, 1, u64::MAX - 1),
            "no overflow: a saturated sum is over any floor below the maximum"
        );
    }
}
