use super::*;
use crate::check::{CheckedLocks, Region};

struct IndexRegion(Region);

impl Drop for IndexRegion {
    fn drop(&mut self) {
        // SAFETY: set up by `index_with`, not used after this.
        unsafe { FileCacheIndex::<CheckedLocks>::drop_in_place(self.0.ptr()) }
    }
}

fn index_with(slots: usize) -> IndexRegion {
    let region = Region::new(region_size::<CheckedLocks>(slots), region_align::<CheckedLocks>());
    // SAFETY: size and alignment as `init` needs.
    let index = unsafe { FileCacheIndex::init(region.ptr(), slots, CheckedLocks::default()) };
    index.header().enable();
    IndexRegion(region)
}

fn index(region: &IndexRegion) -> FileCacheIndex<'_, CheckedLocks> {
    // SAFETY: set up by `index_with`.
    unsafe { FileCacheIndex::attach(region.0.ptr(), 0) }
}

fn tag(blkno: u32) -> BlockTag {
    BlockTag { rel: RelFork { spcnode: 1663, dbnode: 5, relnode: 16384, forknum: 0 }, blkno }
}

fn ok(_: usize, _: &[u8]) -> Result<(), ()> {
    Ok(())
}

#[test]
fn geometry_interleaves_stripes_of_at_least_32_slots() {
    assert_eq!(geometry(0), (0, 0));
    assert_eq!(geometry(5), (1, 5));
    assert_eq!(geometry(100), (3, 33));
    assert_eq!(geometry(1 << 20), (1024, 1024));
    let region = index_with(100);
    let i = index(&region);
    assert_eq!(i.header().slots(), 99);
    assert_eq!((0..99).filter(|&s| i.stripe_of(s) == 2).count(), 33);
}

#[test]
fn the_clock_gives_a_slot_read_since_the_last_sweep_a_second_chance() {
    let region = index_with(4);
    let i = index(&region);
    for b in 0..4 {
        assert_eq!(i.store(&tag(b), &[b as u8], 0, ok).unwrap().evicted, None);
    }
    // Every slot has its usage bit from the store: the first sweep clears them all and the
    // hand comes back to slot 0.
    let s = i.store(&tag(4), &[4], 0, ok).unwrap();
    assert_eq!((s.evicted, s.first_eviction), (Some(tag(0)), true));
    // Blocks 1..3 lost their bits in that sweep; reading 1 gives it one again, so 2 goes.
    let mut out = [0u8; 1];
    assert_eq!(i.read(&tag(1), &mut out, |_, _| Ok::<(), ()>(())), Read::Hit);
    let s = i.store(&tag(5), &[5], 0, ok).unwrap();
    assert_eq!((s.evicted, s.first_eviction), (Some(tag(2)), false));
    assert_eq!(i.counters().evictions.load(Ordering::Relaxed), 2);
}

#[test]
fn a_restored_page_is_checked_once_and_a_damaged_one_dropped() {
    let region = index_with(32);
    let i = index(&region);
    let good = [1u8; 8];
    let saved = [
        SavedSlot { tag: tag(1), slot: 0, crc: crc32c::crc32c(&good), dep_lsn: 5 },
        SavedSlot { tag: tag(2), slot: 1, crc: crc32c::crc32c(&good) ^ 1, dep_lsn: 5 },
    ];
    assert_eq!(i.restore(32, saved), Some(2));
    let mut out = [0u8; 8];
    let read = |_: usize, out: &mut [u8]| -> Result<(), ()> {
        out.copy_from_slice(&good);
        Ok(())
    };
    assert_eq!(i.read(&tag(1), &mut out, read), Read::Hit);
    assert_eq!(i.read(&tag(2), &mut out, read), Read::Damaged { slot: 1 });
    assert!(!i.contains(&tag(2)));
    assert_eq!(i.counters().checksum_failures.load(Ordering::Relaxed), 1);
}

#[test]
fn restore_skips_what_this_index_cannot_have_written() {
    let region = index_with(64);
    let i = index(&region);
    let wrong_stripe = 1 - i.stripe(&tag(1));
    let right = i.stripe(&tag(1));
    let saved = [
        SavedSlot { tag: tag(1), slot: wrong_stripe as u32, crc: 0, dep_lsn: 0 },
        SavedSlot { tag: tag(1), slot: 64, crc: 0, dep_lsn: 0 },
        SavedSlot { tag: tag(1), slot: right as u32, crc: 0, dep_lsn: 0 },
        // The same block again, and another block in a slot already taken.
        SavedSlot { tag: tag(1), slot: right as u32 + 2, crc: 0, dep_lsn: 0 },
        SavedSlot { tag: tag(2), slot: right as u32, crc: 0, dep_lsn: 0 },
    ];
    assert_eq!(i.restore(64, saved), Some(1));
    assert_eq!(i.restore(65, []), None);
    assert_eq!(i.header().used(), 1);
    assert_eq!(i.saved_slots().map(|s| (s.tag, s.slot as usize)).collect::<Vec<_>>(), vec![(tag(1), right)]);
}

#[test]
fn a_failed_write_leaves_the_block_uncached() {
    let region = index_with(8);
    let i = index(&region);
    i.store(&tag(1), &[1], 0, ok).unwrap();
    let failed = i.store(&tag(1), &[2], 0, |_, _| Err("disk full")).unwrap_err();
    assert_eq!(failed.error, "disk full");
    assert!(!i.contains(&tag(1)));
    assert!(!i.may_hold(&tag(1).rel));
    assert_eq!(i.header().used(), 0);
}

#[test]
fn dropping_a_fork_the_cache_holds_nothing_of_looks_at_no_stripe() {
    let region = index_with(8);
    let i = index(&region);
    let other = RelFork { relnode: 1, ..tag(0).rel };
    i.store(&tag(3), &[1], 0, ok).unwrap();
    assert!(i.may_hold(&tag(0).rel));
    // A fork that hashes to another count slot: no lock taken (CheckedLocks would count it),
    // nothing dropped.
    if fork_slot(&other, FORK_COUNT_SLOTS) != fork_slot(&tag(0).rel, FORK_COUNT_SLOTS) {
        assert!(!i.may_hold(&other));
        assert_eq!(i.invalidate_fork(&other), 0);
    }
    assert_eq!(i.invalidate_blocks(&tag(0).rel, 0, 1000), 1);
    assert!(!i.may_hold(&tag(0).rel));
}

/// A cache file of `slots` pages of 8 bytes, with the closures `store` and `read` take.
struct File(std::cell::RefCell<Vec<[u8; 8]>>);

impl File {
    fn new(slots: usize) -> File {
        File(std::cell::RefCell::new(vec![[0; 8]; slots]))
    }

    fn write(&self, slot: usize, page: &[u8]) -> Result<(), ()> {
        self.0.borrow_mut()[slot].copy_from_slice(page);
        Ok(())
    }

    fn read(&self, slot: usize, out: &mut [u8]) -> Result<(), ()> {
        out.copy_from_slice(&self.0.borrow()[slot]);
        Ok(())
    }
}

#[test]
fn a_write_that_unwinds_leaves_no_entry_naming_the_slot() {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    let region = index_with(1);
    let i = index(&region);
    let file = File::new(1);
    i.store(&tag(1), &[1; 8], 0, |s, p| file.write(s, p)).unwrap();
    // Block 2 takes the only slot (block 1 is evicted), and its write unwinds before a
    // byte is written: the slot still holds block 1's page, which matches the CRC its
    // entry kept.
    let unwound = catch_unwind(AssertUnwindSafe(|| i.store(&tag(2), &[2; 8], 0, |_, _| -> Result<(), ()> { panic!("the write unwinds") })));
    assert!(unwound.is_err());
    let mut out = [0u8; 8];
    assert_eq!(i.read(&tag(2), &mut out, |s, o| file.read(s, o)), Read::Miss, "block 2 was served block 1's page {out:?}");
    assert_eq!(i.header().used(), 0);
    assert!(!i.may_hold(&tag(2).rel));

    // A new version of a cached block whose write unwinds half way: the slot holds neither
    // version.
    i.store(&tag(3), &[3; 8], 0, |s, p| file.write(s, p)).unwrap();
    let unwound = catch_unwind(AssertUnwindSafe(|| {
        i.store(&tag(3), &[4; 8], 0, |s, p| -> Result<(), ()> {
            file.0.borrow_mut()[s][..4].copy_from_slice(&p[..4]);
            panic!("the write unwinds")
        })
    }));
    assert!(unwound.is_err());
    assert_eq!(i.read(&tag(3), &mut out, |s, o| file.read(s, o)), Read::Miss, "block 3 was served a torn page {out:?}");
    assert_eq!(i.header().used(), 0);
}

#[test]
fn placement_is_what_saved_indexes_were_written_with() {
    // A saved index is reused slot for slot: these values are those of the index before it
    // moved into this crate, and never change.
    let tags = [((1663, 5, 16384, 0), 0), ((1663, 16385, 24576, 1), 7), ((1664, 1, 1259, 2), u32::MAX)];
    let expected = [
        (0x0139_d7a8_5e57_946c, [(0, 28), (1012, 32409)]),
        (0xeca3_fd97_e66f_d953, [(1, 41), (875, 28001)]),
        (0xa298_12bf_deae_dc2c, [(2, 93), (767, 24554)]),
    ];
    let regions = [index_with(100), index_with(1 << 15)];
    for (((spcnode, dbnode, relnode, forknum), blkno), (hash, places)) in tags.into_iter().zip(expected) {
        let t = BlockTag { rel: RelFork { spcnode, dbnode, relnode, forknum }, blkno };
        assert_eq!(crate::hash_fork(&t.rel), hash, "{t:?}");
        for (region, place) in regions.iter().zip(places) {
            assert_eq!(index(region).place(&t), place, "{t:?}");
        }
    }
}
