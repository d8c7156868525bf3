//! The PostgreSQL data page as fjord moves it around: its size, and the header fields that
//! the pageserver and the compute's storage manager read (`bufpage.h`'s `PageHeaderData`).
//!
//! This is the one home of the page size and of page header parsing: the page service and
//! the WAL redo protocol carry pages of [`PAGE_SIZE_BYTES`], the pageserver reads and sets
//! page LSNs when it rebuilds pages, and the compute's storage manager reads them to decide
//! which LSN to ask for. fjord supports only PostgreSQL's default build (8 KiB pages,
//! little-endian), so the layout is fixed here rather than discovered.
//!
//! The LSN accessors take whole pages; a shorter slice is a caller's bug and panics with the
//! length named, never reads out of bounds.

use crate::Lsn;

/// `BLCKSZ`: the size of a relation page, and of every page a pageserver serves.
pub const PAGE_SIZE_BYTES: usize = 8192;
/// `SizeOfPageHeaderData`: `pd_lsn` (8), `pd_checksum`, `pd_flags`, `pd_lower`, `pd_upper`,
/// `pd_special`, `pd_pagesize_version` (2 each), `pd_prune_xid` (4).
pub const PAGE_HEADER_BYTES: usize = 24;

const PD_UPPER_OFFSET: usize = 14;

fn check_len(page: &[u8], need: usize) {
    assert!(page.len() >= need, "a page header needs {need} bytes, got a slice of {}", page.len());
}

/// `PageGetLSN`: the LSN of the last WAL record that changed the page.
pub fn page_lsn(page: &[u8]) -> Lsn {
    check_len(page, 8);
    let hi = u32::from_le_bytes([page[0], page[1], page[2], page[3]]);
    let lo = u32::from_le_bytes([page[4], page[5], page[6], page[7]]);
    Lsn((u64::from(hi) << 32) | u64::from(lo))
}

/// `PageSetLSN`.
pub fn page_set_lsn(page: &mut [u8], lsn: Lsn) {
    check_len(page, 8);
    page[0..4].copy_from_slice(&((lsn.0 >> 32) as u32).to_le_bytes());
    page[4..8].copy_from_slice(&(lsn.0 as u32).to_le_bytes());
}

/// `PageIsNew`: a page that was never initialized (`pd_upper` is 0), such as the all-zero
/// page an extension of a relation leaves. A slice too short for a header is no page.
pub fn page_is_new(page: &[u8]) -> bool {
    page.len() >= PAGE_HEADER_BYTES && u16::from_le_bytes([page[PD_UPPER_OFFSET], page[PD_UPPER_OFFSET + 1]]) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lsn_round_trips_in_postgres_layout() {
        let mut page = vec![0u8; PAGE_SIZE_BYTES];
        assert!(page_is_new(&page));
        page_set_lsn(&mut page, Lsn(0x0000_0001_0203_0405));
        // xlogid (high half) first, then xrecoff, each little-endian.
        assert_eq!(&page[0..8], &[1, 0, 0, 0, 5, 4, 3, 2]);
        assert_eq!(page_lsn(&page), Lsn(0x0000_0001_0203_0405));
        page[PD_UPPER_OFFSET] = 0x20;
        assert!(!page_is_new(&page));
    }

    #[test]
    #[should_panic(expected = "needs 8 bytes")]
    fn a_short_slice_is_a_bug_not_a_read_past_the_end() {
        page_lsn(&[0u8; 7]);
    }

    #[test]
    fn a_slice_shorter_than_a_header_is_not_a_new_page() {
        assert!(!page_is_new(&[0u8; 10]));
    }
}
