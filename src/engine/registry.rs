//! The process-wide map from device to its [`DeviceEngine`].
//!
//! Lookups happen for every tensor created by an op, so a thread-local one-entry cache sits in
//! front of the shared map: training loops touch one device per thread almost always.

use std::any::TypeId;
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, RwLock};

use super::device::DeviceEngine;

/// Identifies one device of one inner backend, without naming Burn types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceKey {
    /// `TypeId` of the inner backend, so two backends sharing a device type stay apart.
    pub backend: TypeId,
    /// The device kind (Burn's `DeviceId::type_id`).
    pub kind: u16,
    /// The device index (Burn's `DeviceId::index_id`).
    pub index: u16,
}

/// Each engine is leaked once, when its device is first used: engines live for the whole
/// process anyway, and a `'static` reference lets every tensor handle and op scope point at its
/// engine without a reference count to raise and lower (two atomic operations per tensor and
/// per op otherwise).
static ENGINES: LazyLock<RwLock<HashMap<DeviceKey, &'static Arc<DeviceEngine>>>> =
    LazyLock::new(|| RwLock::new(HashMap::new()));

thread_local! {
    static LAST: Cell<Option<(DeviceKey, &'static Arc<DeviceEngine>)>> = const { Cell::new(None) };
}

/// The engine of `key`, created on first use. Engines live for the whole process.
pub fn engine_ref(key: DeviceKey) -> &'static Arc<DeviceEngine> {
    // A handle dropped while the thread's locals are torn down looks the engine up itself.
    LAST.try_with(|last| match last.get() {
        Some((cached_key, engine)) if cached_key == key => engine,
        _ => {
            let engine = lookup_or_insert(key);
            last.set(Some((key, engine)));
            engine
        }
    })
    .unwrap_or_else(|_| lookup_or_insert(key))
}

/// The environment variable naming where every device's last recorded step is written at exit.
pub const ENV_TRACE: &str = "BURN_SPILL_TRACE";

fn lookup_or_insert(key: DeviceKey) -> &'static Arc<DeviceEngine> {
    // A poisoned lock only means another thread panicked while inserting; the map is still valid.
    if let Some(engine) = ENGINES.read().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return engine;
    }
    ENGINES
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .entry(key)
        .or_insert_with(|| {
            let engine = Arc::new(DeviceEngine::default());
            if trace_path().is_some() {
                engine.recorder().set_enabled(true);
                install_trace_dump();
            }
            Box::leak(Box::new(engine))
        })
}

fn trace_path() -> Option<std::path::PathBuf> {
    std::env::var_os(ENV_TRACE)
        .filter(|p| !p.is_empty())
        .map(Into::into)
}

fn install_trace_dump() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        #[cfg(unix)]
        // SAFETY: `dump_traces` is a plain `extern "C" fn()` that catches every panic and only
        // touches 'static data.
        unsafe {
            libc::atexit(dump_traces);
        }
    });
}

/// Writes, for every device that recorded a step, its last step as JSON at the trace path, as
/// DOT at `<path>.dot` and as a Perfetto trace at `<path>.perfetto.json`; a second device's
/// files get `.1` before those suffixes, and so on.
extern "C" fn dump_traces() {
    let _ = std::panic::catch_unwind(|| {
        let Some(path) = trace_path() else { return };
        let Ok(engines) = ENGINES.try_read() else {
            return;
        };
        let mut keys: Vec<&DeviceKey> = engines.keys().collect();
        keys.sort_by_key(|k| (k.kind, k.index));
        let tapes = keys
            .into_iter()
            .filter_map(|k| engines[k].recorder().last_step());
        for (n, tape) in tapes.enumerate() {
            let mut base = path.clone().into_os_string();
            if n > 0 {
                base.push(format!(".{n}"));
            }
            let with = |suffix: &str| {
                let mut p = base.clone();
                p.push(suffix);
                std::path::PathBuf::from(p)
            };
            for (file, format) in [
                (
                    std::path::PathBuf::from(base.clone()),
                    crate::tape::TapeFormat::Json,
                ),
                (with(".dot"), crate::tape::TapeFormat::Dot),
                (with(".perfetto.json"), crate::tape::TapeFormat::Perfetto),
            ] {
                if let Err(e) = crate::tape::write_file(&file, &crate::tape::render(&tape, format))
                {
                    tracing::warn!(target: "burn_spill::tape", "{e}");
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_key_same_ledger_other_key_other_ledger() {
        struct A;
        let key = DeviceKey {
            backend: TypeId::of::<A>(),
            kind: 0,
            index: 0,
        };
        let other = DeviceKey { index: 1, ..key };
        assert!(Arc::ptr_eq(engine_ref(key), engine_ref(key)));
        assert!(!Arc::ptr_eq(engine_ref(key), engine_ref(other)));
        // From another thread the cache is cold but the ledger is the same.
        let from_thread = std::thread::spawn(move || engine_ref(key)).join().unwrap();
        assert!(Arc::ptr_eq(engine_ref(key), from_thread));
    }
}
