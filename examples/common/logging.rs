//! burn-spill logs through `tracing` (targets under `burn_spill::`) and installs no subscriber
//! itself, so a program that installs none hears nothing, not even that an op ran over its
//! budget. The examples install one: warnings and errors on stderr by default, and whatever
//! `RUST_LOG` asks for (`RUST_LOG=burn_spill=debug` shows every move, `burn_spill::tape=debug`
//! the tape's divergences).

use tracing_subscriber::EnvFilter;

/// Installs a subscriber writing to stderr, filtered by `RUST_LOG` (default: `warn`). A bad
/// filter is reported and the default used.
pub fn install() {
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.trim().is_empty() => EnvFilter::try_new(&spec).unwrap_or_else(|e| {
            eprintln!("note: RUST_LOG={spec} is not a filter ({e}); logging warnings only");
            EnvFilter::new("warn")
        }),
        _ => EnvFilter::new("warn"),
    };
    // Another subscriber already installed (a test harness) is left in place.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
