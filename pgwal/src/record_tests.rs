//! Tests of `DecodedRecord` (block references, images, data layout, every cross-check of
//! `DecodeXLogRecord`) and of the metadata parsers, on records built by the test encoder.

use bytes::Bytes;
use proptest::prelude::*;
use proto::{BlockNumber, ForkNumber, Lsn, RelTag};

use crate::consts::*;
use crate::fpi::tests::sample_page;
use crate::fpi::{make_block_image, ImageCompression};
use crate::parse::*;
use crate::test_encoder::{BlockSpec, RecordSpec};
use crate::{DecodedRecord, RelFileNode, TransactionId, WalError};

const LSN: Lsn = Lsn(0x0100_0028);

fn rel(relnode: u32, forknum: ForkNumber) -> RelTag {
    RelTag { spcnode: 1663, dbnode: 5, relnode, forknum }
}

/// Little-endian concatenation of u32 fields, the shape of most rmgr structs.
fn u32s(fields: &[u32]) -> Vec<u8> {
    fields.iter().flat_map(|f| f.to_le_bytes()).collect()
}

fn decode_raw(raw: Vec<u8>) -> Result<DecodedRecord, WalError> {
    DecodedRecord::decode(LSN, Bytes::from(raw))
}

/// Re-signs a hand-edited record so that only the edit, not the CRC, is under test.
fn resign(mut raw: Vec<u8>) -> Vec<u8> {
    let crc = crate::record::record_crc(&raw);
    raw[20..24].copy_from_slice(&crc.to_le_bytes());
    raw
}

#[test]
fn block_references_images_and_data_decode() {
    let page = sample_page(5);
    let spec = RecordSpec::new(RM_HEAP_ID, XLOG_HEAP_UPDATE)
        .xid(900)
        .block(BlockSpec::new(0, rel(16384, ForkNumber::Main), 7).data(vec![1, 2, 3]).will_init())
        .block(BlockSpec::new(1, rel(16384, ForkNumber::Main), 3).image(make_block_image(&page, 200, 5800, ImageCompression::Pglz)))
        .block(BlockSpec::new(2, rel(16384, ForkNumber::Fsm), 0).image(make_block_image(&page, 200, 5800, ImageCompression::Lz4)))
        .block(
            BlockSpec::new(5, rel(16390, ForkNumber::VisibilityMap), 1)
                .image(make_block_image(&page, 0, 0, ImageCompression::Zstd))
                .data(vec![9; 300]),
        )
        .block(BlockSpec::new(6, rel(16390, ForkNumber::Main), 2).image(make_block_image(&page, 200, 5800, ImageCompression::None)))
        .main_data(vec![0xAB; 400]);
    let mut spec = spec;
    spec.origin = Some(3);
    spec.toplevel_xid = Some(899);
    let d = decode_raw(spec.encode(Lsn(0x0100_0000))).unwrap();
    assert_eq!(d.header.xid, TransactionId(900));
    assert_eq!(d.header.prev, Lsn(0x0100_0000));
    assert_eq!(d.rmgr_info(), XLOG_HEAP_UPDATE);
    assert_eq!((d.origin, d.toplevel_xid), (Some(3), Some(TransactionId(899))));
    assert_eq!(d.main_data, Bytes::from(vec![0xAB; 400]));
    assert_eq!(d.blocks.iter().map(|b| b.block_id).collect::<Vec<_>>(), vec![0, 1, 2, 5, 6]);

    let b0 = d.block(0).unwrap();
    assert!(b0.will_init() && b0.has_data() && !b0.has_image() && b0.initializes_page());
    assert_eq!((b0.rel, b0.blkno, &b0.data[..]), (rel(16384, ForkNumber::Main), BlockNumber(7), &[1, 2, 3][..]));
    // Same relation, different fork: the encoder used BKPBLOCK_SAME_REL and the decoder
    // must still give each block its own fork.
    assert!(d.block(1).unwrap().same_rel() && d.block(2).unwrap().same_rel());
    assert_eq!(d.block(2).unwrap().rel, rel(16384, ForkNumber::Fsm));
    assert!(!d.block(5).unwrap().same_rel());
    assert_eq!(d.block(5).unwrap().data.len(), 300);
    assert_eq!(d.block(1).unwrap().image.as_ref().unwrap().compression, ImageCompression::Pglz);
    assert_eq!(d.block(2).unwrap().image.as_ref().unwrap().compression, ImageCompression::Lz4);
    assert_eq!(d.block(5).unwrap().image.as_ref().unwrap().compression, ImageCompression::Zstd);
    assert_eq!(d.block(6).unwrap().image.as_ref().unwrap().hole_length, 5800);
    for id in [1, 2, 5, 6] {
        assert_eq!(&d.restore_page(id).unwrap()[..], &page[..], "block {id}");
        assert!(d.block(id).unwrap().initializes_page());
    }
    assert!(matches!(d.restore_page(0), Err(WalError::InvalidImage { block_id: 0, .. })));
    assert!(d.block(3).is_none());
}

#[test]
fn decode_checks_crc_and_length() {
    let raw = RecordSpec::new(RM_XLOG_ID, XLOG_NOOP).main_data(vec![1; 10]).encode(Lsn(8));
    let mut bad = raw.clone();
    bad[30] ^= 1;
    assert!(matches!(decode_raw(bad), Err(WalError::IncorrectChecksum { lsn: LSN, .. })));
    let mut longer = raw.clone();
    longer.push(0);
    assert!(matches!(decode_raw(longer), Err(WalError::InvalidRecordLength { .. })));
    assert!(matches!(decode_raw(raw[..10].to_vec()), Err(WalError::InvalidRecordLength { .. })));
}

#[test]
fn block_header_cross_checks_are_enforced() {
    let base = RecordSpec::new(RM_HEAP_ID, 0)
        .block(BlockSpec::new(0, rel(1, ForkNumber::Main), 1).data(vec![7; 4]))
        .block(BlockSpec::new(1, rel(1, ForkNumber::Main), 2).data(vec![8; 4]))
        .encode(Lsn(8));
    // Layout: header(24) | id0 flags len(2) rnode(12) blk(4) | id1 flags len(2) blk(4) | data
    let edit = |at: usize, value: u8| {
        let mut raw = base.clone();
        raw[at] = value;
        decode_raw(resign(raw))
    };
    assert!(matches!(edit(24 + 20, 0), Err(WalError::OutOfOrderBlockId { block_id: 0, .. })));
    assert!(matches!(edit(24 + 20, 40), Err(WalError::InvalidBlockId { block_id: 40, .. })));
    assert!(matches!(edit(24 + 1, BKPBLOCK_HAS_DATA | 9), Err(WalError::InvalidBlockRef { block_id: 0, .. })));
    let err = edit(24 + 1, 0).unwrap_err(); // data length 4 without HAS_DATA
    assert!(err.to_string().contains("BKPBLOCK_HAS_DATA not set, but data length is 4"), "{err}");
    let err = edit(24 + 1, BKPBLOCK_HAS_DATA | BKPBLOCK_SAME_REL).unwrap_err();
    assert!(err.to_string().contains("BKPBLOCK_SAME_REL set but no previous rel"), "{err}");
    assert!(matches!(edit(24 + 2, 5), Err(WalError::InvalidRecordData { .. }))); // data lengths don't add up
    let mut truncated = base.clone();
    truncated.truncate(30);
    truncated[0..4].copy_from_slice(&30u32.to_le_bytes());
    assert!(matches!(decode_raw(resign(truncated)), Err(WalError::InvalidRecordData { .. })));
}

#[test]
fn image_header_cross_checks_are_enforced() {
    let page = sample_page(1);
    let image = make_block_image(&page, 200, 5800, ImageCompression::Lz4);
    let base = RecordSpec::new(RM_XLOG_ID, XLOG_FPI).block(BlockSpec::new(0, rel(1, ForkNumber::Main), 1).image(image)).encode(Lsn(8));
    // Layout: header(24) | id flags len(2) | bimg_len(2) hole_offset(2) bimg_info | hole_length(2) | ...
    let edit = |at: usize, bytes: &[u8]| {
        let mut raw = base.clone();
        raw[at..at + bytes.len()].copy_from_slice(bytes);
        decode_raw(resign(raw))
    };
    let msg = |r: Result<DecodedRecord, WalError>| r.unwrap_err().to_string();
    assert!(msg(edit(30, &0u16.to_le_bytes())).contains("BKPIMAGE_HAS_HOLE set, but hole offset 0"));
    assert!(msg(edit(33, &0u16.to_le_bytes())).contains("length 0"));
    assert!(msg(edit(33, &8000u16.to_le_bytes())).contains("lies outside the page"));
    assert!(msg(edit(32, &[BKPIMAGE_APPLY | BKPIMAGE_COMPRESS_LZ4])).contains("BKPIMAGE_HAS_HOLE not set, but hole offset 200"));
    assert!(msg(edit(32, &[BKPIMAGE_HAS_HOLE | BKPIMAGE_COMPRESS_LZ4 | BKPIMAGE_COMPRESS_ZSTD])).contains("unknown method"));
    assert!(msg(edit(28, &8192u16.to_le_bytes())).contains("block image length 8192"));
    // A corrupt compressed payload decodes as a record but fails to restore. The payload
    // follows the 51 bytes of headers (record 24, block 4, image 5 + 2, rnode 12, block 4).
    let mut raw = base.clone();
    raw[51..].fill(0xff);
    let d = decode_raw(resign(raw)).unwrap();
    assert!(matches!(d.restore_page(0), Err(WalError::InvalidImage { lsn: LSN, block_id: 0, .. })));
}

proptest! {
    #[test]
    fn decode_never_panics_on_arbitrary_records(body in prop::collection::vec(any::<u8>(), 0..600), rmid in any::<u8>(), info in any::<u8>()) {
        let mut raw = vec![0u8; 24];
        raw.extend_from_slice(&body);
        let len = raw.len() as u32;
        raw[0..4].copy_from_slice(&len.to_le_bytes());
        raw[16] = info;
        raw[17] = rmid;
        if let Ok(d) = decode_raw(resign(raw)) {
            for b in &d.blocks {
                let _ = d.restore_page(b.block_id);
            }
            let _ = parse_metadata(&d);
        }
    }

    #[test]
    fn metadata_parsers_never_panic(main in prop::collection::vec(any::<u8>(), 0..700), rmid in 0u8..12, info in any::<u8>()) {
        let spec = RecordSpec::new(rmid, info & 0xF0)
            .block(BlockSpec::new(0, rel(1, ForkNumber::Main), 1))
            .block(BlockSpec::new(1, rel(1, ForkNumber::Main), 2))
            .main_data(main);
        let _ = parse_metadata(&spec.decoded(LSN));
    }
}

fn parse(spec: RecordSpec) -> Result<Option<MetadataRecord>, WalError> {
    parse_metadata(&spec.decoded(LSN))
}

fn parsed(spec: RecordSpec) -> MetadataRecord {
    parse(spec).unwrap().expect("a metadata record")
}

#[test]
fn smgr_records_parse() {
    let create = RecordSpec::new(RM_SMGR_ID, XLOG_SMGR_CREATE).main_data(u32s(&[1663, 5, 16384, 2]));
    assert_eq!(parsed(create), MetadataRecord::SmgrCreate(SmgrCreate { rel: rel(16384, ForkNumber::VisibilityMap) }));
    let bad_fork = RecordSpec::new(RM_SMGR_ID, XLOG_SMGR_CREATE).main_data(u32s(&[1663, 5, 16384, 7]));
    assert!(parse(bad_fork).unwrap_err().to_string().contains("invalid fork number 7"));
    let trunc = RecordSpec::new(RM_SMGR_ID, XLOG_SMGR_TRUNCATE).main_data(u32s(&[10, 1663, 5, 16384, SMGR_TRUNCATE_ALL]));
    let MetadataRecord::SmgrTruncate(t) = parsed(trunc) else { panic!() };
    assert_eq!((t.blkno, t.rnode.relnode), (BlockNumber(10), 16384));
    assert!(t.truncates(ForkNumber::Main) && t.truncates(ForkNumber::VisibilityMap) && !t.truncates(ForkNumber::Init));
    let short = RecordSpec::new(RM_SMGR_ID, XLOG_SMGR_TRUNCATE).main_data(u32s(&[10, 1663, 5, 16384]));
    assert_eq!(parse(short).unwrap_err().to_string(), "invalid smgr truncate record at 0/1000028: main data is 16 bytes, expected 20");
}

#[test]
fn database_records_parse() {
    let copy = RecordSpec::new(RM_DBASE_ID, XLOG_DBASE_CREATE_FILE_COPY).main_data(u32s(&[16400, 1663, 1, 1663]));
    let expected = DbaseCreate {
        db_id: 16400,
        tablespace_id: 1663,
        strategy: DbaseCreateStrategy::FileCopy { src_db_id: 1, src_tablespace_id: 1663 },
    };
    assert_eq!(parsed(copy), MetadataRecord::DbaseCreate(expected));
    let wal_log = RecordSpec::new(RM_DBASE_ID, XLOG_DBASE_CREATE_WAL_LOG).main_data(u32s(&[16401, 1663]));
    let MetadataRecord::DbaseCreate(c) = parsed(wal_log) else { panic!() };
    assert_eq!(c.strategy, DbaseCreateStrategy::WalLog);
    let drop = RecordSpec::new(RM_DBASE_ID, XLOG_DBASE_DROP).main_data(u32s(&[16400, 2, 1663, 16500]));
    assert_eq!(parsed(drop), MetadataRecord::DbaseDrop(DbaseDrop { db_id: 16400, tablespace_ids: vec![1663, 16500] }));
    let lying = RecordSpec::new(RM_DBASE_ID, XLOG_DBASE_DROP).main_data(u32s(&[16400, 3, 1663]));
    assert!(parse(lying).is_err());
    let negative = RecordSpec::new(RM_DBASE_ID, XLOG_DBASE_DROP).main_data(u32s(&[16400, u32::MAX]));
    assert!(parse(negative).unwrap_err().to_string().contains("negative ntablespaces: -1"));
}

#[test]
fn xact_commit_with_every_part_parses() {
    let xinfo = XACT_XINFO_HAS_DBINFO
        | XACT_XINFO_HAS_SUBXACTS
        | XACT_XINFO_HAS_RELFILENODES
        | XACT_XINFO_HAS_DROPPED_STATS
        | XACT_XINFO_HAS_INVALS
        | XACT_XINFO_HAS_TWOPHASE
        | XACT_XINFO_HAS_GID
        | XACT_XINFO_HAS_ORIGIN;
    let mut main = 123_456_789i64.to_le_bytes().to_vec();
    main.extend(u32s(&[xinfo, 5, 1663, 2, 801, 802, 1, 1663, 5, 16384, 1, 0, 5, 16384, 2]));
    main.extend(vec![0u8; 32]); // two invalidation messages
    main.extend(u32s(&[800]));
    main.extend(b"gid-1\0");
    main.extend(0x0100_0000u64.to_le_bytes());
    main.extend(42i64.to_le_bytes());
    let spec = RecordSpec::new(RM_XACT_ID, XLOG_XACT_COMMIT_PREPARED | XLOG_XACT_HAS_INFO).xid(0).main_data(main);
    let MetadataRecord::XactCompletion(c) = parsed(spec) else { panic!() };
    assert_eq!(c.kind, XactKind::CommitPrepared);
    assert_eq!(c.xid, TransactionId(800));
    assert_eq!((c.xact_time, c.xinfo, c.db_id, c.ts_id), (123_456_789, xinfo, 5, 1663));
    assert_eq!(c.subxacts, vec![TransactionId(801), TransactionId(802)]);
    assert_eq!(c.dropped_rels, vec![RelFileNode { spcnode: 1663, dbnode: 5, relnode: 16384 }]);
    assert_eq!(c.twophase_gid.as_deref(), Some("gid-1"));
    assert_eq!(c.origin, Some((Lsn(0x0100_0000), 42)));
}

#[test]
fn xact_abort_and_plain_commit_parse() {
    // An abort never has invalidations, even if the bit is set (ParseAbortRecord).
    let xinfo = XACT_XINFO_HAS_RELFILENODES | XACT_XINFO_HAS_INVALS;
    let mut main = 5i64.to_le_bytes().to_vec();
    main.extend(u32s(&[xinfo, 1, 1663, 5, 16384]));
    let abort = RecordSpec::new(RM_XACT_ID, XLOG_XACT_ABORT | XLOG_XACT_HAS_INFO).xid(733).main_data(main);
    let MetadataRecord::XactCompletion(a) = parsed(abort) else { panic!() };
    assert_eq!((a.kind, a.xid, a.dropped_rels.len()), (XactKind::Abort, TransactionId(733), 1));

    let commit = RecordSpec::new(RM_XACT_ID, XLOG_XACT_COMMIT).xid(734).main_data(7i64.to_le_bytes().to_vec());
    let MetadataRecord::XactCompletion(c) = parsed(commit) else { panic!() };
    assert_eq!((c.kind, c.xid, c.xinfo, c.subxacts.len()), (XactKind::Commit, TransactionId(734), 0, 0));

    let mut huge = 5i64.to_le_bytes().to_vec();
    huge.extend(u32s(&[XACT_XINFO_HAS_SUBXACTS, 1_000_000_000]));
    let lying = RecordSpec::new(RM_XACT_ID, XLOG_XACT_COMMIT | XLOG_XACT_HAS_INFO).main_data(huge);
    assert!(parse(lying).unwrap_err().to_string().contains("1000000000 transaction ids announced"));
    let no_2pc = RecordSpec::new(RM_XACT_ID, XLOG_XACT_ABORT_PREPARED).main_data(7i64.to_le_bytes().to_vec());
    assert!(parse(no_2pc).is_err());
    let assignment = RecordSpec::new(RM_XACT_ID, XLOG_XACT_ASSIGNMENT).main_data(vec![0; 8]);
    assert_eq!(parse(assignment).unwrap(), None);
}

#[test]
fn xact_prepare_parses() {
    let mut main = u32s(&[TWOPHASE_MAGIC, 0, 740, 5]);
    main.extend(99i64.to_le_bytes());
    main.extend(u32s(&[10, 1, 1, 0, 0, 0, 0])); // owner, nsubxacts, ncommitrels, nabortrels, stats, invals
    main.extend([0u8, 0]); // initfileinval, padding
    main.extend(6u16.to_le_bytes()); // gidlen
    main.extend([0u8; 16]); // origin
    main.extend(b"gid-2\0\0\0"); // MAXALIGNed gid
    main.extend(u32s(&[741, 0])); // subxact, padded
    main.extend(u32s(&[1663, 5, 16385, 0])); // commit rel, padded
    let spec = RecordSpec::new(RM_XACT_ID, XLOG_XACT_PREPARE).xid(740).main_data(main.clone());
    let MetadataRecord::XactPrepare(p) = parsed(spec) else { panic!() };
    assert_eq!((p.xid, p.db_id, p.prepared_at, p.owner, p.gid.as_str()), (TransactionId(740), 5, 99, 10, "gid-2"));
    assert_eq!(p.subxacts, vec![TransactionId(741)]);
    assert_eq!(p.commit_rels[0].relnode, 16385);
    assert!(p.abort_rels.is_empty());
    assert_eq!(p.state_file().len(), main.len() + 4);
    main[0] ^= 1;
    let bad = RecordSpec::new(RM_XACT_ID, XLOG_XACT_PREPARE).main_data(main);
    assert!(parse(bad).unwrap_err().to_string().contains("invalid two-phase magic number"));
}

#[test]
fn slru_records_parse() {
    let zero = RecordSpec::new(RM_CLOG_ID, CLOG_ZEROPAGE).main_data(u32s(&[3]));
    assert_eq!(parsed(zero), MetadataRecord::ClogZeroPage { pageno: 3 });
    let trunc = RecordSpec::new(RM_CLOG_ID, CLOG_TRUNCATE).main_data(u32s(&[2, 1000, 5]));
    assert_eq!(
        parsed(trunc),
        MetadataRecord::ClogTruncate(ClogTruncate { pageno: 2, oldest_xact: TransactionId(1000), oldest_xact_db: 5 })
    );
    let off = RecordSpec::new(RM_MULTIXACT_ID, XLOG_MULTIXACT_ZERO_OFF_PAGE).main_data(u32s(&[0]));
    assert_eq!(parsed(off), MetadataRecord::MultiXactZeroOffsetPage { pageno: 0 });
    let mem = RecordSpec::new(RM_MULTIXACT_ID, XLOG_MULTIXACT_ZERO_MEM_PAGE).main_data(u32s(&[1]));
    assert_eq!(parsed(mem), MetadataRecord::MultiXactZeroMemberPage { pageno: 1 });
    let create = RecordSpec::new(RM_MULTIXACT_ID, XLOG_MULTIXACT_CREATE_ID).main_data(u32s(&[4, 9, 2, 750, 1, 751, 5]));
    let MetadataRecord::MultiXactCreate(m) = parsed(create) else { panic!() };
    assert_eq!((m.mid.0, m.moff.0), (4, 9));
    assert_eq!(m.members[1], MultiXactMember { xid: TransactionId(751), status: MultiXactStatus::Update });
    let bad_status = RecordSpec::new(RM_MULTIXACT_ID, XLOG_MULTIXACT_CREATE_ID).main_data(u32s(&[4, 9, 1, 750, 6]));
    assert!(parse(bad_status).is_err());
    let trunc = RecordSpec::new(RM_MULTIXACT_ID, XLOG_MULTIXACT_TRUNCATE_ID).main_data(u32s(&[5, 1, 10, 0, 40]));
    let MetadataRecord::MultiXactTruncate(t) = parsed(trunc) else { panic!() };
    assert_eq!((t.end_trunc_off.0, t.end_trunc_memb.0), (10, 40));
}

#[test]
fn relmap_update_parses() {
    let mut main = u32s(&[5, 1663, 512]);
    main.extend(vec![0x27; 512]);
    let MetadataRecord::RelmapUpdate(r) = parsed(RecordSpec::new(RM_RELMAP_ID, XLOG_RELMAP_UPDATE).main_data(main.clone())) else {
        panic!()
    };
    assert_eq!((r.db_id, r.tablespace_id, r.data.len()), (5, 1663, 512));
    main[8..12].copy_from_slice(&256u32.to_le_bytes()); // nbytes no longer sizeof(RelMapFile)
    assert!(parse(RecordSpec::new(RM_RELMAP_ID, XLOG_RELMAP_UPDATE).main_data(main)).is_err());
}

#[test]
fn running_xacts_parse_and_bad_ones_are_refused() {
    // xcnt 2, subxcnt 1, subxid_overflow false (and 3 bytes of padding), nextXid 760,
    // oldestRunningXid 741, latestCompletedXid 759, xids 741, 745, subxid 746.
    let main = |overflow: u8, xcnt: u32| {
        let mut m = u32s(&[xcnt, 1]);
        m.extend([overflow, 0, 0, 0]);
        m.extend(u32s(&[760, 741, 759, 741, 745, 746]));
        m
    };
    let spec = |m: Vec<u8>| RecordSpec::new(RM_STANDBY_ID, XLOG_RUNNING_XACTS).main_data(m);
    let MetadataRecord::RunningXacts(r) = parsed(spec(main(0, 2))) else { panic!() };
    assert_eq!((r.xcnt, r.subxcnt, r.subxid_overflow), (2, 1, false));
    assert_eq!((r.next_xid, r.oldest_running_xid, r.latest_completed_xid), (TransactionId(760), TransactionId(741), TransactionId(759)));
    let MetadataRecord::RunningXacts(r) = parsed(spec(main(1, 2))) else { panic!() };
    assert!(r.subxid_overflow);
    assert!(parse(spec(main(2, 2))).is_err(), "a bool that is neither 0 nor 1");
    assert!(parse(spec(main(0, 3))).is_err(), "more xids announced than present");
    assert!(parse(spec(main(0, u32::MAX))).is_err(), "a negative count");
    assert!(parse(spec(u32s(&[0, 0]))).is_err(), "shorter than the fixed part");
    // Lock and invalidation records of the standby manager are not metadata.
    assert!(parse(RecordSpec::new(RM_STANDBY_ID, XLOG_STANDBY_LOCK).main_data(u32s(&[0]))).unwrap().is_none());
}

#[test]
fn heap_records_report_visibility_map_changes() {
    let heap = rel(16384, ForkNumber::Main);
    let b0 = || BlockSpec::new(0, heap, 40_000).data(vec![1]);
    let insert = |flags: u8| RecordSpec::new(RM_HEAP_ID, XLOG_HEAP_INSERT).block(b0()).main_data(vec![1, 0, flags]);
    assert_eq!(parse(insert(0)).unwrap(), None);
    let MetadataRecord::VmBitsCleared(c) = parsed(insert(XLH_INSERT_ALL_VISIBLE_CLEARED)) else { panic!() };
    assert_eq!(c.len(), 1);
    assert_eq!((c[0].rel, c[0].heap_blkno, c[0].bits), (heap, BlockNumber(40_000), VISIBILITYMAP_VALID_BITS));
    assert_eq!(c[0].location().vm_blkno, BlockNumber(1));

    let mut upd = vec![0u8; SIZE_OF_HEAP_UPDATE];
    upd[7] = XLH_UPDATE_OLD_ALL_VISIBLE_CLEARED | XLH_UPDATE_NEW_ALL_VISIBLE_CLEARED;
    let two_pages =
        RecordSpec::new(RM_HEAP_ID, XLOG_HEAP_UPDATE).block(b0()).block(BlockSpec::new(1, heap, 12).data(vec![1])).main_data(upd.clone());
    let MetadataRecord::VmBitsCleared(c) = parsed(two_pages) else { panic!() };
    assert_eq!(c.iter().map(|c| c.heap_blkno.0).collect::<Vec<_>>(), vec![12, 40_000]);
    let hot = RecordSpec::new(RM_HEAP_ID, XLOG_HEAP_HOT_UPDATE).block(b0()).main_data(upd);
    let MetadataRecord::VmBitsCleared(c) = parsed(hot) else { panic!() };
    assert_eq!(c.len(), 1, "old and new page are the same block");

    let mut del = vec![0u8; SIZE_OF_HEAP_DELETE];
    del[7] = XLH_DELETE_ALL_VISIBLE_CLEARED;
    assert!(matches!(
        parsed(RecordSpec::new(RM_HEAP_ID, XLOG_HEAP_DELETE).block(b0()).main_data(del.clone())),
        MetadataRecord::VmBitsCleared(_)
    ));
    // The block the flags refer to must be there.
    assert!(parse(RecordSpec::new(RM_HEAP_ID, XLOG_HEAP_DELETE).main_data(del)).is_err());

    let mut lock = vec![0u8; SIZE_OF_HEAP_LOCK];
    lock[7] = XLH_LOCK_ALL_FROZEN_CLEARED;
    let MetadataRecord::VmBitsCleared(c) = parsed(RecordSpec::new(RM_HEAP_ID, XLOG_HEAP_LOCK).block(b0()).main_data(lock.clone())) else {
        panic!()
    };
    assert_eq!(c[0].bits, VISIBILITYMAP_ALL_FROZEN);
    let MetadataRecord::VmBitsCleared(c) = parsed(RecordSpec::new(RM_HEAP2_ID, XLOG_HEAP2_LOCK_UPDATED).block(b0()).main_data(lock)) else {
        panic!()
    };
    assert_eq!(c[0].bits, VISIBILITYMAP_ALL_FROZEN);

    let multi = RecordSpec::new(RM_HEAP2_ID, XLOG_HEAP2_MULTI_INSERT | XLOG_HEAP_INIT_PAGE).block(b0()).main_data(vec![
        XLH_INSERT_ALL_VISIBLE_CLEARED,
        0,
        1,
        0,
        1,
        0,
    ]);
    assert!(matches!(parsed(multi), MetadataRecord::VmBitsCleared(_)));

    let visible = RecordSpec::new(RM_HEAP2_ID, XLOG_HEAP2_VISIBLE)
        .block(BlockSpec::new(0, rel(16384, ForkNumber::VisibilityMap), 0))
        .block(BlockSpec::new(1, heap, 77))
        .main_data(vec![0, 0, 0, 0, VISIBILITYMAP_ALL_VISIBLE]);
    assert_eq!(
        parsed(visible),
        MetadataRecord::VmBitsSet(VmBitsSet { rel: heap, heap_blkno: BlockNumber(77), bits: VISIBILITYMAP_ALL_VISIBLE })
    );
    let short = RecordSpec::new(RM_HEAP_ID, XLOG_HEAP_INSERT).block(b0()).main_data(vec![1, 0]);
    assert!(parse(short).unwrap_err().to_string().contains("expected at least 3"));
}

#[test]
fn xlog_records_parse() {
    assert_eq!(parsed(RecordSpec::new(RM_XLOG_ID, XLOG_SWITCH)), MetadataRecord::Switch);
    assert_eq!(parsed(RecordSpec::new(RM_XLOG_ID, XLOG_NEXTOID).main_data(u32s(&[24576]))), MetadataRecord::NextOid(24576));
    assert_eq!(parse(RecordSpec::new(RM_XLOG_ID, XLOG_FPI)).unwrap(), None);
    assert_eq!(parse(RecordSpec::new(RM_BTREE_ID, 0).main_data(vec![1; 20])).unwrap(), None);
}
