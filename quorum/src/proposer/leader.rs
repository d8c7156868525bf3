//! The leader's state for its term: what it knows of each joined acceptor ([`Peer`]), the
//! WAL it can send and the record boundaries it carries ([`Leader`]), and where a piece of
//! WAL ends ([`piece_end`]). The decisions stay in `proposer.rs`; this is the state they read
//! and change.

use crate::fetched::Fetched;
use crate::{NodeId, TermHistory};
use proto::Lsn;
use std::collections::{BTreeMap, BTreeSet};

/// A joined acceptor, as the leader sees it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Peer {
    /// Acknowledged durable end in this term.
    pub(super) flush: Lsn,
    /// Acknowledged boundary LSN in this term (at most `flush`): what commits count.
    pub(super) boundary: Lsn,
    /// The highest boundary sent to it since it last acknowledged one (or since a tick
    /// found it lagging): a boundary learned later is sent even without new WAL.
    pub(super) boundary_sent: Lsn,
    /// Sent up to here (at least `flush`).
    pub(super) sent: Lsn,
    /// The commit LSN last sent, and last acknowledged.
    pub(super) commit_sent: Lsn,
    pub(super) commit_acked: Lsn,
    /// `flush` at the previous tick, to notice a stalled stream.
    pub(super) flush_at_tick: Lsn,
    /// The peer horizon and remote-consistent LSN last sent.
    pub(super) horizon_sent: Lsn,
    pub(super) remote_consistent_sent: Lsn,
}

#[derive(Clone, Debug)]
pub(super) struct Leader {
    pub(super) history: TermHistory,
    /// Where an acceptor that shares nothing with `history` starts its log
    /// (`ToAcceptor::Elected`).
    pub(super) log_begin: Lsn,
    pub(super) start_lsn: Lsn,
    pub(super) donor: NodeId,
    /// The shell can read its own WAL in `[local_floor, end)` (from `start_lsn` until it
    /// says some is gone: [`super::Proposer::wal_removed_below`]); WAL below, an acceptor gets
    /// through `fetched`.
    pub(super) local_floor: Lsn,
    pub(super) end: Lsn,
    /// WAL fetched from acceptors that the shell keeps for those that need it below
    /// `local_floor`.
    pub(super) fetched: Fetched,
    /// Record boundaries: those the shell gave to `append`, and below `start_lsn` the points
    /// known to end a record in the elected log (its term switches, `start_lsn`, boundary
    /// LSNs that acceptors acknowledged in this term). Each piece of WAL carries the highest
    /// one at or below its end, which becomes the acceptor's boundary LSN (the crate's
    /// "Record boundaries"). The history's switches are boundaries even when forgotten here.
    pub(super) boundaries: BTreeSet<Lsn>,
    /// Per acceptor: the highest flush LSN it acknowledged in this term (0: none yet). Its
    /// WAL does not end below that again in this term: a peer made again (after a
    /// reconnect) streams from there.
    pub(super) acked_flush: Vec<Lsn>,
    /// Per acceptor: the highest boundary LSN it acknowledged in this term (0: none yet).
    /// Its boundary LSN does not go below that again in this term, so boundaries below every
    /// one of them are not needed any more; and their minimum is the peer horizon (its
    /// boundary LSN does not go below it in later terms either: see the crate's "WAL
    /// removal").
    pub(super) acked_boundary: Vec<Lsn>,
    pub(super) peers: BTreeMap<NodeId, Peer>,
    /// The acceptors known to be voters (not learners) on their current connection: they
    /// granted this term's vote (in the election, or its reply came late), or answered a
    /// greeting of `greeting_round` saying they are no learner. Only their acknowledgements
    /// count towards commits (the crate's rule 5 and "Late voters"). A learner's are true,
    /// but an earlier incarnation of it, before its disk was lost, may have voted in a
    /// higher term whose election went without this WAL (see the crate's "Learners").
    pub(super) voters: BTreeSet<NodeId>,
    /// Per acceptor: the round of the greeting it is sent on its current connection while
    /// it is not in `voters` (a fresh one at the election and at every reconnect): a reply
    /// to another round may come from an earlier connection, so from an earlier
    /// incarnation.
    pub(super) greeting_round: Vec<u64>,
    pub(super) commit_lsn: Lsn,
}

impl Leader {
    /// The lowest boundary LSN every acceptor acknowledged in this term (0 while one has not
    /// acknowledged any: its entry in `acked_boundary` is 0), capped by the commit LSN (an
    /// acceptor caps it by its own commit LSN anyway, which is never above ours).
    pub(super) fn peer_horizon(&self) -> Lsn {
        self.acked_boundary.iter().copied().min().unwrap_or_default().min(self.commit_lsn)
    }

    /// The highest record boundary known at or below `lsn` (0 if none): a remembered one, or
    /// a switch of the elected history (its start above all).
    pub(super) fn boundary_at(&self, lsn: Lsn) -> Lsn {
        let remembered = self.boundaries.range(..=lsn).next_back().copied().unwrap_or_default();
        let switch = self.history.0.iter().rev().map(|e| e.lsn).find(|&l| l <= lsn).unwrap_or_default();
        remembered.max(switch)
    }

    /// How far WAL from `from` can be read in one go: its own WAL from `local_floor` on,
    /// fetched WAL in its range (and on into its own WAL if the two meet). `None` if the
    /// shell has no WAL at `from`.
    pub(super) fn readable_end(&self, from: Lsn) -> Option<Lsn> {
        if from >= self.local_floor {
            Some(self.end)
        } else if self.fetched.contains(from) {
            Some(if self.fetched.end >= self.local_floor { self.end } else { self.fetched.end })
        } else {
            None
        }
    }
}

/// Where the piece of WAL sent from `from` ends: `max` bytes on, or at the end of the WAL
/// the shell has, and below the proposer's own start never beyond that start (WAL above it
/// is another term's). Anywhere, inside a record too: what the acceptor takes as the end of
/// its log is the boundary the piece carries.
pub(super) fn piece_end(start_lsn: Lsn, end: Lsn, from: Lsn, max: u64) -> Lsn {
    let cap = if from < start_lsn { start_lsn } else { end };
    Lsn((from.0 + max).min(cap.0))
}
