//! The data path end to end against real PostgreSQL 15: import a fresh `initdb`, run a
//! workload on a real server, stop it cleanly, ingest its WAL from `pg_wal`, and check that
//! the store holds exactly what the server left on disk.
//!
//! What is compared at the end LSN (the end of the final shutdown checkpoint):
//! - the database list and, per database, the relation forks (main, visibility map, init;
//!   never the FSM, which is not stored; unlogged relations by their init fork only);
//! - every fork's size, and every block through `PageApi::get_page` (WAL redo by real
//!   `postgres --wal-redo` processes) against the file's block: equal bytes, or equal after
//!   PostgreSQL's own `rm_mask` for the relation's access method (hint bits, page LSN,
//!   unused space: what `wal_consistency_checking` ignores). Visibility-map pages are
//!   compared with only the page LSN and checksum masked: their bits must be equal. A map
//!   fork or page that the server extended without WAL (`vm_extend`) must be all zeros. In
//!   a database created with `STRATEGY WAL_LOG` the stored map may lack bits the server has:
//!   PostgreSQL 15 logs the copied map pages as standard pages (`log_newpage_buffer(buf,
//!   true)` in `RelationCopyStorageUsingBuffer`), so the bitmap, lying between `pd_lower`
//!   and `pd_upper`, is left out of the image as its "hole"; a standby has the same zeros;
//! - the CLOG, multixact offsets and members segments, the relation map files and the
//!   two-phase state file of a transaction left prepared, byte for byte;
//! - the checkpoint: the stored one is the record `pg_control` points at.
//!
//! Needs our PostgreSQL build (`target/pg15`, see `tests/support`). Prints what it compared.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use pageserver::import::ControlFile;
use pageserver::reconstruct::layout::{page_init, page_is_new};
use pageserver::walredo::WalRedoManager;
use pageserver::{import_datadir, PageApi, PageApiError, PgReconstructor, Reconstructor, StorageConfig, Tenant, WalIngest};
use pgwal::consts::*;
use proto::{BlockNumber, ForkNumber, Lsn, Oid, RelTag, SlruKind, TenantId, TimelineId};
use support::PgCluster;

const PAGE: usize = 8192;
const RELSEG_BLOCKS: u64 = 131072;
const TIMEOUT: Duration = Duration::from_secs(5);

const WORKLOAD: &str = r#"
CREATE TABLE t (id int PRIMARY KEY, v text, n int);
INSERT INTO t SELECT g, repeat('x', 40) || g, g % 100 FROM generate_series(1, 20000) g;
CREATE INDEX t_n ON t (n);
UPDATE t SET v = v || 'u' WHERE id % 7 = 0;
DELETE FROM t WHERE id % 11 = 0;
VACUUM t;
-- After the vacuum set visibility-map bits, these clear some of them again.
UPDATE t SET n = n + 1 WHERE id % 97 = 0;
DELETE FROM t WHERE id % 89 = 0;
SELECT id FROM t WHERE id = 1 FOR UPDATE;

CREATE TABLE toasty (id int, body text);
ALTER TABLE toasty ALTER body SET STORAGE EXTERNAL;
INSERT INTO toasty SELECT g, repeat(md5(g::text), 200) FROM generate_series(1, 40) g;

-- A heap and its visibility map cut short by vacuum's truncation.
CREATE TABLE shrink (id int, pad text);
INSERT INTO shrink SELECT g, repeat('p', 200) FROM generate_series(1, 6000) g;
VACUUM shrink;
DELETE FROM shrink WHERE id > 700;
VACUUM shrink;

CREATE TABLE gone (id int);
INSERT INTO gone VALUES (1);
DROP TABLE gone;
CREATE TABLE trunc (id int);
INSERT INTO trunc SELECT generate_series(1, 1000);
TRUNCATE trunc;
INSERT INTO trunc VALUES (1);
CREATE UNLOGGED TABLE ul (id int PRIMARY KEY);
INSERT INTO ul SELECT generate_series(1, 100);

-- Subtransactions: one rolled back, one released.
BEGIN;
INSERT INTO t VALUES (100001, 'a', 1);
SAVEPOINT s1;
INSERT INTO t VALUES (100002, 'b', 2);
ROLLBACK TO s1;
SAVEPOINT s2;
INSERT INTO t VALUES (100003, 'c', 3);
RELEASE s2;
COMMIT;
BEGIN;
INSERT INTO t VALUES (100004, 'd', 4);
ROLLBACK;

-- A row share-locked by a prepared transaction and by another one: a multixact.
BEGIN;
SELECT id FROM t WHERE id = 2 FOR SHARE;
PREPARE TRANSACTION 'share1';
BEGIN;
SELECT id FROM t WHERE id = 2 FOR SHARE;
COMMIT;
COMMIT PREPARED 'share1';
BEGIN;
INSERT INTO t VALUES (100005, 'e', 5);
PREPARE TRANSACTION 'aborted1';
ROLLBACK PREPARED 'aborted1';
-- Left prepared: its state file is in pg_twophase after the shutdown.
BEGIN;
INSERT INTO t VALUES (100006, 'f', 6);
PREPARE TRANSACTION 'open1';

CREATE DATABASE db2;
CREATE DATABASE db3 STRATEGY FILE_COPY;
CREATE DATABASE dropme;
DROP DATABASE dropme;
"#;

const WORKLOAD_DB2: &str = "CREATE TABLE x2 (id int, v text); \
    INSERT INTO x2 SELECT g, md5(g::text) FROM generate_series(1, 3000) g; \
    CREATE INDEX x2_v ON x2 (v); DELETE FROM x2 WHERE id % 3 = 0; VACUUM x2;";
const WORKLOAD_DB3: &str = "CREATE TABLE x3 (id int); INSERT INTO x3 SELECT generate_series(1, 500);";

/// Relation kind and access method of each relation file, from `pg_class` of every
/// database: (spcnode, dbnode, relnode) -> (relkind, amname).
type Kinds = BTreeMap<(Oid, Oid, Oid), (String, String)>;

fn relation_kinds(pg: &PgCluster) -> Kinds {
    let mut kinds = Kinds::new();
    let dbs = pg.rows("postgres", "SELECT oid, datname, datallowconn FROM pg_database");
    let query = "SELECT pg_relation_filenode(c.oid), c.relisshared, c.relkind, coalesce(am.amname, '') \
                 FROM pg_class c LEFT JOIN pg_am am ON am.oid = c.relam WHERE pg_relation_filenode(c.oid) IS NOT NULL";
    let mut template1 = Vec::new();
    for db in dbs.iter().filter(|d| d[2] == "t") {
        let dboid: Oid = db[0].parse().unwrap();
        for r in pg.rows(&db[1], query) {
            let relnode: Oid = r[0].parse().unwrap();
            let key = if r[1] == "t" { (1664, 0, relnode) } else { (1663, dboid, relnode) };
            kinds.insert(key, (r[2].clone(), r[3].clone()));
            if db[1] == "template1" && r[1] == "f" {
                template1.push((relnode, (r[2].clone(), r[3].clone())));
            }
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
/// and checksum.
fn mask_rmid(kinds: &Kinds, rel: RelTag) -> Option<u8> {
    if rel.forknum == ForkNumber::VisibilityMap {
        return None;
    }
    let (relkind, am) = kinds.get(&(rel.spcnode, rel.dbnode, rel.relnode))?;
    match (relkind.as_str(), am.as_str()) {
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
struct Masker {
    redo: Option<Arc<WalRedoManager>>,
}

impl Masker {
    fn new(redo: Arc<WalRedoManager>) -> Masker {
        match redo.mask_page(RM_HEAP_ID, BlockNumber(0), &page_init()) {
            Ok(_) => Masker { redo: Some(redo) },
            Err(e) => {
                println!("NOTE: the WAL redo process cannot mask pages ({e}); masking locally: LSN, checksum, heap hint bits");
                Masker { redo: None }
            }
        }
    }

    fn mask(&self, rmid: Option<u8>, blkno: BlockNumber, page: &[u8]) -> Vec<u8> {
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
fn disk_rels(dir: &Path, spcnode: Oid, dbnode: Oid) -> BTreeMap<RelTag, Vec<PathBuf>> {
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

fn read_block(segments: &[PathBuf], blkno: u64) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = fs::File::open(&segments[(blkno / RELSEG_BLOCKS) as usize]).unwrap();
    f.seek(SeekFrom::Start((blkno % RELSEG_BLOCKS) * PAGE as u64)).unwrap();
    let mut page = vec![0u8; PAGE];
    f.read_exact(&mut page).unwrap();
    page
}

fn file_blocks(segments: &[PathBuf]) -> u64 {
    segments.iter().map(|s| fs::metadata(s).unwrap().len() / PAGE as u64).sum()
}

#[derive(Default, Debug)]
struct Report {
    relation_forks: usize,
    blocks: u64,
    identical: u64,
    equal_after_masking: u64,
    vm_pages_only_on_disk: u64,
    /// Map pages whose stored bits are a strict subset of the file's, in a WAL_LOG copy.
    vm_pages_with_bits_lost_in_copy: u64,
    slru_segments: usize,
    mismatches: Vec<String>,
}

fn describe_difference(a: &[u8], b: &[u8]) -> String {
    let diffs: Vec<usize> = (0..PAGE).filter(|&i| a[i] != b[i]).collect();
    format!("{} bytes differ, first at {:?}", diffs.len(), &diffs[..diffs.len().min(8)])
}

fn compare_relations(
    api: &PageApi,
    lsn: Lsn,
    pgdata: &Path,
    kinds: &Kinds,
    wal_log_dbs: &BTreeSet<Oid>,
    masker: &Masker,
    report: &mut Report,
) {
    let datadir = api.datadir();
    let dbs = datadir.list_dbs(lsn).unwrap();
    let mut disk_dbs: BTreeSet<(Oid, Oid)> = [(1664, 0)].into();
    for entry in fs::read_dir(pgdata.join("base")).unwrap() {
        disk_dbs.insert((1663, entry.unwrap().file_name().to_string_lossy().parse().unwrap()));
    }
    assert_eq!(dbs, disk_dbs, "databases in the store and in base/");
    for (spc, db) in dbs {
        let dir = if spc == 1664 { pgdata.join("global") } else { pgdata.join("base").join(db.to_string()) };
        let on_disk = disk_rels(&dir, spc, db);
        let stored = api.list_rels(spc, db, lsn, TIMEOUT).unwrap();
        for (rel, segments) in &on_disk {
            if !stored.contains(rel) {
                // vm_extend creates and extends the map without WAL; such pages are zeros.
                let all_zero = (0..file_blocks(segments)).all(|b| read_block(segments, b).iter().all(|&x| x == 0));
                if rel.forknum == ForkNumber::VisibilityMap && all_zero {
                    report.vm_pages_only_on_disk += file_blocks(segments);
                } else {
                    report.mismatches.push(format!("{rel} is on disk but not in the store"));
                }
            }
        }
        for rel in stored {
            let Some(segments) = on_disk.get(&rel) else {
                report.mismatches.push(format!("{rel} is in the store but not on disk"));
                continue;
            };
            report.relation_forks += 1;
            let size = api.get_rel_size(rel, lsn, TIMEOUT).unwrap();
            let disk = file_blocks(segments);
            if rel.forknum == ForkNumber::VisibilityMap && disk > u64::from(size) {
                for b in u64::from(size)..disk {
                    if read_block(segments, b).iter().all(|&x| x == 0) {
                        report.vm_pages_only_on_disk += 1;
                    } else {
                        report.mismatches.push(format!("{rel} block {b} is beyond the stored size {size} but not zeros"));
                    }
                }
            } else if disk != u64::from(size) {
                report.mismatches.push(format!("{rel} has {size} blocks in the store, {disk} on disk"));
                continue;
            }
            let rmid = mask_rmid(kinds, rel);
            for blkno in 0..size {
                report.blocks += 1;
                let stored = api.get_page(rel, BlockNumber(blkno), lsn, TIMEOUT).unwrap_or_else(|e| panic!("get_page {rel} {blkno}: {e}"));
                let file = read_block(segments, u64::from(blkno));
                if stored[..] == file[..] {
                    report.identical += 1;
                    continue;
                }
                // A new (all-zero) page cannot be masked; a difference there is real.
                if !page_is_new(&stored) && !page_is_new(&file) {
                    let (a, b) = (masker.mask(rmid, BlockNumber(blkno), &stored), masker.mask(rmid, BlockNumber(blkno), &file));
                    if a == b {
                        report.equal_after_masking += 1;
                        continue;
                    }
                    let subset = a.iter().zip(&b).all(|(stored, file)| stored & !file == 0);
                    if rel.forknum == ForkNumber::VisibilityMap && wal_log_dbs.contains(&rel.dbnode) && subset {
                        report.vm_pages_with_bits_lost_in_copy += 1;
                        continue;
                    }
                    report.mismatches.push(format!("{rel} block {blkno} (rmid {rmid:?}) after masking: {}", describe_difference(&a, &b)));
                } else {
                    report.mismatches.push(format!("{rel} block {blkno}: {}", describe_difference(&stored, &file)));
                }
            }
        }
        if let Ok(map) = fs::read(dir.join("pg_filenode.map")) {
            let stored = datadir.get_relmap(spc, db, lsn).unwrap();
            if stored[..] != map[..] {
                report.mismatches.push(format!("relation map of {spc}/{db} differs"));
            }
        }
    }
}

fn compare_slrus_and_twophase(api: &PageApi, lsn: Lsn, pgdata: &Path, report: &mut Report) {
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
                    "{slru} segment {segno:04X} differs: {} bytes stored, {} on disk, first difference at {:?}",
                    stored.len(),
                    file.len(),
                    stored.iter().zip(&file).position(|(a, b)| a != b)
                )),
                Err(e) => report.mismatches.push(format!("{slru} segment {segno:04X}: {e}")),
            }
        }
        let stored = api.datadir().list_slru_segments(slru, lsn).unwrap();
        assert_eq!(stored, on_disk, "{slru} segments in the store and on disk");
    }
    let mut on_disk = BTreeSet::new();
    for entry in fs::read_dir(pgdata.join("pg_twophase")).unwrap() {
        let entry = entry.unwrap();
        let xid = u32::from_str_radix(&entry.file_name().to_string_lossy(), 16).unwrap();
        on_disk.insert(xid);
        let stored = api.datadir().get_twophase_file(xid, lsn).unwrap();
        assert_eq!(stored, Bytes::from(fs::read(entry.path()).unwrap()), "pg_twophase/{xid:08X}");
    }
    assert_eq!(on_disk.len(), 1, "one transaction is left prepared");
    assert_eq!(api.datadir().list_twophase(lsn).unwrap(), on_disk);
}

#[test]
fn ingest_real_postgres_wal_and_compare_with_the_data_directory() {
    let started = Instant::now();
    let mut pg = PgCluster::initdb();
    let tenants = pg.dir.path().join("tenants");
    fs::create_dir(&tenants).unwrap();
    let tenant = Tenant::create(&tenants, TenantId([7; 16]), StorageConfig::default()).unwrap();
    let timeline = tenant.create_timeline(TimelineId([8; 16])).unwrap();
    let summary = import_datadir(&timeline, &pg.pgdata).expect("import the initdb output");
    assert!(summary.import_lsn > summary.checkpoint_lsn);
    assert_eq!(timeline.last_record_lsn(), summary.import_lsn);
    assert_eq!(summary.databases, 4, "global, template1, template0, postgres");
    let imported = started.elapsed();

    pg.configure(&[
        ("fsync", "off"),
        ("wal_level", "replica"),
        ("full_page_writes", "on"),
        ("max_prepared_transactions", "5"),
        ("wal_compression", "zstd"),
        ("autovacuum", "off"),
        // Two checkpoints would otherwise recycle the WAL after the import LSN.
        ("wal_keep_size", "'1GB'"),
    ]);
    pg.start();
    let other = tenant.create_timeline(TimelineId([9; 16])).unwrap();
    let err = format!("{:#}", import_datadir(&other, &pg.pgdata).unwrap_err());
    assert!(err.contains("the server was not shut down cleanly (database state 6)"), "{err}");
    pg.psql("postgres", WORKLOAD);
    pg.psql("db2", WORKLOAD_DB2);
    pg.psql("db3", WORKLOAD_DB3);
    let kinds = relation_kinds(&pg);
    let db2: Oid = pg.psql("postgres", "SELECT oid FROM pg_database WHERE datname = 'db2'").trim().parse().unwrap();
    pg.psql("postgres", "CHECKPOINT;");
    pg.stop();
    let workload = started.elapsed() - imported;

    let redo = Arc::new(WalRedoManager::new(support::walredo_config()));
    let reconstructor: Arc<dyn Reconstructor> = Arc::new(PgReconstructor::new(redo.clone()));
    let mut ingest = WalIngest::new(timeline.clone(), reconstructor.clone());
    let wal = ingest.ingest_pg_wal(&pg.pgdata.join("pg_wal"), summary.pg_timeline_id, summary.import_lsn).expect("ingest pg_wal");
    let ingested = started.elapsed() - imported - workload;
    let control = ControlFile::parse(&fs::read(pg.pgdata.join("global/pg_control")).unwrap()).unwrap();
    let lsn = wal.end_lsn;
    assert!(lsn > control.checkpoint_lsn, "ingest reached the final checkpoint: {wal:?}");
    let api = PageApi::new(timeline.clone(), reconstructor);
    let (checkpoint_lsn, checkpoint) = api.datadir().get_checkpoint(lsn).unwrap();
    assert_eq!(checkpoint_lsn, control.checkpoint_lsn, "the stored checkpoint is the one pg_control names");
    assert_eq!(checkpoint.redo, control.checkpoint_lsn, "a shutdown checkpoint's redo point is itself");
    assert!(checkpoint.next_multi.0 > 1, "the workload created a multixact");
    assert!(ingest.stats().rust_records > 0 && ingest.stats().images > 0, "{:?}", ingest.stats());

    let err = format!("{:#}", import_datadir(&timeline, &pg.pgdata).unwrap_err());
    assert!(err.contains(&format!("it already has data up to {lsn}")), "{err}");

    let masker = Masker::new(redo);
    let mut report = Report::default();
    compare_relations(&api, lsn, &pg.pgdata, &kinds, &[db2].into(), &masker, &mut report);
    compare_slrus_and_twophase(&api, lsn, &pg.pgdata, &mut report);
    let compared = started.elapsed() - imported - workload - ingested;

    // The API's refusals, on real relations.
    let pg_class = RelTag { spcnode: 1663, dbnode: 5, relnode: 1259, forknum: ForkNumber::Main };
    let size = api.get_rel_size(pg_class, lsn, TIMEOUT).unwrap();
    let err = api.get_page(pg_class, BlockNumber(size), lsn, TIMEOUT).unwrap_err();
    assert!(matches!(err, PageApiError::BlockBeyondEnd { .. }), "{err}");
    assert_eq!(err.to_string(), format!("cannot read block {size} of relation base/5/1259 at LSN {lsn}: the relation has {size} blocks"));
    let err = api.get_page(pg_class, BlockNumber(0), Lsn(lsn.0 + 8), Duration::from_millis(50)).unwrap_err();
    assert!(err.to_string().contains(&format!("waiting for LSN {} to be ingested: last record LSN is {lsn}", Lsn(lsn.0 + 8))), "{err}");

    println!(
        "import: {} relation forks, {} blocks, {} SLRU segments at {} in {imported:?}\n\
         workload: {workload:?}\n\
         ingest: {} records ({:?}) from {} to {lsn} in {ingested:?}; stopped by: {}\n\
         compared: {} relation forks, {} blocks ({} identical, {} equal after masking by {}), \
         {} visibility-map pages only on disk (zeros), {} visibility-map pages with bits lost in the WAL_LOG copy, \
         {} SLRU segments, next xid {} in {compared:?}",
        summary.relation_forks,
        summary.relation_blocks,
        summary.slru_segments,
        summary.import_lsn,
        wal.records,
        ingest.stats(),
        wal.start_lsn,
        wal.stopped_by,
        report.relation_forks,
        report.blocks,
        report.identical,
        report.equal_after_masking,
        if masker.redo.is_some() { "PostgreSQL's rm_mask" } else { "the local fallback" },
        report.vm_pages_only_on_disk,
        report.vm_pages_with_bits_lost_in_copy,
        report.slru_segments,
        checkpoint.next_xid,
    );
    if !report.mismatches.is_empty() {
        println!("server log:\n{}", pg.log());
    }
    assert!(report.mismatches.is_empty(), "{} mismatches:\n{}", report.mismatches.len(), report.mismatches.join("\n"));
    assert!(report.blocks > 3000 && report.equal_after_masking > 0 && report.slru_segments >= 3, "{report:?}");
}
