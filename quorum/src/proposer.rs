//! The proposer (WAL writer) state machine, with the policy of its two real users (a
//! compute and compute_ctl's sync, [`ProposerMode`]) so that the simulation drives the same
//! decisions the shells act on: when a compute must fence itself, when a sync is done, and
//! which record boundaries each acceptor learns (the shell declares them; the crate's
//! "Record boundaries").
//!
//! Invariants: elected only with a majority of votes in its own term (asserted); the commit
//! LSN only moves forward, never below the term's start, and is always a boundary LSN that
//! a majority of acceptors acknowledged, each of which it knew to be a voter (it granted
//! this term's vote, or greeted as no learner: the crate's "Late voters"; so a record
//! boundary, and never resting on a learner); once elected it asks for no vote (a learner
//! may join a term whose vote request it saw); a sync commits and ends only at
//! its start LSN (asserted); the peer horizon it sends is never above the boundary LSN any
//! acceptor acknowledged in its term (asserted); once stopped (fenced or synced) it returns
//! no action, ever.
//! Acknowledgements that claim WAL the proposer never had are ignored, not asserted on: they
//! come from another process.

use super::{majority, NodeId, Term, TermHistory, TermSwitch, ToAcceptor, ToProposer};
use crate::fetched::Fetched;
use crate::wire::WAL_BYTES_MAX;
use bytes::Bytes;
use proto::Lsn;
use std::collections::{BTreeMap, BTreeSet};

mod leader;
use leader::{piece_end, Leader, Peer};

/// What the proposer is for; decides what ends it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProposerMode {
    /// The protocol without a user's policy: it continues whatever log it is elected with,
    /// steps down on a higher term and may be elected again. Scripted tests use it to drive
    /// acceptors into states a real user would stop at.
    #[default]
    Plain,
    /// Inside a compute, whose WAL begins at the proposer's `wal_start`: it streams only if
    /// elected with `start_lsn == wal_start`, and once elected any higher term fences it
    /// ([`ProposerAction::Fenced`]). Before it asks for votes it checks the logs of the
    /// majority that answered its greeting (a pre-vote): if the most advanced one does not
    /// end at `wal_start`, the election could only fence it, and its higher term would fence
    /// the compute that is writing now; it fences itself at once and asks for no vote. A compute must never commit WAL that does not continue
    /// the safekeepers' log, and it cannot rewrite its own WAL to follow a newer one.
    Compute,
    /// compute_ctl's sync: writes no WAL of its own (`wal_start` 0). Elected, it makes a
    /// majority hold and acknowledge the commit of the elected log up to its end, then
    /// reports that end ([`ProposerAction::SyncDone`]) and stops.
    Sync,
}

/// Sizes that shape the streaming, and the mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProposerConfig {
    /// At most this many WAL bytes per `Append` (a piece may end inside a record; at most
    /// [`WAL_BYTES_MAX`], what a message carries).
    pub max_append: u64,
    /// At most this many bytes sent to an acceptor beyond what it acknowledged.
    pub window: u64,
    /// At most this many bytes per `FetchWal`.
    pub max_fetch: u64,
    /// At most this many fetched bytes kept by the shell at once (at least `max_fetch`): WAL
    /// an acceptor needs below what the shell can read itself is fetched just ahead of it
    /// and released behind it (`fetched.rs`).
    pub max_fetched: u64,
    pub mode: ProposerMode,
    /// Whether a commit LSN that no WAL carries waits for the shell to ask for it
    /// ([`Proposer::announce_commit`], or the next tick) instead of going out at once.
    ///
    /// Acceptors need the commit LSN only to serve WAL onwards (the pageserver and replicas
    /// stream what is committed) and to remove it; no commit waits for them to learn it. Sent
    /// as soon as it moves, it costs each acceptor a message, a wake-up and an answer per
    /// commit when the next commit's WAL, coming a moment later under load, would carry it
    /// anyway. The shell announces it after a short delay if no WAL took it along
    /// (`walproposer`: [`Proposer::commit_unannounced`]). Ignored by a sync, whose whole
    /// purpose is making a majority acknowledge the commit LSN.
    pub defer_commit_lsn: bool,
}

impl Default for ProposerConfig {
    fn default() -> Self {
        ProposerConfig {
            max_append: 128 * 1024,
            window: 8 * 1024 * 1024,
            max_fetch: 1024 * 1024,
            // The window and two fetches: a lagging acceptor's stream is never short of WAL.
            max_fetched: 10 * 1024 * 1024,
            mode: ProposerMode::Plain,
            defer_commit_lsn: false,
        }
    }
}

/// What makes [`Proposer::stream`] look at what each acceptor should be sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Push {
    /// Something changed (WAL, an acknowledgement, a peer): WAL, boundaries and (unless
    /// deferred, [`ProposerConfig::defer_commit_lsn`]) the commit LSN go out.
    Changes,
    /// The timer: the commit LSN and the horizons too.
    Tick,
    /// The shell asks for the commit LSN ([`Proposer::announce_commit`]).
    CommitLsn,
}

/// Why a WAL proposer (`ProposerMode::Compute`) fenced itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceReason {
    /// The acceptors' log ends at `start_lsn`, not where this compute's WAL starts: another
    /// compute has written WAL since (or this one is a stale restart). Found from the
    /// greetings, before any vote (then `start_lsn` is the end of the most advanced log of
    /// the majority that answered), or, if the voters' logs differ from the greeters', once
    /// elected.
    WalMismatch { start_lsn: Lsn, wal_start: Lsn },
    /// After being elected, acceptor `by` has seen term `seen` from another proposer.
    HigherTerm { by: NodeId, seen: Term },
}

/// At most this many record boundaries are remembered (the oldest are forgotten first): a
/// boundary costs memory for as long as some acceptor may still need WAL below it, and an
/// acceptor that is down for long would otherwise keep every one of them alive. Forgetting
/// one is safe: a piece then carries a lower boundary (a true one all the same), and the
/// acceptor's boundary LSN catches up with a later piece, the commit LSN or the term's start.
const BOUNDARIES_MAX: usize = 1 << 16;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProposerAction {
    /// Send a message without WAL.
    Send(NodeId, ToAcceptor),
    /// Send `ToAcceptor::Append { term, begin_lsn: begin, data, boundary_lsn, commit_lsn,
    /// peer_horizon_lsn, remote_consistent_lsn }` to `to`, with the shell's WAL bytes in
    /// `[begin, end)` (none if `begin == end`).
    SendWal {
        to: NodeId,
        term: Term,
        begin: Lsn,
        end: Lsn,
        boundary_lsn: Lsn,
        commit_lsn: Lsn,
        peer_horizon_lsn: Lsn,
        remote_consistent_lsn: Lsn,
    },
    /// Keep these fetched bytes: they continue the fetched WAL the shell keeps (or begin it,
    /// when it keeps none).
    StoreWal { from: Lsn, data: Bytes },
    /// Fetched WAL below `below` is not needed any more: the shell may free it (it is never
    /// asked to send it again; what it keeps above stays contiguous).
    ReleaseWal { below: Lsn },
    /// This proposer won `term`; its own WAL continues the elected history at `start_lsn`,
    /// and the donor's log is the history below it. A `start_lsn` of 0 means there is no WAL
    /// anywhere (and no own start): nothing is sent and the proposer goes idle.
    Elected { term: Term, start_lsn: Lsn, donor: NodeId },
    /// WAL below this LSN is on a majority of acceptors (in this proposer's term).
    Commit { term: Term, commit_lsn: Lsn },
    /// Acceptor `by` has seen a higher term before this proposer was elected (or, in `Plain`
    /// mode, at any time): it stopped and may start another election later.
    SteppedDown { term: Term, seen: Term, by: NodeId },
    /// A majority refused the vote in `term` (another proposer took it, or a learner does
    /// not vote: `learners` are those that greeted as learners): it stopped and may start
    /// another election later.
    ElectionLost { term: Term, learners: Vec<NodeId> },
    /// `Compute` mode: this proposer must never commit again; it stopped for good.
    Fenced { term: Term, reason: FenceReason },
    /// `Sync` mode: WAL up to `lsn` is committed and a majority acknowledged that commit LSN;
    /// `None` when no acceptor has WAL for the timeline. It stopped for good.
    SyncDone { term: Term, lsn: Option<Lsn> },
    /// The shell's own WAL in `[from, to)` is gone ([`Proposer::wal_removed_below`]) and no
    /// acceptor acknowledged it in this term: it can never be committed, nor can anything
    /// after it. It stopped for good.
    WalLost { term: Term, from: Lsn, to: Lsn },
}

/// An acceptor's answer to a greeting.
#[derive(Clone, Copy, Debug)]
struct GreetInfo {
    term: Term,
    last_log_term: Term,
    boundary_lsn: Lsn,
    learner: bool,
}

#[derive(Clone, Debug)]
struct VoteInfo {
    history: TermHistory,
    boundary_lsn: Lsn,
    peer_horizon_lsn: Lsn,
}

#[derive(Clone, Debug)]
enum Phase {
    Idle,
    Greeting {
        /// Which greeting this is (`ToAcceptor::Greeting`): replies to others are ignored.
        round: u64,
        greeted: BTreeMap<NodeId, GreetInfo>,
    },
    Voting {
        votes: BTreeMap<NodeId, VoteInfo>,
        /// Acceptors that refused this term's vote, each counted once (a duplicated request
        /// is refused by the acceptor that granted the first copy).
        refused: BTreeSet<NodeId>,
        /// Acceptors that greeted as learners (they refuse the vote; see the crate's
        /// "Learners"), named by [`ProposerAction::ElectionLost`].
        learners: BTreeSet<NodeId>,
    },
    Leader(Box<Leader>),
    /// Fenced or synced: nothing more, ever.
    Stopped,
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
    /// The highest remote-consistent LSN the shell reported (from acceptors' feedback), which
    /// `Append`s relay to every acceptor.
    remote_consistent_lsn: Lsn,
    /// Greetings sent so far (each election's has its own round).
    rounds: u64,
    /// Names this proposer in its vote requests and elections ([`Proposer::identified`]).
    id: u64,
}

impl Proposer {
    /// A proposer for `acceptors` acceptors whose own WAL begins at `wal_start` (the LSN its
    /// compute started at; `Lsn(0)` if it writes none). When no acceptor has any WAL,
    /// `wal_start` becomes the beginning of the timeline's WAL. A `Compute` needs a
    /// `wal_start`, a `Sync` has none: anything else is a caller's bug and panics.
    pub fn new(acceptors: usize, wal_start: Lsn, config: ProposerConfig) -> Proposer {
        assert!(acceptors > 0, "a proposer needs acceptors");
        assert!(
            config.max_append > 0 && config.max_append <= WAL_BYTES_MAX as u64,
            "max_append {} outside 1..={WAL_BYTES_MAX}",
            config.max_append
        );
        assert!(
            config.max_fetch > 0 && config.max_fetched >= config.max_fetch,
            "max_fetch {} must be positive and at most max_fetched {}",
            config.max_fetch,
            config.max_fetched
        );
        match config.mode {
            ProposerMode::Compute => assert!(wal_start.is_valid(), "a WAL proposer needs its WAL start"),
            ProposerMode::Sync => assert_eq!(wal_start, Lsn(0), "a sync writes no WAL of its own"),
            ProposerMode::Plain => {}
        }
        Proposer { n: acceptors, config, wal_start, term: 0, phase: Phase::Idle, remote_consistent_lsn: Lsn(0), rounds: 0, id: 0 }
    }

    /// Gives the proposer an id that its vote requests and elections carry, which no other
    /// proposer of the timeline should share (the shell picks it at random): a learner joins
    /// only an election whose vote request it saw from the same proposer (the crate's
    /// "Learners"). 0 by default.
    pub fn identified(mut self, id: u64) -> Proposer {
        self.id = id;
        self
    }

    fn majority(&self) -> usize {
        majority(self.n)
    }

    pub fn mode(&self) -> ProposerMode {
        self.config.mode
    }

    /// Fenced or synced: it ignores everything from now on.
    pub fn is_stopped(&self) -> bool {
        matches!(self.phase, Phase::Stopped)
    }

    /// While elected: how many acceptors acknowledged a commit LSN of at least `lsn` (a sync
    /// is done when a majority acknowledged its start LSN).
    pub fn acked_commit_count(&self, lsn: Lsn) -> usize {
        match &self.phase {
            Phase::Leader(l) => l.peers.values().filter(|p| p.commit_acked >= lsn).count(),
            _ => 0,
        }
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

    /// While elected: the peer horizon, the lowest boundary LSN every acceptor acknowledged in
    /// this term, capped by the commit LSN; 0 until every acceptor has acknowledged one (or
    /// when not elected).
    pub fn peer_horizon_lsn(&self) -> Lsn {
        match &self.phase {
            Phase::Leader(l) => l.peer_horizon(),
            _ => Lsn(0),
        }
    }

    /// While electing: the acceptors that greeted as learners (they refuse to vote; see the
    /// crate's "Learners").
    pub fn learners(&self) -> Vec<NodeId> {
        match &self.phase {
            Phase::Voting { learners, .. } => learners.iter().copied().collect(),
            _ => Vec::new(),
        }
    }

    /// The pageserver's remote-consistent LSN as an acceptor reported it (its shell reads the
    /// acceptors' feedback). Only the highest counts; it goes to every acceptor with the next
    /// `Append`, or with an empty one at the next tick. Returns no actions.
    pub fn set_remote_consistent_lsn(&mut self, lsn: Lsn) {
        self.remote_consistent_lsn = self.remote_consistent_lsn.max(lsn);
    }

    pub fn remote_consistent_lsn(&self) -> Lsn {
        self.remote_consistent_lsn
    }

    /// Starts (or restarts) an election: greets every acceptor. A stopped proposer stays
    /// stopped.
    pub fn start_election(&mut self) -> Vec<ProposerAction> {
        if self.is_stopped() {
            return Vec::new();
        }
        self.rounds += 1;
        let round = self.rounds;
        self.phase = Phase::Greeting { round, greeted: BTreeMap::new() };
        (0..self.n).map(|i| ProposerAction::Send(i, ToAcceptor::Greeting { round })).collect()
    }

    /// The shell now has WAL up to `end` (new WAL written by the client, continuing
    /// contiguously from the previous end; it may end inside a record), and `boundary` ends
    /// a whole record (at most `end`; the highest the shell knows, typically the end of the
    /// last whole PostgreSQL record it decoded). WAL is sent in pieces of any size; commits
    /// and the end of the log an election sees go only as far as such boundaries (the
    /// crate's "Record boundaries"), so a compute must declare the end of every record it
    /// wants committed. Ignored unless elected. A sync has no WAL of its own to append.
    pub fn append(&mut self, end: Lsn, boundary: Lsn) -> Vec<ProposerAction> {
        assert!(self.config.mode != ProposerMode::Sync, "a sync has no WAL of its own to append");
        assert!(boundary <= end, "record boundary {boundary} beyond the WAL's end {end}");
        let Phase::Leader(l) = &mut self.phase else { return Vec::new() };
        if boundary > l.start_lsn {
            l.boundaries.insert(boundary);
            if l.boundaries.len() > BOUNDARIES_MAX {
                l.boundaries.pop_first();
            }
        }
        l.end = l.end.max(end);
        self.stream(Push::Changes)
    }

    /// The connection to acceptor `i` was lost and re-established: what was sent on it may
    /// be lost, so it must join again (its `ElectedAck` says where it stands). The shell
    /// calls it for every new connection, and drops what arrives on an older one: a new
    /// incarnation of the acceptor (one that lost its disk) comes with a new connection.
    /// While elected, the acceptor counts towards commits again once it answered the
    /// greeting sent with the election as no learner (the crate's "Late voters").
    pub fn reconnected(&mut self, i: NodeId) -> Vec<ProposerAction> {
        let term = self.term;
        let msg = match &mut self.phase {
            Phase::Idle | Phase::Stopped => return Vec::new(),
            Phase::Greeting { round, .. } => ToAcceptor::Greeting { round: *round },
            Phase::Voting { votes, refused, .. } => {
                // The acceptor may have restarted, and if it lost its disk, its vote with it:
                // a vote of an earlier incarnation must not count (the new one, a learner,
                // could otherwise graduate in a lower term and vote for this term again,
                // for another proposer). Asked again; a vote it kept is refused now (the
                // term is not above its own), which costs only this election.
                votes.remove(&i);
                refused.remove(&i);
                ToAcceptor::VoteRequest { term, proposer: self.id }
            }
            Phase::Leader(l) => {
                l.peers.remove(&i);
                if l.fetched.pending.is_some_and(|(from, _, _)| from == i) {
                    l.fetched.pending = None;
                }
                // The acceptor may have lost its disk and be a learner now: it counts again
                // once it says it is not, on this connection (the crate's "Late voters").
                // It is greeted, never asked for a vote: a learner may join a term whose
                // vote request it saw, and once elected that is unsafe.
                l.voters.remove(&i);
                self.rounds += 1;
                l.greeting_round[i] = self.rounds;
                let elected = ToAcceptor::Elected {
                    term,
                    history: l.history.clone(),
                    start_lsn: l.start_lsn,
                    log_begin: l.log_begin,
                    proposer: self.id,
                };
                return vec![ProposerAction::Send(i, elected), ProposerAction::Send(i, ToAcceptor::Greeting { round: self.rounds })];
            }
        };
        vec![ProposerAction::Send(i, msg)]
    }

    /// Whether some joined acceptor that can be sent to has not been sent the current
    /// commit LSN: with [`ProposerConfig::defer_commit_lsn`], the shell then calls
    /// [`Proposer::announce_commit`] a moment later, unless WAL carried it meanwhile.
    pub fn commit_unannounced(&self) -> bool {
        let Phase::Leader(l) = &self.phase else { return false };
        l.peers.values().any(|p| l.commit_lsn > p.commit_sent && l.readable_end(p.sent.max(p.flush)).is_some())
    }

    /// Sends the commit LSN to every joined acceptor that has not been sent it (with
    /// [`ProposerConfig::defer_commit_lsn`], nothing else does before the next tick).
    pub fn announce_commit(&mut self) -> Vec<ProposerAction> {
        self.stream(Push::CommitLsn)
    }

    /// Timer tick: resend whatever has not been answered.
    pub fn tick(&mut self) -> Vec<ProposerAction> {
        let term = self.term;
        match &mut self.phase {
            Phase::Idle | Phase::Stopped => Vec::new(),
            Phase::Greeting { round, greeted } => {
                let round = *round;
                (0..self.n).filter(|i| !greeted.contains_key(i)).map(|i| ProposerAction::Send(i, ToAcceptor::Greeting { round })).collect()
            }
            Phase::Voting { votes, .. } => {
                let proposer = self.id;
                (0..self.n)
                    .filter(|i| !votes.contains_key(i))
                    .map(|i| ProposerAction::Send(i, ToAcceptor::VoteRequest { term, proposer }))
                    .collect()
            }
            Phase::Leader(l) => {
                let mut out = Vec::new();
                for i in (0..self.n).filter(|i| !l.peers.contains_key(i)) {
                    let msg = ToAcceptor::Elected {
                        term,
                        history: l.history.clone(),
                        start_lsn: l.start_lsn,
                        log_begin: l.log_begin,
                        proposer: self.id,
                    };
                    out.push(ProposerAction::Send(i, msg));
                }
                // An acceptor not known to be a voter is greeted until it says it is one
                // (it was away during the election, its vote was lost, or it is a learner,
                // which may graduate in this term).
                for i in (0..self.n).filter(|i| !l.voters.contains(i)) {
                    out.push(ProposerAction::Send(i, ToAcceptor::Greeting { round: l.greeting_round[i] }));
                }
                // A stream that made no progress since the last tick lost something: resend
                // from what was acknowledged.
                let mut lagging = Vec::new();
                for (&i, p) in l.peers.iter_mut() {
                    if p.flush == p.flush_at_tick && p.sent > p.flush {
                        p.sent = p.flush;
                        p.commit_sent = Lsn(0);
                    }
                    if p.commit_acked < l.commit_lsn {
                        p.commit_sent = p.commit_acked;
                    }
                    p.flush_at_tick = p.flush;
                    lagging.push(i);
                }
                // A boundary sent may have been lost too: sent again where the acceptor's
                // acknowledged one is below what its WAL holds.
                for i in lagging {
                    let best = l.boundary_at(l.peers[&i].flush);
                    let p = l.peers.get_mut(&i).expect("listed above");
                    if p.boundary < best {
                        p.boundary_sent = p.boundary;
                    }
                }
                l.fetched.tick();
                out.extend(self.stream(Push::Tick));
                out
            }
        }
    }

    /// Sends each joined acceptor the WAL it misses (within the window) and the commit LSN,
    /// and fetches WAL the shell cannot read itself if an acceptor needs it (below the start
    /// LSN, or below the local floor: `fetched.rs`). Every `Append` carries the peer horizon
    /// and the remote-consistent LSN; on a `tick`, an acceptor that has nothing else coming
    /// gets an empty one when either moved since it was last sent (once per tick at most, not
    /// once per acknowledgement: they only matter for WAL removal, a segment at a time).
    fn stream(&mut self, why: Push) -> Vec<ProposerAction> {
        let term = self.term;
        let cfg = self.config;
        let tick = why == Push::Tick;
        let commit_due = why != Push::Changes || !cfg.defer_commit_lsn || cfg.mode == ProposerMode::Sync;
        let remote_consistent_lsn = self.remote_consistent_lsn;
        let Phase::Leader(l) = &mut self.phase else { return Vec::new() };
        let horizon = l.peer_horizon();
        let commit_lsn = l.commit_lsn;
        // Every acceptor acknowledged at least this in this term: its boundary LSN never goes
        // below it again (the crate's "WAL removal"), which is what lets acceptors remove WAL
        // below.
        assert!(l.acked_boundary.iter().all(|&f| f >= horizon), "peer horizon {horizon} above an acknowledged boundary LSN");
        let mut out = Vec::new();
        // Fetched WAL below the lowest flush LSN acknowledged by an acceptor that still needs
        // fetched WAL is never sent again in this term (a stream restarts at the acknowledged
        // flush LSN; one that rejoins lower gets its WAL fetched again).
        let keep_from = l.peers.values().filter(|p| p.flush < l.local_floor).map(|p| p.flush).min();
        if let Some(below) = l.fetched.release(keep_from) {
            out.push(ProposerAction::ReleaseWal { below });
        }
        let mut need: Option<Lsn> = None;
        let peers: Vec<NodeId> = l.peers.keys().copied().collect();
        for i in peers {
            let p = l.peers[&i];
            let mut from = p.sent.max(p.flush);
            let Some(until) = l.readable_end(from) else {
                need = Some(need.map_or(from, |n: Lsn| n.min(from)));
                continue;
            };
            let send = |begin: Lsn, end: Lsn, boundary_lsn: Lsn| ProposerAction::SendWal {
                to: i,
                term,
                begin,
                end,
                boundary_lsn,
                commit_lsn,
                peer_horizon_lsn: horizon,
                remote_consistent_lsn,
            };
            let mut sent_any = false;
            let mut boundary_sent = p.boundary_sent;
            while from < until && from.0 - p.flush.0 < cfg.window {
                let to = piece_end(l.start_lsn, l.end, from, cfg.max_append).min(until);
                debug_assert!(to > from && to <= l.end, "piece {from}..{to} outside the WAL up to {}", l.end);
                let boundary = l.boundary_at(to);
                out.push(send(from, to, boundary));
                boundary_sent = boundary_sent.max(boundary);
                from = to;
                sent_any = true;
            }
            if from == until && until < l.end {
                // At the end of the fetched WAL, below the local floor: the next is fetched.
                need = Some(need.map_or(from, |n: Lsn| n.min(from)));
            }
            // A boundary its WAL (as sent) reaches that it has not been told: without it, its
            // boundary LSN, and so commits, would wait for more WAL.
            let boundary = l.boundary_at(from);
            let news = horizon > p.horizon_sent || remote_consistent_lsn > p.remote_consistent_sent;
            if !sent_any && ((commit_due && l.commit_lsn > p.commit_sent) || boundary > boundary_sent.max(p.boundary) || (tick && news)) {
                // Nothing new to send, but the acceptor should learn the commit LSN or a
                // boundary (or, at a tick, the horizons).
                out.push(send(from, from, boundary));
                boundary_sent = boundary_sent.max(boundary);
                sent_any = true;
            }
            let p = l.peers.get_mut(&i).expect("listed above");
            p.boundary_sent = boundary_sent;
            if sent_any {
                p.sent = from;
                p.commit_sent = l.commit_lsn;
                p.horizon_sent = horizon;
                p.remote_consistent_sent = remote_consistent_lsn;
            }
        }
        if let Some(need) = need {
            let (range, freed) = l.fetched.next(need, cfg.max_fetch, cfg.max_fetched, l.local_floor);
            if let Some(below) = freed {
                out.push(ProposerAction::ReleaseWal { below });
            }
            if let Some((from, to)) = range {
                // Any acceptor that joined this term holds the elected history's bytes up to
                // the flush LSN it acknowledged in it (below the start LSN the donor's log,
                // above it this proposer's own WAL); the one that has most of the range,
                // the donor first, and one that left a request unanswered last. Its peer
                // horizon is at most `from` (at most the boundary LSN of the acceptor that
                // needs it), so it never removed that WAL.
                let (donor, unanswered) = (l.donor, l.fetched.unanswered);
                let source = l
                    .peers
                    .iter()
                    .filter(|(_, p)| p.flush > from)
                    .max_by_key(|(&s, p)| (Some(s) != unanswered, p.flush.min(to), s == donor))
                    .map(|(&s, p)| (s, p.flush.min(to)));
                if let Some((s, to)) = source {
                    l.fetched.pending = Some((s, from, to));
                    out.push(ProposerAction::Send(s, ToAcceptor::FetchWal { term, from, to }));
                }
            }
        }
        out
    }

    /// The shell can no longer read its own WAL below `lsn` (PostgreSQL removed old segments
    /// from `pg_wal`): an acceptor that needs WAL below it gets it fetched from another that
    /// acknowledged it in this term, through bounded memory (`fetched.rs`), and streams from
    /// the shell's own WAL again once it passes `lsn`. What was sent from below `lsn` may not
    /// have gone out (the shell could not read it): those streams restart at what their
    /// acceptor acknowledged. If no acceptor acknowledged the WAL that is gone, nobody can
    /// ever have it: [`ProposerAction::WalLost`], and the proposer stops. Ignored unless
    /// elected.
    pub fn wal_removed_below(&mut self, lsn: Lsn) -> Vec<ProposerAction> {
        let term = self.term;
        let Phase::Leader(l) = &mut self.phase else { return Vec::new() };
        let floor = lsn.min(l.end);
        if floor <= l.local_floor {
            return Vec::new();
        }
        l.local_floor = floor;
        // Below the start LSN the donor's log is on a majority; above it, WAL up to the
        // highest flush LSN acknowledged in this term is on that acceptor (or in memory).
        let held = l.acked_flush.iter().copied().max().unwrap_or_default().max(l.start_lsn);
        if held < floor && !(l.fetched.begin <= held && l.fetched.end >= floor) {
            self.phase = Phase::Stopped;
            return vec![ProposerAction::WalLost { term, from: held, to: floor }];
        }
        for p in l.peers.values_mut().filter(|p| p.flush < floor) {
            p.sent = p.flush;
        }
        self.stream(Push::Changes)
    }

    /// While elected: the joined acceptors whose acknowledged flush LSN is below the oldest
    /// WAL the shell can read itself (they are caught up with fetched WAL), with it.
    pub fn catching_up(&self) -> Vec<(NodeId, Lsn)> {
        match &self.phase {
            Phase::Leader(l) => l.peers.iter().filter(|(_, p)| p.flush < l.local_floor).map(|(&i, p)| (i, p.flush)).collect(),
            _ => Vec::new(),
        }
    }

    /// While elected: the fetched WAL the shell keeps, `[begin, end)`.
    pub fn fetched_wal(&self) -> Option<(Lsn, Lsn)> {
        match &self.phase {
            Phase::Leader(l) => Some((l.fetched.begin, l.fetched.end)),
            _ => None,
        }
    }

    /// Handles a message from acceptor `from`.
    pub fn handle(&mut self, from: NodeId, msg: ToProposer) -> Vec<ProposerAction> {
        let mut out = Vec::new();
        if self.is_stopped() {
            return out;
        }
        let majority = self.majority();
        match msg {
            ToProposer::GreetingReply { round, term, last_log_term, boundary_lsn, learner } => {
                if let Phase::Leader(l) = &mut self.phase {
                    // A greeting of an acceptor not known to be a voter (the crate's "Late
                    // voters"): on this connection, one that is no learner is a voter, and
                    // counts towards commits once it joined (taking the election persists
                    // this term before it acknowledges anything). A learner's answer changes
                    // nothing: it may still graduate, and say so to the next greeting.
                    if round != l.greeting_round[from] {
                        return out;
                    }
                    if term > self.term {
                        return self.step_down(term, from);
                    }
                    if !learner && l.voters.insert(from) {
                        out.extend(self.update_commit());
                        out.extend(self.stream(Push::Changes));
                        out.extend(self.check_synced());
                    }
                    return out;
                }
                let Phase::Greeting { round: current, greeted } = &mut self.phase else { return out };
                if round != *current {
                    return out;
                }
                greeted.insert(from, GreetInfo { term, last_log_term, boundary_lsn, learner });
                if greeted.len() < majority {
                    return out;
                }
                if let Some(reason) = self.pre_vote_mismatch() {
                    self.phase = Phase::Stopped;
                    out.push(ProposerAction::Fenced { term: self.term, reason });
                    return out;
                }
                let Phase::Greeting { greeted, .. } = &self.phase else { unreachable!("checked above") };
                let highest = greeted.values().map(|g| g.term).max().unwrap_or(0);
                self.term = self.term.max(highest) + 1;
                let learners = greeted.iter().filter(|(_, g)| g.learner).map(|(&i, _)| i).collect();
                self.phase = Phase::Voting { votes: BTreeMap::new(), refused: BTreeSet::new(), learners };
                let term = self.term;
                let proposer = self.id;
                out.extend((0..self.n).map(|i| ProposerAction::Send(i, ToAcceptor::VoteRequest { term, proposer })));
            }
            ToProposer::Vote { term, granted, acceptor_term, history, boundary_lsn, peer_horizon_lsn, .. } => {
                if term != self.term {
                    return out;
                }
                if acceptor_term > self.term {
                    return self.step_down(acceptor_term, from);
                }
                if let Phase::Leader(l) = &mut self.phase {
                    // A vote that came after the election: this acceptor's acknowledgements
                    // count towards commits too.
                    if granted && l.voters.insert(from) {
                        out.extend(self.update_commit());
                        out.extend(self.stream(Push::Changes));
                        out.extend(self.check_synced());
                    }
                    return out;
                }
                let Phase::Voting { votes, refused, learners } = &mut self.phase else { return out };
                if !granted {
                    // Another proposer took this acceptor's vote in the same term, or it is a
                    // learner.
                    if !votes.contains_key(&from) {
                        refused.insert(from);
                    }
                    if refused.len() > self.n - majority {
                        let learners = learners.iter().copied().collect();
                        self.phase = Phase::Idle;
                        out.push(ProposerAction::ElectionLost { term: self.term, learners });
                    }
                    return out;
                }
                refused.remove(&from);
                votes.insert(from, VoteInfo { history, boundary_lsn, peer_horizon_lsn });
                if votes.len() >= majority {
                    out.extend(self.become_leader());
                }
            }
            ToProposer::ElectedAck { term, flush_lsn, boundary_lsn } => {
                if term != self.term {
                    return out;
                }
                let Phase::Leader(l) = &mut self.phase else { return out };
                if flush_lsn > l.end || boundary_lsn > flush_lsn {
                    // Claims WAL this proposer never had: a broken acceptor; not counted.
                    return out;
                }
                // The acceptor's log is now a prefix of the elected history with whole
                // records up to its boundary LSN: a boundary for the others' catch-up too.
                if boundary_lsn.is_valid() {
                    l.boundaries.insert(boundary_lsn);
                }
                l.acked_flush[from] = l.acked_flush[from].max(flush_lsn);
                l.acked_boundary[from] = l.acked_boundary[from].max(boundary_lsn);
                // A copy of an older acknowledgement of this term (the network may duplicate
                // and reorder; after a reconnect the peer is new) must not take the stream
                // back: within a term an acceptor's log only grows, so it has at least what
                // it acknowledged before. Below that, WAL may be gone: an acceptor removes WAL
                // below the peer horizon, which is at most this, and refuses to fetch it.
                let (flush, boundary) = (l.acked_flush[from], l.acked_boundary[from]);
                l.peers.entry(from).or_insert(Peer {
                    flush,
                    boundary,
                    boundary_sent: boundary,
                    sent: flush,
                    commit_sent: Lsn(0),
                    commit_acked: Lsn(0),
                    flush_at_tick: flush,
                    horizon_sent: Lsn(0),
                    remote_consistent_sent: Lsn(0),
                });
                out.extend(self.update_commit());
                out.extend(self.stream(Push::Changes));
                out.extend(self.check_synced());
            }
            ToProposer::Wal { term, from: wal_from, data } => {
                if term != self.term {
                    return out;
                }
                let Phase::Leader(l) = &mut self.phase else { return out };
                let Some((source, want_from, want_to)) = l.fetched.pending else { return out };
                // Only the answer to the outstanding request, whole: it continues the range.
                if source != from || wal_from != want_from || wal_from.0 + data.len() as u64 != want_to.0 || want_from != l.fetched.end {
                    return out;
                }
                l.fetched.pending = None;
                l.fetched.end = want_to;
                assert!(
                    l.fetched.bytes() <= self.config.max_fetched,
                    "fetched WAL {}..{} longer than max_fetched {}",
                    l.fetched.begin,
                    l.fetched.end,
                    self.config.max_fetched
                );
                out.push(ProposerAction::StoreWal { from: wal_from, data });
                out.extend(self.stream(Push::Changes));
            }
            ToProposer::AppendAck { term, flush_lsn, boundary_lsn, commit_lsn } => {
                if term != self.term {
                    return out;
                }
                let Phase::Leader(l) = &mut self.phase else { return out };
                let Some(p) = l.peers.get_mut(&from) else { return out };
                // An old acknowledgement (reordered), or a flush LSN beyond all WAL this
                // proposer has (a broken acceptor): neither may count towards a commit.
                if flush_lsn < p.flush || flush_lsn > l.end || boundary_lsn > flush_lsn {
                    return out;
                }
                p.flush = flush_lsn;
                p.boundary = p.boundary.max(boundary_lsn);
                p.commit_acked = p.commit_acked.max(commit_lsn);
                if p.sent < flush_lsn {
                    p.sent = flush_lsn;
                }
                if boundary_lsn.is_valid() {
                    l.boundaries.insert(boundary_lsn);
                }
                l.acked_flush[from] = l.acked_flush[from].max(flush_lsn);
                l.acked_boundary[from] = l.acked_boundary[from].max(boundary_lsn);
                // Boundaries below every acceptor's acknowledged boundary LSN are not needed
                // any more: none of them will be told a lower one again in this term.
                let low = l.acked_boundary.iter().copied().min().unwrap_or_default();
                if l.boundaries.first().is_some_and(|b| *b < low) {
                    l.boundaries = l.boundaries.split_off(&low);
                }
                out.extend(self.update_commit());
                out.extend(self.stream(Push::Changes));
                out.extend(self.check_synced());
            }
            ToProposer::Rejected { term, acceptor_term } => {
                if term == self.term && acceptor_term > self.term {
                    return self.step_down(acceptor_term, from);
                }
            }
        }
        out
    }

    /// Recomputes the commit LSN: the highest boundary LSN acknowledged in this term by a
    /// majority of acceptors that granted this term's vote, once it reaches this term's
    /// start.
    fn update_commit(&mut self) -> Vec<ProposerAction> {
        let majority = self.majority();
        let term = self.term;
        let Phase::Leader(l) = &mut self.phase else { return Vec::new() };
        // Boundary LSNs, not flush LSNs: the commit LSN is then one acceptor's boundary LSN,
        // so a record boundary, and no acceptor's commit LSN passes its boundary LSN. Only
        // those of acceptors that voted in this term: a learner's acknowledgement cannot
        // answer for an earlier incarnation's vote (seed 408,152).
        let mut boundaries: Vec<Lsn> = l.peers.iter().filter(|(i, _)| l.voters.contains(i)).map(|(_, p)| p.boundary).collect();
        if boundaries.len() < majority {
            return Vec::new();
        }
        boundaries.sort_unstable_by(|a, b| b.cmp(a));
        let quorum = boundaries[majority - 1];
        if self.config.mode == ProposerMode::Sync {
            // A sync sends only WAL below its start (it has none of its own), so it can only
            // ever commit exactly its start: the donor's boundary LSN.
            assert!(quorum <= l.start_lsn, "sync in term {term}: acceptors flushed {quorum}, beyond its start {}", l.start_lsn);
        }
        if quorum >= l.start_lsn && quorum > l.commit_lsn {
            l.commit_lsn = quorum;
            return vec![ProposerAction::Commit { term, commit_lsn: quorum }];
        }
        Vec::new()
    }

    /// A sync is done once the commit LSN reached its start and a majority acknowledged a
    /// commit LSN at least that high (so each of them serves the WAL up to it).
    fn check_synced(&mut self) -> Vec<ProposerAction> {
        if self.config.mode != ProposerMode::Sync {
            return Vec::new();
        }
        let Phase::Leader(l) = &self.phase else { return Vec::new() };
        let start = l.start_lsn;
        if l.commit_lsn < start || self.acked_commit_count(start) < self.majority() {
            return Vec::new();
        }
        assert_eq!(l.commit_lsn, start, "a sync commits exactly its start LSN");
        self.phase = Phase::Stopped;
        vec![ProposerAction::SyncDone { term: self.term, lsn: Some(start) }]
    }

    /// A compute's pre-vote: with a majority of greetings, the log an election among them
    /// would continue is the most advanced one (highest last log term, then flush LSN, as
    /// [`Proposer::become_leader`] picks its donor). If it has WAL and does not end at this
    /// compute's start, being elected would only fence this compute: the reason, to fence it
    /// before it raises any acceptor's term. `None` for other modes.
    fn pre_vote_mismatch(&self) -> Option<FenceReason> {
        let Phase::Greeting { greeted, .. } = &self.phase else { return None };
        if self.config.mode != ProposerMode::Compute {
            return None;
        }
        let best = greeted.values().max_by_key(|g| (g.last_log_term, g.boundary_lsn))?;
        let has_wal = best.last_log_term != 0 && best.boundary_lsn > Lsn(0);
        (has_wal && best.boundary_lsn != self.wal_start)
            .then_some(FenceReason::WalMismatch { start_lsn: best.boundary_lsn, wal_start: self.wal_start })
    }

    /// Acceptor `by` has seen term `seen` above ours.
    fn step_down(&mut self, seen: Term, by: NodeId) -> Vec<ProposerAction> {
        let term = self.term;
        if self.config.mode == ProposerMode::Compute && self.is_leader() {
            // Another proposer may be writing now; this compute's WAL beyond the commit LSN
            // can never be committed, and it cannot follow the newer WAL.
            self.phase = Phase::Stopped;
            return vec![ProposerAction::Fenced { term, reason: FenceReason::HigherTerm { by, seen } }];
        }
        self.phase = Phase::Idle;
        // The next election starts above the term seen.
        self.term = self.term.max(seen);
        vec![ProposerAction::SteppedDown { term, seen, by }]
    }

    fn become_leader(&mut self) -> Vec<ProposerAction> {
        let majority = self.majority();
        let Phase::Voting { votes, .. } = &self.phase else { unreachable!("become_leader outside an election") };
        let voters: BTreeSet<NodeId> = votes.keys().copied().collect();
        // At most one proposer per term: the votes counted are for this term only (an
        // acceptor grants a term once), and there is a majority of them.
        assert!(votes.len() >= majority, "elected in term {} with {} votes of {}", self.term, votes.len(), self.n);
        // The most advanced log: highest last log term, then highest boundary LSN (WAL past
        // it is a record cut short, which this term drops: the crate's "Record boundaries").
        let (&donor, best) =
            votes.iter().max_by_key(|(_, v)| (v.history.up_to(v.boundary_lsn).last_term(), v.boundary_lsn)).expect("a majority of votes");
        let has_wal = !best.history.0.is_empty() && best.boundary_lsn > Lsn(0);
        let start_lsn = if has_wal { best.boundary_lsn } else { self.wal_start };
        let term = self.term;
        match self.config.mode {
            ProposerMode::Compute if start_lsn != self.wal_start => {
                // The votes are spent (the acceptors are in this term now), but this compute's
                // WAL does not continue their log: it must not write, and nothing is sent.
                self.phase = Phase::Stopped;
                let reason = FenceReason::WalMismatch { start_lsn, wal_start: self.wal_start };
                return vec![ProposerAction::Fenced { term, reason }];
            }
            ProposerMode::Sync if start_lsn == Lsn(0) => {
                self.phase = Phase::Stopped;
                return vec![ProposerAction::SyncDone { term, lsn: None }];
            }
            _ => {}
        }
        let mut out = vec![ProposerAction::Elected { term, start_lsn, donor }];
        if start_lsn == Lsn(0) {
            self.phase = Phase::Idle;
            return out;
        }
        // Every acceptor holds the elected WAL below any acceptor's peer horizon for good, so
        // the history's entries for WAL only below the highest one are never compared again.
        let horizon = votes.values().map(|v| v.peer_horizon_lsn).max().unwrap_or_default().min(start_lsn);
        let mut history = if has_wal { best.history.up_to(start_lsn).trimmed_below(horizon) } else { TermHistory::default() };
        history.0.push(TermSwitch { term: self.term, lsn: start_lsn });
        // Every term switch, and this term's start (the donor's flush LSN), ends a record.
        let boundaries: BTreeSet<Lsn> = history.0.iter().map(|e| e.lsn).collect();
        // Each acceptor computes its truncation point from this history with
        // `TermHistory::common_point` and reports it in its ElectedAck; streaming starts there.
        let log_begin = history.0.first().map_or(start_lsn, |e| e.lsn).max(horizon);
        // An acceptor whose vote did not come (away, lost, refused: a learner, or it voted
        // for another proposer of this term) is greeted too: if it is no learner, it counts
        // once it joined (the crate's "Late voters").
        self.rounds += 1;
        let round = self.rounds;
        for i in 0..self.n {
            let msg = ToAcceptor::Elected { term: self.term, history: history.clone(), start_lsn, log_begin, proposer: self.id };
            out.push(ProposerAction::Send(i, msg));
            if !voters.contains(&i) {
                out.push(ProposerAction::Send(i, ToAcceptor::Greeting { round }));
            }
        }
        self.phase = Phase::Leader(Box::new(Leader {
            history,
            log_begin,
            start_lsn,
            donor,
            local_floor: start_lsn,
            end: start_lsn,
            fetched: Fetched::empty(start_lsn),
            boundaries,
            acked_flush: vec![Lsn(0); self.n],
            acked_boundary: vec![Lsn(0); self.n],
            peers: BTreeMap::new(),
            voters,
            greeting_round: vec![round; self.n],
            commit_lsn: Lsn(0),
        }));
        out
    }
}
