//! Makes the pageservers hold what the database says. Each heartbeat is a pageserver's
//! `GET /v1/location`: which tenants it holds, attached (with a generation) or secondary.
//! After the round's failovers the leader compares every online node's answer with the
//! placements and sends `PUT /v1/tenant/{tenant}/location` where they differ: attach with
//! the tenant's generation on its attached node, hold as secondary on its secondary, detach
//! anywhere else that holds it. Orders run in their own tasks (an attach loads a tenant
//! from object storage, which may take seconds) and at most one per node and tenant at a
//! time (on this controller's side: a pageserver may still be working on one whose request
//! timed out here); one that fails is sent again after the next heartbeat that still shows
//! the difference. Every order carries the tenant's generation when it was given, and a
//! pageserver refuses one that is older than what it holds (an attach with a lower
//! generation; a secondary or detach order given at a generation not newer than its
//! attachment's), so an order from a controller that no longer leads, or one overtaken on
//! the way, changes nothing.
//!
//! Tenants the database does not place are left alone: they belong to no controller.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use pageserver_api::client::{Client, ClientConfig};
use pageserver_api::models::{LocationConfig, LocationList, LocationMode};
use proto::TenantId;

use crate::models::TenantLocation;
use crate::Controller;

/// How long an order may take: an attach downloads the tenant's indexes.
const ORDER_TIMEOUT: Duration = Duration::from_secs(60);

/// What `node` should do with `tenant` by the placements; `None`: nothing, it keeps what
/// it holds (a planned migration's source, which serves computes until it ends).
pub fn desired(tenant: &TenantLocation, node: u64) -> Option<LocationConfig> {
    let mode = if tenant.attached.node_id == node {
        LocationMode::Attached
    } else if tenant.migration.as_ref().is_some_and(|m| m.from.node_id == node) {
        return None;
    } else if tenant.secondary.as_ref().is_some_and(|s| s.node_id == node) {
        LocationMode::Secondary
    } else {
        LocationMode::Detached
    };
    Some(LocationConfig { mode, generation: Some(tenant.generation) })
}

/// The orders that make `held` (a node's answer) match `placements`: (tenant, order).
pub fn orders(node: u64, held: &LocationList, placements: &[TenantLocation]) -> Vec<(TenantId, LocationConfig)> {
    let held: HashMap<TenantId, (LocationMode, u32)> = held.tenants.iter().map(|t| (t.tenant_id, (t.mode, t.generation))).collect();
    let mut out = Vec::new();
    for t in placements {
        let Some(want) = desired(t, node) else { continue };
        let now = held.get(&t.tenant_id).copied();
        let differs = match (want.mode, now) {
            (LocationMode::Attached, Some((LocationMode::Attached, g))) => Some(g) != want.generation,
            (LocationMode::Attached, _) => true,
            (LocationMode::Secondary, Some((LocationMode::Secondary, _))) => false,
            (LocationMode::Secondary, _) => true,
            (LocationMode::Detached, None | Some((LocationMode::Detached, _))) => false,
            (LocationMode::Detached, Some(_)) => true,
        };
        if differs {
            out.push((t.tenant_id, want));
        }
    }
    out
}

/// Sends the orders that `answers` (each online node's location list) show are needed.
pub fn send(ctl: &Arc<Controller>, nodes: &[(u64, String)], answers: &HashMap<u64, LocationList>, placements: &[TenantLocation]) {
    for (node, http_addr) in nodes {
        let Some(held) = answers.get(node) else { continue };
        for (tenant, order) in orders(*node, held, placements) {
            if !ctl.orders_in_flight.lock().expect("not poisoned").insert((*node, tenant)) {
                continue;
            }
            let ctl = Arc::clone(ctl);
            let (node, url) = (*node, ctl.base_url(http_addr));
            tokio::task::spawn_blocking(move || {
                let config =
                    ClientConfig { request_timeout: Some(ORDER_TIMEOUT), tls: ctl.config.client_tls.clone(), ..Default::default() };
                let client = Client::with_config(&url, config).with_token(ctl.config.auth_token.clone());
                let what = match order.generation {
                    Some(g) => format!("{:?} with generation {g}", order.mode).to_lowercase(),
                    None => format!("{:?}", order.mode).to_lowercase(),
                };
                match client.set_location(tenant, &order) {
                    Ok(_) => {
                        ctl.metrics.orders.with_label_values(&["ok"]).inc();
                        tracing::info!("pageserver {node} holds tenant {tenant} {what}");
                    }
                    Err(e) => {
                        ctl.metrics.orders.with_label_values(&["failed"]).inc();
                        tracing::warn!(
                            "ordering pageserver {node} to hold tenant {tenant} {what} failed (sent again after the next heartbeat): {e}"
                        );
                    }
                }
                ctl.orders_in_flight.lock().expect("not poisoned").remove(&(node, tenant));
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::NodeLocation;
    use pageserver_api::models::TenantLocationState;

    fn tid(n: u8) -> TenantId {
        TenantId::from_bytes([n; 16])
    }

    fn node(id: u64) -> NodeLocation {
        NodeLocation { node_id: id, http_addr: format!("h{id}:1"), page_addr: format!("h{id}:2") }
    }

    fn placed(t: u8, generation: u32, attached: u64, secondary: Option<u64>) -> TenantLocation {
        TenantLocation { tenant_id: tid(t), generation, attached: node(attached), secondary: secondary.map(node), migration: None }
    }

    fn holds(node: u64, tenants: &[(u8, LocationMode, u32)]) -> LocationList {
        LocationList {
            node_id: Some(node),
            joined: true,
            tenants: tenants
                .iter()
                .map(|&(t, mode, generation)| TenantLocationState { tenant_id: tid(t), mode, generation, timelines: Vec::new() })
                .collect(),
        }
    }

    #[test]
    fn each_difference_gets_one_order_and_agreement_none() {
        use LocationMode::*;
        let placements = [placed(1, 3, 1, Some(2)), placed(2, 1, 2, Some(1)), placed(3, 5, 2, None)];
        // Node 1: tenant 1 attached with an old generation, tenant 2 missing as secondary,
        // tenant 3 held although it belongs to node 2 alone, tenant 9 unplaced.
        let got = orders(1, &holds(1, &[(1, Attached, 2), (3, Attached, 4), (9, Attached, 1)]), &placements);
        assert_eq!(
            got,
            vec![
                (tid(1), LocationConfig { mode: Attached, generation: Some(3) }),
                (tid(2), LocationConfig { mode: Secondary, generation: Some(1) }),
                (tid(3), LocationConfig { mode: Detached, generation: Some(5) }),
            ]
        );
        // Node 2 holds exactly what it should: nothing to order.
        assert!(orders(2, &holds(2, &[(1, Secondary, 0), (2, Attached, 1), (3, Attached, 5)]), &placements).is_empty());
        // A node that holds nothing is told to attach and to hold secondaries.
        assert_eq!(orders(2, &holds(2, &[]), &placements).len(), 3);
    }

    #[test]
    fn a_migrations_source_is_left_alone_until_it_ends() {
        use LocationMode::*;
        let mut t = placed(1, 4, 2, None);
        t.migration = Some(crate::models::Migration { from: node(1), cut_over: false });
        // The source holds generation 3 (superseded by 4): no order, cut over or not.
        assert!(orders(1, &holds(1, &[(1, Attached, 3)]), std::slice::from_ref(&t)).is_empty());
        t.migration.as_mut().expect("set").cut_over = true;
        assert!(orders(1, &holds(1, &[(1, Attached, 3)]), std::slice::from_ref(&t)).is_empty());
        // The destination is told to attach with the new generation.
        assert_eq!(
            orders(2, &holds(2, &[]), std::slice::from_ref(&t)),
            vec![(tid(1), LocationConfig { mode: Attached, generation: Some(4) })]
        );
        // Once it ended, the source becomes the secondary.
        t.migration = None;
        t.secondary = Some(node(1));
        assert_eq!(
            orders(1, &holds(1, &[(1, Attached, 3)]), std::slice::from_ref(&t)),
            vec![(tid(1), LocationConfig { mode: Secondary, generation: Some(4) })]
        );
    }
}
