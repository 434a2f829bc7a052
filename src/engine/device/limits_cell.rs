//! The limits in force, read on every op without taking a lock: each thread keeps the last
//! limits it read with their version, and reads the lock again only when the version changed.

use std::cell::RefCell;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};

use super::Limits;

/// Versions are unique across all engines of the process, so one per-thread copy serves any
/// engine: a copy read from another engine has another version (engines that were never
/// configured share version 0, and the default limits).
static NEXT_VERSION: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The limits this thread read last, and their version.
    static LAST_READ: RefCell<(u64, Limits)> = RefCell::new((0, Limits::default()));
}

/// One engine's limits: written rarely (`configure`), read before and after every op.
#[derive(Debug, Default)]
pub(super) struct LimitsCell {
    limits: RwLock<Limits>,
    /// The version of `limits`, stored after them (a reader that sees a version finds limits
    /// at least as new under the lock).
    version: AtomicU64,
}

impl LimitsCell {
    /// The limits in force.
    pub(super) fn get(&self) -> Limits {
        self.with(|limits| *limits)
    }

    /// Runs `f` on the limits in force, borrowed from this thread's copy: most ops read a
    /// field or two, and copying the whole struct out was a tenth of the engine's work on an op
    /// while memory is ample.
    pub(super) fn with<R>(&self, f: impl FnOnce(&Limits) -> R) -> R {
        let version = self.version.load(Ordering::Acquire);
        let mut f = Some(f);
        // A handle dropped while the thread's locals are torn down reads the lock itself, and
        // so does a call inside another's `f` that finds the copy out of date.
        let borrowed = LAST_READ.try_with(|last| {
            if let Ok(mut seen) = last.try_borrow_mut()
                && seen.0 != version
            {
                *seen = (version, self.read());
            }
            match last.try_borrow() {
                Ok(seen) if seen.0 == version => f.take().map(|f| f(&seen.1)),
                _ => None,
            }
        });
        match borrowed {
            Ok(Some(result)) => result,
            _ => (f.take().expect("`f` runs once"))(&self.read()),
        }
    }

    fn read(&self) -> Limits {
        *self.limits.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Installs new limits.
    pub(super) fn set(&self, limits: Limits) {
        *self.limits.write().unwrap_or_else(|e| e.into_inner()) = limits;
        self.version.store(
            NEXT_VERSION.fetch_add(1, Ordering::Relaxed),
            Ordering::Release,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_sees_new_limits_and_each_engine_its_own() {
        let (a, b) = (LimitsCell::default(), LimitsCell::default());
        assert_eq!(a.get().budget, None);
        a.set(Limits {
            budget: Some(7),
            ..Limits::default()
        });
        assert_eq!(a.get().budget, Some(7));
        assert_eq!(
            b.get().budget,
            None,
            "another engine's limits are not this one's"
        );
        b.set(Limits {
            budget: Some(9),
            ..Limits::default()
        });
        assert_eq!((a.get().budget, b.get().budget), (Some(7), Some(9)));
        a.set(Limits::default());
        assert_eq!(a.get().budget, None, "a change is seen at the next read");
        std::thread::scope(|s| {
            s.spawn(|| assert_eq!(b.get().budget, Some(9), "and on another thread"));
        });
    }

    #[test]
    fn a_read_inside_another_sees_the_limits_in_force() {
        let (a, b) = (LimitsCell::default(), LimitsCell::default());
        let budget = |budget| Limits {
            budget: Some(budget),
            ..Limits::default()
        };
        a.set(budget(1));
        b.set(budget(2));
        let (outer, inner, changed) = a.with(|outer| {
            // The thread's copy is borrowed here: another engine's limits, and this one's
            // after a change, are read from the lock.
            let inner = b.with(|inner| inner.budget);
            a.set(budget(3));
            (outer.budget, inner, a.get().budget)
        });
        assert_eq!(
            (outer, inner, changed),
            (Some(1), Some(2), Some(3)),
            "each read gives its own engine's limits as they are"
        );
        assert_eq!(a.get().budget, Some(3), "and the copy catches up after");
    }
}
