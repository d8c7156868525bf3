//! Fold tests: the queue of long chains, `replace_with_image`'s refusals, reads that stay
//! identical at every LSN across freeze, flush and reload, and a fold racing flushes and
//! reads on other threads.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use proto::{BlockNumber, ForkNumber, Key, Lsn, RelTag, TenantId, TimelineId};

use crate::config::StorageConfig;
use crate::tenant::Tenant;
use crate::timeline::{ReplaceOutcome, Timeline, LONG_CHAINS_MAX};
use crate::value::{ModelReconstructor, Value};

const TENANT: TenantId = TenantId([0x12; 16]);
const MAIN: TimelineId = TimelineId([0xAC; 16]);

fn key(blk: u32) -> Key {
    Key::rel_block(RelTag { spcnode: 1663, dbnode: 5, relnode: 16384, forknum: ForkNumber::Main }, BlockNumber(blk))
}

fn conf(records: u32) -> StorageConfig {
    StorageConfig { fold_after_records: records, fold_after_bytes: 0, block_size_bytes: 256, ..StorageConfig::default() }
}

fn setup(conf: StorageConfig) -> (tempfile::TempDir, Tenant, Arc<Timeline>) {
    let dir = tempfile::tempdir().unwrap();
    let tenant = Tenant::create(dir.path(), TENANT, conf, &[]).unwrap();
    let timeline = tenant.create_timeline(MAIN).unwrap();
    (dir, tenant, timeline)
}

fn put(t: &Timeline, k: Key, lsn: u64, v: Value) {
    t.put(k, Lsn(lsn), &v).unwrap();
    t.advance_last_record_lsn(Lsn(lsn)).unwrap();
}

fn rec(lsn: u64) -> Value {
    Value::Record { will_init: false, rec: Bytes::from(format!("<{lsn}>")) }
}

fn get(t: &Timeline, k: Key, lsn: u64) -> Bytes {
    t.get(k, Lsn(lsn), &ModelReconstructor).unwrap().unwrap_or_default()
}

/// Folds `k` at its newest version at or below `lsn`, the way the pageserver does: read,
/// rebuild, replace.
fn fold(t: &Timeline, k: Key, lsn: u64) -> ReplaceOutcome {
    let data = t.get_reconstruct_data(k, Lsn(lsn)).unwrap();
    let Some((newest, _)) = data.records.last().cloned() else { return ReplaceOutcome::AlreadyImage };
    let image = get(t, k, newest.0);
    t.replace_with_image(k, newest, &image).unwrap()
}

#[test]
fn long_chains_are_queued_once_per_threshold_and_taken_longest_first() {
    let (_dir, _tenant, t) = setup(conf(4));
    put(&t, key(2), 9, Value::Image(Bytes::from_static(b"j")));
    put(&t, key(1), 10, Value::Image(Bytes::from_static(b"i")));
    for lsn in 11..=22 {
        t.put(key(1), Lsn(lsn), &rec(lsn)).unwrap();
        if lsn <= 15 {
            t.put(key(2), Lsn(lsn), &rec(lsn)).unwrap();
        }
        t.advance_last_record_lsn(Lsn(lsn)).unwrap();
    }
    // key 1: 12 records (queued at 4, 8, 12: one entry, the newest length); key 2: 5.
    assert_eq!(t.long_chains_len(), 2);
    assert_eq!(t.take_long_chains(10), vec![(key(1), 12), (key(2), 4)]);
    assert!(t.take_long_chains(10).is_empty(), "taking empties the queue");
    assert_eq!(t.open_chain_len(key(1)), 12);
    assert_eq!(fold(&t, key(1), 22), ReplaceOutcome::Replaced);
    assert_eq!(t.open_chain_len(key(1)), 0, "a fold at the newest version restarts the count");
    for lsn in 23..=26 {
        put(&t, key(1), lsn, rec(lsn));
    }
    assert_eq!(t.take_long_chains(10), vec![(key(1), 4)], "queued again after N more records, not before");

    let (_dir, _tenant, off) = setup(conf(0));
    for lsn in 10..=300 {
        put(&off, key(1), lsn, rec(lsn));
    }
    assert_eq!(off.long_chains_len(), 0, "fold_after_records = 0 turns the queue off");
}

#[test]
fn the_queue_is_bounded_and_counts_what_it_drops() {
    let (_dir, _tenant, t) = setup(conf(2));
    let keys = LONG_CHAINS_MAX as u32 + 3;
    for lsn in [10u64, 11] {
        for k in 0..keys {
            t.put(key(k), Lsn(lsn), &rec(lsn)).unwrap();
        }
        t.advance_last_record_lsn(Lsn(lsn)).unwrap();
    }
    assert_eq!(t.long_chains_len(), LONG_CHAINS_MAX);
    assert_eq!(t.long_chains_dropped(), 3);
}

#[test]
fn replace_refuses_what_it_must_not_change() {
    let (_dir, _tenant, t) = setup(conf(0));
    put(&t, key(1), 10, Value::Image(Bytes::from_static(b"i")));
    put(&t, key(1), 20, rec(20));
    put(&t, key(1), 30, rec(30));
    t.put(key(1), Lsn(40), &rec(40)).unwrap();
    assert_eq!(t.replace_with_image(key(1), Lsn(40), b"x").unwrap(), ReplaceOutcome::Unpublished);
    assert_eq!(t.replace_with_image(key(1), Lsn(25), b"x").unwrap(), ReplaceOutcome::NoSuchVersion);
    assert_eq!(t.replace_with_image(key(1), Lsn(10), b"x").unwrap(), ReplaceOutcome::AlreadyImage);
    t.advance_last_record_lsn(Lsn(40)).unwrap();
    t.gc(Lsn(25), &[]).unwrap();
    assert_eq!(t.replace_with_image(key(1), Lsn(20), b"x").unwrap(), ReplaceOutcome::BelowGcCutoff);
    t.freeze().unwrap();
    assert_eq!(fold(&t, key(1), 30), ReplaceOutcome::Replaced, "a frozen layer takes folds until its flush");
    t.flush_frozen_layers().unwrap();
    assert_eq!(t.replace_with_image(key(1), Lsn(40), b"x").unwrap(), ReplaceOutcome::NotInMemory);
    assert_eq!(get(&t, key(1), 40), Bytes::from_static(b"i<20><30><40>"), "refusals change nothing");
}

#[test]
fn reads_are_identical_at_every_lsn_after_folds_flush_and_reload() {
    let (dir, tenant, t) = setup(conf(0));
    put(&t, key(1), 10, Value::Record { will_init: true, rec: Bytes::from_static(b"w") });
    for lsn in 11..=60 {
        put(&t, key(1), lsn, rec(lsn));
        if lsn == 30 {
            t.freeze().unwrap();
        }
    }
    let before: Vec<Bytes> = (10..=60).map(|l| get(&t, key(1), l)).collect();
    assert_eq!(fold(&t, key(1), 25), ReplaceOutcome::Replaced, "in the frozen layer");
    assert_eq!(fold(&t, key(1), 45), ReplaceOutcome::Replaced, "in the open layer");
    let check = |t: &Timeline| {
        let now: Vec<Bytes> = (10..=60).map(|l| get(t, key(1), l)).collect();
        assert_eq!(now, before);
    };
    check(&t);
    let data = t.get_reconstruct_data(key(1), Lsn(60)).unwrap();
    assert_eq!((data.image.map(|(l, _)| l), data.records.len()), (Some(Lsn(45)), 15));
    t.freeze_and_flush().unwrap();
    check(&t);
    let data = t.get_reconstruct_data(key(1), Lsn(44)).unwrap();
    assert_eq!((data.image.map(|(l, _)| l), data.records.len()), (Some(Lsn(25)), 19), "the L0 files hold the images");
    drop((t, tenant));
    let tenant = Tenant::load(dir.path(), TENANT, conf(0), &[]).unwrap();
    check(&tenant.get_timeline(MAIN).unwrap());
}

/// One thread ingests a hot key and freezes and flushes every few records, one folds
/// whatever the queue offers, one reads: every read at every LSN must match the model, the
/// folds that report `Replaced` must reach the layer files, and nothing may be lost.
#[test]
fn folds_racing_flushes_and_reads_lose_nothing() {
    let (dir, tenant, t) = setup(conf(3));
    const LAST: u64 = 600;
    put(&t, key(1), 1, Value::Image(Bytes::from_static(b"i")));
    let model = |lsn: u64| -> Bytes {
        let mut v = b"i".to_vec();
        for l in 2..=lsn {
            v.extend_from_slice(format!("<{l}>").as_bytes());
        }
        Bytes::from(v)
    };
    let done = Arc::new(AtomicBool::new(false));
    let replaced = std::thread::scope(|s| {
        let folder = s.spawn(|| {
            let mut replaced = 0;
            while !done.load(Ordering::SeqCst) {
                for (k, _) in t.take_long_chains(8) {
                    let lsn = t.last_record_lsn().0;
                    if fold(&t, k, lsn) == ReplaceOutcome::Replaced {
                        replaced += 1;
                    }
                }
                std::thread::yield_now();
            }
            replaced
        });
        let reader = s.spawn(|| {
            let mut i = 0u64;
            while !done.load(Ordering::SeqCst) {
                let last = t.last_record_lsn().0;
                let lsn = 1 + (i * 7919) % last;
                assert_eq!(get(&t, key(1), lsn), model(lsn), "read at {lsn}");
                i += 1;
            }
        });
        for lsn in 2..=LAST {
            put(&t, key(1), lsn, rec(lsn));
            // Slow enough for the folder to get in between flushes, now and then.
            std::thread::sleep(std::time::Duration::from_micros(100));
            if lsn % 17 == 0 {
                t.freeze_and_flush().unwrap();
            }
        }
        done.store(true, Ordering::SeqCst);
        reader.join().unwrap();
        folder.join().unwrap()
    });
    println!("{replaced} folds landed between flushes");
    assert!(replaced > 0, "the folder never got a fold in");
    t.freeze_and_flush().unwrap();
    let images_in_files: usize = t
        .layer_map()
        .files
        .iter()
        .map(|f| f.get(key(1)).unwrap().iter().filter(|(l, v)| *l > Lsn(1) && matches!(v, Value::Image(_))).count())
        .sum();
    assert_eq!(images_in_files, replaced, "every fold reported as replaced is in a layer file, and only those");
    for lsn in 1..=LAST {
        assert_eq!(get(&t, key(1), lsn), model(lsn), "read at {lsn} after the last flush");
    }
    drop((t, tenant));
    let tenant = Tenant::load(dir.path(), TENANT, conf(3), &[]).unwrap();
    let t = tenant.get_timeline(MAIN).unwrap();
    for lsn in (1..=LAST).step_by(7) {
        assert_eq!(get(&t, key(1), lsn), model(lsn), "read at {lsn} after reload");
    }
}

#[test]
fn taking_a_few_keys_takes_the_longest_chains() {
    let (_dir, _tenant, t) = setup(conf(2));
    // Key k gets 2 * (k + 1) records: queued at 2, 4, ..., its longest crossing kept.
    for lsn in 10..=20u64 {
        for k in 0..5u32 {
            if lsn - 10 < 2 * (u64::from(k) + 1) {
                t.put(key(k), Lsn(lsn), &rec(lsn)).unwrap();
            }
        }
        t.advance_last_record_lsn(Lsn(lsn)).unwrap();
    }
    assert_eq!(t.take_long_chains(0), vec![]);
    assert_eq!(t.take_long_chains(2), vec![(key(4), 10), (key(3), 8)]);
    assert_eq!(t.take_long_chains(1), vec![(key(2), 6)]);
    assert_eq!(t.take_long_chains(5), vec![(key(1), 4), (key(0), 2)]);
}
