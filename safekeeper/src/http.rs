//! The HTTP API: `GET /v1/status`, `GET /v1/tenant/{tenant_id}/timeline/{timeline_id}`,
//! `POST /v1/tenant/{tenant_id}/timeline/{timeline_id}` (create it, as a voter: the
//! control plane's call when it creates a timeline; body `{"system_id": N,
//! "wal_segment_size": N}`, the size 16 MiB if left out), `GET /metrics`. Errors are JSON `{"error": "..."}` with a status code chosen in one place
//! ([`ApiError`]).
//!
//! With authentication on, every request but those to [`OPEN_PATHS`] needs
//! `Authorization: Bearer <token>` with a token that grants `Access::Management` (an admin
//! token): 401 without a valid token (none, malformed, another key's, expired), 403 when a
//! valid token does not grant it. The check is one layer over the whole router
//! ([`require_management`]), so a route added later is not open by accident.
//!
//! With TLS (`--tls-cert`), the API is https only, `/v1/status` and `/metrics` included: a
//! plaintext request gets a 400 whose body says https is required ([`tls::http`]).

use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use proto::{TenantId, TimelineId};
use serde::Deserialize;
use serde_json::json;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;

use crate::{Safekeeper, TimelineEntry};

/// What anyone may read, with authentication on or off: the node's liveness and the
/// metrics (what monitoring scrapes; they name tenants and timelines, but no data).
pub const OPEN_PATHS: [&str; 2] = ["/metrics", "/v1/status"];

/// An error as the API reports it.
pub enum ApiError {
    BadRequest(String),
    /// No valid token: answered with `WWW-Authenticate: Bearer`.
    Unauthorized(String),
    /// A valid token that does not grant the request.
    Forbidden(String),
    NotFound(String),
    Conflict(String),
    Internal(String),
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
            ApiError::Internal(m) => (StatusCode::INTERNAL_SERVER_ERROR, m),
        };
        (code, Json(json!({ "error": msg }))).into_response()
    }
}

pub fn router(sk: Arc<Safekeeper>) -> Router {
    Router::new()
        .route("/v1/status", get(status))
        .route("/v1/tenant/{tenant_id}/timeline/{timeline_id}", get(timeline_status).post(timeline_create))
        .route("/metrics", get(metrics))
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .layer(axum::middleware::from_fn_with_state(sk.clone(), require_management))
        .with_state(sk)
}

/// Serves the API on `listener`: https only when the safekeeper has TLS (a plaintext
/// request gets a 400 saying so), else plain HTTP. Handlers see the peer's address (for the
/// log line of a refused request) as `ConnectInfo`.
pub async fn serve(listener: TcpListener, sk: Arc<Safekeeper>) -> anyhow::Result<()> {
    let metrics = Arc::clone(&sk.metrics);
    let https = sk.config.tls.as_ref().map(|tls| tls::http::Https {
        config: tls.config(),
        on_refusal: Arc::new(move |reason: &'static str| metrics.http_tls_failures.with_label_values(&[reason]).inc()),
    });
    tls::http::serve(listener, router(sk), https, std::future::pending()).await;
    Ok(())
}

/// With authentication on, lets a request through only with an admin token, or to one of
/// the [`OPEN_PATHS`]. A refusal is logged and counted by the check.
async fn require_management(State(sk): State<Arc<Safekeeper>>, req: Request, next: Next) -> Response {
    let Some(auth) = &sk.auth else { return next.run(req).await };
    if OPEN_PATHS.contains(&req.uri().path()) {
        return next.run(req).await;
    }
    let peer = req.extensions().get::<ConnectInfo<SocketAddr>>().map_or_else(|| "unknown".to_string(), |c| c.0.to_string());
    let request = format!("{} {}", req.method(), req.uri().path());
    let access = auth::Access::Management;
    let token = match req.headers().get(header::AUTHORIZATION).map(|v| v.to_str()) {
        None => None,
        Some(Ok(value)) => match auth::bearer(value) {
            Ok(token) => Some(token),
            Err(e) => {
                auth.refused(&e, access, &peer, &request);
                return ApiError::from(e).into_response();
            }
        },
        Some(Err(_)) => {
            let e = auth::AuthError::Malformed("the Authorization header is not ASCII".into());
            auth.refused(&e, access, &peer, &request);
            return ApiError::from(e).into_response();
        }
    };
    match auth.check(token, access, &peer, &request) {
        Ok(_) => next.run(req).await,
        Err(e) => ApiError::from(e).into_response(),
    }
}

async fn status(State(sk): State<Arc<Safekeeper>>) -> Json<serde_json::Value> {
    let timelines = sk.timelines();
    let unavailable = timelines.iter().filter(|(_, e)| matches!(e, TimelineEntry::Unavailable(_))).count();
    Json(json!({
        "node_id": sk.node_id,
        "version": env!("CARGO_PKG_VERSION"),
        "timelines": timelines.len(),
        "timelines_unavailable": unavailable,
    }))
}

async fn timeline_status(
    State(sk): State<Arc<Safekeeper>>,
    Path((tenant, timeline)): Path<(String, String)>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let tenant: TenantId = tenant.parse().map_err(|e| ApiError::BadRequest(format!("{e}")))?;
    let timeline: TimelineId = timeline.parse().map_err(|e| ApiError::BadRequest(format!("{e}")))?;
    let entry = sk.timelines().into_iter().find(|(k, _)| *k == (tenant, timeline)).map(|(_, e)| e);
    match entry {
        None => Err(ApiError::NotFound(format!("timeline {tenant}/{timeline} does not exist on this safekeeper"))),
        Some(TimelineEntry::Unavailable(reason)) => Ok(Json(json!({
            "tenant_id": tenant.to_string(),
            "timeline_id": timeline.to_string(),
            "state": "corrupt",
            "error": reason,
        }))),
        Some(TimelineEntry::Ok(tl)) => {
            let tl2 = tl.clone();
            let st = tokio::task::spawn_blocking(move || tl2.status()).await.map_err(|e| ApiError::Internal(e.to_string()))?;
            serde_json::to_value(st).map(Json).map_err(|e| ApiError::Internal(e.to_string()))
        }
    }
}

/// The body of a timeline creation.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateTimeline {
    system_id: u64,
    #[serde(default = "default_segment_size")]
    wal_segment_size: u32,
}

fn default_segment_size() -> u32 {
    16 << 20
}

async fn timeline_create(
    State(sk): State<Arc<Safekeeper>>,
    Path((tenant, timeline)): Path<(String, String)>,
    body: Result<Json<CreateTimeline>, axum::extract::rejection::JsonRejection>,
) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    let tenant: TenantId = tenant.parse().map_err(|e| ApiError::BadRequest(format!("{e}")))?;
    let timeline: TimelineId = timeline.parse().map_err(|e| ApiError::BadRequest(format!("{e}")))?;
    let Json(req) = body.map_err(|e| ApiError::BadRequest(format!("bad timeline creation request: {}", e.body_text())))?;
    if !crate::valid_segment_size(req.wal_segment_size) {
        return Err(ApiError::BadRequest(format!(
            "WAL segment size {} is not a power of two between 1 MiB and 1 GiB",
            req.wal_segment_size
        )));
    }
    let sk2 = sk.clone();
    let created = tokio::task::spawn_blocking(move || sk2.create_timeline(tenant, timeline, req.system_id, req.wal_segment_size))
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?
        .map_err(ApiError::Conflict)?;
    let code = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((code, Json(json!({ "tenant_id": tenant.to_string(), "timeline_id": timeline.to_string(), "created": created }))))
}

async fn metrics(State(sk): State<Arc<Safekeeper>>) -> Result<String, ApiError> {
    let mut text = sk.metrics.render().map_err(|e| ApiError::Internal(format!("could not render metrics: {e:#}")))?;
    // When the TLS certificate expires (it is reloaded when its files change).
    if let Some(tls) = &sk.config.tls {
        text.push_str(&tls.metrics_text());
    }
    Ok(text)
}
