//! How the WAL proposer's threads, its worker and committing backends wake each other,
//! shared by `wal_proposer.rs` and `sync_commit.rs`: the doorbell (an eventfd the
//! proposer's core thread sleeps on) and `SetLatch` callable from the proposer's threads.

use std::sync::atomic::Ordering;

use pgrx::prelude::*;

/// The eventfd committing backends ring to wake the proposer's core thread (`Doorbell`),
/// created by the postmaster in `wal_proposer::install` and inherited by every child; -1 if
/// there is none.
static DOORBELL_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// The doorbell's descriptor, if the postmaster created one.
pub fn doorbell_fd() -> Option<std::os::fd::RawFd> {
    Some(DOORBELL_FD.load(Ordering::Relaxed)).filter(|&fd| fd >= 0)
}

/// Creates the doorbell in the postmaster (children inherit the descriptor and this
/// process's copy of `DOORBELL_FD`). Without one, commits wake the worker instead.
pub fn create_doorbell() {
    use std::os::fd::IntoRawFd;
    match walproposer::new_eventfd() {
        // Kept open for the life of the postmaster and of every child.
        Ok(fd) => DOORBELL_FD.store(fd.into_raw_fd(), Ordering::Relaxed),
        Err(e) => ereport!(
            PgLogLevel::WARNING,
            PgSqlErrorCode::ERRCODE_WARNING,
            format!("fjord: could not create the WAL proposer's doorbell (eventfd): {e}"),
            "Commits then wake the WAL proposer worker, which costs each commit a turn of that worker."
        ),
    }
}

/// `SetLatch` declared by hand rather than through `pg_sys`: pgrx's bindings wrap every
/// PostgreSQL function in its FFI guard, which may check that it is called from the thread
/// that loaded the library, and `wal_proposer::wake` and `sync_commit::wake_committed` run
/// on the proposer's threads.
pub(crate) mod raw {
    unsafe extern "C" {
        pub fn SetLatch(latch: *mut pgrx::pg_sys::Latch);
    }
}
