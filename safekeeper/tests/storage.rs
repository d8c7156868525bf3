//! Storage tests against real files: restart, truncation, corruption of the control file
//! and of WAL page headers.

use bytes::Bytes;
use pgwal::{PageHeader, TimeLineId};
use proto::{Lsn, TenantId, TimelineId};
use quorum::{Persist, TermHistory, TermSwitch};
use safekeeper::storage::wal::segment_file_name;
use safekeeper::storage::{RemovalInputs, SyncStats, TimelineStorage};
use safekeeper::{Safekeeper, TimelineError};
use std::path::Path;

const SEG: u32 = 1 << 20;
const SEG64: u64 = SEG as u64;
const SYSID: u64 = 7_000_000_000_000_000_001;

fn ids() -> (TenantId, TimelineId) {
    (TenantId::from_bytes([0xa1; 16]), TimelineId::from_bytes([0xb2; 16]))
}

fn create(dir: &Path) -> TimelineStorage {
    let (t, tl) = ids();
    TimelineStorage::create(&dir.join(t.to_string()).join(tl.to_string()), t, tl, SYSID, SEG, false).unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1).collect()
}

/// Elects term 1 starting at `begin` and appends `data`, as the acceptor would persist it.
fn start_and_append(s: &mut TimelineStorage, begin: Lsn, data: &[u8]) {
    let mut st = SyncStats::default();
    let history = TermHistory(vec![TermSwitch { term: 1, lsn: begin }]);
    s.persist(&Persist::Control { term: 1, history, commit_lsn: Lsn(0), learner: false }, &mut st).unwrap();
    s.persist(&Persist::Truncate { at: begin }, &mut st).unwrap();
    s.persist(&Persist::Append { begin, data: Bytes::copy_from_slice(data), boundary: Lsn(begin.0 + data.len() as u64) }, &mut st).unwrap();
    s.sync(&mut st).unwrap();
    assert!(st.fsyncs > 0);
}

/// The remote-consistent LSN in the control file is the newest attachment generation's: a
/// newer generation's replaces it even if lower, the same generation's only raises it, an
/// older one's is ignored; the generation survives a restart.
#[test]
fn the_remote_consistent_lsn_of_the_newest_generation_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let begin = Lsn(SEG64 + 0x28);
    let mut s = create(dir.path());
    start_and_append(&mut s, begin, &pattern(1000, 3));
    let st = &mut SyncStats::default();
    let at = |lsn: u64| RemovalInputs { commit_lsn: Lsn(0), peer_horizon_lsn: Lsn(0), remote_consistent_lsn: Lsn(begin.0 + lsn) };
    let kept = |s: &TimelineStorage| (s.control().remote_consistent_generation, s.control().remote_consistent_lsn.0 - begin.0);
    assert!(s.persist_lazy_at(at(500), 2, st).unwrap());
    assert_eq!(kept(&s), (2, 500));
    assert!(!s.persist_lazy_at(at(400), 2, st).unwrap(), "the same generation never goes back");
    assert!(!s.persist_lazy_at(at(900), 1, st).unwrap(), "an older generation is ignored");
    assert!(s.persist_lazy_at(at(600), 2, st).unwrap());
    assert!(s.persist_lazy_at(at(300), 3, st).unwrap(), "a newer generation replaces it, lower");
    assert_eq!(kept(&s), (3, 300));
    // `persist_lazy` takes the position as of the generation in the control file.
    assert!(s.persist_lazy(at(350), st).unwrap());
    assert_eq!(kept(&s), (3, 350));
    assert_eq!(s.removal_inputs().remote_consistent_lsn, Lsn(begin.0 + 350));
    let dir2 = s.dir().to_path_buf();
    drop(s);
    assert_eq!(kept(&TimelineStorage::open(&dir2).unwrap()), (3, 350));
}

#[test]
fn restart_keeps_flush_term_history_and_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let begin = Lsn(SEG64 + 0x28);
    let data = pattern(3 * SEG as usize + 1234, 5);
    let end = Lsn(begin.0 + data.len() as u64);
    let tl_dir = {
        let mut s = create(dir.path());
        start_and_append(&mut s, begin, &data);
        let lazy =
            RemovalInputs { commit_lsn: Lsn(begin.0 + 100), peer_horizon_lsn: Lsn(begin.0 + 50), remote_consistent_lsn: Lsn(begin.0 + 70) };
        assert!(s.persist_lazy(lazy, &mut SyncStats::default()).unwrap());
        // Nothing moved: nothing written.
        assert!(!s.persist_lazy(lazy, &mut SyncStats::default()).unwrap());
        s.dir().to_path_buf()
    };
    let mut s = TimelineStorage::open(&tl_dir).unwrap();
    let st = s.acceptor_state();
    assert_eq!(st.term, 1);
    assert_eq!(st.history, TermHistory(vec![TermSwitch { term: 1, lsn: begin }]));
    assert_eq!(st.flush_lsn, end);
    assert_eq!(st.commit_lsn, Lsn(begin.0 + 100));
    assert_eq!(st.peer_horizon_lsn, Lsn(begin.0 + 50));
    assert_eq!(s.control().remote_consistent_lsn, Lsn(begin.0 + 70));
    assert_eq!(s.wal_extent().begin, begin);
    assert_eq!(&s.read_wal(begin, end).unwrap()[..], &data[..]);
    for segno in 1..=4 {
        let p = tl_dir.join(segment_file_name(segno, SEG64));
        assert_eq!(std::fs::metadata(&p).unwrap().len(), SEG64, "{}", p.display());
    }
    assert!(tl_dir.join("000000010000000000000004").exists());
    assert!(!tl_dir.join(segment_file_name(5, SEG64)).exists());
    // Reading beyond the end or before the beginning is refused.
    assert!(s.read_wal(begin, Lsn(end.0 + 1)).is_err());
    assert!(s.read_wal(Lsn(begin.0 - 1), end).is_err());
}

#[test]
fn a_missing_or_short_end_segment_is_reported_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let begin = Lsn(SEG64 + 0x28);
    let mut s = create(dir.path());
    start_and_append(&mut s, begin, &pattern(SEG as usize, 1));
    // Settled (as the periodic task and shutdown do): the WAL is complete, so what is wrong
    // afterwards is damage, not a batch a crash cut short (that case: `wal.rs`'s tests).
    s.settle(&mut SyncStats::default()).unwrap();
    let tl_dir = s.dir().to_path_buf();
    drop(s);
    let last = tl_dir.join(segment_file_name(2, SEG64));
    let f = std::fs::OpenOptions::new().write(true).open(&last).unwrap();
    f.set_len(SEG64 / 2).unwrap();
    let err = format!("{:#}", TimelineStorage::open(&tl_dir).err().unwrap());
    assert!(err.contains("000000010000000000000002") && err.contains("bytes"), "{err}");
    std::fs::remove_file(&last).unwrap();
    let err = format!("{:#}", TimelineStorage::open(&tl_dir).err().unwrap());
    assert!(err.contains("000000010000000000000002") && err.contains("missing"), "{err}");
}

#[test]
fn truncate_inside_zeroes_the_tail_and_drops_later_segments() {
    let dir = tempfile::tempdir().unwrap();
    let begin = Lsn(SEG64 + 0x28);
    let data = pattern(3 * SEG as usize, 9);
    let mut s = create(dir.path());
    start_and_append(&mut s, begin, &data);
    let at = Lsn(2 * SEG64 + 5000);
    s.persist(&Persist::Truncate { at }, &mut SyncStats::default()).unwrap();
    let tl_dir = s.dir().to_path_buf();
    drop(s);
    let mut s = TimelineStorage::open(&tl_dir).unwrap();
    assert_eq!(s.acceptor_state().flush_lsn, at);
    assert_eq!(s.wal_extent().begin, begin);
    let kept = (at.0 - begin.0) as usize;
    assert_eq!(&s.read_wal(begin, at).unwrap()[..], &data[..kept]);
    let seg2 = std::fs::read(tl_dir.join(segment_file_name(2, SEG64))).unwrap();
    assert!(seg2[5000..].iter().all(|&b| b == 0), "bytes after the truncation point are zeroed");
    assert_eq!(seg2[4999], data[kept - 1]);
    assert!(!tl_dir.join(segment_file_name(3, SEG64)).exists());
    assert!(!tl_dir.join(segment_file_name(4, SEG64)).exists());
    // Appending continues at the new end.
    let more = pattern(100, 3);
    let mut st = SyncStats::default();
    s.persist(&Persist::Append { begin: at, data: Bytes::copy_from_slice(&more), boundary: Lsn(at.0 + 100) }, &mut st).unwrap();
    s.sync(&mut st).unwrap();
    assert_eq!(&s.read_wal(at, Lsn(at.0 + 100)).unwrap()[..], &more[..]);
}

/// The segment files of a timeline directory, sorted.
fn segment_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).filter(|n| n.len() == 24).collect();
    v.sort();
    v
}

fn names(segnos: std::ops::RangeInclusive<u64>) -> Vec<String> {
    segnos.map(|s| segment_file_name(s, SEG64)).collect()
}

/// WAL removal on real files: nothing before a pageserver has reported, then only whole
/// segments below the lowest of the three durable LSNs, oldest first; the WAL then begins at
/// the first segment kept, across a restart; a segment left by a crash between `wal.end`
/// and the unlinks goes at startup; a removal up to the end of a WAL that ends at a segment
/// boundary leaves an empty WAL there that appends continue.
#[test]
fn removal_deletes_whole_segments_below_the_horizon() {
    let dir = tempfile::tempdir().unwrap();
    let begin = Lsn(SEG64 + 0x28);
    let data = pattern(5 * SEG as usize, 4);
    let end = Lsn(begin.0 + data.len() as u64); // in segment 6
    let mut s = create(dir.path());
    start_and_append(&mut s, begin, &data);
    let tl_dir = s.dir().to_path_buf();
    let mut st = SyncStats::default();
    let at = |segments: f64| Lsn((segments * SEG64 as f64) as u64);
    // No pageserver yet: everything stays, however far the other two are.
    s.persist_lazy(RemovalInputs { commit_lsn: end, peer_horizon_lsn: at(4.2), remote_consistent_lsn: Lsn(0) }, &mut st).unwrap();
    assert_eq!(s.remove_wal(&mut st).unwrap(), None);
    assert_eq!(segment_files(&tl_dir), names(1..=6));
    // Values only in memory count for nothing: removal reads the control file.
    assert_eq!(s.removal_inputs().horizon(), Lsn(0));
    // The pageserver at 3.5 segments, the peer horizon at 4.2: segments 1 and 2 go.
    s.persist_lazy(RemovalInputs { commit_lsn: end, peer_horizon_lsn: at(4.2), remote_consistent_lsn: at(3.5) }, &mut st).unwrap();
    assert_eq!(s.removal_inputs().horizon(), at(3.5));
    assert_eq!(s.wal_disk_bytes(), 6 * SEG64);
    assert_eq!(s.remove_wal(&mut st).unwrap(), Some(1..3));
    assert_eq!(segment_files(&tl_dir), names(3..=6));
    assert_eq!(s.wal_extent(), safekeeper::storage::extent::WalExtent { begin: at(3.0), end });
    assert_eq!(s.wal_disk_bytes(), 4 * SEG64);
    assert_eq!(s.remove_wal(&mut st).unwrap(), None, "nothing more below the same horizon");
    let err = format!("{:#}", s.read_wal(at(2.9), at(3.1)).unwrap_err());
    assert!(err.contains("this safekeeper has WAL 0/300000.."), "{err}");
    let from = (at(3.0).0 - begin.0) as usize;
    assert_eq!(&s.read_wal(at(3.0), end).unwrap()[..], &data[from..]);
    // The peer horizon holds it now.
    s.persist_lazy(RemovalInputs { commit_lsn: end, peer_horizon_lsn: at(4.2), remote_consistent_lsn: end }, &mut st).unwrap();
    assert_eq!(s.remove_wal(&mut st).unwrap(), Some(3..4));
    drop(s);
    // A crash after wal.end was written but before the unlinks leaves older segments behind:
    // startup removes them.
    std::fs::write(tl_dir.join(segment_file_name(2, SEG64)), vec![0u8; SEG as usize]).unwrap();
    let mut s = TimelineStorage::open(&tl_dir).unwrap();
    assert_eq!(segment_files(&tl_dir), names(4..=6));
    assert_eq!(s.wal_extent().begin, at(4.0));
    assert_eq!(s.acceptor_state().flush_lsn, end);
    assert_eq!(s.acceptor_state().peer_horizon_lsn, at(4.2));
    let from = (at(4.0).0 - begin.0) as usize;
    assert_eq!(&s.read_wal(at(4.0), end).unwrap()[..], &data[from..]);
    // The control file's copy of the beginning caught up with its last write.
    assert_eq!(s.control().wal_begin, at(3.0), "written before the last removal");
    s.persist_lazy(RemovalInputs { commit_lsn: end, peer_horizon_lsn: end, remote_consistent_lsn: end }, &mut st).unwrap();
    assert_eq!(s.control().wal_begin, at(4.0));
    // Everything committed, everyone has it, the pageserver too: the segment holding the end
    // stays.
    assert_eq!(s.remove_wal(&mut st).unwrap(), Some(4..6));
    assert_eq!(segment_files(&tl_dir), names(6..=6));
}

#[test]
fn removal_up_to_an_end_at_a_segment_boundary_keeps_an_empty_wal_there() {
    let dir = tempfile::tempdir().unwrap();
    let begin = Lsn(SEG64);
    let data = pattern(2 * SEG as usize, 6);
    let end = Lsn(3 * SEG64);
    let mut s = create(dir.path());
    start_and_append(&mut s, begin, &data);
    let tl_dir = s.dir().to_path_buf();
    assert_eq!(segment_files(&tl_dir), names(1..=2), "no segment beyond the end yet");
    let mut st = SyncStats::default();
    s.persist_lazy(RemovalInputs { commit_lsn: end, peer_horizon_lsn: end, remote_consistent_lsn: end }, &mut st).unwrap();
    assert_eq!(s.remove_wal(&mut st).unwrap(), Some(1..3));
    // wal.end names segment 3 as where the (empty) WAL begins, so it exists.
    assert_eq!(segment_files(&tl_dir), names(3..=3));
    drop(s);
    let mut s = TimelineStorage::open(&tl_dir).unwrap();
    assert_eq!(s.wal_extent(), safekeeper::storage::extent::WalExtent { begin: end, end });
    let more = pattern(100, 8);
    s.persist(&Persist::Append { begin: end, data: Bytes::copy_from_slice(&more), boundary: Lsn(end.0 + 100) }, &mut st).unwrap();
    s.sync(&mut st).unwrap();
    assert_eq!(&s.read_wal(end, Lsn(end.0 + 100)).unwrap()[..], &more[..]);
}

#[test]
fn truncate_outside_empties_the_wal_and_begins_there() {
    let dir = tempfile::tempdir().unwrap();
    let begin = Lsn(SEG64 + 0x28);
    let mut s = create(dir.path());
    start_and_append(&mut s, begin, &pattern(SEG as usize, 2));
    let tl_dir = s.dir().to_path_buf();
    // Beyond the end.
    let far = Lsn(10 * SEG64 + 0x100);
    s.persist(&Persist::Truncate { at: far }, &mut SyncStats::default()).unwrap();
    drop(s);
    let mut s = TimelineStorage::open(&tl_dir).unwrap();
    assert_eq!(s.acceptor_state().flush_lsn, far);
    assert_eq!(s.wal_extent().begin, far);
    assert_eq!(s.control().wal_begin, far);
    let segs: Vec<String> =
        std::fs::read_dir(&tl_dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).filter(|n| n.len() == 24).collect();
    assert_eq!(segs, vec![segment_file_name(10, SEG64)]);
    assert!(s.read_wal(begin, Lsn(begin.0 + 1)).is_err(), "old WAL is gone");
    // Before the beginning.
    let early = Lsn(SEG64 / 2);
    s.persist(&Persist::Truncate { at: early }, &mut SyncStats::default()).unwrap();
    drop(s);
    let s = TimelineStorage::open(&tl_dir).unwrap();
    assert_eq!(s.wal_extent().begin, early);
    assert_eq!(s.acceptor_state().flush_lsn, early);
    assert!(tl_dir.join(segment_file_name(0, SEG64)).exists());
    assert!(!tl_dir.join(segment_file_name(10, SEG64)).exists());
}

/// WAL pages with valid headers (a long header at each segment start), from a segment start.
fn wal_with_headers(begin: Lsn, pages: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..pages {
        let lsn = Lsn(begin.0 + (i as u64) * 8192);
        let h = PageHeader::new(lsn, TimeLineId(1), SEG64, SYSID).to_bytes();
        out.extend_from_slice(&h);
        out.extend(pattern(8192 - h.len(), i as u8));
    }
    out
}

#[test]
fn verified_read_names_the_segment_of_a_corrupt_page_header() {
    let dir = tempfile::tempdir().unwrap();
    let begin = Lsn(SEG64);
    let data = wal_with_headers(begin, 200); // crosses into the second segment
    let end = Lsn(begin.0 + data.len() as u64);
    let mut s = create(dir.path());
    start_and_append(&mut s, begin, &data);
    assert_eq!(&s.read_wal_verified(begin, end).unwrap()[..], &data[..]);
    // A read starting mid-page still checks that page's header.
    assert!(s.read_wal_verified(Lsn(begin.0 + 100), Lsn(begin.0 + 9000)).is_ok());
    s.settle(&mut SyncStats::default()).unwrap();
    let tl_dir = s.dir().to_path_buf();
    drop(s);

    // Break the magic of the page at segment 2 + 3 pages.
    let seg2 = tl_dir.join(segment_file_name(2, SEG64));
    let mut bytes = std::fs::read(&seg2).unwrap();
    bytes[3 * 8192] ^= 0xff;
    std::fs::write(&seg2, &bytes).unwrap();
    let bad = Lsn(2 * SEG64 + 3 * 8192);
    let mut s = TimelineStorage::open(&tl_dir).unwrap();
    let err = format!("{:#}", s.read_wal_verified(begin, end).unwrap_err());
    assert!(err.contains("000000010000000000000002"), "{err}");
    assert!(err.contains(&bad.to_string()), "{err}");
    // Starting mid-page in the bad page still catches it; ranges before it do not.
    assert!(s.read_wal_verified(Lsn(bad.0 + 100), Lsn(bad.0 + 200)).is_err());
    assert!(s.read_wal_verified(begin, bad).is_ok());
    // The unverified read returns the bytes as they are.
    assert!(s.read_wal(begin, end).is_ok());

    // A page address from elsewhere (a recycled segment) is caught too.
    bytes[3 * 8192] ^= 0xff;
    bytes[3 * 8192 + 8] ^= 0x20; // xlp_pageaddr
    std::fs::write(&seg2, &bytes).unwrap();
    let err = format!("{:#}", s.read_wal_verified(begin, end).unwrap_err());
    assert!(err.contains("000000010000000000000002") && err.contains(&bad.to_string()), "{err}");
}

#[test]
fn corrupt_control_file_makes_the_timeline_unavailable_and_stays_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let (t, tl) = ids();
    {
        let sk = Safekeeper::open(1, dir.path()).unwrap();
        sk.hello_timeline(t, tl, SYSID, SEG).unwrap();
        // A second timeline that stays healthy.
        sk.hello_timeline(t, TimelineId::from_bytes([0xc3; 16]), SYSID, SEG).unwrap();
    }
    let control = dir.path().join(t.to_string()).join(tl.to_string()).join("safekeeper.control");
    let mut bytes = std::fs::read(&control).unwrap();
    bytes[30] ^= 0x01;
    std::fs::write(&control, &bytes).unwrap();

    let sk = Safekeeper::open(1, dir.path()).unwrap();
    match sk.get_timeline(t, tl) {
        Err(TimelineError::Unavailable { reason, .. }) => {
            assert!(reason.contains("safekeeper.control") && reason.contains("checksum"), "{reason}")
        }
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("a corrupt timeline was served"),
    }
    let err = sk.hello_timeline(t, tl, SYSID, SEG).err().unwrap();
    assert!(err.contains("unavailable"), "{err}");
    assert!(sk.get_timeline(t, TimelineId::from_bytes([0xc3; 16])).is_ok(), "other timelines load");
    assert!(matches!(sk.get_timeline(t, TimelineId::from_bytes([0xdd; 16])), Err(TimelineError::NotFound { .. })));
    sk.persist_lazy_state();
    drop(sk);
    assert_eq!(std::fs::read(&control).unwrap(), bytes, "the corrupt file is left as it was");
}

#[test]
fn a_second_safekeeper_cannot_open_the_same_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let _sk = Safekeeper::open(1, dir.path()).unwrap();
    let err = format!("{:#}", Safekeeper::open(2, dir.path()).err().unwrap());
    assert!(err.contains("in use by another safekeeper"), "{err}");
}

/// Files a crash left half-written (a segment being created, a control file being
/// replaced: never renamed into place) are removed when the timeline is opened; the WAL is
/// as it was.
#[test]
fn files_a_crash_left_half_written_are_removed_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let begin = Lsn(SEG64 + 0x28);
    let data = pattern(5000, 9);
    let tl_dir = {
        let mut s = create(dir.path());
        start_and_append(&mut s, begin, &data);
        s.dir().to_path_buf()
    };
    let seg_tmp = tl_dir.join(format!("{}{}", pgwal::segment::segment_file_name(1, 2, SEG64), crashsafe::TEMP_SUFFIX));
    let control_tmp = tl_dir.join(format!("safekeeper.control{}", crashsafe::TEMP_SUFFIX));
    std::fs::write(&seg_tmp, vec![0u8; 4096]).unwrap();
    std::fs::write(&control_tmp, b"half a control file").unwrap();
    let mut s = TimelineStorage::open(&tl_dir).unwrap();
    assert!(!seg_tmp.exists() && !control_tmp.exists());
    assert_eq!(s.acceptor_state().flush_lsn, Lsn(begin.0 + data.len() as u64));
    assert_eq!(&s.read_wal(begin, Lsn(begin.0 + data.len() as u64)).unwrap()[..], &data[..]);
}
