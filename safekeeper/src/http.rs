//! The HTTP API: `GET /v1/status`, `GET /v1/tenant/{tenant_id}/timeline/{timeline_id}`,
//! `POST /v1/tenant/{tenant_id}/timeline/{timeline_id}` (create it, as a voter: the
//! control plane's call when it creates a timeline; body `{"system_id": N,
//! "wal_segment_size": N}`, the size 16 MiB if left out), `GET /metrics`. Errors are JSON `{"error": "..."}` with a status code chosen in one place
//! ([`ApiError`]).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use proto::{TenantId, TimelineId};
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;
use tokio::net::TcpListener;

use crate::{Safekeeper, TimelineEntry};

/// An error as the API reports it.
pub enum ApiError {
    BadRequest(String),
    NotFound(String),
    Conflict(String),
    Internal(String),
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (code, msg) = match self {
            ApiError::BadRequest(m) => (StatusCode::BAD_REQUEST, m),
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
        .with_state(sk)
}

pub async fn serve(listener: TcpListener, sk: Arc<Safekeeper>) -> anyhow::Result<()> {
    axum::serve(listener, router(sk)).await?;
    Ok(())
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
    sk.metrics.render().map_err(|e| ApiError::Internal(format!("could not render metrics: {e:#}")))
}
