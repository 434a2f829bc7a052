//! When to give the inner allocator's free pages back to the driver.

use crate::engine::queues::PoolUsage;

/// Whether the pool holds enough more than it uses to be worth a cleanup: returning pages costs
/// their reallocation if the bytes are needed again, so a margin of slack stays.
pub(crate) fn worth_returning_pages(usage: PoolUsage, margin: u64) -> bool {
    usage.reserved.saturating_sub(usage.in_use) > margin
}

/// The margin when the user set none: a tenth of the budget, at least 1 MiB (so that tiny
/// budgets do not clean after every op).
pub(crate) fn default_margin(budget: u64) -> u64 {
    (budget / 10).max(1 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(in_use: u64, reserved: u64) -> PoolUsage {
        PoolUsage {
            in_use,
            reserved,
            queues: 1,
        }
    }

    #[test]
    fn cleans_only_past_the_margin() {
        assert!(!worth_returning_pages(usage(10, 20), 10));
        assert!(worth_returning_pages(usage(10, 21), 10));
        assert!(!worth_returning_pages(usage(30, 20), 0));
    }

    #[test]
    fn default_margin_is_a_tenth_of_the_budget_at_least_one_mib() {
        assert_eq!(default_margin(0), 1 << 20);
        assert_eq!(default_margin(100 << 20), 10 << 20);
    }
}
