//! Heap and heap2 records, for the one effect that is not in their block references: the
//! visibility map.
//!
//! When an insert, update, delete, multi-insert or lock touches a heap page marked
//! all-visible (or all-frozen), redo clears the page's bits in the visibility map, but the
//! map page is not registered in the record. Storage must apply that change to the map page
//! itself, so this module reports which heap block lost which bits (`heap_xlog_insert`,
//! `heap_xlog_update`, ... in `heapam.c`). `XLOG_HEAP2_VISIBLE` sets bits; it does register
//! the map page (block 0), and is reported so the caller sees both directions. Everything
//! else in these records (tuples, offsets) is left to redo.

use proto::{BlockNumber, ForkNumber, RelTag};

use super::{MainData, MetadataRecord};
use crate::consts::*;
use crate::record::DecodedRecord;
use crate::WalError;

/// Visibility-map bits of one heap block cleared by a heap record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VmBitsCleared {
    /// The heap relation's main fork.
    pub rel: RelTag,
    pub heap_blkno: BlockNumber,
    /// `VISIBILITYMAP_*` bits cleared: both (`VALID_BITS`) for data changes, only
    /// `ALL_FROZEN` for a tuple lock.
    pub bits: u8,
}

/// `XLOG_HEAP2_VISIBLE`: bits set for one heap block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VmBitsSet {
    pub rel: RelTag,
    pub heap_blkno: BlockNumber,
    /// `VISIBILITYMAP_*` bits set.
    pub bits: u8,
}

/// Where a heap block's two bits are in the visibility map fork.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VmLocation {
    /// The map page (`HEAPBLK_TO_MAPBLOCK`).
    pub vm_blkno: BlockNumber,
    /// The byte within the page, past its header (`MAXALIGN(SizeOfPageHeaderData)` plus
    /// `HEAPBLK_TO_MAPBYTE`).
    pub page_byte: usize,
    /// The bit offset within that byte (`HEAPBLK_TO_OFFSET`).
    pub shift: u8,
}

/// Where the visibility-map bits of heap block `heap_blkno` live.
pub fn visibility_map_location(heap_blkno: BlockNumber) -> VmLocation {
    let blk = heap_blkno.0;
    let vm_blkno = BlockNumber(blk / VM_HEAPBLOCKS_PER_PAGE);
    let map_byte = ((blk % VM_HEAPBLOCKS_PER_PAGE) / VM_HEAPBLOCKS_PER_BYTE) as usize;
    let shift = ((blk % VM_HEAPBLOCKS_PER_BYTE) * 2) as u8;
    VmLocation { vm_blkno, page_byte: BLCKSZ - VM_MAPSIZE + map_byte, shift }
}

impl VmBitsCleared {
    pub fn location(&self) -> VmLocation {
        visibility_map_location(self.heap_blkno)
    }
}

/// The heap block a record references as `block_id`, which the record type requires.
fn heap_block(record: &DecodedRecord, block_id: u8, what: &'static str) -> Result<(RelTag, BlockNumber), WalError> {
    let block = record.block(block_id).ok_or_else(|| WalError::InvalidRmgrData {
        lsn: record.lsn,
        record: what,
        reason: format!("missing block reference {block_id}"),
    })?;
    if block.rel.forknum != ForkNumber::Main {
        return Err(WalError::InvalidRmgrData {
            lsn: record.lsn,
            record: what,
            reason: format!("block reference {block_id} is in fork {:?}, not the heap's main fork", block.rel.forknum),
        });
    }
    Ok((block.rel, block.blkno))
}

/// Builds the result for the blocks whose bits are cleared, dropping a repeated block.
fn cleared(list: &[(RelTag, BlockNumber, u8)]) -> Option<MetadataRecord> {
    let mut out: Vec<VmBitsCleared> = Vec::with_capacity(list.len());
    for &(rel, heap_blkno, bits) in list {
        match out.iter_mut().find(|c| c.rel == rel && c.heap_blkno == heap_blkno) {
            Some(existing) => existing.bits |= bits,
            None => out.push(VmBitsCleared { rel, heap_blkno, bits }),
        }
    }
    (!out.is_empty()).then_some(MetadataRecord::VmBitsCleared(out))
}

/// Reads the flags byte at `flags_offset` of a struct at least `size` bytes long.
fn flags(record: &DecodedRecord, what: &'static str, size: usize, flags_offset: usize) -> Result<u8, WalError> {
    let mut d = MainData::new(record, what, size, false)?;
    d.bytes(flags_offset)?;
    d.u8()
}

pub(super) fn parse_heap(record: &DecodedRecord, info: u8) -> Result<Option<MetadataRecord>, WalError> {
    match info & XLOG_HEAP_OPMASK {
        XLOG_HEAP_INSERT => {
            let what = "heap insert";
            if flags(record, what, SIZE_OF_HEAP_INSERT, 2)? & XLH_INSERT_ALL_VISIBLE_CLEARED == 0 {
                return Ok(None);
            }
            let (rel, blk) = heap_block(record, 0, what)?;
            Ok(cleared(&[(rel, blk, VISIBILITYMAP_VALID_BITS)]))
        }
        XLOG_HEAP_DELETE => {
            let what = "heap delete";
            if flags(record, what, SIZE_OF_HEAP_DELETE, 7)? & XLH_DELETE_ALL_VISIBLE_CLEARED == 0 {
                return Ok(None);
            }
            let (rel, blk) = heap_block(record, 0, what)?;
            Ok(cleared(&[(rel, blk, VISIBILITYMAP_VALID_BITS)]))
        }
        XLOG_HEAP_UPDATE | XLOG_HEAP_HOT_UPDATE => {
            let what = "heap update";
            let f = flags(record, what, SIZE_OF_HEAP_UPDATE, 7)?;
            let mask = XLH_UPDATE_OLD_ALL_VISIBLE_CLEARED | XLH_UPDATE_NEW_ALL_VISIBLE_CLEARED;
            if f & mask == 0 {
                return Ok(None);
            }
            // Block 0 is the new tuple's page; block 1 the old one's, when it differs.
            let new = heap_block(record, 0, what)?;
            let old = if record.block(1).is_some() { heap_block(record, 1, what)? } else { new };
            let mut list = Vec::new();
            if f & XLH_UPDATE_OLD_ALL_VISIBLE_CLEARED != 0 {
                list.push((old.0, old.1, VISIBILITYMAP_VALID_BITS));
            }
            if f & XLH_UPDATE_NEW_ALL_VISIBLE_CLEARED != 0 {
                list.push((new.0, new.1, VISIBILITYMAP_VALID_BITS));
            }
            Ok(cleared(&list))
        }
        XLOG_HEAP_LOCK => {
            let what = "heap lock";
            if flags(record, what, SIZE_OF_HEAP_LOCK, 7)? & XLH_LOCK_ALL_FROZEN_CLEARED == 0 {
                return Ok(None);
            }
            let (rel, blk) = heap_block(record, 0, what)?;
            Ok(cleared(&[(rel, blk, VISIBILITYMAP_ALL_FROZEN)]))
        }
        _ => Ok(None),
    }
}

pub(super) fn parse_heap2(record: &DecodedRecord, info: u8) -> Result<Option<MetadataRecord>, WalError> {
    match info & XLOG_HEAP_OPMASK {
        XLOG_HEAP2_MULTI_INSERT => {
            let what = "heap multi-insert";
            if flags(record, what, SIZE_OF_HEAP_MULTI_INSERT, 0)? & XLH_INSERT_ALL_VISIBLE_CLEARED == 0 {
                return Ok(None);
            }
            let (rel, blk) = heap_block(record, 0, what)?;
            Ok(cleared(&[(rel, blk, VISIBILITYMAP_VALID_BITS)]))
        }
        XLOG_HEAP2_LOCK_UPDATED => {
            let what = "heap lock updated";
            if flags(record, what, SIZE_OF_HEAP_LOCK_UPDATED, 7)? & XLH_LOCK_ALL_FROZEN_CLEARED == 0 {
                return Ok(None);
            }
            let (rel, blk) = heap_block(record, 0, what)?;
            Ok(cleared(&[(rel, blk, VISIBILITYMAP_ALL_FROZEN)]))
        }
        XLOG_HEAP2_VISIBLE => {
            let what = "heap visible";
            let bits = flags(record, what, SIZE_OF_HEAP_VISIBLE, 4)?;
            // Block 0 is the map page, block 1 the heap page whose bits are set.
            let (rel, heap_blkno) = heap_block(record, 1, what)?;
            Ok(Some(MetadataRecord::VmBitsSet(VmBitsSet { rel, heap_blkno, bits })))
        }
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visibility_map_location_matches_visibilitymap_c() {
        assert_eq!(visibility_map_location(BlockNumber(0)), VmLocation { vm_blkno: BlockNumber(0), page_byte: 24, shift: 0 });
        assert_eq!(visibility_map_location(BlockNumber(5)), VmLocation { vm_blkno: BlockNumber(0), page_byte: 25, shift: 2 });
        let last = visibility_map_location(BlockNumber(32671));
        assert_eq!(last, VmLocation { vm_blkno: BlockNumber(0), page_byte: 8191, shift: 6 });
        assert_eq!(visibility_map_location(BlockNumber(32672)).vm_blkno, BlockNumber(1));
    }
}
