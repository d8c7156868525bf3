//! The oracle test: a plain PostgreSQL 15 of our build (md.c storage) is the reference.
//!
//! A fresh `initdb` is imported; a real server then runs a mixed workload in phases:
//! (a) `pgbench -i -s 10` and `pgbench -T 10 -c 4`; (b) DDL: GIN (array, tsvector), GiST
//! (point with a sorted build, box with a buffered build, tsvector), SP-GiST and hash index
//! builds, BRIN (also `brin_revmap_pages_through_wal_redo` at the end), a B-tree built on
//! the big table, changes after the builds, `VACUUM`,
//! `VACUUM FULL`, `TRUNCATE`, a rewriting `ALTER TABLE ADD COLUMN`, a sequence; (c)
//! `CREATE DATABASE` with both strategies, `DROP DATABASE`, a transaction with 200
//! subtransactions (past the 64 cached in `PGPROC`), thousands of multixacts from
//! concurrent `FOR SHARE` / `FOR KEY SHARE` sessions and an update under a key-share lock,
//! and two-phase commit. After each phase, a `CHECKPOINT` (with no other activity) makes
//! the files on disk equal to the server's state at the WAL insert position that follows
//! it; that LSN is recorded and every relation file, relation map, SLRU segment and
//! two-phase file is copied into a snapshot. The server is then stopped cleanly, and the
//! data directory is the last snapshot, at the end of WAL.
//!
//! The pageserver ingests the WAL from `pg_wal` in stages, and between comparisons the
//! storage engine does its real work: flushes, L0 compaction, image layers over the whole
//! key space rebuilt by WAL redo (`PgReconstructor`) at LSNs between checkpoints, and GC
//! with a cutoff below the first compared LSN, which must remove layers.
//!
//! At every snapshot LSN, `support/compare.rs` checks every relation fork the snapshot has
//! (main, map, init; never the FSM, which is not stored) for existence, size and every
//! block through `PageApi::get_page`, equal after PostgreSQL's own `rm_mask` for the
//! relation's access method; relation maps, SLRU segments and two-phase files byte for
//! byte; and that the stored checkpoint is the one the snapshot's `pg_control` names. The
//! exceptions compare.rs allows are counted and printed; so are the timings.
//!
//! Snapshots are taken with autovacuum off, so that nothing changes a page between a
//! snapshot's `CHECKPOINT` and its copy. The test binary is unoptimized, so the layers use
//! 8 KiB blocks (less to decompress per read) and the comparison runs on two threads.
//!
//! Needs our PostgreSQL build (`target/pg15`, see `tests/support`).

mod support;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use layerstore::{Reconstructor, StorageConfig, Tenant, Timeline};
use pageserver::pgdata::import::ControlFile;
use pageserver::pgdata::walredo::WalRedoManager;
use pageserver::{import_datadir, PageApi, PgReconstructor, WalIngest};
use proto::{KeyRange, Lsn, Oid, SlruKind, TenantId, TimelineId};
use support::compare::{compare_relations, compare_slrus_and_twophase, relation_kinds, Kinds, Masker, Report, Source};
use support::PgCluster;

const PHASE_B: &str = r#"
CREATE TABLE docs (id bigserial PRIMARY KEY, tags int[], body text, tsv tsvector, pos point, bx box);
INSERT INTO docs (tags, body, pos, bx)
    SELECT ARRAY[g % 50, g % 7, (g * 13) % 101], md5(g::text) || ' ' || md5((g * 7)::text) || ' w' || (g % 300),
           point(g % 200, g / 200), box(point(g % 200, g / 200), point(g % 200 + 2, g / 200 + 3))
    FROM generate_series(1, 30000) g;
UPDATE docs SET tsv = to_tsvector('simple', body);
-- A volatile default: the table is rewritten (and its primary key rebuilt).
ALTER TABLE docs ADD COLUMN added timestamptz DEFAULT clock_timestamp();
CREATE INDEX docs_tags ON docs USING gin (tags);
CREATE INDEX docs_tsv ON docs USING gin (tsv) WITH (fastupdate = off);
CREATE INDEX docs_pos ON docs USING gist (pos);
CREATE INDEX docs_bx ON docs USING gist (bx) WITH (buffering = on);
CREATE INDEX docs_tsv_gist ON docs USING gist (tsv);
CREATE INDEX docs_pos_spgist ON docs USING spgist (pos);
CREATE INDEX docs_id_hash ON docs USING hash (id);
CREATE INDEX docs_id_brin ON docs USING brin (id) WITH (pages_per_range = 4);
-- Changes after the builds: GIN's pending list, splits in every index, dead tuples.
INSERT INTO docs (tags, body, pos, bx)
    SELECT ARRAY[g % 5, 1000 + g], 'late ' || g, point(g % 90, g % 70), box(point(g, g), point(g + 1, g + 1))
    FROM generate_series(1, 5000) g;
UPDATE docs SET tsv = to_tsvector('simple', body) WHERE tsv IS NULL;
UPDATE docs SET tags = tags || 999 WHERE id % 10 = 0;
DELETE FROM docs WHERE id % 17 = 0;
CREATE INDEX pgbench_accounts_bid_abalance ON pgbench_accounts (bid, abalance);
VACUUM docs;
VACUUM pgbench_accounts;
VACUUM FREEZE pgbench_branches;
VACUUM FULL pgbench_tellers;
TRUNCATE pgbench_history;
INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) SELECT g % 100 + 1, g % 10 + 1, g, g, now() FROM generate_series(1, 2000) g;
-- A non-volatile default: only the catalogs change.
ALTER TABLE pgbench_branches ADD COLUMN note text DEFAULT 'n';
CREATE SEQUENCE counter;
SELECT count(nextval('counter')) FROM generate_series(1, 45);
"#;

const PHASE_C_DATABASES: &str = r#"
CREATE DATABASE dbw STRATEGY WAL_LOG;
CREATE DATABASE dbf STRATEGY FILE_COPY;
CREATE DATABASE dropme;
"#;

const PHASE_C_TABLES: &str = r#"
CREATE TABLE t (id int PRIMARY KEY, v text);
INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 5000) g;
CREATE INDEX t_v ON t (v);
DELETE FROM t WHERE id % 3 = 0;
VACUUM t;
"#;

const PHASE_C_TWOPHASE: &str = r#"
CREATE TABLE twopc (id int, v text);
BEGIN; INSERT INTO twopc VALUES (1, 'committed'); PREPARE TRANSACTION 'p_commit';
COMMIT PREPARED 'p_commit';
BEGIN; INSERT INTO twopc VALUES (2, 'rolled back'); PREPARE TRANSACTION 'p_abort';
ROLLBACK PREPARED 'p_abort';
-- Open across the third snapshot (so pg_twophase has its file), committed after it.
BEGIN; INSERT INTO twopc VALUES (3, 'open'); SAVEPOINT s; INSERT INTO twopc VALUES (4, 'sub');
SELECT aid FROM pgbench_accounts WHERE aid = 5 FOR SHARE;
PREPARE TRANSACTION 'p_open';
"#;

/// Rows session A share-locks; each of as many short transactions locks one of them too,
/// making one multixact each: enough to fill more than one page of offsets (2048 per page)
/// and of members (1636 per page).
const MULTIXACT_ROWS: u32 = 2100;

/// One transaction with many subtransactions: some rolled back, most released, far more
/// than the 64 `PGPROC` caches (`PGPROC_MAX_CACHED_SUBXIDS`), so assignment records are
/// logged and the subxid cache overflows. Then an aborted one with many subtransactions.
fn subtransactions_sql() -> String {
    let mut sql = String::from("CREATE TABLE subx (id int, v text);\nBEGIN;\nINSERT INTO subx VALUES (0, 'top');\n");
    for i in 1..=200 {
        let end = if i % 3 == 0 { "ROLLBACK TO SAVEPOINT s; RELEASE SAVEPOINT s;" } else { "RELEASE SAVEPOINT s;" };
        writeln!(sql, "SAVEPOINT s; INSERT INTO subx VALUES ({i}, 'sub'); {end}").unwrap();
    }
    sql.push_str("COMMIT;\nBEGIN;\n");
    for i in 1..=80 {
        writeln!(sql, "SAVEPOINT s; INSERT INTO subx VALUES ({}, 'aborted'); RELEASE SAVEPOINT s;", 1000 + i).unwrap();
    }
    sql.push_str("ROLLBACK;\n");
    sql.push_str(
        "DO $$ BEGIN FOR i IN 1..150 LOOP BEGIN INSERT INTO subx VALUES (2000 + i, 'plpgsql'); \
         IF i % 4 = 0 THEN RAISE EXCEPTION 'roll back %', i; END IF; \
         EXCEPTION WHEN raise_exception THEN NULL; END; END LOOP; END $$;\n",
    );
    sql
}

/// Concurrent sessions whose row locks make multixacts: A holds `FOR SHARE` and
/// `FOR KEY SHARE` locks while other transactions lock the same rows and update a non-key
/// column of key-share-locked rows.
fn multixacts(pg: &PgCluster) {
    let mut a = pg.session("postgres");
    a.send(&format!(
        "BEGIN; SELECT count(*) FROM (SELECT aid FROM pgbench_accounts WHERE aid <= {MULTIXACT_ROWS} FOR SHARE) s; \
         SELECT count(*) FROM (SELECT aid FROM pgbench_accounts WHERE aid BETWEEN 5001 AND 5100 FOR KEY SHARE) s;"
    ));
    // Idle after its last statement, not between the two.
    let idle = "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction' AND query LIKE '%FOR KEY SHARE%'";
    pg.wait_for("postgres", idle, "1");
    let mut b = String::new();
    for aid in 1..=MULTIXACT_ROWS {
        writeln!(b, "BEGIN; SELECT 1 FROM pgbench_accounts WHERE aid = {aid} FOR SHARE; COMMIT;").unwrap();
    }
    // A third locker on some rows, while A is still open, in one transaction.
    b.push_str("BEGIN; SELECT count(*) FROM (SELECT aid FROM pgbench_accounts WHERE aid <= 300 FOR SHARE) s;\n");
    b.push_str("UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid BETWEEN 5001 AND 5100; COMMIT;\n");
    pg.psql("postgres", &b);
    a.finish("COMMIT;");
}

/// A snapshot of the source: the files as of `lsn`, and how to mask them.
struct Snapshot {
    name: &'static str,
    lsn: Lsn,
    dir: PathBuf,
    kinds: Kinds,
    wal_log_dbs: BTreeSet<Oid>,
}

/// Copies what is compared (`base/`, `global/`, SLRUs, `pg_twophase`) from `pgdata` to `dest`.
fn copy_datadir(pgdata: &Path, dest: &Path) -> u64 {
    fn copy_dir(from: &Path, to: &Path) -> u64 {
        fs::create_dir_all(to).unwrap();
        let mut bytes = 0;
        for entry in fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let ty = entry.file_type().unwrap();
            if ty.is_dir() {
                bytes += copy_dir(&entry.path(), &to.join(entry.file_name()));
            } else if ty.is_file() {
                bytes += fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
            }
        }
        bytes
    }
    ["base", "global", "pg_xact", "pg_multixact", "pg_twophase"].iter().map(|d| copy_dir(&pgdata.join(d), &dest.join(d))).sum()
}

/// `CHECKPOINT`, then the WAL insert position from the same session (its catalog lookups
/// were made before the checkpoint, so nothing changes a page after it), then the copy.
fn take_snapshot(pg: &PgCluster, name: &'static str, wal_log_dbs: &BTreeSet<Oid>) -> Snapshot {
    let kinds = relation_kinds(pg);
    let out = pg.psql("postgres", "SELECT pg_current_wal_insert_lsn(); CHECKPOINT; SELECT pg_current_wal_insert_lsn();");
    let lsn: Lsn = out.lines().nth(1).expect("two LSNs").parse().expect("an LSN");
    let dir = pg.dir.path().join(format!("snapshot-{name}"));
    let bytes = copy_datadir(&pg.pgdata, &dir);
    // For whoever debugs a mismatch: which relation is which.
    let listing: String = kinds.iter().map(|((spc, db, rel), k)| format!("{spc}/{db}/{rel} {} {}\n", k.relkind, k.am)).collect();
    fs::write(dir.join("relation-kinds.txt"), listing).unwrap();
    println!("snapshot {name}: LSN {lsn}, {} MiB copied", bytes >> 20);
    Snapshot { name, lsn, dir, kinds, wal_log_dbs: wal_log_dbs.clone() }
}

fn db_oid(pg: &PgCluster, name: &str) -> Oid {
    pg.psql("postgres", &format!("SELECT oid FROM pg_database WHERE datname = '{name}'")).trim().parse().unwrap()
}

/// The storage engine's work between comparisons, with its own timing.
struct Engine<'a> {
    timeline: &'a Arc<Timeline>,
    reconstructor: &'a dyn Reconstructor,
    log: Vec<String>,
}

impl Engine<'_> {
    fn flush_and_compact(&mut self) {
        let started = Instant::now();
        self.timeline.freeze_and_flush().unwrap();
        let compacted = self.timeline.compact_level0(true).unwrap();
        self.log.push(format!(
            "flush and compaction at {}: {} L0 layers into {} L1 layers in {:?}",
            self.timeline.last_record_lsn(),
            compacted.l0_removed.len(),
            compacted.l1_created.len(),
            started.elapsed()
        ));
    }

    /// Image layers over the whole key space at the last record LSN.
    fn image_layers(&mut self) -> Lsn {
        let started = Instant::now();
        let lsn = self.timeline.last_record_lsn();
        let created = self.timeline.create_image_layers(&KeyRange::ALL, lsn, self.reconstructor).unwrap();
        self.log.push(format!("{} image layers at {lsn} in {:?}", created.len(), started.elapsed()));
        lsn
    }
}

#[derive(Default)]
struct Totals {
    relation_forks: usize,
    blocks: u64,
    exceptions: u64,
    mismatches: Vec<String>,
}

fn compare_snapshot(api: &PageApi, snap: &Snapshot, masker: &Masker, totals: &mut Totals) {
    let started = Instant::now();
    let mut report = Report::default();
    let source = Source { pgdata: &snap.dir, kinds: &snap.kinds, wal_log_dbs: &snap.wal_log_dbs };
    compare_relations(api, snap.lsn, &source, masker, &mut report);
    compare_slrus_and_twophase(api, snap.lsn, &snap.dir, &mut report);
    let control = ControlFile::parse(&fs::read(snap.dir.join("global/pg_control")).unwrap()).unwrap();
    let (checkpoint_lsn, _) = api.datadir().get_checkpoint(snap.lsn).unwrap();
    if checkpoint_lsn != control.checkpoint_lsn {
        report
            .mismatches
            .push(format!("{}: the stored checkpoint is at {checkpoint_lsn}, pg_control names {}", snap.name, control.checkpoint_lsn));
    }
    println!("compared {} at {} in {:?}: {}", snap.name, snap.lsn, started.elapsed(), report.summary(masker));
    totals.relation_forks += report.relation_forks;
    totals.blocks += report.blocks;
    totals.exceptions += report.exceptions();
    totals.mismatches.extend(report.mismatches.into_iter().map(|m| format!("{}: {m}", snap.name)));
}

#[test]
fn pageserver_matches_postgres_at_every_checkpoint_of_a_mixed_workload() {
    let started = Instant::now();
    let mut pg = PgCluster::initdb();
    let tenants = pg.dir.path().join("tenants");
    fs::create_dir(&tenants).unwrap();
    // Small layers, so that flushes, compaction and image creation cut several files; small
    // blocks and zstd's fast mode, so that reads decompress little and compaction runs
    // quickly in the unoptimized test build (both are hostile values the engine must take).
    let conf = StorageConfig {
        block_size_bytes: 8192,
        compression_level: -10,
        checkpoint_distance_bytes: 32 << 20,
        compaction_target_size_bytes: 32 << 20,
        image_layer_target_size_bytes: 32 << 20,
        ..StorageConfig::default()
    };
    let tenant = Tenant::create(&tenants, TenantId([1; 16]), conf, &[]).unwrap();
    let timeline = tenant.create_timeline(TimelineId([2; 16])).unwrap();
    let summary = import_datadir(&timeline, &pg.pgdata).expect("import the initdb output");

    pg.configure(&[
        ("fsync", "off"),
        ("wal_level", "replica"),
        // As on computes: the WAL has no full-page images but the ones PostgreSQL forces
        // (index builds, `log_newpage`), so every other page is rebuilt from records alone.
        ("full_page_writes", "off"),
        ("max_prepared_transactions", "5"),
        ("wal_compression", "zstd"),
        // Nothing may run between a snapshot's CHECKPOINT and its copy.
        ("autovacuum", "off"),
        // No WAL after the import LSN may be recycled before it is ingested.
        ("wal_keep_size", "'4GB'"),
        ("max_wal_size", "'4GB'"),
    ]);
    pg.start();
    let mut snapshots = Vec::new();
    let mut timings = Vec::new();
    let mut phase_started = Instant::now();
    let mut phase = |name: &str, timings: &mut Vec<String>| {
        timings.push(format!("{name} {:.1?}", phase_started.elapsed()));
        phase_started = Instant::now();
    };

    pg.pgbench("postgres", &["-i", "-s", "10", "-q"]);
    let run = pg.pgbench("postgres", &["-T", "10", "-c", "4", "-j", "2"]);
    let tps = run.lines().find(|l| l.starts_with("tps")).unwrap_or("tps unknown").to_string();
    phase("workload (a)", &mut timings);
    snapshots.push(take_snapshot(&pg, "a-pgbench", &BTreeSet::new()));
    phase("snapshot (a)", &mut timings);

    pg.psql("postgres", PHASE_B);
    phase("workload (b)", &mut timings);
    snapshots.push(take_snapshot(&pg, "b-ddl", &BTreeSet::new()));
    phase("snapshot (b)", &mut timings);

    pg.psql("postgres", PHASE_C_DATABASES);
    pg.psql("dbw", PHASE_C_TABLES);
    pg.psql("dbf", PHASE_C_TABLES);
    pg.psql("dropme", PHASE_C_TABLES);
    pg.psql("postgres", "DROP DATABASE dropme;");
    pg.psql("postgres", &subtransactions_sql());
    multixacts(&pg);
    pg.psql("postgres", PHASE_C_TWOPHASE);
    let wal_log_dbs: BTreeSet<Oid> = [db_oid(&pg, "dbw")].into();
    phase("workload (c)", &mut timings);
    snapshots.push(take_snapshot(&pg, "c-databases-xacts", &wal_log_dbs));
    phase("snapshot (c)", &mut timings);

    pg.psql("postgres", "COMMIT PREPARED 'p_open'; UPDATE twopc SET v = v || '!';");
    let kinds = relation_kinds(&pg);
    pg.stop();
    let server_log = pg.log();
    phase("final phase and stop", &mut timings);

    // The end of WAL is only known after ingest; the final snapshot is the data directory.
    let redo = Arc::new(WalRedoManager::new(support::walredo_config()));
    let reconstructor: Arc<dyn Reconstructor> = Arc::new(PgReconstructor::new(redo.clone()));
    let mut ingest = WalIngest::new(timeline.clone(), reconstructor.clone());
    let pg_wal = pg.pgdata.join("pg_wal");
    let tli = summary.pg_timeline_id;
    let mut ingest_time = Duration::ZERO;
    let mut ingest_until = |ingest: &mut WalIngest, stop: Lsn| {
        let t = Instant::now();
        let start = ingest.timeline().last_record_lsn();
        let done = ingest.ingest_pg_wal_until(&pg_wal, tli, start, stop).expect("ingest pg_wal");
        ingest_time += t.elapsed();
        if stop != Lsn::MAX {
            assert!(done.end_lsn <= stop && done.stopped_by.contains("after the stop LSN"), "ingest to {stop}: {done:?}");
        }
        done
    };
    let api = PageApi::new(timeline.clone(), reconstructor.clone());
    let masker = Masker::new(redo);
    let mut engine = Engine { timeline: &timeline, reconstructor: reconstructor.as_ref(), log: Vec::new() };
    let mut totals = Totals::default();
    let midpoint = |a: Lsn, b: Lsn| Lsn(a.0 + (b.0 - a.0) / 2);
    let [a, b, c] = [&snapshots[0], &snapshots[1], &snapshots[2]];
    let mut compare_total = Duration::ZERO;
    let mut compare = |snap: &Snapshot, totals: &mut Totals| {
        let t = Instant::now();
        compare_snapshot(&api, snap, &masker, totals);
        compare_total += t.elapsed();
    };

    // Halfway through pgbench -i: compacted, and images of everything; GC below (a).
    ingest_until(&mut ingest, midpoint(summary.import_lsn, a.lsn));
    engine.flush_and_compact();
    let first_images = engine.image_layers();
    ingest_until(&mut ingest, a.lsn);
    timeline.freeze_and_flush().unwrap();
    let gc = tenant.gc_timeline(timeline.timeline_id(), first_images).unwrap();
    assert!(!gc.layers_removed.is_empty(), "GC at {first_images} removed nothing: {:?}", timeline.layers());
    engine.log.push(format!("GC at cutoff {} removed {} layers", gc.cutoff, gc.layers_removed.len()));
    compare(a, &mut totals);

    // (b) read partly from the open in-memory layer.
    ingest_until(&mut ingest, b.lsn);
    compare(b, &mut totals);

    // Images halfway between (b) and (c), after compaction; (c) reads images plus deltas.
    ingest_until(&mut ingest, midpoint(b.lsn, c.lsn));
    engine.flush_and_compact();
    engine.image_layers();
    ingest_until(&mut ingest, c.lsn);
    compare(c, &mut totals);

    let wal = ingest_until(&mut ingest, Lsn::MAX);
    let end = wal.end_lsn;
    let control = ControlFile::parse(&fs::read(pg.pgdata.join("global/pg_control")).unwrap()).unwrap();
    assert!(end > control.checkpoint_lsn, "ingest reached the final checkpoint: {wal:?}");
    let last = Snapshot { name: "end", lsn: end, dir: pg.pgdata.clone(), kinds, wal_log_dbs };
    compare(&last, &mut totals);

    let (_, checkpoint) = api.datadir().get_checkpoint(end).unwrap();
    assert!(checkpoint.next_multi.0 > MULTIXACT_ROWS, "the workload made a multixact per locked row: {checkpoint:?}");
    let members = api.datadir().list_slru_segments(SlruKind::MultiXactMembers, end).unwrap();
    println!(
        "oracle: {} snapshots; {} relation forks, {} blocks compared, {} exceptions, {} mismatches\n\
         workload: {} ({tps}); ingest {} records, {} MiB of WAL ({:?}) in {ingest_time:.1?}; comparisons {compare_total:.1?}\n\
         engine: {}\n\
         next xid {}, next multixact {}, {} member segments; {} layers at the end; total {:.1?}",
        snapshots.len() + 1,
        totals.relation_forks,
        totals.blocks,
        totals.exceptions,
        totals.mismatches.len(),
        timings.join(", "),
        ingest.stats().records,
        (end.0 - summary.import_lsn.0) >> 20,
        ingest.stats(),
        engine.log.join("; "),
        checkpoint.next_xid,
        checkpoint.next_multi.0,
        members.len(),
        timeline.layers().len(),
        started.elapsed(),
    );
    if !totals.mismatches.is_empty() {
        println!("server log:\n{server_log}");
    }
    let shown: Vec<&String> = totals.mismatches.iter().take(60).collect();
    assert!(totals.mismatches.is_empty(), "{} mismatches, the first {}:\n{shown:#?}", totals.mismatches.len(), shown.len());
    assert!(totals.blocks > 4 * 16_000, "every snapshot has pgbench_accounts' 16,000+ blocks: {}", totals.blocks);
}

/// BRIN revmap pages through WAL redo, on their own and quickly.
///
/// Unpatched, `brin_xlog_insert_update` takes the block number of the regular page it
/// inserted into from that page's buffer (`BufferGetBlockNumber`), also when it replays the
/// record for the revmap page only. Patch 0003's filter hands the skipped regular page no
/// buffer, so the assert-enabled redo process traps (`BufferIsPinned(buffer)`); without
/// assertions it reads a buffer descriptor out of bounds and may write a wrong TID into the
/// revmap. Patch 0004 takes the number from the record instead; this test fails without it.
#[test]
fn brin_revmap_pages_through_wal_redo() {
    let mut pg = PgCluster::initdb();
    let tenants = pg.dir.path().join("tenants");
    fs::create_dir(&tenants).unwrap();
    let tenant = Tenant::create(&tenants, TenantId([3; 16]), StorageConfig::default(), &[]).unwrap();
    let timeline = tenant.create_timeline(TimelineId([4; 16])).unwrap();
    let summary = import_datadir(&timeline, &pg.pgdata).expect("import the initdb output");
    pg.configure(&[("fsync", "off"), ("autovacuum", "off"), ("wal_keep_size", "'1GB'")]);
    pg.start();
    pg.psql(
        "postgres",
        "CREATE TABLE b (id int, pad text); INSERT INTO b SELECT g, repeat('p', 100) FROM generate_series(1, 5000) g; \
         CREATE INDEX b_brin ON b USING brin (id) WITH (pages_per_range = 4); \
         INSERT INTO b SELECT g, 'late' FROM generate_series(5001, 6000) g; CHECKPOINT;",
    );
    let kinds = relation_kinds(&pg);
    pg.stop();
    let redo = Arc::new(WalRedoManager::new(support::walredo_config()));
    let reconstructor: Arc<dyn Reconstructor> = Arc::new(PgReconstructor::new(redo.clone()));
    let mut ingest = WalIngest::new(timeline.clone(), reconstructor.clone());
    let wal = ingest.ingest_pg_wal(&pg.pgdata.join("pg_wal"), summary.pg_timeline_id, summary.import_lsn).unwrap();
    let api = PageApi::new(timeline, reconstructor);
    let masker = Masker::new(redo);
    let mut report = Report::default();
    let source = Source { pgdata: &pg.pgdata, kinds: &kinds, wal_log_dbs: &BTreeSet::new() };
    compare_relations(&api, wal.end_lsn, &source, &masker, &mut report);
    println!("{}", report.summary(&masker));
    assert!(report.mismatches.is_empty(), "{:#?}", report.mismatches);
}
