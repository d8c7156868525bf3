//! A configuration reload noticed from inside a page read: how a backend learns a new
//! `fjord.pageserver_address` while a query waits on a page.
//!
//! PostgreSQL applies a reload (`SIGHUP` sets `ConfigReloadPending`) only at its own safe
//! points: a backend before it reads the next command, an auxiliary process in its main
//! loop. A backend in the middle of a long query, or retrying a read against a pageserver
//! that has gone, reaches none of them; without help it would retry the old address until
//! `fjord.pageserver_timeout` and fail the query. So the page service client asks, at each
//! connection attempt, after each failed request and now and then before a request, what
//! the address is *now* ([`pageserver_address`]), and this module answers it in one of two
//! ways.
//!
//! **Apply the reload** (`ProcessConfigFile(PGC_SIGHUP)`, clearing `ConfigReloadPending`
//! first, exactly as `PostgresMain` and the auxiliary processes' loops do) only where doing
//! so is the same as at one of PostgreSQL's own safe points. `ProcessConfigFile` allocates
//! (in a private context, which `palloc` forbids inside a critical section), calls every
//! setting's check and assign hooks through `set_config_option`, and some check hooks
//! (`default_text_search_config`, `default_tablespace`, `temp_tablespaces`,
//! `client_encoding`) look up the catalogs whenever `IsTransactionState()`; a catalog
//! lookup reads buffers, and a read can come from under a held buffer content lock (a
//! B-tree split reads the right sibling while it holds the page it splits) or from the
//! very catalog page the lookup would need (its buffer marked I/O in progress by us: the
//! lookup would wait on ourselves). In parallel mode `set_config_option` refuses every
//! change (at `DEBUG2`, so silently), and the cleared flag would leave the reload unapplied
//! until the next `SIGHUP`. And other processes do more than `ProcessConfigFile` after a
//! reload (the checkpointer publishes `full_page_writes` and the synchronous standby
//! settings to shared memory, a WAL sender reinitialises its synchronous replication
//! state, a background worker runs whatever its author wrote): a reload applied by us
//! there would skip that. Hence the reload is applied only when all of these hold:
//! - `MyBackendType == B_BACKEND`: a regular backend, whose own loop does nothing but
//!   `ProcessConfigFile` (`PostgresMain`);
//! - `CritSectionCount == 0`: no critical section (no allocation allowed there, and an
//!   ERROR in one is a PANIC);
//! - `InterruptHoldoffCount == 0`: no LWLock held (`LWLockAcquire` holds interrupts off
//!   until the release), nor anything else that defers interrupts;
//! - `!IsTransactionOrTransactionBlock()`: no transaction, so no check hook reads a
//!   catalog, and nothing on the GUC stack of a transaction is touched (a backend between
//!   transactions);
//! - `!IsInParallelMode()`.
//!
//! **Otherwise, peek** ([`peek_address`]): parse `postgresql.conf` (with its includes) and
//! `postgresql.auto.conf` with `ParseConfigFile`, the same parser and the same order as a
//! reload, and take the last `fjord.pageserver_address` found, without applying anything.
//! Parsing reads files and allocates in a private memory context; it takes no lock, runs
//! no hook, reads no buffer and reports a syntax error at `DEBUG2` only, so it is safe
//! under a held LWLock and inside a transaction (not inside a critical section, where
//! nothing is done). `ConfigReloadPending` stays set, and PostgreSQL applies the reload at
//! its next safe point; until then the peeked address is used, re-read at most every
//! [`PEEK_INTERVAL`] (a reload sets the flag once, and another may follow before it is
//! applied).
//!
//! **Processes that never see `ConfigReloadPending`** peek at every connection attempt,
//! after every failed request and at most every [`UNSEEN_PEEK_INTERVAL`] before a request,
//! whether or not a reload was signalled, and use what they read until they read again: background workers leave `SIGHUP` ignored unless they
//! install a handler (`bgworker.c`), so a parallel worker of a query running across a move
//! would otherwise retry the old address until the timeout; and the startup process keeps
//! its own flag (`got_SIGHUP` in `startup.c`), which no extension can see. Backends, the
//! checkpointer and the background writer use `ConfigReloadPending`; all but backends only
//! ever peek here, and apply the reload in their own loops.
//!
//! A peek sees the files only: a value given on postgres' command line (`-c`), which a
//! reload would keep, is not seen (compute_ctl writes postgresql.conf).

use std::ffi::CStr;
use std::ptr;
use std::time::{Duration, Instant};

use pgrx::pg_sys;

use crate::guc;

/// How long a peeked address stands in for the file's before it is read again.
pub const PEEK_INTERVAL: Duration = Duration::from_millis(50);

/// How often a process that never sees a reload (the startup process, a parallel worker)
/// reads the files before a request when nothing failed: a planned migration keeps the old
/// pageserver answering for a while after computes are told to move.
pub const UNSEEN_PEEK_INTERVAL: Duration = Duration::from_millis(500);

/// What this process last peeked, and when.
struct Peeked {
    at: Instant,
    address: Option<String>,
}

thread_local! {
    static PEEKED: std::cell::RefCell<Option<Peeked>> = const { std::cell::RefCell::new(None) };
}

/// Whether a reload has been signalled and this process has not applied it yet.
pub fn reload_pending() -> bool {
    // SAFETY: a read of a sig_atomic_t that the SIGHUP handler sets.
    unsafe { (&raw const pg_sys::ConfigReloadPending).read_volatile() != 0 }
}

/// Whether applying the reload here is what PostgreSQL does at its own safe points (the
/// module's argument).
fn safe_to_apply() -> bool {
    // SAFETY: plain reads of this process's globals, and two functions that only read
    // this process's transaction state.
    unsafe {
        pg_sys::MyBackendType == pg_sys::BackendType::B_BACKEND
            && pg_sys::CritSectionCount == 0
            && pg_sys::InterruptHoldoffCount == 0
            && !pg_sys::IsTransactionOrTransactionBlock()
            && !pg_sys::IsInParallelMode()
    }
}

/// Whether this process never sets `ConfigReloadPending`: a background worker that left
/// `SIGHUP` ignored, as `bgworker.c` sets it up (parallel workers among them: they take
/// their settings from the leader at their start and never reload), or the startup process,
/// which keeps its own flag. Asked once per process: both are settled before the first
/// page is read.
fn reloads_unseen() -> bool {
    thread_local! {
        static UNSEEN: std::cell::OnceCell<bool> = const { std::cell::OnceCell::new() };
    }
    UNSEEN.with(|u| {
        *u.get_or_init(|| {
            // SAFETY: a read of this process's global, and sigaction with no new action,
            // which only reports the current one.
            unsafe {
                if pg_sys::MyBackendType == pg_sys::BackendType::B_STARTUP {
                    return true;
                }
                let mut current: libc::sigaction = std::mem::zeroed();
                libc::sigaction(libc::SIGHUP, ptr::null(), &mut current) == 0 && current.sa_sigaction == libc::SIG_IGN
            }
        })
    })
}

fn in_critical_section() -> bool {
    // SAFETY: a plain read of this process's global.
    unsafe { pg_sys::CritSectionCount != 0 }
}

/// The page service address as of now: with a reload pending, applied when that is safe
/// and else peeked from the configuration files (see the module doc); `None` when the
/// setting is empty. `fresh` asks for the files to be read again even if a peek is younger
/// than [`PEEK_INTERVAL`] (a connection attempt, a failed request).
pub fn pageserver_address(fresh: bool) -> Option<String> {
    if !reload_pending() {
        if !reloads_unseen() {
            PEEKED.with(|p| p.borrow_mut().take());
            return guc::pageserver_address();
        }
        // A process that never applies a reload: reading the files is its only way to learn
        // of a move: at each connection attempt and failure, and every UNSEEN_PEEK_INTERVAL
        // before a request (the old pageserver may still answer, having been told to let
        // go only later); what they said last stands until they are read again.
        let stale = PEEKED.with(|p| p.borrow().as_ref().is_none_or(|p| p.at.elapsed() >= UNSEEN_PEEK_INTERVAL));
        if (fresh || stale) && !in_critical_section() {
            let address = peek_address();
            PEEKED.with(|p| *p.borrow_mut() = Some(Peeked { at: Instant::now(), address }));
        }
        let stands = PEEKED.with(|p| p.borrow().as_ref().and_then(|p| p.address.clone()));
        return stands.or_else(guc::pageserver_address);
    }
    if safe_to_apply() {
        PEEKED.with(|p| p.borrow_mut().take());
        // SAFETY: the usual reload, under the conditions of the module's argument.
        unsafe {
            (&raw mut pg_sys::ConfigReloadPending).write_volatile(0);
            pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP);
        }
        return guc::pageserver_address();
    }
    if in_critical_section() {
        return guc::pageserver_address();
    }
    let cached = PEEKED.with(|p| match &*p.borrow() {
        Some(peeked) if !fresh && peeked.at.elapsed() < PEEK_INTERVAL => Some(peeked.address.clone()),
        _ => None,
    });
    if let Some(address) = cached {
        return address.or_else(guc::pageserver_address);
    }
    let address = peek_address();
    PEEKED.with(|p| *p.borrow_mut() = Some(Peeked { at: Instant::now(), address: address.clone() }));
    address.or_else(guc::pageserver_address)
}

/// Whether the configuration files now name another page service than `current`, for a
/// read that waits on `current` for an answer: peeked (never applied, so safe wherever a
/// read waits; see the module doc), only when a reload is pending or in a process that
/// never sees one, at most every [`PEEK_INTERVAL`] (or [`UNSEEN_PEEK_INTERVAL`]). A
/// pageserver that went silent (its host gone, a partition that drops packets) never
/// closes the connection: without this, a read sent to it would wait until
/// `fjord.pageserver_timeout` and fail although the compute was told of the move.
pub fn moved_away_from(current: &str) -> bool {
    let pending = reload_pending();
    if in_critical_section() || !(pending || reloads_unseen()) {
        return false;
    }
    let interval = if pending { PEEK_INTERVAL } else { UNSEEN_PEEK_INTERVAL };
    let cached = PEEKED.with(|p| p.borrow().as_ref().filter(|p| p.at.elapsed() < interval).map(|p| p.address.clone()));
    let address = cached.unwrap_or_else(|| {
        let address = peek_address();
        PEEKED.with(|p| *p.borrow_mut() = Some(Peeked { at: Instant::now(), address: address.clone() }));
        address
    });
    address.is_some_and(|a| a.trim() != current.trim())
}

/// The last non-empty `fjord.pageserver_address` in `postgresql.conf` (and what it
/// includes) and then `postgresql.auto.conf`, parsed the way a reload parses them and
/// applied to nothing; `None` when neither sets it, or a file does not parse (the reload
/// would then change nothing either).
fn peek_address() -> Option<String> {
    // SAFETY: ParseConfigFile and FreeConfigVariables on PostgreSQL's own globals
    // (ConfigFileName, DataDir), in a memory context of our own that is deleted before
    // returning; the list they build is only read here. Not in a critical section (checked
    // by the caller).
    unsafe {
        if pg_sys::ConfigFileName.is_null() {
            return None;
        }
        let context = pg_sys::AllocSetContextCreateExtended(
            pg_sys::CurrentMemoryContext,
            c"fjord configuration peek".as_ptr(),
            pg_sys::ALLOCSET_SMALL_MINSIZE as usize,
            pg_sys::ALLOCSET_SMALL_INITSIZE as usize,
            pg_sys::ALLOCSET_SMALL_MAXSIZE as usize,
        );
        let caller = pg_sys::MemoryContextSwitchTo(context);
        let (mut head, mut tail) = (ptr::null_mut(), ptr::null_mut());
        let elevel = pg_sys::DEBUG2 as i32;
        let mut parsed = pg_sys::ParseConfigFile(pg_sys::ConfigFileName, true, ptr::null(), 0, 0, elevel, &mut head, &mut tail);
        if parsed && !pg_sys::DataDir.is_null() {
            parsed = pg_sys::ParseConfigFile(c"postgresql.auto.conf".as_ptr(), false, ptr::null(), 0, 0, elevel, &mut head, &mut tail);
        }
        let mut found = None;
        let mut item = head;
        while parsed && !item.is_null() {
            let name = CStr::from_ptr((*item).name);
            if !(*item).ignore && name.to_bytes().eq_ignore_ascii_case(b"fjord.pageserver_address") && !(*item).value.is_null() {
                found = Some(CStr::from_ptr((*item).value).to_string_lossy().trim().to_string());
            }
            item = (*item).next;
        }
        pg_sys::MemoryContextSwitchTo(caller);
        pg_sys::MemoryContextDelete(context);
        found.filter(|a| !a.is_empty())
    }
}
