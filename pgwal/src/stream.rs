//! `WalStreamDecoder`: WAL bytes in, complete and checked records out.
//!
//! This is `XLogDecodeNextRecord` without the I/O: the caller feeds bytes in order as they
//! arrive (from a safekeeper, a file, a test) and polls for records. The decoder strips and
//! validates page headers, reassembles records that span pages and segments, checks each
//! record's header and CRC, and skips alignment padding and the unused tail of a segment
//! after `XLOG_SWITCH`.
//!
//! Invariants:
//! - `lsn` is the WAL position of `buf[0]`; bytes are consumed strictly in order.
//! - A page header is validated before any byte of its page is used (except on the page a
//!   mid-page start lands in, whose header the decoder never sees).
//! - Once an error is returned the decoder is stuck: every later poll returns the same
//!   error, so a caller cannot accidentally continue past corruption.
//! - Memory grows with the record being assembled, never with a length field: a record
//!   buffer grows only as its bytes arrive.

use bytes::{Buf, Bytes, BytesMut};
use proto::lsn::WAL_SEGMENT_SIZE_BYTES;
use proto::Lsn;

use crate::consts::*;
use crate::page::PageHeader;
use crate::record::{check_crc, decode_verified, validate_header, validate_tot_len, DecodedRecord, RecordHeader};
use crate::WalError;

/// What the decoder needs to know about the WAL it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecoderConfig {
    /// The WAL segment size the server was initialized with; checked against long headers.
    pub segment_size_bytes: u64,
    /// If known, the system identifier every long page header must carry.
    pub system_id: Option<u64>,
}

impl Default for DecoderConfig {
    fn default() -> DecoderConfig {
        DecoderConfig { segment_size_bytes: WAL_SEGMENT_SIZE_BYTES, system_id: None }
    }
}

/// A complete record whose header and CRC have been checked, with where it starts and ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalRecord {
    start_lsn: Lsn,
    end_lsn: Lsn,
    raw: Bytes,
}

impl WalRecord {
    /// Where the record starts (`ReadRecPtr`).
    pub fn start_lsn(&self) -> Lsn {
        self.start_lsn
    }

    /// Where the next record starts (`EndRecPtr`): past this record and its `MAXALIGN`
    /// padding, or, for `XLOG_SWITCH`, the start of the next segment.
    pub fn end_lsn(&self) -> Lsn {
        self.end_lsn
    }

    /// The record's bytes, header included, without page headers.
    pub fn raw(&self) -> &Bytes {
        &self.raw
    }

    pub fn header(&self) -> RecordHeader {
        // The decoder built this record from a checked header, so parsing cannot fail; the
        // fallback keeps that assumption out of the panic path all the same.
        RecordHeader::parse(&self.raw).unwrap_or(RecordHeader {
            tot_len: 0,
            xid: Default::default(),
            prev: Lsn::INVALID,
            info: 0,
            rmid: 0,
            crc: 0,
        })
    }

    /// Decodes block references and data; the CRC was already checked by the decoder.
    pub fn decode(&self) -> Result<DecodedRecord, WalError> {
        decode_verified(self.start_lsn, self.raw.clone())
    }
}

/// Where the decoder is in the stream; the page-header logic depends on it.
#[derive(Debug)]
enum State {
    /// At a page boundary chosen by the caller: the page may begin with the tail of a record
    /// we never saw, which is skipped.
    StartAtPage,
    /// Skipping the tail of an unseen record; `remaining` bytes of it are left.
    SkipContinuation { remaining: u32 },
    /// Consuming bytes up to `until` without looking at them: alignment padding, or the rest
    /// of a segment after `XLOG_SWITCH` (whose pages PostgreSQL does not read either).
    Skip { until: Lsn },
    /// A record starts at `lsn`.
    RecordStart,
    /// Collecting the record that starts at `start`, `total_len` bytes long.
    Assembling { start: Lsn, total_len: u32, buf: BytesMut, header_checked: bool },
}

/// The streaming decoder. See the module documentation.
#[derive(Debug)]
pub struct WalStreamDecoder {
    config: DecoderConfig,
    lsn: Lsn,
    buf: BytesMut,
    state: State,
    /// Start of the last record returned, which the next record's `xl_prev` must name. `None`
    /// after a start at an arbitrary position, where PostgreSQL only checks it points back.
    prev_record: Option<Lsn>,
    /// `xl_prev` = 0 passes the prev-link check ([`WalStreamDecoder::accept_unknown_prev_link`]).
    unknown_prev_link_ok: bool,
    failed: Option<WalError>,
}

impl WalStreamDecoder {
    /// A decoder for WAL starting at `start`, which must be a page boundary (any record tail
    /// at the top of that page is skipped) or the start of a record.
    pub fn new(start: Lsn, config: DecoderConfig) -> Result<WalStreamDecoder, WalError> {
        let seg = config.segment_size_bytes;
        if !seg.is_power_of_two() || !(WAL_SEG_MIN_SIZE..=WAL_SEG_MAX_SIZE).contains(&seg) {
            return Err(WalError::InvalidSegmentSize { size_bytes: seg });
        }
        let page_offset = start.0 % XLOG_BLCKSZ as u64;
        let min_offset = if start.0 % seg < XLOG_BLCKSZ as u64 { SIZE_OF_XLOG_LONG_PHD } else { SIZE_OF_XLOG_SHORT_PHD };
        let state = if page_offset == 0 {
            State::StartAtPage
        } else if page_offset.is_multiple_of(MAXIMUM_ALIGNOF as u64) && page_offset >= min_offset as u64 {
            State::RecordStart
        } else {
            return Err(WalError::InvalidStartLsn { lsn: start });
        };
        Ok(WalStreamDecoder {
            config,
            lsn: start,
            buf: BytesMut::new(),
            state,
            prev_record: None,
            unknown_prev_link_ok: false,
            failed: None,
        })
    }

    /// Takes a record's `xl_prev` = 0 as "previous record not known", as fjord's patched
    /// `ValidXLogRecordHeader()` does (compute patch 0009): a compute started from a
    /// basebackup whose previous record the pageserver did not know writes its first record
    /// so, and a reader that reads on across that start must not take it for a broken
    /// chain. The record's CRC, which covers `xl_prev`, is checked as ever.
    pub fn accept_unknown_prev_link(mut self) -> WalStreamDecoder {
        self.unknown_prev_link_ok = true;
        self
    }

    /// The position of the next byte the decoder expects to be fed.
    pub fn next_feed_lsn(&self) -> Lsn {
        Lsn(self.lsn.0 + self.buf.len() as u64)
    }

    /// Appends bytes that follow everything fed so far.
    pub fn feed_bytes(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete record, `Ok(None)` if more bytes are needed, or the error that
    /// stopped the decoder.
    pub fn poll_decode(&mut self) -> Result<Option<WalRecord>, WalError> {
        if let Some(err) = &self.failed {
            return Err(err.clone());
        }
        let result = self.decode_step();
        if let Err(err) = &result {
            self.failed = Some(err.clone());
        }
        result
    }

    fn page_remaining(&self) -> usize {
        XLOG_BLCKSZ - (self.lsn.0 % XLOG_BLCKSZ as u64) as usize
    }

    fn consume(&mut self, len: usize) -> BytesMut {
        self.lsn = Lsn(self.lsn.0 + len as u64);
        self.buf.split_to(len)
    }

    fn decode_step(&mut self) -> Result<Option<WalRecord>, WalError> {
        loop {
            if let State::Skip { until } = self.state {
                let n = (until.0 - self.lsn.0).min(self.buf.len() as u64) as usize;
                self.lsn = Lsn(self.lsn.0 + n as u64);
                self.buf.advance(n);
                if self.lsn < until {
                    return Ok(None);
                }
                self.state = State::RecordStart;
            }
            // A page header is the first thing at every page boundary we have not skipped.
            if self.lsn.0.is_multiple_of(XLOG_BLCKSZ as u64) && !self.read_page_header()? {
                return Ok(None);
            }
            let available = self.page_remaining().min(self.buf.len());
            match &mut self.state {
                State::StartAtPage | State::Skip { .. } => return unreachable_state(self.lsn),
                State::SkipContinuation { remaining } => {
                    let n = (*remaining as usize).min(available);
                    if n == 0 {
                        return Ok(None);
                    }
                    *remaining -= n as u32;
                    let done = *remaining == 0;
                    self.consume(n);
                    if done {
                        self.state = State::Skip { until: self.lsn.align8() };
                    }
                }
                State::RecordStart => {
                    if !self.start_record()? {
                        return Ok(None);
                    }
                }
                State::Assembling { total_len, buf, .. } => {
                    let n = (*total_len as usize - buf.len()).min(available);
                    if n == 0 {
                        return Ok(None);
                    }
                    if let Some(record) = self.continue_record(n)? {
                        return Ok(Some(record));
                    }
                }
            }
        }
    }

    /// Reads and validates the header of the page starting at `lsn`, and works out how the
    /// page continues the current state. Returns `false` if the header has not all arrived.
    fn read_page_header(&mut self) -> Result<bool, WalError> {
        let Some(header) = PageHeader::parse(&self.buf) else {
            return Ok(false);
        };
        let lsn = self.lsn;
        header.validate(lsn, self.config.segment_size_bytes, self.config.system_id)?;
        self.consume(header.size());
        let state = std::mem::replace(&mut self.state, State::RecordStart);
        self.state = match state {
            State::StartAtPage if header.is_contrecord() => {
                if header.rem_len == 0 {
                    return Err(WalError::InvalidContrecordLength { lsn, rem_len: 0, expected: 1 });
                }
                State::SkipContinuation { remaining: header.rem_len }
            }
            State::StartAtPage | State::RecordStart => {
                if header.is_contrecord() {
                    return Err(WalError::UnexpectedContrecord { lsn });
                }
                State::RecordStart
            }
            // The record whose tail this would be was abandoned when the server crashed; an
            // XLOG_OVERWRITE_CONTRECORD record starts here instead (as in PostgreSQL, which
            // restarts reading at this page).
            State::SkipContinuation { .. } | State::Assembling { .. } if header.is_overwrite_contrecord() => State::RecordStart,
            State::SkipContinuation { remaining } => {
                check_contrecord(lsn, &header, remaining, lsn)?;
                State::SkipContinuation { remaining }
            }
            State::Assembling { start, total_len, buf, header_checked } => {
                check_contrecord(lsn, &header, total_len - buf.len() as u32, start)?;
                State::Assembling { start, total_len, buf, header_checked }
            }
            State::Skip { .. } => unreachable_state(lsn)?,
        };
        Ok(true)
    }

    /// Reads `xl_tot_len` of the record starting at `lsn` and begins assembling it.
    fn start_record(&mut self) -> Result<bool, WalError> {
        // Records are 8-aligned and the page header is at least 24 bytes, so the 4-byte
        // length is always on this page.
        let Some(len_bytes) = self.buf.get(..4) else {
            return Ok(false);
        };
        let total_len = u32::from_le_bytes([len_bytes[0], len_bytes[1], len_bytes[2], len_bytes[3]]);
        validate_tot_len(self.lsn, total_len)?;
        let capacity = (total_len as usize).min(2 * XLOG_BLCKSZ);
        self.state = State::Assembling { start: self.lsn, total_len, buf: BytesMut::with_capacity(capacity), header_checked: false };
        Ok(true)
    }

    /// Appends the next `n` bytes to the record being assembled; returns the record once
    /// all of it is there.
    fn continue_record(&mut self, n: usize) -> Result<Option<WalRecord>, WalError> {
        let chunk = self.consume(n);
        let end_of_data = self.lsn;
        let State::Assembling { start, total_len, buf, header_checked } = &mut self.state else {
            return unreachable_state(end_of_data);
        };
        let (start, total_len) = (*start, *total_len);
        buf.extend_from_slice(&chunk);
        if !*header_checked {
            if let Some(header) = RecordHeader::parse(buf) {
                validate_header(start, &header)?;
                if !(self.unknown_prev_link_ok && header.prev == Lsn::INVALID) {
                    check_prev_link(self.prev_record, start, &header)?;
                }
                *header_checked = true;
            }
        }
        if buf.len() < total_len as usize {
            return Ok(None);
        }
        let raw = std::mem::take(buf).freeze();
        check_crc(start, &raw)?;
        let is_switch = RecordHeader::parse(&raw).is_some_and(|h| h.is_switch());
        let end_lsn = if is_switch {
            // The rest of the segment is unused: the next record is in the next segment.
            let seg = self.config.segment_size_bytes;
            Lsn(end_of_data.0.div_ceil(seg) * seg)
        } else {
            end_of_data.align8()
        };
        self.state = State::Skip { until: end_lsn };
        self.prev_record = Some(start);
        Ok(Some(WalRecord { start_lsn: start, end_lsn, raw }))
    }
}

/// `ValidXLogRecordHeader`'s prev-link check: exact when reading on from a record we
/// returned, "points backwards" after a start at an arbitrary position.
fn check_prev_link(prev_record: Option<Lsn>, lsn: Lsn, header: &RecordHeader) -> Result<(), WalError> {
    let ok = match prev_record {
        Some(prev) => header.prev == prev,
        None => header.prev < lsn,
    };
    if !ok {
        return Err(WalError::IncorrectPrevLink { lsn, prev: header.prev });
    }
    Ok(())
}

/// Checks a continuation page: it must say it continues a record, with exactly the number
/// of bytes we still expect.
fn check_contrecord(lsn: Lsn, header: &PageHeader, expected: u32, record_lsn: Lsn) -> Result<(), WalError> {
    if !header.is_contrecord() {
        return Err(WalError::MissingContrecord { lsn, record_lsn });
    }
    if header.rem_len == 0 || header.rem_len != expected {
        return Err(WalError::InvalidContrecordLength { lsn, rem_len: header.rem_len, expected });
    }
    Ok(())
}

/// A state that the loop structure rules out. It is reported as an error naming the
/// position rather than a panic, because the decoder runs on data from other processes.
fn unreachable_state<T>(lsn: Lsn) -> Result<T, WalError> {
    Err(WalError::InvalidRecordData { lsn, reason: "internal error: WAL decoder in an impossible state".into() })
}
