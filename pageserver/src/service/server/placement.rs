//! The storage controller's word, where it takes effect on this pageserver: joining it at
//! start ([`join_controller`]: register, then attach what it says this node holds, with
//! the generations it issued), and its orders (`PUT /v1/tenant/{tenant}/location`,
//! [`Pageserver::set_location`]): attach with a generation, hold as secondary, detach.
//!
//! A tenant moves between pageservers through remote storage: the new attachment loads it
//! from there (its layers downloaded when reads need them), and follows the WAL sources its
//! remote index names, presenting the pageserver's own token. A detached tenant leaves
//! this pageserver entirely, its local files included: should it come back, remote storage
//! is what it is rebuilt from, never files written under an older generation.
//!
//! Invariants:
//! - One change of placement at a time (`location_change`), so an order and a re-attach
//!   never interleave; orders are refused (503) until the re-attach is done.
//! - An order never lowers a tenant's generation: an attach older than the one held is
//!   refused with 409 (the controller that sent it no longer leads, or its order was
//!   overtaken).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use layerstore::remote::{GenerationSource, RemoteWalSource};
use layerstore::tenant::Tenant;
use pageserver_api::controller::{NodeRegisterRequest, ReAttachRequest};
use pageserver_api::models::{LocationConfig, LocationList, LocationMode, TenantLocationState};
use pageserver_api::{ClientConfig, ControllerClient};
use proto::TenantId;

use super::{read_wal_sources, ManagementError, Pageserver};
use crate::service::localwal::WAL_RECEIVER_SOURCE_FILE;
use crate::service::walreceiver::{WalSource, WalSources};

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
            })
            .collect();
        let secondaries = self.secondaries.lock().unwrap_or_else(|p| p.into_inner()).clone();
        tenants.extend(secondaries.into_iter().map(|tenant_id| TenantLocationState {
            tenant_id,
            mode: LocationMode::Secondary,
            generation: 0,
        }));
        tenants.sort_by_key(|t| t.tenant_id);
        LocationList { node_id: self.conf.node_id, tenants }
    }

    /// Carries out the controller's order for `tenant`; returns what is held afterwards.
    pub fn set_location(&self, tenant: TenantId, order: &LocationConfig) -> Result<TenantLocationState, ManagementError> {
        if self.conf.controller_url.is_none() {
            return Err(ManagementError::Conflict(
                "this pageserver runs without a storage controller (no controller_url): it takes no location orders".into(),
            ));
        }
        let _changing = self.location_change.lock().unwrap_or_else(|p| p.into_inner());
        if !self.joined.load(std::sync::atomic::Ordering::SeqCst) {
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
                })
            }
            (LocationMode::Attached, _) => Err(ManagementError::BadRequest("an attach order needs a generation above 0".into())),
            (_, Some(_)) => Err(ManagementError::BadRequest("only an attach order carries a generation".into())),
            (LocationMode::Secondary, None) => {
                self.detach(tenant, "held as secondary");
                self.secondaries.lock().unwrap_or_else(|p| p.into_inner()).insert(tenant);
                Ok(TenantLocationState { tenant_id: tenant, mode: LocationMode::Secondary, generation: 0 })
            }
            (LocationMode::Detached, None) => {
                self.detach(tenant, "detached");
                self.secondaries.lock().unwrap_or_else(|p| p.into_inner()).remove(&tenant);
                Ok(TenantLocationState { tenant_id: tenant, mode: LocationMode::Detached, generation: 0 })
            }
        }
    }

    /// Attaches `id` with the issued `generation` (a no-op if it is attached with it): loads
    /// it from local disk and remote storage, and starts following its WAL sources.
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
            self.detach(id, &format!("attached again with generation {generation}"));
        }
        let tenant = Tenant::load_as(
            &self.conf.tenants_dir(),
            id,
            self.conf.storage.clone(),
            crate::service::localwal::TIMELINE_DIR_ENTRIES,
            Some(remote),
            self.disk_budget.clone().map(|b| b as Arc<dyn layerstore::layer::DiskBudget>),
            GenerationSource::Issued { generation, node_id },
        )
        .with_context(|| format!("attach tenant {id} with generation {generation}"))?;
        self.tenant_confs.load(id, tenant.path()).with_context(|| format!("load the settings of tenant {id}"))?;
        let tenant = Arc::new(tenant);
        self.tenants.insert(Arc::clone(&tenant));
        self.secondaries.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        let mut following = 0;
        for t in tenant.timelines() {
            let path = t.path().join(WAL_RECEIVER_SOURCE_FILE);
            let sources = match read_wal_sources(&path)? {
                Some(local) => Some(local),
                None => from_index(&t.remote_wal_sources()),
            };
            if let Some(sources) = sources {
                if !path.exists() {
                    crashsafe::write_private_file_atomic(&path, &sources.to_json()).with_context(|| format!("write {}", path.display()))?;
                }
                self.spawn_wal_receiver(t, sources);
                following += 1;
            }
        }
        tracing::info!(tenant = %id, "attached with generation {generation}: {} timelines, {following} following their WAL sources", tenant.timelines().len());
        Ok(tenant)
    }

    /// Drops `id` from this pageserver: page requests find it no more, its WAL receivers
    /// and upload queues stop, and its local files are removed (in the background).
    pub(super) fn detach(&self, id: TenantId, why: &str) -> bool {
        let Some(tenant) = self.tenants.remove(id) else { return false };
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
        remove_tenant_dir(tenant.path());
        tracing::info!(tenant = %id, "tenant {why}: no longer served here");
        true
    }
}

/// The WAL sources a remote index names, as the receiver takes them (no token: the
/// receiver presents the pageserver's own). `None` if it names none or they do not check.
fn from_index(sources: &[RemoteWalSource]) -> Option<WalSources> {
    if sources.is_empty() {
        return None;
    }
    let list =
        sources.iter().map(|s| WalSource { host: s.host.clone(), port: s.port, user: s.user.clone(), plaintext: s.plaintext }).collect();
    match WalSources::new(list) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!("the WAL sources in the remote index do not check ({e}): not following them");
            None
        }
    }
}

/// What a timeline's remote index records of its sources (never the token).
pub(super) fn to_index(sources: &WalSources) -> Vec<RemoteWalSource> {
    sources
        .as_slice()
        .iter()
        .map(|s| RemoteWalSource { host: s.host.clone(), port: s.port, user: s.user.clone(), plaintext: s.plaintext })
        .collect()
}

/// Moves a tenant's directory out of the way at once (a temporary name, which a start
/// removes too) and removes it in the background.
fn remove_tenant_dir(path: &std::path::Path) {
    let doomed = crashsafe::temp_path(path);
    if let Err(e) = std::fs::rename(path, &doomed) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!("could not move {} aside to remove it: {e}", path.display());
        }
        return;
    }
    std::thread::spawn(move || {
        if let Err(e) = crashsafe::remove_temp(&doomed) {
            tracing::warn!("could not remove {}: {e}", doomed.display());
        }
    });
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
        if stop.load(std::sync::atomic::Ordering::SeqCst) {
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
    ps.joined.store(true, std::sync::atomic::Ordering::SeqCst);
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
    // Local tenants this node no longer holds were attached here under an older
    // generation; another node holds them now.
    let tenants_dir = ps.conf.tenants_dir();
    for entry in std::fs::read_dir(&tenants_dir).with_context(|| format!("list {}", tenants_dir.display()))? {
        let entry = entry.with_context(|| format!("list {}", tenants_dir.display()))?;
        let Ok(id) = entry.file_name().to_string_lossy().parse::<TenantId>() else { continue };
        if ps.tenants.get(id).is_none() {
            tracing::info!(tenant = %id, "removing the local copy of a tenant this node no longer holds");
            remove_tenant_dir(&entry.path());
        }
    }
    Ok(attached)
}
