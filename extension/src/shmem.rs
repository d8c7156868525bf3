//! The extension's shared memory: storage manager counters, the last-written LSN cache
//! and the relation-size cache, in one segment requested at preload time.
//!
//! Layout: [`Shared`] (counters and the last-written LSN slots), then
//! `fjord.relsize_cache_entries` [`RelSizeEntry`] slots. The relation-size cache is guarded
//! by one LWLock of the named tranche `fjord`; everything else is atomics.
//!
//! Invariant: a process that has no shared memory (a standalone backend, the WAL-redo
//! process) sees `None` from [`shared`] and must not use the remote storage manager.

use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use pgrx::pg_sys;
use pgrx::pg_sys::ffi::pg_guard_ffi_boundary;
use pgrx::prelude::*;

use crate::guc;

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
    /// Page service requests sent and reconnects made.
    pub remote_requests: AtomicU64,
    pub remote_reconnects: AtomicU64,
    /// Full-page images written at eviction (see `smgr.rs`).
    pub eviction_fpis: AtomicU64,
    pub relsize_hits: AtomicU64,
    pub relsize_misses: AtomicU64,
}

/// Slots of the last-written LSN cache: a lossy map from block to the highest LSN at which
/// any block hashing to the slot was last written. 2^16 slots, 512 KiB.
pub const LWLSN_SLOTS: usize = 1 << 16;

#[repr(C)]
pub struct Shared {
    pub counters: SmgrCounters,
    pub lwlsn: [AtomicU64; LWLSN_SLOTS],
    pub relsize_lock: *mut pg_sys::LWLock,
    pub relsize_capacity: usize,
    /// Slots in use; changed only under the lock.
    pub relsize_used: std::sync::atomic::AtomicUsize,
}

/// One relation fork's size. `used == 0` marks a free slot.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct RelSizeEntry {
    pub spcnode: u32,
    pub dbnode: u32,
    pub relnode: u32,
    pub forknum: i32,
    pub nblocks: u32,
    pub used: u32,
    /// For an index under an unlogged build (see `smgr::needs_image`): the fake LSN its
    /// pages carry during the build, and the newest full-page image written for one of
    /// them at eviction. 0 when not in a build.
    pub build_fake_lsn: u64,
    pub build_max_image_lsn: u64,
}

static SHARED: AtomicPtr<Shared> = AtomicPtr::new(ptr::null_mut());

static mut PREV_SHMEM_REQUEST_HOOK: pg_sys::shmem_request_hook_type = None;
static mut PREV_SHMEM_STARTUP_HOOK: pg_sys::shmem_startup_hook_type = None;

const TRANCHE: &std::ffi::CStr = c"fjord";

fn relsize_capacity() -> usize {
    guc::RELSIZE_CACHE_ENTRIES.get().max(1024) as usize
}

fn total_size() -> usize {
    size_of::<Shared>() + relsize_capacity() * size_of::<RelSizeEntry>()
}

pub fn shared() -> Option<&'static Shared> {
    // SAFETY: null, or a Shared in shared memory that lives as long as the process.
    unsafe { SHARED.load(Ordering::Acquire).as_ref() }
}

/// The relation-size slots that follow `Shared`.
///
/// # Safety
/// The caller holds the relation-size lock (shared to read, exclusive to write).
#[allow(clippy::mut_from_ref)]
pub unsafe fn relsize_entries(s: &Shared) -> &mut [RelSizeEntry] {
    unsafe {
        let base = (s as *const Shared).add(1).cast::<RelSizeEntry>().cast_mut();
        std::slice::from_raw_parts_mut(base, s.relsize_capacity)
    }
}

pub fn install_hooks() {
    // SAFETY: single-threaded postmaster start-up; we chain to whatever was installed before.
    unsafe {
        PREV_SHMEM_REQUEST_HOOK = pg_sys::shmem_request_hook;
        pg_sys::shmem_request_hook = Some(shmem_request);
        PREV_SHMEM_STARTUP_HOOK = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(shmem_startup);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn shmem_request() {
    unsafe {
        if let Some(prev) = PREV_SHMEM_REQUEST_HOOK {
            pg_guard_ffi_boundary(|| prev());
        }
        pg_sys::RequestAddinShmemSpace(total_size());
        pg_sys::RequestNamedLWLockTranche(TRANCHE.as_ptr(), 1);
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
        let size = total_size();
        let p = pg_sys::ShmemInitStruct(c"fjord shared state".as_ptr(), size, &mut found).cast::<Shared>();
        if !found {
            // All-zero bytes are a valid initial state for every field: zero counters,
            // LSN 0 in every slot, free relation-size slots.
            ptr::write_bytes(p.cast::<u8>(), 0, size);
            (*p).relsize_lock = &raw mut (*pg_sys::GetNamedLWLockTranche(TRANCHE.as_ptr())).lock;
            (*p).relsize_capacity = relsize_capacity();
        }
        SHARED.store(p, Ordering::Release);
        pg_sys::LWLockRelease(addin_shmem_init_lock());
    }
}

pub fn count(field: impl Fn(&SmgrCounters) -> &AtomicU64) {
    if let Some(s) = shared() {
        field(&s.counters).fetch_add(1, Ordering::Relaxed);
    }
}
