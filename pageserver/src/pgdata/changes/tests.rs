//! `changed_blocks` against the keys ingest writes for each kind of change, put through
//! `Modification` as ingest puts them: block changes, truncation, relation drops, a
//! database created and dropped, a relation map and an SLRU page (neither listed), at
//! ranges that do and do not hold the creation of what is dropped. `tests/changed_blocks.rs`
//! checks the same against real WAL.

use std::collections::BTreeSet;
use std::sync::Arc;

use bytes::Bytes;
use layerstore::tenant::Tenant;
use layerstore::StorageConfig;
use proto::page::PAGE_SIZE_BYTES;
use proto::{BlockNumber, ForkNumber, Key, Lsn, RelTag, SlruKind, TenantId, TimelineId};

use super::*;
use crate::pgdata::datadir::codec::{DbEntry, RelEntry};
use crate::pgdata::datadir::Modification;
use layerstore::timeline::Timeline;

fn setup() -> (tempfile::TempDir, Tenant, Arc<Timeline>) {
    let dir = tempfile::tempdir().unwrap();
    let tenant = Tenant::create(dir.path(), TenantId([1; 16]), StorageConfig::default(), &[]).unwrap();
    let timeline = tenant.create_timeline(TimelineId([2; 16])).unwrap();
    (dir, tenant, timeline)
}

fn rel(dbnode: u32, relnode: u32, forknum: ForkNumber) -> RelTag {
    RelTag { spcnode: 1663, dbnode, relnode, forknum }
}

fn page(fill: u8) -> Bytes {
    Bytes::from(vec![fill; PAGE_SIZE_BYTES])
}

fn entries(rels: &[(u32, ForkNumber)]) -> BTreeSet<RelEntry> {
    rels.iter().map(|&(relnode, forknum)| RelEntry { relnode, forknum }).collect()
}

fn dbs(list: &[u32]) -> BTreeSet<DbEntry> {
    list.iter().map(|&dbnode| DbEntry { spcnode: 1663, dbnode }).chain([DbEntry { spcnode: 1664, dbnode: 0 }]).collect()
}

/// The history the tests read, one "record" per LSN:
/// - 0x100: database 5 with 16384 (main 2 blocks, map 1 block) and 16390 (main, empty);
/// - 0x200: block 1 of 16384 changes; 0x300: 16384 is truncated to 1 block;
/// - 0x400: 16390 is dropped; 0x500: database 6 is created with 20000 (1 block);
/// - 0x600: 16400 is created in database 5 with 1 block; 0x700: 16400 is dropped;
/// - 0x800: database 6 is dropped; 0x900: a relation map and a CLOG page change.
fn history(t: &Timeline) {
    let main = |relnode| rel(5, relnode, ForkNumber::Main);
    let mut m = Modification::new(t, Lsn(0x100));
    m.put_db_dir(&dbs(&[5]));
    m.put_rel_dir(1664, 0, &BTreeSet::new());
    m.put_rel_dir(1663, 5, &entries(&[(16384, ForkNumber::Main), (16384, ForkNumber::VisibilityMap), (16390, ForkNumber::Main)]));
    m.put_rel_size(main(16384), 2);
    m.put_rel_size(rel(5, 16384, ForkNumber::VisibilityMap), 1);
    m.put_rel_size(main(16390), 0);
    m.put_image(Key::rel_block(main(16384), BlockNumber(0)), page(1));
    m.put_image(Key::rel_block(main(16384), BlockNumber(1)), page(2));
    m.put_image(Key::rel_block(rel(5, 16384, ForkNumber::VisibilityMap), BlockNumber(0)), page(3));
    m.commit().unwrap();

    let mut m = Modification::new(t, Lsn(0x200));
    m.put_image(Key::rel_block(main(16384), BlockNumber(1)), page(4));
    m.commit().unwrap();
    let mut m = Modification::new(t, Lsn(0x300));
    m.put_rel_size(main(16384), 1);
    m.commit().unwrap();
    let mut m = Modification::new(t, Lsn(0x400));
    m.put_rel_dir(1663, 5, &entries(&[(16384, ForkNumber::Main), (16384, ForkNumber::VisibilityMap)]));
    m.commit().unwrap();

    let mut m = Modification::new(t, Lsn(0x500));
    m.put_db_dir(&dbs(&[5, 6]));
    m.put_rel_dir(1663, 6, &entries(&[(20000, ForkNumber::Main)]));
    m.put_rel_size(rel(6, 20000, ForkNumber::Main), 1);
    m.put_image(Key::rel_block(rel(6, 20000, ForkNumber::Main), BlockNumber(0)), page(5));
    m.commit().unwrap();

    let mut m = Modification::new(t, Lsn(0x600));
    m.put_rel_dir(1663, 5, &entries(&[(16384, ForkNumber::Main), (16384, ForkNumber::VisibilityMap), (16400, ForkNumber::Main)]));
    m.put_rel_size(main(16400), 1);
    m.put_image(Key::rel_block(main(16400), BlockNumber(0)), page(6));
    m.commit().unwrap();
    let mut m = Modification::new(t, Lsn(0x700));
    m.put_rel_dir(1663, 5, &entries(&[(16384, ForkNumber::Main), (16384, ForkNumber::VisibilityMap)]));
    m.commit().unwrap();

    let mut m = Modification::new(t, Lsn(0x800));
    m.put_db_dir(&dbs(&[5]));
    m.put_rel_dir(1663, 6, &BTreeSet::new());
    m.commit().unwrap();
    let mut m = Modification::new(t, Lsn(0x900));
    m.put_image(Key::relmap_file(1663, 5), Bytes::from(vec![7u8; 512]));
    m.put_slru_dir(SlruKind::Clog, &[0].into());
    m.put_slru_segment_size(SlruKind::Clog, 0, 1);
    m.put_image(Key::slru_block(SlruKind::Clog, 0, BlockNumber(0)), page(0));
    m.commit().unwrap();
}

fn block(dbnode: u32, relnode: u32, blkno: u32, lsn: u64) -> BlockChange {
    BlockChange { rel: rel(dbnode, relnode, ForkNumber::Main), blkno: BlockNumber(blkno), lsn: Lsn(lsn) }
}

fn relation(dbnode: u32, relnode: u32, nblocks: Option<u32>, lsn: u64) -> RelationChange {
    RelationChange { rel: rel(dbnode, relnode, ForkNumber::Main), nblocks, lsn: Lsn(lsn) }
}

#[test]
fn each_kind_of_change_is_listed_as_the_blocks_it_makes_stale() {
    let (_dir, _tenant, t) = setup();
    history(&t);
    let changed = |from: u64| changed_blocks(&t, Lsn(from), Lsn(0x900), usize::MAX).unwrap();

    let all = changed(0x100);
    assert_eq!(all.blocks, vec![block(5, 16384, 1, 0x200)], "nothing of 16400 or database 6: both are gone");
    assert_eq!(
        all.relations,
        vec![
            relation(5, 16384, Some(1), 0x300),
            relation(5, 16390, None, 0x700),
            relation(5, 16400, None, 0x700),
            relation(6, 20000, None, 0x800),
        ],
        "16390 and 16400 with the directory's newest LSN, at or after their drops; 20000 gone with its database, \
         which did not exist at `from`"
    );
    assert_eq!(all.databases, vec![], "database 6 did not exist at `from`");

    // Database 6 existed at 0x600 and is gone at 0x900: the whole database, nothing in it.
    let later = changed(0x600);
    assert_eq!(later.databases, vec![DatabaseDrop { spcnode: 1663, dbnode: 6, lsn: Lsn(0x800) }]);
    assert_eq!(later.relations, vec![relation(5, 16400, None, 0x700)]);
    assert_eq!(later.blocks, vec![]);

    // Only the map and the CLOG page changed after 0x800: nothing to drop.
    assert_eq!(changed(0x800), ChangedBlocks { from: Lsn(0x800), to: Lsn(0x900), ..Default::default() });

    // The same history read up to the middle: 16400 still exists, with its block.
    let middle = changed_blocks(&t, Lsn(0x500), Lsn(0x600), usize::MAX).unwrap();
    assert_eq!(middle.blocks, vec![block(5, 16400, 0, 0x600)]);
    assert_eq!(middle.relations, vec![relation(5, 16400, Some(1), 0x600)]);
}

#[test]
fn refusals_say_whether_the_history_is_gone() {
    let (_dir, _tenant, t) = setup();
    history(&t);
    let err = changed_blocks(&t, Lsn(0x100), Lsn(0x900), 3).unwrap_err();
    assert_eq!(err.to_string(), "too many changes: more than 3 keys changed between LSN 0/100 and LSN 0/900");
    assert!(!err.is_history_gone());
    assert!(!changed_blocks(&t, Lsn(0x900), Lsn(0x100), 10).unwrap_err().is_history_gone());
    t.gc(Lsn(0x300), &[]).unwrap();
    let err = changed_blocks(&t, Lsn(0x200), Lsn(0x900), usize::MAX).unwrap_err();
    assert!(err.is_history_gone(), "{err}");
    assert_eq!(
        err.to_string(),
        "cannot list changes since LSN 0/200: below the garbage collection horizon 0/300, the history before which is gone"
    );
    assert_eq!(changed_blocks(&t, Lsn(0x300), Lsn(0x900), usize::MAX).unwrap().relations.len(), 3);
}
