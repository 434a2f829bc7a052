//! The cold tier's interface: where spilled bytes go past the host limit.
//!
//! A cold store keeps records of tensors' bytes, each with the tensor's id, its dtype/shape
//! description and a CRC32 of the payload, all checked when the record is read back. The spill
//! file ([`super::disk::DiskStore`]) is one implementation. Each record belongs to this process
//! alone (it is written, read and freed by the engine of one device), so no store needs a
//! coherence protocol beyond owning its records, expiring what a dead process left and cleaning
//! up on exit.

use std::io;
use std::time::Duration;

use super::slot::TensorId;

/// Which cold store holds a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ColdTier {
    /// The local spill file.
    Disk,
    /// A remote store.
    Remote,
}

/// Where one tensor's bytes are in a cold store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColdRecord {
    /// The store holding it.
    pub tier: ColdTier,
    /// The record's place in its store (the spill file: the byte offset of its header).
    pub offset: u64,
    /// The store's units it takes (the spill file: header + meta + payload bytes).
    pub extent: u64,
    /// Payload length.
    pub payload_len: u64,
    /// CRC32 of the payload, also stored with the record.
    pub crc: u32,
}

/// Why a record could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum ColdReadError {
    /// The store failed the read.
    #[error("read failed: {0}")]
    Io(#[from] io::Error),
    /// The bytes in the store are not what was written.
    #[error("record is corrupted: {0}")]
    Corrupt(String),
}

/// Bytes moved and the time they took, per direction, as a store measured them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ColdThroughput {
    /// Records written.
    pub writes: u64,
    /// Records read.
    pub reads: u64,
    /// Payload bytes written.
    pub written: u64,
    /// Time the writes took.
    pub write_time: Duration,
    /// Payload bytes read.
    pub read: u64,
    /// Time the reads took.
    pub read_time: Duration,
}

impl ColdThroughput {
    /// Counts a write of `bytes` that took `took`.
    pub fn on_write(&mut self, bytes: u64, took: Duration) {
        self.writes += 1;
        self.written += bytes;
        self.write_time += took;
    }

    /// Counts a read of `bytes` that took `took`.
    pub fn on_read(&mut self, bytes: u64, took: Duration) {
        self.reads += 1;
        self.read += bytes;
        self.read_time += took;
    }
}

/// The first bytes of every record's header.
pub const MAGIC: [u8; 8] = *b"BSPILL01";
/// magic (8) + id (8) + meta length (4) + payload length (8) + payload CRC32 (4) + meta CRC32 (4)
pub const HEADER_LEN: usize = 36;

/// A record's header, the same in every store: magic, tensor id, the lengths, the payload's
/// CRC32 and the description's, then the description (dtype and shape) itself.
pub fn record_header(id: TensorId, meta: &[u8], payload_len: u64, crc: u32) -> Vec<u8> {
    let mut head = Vec::with_capacity(HEADER_LEN + meta.len());
    head.extend_from_slice(&MAGIC);
    head.extend_from_slice(&id.to_le_bytes());
    head.extend_from_slice(&(meta.len() as u32).to_le_bytes());
    head.extend_from_slice(&payload_len.to_le_bytes());
    head.extend_from_slice(&crc.to_le_bytes());
    head.extend_from_slice(&crc32fast::hash(meta).to_le_bytes());
    head.extend_from_slice(meta);
    head
}

/// Checks a header read back against the record it should be: tensor `id` with description
/// `meta`, and `record`'s payload length and CRC32. `into_len` is the buffer the payload is to
/// be read into.
pub fn check_header(
    head: &[u8],
    record: &ColdRecord,
    id: TensorId,
    meta: &[u8],
    into_len: usize,
) -> Result<(), ColdReadError> {
    let corrupt = |what: String| Err(ColdReadError::Corrupt(what));
    if head.len() < HEADER_LEN || head[..8] != MAGIC {
        return corrupt("bad magic".into());
    }
    let u64_at = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().expect("8 bytes"));
    let u32_at = |at: usize| u32::from_le_bytes(head[at..at + 4].try_into().expect("4 bytes"));
    if u64_at(8) != id {
        return corrupt(format!("header names tensor {}", u64_at(8)));
    }
    if u32_at(16) as usize != meta.len()
        || u32_at(32) != crc32fast::hash(meta)
        || &head[HEADER_LEN..] != meta
    {
        return corrupt("dtype/shape description differs from the tensor's".into());
    }
    if u64_at(20) != record.payload_len || u32_at(28) != record.crc {
        return corrupt("length or checksum in the header differs from what was written".into());
    }
    if into_len as u64 != record.payload_len {
        return corrupt(format!(
            "the tensor needs {into_len} bytes, the record holds {}",
            record.payload_len
        ));
    }
    Ok(())
}

/// Checks the CRC32 of a payload read back against the one written.
pub fn check_payload(crc: u32, record: &ColdRecord) -> Result<(), ColdReadError> {
    if crc == record.crc {
        return Ok(());
    }
    Err(ColdReadError::Corrupt(format!(
        "payload CRC32 {crc:#010x}, expected {:#010x}",
        record.crc
    )))
}

/// A store for spilled bytes past the host tier.
pub trait ColdStore: Send {
    /// Writes one record and returns where it is. On error nothing is kept.
    fn write(&mut self, id: TensorId, meta: &[u8], payload: &[u8]) -> io::Result<ColdRecord>;

    /// Reads `record` into `payload` (exactly its length), checking that it is the record of
    /// `id` with description `meta` and that the payload's CRC32 matches what was written.
    fn read_into(
        &self,
        record: &ColdRecord,
        id: TensorId,
        meta: &[u8],
        payload: &mut [u8],
    ) -> Result<(), ColdReadError>;

    /// Frees a record.
    fn free(&mut self, record: &ColdRecord);

    /// Records held now.
    fn records(&self) -> usize;

    /// Bytes the store holds for them now (payloads and their descriptions).
    fn bytes_used(&self) -> u64;

    /// What its writes and reads moved, and how long they took.
    fn throughput(&self) -> ColdThroughput;

    /// Where `record` is, for messages: a file and an offset, a server and a key.
    fn locate(&self, record: &ColdRecord) -> String;

    /// The store itself, for messages: the spill file's path, the server's address.
    fn describe(&self) -> String;

    /// Test hook: the next `n` writes fail as a full store would.
    fn fail_next_writes(&mut self, n: u32);
}
