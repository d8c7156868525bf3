//! The two shared caches behind the remote storage manager.
//!
//! **Last-written LSN.** A page that leaves the buffer pool is not sent anywhere; its
//! WAL is. A later read must ask the pageserver for a version at least as new as the
//! page's last change, and should not ask for more (the pageserver would wait for WAL it
//! does not need). Each block hashes to one of `LWLSN_SLOTS` slots holding the highest
//! LSN written by any block that hashes there, and its fork to one of `LWLSN_FORK_SLOTS`
//! slots holding the highest LSN written by any block of any fork that hashes there. Each
//! is an over-estimate, never an under-estimate, and so is the smaller of the two, which
//! is what a read uses: reads are always correct and at worst wait a little. The fork
//! level is what keeps a bulk load from making other relations' reads wait: the load's
//! pages fill a good part of the block slots with LSNs near the end of WAL, and a block of
//! another relation that is not local (a catalog page ANALYZE reads, say) would otherwise
//! ask the pageserver for a version it is still ingesting. A relation fork's size changes
//! (extend, truncate, unlink) are tracked the same way under the block number
//! `u32::MAX`. A slot never written reads as 0; callers raise it to a floor no older than
//! the compute's start LSN (see `smgr::read_lsns`).
//!
//! **Relation size.** The size of every permanent relation fork this compute extends,
//! creates, truncates or asks about, in an open-addressing table in shared memory under
//! one LWLock. Entries are never evicted: a fork extended with a zero page the WAL has
//! not yet described is longer here than on the pageserver, and this cache is the only
//! place that knows. A full table is an ERROR naming the setting to raise. Entries are
//! removed when the fork is unlinked. Each backend also keeps the sizes it looked up,
//! valid while the table's generation (`Shared::relsize_generation`) is the one it read
//! them at: every change of a size, and every removal, raises the generation under the
//! exclusive lock, so a backend that learns of a change through any lock or
//! through its own call sees the new generation and looks again. The planner asks for
//! sizes at every query, and every write of a page asks to raise its fork's size; with no
//! size changing, each costs one atomic load, not a lock every backend takes.

use std::sync::atomic::Ordering;

use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::shmem::{self, relsize_entries, RelSizeEntry, Shared, LWLSN_FORK_SLOTS, LWLSN_SLOTS};

/// A relation fork: (tablespace, database, relfilenode, fork).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RelFork {
    pub spcnode: u32,
    pub dbnode: u32,
    pub relnode: u32,
    pub forknum: i32,
}

/// The block number under which a fork's size changes are tracked.
const RELATION_BLOCK: u32 = u32::MAX;

pub(crate) fn mix(mut h: u64) -> u64 {
    // splitmix64's finalizer: cheap, and every input bit reaches every output bit.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

pub(crate) fn hash_fork(r: &RelFork) -> u64 {
    let a = (u64::from(r.spcnode) << 32) | u64::from(r.dbnode);
    let b = (u64::from(r.relnode) << 32) | (r.forknum as u32 as u64);
    mix(mix(a) ^ b)
}

/// The slot of `r` in a per-fork array of `slots` entries (a power of two): the last-written
/// LSN's fork level here, the file cache's per-fork entry counts.
pub(crate) fn fork_slot(r: &RelFork, slots: usize) -> usize {
    debug_assert!(slots.is_power_of_two());
    (hash_fork(r) as usize) & (slots - 1)
}

fn lwlsn_slot<'a>(s: &'a Shared, r: &RelFork, blkno: u32) -> &'a std::sync::atomic::AtomicU64 {
    let h = mix(hash_fork(r) ^ u64::from(blkno));
    &s.lwlsn[(h as usize) & (LWLSN_SLOTS - 1)]
}

fn lwlsn_fork_slot<'a>(s: &'a Shared, r: &RelFork) -> &'a std::sync::atomic::AtomicU64 {
    &s.lwlsn_forks[fork_slot(r, LWLSN_FORK_SLOTS)]
}

/// Records that `blkno` of `r` was written at `lsn` (only ever raises the slots).
pub fn set_last_written(r: &RelFork, blkno: u32, lsn: u64) {
    if let Some(s) = shmem::shared() {
        lwlsn_fork_slot(s, r).fetch_max(lsn, Ordering::AcqRel);
        lwlsn_slot(s, r, blkno).fetch_max(lsn, Ordering::AcqRel);
    }
}

/// An LSN at or above the last write of `blkno` of `r` since the compute started (0: none
/// that this cache knows of): the smaller of its block slot and its fork slot.
pub fn last_written(r: &RelFork, blkno: u32) -> u64 {
    shmem::shared().map_or(0, |s| lwlsn_slot(s, r, blkno).load(Ordering::Acquire).min(lwlsn_fork_slot(s, r).load(Ordering::Acquire)))
}

pub fn set_relation_changed(r: &RelFork, lsn: u64) {
    set_last_written(r, RELATION_BLOCK, lsn);
}

pub fn relation_changed(r: &RelFork) -> u64 {
    last_written(r, RELATION_BLOCK)
}

/// The relation-size table under its LWLock, held shared or exclusive for the life of
/// the value: `entries` reads under either, `entries_mut` needs the exclusive lock (and a
/// `&mut` of this guard, so no shared view of the table is alive while it is changed).
struct Locked<'a> {
    shared: &'a Shared,
    exclusive: bool,
}

impl<'a> Locked<'a> {
    fn new(shared: &'a Shared, exclusive: bool) -> Locked<'a> {
        let mode = if exclusive { pg_sys::LWLockMode::LW_EXCLUSIVE } else { pg_sys::LWLockMode::LW_SHARED };
        // SAFETY: the lock lives in shared memory for the life of the server. LWLocks are
        // released by PostgreSQL's error cleanup (LWLockReleaseAll) if an ERROR unwinds us.
        unsafe { pg_sys::LWLockAcquire(shared.relsize_lock, mode) };
        Locked { shared, exclusive }
    }

    fn entries(&self) -> &[RelSizeEntry] {
        // SAFETY: we hold the lock, so no other backend changes the table; this backend
        // changes it only through `entries_mut`, which needs `&mut self`.
        unsafe { relsize_entries(self.shared) }
    }

    fn entries_mut(&mut self) -> &mut [RelSizeEntry] {
        assert!(self.exclusive, "the relation-size table changed under a shared lock");
        // SAFETY: we hold the lock exclusively, and `&mut self` keeps every other view of
        // the table in this backend dead while the returned slice lives.
        unsafe { relsize_entries(self.shared) }
    }

    fn find(&self, r: &RelFork) -> Result<usize, Option<usize>> {
        let entries = self.entries();
        let cap = entries.len();
        let mut i = (hash_fork(r) as usize) % cap;
        for _ in 0..cap {
            let e = &entries[i];
            if e.used == 0 {
                return Err(Some(i));
            }
            if e.spcnode == r.spcnode && e.dbnode == r.dbnode && e.relnode == r.relnode && e.forknum == r.forknum {
                return Ok(i);
            }
            i = (i + 1) % cap;
        }
        Err(None)
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // SAFETY: we acquired it in `new`. During an unwind PostgreSQL may already have
        // released all LWLocks; LWLockHeldByMe makes this idempotent.
        unsafe {
            if pg_sys::LWLockHeldByMe(self.shared.relsize_lock) {
                pg_sys::LWLockRelease(self.shared.relsize_lock);
            }
        }
    }
}

/// Invalidates every backend's copies of sizes: called under the exclusive lock by whatever
/// changes a cached size or removes a fork, so the raise is visible before the lock is
/// released.
fn new_generation(s: &Shared) {
    s.relsize_generation.0.fetch_add(1, Ordering::Release);
}

/// The sizes this backend looked up, as of one generation of the table.
struct LocalSizes {
    generation: u64,
    sizes: std::collections::HashMap<RelFork, u32>,
}

/// Forks a backend keeps at most; more starts the map over.
const LOCAL_SIZES_MAX: usize = 1024;

thread_local! {
    static LOCAL_SIZES: std::cell::RefCell<LocalSizes> =
        std::cell::RefCell::new(LocalSizes { generation: 0, sizes: std::collections::HashMap::new() });
}

/// This backend's copy of `r`'s size, if it has one of the table's current generation.
fn local_size(s: &Shared, r: &RelFork) -> Option<u32> {
    let current = s.relsize_generation.0.load(Ordering::Acquire);
    LOCAL_SIZES.with(|l| {
        let l = l.borrow();
        if l.generation == current {
            l.sizes.get(r).copied()
        } else {
            None
        }
    })
}

/// The cached size of `r`, if known.
pub fn cached_size(r: &RelFork) -> Option<u32> {
    let s = shmem::shared()?;
    let found = local_size(s, r).or_else(|| {
        let (found, generation) = {
            let l = Locked::new(s, false);
            // Stable while the lock is held: it changes only under the exclusive lock.
            (l.find(r).ok().map(|i| l.entries()[i].nblocks), s.relsize_generation.0.load(Ordering::Relaxed))
        };
        if let Some(n) = found {
            LOCAL_SIZES.with(|l| {
                let mut l = l.borrow_mut();
                if l.generation != generation || l.sizes.len() >= LOCAL_SIZES_MAX {
                    l.sizes.clear();
                    l.generation = generation;
                }
                l.sizes.insert(*r, n);
            });
        }
        found
    });
    if found.is_some() {
        s.counters.mine().relsize_hits.fetch_add(1, Ordering::Relaxed);
    } else {
        s.counters.mine().relsize_misses.fetch_add(1, Ordering::Relaxed);
    }
    found
}

/// How to change a cached size.
#[derive(Clone, Copy)]
pub enum SizeUpdate {
    /// Set exactly (create, truncate).
    Set(u32),
    /// Raise to at least this (extend, a write past the end); inserts if absent.
    AtLeast(u32),
    /// Raise to at least this if the fork is cached; leave an absent fork absent.
    AtLeastIfCached(u32),
    /// Insert if absent, returning the cached value (a size learned from the pageserver
    /// must not overwrite a newer local one).
    IfAbsent(u32),
}

/// Applies `u` and returns the resulting size (`None` when nothing is cached).
pub fn update_size(r: &RelFork, u: SizeUpdate) -> Option<u32> {
    let s = shmem::shared()?;
    if let SizeUpdate::AtLeast(n) | SizeUpdate::AtLeastIfCached(n) = u {
        // Nothing to raise (every write of a page inside the fork asks): a size only goes
        // down through `Set` or a removal, and both raise the generation.
        if let Some(have) = local_size(s, r).filter(|&have| have >= n) {
            return Some(have);
        }
    }
    let mut l = Locked::new(s, true);
    let slot = l.find(r);
    let entries = l.entries_mut();
    match (slot, u) {
        (Ok(i), SizeUpdate::Set(n) | SizeUpdate::AtLeast(n) | SizeUpdate::AtLeastIfCached(n)) => {
            let new = if matches!(u, SizeUpdate::Set(_)) { n } else { entries[i].nblocks.max(n) };
            if new != entries[i].nblocks {
                entries[i].nblocks = new;
                new_generation(s);
            }
        }
        (Ok(_), SizeUpdate::IfAbsent(_)) => {}
        (Err(_), SizeUpdate::AtLeastIfCached(_)) => return None,
        (Err(free), SizeUpdate::Set(n) | SizeUpdate::AtLeast(n) | SizeUpdate::IfAbsent(n)) => {
            let Some(i) = free.filter(|_| s.relsize_used.load(Ordering::Relaxed) + 1 < s.relsize_capacity) else {
                drop(l);
                ereport!(
                    PgLogLevel::ERROR,
                    PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
                    format!("fjord's relation-size cache is full ({} relation forks)", s.relsize_capacity),
                    "Raise fjord.relsize_cache_entries and restart the compute."
                );
                unreachable!("ereport(ERROR) does not return");
            };
            entries[i] = RelSizeEntry {
                spcnode: r.spcnode,
                dbnode: r.dbnode,
                relnode: r.relnode,
                forknum: r.forknum,
                nblocks: n,
                used: 1,
                build_fake_lsn: 0,
                build_max_image_lsn: 0,
            };
            s.relsize_used.fetch_add(1, Ordering::Relaxed);
            return Some(n);
        }
    }
    // Only the arms for a fork that was cached get here; the slot did not move.
    slot.ok().map(|i| entries[i].nblocks)
}

/// Forgets `r` (it was unlinked). Backward-shift deletion keeps probe chains intact
/// without tombstones.
pub fn forget_size(r: &RelFork) {
    let Some(s) = shmem::shared() else { return };
    let mut l = Locked::new(s, true);
    let Ok(mut hole) = l.find(r) else { return };
    new_generation(s);
    let entries = l.entries_mut();
    let cap = entries.len();
    entries[hole].used = 0;
    let mut i = (hole + 1) % cap;
    while entries[i].used != 0 {
        let e = entries[i];
        let home = (hash_fork(&RelFork { spcnode: e.spcnode, dbnode: e.dbnode, relnode: e.relnode, forknum: e.forknum }) as usize) % cap;
        // Move e into the hole if its home position is not in (hole, i] cyclically.
        let in_range = if hole <= i { home > hole && home <= i } else { home > hole || home <= i };
        if !in_range {
            entries[hole] = e;
            entries[i].used = 0;
            hole = i;
        }
        i = (i + 1) % cap;
    }
    s.relsize_used.fetch_sub(1, Ordering::Relaxed);
}

/// Records that a page of `r` carrying the fake LSN `fake_lsn` of an unlogged index build
/// left the pool as a full-page image at `image_lsn`. See `smgr::restore_build_lsn`.
pub fn note_build_image(r: &RelFork, fake_lsn: u64, image_lsn: u64) {
    let Some(s) = shmem::shared() else { return };
    let mut l = Locked::new(s, true);
    if let Ok(i) = l.find(r) {
        let e = &mut l.entries_mut()[i];
        if e.build_max_image_lsn == 0 {
            e.build_fake_lsn = fake_lsn;
        }
        e.build_max_image_lsn = e.build_max_image_lsn.max(image_lsn);
    }
}

/// `(fake LSN, newest image LSN)` if pages of `r` left the pool during an unlogged build.
pub fn build_images(r: &RelFork) -> Option<(u64, u64)> {
    let s = shmem::shared()?;
    let l = Locked::new(s, false);
    let i = l.find(r).ok()?;
    let e = &l.entries()[i];
    (e.build_max_image_lsn != 0).then_some((e.build_fake_lsn, e.build_max_image_lsn))
}

/// Forgets every fork of database `dbnode` (DROP DATABASE).
pub fn forget_database(dbnode: u32) {
    let Some(s) = shmem::shared() else { return };
    let forks: Vec<RelFork> = {
        let l = Locked::new(s, false);
        l.entries()
            .iter()
            .filter(|e| e.used != 0 && e.dbnode == dbnode)
            .map(|e| RelFork { spcnode: e.spcnode, dbnode: e.dbnode, relnode: e.relnode, forknum: e.forknum })
            .collect()
    };
    for r in &forks {
        forget_size(r);
    }
}
