//! The PostgreSQL page layouts the pageserver edits itself: the standard page header, SLRU
//! addressing, CLOG status bits, multixact offsets and members, and visibility-map bits.
//!
//! PostgreSQL has no per-page WAL redo for these changes (CLOG and multixact pages are not
//! relation blocks; visibility-map bits are cleared as a side effect of heap records), so
//! [`super::StoredRecord`]s carry them and this module applies them, following `clog.c`,
//! `multixact.c`, `visibilitymap.c` and `bufpage.h` of PostgreSQL 15. WAL record layouts
//! stay in `pgwal`; only page layouts are here.
//!
//! Invariant: every function checks that the change belongs on the page it is given (the
//! page number derived from the xid, multixact, offset or heap block must be the page's),
//! and returns an error rather than writing elsewhere.

use pgwal::parse::visibility_map_location;
use proto::page::PAGE_SIZE_BYTES;
use proto::BlockNumber;

/// Pages per SLRU segment file (`SLRU_PAGES_PER_SEGMENT`).
pub const SLRU_PAGES_PER_SEGMENT: u32 = 32;
/// Transactions per CLOG page: two bits each (`CLOG_XACTS_PER_PAGE`).
pub const CLOG_XACTS_PER_PAGE: u32 = PAGE_SIZE_BYTES as u32 * 4;
/// Multixacts per offsets page (`MULTIXACT_OFFSETS_PER_PAGE`).
pub const MULTIXACT_OFFSETS_PER_PAGE: u32 = PAGE_SIZE_BYTES as u32 / 4;
/// Members per member group: one flag byte and one xid each (`MULTIXACT_MEMBERS_PER_MEMBERGROUP`).
const MEMBERS_PER_GROUP: u32 = 4;
/// A member group: 4 flag bytes then 4 xids (`MULTIXACT_MEMBERGROUP_SIZE`).
const MEMBERGROUP_BYTES: u32 = 4 + MEMBERS_PER_GROUP * 4;
/// `MULTIXACT_MEMBERGROUPS_PER_PAGE`: 409; the last 12 bytes of a page are unused.
const MEMBERGROUPS_PER_PAGE: u32 = PAGE_SIZE_BYTES as u32 / MEMBERGROUP_BYTES;
/// Members per members page (`MULTIXACT_MEMBERS_PER_PAGE`): 1636.
pub const MULTIXACT_MEMBERS_PER_PAGE: u32 = MEMBERGROUPS_PER_PAGE * MEMBERS_PER_GROUP;

/// A transaction's CLOG status (`XidStatus`): two bits per transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum XidStatus {
    InProgress = 0,
    Committed = 1,
    Aborted = 2,
    SubCommitted = 3,
}

impl XidStatus {
    pub fn from_u8(v: u8) -> Option<XidStatus> {
        [XidStatus::InProgress, XidStatus::Committed, XidStatus::Aborted, XidStatus::SubCommitted].get(usize::from(v)).copied()
    }
}

/// A page of an SLRU: its segment and its block within the segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SlruPage {
    pub segno: u32,
    pub blkno: BlockNumber,
}

impl SlruPage {
    /// The page with SLRU page number `pageno` (what `clog.c` and `multixact.c` call pageno).
    pub fn from_pageno(pageno: u32) -> SlruPage {
        SlruPage { segno: pageno / SLRU_PAGES_PER_SEGMENT, blkno: BlockNumber(pageno % SLRU_PAGES_PER_SEGMENT) }
    }

    pub fn pageno(self) -> u32 {
        self.segno * SLRU_PAGES_PER_SEGMENT + self.blkno.0
    }
}

/// The CLOG page holding transaction `xid`'s status.
pub fn clog_page(xid: u32) -> SlruPage {
    SlruPage::from_pageno(xid / CLOG_XACTS_PER_PAGE)
}

/// The offsets page holding multixact `multi`'s starting offset.
pub fn multixact_offsets_page(multi: u32) -> SlruPage {
    SlruPage::from_pageno(multi / MULTIXACT_OFFSETS_PER_PAGE)
}

/// The members page holding the member at `offset`.
pub fn multixact_members_page(offset: u32) -> SlruPage {
    SlruPage::from_pageno(offset / MULTIXACT_MEMBERS_PER_PAGE)
}

fn check_page(page: &[u8]) -> Result<(), String> {
    if page.len() != PAGE_SIZE_BYTES {
        return Err(format!("page has {} bytes, expected {PAGE_SIZE_BYTES}", page.len()));
    }
    Ok(())
}

fn check_on(what: &str, target: SlruPage, here: SlruPage) -> Result<(), String> {
    if target != here {
        return Err(format!(
            "{what} belongs on segment {} page {}, not on segment {} page {}",
            target.segno, target.blkno, here.segno, here.blkno
        ));
    }
    Ok(())
}

/// Sets the status of `xid` on CLOG page `here` (`TransactionIdSetStatusBit`).
pub fn clog_set_status(page: &mut [u8], here: SlruPage, xid: u32, status: XidStatus) -> Result<(), String> {
    check_page(page)?;
    check_on(&format!("the status of xid {xid}"), clog_page(xid), here)?;
    let index = xid % CLOG_XACTS_PER_PAGE;
    let byte = (index / 4) as usize;
    let shift = (index % 4) * 2;
    page[byte] = (page[byte] & !(0b11 << shift)) | ((status as u8) << shift);
    Ok(())
}

/// The status of `xid` on a CLOG page (for tests and checks).
pub fn clog_get_status(page: &[u8], xid: u32) -> XidStatus {
    let index = xid % CLOG_XACTS_PER_PAGE;
    let bits = (page[(index / 4) as usize] >> ((index % 4) * 2)) & 0b11;
    XidStatus::from_u8(bits).expect("two bits are a status")
}

/// Writes multixact `multi`'s starting offset on offsets page `here`.
pub fn multixact_set_offset(page: &mut [u8], here: SlruPage, multi: u32, offset: u32) -> Result<(), String> {
    check_page(page)?;
    check_on(&format!("the offset of multixact {multi}"), multixact_offsets_page(multi), here)?;
    let at = ((multi % MULTIXACT_OFFSETS_PER_PAGE) * 4) as usize;
    page[at..at + 4].copy_from_slice(&offset.to_le_bytes());
    Ok(())
}

/// Writes the member at `offset` (its xid and its 8-bit status) on members page `here`, as
/// `RecordNewMultiXact` does.
pub fn multixact_set_member(page: &mut [u8], here: SlruPage, offset: u32, xid: u32, status: u8) -> Result<(), String> {
    check_page(page)?;
    check_on(&format!("multixact member {offset}"), multixact_members_page(offset), here)?;
    let flags_at = (((offset / MEMBERS_PER_GROUP) % MEMBERGROUPS_PER_PAGE) * MEMBERGROUP_BYTES) as usize;
    let shift = (offset % MEMBERS_PER_GROUP) * 8;
    let member_at = flags_at + 4 + ((offset % MEMBERS_PER_GROUP) * 4) as usize;
    page[member_at..member_at + 4].copy_from_slice(&xid.to_le_bytes());
    let mut flags = u32::from_le_bytes(page[flags_at..flags_at + 4].try_into().expect("4 bytes"));
    flags &= !(0xff << shift);
    flags |= u32::from(status) << shift;
    page[flags_at..flags_at + 4].copy_from_slice(&flags.to_le_bytes());
    Ok(())
}

/// Clears `bits` of heap block `heap_blkno` on visibility-map page `vm_blkno`
/// (`visibilitymap_clear`, which leaves the page LSN alone).
pub fn vm_clear_bits(page: &mut [u8], vm_blkno: BlockNumber, heap_blkno: BlockNumber, bits: u8) -> Result<(), String> {
    check_page(page)?;
    let loc = visibility_map_location(heap_blkno);
    if loc.vm_blkno != vm_blkno {
        return Err(format!("the bits of heap block {heap_blkno} are on visibility map page {}, not {vm_blkno}", loc.vm_blkno));
    }
    page[loc.page_byte] &= !(bits << loc.shift);
    Ok(())
}

/// Clears the bits of every heap block at or after `heap_blocks` on the visibility-map page
/// that holds that block's bits: what `visibilitymap_prepare_truncate` does to the last
/// remaining map page when the heap is truncated to `heap_blocks` blocks.
pub fn vm_truncate_tail(page: &mut [u8], vm_blkno: BlockNumber, heap_blocks: BlockNumber) -> Result<(), String> {
    check_page(page)?;
    let loc = visibility_map_location(heap_blocks);
    if loc.vm_blkno != vm_blkno {
        return Err(format!("heap length {heap_blocks} ends on visibility map page {}, not {vm_blkno}", loc.vm_blkno));
    }
    page[loc.page_byte + 1..].fill(0);
    page[loc.page_byte] &= (1u8 << loc.shift) - 1;
    Ok(())
}

/// `PageInit(page, BLCKSZ, 0)`: an empty page with no special space, as `vm_readbuf` makes
/// of a new visibility-map page.
pub fn page_init() -> Vec<u8> {
    let mut page = vec![0u8; PAGE_SIZE_BYTES];
    proto::page::page_init(&mut page, 0);
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zero() -> Vec<u8> {
        vec![0u8; PAGE_SIZE_BYTES]
    }

    #[test]
    fn clog_bits_match_hand_computed_bytes() {
        let here = clog_page(3);
        assert_eq!(here, SlruPage { segno: 0, blkno: BlockNumber(0) });
        let mut page = zero();
        // xid 3: byte 0, bits 6..8; xid 4: byte 1, bits 0..2; xid 7: byte 1, bits 6..8.
        clog_set_status(&mut page, here, 3, XidStatus::Committed).unwrap();
        clog_set_status(&mut page, here, 4, XidStatus::Aborted).unwrap();
        clog_set_status(&mut page, here, 7, XidStatus::SubCommitted).unwrap();
        assert_eq!(&page[..3], &[0b0100_0000, 0b1100_0010, 0]);
        clog_set_status(&mut page, here, 7, XidStatus::Committed).unwrap();
        assert_eq!(page[1], 0b0100_0010);
        assert_eq!(clog_get_status(&page, 4), XidStatus::Aborted);
        assert!(page[3..].iter().all(|&b| b == 0));

        // xid 32768 * 33 + 5 is on page 33: segment 1, block 1, byte 1, bits 2..4.
        let xid = 32768 * 33 + 5;
        assert_eq!(clog_page(xid), SlruPage { segno: 1, blkno: BlockNumber(1) });
        let mut page = zero();
        clog_set_status(&mut page, clog_page(xid), xid, XidStatus::Committed).unwrap();
        assert_eq!(&page[..2], &[0, 0b0000_0100]);
        let err = clog_set_status(&mut page, here, xid, XidStatus::Committed).unwrap_err();
        assert_eq!(err, "the status of xid 1081349 belongs on segment 1 page 1, not on segment 0 page 0");
    }

    #[test]
    fn multixact_offsets_and_members_match_hand_computed_bytes() {
        let mut page = zero();
        multixact_set_offset(&mut page, multixact_offsets_page(2049), 2049, 0x0102_0304).unwrap();
        assert_eq!(&page[4..8], &[4, 3, 2, 1]);
        assert!(multixact_set_offset(&mut page, multixact_offsets_page(0), 2049, 1).is_err());

        // Member 5: group 1 (bytes 20..40), flag byte 21, xid at 20 + 4 + 4 = 28.
        let mut page = zero();
        multixact_set_member(&mut page, multixact_members_page(5), 5, 0xAABB_CCDD, 3).unwrap();
        assert_eq!(&page[20..24], &[0, 3, 0, 0]);
        assert_eq!(&page[28..32], &[0xDD, 0xCC, 0xBB, 0xAA]);
        multixact_set_member(&mut page, multixact_members_page(5), 5, 7, 1).unwrap();
        assert_eq!(&page[20..24], &[0, 1, 0, 0]);
        // Member 1636 is the first of the next page.
        assert_eq!(multixact_members_page(1635).blkno, BlockNumber(0));
        assert_eq!(multixact_members_page(1636).blkno, BlockNumber(1));
        let mut page = zero();
        multixact_set_member(&mut page, multixact_members_page(1636 + 1635), 1636 + 1635, 9, 5).unwrap();
        // Group 408 starts at 8160; member 3 of it: flag byte 8163, xid at 8160 + 4 + 12.
        assert_eq!(page[8163], 5);
        assert_eq!(&page[8176..8180], &[9, 0, 0, 0]);
    }

    #[test]
    fn vm_clear_and_truncate_match_hand_computed_bytes() {
        let mut page = zero();
        page[24..].fill(0xff);
        // Heap block 5: byte 24 + 1, bits 2..4.
        vm_clear_bits(&mut page, BlockNumber(0), BlockNumber(5), 0b11).unwrap();
        assert_eq!(page[25], 0b1111_0011);
        // Only all-frozen (bit 1) of heap block 6: byte 25, bit 5.
        vm_clear_bits(&mut page, BlockNumber(0), BlockNumber(6), 0b10).unwrap();
        assert_eq!(page[25], 0b1101_0011);
        assert!(vm_clear_bits(&mut page, BlockNumber(1), BlockNumber(5), 3).is_err());

        // Truncating the heap to 6 blocks keeps blocks 4 and 5 of byte 25 (bits 0..4).
        vm_truncate_tail(&mut page, BlockNumber(0), BlockNumber(6)).unwrap();
        assert_eq!(page[24], 0xff);
        assert_eq!(page[25], 0b0000_0011);
        assert!(page[26..].iter().all(|&b| b == 0));
        assert!(page[..24].iter().all(|&b| b == 0), "the header is untouched");
    }

    #[test]
    fn page_init_makes_an_empty_initialized_page() {
        use proto::page::{page_is_new, page_lsn, page_set_lsn};
        let mut page = page_init();
        assert!(!page_is_new(&page));
        assert!(page_is_new(&zero()));
        page_set_lsn(&mut page, proto::Lsn(0x1_0000_0002));
        assert_eq!(&page[..8], &[1, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!(page_lsn(&page), proto::Lsn(0x1_0000_0002));
        assert_eq!(&page[12..20], &[24, 0, 0, 32, 0, 32, 4, 32]);
    }
}
