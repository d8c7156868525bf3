//! Materializer tests, on the engine's model of redo (`ModelReconstructor`: a value is its
//! image with each record's bytes appended): a queued hot key is folded and no read
//! changes; each reason to skip; the read writeback at and below the threshold; the thread
//! folds on its own and stops.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use prometheus::Encoder;
use proto::{BlockNumber, ForkNumber, Key, Lsn, RelTag, TenantId, TimelineId};

use super::*;
use crate::service::page_service::TenantRegistry;
use layerstore::tenant::Tenant;
use layerstore::value::{ModelReconstructor, ReconstructData};
use layerstore::{StorageConfig, Value};

const TENANT: TenantId = TenantId([5; 16]);
const MAIN: TimelineId = TimelineId([6; 16]);
const N: u32 = 8;

fn rel() -> RelTag {
    RelTag { spcnode: 1663, dbnode: 5, relnode: 16384, forknum: ForkNumber::Main }
}

fn key(blk: u32) -> Key {
    Key::rel_block(rel(), BlockNumber(blk))
}

struct Fixture {
    _dir: tempfile::TempDir,
    timeline: Arc<Timeline>,
    metrics: Arc<Metrics>,
    materializer: Arc<Materializer>,
}

fn setup_with(reconstructor: Arc<dyn Reconstructor>) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let conf = StorageConfig { fold_after_records: N, ..StorageConfig::default() };
    let tenant = Arc::new(Tenant::create(dir.path(), TENANT, conf, &[]).unwrap());
    let timeline = tenant.create_timeline(MAIN).unwrap();
    let registry = Arc::new(TenantRegistry::default());
    registry.insert(tenant);
    let metrics = Arc::new(Metrics::new());
    let materializer = Arc::new(Materializer::new(registry, reconstructor, Arc::clone(&metrics), MaterializerSettings { cpu_share: 1.0 }));
    Fixture { _dir: dir, timeline, metrics, materializer }
}

fn setup() -> Fixture {
    setup_with(Arc::new(ModelReconstructor))
}

/// An image of `k` at `first`, then a record at each LSN after it up to `last`.
fn hot(t: &Timeline, k: Key, first: u64, last: u64) {
    t.put(k, Lsn(first), &Value::Image(Bytes::from_static(b"i"))).unwrap();
    t.advance_last_record_lsn(Lsn(first)).unwrap();
    for lsn in first + 1..=last {
        t.put(k, Lsn(lsn), &Value::Record { will_init: false, rec: Bytes::from(format!("<{lsn}>")) }).unwrap();
        t.advance_last_record_lsn(Lsn(lsn)).unwrap();
    }
}

fn values(t: &Timeline, k: Key, lsns: std::ops::RangeInclusive<u64>) -> Vec<Option<Bytes>> {
    lsns.map(|l| t.get(k, Lsn(l), &ModelReconstructor).unwrap()).collect()
}

fn metric(m: &Metrics, line_start: &str) -> String {
    let mut out = Vec::new();
    prometheus::TextEncoder::new().encode(&m.gather(), &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    text.lines().find(|l| l.starts_with(line_start)).unwrap_or_else(|| panic!("{line_start} missing:\n{text}")).to_string()
}

#[test]
fn a_queued_hot_key_is_folded_and_no_read_changes() {
    let f = setup();
    let t = &f.timeline;
    hot(t, key(0), 10, 30);
    let before = values(t, key(0), 10..=30);
    assert_eq!(t.get_reconstruct_data(key(0), Lsn(30)).unwrap().records.len(), 20);
    let mut summary = Summary::default();
    assert_eq!(f.materializer.run_once(&StopFlag::default(), &mut summary), 1, "the key crossed 8 and 16: queued once");
    assert_eq!((summary.folded, summary.records), (1, 20));
    assert_eq!(values(t, key(0), 10..=30), before, "a fold changes no read");
    let data = t.get_reconstruct_data(key(0), Lsn(30)).unwrap();
    assert_eq!((data.image.map(|(l, _)| l), data.records.len()), (Some(Lsn(30)), 0), "the newest version is the image");
    assert_eq!(metric(&f.metrics, "pageserver_fold_images_total{trigger=\"chain\"}"), "pageserver_fold_images_total{trigger=\"chain\"} 1");
    assert_eq!(metric(&f.metrics, "pageserver_fold_seconds_count"), "pageserver_fold_seconds_count 1");
    // The bound: with the materializer keeping up, no read replays N records or more.
    for lsn in 31..=200u64 {
        t.put(key(0), Lsn(lsn), &Value::Record { will_init: false, rec: Bytes::from(format!("<{lsn}>")) }).unwrap();
        t.advance_last_record_lsn(Lsn(lsn)).unwrap();
        f.materializer.run_once(&StopFlag::default(), &mut summary);
        assert!(t.get_reconstruct_data(key(0), Lsn(lsn)).unwrap().records.len() < N as usize, "at {lsn}");
    }
}

#[test]
fn keys_are_skipped_with_a_reason() {
    // Short: an image arrived after the key was queued.
    let f = setup();
    let t = &f.timeline;
    hot(t, key(0), 10, 20);
    t.put(key(0), Lsn(21), &Value::Image(Bytes::from_static(b"fpi"))).unwrap();
    t.advance_last_record_lsn(Lsn(21)).unwrap();
    assert_eq!(f.materializer.fold_key(t, key(0)), FoldOutcome::Skipped("short"));
    assert_eq!(metric(&f.metrics, "pageserver_fold_skipped_total{reason=\"short\"}"), "pageserver_fold_skipped_total{reason=\"short\"} 1");
    // Not in memory: flushed before the fold.
    hot(t, key(1), 30, 50);
    t.freeze_and_flush().unwrap();
    assert_eq!(f.materializer.fold_key(t, key(1)), FoldOutcome::Skipped("not_in_memory"));

    // Redo fails: logged, counted, nothing changed.
    struct Failing;
    impl Reconstructor for Failing {
        fn reconstruct(&self, _: Key, _: Lsn, _: ReconstructData) -> anyhow::Result<Bytes> {
            anyhow::bail!("redo process died")
        }
    }
    let f = setup_with(Arc::new(Failing));
    hot(&f.timeline, key(0), 10, 30);
    assert_eq!(f.materializer.fold_key(&f.timeline, key(0)), FoldOutcome::Skipped("redo_error"));
    assert_eq!(f.timeline.get_reconstruct_data(key(0), Lsn(30)).unwrap().records.len(), 20);
}

#[test]
fn a_read_that_replayed_n_records_writes_its_page_back() {
    let f = setup();
    let t = &f.timeline;
    hot(t, key(0), 10, 10 + N as u64 - 1);
    let cost_of = |lsn: u64| {
        let data = t.get_reconstruct_data(key(0), Lsn(lsn)).unwrap();
        let cost = ReadCost {
            layers_visited: data.layers_visited,
            records_replayed: data.records.len(),
            newest_record_lsn: data.records.last().map(|(l, _)| *l),
        };
        (cost, ModelReconstructor.reconstruct(key(0), Lsn(lsn), data).unwrap())
    };
    // N - 1 records: below the threshold, nothing happens.
    let below = 10 + N as u64 - 1;
    let (cost, page) = cost_of(below);
    f.materializer.page_rebuilt(t, rel(), BlockNumber(0), cost, &page);
    assert_eq!(t.get_reconstruct_data(key(0), Lsn(below)).unwrap().records.len(), N as usize - 1);
    // N records, read at an LSN above the newest record: that record becomes the page.
    hot_more(t, 10 + N as u64, 10 + N as u64);
    let before = values(t, key(0), 10..=120);
    let (cost, page) = cost_of(120);
    assert_eq!(cost.records_replayed, N as usize);
    f.materializer.page_rebuilt(t, rel(), BlockNumber(0), cost, &page);
    let data = t.get_reconstruct_data(key(0), Lsn(120)).unwrap();
    assert_eq!((data.image.map(|(l, _)| l), data.records.len()), (Some(Lsn(10 + N as u64)), 0));
    assert_eq!(values(t, key(0), 10..=120), before);
    assert_eq!(metric(&f.metrics, "pageserver_fold_images_total{trigger=\"read\"}"), "pageserver_fold_images_total{trigger=\"read\"} 1");
}

fn hot_more(t: &Timeline, first: u64, last: u64) {
    for lsn in first..=last {
        t.put(key(0), Lsn(lsn), &Value::Record { will_init: false, rec: Bytes::from(format!("<{lsn}>")) }).unwrap();
        t.advance_last_record_lsn(Lsn(lsn)).unwrap();
    }
    t.advance_last_record_lsn(Lsn(120)).unwrap();
}

#[test]
fn the_thread_folds_on_its_own_and_stops() {
    let f = setup();
    let thread = MaterializerThread::start(Arc::clone(&f.materializer)).unwrap();
    hot(&f.timeline, key(3), 10, 10 + N as u64);
    let deadline = Instant::now() + Duration::from_secs(10);
    while f.timeline.get_reconstruct_data(key(3), Lsn(10 + N as u64)).unwrap().records.len() > 1 {
        assert!(Instant::now() < deadline, "the thread did not fold the key within 10 s");
        std::thread::sleep(Duration::from_millis(5));
    }
    thread.stop();
}

#[test]
fn pacing_keeps_to_the_cpu_share() {
    assert_eq!(pace(Duration::from_millis(10), 1.0), Duration::ZERO);
    assert_eq!(pace(Duration::from_millis(10), 0.25), Duration::from_millis(30));
}
