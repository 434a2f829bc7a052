//! Counters that only grow, kept per thread: each thread adds to its own copy with a plain
//! load and store, and a reader sums the copies.
//!
//! A shared atomic counter costs a locked read-modify-write on every add (about 5 ns here even
//! uncontended, and more when another thread's core holds the line). Counts added on every
//! tensor made and dropped (tensors created and released) are the engine's commonest such
//! adds, and no decision reads them: they are statistics. Counts a decision reads at once (the
//! bytes in a tier, checked against a limit after every op) stay shared atomics.
//!
//! Each thread that adds takes a numbered place once, for the life of the process; the first
//! [`PLACES`] threads add to their own copies and any later one to a shared overflow copy (with
//! a locked add, as before). Training runs its ops on a handful of long-lived threads. (The
//! `thread_local` crate's `ThreadLocal` does the general job, but its lookup cost 28 to 44
//! instructions per add here, measured with callgrind, where this costs about 8.)

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Threads with a copy of their own.
pub const PLACES: usize = 32;

/// The places taken so far (past `PLACES`, threads use the overflow copy).
static PLACES_TAKEN: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's place (`usize::MAX` until it first adds).
    static PLACE: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// The calling thread's place, taken on its first call.
#[inline]
fn place() -> usize {
    PLACE.with(|place| {
        let mut at = place.get();
        if at == usize::MAX {
            at = PLACES_TAKEN.fetch_add(1, Ordering::Relaxed);
            place.set(at);
        }
        at
    })
}

/// `N` counters, each a sum over the threads that added to it.
#[derive(Debug)]
pub struct ThreadCounts<const N: usize> {
    copies: Box<[Copy<N>; PLACES]>,
    /// Shared by the threads past the first `PLACES`.
    overflow: Copy<N>,
}

/// One thread's copy, on a cache line of its own so that threads never share one.
#[derive(Debug)]
#[repr(align(64))]
struct Copy<const N: usize>([AtomicU64; N]);

impl<const N: usize> Default for Copy<N> {
    fn default() -> Self {
        Self(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl<const N: usize> Default for ThreadCounts<N> {
    fn default() -> Self {
        Self {
            copies: Box::new(std::array::from_fn(|_| Copy::default())),
            overflow: Copy::default(),
        }
    }
}

impl<const N: usize> ThreadCounts<N> {
    /// Adds `value` to counter `i`, on the calling thread's copy.
    #[inline]
    pub fn add(&self, i: usize, value: u64) {
        match self.copies.get(place()) {
            Some(copy) => {
                // Only this thread writes its copy, so a load and a store add without a lost
                // update; the atomic type is for the readers on other threads.
                let counter = &copy.0[i];
                let now = counter.load(Ordering::Relaxed);
                counter.store(now.wrapping_add(value), Ordering::Relaxed);
            }
            None => {
                self.overflow.0[i].fetch_add(value, Ordering::Relaxed);
            }
        }
    }

    /// Counter `i`'s sum over the threads. An add racing with the read may or may not be in
    /// it, as with a shared counter read a moment earlier or later.
    pub fn total(&self, i: usize) -> u64 {
        let taken = PLACES_TAKEN.load(Ordering::Relaxed).min(PLACES);
        self.copies[..taken]
            .iter()
            .chain(std::iter::once(&self.overflow))
            .map(|copy| copy.0[i].load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_on_many_threads_sum_and_outlive_their_threads() {
        let counts = ThreadCounts::<2>::default();
        counts.add(0, 1);
        counts.add(1, 10);
        // More threads than places: the later ones share the overflow copy.
        std::thread::scope(|scope| {
            for _ in 0..PLACES + 8 {
                scope.spawn(|| {
                    for _ in 0..1000 {
                        counts.add(0, 1);
                    }
                    counts.add(1, 5);
                });
            }
        });
        let threads = (PLACES + 8) as u64;
        assert_eq!(
            (counts.total(0), counts.total(1)),
            (1 + 1000 * threads, 10 + 5 * threads)
        );
    }
}
