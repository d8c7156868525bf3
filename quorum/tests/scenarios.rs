//! Scripted scenarios for the consensus core: exact message schedules the random
//! simulation is unlikely to produce. The cluster they run on is `support/cluster.rs`.

mod support;

use proto::Lsn;
use quorum::{
    Acceptor, AcceptorAction, AcceptorState, FenceReason, Proposer, ProposerAction, ProposerConfig, ProposerMode, ToAcceptor, ToProposer,
};
use std::collections::{BTreeMap, VecDeque};
use support::cluster::{append, lsn, only, proposer, proposer_in, tick, wipe, Cluster, P};
use support::{is_record_boundary, record, Store, WAL_START};

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
        (1, ToAcceptor::Append { term, begin_lsn, data, boundary_lsn, commit_lsn, peer_horizon_lsn, remote_consistent_lsn }) => {
            let keep = (lsn(20).0.saturating_sub(begin_lsn.0) as usize).min(data.len());
            let boundary_lsn = boundary_lsn.min(lsn(20));
            Some(ToAcceptor::Append {
                term,
                begin_lsn,
                data: data.slice(..keep),
                boundary_lsn,
                commit_lsn,
                peer_horizon_lsn,
                remote_consistent_lsn,
            })
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

/// An acceptor away while the leader's own WAL loses its oldest bytes (a compute's `pg_wal`
/// loses segments at checkpoints) catches up in the same term, with that WAL fetched from
/// another acceptor a little at a time (never more than `max_fetched` held), and then from
/// the leader's own WAL again. A leader that sent only what its own WAL still had would
/// leave the acceptor waiting for the next election (`docs/decisions/0002-fetched-wal.md`).
#[test]
fn an_acceptor_behind_the_leaders_own_wal_catches_up_in_the_same_term() {
    let mut c = Cluster::new();
    let config = ProposerConfig { max_append: 10, window: 40, max_fetch: 16, max_fetched: 32, ..ProposerConfig::default() };
    let mut p = proposer_in(ProposerMode::Compute, WAL_START, config);
    p.store.fetched_max = 32;
    c.elect(&mut p, &only(&[0, 1, 2]));
    append(&mut c, &mut p, 1, &[0, 1, 2]); // +0..10 everywhere
    for id in 2..=30 {
        append(&mut c, &mut p, id, &[0, 1]); // up to +300 on 0 and 1
    }
    assert_eq!(p.core.commit_lsn(), Some(lsn(300)));
    // The compute keeps only its last 50 bytes; what a stream from 2's +10 would read is gone.
    p.store.drop_own_below(lsn(250));
    // (The leader does not know 2 is away: it fetches for it already, and those sends are
    // lost.)
    let removed = p.core.wal_removed_below(lsn(250));
    let events = c.run(&mut p, removed, &only(&[0, 1]));
    assert!(!events.iter().any(|a| matches!(a, ProposerAction::WalLost { .. })), "{events:?}");
    // Acceptor 2 is back (its connection too): the same leader brings it up to the end.
    let back = p.core.reconnected(2);
    let events = c.run(&mut p, back, &only(&[0, 1, 2]));
    assert_eq!(c.disks[2].state.flush_lsn, lsn(300));
    assert_eq!(c.wal(2), c.wal(0), "acceptor 2 holds the same log");
    assert!(!events.iter().any(|a| matches!(a, ProposerAction::Elected { .. })), "no new election");
    assert_eq!(p.core.term(), 1);
    // Fetched from +10 to the local floor, a fetch (16 bytes) at a time, never more than 32
    // held, released behind the acceptor; nothing kept once it caught up.
    assert!(p.store.fetched_above_start >= 240, "{} bytes fetched", p.store.fetched_above_start);
    assert!(p.store.fetched_peak <= 32, "{} fetched bytes held at once", p.store.fetched_peak);
    assert!(events.iter().filter(|a| matches!(a, ProposerAction::ReleaseWal { .. })).count() >= 240 / 32);
    assert!(p.core.catching_up().is_empty());
    let (begin, end) = p.core.fetched_wal().unwrap();
    assert_eq!(begin, end, "nothing fetched is kept");
    // It is a full member: with acceptor 1 away, 0 and 2 commit.
    append(&mut c, &mut p, 31, &[0, 2]);
    assert_eq!(p.core.commit_lsn(), Some(lsn(310)));
}

/// WAL the leader's own WAL has lost and that no acceptor acknowledged can never be
/// committed: the leader stops with `WalLost` instead of waiting forever.
#[test]
fn own_wal_gone_before_any_acceptor_has_it_stops_the_leader() {
    let mut c = Cluster::new();
    let mut p = proposer_in(ProposerMode::Compute, WAL_START, ProposerConfig::default());
    c.elect(&mut p, &only(&[0, 1, 2]));
    append(&mut c, &mut p, 1, &[0, 1, 2]); // +0..10 everywhere
    let end = p.store.client_append(&record(2, 10));
    let sent = p.core.append(end, end);
    c.run(&mut p, sent, &only(&[]));
    let lost = p.core.wal_removed_below(lsn(15));
    assert_eq!(lost, vec![ProposerAction::WalLost { term: 1, from: lsn(10), to: lsn(15) }]);
    assert!(p.core.is_stopped());
}

/// A vote is persisted before it is answered, and a term is voted for at most once.
#[test]
fn vote_persisted_before_reply_and_only_once() {
    let mut a = Acceptor::new(AcceptorState::default());
    let acts = a.handle(ToAcceptor::VoteRequest { term: 5, proposer: 1 });
    assert!(matches!(acts[0], AcceptorAction::Persist(_)));
    assert!(matches!(acts[1], AcceptorAction::Reply(ToProposer::Vote { granted: true, .. })));
    let acts = a.handle(ToAcceptor::VoteRequest { term: 5, proposer: 1 });
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

/// WAL is sent in pieces of at most `max_append` bytes, cut inside records; each carries
/// the last record boundary its bytes reach, so every acceptor's boundary LSN is a record
/// boundary at every moment, commits end at one, and the window moves while a record longer
/// than it streams.
#[test]
fn pieces_are_cut_anywhere_and_carry_the_last_boundary() {
    let mut c = Cluster::new();
    let config = ProposerConfig { max_append: 12, window: 24, max_fetch: 12, ..ProposerConfig::default() };
    let mut p = P { core: Proposer::new(3, WAL_START, config), store: Store::default(), ghosts: BTreeMap::new() };
    c.elect(&mut p, &only(&[0, 1, 2]));
    let mut queue: VecDeque<ProposerAction> = VecDeque::new();
    let mut log = Vec::new();
    for (id, len) in [(1, 10), (2, 15), (3, 100), (4, 3), (5, 4)] {
        log.extend(record(id, len));
        let end = p.store.client_append(&record(id, len));
        queue.extend(p.core.append(end, end));
    }
    // Deliver one message at a time, checking every acceptor and every commit after each.
    let mut pieces = 0;
    while let Some(a) = queue.pop_front() {
        if let ProposerAction::Commit { commit_lsn, .. } = a {
            assert!(is_record_boundary(&log, commit_lsn), "a commit at {commit_lsn}, inside a record");
        }
        if let Some((to, msg)) = p.store.message(&a).unwrap() {
            if let ToAcceptor::Append { data, boundary_lsn, .. } = &msg {
                assert!(data.len() <= 12, "a piece of {} bytes", data.len());
                assert!(is_record_boundary(&log, *boundary_lsn), "a piece names {boundary_lsn}, inside a record");
                pieces += 1;
            }
            let (replies, _) = c.nodes[to].handle(&mut c.disks[to], msg, None).unwrap();
            for r in replies {
                queue.extend(p.core.handle(to, r));
            }
            for d in &c.disks {
                let s = &d.state;
                assert!(is_record_boundary(&log, s.boundary_lsn), "an acceptor's boundary LSN {} is inside a record", s.boundary_lsn);
                assert!(s.commit_lsn <= s.boundary_lsn && s.boundary_lsn <= s.flush_lsn, "{s:?}");
            }
        }
    }
    assert!(pieces >= 3 * 132 / 12, "{pieces} pieces");
    let end = Lsn(WAL_START.0 + log.len() as u64);
    assert!(c.disks.iter().all(|d| d.state.flush_lsn == end && d.state.boundary_lsn == end));
    assert_eq!(p.core.commit_lsn(), Some(end));
}

/// Records of any size, in the core: a compute streams a record far longer than a message
/// (20 MiB; `wire::WAL_BYTES_MAX` is 16 MiB) and dies with acceptor 0 holding part of it
/// and acceptor 1 none. The sync elected by 0 and 1 ends at the last whole record, not
/// inside the long one, drops 0's partial record, and the next compute starts there and
/// commits. Then the long record again, whole on 0 and half on 1: a sync by 0 and 1 ends
/// after it, catching 1 up with WAL fetched from 0 in pieces cut inside it.
#[test]
fn a_sync_after_a_compute_died_inside_a_long_record_ends_at_a_boundary() {
    let mut c = Cluster::new();
    let config = ProposerConfig::default();
    let mut writer = proposer_in(ProposerMode::Compute, WAL_START, config);
    c.elect(&mut writer, &only(&[0, 1, 2]));
    let first = writer.store.client_append(&record(1, 10));
    let a = writer.core.append(first, first);
    c.run(&mut writer, a, &only(&[0, 1, 2]));
    assert_eq!(writer.core.commit_lsn(), Some(first));
    // The long record, flushed 4 MiB at a time as the compute writes it (the shell declares
    // only the boundary before it); 3 MiB of it reach acceptor 0, nothing reaches 1 and 2
    // (before record boundaries, this very schedule made the sync end at 3 MiB into the
    // record: the old rule cut pieces at `max_append` while the next boundary was more than
    // a message away).
    let long = record(2, 20 << 20);
    let sent_to_0 = std::cell::Cell::new(0usize);
    let filter = |to: usize, m: ToAcceptor| {
        let ToAcceptor::Append { data, .. } = &m else { return Some(m) };
        if to != 0 || sent_to_0.get() >= 3 << 20 {
            return None;
        }
        sent_to_0.set(sent_to_0.get() + data.len());
        Some(m)
    };
    for part in long.chunks(4 << 20).take(3) {
        let end = writer.store.client_append(part);
        let a = writer.core.append(end, first);
        c.run(&mut writer, a, &filter);
    }
    let s0 = c.disks[0].state.clone();
    assert!(s0.flush_lsn > first && s0.boundary_lsn == first, "acceptor 0 holds part of the record: {s0:?}");
    assert_eq!(writer.core.commit_lsn(), Some(first), "nothing past the last whole record is committed");
    // The compute dies. compute_ctl's sync, with 2 unreachable:
    let mut sync = proposer_in(ProposerMode::Sync, Lsn(0), config);
    let events = c.elect(&mut sync, &only(&[0, 1]));
    let Some(ProposerAction::SyncDone { lsn: Some(end), .. }) = events.last() else { panic!("no sync: {events:?}") };
    assert_eq!(*end, first, "the sync ends at the last whole record");
    assert_eq!(c.disks[0].state.flush_lsn, first, "the partial record is dropped once a new term writes");
    // The next compute starts there and commits.
    let mut next = proposer_in(ProposerMode::Compute, first, config);
    c.elect(&mut next, &only(&[0, 1, 2]));
    assert!(next.core.is_leader());
    let second = next.store.client_append(&record(3, 10));
    let a = next.core.append(second, second);
    c.run(&mut next, a, &only(&[0, 1, 2]));
    assert_eq!(next.core.commit_lsn(), Some(second));

    // The long record whole on 0 (its end declared), half on 1.
    let sent_to_1 = std::cell::Cell::new(0usize);
    let filter = |to: usize, m: ToAcceptor| {
        let ToAcceptor::Append { data, .. } = &m else { return Some(m) };
        match to {
            0 => Some(m),
            1 if sent_to_1.get() < 10 << 20 => {
                sent_to_1.set(sent_to_1.get() + data.len());
                Some(m)
            }
            _ => None,
        }
    };
    let third = next.store.client_append(&long);
    let a = next.core.append(third, third);
    c.run(&mut next, a, &filter);
    assert_eq!((c.disks[0].state.flush_lsn, c.disks[0].state.boundary_lsn), (third, third));
    let s1 = c.disks[1].state.clone();
    assert!(s1.flush_lsn > second && s1.flush_lsn < third && s1.boundary_lsn == second, "{s1:?}");
    assert_eq!(next.core.commit_lsn(), Some(second), "one acceptor holds the record whole: not committed");
    let mut sync = proposer_in(ProposerMode::Sync, Lsn(0), config);
    let events = c.elect(&mut sync, &only(&[0, 1]));
    let Some(ProposerAction::SyncDone { lsn: Some(end), .. }) = events.last() else { panic!("no sync: {events:?}") };
    assert_eq!(*end, third, "the sync ends after the long record, which acceptor 0 holds whole");
    assert_eq!(c.disks[1].wal, c.disks[0].wal, "acceptor 1 was caught up from acceptor 0");
    let mut want = record(1, 10);
    want.extend(record(3, 10));
    want.extend(&long);
    assert_eq!(c.committed, want);
}

/// A stale compute (restarted without a sync: its WAL starts before the safekeepers' end)
/// sees from the greetings that the acceptors' log does not end at its start, and fences
/// itself before it asks for a single vote (the pre-vote): the acceptors' term does not move,
/// and the healthy compute goes on committing. Neither the stale compute nor, later, the
/// healthy one once a newer compute takes over (the normal way: a sync, then a compute at
/// the LSN it returned) acts again, and nothing committed is lost.
#[test]
fn a_stale_compute_is_fenced_before_any_vote_and_the_healthy_one_goes_on() {
    let mut c = Cluster::new();
    let all: &[usize] = &[0, 1, 2];
    let mut healthy = proposer_in(ProposerMode::Compute, WAL_START, ProposerConfig::default());
    c.elect(&mut healthy, &only(&[0, 1, 2]));
    assert!(healthy.core.is_leader());
    append(&mut c, &mut healthy, 1, &[0, 1, 2]);
    append(&mut c, &mut healthy, 2, &[0, 1, 2]);
    assert_eq!(c.committed.len(), 20);

    let mut stale = proposer_in(ProposerMode::Compute, WAL_START, ProposerConfig::default());
    let sent_by_stale = std::cell::Cell::new(0);
    let count = |_: usize, m: ToAcceptor| {
        if !matches!(m, ToAcceptor::Greeting { .. }) {
            sent_by_stale.set(sent_by_stale.get() + 1);
        }
        Some(m)
    };
    let events = c.elect(&mut stale, &count);
    let mismatch = FenceReason::WalMismatch { start_lsn: lsn(20), wal_start: WAL_START };
    assert_eq!(events, vec![ProposerAction::Fenced { term: 0, reason: mismatch }]);
    assert_eq!(sent_by_stale.get(), 0, "a compute fenced by the pre-vote asks for no vote and sends nothing");
    assert!(stale.core.is_stopped());
    assert!(c.disks.iter().all(|d| d.state.term == 1 && d.state.history.last_term() == 1), "no acceptor's term moved");

    // The healthy compute goes on.
    append(&mut c, &mut healthy, 3, &[0, 1, 2]);
    assert_eq!(c.committed.len(), 30);
    assert!(healthy.core.is_leader());

    // compute_ctl's way to a new compute: a sync, then a compute at the LSN it returned. The
    // healthy one learns of the higher term on its next append and fences itself.
    let mut sync = proposer_in(ProposerMode::Sync, Lsn(0), ProposerConfig::default());
    let events = c.elect(&mut sync, &only(all));
    assert!(matches!(events.last(), Some(ProposerAction::SyncDone { lsn: Some(l), .. }) if *l == lsn(30)), "{events:?}");
    let events = append(&mut c, &mut healthy, 9, &[0, 1, 2]);
    assert!(matches!(events[..], [ProposerAction::Fenced { term: 1, reason: FenceReason::HigherTerm { seen: 2, .. } }]), "{events:?}");
    for p in [&mut healthy, &mut stale] {
        assert!(p.core.is_stopped());
        assert!(p.core.tick().is_empty() && p.core.start_election().is_empty() && p.core.append(lsn(1000), lsn(1000)).is_empty());
        assert!(p
            .core
            .handle(0, ToProposer::GreetingReply { round: 1, term: 9, last_log_term: 1, boundary_lsn: lsn(20), learner: false })
            .is_empty());
        assert!(p.core.reconnected(0).is_empty());
    }
    let mut next = proposer_in(ProposerMode::Compute, lsn(30), ProposerConfig::default());
    c.elect(&mut next, &only(all));
    assert!(next.core.is_leader());
    append(&mut c, &mut next, 4, &[0, 1, 2]);
    let mut expected = Vec::new();
    for id in [1, 2, 3, 4] {
        expected.extend(record(id, 10));
    }
    assert_eq!(c.committed, expected);
    assert!(c.disks.iter().all(|d| d.wal.bytes == expected));
}

/// What the pre-vote cannot see: a stale compute whose greetings reach only acceptors that
/// lack the newest (not yet committed) WAL passes it, and the election, whose votes include
/// the acceptor that has that WAL, fences it; its term then fences the healthy compute. Both
/// stop, nothing committed is lost, and a sync carries on from the most advanced log.
#[test]
fn a_stale_compute_that_greets_only_lagging_acceptors_is_fenced_once_elected() {
    let mut c = Cluster::new();
    let mut healthy = proposer_in(ProposerMode::Compute, WAL_START, ProposerConfig::default());
    c.elect(&mut healthy, &only(&[0, 1, 2]));
    append(&mut c, &mut healthy, 1, &[0, 1, 2]);
    append(&mut c, &mut healthy, 2, &[0]);
    assert_eq!(c.committed.len(), 10);

    // Started at the committed end without a sync; greeted by 1 and 2, voted for by 0 and 1.
    let mut stale = proposer_in(ProposerMode::Compute, lsn(10), ProposerConfig::default());
    let route = |to: usize, m: ToAcceptor| match m {
        ToAcceptor::Greeting { .. } => (to != 0).then_some(m),
        ToAcceptor::VoteRequest { .. } => (to != 2).then_some(m),
        m => Some(m),
    };
    let events = c.elect(&mut stale, &route);
    let mismatch = FenceReason::WalMismatch { start_lsn: lsn(20), wal_start: lsn(10) };
    assert_eq!(events, vec![ProposerAction::Fenced { term: 2, reason: mismatch }]);
    let events = append(&mut c, &mut healthy, 3, &[0, 1, 2]);
    assert!(matches!(events[..], [ProposerAction::Fenced { term: 1, reason: FenceReason::HigherTerm { seen: 2, .. } }]), "{events:?}");
    assert_eq!(c.committed.len(), 10);

    let mut sync = proposer_in(ProposerMode::Sync, Lsn(0), ProposerConfig::default());
    let events = c.elect(&mut sync, &only(&[0, 1, 2]));
    assert!(matches!(events.last(), Some(ProposerAction::SyncDone { lsn: Some(l), .. }) if *l == lsn(20)), "{events:?}");
    let mut expected = record(1, 10);
    expected.extend(record(2, 10));
    assert_eq!(c.committed, expected);
}

/// Acceptors that lag behind the donor are caught up with WAL below the leader's start in
/// pieces cut by size, each carrying a record boundary the core knows (term switches,
/// acknowledged boundary LSNs, its start): the next sync, elected without the donor, ends
/// at a record boundary, and every acceptor's boundary LSN is one at every moment.
#[test]
fn a_sync_after_a_cut_off_catch_up_ends_at_a_record_boundary() {
    let mut c = Cluster::new();
    let small = ProposerConfig { max_append: 7, window: 1000, max_fetch: 7, ..ProposerConfig::default() };
    let mut writer = proposer_in(ProposerMode::Compute, WAL_START, small);
    c.elect(&mut writer, &only(&[0, 1, 2]));
    // Records of different lengths reach acceptor 0 only: 1 and 2 stay at the start.
    for (id, len) in [(1, 10), (2, 23), (3, 5), (4, 31)] {
        let end = writer.store.client_append(&record(id, len));
        let a = writer.core.append(end, end);
        c.run(&mut writer, a, &only(&[0]));
    }
    let donor_log = c.disks[0].wal.bytes.clone();
    assert_eq!(donor_log.len(), 69);
    assert_eq!(c.disks[1].state.flush_lsn, WAL_START);

    // A sync elected by all three catches 1 and 2 up from acceptor 0, but acceptor 2 gets
    // only the first WAL message sent to it.
    let mut sync = proposer_in(ProposerMode::Sync, Lsn(0), small);
    let appends_to_2 = std::cell::Cell::new(0);
    let filter = |to: usize, m: ToAcceptor| {
        if let ToAcceptor::Append { boundary_lsn, .. } = &m {
            assert!(is_record_boundary(&donor_log, *boundary_lsn), "a piece of catch-up WAL names {boundary_lsn}, inside a record");
            if to == 2 {
                appends_to_2.set(appends_to_2.get() + 1);
                if appends_to_2.get() > 1 {
                    return None;
                }
            }
        }
        Some(m)
    };
    let events = c.elect(&mut sync, &filter);
    assert!(matches!(events.last(), Some(ProposerAction::SyncDone { lsn: Some(l), .. }) if *l == lsn(69)), "{events:?}");
    for d in &c.disks {
        let b = d.state.boundary_lsn;
        assert!(is_record_boundary(&donor_log, b), "an acceptor's boundary LSN {b} is inside a record");
    }

    // Without acceptor 0, the next sync is elected by 1 and 2 and ends at a record boundary.
    let mut next = proposer_in(ProposerMode::Sync, Lsn(0), small);
    let events = c.elect(&mut next, &only(&[1, 2]));
    let Some(ProposerAction::SyncDone { lsn: Some(end), .. }) = events.last() else { panic!("no sync: {events:?}") };
    assert!(is_record_boundary(&donor_log, *end), "the sync ends at {end}, inside a record");
    assert_eq!(*end, lsn(69), "acceptor 1 was caught up completely");
}

/// The peer horizon follows the slowest acceptor of all three, not of a quorum: while one is
/// down the others keep (and may remove below) only what it had acknowledged; a new proposer
/// that has not heard from it sends no horizon at all; when it returns, the WAL it lacks is
/// fetched from a donor above what the donor removed, and then the horizon moves on. The
/// pageserver's remote-consistent LSN is relayed to every acceptor.
#[test]
fn peer_horizon_holds_for_a_lagging_acceptor() {
    let mut c = Cluster::new();
    let all: &[usize] = &[0, 1, 2];
    let mut p1 = proposer();
    c.elect(&mut p1, &only(&[0, 1, 2]));
    append(&mut c, &mut p1, 1, &[0, 1, 2]); // +0..10 everywhere
    tick(&mut c, &mut p1, &only(&[0, 1, 2]));
    for n in &c.nodes {
        assert_eq!(n.acceptor.state().peer_horizon_lsn, lsn(10));
    }
    // Acceptor 2 is down: the other two commit more, but the horizon waits for it.
    append(&mut c, &mut p1, 2, &[0, 1]); // +10..20
    append(&mut c, &mut p1, 3, &[0, 1]); // +20..30
    p1.core.set_remote_consistent_lsn(lsn(25));
    tick(&mut c, &mut p1, &only(&[0, 1]));
    assert_eq!(p1.core.peer_horizon_lsn(), lsn(10));
    for a in [0, 1] {
        let s = c.nodes[a].acceptor.state();
        assert_eq!((s.commit_lsn, s.peer_horizon_lsn), (lsn(30), lsn(10)), "acceptor {a}");
        assert_eq!(c.nodes[a].remote_consistent_lsn, lsn(25), "acceptor {a} learns the remote-consistent LSN");
        assert!(c.nodes[a].persist_lazy_and_remove(&mut c.disks[a]));
        assert_eq!(c.disks[a].removed_below, lsn(10));
    }
    // A new proposer elected by 0 and 1 has not heard from 2: no horizon, and the acceptors
    // keep theirs.
    let mut p2 = proposer();
    c.elect(&mut p2, &only(&[0, 1]));
    assert_eq!(p2.core.wal_range(), Some((lsn(30), lsn(30))));
    append(&mut c, &mut p2, 4, &[0, 1]); // +30..40
    tick(&mut c, &mut p2, &only(&[0, 1]));
    assert_eq!(p2.core.peer_horizon_lsn(), Lsn(0));
    for a in [0, 1] {
        assert_eq!(c.nodes[a].acceptor.state().peer_horizon_lsn, lsn(10), "acceptor {a}");
    }
    // Acceptor 2 returns at +10: WAL from +10 to the proposer's start is fetched from a donor
    // (which never asks its disk for removed WAL: the shell would fail the test), the rest
    // streamed; then the horizon reaches the end everywhere.
    let filter = |to: usize, m: ToAcceptor| all.contains(&to).then_some(m);
    tick(&mut c, &mut p2, &filter);
    tick(&mut c, &mut p2, &filter);
    assert_eq!(c.disks[2].state.flush_lsn, lsn(40));
    assert_eq!(p2.core.peer_horizon_lsn(), lsn(40));
    for a in 0..3 {
        assert_eq!(c.nodes[a].acceptor.state().peer_horizon_lsn, lsn(40), "acceptor {a}");
        c.nodes[a].persist_lazy_and_remove(&mut c.disks[a]);
        assert_eq!(c.disks[a].removed_below, lsn(40));
        assert_eq!(c.disks[a].wal, c.disks[0].wal);
    }
}

/// The term history does not grow with every election: while every acceptor keeps up, the
/// peer horizon follows the WAL, and each elected history drops the entries below the
/// highest horizon among its votes. Two hundred elections later the history is a few entries
/// long (the wire and the control file cap it at `HISTORY_ENTRIES_MAX`, which an untrimmed
/// history reached after that many elections), and every log is still the committed WAL.
#[test]
fn the_term_history_is_trimmed_below_the_peer_horizon() {
    let mut c = Cluster::new();
    let mut expected = Vec::new();
    for id in 1..=200u64 {
        let mut p = proposer();
        let events = c.elect(&mut p, &only(&[0, 1, 2]));
        assert!(p.core.is_leader(), "election {id}: {events:?}");
        append(&mut c, &mut p, id, &[0, 1, 2]);
        expected.extend(record(id, 10));
        // A tick spreads the peer horizon (every acceptor acknowledged the record).
        let a = p.core.tick();
        c.run(&mut p, a, &only(&[0, 1, 2]));
    }
    assert_eq!(c.committed, expected);
    for d in &c.disks {
        assert_eq!(d.wal.bytes, expected);
        assert!(d.state.history.0.len() <= 3, "history of {} entries: {:?}", d.state.history.0.len(), d.state.history);
        assert_eq!(d.state.history.last_term(), 200);
    }
}

/// The reproduction, in the core: commits acknowledged by acceptors 0 and 1 while 2
/// is down; 0 loses its disk; 0 and 2 alone can elect nobody (as a blank voter, 0 would have
/// voted with 2 for 2's lagging log, dropping the commits). Once 1 is back, 1 and 2 elect
/// the log with the commits; 0 joins that election, whose vote it saw, catches up and is a
/// voter again.
#[test]
fn a_wiped_acceptor_votes_only_after_it_caught_up() {
    let mut c = Cluster::new();
    let mut p1 = proposer_in(ProposerMode::Compute, WAL_START, ProposerConfig::default());
    c.elect(&mut p1, &only(&[0, 1, 2]));
    for id in 1..=6 {
        append(&mut c, &mut p1, id, &[0, 1]);
    }
    assert_eq!(c.committed.len(), 60);
    wipe(&mut c, 0);

    let mut sync = proposer_in(ProposerMode::Sync, Lsn(0), ProposerConfig::default());
    let events = c.elect(&mut sync, &only(&[0, 2]));
    assert!(events.is_empty(), "nobody may be elected by a learner and one voter: {events:?}");
    assert!(c.disks[0].state.learner && c.disks[0].state.term == 0, "a learner does not vote");

    // Acceptor 1 is back: the sync's resent vote request reaches it.
    let a = sync.core.tick();
    let events = c.run(&mut sync, a, &only(&[0, 1, 2]));
    assert!(matches!(events.last(), Some(ProposerAction::SyncDone { lsn: Some(l), .. }) if *l == lsn(60)), "{events:?}");
    let a = sync.core.tick();
    c.run(&mut sync, a, &only(&[0, 1, 2]));
    let mut expected = Vec::new();
    for id in 1..=6 {
        expected.extend(record(id, 10));
    }
    assert_eq!(c.committed, expected);
    // The sync stopped once a majority had its commit; the next compute brings everyone up.
    let mut next = proposer_in(ProposerMode::Compute, lsn(60), ProposerConfig::default());
    c.elect(&mut next, &only(&[0, 1, 2]));
    append(&mut c, &mut next, 7, &[0, 1, 2]);
    expected.extend(record(7, 10));
    assert_eq!(c.committed, expected);
    assert!(!c.disks[0].state.learner, "caught up in a term it joined: a voter again");
    for d in &c.disks {
        assert_eq!(d.wal.range(d.wal.begin, d.wal.end()).unwrap(), &expected[(d.wal.begin.0 - WAL_START.0) as usize..]);
    }
}

/// A learner does not join an election it did not see begin (an earlier incarnation may
/// have acknowledged WAL in it, which the leader would count on): it waits for the next.
#[test]
fn a_learner_joins_only_an_election_it_saw_begin() {
    let mut c = Cluster::new();
    let mut p1 = proposer();
    c.elect(&mut p1, &only(&[0, 1, 2]));
    append(&mut c, &mut p1, 1, &[0, 1, 2]);
    wipe(&mut c, 2);
    // The leader's connection to 2 is re-established: it resends its election.
    let a = p1.core.reconnected(2);
    c.run(&mut p1, a, &only(&[0, 1, 2]));
    append(&mut c, &mut p1, 2, &[0, 1, 2]);
    assert_eq!(c.committed.len(), 20, "the others go on");
    assert_eq!((c.disks[2].state.term, c.disks[2].state.flush_lsn), (0, Lsn(0)), "the learner stayed out");

    let mut p2 = proposer();
    c.elect(&mut p2, &only(&[0, 1, 2]));
    append(&mut c, &mut p2, 3, &[0, 1, 2]);
    assert_eq!(c.committed.len(), 30);
    assert!(!c.disks[2].state.learner);
    assert_eq!(c.disks[2].state.flush_lsn, lsn(30));
}

/// Found by the simulation at scale (seed 254,334): a learner that joins an older term's
/// election, whose log begins below a peer horizon its earlier incarnation helped raise,
/// must not need WAL below that horizon in the next election (the others may have removed
/// it, and refuse to fetch it). Term 2's votes are taken before term 3 raises the horizon
/// to +20 (every acceptor acknowledged it); acceptor 1 then loses its disk and joins term 2,
/// its log beginning at +10; term 4 (acceptors 0 and 2) shares term 1 with it there, and its
/// log must start again at +20 instead of waiting forever for +10..20.
#[test]
fn a_learner_whose_log_lies_below_the_horizon_starts_it_again() {
    let mut c = Cluster::new();
    let mut p1 = proposer();
    c.elect(&mut p1, &only(&[0, 1, 2]));
    append(&mut c, &mut p1, 1, &[0, 1, 2]);
    append(&mut c, &mut p1, 2, &[0, 1, 2]);
    // Term 2 takes the votes of 0 and 2 (they report no horizon yet); its elections are lost,
    // and its vote request to acceptor 1 is held back.
    let mut p2 = proposer();
    let held = std::cell::RefCell::new(None);
    let hold = |to: usize, m: ToAcceptor| match (to, &m) {
        (1, ToAcceptor::VoteRequest { .. }) => {
            *held.borrow_mut() = Some(m);
            None
        }
        (_, ToAcceptor::Elected { .. }) => None,
        _ => Some(m),
    };
    c.elect(&mut p2, &hold);
    assert!(p2.core.is_leader());
    // Term 3: everyone acknowledges +20 and learns it as the peer horizon; 0 and 2 remove
    // the WAL below it.
    let mut p3 = proposer();
    c.elect(&mut p3, &only(&[0, 1, 2]));
    tick(&mut c, &mut p3, &only(&[0, 1, 2]));
    for a in [0, 2] {
        assert_eq!(c.nodes[a].acceptor.state().peer_horizon_lsn, lsn(20));
        c.nodes[a].persist_lazy_and_remove(&mut c.disks[a]);
        assert_eq!(c.disks[a].removed_below, lsn(20));
    }
    // Acceptor 1 loses its disk, then sees term 2's vote request (late) and its election.
    wipe(&mut c, 1);
    let vote_request = held.borrow_mut().take().expect("held");
    let _ = c.nodes[1].handle(&mut c.disks[1], vote_request, None).unwrap();
    let a = p2.core.reconnected(1);
    c.run(&mut p2, a, &only(&[1]));
    // (Its log begins at +10, term 2's `log_begin`: the horizon its votes reported.)
    assert_eq!((c.disks[1].state.term, c.disks[1].state.flush_lsn), (2, lsn(10)), "the learner took term 2's election");
    // Term 4, elected by 0 and 2 (the learner sees its vote request, and refuses), brings the
    // learner up without WAL below the horizon (the donors' shells fail the test if asked
    // for it), and commits with it.
    let mut p4 = proposer();
    c.elect(&mut p4, &only(&[0, 1, 2]));
    tick(&mut c, &mut p4, &only(&[0, 1, 2]));
    let s = &c.disks[1].state;
    assert_eq!((s.term, s.flush_lsn, s.boundary_lsn, s.log_begin), (4, lsn(20), lsn(20), lsn(20)), "{s:?}");
    append(&mut c, &mut p4, 3, &[0, 1, 2]);
    assert_eq!(c.disks[1].state.flush_lsn, lsn(30));
    assert_eq!(c.committed.len(), 30);
}

/// Found by the simulation at scale (seed 408,152): a learner's acknowledgement
/// must not count towards a commit. Acceptor 0 votes in term 2, whose leader is elected by
/// 0 and 2 with no WAL; then 0 loses its disk. Term 1's proposer, still collecting votes,
/// reconnects to it: the learner refuses the vote request (and so may join term 1), and
/// term 1 is elected by 1 and 2 (2's vote came before term 2's). Term 1's record is then
/// acknowledged by the learner and by 1 only. Counted as a commit, it would rest on 0,
/// whose earlier incarnation helped elect a term (2) that lacks it: term 3, elected by 1
/// and 2, continues 2's log, and 1 (which never heard of the commit LSN) drops the record.
#[test]
fn a_learners_acknowledgement_does_not_count_towards_a_commit() {
    let mut c = Cluster::new();
    // Term 1's vote reaches acceptor 2 only.
    let mut p1 = proposer();
    c.elect(&mut p1, &|to, m| (to == 2 || !matches!(m, ToAcceptor::VoteRequest { .. })).then_some(m));
    assert_eq!((p1.core.term(), p1.core.is_leader()), (1, false));
    // Term 2 (above 2's term 1) is elected by 0 and 2, out of touch with 1; only 2 hears
    // of it, and takes a record in it.
    let mut p2 = proposer();
    c.elect(&mut p2, &|to, m| (to == 2 || to == 0 && !matches!(m, ToAcceptor::Elected { .. })).then_some(m));
    assert_eq!((p2.core.term(), p2.core.is_leader()), (2, true));
    append(&mut c, &mut p2, 20, &[2]);
    assert_eq!(c.disks[2].state.boundary_lsn, lsn(10));
    // Acceptor 0 loses its disk; term 1's proposer reconnects and asks it again: the
    // learner refuses, and has seen term 1's election begin.
    wipe(&mut c, 0);
    let a = p1.core.reconnected(0);
    c.run(&mut p1, a, &only(&[0]));
    // Acceptor 1 grants term 1 (its vote request resent at a tick): elected by 1 and 2. Its
    // link to 2 is down meanwhile (2, at term 2, would make it step down).
    let a = p1.core.tick();
    let events = c.run(&mut p1, a, &only(&[0, 1]));
    assert!(matches!(events.first(), Some(ProposerAction::Elected { term: 1, .. })), "{events:?}");
    assert_eq!((c.disks[0].state.term, c.disks[0].state.learner), (1, true), "the learner joined term 1");
    // Term 1's record reaches 0 and 1; a commit LSN that covers it never does (lost).
    let no_commit_lsn = |to: usize, m: ToAcceptor| match m {
        ToAcceptor::Append { commit_lsn, .. } if commit_lsn > WAL_START => None,
        m => (to != 2).then_some(m),
    };
    let end = p1.store.client_append(&record(1, 10));
    let a = p1.core.append(end, end);
    c.run(&mut p1, a, &no_commit_lsn);
    assert_eq!(c.disks[0].state.boundary_lsn, lsn(10));
    assert_eq!(c.disks[1].state.boundary_lsn, lsn(10));
    assert_eq!(p1.core.commit_lsn(), Some(Lsn(0)), "a learner and one voter are no commit quorum");
    assert!(c.committed.is_empty());
    // Term 3, elected by 1 and 2, continues 2's log (term 2 is the last log term): 1 drops
    // term 1's record, which was never committed, and the new record commits.
    let mut p3 = proposer();
    c.elect(&mut p3, &only(&[1, 2]));
    assert_eq!(p3.core.wal_range(), Some((lsn(10), lsn(10))));
    append(&mut c, &mut p3, 3, &[1, 2]);
    let mut expected = record(20, 10);
    expected.extend(record(3, 10));
    assert_eq!(c.committed, expected);
    assert_eq!(c.wal(1), &expected[..]);
}

/// With `defer_commit_lsn`, a commit LSN that no WAL carries waits for the shell: the
/// acknowledgements that commit a record bring no empty `Append`s; `announce_commit` sends
/// one to each acceptor, and the next record's pieces (or a tick) carry it otherwise.
#[test]
fn a_deferred_commit_lsn_goes_out_when_announced_or_with_the_next_wal() {
    let mut c = Cluster::new();
    let config = ProposerConfig { defer_commit_lsn: true, ..ProposerConfig::default() };
    let mut p = proposer_in(ProposerMode::Plain, WAL_START, config);
    c.elect(&mut p, &only(&[0, 1, 2]));
    let sent = std::cell::RefCell::new(Vec::new());
    let record_all = |to: usize, msg: ToAcceptor| {
        if let ToAcceptor::Append { data, commit_lsn, .. } = &msg {
            sent.borrow_mut().push((to, data.len(), *commit_lsn));
        }
        Some(msg)
    };
    // Whatever the election left to announce goes first.
    if p.core.commit_unannounced() {
        let a = p.core.announce_commit();
        c.run(&mut p, a, &record_all);
    }
    sent.borrow_mut().clear();

    let end = p.store.client_append(&record(1, 10));
    let a = p.core.append(end, end);
    c.run(&mut p, a, &record_all);
    assert_eq!(p.core.commit_lsn(), Some(lsn(10)));
    assert!(sent.borrow().iter().all(|&(_, len, _)| len == 10), "only the record went out: {:?}", sent.borrow());
    assert!(p.core.commit_unannounced());

    sent.borrow_mut().clear();
    let a = p.core.announce_commit();
    c.run(&mut p, a, &record_all);
    let mut announced = sent.borrow().clone();
    announced.sort();
    assert_eq!(announced, vec![(0, 0, lsn(10)), (1, 0, lsn(10)), (2, 0, lsn(10))]);
    assert!(!p.core.commit_unannounced());
    assert!(p.core.announce_commit().is_empty(), "announced once");

    // The next record's acknowledgements commit it; its pieces carried the commit before.
    sent.borrow_mut().clear();
    let end = p.store.client_append(&record(2, 10));
    let a = p.core.append(end, end);
    c.run(&mut p, a, &record_all);
    assert!(sent.borrow().iter().all(|&(_, len, commit)| len == 10 && commit == lsn(10)), "{:?}", sent.borrow());
    assert!(p.core.commit_unannounced());
    // A tick announces it as well.
    sent.borrow_mut().clear();
    tick(&mut c, &mut p, &record_all);
    assert!(sent.borrow().iter().filter(|&&(_, len, commit)| len == 0 && commit == lsn(20)).count() == 3, "{:?}", sent.borrow());
    assert!(!p.core.commit_unannounced());
}
