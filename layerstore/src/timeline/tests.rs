//! Timeline tests: writes and their errors, reads across freeze, flush and reload,
//! wait_lsn, compaction, image layers, GC, branches, and crash leftovers.

use std::fs;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use proto::{BlockNumber, ForkNumber, Key, KeyRange, Lsn, RelTag, TenantId, TimelineId};

use crate::config::StorageConfig;
use crate::error::{CreateTimelineError, ReadError, WriteError};
use crate::layer::LayerKind;
use crate::tenant::Tenant;
use crate::timeline::Timeline;
use crate::value::{ModelReconstructor, Value};

const TENANT: TenantId = TenantId([0x11; 16]);
const MAIN: TimelineId = TimelineId([0xAA; 16]);
const BRANCH: TimelineId = TimelineId([0xBB; 16]);

fn key(blk: u32) -> Key {
    Key::rel_block(RelTag { spcnode: 1663, dbnode: 5, relnode: 16384, forknum: ForkNumber::Main }, BlockNumber(blk))
}

fn rec(s: &str) -> Value {
    Value::Record { will_init: false, rec: Bytes::from(s.to_string()) }
}

fn img(s: &str) -> Value {
    Value::Image(Bytes::from(s.to_string()))
}

fn hostile() -> StorageConfig {
    StorageConfig {
        block_size_bytes: 64,
        compaction_l0_threshold: 2,
        compaction_target_size_bytes: 300,
        image_layer_target_size_bytes: 200,
        ..StorageConfig::default()
    }
}

fn setup(conf: StorageConfig) -> (tempfile::TempDir, Tenant, Arc<Timeline>) {
    let dir = tempfile::tempdir().unwrap();
    let tenant = Tenant::create(dir.path(), TENANT, conf, &[]).unwrap();
    let timeline = tenant.create_timeline(MAIN).unwrap();
    (dir, tenant, timeline)
}

fn get(t: &Timeline, k: Key, lsn: u64) -> Option<String> {
    t.get(k, Lsn(lsn), &ModelReconstructor).unwrap().map(|b| String::from_utf8(b.to_vec()).unwrap())
}

/// Puts `v` at `lsn` and publishes `lsn`.
fn put(t: &Timeline, k: Key, lsn: u64, v: Value) {
    t.put(k, Lsn(lsn), &v).unwrap();
    t.advance_last_record_lsn(Lsn(lsn)).unwrap();
}

#[test]
fn reads_see_versions_up_to_their_lsn_across_freeze_flush_and_reload() {
    let (dir, tenant, t) = setup(hostile());
    put(&t, key(1), 10, img("a"));
    put(&t, key(1), 20, rec("b"));
    t.freeze_and_flush().unwrap();
    put(&t, key(1), 30, rec("c"));
    t.freeze().unwrap();
    put(&t, key(2), 40, rec("x"));
    let check = |t: &Timeline| {
        assert_eq!(get(t, key(1), 9), None);
        assert_eq!(get(t, key(1), 10).as_deref(), Some("a"));
        assert_eq!(get(t, key(1), 25).as_deref(), Some("ab"));
        assert_eq!(get(t, key(1), 40).as_deref(), Some("abc"));
        assert_eq!(get(t, key(2), 40).as_deref(), Some("x"));
    };
    check(&t);
    let data = t.get_reconstruct_data(key(1), Lsn(40)).unwrap();
    assert_eq!(data.image, Some((Lsn(10), Bytes::from_static(b"a"))));
    assert_eq!(data.records.iter().map(|(l, _)| l.0).collect::<Vec<_>>(), vec![20, 30]);
    assert_eq!(t.keys_in_range(&KeyRange::ALL, Lsn(30)).unwrap(), vec![key(1)]);
    t.flush_frozen_layers().unwrap();
    assert_eq!(t.disk_consistent_lsn(), Lsn(30), "the open layer holds LSN 40");
    t.freeze_and_flush().unwrap();
    assert_eq!(t.disk_consistent_lsn(), Lsn(40));
    drop((t, tenant));
    let tenant = Tenant::load(dir.path(), TENANT, hostile(), &[]).unwrap();
    let t = tenant.get_timeline(MAIN).unwrap();
    assert_eq!(t.last_record_lsn(), Lsn(40));
    check(&t);
    assert_eq!(t.layers().iter().filter(|d| d.is_l0()).count(), 3);
}

#[test]
fn misuse_of_puts_is_refused() {
    let (_dir, _tenant, t) = setup(StorageConfig::default());
    put(&t, key(1), 10, rec("a"));
    let err = |r: Result<(), WriteError>| r.unwrap_err().to_string();
    assert_eq!(
        err(t.put(key(1), Lsn(10), &rec("b"))),
        format!("cannot put key {} at LSN 0/A: not above the last record LSN 0/A, which readers may already have seen", key(1))
    );
    t.put(key(1), Lsn(20), &rec("b")).unwrap();
    t.put(key(2), Lsn(20), &rec("b")).unwrap();
    assert!(matches!(t.put(key(1), Lsn(15), &rec("c")), Err(WriteError::LsnRegression { .. })));
    assert!(matches!(t.put(key(1), Lsn::INVALID, &rec("c")), Err(WriteError::InvalidLsn { .. })));
    assert!(matches!(t.put(Key::MAX, Lsn(30), &rec("c")), Err(WriteError::ReservedKey { .. })));
    assert_eq!(err(t.freeze()), "cannot freeze at last record LSN 0/A: values put at LSN 0/14 are not published yet");
    assert_eq!(err(t.advance_last_record_lsn(Lsn(19))), "cannot advance the last record LSN to 0/13: below 0/14");
    let big = Value::Image(Bytes::from(vec![0u8; crate::value::VALUE_SIZE_BYTES_MAX + 1]));
    assert!(matches!(t.put(key(1), Lsn(30), &big), Err(WriteError::ValueTooLarge { .. })));
    t.advance_last_record_lsn(Lsn(20)).unwrap();
    t.freeze().unwrap();
    let e = t.get(key(1), Lsn(21), &ModelReconstructor).unwrap_err();
    assert_eq!(e.to_string(), "requested LSN 0/15 has not been ingested yet: last record LSN is 0/14");
}

#[test]
fn wait_lsn_times_out_with_a_clear_message_and_wakes_on_advance() {
    let (_dir, _tenant, t) = setup(StorageConfig::default());
    put(&t, key(1), 0x10, rec("a"));
    let err = t.wait_lsn(Lsn(0x20), Duration::from_millis(20)).unwrap_err();
    assert_eq!(err.to_string(), "timed out after 20ms waiting for LSN 0/20 to be ingested: last record LSN is 0/10");
    t.wait_lsn(Lsn(0x10), Duration::ZERO).unwrap();
    let waiter = {
        let t = t.clone();
        std::thread::spawn(move || t.wait_lsn(Lsn(0x30), Duration::from_secs(30)))
    };
    std::thread::sleep(Duration::from_millis(10));
    t.advance_last_record_lsn(Lsn(0x30)).unwrap();
    waiter.join().unwrap().unwrap();
}

/// Writes `n` flushes' worth of versions for keys 0..8, each key getting a will_init
/// record now and then, and returns the expected value of every key at the end.
fn fill(t: &Timeline, flushes: u64) -> Vec<String> {
    let mut expected = vec![String::new(); 8];
    let mut lsn = t.last_record_lsn().0;
    for f in 0..flushes {
        for k in 0..8u32 {
            lsn += 1;
            let s = format!("{f}.{k};");
            let will_init = (f + u64::from(k)) % 3 == 0;
            t.put(key(k), Lsn(lsn), &Value::Record { will_init, rec: Bytes::from(s.clone()) }).unwrap();
            if will_init {
                expected[k as usize].clear();
            }
            expected[k as usize].push_str(&s);
        }
        t.advance_last_record_lsn(Lsn(lsn)).unwrap();
        t.freeze_and_flush().unwrap();
    }
    expected
}

#[test]
fn compaction_partitions_l0_into_l1_without_changing_answers() {
    let (_dir, _tenant, t) = setup(hostile());
    let expected = fill(&t, 4);
    let before: Vec<_> = (0..32).map(|lsn| (0..8).map(|k| get(&t, key(k), lsn)).collect::<Vec<_>>()).collect();
    let result = t.compact().unwrap();
    assert_eq!(result.l0_removed.len(), 4);
    assert!(result.l1_created.len() > 1, "small target size must split: {result:?}");
    for w in result.l1_created.windows(2) {
        assert!(w[0].key_range.end <= w[1].key_range.start, "L1 key ranges overlap");
    }
    assert!(t.layers().iter().all(|d| !d.is_l0()));
    let after: Vec<_> = (0..32).map(|lsn| (0..8).map(|k| get(&t, key(k), lsn)).collect::<Vec<_>>()).collect();
    assert_eq!(before, after);
    for (k, v) in expected.iter().enumerate() {
        assert_eq!(get(&t, key(k as u32), 32).as_ref(), Some(v));
    }
    assert_eq!(t.compact().unwrap(), Default::default(), "nothing left to compact");
}

#[test]
fn compaction_merges_l0_layers_across_a_gap_left_by_a_freeze_with_nothing_to_flush() {
    let (_dir, _tenant, t) = setup(hostile());
    put(&t, key(1), 10, img("a"));
    t.freeze_and_flush().unwrap();
    // The log moves on without a page change (say a checkpoint record), then an idle flush:
    // nothing to write, but the next layer starts above that LSN.
    t.advance_last_record_lsn(Lsn(20)).unwrap();
    t.freeze_and_flush().unwrap();
    assert_eq!(t.disk_consistent_lsn(), Lsn(20));
    put(&t, key(1), 30, rec("b"));
    t.freeze_and_flush().unwrap();
    put(&t, key(2), 40, img("x"));
    t.freeze_and_flush().unwrap();
    let l0: Vec<_> = t.layers().into_iter().filter(|d| d.is_l0()).collect();
    assert_eq!(l0.len(), 3);
    assert!(l0[0].lsn_range.end < l0[1].lsn_range.start, "a gap between the first two: {l0:?}");
    let result = t.compact().unwrap();
    assert_eq!(result.l0_removed.len(), 3, "every L0 layer, across the gap: {result:?}");
    assert!(t.layers().iter().all(|d| !d.is_l0()));
    assert_eq!(get(&t, key(1), 25).as_deref(), Some("a"));
    assert_eq!(get(&t, key(1), 40).as_deref(), Some("ab"));
    assert_eq!(get(&t, key(2), 40).as_deref(), Some("x"));
}

#[test]
fn compaction_never_writes_an_l1_layer_covering_all_keys() {
    let (_dir, _tenant, t) = setup(StorageConfig::default());
    let last = Key::last_running_xacts();
    assert_eq!(last.next(), Key::MAX, "the test needs the last key of the key space");
    put(&t, Key::MIN, 1, rec("first"));
    put(&t, last, 2, rec("last"));
    t.freeze_and_flush().unwrap();
    let result = t.compact_level0(true).unwrap();
    assert_eq!(result.l1_created.len(), 2, "{result:?}");
    assert_eq!(get(&t, Key::MIN, 2).as_deref(), Some("first"));
    assert_eq!(get(&t, last, 2).as_deref(), Some("last"));
}

#[test]
fn gc_removes_covered_layers_and_refuses_reads_below_the_cutoff() {
    let (_dir, tenant, t) = setup(hostile());
    let expected = fill(&t, 3);
    t.compact().unwrap();
    let image_lsn = t.disk_consistent_lsn();
    let images = t.create_image_layers(&KeyRange::ALL, image_lsn, &ModelReconstructor).unwrap();
    assert!(images.len() > 1, "small target size must split: {images:?}");
    assert_eq!(images.first().unwrap().key_range.start, Key::MIN);
    assert_eq!(images.last().unwrap().key_range.end, Key::MAX);
    for w in images.windows(2) {
        assert_eq!(w[0].key_range.end, w[1].key_range.start, "image layers must tile the range");
    }
    let more = fill(&t, 1);
    let deltas_before = t.layers().iter().filter(|d| d.kind == LayerKind::Delta).count();
    let result = tenant.gc_timeline(MAIN, image_lsn).unwrap();
    assert_eq!(result.cutoff, image_lsn);
    assert_eq!(result.layers_removed.len(), deltas_before - 1, "all deltas but the newest L0: {result:?}");
    let err = t.get(key(0), Lsn(image_lsn.0 - 1), &ModelReconstructor).unwrap_err();
    assert!(matches!(err, ReadError::BelowGcHorizon { .. }));
    assert_eq!(err.to_string(), format!("requested LSN {} is below the garbage collection horizon {image_lsn}", Lsn(image_lsn.0 - 1)));
    for k in 0..8u32 {
        assert_eq!(get(&t, key(k), image_lsn.0).as_ref(), Some(&expected[k as usize]));
        assert!(get(&t, key(k), t.last_record_lsn().0).unwrap().ends_with(&more[k as usize]));
    }
    // A lower cutoff does not lower the horizon.
    assert_eq!(tenant.gc_timeline(MAIN, Lsn(1)).unwrap().cutoff, image_lsn);
    let beyond = tenant.gc_timeline(MAIN, Lsn(t.last_record_lsn().0 + 1)).unwrap_err();
    assert!(beyond.to_string().contains("beyond the last record LSN"), "{beyond}");
}

#[test]
fn gc_keeps_what_a_child_branch_point_needs() {
    let (_dir, tenant, t) = setup(hostile());
    fill(&t, 2);
    let branch_point = t.last_record_lsn();
    let at_branch: Vec<_> = (0..8).map(|k| get(&t, key(k), branch_point.0)).collect();
    let child = tenant.branch_timeline(BRANCH, MAIN, branch_point).unwrap();
    fill(&t, 2);
    let image_lsn = t.disk_consistent_lsn();
    t.create_image_layers(&KeyRange::ALL, image_lsn, &ModelReconstructor).unwrap();
    let result = tenant.gc_timeline(MAIN, image_lsn).unwrap();
    assert_eq!(result.layers_removed.len(), 2, "the two L0 layers after the branch point: {result:?}");
    assert!(result.layers_removed.iter().all(|d| d.lsn_range.start > branch_point), "{result:?}");
    assert_eq!(t.layers().iter().filter(|d| d.lsn_range.start <= branch_point).count(), 2, "needed by the child");
    put(&child, key(0), branch_point.0 + 100, rec("child"));
    for k in 0..8u32 {
        let mut want = at_branch[k as usize].clone();
        assert_eq!(get(&child, key(k), branch_point.0 + 1), want);
        if k == 0 {
            want.as_mut().unwrap().push_str("child");
        }
        assert_eq!(get(&child, key(k), branch_point.0 + 100), want);
    }
    // Below the branch point the child reads through to the parent, whose horizon now
    // refuses it.
    let err = child.get(key(0), Lsn(branch_point.0 - 1), &ModelReconstructor).unwrap_err();
    assert!(matches!(err, ReadError::BelowGcHorizon { horizon, .. } if horizon == image_lsn), "{err}");
}

#[test]
fn branch_errors() {
    let (_dir, tenant, t) = setup(StorageConfig::default());
    put(&t, key(1), 100, rec("a"));
    let e = |r: Result<Arc<Timeline>, CreateTimelineError>| r.unwrap_err().to_string();
    assert_eq!(
        e(tenant.branch_timeline(BRANCH, MAIN, Lsn(101))),
        "cannot branch at LSN 0/65: the ancestor has only ingested up to LSN 0/64"
    );
    let missing = TimelineId([0xCC; 16]);
    assert_eq!(e(tenant.branch_timeline(BRANCH, missing, Lsn(50))), format!("ancestor timeline {missing} not found"));
    assert_eq!(e(tenant.create_timeline(MAIN)), format!("timeline {MAIN} already exists"));
    tenant.gc_timeline(MAIN, Lsn(60)).unwrap();
    assert_eq!(
        e(tenant.branch_timeline(BRANCH, MAIN, Lsn(59))),
        "cannot branch at LSN 0/3B: below the ancestor's garbage collection horizon 0/3C"
    );
    let child = tenant.branch_timeline(BRANCH, MAIN, Lsn(80)).unwrap();
    assert_eq!(child.gc_cutoff_lsn(), Lsn(60), "a branch inherits its ancestor's horizon");
    assert_eq!(e(tenant.branch_timeline(BRANCH, MAIN, Lsn(90))), format!("timeline {BRANCH} already exists"));
    assert_eq!(
        e(tenant.branch_timeline(TimelineId([0xDD; 16]), BRANCH, Lsn(70))),
        format!("cannot branch at LSN 0/46: below the ancestor's own branch point 0/50; branch from timeline {MAIN} instead")
    );
    // O(1): the new timeline directory holds only its metadata file.
    let names: Vec<_> = fs::read_dir(child.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from("metadata")]);
}

#[test]
fn branches_read_through_to_ancestors_and_survive_reload() {
    let (dir, tenant, t) = setup(hostile());
    put(&t, key(1), 10, img("base"));
    put(&t, key(2), 11, img("two"));
    let child = tenant.branch_timeline(BRANCH, MAIN, Lsn(11)).unwrap();
    put(&t, key(1), 20, rec("+main"));
    put(&child, key(1), 30, rec("+child"));
    let grandchild = tenant.branch_timeline(TimelineId([0xDD; 16]), BRANCH, Lsn(30)).unwrap();
    assert_eq!(get(&child, key(1), 30).as_deref(), Some("base+child"));
    assert_eq!(get(&child, key(1), 10).as_deref(), Some("base"), "below the branch point, read the ancestor");
    assert_eq!(get(&grandchild, key(2), 30).as_deref(), Some("two"));
    assert_eq!(get(&t, key(1), 20).as_deref(), Some("base+main"));
    assert_eq!(grandchild.keys_in_range(&KeyRange::ALL, Lsn(30)).unwrap(), vec![key(1), key(2)]);
    tenant.flush_all().unwrap();
    drop((t, child, grandchild, tenant));
    let tenant = Tenant::load(dir.path(), TENANT, hostile(), &[]).unwrap();
    assert_eq!(tenant.timelines().len(), 3);
    let grandchild = tenant.get_timeline(TimelineId([0xDD; 16])).unwrap();
    assert_eq!(get(&grandchild, key(1), 30).as_deref(), Some("base+child"));
    assert_eq!(grandchild.ancestor_lsn(), Some(Lsn(30)));
}

#[test]
fn load_removes_crash_leftovers_and_refuses_unknown_files() {
    let (dir, tenant, t) = setup(hostile());
    put(&t, key(1), 10, rec("a"));
    t.freeze_and_flush().unwrap();
    put(&t, key(1), 20, rec("b"));
    t.freeze().unwrap();
    // Simulate a crash after the layer file was written but before the metadata update:
    // write the layer for LSN 20, then put the old metadata back.
    let meta = fs::read(t.path().join("metadata")).unwrap();
    t.flush_frozen_layers().unwrap();
    fs::write(t.path().join("metadata"), meta).unwrap();
    put(&t, key(1), 30, rec("c")); // leaves an ephemeral file
    fs::write(t.path().join("layer-1-2.___temp"), b"junk").unwrap();
    fs::write(t.path().join("ephemeral-99"), b"junk").unwrap(); // a crash leaves these too
    let path = t.path().to_path_buf();
    drop((t, tenant));
    fs::create_dir(dir.path().join(TENANT.to_string()).join("timelines").join(format!("{BRANCH}.___temp"))).unwrap();
    let tenant = Tenant::load(dir.path(), TENANT, hostile(), &[]).unwrap();
    let t = tenant.get_timeline(MAIN).unwrap();
    assert_eq!(t.last_record_lsn(), Lsn(10));
    assert_eq!(t.layers().len(), 1, "the layer above the disk-consistent LSN is gone");
    let mut names: Vec<String> = fs::read_dir(&path).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert_eq!(names.len(), 2, "{names:?}");
    assert_eq!(tenant.timelines().len(), 1);
    // The log is ingested again from LSN 11.
    put(&t, key(1), 20, rec("b"));
    assert_eq!(get(&t, key(1), 20).as_deref(), Some("ab"));
    drop((t, tenant));
    fs::write(path.join("stray"), b"?").unwrap();
    let err = Tenant::load(dir.path(), TENANT, hostile(), &[]).err().unwrap();
    assert!(format!("{err:#}").contains("unexpected file in timeline directory"), "{err:#}");
    // An entry the caller declares as its own is left alone, file or directory.
    fs::create_dir(path.join("callers_dir")).unwrap();
    let tenant = Tenant::load(dir.path(), TENANT, hostile(), &["stray", "callers_dir"]).unwrap();
    assert_eq!(tenant.timelines().len(), 1);
    assert_eq!(fs::read(path.join("stray")).unwrap(), b"?");
    assert!(path.join("callers_dir").is_dir());
    // Beside `timelines/`, a tenant directory holds what the caller puts there.
    drop(tenant);
    let settings = dir.path().join(TENANT.to_string()).join("callers_settings.json");
    fs::write(&settings, b"{}").unwrap();
    let tenant = Tenant::load(dir.path(), TENANT, hostile(), &["stray", "callers_dir"]).unwrap();
    assert_eq!(tenant.timelines().len(), 1);
    assert_eq!(fs::read(&settings).unwrap(), b"{}");
}

#[test]
fn a_corrupt_layer_file_is_reported_not_served() {
    let (dir, tenant, t) = setup(StorageConfig::default());
    put(&t, key(1), 10, img("page"));
    t.freeze_and_flush().unwrap();
    let layer = t.layers().into_iter().find(|d| d.is_l0()).unwrap();
    let path = t.path().join(layer.file_name());
    drop((t, tenant));
    let mut bytes = fs::read(&path).unwrap();
    let mid = 128 + 14; // inside the first block's compressed payload
    bytes[mid] ^= 0xFF;
    fs::write(&path, &bytes).unwrap();
    let tenant = Tenant::load(dir.path(), TENANT, StorageConfig::default(), &[]).unwrap();
    let t = tenant.get_timeline(MAIN).unwrap();
    let err = t.get(key(1), Lsn(10), &ModelReconstructor).unwrap_err();
    assert!(matches!(&err, ReadError::Layer(e) if e.is_corruption()));
    assert!(err.to_string().contains(&format!("{} is corrupt at offset 128: block checksum mismatch", path.display())), "{err}");
}

#[test]
fn an_open_layer_older_than_the_checkpoint_timeout_is_flushed_whatever_its_size() {
    let conf = StorageConfig { checkpoint_timeout_ms: 50, ..StorageConfig::default() };
    let (_dir, _tenant, t) = setup(conf);
    assert!(!t.maybe_freeze_and_flush().unwrap(), "no open layer: nothing to flush");
    put(&t, key(1), 100, rec("abcd"));
    assert!(!t.maybe_freeze_and_flush().unwrap(), "a fresh layer of 4 bytes stays open");
    std::thread::sleep(std::time::Duration::from_millis(60));
    assert!(t.maybe_freeze_and_flush().unwrap());
    assert_eq!(t.disk_consistent_lsn(), Lsn(100));
    // The next layer's age starts at its own first put.
    std::thread::sleep(std::time::Duration::from_millis(60));
    put(&t, key(1), 101, rec("efgh"));
    assert!(!t.maybe_freeze_and_flush().unwrap());

    let off = StorageConfig { checkpoint_timeout_ms: 0, ..StorageConfig::default() };
    let (_dir, _tenant, t) = setup(off);
    put(&t, key(1), 100, rec("abcd"));
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert!(!t.maybe_freeze_and_flush().unwrap(), "0 turns the timeout off");
}

#[test]
fn gc_iteration_uses_the_configured_horizon_and_flushes_by_size() {
    let conf = StorageConfig { gc_horizon_bytes: 10, checkpoint_distance_bytes: 8, ..StorageConfig::default() };
    let (_dir, tenant, t) = setup(conf);
    put(&t, key(1), 100, rec("abcd"));
    assert!(!t.maybe_freeze_and_flush().unwrap(), "4 bytes are below the checkpoint distance");
    put(&t, key(1), 101, rec("efgh"));
    assert!(t.maybe_freeze_and_flush().unwrap());
    assert_eq!(t.disk_consistent_lsn(), Lsn(101));
    assert_eq!(t.open_layer_size_bytes(), 0);
    let results = tenant.gc_iteration().unwrap();
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].1.cutoff, Lsn(91));
    assert_eq!(t.gc_cutoff_lsn(), Lsn(91));
}

#[test]
fn tenant_refuses_duplicates_and_missing_ancestors() {
    let (dir, tenant, t) = setup(StorageConfig::default());
    assert!(Tenant::create(dir.path(), TENANT, StorageConfig::default(), &[]).is_err(), "tenant created twice");
    put(&t, key(1), 10, rec("a"));
    let child = tenant.branch_timeline(BRANCH, MAIN, Lsn(10)).unwrap();
    let main_path = t.path().to_path_buf();
    drop((t, child, tenant));
    fs::remove_dir_all(&main_path).unwrap();
    let err = Tenant::load(dir.path(), TENANT, StorageConfig::default(), &[]).err().unwrap();
    assert_eq!(err.to_string(), format!("cannot load timelines {BRANCH}: their ancestors are missing"));
    let bad = StorageConfig { block_size_bytes: 0, ..StorageConfig::default() };
    assert!(Tenant::load(dir.path(), TENANT, bad, &[]).is_err(), "invalid configuration accepted");
}
