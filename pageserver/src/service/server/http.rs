//! The management API: JSON over HTTP (axum), plus Prometheus `/metrics`.
//!
//! | method | path | what |
//! |---|---|---|
//! | GET | `/v1/status` | liveness, version, features (`no-full-page-images`) |
//! | GET | `/v1/tenant` | tenant ids |
//! | POST | `/v1/tenant` | create a tenant: `{"tenant_id": "..."}` (optional; random if absent) |
//! | GET | `/v1/tenant/{tenant}/timeline` | the tenant's timelines with their LSNs |
//! | POST | `/v1/tenant/{tenant}/timeline` | create: `{"timeline_id"?, "ancestor_timeline_id"?, "ancestor_lsn"?}` |
//! | GET | `/v1/tenant/{tenant}/timeline/{timeline}` | one timeline's status (LSNs, layers, WAL receiver, `system_id`) |
//! | POST | `/v1/tenant/{tenant}/timeline/{timeline}/import` | `{"pgdata": "/path"}`: bootstrap from a shut-down data directory on this host |
//! | POST | `/v1/tenant/{tenant}/timeline/{timeline}/wal_receiver` | `{"sources": [{"host", "port", "user"}, ...], "token"?}` (1 to 16, no duplicate host and port, no port 0) or one source `{"host", "port", "user"}`: follow the timeline's WAL over streaming replication from one source at a time, failing over to the next and switching to one with more WAL (application_name `fjord_pageserver`, database `<tenant>/<timeline>`), presenting `token` to a source that asks for a password; persisted, restarted when the pageserver starts; 400 with the reason for an invalid list. Only an admin sets or changes the sources: a tenant token may name only registered ones (then the registered list restarts), else 403 |
//! | DELETE | `/v1/tenant/{tenant}/timeline/{timeline}/wal_receiver` | admin only: stop the receiver and forget its source (404 if there is none) |
//! | GET | `/v1/tenant/{tenant}/timeline/{timeline}/basebackup[?lsn=X/X][&standby=true]` | `application/x-tar` data directory to start a compute at the LSN (default: the last record LSN; an explicit one is waited for; a hot standby's starts at the newest running-transactions record at or before it), header `X-Fjord-Lsn`; 400 below the GC horizon or branch point, 504 if the LSN is not ingested in time |
//! | POST | `/v1/tenant/{tenant}/timeline/{timeline}/evict_layers` | delete the local copy of every layer remote storage holds (reads download them again): how many and their bytes |
//! | GET | `/v1/tenant/{tenant}/config` | the tenant's settings and its PITR window in force |
//! | PUT | `/v1/tenant/{tenant}/config` | `{"pitr_window"?: "1s"}`: replace the tenant's settings (persisted; an absent field takes the pageserver's default) |
//! | GET | `/v1/location` | admin: what this pageserver holds, `{"node_id"?, "joined", "tenants": [{"tenant_id", "mode": "attached"\|"secondary", "generation"}]}` (the storage controller's heartbeat) |
//! | PUT | `/v1/tenant/{tenant}/location` | admin: the storage controller's order, `{"mode": "attached", "generation": N}`, `{"mode": "secondary"\|"detached", "generation"?: N}`; 409 without a controller, for an attach older than the one held, or for a let-go order given at a generation not newer than the attachment's; 503 while still joining |
//! | POST | `/v1/tenant/{tenant}/timeline/{timeline}/checkpoint` | freeze the open in-memory layer and flush it: the layers written |
//! | POST | `/v1/tenant/{tenant}/timeline/{timeline}/compact` | `{"force_l0"?, "force_image_layers"?}`: image layers where the delta depth asks for them (or everywhere), then L0 compaction: what was written and removed |
//! | POST | `/v1/tenant/{tenant}/timeline/{timeline}/lsn_lease` | `{"holder", "lsn", "ttl_secs"}`: GC keeps `lsn` and above readable for `ttl_secs` (a read replica renews its replay position, a compute at a past LSN that LSN); 400 below the GC cutoff or a TTL outside 1..=3600; 403 when the holder's lease in force was taken with another tenant token (only its token or an admin renews it); the leases in force |
//! | POST | `/v1/tenant/{tenant}/timeline/{timeline}/gc` | `{"pitr_window"?}`: GC with the tenant's PITR window or this one: the cutoff and what was removed |
//! | GET | `/v1/tenant/{tenant}/timeline/{timeline}/get_lsn_by_timestamp?timestamp=<RFC 3339>` | `{"kind": "present"\|"future"\|"past"\|"nodata", "lsn"}`: the LSN that shows exactly the commits up to the time |
//! | GET | `/v1/tenant/{tenant}/timeline/{timeline}/changed_blocks?from=X/X&to=X/X[&limit=N]` | `{"from", "to", "blocks": [[spc, db, rel, fork, blkno, "lsn"]], "relations": [[spc, db, rel, fork, nblocks\|null, "lsn"]], "databases": [[spc, db, "lsn"]]}`: what a compute's page cache valid as of LSNs from `from` on must drop to start at `to` (waited for; `pgdata::changes`); 400 bad query or `from` after `to`, 410 `from` below the GC horizon or the branch point, 409 more than `limit` (default 100000, at most 1000000) keys changed, 504 `to` not ingested in time |
//! | GET | `/metrics` | Prometheus text format |
//!
//! Errors are `{"error": "..."}` with a status code chosen in one place, [`ApiError`].
//!
//! With `auth_public_key_path` set, every route but `/v1/status` and `/metrics` wants an
//! `Authorization: Bearer <token>` header: an admin token, or for the calls a compute
//! makes (a timeline's status, `wal_receiver`, `basebackup`, `lsn_lease`,
//! `get_lsn_by_timestamp`, `changed_blocks`) a token for the path's tenant; `wal_receiver`
//! then checks further who asks (above). A request
//! without a valid token gets 401, one whose token does not grant it 403; both are logged
//! and counted (`pageserver_auth_failures_total{service="http"}`) and change nothing.
//!
//! Every body is a type of the `pageserver_api` crate, which the CLI and compute_ctl
//! decode with the same types; this file only maps them to and from the domain.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use pageserver_api::models::{
    BasebackupQuery, ChangedBlock, ChangedBlocksQuery, ChangedBlocksResponse, ChangedRelation, CheckpointResponse, CompactRequest,
    CompactResponse, DroppedDatabase, ErrorResponse, EvictLayersResponse, GcRequest, GcResponse, ImportRequest, ImportResponse,
    LocationConfig, LocationList, LsnByTimestampQuery, LsnByTimestampResponse, LsnKind, LsnLease, LsnLeaseRequest, LsnLeaseResponse,
    RemoteStorageStatus, StatusResponse, TenantConfig, TenantConfigInfo, TenantCreateRequest, TenantCreateResponse, TenantLocationState,
    TimelineCreateRequest, TimelineInfo, BASEBACKUP_CONTENT_TYPE, CHANGED_BLOCKS_LIMIT_DEFAULT,
};
use pageserver_api::time::HumanDuration;
use prometheus::{Encoder, IntGaugeVec, Opts, Registry, TextEncoder};
use proto::{TenantId, TimelineId};

use super::{ManagementError, Pageserver, SourcesCaller};

mod auth_layer;
use crate::pgdata::timestamp::LsnForTimestamp;
use layerstore::timeline::Timeline;

/// Maps domain errors to HTTP, in one place.
pub struct ApiError(ManagementError);

impl From<ManagementError> for ApiError {
    fn from(e: ManagementError) -> Self {
        ApiError(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = match &self.0 {
            ManagementError::TenantNotFound(_) | ManagementError::TimelineNotFound(..) | ManagementError::NotFound(_) => {
                StatusCode::NOT_FOUND
            }
            ManagementError::Conflict(_) => StatusCode::CONFLICT,
            ManagementError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ManagementError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ManagementError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ManagementError::Gone(_) => StatusCode::GONE,
            ManagementError::Forbidden(_) => StatusCode::FORBIDDEN,
            ManagementError::Internal(e) => {
                tracing::error!("management request failed: {e:#}");
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        let message = match &self.0 {
            ManagementError::Internal(e) => format!("{e:#}"),
            other => other.to_string(),
        };
        (status, Json(ErrorResponse { error: message })).into_response()
    }
}

fn parse<T: std::str::FromStr>(what: &str, s: &str) -> Result<T, ApiError>
where
    T::Err: std::fmt::Display,
{
    s.parse().map_err(|e: T::Err| ApiError(ManagementError::BadRequest(format!("invalid {what}: {e}"))))
}

fn timeline_info(ps: &Pageserver, t: &Timeline) -> TimelineInfo {
    TimelineInfo {
        wal_receiver: ps.wal_receiver_status(t.tenant_id(), t.timeline_id()),
        tenant_id: t.tenant_id(),
        timeline_id: t.timeline_id(),
        ancestor_timeline_id: t.ancestor_timeline_id(),
        ancestor_lsn: t.ancestor_lsn(),
        last_record_lsn: t.last_record_lsn(),
        disk_consistent_lsn: t.disk_consistent_lsn(),
        gc_cutoff_lsn: t.gc_cutoff_lsn(),
        layers: t.layers().len() as u64,
        system_id: system_id(ps, t),
        remote_storage: t.remote_status().map(|r| RemoteStorageStatus {
            generation: r.generation,
            remote_consistent_lsn: r.remote_consistent_lsn,
            queued_operations: r.queued_operations as u64,
            last_error: r.last_error,
            failing_since_unix_s: r.failing_since_unix_s,
            superseded_by: r.superseded_by,
            layers_uploaded: r.layers_uploaded,
            bytes_uploaded: r.bytes_uploaded,
            indexes_uploaded: r.indexes_uploaded,
            objects_deleted: r.objects_deleted,
            layers_downloaded: r.layers_downloaded,
            resident_layer_bytes: t.resident_layer_bytes(),
        }),
    }
}

/// The system identifier in the timeline's control file at its last record LSN. It never
/// changes for a timeline, so it is read once and remembered: a status poll must not read
/// (and download) layers.
fn system_id(ps: &Pageserver, t: &Timeline) -> Option<u64> {
    let key = (t.tenant_id(), t.timeline_id());
    if let Some(id) = ps.system_ids.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return Some(*id);
    }
    let lsn = t.last_record_lsn();
    if !lsn.is_valid() {
        return None;
    }
    let datadir = crate::pgdata::datadir::Datadir::new(t, ps.reconstructor.as_ref());
    let raw = datadir.get_control_file(lsn).ok()?;
    let id = crate::pgdata::import::ControlFile::parse(&raw).ok().map(|c| c.system_identifier)?;
    ps.system_ids.lock().unwrap_or_else(|p| p.into_inner()).insert(key, id);
    Some(id)
}

/// Parses a JSON request body ourselves, so that a malformed one gets the same
/// `{"error": ...}` answer as every other bad request. An empty body means "all defaults".
/// Ids and LSNs in a body are validated here too, as the model's fields are typed.
fn json_body<T: serde::de::DeserializeOwned + Default>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|e| ApiError(ManagementError::BadRequest(format!("invalid request body: {e}"))))
}

fn random_id() -> [u8; 16] {
    rand::random()
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, ManagementError> + Send + 'static) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError(ManagementError::Internal(anyhow::anyhow!("management task failed: {e}"))))?
        .map_err(ApiError)
}

/// The routes in three groups by who may call them (with authentication on; without it,
/// anyone may call anything).
pub fn router(ps: Arc<Pageserver>) -> Router {
    // Anyone: liveness and metrics.
    let open = Router::new().route("/v1/status", get(status)).route("/metrics", get(metrics));
    // The calls a compute (compute_ctl) makes: an admin token, or one for the path's
    // tenant and timeline.
    let compute = Router::new()
        .route("/v1/tenant/{tenant}/timeline/{timeline}", get(get_timeline))
        .route("/v1/tenant/{tenant}/timeline/{timeline}/wal_receiver", post(start_wal_receiver).delete(stop_wal_receiver))
        .route("/v1/tenant/{tenant}/timeline/{timeline}/basebackup", get(basebackup))
        .route("/v1/tenant/{tenant}/timeline/{timeline}/lsn_lease", post(lsn_lease))
        .route("/v1/tenant/{tenant}/timeline/{timeline}/get_lsn_by_timestamp", get(lsn_by_timestamp))
        .route("/v1/tenant/{tenant}/timeline/{timeline}/changed_blocks", get(changed_blocks))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&ps), auth_layer::compute));
    // Everything else: an admin token.
    let management = Router::new()
        .route("/v1/tenant", get(list_tenants).post(create_tenant))
        .route("/v1/tenant/{tenant}/timeline", get(list_timelines).post(create_timeline))
        .route("/v1/tenant/{tenant}/timeline/{timeline}/import", post(import))
        .route("/v1/tenant/{tenant}/timeline/{timeline}/evict_layers", post(evict_layers))
        .route("/v1/tenant/{tenant}/config", get(get_tenant_config).put(set_tenant_config))
        .route("/v1/location", get(list_locations))
        .route("/v1/tenant/{tenant}/location", axum::routing::put(set_location))
        .route("/v1/tenant/{tenant}/timeline/{timeline}/checkpoint", post(checkpoint))
        .route("/v1/tenant/{tenant}/timeline/{timeline}/compact", post(compact))
        .route("/v1/tenant/{tenant}/timeline/{timeline}/gc", post(gc))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&ps), auth_layer::management));
    open.merge(compute).merge(management).with_state(ps)
}

async fn list_tenants(State(ps): State<Arc<Pageserver>>) -> Json<Vec<TenantId>> {
    Json(ps.tenants.ids())
}

async fn create_tenant(State(ps): State<Arc<Pageserver>>, body: Bytes) -> Result<impl IntoResponse, ApiError> {
    let req: TenantCreateRequest = json_body(&body)?;
    let id = req.tenant_id.unwrap_or_else(|| TenantId(random_id()));
    blocking(move || ps.create_tenant(id)).await?;
    Ok((StatusCode::CREATED, Json(TenantCreateResponse { tenant_id: id })))
}

async fn list_timelines(State(ps): State<Arc<Pageserver>>, Path(tenant): Path<String>) -> Result<Json<Vec<TimelineInfo>>, ApiError> {
    let tenant = ps.tenant(parse("tenant id", &tenant)?)?;
    Ok(Json(tenant.timelines().iter().map(|t| timeline_info(&ps, t)).collect()))
}

async fn create_timeline(
    State(ps): State<Arc<Pageserver>>,
    Path(tenant): Path<String>,
    body: Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let tenant: TenantId = parse("tenant id", &tenant)?;
    let req: TimelineCreateRequest = json_body(&body)?;
    let timeline = req.timeline_id.unwrap_or_else(|| TimelineId(random_id()));
    let ancestor = match (req.ancestor_timeline_id, req.ancestor_lsn) {
        (None, None) => None,
        (None, Some(_)) => {
            return Err(ApiError(ManagementError::BadRequest("ancestor_lsn needs ancestor_timeline_id".into())));
        }
        (Some(a), lsn) => Some((a, lsn)),
    };
    let ps2 = Arc::clone(&ps);
    let created = blocking(move || ps.create_timeline(tenant, timeline, ancestor)).await?;
    Ok((StatusCode::CREATED, Json(timeline_info(&ps2, &created))))
}

async fn get_timeline(
    State(ps): State<Arc<Pageserver>>,
    Path((tenant, timeline)): Path<(String, String)>,
) -> Result<Json<TimelineInfo>, ApiError> {
    let t = ps.timeline(parse("tenant id", &tenant)?, parse("timeline id", &timeline)?)?;
    Ok(Json(timeline_info(&ps, &t)))
}

async fn import(
    State(ps): State<Arc<Pageserver>>,
    Path((tenant, timeline)): Path<(String, String)>,
    body: Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let req: ImportRequest = json_body(&body)?;
    let (tenant, timeline) = (parse("tenant id", &tenant)?, parse("timeline id", &timeline)?);
    let summary = blocking(move || ps.import(tenant, timeline, &req.pgdata)).await?;
    Ok(Json(ImportResponse {
        checkpoint_lsn: summary.checkpoint_lsn,
        databases: summary.databases as u64,
        import_lsn: summary.import_lsn,
        system_identifier: summary.system_identifier,
    }))
}

async fn start_wal_receiver(
    State(ps): State<Arc<Pageserver>>,
    Path((tenant, timeline)): Path<(String, String)>,
    Extension(caller): Extension<auth_layer::Caller>,
    body: Bytes,
) -> Result<impl IntoResponse, ApiError> {
    let (tenant, timeline) = (parse("tenant id", &tenant)?, parse("timeline id", &timeline)?);
    let sources = crate::service::walreceiver::WalSources::from_json(&body)
        .map_err(|e| ApiError(ManagementError::BadRequest(format!("invalid request body: {e}"))))?;
    let caller = if caller.is_admin() { SourcesCaller::Admin } else { SourcesCaller::Compute };
    blocking(move || ps.start_wal_receiver(tenant, timeline, sources, caller)).await?;
    Ok(StatusCode::ACCEPTED)
}

/// Deletes the local copy of every layer remote storage holds (for tests of downloads and
/// of a cold cache); reads download them again.
async fn evict_layers(
    State(ps): State<Arc<Pageserver>>,
    Path((tenant, timeline)): Path<(String, String)>,
) -> Result<Json<EvictLayersResponse>, ApiError> {
    let t = ps.timeline(parse("tenant id", &tenant)?, parse("timeline id", &timeline)?)?;
    let resp = blocking(move || {
        let mut resp = EvictLayersResponse::default();
        for layer in t.evictable_layers() {
            if layer.evict().map_err(|e| anyhow::anyhow!("evict {}: {e}", layer.path().display()))? {
                resp.evicted += 1;
                resp.bytes += layer.file_size_bytes();
            }
        }
        Ok::<_, ManagementError>(resp)
    })
    .await?;
    Ok(Json(resp))
}

async fn stop_wal_receiver(
    State(ps): State<Arc<Pageserver>>,
    Path((tenant, timeline)): Path<(String, String)>,
    Extension(caller): Extension<auth_layer::Caller>,
) -> Result<StatusCode, ApiError> {
    if !caller.is_admin() {
        return Err(ManagementError::Forbidden("only an admin token may stop a WAL receiver and forget its sources".into()).into());
    }
    let (tenant, timeline): (TenantId, TimelineId) = (parse("tenant id", &tenant)?, parse("timeline id", &timeline)?);
    if blocking(move || ps.stop_wal_receiver(tenant, timeline)).await? {
        Ok(StatusCode::OK)
    } else {
        Err(ApiError(ManagementError::NotFound(format!("timeline {timeline} of tenant {tenant} has no WAL receiver"))))
    }
}

async fn basebackup(
    State(ps): State<Arc<Pageserver>>,
    Path((tenant, timeline)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let (tenant, timeline) = (parse("tenant id", &tenant)?, parse("timeline id", &timeline)?);
    let query = BasebackupQuery::parse(query.as_deref().unwrap_or("")).map_err(|e| ApiError(ManagementError::BadRequest(e.to_string())))?;
    let (tar, summary) = blocking(move || ps.basebackup(tenant, timeline, query.lsn, query.standby)).await?;
    let headers = [
        (axum::http::header::CONTENT_TYPE, BASEBACKUP_CONTENT_TYPE.to_string()),
        (axum::http::header::HeaderName::from_static(LSN_HEADER_LOWERCASE), summary.lsn.to_string()),
    ];
    Ok((headers, tar).into_response())
}

fn tenant_config_info(tenant_id: TenantId, (config, effective): (TenantConfig, std::time::Duration)) -> TenantConfigInfo {
    TenantConfigInfo { tenant_id, config, effective_pitr_window: HumanDuration(effective) }
}

async fn get_tenant_config(State(ps): State<Arc<Pageserver>>, Path(tenant): Path<String>) -> Result<Json<TenantConfigInfo>, ApiError> {
    let tenant = parse("tenant id", &tenant)?;
    Ok(Json(tenant_config_info(tenant, ps.tenant_config(tenant)?)))
}

/// The storage controller's heartbeat: which tenants this pageserver holds, and how.
async fn list_locations(State(ps): State<Arc<Pageserver>>) -> Json<LocationList> {
    Json(ps.locations())
}

/// The storage controller's order for one tenant: attach with a generation, hold as
/// secondary, or detach.
async fn set_location(
    State(ps): State<Arc<Pageserver>>,
    Path(tenant): Path<String>,
    body: Bytes,
) -> Result<Json<TenantLocationState>, ApiError> {
    let tenant = parse("tenant id", &tenant)?;
    let order: LocationConfig = serde_json::from_slice(&body).map_err(|e| {
        ApiError(ManagementError::BadRequest(format!("invalid location order: {e} (e.g. {{\"mode\": \"attached\", \"generation\": 2}})")))
    })?;
    Ok(Json(blocking(move || ps.set_location(tenant, &order)).await?))
}

async fn set_tenant_config(
    State(ps): State<Arc<Pageserver>>,
    Path(tenant): Path<String>,
    body: Bytes,
) -> Result<Json<TenantConfigInfo>, ApiError> {
    let tenant = parse("tenant id", &tenant)?;
    let config: TenantConfig = json_body(&body)?;
    let set = blocking(move || ps.set_tenant_config(tenant, config)).await?;
    Ok(Json(tenant_config_info(tenant, set)))
}

async fn checkpoint(
    State(ps): State<Arc<Pageserver>>,
    Path((tenant, timeline)): Path<(String, String)>,
) -> Result<Json<CheckpointResponse>, ApiError> {
    let (tenant, timeline) = (parse("tenant id", &tenant)?, parse("timeline id", &timeline)?);
    let done = blocking(move || ps.checkpoint(tenant, timeline)).await?;
    Ok(Json(CheckpointResponse {
        disk_consistent_lsn: done.disk_consistent_lsn,
        layers_created: done.layers_created.len() as u64,
        bytes_written: done.bytes_written,
    }))
}

async fn compact(
    State(ps): State<Arc<Pageserver>>,
    Path((tenant, timeline)): Path<(String, String)>,
    body: Bytes,
) -> Result<Json<CompactResponse>, ApiError> {
    let (tenant, timeline) = (parse("tenant id", &tenant)?, parse("timeline id", &timeline)?);
    let req: CompactRequest = json_body(&body)?;
    let done = blocking(move || ps.compact(tenant, timeline, req.force_l0, req.force_image_layers)).await?;
    let (c, i) = (&done.compaction, &done.images);
    Ok(Json(CompactResponse {
        l0_layers_removed: c.l0_removed.len() as u64,
        l1_layers_created: c.l1_created.len() as u64,
        image_layers_created: i.layers_created.len() as u64,
        image_ranges: i.ranges.len() as u64,
        image_ranges_deferred: i.ranges_deferred as u64,
        image_lsn: (!i.layers_created.is_empty()).then_some(i.lsn),
        bytes_written: c.bytes_written + i.bytes_written,
    }))
}

async fn lsn_lease(
    State(ps): State<Arc<Pageserver>>,
    Path((tenant, timeline)): Path<(String, String)>,
    Extension(caller): Extension<auth_layer::Caller>,
    body: Bytes,
) -> Result<Json<LsnLeaseResponse>, ApiError> {
    let (tenant, timeline) = (parse("tenant id", &tenant)?, parse("timeline id", &timeline)?);
    let req: LsnLeaseRequest = json_body(&body)?;
    let owner = if caller.is_admin() { None } else { caller.token_fingerprint };
    let ttl = Duration::from_secs(req.ttl_secs);
    let leases = blocking(move || ps.lsn_lease(tenant, timeline, &req.holder, req.lsn, ttl, owner)).await?;
    Ok(Json(LsnLeaseResponse { leases: leases.into_iter().map(|(holder, lsn)| LsnLease { holder, lsn }).collect() }))
}

async fn gc(
    State(ps): State<Arc<Pageserver>>,
    Path((tenant, timeline)): Path<(String, String)>,
    body: Bytes,
) -> Result<Json<GcResponse>, ApiError> {
    let (tenant, timeline) = (parse("tenant id", &tenant)?, parse("timeline id", &timeline)?);
    let req: GcRequest = json_body(&body)?;
    let done = blocking(move || ps.gc(tenant, timeline, req.pitr_window.map(|w| w.0))).await?;
    Ok(Json(GcResponse {
        cutoff_lsn: done.result.cutoff,
        pitr_cutoff: lsn_by_timestamp_response(done.pitr_cutoff),
        layers_removed: done.result.layers_removed.len() as u64,
        bytes_removed: done.result.bytes_removed,
    }))
}

fn lsn_by_timestamp_response(found: LsnForTimestamp) -> LsnByTimestampResponse {
    let kind = match found {
        LsnForTimestamp::Present(_) => LsnKind::Present,
        LsnForTimestamp::Future(_) => LsnKind::Future,
        LsnForTimestamp::Past(_) => LsnKind::Past,
        LsnForTimestamp::NoData(_) => LsnKind::NoData,
    };
    LsnByTimestampResponse { kind, lsn: found.lsn() }
}

async fn lsn_by_timestamp(
    State(ps): State<Arc<Pageserver>>,
    Path((tenant, timeline)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Result<Json<LsnByTimestampResponse>, ApiError> {
    let (tenant, timeline) = (parse("tenant id", &tenant)?, parse("timeline id", &timeline)?);
    let query =
        LsnByTimestampQuery::parse(query.as_deref().unwrap_or("")).map_err(|e| ApiError(ManagementError::BadRequest(e.to_string())))?;
    let found = blocking(move || ps.lsn_by_timestamp(tenant, timeline, query.timestamp)).await?;
    Ok(Json(lsn_by_timestamp_response(found)))
}

async fn changed_blocks(
    State(ps): State<Arc<Pageserver>>,
    Path((tenant, timeline)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Result<Json<ChangedBlocksResponse>, ApiError> {
    let (tenant, timeline) = (parse("tenant id", &tenant)?, parse("timeline id", &timeline)?);
    let query =
        ChangedBlocksQuery::parse(query.as_deref().unwrap_or("")).map_err(|e| ApiError(ManagementError::BadRequest(e.to_string())))?;
    // The query allows at most `CHANGED_BLOCKS_LIMIT_MAX`, which fits any `usize` we run on.
    let limit = usize::try_from(query.limit.unwrap_or(CHANGED_BLOCKS_LIMIT_DEFAULT)).unwrap_or(usize::MAX);
    let changed = blocking(move || ps.changed_blocks(tenant, timeline, query.from, query.to, limit)).await?;
    Ok(Json(ChangedBlocksResponse {
        from: changed.from,
        to: changed.to,
        blocks: changed.blocks.iter().map(|b| ChangedBlock { rel: b.rel, blkno: b.blkno, lsn: b.lsn }).collect(),
        relations: changed.relations.iter().map(|r| ChangedRelation { rel: r.rel, nblocks: r.nblocks, lsn: r.lsn }).collect(),
        databases: changed.databases.iter().map(|d| DroppedDatabase { spcnode: d.spcnode, dbnode: d.dbnode, lsn: d.lsn }).collect(),
    }))
}

/// `pageserver_api::models::LSN_HEADER` in lower case, as `HeaderName::from_static` needs
/// it; a test checks that they agree.
const LSN_HEADER_LOWERCASE: &str = "x-fjord-lsn";

/// `GET /v1/status`: liveness, the version, and the features a client may count on.
async fn status() -> Json<StatusResponse> {
    Json(StatusResponse {
        status: "ok".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        features: pageserver_api::models::FEATURES.iter().map(|f| f.to_string()).collect(),
    })
}

/// Gauges read off the tenants at scrape time.
async fn metrics(State(ps): State<Arc<Pageserver>>) -> Result<Response, ApiError> {
    let internal = |e: prometheus::Error| ApiError(ManagementError::Internal(anyhow::anyhow!("render metrics: {e}")));
    let registry = Registry::new();
    let gauge = |name: &str, help: &str| -> Result<IntGaugeVec, ApiError> {
        let g = IntGaugeVec::new(Opts::new(name, help), &["tenant_id", "timeline_id"]).map_err(internal)?;
        registry.register(Box::new(g.clone())).map_err(internal)?;
        Ok(g)
    };
    let last = gauge("pageserver_last_record_lsn", "The LSN up to which WAL has been ingested")?;
    let disk = gauge("pageserver_disk_consistent_lsn", "The LSN up to which ingested WAL is in layer files")?;
    let layers = gauge("pageserver_layers", "Layer files of the timeline")?;
    let remote_lsn =
        gauge("pageserver_remote_consistent_lsn", "The LSN up to which ingested WAL is in layers in remote storage (with remote storage)")?;
    let remote_queue = gauge("pageserver_remote_queued_operations", "Uploads, index writes and deletions waiting or running")?;
    let remote_failing = gauge("pageserver_remote_failing", "1 while the remote operation at the head of the queue keeps failing")?;
    let remote_bytes = gauge("pageserver_remote_uploaded_bytes", "Bytes of layer files uploaded since the process started")?;
    let remote_downloads = gauge("pageserver_remote_layers_downloaded", "Evicted layers downloaded again since the process started")?;
    let resident = gauge("pageserver_resident_layer_bytes", "Bytes of layer files on local disk")?;
    let gc_cutoff = gauge("pageserver_gc_cutoff_lsn", "Reads below this LSN are refused")?;
    let depth = gauge("pageserver_delta_depth_max", "The most delta layer files a read searches above its newest image layer")?;
    let fold_queue = gauge("pageserver_fold_queue_keys", "Keys waiting for the materializer to fold their long chains of records")?;
    let fold_dropped = gauge(
        "pageserver_fold_queue_dropped_keys",
        "Keys not queued for a fold because the queue was full, since the timeline was loaded",
    )?;
    let by_kind = IntGaugeVec::new(
        Opts::new("pageserver_timeline_layers", "Layer files of the timeline by kind: l0, l1, image"),
        &["tenant_id", "timeline_id", "kind"],
    )
    .map_err(internal)?;
    registry.register(Box::new(by_kind.clone())).map_err(internal)?;
    let counter = |name: &str, help: &str, value: u64| -> Result<(), ApiError> {
        let c = prometheus::IntCounter::new(name, help).map_err(internal)?;
        c.inc_by(value);
        registry.register(Box::new(c)).map_err(internal)
    };
    let ev = &ps.eviction_stats;
    counter(
        "pageserver_eviction_runs_total",
        "Eviction runs that found the layer disk budget exceeded",
        ev.runs.load(std::sync::atomic::Ordering::Relaxed),
    )?;
    counter(
        "pageserver_evicted_layers_total",
        "Layers evicted from local disk",
        ev.layers_evicted.load(std::sync::atomic::Ordering::Relaxed),
    )?;
    counter(
        "pageserver_evicted_bytes_total",
        "Bytes of layers evicted from local disk",
        ev.bytes_evicted.load(std::sync::atomic::Ordering::Relaxed),
    )?;
    let sec = &ps.secondary_stats;
    for (name, help, value) in [
        ("pageserver_heatmaps_uploaded_total", "Heatmaps of attached tenants published for their secondaries", &sec.heatmaps_uploaded),
        ("pageserver_secondary_layers_downloaded_total", "Layers a warm secondary downloaded ahead of need", &sec.layers_downloaded),
        ("pageserver_secondary_bytes_downloaded_total", "Bytes of layers a warm secondary downloaded ahead of need", &sec.bytes_downloaded),
        ("pageserver_secondary_failures_total", "Heatmap uploads, heatmap reads and warm downloads that failed", &sec.failures),
    ] {
        counter(name, help, value.load(std::sync::atomic::Ordering::Relaxed))?;
    }
    let bb = &ps.basebackup_stats;
    counter("pageserver_basebackups_total", "Basebackups served", bb.count.load(std::sync::atomic::Ordering::Relaxed))?;
    counter("pageserver_basebackup_bytes_total", "Bytes of basebackups served", bb.bytes.load(std::sync::atomic::Ordering::Relaxed))?;
    counter(
        "pageserver_basebackup_microseconds_total",
        "Time spent generating basebackups",
        bb.micros.load(std::sync::atomic::Ordering::Relaxed),
    )?;
    for id in ps.tenants.ids() {
        let Some(tenant) = ps.tenants.get(id) else { continue };
        for t in tenant.timelines() {
            let labels = [id.to_string(), t.timeline_id().to_string()];
            let labels = [labels[0].as_str(), labels[1].as_str()];
            last.with_label_values(&labels).set(i64::try_from(t.last_record_lsn().0).unwrap_or(i64::MAX));
            disk.with_label_values(&labels).set(i64::try_from(t.disk_consistent_lsn().0).unwrap_or(i64::MAX));
            resident.with_label_values(&labels).set(i64::try_from(t.resident_layer_bytes()).unwrap_or(i64::MAX));
            fold_queue.with_label_values(&labels).set(i64::try_from(t.long_chains_len()).unwrap_or(i64::MAX));
            fold_dropped.with_label_values(&labels).set(i64::try_from(t.long_chains_dropped()).unwrap_or(i64::MAX));
            if let Some(r) = t.remote_status() {
                let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
                remote_lsn.with_label_values(&labels).set(n(r.remote_consistent_lsn.0));
                remote_queue.with_label_values(&labels).set(n(r.queued_operations as u64));
                remote_failing.with_label_values(&labels).set(i64::from(r.failing_since_unix_s.is_some()));
                remote_bytes.with_label_values(&labels).set(n(r.bytes_uploaded));
                remote_downloads.with_label_values(&labels).set(n(r.layers_downloaded));
            }
            let descs = t.layers();
            layers.with_label_values(&labels).set(i64::try_from(descs.len()).unwrap_or(i64::MAX));
            gc_cutoff.with_label_values(&labels).set(i64::try_from(t.gc_cutoff_lsn().0).unwrap_or(i64::MAX));
            depth.with_label_values(&labels).set(i64::try_from(t.delta_depth(&proto::KeyRange::ALL)).unwrap_or(i64::MAX));
            let files = descs.iter().filter(|d| t.layer_file_size_bytes(d).is_some());
            let (mut l0, mut l1, mut image) = (0, 0, 0);
            for d in files {
                match d.kind {
                    layerstore::LayerKind::Image => image += 1,
                    _ if d.is_l0() => l0 += 1,
                    _ => l1 += 1,
                }
            }
            for (kind, n) in [("l0", l0), ("l1", l1), ("image", image)] {
                by_kind.with_label_values(&[labels[0], labels[1], kind]).set(n);
            }
        }
    }
    let mut families = registry.gather();
    families.extend(ps.metrics.gather());
    let mut out = Vec::new();
    TextEncoder::new().encode(&families, &mut out).map_err(internal)?;
    // When the TLS certificate expires (it is reloaded when its files change).
    if let Some(tls) = &ps.conf.tls.server {
        out.extend_from_slice(tls.metrics_text().as_bytes());
    }
    Ok(([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response())
}

#[cfg(test)]
mod tests;
