//! Basebackup against real PostgreSQL 15: import a fresh `initdb`, run a workload (rows in
//! many transactions, an unlogged table with an index, a multixact, a transaction left
//! prepared) on a real server, ingest its WAL from `pg_wal` up to the insert LSN taken
//! after the workload (so the last record is not a shutdown checkpoint: the counters in
//! `pg_control` must come from tracking, not from a checkpoint), then write a basebackup,
//! untar it, and check it with PostgreSQL's own `pg_controldata`: checkpoint and redo at
//! the LSN, state "shut down", next xid past every xid the workload used; and the files:
//! versions, maps, SLRUs in whole pages, the two-phase file, unlogged relations' init and
//! main forks, the WAL segment and `fjord.signal`.
//!
//! Needs our PostgreSQL build (`target/pg15`, see `tests/support`).

mod support;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::sync::Arc;

use layerstore::{Reconstructor, StorageConfig, Tenant};
use pageserver::pgdata::basebackup::{write_basebackup, EMPTY_DIRS};
use pageserver::pgdata::walingest::wal_segment_file_name;
use pageserver::pgdata::walredo::WalRedoManager;
use pageserver::{import_datadir, PgReconstructor, WalIngest};
use proto::{Lsn, TenantId, TimelineId};
use support::PgCluster;

const WORKLOAD: &str = r#"
CREATE TABLE t (id int PRIMARY KEY, v text);
INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 2000) g;
CREATE UNLOGGED TABLE u (id int PRIMARY KEY, v text);
INSERT INTO u SELECT g, 'u' || g FROM generate_series(1, 100) g;
CREATE TABLE locked (id int PRIMARY KEY);
INSERT INTO locked VALUES (1), (2);
BEGIN; SELECT id FROM locked WHERE id = 1 FOR SHARE; PREPARE TRANSACTION 'holds_a_lock';
-- A second share lock on the same row: a multixact of two members.
BEGIN; SELECT id FROM locked WHERE id = 1 FOR SHARE; COMMIT;
"#;

fn pg_controldata(pg: &PgCluster, dir: &Path) -> BTreeMap<String, String> {
    let out = pg.command("pg_controldata").arg(dir).output().expect("run pg_controldata");
    assert!(out.status.success(), "pg_controldata failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

fn full_xid(epoch_xid: &str) -> u64 {
    let (epoch, xid) = epoch_xid.split_once(':').expect("epoch:xid");
    (epoch.parse::<u64>().unwrap() << 32) | xid.parse::<u64>().unwrap()
}

/// Untars `tar` into a new directory owned by the unprivileged user (pg_controldata runs
/// as that user).
fn untar(pg: &PgCluster, tar: &[u8], name: &str) -> std::path::PathBuf {
    let dir = pg.dir.path().join(name);
    tar::Archive::new(tar).unpack(&dir).expect("untar the basebackup");
    if support::unprivileged_user().is_some() {
        let status = std::process::Command::new("chown").args(["-R", "fjord:"]).arg(&dir).status().unwrap();
        assert!(status.success());
    }
    dir
}

/// Equal relation files but for each page's `pd_lsn` (redo stamps the init fork's pages
/// with their WAL record's LSN; the server's own file may have been written before that).
fn same_but_page_lsns(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.chunks(8192).zip(b.chunks(8192)).all(|(x, y)| x[8..] == y[8..])
}

#[test]
fn basebackup_of_a_real_workload_is_a_shut_down_data_directory_at_the_lsn() {
    let mut pg = PgCluster::initdb();
    let tenants = pg.dir.path().join("tenants");
    fs::create_dir(&tenants).unwrap();
    let tenant = Tenant::create(&tenants, TenantId([5; 16]), StorageConfig::default(), &[]).unwrap();
    let timeline = tenant.create_timeline(TimelineId([6; 16])).unwrap();
    let summary = import_datadir(&timeline, &pg.pgdata).expect("import the initdb output");
    pg.configure(&[("fsync", "off"), ("max_prepared_transactions", "5"), ("autovacuum", "off"), ("wal_keep_size", "'1GB'")]);
    pg.start();
    pg.psql("postgres", WORKLOAD);
    let mut max_xid = 0u64;
    for _ in 0..30 {
        let xid = pg.psql("postgres", "BEGIN; INSERT INTO t SELECT max(id) + 1, 'x' FROM t; SELECT txid_current(); COMMIT;");
        max_xid = max_xid.max(xid.trim().parse().unwrap());
    }
    let max_xid: u64 = pg.psql("postgres", "SELECT txid_current();").trim().parse::<u64>().unwrap().max(max_xid);
    let insert_lsn: Lsn = pg.psql("postgres", "SELECT pg_current_wal_insert_lsn();").trim().parse().unwrap();
    let postgres_oid: u32 = pg.psql("postgres", "SELECT oid FROM pg_database WHERE datname = 'postgres'").trim().parse().unwrap();
    let unlogged: Vec<u32> = pg
        .psql("postgres", "SELECT relfilenode FROM pg_class WHERE relpersistence = 'u' ORDER BY 1")
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert_eq!(unlogged.len(), 4, "the unlogged table, its primary key, its TOAST table and index");
    let prepared_xid: u32 = pg.psql("postgres", "SELECT transaction FROM pg_prepared_xacts").trim().parse().unwrap();
    pg.stop();

    let redo = Arc::new(WalRedoManager::new(support::walredo_config()));
    let reconstructor: Arc<dyn Reconstructor> = Arc::new(PgReconstructor::new(redo));
    let mut ingest = WalIngest::new(timeline.clone(), reconstructor.clone());
    ingest.ingest_pg_wal_until(&pg.pgdata.join("pg_wal"), summary.pg_timeline_id, summary.import_lsn, insert_lsn).unwrap();
    let lsn = timeline.last_record_lsn();
    assert!(lsn <= insert_lsn && lsn.0 + 8192 > insert_lsn.0, "ingested up to the insert LSN: {lsn} vs {insert_lsn}");
    let last = ingest.last_record().expect("ingest records where the last record starts");
    assert_eq!(last.end, lsn);
    let prev = last.start;
    assert!(prev < lsn);

    let mut tar = Vec::new();
    let bb = write_basebackup(&timeline, reconstructor.as_ref(), lsn, Some(prev), &mut tar).unwrap();
    assert_eq!(bb.bytes as usize, tar.len());
    assert_eq!(bb.unlogged_relations, 4);
    let dir = untar(&pg, &tar, "basebackup");

    let control = pg_controldata(&pg, &dir);
    assert_eq!(control["Database cluster state"], "shut down", "{control:?}");
    assert_eq!(control["Latest checkpoint location"], lsn.to_string());
    assert_eq!(control["Latest checkpoint's REDO location"], lsn.to_string());
    assert_eq!(control["Latest checkpoint's TimeLineID"], "1");
    assert_eq!(control["Minimum recovery ending location"], "0/0");
    let next_xid = full_xid(&control["Latest checkpoint's NextXID"]);
    assert!(next_xid > max_xid, "NextXID {next_xid} is past every xid the workload used (up to {max_xid})");
    assert!(control["Latest checkpoint's NextMultiXactId"].parse::<u32>().unwrap() > 1, "the workload made a multixact");
    assert_eq!(control["Latest checkpoint's oldestActiveXID"], "0");

    // Files.
    assert_eq!(fs::read_to_string(dir.join("PG_VERSION")).unwrap(), "15\n");
    assert_eq!(fs::read_to_string(dir.join(format!("base/{postgres_oid}/PG_VERSION"))).unwrap(), "15\n");
    assert_eq!(fs::read_to_string(dir.join("global/PG_VERSION")).unwrap(), "15\n");
    assert_eq!(fs::metadata(dir.join("global/pg_control")).unwrap().len(), 8192);
    for map in ["global/pg_filenode.map".to_string(), format!("base/{postgres_oid}/pg_filenode.map")] {
        assert_eq!(fs::read(dir.join(&map)).unwrap(), fs::read(pg.pgdata.join(&map)).unwrap(), "{map}");
    }
    for d in EMPTY_DIRS {
        assert!(dir.join(d).is_dir(), "{d}");
    }
    for slru in ["pg_xact", "pg_multixact/offsets", "pg_multixact/members"] {
        let files: Vec<_> = fs::read_dir(dir.join(slru)).unwrap().map(|e| e.unwrap()).collect();
        assert!(!files.is_empty(), "{slru} has segments");
        for f in files {
            let name = f.file_name().to_string_lossy().into_owned();
            assert!(name.len() >= 4 && name.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_lowercase()), "{slru}/{name}");
            let len = f.metadata().unwrap().len();
            assert!(len > 0 && len % 8192 == 0, "{slru}/{name} is {len} bytes");
        }
    }
    assert!(dir.join(format!("pg_twophase/{prepared_xid:08X}")).is_file());
    for relnode in unlogged {
        let init = fs::read(dir.join(format!("base/{postgres_oid}/{relnode}_init"))).unwrap();
        let on_disk = fs::read(pg.pgdata.join(format!("base/{postgres_oid}/{relnode}_init"))).unwrap();
        assert!(same_but_page_lsns(&init, &on_disk), "init fork of {relnode} differs from the server's");
        assert!(fs::read(dir.join(format!("base/{postgres_oid}/{relnode}"))).unwrap() == init, "main fork of {relnode} = init fork");
    }
    let rel_files = fs::read_dir(dir.join(format!("base/{postgres_oid}")))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().chars().next().is_some_and(|c| c.is_ascii_digit()))
        .count();
    assert_eq!(rel_files, 8, "only the unlogged relations' init and main forks");
    let segment = fs::read(dir.join("pg_wal").join(wal_segment_file_name(1, lsn))).unwrap();
    let lsn_page_end = (lsn.0 % (16 << 20)) as usize / 8192 * 8192 + 8192;
    assert_eq!(segment.len(), lsn_page_end, "the segment up to the end of the LSN's page (the client extends it)");
    assert!(segment[(lsn.0 % (16 << 20)) as usize..].iter().all(|&b| b == 0), "nothing after the LSN");
    assert_eq!(fs::read_to_string(dir.join("fjord.signal")).unwrap(), format!("LSN: {lsn}\nPREV LSN: {prev}\n"));
    assert_eq!(fs::read(dir.join("postgresql.auto.conf")).unwrap(), b"");

    // At an earlier LSN (the import LSN), without a previous record LSN.
    let mut tar = Vec::new();
    write_basebackup(&timeline, reconstructor.as_ref(), summary.import_lsn, None, &mut tar).unwrap();
    let dir = untar(&pg, &tar, "basebackup-at-import");
    let control = pg_controldata(&pg, &dir);
    assert_eq!(control["Latest checkpoint location"], summary.import_lsn.to_string());
    assert!(full_xid(&control["Latest checkpoint's NextXID"]) < next_xid);
    assert_eq!(fs::read_to_string(dir.join("fjord.signal")).unwrap(), format!("LSN: {}\nPREV LSN: none\n", summary.import_lsn));
    assert!(!dir.join(format!("pg_twophase/{prepared_xid:08X}")).exists());
    println!("basebackup: {bb:?}");
}
