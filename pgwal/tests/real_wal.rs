//! Decodes WAL written by a real PostgreSQL 15.18 and compares every record with what
//! `pg_waldump` printed for the same bytes.
//!
//! The fixture (`tests/data/`, made by `regenerate.sh` from `workload.sql`) covers every
//! record kind `parse_metadata` handles, images in all four compressions, records spanning
//! pages, and an `XLOG_SWITCH` into the next segment. The expected values come from the
//! stored `pg_waldump -b` output rather than from constants in this file, so a regenerated
//! fixture needs no edit here.

use std::collections::BTreeMap;

use pgwal::consts::*;
use pgwal::parse::{DbaseCreateStrategy, MultiXactStatus, XactKind};
use pgwal::{parse_metadata, DecodedRecord, DecoderConfig, ImageCompression, MetadataRecord, WalRecord, WalStreamDecoder};
use proto::{ForkNumber, Lsn};

/// The fixture directory, from cargo at run time (a test binary reused from another
/// checkout's build must not read that checkout).
fn data_dir() -> String {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
    format!("{dir}/tests/data")
}

struct Fixture {
    start: Lsn,
    first_record: Lsn,
    end: Lsn,
    system_id: u64,
    wal: Vec<u8>,
    dump: Vec<DumpRecord>,
}

/// One record as `pg_waldump -b` printed it.
#[derive(Debug)]
struct DumpRecord {
    rmgr: String,
    rec_len: u32,
    tot_len: u32,
    xid: u32,
    lsn: Lsn,
    prev: Lsn,
    /// `rm_identify` and `rm_desc` output, e.g. `INSERT off 10 flags 0x01`.
    desc: String,
    blocks: Vec<DumpBlock>,
}

#[derive(Debug)]
struct DumpBlock {
    id: u8,
    rel: String,
    fork: String,
    blk: u32,
    image: Option<DumpImage>,
}

/// An image as `pg_waldump -b` describes it.
#[derive(Debug)]
struct DumpImage {
    apply: bool,
    hole_offset: u16,
    hole_length: u16,
    /// `compression saved`, printed only for compressed images.
    saved: Option<u32>,
    method: Option<String>,
}

fn load() -> Fixture {
    let env = std::fs::read_to_string(format!("{}/fixture.env", data_dir())).expect("read fixture.env");
    let vars: BTreeMap<&str, &str> = env.lines().filter_map(|l| l.split_once('=')).collect();
    let lsn = |k: &str| vars[k].parse::<Lsn>().expect("fixture LSN");
    let wal = zstd::decode_all(&std::fs::read(format!("{}/wal.bin.zst", data_dir())).expect("read wal.bin.zst")[..]).expect("unzstd wal");
    let dump = zstd::decode_all(&std::fs::read(format!("{}/waldump.txt.zst", data_dir())).expect("read waldump.txt.zst")[..])
        .expect("unzstd waldump");
    let dump = parse_dump(&String::from_utf8(dump).expect("waldump is text"));
    Fixture {
        start: lsn("START_LSN"),
        first_record: lsn("FIRST_RECORD_LSN"),
        end: lsn("END_LSN"),
        system_id: vars["SYSTEM_ID"].parse().expect("system id"),
        wal,
        dump,
    }
}

/// The text between `key` and the next `,` (or the end).
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    let rest = &line[line.find(key).unwrap_or_else(|| panic!("no {key:?} in {line}")) + key.len()..];
    rest.split(',').next().unwrap_or(rest).trim()
}

fn parse_dump(text: &str) -> Vec<DumpRecord> {
    let mut out: Vec<DumpRecord> = Vec::new();
    for line in text.lines() {
        if let Some(blk) = line.strip_prefix("\tblkref #") {
            let (id, rest) = blk.split_once(": rel ").unwrap();
            let (rel, rest) = rest.split_once(" fork ").unwrap();
            let (fork, rest) = rest.split_once(" blk ").unwrap();
            let (blkno, image) = rest.split_once(' ').unwrap_or((rest, ""));
            let image = image.contains("FPW").then(|| {
                let num = |k: &str| image.split(k).nth(1).map(|s| s.split(',').next().unwrap().trim().parse::<u32>().unwrap());
                let method = image.split("method: ").nth(1).map(str::to_string);
                DumpImage {
                    apply: !image.contains("for WAL verification"),
                    hole_offset: num("offset: ").unwrap() as u16,
                    hole_length: num("length: ").unwrap() as u16,
                    saved: num("saved: "),
                    method,
                }
            });
            out.last_mut().expect("blkref after a record").blocks.push(DumpBlock {
                id: id.parse().unwrap(),
                rel: rel.to_string(),
                fork: fork.to_string(),
                blk: blkno.parse().unwrap(),
                image,
            });
        } else if let Some(rest) = line.strip_prefix("rmgr: ") {
            let (rec_len, tot_len) = field(line, "len (rec/tot):").split_once('/').unwrap();
            out.push(DumpRecord {
                rmgr: rest.split_whitespace().next().unwrap().to_string(),
                rec_len: rec_len.trim().parse().unwrap(),
                tot_len: tot_len.trim().parse().unwrap(),
                xid: field(line, "tx:").parse().unwrap(),
                lsn: field(line, "lsn:").parse().unwrap(),
                prev: field(line, "prev").parse().unwrap(),
                desc: line[line.find("desc: ").unwrap() + 6..].trim_end().to_string(),
                blocks: Vec::new(),
            });
        } else if !line.trim().is_empty() {
            panic!("unexpected pg_waldump line: {line}");
        }
    }
    out
}

/// Decodes `wal` (which starts at `start`) fed in `chunk`-byte pieces; panics on any error.
fn decode(start: Lsn, wal: &[u8], chunk: usize, system_id: u64) -> Vec<WalRecord> {
    let config = DecoderConfig { system_id: Some(system_id), ..DecoderConfig::default() };
    let mut decoder = WalStreamDecoder::new(start, config).expect("decoder");
    let mut records = Vec::new();
    for piece in wal.chunks(chunk) {
        decoder.feed_bytes(piece);
        while let Some(record) = decoder.poll_decode().unwrap_or_else(|e| panic!("decoding real WAL failed: {e}")) {
            records.push(record);
        }
    }
    records
}

fn fork_name(fork: ForkNumber) -> &'static str {
    match fork {
        ForkNumber::Main => "main",
        ForkNumber::Fsm => "fsm",
        ForkNumber::VisibilityMap => "vm",
        ForkNumber::Init => "init",
    }
}

#[test]
fn every_record_matches_pg_waldump() {
    let f = load();
    let records = decode(f.start, &f.wal, 65536, f.system_id);
    assert_eq!(records.len(), f.dump.len(), "record count differs from pg_waldump");
    assert_eq!(records[0].start_lsn(), f.first_record);
    // The cut is at the start of the record after the last one: at most a page header away.
    let last_end = records.last().unwrap().end_lsn();
    assert!(last_end <= f.end && f.end.0 - last_end.0 <= SIZE_OF_XLOG_LONG_PHD as u64, "{last_end} vs {}", f.end);

    let mut images_by_method: BTreeMap<&str, usize> = BTreeMap::new();
    for (record, dump) in records.iter().zip(&f.dump) {
        let d = record.decode().unwrap_or_else(|e| panic!("{e}"));
        let at = format!("record at {}", dump.lsn);
        assert_eq!(d.lsn, dump.lsn, "{at}");
        assert_eq!(d.header.prev, dump.prev, "{at}");
        assert_eq!(d.header.xid.0, dump.xid, "{at}");
        assert_eq!(rmgr_name(d.rmid()), dump.rmgr, "{at}");
        assert_eq!(d.header.tot_len, dump.tot_len, "{at}");
        let fpi_len: usize = d.blocks.iter().filter_map(|b| b.image.as_ref()).map(|i| i.stored.len()).sum();
        assert_eq!(d.header.tot_len - fpi_len as u32, dump.rec_len, "{at}");
        assert_eq!(d.blocks.len(), dump.blocks.len(), "{at}");
        for (b, db) in d.blocks.iter().zip(&dump.blocks) {
            assert_eq!(b.block_id, db.id, "{at}");
            assert_eq!(format!("{}/{}/{}", b.rel.spcnode, b.rel.dbnode, b.rel.relnode), db.rel, "{at}");
            assert_eq!(fork_name(b.rel.forknum), db.fork, "{at}");
            assert_eq!(b.blkno.0, db.blk, "{at}");
            assert_eq!(b.image.is_some(), db.image.is_some(), "{at}");
            if let (Some(image), Some(expected)) = (&b.image, &db.image) {
                let DumpImage { apply, hole_offset, hole_length, saved, method } = expected;
                assert_eq!((image.apply(), image.hole_offset, image.hole_length), (*apply, *hole_offset, *hole_length), "{at}");
                let ours = match image.compression {
                    ImageCompression::None => None,
                    ImageCompression::Pglz => Some("pglz"),
                    ImageCompression::Lz4 => Some("lz4"),
                    ImageCompression::Zstd => Some("zstd"),
                };
                assert_eq!(ours, method.as_deref(), "{at}");
                if let Some(saved) = saved {
                    assert_eq!(BLCKSZ as u32 - u32::from(image.hole_length) - image.stored.len() as u32, *saved, "{at}");
                }
                *images_by_method.entry(ours.unwrap_or("none")).or_default() += 1;
                check_restored_page(&d, b.block_id, &at);
            }
        }
    }
    println!("images by compression: {images_by_method:?}");
    for method in ["none", "pglz", "lz4", "zstd"] {
        assert!(images_by_method.get(method).copied().unwrap_or(0) > 0, "no {method} images in {images_by_method:?}");
    }
}

/// A restored image must look like a PostgreSQL page: `pd_pagesize_version` says 8 KiB pages
/// of layout 4 (or 0 for a never-initialized page), `pd_lower <= pd_upper <= pd_special`.
fn check_restored_page(d: &DecodedRecord, block_id: u8, at: &str) {
    let page = d.restore_page(block_id).unwrap_or_else(|e| panic!("{at}: {e}"));
    assert_eq!(page.len(), BLCKSZ);
    let u16_at = |o: usize| u16::from_le_bytes([page[o], page[o + 1]]);
    let (lower, upper, special, size_version) = (u16_at(12), u16_at(14), u16_at(16), u16_at(18));
    if size_version == 0 {
        return;
    }
    assert_eq!(size_version, 8192 | 4, "{at}: block {block_id}");
    assert!(lower <= upper && upper <= special && usize::from(special) <= BLCKSZ, "{at}: {lower} {upper} {special}");
}

#[test]
fn metadata_records_parse_and_agree_with_pg_waldump() {
    let f = load();
    let records = decode(f.start, &f.wal, 100_003, f.system_id);
    let mut kinds: BTreeMap<&'static str, usize> = BTreeMap::new();
    for (record, dump) in records.iter().zip(&f.dump) {
        let d = record.decode().unwrap();
        let parsed = parse_metadata(&d).unwrap_or_else(|e| panic!("{e}"));
        let desc = dump.desc.as_str();
        let at = format!("record at {}: {desc}", dump.lsn);
        let Some(parsed) = parsed else {
            // Heap records whose flags clear a visibility-map bit must not be missed.
            assert!(!clears_vm_per_waldump(&dump.rmgr, desc), "{at}: VM clear not reported");
            continue;
        };
        let kind = match &parsed {
            MetadataRecord::Checkpoint { shutdown, checkpoint: c } => {
                let expected = format!(
                    "redo {}; tli {}; prev tli {}; fpw {}; xid {}; oid {}; multi {}; offset {}; oldest xid {} in DB {}; oldest multi {} in DB {}; oldest/newest commit timestamp xid: {}/{}; oldest running xid {}; {}",
                    c.redo, c.this_timeline_id.0, c.prev_timeline_id.0, c.full_page_writes, c.next_xid, c.next_oid,
                    c.next_multi.0, c.next_multi_offset.0, c.oldest_xid, c.oldest_xid_db, c.oldest_multi.0,
                    c.oldest_multi_db, c.oldest_commit_ts_xid, c.newest_commit_ts_xid, c.oldest_active_xid,
                    if *shutdown { "shutdown" } else { "online" }
                );
                assert!(desc.ends_with(&expected), "{at}\n   ours: {expected}");
                if *shutdown {
                    "checkpoint shutdown"
                } else {
                    "checkpoint online"
                }
            }
            MetadataRecord::NextOid(oid) => {
                assert_eq!(desc, format!("NEXTOID {oid}"), "{at}");
                "nextoid"
            }
            MetadataRecord::Switch => "switch",
            MetadataRecord::RunningXacts(r) => {
                let expected = format!(
                    "RUNNING_XACTS nextXid {} latestCompletedXid {} oldestRunningXid {}",
                    r.next_xid, r.latest_completed_xid, r.oldest_running_xid
                );
                assert!(desc.starts_with(&expected), "{at}\n   ours: {expected}");
                assert_eq!(r.xcnt > 0, desc.contains(&format!("; {} xacts:", r.xcnt)), "{at}");
                assert_eq!(r.subxid_overflow, desc.contains("subxid overflowed"), "{at}");
                "running xacts"
            }
            MetadataRecord::XactCompletion(c) => {
                let (word, kind) = match c.kind {
                    XactKind::Commit => ("COMMIT ", "commit"),
                    XactKind::Abort => ("ABORT ", "abort"),
                    XactKind::CommitPrepared => ("COMMIT_PREPARED ", "commit prepared"),
                    XactKind::AbortPrepared => ("ABORT_PREPARED ", "abort prepared"),
                };
                assert!(desc.starts_with(word), "{at}");
                if matches!(c.kind, XactKind::CommitPrepared | XactKind::AbortPrepared) {
                    assert!(desc.starts_with(&format!("{word}{}:", c.xid)), "{at}");
                } else {
                    assert_eq!(c.xid.0, dump.xid, "{at}");
                }
                let subxacts: Vec<String> = c.subxacts.iter().map(|x| x.to_string()).collect();
                assert_eq!(!subxacts.is_empty(), desc.contains("; subxacts:"), "{at}");
                if !subxacts.is_empty() {
                    assert!(desc.contains(&format!("; subxacts: {}", subxacts.join(" "))), "{at}");
                }
                let rels: Vec<String> = c.dropped_rels.iter().map(|r| r.fork(ForkNumber::Main).to_string()).collect();
                assert_eq!(!rels.is_empty(), desc.contains("; rels: "), "{at}");
                if !rels.is_empty() {
                    assert!(desc.contains(&format!("; rels: {}", rels.join(" "))), "{at}");
                }
                kind
            }
            MetadataRecord::XactPrepare(p) => {
                assert!(desc.starts_with(&format!("PREPARE gid {}:", p.gid)), "{at}");
                assert_eq!(p.xid.0, dump.xid, "{at}");
                "prepare"
            }
            MetadataRecord::SmgrCreate(c) => {
                assert_eq!(desc, format!("CREATE {}", c.rel), "{at}");
                "smgr create"
            }
            MetadataRecord::SmgrTruncate(t) => {
                let expected = format!("TRUNCATE {} to {} blocks flags {}", t.rnode.fork(ForkNumber::Main), t.blkno, t.flags);
                assert_eq!(desc, expected, "{at}");
                "smgr truncate"
            }
            MetadataRecord::DbaseCreate(c) => match c.strategy {
                DbaseCreateStrategy::FileCopy { src_db_id, src_tablespace_id } => {
                    let expected = format!("CREATE_FILE_COPY copy dir {src_tablespace_id}/{src_db_id} to {}/{}", c.tablespace_id, c.db_id);
                    assert_eq!(desc, expected, "{at}");
                    "database create file copy"
                }
                DbaseCreateStrategy::WalLog => {
                    assert_eq!(desc, format!("CREATE_WAL_LOG create dir {}/{}", c.tablespace_id, c.db_id), "{at}");
                    "database create wal log"
                }
            },
            MetadataRecord::DbaseDrop(dr) => {
                let dirs: Vec<String> = dr.tablespace_ids.iter().map(|t| format!(" {t}/{}", dr.db_id)).collect();
                assert_eq!(desc, format!("DROP dir{}", dirs.concat()), "{at}");
                "database drop"
            }
            MetadataRecord::ClogZeroPage { pageno } => {
                assert_eq!(desc, format!("ZEROPAGE page {pageno}"), "{at}");
                "clog zeropage"
            }
            MetadataRecord::ClogTruncate(_) => "clog truncate",
            MetadataRecord::MultiXactZeroOffsetPage { pageno } => {
                assert_eq!(desc, format!("ZERO_OFF_PAGE {pageno}"), "{at}");
                "multixact zero offsets"
            }
            MetadataRecord::MultiXactZeroMemberPage { pageno } => {
                assert_eq!(desc, format!("ZERO_MEM_PAGE {pageno}"), "{at}");
                "multixact zero members"
            }
            MetadataRecord::MultiXactCreate(m) => {
                let members: Vec<String> = m.members.iter().map(|m| format!("{} ({}) ", m.xid, status_name(m.status))).collect();
                let expected = format!("CREATE_ID {} offset {} nmembers {}: {}", m.mid.0, m.moff.0, m.members.len(), members.concat());
                assert_eq!(desc, expected.trim_end(), "{at}");
                "multixact create"
            }
            MetadataRecord::MultiXactTruncate(_) => "multixact truncate",
            MetadataRecord::RelmapUpdate(r) => {
                assert_eq!(desc, format!("UPDATE database {} tablespace {} size {}", r.db_id, r.tablespace_id, r.data.len()), "{at}");
                "relmap update"
            }
            MetadataRecord::VmBitsCleared(cleared) => {
                assert!(clears_vm_per_waldump(&dump.rmgr, desc), "{at}: pg_waldump flags clear nothing");
                for c in cleared {
                    assert!(d.blocks.iter().any(|b| b.rel == c.rel && b.blkno == c.heap_blkno), "{at}");
                }
                "vm bits cleared"
            }
            MetadataRecord::VmBitsSet(s) => {
                assert!(desc.starts_with("VISIBLE ") && desc.contains(&format!("flags 0x{:02X}", s.bits)), "{at}");
                assert_eq!(dump.blocks[1].blk, s.heap_blkno.0, "{at}");
                "vm bits set"
            }
        };
        *kinds.entry(kind).or_default() += 1;
    }
    let exercised = [
        "checkpoint shutdown",
        "checkpoint online",
        "nextoid",
        "switch",
        "commit",
        "abort",
        "commit prepared",
        "abort prepared",
        "prepare",
        "smgr create",
        "smgr truncate",
        "database create file copy",
        "database create wal log",
        "database drop",
        "clog zeropage",
        "multixact zero offsets",
        "multixact zero members",
        "multixact create",
        "relmap update",
        "vm bits cleared",
        "vm bits set",
    ];
    println!("metadata records by kind: {kinds:?}");
    for kind in exercised {
        assert!(kinds.get(kind).copied().unwrap_or(0) > 0, "no {kind} record in the fixture: {kinds:?}");
    }
}

/// The start of the page holding the last byte of `r`.
fn r_end_page_start(r: &WalRecord) -> u64 {
    (r.end_lsn().0 - 1) / XLOG_BLCKSZ as u64 * XLOG_BLCKSZ as u64
}

fn status_name(s: MultiXactStatus) -> &'static str {
    match s {
        MultiXactStatus::ForKeyShare => "keysh",
        MultiXactStatus::ForShare => "sh",
        MultiXactStatus::ForNoKeyUpdate => "fornokeyupd",
        MultiXactStatus::ForUpdate => "forupd",
        MultiXactStatus::NoKeyUpdate => "nokeyupd",
        MultiXactStatus::Update => "upd",
    }
}

/// Whether pg_waldump's description shows flags that clear visibility-map bits, read the way
/// `heapdesc.c` prints them: `flags 0xNN` after the offset of the changed tuple.
fn clears_vm_per_waldump(rmgr: &str, desc: &str) -> bool {
    let flags = || {
        let hex = desc.split("flags 0x").nth(1)?.get(..2)?;
        u8::from_str_radix(hex, 16).ok()
    };
    let op = desc.split([' ', '+']).next().unwrap_or("");
    match (rmgr, op) {
        ("Heap", "INSERT") => flags().is_some_and(|f| f & XLH_INSERT_ALL_VISIBLE_CLEARED != 0),
        ("Heap", "DELETE") => flags().is_some_and(|f| f & XLH_DELETE_ALL_VISIBLE_CLEARED != 0),
        ("Heap", "UPDATE" | "HOT_UPDATE") => {
            let mask = XLH_UPDATE_OLD_ALL_VISIBLE_CLEARED | XLH_UPDATE_NEW_ALL_VISIBLE_CLEARED;
            flags().is_some_and(|f| f & mask != 0)
        }
        ("Heap", "LOCK") | ("Heap2", "LOCK_UPDATED") => flags().is_some_and(|f| f & XLH_LOCK_ALL_FROZEN_CLEARED != 0),
        ("Heap2", "MULTI_INSERT") => flags().is_some_and(|f| f & XLH_INSERT_ALL_VISIBLE_CLEARED != 0),
        _ => false,
    }
}

#[test]
fn starting_mid_stream_yields_the_same_records() {
    let f = load();
    let all = decode(f.start, &f.wal, 1 << 20, f.system_id);
    let suffix_from = |from: Lsn| all.iter().position(|r| r.start_lsn() >= from).unwrap_or(all.len());
    // Start at page boundaries (many begin with the tail of a record, which is skipped) in
    // the first segment before the switch, and in the second segment.
    let switch_end = all.iter().find(|r| r.header().is_switch()).expect("a switch record").end_lsn();
    let first_segment_pages = (switch_end.0 - f.start.0) / XLOG_BLCKSZ as u64;
    let mut starts: Vec<Lsn> = (1..first_segment_pages - 1).step_by(7).map(|p| Lsn(f.start.0 + p * XLOG_BLCKSZ as u64)).collect();
    starts.retain(|s| all.iter().any(|r| r.start_lsn() <= *s && r.end_lsn() > *s && !r.header().is_switch()));
    starts.extend((0..(f.end.0 - switch_end.0) / XLOG_BLCKSZ as u64).map(|p| Lsn(switch_end.0 + p * XLOG_BLCKSZ as u64)));
    // And at record starts.
    starts.extend(all.iter().step_by(97).map(|r| r.start_lsn()));
    assert!(starts.len() > 20);
    for start in starts {
        let offset = (start.0 - f.start.0) as usize;
        let got = decode(start, &f.wal[offset..], 8192 * 3 + 5, f.system_id);
        let want = &all[suffix_from(start)..];
        assert_eq!(got.len(), want.len(), "starting at {start}");
        assert!(got.iter().zip(want).all(|(a, b)| a == b), "starting at {start}");
    }
}

#[test]
fn corrupting_real_wal_is_detected_at_the_right_lsn() {
    let f = load();
    let all = decode(f.start, &f.wal, 1 << 20, f.system_id);
    // A byte of a record's continuation on the next page: the CRC must catch it.
    let _page = XLOG_BLCKSZ as u64;
    let victim = all
        .iter()
        .find(|r| {
            let last_page = r_end_page_start(r);
            r.start_lsn().0 < last_page && r.end_lsn().0 - last_page > 100 && !last_page.is_multiple_of(16 << 20)
        })
        .expect("a record that spans pages");
    let offset = (r_end_page_start(victim) - f.start.0) as usize + SIZE_OF_XLOG_SHORT_PHD + 8;
    let mut wal = f.wal.clone();
    wal[offset] ^= 0x01;
    let config = DecoderConfig { system_id: Some(f.system_id), ..DecoderConfig::default() };
    let mut decoder = WalStreamDecoder::new(f.start, config).unwrap();
    decoder.feed_bytes(&wal);
    let err = loop {
        match decoder.poll_decode() {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("corruption not detected"),
            Err(e) => break e,
        }
    };
    assert_eq!(err.lsn(), victim.start_lsn(), "{err}");
    // A wrong system identifier is caught at the first long page header.
    let wrong = DecoderConfig { system_id: Some(f.system_id ^ 1), ..DecoderConfig::default() };
    let mut decoder = WalStreamDecoder::new(f.start, wrong).unwrap();
    decoder.feed_bytes(&f.wal[..8192]);
    assert_eq!(decoder.poll_decode().unwrap_err().lsn(), f.start);
}
