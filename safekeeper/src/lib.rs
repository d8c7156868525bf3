//! fjord's safekeeper: one of the (three) acceptors that make a compute's WAL durable on a
//! majority before a commit is acknowledged, and the source of committed WAL for the
//! pageserver.
//!
//! - [`Safekeeper`]: the node: its data directory (locked against a second process), its
//!   timelines, metrics. Timelines are loaded at startup; one that cannot be loaded (a
//!   corrupt control file, a missing segment) is kept as *unavailable* with its error, shown
//!   over HTTP and returned to whoever asks for it, and its files are left untouched.
//! - [`timeline`]: one timeline's acceptor (the consensus core from `quorum`) and storage
//!   behind one lock.
//! - [`storage`]: the control file, WAL segments and `wal.end`; its docs state the fsync
//!   discipline.
//! - [`server`]: the TCP listener; a connection's first byte says whether it is a proposer
//!   (`quorum::wire`, [`proposer`]) or a PostgreSQL replication client ([`replication`]).
//! - [`http`]: status, timeline state and Prometheus metrics.
//! - [`access`]: the token check all three protocols share, when authentication is on
//!   ([`SafekeeperConfig::auth`]).

pub mod access;
pub mod http;
pub mod metrics;
pub mod peer;
pub mod proposer;
pub mod replication;
pub mod server;
pub mod storage;
pub mod stream;
pub mod timeline;
pub mod verify;

use anyhow::Context;
use proto::{TenantId, TimelineId};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use metrics::Metrics;
use storage::TimelineStorage;
pub use timeline::{Timeline, TimelineError};

/// The lock file that keeps a second safekeeper off a data directory.
pub const LOCK_FILE_NAME: &str = "safekeeper.lock";

/// What a safekeeper process is told by its flags.
#[derive(Clone, Debug)]
pub struct SafekeeperConfig {
    /// Remove WAL segments below each timeline's removal horizon (`storage::removal`);
    /// `--no-wal-removal` turns it off (everything is kept, as before removal existed).
    pub wal_removal: bool,
    /// A broken timeline (a storage failure, a panic) is reloaded from disk when it is asked
    /// for again, at most this often.
    pub broken_reload_interval: std::time::Duration,
    /// Authentication (`--auth-public-key`): every proposer, replication client and HTTP
    /// request (but `/metrics` and `/v1/status`) needs a token this verifier accepts and
    /// that grants what it asks ([`access`]). `None`: trust, as before tokens existed.
    pub auth: Option<auth::Verifier>,
    /// TLS (`--tls-cert` and `--tls-key`, or `--no-tls`): the certificate of the
    /// safekeeper port (after an `SSLRequest`; a client that sends none is refused, see
    /// [`server`]) and the HTTP API. `None`: cleartext.
    pub tls: Option<tls::ServerTls>,
}

impl Default for SafekeeperConfig {
    fn default() -> Self {
        SafekeeperConfig { wal_removal: true, broken_reload_interval: std::time::Duration::from_secs(5), auth: None, tls: None }
    }
}

/// A timeline as the node knows it: usable, or not loadable with the reason.
#[derive(Clone)]
pub enum TimelineEntry {
    Ok(Arc<Timeline>),
    Unavailable(String),
}

pub struct Safekeeper {
    pub node_id: u64,
    data_dir: PathBuf,
    timelines: RwLock<BTreeMap<(TenantId, TimelineId), TimelineEntry>>,
    /// When each broken timeline was last reloaded (or tried to be).
    reloads: std::sync::Mutex<BTreeMap<(TenantId, TimelineId), std::time::Instant>>,
    pub metrics: Arc<Metrics>,
    pub config: SafekeeperConfig,
    /// The token check, if authentication is on (from `config.auth`).
    pub auth: Option<access::Authenticator>,
    /// Holds the `flock` on the lock file for the life of the process.
    _lock: crashsafe::DataDirLock,
}

impl Safekeeper {
    /// [`Safekeeper::open_with_config`] with the default configuration (WAL removal on).
    pub fn open(node_id: u64, data_dir: &Path) -> anyhow::Result<Arc<Safekeeper>> {
        Self::open_with_config(node_id, data_dir, SafekeeperConfig::default())
    }

    /// Locks `data_dir` (creating it if needed) and loads every timeline in it. Errors only
    /// if the directory cannot be used at all; a timeline that fails to load is logged and
    /// kept as unavailable.
    pub fn open_with_config(node_id: u64, data_dir: &Path, config: SafekeeperConfig) -> anyhow::Result<Arc<Safekeeper>> {
        std::fs::create_dir_all(data_dir).with_context(|| format!("create data directory {}", data_dir.display()))?;
        // A second process on the same directory fails here, naming the holder's pid.
        let lock = crashsafe::DataDirLock::acquire(data_dir, LOCK_FILE_NAME, "safekeeper")?;
        let metrics = Arc::new(Metrics::new().context("register metrics")?);
        let mut timelines = BTreeMap::new();
        for tenant_entry in read_dir_sorted(data_dir)? {
            let Some(tenant) = tenant_entry.file_name().and_then(|n| n.to_str()).and_then(|n| n.parse::<TenantId>().ok()) else {
                continue;
            };
            if !tenant_entry.is_dir() {
                continue;
            }
            for tl_entry in read_dir_sorted(&tenant_entry)? {
                // A creation interrupted by a crash (`TimelineStorage::create` builds a
                // timeline under this name and renames it into place).
                if tl_entry.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with('.') && n.ends_with(".creating")) {
                    std::fs::remove_dir_all(&tl_entry).with_context(|| format!("remove {}", tl_entry.display()))?;
                    tracing::info!("removed {}, a timeline creation a crash interrupted", tl_entry.display());
                    continue;
                }
                let Some(timeline) = tl_entry.file_name().and_then(|n| n.to_str()).and_then(|n| n.parse::<TimelineId>().ok()) else {
                    continue;
                };
                let entry = match load_timeline(&tl_entry, tenant, timeline, &metrics) {
                    Ok(tl) => {
                        tracing::info!(
                            tenant_id = %tenant,
                            timeline_id = %timeline,
                            wal_begin_lsn = %tl.wal_begin_lsn(),
                            flush_lsn = %tl.flush_lsn(),
                            commit_lsn = %tl.commit_lsn(),
                            remote_consistent_lsn = %tl.remote_consistent_lsn(),
                            "loaded timeline"
                        );
                        TimelineEntry::Ok(Arc::new(tl))
                    }
                    Err(e) => {
                        let reason = format!("{e:#}");
                        tracing::error!(tenant_id = %tenant, timeline_id = %timeline, "cannot load timeline: {reason}");
                        TimelineEntry::Unavailable(reason)
                    }
                };
                timelines.insert((tenant, timeline), entry);
            }
        }
        Ok(Arc::new(Safekeeper {
            node_id,
            data_dir: data_dir.to_path_buf(),
            timelines: RwLock::new(timelines),
            reloads: std::sync::Mutex::new(BTreeMap::new()),
            auth: config.auth.clone().map(|v| access::Authenticator::new(v, metrics.auth_failures.clone())),
            metrics,
            config,
            _lock: lock,
        }))
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    fn timeline_dir(&self, tenant: TenantId, timeline: TimelineId) -> PathBuf {
        self.data_dir.join(tenant.to_string()).join(timeline.to_string())
    }

    /// A broken timeline is reloaded from disk, as a restart of the process would (the disk
    /// is what was made durable; the broken object refuses everything, so nothing goes
    /// through it any more), at most once per `broken_reload_interval`. A timeline that does
    /// not load becomes unavailable with the reason.
    fn reload_if_broken(&self, tenant: TenantId, timeline: TimelineId) {
        let key = (tenant, timeline);
        let broken = match self.timelines.read().unwrap_or_else(|e| e.into_inner()).get(&key) {
            Some(TimelineEntry::Ok(tl)) => tl.broken().map(|reason| (tl.clone(), reason)),
            _ => None,
        };
        let Some((old, reason)) = broken else { return };
        {
            let mut reloads = self.reloads.lock().unwrap_or_else(|e| e.into_inner());
            let now = std::time::Instant::now();
            if reloads.get(&key).is_some_and(|at| now.duration_since(*at) < self.config.broken_reload_interval) {
                return;
            }
            reloads.insert(key, now);
        }
        let mut map = self.timelines.write().unwrap_or_else(|e| e.into_inner());
        // Someone else may have reloaded it meanwhile.
        if !matches!(map.get(&key), Some(TimelineEntry::Ok(tl)) if Arc::ptr_eq(tl, &old)) {
            return;
        }
        match load_timeline(&self.timeline_dir(tenant, timeline), tenant, timeline, &self.metrics) {
            Ok(tl) => {
                tracing::warn!(tenant_id = %tenant, timeline_id = %timeline, flush_lsn = %tl.flush_lsn(), "reloaded the timeline from disk after it broke: {reason}");
                map.insert(key, TimelineEntry::Ok(Arc::new(tl)));
            }
            Err(e) => {
                let why = format!("{e:#}");
                tracing::error!(tenant_id = %tenant, timeline_id = %timeline, "could not reload the broken timeline from disk: {why}");
                map.insert(key, TimelineEntry::Unavailable(format!("broken ({reason}), and reloading it from disk failed: {why}")));
            }
        }
    }

    /// The timeline, if it exists and is usable; otherwise an error that says which it is.
    /// A broken one is reloaded from disk first (see `reload_if_broken`).
    pub fn get_timeline(&self, tenant: TenantId, timeline: TimelineId) -> Result<Arc<Timeline>, TimelineError> {
        self.reload_if_broken(tenant, timeline);
        let map = self.timelines.read().unwrap_or_else(|e| e.into_inner());
        match map.get(&(tenant, timeline)) {
            None => Err(TimelineError::NotFound { tenant, timeline }),
            Some(TimelineEntry::Unavailable(reason)) => Err(TimelineError::Unavailable { tenant, timeline, reason: reason.clone() }),
            Some(TimelineEntry::Ok(tl)) => match tl.broken() {
                Some(reason) => Err(TimelineError::Unavailable { tenant, timeline, reason }),
                None => Ok(tl.clone()),
            },
        }
    }

    /// Every timeline with its entry, for status and shutdown.
    pub fn timelines(&self) -> Vec<((TenantId, TimelineId), TimelineEntry)> {
        let map = self.timelines.read().unwrap_or_else(|e| e.into_inner());
        map.iter().map(|(k, v)| (*k, v.clone())).collect()
    }

    /// Creates a timeline on purpose (the control plane, when it creates the timeline): a
    /// voter from the start (blocking: it writes and fsyncs files). Creating one that exists
    /// with the same system and segment size changes nothing (`Ok(false)`), and does not
    /// make a learner a voter; with another system or segment size it is refused.
    pub fn create_timeline(&self, tenant: TenantId, timeline: TimelineId, system_id: u64, wal_segment_size: u32) -> Result<bool, String> {
        if !valid_segment_size(wal_segment_size) {
            return Err(format!("WAL segment size {wal_segment_size} is not a power of two between 1 MiB and 1 GiB"));
        }
        let mut map = self.timelines.write().unwrap_or_else(|e| e.into_inner());
        match map.get(&(tenant, timeline)) {
            Some(TimelineEntry::Unavailable(reason)) => {
                Err(TimelineError::Unavailable { tenant, timeline, reason: reason.clone() }.to_string())
            }
            Some(TimelineEntry::Ok(tl)) => {
                if tl.system_id() != system_id || tl.wal_segment_size() != wal_segment_size {
                    return Err(format!(
                        "timeline {tenant}/{timeline} exists with system {} and WAL segments of {} bytes, not system {system_id} and {wal_segment_size}",
                        tl.system_id(),
                        tl.wal_segment_size()
                    ));
                }
                Ok(false)
            }
            None => {
                let tl = self.create_storage(tenant, timeline, system_id, wal_segment_size, false)?;
                tracing::info!(tenant_id = %tenant, timeline_id = %timeline, system_id, wal_segment_size, "created timeline");
                map.insert((tenant, timeline), TimelineEntry::Ok(tl));
                Ok(true)
            }
        }
    }

    fn create_storage(
        &self,
        tenant: TenantId,
        timeline: TimelineId,
        system_id: u64,
        wal_segment_size: u32,
        learner: bool,
    ) -> Result<Arc<Timeline>, String> {
        let dir = self.timeline_dir(tenant, timeline);
        let storage = TimelineStorage::create(&dir, tenant, timeline, system_id, wal_segment_size, learner)
            .map_err(|e| format!("could not create timeline {tenant}/{timeline}: {e:#}"))?;
        Ok(Arc::new(Timeline::new(storage, self.metrics.clone())))
    }

    /// What a proposer's `Hello` does: the timeline (blocking: it may write and fsync
    /// files). One this safekeeper has no record of is created as a *learner*: it was
    /// either never created here, or lost with a disk, and a blank copy must not vote
    /// (`quorum`'s "Learners"); it catches up in the next election the others win. The
    /// error text is what the proposer is told.
    pub fn hello_timeline(
        &self,
        tenant: TenantId,
        timeline: TimelineId,
        system_id: u64,
        wal_segment_size: u32,
    ) -> Result<Arc<Timeline>, String> {
        self.reload_if_broken(tenant, timeline);
        let mut map = self.timelines.write().unwrap_or_else(|e| e.into_inner());
        let tl = match map.get(&(tenant, timeline)) {
            Some(TimelineEntry::Unavailable(reason)) => {
                return Err(TimelineError::Unavailable { tenant, timeline, reason: reason.clone() }.to_string())
            }
            Some(TimelineEntry::Ok(tl)) => tl.clone(),
            None => {
                let tl = self.create_storage(tenant, timeline, system_id, wal_segment_size, true)?;
                tracing::warn!(
                    tenant_id = %tenant,
                    timeline_id = %timeline,
                    system_id,
                    wal_segment_size,
                    "a proposer writes to a timeline this safekeeper has no record of (its data was lost, or the timeline was never created here): created it as a learner, which does not vote until it has caught up from the others"
                );
                map.insert((tenant, timeline), TimelineEntry::Ok(tl.clone()));
                tl
            }
        };
        drop(map);
        if let Some(reason) = tl.broken() {
            return Err(TimelineError::Unavailable { tenant, timeline, reason }.to_string());
        }
        if tl.system_id() != system_id {
            return Err(format!(
                "timeline {tenant}/{timeline} was created for system {}, this proposer writes WAL of system {system_id}",
                tl.system_id()
            ));
        }
        if tl.wal_segment_size() != wal_segment_size {
            return Err(format!(
                "timeline {tenant}/{timeline} has WAL segments of {} bytes, this proposer uses {wal_segment_size}",
                tl.wal_segment_size()
            ));
        }
        Ok(tl)
    }

    /// Writes every timeline's commit LSN, peer horizon and remote-consistent LSN that
    /// advanced since they were last written (blocking). Runs about once a second and at
    /// shutdown.
    pub fn persist_lazy_state(&self) {
        for ((tenant, timeline), entry) in self.timelines() {
            if let TimelineEntry::Ok(tl) = entry {
                if let Err(e) = tl.persist_lazy() {
                    tracing::warn!(tenant_id = %tenant, timeline_id = %timeline, "could not persist the commit LSN and removal horizons: {e:#}");
                }
            }
        }
    }

    /// Removes every timeline's WAL below its removal horizon (blocking), unless the
    /// configuration turned removal off. Runs after each [`Safekeeper::persist_lazy_state`]
    /// of the periodic task. A timeline whose removal fails is broken (logged there).
    pub fn remove_wal(&self) {
        if !self.config.wal_removal {
            return;
        }
        for (_, entry) in self.timelines() {
            if let TimelineEntry::Ok(tl) = entry {
                let _ = tl.remove_wal();
            }
        }
    }
}

/// A WAL segment size PostgreSQL can have: a power of two from 1 MiB to 1 GiB.
pub fn valid_segment_size(bytes: u32) -> bool {
    bytes.is_power_of_two() && (1 << 20..=1 << 30).contains(&bytes)
}

fn load_timeline(dir: &Path, tenant: TenantId, timeline: TimelineId, metrics: &Arc<Metrics>) -> anyhow::Result<Timeline> {
    let storage = TimelineStorage::open(dir)?;
    let c = storage.control();
    if c.tenant != tenant || c.timeline != timeline {
        anyhow::bail!("control file in {} belongs to timeline {}/{}", dir.display(), c.tenant, c.timeline);
    }
    Ok(Timeline::new(storage, metrics.clone()))
}

fn read_dir_sorted(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).with_context(|| format!("list {}", dir.display()))? {
        v.push(e.with_context(|| format!("list {}", dir.display()))?.path());
    }
    v.sort();
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A broken timeline is reloaded from disk when asked for again (not sooner than the
    /// interval), and works: here broken by a panic under its lock.
    #[test]
    fn a_broken_timeline_is_reloaded_from_disk() {
        let dir = tempfile::tempdir().unwrap();
        let config = SafekeeperConfig { broken_reload_interval: std::time::Duration::from_millis(200), ..SafekeeperConfig::default() };
        let sk = Safekeeper::open_with_config(1, dir.path(), config).unwrap();
        let (t, tl) = (TenantId::from_bytes([1; 16]), TimelineId::from_bytes([2; 16]));
        assert!(sk.create_timeline(t, tl, 7, 1 << 20).unwrap());
        let first = sk.get_timeline(t, tl).unwrap();
        first.poison_for_tests();
        assert!(first.broken().is_some());
        // Reloaded at once (never reloaded before), a new object that works.
        let second = sk.get_timeline(t, tl).unwrap();
        assert!(!Arc::ptr_eq(&first, &second));
        assert!(second.broken().is_none());
        assert!(second.handle_batch(vec![quorum::ToAcceptor::Greeting { round: 1 }]).is_ok());
        // Broken again right away: not reloaded before the interval has passed.
        second.poison_for_tests();
        assert!(sk.get_timeline(t, tl).is_err());
        std::thread::sleep(std::time::Duration::from_millis(250));
        assert!(sk.get_timeline(t, tl).unwrap().broken().is_none());
    }

    /// Leftovers of a crash in the middle of a timeline creation are removed at startup.
    #[test]
    fn an_interrupted_creation_is_removed_at_startup() {
        let dir = tempfile::tempdir().unwrap();
        let t = TenantId::from_bytes([1; 16]);
        let leftover = dir.path().join(t.to_string()).join(format!(".{}.creating", TimelineId::from_bytes([3; 16])));
        std::fs::create_dir_all(&leftover).unwrap();
        std::fs::write(leftover.join("safekeeper.control"), b"half").unwrap();
        let sk = Safekeeper::open(1, dir.path()).unwrap();
        assert!(!leftover.exists());
        assert!(sk.timelines().is_empty());
    }
}
