//! The in-memory layer: where new versions land, with its values in an ephemeral file.
//!
//! A timeline has at most one open in-memory layer, which takes puts. Freezing it sets its
//! end LSN and makes it read-only; a new open layer starts at that LSN with the next put.
//! Flushing writes a frozen layer to an L0 delta layer file. Values go to an append-only
//! ephemeral file, so memory holds only the index (about 40 bytes per version), not the
//! values: memory stays bounded however large the values are.
//!
//! The ephemeral file is not durable and is never fsynced: after a crash, the log from the
//! timeline's disk-consistent LSN is ingested again. Each value carries a CRC in the index,
//! checked on every read, so a damaged ephemeral file is reported, never served. Loading a
//! timeline deletes leftover ephemeral files; dropping the layer deletes its file.
//!
//! Each key also counts its records since its newest standalone version (an image or an
//! initializing record) in this layer, in number and in bytes; `put` reports when a count
//! crosses a multiple of the caller's fold thresholds, so the timeline can queue the key
//! for a fold. A fold (`replace_with_image`) replaces one published record version by an
//! image of the value it denotes: the same bytes at every LSN, so no read can tell, and
//! the L0 file the layer becomes holds the image, which bounds the records later reads of
//! that file replay.
//!
//! Invariants: every version's LSN is in `start_lsn..end_lsn`; versions of a key are kept
//! in LSN order, and a put at the same `(key, lsn)` as the key's newest version replaces
//! it (as a map would); once frozen, the layer takes no puts, and the value a version
//! denotes never changes (a fold changes only its representation). A fold lands before
//! the flush reads the layer or not at all: `write_l0` sets `flush_started` before it
//! takes the index's lock, and a fold checks it while holding the lock exclusively.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{OnceLock, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use proto::{Key, KeyRange, Lsn};

use super::file::LayerFile;
use super::name::{LayerDesc, LayerKind};
use super::writer::LayerWriter;
use crate::config::StorageConfig;
use crate::error::LayerError;
use crate::value::{ChangeCollector, Value, ValueCollector, TAG_IMAGE};

/// Name prefix of ephemeral files; never a valid layer file name.
pub const EPHEMERAL_PREFIX: &str = "ephemeral-";

/// How many keys a listing of changes looks at per hold of the index's lock.
const CHANGES_KEYS_PER_LOCK: usize = 4096;

/// A fold tries an open layer's lock this many times, this far apart, before it gives up
/// (`LayerReplace::Busy`): about 10 ms, far longer than a put or a read holds it.
const OPEN_LAYER_LOCK_TRIES: u32 = 200;
const OPEN_LAYER_LOCK_RETRY: Duration = Duration::from_micros(50);

#[derive(Debug, Clone, Copy)]
struct VersionRef {
    lsn: Lsn,
    offset: u64,
    len: u32,
    tag: u8,
    crc: u32,
}

impl VersionRef {
    fn stands_alone(&self) -> bool {
        Value::tag_stands_alone(self.tag)
    }
}

/// One key's versions in the layer, oldest first, and its records since the newest
/// version that stands on its own (or since the layer's start, if none does).
#[derive(Debug, Default)]
struct KeyVersions {
    versions: Vec<VersionRef>,
    records_since_standalone: u32,
    bytes_since_standalone: u64,
}

impl KeyVersions {
    /// Recounts the records after the newest standalone version, from the index alone.
    fn recount(&mut self) {
        let records = self.versions.iter().rev().take_while(|v| !v.stands_alone());
        let (n, bytes) = records.fold((0u32, 0u64), |(n, b), v| (n.saturating_add(1), b + u64::from(v.len)));
        self.records_since_standalone = n;
        self.bytes_since_standalone = bytes;
    }
}

/// When `put` reports a key as a candidate for a fold: every `records` records (0: never)
/// or every `bytes` bytes of records (0: never) since its newest standalone version.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FoldThresholds {
    pub records: u32,
    pub bytes: u64,
}

/// What `InMemoryLayer::replace_with_image` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerReplace {
    Replaced,
    /// The version is already an image: nothing to fold.
    AlreadyImage,
    /// The layer has no version of the key at that LSN.
    NoSuchVersion,
    /// The layer's flush has started: the image would not reach its file, so it is not
    /// stored (reads of the file replay the records as before).
    Flushing,
    /// The layer's lock is taken: by a flush, most likely, which holds it for the whole
    /// file write (the layer is frozen), or for longer than a put or a read would (open).
    /// Not waited for, see `replace_with_image`.
    Busy,
}

#[derive(Debug)]
struct Inner {
    file: File,
    size_bytes: u64,
    index: BTreeMap<Key, KeyVersions>,
}

#[derive(Debug)]
pub struct InMemoryLayer {
    path: PathBuf,
    start_lsn: Lsn,
    end_lsn: OnceLock<Lsn>,
    /// When the layer was created, which is at the timeline's first put after a freeze.
    created_at: Instant,
    inner: RwLock<Inner>,
    /// Set by `write_l0` before it reads the index; folds check it under the write lock.
    flush_started: AtomicBool,
}

impl InMemoryLayer {
    /// Creates an open layer for versions from `start_lsn` on, with its ephemeral file
    /// `ephemeral-<seq>` in `dir`.
    pub fn create(dir: &Path, seq: u64, start_lsn: Lsn) -> Result<InMemoryLayer, LayerError> {
        let path = dir.join(format!("{EPHEMERAL_PREFIX}{seq}"));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| LayerError::io("create", &path, e))?;
        Ok(InMemoryLayer {
            path,
            start_lsn,
            end_lsn: OnceLock::new(),
            created_at: Instant::now(),
            inner: RwLock::new(Inner { file, size_bytes: 0, index: BTreeMap::new() }),
            flush_started: AtomicBool::new(false),
        })
    }

    pub fn start_lsn(&self) -> Lsn {
        self.start_lsn
    }

    /// The end LSN once frozen; `None` while open.
    pub fn end_lsn(&self) -> Option<Lsn> {
        self.end_lsn.get().copied()
    }

    /// An open layer is described as ending at `Lsn::MAX`.
    pub fn desc(&self) -> LayerDesc {
        LayerDesc { kind: LayerKind::Delta, key_range: KeyRange::ALL, lsn_range: self.start_lsn..self.end_lsn().unwrap_or(Lsn::MAX) }
    }

    /// Time since the layer was created.
    pub fn age(&self) -> Duration {
        self.created_at.elapsed()
    }

    /// Bytes of values appended so far.
    pub fn size_bytes(&self) -> u64 {
        self.read_inner().size_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.read_inner().index.is_empty()
    }

    fn read_inner(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        // A panic while holding the lock leaves the index consistent (it is updated last),
        // so a poisoned lock is still usable.
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends one version. The caller (the timeline) checks LSN order and publication.
    /// Returns the key's records since its newest standalone version when that count, or
    /// their bytes, just crossed a multiple of a threshold of `fold`: the key is worth a
    /// fold. A put replacing the newest version at the same LSN counts again (puts at one
    /// LSN are rare, and a count that runs early only folds early).
    pub fn put(&self, key: Key, lsn: Lsn, value: &Value, fold: FoldThresholds) -> Result<Option<u32>, LayerError> {
        assert!(self.end_lsn().is_none(), "put into frozen layer {}", self.desc());
        assert!(lsn >= self.start_lsn, "put at {lsn} below the layer start {}", self.start_lsn);
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let payload = value.payload();
        let offset = inner.size_bytes;
        inner.file.write_all_at(payload, offset).map_err(|e| LayerError::io("write", &self.path, e))?;
        inner.size_bytes += payload.len() as u64;
        let version = VersionRef {
            lsn,
            offset,
            len: u32::try_from(payload.len()).expect("value size is limited by the timeline"),
            tag: value.tag(),
            crc: crc32c::crc32c(payload),
        };
        let entry = inner.index.entry(key).or_default();
        match entry.versions.last_mut() {
            Some(last) if last.lsn == lsn => *last = version,
            Some(last) => {
                assert!(last.lsn < lsn, "put of {key} at {lsn} after {}", last.lsn);
                entry.versions.push(version);
            }
            None => entry.versions.push(version),
        }
        if value.will_init() {
            entry.records_since_standalone = 0;
            entry.bytes_since_standalone = 0;
            return Ok(None);
        }
        let bytes_before = entry.bytes_since_standalone;
        entry.records_since_standalone = entry.records_since_standalone.saturating_add(1);
        entry.bytes_since_standalone += u64::from(version.len);
        let n = entry.records_since_standalone;
        let by_records = fold.records > 0 && n.is_multiple_of(fold.records);
        let by_bytes = fold.bytes > 0 && bytes_before / fold.bytes != entry.bytes_since_standalone / fold.bytes;
        Ok((by_records || by_bytes).then_some(n))
    }

    /// Replaces the version of `key` at `lsn` by `image`, which must be the value that
    /// version denotes (the caller rebuilt it from this timeline's versions at `lsn`):
    /// reads at every LSN see the same bytes before and after. The caller (the timeline)
    /// checks that `lsn` is published, so no put can replace the version meanwhile. Works
    /// on open and frozen layers alike; refused once the layer's flush has started.
    pub fn replace_with_image(&self, key: Key, lsn: Lsn, image: &[u8]) -> Result<LayerReplace, LayerError> {
        if self.flush_started.load(Ordering::SeqCst) {
            return Ok(LayerReplace::Flushing);
        }
        // A frozen layer's flush holds the read lock for its whole file write, and a writer
        // waiting for the lock makes every new reader wait behind it: a fold that waited
        // there would stall every read through this layer until the flush ends. So the lock
        // is never waited for, only tried: a frozen layer once, an open one again for a
        // short while (its holders are puts and reads, all short). The layer can be frozen,
        // and its flush start, between two tries (a blocking wait taken while it was open
        // would then last the whole flush), so every failed try looks again.
        let mut tries = 0;
        let mut inner = loop {
            match self.inner.try_write() {
                Ok(inner) => break inner,
                Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {
                    tries += 1;
                    if self.end_lsn().is_some() || tries > OPEN_LAYER_LOCK_TRIES {
                        return Ok(LayerReplace::Busy);
                    }
                    std::thread::sleep(OPEN_LAYER_LOCK_RETRY);
                }
            }
        };
        // Checked again under the lock: `write_l0` sets the flag before it takes the lock
        // to read, so with the flag clear here the flush reads after this change.
        if self.flush_started.load(Ordering::SeqCst) {
            return Ok(LayerReplace::Flushing);
        }
        let Some(entry) = inner.index.get(&key) else {
            return Ok(LayerReplace::NoSuchVersion);
        };
        let Ok(pos) = entry.versions.binary_search_by_key(&lsn, |v| v.lsn) else {
            return Ok(LayerReplace::NoSuchVersion);
        };
        if entry.versions[pos].tag == TAG_IMAGE {
            return Ok(LayerReplace::AlreadyImage);
        }
        let offset = inner.size_bytes;
        inner.file.write_all_at(image, offset).map_err(|e| LayerError::io("write", &self.path, e))?;
        inner.size_bytes += image.len() as u64;
        let version = VersionRef {
            lsn,
            offset,
            len: u32::try_from(image.len()).expect("value size is limited by the timeline"),
            tag: TAG_IMAGE,
            crc: crc32c::crc32c(image),
        };
        let entry = inner.index.get_mut(&key).expect("looked up above, under the same lock");
        entry.versions[pos] = version;
        entry.recount();
        Ok(LayerReplace::Replaced)
    }

    /// The key's records since its newest standalone version in this layer.
    pub fn records_since_standalone(&self, key: Key) -> u32 {
        self.read_inner().index.get(&key).map_or(0, |e| e.records_since_standalone)
    }

    /// Makes the layer read-only, covering LSNs below `end_lsn`.
    pub fn freeze(&self, end_lsn: Lsn) {
        let inner = self.read_inner();
        let newest = inner.index.values().filter_map(|v| v.versions.last()).map(|v| v.lsn).max();
        assert!(newest.is_none_or(|n| n < end_lsn), "freezing at {end_lsn} below a version at {newest:?}");
        assert!(end_lsn > self.start_lsn, "freezing at {end_lsn}, not above the start {}", self.start_lsn);
        self.end_lsn.set(end_lsn).expect("layer frozen twice");
    }

    fn read_value(&self, inner: &Inner, v: &VersionRef) -> Result<Value, LayerError> {
        let mut buf = vec![0u8; v.len as usize];
        inner.file.read_exact_at(&mut buf, v.offset).map_err(|e| LayerError::io("read", &self.path, e))?;
        if crc32c::crc32c(&buf) != v.crc {
            return Err(LayerError::corrupt(&self.path, v.offset, "value checksum mismatch"));
        }
        Value::from_parts(v.tag, Bytes::from(buf)).ok_or_else(|| LayerError::corrupt(&self.path, v.offset, "unknown value tag"))
    }

    /// Offers the key's versions with LSN in `lsn_range` to `collector`, newest first;
    /// returns whether the collection is complete.
    pub(crate) fn collect(&self, key: Key, lsn_range: std::ops::Range<Lsn>, collector: &mut ValueCollector) -> Result<bool, LayerError> {
        let inner = self.read_inner();
        let Some(versions) = inner.index.get(&key) else {
            return Ok(false);
        };
        for v in versions.versions.iter().rev().filter(|v| lsn_range.contains(&v.lsn)) {
            if collector.push(v.lsn, self.read_value(&inner, v)?) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The keys in `range` with a version at or below `lsn`.
    pub fn keys(&self, range: &KeyRange, lsn: Lsn) -> Vec<Key> {
        let inner = self.read_inner();
        inner
            .index
            .range(range.start..range.end)
            .filter(|(_, v)| v.versions.first().is_some_and(|v| v.lsn <= lsn))
            .map(|(k, _)| *k)
            .collect()
    }

    /// Offers `changes` the newest LSN in `lsn_range` of each key in `key_range` with a
    /// version there. Reads only the index, never a value, and holds the index's lock for
    /// at most `CHANGES_KEYS_PER_LOCK` keys at a time, so puts into an open layer wait
    /// for one short chunk, never for the whole listing. Taking the lock again per chunk is
    /// safe: a listing only asks about published LSNs, whose versions are all in the index
    /// already, and puts only add versions above them.
    pub(crate) fn collect_changes(&self, key_range: &KeyRange, lsn_range: &std::ops::Range<Lsn>, changes: &mut ChangeCollector) {
        let mut start = key_range.start;
        loop {
            let inner = self.read_inner();
            let mut chunk = inner.index.range(start..key_range.end);
            for (key, versions) in chunk.by_ref().take(CHANGES_KEYS_PER_LOCK) {
                // Versions are in LSN order: the newest in range is the last one below its end.
                let newest = versions.versions.iter().rev().find(|v| lsn_range.contains(&v.lsn));
                if let Some(v) = newest {
                    if !changes.add(*key, v.lsn) {
                        return;
                    }
                }
            }
            match chunk.next() {
                Some((key, _)) => start = *key,
                None => return,
            }
        }
    }

    /// Writes this frozen layer as an L0 delta layer file in `dir`. `None` if it is empty.
    pub fn write_l0(&self, dir: &Path, conf: &StorageConfig) -> anyhow::Result<Option<LayerFile>> {
        let end_lsn = self.end_lsn().context("flushing a layer that is not frozen")?;
        // Before the lock: a fold that holds the lock now lands before this read, and one
        // that takes it later sees the flag and stores nothing.
        self.flush_started.store(true, Ordering::SeqCst);
        let inner = self.read_inner();
        if inner.index.is_empty() {
            return Ok(None);
        }
        let mut writer = LayerWriter::new(dir, LayerKind::Delta, self.start_lsn..end_lsn, conf)?;
        for (key, versions) in &inner.index {
            for v in &versions.versions {
                writer.put(*key, v.lsn, &self.read_value(&inner, v)?)?;
            }
        }
        writer.finish(KeyRange::ALL).map(Some)
    }
}

impl Drop for InMemoryLayer {
    fn drop(&mut self) {
        match fs::remove_file(&self.path) {
            // Gone with its directory already (a detached tenant's, removed whole).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!("could not remove ephemeral file {}: {e}", self.path.display()),
            Ok(()) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_collect_freeze_flush() {
        let dir = tempfile::tempdir().unwrap();
        let layer = InMemoryLayer::create(dir.path(), 0, Lsn(10)).unwrap();
        let v = |b: &'static [u8]| Value::Record { will_init: false, rec: Bytes::from_static(b) };
        layer.put(Key::MIN, Lsn(10), &v(b"a"), FoldThresholds::default()).unwrap();
        layer.put(Key::MIN, Lsn(12), &v(b"b"), FoldThresholds::default()).unwrap();
        layer.put(Key::MIN, Lsn(12), &v(b"c"), FoldThresholds::default()).unwrap(); // replaces b
        layer.put(Key::checkpoint(), Lsn(13), &Value::Image(Bytes::from_static(b"i")), FoldThresholds::default()).unwrap();
        let mut c = ValueCollector::default();
        assert!(!layer.collect(Key::MIN, Lsn(10)..Lsn(13), &mut c).unwrap());
        let data = c.finish();
        assert_eq!(
            data.records.iter().map(|(l, r)| (l.0, r.rec.clone())).collect::<Vec<_>>(),
            vec![(10, Bytes::from_static(b"a")), (12, Bytes::from_static(b"c"))]
        );
        assert_eq!(layer.keys(&KeyRange::ALL, Lsn(12)), vec![Key::MIN]);
        layer.freeze(Lsn(14));
        let file = layer.write_l0(dir.path(), &StorageConfig::default()).unwrap().unwrap();
        assert!(file.desc().is_l0());
        assert_eq!(file.desc().lsn_range, Lsn(10)..Lsn(14));
        assert_eq!(file.value_count().unwrap(), 3);
        file.verify().unwrap();
        let path = layer.path.clone();
        drop(layer);
        assert!(!path.exists(), "ephemeral file left behind");
    }
}

#[cfg(test)]
mod fold_tests {
    use super::*;
    use crate::value::{ModelReconstructor, Reconstructor};

    fn rec(s: String) -> Value {
        Value::Record { will_init: false, rec: Bytes::from(s) }
    }

    /// What a read at `lsn` returns from the layer alone (the model's redo).
    fn read(layer: &InMemoryLayer, key: Key, lsn: u64) -> Bytes {
        let mut c = ValueCollector::default();
        layer.collect(key, Lsn(0)..Lsn(lsn + 1), &mut c).unwrap();
        ModelReconstructor.reconstruct(key, Lsn(lsn), c.finish()).unwrap()
    }

    /// A layer with key MIN: an image at 10, then records at 11..=20.
    fn chain(dir: &Path) -> InMemoryLayer {
        let layer = InMemoryLayer::create(dir, 0, Lsn(10)).unwrap();
        let off = FoldThresholds::default();
        layer.put(Key::MIN, Lsn(10), &Value::Image(Bytes::from_static(b"i")), off).unwrap();
        for lsn in 11..=20u64 {
            layer.put(Key::MIN, Lsn(lsn), &rec(format!("r{lsn}")), off).unwrap();
        }
        layer
    }

    #[test]
    fn replacing_a_record_by_its_value_leaves_every_read_identical() {
        let dir = tempfile::tempdir().unwrap();
        let layer = chain(dir.path());
        let before: Vec<Bytes> = (10..=20).map(|l| read(&layer, Key::MIN, l)).collect();
        assert_eq!(layer.records_since_standalone(Key::MIN), 10);
        // Fold the middle version, then the newest.
        for at in [15u64, 20] {
            let value = read(&layer, Key::MIN, at);
            assert_eq!(layer.replace_with_image(Key::MIN, Lsn(at), &value).unwrap(), LayerReplace::Replaced);
            let after: Vec<Bytes> = (10..=20).map(|l| read(&layer, Key::MIN, l)).collect();
            assert_eq!(after, before, "reads changed after folding at {at}");
        }
        assert_eq!(layer.records_since_standalone(Key::MIN), 0, "the newest version is an image now");
        let mut c = ValueCollector::default();
        layer.collect(Key::MIN, Lsn(0)..Lsn(21), &mut c).unwrap();
        let data = c.finish();
        assert_eq!(data.image.map(|(l, _)| l), Some(Lsn(20)));
        assert!(data.records.is_empty(), "a read at the newest version replays nothing");
    }

    #[test]
    fn replace_refuses_missing_versions_and_images() {
        let dir = tempfile::tempdir().unwrap();
        let layer = chain(dir.path());
        assert_eq!(layer.replace_with_image(Key::MIN, Lsn(10), b"x").unwrap(), LayerReplace::AlreadyImage);
        assert_eq!(layer.replace_with_image(Key::MIN, Lsn(21), b"x").unwrap(), LayerReplace::NoSuchVersion);
        assert_eq!(layer.replace_with_image(Key::checkpoint(), Lsn(12), b"x").unwrap(), LayerReplace::NoSuchVersion);
        assert_eq!(read(&layer, Key::MIN, 12), Bytes::from_static(b"ir11r12"), "refusals change nothing");
    }

    #[test]
    fn the_flush_writes_the_image_and_a_later_replace_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let layer = chain(dir.path());
        let value = read(&layer, Key::MIN, 18);
        assert_eq!(layer.replace_with_image(Key::MIN, Lsn(18), &value).unwrap(), LayerReplace::Replaced);
        layer.freeze(Lsn(21));
        let file = layer.write_l0(dir.path(), &StorageConfig::default()).unwrap().unwrap();
        let versions = file.get(Key::MIN).unwrap();
        assert_eq!(versions.len(), 11, "a fold replaces a version, it adds none");
        let at18 = versions.iter().find(|(l, _)| *l == Lsn(18)).map(|(_, v)| v.clone());
        assert_eq!(at18, Some(Value::Image(value)));
        assert_eq!(layer.replace_with_image(Key::MIN, Lsn(20), b"x").unwrap(), LayerReplace::Flushing);
    }

    /// A fold that finds an open layer's lock taken must not queue for it as a writer: the
    /// layer may be frozen meanwhile and its flush hold the read lock for the whole file
    /// write, and a waiting writer makes every new reader of the layer wait behind it. Here
    /// a long reader (standing in for the flush) holds the lock while a fold is pending; a
    /// freeze (one more reader) must still get through at once, and the fold gives up.
    #[test]
    fn a_pending_fold_never_blocks_readers_of_a_layer_frozen_meanwhile() {
        let dir = tempfile::tempdir().unwrap();
        let layer = chain(dir.path());
        let value = read(&layer, Key::MIN, 20);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            let long_reader = layer.read_inner();
            let fold = s.spawn(|| layer.replace_with_image(Key::MIN, Lsn(20), &value).unwrap());
            // Let the fold find the lock taken.
            std::thread::sleep(Duration::from_millis(2));
            s.spawn(|| {
                layer.freeze(Lsn(21));
                tx.send(()).unwrap();
            });
            if rx.recv_timeout(Duration::from_secs(2)).is_err() {
                drop(long_reader);
                panic!("a reader of the layer waited behind a pending fold");
            }
            // Still held: the fold finds the frozen layer's lock taken.
            let outcome = fold.join().unwrap();
            drop(long_reader);
            assert_eq!(outcome, LayerReplace::Busy, "the fold gives up once the layer is frozen");
        });
        assert_eq!(read(&layer, Key::MIN, 20), value, "nothing changed");
        assert_eq!(layer.records_since_standalone(Key::MIN), 10, "the record is still there");
        assert_eq!(layer.replace_with_image(Key::MIN, Lsn(20), &value).unwrap(), LayerReplace::Replaced, "a later try lands");
    }

    #[test]
    fn counters_fire_once_per_threshold_and_restart_at_a_standalone_version() {
        let dir = tempfile::tempdir().unwrap();
        let layer = InMemoryLayer::create(dir.path(), 0, Lsn(1)).unwrap();
        let by_records = FoldThresholds { records: 4, bytes: 0 };
        let mut fired = Vec::new();
        for lsn in 1..=13u64 {
            let value = if lsn == 6 { Value::Record { will_init: true, rec: Bytes::from_static(b"w") } } else { rec("ab".into()) };
            if let Some(n) = layer.put(Key::MIN, Lsn(lsn), &value, by_records).unwrap() {
                fired.push((lsn, n));
            }
        }
        // 1..=4 cross 4; the initializing record at 6 restarts the count; 7..=10 and 11..=13.
        assert_eq!(fired, vec![(4, 4), (10, 4)]);
        let by_bytes = FoldThresholds { records: 0, bytes: 5 };
        let mut fired = Vec::new();
        for lsn in 1..=6u64 {
            if let Some(n) = layer.put(Key::checkpoint(), Lsn(lsn), &rec("ab".into()), by_bytes).unwrap() {
                fired.push((lsn, n));
            }
        }
        // 2, 4, 6, 8, 10, 12 bytes: multiples of 5 are crossed at 6 and 10 bytes.
        assert_eq!(fired, vec![(3, 3), (5, 5)]);
    }
}
