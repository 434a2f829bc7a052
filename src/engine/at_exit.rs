//! Clean-up at normal process exit for what the device registry holds: its statics are never
//! dropped, so the cold stores it owns (a spill directory, a remote store's keys) would outlive
//! the process without an exit hook. A store registers what to do and takes it back when it is
//! dropped normally.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once};

type Action = Box<dyn Fn() + Send>;

/// What to do at exit, by registration.
static ACTIONS: Mutex<Vec<(u64, Action)>> = Mutex::new(Vec::new());
static NEXT: AtomicU64 = AtomicU64::new(0);

/// A registered action; [`cancel`](Self::cancel) takes it back.
#[derive(Debug)]
pub struct AtExit(u64);

impl AtExit {
    /// Runs `action` at normal process exit unless cancelled first. It must not block for long:
    /// exit waits for it.
    pub fn register(action: impl Fn() + Send + 'static) -> Self {
        static HOOK: Once = Once::new();
        HOOK.call_once(install_exit_hook);
        let token = NEXT.fetch_add(1, Ordering::Relaxed);
        ACTIONS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((token, Box::new(action)));
        Self(token)
    }

    /// Takes the action back (its owner did the clean-up itself).
    pub fn cancel(&self) {
        ACTIONS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(token, _)| *token != self.0);
    }
}

extern "C" fn run_actions() {
    let _ = std::panic::catch_unwind(|| {
        // At exit another thread may hold the lock forever; skip rather than hang.
        if let Ok(actions) = ACTIONS.try_lock() {
            for (_, action) in actions.iter() {
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(action));
            }
        }
    });
}

#[cfg(unix)]
fn install_exit_hook() {
    // SAFETY: `run_actions` is a plain `extern "C" fn()` that catches every panic and only
    // touches 'static data.
    unsafe {
        libc::atexit(run_actions);
    }
}

#[cfg(not(unix))]
fn install_exit_hook() {
    // Without atexit what the stores leave is cleaned by the OS (temp dirs) or expires (keys);
    // stores dropped normally still clean up after themselves.
    let _ = run_actions;
}
