//! WalProposer and sync_safekeepers against in-process acceptors over real TCP sockets
//! (see `harness/mod.rs`: a test double of the safekeeper service until it is merged).

mod harness;

use harness::{pattern, wait_until, write_segments, TestSafekeeper, SEGMENT_BYTES};
use proto::Lsn;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use walproposer::{sync_safekeepers, Config, Status, WalProposer};

const WAIT: Duration = Duration::from_secs(20);

fn safekeepers(n: usize) -> Vec<TestSafekeeper> {
    (0..n).map(|i| TestSafekeeper::start(i as u64 + 1)).collect()
}

fn config(sks: &[TestSafekeeper], wal_start: Lsn, wal_dir: Option<&Path>) -> Config {
    Config {
        safekeepers: sks.iter().map(|s| s.addr.clone()).collect(),
        tenant_id: "11111111111111111111111111111111".parse().unwrap(),
        timeline_id: "22222222222222222222222222222222".parse().unwrap(),
        system_id: 7,
        wal_segment_size: SEGMENT_BYTES as u32,
        wal_start,
        wal_dir: wal_dir.map(Path::to_path_buf),
        name: "test".into(),
        reconnect_max: Duration::from_millis(200),
        // Synthetic segments: bytes, not WAL records.
        whole_records: false,
        auth_token: None,
        tls: None,
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("walproposer-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A proposer and a counter of its wake calls.
fn start(cfg: Config) -> (WalProposer, Arc<AtomicU64>) {
    let wakes = Arc::new(AtomicU64::new(0));
    let w = Arc::clone(&wakes);
    let p = WalProposer::start(
        cfg,
        Arc::new(move |_| {
            w.fetch_add(1, Ordering::SeqCst);
        }),
    )
    .unwrap();
    (p, wakes)
}

fn assert_has_pattern(sk: &TestSafekeeper, from: Lsn, to: Lsn) {
    let node = sk.node.lock().unwrap();
    let got = node.bytes(from, to);
    let want: Vec<u8> = (from.0..to.0).map(pattern).collect();
    assert!(got == &want[..], "safekeeper {} has wrong bytes in {from}..{to}", sk.addr);
}

const START: Lsn = Lsn(3 * SEGMENT_BYTES + 40);

#[test]
fn streams_and_commits_with_a_majority() {
    let dir = temp_dir("stream");
    write_segments(&dir, START, Lsn(8 * SEGMENT_BYTES));
    let sks = safekeepers(3);
    let (p, wakes) = start(config(&sks, START, Some(&dir)));
    wait_until("elected", WAIT, || matches!(p.status(), Status::Streaming { .. }));
    assert_eq!(p.status(), Status::Streaming { term: 1, start_lsn: START });

    // Small, then across two segment boundaries.
    let e1 = Lsn(START.0 + 1000);
    p.wal_flushed(e1);
    wait_until("commit reaches e1", WAIT, || p.commit_lsn() >= e1);
    let e2 = Lsn(5 * SEGMENT_BYTES + 123);
    for step in 1..=50 {
        p.wal_flushed(Lsn(e1.0 + (e2.0 - e1.0) * step / 50));
    }
    wait_until("commit reaches e2", WAIT, || p.commit_lsn() == e2);
    assert!(wakes.load(Ordering::SeqCst) >= 2);
    wait_until("all safekeepers have e2", WAIT, || sks.iter().all(|s| s.flush_lsn() == e2));
    for sk in &sks {
        assert_has_pattern(sk, START, e2);
    }
    wait_until("feedback", WAIT, || p.feedback().pageserver_flush_lsn >= e1);
    // The remote-consistent LSN that only the first safekeeper hears (the harness's pretend
    // pageserver) reaches the others through the proposer, and every safekeeper learns the
    // peer horizon: all of them have everything.
    let rcl = Lsn(e2.0 / 2);
    wait_until("the remote-consistent LSN relayed", WAIT, || sks.iter().all(|s| s.node.lock().unwrap().remote_consistent_lsn >= rcl));
    assert_eq!(p.feedback().pageserver_remote_consistent_lsn, rcl);
    wait_until("the peer horizon", WAIT, || sks.iter().all(|s| s.node.lock().unwrap().acceptor.state().peer_horizon_lsn == e2));

    // One down: a majority still commits.
    sks[0].down();
    let e3 = Lsn(e2.0 + 300_000);
    p.wal_flushed(e3);
    wait_until("commit reaches e3 with one safekeeper down", WAIT, || p.commit_lsn() == e3);

    // Two down: no commit.
    sks[1].down();
    let e4 = Lsn(e3.0 + 5000);
    p.wal_flushed(e4);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(p.commit_lsn(), e3, "no commit without a majority");
    assert_eq!(p.status(), Status::Streaming { term: 1, start_lsn: START });

    // Back: commits resume, and the one that was down longest catches up.
    sks[1].up();
    wait_until("commit reaches e4", WAIT, || p.commit_lsn() == e4);
    sks[0].up();
    wait_until("safekeeper 0 catches up", WAIT, || sks[0].flush_lsn() == e4);
    assert_has_pattern(&sks[0], START, e4);
    p.stop();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A safekeeper that keeps its connection open but stops reading it (stuck, or its disk
/// hung) holds up neither the commits the other two make nor the reading of their answers:
/// the proposer's sockets never block. Once it reads again it catches up.
#[test]
fn a_safekeeper_that_stops_reading_does_not_hold_up_the_others() {
    let dir = temp_dir("stuck");
    let end = Lsn(40 * SEGMENT_BYTES);
    write_segments(&dir, START, end);
    let sks = safekeepers(3);
    let (p, _) = start(config(&sks, START, Some(&dir)));
    wait_until("elected", WAIT, || matches!(p.status(), Status::Streaming { .. }));
    sks[2].pause();
    for step in 1..=400 {
        p.wal_flushed(Lsn(START.0 + (end.0 - START.0) * step / 400));
    }
    // Before the core owned the sockets, its blocking write to the stuck one held every
    // commit for its 5 s timeout, again after each reconnect: this wait ran out.
    wait_until("commit reaches the end without the stuck safekeeper", WAIT, || p.commit_lsn() == end);
    assert!(sks[2].flush_lsn() < end);
    sks[2].resume();
    wait_until("the stuck safekeeper catches up", WAIT, || sks[2].flush_lsn() == end);
    assert_has_pattern(&sks[2], START, end);
    p.stop();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_newer_compute_fences_the_older_and_a_stale_one_is_fenced() {
    let dir = temp_dir("fence");
    write_segments(&dir, START, Lsn(6 * SEGMENT_BYTES));
    let sks = safekeepers(3);
    let (p1, _) = start(config(&sks, START, Some(&dir)));
    let end = Lsn(START.0 + 200_000);
    p1.wal_flushed(end);
    wait_until("p1 commits", WAIT, || p1.commit_lsn() == end);

    // A compute started at the old LSN: the safekeepers' WAL has moved on without it.
    let (stale, _) = start(config(&sks, START, Some(&dir)));
    wait_until("the stale compute is fenced", WAIT, || matches!(stale.status(), Status::Fenced { .. }));
    let Status::Fenced { reason } = stale.status() else { unreachable!() };
    assert!(reason.contains("another compute has written WAL since"), "{reason}");
    assert!(reason.contains(&end.to_string()) && reason.contains(&START.to_string()), "{reason}");
    stale.stop();
    // The stale one asked for no vote (the pre-vote), so the first one was not fenced by it.
    let end = Lsn(end.0 + 296); // a possible record start (MAXALIGNed)
    p1.wal_flushed(end);
    wait_until("p1 commits after the stale compute's attempt", WAIT, || p1.commit_lsn() == end);
    assert!(matches!(p1.status(), Status::Streaming { term: 1, .. }), "{:?}", p1.status());

    // A compute started at the end of the WAL is elected; the first one, once it tries to
    // write, learns of the higher term and is fenced for good.
    let (p2, _) = start(config(&sks, end, Some(&dir)));
    wait_until("p2 elected", WAIT, || matches!(p2.status(), Status::Streaming { start_lsn, .. } if start_lsn == end));
    p1.wal_flushed(Lsn(end.0 + 100));
    wait_until("p1 fenced", WAIT, || matches!(p1.status(), Status::Fenced { .. }));
    let Status::Fenced { reason } = p1.status() else { unreachable!() };
    assert!(reason.contains("accepted term") && reason.contains("can no longer commit"), "{reason}");
    assert_eq!(p1.commit_lsn(), end, "a fenced compute commits nothing more");
    let e2 = Lsn(end.0 + 5000);
    p2.wal_flushed(e2);
    wait_until("p2 commits", WAIT, || p2.commit_lsn() == e2);
    p1.stop();
    p2.stop();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_missing_segment_fails_the_proposer() {
    // Every safekeeper needs WAL that is gone: no majority can be served.
    let dir = temp_dir("gone");
    let sks = safekeepers(3);
    let (p, _) = start(config(&sks, START, Some(&dir)));
    wait_until("elected", WAIT, || matches!(p.status(), Status::Streaming { .. }));
    p.wal_flushed(Lsn(START.0 + 10));
    wait_until("failed", WAIT, || matches!(p.status(), Status::Failed { .. }));
    let Status::Failed { reason } = p.status() else { unreachable!() };
    assert!(reason.contains("is gone") && reason.contains("000000010000000000000003"), "{reason}");
    p.stop();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A safekeeper that was away while the compute wrote more WAL than its
/// `pg_wal` keeps, and whose segments were removed, is caught up by the same compute, without
/// a new election: the WAL it lacks is fetched from the other safekeepers a little at a time
/// (never more than `max_fetched` plus one fetch in memory), then it streams from `pg_wal`
/// again, and it is a full member (commits go on with it and one other), not left behind
/// until the next compute's election.
#[test]
fn a_safekeeper_behind_the_wal_the_compute_keeps_catches_up_from_the_others() {
    let dir = temp_dir("behind");
    let lag: u64 = 24 << 20; // more than the fetched WAL the proposer may hold
    let e2 = Lsn(START.0 + lag);
    write_segments(&dir, START, Lsn(e2.0 + 3 * SEGMENT_BYTES));
    let sks = safekeepers(3);
    let (p, _) = start(config(&sks, START, Some(&dir)));
    let e1 = Lsn(START.0 + 10_000);
    p.wal_flushed(e1);
    wait_until("all three have e1", WAIT, || sks.iter().all(|s| s.flush_lsn() == e1));

    // Safekeeper 2 is away while the compute writes on, and the compute's checkpoint
    // removes every segment but the last two.
    sks[2].down();
    for step in 1..=48 {
        p.wal_flushed(Lsn(e1.0 + (e2.0 - e1.0) * step / 48));
    }
    wait_until("commit reaches e2 without safekeeper 2", WAIT, || p.commit_lsn() == e2);
    let kept_from = e2.0 / SEGMENT_BYTES - 1;
    for segno in START.0 / SEGMENT_BYTES..kept_from {
        std::fs::remove_file(dir.join(pgwal::segment::segment_file_name(1, segno, SEGMENT_BYTES))).unwrap();
    }
    sks[2].up();

    wait_until("safekeeper 2 catches up to the commit LSN", WAIT, || sks[2].flush_lsn() == e2 && sks[2].commit_lsn() == e2);
    assert_has_pattern(&sks[2], START, e2);
    assert_eq!(p.status(), Status::Streaming { term: 1, start_lsn: START }, "no new election");
    for sk in &sks {
        assert_eq!(sk.node.lock().unwrap().acceptor.state().term, 1, "safekeeper {} saw no other term", sk.addr);
    }
    let config = quorum::ProposerConfig::default();
    let (_, peak) = p.fetched_wal_bytes();
    assert!(peak > 0 && peak <= config.max_fetched + config.max_fetch, "{peak} fetched bytes held at once");
    wait_until("fetched WAL freed", WAIT, || p.fetched_wal_bytes().0 == 0);
    assert!(p.connections().iter().all(|(_, down)| down.is_none()), "{:?}", p.connections());

    // A full member: with safekeeper 0 away, safekeepers 1 and 2 commit.
    sks[0].down();
    let e3 = Lsn(e2.0 + 5000);
    p.wal_flushed(e3);
    wait_until("commit reaches e3 with safekeeper 0 down", WAIT, || p.commit_lsn() == e3);
    assert_eq!(sks[2].flush_lsn(), e3);
    p.stop();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn sync_of_empty_safekeepers_finds_no_wal() {
    let sks = safekeepers(3);
    assert_eq!(sync_safekeepers(&config(&sks, Lsn(0), None), WAIT).unwrap(), None);
}

#[test]
fn sync_returns_the_end_of_wal_and_brings_a_lagging_safekeeper_up() {
    let dir = temp_dir("sync");
    write_segments(&dir, START, Lsn(6 * SEGMENT_BYTES));
    let sks = safekeepers(3);
    // Safekeeper 2 misses all of the WAL.
    sks[2].down();
    let (p, _) = start(config(&sks, START, Some(&dir)));
    // More than the proposer fetches at once (1 MiB), so the sync fetches in steps.
    let end = Lsn(START.0 + 2_500_000);
    p.wal_flushed(end);
    wait_until("commit", WAIT, || p.commit_lsn() == end);
    p.stop();
    assert_eq!(sks[2].flush_lsn(), Lsn(0));

    // The sync can use only safekeepers 1 and 2: 2 must receive everything from the donor.
    sks[2].up();
    sks[0].down();
    let synced = sync_safekeepers(&config(&sks, Lsn(0), None), WAIT).unwrap();
    assert_eq!(synced, Some(end));
    for sk in &sks[1..] {
        assert_eq!(sk.flush_lsn(), end);
        assert!(sk.commit_lsn() >= end, "{} commit LSN {}", sk.addr, sk.commit_lsn());
        assert_has_pattern(sk, START, end);
    }

    // All up: the same answer, and the compute that starts there is elected.
    sks[0].up();
    assert_eq!(sync_safekeepers(&config(&sks, Lsn(0), None), WAIT).unwrap(), Some(end));
    let (p2, _) = start(config(&sks, end, Some(&dir)));
    wait_until("p2 elected", WAIT, || matches!(p2.status(), Status::Streaming { start_lsn, .. } if start_lsn == end));
    p2.stop();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn sync_times_out_naming_the_unreachable_safekeepers() {
    let sks = safekeepers(3);
    sks[0].down();
    sks[1].down();
    let err = sync_safekeepers(&config(&sks, Lsn(0), None), Duration::from_secs(1)).unwrap_err().to_string();
    assert!(err.contains("within 1s") && err.contains("electing"), "{err}");
    assert!(err.contains(&sks[0].addr) && err.contains(&sks[1].addr) && !err.contains(&sks[2].addr), "{err}");
}

#[test]
fn invalid_configs_are_refused() {
    let sks = safekeepers(1);
    let dir = temp_dir("invalid");
    let err = |cfg: Config| WalProposer::start(cfg, Arc::new(|_| {})).err().unwrap().to_string();
    assert!(err(config(&sks, Lsn(0), Some(&dir))).contains("without a start LSN"));
    assert!(err(config(&sks, START, None)).contains("pg_wal"));
    assert!(err(Config { safekeepers: vec![], ..config(&sks, START, Some(&dir)) }).contains("empty"));
    assert!(err(Config { wal_segment_size: 1000, ..config(&sks, START, Some(&dir)) }).contains("segment size 1000"));
    let long = Some("a".repeat(quorum::wire::TOKEN_BYTES_MAX + 1));
    let e = err(Config { auth_token: long, ..config(&sks, START, Some(&dir)) });
    assert!(e.contains("auth token is 4097 bytes long"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The token goes to every safekeeper in `Hello`; a safekeeper that refuses it is named,
/// with its reason, in the error of a sync that cannot get a majority.
#[test]
fn the_token_is_sent_in_hello_and_a_refusal_is_reported() {
    let sks = safekeepers(3);
    for sk in &sks {
        sk.node.lock().unwrap().required_token = Some("good-token".into());
    }
    let good = Config { auth_token: Some("good-token".into()), ..config(&sks, Lsn(0), None) };
    assert_eq!(sync_safekeepers(&good, WAIT).unwrap(), None);
    for sk in &sks {
        let tokens = sk.node.lock().unwrap().hello_tokens.clone();
        assert!(!tokens.is_empty() && tokens.iter().all(|t| t == "good-token"), "{tokens:?}");
    }
    // Its Debug (which a caller might log) does not show it.
    assert!(!format!("{good:?}").contains("good-token"));

    for (token, sent) in [(None, ""), (Some("bad-token"), "bad-token")] {
        let bad = Config { auth_token: token.map(String::from), ..config(&sks, Lsn(0), None) };
        let err = sync_safekeepers(&bad, Duration::from_secs(1)).unwrap_err().to_string();
        assert!(err.contains("safekeeper refused the connection: the token's signature does not verify"), "{err}");
        assert!(sks.iter().all(|sk| sk.node.lock().unwrap().hello_tokens.last().map(String::as_str) == Some(sent)));
    }
}

/// PostgreSQL WAL as the compute writes it, for the tests that need the proposer to decode
/// real records (`Config::whole_records`): logical-message records (`pg_logical_emit_message`)
/// of any length, laid out on pages with headers and continuation records.
struct PgWal {
    /// The first byte, at a segment start.
    begin: Lsn,
    bytes: Vec<u8>,
    prev: Lsn,
}

impl PgWal {
    fn new(begin: Lsn) -> PgWal {
        assert!(begin.0.is_multiple_of(SEGMENT_BYTES));
        let mut w = PgWal { begin, bytes: Vec::new(), prev: Lsn(0) };
        w.page_header(0);
        w
    }

    fn pos(&self) -> Lsn {
        Lsn(self.begin.0 + self.bytes.len() as u64)
    }

    fn page_header(&mut self, rem_len: u32) {
        use pgwal::consts::XLP_FIRST_IS_CONTRECORD;
        let mut h = pgwal::PageHeader::new(self.pos(), pgwal::TimeLineId(1), SEGMENT_BYTES, 7);
        if rem_len > 0 {
            h.info |= XLP_FIRST_IS_CONTRECORD;
            h.rem_len = rem_len;
        }
        self.bytes.extend_from_slice(&h.to_bytes());
    }

    /// Appends a logical message of `len` bytes; returns where the record ends (padded to
    /// 8 bytes, as the next record begins).
    fn message(&mut self, len: usize, fill: u8) -> Lsn {
        use pgwal::consts::{RM_LOGICALMSG_ID, XLOG_BLCKSZ, XLR_BLOCK_ID_DATA_LONG, XLR_BLOCK_ID_DATA_SHORT};
        let mut rec = vec![0u8; pgwal::consts::SIZE_OF_XLOG_RECORD];
        match u8::try_from(len) {
            Ok(short) => rec.extend([XLR_BLOCK_ID_DATA_SHORT, short]),
            Err(_) => {
                rec.push(XLR_BLOCK_ID_DATA_LONG);
                rec.extend((len as u32).to_le_bytes());
            }
        }
        rec.extend(std::iter::repeat_n(fill, len));
        let tot_len = rec.len() as u32;
        rec[0..4].copy_from_slice(&tot_len.to_le_bytes());
        rec[8..16].copy_from_slice(&self.prev.0.to_le_bytes());
        rec[17] = RM_LOGICALMSG_ID;
        let crc = pgwal::record::record_crc(&rec);
        rec[20..24].copy_from_slice(&crc.to_le_bytes());
        // Records begin 8-aligned, after the page header if that lands on a page start.
        self.bytes.resize(self.bytes.len().next_multiple_of(8), 0);
        if self.pos().0.is_multiple_of(XLOG_BLCKSZ as u64) {
            self.page_header(0);
        }
        let start = self.pos();
        let mut written = 0;
        while written < rec.len() {
            if self.pos().0.is_multiple_of(XLOG_BLCKSZ as u64) {
                self.page_header((rec.len() - written) as u32);
            }
            let room = XLOG_BLCKSZ - (self.pos().0 % XLOG_BLCKSZ as u64) as usize;
            let n = room.min(rec.len() - written);
            self.bytes.extend_from_slice(&rec[written..written + n]);
            written += n;
        }
        // Its end as the decoder reports it (`EndRecPtr`): after the alignment padding.
        self.bytes.resize(self.bytes.len().next_multiple_of(8), 0);
        self.prev = start;
        self.pos()
    }

    /// Writes the WAL as `pg_wal` segment files (zeros after its end).
    fn write_segments(&self, dir: &Path) {
        let first = self.begin.0 / SEGMENT_BYTES;
        for (i, chunk) in self.bytes.chunks(SEGMENT_BYTES as usize).enumerate() {
            let mut data = chunk.to_vec();
            data.resize(SEGMENT_BYTES as usize, 0);
            std::fs::write(dir.join(pgwal::segment::segment_file_name(1, first + i as u64, SEGMENT_BYTES)), data).unwrap();
        }
    }
}

/// Records of any size through the proposer's shell: a compute's record far longer than a
/// message (20 MiB; `quorum::wire::WAL_BYTES_MAX` is 16 MiB) streams to the safekeepers in
/// pieces as PostgreSQL flushes it, but nothing past the last whole record is committed or
/// counted as their log's end. The compute dies inside the record; the sync ends at the
/// record before it (and drops the partial one), and the next compute starts there, streams
/// the long record whole and commits it. A compute killed while the record streams (wherever
/// it stops) leaves a log a sync ends at a record boundary of.
#[test]
fn a_sync_after_a_compute_died_inside_a_long_record_ends_at_a_boundary() {
    let dir = temp_dir("long-record");
    let mut wal = PgWal::new(Lsn(3 * SEGMENT_BYTES));
    let wal_start = wal.pos();
    let first = wal.message(100, 1);
    let long = wal.message(20 << 20, 2);
    let after = wal.message(100, 3);
    wal.write_segments(&dir);
    let sks = safekeepers(3);
    let cfg = |wal_start: Lsn, dir: Option<&Path>| Config { whole_records: true, ..config(&sks, wal_start, dir) };

    let (p, _) = start(cfg(wal_start, Some(&dir)));
    p.wal_flushed(first);
    wait_until("the first record committed", WAIT, || p.commit_lsn() >= first);
    // PostgreSQL flushed 12 MiB of the long record: the safekeepers get it, but their logs
    // end, for elections and commits, at the first record.
    let inside = Lsn(first.0 + (12 << 20));
    p.wal_flushed(inside);
    wait_until("the safekeepers hold part of the long record", WAIT, || sks.iter().all(|s| s.flush_lsn() == inside));
    for s in &sks {
        assert_eq!((s.boundary_lsn(), s.commit_lsn()), (first, first), "safekeeper {}", s.addr);
    }
    assert_eq!(p.commit_lsn(), first);
    p.stop();
    let synced = sync_safekeepers(&cfg(Lsn(0), None), WAIT).unwrap();
    assert_eq!(synced, Some(first), "the sync ends at the last whole record");
    assert!(sks.iter().filter(|s| s.flush_lsn() == first).count() >= 2, "the partial record is dropped by the sync's term");

    // The next compute starts there and commits the long record.
    let (p, _) = start(cfg(first, Some(&dir)));
    p.wal_flushed(after);
    wait_until("the long record committed", WAIT, || p.commit_lsn() >= after);
    // All three, not just the two that committed it: the last part below says where every
    // safekeeper's log ends, and one left behind here would still end at `first` there.
    wait_until("every safekeeper holds the long record whole", WAIT, || sks.iter().all(|s| s.boundary_lsn() >= after));
    p.stop();
    assert_eq!(sync_safekeepers(&cfg(Lsn(0), None), WAIT).unwrap(), Some(after));
    assert!(sks.iter().filter(|s| s.boundary_lsn() == after).count() >= 2, "a majority holds the long record whole");
    assert!(long > first && after > long);

    // Another long record, all of it flushed at once, and the compute killed as soon as a
    // safekeeper holds a few MiB of it: wherever the streams stopped, the sync ends at a
    // record boundary (where the record starts, or after it).
    let long2 = wal.message(20 << 20, 4);
    wal.write_segments(&dir);
    let (p, _) = start(cfg(after, Some(&dir)));
    p.wal_flushed(long2);
    wait_until("a safekeeper holds part of the second long record", WAIT, || sks.iter().any(|s| s.flush_lsn() > Lsn(after.0 + (3 << 20))));
    p.stop();
    let synced = sync_safekeepers(&cfg(Lsn(0), None), WAIT).unwrap();
    assert!(synced == Some(after) || synced == Some(long2), "the sync ends at {synced:?}, not at {after} or {long2}");
    for s in &sks {
        assert!(
            [after, long2].contains(&s.boundary_lsn()),
            "safekeeper {} says its last whole record ends at {}",
            s.addr,
            s.boundary_lsn()
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
