//! The storage controller's HTTP API as types: every request and response body (the
//! controller serves them, pageservers, compute_ctl and the CLI call them). Requests refuse
//! unknown fields; responses ignore them (a newer controller may add some). Ids are text,
//! as everywhere in fjord's APIs.

use proto::TenantId;
use serde::{Deserialize, Serialize};

use crate::models::LocationMode;

/// `POST /v1/node`: a pageserver joins (or re-joins with new addresses). Its id is the one it
/// was started with; the addresses are the ones the controller, computes and the CLI dial.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Availability {
    Unknown,
    Online,
    Offline,
}

/// `GET /v1/node`: one row each.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TenantCreateRequest {
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub tenant_id: TenantId,
}

/// A node as a tenant's location names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeLocation {
    pub node_id: u64,
    pub http_addr: String,
    pub page_addr: String,
}

/// `GET /v1/tenant/{tenant_id}`: where a tenant is. Only the attached pageserver with this
/// generation may write the tenant's objects; a compute reads from [`TenantLocation::page_service`]
/// (`attached`, except while a planned migration warms its destination).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TenantLocation {
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub tenant_id: TenantId,
    pub generation: u32,
    pub attached: NodeLocation,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secondary: Option<NodeLocation>,
    /// A planned migration under way to `attached`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration: Option<Migration>,
}

impl TenantLocation {
    /// The pageserver computes read from: the migration's source until it cuts over, else
    /// the attached one.
    pub fn page_service(&self) -> &NodeLocation {
        match &self.migration {
            Some(m) if !m.cut_over => &m.from,
            _ => &self.attached,
        }
    }
}

/// A planned migration in progress. Its source keeps the tenant attached with its older
/// generation (superseded: it ingests and serves reads, and writes nothing to object
/// storage) until computes have moved; `cut_over` once the destination has caught up and
/// computes are told to read from it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Migration {
    pub from: NodeLocation,
    pub cut_over: bool,
}

/// `POST /v1/tenant/{tenant_id}/migrate`: move a tenant to another live pageserver.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct MigrateRequest {
    pub node_id: u64,
}

/// `GET /v1/status`: this controller, whether it leads, and who does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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

/// `POST /v1/re-attach`: a pageserver that starts asks which tenants it holds. Every tenant
/// attached to it gets its generation raised in the same transaction (the previous process
/// on that node may have written under the old one, and may still be finishing).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ReAttachRequest {
    pub node_id: u64,
}

/// One tenant in a [`ReAttachResponse`]: `generation` is the new one for `attached`, 0 for
/// `secondary`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReAttachTenant {
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub tenant_id: TenantId,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub mode: LocationMode,
    pub generation: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReAttachResponse {
    pub tenants: Vec<ReAttachTenant>,
}
