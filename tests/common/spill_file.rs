//! Spill-file helpers for the disk-tier tests: where a tensor is, its id, a config that sends
//! everything to disk, and finding a tensor's record in the file.

use std::path::Path;

use burn::tensor::Tensor;
use burn_spill::{SpillConfig, Tier};

use super::Spill;

/// The tier holding `t`'s bytes.
pub fn tier(t: &Tensor<Spill, 2>) -> Tier {
    t.clone().into_primitive().tensor().residency()
}

/// `t`'s tensor id, as spill records and panic messages name it.
pub fn id(t: &Tensor<Spill, 2>) -> u64 {
    t.clone().into_primitive().tensor().id()
}

/// The spill file and its bytes, once the transfer workers are idle (an eviction after the last
/// op may still be writing).
pub fn settled_file(device: &burn::tensor::Device<Spill>) -> (std::path::PathBuf, Vec<u8>) {
    // `stats` waits for the workers.
    let _ = Spill::stats(device);
    let file = Spill::spill_file(device).expect("a disk tier");
    let bytes = std::fs::read(&file).unwrap();
    (file, bytes)
}

/// Budget 0, host limit 0: every tensor not used by the running op ends on disk after each op.
pub fn all_to_disk(spill_dir: &Path) -> SpillConfig {
    SpillConfig::default()
        .device_budget_bytes(0)
        .host_limit_bytes(0)
        .spill_dir(spill_dir)
}

/// Finds the one record of tensor `id` in the spill file: (record offset, payload offset,
/// payload length). Layout (src/engine/disk.rs): magic (8) + id (8) + meta length (4) +
/// payload length (8) + payload CRC32 (4) + meta CRC32 (4), then the meta, then the payload.
pub fn find_record(bytes: &[u8], id: u64) -> (usize, usize, usize) {
    let mut key = b"BSPILL01".to_vec();
    key.extend_from_slice(&id.to_le_bytes());
    let hits: Vec<usize> = bytes
        .windows(key.len())
        .enumerate()
        .filter(|(_, w)| *w == key.as_slice())
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        hits.len(),
        1,
        "exactly one record of tensor {id} in the spill file"
    );
    let at = hits[0];
    let meta_len = u32::from_le_bytes(bytes[at + 16..at + 20].try_into().unwrap()) as usize;
    let payload_len = u64::from_le_bytes(bytes[at + 20..at + 28].try_into().unwrap()) as usize;
    let payload = at + 36 + meta_len;
    assert!(
        payload + payload_len <= bytes.len(),
        "the record lies inside the file"
    );
    (at, payload, payload_len)
}
