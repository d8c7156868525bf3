//! Scripted scenarios for the consensus core: exact message schedules the random
//! simulation is unlikely to produce.

use proto::Lsn;
use safekeeper::consensus::{Acceptor, AcceptorAction, AcceptorState, Proposer, ProposerAction, Record, ToAcceptor};
use std::collections::{BTreeMap, VecDeque};

struct Cluster {
    acceptors: Vec<Acceptor>,
    /// Records any proposer reported committed, by start LSN.
    committed: BTreeMap<Lsn, Record>,
}

impl Cluster {
    fn new() -> Cluster {
        Cluster { acceptors: (0..3).map(|_| Acceptor::new(AcceptorState::default())).collect(), committed: BTreeMap::new() }
    }

    /// Delivers everything `actions` lead to, reliably, until quiet. `filter` decides what
    /// reaches which acceptor, and may shorten a message.
    fn run(
        &mut self,
        p: &mut Proposer,
        actions: Vec<ProposerAction>,
        filter: &dyn Fn(usize, ToAcceptor) -> Option<ToAcceptor>,
    ) {
        let mut queue: VecDeque<ProposerAction> = actions.into();
        while let Some(a) = queue.pop_front() {
            match a {
                ProposerAction::Send(to, msg) => {
                    let Some(msg) = filter(to, msg) else { continue };
                    for r in self.acceptors[to].handle(msg) {
                        if let AcceptorAction::Reply(reply) = r {
                            queue.extend(p.handle(to, reply));
                        }
                    }
                }
                ProposerAction::Commit { commit_lsn, .. } => {
                    for r in p.log().unwrap().iter().take_while(|r| r.end <= commit_lsn) {
                        let prev = self.committed.insert(r.start, r.clone());
                        assert!(prev.is_none_or(|c| c == *r), "conflicting commits at {:?}", r.start);
                    }
                }
                ProposerAction::Elected { .. } | ProposerAction::SteppedDown { .. } => {}
            }
        }
    }

    fn assert_committed_in(&self, p: &Proposer) {
        let log = p.log().expect("elected with its log");
        for c in self.committed.values() {
            assert!(log.contains(c), "committed {c:?} missing from the new leader's log {log:?}");
        }
    }
}

fn only(nodes: &'static [usize]) -> impl Fn(usize, ToAcceptor) -> Option<ToAcceptor> {
    move |to, msg| nodes.contains(&to).then_some(msg)
}

fn append(c: &mut Cluster, p: &mut Proposer, payload: u64, to: &'static [usize]) {
    let (_, _, actions) = p.append(payload, 10).expect("leader");
    c.run(p, actions, &only(to));
}

/// The donor is the log with the highest last term, not the longest one.
#[test]
fn donor_is_chosen_by_last_log_term_first() {
    let mut c = Cluster::new();
    let mut p1 = Proposer::new(3);
    let a = p1.start_election();
    c.run(&mut p1, a, &only(&[0, 1, 2]));
    append(&mut c, &mut p1, 1, &[0, 1, 2]);
    // Term 1 writes three more records to acceptor 0 only.
    for id in 2..5 {
        append(&mut c, &mut p1, id, &[0]);
    }
    // Term 2 is elected by 1 and 2 and commits a record there.
    let mut p2 = Proposer::new(3);
    let a = p2.start_election();
    c.run(&mut p2, a, &only(&[1, 2]));
    append(&mut c, &mut p2, 10, &[1, 2]);
    assert!(c.committed.values().any(|r| r.payload == 10));
    // Term 3 is elected by 0 (longest log, term 1) and 1 (shorter, term 2).
    let mut p3 = Proposer::new(3);
    let a = p3.start_election();
    c.run(&mut p3, a, &only(&[0, 1]));
    assert_eq!(p3.term(), 3);
    c.assert_committed_in(&p3);
    // Acceptor 0 dropped term 1's uncommitted tail and took term 2's record.
    let wal: Vec<u64> = c.acceptors[0].state().wal.iter().map(|r| r.payload).collect();
    assert_eq!(wal, vec![1, 10]);
}

/// Raft's "figure 8": a leader must not count records of earlier terms as committed before
/// a majority reached its own start LSN.
#[test]
fn no_commit_below_own_start_lsn() {
    let mut c = Cluster::new();
    let mut p1 = Proposer::new(3);
    let a = p1.start_election();
    c.run(&mut p1, a, &only(&[0, 1, 2]));
    append(&mut c, &mut p1, 1, &[0, 1, 2]); // 0..10 everywhere
    append(&mut c, &mut p1, 2, &[0]); // 10..20 on 0
    append(&mut c, &mut p1, 3, &[0]); // 20..30 on 0
    // Term 2 gets votes from 1 and 2, but only 2 hears it was elected; it writes on 2.
    let mut p2 = Proposer::new(3);
    let a = p2.start_election();
    let term2_reaches_only_2 = |to: usize, msg: ToAcceptor| match (to, &msg) {
        (0, _) => None,
        (1, ToAcceptor::Elected { .. } | ToAcceptor::Append { .. }) => None,
        _ => Some(msg),
    };
    c.run(&mut p2, a, &term2_reaches_only_2);
    append(&mut c, &mut p2, 20, &[2]); // 10..20 on 2, term 2
    // Term 3 is elected by 0 and 1 with 0's log (start LSN 30); 1 receives only up to 20.
    let mut p3 = Proposer::new(3);
    let a = p3.start_election();
    let to_1_up_to_20 = |to: usize, msg: ToAcceptor| match (to, msg) {
        (2, _) => None,
        (1, ToAcceptor::Append { term, begin_lsn, mut records, commit_lsn }) => {
            records.retain(|r| r.end <= Lsn(20));
            Some(ToAcceptor::Append { term, begin_lsn, records, commit_lsn })
        }
        (_, msg) => Some(msg),
    };
    c.run(&mut p3, a, &to_1_up_to_20);
    assert_eq!(p3.term(), 3);
    assert_eq!(p3.commit_lsn(), Some(Lsn(0)), "10..20 is on a majority, but only in term 1");
    // Term 4 is elected by 1 (last term 1, flush 20) and 2 (last term 2, flush 20): 2's log.
    let a = p2.start_election();
    c.run(&mut p2, a, &only(&[1, 2]));
    assert_eq!(p2.term(), 4);
    c.assert_committed_in(&p2);
}

/// A duplicate of an election the acceptor already took does not truncate WAL written since.
#[test]
fn duplicate_elected_does_not_truncate() {
    let mut c = Cluster::new();
    let mut p = Proposer::new(3);
    let a = p.start_election();
    let seen = std::cell::RefCell::new(Vec::new());
    let record_elected = |to: usize, msg: ToAcceptor| {
        if matches!(msg, ToAcceptor::Elected { .. }) {
            seen.borrow_mut().push((to, msg.clone()));
        }
        Some(msg)
    };
    c.run(&mut p, a, &record_elected);
    let elected_msgs = seen.into_inner();
    assert_eq!(elected_msgs.len(), 3);
    append(&mut c, &mut p, 1, &[0, 1, 2]);
    let before = c.acceptors[0].state().clone();
    assert_eq!(before.wal.len(), 1);
    for (to, m) in elected_msgs {
        c.acceptors[to].handle(m);
    }
    assert_eq!(c.acceptors[0].state(), &before);
}

/// A vote is persisted before it is answered, and a term is voted for at most once.
#[test]
fn vote_persisted_before_reply_and_only_once() {
    let mut a = Acceptor::new(AcceptorState::default());
    let acts = a.handle(ToAcceptor::VoteRequest { term: 5 });
    assert!(matches!(acts[0], AcceptorAction::Persist(_)));
    assert!(matches!(acts[1], AcceptorAction::Reply(safekeeper::consensus::ToProposer::Vote { granted: true, .. })));
    let acts = a.handle(ToAcceptor::VoteRequest { term: 5 });
    assert!(matches!(acts[..], [AcceptorAction::Reply(safekeeper::consensus::ToProposer::Vote { granted: false, .. })]));
}
