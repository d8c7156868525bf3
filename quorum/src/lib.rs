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
//! 1. The proposer greets every acceptor and learns their terms; with a majority of answers it
//!    picks a term above all of them and asks for votes.
//! 2. An acceptor grants a vote only for a term above the highest it has seen; it persists the
//!    new term before it answers. The answer carries its term history and flush LSN.
//! 3. With a majority of votes, the proposer picks the most advanced log among them (highest
//!    last log term, then highest flush LSN), takes that acceptor's term history up to its
//!    flush LSN and appends `(own term, donor flush LSN)`: the elected history. Its own term
//!    starts at the donor's flush LSN (`start_lsn`). It fetches the donor's WAL.
//! 4. It sends the elected history to every acceptor. Each truncates its WAL at the highest
//!    point it has in common with that history (the end of the last term both share, capped by
//!    both logs) and adopts the history. It never truncates below its commit LSN.
//! 5. The proposer streams the WAL each acceptor is missing, then new client records. The
//!    commit LSN is the highest LSN flushed by a majority in the proposer's term, and only once
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
//!
//! These are asserted where they are kept (`acceptor.rs`, `proposer.rs`): breaking one is a
//! bug and panics; a message that would make an acceptor break one is refused instead.
//!
//! The WAL is bytes at LSNs. The acceptor's state has only its flush LSN: its I/O shell keeps
//! the bytes (segment files in the service, a `Vec<u8>` in the simulation), appends and
//! truncates them when told by a [`Persist`] action, and reads them when asked to send WAL.
//! The proposer never holds WAL either: its shell keeps the WAL it can send (the compute's
//! `pg_wal`, plus what it fetched from a donor) and the core tells it what to send to whom
//! ([`ProposerAction::SendWal`]) and what fetched WAL to keep ([`ProposerAction::StoreWal`]).
//!
//! # The beginning of the log
//! A timeline's WAL begins where its first proposer's own WAL began (the LSN its compute
//! started at, [`Proposer::new`]); that is the LSN of the first term switch of every history.
//! An acceptor whose log shares no term with an elected history empties its log and starts it
//! there.
//!
//! # Commit LSN durability
//! An acceptor's commit LSN is a hint for the outside (how far WAL may be served to the
//! pageserver). It travels inside [`Persist::Control`] when a term change is persisted anyway,
//! and otherwise as [`AcceptorAction::CommitLsn`], which the shell may persist lazily: losing
//! it in a crash only makes the acceptor serve less until the proposer tells it again.

mod acceptor;
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

    /// The highest LSN up to which a log with this history and `flush_lsn` agrees with a log
    /// of history `other` ending at `other_end`: the end of the last term both share, capped by
    /// both logs. `Lsn(0)` if they share no term. Both histories must already be cut at their
    /// flush LSNs ([`TermHistory::up_to`]).
    pub fn common_point(&self, flush_lsn: Lsn, other: &TermHistory, other_end: Lsn) -> Lsn {
        let shared = self.0.iter().zip(other.0.iter()).take_while(|(a, b)| a == b).count();
        if shared == 0 {
            return Lsn(0);
        }
        let end_of = |h: &TermHistory, end: Lsn| h.0.get(shared).map_or(end, |e| e.lsn);
        end_of(self, flush_lsn).min(end_of(other, other_end))
    }
}

/// Messages from a proposer to an acceptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToAcceptor {
    Greeting,
    VoteRequest {
        term: Term,
    },
    /// The proposer of `term` was elected with `history`; its own term starts at `start_lsn`.
    Elected {
        term: Term,
        history: TermHistory,
        start_lsn: Lsn,
    },
    /// Ask an acceptor that took `term`'s election for its WAL in `[from, to)` (below its flush
    /// LSN that WAL is the elected history's).
    FetchWal {
        term: Term,
        from: Lsn,
        to: Lsn,
    },
    /// WAL bytes starting at `begin_lsn` (possibly none: then it only carries `commit_lsn`).
    Append {
        term: Term,
        begin_lsn: Lsn,
        data: Bytes,
        commit_lsn: Lsn,
    },
}

/// Messages from an acceptor to a proposer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToProposer {
    GreetingReply {
        term: Term,
    },
    Vote {
        /// The term asked for.
        term: Term,
        granted: bool,
        /// The acceptor's term after handling the request.
        acceptor_term: Term,
        history: TermHistory,
        flush_lsn: Lsn,
        commit_lsn: Lsn,
    },
    ElectedAck {
        term: Term,
        flush_lsn: Lsn,
    },
    /// The answer to `FetchWal`: WAL bytes from `from` (fewer than asked if the acceptor has
    /// fewer).
    Wal {
        term: Term,
        from: Lsn,
        data: Bytes,
    },
    AppendAck {
        term: Term,
        flush_lsn: Lsn,
        commit_lsn: Lsn,
    },
    /// The acceptor has seen a higher term than the message's.
    Rejected {
        term: Term,
        acceptor_term: Term,
    },
}
