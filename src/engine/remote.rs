//! The remote cold tier: records in a Redis server's memory (cargo feature `remote`), for when
//! host memory, not device memory, is the limit and a neighbour has memory to spare.
//!
//! A record is one header key (the same header as a spill-file record: magic, tensor id,
//! lengths, CRC32s, the dtype/shape description) and its payload in chunks of [`CHUNK`] bytes,
//! each a key of its own, all under a namespace of this process (host, pid and a random nonce):
//! `burn-spill:<host>:<pid>:<nonce>:<record>:h`, `...:<record>:<chunk>`. Writes and reads are
//! pipelined: one round trip per record. Every key carries a time to live of [`TTL`], which a
//! thread of the store refreshes while the process lives, so a process that dies leaves nothing
//! behind for longer than that; a store that is dropped, and every store at normal process exit,
//! deletes its keys. Each record belongs to this process alone, so nothing else is needed: no
//! other process reads or writes these keys.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::{Client, Connection};

use super::at_exit::AtExit;
use super::cold::{
    ColdReadError, ColdRecord, ColdStore, ColdThroughput, ColdTier, check_header, check_payload,
    record_header,
};
use super::slot::TensorId;

/// Payload bytes per key.
pub const CHUNK: usize = 2 << 20;
/// How long a key outlives the last refresh.
pub const TTL: Duration = Duration::from_secs(60);
/// How often the keys' time to live is refreshed.
const REFRESH: Duration = Duration::from_secs(15);
/// How long a connect, read or write may take before the store counts as failed.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the remote store could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum RemoteSetupError {
    /// The URL does not parse as a Redis URL.
    #[error("{0}")]
    BadUrl(String),
    /// The server could not be reached or refused us.
    #[error("{0}")]
    Unreachable(String),
    /// The server wants a password (or another one).
    #[error("{0}")]
    Authentication(String),
}

/// What the store and its refresher share: the live records (record number -> chunk count).
struct Shared {
    client: Client,
    namespace: String,
    live: Mutex<BTreeMap<u64, u64>>,
    stop: AtomicBool,
}

impl Shared {
    fn keys(&self, record: u64, chunks: u64) -> impl Iterator<Item = String> + '_ {
        std::iter::once(format!("{}:{record}:h", self.namespace))
            .chain((0..chunks).map(move |c| format!("{}:{record}:{c}", self.namespace)))
    }

    /// Deletes every live key (at drop and at process exit).
    fn delete_all(&self, connection: &mut Connection) {
        let live = lock(&self.live);
        let mut pipe = redis::pipe();
        for (&record, &chunks) in live.iter() {
            for key in self.keys(record, chunks) {
                pipe.del(key).ignore();
            }
        }
        let _ = pipe.query::<()>(connection);
    }
}

/// Records in a Redis server.
pub struct RemoteStore {
    shared: Arc<Shared>,
    /// The URL with any password hidden, for messages.
    shown_url: String,
    connection: Mutex<Connection>,
    next_record: u64,
    used: u64,
    throughput: Mutex<ColdThroughput>,
    fail_writes: u32,
    refresher: Option<std::thread::JoinHandle<()>>,
    exit_cleanup: AtExit,
}

impl RemoteStore {
    /// Connects to the server at `url` (`redis://[[user]:password@]host[:port][/db]`,
    /// or `unix:///path`; TLS is not built into the client) and checks that it
    /// answers, authentication included.
    pub fn connect(url: &str) -> Result<Self, RemoteSetupError> {
        let client = Client::open(url).map_err(|e| RemoteSetupError::BadUrl(e.to_string()))?;
        let shown_url = hide_password(url);
        let connect = || -> Result<Connection, RemoteSetupError> {
            let mut connection = client
                .get_connection_with_timeout(IO_TIMEOUT)
                .map_err(|e| classify(&shown_url, e))?;
            let _ = connection.set_read_timeout(Some(IO_TIMEOUT));
            let _ = connection.set_write_timeout(Some(IO_TIMEOUT));
            redis::cmd("PING")
                .query::<String>(&mut connection)
                .map_err(|e| classify(&shown_url, e))?;
            Ok(connection)
        };
        let connection = connect()?;
        let refresh_connection = connect()?;
        let host = std::fs::read_to_string("/etc/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "host".into());
        let nonce: u64 = {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_nanos(),
            );
            h.finish()
        };
        let shared = Arc::new(Shared {
            client,
            namespace: format!("burn-spill:{host}:{}:{nonce:016x}", std::process::id()),
            live: Mutex::new(BTreeMap::new()),
            stop: AtomicBool::new(false),
        });
        // At exit, the keys of a store still alive go (otherwise they expire with their TTL).
        let exit_cleanup = {
            let shared = shared.clone();
            AtExit::register(move || {
                shared.stop.store(true, Ordering::Relaxed);
                if let Ok(mut connection) = shared.client.get_connection_with_timeout(IO_TIMEOUT) {
                    shared.delete_all(&mut connection);
                }
            })
        };
        let refresher = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("burn-spill-remote-ttl".into())
                .spawn(move || refresh(&shared, refresh_connection))
                .map_err(|e| RemoteSetupError::Unreachable(e.to_string()))?
        };
        Ok(Self {
            shared,
            shown_url,
            connection: Mutex::new(connection),
            next_record: 0,
            used: 0,
            throughput: Mutex::new(ColdThroughput::default()),
            fail_writes: 0,
            refresher: Some(refresher),
            exit_cleanup,
        })
    }
}

/// Refreshes the live keys' time to live every [`REFRESH`] until the store stops.
fn refresh(shared: &Shared, mut connection: Connection) {
    let mut last = Instant::now();
    while !shared.stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
        if last.elapsed() < REFRESH {
            continue;
        }
        last = Instant::now();
        let mut pipe = redis::pipe();
        for (&record, &chunks) in lock(&shared.live).iter() {
            for key in shared.keys(record, chunks) {
                pipe.pexpire(key, TTL.as_millis() as i64).ignore();
            }
        }
        if let Err(error) = pipe.query::<()>(&mut connection) {
            tracing::warn!(target: "burn_spill::engine", %error,
                "could not refresh the remote tier's keys; they expire unless a later refresh succeeds");
        }
    }
}

/// Copies the chunks' values into `payload` and returns the hash of it all. Large payloads are
/// split between this thread and a second one (each copying and hashing its half, the hashes
/// combined after), so that filling the fresh buffer does not add a whole pass to the read.
fn copy_and_hash(payload: &mut [u8], values: &[Option<Vec<u8>>]) -> crc32fast::Hasher {
    let fill = |into: &mut [u8], values: &[Option<Vec<u8>>]| {
        let mut hasher = crc32fast::Hasher::new();
        for (into, value) in into.chunks_mut(CHUNK).zip(values) {
            into.copy_from_slice(value.as_deref().expect("checked before"));
            hasher.update(into);
        }
        hasher
    };
    let half = values.len() / 2;
    if half < 2 {
        return fill(payload, values);
    }
    let (first, second) = payload.split_at_mut(half * CHUNK);
    std::thread::scope(|scope| {
        let tail = scope.spawn(|| fill(second, &values[half..]));
        let mut hasher = fill(first, &values[..half]);
        hasher.combine(&tail.join().expect("copying and hashing do not panic"));
        hasher
    })
}

fn as_io(error: redis::RedisError) -> io::Error {
    io::Error::other(format!("redis: {error}"))
}

impl ColdStore for RemoteStore {
    fn write(&mut self, id: TensorId, meta: &[u8], payload: &[u8]) -> io::Result<ColdRecord> {
        if self.fail_writes > 0 {
            self.fail_writes -= 1;
            return Err(io::Error::other("injected write failure (test hook)"));
        }
        let start = Instant::now();
        let crc = crc32fast::hash(payload);
        let record = self.next_record;
        let chunks = payload.len().div_ceil(CHUNK) as u64;
        let head = record_header(id, meta, payload.len() as u64, crc);
        let ttl = TTL.as_millis() as u64;
        let mut pipe = redis::pipe();
        let mut keys = self.shared.keys(record, chunks);
        let head_key = keys.next().expect("the header key");
        // The payload first; the header, which holds the checksum, last.
        for (key, chunk) in keys.zip(payload.chunks(CHUNK)) {
            pipe.cmd("SET")
                .arg(key)
                .arg(chunk)
                .arg("PX")
                .arg(ttl)
                .ignore();
        }
        pipe.cmd("SET")
            .arg(head_key)
            .arg(&head)
            .arg("PX")
            .arg(ttl)
            .ignore();
        let written = pipe.query::<()>(&mut lock(&self.connection));
        if let Err(error) = written {
            // Whatever part of the record arrived is removed (or expires with its TTL).
            let mut pipe = redis::pipe();
            for key in self.shared.keys(record, chunks) {
                pipe.del(key).ignore();
            }
            let _ = pipe.query::<()>(&mut lock(&self.connection));
            return Err(as_io(error));
        }
        self.next_record += 1;
        lock(&self.shared.live).insert(record, chunks);
        let extent = (head.len() + payload.len()) as u64;
        self.used += extent;
        lock(&self.throughput).on_write(payload.len() as u64, start.elapsed());
        Ok(ColdRecord {
            tier: ColdTier::Remote,
            offset: record,
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
        let start = Instant::now();
        let corrupt = |what: String| Err(ColdReadError::Corrupt(what));
        let chunks = payload.len().div_ceil(CHUNK) as u64;
        let mut pipe = redis::pipe();
        for key in self.shared.keys(record.offset, chunks) {
            pipe.get(key);
        }
        let values: Vec<Option<Vec<u8>>> = pipe
            .query(&mut lock(&self.connection))
            .map_err(|e| ColdReadError::Io(as_io(e)))?;
        let mut values = values.into_iter();
        let Some(Some(head)) = values.next() else {
            return corrupt("its header key is missing (expired, evicted or deleted)".into());
        };
        check_header(&head, record, id, meta, payload.len())?;
        let values: Vec<Option<Vec<u8>>> = values.collect();
        for (i, (into, value)) in payload.chunks(CHUNK).zip(&values).enumerate() {
            match value {
                None => {
                    return corrupt(format!(
                        "chunk {i} is missing (expired, evicted or deleted)"
                    ));
                }
                Some(value) if value.len() != into.len() => {
                    return corrupt(format!(
                        "chunk {i} holds {} bytes, not {}",
                        value.len(),
                        into.len()
                    ));
                }
                Some(_) => {}
            }
        }
        let hasher = copy_and_hash(payload, &values);
        lock(&self.throughput).on_read(record.payload_len, start.elapsed());
        check_payload(hasher.finalize(), record)
    }

    fn free(&mut self, record: &ColdRecord) {
        let Some(chunks) = lock(&self.shared.live).remove(&record.offset) else {
            return;
        };
        self.used -= record.extent;
        let mut pipe = redis::pipe();
        for key in self.shared.keys(record.offset, chunks) {
            pipe.del(key).ignore();
        }
        // A key that cannot be deleted now expires with its time to live.
        let _ = pipe.query::<()>(&mut lock(&self.connection));
    }

    fn records(&self) -> usize {
        lock(&self.shared.live).len()
    }

    fn bytes_used(&self) -> u64 {
        self.used
    }

    fn throughput(&self) -> ColdThroughput {
        *lock(&self.throughput)
    }

    fn locate(&self, record: &ColdRecord) -> String {
        format!(
            "redis {} key {}:{}:h",
            self.shown_url, self.shared.namespace, record.offset
        )
    }

    fn describe(&self) -> String {
        format!("redis {} ({})", self.shown_url, self.shared.namespace)
    }

    fn fail_next_writes(&mut self, n: u32) {
        self.fail_writes = n;
    }
}

impl Drop for RemoteStore {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(refresher) = self.refresher.take() {
            let _ = refresher.join();
        }
        self.shared.delete_all(&mut lock(&self.connection));
        self.exit_cleanup.cancel();
    }
}

/// Sorts a connection error into what the user must fix.
fn classify(url: &str, error: redis::RedisError) -> RemoteSetupError {
    let text = error.to_string();
    if error.kind() == redis::ErrorKind::AuthenticationFailed
        || text.contains("NOAUTH")
        || text.contains("WRONGPASS")
        || text.contains("invalid password")
    {
        RemoteSetupError::Authentication(format!(
            "the server at {url} needs a password it was not given, or refused the one given \
             ({text}); give it in the URL: redis://:password@host:port or \
             redis://user:password@host:port"
        ))
    } else {
        RemoteSetupError::Unreachable(format!("cannot reach a Redis server at {url}: {text}"))
    }
}

/// The URL with the password, if any, replaced by `***`.
pub fn hide_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.split_once('@') {
        Some((credentials, host)) => {
            let user = credentials.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{host}")
        }
        None => url.to_string(),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_hidden_in_messages() {
        assert_eq!(hide_password("redis://:secret@h:1/0"), "redis://:***@h:1/0");
        assert_eq!(hide_password("redis://me:secret@h"), "redis://me:***@h");
        assert_eq!(hide_password("redis://h:6379"), "redis://h:6379");
    }

    #[test]
    fn a_malformed_url_is_refused_before_connecting() {
        for url in ["http://h:6379", "redis//h", ""] {
            assert!(matches!(
                RemoteStore::connect(url),
                Err(RemoteSetupError::BadUrl(_))
            ));
        }
    }
}
