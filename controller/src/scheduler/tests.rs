use super::*;
use proptest::prelude::*;

fn node(node_id: u64, availability: Availability, attached: u64, secondaries: u64) -> Candidate {
    Candidate { node_id, availability, attached, secondaries }
}

#[test]
fn a_new_tenant_goes_to_the_least_attached_online_node_with_a_secondary_elsewhere() {
    let nodes = [
        node(1, Availability::Online, 3, 0),
        node(2, Availability::Online, 1, 5),
        node(3, Availability::Offline, 0, 0),
        node(4, Availability::Online, 1, 1),
    ];
    assert_eq!(place(&nodes), Some((4, Some(1))));
}

#[test]
fn no_online_node_places_nothing_and_one_gives_no_secondary() {
    assert_eq!(place(&[node(1, Availability::Offline, 0, 0), node(2, Availability::Unknown, 0, 0)]), None);
    assert_eq!(place(&[node(1, Availability::Offline, 0, 0), node(2, Availability::Online, 9, 9)]), Some((2, None)));
}

#[test]
fn a_secondary_is_never_the_attached_node_nor_offline() {
    let nodes = [node(1, Availability::Online, 0, 0), node(2, Availability::Offline, 0, 0)];
    assert_eq!(secondary_for(&nodes, 1), None);
    assert_eq!(secondary_for(&nodes, 2), Some(1));
}

fn availability() -> impl Strategy<Value = Availability> {
    prop_oneof![Just(Availability::Online), Just(Availability::Offline), Just(Availability::Unknown)]
}

proptest! {
    #[test]
    fn placement_is_always_on_distinct_online_nodes(
        nodes in proptest::collection::vec((availability(), 0u64..10, 0u64..10), 0..8)
    ) {
        let nodes: Vec<Candidate> = nodes.into_iter().enumerate().map(|(i, (a, at, se))| node(i as u64, a, at, se)).collect();
        let online = |id: u64| nodes.iter().any(|n| n.node_id == id && n.availability == Availability::Online);
        match place(&nodes) {
            None => prop_assert!(!nodes.iter().any(|n| n.availability == Availability::Online)),
            Some((attached, secondary)) => {
                prop_assert!(online(attached));
                let min = nodes.iter().filter(|n| online(n.node_id)).map(|n| n.attached).min().unwrap();
                prop_assert_eq!(nodes[attached as usize].attached, min);
                match secondary {
                    Some(s) => { prop_assert!(online(s)); prop_assert_ne!(s, attached); }
                    None => prop_assert_eq!(nodes.iter().filter(|n| online(n.node_id)).count(), 1),
                }
            }
        }
    }
}
