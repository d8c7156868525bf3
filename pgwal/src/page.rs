//! WAL page headers: `XLogPageHeaderData` and `XLogLongPageHeaderData`.
//!
//! Every 8 KiB WAL page starts with a short header; the first page of each segment carries a
//! long one that also names the database system and the segment and page sizes. The header
//! says where the page belongs (`xlp_pageaddr`) and whether it starts with the tail of a
//! record begun on an earlier page (`XLP_FIRST_IS_CONTRECORD`, with `xlp_rem_len` bytes of
//! it left). Validation follows `XLogReaderValidatePageHeader`: a page whose address does
//! not match its position is a recycled segment or corruption, never data to decode.

use proto::Lsn;

use crate::consts::*;
use crate::cursor::Cursor;
use crate::ids::TimeLineId;
use crate::WalError;

/// The extra fields of a long page header (`XLogLongPageHeaderData`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LongPageHeader {
    /// `xlp_sysid`: the system identifier from `pg_control`.
    pub sysid: u64,
    /// `xlp_seg_size`: the WAL segment size, as a cross-check.
    pub seg_size_bytes: u32,
    /// `xlp_xlog_blcksz`: the WAL page size, as a cross-check.
    pub xlog_blcksz_bytes: u32,
}

/// A WAL page header (`XLogPageHeaderData`, plus the long fields when `XLP_LONG_HEADER`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageHeader {
    pub magic: u16,
    /// `xlp_info`: the `XLP_*` flags.
    pub info: u16,
    /// `xlp_tli`: the timeline of the first record on the page.
    pub tli: TimeLineId,
    /// `xlp_pageaddr`: the LSN of the page itself.
    pub pageaddr: Lsn,
    /// `xlp_rem_len`: bytes of a record begun on an earlier page that continue here.
    pub rem_len: u32,
    pub long: Option<LongPageHeader>,
}

impl PageHeader {
    /// A short header for the page at `pageaddr`; a long one if that is a segment start.
    pub fn new(pageaddr: Lsn, tli: TimeLineId, segment_size_bytes: u64, sysid: u64) -> PageHeader {
        let long = pageaddr.0.is_multiple_of(segment_size_bytes).then_some(LongPageHeader {
            sysid,
            seg_size_bytes: segment_size_bytes as u32,
            xlog_blcksz_bytes: XLOG_BLCKSZ as u32,
        });
        let info = if long.is_some() { XLP_LONG_HEADER } else { 0 };
        PageHeader { magic: XLOG_PAGE_MAGIC, info, tli, pageaddr, rem_len: 0, long }
    }

    /// The header's size on the page: `XLogPageHeaderSize()`.
    pub fn size(&self) -> usize {
        if self.info & XLP_LONG_HEADER != 0 {
            SIZE_OF_XLOG_LONG_PHD
        } else {
            SIZE_OF_XLOG_SHORT_PHD
        }
    }

    pub fn is_contrecord(&self) -> bool {
        self.info & XLP_FIRST_IS_CONTRECORD != 0
    }

    pub fn is_overwrite_contrecord(&self) -> bool {
        self.info & XLP_FIRST_IS_OVERWRITE_CONTRECORD != 0
    }

    /// Where the first record that begins on this page (the page at `page_lsn`) begins:
    /// after the header and the `MAXALIGN`ed tail of a record continued from an earlier
    /// page; `None` if that tail fills the page, so that no record begins on it. This is
    /// how `XLogFindNextRecord` finds a record start from a page boundary. It trusts
    /// `rem_len`: validate the header first.
    pub fn first_record_lsn(&self, page_lsn: Lsn) -> Option<Lsn> {
        let tail_bytes = if self.is_contrecord() { u64::from(self.rem_len) } else { 0 };
        let room_bytes = (XLOG_BLCKSZ - self.size()) as u64;
        if tail_bytes >= room_bytes {
            return None;
        }
        let first = Lsn(page_lsn.0 + self.size() as u64 + tail_bytes).align8();
        (first.0 < page_lsn.0 + XLOG_BLCKSZ as u64).then_some(first)
    }

    /// Parses the header at the start of `buf`. Returns `None` if `buf` is too short to hold
    /// it (the long fields are read only when `XLP_LONG_HEADER` says they are there).
    /// Parsing checks nothing; see [`PageHeader::validate`].
    pub fn parse(buf: &[u8]) -> Option<PageHeader> {
        let mut c = Cursor::new(buf);
        let magic = c.u16()?;
        let info = c.u16()?;
        let tli = TimeLineId(c.u32()?);
        let pageaddr = Lsn(c.u64()?);
        let rem_len = c.u32()?;
        let long = if info & XLP_LONG_HEADER != 0 {
            c.skip(4)?; // padding that MAXALIGNs the short part
            let sysid = c.u64()?;
            let seg_size_bytes = c.u32()?;
            let xlog_blcksz_bytes = c.u32()?;
            Some(LongPageHeader { sysid, seg_size_bytes, xlog_blcksz_bytes })
        } else {
            // The short header is MAXALIGNed: make sure its padding is there too, so that a
            // caller can consume `size()` bytes once `parse` succeeds.
            c.skip(SIZE_OF_XLOG_SHORT_PHD - c.position())?;
            None
        };
        Some(PageHeader { magic, info, tli, pageaddr, rem_len, long })
    }

    /// Checks the header of the page at `lsn` as `XLogReaderValidatePageHeader` does, for
    /// WAL with segments of `segment_size_bytes` from the system `system_id` (if known).
    pub fn validate(&self, lsn: Lsn, segment_size_bytes: u64, system_id: Option<u64>) -> Result<(), WalError> {
        if self.magic != XLOG_PAGE_MAGIC {
            return Err(WalError::InvalidPageMagic { lsn, magic: self.magic });
        }
        if self.info & !XLP_ALL_FLAGS != 0 {
            return Err(WalError::InvalidPageInfo { lsn, info: self.info });
        }
        match self.long {
            Some(long) => {
                if let Some(expected) = system_id {
                    if long.sysid != expected {
                        return Err(WalError::SystemIdMismatch { lsn, found: long.sysid, expected });
                    }
                }
                if u64::from(long.seg_size_bytes) != segment_size_bytes {
                    return Err(WalError::SegmentSizeMismatch { lsn, found: long.seg_size_bytes, expected: segment_size_bytes });
                }
                if long.xlog_blcksz_bytes as usize != XLOG_BLCKSZ {
                    return Err(WalError::PageSizeMismatch { lsn, found: long.xlog_blcksz_bytes });
                }
            }
            None if lsn.0.is_multiple_of(segment_size_bytes) => {
                return Err(WalError::MissingLongPageHeader { lsn });
            }
            None => {}
        }
        if self.pageaddr != lsn {
            return Err(WalError::UnexpectedPageAddr { lsn, pageaddr: self.pageaddr });
        }
        Ok(())
    }

    /// The header as it appears on the page, `size()` bytes, padding zeroed.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(SIZE_OF_XLOG_LONG_PHD);
        out.extend_from_slice(&self.magic.to_le_bytes());
        out.extend_from_slice(&self.info.to_le_bytes());
        out.extend_from_slice(&self.tli.0.to_le_bytes());
        out.extend_from_slice(&self.pageaddr.0.to_le_bytes());
        out.extend_from_slice(&self.rem_len.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        if let Some(long) = self.long.filter(|_| self.info & XLP_LONG_HEADER != 0) {
            out.extend_from_slice(&long.sysid.to_le_bytes());
            out.extend_from_slice(&long.seg_size_bytes.to_le_bytes());
            out.extend_from_slice(&long.xlog_blcksz_bytes.to_le_bytes());
        }
        out.resize(self.size(), 0);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEG: u64 = 16 * 1024 * 1024;

    #[test]
    fn round_trips_and_validates() {
        for addr in [Lsn(SEG), Lsn(SEG + 8192)] {
            let hdr = PageHeader::new(addr, TimeLineId(1), SEG, 42);
            let bytes = hdr.to_bytes();
            assert_eq!(bytes.len(), hdr.size());
            assert_eq!(PageHeader::parse(&bytes), Some(hdr));
            assert_eq!(PageHeader::parse(&bytes[..bytes.len() - 1]), None);
            hdr.validate(addr, SEG, Some(42)).unwrap();
        }
    }

    #[test]
    fn first_record_lsn_skips_the_continued_tail() {
        let page = Lsn(SEG + 8192);
        let short = PageHeader::new(page, TimeLineId(1), SEG, 42);
        assert_eq!(short.first_record_lsn(page), Some(Lsn(page.0 + 24)));
        let cont = |rem_len| PageHeader { info: short.info | XLP_FIRST_IS_CONTRECORD, rem_len, ..short };
        assert_eq!(cont(5).first_record_lsn(page), Some(Lsn(page.0 + 24 + 8)));
        assert_eq!(cont(8160).first_record_lsn(page), Some(Lsn(page.0 + 24 + 8160)));
        // The aligned tail reaches the end of the page, or the tail goes on past it.
        assert_eq!(cont(8161).first_record_lsn(page), None);
        assert_eq!(cont(8168).first_record_lsn(page), None);
        assert_eq!(cont(100_000).first_record_lsn(page), None);
        // A segment's first page has the long header.
        let long = PageHeader::new(Lsn(SEG), TimeLineId(1), SEG, 42);
        assert_eq!(long.first_record_lsn(Lsn(SEG)), Some(Lsn(SEG + 40)));
        let long_cont = PageHeader { info: long.info | XLP_FIRST_IS_CONTRECORD, rem_len: 13, ..long };
        assert_eq!(long_cont.first_record_lsn(Lsn(SEG)), Some(Lsn(SEG + 40 + 16)));
    }

    #[test]
    fn rejects_bad_headers() {
        let lsn = Lsn(SEG + 8192);
        let good = PageHeader::new(lsn, TimeLineId(1), SEG, 42);
        let bad_magic = PageHeader { magic: 0xD10D, ..good };
        assert_eq!(bad_magic.validate(lsn, SEG, Some(42)), Err(WalError::InvalidPageMagic { lsn, magic: 0xD10D }));
        let bad_info = PageHeader { info: 0x10, ..good };
        assert!(matches!(bad_info.validate(lsn, SEG, Some(42)), Err(WalError::InvalidPageInfo { .. })));
        let bad_addr = PageHeader { pageaddr: Lsn(8192), ..good };
        assert!(matches!(bad_addr.validate(lsn, SEG, Some(42)), Err(WalError::UnexpectedPageAddr { .. })));
        let short_at_segment_start = PageHeader { pageaddr: Lsn(SEG), ..good };
        assert!(matches!(short_at_segment_start.validate(Lsn(SEG), SEG, Some(42)), Err(WalError::MissingLongPageHeader { .. })));
        let long = PageHeader::new(Lsn(SEG), TimeLineId(1), SEG, 7);
        assert!(matches!(long.validate(Lsn(SEG), SEG, Some(42)), Err(WalError::SystemIdMismatch { .. })));
        let wrong_seg = PageHeader::new(Lsn(SEG), TimeLineId(1), SEG / 2, 42);
        assert!(matches!(wrong_seg.validate(Lsn(SEG), SEG, Some(42)), Err(WalError::SegmentSizeMismatch { .. })));
    }
}
