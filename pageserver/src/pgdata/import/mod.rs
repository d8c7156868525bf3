//! Import: bootstrap an empty timeline from a cleanly shut down PostgreSQL 15 data
//! directory (fresh `initdb` output, or a stopped server).
//!
//! **The import LSN is the end of the shutdown checkpoint record** that `pg_control`
//! points at. A cleanly stopped server's last WAL record is that checkpoint, and every
//! page on disk is at or below it; a server started on the directory writes its next
//! record exactly there. So every imported value is an image at the import LSN, the
//! checkpoint record is stored as the latest checkpoint, and WAL ingest starts at the
//! import LSN: the first record it sees is the first one written after the import, and
//! puts land strictly above it, as the engine requires. (The checkpoint record's start
//! would not do: the record itself would then be ingested "after" the import, at an LSN
//! its own images already claim.)
//!
//! What is imported: every relation fork under `global/`, `base/<db>/` and
//! `pg_tblspc/<spc>/PG_15_<catversion>/<db>/` (all 1 GB segments), each block as an image;
//! the `pg_filenode.map` files; the SLRU segments of `pg_xact`, `pg_multixact/offsets` and
//! `pg_multixact/members`; `pg_twophase` state files; the checkpoint record (read from
//! `pg_wal`, and checked against `pg_control`'s copy); and `pg_control` itself. Not
//! imported: FSM forks (see `datadir`), the forks of unlogged relations other than their
//! init fork (their main fork is not WAL-logged and is reset from the init fork after a
//! crash anyway), temporary relations (`t<backend>_<relnode>`), and files that are not
//! relations (`pg_internal.init`, `PG_VERSION`, ...), which a basebackup makes anew.
//!
//! Invariant: import writes only into a timeline that has no published LSN, and publishes
//! the import LSN only after every value is put, so a reader sees all of it or nothing.

mod control;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::{ErrorKind, Read};
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context};
use bytes::Bytes;
use pgwal::parse::CheckPoint;
use pgwal::{parse_metadata, DecoderConfig, MetadataRecord, WalRecord, WalStreamDecoder};
use proto::page::PAGE_SIZE_BYTES;
use proto::{BlockNumber, ForkNumber, Key, Lsn, Oid, RelTag, SlruKind};

use crate::pgdata::datadir::codec::{self, DbEntry, RelEntry, StoredCheckpoint};
use crate::pgdata::datadir::{Modification, DEFAULT_TABLESPACE_OID, GLOBAL_TABLESPACE_OID};
use crate::pgdata::reconstruct::layout::SLRU_PAGES_PER_SEGMENT;
use crate::pgdata::walingest::wal_segment_file_name;
pub use control::ControlFile;
use layerstore::timeline::Timeline;
use layerstore::value::Value;

/// `RELSEG_SIZE`: blocks per 1 GB relation segment file.
const RELSEG_SIZE_BLOCKS: u64 = 131072;
/// Pages read from a relation file at a time.
const READ_PAGES: usize = 64;

/// What an import stored.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImportSummary {
    /// The end of the shutdown checkpoint record: where everything was put, and where WAL
    /// ingest continues.
    pub import_lsn: Lsn,
    /// Where the shutdown checkpoint record starts (`pg_control`'s `checkPoint`).
    pub checkpoint_lsn: Lsn,
    /// PostgreSQL's timeline of that checkpoint: the one whose `pg_wal` files follow.
    pub pg_timeline_id: u32,
    pub system_identifier: u64,
    /// Databases, counting `global/` as (1664, 0).
    pub databases: usize,
    pub relation_forks: usize,
    pub relation_blocks: u64,
    pub slru_segments: usize,
    pub twophase_files: usize,
}

/// Imports `pgdata` into `timeline`, which must have no published LSN yet.
pub fn import_datadir(timeline: &Timeline, pgdata: &Path) -> anyhow::Result<ImportSummary> {
    let span = tracing::info_span!("import", tenant_id = %timeline.tenant_id(), timeline_id = %timeline.timeline_id());
    let _entered = span.enter();
    let version = fs::read_to_string(pgdata.join("PG_VERSION")).with_context(|| format!("read {}/PG_VERSION", pgdata.display()))?;
    ensure!(version.trim() == "15", "cannot import {}: PostgreSQL version {}, fjord supports only 15", pgdata.display(), version.trim());
    let control_path = pgdata.join("global/pg_control");
    let control_raw = fs::read(&control_path).with_context(|| format!("read {}", control_path.display()))?;
    let control = ControlFile::parse(&control_raw).with_context(|| format!("parse {}", control_path.display()))?;
    if !control.is_shut_down() {
        bail!("cannot import {}: the server was not shut down cleanly (database state {})", pgdata.display(), control.state);
    }
    let last = timeline.last_record_lsn();
    ensure!(last == Lsn::INVALID, "cannot import into timeline {}: it already has data up to {last}", timeline.timeline_id());

    let record = read_checkpoint_record(&pgdata.join("pg_wal"), &control)?;
    let lsn = record.end_lsn();
    let mut summary = ImportSummary {
        import_lsn: lsn,
        checkpoint_lsn: control.checkpoint_lsn,
        pg_timeline_id: control.timeline_id,
        system_identifier: control.system_identifier,
        ..ImportSummary::default()
    };
    tracing::info!("importing {} at LSN {lsn} (shutdown checkpoint at {})", pgdata.display(), control.checkpoint_lsn);

    let mut m = Modification::new(timeline, lsn);
    let mut dbs = BTreeSet::new();
    let mut import_db = |m: &mut Modification<'_>, dir: &Path, spcnode: Oid, dbnode: Oid, summary: &mut ImportSummary| {
        let rels = import_relations(timeline, m, lsn, dir, spcnode, dbnode, summary)?;
        m.put_rel_dir(spcnode, dbnode, &rels);
        let map = dir.join("pg_filenode.map");
        if let Some(bytes) = read_if_exists(&map)? {
            m.put_image(Key::relmap_file(spcnode, dbnode), Bytes::from(bytes));
        }
        dbs.insert(DbEntry { spcnode, dbnode });
        anyhow::Ok(())
    };
    import_db(&mut m, &pgdata.join("global"), GLOBAL_TABLESPACE_OID, 0, &mut summary)?;
    for (dbnode, dir) in numbered_entries(&pgdata.join("base"), 10)? {
        import_db(&mut m, &dir, DEFAULT_TABLESPACE_OID, dbnode, &mut summary)?;
    }
    let catalog_dir = format!("PG_15_{}", control.catalog_version);
    for (spcnode, spc_dir) in numbered_entries(&pgdata.join("pg_tblspc"), 10)? {
        for (dbnode, dir) in numbered_entries(&spc_dir.join(&catalog_dir), 10)? {
            import_db(&mut m, &dir, spcnode, dbnode, &mut summary)?;
        }
    }
    summary.databases = dbs.len();
    m.put_db_dir(&dbs);

    for slru in SlruKind::ALL {
        summary.slru_segments += import_slru(timeline, &mut m, lsn, &pgdata.join(slru.dir_name()), slru)?;
    }
    let mut xids = BTreeSet::new();
    for (xid, path) in numbered_entries(&pgdata.join("pg_twophase"), 16)? {
        let state = fs::read(&path).with_context(|| format!("read {}", path.display()))?;
        m.put_image(Key::twophase_file(xid), Bytes::from(state));
        xids.insert(xid);
    }
    summary.twophase_files = xids.len();
    m.put_twophase_dir(&xids);
    // The counters start as the shutdown checkpoint has them (checked equal to the record).
    let current = CheckPoint::from_bytes(&control.checkpoint_copy).map_err(anyhow::Error::msg)?;
    let stored = StoredCheckpoint { record_lsn: record.start_lsn(), current, record: Bytes::copy_from_slice(record.raw()) };
    m.put_image(Key::checkpoint(), codec::encode_checkpoint(&stored));
    m.put_image(Key::control_file(), Bytes::from(control_raw));
    m.commit()?;
    tracing::info!("imported {summary:?}");
    Ok(summary)
}

/// Reads and checks the shutdown checkpoint record `pg_control` points at.
fn read_checkpoint_record(pg_wal: &Path, control: &ControlFile) -> anyhow::Result<WalRecord> {
    let start = control.checkpoint_lsn;
    let config = DecoderConfig { system_id: Some(control.system_identifier), ..DecoderConfig::default() };
    let mut decoder = WalStreamDecoder::new(start, config)?;
    let record = loop {
        let at = decoder.next_feed_lsn();
        let path = pg_wal.join(wal_segment_file_name(control.timeline_id, at));
        let segment = fs::read(&path).with_context(|| format!("read the WAL segment of the checkpoint at {start}: {}", path.display()))?;
        let offset = at.segment_offset() as usize;
        ensure!(segment.len() > offset, "WAL segment {} ends before the checkpoint at {start}", path.display());
        decoder.feed_bytes(&segment[offset..]);
        if let Some(record) = decoder.poll_decode().with_context(|| format!("read the checkpoint record at {start}"))? {
            break record;
        }
    };
    ensure!(record.start_lsn() == start, "the record read at {start} starts at {}", record.start_lsn());
    let decoded = record.decode()?;
    match parse_metadata(&decoded)? {
        Some(MetadataRecord::Checkpoint { shutdown: true, checkpoint }) => {
            // pg_control keeps a copy of the record's CheckPoint. `to_bytes` zeroes the
            // struct's padding (bytes 17..24 and 60..64), so compare without it.
            let mut copy = control.checkpoint_copy.clone();
            copy[17..24].fill(0);
            copy[60..64].fill(0);
            ensure!(checkpoint.to_bytes()[..] == copy[..], "the checkpoint record at {start} differs from pg_control's copy of it");
        }
        Some(MetadataRecord::Checkpoint { shutdown: false, .. }) => {
            bail!("the checkpoint at {start} is an online checkpoint: the server was not shut down cleanly")
        }
        _ => bail!("the record at {start} that pg_control names is not a checkpoint"),
    }
    Ok(record)
}

/// Entries of `dir` whose names are numbers in `radix`, in order; none if `dir` is missing.
fn numbered_entries(dir: &Path, radix: u32) -> anyhow::Result<Vec<(u32, PathBuf)>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("list {}", dir.display())),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("list {}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Ok(n) = u32::from_str_radix(&name, radix) {
            out.push((n, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

fn read_if_exists(path: &Path) -> anyhow::Result<Option<Vec<u8>>> {
    match fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("read {}", path.display())),
    }
}

/// `<relnode>[_fsm|_vm|_init][.<segno>]`, PostgreSQL's relation file names.
fn parse_rel_file_name(name: &str) -> Option<(Oid, ForkNumber, u32)> {
    let (base, segno) = match name.split_once('.') {
        Some((base, seg)) if !seg.is_empty() && seg.bytes().all(|b| b.is_ascii_digit()) => (base, seg.parse().ok()?),
        Some(_) => return None,
        None => (name, 0),
    };
    let (relnode, forknum) = match base.split_once('_') {
        None => (base, ForkNumber::Main),
        Some((rel, "fsm")) => (rel, ForkNumber::Fsm),
        Some((rel, "vm")) => (rel, ForkNumber::VisibilityMap),
        Some((rel, "init")) => (rel, ForkNumber::Init),
        Some(_) => return None,
    };
    if relnode.is_empty() || !relnode.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let relnode: Oid = relnode.parse().ok()?;
    (relnode != 0).then_some((relnode, forknum, segno))
}

/// Imports the relation files of one database directory; returns its relation directory.
fn import_relations(
    timeline: &Timeline,
    m: &mut Modification<'_>,
    lsn: Lsn,
    dir: &Path,
    spcnode: Oid,
    dbnode: Oid,
    summary: &mut ImportSummary,
) -> anyhow::Result<BTreeSet<RelEntry>> {
    let mut files: BTreeMap<(Oid, ForkNumber), BTreeMap<u32, PathBuf>> = BTreeMap::new();
    for entry in fs::read_dir(dir).with_context(|| format!("list {}", dir.display()))? {
        let entry = entry.with_context(|| format!("list {}", dir.display()))?;
        if let Some((relnode, forknum, segno)) = parse_rel_file_name(&entry.file_name().to_string_lossy()) {
            files.entry((relnode, forknum)).or_default().insert(segno, entry.path());
        }
    }
    let unlogged: BTreeSet<Oid> = files.keys().filter(|(_, f)| *f == ForkNumber::Init).map(|(r, _)| *r).collect();
    let mut rels = BTreeSet::new();
    for ((relnode, forknum), segments) in files {
        if forknum == ForkNumber::Fsm || (unlogged.contains(&relnode) && forknum != ForkNumber::Init) {
            continue;
        }
        let rel = RelTag { spcnode, dbnode, relnode, forknum };
        let blocks = import_rel_fork(timeline, lsn, rel, &segments)?;
        m.put_rel_size(rel, blocks);
        rels.insert(RelEntry { relnode, forknum });
        summary.relation_forks += 1;
        summary.relation_blocks += u64::from(blocks);
    }
    Ok(rels)
}

/// Puts every block of one relation fork (all its segment files) as an image at `lsn`.
fn import_rel_fork(timeline: &Timeline, lsn: Lsn, rel: RelTag, segments: &BTreeMap<u32, PathBuf>) -> anyhow::Result<u32> {
    let mut blkno: u64 = 0;
    let last_segno = segments.keys().next_back().copied().unwrap_or(0);
    for (expected, (&segno, path)) in segments.iter().enumerate() {
        ensure!(segno as usize == expected, "relation {rel} has no segment {expected} but has {}", path.display());
        let mut file = File::open(path).with_context(|| format!("open {}", path.display()))?;
        let len = file.metadata().with_context(|| format!("stat {}", path.display()))?.len();
        ensure!(len % PAGE_SIZE_BYTES as u64 == 0, "{} is {len} bytes, not a whole number of pages", path.display());
        let pages = len / PAGE_SIZE_BYTES as u64;
        ensure!(
            segno == last_segno || pages == RELSEG_SIZE_BLOCKS,
            "{} has {pages} pages, but a segment before the last must have {RELSEG_SIZE_BLOCKS}",
            path.display()
        );
        let mut buf = vec![0u8; READ_PAGES * PAGE_SIZE_BYTES];
        let mut left = pages;
        while left > 0 {
            let n = left.min(READ_PAGES as u64) as usize;
            file.read_exact(&mut buf[..n * PAGE_SIZE_BYTES]).with_context(|| format!("read {}", path.display()))?;
            for page in buf[..n * PAGE_SIZE_BYTES].chunks_exact(PAGE_SIZE_BYTES) {
                let block = u32::try_from(blkno).ok().filter(|b| *b != BlockNumber::INVALID.0);
                let block = block.with_context(|| format!("relation {rel} has more blocks than PostgreSQL allows"))?;
                timeline.put(Key::rel_block(rel, BlockNumber(block)), lsn, &Value::Image(Bytes::copy_from_slice(page)))?;
                blkno += 1;
            }
            left -= n as u64;
        }
    }
    Ok(blkno as u32)
}

/// Imports the segment files of one SLRU; returns how many.
fn import_slru(timeline: &Timeline, m: &mut Modification<'_>, lsn: Lsn, dir: &Path, slru: SlruKind) -> anyhow::Result<usize> {
    let mut segments = BTreeSet::new();
    for (segno, path) in numbered_entries(dir, 16)? {
        let bytes = fs::read(&path).with_context(|| format!("read {}", path.display()))?;
        let pages = bytes.len() / PAGE_SIZE_BYTES;
        ensure!(
            bytes.len() % PAGE_SIZE_BYTES == 0 && pages <= SLRU_PAGES_PER_SEGMENT as usize,
            "{} is {} bytes, not at most {SLRU_PAGES_PER_SEGMENT} whole pages",
            path.display(),
            bytes.len()
        );
        for (blkno, page) in bytes.chunks_exact(PAGE_SIZE_BYTES).enumerate() {
            let key = Key::slru_block(slru, segno, BlockNumber(blkno as u32));
            timeline.put(key, lsn, &Value::Image(Bytes::copy_from_slice(page)))?;
        }
        m.put_slru_segment_size(slru, segno, pages as u32);
        segments.insert(segno);
    }
    m.put_slru_dir(slru, &segments);
    Ok(segments.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relation_file_names() {
        assert_eq!(parse_rel_file_name("16384"), Some((16384, ForkNumber::Main, 0)));
        assert_eq!(parse_rel_file_name("16384.2"), Some((16384, ForkNumber::Main, 2)));
        assert_eq!(parse_rel_file_name("1259_vm"), Some((1259, ForkNumber::VisibilityMap, 0)));
        assert_eq!(parse_rel_file_name("1259_fsm.1"), Some((1259, ForkNumber::Fsm, 1)));
        assert_eq!(parse_rel_file_name("16390_init"), Some((16390, ForkNumber::Init, 0)));
        for bad in ["PG_VERSION", "pg_filenode.map", "pg_internal.init", "t3_16384", "16384_xyz", "16384.", "0", "_vm", "1.a"] {
            assert_eq!(parse_rel_file_name(bad), None, "{bad}");
        }
    }
}
