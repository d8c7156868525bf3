//! Reference models of the three caches and a checker that runs a sequence of operations
//! against the real structures and the models at once, panicking at the first difference.
//! The crate's property tests generate the sequences; the fuzz target `compute_caches`
//! (`fuzz/fuzz_targets/compute_caches.rs`) decodes them from arbitrary bytes ([`run`]).
//!
//! The input: one configuration byte (the file cache's slots, the relation-size table's
//! capacity), then operations of [`OP_BYTES`] bytes each: an operation code ([`code`]) and
//! four argument bytes. A trailing partial operation is ignored, so every input is valid.
//!
//! What the models check:
//! - last-written LSN: a read never under-estimates the last write of its block, and never
//!   exceeds the highest LSN written to any fork sharing its fork slot;
//! - relation sizes: every backend's answer is the model's (a `HashMap`), whatever it kept
//!   locally; the generation rises exactly when a size changes or a fork is removed; a full
//!   table refuses insertions and keeps one slot free;
//! - file-cache index: lookups, hits (the page read is the last one stored for the block),
//!   evictions (only from a full stripe, exactly one, of that stripe), invalidations,
//!   failed reads and writes, per-stripe and total counts, per-fork counts that are zero
//!   exactly when no fork sharing the count has an entry, and the reuse rule across a
//!   restart (a saved index restored, with damaged pages and stray entries).

use std::alloc::Layout;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::file_cache::{self, FileCacheIndex, Read, SavedSlot, StoreFailed};
use crate::lwlsn::{LastWrittenLsn, RELATION_BLOCK};
use crate::relsize::{CacheFull, LocalSizes, RelSizeCache, RelSizeHeader, RelSizeSlot, SizeUpdate};
use crate::{fork_slot, BlockTag, Locks, RelFork};

/// Bytes per operation: the code and four arguments.
pub const OP_BYTES: usize = 5;

/// Operation codes (a code byte is taken modulo [`code::COUNT`]).
pub mod code {
    /// `rel, blkno, lsn_lo, lsn_hi`: record a write (block 255 is the fork's size).
    pub const SET_LAST_WRITTEN: u8 = 0;
    /// `rel, blkno`: check the estimate.
    pub const LAST_WRITTEN: u8 = 1;
    /// `backend, rel`: a backend asks for a size.
    pub const CACHED_SIZE: u8 = 2;
    /// `backend, rel, kind (Set, AtLeast, AtLeastIfCached, IfAbsent), n`.
    pub const UPDATE_SIZE: u8 = 3;
    /// `rel`: the fork is unlinked.
    pub const FORGET_SIZE: u8 = 4;
    /// `db`: DROP DATABASE for the relation sizes.
    pub const FORGET_DATABASE: u8 = 5;
    /// `rel, fake, image`: a page of an unlogged build left the pool.
    pub const NOTE_BUILD_IMAGE: u8 = 6;
    /// `rel, blkno`: store the block's next version.
    pub const STORE: u8 = 7;
    /// `rel, blkno`: read the block.
    pub const READ: u8 = 8;
    /// `rel, blkno`.
    pub const CONTAINS: u8 = 9;
    /// `rel, blkno`.
    pub const INVALIDATE: u8 = 10;
    /// `rel, from, len`.
    pub const INVALIDATE_BLOCKS: u8 = 11;
    /// `rel`.
    pub const INVALIDATE_FORK: u8 = 12;
    /// `db`.
    pub const INVALIDATE_DATABASE: u8 = 13;
    /// The next read or write of the cache file fails.
    pub const FAIL_NEXT_IO: u8 = 14;
    /// `damage, stray_slot, stray_rel, stray_blkno`: save the index, make a new one, flip a
    /// byte of slot `damage - 1` of the file (0: none), restore the saved entries and one
    /// stray entry.
    pub const RESTART: u8 = 15;
    pub const COUNT: u8 = 16;
}

/// One operation as bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Op {
    pub code: u8,
    pub args: [u8; 4],
}

impl Op {
    pub fn new(code: u8, args: [u8; 4]) -> Op {
        Op { code, args }
    }
}

/// An input: the configuration byte and the operations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Input {
    pub config: u8,
    pub ops: Vec<Op>,
}

impl Input {
    /// Any bytes: the first is the configuration (0 if there is none), a trailing partial
    /// operation is dropped.
    pub fn decode(data: &[u8]) -> Input {
        let (config, rest) = data.split_first().map_or((0, &[][..]), |(c, rest)| (*c, rest));
        let ops = rest.chunks_exact(OP_BYTES).map(|c| Op { code: c[0], args: [c[1], c[2], c[3], c[4]] }).collect();
        Input { config, ops }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![self.config];
        for op in &self.ops {
            out.push(op.code);
            out.extend_from_slice(&op.args);
        }
        out
    }
}

/// The file cache's slot counts a configuration byte chooses from (1 stripe of 1 or 5, and
/// several stripes: 1 of 32, 2 of 32, 3 of 33).
pub const FILE_CACHE_SLOTS: [usize; 5] = [1, 5, 32, 64, 100];
/// The relation-size table's capacities.
pub const RELSIZE_CAPACITIES: [usize; 4] = [2, 4, 8, 32];

/// Runs `data` (see the module documentation); panics where the caches and the models
/// differ.
pub fn run(data: &[u8]) {
    run_input(&Input::decode(data));
}

pub fn run_input(input: &Input) {
    let c = usize::from(input.config);
    let mut lwlsn = LwlsnCheck::default();
    let mut relsize = RelSizeCheck::new(RELSIZE_CAPACITIES[(c / FILE_CACHE_SLOTS.len()) % RELSIZE_CAPACITIES.len()]);
    let mut files = FileCacheCheck::new(FILE_CACHE_SLOTS[c % FILE_CACHE_SLOTS.len()]);
    for (n, op) in input.ops.iter().enumerate() {
        let [a, b, x, y] = op.args;
        let step = format!("operation {n}: {op:?}");
        match op.code % code::COUNT {
            code::SET_LAST_WRITTEN => lwlsn.set(rel(a), block(b), u64::from(u16::from_le_bytes([x, y]))),
            code::LAST_WRITTEN => lwlsn.check(rel(a), block(b), &step),
            code::CACHED_SIZE => relsize.cached_size(a, rel(b), &step),
            code::UPDATE_SIZE => relsize.update(a, rel(b), x, u32::from(y), &step),
            code::FORGET_SIZE => relsize.forget(rel(a), &step),
            code::FORGET_DATABASE => relsize.forget_database(db(a), &step),
            code::NOTE_BUILD_IMAGE => relsize.note_build_image(rel(a), u64::from(b), u64::from(x), &step),
            code::STORE => files.store(tag(a, b), &step),
            code::READ => files.read(tag(a, b), &step),
            code::CONTAINS => assert_eq!(files.index().contains(&tag(a, b)), files.model.contains_key(&tag(a, b)), "{step}"),
            code::INVALIDATE => files.invalidate(|i| u64::from(i.invalidate(&tag(a, b))), |t| *t == tag(a, b), &step),
            code::INVALIDATE_BLOCKS => {
                let (from, to) = (u32::from(b), u32::from(b) + u32::from(x));
                files.invalidate(|i| i.invalidate_blocks(&rel(a), from, to), |t| t.rel == rel(a) && (from..to).contains(&t.blkno), &step)
            }
            code::INVALIDATE_FORK => files.invalidate(|i| i.invalidate_fork(&rel(a)), |t| t.rel == rel(a), &step),
            code::INVALIDATE_DATABASE => files.invalidate(|i| i.invalidate_database(db(a)), |t| t.rel.dbnode == db(a), &step),
            code::FAIL_NEXT_IO => files.fail_next.set(true),
            code::RESTART => files.restart(a, b, tag(x, y), &step),
            _ => unreachable!(),
        }
        files.check_counts(&step);
    }
}

/// 16 forks: 2 databases, 4 relations, 2 forks.
pub fn rel(b: u8) -> RelFork {
    RelFork { spcnode: 1663, dbnode: db(b >> 2), relnode: 16384 + u32::from(b & 3), forknum: i32::from((b >> 3) & 1) }
}

fn db(b: u8) -> u32 {
    1 + u32::from(b & 1)
}

fn block(b: u8) -> u32 {
    if b == 255 {
        RELATION_BLOCK
    } else {
        u32::from(b)
    }
}

fn tag(r: u8, b: u8) -> BlockTag {
    BlockTag { rel: rel(r), blkno: u32::from(b) }
}

/// Locks for a single thread: the checker runs its operations one after another, so a lock
/// only has to be taken and released in pairs, which it asserts.
#[derive(Default)]
pub struct CheckedLocks {
    held: RefCell<HashMap<usize, isize>>,
}

// SAFETY: used by one thread; the counts assert that no exclusive holder meets another
// holder.
unsafe impl Locks for CheckedLocks {
    fn lock_shared(&self, i: usize) {
        let mut held = self.held.borrow_mut();
        let n = held.entry(i).or_default();
        assert!(*n >= 0, "lock {i} taken shared while held exclusive");
        *n += 1;
    }
    fn lock_exclusive(&self, i: usize) {
        let mut held = self.held.borrow_mut();
        let n = held.entry(i).or_default();
        assert_eq!(*n, 0, "lock {i} taken exclusive while held");
        *n = -1;
    }
    unsafe fn unlock_shared(&self, i: usize) {
        let mut held = self.held.borrow_mut();
        let n = held.get_mut(&i).expect("held");
        assert!(*n > 0);
        *n -= 1;
    }
    unsafe fn unlock_exclusive(&self, i: usize) {
        let mut held = self.held.borrow_mut();
        let n = held.get_mut(&i).expect("held");
        assert_eq!(*n, -1);
        *n = 0;
    }
}

/// Zeroed memory aligned for a cache's region, freed on drop.
pub struct Region {
    ptr: *mut u8,
    layout: Layout,
}

impl Region {
    pub fn new(size: usize, align: usize) -> Region {
        let layout = Layout::from_size_align(size.max(1), align).expect("a region layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory for a region of {size} bytes");
        Region { ptr, layout }
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

// SAFETY: a region is plain memory; what is in it decides what may be shared.
unsafe impl Send for Region {}
// SAFETY: as for `Send`.
unsafe impl Sync for Region {}

const LWLSN_BLOCKS: usize = 16;
const LWLSN_FORKS: usize = 4;

#[derive(Default)]
struct LwlsnCheck {
    cache: LastWrittenLsn<LWLSN_BLOCKS, LWLSN_FORKS>,
    /// The highest LSN written per block.
    written: HashMap<(RelFork, u32), u64>,
    /// The highest LSN written per fork slot.
    fork_slots: HashMap<usize, u64>,
}

impl LwlsnCheck {
    fn set(&mut self, r: RelFork, blkno: u32, lsn: u64) {
        self.cache.set_last_written(&r, blkno, lsn);
        let w = self.written.entry((r, blkno)).or_default();
        *w = (*w).max(lsn);
        let f = self.fork_slots.entry(fork_slot(&r, LWLSN_FORKS)).or_default();
        *f = (*f).max(lsn);
    }

    fn check(&self, r: RelFork, blkno: u32, step: &str) {
        let got = self.cache.last_written(&r, blkno);
        let at_least = self.written.get(&(r, blkno)).copied().unwrap_or(0);
        let at_most = self.fork_slots.get(&fork_slot(&r, LWLSN_FORKS)).copied().unwrap_or(0);
        assert!(got >= at_least, "{step}: last_written {got} under-estimates the last write at {at_least}");
        assert!(got <= at_most, "{step}: last_written {got} is above every write to its fork slot ({at_most})");
        if blkno == RELATION_BLOCK {
            assert_eq!(self.cache.relation_changed(&r), got, "{step}");
        }
    }
}

struct RelSizeCheck {
    header: Box<RelSizeHeader<CheckedLocks>>,
    slots: Region,
    backends: [LocalSizes; 3],
    /// Size, build fake LSN, build image LSN.
    model: HashMap<RelFork, (u32, u64, u64)>,
    generation: u64,
}

impl RelSizeCheck {
    fn new(capacity: usize) -> Self {
        RelSizeCheck {
            header: Box::new(RelSizeHeader::new(CheckedLocks::default(), capacity)),
            slots: Region::new(crate::relsize::slots_size(capacity), 8),
            backends: Default::default(),
            model: HashMap::new(),
            generation: 0,
        }
    }

    fn table(&self) -> RelSizeCache<'_, CheckedLocks> {
        table(&self.header, &self.slots)
    }

    fn check_generation(&self, step: &str) {
        assert_eq!(self.header.generation(), self.generation, "{step}: generation");
        assert_eq!(self.header.used(), self.model.len(), "{step}: forks cached");
    }

    fn cached_size(&mut self, backend: u8, r: RelFork, step: &str) {
        let expected = self.model.get(&r).map(|e| e.0);
        let got = table(&self.header, &self.slots).cached_size(&mut self.backends[usize::from(backend) % 3], &r);
        assert_eq!(got, expected, "{step}: cached size");
    }

    fn update(&mut self, backend: u8, r: RelFork, kind: u8, n: u32, step: &str) {
        let u = match kind % 4 {
            0 => SizeUpdate::Set(n),
            1 => SizeUpdate::AtLeast(n),
            2 => SizeUpdate::AtLeastIfCached(n),
            _ => SizeUpdate::IfAbsent(n),
        };
        let capacity = self.header.capacity();
        let full = self.model.len() + 1 >= capacity;
        let expected = match (self.model.get_mut(&r), u) {
            (Some(e), SizeUpdate::IfAbsent(_)) => Ok(Some(e.0)),
            (Some(e), SizeUpdate::Set(n) | SizeUpdate::AtLeast(n) | SizeUpdate::AtLeastIfCached(n)) => {
                let new = if matches!(u, SizeUpdate::Set(_)) { n } else { e.0.max(n) };
                if new != e.0 {
                    e.0 = new;
                    self.generation += 1;
                }
                Ok(Some(new))
            }
            (None, SizeUpdate::AtLeastIfCached(_)) => Ok(None),
            (None, _) if full => Err(CacheFull { capacity }),
            (None, SizeUpdate::Set(n) | SizeUpdate::AtLeast(n) | SizeUpdate::IfAbsent(n)) => {
                self.model.insert(r, (n, 0, 0));
                Ok(Some(n))
            }
        };
        let got = self.table().update_size(&self.backends[usize::from(backend) % 3], &r, u);
        assert_eq!(got, expected, "{step}: update {u:?}");
        self.check_generation(step);
    }

    fn forget(&mut self, r: RelFork, step: &str) {
        if self.model.remove(&r).is_some() {
            self.generation += 1;
        }
        self.table().forget_size(&r);
        self.check_generation(step);
        self.check_all(step);
    }

    fn forget_database(&mut self, dbnode: u32, step: &str) {
        let before = self.model.len();
        self.model.retain(|r, _| r.dbnode != dbnode);
        self.generation += (before - self.model.len()) as u64;
        self.table().forget_database(dbnode);
        self.check_generation(step);
        self.check_all(step);
    }

    fn note_build_image(&mut self, r: RelFork, fake: u64, image: u64, step: &str) {
        if let Some(e) = self.model.get_mut(&r) {
            if e.2 == 0 {
                e.1 = fake;
            }
            e.2 = e.2.max(image);
        }
        self.table().note_build_image(&r, fake, image);
        let expected = self.model.get(&r).filter(|e| e.2 != 0).map(|e| (e.1, e.2));
        assert_eq!(self.table().build_images(&r), expected, "{step}: build images");
    }

    /// Every fork the model knows is found (removals keep probe chains whole).
    fn check_all(&mut self, step: &str) {
        let forks: Vec<(RelFork, u32)> = self.model.iter().map(|(r, e)| (*r, e.0)).collect();
        let mut fresh = LocalSizes::new();
        for (r, n) in forks {
            assert_eq!(self.table().cached_size(&mut fresh, &r), Some(n), "{step}: {r:?} lost");
        }
    }
}

fn table<'a>(header: &'a RelSizeHeader<CheckedLocks>, slots: &'a Region) -> RelSizeCache<'a, CheckedLocks> {
    // SAFETY: the slots were zero bytes when the header was made and are used only through
    // this header's tables.
    unsafe { RelSizeCache::from_raw(header, slots.ptr().cast::<RelSizeSlot>()) }
}

/// The bytes of a page in the checker's cache file.
const PAGE: usize = 16;

fn page(tag: &BlockTag, version: u32) -> [u8; PAGE] {
    let mut p = [0; PAGE];
    p[0..4].copy_from_slice(&tag.rel.relnode.to_le_bytes());
    p[4] = tag.rel.dbnode as u8;
    p[5] = tag.rel.forknum as u8;
    p[6..10].copy_from_slice(&tag.blkno.to_le_bytes());
    p[10..14].copy_from_slice(&version.to_le_bytes());
    p
}

/// A region holding a file-cache index, torn down on drop.
struct IndexRegion(Region);

impl Drop for IndexRegion {
    fn drop(&mut self) {
        // SAFETY: `FileCacheCheck::fresh` set the index up; nothing uses it after this.
        unsafe { FileCacheIndex::<CheckedLocks>::drop_in_place(self.0.ptr()) }
    }
}

struct FileCacheCheck {
    slots: usize,
    region: IndexRegion,
    file: Vec<[u8; PAGE]>,
    /// Every cached block's version.
    model: BTreeMap<BlockTag, u32>,
    /// Blocks restored and not yet read back.
    unverified: BTreeSet<BlockTag>,
    /// Restored blocks whose page in the file does not match the saved CRC.
    damaged: BTreeSet<BlockTag>,
    next_version: u32,
    fail_next: Cell<bool>,
}

#[derive(Debug, PartialEq, Eq)]
struct IoFailed;

impl FileCacheCheck {
    fn new(slots: usize) -> Self {
        let region = Self::fresh(slots);
        FileCacheCheck {
            slots,
            region,
            file: vec![[0; PAGE]; slots],
            model: BTreeMap::new(),
            unverified: BTreeSet::new(),
            damaged: BTreeSet::new(),
            next_version: 1,
            fail_next: Cell::new(false),
        }
    }

    fn fresh(slots: usize) -> IndexRegion {
        let region = Region::new(file_cache::region_size::<CheckedLocks>(slots), file_cache::region_align::<CheckedLocks>());
        // SAFETY: the region has the size and alignment `init` needs and nothing else uses it.
        let index = unsafe { FileCacheIndex::init(region.ptr(), slots, CheckedLocks::default()) };
        index.header().enable();
        IndexRegion(region)
    }

    fn index(&self) -> FileCacheIndex<'_, CheckedLocks> {
        // SAFETY: `fresh` set the region up; it lives as long as `self`.
        unsafe { FileCacheIndex::attach(self.region.0.ptr(), 0) }
    }

    fn io(&self) -> Result<(), IoFailed> {
        if self.fail_next.replace(false) {
            Err(IoFailed)
        } else {
            Ok(())
        }
    }

    fn in_stripe(&self, stripe: usize) -> usize {
        let index = self.index();
        self.model.keys().filter(|t| index.stripe(t) == stripe).count()
    }

    fn store(&mut self, tag: BlockTag, step: &str) {
        let version = self.next_version;
        self.next_version += 1;
        let p = page(&tag, version);
        let (stripe, per_stripe) = (self.index().stripe(&tag), self.index().geometry().1);
        let must_evict = !self.model.contains_key(&tag) && self.in_stripe(stripe) >= per_stripe;
        let mut written = None;
        let result = self.index().store(&tag, &p, u64::from(version), |slot, bytes| {
            self.io()?;
            written = Some((slot, <[u8; PAGE]>::try_from(bytes).expect("a page")));
            Ok(())
        });
        match result {
            Ok(stored) => {
                match (stored.evicted, must_evict) {
                    (Some(victim), true) => {
                        assert!(self.model.contains_key(&victim), "{step}: evicted {victim:?}, which was not cached");
                        assert_eq!(self.index().stripe(&victim), stripe, "{step}: evicted from another stripe");
                        self.forget(&victim);
                    }
                    (None, true) => panic!("{step}: a full stripe stored without evicting"),
                    (evicted, false) => assert_eq!(evicted, None, "{step}: evicted while the stripe had room"),
                }
                assert_eq!(self.index().stripe_of(stored.slot), stripe, "{step}: stored outside its stripe");
                let (slot, bytes) = written.expect("the page was written");
                assert_eq!(slot, stored.slot);
                self.file[slot] = bytes;
                self.forget(&tag);
                self.model.insert(tag, version);
            }
            Err(StoreFailed { error: IoFailed, .. }) => {
                // The block is gone, and so is the entry that made room for it, if any
                // (not reported on failure): whichever of the stripe's blocks the index no
                // longer has.
                let gone: Vec<BlockTag> = {
                    let index = self.index();
                    self.model.keys().filter(|t| index.stripe(t) == stripe && !index.contains(t)).copied().collect()
                };
                assert!(
                    gone.len() <= usize::from(must_evict) + usize::from(self.model.contains_key(&tag)),
                    "{step}: {gone:?} left at once"
                );
                for t in gone {
                    self.forget(&t);
                }
                self.forget(&tag);
                assert!(!self.index().contains(&tag), "{step}: a block whose write failed is still cached");
            }
        }
    }

    fn forget(&mut self, tag: &BlockTag) {
        self.model.remove(tag);
        self.unverified.remove(tag);
        self.damaged.remove(tag);
    }

    fn read(&mut self, tag: BlockTag, step: &str) {
        let mut out = [0u8; PAGE];
        let file = &self.file;
        let got = self.index().read(&tag, &mut out, |slot, out| {
            self.io()?;
            out.copy_from_slice(&file[slot]);
            Ok(())
        });
        match (self.model.get(&tag).copied(), got) {
            (None, Read::Miss) => {}
            (Some(_), Read::Damaged { .. }) if self.damaged.contains(&tag) => self.forget(&tag),
            (Some(version), Read::Hit) if !self.damaged.contains(&tag) => {
                assert_eq!(out, page(&tag, version), "{step}: a hit returned another page");
                self.unverified.remove(&tag);
            }
            (Some(_), Read::Failed { error: IoFailed, .. }) => {}
            (expected, got) => panic!("{step}: read gave {got:?}; the model has {expected:?} (damaged: {})", self.damaged.contains(&tag)),
        }
    }

    fn invalidate(&mut self, run: impl Fn(&FileCacheIndex<'_, CheckedLocks>) -> u64, selected: impl Fn(&BlockTag) -> bool, step: &str) {
        let gone: Vec<BlockTag> = self.model.keys().filter(|t| selected(t)).copied().collect();
        let dropped = run(&self.index());
        assert_eq!(dropped, gone.len() as u64, "{step}: invalidated");
        for t in gone {
            self.forget(&t);
        }
    }

    fn restart(&mut self, damage: u8, stray_slot: u8, stray: BlockTag, step: &str) {
        let saved: Vec<SavedSlot> = self.index().saved_slots().collect();
        assert_eq!(saved.len(), self.model.len(), "{step}: saved entries");
        self.region = Self::fresh(self.slots);
        let n = self.index().header().slots();
        self.unverified = self.model.keys().copied().collect();
        if damage != 0 {
            let slot = usize::from(damage - 1) % n;
            self.file[slot][PAGE - 1] = self.file[slot][PAGE - 1].wrapping_add(1);
        }
        // Damaged: whatever no longer matches the checksum saved with it.
        self.damaged = saved.iter().filter(|s| crc32c::crc32c(&self.file[s.slot as usize]) != s.crc).map(|s| s.tag).collect();
        // A stray entry, as a saved index this cache did not write would have: its CRC never
        // matches the page in its slot.
        let slot = u32::from(stray_slot) % (n as u32 + 2);
        let crc = self.file.get(slot as usize).map_or(0, |p| crc32c::crc32c(p) ^ 1);
        let mut all = saved.clone();
        all.push(SavedSlot { tag: stray, slot, crc, dep_lsn: 1 });
        let index = self.index();
        let stray_kept = (slot as usize) < n
            && index.stripe_of(slot as usize) == index.stripe(&stray)
            && saved.iter().all(|s| s.slot != slot && s.tag != stray);
        assert_eq!(index.restore(n as u64 + 1, all.clone()), None, "{step}: restored a cache of another size");
        let restored = index.restore(n as u64, all).expect("same size");
        assert_eq!(restored, saved.len() as u64 + u64::from(stray_kept), "{step}: restored");
        if stray_kept {
            self.model.insert(stray, 0);
            self.unverified.insert(stray);
            self.damaged.insert(stray);
        }
    }

    fn check_counts(&self, step: &str) {
        let index = self.index();
        assert_eq!(index.header().used(), self.model.len() as u64, "{step}: used");
        let (stripes, _) = index.geometry();
        for s in 0..stripes {
            assert_eq!(index.stripe_used(s), self.in_stripe(s), "{step}: stripe {s} used");
        }
        // A fork's count is the sum over the forks sharing its slot: zero exactly when none
        // of them has an entry.
        for r in (0..16).map(rel) {
            let slot = fork_slot(&r, file_cache::FORK_COUNT_SLOTS);
            let expected = self.model.keys().any(|t| fork_slot(&t.rel, file_cache::FORK_COUNT_SLOTS) == slot);
            assert_eq!(index.may_hold(&r), expected, "{step}: the per-fork count of {r:?}");
        }
    }
}
