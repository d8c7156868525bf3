//! A timeline's WAL on disk: PostgreSQL-named segment files and `wal.end`.
//!
//! # Segments
//! WAL bytes live at their natural offsets in segment files named as PostgreSQL names them
//! on timeline 1 (`000000010000000000000003`). A segment is created zero-filled to its full
//! size (temporary file, fsync, rename, fsync of the directory), so creating one is atomic
//! and its size never changes afterwards; appends overwrite zeros in place.
//!
//! # `wal.end`
//! The durable extent of the WAL, `[begin, end)`, is a 20-byte record in `wal.end`: the end
//! LSN (the acceptor's flush LSN), the beginning LSN and a crc32c of both. It is rewritten in
//! place with one `pwrite` inside the first sector and `fdatasync`ed. Sector writes are atomic
//! on the devices we run on; if one ever tears, the checksum fails and the timeline is
//! reported corrupt rather than trusted.
//!
//! Why a separate file rather than finding the end by decoding: an append may still end
//! inside a record (the proposer ends its own WAL at record boundaries, but catch-up WAL from
//! a donor and very long runs without a boundary are cut by size, see `quorum`), so the
//! bytes alone cannot tell where the acknowledged WAL ends; and zero bytes are valid WAL
//! content. Keeping the beginning in the
//! same record lets a truncation that moves both (an acceptor whose log shares nothing with
//! the elected history) switch them in one atomic write.
//!
//! # fsync discipline
//! One batch of appends: `pwrite` the bytes into their segments, `fdatasync` every segment
//! touched, then write and `fdatasync` `wal.end`, and only then acknowledge. That is two
//! fsyncs per batch whatever its size; the server drains every message already received
//! before it syncs (group commit), so concurrent appends share them. `wal.end` is written
//! last, so after a crash it never names bytes that were not durable, and an acknowledged
//! end never regresses.
//!
//! Truncation writes `wal.end` first and cleans up afterwards (zeroes the tail of the end's
//! segment, removes segments beyond the range), so a crash in between leaves stale bytes
//! only beyond the end, where nothing reads them; startup removes stray segments again.
//!
//! # Removal
//! [`WalStore::remove_below`] deletes whole segments below a horizon (the rule is in
//! [`super::removal`]): it writes `wal.end` with the new beginning (the start of the first
//! segment kept) and fdatasyncs it, then unlinks the old segments oldest first and fsyncs
//! the directory. A crash in between leaves segments before the beginning, which startup
//! removes like any segment outside the extent; reads never go below the beginning.
//!
//! # Invariants
//! - Every segment from the one holding `begin` to the one holding the last byte (or `begin`
//!   when the WAL is empty) exists and has the full segment size, checked at startup.
//! - An empty WAL that has never begun is `begin == end == 0` and has no segments.

use anyhow::{bail, Context};
use bytes::{Bytes, BytesMut};
use proto::Lsn;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::control::fsync_dir;

pub const WAL_END_FILE_NAME: &str = "wal.end";
/// The PostgreSQL timeline segments are named for and pages are checked against: fjord's
/// computes never switch timelines (no promotion, no archive recovery).
pub const PG_TIMELINE: u32 = 1;
const WAL_END_RECORD_BYTES: usize = 20;
/// Zero-filling and copying go in chunks of this size.
const CHUNK_BYTES: usize = 1 << 20;

/// PostgreSQL's file name for segment `segno` of [`PG_TIMELINE`] with segments of
/// `segment_size` (`pgwal::segment` names segments for the whole tree).
pub fn segment_file_name(segno: u64, segment_size: u64) -> String {
    pgwal::segment::segment_file_name(PG_TIMELINE, segno, segment_size)
}

/// The segment number a PostgreSQL segment file name stands for, if it is one of ours
/// (a segment of [`PG_TIMELINE`]).
pub fn parse_segment_file_name(name: &str, segment_size: u64) -> Option<u64> {
    pgwal::segment::parse_segment_file_name(name, segment_size).and_then(|(tli, segno)| (tli == PG_TIMELINE).then_some(segno))
}

/// The durable extent of the WAL as recorded in `wal.end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WalExtent {
    pub begin: Lsn,
    pub end: Lsn,
}

impl WalExtent {
    fn encode(&self) -> [u8; WAL_END_RECORD_BYTES] {
        let mut b = [0u8; WAL_END_RECORD_BYTES];
        b[0..8].copy_from_slice(&self.end.0.to_le_bytes());
        b[8..16].copy_from_slice(&self.begin.0.to_le_bytes());
        let crc = crc32c::crc32c(&b[..16]);
        b[16..20].copy_from_slice(&crc.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> anyhow::Result<WalExtent> {
        if b.len() != WAL_END_RECORD_BYTES {
            bail!("{WAL_END_FILE_NAME} is {} bytes, expected {WAL_END_RECORD_BYTES}", b.len());
        }
        let stored = u32::from_le_bytes(b[16..20].try_into().expect("4 bytes"));
        let computed = crc32c::crc32c(&b[..16]);
        if stored != computed {
            bail!("{WAL_END_FILE_NAME} has a bad checksum (stored {stored:#010x}, computed {computed:#010x})");
        }
        let end = Lsn(u64::from_le_bytes(b[0..8].try_into().expect("8 bytes")));
        let begin = Lsn(u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")));
        if end < begin {
            bail!("{WAL_END_FILE_NAME} says the WAL ends at {end} before it begins at {begin}");
        }
        Ok(WalExtent { begin, end })
    }
}

/// What one sync did, for metrics.
#[derive(Clone, Copy, Debug, Default)]
pub struct SyncStats {
    pub fsyncs: u64,
    pub fsync_seconds: f64,
}

impl SyncStats {
    fn timed<T>(&mut self, f: impl FnOnce() -> std::io::Result<T>) -> std::io::Result<T> {
        let t = std::time::Instant::now();
        let r = f();
        self.fsyncs += 1;
        self.fsync_seconds += t.elapsed().as_secs_f64();
        r
    }
}

/// A timeline's WAL: segment files plus `wal.end`. Not thread-safe; the timeline's lock
/// serialises access.
pub struct WalStore {
    dir: PathBuf,
    segment_size: u64,
    /// The durable extent (what `wal.end` says).
    durable: WalExtent,
    /// The end including appends written but not yet synced.
    written_end: Lsn,
    end_file: File,
    /// Open segments; those with unsynced writes are in `dirty`.
    open: BTreeMap<u64, File>,
    dirty: Vec<u64>,
}

impl WalStore {
    /// Creates an empty, never-begun WAL in `dir` (which must exist).
    pub fn create(dir: &Path) -> anyhow::Result<()> {
        let path = dir.join(WAL_END_FILE_NAME);
        let f = File::create(&path).with_context(|| format!("create {}", path.display()))?;
        f.write_all_at(&WalExtent { begin: Lsn(0), end: Lsn(0) }.encode(), 0)
            .and_then(|_| f.sync_all())
            .with_context(|| format!("write {}", path.display()))?;
        Ok(())
    }

    /// Opens the WAL in `dir`: reads `wal.end`, checks that every segment of the extent exists
    /// with the full size, and removes segments outside it (left by an interrupted truncation).
    pub fn open(dir: &Path, segment_size: u64) -> anyhow::Result<WalStore> {
        let path = dir.join(WAL_END_FILE_NAME);
        let end_file = OpenOptions::new().read(true).write(true).open(&path).with_context(|| format!("open {}", path.display()))?;
        let mut buf = [0u8; WAL_END_RECORD_BYTES + 1];
        let n = end_file.read_at(&mut buf, 0).with_context(|| format!("read {}", path.display()))?;
        let durable = WalExtent::decode(&buf[..n]).with_context(|| format!("read {}", path.display()))?;
        let store = WalStore {
            dir: dir.to_path_buf(),
            segment_size,
            durable,
            written_end: durable.end,
            end_file,
            open: BTreeMap::new(),
            dirty: Vec::new(),
        };
        if let Some((first, last)) = store.segment_range(durable) {
            for segno in first..=last {
                let p = store.segment_path(segno);
                let meta = std::fs::metadata(&p)
                    .with_context(|| format!("WAL segment {} for the WAL in {}..{} is missing", p.display(), durable.begin, durable.end))?;
                if meta.len() != segment_size {
                    bail!("WAL segment {} is {} bytes, expected {segment_size}", p.display(), meta.len());
                }
            }
        }
        store.remove_segments_outside(durable)?;
        Ok(store)
    }

    pub fn segment_size(&self) -> u64 {
        self.segment_size
    }

    /// The durable extent.
    pub fn extent(&self) -> WalExtent {
        self.durable
    }

    /// Bytes of segment files the durable extent occupies.
    pub fn disk_bytes(&self) -> u64 {
        self.segment_range(self.durable).map_or(0, |(first, last)| (last - first + 1) * self.segment_size)
    }

    /// Removes the segments wholly below `horizon` (see [`super::removal`]), oldest first:
    /// `wal.end` says the WAL begins at the first segment kept (created if the WAL ends
    /// exactly where it starts), then the files go and the directory is fsynced. Returns the
    /// segment numbers removed, `None` if there were none. Unsynced appends must have been
    /// synced first; the caller passes a horizon it has made durable, never above the end.
    pub fn remove_below(&mut self, horizon: Lsn, stats: &mut SyncStats) -> anyhow::Result<Option<std::ops::Range<u64>>> {
        if self.has_unsynced() {
            bail!("WAL removal with unsynced appends");
        }
        let Some(segments) = super::removal::removable_segments(self.durable, horizon, self.segment_size) else {
            return Ok(None);
        };
        let new = WalExtent { begin: Lsn(segments.end * self.segment_size), end: self.durable.end };
        assert!(new.begin > self.durable.begin && new.begin <= new.end, "removal to {new:?} from {:?}", self.durable);
        // The segment holding the new beginning must exist before wal.end names it.
        self.segment(segments.end, stats)?;
        self.write_extent(new, stats)?;
        for segno in segments.clone() {
            self.open.remove(&segno);
            let path = self.segment_path(segno);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                // Gone already (a clean-up at startup after a crash here).
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).with_context(|| format!("remove WAL segment {}", path.display())),
            }
        }
        let t = std::time::Instant::now();
        fsync_dir(&self.dir)?;
        stats.fsyncs += 1;
        stats.fsync_seconds += t.elapsed().as_secs_f64();
        Ok(Some(segments))
    }

    /// The segments `[first, last]` an extent needs, `None` for a never-begun WAL.
    fn segment_range(&self, e: WalExtent) -> Option<(u64, u64)> {
        if e.begin == Lsn(0) && e.end == Lsn(0) {
            return None;
        }
        let last_byte = if e.end > e.begin { e.end.0 - 1 } else { e.begin.0 };
        Some((e.begin.0 / self.segment_size, last_byte / self.segment_size))
    }

    pub fn segment_path(&self, segno: u64) -> PathBuf {
        self.dir.join(segment_file_name(segno, self.segment_size))
    }

    fn remove_segments_outside(&self, e: WalExtent) -> anyhow::Result<()> {
        let range = self.segment_range(e);
        let mut removed = false;
        for entry in std::fs::read_dir(&self.dir).with_context(|| format!("list {}", self.dir.display()))? {
            let entry = entry.with_context(|| format!("list {}", self.dir.display()))?;
            let name = entry.file_name();
            // A segment (or the control file) a crash caught while it was being created:
            // never renamed into place, so nothing refers to it.
            if name.to_str().is_some_and(crashsafe::is_temp_name) {
                std::fs::remove_file(entry.path()).with_context(|| format!("remove {}", entry.path().display()))?;
                tracing::info!("removed {}, left by a crash", entry.path().display());
                removed = true;
                continue;
            }
            let Some(segno) = name.to_str().and_then(|n| parse_segment_file_name(n, self.segment_size)) else {
                continue;
            };
            if range.is_none_or(|(first, last)| segno < first || segno > last) {
                std::fs::remove_file(entry.path()).with_context(|| format!("remove {}", entry.path().display()))?;
                removed = true;
            }
        }
        if removed {
            fsync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// Opens segment `segno`, creating it zero-filled (atomically) if it does not exist.
    fn segment(&mut self, segno: u64, stats: &mut SyncStats) -> anyhow::Result<&File> {
        if !self.open.contains_key(&segno) {
            let path = self.segment_path(segno);
            if !path.exists() {
                self.create_segment(segno, stats)?;
            }
            let f =
                OpenOptions::new().read(true).write(true).open(&path).with_context(|| format!("open WAL segment {}", path.display()))?;
            self.open.insert(segno, f);
        }
        Ok(&self.open[&segno])
    }

    fn create_segment(&self, segno: u64, stats: &mut SyncStats) -> anyhow::Result<()> {
        let path = self.segment_path(segno);
        let tmp = crashsafe::temp_path(&path);
        let f = File::create(&tmp).with_context(|| format!("create {}", tmp.display()))?;
        let zeros = vec![0u8; CHUNK_BYTES];
        let mut off = 0;
        while off < self.segment_size {
            let n = (self.segment_size - off).min(CHUNK_BYTES as u64) as usize;
            f.write_all_at(&zeros[..n], off).with_context(|| format!("zero-fill {}", tmp.display()))?;
            off += n as u64;
        }
        stats.timed(|| f.sync_all()).with_context(|| format!("fsync {}", tmp.display()))?;
        drop(f);
        crashsafe::durable_rename(&tmp, &path).with_context(|| format!("rename {} to {}", tmp.display(), path.display()))?;
        stats.fsyncs += 1;
        Ok(())
    }

    /// Writes `data` at `begin`, which must be the current (written) end; not durable until
    /// [`WalStore::sync`].
    pub fn append(&mut self, begin: Lsn, data: &[u8], stats: &mut SyncStats) -> anyhow::Result<()> {
        if begin != self.written_end {
            bail!("append at {begin} but the WAL ends at {}", self.written_end);
        }
        let mut lsn = begin.0;
        let mut rest = data;
        while !rest.is_empty() {
            let segno = lsn / self.segment_size;
            let off = lsn % self.segment_size;
            let n = rest.len().min((self.segment_size - off) as usize);
            let f = self.segment(segno, stats)?;
            f.write_all_at(&rest[..n], off)
                .with_context(|| format!("write WAL segment {}", segment_file_name(segno, self.segment_size)))?;
            if !self.dirty.contains(&segno) {
                self.dirty.push(segno);
            }
            lsn += n as u64;
            rest = &rest[n..];
        }
        self.written_end = Lsn(lsn);
        Ok(())
    }

    /// The end including appends not yet synced.
    pub fn written_end(&self) -> Lsn {
        self.written_end
    }

    /// Whether appends are waiting for [`WalStore::sync`].
    pub fn has_unsynced(&self) -> bool {
        self.written_end != self.durable.end
    }

    /// Makes every append so far durable: fdatasync of the touched segments, then `wal.end`.
    pub fn sync(&mut self, stats: &mut SyncStats) -> anyhow::Result<()> {
        if !self.has_unsynced() {
            return Ok(());
        }
        for segno in std::mem::take(&mut self.dirty) {
            let f = &self.open[&segno];
            stats
                .timed(|| f.sync_data())
                .with_context(|| format!("fdatasync WAL segment {}", segment_file_name(segno, self.segment_size)))?;
        }
        let extent = WalExtent { begin: self.durable.begin, end: self.written_end };
        self.write_extent(extent, stats)
    }

    fn write_extent(&mut self, e: WalExtent, stats: &mut SyncStats) -> anyhow::Result<()> {
        let f = &self.end_file;
        f.write_all_at(&e.encode(), 0).with_context(|| format!("write {WAL_END_FILE_NAME}"))?;
        stats.timed(|| f.sync_data()).with_context(|| format!("fdatasync {WAL_END_FILE_NAME}"))?;
        self.durable = e;
        self.written_end = e.end;
        Ok(())
    }

    /// Makes the WAL end at `at`, durably. Inside the WAL (`begin <= at <= end`) the bytes
    /// after `at` are dropped; otherwise the WAL is emptied and begins at `at`. Unsynced
    /// appends must have been synced first.
    pub fn truncate(&mut self, at: Lsn, stats: &mut SyncStats) -> anyhow::Result<()> {
        if self.has_unsynced() {
            bail!("truncate with unsynced appends");
        }
        let old = self.durable;
        let inside = old.begin <= at && at <= old.end && !(old.begin == Lsn(0) && old.end == Lsn(0));
        let new = if inside { WalExtent { begin: old.begin, end: at } } else { WalExtent { begin: at, end: at } };
        if new == old {
            return Ok(());
        }
        if at != Lsn(0) {
            // The segment holding the new end must exist before wal.end names it.
            self.segment(at.0 / self.segment_size, stats)?;
        }
        self.write_extent(new, stats)?;
        // Clean-up beyond the durable end; a crash here leaves bytes nothing reads.
        self.open.retain(|_, _| false);
        self.dirty.clear();
        if at != Lsn(0) {
            let segno = at.0 / self.segment_size;
            let off = at.0 % self.segment_size;
            let seg_size = self.segment_size;
            let f = self.segment(segno, stats)?;
            let zeros = vec![0u8; CHUNK_BYTES];
            let mut pos = off;
            while pos < seg_size {
                let n = (seg_size - pos).min(CHUNK_BYTES as u64) as usize;
                f.write_all_at(&zeros[..n], pos).context("zero the WAL after the truncation point")?;
                pos += n as u64;
            }
            let f = &self.open[&segno];
            stats.timed(|| f.sync_data()).context("fdatasync the truncated WAL segment")?;
        }
        self.remove_segments_outside(new)
    }

    /// Reads the durable-or-written WAL in `[from, to)`, which must lie inside
    /// `[begin, written end]`.
    pub fn read(&mut self, from: Lsn, to: Lsn) -> anyhow::Result<Bytes> {
        if from > to {
            bail!("cannot read WAL {from}..{to}: the range is backwards");
        }
        if from < self.durable.begin || to > self.written_end {
            bail!("cannot read WAL {from}..{to}: this safekeeper has WAL {}..{}", self.durable.begin, self.written_end);
        }
        let mut out = BytesMut::zeroed((to.0 - from.0) as usize);
        let mut lsn = from.0;
        let mut done = 0usize;
        let mut ignored = SyncStats::default();
        while lsn < to.0 {
            let segno = lsn / self.segment_size;
            let off = lsn % self.segment_size;
            let n = ((to.0 - lsn) as usize).min((self.segment_size - off) as usize);
            let name = segment_file_name(segno, self.segment_size);
            if !self.segment_path(segno).exists() {
                bail!("WAL segment {name} holding {} is missing", Lsn(lsn));
            }
            let f = self.segment(segno, &mut ignored)?;
            f.read_exact_at(&mut out[done..done + n], off).with_context(|| format!("read WAL segment {name} at {}", Lsn(lsn)))?;
            lsn += n as u64;
            done += n;
        }
        Ok(out.freeze())
    }
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn extent_record_checks_its_crc() {
        let e = WalExtent { begin: Lsn(100), end: Lsn(200) };
        let mut b = e.encode();
        assert_eq!(WalExtent::decode(&b).unwrap(), e);
        b[3] ^= 1;
        assert!(WalExtent::decode(&b).is_err());
    }
}
