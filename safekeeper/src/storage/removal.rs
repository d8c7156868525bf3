//! The WAL removal rule: which segments a timeline may delete, as pure functions of its
//! durable state (tested by tables below; carried out by [`super::wal::WalStore::remove_below`]).
//!
//! The *horizon* is the lowest of three LSNs, each a bound below which nobody needs WAL from
//! this safekeeper any more:
//! - the pageserver's **remote-consistent LSN**: WAL below it is represented by layers in
//!   object storage, and a pageserver restarted from there resumes at it. Until a pageserver
//!   has reported one (0), the horizon is 0 and nothing is removed: a timeline whose
//!   pageserver never connected keeps all its WAL.
//! - the **peer horizon**: every safekeeper has the WAL below it, for good (`quorum`'s "WAL
//!   removal" says why), so no lagging safekeeper's catch-up, no sync and no truncation
//!   needs it.
//! - the **commit LSN**: the peer horizon is already at most the commit LSN when received;
//!   taken again here so that the rule does not depend on that.
//!
//! A segment is removed only if it lies wholly below the horizon: the segment holding the
//! horizon stays, so WAL from the horizon on (where the pageserver resumes) can still be
//! served. Segments go oldest first, and the WAL then begins at the start of the first
//! segment kept.

use proto::Lsn;
use std::ops::Range;

use super::extent::WalExtent;

/// The durable LSNs that bound WAL removal.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemovalInputs {
    pub remote_consistent_lsn: Lsn,
    pub peer_horizon_lsn: Lsn,
    pub commit_lsn: Lsn,
}

impl RemovalInputs {
    /// The LSN below which WAL may be removed: the lowest of the three (0, nothing, while
    /// any is 0, in particular before a pageserver has reported its remote-consistent LSN).
    pub fn horizon(&self) -> Lsn {
        self.remote_consistent_lsn.min(self.peer_horizon_lsn).min(self.commit_lsn)
    }
}

/// The segment numbers that may be removed from a WAL with `extent`, given `horizon`: those
/// from the one holding the WAL's beginning up to, not including, the one holding the
/// horizon (capped at the WAL's end). `None` if there are none.
pub fn removable_segments(extent: WalExtent, horizon: Lsn, segment_size: u64) -> Option<Range<u64>> {
    if extent.begin == Lsn(0) && extent.end == Lsn(0) {
        return None;
    }
    let first = extent.begin.0 / segment_size;
    let keep = horizon.min(extent.end).0 / segment_size;
    (keep > first).then_some(first..keep)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEG: u64 = 16 << 20;

    fn lsn(segments: f64) -> Lsn {
        Lsn((segments * SEG as f64) as u64)
    }

    #[test]
    fn the_horizon_is_the_lowest_input_and_nothing_without_a_pageserver() {
        // (remote-consistent, peer horizon, commit) -> horizon
        let cases = [
            ((0, 500, 900), 0), // no pageserver has reported: nothing
            ((700, 0, 900), 0), // no peer horizon yet
            ((700, 500, 900), 500),
            ((400, 500, 900), 400),
            ((950, 960, 900), 900), // the commit LSN bounds it too
            ((900, 900, 900), 900),
        ];
        for ((r, p, c), want) in cases {
            let inputs = RemovalInputs { remote_consistent_lsn: Lsn(r), peer_horizon_lsn: Lsn(p), commit_lsn: Lsn(c) };
            assert_eq!(inputs.horizon(), Lsn(want), "{inputs:?}");
        }
    }

    #[test]
    fn only_segments_wholly_below_the_horizon() {
        // (begin, end, horizon) in segments -> removable segment numbers
        type Case = ((f64, f64, f64), Option<Range<u64>>);
        let cases: [Case; 11] = [
            ((0.0, 0.0, 0.0), None),       // a WAL that never began
            ((1.5, 5.5, 0.0), None),       // horizon 0
            ((1.5, 5.5, 1.7), None),       // the horizon is in the first segment
            ((1.5, 5.5, 2.0), Some(1..2)), // exactly at a boundary: the segment below goes
            ((1.5, 5.5, 2.01), Some(1..2)),
            ((1.5, 5.5, 4.99), Some(1..4)), // the horizon's segment stays
            ((1.5, 5.5, 9.0), Some(1..5)),  // never beyond the WAL's end: its segment stays
            ((3.0, 3.0, 3.0), None),        // an empty WAL at a segment start
            ((2.0, 6.0, 6.0), Some(2..6)),  // ends at a boundary: the WAL becomes empty at 6
            ((4.0, 6.0, 2.0), None),        // a horizon below what is left
            ((0.25, 1.0, 1.0), Some(0..1)),
        ];
        for ((b, e, h), want) in cases {
            let extent = WalExtent { begin: lsn(b), end: lsn(e) };
            assert_eq!(removable_segments(extent, lsn(h), SEG), want, "begin {b}, end {e}, horizon {h}");
        }
    }
}
