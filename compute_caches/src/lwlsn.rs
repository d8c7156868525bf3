//! The last-written LSN cache.
//!
//! A page that leaves the buffer pool is not sent anywhere; its WAL is. A later read must
//! ask the pageserver for a version at least as new as the page's last change, and should
//! not ask for more (the pageserver would wait for WAL it does not need). Each block hashes
//! to one of `BLOCKS` slots holding the highest LSN written by any block that hashes there,
//! and its fork to one of `FORKS` slots holding the highest LSN written by any block of any
//! fork that hashes there. Each is an over-estimate, never an under-estimate, and so is the
//! smaller of the two, which is what a read uses: reads are always correct and at worst
//! wait a little. The fork level is what keeps a bulk load from making other relations'
//! reads wait: the load's pages fill a good part of the block slots with LSNs near the end
//! of WAL, and a block of another relation that is not local (a catalog page ANALYZE reads,
//! say) would otherwise ask the pageserver for a version it is still ingesting. A relation
//! fork's size changes (extend, truncate, unlink) are tracked the same way under the block
//! number [`RELATION_BLOCK`]. A slot never written reads as 0; callers raise it to a floor
//! no older than the compute's start LSN.
//!
//! Lock-free: each slot only rises (`fetch_max`), so no write can lower what another
//! wrote, whatever the interleaving.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::{fork_slot, hash_fork, mix, RelFork};

/// The block number under which a fork's size changes are tracked.
pub const RELATION_BLOCK: u32 = u32::MAX;

/// `BLOCKS` block-level and `FORKS` fork-level slots (powers of two), in that order. All-zero
/// bytes are a valid value (no write known).
#[repr(C)]
pub struct LastWrittenLsn<const BLOCKS: usize, const FORKS: usize> {
    blocks: [AtomicU64; BLOCKS],
    forks: [AtomicU64; FORKS],
}

impl<const BLOCKS: usize, const FORKS: usize> LastWrittenLsn<BLOCKS, FORKS> {
    const SIZES_ARE_POWERS_OF_TWO: () = assert!(BLOCKS.is_power_of_two() && FORKS.is_power_of_two());

    /// Every slot at 0 (in ordinary memory; shared memory is zeroed instead).
    pub const fn new() -> Self {
        let () = Self::SIZES_ARE_POWERS_OF_TWO;
        LastWrittenLsn { blocks: [const { AtomicU64::new(0) }; BLOCKS], forks: [const { AtomicU64::new(0) }; FORKS] }
    }

    #[inline]
    fn block_slot(&self, r: &RelFork, blkno: u32) -> &AtomicU64 {
        let () = Self::SIZES_ARE_POWERS_OF_TWO;
        let h = mix(hash_fork(r) ^ u64::from(blkno));
        &self.blocks[(h as usize) & (BLOCKS - 1)]
    }

    #[inline]
    fn fork_slot(&self, r: &RelFork) -> &AtomicU64 {
        &self.forks[fork_slot(r, FORKS)]
    }

    /// Records that `blkno` of `r` was written at `lsn` (only ever raises the slots).
    #[inline]
    pub fn set_last_written(&self, r: &RelFork, blkno: u32, lsn: u64) {
        self.fork_slot(r).fetch_max(lsn, Ordering::AcqRel);
        self.block_slot(r, blkno).fetch_max(lsn, Ordering::AcqRel);
    }

    /// An LSN at or above the last write of `blkno` of `r` (0: none that this cache knows
    /// of): the smaller of its block slot and its fork slot.
    #[inline]
    pub fn last_written(&self, r: &RelFork, blkno: u32) -> u64 {
        self.block_slot(r, blkno).load(Ordering::Acquire).min(self.fork_slot(r).load(Ordering::Acquire))
    }

    /// Records that `r`'s size changed at `lsn`.
    #[inline]
    pub fn set_relation_changed(&self, r: &RelFork, lsn: u64) {
        self.set_last_written(r, RELATION_BLOCK, lsn);
    }

    /// An LSN at or above `r`'s last size change.
    #[inline]
    pub fn relation_changed(&self, r: &RelFork) -> u64 {
        self.last_written(r, RELATION_BLOCK)
    }
}

impl<const BLOCKS: usize, const FORKS: usize> Default for LastWrittenLsn<BLOCKS, FORKS> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fork(relnode: u32) -> RelFork {
        RelFork { spcnode: 1663, dbnode: 5, relnode, forknum: 0 }
    }

    #[test]
    fn a_bulk_load_does_not_raise_the_estimate_of_another_forks_blocks() {
        let c = LastWrittenLsn::<16, 1024>::new();
        let (load, other) = (fork(1), (2..).map(fork).find(|r| fork_slot(r, 1024) != fork_slot(&fork(1), 1024)).unwrap());
        c.set_last_written(&other, 3, 100);
        // Enough blocks to fill every block slot with a high LSN.
        for b in 0..1000 {
            c.set_last_written(&load, b, 5000 + u64::from(b));
        }
        assert_eq!(c.last_written(&other, 3), 100);
        assert!(c.last_written(&load, 999) >= 5999);
        assert_eq!(c.relation_changed(&other), 100, "the fork slot bounds its size changes too");
    }

    #[test]
    fn slots_only_rise() {
        let c = LastWrittenLsn::<4, 4>::new();
        c.set_last_written(&fork(1), 1, 50);
        c.set_last_written(&fork(1), 1, 20);
        assert_eq!(c.last_written(&fork(1), 1), 50);
        assert_eq!(LastWrittenLsn::<4, 4>::new().last_written(&fork(1), 1), 0);
    }
}
