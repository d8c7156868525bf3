//! The local file cache (LFC): pages of permanent relations on the compute's own disk,
//! between shared_buffers and the pageserver.
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
//! drops the fork, DROP DATABASE drops the database's blocks. Valid entries are also
//! counted per hash of their fork, so dropping a fork the cache holds nothing of (most
//! forks a DROP TABLE unlinks: the visibility map or init fork that never existed, with
//! no cached size to bound the drop) costs one load, not a walk over the whole index.
//!
//! **Layout.** One file of `fjord.file_cache_size` bytes (`fjord.file_cache_path`), cut
//! into 8 KiB slots. The index is in shared memory, split into stripes: each stripe owns
//! every `stripes`-th slot, a chained hash table over them, a clock hand and one LWLock.
//! (Interleaved, so that a cache that is not full uses the beginning of the file and of the
//! index, not the start of each stripe's run: a smaller OS page cache tree to walk and
//! fewer TLB misses on every read.) A block
//! hashes to one stripe; a read takes that stripe's lock shared (many readers at once), a
//! store takes it exclusive. No lock covers more than one stripe, so reads and writes of
//! different blocks rarely meet (up to 1024 stripes). The page is read and written while the
//! stripe's lock is held, which is what keeps a slot from being reused under a reader; a
//! read from the OS page cache takes microseconds.
//!
//! **Eviction** is per stripe: a clock over its slots, a used slot getting a second chance.
//!
//! **Each entry carries a dependency LSN**: the WAL insert position when the page was
//! stored, an upper bound on every record the page's content (hint bits included) can
//! reflect. It matters only when a saved cache is reused after a restart (see
//! `compute_ctl`'s `file_cache` module and `proto::filecache`): a page is reused only if
//! everything it depends on is durable.
//!
//! **Checksums.** Each entry carries the CRC-32C of its page, computed when it is stored. A
//! page restored from before a restart is checked against it the first time it is read: a
//! cache file damaged while the compute was down is never served (the page is dropped and
//! read from the pageserver). A page this server stored is not checked again on each read:
//! its bytes are the ones this server wrote, which is the trust plain PostgreSQL gives its
//! own data files (with data checksums on, PostgreSQL verifies every page the storage
//! manager returns anyway). Checking every read cost about 0.9 µs per select-only
//! transaction (`docs/benchmarks.md`).
//!
//! **Failure is never a wrong page.** A missing directory, a file that cannot be created
//! or sized, or a failed read or write (a full disk) turns the cache off with one log line
//! and every read goes to the pageserver, as without a cache.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::OnceLock;

use pgrx::pg_sys;
use pgrx::prelude::*;

use proto::filecache::{SavedEntry, SavedIndex};
use proto::{Lsn, TenantId, TimelineId};

use crate::cache::{fork_slot, hash_fork, mix, RelFork};
use crate::guc;
use crate::shmem::{Padded, PerProcess};

const BLCKSZ: usize = pg_sys::BLCKSZ as usize;
const NONE: u32 = u32::MAX;
const MAX_STRIPES: usize = 1024;
/// A stripe holds at least this many slots (fewer stripes for a small cache).
const MIN_SLOTS_PER_STRIPE: usize = 32;
const TRANCHE: &std::ffi::CStr = c"fjord_file_cache";
/// Slots of `FileCacheShared::fork_entries`.
const FORK_COUNT_SLOTS: usize = 1 << 14;

/// Counters since the server started.
#[derive(Default)]
#[repr(C)]
pub struct FileCacheCounters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub stores: AtomicU64,
    pub evictions: AtomicU64,
    pub invalidations: AtomicU64,
    /// Entries loaded from a saved cache at start.
    pub restored: AtomicU64,
    /// Reads whose page failed its CRC (a damaged cache file); served from the pageserver.
    pub checksum_failures: AtomicU64,
}

/// The header of the cache's shared memory; stripes, buckets and entries follow it. What
/// every read looks at comes first and changes only when the cache is turned off; what
/// stores change, and the per-process counters, are in cache lines of their own.
#[repr(C)]
pub struct FileCacheShared {
    /// Slots in use by the index (`stripes * per_stripe`); the file has this many pages.
    pub slots: usize,
    stripes: usize,
    per_stripe: usize,
    /// False once the cache is off (never configured, or turned off after an error).
    enabled: AtomicBool,
    locks: *mut pg_sys::LWLockPadded,
    /// Valid entries.
    pub used: Padded<AtomicU64>,
    /// Set by the first eviction, which logs that the cache is full.
    full_logged: AtomicBool,
    pub counters: PerProcess<FileCacheCounters>,
    /// Valid entries per hash of their fork (`fork_count`): a sum over the forks hashing to
    /// a slot, so a zero says that a fork has no entry at all, and dropping it needs no look
    /// at the index. Changed under the entry's stripe lock, by any stripe.
    fork_entries: [AtomicU32; FORK_COUNT_SLOTS],
}

/// One slot's index entry. Fields change only under the stripe's exclusive lock, except
/// `usage`, which readers set under the shared lock; atomics make both plain loads.
#[repr(C)]
struct Entry {
    spcnode: AtomicU32,
    dbnode: AtomicU32,
    relnode: AtomicU32,
    forknum: AtomicU32,
    blkno: AtomicU32,
    /// The next entry in this entry's hash chain, or `NONE`.
    next: AtomicU32,
    /// CRC-32C of the page in the slot: checked when an entry restored from before a restart
    /// is first read, and saved with the index at a clean shutdown.
    crc: AtomicU32,
    dep_lsn: AtomicU64,
    valid: AtomicU8,
    usage: AtomicU8,
    /// 1 once the slot's bytes are known to be what this server wrote: stored by it, or
    /// restored and read back with a matching CRC. See [`read`].
    verified: AtomicU8,
}

/// A block of a relation fork.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockTag {
    pub rel: RelFork,
    pub blkno: u32,
}

static SHARED: AtomicPtr<FileCacheShared> = AtomicPtr::new(ptr::null_mut());

/// The configured size in pages (0: no cache). `fjord.file_cache_size` is in MB; -1 picks
/// an eighth of the machine's memory, at most 4 GiB and a quarter of the free disk (the
/// OS page cache is what makes a cached page as fast to read as plain PostgreSQL's), or
/// the size of the cache file already there if it is within those bounds.
fn configured_slots() -> usize {
    if !crate::smgr::is_remote() {
        return 0;
    }
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

/// Stripes and slots per stripe for `slots` pages.
fn geometry(slots: usize) -> (usize, usize) {
    if slots == 0 {
        return (0, 0);
    }
    let stripes = (slots / MIN_SLOTS_PER_STRIPE).clamp(1, MAX_STRIPES);
    (stripes, slots / stripes)
}

fn shmem_size(slots: usize) -> usize {
    let (stripes, per_stripe) = geometry(slots);
    let n = stripes * per_stripe;
    // The padding that aligns the entries after the u32 hands and buckets.
    let padding = align_of::<Entry>();
    size_of::<FileCacheShared>() + stripes * size_of::<StripeState>() + n * size_of::<AtomicU32>() + padding + n * size_of::<Entry>()
}

/// Shared memory and locks to ask for in `shmem_request_hook`.
pub fn request_shmem() {
    let slots = configured_slots();
    let (stripes, _) = geometry(slots);
    // SAFETY: called from the shmem request hook in the postmaster.
    unsafe {
        pg_sys::RequestAddinShmemSpace(shmem_size(slots));
        pg_sys::RequestNamedLWLockTranche(TRANCHE.as_ptr(), stripes.max(1) as i32);
    }
}

/// Sets up the index in `shmem_startup_hook` (under `AddinShmemInitLock`) and, in the
/// postmaster, prepares the file.
///
/// # Safety
/// Called from the shmem startup hook with `AddinShmemInitLock` held.
pub unsafe fn startup() {
    let slots = configured_slots();
    let (stripes, per_stripe) = geometry(slots);
    let size = shmem_size(slots);
    unsafe {
        let mut found = false;
        let p = pg_sys::ShmemInitStruct(c"fjord file cache".as_ptr(), size, &mut found).cast::<FileCacheShared>();
        if !found {
            // Zero bytes: no entry valid, every counter 0, every hand at slot 0. Chains
            // need NONE in every bucket, set below.
            ptr::write_bytes(p.cast::<u8>(), 0, size);
            (*p).slots = stripes * per_stripe;
            (*p).stripes = stripes;
            (*p).per_stripe = per_stripe;
            (*p).locks = pg_sys::GetNamedLWLockTranche(TRANCHE.as_ptr());
            let fc = &*p;
            for b in buckets(fc) {
                b.store(NONE, Ordering::Relaxed);
            }
            for e in entries(fc) {
                e.next.store(NONE, Ordering::Relaxed);
            }
            if fc.slots > 0 {
                // Whatever happens below, a saved index is used at most once.
                let saved = take_saved_index();
                match prepare_file(fc.slots) {
                    Ok(kept) => {
                        fc.enabled.store(true, Ordering::Release);
                        if let Some(saved) = saved.filter(|_| kept) {
                            restore(fc, saved);
                        }
                        register_save_at_exit();
                    }
                    Err(why) => log!("fjord: the local file cache is off: {why}"),
                }
            }
        }
        SHARED.store(p, Ordering::Release);
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

/// Puts the entries of a saved index back (postmaster start, before any other process).
fn restore(fc: &FileCacheShared, saved: SavedIndex) {
    if Some((saved.tenant, saved.timeline)) != timeline_ids() || saved.slots != fc.slots as u64 {
        log!("fjord: the local file cache starts empty: its saved index is for another timeline or cache size");
        return;
    }
    let entries = entries(fc);
    let mut restored = 0u64;
    for e in &saved.entries {
        let tag = BlockTag {
            rel: RelFork { spcnode: e.spcnode, dbnode: e.dbnode, relnode: e.relnode, forknum: i32::from(e.forknum) },
            blkno: e.blkno,
        };
        let (stripe, bucket) = place(fc, &tag);
        let slot = e.slot as usize;
        // Same size, same hash: a slot is always in its block's stripe. One that is not
        // was not written by us; `decode` already refused duplicates.
        if stripe_of(fc, slot) != stripe || entries[slot].valid.load(Ordering::Relaxed) != 0 {
            continue;
        }
        let entry = &entries[slot];
        entry.set_tag(&tag);
        entry.dep_lsn.store(e.dep_lsn.0, Ordering::Relaxed);
        entry.crc.store(e.page_crc, Ordering::Relaxed);
        entry.next.store(buckets(fc)[bucket].load(Ordering::Relaxed), Ordering::Relaxed);
        buckets(fc)[bucket].store(slot as u32, Ordering::Relaxed);
        entry.valid.store(1, Ordering::Relaxed);
        fork_count(fc, &tag.rel).fetch_add(1, Ordering::AcqRel);
        stripes(fc)[stripe].used.fetch_add(1, Ordering::Relaxed);
        restored += 1;
    }
    fc.used.0.store(restored, Ordering::Relaxed);
    fc.counters.mine().restored.store(restored, Ordering::Relaxed);
    log!("fjord: the local file cache reuses {restored} pages from before the restart (durable up to {})", saved.durable_lsn);
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
    let fc = shared().ok_or("it is off")?;
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
    let entries: Vec<SavedEntry> = entries(fc)
        .iter()
        .enumerate()
        .filter(|(_, e)| e.valid.load(Ordering::Relaxed) != 0)
        .map(|(slot, e)| {
            let t = e.tag();
            SavedEntry {
                spcnode: t.rel.spcnode,
                dbnode: t.rel.dbnode,
                relnode: t.rel.relnode,
                forknum: t.rel.forknum as u8,
                blkno: t.blkno,
                slot: slot as u32,
                page_crc: e.crc.load(Ordering::Relaxed),
                dep_lsn: Lsn(e.dep_lsn.load(Ordering::Relaxed)),
            }
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
    let saved = SavedIndex { tenant, timeline, slots: fc.slots as u64, durable_lsn: Lsn(durable), valid_lsn: shutdown_checkpoint, entries };
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

fn shared() -> Option<&'static FileCacheShared> {
    // SAFETY: null, or a header in shared memory that lives as long as the process.
    let fc = unsafe { SHARED.load(Ordering::Acquire).as_ref()? };
    fc.enabled.load(Ordering::Relaxed).then_some(fc)
}

/// The header even when the cache is off (for status).
pub fn status() -> Option<(&'static FileCacheShared, bool)> {
    // SAFETY: as in `shared`.
    let fc = unsafe { SHARED.load(Ordering::Acquire).as_ref()? };
    Some((fc, fc.enabled.load(Ordering::Relaxed)))
}

/// A stripe's clock hand, how many of its slots are in use, and where to start looking for
/// a free one; under the stripe's lock.
#[repr(C)]
struct StripeState {
    hand: AtomicU32,
    used: AtomicU32,
    /// The slot (`k` of the stripe) after the last one a store took while the stripe was not
    /// full: a filling stripe takes its slots in order, so looking from here finds a free
    /// one at once instead of walking past every slot already taken.
    free_hint: AtomicU32,
}

fn fork_count<'a>(fc: &'a FileCacheShared, rel: &RelFork) -> &'a AtomicU32 {
    &fc.fork_entries[fork_slot(rel, FORK_COUNT_SLOTS)]
}

/// Whether the cache may hold a block of `rel` (false: certainly none).
fn may_hold(fc: &FileCacheShared, rel: &RelFork) -> bool {
    fork_count(fc, rel).load(Ordering::Acquire) != 0
}

fn stripes(fc: &FileCacheShared) -> &[StripeState] {
    // SAFETY: the stripe states follow the header; the segment was sized by `shmem_size`.
    unsafe { std::slice::from_raw_parts((fc as *const FileCacheShared).add(1).cast::<StripeState>(), fc.stripes) }
}

fn buckets(fc: &FileCacheShared) -> &[AtomicU32] {
    // SAFETY: the buckets follow the stripe states.
    unsafe { std::slice::from_raw_parts(stripes(fc).as_ptr().add(fc.stripes).cast::<AtomicU32>(), fc.slots) }
}

fn entries(fc: &FileCacheShared) -> &[Entry] {
    // SAFETY: the entries follow the buckets, aligned up for `Entry` (`shmem_size` counts
    // the padding).
    unsafe {
        let after = buckets(fc).as_ptr().add(fc.slots).cast::<u8>();
        let aligned = after.add(after.align_offset(align_of::<Entry>()));
        std::slice::from_raw_parts(aligned.cast::<Entry>(), fc.slots)
    }
}

/// The stripe and bucket (an index into `buckets`) of a block.
fn place(fc: &FileCacheShared, tag: &BlockTag) -> (usize, usize) {
    let h = mix(hash_fork(&tag.rel) ^ u64::from(tag.blkno).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let stripe = (h as usize) % fc.stripes;
    let bucket = ((h >> 32) as usize) % fc.per_stripe;
    (stripe, stripe * fc.per_stripe + bucket)
}

impl Entry {
    fn is(&self, tag: &BlockTag) -> bool {
        self.valid.load(Ordering::Relaxed) != 0
            && self.blkno.load(Ordering::Relaxed) == tag.blkno
            && self.relnode.load(Ordering::Relaxed) == tag.rel.relnode
            && self.dbnode.load(Ordering::Relaxed) == tag.rel.dbnode
            && self.spcnode.load(Ordering::Relaxed) == tag.rel.spcnode
            && self.forknum.load(Ordering::Relaxed) == tag.rel.forknum as u32
    }

    fn tag(&self) -> BlockTag {
        BlockTag {
            rel: RelFork {
                spcnode: self.spcnode.load(Ordering::Relaxed),
                dbnode: self.dbnode.load(Ordering::Relaxed),
                relnode: self.relnode.load(Ordering::Relaxed),
                forknum: self.forknum.load(Ordering::Relaxed) as i32,
            },
            blkno: self.blkno.load(Ordering::Relaxed),
        }
    }

    fn set_tag(&self, tag: &BlockTag) {
        self.spcnode.store(tag.rel.spcnode, Ordering::Relaxed);
        self.dbnode.store(tag.rel.dbnode, Ordering::Relaxed);
        self.relnode.store(tag.rel.relnode, Ordering::Relaxed);
        self.forknum.store(tag.rel.forknum as u32, Ordering::Relaxed);
        self.blkno.store(tag.blkno, Ordering::Relaxed);
    }
}

/// A stripe's LWLock, held for the life of the value.
struct StripeLock {
    lock: *mut pg_sys::LWLock,
}

impl StripeLock {
    fn new(fc: &FileCacheShared, stripe: usize, exclusive: bool) -> StripeLock {
        let mode = if exclusive { pg_sys::LWLockMode::LW_EXCLUSIVE } else { pg_sys::LWLockMode::LW_SHARED };
        // SAFETY: the tranche has one lock per stripe and lives as long as the server;
        // PostgreSQL's error cleanup releases it if an ERROR unwinds through us.
        unsafe {
            let lock = &raw mut (*fc.locks.add(stripe)).lock;
            pg_sys::LWLockAcquire(lock, mode);
            StripeLock { lock }
        }
    }
}

impl Drop for StripeLock {
    fn drop(&mut self) {
        // SAFETY: acquired in `new`; after an ERROR PostgreSQL may have released it.
        unsafe {
            if pg_sys::LWLockHeldByMe(self.lock) {
                pg_sys::LWLockRelease(self.lock);
            }
        }
    }
}

/// The entry holding `tag` in its bucket's chain. Needs the stripe's lock.
fn find(fc: &FileCacheShared, bucket: usize, tag: &BlockTag) -> Option<usize> {
    let entries = entries(fc);
    let mut i = buckets(fc)[bucket].load(Ordering::Relaxed);
    while i != NONE {
        let e = &entries[i as usize];
        if e.is(tag) {
            return Some(i as usize);
        }
        i = e.next.load(Ordering::Relaxed);
    }
    None
}

/// Removes entry `i` from its chain and marks it free. Needs the stripe's exclusive lock.
fn unlink(fc: &FileCacheShared, i: usize) {
    let entries = entries(fc);
    let e = &entries[i];
    if e.valid.load(Ordering::Relaxed) == 0 {
        return;
    }
    let (_, bucket) = place(fc, &e.tag());
    let head = &buckets(fc)[bucket];
    let next = e.next.load(Ordering::Relaxed);
    if head.load(Ordering::Relaxed) == i as u32 {
        head.store(next, Ordering::Relaxed);
    } else {
        let mut j = head.load(Ordering::Relaxed);
        while j != NONE {
            let prev = &entries[j as usize];
            if prev.next.load(Ordering::Relaxed) == i as u32 {
                prev.next.store(next, Ordering::Relaxed);
                break;
            }
            j = prev.next.load(Ordering::Relaxed);
        }
    }
    e.next.store(NONE, Ordering::Relaxed);
    e.valid.store(0, Ordering::Relaxed);
    e.verified.store(0, Ordering::Relaxed);
    fork_count(fc, &e.tag().rel).fetch_sub(1, Ordering::AcqRel);
    fc.used.0.fetch_sub(1, Ordering::Relaxed);
    stripes(fc)[stripe_of(fc, i)].used.fetch_sub(1, Ordering::Relaxed);
}

/// Slot `k` of `stripe` (a stripe's slots are interleaved with the others').
fn slot_of(fc: &FileCacheShared, stripe: usize, k: usize) -> usize {
    k * fc.stripes + stripe
}

/// The stripe that owns slot `i`.
fn stripe_of(fc: &FileCacheShared, i: usize) -> usize {
    i % fc.stripes
}

/// Picks a slot of `stripe` for a new entry, marked used: a free one while there is one,
/// else the clock's victim (unlinked). Needs the stripe's exclusive lock.
fn victim(fc: &FileCacheShared, stripe: usize) -> usize {
    let entries = entries(fc);
    let state = &stripes(fc)[stripe];
    let slot = if (state.used.load(Ordering::Relaxed) as usize) < fc.per_stripe {
        let from = state.free_hint.load(Ordering::Relaxed) as usize % fc.per_stripe;
        let k = (from..fc.per_stripe).chain(0..from).find(|&k| entries[slot_of(fc, stripe, k)].valid.load(Ordering::Relaxed) == 0);
        if let Some(k) = k {
            state.free_hint.store(((k + 1) % fc.per_stripe) as u32, Ordering::Relaxed);
        }
        k.map(|k| slot_of(fc, stripe, k))
    } else {
        None
    };
    let slot = slot.unwrap_or_else(|| clock(fc, stripe));
    state.used.fetch_add(1, Ordering::Relaxed);
    slot
}

/// The clock's victim in a full stripe, unlinked.
fn clock(fc: &FileCacheShared, stripe: usize) -> usize {
    let entries = entries(fc);
    let hand = &stripes(fc)[stripe].hand;
    // Two sweeps: the first clears every usage bit it passes.
    for _ in 0..2 * fc.per_stripe + 1 {
        let h = hand.load(Ordering::Relaxed) as usize % fc.per_stripe;
        hand.store(((h + 1) % fc.per_stripe) as u32, Ordering::Relaxed);
        let i = slot_of(fc, stripe, h);
        let e = &entries[i];
        if e.valid.load(Ordering::Relaxed) == 0 {
            return i;
        }
        if e.usage.swap(0, Ordering::Relaxed) == 0 {
            unlink(fc, i);
            fc.counters.mine().evictions.fetch_add(1, Ordering::Relaxed);
            if !fc.full_logged.swap(true, Ordering::Relaxed) {
                log!(
                    "fjord: the local file cache is full ({} MB); from now on the least recently used pages make room and are read from the pageserver again",
                    (fc.slots * BLCKSZ) >> 20
                );
            }
            return i;
        }
    }
    unreachable!("a clock sweep over a stripe always finds a slot");
}

/// This process's handle on the cache file, opened on first use.
fn file(fc: &FileCacheShared) -> Option<&'static File> {
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
fn turn_off(fc: &FileCacheShared, why: &str) {
    if fc.enabled.swap(false, Ordering::AcqRel) {
        warning!("fjord: the local file cache is off from now on: {why}; pages are read from the pageserver");
    }
}

/// Copies the cached page of `tag` into `out` and returns true, or returns false (a miss,
/// or no cache).
pub fn read(tag: &BlockTag, out: &mut [u8]) -> bool {
    let Some(fc) = shared() else { return false };
    let Some(file) = file(fc) else { return false };
    let (stripe, bucket) = place(fc, tag);
    let _lock = StripeLock::new(fc, stripe, false);
    let Some(i) = find(fc, bucket, tag) else {
        fc.counters.mine().misses.fetch_add(1, Ordering::Relaxed);
        return false;
    };
    let e = &entries(fc)[i];
    match file.read_exact_at(out, (i * BLCKSZ) as u64) {
        Ok(()) if e.verified.load(Ordering::Relaxed) != 0 || crc32c::crc32c(out) == e.crc.load(Ordering::Relaxed) => {
            // Stores only on change: a hot entry's line is not written by every reader.
            if e.usage.load(Ordering::Relaxed) == 0 {
                e.usage.store(1, Ordering::Relaxed);
            }
            if e.verified.load(Ordering::Relaxed) == 0 {
                e.verified.store(1, Ordering::Relaxed);
            }
            fc.counters.mine().hits.fetch_add(1, Ordering::Relaxed);
            true
        }
        Ok(()) => {
            // Damaged on disk: never served. The entry goes; the read goes to the pageserver.
            drop(_lock);
            warning!(
                "fjord: page in slot {i} of the local file cache \"{}\" (block {} of {}/{}/{} fork {}) fails its checksum; reading it from the pageserver",
                cache_path().display(),
                tag.blkno,
                tag.rel.spcnode,
                tag.rel.dbnode,
                tag.rel.relnode,
                tag.rel.forknum
            );
            fc.counters.mine().checksum_failures.fetch_add(1, Ordering::Relaxed);
            invalidate(fc, tag);
            false
        }
        Err(e) => {
            turn_off(fc, &format!("reading slot {i} of \"{}\" failed: {e}", cache_path().display()));
            false
        }
    }
}

/// Whether `tag` is cached (without reading it).
pub fn contains(tag: &BlockTag) -> bool {
    let Some(fc) = shared() else { return false };
    let (stripe, bucket) = place(fc, tag);
    let _lock = StripeLock::new(fc, stripe, false);
    find(fc, bucket, tag).is_some()
}

/// Stores `page` as the newest version of `tag`, which depends on no WAL past `dep_lsn`.
pub fn store(tag: &BlockTag, page: &[u8], dep_lsn: u64) {
    let Some(fc) = shared() else { return };
    let Some(file) = file(fc) else { return };
    let (stripe, bucket) = place(fc, tag);
    let _lock = StripeLock::new(fc, stripe, true);
    let entries = entries(fc);
    let i = match find(fc, bucket, tag) {
        Some(i) => i,
        None => {
            let i = victim(fc, stripe);
            let e = &entries[i];
            e.set_tag(tag);
            e.next.store(buckets(fc)[bucket].load(Ordering::Relaxed), Ordering::Relaxed);
            buckets(fc)[bucket].store(i as u32, Ordering::Relaxed);
            e.valid.store(1, Ordering::Relaxed);
            fork_count(fc, &tag.rel).fetch_add(1, Ordering::AcqRel);
            fc.used.0.fetch_add(1, Ordering::Relaxed);
            i
        }
    };
    let e = &entries[i];
    if let Err(err) = file.write_all_at(page, (i * BLCKSZ) as u64) {
        unlink(fc, i);
        turn_off(fc, &format!("writing slot {i} of \"{}\" failed: {err}", cache_path().display()));
        return;
    }
    e.crc.store(crc32c::crc32c(page), Ordering::Relaxed);
    e.verified.store(1, Ordering::Relaxed);
    e.dep_lsn.store(dep_lsn, Ordering::Relaxed);
    e.usage.store(1, Ordering::Relaxed);
    fc.counters.mine().stores.fetch_add(1, Ordering::Relaxed);
}

/// Drops `tag` if cached.
fn invalidate(fc: &FileCacheShared, tag: &BlockTag) {
    let (stripe, bucket) = place(fc, tag);
    let _lock = StripeLock::new(fc, stripe, true);
    if let Some(i) = find(fc, bucket, tag) {
        unlink(fc, i);
        fc.counters.mine().invalidations.fetch_add(1, Ordering::Relaxed);
    }
}

/// Drops every entry `pred` selects, one stripe at a time.
fn invalidate_where(fc: &FileCacheShared, pred: impl Fn(&BlockTag) -> bool) {
    let entries = entries(fc);
    for stripe in 0..fc.stripes {
        let _lock = StripeLock::new(fc, stripe, true);
        for i in (0..fc.per_stripe).map(|k| slot_of(fc, stripe, k)) {
            let e = &entries[i];
            if e.valid.load(Ordering::Relaxed) != 0 && pred(&e.tag()) {
                unlink(fc, i);
                fc.counters.mine().invalidations.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Drops blocks `from..to` of `rel` (a truncation; an unlink with a known size).
pub fn invalidate_blocks(rel: &RelFork, from: u32, to: u32) {
    let Some(fc) = shared() else { return };
    if from >= to || !may_hold(fc, rel) {
        return;
    }
    if (to - from) as usize > fc.slots {
        // Cheaper to look at every slot than at every block.
        return invalidate_where(fc, |t| t.rel == *rel && (from..to).contains(&t.blkno));
    }
    for blkno in from..to {
        invalidate(fc, &BlockTag { rel: *rel, blkno });
    }
}

/// Drops every block of `rel` (an unlink whose size is not known).
pub fn invalidate_fork(rel: &RelFork) {
    if let Some(fc) = shared().filter(|fc| may_hold(fc, rel)) {
        invalidate_where(fc, |t| t.rel == *rel);
    }
}

/// Drops every block of database `dbnode` (DROP DATABASE).
pub fn invalidate_database(dbnode: u32) {
    if let Some(fc) = shared() {
        invalidate_where(fc, |t| t.rel.dbnode == dbnode);
    }
}
