//! The saved index of a compute's local file cache: what lets the cache survive a restart
//! of its endpoint.
//!
//! The extension (`extension/src/file_cache.rs`) writes `<cache file>.index` when its
//! server shuts down cleanly; `compute_ctl` reads it before the next start, drops every
//! entry that may be stale and writes what is left as `<cache file>.ready`, which the
//! extension loads at start and deletes. Both files have this format.
//!
//! Layout (integers little-endian): the magic `FJLFCIX2` (8 bytes), tenant id (16),
//! timeline id (16), the cache file's size in pages (`u64`), the durable LSN (`u64`), the
//! valid-as-of LSN (`u64`), the entry count (`u64`), then the entries of 36 bytes each (spcnode, dbnode, relnode `u32`,
//! fork `u8`, 3 zero bytes, block number `u32`, slot `u32`, the page's CRC-32C `u32`,
//! dependency LSN `u64`), then a CRC-32C of everything before it (`u32`). The page CRC is
//! checked when a reused page is first read, so a damaged cache file is never served. Version 1
//! (`FJLFCIX1`, written before the valid-as-of LSN existed) has no such field and is read
//! with it unknown (0).
//!
//! **Why a reused page is never stale** (the argument `compute_ctl` implements):
//! - An entry's page is the newest version this compute had of the block when it was
//!   stored, and its dependency LSN `D` was the WAL insert position then: the content
//!   (hint bits included, which reflect commit records already written) depends on no WAL
//!   past `D`.
//! - The durable LSN is the commit LSN of the WAL proposer at shutdown: WAL up to it was on
//!   a majority of safekeepers, so every later history of the timeline contains exactly
//!   this WAL up to there. An entry with `D` above it may reflect WAL that a later history
//!   does not have (a transaction whose commit never reached a majority, its xid reused
//!   later): it is dropped.
//! - An entry with `D` at or below the durable LSN equals the block's version at `D` in the
//!   history the next compute starts from (at `S`, the end of WAL the safekeepers elect,
//!   never below the durable LSN). It is kept only if the pageserver says the block did not
//!   change in `(D, S]`: no record for it, its fork was not truncated below it, dropped or
//!   created, its database not dropped.
//! - The valid-as-of LSN `V` narrows that question, but only up to the durable LSN. A
//!   primary writes its index after its shutdown checkpoint, and `V` is that checkpoint's
//!   LSN: every change this compute made to a page is before it. Every page this compute
//!   wrote or read from the pageserver was stored in the cache as the newest version it had
//!   (a write always replaces the entry; a truncation or a drop removes entries), and the
//!   shutdown checkpoint wrote every dirty buffer; this compute was its history's only
//!   writer. So each entry is also the block's version at `V` in this compute's history: no
//!   change in `(D, V]` there. The history the next compute starts from holds this
//!   compute's WAL up to the durable LSN `L` and may differ from it anywhere past `L`: `V`
//!   can be far above `L` (the sync before the stop timed out, or a fenced compute shut
//!   down: its WAL past `L` never reached a majority), and the branch can have gone on
//!   from `L` with another compute's commits, at LSNs below `V` and past it. So an entry
//!   is its block's version in the next history as of `min(V, L)`, no later: the question
//!   is `(max(D, min(V, L)), S]`. Nothing is asked only when that range is empty, which
//!   needs `S` = `L` (a clean stop whose last WAL a majority acknowledged); a start past
//!   `L` asks what changed after `L`, a few records after such a stop. A start below `V`
//!   says nothing about which history it is in: its `S` is never compared with `V`.
//!   Without `V` (0: a version 1 index) the question starts at the oldest kept `D`, which
//!   for a long-lived cache is the timeline's first LSN: a scan of all its WAL at every
//!   start.
//! - A saved index is only written after a clean shutdown (`pg_control` says shut down) and
//!   after the cache file was synced to disk; a crash leaves none, the extension deletes
//!   both files when it starts, and any mismatch (tenant, timeline, size, a bad checksum, a
//!   duplicate slot or block) discards the whole cache.

use crate::{Lsn, TenantId, TimelineId};

pub const MAGIC: [u8; 8] = *b"FJLFCIX2";
/// Version 1, read (with `valid_lsn` unknown) but no longer written.
pub const MAGIC_V1: [u8; 8] = *b"FJLFCIX1";
const HEADER_BYTES: usize = 8 + 16 + 16 + 8 + 8 + 8 + 8;
const HEADER_BYTES_V1: usize = HEADER_BYTES - 8;
pub const ENTRY_BYTES: usize = 36;

/// One cached page: which block, in which slot of the cache file, and the LSN its content
/// depends on at most.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SavedEntry {
    pub spcnode: u32,
    pub dbnode: u32,
    pub relnode: u32,
    pub forknum: u8,
    pub blkno: u32,
    pub slot: u32,
    /// CRC-32C of the 8 KiB page in the slot.
    pub page_crc: u32,
    pub dep_lsn: Lsn,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedIndex {
    pub tenant: TenantId,
    pub timeline: TimelineId,
    /// The cache file's size in 8 KiB pages; every slot is below it.
    pub slots: u64,
    /// WAL up to here was on a majority of safekeepers when the compute stopped.
    pub durable_lsn: Lsn,
    /// Every entry is its block's version as of this LSN too (the shutdown checkpoint's) in
    /// this compute's history, which the next history is known to share only up to
    /// `durable_lsn`; 0 when unknown. See the module doc.
    pub valid_lsn: Lsn,
    pub entries: Vec<SavedEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SavedIndexError {
    #[error("not a saved file cache index (bad magic)")]
    BadMagic,
    #[error("truncated: {0} bytes")]
    Truncated(usize),
    #[error("{len} bytes, but {count} entries need {expected}")]
    WrongLength { len: usize, count: u64, expected: u128 },
    #[error("checksum mismatch (stored {stored:08x}, computed {computed:08x})")]
    Checksum { stored: u32, computed: u32 },
    #[error("entry {index}: fork number {forknum} is not a fork")]
    BadFork { index: usize, forknum: u8 },
    #[error("entry {index}: slot {slot} is outside the cache's {slots} pages")]
    SlotOutOfRange { index: usize, slot: u32, slots: u64 },
    #[error("entry {index}: slot {slot} is used twice")]
    DuplicateSlot { index: usize, slot: u32 },
    #[error("entry {index}: block {blkno} of {spcnode}/{dbnode}/{relnode} fork {forknum} is cached twice")]
    DuplicateBlock { index: usize, spcnode: u32, dbnode: u32, relnode: u32, forknum: u8, blkno: u32 },
    #[error("entry {index}: padding bytes are not zero")]
    Padding { index: usize },
}

impl SavedIndex {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES + self.entries.len() * ENTRY_BYTES + 4);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(self.tenant.as_bytes());
        out.extend_from_slice(self.timeline.as_bytes());
        out.extend_from_slice(&self.slots.to_le_bytes());
        out.extend_from_slice(&self.durable_lsn.0.to_le_bytes());
        out.extend_from_slice(&self.valid_lsn.0.to_le_bytes());
        out.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        for e in &self.entries {
            out.extend_from_slice(&e.spcnode.to_le_bytes());
            out.extend_from_slice(&e.dbnode.to_le_bytes());
            out.extend_from_slice(&e.relnode.to_le_bytes());
            out.extend_from_slice(&[e.forknum, 0, 0, 0]);
            out.extend_from_slice(&e.blkno.to_le_bytes());
            out.extend_from_slice(&e.slot.to_le_bytes());
            out.extend_from_slice(&e.page_crc.to_le_bytes());
            out.extend_from_slice(&e.dep_lsn.0.to_le_bytes());
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes and validates a saved index: any inconsistency is an error, never a guess.
    pub fn decode(bytes: &[u8]) -> Result<SavedIndex, SavedIndexError> {
        let header_bytes = match bytes.get(..8) {
            Some(m) if m == MAGIC => HEADER_BYTES,
            Some(m) if m == MAGIC_V1 => HEADER_BYTES_V1,
            Some(_) => return Err(SavedIndexError::BadMagic),
            None => return Err(SavedIndexError::Truncated(bytes.len())),
        };
        if bytes.len() < header_bytes + 4 {
            return Err(SavedIndexError::Truncated(bytes.len()));
        }
        let u64_at = |off: usize| u64::from_le_bytes(bytes[off..off + 8].try_into().expect("8 bytes"));
        let u32_at = |off: usize| u32::from_le_bytes(bytes[off..off + 4].try_into().expect("4 bytes"));
        let valid_lsn = if header_bytes == HEADER_BYTES { Lsn(u64_at(56)) } else { Lsn::INVALID };
        let count = u64_at(header_bytes - 8);
        let expected = header_bytes as u128 + u128::from(count) * ENTRY_BYTES as u128 + 4;
        if bytes.len() as u128 != expected {
            return Err(SavedIndexError::WrongLength { len: bytes.len(), count, expected });
        }
        let body = bytes.len() - 4;
        let (stored, computed) = (u32_at(body), crc32c::crc32c(&bytes[..body]));
        if stored != computed {
            return Err(SavedIndexError::Checksum { stored, computed });
        }
        let slots = u64_at(40);
        let mut entries = Vec::with_capacity(count as usize);
        for index in 0..count as usize {
            let off = header_bytes + index * ENTRY_BYTES;
            let forknum = bytes[off + 12];
            if bytes[off + 13..off + 16] != [0, 0, 0] {
                return Err(SavedIndexError::Padding { index });
            }
            if forknum > 3 {
                return Err(SavedIndexError::BadFork { index, forknum });
            }
            let slot = u32_at(off + 20);
            if u64::from(slot) >= slots {
                return Err(SavedIndexError::SlotOutOfRange { index, slot, slots });
            }
            entries.push(SavedEntry {
                spcnode: u32_at(off),
                dbnode: u32_at(off + 4),
                relnode: u32_at(off + 8),
                forknum,
                blkno: u32_at(off + 16),
                slot,
                page_crc: u32_at(off + 24),
                dep_lsn: Lsn(u64_at(off + 28)),
            });
        }
        check_unique(&entries)?;
        let id = |off: usize| <[u8; 16]>::try_from(&bytes[off..off + 16]).expect("16 bytes");
        Ok(SavedIndex {
            tenant: TenantId::from_bytes(id(8)),
            timeline: TimelineId::from_bytes(id(24)),
            slots,
            durable_lsn: Lsn(u64_at(48)),
            valid_lsn,
            entries,
        })
    }
}

/// spcnode, dbnode, relnode, fork, block.
type BlockKey = (u32, u32, u32, u8, u32);

/// No slot holds two blocks and no block is in two slots: either would serve a wrong page.
fn check_unique(entries: &[SavedEntry]) -> Result<(), SavedIndexError> {
    let mut by_slot: Vec<(u32, usize)> = entries.iter().enumerate().map(|(i, e)| (e.slot, i)).collect();
    by_slot.sort_unstable();
    if let Some(w) = by_slot.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(SavedIndexError::DuplicateSlot { index: w[1].1, slot: w[1].0 });
    }
    let mut by_block: Vec<(BlockKey, usize)> =
        entries.iter().enumerate().map(|(i, e)| ((e.spcnode, e.dbnode, e.relnode, e.forknum, e.blkno), i)).collect();
    by_block.sort_unstable();
    if let Some(w) = by_block.windows(2).find(|w| w[0].0 == w[1].0) {
        let (spcnode, dbnode, relnode, forknum, blkno) = w[1].0;
        return Err(SavedIndexError::DuplicateBlock { index: w[1].1, spcnode, dbnode, relnode, forknum, blkno });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> SavedIndex {
        SavedIndex {
            tenant: TenantId::from_bytes([1; 16]),
            timeline: TimelineId::from_bytes([2; 16]),
            slots: 100,
            durable_lsn: Lsn(0x016B_3748),
            valid_lsn: Lsn(0x016B_3800),
            entries: vec![
                SavedEntry { spcnode: 1663, dbnode: 5, relnode: 16384, forknum: 0, blkno: 7, slot: 3, page_crc: 7, dep_lsn: Lsn(0x100) },
                SavedEntry { spcnode: 1663, dbnode: 5, relnode: 16384, forknum: 2, blkno: 0, slot: 99, page_crc: 8, dep_lsn: Lsn(0x200) },
            ],
        }
    }

    #[test]
    fn round_trip() {
        let s = sample();
        assert_eq!(SavedIndex::decode(&s.encode()).unwrap(), s);
        let empty = SavedIndex { entries: vec![], ..s };
        assert_eq!(SavedIndex::decode(&empty.encode()).unwrap(), empty);
    }

    #[test]
    fn version_1_is_read_with_the_valid_lsn_unknown() {
        let s = sample();
        let v2 = s.encode();
        let mut v1 = Vec::new();
        v1.extend_from_slice(&MAGIC_V1);
        v1.extend_from_slice(&v2[8..56]);
        v1.extend_from_slice(&v2[64..v2.len() - 4]);
        let crc = crc32c::crc32c(&v1);
        v1.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(SavedIndex::decode(&v1).unwrap(), SavedIndex { valid_lsn: Lsn::INVALID, ..s });
        assert_eq!(SavedIndex::decode(&v1[..50]), Err(SavedIndexError::Truncated(50)));
    }

    #[test]
    fn every_inconsistency_is_refused() {
        let good = sample().encode();
        assert_eq!(SavedIndex::decode(&good[..10]), Err(SavedIndexError::Truncated(10)));
        assert!(matches!(SavedIndex::decode(&good[..good.len() - 1]), Err(SavedIndexError::WrongLength { .. })));
        let mut flipped = good.clone();
        flipped[80] ^= 1;
        assert!(matches!(SavedIndex::decode(&flipped), Err(SavedIndexError::Checksum { .. })));
        let mut magic = good.clone();
        magic[0] = b'X';
        assert_eq!(SavedIndex::decode(&magic), Err(SavedIndexError::BadMagic));

        let mut s = sample();
        s.entries[1].slot = 3;
        assert!(matches!(SavedIndex::decode(&s.encode()), Err(SavedIndexError::DuplicateSlot { slot: 3, .. })));
        let mut s = sample();
        s.entries[1].forknum = 0;
        s.entries[1].blkno = 7;
        assert!(matches!(SavedIndex::decode(&s.encode()), Err(SavedIndexError::DuplicateBlock { blkno: 7, .. })));
        let mut s = sample();
        s.entries[0].slot = 100;
        assert!(matches!(SavedIndex::decode(&s.encode()), Err(SavedIndexError::SlotOutOfRange { slot: 100, .. })));
        let mut s = sample();
        s.entries[0].forknum = 4;
        assert!(matches!(SavedIndex::decode(&s.encode()), Err(SavedIndexError::BadFork { forknum: 4, .. })));
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = SavedIndex::decode(&bytes);
        }

        #[test]
        fn encoded_indexes_round_trip(n in 0usize..50, slots in 50u64..1000, seed in any::<u32>()) {
            let entries: Vec<SavedEntry> = (0..n as u32).map(|i| SavedEntry {
                spcnode: 1663, dbnode: seed % 7, relnode: 16384 + i % 5, forknum: (i % 4) as u8,
                blkno: i, slot: i, page_crc: seed ^ i, dep_lsn: Lsn(u64::from(seed) + u64::from(i)),
            }).collect();
            let s = SavedIndex { tenant: TenantId::from_bytes([3; 16]), timeline: TimelineId::from_bytes([4; 16]), slots, durable_lsn: Lsn(9), valid_lsn: Lsn(u64::from(seed) * 3), entries };
            prop_assert_eq!(SavedIndex::decode(&s.encode()).unwrap(), s);
        }
    }
}
