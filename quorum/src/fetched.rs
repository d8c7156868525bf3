//! The WAL a leader fetches from acceptors for those that lag behind what its shell can read
//! itself: below its start LSN (the donor's log, which a compute never had)
//! and, in a term that runs long, below the *local floor* (the oldest WAL the compute's
//! `pg_wal` still holds: PostgreSQL removes segments at checkpoints, whatever a lagging
//! safekeeper still needs).
//!
//! The shell keeps what the leader fetched in memory, so it is one contiguous range, fetched
//! forwards just ahead of the lowest acceptor that needs it and released behind it, and never
//! longer than [`crate::ProposerConfig::max_fetched`]: a safekeeper that lags by gigabytes
//! costs the compute that much bandwidth, not that much memory.
//!
//! Invariants: `begin <= end`; `end - begin <= max_fetched` (asserted where a fetch is
//! taken); a request is outstanding for `[end, to)` only, so what arrives always continues
//! the range; the range is released only below the lowest flush LSN acknowledged (in this
//! term) by an acceptor that still needs fetched WAL, since its stream restarts there after
//! a loss, never below.

use super::NodeId;
use proto::Lsn;

/// The fetched WAL the shell holds for the leader, and the request on its way.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fetched {
    /// The shell keeps fetched WAL in `[begin, end)` (nothing when they are equal).
    pub begin: Lsn,
    pub end: Lsn,
    /// The outstanding `FetchWal`: (from whom, from, to), `from` being `end`.
    pub pending: Option<(NodeId, Lsn, Lsn)>,
    /// The acceptor whose last request went unanswered until a tick: others are asked
    /// first (a safekeeper leaves a request unanswered when a record in it fails its check).
    pub unanswered: Option<NodeId>,
}

impl Fetched {
    pub fn empty(at: Lsn) -> Fetched {
        Fetched { begin: at, end: at, pending: None, unanswered: None }
    }

    pub fn contains(&self, lsn: Lsn) -> bool {
        self.begin <= lsn && lsn < self.end
    }

    /// A tick: the outstanding request, if any, is given up (it is asked again, of another
    /// acceptor if one can serve it).
    pub fn tick(&mut self) {
        if let Some((s, _, _)) = self.pending.take() {
            self.unanswered = Some(s);
        }
    }

    pub fn bytes(&self) -> u64 {
        self.end.0 - self.begin.0
    }

    /// No acceptor needs fetched WAL below `keep_from` any more (`None`: none needs any):
    /// forgets it. Returns the new beginning if it moved, for the shell to free what lies
    /// below.
    pub fn release(&mut self, keep_from: Option<Lsn>) -> Option<Lsn> {
        let keep = keep_from.map_or(self.end, |k| k.clamp(self.begin, self.end));
        (keep > self.begin).then(|| {
            self.begin = keep;
            keep
        })
    }

    /// Where the next fetch goes, for acceptors whose lowest position the shell cannot read is
    /// `need` (at or past `end`, or below `begin`): `[end, to)`, at most `max_fetch` bytes,
    /// never past `limit` (where the shell's own WAL begins) nor making the range longer
    /// than `max_bytes`. A range that is empty, or that begins above `need` (an acceptor
    /// rejoined lower), starts again at `need`: the second value is then the LSN below which
    /// the shell frees everything. `None` while a request is outstanding or the range is
    /// full (it moves on as the lagging acceptors acknowledge it).
    pub fn next(&mut self, need: Lsn, max_fetch: u64, max_bytes: u64, limit: Lsn) -> (Option<(Lsn, Lsn)>, Option<Lsn>) {
        if self.pending.is_some() {
            return (None, None);
        }
        let mut freed = None;
        if self.begin == self.end || need < self.begin {
            if self.end > self.begin {
                freed = Some(self.end);
            }
            *self = Fetched { unanswered: self.unanswered, ..Fetched::empty(need) };
        }
        let to = Lsn((self.end.0 + max_fetch).min(limit.0).min(self.begin.0 + max_bytes));
        ((to > self.end).then_some((self.end, to)), freed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fetches_forward_within_the_cap_and_releases_behind() {
        let mut f = Fetched::empty(Lsn(0));
        // Empty: starts at the need.
        assert_eq!(f.next(Lsn(100), 10, 25, Lsn(1000)), (Some((Lsn(100), Lsn(110))), None));
        f.end = Lsn(110);
        assert_eq!(f.next(Lsn(110), 10, 25, Lsn(1000)), (Some((Lsn(110), Lsn(120))), None));
        f.end = Lsn(120);
        // Full at 25 bytes: only 5 more until something is released.
        assert_eq!(f.next(Lsn(120), 10, 25, Lsn(1000)), (Some((Lsn(120), Lsn(125))), None));
        f.end = Lsn(125);
        assert_eq!(f.next(Lsn(125), 10, 25, Lsn(1000)), (None, None));
        assert_eq!(f.release(Some(Lsn(112))), Some(Lsn(112)));
        assert_eq!(f.release(Some(Lsn(90))), None, "never back");
        // Never past the local floor.
        assert_eq!(f.next(Lsn(125), 10, 25, Lsn(130)), (Some((Lsn(125), Lsn(130))), None));
        // A need below the range starts it again there, freeing all of it.
        assert_eq!(f.next(Lsn(50), 10, 25, Lsn(130)), (Some((Lsn(50), Lsn(60))), Some(Lsn(125))));
        assert_eq!((f.begin, f.end), (Lsn(50), Lsn(50)));
        // Nobody needs any: all released.
        f.end = Lsn(60);
        assert_eq!(f.release(None), Some(Lsn(60)));
        assert_eq!(f.bytes(), 0);
        // One request at a time.
        f.pending = Some((0, Lsn(60), Lsn(70)));
        assert_eq!(f.next(Lsn(60), 10, 25, Lsn(130)), (None, None));
    }
}
