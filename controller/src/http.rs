//! The HTTP API. Open: `GET /v1/status`, `GET /metrics`, `GET /v1/openapi.json` (the API described, [`ApiDoc`]). With authentication on, the token
//! a route wants ([`access`]): a pageserver's own token (storage, naming its node id; or an
//! admin's) joins as that node with `POST /v1/node` and asks what it holds with
//! `POST /v1/re-attach`; any token for a tenant
//! reads `GET /v1/tenant/{tenant_id}`; the rest (`GET /v1/node`, `GET|POST /v1/tenant`,
//! `POST /v1/tenant/{tenant_id}/migrate`) wants an admin token. Reads are answered by any controller from the database;
//! changes only by the leader (another answers 503 and names the leader). Errors are JSON
//! `{"error": "..."}` with a status code chosen in one place ([`ApiError`]).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use proto::TenantId;
use serde_json::json;

use crate::heartbeat::candidates;
use crate::models::{
    Availability, MigrateRequest, NodeInfo, NodeLocation, NodeRegisterRequest, ReAttachRequest, ReAttachResponse, StatusResponse,
    TenantCreateRequest, TenantLocation,
};
use crate::persistence::{DbError, MigrationStart};
use crate::{scheduler, Controller};

/// What anyone may read: liveness, leadership, the metrics and the API's description.
pub const OPEN_PATHS: [&str; 3] = ["/metrics", "/v1/status", "/v1/openapi.json"];

/// The API's OpenAPI 3 document, from the handlers' annotations and the types of
/// `pageserver_api::controller` (`GET /v1/openapi.json`).
#[derive(utoipa::OpenApi)]
#[openapi(
    info(title = "fjord storage controller", description = "Placement of tenants on pageservers, their generations, failover and planned migration."),
    paths(status, metrics, list_nodes, register_node, list_tenants, create_tenant, get_tenant, migrate_tenant, re_attach),
    components(schemas(ErrorBody)),
    modifiers(&BearerToken)
)]
pub struct ApiDoc;

/// The `bearer` scheme the routes name: an EdDSA JWT signed with the cluster's key.
struct BearerToken;

impl utoipa::Modify for BearerToken {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let scheme = HttpBuilder::new().scheme(HttpAuthScheme::Bearer).bearer_format("JWT").build();
        openapi.components.get_or_insert_with(Default::default).add_security_scheme("bearer", SecurityScheme::Http(scheme));
    }
}

/// Every error's body.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: String,
}

pub enum ApiError {
    BadRequest(String),
    Unauthorized(String),
    Forbidden(String),
    NotFound(String),
    Conflict(String),
    /// Not the leader, or the database is unreachable: retry (elsewhere).
    Unavailable(String),
}

impl From<auth::AuthError> for ApiError {
    fn from(e: auth::AuthError) -> ApiError {
        if e.is_unauthenticated() {
            ApiError::Unauthorized(e.to_string())
        } else {
            ApiError::Forbidden(e.to_string())
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(e: JsonRejection) -> ApiError {
        ApiError::BadRequest(e.body_text())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (code, msg) = match self {
            ApiError::BadRequest(m) => (StatusCode::BAD_REQUEST, m),
            ApiError::Unauthorized(m) => {
                return (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer")], Json(json!({ "error": m }))).into_response()
            }
            ApiError::Forbidden(m) => (StatusCode::FORBIDDEN, m),
            ApiError::NotFound(m) => (StatusCode::NOT_FOUND, m),
            ApiError::Conflict(m) => (StatusCode::CONFLICT, m),
            ApiError::Unavailable(m) => (StatusCode::SERVICE_UNAVAILABLE, m),
        };
        (code, Json(json!({ "error": msg }))).into_response()
    }
}

/// The answer to a change asked of a controller that does not lead: who does, as this
/// instance last saw the lease (no database round trip).
fn not_leader(ctl: &Controller) -> ApiError {
    let view = ctl.lease_view.lock().expect("not poisoned").clone();
    match view.leader_address {
        Some(addr) if addr != ctl.config.advertise => {
            ApiError::Unavailable(format!("this controller does not lead: ask the leader at {addr}"))
        }
        _ if view.database != "ok" => {
            ApiError::Unavailable(format!("no controller leads that this one knows of; its database: {}", view.database))
        }
        _ => ApiError::Unavailable("no controller leads at the moment: retry shortly".into()),
    }
}

fn db_error(ctl: &Controller, e: DbError) -> ApiError {
    match e {
        DbError::NotLeader => not_leader(ctl),
        DbError::Postgres(_) | DbError::Timeout(_) => {
            ctl.metrics.database_errors.inc();
            ApiError::Unavailable(e.to_string())
        }
        DbError::NoNodeOnline | DbError::SchemaChanged(_) => ApiError::Unavailable(e.to_string()),
        DbError::Refused(m) => ApiError::Conflict(m),
    }
}

pub fn router(ctl: Arc<Controller>) -> Router {
    Router::new()
        .route("/v1/status", get(status))
        .route("/v1/openapi.json", get(openapi))
        .route("/metrics", get(metrics))
        .route("/v1/node", get(list_nodes).post(register_node))
        .route("/v1/tenant", get(list_tenants).post(create_tenant))
        .route("/v1/tenant/{tenant_id}", get(get_tenant))
        .route("/v1/tenant/{tenant_id}/migrate", axum::routing::post(migrate_tenant))
        .route("/v1/re-attach", axum::routing::post(re_attach))
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .layer(axum::middleware::from_fn_with_state(ctl.clone(), require_token))
        .with_state(ctl)
}

/// What a request's token must grant. A pageserver joining names its node in the body;
/// the token must be that node's ([`require_token`] reads the body for these two routes).
fn access(method: &axum::http::Method, path: &str, node: Option<u64>) -> auth::Access {
    if method == axum::http::Method::POST && matches!(path, "/v1/node" | "/v1/re-attach") {
        // A body without a node id is refused by its handler; no token grants it here.
        return auth::Access::Placement { node: node.unwrap_or(u64::MAX) };
    }
    if method == axum::http::Method::GET {
        if let Some(tenant) = path.strip_prefix("/v1/tenant/").and_then(|t| t.parse::<TenantId>().ok()) {
            return auth::Access::Locate { tenant };
        }
    }
    auth::Access::Management
}

/// With authentication on, lets a request through only with a token that grants its
/// [`access`], or to one of the [`OPEN_PATHS`]; a refusal is logged with the peer and the
/// request.
async fn require_token(State(ctl): State<Arc<Controller>>, req: Request, next: Next) -> Response {
    let Some(verifier) = &ctl.auth else { return next.run(req).await };
    if OPEN_PATHS.contains(&req.uri().path()) {
        return next.run(req).await;
    }
    let peer = req.extensions().get::<ConnectInfo<SocketAddr>>().map_or_else(|| "unknown".to_string(), |c| c.0.to_string());
    let token = match req.headers().get(header::AUTHORIZATION).map(|v| v.to_str()) {
        None => Ok(None),
        Some(Ok(value)) => auth::bearer(value).map(|t| Some(t.to_string())),
        Some(Err(_)) => Err(auth::AuthError::Malformed("the Authorization header is not ASCII".into())),
    };
    // The joining routes name the node in their (small) body: read it to check the token
    // against it, then hand the bytes on.
    let (req, node) = if req.method() == axum::http::Method::POST && matches!(req.uri().path(), "/v1/node" | "/v1/re-attach") {
        let (parts, body) = req.into_parts();
        let bytes = match axum::body::to_bytes(body, 64 * 1024).await {
            Ok(b) => b,
            Err(e) => return ApiError::BadRequest(format!("could not read the request body: {e}")).into_response(),
        };
        let node = serde_json::from_slice::<serde_json::Value>(&bytes).ok().and_then(|v| v.get("node_id").and_then(|n| n.as_u64()));
        (Request::from_parts(parts, axum::body::Body::from(bytes)), node)
    } else {
        (req, None)
    };
    match token.and_then(|t| verifier.authorize(t.as_deref(), access(req.method(), req.uri().path(), node))) {
        Ok(_) => next.run(req).await,
        Err(e) => {
            tracing::warn!("refused {} {} from {peer}: {e}", req.method(), req.uri().path());
            ApiError::from(e).into_response()
        }
    }
}

async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(<ApiDoc as utoipa::OpenApi>::openapi())
}

/// This controller, whether it leads, and who does.
#[utoipa::path(get, path = "/v1/status", responses((status = 200, body = StatusResponse)))]
async fn status(State(ctl): State<Arc<Controller>>) -> Json<StatusResponse> {
    let view = ctl.lease_view.lock().expect("not poisoned").clone();
    Json(StatusResponse {
        instance: ctl.instance.clone(),
        version: env!("CARGO_PKG_VERSION").into(),
        leader: ctl.is_leader(),
        leader_address: view.leader_address,
        database: view.database,
    })
}

/// Prometheus metrics (text format).
#[utoipa::path(get, path = "/metrics", responses((status = 200, body = String, content_type = "text/plain")))]
async fn metrics(State(ctl): State<Arc<Controller>>) -> String {
    ctl.metrics.render()
}

/// Every pageserver: addresses, availability as the leader sees it, and its load.
#[utoipa::path(get, path = "/v1/node", security(("bearer" = [])),
    responses((status = 200, body = Vec<NodeInfo>), (status = 503, body = ErrorBody)))]
async fn list_nodes(State(ctl): State<Arc<Controller>>) -> Result<Json<Vec<NodeInfo>>, ApiError> {
    let rows = match ctl.read_db.nodes().await {
        Ok(rows) => rows,
        Err(e) => return Err(db_error(&ctl, e)),
    };
    Ok(Json(
        rows.into_iter()
            .map(|r| NodeInfo {
                availability: ctl.availability(r.node.node_id),
                node_id: r.node.node_id,
                http_addr: r.node.http_addr,
                page_addr: r.node.page_addr,
                attached: r.attached,
                secondaries: r.secondaries,
            })
            .collect(),
    ))
}

/// `host:port` with a port above 0 and a host of letters, digits, `.`, `-` and `_`, or a
/// bracketed IPv6 address: nothing else reaches a log line or a URL.
fn check_addr(what: &str, addr: &str) -> Result<(), ApiError> {
    let bad = || ApiError::BadRequest(format!("{what} {addr:?} is not host:port"));
    let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
    if !port.parse::<u16>().is_ok_and(|p| p != 0) {
        return Err(bad());
    }
    let ok_host = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => !host.is_empty() && host.len() <= 253 && host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')),
    };
    if !ok_host {
        return Err(bad());
    }
    Ok(())
}

/// A pageserver joins (or changes its addresses): its own token, naming the node, or an admin's.
#[utoipa::path(post, path = "/v1/node", request_body = NodeRegisterRequest, security(("bearer" = [])),
    responses((status = 200, body = NodeLocation), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody),
              (status = 503, body = ErrorBody)))]
async fn register_node(
    State(ctl): State<Arc<Controller>>,
    body: Result<Json<NodeRegisterRequest>, JsonRejection>,
) -> Result<Json<NodeLocation>, ApiError> {
    let Json(req) = body?;
    if req.node_id > i64::MAX as u64 {
        return Err(ApiError::BadRequest(format!("node_id {} is above {}", req.node_id, i64::MAX)));
    }
    check_addr("http_addr", &req.http_addr)?;
    check_addr("page_addr", &req.page_addr)?;
    if req.http_addr == req.page_addr {
        return Err(ApiError::BadRequest("http_addr and page_addr are the same address".into()));
    }
    if !ctl.is_leader() {
        return Err(not_leader(&ctl));
    }
    match ctl.db.register_node(&ctl.instance, &req).await {
        Ok(moved) => {
            if moved {
                // Whatever was seen at the old addresses says nothing of the new ones.
                ctl.health.lock().expect("not poisoned").remove(&req.node_id);
            }
            tracing::info!("pageserver {} registered: http {}, page service {}", req.node_id, req.http_addr, req.page_addr);
            Ok(Json(NodeLocation { node_id: req.node_id, http_addr: req.http_addr, page_addr: req.page_addr }))
        }
        Err(e) => Err(db_error(&ctl, e)),
    }
}

/// Where every tenant is.
#[utoipa::path(get, path = "/v1/tenant", security(("bearer" = [])),
    responses((status = 200, body = Vec<TenantLocation>), (status = 503, body = ErrorBody)))]
async fn list_tenants(State(ctl): State<Arc<Controller>>) -> Result<Json<Vec<TenantLocation>>, ApiError> {
    match ctl.read_db.tenants().await {
        Ok(t) => Ok(Json(t)),
        Err(e) => Err(db_error(&ctl, e)),
    }
}

/// Places a new tenant: an attached pageserver, a secondary when another is online, generation 1.
#[utoipa::path(post, path = "/v1/tenant", request_body = TenantCreateRequest, security(("bearer" = [])),
    responses((status = 201, body = TenantLocation), (status = 409, body = ErrorBody), (status = 503, body = ErrorBody)))]
async fn create_tenant(
    State(ctl): State<Arc<Controller>>,
    body: Result<Json<TenantCreateRequest>, JsonRejection>,
) -> Result<(StatusCode, Json<TenantLocation>), ApiError> {
    let Json(req) = body?;
    if !ctl.is_leader() {
        return Err(not_leader(&ctl));
    }
    let seen = ctl.availability_snapshot();
    let choose = |loads: &[crate::persistence::NodeRow]| scheduler::place(&candidates(&seen, loads)).ok_or(DbError::NoNodeOnline);
    match ctl.db.create_tenant(&ctl.instance, req.tenant_id, choose).await {
        Ok(location) => {
            tracing::info!(
                "tenant {} placed on pageserver {} (secondary: {}), generation {}",
                location.tenant_id,
                location.attached.node_id,
                location.secondary.as_ref().map_or("none".to_string(), |s| s.node_id.to_string()),
                location.generation
            );
            Ok((StatusCode::CREATED, Json(location)))
        }
        Err(e) => Err(db_error(&ctl, e)),
    }
}

/// Where a tenant is: any token for the tenant (a compute's) may ask.
#[utoipa::path(get, path = "/v1/tenant/{tenant_id}", params(("tenant_id" = String, Path, description = "32 hex digits")),
    security(("bearer" = [])),
    responses((status = 200, body = TenantLocation), (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)))]
async fn get_tenant(State(ctl): State<Arc<Controller>>, Path(tenant): Path<String>) -> Result<Json<TenantLocation>, ApiError> {
    let tenant: TenantId = tenant.parse().map_err(|e| ApiError::BadRequest(format!("tenant id {tenant:?}: {e}")))?;
    match ctl.read_db.tenant(tenant).await {
        Ok(Some(t)) => Ok(Json(t)),
        Ok(None) => Err(ApiError::NotFound(format!("tenant {tenant} is not placed"))),
        Err(e) => Err(db_error(&ctl, e)),
    }
}

/// A planned migration: 202 with the tenant's location when it starts (it goes on in the
/// heartbeat rounds, [`crate::migration`]; `GET /v1/tenant/{id}` shows it until it ends),
/// 200 if the tenant is attached there already. The destination must be online now.
#[utoipa::path(post, path = "/v1/tenant/{tenant_id}/migrate", params(("tenant_id" = String, Path, description = "32 hex digits")),
    request_body = MigrateRequest, security(("bearer" = [])),
    responses((status = 202, description = "started", body = TenantLocation), (status = 200, description = "already there", body = TenantLocation),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 503, body = ErrorBody)))]
async fn migrate_tenant(
    State(ctl): State<Arc<Controller>>,
    Path(tenant): Path<String>,
    body: Result<Json<MigrateRequest>, JsonRejection>,
) -> Result<(StatusCode, Json<TenantLocation>), ApiError> {
    let tenant: TenantId = tenant.parse().map_err(|e| ApiError::BadRequest(format!("tenant id {tenant:?}: {e}")))?;
    let Json(req) = body?;
    if !ctl.is_leader() {
        return Err(not_leader(&ctl));
    }
    match ctl.availability(req.node_id) {
        Availability::Online => {}
        other => {
            return Err(ApiError::Conflict(format!(
                "pageserver {} is not online (the leader sees it {}): a tenant moves only to a live pageserver",
                req.node_id,
                crate::heartbeat::availability_label(other)
            )))
        }
    }
    match ctl.db.start_migration(&ctl.instance, tenant, req.node_id).await {
        Ok(Some(MigrationStart::Started(location))) => {
            ctl.metrics.migrations.with_label_values(&["started"]).inc();
            tracing::info!(
                "tenant {tenant}: migration from pageserver {} to pageserver {} started with generation {}",
                location.migration.as_ref().map_or(0, |m| m.from.node_id),
                location.attached.node_id,
                location.generation
            );
            Ok((StatusCode::ACCEPTED, Json(location)))
        }
        Ok(Some(MigrationStart::AlreadyThere(location))) => Ok((StatusCode::OK, Json(location))),
        Ok(None) => Err(ApiError::NotFound(format!("tenant {tenant} is not placed"))),
        Err(e) => Err(db_error(&ctl, e)),
    }
}

/// A starting pageserver's question: what it holds. Its attached tenants' generations are
/// raised (fenced, like every change), so only the leader answers.
#[utoipa::path(post, path = "/v1/re-attach", request_body = ReAttachRequest, security(("bearer" = [])),
    responses((status = 200, body = ReAttachResponse), (status = 409, body = ErrorBody), (status = 503, body = ErrorBody)))]
async fn re_attach(
    State(ctl): State<Arc<Controller>>,
    body: Result<Json<ReAttachRequest>, JsonRejection>,
) -> Result<Json<ReAttachResponse>, ApiError> {
    let Json(req) = body?;
    if !ctl.is_leader() {
        return Err(not_leader(&ctl));
    }
    match ctl.db.re_attach(&ctl.instance, req.node_id).await {
        Ok(tenants) => {
            tracing::info!(
                "pageserver {} re-attached: {} tenants attached (generations raised), {} as secondary",
                req.node_id,
                tenants.iter().filter(|t| t.mode == pageserver_api::models::LocationMode::Attached).count(),
                tenants.iter().filter(|t| t.mode == pageserver_api::models::LocationMode::Secondary).count()
            );
            Ok(Json(ReAttachResponse { tenants }))
        }
        Err(e) => Err(db_error(&ctl, e)),
    }
}

/// Serves the API: https only with TLS (a plaintext request gets a 400 saying so).
pub async fn serve(
    listener: tokio::net::TcpListener,
    ctl: Arc<Controller>,
    server_tls: Option<&tls::ServerTls>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let ctl2 = Arc::clone(&ctl);
    let https = server_tls.map(|t| tls::http::Https {
        config: t.config(),
        on_refusal: Arc::new(move |reason: &'static str| ctl2.metrics.http_tls_failures.with_label_values(&[reason]).inc()),
    });
    tls::http::serve(listener, router(ctl), https, shutdown).await;
}
