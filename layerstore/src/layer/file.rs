//! The handle the layer map keeps for a layer file: resident on local disk (open, with its
//! index in memory) or evicted (only in remote storage, downloaded on the first read that
//! needs it).
//!
//! Local disk is a cache once remote storage holds a layer: `evict` closes the file, drops
//! its index and deletes it; the next `reader()` downloads it again through the layer's
//! `LayerDownload` (which checks the bytes against the checksum the remote index recorded)
//! and reopens it. A reader that took its `LayerReader` before an eviction keeps reading
//! the unlinked file through its open descriptor.
//!
//! **Disk budget.** A `RemoteCopy` may carry the caller's `DiskBudget`. Before a download,
//! `reader()` asks it to make room for the layer's bytes (the caller evicts other layers,
//! least recently used first), and tells it when the download is over, so that the bytes
//! of downloads in flight are counted until the layer counts as resident. The budget only
//! makes room: a download it could not make room for still happens (a read never fails
//! because of the budget).
//!
//! Lock order: `make_room` is called with no lock of this layer held, and whatever the
//! budget does must not block on another layer's `state` (it evicts with `try_evict`, and
//! `is_resident` reads an atomic). So two threads downloading layers X and Y, each making
//! room by evicting the other, cannot deadlock: neither holds a layer lock while it
//! makes room, and neither waits for one while making it.
//!
//! Invariants:
//! - A layer is evicted only once its upload has completed (`remote` is set), so the only
//!   local copy of a version is never deleted.
//! - One download per layer at a time (`state` is held across it); concurrent readers of
//!   an evicted layer wait for the one download instead of starting their own.
//! - `resident` mirrors `state.is_some()`; it is changed only with `state` held.
//! - The description, path and size never change; residency does.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use proto::{Key, KeyRange, Lsn};

use super::name::LayerDesc;
use super::reader::LayerReader;
use crate::error::LayerError;
use crate::value::{ChangeCollector, Value, ValueCollector};

/// Brings one layer back from remote storage.
pub trait LayerDownload: Send + Sync + fmt::Debug {
    /// Writes the layer's bytes to `path` crash-safely (a temporary file renamed into
    /// place), after checking them against what the remote index recorded.
    fn download(&self, desc: &LayerDesc, path: &Path) -> anyhow::Result<()>;
}

/// The caller's bound on the bytes of layer files on local disk, consulted before each
/// download of an evicted layer.
pub trait DiskBudget: Send + Sync + fmt::Debug {
    /// Called before `downloading` (evicted, `incoming_bytes` long) is downloaded, with no
    /// lock of any layer held: evicts other layers so that what is resident plus
    /// `incoming_bytes` (and the downloads in flight) fits, if it can. It must not evict
    /// `downloading`, nor block on a layer that is in use (`LayerFile::try_evict`). It
    /// cannot refuse: the download follows whatever it did.
    fn make_room(&self, incoming_bytes: u64, downloading: &LayerFile);

    /// Called once after each `make_room`, when that download is over (succeeded, failed,
    /// or found that another reader had downloaded the layer meanwhile). A successful
    /// download is resident (`is_resident`) by then.
    fn download_done(&self, incoming_bytes: u64, downloading: &LayerFile);
}

/// Where a layer is kept remotely: set once its upload completed (or at attach).
#[derive(Debug, Clone)]
pub struct RemoteCopy {
    pub download: Arc<dyn LayerDownload>,
    /// Consulted before each download, if the caller bounds local disk.
    pub budget: Option<Arc<dyn DiskBudget>>,
}

/// Tells the budget that a download is over when dropped, on every path out of `reader()`.
struct Admission<'a> {
    budget: &'a dyn DiskBudget,
    layer: &'a LayerFile,
}

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        self.budget.download_done(self.layer.size_bytes, self.layer);
    }
}

/// Process-wide clock for least-recently-used eviction: milliseconds since first use.
fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    u64::try_from(START.get_or_init(Instant::now).elapsed().as_millis()).unwrap_or(u64::MAX)
}

pub struct LayerFile {
    desc: LayerDesc,
    path: PathBuf,
    size_bytes: u64,
    /// The open file, or `None` while evicted.
    state: Mutex<Option<Arc<LayerReader>>>,
    /// Whether `state` holds the open file, readable without waiting for a download.
    resident: AtomicBool,
    remote: OnceLock<RemoteCopy>,
    last_access_ms: AtomicU64,
    downloads: AtomicU64,
}

impl fmt::Debug for LayerFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LayerFile").field("desc", &self.desc).field("resident", &self.is_resident()).finish()
    }
}

use crate::lock;

impl LayerFile {
    /// Opens the layer file at `path`, whose file name must be its `LayerDesc`.
    pub fn open(path: &Path) -> Result<LayerFile, LayerError> {
        let reader = LayerReader::open(path)?;
        Ok(LayerFile::resident(reader))
    }

    /// A handle on a layer that was just opened.
    pub fn resident(reader: LayerReader) -> LayerFile {
        LayerFile {
            desc: reader.desc().clone(),
            path: reader.path().to_path_buf(),
            size_bytes: reader.file_size_bytes(),
            state: Mutex::new(Some(Arc::new(reader))),
            resident: AtomicBool::new(true),
            remote: OnceLock::new(),
            last_access_ms: AtomicU64::new(now_ms()),
            downloads: AtomicU64::new(0),
        }
    }

    /// A handle on a layer that is only in remote storage; `path` is where it will be
    /// downloaded to.
    pub fn evicted(path: PathBuf, desc: LayerDesc, size_bytes: u64, remote: RemoteCopy) -> LayerFile {
        let file = LayerFile {
            desc,
            path,
            size_bytes,
            state: Mutex::new(None),
            resident: AtomicBool::new(false),
            remote: OnceLock::new(),
            last_access_ms: AtomicU64::new(0),
            downloads: AtomicU64::new(0),
        };
        let _ = file.remote.set(remote);
        file
    }

    pub fn desc(&self) -> &LayerDesc {
        &self.desc
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn file_size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// Whether the layer is on local disk; never waits (a layer being downloaded is not
    /// resident until the download is done).
    pub fn is_resident(&self) -> bool {
        self.resident.load(Ordering::SeqCst)
    }

    /// Whether remote storage holds this layer (its upload completed, or it came from there).
    pub fn is_remote(&self) -> bool {
        self.remote.get().is_some()
    }

    /// Records that remote storage holds this layer; from now on it may be evicted.
    pub fn set_remote(&self, remote: RemoteCopy) {
        let _ = self.remote.set(remote);
    }

    /// When a read last used this layer (milliseconds on a process-wide clock).
    pub fn last_access_ms(&self) -> u64 {
        self.last_access_ms.load(Ordering::Relaxed)
    }

    /// How long since a read last used this layer (or since it was made or opened); `None`
    /// for a layer evicted before any read of this process.
    pub fn idle_ms(&self) -> Option<u64> {
        let last = self.last_access_ms();
        (last > 0 || self.is_resident()).then(|| now_ms().saturating_sub(last))
    }

    /// How many times this layer was downloaded on demand.
    pub fn download_count(&self) -> u64 {
        self.downloads.load(Ordering::Relaxed)
    }

    /// The open file, downloading it first if it is evicted.
    ///
    /// Making room comes before this layer's `state` is locked (see the module doc): the
    /// budget is called with no layer lock held, then the lock is taken and residency
    /// checked again, since another reader may have downloaded the layer meanwhile (the
    /// room made for it is then left free). Readers that arrive during the download wait
    /// on the lock and find the layer resident, without asking the budget.
    pub fn reader(&self) -> Result<Arc<LayerReader>, LayerError> {
        self.last_access_ms.store(now_ms(), Ordering::Relaxed);
        if let Some(reader) = &*lock(&self.state) {
            return Ok(Arc::clone(reader));
        }
        let remote = self.remote.get().ok_or_else(|| LayerError::Download {
            path: self.path.clone(),
            reason: "the layer is neither on local disk nor in remote storage".into(),
        })?;
        // Declared before `state`, so dropped after it: the layer is resident before the
        // budget stops counting the download.
        let _admission = remote.budget.as_deref().map(|budget| {
            budget.make_room(self.size_bytes, self);
            Admission { budget, layer: self }
        });
        let mut state = lock(&self.state);
        if let Some(reader) = &*state {
            return Ok(Arc::clone(reader));
        }
        tracing::info!("downloading evicted layer {}", self.desc);
        remote
            .download
            .download(&self.desc, &self.path)
            .map_err(|e| LayerError::Download { path: self.path.clone(), reason: format!("{e:#}") })?;
        let reader = Arc::new(LayerReader::open(&self.path)?);
        if reader.file_size_bytes() != self.size_bytes {
            return Err(LayerError::corrupt(
                &self.path,
                0,
                format!("downloaded layer has {} bytes, the remote index says {}", reader.file_size_bytes(), self.size_bytes),
            ));
        }
        self.downloads.fetch_add(1, Ordering::Relaxed);
        *state = Some(Arc::clone(&reader));
        self.resident.store(true, Ordering::SeqCst);
        Ok(reader)
    }

    /// Deletes the local copy if remote storage holds the layer; returns whether it did.
    /// Readers that already hold the open file keep it. Waits for a download of this
    /// layer in progress; eviction to a budget uses `try_evict`.
    pub fn evict(&self) -> std::io::Result<bool> {
        if self.remote.get().is_none() {
            return Ok(false);
        }
        self.evict_locked(lock(&self.state))
    }

    /// `evict`, but never waits: a layer whose state is locked (being downloaded, or
    /// handed to a reader right now) is in use and left alone (`Ok(false)`).
    pub fn try_evict(&self) -> std::io::Result<bool> {
        if self.remote.get().is_none() {
            return Ok(false);
        }
        match self.state.try_lock() {
            Ok(state) => self.evict_locked(state),
            Err(std::sync::TryLockError::Poisoned(e)) => self.evict_locked(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => Ok(false),
        }
    }

    fn evict_locked(&self, mut state: std::sync::MutexGuard<'_, Option<Arc<LayerReader>>>) -> std::io::Result<bool> {
        if state.is_none() {
            return Ok(false);
        }
        match std::fs::remove_file(&self.path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        *state = None;
        self.resident.store(false, Ordering::SeqCst);
        Ok(true)
    }

    /// Deletes the local file (the layer left the layer map), resident or not.
    pub fn remove_local(&self) -> std::io::Result<()> {
        let _state = lock(&self.state);
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    pub fn value_count(&self) -> Result<u64, LayerError> {
        Ok(self.reader()?.value_count())
    }

    pub(crate) fn collect(&self, key: Key, lsn_range: std::ops::Range<Lsn>, collector: &mut ValueCollector) -> Result<bool, LayerError> {
        self.reader()?.collect(key, lsn_range, collector)
    }

    /// All versions of one key, oldest first.
    pub fn get(&self, key: Key) -> Result<Vec<(Lsn, Value)>, LayerError> {
        self.reader()?.get(key)
    }

    /// The keys in `range` with a version at or below `lsn`, in order.
    pub fn keys(&self, range: &KeyRange, lsn: Lsn) -> Result<Vec<Key>, LayerError> {
        Ok(self.reader()?.keys(range, lsn))
    }

    /// Offers `changes` the newest LSN in `lsn_range` of each key in `key_range` with a
    /// version there (`LayerReader::collect_changes`); downloads an evicted layer first, as
    /// a read does.
    pub(crate) fn collect_changes(
        &self,
        key_range: &KeyRange,
        lsn_range: &std::ops::Range<Lsn>,
        changes: &mut ChangeCollector,
    ) -> Result<(), LayerError> {
        self.reader()?.collect_changes(key_range, lsn_range, changes)
    }

    /// Reads every block and checks it against the header and the index.
    pub fn verify(&self) -> Result<(), LayerError> {
        self.reader()?.verify()
    }
}
