//! Tests of the WAL store: `wal.end`'s formats, the journal, settling, truncation, removal.

use super::*;

#[test]
fn segment_names_follow_postgres() {
    let seg = 16 << 20;
    assert_eq!(segment_file_name(3, seg), "000000010000000000000003");
    assert_eq!(segment_file_name(0x100, seg), "000000010000000100000000");
    assert_eq!(segment_file_name(0x1ff, seg), "0000000100000001000000FF");
    assert_eq!(segment_file_name(5, 1 << 30), "000000010000000100000001");
    for segno in [0, 1, 255, 256, 1000] {
        assert_eq!(parse_segment_file_name(&segment_file_name(segno, seg), seg), Some(segno));
    }
    assert_eq!(parse_segment_file_name("000000020000000000000003", seg), None);
    assert_eq!(parse_segment_file_name("wal.end", seg), None);
}

/// Format 3's header (end, begin, generation, magic, crc32c) as those safekeepers wrote it.
fn v3_header(end: u64, begin: u64, generation: u64) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&end.to_le_bytes());
    b.extend_from_slice(&begin.to_le_bytes());
    b.extend_from_slice(&generation.to_le_bytes());
    b.extend_from_slice(&HEADER_MAGIC_V3.to_le_bytes());
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b.resize(64, 0);
    b
}

/// Format 3's journal record (generation, LSN, length, bytes, crc32c).
fn v3_record(generation: u64, lsn: Lsn, data: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&generation.to_le_bytes());
    b.extend_from_slice(&lsn.0.to_le_bytes());
    b.extend_from_slice(&(data.len() as u64).to_le_bytes());
    b.extend_from_slice(data);
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

#[test]
fn header_checks_its_crc_and_reads_the_older_ones() {
    let h = Header { extent: WalExtent { begin: Lsn(100), end: Lsn(200) }, boundary: Lsn(150), generation: 7 };
    let mut b = h.encode();
    assert_eq!(Header::decode(&b).unwrap(), (h, Format::V4));
    b[3] ^= 1;
    assert!(Header::decode(&b).is_err());
    // A boundary outside the WAL is refused, checksum or not.
    let outside = Header { boundary: Lsn(201), ..h }.encode();
    assert!(Header::decode(&outside).unwrap_err().to_string().contains("outside the WAL"));
    // Format 3: its boundary is its end.
    let v3 = v3_header(200, 100, 7);
    assert_eq!(Header::decode(&v3).unwrap(), (Header { boundary: Lsn(200), ..h }, Format::V3));
    // The 20-byte record of older safekeepers: end, begin, crc32c; no journal.
    let mut v1 = Vec::new();
    v1.extend_from_slice(&200u64.to_le_bytes());
    v1.extend_from_slice(&100u64.to_le_bytes());
    let crc = crc32c::crc32c(&v1);
    v1.extend_from_slice(&crc.to_le_bytes());
    assert_eq!(Header::decode(&v1).unwrap(), (Header { extent: h.extent, boundary: Lsn(200), generation: 0 }, Format::V1));
    v1[0] ^= 1;
    assert!(Header::decode(&v1).is_err());
}

#[test]
fn journal_records_are_read_while_they_continue_the_wal() {
    let rec = |lsn: u64, data: &'static [u8], boundary: u64| JournalRecord { lsn: Lsn(lsn), data, boundary: Lsn(boundary) };
    let mut j = Vec::new();
    j.extend(encode_record(3, Lsn(100), b"abc", Lsn(102)));
    j.extend(encode_record(3, Lsn(103), b"", Lsn(103))); // only the boundary moved
    j.extend(encode_record(3, Lsn(103), b"de", Lsn(103)));
    j.extend(encode_record(3, Lsn(200), b"gap", Lsn(203))); // does not continue the WAL
    j.extend(encode_record(3, Lsn(105), b"after the gap", Lsn(118)));
    j.extend(vec![0u8; 64]);
    let r = decode_records(&j, Format::V4, 3, Lsn(100), Lsn(100));
    assert_eq!(r, vec![rec(100, b"abc", 102), rec(103, b"", 103), rec(103, b"de", 103)]);
    assert!(decode_records(&j, Format::V4, 4, Lsn(100), Lsn(100)).is_empty(), "another generation's records are void");
    assert!(decode_records(&j, Format::V4, 3, Lsn(99), Lsn(99)).is_empty());
    // A boundary that goes back, or beyond the record's bytes, ends the journal.
    assert!(decode_records(&j, Format::V4, 3, Lsn(100), Lsn(103)).is_empty());
    let beyond = encode_record(3, Lsn(100), b"abc", Lsn(104));
    assert!(decode_records(&beyond, Format::V4, 3, Lsn(100), Lsn(100)).is_empty());
    // A record cut short (torn, or its write never completed) ends the journal.
    let mut torn = encode_record(3, Lsn(100), b"abc", Lsn(103));
    torn.extend(encode_record(3, Lsn(103), b"defgh", Lsn(108)));
    let n = torn.len();
    torn[n - 6] ^= 0xff;
    assert_eq!(decode_records(&torn, Format::V4, 3, Lsn(100), Lsn(100)), vec![rec(100, b"abc", 103)]);
    // Format 3's records: each ends at a boundary; an empty one ends the journal.
    let mut v3 = v3_record(3, Lsn(100), b"abc");
    v3.extend(v3_record(3, Lsn(103), b""));
    assert_eq!(decode_records(&v3, Format::V3, 3, Lsn(100), Lsn(100)), vec![rec(100, b"abc", 103)]);
}

const SEG: u64 = 1 << 20;

fn store_with(dir: &Path, batches: &[&[u8]]) -> WalStore {
    WalStore::create(dir).unwrap();
    let mut s = WalStore::open(dir, SEG).unwrap();
    let mut stats = SyncStats::default();
    s.truncate(Lsn(SEG), &mut stats).unwrap();
    for b in batches {
        let end = s.written_end();
        s.append(end, b, Lsn(end.0 + b.len() as u64), &mut stats).unwrap();
        s.sync(&mut stats).unwrap();
    }
    s
}

/// Journal records of every size, written directly (whole aligned blocks, each repeating
/// the bytes of its block before the record) or through the page cache, all come back at
/// open, and the bytes on disk are the same either way: records end to end from the
/// journal's start.
#[test]
fn journal_records_written_directly_or_buffered_replay_the_same() {
    // Sizes that end records inside a block, on a boundary, and across several blocks.
    let sizes = [1usize, 100, 4059, 4096, 3, 8000, 12_288, 4095, 1, 70_000, 17, 4036];
    let batches: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| vec![i as u8 + 1; n]).collect();
    let all = batches.concat();
    let mut journals = Vec::new();
    for direct in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        WalStore::create(dir.path()).unwrap();
        let mut s = WalStore::open(dir.path(), SEG).unwrap();
        if !direct {
            s.journal = JournalWriter::buffered();
        }
        let mut stats = SyncStats::default();
        s.truncate(Lsn(SEG), &mut stats).unwrap();
        for b in &batches {
            let end = s.written_end();
            s.append(end, b, Lsn(end.0 + b.len() as u64), &mut stats).unwrap();
            s.sync(&mut stats).unwrap();
        }
        let end = Lsn(SEG + all.len() as u64);
        assert_eq!(s.extent().end, end);
        let used = (s.journal_at - JOURNAL_OFFSET) as usize;
        drop(s);
        let contents = std::fs::read(dir.path().join(WAL_END_FILE_NAME)).unwrap();
        journals.push(contents[JOURNAL_OFFSET as usize..JOURNAL_OFFSET as usize + used].to_vec());
        // The segments lose the bytes; the journal alone brings them back.
        let f = OpenOptions::new().write(true).open(dir.path().join(segment_file_name(1, SEG))).unwrap();
        f.write_all_at(&vec![0u8; SEG as usize], 0).unwrap();
        let mut s = WalStore::open(dir.path(), SEG).unwrap();
        assert_eq!(s.extent(), WalExtent { begin: Lsn(SEG), end }, "direct: {direct}");
        assert_eq!(&s.read(Lsn(SEG), end).unwrap()[..], &all[..], "direct: {direct}");
    }
    assert_eq!(journals[0], journals[1]);
}

/// The crash the journal is for: batches acknowledged (durable in the journal) whose bytes
/// never reached the segments. Opening replays them.
#[test]
fn acknowledged_batches_lost_from_the_segments_are_replayed_from_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let first = vec![1u8; 3000];
    let second = vec![2u8; (SEG - 1000) as usize]; // into the next segment
                                                   // In batches small enough for the journal (a bigger one is settled).
    let batches: Vec<&[u8]> = std::iter::once(&first[..]).chain(second.chunks(SETTLE_BATCH_BYTES as usize - 1)).collect();
    let s = store_with(dir.path(), &batches);
    let end = s.extent().end;
    assert_eq!(end, Lsn(SEG + 3000 + SEG - 1000));
    drop(s);
    // What a crash may leave: the segments' pages never written back.
    for segno in [1, 2] {
        let f = OpenOptions::new().write(true).open(dir.path().join(segment_file_name(segno, SEG))).unwrap();
        f.write_all_at(&vec![0u8; SEG as usize], 0).unwrap();
    }
    let mut s = WalStore::open(dir.path(), SEG).unwrap();
    assert_eq!(s.extent(), WalExtent { begin: Lsn(SEG), end });
    assert_eq!(&s.read(Lsn(SEG), end).unwrap()[..], &[first.clone(), second.clone()].concat()[..]);
    // Settled at open: the journal is void now, and the segments hold the bytes.
    drop(s);
    let mut s = WalStore::open(dir.path(), SEG).unwrap();
    assert_eq!(s.extent().end, end);
    assert_eq!(&s.read(Lsn(SEG), Lsn(SEG + 3000)).unwrap()[..], &first[..]);
}

/// A batch of [`SETTLE_BATCH_BYTES`] or more is settled, not journaled: the header names
/// its end, and the journal holds nothing; a smaller one goes to the journal.
#[test]
fn a_big_batch_is_settled_and_a_small_one_journaled() {
    let dir = tempfile::tempdir().unwrap();
    let big = vec![3u8; SETTLE_BATCH_BYTES as usize];
    let s = store_with(dir.path(), &[&big]);
    let end = Lsn(SEG + SETTLE_BATCH_BYTES);
    assert_eq!((s.extent().end, s.journal_at), (end, JOURNAL_OFFSET));
    let header = Header::decode(&std::fs::read(dir.path().join(WAL_END_FILE_NAME)).unwrap()).unwrap().0;
    assert_eq!((header.extent.end, header.boundary), (end, end));
    drop(s);
    let s = store_with(dir.path(), &[&big[..100]]);
    assert!(s.journal_at > JOURNAL_OFFSET);
}

/// A batch whose journal record did not become durable (a crash during its fdatasync, so
/// never acknowledged) is not part of the WAL after a restart, and appends go on from
/// the end before it.
#[test]
fn a_batch_cut_short_in_the_journal_is_not_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let first = vec![1u8; 3000];
    let second = vec![2u8; 5000];
    drop(store_with(dir.path(), &[&first, &second]));
    // Tear the second record: the last bytes of its data.
    let wal_end = OpenOptions::new().write(true).open(dir.path().join(WAL_END_FILE_NAME)).unwrap();
    let second_at = JOURNAL_OFFSET + (RECORD_HEADER_BYTES + 3000 + RECORD_CRC_BYTES) as u64;
    wal_end.write_all_at(&[0u8; 100], second_at + (RECORD_HEADER_BYTES + 4900) as u64).unwrap();
    drop(wal_end);
    let mut s = WalStore::open(dir.path(), SEG).unwrap();
    let at = Lsn(SEG + 3000);
    assert_eq!(s.extent(), WalExtent { begin: Lsn(SEG), end: at });
    let mut stats = SyncStats::default();
    s.append(at, &[3u8; 10], Lsn(at.0 + 10), &mut stats).unwrap();
    s.sync(&mut stats).unwrap();
    drop(s);
    let mut s = WalStore::open(dir.path(), SEG).unwrap();
    assert_eq!(s.extent().end, Lsn(at.0 + 10));
    assert_eq!(&s.read(at, Lsn(at.0 + 10)).unwrap()[..], &[3u8; 10]);
}

/// One fsync per batch while the journal has room; a full journal settles.
#[test]
fn a_batch_costs_one_fsync_and_a_full_journal_settles() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = store_with(dir.path(), &[]);
    let mut stats = SyncStats::default();
    s.append(s.written_end(), &[5u8; 100], s.written_end(), &mut stats).unwrap();
    s.sync(&mut stats).unwrap();
    assert_eq!(stats.fsyncs, 1);
    let big = vec![6u8; JOURNAL_BYTES as usize];
    let mut stats = SyncStats::default();
    s.append(s.written_end(), &big, s.written_end(), &mut stats).unwrap();
    s.sync(&mut stats).unwrap();
    assert!(stats.fsyncs >= 2, "a batch bigger than the journal is synced by settling");
    let end = s.extent().end;
    drop(s);
    let s = WalStore::open(dir.path(), SEG).unwrap();
    assert_eq!(s.extent().end, end);
}

/// The boundary LSN is durable with the bytes: a batch that ends inside a record keeps
/// the end of the last whole one, a batch that only moves it is journaled too, and both
/// come back after a restart, from the journal and once settled; a truncation moves it to
/// the new end.
#[test]
fn the_boundary_is_durable_with_the_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = store_with(dir.path(), &[]);
    let mut stats = SyncStats::default();
    let at = s.written_end();
    s.append(at, &[1u8; 100], Lsn(at.0 + 40), &mut stats).unwrap();
    s.sync(&mut stats).unwrap();
    assert_eq!(s.boundary(), Lsn(at.0 + 40));
    s.append(Lsn(at.0 + 100), &[], Lsn(at.0 + 100), &mut stats).unwrap();
    assert!(s.has_unsynced(), "a new boundary alone is something to sync");
    s.sync(&mut stats).unwrap();
    assert!(s.append(Lsn(at.0 + 100), &[2u8; 5], Lsn(at.0 + 99), &mut stats).is_err(), "a boundary never goes back");
    drop(s);
    let mut s = WalStore::open(dir.path(), SEG).unwrap();
    assert_eq!((s.extent().end, s.boundary()), (Lsn(at.0 + 100), Lsn(at.0 + 100)));
    s.append(Lsn(at.0 + 100), &[2u8; 50], Lsn(at.0 + 120), &mut stats).unwrap();
    s.settle(&mut stats).unwrap();
    drop(s);
    let mut s = WalStore::open(dir.path(), SEG).unwrap();
    assert_eq!((s.extent().end, s.boundary()), (Lsn(at.0 + 150), Lsn(at.0 + 120)));
    s.truncate(Lsn(at.0 + 120), &mut stats).unwrap();
    drop(s);
    let s = WalStore::open(dir.path(), SEG).unwrap();
    assert_eq!((s.extent().end, s.boundary()), (Lsn(at.0 + 120), Lsn(at.0 + 120)));
}

/// A `wal.end` of format 3 (journal records without boundaries) opens, its journal
/// replayed with each batch's end as the boundary, and is rewritten as format 4.
#[test]
fn a_format_3_wal_end_is_read_and_upgraded() {
    let dir = tempfile::tempdir().unwrap();
    let end = store_with(dir.path(), &[&[7u8; 500]]).extent().end;
    let f = OpenOptions::new().write(true).open(dir.path().join(WAL_END_FILE_NAME)).unwrap();
    f.write_all_at(&v3_header(end.0, SEG, 9), 0).unwrap();
    f.write_all_at(&v3_record(9, end, &[8u8; 30]), JOURNAL_OFFSET).unwrap();
    drop(f);
    let s = WalStore::open(dir.path(), SEG).unwrap();
    let new_end = Lsn(end.0 + 30);
    assert_eq!((s.extent(), s.boundary()), (WalExtent { begin: Lsn(SEG), end: new_end }, new_end));
    drop(s);
    let header = std::fs::read(dir.path().join(WAL_END_FILE_NAME)).unwrap();
    assert_eq!(Header::decode(&header).unwrap().1, Format::V4);
}

/// A `wal.end` written by an older safekeeper (20 bytes, no journal) opens, and gets a
/// journal.
#[test]
fn an_older_wal_end_is_upgraded_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let end = store_with(dir.path(), &[&[7u8; 500]]).extent().end;
    let mut v1 = Vec::new();
    v1.extend_from_slice(&end.0.to_le_bytes());
    v1.extend_from_slice(&SEG.to_le_bytes());
    let crc = crc32c::crc32c(&v1);
    v1.extend_from_slice(&crc.to_le_bytes());
    std::fs::write(dir.path().join(WAL_END_FILE_NAME), &v1).unwrap();
    let mut s = WalStore::open(dir.path(), SEG).unwrap();
    assert_eq!(s.extent(), WalExtent { begin: Lsn(SEG), end });
    let mut stats = SyncStats::default();
    s.append(end, &[8u8; 10], Lsn(end.0 + 10), &mut stats).unwrap();
    s.sync(&mut stats).unwrap();
    assert_eq!(stats.fsyncs, 1);
    drop(s);
    assert_eq!(WalStore::open(dir.path(), SEG).unwrap().extent().end, Lsn(end.0 + 10));
}
