//! What the remote-consistent LSN promises survives an OS crash of the machine that holds
//! the local-directory object store, and a local copy is trusted as remote only when the
//! store has the object the index names.
//!
//! The remote-consistent LSN is what the safekeepers remove WAL below, and what makes local
//! layer copies evictable: every version at or below it must be readable from remote
//! storage alone afterwards. The first test puts the store on `volatilefs` (a FUSE
//! filesystem that keeps only what was fsynced; needs `/dev/fuse` and root), loses power,
//! and rebuilds the tenant from the store. The second leaves the store as a power loss
//! under a store that did not sync left it (the index there, layer objects missing or
//! empty) and attaches with the local copies still on disk.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use layerstore::remote::IndexPart;
use layerstore::{ModelReconstructor, StorageConfig, Tenant, Timeline, Value};
use proto::{BlockNumber, ForkNumber, Key, Lsn, RelTag, TenantId, TimelineId};
use remote_storage::RemoteStorage;
use volatilefs::VolatileMount;

const TENANT: TenantId = TenantId([0x33; 16]);
const MAIN: TimelineId = TimelineId([0xAA; 16]);
const WAIT: Duration = Duration::from_secs(30);

fn key(blk: u32) -> Key {
    Key::rel_block(RelTag { spcnode: 1663, dbnode: 5, relnode: 16384, forknum: ForkNumber::Main }, BlockNumber(blk))
}

fn conf() -> StorageConfig {
    StorageConfig { block_size_bytes: 64, compaction_l0_threshold: 2, compaction_target_size_bytes: 300, ..StorageConfig::default() }
}

/// Writes `rounds` flushed layers of versions of 20 keys; returns the last LSN.
fn write(t: &Timeline, rounds: u64) -> u64 {
    let mut lsn = 0;
    for r in 0..rounds {
        for blk in 0..20 {
            lsn += 1;
            let v = if r == 0 {
                Value::Image(Bytes::from(format!("{blk}:")))
            } else {
                Value::Record { will_init: false, rec: Bytes::from(format!("{lsn},")) }
            };
            t.put(key(blk), Lsn(lsn), &v).unwrap();
        }
        t.advance_last_record_lsn(Lsn(lsn)).unwrap();
        t.freeze_and_flush().unwrap();
    }
    lsn
}

/// Every key at every 3rd LSN up to `last`.
fn snapshot(t: &Timeline, last: u64) -> Vec<Option<Bytes>> {
    (20..=last)
        .step_by(3)
        .flat_map(|lsn| (0..20).map(move |blk| (blk, lsn)))
        .map(|(blk, lsn)| t.get(key(blk), Lsn(lsn), &ModelReconstructor).unwrap())
        .collect()
}

fn timeline_prefix() -> String {
    format!("tenants/{TENANT}/timelines/{MAIN}")
}

fn newest_index(storage: &RemoteStorage) -> IndexPart {
    let objects = storage.list(&timeline_prefix()).unwrap();
    let key = objects.iter().filter(|o| o.key.contains("index_part.json-")).map(|o| o.key.clone()).max().expect("an index");
    IndexPart::decode(&storage.get(&key).unwrap(), &key).unwrap()
}

fn layer_objects(storage: &RemoteStorage) -> Vec<String> {
    storage.list(&timeline_prefix()).unwrap().into_iter().map(|o| o.key).filter(|k| !k.contains("index_part.json-")).collect()
}

/// Every layer the newest index names is an object of the size and checksum it says.
fn assert_index_holds(storage: &RemoteStorage) {
    let index = newest_index(storage);
    assert!(!index.layers.is_empty());
    for (name, layer) in &index.layers {
        let key = format!("{}/{name}-{}", timeline_prefix(), layer.generation);
        let bytes = storage.get(&key).unwrap_or_else(|e| panic!("the index names {key}: {e}"));
        assert_eq!((bytes.len() as u64, crc32c::crc32c(&bytes)), (layer.size_bytes, layer.crc32c), "{key}");
    }
}

fn wipe(local: &Path) {
    std::fs::remove_dir_all(local).unwrap();
    std::fs::create_dir(local).unwrap();
}

#[test]
fn what_the_remote_consistent_lsn_promised_survives_a_power_loss() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    let local = dir.path().join("local");
    std::fs::create_dir(&mnt).unwrap();
    std::fs::create_dir(&local).unwrap();
    let fs = VolatileMount::mount(&mnt).unwrap();
    let url = format!("file://{}/remote", mnt.display());

    let remote = RemoteStorage::from_url(&url).unwrap();
    let tenant = Tenant::create_with_remote(&local, TENANT, conf(), &[], Some(&remote), None).unwrap();
    let main = tenant.create_timeline(MAIN).unwrap();
    let last = write(&main, 4);
    main.compact().unwrap();
    assert!(main.wait_for_uploads(WAIT));
    let promised = main.remote_consistent_lsn();
    assert_eq!(promised, Lsn(last), "everything is uploaded");
    let want = snapshot(&main, last);
    tenant.shutdown_remote();
    drop((main, tenant, remote));

    // The machine loses power; its local disk is replaced (or its layers were evicted).
    fs.power_loss();
    wipe(&local);

    let remote = RemoteStorage::from_url(&url).unwrap();
    let tenant = Tenant::load_with_remote(&local, TENANT, conf(), &[], Some(&remote), None).unwrap();
    let main = tenant
        .get_timeline(MAIN)
        .unwrap_or_else(|| panic!("timeline {MAIN} lost in the power loss: its remote-consistent LSN was {promised}"));
    assert!(main.disk_consistent_lsn() >= promised, "the store holds up to {}, {promised} was promised", main.disk_consistent_lsn());
    assert_eq!(snapshot(&main, last), want);
    assert_index_holds(&remote);
}

#[test]
fn a_local_copy_whose_remote_object_is_missing_or_empty_is_uploaded_again() {
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("local");
    std::fs::create_dir(&local).unwrap();
    let remote = RemoteStorage::from_url(&format!("file://{}/remote", dir.path().display())).unwrap();
    let tenant = Tenant::create_with_remote(&local, TENANT, conf(), &[], Some(&remote), None).unwrap();
    let main = tenant.create_timeline(MAIN).unwrap();
    let last = write(&main, 3);
    assert!(main.wait_for_uploads(WAIT));
    let want = snapshot(&main, last);
    tenant.shutdown_remote();
    drop((main, tenant));

    // What a power loss under a store that never synced can leave: the index names layer
    // objects that are gone or empty.
    let layers = layer_objects(&remote);
    assert_eq!(layers.len(), 3);
    remote.delete(&layers[0]).unwrap();
    remote.put(&layers[1], Bytes::new()).unwrap();

    // The local copies are all still there: attach must not take them for remote copies.
    let tenant = Tenant::load_with_remote(&local, TENANT, conf(), &[], Some(&remote), None).unwrap();
    let main = tenant.get_timeline(MAIN).unwrap();
    assert!(main.wait_for_uploads(WAIT));
    assert_index_holds(&remote);
    let evictable = main.evictable_layers();
    assert_eq!(evictable.len(), 3, "every layer has a remote copy again");
    for layer in &evictable {
        assert!(layer.evict().unwrap());
    }
    assert_eq!(snapshot(&main, last), want, "every evicted layer comes back from remote storage");
}
