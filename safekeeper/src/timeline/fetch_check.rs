//! Record checks on the WAL a safekeeper serves a proposer through `FetchWal`: before a
//! piece goes out, every record that overlaps it must have passed `pgwal`'s decoder (header,
//! CRC32C, the page headers on the way), the check replication already makes
//! (`crate::verify`, whose [`RecordChecker`] and [`decode_start`] this reuses).
//!
//! Why: a proposer fetches WAL below its own start, or below what its `pg_wal` still holds,
//! from a safekeeper that has it (the election's donor first) and sends it on to a
//! safekeeper that lags behind. A record that rotted on the donor's disk after it was
//! acknowledged would be copied to that second safekeeper, where it would look like its own
//! damage; checked here, it stays on the one safekeeper that has it, named in its log (LSN
//! and segment file) and counted in `safekeeper_wal_corruption_total`.
//!
//! The pieces are cut anywhere: the proposer asks for up to 1 MiB (`max_fetch`) at a time,
//! forwards from where the lagging safekeeper's log ends (`quorum`'s `fetched.rs`), and
//! records can be far longer (hundreds of MiB). So:
//! - **A piece that begins inside a record** is checked from that record's start, found by
//!   [`decode_start`] as for a replica starting mid-record; **one that ends inside a record**
//!   is checked to that record's end, which may lie in WAL above the piece (and must lie in
//!   this safekeeper's WAL: otherwise the record cannot be checked here, and the piece is
//!   refused as [`Refusal::Incomplete`], which is no damage).
//! - **Each timeline remembers one range of WAL whose records all checked** (two LSNs), and
//!   only what a piece has outside it is decoded; a range just decoded that touches the
//!   remembered one extends it. The proposer's pieces are adjacent (each begins where the
//!   one before ended; a range extends either way), so a record spanning many pieces is
//!   decoded once, with the first piece that touches it, and the pieces after that cost
//!   nothing. Memory: two LSNs, and while a
//!   check runs the decoder's copy of the longest record it reads.
//! - **A record that began before this safekeeper's WAL** (removed, or before a learner's
//!   `log_begin`): its tail is served with only its page headers checked, the
//!   `unverifiable_tail` rule of replication; every record after it is checked.
//! - **A failure is remembered**: the LSN the decoder stopped at (the bad record's start,
//!   or a bad page header) and the end of what it had read then, which holds the rest of a
//!   record whose CRC failed. A request that overlaps that extent is refused without
//!   reading: the proposer asks again every tick (500 ms) while it is refused, and a
//!   300 MiB damaged record must not be decoded twice a second under the timeline's lock.
//!   The extent may go up to one read (128 KiB) past the bad record's end, so a piece
//!   holding only good records just after it can be refused too; the proposer fetches in
//!   order and could not get past the bad record here anyway.
//!
//! What is remembered describes bytes on disk below the flush LSN, which change only by a
//! truncation (an election) or removal: [`FetchCheck::forget`] after a truncation, and a
//! change of the WAL's beginning forgets it too. Nothing here does I/O: reads go through the
//! closure the caller passes (the timeline's storage, under its lock).

use bytes::Bytes;
use pgwal::DecoderConfig;
use proto::Lsn;

use crate::verify::{decode_start, RecordChecker};

/// Bytes read per step of a check (and never across a segment boundary).
/// Small enough that a remembered failure's extent (which ends with the read that found
/// it) refuses little WAL past the bad record, large enough that a 1 MiB piece is 8 reads.
const READ_CHUNK_BYTES: u64 = 128 * 1024;

/// This safekeeper's WAL as a check sees it.
#[derive(Clone, Copy, Debug)]
pub struct WalBounds {
    /// Where the WAL begins (a record that began below this cannot be checked).
    pub begin: Lsn,
    /// The flush LSN: reads stop here.
    pub end: Lsn,
    pub config: DecoderConfig,
}

/// Why a piece may not be served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A record or page header at `lsn` failed its check: damage on this safekeeper.
    /// `found_now` is false when the failure was remembered from an earlier request.
    Corrupt { lsn: Lsn, reason: String, found_now: bool },
    /// The record that begins at `record_from` (or the one continuing there) goes on past
    /// the end of this safekeeper's WAL: it cannot be checked here.
    Incomplete { record_from: Lsn, wal_end: Lsn },
    /// The storage could not read `[from, to)`.
    Unreadable { from: Lsn, to: Lsn, error: String },
}

/// What a check decoded (nothing when the remembered range covered the piece).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckStats {
    pub decoded_bytes: u64,
    pub records: u64,
}

/// The per-timeline state of the checks. See the module documentation.
#[derive(Debug, Default)]
pub struct FetchCheck {
    /// `[lo, hi)`: every byte in it belongs to a record that checked (or to page headers
    /// and padding between them, or to the unverifiable tail at the WAL's beginning).
    checked: Option<(Lsn, Lsn)>,
    /// The WAL's beginning when `checked` and `bad` were found.
    begin: Lsn,
    /// Where a decoding failed, and why.
    bad: Option<Bad>,
}

/// A decoding failure remembered: the record (or page header) at `lsn` did not check, and
/// it lies within `[lsn, until)`, the end of what the decoder had read.
#[derive(Debug)]
struct Bad {
    lsn: Lsn,
    until: Lsn,
    reason: String,
}

impl FetchCheck {
    /// Forgets what was checked: the WAL was truncated, so bytes may change.
    pub fn forget(&mut self) {
        self.checked = None;
        self.bad = None;
    }

    /// The range known to have checked.
    #[cfg(test)]
    pub fn checked_range(&self) -> Option<(Lsn, Lsn)> {
        self.checked
    }

    /// Checks every record that overlaps `[from, to)`, reading this safekeeper's WAL with
    /// `read(from, to)` (called only within `wal.begin..wal.end`). `Ok`: the piece may be
    /// served.
    pub fn check(
        &mut self,
        from: Lsn,
        to: Lsn,
        wal: WalBounds,
        mut read: impl FnMut(Lsn, Lsn) -> anyhow::Result<Bytes>,
    ) -> Result<CheckStats, Refusal> {
        if wal.begin != self.begin {
            self.forget();
            self.begin = wal.begin;
        }
        let mut stats = CheckStats::default();
        let (lo, hi) = self.unchecked_part(from, to);
        if lo >= hi {
            return Ok(stats);
        }
        if let Some(bad) = &self.bad {
            if lo < bad.until && bad.lsn < hi {
                return Err(Refusal::Corrupt { lsn: bad.lsn, reason: bad.reason.clone(), found_now: false });
            }
        }
        let unreadable = |from: Lsn, to: Lsn, e: anyhow::Error| Refusal::Unreadable { from, to, error: format!("{e:#}") };
        let mut last_read = (lo, lo);
        let start = decode_start(lo, wal.begin, wal.end, wal.config, |f, t| {
            last_read = (f, t);
            read(f, t)
        });
        let start = match start {
            Ok(Some(s)) => s,
            // `lo`'s page header lies past the flush LSN: nothing there to check.
            Ok(None) => return Err(Refusal::Incomplete { record_from: lo, wal_end: wal.end }),
            Err(e) => return Err(unreadable(last_read.0, last_read.1, e)),
        };
        let mut checker = match RecordChecker::new(start, wal.config) {
            Ok(c) => c,
            Err(e) => return Err(Refusal::Corrupt { lsn: start.lsn, reason: e.to_string(), found_now: true }),
        };
        let seg = wal.config.segment_size_bytes;
        let outcome = loop {
            if checker.verified_lsn() >= hi {
                break Ok(());
            }
            let at = checker.next_read_lsn();
            if at >= wal.end {
                break Err(Refusal::Incomplete { record_from: checker.verified_lsn(), wal_end: wal.end });
            }
            let end = Lsn((at.0 + READ_CHUNK_BYTES).min((at.0 / seg + 1) * seg).min(wal.end.0));
            let data = match read(at, end) {
                Ok(d) => d,
                Err(e) => break Err(unreadable(at, end, e)),
            };
            stats.decoded_bytes += data.len() as u64;
            if let Err(e) = checker.feed_up_to(&data, hi) {
                // The failing record lies within what was read: from its start (or the bad
                // page header) to the end of this read.
                self.bad = Some(Bad { lsn: e.lsn(), until: end.max(Lsn(e.lsn().0 + 1)), reason: e.to_string() });
                break Err(Refusal::Corrupt { lsn: e.lsn(), reason: e.to_string(), found_now: true });
            }
        };
        stats.records = checker.records();
        // What checked is remembered, whether or not the whole piece did. Bytes between
        // `lo` and the first record that checked are page headers, or the tail of a record
        // that began before the WAL (`decode_start` begins at the record holding `lo`).
        let first = if start.unverifiable_tail { Some(start.lsn) } else { checker.first_record_lsn().map(|f| f.min(lo)) };
        if let Some(first) = first {
            if checker.verified_lsn() > first {
                self.remember(first, checker.verified_lsn());
            }
        }
        outcome.map(|()| stats)
    }

    /// The part of `[from, to)` outside the remembered range, as one range (all of it
    /// when the remembered range lies strictly inside).
    fn unchecked_part(&self, from: Lsn, to: Lsn) -> (Lsn, Lsn) {
        let Some((c_lo, c_hi)) = self.checked else { return (from, to) };
        let lo = if c_lo <= from && from < c_hi { c_hi } else { from };
        let hi = if c_lo < to && to <= c_hi { c_lo } else { to };
        (lo, hi.max(lo))
    }

    fn remember(&mut self, lo: Lsn, hi: Lsn) {
        self.checked = match self.checked {
            Some((c_lo, c_hi)) if hi >= c_lo && lo <= c_hi => Some((lo.min(c_lo), hi.max(c_hi))),
            _ => Some((lo, hi)),
        };
    }
}

#[cfg(test)]
mod tests;
