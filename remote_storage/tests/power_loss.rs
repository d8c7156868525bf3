//! A put to the local-directory store that returned survives a power loss: the store sits
//! on `volatilefs`, a FUSE filesystem that keeps only what was fsynced (see its crate docs),
//! and after the simulated power loss every acknowledged object is there, whole.
//!
//! Needs `/dev/fuse` and root, as `./scripts/test` runs the Rust tests (see
//! `volatilefs/README.md`).

use std::collections::BTreeMap;

use bytes::Bytes;
use remote_storage::RemoteStorage;
use volatilefs::VolatileMount;

fn object(i: usize, round: usize) -> Bytes {
    Bytes::from((0..1000 + 37 * i).map(|b| (b * 7 + i * 13 + round) as u8).collect::<Vec<u8>>())
}

#[test]
fn every_acknowledged_put_survives_a_power_loss() {
    let dir = tempfile::tempdir().unwrap();
    let fs = VolatileMount::mount(dir.path()).unwrap();
    // Directories that an earlier process created without syncing them (the store's own
    // directory among them): a put into them must make their entries durable too.
    std::fs::create_dir_all(fs.path().join("remote/tenants/old/timelines")).unwrap();
    let url = format!("file://{}/remote", fs.path().display());
    let storage = RemoteStorage::from_url(&url).unwrap();

    let mut acknowledged = BTreeMap::new();
    let key = "tenants/old/timelines/layer".to_string();
    storage.put(&key, object(300, 0)).unwrap();
    acknowledged.insert(key, object(300, 0));
    // New directories at every depth, as a tenant's first uploads make them.
    for i in 0..12 {
        let key = format!("tenants/t{}/timelines/tl{}/layer-{i:02}", i % 3, i % 2);
        storage.put(&key, object(i, 0)).unwrap();
        acknowledged.insert(key, object(i, 0));
    }
    // Replacements, as the index of one generation is replaced by each upload.
    for round in 1..4 {
        let key = "tenants/t0/timelines/tl0/index_part.json-00000001".to_string();
        storage.put(&key, object(100, round)).unwrap();
        acknowledged.insert(key, object(100, round));
    }
    // A claimed generation.
    let key = "tenants/t1/generations/00000001".to_string();
    assert!(storage.put_if_absent(&key, object(200, 0)).unwrap());
    assert!(!storage.put_if_absent(&key, object(201, 0)).unwrap());
    acknowledged.insert(key, object(200, 0));
    drop(storage);

    fs.power_loss();

    let storage = RemoteStorage::from_url(&url).unwrap();
    let mut lost = Vec::new();
    for (key, want) in &acknowledged {
        match storage.get(key) {
            Ok(got) if got == want => {}
            Ok(got) => lost.push(format!("{key}: {} bytes, {} acknowledged", got.len(), want.len())),
            Err(e) => lost.push(format!("{key}: {e}")),
        }
    }
    assert!(lost.is_empty(), "{} of {} acknowledged puts lost in a power loss:\n{}", lost.len(), acknowledged.len(), lost.join("\n"));
    let listed: Vec<String> = storage.list("").unwrap().into_iter().map(|o| o.key).collect();
    assert_eq!(listed, acknowledged.keys().cloned().collect::<Vec<_>>(), "the listing shows exactly the acknowledged objects");
    // The generation claimed before the power loss is still taken.
    assert!(!storage.put_if_absent("tenants/t1/generations/00000001", object(202, 0)).unwrap());
}
