//! The committing backend's side of the WAL proposer: patch 0008's `syncrep_wait_hook`.
//!
//! PostgreSQL calls the hook in `SyncRepWaitForLSN()` once the backend has queued itself to
//! wait for its commit record (after the record was flushed locally). The hook
//! 1. sets the WAL proposer worker's latch, so that the worker hands the new WAL to the
//!    proposer at once instead of at its next poll, and
//! 2. applies backpressure: while `fjord.max_pageserver_lag` is above 0 and this compute's
//!    flushed WAL is more than that ahead of the pageserver's apply LSN (as the safekeepers
//!    report it), the backend sleeps in short steps. Reads wait for the pageserver to reach
//!    their LSN, so an unbounded lag would make reads of recently changed pages slow; slowing
//!    the writers down is what keeps it bounded.
//!
//! Invariants:
//! - The hook never raises an ERROR: the transaction has already committed locally, and
//!   PostgreSQL holds interrupts here. It stops sleeping as soon as `ProcDiePending` or
//!   `QueryCancelPending` is set and leaves them to `SyncRepWaitForLSN()`, which ends the
//!   wait with its usual warnings ("... has already committed locally, but might not have
//!   been replicated").
//! - Backpressure needs a known pageserver position: until the safekeepers have reported
//!   one (apply LSN 0), nothing is throttled, so a compute whose pageserver has not
//!   connected yet is not stopped by it (its commits still wait for the safekeepers).
//! - A throttled backend keeps its locks (it is inside the commit, as during the whole
//!   synchronous-replication wait); backpressure is on WAL volume, not on latency.

use std::sync::atomic::Ordering;
use std::time::Instant;

use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::guc;
use crate::shmem;

/// How long one backpressure sleep lasts before the lag is looked at again.
const THROTTLE_STEP_MS: std::ffi::c_long = 10;

/// Installs the hook; called from `_PG_init` in the postmaster when safekeepers are set.
pub fn install() {
    // SAFETY: single-threaded postmaster start-up; the hook is patch 0008's.
    unsafe {
        pg_sys::syncrep_wait_hook = Some(fjord_syncrep_wait);
    }
}

/// Bytes of WAL flushed here that the pageserver has not applied yet, if it is known.
fn pageserver_lag_bytes(wp: &shmem::WalProposerShared) -> Option<u64> {
    let apply = wp.pageserver_apply_lsn.load(Ordering::Relaxed);
    if apply == 0 {
        return None;
    }
    // SAFETY: reads the flush position under its lock.
    let flushed = unsafe { pg_sys::GetFlushRecPtr(std::ptr::null_mut()) };
    Some(flushed.saturating_sub(apply))
}

fn interrupt_pending() -> bool {
    // SAFETY: plain reads of flags that signal handlers set.
    unsafe { (&raw const pg_sys::ProcDiePending).read_volatile() != 0 || (&raw const pg_sys::QueryCancelPending).read_volatile() != 0 }
}

#[pg_guard]
unsafe extern "C-unwind" fn fjord_syncrep_wait(_lsn: pg_sys::XLogRecPtr, _commit: bool) {
    let Some(shared) = shmem::shared() else { return };
    let wp = &shared.walproposer;
    let latch = wp.worker_latch.load(Ordering::Acquire);
    if !latch.is_null() {
        // SAFETY: the worker's latch in its PGPROC (shared memory); setting a latch whose
        // owner has just exited is harmless (SetLatch finds owner_pid 0 or a stale pid, which
        // PostgreSQL tolerates).
        unsafe { pg_sys::SetLatch(latch) };
    }

    let limit = guc::max_pageserver_lag_bytes();
    if limit == 0 {
        return;
    }
    let mut started: Option<Instant> = None;
    while pageserver_lag_bytes(wp).is_some_and(|lag| lag > limit) && !interrupt_pending() {
        started.get_or_insert_with(Instant::now);
        // SAFETY: the backend's own latch; the wait loop after us resets it before it looks
        // at its state, so a wake-up consumed here is not lost.
        let rc = unsafe {
            let rc = pg_sys::WaitLatch(
                pg_sys::MyLatch,
                (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_POSTMASTER_DEATH) as i32,
                THROTTLE_STEP_MS,
                pg_sys::PG_WAIT_EXTENSION,
            );
            pg_sys::ResetLatch(pg_sys::MyLatch);
            rc
        };
        if rc & pg_sys::WL_POSTMASTER_DEATH as i32 != 0 {
            // SyncRepWaitForLSN's own wait notices it too and ends the backend.
            break;
        }
    }
    if let Some(started) = started {
        let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        wp.throttled_us.fetch_add(us, Ordering::Relaxed);
        wp.throttled_waits.fetch_add(1, Ordering::Relaxed);
    }
}
