//! The seed inputs of the fuzz targets (`fuzz/seeds/TARGET/`) that decode what the
//! pageserver stores and speaks: valid encodings made by the crates' own encoders, so that
//! libFuzzer starts inside the decoders instead of at their first length check.
//!
//! `committed_seeds_decode` checks that every committed seed is still accepted by the
//! decoder its target drives (a format change that makes them stale fails it);
//! `cargo test -p pageserver --test fuzz_seeds -- --ignored write_fuzz_seeds` writes them
//! again (run it after such a change and commit the files).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use layerstore::layer::{LayerDesc, LayerKind, LayerReader, LayerWriter};
use layerstore::value::Value;
use layerstore::StorageConfig;
use pageserver::pgdata::datadir::codec::{self, DbEntry, RelEntry, StoredCheckpoint};
use pageserver::pgdata::reconstruct::layout::XidStatus;
use pageserver::StoredRecord;
use pgwal::consts::SIZE_OF_CHECKPOINT;
use pgwal::parse::CheckPoint;
use proto::filecache::{SavedEntry, SavedIndex, MAGIC_V1};
use proto::pagestream::{ErrorCode, ReadLsns, Request, Response, PROTOCOL_VERSION};
use proto::walredo::WalRedoRequest;
use proto::{BlockNumber, ForkNumber, Key, KeyRange, Lsn, RelTag, SlruKind, TenantId, TimelineId};

fn seeds_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds").join(target)
}

fn rel(relnode: u32, forknum: ForkNumber) -> RelTag {
    RelTag { spcnode: 1663, dbnode: 5, relnode, forknum }
}

/// A page that is not all zeros, so that compression and comparisons have something to do.
fn page(fill: u8) -> Vec<u8> {
    (0..proto::page::PAGE_SIZE_BYTES).map(|i| if i % 64 < 24 { fill } else { (i / 64) as u8 }).collect()
}

fn lsns(request: u64, not_modified_since: u64) -> ReadLsns {
    ReadLsns { request_lsn: Lsn(request), not_modified_since: Lsn(not_modified_since) }
}

fn proto_key() -> Vec<(&'static str, Vec<u8>)> {
    let keys = [
        ("db-dir", Key::db_dir()),
        ("relmap-file", Key::relmap_file(1663, 5)),
        ("rel-dir", Key::rel_dir(1663, 5)),
        ("rel-block", Key::rel_block(rel(16384, ForkNumber::Main), BlockNumber(7))),
        ("rel-size-vm", Key::rel_size(rel(16384, ForkNumber::VisibilityMap))),
        ("slru-block", Key::slru_block(SlruKind::MultiXactMembers, 3, BlockNumber(2))),
        ("twophase-file", Key::twophase_file(740)),
        ("checkpoint", Key::checkpoint()),
    ];
    let mut seeds: Vec<(&'static str, Vec<u8>)> = keys.iter().map(|(name, k)| (*name, k.to_bytes().to_vec())).collect();
    // Two in the text form, which the target parses too.
    seeds.push(("rel-block.txt", Key::rel_block(rel(16384, ForkNumber::Fsm), BlockNumber(1)).to_string().into_bytes()));
    seeds.push(("slru-segment-size.txt", Key::slru_segment_size(SlruKind::Clog, 0).to_string().into_bytes()));
    seeds
}

fn proto_pagestream() -> Vec<(&'static str, Vec<u8>)> {
    let tenant = TenantId::from_bytes([0x11; 16]);
    let timeline = TimelineId::from_bytes([0x22; 16]);
    let requests = [
        ("hello", Request::Hello { protocol_version: PROTOCOL_VERSION, tenant, timeline, auth_token: String::new() }),
        (
            "hello-token",
            Request::Hello { protocol_version: PROTOCOL_VERSION, tenant, timeline, auth_token: "eyJhbGciOiJFZERTQSJ9.e30.c2ln".into() },
        ),
        (
            "getpage",
            Request::GetPage { id: 1, lsns: lsns(0x0169_AD58, 0x0169_0000), rel: rel(16384, ForkNumber::Main), blkno: BlockNumber(3) },
        ),
        ("nblocks", Request::Nblocks { id: 2, lsns: lsns(0x0169_AD58, 0x0169_AD58), rel: rel(16384, ForkNumber::Fsm) }),
        ("exists", Request::Exists { id: 3, lsns: lsns(0x0169_AD58, 0x0150_0000), rel: rel(16385, ForkNumber::VisibilityMap) }),
        ("dbsize", Request::DbSize { id: 4, lsns: lsns(0x0169_AD58, 0x0169_AD58), spcnode: 1663, dbnode: 5 }),
        ("slru", Request::GetSlruSegment { id: 5, lsns: lsns(0x0169_AD58, 0x0100_0000), kind: SlruKind::Clog, segno: 0 }),
    ];
    let responses = [
        ("resp-hellook", Response::HelloOk { protocol_version: PROTOCOL_VERSION }),
        ("resp-page", Response::Page { id: 1, page: page(0x5a) }),
        ("resp-nblocks", Response::Nblocks { id: 2, nblocks: 12 }),
        ("resp-exists", Response::Exists { id: 3, exists: true }),
        ("resp-dbsize", Response::DbSize { id: 4, size_bytes: 7_667_712 }),
        ("resp-error", Response::Error { id: 0, code: ErrorCode::Unauthorized, message: "no token".into() }),
    ];
    let mut seeds = Vec::new();
    for (name, r) in requests {
        let mut buf = Vec::new();
        r.encode(&mut buf);
        seeds.push((name, buf));
    }
    for (name, r) in responses {
        let mut buf = Vec::new();
        r.encode(&mut buf);
        seeds.push((name, buf));
    }
    seeds
}

fn proto_walredo() -> Vec<(&'static str, Vec<u8>)> {
    let r = rel(16384, ForkNumber::Main);
    // A heap insert record's header-and-data shape; the codec carries it opaquely.
    let record: Vec<u8> = (0..64u8).collect();
    let one = |m: WalRedoRequest| {
        let mut buf = Vec::new();
        m.encode(&mut buf);
        buf
    };
    let begin = one(WalRedoRequest::Begin { rel: r, blkno: BlockNumber(3) });
    let push = one(WalRedoRequest::PushPage { rel: r, blkno: BlockNumber(3), page: page(0x01) });
    let apply = one(WalRedoRequest::ApplyRecord { start_lsn: Lsn(0x0169_AD58), end_lsn: Lsn(0x0169_AD98), record });
    let get = one(WalRedoRequest::GetPage { rel: r, blkno: BlockNumber(3) });
    let mask = one(WalRedoRequest::MaskPage { rmid: 10, blkno: BlockNumber(3), page: page(0x02) });
    // A whole request as the pageserver sends it (the target decodes its first message).
    let whole = [begin.clone(), apply.clone(), get.clone()].concat();
    vec![("begin", begin), ("pushpage", push), ("apply", apply), ("getpage", get), ("maskpage", mask), ("begin-apply-get", whole)]
}

fn proto_filecache() -> Vec<(&'static str, Vec<u8>)> {
    let entry = |relnode: u32, forknum: u8, blkno: u32, slot: u32, dep: u64| SavedEntry {
        spcnode: 1663,
        dbnode: 5,
        relnode,
        forknum,
        blkno,
        slot,
        page_crc: crc32c::crc32c(&page(slot as u8)),
        dep_lsn: Lsn(dep),
    };
    let index = |entries: Vec<SavedEntry>| SavedIndex {
        tenant: TenantId::from_bytes([0x11; 16]),
        timeline: TimelineId::from_bytes([0x22; 16]),
        slots: 64,
        durable_lsn: Lsn(0x0169_AD58),
        valid_lsn: Lsn(0x0169_B000),
        entries,
    };
    let empty = index(Vec::new()).encode();
    let one = index(vec![entry(16384, 0, 0, 0, 0x0150_0000)]).encode();
    let several = index(vec![
        entry(16384, 0, 0, 3, 0x0150_0000),
        entry(16384, 0, 1, 0, 0x0160_0000),
        entry(16384, 1, 0, 7, 0x0150_0028),
        entry(16384, 2, 0, 63, 0x0169_AD58),
        entry(1259, 0, 12, 9, 0x0100_0000),
    ])
    .encode();
    // Version 1: no valid-as-of LSN (bytes 56..64 of version 2), its own magic and checksum.
    let mut v1 = several[..several.len() - 4].to_vec();
    v1.drain(56..64);
    v1[..8].copy_from_slice(&MAGIC_V1);
    let crc = crc32c::crc32c(&v1);
    v1.extend_from_slice(&crc.to_le_bytes());
    vec![("v2-empty", empty), ("v2-one", one), ("v2-several", several), ("v1-several", v1)]
}

fn stored_values() -> Vec<(&'static str, Vec<u8>)> {
    let records = [
        ("record-postgres", StoredRecord::Postgres(Bytes::from((0..48u8).collect::<Vec<_>>()))),
        ("record-clog", StoredRecord::ClogSetStatus { status: XidStatus::Committed, xids: vec![740, 741, 745] }),
        ("record-multixact-offsets", StoredRecord::MultiXactOffsets { entries: vec![(12, 30), (13, 32)] }),
        ("record-multixact-members", StoredRecord::MultiXactMembers { members: vec![(30, 740, 0), (31, 741, 5)] }),
        ("record-vm-clear", StoredRecord::VmClear { blocks: vec![(BlockNumber(0), 3), (BlockNumber(9), 1)] }),
        ("record-vm-truncate", StoredRecord::VmTruncate { heap_blocks: BlockNumber(100) }),
    ];
    let mut seeds: Vec<(&'static str, Vec<u8>)> = records.iter().map(|(n, r)| (*n, r.encode().to_vec())).collect();
    let dbs: BTreeSet<DbEntry> = [DbEntry { spcnode: 1663, dbnode: 1 }, DbEntry { spcnode: 1663, dbnode: 5 }].into();
    seeds.push(("db-dir", codec::encode_db_dir(&dbs).to_vec()));
    let rels: BTreeSet<RelEntry> = [
        RelEntry { relnode: 1259, forknum: ForkNumber::Main },
        RelEntry { relnode: 16384, forknum: ForkNumber::Main },
        RelEntry { relnode: 16384, forknum: ForkNumber::Fsm },
        RelEntry { relnode: 16384, forknum: ForkNumber::VisibilityMap },
    ]
    .into();
    seeds.push(("rel-dir", codec::encode_rel_dir(&rels).to_vec()));
    seeds.push(("slru-dir", codec::encode_slru_dir(&[0, 1, 2].into()).to_vec()));
    seeds.push(("twophase-dir", codec::encode_twophase_dir(&[740, 1000].into()).to_vec()));
    seeds.push(("block-count", codec::encode_block_count(12).to_vec()));
    let current = CheckPoint {
        redo: Lsn(0x0169_AD20),
        next_oid: 24576,
        time: 1_764_000_000,
        full_page_writes: true,
        ..CheckPoint::from_bytes(&[0u8; SIZE_OF_CHECKPOINT]).expect("a zeroed CheckPoint")
    };
    let cp = StoredCheckpoint { record_lsn: Lsn(0x0169_AD58), current, record: Bytes::from(vec![0x72; 114]) };
    seeds.push(("checkpoint", codec::encode_checkpoint(&cp).to_vec()));
    seeds
}

/// The `layer_file` target names its file as a delta layer over all keys and LSNs
/// 0/10..0/10000; its seeds are such layers, written by the layer writer.
fn layer_file() -> Vec<(&'static str, Vec<u8>)> {
    let dir = tempfile::tempdir().expect("temp dir");
    let write = |block_size_bytes: usize, versions: &[(Key, u64, Value)]| {
        let conf = StorageConfig { block_size_bytes, ..StorageConfig::default() };
        let mut w = LayerWriter::new(dir.path(), LayerKind::Delta, Lsn(0x10)..Lsn(0x10000), &conf).expect("layer writer");
        for (k, lsn, v) in versions {
            w.put(*k, Lsn(*lsn), v).expect("put");
        }
        let layer = w.finish(KeyRange { start: Key::MIN, end: Key::MAX }).expect("finish");
        let bytes = std::fs::read(layer.path()).expect("read layer");
        std::fs::remove_file(layer.path()).expect("remove layer");
        bytes
    };
    let img = |b: &[u8]| Value::Image(Bytes::copy_from_slice(b));
    let recd = |init: bool, b: &[u8]| Value::Record { will_init: init, rec: Bytes::copy_from_slice(b) };
    let blk = |n: u32| Key::rel_block(rel(16384, ForkNumber::Main), BlockNumber(n));
    let one_page = write(8192, &[(blk(0), 0x20, Value::Image(Bytes::from(page(7))))]);
    let chain = write(
        8192,
        &[
            (blk(0), 0x20, img(b"base image of block 0")),
            (blk(0), 0x48, recd(false, b"insert tuple 1")),
            (blk(0), 0x90, recd(false, b"insert tuple 2")),
            (blk(1), 0x30, recd(true, b"init page, insert tuple 1")),
            (blk(1), 0x98, recd(false, b"update tuple 1")),
        ],
    );
    // Small blocks: many block frames, and keys of every kind in key order.
    let mut kinds = vec![
        (Key::db_dir(), 0x20, img(&codec::encode_db_dir(&[DbEntry { spcnode: 1663, dbnode: 5 }].into()))),
        (Key::rel_dir(1663, 5), 0x28, img(&codec::encode_rel_dir(&[RelEntry { relnode: 16384, forknum: ForkNumber::Main }].into()))),
        (blk(0), 0x30, img(&[1; 100])),
        (blk(0), 0x40, recd(false, &StoredRecord::Postgres(Bytes::from_static(b"heap insert")).encode())),
        (blk(2), 0x50, img(&[2; 100])),
        (Key::rel_size(rel(16384, ForkNumber::Main)), 0x50, img(&codec::encode_block_count(3))),
        (Key::slru_block(SlruKind::Clog, 0, BlockNumber(0)), 0x60, img(&[0x55; 80])),
        (
            Key::slru_block(SlruKind::Clog, 0, BlockNumber(0)),
            0x70,
            recd(false, &StoredRecord::ClogSetStatus { status: XidStatus::Committed, xids: vec![740] }.encode()),
        ),
        (Key::checkpoint(), 0x80, img(&[0x33; 96])),
    ];
    kinds.sort_by_key(|(k, lsn, _)| (*k, *lsn));
    let many_blocks = write(64, &kinds);
    vec![("delta-one-page", one_page), ("delta-record-chains", chain), ("delta-key-kinds-small-blocks", many_blocks)]
}

/// `layer_file_structure` inputs: byte 0 is kind (bit 0) and damage count (bits 1-3), five
/// bytes per damage, then versions of (block, LSN offset, payload length, payload).
fn layer_file_structure() -> Vec<(&'static str, Vec<u8>)> {
    let version = |blk: u8, lsn_off: u8, payload: &[u8]| [&[blk, lsn_off, payload.len() as u8][..], payload].concat();
    // LSN offsets: 0 mod 3 an image, 1 a will-init record, 2 a record.
    let delta_versions = [
        version(0, 0, b"image of block 0"),
        version(0, 5, b"record on block 0"),
        version(0, 8, b"another record"),
        version(1, 4, b"will-init record on block 1"),
        version(1, 11, b"record on block 1"),
        version(2, 30, &[0xab; 100]),
        version(9, 1, b"will-init"),
    ]
    .concat();
    let image_versions =
        [version(0, 0, &[0x11; 60]), version(1, 0, b"image 1"), version(2, 0, &[0x22; 200]), version(5, 0, b"image 5")].concat();
    let damage = |pos: u32, xor: u8| [&pos.to_le_bytes()[..], &[xor]].concat();
    vec![
        ("delta-undamaged", [&[0u8][..], &delta_versions].concat()),
        ("image-undamaged", [&[1u8][..], &image_versions].concat()),
        // One damage in the header's fields (before its checksum), one in the first block.
        ("delta-damaged-header", [&[2u8][..], &damage(40, 0x01), &delta_versions].concat()),
        ("delta-damaged-block", [&[2u8][..], &damage(110, 0x80), &delta_versions].concat()),
        ("image-damaged-twice", [&[5u8][..], &damage(70, 0x04), &damage(300, 0x10), &image_versions].concat()),
    ]
}

type Seeds = Vec<(&'static str, Vec<u8>)>;

fn all_seeds() -> Vec<(&'static str, Seeds)> {
    vec![
        ("proto_key", proto_key()),
        ("proto_pagestream", proto_pagestream()),
        ("proto_walredo", proto_walredo()),
        ("proto_filecache", proto_filecache()),
        ("stored_values", stored_values()),
        ("layer_file", layer_file()),
        ("layer_file_structure", layer_file_structure()),
    ]
}

/// Whether the decoder that `target` drives accepts `data` (the structural target accepts
/// any input; its seeds are checked to parse as it reads them).
fn accepted(target: &str, name: &str, data: &[u8]) -> bool {
    match target {
        "proto_key" if name.ends_with(".txt") => std::str::from_utf8(data).ok().and_then(|t| t.parse::<Key>().ok()).is_some(),
        "proto_key" => Key::from_bytes(data).is_ok(),
        "proto_pagestream" if name.starts_with("resp-") => Response::decode(data).is_ok_and(|(_, used)| used == data.len()),
        "proto_pagestream" => Request::decode(data).is_ok_and(|(_, used)| used == data.len()),
        "proto_walredo" => WalRedoRequest::decode(data).is_ok(),
        "proto_filecache" => SavedIndex::decode(data).is_ok(),
        "stored_values" => {
            let bytes = Bytes::copy_from_slice(data);
            match name {
                n if n.starts_with("record-") => StoredRecord::decode(&bytes).is_ok(),
                "db-dir" => codec::decode_db_dir(data).is_ok(),
                "rel-dir" => codec::decode_rel_dir(data).is_ok(),
                "slru-dir" => codec::decode_slru_dir(data).is_ok(),
                "twophase-dir" => codec::decode_twophase_dir(data).is_ok(),
                "block-count" => codec::decode_block_count(data).is_ok(),
                "checkpoint" => codec::decode_checkpoint(&bytes).is_ok(),
                _ => false,
            }
        }
        "layer_file" => {
            let dir = tempfile::tempdir().expect("temp dir");
            let path = dir.path().join(LayerDesc::delta(KeyRange { start: Key::MIN, end: Key::MAX }, Lsn(0x10)..Lsn(0x10000)).file_name());
            std::fs::write(&path, data).expect("write layer");
            LayerReader::open(&path).is_ok_and(|l| l.verify().is_ok() && l.iter().all(|item| item.is_ok()))
        }
        "layer_file_structure" => {
            let damages = usize::from((data[0] >> 1) & 7);
            let mut rest = &data[1 + 5 * damages..];
            while rest.len() >= 3 {
                let len = usize::from(rest[2]);
                if rest.len() < 3 + len {
                    return false;
                }
                rest = &rest[3 + len..];
            }
            rest.is_empty()
        }
        _ => false,
    }
}

#[test]
#[ignore = "writes fuzz/seeds/; run by hand after a format change"]
fn write_fuzz_seeds() {
    for (target, seeds) in all_seeds() {
        let dir = seeds_dir(target);
        std::fs::create_dir_all(&dir).expect("create seeds dir");
        for (name, data) in seeds {
            assert!(accepted(target, name, &data), "{target}/{name} is not accepted by its decoder");
            std::fs::write(dir.join(name), data).expect("write seed");
        }
    }
}

#[test]
fn committed_seeds_decode() {
    for (target, seeds) in all_seeds() {
        for (name, _) in seeds {
            let path = seeds_dir(target).join(name);
            let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (write_fuzz_seeds writes it)", path.display()));
            assert!(accepted(target, name, &data), "{} is no longer accepted by its decoder: run write_fuzz_seeds", path.display());
        }
    }
}
