//! The process-wide map from device to its [`DeviceEngine`].
//!
//! Lookups happen for every tensor created by an op, so a thread-local one-entry cache sits in
//! front of the shared map: training loops touch one device per thread almost always.

use std::any::TypeId;
use std::cell::RefCell;
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

static ENGINES: LazyLock<RwLock<HashMap<DeviceKey, Arc<DeviceEngine>>>> =
    LazyLock::new(|| RwLock::new(HashMap::new()));

thread_local! {
    static LAST: RefCell<Option<(DeviceKey, Arc<DeviceEngine>)>> = const { RefCell::new(None) };
}

/// The engine of `key`, created on first use. Engines live for the whole process.
pub fn engine_for(key: DeviceKey) -> Arc<DeviceEngine> {
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        if let Some((cached_key, engine)) = last.as_ref()
            && *cached_key == key
        {
            return engine.clone();
        }
        let engine = lookup_or_insert(key);
        *last = Some((key, engine.clone()));
        engine
    })
}

fn lookup_or_insert(key: DeviceKey) -> Arc<DeviceEngine> {
    // A poisoned lock only means another thread panicked while inserting; the map is still valid.
    if let Some(engine) = ENGINES.read().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return engine.clone();
    }
    ENGINES
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .entry(key)
        .or_default()
        .clone()
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
        assert!(Arc::ptr_eq(&engine_for(key), &engine_for(key)));
        assert!(!Arc::ptr_eq(&engine_for(key), &engine_for(other)));
        // From another thread the cache is cold but the ledger is the same.
        let from_thread = std::thread::spawn(move || engine_for(key)).join().unwrap();
        assert!(Arc::ptr_eq(&engine_for(key), &from_thread));
    }
}
