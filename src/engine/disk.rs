//! The disk tier: one spill file in a private directory, records at reusable offsets.
//!
//! Each record is a fixed header (magic, tensor id, lengths, CRC32 of the payload), the
//! payload's description (dtype and shape, written by the adapter) and the payload. Freed
//! extents are merged and reused first-fit; an extent at the end of the file shrinks the file.
//! The directory is created fresh for each store (mode 0700, file 0600), so files a crashed run
//! left behind are never opened, let alone read as ours; it is removed when the store drops and,
//! for stores still alive then, when the process exits normally.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::at_exit::AtExit;
use super::cold::{
    self, ColdReadError, ColdRecord, ColdStore, ColdThroughput, ColdTier, MAGIC, check_header,
    check_payload, record_header,
};
use super::slot::TensorId;

/// The header's length in the file's offsets.
const HEADER_LEN: u64 = cold::HEADER_LEN as u64;
const FILE_NAME: &str = "tensors.spill";
/// Payloads are checksummed and moved in chunks small enough to stay in the CPU cache between
/// the checksum and the kernel's copy, so the two cost about one pass over memory, not two.
const CHUNK: usize = 256 << 10;

/// A spill file and its free-extent map.
#[derive(Debug)]
pub struct DiskStore {
    dir: PathBuf,
    file_path: PathBuf,
    file: File,
    /// Free extents by offset, merged with their neighbours.
    free: BTreeMap<u64, u64>,
    /// End of the last used extent: the file's logical length.
    end: u64,
    records: usize,
    /// Bytes of the extents in use.
    used: u64,
    /// Test hook: fail the next N writes as if the disk were full.
    fail_writes: u32,
    throughput: Mutex<ColdThroughput>,
    /// Removes the directory at process exit, should the store still be alive then.
    exit_cleanup: AtExit,
}

impl DiskStore {
    /// Creates a fresh private directory under `base` (created if missing) holding an empty
    /// spill file. Fails if `base` cannot hold it or cannot be written, and refuses a `base`
    /// that another user could tamper with (see [`refuse_unsafe_base`]).
    pub fn create(base: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(base)?;
        refuse_unsafe_base(base)?;
        let dir = tempfile::Builder::new()
            .prefix("burn-spill-")
            .tempdir_in(base)?
            .keep();
        // From here on, failures must remove what was made.
        let made = (|| {
            restrict_dir(&dir)?;
            let file_path = dir.join(FILE_NAME);
            let file = open_private(&file_path)?;
            // Prove the directory is writable with real bytes, not only a create.
            write_all_at(&file, &MAGIC, 0)?;
            file.set_len(0)?;
            Ok::<_, io::Error>((file_path, file))
        })();
        let (file_path, file) = match made {
            Ok(ok) => ok,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let exit_cleanup = {
            let dir = dir.clone();
            AtExit::register(move || {
                let _ = std::fs::remove_dir_all(&dir);
            })
        };
        Ok(Self {
            dir,
            file_path,
            file,
            free: BTreeMap::new(),
            end: 0,
            records: 0,
            used: 0,
            fail_writes: 0,
            throughput: Mutex::new(ColdThroughput::default()),
            exit_cleanup,
        })
    }

    /// The private directory of this store.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The spill file.
    pub fn file_path(&self) -> &Path {
        &self.file_path
    }

    /// The spill file's logical length (used extents and the free holes between them).
    #[cfg(test)]
    pub fn file_len(&self) -> u64 {
        self.end
    }

    /// Reads a record back, checking that it is the record of `id` with description `meta` and
    /// that the payload's CRC32 matches what was written.
    #[cfg(test)]
    pub fn read(
        &self,
        record: &ColdRecord,
        id: TensorId,
        meta: &[u8],
    ) -> Result<Vec<u8>, ColdReadError> {
        let mut payload = vec![0u8; record.payload_len as usize];
        self.read_into(record, id, meta, &mut payload)?;
        Ok(payload)
    }

    fn allocate(&mut self, extent: u64) -> u64 {
        let fit = self
            .free
            .iter()
            .find(|&(_, &len)| len >= extent)
            .map(|(&off, &len)| (off, len));
        match fit {
            Some((off, len)) => {
                self.free.remove(&off);
                if len > extent {
                    self.free.insert(off + extent, len - extent);
                }
                off
            }
            None => {
                let off = self.end;
                self.end += extent;
                off
            }
        }
    }

    fn release(&mut self, mut offset: u64, mut len: u64) {
        if let Some((&prev, &prev_len)) = self.free.range(..offset).next_back()
            && prev + prev_len == offset
        {
            self.free.remove(&prev);
            offset = prev;
            len += prev_len;
        }
        if let Some(next_len) = self.free.remove(&(offset + len)) {
            len += next_len;
        }
        if offset + len == self.end {
            // The tail is free: shrink the file instead of keeping a hole.
            self.end = offset;
            let _ = self.file.set_len(offset);
        } else {
            self.free.insert(offset, len);
        }
    }
}

impl ColdStore for DiskStore {
    fn write(&mut self, id: TensorId, meta: &[u8], payload: &[u8]) -> io::Result<ColdRecord> {
        if self.fail_writes > 0 {
            self.fail_writes -= 1;
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "injected write failure (test hook)",
            ));
        }
        let start = std::time::Instant::now();
        let extent = HEADER_LEN + meta.len() as u64 + payload.len() as u64;
        let offset = self.allocate(extent);
        let payload_at = offset + HEADER_LEN + meta.len() as u64;
        // Payload first; the header, which holds the checksum, goes last.
        let (written, crc) = checksummed(payload, |i, chunk| {
            write_all_at(&self.file, chunk, payload_at + (i * CHUNK) as u64)
        });
        let head = record_header(id, meta, payload.len() as u64, crc);
        let written = written.and_then(|()| write_all_at(&self.file, &head, offset));
        if let Err(e) = written {
            self.release(offset, extent);
            return Err(e);
        }
        self.records += 1;
        self.used += extent;
        lock(&self.throughput).on_write(payload.len() as u64, start.elapsed());
        Ok(ColdRecord {
            tier: ColdTier::Disk,
            offset,
            extent,
            payload_len: payload.len() as u64,
            crc,
        })
    }

    fn read_into(
        &self,
        record: &ColdRecord,
        id: TensorId,
        meta: &[u8],
        payload: &mut [u8],
    ) -> Result<(), ColdReadError> {
        let start = std::time::Instant::now();
        let head_len = HEADER_LEN as usize + meta.len();
        let mut head = vec![0u8; head_len];
        read_exact_at(&self.file, &mut head, record.offset)?;
        check_header(&head, record, id, meta, payload.len())?;
        let payload_at = record.offset + head_len as u64;
        let (read, crc) = checksummed_mut(payload, |i, chunk| {
            read_exact_at(&self.file, chunk, payload_at + (i * CHUNK) as u64)
        });
        read?;
        lock(&self.throughput).on_read(record.payload_len, start.elapsed());
        check_payload(crc, record)
    }

    fn free(&mut self, record: &ColdRecord) {
        self.records -= 1;
        self.used -= record.extent;
        self.release(record.offset, record.extent);
    }

    fn records(&self) -> usize {
        self.records
    }

    fn bytes_used(&self) -> u64 {
        self.used
    }

    fn throughput(&self) -> ColdThroughput {
        *lock(&self.throughput)
    }

    fn locate(&self, record: &ColdRecord) -> String {
        format!(
            "spill file {} at offset {}",
            self.file_path.display(),
            record.offset
        )
    }

    fn describe(&self) -> String {
        format!("spill file {}", self.file_path.display())
    }

    fn fail_next_writes(&mut self, n: u32) {
        self.fail_writes = n;
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drop for DiskStore {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        self.exit_cleanup.cancel();
    }
}

/// Payloads at least this big are checksummed on a second thread while the I/O runs.
const PARALLEL_CRC: usize = 4 << 20;

/// Runs `io` over the chunks of `payload` in order (stopping at the first error) and returns
/// its result with the CRC32 of the whole payload. Large payloads are hashed on a scoped thread
/// beside the I/O, small ones chunk by chunk while each is still in cache.
fn checksummed(
    payload: &[u8],
    mut io: impl FnMut(usize, &[u8]) -> io::Result<()>,
) -> (io::Result<()>, u32) {
    let run = |io: &mut dyn FnMut(usize, &[u8]) -> io::Result<()>,
               hash: Option<&mut crc32fast::Hasher>| {
        let mut hash = hash;
        for (i, chunk) in payload.chunks(CHUNK).enumerate() {
            if let Some(h) = hash.as_deref_mut() {
                h.update(chunk);
            }
            io(i, chunk)?;
        }
        Ok(())
    };
    if payload.len() < PARALLEL_CRC {
        let mut hasher = crc32fast::Hasher::new();
        let result = run(&mut io, Some(&mut hasher));
        return (result, hasher.finalize());
    }
    std::thread::scope(|scope| {
        let crc = scope.spawn(|| crc32fast::hash(payload));
        let result = run(&mut io, None);
        (result, crc.join().expect("crc32fast does not panic"))
    })
}

/// [`checksummed`] for I/O that fills `payload`: each chunk is hashed right after it is filled,
/// while it is in cache. (A hashing thread fed chunk by chunk measured slower for reads: the
/// kernel's copy and the hash then compete for memory bandwidth instead of sharing the cache.)
fn checksummed_mut(
    payload: &mut [u8],
    mut io: impl FnMut(usize, &mut [u8]) -> io::Result<()>,
) -> (io::Result<()>, u32) {
    let mut hasher = crc32fast::Hasher::new();
    for (i, chunk) in payload.chunks_mut(CHUNK).enumerate() {
        if let Err(e) = io(i, chunk) {
            return (Err(e), 0);
        }
        hasher.update(chunk);
    }
    (Ok(()), hasher.finalize())
}

fn open_private(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}

/// Refuses a base directory in which another user could rename burn-spill's private directory
/// and plant one of their own in its place: one owned by another user (root aside), or one that
/// others may write without the sticky bit (which `/tmp` has: there only a directory's owner may
/// rename it). Symlinks are followed: what counts is the directory the spill directory lands in.
/// The spill file itself is opened once, exclusively, and every read and write goes through
/// that descriptor, so a symlink planted in its place later is never followed.
#[cfg(unix)]
fn refuse_unsafe_base(base: &Path) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(base)?;
    if !meta.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotADirectory,
            "it is not a directory",
        ));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me && meta.uid() != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "it is owned by uid {}, not by this user (uid {me}) or root, and its owner could \
                 replace the spill files; use a directory this user owns",
                meta.uid()
            ),
        ));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "it is writable by other users (mode {mode:04o}) without the sticky bit, so any of \
                 them could replace the spill files; use a directory only this user can write \
                 (mode 0700 or 0755), or one with the sticky bit such as /tmp"
            ),
        ));
    }
    Ok(())
}

#[cfg(not(unix))]
fn refuse_unsafe_base(_: &Path) -> io::Result<()> {
    Ok(())
}

fn restrict_dir(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

#[cfg(unix)]
fn write_all_at(file: &File, buf: &[u8], offset: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(file, buf, offset)
}

#[cfg(unix)]
fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

#[cfg(windows)]
fn write_all_at(file: &File, mut buf: &[u8], mut offset: u64) -> io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !buf.is_empty() {
        let n = file.seek_write(buf, offset)?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        buf = &buf[n..];
        offset += n as u64;
    }
    Ok(())
}

#[cfg(windows)]
fn read_exact_at(file: &File, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !buf.is_empty() {
        let n = file.seek_read(buf, offset)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf = &mut buf[n..];
        offset += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_offsets_are_reused() {
        let base = tempfile::tempdir().unwrap();
        let mut store = DiskStore::create(base.path()).unwrap();
        let a = store.write(1, b"F32 [4]", &[1u8; 16]).unwrap();
        let b = store.write(2, b"U8 [3]", &[7u8; 3]).unwrap();
        assert_eq!(store.read(&a, 1, b"F32 [4]").unwrap(), vec![1u8; 16]);
        assert_eq!(store.read(&b, 2, b"U8 [3]").unwrap(), vec![7u8; 3]);
        let len = store.file_len();
        store.free(&a);
        let c = store.write(3, b"F32 [4]", &[9u8; 16]).unwrap();
        assert_eq!(
            c.offset, a.offset,
            "a freed extent of the same size is reused"
        );
        assert_eq!(store.file_len(), len);
        store.free(&b);
        store.free(&c);
        assert_eq!(store.file_len(), 0, "an all-free file shrinks to nothing");
        assert_eq!(store.records(), 0);
    }

    #[test]
    fn corruption_and_wrong_identity_are_caught() {
        let base = tempfile::tempdir().unwrap();
        let mut store = DiskStore::create(base.path()).unwrap();
        let rec = store
            .write(5, b"I32 [2]", &[1, 2, 3, 4, 5, 6, 7, 8])
            .unwrap();
        assert!(matches!(
            store.read(&rec, 6, b"I32 [2]"),
            Err(ColdReadError::Corrupt(_))
        ));
        assert!(matches!(
            store.read(&rec, 5, b"I64 [1]"),
            Err(ColdReadError::Corrupt(_))
        ));
        // Flip one payload byte on disk.
        let at = rec.offset + HEADER_LEN + 7 + 3;
        write_all_at(&store.file, &[0xFF], at).unwrap();
        let err = store.read(&rec, 5, b"I32 [2]").unwrap_err();
        assert!(err.to_string().contains("CRC32"), "{err}");
    }

    #[cfg(unix)]
    #[test]
    fn directory_and_file_are_private_and_removed_on_drop() {
        use std::os::unix::fs::PermissionsExt;
        let base = tempfile::tempdir().unwrap();
        let store = DiskStore::create(base.path()).unwrap();
        let dir = store.dir().to_path_buf();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(store.file_path()), 0o600);
        drop(store);
        assert!(!dir.exists());
    }

    #[test]
    fn large_records_hashed_beside_the_io_round_trip() {
        let base = tempfile::tempdir().unwrap();
        let mut store = DiskStore::create(base.path()).unwrap();
        let payload: Vec<u8> = (0..PARALLEL_CRC + CHUNK + 7)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        let rec = store.write(1, b"m", &payload).unwrap();
        assert_eq!(rec.crc, crc32fast::hash(&payload));
        assert_eq!(store.read(&rec, 1, b"m").unwrap(), payload);
        // A flipped byte in the last chunk is caught by the parallel hash too.
        let at = rec.offset + HEADER_LEN + 1 + payload.len() as u64 - 3;
        write_all_at(&store.file, &[payload[payload.len() - 3] ^ 1], at).unwrap();
        assert!(matches!(
            store.read(&rec, 1, b"m"),
            Err(ColdReadError::Corrupt(_))
        ));
    }

    #[test]
    fn injected_write_failure_keeps_nothing() {
        let base = tempfile::tempdir().unwrap();
        let mut store = DiskStore::create(base.path()).unwrap();
        store.fail_next_writes(1);
        assert!(store.write(1, b"m", &[0u8; 8]).is_err());
        assert_eq!((store.records(), store.file_len()), (0, 0));
        assert!(store.write(1, b"m", &[0u8; 8]).is_ok());
    }

    #[test]
    fn uncreatable_base_is_an_error() {
        let base = tempfile::tempdir().unwrap();
        let file = base.path().join("a-file");
        std::fs::write(&file, b"x").unwrap();
        assert!(DiskStore::create(&file.join("sub")).is_err());
    }
}
