//! Hashing on the hot path (tensor ids, op hints, plan keys, op signatures): hashbrown's maps
//! with foldhash. The seed is fixed, so that where two entries tie (victims of equal rank), the
//! same one comes first in every run of a program. Keys come from burn-spill itself, never from
//! outside, so hash flooding is no concern.

use std::hash::BuildHasher;

pub(crate) use foldhash::fast::FoldHasher;

type FixedState = foldhash::fast::FixedState;

/// A map keyed by burn-spill's own ids and keys.
pub(crate) type FastMap<K, V> = hashbrown::HashMap<K, V, FixedState>;

/// A set of burn-spill's own ids.
pub(crate) type FastSet<K> = hashbrown::HashSet<K, FixedState>;

/// A hasher for a few words (an op's name and size hints, a signature).
pub(crate) fn hasher() -> FoldHasher<'static> {
    FixedState::default().build_hasher()
}
