//! `Lsn`: a position in the WAL stream, PostgreSQL's `XLogRecPtr`.
//!
//! An LSN is a byte offset into the infinite WAL of a timeline. PostgreSQL prints it as two
//! hexadecimal 32-bit halves, `16/B374D848`; `Lsn` parses and prints that form so that
//! what a user copies out of `pg_current_wal_lsn()` can be pasted into any fjord command.

use std::fmt;
use std::str::FromStr;

/// A WAL position. `Lsn::INVALID` (0) means "none", as `InvalidXLogRecPtr` does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

/// PostgreSQL's default WAL segment size; fjord requires it (initdb --wal-segsize is not
/// supported).
pub const WAL_SEGMENT_SIZE_BYTES: u64 = 16 * 1024 * 1024;
/// The size of a WAL page, `XLOG_BLCKSZ`.
pub const WAL_PAGE_SIZE_BYTES: u64 = 8192;
/// `SizeOfXLogLongPHD`: the header of the first page of a segment.
pub const WAL_LONG_PAGE_HEADER_BYTES: u64 = 40;
/// `SizeOfXLogShortPHD`: the header of every other page.
pub const WAL_SHORT_PAGE_HEADER_BYTES: u64 = 24;

impl Lsn {
    pub const INVALID: Lsn = Lsn(0);
    pub const MAX: Lsn = Lsn(u64::MAX);

    pub fn is_valid(self) -> bool {
        self != Lsn::INVALID
    }

    /// The number of the 16 MiB WAL segment that holds this position.
    pub fn segment_number(self) -> u64 {
        self.0 / WAL_SEGMENT_SIZE_BYTES
    }

    /// The offset of this position inside its WAL segment.
    pub fn segment_offset(self) -> u64 {
        self.0 % WAL_SEGMENT_SIZE_BYTES
    }

    /// The offset of this position inside its WAL page.
    pub fn page_offset(self) -> u64 {
        self.0 % WAL_PAGE_SIZE_BYTES
    }

    /// Where the next record starts after WAL that ends here (as PostgreSQL's `EndRecPtr`
    /// has it, MAXALIGNed): at a page boundary, after the page's header. A server starting
    /// at the end of WAL writes its first record (and puts its checkpoint) there.
    pub fn next_record_start(self) -> Lsn {
        match (self.segment_offset(), self.page_offset()) {
            (0, _) => Lsn(self.0 + WAL_LONG_PAGE_HEADER_BYTES),
            (_, 0) => Lsn(self.0 + WAL_SHORT_PAGE_HEADER_BYTES),
            _ => self,
        }
    }

    /// The inverse of `next_record_start`: the end of the WAL before a record that starts
    /// here (right after a page header, that page's boundary).
    pub fn previous_wal_end(self) -> Lsn {
        match (self.segment_offset(), self.page_offset()) {
            (WAL_LONG_PAGE_HEADER_BYTES, _) => Lsn(self.0 - WAL_LONG_PAGE_HEADER_BYTES),
            (o, WAL_SHORT_PAGE_HEADER_BYTES) if o >= WAL_PAGE_SIZE_BYTES => Lsn(self.0 - WAL_SHORT_PAGE_HEADER_BYTES),
            _ => self,
        }
    }

    /// Rounds up to the next multiple of 8, as PostgreSQL aligns records (`MAXALIGN`).
    pub fn align8(self) -> Lsn {
        Lsn((self.0 + 7) & !7)
    }

    pub fn checked_add(self, bytes: u64) -> Option<Lsn> {
        self.0.checked_add(bytes).map(Lsn)
    }

    pub fn checked_sub(self, other: Lsn) -> Option<u64> {
        self.0.checked_sub(other.0)
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xffff_ffff)
    }
}

/// Text that is not an LSN in PostgreSQL's `X/X` form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid LSN: {0:?} (expected two hexadecimal numbers such as 16/B374D848)")]
pub struct LsnParseError(pub String);

impl FromStr for Lsn {
    type Err = LsnParseError;

    fn from_str(s: &str) -> Result<Lsn, LsnParseError> {
        let err = || LsnParseError(s.to_string());
        let (hi, lo) = s.split_once('/').ok_or_else(err)?;
        let valid = |p: &str| !p.is_empty() && p.len() <= 8 && p.bytes().all(|b| b.is_ascii_hexdigit());
        if !valid(hi) || !valid(lo) {
            return Err(err());
        }
        let hi = u32::from_str_radix(hi, 16).map_err(|_| err())?;
        let lo = u32::from_str_radix(lo, 16).map_err(|_| err())?;
        Ok(Lsn((u64::from(hi) << 32) | u64::from(lo)))
    }
}

impl From<u64> for Lsn {
    fn from(v: u64) -> Lsn {
        Lsn(v)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_record_after_a_page_boundary_starts_after_the_page_header() {
        let seg = WAL_SEGMENT_SIZE_BYTES;
        for (end, start) in [
            (Lsn(seg * 3), Lsn(seg * 3 + 40)),
            (Lsn(seg * 3 + 8192 * 5), Lsn(seg * 3 + 8192 * 5 + 24)),
            (Lsn(seg * 3 + 8192 * 5 + 0x128), Lsn(seg * 3 + 8192 * 5 + 0x128)),
            (Lsn(seg * 3 + 0x30), Lsn(seg * 3 + 0x30)),
        ] {
            assert_eq!(end.next_record_start(), start, "{end}");
            assert_eq!(start.previous_wal_end(), end, "{start}");
        }
    }

    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_and_prints_postgres_form() {
        let lsn: Lsn = "16/B374D848".parse().unwrap();
        assert_eq!(lsn, Lsn(0x16_B374_D848));
        assert_eq!(lsn.to_string(), "16/B374D848");
        assert_eq!(Lsn(0).to_string(), "0/0");
        assert_eq!("0/0".parse::<Lsn>().unwrap(), Lsn::INVALID);
    }

    #[test]
    fn rejects_malformed_text() {
        for bad in ["", "/", "1/", "/1", "1", "g/1", "1/1/1", "123456789/0", " 1/1", "-1/1", "+1/1"] {
            assert!(bad.parse::<Lsn>().is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn segment_arithmetic() {
        let lsn = Lsn(3 * WAL_SEGMENT_SIZE_BYTES + 8200);
        assert_eq!(lsn.segment_number(), 3);
        assert_eq!(lsn.segment_offset(), 8200);
        assert_eq!(lsn.page_offset(), 8);
        assert_eq!(Lsn(9).align8(), Lsn(16));
        assert_eq!(Lsn(16).align8(), Lsn(16));
    }

    proptest! {
        #[test]
        fn display_round_trips(v in any::<u64>()) {
            let lsn = Lsn(v);
            prop_assert_eq!(lsn.to_string().parse::<Lsn>().unwrap(), lsn);
        }

        #[test]
        fn parse_never_panics(s in ".{0,24}") {
            let _ = s.parse::<Lsn>();
        }
    }
}
