//! `changed_blocks` against real PostgreSQL 15 WAL: every block whose page differs between
//! an earlier LSN `d` and the end must be covered by the answer for `from = d`, and for an
//! earlier `from` with the entries' LSNs compared with `d`; unchanged relations and
//! databases must not be listed.
//!
//! `initdb`, import, then a server runs three phases: (0) tables to keep, to update, to
//! shrink by VACUUM, to `TRUNCATE`, to drop, with visibility-map bits set, and two
//! databases, one to drop and one to leave alone; `A` is the WAL insert LSN after it;
//! (1) updates (which clear visibility-map bits through heap records) and a VACUUM that
//! truncates a heap and its map; `M` after it; (2) `TRUNCATE` (a new relfilenode, the old
//! one dropped at commit), `DROP TABLE`, `DROP DATABASE`, `CREATE DATABASE` (`WAL_LOG`),
//! VACUUM setting map bits, inserts that extend a table; then a checkpoint and a clean stop.
//!
//! The WAL is ingested in stages so that the answer is read from every kind of layer: up to
//! `A`, then a flush, image layers over the whole key space and GC with its cutoff at the
//! last record (removing the delta layers the images cover, which hold only versions at or
//! below `A`); up to `M`, then a flush and L0 compaction; the rest stays partly in
//! in-memory layers (1 MiB checkpoint distance: ingest flushes L0 layers as it goes).
//!
//! For `d` in `{A, M}`, every block of every relation fork (main, visibility map, init) of
//! every database at `d` is read through WAL redo at `d` and at the end. A block is stale
//! if its page differs, or it no longer exists. Each stale block must be covered by the
//! answer with an LSN above `d`: the block listed, its fork listed with a size at or below
//! the block (or gone), or its database listed as dropped. Both the answer from `d` and the
//! one from `A` (used for `d = M` too, through the LSNs) are checked.
//!
//! Needs our PostgreSQL build (`target/pg15`, see `tests/support`). Prints what it compared.

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use layerstore::{Reconstructor, StorageConfig, Tenant};
use pageserver::pgdata::walredo::WalRedoManager;
use pageserver::{changed_blocks, import_datadir, ChangedBlocks, PageApi, PgReconstructor, WalIngest};
use proto::{BlockNumber, KeyRange, Lsn, Oid, RelTag, TenantId, TimelineId};
use support::PgCluster;

const PHASE_0: &str = r#"
CREATE TABLE keep (id int PRIMARY KEY, v text);
INSERT INTO keep SELECT g, repeat('k', 60) || g FROM generate_series(1, 5000) g;
CREATE TABLE hot (id int PRIMARY KEY, v text);
INSERT INTO hot SELECT g, repeat('h', 60) || g FROM generate_series(1, 5000) g;
CREATE TABLE shrink (id int, pad text);
INSERT INTO shrink SELECT g, repeat('p', 200) FROM generate_series(1, 6000) g;
CREATE TABLE trunc (id int);
INSERT INTO trunc SELECT generate_series(1, 3000);
CREATE TABLE gone (id int, pad text);
INSERT INTO gone SELECT g, repeat('g', 100) FROM generate_series(1, 2000) g;
CREATE TABLE vmt (id int, v int);
INSERT INTO vmt SELECT g, g FROM generate_series(1, 20000) g;
VACUUM keep;
VACUUM shrink;
VACUUM vmt;
CREATE DATABASE dropdb;
CREATE DATABASE keepdb;
"#;

const PHASE_0_DBS: &str = "CREATE TABLE x (id int PRIMARY KEY, v text); \
    INSERT INTO x SELECT g, md5(g::text) FROM generate_series(1, 3000) g;";

const PHASE_1: &str = r#"
UPDATE hot SET v = v || 'u' WHERE id % 50 = 0;
-- Heap updates on all-visible pages clear their visibility-map bits.
UPDATE vmt SET v = v + 1 WHERE id % 2000 = 0;
DELETE FROM shrink WHERE id > 700;
VACUUM shrink;
"#;

const PHASE_2: &str = r#"
TRUNCATE trunc;
INSERT INTO trunc VALUES (1);
DROP TABLE gone;
DROP DATABASE dropdb;
CREATE DATABASE newdb;
VACUUM hot;
INSERT INTO hot SELECT g, repeat('n', 60) || g FROM generate_series(5001, 8000) g;
CHECKPOINT;
"#;

/// Whether `answer` says that block `blkno` of `rel` may have changed after `d`.
fn covers(answer: &ChangedBlocks, rel: RelTag, blkno: u32, d: Lsn) -> bool {
    let db = answer.databases.iter().any(|x| (x.spcnode, x.dbnode) == (rel.spcnode, rel.dbnode) && x.lsn > d);
    let fork = answer.relations.iter().any(|r| r.rel == rel && r.lsn > d && r.nblocks.is_none_or(|n| blkno >= n));
    let block = answer.blocks.iter().any(|b| b.rel == rel && b.blkno.0 == blkno && b.lsn > d);
    db || fork || block
}

/// Every relation fork of every database at `lsn`, with its size.
fn forks_at(api: &PageApi, lsn: Lsn) -> BTreeMap<RelTag, u32> {
    let d = api.datadir();
    let mut forks = BTreeMap::new();
    for (spc, db) in d.list_dbs(lsn).unwrap() {
        for rel in d.list_rels(spc, db, lsn).unwrap() {
            forks.insert(rel, d.get_rel_size(rel, lsn).unwrap());
        }
    }
    forks
}

fn lsn_of(pg: &PgCluster) -> Lsn {
    pg.psql("postgres", "SELECT pg_current_wal_insert_lsn();").trim().parse().unwrap()
}

fn oid(pg: &PgCluster, db: &str, sql: &str) -> Oid {
    pg.psql(db, sql).trim().parse().unwrap()
}

#[derive(Debug, Default)]
struct Counts {
    blocks: usize,
    stale: usize,
    listed_unchanged: usize,
}

#[test]
fn every_block_that_differs_is_covered_and_unchanged_relations_are_not_listed() {
    let started = Instant::now();
    let mut pg = PgCluster::initdb();
    let tenants = pg.dir.path().join("tenants");
    fs::create_dir(&tenants).unwrap();
    let conf = StorageConfig { checkpoint_distance_bytes: 1 << 20, ..StorageConfig::default() };
    let tenant = Tenant::create(&tenants, TenantId([7; 16]), conf, &[]).unwrap();
    let timeline = tenant.create_timeline(TimelineId([8; 16])).unwrap();
    let summary = import_datadir(&timeline, &pg.pgdata).expect("import the initdb output");
    pg.configure(&[
        ("fsync", "off"),
        ("wal_level", "replica"),
        ("full_page_writes", "on"),
        ("wal_compression", "zstd"),
        ("autovacuum", "off"),
        ("wal_keep_size", "'1GB'"),
    ]);
    pg.start();
    pg.psql("postgres", PHASE_0);
    pg.psql("dropdb", PHASE_0_DBS);
    pg.psql("keepdb", PHASE_0_DBS);
    pg.psql("postgres", "CHECKPOINT;");
    let keep = RelTag {
        spcnode: 1663,
        dbnode: oid(&pg, "postgres", "SELECT oid FROM pg_database WHERE datname = 'postgres'"),
        relnode: oid(&pg, "postgres", "SELECT pg_relation_filenode('keep')"),
        forknum: proto::ForkNumber::Main,
    };
    let keepdb = oid(&pg, "postgres", "SELECT oid FROM pg_database WHERE datname = 'keepdb'");
    let dropdb = oid(&pg, "postgres", "SELECT oid FROM pg_database WHERE datname = 'dropdb'");
    let a = lsn_of(&pg);
    pg.psql("postgres", PHASE_1);
    let shrink_blocks: u32 = pg.psql("postgres", "SELECT pg_relation_size('shrink') / 8192").trim().parse().unwrap();
    let m = lsn_of(&pg);
    pg.psql("postgres", PHASE_2);
    pg.stop();
    let workload = started.elapsed();

    let redo = Arc::new(WalRedoManager::new(support::walredo_config()));
    let reconstructor: Arc<dyn Reconstructor> = Arc::new(PgReconstructor::new(redo));
    let mut ingest = WalIngest::new(timeline.clone(), reconstructor.clone());
    let pg_wal = pg.pgdata.join("pg_wal");
    let tli = summary.pg_timeline_id;
    ingest.ingest_pg_wal_until(&pg_wal, tli, summary.import_lsn, a).expect("ingest up to A");
    timeline.freeze_and_flush().unwrap();
    let at_a = timeline.last_record_lsn();
    let images = timeline.create_image_layers(&KeyRange::ALL, timeline.disk_consistent_lsn(), reconstructor.as_ref()).unwrap();
    let gc = timeline.gc(at_a, &[]).unwrap();
    assert!(!images.is_empty() && !gc.layers_removed.is_empty(), "images {images:?}, GC {gc:?}");
    ingest.ingest_pg_wal_until(&pg_wal, tli, timeline.last_record_lsn(), m).expect("ingest up to M");
    timeline.freeze_and_flush().unwrap();
    let compacted = timeline.compact_level0(true).unwrap();
    assert!(!compacted.l1_created.is_empty(), "{compacted:?}");
    let wal = ingest.ingest_pg_wal(&pg_wal, tli, timeline.last_record_lsn()).expect("ingest the rest");
    let to = wal.end_lsn;
    let layers: Vec<String> = timeline.layers().iter().map(|d| d.to_string()).collect();
    let ingested = started.elapsed() - workload;

    let err = changed_blocks(&timeline, Lsn(at_a.0 - 1), to, usize::MAX).unwrap_err();
    assert!(err.is_history_gone(), "below the GC cutoff: {err}");
    let api = PageApi::new(timeline.clone(), reconstructor);
    let from_a = changed_blocks(&timeline, a, to, usize::MAX).expect("changes since A");
    let from_m = changed_blocks(&timeline, m, to, usize::MAX).expect("changes since M");
    let listed = |c: &ChangedBlocks| (c.blocks.len(), c.relations.len(), c.databases.len());
    println!("layers: {layers:?}");
    println!("since A {a}: {:?} (blocks, relations, databases); since M {m}: {:?}; to {to}", listed(&from_a), listed(&from_m));

    // What the answer must say, by kind of change.
    let db_of = |dbnode: Oid| from_a.databases.iter().any(|d| d.dbnode == dbnode);
    assert!(db_of(dropdb), "the dropped database: {:?}", from_a.databases);
    assert!(!from_a.blocks.iter().chain(&from_m.blocks).any(|b| b.rel.dbnode == keepdb), "nothing of the untouched database");
    assert!(!from_a.relations.iter().chain(&from_m.relations).any(|r| r.rel.dbnode == keepdb));
    assert!(!from_a.blocks.iter().any(|b| b.rel == keep) && !from_a.relations.iter().any(|r| r.rel == keep), "nothing of keep");
    let truncated = from_a.relations.iter().filter(|r| r.nblocks.is_some_and(|n| n == shrink_blocks) && r.lsn <= m);
    assert!(truncated.count() >= 1, "the heap VACUUM truncated to {shrink_blocks} blocks: {:?}", from_a.relations);
    assert!(from_a.relations.iter().filter(|r| r.nblocks.is_none()).count() >= 2, "the old files of trunc and of gone");
    let vm_blocks = from_a.blocks.iter().filter(|b| b.rel.forknum == proto::ForkNumber::VisibilityMap).count();
    assert!(vm_blocks >= 2, "the map blocks of vmt (cleared) and hot (set)");

    let mut at_to: HashMap<(RelTag, u32), Option<Bytes>> = HashMap::new();
    let forks_to = forks_at(&api, to);
    let dir = api.datadir();
    let mut report: BTreeMap<String, Counts> = BTreeMap::new();
    for (d, answers) in [(a, vec![("from A", &from_a)]), (m, vec![("from A", &from_a), ("from M", &from_m)])] {
        for (rel, size) in forks_at(&api, d) {
            for blkno in 0..size {
                let before = dir.get_rel_page(rel, BlockNumber(blkno), d).unwrap();
                let after = at_to
                    .entry((rel, blkno))
                    .or_insert_with(|| {
                        let exists = forks_to.get(&rel).is_some_and(|n| blkno < *n);
                        exists.then(|| dir.get_rel_page(rel, BlockNumber(blkno), to).unwrap())
                    })
                    .clone();
                let stale = after.as_ref() != Some(&before);
                for (name, answer) in &answers {
                    let counts = report.entry(format!("d = {d} ({}), {name}", if d == a { "A" } else { "M" })).or_default();
                    counts.blocks += 1;
                    let covered = covers(answer, rel, blkno, d);
                    if stale {
                        counts.stale += 1;
                        assert!(covered, "{rel} block {blkno} differs between {d} and {to}, but the answer {name} does not cover it");
                    } else if answer.blocks.iter().any(|b| b.rel == rel && b.blkno.0 == blkno && b.lsn > d) {
                        counts.listed_unchanged += 1;
                    }
                }
            }
        }
    }
    let mut untouched_relations: BTreeSet<RelTag> = forks_to.keys().copied().collect();
    untouched_relations.retain(|rel| !from_a.relations.iter().any(|r| r.rel == *rel) && !from_a.blocks.iter().any(|b| b.rel == *rel));
    println!(
        "workload {workload:?}, ingest {ingested:?}, compared in {:?}; {} of {} forks at the end untouched since A",
        started.elapsed() - workload - ingested,
        untouched_relations.len(),
        forks_to.len()
    );
    for (what, counts) in &report {
        println!("{what}: {counts:?}");
        assert!(counts.stale > 0 && counts.stale < counts.blocks / 2, "{what}: {counts:?}");
        assert!(counts.listed_unchanged * 20 <= counts.stale, "{what}: blocks listed that did not change: {counts:?}");
    }
}
