//! The controller's HTTP API as types: every request and response body. Requests refuse
//! unknown fields; responses ignore them (a newer controller may add some). Ids are text,
//! as everywhere in fjord's APIs.

use proto::TenantId;
use serde::{Deserialize, Serialize};

/// `POST /v1/node`: a pageserver joins (or re-joins with new addresses). Its id is the one it
/// was started with; the addresses are the ones the controller, computes and the CLI dial.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeRegisterRequest {
    pub node_id: u64,
    /// `host:port` of its HTTP API (the heartbeat's target).
    pub http_addr: String,
    /// `host:port` of its page service (what computes connect to).
    pub page_addr: String,
}

/// What the leading controller has seen of a node lately. A controller that does not lead,
/// or has led for less than the offline grace, says `unknown` until it knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Availability {
    Unknown,
    Online,
    Offline,
}

/// `GET /v1/node`: one row each.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub node_id: u64,
    pub http_addr: String,
    pub page_addr: String,
    pub availability: Availability,
    /// Tenants attached to it, and held as their warm secondary.
    pub attached: u64,
    pub secondaries: u64,
}

/// `POST /v1/tenant`: place a new tenant (an attached pageserver, a secondary when a second
/// pageserver is online, generation 1).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantCreateRequest {
    pub tenant_id: TenantId,
}

/// A node as a tenant's location names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeLocation {
    pub node_id: u64,
    pub http_addr: String,
    pub page_addr: String,
}

/// `GET /v1/tenant/{tenant_id}`: where a tenant is. Only the attached pageserver with this
/// generation may write the tenant's objects; a compute reads from `attached.page_addr`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantLocation {
    pub tenant_id: TenantId,
    pub generation: u32,
    pub attached: NodeLocation,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secondary: Option<NodeLocation>,
}

/// `GET /v1/status`: this controller, whether it leads, and who does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusResponse {
    /// This process's random id in the leader lease.
    pub instance: String,
    pub version: String,
    pub leader: bool,
    /// The leading controller's advertised address, if any controller holds the lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_address: Option<String>,
    /// `ok`, or why the controller's database cannot be reached.
    pub database: String,
}
