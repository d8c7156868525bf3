//! A read replica: a hot standby compute that replays the committed WAL it streams from
//! the safekeepers, but only on the pages it holds.
//!
//! The redo filter (`c/replica.c`, through patch 0003's `redo_read_buffer_filter`) skips
//! every block that is not in shared_buffers and calls [`fjord_replica_block_skipped`]
//! under the block's buffer mapping partition lock. What makes that safe:
//! - a later read of the block asks the pageserver for a version that includes the skipped
//!   record: its last-written LSN is raised to the record's end, and a read in recovery asks
//!   at the replay position or that LSN, whichever is later (`smgr::read_lsns`); the
//!   pageserver, which ingests the same WAL, waits for it if it has to;
//! - the local file cache's copy of the block, if any, is dropped (it misses the record);
//! - a cached relation size grows if the record writes past it (the pageserver's size
//!   grows when it ingests the record); a size not cached is read later at an LSN past the
//!   record (the relation's size-change LSN is raised instead).
//!
//! A backend that reads a block loads it into shared_buffers first, so the filter sees it
//! there and the record is replayed on the page once it is read; a backend reading after
//! the filter ran sees the bookkeeping. Pages are thus never older than the replay
//! position, nor newer: the request LSN is the replay position, not the pageserver's
//! latest.

use pgrx::pg_guard;
use pgrx::pg_sys;

use crate::cache::{self, RelFork, SizeUpdate};
use crate::file_cache;

extern "C" {
    fn fjord_replica_install_filter();
}

/// Installs the redo filter (a compute that reads its pages from the pageserver).
pub fn install() {
    // SAFETY: sets a hook pointer during single-threaded postmaster start-up.
    unsafe { fjord_replica_install_filter() };
}

/// Called by the redo filter for a block whose replay it skips (module documentation).
#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn fjord_replica_block_skipped(
    spcnode: pg_sys::Oid,
    dbnode: pg_sys::Oid,
    relnode: pg_sys::Oid,
    forknum: i32,
    blkno: pg_sys::BlockNumber,
    end_lsn: pg_sys::XLogRecPtr,
) {
    let rel = RelFork { spcnode: spcnode.into(), dbnode: dbnode.into(), relnode: relnode.into(), forknum };
    cache::set_last_written(&rel, blkno, end_lsn);
    file_cache::invalidate_blocks(&rel, blkno, blkno.saturating_add(1));
    if cache::update_size(&rel, SizeUpdate::AtLeastIfCached(blkno.saturating_add(1))).is_none() {
        cache::set_relation_changed(&rel, end_lsn);
    }
    crate::shmem::count(|c| &c.replay_skipped_blocks);
}
