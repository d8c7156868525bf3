//! A timeline's WAL on disk: PostgreSQL-named segment files and `wal.end`.
//!
//! # Segments
//! WAL bytes live at their natural offsets in segment files named as PostgreSQL names them
//! on timeline 1 (`000000010000000000000003`). A segment is created zero-filled to its full
//! size (temporary file, fsync, rename, fsync of the directory), so creating one is atomic
//! and its size never changes afterwards; appends overwrite zeros in place. The zeros are
//! allocated (`fallocate`), not written, where the file system can ([`allocate`]).
//!
//! # `wal.end`
//! Two parts. The **header** (the first 40 bytes, rewritten in place with one `pwrite` inside
//! the first sector and `fdatasync`ed) holds the *settled* extent of the WAL, `[begin, end)`,
//! whose bytes are durable in the segments, its *boundary LSN* (the end of the last whole
//! WAL record in it, `quorum`'s "Record boundaries"), and a generation number. Sector
//! writes are atomic on the devices we run on; if one ever tears, the checksum fails and the
//! timeline is reported corrupt rather than trusted. The **journal** after it (from offset
//! [`JOURNAL_OFFSET`], [`JOURNAL_BYTES`] zero-filled at creation, so appends to it never
//! change the file's size) holds the batches appended since the header was written: each
//! record is the generation, the LSN the bytes go to, their length, the boundary LSN after
//! them, the bytes (possibly none: a batch that only moved the boundary), and a crc32c of
//! all of it. The boundary LSN is durable with the bytes, in the same record: the acceptor
//! acknowledges both, and commits count the boundary.
//!
//! Why a separate file rather than finding the end by decoding: appends are cut anywhere,
//! inside records too (a record may be longer than a message), so the bytes alone cannot
//! tell where the acknowledged WAL ends nor where its last whole record does; and zero
//! bytes are valid WAL content. Keeping the beginning in the header lets a truncation that
//! moves both (an acceptor whose log shares nothing with the elected history) switch them
//! in one atomic write.
//!
//! Format 3 (a 32-byte header without the boundary, journal records without it) is still
//! read, its boundary taken to be its end (format 3 safekeepers sent whole records only, but
//! for a record longer than a message), and rewritten as format 4 at open; a format 3
//! safekeeper cannot read format 4 (its magic differs: "no header").
//!
//! # fsync discipline
//! One batch of appends: `pwrite` the bytes into their segments (not synced), append them as
//! one record to the journal with a direct, synchronous write (`O_DIRECT | O_DSYNC`,
//! [`super::journal_io`]; through the page cache and an `fdatasync` where the file system has
//! no direct I/O), and only then acknowledge: **one device flush per batch**, whatever its size, and the server drains every message already received
//! before it syncs (group commit). Not two (the segments', then `wal.end`'s): with three
//! safekeepers on one disk that is six device cache flushes per commit, which the device
//! serialises (`docs/decisions/0005-wal-end-journal.md`).
//!
//! **Settling** (about once a second from the periodic task, at shutdown, before a
//! truncation or a removal, and when the journal is full): `fdatasync` every segment
//! written since, then write the header with the new end and the next generation and
//! `fdatasync` it. The header names only bytes that were durable in the segments before it
//! was written, and the new generation makes every journal record before it void.
//!
//! **At open** the journal is replayed: records of the header's generation that continue the
//! WAL (their LSN is the end so far) and whose checksum holds are written into the segments,
//! stopping at the first that does not (a record a crash cut short was never acknowledged,
//! since its `fdatasync` had not returned, and no record follows it). Then the WAL is settled,
//! so a replay never happens twice. A batch too big for the journal, or of at least
//! [`SETTLE_BATCH_BYTES`] (a bulk load's), is synced the old way, by settling: its bytes are
//! written once instead of twice, for a second `fdatasync`.
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
//! - A batch is acknowledged only once it is durable in the journal or the segments.
//! - The header never names bytes that were not durable in the segments before it was
//!   written; journal records are only ever applied on top of the header's extent.
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
use super::extent::WalExtent;
use super::journal_io::JournalWriter;
use super::sync_stats::SyncStats;

pub const WAL_END_FILE_NAME: &str = "wal.end";
/// The PostgreSQL timeline segments are named for and pages are checked against: fjord's
/// computes never switch timelines (no promotion, no archive recovery).
pub const PG_TIMELINE: u32 = 1;
/// The header as older safekeepers wrote it (end, begin, crc32c, no journal). Still read;
/// rewritten as a header with a journal at open.
const WAL_END_V1_BYTES: usize = 20;
/// Format 3's header (32 bytes): end, begin, generation (8 bytes each, little endian),
/// [`HEADER_MAGIC_V3`], a crc32c of the 28 bytes before it. The first 16 bytes are laid out
/// as in the older one. Still read.
const HEADER_MAGIC_V3: u32 = 0x4a57_4533; // "3EWJ" little endian: journal format 3
/// The header: end, begin, generation, boundary LSN (8 bytes each, little endian),
/// [`HEADER_MAGIC`], a crc32c of the 36 bytes before it.
const HEADER_BYTES: usize = 40;
const HEADER_MAGIC: u32 = 0x4a57_4534; // "4EWJ" little endian: journal format 4
/// Where the journal starts: its own sector, away from the header's.
pub const JOURNAL_OFFSET: u64 = 4096;
/// The journal's size. Settled about once a second, it holds a second of appends (or
/// forces a settle when full); a batch bigger than it is synced by settling.
pub const JOURNAL_BYTES: u64 = 8 << 20;
// Direct writes of the journal go in whole blocks, which must not reach past it.
const _: () = assert!(
    JOURNAL_OFFSET.is_multiple_of(super::journal_io::BLOCK as u64) && JOURNAL_BYTES.is_multiple_of(super::journal_io::BLOCK as u64)
);
/// A batch of at least this many bytes is synced by settling (its segments' `fdatasync`,
/// then the header's) rather than copied into the journal: two syncs instead of one, but
/// the bytes are written once, not twice. Bulk loads send batches of hundreds of KiB to
/// MiBs, where the copy costs more CPU than the second sync; commits of OLTP send a few KiB.
pub const SETTLE_BATCH_BYTES: u64 = 256 << 10;
/// A journal record's header: generation, LSN, length, boundary LSN (8 bytes each), then the
/// bytes, then a crc32c of the header and the bytes. Format 3's had no boundary LSN.
const RECORD_HEADER_BYTES: usize = 32;
const RECORD_HEADER_V3_BYTES: usize = 24;
const RECORD_CRC_BYTES: usize = 4;
/// Zero-filling and copying go in chunks of this size.
const CHUNK_BYTES: usize = 1 << 20;

/// Gives the new, empty file `f` its `size` bytes, reading as zeros, without writing them
/// (`fallocate`): `false` where the file system cannot, and the caller writes the zeros.
///
/// Why not write them: a segment is 16 MiB, and the batch that needs a new one would wait
/// for 16 MiB of zeros to be copied into the page cache (and later written to the device) by
/// every safekeeper: as many bytes again as the WAL itself. The blocks are allocated either
/// way, so appends never change the file's size or allocate; on ext4 the first write of a
/// block marks its extent written, metadata that the segment's `fdatasync` (at settling, not
/// per batch) writes out.
fn allocate(f: &File, size: u64) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    let len = libc::off_t::try_from(size).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: `f` is an open file; fallocate reads nothing from memory.
    if unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len) } == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => Ok(false),
        _ => Err(e),
    }
}

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

/// How `wal.end` is laid out: the format its header says, which its journal records follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    /// The 20-byte record of the first safekeepers: no journal, no boundary.
    V1,
    /// A header and a journal, without boundaries.
    V3,
    /// A header and a journal, with boundaries.
    V4,
}

/// The header of `wal.end`: the settled extent, its boundary LSN, and the journal's
/// generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Header {
    extent: WalExtent,
    boundary: Lsn,
    generation: u64,
}

impl Header {
    fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0..8].copy_from_slice(&self.extent.end.0.to_le_bytes());
        b[8..16].copy_from_slice(&self.extent.begin.0.to_le_bytes());
        b[16..24].copy_from_slice(&self.generation.to_le_bytes());
        b[24..32].copy_from_slice(&self.boundary.0.to_le_bytes());
        b[32..36].copy_from_slice(&HEADER_MAGIC.to_le_bytes());
        let crc = crc32c::crc32c(&b[..36]);
        b[36..40].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes a header of format 4 or 3, or the older 20-byte record, and says which it was.
    /// An older one's boundary is its end (see the module's "`wal.end`").
    fn decode(b: &[u8]) -> anyhow::Result<(Header, Format)> {
        let magic_at = |at: usize| b.get(at..at + 4).map(|m| u32::from_le_bytes(m.try_into().expect("4 bytes")));
        let (crc_at, format) = if b.len() == WAL_END_V1_BYTES {
            (16, Format::V1)
        } else if magic_at(32) == Some(HEADER_MAGIC) {
            (36, Format::V4)
        } else if magic_at(24) == Some(HEADER_MAGIC_V3) {
            (28, Format::V3)
        } else if b.len() >= HEADER_BYTES {
            bail!("{WAL_END_FILE_NAME} has no header (bad magic)");
        } else {
            bail!("{WAL_END_FILE_NAME} is {} bytes, expected {WAL_END_V1_BYTES} or at least {HEADER_BYTES}", b.len());
        };
        let stored = u32::from_le_bytes(b[crc_at..crc_at + 4].try_into().expect("4 bytes"));
        let computed = crc32c::crc32c(&b[..crc_at]);
        if stored != computed {
            bail!("{WAL_END_FILE_NAME} has a bad checksum (stored {stored:#010x}, computed {computed:#010x})");
        }
        let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        let extent = WalExtent { end: Lsn(word(0)), begin: Lsn(word(8)) };
        if extent.end < extent.begin {
            bail!("{WAL_END_FILE_NAME} says the WAL ends at {} before it begins at {}", extent.end, extent.begin);
        }
        let generation = if format == Format::V1 { 0 } else { word(16) };
        let boundary = if format == Format::V4 { Lsn(word(24)) } else { extent.end };
        if boundary > extent.end || (boundary < extent.begin && extent.end > extent.begin) {
            bail!("{WAL_END_FILE_NAME} says the last whole record ends at {boundary}, outside the WAL {}..{}", extent.begin, extent.end);
        }
        Ok((Header { extent, boundary, generation }, format))
    }
}

/// Encodes a journal record: `data` goes to `lsn`, and the WAL's boundary LSN is then
/// `boundary`.
fn encode_record(generation: u64, lsn: Lsn, data: &[u8], boundary: Lsn) -> Vec<u8> {
    let mut b = Vec::with_capacity(RECORD_HEADER_BYTES + data.len() + RECORD_CRC_BYTES);
    b.extend_from_slice(&generation.to_le_bytes());
    b.extend_from_slice(&lsn.0.to_le_bytes());
    b.extend_from_slice(&(data.len() as u64).to_le_bytes());
    b.extend_from_slice(&boundary.0.to_le_bytes());
    b.extend_from_slice(data);
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// One journal record read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct JournalRecord<'a> {
    lsn: Lsn,
    data: &'a [u8],
    boundary: Lsn,
}

/// The valid records of `generation` at the start of `journal` (laid out as `format`, 3 or
/// 4) that continue the WAL from `end` with a boundary LSN that only moves forward within
/// the WAL, from `boundary`; stops at the first that does not. A format 3 record has no
/// boundary (its end is taken) and no empty one.
fn decode_records(journal: &[u8], format: Format, generation: u64, mut end: Lsn, mut boundary: Lsn) -> Vec<JournalRecord<'_>> {
    let header_bytes = if format == Format::V4 { RECORD_HEADER_BYTES } else { RECORD_HEADER_V3_BYTES };
    let mut out = Vec::new();
    let mut rest = journal;
    while rest.len() >= header_bytes + RECORD_CRC_BYTES {
        let word = |at: usize| u64::from_le_bytes(rest[at..at + 8].try_into().expect("8 bytes"));
        let (g, lsn, len) = (word(0), Lsn(word(8)), word(16));
        if g != generation
            || lsn != end
            || (len == 0 && format != Format::V4)
            || len > (rest.len() - header_bytes - RECORD_CRC_BYTES) as u64
        {
            break;
        }
        let new_end = Lsn(end.0 + len);
        let new_boundary = if format == Format::V4 { Lsn(word(24)) } else { new_end };
        if new_boundary < boundary || new_boundary > new_end {
            break;
        }
        let body = header_bytes + len as usize;
        let stored = u32::from_le_bytes(rest[body..body + 4].try_into().expect("4 bytes"));
        if crc32c::crc32c(&rest[..body]) != stored {
            break;
        }
        out.push(JournalRecord { lsn, data: &rest[header_bytes..body], boundary: new_boundary });
        end = new_end;
        boundary = new_boundary;
        rest = &rest[body + RECORD_CRC_BYTES..];
    }
    out
}

/// Zero-fills the journal area of `wal.end` (so that appending records never changes the
/// file's size, which would make each `fdatasync` a metadata commit too).
fn write_journal_area(f: &File) -> std::io::Result<()> {
    let zeros = vec![0u8; CHUNK_BYTES];
    let mut off = 0;
    while off < JOURNAL_BYTES {
        let n = (JOURNAL_BYTES - off).min(CHUNK_BYTES as u64) as usize;
        f.write_all_at(&zeros[..n], JOURNAL_OFFSET + off)?;
        off += n as u64;
    }
    Ok(())
}

/// A timeline's WAL: segment files plus `wal.end`. Not thread-safe; the timeline's lock
/// serialises access.
pub struct WalStore {
    dir: PathBuf,
    segment_size: u64,
    /// The durable extent: the header's, plus the batches in the journal.
    durable: WalExtent,
    /// The durable boundary LSN (the end of the last whole record), and the one including
    /// appends not yet synced.
    durable_boundary: Lsn,
    written_boundary: Lsn,
    /// The header's generation; journal records of another one are void.
    generation: u64,
    /// Where the next journal record goes (offset in `wal.end`).
    journal_at: u64,
    /// The bytes appended since the last sync, for its journal record.
    pending: Vec<u8>,
    /// The end including appends written but not yet synced.
    written_end: Lsn,
    end_file: File,
    /// Writes the journal's records durably (directly where it can, [`super::journal_io`]).
    journal: JournalWriter,
    /// Open segments; those with writes not yet fdatasynced (durable only in the journal, or
    /// not at all) are in `dirty`.
    open: BTreeMap<u64, File>,
    dirty: Vec<u64>,
}

impl WalStore {
    /// Creates an empty, never-begun WAL in `dir` (which must exist).
    pub fn create(dir: &Path) -> anyhow::Result<()> {
        let path = dir.join(WAL_END_FILE_NAME);
        let f = File::create(&path).with_context(|| format!("create {}", path.display()))?;
        let header = Header { extent: WalExtent { begin: Lsn(0), end: Lsn(0) }, boundary: Lsn(0), generation: 1 };
        write_journal_area(&f)
            .and_then(|_| f.write_all_at(&header.encode(), 0))
            .and_then(|_| f.sync_all())
            .with_context(|| format!("write {}", path.display()))?;
        Ok(())
    }

    /// Opens the WAL in `dir`: reads `wal.end`, checks that every segment of the extent exists
    /// with the full size, and removes segments outside it (left by an interrupted truncation).
    pub fn open(dir: &Path, segment_size: u64) -> anyhow::Result<WalStore> {
        let path = dir.join(WAL_END_FILE_NAME);
        let end_file = OpenOptions::new().read(true).write(true).open(&path).with_context(|| format!("open {}", path.display()))?;
        let contents = std::fs::read(&path).with_context(|| format!("read {}", path.display()))?;
        let (header, format) = Header::decode(&contents).with_context(|| format!("read {}", path.display()))?;
        let mut store = WalStore {
            dir: dir.to_path_buf(),
            segment_size,
            durable: header.extent,
            durable_boundary: header.boundary,
            written_boundary: header.boundary,
            generation: header.generation,
            journal_at: JOURNAL_OFFSET,
            pending: Vec::new(),
            written_end: header.extent.end,
            end_file,
            journal: JournalWriter::open(&path),
            open: BTreeMap::new(),
            dirty: Vec::new(),
        };
        // The settled extent's segments first: a timeline found corrupt is not written to.
        let settled = store.durable;
        if let Some((first, last)) = store.segment_range(settled) {
            for segno in first..=last {
                let p = store.segment_path(segno);
                let meta = std::fs::metadata(&p)
                    .with_context(|| format!("WAL segment {} for the WAL in {}..{} is missing", p.display(), settled.begin, settled.end))?;
                if meta.len() != segment_size {
                    bail!("WAL segment {} is {} bytes, expected {segment_size}", p.display(), meta.len());
                }
            }
        }
        let mut stats = SyncStats::default();
        let journal = contents.get(JOURNAL_OFFSET as usize..).unwrap_or_default();
        let records = if format == Format::V1 {
            Vec::new()
        } else {
            decode_records(journal, format, header.generation, header.extent.end, header.boundary)
        };
        if let (Some(first), Some(last)) = (records.first(), records.last()) {
            let end = Lsn(last.lsn.0 + last.data.len() as u64);
            tracing::info!(
                "replaying {} batches of WAL from {}'s journal: {}..{}, whole records up to {}",
                records.len(),
                path.display(),
                first.lsn,
                end,
                last.boundary
            );
            for r in &records {
                store.append(r.lsn, r.data, r.boundary, &mut stats)?;
            }
            store.pending.clear();
            store.durable.end = end;
            store.durable_boundary = last.boundary;
        }
        if format == Format::V1 {
            write_journal_area(&store.end_file).with_context(|| format!("write {}'s journal", path.display()))?;
        }
        // Settles what was replayed and starts a new generation, so that no record of this
        // one is ever read again (and an older format is rewritten as the current one).
        store.write_extent(store.durable, store.durable_boundary, &mut stats)?;
        let durable = store.durable;
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

    /// The durable boundary LSN: the end of the last whole WAL record (at most the end).
    pub fn boundary(&self) -> Lsn {
        self.durable_boundary
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
        self.write_extent(new, self.durable_boundary, stats)?;
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
        if !allocate(&f, self.segment_size).with_context(|| format!("allocate {}", tmp.display()))? {
            let zeros = vec![0u8; CHUNK_BYTES];
            let mut off = 0;
            while off < self.segment_size {
                let n = (self.segment_size - off).min(CHUNK_BYTES as u64) as usize;
                f.write_all_at(&zeros[..n], off).with_context(|| format!("zero-fill {}", tmp.display()))?;
                off += n as u64;
            }
        }
        stats.timed(|| f.sync_all()).with_context(|| format!("fsync {}", tmp.display()))?;
        drop(f);
        crashsafe::durable_rename(&tmp, &path).with_context(|| format!("rename {} to {}", tmp.display(), path.display()))?;
        stats.fsyncs += 1;
        Ok(())
    }

    /// Writes `data` (possibly none) at `begin`, which must be the current (written) end,
    /// after which the last whole record ends at `boundary`; not durable until
    /// [`WalStore::sync`].
    pub fn append(&mut self, begin: Lsn, data: &[u8], boundary: Lsn, stats: &mut SyncStats) -> anyhow::Result<()> {
        if begin != self.written_end {
            bail!("append at {begin} but the WAL ends at {}", self.written_end);
        }
        let end = Lsn(begin.0 + data.len() as u64);
        if boundary < self.written_boundary || boundary > end {
            bail!("append up to {end} with whole records up to {boundary}, but they already reached {}", self.written_boundary);
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
        self.pending.extend_from_slice(data);
        self.written_end = Lsn(lsn);
        self.written_boundary = boundary;
        Ok(())
    }

    /// The end including appends not yet synced.
    pub fn written_end(&self) -> Lsn {
        self.written_end
    }

    /// Whether appends (or a new boundary LSN) are waiting for [`WalStore::sync`].
    pub fn has_unsynced(&self) -> bool {
        self.written_end != self.durable.end || self.written_boundary != self.durable_boundary
    }

    /// Makes every append so far durable with one `fdatasync`: the bytes since the last sync
    /// go to the journal as one record. If they do not fit in what is left of it, the WAL is
    /// settled instead (two fsyncs; about once per [`JOURNAL_BYTES`] of WAL).
    pub fn sync(&mut self, stats: &mut SyncStats) -> anyhow::Result<()> {
        if !self.has_unsynced() {
            return Ok(());
        }
        let room = JOURNAL_OFFSET + JOURNAL_BYTES - self.journal_at;
        let need = (RECORD_HEADER_BYTES + self.pending.len() + RECORD_CRC_BYTES) as u64;
        if need > room || self.pending.len() as u64 >= SETTLE_BATCH_BYTES {
            return self.settle(stats);
        }
        debug_assert_eq!(self.pending.len() as u64, self.written_end.0 - self.durable.end.0);
        let record = encode_record(self.generation, self.durable.end, &self.pending, self.written_boundary);
        self.journal
            .write(&self.end_file, self.journal_at, &record, stats)
            .with_context(|| format!("write {WAL_END_FILE_NAME}'s journal durably"))?;
        self.journal_at += need;
        self.pending.clear();
        self.durable.end = self.written_end;
        self.durable_boundary = self.written_boundary;
        Ok(())
    }

    /// Settles the WAL: `fdatasync` of every segment written since the last settle, then the
    /// header with the end and the next generation (which voids the journal's records). The
    /// periodic task calls this about once a second, shutdown last, truncation and removal
    /// first; a full journal forces it.
    pub fn settle(&mut self, stats: &mut SyncStats) -> anyhow::Result<()> {
        if self.dirty.is_empty() && self.journal_at == JOURNAL_OFFSET && !self.has_unsynced() {
            return Ok(());
        }
        let extent = WalExtent { begin: self.durable.begin, end: self.written_end };
        self.write_extent(extent, self.written_boundary, stats)
    }

    /// Writes the header with `e`, `boundary` and the next generation and fdatasyncs it,
    /// after the segments written since the last header (all of `e`'s bytes must be
    /// written).
    fn write_extent(&mut self, e: WalExtent, boundary: Lsn, stats: &mut SyncStats) -> anyhow::Result<()> {
        for segno in std::mem::take(&mut self.dirty) {
            let f = &self.open[&segno];
            stats
                .timed(|| f.sync_data())
                .with_context(|| format!("fdatasync WAL segment {}", segment_file_name(segno, self.segment_size)))?;
        }
        let header = Header { extent: e, boundary, generation: self.generation + 1 };
        let f = &self.end_file;
        f.write_all_at(&header.encode(), 0).with_context(|| format!("write {WAL_END_FILE_NAME}"))?;
        stats.timed(|| f.sync_data()).with_context(|| format!("fdatasync {WAL_END_FILE_NAME}"))?;
        self.generation = header.generation;
        self.journal_at = JOURNAL_OFFSET;
        self.journal.restart();
        self.pending.clear();
        self.durable = e;
        self.written_end = e.end;
        self.durable_boundary = boundary;
        self.written_boundary = boundary;
        Ok(())
    }

    /// Makes the WAL end at `at`, durably, which is its boundary LSN too. Inside the WAL
    /// (`begin <= at <= end`) the bytes after `at` are dropped; otherwise the WAL is emptied
    /// and begins at `at`. Unsynced appends must have been synced first.
    pub fn truncate(&mut self, at: Lsn, stats: &mut SyncStats) -> anyhow::Result<()> {
        if self.has_unsynced() {
            bail!("truncate with unsynced appends");
        }
        let old = self.durable;
        let inside = old.begin <= at && at <= old.end && !(old.begin == Lsn(0) && old.end == Lsn(0));
        let new = if inside { WalExtent { begin: old.begin, end: at } } else { WalExtent { begin: at, end: at } };
        if new == old && self.durable_boundary == at {
            return Ok(());
        }
        if at != Lsn(0) {
            // The segment holding the new end must exist before wal.end names it.
            self.segment(at.0 / self.segment_size, stats)?;
        }
        self.write_extent(new, at, stats)?;
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
            // An open segment exists (removal closes what it removes); only another is looked
            // for, so that a read never creates one.
            if !self.open.contains_key(&segno) && !self.segment_path(segno).exists() {
                bail!("WAL segment {} holding {} is missing", segment_file_name(segno, self.segment_size), Lsn(lsn));
            }
            let f = self.segment(segno, &mut ignored)?;
            f.read_exact_at(&mut out[done..done + n], off)
                .with_context(|| format!("read WAL segment {} at {}", segment_file_name(segno, self.segment_size), Lsn(lsn)))?;
            lsn += n as u64;
            done += n;
        }
        Ok(out.freeze())
    }
}

#[cfg(test)]
mod tests;
