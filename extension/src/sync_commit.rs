//! The committing backend's side of the WAL proposer: patch 0008's `syncrep_wait_hook`.
//!
//! PostgreSQL calls the hook in `SyncRepWaitForLSN()` once the backend has queued itself to
//! wait for its commit record (after the record was flushed locally). The hook
//! 1. rings the doorbell (an eventfd the proposer's core thread sleeps on) with
//!    PostgreSQL's flush LSN in shared memory, so that the new WAL goes to the safekeepers at
//!    once, without a turn of the WAL proposer worker, and takes a `commit_waiters` slot, so
//!    that the proposer's thread wakes it when the commit LSN covers its WAL (it then
//!    releases itself),
//! 2. applies backpressure: while the oldest committed WAL (on a majority of safekeepers,
//!    which is all the pageserver can have) that the pageserver has not applied (its apply
//!    LSN as the safekeepers report it) was committed longer ago than
//!    `fjord.max_pageserver_lag_time` (the worker measures that age: `walproposer::lag`),
//!    or this compute's flushed WAL is more than `fjord.max_pageserver_lag` bytes ahead of
//!    it, the backend sleeps in short steps, waking the worker at each so that the lag it
//!    looks at is current. Reads wait for the pageserver to reach their LSN, so an
//!    unbounded lag would make reads of recently changed pages slow; slowing the writers
//!    down is what keeps it bounded. The limit is in time because the wait a lag means
//!    depends on what the WAL is: a bulk load's 100 MB ingest in well under a second, as
//!    much OLTP WAL in many seconds. And
//! 3. waits for the release itself, at the same time as for the lag (a commit held back by
//!    the lag is not also made to wait for the safekeepers after it) (the worker releases once a majority of safekeepers has
//!    the WAL), so that it sees a cancel first: PostgreSQL's own loop would end the wait on
//!    a query cancel (`pg_cancel_backend`, `statement_timeout`) and let COMMIT report
//!    success with a WARNING, for a commit that may be on no safekeeper and so may vanish
//!    when this compute stops. Here a cancel during the wait becomes the end of the session
//!    instead: a WARNING that says the commit's outcome is unknown goes to the client (and
//!    the log), the cancel is turned into a termination (`ProcDiePending`, output to the
//!    client off, as PostgreSQL's loop does for a termination), and the loop after the hook
//!    ends the wait and the backend without ever sending the command's success.
//!
//! Invariants:
//! - The hook never raises an ERROR or FATAL: the transaction has already committed locally,
//!   and PostgreSQL holds interrupts here. It returns as soon as the backend is released
//!   and not held back by the lag (a cancel ends the backpressure), or `ProcDiePending` is
//!   set (after turning a cancel before the release into it), and leaves the rest to
//!   `SyncRepWaitForLSN()`.
//! - No success is reported for a wait that was not released: the hook returns before the
//!   release only with `ProcDiePending` set and output to the client off.
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

/// How long one sleep of the wait for the release lasts at most (the release sets the latch;
/// this only bounds the cost of a wake-up lost some other way).
const RELEASE_STEP_MS: std::ffi::c_long = 1000;

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

fn die_pending() -> bool {
    // SAFETY: a plain read of a flag that signal handlers set.
    unsafe { (&raw const pg_sys::ProcDiePending).read_volatile() != 0 }
}

fn cancel_pending() -> bool {
    // SAFETY: a plain read of a flag that signal handlers set.
    unsafe { (&raw const pg_sys::QueryCancelPending).read_volatile() != 0 }
}

/// Whether the worker released this backend's wait (`SyncRepWakeQueue` sets the state, then
/// the latch).
fn released() -> bool {
    // The fence stands for PostgreSQL's pg_read_barrier() (a macro, not a function): it
    // pairs with the waker's write barrier, as in SyncRepWaitForLSN's own loop.
    std::sync::atomic::fence(Ordering::Acquire);
    // SAFETY: MyProc is this backend's PGPROC, valid for its life.
    unsafe { (&raw const (*pg_sys::MyProc).syncRepState).read_volatile() == pg_sys::SYNC_REP_WAIT_COMPLETE as i32 }
}

/// Sleeps on this backend's latch for at most `ms`; false if the postmaster died.
fn sleep_on_latch(ms: std::ffi::c_long, wait_event: u32) -> bool {
    // SAFETY: the backend's own latch; the loop after the hook resets it before it looks at
    // its state, so a wake-up consumed here is not lost.
    let rc = unsafe {
        let rc = pg_sys::WaitLatch(
            pg_sys::MyLatch,
            (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_POSTMASTER_DEATH) as i32,
            ms,
            wait_event,
        );
        pg_sys::ResetLatch(pg_sys::MyLatch);
        rc
    };
    // On postmaster death SyncRepWaitForLSN's own wait notices it too and ends the backend.
    rc & pg_sys::WL_POSTMASTER_DEATH as i32 == 0
}

/// The cancel of a wait whose WAL may be on no safekeeper: warn the client, then make the
/// cancel a termination so that PostgreSQL's loop ends the wait without reporting success.
fn end_session_on_cancel(lsn: pg_sys::XLogRecPtr) {
    let lsn = proto::Lsn(lsn);
    ereport!(
        PgLogLevel::WARNING,
        PgSqlErrorCode::ERRCODE_TRANSACTION_RESOLUTION_UNKNOWN,
        "canceling the wait for the safekeepers and terminating the connection: the outcome of this transaction is unknown",
        format!(
            "The transaction committed locally, but its WAL up to {lsn} has not been confirmed by a majority of safekeepers: it is durable only if they already have it. Check whether its changes are there after reconnecting."
        )
    );
    // SAFETY: what PostgreSQL's die() and SyncRepWaitForLSN do for a termination; plain
    // stores to this backend's globals, interrupts are held by the commit.
    unsafe {
        (&raw mut pg_sys::QueryCancelPending).write_volatile(0);
        (&raw mut pg_sys::ProcDiePending).write_volatile(1);
        (&raw mut pg_sys::InterruptPending).write_volatile(1);
        pg_sys::whereToSendOutput = pg_sys::CommandDest::DestNone;
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn fjord_syncrep_wait(lsn: pg_sys::XLogRecPtr, _commit: bool) {
    let Some(shared) = shmem::shared() else { return };
    let wp = &shared.walproposer;
    let slot = Waiting::register(wp, lsn);
    ring_doorbell(wp);
    wait(wp, lsn);
    drop(slot);
}

/// This backend's entry in `commit_waiters` while it waits (none if its `PGPROC` number is
/// past the array): what lets the proposer's thread wake it as soon as the commit LSN covers
/// its WAL, rather than after the worker's turn. Cleared when dropped.
struct Waiting(Option<&'static shmem::CommitWaiter>, &'static shmem::WalProposerShared);

impl Waiting {
    fn register(wp: &'static shmem::WalProposerShared, lsn: pg_sys::XLogRecPtr) -> Waiting {
        // SAFETY: MyProc is this backend's PGPROC, valid for its life; MyLatch its latch.
        let (index, latch) = unsafe { ((*pg_sys::MyProc).pgprocno.unsigned_abs() as usize, pg_sys::MyLatch) };
        let Some(slot) = wp.commit_waiters.get(index) else {
            wp.unslotted_waiters.fetch_add(1, Ordering::SeqCst);
            return Waiting(None, wp);
        };
        slot.latch.store(latch, Ordering::SeqCst);
        wp.commit_waiters_end.fetch_max(index + 1, Ordering::SeqCst);
        // After the latch: the proposer's thread sets the latch of a slot whose LSN it sees.
        slot.lsn.store(lsn.max(1), Ordering::SeqCst);
        Waiting(Some(slot), wp)
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        match self.0 {
            Some(slot) => slot.lsn.store(0, Ordering::SeqCst),
            None => {
                self.1.unslotted_waiters.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

/// Called by the proposer's thread (through the worker's `wake` callback) with its commit
/// LSN: publishes it and sets the latch of every backend waiting for WAL below it, which then
/// releases itself (`release_self`). Calls no PostgreSQL function but `SetLatch` (see
/// `wal_proposer::wake` for why that is safe from another thread).
///
/// No wake-up is lost: a backend stores its slot's LSN, then reads the commit LSN; this
/// stores the commit LSN, then reads the slots (all sequentially consistent), so at least
/// one of the two sees the other's store. The worker's own release stays as a fallback.
///
/// Returns whether the worker must still be woken for this commit LSN: when some backend
/// waits without a slot (it waits for the worker's release).
pub fn wake_committed(commit: proto::Lsn) -> bool {
    let Some(shared) = shmem::shared() else { return true };
    let wp = &shared.walproposer;
    if commit.0 == 0 {
        return true;
    }
    wp.proposer_commit_lsn.0.fetch_max(commit.0, Ordering::SeqCst);
    let end = wp.commit_waiters_end.load(Ordering::SeqCst).min(shmem::COMMIT_WAITERS);
    for slot in &wp.commit_waiters[..end] {
        let lsn = slot.lsn.load(Ordering::SeqCst);
        if lsn != 0 && lsn <= commit.0 {
            let latch = slot.latch.load(Ordering::SeqCst);
            if !latch.is_null() {
                // SAFETY: a backend's latch in its PGPROC (shared memory, never freed); setting
                // one whose backend has moved on is a spurious wake-up, which every latch
                // user tolerates.
                unsafe { crate::wakeup::raw::SetLatch(latch) };
            }
        }
    }
    wp.unslotted_waiters.load(Ordering::SeqCst) > 0
}

/// Releases the waiters up to the proposer's commit LSN if that covers `lsn` (this
/// backend's WAL): the worker would do the same at its next turn. Never past what
/// PostgreSQL flushed, as the worker does not.
fn release_self(wp: &shmem::WalProposerShared, lsn: pg_sys::XLogRecPtr) {
    let commit = wp.proposer_commit_lsn.0.load(Ordering::SeqCst);
    if commit < lsn {
        return;
    }
    // SAFETY: reads the flush position under its lock; patch 0008's release takes
    // SyncRepLock and wakes the waiters it releases (this backend among them), from any
    // process attached to shared memory.
    unsafe {
        let flushed = pg_sys::GetFlushRecPtr(std::ptr::null_mut());
        pg_sys::SyncRepReleaseWaitersUpTo(commit.min(flushed));
    }
}

/// Tells the proposer's core thread that WAL is flushed up to PostgreSQL's flush LSN: raises
/// `backend_flush_lsn` to it, then rings the doorbell (the eventfd the core thread sleeps on,
/// `wakeup::doorbell_fd`), so that the WAL goes out without a turn of the worker. Without
/// a doorbell (it could not be created), the worker is woken instead, as before.
fn ring_doorbell(wp: &shmem::WalProposerShared) {
    let Some(fd) = crate::wakeup::doorbell_fd() else {
        wake_worker(wp);
        return;
    };
    // SAFETY: reads the flush position under its spinlock. Not the hook's LSN: the core
    // sends WAL up to this value from pg_wal, so it must be WAL PostgreSQL wrote, which the
    // flush LSN is by definition (and it covers the hook's LSN, flushed before the wait).
    let flushed = unsafe { pg_sys::GetFlushRecPtr(std::ptr::null_mut()) };
    wp.backend_flush_lsn.0.fetch_max(flushed, Ordering::SeqCst);
    walproposer::ring_fd(fd);
}

/// Sets the WAL proposer worker's latch, so that it hands new WAL to the proposer, and
/// publishes the safekeepers' latest news of the pageserver, at once rather than at its
/// next poll.
fn wake_worker(wp: &shmem::WalProposerShared) {
    let latch = wp.worker_latch.load(Ordering::Acquire);
    if !latch.is_null() {
        // SAFETY: the worker's latch in its PGPROC (shared memory); setting a latch whose
        // owner has just exited is harmless (SetLatch finds owner_pid 0 or a stale pid, which
        // PostgreSQL tolerates).
        unsafe { pg_sys::SetLatch(latch) };
    }
}

/// Whether the pageserver lags more than `fjord.max_pageserver_lag_time` (the age of the
/// oldest committed WAL it has not applied, as the worker last measured it) or more than
/// `fjord.max_pageserver_lag` bytes; a limit set to 0 is off.
fn lagging(wp: &shmem::WalProposerShared) -> bool {
    let time_limit = guc::max_pageserver_lag_time_us();
    if time_limit > 0 && wp.pageserver_lag_us.load(Ordering::Relaxed) > time_limit {
        return true;
    }
    let limit = guc::max_pageserver_lag_bytes();
    limit > 0 && pageserver_lag_bytes(wp).is_some_and(|lag| lag > limit)
}

/// Waits until the worker has released this backend and the pageserver is within
/// `fjord.max_pageserver_lag` (backpressure), or until an interrupt. The two waits overlap:
/// a commit held back by the lag is not also made to wait for the safekeepers afterwards.
/// While the lag holds it back, the backend looks again every `THROTTLE_STEP_MS` and wakes
/// the worker each time, so that the lag it compares against is current. A query cancel
/// before the release is turned into the end of the session (see the module's comment);
/// after it, it only ends the backpressure.
fn wait(wp: &shmem::WalProposerShared, lsn: pg_sys::XLogRecPtr) {
    let mut throttled_since: Option<Instant> = None;
    let mut throttled = std::time::Duration::ZERO;
    loop {
        let mut done = released();
        if !done {
            release_self(wp, lsn);
            done = released();
        }
        let behind = lagging(wp);
        if behind {
            throttled_since.get_or_insert_with(Instant::now);
            wake_worker(wp);
        } else if let Some(since) = throttled_since.take() {
            throttled += since.elapsed();
        }
        if (done && !behind) || die_pending() {
            break;
        }
        if cancel_pending() {
            if !done {
                end_session_on_cancel(lsn);
            }
            break;
        }
        let (step, event) = if behind {
            (THROTTLE_STEP_MS, pg_sys::PG_WAIT_EXTENSION)
        } else {
            (RELEASE_STEP_MS, pg_sys::WaitEventIPC::WAIT_EVENT_SYNC_REP)
        };
        if !sleep_on_latch(step, event) {
            break;
        }
    }
    if let Some(since) = throttled_since {
        throttled += since.elapsed();
    }
    if !throttled.is_zero() {
        let us = u64::try_from(throttled.as_micros()).unwrap_or(u64::MAX);
        wp.throttled_us.fetch_add(us, Ordering::Relaxed);
        wp.throttled_waits.fetch_add(1, Ordering::Relaxed);
    }
}
