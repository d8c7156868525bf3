//! Where the compute's tenant is: the storage controller's answer (`--controller`), and the
//! pageserver location that compute_ctl and postgres use, which changes when the tenant
//! moves.
//!
//! The controller's `GET /v1/tenant/{tenant_id}` names the attached pageserver's page
//! service and HTTP API and the attachment's generation (and, while a planned migration
//! has not cut over, its source, which computes keep reading from). compute_ctl asks once at start
//! and then polls it ([`Location`] is what it last applied); a move rewrites
//! `fjord.pageserver_address` in `postgresql.conf`, reloads postgres, and points
//! compute_ctl's own pageserver client (the lease renewals) at the new HTTP API. The
//! controller is asked, never relied on: an answer that does not come changes nothing.
//!
//! The answer is parsed here, on the receiving side, into what a compute needs; unknown
//! fields are ignored, so a newer controller can add some.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use proto::TenantId;
use serde::Deserialize;

/// The parts of the controller's `TenantLocation` a compute reads.
#[derive(Clone, Debug, Deserialize)]
struct TenantLocationBody {
    tenant_id: TenantId,
    generation: u32,
    attached: NodeBody,
    /// A planned migration: until it cuts over, computes stay with its source.
    #[serde(default)]
    migration: Option<MigrationBody>,
}

#[derive(Clone, Debug, Deserialize)]
struct MigrationBody {
    from: NodeBody,
    cut_over: bool,
}

#[derive(Clone, Debug, Deserialize)]
struct NodeBody {
    node_id: u64,
    http_addr: String,
    page_addr: String,
}

/// Where a tenant is attached: what compute_ctl and postgres connect to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    /// Base URL of the pageserver's management API (`https://host:port` with TLS on).
    pub http_url: String,
    /// `host:port` of its page service (`fjord.pageserver_address`).
    pub page_addr: String,
    /// The controller's node id and attachment generation; `None` without a controller.
    pub node_id: Option<u64>,
    pub generation: Option<u32>,
}

impl Location {
    /// Whether a compute must move to reach `other` (the generation alone moves nothing:
    /// the same pageserver serves the tenant at its new generation).
    pub fn moved_to(&self, other: &Location) -> bool {
        self.http_url != other.http_url || self.page_addr != other.page_addr
    }
}

/// The location every part of compute_ctl reads: the lease thread looks at it before each
/// renewal.
pub type SharedLocation = Arc<Mutex<Location>>;

/// A client of the storage controller's API at one base URL, with the compute's token and
/// the cluster CA.
pub struct ControllerClient {
    base_url: String,
    agent: ureq::Agent,
    tls: Option<tls::ClientTls>,
    token: Option<String>,
}

/// How long one question to the controller may take. Below the poll's budget on purpose:
/// a controller that hangs delays the next poll by at most this, and the compute keeps
/// serving from the last location meanwhile.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

impl ControllerClient {
    pub fn new(base_url: &str, tls: Option<tls::ClientTls>, token: Option<String>) -> ControllerClient {
        let config =
            pageserver_api::ClientConfig { connect_timeout: REQUEST_TIMEOUT, request_timeout: Some(REQUEST_TIMEOUT), tls: tls.clone() };
        ControllerClient { base_url: base_url.trim_end_matches('/').to_string(), agent: pageserver_api::client::agent(&config), tls, token }
    }

    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// `GET /v1/tenant/{tenant}`: where the tenant is attached now. The pageserver's HTTP
    /// URL is https exactly when compute_ctl has the cluster CA (every service then speaks
    /// TLS).
    pub fn location(&self, tenant: TenantId) -> anyhow::Result<Location> {
        let url = format!("{}/v1/tenant/{tenant}", self.base_url);
        let mut request = self.agent.get(&url);
        if let Some(token) = &self.token {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        let mut response = request.call().map_err(|e| match pageserver_api::client::tls_failure(&e, &url, self.tls.as_ref()) {
            Some(reason) => anyhow::anyhow!("could not reach the storage controller at {url}: {reason}"),
            None => anyhow::anyhow!("could not reach the storage controller at {url}: {e}"),
        })?;
        let status = response.status();
        let text = response.body_mut().read_to_string().with_context(|| format!("read the answer of {url}"))?;
        if !status.is_success() {
            anyhow::bail!("the storage controller answered {url} with {status}: {}", pageserver_api::client::server_message(&text));
        }
        let body: TenantLocationBody =
            serde_json::from_str(&text).with_context(|| format!("the storage controller's answer to {url} is not a tenant location"))?;
        if body.tenant_id != tenant {
            anyhow::bail!("the storage controller answered {url} with tenant {}", body.tenant_id);
        }
        // While a planned migration warms its destination, the source serves the tenant.
        let node = match body.migration {
            Some(m) if !m.cut_over => m.from,
            _ => body.attached,
        };
        check_addr(&node.page_addr).context("the storage controller's page_addr")?;
        check_addr(&node.http_addr).context("the storage controller's http_addr")?;
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        Ok(Location {
            http_url: format!("{scheme}://{}", node.http_addr),
            page_addr: node.page_addr,
            node_id: Some(node.node_id),
            generation: Some(body.generation),
        })
    }
}

/// A `host:port` that postgresql.conf and a URL can carry: no spaces, quotes or slashes,
/// and a port.
fn check_addr(addr: &str) -> anyhow::Result<()> {
    let ok = !addr.is_empty()
        && addr.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']' | b'_'))
        && addr.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0));
    anyhow::ensure!(ok, "{addr:?} is not a host:port");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_that_could_break_the_configuration_file_are_refused() {
        for good in ["127.0.0.1:6400", "ps-1.example:6400", "[::1]:6400"] {
            assert!(check_addr(good).is_ok(), "{good}");
        }
        for bad in ["", "127.0.0.1", "127.0.0.1:0", "h:port", "a'b:1", "a b:1", "a/b:1", ":1", "h:70000"] {
            assert!(check_addr(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_new_generation_on_the_same_pageserver_is_no_move() {
        let a = Location { http_url: "https://h:1".into(), page_addr: "h:2".into(), node_id: Some(1), generation: Some(1) };
        let b = Location { generation: Some(2), ..a.clone() };
        assert!(!a.moved_to(&b));
        let c = Location { page_addr: "h:3".into(), ..a.clone() };
        assert!(a.moved_to(&c));
    }
}
