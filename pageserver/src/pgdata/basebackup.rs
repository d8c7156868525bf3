//! Basebackup: a tar stream of the PostgreSQL 15 data directory a compute starts from at
//! an LSN, without reading any WAL and without any relation data (pages come from the
//! pageserver on demand).
//!
//! What the tar holds, in this order:
//! - directories: `global`, `base`, `base/<db>` for every database, and the empty ones
//!   PostgreSQL expects (`pg_wal/archive_status`, `pg_xact`, `pg_multixact/*`, `pg_twophase`,
//!   `pg_stat`, `pg_logical/*` ...; `EMPTY_DIRS`);
//! - `PG_VERSION` (`15\n`) at the top, in `global/` and in every `base/<db>/`;
//! - `global/pg_control`: the imported control file rewritten for a start at the LSN
//!   (`ControlFile::for_start_at`): a shutdown checkpoint at the LSN, whose
//!   `checkPointCopy` has the counters ingest keeps current (next xid, OID, multixact ...;
//!   `walingest/counters.rs`), redo = the LSN, timeline 1 (fjord's timelines are not
//!   PostgreSQL's: every compute runs on PostgreSQL timeline 1), `oldestActiveXid` invalid
//!   as in any shutdown checkpoint (for a hot standby: the oldest transaction its
//!   running-transactions record lists), time = now;
//! - `pg_filenode.map` of `global/` and of every database that has one at the LSN (a
//!   database created with `WAL_LOG` has none until its map is logged, a moment before
//!   its creation commits; it is skipped then);
//! - the SLRU segments (`pg_xact/XXXX`, `pg_multixact/offsets/XXXX`,
//!   `pg_multixact/members/XXXX`; `%04X` as `SlruFileName` prints them, 5 digits for
//!   member segments past FFFF) and `pg_twophase/<xid as %08X>`;
//! - unlogged relations: `base/<db>/<relnode>_init` and `base/<db>/<relnode>` with the
//!   same content. PostgreSQL resets unlogged relations from their init forks only during
//!   crash recovery, and this start does no recovery; the store keeps no main fork for
//!   them, so the reset is done here;
//! - `pg_wal/<segment of the LSN on timeline 1>`: zeros but for a valid long page header at
//!   offset 0 and, when the LSN is past the first page, a short header at the start of the
//!   LSN's page, with `xlp_rem_len` 0 (no record continues into it: the server writes its
//!   first record at the LSN). Nothing after the LSN. The entry stops at the end of the
//!   LSN's page: the rest of the 16 MiB segment would be zeros, and sending them was most
//!   of the bytes and of the time of a basebackup. The client extends the file to the
//!   segment size with zeros (compute_ctl does, as a sparse file, before postgres starts);
//!   the entry's length is therefore a multiple of the WAL page size, at most a segment;
//! - an empty `postgresql.auto.conf` (compute_ctl writes `postgresql.conf` and
//!   `pg_hba.conf`);
//! - `fjord.signal`: `LSN: X/X\nPREV LSN: X/X\n`, the contract with the compute's
//!   PostgreSQL patch, which starts at `LSN` with `PREV LSN` as the previous record
//!   pointer (`none` when unknown: the basebackup is not at the timeline's last record).
//!   `LSN` is where the compute's first record goes: the basebackup's LSN, or, when that is
//!   a page boundary, the position after the page's header (`Lsn::next_record_start`;
//!   pg_control's checkpoint must be a valid record position). The compute's WAL proposer
//!   maps it back (`Lsn::previous_wal_end`) to stream from where the safekeepers' WAL ends.
//!
//! The LSN is a record boundary the timeline has published: the end of a record as
//! `EndRecPtr` has it (MAXALIGNed; at a page boundary the next record goes after that
//! page's header).
//!
//! Invariants: everything is read at the one LSN; a non-default tablespace is refused
//! (compute storage for tablespaces does not exist); every file has mode 0600 and every
//! directory 0700, as `initdb` makes them.

use std::io::Write;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context};
use pgwal::{PageHeader, TimeLineId, TransactionId};
use proto::lsn::WAL_SEGMENT_SIZE_BYTES;
use proto::page::PAGE_SIZE_BYTES;
use proto::{BlockNumber, ForkNumber, Lsn, SlruKind};

use crate::pgdata::datadir::{Datadir, DatadirError, DEFAULT_TABLESPACE_OID, GLOBAL_TABLESPACE_OID};
use crate::pgdata::import::ControlFile;
use crate::pgdata::walingest::wal_segment_file_name;
use layerstore::timeline::Timeline;
use layerstore::value::Reconstructor;

/// The PostgreSQL timeline every compute starts on.
pub const PG_TIMELINE_ID: u32 = 1;
/// `RELSEG_SIZE`: an init fork beyond one segment file is refused.
const RELSEG_SIZE_BLOCKS: u32 = 131072;

/// The directories PostgreSQL 15 expects in a data directory, created empty if nothing
/// else goes in them.
pub const EMPTY_DIRS: &[&str] = &[
    "global",
    "base",
    "pg_wal",
    "pg_wal/archive_status",
    "pg_tblspc",
    "pg_stat",
    "pg_stat_tmp",
    "pg_snapshots",
    "pg_logical",
    "pg_logical/snapshots",
    "pg_logical/mappings",
    "pg_notify",
    "pg_serial",
    "pg_subtrans",
    "pg_commit_ts",
    "pg_dynshmem",
    "pg_replslot",
    "pg_xact",
    "pg_multixact",
    "pg_multixact/offsets",
    "pg_multixact/members",
    "pg_twophase",
];

/// What a basebackup contained.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BasebackupSummary {
    pub lsn: Lsn,
    pub prev_record_lsn: Option<Lsn>,
    pub files: usize,
    pub databases: usize,
    pub slru_segments: usize,
    pub unlogged_relations: usize,
    pub bytes: u64,
}

/// `fjord.signal`: the contract with the compute's patch (see the module documentation).
pub fn signal_file(lsn: Lsn, prev_record_lsn: Option<Lsn>) -> String {
    let prev = prev_record_lsn.map_or_else(|| "none".to_string(), |l| l.to_string());
    format!("LSN: {lsn}\nPREV LSN: {prev}\n")
}

/// The start of the WAL segment holding `lsn`, as the compute finds it in `pg_wal`, up to
/// the end of `lsn`'s page: zeros but for the segment's long page header and the short
/// header of `lsn`'s page (if that is not the first page), both with `xlp_rem_len` 0. The
/// client extends it with zeros to the segment size.
pub fn wal_segment_for_start(lsn: Lsn, system_identifier: u64) -> Vec<u8> {
    let seg_start = lsn.0 - lsn.0 % WAL_SEGMENT_SIZE_BYTES;
    let page_start = lsn.0 - lsn.0 % proto::lsn::WAL_PAGE_SIZE_BYTES;
    let mut segment = vec![0u8; (page_start - seg_start + proto::lsn::WAL_PAGE_SIZE_BYTES) as usize];
    let first = PageHeader::new(Lsn(seg_start), TimeLineId(PG_TIMELINE_ID), WAL_SEGMENT_SIZE_BYTES, system_identifier).to_bytes();
    segment[..first.len()].copy_from_slice(&first);
    if page_start != seg_start {
        let header = PageHeader::new(Lsn(page_start), TimeLineId(PG_TIMELINE_ID), WAL_SEGMENT_SIZE_BYTES, system_identifier).to_bytes();
        let at = (page_start - seg_start) as usize;
        segment[at..at + header.len()].copy_from_slice(&header);
    }
    segment
}

/// Counts the bytes written through it.
struct Counting<W> {
    inner: W,
    bytes: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

struct TarWriter<W: Write> {
    builder: tar::Builder<Counting<W>>,
    mtime: u64,
    files: usize,
}

impl<W: Write> TarWriter<W> {
    fn dir(&mut self, path: &str) -> anyhow::Result<()> {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Directory);
        header.set_mode(0o700);
        header.set_size(0);
        header.set_mtime(self.mtime);
        self.builder.append_data(&mut header, format!("{path}/"), std::io::empty()).with_context(|| format!("write directory {path}"))
    }

    fn file(&mut self, path: &str, data: &[u8]) -> anyhow::Result<()> {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mode(0o600);
        header.set_size(data.len() as u64);
        header.set_mtime(self.mtime);
        self.builder.append_data(&mut header, path, data).with_context(|| format!("write {path}"))?;
        self.files += 1;
        Ok(())
    }
}

/// Writes the basebackup of `timeline` at `lsn` (published, at or above the GC cutoff) to
/// `out`. `prev_record_lsn` is where the record ending at `lsn` starts, if known (see the
/// module documentation). Relation pages of init forks are rebuilt with `reconstructor`.
pub fn write_basebackup(
    timeline: &Timeline,
    reconstructor: &dyn Reconstructor,
    lsn: Lsn,
    prev_record_lsn: Option<Lsn>,
    out: impl Write,
) -> anyhow::Result<BasebackupSummary> {
    write(timeline, reconstructor, lsn, prev_record_lsn, TransactionId::INVALID, out)
}

/// Writes the basebackup a hot standby starts from at `lsn`, the start of a
/// running-transactions record (or, when there is none to start from, any record
/// boundary: the standby then waits for the next one before it serves queries). The
/// standby replays WAL from `lsn` on, so no previous record LSN is needed;
/// `oldest_active_xid` is the record's oldest running transaction (pg_control's
/// `oldestActiveXid`, from which the standby initializes `pg_subtrans`), or the next xid
/// when unknown.
pub fn write_standby_basebackup(
    timeline: &Timeline,
    reconstructor: &dyn Reconstructor,
    lsn: Lsn,
    oldest_active_xid: Option<TransactionId>,
    out: impl Write,
) -> anyhow::Result<BasebackupSummary> {
    let next_xid = || -> anyhow::Result<TransactionId> {
        let cp = Datadir::new(timeline, reconstructor).get_checkpoint_state(lsn)?.current;
        Ok(TransactionId(cp.next_xid.0 as u32))
    };
    let oldest = match oldest_active_xid {
        Some(xid) => xid,
        None => next_xid()?,
    };
    write(timeline, reconstructor, lsn, None, oldest, out)
}

fn write(
    timeline: &Timeline,
    reconstructor: &dyn Reconstructor,
    lsn: Lsn,
    prev_record_lsn: Option<Lsn>,
    oldest_active_xid: TransactionId,
    out: impl Write,
) -> anyhow::Result<BasebackupSummary> {
    let started = Instant::now();
    let d = Datadir::new(timeline, reconstructor);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).context("the clock is before 1970")?;
    let mut tar = TarWriter { builder: tar::Builder::new(Counting { inner: out, bytes: 0 }), mtime: now.as_secs(), files: 0 };
    tar.builder.mode(tar::HeaderMode::Complete);
    let mut summary = BasebackupSummary { lsn, prev_record_lsn, files: 0, databases: 0, slru_segments: 0, unlogged_relations: 0, bytes: 0 };

    let control = ControlFile::parse(&d.get_control_file(lsn)?).context("the stored control file")?;
    let mut checkpoint = d.get_checkpoint_state(lsn)?.current;
    // Where the compute writes its first record: past the page header when the WAL ends
    // at a page boundary (pg_control's checkpoint must be a valid record position).
    let start = lsn.next_record_start();
    checkpoint.redo = start;
    checkpoint.this_timeline_id = TimeLineId(PG_TIMELINE_ID);
    checkpoint.prev_timeline_id = TimeLineId(PG_TIMELINE_ID);
    checkpoint.time = i64::try_from(now.as_secs()).context("the clock is beyond 2^63 seconds")?;
    checkpoint.oldest_active_xid = oldest_active_xid;

    let dbs = d.list_dbs(lsn)?;
    for &(spcnode, dbnode) in &dbs {
        if spcnode != DEFAULT_TABLESPACE_OID && spcnode != GLOBAL_TABLESPACE_OID {
            bail!("database {dbnode} is in tablespace {spcnode}: basebackups support only pg_default and pg_global");
        }
    }

    tar.file("PG_VERSION", b"15\n")?;
    for dir in EMPTY_DIRS {
        tar.dir(dir)?;
    }
    for &(spcnode, dbnode) in &dbs {
        if spcnode == DEFAULT_TABLESPACE_OID {
            tar.dir(&format!("base/{dbnode}"))?;
        }
    }
    tar.file("global/pg_control", &control.for_start_at(start, &checkpoint, checkpoint.time))?;

    for &(spcnode, dbnode) in &dbs {
        let dir = if spcnode == GLOBAL_TABLESPACE_OID { "global".to_string() } else { format!("base/{dbnode}") };
        tar.file(&format!("{dir}/PG_VERSION"), b"15\n")?;
        match d.get_relmap(spcnode, dbnode, lsn) {
            Ok(map) => tar.file(&format!("{dir}/pg_filenode.map"), &map)?,
            Err(DatadirError::NotFound { .. }) if spcnode != GLOBAL_TABLESPACE_OID => {
                tracing::debug!("database {dbnode} has no relation map at {lsn} yet; skipped");
            }
            Err(e) => return Err(e.into()),
        }
        for rel in d.list_rels(spcnode, dbnode, lsn)? {
            if rel.forknum != ForkNumber::Init {
                continue;
            }
            let blocks = d.get_rel_size(rel, lsn)?;
            ensure!(blocks <= RELSEG_SIZE_BLOCKS, "the init fork of {rel} has {blocks} blocks, more than one segment file");
            let mut data = Vec::with_capacity(blocks as usize * PAGE_SIZE_BYTES);
            for blkno in 0..blocks {
                data.extend_from_slice(&d.get_rel_page(rel, BlockNumber(blkno), lsn)?);
            }
            tar.file(&format!("{dir}/{}_init", rel.relnode), &data)?;
            tar.file(&format!("{dir}/{}", rel.relnode), &data)?;
            summary.unlogged_relations += 1;
        }
        summary.databases += 1;
    }

    for slru in SlruKind::ALL {
        for segno in d.list_slru_segments(slru, lsn)? {
            let data = d.get_slru_segment(slru, segno, lsn)?;
            tar.file(&format!("{}/{segno:04X}", slru.dir_name()), &data)?;
            summary.slru_segments += 1;
        }
    }
    for xid in d.list_twophase(lsn)? {
        tar.file(&format!("pg_twophase/{xid:08X}"), &d.get_twophase_file(xid, lsn)?)?;
    }

    let segment = wal_segment_for_start(start, control.system_identifier);
    tar.file(&format!("pg_wal/{}", wal_segment_file_name(PG_TIMELINE_ID, start)), &segment)?;
    tar.file("postgresql.auto.conf", b"")?;
    tar.file("fjord.signal", signal_file(start, prev_record_lsn).as_bytes())?;

    summary.files = tar.files;
    let mut counting = tar.builder.into_inner().context("finish the tar stream")?;
    counting.flush().context("flush the tar stream")?;
    summary.bytes = counting.bytes;
    tracing::info!(
        tenant_id = %timeline.tenant_id(),
        timeline_id = %timeline.timeline_id(),
        "basebackup at {lsn} (prev {}): {} files, {} bytes, {} databases, {} SLRU segments, {} unlogged relations in {:.1?}",
        prev_record_lsn.map_or_else(|| "none".to_string(), |l| l.to_string()),
        summary.files,
        summary.bytes,
        summary.databases,
        summary.slru_segments,
        summary.unlogged_relations,
        started.elapsed()
    );
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgwal::consts::{XLOG_PAGE_MAGIC, XLP_LONG_HEADER};

    const SEG: u64 = WAL_SEGMENT_SIZE_BYTES;

    fn u16_at(b: &[u8], at: usize) -> u16 {
        u16::from_le_bytes([b[at], b[at + 1]])
    }
    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }
    fn u64_at(b: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
    }

    #[test]
    fn wal_segment_has_a_long_header_and_the_lsn_page_header() {
        let lsn = Lsn(3 * SEG + 5 * 8192 + 0x128);
        let seg = wal_segment_for_start(lsn, 0xABCD_0123_4567_89EF);
        assert_eq!(seg.len(), 6 * 8192, "up to the end of the LSN's page");
        // XLogLongPageHeaderData at 0.
        assert_eq!(u16_at(&seg, 0), XLOG_PAGE_MAGIC);
        assert_eq!(XLOG_PAGE_MAGIC, 0xD110, "PostgreSQL 15's magic");
        assert_eq!(u16_at(&seg, 2), XLP_LONG_HEADER);
        assert_eq!(u32_at(&seg, 4), 1, "timeline 1");
        assert_eq!(u64_at(&seg, 8), 3 * SEG, "pageaddr is the segment start");
        assert_eq!(u32_at(&seg, 16), 0, "xlp_rem_len");
        assert_eq!(u64_at(&seg, 24), 0xABCD_0123_4567_89EF);
        assert_eq!(u32_at(&seg, 32), SEG as u32);
        assert_eq!(u32_at(&seg, 36), 8192);
        // A short header at the start of the LSN's page, nothing else.
        let p = 5 * 8192;
        assert_eq!(u16_at(&seg, p), XLOG_PAGE_MAGIC);
        assert_eq!(u16_at(&seg, p + 2), 0);
        assert_eq!(u32_at(&seg, p + 4), 1);
        assert_eq!(u64_at(&seg, p + 8), 3 * SEG + 5 * 8192);
        assert_eq!(u32_at(&seg, p + 16), 0);
        let nonzero: Vec<usize> = (0..seg.len()).filter(|&i| seg[i] != 0).collect();
        assert!(nonzero.iter().all(|&i| i < 40 || (p..p + 24).contains(&i)), "{:?}", &nonzero[..nonzero.len().min(20)]);
        // Both headers pass the WAL reader's own checks.
        PageHeader::parse(&seg).unwrap().validate(Lsn(3 * SEG), SEG, Some(0xABCD_0123_4567_89EF)).unwrap();
        PageHeader::parse(&seg[p..]).unwrap().validate(Lsn(3 * SEG + p as u64), SEG, None).unwrap();

        // In the first page only the long header.
        let seg = wal_segment_for_start(Lsn(SEG + 0x28), 7);
        assert_eq!(seg.len(), 8192);
        assert!(seg[40..].iter().all(|&b| b == 0));
        // The last byte of a segment: the whole segment.
        assert_eq!(wal_segment_for_start(Lsn(2 * SEG - 1), 7).len() as u64, SEG);
        assert_eq!(wal_segment_file_name(PG_TIMELINE_ID, lsn), "000000010000000000000003");
    }

    #[test]
    fn signal_file_format() {
        assert_eq!(signal_file(Lsn(0x1_0000_0028), Some(Lsn(0x1_0000_0000))), "LSN: 1/28\nPREV LSN: 1/0\n");
        assert_eq!(signal_file(Lsn(0x16B_3740), None), "LSN: 0/16B3740\nPREV LSN: none\n");
    }
}
