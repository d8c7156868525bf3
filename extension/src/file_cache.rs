//! The local file cache (LFC): pages of permanent relations on the compute's own disk,
//! between shared_buffers and the pageserver. The index and its rules (stripes, clock
//! eviction, checksums of restored pages, which entries of a saved index are reused) are
//! `compute_caches::file_cache`; this module is its shell: the settings, the index's shared
//! memory and LWLocks, the cache file's I/O, saving the index at a clean shutdown and
//! loading what compute_ctl kept, and the log lines.
//!
//! **What it holds.** For every cached block, the newest version of the page as this
//! compute knows it, exactly what a buffer for the block would hold. It is filled on both
//! sides of the buffer pool: a page read from the pageserver is stored after the read, a
//! page leaving the pool (`smgrwrite`, `smgrextend`) is stored as written. A read that
//! finds the block here never reaches the network. This is correct in a compute because it
//! is its timeline's only writer and every change to a page passes through the buffer
//! pool: a block is read through the storage manager only when no buffer holds it, and
//! whatever buffer held it last wrote its newest version here (a clean buffer was never
//! changed since it was read, and the read stored it). The paths around the buffer pool
//! drop what they make stale: truncation drops the blocks past the new end, an unlink
//! drops the fork, DROP DATABASE drops the database's blocks.
//!
//! **Layout.** One file of `fjord.file_cache_size` bytes (`fjord.file_cache_path`), cut
//! into 8 KiB slots; the index in shared memory, with one LWLock per stripe (the tranche
//! `fjord_file_cache`). The page is read and written while the stripe's lock is held,
//! which is what keeps a slot from being reused under a reader; a read from the OS page
//! cache takes microseconds.
//!
//! **Each entry carries a dependency LSN**: the WAL insert position when the page was
//! stored. It matters only when a saved cache is reused after a restart (see
//! `compute_ctl`'s `file_cache` module and `proto::filecache`): a page is reused only if
//! everything it depends on is durable.
//!
//! **Checksums.** A page restored from before a restart is checked against its CRC the
//! first time it is read: a cache file damaged while the compute was down is never served
//! (the page is dropped and read from the pageserver). A page this server stored is not
//! checked again on each read: its bytes are the ones this server wrote, which is the trust
//! plain PostgreSQL gives its own data files (with data checksums on, PostgreSQL verifies
//! every page the storage manager returns anyway). Checking every read cost about 0.9 µs
//! per select-only transaction (`docs/benchmarks.md`).
//!
//! **Failure is never a wrong page.** A missing directory, a file that cannot be created
//! or sized, or a failed read or write (a full disk) turns the cache off with one log line
//! and every read goes to the pageserver, as without a cache.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::OnceLock;

use compute_caches::file_cache::{self, FileCacheHeader, FileCacheIndex, Read, SavedSlot, StoreFailed};
use pgrx::pg_sys;
use pgrx::pg_sys::ffi::pg_guard_ffi_boundary;
use pgrx::prelude::*;

use proto::filecache::{SavedEntry, SavedIndex};
use proto::{Lsn, TenantId, TimelineId};

use crate::guc;
use crate::shmem::{process_number, LwLocks};

pub use compute_caches::file_cache::FileCacheCounters;
pub use compute_caches::{BlockTag, RelFork};

const BLCKSZ: usize = pg_sys::BLCKSZ as usize;
const TRANCHE: &std::ffi::CStr = c"fjord_file_cache";

/// The index's region in shared memory (null until the startup hook ran).
static REGION: AtomicPtr<u8> = AtomicPtr::new(ptr::null_mut());

/// The size in pages the request hook asked shared memory and a lock per stripe for: the
/// startup hook lays the index out for exactly that (it runs again after a crash, without
/// the request hook), since an automatic size depends on the free disk, which changes.
static REQUESTED_SLOTS: AtomicUsize = AtomicUsize::new(0);

/// The configured size in pages (0: no cache). `fjord.file_cache_size` is in MB; -1 picks
/// an eighth of the machine's memory, at most 4 GiB and a quarter of the free disk (the
/// OS page cache is what makes a cached page as fast to read as plain PostgreSQL's), or
/// the size of the cache file already there if it is within those bounds.
fn configured_slots() -> usize {
    let mb = guc::FILE_CACHE_SIZE_MB.get();
    let bytes: u64 = if mb >= 0 { (mb as u64) << 20 } else { auto_size_bytes() };
    usize::try_from(bytes / BLCKSZ as u64).unwrap_or(0)
}

fn auto_size_bytes() -> u64 {
    // SAFETY: sysconf and statvfs only read system information.
    let ram = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES).max(0) as u64) * (libc::sysconf(libc::_SC_PAGESIZE).max(0) as u64) };
    let cap = (ram / 8).min(4 << 30);
    // An existing cache keeps its size: the free disk changes (the cache itself uses it),
    // and a cache of another size is discarded at start.
    if let Ok(meta) = std::fs::metadata(cache_path()) {
        let len = meta.len();
        if len > 0 && len <= cap && len % BLCKSZ as u64 == 0 {
            return len;
        }
    }
    match free_disk_bytes(&cache_path()) {
        Some(free) => cap.min(free / 4),
        None => cap,
    }
}

fn free_disk_bytes(path: &Path) -> Option<u64> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statvfs writes into the struct we pass.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        (libc::statvfs(c.as_ptr(), &mut st) == 0).then(|| st.f_bavail as u64 * st.f_frsize as u64)
    }
}

/// `fjord.file_cache_path`, relative to the data directory when not absolute.
pub fn cache_path() -> PathBuf {
    PathBuf::from(guc::file_cache_path().unwrap_or_else(|| "fjord_file_cache".into()))
}

/// Installs the hooks that request and set up the index's shared memory (after the
/// segment of `shmem`, whose hooks were installed first). Called from `_PG_init` in the
/// postmaster, in pageserver mode only: without a pageserver there is no file cache.
pub fn install_hooks() {
    // SAFETY: single-threaded postmaster start-up; we chain to whatever was installed before.
    unsafe {
        PREV_SHMEM_REQUEST_HOOK = pg_sys::shmem_request_hook;
        pg_sys::shmem_request_hook = Some(shmem_request);
        PREV_SHMEM_STARTUP_HOOK = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(shmem_startup);
    }
}

static mut PREV_SHMEM_REQUEST_HOOK: pg_sys::shmem_request_hook_type = None;
static mut PREV_SHMEM_STARTUP_HOOK: pg_sys::shmem_startup_hook_type = None;

/// Shared memory and a lock per stripe.
#[pg_guard]
unsafe extern "C-unwind" fn shmem_request() {
    unsafe {
        if let Some(prev) = PREV_SHMEM_REQUEST_HOOK {
            pg_guard_ffi_boundary(|| prev());
        }
    }
    let slots = configured_slots();
    REQUESTED_SLOTS.store(slots, Ordering::Relaxed);
    let (stripes, _) = file_cache::geometry(slots);
    // SAFETY: called from the shmem request hook in the postmaster. ShmemAlloc aligns every
    // allocation to a cache line, the alignment the region needs.
    unsafe {
        pg_sys::RequestAddinShmemSpace(file_cache::region_size::<LwLocks>(slots));
        pg_sys::RequestNamedLWLockTranche(TRANCHE.as_ptr(), stripes.max(1) as i32);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn shmem_startup() {
    unsafe {
        if let Some(prev) = PREV_SHMEM_STARTUP_HOOK {
            pg_guard_ffi_boundary(|| prev());
        }
        pg_sys::LWLockAcquire(crate::shmem::addin_shmem_init_lock(), pg_sys::LWLockMode::LW_EXCLUSIVE);
        startup();
        pg_sys::LWLockRelease(crate::shmem::addin_shmem_init_lock());
    }
}

/// Sets up the index and, in the postmaster, prepares the file.
///
/// # Safety
/// Called from the shmem startup hook with `AddinShmemInitLock` held.
unsafe fn startup() {
    let slots = REQUESTED_SLOTS.load(Ordering::Relaxed);
    let size = file_cache::region_size::<LwLocks>(slots);
    unsafe {
        let mut found = false;
        let region = pg_sys::ShmemInitStruct(c"fjord file cache".as_ptr(), size, &mut found).cast::<u8>();
        if !found {
            let locks = LwLocks::new(pg_sys::GetNamedLWLockTranche(TRANCHE.as_ptr()));
            let index = FileCacheIndex::init(region, slots, locks);
            let slots = index.header().slots();
            if slots > 0 {
                // Whatever happens below, a saved index is used at most once.
                let saved = take_saved_index();
                match prepare_file(slots) {
                    Ok(kept) => {
                        index.header().enable();
                        if let Some(saved) = saved.filter(|_| kept) {
                            restore(&index, saved);
                        }
                        register_save_at_exit();
                    }
                    Err(why) => log!("fjord: the local file cache is off: {why}"),
                }
            }
        }
        REGION.store(region, Ordering::Release);
    }
}

/// Creates or resizes the cache file so that it has exactly `slots` pages, and says whether
/// its contents were kept. Contents of a file of the wrong size are discarded.
fn prepare_file(slots: usize) -> Result<bool, String> {
    let path = cache_path();
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(format!("its directory \"{}\" does not exist (fjord.file_cache_path)", dir.display()));
    }
    let want = (slots * BLCKSZ) as u64;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| format!("cannot open \"{}\": {e}", path.display()))?;
    let len = file.metadata().map_err(|e| format!("cannot stat \"{}\": {e}", path.display()))?.len();
    if len != want {
        if len != 0 {
            log!(
                "fjord: the local file cache \"{}\" has {len} bytes, {want} expected (fjord.file_cache_size changed?); its contents are discarded",
                path.display()
            );
        }
        // A sparse file: disk is used only as pages are stored.
        file.set_len(0).and_then(|()| file.set_len(want)).map_err(|e| format!("cannot size \"{}\": {e}", path.display()))?;
    }
    log!("fjord: local file cache \"{}\", {} MB", path.display(), want >> 20);
    Ok(len == want)
}

/// `<cache file>.index`: written at a clean shutdown, read by compute_ctl.
pub fn saved_index_path() -> PathBuf {
    suffixed(".index")
}

/// `<cache file>.ready`: what compute_ctl kept of the saved index, loaded at start.
pub fn ready_index_path() -> PathBuf {
    suffixed(".ready")
}

fn suffixed(suffix: &str) -> PathBuf {
    let mut p = cache_path().into_os_string();
    p.push(suffix);
    PathBuf::from(p)
}

/// Removes both index files (the cache file is about to change, so neither may be used
/// again) and returns the validated one compute_ctl left, if any.
fn take_saved_index() -> Option<SavedIndex> {
    let _ = std::fs::remove_file(saved_index_path());
    let ready = ready_index_path();
    let bytes = match std::fs::read(&ready) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            log!("fjord: the local file cache starts empty: cannot read \"{}\": {e}", ready.display());
            let _ = std::fs::remove_file(&ready);
            return None;
        }
    };
    let _ = std::fs::remove_file(&ready);
    match SavedIndex::decode(&bytes) {
        Ok(saved) => Some(saved),
        Err(e) => {
            log!("fjord: the local file cache starts empty: \"{}\" is not usable: {e}", ready.display());
            None
        }
    }
}

/// The tenant and timeline this compute serves, if set and valid.
fn timeline_ids() -> Option<(TenantId, TimelineId)> {
    let tenant = guc::tenant_id()?.trim().parse().ok()?;
    let timeline = guc::timeline_id()?.trim().parse().ok()?;
    Some((tenant, timeline))
}

/// Puts the entries of a saved index back (postmaster start, before any other process),
/// if it is for this timeline; which entries are reused is `FileCacheIndex::restore`'s rule.
fn restore(index: &FileCacheIndex<'_, LwLocks>, saved: SavedIndex) {
    let entries = saved.entries.iter().map(|e| SavedSlot {
        tag: BlockTag {
            rel: RelFork { spcnode: e.spcnode, dbnode: e.dbnode, relnode: e.relnode, forknum: i32::from(e.forknum) },
            blkno: e.blkno,
        },
        slot: e.slot,
        crc: e.page_crc,
        dep_lsn: e.dep_lsn.0,
    });
    let restored = if Some((saved.tenant, saved.timeline)) == timeline_ids() { index.restore(saved.slots, entries) } else { None };
    match restored {
        Some(restored) => {
            log!("fjord: the local file cache reuses {restored} pages from before the restart (durable up to {})", saved.durable_lsn)
        }
        None => log!("fjord: the local file cache starts empty: its saved index is for another timeline or cache size"),
    }
}

fn register_save_at_exit() {
    static REGISTERED: AtomicBool = AtomicBool::new(false);
    if !REGISTERED.swap(true, Ordering::Relaxed) {
        // SAFETY: registering an exit callback in the postmaster; children forget it
        // (`on_exit_reset` in `InitPostmasterChild`).
        unsafe { pg_sys::before_shmem_exit(Some(save_at_exit), pg_sys::Datum::from(0)) };
    }
}

/// At the postmaster's exit: after a clean shutdown, syncs the cache file and writes the
/// saved index for the next start (see `proto::filecache` for why that is safe).
#[pg_guard]
unsafe extern "C-unwind" fn save_at_exit(_code: std::ffi::c_int, _arg: pg_sys::Datum) {
    // SAFETY: only the postmaster registered this, and it runs after every child exited.
    if unsafe { pg_sys::IsUnderPostmaster } {
        return;
    }
    match save() {
        Ok(msg) => log!("fjord: {msg}"),
        Err(why) => log!("fjord: the local file cache is not kept for the next start: {why}"),
    }
}

fn save() -> Result<String, String> {
    let index = index().ok_or("it is off")?;
    if guc::read_lsn().is_some() {
        return Err("a compute at a past LSN does not keep it".into());
    }
    let (tenant, timeline) = timeline_ids().ok_or("no valid fjord.tenant_id / fjord.timeline_id")?;
    // What a majority of safekeepers acknowledged: the worker publishes `commit_lsn` on its
    // poll only, while the proposer's thread announces each new commit LSN at once
    // (`proposer_commit_lsn`); at shutdown the worker's copy can lag the last commits, and
    // a lower durable LSN throws away pages for nothing.
    let durable = crate::shmem::shared().map_or(0, |s| {
        let wp = &s.walproposer;
        wp.commit_lsn.load(Ordering::Acquire).max(wp.proposer_commit_lsn.0.load(Ordering::Acquire))
    });
    if durable == 0 {
        return Err("no WAL is known to be on a majority of safekeepers (without fjord.safekeepers nothing is kept)".into());
    }
    let Some(shutdown_checkpoint) = clean_shutdown_checkpoint() else {
        return Err("the server did not shut down cleanly".into());
    };
    // No other process is left: the index is read without its locks.
    let entries: Vec<SavedEntry> = index
        .saved_slots()
        .map(|s| SavedEntry {
            spcnode: s.tag.rel.spcnode,
            dbnode: s.tag.rel.dbnode,
            relnode: s.tag.rel.relnode,
            forknum: s.tag.rel.forknum as u8,
            blkno: s.tag.blkno,
            slot: s.slot,
            page_crc: s.crc,
            dep_lsn: Lsn(s.dep_lsn),
        })
        .collect();
    let path = cache_path();
    // The pages first: an index must never name a page that a power loss could undo.
    OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|f| f.sync_data())
        .map_err(|e| format!("cannot sync \"{}\": {e}", path.display()))?;
    let n = entries.len();
    // Every entry is its block's newest version as of the shutdown checkpoint (the module
    // doc of `proto::filecache` says why), so the next start asks only what changed after it.
    let saved = SavedIndex {
        tenant,
        timeline,
        slots: index.header().slots() as u64,
        durable_lsn: Lsn(durable),
        valid_lsn: shutdown_checkpoint,
        entries,
    };
    let index = saved_index_path();
    crashsafe::write_file_atomic(&index, &saved.encode()).map_err(|e| format!("cannot write \"{}\": {e}", index.display()))?;
    Ok(format!("saved the local file cache's index for the next start: {n} pages, WAL durable up to {}", Lsn(durable)))
}

/// The shutdown checkpoint's LSN if `pg_control` on disk says the server shut down cleanly
/// (written by the shutdown checkpoint; a crash or an immediate shutdown leaves it "in
/// production").
fn clean_shutdown_checkpoint() -> Option<Lsn> {
    // SAFETY: get_controlfile reads and checks the file in the data directory; the
    // postmaster's working directory is the data directory.
    unsafe {
        let mut crc_ok = false;
        let cf = pg_sys::get_controlfile(pg_sys::DataDir, &mut crc_ok);
        (!cf.is_null() && crc_ok && (*cf).state == pg_sys::DBState::DB_SHUTDOWNED).then(|| Lsn((*cf).checkPoint))
    }
}

/// The index, if the cache is on, counting into this process's counters.
fn index() -> Option<FileCacheIndex<'static, LwLocks>> {
    let region = REGION.load(Ordering::Acquire);
    if region.is_null() {
        return None;
    }
    // SAFETY: the startup hook made the index in this region, which lives as long as the
    // process.
    let index = unsafe { FileCacheIndex::attach(region, process_number()) };
    index.header().enabled().then_some(index)
}

/// The header even when the cache is off (for status).
pub fn status() -> Option<&'static FileCacheHeader<LwLocks>> {
    let region = REGION.load(Ordering::Acquire);
    // SAFETY: as in `index`.
    (!region.is_null()).then(|| unsafe { FileCacheIndex::<LwLocks>::attach(region, 0) }.header())
}

/// This process's handle on the cache file, opened on first use.
fn file(fc: &FileCacheHeader<LwLocks>) -> Option<&'static File> {
    static FILE: OnceLock<Option<File>> = OnceLock::new();
    FILE.get_or_init(|| match OpenOptions::new().read(true).write(true).open(cache_path()) {
        Ok(f) => Some(f),
        Err(e) => {
            turn_off(fc, &format!("cannot open \"{}\": {e}", cache_path().display()));
            None
        }
    })
    .as_ref()
}

/// Turns the cache off for every process, with one log line.
fn turn_off(fc: &FileCacheHeader<LwLocks>, why: &str) {
    if fc.disable() {
        warning!("fjord: the local file cache is off from now on: {why}; pages are read from the pageserver");
    }
}

/// Copies the cached page of `tag` into `out` and returns true, or returns false (a miss,
/// or no cache).
pub fn read(tag: &BlockTag, out: &mut [u8]) -> bool {
    let Some(index) = index() else { return false };
    let Some(file) = file(index.header()) else { return false };
    match index.read(tag, out, |slot, out| file.read_exact_at(out, (slot * BLCKSZ) as u64)) {
        Read::Hit => true,
        Read::Miss => false,
        Read::Damaged { slot } => {
            warning!(
                "fjord: page in slot {slot} of the local file cache \"{}\" (block {} of {}/{}/{} fork {}) fails its checksum; reading it from the pageserver",
                cache_path().display(),
                tag.blkno,
                tag.rel.spcnode,
                tag.rel.dbnode,
                tag.rel.relnode,
                tag.rel.forknum
            );
            false
        }
        Read::Failed { slot, error } => {
            turn_off(index.header(), &format!("reading slot {slot} of \"{}\" failed: {error}", cache_path().display()));
            false
        }
    }
}

/// Whether `tag` is cached (without reading it).
pub fn contains(tag: &BlockTag) -> bool {
    index().is_some_and(|index| index.contains(tag))
}

/// Stores `page` as the newest version of `tag`, which depends on no WAL past `dep_lsn`.
pub fn store(tag: &BlockTag, page: &[u8], dep_lsn: u64) {
    let Some(index) = index() else { return };
    let Some(file) = file(index.header()) else { return };
    match index.store(tag, page, dep_lsn, |slot, page| file.write_all_at(page, (slot * BLCKSZ) as u64)) {
        Ok(stored) => {
            if stored.first_eviction {
                log!(
                    "fjord: the local file cache is full ({} MB); from now on the least recently used pages make room and are read from the pageserver again",
                    (index.header().slots() * BLCKSZ) >> 20
                );
            }
        }
        Err(StoreFailed { slot, error }) => {
            turn_off(index.header(), &format!("writing slot {slot} of \"{}\" failed: {error}", cache_path().display()));
        }
    }
}

/// Drops blocks `from..to` of `rel` (a truncation; an unlink with a known size).
pub fn invalidate_blocks(rel: &RelFork, from: u32, to: u32) {
    if let Some(index) = index() {
        index.invalidate_blocks(rel, from, to);
    }
}

/// Drops every block of `rel` (an unlink whose size is not known).
pub fn invalidate_fork(rel: &RelFork) {
    if let Some(index) = index() {
        index.invalidate_fork(rel);
    }
}

/// Drops every block of database `dbnode` (DROP DATABASE).
pub fn invalidate_database(dbnode: u32) {
    if let Some(index) = index() {
        index.invalidate_database(dbnode);
    }
}
