//! Scripted scenarios of acceptors that join a term after its election: an acceptor
//! unreachable during the whole election, one whose vote was lost, a learner that
//! reconnects, a learner that graduates. Which of them count towards the term's commits is
//! the crate's rule 5 and "Late voters" (`lib.rs`). If an acceptor that did not vote in
//! time counted only from the next election, a compute that started while one safekeeper
//! was down would stop committing when another one failed later: these tests fail then.

mod support;

use proto::Lsn;
use quorum::{AcceptorAction, ProposerConfig, ProposerMode, ToAcceptor, ToProposer};
use std::cell::RefCell;
use support::cluster::{append, lsn, only, proposer, proposer_in, tick, wipe, Cluster};
use support::WAL_START;

/// A compute starts while acceptor 2 is down (elected by 0 and 1), 2 comes back (its
/// connection too) and catches up, then 0 goes down: 1 and 2 commit on. Were 2 counted only
/// from the next election, commits would stop until the compute restarted.
#[test]
fn an_acceptor_away_during_the_election_counts_once_it_is_back() {
    let mut c = Cluster::new();
    let mut p = proposer_in(ProposerMode::Compute, WAL_START, ProposerConfig::default());
    c.elect(&mut p, &only(&[0, 1]));
    assert!(p.core.is_leader());
    append(&mut c, &mut p, 1, &[0, 1]);
    append(&mut c, &mut p, 2, &[0, 1]);
    assert_eq!(c.committed.len(), 20);
    assert_eq!(c.disks[2].state.term, 0, "acceptor 2 heard nothing of the election");
    // Acceptor 2 is back: the shell reconnects, it joins and catches up.
    let a = p.core.reconnected(2);
    c.run(&mut p, a, &only(&[0, 1, 2]));
    assert_eq!(c.disks[2].state.flush_lsn, lsn(20));
    // Acceptor 0 goes down: 1 and 2 are a majority of voters.
    append(&mut c, &mut p, 3, &[1, 2]);
    assert_eq!(p.core.commit_lsn(), Some(lsn(30)), "commits go on with 1 and 2");
    assert_eq!(c.committed.len(), 30);
    assert_eq!(c.wal(2), c.wal(1));
}

/// The same with no reconnect: acceptor 2 only starts answering, and the leader's tick
/// reaches it (it resends the election, and greets it).
#[test]
fn an_acceptor_away_during_the_election_counts_once_a_tick_reaches_it() {
    let mut c = Cluster::new();
    let mut p = proposer();
    c.elect(&mut p, &only(&[0, 1]));
    append(&mut c, &mut p, 1, &[0, 1]);
    tick(&mut c, &mut p, &only(&[0, 1, 2]));
    assert_eq!(c.disks[2].state.flush_lsn, lsn(10));
    append(&mut c, &mut p, 2, &[1, 2]);
    assert_eq!(p.core.commit_lsn(), Some(lsn(20)));
}

/// An acceptor that took the election but whose vote the leader never got (here the vote
/// request was lost and the election reached it; a vote reply lost on a broken connection
/// ends the same way) is at the term already: a vote request sent now would be refused, so
/// a late vote could not make it count. Its greeting, which says it is no learner, does:
/// it persisted the term in this incarnation before it acknowledged anything.
#[test]
fn an_acceptor_that_joined_without_its_vote_counts_once_greeted() {
    let mut c = Cluster::new();
    let mut p = proposer();
    c.elect(&mut p, &|to, m| (to != 2 || !matches!(m, ToAcceptor::VoteRequest { .. })).then_some(m));
    assert!(p.core.is_leader());
    let term = p.core.term();
    assert_eq!(c.disks[2].state.term, term, "acceptor 2 took the election without voting");
    let refused = c.nodes[2].acceptor.clone().handle(ToAcceptor::VoteRequest { term, proposer: 99 });
    assert!(
        matches!(refused[..], [AcceptorAction::Reply(ToProposer::Vote { granted: false, .. })]),
        "a late vote request is refused: {refused:?}"
    );
    append(&mut c, &mut p, 1, &[0, 1, 2]);
    append(&mut c, &mut p, 2, &[1, 2]);
    assert_eq!(p.core.commit_lsn(), Some(lsn(20)));
}

/// A learner (acceptor 2 lost its disk) that reconnects to a sitting leader stays out of
/// its term, and so never counts: the leader asks for no vote once elected (a vote request
/// would let the learner join a term in which its earlier incarnation may have acknowledged
/// WAL, or graduate in a term below one that incarnation voted in), and greets it instead;
/// the greeting says it is a learner. With acceptor 0 down, nothing commits.
#[test]
fn a_learner_that_reconnects_to_a_leader_stays_out_and_does_not_count() {
    let mut c = Cluster::new();
    let mut p = proposer();
    c.elect(&mut p, &only(&[0, 1, 2]));
    append(&mut c, &mut p, 1, &[0, 1, 2]);
    wipe(&mut c, 2);
    let sent = RefCell::new(Vec::new());
    let record_sent = |to: usize, m: ToAcceptor| {
        sent.borrow_mut().push((to, m.clone()));
        (to != 0).then_some(m)
    };
    let a = p.core.reconnected(2);
    c.run(&mut p, a, &record_sent);
    tick(&mut c, &mut p, &record_sent);
    let end = p.store.client_append(&support::record(2, 10));
    let a = p.core.append(end, end);
    c.run(&mut p, a, &record_sent);
    tick(&mut c, &mut p, &record_sent);
    let sent = sent.into_inner();
    assert!(sent.iter().any(|(to, m)| *to == 2 && matches!(m, ToAcceptor::Greeting { .. })), "the learner is greeted");
    assert!(!sent.iter().any(|(_, m)| matches!(m, ToAcceptor::VoteRequest { .. })), "a leader asks for no vote");
    let s = &c.disks[2].state;
    assert!(s.learner && s.term == 0 && s.flush_lsn == Lsn(0), "the learner stayed out: {s:?}");
    assert_eq!(p.core.commit_lsn(), Some(lsn(10)), "one voter is no commit quorum");
    assert_eq!(c.committed.len(), 10);
}

/// A learner that joined the election it saw begin, caught up and graduated in the term
/// (every acceptor acknowledged the term's start) is a voter: its next greeting says so,
/// and it counts from then on, not only from the next election.
#[test]
fn a_learner_that_graduates_in_the_term_counts_once_greeted() {
    let mut c = Cluster::new();
    wipe(&mut c, 2);
    let mut p = proposer();
    c.elect(&mut p, &only(&[0, 1, 2]));
    assert!(p.core.is_leader());
    assert_eq!(c.disks[2].state.term, p.core.term(), "the learner joined the election it saw begin");
    // Its record's commit carries a peer horizon at the term's start (every acceptor
    // acknowledged it): the learner graduates. The next tick greets it.
    append(&mut c, &mut p, 1, &[0, 1, 2]);
    assert!(!c.disks[2].state.learner);
    tick(&mut c, &mut p, &only(&[0, 1, 2]));
    append(&mut c, &mut p, 2, &[1, 2]);
    assert_eq!(p.core.commit_lsn(), Some(lsn(20)));
}
