//! Folds against real PostgreSQL 15: the hottest page of pgbench (`pgbench_branches` block
//! 0 at scale 1, which every transaction updates) stays cheap to read while its WAL is
//! ingested, and every fold stores exactly the page PostgreSQL's redo builds.
//!
//! A server with `full_page_writes = off` (so no checkpoint's image bounds the chain) runs
//! a few thousand pgbench transactions; the test then ingests its WAL a few KiB at a time,
//! as the WAL receiver would, and after each step does what the pageserver does beside
//! ingest: the materializer folds the keys the engine queued, and a GetPage reads the hot
//! page at the newest LSN. What it checks:
//! - the bound: no GetPage of the hot page replays more than `2 * fold_after_records`
//!   records (without folds, the last one would replay one per transaction, thousands);
//! - the folds change no page: the hot page read just before each materializer turn is
//!   the page read after it, byte for byte, and so are reads at earlier LSNs afterwards.
//!
//! `folding_every_key_changes_no_page` ingests one WAL stream into two timelines, one that
//! folds every key with two records or more after each step, one that never folds, and
//! compares every block of every relation and the CLOG at several LSNs: each fold's image
//! is exactly what PostgreSQL's redo builds from the whole chain.
//!
//! With `full_page_writes = off`, a visibility-map page that `XLOG_HEAP2_VISIBLE` first
//! touches without an image cannot be rebuilt until ingest stores that record as
//! initializing the page (a fix of its own); the materializer skips such keys
//! (`redo_error`, warned once per key), and this test reads only the heap page.
//!
//! Needs our PostgreSQL build (`target/pg15`, see `tests/support`). Prints what it saw.

mod support;

use std::fs;
use std::sync::Arc;
use std::time::{Duration, Instant};

use layerstore::timeline::Timeline;
use layerstore::{Reconstructor, StorageConfig, Tenant};
use pageserver::pgdata::walredo::WalRedoManager;
use pageserver::service::background::StopFlag;
use pageserver::service::materializer::{Materializer, MaterializerSettings, Summary};
use pageserver::service::metrics::Metrics;
use pageserver::service::page_service::{ReadWriteback, TenantRegistry};
use pageserver::{import_datadir, PageApi, PgReconstructor, WalIngest};
use prometheus::Encoder;
use proto::{BlockNumber, ForkNumber, Lsn, Oid, RelTag, TenantId, TimelineId};
use support::PgCluster;

const N: u32 = 64;
const TRANSACTIONS: u32 = 3000;
const STEP_BYTES: u64 = 16 * 1024;
const TIMEOUT: Duration = Duration::from_secs(10);

#[test]
fn a_hot_page_stays_within_a_small_multiple_of_the_fold_threshold() {
    let started = Instant::now();
    let mut pg = PgCluster::initdb();
    let tenants = pg.dir.path().join("tenants");
    fs::create_dir(&tenants).unwrap();
    let conf = StorageConfig { fold_after_records: N, ..StorageConfig::default() };
    let tenant = Arc::new(Tenant::create(&tenants, TenantId([9; 16]), conf, &[]).unwrap());
    let timeline = tenant.create_timeline(TimelineId([10; 16])).unwrap();
    let summary = import_datadir(&timeline, &pg.pgdata).expect("import the initdb output");

    pg.configure(&[
        ("fsync", "off"),
        ("synchronous_commit", "off"),
        ("full_page_writes", "off"),
        ("autovacuum", "off"),
        ("checkpoint_timeout", "'1h'"),
        ("max_wal_size", "'1GB'"),
        ("wal_keep_size", "'1GB'"),
    ]);
    pg.start();
    pg.pgbench("postgres", &["-i", "-s", "1", "-q"]);
    pg.pgbench("postgres", &["-n", "-c", "1", "-t", &TRANSACTIONS.to_string()]);
    let row =
        pg.rows("postgres", "SELECT (SELECT oid FROM pg_database WHERE datname = 'postgres'), pg_relation_filenode('pgbench_branches')");
    let (dbnode, relnode): (Oid, Oid) = (row[0][0].parse().unwrap(), row[0][1].parse().unwrap());
    pg.stop();
    let hot = RelTag { spcnode: 1663, dbnode, relnode, forknum: ForkNumber::Main };
    let workload = started.elapsed();

    let reconstructor: Arc<dyn Reconstructor> = Arc::new(PgReconstructor::new(Arc::new(WalRedoManager::new(support::walredo_config()))));
    let fold_redo: Arc<dyn Reconstructor> = Arc::new(PgReconstructor::new(Arc::new(WalRedoManager::new(support::walredo_config()))));
    let registry = Arc::new(TenantRegistry::default());
    registry.insert(Arc::clone(&tenant));
    let metrics = Arc::new(Metrics::new());
    let materializer = Materializer::new(registry, fold_redo, metrics, MaterializerSettings { cpu_share: 1.0 });
    let api = PageApi::new(timeline.clone(), reconstructor.clone());
    let mut ingest = WalIngest::new(timeline.clone(), reconstructor);
    let pg_wal = pg.pgdata.join("pg_wal");

    let stop = StopFlag::default();
    let mut fold_summary = Summary::default();
    let (mut steps, mut taken, mut max_replayed, mut hot_reads) = (0u32, 0usize, 0usize, 0u32);
    let mut samples: Vec<(Lsn, bytes::Bytes)> = Vec::new();
    let mut start = summary.import_lsn;
    let mut step_bytes = STEP_BYTES;
    loop {
        let stop_at = Lsn(start.0 + step_bytes);
        let got = ingest.ingest_pg_wal_until(&pg_wal, summary.pg_timeline_id, start, stop_at).expect("ingest pg_wal");
        let lsn = timeline.last_record_lsn();
        if got.records == 0 {
            // A record longer than a step, or the end of the WAL.
            if step_bytes >= 1024 * STEP_BYTES {
                break;
            }
            step_bytes *= 2;
            continue;
        }
        step_bytes = STEP_BYTES;
        steps += 1;
        start = lsn;
        // Before pgbench created it, the hot page does not exist.
        let Ok(size) = api.get_rel_size(hot, lsn, TIMEOUT) else { continue };
        if size == 0 {
            continue;
        }
        let before = api.get_page(hot, BlockNumber(0), lsn, TIMEOUT).unwrap();
        taken += materializer.run_once(&stop, &mut fold_summary);
        let (after, cost) = api.get_page_with_cost(hot, BlockNumber(0), lsn, TIMEOUT).unwrap();
        assert!(before == after, "a fold changed the hot page at {lsn}");
        max_replayed = max_replayed.max(cost.records_replayed);
        hot_reads += 1;
        if steps % 16 == 0 {
            samples.push((lsn, after));
        }
    }
    let end = timeline.last_record_lsn();
    // Every earlier read gives the page it gave when it was the newest, folds or not.
    for (lsn, page) in &samples {
        assert!(api.get_page(hot, BlockNumber(0), *lsn, TIMEOUT).unwrap() == page, "the hot page at {lsn} changed after later folds");
    }
    let data = timeline.get_reconstruct_data(layerstore_key(hot), end).unwrap();
    println!(
        "workload {workload:?}; ingested to {end} in {steps} steps of {STEP_BYTES} bytes; {hot_reads} reads of the hot page, \
         at most {max_replayed} records replayed (threshold {N}); {taken} keys taken by the materializer ({fold_summary:?}); \
         at the end the hot page replays {} records; {:?} in all",
        data.records.len(),
        started.elapsed()
    );
    assert!(hot_reads > 100, "the hot page was read {hot_reads} times: too few steps to mean anything");
    assert!(max_replayed <= 2 * N as usize, "a read of the hot page replayed {max_replayed} records; the bound is {}", 2 * N);
    assert!(
        fold_summary.folded() as u32 >= TRANSACTIONS / N / 2,
        "{} folds for {TRANSACTIONS} updates of the hot page",
        fold_summary.folded()
    );
}

fn layerstore_key(rel: RelTag) -> proto::Key {
    proto::Key::rel_block(rel, BlockNumber(0))
}

/// Every page, folded as often as it can be, is the page PostgreSQL's redo builds from the
/// unfolded chain: the same WAL is ingested into two timelines, one folding every key with
/// two records or more after each step of 16 KiB (real WAL redo through the materializer),
/// one never folding; every block of every relation and the CLOG are compared at several
/// LSNs along the way and at the end.
#[test]
fn folding_every_key_changes_no_page() {
    let started = Instant::now();
    let mut pg = PgCluster::initdb();
    let tenants = pg.dir.path().join("tenants");
    fs::create_dir(&tenants).unwrap();
    let folding = StorageConfig { fold_after_records: 2, ..StorageConfig::default() };
    let plain = StorageConfig { fold_after_records: 0, fold_after_bytes: 0, ..StorageConfig::default() };
    let tenant_f = Arc::new(Tenant::create(&tenants, TenantId([11; 16]), folding, &[]).unwrap());
    let tenant_p = Arc::new(Tenant::create(&tenants, TenantId([12; 16]), plain, &[]).unwrap());
    let (tl_f, tl_p) = (tenant_f.create_timeline(TimelineId([13; 16])).unwrap(), tenant_p.create_timeline(TimelineId([14; 16])).unwrap());
    let summary = import_datadir(&tl_f, &pg.pgdata).expect("import the initdb output");
    import_datadir(&tl_p, &pg.pgdata).expect("import the initdb output");

    pg.configure(&[
        ("fsync", "off"),
        ("synchronous_commit", "off"),
        ("full_page_writes", "off"),
        ("autovacuum", "off"),
        ("checkpoint_timeout", "'1h'"),
        ("max_wal_size", "'1GB'"),
        ("wal_keep_size", "'1GB'"),
    ]);
    pg.start();
    pg.pgbench("postgres", &["-i", "-s", "1", "-q"]);
    pg.pgbench("postgres", &["-n", "-c", "2", "-t", "400"]);
    pg.psql("postgres", "CREATE INDEX ON pgbench_history (tid); UPDATE pgbench_accounts SET filler = 'x' WHERE aid % 50 = 0; DELETE FROM pgbench_history WHERE aid % 3 = 0;");
    pg.stop();

    let redo = || -> Arc<dyn Reconstructor> { Arc::new(PgReconstructor::new(Arc::new(WalRedoManager::new(support::walredo_config())))) };
    let registry = Arc::new(TenantRegistry::default());
    registry.insert(Arc::clone(&tenant_f));
    let metrics = Arc::new(Metrics::new());
    let materializer = Materializer::new(registry, redo(), Arc::clone(&metrics), MaterializerSettings { cpu_share: 1.0 });
    let (api_f, api_p) = (PageApi::new(tl_f.clone(), redo()), PageApi::new(tl_p.clone(), redo()));
    let mut ingest_f = WalIngest::new(tl_f.clone(), redo());
    let mut ingest_p = WalIngest::new(tl_p.clone(), redo());
    let pg_wal = pg.pgdata.join("pg_wal");
    let (stop, mut fold_summary) = (StopFlag::default(), Summary::default());
    let mut start = summary.import_lsn;
    let (mut steps, mut compared, mut step_bytes) = (0u32, 0usize, STEP_BYTES);
    let mut sampled: Vec<Lsn> = Vec::new();
    loop {
        let stop_at = Lsn(start.0 + step_bytes);
        let got = ingest_f.ingest_pg_wal_until(&pg_wal, summary.pg_timeline_id, start, stop_at).expect("ingest pg_wal");
        ingest_p.ingest_pg_wal_until(&pg_wal, summary.pg_timeline_id, start, stop_at).expect("ingest pg_wal");
        let lsn = tl_f.last_record_lsn();
        assert_eq!(lsn, tl_p.last_record_lsn());
        if got.records == 0 {
            if step_bytes >= 1024 * STEP_BYTES {
                break;
            }
            step_bytes *= 2;
            continue;
        }
        (start, step_bytes) = (lsn, STEP_BYTES);
        steps += 1;
        while materializer.run_once(&stop, &mut fold_summary) > 0 {}
        if steps % 200 == 0 {
            compared += compare_all(&api_f, &api_p, lsn, None);
            sampled.push(lsn);
        }
    }
    let end = tl_f.last_record_lsn();
    compared += compare_all(&api_f, &api_p, end, None);
    // Reads below later folds, as a replica behind the primary makes them: every page at
    // every earlier sampled LSN is still the unfolded timeline's page, and so is every page
    // after the reads wrote their pages back (the page service's writeback, at versions
    // below the newest) and the materializer folded again.
    for &lsn in sampled.iter().rev() {
        compared += compare_all(&api_f, &api_p, lsn, Some((&materializer, &*tl_f)));
    }
    let written_back = metric(&metrics, "pageserver_fold_images_total{trigger=\"read\"}");
    while materializer.run_once(&stop, &mut fold_summary) > 0 {}
    for &lsn in sampled.iter().chain([&end]) {
        compared += compare_all(&api_f, &api_p, lsn, None);
    }
    println!("reads below the newest LSN wrote back {written_back} pages");
    assert!(sampled.len() >= 4, "only {} earlier LSNs compared", sampled.len());
    assert!(written_back > 100.0, "only {written_back} pages written back by reads at earlier LSNs: the check proves little");
    println!(
        "ingested to {end} in {steps} steps; {} folds ({fold_summary:?}); {compared} pages compared; {:?} in all",
        fold_summary.folded(),
        started.elapsed()
    );
    assert!(fold_summary.folded() > 1000, "only {} folds: the comparison proves little", fold_summary.folded());
    assert!(compared > 5000, "only {compared} pages compared");
}

/// Compares every block of every relation fork and CLOG segment 0 at `lsn`; returns the
/// pages compared. A page neither timeline can rebuild must fail the same way in both.
/// With `writeback`, each page read from the folded timeline is handed to the read
/// writeback, as the page service does.
fn compare_all(folded: &PageApi, plain: &PageApi, lsn: Lsn, writeback: Option<(&Materializer, &Timeline)>) -> usize {
    let mut pages = 0;
    for (spcnode, dbnode) in plain.list_dbs(lsn, TIMEOUT).unwrap() {
        for rel in plain.list_rels(spcnode, dbnode, lsn, TIMEOUT).unwrap() {
            let size = plain.get_rel_size(rel, lsn, TIMEOUT).unwrap();
            assert_eq!(folded.get_rel_size(rel, lsn, TIMEOUT).unwrap(), size, "{rel} at {lsn}");
            for blkno in 0..size {
                let want = plain.get_page(rel, BlockNumber(blkno), lsn, TIMEOUT).map_err(|e| e.to_string());
                let got = folded.get_page_with_cost(rel, BlockNumber(blkno), lsn, TIMEOUT).map_err(|e| e.to_string());
                if let (Some((materializer, timeline)), Ok((page, cost))) = (writeback, &got) {
                    materializer.page_rebuilt(timeline, rel, BlockNumber(blkno), *cost, page);
                }
                let got = got.map(|(page, _)| page);
                assert!(want == got, "{rel} block {blkno} at {lsn}: folded {got:?}, unfolded {want:?}");
                pages += 1;
            }
        }
    }
    let clog = |api: &PageApi| api.get_slru_segment(proto::SlruKind::Clog, 0, lsn, TIMEOUT).unwrap();
    assert!(clog(folded) == clog(plain), "CLOG segment 0 at {lsn}");
    pages + 1
}

/// The value of the metric whose exposition line starts with `line_start`.
fn metric(m: &Metrics, line_start: &str) -> f64 {
    let mut out = Vec::new();
    prometheus::TextEncoder::new().encode(&m.gather(), &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let line = text.lines().find(|l| l.starts_with(line_start)).unwrap_or_else(|| panic!("{line_start} missing:\n{text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}
