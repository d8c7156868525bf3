//! The proposer (WAL writer) state machine.

use super::{NodeId, Record, Term, TermHistory, TermSwitch, ToAcceptor, ToProposer};
use proto::Lsn;
use std::collections::BTreeMap;

/// How many records one `Append` carries at most.
const MAX_APPEND_RECORDS: usize = 16;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProposerAction {
    Send(NodeId, ToAcceptor),
    /// This proposer won `term`.
    Elected { term: Term },
    /// WAL below this LSN is on a majority of acceptors (in this proposer's term).
    Commit { term: Term, commit_lsn: Lsn },
    /// An acceptor has seen a higher term; this proposer stopped.
    SteppedDown { term: Term, seen: Term },
}

#[derive(Clone, Debug)]
struct VoteInfo {
    history: TermHistory,
    flush_lsn: Lsn,
}

#[derive(Clone, Debug)]
struct Leader {
    history: TermHistory,
    start_lsn: Lsn,
    donor: NodeId,
    /// The WAL of the elected history; `None` until the donor sent its part.
    log: Option<Vec<Record>>,
    /// Per acceptor: its flush LSN in this term, once it took the election.
    flush: BTreeMap<NodeId, Lsn>,
    commit_lsn: Lsn,
}

#[derive(Clone, Debug)]
enum Phase {
    Idle,
    Greeting { terms: BTreeMap<NodeId, Term> },
    Voting { votes: BTreeMap<NodeId, VoteInfo>, refused: usize },
    Leader(Box<Leader>),
}

/// A proposer for a fixed set of acceptors `0..n`.
#[derive(Clone, Debug)]
pub struct Proposer {
    n: usize,
    term: Term,
    phase: Phase,
}

impl Proposer {
    pub fn new(acceptors: usize) -> Proposer {
        Proposer { n: acceptors, term: 0, phase: Phase::Idle }
    }

    fn majority(&self) -> usize {
        self.n / 2 + 1
    }

    pub fn term(&self) -> Term {
        self.term
    }

    pub fn is_leader(&self) -> bool {
        matches!(self.phase, Phase::Leader(_))
    }

    /// The commit LSN while elected.
    pub fn commit_lsn(&self) -> Option<Lsn> {
        match &self.phase {
            Phase::Leader(l) => Some(l.commit_lsn),
            _ => None,
        }
    }

    /// The WAL this proposer knows for its term (while elected and after the donor answered).
    pub fn log(&self) -> Option<&[Record]> {
        match &self.phase {
            Phase::Leader(l) => l.log.as_deref(),
            _ => None,
        }
    }

    /// Starts (or restarts) an election: greets every acceptor.
    pub fn start_election(&mut self) -> Vec<ProposerAction> {
        self.phase = Phase::Greeting { terms: BTreeMap::new() };
        (0..self.n).map(|i| ProposerAction::Send(i, ToAcceptor::Greeting)).collect()
    }

    /// Appends a client record of `len` bytes; returns its LSN range, or `None` if this
    /// proposer cannot write now (not elected, or still fetching the donor's WAL).
    pub fn append(&mut self, payload: u64, len: u64) -> Option<(Lsn, Lsn, Vec<ProposerAction>)> {
        let Phase::Leader(l) = &mut self.phase else { return None };
        let log = l.log.as_mut()?;
        let start = log.last().map_or(l.start_lsn, |r| r.end);
        let end = Lsn(start.0 + len.max(1));
        log.push(Record { start, end, payload });
        let actions = self.stream_all();
        Some((start, end, actions))
    }

    /// Timer tick: resend whatever has not been answered.
    pub fn tick(&mut self) -> Vec<ProposerAction> {
        let term = self.term;
        match &self.phase {
            Phase::Idle => Vec::new(),
            Phase::Greeting { terms } => (0..self.n)
                .filter(|i| !terms.contains_key(i))
                .map(|i| ProposerAction::Send(i, ToAcceptor::Greeting))
                .collect(),
            Phase::Voting { votes, .. } => (0..self.n)
                .filter(|i| !votes.contains_key(i))
                .map(|i| ProposerAction::Send(i, ToAcceptor::VoteRequest { term }))
                .collect(),
            Phase::Leader(l) => {
                let mut out = Vec::new();
                if l.log.is_none() {
                    out.push(ProposerAction::Send(l.donor, ToAcceptor::FetchWal { term, from: Lsn(0) }));
                }
                for i in (0..self.n).filter(|i| !l.flush.contains_key(i)) {
                    out.push(ProposerAction::Send(i, self.elected_msg(l)));
                }
                out.extend(self.stream_all());
                out
            }
        }
    }

    fn elected_msg(&self, l: &Leader) -> ToAcceptor {
        ToAcceptor::Elected { term: self.term, history: l.history.clone(), start_lsn: l.start_lsn }
    }

    /// Sends each joined acceptor the WAL it misses (and the commit LSN).
    fn stream_all(&self) -> Vec<ProposerAction> {
        let Phase::Leader(l) = &self.phase else { return Vec::new() };
        let Some(log) = &l.log else { return Vec::new() };
        let mut out = Vec::new();
        for (&i, &flush) in &l.flush {
            let from = log.partition_point(|r| r.start < flush);
            let records: Vec<Record> = log[from..].iter().take(MAX_APPEND_RECORDS).cloned().collect();
            out.push(ProposerAction::Send(
                i,
                ToAcceptor::Append { term: self.term, begin_lsn: flush, records, commit_lsn: l.commit_lsn },
            ));
        }
        out
    }

    /// Handles a message from acceptor `from`.
    pub fn handle(&mut self, from: NodeId, msg: ToProposer) -> Vec<ProposerAction> {
        let mut out = Vec::new();
        let majority = self.majority();
        match msg {
            ToProposer::GreetingReply { term } => {
                let Phase::Greeting { terms } = &mut self.phase else { return out };
                terms.insert(from, term);
                if terms.len() >= majority {
                    let highest = terms.values().copied().max().unwrap_or(0);
                    self.term = self.term.max(highest) + 1;
                    self.phase = Phase::Voting { votes: BTreeMap::new(), refused: 0 };
                    let term = self.term;
                    out.extend((0..self.n).map(|i| ProposerAction::Send(i, ToAcceptor::VoteRequest { term })));
                }
            }
            ToProposer::Vote { term, granted, acceptor_term, history, flush_lsn, .. } => {
                if term != self.term {
                    return out;
                }
                if acceptor_term > self.term {
                    return self.step_down(acceptor_term);
                }
                let Phase::Voting { votes, refused } = &mut self.phase else { return out };
                if !granted {
                    // Another proposer took this acceptor's vote in the same term.
                    *refused += 1;
                    if *refused > self.n - majority {
                        self.phase = Phase::Idle;
                    }
                    return out;
                }
                votes.insert(from, VoteInfo { history, flush_lsn });
                if votes.len() >= majority {
                    out.extend(self.become_leader());
                }
            }
            ToProposer::ElectedAck { term, flush_lsn } => {
                if term != self.term {
                    return out;
                }
                let Phase::Leader(l) = &mut self.phase else { return out };
                let f = l.flush.entry(from).or_insert(flush_lsn);
                *f = (*f).max(flush_lsn);
                out.extend(self.stream_all());
            }
            ToProposer::Wal { term, from: _, records } => {
                if term != self.term {
                    return out;
                }
                let Phase::Leader(l) = &mut self.phase else { return out };
                if l.log.is_some() || from != l.donor {
                    return out;
                }
                // The donor's WAL up to its flush LSN at vote time is exactly the elected log
                // (it may have taken records of this term since).
                let mut records = records;
                records.retain(|r| r.end <= l.start_lsn);
                if records.last().map_or(Lsn(0), |r| r.end) != l.start_lsn {
                    return out;
                }
                l.log = Some(records);
                out.extend(self.stream_all());
            }
            ToProposer::AppendAck { term, flush_lsn, .. } => {
                if term != self.term {
                    return out;
                }
                let Phase::Leader(l) = &mut self.phase else { return out };
                let before = l.flush.get(&from).copied();
                l.flush.insert(from, before.map_or(flush_lsn, |b| b.max(flush_lsn)));
                let mut flushes: Vec<Lsn> = l.flush.values().copied().collect();
                if flushes.len() >= majority {
                    flushes.sort_unstable_by(|a, b| b.cmp(a));
                    let quorum = flushes[majority - 1];
                    if quorum >= l.start_lsn && quorum > l.commit_lsn {
                        l.commit_lsn = quorum;
                        out.push(ProposerAction::Commit { term, commit_lsn: quorum });
                    }
                }
                let behind = l.log.as_ref().is_some_and(|log| log.last().is_some_and(|r| r.end > flush_lsn));
                if behind && before.is_none_or(|b| flush_lsn > b) {
                    out.extend(self.stream_all());
                }
            }
            ToProposer::Rejected { term, acceptor_term } => {
                if term == self.term && acceptor_term > self.term {
                    return self.step_down(acceptor_term);
                }
            }
        }
        out
    }

    fn step_down(&mut self, seen: Term) -> Vec<ProposerAction> {
        self.phase = Phase::Idle;
        vec![ProposerAction::SteppedDown { term: self.term, seen }]
    }

    fn become_leader(&mut self) -> Vec<ProposerAction> {
        let Phase::Voting { votes, .. } = &self.phase else { return Vec::new() };
        // The most advanced log: highest last log term, then highest flush LSN.
        let (&donor, best) = votes
            .iter()
            .max_by_key(|(_, v)| (v.history.up_to(v.flush_lsn).last_term(), v.flush_lsn))
            .expect("a majority of votes");
        let start_lsn = best.flush_lsn;
        let mut history = best.history.up_to(start_lsn);
        history.0.push(TermSwitch { term: self.term, lsn: start_lsn });
        // Each acceptor computes its truncation point from this history with
        // `TermHistory::common_point` and reports it in its ElectedAck; streaming starts there.
        let leader = Leader {
            history,
            start_lsn,
            donor,
            log: if start_lsn == Lsn(0) { Some(Vec::new()) } else { None },
            flush: BTreeMap::new(),
            commit_lsn: Lsn(0),
        };
        let mut out = vec![ProposerAction::Elected { term: self.term }];
        if leader.log.is_none() {
            out.push(ProposerAction::Send(donor, ToAcceptor::FetchWal { term: self.term, from: Lsn(0) }));
        }
        for i in 0..self.n {
            out.push(ProposerAction::Send(i, self.elected_msg(&leader)));
        }
        self.phase = Phase::Leader(Box::new(leader));
        out
    }
}
