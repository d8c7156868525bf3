//! The lock protocols under shuttle, which runs each test's threads in many interleavings
//! (a schedule point at every lock taken or released, at every shuttle atomic, and at each
//! `yield_now`), and prints the schedule of a failure for replay.
//!
//! The caches' atomics are std's, which shuttle does not schedule around; the locks here add
//! a schedule point right after every release, so that another thread can run between a
//! release and the unlocked reads that follow it (the generation a backend keeps its copy
//! at, for one).
//!
//! - The relation-size generation: a backend that learns of a change (here through an
//!   atomic flag set after it) never answers from a copy it kept before, whatever it read
//!   and kept meanwhile; concurrent raises end at the highest.
//! - A file-cache stripe: concurrent stores (with evictions), reads and invalidations of
//!   one stripe never serve a torn page or another block's page, and every entry left
//!   points at a slot holding its own block's page. The cache file's writes and reads are
//!   split in two halves with a schedule point between them, so a read that overlapped a
//!   write of its slot would see two versions.
//!
//! `a_store_under_a_shared_lock_is_caught` shows that the stripe model has teeth: with
//! stores taking the stripe's lock shared, it fails.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use compute_caches::check::Region;
use compute_caches::file_cache::{self, FileCacheIndex, Read};
use compute_caches::relsize::{LocalSizes, RelSizeCache, RelSizeHeader, SizeUpdate};
use compute_caches::{BlockTag, Locks, RelFork};
use shuttle::sync::atomic::AtomicBool;
use shuttle::sync::{Condvar, Mutex};
use shuttle::thread;

/// A shared/exclusive lock out of shuttle's mutex and condition variable.
#[derive(Default)]
struct RawRw {
    /// Shared holders, and whether one holds it exclusive.
    state: Mutex<(usize, bool)>,
    changed: Condvar,
}

/// Shuttle locks; with `stores_shared`, exclusive requests take the lock shared (a broken
/// protocol, for the test that must fail).
struct ShuttleLocks {
    locks: Vec<RawRw>,
    exclusive_is_shared: bool,
}

impl ShuttleLocks {
    fn new(n: usize) -> Self {
        ShuttleLocks { locks: (0..n).map(|_| RawRw::default()).collect(), exclusive_is_shared: false }
    }
}

// SAFETY: a readers-writer lock over a mutex (unless `exclusive_is_shared`, which only a
// test that expects a failure sets).
unsafe impl Locks for ShuttleLocks {
    fn lock_shared(&self, i: usize) {
        let l = &self.locks[i];
        let mut s = l.state.lock().unwrap();
        while s.1 {
            s = l.changed.wait(s).unwrap();
        }
        s.0 += 1;
    }
    fn lock_exclusive(&self, i: usize) {
        if self.exclusive_is_shared {
            return self.lock_shared(i);
        }
        let l = &self.locks[i];
        let mut s = l.state.lock().unwrap();
        while s.1 || s.0 > 0 {
            s = l.changed.wait(s).unwrap();
        }
        s.1 = true;
    }
    unsafe fn unlock_shared(&self, i: usize) {
        let l = &self.locks[i];
        let mut s = l.state.lock().unwrap();
        s.0 -= 1;
        if s.0 == 0 {
            l.changed.notify_all();
        }
        drop(s);
        // The caches' own atomics are std's, which shuttle does not schedule around: a
        // schedule point right after the release lets another thread run between it and
        // whatever the releasing thread reads next without a lock.
        thread::yield_now();
    }
    unsafe fn unlock_exclusive(&self, i: usize) {
        if self.exclusive_is_shared {
            // SAFETY: taken shared by `lock_exclusive`.
            return unsafe { self.unlock_shared(i) };
        }
        let l = &self.locks[i];
        let mut s = l.state.lock().unwrap();
        s.1 = false;
        l.changed.notify_all();
        drop(s);
        thread::yield_now();
    }
}

const ITERATIONS: usize = 2000;

struct SizeTable {
    header: RelSizeHeader<ShuttleLocks>,
    slots: Region,
}

impl SizeTable {
    fn new() -> Arc<Self> {
        Arc::new(SizeTable {
            header: RelSizeHeader::new(ShuttleLocks::new(1), 16),
            slots: Region::new(compute_caches::relsize::slots_size(16), 8),
        })
    }

    fn table(&self) -> RelSizeCache<'_, ShuttleLocks> {
        // SAFETY: zeroed slots, used only through this header.
        unsafe { RelSizeCache::from_raw(&self.header, self.slots.ptr().cast()) }
    }
}

fn fork(relnode: u32) -> RelFork {
    RelFork { spcnode: 1663, dbnode: 5, relnode, forknum: 0 }
}

/// A truncation or an unlink by one backend, announced through a flag: another backend
/// that sees the flag answers with the new size, and a raise it asks for afterwards is not
/// skipped because of the size it kept from before.
fn a_change_is_seen_by_a_backend_that_kept_the_old_size(unlink: bool) {
    let t = SizeTable::new();
    let r = fork(1);
    t.table().update_size(&LocalSizes::new(), &r, SizeUpdate::Set(10)).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (t, done) = (t.clone(), done.clone());
        thread::spawn(move || {
            let table = t.table();
            if unlink {
                table.forget_size(&r);
            } else {
                table.update_size(&LocalSizes::new(), &r, SizeUpdate::Set(2)).unwrap();
            }
            done.store(true, Ordering::SeqCst);
        })
    };
    // A third backend changing another fork meanwhile.
    let other = {
        let t = t.clone();
        thread::spawn(move || {
            let table = t.table();
            let local = LocalSizes::new();
            table.update_size(&local, &fork(2), SizeUpdate::AtLeast(3)).unwrap();
            table.update_size(&local, &fork(2), SizeUpdate::Set(1)).unwrap();
        })
    };
    let table = t.table();
    let mut local = LocalSizes::new();
    let before = table.cached_size(&mut local, &r);
    assert!(matches!(before, Some(10) | Some(2) | None));
    let seen = done.load(Ordering::SeqCst);
    let after = table.cached_size(&mut local, &r);
    let expected = if unlink { None } else { Some(2) };
    if seen {
        assert_eq!(after, expected, "a backend answered from a copy older than a change it knew of");
    }
    if !unlink {
        let raised = table.update_size(&local, &r, SizeUpdate::AtLeast(5)).unwrap();
        if seen {
            assert_eq!(raised, Some(5), "a raise was skipped because of a size kept from before a truncation");
        }
    }
    writer.join().unwrap();
    other.join().unwrap();
    let mut fresh = LocalSizes::new();
    let end = table.cached_size(&mut fresh, &r);
    assert_eq!(table.cached_size(&mut local, &r), end, "a backend's copy outlived the change");
}

#[test]
fn relsize_a_truncation_is_seen_by_a_backend_that_kept_the_old_size() {
    shuttle::check_pct(|| a_change_is_seen_by_a_backend_that_kept_the_old_size(false), ITERATIONS, 3);
}

#[test]
fn relsize_an_unlink_is_seen_by_a_backend_that_kept_the_old_size() {
    shuttle::check_pct(|| a_change_is_seen_by_a_backend_that_kept_the_old_size(true), ITERATIONS, 3);
}

/// Raises only: each backend's successive answers never go down, and the end is the highest.
#[test]
fn relsize_concurrent_raises_end_at_the_highest() {
    shuttle::check_pct(
        || {
            let t = SizeTable::new();
            let r = fork(1);
            let raisers: Vec<_> = [5, 7, 6]
                .into_iter()
                .map(|n| {
                    let t = t.clone();
                    thread::spawn(move || {
                        let table = t.table();
                        let mut local = LocalSizes::new();
                        let mut last = 0;
                        for k in [n - 2, n] {
                            table.update_size(&local, &r, SizeUpdate::AtLeast(k)).unwrap();
                            let now = table.cached_size(&mut local, &r).expect("cached");
                            assert!(now >= last && now >= k, "a size went down: {last} then {now}");
                            last = now;
                        }
                    })
                })
                .collect();
            for h in raisers {
                h.join().unwrap();
            }
            assert_eq!(t.table().cached_size(&mut LocalSizes::new(), &r), Some(7));
        },
        ITERATIONS,
        3,
    );
}

/// A stripe's index and a cache file whose slots are written and read in two halves.
struct Stripe {
    region: Region,
    file: Vec<[AtomicU32; 2]>,
}

const SLOTS: usize = 4;

impl Drop for Stripe {
    fn drop(&mut self) {
        // SAFETY: set up by `new`; nothing uses it after this.
        unsafe { FileCacheIndex::<ShuttleLocks>::drop_in_place(self.region.ptr()) }
    }
}

impl Stripe {
    fn new(exclusive_is_shared: bool) -> Arc<Self> {
        let region = Region::new(file_cache::region_size::<ShuttleLocks>(SLOTS), file_cache::region_align::<ShuttleLocks>());
        let mut locks = ShuttleLocks::new(1);
        locks.exclusive_is_shared = exclusive_is_shared;
        // SAFETY: size and alignment as `init` needs.
        let index = unsafe { FileCacheIndex::init(region.ptr(), SLOTS, locks) };
        assert_eq!(index.geometry(), (1, SLOTS));
        index.header().enable();
        Arc::new(Stripe { region, file: (0..SLOTS).map(|_| [AtomicU32::new(0), AtomicU32::new(0)]).collect() })
    }

    fn index(&self) -> FileCacheIndex<'_, ShuttleLocks> {
        // SAFETY: set up by `new`.
        unsafe { FileCacheIndex::attach(self.region.ptr(), 0) }
    }

    /// Version `v` of block `b`'s page: both halves the same word.
    fn store(&self, b: u32, v: u32) {
        let word = b << 16 | v;
        let page: Vec<u8> = [word.to_le_bytes(), word.to_le_bytes()].concat();
        self.index()
            .store(&tag(b), &page, 0, |slot, _| {
                self.file[slot][0].store(word, Ordering::Relaxed);
                thread::yield_now();
                self.file[slot][1].store(word, Ordering::Relaxed);
                Ok::<(), ()>(())
            })
            .unwrap();
    }

    /// The page of block `b` if cached (checked whole and its own).
    fn read(&self, b: u32) -> Option<u32> {
        let mut out = [0u8; 8];
        match self.index().read(&tag(b), &mut out, |slot, out| {
            let first = self.file[slot][0].load(Ordering::Relaxed);
            thread::yield_now();
            let second = self.file[slot][1].load(Ordering::Relaxed);
            out[..4].copy_from_slice(&first.to_le_bytes());
            out[4..].copy_from_slice(&second.to_le_bytes());
            Ok::<(), ()>(())
        }) {
            Read::Hit => {
                let (first, second) = (u32::from_le_bytes(out[..4].try_into().unwrap()), u32::from_le_bytes(out[4..].try_into().unwrap()));
                assert_eq!(first, second, "a torn page: a slot was written while read");
                assert_eq!(first >> 16, b, "block {b} read the page of block {}", first >> 16);
                Some(first & 0xffff)
            }
            Read::Miss => None,
            other => panic!("read of block {b}: {other:?}"),
        }
    }

    /// Every entry's slot holds its own block's page, and the counts agree.
    fn check_consistent(&self) {
        let index = self.index();
        let entries: Vec<_> = index.saved_slots().collect();
        assert_eq!(index.header().used(), entries.len() as u64);
        assert_eq!(index.stripe_used(0), entries.len());
        for e in entries {
            let word = self.file[e.slot as usize][0].load(Ordering::Relaxed);
            assert_eq!(word >> 16, e.tag.blkno, "slot {} is indexed as block {} but holds block {}", e.slot, e.tag.blkno, word >> 16);
        }
    }
}

fn tag(blkno: u32) -> BlockTag {
    BlockTag { rel: fork(1), blkno }
}

fn stripe_scenario(exclusive_is_shared: bool) {
    let s = Stripe::new(exclusive_is_shared);
    for b in 10..13 {
        s.store(b, 1);
    }
    let storer = {
        let s = s.clone();
        thread::spawn(move || {
            s.store(1, 1);
            s.store(1, 2);
        })
    };
    let evicter = {
        let s = s.clone();
        thread::spawn(move || {
            for b in 2..5 {
                s.store(b, 1);
            }
        })
    };
    let invalidator = {
        let s = s.clone();
        thread::spawn(move || {
            s.index().invalidate(&tag(1));
            s.index().invalidate_blocks(&fork(1), 10, 12);
        })
    };
    for b in [1, 2, 1, 10] {
        s.read(b);
    }
    for h in [storer, evicter, invalidator] {
        h.join().unwrap();
    }
    s.check_consistent();
}

#[test]
fn file_cache_stripe_serves_only_whole_pages_of_the_block_asked_for() {
    shuttle::check_pct(|| stripe_scenario(false), ITERATIONS, 3);
}

#[test]
#[should_panic]
fn a_store_under_a_shared_lock_is_caught() {
    shuttle::check_random_with_seed(|| stripe_scenario(true), 1, ITERATIONS);
}
