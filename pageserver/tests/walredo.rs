//! WAL redo through real `postgres --wal-redo fjord` processes, on real WAL.
//!
//! The WAL is pgwal's fixture (written by PostgreSQL 15.18, see
//! `pgwal/tests/data/regenerate.sh`). For heap pages that the fixture shows being
//! initialized (full-page image or init record) and then modified by later records, the
//! tests replay those records with PostgreSQL's own redo code and check what must hold of
//! the result: the page LSN is the last record's end, every insert added a line pointer,
//! and replaying in two steps (as compaction will) gives the same bytes as in one.
//! Needs our PostgreSQL build (`target/pg15`, or `FJORD_PG_BIN`); as root, the processes
//! run as the unprivileged `FJORD_PG_USER` (default `fjord`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use pageserver::pgdata::walredo::{RedoRecord, WalRedoConfig, WalRedoError, WalRedoManager};
use pgwal::consts::{RM_HEAP_ID, XLOG_HEAP_INSERT, XLOG_HEAP_OPMASK};
use pgwal::{DecodedRecord, DecoderConfig, WalStreamDecoder};
use proto::page::{page_lower, page_lsn, PAGE_HEADER_BYTES};
use proto::{BlockNumber, ForkNumber, Lsn, RelTag};

fn postgres_bin() -> PathBuf {
    let dir = std::env::var_os("FJORD_PG_BIN").map(PathBuf::from).unwrap_or_else(|| {
        std::env::var_os("CARGO_MANIFEST_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
            .join("../target/pg15/bin")
    });
    let bin = dir.join("postgres");
    assert!(bin.exists(), "no postgres at {}; run ./scripts/setup first", bin.display());
    bin
}

/// As root, the (uid, gid) of the unprivileged user: postgres refuses to run as root.
fn run_as() -> Option<(u32, u32)> {
    // SAFETY: plain libc calls; getpwnam's result is read before any other call.
    unsafe {
        if libc::geteuid() != 0 {
            return None;
        }
        let user = std::env::var("FJORD_PG_USER").unwrap_or_else(|_| "fjord".to_string());
        let cuser = std::ffi::CString::new(user.clone()).expect("user name has no NUL");
        let pw = libc::getpwnam(cuser.as_ptr());
        assert!(!pw.is_null(), "running as root, but there is no user {user} to run postgres as");
        Some(((*pw).pw_uid, (*pw).pw_gid))
    }
}

fn manager(processes_max: usize) -> WalRedoManager {
    WalRedoManager::new(WalRedoConfig {
        postgres_bin: postgres_bin(),
        processes_max,
        request_timeout: Duration::from_secs(30),
        run_as: run_as(),
    })
}

fn fixture_records() -> Vec<(Lsn, DecodedRecord)> {
    let data = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
        .join("../pgwal/tests/data");
    let env = std::fs::read_to_string(data.join("fixture.env")).expect("read fixture.env");
    let get = |k: &str| -> Lsn {
        env.lines().find_map(|l| l.strip_prefix(&format!("{k}="))).unwrap_or_else(|| panic!("{k} in fixture.env")).parse().expect("an LSN")
    };
    let wal = zstd::decode_all(&std::fs::read(data.join("wal.bin.zst")).expect("read wal.bin.zst")[..]).expect("unzstd");
    let mut decoder = WalStreamDecoder::new(get("START_LSN"), DecoderConfig::default()).expect("decoder");
    decoder.feed_bytes(&wal);
    let mut out = Vec::new();
    while let Ok(Some(rec)) = decoder.poll_decode() {
        out.push((rec.end_lsn(), rec.decode().expect("fixture records decode")));
    }
    assert!(out.len() > 1000, "the fixture has {} records", out.len());
    out
}

/// A main-fork heap page history from the fixture: the image (or initializing record) and
/// the records after it, all of them heap inserts.
struct History {
    rel: RelTag,
    blkno: BlockNumber,
    base: Option<Bytes>,
    records: Vec<RedoRecord>,
    /// How many of `records` touch more than one block.
    multi_block: usize,
}

fn heap_insert_histories(min_records: usize) -> Vec<History> {
    page_histories(min_records, |rec| rec.rmid() == RM_HEAP_ID && rec.rmgr_info() & XLOG_HEAP_OPMASK == XLOG_HEAP_INSERT)
}

/// Histories of main-fork pages whose every record satisfies `wanted`.
fn page_histories(min_records: usize, wanted: impl Fn(&DecodedRecord) -> bool) -> Vec<History> {
    let mut open: BTreeMap<(RelTag, BlockNumber), History> = BTreeMap::new();
    let mut done = Vec::new();
    for (end_lsn, rec) in fixture_records() {
        let is_insert = wanted(&rec);
        for blk in &rec.blocks {
            if blk.rel.forknum != ForkNumber::Main {
                continue;
            }
            let k = (blk.rel, blk.blkno);
            if blk.initializes_page() && is_insert {
                if let Some(h) = open.remove(&k) {
                    done.push(h);
                }
                // An applied image is the page after this record; an init record builds it.
                let (base, records) = if blk.image.as_ref().is_some_and(|i| i.apply()) {
                    (Some(rec.restore_page(blk.block_id).expect("restore image")), Vec::new())
                } else {
                    (None, vec![RedoRecord { end_lsn, rec: rec.raw.clone() }])
                };
                let multi_block = usize::from(rec.blocks.len() > 1 && !records.is_empty());
                open.insert(k, History { rel: blk.rel, blkno: blk.blkno, base, records, multi_block });
            } else if let Some(h) = open.get_mut(&k) {
                if is_insert && blk.image.is_none() {
                    h.records.push(RedoRecord { end_lsn, rec: rec.raw.clone() });
                    h.multi_block += usize::from(rec.blocks.len() > 1);
                } else if let Some(h) = open.remove(&k) {
                    done.push(h);
                }
            }
        }
    }
    done.extend(open.into_values());
    done.retain(|h| h.records.len() >= min_records);
    assert!(!done.is_empty(), "the fixture has no heap page with {min_records} inserts after its image");
    done
}

fn line_pointers(page: &[u8]) -> usize {
    (usize::from(page_lower(page)) - PAGE_HEADER_BYTES) / 4
}

#[test]
fn replays_heap_inserts_with_postgres_redo() {
    let redo = manager(1);
    let histories = heap_insert_histories(3);
    for h in histories.iter().take(20) {
        let page = redo.redo(h.rel, h.blkno, h.base.as_deref(), &h.records).expect("redo succeeds");
        assert_eq!(page.len(), 8192);
        assert_eq!(page_lsn(&page), h.records.last().unwrap().end_lsn, "page LSN of {} block {}", h.rel, h.blkno);
        let before = h.base.as_deref().map_or(0, line_pointers);
        assert!(
            line_pointers(&page) >= before + h.records.len() - usize::from(h.base.is_none()),
            "every insert adds a line pointer ({} block {}: {before} before, {} after {} records)",
            h.rel,
            h.blkno,
            line_pointers(&page),
            h.records.len()
        );

        // Replaying in two steps, as compaction materializes an image in between, gives
        // the same bytes.
        let mid = h.records.len() / 2;
        let halfway = redo.redo(h.rel, h.blkno, h.base.as_deref(), &h.records[..mid.max(1)]).expect("first half");
        let rest = &h.records[mid.max(1)..];
        let two_step = if rest.is_empty() { halfway } else { redo.redo(h.rel, h.blkno, Some(&halfway), rest).expect("second half") };
        assert_eq!(two_step, page, "two-step replay differs for {} block {}", h.rel, h.blkno);
    }
    assert_eq!(redo.processes_running(), 1, "one process served every request");
}

#[test]
fn replays_multi_block_records_one_block_at_a_time() {
    // Every record kind in the fixture, many of them touching several blocks (heap updates
    // across pages, B-tree splits, GIN and GiST builds): only the requested block is
    // replayed (patch 0003's filter), and the result must carry the last record's LSN and
    // be the same whether replayed in one step or two.
    let redo = manager(1);
    let histories = page_histories(2, |rec| rec.blocks.len() > 1 || rec.rmid() != RM_HEAP_ID);
    let mut multi_block = 0;
    for h in histories.iter().take(200) {
        let page = redo.redo(h.rel, h.blkno, h.base.as_deref(), &h.records).expect("redo succeeds");
        let last = h.records.last().unwrap();
        if !page.iter().all(|b| *b == 0) {
            assert_eq!(page_lsn(&page), last.end_lsn, "page LSN of {} block {}", h.rel, h.blkno);
        }
        let halfway = redo.redo(h.rel, h.blkno, h.base.as_deref(), &h.records[..1]).expect("first step");
        let two_step = redo.redo(h.rel, h.blkno, Some(&halfway), &h.records[1..]).expect("second step");
        assert_eq!(two_step, page, "two-step replay differs for {} block {}", h.rel, h.blkno);
        multi_block += h.multi_block;
    }
    assert!(multi_block > 0, "the histories include multi-block records");
}

#[test]
fn a_failed_redo_reports_why_and_the_pool_recovers() {
    let redo = manager(1);
    let h = &heap_insert_histories(1)[0];
    // A record whose bytes are damaged after its header: the process must refuse it.
    let mut bad = h.records[0].rec.to_vec();
    let n = bad.len();
    for b in &mut bad[24..n] {
        *b ^= 0x5a;
    }
    let err = redo
        .redo(h.rel, h.blkno, h.base.as_deref(), &[RedoRecord { end_lsn: h.records[0].end_lsn, rec: Bytes::from(bad) }])
        .expect_err("a damaged record fails");
    match &err {
        WalRedoError::Failed { stderr, .. } => {
            assert!(stderr.contains("wal redo"), "stderr explains the failure: {err}")
        }
        other => panic!("expected a failure, got {other}"),
    }
    assert_eq!(redo.processes_running(), 0, "the failed process is gone");
    let page = redo.redo(h.rel, h.blkno, h.base.as_deref(), &h.records).expect("a new process serves the next request");
    assert_eq!(page_lsn(&page), h.records.last().unwrap().end_lsn);
}

#[test]
fn concurrent_requests_share_a_bounded_pool() {
    let redo = Arc::new(manager(2));
    let histories = Arc::new(heap_insert_histories(2));
    let expected: Vec<Bytes> =
        histories.iter().take(8).map(|h| redo.redo(h.rel, h.blkno, h.base.as_deref(), &h.records).expect("redo")).collect();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (redo, histories, expected) = (Arc::clone(&redo), Arc::clone(&histories), expected.clone());
            std::thread::spawn(move || {
                for round in 0..5 {
                    let i = (t + round) % expected.len();
                    let h = &histories[i];
                    let page = redo.redo(h.rel, h.blkno, h.base.as_deref(), &h.records).expect("redo");
                    assert_eq!(page, expected[i]);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    assert!(redo.processes_running() <= 2);
}

#[test]
fn masks_pages_with_postgres_rm_mask() {
    let redo = manager(1);
    let h = &heap_insert_histories(1)[0];
    let page = redo.redo(h.rel, h.blkno, h.base.as_deref(), &h.records).expect("redo");
    // heap_mask ignores the page LSN (and hint bits): two pages differing only there are
    // equal once masked, and the mask leaves the tuples alone.
    let mut other_lsn = page.to_vec();
    other_lsn[0..8].copy_from_slice(&[0xAB; 8]);
    let a = redo.mask_page(RM_HEAP_ID, h.blkno, &page).expect("mask");
    let b = redo.mask_page(RM_HEAP_ID, h.blkno, &other_lsn).expect("mask");
    assert_eq!(a, b);
    assert_eq!(line_pointers(&a), line_pointers(&page));
    assert_ne!(a, page, "the mask changed something (at least the LSN)");

    // The XLOG resource manager has no mask function: a clear error, and the pool goes on.
    let err = redo.mask_page(0, h.blkno, &page).expect_err("no mask for RM_XLOG_ID");
    assert!(err.to_string().contains("has no mask function"), "{err}");
    redo.mask_page(RM_HEAP_ID, h.blkno, &page).expect("the next request works");
}

#[test]
fn redo_of_a_block_far_into_a_big_table() {
    // Heap redo touches the free space map and visibility map pages of the target on the
    // side; for block 300000 those are far past anything the redo process has seen. They
    // must cost nothing: the same records replayed at block 300000 succeed and give the
    // same page as at their own block, but for the block number in each tuple's ctid.
    const FAR: u32 = 300_000;
    let redo = manager(1);
    let h = heap_insert_histories(3).into_iter().max_by_key(|h| h.records.len()).expect("a history");
    let near = redo.redo(h.rel, h.blkno, h.base.as_deref(), &h.records).expect("redo at the original block");
    // Move every record's block reference 0 to block FAR. Without an image or the
    // same-relation flag, the block number sits right after the 24-byte record header,
    // the 4-byte block header and the 12-byte relation; redo does not check the CRC.
    let moved: Vec<RedoRecord> = h
        .records
        .iter()
        .map(|r| {
            let mut raw = r.rec.to_vec();
            let (id, fork_flags) = (raw[24], raw[25]);
            assert_eq!(id, 0, "block reference 0 comes first");
            assert_eq!(fork_flags & 0x90, 0, "no image, not the same relation as before");
            assert_eq!(u32::from_le_bytes(raw[40..44].try_into().unwrap()), h.blkno.0);
            raw[40..44].copy_from_slice(&FAR.to_le_bytes());
            RedoRecord { end_lsn: r.end_lsn, rec: Bytes::from(raw) }
        })
        .collect();
    let far = redo.redo(h.rel, BlockNumber(FAR), h.base.as_deref(), &moved).expect("redo far into the table");
    assert_eq!(page_lsn(&far), page_lsn(&near));
    assert_eq!(line_pointers(&far), line_pointers(&near));
    let differing = far.iter().zip(near.iter()).filter(|(a, b)| a != b).count();
    assert!(differing <= 4 * line_pointers(&near), "only ctid block numbers differ ({differing} bytes)");
}
