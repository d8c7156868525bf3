//! The WAL proposer background worker ("fjord walproposer"): runs the `walproposer` crate's
//! [`WalProposer`] inside the compute and makes PostgreSQL's synchronous commit wait for it.
//!
//! Registered in `_PG_init` when `fjord.safekeepers` is set. The worker builds the
//! proposer's [`Config`] (system identifier, segment size, the LSN this compute's WAL starts
//! at, `pg_wal`, tenant and timeline, a name), starts it, and then loops:
//! wait on its latch (set by the proposer's threads, by committing backends through
//! `sync_commit.rs`, or every [`POLL_INTERVAL`]) → tell the proposer how far PostgreSQL has
//! flushed WAL → release the backends waiting for WAL up to the commit LSN (patch 0008's
//! `SyncRepReleaseWaitersUpTo`) → publish status, commit LSN and the pageserver's progress
//! in shared memory (`fjord.walproposer_status()`, backpressure) → publish the read
//! replicas the safekeepers relay (`fjord.replicas()`) and hold back their oldest xmin
//! (`replica::ReplicaHorizon`, a temporary replication slot).
//!
//! Commits wait because compute_ctl sets `synchronous_standby_names = 'walproposer'` and
//! `synchronous_commit = on`: PostgreSQL queues every committing backend until a release
//! covers its commit record, and only fjord releases (no standby is named `walproposer`):
//! this worker, and each waiting backend itself once the proposer's thread has announced a
//! commit LSN that covers its WAL and set its latch (`sync_commit::wake_committed`), which
//! spares every commit a turn of this worker between the safekeepers' answer and the
//! backend. The worker is then woken by the proposer only for a change of status (or a
//! backend waiting without a slot).
//!
//! Invariants:
//! - The proposer's threads never call into PostgreSQL: their only way in is the `wake`
//!   callback, which sets latches (this worker's, waiting backends') through a raw
//!   `SetLatch` (see [`wake`]).
//! - Waiters are released only up to the proposer's commit LSN, which never exceeds what
//!   PostgreSQL reported flushed, so a released commit is on a majority of safekeepers.
//! - A fenced compute (another proposer was elected, or the safekeepers' WAL does not
//!   continue this compute's) never releases another waiter: the worker stops the proposer
//!   and asks the postmaster for a fast shutdown (extension/README.md says why).
//! - A start failure is retried with backoff; waiting commits keep waiting meanwhile.

use std::ffi::CStr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags};
use pgrx::pg_sys;
use pgrx::prelude::*;
use proto::{Lsn, TenantId, TimelineId};
use walproposer::{Config, Status, WalProposer};

use crate::guc;
use crate::shmem::{self, WalProposerShared};

/// How often the worker looks at PostgreSQL's flush LSN without being woken. Backends that
/// commit wake it at once; this bounds the delay for WAL flushed without a commit waiting
/// (the WAL writer, a checkpoint) and for a wake-up lost between threads.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// The proposer's reconnect backoff ceiling.
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// Backoff between attempts to start the proposer after `WalProposer::start` failed.
const START_RETRY_MIN: Duration = Duration::from_secs(1);
const START_RETRY_MAX: Duration = Duration::from_secs(30);

/// The worker's state as published in shared memory (`WalProposerShared::state`). 0 is what
/// a fresh segment holds: no worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum State {
    Off = 0,
    Starting = 1,
    Electing = 2,
    Streaming = 3,
    Fenced = 4,
    /// `WalProposer::start` failed; retrying with backoff (the message says why).
    StartFailed = 5,
    Stopped = 6,
}

impl State {
    pub fn from_u32(v: u32) -> State {
        match v {
            1 => State::Starting,
            2 => State::Electing,
            3 => State::Streaming,
            4 => State::Fenced,
            5 => State::StartFailed,
            6 => State::Stopped,
            _ => State::Off,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            State::Off => "off",
            State::Starting => "starting",
            State::Electing => "electing",
            State::Streaming => "streaming",
            State::Fenced => "fenced",
            State::StartFailed => "start failed",
            State::Stopped => "stopped",
        }
    }
}

/// The validated settings the worker needs, checked in `_PG_init` so that a compute with a
/// wrong setting does not start at all (FATAL) rather than start without safekeepers.
pub struct Settings {
    pub safekeepers: Vec<String>,
    pub tenant_id: TenantId,
    pub timeline_id: TimelineId,
    /// TLS to the safekeepers, trusting the CA of `fjord.tls_ca_file` (empty: cleartext).
    pub tls: Option<tls::ClientTls>,
}

/// Reads and validates the WAL proposer's settings; `Ok(None)` when `fjord.safekeepers` is
/// empty (no WAL proposer: commits do not wait for safekeepers).
pub fn settings() -> Result<Option<Settings>, String> {
    let Some(safekeepers) = guc::safekeepers()? else { return Ok(None) };
    let tenant_id =
        guc::tenant_id().ok_or("fjord.safekeepers is set but fjord.tenant_id is not: the WAL proposer must name the timeline")?;
    let tenant_id: TenantId = tenant_id.parse().map_err(|e| format!("fjord.tenant_id \"{tenant_id}\" is not a tenant id: {e}"))?;
    let timeline_id =
        guc::timeline_id().ok_or("fjord.safekeepers is set but fjord.timeline_id is not: the WAL proposer must name the timeline")?;
    let timeline_id: TimelineId =
        timeline_id.parse().map_err(|e| format!("fjord.timeline_id \"{timeline_id}\" is not a timeline id: {e}"))?;
    let tls = match guc::tls_ca_file() {
        Some(ca) => Some(
            tls::ClientTls::load(std::path::Path::new(&ca))
                .map_err(|e| format!("fjord.tls_ca_file: cannot load the cluster CA for the safekeepers: {e:#}"))?,
        ),
        None => None,
    };
    Ok(Some(Settings { safekeepers, tenant_id, timeline_id, tls }))
}

/// Called from `_PG_init` in the postmaster: validates the settings (FATAL if wrong) and, if
/// safekeepers are configured, registers the worker and the commit hook.
pub fn install() {
    let settings = match settings() {
        Ok(Some(s)) => s,
        Ok(None) => return,
        Err(message) => {
            // FATAL in the postmaster: the server does not start.
            ereport!(
                PgLogLevel::FATAL,
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                message,
                "compute_ctl writes these settings; fix them in postgresql.conf"
            );
            unreachable!("ereport(FATAL) does not return")
        }
    };
    let n = settings.safekeepers.len();
    if n % 2 == 0 {
        ereport!(
            PgLogLevel::WARNING,
            PgSqlErrorCode::ERRCODE_WARNING,
            format!("fjord.safekeepers names an even number of safekeepers ({n})"),
            format!(
                "A majority of {n} is {}: {n} safekeepers tolerate no more failures than {}, and every commit waits for one more of them.",
                walproposer::majority(n),
                n - 1
            )
        );
    }
    // Commits wait only with a non-empty synchronous_standby_names and walsenders allowed
    // (patch 0008 keeps PostgreSQL's early returns); compute_ctl sets both. Without them the
    // proposer still streams, but commits return before the safekeepers have them.
    // SAFETY: plain reads of GUC variables, set before shared_preload_libraries is processed.
    let (standby_names, max_wal_senders) = unsafe {
        let names = pg_sys::SyncRepStandbyNames;
        let names = if names.is_null() { String::new() } else { CStr::from_ptr(names).to_string_lossy().into_owned() };
        (names, pg_sys::max_wal_senders)
    };
    if standby_names.trim().is_empty() || max_wal_senders == 0 {
        ereport!(
            PgLogLevel::WARNING,
            PgSqlErrorCode::ERRCODE_WARNING,
            "fjord.safekeepers is set but commits will not wait for the safekeepers",
            "Commits wait only with synchronous_standby_names = 'walproposer' and max_wal_senders > 0; compute_ctl sets both."
        );
    }
    BackgroundWorkerBuilder::new("fjord walproposer")
        .set_type("fjord walproposer")
        .set_library("fjord")
        .set_function("fjord_walproposer_main")
        .enable_shmem_access(None)
        // It streams WAL the server writes as a primary; a read-only compute (recovery)
        // writes none and never commits, so the worker starts once recovery is over.
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        // A crash of the worker (not a fencing, which shuts the server down) restarts it;
        // the new proposer is elected again and resumes from the safekeepers' WAL.
        .set_restart_time(Some(Duration::from_secs(1)))
        .load();
    crate::wakeup::create_doorbell();
    crate::sync_commit::install();
}

fn wp() -> &'static WalProposerShared {
    &shmem::shared().expect("the fjord walproposer worker runs with shared memory").walproposer
}

/// The proposer's `wake` callback: sets the worker's latch from one of the proposer's threads.
///
/// `SetLatch` is safe to call from another thread of the same process because PostgreSQL
/// designed it to be called from signal handlers, which interrupt the owning process at any
/// point: it only sets `is_set` with memory barriers around it, reads `maybe_sleeping` and
/// `owner_pid`, and if the owner (this process) may be asleep, sends SIGURG to its own pid
/// (or writes the self-pipe). It takes no lock, allocates nothing and cannot raise an error.
/// The latch lives in shared memory (the worker's PGPROC) for as long as the process does,
/// and the proposer is stopped before the worker exits. The worker blocks SIGURG (received
/// through a signalfd) before it starts the proposer, so the proposer's threads inherit the
/// blocked mask and the signal reaches the worker's wait; if it were ever lost, the latch is
/// still set and [`POLL_INTERVAL`] bounds the delay.
fn wake(latch: usize) {
    // SAFETY: see above; `latch` is MyLatch of the worker process, valid for its lifetime.
    unsafe { crate::wakeup::raw::SetLatch(latch as *mut pg_sys::Latch) }
}

/// Where this compute's own WAL begins: the LSN in `fjord.signal.done` (patch 0006; the
/// basebackup's LSN), or, for a data directory that did not start from a basebackup, the redo
/// pointer when the worker first ran (kept in shared memory, so a restarted worker keeps it).
fn wal_start_lsn(data_dir: &str) -> Lsn {
    let published = wp().wal_start_lsn.load(Ordering::Relaxed);
    if published != 0 {
        return Lsn(published);
    }
    let path = PathBuf::from(data_dir).join("fjord.signal.done");
    let from_signal = std::fs::read_to_string(&path)
        .ok()
        .and_then(|text| text.lines().find_map(|l| l.strip_prefix("LSN:")).and_then(|v| v.trim().parse::<Lsn>().ok()));
    let lsn = match from_signal {
        // The signal names where the first record goes; the WAL before it (what the
        // safekeepers hold) ends there, or at the page boundary before that page's header.
        Some(lsn) => lsn.previous_wal_end(),
        None => {
            // SAFETY: a plain read of the redo pointer under its lock.
            let redo = Lsn(unsafe { pg_sys::GetRedoRecPtr() });
            log!(
                "fjord walproposer: {} has no LSN (not started from a basebackup); this compute's WAL is taken to start at the redo pointer {redo}",
                path.display()
            );
            redo
        }
    };
    wp().wal_start_lsn.store(lsn.0, Ordering::Relaxed);
    lsn
}

fn publish_status(status: &Status) {
    let wp = wp();
    match status {
        Status::Electing => wp.state.store(State::Electing as u32, Ordering::Relaxed),
        Status::Streaming { term, start_lsn } => {
            wp.term.store(*term, Ordering::Relaxed);
            wp.elected_start_lsn.store(start_lsn.0, Ordering::Relaxed);
            wp.state.store(State::Streaming as u32, Ordering::Relaxed);
        }
        Status::Fenced { reason } | Status::Failed { reason } => {
            wp.set_message(reason);
            wp.state.store(State::Fenced as u32, Ordering::Relaxed);
        }
    }
}

fn describe(status: &Status) -> String {
    match status {
        Status::Electing => "electing".to_string(),
        Status::Streaming { term, start_lsn } => format!("elected in term {term}, streaming WAL from {start_lsn}"),
        Status::Fenced { reason } => format!("fenced: {reason}"),
        Status::Failed { reason } => format!("failed: {reason}"),
    }
}

/// The worker's entry point (named in the registration; called by the postmaster's child).
#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn fjord_walproposer_main(_arg: pg_sys::Datum) {
    // Blocks SIGURG (latch wake-ups come through a signalfd) before any thread exists.
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let settings = match settings() {
        Ok(Some(s)) => s,
        // _PG_init validated these in the postmaster; the worker sees the same values.
        Ok(None) => return,
        Err(message) => error!("{message}"),
    };
    let wp = wp();
    // SAFETY: plain reads of globals set at start-up.
    let (latch, system_id, seg_size, data_dir, postmaster_pid) = unsafe {
        (
            pg_sys::MyLatch,
            pg_sys::GetSystemIdentifier(),
            pg_sys::wal_segment_size,
            CStr::from_ptr(pg_sys::DataDir).to_string_lossy().into_owned(),
            pg_sys::PostmasterPid,
        )
    };
    let config = Config {
        safekeepers: settings.safekeepers.clone(),
        tenant_id: settings.tenant_id,
        timeline_id: settings.timeline_id,
        system_id,
        wal_segment_size: u32::try_from(seg_size).unwrap_or(16 << 20),
        wal_start: wal_start_lsn(&data_dir),
        wal_dir: Some(PathBuf::from(&data_dir).join("pg_wal")),
        name: format!("compute pid {postmaster_pid}"),
        reconnect_max: RECONNECT_MAX,
        whole_records: true,
        // From compute_ctl, through the postmaster's environment.
        auth_token: std::env::var(proto::AUTH_TOKEN_ENV).ok().filter(|t| !t.is_empty()),
        tls: settings.tls.clone(),
    };
    wp.state.store(State::Starting as u32, Ordering::Relaxed);
    wp.worker_latch.store(latch, Ordering::Release);
    log!(
        "fjord walproposer: starting for timeline {}/{} with safekeepers {}, WAL from {}",
        config.tenant_id,
        config.timeline_id,
        config.safekeepers.join(","),
        config.wal_start
    );

    let latch_addr = latch as usize;
    let last_commit = std::sync::atomic::AtomicU64::new(0);
    let wake_fn: walproposer::Wake = Arc::new(move |commit| {
        // Backends waiting for WAL below a new commit LSN go at once, each releasing itself,
        // without waiting for this worker's turn (`sync_commit::wake_committed`). The worker
        // is woken for what only it does: a change of status, and a new commit LSN that a
        // backend without a slot waits for. Otherwise it sees the commit LSN at its next
        // turn (a committing backend's wake-up, or POLL_INTERVAL) and releases what is left.
        let advanced = commit.0 > last_commit.fetch_max(commit.0, Ordering::SeqCst);
        let worker_needed = crate::sync_commit::wake_committed(commit);
        if !advanced || worker_needed {
            wake(latch_addr);
        }
    });
    let mut proposer: Option<WalProposer> = None;
    let mut next_start = Instant::now();
    let mut retry = START_RETRY_MIN;
    let mut last_error = String::new();
    let mut last_status: Option<Status> = None;
    let mut released = Lsn(0);
    let mut horizon = crate::replica::ReplicaHorizon::default();
    let mut apply_lag = walproposer::lag::ApplyLag::new();

    loop {
        if proposer.is_none() && wp.state.load(Ordering::Relaxed) != State::Fenced as u32 && Instant::now() >= next_start {
            let doorbell = crate::wakeup::doorbell_fd()
                .map(|fd| walproposer::Doorbell { fd, flushed: Arc::new(|| Lsn(self::wp().backend_flush_lsn.0.load(Ordering::SeqCst))) });
            match WalProposer::start_with_doorbell(config.clone(), wake_fn.clone(), doorbell) {
                Ok(p) => {
                    wp.starts.fetch_add(1, Ordering::Relaxed);
                    wp.state.store(State::Electing as u32, Ordering::Relaxed);
                    wp.set_message("");
                    retry = START_RETRY_MIN;
                    last_error.clear();
                    last_status = None;
                    proposer = Some(p);
                }
                Err(e) => {
                    let message = format!("could not start the WAL proposer: {e:#}");
                    wp.state.store(State::StartFailed as u32, Ordering::Relaxed);
                    wp.set_message(&message);
                    // Once per distinct failure: a retry loop must not flood the log.
                    if message != last_error {
                        warning!(
                            "fjord walproposer: {message}; retrying every {} s at most, commits wait meanwhile",
                            START_RETRY_MAX.as_secs()
                        );
                        last_error = message;
                    }
                    next_start = Instant::now() + retry;
                    retry = (retry * 2).min(START_RETRY_MAX);
                }
            }
        }

        if let Some(p) = &proposer {
            // SAFETY: reads WAL positions under their own locks.
            let flushed = Lsn(unsafe { pg_sys::GetFlushRecPtr(std::ptr::null_mut()) });
            p.wal_flushed(flushed);
            wp.flush_lsn.store(flushed.0, Ordering::Relaxed);

            // What the proposer's threads cannot log themselves (a lagging safekeeper caught up
            // from the others, and when it is through).
            for line in p.take_notices() {
                log!("fjord walproposer: {line}");
            }
            let status = p.status();
            if last_status.as_ref() != Some(&status) {
                publish_status(&status);
                if !matches!(status, Status::Fenced { .. } | Status::Failed { .. }) {
                    log!("fjord walproposer: {}", describe(&status));
                }
                last_status = Some(status.clone());
            }
            if let Status::Fenced { reason } | Status::Failed { reason } = &status {
                // Nothing is released any more: a fenced compute's WAL past the commit LSN
                // may be overwritten by the new writer; a failed proposer cannot make any
                // more WAL durable.
                if matches!(status, Status::Fenced { .. }) {
                    warning!("fjord: this compute was fenced: {reason}; it can no longer commit; shutting down");
                } else {
                    warning!("fjord: the WAL proposer failed: {reason}; this compute can no longer commit; shutting down");
                }
                if let Some(p) = proposer.take() {
                    p.stop();
                }
                horizon.release();
                // SAFETY: kill(2) on the postmaster: SIGINT asks for a fast shutdown.
                unsafe { libc::kill(postmaster_pid, libc::SIGINT) };
            } else {
                let commit = p.commit_lsn();
                // The age of the oldest committed WAL the pageserver has not applied
                // (backpressure); unknown, and so 0, until it reports an apply position.
                let now = Instant::now();
                apply_lag.committed(commit, now);
                // Never past what PostgreSQL flushed: the proposer must not know of more,
                // and a bigger value would release commits that are not durable anywhere.
                let commit = Lsn(commit.0.min(flushed.0));
                if commit > released {
                    // SAFETY: patch 0008; takes SyncRepLock, wakes the waiters it releases.
                    unsafe { pg_sys::SyncRepReleaseWaitersUpTo(commit.0) };
                    released = commit;
                    wp.commit_lsn.store(commit.0, Ordering::Relaxed);
                }
                let feedback = p.feedback();
                wp.pageserver_flush_lsn.store(feedback.pageserver_flush_lsn.0, Ordering::Relaxed);
                wp.pageserver_apply_lsn.store(feedback.pageserver_apply_lsn.0, Ordering::Relaxed);
                let lag = if feedback.pageserver_apply_lsn.is_valid() {
                    apply_lag.lag(feedback.pageserver_apply_lsn, now)
                } else {
                    Duration::ZERO
                };
                wp.pageserver_lag_us.store(u64::try_from(lag.as_micros()).unwrap_or(u64::MAX), Ordering::Relaxed);
                // Read replicas (through the safekeepers): shown by fjord.replicas(), and
                // their oldest xmin held back here as a walsender would.
                horizon.update(&p.standbys());
            }
        }

        // WaitLatch + ResetLatch + CHECK_FOR_INTERRUPTS; false on SIGTERM or postmaster death.
        if !BackgroundWorker::wait_latch(Some(POLL_INTERVAL)) {
            break;
        }
        if BackgroundWorker::sighup_received() {
            // SAFETY: the usual reload in the worker's own loop.
            unsafe {
                (&raw mut pg_sys::ConfigReloadPending).write_volatile(0);
                pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP);
            }
        }
    }

    wp.worker_latch.store(std::ptr::null_mut(), Ordering::Release);
    if let Some(p) = proposer.take() {
        p.stop();
    }
    if wp.state.load(Ordering::Relaxed) != State::Fenced as u32 {
        wp.state.store(State::Stopped as u32, Ordering::Relaxed);
    }
    log!("fjord walproposer: stopped");
}
