//! A timeline: one line of history of a tenant, with every version of every key.
//!
//! Writes: `put` adds a version to the open in-memory layer; `advance_last_record_lsn`
//! publishes an LSN once every value of the log record ending there has been put, and
//! wakes `wait_lsn`. `freeze` closes the open layer at the last record LSN; `flush_frozen_layers`
//! writes frozen layers to L0 delta layer files and advances the disk-consistent LSN in the
//! metadata file. Reads (`read.rs`) walk the layer map from newer to older and continue in
//! the ancestor at the branch point. `compaction.rs` merges L0 layers into L1 layers and
//! creates image layers; `depth.rs` finds the key ranges whose reads walk too many delta
//! layers and creates image layers for just those; `gc.rs` removes layer files no reader
//! can need any more; `changes.rs` lists the keys changed between two LSNs.
//!
//! Invariants:
//! - LSNs of puts never decrease, and every put is above the last record LSN: a published
//!   LSN's versions never change, so a read at or below it is repeatable.
//! - Every version at or below the disk-consistent LSN is in layer files; versions above it
//!   are in in-memory layers, or lost in a crash and ingested again from the log. Layer files
//!   above it found at load are such leftovers and are deleted.
//! - The layer map is replaced, never modified in place (copy-on-write under `layers`):
//!   a read works on one consistent snapshot without holding a lock during I/O.
//! - GC raises the cutoff (and persists it) before it changes the layer map, and reads
//!   check the cutoff after taking their snapshot: a read either sees the old map or is
//!   refused.
//! - A published version's value never changes. Its representation may: an in-memory
//!   record version may be replaced by an image of the value it denotes (a fold,
//!   `replace_with_image`), which every read at every LSN turns into the same bytes.
//! - Compaction, image layer creation and GC exclude one another (`layer_removal_lock`);
//!   flushes exclude one another (`flush_lock`); puts, advances and freezes exclude one
//!   another (`write_state`).
//!
//! Folds (`fold.rs`): `put` queues keys whose in-memory chain of records crosses
//! `fold_after_records` or `fold_after_bytes`; the caller rebuilds each and hands the image
//! to `replace_with_image`.

mod changes;
mod compaction;
mod depth;
mod fold;
mod gc;
pub mod metadata;
mod read;

#[cfg(test)]
mod tests;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock};
use std::time::Duration;

use anyhow::{bail, Context};
use proto::{Key, Lsn, TenantId, TimelineId};

use crate::config::StorageConfig;
use crate::error::{WaitLsnError, WriteError};
use crate::layer::inmemory::EPHEMERAL_PREFIX;
use crate::layer::{FoldThresholds, InMemoryLayer, Layer, LayerDesc, LayerFile};
use crate::layer_map::LayerMap;
use crate::remote::{IndexLayer, IndexPart, RemoteStatus, RemoteTimelineClient};
use crate::value::{Value, VALUE_SIZE_BYTES_MAX};

pub use compaction::CompactionResult;
pub use depth::{ImageCreationResult, RangeDepth};
use fold::LongChains;
pub use fold::{ReplaceOutcome, LONG_CHAINS_MAX};
pub use gc::GcResult;
pub use metadata::TimelineMetadata;

/// The timeline a branch was created from, and the LSN it was created at.
#[derive(Debug)]
pub struct Ancestor {
    pub timeline: Arc<Timeline>,
    pub lsn: Lsn,
}

#[derive(Debug)]
struct WriteState {
    /// LSN of the newest put (the disk-consistent LSN right after loading). Puts must not
    /// go below it, nor advances of the last record LSN.
    last_put_lsn: Lsn,
}

#[derive(Debug)]
pub struct Timeline {
    conf: Arc<StorageConfig>,
    tenant_id: TenantId,
    timeline_id: TimelineId,
    path: PathBuf,
    ancestor: Option<Ancestor>,
    span: tracing::Span,
    layers: RwLock<Arc<LayerMap>>,
    write_state: Mutex<WriteState>,
    /// The last record LSN: the newest published LSN.
    last_record_lsn: Mutex<Lsn>,
    last_record_lsn_changed: Condvar,
    /// The metadata as last written to disk; held while rewriting the file.
    metadata: Mutex<TimelineMetadata>,
    /// `metadata.latest_gc_cutoff`, readable without waiting for a metadata write.
    gc_cutoff: AtomicU64,
    flush_lock: Mutex<()>,
    layer_removal_lock: Mutex<()>,
    ephemeral_seq: AtomicU64,
    /// The upload queue, when the tenant has remote storage (set once, at load or creation).
    remote: OnceLock<Arc<RemoteTimelineClient>>,
    /// Keys to fold (see the module documentation).
    long_chains: Mutex<LongChains>,
}

pub(crate) use crate::lock;

impl Timeline {
    /// Loads the timeline in `dir` (which holds its metadata file), with its ancestor,
    /// which the caller loaded first. Removes what a crash may have left behind: temporary
    /// files, ephemeral files, and layer files above the disk-consistent LSN. Entries named
    /// in `foreign_entries` belong to the caller and are left alone; any other unknown
    /// entry is an error.
    pub fn load(
        conf: Arc<StorageConfig>,
        tenant_id: TenantId,
        timeline_id: TimelineId,
        dir: &Path,
        ancestor: Option<Arc<Timeline>>,
        foreign_entries: &[&str],
    ) -> anyhow::Result<Arc<Timeline>> {
        let span = tracing::info_span!("timeline", tenant_id = %tenant_id, timeline_id = %timeline_id);
        let _entered = span.enter();
        let meta = TimelineMetadata::read(dir, timeline_id)?;
        let ancestor = match (meta.ancestor, ancestor) {
            (None, None) => None,
            (Some((id, lsn)), Some(timeline)) if timeline.timeline_id == id => Some(Ancestor { timeline, lsn }),
            (expected, given) => {
                bail!("timeline metadata names ancestor {expected:?}, the caller gave {:?}", given.map(|t| t.timeline_id))
            }
        };
        let disk_consistent_lsn = meta.disk_consistent_lsn;
        let mut files = Vec::new();
        let mut removed_any = false;
        for entry in fs::read_dir(dir).with_context(|| format!("list {}", dir.display()))? {
            let entry = entry.with_context(|| format!("list {}", dir.display()))?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == metadata::METADATA_FILE_NAME || foreign_entries.contains(&name.as_str()) {
                continue;
            }
            if crashsafe::is_temp_name(&name) || name.starts_with(EPHEMERAL_PREFIX) {
                tracing::info!("removing leftover file {name}");
                crashsafe::remove_temp(&path).with_context(|| format!("remove {}", path.display()))?;
                removed_any = true;
                continue;
            }
            let desc: LayerDesc = name.parse().with_context(|| format!("unexpected file in timeline directory {}", dir.display()))?;
            if desc.lsn_range.end.0 > disk_consistent_lsn.0 + 1 {
                // Written before a crash that came before the metadata update: the versions
                // in it are above the disk-consistent LSN and will be ingested again.
                tracing::info!("removing layer {name} above the disk-consistent LSN {disk_consistent_lsn}");
                fs::remove_file(&path).with_context(|| format!("remove {}", path.display()))?;
                removed_any = true;
                continue;
            }
            files.push(Arc::new(LayerFile::open(&path)?));
        }
        if removed_any {
            crashsafe::fsync_dir(dir).with_context(|| format!("fsync {}", dir.display()))?;
        }
        tracing::debug!("loaded {} layer files, disk-consistent LSN {disk_consistent_lsn}", files.len());
        let mut map = LayerMap::new(Lsn(disk_consistent_lsn.0 + 1));
        map.files = files;
        drop(_entered);
        Ok(Arc::new(Timeline {
            conf,
            tenant_id,
            timeline_id,
            path: dir.to_path_buf(),
            ancestor,
            span,
            layers: RwLock::new(Arc::new(map)),
            write_state: Mutex::new(WriteState { last_put_lsn: disk_consistent_lsn }),
            last_record_lsn: Mutex::new(disk_consistent_lsn),
            last_record_lsn_changed: Condvar::new(),
            gc_cutoff: AtomicU64::new(meta.latest_gc_cutoff.0),
            metadata: Mutex::new(meta),
            flush_lock: Mutex::new(()),
            layer_removal_lock: Mutex::new(()),
            ephemeral_seq: AtomicU64::new(0),
            remote: OnceLock::new(),
            long_chains: Mutex::new(LongChains::default()),
        }))
    }

    pub fn tenant_id(&self) -> TenantId {
        self.tenant_id
    }

    pub fn timeline_id(&self) -> TimelineId {
        self.timeline_id
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tenant's storage configuration the timeline works with.
    pub fn conf(&self) -> &StorageConfig {
        &self.conf
    }

    pub fn ancestor(&self) -> Option<&Ancestor> {
        self.ancestor.as_ref()
    }

    pub fn ancestor_timeline_id(&self) -> Option<TimelineId> {
        self.ancestor.as_ref().map(|a| a.timeline.timeline_id)
    }

    pub fn ancestor_lsn(&self) -> Option<Lsn> {
        self.ancestor.as_ref().map(|a| a.lsn)
    }

    /// The newest published LSN: reads up to it are answered, `wait_lsn` waits for it.
    pub fn last_record_lsn(&self) -> Lsn {
        *lock(&self.last_record_lsn)
    }

    pub fn disk_consistent_lsn(&self) -> Lsn {
        lock(&self.metadata).disk_consistent_lsn
    }

    /// Reads below this LSN are refused.
    pub fn gc_cutoff_lsn(&self) -> Lsn {
        Lsn(self.gc_cutoff.load(Ordering::SeqCst))
    }

    /// A snapshot of the layer map.
    fn layer_map(&self) -> Arc<LayerMap> {
        self.layers.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the layer map with a modified copy.
    fn modify_layer_map(&self, f: impl FnOnce(&mut LayerMap)) {
        let mut guard = self.layers.write().unwrap_or_else(|e| e.into_inner());
        let mut map = LayerMap::clone(&guard);
        f(&mut map);
        *guard = Arc::new(map);
    }

    /// Descriptions of every layer, in-memory ones first: for tests and diagnostics.
    pub fn layers(&self) -> Vec<LayerDesc> {
        self.layer_map().all().map(|l| l.desc()).collect()
    }

    /// The size of the layer file `desc` names, if the timeline has it.
    pub fn layer_file_size_bytes(&self, desc: &LayerDesc) -> Option<u64> {
        self.layer_map().files.iter().find(|f| f.desc() == desc).map(|f| f.file_size_bytes())
    }

    /// Bytes of values in the open layer.
    pub fn open_layer_size_bytes(&self) -> u64 {
        self.layer_map().open.as_ref().map_or(0, |l| l.size_bytes())
    }

    /// Stores `value` as the version of `key` at `lsn`. The LSN must be above the last
    /// record LSN and at or above every earlier put; a put at the same `(key, lsn)` before
    /// that LSN is published replaces the earlier value. Nothing is visible to readers
    /// until `advance_last_record_lsn` publishes the LSN.
    pub fn put(&self, key: Key, lsn: Lsn, value: &Value) -> Result<(), WriteError> {
        let _entered = self.span.enter();
        let mut w = lock(&self.write_state);
        if !lsn.is_valid() || lsn == Lsn::MAX {
            return Err(WriteError::InvalidLsn { key, lsn });
        }
        if key == Key::MAX {
            return Err(WriteError::ReservedKey { key });
        }
        let last_record = self.last_record_lsn();
        if lsn <= last_record {
            return Err(WriteError::AlreadyPublished { key, lsn, last_record });
        }
        if lsn < w.last_put_lsn {
            return Err(WriteError::LsnRegression { key, lsn, last_put: w.last_put_lsn });
        }
        let len = value.payload().len();
        if len > VALUE_SIZE_BYTES_MAX {
            return Err(WriteError::ValueTooLarge { key, len, max: VALUE_SIZE_BYTES_MAX });
        }
        let open = match self.layer_map().open.clone() {
            Some(open) => open,
            None => {
                // Only writers create the open layer, and we hold the writer lock.
                let start = self.layer_map().next_open_layer_at;
                assert!(lsn >= start, "put at {lsn} below the next open layer start {start}");
                let seq = self.ephemeral_seq.fetch_add(1, Ordering::Relaxed);
                let open = Arc::new(InMemoryLayer::create(&self.path, seq, start)?);
                self.modify_layer_map(|m| m.open = Some(open.clone()));
                open
            }
        };
        let fold = FoldThresholds { records: self.conf.fold_after_records, bytes: self.conf.fold_after_bytes };
        if let Some(chain) = open.put(key, lsn, value, fold)? {
            self.queue_long_chain(key, chain);
        }
        w.last_put_lsn = lsn;
        Ok(())
    }

    /// Publishes `lsn`: every value of every log record up to it has been put. Reads at or
    /// below it are answered from now on, and waiters for it wake up.
    pub fn advance_last_record_lsn(&self, lsn: Lsn) -> Result<(), WriteError> {
        let w = lock(&self.write_state);
        if lsn == Lsn::MAX {
            return Err(WriteError::AdvanceInvalid { lsn });
        }
        let mut last = lock(&self.last_record_lsn);
        let floor = last.max(w.last_put_lsn);
        if lsn < floor {
            return Err(WriteError::AdvanceBackwards { lsn, floor });
        }
        *last = lsn;
        self.last_record_lsn_changed.notify_all();
        Ok(())
    }

    /// Waits until `lsn` is published, or `timeout` has passed.
    pub fn wait_lsn(&self, lsn: Lsn, timeout: Duration) -> Result<(), WaitLsnError> {
        let guard = lock(&self.last_record_lsn);
        let (guard, _) = self.last_record_lsn_changed.wait_timeout_while(guard, timeout, |l| *l < lsn).unwrap_or_else(|e| e.into_inner());
        if *guard < lsn {
            let _entered = self.span.enter();
            let err = WaitLsnError::Timeout { awaited: lsn, last_record: *guard, timeout };
            tracing::warn!("{err}");
            return Err(err);
        }
        Ok(())
    }

    /// Closes the open layer at the last record LSN: it becomes read-only, and the next put
    /// starts a new one. Refused while puts above the last record LSN are unpublished.
    pub fn freeze(&self) -> Result<(), WriteError> {
        let w = lock(&self.write_state);
        let last_record = self.last_record_lsn();
        if w.last_put_lsn > last_record {
            return Err(WriteError::UnpublishedPuts { last_record, last_put: w.last_put_lsn });
        }
        let end = Lsn(last_record.0 + 1);
        self.modify_layer_map(|m| {
            if let Some(open) = m.open.take() {
                open.freeze(end);
                m.frozen.push(open);
            }
            m.next_open_layer_at = m.next_open_layer_at.max(end);
        });
        Ok(())
    }

    /// Writes every frozen layer to an L0 delta layer file, oldest first, advancing the
    /// disk-consistent LSN after each.
    pub fn flush_frozen_layers(&self) -> anyhow::Result<()> {
        let _entered = self.span.enter();
        let _flushing = lock(&self.flush_lock);
        while let Some(frozen) = self.layer_map().frozen.first().cloned() {
            let file = frozen.write_l0(&self.path, &self.conf).with_context(|| format!("flush in-memory layer {}", frozen.desc()))?;
            if let Some(file) = &file {
                tracing::info!("flushed layer {} ({} bytes)", file.desc(), file.file_size_bytes());
            }
            let file = file.map(Arc::new);
            self.modify_layer_map(|m| {
                m.frozen.retain(|l| !Arc::ptr_eq(l, &frozen));
                if let Some(file) = &file {
                    m.insert_file(Arc::clone(file));
                }
            });
            let disk_consistent_lsn = self.update_disk_consistent_lsn()?;
            self.schedule_remote(file.as_slice(), &[], disk_consistent_lsn, Lsn::INVALID);
        }
        self.update_disk_consistent_lsn().map(|_| ())
    }

    /// Freezes the open layer and flushes every frozen layer.
    pub fn freeze_and_flush(&self) -> anyhow::Result<()> {
        self.freeze()?;
        self.flush_frozen_layers()
    }

    /// Freezes and flushes once the open layer has reached `checkpoint_distance_bytes` or
    /// is older than `checkpoint_timeout_ms`. Returns whether it did.
    pub fn maybe_freeze_and_flush(&self) -> anyhow::Result<bool> {
        let (size, age) = match self.layer_map().open.as_ref() {
            Some(open) if !open.is_empty() => (open.size_bytes(), open.age()),
            _ => return Ok(false),
        };
        let timeout = self.conf.checkpoint_timeout_ms;
        let too_old = timeout > 0 && age >= Duration::from_millis(timeout);
        if size < self.conf.checkpoint_distance_bytes && !too_old {
            return Ok(false);
        }
        if too_old && size < self.conf.checkpoint_distance_bytes {
            tracing::debug!("open layer is {} ms old ({size} bytes): flushing it", age.as_millis());
        }
        self.freeze_and_flush()?;
        Ok(true)
    }

    /// Persists the disk-consistent LSN implied by the layer map: everything below the
    /// oldest in-memory layer (or below where the next one will start) is in files.
    /// Returns it.
    fn update_disk_consistent_lsn(&self) -> anyhow::Result<Lsn> {
        let map = self.layer_map();
        let oldest_in_memory = map.frozen.first().or(map.open.as_ref()).map_or(map.next_open_layer_at, |l| l.start_lsn());
        let lsn = Lsn(oldest_in_memory.0.saturating_sub(1));
        let mut meta = lock(&self.metadata);
        if lsn > meta.disk_consistent_lsn {
            let new = TimelineMetadata { disk_consistent_lsn: lsn, ..meta.clone() };
            new.write(&self.path)?;
            *meta = new;
        }
        Ok(meta.disk_consistent_lsn)
    }

    /// Tells the upload queue (if any) what changed: layers added and removed, and the
    /// metadata values that changed with them (`Lsn::INVALID` for one that did not). Each
    /// caller passes only what it changed itself, so a concurrent flush's disk-consistent
    /// LSN is never published by another's index before its layer is queued.
    fn schedule_remote(&self, added: &[Arc<LayerFile>], removed: &[LayerDesc], disk_consistent_lsn: Lsn, gc_cutoff_lsn: Lsn) {
        if let Some(remote) = self.remote.get() {
            remote.schedule(added, removed, disk_consistent_lsn, gc_cutoff_lsn);
        }
    }

    /// Connects the timeline to its upload queue, reconciling local disk with what remote
    /// storage holds (`existing`, the newest index of an earlier attachment): local layers
    /// the index names may be evicted from now on, if remote storage has their objects at
    /// the size the index says (one listing; a local copy whose object is missing or of
    /// another size is uploaded again instead, and counts as remote only once that is
    /// done); layers only the index names become evicted layers, downloaded when a read
    /// needs them; local layers it does not name are uploaded; and an index for this
    /// attachment is scheduled.
    /// Every layer remote storage holds for this timeline (its upload done), with its object
    /// and how long since a read last used it (`None`: never, in this process), for a
    /// heatmap (`remote::heatmap`). Empty without remote storage.
    pub fn heatmap_layers(&self) -> Vec<(String, IndexLayer, Option<u64>)> {
        let Some(client) = self.remote.get() else { return Vec::new() };
        let objects: std::collections::BTreeMap<String, IndexLayer> = client.projected_layers().into_iter().collect();
        let map = self.layer_map();
        map.files
            .iter()
            .filter(|f| f.is_remote())
            .filter_map(|f| {
                let name = f.desc().file_name();
                let object = *objects.get(&name)?;
                Some((name, object, f.idle_ms()))
            })
            .collect()
    }

    /// `warm`: a directory of warm copies of this timeline's layers (`remote::heatmap`), which
    /// a layer only remote storage holds is taken from when the index names that very object.
    pub fn attach_remote(
        &self,
        client: Arc<RemoteTimelineClient>,
        existing: Option<&IndexPart>,
        warm: Option<&Path>,
    ) -> anyhow::Result<()> {
        let _entered = self.span.enter();
        let disk_consistent_lsn = self.disk_consistent_lsn();
        let map = self.layer_map();
        let mut to_upload = Vec::new();
        let mut evicted = Vec::new();
        let mut adopted = Vec::new();
        let remote_layers = existing.map(|i| i.layers.clone()).unwrap_or_default();
        let missing = match existing {
            Some(index) => client.layers_missing_from_remote(index).context("check remote storage against its index")?,
            None => Default::default(),
        };
        for file in &map.files {
            let name = file.desc().file_name();
            match (remote_layers.get(&name), missing.get(&name)) {
                (Some(entry), None) => file.set_remote(client.remote_copy(*entry)),
                (Some(_), Some(reason)) => {
                    tracing::warn!("{reason}: uploading the local copy of layer {name} again");
                    to_upload.push(Arc::clone(file));
                }
                (None, _) => to_upload.push(Arc::clone(file)),
            }
        }
        for (name, entry) in &remote_layers {
            let desc: LayerDesc = name.parse().with_context(|| format!("remote index names an invalid layer {name:?}"))?;
            if map.files.iter().any(|f| f.desc() == &desc) {
                continue;
            }
            if desc.lsn_range.end.0 > disk_consistent_lsn.0 + 1 {
                bail!("remote index names layer {name} above the local disk-consistent LSN {disk_consistent_lsn}");
            }
            if let Some(reason) = missing.get(name) {
                tracing::error!("{reason}, and there is no local copy of layer {name}: reads that need it will fail");
            }
            let path = self.path.join(name);
            if warm.is_some_and(|dir| crate::remote::heatmap::adopt(dir, name, entry, &path)) {
                match LayerFile::open(&path) {
                    Ok(file) => {
                        let file = Arc::new(file);
                        if missing.contains_key(name) {
                            // The store lost the object: this copy is the only one now.
                            tracing::warn!("remote storage lacks layer {name}: uploading its warm copy again");
                            to_upload.push(Arc::clone(&file));
                        } else {
                            file.set_remote(client.remote_copy(*entry));
                        }
                        adopted.push(file);
                        continue;
                    }
                    Err(e) => {
                        tracing::warn!("the warm copy of layer {name} does not open ({e}): it is downloaded when a read needs it");
                        let _ = std::fs::remove_file(&path);
                    }
                }
            }
            evicted.push(Arc::new(LayerFile::evicted(path, desc, entry.size_bytes, client.remote_copy(*entry))));
        }
        if !evicted.is_empty() || !to_upload.is_empty() || !adopted.is_empty() {
            tracing::info!(
                "remote storage holds {} layers, {} of them only there and {} taken from warm copies; {} local layers to upload",
                remote_layers.len(),
                evicted.len(),
                adopted.len(),
                to_upload.len()
            );
        }
        self.modify_layer_map(|m| {
            for layer in evicted.into_iter().chain(adopted) {
                m.insert_file(layer);
            }
        });
        // An index of this generation at once, naming only what remote storage holds: the
        // attachment is active from here on (older attachments stop; see `remote`), however
        // long the uploads after it take.
        client.schedule(&[], &[], Lsn::INVALID, Lsn::INVALID);
        client.schedule(&to_upload, &[], disk_consistent_lsn, self.gc_cutoff_lsn());
        self.remote.set(client).map_err(|_| anyhow::anyhow!("timeline already has an upload queue"))?;
        Ok(())
    }

    /// The LSN up to which every version is in remote storage; without remote storage,
    /// the disk-consistent LSN.
    pub fn remote_consistent_lsn(&self) -> Lsn {
        match self.remote.get() {
            Some(remote) => remote.remote_consistent_lsn(),
            None => self.disk_consistent_lsn(),
        }
    }

    /// The remote-consistent LSN and the generation of the attachment that published it
    /// (without remote storage: generation 0 and the disk-consistent LSN). Whoever drops its
    /// log below this position should honour only the newest generation's.
    pub fn remote_position(&self) -> (u32, Lsn) {
        match self.remote.get() {
            Some(remote) => {
                let (generation, lsn) = remote.remote_position();
                (generation.0, lsn)
            }
            None => (0, self.disk_consistent_lsn()),
        }
    }

    /// The service's datum `name` in the timeline's remote index (none without remote
    /// storage): what the service above keeps for the next attachment.
    pub fn remote_service_data(&self, name: &str) -> Option<String> {
        self.remote.get().and_then(|r| r.service_data(name))
    }

    /// Sets or removes the service's datum `name` in the timeline's remote index (nothing
    /// without remote storage).
    pub fn set_remote_service_data(&self, name: &str, value: Option<String>) {
        if let Some(r) = self.remote.get() {
            r.set_service_data(name, value);
        }
    }

    /// The upload queue's state, when the tenant has remote storage.
    pub fn remote_status(&self) -> Option<RemoteStatus> {
        self.remote.get().map(|r| r.status())
    }

    /// Waits until every upload scheduled so far is done; `false` on timeout. Immediately
    /// `true` without remote storage.
    pub fn wait_for_uploads(&self, timeout: Duration) -> bool {
        self.remote.get().is_none_or(|r| r.wait_for_uploads(timeout))
    }

    /// Stops the upload queue (at shutdown).
    pub fn shutdown_remote(&self) {
        if let Some(r) = self.remote.get() {
            r.shutdown();
        }
    }

    /// The layer files on local disk that remote storage also holds: what eviction may
    /// delete.
    pub fn evictable_layers(&self) -> Vec<Arc<LayerFile>> {
        self.layer_map().files.iter().filter(|f| f.is_remote() && f.is_resident()).cloned().collect()
    }

    /// Bytes of layer files on local disk.
    pub fn resident_layer_bytes(&self) -> u64 {
        self.layer_map().files.iter().filter(|f| f.is_resident()).map(|f| f.file_size_bytes()).sum()
    }

    /// Raises the GC cutoff to `cutoff` (never lowers it), persisting it first.
    fn raise_gc_cutoff(&self, cutoff: Lsn) -> anyhow::Result<Lsn> {
        let mut meta = lock(&self.metadata);
        if cutoff > meta.latest_gc_cutoff {
            let new = TimelineMetadata { latest_gc_cutoff: cutoff, ..meta.clone() };
            new.write(&self.path)?;
            *meta = new;
            self.gc_cutoff.store(cutoff.0, Ordering::SeqCst);
        }
        Ok(meta.latest_gc_cutoff)
    }

    /// Deletes layer files that are no longer in the layer map, durably (the local copies;
    /// remote ones go through the upload queue).
    fn delete_layer_files(&self, layers: &[Layer]) -> anyhow::Result<()> {
        for layer in layers {
            if let Layer::File(f) = layer {
                f.remove_local().with_context(|| format!("remove {}", f.path().display()))?;
            }
        }
        if !layers.is_empty() {
            crashsafe::fsync_dir(&self.path).with_context(|| format!("fsync {}", self.path.display()))?;
        }
        Ok(())
    }
}
