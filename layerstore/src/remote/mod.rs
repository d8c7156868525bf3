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
//! tenants/<tenant>/heatmap.json                                   what reads use (heatmap.rs)
//! ```
//!
//! **Generations.** Each time a process attaches a tenant it claims the next generation
//! (`put_if_absent` of the next number, so two processes never hold the same one) and
//! writes only objects whose keys carry it: it never overwrites an object of another
//! attachment, in particular not another's index. Loading picks the index of the highest
//! generation below its own. An attachment uploads an index of its own for every timeline
//! at once (before any layer), which makes its generation *active*.
//!
//! **Supersession** is checked before every index upload and every deletion
//! (`TenantRemote::check_claims`, shared by the tenant's timelines):
//! - a newer generation that is active (it wrote an index for a timeline of the tenant)
//!   supersedes this attachment for good: it uploads no index, deletes nothing, and its
//!   remote-consistent LSN stays where it was, so two processes attached to one tenant by
//!   mistake cannot destroy each other's data or let the log the newer one needs be dropped;
//! - a newer generation that is claimed but not active (its process may be loading, or may
//!   have died right after its claim) is *pending*: uploads go on, deletions wait (that
//!   process may have loaded an index naming the layers), and the remote-consistent LSN
//!   does not move (that process may have loaded an older index and resume from there). A
//!   claim still pending after `StorageConfig::generation_claim_grace_ms` is taken for dead:
//!   this attachment claims the next generation itself and goes on under it, deletions
//!   included. Should the dead claim's process come back after all, its generation is older
//!   than the re-claimed one, which is active: that process is the superseded one, and no
//!   loader ever picks its index.
//!
//! **Issued generations.** Under a storage controller the controller, not the attachment,
//! picks the number (`GenerationSource::Issued`): the claim object is written with exactly
//! it and names the pageserver it was issued to; a claim held by another node, or a newer
//! claim already present, refuses the attach. Such an attachment never overtakes a pending
//! newer claim: the controller issued it, so the node it went to is alive or will be
//! replaced by the controller with a still newer one. Everything else above holds as is.
//!
//! **The remote-consistent LSN** (with the generation it belongs to, `remote_position`) is
//! the disk-consistent LSN of the last index uploaded *and confirmed*: after the upload no
//! newer generation was claimed (a second check). An attachment that claims later reads
//! the indexes after its claim, so it saw that index or a newer one: every position ever
//! published is one the newest attachment has in remote storage, and the log below it may
//! be dropped (by whoever honours only the newest generation's position).
//!
//! **The upload queue** (`RemoteTimelineClient`) runs operations in the order they were
//! scheduled, one at a time, on its own thread, each retried with backoff until it
//! succeeds: layer uploads, then the index that names them, then deletions of layers the
//! index no longer names. Each scheduling call changes the *projected* remote state (what
//! remote storage will hold when the queue is empty) from one consistent state to another
//! under one lock, so an index never names a layer that is not uploaded before it, and a
//! layer is deleted only after an index without it is uploaded.
//!
//! Every version at or below the remote-consistent LSN is in remote storage.

mod check;
pub mod heatmap;
pub mod index;

use std::collections::VecDeque;
use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

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

/// One tenant in remote storage, as this attachment sees it. Clones share the claim state
/// (the tenant's timelines each have one).
#[derive(Clone, Debug)]
pub struct TenantRemote {
    storage: RemoteStorage,
    tenant_id: TenantId,
    claims: Arc<Mutex<Claims>>,
    /// How long a newer claim may stay inactive before this attachment takes it for dead.
    claim_grace: Duration,
    /// Whether it may do so at all (not with a generation a controller issued).
    reclaim: bool,
    /// Consulted before each download of an evicted layer (`DiskBudget`), if set.
    disk_budget: Option<Arc<dyn DiskBudget>>,
}

/// This attachment's generation and what it knows of newer ones.
#[derive(Debug)]
struct Claims {
    generation: Generation,
    /// An active newer generation: this attachment stopped for good.
    superseded_by: Option<Generation>,
    /// The newest claimed generation, newer than ours and not active, and when this
    /// attachment first saw it.
    pending: Option<(Generation, Instant)>,
}

/// Where an attachment's generation comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GenerationSource {
    /// It claims the next one itself (no storage controller).
    SelfClaimed,
    /// The storage controller issued `generation` to pageserver `node_id`.
    Issued { generation: u32, node_id: u64 },
}

/// What `TenantRemote::check_claims` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ClaimCheck {
    /// No generation newer than ours is claimed.
    Clear,
    /// A newer generation is claimed but not active (yet).
    Pending(Generation),
    /// A newer generation is active.
    Superseded(Generation),
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

    /// Attaches `tenant_id`: claims the next generation. A newer claim that stays inactive
    /// for `claim_grace` is taken for dead (see the module documentation).
    pub fn attach(storage: RemoteStorage, tenant_id: TenantId, claim_grace: Duration) -> anyhow::Result<TenantRemote> {
        Self::attach_as(storage, tenant_id, claim_grace, GenerationSource::SelfClaimed)
    }

    /// Attaches `tenant_id` with a generation from `source`. An issued generation is claimed
    /// with exactly its number: refused if another node holds that claim, or if a newer
    /// generation is claimed already (the order is stale). Such an attachment never
    /// overtakes a newer claim, however long it stays inactive: whoever issued the newer one
    /// decides, so deletions wait and the remote-consistent LSN holds until it is active.
    pub fn attach_as(
        storage: RemoteStorage,
        tenant_id: TenantId,
        claim_grace: Duration,
        source: GenerationSource,
    ) -> anyhow::Result<TenantRemote> {
        let (generation, reclaim) = match source {
            GenerationSource::SelfClaimed => {
                if let Some((g, node)) = newest_issued_claim(&storage, tenant_id)? {
                    bail!(
                        "tenant {tenant_id} is placed by a storage controller (its generation {} was issued to pageserver {node}): a pageserver without --controller may not attach it",
                        g.0
                    );
                }
                (claim_next(&storage, tenant_id)?, true)
            }
            GenerationSource::Issued { generation, node_id } => {
                (claim_issued(&storage, tenant_id, Generation(generation), node_id)?, false)
            }
        };
        tracing::info!(tenant_id = %tenant_id, "attached to remote storage {storage} as generation {generation}");
        let claims = Arc::new(Mutex::new(Claims { generation, superseded_by: None, pending: None }));
        Ok(TenantRemote { storage, tenant_id, claims, claim_grace, reclaim, disk_budget: None })
    }

    /// Downloads of this tenant's evicted layers make room under `budget` first.
    pub fn with_disk_budget(self, budget: Option<Arc<dyn DiskBudget>>) -> TenantRemote {
        TenantRemote { disk_budget: budget, ..self }
    }

    /// This attachment's generation (it changes only when a dead claim is overtaken).
    pub fn generation(&self) -> Generation {
        lock(&self.claims).generation
    }

    /// The active newer generation that superseded this attachment, if any.
    pub fn superseded_by(&self) -> Option<Generation> {
        lock(&self.claims).superseded_by
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
        layer_object_key(self.tenant_id, timeline_id, name, generation)
    }

    /// Publishes `heatmap` for the tenant's secondaries, unless this attachment is
    /// superseded (a newer one owns the tenant now, and its heatmap).
    pub fn upload_heatmap(&self, heatmap: &heatmap::Heatmap) -> anyhow::Result<()> {
        if self.superseded_by().is_some() {
            return Ok(());
        }
        heatmap::upload(&self.storage, self.tenant_id, heatmap)
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
            .filter(|(g, _)| *g < self.generation())
            .max();
        let Some((_, key)) = newest else { return Ok(None) };
        let bytes = self.storage.get(&key)?;
        let index = IndexPart::decode(&bytes, &key)?;
        if index.timeline_id != timeline_id {
            bail!("remote index {key} is for timeline {}", index.timeline_id);
        }
        Ok(Some(index))
    }

    fn index_key(&self, timeline_id: TimelineId, generation: Generation) -> String {
        format!("{}/{INDEX_PREFIX}{generation}", self.timeline_prefix(timeline_id))
    }

    /// Whether `generation` wrote an index for any timeline of the tenant (`first`'s is
    /// looked at first: an attachment writes every timeline's at once).
    fn is_active(&self, generation: Generation, first: TimelineId) -> Result<bool, RemoteError> {
        let others = self.storage.list_dirs(&self.timelines_prefix())?;
        let others = others.iter().filter_map(|n| n.parse::<TimelineId>().ok()).filter(|t| *t != first);
        for timeline_id in std::iter::once(first).chain(others) {
            match self.storage.get(&self.index_key(timeline_id, generation)) {
                Ok(_) => return Ok(true),
                Err(RemoteError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    }

    /// Looks for generations claimed after ours (see the module documentation). With
    /// `may_reclaim`, a claim pending for longer than the grace time is overtaken: this
    /// attachment claims the next generation and the answer is `Clear`.
    /// The newest generation claimed in remote storage after this attachment's, if any
    /// (asked of remote storage now): an attachment with a newer claim is on its way out,
    /// and whatever it creates would never reach the next one.
    pub fn newer_claim(&self) -> Result<Option<Generation>, RemoteError> {
        let ours = self.generation();
        let claimed = self.storage.list(&format!("tenants/{}/generations", self.tenant_id))?;
        Ok(claimed.iter().filter_map(|o| o.key.rsplit('/').next().and_then(Generation::parse)).filter(|g| *g > ours).max())
    }

    fn check_claims(&self, timeline_id: TimelineId, may_reclaim: bool) -> Result<ClaimCheck, RemoteError> {
        let ours = self.generation();
        if let Some(g) = self.superseded_by() {
            return Ok(ClaimCheck::Superseded(g));
        }
        let claimed = self.storage.list(&format!("tenants/{}/generations", self.tenant_id))?;
        let mut newer: Vec<Generation> =
            claimed.iter().filter_map(|o| o.key.rsplit('/').next().and_then(Generation::parse)).filter(|g| *g > ours).collect();
        newer.sort_unstable_by(|a, b| b.cmp(a));
        let Some(&newest) = newer.first() else {
            let mut claims = lock(&self.claims);
            if claims.generation == ours {
                claims.pending = None;
            }
            return Ok(ClaimCheck::Clear);
        };
        for &g in &newer {
            if self.is_active(g, timeline_id)? {
                let mut claims = lock(&self.claims);
                if claims.generation == ours && claims.superseded_by.is_none() {
                    if self.reclaim {
                        tracing::error!(
                            "generation {g} of this tenant is active in another attachment; this one ({ours}) stops uploading, never deletes, and its remote-consistent LSN stays"
                        );
                    } else {
                        // The storage controller moved the tenant (a planned migration, or a
                        // failover this node was cut off from): the expected way out, and it
                        // orders this node to let go in its time.
                        tracing::info!(
                            "generation {g} of this tenant, issued by the storage controller, is active in another attachment; this one ({ours}) stops uploading, never deletes, and serves reads until it is told to let go"
                        );
                    }
                    claims.superseded_by = Some(g);
                }
                return Ok(ClaimCheck::Superseded(claims.superseded_by.unwrap_or(g)));
            }
        }
        let mut claims = lock(&self.claims);
        if claims.generation != ours {
            // Another timeline of the tenant overtook the claim meanwhile.
            return Ok(ClaimCheck::Clear);
        }
        let since = match claims.pending {
            Some((g, since)) if g == newest => since,
            _ => {
                tracing::warn!(
                    "generation {newest} of this tenant was claimed by another attachment that is not active yet: deletions wait and the remote-consistent LSN holds until it is, or for {:?} at most",
                    self.claim_grace
                );
                claims.pending = Some((newest, Instant::now()));
                Instant::now()
            }
        };
        if !may_reclaim || !self.reclaim || since.elapsed() < self.claim_grace {
            return Ok(ClaimCheck::Pending(newest));
        }
        let generation = claim_next(&self.storage, self.tenant_id)?;
        tracing::warn!(
            "generation {newest} stayed inactive for {:?}: taken for dead, this attachment goes on as generation {generation} (was {ours})",
            self.claim_grace
        );
        claims.generation = generation;
        claims.pending = None;
        Ok(ClaimCheck::Clear)
    }

    /// When the pending claim, if any, may be overtaken.
    fn pending_deadline(&self) -> Option<Instant> {
        lock(&self.claims).pending.map(|(_, since)| since + self.claim_grace)
    }
}

/// The newest index of every timeline of `tenant_id` in remote storage, read without
/// attaching (for deciding whether local files are behind what another attachment wrote).
pub fn newest_indexes(storage: &RemoteStorage, tenant_id: TenantId) -> anyhow::Result<std::collections::BTreeMap<TimelineId, IndexPart>> {
    let mut newest: std::collections::BTreeMap<TimelineId, (Generation, String)> = Default::default();
    for o in storage.list(&format!("tenants/{tenant_id}/timelines"))? {
        let mut parts = o.key.rsplit('/');
        let (Some(name), Some(timeline)) = (parts.next(), parts.next()) else { continue };
        let (Some(g), Ok(timeline)) = (name.strip_prefix(INDEX_PREFIX).and_then(Generation::parse), timeline.parse::<TimelineId>()) else {
            continue;
        };
        if newest.get(&timeline).is_none_or(|(old, _)| *old < g) {
            newest.insert(timeline, (g, o.key.clone()));
        }
    }
    newest
        .into_iter()
        .map(|(timeline, (_, key))| {
            let bytes = storage.get(&key)?;
            Ok((timeline, IndexPart::decode(&bytes, &key)?))
        })
        .collect()
}

/// What a claim object says: who claimed it.
#[derive(Debug, Serialize, Deserialize)]
struct ClaimNote {
    pid: u32,
    claimed_at_unix_s: u64,
    /// The pageserver an issued generation was given to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    node_id: Option<u64>,
}

fn claim_note(node_id: Option<u64>) -> Bytes {
    let note = ClaimNote { pid: std::process::id(), claimed_at_unix_s: unix_now_s(), node_id };
    Bytes::from(serde_json::to_string(&note).expect("a claim note encodes") + "\n")
}

/// The newest claim of `tenant_id`, if a storage controller issued it: its generation and
/// the node it went to.
fn newest_issued_claim(storage: &RemoteStorage, tenant_id: TenantId) -> anyhow::Result<Option<(Generation, u64)>> {
    let prefix = format!("tenants/{tenant_id}/generations");
    let newest =
        storage.list(&prefix)?.into_iter().filter_map(|o| o.key.rsplit('/').next().and_then(Generation::parse).map(|g| (g, o.key))).max();
    let Some((g, key)) = newest else { return Ok(None) };
    let note = serde_json::from_slice::<ClaimNote>(&storage.get(&key)?).ok();
    Ok(note.and_then(|n| n.node_id).map(|node| (g, node)))
}

/// Claims the generation a controller issued to `node_id`: the claim object is ours if we
/// create it, or if it already names this node (an attach of the same order again, after a
/// restart or a retried request). Refused when another node holds it or when a newer
/// generation is claimed.
fn claim_issued(storage: &RemoteStorage, tenant_id: TenantId, generation: Generation, node_id: u64) -> anyhow::Result<Generation> {
    let prefix = format!("tenants/{tenant_id}/generations");
    let key = format!("{prefix}/{generation}");
    if !storage.put_if_absent(&key, claim_note(Some(node_id)))? {
        let bytes = storage.get(&key)?;
        let holder = serde_json::from_slice::<ClaimNote>(&bytes).ok().and_then(|n| n.node_id);
        if holder != Some(node_id) {
            bail!(
                "generation {} of tenant {tenant_id} is claimed by {} in remote storage, not by pageserver {node_id}: refusing to attach with it",
                generation.0,
                holder.map_or("an attachment without a controller".to_string(), |n| format!("pageserver {n}"))
            );
        }
    }
    let newest = storage.list(&prefix)?.iter().filter_map(|o| o.key.rsplit('/').next().and_then(Generation::parse)).max();
    if let Some(newest) = newest.filter(|g| *g > generation) {
        bail!(
            "tenant {tenant_id} has generation {} claimed in remote storage, newer than {}: the order to attach is stale",
            newest.0,
            generation.0
        );
    }
    Ok(generation)
}

/// Claims the next generation of `tenant_id` (the lowest number above every claim).
fn claim_next(storage: &RemoteStorage, tenant_id: TenantId) -> Result<Generation, RemoteError> {
    let prefix = format!("tenants/{tenant_id}/generations");
    let claimed = storage.list(&prefix)?;
    let mut next = claimed.iter().filter_map(|o| o.key.rsplit('/').next().and_then(Generation::parse)).max().map_or(1, |g| g.0 + 1);
    loop {
        let key = format!("{prefix}/{}", Generation(next));
        if storage.put_if_absent(&key, claim_note(None))? {
            return Ok(Generation(next));
        }
        next += 1;
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

/// The object key of a layer file uploaded by `generation`.
pub(crate) fn layer_object_key(tenant: TenantId, timeline_id: TimelineId, name: &str, generation: Generation) -> String {
    format!("tenants/{tenant}/timelines/{timeline_id}/{name}-{generation}")
}

/// The layer object `key`, retried for up to 30 s, checked against the size and CRC-32C
/// the remote index recorded for it.
fn get_checked(storage: &RemoteStorage, key: &str, layer: &IndexLayer) -> anyhow::Result<Bytes> {
    let bytes = remote_storage::retry(
        || storage.get(key),
        backoff(),
        Some(Duration::from_secs(30)),
        |attempt, e| tracing::warn!("download of {key} failed (attempt {attempt}): {e}"),
    )?;
    check_object(key, bytes, layer)
}

/// `bytes`, read from `key`, if they are the object the index describes.
fn check_object(key: &str, bytes: Bytes, layer: &IndexLayer) -> anyhow::Result<Bytes> {
    if bytes.len() as u64 != layer.size_bytes {
        bail!("object {key} has {} bytes, the remote index says {}", bytes.len(), layer.size_bytes);
    }
    let crc = crc32c::crc32c(&bytes);
    if crc != layer.crc32c {
        bail!("object {key} is corrupt: checksum {crc:08X}, the remote index says {:08X}", layer.crc32c);
    }
    Ok(bytes)
}

impl LayerDownload for RemoteLayer {
    fn download(&self, desc: &LayerDesc, path: &Path) -> anyhow::Result<()> {
        let key = self.remote.layer_key(self.timeline_id, &desc.file_name(), self.layer.generation);
        let bytes = get_checked(&self.remote.storage, &key, &self.layer)?;
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
    /// Set when another attachment's newer generation became active: this one stopped.
    pub superseded_by: Option<u32>,
    /// A newer generation claimed but not active yet: deletions wait, the remote-consistent
    /// LSN holds (see the module documentation).
    pub pending_claim: Option<u32>,
    /// Deletions waiting for a pending claim to resolve.
    pub deferred_deletions: usize,
    pub layers_uploaded: u64,
    pub bytes_uploaded: u64,
    pub indexes_uploaded: u64,
    pub objects_deleted: u64,
    pub layers_downloaded: u64,
}

enum Op {
    /// The layer and the generation it is uploaded under (its key and index entry).
    UploadLayer(Arc<LayerFile>, Generation),
    UploadIndex(IndexPart),
    Delete(Vec<String>),
}

struct QueueState {
    /// What remote storage holds once every queued operation is done.
    projected: IndexPart,
    ops: VecDeque<Op>,
    status: RemoteStatus,
    /// Object keys whose deletion waits for a pending claim to resolve.
    deferred_deletions: Vec<String>,
    /// The disk-consistent LSN of the last index uploaded but not confirmed (a newer claim
    /// was seen after it): published once an index upload is confirmed.
    unconfirmed: Option<Lsn>,
    /// The generation this timeline's last index went under. Deletions run only when it is
    /// the attachment's generation now: after a re-claim, the newest index of the timeline
    /// may be a slow claimant's that names the objects (a loader picks the highest
    /// generation below its own), until this attachment's index under the new generation
    /// is uploaded.
    index_generation: Option<Generation>,
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
            generation: remote.generation(),
            disk_consistent_lsn: Lsn::INVALID,
            ancestor_timeline_id: ancestor.map(|a| a.0),
            ancestor_lsn: ancestor.map(|a| a.1),
            gc_cutoff_lsn: Lsn::INVALID,
            layers: Default::default(),
            service_data: Default::default(),
        });
        let generation = remote.generation();
        let projected = IndexPart { generation, ..projected };
        let status = RemoteStatus { generation: generation.0, remote_consistent_lsn, ..Default::default() };
        let span = tracing::info_span!("remote", tenant_id = %remote.tenant_id, timeline_id = %timeline_id);
        let client = Arc::new(RemoteTimelineClient {
            remote,
            timeline_id,
            state: Mutex::new(QueueState {
                projected,
                ops: VecDeque::new(),
                status,
                deferred_deletions: Vec::new(),
                unconfirmed: None,
                index_generation: None,
            }),
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

    /// The remote-consistent LSN and the generation that published it, read together: what
    /// the caller publishes as how far remote storage goes.
    pub fn remote_position(&self) -> (Generation, Lsn) {
        let state = lock(&self.state);
        (Generation(state.status.generation), state.status.remote_consistent_lsn)
    }

    pub fn status(&self) -> RemoteStatus {
        let state = lock(&self.state);
        let mut status = state.status.clone();
        status.queued_operations = state.ops.len();
        status.layers_downloaded = self.downloads.load(Ordering::Relaxed);
        status.superseded_by = self.remote.superseded_by().map(|g| g.0);
        status.deferred_deletions = state.deferred_deletions.len();
        status
    }

    /// Schedules uploads of `added`, removal of `removed` from the index, new metadata
    /// values, an index upload, and then deletion of the removed layers' objects.
    pub fn schedule(&self, added: &[Arc<LayerFile>], removed: &[LayerDesc], disk_consistent_lsn: Lsn, gc_cutoff_lsn: Lsn) {
        let mut state = lock(&self.state);
        if self.remote.superseded_by().is_some() {
            return;
        }
        let generation = self.remote.generation();
        for layer in added {
            // The size and checksum are filled in when the upload reads the file; the
            // index that names it is built after that (it is queued behind it).
            state.projected.layers.insert(layer.desc().file_name(), IndexLayer { size_bytes: 0, crc32c: 0, generation });
            state.ops.push_back(Op::UploadLayer(Arc::clone(layer), generation));
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
        state.projected.generation = generation;
        let index = state.projected.clone();
        state.ops.push_back(Op::UploadIndex(index));
        if !deletions.is_empty() {
            state.ops.push_back(Op::Delete(deletions));
        }
        self.changed.notify_all();
    }

    /// The service's datum `name` in the projected index.
    pub fn service_data(&self, name: &str) -> Option<String> {
        lock(&self.state).projected.service_data.get(name).cloned()
    }

    /// Sets (or, with `None`, removes) the service's datum `name` in the index: an index
    /// upload is scheduled when it changed.
    pub fn set_service_data(&self, name: &str, value: Option<String>) {
        let mut state = lock(&self.state);
        if state.projected.service_data.get(name) == value.as_ref() || self.remote.superseded_by().is_some() {
            return;
        }
        match value {
            Some(v) => state.projected.service_data.insert(name.to_string(), v),
            None => state.projected.service_data.remove(name),
        };
        state.projected.generation = self.remote.generation();
        let index = state.projected.clone();
        state.ops.push_back(Op::UploadIndex(index));
        self.changed.notify_all();
    }

    /// Waits until every operation queued so far is done (or `timeout` passes); for tests,
    /// checkpoints and a clean shutdown. Returns whether the queue emptied.
    pub fn wait_for_uploads(&self, timeout: Duration) -> bool {
        let state = lock(&self.state);
        let (state, _) = self
            .changed
            .wait_timeout_while(state, timeout, |s| !s.ops.is_empty() && self.remote.superseded_by().is_none())
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
                let idle = |s: &mut QueueState| s.ops.is_empty() || this.remote.superseded_by().is_some();
                let (mut state, _) =
                    this.changed.wait_timeout_while(state, Duration::from_secs(1), idle).unwrap_or_else(|e| e.into_inner());
                // An idle queue with work held back by a pending claim uploads the index
                // again (and runs the deletions that wait) once the claim may be overtaken or
                // has been (by another timeline of the tenant), so that what was held back
                // goes on without waiting for the next flush.
                let held_back = state.unconfirmed.is_some() || !state.deferred_deletions.is_empty();
                let due = this.remote.pending_deadline().is_none_or(|d| Instant::now() >= d);
                if state.ops.is_empty() && held_back && due && this.remote.superseded_by().is_none() {
                    let index = state.projected.clone();
                    state.ops.push_back(Op::UploadIndex(index));
                    if !state.deferred_deletions.is_empty() {
                        state.ops.push_back(Op::Delete(Vec::new()));
                    }
                }
                if this.remote.superseded_by().is_some() {
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
                    let superseded = self.remote.superseded_by().is_some();
                    let mut state = lock(&self.state);
                    // A superseded attachment's stop was logged when it was found.
                    if state.status.last_error.as_deref() != Some(&message) && !superseded {
                        tracing::warn!("remote storage operation failed, retrying: {message}");
                    }
                    state.status.failing_since_unix_s.get_or_insert_with(unix_now_s);
                    state.status.last_error = Some(message);
                    if self.remote.superseded_by().is_some() {
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

    /// Records a claim check in the status; an error for a superseded attachment (the
    /// worker then stops).
    fn note_claims(&self, check: ClaimCheck) -> anyhow::Result<ClaimCheck> {
        let mut state = lock(&self.state);
        state.status.pending_claim = match check {
            ClaimCheck::Pending(g) => Some(g.0),
            _ => None,
        };
        if let ClaimCheck::Superseded(g) = check {
            bail!("superseded by generation {g}");
        }
        Ok(check)
    }

    fn execute(&self, op: &Op) -> anyhow::Result<()> {
        match op {
            Op::UploadLayer(layer, generation) => {
                let reader = layer.reader()?;
                let bytes = Bytes::from(reader.read_all()?);
                let crc = crc32c::crc32c(&bytes);
                let name = layer.desc().file_name();
                let entry = IndexLayer { size_bytes: bytes.len() as u64, crc32c: crc, generation: *generation };
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
                // Before: never an index of a superseded attachment (this may overtake a
                // dead claim, and so change the generation the index goes under).
                self.note_claims(self.remote.check_claims(self.timeline_id, true)?)?;
                // The queued copy has the checksums filled in by the uploads before it.
                let mut index = match lock(&self.state).ops.front() {
                    Some(Op::UploadIndex(index)) => index.clone(),
                    _ => bail!("the upload queue lost its index operation"),
                };
                let generation = self.remote.generation();
                index.generation = generation;
                self.remote.storage.put(&self.remote.index_key(self.timeline_id, generation), Bytes::from(index.encode()))?;
                // After: the position is published only if no newer generation was claimed
                // meanwhile (a later claimant reads the indexes after its claim, so it has
                // this one or a newer one).
                let after = self.note_claims(self.remote.check_claims(self.timeline_id, false)?)?;
                let mut state = lock(&self.state);
                state.status.indexes_uploaded += 1;
                state.index_generation = Some(generation);
                if after == ClaimCheck::Clear && self.remote.generation() == generation {
                    let lsn = state.status.remote_consistent_lsn.max(index.disk_consistent_lsn);
                    state.status.remote_consistent_lsn = lsn;
                    state.status.generation = generation.0;
                    state.unconfirmed = None;
                } else {
                    state.unconfirmed = Some(index.disk_consistent_lsn);
                }
                Ok(())
            }
            Op::Delete(keys) => {
                // Never overtakes a claim itself: a re-claim here would delete before the new
                // generation has an index of this timeline (the idle queue's index upload
                // overtakes it, then the deletions follow).
                let check = self.note_claims(self.remote.check_claims(self.timeline_id, false)?)?;
                let indexed = lock(&self.state).index_generation == Some(self.remote.generation());
                if check != ClaimCheck::Clear || !indexed {
                    // A claimant may have loaded an index that names these objects, or the
                    // newest index of the timeline may still be another attachment's.
                    let mut state = lock(&self.state);
                    tracing::info!("{} deletions wait until this attachment's generation has the newest index", keys.len());
                    state.deferred_deletions.extend(keys.iter().cloned());
                    return Ok(());
                }
                let deferred = lock(&self.state).deferred_deletions.clone();
                for key in deferred.iter().chain(keys) {
                    self.remote.storage.delete(key)?;
                    let mut state = lock(&self.state);
                    state.deferred_deletions.retain(|k| k != key);
                    state.status.objects_deleted += 1;
                }
                Ok(())
            }
        }
    }
}

fn clone_op(op: &Op) -> Op {
    match op {
        Op::UploadLayer(l, g) => Op::UploadLayer(Arc::clone(l), *g),
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
