//! One blocking client of the management API, shared by the `fjord` CLI and compute_ctl.
//!
//! Both are synchronous programs that make a handful of requests, so the client is blocking
//! (ureq) rather than async. Each method is one route: it encodes the request model, checks
//! the status and decodes the response model. Its [`Error`] tells the things a caller acts
//! on differently apart: nothing answered ([`Error::Unreachable`]: start the pageserver,
//! retry), TLS failed ([`Error::Tls`]: a certificate or CA to fix, which no retry mends),
//! the pageserver refused with its own message ([`Error::Status`]: show it), and an answer
//! this client cannot read ([`Error::Malformed`]: a version mismatch or a bug).
//!
//! With [`ClientConfig::tls`] (the cluster CA), an `https://` pageserver's certificate must
//! be signed by that CA, the only root trusted (never the system's), and name the host or
//! address of the URL; an `http://` URL is refused before anything is sent. [`agent`] makes a ureq agent configured the same way, for the CLI's
//! calls to the safekeepers' APIs, and [`tls_failure`] words its TLS errors.
//!
//! Invariant: a body from the network is never unwrapped; every failure to read or decode
//! it is an [`Error::Malformed`] naming the route.

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use proto::{Lsn, TenantId, TimelineId};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::controller;
use crate::models::{
    BasebackupQuery, ChangedBlocksQuery, ChangedBlocksResponse, CheckpointResponse, CompactRequest, CompactResponse, ErrorResponse,
    EvictLayersResponse, GcRequest, GcResponse, ImportRequest, ImportResponse, LocationConfig, LocationList, LsnByTimestampQuery,
    LsnByTimestampResponse, LsnLeaseRequest, LsnLeaseResponse, StatusResponse, TenantConfig, TenantConfigInfo, TenantCreateRequest,
    TenantCreateResponse, TenantLocationState, TimelineCreateRequest, TimelineInfo, WalReceiverRequest, LSN_HEADER,
};

/// At most this much of a non-JSON error body goes into an [`Error::Status`] message.
const ERROR_BODY_CHARS_MAX: usize = 500;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No answer: connection refused, DNS, a timeout, or a URL that is not one.
    #[error("could not reach the pageserver at {url}")]
    Unreachable {
        url: String,
        #[source]
        source: Box<ureq::Error>,
    },
    /// The TLS handshake failed: the certificate is not signed by the cluster CA, names
    /// another host or has expired, or the server does not speak TLS.
    #[error("TLS with the pageserver at {url} failed: {reason}")]
    Tls { url: String, reason: String },
    /// The pageserver answered with a status other than 2xx. `message` is the `error`
    /// field of its JSON body, else the body's text.
    #[error("pageserver: {method} {path} failed: HTTP {status}: {message}")]
    Status { method: &'static str, path: String, status: u16, message: String },
    /// A 2xx answer that could not be read or is not the expected model.
    #[error("pageserver: malformed answer to {method} {path}: {reason}")]
    Malformed { method: &'static str, path: String, reason: String },
}

impl Error {
    /// The HTTP status of an [`Error::Status`].
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// Timeouts and TLS of a [`Client`] (or an [`agent`]).
#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub connect_timeout: Duration,
    /// The whole request, body included; `None` waits as long as the pageserver takes (a
    /// basebackup at an LSN waits for it to be ingested, and its body is streamed by the
    /// caller at the caller's pace).
    pub request_timeout: Option<Duration>,
    /// The cluster CA that an `https://` server's certificate must be signed by; an
    /// `http://` URL then fails with [`Error::Tls`] before anything is sent. `None`: TLS
    /// off (`--no-tls`), and an `https://` URL fails with [`Error::Tls`].
    pub tls: Option<tls::ClientTls>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig { connect_timeout: Duration::from_secs(10), request_timeout: None, tls: None }
    }
}

/// A ureq agent with `config`'s timeouts and TLS, which takes error statuses as answers
/// (not as [`ureq::Error`]s).
pub fn agent(config: &ClientConfig) -> ureq::Agent {
    // The crypto provider fjord's TLS uses everywhere (aws-lc-rs); ureq's own default
    // (ring) is not built.
    let provider = Arc::new(tls::rustls::crypto::aws_lc_rs::default_provider());
    let tls_config = ureq::tls::TlsConfig::builder()
        .provider(ureq::tls::TlsProvider::Rustls)
        .unversioned_rustls_crypto_provider(provider)
        .root_certs(ureq::tls::RootCerts::Specific(Arc::new(config.tls.as_ref().map(ca_certificates).unwrap_or_default())))
        .build();
    ureq::Agent::config_builder()
        // Error statuses are answers with a message to show, not transport failures.
        .http_status_as_error(false)
        // With the cluster CA, an `http://` URL is refused before anything is sent: the
        // request and its token never travel in cleartext to a server meant to be https.
        .https_only(config.tls.is_some())
        .timeout_connect(Some(config.connect_timeout))
        .timeout_global(config.request_timeout)
        .tls_config(tls_config)
        .build()
        .into()
}

/// The certificates of the CA file `tls` was loaded from. `tls::ClientTls::load` checked
/// the file; should it have become unreadable since, no server is trusted, and every
/// handshake fails naming the file.
fn ca_certificates(tls: &tls::ClientTls) -> Vec<ureq::tls::Certificate<'static>> {
    let Ok(pem) = std::fs::read(tls.ca_path()) else { return Vec::new() };
    ureq::tls::parse_pem(&pem)
        .filter_map(|item| match item {
            Ok(ureq::tls::PemItem::Certificate(cert)) => Some(cert),
            _ => None,
        })
        .collect()
}

/// What went wrong with TLS in a request to `url` that failed with `e`, in words a user
/// acts on ("its certificate is not signed by the cluster CA (--tls-ca FILE)"); `None` if
/// `e` is no TLS failure. `tls` is the trust the request was made with.
pub fn tls_failure(e: &ureq::Error, url: &str, tls: Option<&tls::ClientTls>) -> Option<String> {
    use tls::rustls::{CertificateError, Error as TlsError};
    let source: &TlsError = match e {
        ureq::Error::Rustls(source) => source,
        ureq::Error::Io(io) => io.get_ref()?.downcast_ref::<TlsError>()?,
        ureq::Error::Tls(what) => return Some(what.to_string()),
        ureq::Error::RequireHttpsOnly(_) => {
            let ca = tls.map(|t| format!(" {}", t.ca_path().display())).unwrap_or_default();
            return Some(format!(
                "{url} is http://, and a client given the cluster CA (--tls-ca{ca}) sends nothing in cleartext: use https://"
            ));
        }
        _ => return None,
    };
    let host = url.parse::<ureq::http::Uri>().ok().and_then(|u| u.host().map(str::to_string)).unwrap_or_default();
    let ca = || match tls {
        Some(tls) => format!("the cluster CA (--tls-ca {})", tls.ca_path().display()),
        None => "a cluster CA, and none was given (--tls-ca FILE)".to_string(),
    };
    Some(match source {
        TlsError::InvalidCertificate(CertificateError::NotValidForNameContext { presented, .. }) => {
            format!("its certificate is for another host: it names {}, not {host}", presented.join(", "))
        }
        TlsError::InvalidCertificate(CertificateError::NotValidForName) => format!("its certificate is for another host, not {host}"),
        TlsError::InvalidCertificate(CertificateError::UnknownIssuer | CertificateError::BadSignature) => {
            format!("its certificate is not signed by {}", ca())
        }
        TlsError::InvalidCertificate(
            CertificateError::Expired
            | CertificateError::ExpiredContext { .. }
            | CertificateError::NotValidYet
            | CertificateError::NotValidYetContext { .. },
        ) => "its certificate has expired or is not valid yet".to_string(),
        TlsError::InvalidMessage(_) | TlsError::InappropriateMessage { .. } => {
            "it does not speak TLS (a server started with --no-tls serves http://, not https://)".to_string()
        }
        TlsError::AlertReceived(alert) => format!("it refused the TLS handshake ({alert:?})"),
        other => format!("the handshake failed: {other}"),
    })
}

/// A client of one pageserver's management API, e.g. `http://127.0.0.1:9898`.
pub struct Client {
    base_url: String,
    agent: ureq::Agent,
    tls: Option<tls::ClientTls>,
    /// Sent as `Authorization: Bearer <token>` with every request.
    token: Option<String>,
}

/// A basebackup being received: the LSN it was taken at (its `X-Fjord-Lsn` header; `None`
/// if the server did not say), and the tar stream as a reader.
pub struct Basebackup {
    pub lsn: Option<Lsn>,
    body: ureq::BodyReader<'static>,
}

impl Read for Basebackup {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.body.read(buf)
    }
}

impl Client {
    pub fn new(base_url: &str) -> Client {
        Client::with_config(base_url, ClientConfig::default())
    }

    pub fn with_config(base_url: &str, config: ClientConfig) -> Client {
        Client { base_url: base_url.trim_end_matches('/').to_string(), agent: agent(&config), tls: config.tls, token: None }
    }

    /// Sends `token` (a JWT, see the `auth` crate) with every request; `None`: no token.
    pub fn with_token(mut self, token: Option<String>) -> Client {
        self.token = token;
        self
    }

    fn authorized<B>(&self, request: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.token {
            Some(token) => request.header("Authorization", format!("Bearer {token}")),
            None => request,
        }
    }

    fn get(&self, path: &str) -> ureq::RequestBuilder<ureq::typestate::WithoutBody> {
        self.authorized(self.agent.get(self.url(path)))
    }

    fn delete(&self, path: &str) -> ureq::RequestBuilder<ureq::typestate::WithoutBody> {
        self.authorized(self.agent.delete(self.url(path)))
    }

    fn post(&self, path: &str) -> ureq::RequestBuilder<ureq::typestate::WithBody> {
        self.authorized(self.agent.post(self.url(path)))
    }

    fn put(&self, path: &str) -> ureq::RequestBuilder<ureq::typestate::WithBody> {
        self.authorized(self.agent.put(self.url(path)))
    }

    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The full URL of a route path.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    /// `GET /v1/status`.
    pub fn status(&self) -> Result<StatusResponse, Error> {
        self.get_json("/v1/status")
    }

    /// `GET /v1/location`: the tenants held and how.
    pub fn locations(&self) -> Result<LocationList, Error> {
        self.get_json("/v1/location")
    }

    /// `PUT /v1/tenant/{tenant}/location`: attach, hold as secondary, or detach.
    pub fn set_location(&self, tenant: TenantId, config: &LocationConfig) -> Result<TenantLocationState, Error> {
        let path = format!("/v1/tenant/{tenant}/location");
        let body = encode(config);
        let response = self.put(&path).content_type("application/json").send(body.as_str());
        self.decode("PUT", &path, response)
    }

    /// `GET /v1/tenant`.
    pub fn tenants(&self) -> Result<Vec<TenantId>, Error> {
        self.get_json("/v1/tenant")
    }

    /// `POST /v1/tenant`.
    pub fn create_tenant(&self, request: &TenantCreateRequest) -> Result<TenantCreateResponse, Error> {
        self.post_json("/v1/tenant", request)
    }

    /// `GET /v1/tenant/{tenant}/timeline`.
    pub fn timelines(&self, tenant: TenantId) -> Result<Vec<TimelineInfo>, Error> {
        self.get_json(&format!("/v1/tenant/{tenant}/timeline"))
    }

    /// `POST /v1/tenant/{tenant}/timeline`: a new timeline or a branch.
    pub fn create_timeline(&self, tenant: TenantId, request: &TimelineCreateRequest) -> Result<TimelineInfo, Error> {
        self.post_json(&format!("/v1/tenant/{tenant}/timeline"), request)
    }

    /// `GET /v1/tenant/{tenant}/timeline/{timeline}`.
    pub fn timeline(&self, tenant: TenantId, timeline: TimelineId) -> Result<TimelineInfo, Error> {
        self.get_json(&timeline_path(tenant, timeline))
    }

    /// `POST .../import`: fills the empty timeline from a data directory on the
    /// pageserver's host.
    pub fn import(&self, tenant: TenantId, timeline: TimelineId, request: &ImportRequest) -> Result<ImportResponse, Error> {
        self.post_json(&format!("{}/import", timeline_path(tenant, timeline)), request)
    }

    /// `POST .../wal_receiver`: the pageserver follows the timeline's WAL from these sources.
    pub fn start_wal_receiver(&self, tenant: TenantId, timeline: TimelineId, request: &WalReceiverRequest) -> Result<(), Error> {
        let path = format!("{}/wal_receiver", timeline_path(tenant, timeline));
        let body = encode(request);
        let response = self.post(&path).content_type("application/json").send(body.as_str());
        self.check("POST", &path, response).map(drop)
    }

    /// `DELETE .../wal_receiver`: stops the receiver and forgets its sources (404 if there
    /// was none).
    pub fn stop_wal_receiver(&self, tenant: TenantId, timeline: TimelineId) -> Result<(), Error> {
        let path = format!("{}/wal_receiver", timeline_path(tenant, timeline));
        let response = self.delete(&path).call();
        self.check("DELETE", &path, response).map(drop)
    }

    /// The path of a basebackup request, query included.
    pub fn basebackup_path(&self, tenant: TenantId, timeline: TimelineId, query: &BasebackupQuery) -> String {
        format!("{}/basebackup{}", timeline_path(tenant, timeline), query.to_query_string())
    }

    /// `GET .../basebackup[?lsn=X/X]`: the tar stream, to be read by the caller as it
    /// arrives.
    pub fn basebackup(&self, tenant: TenantId, timeline: TimelineId, query: &BasebackupQuery) -> Result<Basebackup, Error> {
        let path = self.basebackup_path(tenant, timeline, query);
        let response = self.check("GET", &path, self.get(&path).call())?;
        let malformed = |reason: String| Error::Malformed { method: "GET", path: path.clone(), reason };
        let lsn = match response.headers().get(LSN_HEADER) {
            None => None,
            Some(value) => {
                let text = value.to_str().map_err(|_| malformed(format!("the {LSN_HEADER} header is not text")))?;
                Some(text.parse::<Lsn>().map_err(|e| malformed(format!("the {LSN_HEADER} header: {e}")))?)
            }
        };
        Ok(Basebackup { lsn, body: response.into_body().into_reader() })
    }

    /// `GET /v1/tenant/{tenant}/config`: the tenant's own settings and those in force.
    pub fn tenant_config(&self, tenant: TenantId) -> Result<TenantConfigInfo, Error> {
        self.get_json(&format!("/v1/tenant/{tenant}/config"))
    }

    /// `PUT /v1/tenant/{tenant}/config`: replaces the tenant's settings (persisted).
    pub fn set_tenant_config(&self, tenant: TenantId, config: &TenantConfig) -> Result<TenantConfigInfo, Error> {
        let path = format!("/v1/tenant/{tenant}/config");
        let body = encode(config);
        let response = self.put(&path).content_type("application/json").send(body.as_str());
        self.decode("PUT", &path, response)
    }

    /// `POST .../checkpoint`: freeze the open in-memory layer and flush it to a layer file.
    pub fn checkpoint(&self, tenant: TenantId, timeline: TimelineId) -> Result<CheckpointResponse, Error> {
        self.post_empty(&format!("{}/checkpoint", timeline_path(tenant, timeline)))
    }

    /// `POST .../evict_layers`: deletes the local copy of every layer that remote storage
    /// holds, so that reads download them again (for tests of downloads and of a cold
    /// cache; nothing is evicted without remote storage).
    pub fn evict_layers(&self, tenant: TenantId, timeline: TimelineId) -> Result<EvictLayersResponse, Error> {
        self.post_empty(&format!("{}/evict_layers", timeline_path(tenant, timeline)))
    }

    /// `POST .../compact`: image layers where needed (or forced), then L0 compaction.
    pub fn compact(&self, tenant: TenantId, timeline: TimelineId, request: &CompactRequest) -> Result<CompactResponse, Error> {
        self.post_json(&format!("{}/compact", timeline_path(tenant, timeline)), request)
    }

    /// `POST .../lsn_lease`: holds an LSN against GC for a while (a read replica's position).
    pub fn lsn_lease(&self, tenant: TenantId, timeline: TimelineId, request: &LsnLeaseRequest) -> Result<LsnLeaseResponse, Error> {
        self.post_json(&format!("{}/lsn_lease", timeline_path(tenant, timeline)), request)
    }

    /// `POST .../gc`: garbage collection with the tenant's PITR window or the request's.
    pub fn gc(&self, tenant: TenantId, timeline: TimelineId, request: &GcRequest) -> Result<GcResponse, Error> {
        self.post_json(&format!("{}/gc", timeline_path(tenant, timeline)), request)
    }

    /// `GET .../get_lsn_by_timestamp?timestamp=...`: where a point in time falls.
    pub fn lsn_by_timestamp(
        &self,
        tenant: TenantId,
        timeline: TimelineId,
        query: &LsnByTimestampQuery,
    ) -> Result<LsnByTimestampResponse, Error> {
        self.get_json(&format!("{}/get_lsn_by_timestamp{}", timeline_path(tenant, timeline), query.to_query_string()))
    }

    /// `GET .../changed_blocks?from=X/X&to=X/X[&limit=N]`: the blocks that may have changed
    /// after `from` up to `to` (waited for), for a compute's cache of pages
    /// ([`ChangedBlocksResponse`] says how to use it). A 410 (history below `from` is gone:
    /// GC or the branch point) or a 409 (more than the limit changed) means the cache
    /// cannot be checked and must be dropped whole.
    pub fn changed_blocks(
        &self,
        tenant: TenantId,
        timeline: TimelineId,
        query: &ChangedBlocksQuery,
    ) -> Result<ChangedBlocksResponse, Error> {
        self.get_json(&format!("{}/changed_blocks{}", timeline_path(tenant, timeline), query.to_query_string()))
    }

    fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T, Error> {
        let response = self.get(path).call();
        self.decode("GET", path, response)
    }

    fn post_empty<T: DeserializeOwned>(&self, path: &str) -> Result<T, Error> {
        let response = self.post(path).send_empty();
        self.decode("POST", path, response)
    }

    fn post_json<T: DeserializeOwned>(&self, path: &str, request: &impl Serialize) -> Result<T, Error> {
        let body = encode(request);
        let response = self.post(path).content_type("application/json").send(body.as_str());
        self.decode("POST", path, response)
    }

    /// A 2xx response passes; no answer or any other status is an error.
    fn check(
        &self,
        method: &'static str,
        path: &str,
        response: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<ureq::http::Response<ureq::Body>, Error> {
        let url = self.url(path);
        let mut response = response.map_err(|e| match tls_failure(&e, &url, self.tls.as_ref()) {
            Some(reason) => Error::Tls { url: url.clone(), reason },
            None => Error::Unreachable { url: url.clone(), source: Box::new(e) },
        })?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        // The message is best effort: an unreadable error body still leaves the status.
        let text = response.body_mut().read_to_string().unwrap_or_default();
        Err(Error::Status { method, path: path.to_string(), status: status.as_u16(), message: server_message(&text) })
    }

    fn decode<T: DeserializeOwned>(
        &self,
        method: &'static str,
        path: &str,
        response: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<T, Error> {
        let mut response = self.check(method, path, response)?;
        let malformed = |reason: String| Error::Malformed { method, path: path.to_string(), reason };
        let text = response.body_mut().read_to_string().map_err(|e| malformed(format!("could not read it: {e}")))?;
        serde_json::from_str(&text).map_err(|e| malformed(e.to_string()))
    }
}

/// A blocking client of the storage controller's API (`crate::controller`), with the same
/// timeouts, TLS and token handling as [`Client`].
pub struct ControllerClient(Client);

impl ControllerClient {
    pub fn with_config(base_url: &str, config: ClientConfig) -> ControllerClient {
        ControllerClient(Client::with_config(base_url, config))
    }

    pub fn with_token(self, token: Option<String>) -> ControllerClient {
        ControllerClient(self.0.with_token(token))
    }

    pub fn base_url(&self) -> &str {
        self.0.base_url()
    }

    /// `GET /v1/status`: this controller, whether it leads, and who does.
    pub fn status(&self) -> Result<controller::StatusResponse, Error> {
        self.0.get_json("/v1/status")
    }

    /// `POST /v1/node`: a pageserver joins, or re-joins with new addresses.
    pub fn register_node(&self, request: &controller::NodeRegisterRequest) -> Result<controller::NodeLocation, Error> {
        self.0.post_json("/v1/node", request)
    }

    /// `POST /v1/re-attach`: what a starting pageserver holds, attached tenants with their
    /// generations raised.
    pub fn re_attach(&self, request: &controller::ReAttachRequest) -> Result<controller::ReAttachResponse, Error> {
        self.0.post_json("/v1/re-attach", request)
    }

    /// `GET /v1/tenant/{tenant}`: where a tenant is attached, with which generation.
    pub fn tenant(&self, tenant: TenantId) -> Result<controller::TenantLocation, Error> {
        self.0.get_json(&format!("/v1/tenant/{tenant}"))
    }

    /// `POST /v1/tenant`: places a new tenant.
    pub fn create_tenant(&self, request: &controller::TenantCreateRequest) -> Result<controller::TenantLocation, Error> {
        self.0.post_json("/v1/tenant", request)
    }

    /// `GET /v1/node`: every pageserver, its addresses, health and how many tenants it holds.
    pub fn nodes(&self) -> Result<Vec<controller::NodeInfo>, Error> {
        self.0.get_json("/v1/node")
    }

    /// `POST /v1/tenant/{tenant}/migrate`: starts a planned migration to `node_id` (or finds
    /// the tenant there already).
    pub fn migrate(&self, tenant: TenantId, node_id: u64) -> Result<controller::TenantLocation, Error> {
        self.0.post_json(&format!("/v1/tenant/{tenant}/migrate"), &controller::MigrateRequest { node_id })
    }

    /// `GET /v1/tenant`: where every tenant is.
    pub fn tenants(&self) -> Result<Vec<controller::TenantLocation>, Error> {
        self.0.get_json("/v1/tenant")
    }
}

fn timeline_path(tenant: TenantId, timeline: TimelineId) -> String {
    format!("/v1/tenant/{tenant}/timeline/{timeline}")
}

/// The models are plain data (strings, numbers, ids), which always encode.
fn encode(request: &impl Serialize) -> String {
    serde_json::to_string(request).expect("a request model encodes as JSON")
}

/// What an error answer says: the `error` field of [`ErrorResponse`], else the body itself
/// (a proxy's page, a panic message), else a hint that the route may not exist.
pub fn server_message(body: &str) -> String {
    if let Ok(ErrorResponse { error }) = serde_json::from_str(body) {
        return error;
    }
    match body.trim() {
        "" => "no message (is this pageserver too old to have the route?)".to_string(),
        t => t.chars().take(ERROR_BODY_CHARS_MAX).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_messages_are_extracted() {
        assert_eq!(server_message(r#"{"error": "tenant 11 not found"}"#), "tenant 11 not found");
        assert_eq!(server_message("plain text\n"), "plain text");
        assert!(server_message("").contains("no message"));
        assert_eq!(server_message(&"x".repeat(600)).len(), ERROR_BODY_CHARS_MAX);
    }

    #[test]
    fn nothing_listening_is_unreachable() {
        // Port 1 on loopback: nothing listens there on any machine that runs these tests.
        let config = ClientConfig { connect_timeout: Duration::from_secs(2), ..Default::default() };
        let client = Client::with_config("http://127.0.0.1:1/", config);
        let err = client.status().unwrap_err();
        assert!(matches!(err, Error::Unreachable { .. }), "{err:?}");
        assert_eq!(err.to_string(), "could not reach the pageserver at http://127.0.0.1:1/v1/status");
        assert_eq!(err.status(), None);
    }
}
