//! The WAL the proposer can send: the compute's own WAL in its `pg_wal` segment files (from
//! `wal_start` on), and below that the WAL fetched from the donor safekeeper, kept in memory.
//!
//! Invariants: fetched chunks are contiguous and end at the start of the own WAL (the
//! elected start LSN); the core never asks for bytes below what it fetched or at or beyond
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
    #[error("WAL at {lsn} is not available here (fetched WAL begins at {floor}, own WAL at {wal_start}, flushed up to {flushed})")]
    NotHere { lsn: Lsn, floor: Lsn, wal_start: Lsn, flushed: Lsn },
}

pub struct WalStore {
    dir: Option<PathBuf>,
    segment_size: u64,
    /// Where the own WAL (in `dir`) begins: fetched WAL ends here.
    own_start: Lsn,
    /// PostgreSQL flushed its WAL up to here.
    flushed: Lsn,
    /// Fetched WAL, keyed by start LSN; contiguous, ending at `own_start`.
    fetched: BTreeMap<Lsn, Bytes>,
    /// The segment file read last (reads are mostly sequential).
    open: Option<(u64, File)>,
}

impl WalStore {
    pub fn new(dir: Option<PathBuf>, segment_size: u64, own_start: Lsn) -> WalStore {
        WalStore { dir, segment_size, own_start, flushed: own_start, fetched: BTreeMap::new(), open: None }
    }

    /// The own WAL begins at `start` (the elected start LSN). Fetched WAL, if any, ends here.
    pub fn segment_size(&self) -> u64 {
        self.segment_size
    }

    pub fn set_own_start(&mut self, start: Lsn) {
        self.own_start = start;
        self.flushed = self.flushed.max(start);
        self.fetched.clear();
    }

    pub fn set_flushed(&mut self, lsn: Lsn) {
        self.flushed = self.flushed.max(lsn);
    }

    /// Where fetched WAL begins (`own_start` if none was fetched).
    pub fn floor(&self) -> Lsn {
        self.fetched.keys().next().copied().unwrap_or(self.own_start)
    }

    /// Keeps fetched bytes that end where the fetched WAL (or the own WAL) begins.
    pub fn store(&mut self, from: Lsn, data: Bytes) {
        if data.is_empty() {
            return;
        }
        debug_assert_eq!(from.0 + data.len() as u64, self.floor().0, "fetched WAL must be contiguous");
        self.fetched.insert(from, data);
    }

    /// Bytes fetched into memory.
    pub fn fetched_bytes(&self) -> u64 {
        self.fetched.values().map(|b| b.len() as u64).sum()
    }

    /// The WAL in `[begin, end)`.
    pub fn read(&mut self, begin: Lsn, end: Lsn) -> Result<Bytes, WalReadError> {
        let floor = self.floor();
        let not_here = |lsn| WalReadError::NotHere { lsn, floor, wal_start: self.own_start, flushed: self.flushed };
        if begin >= end {
            return Ok(Bytes::new());
        }
        if begin < floor {
            return Err(not_here(begin));
        }
        let own_end = if self.dir.is_some() { self.flushed } else { self.own_start };
        if end > own_end {
            return Err(not_here(end));
        }
        if end <= self.own_start {
            return Ok(self.read_fetched(begin, end));
        }
        if begin >= self.own_start {
            return self.read_files(begin, end);
        }
        let mut out = BytesMut::with_capacity((end.0 - begin.0) as usize);
        out.extend_from_slice(&self.read_fetched(begin, self.own_start));
        out.extend_from_slice(&self.read_files(self.own_start, end)?);
        Ok(out.freeze())
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
        let dir =
            self.dir.as_ref().ok_or(WalReadError::NotHere { lsn, floor: Lsn(0), wal_start: self.own_start, flushed: self.flushed })?;
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
        // Fetched WAL below the start, in two chunks.
        s.store(Lsn(start.0 - 50), Bytes::from((start.0 - 50..start.0).map(pattern).collect::<Vec<_>>()));
        s.store(Lsn(start.0 - 80), Bytes::from((start.0 - 80..start.0 - 50).map(pattern).collect::<Vec<_>>()));
        assert_eq!(s.floor(), Lsn(start.0 - 80));
        let got = s.read(Lsn(start.0 - 70), Lsn(start.0 + 30)).unwrap();
        assert_eq!(&got[..], &(start.0 - 70..start.0 + 30).map(pattern).collect::<Vec<_>>()[..]);
        assert!(matches!(s.read(Lsn(start.0 - 81), start), Err(WalReadError::NotHere { .. })));
        // A recycled segment.
        std::fs::remove_file(dir.join(segment_file_name(1, 3, seg))).unwrap();
        let mut s = WalStore::new(Some(dir.clone()), seg, start);
        s.set_flushed(Lsn(3 * seg + 500));
        assert!(matches!(s.read(Lsn(3 * seg), Lsn(3 * seg + 1)), Err(WalReadError::SegmentGone { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
