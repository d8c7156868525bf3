//! The data path end to end against real PostgreSQL 15: import a fresh `initdb`, run a
//! workload on a real server, stop it cleanly, ingest its WAL from `pg_wal`, and check that
//! the store holds exactly what the server left on disk.
//!
//! What is compared at the end LSN (the end of the final shutdown checkpoint), by
//! `support/compare.rs` (which documents the rules and the narrowly checked exceptions):
//! - the database list and, per database, the relation forks (main, visibility map, init;
//!   never the FSM), their sizes, and every block through `PageApi::get_page` against the
//!   file's, after PostgreSQL's own `rm_mask` where bytes differ;
//! - the CLOG, multixact offsets and members segments, the relation map files and the
//!   two-phase state file of a transaction left prepared, byte for byte;
//! - the checkpoint: the stored one is the record `pg_control` points at.
//!
//! `oracle.rs` does the same at several LSNs of a much larger workload.
//!
//! Needs our PostgreSQL build (`target/pg15`, see `tests/support`). Prints what it compared.

mod support;

use std::fs;
use std::sync::Arc;
use std::time::{Duration, Instant};

use layerstore::{Reconstructor, StorageConfig, Tenant};
use pageserver::pgdata::import::ControlFile;
use pageserver::pgdata::walredo::WalRedoManager;
use pageserver::{import_datadir, PageApi, PageApiError, PgReconstructor, WalIngest};
use proto::{BlockNumber, ForkNumber, Lsn, Oid, RelTag, TenantId, TimelineId};
use support::compare::{compare_relations, compare_slrus_and_twophase, relation_kinds, Masker, Report, Source, TIMEOUT};
use support::PgCluster;

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

#[test]
fn ingest_real_postgres_wal_and_compare_with_the_data_directory() {
    let started = Instant::now();
    let mut pg = PgCluster::initdb();
    let tenants = pg.dir.path().join("tenants");
    fs::create_dir(&tenants).unwrap();
    let tenant = Tenant::create(&tenants, TenantId([7; 16]), StorageConfig::default(), &[]).unwrap();
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
    // The tracked counters end where the shutdown checkpoint says recovery would be.
    let state = api.datadir().get_checkpoint_state(lsn).unwrap();
    assert_eq!(state.current, checkpoint, "the counters tracked through ingest are the shutdown checkpoint's");
    assert!(ingest.stats().rust_records > 0 && ingest.stats().images > 0, "{:?}", ingest.stats());

    let err = format!("{:#}", import_datadir(&timeline, &pg.pgdata).unwrap_err());
    assert!(err.contains(&format!("it already has data up to {lsn}")), "{err}");

    let masker = Masker::new(redo);
    let mut report = Report::default();
    let source = Source { pgdata: &pg.pgdata, kinds: &kinds, wal_log_dbs: &[db2].into() };
    compare_relations(&api, lsn, &source, &masker, &mut report);
    let prepared = compare_slrus_and_twophase(&api, lsn, &pg.pgdata, &mut report);
    assert_eq!(prepared.len(), 1, "one transaction is left prepared");
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
         compared in {compared:?}: {}; next xid {}",
        summary.relation_forks,
        summary.relation_blocks,
        summary.slru_segments,
        summary.import_lsn,
        wal.records,
        ingest.stats(),
        wal.start_lsn,
        wal.stopped_by,
        report.summary(&masker),
        checkpoint.next_xid,
    );
    if !report.mismatches.is_empty() {
        println!("server log:\n{}", pg.log());
    }
    assert!(report.mismatches.is_empty(), "{} mismatches:\n{}", report.mismatches.len(), report.mismatches.join("\n"));
    assert!(report.blocks > 3000 && report.equal_after_masking > 0 && report.slru_segments >= 3, "{report:?}");
}
