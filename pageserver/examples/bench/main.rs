//! The pageserver benchmark: WAL ingest throughput, GetPage@LSN latency and layer bytes
//! written per byte of WAL, on a pgbench WAL stream from a real PostgreSQL of our build.
//! Run it through `scripts/bench-pageserver` (which builds it in release mode, names the
//! output files and records the command); `--help` lists the flags.
//!
//! What it does:
//! 1. `initdb`, import into a fresh timeline, flush (the import's layer is not counted);
//! 2. a plain server runs `pgbench -i -s <scale>`, then `pgbench -T <duration>`, then, after
//!    a `CHECKPOINT`, updates the single row of tables `hot_<n>` `n + 1` times each, so that
//!    their page has a full-page image followed by `n` records (n = 1, 10, 100);
//! 3. after a clean stop, the WAL is ingested from `pg_wal` (the `pgbench -i` part and the
//!    timed part measured separately; wall clock and this process's CPU time; decoding,
//!    ingest and flushing of layers included), with the pageserver's materializer thread
//!    folding hot pages beside it unless `--fold off` (its CPU time counts);
//! 4. GetPage@LSN (`PageApi::get_page`) of the hot pages at the end of WAL, each read
//!    rebuilding the page from its image and records through WAL redo;
//! 5. forced L0 compaction and image layers over the whole key space at the end of WAL;
//! 6. GetPage@LSN of random `pgbench_accounts` pages, now each an image hit in an image layer.
//!
//! Numbers are printed as a table, and written as JSON and as a Markdown section (for
//! `docs/benchmarks.md`). A benchmark asserts nothing about speed: a slow machine gives
//! slow numbers, never a failure.

#[path = "../../tests/support/mod.rs"]
mod support;

mod report;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use layerstore::{LayerDesc, LayerKind, Reconstructor, StorageConfig, Tenant, Timeline};
use pageserver::pgdata::walredo::WalRedoManager;
use pageserver::service::materializer::{Materializer, MaterializerSettings, MaterializerThread};
use pageserver::service::metrics::Metrics;
use pageserver::service::page_service::TenantRegistry;
use pageserver::{import_datadir, PageApi, PgReconstructor, WalIngest};
use proto::{BlockNumber, ForkNumber, Key, KeyRange, Lsn, Oid, RelTag, TenantId, TimelineId};
use report::{Latency, Results, Throughput};
use support::PgCluster;

const TIMEOUT: Duration = Duration::from_secs(60);
/// Records after the image on the hot pages.
const HOT_RECORDS: [u32; 3] = [1, 10, 100];

const USAGE: &str = "usage: bench [--scale N] [--duration SECONDS] [--clients N] [--samples N] \
    [--json FILE] [--markdown FILE] [--command TEXT] [--flavor NAME] [--date TEXT] [--fold on|off]";

pub struct Args {
    pub scale: u32,
    pub duration_s: u32,
    pub clients: u32,
    /// GetPage@LSN reads per measured case.
    pub samples: usize,
    pub json: Option<PathBuf>,
    pub markdown: Option<PathBuf>,
    /// How the run was started, for the report.
    pub command: String,
    /// The PostgreSQL build flavor (debug: assertions on; release).
    pub flavor: String,
    pub date: String,
    /// Whether the materializer folds hot pages during ingest, as the pageserver does.
    pub fold: bool,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        scale: 10,
        duration_s: 30,
        clients: 4,
        samples: 1000,
        json: None,
        markdown: None,
        command: std::env::args().collect::<Vec<_>>().join(" "),
        flavor: std::env::var("FJORD_PG_FLAVOR").unwrap_or_else(|_| "debug".into()),
        date: String::new(),
        fold: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let value = it.next().with_context(|| format!("{flag} needs a value; {USAGE}"))?;
        let number = || value.parse::<u32>().with_context(|| format!("{flag} takes a number, not {value:?}"));
        match flag.as_str() {
            "--scale" => args.scale = number()?,
            "--duration" => args.duration_s = number()?,
            "--clients" => args.clients = number()?,
            "--samples" => args.samples = number()? as usize,
            "--json" => args.json = Some(PathBuf::from(value)),
            "--markdown" => args.markdown = Some(PathBuf::from(value)),
            "--command" => args.command = value,
            "--flavor" => args.flavor = value,
            "--date" => args.date = value,
            "--fold" => {
                args.fold = match value.as_str() {
                    "on" => true,
                    "off" => false,
                    _ => bail!("--fold takes on or off, not {value:?}"),
                }
            }
            _ => bail!("unknown flag {flag}; {USAGE}"),
        }
    }
    if args.scale == 0 || args.clients == 0 || args.samples == 0 {
        bail!("--scale, --clients and --samples must be positive");
    }
    Ok(args)
}

/// This process's CPU time, user and system, all threads.
fn cpu_time() -> Duration {
    // SAFETY: getrusage fills the struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// The images the materializer made (`pageserver_fold_images_total`, every trigger).
fn fold_images(metrics: &Metrics) -> u64 {
    let families = metrics.gather();
    let family = families.iter().find(|f| f.name() == "pageserver_fold_images_total");
    family.map_or(0, |f| f.get_metric().iter().map(|m| m.get_counter().get_value() as u64).sum())
}

/// The layer files of a timeline with their sizes.
fn layer_files(timeline: &Timeline) -> anyhow::Result<Vec<(LayerDesc, u64)>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(timeline.path())? {
        let entry = entry?;
        if let Ok(desc) = entry.file_name().to_string_lossy().parse::<LayerDesc>() {
            files.push((desc, entry.metadata()?.len()));
        }
    }
    Ok(files)
}

fn bytes_of(files: &[(LayerDesc, u64)], pick: impl Fn(&LayerDesc) -> bool) -> u64 {
    files.iter().filter(|(d, _)| pick(d)).map(|(_, n)| n).sum()
}

/// A small deterministic generator (xorshift64*), so that runs read the same pages.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u32) -> u32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as u32 % n
    }
}

/// What the workload left for the measurements.
struct Workload {
    init_lsn: Lsn,
    tps: String,
    db: Oid,
    accounts: Oid,
    branches: Oid,
    hot: BTreeMap<u32, Oid>,
    took: Duration,
}

fn run_workload(pg: &mut PgCluster, args: &Args) -> anyhow::Result<Workload> {
    let started = Instant::now();
    pg.configure(&[
        ("fsync", "off"),
        ("wal_compression", "zstd"),
        // Reproducible streams: no autovacuum running into the measured WAL.
        ("autovacuum", "off"),
        // No WAL after the import LSN may be recycled before it is ingested.
        ("wal_keep_size", "'16GB'"),
    ]);
    pg.start();
    let scale = args.scale.to_string();
    pg.pgbench("postgres", &["-i", "-s", &scale, "-q"]);
    let init_lsn: Lsn = pg.psql("postgres", "SELECT pg_current_wal_insert_lsn()").trim().parse()?;
    let mut setup = String::new();
    for n in HOT_RECORDS {
        setup.push_str(&format!("CREATE TABLE hot_{n} (id int, v int); INSERT INTO hot_{n} VALUES (1, 0);\n"));
    }
    pg.psql("postgres", &setup);
    let duration = args.duration_s.to_string();
    let clients = args.clients.to_string();
    let threads = args.clients.min(2).to_string();
    let run = pg.pgbench("postgres", &["-T", &duration, "-c", &clients, "-j", &threads]);
    let tps = run.lines().find(|l| l.starts_with("tps")).unwrap_or("tps unknown").trim().to_string();
    // After the checkpoint, each hot page's first update logs a full-page image (stored as
    // an image), and the n updates after it are n records.
    let mut updates = String::from("CHECKPOINT;\n");
    for n in HOT_RECORDS {
        for _ in 0..=n {
            updates.push_str(&format!("UPDATE hot_{n} SET v = v + 1;\n"));
        }
    }
    pg.psql("postgres", &updates);
    let oid = |sql: &str| -> anyhow::Result<Oid> { Ok(pg.psql("postgres", sql).trim().parse()?) };
    let db = oid("SELECT oid FROM pg_database WHERE datname = 'postgres'")?;
    let accounts = oid("SELECT pg_relation_filenode('pgbench_accounts')")?;
    let branches = oid("SELECT pg_relation_filenode('pgbench_branches')")?;
    let mut hot = BTreeMap::new();
    for n in HOT_RECORDS {
        hot.insert(n, oid(&format!("SELECT pg_relation_filenode('hot_{n}')"))?);
    }
    pg.stop();
    Ok(Workload { init_lsn, tps, db, accounts, branches, hot, took: started.elapsed() })
}

/// Ingests up to `stop` and measures it; `flush` adds the final freeze and flush.
fn ingest_measured(ingest: &mut WalIngest, pg_wal: &Path, tli: u32, stop: Lsn, flush: bool) -> anyhow::Result<Throughput> {
    let (wall, cpu) = (Instant::now(), cpu_time());
    let start = ingest.timeline().last_record_lsn();
    let records_before = ingest.stats().records;
    let done = ingest.ingest_pg_wal_until(pg_wal, tli, start, stop)?;
    if flush {
        ingest.timeline().freeze_and_flush()?;
    }
    Ok(Throughput {
        wal_bytes: done.end_lsn.0 - start.0,
        records: ingest.stats().records - records_before,
        wall: wall.elapsed(),
        cpu: cpu_time() - cpu,
    })
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let started = Instant::now();
    let mut pg = PgCluster::initdb();
    let tenants = pg.dir.path().join("tenants");
    fs::create_dir(&tenants)?;
    let conf = if args.fold {
        StorageConfig::default()
    } else {
        StorageConfig { fold_after_records: 0, fold_after_bytes: 0, ..StorageConfig::default() }
    };
    let tenant = Arc::new(Tenant::create(&tenants, TenantId([0xbe; 16]), conf, &[])?);
    let timeline = tenant.create_timeline(TimelineId([0xef; 16]))?;
    let summary = import_datadir(&timeline, &pg.pgdata)?;
    timeline.freeze_and_flush()?;
    let import_bytes = bytes_of(&layer_files(&timeline)?, |_| true);
    eprintln!("bench: imported at {}; running pgbench (scale {}, {} s)", summary.import_lsn, args.scale, args.duration_s);
    let workload = run_workload(&mut pg, &args)?;

    eprintln!("bench: ingesting");
    let redo = Arc::new(WalRedoManager::new(support::walredo_config()));
    let reconstructor: Arc<dyn Reconstructor> = Arc::new(PgReconstructor::new(redo));
    let mut ingest = WalIngest::new(timeline.clone(), reconstructor.clone());
    let pg_wal = pg.pgdata.join("pg_wal");
    let tli = summary.pg_timeline_id;
    // The materializer as the pageserver runs it: its own redo process, a quarter of a core.
    let metrics = Arc::new(Metrics::new());
    let materializer = if args.fold {
        let registry = Arc::new(TenantRegistry::default());
        registry.insert(Arc::clone(&tenant));
        let fold_redo: Arc<dyn Reconstructor> = Arc::new(PgReconstructor::new(Arc::new(WalRedoManager::new(support::walredo_config()))));
        let m = Materializer::new(registry, fold_redo, Arc::clone(&metrics), MaterializerSettings { cpu_share: 0.25 });
        Some(MaterializerThread::start(Arc::new(m))?)
    } else {
        None
    };
    let ingest_init = ingest_measured(&mut ingest, &pg_wal, tli, workload.init_lsn, false)?;
    let ingest_run = ingest_measured(&mut ingest, &pg_wal, tli, Lsn::MAX, true)?;
    let folds = materializer.map(|m| {
        m.stop();
        fold_images(&metrics)
    });
    if let Some(n) = folds {
        eprintln!("bench: the materializer made {n} images during ingest");
    }
    let end = timeline.last_record_lsn();
    let files = layer_files(&timeline)?;
    let l0_bytes = bytes_of(&files, LayerDesc::is_l0) - import_bytes;
    let api = PageApi::new(timeline.clone(), reconstructor.clone());

    eprintln!("bench: GetPage@LSN through WAL redo");
    let mut hot = Vec::new();
    for (&n, &relnode) in &workload.hot {
        let rel = RelTag { spcnode: 1663, dbnode: workload.db, relnode, forknum: ForkNumber::Main };
        let data = timeline.get_reconstruct_data(Key::rel_block(rel, BlockNumber(0)), end)?;
        if data.image.is_none() {
            bail!("hot_{n}'s page has no image at {end}: {} records", data.records.len());
        }
        hot.push((n, data.records.len(), rel, Vec::new(), Vec::new()));
    }
    // Round robin over the cases, so that a busy moment of a shared machine spreads over
    // all of them instead of spoiling one. Each case also times the read path alone
    // (collecting the image and records from the layers), to tell it from the redo.
    for _ in 0..args.samples.min(500) {
        for (_, _, rel, times, collect_times) in hot.iter_mut() {
            let t = Instant::now();
            api.get_page(*rel, BlockNumber(0), end, TIMEOUT)?;
            times.push(t.elapsed());
            let t = Instant::now();
            timeline.get_reconstruct_data(Key::rel_block(*rel, BlockNumber(0)), end)?;
            collect_times.push(t.elapsed());
        }
    }
    let redo_latency = hot
        .into_iter()
        .map(|(n, found, _, times, collect)| (n, found, Latency::from_samples(times), Latency::from_samples(collect)))
        .collect();
    // The worst case before any image layer: the page every pgbench transaction updates,
    // with every record since its last full-page image.
    let branches = RelTag { spcnode: 1663, dbnode: workload.db, relnode: workload.branches, forknum: ForkNumber::Main };
    let branch_records = timeline.get_reconstruct_data(Key::rel_block(branches, BlockNumber(0)), end)?.records.len();
    let mut times = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        api.get_page(branches, BlockNumber(0), end, TIMEOUT)?;
        times.push(t.elapsed());
    }
    let hottest = (branch_records, Latency::from_samples(times));

    eprintln!("bench: compaction and image layers");
    let t = Instant::now();
    let compacted = timeline.compact_level0(true)?;
    let compaction_time = t.elapsed();
    let files = layer_files(&timeline)?;
    let created: Vec<&LayerDesc> = compacted.l1_created.iter().collect();
    let l1_bytes = bytes_of(&files, |d| created.contains(&d));
    let t = Instant::now();
    let images = timeline.create_image_layers(&KeyRange::ALL, end, reconstructor.as_ref())?;
    let image_time = t.elapsed();
    let files = layer_files(&timeline)?;
    let image_bytes = bytes_of(&files, |d| d.kind == LayerKind::Image && images.contains(d));
    let resident_bytes = bytes_of(&files, |_| true);

    eprintln!("bench: GetPage@LSN image hits");
    let accounts = RelTag { spcnode: 1663, dbnode: workload.db, relnode: workload.accounts, forknum: ForkNumber::Main };
    let blocks = api.get_rel_size(accounts, end, TIMEOUT)?;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut times = Vec::with_capacity(args.samples);
    for _ in 0..args.samples {
        let blkno = BlockNumber(rng.below(blocks));
        let t = Instant::now();
        api.get_page(accounts, blkno, end, TIMEOUT)?;
        times.push(t.elapsed());
    }
    let image_hit = Latency::from_samples(times);

    let results = Results {
        scale: args.scale,
        duration_s: args.duration_s,
        clients: args.clients,
        tps: workload.tps,
        workload_time: workload.took,
        ingest_init,
        ingest_run,
        redo_latency,
        hottest,
        folds,
        image_hit,
        accounts_blocks: blocks,
        l0_bytes,
        l1_bytes,
        image_bytes,
        resident_bytes,
        import_bytes,
        compaction_time,
        l0_compacted: compacted.l0_removed.len(),
        image_time,
        image_layers: images.len(),
        total_time: started.elapsed(),
    };
    let machine = report::Machine::detect(&args, &support::pg_bin_dir());
    println!("{}", results.table(&machine));
    if let Some(path) = &args.json {
        fs::write(path, results.json(&machine)).with_context(|| format!("write {}", path.display()))?;
    }
    if let Some(path) = &args.markdown {
        fs::write(path, results.markdown(&machine)).with_context(|| format!("write {}", path.display()))?;
    }
    Ok(())
}
