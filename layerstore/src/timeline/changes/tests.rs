//! `changed_keys` against a model of the puts: in-memory (open and frozen) layers and layer
//! files, keys whose versions span blocks, compaction, image layers, GC, reload, branches,
//! and every refusal with its message. Evicted layers are tested with remote storage in
//! `remote/tests.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use proto::{BlockNumber, ForkNumber, Key, KeyRange, Lsn, RelTag, TenantId, TimelineId};

use crate::config::StorageConfig;
use crate::error::ChangedKeysError;
use crate::tenant::Tenant;
use crate::timeline::Timeline;
use crate::value::{ModelReconstructor, Value};

const TENANT: TenantId = TenantId([0x33; 16]);
const MAIN: TimelineId = TimelineId([0xAA; 16]);
const BRANCH: TimelineId = TimelineId([0xBB; 16]);
const NO_LIMIT: usize = usize::MAX;

fn key(blk: u32) -> Key {
    Key::rel_block(RelTag { spcnode: 1663, dbnode: 5, relnode: 16384, forknum: ForkNumber::Main }, BlockNumber(blk))
}

/// Blocks of 64 bytes, so that a key with a few 20-byte versions spans blocks, and small
/// layers.
fn hostile() -> StorageConfig {
    StorageConfig {
        block_size_bytes: 64,
        compaction_l0_threshold: 2,
        compaction_target_size_bytes: 300,
        image_layer_target_size_bytes: 200,
        ..StorageConfig::default()
    }
}

fn setup(dir: &std::path::Path) -> (Tenant, Arc<Timeline>) {
    let tenant = Tenant::create(dir, TENANT, hostile(), &[]).unwrap();
    let timeline = tenant.create_timeline(MAIN).unwrap();
    (tenant, timeline)
}

/// The puts of one timeline, and what `changed_keys` must answer for them.
#[derive(Default)]
struct Model {
    puts: BTreeMap<(Key, Lsn), ()>,
}

impl Model {
    /// Puts a 20-byte record (an image every fifth LSN) and publishes its LSN.
    fn put(&mut self, t: &Timeline, k: Key, lsn: u64) {
        let bytes = Bytes::from(format!("{lsn:>20}"));
        let value = if lsn.is_multiple_of(5) { Value::Image(bytes) } else { Value::Record { will_init: false, rec: bytes } };
        t.put(k, Lsn(lsn), &value).unwrap();
        t.advance_last_record_lsn(Lsn(lsn)).unwrap();
        self.puts.insert((k, Lsn(lsn)), ());
    }

    fn changed(&self, range: &KeyRange, from: u64, to: u64) -> Vec<(Key, Lsn)> {
        let mut newest: BTreeMap<Key, Lsn> = BTreeMap::new();
        for (k, lsn) in self.puts.keys().filter(|(k, lsn)| range.contains(k) && lsn.0 > from && lsn.0 <= to) {
            newest.insert(*k, *lsn);
        }
        newest.into_iter().collect()
    }

    /// Checks every `from..=to` pair up to `last` (from `first` on) over the whole key space
    /// and over one key.
    fn check_all(&self, t: &Timeline, first: u64, last: u64, what: &str) {
        for from in first..=last {
            for to in from..=last {
                for range in [KeyRange::ALL, KeyRange::single(key(2))] {
                    let got = t.changed_keys(&range, Lsn(from), Lsn(to), NO_LIMIT).unwrap();
                    assert_eq!(got, self.changed(&range, from, to), "{what}: {range} from {from} to {to}");
                }
            }
        }
    }
}

#[test]
fn the_newest_change_of_each_key_is_listed_from_files_frozen_and_open_layers() {
    let dir = tempfile::tempdir().unwrap();
    let (tenant, t) = setup(dir.path());
    let mut model = Model::default();
    // A layer file in which key 0 has six versions across several blocks.
    for lsn in 1..=30 {
        model.put(&t, key((lsn % 5) as u32), lsn);
    }
    t.freeze_and_flush().unwrap();
    for lsn in 31..=40 {
        model.put(&t, key((lsn % 3) as u32), lsn);
    }
    t.freeze().unwrap();
    for lsn in 41..=50 {
        model.put(&t, key((lsn % 7) as u32), lsn);
    }
    let kinds: Vec<String> = t.layers().iter().map(|d| d.to_string()).collect();
    assert_eq!(kinds.len(), 3, "a file, a frozen and an open layer: {kinds:?}");
    model.check_all(&t, 0, 50, "before reload");
    assert_eq!(t.changed_keys(&KeyRange::ALL, Lsn(50), Lsn(50), 0).unwrap(), vec![], "an empty range lists nothing");

    t.freeze_and_flush().unwrap();
    drop((t, tenant));
    let tenant = Tenant::load(dir.path(), TENANT, hostile(), &[]).unwrap();
    let t = tenant.get_timeline(MAIN).unwrap();
    model.check_all(&t, 0, 50, "after reload");
}

#[test]
fn compaction_image_layers_and_gc_above_the_range_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (_tenant, t) = setup(dir.path());
    let mut model = Model::default();
    let mut lsn = 0;
    for _flush in 0..4 {
        for k in 0..6 {
            lsn += 1;
            model.put(&t, key(k), lsn);
            if k % 2 == 0 {
                lsn += 1;
                model.put(&t, key(k), lsn);
            }
        }
        t.freeze_and_flush().unwrap();
    }
    let last = lsn;
    model.check_all(&t, 0, last, "L0 layers");
    let compacted = t.compact_level0(true).unwrap();
    assert!(compacted.l1_created.len() > 1, "{compacted:?}");
    model.check_all(&t, 0, last, "L1 layers");
    let images = t.create_image_layers(&KeyRange::ALL, Lsn(last), &ModelReconstructor).unwrap();
    assert!(!images.is_empty());
    model.check_all(&t, 0, last, "with image layers");

    // More changes, then GC at a cutoff that removes the layers below the images.
    for k in 0..3 {
        lsn += 1;
        model.put(&t, key(k), lsn);
    }
    t.freeze_and_flush().unwrap();
    let gc = t.gc(Lsn(last), &[]).unwrap();
    assert!(!gc.layers_removed.is_empty(), "GC removed the layers the images cover: {gc:?}");
    model.check_all(&t, last, lsn, "after GC");
    let err = t.changed_keys(&KeyRange::ALL, Lsn(last - 1), Lsn(lsn), NO_LIMIT).unwrap_err();
    assert!(matches!(err, ChangedKeysError::BelowGcHorizon { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "cannot list changes since LSN {}: below the garbage collection horizon {}, the history before which is gone",
            Lsn(last - 1),
            Lsn(last)
        )
    );
}

#[test]
fn refusals_name_their_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (_tenant, t) = setup(dir.path());
    let mut model = Model::default();
    for lsn in 1..=10 {
        model.put(&t, key(lsn as u32), lsn);
    }
    let err = |from: u64, to: u64, limit: usize| t.changed_keys(&KeyRange::ALL, Lsn(from), Lsn(to), limit).unwrap_err().to_string();
    assert_eq!(err(8, 7, NO_LIMIT), "cannot list changes from LSN 0/8 to LSN 0/7: the range ends before it starts");
    assert_eq!(err(0, 11, NO_LIMIT), "cannot list changes up to LSN 0/B: it has not been ingested yet, last record LSN is 0/A");
    assert_eq!(err(0, 10, 9), "too many changes: more than 9 keys changed between LSN 0/0 and LSN 0/A");
    assert_eq!(t.changed_keys(&KeyRange::ALL, Lsn(0), Lsn(10), 10).unwrap().len(), 10, "exactly the limit is fine");
    assert_eq!(t.changed_keys(&KeyRange::ALL, Lsn(5), Lsn(10), 5).unwrap().len(), 5);
    let too_many = t.changed_keys(&KeyRange::ALL, Lsn(0), Lsn(10), 0).unwrap_err();
    assert!(matches!(too_many, ChangedKeysError::TooManyChanges { limit: 0, .. }), "{too_many:?}");
    // Many versions of one key are one change.
    let mut model = Model::default();
    for lsn in 11..=30 {
        model.put(&t, key(0), lsn);
    }
    assert_eq!(t.changed_keys(&KeyRange::ALL, Lsn(10), Lsn(30), 1).unwrap(), vec![(key(0), Lsn(30))]);
}

#[test]
fn a_branch_lists_its_own_changes_from_its_branch_point_on() {
    let dir = tempfile::tempdir().unwrap();
    let (tenant, parent) = setup(dir.path());
    let mut parent_model = Model::default();
    for lsn in 1..=20 {
        parent_model.put(&parent, key((lsn % 4) as u32), lsn);
    }
    parent.freeze_and_flush().unwrap();
    let child = tenant.branch_timeline(BRANCH, MAIN, Lsn(15)).unwrap();
    let mut child_model = Model::default();
    for lsn in 21..=30 {
        parent_model.put(&parent, key(10 + (lsn % 3) as u32), lsn);
        child_model.put(&child, key(20 + (lsn % 2) as u32), lsn);
    }
    child_model.check_all(&child, 15, 30, "child");
    parent_model.check_all(&parent, 0, 30, "parent");
    let err = child.changed_keys(&KeyRange::ALL, Lsn(14), Lsn(30), NO_LIMIT).unwrap_err();
    assert!(matches!(err, ChangedKeysError::BeforeBranchPoint { .. }), "{err:?}");
    assert_eq!(err.to_string(), "cannot list changes since LSN 0/E: before the timeline's branch point 0/F, where its own history starts");
}
