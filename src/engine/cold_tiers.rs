//! The cold stores of one device in the order writes try them: the spill file, and a remote
//! store where one is configured (before or after the file). A write that a store fails goes on
//! to the next, with a warning, so a store that dies mid-run costs its records, never the next
//! spill; reads and frees go to the store that holds the record.

use std::path::{Path, PathBuf};

use super::cold::{ColdRecord, ColdStore, ColdThroughput, ColdTier};
use super::disk::DiskStore;
use super::slot::TensorId;
use crate::stats::{ColdTierStats, MoveStats};

/// Why no cold store took a record.
#[derive(Debug)]
pub enum ColdWriteError {
    /// There is no cold store.
    NoStore,
    /// Every store failed: the last error, naming its store.
    Failed {
        /// What failed and where.
        error: std::io::Error,
        /// The store that failed last.
        store: String,
    },
}

/// The cold stores of one device.
#[derive(Default)]
pub struct ColdTiers {
    /// The spill file, and the base directory it was made under.
    disk: Option<(PathBuf, DiskStore)>,
    /// The remote store, if any, and the URL it was connected with.
    remote: Option<Box<dyn ColdStore>>,
    remote_url: Option<String>,
    /// Whether writes try the remote store before the spill file.
    remote_first: bool,
    /// Whether a store taking over from a failed one was warned about.
    warned_fallback: bool,
}

impl ColdTiers {
    /// The spill file's base directory and store, if one exists.
    pub fn disk(&self) -> Option<(&Path, &DiskStore)> {
        self.disk
            .as_ref()
            .map(|(base, store)| (base.as_path(), store))
    }

    /// Installs (or removes) the spill file.
    pub fn set_disk(&mut self, disk: Option<(PathBuf, DiskStore)>) {
        self.disk = disk;
    }

    /// Installs (or removes) the remote store connected with a URL, tried before the spill
    /// file if `first`.
    pub fn set_remote(&mut self, remote: Option<(String, Box<dyn ColdStore>)>, first: bool) {
        (self.remote_url, self.remote) = remote.unzip();
        self.remote_first = first;
    }

    /// Whether writes try the remote store before the spill file.
    pub fn set_remote_first(&mut self, first: bool) {
        self.remote_first = first;
    }

    /// The URL the remote store was connected with, if there is one.
    pub fn remote_url(&self) -> Option<&str> {
        self.remote_url.as_deref()
    }

    /// Records held by the spill file.
    pub fn disk_records(&self) -> usize {
        self.disk.as_ref().map_or(0, |(_, store)| store.records())
    }

    /// Records held by the remote store.
    pub fn remote_records(&self) -> usize {
        self.remote.as_ref().map_or(0, |store| store.records())
    }

    fn store(&self, tier: ColdTier) -> Option<&dyn ColdStore> {
        match tier {
            ColdTier::Disk => self.disk.as_ref().map(|(_, s)| s as &dyn ColdStore),
            ColdTier::Remote => self.remote.as_deref(),
        }
    }

    fn store_mut(&mut self, tier: ColdTier) -> Option<&mut dyn ColdStore> {
        match tier {
            ColdTier::Disk => self.disk.as_mut().map(|(_, s)| s as &mut dyn ColdStore),
            ColdTier::Remote => match self.remote.as_mut() {
                Some(store) => Some(store.as_mut()),
                None => None,
            },
        }
    }

    /// The stores in the order writes try them.
    fn order(&self) -> [ColdTier; 2] {
        if self.remote_first {
            [ColdTier::Remote, ColdTier::Disk]
        } else {
            [ColdTier::Disk, ColdTier::Remote]
        }
    }

    /// Writes one record to the first store that takes it. A store that fails is passed over
    /// for this record (with a warning the first time a store takes over from another).
    pub fn write(
        &mut self,
        id: TensorId,
        meta: &[u8],
        payload: &[u8],
    ) -> Result<ColdRecord, ColdWriteError> {
        let mut failed: Option<(std::io::Error, String)> = None;
        for tier in self.order() {
            let Some(store) = self.store_mut(tier) else {
                continue;
            };
            match store.write(id, meta, payload) {
                Ok(mut record) => {
                    record.tier = tier;
                    if let Some((error, from)) = &failed {
                        let to = store.describe();
                        if !self.warned_fallback {
                            self.warned_fallback = true;
                            tracing::warn!(target: "burn_spill::engine", id, %error, from, to,
                                "a cold store failed a write; spills go on to the next store (warned once)");
                        }
                    }
                    return Ok(record);
                }
                Err(error) => failed = Some((error, store.describe())),
            }
        }
        Err(match failed {
            None => ColdWriteError::NoStore,
            Some((error, store)) => ColdWriteError::Failed { error, store },
        })
    }

    /// Reads `record` into `into`; the error names the tensor and where the record is.
    pub fn read_into(
        &self,
        record: &ColdRecord,
        id: TensorId,
        meta: &[u8],
        into: &mut [u8],
    ) -> Result<(), String> {
        let Some(store) = self.store(record.tier) else {
            return Err(format!(
                "tensor {id} is in the {:?} cold tier, which no longer exists; this is a bug",
                record.tier
            ));
        };
        store.read_into(record, id, meta, into).map_err(|error| {
            format!(
                "tensor {id} cannot be restored from {}: {error}",
                store.locate(record)
            )
        })
    }

    /// Where `record` is, for messages.
    pub fn locate(&self, record: &ColdRecord) -> String {
        self.store(record.tier).map_or_else(
            || format!("{:?} cold tier", record.tier),
            |s| s.locate(record),
        )
    }

    /// Frees `record` in its store.
    pub fn free(&mut self, record: &ColdRecord) {
        if let Some(store) = self.store_mut(record.tier) {
            store.free(record);
        }
    }

    /// Each store's figures, in the order writes try them.
    pub fn stats(&self) -> Vec<ColdTierStats> {
        self.order()
            .into_iter()
            .filter_map(|tier| self.store(tier))
            .map(|store| {
                let t = store.throughput();
                ColdTierStats {
                    store: store.describe(),
                    records: store.records() as u64,
                    bytes_used: store.bytes_used(),
                    written: MoveStats {
                        count: t.writes,
                        bytes: t.written,
                        time: t.write_time,
                        fastest: None,
                    },
                    read: MoveStats {
                        count: t.reads,
                        bytes: t.read,
                        time: t.read_time,
                        fastest: None,
                    },
                }
            })
            .collect()
    }

    /// What the first store writes try has measured, if it has measured anything.
    pub fn first_throughput(&self) -> Option<ColdThroughput> {
        self.order()
            .into_iter()
            .find_map(|tier| self.store(tier))
            .map(|store| store.throughput())
    }

    /// Test hook: the next `n` writes of the spill file fail.
    pub fn fail_next_disk_writes(&mut self, n: u32) {
        if let Some((_, store)) = self.disk.as_mut() {
            store.fail_next_writes(n);
        }
    }
}
