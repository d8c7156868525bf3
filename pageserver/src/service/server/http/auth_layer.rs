//! The management API's token checks (with `auth_public_key_path` set): route layers that
//! let a request through, or answer it 401 or 403 (see `http.rs` for which routes take
//! which token).

use std::sync::Arc;

use axum::extract::{RawPathParams, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use pageserver_api::models::ErrorResponse;
use proto::{TenantId, TimelineId};

use super::super::Pageserver;

pub(super) async fn management(State(ps): State<Arc<Pageserver>>, req: Request, next: Next) -> Response {
    match refusal(&ps, &req, auth::Access::Management) {
        None => next.run(req).await,
        Some(refusal) => refusal,
    }
}

pub(super) async fn compute(State(ps): State<Arc<Pageserver>>, params: RawPathParams, req: Request, next: Next) -> Response {
    let param = |name: &str| params.iter().find(|(k, _)| *k == name).map(|(_, v)| v);
    // A path whose ids do not parse is answered by its handler (400), for an admin only.
    let tenant = param("tenant").and_then(|v| v.parse::<TenantId>().ok());
    let timeline = param("timeline").and_then(|v| v.parse::<TimelineId>().ok());
    let access = match (tenant, timeline) {
        (Some(tenant), Some(timeline)) => auth::Access::Compute { tenant, timeline: Some(timeline) },
        _ => auth::Access::Management,
    };
    match refusal(&ps, &req, access) {
        None => next.run(req).await,
        Some(refusal) => refusal,
    }
}

/// The answer to a request whose `Authorization: Bearer` token does not grant `access`
/// (`None`: it does, or authentication is off): logged, counted, and 401 (no valid token)
/// or 403 (a valid token that does not grant it).
fn refusal(ps: &Pageserver, req: &Request, access: auth::Access) -> Option<Response> {
    let verifier = ps.auth.as_ref()?;
    let token = match req.headers().get(header::AUTHORIZATION) {
        None => Ok(None),
        Some(value) => value
            .to_str()
            .map_err(|_| auth::AuthError::Malformed("the Authorization header is not ASCII".into()))
            .and_then(auth::bearer)
            .map(Some),
    };
    let e = token.and_then(|token| verifier.authorize(token, access)).err()?;
    ps.metrics.auth_refused("http", e.reason());
    tracing::warn!(method = %req.method(), path = req.uri().path(), reason = e.reason(), "management API refused a request: {e}");
    let forbidden = !e.is_unauthenticated();
    let status = if forbidden { StatusCode::FORBIDDEN } else { StatusCode::UNAUTHORIZED };
    let mut resp = (status, Json(ErrorResponse { error: e.to_string() })).into_response();
    if !forbidden {
        resp.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
    }
    Some(resp)
}
