//! The sans-I/O consensus core of the safekeeper protocol: Paxos-style elections with terms
//! and term histories, in the spirit of Neon's safekeepers.
//!
//! Two state machines, both free of I/O and clocks:
//! - [`Acceptor`] (a safekeeper): messages in, [`AcceptorAction`]s out. Every change that must
//!   survive a crash comes out as an [`AcceptorAction::Persist`] *before* the reply that depends
//!   on it; the I/O shell must make it durable (fsync) before it sends the reply.
//! - [`Proposer`] (the WAL writer): messages, timer ticks and client records in,
//!   [`ProposerAction`]s out (send to acceptor N, declare itself elected, report a commit LSN).
//!   Its [`ProposerMode`] carries the policy of its real users: a compute fences itself
//!   ([`ProposerAction::Fenced`]) when elected elsewhere than where its WAL starts or when a
//!   higher term appears after its election; compute_ctl's sync reports the end of the WAL
//!   once a majority committed it ([`ProposerAction::SyncDone`]). WAL goes out only in
//!   pieces that end at record boundaries ([`Proposer::append`]).
//!
//! # Protocol
//! Where a log "ends" below means its boundary LSN, the end of its last whole record (see
//! "Record boundaries"): WAL past it is a record cut short, which the protocol ignores.
//! 1. The proposer greets every acceptor and learns their terms and where their logs end; with
//!    a majority of answers it picks a term above all of them and asks for votes. A compute
//!    first checks that the most advanced of those logs ends where its own WAL starts, and
//!    fences itself without asking for votes if not (a pre-vote: a stale compute must not
//!    raise the acceptors' term and so fence the healthy one).
//! 2. An acceptor grants a vote only for a term above the highest it has seen; it persists the
//!    new term before it answers. The answer carries its term history and boundary LSN.
//! 3. With a majority of votes, the proposer picks the most advanced log among them (highest
//!    last log term, then highest boundary LSN), takes that acceptor's term history up to its
//!    boundary LSN and appends `(own term, donor boundary LSN)`: the elected history. Its own
//!    term starts at the donor's boundary LSN (`start_lsn`). It fetches the donor's WAL as a
//!    lagging acceptor needs it, and its own WAL too once its shell lost it
//!    ([`Proposer::wal_removed_below`]).
//! 4. It sends the elected history to every acceptor. Each truncates its WAL at the highest
//!    point it has in common with that history (the end of the last term both share, capped by
//!    both logs) and adopts the history. It never truncates below its commit LSN.
//! 5. The proposer streams the WAL each acceptor is missing, then new client records. The
//!    commit LSN is the highest boundary LSN acknowledged in the proposer's term by a
//!    majority of acceptors *known to be voters*, on their current connection: they granted
//!    this term's vote, or, not having done so in time, answered the leader's greeting as no
//!    learner (so never counting a learner; see "Learners" and "Late voters"), and only once
//!    that reaches `start_lsn` (entries of earlier terms are committed only together with the
//!    proposer's own start point, as Raft commits only entries of its own term).
//!
//! # Invariants
//! - At most one proposer is elected per term: an acceptor votes at most once per term
//!   (only for a term above every term it has seen), and a vote is persisted before it is sent.
//! - An acceptor accepts WAL in term T only after it adopted T's elected history, and only from
//!   T's proposer; its WAL is then a prefix of T's history.
//! - An acceptor never truncates below its commit LSN; a request to do so is refused.
//! - The commit LSN of an acceptor and of a proposer only moves forward.
//! - WAL is acknowledged only once persisted: the reply follows its `Persist` actions.
//! - The peer horizon sent never exceeds the boundary LSN any acceptor acknowledged in the
//!   proposer's term, and an acceptor's peer horizon never goes back nor passes its commit
//!   LSN (see "WAL removal").
//!
//! These are asserted where they are kept (`acceptor.rs`, `proposer.rs`): breaking one is a
//! bug and panics; a message that would make an acceptor break one is refused instead.
//!
//! The WAL is bytes at LSNs. The acceptor's state has only its flush LSN: its I/O shell keeps
//! the bytes (segment files in the service, a `Vec<u8>` in the simulation), appends and
//! truncates them when told by a [`Persist`] action, and reads them when asked to send WAL.
//! The proposer never holds WAL either: its shell keeps the WAL it can send (the compute's
//! `pg_wal`, plus what it fetched from other acceptors) and the core tells it what to send to
//! whom ([`ProposerAction::SendWal`]) and what fetched WAL to keep and to free
//! ([`ProposerAction::StoreWal`], [`ProposerAction::ReleaseWal`]: at most
//! [`ProposerConfig::max_fetched`] bytes at once).
//!
//! # The beginning of the log
//! A timeline's WAL begins where its first proposer's own WAL began (the LSN its compute
//! started at, [`Proposer::new`]); that is the LSN of the first term switch of every history.
//! An acceptor whose log shares no term with an elected history empties its log and starts it
//! there.
//!
//! # Learners
//! An acceptor that lost its state (a safekeeper whose disk was replaced, or whose timeline
//! directory is gone) must not vote as if it were new: a blank acceptor grants any vote, and
//! with one healthy copy lagging, an election among it and the lagging one would pick the
//! lagging log and drop acknowledged commits. So only a timeline created on purpose (the
//! control plane creates it on every acceptor when it creates the timeline) starts as a
//! voter; an acceptor that finds it has no record of a timeline a proposer writes to starts
//! it as a *learner* ([`AcceptorState::learner`]):
//! - it refuses every vote (a blank acceptor cannot tell on its own whether the timeline is
//!   new, and deciding it from what the others say is racy: they may get WAL, and another
//!   may lose its disk, between the question and the vote);
//! - it joins only an election whose vote request it saw (and refused) since it was
//!   created, from that proposer (`ToAcceptor::VoteRequest::proposer`: another proposer
//!   may ask for the same term and lose). A proposer asks for votes only before it is
//!   elected, and a restarted process has new connections (nothing an earlier incarnation
//!   was sent reaches it), so no earlier incarnation of the learner can have acknowledged
//!   WAL in that election, which the leader would count on; any other election it leaves
//!   alone, and waits for the next one. A proposer that reconnects to an acceptor while it
//!   collects votes forgets that acceptor's vote and asks again ([`Proposer::reconnected`]):
//!   an earlier incarnation's vote, lost with its disk, must not count, or the new one could
//!   graduate in a lower term and vote for the same term again, for another proposer;
//! - it becomes a voter for good once, in a term it joined, it holds that term's log up to
//!   the term's start (which contains everything committed before: the election's voters
//!   remember) and the leader's peer horizon has reached that start: every acceptor of the
//!   configuration then joined this term, so none holds a higher term, and no earlier
//!   incarnation of the learner can have voted in a term it could now be asked to vote in
//!   again (a leader of a lower term, elected on an old vote, does not get there: the
//!   acceptor at the higher term refuses it). So a learner needs every acceptor up once
//!   to become a voter.
//! - its acknowledgements do not count towards commits, although they are true: the learner
//!   cannot answer for an earlier incarnation of itself, whose vote, lost with its disk, may
//!   have helped elect a *higher* term whose history lacks this term's WAL. The other voter
//!   of that election need not be in the commit quorum, and every later election among the
//!   voters may continue the higher term's log (found by the simulation, seed 408,152: term 3
//!   elected by acceptors 0 and 2 with no WAL; 0 loses its disk; term 2, whose vote 2 had
//!   granted first, is elected by 1 and 2, its vote request seen by the learner 0; term 2's
//!   WAL is acknowledged by 0 and 1 and was counted as committed; every later election by 1
//!   and 2 picks 2's term-3 log, and 1 refused to truncate below its commit LSN, or, had it
//!   not yet learnt that commit LSN, would have dropped acknowledged commits). So a leader
//!   counts only the acceptors it knows are no learners: their granted vote for its term
//!   (during the election or after it), or their answer to its greeting ("Late voters").
//!   Each of them durably promised the term before it acknowledged, in the same
//!   incarnation: a proposer that reconnects while collecting votes forgets the acceptor's
//!   vote (and a leader, that it knew it for a voter), a learner joins only an election
//!   whose vote request it saw (in its own incarnation), and no vote request goes out once
//!   elected. So any later election's majority of votes meets the commit quorum in an
//!   acceptor whose vote reports the committed WAL, or that lost its disk since and votes
//!   again only after it graduated, holding it.
//! - a learner whose whole log lies below an election's `log_begin` (it began it in an older
//!   election, while its earlier incarnation's acknowledgements had already raised the
//!   others' peer horizon) starts it again there, as a log that shares nothing: the WAL in
//!   between may be removed everywhere.
//!
//! Every election then has a majority of voters that remember what they acknowledged, and
//! every commit quorum is made of such voters, so the two meet.
//!
//! # Late voters
//! An acceptor whose vote the leader did not get in time (it was unreachable during the
//! whole election, its vote request or its reply was lost, it had granted the term to
//! another proposer of the same term number, or it is a learner) still joins the term when
//! the election reaches it (`Elected`, resent at every reconnect and tick). It counts
//! towards commits once the leader knows, on the acceptor's current connection, that it is
//! no learner: its granted vote (a reply that arrives after the election too), or its
//! answer to a [`ToAcceptor::Greeting`], which the leader sends every acceptor whose vote
//! it lacks at the election, after every reconnect, and at every tick until it knows. The
//! greeting's round is the same for one connection and fresh at each reconnect, so an
//! answer from an earlier connection (perhaps an earlier incarnation) is ignored; a
//! reconnect makes the leader forget what it knew; an answer with a higher term makes it
//! step down, as a rejection does. Counted only from the next election, such an acceptor
//! would leave a compute that started while one safekeeper was down unable to commit once
//! another fails (`docs/decisions/0004-late-voters-by-greeting.md`).
//!
//! Why its acknowledgements are as good as those of an acceptor that voted on time: what
//! the commit argument needs of each acceptor of a commit quorum in term T is that it
//! durably promised T, in the same incarnation, before it acknowledged. Then every vote it
//! grants for a higher term comes after the acknowledgement, and reports the WAL (granted
//! before, its term would be above T and it would have refused T's WAL). A vote is one such
//! promise; taking the election is the other: the acceptor persists T as its term
//! ([`Persist::Control`]) before its `ElectedAck`, and refuses every vote for a term at or
//! below T from then on. Neither promise speaks for an *earlier* incarnation, and that is
//! all the learner's flag is for: an acceptor that is no learner either never lost its disk,
//! or graduated in a term T_g that every acceptor had joined, so that no earlier incarnation
//! of it voted above T_g ("Learners"), and T_g ≤ T (its term only grows). Learner to voter
//! is the only change of the flag within an incarnation, and a new incarnation comes with a
//! new connection ([`Proposer::reconnected`]), so an answer "no learner" on the current
//! connection speaks for every acknowledgement the leader counts from it, those it sent as
//! a learner before graduating in T included (by the same argument with T_g = T).
//!
//! Why a greeting and not a late vote request: a learner that sees a vote request may join
//! that term (it is how a learner joins an election at all), and "Learners" rests on vote
//! requests going out only before the election is complete. A late one could let a learner
//! join a term in which its earlier incarnation had acknowledged WAL, or voted in a higher
//! term since; it could then graduate below that higher term (every acceptor joined its
//! term before moving on) and vote in it again, for another proposer: two leaders in one
//! term. Asked only of acceptors that greeted as no learners, the vote adds nothing to the
//! promise the election makes, and one already at T (it took the election, or its reply
//! was lost) refuses it. So a leader never asks for a vote (the simulation fails a seed in
//! which one does). No wire or persistent state change: acceptors always answered greetings
//! at any time.
//!
//! # WAL removal
//! An acceptor may delete WAL that nobody can need again. Three things bound it, and its
//! shell removes only below the lowest of them (the safekeeper's storage, in whole
//! segments):
//! - the pageserver's *remote-consistent LSN*: WAL below it is represented by layers in
//!   object storage, and a pageserver restarted from there resumes at it. The pageserver
//!   tells the safekeeper it streams from; that acceptor reports it in its feedback to the
//!   proposer, and the proposer relays the highest it heard in every `Append`
//!   ([`Proposer::set_remote_consistent_lsn`]), so every acceptor learns it.
//! - the *peer horizon*, which the proposer computes: the lowest boundary LSN that every
//!   acceptor of the configuration (not just a quorum) acknowledged in its term, or 0 until
//!   it has heard from all of them, capped by its commit LSN. The acceptor keeps the highest it has seen
//!   ([`AcceptorState::peer_horizon_lsn`]), never above its own commit and flush LSNs.
//! - the acceptor's commit LSN.
//!
//! Why the peer horizon is safe: once every acceptor has acknowledged a flush LSN `h` in
//! term T, all of them hold T's history up to `h`. Any later election picks a donor whose
//! log contains that prefix (every voter has it), so every later elected history contains
//! it, and a truncation is never below it (the point an acceptor shares with the elected
//! history is at or above `h`). So no acceptor's flush LSN is ever below `h` again: a
//! lagging acceptor is always sent WAL from at or above `h` (a proposer streams from the
//! acceptor's flush LSN, and fetches from a donor from there), a sync never reads below it,
//! and a truncation never needs it. An acceptor that has not answered since the election
//! holds the horizon where it was: its last flush LSN acknowledged in this term still
//! counts (it never goes below that), and one never heard from in this term makes the
//! horizon unknown (0), which changes nothing on the acceptors. An acceptor ignores a
//! `FetchWal` from below its peer horizon (only a stale copy of an old request can ask
//! that), so its shell is never asked for WAL it may have removed. The simulation checks after
//! every step that no acceptor's peer horizon exceeds any acceptor's flush LSN, and its
//! acceptors refuse to read WAL below what they removed.
//!
//! # Record boundaries
//! A compute must start at the end of a whole WAL record (its basebackup LSN), and
//! PostgreSQL records can be up to about 1 GB, far more than one message
//! ([`wire::WAL_BYTES_MAX`]) or a piece of WAL ([`ProposerConfig::max_append`]). So WAL is
//! sent in pieces cut anywhere, and an acceptor's log may end inside a record; what the
//! protocol sees of a log is its **boundary LSN** ([`AcceptorState::boundary_lsn`]), the
//! end of the last whole record it holds (at most its flush LSN):
//! - every `Append` carries a boundary of the term's log at or below the end of its bytes
//!   (the highest the proposer knows: the shell declares them with [`Proposer::append`],
//!   and below its start it knows the elected history's term switches, the start itself and
//!   the boundaries acceptors acknowledged in this term). An acceptor whose WAL reaches it
//!   makes it its boundary LSN, durably with the bytes (`Persist::Append`), before it
//!   acknowledges both; so do the commit LSN and its term's switches when its WAL reaches
//!   them (they are boundaries too).
//! - greetings and votes report the boundary LSN, not the flush LSN: the donor is the
//!   voter with the highest (last log term, boundary LSN), the proposer's own term starts
//!   at the donor's boundary LSN (so a sync ends at one, whatever the record sizes), and an
//!   acceptor truncates at the point it shares with the elected history computed from its
//!   boundary LSN: taking an election drops the partial record past it (`Persist::Truncate`).
//! - commits count acknowledged boundary LSNs, not flush LSNs: the commit LSN is a boundary
//!   held by a majority, and an acceptor's commit LSN never passes its boundary LSN (a
//!   commit LSN beyond its WAL is capped at its boundary, which is committed WAL too). So
//!   no truncation ever goes below an acceptor's commit LSN, and the WAL past the boundary,
//!   which a truncation may drop, was never committed nor acknowledged to any client.
//! - the peer horizon is the lowest boundary LSN every acceptor acknowledged (capped by the
//!   commit LSN), so no later truncation goes below it either.
//! - the window counts flush LSNs: a record of any size streams in pieces while the
//!   acknowledged flush LSNs advance, and commits wait for its end.
//!
//! Everything said above about where a log ends in elections, commits and truncations is
//! about its boundary LSN; the flush LSN only says where the next bytes go. The proof is
//! the one without partial records, with the log cut at its boundary LSN: WAL past it
//! is, for the protocol, not there.
//!
//! # Commit LSN durability
//! An acceptor's commit LSN is a hint for the outside (how far WAL may be served to the
//! pageserver). It travels inside [`Persist::Control`] when a term change is persisted anyway,
//! and otherwise as [`AcceptorAction::CommitLsn`], which the shell may persist lazily: losing
//! it in a crash only makes the acceptor serve less until the proposer tells it again. The
//! peer horizon ([`AcceptorAction::PeerHorizon`]) and the remote-consistent LSN
//! ([`AcceptorAction::RemoteConsistentLsn`]) may be persisted as lazily: losing one only
//! delays WAL removal. A shell removes WAL only below values it has made durable, so that
//! after a crash its WAL never begins above what its files say may be removed.

mod acceptor;
mod fetched;
mod proposer;
pub mod wire;

pub use acceptor::{Acceptor, AcceptorAction, AcceptorState, Persist};
pub use proposer::{FenceReason, Proposer, ProposerAction, ProposerConfig, ProposerMode};

use bytes::Bytes;
use proto::Lsn;

/// How many of `acceptors` acceptors make a quorum: a strict majority, so that any two
/// quorums share an acceptor. The one definition every proposer, shell and status report
/// uses.
pub fn majority(acceptors: usize) -> usize {
    acceptors / 2 + 1
}

/// An election term. 0 means "none".
pub type Term = u64;
/// Index of an acceptor in the proposer's configuration.
pub type NodeId = usize;

/// One switch of terms: WAL from `lsn` on was written in `term`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TermSwitch {
    pub term: Term,
    pub lsn: Lsn,
}

/// A term history: term switches in increasing term order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TermHistory(pub Vec<TermSwitch>);

impl TermHistory {
    /// The entries that describe WAL up to `flush_lsn` (switches at or before it).
    pub fn up_to(&self, flush_lsn: Lsn) -> TermHistory {
        TermHistory(self.0.iter().copied().filter(|e| e.lsn <= flush_lsn).collect())
    }

    /// The term of the last entry, 0 if empty.
    pub fn last_term(&self) -> Term {
        self.0.last().map_or(0, |e| e.term)
    }

    /// The history without the entries that only describe WAL below `lsn`: the entry in
    /// effect just below `lsn` (the last switch before it) and those after it stay (a switch
    /// at `lsn` itself describes WAL from `lsn` on, which two logs that agree below `lsn`
    /// need not share). Every
    /// acceptor's log holds the elected WAL up to the peer horizon for good (the crate's "WAL
    /// removal"), so with `lsn` at most a peer horizon no comparison of logs ever needs what
    /// is dropped; it keeps the history from growing with every election (a proposer trims
    /// the history it is elected with, [`Proposer`]).
    pub fn trimmed_below(&self, lsn: Lsn) -> TermHistory {
        let keep_from = self.0.iter().rposition(|e| e.lsn < lsn).unwrap_or(0);
        TermHistory(self.0[keep_from..].to_vec())
    }

    /// The highest LSN up to which a log with this history and `flush_lsn` agrees with a log
    /// of history `other` ending at `other_end`: the end of the last term both share, capped by
    /// both logs. `Lsn(0)` if they share no term. Both histories must already be cut at their
    /// flush LSNs ([`TermHistory::up_to`]). Either may be trimmed ([`TermHistory::trimmed_below`])
    /// at a different point: they are compared from the first entry of the one trimmed later
    /// (a term has one switch LSN in every history that has it).
    pub fn common_point(&self, flush_lsn: Lsn, other: &TermHistory, other_end: Lsn) -> Lsn {
        let (a, b) = (&self.0, &other.0);
        let (Some(fa), Some(fb)) = (a.first(), b.first()) else { return Lsn(0) };
        let aligned = if fa.term >= fb.term {
            b.iter().position(|e| e == fa).map(|j| (0, j))
        } else {
            a.iter().position(|e| e == fb).map(|i| (i, 0))
        };
        let Some((ia, ib)) = aligned else { return Lsn(0) };
        let shared = a[ia..].iter().zip(&b[ib..]).take_while(|(x, y)| x == y).count();
        let end_of = |h: &[TermSwitch], at: usize, end: Lsn| h.get(at).map_or(end, |e| e.lsn);
        end_of(a, ia + shared, flush_lsn).min(end_of(b, ib + shared, other_end))
    }
}

/// Messages from a proposer to an acceptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToAcceptor {
    /// `round` is echoed in the reply: a reply to an earlier greeting (still on its way when
    /// an election restarted) says nothing about the acceptor now.
    Greeting { round: u64 },
    VoteRequest {
        term: Term,
        /// Who asks: the proposer's id ([`Proposer::identified`]); with the term, what a
        /// learner may later join (see "Learners").
        proposer: u64,
    },
    /// The proposer of `term` was elected with `history`; its own term starts at `start_lsn`.
    /// An acceptor whose log shares nothing with `history` starts its log at `log_begin`
    /// (the first switch of `history`, or the highest peer horizon among the votes if that
    /// is higher: every acceptor has the WAL below it, and may have removed it).
    Elected {
        term: Term,
        history: TermHistory,
        start_lsn: Lsn,
        log_begin: Lsn,
        /// The elected proposer's id, as in its `VoteRequest`.
        proposer: u64,
    },
    /// Ask an acceptor that took `term`'s election for its WAL in `[from, to)` (below its flush
    /// LSN that WAL is the elected history's).
    FetchWal { term: Term, from: Lsn, to: Lsn },
    /// WAL bytes starting at `begin_lsn` (possibly none: then it only carries the LSNs).
    /// A piece may end inside a record.
    Append {
        term: Term,
        begin_lsn: Lsn,
        data: Bytes,
        /// A record boundary of this term's log at or below the end of `data` (the highest
        /// the proposer knows there; 0 for none): an acceptor whose WAL reaches it knows its
        /// log holds whole records up to it (see "Record boundaries").
        boundary_lsn: Lsn,
        commit_lsn: Lsn,
        /// The peer horizon: the lowest boundary LSN every acceptor of the configuration has
        /// acknowledged in this term (0: not yet heard from all), capped by `commit_lsn`.
        /// See "WAL removal".
        peer_horizon_lsn: Lsn,
        /// The highest remote-consistent LSN of the pageserver any acceptor reported (0:
        /// none yet), relayed so that every acceptor learns it. See "WAL removal".
        remote_consistent_lsn: Lsn,
    },
}

/// Messages from an acceptor to a proposer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToProposer {
    GreetingReply {
        round: u64,
        term: Term,
        /// The acceptor's log as an election sees it: the term of its last entry and its
        /// boundary LSN (the end of its last whole record, see "Record boundaries"). A
        /// compute checks with these, before it asks for any vote, that its WAL continues
        /// the log it would be elected with (see [`ProposerMode::Compute`]).
        last_log_term: Term,
        boundary_lsn: Lsn,
        /// A learner does not vote yet (see "Learners").
        learner: bool,
    },
    Vote {
        /// The term asked for.
        term: Term,
        granted: bool,
        /// The acceptor's term after handling the request.
        acceptor_term: Term,
        history: TermHistory,
        /// Where its log ends as an election sees it: its boundary LSN, not its flush LSN
        /// (WAL beyond the last whole record is dropped when a new term starts writing).
        boundary_lsn: Lsn,
        commit_lsn: Lsn,
        /// The acceptor's peer horizon, or where its log begins if higher (at most its
        /// boundary LSN): the elected history is trimmed below the highest of the voters'
        /// ([`TermHistory::trimmed_below`]), and a log that shares nothing with it begins
        /// there.
        peer_horizon_lsn: Lsn,
    },
    /// `flush_lsn` is where the acceptor's WAL ends (streaming continues there),
    /// `boundary_lsn` the end of its last whole record (at most `flush_lsn`; equal right
    /// after it took the election, which truncates at a boundary).
    ElectedAck { term: Term, flush_lsn: Lsn, boundary_lsn: Lsn },
    /// The answer to `FetchWal`: WAL bytes from `from` (fewer than asked if the acceptor has
    /// fewer).
    Wal { term: Term, from: Lsn, data: Bytes },
    /// Durable up to `flush_lsn` (what the window counts), with whole records up to
    /// `boundary_lsn` (what commits count).
    AppendAck { term: Term, flush_lsn: Lsn, boundary_lsn: Lsn, commit_lsn: Lsn },
    /// The acceptor has seen a higher term than the message's.
    Rejected { term: Term, acceptor_term: Term },
}

#[cfg(test)]
mod history_tests {
    use super::*;
    use proptest::prelude::*;

    fn h(entries: &[(Term, u64)]) -> TermHistory {
        TermHistory(entries.iter().map(|&(term, lsn)| TermSwitch { term, lsn: Lsn(lsn) }).collect())
    }

    #[test]
    fn trimming_keeps_the_entry_in_effect() {
        let full = h(&[(1, 100), (3, 200), (4, 300), (7, 400)]);
        assert_eq!(full.trimmed_below(Lsn(0)), full);
        assert_eq!(full.trimmed_below(Lsn(100)), full);
        assert_eq!(full.trimmed_below(Lsn(250)), h(&[(3, 200), (4, 300), (7, 400)]));
        assert_eq!(full.trimmed_below(Lsn(300)), h(&[(3, 200), (4, 300), (7, 400)]));
        assert_eq!(full.trimmed_below(Lsn(301)), h(&[(4, 300), (7, 400)]));
        assert_eq!(full.trimmed_below(Lsn(9999)), h(&[(7, 400)]));
        assert_eq!(TermHistory::default().trimmed_below(Lsn(5)), TermHistory::default());
    }

    #[test]
    fn histories_trimmed_at_different_points_still_meet() {
        let ours = h(&[(1, 100), (3, 200), (4, 300)]);
        let elected = h(&[(1, 100), (3, 200), (5, 250), (6, 500)]);
        let want = ours.common_point(Lsn(350), &elected, Lsn(500));
        assert_eq!(want, Lsn(250));
        assert_eq!(ours.common_point(Lsn(350), &elected.trimmed_below(Lsn(220)), Lsn(500)), want);
        assert_eq!(ours.trimmed_below(Lsn(220)).common_point(Lsn(350), &elected, Lsn(500)), want);
        // Nothing in common that either still shows.
        assert_eq!(h(&[(2, 100)]).common_point(Lsn(150), &h(&[(1, 100)]), Lsn(150)), Lsn(0));
        assert_eq!(h(&[(4, 300)]).common_point(Lsn(350), &h(&[(1, 100), (3, 200)]), Lsn(350)), Lsn(0));
    }

    /// Two logs sharing `shared` switches, then diverging (odd terms on one side, even on the
    /// other), each trimmed at a point no higher than where they agree: the common point is
    /// the one of the untrimmed histories.
    fn two_logs() -> impl Strategy<Value = (TermHistory, Lsn, TermHistory, Lsn)> {
        (1usize..5, 0usize..4, 0usize..4, proptest::collection::vec(1u64..50, 12), 0u64..60, 0u64..60).prop_map(
            |(shared, na, nb, gaps, ea, eb)| {
                let mut lsn = 0;
                let mut next = |i: usize| {
                    lsn += gaps[i % gaps.len()];
                    lsn
                };
                let prefix: Vec<(Term, u64)> = (0..shared).map(|i| (i as Term + 1, next(i))).collect();
                let base_term = shared as Term + 1;
                let base_lsn = prefix.last().map_or(0, |e| e.1);
                let mut a = prefix.clone();
                let mut b = prefix;
                let (mut la, mut lb) = (base_lsn, base_lsn);
                for i in 0..na {
                    la += gaps[(i + 3) % gaps.len()];
                    a.push((base_term + 2 * i as Term + 1, la));
                }
                for i in 0..nb {
                    lb += gaps[(i + 7) % gaps.len()];
                    b.push((base_term + 2 * i as Term + 2, lb));
                }
                (h(&a), Lsn(la + ea), h(&b), Lsn(lb + eb))
            },
        )
    }

    proptest! {
        #[test]
        fn trimming_below_the_agreement_changes_no_common_point((a, fa, b, fb) in two_logs(), ta in 0u64..400, tb in 0u64..400) {
            let want = a.common_point(fa, &b, fb);
            prop_assert!(want > Lsn(0));
            let (ta, tb) = (Lsn(ta).min(want), Lsn(tb).min(want));
            prop_assert_eq!(a.trimmed_below(ta).common_point(fa, &b.trimmed_below(tb), fb), want);
            prop_assert_eq!(b.trimmed_below(tb).common_point(fb, &a.trimmed_below(ta), fa), want);
        }
    }
}
