//! The leader's watch over the pageservers: every `heartbeat_interval` it asks each one
//! which tenants it holds, `GET /v1/location` (at most `heartbeat_timeout`); one that has
//! not answered for `offline_after` is offline, and its tenants fail over to their
//! secondaries ([`crate::persistence::Db::fail_over`]); tenants whose secondary went
//! offline get another; planned migrations move on ([`crate::migration`]). Then the
//! answers go to [`crate::reconcile`], which orders each pageserver to hold what the
//! placements say. Timings: a pageserver that dies is taken for dead between `offline_after` and
//! `offline_after + heartbeat_interval + heartbeat_timeout` later.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pageserver_api::client::{Client, ClientConfig};

use crate::models::Availability;
use crate::persistence::{DbError, NodeRow};
use crate::scheduler::{self, Candidate};
use crate::{Controller, Health};

/// Runs forever (until the task is cancelled).
pub async fn run(ctl: Arc<Controller>) {
    // Tenants already reported as unable to fail over, so that the log says it once.
    let mut reported_stuck = HashSet::new();
    loop {
        let started = Instant::now();
        if ctl.is_leader() {
            match round(&ctl, &mut reported_stuck).await {
                Ok(()) => {}
                // The lease moved under this round: the lease task says so.
                Err(DbError::NotLeader) => tracing::debug!("heartbeat round: this controller no longer holds the lease"),
                Err(e) => {
                    ctl.metrics.database_errors.inc();
                    tracing::warn!("heartbeat round: {e}");
                }
            }
        }
        tokio::time::sleep(ctl.config.heartbeat_interval.saturating_sub(started.elapsed())).await;
    }
}

async fn round(ctl: &Arc<Controller>, reported_stuck: &mut HashSet<proto::TenantId>) -> Result<(), DbError> {
    let nodes = ctl.db.nodes().await?;
    let mut checks = tokio::task::JoinSet::new();
    for n in &nodes {
        let (id, url) = (n.node.node_id, ctl.base_url(&n.node.http_addr));
        let config = ClientConfig {
            connect_timeout: ctl.config.heartbeat_timeout,
            request_timeout: Some(ctl.config.heartbeat_timeout),
            tls: ctl.config.client_tls.clone(),
        };
        let token = ctl.config.auth_token.clone();
        checks.spawn_blocking(move || (id, Client::with_config(&url, config).with_token(token).locations()));
    }
    let mut answers = Vec::new();
    let mut held = HashMap::new();
    while let Some(done) = checks.join_next().await {
        let (id, answer) = match done {
            Ok(r) => r,
            // The runtime is shutting down (the process stops): this round ends here.
            Err(e) if e.is_cancelled() => return Ok(()),
            Err(e) => {
                tracing::error!("a heartbeat task failed: {e}");
                continue;
            }
        };
        let answer = match answer {
            // A pageserver started without a controller names no node: it is only
            // heartbeated (alive or not), never ordered.
            // Only a pageserver that joined a controller (it names its node id) takes orders.
            Ok(list) if list.node_id == Some(id) && list.joined => {
                held.insert(id, list);
                Ok(())
            }
            // Alive but not serving its tenants yet (or ever, if its join keeps failing):
            // a missed heartbeat, so that a node that never joins is failed over.
            Ok(list) if list.node_id == Some(id) => Err("it has not joined this controller yet".to_string()),
            Ok(list) if list.node_id.is_some() => {
                if ctl.misnamed.lock().expect("not poisoned").insert(id) {
                    tracing::error!(
                        "the pageserver at pageserver {id}'s address says it is pageserver {}: it counts as offline until the two agree",
                        list.node_id.unwrap_or_default()
                    );
                }
                Err(format!("it says it is pageserver {}", list.node_id.unwrap_or_default()))
            }
            Ok(_) => Ok(()),
            // An error answer (this controller's token refused, say): a pageserver this
            // controller cannot manage is not online for it.
            Err(e) if e.status().is_some() => Err(e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        answers.push((id, answer));
    }
    let (offline, unusable) = record(ctl, &nodes, answers);
    let seen = ctl.availability_snapshot();
    let choose = |attached: u64, loads: &[NodeRow]| scheduler::secondary_for(&candidates(&seen, loads), attached);
    for &node in &offline {
        let (moved, stuck) = ctl.db.fail_over(&ctl.instance, node, &unusable, choose).await?;
        for t in moved {
            ctl.metrics.failovers.inc();
            reported_stuck.remove(&t.tenant_id);
            tracing::info!(
                "tenant {} failed over from pageserver {node} to {} with generation {} (new secondary: {})",
                t.tenant_id,
                t.attached.node_id,
                t.generation,
                t.secondary.as_ref().map_or("none".to_string(), |s| s.node_id.to_string())
            );
        }
        for a in stuck {
            if reported_stuck.insert(a.tenant_id) {
                tracing::error!(
                    "tenant {} is attached to pageserver {node}, which is offline, and cannot fail over: its secondary ({}) is not online",
                    a.tenant_id,
                    a.secondary.map_or("none".to_string(), |s| s.to_string())
                );
            }
        }
    }
    // Secondaries on offline nodes are replaced, and tenants without one get one when a
    // node can take it.
    for t in ctl.db.replace_secondaries(&ctl.instance, &offline, choose).await? {
        tracing::info!(
            "tenant {} has a new secondary: {}",
            t.tenant_id,
            t.secondary.as_ref().map_or("none (no other pageserver is online)".to_string(), |s| format!("pageserver {}", s.node_id))
        );
    }
    // Orders only to nodes that answered this round, from the placements as they are now,
    // after planned migrations moved on.
    if !held.is_empty() && ctl.is_leader() {
        let mut placements = ctl.db.tenants().await?;
        if placements.iter().any(|t| t.migration.is_some()) {
            let ready = crate::migration::ready(&placements, &held, &mut ctl.migration_marks.lock().expect("not poisoned"));
            let steps = ctl.db.advance_migrations(&ctl.instance, &ready, ctl.config.cutover_grace, ctl.config.migration_timeout).await?;
            let (cut, ended) = (&steps.cut_over, &steps.ended);
            for t in &steps.abandoned {
                ctl.metrics.migrations.with_label_values(&["abandoned"]).inc();
                tracing::warn!(
                    "tenant {}: the migration did not cut over within {:?} (the destination never caught up): back on pageserver {} with generation {}",
                    t.tenant_id,
                    ctl.config.migration_timeout,
                    t.attached.node_id,
                    t.generation
                );
            }
            for tenant in cut {
                ctl.metrics.migrations.with_label_values(&["cut_over"]).inc();
                let to = placements.iter().find(|t| t.tenant_id == *tenant).map_or(0, |t| t.attached.node_id);
                tracing::info!("tenant {tenant}: the migration to pageserver {to} cut over (it has caught up): computes read from it now");
            }
            for t in ended {
                ctl.metrics.migrations.with_label_values(&["ended"]).inc();
                tracing::info!(
                    "tenant {}: the migration to pageserver {} is done; the source, pageserver {}, holds it as its secondary",
                    t.tenant_id,
                    t.attached.node_id,
                    t.secondary.as_ref().map_or(0, |s| s.node_id)
                );
            }
            if !cut.is_empty() || !ended.is_empty() || !steps.abandoned.is_empty() {
                placements = ctl.db.tenants().await?;
            }
        }
        let online: Vec<(u64, String)> = nodes.iter().map(|n| (n.node.node_id, n.node.http_addr.clone())).collect();
        crate::reconcile::send(ctl, &online, &held, &placements);
    }
    Ok(())
}

/// Records the answers; returns the nodes offline now and every node not online.
fn record(ctl: &Controller, nodes: &[NodeRow], answers: Vec<(u64, Result<(), String>)>) -> (Vec<u64>, Vec<u64>) {
    let now = Instant::now();
    let mut health = ctl.health.lock().expect("not poisoned");
    let (mut offline, mut unusable) = (Vec::new(), Vec::new());
    for (id, answer) in answers {
        let h = health.entry(id).or_insert(Health { availability: Availability::Unknown, last_ok: now, missed: 0 });
        let before = h.availability;
        match answer {
            Ok(()) => {
                h.last_ok = now;
                h.missed = 0;
                h.availability = Availability::Online;
            }
            Err(e) => {
                ctl.metrics.heartbeat_failures.inc();
                h.missed += 1;
                if h.missed >= 2 && now.duration_since(h.last_ok) >= ctl.config.offline_after {
                    h.availability = Availability::Offline;
                } else {
                    tracing::debug!("pageserver {id} did not answer a heartbeat: {e}");
                }
                if h.availability == Availability::Offline && before != Availability::Offline {
                    tracing::warn!(
                        "pageserver {id} is offline: no answer for {:?}, {} heartbeats in a row (last: {e})",
                        now.duration_since(h.last_ok),
                        h.missed
                    );
                }
            }
        }
        if h.availability == Availability::Online && before == Availability::Offline {
            tracing::info!("pageserver {id} is online again");
        }
        if h.availability == Availability::Offline {
            offline.push(id);
        }
        if h.availability != Availability::Online {
            unusable.push(id);
        }
    }
    health.retain(|id, _| nodes.iter().any(|n| n.node.node_id == *id));
    let count = |a| health.values().filter(|h| h.availability == a).count() as i64;
    for a in [Availability::Online, Availability::Offline, Availability::Unknown] {
        ctl.metrics.nodes.with_label_values(&[availability_label(a)]).set(count(a));
    }
    (offline, unusable)
}

pub fn availability_label(a: Availability) -> &'static str {
    match a {
        Availability::Online => "online",
        Availability::Offline => "offline",
        Availability::Unknown => "unknown",
    }
}

/// The scheduler's view of `loads` with the availability in `seen` (unknown if absent).
pub fn candidates(seen: &HashMap<u64, Availability>, loads: &[NodeRow]) -> Vec<Candidate> {
    loads
        .iter()
        .map(|n| Candidate {
            node_id: n.node.node_id,
            availability: seen.get(&n.node.node_id).copied().unwrap_or(Availability::Unknown),
            attached: n.attached,
            secondaries: n.secondaries,
        })
        .collect()
}

/// The longest a dead pageserver goes unnoticed with this configuration.
pub fn detection_bound(ctl: &Controller) -> Duration {
    ctl.config.offline_after + ctl.config.heartbeat_interval + ctl.config.heartbeat_timeout
}
