//! fjord's storage manager, installed through patch 0001's `smgr_select_hook`.
//!
//! Two modes, fixed at server start:
//! - **pass-through** (`fjord.pageserver_address` empty): every call goes to md.c after
//!   being counted; how the hook path is tested on a plain server.
//! - **pageserver mode**: permanent relations live on the pageserver. Temporary relations never
//!   reach us (the select hook gives them md.c); unlogged relations and every relation's
//!   free space map stay on local disk through md.c (below, "local").
//!
//! Relations on the pageserver (permanent ones, in pageserver mode):
//! - **read** is GetPage@LSN: `not_modified_since` is the block's last-written LSN from the
//!   shared cache (`cache.rs`), never below the last checkpoint's redo pointer (which is
//!   never below the LSN the compute started at, so a block untouched since the start asks
//!   for at least that version); `request_lsn` is the current insert position (in a read
//!   replica, the replay position: `replica.rs`). WAL up to
//!   `not_modified_since` is flushed first, so the pageserver can have it.
//! - **write** (a buffer leaving the pool, or a checkpoint) never ships the page. It
//!   records the page's LSN as the block's last-written LSN, except for pages whose
//!   content the WAL does not describe, which get a full-page image first (see
//!   [`needs_image`]): pages never WAL-logged (LSN 0 or GiST's build LSN 1: unlogged index
//!   builds of GIN, GiST and SP-GiST), heap pages holding tuples of running
//!   transactions (the cmin/cmax fix, below), and sequence pages (`nextval()` WAL-logs
//!   only every 32nd value; rebuilt from WAL a sequence would jump ahead). Visibility-map
//!   pages use the current position (`current_lsn`: the insert position, on a hot standby
//!   the end of the record being replayed): heap records and their redo clear map bits
//!   without touching the map page's LSN; so do new pages and heap pages with
//!   `PD_ALL_VISIBLE`, which `visibilitymap_set()` sets without stamping the heap page's
//!   LSN unless hint bits are WAL-logged. No image is written during the
//!   shutdown checkpoint, which PostgreSQL requires to be WAL-silent (compute_ctl runs a
//!   `CHECKPOINT` just before a fast shutdown so that sequences lose nothing).
//! - **extend, truncate, nblocks, exists, create, unlink** go through the shared
//!   relation-size cache; a size the cache lacks is asked of the pageserver once.
//! - **FSM forks are local.** PostgreSQL never WAL-logs the free space map, so it is kept
//!   in local md.c files; a new compute starts without one, which only costs free space
//!   until VACUUM rebuilds it (the pageserver does not store FSMs either).
//!
//! **cmin/cmax.** WAL records of heap changes do not carry command ids; redo writes
//! `FirstCommandId`. A page of a still-running transaction that left the pool and came
//! back rebuilt from WAL would lose its command ids, and the transaction would see its own
//! later changes from earlier commands (or miss earlier ones). We chose a full-page image
//! at eviction for heap pages with tuples whose inserting or deleting transaction is still
//! running: it needs no change to PostgreSQL or to the WAL format, and it costs WAL only
//! for pages that leave the pool mid-transaction (bulk loads into a small buffer pool; a
//! `COPY FREEZE` is exempt, its tuples are frozen). Changing heap WAL records to carry
//! command ids would be cheaper at run time but is a WAL format change.
//!
//! Invariants:
//! - Every callback is `#[pg_guard]`ed; md.c is called through `pg_guard_ffi_boundary`,
//!   so an ERROR raised anywhere unwinds through Rust frames and reaches PostgreSQL's
//!   error handling unchanged. A pageserver that cannot be reached is an ERROR for the
//!   query, never a crash.
//! - A relation's persistence is `reln->smgr_relpersistence` (set by patch 0005 where
//!   PostgreSQL knows it); when unknown it is decided once by looking for a local init
//!   or main fork (an unlogged relation has its main fork locally from its creation and
//!   its init fork, for an index, only after the build), and remembered in the field.
//! - DROP DATABASE removes a directory without unlinking relations one by one; an object
//!   access hook makes the relation-size cache forget the database's forks.
//! - A new relation never gets the relfilenode of a live permanent one: patch 0010's hook
//!   asks the pageserver about every candidate that has no local file.

use std::ffi::c_char;
use std::sync::atomic::{AtomicBool, Ordering};

use pgrx::pg_sys;
use pgrx::pg_sys::ffi::pg_guard_ffi_boundary;
use pgrx::prelude::*;
use proto::page::{page_flags, page_is_new, page_lower, page_set_lsn, page_special, PAGE_HEADER_BYTES};
use proto::pagestream::{ErrorCode, ReadLsns, Request, Response};
use proto::{BlockNumber, ForkNumber, Lsn, RelTag};

use crate::cache::{self, RelFork, SizeUpdate};
use crate::client::{self, ServerError};
use crate::file_cache::{self, BlockTag};
use crate::guc;
use crate::shmem::{self, count, Mine};

pub use crate::shmem::SmgrCounters;

const BLCKSZ: usize = pg_sys::BLCKSZ as usize;
// The page size fjord's wire protocols carry (`proto::page`) is this build's.
const _: () = assert!(BLCKSZ == proto::page::PAGE_SIZE_BYTES);

/// Whether permanent relations live on a pageserver (decided in the postmaster at preload,
/// inherited by every child).
static PAGESERVER_MODE: AtomicBool = AtomicBool::new(false);

pub fn counters() -> Option<&'static SmgrCounters> {
    shmem::shared().map(|s| s.counters.mine())
}

pub fn in_pageserver_mode() -> bool {
    PAGESERVER_MODE.load(Ordering::Relaxed)
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
    PAGESERVER_MODE.store(guc::pageserver_address().is_some(), Ordering::Relaxed);
    shmem::install_hooks();
    if in_pageserver_mode() {
        file_cache::install_hooks();
    }
    // SAFETY: single-threaded postmaster start-up.
    unsafe {
        pg_sys::smgr_select_hook = Some(fjord_smgr_select);
        pg_sys::relation_size_hook = Some(fjord_relation_size);
        pg_sys::database_size_hook = Some(fjord_database_size);
        pg_sys::relfilenode_in_use_hook = Some(fjord_relfilenode_in_use);
        PREV_OBJECT_ACCESS_HOOK = pg_sys::object_access_hook;
        pg_sys::object_access_hook = Some(fjord_object_access);
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
unsafe extern "C-unwind" fn fjord_smgr_select(rnode: pg_sys::RelFileNodeBackend) -> *const pg_sys::f_smgr {
    if in_pageserver_mode() && rnode.backend != pg_sys::InvalidBackendId {
        // Temporary relations are backend-local files, always.
        return std::ptr::null();
    }
    &FJORD_SMGR
}

/// md.c's table.
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
        #[allow(unused_unsafe, reason = "some expansions are already inside an unsafe block")]
        let result = unsafe { pg_guard_ffi_boundary(|| f($($arg),*)) };
        result
    }};
}

const FSM_FORKNUM: pg_sys::ForkNumber::Type = pg_sys::ForkNumber::FSM_FORKNUM;
const VM_FORKNUM: pg_sys::ForkNumber::Type = pg_sys::ForkNumber::VISIBILITYMAP_FORKNUM;
const INIT_FORKNUM: pg_sys::ForkNumber::Type = pg_sys::ForkNumber::INIT_FORKNUM;

/// Whether this fork of this relation is kept in local files rather than on the pageserver.
unsafe fn is_local(reln: pg_sys::SMgrRelation, forknum: pg_sys::ForkNumber::Type) -> bool {
    if !in_pageserver_mode() || forknum == FSM_FORKNUM {
        return true;
    }
    unsafe {
        match (*reln).smgr_relpersistence as u8 {
            b'p' => false,
            b'u' | b't' => true,
            _ => {
                // Unlogged relations have a local init fork, and a local main fork from
                // the moment they are created (an index's init fork comes only after its
                // build); permanent relations have neither.
                let unlogged = md_call!(smgr_exists(reln, INIT_FORKNUM)) || md_call!(smgr_exists(reln, pg_sys::ForkNumber::MAIN_FORKNUM));
                (*reln).smgr_relpersistence = if unlogged { b'u' } else { b'p' } as c_char;
                unlogged
            }
        }
    }
}

fn rel_fork(rnode: &pg_sys::RelFileNode, forknum: pg_sys::ForkNumber::Type) -> RelFork {
    RelFork { spcnode: rnode.spcNode.into(), dbnode: rnode.dbNode.into(), relnode: rnode.relNode.into(), forknum }
}

unsafe fn reln_fork(reln: pg_sys::SMgrRelation, forknum: pg_sys::ForkNumber::Type) -> RelFork {
    unsafe { rel_fork(&(*reln).smgr_rnode.node, forknum) }
}

fn rel_tag(r: &RelFork) -> RelTag {
    let forknum = ForkNumber::from_u8(r.forknum as u8).unwrap_or_else(|| error!("fjord: invalid fork number {}", r.forknum));
    RelTag { spcnode: r.spcnode, dbnode: r.dbnode, relnode: r.relnode, forknum }
}

fn describe(r: &RelFork) -> String {
    rel_tag(r).to_string()
}

fn insert_lsn() -> u64 {
    // SAFETY: plain reads of WAL positions under their own locks.
    unsafe { pg_sys::GetXLogInsertRecPtr() }
}

/// The newest WAL position the pages of this compute can reflect, for a write whose page
/// LSN may be older than the changes it holds: on a primary the insert position; on a hot
/// standby the end of the record being replayed, or of the last one replayed when none is.
/// A standby inserts no WAL (its insert position stands at 0), and replay changes a page
/// in a buffer only while it replays a record, so no buffer holds a change past this LSN.
/// Visibility-map bits cleared by heap redo (`visibilitymap_clear()`, on a map page that
/// is not a block of the record and keeps its LSN) are such changes.
fn current_lsn() -> u64 {
    // SAFETY: plain reads of WAL positions under their own spinlocks.
    unsafe {
        if pg_sys::RecoveryInProgress() {
            pg_sys::GetCurrentReplayRecPtr(std::ptr::null_mut())
        } else {
            pg_sys::GetXLogInsertRecPtr()
        }
    }
}

/// The LSNs of a read whose object was last changed at `last_written` (0: not since the
/// compute started).
fn read_lsns(last_written: u64) -> ReadLsns {
    if let Some(lsn) = guc::read_lsn() {
        // A read-only compute at a point in the past: everything is read as of then.
        return ReadLsns { request_lsn: Lsn(lsn), not_modified_since: Lsn(lsn) };
    }
    // SAFETY: plain calls into xlog.c; XLogFlush may ERROR, which unwinds normally.
    unsafe {
        let floor = pg_sys::GetRedoRecPtr();
        let nms = before_page_header(last_written.max(floor));
        let in_recovery = pg_sys::RecoveryInProgress();
        if !in_recovery && nms > pg_sys::GetFlushRecPtr(std::ptr::null_mut()) {
            pg_sys::XLogFlush(nms);
        }
        // A hot standby (read replica) reads at its replay position: pages as of the WAL it
        // has replayed, never newer (see `replica.rs`). A primary reads at its insert position.
        let request = if in_recovery { pg_sys::GetXLogReplayRecPtr(std::ptr::null_mut()).max(nms) } else { insert_lsn().max(nms) };
        ReadLsns { request_lsn: Lsn(request), not_modified_since: Lsn(nms) }
    }
}

/// An LSN right after a WAL page header (where `GetXLogInsertRecPtr()` puts "the next
/// record" when the last one ended at a page boundary) names the same point in WAL as
/// the boundary itself. The boundary is what can be flushed and what the pageserver
/// reaches by ingesting the record that ends there; the position after the header only
/// exists once another record is written.
fn before_page_header(lsn: u64) -> u64 {
    // fjord requires the default 16 MiB WAL segments (`proto::lsn::WAL_SEGMENT_SIZE_BYTES`).
    Lsn(lsn).previous_wal_end().0
}

fn server_error(what: &str, e: ServerError) -> ! {
    let code = match e.code {
        ErrorCode::NoSuchBlock => PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
        ErrorCode::LsnTimeout => PgSqlErrorCode::ERRCODE_QUERY_CANCELED,
        _ => PgSqlErrorCode::ERRCODE_IO_ERROR,
    };
    ereport!(PgLogLevel::ERROR, code, format!("fjord: pageserver failed {what}: {}", e.message));
    unreachable!("ereport(ERROR) does not return")
}

fn unexpected(what: &str, resp: Response) -> ! {
    error!("fjord: pageserver answered {what} with an unexpected message: {resp:?}")
}

/// The size of a fork on the pageserver, from the cache or else the pageserver.
fn pageserver_nblocks(r: &RelFork) -> u32 {
    if let Some(n) = cache::cached_size(r) {
        return n;
    }
    let lsns = read_lsns(cache::relation_changed(r));
    let what = || format!("getting the size of relation {}", describe(r));
    let rel = rel_tag(r);
    match client::request(&what, &|id| Request::Nblocks { id, lsns, rel }) {
        Ok(Response::Nblocks { nblocks, .. }) => cache::update_size(r, SizeUpdate::IfAbsent(nblocks)).unwrap_or(nblocks),
        Ok(other) => unexpected(&what(), other),
        Err(e) => server_error(&what(), e),
    }
}

fn pageserver_exists(r: &RelFork) -> bool {
    if cache::cached_size(r).is_some() {
        return true;
    }
    let lsns = read_lsns(cache::relation_changed(r));
    let what = || format!("checking whether relation {} exists", describe(r));
    let rel = rel_tag(r);
    match client::request(&what, &|id| Request::Exists { id, lsns, rel }) {
        Ok(Response::Exists { exists, .. }) => exists,
        Ok(other) => unexpected(&what(), other),
        Err(e) => server_error(&what(), e),
    }
}

fn page_lsn(page: &[u8]) -> u64 {
    proto::page::page_lsn(page).0
}

fn u16_at(page: &[u8], off: usize) -> u16 {
    u16::from_ne_bytes([page[off], page[off + 1]])
}

fn u32_at(page: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes(page[off..off + 4].try_into().expect("4 bytes"))
}

/// `GistBuildLSN`: the fake LSN GiST stamps on pages during an unlogged build; anything
/// at or below it was never WAL-logged.
const MAX_FAKE_LSN: u64 = 1;

/// Whether a page of a fork on the pageserver must be WAL-logged as a full-page image before it
/// leaves the pool, because the WAL does not describe its content. See the module doc.
fn needs_image(forknum: pg_sys::ForkNumber::Type, page: &[u8]) -> bool {
    if page_is_new(page) || forknum == VM_FORKNUM {
        return false;
    }
    if page_lsn(page) <= MAX_FAKE_LSN {
        return true;
    }
    forknum == pg_sys::ForkNumber::MAIN_FORKNUM && (is_sequence_page(page) || heap_page_has_running_xids(page))
}

/// A sequence's page: `nextval()` changes it in the buffer and WAL-logs only every 32nd
/// value (`SEQ_LOG_VALS`), so rebuilt from WAL it would jump ahead, as after a crash.
/// Its special space is the 4-byte `SEQ_MAGIC`, MAXALIGNed to 8.
fn is_sequence_page(page: &[u8]) -> bool {
    const SEQ_MAGIC: u32 = 0x1717;
    let pd_special = usize::from(page_special(page));
    // One line pointer, and the padding after the magic is zero (a GIN page whose
    // right-link happens to be 0x1717 has neither).
    pd_special == BLCKSZ - 8
        && u32_at(page, pd_special) == SEQ_MAGIC
        && u32_at(page, pd_special + 4) == 0
        && usize::from(page_lower(page)) == PAGE_HEADER_BYTES + 4
}

/// Whether a heap page holds a tuple inserted or deleted by a transaction that is still
/// running, whose command ids WAL redo would not restore. Pages with special space (every
/// index access method, sequences) are not heap pages and are skipped.
fn heap_page_has_running_xids(page: &[u8]) -> bool {
    const LP_NORMAL: u32 = 1;
    const HEAP_XMAX_KEYSHR_LOCK: u16 = 0x0010;
    const HEAP_XMAX_EXCL_LOCK: u16 = 0x0040;
    const HEAP_XMAX_LOCK_ONLY: u16 = 0x0080;
    const HEAP_XMIN_COMMITTED: u16 = 0x0100;
    const HEAP_XMIN_INVALID: u16 = 0x0200;
    const HEAP_XMAX_COMMITTED: u16 = 0x0400;
    const HEAP_XMAX_INVALID: u16 = 0x0800;
    const HEAP_XMAX_IS_MULTI: u16 = 0x1000;
    const HEAP_LOCK_MASK: u16 = HEAP_XMAX_KEYSHR_LOCK | HEAP_XMAX_EXCL_LOCK;
    const FIRST_NORMAL_XID: u32 = 3;

    let pd_lower = usize::from(page_lower(page));
    let pd_special = usize::from(page_special(page));
    if pd_special != BLCKSZ || !(PAGE_HEADER_BYTES..=BLCKSZ).contains(&pd_lower) {
        return false;
    }
    let mut checked: Option<(u32, bool)> = None;
    let mut running = |xid: u32| -> bool {
        if xid < FIRST_NORMAL_XID {
            return false;
        }
        if let Some((x, r)) = checked {
            if x == xid {
                return r;
            }
        }
        // SAFETY: reads the proc array under its own lock.
        let r = unsafe { pg_sys::TransactionIdIsInProgress(pg_sys::TransactionId::from(xid)) };
        checked = Some((xid, r));
        r
    };
    for item in (PAGE_HEADER_BYTES..pd_lower).step_by(4) {
        if item + 4 > pd_lower {
            break;
        }
        let id = u32_at(page, item);
        let (off, flags, len) = ((id & 0x7fff) as usize, (id >> 15) & 3, (id >> 17) as usize);
        if flags != LP_NORMAL || len < 23 || off + 24 > BLCKSZ {
            continue;
        }
        let xmin = u32_at(page, off);
        let xmax = u32_at(page, off + 4);
        let infomask = u16_at(page, off + 20);
        if infomask & (HEAP_XMIN_COMMITTED | HEAP_XMIN_INVALID) == 0 && running(xmin) {
            return true;
        }
        if infomask & (HEAP_XMAX_INVALID | HEAP_XMAX_COMMITTED) == 0 {
            let lock_only = infomask & HEAP_XMAX_LOCK_ONLY != 0 || infomask & (HEAP_XMAX_IS_MULTI | HEAP_LOCK_MASK) == HEAP_XMAX_EXCL_LOCK;
            if lock_only {
                continue;
            }
            if infomask & HEAP_XMAX_IS_MULTI != 0 || running(xmax) {
                return true;
            }
        }
    }
    false
}

/// A page of an index under an unlogged build that comes back from the pageserver carries
/// the LSN of the full-page image we wrote when it left the pool, but the build goes on
/// changing it without WAL. Giving it back its fake build LSN makes its next eviction
/// write an image again (and keeps GiST's build-time LSN/NSN logic as it was). Pages the
/// build's final `log_newpage_range()` logged have LSNs above every eviction image and
/// are left alone; a page misjudged as a build page only costs one more image.
fn restore_build_lsn(r: &RelFork, page: &mut [u8]) {
    let lsn = page_lsn(page);
    if lsn == 0 || page_is_new(page) {
        return;
    }
    if let Some((fake, newest_image)) = cache::build_images(r) {
        if lsn <= newest_image {
            page_set_lsn(page, Lsn(fake));
        }
    }
}

/// WAL-logs a copy of `page` as a full-page image and returns the record's end.
unsafe fn log_image(reln: pg_sys::SMgrRelation, forknum: pg_sys::ForkNumber::Type, blkno: pg_sys::BlockNumber, page: &[u8]) -> Option<u64> {
    unsafe {
        if !pg_sys::XLogInsertAllowed() || pg_sys::RecoveryInProgress() {
            return None;
        }
        if pg_sys::MyBackendType == pg_sys::BackendType::B_CHECKPOINTER && pg_sys::ShutdownRequestPending != 0 {
            // The shutdown checkpoint: PostgreSQL PANICs if any WAL is written between its
            // redo point and its record. No transaction runs any more (a prepared one runs
            // no further commands, so its command ids no longer matter) and index builds
            // are over; what is lost is a sequence's unlogged tail, which then skips up to
            // 32 values on the next compute, as after a crash of plain PostgreSQL.
            return None;
        }
        // A copy: log_newpage stamps the LSN on the page it is given, and the buffer is
        // only share-locked here.
        let mut copy = pg_sys::PGAlignedBlock::default();
        let dst = std::slice::from_raw_parts_mut(copy.data.as_mut_ptr().cast::<u8>(), BLCKSZ);
        dst.copy_from_slice(page);
        let mut rnode = (*reln).smgr_rnode.node;
        let lsn = pg_sys::log_newpage(&mut rnode, forknum, blkno, copy.data.as_mut_ptr(), true);
        count(|c| &c.eviction_fpis);
        Some(lsn)
    }
}

/// The LSN from which the WAL describes `page` as it is now, logging an image if needed.
unsafe fn written_lsn(reln: pg_sys::SMgrRelation, forknum: pg_sys::ForkNumber::Type, blkno: pg_sys::BlockNumber, page: &[u8]) -> u64 {
    if needs_image(forknum, page) {
        if let Some(lsn) = unsafe { log_image(reln, forknum, blkno, page) } {
            let page_lsn = page_lsn(page);
            if page_lsn <= MAX_FAKE_LSN {
                cache::note_build_image(unsafe { &reln_fork(reln, forknum) }, page_lsn, lsn);
            }
            return lsn;
        }
    }
    let lsn = page_lsn(page);
    if forknum == VM_FORKNUM || page_is_new(page) || lsn <= MAX_FAKE_LSN || heap_page_all_visible(forknum, page) {
        // Map bits cleared by heap records, or a zero page the WAL has not described yet:
        // everything up to now is the safe answer.
        lsn.max(current_lsn())
    } else {
        lsn
    }
}

/// A heap page with `PD_ALL_VISIBLE`: `visibilitymap_set()` sets the flag but stamps the
/// page's LSN only when hint bits are WAL-logged (checksums or `wal_log_hints`), so the
/// page's LSN may predate the record that set it. Such a page is read back at the insert
/// position of its eviction instead, which is after that record.
fn heap_page_all_visible(forknum: pg_sys::ForkNumber::Type, page: &[u8]) -> bool {
    const PD_ALL_VISIBLE: u16 = 0x0004;
    forknum == pg_sys::ForkNumber::MAIN_FORKNUM && usize::from(page_special(page)) == BLCKSZ && page_flags(page) & PD_ALL_VISIBLE != 0
}

unsafe fn page_slice<'a>(buffer: *const c_char) -> &'a [u8] {
    unsafe { std::slice::from_raw_parts(buffer.cast::<u8>(), BLCKSZ) }
}

#[pg_guard]
unsafe extern "C-unwind" fn fjord_open(reln: pg_sys::SMgrRelation) {
    count(|c| &c.relations_opened);
    // md.c's state is initialized for every relation: local forks use it.
    md_call!(smgr_open(reln))
}

#[pg_guard]
unsafe extern "C-unwind" fn fjord_close(reln: pg_sys::SMgrRelation, forknum: pg_sys::ForkNumber::Type) {
    md_call!(smgr_close(reln, forknum))
}

#[pg_guard]
unsafe extern "C-unwind" fn fjord_create(reln: pg_sys::SMgrRelation, forknum: pg_sys::ForkNumber::Type, is_redo: bool) {
    count(|c| &c.creates);
    unsafe {
        if in_pageserver_mode() && forknum == INIT_FORKNUM && (*reln).smgr_relpersistence as u8 != b'u' {
            // Only unlogged relations have an init fork: whatever we assumed, this
            // relation is local. Its main fork may already have been created on the pageserver.
            (*reln).smgr_relpersistence = b'u' as c_char;
            let main = reln_fork(reln, pg_sys::ForkNumber::MAIN_FORKNUM);
            cache::forget_size(&main);
            if !md_call!(smgr_exists(reln, pg_sys::ForkNumber::MAIN_FORKNUM)) {
                md_call!(smgr_create(reln, pg_sys::ForkNumber::MAIN_FORKNUM, is_redo));
            }
        }
        if is_local(reln, forknum) {
            return md_call!(smgr_create(reln, forknum, is_redo));
        }
        let r = reln_fork(reln, forknum);
        if cache::cached_size(&r).is_none() && !pageserver_exists(&r) {
            cache::update_size(&r, SizeUpdate::IfAbsent(0));
        }
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn fjord_exists(reln: pg_sys::SMgrRelation, forknum: pg_sys::ForkNumber::Type) -> bool {
    unsafe {
        if is_local(reln, forknum) {
            return md_call!(smgr_exists(reln, forknum));
        }
        pageserver_exists(&reln_fork(reln, forknum))
    }
}

/// Patch 0010's hook: whether a relfilenode that has no local file is in use on the
/// pageserver. `GetNewRelFileNode()` asks it for every candidate it would otherwise take
/// (one request per new relation), so that after OID wraparound a new relation never gets
/// the relfilenode of a live one whose OID differs (a rewritten table): PostgreSQL's own
/// check looks only for a local file, and a compute has none for permanent relations.
/// Temporary and unlogged relations have local files, which that check already sees.
#[pg_guard]
unsafe extern "C-unwind" fn fjord_relfilenode_in_use(rnode: pg_sys::RelFileNodeBackend) -> bool {
    if !in_pageserver_mode() || rnode.backend != pg_sys::InvalidBackendId {
        return false;
    }
    pageserver_exists(&rel_fork(&rnode.node, pg_sys::ForkNumber::MAIN_FORKNUM))
}

#[pg_guard]
unsafe extern "C-unwind" fn fjord_unlink(rnode: pg_sys::RelFileNodeBackend, forknum: pg_sys::ForkNumber::Type, is_redo: bool) {
    count(|c| &c.unlinks);
    // Local files may exist for any relation (its FSM, or all of it if unlogged); md.c
    // ignores the ones that do not.
    md_call!(smgr_unlink(rnode, forknum, is_redo));
    if in_pageserver_mode() {
        let r = rel_fork(&rnode.node, forknum);
        match cache::cached_size(&r) {
            Some(n) => file_cache::invalidate_blocks(&r, 0, n),
            None => file_cache::invalidate_fork(&r),
        }
        cache::forget_size(&r);
        cache::set_relation_changed(&r, current_lsn());
    }
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
    unsafe {
        if is_local(reln, forknum) {
            return md_call!(smgr_extend(reln, forknum, blocknum, buffer, skip_fsync));
        }
        let r = reln_fork(reln, forknum);
        let lsn = written_lsn(reln, forknum, blocknum, page_slice(buffer));
        file_cache::store(&BlockTag { rel: r, blkno: blocknum }, page_slice(buffer), current_lsn());
        cache::set_last_written(&r, blocknum, lsn);
        cache::set_relation_changed(&r, lsn);
        cache::update_size(&r, SizeUpdate::AtLeast(blocknum + 1));
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn fjord_prefetch(
    reln: pg_sys::SMgrRelation,
    forknum: pg_sys::ForkNumber::Type,
    blocknum: pg_sys::BlockNumber,
) -> bool {
    unsafe {
        if is_local(reln, forknum) {
            return md_call!(smgr_prefetch(reln, forknum, blocknum));
        }
    }
    unsafe { prefetch_block(&reln_fork(reln, forknum), blocknum) };
    true
}

/// Sends a GetPage ahead for a block that is neither in the local file cache nor already
/// on its way. See `client::prefetch`.
fn prefetch_block(r: &RelFork, blocknum: u32) -> bool {
    if file_cache::contains(&BlockTag { rel: *r, blkno: blocknum }) {
        return true;
    }
    let rel = rel_tag(r);
    let blkno = BlockNumber(blocknum);
    if client::is_queued(rel, blkno) {
        return true;
    }
    client::prefetch(rel, blkno, read_lsns(cache::last_written(r, blocknum)))
}

/// Whether a page prefetched with `lsns` is still the block's newest version. The
/// pageserver may answer with any version from `not_modified_since` up to the request LSN
/// (they are the same as long as the promise holds), so the page is only known to include
/// changes up to `not_modified_since`. A prefetch is sent without looking at the buffer
/// pool: the block may have been in a buffer, changed there after `not_modified_since`.
/// Such a change can only reach a read of the block through the buffer being written out,
/// which raises the block's last-written LSN past `not_modified_since` (the LSN of the
/// change); a truncation or an unlink raises the fork's. So the page is used only if
/// neither rose above it. A compute at a fixed LSN never changes anything.
fn prefetch_still_valid(r: &RelFork, blocknum: u32, lsns: &ReadLsns) -> bool {
    if guc::read_lsn().is_some() {
        return true;
    }
    let known = lsns.not_modified_since.0;
    cache::last_written(r, blocknum) <= known && cache::relation_changed(r) <= known
}

/// Sequential reads of a fork, per backend: after [`READAHEAD_AFTER`] consecutive blocks,
/// GetPage requests for the next blocks are sent ahead (a window growing from 8 to
/// [`READAHEAD_MAX`] blocks, never past the fork's cached size), so that a scan waits for
/// one round trip per window instead of one per block. Nothing in PostgreSQL's scans
/// changes. `fjord.readahead` (blocks, 0 = off) caps the window.
struct Stream {
    rel: RelFork,
    last: u32,
    run: u32,
    /// Blocks below this were already considered for prefetching.
    ahead: u32,
}

const READAHEAD_AFTER: u32 = 2;
const READAHEAD_MAX: u32 = 32;
const STREAMS: usize = 8;

thread_local! {
    static STREAMS_SEEN: std::cell::RefCell<(Vec<Stream>, usize)> = const { std::cell::RefCell::new((Vec::new(), 0)) };
}

fn readahead(r: &RelFork, blocknum: u32) {
    let cap = u32::try_from(guc::READAHEAD_BLOCKS.get()).unwrap_or(0).min(READAHEAD_MAX);
    if cap == 0 {
        return;
    }
    let range = STREAMS_SEEN.with(|s| {
        let (streams, next) = &mut *s.borrow_mut();
        let i = match streams.iter().position(|st| st.rel == *r) {
            Some(i) => i,
            None if streams.len() < STREAMS => {
                streams.push(Stream { rel: *r, last: blocknum, run: 0, ahead: 0 });
                return None;
            }
            None => {
                let i = *next;
                *next = (*next + 1) % STREAMS;
                streams[i] = Stream { rel: *r, last: blocknum, run: 0, ahead: 0 };
                return None;
            }
        };
        let st = &mut streams[i];
        if blocknum == st.last.wrapping_add(1) {
            st.run = st.run.saturating_add(1);
        } else {
            st.run = 0;
            st.ahead = 0;
        }
        st.last = blocknum;
        if st.run < READAHEAD_AFTER {
            return None;
        }
        let window = (8u32 << (st.run - READAHEAD_AFTER).min(2)).min(cap);
        let from = st.ahead.max(blocknum + 1);
        let to = blocknum.saturating_add(1 + window);
        // Keep the queue refilled in steps, not one block per read.
        if from >= to || to - from < window / 2 {
            return None;
        }
        st.ahead = to;
        Some((from, to))
    });
    let Some((from, to)) = range else { return };
    let Some(nblocks) = cache::cached_size(r) else { return };
    for b in from..to.min(nblocks) {
        if !prefetch_block(r, b) {
            break;
        }
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn fjord_read(
    reln: pg_sys::SMgrRelation,
    forknum: pg_sys::ForkNumber::Type,
    blocknum: pg_sys::BlockNumber,
    buffer: *mut c_char,
) {
    count(|c| &c.reads);
    unsafe {
        if is_local(reln, forknum) {
            return md_call!(smgr_read(reln, forknum, blocknum, buffer));
        }
        let r = reln_fork(reln, forknum);
        let out = std::slice::from_raw_parts_mut(buffer.cast::<u8>(), BLCKSZ);
        let tag = BlockTag { rel: r, blkno: blocknum };
        readahead(&r, blocknum);
        if file_cache::read(&tag, out) {
            return;
        }
        let rel = rel_tag(&r);
        let blkno = BlockNumber(blocknum);
        if let Some(page) = client::take_prefetched(rel, blkno, |lsns| prefetch_still_valid(&r, blocknum, lsns)) {
            out.copy_from_slice(&page);
            restore_build_lsn(&r, out);
            file_cache::store(&tag, out, current_lsn());
            return;
        }
        let lsns = read_lsns(cache::last_written(&r, blocknum));
        let what = || format!("reading block {blocknum} of relation {}", describe(&r));
        let started = std::time::Instant::now();
        let answer = client::request(&what, &|id| Request::GetPage { id, lsns, rel, blkno });
        if let Some(c) = counters() {
            c.observe_getpage(started.elapsed());
        }
        match answer {
            Ok(Response::Page { page, .. }) if page.len() == BLCKSZ => {
                out.copy_from_slice(&page);
                restore_build_lsn(&r, out);
                file_cache::store(&tag, out, current_lsn());
            }
            Ok(other) => unexpected(&what(), other),
            Err(e) if e.code == ErrorCode::NoSuchBlock && cache::cached_size(&r).is_some_and(|n| blocknum < n) => {
                // Extended here with a zero page that no WAL has described yet.
                out.fill(0);
            }
            Err(e) => server_error(&what(), e),
        }
    }
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
    unsafe {
        if is_local(reln, forknum) {
            return md_call!(smgr_write(reln, forknum, blocknum, buffer, skip_fsync));
        }
        let r = reln_fork(reln, forknum);
        let lsn = written_lsn(reln, forknum, blocknum, page_slice(buffer));
        file_cache::store(&BlockTag { rel: r, blkno: blocknum }, page_slice(buffer), current_lsn());
        cache::set_last_written(&r, blocknum, lsn);
        // md.c lets a write land past the end (CREATE DATABASE copies that way).
        cache::update_size(&r, SizeUpdate::AtLeastIfCached(blocknum + 1));
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn fjord_writeback(
    reln: pg_sys::SMgrRelation,
    forknum: pg_sys::ForkNumber::Type,
    blocknum: pg_sys::BlockNumber,
    nblocks: pg_sys::BlockNumber,
) {
    unsafe {
        if is_local(reln, forknum) {
            md_call!(smgr_writeback(reln, forknum, blocknum, nblocks))
        }
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn fjord_nblocks(reln: pg_sys::SMgrRelation, forknum: pg_sys::ForkNumber::Type) -> pg_sys::BlockNumber {
    count(|c| &c.nblocks);
    unsafe {
        if is_local(reln, forknum) {
            return md_call!(smgr_nblocks(reln, forknum));
        }
        pageserver_nblocks(&reln_fork(reln, forknum))
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn fjord_truncate(
    reln: pg_sys::SMgrRelation,
    forknum: pg_sys::ForkNumber::Type,
    old_blocks: pg_sys::BlockNumber,
    nblocks: pg_sys::BlockNumber,
) {
    count(|c| &c.truncates);
    unsafe {
        if is_local(reln, forknum) {
            return md_call!(smgr_truncate(reln, forknum, old_blocks, nblocks));
        }
        // The truncation's WAL record was inserted before we were called.
        let r = reln_fork(reln, forknum);
        let end = old_blocks.max(cache::cached_size(&r).unwrap_or(0));
        file_cache::invalidate_blocks(&r, nblocks, end);
        cache::update_size(&r, SizeUpdate::Set(nblocks));
        cache::set_relation_changed(&r, current_lsn());
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn fjord_immedsync(reln: pg_sys::SMgrRelation, forknum: pg_sys::ForkNumber::Type) {
    unsafe {
        if is_local(reln, forknum) {
            md_call!(smgr_immedsync(reln, forknum))
        }
        // Forks on the pageserver are durable through the WAL.
    }
}

/// `pg_relation_size` and friends (patch 0007): forks on the pageserver have no local files to stat.
#[pg_guard]
unsafe extern "C-unwind" fn fjord_relation_size(
    rnode: pg_sys::RelFileNode,
    backend: pg_sys::BackendId,
    forknum: pg_sys::ForkNumber::Type,
) -> i64 {
    if !in_pageserver_mode() || backend != pg_sys::InvalidBackendId {
        return -1;
    }
    unsafe {
        let reln = pg_sys::smgropen(rnode, backend);
        if is_local(reln, forknum) {
            return -1;
        }
        let r = reln_fork(reln, forknum);
        if !pageserver_exists(&r) {
            return 0;
        }
        i64::from(pageserver_nblocks(&r)) * BLCKSZ as i64
    }
}

/// `pg_database_size` (patch 0007): the pageserver's count of the database's stored
/// relation forks. Local files (free space maps, unlogged relations) are not included.
#[pg_guard]
unsafe extern "C-unwind" fn fjord_database_size(db_oid: pg_sys::Oid) -> i64 {
    if !in_pageserver_mode() {
        return -1;
    }
    let lsns = read_lsns(current_lsn());
    let dbnode: u32 = db_oid.into();
    let what = || format!("getting the size of database {dbnode}");
    match client::request(&what, &|id| Request::DbSize { id, lsns, spcnode: 1663, dbnode }) {
        Ok(Response::DbSize { size_bytes, .. }) => i64::try_from(size_bytes).unwrap_or(i64::MAX),
        Ok(other) => unexpected(&what(), other),
        Err(e) => server_error(&what(), e),
    }
}

static mut PREV_OBJECT_ACCESS_HOOK: pg_sys::object_access_hook_type = None;

/// DROP DATABASE removes the database's directory without unlinking relation by relation,
/// so the relation-size cache forgets the database's forks here.
#[pg_guard]
unsafe extern "C-unwind" fn fjord_object_access(
    access: pg_sys::ObjectAccessType::Type,
    class_id: pg_sys::Oid,
    object_id: pg_sys::Oid,
    sub_id: std::ffi::c_int,
    arg: *mut std::ffi::c_void,
) {
    unsafe {
        if let Some(prev) = PREV_OBJECT_ACCESS_HOOK {
            pg_guard_ffi_boundary(|| prev(access, class_id, object_id, sub_id, arg));
        }
    }
    if in_pageserver_mode() && access == pg_sys::ObjectAccessType::OAT_DROP && class_id == pg_sys::DatabaseRelationId {
        cache::forget_database(object_id.into());
        file_cache::invalidate_database(object_id.into());
    }
}
