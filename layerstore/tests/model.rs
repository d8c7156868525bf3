//! The storage engine held against a plain model, through random sequences of operations.
//!
//! The model of a timeline is a `BTreeMap<(Key, Lsn), Value>` of its own puts, its
//! ancestor and branch point, its last record LSN and its GC cutoff. A read in the model
//! collects versions newest first from the timeline, then from the ancestor at
//! `min(lsn, branch point)`, until one stands on its own, and applies them with
//! `ModelReconstructor`. The engine must agree with it on every value and every error.
//!
//! Operations: puts (images, records, records that initialize), publishing an LSN, freeze,
//! flush, both, L0 compaction (by threshold or forced), image layer creation over random
//! key ranges and where the delta depth asks for it (random partition sizes, depths and
//! budgets), branches at random LSNs (valid and not), GC at random cutoffs with the
//! children's branch points retained, folds (a key read at a random LSN, its newest
//! version there replaced by the model's value at that version), a clean restart (flush, drop, load) and a crash
//! (drop without flushing, load, then ingest again what the model has above each
//! timeline's disk-consistent LSN, as the log would be). The configuration is hostile: tiny
//! blocks and layers, compaction after two flushes.
//!
//! After every operation, every key is read at every LSN up to each timeline's last
//! record (below the GC horizon, the engine must refuse exactly as the model says),
//! `keys_in_range` is compared at the last record and at the horizon, and `changed_keys`
//! (the model's own puts of the timeline between two LSNs, newest per key) at pairs of
//! LSNs around the horizon, the branch point and the last record, with tight limits, and
//! with the refusals the model predicts. At the end of a case,
//! every layer file is scrubbed. `PROPTEST_CASES` sets the number of cases (default 24) of
//! each of the two tests: `store_agrees_with_model_fixed_seed` runs the same cases in every
//! run, `store_agrees_with_model_random_seed` new ones from a seed drawn at random and
//! printed (`PROPTEST_RNG_SEED=S` runs that seed's cases again). A failure panics with the
//! seed, the shrunk case and the command that replays it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;
use layerstore::{ChangedKeysError, ModelReconstructor, StorageConfig, Tenant, Timeline, Value};
use proptest::prelude::*;
use proto::{BlockNumber, ForkNumber, Key, KeyRange, Lsn, RelTag, TenantId, TimelineId};

const TENANT: TenantId = TenantId([0x42; 16]);
const TIMELINES_MAX: usize = 4;

fn rel() -> RelTag {
    RelTag { spcnode: 1663, dbnode: 5, relnode: 16384, forknum: ForkNumber::Main }
}

/// The keys the test uses: both ends of the key space, so that compaction meets the
/// "an L1 layer never covers all keys" rule, and a few relation blocks and a size between.
fn keys() -> Vec<Key> {
    let mut keys = vec![Key::MIN, Key::rel_size(rel()), Key::last_running_xacts()];
    assert_eq!(Key::last_running_xacts().next(), Key::MAX, "the last key of the key space");
    keys.extend((0..5).map(|b| Key::rel_block(rel(), BlockNumber(b))));
    keys.sort();
    keys
}

fn timeline_id(i: usize) -> TimelineId {
    TimelineId([i as u8 + 1; 16])
}

fn conf() -> StorageConfig {
    StorageConfig {
        block_size_bytes: 48,
        compaction_l0_threshold: 2,
        compaction_target_size_bytes: 200,
        image_layer_target_size_bytes: 150,
        // Every second record queues its key: the queue's bookkeeping runs on every put.
        fold_after_records: 2,
        ..StorageConfig::default()
    }
}

#[derive(Debug, Clone)]
enum Op {
    Put { tl: usize, key: usize, value: Value },
    Publish { tl: usize, step: u64 },
    Freeze { tl: usize },
    Flush { tl: usize },
    FreezeAndFlush { tl: usize },
    Compact { tl: usize, force: bool },
    Images { tl: usize, range: Option<(usize, usize)>, pick: u64 },
    ImagesWhereNeeded { tl: usize, keys_per_partition: usize, min_depth: usize, ranges_max: usize },
    Branch { from: usize, pick: u64 },
    Gc { tl: usize, pick: u64 },
    Restart { clean: bool },
    Fold { tl: usize, key: usize, pick: u64 },
}

fn value_strategy() -> impl Strategy<Value = Value> {
    let byte = || (b'a'..=b'z').prop_map(|b| Bytes::from(vec![b]));
    prop_oneof![
        1 => byte().prop_map(Value::Image),
        4 => (prop::bool::weighted(0.2), byte()).prop_map(|(will_init, rec)| Value::Record { will_init, rec }),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let tl = || 0..TIMELINES_MAX;
    prop_oneof![
        12 => (tl(), 0..keys().len(), value_strategy()).prop_map(|(tl, key, value)| Op::Put { tl, key, value }),
        6 => (tl(), 1..4u64).prop_map(|(tl, step)| Op::Publish { tl, step }),
        1 => tl().prop_map(|tl| Op::Freeze { tl }),
        1 => tl().prop_map(|tl| Op::Flush { tl }),
        2 => tl().prop_map(|tl| Op::FreezeAndFlush { tl }),
        2 => (tl(), any::<bool>()).prop_map(|(tl, force)| Op::Compact { tl, force }),
        2 => (tl(), prop::option::weighted(0.5, (0..keys().len(), 0..=keys().len())), any::<u64>())
            .prop_map(|(tl, range, pick)| Op::Images { tl, range, pick }),
        2 => (tl(), 1..4usize, 0..4usize, 1..3usize).prop_map(|(tl, keys_per_partition, min_depth, ranges_max)| {
            Op::ImagesWhereNeeded { tl, keys_per_partition, min_depth, ranges_max }
        }),
        1 => (tl(), any::<u64>()).prop_map(|(from, pick)| Op::Branch { from, pick }),
        2 => (tl(), any::<u64>()).prop_map(|(tl, pick)| Op::Gc { tl, pick }),
        1 => any::<bool>().prop_map(|clean| Op::Restart { clean }),
        3 => (tl(), 0..keys().len(), any::<u64>()).prop_map(|(tl, key, pick)| Op::Fold { tl, key, pick }),
    ]
}

#[derive(Debug, Clone)]
struct ModelTimeline {
    ancestor: Option<(usize, Lsn)>,
    values: BTreeMap<(Key, Lsn), Value>,
    last_record: Lsn,
    /// The LSN the next put uses; above `last_record`.
    next_lsn: Lsn,
    /// Whether values were put at `next_lsn` that are not published yet.
    pending: bool,
    gc_cutoff: Lsn,
}

struct Harness {
    dir: tempfile::TempDir,
    tenant: Option<Tenant>,
    model: Vec<ModelTimeline>,
    keys: Vec<Key>,
}

/// An LSN in `lo..=hi` chosen by `pick`; half the time `hi` itself, because the top of the
/// range (the disk-consistent LSN for images, the last record for GC) is where images make
/// older layers removable.
fn pick_in(pick: u64, lo: Lsn, hi: Lsn) -> Option<Lsn> {
    (lo <= hi).then(|| if pick.is_multiple_of(2) { hi } else { Lsn(lo.0 + (pick / 2) % (hi.0 - lo.0 + 1)) })
}

impl Harness {
    fn new() -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let tenant = Tenant::create(dir.path(), TENANT, conf(), &[]).unwrap();
        tenant.create_timeline(timeline_id(0)).unwrap();
        let root = ModelTimeline {
            ancestor: None,
            values: BTreeMap::new(),
            last_record: Lsn(0),
            next_lsn: Lsn(1),
            pending: false,
            gc_cutoff: Lsn(0),
        };
        Harness { dir, tenant: Some(tenant), model: vec![root], keys: keys() }
    }

    fn tenant(&self) -> &Tenant {
        self.tenant.as_ref().unwrap()
    }

    fn timeline(&self, i: usize) -> Arc<Timeline> {
        self.tenant().get_timeline(timeline_id(i)).unwrap()
    }

    fn publish(&mut self, i: usize, step: u64) {
        let m = &mut self.model[i];
        self.tenant.as_ref().unwrap().get_timeline(timeline_id(i)).unwrap().advance_last_record_lsn(m.next_lsn).unwrap();
        m.last_record = m.next_lsn;
        m.next_lsn = Lsn(m.next_lsn.0 + step);
        m.pending = false;
    }

    fn apply(&mut self, op: &Op) {
        let n = self.model.len();
        match *op {
            Op::Put { tl, key, ref value } => {
                let i = tl % n;
                let (key, lsn) = (self.keys[key], self.model[i].next_lsn);
                self.timeline(i).put(key, lsn, value).unwrap();
                self.model[i].values.insert((key, lsn), value.clone());
                self.model[i].pending = true;
            }
            Op::Publish { tl, step } => self.publish(tl % n, step),
            Op::Freeze { tl } | Op::FreezeAndFlush { tl } => {
                let i = tl % n;
                let t = self.timeline(i);
                let result = match op {
                    Op::Freeze { .. } => t.freeze().map_err(anyhow::Error::from),
                    _ => t.freeze_and_flush(),
                };
                match (self.model[i].pending, result) {
                    (false, Ok(())) => {}
                    (true, Err(e)) => assert!(e.to_string().contains("are not published yet"), "{e}"),
                    (pending, result) => panic!("freeze with pending={pending} gave {result:?}"),
                }
            }
            Op::Flush { tl } => self.timeline(tl % n).flush_frozen_layers().unwrap(),
            Op::Compact { tl, force } => {
                self.timeline(tl % n).compact_level0(force).unwrap();
            }
            Op::Images { tl, range, pick } => {
                let i = tl % n;
                let t = self.timeline(i);
                let lo = t.gc_cutoff_lsn().max(t.ancestor_lsn().unwrap_or(Lsn(0)));
                let Some(lsn) = pick_in(pick, lo, t.disk_consistent_lsn()) else { return };
                let range = match range {
                    None => KeyRange::ALL,
                    Some((a, b)) => {
                        let (a, b) = (a.min(b), a.max(b));
                        if a == b {
                            KeyRange::single(self.keys[a])
                        } else {
                            KeyRange { start: self.keys[a], end: self.keys.get(b).copied().unwrap_or(Key::MAX) }
                        }
                    }
                };
                t.create_image_layers(&range, lsn, &ModelReconstructor).unwrap();
            }
            Op::ImagesWhereNeeded { tl, keys_per_partition, min_depth, ranges_max } => {
                let t = self.timeline(tl % n);
                let lsn = t.disk_consistent_lsn();
                if !lsn.is_valid() || lsn < t.gc_cutoff_lsn() {
                    // Nothing to build images from, or GC has moved past it: refused.
                    let result = t.create_image_layers_where_needed(&[KeyRange::ALL], 0, 1, &ModelReconstructor).unwrap();
                    assert!(result.layers_created.is_empty());
                    return;
                }
                let parts = t.partition_keys(lsn, keys_per_partition).unwrap();
                let deep = t.deep_ranges(&parts, min_depth);
                let result = t.create_image_layers_where_needed(&parts, min_depth, ranges_max, &ModelReconstructor).unwrap();
                assert_eq!(result.ranges.len() + result.ranges_deferred, deep.len());
                assert_eq!(result.ranges, deep[..result.ranges.len()]);
                for r in &result.ranges {
                    assert_eq!(t.delta_depth(&r.key_range), 0, "a rebuilt range has no delta above its images");
                }
            }
            Op::Branch { from, pick } => {
                if n == TIMELINES_MAX {
                    return;
                }
                let parent = from % n;
                let at = pick_in(pick, Lsn(0), self.model[parent].last_record).unwrap();
                let result = self.tenant().branch_timeline(timeline_id(n), timeline_id(parent), at);
                let p = &self.model[parent];
                let grand_lsn = p.ancestor.map(|(_, l)| l);
                if at < p.gc_cutoff {
                    let e = result.expect_err("branch below the GC cutoff accepted");
                    assert!(e.to_string().contains("below the ancestor's garbage collection horizon"), "{e}");
                } else if grand_lsn.is_some_and(|g| at < g) {
                    let e = result.expect_err("branch below the ancestor's branch point accepted");
                    assert!(e.to_string().contains("below the ancestor's own branch point"), "{e}");
                } else {
                    result.unwrap();
                    let child = ModelTimeline {
                        ancestor: Some((parent, at)),
                        values: BTreeMap::new(),
                        last_record: at,
                        next_lsn: Lsn(at.0 + 1),
                        pending: false,
                        gc_cutoff: p.gc_cutoff,
                    };
                    self.model.push(child);
                }
            }
            Op::Gc { tl, pick } => {
                let i = tl % n;
                let hi = if pick % 3 == 0 { self.model[i].last_record } else { self.timeline(i).disk_consistent_lsn() };
                let cutoff = pick_in(pick / 3, Lsn(0), hi).unwrap();
                let result = self.tenant().gc_timeline(timeline_id(i), cutoff).unwrap();
                let m = &mut self.model[i];
                m.gc_cutoff = m.gc_cutoff.max(cutoff);
                assert_eq!(result.cutoff, m.gc_cutoff);
            }
            Op::Fold { tl, key, pick } => {
                // As the pageserver folds: read at an LSN, take the newest version the read
                // found, rebuild the value there and replace that version by it. The model
                // keeps the record: its values must not change.
                let i = tl % n;
                let t = self.timeline(i);
                let key = self.keys[key];
                let Some(lsn) = pick_in(pick, self.model[i].gc_cutoff, self.model[i].last_record) else { return };
                // A read the model refuses (an ancestor's horizon) is checked elsewhere.
                let Ok(data) = t.get_reconstruct_data(key, lsn) else { return };
                let Some((newest, _)) = data.records.last().cloned() else { return };
                let Ok(image) = self.model_get(i, key, newest) else { return };
                let image = image.expect("a version at the LSN");
                let outcome = t.replace_with_image(key, newest, &image).unwrap();
                let own = self.model[i].values.get(&(key, newest));
                if outcome == layerstore::ReplaceOutcome::Replaced {
                    assert!(matches!(own, Some(Value::Record { .. })), "replaced {key} at {newest}, where the model has {own:?}");
                }
            }
            Op::Restart { clean: true } => {
                for i in 0..n {
                    if self.model[i].pending {
                        self.publish(i, 1);
                    }
                }
                self.tenant().flush_all().unwrap();
                self.tenant = None;
                self.tenant = Some(Tenant::load(self.dir.path(), TENANT, conf(), &[]).unwrap());
                for i in 0..n {
                    assert_eq!(self.timeline(i).last_record_lsn(), self.model[i].last_record, "clean restart lost data");
                }
            }
            Op::Restart { clean: false } => {
                let disk_consistent: Vec<Lsn> = (0..n).map(|i| self.timeline(i).disk_consistent_lsn()).collect();
                self.tenant = None;
                self.tenant = Some(Tenant::load(self.dir.path(), TENANT, conf(), &[]).unwrap());
                for (i, d) in disk_consistent.into_iter().enumerate() {
                    self.reingest(i, d);
                }
            }
        }
    }

    /// After a crash: puts again what the model has above the disk-consistent LSN `d`, as
    /// ingest would, and publishes what was published.
    fn reingest(&self, i: usize, d: Lsn) {
        let t = self.timeline(i);
        let m = &self.model[i];
        assert_eq!(t.last_record_lsn(), d, "after a crash, ingest resumes at the disk-consistent LSN");
        let mut by_lsn: BTreeMap<Lsn, Vec<(Key, &Value)>> = BTreeMap::new();
        for ((key, lsn), value) in m.values.iter().filter(|((_, lsn), _)| *lsn > d) {
            by_lsn.entry(*lsn).or_default().push((*key, value));
        }
        for (lsn, values) in by_lsn {
            if lsn > m.last_record && t.last_record_lsn() < m.last_record {
                // Publishing can run ahead of the last put (an advance without puts).
                t.advance_last_record_lsn(m.last_record).unwrap();
            }
            for (key, value) in values {
                t.put(key, lsn, value).unwrap();
            }
            if lsn <= m.last_record {
                t.advance_last_record_lsn(lsn).unwrap();
            }
        }
        if t.last_record_lsn() < m.last_record {
            t.advance_last_record_lsn(m.last_record).unwrap();
        }
    }

    /// Walks the model's ancestor chain from timeline `i` at `lsn`, as reads do: calls
    /// `visit(timeline, lsn)` for each timeline until it returns true; errors as the engine
    /// would at a hop below an ancestor's horizon.
    fn walk(&self, i: usize, lsn: Lsn, mut visit: impl FnMut(usize, Lsn) -> bool) -> Result<(), String> {
        let m = &self.model[i];
        if lsn < m.gc_cutoff {
            return Err(format!("requested LSN {lsn} is below the garbage collection horizon {}", m.gc_cutoff));
        }
        let (mut i, mut lsn) = (i, lsn);
        while !visit(i, lsn) {
            let Some((a, branch_lsn)) = self.model[i].ancestor else { break };
            let next = lsn.min(branch_lsn);
            let horizon = self.model[a].gc_cutoff;
            if next < horizon && next != branch_lsn {
                return Err(format!("requested LSN {next} is below the garbage collection horizon {horizon}"));
            }
            (i, lsn) = (a, next);
        }
        Ok(())
    }

    fn model_get(&self, i: usize, key: Key, lsn: Lsn) -> Result<Option<Bytes>, String> {
        let mut newest_first: Vec<&Value> = Vec::new();
        self.walk(i, lsn, |t, lsn| {
            for (_, v) in self.model[t].values.range((key, Lsn(0))..=(key, lsn)).rev() {
                newest_first.push(v);
                if v.will_init() {
                    return true;
                }
            }
            false
        })?;
        Ok((!newest_first.is_empty()).then(|| ModelReconstructor::apply(newest_first.into_iter().rev())))
    }

    fn model_keys(&self, i: usize, lsn: Lsn) -> Result<Vec<Key>, String> {
        let mut keys = BTreeSet::new();
        self.walk(i, lsn, |t, lsn| {
            keys.extend(self.model[t].values.keys().filter(|(_, l)| *l <= lsn).map(|(k, _)| *k));
            false
        })?;
        Ok(keys.into_iter().collect())
    }

    /// What `changed_keys` must answer on timeline `i`: its own puts in `from+1..=to`,
    /// the newest LSN per key, or the refusal the engine gives, as text.
    fn model_changed(&self, i: usize, from: Lsn, to: Lsn, limit: usize) -> Result<Vec<(Key, Lsn)>, String> {
        let m = &self.model[i];
        let refusal = if from > to {
            Some(ChangedKeysError::InvalidRange { from, to })
        } else if to > m.last_record {
            Some(ChangedKeysError::NotYetIngested { to, last_record: m.last_record })
        } else if from < m.gc_cutoff {
            Some(ChangedKeysError::BelowGcHorizon { from, horizon: m.gc_cutoff })
        } else {
            m.ancestor.filter(|(_, b)| from < *b).map(|(_, branch_lsn)| ChangedKeysError::BeforeBranchPoint { from, branch_lsn })
        };
        if let Some(e) = refusal {
            return Err(e.to_string());
        }
        let mut newest: BTreeMap<Key, Lsn> = BTreeMap::new();
        for (key, lsn) in m.values.keys().filter(|(_, lsn)| *lsn > from && *lsn <= to) {
            newest.insert(*key, *lsn);
        }
        if newest.len() > limit {
            return Err(ChangedKeysError::TooManyChanges { limit, from, to }.to_string());
        }
        Ok(newest.into_iter().collect())
    }

    /// `changed_keys` of timeline `i` at LSN pairs around its GC horizon, branch point,
    /// the middle of its history and its last record, with and without a tight limit.
    fn check_changes(&self, i: usize, t: &Timeline, step: usize, op: &Op) {
        let m = &self.model[i];
        let (last, lo) = (m.last_record, m.gc_cutoff.max(m.ancestor.map_or(Lsn(0), |(_, b)| b)));
        let mid = Lsn(lo.0 + (last.0.saturating_sub(lo.0)) / 2);
        let below = Lsn(lo.0.saturating_sub(1));
        let pairs = [(lo, last), (mid, last), (lo, mid), (last, last), (below, last), (last, Lsn(last.0 + 1)), (last, mid)];
        for (from, to) in pairs {
            let want = self.model_changed(i, from, to, usize::MAX);
            let got = t.changed_keys(&KeyRange::ALL, from, to, usize::MAX).map_err(|e| e.to_string());
            assert_eq!(got, want, "step {step} ({op:?}): timeline {i} changes from {from} to {to}");
            if let Ok(keys) = &want {
                if let Some(tight) = keys.len().checked_sub(1) {
                    let got = t.changed_keys(&KeyRange::ALL, from, to, tight).map_err(|e| e.to_string());
                    assert_eq!(got, self.model_changed(i, from, to, tight), "step {step} ({op:?}): timeline {i} limit {tight}");
                }
            }
        }
    }

    fn check(&self, step: usize, op: &Op) {
        for (i, m) in self.model.iter().enumerate() {
            let t = self.timeline(i);
            assert_eq!(t.last_record_lsn(), m.last_record, "step {step} ({op:?}): timeline {i} last record");
            assert!(t.disk_consistent_lsn() <= t.last_record_lsn());
            for lsn in 0..=m.last_record.0 {
                let lsn = Lsn(lsn);
                for &key in &self.keys {
                    let got = t.get(key, lsn, &ModelReconstructor).map_err(|e| e.to_string());
                    let want = self.model_get(i, key, lsn);
                    assert_eq!(got, want, "step {step} ({op:?}): timeline {i} key {key} at {lsn}");
                }
            }
            for lsn in [m.last_record, m.gc_cutoff, Lsn(m.gc_cutoff.0.saturating_sub(1))] {
                let got = t.keys_in_range(&KeyRange::ALL, lsn).map_err(|e| e.to_string());
                assert_eq!(got, self.model_keys(i, lsn), "step {step} ({op:?}): timeline {i} keys at {lsn}");
            }
            self.check_changes(i, &t, step, op);
        }
    }

    /// Scrubs every layer file of every timeline.
    fn verify_files(&self) {
        for i in 0..self.model.len() {
            let t = self.timeline(i);
            for desc in t.layers() {
                let path = t.path().join(desc.file_name());
                if path.exists() {
                    layerstore::layer::LayerFile::open(&path).and_then(|f| f.verify()).unwrap();
                }
            }
        }
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(24)
}

/// The seed of the fixed cases, the same in every run.
const FIXED_SEED: u64 = 0;

/// Runs `cases()` cases from `seed` (shrinking a failing one), and panics with the seed and
/// the command that runs the same cases again.
fn run_cases(seed: u64, test: &str) {
    let mut runner = prop::test_runner::TestRunner::new(ProptestConfig {
        cases: cases(),
        max_shrink_iters: 2000,
        rng_seed: prop::test_runner::RngSeed::Fixed(seed),
        failure_persistence: Some(Box::new(prop::test_runner::FileFailurePersistence::WithSource("regressions"))),
        source_file: Some(file!()),
        ..ProptestConfig::default()
    });
    let result = runner.run(&prop::collection::vec(op_strategy(), 1..120), |ops| {
        let mut h = Harness::new();
        for (step, op) in ops.iter().enumerate() {
            h.apply(op);
            h.check(step, op);
        }
        h.verify_files();
        Ok(())
    });
    if let Err(e) = result {
        panic!(
            "the model test failed with seed {seed}: {e}\nreplay: PROPTEST_RNG_SEED={seed} cargo test -p layerstore --test model {test}"
        );
    }
}

#[test]
fn store_agrees_with_model_fixed_seed() {
    run_cases(FIXED_SEED, "store_agrees_with_model_fixed_seed");
}

/// New cases in every run: the seed is drawn at random unless `PROPTEST_RNG_SEED` gives it,
/// and printed.
#[test]
fn store_agrees_with_model_random_seed() {
    let seed = match std::env::var("PROPTEST_RNG_SEED") {
        Ok(value) => value.parse().unwrap_or_else(|_| panic!("PROPTEST_RNG_SEED must be a whole number, got {value:?}")),
        Err(_) => rand::random(),
    };
    eprintln!("model test seed: {seed} (PROPTEST_RNG_SEED={seed} runs the same cases again)");
    run_cases(seed, "store_agrees_with_model_random_seed");
}
