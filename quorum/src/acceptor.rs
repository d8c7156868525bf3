//! The acceptor (safekeeper) state machine.
//!
//! The invariants of `lib.rs` are asserted where they are kept, in release builds too (they
//! are cheap): a term is voted for once (the term only grows, and a vote raises it); WAL is
//! appended only in a term whose elected history was adopted; a truncation never goes below
//! the commit LSN; the commit LSN never goes back and never passes the boundary LSN (the end
//! of the last whole record), which never passes the flush LSN and goes back only by a
//! truncation (to a boundary); the peer horizon never goes back and
//! never passes the commit LSN (so no truncation goes below it either); no reply before the
//! persists it depends on; WAL is never read below the peer horizon (the shell may have
//! removed it). A message that would break one (a hostile or broken proposer, or a stale
//! copy) is refused instead: a peer horizon above the acceptor's own commit or flush LSN is
//! capped, a `FetchWal` from below the peer horizon ignored.
//! The remote-consistent LSN an `Append` carries is not the acceptor's to judge (it is the
//! pageserver's progress, relayed): it is passed on to the shell as it came.

use super::{Term, TermHistory, ToAcceptor, ToProposer};
use bytes::Bytes;
use proto::Lsn;

/// What an acceptor keeps durably besides the WAL bytes: the control file (term, history,
/// commit LSN) and where its WAL ends. A restart rebuilds it from disk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AcceptorState {
    /// The highest term seen (and voted for, if a vote was asked).
    pub term: Term,
    /// The history of the last elected proposer whose WAL this acceptor took.
    pub history: TermHistory,
    pub commit_lsn: Lsn,
    /// The end of the durable WAL (0: no WAL yet).
    pub flush_lsn: Lsn,
    /// The end of the last whole record in the durable WAL (the crate's "Record
    /// boundaries"): at most `flush_lsn`, at least `commit_lsn`. Where its log ends for
    /// elections and commits; the WAL past it is a record cut short, dropped when it takes
    /// an election. Made durable with the bytes (`Persist::Append`).
    pub boundary_lsn: Lsn,
    /// The highest peer horizon a proposer sent (see the crate's "WAL removal"), capped by
    /// the commit LSN when it was received: WAL below it is on every acceptor for good.
    /// Persisted lazily, like the commit LSN (`AcceptorAction::PeerHorizon`).
    pub peer_horizon_lsn: Lsn,
    /// Created without a record of the timeline: no vote until it has caught up (the
    /// crate's "Learners"). Persisted with the term.
    pub learner: bool,
    /// Where the log begins (0 for none yet): a truncation outside the log moves it (a log
    /// that shared nothing with an election begins at its `log_begin`); the shell may move
    /// it up when it removes WAL, and gives it at startup. Every acceptor held the WAL below
    /// it when it was set, so it is as good a peer horizon as any, and votes report it as
    /// one (so that an acceptor that begins its log later never needs WAL below it).
    pub log_begin: Lsn,
}

impl AcceptorState {
    /// The term of the last history entry that covers the WAL up to the boundary LSN.
    pub fn last_log_term(&self) -> Term {
        self.history.up_to(self.boundary_lsn).last_term()
    }

    /// Applies one durable change to the state (the shell also applies it to the WAL bytes).
    pub fn apply(&mut self, p: &Persist) {
        match p {
            Persist::Control { term, history, commit_lsn, learner } => {
                self.term = *term;
                self.history = history.clone();
                self.commit_lsn = *commit_lsn;
                self.learner = *learner;
            }
            Persist::Truncate { at } => {
                // As the shell does: outside the log (before its beginning or beyond its
                // end), the log is emptied and begins there.
                if *at < self.log_begin || *at > self.flush_lsn {
                    self.log_begin = *at;
                }
                self.flush_lsn = *at;
                self.boundary_lsn = *at;
            }
            Persist::Append { begin, data, boundary } => {
                self.flush_lsn = Lsn(begin.0 + data.len() as u64);
                self.boundary_lsn = *boundary;
            }
        }
    }
}

/// A durable change, to be made durable before the actions that follow it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Persist {
    /// Replace the control file.
    Control { term: Term, history: TermHistory, commit_lsn: Lsn, learner: bool },
    /// The WAL now ends at `at`, which is its boundary LSN too. If `at` is not inside the
    /// WAL the shell has (beyond its end, or before its beginning), the WAL is emptied and
    /// begins at `at`.
    Truncate { at: Lsn },
    /// Append `data` (possibly none) at `begin`, which is the current end of the WAL; the
    /// boundary LSN is now `boundary` (at most the new end, never lower than before). Both
    /// durable together: an acceptor acknowledges its boundary LSN, and commits count it.
    Append { begin: Lsn, data: Bytes, boundary: Lsn },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcceptorAction {
    Persist(Persist),
    /// The commit LSN advanced to this (already applied to the state). Making it durable may
    /// wait: nothing is replied on the strength of it.
    CommitLsn(Lsn),
    /// The peer horizon advanced to this (already applied to the state). Like the commit
    /// LSN, making it durable may wait: losing it only delays WAL removal.
    PeerHorizon(Lsn),
    /// An `Append` relayed the pageserver's remote-consistent LSN (nonzero). The shell keeps
    /// the highest it has seen, from here and from the pageserver itself.
    RemoteConsistentLsn(Lsn),
    /// Reply `ToProposer::Wal { term, from, data }` with the WAL bytes in `[from, to)`
    /// (`to` is at most the flush LSN, `from` at least the peer horizon: WAL below it is
    /// never asked for, so the shell may remove it).
    SendWal {
        term: Term,
        from: Lsn,
        to: Lsn,
    },
    Reply(ToProposer),
}

/// A safekeeper's side of the protocol.
#[derive(Clone, Debug)]
pub struct Acceptor {
    state: AcceptorState,
    /// A learner's memory (not persisted) of the last vote request it refused, (term,
    /// proposer): the only election it may join (see the crate's "Learners").
    witnessed_election: Option<(Term, u64)>,
}

impl Acceptor {
    /// An acceptor with the given durable state (empty for a new one, from disk on restart).
    pub fn new(state: AcceptorState) -> Acceptor {
        Acceptor { state, witnessed_election: None }
    }

    pub fn state(&self) -> &AcceptorState {
        &self.state
    }

    fn persist(&mut self, out: &mut Vec<AcceptorAction>, p: Persist) {
        match &p {
            Persist::Truncate { at } => {
                assert!(*at >= self.state.commit_lsn, "truncating WAL at {at}, below the commit LSN {}", self.state.commit_lsn);
                // The peer horizon is at most the commit LSN, so this follows; stated because
                // WAL below the peer horizon may already be removed.
                assert!(
                    *at >= self.state.peer_horizon_lsn,
                    "truncating WAL at {at}, below the peer horizon {}",
                    self.state.peer_horizon_lsn
                );
            }
            Persist::Append { begin, data, boundary } => {
                assert_eq!(*begin, self.state.flush_lsn, "WAL appended away from the end of the log");
                let end = Lsn(begin.0 + data.len() as u64);
                assert!(
                    *boundary >= self.state.boundary_lsn && *boundary <= end,
                    "boundary LSN {boundary} moved back from {} or beyond the WAL's end {end}",
                    self.state.boundary_lsn
                );
                assert!(
                    self.state.history.last_term() == self.state.term,
                    "WAL accepted in term {} before its elected history was adopted",
                    self.state.term
                );
            }
            Persist::Control { .. } => {}
        }
        self.state.apply(&p);
        out.push(AcceptorAction::Persist(p));
    }

    fn persist_control(&mut self, out: &mut Vec<AcceptorAction>) {
        let p = Persist::Control {
            term: self.state.term,
            history: self.state.history.clone(),
            commit_lsn: self.state.commit_lsn,
            learner: self.state.learner,
        };
        out.push(AcceptorAction::Persist(p));
    }

    /// A learner becomes a voter once, in the term it joined, it holds that term's log up to
    /// the term's start and the leader reports a peer horizon at least that high, which
    /// means every acceptor of the configuration joined this term (and so holds no higher
    /// term, in which an earlier incarnation of the learner might have voted). See the
    /// crate's "Learners".
    fn maybe_graduate(&mut self, out: &mut Vec<AcceptorAction>, peer_horizon: Lsn) {
        let s = &self.state;
        let caught_up =
            s.history.0.last().is_some_and(|e| e.term == s.term && s.term > 0 && s.boundary_lsn >= e.lsn && peer_horizon >= e.lsn);
        if s.learner && caught_up {
            self.state.learner = false;
            self.persist_control(out);
        }
    }

    fn rejected(&self, term: Term) -> AcceptorAction {
        AcceptorAction::Reply(ToProposer::Rejected { term, acceptor_term: self.state.term })
    }

    /// Whether this acceptor took `term`'s election (and so accepts its WAL).
    fn joined(&self, term: Term) -> bool {
        self.state.term == term && self.state.history.last_term() == term
    }

    /// Handles one message. `Persist` actions come before the reply that depends on them.
    pub fn handle(&mut self, msg: ToAcceptor) -> Vec<AcceptorAction> {
        let before = (self.state.term, self.state.commit_lsn, self.state.peer_horizon_lsn);
        let out = self.handle_inner(msg);
        assert!(self.state.term >= before.0, "term went back from {} to {}", before.0, self.state.term);
        assert!(self.state.commit_lsn >= before.1, "commit LSN went back from {} to {}", before.1, self.state.commit_lsn);
        assert!(self.state.commit_lsn <= self.state.flush_lsn || self.state.commit_lsn == before.1, "commit LSN beyond the WAL");
        // Committed WAL is whole records: no truncation (which goes to a boundary at most)
        // may need to go below the commit LSN.
        assert!(
            self.state.commit_lsn <= self.state.boundary_lsn || self.state.commit_lsn == before.1,
            "commit LSN {} beyond the boundary LSN {}",
            self.state.commit_lsn,
            self.state.boundary_lsn
        );
        assert!(self.state.boundary_lsn <= self.state.flush_lsn, "boundary LSN beyond the WAL");
        let horizon = self.state.peer_horizon_lsn;
        assert!(horizon >= before.2, "peer horizon went back from {} to {horizon}", before.2);
        assert!(horizon == before.2 || horizon <= self.state.commit_lsn, "peer horizon {horizon} beyond the commit LSN");
        // Nothing is replied or sent before every persist of this message.
        let last_persist = out.iter().rposition(|a| matches!(a, AcceptorAction::Persist(_)));
        let first_reply = out.iter().position(|a| matches!(a, AcceptorAction::Reply(_) | AcceptorAction::SendWal { .. }));
        if let (Some(p), Some(r)) = (last_persist, first_reply) {
            assert!(p < r, "a reply comes before the persist it depends on");
        }
        for a in &out {
            if let AcceptorAction::SendWal { from, .. } = a {
                assert!(*from >= horizon, "WAL asked for from {from}, below the peer horizon {horizon}");
            }
        }
        out
    }

    fn handle_inner(&mut self, msg: ToAcceptor) -> Vec<AcceptorAction> {
        let mut out = Vec::new();
        match msg {
            ToAcceptor::Greeting { round } => {
                out.push(AcceptorAction::Reply(ToProposer::GreetingReply {
                    round,
                    term: self.state.term,
                    last_log_term: self.state.last_log_term(),
                    boundary_lsn: self.state.boundary_lsn,
                    learner: self.state.learner,
                }));
            }
            ToAcceptor::VoteRequest { term, proposer } => {
                // One vote per term: only a term above every term seen, which it then becomes.
                // A learner does not vote; a vote it refuses names the election it may join.
                let granted = term > self.state.term && !self.state.learner;
                if granted {
                    self.state.term = term;
                    self.persist_control(&mut out);
                } else if self.state.learner && term > self.state.term {
                    self.witnessed_election = Some((term, proposer));
                }
                out.push(AcceptorAction::Reply(ToProposer::Vote {
                    term,
                    granted,
                    acceptor_term: self.state.term,
                    history: self.state.history.clone(),
                    boundary_lsn: self.state.boundary_lsn,
                    commit_lsn: self.state.commit_lsn,
                    peer_horizon_lsn: self.state.peer_horizon_lsn.max(self.state.log_begin).min(self.state.boundary_lsn),
                }));
            }
            ToAcceptor::Elected { term, history, start_lsn, log_begin, proposer } => {
                if term < self.state.term {
                    out.push(self.rejected(term));
                    return out;
                }
                let Some(first) = history.0.first() else { return out };
                if self.state.history.last_term() != term && self.state.learner && self.witnessed_election != Some((term, proposer)) {
                    // An election a learner did not see begin: an earlier incarnation of it
                    // (before its disk was lost) may have acknowledged WAL in it, which the
                    // leader would count on. It waits for the next one; no reply.
                    return out;
                }
                if self.state.history.last_term() != term {
                    // First time we hear of this election: cut our WAL back to what we share
                    // with the elected history, never below what we know is committed. Our
                    // log ends at its boundary LSN here: a record cut short past it goes.
                    let flush = self.state.flush_lsn;
                    let boundary = self.state.boundary_lsn;
                    let ours = self.state.history.up_to(boundary);
                    let mut at = ours.common_point(boundary, &history.up_to(start_lsn), start_lsn);
                    if at == Lsn(0) {
                        // Nothing in common (or no WAL): the log restarts where the
                        // elected history says a log begins (the timeline's WAL beginning,
                        // or once WAL may have been removed, the highest peer horizon).
                        at = log_begin.max(first.lsn);
                    } else if flush < log_begin {
                        // All our WAL lies below where this election says logs may begin:
                        // the WAL between would have to come from acceptors that may have
                        // removed it (it is below a peer horizon), so the log restarts
                        // there, as one that shares nothing. Only a learner gets here: one
                        // that began its log in an older election, while an earlier
                        // incarnation's acknowledgements had already raised the others'
                        // horizon (found by the simulation: a catch-up that never ended).
                        at = log_begin;
                    }
                    if at < self.state.commit_lsn {
                        // Cannot happen with a correct proposer (committed WAL is in every
                        // elected history): a broken or hostile one. Refused, not obeyed, so
                        // committed WAL is never lost; no reply, so it cannot stream here.
                        return out;
                    }
                    if at != flush || at != boundary {
                        // (At the flush LSN but above the boundary LSN: a log that shares
                        // nothing begins there, and the truncation makes that its boundary.)
                        self.persist(&mut out, Persist::Truncate { at });
                    }
                    self.state.term = term;
                    self.state.history = history;
                    self.persist_control(&mut out);
                }
                // A duplicate of an election we already took changes nothing.
                let (flush_lsn, boundary_lsn) = (self.state.flush_lsn, self.state.boundary_lsn);
                out.push(AcceptorAction::Reply(ToProposer::ElectedAck { term, flush_lsn, boundary_lsn }));
            }
            ToAcceptor::FetchWal { term, from, to } => {
                if term < self.state.term {
                    out.push(self.rejected(term));
                    return out;
                }
                if !self.joined(term) {
                    return out;
                }
                if from < self.state.peer_horizon_lsn {
                    // WAL below the peer horizon may be removed. No acceptor's log ends below
                    // it, so no current request of a correct proposer starts there: this is
                    // a stale copy of an old request (found by the simulation: a duplicate
                    // delivered after the donor had removed that WAL). Ignored, like other
                    // stale messages.
                    return out;
                }
                let to = to.min(self.state.flush_lsn);
                if from < to {
                    out.push(AcceptorAction::SendWal { term, from, to });
                }
            }
            ToAcceptor::Append { term, begin_lsn, data, boundary_lsn, commit_lsn, peer_horizon_lsn, remote_consistent_lsn } => {
                if term < self.state.term {
                    out.push(self.rejected(term));
                    return out;
                }
                if !self.joined(term) {
                    // Not yet joined to this term's election; the proposer resends Elected.
                    return out;
                }
                let flush = self.state.flush_lsn;
                let end = Lsn(begin_lsn.0 + data.len() as u64);
                // Bytes below our flush LSN are the same ones (our WAL is a prefix of this
                // term's history): take only what is new. (begin_lsn > flush: a gap; the
                // ack tells the proposer where we are.)
                let new = if begin_lsn <= flush && end > flush { data.slice((flush.0 - begin_lsn.0) as usize..) } else { Bytes::new() };
                let new_end = Lsn(flush.0 + new.len() as u64);
                // Our log is a prefix of this term's, so a boundary of the term's log that our
                // WAL reaches is one of ours: the one sent, the commit LSN (commits end at
                // boundaries) and the term's switches (its start above all).
                let switch = self.state.history.0.iter().rev().map(|e| e.lsn).find(|&l| l <= new_end).unwrap_or_default();
                let boundary =
                    [boundary_lsn, commit_lsn, switch].into_iter().filter(|&b| b <= new_end).fold(self.state.boundary_lsn, Lsn::max);
                if !new.is_empty() || boundary > self.state.boundary_lsn {
                    self.persist(&mut out, Persist::Append { begin: flush, data: new, boundary });
                }
                self.maybe_graduate(&mut out, peer_horizon_lsn);
                // A commit LSN beyond our WAL: what we have of it is committed, up to our last
                // whole record (the commit LSN never passes the boundary LSN).
                let commit = commit_lsn.min(self.state.boundary_lsn);
                if commit > self.state.commit_lsn {
                    self.state.commit_lsn = commit;
                    out.push(AcceptorAction::CommitLsn(commit));
                }
                // Capped by our own commit LSN (and so by our flush LSN): a correct proposer
                // never sends more than our acknowledged flush LSN, but WAL above our commit
                // LSN is not ours to give up yet whatever it says.
                let horizon = peer_horizon_lsn.min(self.state.commit_lsn);
                if horizon > self.state.peer_horizon_lsn {
                    self.state.peer_horizon_lsn = horizon;
                    out.push(AcceptorAction::PeerHorizon(horizon));
                }
                if remote_consistent_lsn.is_valid() {
                    out.push(AcceptorAction::RemoteConsistentLsn(remote_consistent_lsn));
                }
                out.push(AcceptorAction::Reply(ToProposer::AppendAck {
                    term,
                    flush_lsn: self.state.flush_lsn,
                    boundary_lsn: self.state.boundary_lsn,
                    commit_lsn: self.state.commit_lsn,
                }));
            }
        }
        out
    }
}
