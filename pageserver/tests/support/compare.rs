//! The comparison of the store at an LSN with a PostgreSQL data directory (the live one
//! after a clean stop, or a copy taken after a `CHECKPOINT`), shared by the tests that run
//! a real server: `ingest_real.rs` and `oracle.rs`.
//!
//! What must hold, per database and relation fork the directory has (main, visibility map,
//! init; never the FSM, which is not stored; unlogged relations by their init fork only):
//! the store lists the fork, with the file's size, and every block read through
//! `PageApi::get_page` (WAL redo by real `postgres --wal-redo` processes) equals the
//! file's block, byte for byte or after PostgreSQL's own `rm_mask` for the relation's
//! access method (hint bits, page LSN, unused space, command ids: what
//! `wal_consistency_checking` ignores). Visibility-map pages are compared with only the
//! page LSN and checksum masked. Relation maps, SLRU segments and two-phase state files
//! must be equal byte for byte.
//!
//! The exceptions: things PostgreSQL itself changes without WAL, each checked narrowly and
//! counted, never skipped:
//! - **map pages extended without WAL.** `vm_extend` creates and extends the map without
//!   WAL; such a fork or such pages beyond the stored size must be all zeros;
//! - **map bits lost in a `WAL_LOG` copy.** In a database created with `STRATEGY WAL_LOG`
//!   the stored map may lack bits the server has: PostgreSQL 15 logs the copied map pages
//!   as standard pages (`log_newpage_buffer(buf, true)` in
//!   `RelationCopyStorageUsingBuffer`), so the bitmap, lying between `pd_lower` and
//!   `pd_upper`, is the image's "hole"; a standby has the same zeros. The stored bits must
//!   be a subset of the file's, in a database the caller names as a `WAL_LOG` copy;
//! - **relation pages extended without WAL.** Under contention for the extension lock,
//!   `RelationAddExtraBlocks` (`hio.c`) adds zero pages to a heap and records them only in
//!   the FSM; until a tuple lands on one, no WAL mentions it. Blocks of a heap's main fork
//!   beyond the stored size must be all zeros (as on a standby, whose file is shorter);
//! - **sequences logged ahead.** `nextval` logs a sequence `SEQ_LOG_VALS` (32) values
//!   ahead and then leaves the page at the value actually handed out, so the stored page
//!   (what WAL says, as on a standby) has `last_value + log_cnt * increment` and
//!   `log_cnt = 0` where the file has `last_value` and `log_cnt`; everything else equal;
//! - **the SP-GiST metapage's cache of last used pages.** `SpGistUpdateMetaPage` writes
//!   the backend's cache of pages with free space into the metapage as a hint, without
//!   WAL, and `spg_mask` does not mask it (the cache lies below `pd_lower`; consistency
//!   checking never sees it because no record is replayed on the metapage after the
//!   build). Block 0 of an SP-GiST index may differ only in `lastUsedPages`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use pageserver::pgdata::reconstruct::layout::page_init;
use pageserver::pgdata::walredo::WalRedoManager;
use pageserver::PageApi;
use pgwal::consts::*;
use proto::page::page_is_new;
use proto::{BlockNumber, ForkNumber, Lsn, Oid, RelTag, SlruKind};

use super::PgCluster;

pub const PAGE: usize = 8192;
const RELSEG_BLOCKS: u64 = 131072;
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// What masking a relation's pages needs to know about it, from `pg_class`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelKind {
    pub relkind: String,
    pub am: String,
    /// `pg_sequence.seqincrement` for a sequence, else 0.
    pub seq_increment: i64,
}

/// Relation kind and access method of each relation file, from `pg_class` of every
/// database: (spcnode, dbnode, relnode) -> kind.
pub type Kinds = BTreeMap<(Oid, Oid, Oid), RelKind>;

pub fn relation_kinds(pg: &PgCluster) -> Kinds {
    let mut kinds = Kinds::new();
    let dbs = pg.rows("postgres", "SELECT oid, datname, datallowconn FROM pg_database");
    let query = "SELECT pg_relation_filenode(c.oid), c.relisshared, c.relkind, coalesce(am.amname, ''), \
                 coalesce(s.seqincrement, 0) FROM pg_class c LEFT JOIN pg_am am ON am.oid = c.relam \
                 LEFT JOIN pg_sequence s ON s.seqrelid = c.oid WHERE pg_relation_filenode(c.oid) IS NOT NULL";
    let mut template1 = Vec::new();
    for db in dbs.iter().filter(|d| d[2] == "t") {
        let dboid: Oid = db[0].parse().unwrap();
        for r in pg.rows(&db[1], query) {
            let relnode: Oid = r[0].parse().unwrap();
            let key = if r[1] == "t" { (1664, 0, relnode) } else { (1663, dboid, relnode) };
            let kind = RelKind { relkind: r[2].clone(), am: r[3].clone(), seq_increment: r[4].parse().unwrap() };
            if db[1] == "template1" && r[1] == "f" {
                template1.push((relnode, kind.clone()));
            }
            kinds.insert(key, kind);
        }
    }
    // template0 takes no connections; initdb copied it from template1, file for file.
    for db in dbs.iter().filter(|d| d[2] == "f") {
        let dboid: Oid = db[0].parse().unwrap();
        for (relnode, kind) in &template1 {
            kinds.insert((1663, dboid, *relnode), kind.clone());
        }
    }
    kinds
}

/// The resource manager whose `rm_mask` fits a relation's pages; `None`: mask only the LSN
/// and checksum (visibility-map pages, and relations `pg_class` did not name).
pub fn mask_rmid(kinds: &Kinds, rel: RelTag) -> Option<u8> {
    if rel.forknum == ForkNumber::VisibilityMap {
        return None;
    }
    let kind = kinds.get(&(rel.spcnode, rel.dbnode, rel.relnode))?;
    match (kind.relkind.as_str(), kind.am.as_str()) {
        ("S", _) => Some(RM_SEQ_ID),
        (_, "heap") => Some(RM_HEAP_ID),
        (_, "btree") => Some(RM_BTREE_ID),
        (_, "hash") => Some(RM_HASH_ID),
        (_, "gist") => Some(RM_GIST_ID),
        (_, "gin") => Some(RM_GIN_ID),
        (_, "spgist") => Some(RM_SPGIST_ID),
        (_, "brin") => Some(RM_BRIN_ID),
        _ => None,
    }
}

/// PostgreSQL's masking through the WAL redo process, or the local fallback when the
/// process does not offer it.
pub struct Masker {
    redo: Option<Arc<WalRedoManager>>,
}

impl Masker {
    pub fn new(redo: Arc<WalRedoManager>) -> Masker {
        match redo.mask_page(RM_HEAP_ID, BlockNumber(0), &page_init()) {
            Ok(_) => Masker { redo: Some(redo) },
            Err(e) => {
                println!("NOTE: the WAL redo process cannot mask pages ({e}); masking locally: LSN, checksum, heap hint bits");
                Masker { redo: None }
            }
        }
    }

    pub fn describe(&self) -> &'static str {
        if self.redo.is_some() {
            "PostgreSQL's rm_mask"
        } else {
            "the local fallback"
        }
    }

    pub fn mask(&self, rmid: Option<u8>, blkno: BlockNumber, page: &[u8]) -> Vec<u8> {
        if let (Some(rmid), Some(redo)) = (rmid, &self.redo) {
            return redo.mask_page(rmid, blkno, page).expect("mask a page").to_vec();
        }
        let mut p = page.to_vec();
        p[0..8].fill(0); // pd_lsn
        p[8..10].fill(0); // pd_checksum
        if rmid == Some(RM_HEAP_ID) {
            // t_infomask's hint bits: HEAP_XMIN_COMMITTED/INVALID, HEAP_XMAX_COMMITTED/INVALID.
            let lower = u16::from_le_bytes([p[12], p[13]]) as usize;
            for lp in (24..lower.min(PAGE)).step_by(4) {
                let word = u32::from_le_bytes(p[lp..lp + 4].try_into().unwrap());
                let (off, flags) = ((word & 0x7fff) as usize, (word >> 15) & 3);
                if flags == 1 && off + 24 <= PAGE {
                    let infomask = u16::from_le_bytes([p[off + 20], p[off + 21]]) & !0x0f00;
                    p[off + 20..off + 22].copy_from_slice(&infomask.to_le_bytes());
                }
            }
        }
        p
    }
}

/// The relation forks PostgreSQL left in one database directory, by the import's rules
/// (no FSM; only the init fork of unlogged relations), with their file segments.
pub fn disk_rels(dir: &Path, spcnode: Oid, dbnode: Oid) -> BTreeMap<RelTag, Vec<PathBuf>> {
    let mut files: BTreeMap<RelTag, BTreeMap<u32, PathBuf>> = BTreeMap::new();
    for entry in fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        let (base, segno) = match name.split_once('.') {
            Some((b, s)) => match s.parse::<u32>() {
                Ok(s) => (b.to_string(), s),
                Err(_) => continue,
            },
            None => (name.clone(), 0),
        };
        let (rel, fork) = match base.split_once('_') {
            None => (base.as_str(), ForkNumber::Main),
            Some((r, "vm")) => (r, ForkNumber::VisibilityMap),
            Some((r, "init")) => (r, ForkNumber::Init),
            Some((r, "fsm")) => (r, ForkNumber::Fsm),
            _ => continue,
        };
        let Ok(relnode) = rel.parse::<Oid>() else { continue };
        files.entry(RelTag { spcnode, dbnode, relnode, forknum: fork }).or_default().insert(segno, entry.path());
    }
    let unlogged: BTreeSet<Oid> = files.keys().filter(|r| r.forknum == ForkNumber::Init).map(|r| r.relnode).collect();
    files
        .into_iter()
        .filter(|(r, _)| r.forknum != ForkNumber::Fsm && (!unlogged.contains(&r.relnode) || r.forknum == ForkNumber::Init))
        .map(|(r, segs)| (r, segs.into_values().collect()))
        .collect()
}

pub fn read_block(segments: &[PathBuf], blkno: u64) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = fs::File::open(&segments[(blkno / RELSEG_BLOCKS) as usize]).unwrap();
    f.seek(SeekFrom::Start((blkno % RELSEG_BLOCKS) * PAGE as u64)).unwrap();
    let mut page = vec![0u8; PAGE];
    f.read_exact(&mut page).unwrap();
    page
}

pub fn file_blocks(segments: &[PathBuf]) -> u64 {
    segments.iter().map(|s| fs::metadata(s).unwrap().len() / PAGE as u64).sum()
}

/// What one comparison found. The exception counters are in the module documentation's
/// order.
#[derive(Default, Debug)]
pub struct Report {
    pub databases: usize,
    pub relation_forks: usize,
    pub blocks: u64,
    pub identical: u64,
    pub equal_after_masking: u64,
    /// Map pages on disk only, all zeros (`vm_extend`).
    pub vm_pages_only_on_disk: u64,
    /// Map pages whose stored bits are a strict subset of the file's, in a WAL_LOG copy.
    pub vm_pages_with_bits_lost_in_copy: u64,
    /// Zero pages of a main fork beyond the stored size (`RelationAddExtraBlocks`).
    pub pages_extended_without_wal: u64,
    /// Sequence pages whose stored state is the logged one, ahead of the file's.
    pub sequences_logged_ahead: u64,
    /// SP-GiST metapages differing only in the cache of last used pages.
    pub spgist_metapage_caches: u64,
    pub relmaps: usize,
    pub slru_segments: usize,
    pub twophase_files: usize,
    pub mismatches: Vec<String>,
}

impl Report {
    /// Adds the counts and mismatches of a comparison of other relations.
    pub fn add(&mut self, other: Report) {
        self.databases += other.databases;
        self.relation_forks += other.relation_forks;
        self.blocks += other.blocks;
        self.identical += other.identical;
        self.equal_after_masking += other.equal_after_masking;
        self.vm_pages_only_on_disk += other.vm_pages_only_on_disk;
        self.vm_pages_with_bits_lost_in_copy += other.vm_pages_with_bits_lost_in_copy;
        self.pages_extended_without_wal += other.pages_extended_without_wal;
        self.sequences_logged_ahead += other.sequences_logged_ahead;
        self.spgist_metapage_caches += other.spgist_metapage_caches;
        self.relmaps += other.relmaps;
        self.slru_segments += other.slru_segments;
        self.twophase_files += other.twophase_files;
        self.mismatches.extend(other.mismatches);
    }

    pub fn exceptions(&self) -> u64 {
        self.vm_pages_only_on_disk
            + self.vm_pages_with_bits_lost_in_copy
            + self.pages_extended_without_wal
            + self.sequences_logged_ahead
            + self.spgist_metapage_caches
    }

    pub fn summary(&self, masker: &Masker) -> String {
        format!(
            "{} databases, {} relation forks, {} blocks ({} identical, {} equal after masking by {}); exceptions: \
             {} map pages only on disk (zeros), {} map pages with bits lost in a WAL_LOG copy, {} pages extended \
             without WAL (zeros), {} sequences logged ahead, {} SP-GiST metapage caches; {} relation maps, {} SLRU segments, {} two-phase files",
            self.databases,
            self.relation_forks,
            self.blocks,
            self.identical,
            self.equal_after_masking,
            masker.describe(),
            self.vm_pages_only_on_disk,
            self.vm_pages_with_bits_lost_in_copy,
            self.pages_extended_without_wal,
            self.sequences_logged_ahead,
            self.spgist_metapage_caches,
            self.relmaps,
            self.slru_segments,
            self.twophase_files,
        )
    }
}

fn describe_difference(a: &[u8], b: &[u8]) -> String {
    let diffs: Vec<usize> = (0..PAGE).filter(|&i| a[i] != b[i]).collect();
    format!("{} bytes differ, first at {:?}", diffs.len(), &diffs[..diffs.len().min(8)])
}

/// What the comparison knows about the data directory it compares with.
pub struct Source<'a> {
    /// A data directory, or a copy of its `base/`, `global/`, SLRU and `pg_twophase`
    /// directories.
    pub pgdata: &'a Path,
    pub kinds: &'a Kinds,
    /// Databases created with `STRATEGY WAL_LOG` from a template with map bits.
    pub wal_log_dbs: &'a BTreeSet<Oid>,
}

/// The sequence tuple's `last_value`, `log_cnt` and `is_called`, and the offset of
/// `last_value` in the page; `None` if the page does not look like a sequence page.
fn sequence_values(page: &[u8]) -> Option<(i64, i64, bool, usize)> {
    let lp = u32::from_le_bytes(page[24..28].try_into().ok()?);
    let off = (lp & 0x7fff) as usize;
    let hoff = *page.get(off + 22)? as usize;
    let data = off + hoff;
    let field = |at: usize| Some(i64::from_le_bytes(page.get(at..at + 8)?.try_into().ok()?));
    Some((field(data)?, field(data + 8)?, *page.get(data + 16)? != 0, data))
}

/// The sequence exception (module documentation): whether `stored` is `file` as logged.
fn sequence_logged_ahead(stored: &[u8], file: &[u8], increment: i64, masker: &Masker, blkno: BlockNumber) -> bool {
    let (Some((s_last, s_cnt, s_called, at)), Some((f_last, f_cnt, f_called, f_at))) = (sequence_values(stored), sequence_values(file))
    else {
        return false;
    };
    if at != f_at || s_cnt != 0 || s_called != f_called || s_last != f_last + f_cnt * increment {
        return false;
    }
    let mut as_file = stored.to_vec();
    as_file[at..at + 16].copy_from_slice(&file[at..at + 16]);
    masker.mask(Some(RM_SEQ_ID), blkno, &as_file) == masker.mask(Some(RM_SEQ_ID), blkno, file)
}

/// `SpGistMetaPageData` after the page header: `magicNumber`, then `lastUsedPages`, eight
/// (block number, free space) pairs (`SPGIST_CACHED_PAGES`).
const SPGIST_LUP_CACHE: std::ops::Range<usize> = 24 + 4..24 + 4 + 8 * 8;

/// The SP-GiST exception (module documentation): whether `stored` is `file` but for the
/// metapage's cache of last used pages.
fn spgist_metapage_cache_differs(stored: &[u8], file: &[u8], masker: &Masker, blkno: BlockNumber) -> bool {
    if blkno != BlockNumber(0) || stored[24..28] != 0xBA0B_ABEEu32.to_le_bytes() {
        return false;
    }
    let mut as_file = stored.to_vec();
    as_file[SPGIST_LUP_CACHE].copy_from_slice(&file[SPGIST_LUP_CACHE]);
    masker.mask(Some(RM_SPGIST_ID), blkno, &as_file) == masker.mask(Some(RM_SPGIST_ID), blkno, file)
}

/// Threads that compare relation forks: the WAL redo pool of `walredo_config` has two
/// processes, and the comparison is mostly waiting for them and decompressing blocks.
const COMPARE_THREADS: usize = 2;

/// Compares every relation fork of every database at `lsn` with `src` (see the module
/// documentation), and the relation maps.
pub fn compare_relations(api: &PageApi, lsn: Lsn, src: &Source, masker: &Masker, report: &mut Report) {
    let datadir = api.datadir();
    let dbs = datadir.list_dbs(lsn).unwrap();
    let mut disk_dbs: BTreeSet<(Oid, Oid)> = [(1664, 0)].into();
    for entry in fs::read_dir(src.pgdata.join("base")).unwrap() {
        // base/pgsql_tmp holds temporary files, not a database.
        if let Ok(db) = entry.unwrap().file_name().to_string_lossy().parse() {
            disk_dbs.insert((1663, db));
        }
    }
    assert_eq!(dbs, disk_dbs, "databases in the store at {lsn} and in {}/base", src.pgdata.display());
    report.databases += dbs.len();
    let mut forks: Vec<(RelTag, Vec<PathBuf>)> = Vec::new();
    for (spc, db) in dbs {
        let dir = if spc == 1664 { src.pgdata.join("global") } else { src.pgdata.join("base").join(db.to_string()) };
        let mut on_disk = disk_rels(&dir, spc, db);
        let stored = api.list_rels(spc, db, lsn, TIMEOUT).unwrap();
        for (rel, segments) in &on_disk {
            if !stored.contains(rel) {
                let all_zero = (0..file_blocks(segments)).all(|b| page_is_new(&read_block(segments, b)));
                if rel.forknum == ForkNumber::VisibilityMap && all_zero {
                    report.vm_pages_only_on_disk += file_blocks(segments);
                } else {
                    report.mismatches.push(format!("{rel} is on disk but not in the store at {lsn}"));
                }
            }
        }
        for rel in stored {
            match on_disk.remove(&rel) {
                Some(segments) => forks.push((rel, segments)),
                None => report.mismatches.push(format!("{rel} is in the store at {lsn} but not on disk")),
            }
        }
        if let Ok(map) = fs::read(dir.join("pg_filenode.map")) {
            let stored = datadir.get_relmap(spc, db, lsn).unwrap();
            if stored[..] != map[..] {
                report.mismatches.push(format!("relation map of {spc}/{db} differs at {lsn}"));
            }
            report.relmaps += 1;
        }
    }
    // Large forks first, so that the threads finish together.
    forks.sort_by_key(|(_, segments)| std::cmp::Reverse(file_blocks(segments)));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let reports: Vec<Report> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..COMPARE_THREADS)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Report::default();
                    while let Some((rel, segments)) = forks.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)) {
                        compare_fork(api, lsn, src, masker, *rel, segments, &mut mine);
                    }
                    mine
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("a comparison thread panicked")).collect()
    });
    for r in reports {
        report.add(r);
    }
}

fn compare_fork(api: &PageApi, lsn: Lsn, src: &Source, masker: &Masker, rel: RelTag, segments: &[PathBuf], report: &mut Report) {
    report.relation_forks += 1;
    let size = api.get_rel_size(rel, lsn, TIMEOUT).unwrap();
    let disk = file_blocks(segments);
    let rmid = mask_rmid(src.kinds, rel);
    let tail_exception = match rel.forknum {
        ForkNumber::VisibilityMap => Some(&mut report.vm_pages_only_on_disk),
        // RelationAddExtraBlocks is the heap's (hio.c); indexes log the pages they add.
        ForkNumber::Main if rmid == Some(RM_HEAP_ID) => Some(&mut report.pages_extended_without_wal),
        _ => None,
    };
    match tail_exception {
        Some(counter) if disk > u64::from(size) => {
            for b in u64::from(size)..disk {
                if page_is_new(&read_block(segments, b)) {
                    *counter += 1;
                } else {
                    report.mismatches.push(format!("{rel} block {b} is beyond the stored size {size} at {lsn} but not zeros"));
                }
            }
        }
        _ if disk != u64::from(size) => {
            report.mismatches.push(format!("{rel} has {size} blocks in the store at {lsn}, {disk} on disk"));
            return;
        }
        _ => {}
    }
    for blkno in 0..size {
        report.blocks += 1;
        let stored =
            api.get_page(rel, BlockNumber(blkno), lsn, TIMEOUT).unwrap_or_else(|e| panic!("get_page {rel} {blkno} at {lsn}: {e:#}"));
        let file = read_block(segments, u64::from(blkno));
        if stored[..] == file[..] {
            report.identical += 1;
            continue;
        }
        // A new (all-zero) page cannot be masked; a difference there is real.
        if page_is_new(&stored) || page_is_new(&file) {
            report.mismatches.push(format!("{rel} block {blkno} at {lsn}: {}", describe_difference(&stored, &file)));
            continue;
        }
        let blk = BlockNumber(blkno);
        let (a, b) = (masker.mask(rmid, blk, &stored), masker.mask(rmid, blk, &file));
        if a == b {
            report.equal_after_masking += 1;
            continue;
        }
        let subset = a.iter().zip(&b).all(|(stored, file)| stored & !file == 0);
        if rel.forknum == ForkNumber::VisibilityMap && src.wal_log_dbs.contains(&rel.dbnode) && subset {
            report.vm_pages_with_bits_lost_in_copy += 1;
            continue;
        }
        if rmid == Some(RM_SEQ_ID) {
            let increment = src.kinds[&(rel.spcnode, rel.dbnode, rel.relnode)].seq_increment;
            if sequence_logged_ahead(&stored, &file, increment, masker, blk) {
                report.sequences_logged_ahead += 1;
                continue;
            }
        }
        if rmid == Some(RM_SPGIST_ID) && spgist_metapage_cache_differs(&stored, &file, masker, blk) {
            report.spgist_metapage_caches += 1;
            continue;
        }
        report.mismatches.push(format!("{rel} block {blkno} (rmid {rmid:?}) at {lsn} after masking: {}", describe_difference(&a, &b)));
    }
}

/// Compares the SLRU segments and two-phase state files at `lsn` with `pgdata`'s, byte
/// for byte. Returns the prepared transactions' xids found on disk.
pub fn compare_slrus_and_twophase(api: &PageApi, lsn: Lsn, pgdata: &Path, report: &mut Report) -> BTreeSet<u32> {
    for slru in SlruKind::ALL {
        let dir = pgdata.join(slru.dir_name());
        let mut on_disk = BTreeSet::new();
        for entry in fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let segno = u32::from_str_radix(&entry.file_name().to_string_lossy(), 16).unwrap();
            on_disk.insert(segno);
            let file = fs::read(entry.path()).unwrap();
            match api.get_slru_segment(slru, segno, lsn, TIMEOUT) {
                Ok(stored) if stored[..] == file[..] => report.slru_segments += 1,
                Ok(stored) => report.mismatches.push(format!(
                    "{slru} segment {segno:04X} differs at {lsn}: {} bytes stored, {} on disk, first difference at {:?}",
                    stored.len(),
                    file.len(),
                    stored.iter().zip(&file).position(|(a, b)| a != b)
                )),
                Err(e) => report.mismatches.push(format!("{slru} segment {segno:04X} at {lsn}: {e}")),
            }
        }
        let stored = api.datadir().list_slru_segments(slru, lsn).unwrap();
        assert_eq!(stored, on_disk, "{slru} segments in the store at {lsn} and on disk");
    }
    let mut on_disk = BTreeSet::new();
    for entry in fs::read_dir(pgdata.join("pg_twophase")).unwrap() {
        let entry = entry.unwrap();
        let xid = u32::from_str_radix(&entry.file_name().to_string_lossy(), 16).unwrap();
        on_disk.insert(xid);
        let stored = api.datadir().get_twophase_file(xid, lsn).unwrap();
        assert_eq!(stored, Bytes::from(fs::read(entry.path()).unwrap()), "pg_twophase/{xid:08X} at {lsn}");
        report.twophase_files += 1;
    }
    assert_eq!(api.datadir().list_twophase(lsn).unwrap(), on_disk, "prepared transactions at {lsn}");
    on_disk
}
