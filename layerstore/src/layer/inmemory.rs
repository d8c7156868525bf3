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
//! Invariants: every version's LSN is in `start_lsn..end_lsn`; once frozen, the layer
//! never changes; versions of a key are kept in LSN order, and a put at the same `(key,
//! lsn)` as the key's newest version replaces it (as a map would).

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
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
use crate::value::{ChangeCollector, Value, ValueCollector};

/// Name prefix of ephemeral files; never a valid layer file name.
pub const EPHEMERAL_PREFIX: &str = "ephemeral-";

/// How many keys a listing of changes looks at per hold of the index's lock.
const CHANGES_KEYS_PER_LOCK: usize = 4096;

#[derive(Debug, Clone, Copy)]
struct VersionRef {
    lsn: Lsn,
    offset: u64,
    len: u32,
    tag: u8,
    crc: u32,
}

#[derive(Debug)]
struct Inner {
    file: File,
    size_bytes: u64,
    index: BTreeMap<Key, Vec<VersionRef>>,
}

#[derive(Debug)]
pub struct InMemoryLayer {
    path: PathBuf,
    start_lsn: Lsn,
    end_lsn: OnceLock<Lsn>,
    /// When the layer was created, which is at the timeline's first put after a freeze.
    created_at: Instant,
    inner: RwLock<Inner>,
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
    pub fn put(&self, key: Key, lsn: Lsn, value: &Value) -> Result<(), LayerError> {
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
        let versions = inner.index.entry(key).or_default();
        match versions.last_mut() {
            Some(last) if last.lsn == lsn => *last = version,
            Some(last) => {
                assert!(last.lsn < lsn, "put of {key} at {lsn} after {}", last.lsn);
                versions.push(version);
            }
            None => versions.push(version),
        }
        Ok(())
    }

    /// Makes the layer read-only, covering LSNs below `end_lsn`.
    pub fn freeze(&self, end_lsn: Lsn) {
        let inner = self.read_inner();
        let newest = inner.index.values().filter_map(|v| v.last()).map(|v| v.lsn).max();
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
        for v in versions.iter().rev().filter(|v| lsn_range.contains(&v.lsn)) {
            if collector.push(v.lsn, self.read_value(&inner, v)?) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The keys in `range` with a version at or below `lsn`.
    pub fn keys(&self, range: &KeyRange, lsn: Lsn) -> Vec<Key> {
        let inner = self.read_inner();
        inner.index.range(range.start..range.end).filter(|(_, v)| v.first().is_some_and(|v| v.lsn <= lsn)).map(|(k, _)| *k).collect()
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
                let newest = versions.iter().rev().find(|v| lsn_range.contains(&v.lsn));
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
        let inner = self.read_inner();
        if inner.index.is_empty() {
            return Ok(None);
        }
        let mut writer = LayerWriter::new(dir, LayerKind::Delta, self.start_lsn..end_lsn, conf)?;
        for (key, versions) in &inner.index {
            for v in versions {
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
        layer.put(Key::MIN, Lsn(10), &v(b"a")).unwrap();
        layer.put(Key::MIN, Lsn(12), &v(b"b")).unwrap();
        layer.put(Key::MIN, Lsn(12), &v(b"c")).unwrap(); // replaces b
        layer.put(Key::checkpoint(), Lsn(13), &Value::Image(Bytes::from_static(b"i"))).unwrap();
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
