//! The use plan in force, read several times per op under a budget without taking its lock:
//! each thread keeps the last plan it read with its generation, and reads the lock again only
//! when the generation changed.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::policy::plan::UsePlan;

/// Generations are unique across all engines of the process, so one per-thread copy serves any
/// engine: a plan read from another engine has another generation. (An engine that never had a
/// plan put in force is at generation 0 with no plan, as is the copy before any read.)
static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The plan this thread read last, and its generation. It keeps that plan alive until the
    /// thread reads another: at most one stale plan per thread that ran ops or moves.
    static LAST_READ: RefCell<(Option<Arc<UsePlan>>, u64)> = const { RefCell::new((None, 0)) };
}

/// One engine's use plan: put in force at a step boundary, read around every op.
#[derive(Default)]
pub(super) struct PlanCell {
    plan: RwLock<Option<Arc<UsePlan>>>,
    /// The generation of `plan`, stored under its write lock after it.
    generation: AtomicU64,
}

impl PlanCell {
    /// The plan in force with the generation it was put in force under: what names the plan
    /// a remembered next use came from (see [`NextUseMemo`](crate::policy::plan::NextUseMemo)).
    pub(super) fn get(&self) -> (Option<Arc<UsePlan>>, u64) {
        let generation = self.generation.load(Ordering::Acquire);
        // A handle dropped while the thread's locals are torn down reads the lock itself.
        LAST_READ
            .try_with(|last| {
                let mut last = last.try_borrow_mut().ok()?;
                if last.1 != generation {
                    *last = self.read();
                }
                Some(last.clone())
            })
            .ok()
            .flatten()
            .unwrap_or_else(|| self.read())
    }

    /// The plan and its generation, read together under the lock.
    fn read(&self) -> (Option<Arc<UsePlan>>, u64) {
        let plan = self.plan.read().unwrap_or_else(|e| e.into_inner());
        (plan.clone(), self.generation.load(Ordering::Relaxed))
    }

    /// Puts `plan` in force under a new generation.
    pub(super) fn set(&self, plan: Option<Arc<UsePlan>>) {
        let mut in_force = self.plan.write().unwrap_or_else(|e| e.into_inner());
        *in_force = plan;
        self.generation.store(
            NEXT_GENERATION.fetch_add(1, Ordering::Relaxed),
            Ordering::Release,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::device::test_support::op;
    use crate::tape::StepTape;

    fn a_plan() -> Arc<UsePlan> {
        let tape = StepTape {
            ops: vec![op(Vec::new(), vec![1]), op(vec![1], Vec::new())],
            ..Default::default()
        };
        Arc::new(UsePlan::from_tape(&tape, None))
    }

    #[test]
    fn a_thread_sees_a_new_plan_and_each_engine_its_own() {
        let (a, b) = (PlanCell::default(), PlanCell::default());
        assert!(a.get().0.is_none());
        let plan = a_plan();
        a.set(Some(plan.clone()));
        let (read, generation) = a.get();
        assert!(read.is_some_and(|p| Arc::ptr_eq(&p, &plan)));
        assert!(
            b.get().0.is_none(),
            "another engine's plan is not this one's"
        );
        assert_eq!(a.get().1, generation, "the same plan, the same generation");
        a.set(None);
        let (gone, next) = a.get();
        assert!(gone.is_none(), "a change is seen at the next read");
        assert_ne!(next, generation);
        b.set(Some(plan.clone()));
        std::thread::scope(|s| {
            s.spawn(|| assert!(b.get().0.is_some(), "and on another thread"));
        });
        assert!(a.get().0.is_none());
    }
}
