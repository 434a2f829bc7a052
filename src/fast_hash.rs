//! A few-words hasher for the hot path (tensor ids, op hints, plan keys): one multiply per word
//! spreads counters and small values well enough, where SipHash's setup would cost more than
//! the work. Keys here come from burn-spill itself, never from outside, so flooding is no
//! concern.
//!
//! Why not a crate: hashbrown with its default hasher (foldhash), hashbrown with rustc-hash's
//! `FxHasher`, and std's map with `FxHasher` were each measured against this one in
//! `benches/overhead.rs` (binaries alternated in one sitting), and each was slower with a budget
//! configured: the tiny Transformer's step 1.39-1.42x plain (foldhash), 1.35-1.38x (hashbrown
//! and Fx) and 1.36-1.37x (std and Fx), against 1.30-1.32x here; a 16x16 add +650-770 ns
//! (foldhash) against +500-580 ns. Tensor ids are counters, and `id * odd` probably keeps
//! consecutive ids in consecutive buckets, where the crates' finishers scatter them on purpose.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// One round: rotate, xor the word in, multiply by an odd constant.
pub(crate) fn mix(h: u64, word: u64) -> u64 {
    (h.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95)
}

/// The hasher.
#[derive(Default)]
pub(crate) struct FastHasher(u64);

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = mix(self.0, b as u64);
        }
    }

    fn write_u8(&mut self, value: u8) {
        self.0 = mix(self.0, u64::from(value));
    }

    fn write_u16(&mut self, value: u16) {
        self.0 = mix(self.0, u64::from(value));
    }

    fn write_u32(&mut self, value: u32) {
        self.0 = mix(self.0, u64::from(value));
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = mix(self.0, value);
    }

    fn write_usize(&mut self, value: usize) {
        self.0 = mix(self.0, value as u64);
    }

    fn write_isize(&mut self, value: isize) {
        self.0 = mix(self.0, value as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A `HashMap` with [`FastHasher`].
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// A `HashSet` with [`FastHasher`].
pub(crate) type FastSet<K> = HashSet<K, BuildHasherDefault<FastHasher>>;
