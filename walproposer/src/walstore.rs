//! The WAL the proposer can send: the compute's own WAL in its `pg_wal` segment files (from
//! `wal_start` on, as long as PostgreSQL keeps them), and WAL fetched from safekeepers, kept
//! in memory: below the elected start LSN (the donor's log) or, for a safekeeper that lags
//! behind the oldest segment `pg_wal` still has, the compute's own WAL fetched back.
//!
//! Invariants: fetched chunks are contiguous (one range, which the core moves forward and
//! releases behind: `quorum`'s `fetched.rs`), and whole chunks are freed once the core
//! releases everything in them, so memory stays within the core's `max_fetched` plus one
//! chunk; the core never asks for bytes it did not fetch below the own WAL, nor at or beyond
//! what PostgreSQL reported flushed, and this module checks both rather than trusting it.

use bytes::{Bytes, BytesMut};
use pgwal::segment::segment_file_name;
use proto::Lsn;
use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

/// PostgreSQL's timeline the compute writes on: a fjord compute always starts on timeline 1.
const PG_TIMELINE: u32 = 1;

/// Why a read failed. `SegmentGone` leaves the one safekeeper that needs it behind; the
/// others are fatal for this proposer.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WalReadError {
    #[error("WAL segment {path} needed for {lsn} is gone: {error}")]
    SegmentGone { path: String, lsn: Lsn, error: String },
    #[error("could not read WAL segment {path} at {lsn}: {error}")]
    Io { path: String, lsn: Lsn, error: String },
    #[error(
        "WAL at {lsn} is not available here (fetched WAL from {floor} to {fetched_end}, own WAL from {wal_start}, flushed up to {flushed})"
    )]
    NotHere { lsn: Lsn, floor: Lsn, fetched_end: Lsn, wal_start: Lsn, flushed: Lsn },
}

pub struct WalStore {
    dir: Option<PathBuf>,
    segment_size: u64,
    /// Where the own WAL (in `dir`) begins: fetched WAL ends here.
    own_start: Lsn,
    /// PostgreSQL flushed its WAL up to here.
    flushed: Lsn,
    /// Fetched WAL, keyed by start LSN; contiguous.
    fetched: BTreeMap<Lsn, Bytes>,
    fetched_bytes: u64,
    /// The segment file read last (reads are mostly sequential).
    open: Option<(u64, File)>,
    /// The bytes read from the files last, from this LSN: the core's decoder reads new WAL
    /// first, then the same bytes go to every safekeeper in pieces, which are slices of it
    /// (one read and no copy where there were four reads of each byte). Flushed WAL below
    /// `flushed` never changes.
    recent: (Lsn, Bytes),
}

impl WalStore {
    pub fn new(dir: Option<PathBuf>, segment_size: u64, own_start: Lsn) -> WalStore {
        WalStore {
            dir,
            segment_size,
            own_start,
            flushed: own_start,
            fetched: BTreeMap::new(),
            fetched_bytes: 0,
            open: None,
            recent: (Lsn(0), Bytes::new()),
        }
    }

    /// The own WAL begins at `start` (the elected start LSN). Fetched WAL, if any, ends here.
    pub fn segment_size(&self) -> u64 {
        self.segment_size
    }

    pub fn set_own_start(&mut self, start: Lsn) {
        self.own_start = start;
        self.flushed = self.flushed.max(start);
        self.recent = (Lsn(0), Bytes::new());
        self.fetched.clear();
        self.fetched_bytes = 0;
    }

    pub fn set_flushed(&mut self, lsn: Lsn) {
        self.flushed = self.flushed.max(lsn);
    }

    /// Where fetched WAL begins (`own_start` if none is kept).
    pub fn floor(&self) -> Lsn {
        self.fetched.keys().next().copied().unwrap_or(self.own_start)
    }

    /// Where fetched WAL ends (`own_start` if none is kept).
    pub fn fetched_end(&self) -> Lsn {
        self.fetched.iter().next_back().map_or(self.own_start, |(at, data)| Lsn(at.0 + data.len() as u64))
    }

    /// Keeps fetched bytes that continue the fetched WAL kept (or begin it, if none is).
    pub fn store(&mut self, from: Lsn, data: Bytes) {
        if data.is_empty() {
            return;
        }
        debug_assert!(self.fetched.is_empty() || from == self.fetched_end(), "fetched WAL must be contiguous");
        self.fetched_bytes += data.len() as u64;
        self.fetched.insert(from, data);
    }

    /// Frees the fetched chunks that lie wholly below `below` (the core never asks for that
    /// WAL again). A chunk partly below stays whole: freeing part of it would cost a copy
    /// on every acknowledgement, and a chunk is one fetch (1 MiB).
    pub fn release_below(&mut self, below: Lsn) {
        while let Some(entry) = self.fetched.first_entry() {
            if entry.key().0 + entry.get().len() as u64 > below.0 {
                break;
            }
            self.fetched_bytes -= entry.remove().len() as u64;
        }
    }

    /// Bytes fetched into memory.
    pub fn fetched_bytes(&self) -> u64 {
        self.fetched_bytes
    }

    /// The oldest LSN from which the own WAL can still be read, once a read at `gone` found
    /// its segment removed: the start of the segment after the highest one missing between
    /// `gone`'s and the last flushed one (PostgreSQL removes the oldest segments first), at
    /// least the own start.
    pub fn own_wal_floor(&self, gone: Lsn) -> Lsn {
        let Some(dir) = &self.dir else { return self.flushed };
        let first = gone.0 / self.segment_size;
        let last = self.flushed.0.saturating_sub(1) / self.segment_size;
        let missing = (first..=last.max(first))
            .rev()
            .find(|&segno| !dir.join(segment_file_name(PG_TIMELINE, segno, self.segment_size)).exists())
            .unwrap_or(first);
        Lsn((missing + 1) * self.segment_size).max(self.own_start)
    }

    /// The WAL in `[begin, end)`: from fetched WAL where that holds `begin` (and on from the
    /// own WAL if `end` lies beyond it), else from the own WAL.
    pub fn read(&mut self, begin: Lsn, end: Lsn) -> Result<Bytes, WalReadError> {
        let (floor, fetched_end) = (self.floor(), self.fetched_end());
        let not_here = |lsn| WalReadError::NotHere { lsn, floor, fetched_end, wal_start: self.own_start, flushed: self.flushed };
        if begin >= end {
            return Ok(Bytes::new());
        }
        let own_end = if self.dir.is_some() { self.flushed } else { self.own_start };
        if end > own_end.max(fetched_end) {
            return Err(not_here(end));
        }
        let in_fetched = !self.fetched.is_empty() && begin >= floor && begin < fetched_end;
        if in_fetched && end <= fetched_end {
            return Ok(self.read_fetched(begin, end));
        }
        if in_fetched {
            if fetched_end < self.own_start || end > own_end {
                return Err(not_here(fetched_end));
            }
            let mut out = BytesMut::with_capacity((end.0 - begin.0) as usize);
            out.extend_from_slice(&self.read_fetched(begin, fetched_end));
            out.extend_from_slice(&self.read_files(fetched_end, end)?);
            return Ok(out.freeze());
        }
        if begin < self.own_start || end > own_end {
            return Err(not_here(begin));
        }
        self.read_files(begin, end)
    }

    fn read_fetched(&self, begin: Lsn, end: Lsn) -> Bytes {
        // The chunk holding `begin`, then its successors.
        let first = self.fetched.range(..=begin).next_back().map(|(k, _)| *k).unwrap_or(begin);
        let mut parts = self.fetched.range(first..end).map(|(&at, data)| {
            let skip = begin.0.saturating_sub(at.0) as usize;
            let take = ((end.0 - at.0) as usize).min(data.len());
            data.slice(skip.min(take)..take)
        });
        let one = parts.next().unwrap_or_default();
        match parts.next() {
            None => one,
            Some(two) => {
                let mut out = BytesMut::with_capacity((end.0 - begin.0) as usize);
                out.extend_from_slice(&one);
                out.extend_from_slice(&two);
                for p in parts {
                    out.extend_from_slice(&p);
                }
                out.freeze()
            }
        }
    }

    fn read_files(&mut self, begin: Lsn, end: Lsn) -> Result<Bytes, WalReadError> {
        let (at, bytes) = &self.recent;
        if begin >= *at && end.0 <= at.0 + bytes.len() as u64 {
            return Ok(bytes.slice((begin.0 - at.0) as usize..(end.0 - at.0) as usize));
        }
        let out = self.read_files_uncached(begin, end)?;
        self.recent = (begin, out.clone());
        Ok(out)
    }

    fn read_files_uncached(&mut self, begin: Lsn, end: Lsn) -> Result<Bytes, WalReadError> {
        let mut out = vec![0u8; (end.0 - begin.0) as usize];
        let mut at = begin.0;
        while at < end.0 {
            let segno = at / self.segment_size;
            let offset = at % self.segment_size;
            let n = ((self.segment_size - offset) as usize).min((end.0 - at) as usize);
            let dst_from = (at - begin.0) as usize;
            let (path, file) = self.segment(segno, Lsn(at))?;
            file.read_exact_at(&mut out[dst_from..dst_from + n], offset).map_err(|e| WalReadError::Io {
                path,
                lsn: Lsn(at),
                error: e.to_string(),
            })?;
            at += n as u64;
        }
        Ok(Bytes::from(out))
    }

    fn segment(&mut self, segno: u64, lsn: Lsn) -> Result<(String, &File), WalReadError> {
        let dir = self.dir.as_ref().ok_or(WalReadError::NotHere {
            lsn,
            floor: Lsn(0),
            fetched_end: Lsn(0),
            wal_start: self.own_start,
            flushed: self.flushed,
        })?;
        let path = dir.join(segment_file_name(PG_TIMELINE, segno, self.segment_size));
        let shown = path.display().to_string();
        if self.open.as_ref().is_none_or(|(s, _)| *s != segno) {
            let file = File::open(&path).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => WalReadError::SegmentGone { path: shown.clone(), lsn, error: e.to_string() },
                _ => WalReadError::Io { path: shown.clone(), lsn, error: e.to_string() },
            })?;
            self.open = Some((segno, file));
        }
        Ok((shown, &self.open.as_ref().expect("just opened").1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_names_follow_postgres() {
        assert_eq!(segment_file_name(1, 0x1_02, 1 << 20), "000000010000000000000102");
        assert_eq!(segment_file_name(1, 0x1_000, 1 << 20), "000000010000000100000000");
    }

    fn pattern(lsn: u64) -> u8 {
        (lsn.wrapping_mul(31) % 251) as u8
    }

    #[test]
    fn reads_cross_segments_and_fetched_memory() {
        let dir = std::env::temp_dir().join(format!("walstore-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let seg = 1u64 << 20;
        for segno in 2..4u64 {
            let data: Vec<u8> = (segno * seg..(segno + 1) * seg).map(pattern).collect();
            std::fs::write(dir.join(segment_file_name(1, segno, seg)), data).unwrap();
        }
        let start = Lsn(2 * seg + 100);
        let mut s = WalStore::new(Some(dir.clone()), seg, start);
        s.set_flushed(Lsn(3 * seg + 500));
        let got = s.read(Lsn(3 * seg - 10), Lsn(3 * seg + 20)).unwrap();
        assert_eq!(&got[..], &(3 * seg - 10..3 * seg + 20).map(pattern).collect::<Vec<_>>()[..]);
        // Never beyond what was flushed.
        assert!(matches!(s.read(Lsn(3 * seg), Lsn(3 * seg + 501)), Err(WalReadError::NotHere { .. })));
        // Fetched WAL below the start, in two chunks, fetched forwards.
        s.store(Lsn(start.0 - 80), Bytes::from((start.0 - 80..start.0 - 50).map(pattern).collect::<Vec<_>>()));
        s.store(Lsn(start.0 - 50), Bytes::from((start.0 - 50..start.0).map(pattern).collect::<Vec<_>>()));
        assert_eq!((s.floor(), s.fetched_end(), s.fetched_bytes()), (Lsn(start.0 - 80), start, 80));
        let got = s.read(Lsn(start.0 - 70), Lsn(start.0 + 30)).unwrap();
        assert_eq!(&got[..], &(start.0 - 70..start.0 + 30).map(pattern).collect::<Vec<_>>()[..]);
        assert!(matches!(s.read(Lsn(start.0 - 81), start), Err(WalReadError::NotHere { .. })));
        // Released: only whole chunks are freed.
        s.release_below(Lsn(start.0 - 60));
        assert_eq!((s.floor(), s.fetched_bytes()), (Lsn(start.0 - 80), 80));
        s.release_below(Lsn(start.0 - 50));
        assert_eq!((s.floor(), s.fetched_bytes()), (Lsn(start.0 - 50), 50));
        s.release_below(start);
        assert_eq!(s.fetched_bytes(), 0);
        // The own WAL fetched back (above the start, for a safekeeper behind what pg_wal
        // keeps), ending below the own WAL still there: read from memory alone.
        let back = Lsn(2 * seg + 1000);
        s.store(back, Bytes::from((back.0..back.0 + 100).map(pattern).collect::<Vec<_>>()));
        let got = s.read(Lsn(back.0 + 10), Lsn(back.0 + 100)).unwrap();
        assert_eq!(&got[..], &(back.0 + 10..back.0 + 100).map(pattern).collect::<Vec<_>>()[..]);
        // A recycled segment.
        std::fs::remove_file(dir.join(segment_file_name(1, 3, seg))).unwrap();
        let mut s = WalStore::new(Some(dir.clone()), seg, start);
        s.set_flushed(Lsn(3 * seg + 500));
        assert!(matches!(s.read(Lsn(3 * seg), Lsn(3 * seg + 1)), Err(WalReadError::SegmentGone { .. })));
        // What pg_wal still has from there on: after the highest missing segment.
        for segno in 4..7u64 {
            std::fs::write(dir.join(segment_file_name(1, segno, seg)), vec![0u8; seg as usize]).unwrap();
        }
        s.set_flushed(Lsn(6 * seg + 10));
        assert_eq!(s.own_wal_floor(Lsn(3 * seg)), Lsn(4 * seg));
        std::fs::remove_file(dir.join(segment_file_name(1, 4, seg))).unwrap();
        assert_eq!(s.own_wal_floor(Lsn(3 * seg)), Lsn(5 * seg));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
