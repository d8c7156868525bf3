//! Layer file tests: round trips, and corruption at every byte of a file.
//!
//! The corruption test flips each byte of a small multi-block delta layer and of an image
//! layer in turn. For every position, the full scrub (`open` + `verify`) must fail, and
//! every single-key read must either fail or return exactly the original versions: a
//! damaged block may go unnoticed by a read that does not touch it, but is never served.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use bytes::Bytes;
use proto::{BlockNumber, ForkNumber, Key, KeyRange, Lsn, RelTag};

use super::format::{HEADER_SIZE_BYTES, INDEX_ENTRY_SIZE_BYTES};
use super::*;
use crate::config::StorageConfig;
use crate::value::Value;

fn key(blk: u32) -> Key {
    Key::rel_block(RelTag { spcnode: 1663, dbnode: 5, relnode: 16384, forknum: ForkNumber::Main }, BlockNumber(blk))
}

fn small_blocks() -> StorageConfig {
    StorageConfig { block_size_bytes: 100, ..StorageConfig::default() }
}

type Versions = BTreeMap<Key, Vec<(Lsn, Value)>>;

fn write_delta(dir: &Path) -> (LayerFile, Versions) {
    let mut writer = LayerWriter::new(dir, LayerKind::Delta, Lsn(100)..Lsn(200), &small_blocks()).unwrap();
    let mut expected = Versions::new();
    for k in 0..6u32 {
        for i in 0..(k + 1) {
            let lsn = Lsn(100 + u64::from(i) * 7 + u64::from(k));
            let value = if i == 0 {
                Value::Image(Bytes::from(vec![k as u8; 20]))
            } else {
                Value::Record { will_init: i % 3 == 0, rec: Bytes::from(format!("k{k}i{i}")) }
            };
            writer.put(key(k), lsn, &value).unwrap();
            expected.entry(key(k)).or_default().push((lsn, value));
        }
    }
    (writer.finish(KeyRange { start: key(0), end: key(10) }).unwrap(), expected)
}

fn write_image(dir: &Path) -> (LayerFile, Versions) {
    let mut writer = LayerWriter::new(dir, LayerKind::Image, Lsn(150)..Lsn(151), &small_blocks()).unwrap();
    let mut expected = Versions::new();
    for k in [0u32, 2, 3, 9] {
        let value = Value::Image(Bytes::from(vec![k as u8 + 1; 8192]));
        writer.put(key(k), Lsn(150), &value).unwrap();
        expected.insert(key(k), vec![(Lsn(150), value)]);
    }
    (writer.finish(KeyRange { start: key(0), end: key(20) }).unwrap(), expected)
}

#[test]
fn delta_layer_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let (layer, expected) = write_delta(dir.path());
    assert!(layer.path().file_name().unwrap().to_str().unwrap().ends_with("__0000000000000064-00000000000000C8"));
    layer.verify().unwrap();
    for (k, versions) in &expected {
        assert_eq!(&layer.get(*k).unwrap(), versions);
    }
    assert!(layer.get(key(7)).unwrap().is_empty());
    let all: Vec<_> = layer.reader().unwrap().iter().map(|r| r.unwrap()).collect();
    assert_eq!(all.len(), expected.values().map(Vec::len).sum::<usize>());
    assert!(all.windows(2).all(|w| (w[0].0, w[0].1) < (w[1].0, w[1].1)));
    // Keys with a version at or below LSN 101: only those whose first version is that old.
    assert_eq!(layer.keys(&KeyRange::ALL, Lsn(101)).unwrap(), vec![key(0), key(1)]);
    // Reopening from the path alone gives the same layer.
    let reopened = LayerFile::open(layer.path()).unwrap();
    assert_eq!(reopened.desc(), layer.desc());
}

#[test]
fn image_layer_round_trips_and_is_authoritative() {
    let dir = tempfile::tempdir().unwrap();
    let (layer, expected) = write_image(dir.path());
    layer.verify().unwrap();
    for (k, versions) in &expected {
        assert_eq!(&layer.get(*k).unwrap(), versions);
    }
    let mut c = crate::value::ValueCollector::default();
    assert!(layer.collect(key(5), Lsn(150)..Lsn(151), &mut c).unwrap(), "absent key must complete the search");
    assert!(c.finish().is_empty());
}

#[test]
fn empty_layer_is_valid() {
    let dir = tempfile::tempdir().unwrap();
    let writer = LayerWriter::new(dir.path(), LayerKind::Image, Lsn(5)..Lsn(6), &StorageConfig::default()).unwrap();
    let layer = writer.finish(KeyRange::ALL).unwrap();
    layer.verify().unwrap();
    assert_eq!(layer.file_size_bytes(), HEADER_SIZE_BYTES as u64);
}

#[test]
fn writer_refuses_misuse_and_leaves_no_temp_file() {
    let dir = tempfile::tempdir().unwrap();
    let v = Value::Record { will_init: false, rec: Bytes::from_static(b"x") };
    let mut w = LayerWriter::new(dir.path(), LayerKind::Delta, Lsn(10)..Lsn(20), &StorageConfig::default()).unwrap();
    w.put(key(1), Lsn(10), &v).unwrap();
    assert!(w.put(key(1), Lsn(10), &v).is_err(), "duplicate");
    assert!(w.put(key(0), Lsn(11), &v).is_err(), "key order");
    assert!(w.put(key(2), Lsn(20), &v).is_err(), "LSN outside the range");
    assert!(w.finish(KeyRange { start: key(2), end: key(3) }).is_err(), "key outside the range");
    let mut w = LayerWriter::new(dir.path(), LayerKind::Image, Lsn(10)..Lsn(11), &StorageConfig::default()).unwrap();
    assert!(w.put(key(1), Lsn(10), &v).is_err(), "record in an image layer");
    drop(w);
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0, "temporary files left behind");
}

/// Where a byte lies in a layer file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Region {
    Header,
    Block,
    Index,
}

fn flip_every_byte(layer: LayerFile, expected: Versions) {
    let path = layer.path().to_path_buf();
    let index_offset = layer.file_size_bytes() - (expected.len() * INDEX_ENTRY_SIZE_BYTES) as u64;
    drop(layer);
    let original = fs::read(&path).unwrap();
    let mut detected_by_read = BTreeMap::<Region, usize>::new();
    for pos in 0..original.len() {
        let region = match pos as u64 {
            p if p < HEADER_SIZE_BYTES as u64 => Region::Header,
            p if p < index_offset => Region::Block,
            _ => Region::Index,
        };
        let mut bytes = original.clone();
        bytes[pos] ^= 0x20;
        fs::write(&path, &bytes).unwrap();
        let layer = match LayerFile::open(&path) {
            Err(e) => {
                assert!(e.is_corruption(), "flip at {pos}: {e}");
                assert!(e.to_string().contains(&*path.to_string_lossy()), "error does not name the file: {e}");
                *detected_by_read.entry(region).or_default() += 1;
                continue;
            }
            Ok(layer) => layer,
        };
        assert_ne!(region, Region::Header, "flip at {pos} in the header passed open");
        assert_ne!(region, Region::Index, "flip at {pos} in the index passed open");
        let err = layer.verify().expect_err("scrub missed a flipped byte");
        assert!(err.to_string().contains("is corrupt at offset"), "{err}");
        let mut any_read_failed = false;
        for (k, versions) in &expected {
            match layer.get(*k) {
                Ok(found) => assert_eq!(&found, versions, "flip at {pos} served wrong data for {k}"),
                Err(e) => {
                    assert!(e.is_corruption(), "{e}");
                    any_read_failed = true;
                }
            }
        }
        assert!(any_read_failed, "flip at {pos} in a block went unnoticed by every read");
        *detected_by_read.entry(region).or_default() += 1;
    }
    fs::write(&path, &original).unwrap();
    LayerFile::open(&path).unwrap().verify().unwrap();
    assert_eq!(detected_by_read.keys().copied().collect::<Vec<_>>(), vec![Region::Header, Region::Block, Region::Index]);
}

#[test]
fn every_flipped_byte_of_a_delta_layer_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let (layer, expected) = write_delta(dir.path());
    flip_every_byte(layer, expected);
}

#[test]
fn every_flipped_byte_of_an_image_layer_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let (layer, expected) = write_image(dir.path());
    flip_every_byte(layer, expected);
}

/// What `collect` must give for `versions` (oldest first) and `range`: the versions in the
/// range, newest first, until one completes the collection; an image layer always
/// completes it.
fn collect_naively(kind: LayerKind, versions: &[(Lsn, Value)], range: &std::ops::Range<Lsn>) -> (bool, crate::value::ReconstructData) {
    let mut c = crate::value::ValueCollector::default();
    for (lsn, value) in versions.iter().rev().filter(|(lsn, _)| range.contains(lsn)) {
        if c.push(*lsn, value.clone()) {
            break;
        }
    }
    if kind == LayerKind::Image && !c.is_complete() {
        c.mark_complete();
    }
    (c.is_complete(), c.finish())
}

/// Every key of `expected` and every LSN range over the layer: `collect` agrees with
/// `collect_naively`, and `collect_changes` reports each key's newest version in the range
/// (an image layer holds states, not changes: none).
fn check_reads_by_range(layer: &LayerFile, expected: &Versions) {
    for start in 99..=200 {
        for end in (start + 1..=201).step_by(3) {
            let range = Lsn(start)..Lsn(end);
            // The search asks an image layer only for ranges holding its LSN.
            let searched = layer.desc().kind == LayerKind::Delta || range.contains(&layer.desc().lsn_range.start);
            for (k, versions) in expected.iter().filter(|_| searched) {
                let mut c = crate::value::ValueCollector::default();
                let complete = layer.collect(*k, range.clone(), &mut c).unwrap();
                assert_eq!((complete, c.finish()), collect_naively(layer.desc().kind, versions, &range), "{k} in {range:?}");
            }
            let mut changes = crate::value::ChangeCollector::new(usize::MAX - 1);
            layer.collect_changes(&KeyRange::ALL, &range, &mut changes).unwrap();
            let newest: Vec<(Key, Lsn)> = expected
                .iter()
                .filter(|_| layer.desc().kind == LayerKind::Delta)
                .filter_map(|(k, v)| v.iter().rev().map(|(lsn, _)| *lsn).find(|lsn| range.contains(lsn)).map(|lsn| (*k, lsn)))
                .collect();
            assert_eq!(changes.finish(), newest, "changes in {range:?}");
        }
    }
}

#[test]
fn reads_by_lsn_range_match_the_versions_written() {
    let dir = tempfile::tempdir().unwrap();
    let (layer, expected) = write_delta(dir.path());
    check_reads_by_range(&layer, &expected);
}

/// Rewrites a current-format layer file as format version 1: index entries without the
/// newest version's LSN, the header's version, index length and checksums to match.
fn rewrite_as_version_1(path: &Path) {
    use super::format::Header;
    use proto::KEY_SIZE_BYTES;
    let bytes = fs::read(path).unwrap();
    let mut header = Header::decode(bytes[..HEADER_SIZE_BYTES].try_into().unwrap(), bytes.len() as u64).unwrap();
    let index_offset = header.index_offset as usize;
    let mut index = Vec::new();
    for e in bytes[index_offset..].chunks_exact(INDEX_ENTRY_SIZE_BYTES) {
        index.extend_from_slice(&e[..KEY_SIZE_BYTES + 8]);
        index.extend_from_slice(&e[KEY_SIZE_BYTES + 16..]);
    }
    header.version = 1;
    header.index_len = index.len() as u64;
    header.index_crc = crc32c::crc32c(&index);
    let mut out = header.encode().to_vec();
    out.extend_from_slice(&bytes[HEADER_SIZE_BYTES..index_offset]);
    out.extend_from_slice(&index);
    fs::write(path, out).unwrap();
}

#[test]
fn version_1_files_are_still_read() {
    let dir = tempfile::tempdir().unwrap();
    for (layer, expected) in [write_delta(dir.path()), write_image(dir.path())] {
        let path = layer.path().to_path_buf();
        drop(layer);
        rewrite_as_version_1(&path);
        let layer = LayerFile::open(&path).unwrap();
        layer.verify().unwrap();
        for (k, versions) in &expected {
            assert_eq!(&layer.get(*k).unwrap(), versions);
        }
        check_reads_by_range(&layer, &expected);
    }
}

/// The point of the newest LSN in the index: a read for versions above a key's newest one
/// (a delta layer that reaches above an image layer, searched for what is newer than the
/// image) reads none of the key's blocks. Shown with a damaged block: a read that needs it
/// fails, one that the index answers does not.
#[test]
fn a_read_above_a_keys_newest_version_reads_none_of_its_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let (layer, expected) = write_delta(dir.path());
    let k = key(5);
    let newest = expected[&k].last().unwrap().0;
    let reader = layer.reader().unwrap();
    let mut iter = reader.iter();
    while iter.next().unwrap().unwrap().0 != k {}
    let block = iter.current_block_offset() as usize;
    drop(iter);
    drop(reader);
    let path = layer.path().to_path_buf();
    drop(layer);
    let mut bytes = fs::read(&path).unwrap();
    bytes[block + super::format::BLOCK_FRAME_SIZE_BYTES] ^= 0x20;
    fs::write(&path, bytes).unwrap();
    let layer = LayerFile::open(&path).unwrap();
    let mut c = crate::value::ValueCollector::default();
    assert!(!layer.collect(k, Lsn(newest.0 + 1)..Lsn(200), &mut c).unwrap(), "nothing there, the search goes on");
    assert!(c.finish().records.is_empty());
    let mut c = crate::value::ValueCollector::default();
    assert!(layer.collect(k, newest..Lsn(200), &mut c).unwrap_err().is_corruption());
}

#[test]
fn truncated_and_extended_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (layer, _) = write_delta(dir.path());
    let path = layer.path().to_path_buf();
    drop(layer);
    let original = fs::read(&path).unwrap();
    for len in [0, 10, HEADER_SIZE_BYTES, original.len() - 1] {
        fs::write(&path, &original[..len]).unwrap();
        let err = LayerFile::open(&path).unwrap_err();
        assert!(err.is_corruption(), "{err}");
    }
    let mut longer = original.clone();
    longer.push(0);
    fs::write(&path, &longer).unwrap();
    assert!(LayerFile::open(&path).unwrap_err().to_string().contains("at offset 68"));
}

#[test]
fn renamed_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (layer, _) = write_delta(dir.path());
    let other = LayerDesc::delta(KeyRange { start: key(0), end: key(10) }, Lsn(100)..Lsn(201));
    let new_path = dir.path().join(other.file_name());
    fs::rename(layer.path(), &new_path).unwrap();
    let err = LayerFile::open(&new_path).unwrap_err();
    assert!(err.to_string().contains("the file name another layer"), "{err}");
}

/// Copies a layer from `from` (the "remote" copy), after `gate` opens if there is one.
#[derive(Debug)]
struct GatedCopy {
    from: std::path::PathBuf,
    started: std::sync::Mutex<std::sync::mpsc::Sender<()>>,
    gate: Option<std::sync::Mutex<std::sync::mpsc::Receiver<()>>>,
}

impl LayerDownload for GatedCopy {
    fn download(&self, _desc: &LayerDesc, path: &Path) -> anyhow::Result<()> {
        let _ = self.started.lock().unwrap().send(());
        if let Some(gate) = &self.gate {
            gate.lock().unwrap().recv()?;
        }
        fs::copy(&self.from, path)?;
        Ok(())
    }
}

/// Makes room by trying to evict every layer it knows but the one being downloaded,
/// resident or not (`try_evict` must not wait even for a layer being downloaded).
#[derive(Debug, Default)]
struct EvictOthers {
    layers: std::sync::Mutex<Vec<std::sync::Arc<LayerFile>>>,
    made_room_for: std::sync::Mutex<Vec<(u64, LayerDesc)>>,
}

impl DiskBudget for EvictOthers {
    fn make_room(&self, incoming_bytes: u64, downloading: &LayerFile) {
        self.made_room_for.lock().unwrap().push((incoming_bytes, downloading.desc().clone()));
        for layer in self.layers.lock().unwrap().iter().filter(|l| l.path() != downloading.path()) {
            layer.try_evict().unwrap();
        }
    }

    fn download_done(&self, _incoming_bytes: u64, _downloading: &LayerFile) {}
}

/// Thread A downloads layer X (holding X's state); thread B downloads layer Y and makes
/// room by evicting every other layer, X included. B must not wait for A's download.
#[test]
fn making_room_never_waits_for_a_layer_being_downloaded() {
    use std::sync::mpsc::channel;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let remote_dir = dir.path().join("remote");
    fs::create_dir(&remote_dir).unwrap();
    let budget = Arc::new(EvictOthers::default());
    let (x_file, x_expected) = write_delta(dir.path());
    let (y_file, y_expected) = write_image(dir.path());
    let (gate_tx, gate_rx) = channel();
    let (started_tx, started_rx) = channel();
    let mut evicted = Vec::new();
    for (file, gate) in [(x_file, Some(Mutex::new(gate_rx))), (y_file, None)] {
        let from = remote_dir.join(file.desc().file_name());
        fs::rename(file.path(), &from).unwrap();
        let download = Arc::new(GatedCopy { from, started: Mutex::new(started_tx.clone()), gate });
        let remote = RemoteCopy { download, budget: Some(budget.clone()) };
        evicted.push(Arc::new(LayerFile::evicted(file.path().to_path_buf(), file.desc().clone(), file.file_size_bytes(), remote)));
    }
    let (x, y) = (Arc::clone(&evicted[0]), Arc::clone(&evicted[1]));
    budget.layers.lock().unwrap().extend(evicted.iter().cloned());

    let a = std::thread::spawn({
        let x = Arc::clone(&x);
        move || x.reader().map(|r| r.file_size_bytes())
    });
    started_rx.recv_timeout(Duration::from_secs(30)).expect("A's download started");
    assert!(!x.is_resident(), "residency is known without waiting for the download");
    assert!(!x.try_evict().unwrap(), "a layer being downloaded is left alone");
    let (b_done_tx, b_done_rx) = channel();
    let b = std::thread::spawn({
        let y = Arc::clone(&y);
        move || {
            let r = y.reader().map(|r| r.file_size_bytes());
            b_done_tx.send(()).unwrap();
            r
        }
    });
    b_done_rx.recv_timeout(Duration::from_secs(30)).expect("B made room and downloaded while A's download is still running");
    assert_eq!(b.join().unwrap().unwrap(), y.file_size_bytes());
    gate_tx.send(()).unwrap();
    assert_eq!(a.join().unwrap().unwrap(), x.file_size_bytes());
    assert!(x.is_resident() && y.is_resident());
    for (layer, expected) in [(&x, &x_expected), (&y, &y_expected)] {
        for (k, versions) in expected {
            assert_eq!(&layer.get(*k).unwrap(), versions);
        }
    }
    let asked = budget.made_room_for.lock().unwrap().clone();
    assert_eq!(asked, vec![(x.file_size_bytes(), x.desc().clone()), (y.file_size_bytes(), y.desc().clone())]);
}

/// Keys with many versions (a relation's size during a bulk load) are read through a
/// version index: every read by LSN range agrees with the naive answer, for more such keys
/// than the reader keeps indexes of, read twice over (indexes built, reused, dropped and
/// built again), in a file of small blocks so that versions span many of them.
#[test]
fn keys_with_many_versions_read_through_the_version_index_like_the_rest() {
    use super::reader::{VERSION_INDEX_KEYS, VERSION_INDEX_MIN};
    let dir = tempfile::tempdir().unwrap();
    let versions_per_key = u64::from(VERSION_INDEX_MIN) + 44;
    let keys = VERSION_INDEX_KEYS as u32 + 3;
    let lsn_end = 1000 + versions_per_key * 4 + 10;
    let mut writer = LayerWriter::new(dir.path(), LayerKind::Delta, Lsn(1000)..Lsn(lsn_end), &small_blocks()).unwrap();
    let mut expected = Versions::new();
    for k in 0..keys {
        // A few keys with few versions between the many-version ones.
        let count = if k % 4 == 3 { 3 } else { versions_per_key };
        for i in 0..count {
            let lsn = Lsn(1000 + i * 4 + u64::from(k % 4));
            let value = if i % 50 == 0 {
                Value::Image(Bytes::from(vec![k as u8; 12]))
            } else {
                Value::Record { will_init: i % 37 == 0, rec: Bytes::from(format!("k{k}i{i}")) }
            };
            writer.put(key(k), lsn, &value).unwrap();
            expected.entry(key(k)).or_default().push((lsn, value));
        }
    }
    let layer = writer.finish(KeyRange { start: key(0), end: key(keys) }).unwrap();
    for _ in 0..2 {
        for (k, versions) in &expected {
            for (start, end) in [(1000, lsn_end), (1000, 1001), (1200, 1300), (1003, 1777), (1500, lsn_end), (lsn_end - 5, lsn_end)] {
                let range = Lsn(start)..Lsn(end);
                let mut c = crate::value::ValueCollector::default();
                let complete = layer.collect(*k, range.clone(), &mut c).unwrap();
                assert_eq!((complete, c.finish()), collect_naively(LayerKind::Delta, versions, &range), "{k} in {range:?}");
            }
            assert_eq!(&layer.get(*k).unwrap(), versions);
        }
    }
}
