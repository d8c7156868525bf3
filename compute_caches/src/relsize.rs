//! The relation-size cache.
//!
//! The size of every permanent relation fork the compute extends, creates, truncates or
//! asks about, in an open-addressing table under one lock (lock 0 of the header's
//! [`Locks`]). Entries are never evicted: a fork extended with a zero page the WAL has not
//! yet described is longer here than on the pageserver, and this cache is the only place
//! that knows. A full table refuses an insertion ([`CacheFull`]): one slot always stays
//! free, so that every probe ends. Entries are removed when the fork is unlinked, by
//! backward-shift deletion (no tombstones).
//!
//! Each backend also keeps the sizes it looked up ([`LocalSizes`]), valid while the
//! table's generation is the one it read them at: every change of a size, and every
//! removal, raises the generation under the exclusive lock, so a backend that learns of a
//! change through any lock or through its own call sees the new generation and looks
//! again. The planner asks for sizes at every query, and every write of a page asks to
//! raise its fork's size; with no size changing, each costs one atomic load, not a lock
//! every backend takes.
//!
//! Each entry also carries what an unlogged index build left behind
//! ([`RelSizeCache::note_build_image`]).

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::lock::{ExclusiveGuard, SharedGuard};
use crate::{hash_fork, Locks, Padded, RelFork};

/// The lock (of the header's [`Locks`]) that guards the table.
const LOCK: usize = 0;

/// The table's header. The slots follow wherever the caller put them
/// ([`RelSizeCache::from_raw`]).
#[repr(C)]
pub struct RelSizeHeader<L> {
    locks: L,
    capacity: usize,
    /// Slots in use; changed only under the exclusive lock.
    used: AtomicUsize,
    /// Raised (under the exclusive lock, before it is released) whenever a cached size
    /// changes or a fork is forgotten.
    generation: Padded<AtomicU64>,
}

impl<L> RelSizeHeader<L> {
    /// A header for `capacity` slots (at least 2), guarded by lock 0 of `locks`.
    pub fn new(locks: L, capacity: usize) -> Self {
        assert!(capacity >= 2, "the relation-size cache needs at least 2 slots, not {capacity}");
        RelSizeHeader { locks, capacity, used: AtomicUsize::new(0), generation: Padded(AtomicU64::new(0)) }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Forks cached.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// The table's generation (see the module documentation).
    pub fn generation(&self) -> u64 {
        self.generation.0.load(Ordering::Acquire)
    }
}

/// One relation fork's size. `used == 0` marks a free slot; all-zero bytes are a free slot.
#[derive(Clone, Copy)]
#[repr(C)]
struct RelSizeEntry {
    spcnode: u32,
    dbnode: u32,
    relnode: u32,
    forknum: i32,
    nblocks: u32,
    used: u32,
    /// For an index under an unlogged build: the fake LSN its pages carry during the build,
    /// and the newest full-page image written for one of them at eviction. 0 when not in a
    /// build.
    build_fake_lsn: u64,
    build_max_image_lsn: u64,
}

impl RelSizeEntry {
    fn rel(&self) -> RelFork {
        RelFork { spcnode: self.spcnode, dbnode: self.dbnode, relnode: self.relnode, forknum: self.forknum }
    }
}

/// One slot of the table, read and written only under the table's lock.
#[repr(transparent)]
pub struct RelSizeSlot(UnsafeCell<RelSizeEntry>);

/// The bytes of the slots of a table of `capacity` (after the header, or anywhere else
/// aligned for `u64`).
pub const fn slots_size(capacity: usize) -> usize {
    capacity * size_of::<RelSizeSlot>()
}

/// How to change a cached size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

/// An insertion into a full table; the table is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheFull {
    /// The table's slots (one always stays free).
    pub capacity: usize,
}

/// Forks a backend keeps at most; more starts the map over.
pub const LOCAL_SIZES_MAX: usize = 1024;

/// The sizes one backend looked up, as of one generation of the table.
#[derive(Debug, Default)]
pub struct LocalSizes {
    generation: u64,
    sizes: HashMap<RelFork, u32>,
}

impl LocalSizes {
    pub fn new() -> Self {
        Self::default()
    }

    /// The copy of `r`'s size, if there is one of generation `current`.
    #[inline]
    fn get(&self, current: u64, r: &RelFork) -> Option<u32> {
        if self.generation == current {
            self.sizes.get(r).copied()
        } else {
            None
        }
    }

    fn remember(&mut self, generation: u64, r: &RelFork, n: u32) {
        if self.generation != generation || self.sizes.len() >= LOCAL_SIZES_MAX {
            self.sizes.clear();
            self.generation = generation;
        }
        self.sizes.insert(*r, n);
    }
}

/// The table: its header and its slots.
pub struct RelSizeCache<'a, L> {
    header: &'a RelSizeHeader<L>,
    slots: &'a [RelSizeSlot],
}

/// The table under its lock, held shared or exclusive for the life of the value: `entries`
/// reads under either, `entries_mut` needs the exclusive lock (and a `&mut` of this guard,
/// so no shared view of the table is alive while it is changed).
struct Locked<'t, 'a, L: Locks> {
    table: &'t RelSizeCache<'a, L>,
    exclusive: bool,
    _shared: Option<SharedGuard<'a, L>>,
    _exclusive: Option<ExclusiveGuard<'a, L>>,
}

impl<'t, 'a, L: Locks> Locked<'t, 'a, L> {
    #[inline]
    fn new(table: &'t RelSizeCache<'a, L>, exclusive: bool) -> Self {
        let locks = &table.header.locks;
        if exclusive {
            Locked { table, exclusive, _shared: None, _exclusive: Some(ExclusiveGuard::new(locks, LOCK)) }
        } else {
            Locked { table, exclusive, _shared: Some(SharedGuard::new(locks, LOCK)), _exclusive: None }
        }
    }

    #[inline]
    fn entries(&self) -> &[RelSizeEntry] {
        // SAFETY: we hold the lock, so no other holder changes the table; this one changes
        // it only through `entries_mut`, which needs `&mut self`. `RelSizeSlot` is a
        // transparent `UnsafeCell<RelSizeEntry>`.
        unsafe { std::slice::from_raw_parts(self.table.slots.as_ptr().cast::<RelSizeEntry>(), self.table.slots.len()) }
    }

    #[inline]
    fn entries_mut(&mut self) -> &mut [RelSizeEntry] {
        assert!(self.exclusive, "the relation-size table changed under a shared lock");
        // SAFETY: we hold the lock exclusively, and `&mut self` keeps every other view of
        // the table in this holder dead while the returned slice lives. The cells' contents
        // may be written through a pointer from a shared reference (`UnsafeCell`).
        unsafe {
            std::slice::from_raw_parts_mut(
                UnsafeCell::raw_get(self.table.slots.as_ptr().cast::<UnsafeCell<RelSizeEntry>>()),
                self.table.slots.len(),
            )
        }
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

// SAFETY: the slots are read and written only under the header's lock (`Locked`), whose
// implementation promises exclusion across threads and processes.
unsafe impl<L: Locks + Sync> Sync for RelSizeCache<'_, L> {}
// SAFETY: as for `Sync`: the view holds only references into memory guarded by the lock.
unsafe impl<L: Locks + Sync> Send for RelSizeCache<'_, L> {}

impl<'a, L: Locks> RelSizeCache<'a, L> {
    /// The table of `header` whose slots start at `slots`.
    ///
    /// # Safety
    /// `slots` points at `header.capacity()` slots, aligned for `u64`, valid for `'a`, all
    /// zero bytes when the header was made and since then written only through tables of
    /// this header.
    pub unsafe fn from_raw(header: &'a RelSizeHeader<L>, slots: *const RelSizeSlot) -> Self {
        // SAFETY: the caller's promise.
        RelSizeCache { header, slots: unsafe { std::slice::from_raw_parts(slots, header.capacity) } }
    }

    pub fn header(&self) -> &'a RelSizeHeader<L> {
        self.header
    }

    /// Invalidates every backend's copies of sizes: called under the exclusive lock by
    /// whatever changes a cached size or removes a fork, so the raise is visible before the
    /// lock is released.
    #[inline]
    fn new_generation(&self) {
        self.header.generation.0.fetch_add(1, Ordering::Release);
    }

    /// `local`'s copy of `r`'s size, if it has one of the table's current generation.
    #[inline]
    fn local_size(&self, local: &LocalSizes, r: &RelFork) -> Option<u32> {
        local.get(self.header.generation.0.load(Ordering::Acquire), r)
    }

    /// The cached size of `r`, if known; a size looked up in the table is kept in `local`.
    pub fn cached_size(&self, local: &mut LocalSizes, r: &RelFork) -> Option<u32> {
        self.local_size(local, r).or_else(|| {
            let (found, generation) = {
                let l = Locked::new(self, false);
                // Stable while the lock is held: it changes only under the exclusive lock.
                (l.find(r).ok().map(|i| l.entries()[i].nblocks), self.header.generation.0.load(Ordering::Relaxed))
            };
            if let Some(n) = found {
                local.remember(generation, r, n);
            }
            found
        })
    }

    /// Applies `u` and returns the resulting size (`None` when nothing is cached).
    pub fn update_size(&self, local: &LocalSizes, r: &RelFork, u: SizeUpdate) -> Result<Option<u32>, CacheFull> {
        if let SizeUpdate::AtLeast(n) | SizeUpdate::AtLeastIfCached(n) = u {
            // Nothing to raise (every write of a page inside the fork asks): a size only
            // goes down through `Set` or a removal, and both raise the generation.
            if let Some(have) = self.local_size(local, r).filter(|&have| have >= n) {
                return Ok(Some(have));
            }
        }
        let mut l = Locked::new(self, true);
        let slot = l.find(r);
        let entries = l.entries_mut();
        match (slot, u) {
            (Ok(i), SizeUpdate::Set(n) | SizeUpdate::AtLeast(n) | SizeUpdate::AtLeastIfCached(n)) => {
                let new = if matches!(u, SizeUpdate::Set(_)) { n } else { entries[i].nblocks.max(n) };
                if new != entries[i].nblocks {
                    entries[i].nblocks = new;
                    self.new_generation();
                }
            }
            (Ok(_), SizeUpdate::IfAbsent(_)) => {}
            (Err(_), SizeUpdate::AtLeastIfCached(_)) => return Ok(None),
            (Err(free), SizeUpdate::Set(n) | SizeUpdate::AtLeast(n) | SizeUpdate::IfAbsent(n)) => {
                let Some(i) = free.filter(|_| self.header.used.load(Ordering::Relaxed) + 1 < self.header.capacity) else {
                    return Err(CacheFull { capacity: self.header.capacity });
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
                self.header.used.fetch_add(1, Ordering::Relaxed);
                return Ok(Some(n));
            }
        }
        // Only the arms for a fork that was cached get here; the slot did not move.
        Ok(slot.ok().map(|i| entries[i].nblocks))
    }

    /// Forgets `r` (it was unlinked). Backward-shift deletion keeps probe chains intact
    /// without tombstones.
    pub fn forget_size(&self, r: &RelFork) {
        let mut l = Locked::new(self, true);
        let Ok(mut hole) = l.find(r) else { return };
        self.new_generation();
        let entries = l.entries_mut();
        let cap = entries.len();
        entries[hole].used = 0;
        let mut i = (hole + 1) % cap;
        while entries[i].used != 0 {
            let e = entries[i];
            let home = (hash_fork(&e.rel()) as usize) % cap;
            // Move e into the hole if its home position is not in (hole, i] cyclically.
            let in_range = if hole <= i { home > hole && home <= i } else { home > hole || home <= i };
            if !in_range {
                entries[hole] = e;
                entries[i].used = 0;
                hole = i;
            }
            i = (i + 1) % cap;
        }
        self.header.used.fetch_sub(1, Ordering::Relaxed);
    }

    /// Records that a page of `r` carrying the fake LSN `fake_lsn` of an unlogged index build
    /// left the pool as a full-page image at `image_lsn` (nothing if `r` is not cached). The
    /// first image's fake LSN is kept; the image LSN only rises.
    pub fn note_build_image(&self, r: &RelFork, fake_lsn: u64, image_lsn: u64) {
        let mut l = Locked::new(self, true);
        if let Ok(i) = l.find(r) {
            let e = &mut l.entries_mut()[i];
            if e.build_max_image_lsn == 0 {
                e.build_fake_lsn = fake_lsn;
            }
            e.build_max_image_lsn = e.build_max_image_lsn.max(image_lsn);
        }
    }

    /// `(fake LSN, newest image LSN)` if pages of `r` left the pool during an unlogged build.
    pub fn build_images(&self, r: &RelFork) -> Option<(u64, u64)> {
        let l = Locked::new(self, false);
        let i = l.find(r).ok()?;
        let e = &l.entries()[i];
        (e.build_max_image_lsn != 0).then_some((e.build_fake_lsn, e.build_max_image_lsn))
    }

    /// Forgets every fork of database `dbnode` (DROP DATABASE).
    pub fn forget_database(&self, dbnode: u32) {
        let forks: Vec<RelFork> = {
            let l = Locked::new(self, false);
            l.entries().iter().filter(|e| e.used != 0 && e.dbnode == dbnode).map(RelSizeEntry::rel).collect()
        };
        for r in &forks {
            self.forget_size(r);
        }
    }
}

#[cfg(test)]
mod tests;
