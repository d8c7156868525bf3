//! The proposer (WAL writer) state machine.

use super::{NodeId, Term, TermHistory, TermSwitch, ToAcceptor, ToProposer};
use bytes::Bytes;
use proto::Lsn;
use std::collections::BTreeMap;

/// Sizes that shape the streaming.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProposerConfig {
    /// At most this many WAL bytes per `Append`.
    pub max_append: u64,
    /// At most this many bytes sent to an acceptor beyond what it acknowledged.
    pub window: u64,
    /// At most this many bytes per `FetchWal`.
    pub max_fetch: u64,
}

impl Default for ProposerConfig {
    fn default() -> Self {
        ProposerConfig { max_append: 128 * 1024, window: 8 * 1024 * 1024, max_fetch: 1024 * 1024 }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProposerAction {
    /// Send a message without WAL.
    Send(NodeId, ToAcceptor),
    /// Send `ToAcceptor::Append { term, begin_lsn: begin, data, commit_lsn }` to `to`, with
    /// the shell's WAL bytes in `[begin, end)` (none if `begin == end`).
    SendWal { to: NodeId, term: Term, begin: Lsn, end: Lsn, commit_lsn: Lsn },
    /// Keep these fetched bytes: the WAL the shell can send now begins at `from`.
    StoreWal { from: Lsn, data: Bytes },
    /// This proposer won `term`; its own WAL continues the elected history at `start_lsn`,
    /// and the donor's log is the history below it. A `start_lsn` of 0 means there is no WAL
    /// anywhere (and no own start): nothing is sent and the proposer goes idle.
    Elected { term: Term, start_lsn: Lsn, donor: NodeId },
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

/// A joined acceptor, as the leader sees it.
#[derive(Clone, Copy, Debug)]
struct Peer {
    /// Acknowledged durable end in this term.
    flush: Lsn,
    /// Sent up to here (at least `flush`).
    sent: Lsn,
    /// The commit LSN last sent, and last acknowledged.
    commit_sent: Lsn,
    commit_acked: Lsn,
    /// `flush` at the previous tick, to notice a stalled stream.
    flush_at_tick: Lsn,
}

#[derive(Clone, Debug)]
struct Leader {
    history: TermHistory,
    start_lsn: Lsn,
    donor: NodeId,
    /// The shell has WAL in `[floor, end)`.
    floor: Lsn,
    end: Lsn,
    /// The ends given to `append` (at or above the lowest joined acceptor's flush LSN):
    /// WAL is sent in pieces that end there, so that an acceptor's log ends where its
    /// writer's did (for a compute, at a record boundary), never inside a record.
    boundaries: std::collections::BTreeSet<Lsn>,
    /// The outstanding fetch: (from whom, from, to).
    fetching: Option<(NodeId, Lsn, Lsn)>,
    peers: BTreeMap<NodeId, Peer>,
    commit_lsn: Lsn,
}

/// Where the piece of WAL sent from `from` ends: within `max` bytes, at the last `append`
/// boundary that fits (or the first one after `from` if none fits, up to 64 times `max`);
/// below the proposer's own start, at most at that start.
fn chunk_end(boundaries: &std::collections::BTreeSet<Lsn>, start_lsn: Lsn, end: Lsn, from: Lsn, max: u64) -> Lsn {
    let limit = Lsn((from.0 + max).min(end.0));
    if from < start_lsn {
        return limit.min(start_lsn);
    }
    if let Some(&b) = boundaries.range(..=limit).next_back() {
        if b > from {
            return b;
        }
    }
    match boundaries.range(Lsn(from.0 + 1)..).next() {
        Some(&b) if b.0 - from.0 <= max.saturating_mul(64) => b,
        _ => limit,
    }
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
    config: ProposerConfig,
    /// Where this proposer's own WAL begins (0: it has none, e.g. a sync).
    wal_start: Lsn,
    term: Term,
    phase: Phase,
}

impl Proposer {
    /// A proposer for `acceptors` acceptors whose own WAL begins at `wal_start` (the LSN its
    /// compute started at; `Lsn(0)` if it writes none). `wal_start` is used only when no
    /// acceptor has any WAL: it then becomes the beginning of the timeline's WAL.
    pub fn new(acceptors: usize, wal_start: Lsn, config: ProposerConfig) -> Proposer {
        Proposer { n: acceptors, config, wal_start, term: 0, phase: Phase::Idle }
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

    /// While elected: the start of its own WAL and the end of what it was given.
    pub fn wal_range(&self) -> Option<(Lsn, Lsn)> {
        match &self.phase {
            Phase::Leader(l) => Some((l.start_lsn, l.end)),
            _ => None,
        }
    }

    /// Per joined acceptor while elected: its acknowledged flush LSN.
    pub fn acceptor_flush(&self) -> Vec<(NodeId, Lsn)> {
        match &self.phase {
            Phase::Leader(l) => l.peers.iter().map(|(&i, p)| (i, p.flush)).collect(),
            _ => Vec::new(),
        }
    }

    /// Starts (or restarts) an election: greets every acceptor.
    pub fn start_election(&mut self) -> Vec<ProposerAction> {
        self.phase = Phase::Greeting { terms: BTreeMap::new() };
        (0..self.n).map(|i| ProposerAction::Send(i, ToAcceptor::Greeting)).collect()
    }

    /// The shell now has WAL up to `end` (new WAL written by the client, continuing
    /// contiguously from the previous end). Ignored unless elected.
    pub fn append(&mut self, end: Lsn) -> Vec<ProposerAction> {
        let Phase::Leader(l) = &mut self.phase else { return Vec::new() };
        if end <= l.end {
            return Vec::new();
        }
        l.end = end;
        l.boundaries.insert(end);
        self.stream_all()
    }

    /// The connection to acceptor `i` was lost and re-established: what was sent on it may
    /// be lost, so it must join again (its `ElectedAck` says where it stands).
    pub fn reconnected(&mut self, i: NodeId) -> Vec<ProposerAction> {
        let term = self.term;
        let msg = match &mut self.phase {
            Phase::Idle => return Vec::new(),
            Phase::Greeting { .. } => ToAcceptor::Greeting,
            Phase::Voting { votes, .. } if !votes.contains_key(&i) => ToAcceptor::VoteRequest { term },
            Phase::Voting { .. } => return Vec::new(),
            Phase::Leader(l) => {
                l.peers.remove(&i);
                if l.fetching.is_some_and(|(from, _, _)| from == i) {
                    l.fetching = None;
                }
                ToAcceptor::Elected { term, history: l.history.clone(), start_lsn: l.start_lsn }
            }
        };
        vec![ProposerAction::Send(i, msg)]
    }

    /// Timer tick: resend whatever has not been answered.
    pub fn tick(&mut self) -> Vec<ProposerAction> {
        let term = self.term;
        match &mut self.phase {
            Phase::Idle => Vec::new(),
            Phase::Greeting { terms } => {
                (0..self.n).filter(|i| !terms.contains_key(i)).map(|i| ProposerAction::Send(i, ToAcceptor::Greeting)).collect()
            }
            Phase::Voting { votes, .. } => {
                (0..self.n).filter(|i| !votes.contains_key(i)).map(|i| ProposerAction::Send(i, ToAcceptor::VoteRequest { term })).collect()
            }
            Phase::Leader(l) => {
                let mut out = Vec::new();
                for i in (0..self.n).filter(|i| !l.peers.contains_key(i)) {
                    let msg = ToAcceptor::Elected { term, history: l.history.clone(), start_lsn: l.start_lsn };
                    out.push(ProposerAction::Send(i, msg));
                }
                // A stream that made no progress since the last tick lost something: resend
                // from what was acknowledged.
                for p in l.peers.values_mut() {
                    if p.flush == p.flush_at_tick && p.sent > p.flush {
                        p.sent = p.flush;
                        p.commit_sent = Lsn(0);
                    }
                    if p.commit_acked < l.commit_lsn {
                        p.commit_sent = p.commit_acked;
                    }
                    p.flush_at_tick = p.flush;
                }
                l.fetching = None;
                out.extend(self.stream_all());
                out
            }
        }
    }

    /// Sends each joined acceptor the WAL it misses (within the window) and the commit LSN,
    /// and fetches WAL older than the shell has if an acceptor needs it.
    fn stream_all(&mut self) -> Vec<ProposerAction> {
        let term = self.term;
        let cfg = self.config;
        let Phase::Leader(l) = &mut self.phase else { return Vec::new() };
        let mut out = Vec::new();
        let mut need_below_floor: Option<Lsn> = None;
        for (&i, p) in l.peers.iter_mut() {
            let mut from = p.sent.max(p.flush);
            if from < l.floor {
                need_below_floor = Some(need_below_floor.map_or(from, |n: Lsn| n.min(from)));
                continue;
            }
            let mut sent_any = false;
            while from < l.end && from.0 - p.flush.0 < cfg.window {
                let to = chunk_end(&l.boundaries, l.start_lsn, l.end, from, cfg.max_append);
                out.push(ProposerAction::SendWal { to: i, term, begin: from, end: to, commit_lsn: l.commit_lsn });
                from = to;
                sent_any = true;
            }
            if !sent_any && l.commit_lsn > p.commit_sent {
                // Nothing new to send, but the acceptor should learn the commit LSN.
                out.push(ProposerAction::SendWal { to: i, term, begin: from, end: from, commit_lsn: l.commit_lsn });
                sent_any = true;
            }
            if sent_any {
                p.sent = from;
                p.commit_sent = l.commit_lsn;
            }
        }
        if let Some(need) = need_below_floor {
            if l.fetching.is_none() {
                // Any acceptor that joined this term and has WAL up to the floor has the
                // elected history's bytes there; prefer the donor.
                let source =
                    std::iter::once(l.donor).chain(l.peers.keys().copied()).find(|s| l.peers.get(s).is_some_and(|p| p.flush >= l.floor));
                if let Some(s) = source {
                    let from = Lsn(need.0.max(l.floor.0.saturating_sub(cfg.max_fetch)));
                    l.fetching = Some((s, from, l.floor));
                    out.push(ProposerAction::Send(s, ToAcceptor::FetchWal { term, from, to: l.floor }));
                }
            }
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
                l.peers.entry(from).or_insert(Peer {
                    flush: flush_lsn,
                    sent: flush_lsn,
                    commit_sent: Lsn(0),
                    commit_acked: Lsn(0),
                    flush_at_tick: flush_lsn,
                });
                out.extend(self.update_commit());
                out.extend(self.stream_all());
            }
            ToProposer::Wal { term, from: wal_from, data } => {
                if term != self.term {
                    return out;
                }
                let Phase::Leader(l) = &mut self.phase else { return out };
                let Some((source, want_from, want_to)) = l.fetching else { return out };
                if source != from || wal_from != want_from || wal_from.0 + data.len() as u64 != want_to.0 || want_to != l.floor {
                    return out;
                }
                l.fetching = None;
                l.floor = wal_from;
                out.push(ProposerAction::StoreWal { from: wal_from, data });
                out.extend(self.stream_all());
            }
            ToProposer::AppendAck { term, flush_lsn, commit_lsn } => {
                if term != self.term {
                    return out;
                }
                let Phase::Leader(l) = &mut self.phase else { return out };
                let Some(p) = l.peers.get_mut(&from) else { return out };
                if flush_lsn < p.flush {
                    return out;
                }
                p.flush = flush_lsn;
                p.commit_acked = p.commit_acked.max(commit_lsn);
                if p.sent < flush_lsn {
                    p.sent = flush_lsn;
                }
                // Boundaries below every joined acceptor's flush LSN are not needed any more.
                if let Some(low) = l.peers.values().map(|p| p.flush).min() {
                    if l.boundaries.first().is_some_and(|b| *b < low) {
                        l.boundaries = l.boundaries.split_off(&low);
                    }
                }
                out.extend(self.update_commit());
                out.extend(self.stream_all());
            }
            ToProposer::Rejected { term, acceptor_term } => {
                if term == self.term && acceptor_term > self.term {
                    return self.step_down(acceptor_term);
                }
            }
        }
        out
    }

    /// Recomputes the commit LSN: the highest LSN flushed on a majority in this term, once it
    /// reaches this term's start.
    fn update_commit(&mut self) -> Vec<ProposerAction> {
        let majority = self.majority();
        let term = self.term;
        let Phase::Leader(l) = &mut self.phase else { return Vec::new() };
        let mut flushes: Vec<Lsn> = l.peers.values().map(|p| p.flush).collect();
        if flushes.len() < majority {
            return Vec::new();
        }
        flushes.sort_unstable_by(|a, b| b.cmp(a));
        let quorum = flushes[majority - 1];
        if quorum >= l.start_lsn && quorum > l.commit_lsn {
            l.commit_lsn = quorum;
            return vec![ProposerAction::Commit { term, commit_lsn: quorum }];
        }
        Vec::new()
    }

    fn step_down(&mut self, seen: Term) -> Vec<ProposerAction> {
        self.phase = Phase::Idle;
        let term = self.term;
        // The next election starts above the term seen.
        self.term = self.term.max(seen);
        vec![ProposerAction::SteppedDown { term, seen }]
    }

    fn become_leader(&mut self) -> Vec<ProposerAction> {
        let Phase::Voting { votes, .. } = &self.phase else { return Vec::new() };
        // The most advanced log: highest last log term, then highest flush LSN.
        let (&donor, best) =
            votes.iter().max_by_key(|(_, v)| (v.history.up_to(v.flush_lsn).last_term(), v.flush_lsn)).expect("a majority of votes");
        let has_wal = !best.history.0.is_empty() && best.flush_lsn > Lsn(0);
        let start_lsn = if has_wal { best.flush_lsn } else { self.wal_start };
        let mut out = vec![ProposerAction::Elected { term: self.term, start_lsn, donor }];
        if start_lsn == Lsn(0) {
            self.phase = Phase::Idle;
            return out;
        }
        let mut history = if has_wal { best.history.up_to(start_lsn) } else { TermHistory::default() };
        history.0.push(TermSwitch { term: self.term, lsn: start_lsn });
        // Each acceptor computes its truncation point from this history with
        // `TermHistory::common_point` and reports it in its ElectedAck; streaming starts there.
        for i in 0..self.n {
            let msg = ToAcceptor::Elected { term: self.term, history: history.clone(), start_lsn };
            out.push(ProposerAction::Send(i, msg));
        }
        self.phase = Phase::Leader(Box::new(Leader {
            history,
            start_lsn,
            donor,
            floor: start_lsn,
            end: start_lsn,
            boundaries: std::collections::BTreeSet::new(),
            fetching: None,
            peers: BTreeMap::new(),
            commit_lsn: Lsn(0),
        }));
        out
    }
}
