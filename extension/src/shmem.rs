//! The extension's shared memory: storage manager counters, the last-written LSN cache,
//! the relation-size cache and the WAL proposer's published state, in one segment
//! requested at preload time. The caches' data structures and rules are `compute_caches`;
//! this module lays them out and provides their locks ([`LwLocks`]).
//!
//! Layout: [`Shared`] (counters, the last-written LSN slots, the relation-size table's
//! header, the WAL proposer's state), then `fjord.relsize_cache_entries` relation-size
//! slots. The relation-size cache is guarded by LWLock 0 of the named tranche `fjord`, the
//! WAL proposer's message and its list of read replicas by LWLock 1; everything else is
//! atomics.
//!
//! Invariant: a process that has no shared memory (a standalone backend, the WAL-redo
//! process) sees `None` from [`shared`] and must not use the remote storage manager.

use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

use compute_caches::lwlsn::LastWrittenLsn;
use compute_caches::relsize::{self, RelSizeCache, RelSizeHeader, RelSizeSlot};
use compute_caches::Locks;
use pgrx::pg_sys;
use pgrx::pg_sys::ffi::pg_guard_ffi_boundary;
use pgrx::prelude::*;

use crate::guc;

pub use compute_caches::{Padded, PerProcess};

/// This process's number for [`PerProcess`] counters: its `PGPROC` number, or 0 before it
/// has one (the postmaster).
pub fn process_number() -> usize {
    // SAFETY: MyProc is this process's PGPROC, or null before it has one.
    unsafe { pg_sys::MyProc.as_ref() }.map_or(0, |p| p.pgprocno.unsigned_abs() as usize)
}

/// This process's copy of per-process counters.
pub trait Mine<T> {
    fn mine(&self) -> &T;
}

impl<T> Mine<T> for PerProcess<T> {
    fn mine(&self) -> &T {
        self.get(process_number())
    }
}

/// A named LWLock tranche as the caches' [`Locks`]: lock `i` is the tranche's `i`-th.
pub struct LwLocks(*mut pg_sys::LWLockPadded);

impl LwLocks {
    /// The locks of the tranche that `GetNamedLWLockTranche` returned.
    pub fn new(tranche: *mut pg_sys::LWLockPadded) -> Self {
        LwLocks(tranche)
    }

    fn lock(&self, i: usize) -> *mut pg_sys::LWLock {
        // SAFETY: the tranche has at least `i + 1` locks (the caches use lock 0, or one per
        // stripe of a tranche requested with that many) and lives as long as the server.
        unsafe { &raw mut (*self.0.add(i)).lock }
    }

    fn acquire(&self, i: usize, mode: pg_sys::LWLockMode::Type) {
        // SAFETY: a valid lock (see `lock`). PostgreSQL's error cleanup (LWLockReleaseAll)
        // releases it if an ERROR unwinds through the holder.
        unsafe { pg_sys::LWLockAcquire(self.lock(i), mode) };
    }

    fn release(&self, i: usize) {
        // SAFETY: the caller holds it; during an unwind PostgreSQL may already have released
        // all LWLocks, and LWLockHeldByMe makes this idempotent.
        unsafe {
            if pg_sys::LWLockHeldByMe(self.lock(i)) {
                pg_sys::LWLockRelease(self.lock(i));
            }
        }
    }
}

// SAFETY: LWLocks exclude as `Locks` requires, across processes, with the memory barriers
// of acquire and release.
unsafe impl Locks for LwLocks {
    fn lock_shared(&self, i: usize) {
        self.acquire(i, pg_sys::LWLockMode::LW_SHARED);
    }
    fn lock_exclusive(&self, i: usize) {
        self.acquire(i, pg_sys::LWLockMode::LW_EXCLUSIVE);
    }
    unsafe fn unlock_shared(&self, i: usize) {
        self.release(i);
    }
    unsafe fn unlock_exclusive(&self, i: usize) {
        self.release(i);
    }
}

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
    pub pageserver_requests: AtomicU64,
    pub pageserver_reconnects: AtomicU64,
    /// Full-page images written at eviction (see `smgr.rs`).
    pub eviction_fpis: AtomicU64,
    pub relsize_hits: AtomicU64,
    pub relsize_misses: AtomicU64,
    /// GetPage requests sent ahead of reads, prefetched pages used, and prefetches
    /// dropped unused (never read, invalidated by a later write, or lost with a connection).
    pub prefetch_requests: AtomicU64,
    pub prefetch_hits: AtomicU64,
    pub prefetch_wasted: AtomicU64,
    /// Blocks a read replica's redo left to the pageserver (not in shared_buffers).
    pub replay_skipped_blocks: AtomicU64,
    /// GetPage round trips by latency: `getpage_buckets[i]` counts those that took at most
    /// `GETPAGE_BUCKETS_US[i]` µs (and more than the bucket before); the last is the rest.
    pub getpage_buckets: [AtomicU64; GETPAGE_BUCKETS_US.len() + 1],
    pub getpage_us_total: AtomicU64,
}

/// Upper bounds of the GetPage latency buckets, in µs: fine enough to tell a page the
/// pageserver had in memory (tens of µs plus the round trip) from one it rebuilt or waited for.
pub const GETPAGE_BUCKETS_US: [u64; 17] =
    [25, 50, 100, 200, 300, 500, 750, 1000, 2000, 3000, 5000, 10_000, 20_000, 50_000, 100_000, 500_000, 1_000_000];

impl SmgrCounters {
    pub fn observe_getpage(&self, took: std::time::Duration) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        let i = GETPAGE_BUCKETS_US.iter().position(|&b| us <= b).unwrap_or(GETPAGE_BUCKETS_US.len());
        self.getpage_buckets[i].fetch_add(1, Ordering::Relaxed);
        self.getpage_us_total.fetch_add(us, Ordering::Relaxed);
    }
}

/// What the WAL proposer worker publishes for backends (the commit hook) and the status
/// function. Written only by the worker, except `throttled_*`, which backends add to.
/// LSNs are bytes; 0 means "not known yet".
#[repr(C)]
pub struct WalProposerShared {
    /// The worker's latch while it runs (null otherwise): what the commit hook sets.
    pub worker_latch: AtomicPtr<pg_sys::Latch>,
    /// A `wal_proposer::State` as u32.
    pub state: AtomicU32,
    pub term: AtomicU64,
    /// The LSN this compute's WAL started at (what the proposer is told it owns from).
    pub wal_start_lsn: AtomicU64,
    /// Where the elected proposer's WAL begins (the election's start LSN).
    pub elected_start_lsn: AtomicU64,
    /// WAL on a majority of safekeepers; waiters are released up to it.
    pub commit_lsn: AtomicU64,
    /// The flush LSN last passed to the proposer.
    pub flush_lsn: AtomicU64,
    pub pageserver_flush_lsn: AtomicU64,
    pub pageserver_apply_lsn: AtomicU64,
    /// The age in microseconds of the oldest committed WAL that the pageserver has not
    /// applied (`walproposer::lag`), as of the worker's last look; 0 while it has applied
    /// everything or has not reported yet.
    pub pageserver_lag_us: AtomicU64,
    /// Time backends spent in backpressure, and how many waits were delayed at all.
    pub throttled_us: AtomicU64,
    pub throttled_waits: AtomicU64,
    /// Times the worker started the proposer (a restart after a failure counts again).
    pub starts: AtomicU64,
    pub message_lock: *mut pg_sys::LWLock,
    /// The last thing worth telling an operator (a start failure, the fencing reason),
    /// UTF-8, `message_len` bytes; under `message_lock`.
    message_len: std::sync::atomic::AtomicUsize,
    message: std::cell::UnsafeCell<[u8; MESSAGE_MAX]>,
    /// The read replicas the safekeepers reported, as of `replicas_at_ms` (Unix time);
    /// `replicas_len` of `replicas` are valid; both under `message_lock`.
    replicas_len: std::sync::atomic::AtomicUsize,
    replicas_at_ms: AtomicU64,
    replicas: std::cell::UnsafeCell<[ReplicaSlot; REPLICAS_MAX]>,
    /// The proposer's commit LSN as its thread last announced it (the `wake` callback), so
    /// that a committing backend can release itself without waiting for the worker
    /// (`sync_commit.rs`). Only rises.
    pub proposer_commit_lsn: Padded<AtomicU64>,
    /// Committing backends waiting for the safekeepers, by `PGPROC` number (backends whose
    /// number is past the array wait for the worker's release alone).
    pub commit_waiters: [CommitWaiter; COMMIT_WAITERS],
    /// One past the highest `commit_waiters` slot ever used: how far the proposer's thread
    /// looks.
    pub commit_waiters_end: std::sync::atomic::AtomicUsize,
    /// How far committing backends saw PostgreSQL's WAL flushed (`GetFlushRecPtr` in the
    /// commit hook), for the proposer's core thread, which they wake through the doorbell
    /// (`sync_commit.rs`). Only rises.
    pub backend_flush_lsn: Padded<AtomicU64>,
    /// Backends waiting without a `commit_waiters` slot: while there are any, the proposer's
    /// thread wakes the worker at each new commit LSN, whose release they wait for.
    pub unslotted_waiters: AtomicU32,
}

/// Slots of [`WalProposerShared::commit_waiters`].
pub const COMMIT_WAITERS: usize = 1024;

/// A committing backend waiting for WAL up to `lsn` (0: the slot is not waiting), and the
/// latch to set when it may go. All-zero bytes are a free slot.
#[repr(C)]
pub struct CommitWaiter {
    pub lsn: AtomicU64,
    pub latch: AtomicPtr<pg_sys::Latch>,
}

/// Bytes of [`WalProposerShared::message`].
pub const MESSAGE_MAX: usize = 512;

/// The most read replicas `fjord.replicas()` shows.
pub const REPLICAS_MAX: usize = 32;

/// One read replica as a safekeeper reported it (see `quorum::wire::StandbyReport`);
/// all-zero bytes are a valid empty slot.
#[derive(Clone, Copy)]
#[repr(C)]
struct ReplicaSlot {
    name: [u8; 128],
    name_len: u32,
    safekeeper_len: u32,
    safekeeper: [u8; 64],
    flush_lsn: u64,
    apply_lsn: u64,
    xmin: u64,
    catalog_xmin: u64,
    age_ms: u32,
}

/// A read replica as `fjord.replicas()` shows it.
pub struct ReplicaInfo {
    pub name: String,
    pub safekeeper: String,
    pub flush_lsn: u64,
    pub apply_lsn: u64,
    pub xmin: u64,
    pub catalog_xmin: u64,
    /// Milliseconds between the replica's last report and `WalProposerShared::set_replicas`.
    pub age_ms: u32,
}

/// Slots of the last-written LSN cache: a lossy map from block to the highest LSN at which
/// any block hashing to the slot was last written. 2^16 slots, 512 KiB.
pub const LWLSN_SLOTS: usize = 1 << 16;
/// Slots of its per-fork level: the highest LSN at which any block of any fork hashing to
/// the slot was written. 2^14 slots, 128 KiB.
pub const LWLSN_FORK_SLOTS: usize = 1 << 14;

#[repr(C)]
pub struct Shared {
    pub counters: PerProcess<SmgrCounters>,
    pub lwlsn: LastWrittenLsn<LWLSN_SLOTS, LWLSN_FORK_SLOTS>,
    /// The relation-size table's header (its lock is LWLock 0 of the tranche); its slots
    /// follow `Shared`.
    pub relsize: RelSizeHeader<LwLocks>,
    pub walproposer: WalProposerShared,
}

static SHARED: AtomicPtr<Shared> = AtomicPtr::new(ptr::null_mut());

static mut PREV_SHMEM_REQUEST_HOOK: pg_sys::shmem_request_hook_type = None;
static mut PREV_SHMEM_STARTUP_HOOK: pg_sys::shmem_startup_hook_type = None;

const TRANCHE: &std::ffi::CStr = c"fjord";

fn relsize_capacity() -> usize {
    guc::RELSIZE_CACHE_ENTRIES.get().max(1024) as usize
}

fn total_size() -> usize {
    size_of::<Shared>() + relsize::slots_size(relsize_capacity())
}

pub fn shared() -> Option<&'static Shared> {
    // SAFETY: null, or a Shared in shared memory that lives as long as the process.
    unsafe { SHARED.load(Ordering::Acquire).as_ref() }
}

/// The relation-size table: the header in `s`, the slots that follow `Shared`.
pub fn relsize(s: &'static Shared) -> RelSizeCache<'static, LwLocks> {
    // SAFETY: `total_size` counts the slots after `Shared` (whose size is a multiple of its
    // 128-byte alignment), zeroed when the segment was made and used only through this
    // header.
    unsafe { RelSizeCache::from_raw(&s.relsize, (s as *const Shared).add(1).cast::<RelSizeSlot>()) }
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
        pg_sys::RequestNamedLWLockTranche(TRANCHE.as_ptr(), 2);
    }
}

/// `AddinShmemInitLock`, a C macro for slot 21 of the main LWLock array (lwlocknames.txt).
///
/// # Safety
/// Called in a process attached to the main LWLock array.
pub unsafe fn addin_shmem_init_lock() -> *mut pg_sys::LWLock {
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
            let locks = pg_sys::GetNamedLWLockTranche(TRANCHE.as_ptr());
            (&raw mut (*p).relsize).write(RelSizeHeader::new(LwLocks::new(locks), relsize_capacity()));
            (*p).walproposer.message_lock = &raw mut (*locks.add(1)).lock;
        }
        SHARED.store(p, Ordering::Release);
        pg_sys::LWLockRelease(addin_shmem_init_lock());
    }
}

pub fn count(field: impl Fn(&SmgrCounters) -> &AtomicU64) {
    if let Some(s) = shared() {
        field(s.counters.mine()).fetch_add(1, Ordering::Relaxed);
    }
}

/// The total of one storage manager counter over every process (0 without shared memory).
pub fn total(field: impl Fn(&SmgrCounters) -> &AtomicU64) -> u64 {
    shared().map_or(0, |s| s.counters.sum(field))
}

impl WalProposerShared {
    /// Replaces the message (truncated to [`MESSAGE_MAX`] bytes at a character boundary).
    pub fn set_message(&self, text: &str) {
        let mut end = text.len().min(MESSAGE_MAX);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        // SAFETY: the lock was set up with the segment; the bytes are written only under it
        // in exclusive mode. LWLockAcquire can ERROR only on programming errors.
        unsafe {
            pg_sys::LWLockAcquire(self.message_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
            (&mut *self.message.get())[..end].copy_from_slice(&text.as_bytes()[..end]);
            self.message_len.store(end, Ordering::Relaxed);
            pg_sys::LWLockRelease(self.message_lock);
        }
    }

    /// Replaces the list of read replicas (the first [`REPLICAS_MAX`]).
    pub fn set_replicas(&self, list: &[ReplicaInfo], now_ms: u64) {
        fn fill(dst: &mut [u8], src: &str) -> u32 {
            let mut end = src.len().min(dst.len());
            while !src.is_char_boundary(end) {
                end -= 1;
            }
            dst[..end].copy_from_slice(&src.as_bytes()[..end]);
            end as u32
        }
        // SAFETY: as in set_message: the slots are written only under the lock, exclusive.
        unsafe {
            pg_sys::LWLockAcquire(self.message_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
            let slots = &mut *self.replicas.get();
            let n = list.len().min(REPLICAS_MAX);
            for (slot, r) in slots.iter_mut().zip(&list[..n]) {
                let mut s = ReplicaSlot {
                    name: [0; 128],
                    name_len: 0,
                    safekeeper_len: 0,
                    safekeeper: [0; 64],
                    flush_lsn: r.flush_lsn,
                    apply_lsn: r.apply_lsn,
                    xmin: r.xmin,
                    catalog_xmin: r.catalog_xmin,
                    age_ms: r.age_ms,
                };
                s.name_len = fill(&mut s.name, &r.name);
                s.safekeeper_len = fill(&mut s.safekeeper, &r.safekeeper);
                *slot = s;
            }
            self.replicas_len.store(n, Ordering::Relaxed);
            self.replicas_at_ms.store(now_ms, Ordering::Relaxed);
            pg_sys::LWLockRelease(self.message_lock);
        }
    }

    /// The read replicas last set, and when (Unix milliseconds; 0: never).
    pub fn replicas(&self) -> (Vec<ReplicaInfo>, u64) {
        // SAFETY: read under the lock in shared mode; see set_replicas.
        unsafe {
            pg_sys::LWLockAcquire(self.message_lock, pg_sys::LWLockMode::LW_SHARED);
            let slots = &*self.replicas.get();
            let n = self.replicas_len.load(Ordering::Relaxed).min(REPLICAS_MAX);
            let list = slots[..n]
                .iter()
                .map(|s| ReplicaInfo {
                    name: String::from_utf8_lossy(&s.name[..(s.name_len as usize).min(s.name.len())]).into_owned(),
                    safekeeper: String::from_utf8_lossy(&s.safekeeper[..(s.safekeeper_len as usize).min(s.safekeeper.len())]).into_owned(),
                    flush_lsn: s.flush_lsn,
                    apply_lsn: s.apply_lsn,
                    xmin: s.xmin,
                    catalog_xmin: s.catalog_xmin,
                    age_ms: s.age_ms,
                })
                .collect();
            let at = self.replicas_at_ms.load(Ordering::Relaxed);
            pg_sys::LWLockRelease(self.message_lock);
            (list, at)
        }
    }

    pub fn message(&self) -> String {
        // SAFETY: read under the lock in shared mode; see set_message.
        unsafe {
            pg_sys::LWLockAcquire(self.message_lock, pg_sys::LWLockMode::LW_SHARED);
            let len = self.message_len.load(Ordering::Relaxed).min(MESSAGE_MAX);
            let text = String::from_utf8_lossy(&(&*self.message.get())[..len]).into_owned();
            pg_sys::LWLockRelease(self.message_lock);
            text
        }
    }
}
