//! The WAL a timeline has received but not yet made durable in layer files, kept in
//! PostgreSQL-named 16 MiB segment files in `<timeline dir>/wal/`, so that the WAL receiver
//! can confirm WAL as flushed as soon as it is on disk here, without waiting for a layer
//! flush.
//!
//! Files: `wal/<segment file name on PostgreSQL timeline 1>` (`LOCAL_WAL_TLI`: the
//! receiver does not follow timeline switches, so local names do not carry the source's
//! timeline), each created at its full 16 MiB size (sparse, reading as zeros) the first
//! time a byte of it arrives; every byte is written at its segment offset, so a write that
//! is repeated (the same WAL received again after a reconnect) rewrites the same bytes.
//! The files are exactly as `pg_wal` would hold them, so `WalIngest::ingest_pg_wal` reads
//! them back, and stops at the first record that is not complete (zeros).
//!
//! **fsync discipline**: `append` only writes (no fsync); `sync` fsyncs every segment file
//! written since the last `sync`, and the `wal` directory if a segment was created since,
//! and only then moves `durable_end` to the end of what was written. The WAL receiver calls
//! `sync` once per batch of messages drained from its socket and confirms `durable_end` as
//! flushed right after. `remove_below` deletes whole segments below an LSN (the
//! disk-consistent LSN: their contents are in layer files).
//!
//! Invariants: WAL is appended contiguously (an `append` must start at or before the end
//! of what was written, never leave a gap); `durable_end` never exceeds what was fsynced.
//! After a crash, what lies beyond the last `sync` may or may not be there; it is WAL the
//! server had flushed before sending it, so replaying it is correct either way.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use anyhow::{ensure, Context};
use proto::lsn::WAL_SEGMENT_SIZE_BYTES;
use proto::Lsn;

use crate::pgdata::walingest::wal_segment_file_name;

/// The directory under a timeline's directory.
pub const LOCAL_WAL_DIR: &str = "wal";
/// The WAL receiver's sources (`{"sources": [{"host", "port", "user"}, ...]}`, see
/// `walreceiver::sources`), in the timeline directory, written atomically; a pageserver restarts the receivers of the timelines that have one.
pub const WAL_RECEIVER_SOURCE_FILE: &str = "wal_receiver.json";
/// The entries of a timeline directory that are the service's, not the engine's: passed to
/// `layerstore::Tenant::load`, which leaves them alone.
pub const TIMELINE_DIR_ENTRIES: &[&str] = &[LOCAL_WAL_DIR, WAL_RECEIVER_SOURCE_FILE];
/// The PostgreSQL timeline in local segment file names.
pub const LOCAL_WAL_TLI: u32 = 1;

/// A timeline's local WAL. See the module documentation.
pub struct LocalWal {
    dir: PathBuf,
    /// Open segment files by segment number; written ones are fsynced by `sync`.
    files: BTreeMap<u64, File>,
    dirty: Vec<u64>,
    dir_dirty: bool,
    /// The end of what was written.
    written_end: Lsn,
    /// The end of what was fsynced.
    durable_end: Lsn,
}

impl LocalWal {
    /// Opens (creating it if needed) the local WAL directory of the timeline in
    /// `timeline_dir`, with `durable_end` known to be `start` (WAL below it is durable
    /// somewhere: here or in layer files).
    pub fn open(timeline_dir: &Path, start: Lsn) -> anyhow::Result<LocalWal> {
        let dir = timeline_dir.join(LOCAL_WAL_DIR);
        if !dir.is_dir() {
            fs::create_dir(&dir).with_context(|| format!("create {}", dir.display()))?;
            crashsafe::fsync_dir(timeline_dir).with_context(|| format!("fsync {}", timeline_dir.display()))?;
        }
        Ok(LocalWal { dir, files: BTreeMap::new(), dirty: Vec::new(), dir_dirty: false, written_end: start, durable_end: start })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn durable_end(&self) -> Lsn {
        self.durable_end
    }

    pub fn written_end(&self) -> Lsn {
        self.written_end
    }

    /// Prepares for WAL from `lsn` on (a (re)connection streams from the timeline's last
    /// record LSN, after the local WAL up to there was ingested): fsyncs every existing
    /// segment, since a process that died may have written to them after its last `sync`,
    /// then sets the written and durable ends to `lsn`.
    pub fn restart_at(&mut self, lsn: Lsn) -> anyhow::Result<()> {
        for (segno, path) in list_segments(&self.dir)? {
            let file = match self.files.remove(&segno) {
                Some(f) => f,
                None => OpenOptions::new().read(true).write(true).open(&path).with_context(|| format!("open {}", path.display()))?,
            };
            file.sync_data().with_context(|| format!("fsync {}", path.display()))?;
        }
        crashsafe::fsync_dir(&self.dir).with_context(|| format!("fsync {}", self.dir.display()))?;
        self.dirty.clear();
        self.dir_dirty = false;
        self.written_end = lsn;
        self.durable_end = lsn;
        Ok(())
    }

    fn segment(&mut self, segno: u64) -> anyhow::Result<&File> {
        if !self.files.contains_key(&segno) {
            let path = self.dir.join(wal_segment_file_name(LOCAL_WAL_TLI, Lsn(segno * WAL_SEGMENT_SIZE_BYTES)));
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .with_context(|| format!("open {}", path.display()))?;
            let len = file.metadata().with_context(|| format!("stat {}", path.display()))?.len();
            if len < WAL_SEGMENT_SIZE_BYTES {
                // New (or cut short by a crash during creation): full size, zeros.
                file.set_len(WAL_SEGMENT_SIZE_BYTES).with_context(|| format!("extend {}", path.display()))?;
                self.dir_dirty = true;
            }
            self.files.insert(segno, file);
        }
        Ok(&self.files[&segno])
    }

    /// Writes `data`, the WAL starting at `start`, into the segment files (no fsync).
    pub fn append(&mut self, start: Lsn, data: &[u8]) -> anyhow::Result<()> {
        ensure!(start <= self.written_end, "WAL from {start} would leave a gap after the local WAL's end {}", self.written_end);
        let mut at = start.0;
        let mut rest = data;
        while !rest.is_empty() {
            let segno = at / WAL_SEGMENT_SIZE_BYTES;
            let offset = at % WAL_SEGMENT_SIZE_BYTES;
            let n = rest.len().min((WAL_SEGMENT_SIZE_BYTES - offset) as usize);
            let dir = self.dir.clone();
            self.segment(segno)?
                .write_all_at(&rest[..n], offset)
                .with_context(|| format!("write WAL at {} in {}", Lsn(at), dir.display()))?;
            if !self.dirty.contains(&segno) {
                self.dirty.push(segno);
            }
            at += n as u64;
            rest = &rest[n..];
        }
        self.written_end = self.written_end.max(Lsn(at));
        Ok(())
    }

    /// Makes everything written durable; returns the new durable end.
    pub fn sync(&mut self) -> anyhow::Result<Lsn> {
        for segno in std::mem::take(&mut self.dirty) {
            if let Some(f) = self.files.get(&segno) {
                f.sync_data().with_context(|| format!("fsync WAL segment {segno:X} in {}", self.dir.display()))?;
            }
        }
        if self.dir_dirty {
            crashsafe::fsync_dir(&self.dir).with_context(|| format!("fsync {}", self.dir.display()))?;
            self.dir_dirty = false;
        }
        self.durable_end = self.written_end;
        Ok(self.durable_end)
    }

    /// Deletes the segments that end at or below `lsn`; returns how many.
    pub fn remove_below(&mut self, lsn: Lsn) -> anyhow::Result<usize> {
        let mut removed = 0;
        for (segno, path) in list_segments(&self.dir)? {
            if (segno + 1) * WAL_SEGMENT_SIZE_BYTES <= lsn.0 {
                self.files.remove(&segno);
                self.dirty.retain(|&s| s != segno);
                fs::remove_file(&path).with_context(|| format!("remove {}", path.display()))?;
                removed += 1;
            }
        }
        if removed > 0 {
            crashsafe::fsync_dir(&self.dir).with_context(|| format!("fsync {}", self.dir.display()))?;
        }
        Ok(removed)
    }
}

/// The local segment files in `dir` by segment number; other names are ignored.
pub fn list_segments(dir: &Path) -> anyhow::Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("list {}", dir.display()))? {
        let entry = entry.with_context(|| format!("list {}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        // Any PostgreSQL timeline in the name: only the segment number orders the files.
        if let Some((_tli, segno)) = pgwal::segment::parse_segment_file_name(&name, WAL_SEGMENT_SIZE_BYTES) {
            out.push((segno, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEG: u64 = WAL_SEGMENT_SIZE_BYTES;

    #[test]
    fn appends_across_segments_sync_and_remove() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = LocalWal::open(dir.path(), Lsn(SEG - 4)).unwrap();
        wal.append(Lsn(SEG - 4), b"abcdefgh").unwrap();
        assert_eq!(wal.written_end(), Lsn(SEG + 4));
        assert_eq!(wal.durable_end(), Lsn(SEG - 4), "nothing is durable before sync");
        assert_eq!(wal.sync().unwrap(), Lsn(SEG + 4));
        let first = dir.path().join("wal/000000010000000000000000");
        let second = dir.path().join("wal/000000010000000000000001");
        assert_eq!(fs::metadata(&first).unwrap().len(), SEG, "segments are created at full size");
        let a = fs::read(&first).unwrap();
        assert_eq!(&a[(SEG - 4) as usize..], b"abcd");
        assert_eq!(&fs::read(&second).unwrap()[..5], b"efgh\0");
        // A repeated append rewrites the same bytes; a gap is refused.
        wal.append(Lsn(SEG), b"efgh").unwrap();
        assert_eq!(wal.written_end(), Lsn(SEG + 4));
        let err = wal.append(Lsn(SEG + 5), b"x").unwrap_err().to_string();
        assert_eq!(err, "WAL from 0/1000005 would leave a gap after the local WAL's end 0/1000004");
        assert_eq!(list_segments(wal.dir()).unwrap().iter().map(|s| s.0).collect::<Vec<_>>(), vec![0, 1]);
        // Only whole segments below the LSN go.
        assert_eq!(wal.remove_below(Lsn(SEG + 3)).unwrap(), 1);
        assert!(!first.exists() && second.exists());
        assert_eq!(wal.remove_below(Lsn(SEG + 3)).unwrap(), 0);
    }
}
