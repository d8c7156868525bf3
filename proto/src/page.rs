//! The PostgreSQL data page as fjord moves it around: its size, and the header fields that
//! the pageserver and the compute's storage manager read (`bufpage.h`'s `PageHeaderData`).
//!
//! This is the one home of the page size and of page header parsing: the page service and
//! the WAL redo protocol carry pages of [`PAGE_SIZE_BYTES`], the pageserver reads and sets
//! page LSNs when it rebuilds pages (and initializes the visibility-map pages it makes), and
//! the compute's storage manager reads the LSN, flags, `pd_lower` and `pd_special` to decide
//! which LSN to ask for and whether a page must be WAL-logged before it is evicted. fjord supports only PostgreSQL's default build (8 KiB pages,
//! little-endian), so the layout is fixed here rather than discovered.
//!
//! The accessors take whole pages; a shorter slice is a caller's bug and panics with the
//! length named, never reads out of bounds.

use crate::Lsn;

/// `BLCKSZ`: the size of a relation page, and of every page a pageserver serves.
pub const PAGE_SIZE_BYTES: usize = 8192;
/// `SizeOfPageHeaderData`: `pd_lsn` (8), `pd_checksum`, `pd_flags`, `pd_lower`, `pd_upper`,
/// `pd_special`, `pd_pagesize_version` (2 each), `pd_prune_xid` (4).
pub const PAGE_HEADER_BYTES: usize = 24;

/// `PG_PAGE_LAYOUT_VERSION`, the low byte of `pd_pagesize_version`.
const PAGE_LAYOUT_VERSION: u16 = 4;

const PD_FLAGS_OFFSET: usize = 10;
const PD_LOWER_OFFSET: usize = 12;
const PD_UPPER_OFFSET: usize = 14;
const PD_SPECIAL_OFFSET: usize = 16;
const PD_PAGESIZE_VERSION_OFFSET: usize = 18;

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

fn u16_at(page: &[u8], off: usize) -> u16 {
    check_len(page, off + 2);
    u16::from_le_bytes([page[off], page[off + 1]])
}

fn set_u16_at(page: &mut [u8], off: usize, v: u16) {
    check_len(page, off + 2);
    page[off..off + 2].copy_from_slice(&v.to_le_bytes());
}

/// `pd_flags`: `PD_HAS_FREE_LINES`, `PD_PAGE_FULL`, `PD_ALL_VISIBLE`.
pub fn page_flags(page: &[u8]) -> u16 {
    u16_at(page, PD_FLAGS_OFFSET)
}

/// `pd_lower`: the end of the line pointer array (`PageGetMaxOffsetNumber` counts from it).
pub fn page_lower(page: &[u8]) -> u16 {
    u16_at(page, PD_LOWER_OFFSET)
}

/// `pd_special`: where the access method's special space starts; [`PAGE_SIZE_BYTES`] on a
/// page that has none (a heap page).
pub fn page_special(page: &[u8]) -> u16 {
    u16_at(page, PD_SPECIAL_OFFSET)
}

/// `PageInit(page, BLCKSZ, special_bytes)`: zeroes the page and writes the header of an
/// empty page whose last `special_bytes` are special space. The page must be exactly
/// [`PAGE_SIZE_BYTES`] long, and `special_bytes` a multiple of 8 (`MAXALIGN`) that leaves
/// room for the header; anything else is a caller's bug and panics.
pub fn page_init(page: &mut [u8], special_bytes: usize) {
    assert_eq!(page.len(), PAGE_SIZE_BYTES, "PageInit needs a whole page");
    assert!(
        special_bytes.is_multiple_of(8) && special_bytes <= PAGE_SIZE_BYTES - PAGE_HEADER_BYTES,
        "invalid special space size {special_bytes}"
    );
    page.fill(0);
    let size = PAGE_SIZE_BYTES as u16;
    let special = (PAGE_SIZE_BYTES - special_bytes) as u16;
    set_u16_at(page, PD_LOWER_OFFSET, PAGE_HEADER_BYTES as u16);
    set_u16_at(page, PD_UPPER_OFFSET, special);
    set_u16_at(page, PD_SPECIAL_OFFSET, special);
    set_u16_at(page, PD_PAGESIZE_VERSION_OFFSET, size | PAGE_LAYOUT_VERSION);
}

/// `PageIsNew`: a page that was never initialized (`pd_upper` is 0), such as the all-zero
/// page an extension of a relation leaves. A slice too short for a header is no page.
pub fn page_is_new(page: &[u8]) -> bool {
    page.len() >= PAGE_HEADER_BYTES && u16_at(page, PD_UPPER_OFFSET) == 0
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
    fn page_init_writes_bufpage_h_header() {
        let mut page = vec![0xaau8; PAGE_SIZE_BYTES];
        page_init(&mut page, 0);
        assert!(!page_is_new(&page));
        assert_eq!(page_lsn(&page), Lsn::INVALID);
        assert_eq!(&page[..12], &[0; 12]);
        // pd_lower 24, pd_upper 8192, pd_special 8192, pd_pagesize_version 8192 | 4.
        assert_eq!(&page[12..20], &[24, 0, 0, 32, 0, 32, 4, 32]);
        assert!(page[20..].iter().all(|&b| b == 0));
        assert_eq!((page_flags(&page), page_lower(&page), page_special(&page)), (0, 24, 8192));

        page_init(&mut page, 16);
        assert_eq!((page_lower(&page), page_special(&page)), (24, 8176));
        assert_eq!(&page[14..16], &8176u16.to_le_bytes(), "pd_upper starts at the special space");
    }

    #[test]
    fn header_fields_are_read_little_endian_at_bufpage_h_offsets() {
        let mut page = vec![0u8; PAGE_SIZE_BYTES];
        page[10..12].copy_from_slice(&0x0004u16.to_le_bytes());
        page[12..14].copy_from_slice(&28u16.to_le_bytes());
        page[16..18].copy_from_slice(&8184u16.to_le_bytes());
        assert_eq!((page_flags(&page), page_lower(&page), page_special(&page)), (4, 28, 8184));
    }

    #[test]
    #[should_panic(expected = "needs 18 bytes")]
    fn a_short_slice_has_no_special_pointer() {
        page_special(&[0u8; 17]);
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
