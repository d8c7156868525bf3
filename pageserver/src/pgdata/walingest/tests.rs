//! Ingest of metadata records built by hand, checked through the data directory reads.
//! Block references and real WAL are covered by `tests/ingest_real.rs`.

use std::sync::Arc;

use bytes::Bytes;
use pgwal::consts::*;
use pgwal::DecodedRecord;
use proto::page::PAGE_SIZE_BYTES;
use proto::{BlockNumber, ForkNumber, Key, Lsn, RelTag, SlruKind, TenantId, TimelineId};

use super::WalIngest;
use crate::pgdata::datadir::codec::{DbEntry, RelEntry};
use crate::pgdata::datadir::{Datadir, Modification};
use crate::pgdata::reconstruct::layout::{clog_get_status, XidStatus};
use crate::pgdata::reconstruct::PgReconstructor;
use layerstore::tenant::Tenant;
use layerstore::timeline::Timeline;
use layerstore::StorageConfig;

/// A WAL record with only main data, CRC included.
fn record(lsn: u64, rmid: u8, info: u8, xid: u32, main: &[u8]) -> DecodedRecord {
    let mut body = Vec::new();
    if main.len() < 256 {
        body.extend_from_slice(&[XLR_BLOCK_ID_DATA_SHORT, main.len() as u8]);
    } else {
        body.push(XLR_BLOCK_ID_DATA_LONG);
        body.extend_from_slice(&(main.len() as u32).to_le_bytes());
    }
    body.extend_from_slice(main);
    let mut raw = Vec::new();
    raw.extend_from_slice(&((24 + body.len()) as u32).to_le_bytes());
    raw.extend_from_slice(&xid.to_le_bytes());
    raw.extend_from_slice(&0u64.to_le_bytes());
    raw.extend_from_slice(&[info, rmid, 0, 0, 0, 0, 0, 0]);
    raw.extend_from_slice(&body);
    let crc = pgwal::record::record_crc(&raw);
    raw[20..24].copy_from_slice(&crc.to_le_bytes());
    DecodedRecord::decode(Lsn(lsn), Bytes::from(raw)).unwrap()
}

fn le(fields: &[u32]) -> Vec<u8> {
    fields.iter().flat_map(|f| f.to_le_bytes()).collect()
}

const DB: u32 = 5;

fn rel(relnode: u32, forknum: ForkNumber) -> RelTag {
    RelTag { spcnode: 1663, dbnode: DB, relnode, forknum }
}

fn page(fill: u8) -> Bytes {
    Bytes::from(vec![fill; PAGE_SIZE_BYTES])
}

struct Fixture {
    _dir: tempfile::TempDir,
    _tenant: Tenant,
    timeline: Arc<Timeline>,
    ingest: WalIngest,
    lsn: u64,
}

impl Fixture {
    /// Database 5 with relation 16384 (main: 2 image blocks) and a relation map, at 0x100.
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let tenant = Tenant::create(dir.path(), TenantId([3; 16]), StorageConfig::default(), &[]).unwrap();
        let timeline = tenant.create_timeline(TimelineId([4; 16])).unwrap();
        let mut m = Modification::new(&timeline, Lsn(0x100));
        m.put_db_dir(&[DbEntry { spcnode: 1663, dbnode: DB }].into());
        m.put_rel_dir(1663, DB, &[RelEntry { relnode: 16384, forknum: ForkNumber::Main }].into());
        m.put_rel_size(rel(16384, ForkNumber::Main), 2);
        m.put_image(Key::rel_block(rel(16384, ForkNumber::Main), BlockNumber(0)), page(1));
        m.put_image(Key::rel_block(rel(16384, ForkNumber::Main), BlockNumber(1)), page(2));
        m.put_image(Key::relmap_file(1663, DB), Bytes::from(vec![9u8; 512]));
        m.commit().unwrap();
        let ingest = WalIngest::new(timeline.clone(), Arc::new(PgReconstructor::rust_only()));
        Fixture { _dir: dir, _tenant: tenant, timeline, ingest, lsn: 0x100 }
    }

    fn ingest(&mut self, rmid: u8, info: u8, xid: u32, main: &[u8]) {
        let rec = record(self.lsn, rmid, info, xid, main);
        self.lsn += 0x40;
        self.ingest.ingest_record(&rec, Lsn(self.lsn)).unwrap();
    }

    fn check<T>(&self, f: impl FnOnce(&Datadir<'_>, Lsn) -> T) -> T {
        let r = PgReconstructor::rust_only();
        f(&Datadir::new(&self.timeline, &r), Lsn(self.lsn))
    }
}

#[test]
fn smgr_create_and_truncate_with_the_visibility_map() {
    let mut f = Fixture::new();
    f.ingest(RM_SMGR_ID, XLOG_SMGR_CREATE, 0, &le(&[1663, DB, 16400, ForkNumber::VisibilityMap as u32]));
    f.ingest(RM_SMGR_ID, XLOG_SMGR_CREATE, 0, &le(&[1663, DB, 16400, ForkNumber::Fsm as u32]));
    f.check(|d, lsn| {
        assert!(d.rel_exists(rel(16400, ForkNumber::VisibilityMap), lsn).unwrap());
        assert_eq!(d.get_rel_size(rel(16400, ForkNumber::VisibilityMap), lsn).unwrap(), 0);
        assert!(!d.rel_exists(rel(16400, ForkNumber::Fsm), lsn).unwrap(), "the FSM is not stored");
        assert!(!d.rel_exists(rel(16400, ForkNumber::Main), lsn).unwrap());
    });
    // Give the map two pages of set bits and the heap a size that needs them.
    let vm = rel(16400, ForkNumber::VisibilityMap);
    let mut m = Modification::new(&f.timeline, Lsn(f.lsn + 0x40));
    f.lsn += 0x40;
    m.put_rel_size(vm, 2);
    let mut bits = vec![0u8; PAGE_SIZE_BYTES];
    bits[24..].fill(0xff);
    m.put_image(Key::rel_block(vm, BlockNumber(0)), Bytes::from(bits.clone()));
    m.put_image(Key::rel_block(vm, BlockNumber(1)), Bytes::from(bits));
    m.commit().unwrap();
    let mut ingest = WalIngest::new(f.timeline.clone(), Arc::new(PgReconstructor::rust_only()));
    std::mem::swap(&mut f.ingest, &mut ingest);

    // Truncate the heap to 32672 + 6 blocks: the second map page keeps blocks 32672..32678.
    let flags = SMGR_TRUNCATE_HEAP | SMGR_TRUNCATE_VM | SMGR_TRUNCATE_FSM;
    f.ingest(RM_SMGR_ID, XLOG_SMGR_TRUNCATE, 0, &le(&[32678, 1663, DB, 16400, flags]));
    f.check(|d, lsn| {
        assert!(d.rel_exists(rel(16400, ForkNumber::Main), lsn).unwrap(), "truncation creates the main fork");
        assert_eq!(d.get_rel_size(vm, lsn).unwrap(), 2);
        let p = d.get_rel_page(vm, BlockNumber(1), lsn).unwrap();
        assert_eq!(&p[24..27], &[0xff, 0b0000_1111, 0]);
        assert!(p[27..].iter().all(|&b| b == 0));
        assert!(d.get_rel_page(vm, BlockNumber(0), lsn).unwrap()[24..].iter().all(|&b| b == 0xff));
    });
    // Truncating to a map page boundary just cuts the map.
    f.ingest(RM_SMGR_ID, XLOG_SMGR_TRUNCATE, 0, &le(&[32672, 1663, DB, 16400, flags]));
    f.check(|d, lsn| assert_eq!(d.get_rel_size(vm, lsn).unwrap(), 1));
}

#[test]
fn commits_and_aborts_set_clog_bits_and_drop_relations() {
    let mut f = Fixture::new();
    f.ingest(RM_CLOG_ID, CLOG_ZEROPAGE, 0, &le(&[0]));
    // xid 32767 commits with subxacts 32766 (same page) and 32770 (next page, not zeroed
    // yet: recovery reads it as zeros) and drops relation 16384.
    let mut commit = Vec::new();
    commit.extend_from_slice(&0i64.to_le_bytes());
    commit.extend_from_slice(&le(&[XACT_XINFO_HAS_SUBXACTS | XACT_XINFO_HAS_RELFILENODES, 2, 32766, 32770, 1, 1663, DB, 16384]));
    f.ingest(RM_XACT_ID, XLOG_XACT_COMMIT | XLOG_XACT_HAS_INFO, 32767, &commit);
    let mut abort = Vec::new();
    abort.extend_from_slice(&0i64.to_le_bytes());
    f.ingest(RM_XACT_ID, XLOG_XACT_ABORT, 32765, &abort);
    f.check(|d, lsn| {
        let seg = d.get_slru_segment(SlruKind::Clog, 0, lsn).unwrap();
        assert_eq!(seg.len(), 2 * PAGE_SIZE_BYTES);
        let (p0, p1) = (&seg[..PAGE_SIZE_BYTES], &seg[PAGE_SIZE_BYTES..]);
        assert_eq!(clog_get_status(p0, 32767), XidStatus::Committed);
        assert_eq!(clog_get_status(p0, 32766), XidStatus::Committed);
        assert_eq!(clog_get_status(p0, 32765), XidStatus::Aborted);
        assert_eq!(clog_get_status(p1, 32770), XidStatus::Committed);
        assert_eq!(p0[8191], 0b0101_1000);
        assert!(!d.rel_exists(rel(16384, ForkNumber::Main), lsn).unwrap());
        assert_eq!(d.get_db_size(1663, DB, lsn).unwrap(), 0);
    });
    // CLOG truncation removes whole segments before the cutoff page's segment.
    f.ingest(RM_CLOG_ID, CLOG_ZEROPAGE, 0, &le(&[64]));
    f.ingest(RM_CLOG_ID, CLOG_TRUNCATE, 0, &le(&[70, 3, 1]));
    f.check(|d, lsn| assert_eq!(d.list_slru_segments(SlruKind::Clog, lsn).unwrap(), [2].into()));
    // After wraparound segment 0 comes back: a commit on it must start from a zero page,
    // not from the truncated segment's old contents.
    let mut commit = Vec::new();
    commit.extend_from_slice(&0i64.to_le_bytes());
    f.ingest(RM_XACT_ID, XLOG_XACT_COMMIT, 32764, &commit);
    f.check(|d, lsn| {
        let seg = d.get_slru_segment(SlruKind::Clog, 0, lsn).unwrap();
        assert_eq!(clog_get_status(&seg[..PAGE_SIZE_BYTES], 32764), XidStatus::Committed);
        assert_eq!(clog_get_status(&seg[..PAGE_SIZE_BYTES], 32767), XidStatus::InProgress, "old bits are gone");
    });
}

#[test]
fn multixact_create_writes_offsets_of_it_and_its_successor_and_members() {
    let mut f = Fixture::new();
    f.ingest(RM_MULTIXACT_ID, XLOG_MULTIXACT_ZERO_OFF_PAGE, 0, &le(&[0]));
    f.ingest(RM_MULTIXACT_ID, XLOG_MULTIXACT_ZERO_MEM_PAGE, 0, &le(&[0]));
    // Multixact 2047 is the last on offsets page 0; its two members at 1635 and 1636
    // straddle members pages 0 and 1. Offsets page 1 does not exist yet (WAL of older
    // minor versions): it is initialized now and the ZERO_OFF_PAGE that follows skipped.
    f.ingest(RM_MULTIXACT_ID, XLOG_MULTIXACT_CREATE_ID, 0, &le(&[2047, 1635, 2, 700, 1, 701, 5]));
    f.ingest(RM_MULTIXACT_ID, XLOG_MULTIXACT_ZERO_OFF_PAGE, 0, &le(&[1]));
    f.check(|d, lsn| {
        let offsets = d.get_slru_segment(SlruKind::MultiXactOffsets, 0, lsn).unwrap();
        assert_eq!(offsets.len(), 2 * PAGE_SIZE_BYTES);
        assert_eq!(&offsets[8188..8192], &1635u32.to_le_bytes());
        assert_eq!(&offsets[8192..8196], &1637u32.to_le_bytes(), "the successor's offset survives");
        let members = d.get_slru_segment(SlruKind::MultiXactMembers, 0, lsn).unwrap();
        assert_eq!(members.len(), 2 * PAGE_SIZE_BYTES);
        // Member 1635: group 408 of page 0 (bytes 8160..8180), slot 3.
        assert_eq!(members[8163], 1);
        assert_eq!(&members[8176..8180], &700u32.to_le_bytes());
        // Member 1636: group 0 of page 1, slot 0.
        assert_eq!(members[8192], 5);
        assert_eq!(&members[8196..8200], &701u32.to_le_bytes());
    });
}

#[test]
fn create_database_by_file_copy_and_drop() {
    let mut f = Fixture::new();
    f.ingest(RM_DBASE_ID, XLOG_DBASE_CREATE_FILE_COPY, 0, &le(&[7, 1663, DB, 1663]));
    let copied = RelTag { dbnode: 7, ..rel(16384, ForkNumber::Main) };
    f.check(|d, lsn| {
        assert_eq!(d.list_dbs(lsn).unwrap(), [(1663, DB), (1663, 7)].into());
        assert_eq!(d.list_rels(1663, 7, lsn).unwrap(), [copied].into());
        assert_eq!(d.get_rel_size(copied, lsn).unwrap(), 2);
        assert_eq!(d.get_rel_page(copied, BlockNumber(1), lsn).unwrap(), page(2));
        assert_eq!(d.get_relmap(1663, 7, lsn).unwrap(), Bytes::from(vec![9u8; 512]));
    });
    // A relation map update replaces the file; a WAL_LOG create starts empty.
    let mut relmap = le(&[7, 1663, 512]);
    relmap.extend_from_slice(&[4u8; 512]);
    f.ingest(RM_RELMAP_ID, XLOG_RELMAP_UPDATE, 0, &relmap);
    f.ingest(RM_DBASE_ID, XLOG_DBASE_CREATE_WAL_LOG, 0, &le(&[8, 1663]));
    f.ingest(RM_DBASE_ID, XLOG_DBASE_DROP, 0, &le(&[7, 1, 1663]));
    f.check(|d, lsn| {
        assert_eq!(d.list_dbs(lsn).unwrap(), [(1663, DB), (1663, 8)].into());
        assert!(d.list_rels(1663, 8, lsn).unwrap().is_empty());
        assert!(!d.rel_exists(copied, lsn).unwrap(), "a dropped database's relations are gone");
        assert_eq!(d.get_relmap(1663, 7, Lsn(lsn.0 - 0x80)).unwrap(), Bytes::from(vec![4u8; 512]));
    });
}

#[test]
fn records_must_advance_and_a_failure_stops_ingest() {
    let mut f = Fixture::new();
    let rec = record(0x80, RM_CLOG_ID, CLOG_ZEROPAGE, 0, &le(&[0]));
    let err = f.ingest.ingest_record(&rec, Lsn(0x100)).unwrap_err();
    assert_eq!(
        format!("{err:#}"),
        "ingest the WAL record at 0/80 (ending at 0/100): record ends at 0/100, not after the last record LSN 0/100"
    );
    let rec = record(0x100, RM_CLOG_ID, CLOG_ZEROPAGE, 0, &le(&[0]));
    let err = f.ingest.ingest_record(&rec, Lsn(0x140)).unwrap_err();
    assert!(err.to_string().contains("an earlier record failed, ingest must restart"), "{err}");
    assert_eq!(f.timeline.last_record_lsn(), Lsn(0x100));
}

/// An `XLOG_CHECKPOINT_*` main data with the given counters.
fn checkpoint_data(next_xid: u64, next_oid: u32, next_multi: u32, next_offset: u32) -> Vec<u8> {
    let mut cp = pgwal::parse::CheckPoint::from_bytes(&[0u8; SIZE_OF_CHECKPOINT]).unwrap();
    cp.redo = Lsn(0x100);
    cp.this_timeline_id = pgwal::TimeLineId(1);
    cp.next_xid = pgwal::FullTransactionId(next_xid);
    cp.next_oid = next_oid;
    cp.next_multi = pgwal::MultiXactId(next_multi);
    cp.next_multi_offset = pgwal::MultiXactOffset(next_offset);
    cp.oldest_xid = pgwal::TransactionId(3);
    cp.to_bytes().to_vec()
}

#[test]
fn counters_follow_every_record_and_are_put_only_when_they_change() {
    let mut f = Fixture::new();
    // No checkpoint yet (the fixture is not an import): nothing is tracked.
    f.ingest(RM_CLOG_ID, CLOG_ZEROPAGE, 700, &le(&[0]));
    assert!(f.check(|d, lsn| d.get_checkpoint_state(lsn)).is_err());

    f.ingest(RM_XLOG_ID, XLOG_CHECKPOINT_ONLINE, 0, &checkpoint_data(500, 16384, 10, 20));
    let checkpoint_lsn = Lsn(f.lsn - 0x40);
    let state = |f: &Fixture| f.check(|d, lsn| d.get_checkpoint_state(lsn).unwrap());
    let put_at = |f: &Fixture| f.timeline.get_reconstruct_data(Key::checkpoint(), Lsn(f.lsn)).unwrap().image.unwrap().0;
    assert_eq!(state(&f).current.next_xid.0, 500);
    assert_eq!(state(&f).record_lsn, checkpoint_lsn);

    // A record's xl_xid at or after next xid advances it.
    let mut abort = Vec::new();
    abort.extend_from_slice(&0i64.to_le_bytes());
    f.ingest(RM_XACT_ID, XLOG_XACT_ABORT, 600, &abort);
    assert_eq!(state(&f).current.next_xid.0, 601);
    let changed_at = Lsn(f.lsn);
    assert_eq!(put_at(&f), changed_at);
    // An older xid changes nothing, and nothing is put.
    f.ingest(RM_XACT_ID, XLOG_XACT_ABORT, 550, &abort);
    assert_eq!(state(&f).current.next_xid.0, 601);
    assert_eq!(put_at(&f), changed_at, "no new version when nothing changed");
    // Subtransactions of a commit count too.
    let mut commit = Vec::new();
    commit.extend_from_slice(&0i64.to_le_bytes());
    commit.extend_from_slice(&le(&[XACT_XINFO_HAS_SUBXACTS, 1, 640]));
    f.ingest(RM_XACT_ID, XLOG_XACT_COMMIT | XLOG_XACT_HAS_INFO, 620, &commit);
    assert_eq!(state(&f).current.next_xid.0, 641);

    f.ingest(RM_XLOG_ID, XLOG_NEXTOID, 0, &le(&[24576]));
    f.ingest(RM_MULTIXACT_ID, XLOG_MULTIXACT_ZERO_OFF_PAGE, 0, &le(&[0]));
    f.ingest(RM_MULTIXACT_ID, XLOG_MULTIXACT_ZERO_MEM_PAGE, 0, &le(&[0]));
    f.ingest(RM_MULTIXACT_ID, XLOG_MULTIXACT_CREATE_ID, 0, &le(&[10, 20, 2, 700, 1, 701, 5]));
    let s = state(&f).current;
    assert_eq!((s.next_oid, s.next_multi.0, s.next_multi_offset.0), (24576, 11, 22));

    // An online checkpoint with older counters (its redo point is earlier) moves nothing
    // back and leaves the OID alone; its other fields replace the old ones.
    f.ingest(RM_XLOG_ID, XLOG_CHECKPOINT_ONLINE, 0, &checkpoint_data(610, 20000, 5, 10));
    let s = state(&f);
    assert_eq!((s.current.next_xid.0, s.current.next_oid, s.current.next_multi.0, s.current.next_multi_offset.0), (641, 24576, 11, 22));
    assert_eq!(s.record_lsn, Lsn(f.lsn - 0x40));
    assert_eq!(f.check(|d, lsn| d.get_checkpoint(lsn).unwrap()).1.next_oid, 20000, "the record as logged");
    // A shutdown checkpoint's OID is taken.
    f.ingest(RM_XLOG_ID, XLOG_CHECKPOINT_SHUTDOWN, 0, &checkpoint_data(700, 30000, 12, 30));
    let s = state(&f).current;
    assert_eq!((s.next_xid.0, s.next_oid, s.next_multi.0, s.next_multi_offset.0), (700, 30000, 12, 30));
    // Earlier LSNs still read the earlier counters.
    let earlier = f.check(|d, _| d.get_checkpoint_state(changed_at).unwrap());
    assert_eq!(earlier.current.next_xid.0, 601);
    assert_eq!(earlier.record_lsn, checkpoint_lsn);
}

#[test]
fn commits_store_the_last_commit_timestamp_and_aborts_do_not() {
    let mut f = Fixture::new();
    f.ingest(RM_CLOG_ID, CLOG_ZEROPAGE, 0, &le(&[0]));
    f.check(|d, lsn| assert_eq!(d.get_last_commit(lsn).unwrap(), None, "no commit yet"));
    let xact = |xact_time: i64| xact_time.to_le_bytes().to_vec();
    f.ingest(RM_XACT_ID, XLOG_XACT_COMMIT, 700, &xact(1_000));
    let first = Lsn(f.lsn);
    f.check(|d, lsn| assert_eq!(d.get_last_commit(lsn).unwrap(), Some((first, 1_000))));
    // A commit whose timestamp is older (taken before a concurrent one's, inserted after)
    // keeps the greatest, at its own LSN.
    f.ingest(RM_XACT_ID, XLOG_XACT_COMMIT, 701, &xact(900));
    let second = Lsn(f.lsn);
    f.check(|d, lsn| assert_eq!(d.get_last_commit(lsn).unwrap(), Some((second, 1_000))));
    f.ingest(RM_XACT_ID, XLOG_XACT_ABORT, 702, &xact(5_000));
    f.check(|d, lsn| assert_eq!(d.get_last_commit(lsn).unwrap(), Some((second, 1_000)), "an abort is not a commit"));
    f.ingest(RM_XACT_ID, XLOG_XACT_COMMIT, 703, &xact(2_000));
    let third = Lsn(f.lsn);
    f.check(|d, lsn| {
        assert_eq!(d.get_last_commit(lsn).unwrap(), Some((third, 2_000)));
        assert_eq!(d.get_last_commit(Lsn(third.0 - 1)).unwrap(), Some((second, 1_000)), "older LSNs keep older values");
    });
    // A new ingest (after a restart) continues from the stored value.
    let mut again = WalIngest::new(f.timeline.clone(), Arc::new(PgReconstructor::rust_only()));
    let rec = record(f.lsn, RM_XACT_ID, XLOG_XACT_COMMIT, 704, &xact(1_500));
    f.lsn += 0x40;
    again.ingest_record(&rec, Lsn(f.lsn)).unwrap();
    f.check(|d, lsn| assert_eq!(d.get_last_commit(lsn).unwrap(), Some((lsn, 2_000))));
}
