//! Reads of the data directory mapping against values put through `Modification`.

use std::sync::Arc;

use bytes::Bytes;
use proto::{BlockNumber, ForkNumber, Key, Lsn, RelTag, SlruKind, TenantId, TimelineId};

use super::codec::{DbEntry, RelEntry};
use super::*;
use crate::pgdata::reconstruct::layout::XidStatus;
use crate::pgdata::reconstruct::{PgReconstructor, StoredRecord};
use layerstore::tenant::Tenant;
use layerstore::StorageConfig;

fn setup() -> (tempfile::TempDir, Tenant, Arc<Timeline>) {
    let dir = tempfile::tempdir().unwrap();
    let tenant = Tenant::create(dir.path(), TenantId([1; 16]), StorageConfig::default(), &[]).unwrap();
    let timeline = tenant.create_timeline(TimelineId([2; 16])).unwrap();
    (dir, tenant, timeline)
}

fn rel(relnode: u32, forknum: ForkNumber) -> RelTag {
    RelTag { spcnode: DEFAULT_TABLESPACE_OID, dbnode: 5, relnode, forknum }
}

fn page(fill: u8) -> Bytes {
    Bytes::from(vec![fill; PAGE_SIZE_BYTES])
}

/// A small data directory at LSN 0x100: database 5 with two relations, one SLRU segment.
fn populate(t: &Timeline) {
    let mut m = Modification::new(t, Lsn(0x100));
    m.put_db_dir(&[DbEntry { spcnode: 1664, dbnode: 0 }, DbEntry { spcnode: 1663, dbnode: 5 }].into());
    m.put_rel_dir(1664, 0, &BTreeSet::new());
    let rels: BTreeSet<RelEntry> = [
        RelEntry { relnode: 16384, forknum: ForkNumber::Main },
        RelEntry { relnode: 16384, forknum: ForkNumber::VisibilityMap },
        RelEntry { relnode: 16390, forknum: ForkNumber::Main },
    ]
    .into();
    m.put_rel_dir(1663, 5, &rels);
    m.put_rel_size(rel(16384, ForkNumber::Main), 2);
    m.put_rel_size(rel(16384, ForkNumber::VisibilityMap), 1);
    m.put_rel_size(rel(16390, ForkNumber::Main), 0);
    m.put_image(Key::rel_block(rel(16384, ForkNumber::Main), BlockNumber(0)), page(1));
    m.put_image(Key::rel_block(rel(16384, ForkNumber::Main), BlockNumber(1)), page(2));
    m.put_image(Key::rel_block(rel(16384, ForkNumber::VisibilityMap), BlockNumber(0)), page(3));
    m.put_image(Key::relmap_file(1663, 5), Bytes::from(vec![7u8; 512]));
    m.put_slru_dir(SlruKind::Clog, &[0].into());
    m.put_slru_segment_size(SlruKind::Clog, 0, 2);
    m.put_image(Key::slru_block(SlruKind::Clog, 0, BlockNumber(0)), page(0));
    m.put_image(Key::slru_block(SlruKind::Clog, 0, BlockNumber(1)), page(0));
    m.put_twophase_dir(&[100].into());
    m.put_image(Key::twophase_file(100), Bytes::from_static(b"state"));
    m.commit().unwrap();
}

#[test]
fn reads_reassemble_the_data_directory() {
    let (_dir, _tenant, t) = setup();
    populate(&t);
    let r = PgReconstructor::rust_only();
    let d = Datadir::new(&t, &r);
    let lsn = Lsn(0x100);
    assert_eq!(d.list_dbs(lsn).unwrap(), [(1663, 5), (1664, 0)].into());
    assert_eq!(
        d.list_rels(1663, 5, lsn).unwrap(),
        [rel(16384, ForkNumber::Main), rel(16384, ForkNumber::VisibilityMap), rel(16390, ForkNumber::Main)].into()
    );
    assert_eq!(d.get_rel_size(rel(16384, ForkNumber::Main), lsn).unwrap(), 2);
    assert!(d.rel_exists(rel(16384, ForkNumber::VisibilityMap), lsn).unwrap());
    assert!(!d.rel_exists(rel(16384, ForkNumber::Init), lsn).unwrap());
    // The FSM is not stored: absent, empty, and zero pages.
    assert!(!d.rel_exists(rel(16384, ForkNumber::Fsm), lsn).unwrap());
    assert_eq!(d.get_rel_size(rel(16384, ForkNumber::Fsm), lsn).unwrap(), 0);
    assert_eq!(d.get_rel_page(rel(16384, ForkNumber::Fsm), BlockNumber(9), lsn).unwrap(), page(0));
    assert_eq!(d.get_rel_page(rel(16384, ForkNumber::Main), BlockNumber(1), lsn).unwrap(), page(2));
    assert_eq!(d.get_db_size(1663, 5, lsn).unwrap(), 3 * 8192);
    assert_eq!(d.get_relmap(1663, 5, lsn).unwrap(), Bytes::from(vec![7u8; 512]));
    assert_eq!(d.get_slru_segment(SlruKind::Clog, 0, lsn).unwrap().len(), 2 * 8192);
    assert_eq!(d.list_twophase(lsn).unwrap(), [100].into());
    assert_eq!(d.get_twophase_file(100, lsn).unwrap(), Bytes::from_static(b"state"));

    let missing = [
        d.get_rel_size(rel(1, ForkNumber::Main), lsn).unwrap_err().to_string(),
        d.list_rels(1663, 6, lsn).unwrap_err().to_string(),
        d.get_slru_segment(SlruKind::Clog, 1, lsn).unwrap_err().to_string(),
        d.get_twophase_file(101, lsn).unwrap_err().to_string(),
        d.get_checkpoint(lsn).unwrap_err().to_string(),
    ];
    assert_eq!(
        missing,
        [
            "relation base/5/1 does not exist at LSN 0/100",
            "database 1663/6 does not exist at LSN 0/100",
            "pg_xact segment 0001 does not exist at LSN 0/100",
            "prepared transaction 101 does not exist at LSN 0/100",
            "checkpoint does not exist at LSN 0/100",
        ]
    );
    // Before the import nothing exists, and beyond the last record LSN reads are refused.
    assert!(d.list_dbs(Lsn(0)).unwrap().is_empty());
    assert!(d.list_dbs(Lsn(0x101)).unwrap_err().to_string().contains("has not been ingested yet"));
}

#[test]
fn corrupt_values_are_reported_with_key_and_lsn() {
    let (_dir, _tenant, t) = setup();
    populate(&t);
    let mut m = Modification::new(&t, Lsn(0x200));
    m.put_image(Key::rel_dir(1663, 5), Bytes::from_static(b"R\x01\x09\x00\x00\x00"));
    m.put_image(Key::checkpoint(), Bytes::from_static(b"\x01\x00\x00\x00\x00\x00\x00\x00\x00garbage"));
    m.commit().unwrap();
    let r = PgReconstructor::rust_only();
    let d = Datadir::new(&t, &r);
    let err = d.list_rels(1663, 5, Lsn(0x200)).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "value of key {} at LSN 0/200 is corrupt: invalid relation directory: 9 entries announced in 6 bytes",
            Key::rel_dir(1663, 5)
        )
    );
    let err = d.get_checkpoint(Lsn(0x200)).unwrap_err().to_string();
    assert!(err.starts_with(&format!("value of key {} at LSN 0/200 is corrupt: ", Key::checkpoint())), "{err}");
    // The earlier version is still readable.
    assert_eq!(d.list_rels(1663, 5, Lsn(0x100)).unwrap().len(), 3);
}

#[test]
fn modification_sees_its_own_writes_and_folds_rust_records_into_images() {
    let (_dir, _tenant, t) = setup();
    populate(&t);
    let mut m = Modification::new(&t, Lsn(0x200));
    assert_eq!(m.rel_size_raw(rel(16384, ForkNumber::Main)).unwrap(), Some(2));
    m.put_rel_size(rel(16384, ForkNumber::Main), 5);
    assert_eq!(m.rel_size_raw(rel(16384, ForkNumber::Main)).unwrap(), Some(5));

    // A CLOG record on a page zeroed in the same modification becomes an image.
    let key = Key::slru_block(SlruKind::Clog, 0, BlockNumber(1));
    m.put_image(key, page(0));
    m.put_record(key, StoredRecord::ClogSetStatus { status: XidStatus::Committed, xids: vec![32768] }, false).unwrap();
    // Two records for one key at one LSN cannot be stored.
    let key0 = Key::slru_block(SlruKind::Clog, 0, BlockNumber(0));
    m.put_record(key0, StoredRecord::ClogSetStatus { status: XidStatus::Aborted, xids: vec![3] }, false).unwrap();
    let err = m.put_record(key0, StoredRecord::ClogSetStatus { status: XidStatus::Aborted, xids: vec![4] }, false).unwrap_err();
    assert_eq!(err.to_string(), format!("cannot store a second value for key {key0} at LSN 0/200: clog set status record"));
    m.commit().unwrap();

    let r = PgReconstructor::rust_only();
    let d = Datadir::new(&t, &r);
    let seg = d.get_slru_segment(SlruKind::Clog, 0, Lsn(0x200)).unwrap();
    assert_eq!(seg[0], 0b1000_0000, "xid 3 aborted");
    assert_eq!(seg[8192], 0b0000_0001, "xid 32768 committed");
    assert_eq!(d.get_rel_size(rel(16384, ForkNumber::Main), Lsn(0x200)).unwrap(), 5);
    assert_eq!(d.get_rel_size(rel(16384, ForkNumber::Main), Lsn(0x100)).unwrap(), 2);
}
