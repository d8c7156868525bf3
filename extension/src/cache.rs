//! The two shared caches behind the remote storage manager, as the storage manager calls
//! them: the last-written LSN cache and the relation-size cache. Their data structures and
//! rules are `compute_caches` (`lwlsn`, `relsize`, whose documentation says why each is
//! correct); this module finds them in shared memory (`shmem`), keeps each backend's copies
//! of sizes (`LocalSizes`, per backend), counts relation-size hits and misses, and turns a
//! full relation-size table into an ERROR naming the setting to raise.
//!
//! A last-written LSN slot never written reads as 0; callers raise it to a floor no older
//! than the compute's start LSN (see `smgr::read_lsns`). Without shared memory every
//! function answers as an empty cache.

use std::cell::RefCell;
use std::sync::atomic::Ordering;

use compute_caches::relsize::{CacheFull, LocalSizes};
use pgrx::prelude::*;

use crate::shmem::{self, Mine};

pub use compute_caches::relsize::SizeUpdate;
pub use compute_caches::RelFork;

thread_local! {
    /// The sizes this backend looked up, valid while the table's generation is theirs.
    static LOCAL_SIZES: RefCell<LocalSizes> = RefCell::new(LocalSizes::new());
}

/// Records that `blkno` of `r` was written at `lsn` (only ever raises the slots).
pub fn set_last_written(r: &RelFork, blkno: u32, lsn: u64) {
    if let Some(s) = shmem::shared() {
        s.lwlsn.set_last_written(r, blkno, lsn);
    }
}

/// An LSN at or above the last write of `blkno` of `r` since the compute started (0: none
/// that this cache knows of).
pub fn last_written(r: &RelFork, blkno: u32) -> u64 {
    shmem::shared().map_or(0, |s| s.lwlsn.last_written(r, blkno))
}

pub fn set_relation_changed(r: &RelFork, lsn: u64) {
    if let Some(s) = shmem::shared() {
        s.lwlsn.set_relation_changed(r, lsn);
    }
}

pub fn relation_changed(r: &RelFork) -> u64 {
    shmem::shared().map_or(0, |s| s.lwlsn.relation_changed(r))
}

/// The cached size of `r`, if known.
pub fn cached_size(r: &RelFork) -> Option<u32> {
    let s = shmem::shared()?;
    let found = LOCAL_SIZES.with(|l| shmem::relsize(s).cached_size(&mut l.borrow_mut(), r));
    let counter = if found.is_some() { &s.counters.mine().relsize_hits } else { &s.counters.mine().relsize_misses };
    counter.fetch_add(1, Ordering::Relaxed);
    found
}

/// Applies `u` and returns the resulting size (`None` when nothing is cached). A full table
/// is an ERROR.
pub fn update_size(r: &RelFork, u: SizeUpdate) -> Option<u32> {
    let s = shmem::shared()?;
    match LOCAL_SIZES.with(|l| shmem::relsize(s).update_size(&l.borrow(), r, u)) {
        Ok(n) => n,
        Err(CacheFull { capacity }) => {
            ereport!(
                PgLogLevel::ERROR,
                PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
                format!("fjord's relation-size cache is full ({capacity} relation forks)"),
                "Raise fjord.relsize_cache_entries and restart the compute."
            );
            unreachable!("ereport(ERROR) does not return");
        }
    }
}

/// Forgets `r` (it was unlinked).
pub fn forget_size(r: &RelFork) {
    if let Some(s) = shmem::shared() {
        shmem::relsize(s).forget_size(r);
    }
}

/// Records that a page of `r` carrying the fake LSN `fake_lsn` of an unlogged index build
/// left the pool as a full-page image at `image_lsn`. See `smgr::restore_build_lsn`.
pub fn note_build_image(r: &RelFork, fake_lsn: u64, image_lsn: u64) {
    if let Some(s) = shmem::shared() {
        shmem::relsize(s).note_build_image(r, fake_lsn, image_lsn);
    }
}

/// `(fake LSN, newest image LSN)` if pages of `r` left the pool during an unlogged build.
pub fn build_images(r: &RelFork) -> Option<(u64, u64)> {
    shmem::relsize(shmem::shared()?).build_images(r)
}

/// Forgets every fork of database `dbnode` (DROP DATABASE).
pub fn forget_database(dbnode: u32) {
    if let Some(s) = shmem::shared() {
        shmem::relsize(s).forget_database(dbnode);
    }
}
