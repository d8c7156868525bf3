//! Planned migrations (`POST /v1/tenant/{id}/migrate`), as the leader's heartbeat rounds
//! move them on. A migration starts in one transaction ([`crate::persistence::Db::start_migration`]):
//! the destination becomes the attached node with the generation raised, the source is
//! recorded as `migrating_from` and keeps its attachment (its older generation is
//! superseded as soon as the destination uploads its index: it still ingests WAL and serves
//! reads, but writes nothing to object storage), and computes keep reading from it. Then,
//! round by round:
//! 1. **Warm**: the reconcile orders the destination to attach; it loads the tenant from
//!    object storage and follows the safekeepers.
//! 2. **Cut over** once the destination holds the tenant with the new generation and every
//!    timeline has ingested at least what the source had at the previous round ([`ready`]):
//!    computes are told the destination (they poll the controller) and read from it with
//!    no failed query, since both serve the same LSNs meanwhile.
//! 3. **End** `cutover_grace` after the cutover (computes have had time to move): the source
//!    becomes the tenant's secondary, and the reconcile orders it so.
//!
//! A destination that dies during a migration fails the tenant back to its source (warm,
//! still holding it); a source that dies or restarts cuts over at once. A migration started
//! while no controller leads waits; one in progress survives a change of leader (its state
//! is in the database; the catch-up check starts afresh).

use std::collections::HashMap;

use pageserver_api::models::{LocationList, LocationMode, TimelineIngested};
use proto::TenantId;

use crate::models::TenantLocation;

/// What a node's answer says it has ingested of `tenant`, if it holds it attached with
/// `generation` (any generation if `None`).
fn ingested(answer: Option<&LocationList>, tenant: TenantId, generation: Option<u32>) -> Option<Vec<TimelineIngested>> {
    answer?
        .tenants
        .iter()
        .find(|t| t.tenant_id == tenant && t.mode == LocationMode::Attached && generation.is_none_or(|g| g == t.generation))
        .map(|t| t.timelines.clone())
}

/// What a migration's source had ingested at a round, and which migration that was (its
/// source and generation): a mark of another migration is never compared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mark {
    pub from: u64,
    pub generation: u32,
    pub timelines: Vec<TimelineIngested>,
}

/// The migrations that may cut over now: (tenant, generation). `marks` holds, per tenant,
/// what its source had ingested at the previous round, and is updated from this round's
/// answers. A destination that has caught up with the source's previous answer is close
/// behind it: both follow the same safekeepers.
pub fn ready(
    placements: &[TenantLocation],
    answers: &HashMap<u64, LocationList>,
    marks: &mut HashMap<TenantId, Mark>,
) -> Vec<(TenantId, u32)> {
    let mut out = Vec::new();
    let mut seen = Vec::new();
    for t in placements {
        let Some(m) = t.migration.as_ref().filter(|m| !m.cut_over) else { continue };
        seen.push(t.tenant_id);
        let source_now = ingested(answers.get(&m.from.node_id), t.tenant_id, None);
        let dest = ingested(answers.get(&t.attached.node_id), t.tenant_id, Some(t.generation));
        let mark = marks.get(&t.tenant_id).filter(|k| k.from == m.from.node_id && k.generation == t.generation);
        let caught_up = match (&dest, mark) {
            (Some(dest), Some(before)) => before
                .timelines
                .iter()
                .all(|b| dest.iter().any(|d| d.timeline_id == b.timeline_id && d.last_record_lsn >= b.last_record_lsn)),
            // The source answered nothing last round, or holds the tenant no more: nothing
            // to catch up with but the destination's attachment.
            (Some(_), None) => answers.contains_key(&m.from.node_id) && source_now.is_none(),
            (None, _) => false,
        };
        if caught_up {
            out.push((t.tenant_id, t.generation));
        }
        match source_now {
            Some(timelines) => {
                marks.insert(t.tenant_id, Mark { from: m.from.node_id, generation: t.generation, timelines });
            }
            None => {
                marks.remove(&t.tenant_id);
            }
        }
    }
    marks.retain(|id, _| seen.contains(id));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::{Migration, NodeLocation};
    use pageserver_api::models::TenantLocationState;
    use proto::{Lsn, TimelineId};

    fn node(id: u64) -> NodeLocation {
        NodeLocation { node_id: id, http_addr: format!("h{id}:1"), page_addr: format!("h{id}:2") }
    }

    fn answer(node: u64, generation: u32, lsn: u64) -> LocationList {
        LocationList {
            node_id: Some(node),
            joined: true,
            tenants: vec![TenantLocationState {
                tenant_id: TenantId::from_bytes([1; 16]),
                mode: LocationMode::Attached,
                generation,
                timelines: vec![TimelineIngested { timeline_id: TimelineId::from_bytes([2; 16]), last_record_lsn: Lsn(lsn) }],
                warm: None,
            }],
        }
    }

    #[test]
    fn cuts_over_once_the_destination_has_what_the_source_had_a_round_before() {
        let t = TenantLocation {
            tenant_id: TenantId::from_bytes([1; 16]),
            generation: 5,
            attached: node(2),
            secondary: None,
            migration: Some(Migration { from: node(1), cut_over: false }),
        };
        let placements = [t];
        let mut marks = HashMap::new();
        // First round: no earlier mark of the source, the destination not attached yet.
        let answers = HashMap::from([(1, answer(1, 4, 100)), (2, LocationList { node_id: Some(2), joined: true, tenants: vec![] })]);
        assert!(ready(&placements, &answers, &mut marks).is_empty());
        // Attached, but behind what the source had.
        let answers = HashMap::from([(1, answer(1, 4, 200)), (2, answer(2, 5, 50))]);
        assert!(ready(&placements, &answers, &mut marks).is_empty());
        // Attached with an older generation does not count.
        let answers = HashMap::from([(1, answer(1, 4, 300)), (2, answer(2, 4, 300))]);
        assert!(ready(&placements, &answers, &mut marks).is_empty());
        // Caught up with the previous round's 300, though the source moved on.
        let answers = HashMap::from([(1, answer(1, 4, 400)), (2, answer(2, 5, 300))]);
        assert_eq!(ready(&placements, &answers, &mut marks), vec![(placements[0].tenant_id, 5)]);
        // Marks of tenants no longer migrating are dropped.
        assert!(ready(&[], &answers, &mut marks).is_empty());
        assert!(marks.is_empty());
    }

    #[test]
    fn a_mark_of_another_migration_is_never_compared() {
        let mut t = TenantLocation {
            tenant_id: TenantId::from_bytes([1; 16]),
            generation: 7,
            attached: node(1),
            secondary: None,
            migration: Some(Migration { from: node(2), cut_over: false }),
        };
        // Left from an earlier migration from node 1 at generation 5, far behind.
        let old = Mark { from: 1, generation: 5, timelines: answer(1, 4, 100).tenants[0].timelines.clone() };
        let mut marks = HashMap::from([(t.tenant_id, old)]);
        let answers = HashMap::from([(2, answer(2, 6, 500)), (1, answer(1, 7, 150))]);
        assert!(ready(std::slice::from_ref(&t), &answers, &mut marks).is_empty(), "compared with a mark of another migration");
        // The next round compares with this migration's own mark (500).
        let answers = HashMap::from([(2, answer(2, 6, 600)), (1, answer(1, 7, 500))]);
        assert_eq!(ready(std::slice::from_ref(&t), &answers, &mut marks), vec![(t.tenant_id, 7)]);
        t.migration = None;
        assert!(ready(std::slice::from_ref(&t), &answers, &mut marks).is_empty());
    }
}
