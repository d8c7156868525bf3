//! Scripted scenarios for the consensus core: exact message schedules the random
//! simulation is unlikely to produce.

mod support;

use proto::Lsn;
use quorum::{Acceptor, AcceptorAction, AcceptorState, Proposer, ProposerAction, ProposerConfig, ToAcceptor, ToProposer};
use std::collections::{BTreeMap, VecDeque};
use support::{record, Disk, Node, Store, Wal, WAL_START};

struct Cluster {
    nodes: Vec<Node>,
    disks: Vec<Disk>,
    /// The committed WAL from WAL_START.
    committed: Vec<u8>,
}

/// A proposer with its WAL store.
struct P {
    core: Proposer,
    store: Store,
    ghosts: BTreeMap<usize, Wal>,
}

fn proposer() -> P {
    P { core: Proposer::new(3, WAL_START, ProposerConfig::default()), store: Store::default(), ghosts: BTreeMap::new() }
}

type Filter<'a> = &'a dyn Fn(usize, ToAcceptor) -> Option<ToAcceptor>;

impl Cluster {
    fn new() -> Cluster {
        let disks = vec![Disk::default(); 3];
        Cluster { nodes: disks.iter().map(Node::start).collect(), disks, committed: Vec::new() }
    }

    /// Delivers everything `actions` lead to, reliably, until quiet. `filter` decides what
    /// reaches which acceptor, and may change a message.
    fn run(&mut self, p: &mut P, actions: Vec<ProposerAction>, filter: Filter) {
        let mut queue: VecDeque<ProposerAction> = actions.into();
        while let Some(a) = queue.pop_front() {
            if let Some((to, msg)) = p.store.message(&a).unwrap() {
                let Some(msg) = filter(to, msg) else { continue };
                let (replies, _) = self.nodes[to].handle(&mut self.disks[to], msg, None).unwrap();
                for reply in replies {
                    if matches!(reply, ToProposer::Vote { .. }) {
                        p.ghosts.insert(to, self.disks[to].wal.clone());
                    }
                    queue.extend(p.core.handle(to, reply));
                }
                continue;
            }
            match a {
                ProposerAction::Elected { start_lsn, donor, .. } => {
                    let g = p.ghosts[&donor].clone();
                    p.store.elected(start_lsn, &g).unwrap();
                }
                ProposerAction::Commit { commit_lsn, .. } => {
                    let log = p.store.committed(commit_lsn).unwrap();
                    let n = log.len().min(self.committed.len());
                    assert_eq!(log[..n], self.committed[..n], "conflicting commits");
                    if log.len() > self.committed.len() {
                        self.committed = log.to_vec();
                    }
                }
                _ => {}
            }
        }
    }

    fn elect(&mut self, p: &mut P, filter: Filter) {
        p.ghosts.clear();
        let a = p.core.start_election();
        self.run(p, a, filter);
    }

    fn wal(&self, a: usize) -> &[u8] {
        &self.disks[a].wal.bytes
    }
}

fn only(nodes: &'static [usize]) -> impl Fn(usize, ToAcceptor) -> Option<ToAcceptor> {
    move |to, msg| nodes.contains(&to).then_some(msg)
}

/// Appends a 10-byte record with payload `id`, delivered to `to` only.
fn append(c: &mut Cluster, p: &mut P, id: u64, to: &'static [usize]) {
    let end = p.store.client_append(&record(id, 10));
    let a = p.core.append(end);
    c.run(p, a, &only(to));
}

fn lsn(offset: u64) -> Lsn {
    Lsn(WAL_START.0 + offset)
}

/// The donor is the log with the highest last term, not the longest one.
#[test]
fn donor_is_chosen_by_last_log_term_first() {
    let mut c = Cluster::new();
    let mut p1 = proposer();
    c.elect(&mut p1, &only(&[0, 1, 2]));
    append(&mut c, &mut p1, 1, &[0, 1, 2]);
    // Term 1 writes three more records to acceptor 0 only.
    for id in 2..5 {
        append(&mut c, &mut p1, id, &[0]);
    }
    // Term 2 is elected by 1 and 2 and commits a record there.
    let mut p2 = proposer();
    c.elect(&mut p2, &only(&[1, 2]));
    append(&mut c, &mut p2, 10, &[1, 2]);
    assert_eq!(c.committed.len(), 20);
    // Term 3 is elected by 0 (longest log, term 1) and 1 (shorter, term 2).
    let mut p3 = proposer();
    c.elect(&mut p3, &only(&[0, 1]));
    assert_eq!(p3.core.term(), 3);
    assert_eq!(p3.core.wal_range(), Some((lsn(20), lsn(20))), "term 3 continues term 2's log");
    // Acceptor 0 dropped term 1's uncommitted tail and took term 2's record.
    let mut expected = record(1, 10);
    expected.extend(record(10, 10));
    assert_eq!(c.wal(0), &expected[..]);
    assert_eq!(c.committed, expected);
}

/// Raft's "figure 8": a leader must not count WAL of earlier terms as committed before a
/// majority reached its own start LSN.
#[test]
fn no_commit_below_own_start_lsn() {
    let mut c = Cluster::new();
    let mut p1 = proposer();
    c.elect(&mut p1, &only(&[0, 1, 2]));
    append(&mut c, &mut p1, 1, &[0, 1, 2]); // +0..10 everywhere
    append(&mut c, &mut p1, 2, &[0]); // +10..20 on 0
    append(&mut c, &mut p1, 3, &[0]); // +20..30 on 0
                                      // Term 2 gets votes from 1 and 2, but only 2 hears it was elected; it writes on 2.
    let mut p2 = proposer();
    let term2_reaches_only_2 = |to: usize, msg: ToAcceptor| match (to, &msg) {
        (0, _) => None,
        (1, ToAcceptor::Elected { .. } | ToAcceptor::Append { .. }) => None,
        _ => Some(msg),
    };
    c.elect(&mut p2, &term2_reaches_only_2);
    append(&mut c, &mut p2, 20, &[2]); // +10..20 on 2, term 2
                                       // Term 3 is elected by 0 and 1 with 0's log (start +30); 1 receives only up to +20.
    let mut p3 = proposer();
    let to_1_up_to_20 = |to: usize, msg: ToAcceptor| match (to, msg) {
        (2, _) => None,
        (1, ToAcceptor::Append { term, begin_lsn, data, commit_lsn }) => {
            let keep = (lsn(20).0.saturating_sub(begin_lsn.0) as usize).min(data.len());
            Some(ToAcceptor::Append { term, begin_lsn, data: data.slice(..keep), commit_lsn })
        }
        (_, msg) => Some(msg),
    };
    c.elect(&mut p3, &to_1_up_to_20);
    assert_eq!(p3.core.term(), 3);
    assert_eq!(c.disks[1].state.flush_lsn, lsn(20));
    assert_eq!(p3.core.commit_lsn(), Some(Lsn(0)), "+10..20 is on a majority, but only in term 1");
    // Term 4 is elected by 1 (last term 3, flush +20) and 2 (last term 2, flush +20).
    c.elect(&mut p2, &only(&[1, 2]));
    assert_eq!(p2.core.term(), 4);
    // Whatever was committed is in the new leader's log.
    let log = p2.store.committed(Lsn(WAL_START.0 + c.committed.len() as u64)).unwrap();
    assert_eq!(log, &c.committed[..]);
}

/// A duplicate of an election the acceptor already took does not truncate WAL written since.
#[test]
fn duplicate_elected_does_not_truncate() {
    let mut c = Cluster::new();
    let mut p = proposer();
    let seen = std::cell::RefCell::new(Vec::new());
    let record_elected = |to: usize, msg: ToAcceptor| {
        if matches!(msg, ToAcceptor::Elected { .. }) {
            seen.borrow_mut().push((to, msg.clone()));
        }
        Some(msg)
    };
    c.elect(&mut p, &record_elected);
    let elected_msgs = seen.into_inner();
    assert_eq!(elected_msgs.len(), 3);
    append(&mut c, &mut p, 1, &[0, 1, 2]);
    let before = c.nodes[0].acceptor.state().clone();
    assert_eq!(before.flush_lsn, lsn(10));
    for (to, m) in elected_msgs {
        let _ = c.nodes[to].handle(&mut c.disks[to], m, None).unwrap();
    }
    assert_eq!(c.nodes[0].acceptor.state(), &before);
    assert_eq!(c.wal(0), &record(1, 10)[..]);
}

/// An acceptor that missed WAL below the new leader's start gets it fetched from another
/// acceptor (the leader itself has no WAL before its start).
#[test]
fn lagging_acceptor_catches_up_from_a_donor() {
    let mut c = Cluster::new();
    let mut p1 = proposer();
    c.elect(&mut p1, &only(&[0, 1, 2]));
    for id in 1..=5 {
        append(&mut c, &mut p1, id, &[0, 1]);
    }
    assert_eq!(c.disks[2].state.flush_lsn, WAL_START);
    // A new proposer (a restarted compute) is elected; acceptor 2 is 50 bytes behind.
    let mut p2 = proposer();
    c.elect(&mut p2, &only(&[0, 1, 2]));
    assert_eq!(p2.core.wal_range(), Some((lsn(50), lsn(50))));
    assert_eq!(c.wal(2), c.wal(0), "acceptor 2 fetched what it missed through the leader");
    assert_eq!(c.nodes[2].acceptor.state().commit_lsn, lsn(50));
}

/// A vote is persisted before it is answered, and a term is voted for at most once.
#[test]
fn vote_persisted_before_reply_and_only_once() {
    let mut a = Acceptor::new(AcceptorState::default());
    let acts = a.handle(ToAcceptor::VoteRequest { term: 5 });
    assert!(matches!(acts[0], AcceptorAction::Persist(_)));
    assert!(matches!(acts[1], AcceptorAction::Reply(ToProposer::Vote { granted: true, .. })));
    let acts = a.handle(ToAcceptor::VoteRequest { term: 5 });
    assert!(matches!(acts[..], [AcceptorAction::Reply(ToProposer::Vote { granted: false, .. })]));
}

/// A proposer that finds no WAL anywhere and has none of its own (a sync of a new
/// timeline) wins but writes nothing: no history is sent.
#[test]
fn empty_sync_elects_nothing() {
    let mut c = Cluster::new();
    let mut p = P { core: Proposer::new(3, Lsn(0), ProposerConfig::default()), store: Store::default(), ghosts: BTreeMap::new() };
    p.ghosts.clear();
    let mut actions = p.core.start_election();
    let mut elected = None;
    let mut queue: VecDeque<ProposerAction> = actions.drain(..).collect();
    while let Some(a) = queue.pop_front() {
        match a {
            ProposerAction::Send(to, msg) => {
                let (replies, _) = c.nodes[to].handle(&mut c.disks[to], msg, None).unwrap();
                for r in replies {
                    queue.extend(p.core.handle(to, r));
                }
            }
            ProposerAction::Elected { start_lsn, .. } => elected = Some(start_lsn),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(elected, Some(Lsn(0)));
    assert!(!p.core.is_leader());
    assert!(c.disks.iter().all(|d| d.state.history.0.is_empty()));
}

/// WAL is sent in pieces that end where appends ended (a compute's record boundaries), even
/// when an append is larger than `max_append`: an acceptor's log never ends inside one.
#[test]
fn appends_are_sent_whole() {
    let mut c = Cluster::new();
    let config = ProposerConfig { max_append: 12, window: 1000, max_fetch: 12, ..ProposerConfig::default() };
    let mut p = P { core: Proposer::new(3, WAL_START, config), store: Store::default(), ghosts: BTreeMap::new() };
    c.elect(&mut p, &only(&[0, 1, 2]));
    let mut ends = vec![WAL_START];
    let mut queue: VecDeque<ProposerAction> = VecDeque::new();
    for (id, len) in [(1, 10), (2, 15), (3, 15), (4, 3), (5, 4)] {
        let end = p.store.client_append(&record(id, len));
        ends.push(end);
        queue.extend(p.core.append(end));
    }
    // Deliver one message at a time, checking every acceptor's end after each.
    while let Some(a) = queue.pop_front() {
        if let Some((to, msg)) = p.store.message(&a).unwrap() {
            if let ToAcceptor::Append { begin_lsn, data, .. } = &msg {
                let end = Lsn(begin_lsn.0 + data.len() as u64);
                assert!(ends.contains(&end), "a piece ends at {end}, inside an append (ends {ends:?})");
            }
            let (replies, _) = c.nodes[to].handle(&mut c.disks[to], msg, None).unwrap();
            for r in replies {
                queue.extend(p.core.handle(to, r));
            }
            for d in &c.disks {
                assert!(ends.contains(&d.state.flush_lsn), "an acceptor's WAL ends at {}", d.state.flush_lsn);
            }
        }
    }
    assert!(c.disks.iter().all(|d| d.state.flush_lsn == *ends.last().unwrap()));
}
