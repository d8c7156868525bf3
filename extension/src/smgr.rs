//! fjord's storage manager, installed through patch 0001's `smgr_select_hook`.
//!
//! Every relation a backend opens is routed here. With no pageserver configured (the only
//! mode so far) each call is passed to md.c, PostgreSQL's own storage manager, after being
//! counted in shared memory; the counters are how tests prove that the hook path is live.
//!
//! Invariants:
//! - Every callback is `#[pg_guard]`ed and calls md.c through `pg_guard_ffi_boundary`, so an
//!   `ereport(ERROR)` raised inside md.c unwinds through Rust frames safely and reaches
//!   PostgreSQL's error handling unchanged.
//! - The counters live in shared memory requested at preload time; a process that has no
//!   shared memory (none should call us, but a standalone backend could) counts nothing
//!   rather than failing.

use std::ffi::c_char;
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use pgrx::pg_sys;
use pgrx::pg_sys::ffi::pg_guard_ffi_boundary;
use pgrx::prelude::*;

/// Calls through fjord's storage manager since the server started, across all processes.
#[derive(Default)]
#[repr(C)]
pub struct SmgrCounters {
    pub relations_opened: AtomicU64,
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub extends: AtomicU64,
    pub truncates: AtomicU64,
    pub nblocks: AtomicU64,
    pub creates: AtomicU64,
    pub unlinks: AtomicU64,
}

/// Points into shared memory once `shmem_startup` has run in the postmaster; inherited by
/// every child through fork.
static COUNTERS: AtomicPtr<SmgrCounters> = AtomicPtr::new(ptr::null_mut());

static mut PREV_SHMEM_REQUEST_HOOK: pg_sys::shmem_request_hook_type = None;
static mut PREV_SHMEM_STARTUP_HOOK: pg_sys::shmem_startup_hook_type = None;

pub fn counters() -> Option<&'static SmgrCounters> {
    // SAFETY: the pointer is either null or points at a SmgrCounters in shared memory that
    // lives as long as the process.
    unsafe { COUNTERS.load(Ordering::Acquire).as_ref() }
}

fn count(field: impl Fn(&SmgrCounters) -> &AtomicU64) {
    if let Some(c) = counters() {
        field(c).fetch_add(1, Ordering::Relaxed);
    }
}

/// The table PostgreSQL calls through for every relation we claim.
static FJORD_SMGR: pg_sys::f_smgr = pg_sys::f_smgr {
    smgr_init: None,
    smgr_shutdown: None,
    smgr_open: Some(fjord_open),
    smgr_close: Some(fjord_close),
    smgr_create: Some(fjord_create),
    smgr_exists: Some(fjord_exists),
    smgr_unlink: Some(fjord_unlink),
    smgr_extend: Some(fjord_extend),
    smgr_prefetch: Some(fjord_prefetch),
    smgr_read: Some(fjord_read),
    smgr_write: Some(fjord_write),
    smgr_writeback: Some(fjord_writeback),
    smgr_nblocks: Some(fjord_nblocks),
    smgr_truncate: Some(fjord_truncate),
    smgr_immedsync: Some(fjord_immedsync),
};

/// Installs the shared-memory hooks and the storage manager hook. Called from `_PG_init`
/// while shared_preload_libraries is being processed in the postmaster.
pub fn install() {
    // SAFETY: single-threaded postmaster start-up; we chain to whatever was installed before.
    unsafe {
        PREV_SHMEM_REQUEST_HOOK = pg_sys::shmem_request_hook;
        pg_sys::shmem_request_hook = Some(shmem_request);
        PREV_SHMEM_STARTUP_HOOK = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(shmem_startup);
        pg_sys::smgr_select_hook = Some(fjord_smgr_select);
    }
}

/// True when this process routes relations through fjord's storage manager.
pub fn is_installed() -> bool {
    // SAFETY: a plain read of a hook pointer in our own process.
    let hook = unsafe { pg_sys::smgr_select_hook };
    // Compare addresses: the hook may have been replaced by another extension after us.
    hook.map(|f| f as *const () as usize) == Some(fjord_smgr_select as *const () as usize)
}

#[pg_guard]
unsafe extern "C-unwind" fn shmem_request() {
    unsafe {
        if let Some(prev) = PREV_SHMEM_REQUEST_HOOK {
            pg_guard_ffi_boundary(|| prev());
        }
        pg_sys::RequestAddinShmemSpace(size_of::<SmgrCounters>());
    }
}

/// `AddinShmemInitLock`, a C macro for slot 21 of the main LWLock array (lwlocknames.txt).
unsafe fn addin_shmem_init_lock() -> *mut pg_sys::LWLock {
    const ADDIN_SHMEM_INIT_LOCK_SLOT: usize = 21;
    unsafe { &raw mut (*pg_sys::MainLWLockArray.add(ADDIN_SHMEM_INIT_LOCK_SLOT)).lock }
}

#[pg_guard]
unsafe extern "C-unwind" fn shmem_startup() {
    unsafe {
        if let Some(prev) = PREV_SHMEM_STARTUP_HOOK {
            pg_guard_ffi_boundary(|| prev());
        }
        pg_sys::LWLockAcquire(addin_shmem_init_lock(), pg_sys::LWLockMode::LW_EXCLUSIVE);
        let mut found = false;
        let p = pg_sys::ShmemInitStruct(
            c"fjord smgr counters".as_ptr(),
            size_of::<SmgrCounters>(),
            &mut found,
        )
        .cast::<SmgrCounters>();
        if !found {
            p.write(SmgrCounters::default());
        }
        COUNTERS.store(p, Ordering::Release);
        pg_sys::LWLockRelease(addin_shmem_init_lock());
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn fjord_smgr_select(_rnode: pg_sys::RelFileNodeBackend) -> *const pg_sys::f_smgr {
    // Every relation goes through us; in pass-through mode we hand each call to md.c.
    &FJORD_SMGR
}

/// md.c's table, to which every call is passed.
fn md() -> &'static pg_sys::f_smgr {
    // SAFETY: smgr_standard returns a pointer to a static const table in the server.
    unsafe { &*pg_sys::smgr_standard() }
}

/// Calls an md.c entry point that PostgreSQL always provides.
macro_rules! md_call {
    ($field:ident ( $($arg:expr),* )) => {{
        let f = md().$field.expect(concat!("md.c has no ", stringify!($field)));
        // SAFETY: md.c's functions take exactly the arguments PostgreSQL passed to us, and
        // pg_guard_ffi_boundary turns an ERROR longjmp into a Rust panic that our own
        // #[pg_guard] turns back into the same ERROR.
        unsafe { pg_guard_ffi_boundary(|| f($($arg),*)) }
    }};
}

#[pg_guard]
unsafe extern "C-unwind" fn fjord_open(reln: pg_sys::SMgrRelation) {
    count(|c| &c.relations_opened);
    md_call!(smgr_open(reln))
}

#[pg_guard]
unsafe extern "C-unwind" fn fjord_close(reln: pg_sys::SMgrRelation, forknum: pg_sys::ForkNumber::Type) {
    md_call!(smgr_close(reln, forknum))
}

#[pg_guard]
unsafe extern "C-unwind" fn fjord_create(reln: pg_sys::SMgrRelation, forknum: pg_sys::ForkNumber::Type, is_redo: bool) {
    count(|c| &c.creates);
    md_call!(smgr_create(reln, forknum, is_redo))
}

#[pg_guard]
unsafe extern "C-unwind" fn fjord_exists(reln: pg_sys::SMgrRelation, forknum: pg_sys::ForkNumber::Type) -> bool {
    md_call!(smgr_exists(reln, forknum))
}

#[pg_guard]
unsafe extern "C-unwind" fn fjord_unlink(rnode: pg_sys::RelFileNodeBackend, forknum: pg_sys::ForkNumber::Type, is_redo: bool) {
    count(|c| &c.unlinks);
    md_call!(smgr_unlink(rnode, forknum, is_redo))
}

#[pg_guard]
unsafe extern "C-unwind" fn fjord_extend(
    reln: pg_sys::SMgrRelation,
    forknum: pg_sys::ForkNumber::Type,
    blocknum: pg_sys::BlockNumber,
    buffer: *mut c_char,
    skip_fsync: bool,
) {
    count(|c| &c.extends);
    md_call!(smgr_extend(reln, forknum, blocknum, buffer, skip_fsync))
}

#[pg_guard]
unsafe extern "C-unwind" fn fjord_prefetch(
    reln: pg_sys::SMgrRelation,
    forknum: pg_sys::ForkNumber::Type,
    blocknum: pg_sys::BlockNumber,
) -> bool {
    md_call!(smgr_prefetch(reln, forknum, blocknum))
}

#[pg_guard]
unsafe extern "C-unwind" fn fjord_read(
    reln: pg_sys::SMgrRelation,
    forknum: pg_sys::ForkNumber::Type,
    blocknum: pg_sys::BlockNumber,
    buffer: *mut c_char,
) {
    count(|c| &c.reads);
    md_call!(smgr_read(reln, forknum, blocknum, buffer))
}

#[pg_guard]
unsafe extern "C-unwind" fn fjord_write(
    reln: pg_sys::SMgrRelation,
    forknum: pg_sys::ForkNumber::Type,
    blocknum: pg_sys::BlockNumber,
    buffer: *mut c_char,
    skip_fsync: bool,
) {
    count(|c| &c.writes);
    md_call!(smgr_write(reln, forknum, blocknum, buffer, skip_fsync))
}

#[pg_guard]
unsafe extern "C-unwind" fn fjord_writeback(
    reln: pg_sys::SMgrRelation,
    forknum: pg_sys::ForkNumber::Type,
    blocknum: pg_sys::BlockNumber,
    nblocks: pg_sys::BlockNumber,
) {
    md_call!(smgr_writeback(reln, forknum, blocknum, nblocks))
}

#[pg_guard]
unsafe extern "C-unwind" fn fjord_nblocks(reln: pg_sys::SMgrRelation, forknum: pg_sys::ForkNumber::Type) -> pg_sys::BlockNumber {
    count(|c| &c.nblocks);
    md_call!(smgr_nblocks(reln, forknum))
}

#[pg_guard]
unsafe extern "C-unwind" fn fjord_truncate(
    reln: pg_sys::SMgrRelation,
    forknum: pg_sys::ForkNumber::Type,
    old_blocks: pg_sys::BlockNumber,
    nblocks: pg_sys::BlockNumber,
) {
    count(|c| &c.truncates);
    md_call!(smgr_truncate(reln, forknum, old_blocks, nblocks))
}

#[pg_guard]
unsafe extern "C-unwind" fn fjord_immedsync(reln: pg_sys::SMgrRelation, forknum: pg_sys::ForkNumber::Type) {
    md_call!(smgr_immedsync(reln, forknum))
}
