//! The local file cache's index: which block's page is in which slot of the cache file.
//!
//! **Layout.** A region the caller provides ([`region_size`], [`FileCacheIndex::init`]):
//! the [`FileCacheHeader`], then a [`StripeState`] per stripe, a bucket (the head of a hash
//! chain) per slot, and an entry per slot. The index is split into stripes: each stripe
//! owns every `stripes`-th slot, a chained hash table over them, a clock hand and one lock
//! (lock `stripe` of the header's [`Locks`]). Interleaved, so that a cache that is not full
//! uses the beginning of the file and of the index, not the start of each stripe's run: a
//! smaller OS page cache tree to walk and fewer TLB misses on every read. A block hashes to
//! one stripe; a read takes that stripe's lock shared (many readers at once), a store takes
//! it exclusive. No lock covers more than one stripe, so reads and writes of different
//! blocks rarely meet (up to [`MAX_STRIPES`] stripes). The page is read and written (the
//! caller's closures) while the stripe's lock is held, which is what keeps a slot from being
//! reused under a reader.
//!
//! **Eviction** is per stripe: a clock over its slots, a used slot getting a second chance.
//!
//! **Per-fork counts.** Valid entries are also counted per hash of their fork, so dropping a
//! fork the cache holds nothing of (most forks a DROP TABLE unlinks) costs one load, not a
//! walk over the whole index.
//!
//! **Each entry carries a dependency LSN**: the caller's WAL insert position when the page
//! was stored, an upper bound on every record the page's content can reflect. It matters
//! only when a saved index is reused after a restart: a page is reused only if everything it
//! depends on is durable (compute_ctl decides that before the start).
//!
//! **Checksums.** Each entry carries the CRC-32C of its page, computed when it is stored. A
//! page restored from a saved index is checked against it the first time it is read: a
//! cache file damaged while the compute was down is never served (the entry is dropped). A
//! page this index stored is not checked again on each read: its bytes are the ones the
//! same server wrote.
//!
//! **Reuse after a restart** ([`FileCacheIndex::restore`]): a saved index is used only for
//! a cache of the same number of slots, and a saved entry only if its slot is in the stripe
//! its block hashes to (same size, same hash: an entry this index saved always is), no
//! earlier entry took the slot and the block is not already in the index. Anything else was
//! not written by this index and is skipped.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};

use crate::lock::{ExclusiveGuard, SharedGuard};
use crate::{fork_slot, hash_fork, mix, BlockTag, Locks, Padded, PerProcess, RelFork};

const NONE: u32 = u32::MAX;
/// The most stripes an index has.
pub const MAX_STRIPES: usize = 1024;
/// A stripe holds at least this many slots (fewer stripes for a small cache).
pub const MIN_SLOTS_PER_STRIPE: usize = 32;
/// Slots of the per-fork entry counts.
pub const FORK_COUNT_SLOTS: usize = 1 << 14;

/// Counters since the server started.
#[derive(Default)]
#[repr(C)]
pub struct FileCacheCounters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub stores: AtomicU64,
    pub evictions: AtomicU64,
    pub invalidations: AtomicU64,
    /// Entries loaded from a saved index at start.
    pub restored: AtomicU64,
    /// Reads whose page failed its CRC (a damaged cache file).
    pub checksum_failures: AtomicU64,
}

/// The header of the index's region; stripes, buckets and entries follow it. What every
/// read looks at comes first and changes only when the cache is turned off; what stores
/// change, and the per-process counters, are in cache lines of their own.
#[repr(C)]
pub struct FileCacheHeader<L> {
    /// Slots in use by the index (`stripes * per_stripe`); the cache file has this many pages.
    slots: usize,
    stripes: usize,
    per_stripe: usize,
    /// False until the caller turns the cache on, and once it turns it off.
    enabled: AtomicBool,
    locks: L,
    /// Valid entries.
    used: Padded<AtomicU64>,
    /// Set by the first eviction.
    full: AtomicBool,
    pub counters: PerProcess<FileCacheCounters>,
    /// Valid entries per hash of their fork (`fork_count`): a sum over the forks hashing to
    /// a slot, so a zero says that a fork has no entry at all. Changed under the entry's
    /// stripe lock, by any stripe.
    fork_entries: [AtomicU32; FORK_COUNT_SLOTS],
}

impl<L> FileCacheHeader<L> {
    /// Slots of the index (0: no cache).
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Valid entries.
    pub fn used(&self) -> u64 {
        self.used.0.load(Ordering::Relaxed)
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Turns the cache on (the caller prepared its file).
    pub fn enable(&self) {
        self.enabled.store(true, Ordering::Release);
    }

    /// Turns the cache off for every process; true for the call that turned it off.
    pub fn disable(&self) -> bool {
        self.enabled.swap(false, Ordering::AcqRel)
    }

    pub fn locks(&self) -> &L {
        &self.locks
    }
}

/// A stripe's clock hand, how many of its slots are in use, and where to start looking for
/// a free one; under the stripe's lock.
#[repr(C)]
pub struct StripeState {
    hand: AtomicU32,
    used: AtomicU32,
    /// The slot (`k` of the stripe) after the last one a store took while the stripe was not
    /// full: a filling stripe takes its slots in order, so looking from here finds a free
    /// one at once instead of walking past every slot already taken.
    free_hint: AtomicU32,
}

/// One slot's index entry. Fields change only under the stripe's exclusive lock, except
/// `usage` and `verified`, which readers set under the shared lock; atomics make both plain
/// loads.
#[repr(C)]
struct Entry {
    spcnode: AtomicU32,
    dbnode: AtomicU32,
    relnode: AtomicU32,
    forknum: AtomicU32,
    blkno: AtomicU32,
    /// The next entry in this entry's hash chain, or `NONE`.
    next: AtomicU32,
    /// CRC-32C of the page in the slot: checked when an entry restored from a saved index
    /// is first read, and saved with the index.
    crc: AtomicU32,
    dep_lsn: AtomicU64,
    valid: AtomicU8,
    usage: AtomicU8,
    /// 1 once the slot's bytes are known to be what this index stored: stored by it, or
    /// restored and read back with a matching CRC.
    verified: AtomicU8,
}

impl Entry {
    #[inline]
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

/// Stripes and slots per stripe for a cache of `slots` pages (the index uses
/// `stripes * per_stripe` of them).
pub fn geometry(slots: usize) -> (usize, usize) {
    if slots == 0 {
        return (0, 0);
    }
    let stripes = (slots / MIN_SLOTS_PER_STRIPE).clamp(1, MAX_STRIPES);
    (stripes, slots / stripes)
}

/// Where the parts of a region start, in bytes from its start.
struct Offsets {
    stripes: usize,
    buckets: usize,
    entries: usize,
    end: usize,
}

fn offsets<L>(stripes: usize, per_stripe: usize) -> Offsets {
    let n = stripes * per_stripe;
    let stripes_at = size_of::<FileCacheHeader<L>>();
    let buckets = stripes_at + stripes * size_of::<StripeState>();
    let after_buckets = buckets + n * size_of::<AtomicU32>();
    let entries = after_buckets.next_multiple_of(align_of::<Entry>());
    Offsets { stripes: stripes_at, buckets, entries, end: entries + n * size_of::<Entry>() }
}

/// The bytes of the region of an index for a cache of `slots` pages.
pub fn region_size<L>(slots: usize) -> usize {
    let (stripes, per_stripe) = geometry(slots);
    offsets::<L>(stripes, per_stripe).end
}

/// The alignment the region needs (the header's cache lines).
pub const fn region_align<L>() -> usize {
    align_of::<FileCacheHeader<L>>()
}

/// One saved entry: a block, the slot of the cache file holding its page, the page's
/// CRC-32C and its dependency LSN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SavedSlot {
    pub tag: BlockTag,
    pub slot: u32,
    pub crc: u32,
    pub dep_lsn: u64,
}

/// How a read went.
#[derive(Debug, PartialEq, Eq)]
pub enum Read<E> {
    /// The page is in the caller's buffer.
    Hit,
    /// The block is not cached.
    Miss,
    /// The page in `slot` does not match its checksum: the entry is dropped.
    Damaged { slot: usize },
    /// The caller's read of `slot` failed; the index is unchanged.
    Failed { slot: usize, error: E },
}

/// A store that took place.
#[derive(Debug, PartialEq, Eq)]
pub struct Stored {
    /// The slot the page went to.
    pub slot: usize,
    /// The block whose entry made room for it, if any.
    pub evicted: Option<BlockTag>,
    /// True for the first eviction since the index was made: the cache is full.
    pub first_eviction: bool,
}

/// A store whose write of `slot` failed: the block is no longer cached.
#[derive(Debug, PartialEq, Eq)]
pub struct StoreFailed<E> {
    pub slot: usize,
    pub error: E,
}

/// The index in its region, with the process's copy of the counters.
pub struct FileCacheIndex<'a, L> {
    header: &'a FileCacheHeader<L>,
    stripe_states: &'a [StripeState],
    buckets: &'a [AtomicU32],
    entries: &'a [Entry],
    counters: &'a FileCacheCounters,
}

impl<'a, L: Locks> FileCacheIndex<'a, L> {
    /// Makes an empty index for a cache of `slots` pages in `region`, off until
    /// [`FileCacheHeader::enable`]. `locks` has a lock per stripe.
    ///
    /// # Safety
    /// `region` points at [`region_size`]`(slots)` writable bytes aligned to
    /// [`region_align`], valid for `'a`, that nothing else uses meanwhile.
    pub unsafe fn init(region: *mut u8, slots: usize, locks: L) -> Self {
        assert_eq!(region.align_offset(region_align::<L>()), 0, "the file cache's region is not aligned");
        let (stripes, per_stripe) = geometry(slots);
        // SAFETY: the caller's promise. Zero bytes: no entry valid, every counter 0, every
        // hand at slot 0; then the header's fields, and NONE in every bucket and chain link.
        unsafe {
            std::ptr::write_bytes(region, 0, region_size::<L>(slots));
            let h = region.cast::<FileCacheHeader<L>>();
            (&raw mut (*h).slots).write(stripes * per_stripe);
            (&raw mut (*h).stripes).write(stripes);
            (&raw mut (*h).per_stripe).write(per_stripe);
            (&raw mut (*h).locks).write(locks);
            let index = Self::attach(region, 0);
            for b in index.buckets {
                b.store(NONE, Ordering::Relaxed);
            }
            for e in index.entries {
                e.next.store(NONE, Ordering::Relaxed);
            }
            index
        }
    }

    /// Drops what [`init`](Self::init) moved into `region` (its locks), before ordinary
    /// memory holding an index is freed; shared memory lives as long as the server and is
    /// never torn down.
    ///
    /// # Safety
    /// `region` is a region that `init` set up, and is not used afterwards.
    pub unsafe fn drop_in_place(region: *mut u8) {
        // SAFETY: the caller's promise: the header's locks were written by `init` and are
        // dropped once.
        unsafe { std::ptr::drop_in_place(&raw mut (*region.cast::<FileCacheHeader<L>>()).locks) }
    }

    /// The index [`init`](Self::init) made in `region`, counting into process `process`'s
    /// copy of the counters.
    ///
    /// # Safety
    /// `region` is a region that `init` set up, valid for `'a`.
    #[inline]
    pub unsafe fn attach(region: *mut u8, process: usize) -> Self {
        // SAFETY: the caller's promise; the parts lie where `offsets` puts them for the
        // header's geometry.
        unsafe {
            let header = &*region.cast::<FileCacheHeader<L>>();
            let o = offsets::<L>(header.stripes, header.per_stripe);
            FileCacheIndex {
                header,
                stripe_states: std::slice::from_raw_parts(region.add(o.stripes).cast::<StripeState>(), header.stripes),
                buckets: std::slice::from_raw_parts(region.add(o.buckets).cast::<AtomicU32>(), header.slots),
                entries: std::slice::from_raw_parts(region.add(o.entries).cast::<Entry>(), header.slots),
                counters: header.counters.get(process),
            }
        }
    }

    pub fn header(&self) -> &'a FileCacheHeader<L> {
        self.header
    }

    /// This process's copy of the counters.
    pub fn counters(&self) -> &'a FileCacheCounters {
        self.counters
    }

    #[inline]
    fn fork_count(&self, rel: &RelFork) -> &AtomicU32 {
        &self.header.fork_entries[fork_slot(rel, FORK_COUNT_SLOTS)]
    }

    /// Whether the index may hold a block of `rel` (false: certainly none).
    #[inline]
    pub fn may_hold(&self, rel: &RelFork) -> bool {
        self.fork_count(rel).load(Ordering::Acquire) != 0
    }

    /// The stripe and bucket (an index into `buckets`) of a block.
    #[inline]
    fn place(&self, tag: &BlockTag) -> (usize, usize) {
        let h = mix(hash_fork(&tag.rel) ^ u64::from(tag.blkno).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let stripe = (h as usize) % self.header.stripes;
        let bucket = ((h >> 32) as usize) % self.header.per_stripe;
        (stripe, stripe * self.header.per_stripe + bucket)
    }

    /// The stripe a block hashes to.
    pub fn stripe(&self, tag: &BlockTag) -> usize {
        self.place(tag).0
    }

    /// Stripes, and slots per stripe.
    pub fn geometry(&self) -> (usize, usize) {
        (self.header.stripes, self.header.per_stripe)
    }

    /// Slot `k` of `stripe` (a stripe's slots are interleaved with the others').
    #[inline]
    fn slot_of(&self, stripe: usize, k: usize) -> usize {
        k * self.header.stripes + stripe
    }

    /// The stripe that owns slot `i`.
    #[inline]
    pub fn stripe_of(&self, i: usize) -> usize {
        i % self.header.stripes
    }

    /// The entry holding `tag` in its bucket's chain. Needs the stripe's lock.
    #[inline]
    fn find(&self, bucket: usize, tag: &BlockTag) -> Option<usize> {
        let mut i = self.buckets[bucket].load(Ordering::Relaxed);
        while i != NONE {
            let e = &self.entries[i as usize];
            if e.is(tag) {
                return Some(i as usize);
            }
            i = e.next.load(Ordering::Relaxed);
        }
        None
    }

    /// Puts `tag` into the free slot `i` at the head of its bucket's chain. Needs the
    /// stripe's exclusive lock; the caller counts the slot in its stripe.
    fn link(&self, i: usize, bucket: usize, tag: &BlockTag) {
        let e = &self.entries[i];
        e.set_tag(tag);
        e.next.store(self.buckets[bucket].load(Ordering::Relaxed), Ordering::Relaxed);
        self.buckets[bucket].store(i as u32, Ordering::Relaxed);
        e.valid.store(1, Ordering::Relaxed);
        self.fork_count(&tag.rel).fetch_add(1, Ordering::AcqRel);
        self.header.used.0.fetch_add(1, Ordering::Relaxed);
    }

    /// Removes entry `i` from its chain and marks it free. Needs the stripe's exclusive lock.
    fn unlink(&self, i: usize) {
        let e = &self.entries[i];
        if e.valid.load(Ordering::Relaxed) == 0 {
            return;
        }
        let (_, bucket) = self.place(&e.tag());
        let head = &self.buckets[bucket];
        let next = e.next.load(Ordering::Relaxed);
        if head.load(Ordering::Relaxed) == i as u32 {
            head.store(next, Ordering::Relaxed);
        } else {
            let mut j = head.load(Ordering::Relaxed);
            while j != NONE {
                let prev = &self.entries[j as usize];
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
        self.fork_count(&e.tag().rel).fetch_sub(1, Ordering::AcqRel);
        self.header.used.0.fetch_sub(1, Ordering::Relaxed);
        self.stripe_states[self.stripe_of(i)].used.fetch_sub(1, Ordering::Relaxed);
    }

    /// Picks a slot of `stripe` for a new entry, counted as used: a free one while there is
    /// one, else the clock's victim (unlinked; its block returned). Needs the stripe's
    /// exclusive lock.
    fn victim(&self, stripe: usize) -> (usize, Option<BlockTag>) {
        let per_stripe = self.header.per_stripe;
        let state = &self.stripe_states[stripe];
        let free = if (state.used.load(Ordering::Relaxed) as usize) < per_stripe {
            let from = state.free_hint.load(Ordering::Relaxed) as usize % per_stripe;
            let k = (from..per_stripe).chain(0..from).find(|&k| self.entries[self.slot_of(stripe, k)].valid.load(Ordering::Relaxed) == 0);
            if let Some(k) = k {
                state.free_hint.store(((k + 1) % per_stripe) as u32, Ordering::Relaxed);
            }
            k.map(|k| (self.slot_of(stripe, k), None))
        } else {
            None
        };
        let found = free.unwrap_or_else(|| self.clock(stripe));
        state.used.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// The clock's victim in a full stripe, unlinked, with the block it held.
    fn clock(&self, stripe: usize) -> (usize, Option<BlockTag>) {
        let per_stripe = self.header.per_stripe;
        let hand = &self.stripe_states[stripe].hand;
        // Two sweeps: the first clears every usage bit it passes.
        for _ in 0..2 * per_stripe + 1 {
            let h = hand.load(Ordering::Relaxed) as usize % per_stripe;
            hand.store(((h + 1) % per_stripe) as u32, Ordering::Relaxed);
            let i = self.slot_of(stripe, h);
            let e = &self.entries[i];
            if e.valid.load(Ordering::Relaxed) == 0 {
                return (i, None);
            }
            if e.usage.swap(0, Ordering::Relaxed) == 0 {
                let tag = e.tag();
                self.unlink(i);
                self.counters.evictions.fetch_add(1, Ordering::Relaxed);
                return (i, Some(tag));
            }
        }
        unreachable!("a clock sweep over a stripe always finds a slot");
    }

    /// Looks `tag` up and, if it is cached, reads its page into `out` with `read_slot(slot,
    /// out)` under the stripe's shared lock. A page restored from a saved index is checked
    /// against its CRC the first time; one that fails is dropped.
    pub fn read<E>(&self, tag: &BlockTag, out: &mut [u8], read_slot: impl FnOnce(usize, &mut [u8]) -> Result<(), E>) -> Read<E> {
        let (stripe, bucket) = self.place(tag);
        let lock = SharedGuard::new(&self.header.locks, stripe);
        let Some(i) = self.find(bucket, tag) else {
            self.counters.misses.fetch_add(1, Ordering::Relaxed);
            return Read::Miss;
        };
        let e = &self.entries[i];
        match read_slot(i, out) {
            Ok(()) if e.verified.load(Ordering::Relaxed) != 0 || crc32c::crc32c(out) == e.crc.load(Ordering::Relaxed) => {
                // Stores only on change: a hot entry's line is not written by every reader.
                if e.usage.load(Ordering::Relaxed) == 0 {
                    e.usage.store(1, Ordering::Relaxed);
                }
                if e.verified.load(Ordering::Relaxed) == 0 {
                    e.verified.store(1, Ordering::Relaxed);
                }
                self.counters.hits.fetch_add(1, Ordering::Relaxed);
                Read::Hit
            }
            Ok(()) => {
                // Damaged: never served. The entry goes (under the exclusive lock, taken
                // after the shared one is released).
                drop(lock);
                self.counters.checksum_failures.fetch_add(1, Ordering::Relaxed);
                self.invalidate(tag);
                Read::Damaged { slot: i }
            }
            Err(error) => Read::Failed { slot: i, error },
        }
    }

    /// Whether `tag` is cached (without reading it).
    pub fn contains(&self, tag: &BlockTag) -> bool {
        let (stripe, bucket) = self.place(tag);
        let _lock = SharedGuard::new(&self.header.locks, stripe);
        self.find(bucket, tag).is_some()
    }

    /// Stores `page` as the newest version of `tag`, which depends on no WAL past `dep_lsn`:
    /// into the slot the block has, or a free one of its stripe, or the clock's victim;
    /// `write_slot(slot, page)` writes it there under the stripe's exclusive lock. If the
    /// write fails, or `write_slot` unwinds, the block is no longer cached.
    pub fn store<E>(
        &self,
        tag: &BlockTag,
        page: &[u8],
        dep_lsn: u64,
        write_slot: impl FnOnce(usize, &[u8]) -> Result<(), E>,
    ) -> Result<Stored, StoreFailed<E>> {
        let (stripe, bucket) = self.place(tag);
        let _lock = ExclusiveGuard::new(&self.header.locks, stripe);
        let (i, evicted) = match self.find(bucket, tag) {
            Some(i) => (i, None),
            None => {
                let (i, evicted) = self.victim(stripe);
                self.link(i, bucket, tag);
                (i, evicted)
            }
        };
        // Until the write is done the slot may hold another block's page (with the CRC
        // its entry kept) or part of this one: if the write fails or unwinds (a panic of
        // the caller's closure), the entry goes before the lock is released.
        let pending = Unlink { index: self, slot: i };
        if let Err(error) = write_slot(i, page) {
            return Err(StoreFailed { slot: i, error });
        }
        std::mem::forget(pending);
        let e = &self.entries[i];
        e.crc.store(crc32c::crc32c(page), Ordering::Relaxed);
        e.verified.store(1, Ordering::Relaxed);
        e.dep_lsn.store(dep_lsn, Ordering::Relaxed);
        e.usage.store(1, Ordering::Relaxed);
        self.counters.stores.fetch_add(1, Ordering::Relaxed);
        let first_eviction = evicted.is_some() && !self.header.full.swap(true, Ordering::Relaxed);
        Ok(Stored { slot: i, evicted, first_eviction })
    }

    /// Drops `tag` if cached; true if it was.
    pub fn invalidate(&self, tag: &BlockTag) -> bool {
        let (stripe, bucket) = self.place(tag);
        let _lock = ExclusiveGuard::new(&self.header.locks, stripe);
        let Some(i) = self.find(bucket, tag) else { return false };
        self.unlink(i);
        self.counters.invalidations.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Drops every entry `pred` selects, one stripe at a time; returns how many.
    fn invalidate_where(&self, pred: impl Fn(&BlockTag) -> bool) -> u64 {
        let mut dropped = 0;
        for stripe in 0..self.header.stripes {
            let _lock = ExclusiveGuard::new(&self.header.locks, stripe);
            for i in (0..self.header.per_stripe).map(|k| self.slot_of(stripe, k)) {
                let e = &self.entries[i];
                if e.valid.load(Ordering::Relaxed) != 0 && pred(&e.tag()) {
                    self.unlink(i);
                    self.counters.invalidations.fetch_add(1, Ordering::Relaxed);
                    dropped += 1;
                }
            }
        }
        dropped
    }

    /// Drops blocks `from..to` of `rel` (a truncation; an unlink with a known size);
    /// returns how many were cached.
    pub fn invalidate_blocks(&self, rel: &RelFork, from: u32, to: u32) -> u64 {
        if from >= to || !self.may_hold(rel) {
            return 0;
        }
        if (to - from) as usize > self.header.slots {
            // Cheaper to look at every slot than at every block.
            return self.invalidate_where(|t| t.rel == *rel && (from..to).contains(&t.blkno));
        }
        (from..to).map(|blkno| u64::from(self.invalidate(&BlockTag { rel: *rel, blkno }))).sum()
    }

    /// Drops every block of `rel` (an unlink whose size is not known); returns how many.
    pub fn invalidate_fork(&self, rel: &RelFork) -> u64 {
        if !self.may_hold(rel) {
            return 0;
        }
        self.invalidate_where(|t| t.rel == *rel)
    }

    /// Drops every block of database `dbnode` (DROP DATABASE); returns how many.
    pub fn invalidate_database(&self, dbnode: u32) -> u64 {
        self.invalidate_where(|t| t.rel.dbnode == dbnode)
    }

    /// Puts the entries of an index saved for a cache of `saved_slots` slots back into this
    /// empty one, before any other process uses it, by the rule in the module
    /// documentation. Returns how many were reused, or `None` when the saved index is for a
    /// cache of another size (nothing is reused).
    pub fn restore(&self, saved_slots: u64, saved: impl IntoIterator<Item = SavedSlot>) -> Option<u64> {
        if saved_slots != self.header.slots as u64 {
            return None;
        }
        let mut restored = 0u64;
        for s in saved {
            let slot = s.slot as usize;
            if slot >= self.header.slots {
                continue;
            }
            let (stripe, bucket) = self.place(&s.tag);
            if self.stripe_of(slot) != stripe
                || self.entries[slot].valid.load(Ordering::Relaxed) != 0
                || self.find(bucket, &s.tag).is_some()
            {
                continue;
            }
            self.link(slot, bucket, &s.tag);
            let entry = &self.entries[slot];
            entry.dep_lsn.store(s.dep_lsn, Ordering::Relaxed);
            entry.crc.store(s.crc, Ordering::Relaxed);
            self.stripe_states[stripe].used.fetch_add(1, Ordering::Relaxed);
            restored += 1;
        }
        self.counters.restored.store(restored, Ordering::Relaxed);
        Some(restored)
    }

    /// Every valid entry, for saving the index: read without the locks, so only when no
    /// other process uses the index (at the postmaster's exit).
    pub fn saved_slots(&self) -> impl Iterator<Item = SavedSlot> + 'a {
        self.entries.iter().enumerate().filter(|(_, e)| e.valid.load(Ordering::Relaxed) != 0).map(|(slot, e)| SavedSlot {
            tag: e.tag(),
            slot: slot as u32,
            crc: e.crc.load(Ordering::Relaxed),
            dep_lsn: e.dep_lsn.load(Ordering::Relaxed),
        })
    }

    /// Entries in use in `stripe` (as its lock last left them).
    pub fn stripe_used(&self, stripe: usize) -> usize {
        self.stripe_states[stripe].used.load(Ordering::Relaxed) as usize
    }
}

/// Unlinks a slot when dropped (a store's write that did not finish); holds nothing that
/// needs dropping, so `forget` disarms it.
struct Unlink<'i, 'a, L: Locks> {
    index: &'i FileCacheIndex<'a, L>,
    slot: usize,
}

impl<L: Locks> Drop for Unlink<'_, '_, L> {
    fn drop(&mut self) {
        self.index.unlink(self.slot);
    }
}

#[cfg(test)]
mod tests;
