//! A tenant: a directory of timelines that may branch from one another.
//!
//! ```text
//! <tenants dir>/<tenant id>/timelines/<timeline id>/metadata
//!                                                  /<layer files>
//! ```
//! Creating a timeline, empty or as a branch, writes only its metadata file, into a
//! temporary directory that is renamed into place: a crash leaves the timeline complete
//! or absent. A branch is O(1): it copies nothing, and reads fall through to the ancestor
//! at the branch point. Loading orders timelines so that every ancestor is loaded before
//! its children.
//!
//! Invariants: a branch point is at or below the ancestor's last record LSN, at or above
//! its GC cutoff and at or above its own branch point, all checked under `gc_lock`, which
//! GC also holds, so GC always knows every child's branch point.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context};
use proto::{Lsn, TenantId, TimelineId};
use remote_storage::RemoteStorage;

use crate::config::StorageConfig;
use crate::error::CreateTimelineError;
use crate::layer::DiskBudget;
use crate::remote::{GenerationSource, IndexPart, RemoteTimelineClient, TenantRemote};
use crate::timeline::{GcResult, Timeline, TimelineMetadata};

const TIMELINES_DIR: &str = "timelines";

pub struct Tenant {
    tenant_id: TenantId,
    path: PathBuf,
    conf: Arc<StorageConfig>,
    timelines: Mutex<BTreeMap<TimelineId, Arc<Timeline>>>,
    /// Held by branch creation and GC: a branch point is either checked against a GC cutoff
    /// that GC will not raise meanwhile, or known to GC as a point to retain.
    gc_lock: Mutex<()>,
    span: tracing::Span,
    /// Names in timeline directories that belong to the caller (see `load`).
    foreign_entries: &'static [&'static str],
    /// This attachment to remote storage, if the tenant has one.
    remote: Option<TenantRemote>,
}

use crate::lock;

impl Tenant {
    /// Creates the directory of a new tenant under `tenants_dir`. `foreign_entries` as for
    /// `load`: a created tenant treats its timeline directories as a loaded one does.
    pub fn create(
        tenants_dir: &Path,
        tenant_id: TenantId,
        conf: StorageConfig,
        foreign_entries: &'static [&'static str],
    ) -> anyhow::Result<Tenant> {
        Tenant::create_with_remote(tenants_dir, tenant_id, conf, foreign_entries, None, None)
    }

    /// `create`, with remote storage: refused if remote storage already holds the tenant
    /// (attach it instead, by loading). `disk_budget` as for `load_with_remote`.
    pub fn create_with_remote(
        tenants_dir: &Path,
        tenant_id: TenantId,
        conf: StorageConfig,
        foreign_entries: &'static [&'static str],
        remote: Option<&RemoteStorage>,
        disk_budget: Option<Arc<dyn DiskBudget>>,
    ) -> anyhow::Result<Tenant> {
        conf.validate()?;
        let path = tenants_dir.join(tenant_id.to_string());
        if path.exists() {
            bail!("tenant {tenant_id} already exists in {}", tenants_dir.display());
        }
        if let Some(storage) = remote {
            if TenantRemote::tenant_ids(storage)?.contains(&tenant_id) {
                bail!("tenant {tenant_id} already exists in remote storage {storage}");
            }
        }
        create_tenant_dir(&path)?;
        Tenant::load_with_remote(tenants_dir, tenant_id, conf, foreign_entries, remote, disk_budget)
    }

    /// Loads a tenant and all its timelines from `tenants_dir`. Entries of timeline
    /// directories named in `foreign_entries` are the caller's, and left alone.
    pub fn load(
        tenants_dir: &Path,
        tenant_id: TenantId,
        conf: StorageConfig,
        foreign_entries: &'static [&'static str],
    ) -> anyhow::Result<Tenant> {
        Tenant::load_with_remote(tenants_dir, tenant_id, conf, foreign_entries, None, None)
    }

    /// `load`, attached to remote storage: claims a new generation, creates the local
    /// directories of timelines (and of the tenant) that only remote storage holds from
    /// their indexes, loads, and connects every timeline to its upload queue
    /// (`Timeline::attach_remote`). With an empty local directory this rebuilds the tenant
    /// from remote storage alone; its layers are downloaded when reads need them. With a
    /// `disk_budget`, every download of an evicted layer asks it to make room first
    /// (`layer::DiskBudget`); it is ignored without remote storage (nothing is evicted).
    pub fn load_with_remote(
        tenants_dir: &Path,
        tenant_id: TenantId,
        conf: StorageConfig,
        foreign_entries: &'static [&'static str],
        remote: Option<&RemoteStorage>,
        disk_budget: Option<Arc<dyn DiskBudget>>,
    ) -> anyhow::Result<Tenant> {
        Self::load_as(tenants_dir, tenant_id, conf, foreign_entries, remote, disk_budget, GenerationSource::SelfClaimed, None)
    }

    /// `load_with_remote` with the generation from `generation` (a storage controller's),
    /// taking the layers only remote storage holds from the warm copies in `warm`
    /// (`<warm>/<timeline>/`, as a secondary downloads them: `remote::heatmap`) where they
    /// are the very objects the loaded index names.
    #[allow(clippy::too_many_arguments)]
    pub fn load_as(
        tenants_dir: &Path,
        tenant_id: TenantId,
        conf: StorageConfig,
        foreign_entries: &'static [&'static str],
        remote: Option<&RemoteStorage>,
        disk_budget: Option<Arc<dyn DiskBudget>>,
        generation: GenerationSource,
        warm: Option<&Path>,
    ) -> anyhow::Result<Tenant> {
        conf.validate()?;
        let conf = Arc::new(conf);
        let path = tenants_dir.join(tenant_id.to_string());
        let span = tracing::info_span!("tenant", tenant_id = %tenant_id);
        let entered = span.enter();
        let timelines_dir = path.join(TIMELINES_DIR);
        let remote = match remote {
            None => None,
            Some(storage) => {
                let grace = std::time::Duration::from_millis(conf.generation_claim_grace_ms);
                Some(TenantRemote::attach_as(storage.clone(), tenant_id, grace, generation)?.with_disk_budget(disk_budget))
            }
        };
        let mut indexes: BTreeMap<TimelineId, IndexPart> = BTreeMap::new();
        if let Some(remote) = &remote {
            if !path.exists() {
                create_tenant_dir(&path)?;
            }
            for id in remote.timeline_ids()? {
                let Some(index) = remote.download_index(id)? else { continue };
                let dir = timelines_dir.join(id.to_string());
                if !dir.exists() {
                    tracing::info!("restoring timeline {id} from remote storage at {}", index.disk_consistent_lsn);
                    let meta = TimelineMetadata {
                        timeline_id: id,
                        disk_consistent_lsn: index.disk_consistent_lsn,
                        ancestor: index.ancestor(),
                        latest_gc_cutoff: index.gc_cutoff_lsn,
                    };
                    write_timeline_dir(&dir, &meta)?;
                }
                indexes.insert(id, index);
            }
        }
        let mut metas = BTreeMap::new();
        for entry in fs::read_dir(&timelines_dir).with_context(|| format!("list {}", timelines_dir.display()))? {
            let entry = entry.with_context(|| format!("list {}", timelines_dir.display()))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if crashsafe::is_temp_name(&name) {
                tracing::info!("removing unfinished timeline directory {name}");
                crashsafe::remove_temp(&entry.path()).with_context(|| format!("remove {}", entry.path().display()))?;
                continue;
            }
            let id: TimelineId = name.parse().with_context(|| format!("unexpected entry in {}", timelines_dir.display()))?;
            metas.insert(id, TimelineMetadata::read(&entry.path(), id)?);
        }
        // Load ancestors before children: repeatedly load the timelines whose ancestor is
        // loaded. A round that loads nothing means a missing ancestor or a cycle.
        let mut loaded: BTreeMap<TimelineId, Arc<Timeline>> = BTreeMap::new();
        while loaded.len() < metas.len() {
            let before = loaded.len();
            for (id, meta) in &metas {
                if loaded.contains_key(id) {
                    continue;
                }
                let ancestor = match meta.ancestor {
                    None => None,
                    Some((ancestor_id, _)) => match loaded.get(&ancestor_id) {
                        Some(a) => Some(a.clone()),
                        None => continue,
                    },
                };
                let timeline =
                    Timeline::load(conf.clone(), tenant_id, *id, &timelines_dir.join(id.to_string()), ancestor, foreign_entries)?;
                loaded.insert(*id, timeline);
            }
            if loaded.len() == before {
                let missing: Vec<String> = metas.keys().filter(|id| !loaded.contains_key(id)).map(|id| id.to_string()).collect();
                bail!("cannot load timelines {}: their ancestors are missing", missing.join(", "));
            }
        }
        if let Some(remote) = &remote {
            for (id, timeline) in &loaded {
                let client = RemoteTimelineClient::start(
                    remote.clone(),
                    *id,
                    timeline.ancestor_timeline_id().zip(timeline.ancestor_lsn()),
                    indexes.get(id).cloned(),
                );
                let warm = warm.map(|w| w.join(id.to_string()));
                timeline
                    .attach_remote(client, indexes.get(id), warm.as_deref())
                    .with_context(|| format!("attach timeline {id} to remote storage"))?;
            }
        }
        tracing::info!("loaded {} timelines", loaded.len());
        drop(entered);
        Ok(Tenant { tenant_id, path, conf, timelines: Mutex::new(loaded), gc_lock: Mutex::new(()), span, foreign_entries, remote })
    }

    /// What this attachment's reads use, for its secondaries (`remote::heatmap`); `None`
    /// without remote storage.
    pub fn heatmap(&self) -> Option<crate::remote::heatmap::Heatmap> {
        let remote = self.remote.as_ref()?;
        let layers = self.timelines().into_iter().map(|t| (t.timeline_id(), t.heatmap_layers())).collect();
        Some(crate::remote::heatmap::build(remote.generation(), layers))
    }

    /// This attachment to remote storage, if any.
    pub fn remote(&self) -> Option<&TenantRemote> {
        self.remote.as_ref()
    }

    /// Stops every timeline's upload queue (at shutdown, after `flush_all` and, if wanted,
    /// `Timeline::wait_for_uploads`).
    pub fn shutdown_remote(&self) {
        for timeline in self.timelines() {
            timeline.shutdown_remote();
        }
    }

    pub fn tenant_id(&self) -> TenantId {
        self.tenant_id
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn conf(&self) -> &StorageConfig {
        &self.conf
    }

    pub fn get_timeline(&self, timeline_id: TimelineId) -> Option<Arc<Timeline>> {
        lock(&self.timelines).get(&timeline_id).cloned()
    }

    pub fn timelines(&self) -> Vec<Arc<Timeline>> {
        lock(&self.timelines).values().cloned().collect()
    }

    /// Creates an empty timeline with no ancestor. Its first put may be at any valid LSN.
    pub fn create_timeline(&self, timeline_id: TimelineId) -> Result<Arc<Timeline>, CreateTimelineError> {
        let _entered = self.span.enter();
        let meta = TimelineMetadata { timeline_id, disk_consistent_lsn: Lsn::INVALID, ancestor: None, latest_gc_cutoff: Lsn::INVALID };
        self.install_timeline(meta, None)
    }

    /// Creates timeline `timeline_id` as a branch of `ancestor_id` at LSN `at`: it sees the
    /// ancestor's versions up to `at` and its own after. Writes only a metadata file.
    pub fn branch_timeline(&self, timeline_id: TimelineId, ancestor_id: TimelineId, at: Lsn) -> Result<Arc<Timeline>, CreateTimelineError> {
        let _entered = self.span.enter();
        let _gc = lock(&self.gc_lock);
        let ancestor = self.get_timeline(ancestor_id).ok_or(CreateTimelineError::AncestorNotFound(ancestor_id))?;
        let last_record = ancestor.last_record_lsn();
        if at > last_record {
            return Err(CreateTimelineError::LsnNotReached { at, last_record });
        }
        let horizon = ancestor.gc_cutoff_lsn();
        if at < horizon {
            return Err(CreateTimelineError::BelowGcHorizon { at, horizon });
        }
        if let Some(grand) = ancestor.ancestor() {
            if at < grand.lsn {
                return Err(CreateTimelineError::BelowAncestorBranchPoint {
                    at,
                    ancestor_lsn: grand.lsn,
                    grandparent: grand.timeline.timeline_id(),
                });
            }
        }
        let meta = TimelineMetadata { timeline_id, disk_consistent_lsn: at, ancestor: Some((ancestor_id, at)), latest_gc_cutoff: horizon };
        let timeline = self.install_timeline(meta, Some(ancestor))?;
        tracing::info!("created timeline {timeline_id} as a branch of {ancestor_id} at {at}");
        Ok(timeline)
    }

    /// Writes a new timeline's directory crash-safely, loads it and registers it.
    fn install_timeline(&self, meta: TimelineMetadata, ancestor: Option<Arc<Timeline>>) -> Result<Arc<Timeline>, CreateTimelineError> {
        let timeline_id = meta.timeline_id;
        let mut timelines = lock(&self.timelines);
        if timelines.contains_key(&timeline_id) {
            return Err(CreateTimelineError::AlreadyExists(timeline_id));
        }
        let other = |error: anyhow::Error| CreateTimelineError::Other { timeline_id, error };
        let path = self.path.join(TIMELINES_DIR).join(timeline_id.to_string());
        write_timeline_dir(&path, &meta).map_err(other)?;
        let timeline =
            Timeline::load(self.conf.clone(), self.tenant_id, timeline_id, &path, ancestor, self.foreign_entries).map_err(other)?;
        if let Some(remote) = &self.remote {
            let client = RemoteTimelineClient::start(remote.clone(), timeline_id, meta.ancestor, None);
            timeline.attach_remote(client, None, None).map_err(other)?;
        }
        timelines.insert(timeline_id, timeline.clone());
        Ok(timeline)
    }

    /// The branch points of the children of `timeline_id`: the LSNs its GC must keep.
    fn child_branch_points(&self, timeline_id: TimelineId) -> Vec<Lsn> {
        let timelines = lock(&self.timelines);
        let mut points: Vec<Lsn> =
            timelines.values().filter_map(|t| t.ancestor().filter(|a| a.timeline.timeline_id() == timeline_id).map(|a| a.lsn)).collect();
        points.sort();
        points.dedup();
        points
    }

    /// Runs GC on one timeline at `cutoff`, keeping what its children's branch points need.
    pub fn gc_timeline(&self, timeline_id: TimelineId, cutoff: Lsn) -> anyhow::Result<GcResult> {
        let _entered = self.span.enter();
        let _gc = lock(&self.gc_lock);
        let timeline = self.get_timeline(timeline_id).with_context(|| format!("timeline {timeline_id} not found"))?;
        timeline.gc(cutoff, &self.child_branch_points(timeline_id))
    }

    /// Runs GC on every timeline with the cutoff `gc_horizon_bytes` below its last record.
    pub fn gc_iteration(&self) -> anyhow::Result<Vec<(TimelineId, GcResult)>> {
        let mut results = Vec::new();
        for timeline in self.timelines() {
            let cutoff = Lsn(timeline.last_record_lsn().0.saturating_sub(self.conf.gc_horizon_bytes));
            results.push((timeline.timeline_id(), self.gc_timeline(timeline.timeline_id(), cutoff)?));
        }
        Ok(results)
    }

    /// Freezes and flushes every timeline: what a clean shutdown does.
    pub fn flush_all(&self) -> anyhow::Result<()> {
        for timeline in self.timelines() {
            timeline.freeze_and_flush().with_context(|| format!("flush timeline {}", timeline.timeline_id()))?;
        }
        Ok(())
    }
}

/// Creates an empty tenant directory crash-safely: complete or absent after a crash.
fn create_tenant_dir(path: &Path) -> anyhow::Result<()> {
    let tmp = crashsafe::temp_path(path);
    if tmp.exists() {
        crashsafe::remove_temp(&tmp).with_context(|| format!("remove {}", tmp.display()))?;
    }
    fs::create_dir_all(tmp.join(TIMELINES_DIR)).with_context(|| format!("create {}", tmp.display()))?;
    crashsafe::fsync_dir(&tmp).and_then(|()| crashsafe::durable_rename(&tmp, path)).context("create tenant directory")
}

/// Writes a timeline directory holding only `meta`, crash-safely: a temporary directory
/// renamed into place.
fn write_timeline_dir(path: &Path, meta: &TimelineMetadata) -> anyhow::Result<()> {
    let tmp = crashsafe::temp_path(path);
    let create = || -> anyhow::Result<()> {
        if tmp.exists() {
            crashsafe::remove_temp(&tmp)?;
        }
        fs::create_dir(&tmp)?;
        meta.write(&tmp)?;
        crashsafe::fsync_dir(&tmp)?;
        crashsafe::durable_rename(&tmp, path)?;
        Ok(())
    };
    create().with_context(|| format!("create {}", path.display()))
}
