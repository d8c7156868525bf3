//! A chain queued by its bytes is folded: a few large records (a multi-block WAL record is
//! stored whole on every block it touches) are as costly to replay as many small ones.

use std::sync::Arc;

use bytes::Bytes;
use layerstore::tenant::Tenant;
use layerstore::value::ModelReconstructor;
use layerstore::{StorageConfig, Value};
use pageserver::service::materializer::{FoldOutcome, Materializer, MaterializerSettings};
use pageserver::service::metrics::Metrics;
use pageserver::service::page_service::TenantRegistry;
use proto::{BlockNumber, ForkNumber, Key, Lsn, RelTag, TenantId, TimelineId};

fn key() -> Key {
    Key::rel_block(RelTag { spcnode: 1663, dbnode: 5, relnode: 16384, forknum: ForkNumber::Main }, BlockNumber(0))
}

/// The byte threshold queues a key with 60 records of 20 KiB; the materializer must fold it
/// although it has fewer records than half the record threshold (found by a review: it was
/// skipped as "short", and every read replayed all 1.2 MiB).
#[test]
fn a_key_queued_by_the_byte_threshold_is_folded() {
    let dir = tempfile::tempdir().unwrap();
    // The default thresholds: 128 records or 1 MiB.
    let conf = StorageConfig::default();
    conf.validate().unwrap();
    let tenant = Arc::new(Tenant::create(dir.path(), TenantId([5; 16]), conf, &[]).unwrap());
    let t = tenant.create_timeline(TimelineId([6; 16])).unwrap();
    let registry = Arc::new(TenantRegistry::default());
    registry.insert(tenant);
    let m = Materializer::new(registry, Arc::new(ModelReconstructor), Arc::new(Metrics::new()), MaterializerSettings { cpu_share: 1.0 });

    t.put(key(), Lsn(10), &Value::Image(Bytes::from(vec![0u8; 8192]))).unwrap();
    t.advance_last_record_lsn(Lsn(10)).unwrap();
    // 60 records of 20 KiB (a multi-block WAL record carrying other blocks' contents or FPIs
    // is stored whole on each block it touches): 1.2 MiB crosses 1 MiB once.
    for lsn in 11..=70u64 {
        t.put(key(), Lsn(lsn), &Value::Record { will_init: false, rec: Bytes::from(vec![lsn as u8; 20 * 1024]) }).unwrap();
        t.advance_last_record_lsn(Lsn(lsn)).unwrap();
    }
    let queued = t.take_long_chains(16);
    assert_eq!(queued.iter().map(|(k, _)| *k).collect::<Vec<_>>(), vec![key()], "the byte threshold queued the key");
    let outcome = m.fold_key(&t, key());
    let replayed = t.get_reconstruct_data(key(), Lsn(70)).unwrap().records.len();
    assert_eq!(
        (outcome, replayed),
        (FoldOutcome::Folded { records: 60 }, 0),
        "a key queued for 1.2 MiB of records must be folded, not skipped (reads replay {replayed} records)"
    );
}
