use super::*;
use crate::check::{CheckedLocks, Region};

fn table_with(capacity: usize) -> (Box<RelSizeHeader<CheckedLocks>>, Region) {
    (Box::new(RelSizeHeader::new(CheckedLocks::default(), capacity)), Region::new(slots_size(capacity), 8))
}

fn table<'a>(h: &'a RelSizeHeader<CheckedLocks>, r: &'a Region) -> RelSizeCache<'a, CheckedLocks> {
    // SAFETY: zeroed slots, used only through this header.
    unsafe { RelSizeCache::from_raw(h, r.ptr().cast()) }
}

fn fork(relnode: u32) -> RelFork {
    RelFork { spcnode: 1663, dbnode: 5, relnode, forknum: 0 }
}

/// Forks whose home slot in a table of `capacity` is `home`.
fn homed_at(capacity: usize, home: usize, count: usize) -> Vec<RelFork> {
    (16384..).map(fork).filter(|r| (hash_fork(r) as usize) % capacity == home).take(count).collect()
}

#[test]
fn removal_keeps_the_probe_chain_of_colliding_forks() {
    let (h, r) = table_with(8);
    let t = table(&h, &r);
    let local = LocalSizes::new();
    // Three forks with one home slot, and one homed where the chain spills to.
    let same = homed_at(8, 6, 3);
    let next = homed_at(8, 7, 1)[0];
    for (i, f) in same.iter().chain([&next]).enumerate() {
        assert_eq!(t.update_size(&local, f, SizeUpdate::Set(i as u32 + 10)), Ok(Some(i as u32 + 10)));
    }
    t.forget_size(&same[0]);
    let mut fresh = LocalSizes::new();
    assert_eq!(t.cached_size(&mut fresh, &same[0]), None);
    assert_eq!(t.cached_size(&mut fresh, &same[1]), Some(11));
    assert_eq!(t.cached_size(&mut fresh, &same[2]), Some(12));
    assert_eq!(t.cached_size(&mut fresh, &next), Some(13));
    assert_eq!(h.used(), 3);
}

#[test]
fn a_full_table_refuses_an_insertion_and_keeps_a_slot_free() {
    let (h, r) = table_with(4);
    let t = table(&h, &r);
    let local = LocalSizes::new();
    for i in 0..3 {
        assert_eq!(t.update_size(&local, &fork(i), SizeUpdate::AtLeast(1)), Ok(Some(1)));
    }
    assert_eq!(t.update_size(&local, &fork(3), SizeUpdate::IfAbsent(1)), Err(CacheFull { capacity: 4 }));
    // A cached fork still changes, and an absent one is still found absent.
    assert_eq!(t.update_size(&local, &fork(0), SizeUpdate::Set(9)), Ok(Some(9)));
    assert_eq!(t.update_size(&local, &fork(3), SizeUpdate::AtLeastIfCached(2)), Ok(None));
}

#[test]
fn a_backends_copy_is_dropped_when_any_size_changes() {
    let (h, r) = table_with(16);
    let t = table(&h, &r);
    let (mut a, b) = (LocalSizes::new(), LocalSizes::new());
    t.update_size(&b, &fork(1), SizeUpdate::Set(5)).unwrap();
    assert_eq!(t.cached_size(&mut a, &fork(1)), Some(5));
    let g = h.generation();
    // An insertion changes no size a backend can hold: the generation stays.
    t.update_size(&b, &fork(2), SizeUpdate::Set(1)).unwrap();
    assert_eq!(h.generation(), g);
    // A truncation by another backend: `a` must not answer from its copy, nor skip a raise.
    t.update_size(&b, &fork(1), SizeUpdate::Set(2)).unwrap();
    assert_eq!(h.generation(), g + 1);
    assert_eq!(t.cached_size(&mut a, &fork(1)), Some(2));
    t.update_size(&b, &fork(1), SizeUpdate::Set(1)).unwrap();
    assert_eq!(t.update_size(&a, &fork(1), SizeUpdate::AtLeast(2)), Ok(Some(2)));
}

#[test]
fn build_images_keep_the_first_fake_lsn_and_the_newest_image() {
    let (h, r) = table_with(16);
    let t = table(&h, &r);
    t.note_build_image(&fork(1), 7, 100);
    assert_eq!(t.build_images(&fork(1)), None, "not cached: nothing kept");
    t.update_size(&LocalSizes::new(), &fork(1), SizeUpdate::Set(3)).unwrap();
    t.note_build_image(&fork(1), 7, 100);
    t.note_build_image(&fork(1), 8, 90);
    assert_eq!(t.build_images(&fork(1)), Some((7, 100)));
}

#[test]
fn forgetting_a_database_leaves_the_others() {
    let (h, r) = table_with(16);
    let t = table(&h, &r);
    let local = LocalSizes::new();
    let other = RelFork { dbnode: 6, ..fork(1) };
    for f in [fork(1), fork(2), other] {
        t.update_size(&local, &f, SizeUpdate::Set(1)).unwrap();
    }
    t.forget_database(5);
    let mut fresh = LocalSizes::new();
    assert_eq!((t.cached_size(&mut fresh, &fork(1)), t.cached_size(&mut fresh, &other)), (None, Some(1)));
    assert_eq!(h.used(), 1);
}
