//! Where a tenant goes: the placement choices, as pure functions of what the controller
//! knows about each node (tested without a database or a network).

use crate::models::Availability;

/// A node's load and health as the scheduler sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub node_id: u64,
    pub availability: Availability,
    pub attached: u64,
    pub secondaries: u64,
}

/// The attached node and the secondary for a new tenant: the online node with the fewest
/// attached tenants (then the fewest secondaries, then the lowest id), and among the other
/// online nodes the one holding the fewest tenants in all. None without an online node; no
/// secondary with only one.
pub fn place(nodes: &[Candidate]) -> Option<(u64, Option<u64>)> {
    let attached =
        nodes.iter().filter(|n| n.availability == Availability::Online).min_by_key(|n| (n.attached, n.secondaries, n.node_id))?;
    Some((attached.node_id, secondary_for(nodes, attached.node_id)))
}

/// A new secondary for a tenant attached to `attached`: the online node other than it that
/// holds the fewest tenants in all (then the lowest id).
pub fn secondary_for(nodes: &[Candidate], attached: u64) -> Option<u64> {
    nodes
        .iter()
        .filter(|n| n.availability == Availability::Online && n.node_id != attached)
        .min_by_key(|n| (n.attached + n.secondaries, n.node_id))
        .map(|n| n.node_id)
}

#[cfg(test)]
mod tests;
