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
//!
//! Some redo changes a page that is not a block of its record, which the filter never sees:
//! heap redo clears visibility-map bits (`visibilitymap_pin()` reads the map page into a
//! buffer through the storage manager, `visibilitymap_clear()` changes it there and leaves
//! its LSN). Such a change is always made in a buffer, and what keeps it is the storage
//! manager's write: a page whose LSN may predate its content (map pages, new pages, heap
//! pages with `PD_ALL_VISIBLE`) leaves the pool with the end of the record being replayed as
//! its last-written LSN (`smgr::current_lsn`), never the insert position, which stands at 0
//! on a standby. See the extension README's "Read replicas".

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

// ---------------------------------------------------------------------------------------
// On the primary: its read replicas, as the safekeepers relay them to the WAL proposer.

extern "C" {
    /// `c/replica_feedback.c`: holds `xmin` and `catalog_xmin` (full transaction ids, 0
    /// for none) in the worker's temporary slot `fjord_replicas`; false after a WARNING.
    fn fjord_hold_replica_xmin(xmin: u64, catalog_xmin: u64) -> bool;
}

/// What the WAL proposer worker last did about its replicas' horizon.
#[derive(Default)]
pub struct ReplicaHorizon {
    /// The (xmin, catalog xmin) last asked for, whether or not it could be held: a failure
    /// is retried only when the replicas ask for something else.
    last: Option<(u64, u64)>,
}

impl ReplicaHorizon {
    /// Publishes the replicas for `fjord.replicas()` and holds back the oldest xmin any of
    /// them reported. Called by the WAL proposer worker (it owns the slot) in its loop.
    pub fn update(&mut self, standbys: &[(String, walproposer::StandbyReport)]) {
        let list: Vec<crate::shmem::ReplicaInfo> = standbys
            .iter()
            .map(|(safekeeper, s)| crate::shmem::ReplicaInfo {
                name: s.name.clone(),
                safekeeper: safekeeper.clone(),
                flush_lsn: s.flush_lsn.0,
                apply_lsn: s.apply_lsn.0,
                xmin: s.xmin,
                catalog_xmin: s.catalog_xmin,
                age_ms: s.age_ms,
            })
            .collect();
        if let Some(shared) = crate::shmem::shared() {
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                .unwrap_or(0);
            shared.walproposer.set_replicas(&list, now_ms);
        }
        let oldest = |f: fn(&walproposer::StandbyReport) -> u64| standbys.iter().map(|(_, s)| f(s)).filter(|&x| x != 0).min().unwrap_or(0);
        self.hold(oldest(|s| s.xmin), oldest(|s| s.catalog_xmin));
    }

    /// Holds nothing back any more (the proposer stopped: its view of the replicas is gone).
    pub fn release(&mut self) {
        if let Some(shared) = crate::shmem::shared() {
            shared.walproposer.set_replicas(&[], 0);
        }
        self.hold(0, 0);
    }

    fn hold(&mut self, xmin: u64, catalog_xmin: u64) {
        if self.last == Some((xmin, catalog_xmin)) {
            return;
        }
        self.last = Some((xmin, catalog_xmin));
        // SAFETY: called on the worker's own thread (it owns the slot); the C side catches
        // its errors and reports them as a WARNING.
        unsafe { fjord_hold_replica_xmin(xmin, catalog_xmin) };
    }
}
