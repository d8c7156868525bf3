//! Remote storage as the durable bottom tier: every layer file a timeline creates is
//! uploaded, a per-timeline index names what is there, and a timeline can be loaded from
//! remote storage alone, its layers downloaded when a read needs them.
//!
//! Object keys, relative to the storage's prefix:
//!
//! ```text
//! tenants/<tenant>/generations/<generation>                       a claimed generation
//! tenants/<tenant>/timelines/<timeline>/<layer file name>-<gen>   a layer file
//! tenants/<tenant>/timelines/<timeline>/index_part.json-<gen>     the index (index.rs)
//! ```
//!
//! **Generations.** Each time a process attaches a tenant it claims the next generation
//! (`put_if_absent` of the next number, so two processes never hold the same one) and
//! writes only objects whose keys carry it: it never overwrites an object of another
//! attachment, in particular not another's index. Loading picks the index of the highest
//! generation below its own. Before deleting anything, the queue checks that no newer
//! generation was claimed; a superseded attachment stops uploading and never deletes, so
//! two processes attached to one tenant by mistake cannot destroy each other's data.
//!
//! **The upload queue** (`RemoteTimelineClient`) runs operations in the order they were
//! scheduled, one at a time, on its own thread, each retried with backoff until it
//! succeeds: layer uploads, then the index that names them, then deletions of layers the
//! index no longer names. Each scheduling call changes the *projected* remote state (what
//! remote storage will hold when the queue is empty) from one consistent state to another
//! under one lock, so an index never names a layer that is not uploaded before it, and a
//! layer is deleted only after an index without it is uploaded.
//!
//! The remote-consistent LSN is the disk-consistent LSN of the last index uploaded: every
//! version at or below it is in remote storage.

mod check;
pub mod index;

use std::collections::VecDeque;
use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context};
use bytes::Bytes;
use proto::{Lsn, TenantId, TimelineId};
use remote_storage::{Backoff, RemoteError, RemoteStorage};
use serde::{Deserialize, Serialize};

use crate::layer::{DiskBudget, LayerDesc, LayerDownload, LayerFile, RemoteCopy};
pub use index::{IndexLayer, IndexPart, INDEX_FORMAT_VERSION};

const INDEX_PREFIX: &str = "index_part.json-";

/// An attachment's number; objects carry the generation of the process that wrote them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Generation(pub u32);

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:08x}", self.0)
    }
}

impl Generation {
    fn parse(s: &str) -> Option<Generation> {
        (s.len() == 8).then(|| u32::from_str_radix(s, 16).ok()).flatten().map(Generation)
    }
}

/// One tenant in remote storage, as this attachment sees it.
#[derive(Clone, Debug)]
pub struct TenantRemote {
    storage: RemoteStorage,
    tenant_id: TenantId,
    generation: Generation,
    /// Consulted before each download of an evicted layer (`DiskBudget`), if set.
    disk_budget: Option<Arc<dyn DiskBudget>>,
}

use crate::lock;

/// Waits between attempts of a failing remote operation.
fn backoff() -> Backoff {
    Backoff::new(Duration::from_millis(200), Duration::from_secs(10))
}

impl TenantRemote {
    /// The tenants remote storage holds.
    pub fn tenant_ids(storage: &RemoteStorage) -> anyhow::Result<Vec<TenantId>> {
        let names = storage.list_dirs("tenants")?;
        names.iter().map(|n| n.parse().with_context(|| format!("unexpected entry tenants/{n} in {storage}"))).collect()
    }

    /// Attaches `tenant_id`: claims the next generation.
    pub fn attach(storage: RemoteStorage, tenant_id: TenantId) -> anyhow::Result<TenantRemote> {
        let prefix = format!("tenants/{tenant_id}/generations");
        let claimed = storage.list(&prefix)?;
        let mut next = claimed.iter().filter_map(|o| o.key.rsplit('/').next().and_then(Generation::parse)).max().map_or(1, |g| g.0 + 1);
        loop {
            let key = format!("{prefix}/{}", Generation(next));
            let who = format!("{{\"pid\": {}, \"claimed_at_unix_s\": {}}}\n", std::process::id(), unix_now_s());
            if storage.put_if_absent(&key, Bytes::from(who))? {
                tracing::info!(tenant_id = %tenant_id, "attached to remote storage {storage} as generation {}", Generation(next));
                return Ok(TenantRemote { storage, tenant_id, generation: Generation(next), disk_budget: None });
            }
            next += 1;
        }
    }

    /// Downloads of this tenant's evicted layers make room under `budget` first.
    pub fn with_disk_budget(self, budget: Option<Arc<dyn DiskBudget>>) -> TenantRemote {
        TenantRemote { disk_budget: budget, ..self }
    }

    pub fn generation(&self) -> Generation {
        self.generation
    }

    pub fn storage(&self) -> &RemoteStorage {
        &self.storage
    }

    fn timelines_prefix(&self) -> String {
        format!("tenants/{}/timelines", self.tenant_id)
    }

    fn timeline_prefix(&self, timeline_id: TimelineId) -> String {
        format!("{}/{timeline_id}", self.timelines_prefix())
    }

    fn layer_key(&self, timeline_id: TimelineId, name: &str, generation: Generation) -> String {
        format!("{}/{name}-{generation}", self.timeline_prefix(timeline_id))
    }

    /// The timelines remote storage holds for this tenant.
    pub fn timeline_ids(&self) -> anyhow::Result<Vec<TimelineId>> {
        let names = self.storage.list_dirs(&self.timelines_prefix())?;
        names.iter().map(|n| n.parse().with_context(|| format!("unexpected entry {}/{n}", self.timelines_prefix()))).collect()
    }

    /// The newest index of a timeline written by an earlier generation, checked.
    pub fn download_index(&self, timeline_id: TimelineId) -> anyhow::Result<Option<IndexPart>> {
        let prefix = self.timeline_prefix(timeline_id);
        let newest = self
            .storage
            .list(&prefix)?
            .into_iter()
            .filter_map(|o| {
                o.key.rsplit('/').next().and_then(|n| n.strip_prefix(INDEX_PREFIX)).and_then(Generation::parse).map(|g| (g, o.key))
            })
            .filter(|(g, _)| *g < self.generation)
            .max();
        let Some((_, key)) = newest else { return Ok(None) };
        let bytes = self.storage.get(&key)?;
        let index = IndexPart::decode(&bytes, &key)?;
        if index.timeline_id != timeline_id {
            bail!("remote index {key} is for timeline {}", index.timeline_id);
        }
        Ok(Some(index))
    }

    /// The newest generation claimed for this tenant, if newer than ours.
    fn superseded_by(&self) -> Result<Option<Generation>, RemoteError> {
        let claimed = self.storage.list(&format!("tenants/{}/generations", self.tenant_id))?;
        Ok(claimed.iter().filter_map(|o| o.key.rsplit('/').next().and_then(Generation::parse)).max().filter(|g| *g > self.generation))
    }
}

fn unix_now_s() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Downloads one layer of a timeline, checking size and checksum before it is renamed
/// into place.
#[derive(Debug)]
struct RemoteLayer {
    remote: TenantRemote,
    timeline_id: TimelineId,
    layer: IndexLayer,
    downloads: Arc<AtomicU64>,
}

impl LayerDownload for RemoteLayer {
    fn download(&self, desc: &LayerDesc, path: &Path) -> anyhow::Result<()> {
        let key = self.remote.layer_key(self.timeline_id, &desc.file_name(), self.layer.generation);
        let bytes = remote_storage::retry(
            || self.remote.storage.get(&key),
            backoff(),
            Some(Duration::from_secs(30)),
            |attempt, e| tracing::warn!("download of {key} failed (attempt {attempt}): {e}"),
        )?;
        if bytes.len() as u64 != self.layer.size_bytes {
            bail!("object {key} has {} bytes, the remote index says {}", bytes.len(), self.layer.size_bytes);
        }
        let crc = crc32c::crc32c(&bytes);
        if crc != self.layer.crc32c {
            bail!("object {key} is corrupt: checksum {crc:08X}, the remote index says {:08X}", self.layer.crc32c);
        }
        crashsafe::write_file_atomic(path, &bytes).with_context(|| format!("write {}", path.display()))?;
        self.downloads.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// The state of a timeline's uploads, for status APIs and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RemoteStatus {
    pub generation: u32,
    pub remote_consistent_lsn: Lsn,
    /// Operations waiting or running.
    pub queued_operations: usize,
    /// The error of the last failed attempt while the current operation keeps failing.
    pub last_error: Option<String>,
    /// Seconds since the Unix epoch when the current operation started failing.
    pub failing_since_unix_s: Option<u64>,
    /// Set when another attachment claimed a newer generation: this one stopped.
    pub superseded_by: Option<u32>,
    pub layers_uploaded: u64,
    pub bytes_uploaded: u64,
    pub indexes_uploaded: u64,
    pub objects_deleted: u64,
    pub layers_downloaded: u64,
}

enum Op {
    UploadLayer(Arc<LayerFile>),
    UploadIndex(IndexPart),
    Delete(Vec<String>),
}

struct QueueState {
    /// What remote storage holds once every queued operation is done.
    projected: IndexPart,
    ops: VecDeque<Op>,
    status: RemoteStatus,
}

/// The upload queue of one timeline; see the module documentation.
pub struct RemoteTimelineClient {
    remote: TenantRemote,
    timeline_id: TimelineId,
    state: Mutex<QueueState>,
    /// Signalled when an operation is queued, finished, or shutdown is asked.
    changed: Condvar,
    shutdown: AtomicBool,
    worker: Mutex<Option<JoinHandle<()>>>,
    downloads: Arc<AtomicU64>,
    span: tracing::Span,
}

impl fmt::Debug for RemoteTimelineClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RemoteTimelineClient({}/{})", self.remote.tenant_id, self.timeline_id)
    }
}

impl RemoteTimelineClient {
    /// A queue for `timeline_id`, starting from what remote storage holds (`existing`, the
    /// index of an earlier generation, or nothing for a timeline new to remote storage).
    pub fn start(
        remote: TenantRemote,
        timeline_id: TimelineId,
        ancestor: Option<(TimelineId, Lsn)>,
        existing: Option<IndexPart>,
    ) -> Arc<RemoteTimelineClient> {
        let remote_consistent_lsn = existing.as_ref().map_or(Lsn::INVALID, |i| i.disk_consistent_lsn);
        let projected = existing.unwrap_or(IndexPart {
            format_version: INDEX_FORMAT_VERSION,
            timeline_id,
            generation: remote.generation,
            disk_consistent_lsn: Lsn::INVALID,
            ancestor_timeline_id: ancestor.map(|a| a.0),
            ancestor_lsn: ancestor.map(|a| a.1),
            gc_cutoff_lsn: Lsn::INVALID,
            layers: Default::default(),
        });
        let status = RemoteStatus { generation: remote.generation.0, remote_consistent_lsn, ..Default::default() };
        let span = tracing::info_span!("remote", tenant_id = %remote.tenant_id, timeline_id = %timeline_id);
        let client = Arc::new(RemoteTimelineClient {
            remote,
            timeline_id,
            state: Mutex::new(QueueState { projected, ops: VecDeque::new(), status }),
            changed: Condvar::new(),
            shutdown: AtomicBool::new(false),
            worker: Mutex::new(None),
            downloads: Arc::new(AtomicU64::new(0)),
            span,
        });
        let worker = Arc::downgrade(&client);
        let handle = std::thread::Builder::new()
            .name(format!("upload-{}", &timeline_id.to_string()[..8]))
            .spawn(move || RemoteTimelineClient::run(worker))
            .expect("spawn an upload thread");
        *lock(&client.worker) = Some(handle);
        client
    }

    /// The layers remote storage holds (or will hold once queued uploads are done).
    pub fn projected_layers(&self) -> Vec<(String, IndexLayer)> {
        lock(&self.state).projected.layers.iter().map(|(n, l)| (n.clone(), *l)).collect()
    }

    /// How a layer named in the projected index is brought back after eviction (under the
    /// tenant's disk budget, if it has one).
    pub fn remote_copy(&self, layer: IndexLayer) -> RemoteCopy {
        RemoteCopy {
            download: Arc::new(RemoteLayer {
                remote: self.remote.clone(),
                timeline_id: self.timeline_id,
                layer,
                downloads: Arc::clone(&self.downloads),
            }),
            budget: self.remote.disk_budget.clone(),
        }
    }

    pub fn remote_consistent_lsn(&self) -> Lsn {
        lock(&self.state).status.remote_consistent_lsn
    }

    pub fn status(&self) -> RemoteStatus {
        let state = lock(&self.state);
        let mut status = state.status.clone();
        status.queued_operations = state.ops.len();
        status.layers_downloaded = self.downloads.load(Ordering::Relaxed);
        status
    }

    /// Schedules uploads of `added`, removal of `removed` from the index, new metadata
    /// values, an index upload, and then deletion of the removed layers' objects.
    pub fn schedule(&self, added: &[Arc<LayerFile>], removed: &[LayerDesc], disk_consistent_lsn: Lsn, gc_cutoff_lsn: Lsn) {
        let mut state = lock(&self.state);
        if state.status.superseded_by.is_some() {
            return;
        }
        for layer in added {
            // The size and checksum are filled in when the upload reads the file; the
            // index that names it is built after that (it is queued behind it).
            state
                .projected
                .layers
                .insert(layer.desc().file_name(), IndexLayer { size_bytes: 0, crc32c: 0, generation: self.remote.generation });
            state.ops.push_back(Op::UploadLayer(Arc::clone(layer)));
        }
        let mut deletions = Vec::new();
        for desc in removed {
            let name = desc.file_name();
            if let Some(l) = state.projected.layers.remove(&name) {
                deletions.push(self.remote.layer_key(self.timeline_id, &name, l.generation));
            }
        }
        state.projected.disk_consistent_lsn = state.projected.disk_consistent_lsn.max(disk_consistent_lsn);
        state.projected.gc_cutoff_lsn = state.projected.gc_cutoff_lsn.max(gc_cutoff_lsn);
        state.projected.generation = self.remote.generation;
        let index = state.projected.clone();
        state.ops.push_back(Op::UploadIndex(index));
        if !deletions.is_empty() {
            state.ops.push_back(Op::Delete(deletions));
        }
        self.changed.notify_all();
    }

    /// Waits until every operation queued so far is done (or `timeout` passes); for tests,
    /// checkpoints and a clean shutdown. Returns whether the queue emptied.
    pub fn wait_for_uploads(&self, timeout: Duration) -> bool {
        let state = lock(&self.state);
        let (state, _) = self
            .changed
            .wait_timeout_while(state, timeout, |s| !s.ops.is_empty() && s.status.superseded_by.is_none())
            .unwrap_or_else(|e| e.into_inner());
        state.ops.is_empty()
    }

    /// Stops the worker after the operation in progress; queued operations are dropped
    /// (what they would upload is still on local disk and is scheduled again at load).
    pub fn shutdown(&self) {
        self.shutdown.store(true, Ordering::SeqCst);
        self.changed.notify_all();
        let handle = lock(&self.worker).take();
        if let Some(handle) = handle.filter(|h| h.thread().id() != std::thread::current().id()) {
            let _ = handle.join();
        }
    }

    /// The worker: holds the client only while it has an operation, so that dropping the
    /// last other handle ends it.
    fn run(client: std::sync::Weak<RemoteTimelineClient>) {
        loop {
            let Some(this) = client.upgrade() else { return };
            if this.shutdown.load(Ordering::SeqCst) {
                return;
            }
            let _entered = this.span.clone().entered();
            let op = {
                let state = lock(&this.state);
                let idle = |s: &mut QueueState| s.ops.is_empty() || s.status.superseded_by.is_some();
                let (state, _) = this.changed.wait_timeout_while(state, Duration::from_secs(1), idle).unwrap_or_else(|e| e.into_inner());
                if state.status.superseded_by.is_some() {
                    None
                } else {
                    state.ops.front().map(clone_op)
                }
            };
            if let Some(op) = op {
                this.execute_until_done(&op);
            }
        }
    }

    /// Runs one operation until it succeeds, with backoff, publishing each failure in the
    /// status; gives up only at shutdown or when this attachment is superseded.
    fn execute_until_done(&self, op: &Op) {
        let mut backoff = backoff();
        loop {
            match self.execute(op) {
                Ok(()) => {
                    let mut state = lock(&self.state);
                    state.ops.pop_front();
                    state.status.last_error = None;
                    state.status.failing_since_unix_s = None;
                    drop(state);
                    self.changed.notify_all();
                    return;
                }
                Err(e) => {
                    let message = format!("{e:#}");
                    let mut state = lock(&self.state);
                    if state.status.last_error.as_deref() != Some(&message) {
                        tracing::warn!("remote storage operation failed, retrying: {message}");
                    }
                    state.status.failing_since_unix_s.get_or_insert_with(unix_now_s);
                    state.status.last_error = Some(message);
                    if state.status.superseded_by.is_some() {
                        return;
                    }
                    let delay = backoff.next_delay();
                    let _ = self.changed.wait_timeout_while(state, delay, |_| !self.shutdown.load(Ordering::SeqCst));
                    if self.shutdown.load(Ordering::SeqCst) {
                        return;
                    }
                }
            }
        }
    }

    fn execute(&self, op: &Op) -> anyhow::Result<()> {
        match op {
            Op::UploadLayer(layer) => {
                let reader = layer.reader()?;
                let bytes = Bytes::from(reader.read_all()?);
                let crc = crc32c::crc32c(&bytes);
                let name = layer.desc().file_name();
                let entry = IndexLayer { size_bytes: bytes.len() as u64, crc32c: crc, generation: self.remote.generation };
                let key = self.remote.layer_key(self.timeline_id, &name, entry.generation);
                self.remote.storage.put(&key, bytes)?;
                layer.set_remote(self.remote_copy(entry));
                let mut state = lock(&self.state);
                // Fill in the checksum in the projection and in every queued index.
                if let Some(l) = state.projected.layers.get_mut(&name) {
                    if l.generation == entry.generation {
                        *l = entry;
                    }
                }
                for queued in state.ops.iter_mut() {
                    if let Op::UploadIndex(index) = queued {
                        if let Some(l) = index.layers.get_mut(&name) {
                            *l = entry;
                        }
                    }
                }
                state.status.layers_uploaded += 1;
                state.status.bytes_uploaded += entry.size_bytes;
                tracing::debug!("uploaded layer {name} ({} bytes)", entry.size_bytes);
                Ok(())
            }
            Op::UploadIndex(_) => {
                // The queued copy has the checksums filled in by the uploads before it.
                let index = match lock(&self.state).ops.front() {
                    Some(Op::UploadIndex(index)) => index.clone(),
                    _ => bail!("the upload queue lost its index operation"),
                };
                let key = format!("{}/{INDEX_PREFIX}{}", self.remote.timeline_prefix(self.timeline_id), self.remote.generation);
                self.remote.storage.put(&key, Bytes::from(index.encode()))?;
                let mut state = lock(&self.state);
                state.status.indexes_uploaded += 1;
                state.status.remote_consistent_lsn = state.status.remote_consistent_lsn.max(index.disk_consistent_lsn);
                Ok(())
            }
            Op::Delete(keys) => {
                if let Some(newer) = self.remote.superseded_by()? {
                    tracing::error!(
                        "generation {} of this tenant was claimed by another attachment; this one ({}) stops uploading and never deletes",
                        newer,
                        self.remote.generation
                    );
                    lock(&self.state).status.superseded_by = Some(newer.0);
                    bail!("superseded by generation {newer}");
                }
                for key in keys {
                    self.remote.storage.delete(key)?;
                    lock(&self.state).status.objects_deleted += 1;
                }
                Ok(())
            }
        }
    }
}

fn clone_op(op: &Op) -> Op {
    match op {
        Op::UploadLayer(l) => Op::UploadLayer(Arc::clone(l)),
        Op::UploadIndex(i) => Op::UploadIndex(i.clone()),
        Op::Delete(k) => Op::Delete(k.clone()),
    }
}

impl Drop for RemoteTimelineClient {
    fn drop(&mut self) {
        self.shutdown.store(true, Ordering::SeqCst);
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests;
