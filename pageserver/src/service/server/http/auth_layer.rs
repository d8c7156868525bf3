//! The management API's token checks (with `auth_public_key_path` set): route layers that
//! let a request through, or answer it 401 or 403 (see `http.rs` for which routes take
//! which token). A request let through carries its token's claims as a request extension
//! ([`Caller`]) for the handlers whose answer depends on who asks.

use std::sync::Arc;

use axum::extract::{RawPathParams, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use pageserver_api::models::ErrorResponse;
use proto::{TenantId, TimelineId};

use super::super::Pageserver;

/// Who a request let through comes from: the token's claims (`None` with authentication
/// off: then anyone may do anything, as an admin may) and a fingerprint of the token itself,
/// which tells two holders of tokens with the same claims apart (an LSN lease's owner).
#[derive(Clone, Debug)]
pub(super) struct Caller {
    pub claims: Option<auth::Claims>,
    pub token_fingerprint: Option<u64>,
}

impl Caller {
    /// An admin token, or authentication off.
    pub fn is_admin(&self) -> bool {
        self.claims.as_ref().is_none_or(|c| c.scope == auth::Scope::Admin)
    }
}

/// A keyed hash of a token: the same token gives the same value for the life of the
/// process, and no client can predict it (the key is random per process), so none can make
/// another token collide with it.
fn fingerprint(token: &str) -> u64 {
    use std::hash::BuildHasher;
    static KEY: std::sync::OnceLock<std::collections::hash_map::RandomState> = std::sync::OnceLock::new();
    KEY.get_or_init(std::collections::hash_map::RandomState::new).hash_one(token)
}

pub(super) async fn management(State(ps): State<Arc<Pageserver>>, req: Request, next: Next) -> Response {
    check(&ps, req, next, auth::Access::Management).await
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
    check(&ps, req, next, access).await
}

async fn check(ps: &Pageserver, mut req: Request, next: Next, access: auth::Access) -> Response {
    match authorize(ps, &req, access) {
        Ok(caller) => {
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        Err(refusal) => *refusal,
    }
}

/// Who sent a request whose `Authorization: Bearer` token grants `access` (anyone when
/// authentication is off), or the answer to one whose token does not: logged, counted, and
/// 401 (no valid token) or 403 (a valid token that does not grant it).
fn authorize(ps: &Pageserver, req: &Request, access: auth::Access) -> Result<Caller, Box<Response>> {
    let Some(verifier) = ps.auth.as_ref() else { return Ok(Caller { claims: None, token_fingerprint: None }) };
    let token = match req.headers().get(header::AUTHORIZATION) {
        None => Ok(None),
        Some(value) => value
            .to_str()
            .map_err(|_| auth::AuthError::Malformed("the Authorization header is not ASCII".into()))
            .and_then(auth::bearer)
            .map(Some),
    };
    let e = match token.and_then(|token| verifier.authorize(token, access).map(|claims| (claims, token))) {
        Ok((claims, token)) => return Ok(Caller { claims: Some(claims), token_fingerprint: token.map(fingerprint) }),
        Err(e) => e,
    };
    ps.metrics.auth_refused("http", e.reason());
    tracing::warn!(method = %req.method(), path = req.uri().path(), reason = e.reason(), "management API refused a request: {e}");
    let forbidden = !e.is_unauthenticated();
    let status = if forbidden { StatusCode::FORBIDDEN } else { StatusCode::UNAUTHORIZED };
    let mut resp = (status, Json(ErrorResponse { error: e.to_string() })).into_response();
    if !forbidden {
        resp.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
    }
    Err(Box::new(resp))
}
