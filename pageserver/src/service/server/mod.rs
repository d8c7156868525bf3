//! The pageserver as a process: configuration, the tenants it serves, the page service and
//! the HTTP management API. `src/bin/pageserver.rs` is the thin `main` around this.
//!
//! Maintenance (checkpoint, compaction, GC) runs in `service::background`'s jobs, on their
//! own schedule and through the methods here.
//!
//! Invariants:
//! - Without a storage controller, every tenant directory under `<workdir>/tenants/` is
//!   loaded at start (with its settings file); one that fails to load stops the start with
//!   an error naming it, rather than serving a partial set. With one (`controller_url`),
//!   nothing is loaded until the controller says what this node holds (`placement`), and
//!   each tenant is then attached with the generation the controller issued.
//! - Tenant and timeline creation is serialized by one lock, so two requests creating the
//!   same id cannot both succeed.

pub mod config;
pub mod http;
mod placement;
pub mod secondary;

use std::collections::{HashMap, HashSet};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use proto::{Lsn, TenantId, TimelineId};

use crate::pgdata::basebackup::{write_basebackup, write_standby_basebackup, BasebackupSummary};
use crate::pgdata::changes::{changed_blocks, ChangedBlocks, ChangesError};
use crate::pgdata::import::{import_datadir, ImportSummary};
use crate::pgdata::reconstruct::PgReconstructor;
use crate::pgdata::timestamp::{lsn_for_timestamp, timestamptz_from_system_time, LsnForTimestamp};
use crate::pgdata::walredo::{WalRedoConfig, WalRedoManager};
use crate::service::background::{BackgroundJobs, CompactOutcome, GcOutcome, JobSettings, Jobs, LeaseError};
use crate::service::eviction::{EvictionStats, LayerDiskBudget};
use crate::service::ingest_gate::IngestGate;
use crate::service::localwal::WAL_RECEIVER_SOURCE_FILE;
use crate::service::materializer::{Materializer, MaterializerSettings, MaterializerThread};
use crate::service::metrics::Metrics;
use crate::service::page_service::{PageService, PageServiceHandle, TenantRegistry};
use crate::service::tenant_conf::TenantConfs;
use crate::service::walreceiver::{WalReceiver, WalReceiverStatus, WalSources};
pub use config::PageserverConfig;
use layerstore::layer::DiskBudget;
use layerstore::remote::TenantRemote;
use layerstore::tenant::Tenant;
use layerstore::timeline::Timeline;
use layerstore::value::Reconstructor;
use layerstore::{ChangedKeysError, CreateTimelineError, LayerDesc, WriteError};
use pageserver_api::models::TenantConfig;
pub use placement::join_controller;
use remote_storage::RemoteStorage;

pub struct Pageserver {
    pub conf: PageserverConfig,
    pub tenants: Arc<TenantRegistry>,
    reconstructor: Arc<dyn Reconstructor>,
    create_lock: Mutex<()>,
    receivers: Mutex<HashMap<(TenantId, TimelineId), WalReceiver>>,
    /// Held across reading a timeline's persisted WAL sources, deciding and starting or
    /// stopping its receiver, so that a compute's restart of the registered sources never
    /// interleaves with an admin's change or removal of them (and brings back what the
    /// admin just replaced).
    wal_sources_change: Mutex<()>,
    /// Each timeline's ingest gate, shared by its WAL receiver and basebackups; created on
    /// first use.
    ingest_gates: Mutex<HashMap<(TenantId, TimelineId), Arc<IngestGate>>>,
    pub basebackup_stats: BasebackupStats,
    /// Object storage under the local disk, if configured.
    remote: Option<RemoteStorage>,
    pub eviction_stats: Arc<EvictionStats>,
    /// `layer_disk_budget_bytes`, given to every tenant so that downloads make room first,
    /// and checked periodically by the eviction thread.
    disk_budget: Option<Arc<LayerDiskBudget>>,
    /// Each timeline's PostgreSQL system identifier, once read (`http::system_id`).
    pub(crate) system_ids: Mutex<HashMap<(TenantId, TimelineId), u64>>,
    stopping: Arc<AtomicBool>,
    eviction: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Keeps a second pageserver off the work directory for the life of this one.
    _lock: crashsafe::DataDirLock,
    /// Compaction, image layers and GC (`service::background`), for the scheduler and the API.
    pub jobs: Arc<Jobs>,
    /// The process's counters and histograms (jobs, read amplification) for `/metrics`.
    pub metrics: Arc<Metrics>,
    /// Folds hot keys into images: the thread's work and the page service's writeback.
    pub materializer: Arc<Materializer>,
    /// Checks tokens when `auth_public_key_path` is set; `None`: every client is trusted.
    pub auth: Option<Arc<auth::Verifier>>,
    tenant_confs: Arc<TenantConfs>,
    /// Serializes attaching and detaching (the controller's orders, a re-attach at start).
    location_change: Mutex<()>,
    /// Tenants held as warm secondaries by the controller's order.
    secondaries: Mutex<std::collections::BTreeSet<TenantId>>,
    /// Set once the storage controller said what this node holds (`join_controller`).
    joined: AtomicBool,
    /// Held while a secondary tenant's warm copies are synced, and by an attach before it
    /// takes them (`secondary`).
    warming: Mutex<()>,
    /// What each secondary tenant's warm copies came to at its last sync.
    warm_state: Mutex<HashMap<TenantId, layerstore::remote::heatmap::WarmOutcome>>,
    pub secondary_stats: secondary::SecondaryStats,
    warmer: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Tenants attached by the controller since the start and not yet caught up with their
    /// safekeepers, with when (`secondary::flush_caught_up_attachments`).
    catching_up: Mutex<HashMap<TenantId, Instant>>,
}

/// What a checkpoint (freeze and flush) did.
#[derive(Debug, Clone)]
pub struct CheckpointOutcome {
    pub disk_consistent_lsn: Lsn,
    pub layers_created: Vec<LayerDesc>,
    pub bytes_written: u64,
}

/// The lock file in the work directory (`crashsafe::DataDirLock`).
pub const LOCK_FILE_NAME: &str = "pageserver.lock";

/// Counters of the basebackups served, for `/metrics`.
#[derive(Debug, Default)]
pub struct BasebackupStats {
    pub count: AtomicU64,
    pub bytes: AtomicU64,
    pub micros: AtomicU64,
}

/// Why a management request was refused; mapped to HTTP status codes in one place
/// (`http::ApiError`).
#[derive(Debug, thiserror::Error)]
pub enum ManagementError {
    #[error("tenant {0} not found")]
    TenantNotFound(TenantId),
    #[error("timeline {1} of tenant {0} not found")]
    TimelineNotFound(TenantId, TimelineId),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    BadRequest(String),
    /// Waited too long for something (an LSN to be ingested).
    #[error("{0}")]
    Timeout(String),
    /// Not ready for this yet (still joining the storage controller): retry shortly.
    #[error("{0}")]
    Unavailable(String),
    /// What the request needs existed once and never will again (history that GC removed
    /// or that is the ancestor's).
    #[error("{0}")]
    Gone(String),
    /// The caller's token is valid but does not let it do this (beyond the route's scope
    /// check: e.g. a compute naming WAL sources an admin did not register).
    #[error("{0}")]
    Forbidden(String),
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

/// Who asks to start a WAL receiver: what they may change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourcesCaller {
    /// An admin token, or any caller with authentication off: sets the timeline's sources.
    Admin,
    /// A tenant token (a compute): may only restart the sources an admin registered.
    Compute,
}

impl Pageserver {
    /// Loads every tenant in the work directory.
    pub fn open(conf: PageserverConfig) -> anyhow::Result<Pageserver> {
        conf.validate()?;
        let tenants_dir = conf.tenants_dir();
        std::fs::create_dir_all(&tenants_dir).with_context(|| format!("create {}", tenants_dir.display()))?;
        // Two pageservers on one work directory would both write its timelines.
        let lock = crashsafe::DataDirLock::acquire(&conf.workdir, LOCK_FILE_NAME, "pageserver")?;
        let redo = Arc::new(WalRedoManager::new(WalRedoConfig {
            postgres_bin: conf.pg_bin_dir.join("postgres"),
            processes_max: conf.wal_redo_processes_max,
            request_timeout: conf.wal_redo_timeout(),
            run_as: None,
        }));
        let remote = match &conf.remote_storage {
            None => None,
            Some(url) => {
                let storage = RemoteStorage::from_url(url)?;
                tracing::info!("remote storage: {storage}");
                Some(storage)
            }
        };
        // Image layer creation replays records through a pool of its own, so that it never
        // takes a redo process a GetPage is waiting for.
        let background_redo = Arc::new(WalRedoManager::new(WalRedoConfig {
            postgres_bin: conf.pg_bin_dir.join("postgres"),
            processes_max: 1,
            request_timeout: conf.wal_redo_timeout(),
            run_as: None,
        }));
        // Folds replay records through a pool of their own too: a GetPage never waits
        // behind one.
        let fold_redo = Arc::new(WalRedoManager::new(WalRedoConfig {
            postgres_bin: conf.pg_bin_dir.join("postgres"),
            processes_max: 1,
            request_timeout: conf.wal_redo_timeout(),
            run_as: None,
        }));
        let tenant_confs = Arc::new(TenantConfs::default());
        // Every tenant on local disk, and every tenant remote storage holds (attached from
        // there when the local disk lacks it).
        let mut ids = std::collections::BTreeSet::new();
        let controlled = conf.controller_url.is_some();
        for entry in std::fs::read_dir(&tenants_dir).with_context(|| format!("list {}", tenants_dir.display()))? {
            let entry = entry.with_context(|| format!("list {}", tenants_dir.display()))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(id) = name.parse::<TenantId>() else {
                if crashsafe::is_temp_name(&name) {
                    // A detached tenant's files whose removal did not finish.
                    crashsafe::remove_temp(&entry.path()).with_context(|| format!("remove {}", entry.path().display()))?;
                } else {
                    tracing::warn!("ignoring {} in the tenants directory: not a tenant id", entry.path().display());
                }
                continue;
            };
            ids.insert(id);
        }
        if controlled {
            // The controller says which of these this node holds, and with what generation.
            if !ids.is_empty() {
                tracing::info!("{} tenants on local disk wait for the storage controller's word", ids.len());
            }
            ids.clear();
        } else if let Some(storage) = &remote {
            let remote_ids = TenantRemote::tenant_ids(storage).with_context(|| format!("list the tenants in remote storage {storage}"))?;
            for id in remote_ids {
                if ids.insert(id) {
                    tracing::info!(tenant = %id, "attaching tenant from remote storage");
                }
            }
        }
        let registry = Arc::new(TenantRegistry::default());
        let eviction_stats = Arc::new(EvictionStats::default());
        let disk_budget =
            conf.layer_disk_budget_bytes.map(|b| Arc::new(LayerDiskBudget::new(Arc::downgrade(&registry), b, Arc::clone(&eviction_stats))));
        for id in ids {
            let tenant = Tenant::load_with_remote(
                &tenants_dir,
                id,
                conf.storage.clone(),
                crate::service::localwal::TIMELINE_DIR_ENTRIES,
                remote.as_ref(),
                disk_budget.clone().map(|b| b as Arc<dyn DiskBudget>),
            )
            .with_context(|| format!("load tenant {id}"))?;
            tenant_confs.load(id, tenant.path()).with_context(|| format!("load the settings of tenant {id}"))?;
            tracing::info!(tenant = %id, timelines = tenant.timelines().len(), "loaded tenant");
            registry.insert(Arc::new(tenant));
        }
        let auth = match &conf.auth_public_key_path {
            Some(path) => {
                let verifier = auth::Verifier::load(path).context("load the authentication public key")?;
                tracing::info!("authentication is on: tokens must verify with {}", path.display());
                Some(Arc::new(verifier))
            }
            None => {
                tracing::warn!(
                    "authentication is off (no auth_public_key_path): any process that reaches the page service or the management API may read and manage every tenant"
                );
                None
            }
        };
        let metrics = Arc::new(Metrics::new());
        let settings = JobSettings {
            pitr_window_default: conf.pitr_window.0,
            image_ranges_per_run: conf.image_creation_ranges_per_run,
            lease_grace: Duration::from_millis(conf.gc_lease_grace_ms),
        };
        let jobs = Arc::new(Jobs::new(
            Arc::clone(&registry),
            Arc::new(PgReconstructor::new(background_redo)),
            Arc::clone(&tenant_confs),
            Arc::clone(&metrics),
            settings,
        ));
        let materializer = Arc::new(Materializer::new(
            Arc::clone(&registry),
            Arc::new(PgReconstructor::new(fold_redo)),
            Arc::clone(&metrics),
            MaterializerSettings { cpu_share: conf.materializer_cpu_share },
        ));
        Ok(Pageserver {
            conf,
            materializer,
            tenants: registry,
            reconstructor: Arc::new(PgReconstructor::new(redo)),
            create_lock: Mutex::new(()),
            receivers: Mutex::new(HashMap::new()),
            wal_sources_change: Mutex::new(()),
            ingest_gates: Mutex::new(HashMap::new()),
            basebackup_stats: BasebackupStats::default(),
            remote,
            eviction_stats,
            disk_budget,
            system_ids: Mutex::new(HashMap::new()),
            stopping: Arc::new(AtomicBool::new(false)),
            eviction: Mutex::new(None),
            _lock: lock,
            jobs,
            metrics,
            auth,
            tenant_confs,
            location_change: Mutex::new(()),
            secondaries: Mutex::new(Default::default()),
            joined: AtomicBool::new(false),
            warming: Mutex::new(()),
            warm_state: Mutex::new(HashMap::new()),
            secondary_stats: Default::default(),
            warmer: Mutex::new(None),
            catching_up: Mutex::new(HashMap::new()),
        })
    }

    /// Starts the scheduler of compaction, image layers and GC, unless the configuration
    /// turns it off.
    pub fn start_background_jobs(&self) -> anyhow::Result<Option<BackgroundJobs>> {
        if !self.conf.background_jobs_enabled {
            tracing::info!("background jobs are off (background_jobs_enabled = false)");
            return Ok(None);
        }
        BackgroundJobs::start(Arc::clone(&self.jobs), self.conf.background_job_period()).map(Some)
    }

    /// Starts the materializer thread, unless the configuration turns it off.
    pub fn start_materializer(&self) -> anyhow::Result<Option<MaterializerThread>> {
        if !self.conf.materializer_enabled {
            tracing::info!("the materializer is off (materializer_enabled = false): hot keys are not folded into images");
            return Ok(None);
        }
        MaterializerThread::start(Arc::clone(&self.materializer)).map(Some)
    }

    /// Starts the page service on its configured address (TLS with the configured
    /// certificate, if any).
    pub fn start_page_service(&self) -> anyhow::Result<PageServiceHandle> {
        let listener = TcpListener::bind(self.conf.listen_pg_addr)
            .with_context(|| format!("listen for the page service on {}", self.conf.listen_pg_addr))?;
        let service = PageService::new(Arc::clone(&self.tenants), Arc::clone(&self.reconstructor), self.conf.wait_lsn_timeout());
        let mut service = service.with_observer(self.metrics.clone());
        if self.conf.fold_read_writeback {
            service = service.with_writeback(self.materializer.clone());
        }
        if let Some(verifier) = &self.auth {
            let metrics = Arc::clone(&self.metrics);
            service = service.with_auth(Arc::clone(verifier), Arc::new(move |reason| metrics.auth_refused("page_service", reason)));
        }
        if let Some(server_tls) = &self.conf.tls.server {
            let metrics = Arc::clone(&self.metrics);
            service = service.with_tls(server_tls.config(), Arc::new(move |reason| metrics.tls_refused("page_service", reason)));
        }
        let service = Arc::new(service);
        Ok(service.start(listener)?)
    }

    pub fn tenant(&self, id: TenantId) -> Result<Arc<Tenant>, ManagementError> {
        self.tenants.get(id).ok_or(ManagementError::TenantNotFound(id))
    }

    pub fn timeline(&self, tenant: TenantId, timeline: TimelineId) -> Result<Arc<Timeline>, ManagementError> {
        self.tenant(tenant)?.get_timeline(timeline).ok_or(ManagementError::TimelineNotFound(tenant, timeline))
    }

    pub fn create_tenant(&self, id: TenantId) -> Result<Arc<Tenant>, ManagementError> {
        if let Some(url) = &self.conf.controller_url {
            return Err(ManagementError::Conflict(format!(
                "this pageserver takes its tenants from the storage controller at {url}: create tenant {id} there"
            )));
        }
        let _guard = self.create_lock.lock().unwrap_or_else(|p| p.into_inner());
        if self.tenants.get(id).is_some() {
            return Err(ManagementError::Conflict(format!("tenant {id} already exists")));
        }
        let tenant = Arc::new(Tenant::create_with_remote(
            &self.conf.tenants_dir(),
            id,
            self.conf.storage.clone(),
            crate::service::localwal::TIMELINE_DIR_ENTRIES,
            self.remote.as_ref(),
            self.disk_budget.clone().map(|b| b as Arc<dyn DiskBudget>),
        )?);
        self.tenants.insert(Arc::clone(&tenant));
        tracing::info!(tenant = %id, "created tenant");
        Ok(tenant)
    }

    /// Creates an empty timeline, or a branch of `ancestor` at `ancestor_lsn` (default: the
    /// ancestor's last record LSN).
    pub fn create_timeline(
        &self,
        tenant_id: TenantId,
        timeline_id: TimelineId,
        ancestor: Option<(TimelineId, Option<Lsn>)>,
    ) -> Result<Arc<Timeline>, ManagementError> {
        let _guard = self.create_lock.lock().unwrap_or_else(|p| p.into_inner());
        let tenant = self.tenant(tenant_id)?;
        if let Some(remote) = tenant.remote() {
            let newer = remote.newer_claim().map_err(|e| ManagementError::Unavailable(format!("check the tenant's generations: {e}")))?;
            if let Some(g) = newer {
                return Err(ManagementError::Conflict(format!(
                    "tenant {tenant_id} has a newer generation ({}) claimed elsewhere: it is moving to another pageserver; create the timeline where it is placed now",
                    g.0
                )));
            }
        }
        let created = match ancestor {
            None => tenant.create_timeline(timeline_id),
            Some((ancestor_id, at)) => {
                let at = match at {
                    Some(lsn) => lsn,
                    None => self.timeline(tenant_id, ancestor_id)?.last_record_lsn(),
                };
                tenant.branch_timeline(timeline_id, ancestor_id, at)
            }
        };
        created.map_err(|e| match e {
            CreateTimelineError::AlreadyExists(_) => ManagementError::Conflict(e.to_string()),
            CreateTimelineError::AncestorNotFound(id) => ManagementError::TimelineNotFound(tenant_id, id),
            other => ManagementError::BadRequest(other.to_string()),
        })
    }

    /// Fills an empty timeline from a shut-down PostgreSQL data directory on this host.
    pub fn import(&self, tenant: TenantId, timeline: TimelineId, pgdata: &std::path::Path) -> Result<ImportSummary, ManagementError> {
        if pgdata.as_os_str().is_empty() {
            return Err(ManagementError::BadRequest("import needs \"pgdata\": the path of a shut-down data directory".into()));
        }
        let timeline = self.timeline(tenant, timeline)?;
        if timeline.last_record_lsn().is_valid() {
            return Err(ManagementError::Conflict(format!(
                "timeline {} already has data up to {}; import needs an empty timeline",
                timeline.timeline_id(),
                timeline.last_record_lsn()
            )));
        }
        let summary = import_datadir(&timeline, pgdata).map_err(|e| ManagementError::BadRequest(format!("{e:#}")))?;
        timeline.freeze_and_flush()?;
        Ok(summary)
    }

    /// A basebackup of the timeline at `lsn` (default: its last record LSN), generated
    /// into memory (tens of KiB for a small cluster: SLRUs, maps and the first page or so of
    /// the WAL segment; streaming it while generating is not worth the complexity yet). An
    /// explicit `lsn` is waited for up to the wait-LSN timeout and must be a record
    /// boundary (the end of a record); one below the GC cutoff or the branch point is
    /// refused. The previous record LSN is passed only at the last record LSN.
    ///
    /// With `standby`, the basebackup is for a hot standby that replays the timeline's WAL
    /// from the safekeepers: it starts at the newest running-transactions record at or
    /// before that LSN (so that the standby knows at once which transactions are running
    /// and serves queries), if the record is on this timeline and readable; otherwise at
    /// the LSN itself, and the standby waits for the next such record.
    pub fn basebackup(
        &self,
        tenant: TenantId,
        timeline: TimelineId,
        lsn: Option<Lsn>,
        standby: bool,
    ) -> Result<(Vec<u8>, BasebackupSummary), ManagementError> {
        let t = self.timeline(tenant, timeline)?;
        if !t.last_record_lsn().is_valid() {
            return Err(ManagementError::Conflict(format!("timeline {timeline} has no data yet; import or branch it first")));
        }
        let (lsn, prev) = match lsn {
            None => {
                // Not between a WAL receiver's confirming a batch and ingesting it.
                let gate = self.ingest_gate(tenant, timeline);
                let _held = gate.hold();
                let last = t.last_record_lsn();
                (last, gate.prev_record_lsn(last))
            }
            Some(lsn) => {
                let cutoff = t.gc_cutoff_lsn();
                if lsn < cutoff {
                    return Err(ManagementError::BadRequest(format!(
                        "requested LSN {lsn} is below the garbage collection horizon {cutoff} of timeline {timeline}"
                    )));
                }
                if let Some(branch) = t.ancestor_lsn().filter(|&b| lsn < b) {
                    return Err(ManagementError::BadRequest(format!(
                        "requested LSN {lsn} is below the branch point {branch} of timeline {timeline}"
                    )));
                }
                t.wait_lsn(lsn, self.conf.wait_lsn_timeout()).map_err(|e| ManagementError::Timeout(e.to_string()))?;
                (lsn, self.ingest_gate(tenant, timeline).prev_record_lsn(lsn))
            }
        };
        let started = Instant::now();
        let mut out = Vec::new();
        let summary = if standby {
            self.standby_basebackup(&t, lsn, &mut out)?
        } else {
            write_basebackup(&t, self.reconstructor.as_ref(), lsn, prev, &mut out)
                .with_context(|| format!("basebackup of timeline {timeline} at {lsn}"))?
        };
        let stats = &self.basebackup_stats;
        stats.count.fetch_add(1, Ordering::Relaxed);
        stats.bytes.fetch_add(out.len() as u64, Ordering::Relaxed);
        stats.micros.fetch_add(u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX), Ordering::Relaxed);
        Ok((out, summary))
    }

    fn standby_basebackup(&self, t: &Timeline, lsn: Lsn, out: &mut Vec<u8>) -> Result<BasebackupSummary, ManagementError> {
        let datadir = crate::pgdata::datadir::Datadir::new(t, self.reconstructor.as_ref());
        let running = datadir.get_last_running_xacts(lsn).map_err(|e| ManagementError::Internal(e.into()))?;
        let floor = t.gc_cutoff_lsn().max(t.ancestor_lsn().unwrap_or(Lsn(0)));
        let (start, oldest) = match running {
            Some(r) if r.record_lsn >= floor => (r.record_lsn, Some(pgwal::TransactionId(r.oldest_running_xid))),
            other => {
                tracing::info!(
                    timeline_id = %t.timeline_id(),
                    "standby basebackup at {lsn}: no running-transactions record to start from ({}); the standby waits for the next one",
                    match other {
                        Some(r) => format!("the newest, at {}, is below {floor}", r.record_lsn),
                        None => "none was logged".to_string(),
                    }
                );
                (lsn, None)
            }
        };
        write_standby_basebackup(t, self.reconstructor.as_ref(), start, oldest, out)
            .with_context(|| format!("standby basebackup of timeline {} at {start}", t.timeline_id()))
            .map_err(ManagementError::Internal)
    }

    /// The tenant's own settings and its PITR window in force.
    pub fn tenant_config(&self, tenant: TenantId) -> Result<(TenantConfig, Duration), ManagementError> {
        self.tenant(tenant)?;
        Ok((self.tenant_confs.get(tenant), self.jobs.pitr_window(tenant)))
    }

    /// Replaces the tenant's settings, durably, and returns them as `tenant_config` does.
    pub fn set_tenant_config(&self, tenant: TenantId, config: TenantConfig) -> Result<(TenantConfig, Duration), ManagementError> {
        let t = self.tenant(tenant)?;
        self.tenant_confs.store(tenant, t.path(), config.clone())?;
        // In every timeline's remote index too: the next attachment of the tenant (a failover,
        // a migration) keeps its settings, the PITR window above all, which its GC honours.
        let json = serde_json::to_string(&config).expect("a tenant config encodes");
        for timeline in t.timelines() {
            timeline.set_remote_service_data(placement::INDEX_TENANT_CONFIG, Some(json.clone()));
        }
        tracing::info!(tenant = %tenant, "tenant settings: {:?}", self.tenant_confs.get(tenant));
        self.tenant_config(tenant)
    }

    /// Freezes the timeline's open in-memory layer and flushes every frozen one to L0
    /// layer files. The freeze happens under the ingest gate, between two of the WAL
    /// receiver's batches, so no record is half put.
    pub fn checkpoint(&self, tenant: TenantId, timeline: TimelineId) -> Result<CheckpointOutcome, ManagementError> {
        let t = self.timeline(tenant, timeline)?;
        let before: HashSet<LayerDesc> = t.layers().into_iter().collect();
        {
            let gate = self.ingest_gate(tenant, timeline);
            let _held = gate.hold();
            t.freeze().map_err(|e| match e {
                WriteError::UnpublishedPuts { .. } => {
                    ManagementError::Conflict(format!("could not freeze timeline {timeline} while data is being written into it: {e}"))
                }
                other => ManagementError::Internal(other.into()),
            })?;
        }
        t.flush_frozen_layers()?;
        let layers_created: Vec<LayerDesc> = t.layers().into_iter().filter(|d| d.is_l0() && !before.contains(d)).collect();
        let bytes_written = layers_created.iter().filter_map(|d| t.layer_file_size_bytes(d)).sum();
        Ok(CheckpointOutcome { disk_consistent_lsn: t.disk_consistent_lsn(), layers_created, bytes_written })
    }

    /// Image layers where needed, then L0 compaction (see `Jobs::compact`).
    pub fn compact(
        &self,
        tenant: TenantId,
        timeline: TimelineId,
        force_l0: bool,
        force_images: bool,
    ) -> Result<CompactOutcome, ManagementError> {
        let t = self.timeline(tenant, timeline)?;
        Ok(self.jobs.compact(&*self.tenant(tenant)?, &t, force_l0, force_images)?)
    }

    /// Grants or renews a lease on `lsn` for `owner` (`Jobs::renew_lsn_lease`); the
    /// timeline's leases.
    pub fn lsn_lease(
        &self,
        tenant: TenantId,
        timeline: TimelineId,
        holder: &str,
        lsn: Lsn,
        ttl: Duration,
        owner: Option<u64>,
    ) -> Result<Vec<(String, Lsn)>, ManagementError> {
        let t = self.timeline(tenant, timeline)?;
        if holder.is_empty() || holder.len() > 200 {
            return Err(ManagementError::BadRequest("a lease needs a holder name of 1 to 200 bytes".into()));
        }
        if ttl.is_zero() || ttl > Duration::from_secs(3600) {
            return Err(ManagementError::BadRequest(format!("ttl_secs {} out of range: 1 to 3600", ttl.as_secs())));
        }
        self.jobs.renew_lsn_lease(&t, holder, lsn, ttl, owner).map_err(|e| match e {
            LeaseError::HeldByAnother { .. } => ManagementError::Forbidden(e.to_string()),
            LeaseError::BelowGcHorizon { .. } => ManagementError::BadRequest(e.to_string()),
        })?;
        Ok(self.jobs.lsn_leases(tenant, timeline))
    }

    /// GC with the tenant's PITR window, or `pitr_window` for this run (see `Jobs::gc`).
    pub fn gc(&self, tenant: TenantId, timeline: TimelineId, pitr_window: Option<Duration>) -> Result<GcOutcome, ManagementError> {
        let t = self.timeline(tenant, timeline)?;
        Ok(self.jobs.gc(&*self.tenant(tenant)?, &t, pitr_window)?)
    }

    /// Where `at` falls in the timeline's history (`lsn_for_timestamp`).
    pub fn lsn_by_timestamp(&self, tenant: TenantId, timeline: TimelineId, at: SystemTime) -> Result<LsnForTimestamp, ManagementError> {
        let t = self.timeline(tenant, timeline)?;
        lsn_for_timestamp(&t, timestamptz_from_system_time(at)).map_err(|e| ManagementError::Internal(e.into()))
    }

    /// The blocks that may have changed after `from` up to `to` (`pgdata::changes`), for a
    /// compute's cache of pages. `from > to` is a bad request; a `from` below the GC cutoff
    /// or the branch point is refused as gone before `to` is waited for (up to the
    /// wait-LSN timeout); more than `limit` changed keys is a conflict.
    pub fn changed_blocks(
        &self,
        tenant: TenantId,
        timeline: TimelineId,
        from: Lsn,
        to: Lsn,
        limit: usize,
    ) -> Result<ChangedBlocks, ManagementError> {
        let t = self.timeline(tenant, timeline)?;
        if from > to {
            return Err(ManagementError::BadRequest(ChangedKeysError::InvalidRange { from, to }.to_string()));
        }
        let horizon = t.gc_cutoff_lsn();
        if from < horizon {
            return Err(ManagementError::Gone(ChangedKeysError::BelowGcHorizon { from, horizon }.to_string()));
        }
        if let Some(branch_lsn) = t.ancestor_lsn().filter(|b| from < *b) {
            return Err(ManagementError::Gone(ChangedKeysError::BeforeBranchPoint { from, branch_lsn }.to_string()));
        }
        t.wait_lsn(to, self.conf.wait_lsn_timeout()).map_err(|e| ManagementError::Timeout(e.to_string()))?;
        let started = Instant::now();
        let changed = changed_blocks(&t, from, to, limit).map_err(|e| match e {
            e if e.is_history_gone() => ManagementError::Gone(e.to_string()),
            ChangesError::Keys(ChangedKeysError::TooManyChanges { .. }) => ManagementError::Conflict(e.to_string()),
            ChangesError::Keys(ChangedKeysError::InvalidRange { .. }) => ManagementError::BadRequest(e.to_string()),
            other => ManagementError::Internal(anyhow::Error::new(other).context(format!("list the blocks changed from {from} to {to}"))),
        })?;
        tracing::info!(
            tenant_id = %tenant,
            timeline_id = %timeline,
            "changed blocks from {from} to {to}: {} blocks, {} relations, {} databases in {} ms",
            changed.blocks.len(),
            changed.relations.len(),
            changed.databases.len(),
            started.elapsed().as_millis()
        );
        Ok(changed)
    }

    /// Starts following the WAL of `sources` (one at a time, with failover) into the
    /// timeline, replacing any receiver it had, except one that streams from the same list
    /// now (`WalReceiver::is_streaming_from`: every compute start asks again, and a restart
    /// would make its basebackup wait for a new session). The list is persisted in the
    /// timeline directory (`WAL_RECEIVER_SOURCE_FILE`, written atomically, readable by the
    /// pageserver's user only: it holds the token presented to the sources) so that the
    /// receiver is started again when the pageserver starts.
    ///
    /// Only an admin sets the sources. A compute ([`SourcesCaller::Compute`]) may name only
    /// sources already registered for the timeline, and then the registered list (with its
    /// token) is what starts: a tenant token can never point the receiver, and the token
    /// it presents, at a server of its choosing.
    pub fn start_wal_receiver(
        &self,
        tenant: TenantId,
        timeline: TimelineId,
        sources: WalSources,
        caller: SourcesCaller,
    ) -> Result<(), ManagementError> {
        let t = self.timeline(tenant, timeline)?;
        if !t.last_record_lsn().is_valid() {
            return Err(ManagementError::Conflict(format!(
                "timeline {timeline} has no data yet; import or branch it before streaming WAL into it"
            )));
        }
        let _changing = self.wal_sources_change.lock().unwrap_or_else(|p| p.into_inner());
        let path = t.path().join(WAL_RECEIVER_SOURCE_FILE);
        let registered = read_wal_sources(&path)?;
        let sources = match caller {
            SourcesCaller::Admin => sources,
            SourcesCaller::Compute => {
                if sources.token().is_some() {
                    return Err(ManagementError::Forbidden("only an admin token may give the WAL receiver a token".into()));
                }
                let Some(registered) = registered.clone() else {
                    return Err(ManagementError::Forbidden(format!(
                        "timeline {timeline} has no registered WAL sources; an admin registers them (fjord branch create, fjord start)"
                    )));
                };
                if let Some(stranger) = registered.first_not_among(&sources) {
                    return Err(ManagementError::Forbidden(format!(
                        "{stranger} is not one of timeline {timeline}'s registered WAL sources ({registered}); only an admin token may change them"
                    )));
                }
                registered
            }
        };
        let streaming = self
            .receivers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(tenant, timeline))
            .is_some_and(|r| r.is_streaming_from(&sources));
        if registered.as_ref() == Some(&sources) && streaming {
            tracing::debug!(%tenant, %timeline, "the WAL receiver already streams from {sources}; kept");
            return Ok(());
        }
        if registered.as_ref() != Some(&sources) {
            crashsafe::write_private_file_atomic(&path, &sources.to_json()).with_context(|| format!("write {}", path.display()))?;
        }
        // In the remote index too (without the token), for the next attachment elsewhere.
        t.set_remote_service_data(placement::INDEX_WAL_SOURCES, Some(placement::to_index(&sources)));
        self.spawn_wal_receiver(t, sources);
        Ok(())
    }

    /// Starts the receivers whose sources are persisted (at pageserver start).
    pub fn start_persisted_wal_receivers(&self) -> anyhow::Result<usize> {
        let mut started = 0;
        for id in self.tenants.ids() {
            let Some(tenant) = self.tenants.get(id) else { continue };
            for t in tenant.timelines() {
                let path = t.path().join(WAL_RECEIVER_SOURCE_FILE);
                let Some(sources) = read_wal_sources(&path)? else { continue };
                tracing::info!(tenant = %id, timeline = %t.timeline_id(), "restarting the WAL receiver from {sources}");
                self.spawn_wal_receiver(t, sources);
                started += 1;
            }
        }
        Ok(started)
    }

    /// Stops a timeline's receiver and forgets its source; `false` if it had none.
    pub fn stop_wal_receiver(&self, tenant: TenantId, timeline: TimelineId) -> Result<bool, ManagementError> {
        let t = self.timeline(tenant, timeline)?;
        let _changing = self.wal_sources_change.lock().unwrap_or_else(|p| p.into_inner());
        let path = t.path().join(WAL_RECEIVER_SOURCE_FILE);
        let had_file = match std::fs::remove_file(&path) {
            Ok(()) => {
                crashsafe::fsync_dir(t.path()).with_context(|| format!("fsync {}", t.path().display()))?;
                true
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(anyhow::Error::new(e).context(format!("remove {}", path.display())).into()),
        };
        t.set_remote_service_data(placement::INDEX_WAL_SOURCES, None);
        let old = self.receivers.lock().unwrap_or_else(|p| p.into_inner()).remove(&(tenant, timeline));
        let had_receiver = old.is_some();
        if let Some(old) = old {
            old.stop();
        }
        Ok(had_file || had_receiver)
    }

    fn spawn_wal_receiver(&self, t: Arc<Timeline>, sources: WalSources) {
        let (tenant, timeline) = (t.tenant_id(), t.timeline_id());
        let mut receivers = self.receivers.lock().unwrap_or_else(|p| p.into_inner());
        // The old receiver stops before the new one starts: a timeline has one writer, and
        // its local WAL one owner.
        if let Some(old) = receivers.remove(&(tenant, timeline)) {
            old.stop();
        }
        let gate = self.ingest_gate(tenant, timeline);
        // Over TLS with the cluster CA (`--tls-ca`); cleartext with `--no-tls`. Sources
        // registered without a token (restored from a remote index) get the pageserver's own.
        let tls = self.conf.tls.client.clone();
        // Never to a compute's walsender (a plaintext source): a tenant's own server.
        let safekeepers_only = sources.as_slice().iter().all(|s| !s.plaintext);
        let token = sources.token().map(str::to_string).or_else(|| self.conf.auth_token.clone().filter(|_| safekeepers_only));
        let receiver = WalReceiver::start_with_token(t, gate, Arc::clone(&self.reconstructor), sources, token, tls);
        receivers.insert((tenant, timeline), receiver);
    }

    fn ingest_gate(&self, tenant: TenantId, timeline: TimelineId) -> Arc<IngestGate> {
        let mut gates = self.ingest_gates.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(gates.entry((tenant, timeline)).or_default())
    }

    pub fn wal_receiver_status(&self, tenant: TenantId, timeline: TimelineId) -> Option<WalReceiverStatus> {
        self.receivers.lock().unwrap_or_else(|p| p.into_inner()).get(&(tenant, timeline)).map(WalReceiver::status)
    }

    /// Starts the thread that checks `layer_disk_budget_bytes` (if set) periodically;
    /// downloads make room under it without the thread (`service::eviction`).
    pub fn start_eviction(&self) {
        let Some(budget) = self.disk_budget.clone() else { return };
        let stopping = Arc::clone(&self.stopping);
        let period = std::time::Duration::from_millis(self.conf.eviction_period_ms);
        let handle = std::thread::Builder::new()
            .name("eviction".into())
            .spawn(move || {
                while !stopping.load(Ordering::SeqCst) {
                    budget.check();
                    let mut slept = std::time::Duration::ZERO;
                    while slept < period && !stopping.load(Ordering::SeqCst) {
                        let step = std::time::Duration::from_millis(100).min(period - slept);
                        std::thread::sleep(step);
                        slept += step;
                    }
                }
            })
            .expect("spawn the eviction thread");
        *self.eviction.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
    }

    /// At a clean shutdown, after the WAL receivers stopped: flushes every timeline, waits
    /// (at most `shutdown_upload_timeout_ms`) for the uploads, and stops the upload queues.
    /// A pageserver that then loses its disk restarts from remote storage at what it had
    /// ingested.
    pub fn shutdown_storage(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        if let Some(handle) = self.eviction.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = handle.join();
        }
        if let Some(handle) = self.warmer.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = handle.join();
        }
        let deadline = Instant::now() + self.conf.shutdown_upload_timeout();
        for id in self.tenants.ids() {
            let Some(tenant) = self.tenants.get(id) else { continue };
            if let Err(e) = tenant.flush_all() {
                tracing::warn!(tenant = %id, "could not flush at shutdown: {e:#}");
            }
            for t in tenant.timelines() {
                if !t.wait_for_uploads(deadline.saturating_duration_since(Instant::now())) {
                    // A superseded attachment uploads nothing more, by design.
                    if t.remote_status().is_some_and(|s| s.superseded_by.is_some()) {
                        continue;
                    }
                    tracing::warn!(tenant = %id, timeline = %t.timeline_id(), "uploads not finished at shutdown; they are retried at the next start");
                }
            }
            tenant.shutdown_remote();
        }
    }

    /// Stops every WAL receiver (at shutdown).
    pub fn stop_wal_receivers(&self) {
        let receivers: Vec<WalReceiver> = self.receivers.lock().unwrap_or_else(|p| p.into_inner()).drain().map(|(_, r)| r).collect();
        for r in receivers {
            r.stop();
        }
    }
}

/// A timeline's persisted WAL sources (`WAL_RECEIVER_SOURCE_FILE`), if it has any: the list
/// shape or the single-source shape written before lists existed.
fn read_wal_sources(path: &std::path::Path) -> anyhow::Result<Option<WalSources>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("read {}", path.display())),
    };
    WalSources::from_json(&bytes).map(Some).map_err(|e| anyhow::anyhow!("parse {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_pageserver_on_the_same_work_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let conf = PageserverConfig { workdir: dir.path().to_path_buf(), ..PageserverConfig::default() };
        let first = Pageserver::open(conf.clone()).unwrap();
        let err = Pageserver::open(conf.clone()).err().expect("a second pageserver on the directory");
        let msg = format!("{err:#}");
        assert!(msg.contains("in use by another pageserver") && msg.contains(&std::process::id().to_string()), "{msg}");
        drop(first);
        Pageserver::open(conf).expect("the directory is free again");
    }
}
