//! The checks on pieces cut anywhere, over test-encoder WAL in memory, counting what each
//! check reads.

use super::*;
use pgwal::consts::{RM_HEAP_ID, XLOG_BLCKSZ, XLOG_HEAP_INSERT};
use pgwal::test_encoder::{Placed, RecordSpec, WalWriter};

const SEG: u64 = 1 << 20;
const PAGE: u64 = XLOG_BLCKSZ as u64;
const MIB: u64 = 1 << 20;

fn record(len: usize) -> RecordSpec {
    RecordSpec::new(RM_HEAP_ID, XLOG_HEAP_INSERT).xid(700).main_data(vec![7; len])
}

/// A safekeeper's WAL: bytes from `origin`, of which `[begin, end)` is readable.
struct Wal {
    origin: Lsn,
    bytes: Vec<u8>,
    begin: Lsn,
    end: Lsn,
    /// Bytes read so far.
    read_bytes: u64,
}

impl Wal {
    fn new(w: &WalWriter) -> Wal {
        let end = Lsn(w.start.0 + w.out.len() as u64);
        Wal { origin: w.start, bytes: w.out.clone(), begin: w.start, end, read_bytes: 0 }
    }

    fn bounds(&self) -> WalBounds {
        WalBounds { begin: self.begin, end: self.end, config: DecoderConfig { segment_size_bytes: SEG, system_id: Some(7) } }
    }

    /// Flips a byte of the WAL at `lsn`.
    fn damage(&mut self, lsn: Lsn) {
        self.bytes[(lsn.0 - self.origin.0) as usize] ^= 0x55;
    }

    fn check(&mut self, fc: &mut FetchCheck, from: Lsn, to: Lsn) -> Result<CheckStats, Refusal> {
        let bounds = self.bounds();
        let (origin, begin, end) = (self.origin, self.begin, self.end);
        let bytes = &self.bytes;
        let read_bytes = &mut self.read_bytes;
        fc.check(from, to, bounds, |f, t| {
            assert!(begin <= f && f <= t && t <= end, "read {f}..{t} outside the WAL {begin}..{end}");
            *read_bytes += t.0 - f.0;
            Ok(Bytes::copy_from_slice(&bytes[(f.0 - origin.0) as usize..(t.0 - origin.0) as usize]))
        })
    }

    /// The proposer's order: pieces of `piece` bytes walking down from `top` to `bottom`.
    fn fetch_down(&mut self, fc: &mut FetchCheck, bottom: Lsn, top: Lsn, piece: u64) -> Result<(), (Lsn, Refusal)> {
        let mut to = top;
        while to > bottom {
            let from = Lsn(to.0.saturating_sub(piece).max(bottom.0));
            self.check(fc, from, to).map_err(|r| (from, r))?;
            to = from;
        }
        Ok(())
    }
}

/// A lsn inside `p`'s body, past its header, on the page it starts on.
fn inside(p: &Placed) -> Lsn {
    let at = Lsn(p.start.0 + 40);
    assert!(at.0 / PAGE == p.start.0 / PAGE && at < p.end, "{p:?} too short or at a page end");
    at
}

fn corrupt_at(r: Result<CheckStats, Refusal>) -> (Lsn, bool) {
    match r {
        Err(Refusal::Corrupt { lsn, found_now, .. }) => (lsn, found_now),
        other => panic!("expected a corrupt record, got {other:?}"),
    }
}

#[test]
fn a_damaged_record_inside_a_piece_is_refused_and_the_pieces_beside_it_are_served() {
    let origin = Lsn(2 * SEG);
    let mut w = WalWriter::new(origin, SEG);
    let placed: Vec<Placed> = (0..1200).map(|i| w.append(&record(100 + i % 7 * 300))).collect();
    let mut wal = Wal::new(&w);
    let bad = &placed[150];
    wal.damage(inside(bad));
    // A record after the pieces below touch: never decoded by them, so never reported.
    wal.damage(inside(&placed[1100]));
    let mut fc = FetchCheck::default();
    // A piece that holds the record, cut anywhere on both sides.
    let (from, to) = (Lsn(bad.start.0 - 5000), Lsn(bad.end.0 + 3333));
    assert_eq!(corrupt_at(wal.check(&mut fc, from, to)), (bad.start, true));
    // Asked again (the proposer does, every tick): refused from memory, nothing read.
    let read = wal.read_bytes;
    assert_eq!(corrupt_at(wal.check(&mut fc, from, to)), (bad.start, false));
    assert_eq!(wal.read_bytes, read);
    // A piece that ends inside the record still needs it whole: refused.
    assert_eq!(corrupt_at(wal.check(&mut fc, Lsn(bad.start.0 - 100), Lsn(bad.start.0 + 30))).0, bad.start);
    // The pieces below it, even adjacent, are served.
    assert!(wal.check(&mut fc, placed[10].start, bad.start).is_ok());
    assert!(wal.check(&mut fc, Lsn(placed[10].start.0 + 77), Lsn(bad.start.0 - 3)).is_ok());
    // Above it, what the failing check had read is refused too (one read at most), and
    // beyond that the pieces are served.
    assert_eq!(corrupt_at(wal.check(&mut fc, bad.end, Lsn(bad.end.0 + 100))), (bad.start, false));
    let beyond = Lsn(bad.end.0 + READ_CHUNK_BYTES);
    assert!(wal.check(&mut fc, beyond, Lsn(beyond.0 + 300_000)).is_ok());
    assert!(placed[1100].start > Lsn(beyond.0 + 300_000 + 10_000));
    // A truncation forgets everything: the next request decodes again and finds it again.
    fc.forget();
    assert_eq!(corrupt_at(wal.check(&mut fc, from, to)), (bad.start, true));
}

#[test]
fn a_piece_that_starts_and_ends_inside_a_long_record_checks_all_of_it() {
    let origin = Lsn(3 * SEG - 5 * PAGE);
    let mut w = WalWriter::new(origin, SEG);
    let before = w.append(&record(200));
    // Ends on the page the long record begins on: decoding for the long record skips its
    // tail and never sees `before`, two pages back.
    w.append(&record(2 * PAGE as usize));
    let long = w.append(&record(3 * MIB as usize)); // across three segment boundaries
    assert!(long.start.0 / PAGE > before.end.0 / PAGE + 1);
    let after = w.append(&record(200));
    // A piece wholly inside the record, far from both its ends.
    let (from, to) = (Lsn(long.start.0 + MIB + 12_345), Lsn(long.start.0 + 2 * MIB - 77));
    let mut fc = FetchCheck::default();
    let mut wal = Wal::new(&w);
    let stats = wal.check(&mut fc, from, to).unwrap();
    assert!(stats.decoded_bytes >= long.end.0 - long.start.0, "{stats:?}");
    let (lo, hi) = fc.checked_range().unwrap();
    assert!(lo <= long.start && hi >= long.end, "{lo}..{hi} does not hold {long:?}");
    // Damage in the record's first page, or its last, far outside the piece: refused.
    for damaged in [inside(&long), Lsn(long.end.0 - 100)] {
        let mut wal = Wal::new(&w);
        wal.damage(damaged);
        let mut fc = FetchCheck::default();
        assert_eq!(corrupt_at(wal.check(&mut fc, from, to)).0, long.start, "damage at {damaged}");
    }
    // The record's neighbours are not involved.
    let mut wal = Wal::new(&w);
    wal.damage(inside(&before));
    wal.damage(inside(&after));
    assert!(wal.check(&mut FetchCheck::default(), from, to).is_ok());
}

#[test]
fn a_record_spanning_many_pieces_is_decoded_once() {
    let origin = Lsn(4 * SEG);
    let mut w = WalWriter::new(origin, SEG);
    w.append(&record(300));
    let long = w.append(&record(5 * MIB as usize));
    let last = w.append(&record(300));
    let record_bytes = long.end.0 - long.start.0;
    // Walking down in 64 KiB pieces, as the proposer does (with 1 MiB ones): the first
    // piece decodes the record, the other 80 read nothing.
    let mut wal = Wal::new(&w);
    let mut fc = FetchCheck::default();
    wal.fetch_down(&mut fc, origin, last.end, 64 * 1024).unwrap();
    assert!(wal.read_bytes < record_bytes + 2 * MIB, "read {} for a record of {record_bytes}", wal.read_bytes);
    assert_eq!(fc.checked_range(), Some((origin, last.end)));
    // Walking up, as a stream would: the same.
    let mut wal = Wal::new(&w);
    let mut fc = FetchCheck::default();
    let mut from = origin;
    while from < last.end {
        let to = Lsn((from.0 + 64 * 1024).min(last.end.0));
        wal.check(&mut fc, from, to).unwrap();
        from = to;
    }
    assert!(wal.read_bytes < record_bytes + 2 * MIB, "read {} for a record of {record_bytes}", wal.read_bytes);
    // The same walk down over WAL whose long record is damaged near its end: refused at
    // the first piece that touches it, every later piece inside it refused from memory.
    let mut wal = Wal::new(&w);
    wal.damage(Lsn(long.end.0 - 5000));
    let mut fc = FetchCheck::default();
    let (at, refusal) = wal.fetch_down(&mut fc, origin, last.end, 64 * 1024).unwrap_err();
    assert!(at < long.end && at >= Lsn(long.end.0 - 64 * 1024), "refused at {at}");
    assert!(matches!(refusal, Refusal::Corrupt { lsn, found_now: true, .. } if lsn == long.start));
    let read = wal.read_bytes;
    assert_eq!(corrupt_at(wal.check(&mut fc, Lsn(long.start.0 + MIB), Lsn(long.start.0 + MIB + 64 * 1024))), (long.start, false));
    assert_eq!(wal.read_bytes, read);
}

#[test]
fn a_record_that_began_before_the_wal_is_served_with_its_page_headers_checked() {
    let origin = Lsn(3 * SEG - 4 * PAGE);
    let mut w = WalWriter::new(origin, SEG);
    let long = w.append(&record(60_000));
    let next = w.append(&record(100));
    let end = w.append(&record(100)).end;
    // This safekeeper's WAL begins at a segment boundary inside `long` (older WAL removed).
    let begin = Lsn(3 * SEG);
    assert!(long.start < begin && begin < long.end);
    let mut wal = Wal::new(&w);
    wal.begin = begin;
    let mut fc = FetchCheck::default();
    // `long`'s tail goes out unchecked, `next` checked.
    assert!(wal.check(&mut fc, begin, Lsn(next.end.0 - 8)).is_ok());
    assert_eq!(fc.checked_range().map(|r| r.0), Some(begin));
    // Its tail's body is not checked (its CRC needs its head), its page headers are.
    let mut wal = Wal::new(&w);
    wal.begin = begin;
    wal.damage(Lsn(begin.0 + 2 * PAGE + 100));
    assert!(wal.check(&mut FetchCheck::default(), begin, end).is_ok());
    let mut wal = Wal::new(&w);
    wal.begin = begin;
    wal.damage(Lsn(begin.0 + PAGE)); // the magic of the page after the segment's first
    assert_eq!(corrupt_at(wal.check(&mut FetchCheck::default(), begin, end)), (Lsn(begin.0 + PAGE), true));
    // The record after the tail is checked.
    let mut wal = Wal::new(&w);
    wal.begin = begin;
    wal.damage(inside(&next));
    assert_eq!(corrupt_at(wal.check(&mut FetchCheck::default(), begin, end)), (next.start, true));
    // When the WAL's beginning moves (removal), what was remembered goes.
    let mut wal = Wal::new(&w);
    let mut fc = FetchCheck::default();
    wal.check(&mut fc, origin, end).unwrap();
    wal.begin = begin;
    wal.check(&mut fc, begin, end).unwrap();
    assert_eq!(fc.checked_range().map(|r| r.0), Some(begin));
}

#[test]
fn a_record_past_the_end_of_this_safekeepers_wal_cannot_be_checked() {
    let origin = Lsn(2 * SEG);
    let mut w = WalWriter::new(origin, SEG);
    let a = w.append(&record(100));
    let long = w.append(&record(100_000));
    let mut wal = Wal::new(&w);
    wal.end = Lsn(long.start.0 + 50_000); // the WAL ends inside `long`
    let mut fc = FetchCheck::default();
    assert_eq!(wal.check(&mut fc, origin, Lsn(long.start.0 + 10)), Err(Refusal::Incomplete { record_from: long.start, wal_end: wal.end }));
    // What did check is served, and remembered.
    assert!(wal.check(&mut fc, origin, a.end).is_ok());
    let read = wal.read_bytes;
    assert!(wal.check(&mut fc, a.start, a.end).is_ok());
    assert_eq!(wal.read_bytes, read);
}

/// The cost of checking 1 MiB pieces, reads from memory: of real PostgreSQL WAL (`pgwal`'s
/// fixture: 17 MiB of a pgbench and DDL workload, mostly full-page images in this part) and
/// of small test-encoder records (100 to 400 bytes, the worst case: the cost is per record);
/// each piece with nothing remembered (decode_start's page reads and about 1 MiB decoded),
/// and the proposer's walk down with the range kept. Run with `cargo test -p safekeeper
/// --release --lib -- --ignored --nocapture fetch_check_cost`.
#[test]
#[ignore = "a measurement: prints the cost of checking fetched pieces"]
fn fetch_check_cost() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../pgwal/tests/data");
    let env = std::fs::read_to_string(dir.join("fixture.env")).unwrap();
    let var = |name: &str| env.lines().find_map(|l| l.strip_prefix(&format!("{name}="))).unwrap().to_string();
    let (start, end): (Lsn, Lsn) = (var("START_LSN").parse().unwrap(), var("END_LSN").parse().unwrap());
    let bytes = zstd::decode_all(&std::fs::read(dir.join("wal.bin.zst")).unwrap()[..]).unwrap();
    let config = DecoderConfig { segment_size_bytes: 16 << 20, system_id: Some(var("SYSTEM_ID").parse().unwrap()) };
    measure("real WAL", &Wal { origin: start, bytes, begin: start, end, read_bytes: 0 }, config);
    let mut w = WalWriter::new(Lsn(2 * SEG), SEG);
    for i in 0..80_000 {
        w.append(&record(100 + i % 4 * 100));
    }
    let small = Wal::new(&w);
    measure("small records", &small, small.bounds().config);
}

fn measure(what: &str, wal: &Wal, config: DecoderConfig) {
    let (start, end) = (wal.begin, wal.end);
    let bounds = WalBounds { begin: start, end, config };
    let check = |fc: &mut FetchCheck, from: Lsn, to: Lsn| {
        let (origin, bytes) = (wal.origin, &wal.bytes);
        fc.check(from, to, bounds, |f, t| Ok(Bytes::copy_from_slice(&bytes[(f.0 - origin.0) as usize..(t.0 - origin.0) as usize])))
    };
    for round in 0..3 {
        let started = std::time::Instant::now();
        let (mut pieces, mut decoded, mut records) = (0u64, 0u64, 0u64);
        let mut to = end;
        while to.0 > start.0 + MIB {
            let from = Lsn(to.0 - MIB);
            let stats = check(&mut FetchCheck::default(), from, to).unwrap();
            (decoded, records) = (decoded + stats.decoded_bytes, records + stats.records);
            pieces += 1;
            to = from;
        }
        let fresh = started.elapsed();
        let started = std::time::Instant::now();
        let mut fc = FetchCheck::default();
        let mut to = end;
        while to > start {
            let from = Lsn(to.0.saturating_sub(MIB).max(start.0));
            check(&mut fc, from, to).unwrap();
            to = from;
        }
        let walk = started.elapsed();
        println!(
            "{what}, round {round}: {pieces} pieces of 1 MiB, each checked alone: {:.0} us a piece ({} bytes and {} records decoded a piece, {:.2} GB/s); walking down with the range kept: {:.0} us a piece",
            fresh.as_secs_f64() * 1e6 / pieces as f64,
            decoded / pieces,
            records / pieces,
            decoded as f64 / fresh.as_secs_f64() / 1e9,
            walk.as_secs_f64() * 1e6 / pieces as f64,
        );
    }
}
