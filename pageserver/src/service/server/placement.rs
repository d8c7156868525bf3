//! The storage controller's word, where it takes effect on this pageserver: joining it at
//! start ([`join_controller`]: register, then attach what it says this node holds, with
//! the generations it issued), and its orders (`PUT /v1/tenant/{tenant}/location`,
//! [`Pageserver::set_location`]): attach with a generation, hold as secondary, detach.
//!
//! A tenant moves between pageservers through remote storage: the new attachment loads it
//! from there (its layers downloaded when reads need them), and follows the WAL sources its
//! remote index names, presenting the pageserver's own token (never to a compute's
//! walsender). A detached tenant stops being served and its local files are set aside
//! (`<workdir>/detached/`), removed once object storage holds all they hold: should it
//! come back, it is rebuilt from remote storage, never mixed with files written under a
//! generation older than what another attachment uploaded since (their layers would
//! overlap with other boundaries). Local files this node wrote under its own previous
//! generation, with nothing newer in remote storage, are loaded (a restart).
//!
//! Invariants:
//! - One change of placement at a time (`location_change`), so an order and a re-attach
//!   never interleave; orders are refused (503) until the re-attach is done.
//! - An order never lowers a tenant's generation: an attach older than the one held is
//!   refused with 409, and so is an order to let go (secondary, detached) given at a
//!   generation not newer than the one held (the controller that sent it no longer leads,
//!   or its order was overtaken).
//! - Nothing here deletes a file that may be the only copy of a version: local files are
//!   set aside, and removed only when object storage holds them.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use layerstore::remote::GenerationSource;
use layerstore::tenant::Tenant;
use pageserver_api::controller::{NodeRegisterRequest, ReAttachRequest};
use pageserver_api::models::{LocationConfig, LocationList, LocationMode, TenantLocationState, TimelineIngested, WarmCopies};
use pageserver_api::{ClientConfig, ControllerClient};
use proto::TenantId;
use remote_storage::RemoteStorage;

use super::{read_wal_sources, ManagementError, Pageserver};
use crate::service::localwal::WAL_RECEIVER_SOURCE_FILE;
use crate::service::walreceiver::WalSources;

/// How long one call to the controller may take.
const CONTROLLER_TIMEOUT: Duration = Duration::from_secs(10);
/// Between attempts to reach the controller at start.
const CONTROLLER_RETRY: Duration = Duration::from_millis(500);

impl Pageserver {
    /// What this pageserver holds of each tenant, for the controller's heartbeat.
    pub fn locations(&self) -> LocationList {
        let mut tenants: Vec<TenantLocationState> = self
            .tenants
            .ids()
            .into_iter()
            .filter_map(|id| self.tenants.get(id))
            .map(|t| TenantLocationState {
                tenant_id: t.tenant_id(),
                mode: LocationMode::Attached,
                generation: t.remote().map_or(0, |r| r.generation().0),
                warm: None,
                timelines: t
                    .timelines()
                    .iter()
                    .map(|tl| TimelineIngested { timeline_id: tl.timeline_id(), last_record_lsn: tl.last_record_lsn() })
                    .collect(),
            })
            .collect();
        let secondaries = self.secondaries.lock().unwrap_or_else(|p| p.into_inner()).clone();
        tenants.extend(secondaries.into_iter().map(|tenant_id| TenantLocationState {
            tenant_id,
            mode: LocationMode::Secondary,
            generation: 0,
            timelines: Vec::new(),
            warm: self.warm_state(tenant_id).map(|w| WarmCopies { layers: w.layers, bytes: w.bytes }),
        }));
        tenants.sort_by_key(|t| t.tenant_id);
        LocationList { node_id: self.conf.node_id, joined: self.joined.load(Ordering::SeqCst), tenants }
    }

    /// Carries out the controller's order for `tenant`; returns what is held afterwards.
    pub fn set_location(&self, tenant: TenantId, order: &LocationConfig) -> Result<TenantLocationState, ManagementError> {
        if self.conf.controller_url.is_none() {
            return Err(ManagementError::Conflict(
                "this pageserver runs without a storage controller (no controller_url): it takes no location orders".into(),
            ));
        }
        let _changing = self.location_change.lock().unwrap_or_else(|p| p.into_inner());
        if !self.joined.load(Ordering::SeqCst) {
            // The re-attach's answer, which raised the generations, comes first: an order
            // sent before it would be overtaken at once.
            return Err(ManagementError::Unavailable("this pageserver is still joining the storage controller".into()));
        }
        match (order.mode, order.generation) {
            (LocationMode::Attached, Some(generation)) if generation > 0 => {
                let t = self.attach_issued(tenant, generation)?;
                Ok(TenantLocationState {
                    tenant_id: tenant,
                    mode: LocationMode::Attached,
                    generation: t.remote().map_or(0, |r| r.generation().0),
                    timelines: Vec::new(),
                    warm: None,
                })
            }
            (LocationMode::Attached, _) => Err(ManagementError::BadRequest("an attach order needs a generation above 0".into())),
            (mode, as_of) => {
                // An order to let go, given when the tenant's generation was `as_of`: an
                // attachment here with that generation or a newer one was made after it,
                // so the order is stale (from a controller that no longer leads, or
                // overtaken on the way).
                if let (Some(as_of), Some(t)) = (as_of, self.tenants.get(tenant)) {
                    let held = t.remote().map_or(0, |r| r.generation().0);
                    if held >= as_of {
                        return Err(ManagementError::Conflict(format!(
                            "tenant {tenant} is attached here with generation {held}: an order given at generation {as_of} to let it go is stale"
                        )));
                    }
                }
                let why = if mode == LocationMode::Secondary { "held as secondary" } else { "detached" };
                self.detach(tenant, why);
                let mut secondaries = self.secondaries.lock().unwrap_or_else(|p| p.into_inner());
                if mode == LocationMode::Secondary {
                    secondaries.insert(tenant);
                } else {
                    secondaries.remove(&tenant);
                    drop(secondaries);
                    let _warming = self.warming.lock().unwrap_or_else(|p| p.into_inner());
                    self.drop_warm_copies(tenant);
                }
                Ok(TenantLocationState { tenant_id: tenant, mode, generation: 0, timelines: Vec::new(), warm: None })
            }
        }
    }

    /// Attaches `id` with the issued `generation` (a no-op if it is attached with it): loads
    /// it from local disk and remote storage, and starts following its WAL sources. Local
    /// files are used only if no other attachment wrote to remote storage since they were
    /// (`local_files_usable`); otherwise they are set aside, never mixed in.
    fn attach_issued(&self, id: TenantId, generation: u32) -> Result<Arc<Tenant>, ManagementError> {
        let node_id = self.conf.node_id.expect("validated: a controller needs a node id");
        let remote = self.remote.as_ref().expect("validated: a controller needs remote storage");
        if let Some(t) = self.tenants.get(id) {
            let held = t.remote().map_or(0, |r| r.generation().0);
            if held == generation {
                return Ok(t);
            }
            if held > generation {
                return Err(ManagementError::Conflict(format!(
                    "tenant {id} is attached here with generation {held}, newer than the order's {generation}"
                )));
            }
            drop(t);
            self.unload(id);
        }
        let dir = self.conf.tenants_dir().join(id.to_string());
        if dir.exists() {
            if let Some(why) = local_files_unusable(remote, id, &dir)? {
                self.set_aside(id, &dir, &why);
            }
        }
        // No longer warmed as a secondary: the copies so far are taken where they fit, and
        // a sync under way ends after its current download.
        self.secondaries.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        let _warming = self.warming.lock().unwrap_or_else(|p| p.into_inner());
        let warm = self.warm_dir(id);
        // Before the load, so that an index uploaded meanwhile makes the files look older
        // than they are (set aside at a restart), never newer.
        let loaded = newest_index_generation(remote, id)?;
        let tenant = Tenant::load_as(
            &self.conf.tenants_dir(),
            id,
            self.conf.storage.clone(),
            crate::service::localwal::TIMELINE_DIR_ENTRIES,
            Some(remote),
            self.disk_budget.clone().map(|b| b as Arc<dyn layerstore::layer::DiskBudget>),
            GenerationSource::Issued { generation, node_id },
            warm.exists().then_some(warm.as_path()),
        )
        .with_context(|| format!("attach tenant {id} with generation {generation}"))?;
        self.drop_warm_copies(id);
        drop(_warming);
        // Everything that can fail comes before the tenant is served: a half-made attach
        // would look done to the controller and never be ordered again.
        let prepared = (|| -> Result<Vec<(Arc<layerstore::timeline::Timeline>, WalSources)>, ManagementError> {
            write_attachment(tenant.path(), generation, node_id, loaded)?;
            // Settings the tenant had on its previous pageserver come with its indexes.
            let local = tenant.path().join(crate::service::tenant_conf::TENANT_CONFIG_FILE_NAME);
            if !local.exists() {
                let from_index = tenant.timelines().iter().find_map(|t| t.remote_service_data(INDEX_TENANT_CONFIG));
                if let Some(conf) = from_index.and_then(|json| serde_json::from_str::<pageserver_api::models::TenantConfig>(&json).ok()) {
                    self.tenant_confs.store(id, tenant.path(), conf).with_context(|| format!("store the settings of tenant {id}"))?;
                }
            }
            self.tenant_confs.load(id, tenant.path()).with_context(|| format!("load the settings of tenant {id}"))?;
            self.jobs.note_attached(id);
            let mut follow = Vec::new();
            for t in tenant.timelines() {
                let path = t.path().join(WAL_RECEIVER_SOURCE_FILE);
                let sources = match read_wal_sources(&path)? {
                    Some(local) => Some(local),
                    None => from_index(t.remote_service_data(INDEX_WAL_SOURCES)),
                };
                if let Some(sources) = sources {
                    if !path.exists() {
                        crashsafe::write_private_file_atomic(&path, &sources.to_json())
                            .with_context(|| format!("write {}", path.display()))?;
                    }
                    follow.push((t, sources));
                }
            }
            Ok(follow)
        })();
        let follow = match prepared {
            Ok(f) => f,
            Err(e) => {
                tenant.shutdown_remote();
                return Err(e);
            }
        };
        let tenant = Arc::new(tenant);
        self.tenants.insert(Arc::clone(&tenant));
        self.secondaries.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        let following = follow.len();
        self.catching_up.lock().unwrap_or_else(|p| p.into_inner()).insert(id, Instant::now());
        for (t, sources) in follow {
            self.spawn_wal_receiver(t, sources);
        }
        tracing::info!(tenant = %id, "attached with generation {generation}: {} timelines, {following} following their WAL sources", tenant.timelines().len());
        Ok(tenant)
    }

    /// Stops serving `id`: page requests find it no more, its WAL receivers and upload
    /// queues stop, and work already holding it (a background job) is waited for, at most
    /// `UNLOAD_WAIT`, so that none of it writes into the directory afterwards. Its files
    /// stay where they are. Returns the tenant if it was loaded.
    fn unload(&self, id: TenantId) -> Option<Arc<Tenant>> {
        let tenant = self.tenants.remove(id)?;
        let stopped: Vec<_> = {
            let mut receivers = self.receivers.lock().unwrap_or_else(|p| p.into_inner());
            let keys: Vec<_> = receivers.keys().filter(|(t, _)| *t == id).copied().collect();
            keys.iter().filter_map(|k| receivers.remove(k)).collect()
        };
        for r in stopped {
            r.stop();
        }
        self.ingest_gates.lock().unwrap_or_else(|p| p.into_inner()).retain(|(t, _), _| *t != id);
        self.system_ids.lock().unwrap_or_else(|p| p.into_inner()).retain(|(t, _), _| *t != id);
        tenant.shutdown_remote();
        let deadline = Instant::now() + UNLOAD_WAIT;
        while Arc::strong_count(&tenant) > 1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if Arc::strong_count(&tenant) > 1 {
            tracing::warn!(tenant = %id, "work on the tenant still runs after {UNLOAD_WAIT:?}; its files are set aside anyway");
        }
        Some(tenant)
    }

    /// Drops `id` from this pageserver ([`Pageserver::unload`]) and sets its local files
    /// aside ([`Pageserver::set_aside`]).
    pub(super) fn detach(&self, id: TenantId, why: &str) -> bool {
        let Some(tenant) = self.unload(id) else { return false };
        let dir = tenant.path().to_path_buf();
        drop(tenant);
        self.set_aside(id, &dir, why);
        tracing::info!(tenant = %id, "tenant {why}: no longer served here");
        true
    }

    /// Moves a tenant's local directory out of the way (`<workdir>/detached/`, under a
    /// unique name), so that a later attach starts from remote storage; then removes
    /// whatever is set aside and fully in remote storage (`clean_set_aside`). What is not
    /// (layers never uploaded) is kept: the WAL behind it is on the safekeepers for the
    /// attachment that holds the tenant now, but nothing here deletes an only copy.
    fn set_aside(&self, id: TenantId, dir: &Path, why: &str) {
        let aside_dir = self.conf.workdir.join(SET_ASIDE_DIR);
        let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros());
        let target = aside_dir.join(format!("{id}.{stamp}"));
        let moved = std::fs::create_dir_all(&aside_dir).and_then(|()| std::fs::rename(dir, &target));
        match moved {
            Ok(()) => tracing::info!(tenant = %id, "local files set aside in {} ({why})", target.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => {
                tracing::error!(tenant = %id, "could not set aside {}: {e}; it stays, and the next attach of the tenant fails until it is moved", dir.display());
                return;
            }
        }
        if let Some(remote) = self.remote.clone() {
            let workdir = self.conf.workdir.clone();
            std::thread::spawn(move || clean_set_aside(&remote, &workdir));
        }
    }
}

/// Where detached tenants' local files go, under the work directory.
pub const SET_ASIDE_DIR: &str = "detached";
/// How long unloading a tenant waits for work that holds it.
const UNLOAD_WAIT: Duration = Duration::from_secs(30);
/// The file in a tenant's directory that says which attachment wrote it.
const ATTACHMENT_FILE: &str = "attachment.json";

#[derive(serde::Serialize, serde::Deserialize)]
struct AttachmentNote {
    generation: u32,
    node_id: u64,
    /// The newest index generation in object storage before the attach loaded (0: none):
    /// what the local files build on until this attachment uploads an index of its own.
    /// Absent from notes written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    loaded: Option<u32>,
}

fn write_attachment(dir: &Path, generation: u32, node_id: u64, loaded: u32) -> anyhow::Result<()> {
    let path = dir.join(ATTACHMENT_FILE);
    let body = serde_json::to_vec(&AttachmentNote { generation, node_id, loaded: Some(loaded) }).expect("encodes");
    crashsafe::write_private_file_atomic(&path, &body).with_context(|| format!("write {}", path.display()))
}

/// Why the local files of `id` in `dir` must not be loaded, if they must not: they were
/// written under a generation older than an index another attachment uploaded since (its
/// layers would overlap theirs, with other boundaries), or under one that never uploaded
/// an index while an older attachment (a pending one, a migration's source) uploaded one
/// newer than what they build on, or by an attachment that did not say its generation.
fn local_files_unusable(remote: &RemoteStorage, id: TenantId, dir: &Path) -> anyhow::Result<Option<String>> {
    let note = std::fs::read(dir.join(ATTACHMENT_FILE)).ok().and_then(|b| serde_json::from_slice::<AttachmentNote>(&b).ok());
    let Some(note) = note else {
        return Ok(Some("written by an attachment that did not record its generation".into()));
    };
    let newest = newest_index_generation(remote, id)?;
    if newest > note.generation {
        return Ok(Some(format!(
            "written under generation {}; object storage has history from generation {newest} since",
            note.generation
        )));
    }
    match note.loaded {
        Some(loaded) if newest < note.generation && newest != loaded => Ok(Some(format!(
            "written under generation {}, which uploaded no index, on top of generation {loaded}'s; generation {newest} uploaded one since",
            note.generation
        ))),
        _ => Ok(None),
    }
}

fn newest_index_generation(remote: &RemoteStorage, id: TenantId) -> anyhow::Result<u32> {
    Ok(layerstore::remote::newest_indexes(remote, id)?.values().map(|i| i.generation.0).max().unwrap_or(0))
}

/// Removes the set-aside copies whose every timeline object storage holds up to at least
/// where the copy went (its disk-consistent LSN at or below the newest index's); keeps the
/// others, saying so once per copy.
pub fn clean_set_aside(remote: &RemoteStorage, workdir: &Path) {
    static CLEANING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // Copies already said to be kept: said once, however often they are looked at again.
    static KEPT: std::sync::Mutex<std::collections::BTreeSet<std::path::PathBuf>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let _one = CLEANING.lock().unwrap_or_else(|p| p.into_inner());
    let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    let Ok(entries) = std::fs::read_dir(workdir.join(SET_ASIDE_DIR)) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(Ok(id)) = name.split('.').next().map(|t| t.parse::<TenantId>()) else { continue };
        match covered_by_remote(remote, id, &entry.path()) {
            Ok(None) => match crashsafe::remove_temp(&entry.path()) {
                Ok(()) => tracing::info!(tenant = %id, "removed {}: object storage holds all of it", entry.path().display()),
                Err(e) => tracing::warn!("could not remove {}: {e}", entry.path().display()),
            },
            Ok(Some(why)) if kept.insert(entry.path()) => tracing::info!(tenant = %id, "keeping {} ({why})", entry.path().display()),
            Err(e) if kept.insert(entry.path()) => {
                tracing::info!(tenant = %id, "keeping {}: could not compare it with object storage: {e:#}", entry.path().display())
            }
            Ok(Some(_)) | Err(_) => {}
        }
    }
}

/// `None` if object storage holds every timeline of a set-aside copy up to at least its
/// disk-consistent LSN; else what it lacks.
fn covered_by_remote(remote: &RemoteStorage, id: TenantId, dir: &Path) -> anyhow::Result<Option<String>> {
    let indexes = layerstore::remote::newest_indexes(remote, id)?;
    let timelines = dir.join("timelines");
    let Ok(entries) = std::fs::read_dir(&timelines) else { return Ok(None) };
    for entry in entries.flatten() {
        let Ok(tl) = entry.file_name().to_string_lossy().parse::<proto::TimelineId>() else { continue };
        let local =
            layerstore::timeline::TimelineMetadata::read(&entry.path(), tl).map_err(|e| anyhow::anyhow!("{e}"))?.disk_consistent_lsn;
        match indexes.get(&tl) {
            Some(i) if i.disk_consistent_lsn >= local => {}
            Some(i) => return Ok(Some(format!("timeline {tl} reaches {local} here, object storage {}", i.disk_consistent_lsn))),
            None => return Ok(Some(format!("timeline {tl} is not in object storage"))),
        }
    }
    Ok(None)
}

/// The name of a timeline's WAL sources (without the token) in its remote index's service
/// data.
pub(super) const INDEX_WAL_SOURCES: &str = "wal_sources";
/// The tenant's settings (`pageserver_api::models::TenantConfig`, JSON) in its timelines'
/// remote indexes, for the next attachment.
pub(super) const INDEX_TENANT_CONFIG: &str = "tenant_config";

/// The WAL sources a remote index names, as the receiver takes them (no token: the
/// receiver presents the pageserver's own). `None` if it names none or they do not check.
fn from_index(sources: Option<String>) -> Option<WalSources> {
    let text = sources?;
    match WalSources::from_json(text.as_bytes()) {
        Ok(s) if s.token().is_none() => Some(s),
        Ok(_) => {
            tracing::warn!("the WAL sources in the remote index carry a token: not following them");
            None
        }
        Err(e) => {
            tracing::warn!("the WAL sources in the remote index do not check ({e}): not following them");
            None
        }
    }
}

/// What a timeline's remote index records of its sources: never the token.
pub(super) fn to_index(sources: &WalSources) -> String {
    String::from_utf8(sources.clone().with_token(None).to_json()).expect("JSON is UTF-8")
}

/// Joins the storage controller at start: registers this node's advertised addresses,
/// asks what it holds (attached tenants come back with their generations raised) and
/// attaches them; removes local tenants it does not hold. Retries until the controller
/// answers: without its word this pageserver may serve nothing. Returns the tenants
/// attached.
pub fn join_controller(ps: &Pageserver, stop: &std::sync::atomic::AtomicBool) -> anyhow::Result<usize> {
    let url = ps.conf.controller_url.clone().expect("called with a controller");
    let node_id = ps.conf.node_id.expect("validated");
    let config = ClientConfig { request_timeout: Some(CONTROLLER_TIMEOUT), tls: ps.conf.tls.client.clone(), ..Default::default() };
    let client = ControllerClient::with_config(&url, config).with_token(ps.conf.auth_token.clone());
    let register = NodeRegisterRequest { node_id, http_addr: ps.conf.advertised_http_addr(), page_addr: ps.conf.advertised_pg_addr() };
    let mut last_error = String::new();
    let answer = loop {
        if stop.load(Ordering::SeqCst) {
            tracing::info!("stopping before the storage controller answered: nothing attached");
            return Ok(0);
        }
        let attempt = client.register_node(&register).and_then(|_| client.re_attach(&ReAttachRequest { node_id }));
        match attempt {
            Ok(answer) => break answer,
            Err(e) => {
                let text = e.to_string();
                if text != last_error {
                    tracing::warn!("waiting for the storage controller at {url} (retrying every {CONTROLLER_RETRY:?}): {text}");
                    last_error = text;
                }
                std::thread::sleep(CONTROLLER_RETRY);
            }
        }
    };
    tracing::info!("joined the storage controller at {url} as pageserver {node_id}: {} tenants to hold", answer.tenants.len());
    let _changing = ps.location_change.lock().unwrap_or_else(|p| p.into_inner());
    ps.joined.store(true, Ordering::SeqCst);
    let mut attached = 0;
    for t in &answer.tenants {
        match t.mode {
            LocationMode::Attached => match ps.attach_issued(t.tenant_id, t.generation) {
                Ok(_) => attached += 1,
                // The others are served all the same; the controller's heartbeat shows the
                // tenant missing here and orders the attach again.
                Err(e) => tracing::error!(tenant = %t.tenant_id, "could not attach with generation {}: {e}", t.generation),
            },
            LocationMode::Secondary => {
                ps.secondaries.lock().unwrap_or_else(|p| p.into_inner()).insert(t.tenant_id);
            }
            LocationMode::Detached => {}
        }
    }
    // Local tenants this node does not hold were attached here once; another node may hold
    // them now. Set aside (not deleted: they may hold what no one uploaded), unless their
    // attach just failed (they stay, for the next order).
    let held: std::collections::BTreeSet<TenantId> =
        answer.tenants.iter().filter(|t| t.mode == LocationMode::Attached).map(|t| t.tenant_id).collect();
    let tenants_dir = ps.conf.tenants_dir();
    for entry in std::fs::read_dir(&tenants_dir).with_context(|| format!("list {}", tenants_dir.display()))? {
        let entry = entry.with_context(|| format!("list {}", tenants_dir.display()))?;
        let Ok(id) = entry.file_name().to_string_lossy().parse::<TenantId>() else { continue };
        if !held.contains(&id) {
            ps.set_aside(id, &entry.path(), "not held by this node");
        }
    }
    // Warm copies of tenants this node no longer holds as secondary are of no use.
    let secondary: std::collections::BTreeSet<TenantId> =
        answer.tenants.iter().filter(|t| t.mode == LocationMode::Secondary).map(|t| t.tenant_id).collect();
    if let Ok(entries) = std::fs::read_dir(ps.warm_root()) {
        for entry in entries.flatten() {
            match entry.file_name().to_string_lossy().parse::<TenantId>() {
                Ok(id) if secondary.contains(&id) => {}
                Ok(id) => ps.drop_warm_copies(id),
                Err(_) => {}
            }
        }
    }
    if let Some(remote) = &ps.remote {
        clean_set_aside(remote, &ps.conf.workdir);
    }
    Ok(attached)
}
