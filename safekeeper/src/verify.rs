//! Record verification of the WAL a replication connection sends: a byte goes out only
//! once `pgwal`'s stream decoder has seen the whole record it belongs to, with its header
//! and CRC32C checked, and the page headers on the way.
//!
//! Why: a safekeeper's copy of the WAL can rot on its disk after it was acknowledged (the
//! storage checks only page headers as it reads), and a record whose bytes changed would
//! otherwise be served as is: the pageserver would stop at it and move to another
//! safekeeper, but a read replica or `pg_receivewal` would keep the bad bytes. Checking
//! before sending keeps the damage on the one safekeeper that has it, names it in its log
//! and metrics, and tells the client (`FATAL`, SQLSTATE XX001) to go elsewhere.
//!
//! [`VerifiedStream`] does no I/O: the sender reads WAL and feeds it in order, and takes
//! back the bytes that may be sent. [`decode_start`] chooses where decoding begins, reading
//! page headers through a closure. The rules:
//! - **Only checked bytes are sent**: WAL up to the end of the last record that checked
//!   (its `MAXALIGN` padding included, or after `XLOG_SWITCH` the unused rest of the
//!   segment, which no reader decodes). The bytes of a record that fails are never sent;
//!   those before it are.
//! - **A record incomplete at the commit LSN is held back** until the commit LSN passes its
//!   end, and then sent: the sender waits for the commit LSN as when it is caught up, so
//!   nothing deadlocks and nothing is refused. `quorum` commits only boundary LSNs, so
//!   the commit LSN is a record end and nothing is held; the rule keeps the sender right
//!   should a commit LSN ever fall inside a record. A client would lose nothing by it:
//!   neither PostgreSQL nor the pageserver can use part of a record.
//! - **A start inside a record** (a read replica or `pg_receivewal` starts at a segment
//!   boundary; a page boundary can be inside a record too): decoding begins where that
//!   record begins, found by walking back over the page headers whose `xlp_rem_len` says
//!   the record continues through the whole page, so the record is checked whole; the
//!   bytes before the client's start are decoded, not sent. A mid-page start (the
//!   pageserver's, at a record boundary) begins decoding at its page's boundary, so even a
//!   start that is not a record boundary is handled, at the cost of one page read.
//! - **Unless that record began before this safekeeper's WAL** (removed, or before the
//!   compute's first WAL): then its tail cannot be checked here; it is sent with only its
//!   page headers and continuation lengths checked (the client's own decoder checks the
//!   CRC, if it reads the record at all: PostgreSQL's and the pageserver's skip a tail
//!   they did not see begin), and every record after it is checked. The WAL's beginning,
//!   when it is inside a page, is the compute's first record (a basebackup LSN) or a
//!   learner's `log_begin` (a boundary LSN), so decoding starts there as at a record.
//!
//! Cost: one pass of the decoder over the bytes (it copies them into its buffer and each
//! record into one buffer of its own, then computes the CRC32C); the bytes sent are the
//! ones read, sliced, not copied. Memory per stream is about twice the largest record in
//! flight (the decoder's copy and the bytes waiting to be sent). `tests/replication.rs`
//! measures the throughput.

use std::collections::VecDeque;

use bytes::Bytes;
use pgwal::consts::{SIZE_OF_XLOG_LONG_PHD, SIZE_OF_XLOG_SHORT_PHD, XLOG_BLCKSZ};
use pgwal::{DecoderConfig, PageHeader, WalError, WalStreamDecoder};
use proto::Lsn;

/// Where decoding begins for a client that asked for WAL from some LSN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeStart {
    /// A page boundary, or the WAL's beginning inside a page (a record start).
    pub lsn: Lsn,
    /// The client's start is inside a record that began before this safekeeper's WAL: the
    /// rest of that record goes out with only its page headers checked.
    pub unverifiable_tail: bool,
}

/// Where to begin decoding so that the record holding `start` is decoded whole, reading
/// page headers with `read(from, to)` (which may be called only below `commit`). `None`
/// if the header of `start`'s page is not committed yet (a start at a page boundary with
/// nothing after it): ask again when the commit LSN has moved. A header that does not
/// validate stops the walk there, so that the decoder reports it with its LSN.
pub fn decode_start(
    start: Lsn,
    begin: Lsn,
    commit: Lsn,
    config: DecoderConfig,
    mut read: impl FnMut(Lsn, Lsn) -> anyhow::Result<Bytes>,
) -> anyhow::Result<Option<DecodeStart>> {
    let page_bytes = XLOG_BLCKSZ as u64;
    let seg = config.segment_size_bytes;
    let header_end = |page: u64| page + if page.is_multiple_of(seg) { SIZE_OF_XLOG_LONG_PHD } else { SIZE_OF_XLOG_SHORT_PHD } as u64;
    let at = |lsn: Lsn, unverifiable_tail: bool| Ok(Some(DecodeStart { lsn, unverifiable_tail }));
    // The header at `page`, or `None` if it does not validate.
    let mut header = |page: u64| -> anyhow::Result<Option<PageHeader>> {
        let bytes = read(Lsn(page), Lsn(header_end(page)))?;
        Ok(PageHeader::parse(&bytes).filter(|h| h.validate(Lsn(page), seg, config.system_id).is_ok()))
    };
    let first_page = start.0 - start.0 % page_bytes;
    if first_page < begin.0 {
        // The WAL begins inside this page, at the compute's first record.
        return at(begin, false);
    }
    if header_end(first_page) > commit.0 {
        return Ok(None);
    }
    let (first_page, h, start) = match header(first_page)? {
        Some(h) => (first_page, h, start),
        None => {
            // Pages without a header: the rest of a segment after `XLOG_SWITCH` (zeros: the
            // switch record, on the last page with a header before them, covers them), or
            // damage. Decoding from the last page of the segment that has a header tells
            // which: it passes the switch record, or reports the first bad header.
            let segment_first = first_page - first_page % seg;
            let mut page = first_page;
            loop {
                if page == segment_first || page - page_bytes < begin.0 {
                    return at(Lsn(first_page), false);
                }
                page -= page_bytes;
                if let Some(h) = header(page)? {
                    break (page, h, Lsn(page + page_bytes - 1));
                }
            }
        }
    };
    match h.first_record_lsn(Lsn(first_page)) {
        _ if !h.is_contrecord() => return at(Lsn(first_page), false),
        Some(first) if start >= first => return at(Lsn(first_page), false),
        _ => {}
    }
    // `start` is in the tail of a record begun on an earlier page: find the page it began
    // on, the nearest one on which any record begins.
    let mut page = first_page;
    loop {
        if page == begin.0 {
            return at(begin, true);
        }
        let prev = page - page_bytes;
        if prev < begin.0 {
            // The WAL begins inside `prev`, at a record: the one we look for began there or later.
            return at(begin, false);
        }
        match header(prev)? {
            None => return at(Lsn(prev), false),
            Some(h) if h.first_record_lsn(Lsn(prev)).is_some() => return at(Lsn(prev), false),
            Some(_) => page = prev,
        }
    }
}

/// The decoder every check of served WAL runs: bytes fed in order from a [`DecodeStart`],
/// every record they complete checked (header, CRC32C, the page headers on the way).
/// [`VerifiedStream`] wraps it for replication; `crate::fetch_check` uses it alone for the
/// WAL a proposer fetches, which needs no bytes kept for sending.
pub struct RecordChecker {
    decoder: WalStreamDecoder,
    /// The end of the last record that checked (the decode start before any did).
    verified: Lsn,
    /// Where the first record that checked begins.
    first_record: Option<Lsn>,
    records: u64,
}

impl RecordChecker {
    pub fn new(from: DecodeStart, config: DecoderConfig) -> Result<RecordChecker, WalError> {
        // A compute started where the pageserver did not know the previous record writes
        // its first record with `xl_prev` = 0, which is no damage (compute patch 0009).
        let decoder = WalStreamDecoder::new(from.lsn, config)?.accept_unknown_prev_link();
        Ok(RecordChecker { decoder, verified: from.lsn, first_record: None, records: 0 })
    }

    /// Where the next bytes fed must begin.
    pub fn next_read_lsn(&self) -> Lsn {
        self.decoder.next_feed_lsn()
    }

    /// The end of the last record that checked.
    pub fn verified_lsn(&self) -> Lsn {
        self.verified
    }

    /// Where the first record that checked begins, if one did.
    pub fn first_record_lsn(&self) -> Option<Lsn> {
        self.first_record
    }

    /// Records checked so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Feeds the bytes that begin at [`Self::next_read_lsn`] and checks every record they
    /// complete. An error is the first record (or page header) that does not check; the
    /// checker is stuck then, and what checked before it stays checked.
    pub fn feed(&mut self, data: &[u8]) -> Result<(), WalError> {
        self.feed_up_to(data, Lsn(u64::MAX))
    }

    /// Like [`Self::feed`], but stops checking once a record that ends at or past `target`
    /// checked: records after it are left undecoded (so damage there is not reported), and
    /// the checker is not to be fed again.
    pub fn feed_up_to(&mut self, data: &[u8], target: Lsn) -> Result<(), WalError> {
        self.decoder.feed_bytes(data);
        while self.verified < target {
            let Some(record) = self.decoder.poll_decode()? else { break };
            self.first_record.get_or_insert(record.start_lsn());
            self.verified = record.end_lsn();
            self.records += 1;
        }
        Ok(())
    }
}

/// The WAL of one `START_REPLICATION`, checked as it is read. See the module documentation.
pub struct VerifiedStream {
    checker: RecordChecker,
    /// The client's start: bytes before it are decoded, never sent.
    start: Lsn,
    /// Everything from `start` below this was handed out to be sent.
    sent: Lsn,
    /// The bytes `[max(sent, start), next_read_lsn())`, as read, in order; each within one
    /// segment (as the reads are).
    pending: VecDeque<Bytes>,
}

impl VerifiedStream {
    /// A stream to a client that asked for WAL from `start`, decoding from `from` (see
    /// [`decode_start`]).
    pub fn new(start: Lsn, from: DecodeStart, config: DecoderConfig) -> Result<VerifiedStream, WalError> {
        debug_assert!(from.lsn <= start);
        Ok(VerifiedStream { checker: RecordChecker::new(from, config)?, start, sent: start, pending: VecDeque::new() })
    }

    /// Where the next bytes fed must begin.
    pub fn next_read_lsn(&self) -> Lsn {
        self.checker.next_read_lsn()
    }

    /// Everything below this (from the client's start) was handed out by [`Self::next_send`].
    pub fn sent_lsn(&self) -> Lsn {
        self.sent
    }

    /// The end of the last record that checked.
    pub fn verified_lsn(&self) -> Lsn {
        self.checker.verified_lsn()
    }

    /// Records checked so far.
    pub fn records(&self) -> u64 {
        self.checker.records()
    }

    /// Feeds the bytes that begin at [`Self::next_read_lsn`] and checks every record they
    /// complete. An error is the first record (or page header) that does not check; the
    /// stream is stuck then, but what was checked before it can still be sent.
    pub fn feed(&mut self, data: Bytes) -> Result<(), WalError> {
        let from = self.next_read_lsn();
        let end = from.0 + data.len() as u64;
        if end > self.start.0 {
            let skip = self.start.0.saturating_sub(from.0) as usize;
            self.pending.push_back(data.slice(skip..));
        }
        self.checker.feed(&data)
    }

    /// The next bytes that may be sent, at most `max_bytes` of them, within one segment,
    /// and where they begin; `None` if nothing checked is waiting.
    pub fn next_send(&mut self, max_bytes: usize) -> Option<(Lsn, Bytes)> {
        let sendable = self.verified_lsn().min(self.next_read_lsn());
        if sendable <= self.sent {
            return None;
        }
        let front = self.pending.front_mut()?;
        let n = front.len().min(max_bytes.max(1)).min((sendable.0 - self.sent.0) as usize);
        let bytes = if n == front.len() { self.pending.pop_front()? } else { front.split_to(n) };
        let at = self.sent;
        self.sent = Lsn(at.0 + n as u64);
        Some((at, bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgwal::consts::{RM_HEAP_ID, XLOG_HEAP_INSERT};
    use pgwal::test_encoder::{RecordSpec, WalWriter};

    const SEG: u64 = 1 << 20;
    const PAGE: u64 = XLOG_BLCKSZ as u64;

    fn record(len: usize) -> RecordSpec {
        RecordSpec::new(RM_HEAP_ID, XLOG_HEAP_INSERT).xid(700).main_data(vec![7; len])
    }

    /// Where decoding starts for `start`, on the WAL of `w`, beginning at `begin`.
    fn start_for(w: &WalWriter, start: Lsn, begin: Lsn, commit: Lsn) -> Option<DecodeStart> {
        let config = DecoderConfig { segment_size_bytes: SEG, system_id: Some(7) };
        let read = |from: Lsn, to: Lsn| {
            assert!(begin <= from && to <= commit, "read {from}..{to} outside {begin}..{commit}");
            Ok(Bytes::copy_from_slice(&w.bytes_from(from)[..(to.0 - from.0) as usize]))
        };
        decode_start(start, begin, commit, config, read).unwrap()
    }

    #[test]
    fn decoding_starts_where_the_record_holding_the_start_begins() {
        let origin = Lsn(3 * SEG - 3 * PAGE);
        let mut w = WalWriter::new(origin, SEG);
        let small = w.append(&record(100));
        let big = w.append(&record(30_000)); // across three page boundaries and a segment
        let after = w.append(&record(40));
        let end = after.end;
        let at = |lsn: Lsn| Some(DecodeStart { lsn, unverifiable_tail: false });
        let boundary = Lsn(3 * SEG);
        assert!(big.start < boundary && boundary < big.end);
        // (start, WAL beginning, expected)
        let cases = [
            // A record start inside a page: from that page.
            (small.start, origin, at(origin)),
            (big.start, origin, at(origin)),
            // Page boundaries inside `big` (one of them a segment boundary): from its page.
            (Lsn(origin.0 + PAGE), origin, at(origin)),
            (boundary, origin, at(origin)),
            (Lsn(boundary.0 + 100), origin, at(origin)),
            // After `big`'s tail on the page it ends on.
            (after.start, origin, at(Lsn(after.start.0 - after.start.0 % PAGE))),
            // The WAL begins inside the first page: at its first record.
            (boundary, small.start, at(small.start)),
            // The WAL begins at a page `big` continues through: its tail cannot be checked.
            (boundary, Lsn(origin.0 + PAGE), Some(DecodeStart { lsn: Lsn(origin.0 + PAGE), unverifiable_tail: true })),
            (boundary, boundary, Some(DecodeStart { lsn: boundary, unverifiable_tail: true })),
        ];
        for (start, begin, expected) in cases {
            assert_eq!(start_for(&w, start, begin, end), expected, "start {start}, WAL from {begin}");
        }
        // A start at a page boundary whose header is not committed yet: ask again later.
        assert_eq!(start_for(&w, boundary, origin, Lsn(boundary.0 + 10)), None);
        // A start in the zeros an `XLOG_SWITCH` leaves at the end of its segment: from the
        // page the switch record is on (that record covers them).
        let mut sw = WalWriter::new(Lsn(4 * SEG - 8 * PAGE), SEG);
        sw.append(&record(30_000));
        let switch = sw.append_encoded(&RecordSpec::new(pgwal::consts::RM_XLOG_ID, pgwal::consts::XLOG_SWITCH).encode(sw.prev));
        assert_eq!(switch.end, Lsn(4 * SEG));
        // PostgreSQL leaves those pages zero, headers too (the test encoder writes headers).
        let next_page = (switch.start.0 / PAGE + 1) * PAGE;
        sw.out[(next_page - sw.start.0) as usize..].fill(0);
        let zeros = Lsn(4 * SEG - 2 * PAGE + 100);
        assert_eq!(start_for(&sw, zeros, sw.start, switch.end), at(Lsn(switch.start.0 - switch.start.0 % PAGE)));
        // A header that does not validate stops the walk there, for the decoder to report.
        let mut bad = WalWriter::new(origin, SEG);
        bad.out = w.out.clone();
        bad.out[(boundary.0 - PAGE - origin.0) as usize] ^= 0xff; // the magic of the page before
        assert_eq!(start_for(&bad, boundary, origin, end), at(Lsn(boundary.0 - PAGE)));
    }

    #[test]
    fn only_checked_records_are_handed_out() {
        let origin = Lsn(2 * SEG);
        let mut w = WalWriter::new(origin, SEG);
        let a = w.append(&record(100));
        let b = w.append(&record(20_000));
        let config = DecoderConfig { segment_size_bytes: SEG, system_id: Some(7) };
        let from = DecodeStart { lsn: origin, unverifiable_tail: false };
        let mut s = VerifiedStream::new(a.start, from, config).unwrap();
        // Up to the middle of `b`: `a` goes out, `b` waits.
        let mid = (b.start.0 + 5000 - origin.0) as usize;
        s.feed(Bytes::copy_from_slice(&w.out[..mid])).unwrap();
        assert_eq!(s.next_send(64), Some((a.start, Bytes::copy_from_slice(&w.out[40..40 + 64]))));
        let (at, rest) = s.next_send(1 << 20).unwrap();
        assert_eq!((at, at.0 + rest.len() as u64), (Lsn(a.start.0 + 64), b.start.0));
        assert_eq!(s.next_send(1 << 20), None);
        // The rest of `b`: all of `b`, in the pieces it was read in.
        s.feed(Bytes::copy_from_slice(&w.out[mid..])).unwrap();
        let mut sent = Vec::new();
        while let Some((at, piece)) = s.next_send(1 << 20) {
            assert_eq!(at.0, b.start.0 + sent.len() as u64);
            sent.extend_from_slice(&piece);
        }
        assert!(sent[..] == w.out[(b.start.0 - origin.0) as usize..]);
        assert_eq!((s.records(), s.sent_lsn()), (2, Lsn(origin.0 + w.out.len() as u64)));
    }
}
