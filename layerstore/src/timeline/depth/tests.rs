//! Delta depth, partitions and image layers only where needed; the read cost a read reports.

use std::sync::Arc;

use bytes::Bytes;
use proto::{BlockNumber, ForkNumber, Key, KeyRange, Lsn, RelTag, TenantId, TimelineId};

use super::RangeDepth;
use crate::config::StorageConfig;
use crate::layer::LayerKind;
use crate::tenant::Tenant;
use crate::timeline::Timeline;
use crate::value::{ModelReconstructor, Value};

const TENANT: TenantId = TenantId([0x21; 16]);
const MAIN: TimelineId = TimelineId([0xA1; 16]);
const BRANCH: TimelineId = TimelineId([0xB1; 16]);

fn key(blk: u32) -> Key {
    Key::rel_block(RelTag { spcnode: 1663, dbnode: 5, relnode: 16384, forknum: ForkNumber::Main }, BlockNumber(blk))
}

fn conf() -> StorageConfig {
    StorageConfig {
        block_size_bytes: 64,
        compaction_l0_threshold: 2,
        compaction_target_size_bytes: 100,
        image_layer_target_size_bytes: 100,
        image_creation_threshold: 3,
        ..StorageConfig::default()
    }
}

fn setup() -> (tempfile::TempDir, Tenant, Arc<Timeline>) {
    let dir = tempfile::tempdir().unwrap();
    let tenant = Tenant::create(dir.path(), TENANT, conf(), &[]).unwrap();
    let timeline = tenant.create_timeline(MAIN).unwrap();
    (dir, tenant, timeline)
}

fn put(t: &Timeline, blk: u32, lsn: u64, value: Value) {
    t.put(key(blk), Lsn(lsn), &value).unwrap();
    t.advance_last_record_lsn(Lsn(lsn)).unwrap();
}

fn rec(s: &str) -> Value {
    Value::Record { will_init: false, rec: Bytes::from(s.to_string()) }
}

fn read(t: &Timeline, blk: u32, lsn: u64) -> String {
    String::from_utf8(t.get(key(blk), Lsn(lsn), &ModelReconstructor).unwrap().unwrap().to_vec()).unwrap()
}

/// Eight keys written once at LSN 10, then `hot_rounds` rounds each adding a record to key
/// 0 alone, flushed and compacted, so that the L1 layers of those rounds cover key 0 only.
fn hot_key_timeline(hot_rounds: u64) -> (tempfile::TempDir, Tenant, Arc<Timeline>) {
    let (dir, tenant, t) = setup();
    for blk in 0..8 {
        t.put(key(blk), Lsn(10), &Value::Image(Bytes::from(format!("v{blk}")))).unwrap();
    }
    t.advance_last_record_lsn(Lsn(10)).unwrap();
    t.freeze_and_flush().unwrap();
    t.compact_level0(true).unwrap();
    for round in 0..hot_rounds {
        put(&t, 0, 20 + 10 * round, rec(&format!("+{round}")));
        t.freeze_and_flush().unwrap();
        t.compact_level0(true).unwrap();
    }
    assert!(t.layers().iter().all(|d| !d.is_l0()), "everything compacted: {:?}", t.layers());
    (dir, tenant, t)
}

#[test]
fn partitions_tile_the_key_space_with_bounded_key_counts() {
    let (_dir, _tenant, t) = setup();
    assert_eq!(t.partition_keys(Lsn(0), 4).unwrap(), vec![KeyRange::ALL], "no keys: one partition");
    for blk in 0..10 {
        t.put(key(blk), Lsn(10), &Value::Image(Bytes::from_static(b"x"))).unwrap();
    }
    t.advance_last_record_lsn(Lsn(10)).unwrap();
    let parts = t.partition_keys(Lsn(10), 4).unwrap();
    assert_eq!(
        parts,
        vec![KeyRange { start: Key::MIN, end: key(4) }, KeyRange { start: key(4), end: key(8) }, KeyRange { start: key(8), end: Key::MAX },]
    );
    assert_eq!(t.partition_keys(Lsn(10), 100).unwrap(), vec![KeyRange::ALL]);
    assert_eq!(t.partition_keys(Lsn(10), 0).unwrap().len(), 10, "0 keys per partition means 1");
}

#[test]
fn depth_counts_delta_layers_above_the_newest_covering_image() {
    let (_dir, _tenant, t) = setup();
    let left = KeyRange { start: Key::MIN, end: key(4) };
    let right = KeyRange { start: key(4), end: Key::MAX };
    assert_eq!(t.delta_depth(&KeyRange::ALL), 0);
    for (i, lsn) in [10, 20, 30].into_iter().enumerate() {
        put(&t, 0, lsn, Value::Image(Bytes::from_static(b"a")));
        put(&t, 5, lsn + 1, Value::Image(Bytes::from_static(b"b")));
        assert_eq!(t.delta_depth(&KeyRange::ALL), i, "the open layer does not count");
        t.freeze_and_flush().unwrap();
        assert_eq!(t.delta_depth(&left), i + 1, "L0 layers cover every key");
    }
    t.create_image_layers(&left, t.disk_consistent_lsn(), &ModelReconstructor).unwrap();
    assert_eq!((t.delta_depth(&left), t.delta_depth(&right)), (0, 3));
    assert_eq!(t.delta_depth(&KeyRange::ALL), 3, "the deepest piece counts");
    put(&t, 0, 40, rec("c"));
    t.freeze_and_flush().unwrap();
    assert_eq!((t.delta_depth(&left), t.delta_depth(&right)), (1, 4));
}

#[test]
fn images_are_created_only_where_reads_walk_deep() {
    let (_dir, _tenant, t) = hot_key_timeline(3);
    let parts = t.partition_keys(t.disk_consistent_lsn(), 4).unwrap();
    assert_eq!(parts.len(), 2);
    let hot = parts[0];
    let depths: Vec<usize> = parts.iter().map(|p| t.delta_depth(p)).collect();
    assert_eq!(depths, vec![4, 1], "the initial layer plus three rounds of the hot key, against the initial layer alone");
    let before = t.get_reconstruct_data(key(0), t.last_record_lsn()).unwrap();
    assert_eq!((before.layers_visited, before.records.len()), (4, 3));
    let value = read(&t, 0, 40);
    assert_eq!(value, "v0+0+1+2");

    let result = t.create_image_layers_where_needed(&parts, conf().image_creation_threshold, 10, &ModelReconstructor).unwrap();
    assert_eq!(result.lsn, t.disk_consistent_lsn());
    assert_eq!(result.ranges, vec![RangeDepth { key_range: hot, depth: 4 }]);
    assert_eq!(result.ranges_deferred, 0);
    assert!(!result.layers_created.is_empty());
    for d in &result.layers_created {
        assert_eq!(d.kind, LayerKind::Image);
        assert!(hot.start <= d.key_range.start && d.key_range.end <= hot.end, "{d} outside {hot}");
    }
    let sizes: u64 = result.layers_created.iter().map(|d| t.layer_file_size_bytes(d).unwrap()).sum();
    assert_eq!(result.bytes_written, sizes);
    assert_eq!(t.delta_depth(&hot), 0);
    let after = t.get_reconstruct_data(key(0), t.last_record_lsn()).unwrap();
    assert_eq!((after.layers_visited, after.records.len()), (1, 0), "one image layer answers");
    for blk in 0..8 {
        let want = if blk == 0 { value.clone() } else { format!("v{blk}") };
        assert_eq!(read(&t, blk, 40), want);
    }
    // Nothing is deep any more: a second call does nothing.
    let again = t.create_image_layers_where_needed(&parts, conf().image_creation_threshold, 10, &ModelReconstructor).unwrap();
    assert_eq!((again.ranges.len(), again.layers_created.len(), again.bytes_written), (0, 0, 0));
}

#[test]
fn the_budget_takes_the_deepest_first_and_defers_the_rest() {
    let (_dir, _tenant, t) = hot_key_timeline(2);
    let parts = t.partition_keys(t.disk_consistent_lsn(), 4).unwrap();
    // Depth 0 asks for every partition: a forced rebuild.
    let result = t.create_image_layers_where_needed(&parts, 0, 1, &ModelReconstructor).unwrap();
    assert_eq!(result.ranges, vec![RangeDepth { key_range: parts[0], depth: 3 }]);
    assert_eq!(result.ranges_deferred, 1);
    let rest = t.create_image_layers_where_needed(&parts, 0, 1, &ModelReconstructor).unwrap();
    assert_eq!(rest.ranges, vec![RangeDepth { key_range: parts[1], depth: 1 }], "the deeper one is done");
    assert_eq!(t.deep_ranges(&parts, 1), vec![]);
    assert_eq!(read(&t, 0, 30), "v0+0+1");
}

#[test]
fn nothing_is_created_below_the_gc_cutoff_or_on_an_empty_timeline() {
    let (_dir, tenant, t) = setup();
    let none = t.create_image_layers_where_needed(&[KeyRange::ALL], 0, 10, &ModelReconstructor).unwrap();
    assert_eq!(none, Default::default());
    put(&t, 0, 10, Value::Image(Bytes::from_static(b"a")));
    t.freeze_and_flush().unwrap();
    put(&t, 0, 20, rec("b"));
    tenant.gc_timeline(MAIN, Lsn(20)).unwrap();
    assert!(t.disk_consistent_lsn() < t.gc_cutoff_lsn());
    let none = t.create_image_layers_where_needed(&[KeyRange::ALL], 0, 10, &ModelReconstructor).unwrap();
    assert_eq!(none, Default::default());
}

#[test]
fn reads_report_the_layers_they_searched_across_ancestors() {
    let (_dir, tenant, t) = setup();
    put(&t, 0, 10, Value::Image(Bytes::from_static(b"a")));
    t.freeze_and_flush().unwrap();
    put(&t, 0, 20, rec("b"));
    t.freeze_and_flush().unwrap();
    put(&t, 0, 30, rec("c"));
    let main = t.get_reconstruct_data(key(0), Lsn(30)).unwrap();
    assert_eq!((main.layers_visited, main.records.len()), (3, 2), "open layer and two L0 layers");
    let branch = tenant.branch_timeline(BRANCH, MAIN, Lsn(30)).unwrap();
    put(&branch, 0, 40, rec("d"));
    let data = branch.get_reconstruct_data(key(0), Lsn(40)).unwrap();
    assert_eq!((data.layers_visited, data.records.len()), (4, 3), "the branch's open layer, then the ancestor's three");
    assert_eq!(read(&branch, 0, 40), "abcd");
    assert_eq!(t.get_reconstruct_data(key(7), Lsn(30)).unwrap().layers_visited, 3, "a missing key searches every layer");
}
