//! Remote storage through the tenant API, on a local-directory store: uploads and the
//! index, a tenant rebuilt from remote storage alone, eviction and download (by reads and
//! by a listing of changes), corrupt objects, and generations.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use proto::{BlockNumber, ForkNumber, Key, KeyRange, Lsn, RelTag, TenantId, TimelineId};
use remote_storage::RemoteStorage;

use super::IndexPart;
use crate::config::StorageConfig;
use crate::tenant::Tenant;
use crate::timeline::Timeline;
use crate::value::{ModelReconstructor, Value};

const TENANT: TenantId = TenantId([0x22; 16]);
const MAIN: TimelineId = TimelineId([0xAA; 16]);
const BRANCH: TimelineId = TimelineId([0xBB; 16]);
const WAIT: Duration = Duration::from_secs(30);
const CLAIM_GRACE: Duration = Duration::from_secs(3);

fn key(blk: u32) -> Key {
    Key::rel_block(RelTag { spcnode: 1663, dbnode: 5, relnode: 16384, forknum: ForkNumber::Main }, BlockNumber(blk))
}

fn conf() -> StorageConfig {
    StorageConfig {
        block_size_bytes: 64,
        compaction_l0_threshold: 2,
        compaction_target_size_bytes: 300,
        generation_claim_grace_ms: CLAIM_GRACE.as_millis() as u64,
        ..StorageConfig::default()
    }
}

fn storage(dir: &Path) -> RemoteStorage {
    RemoteStorage::from_url(&format!("file://{}/remote", dir.display())).unwrap()
}

/// A temporary directory with a local-directory store and an empty pageserver directory.
fn new_store() -> (tempfile::TempDir, RemoteStorage, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let remote = storage(dir.path());
    let local = dir.path().join("local");
    std::fs::create_dir(&local).unwrap();
    (dir, remote, local)
}

/// What losing the pageserver's disk leaves: an empty directory.
fn wipe(local: &Path) {
    std::fs::remove_dir_all(local).unwrap();
    std::fs::create_dir(local).unwrap();
}

fn get(t: &Timeline, k: Key, lsn: u64) -> Option<String> {
    t.get(k, Lsn(lsn), &ModelReconstructor).unwrap().map(|b| String::from_utf8(b.to_vec()).unwrap())
}

/// Writes `rounds` flushed layers of records on 20 keys (an image at the first round).
fn write(t: &Timeline, first_lsn: u64, rounds: u64) -> u64 {
    let mut lsn = first_lsn;
    for r in 0..rounds {
        for blk in 0..20 {
            lsn += 1;
            let v = if r == 0 && first_lsn == 0 {
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

/// A tenant attached at `local` (generation 1) whose main timeline has `rounds` flushed
/// layers, all uploaded: the live attachment of the generation tests. The last LSN.
fn uploaded_tenant(local: &Path, remote: &RemoteStorage, rounds: u64) -> (Tenant, Arc<Timeline>, u64) {
    let tenant = Tenant::create_with_remote(local, TENANT, conf(), &[], Some(remote), None).unwrap();
    let main = tenant.create_timeline(MAIN).unwrap();
    let last = write(&main, 0, rounds);
    assert!(main.wait_for_uploads(WAIT));
    (tenant, main, last)
}

/// Every key at every 7th LSN from `first` up to `last`, as the timeline answers.
fn snapshot(t: &Timeline, first: u64, last: u64) -> Vec<Option<String>> {
    (first..=last).step_by(7).flat_map(|lsn| (0..20).map(move |blk| (blk, lsn))).map(|(blk, lsn)| get(t, key(blk), lsn)).collect()
}

fn newest_index(storage: &RemoteStorage, timeline: TimelineId) -> IndexPart {
    let objects = storage.list(&format!("tenants/{TENANT}/timelines/{timeline}")).unwrap();
    let key = objects.iter().filter(|o| o.key.contains("index_part.json-")).map(|o| o.key.clone()).max().unwrap();
    IndexPart::decode(&storage.get(&key).unwrap(), &key).unwrap()
}

/// Every layer an index names is an object of the size it says.
fn assert_index_names_only_existing_objects(storage: &RemoteStorage, timeline: TimelineId) {
    let index = newest_index(storage, timeline);
    let objects = storage.list(&format!("tenants/{TENANT}/timelines/{timeline}")).unwrap();
    for (name, layer) in &index.layers {
        let key = format!("tenants/{TENANT}/timelines/{timeline}/{name}-{}", layer.generation);
        let found = objects.iter().find(|o| o.key == key).unwrap_or_else(|| panic!("index names missing object {key}"));
        assert_eq!(found.size_bytes, layer.size_bytes, "{key}");
    }
}

#[test]
fn a_tenant_rebuilt_from_remote_storage_alone_reads_the_same() {
    let (_dir, remote, local) = new_store();
    let tenant = Tenant::create_with_remote(&local, TENANT, conf(), &[], Some(&remote), None).unwrap();
    let main = tenant.create_timeline(MAIN).unwrap();
    let last = write(&main, 0, 5);
    main.compact().unwrap();
    main.create_image_layers(&KeyRange::ALL, Lsn(60), &ModelReconstructor).unwrap();
    let branch = tenant.branch_timeline(BRANCH, MAIN, Lsn(last)).unwrap();
    let branch_last = write(&branch, last, 2);
    tenant.gc_timeline(MAIN, Lsn(40)).unwrap();
    assert!(main.wait_for_uploads(WAIT) && branch.wait_for_uploads(WAIT));
    assert_eq!(main.remote_consistent_lsn(), main.disk_consistent_lsn());
    assert_eq!(branch.remote_consistent_lsn(), Lsn(branch_last));
    assert_index_names_only_existing_objects(&remote, MAIN);
    assert_index_names_only_existing_objects(&remote, BRANCH);
    let want_main = snapshot(&main, 40, last);
    let want_branch = snapshot(&branch, last, branch_last);
    let status = main.remote_status().unwrap();
    assert!(status.layers_uploaded > 0 && status.objects_deleted > 0 && status.last_error.is_none(), "{status:?}");
    tenant.shutdown_remote();
    drop((main, branch, tenant));

    // The pageserver's disk is gone.
    wipe(&local);
    let tenant = Tenant::load_with_remote(&local, TENANT, conf(), &[], Some(&remote), None).unwrap();
    assert_eq!(tenant.remote().unwrap().generation().0, 2);
    let main = tenant.get_timeline(MAIN).unwrap();
    let branch = tenant.get_timeline(BRANCH).unwrap();
    assert_eq!(main.resident_layer_bytes(), 0, "nothing is downloaded before a read needs it");
    assert_eq!(main.gc_cutoff_lsn(), Lsn(40));
    assert_eq!(branch.ancestor_lsn(), Some(Lsn(last)));
    assert_eq!(snapshot(&main, 40, last), want_main);
    assert_eq!(snapshot(&branch, last, branch_last), want_branch);
    assert!(main.remote_status().unwrap().layers_downloaded > 0);

    // Evicted layers come back on the next read.
    let evictable = main.evictable_layers();
    assert!(!evictable.is_empty());
    for layer in &evictable {
        assert!(layer.evict().unwrap());
        assert!(!layer.path().exists());
    }
    assert_eq!(main.resident_layer_bytes(), 0);
    assert_eq!(snapshot(&main, 40, last), want_main);
    // New writes after the attach go to the new generation's index.
    let more = write(&branch, branch_last, 1);
    assert!(branch.wait_for_uploads(WAIT));
    let index = newest_index(&remote, BRANCH);
    assert_eq!((index.generation.0, index.disk_consistent_lsn), (2, Lsn(more)));
    assert_index_names_only_existing_objects(&remote, BRANCH);
}

#[test]
fn a_listing_of_changes_downloads_only_the_evicted_layers_its_range_needs() {
    let (_dir, remote, local) = new_store();
    let tenant = Tenant::create_with_remote(&local, TENANT, conf(), &[], Some(&remote), None).unwrap();
    let main = tenant.create_timeline(MAIN).unwrap();
    let last = write(&main, 0, 4);
    assert!(main.wait_for_uploads(WAIT));
    let all = |from: u64| main.changed_keys(&KeyRange::ALL, Lsn(from), Lsn(last), usize::MAX).unwrap();
    let (want_all, want_recent) = (all(0), all(last - 5));
    assert_eq!((want_all.len(), want_recent.len()), (20, 5));
    let evicted = main.evictable_layers();
    assert_eq!(evicted.len(), 4, "one L0 layer per round");
    for layer in &evicted {
        assert!(layer.evict().unwrap());
    }
    assert_eq!(main.resident_layer_bytes(), 0);
    assert_eq!(all(last - 5), want_recent, "the same answer from a downloaded layer");
    let downloaded = evicted.iter().filter(|l| l.download_count() > 0).count();
    assert_eq!(downloaded, 1, "only the newest layer holds LSNs after {}", Lsn(last - 5));
    assert_eq!(all(0), want_all);
    assert!(evicted.iter().all(|l| l.download_count() == 1));
}

/// A timeline written and uploaded, its local directory wiped, and every layer object in
/// remote storage replaced by `damage` of its bytes. Returns the store and the last LSN.
fn uploaded_then_damaged(damage: impl Fn(Bytes) -> Bytes) -> (tempfile::TempDir, RemoteStorage, std::path::PathBuf, u64) {
    let (dir, remote, local) = new_store();
    let tenant = Tenant::create_with_remote(&local, TENANT, conf(), &[], Some(&remote), None).unwrap();
    let main = tenant.create_timeline(MAIN).unwrap();
    let last = write(&main, 0, 2);
    assert!(main.wait_for_uploads(WAIT));
    tenant.shutdown_remote();
    drop((main, tenant));
    wipe(&local);
    for o in remote.list(&format!("tenants/{TENANT}/timelines/{MAIN}")).unwrap() {
        if !o.key.contains("index_part") {
            remote.put(&o.key, damage(remote.get(&o.key).unwrap())).unwrap();
        }
    }
    (dir, remote, local, last)
}

#[test]
fn a_corrupt_object_is_detected_and_never_served() {
    // One byte flipped in the middle of every layer object.
    let (_dir, remote, local, last) = uploaded_then_damaged(|bytes| {
        let mut bytes = bytes.to_vec();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x40;
        Bytes::from(bytes)
    });
    let tenant = Tenant::load_with_remote(&local, TENANT, conf(), &[], Some(&remote), None).unwrap();
    let main = tenant.get_timeline(MAIN).unwrap();
    let err = main.get(key(3), Lsn(last), &ModelReconstructor).unwrap_err().to_string();
    assert!(err.contains("could not download layer") && err.contains("checksum"), "{err}");
    // A corrupt index is refused at load, naming it.
    tenant.shutdown_remote();
    drop((main, tenant));
    for o in remote.list(&format!("tenants/{TENANT}/timelines/{MAIN}")).unwrap() {
        if o.key.contains("index_part") {
            let mut bytes = remote.get(&o.key).unwrap().to_vec();
            let at = bytes.iter().position(|b| b.is_ascii_digit()).unwrap();
            bytes[at] = if bytes[at] == b'9' { b'8' } else { bytes[at] + 1 };
            remote.put(&o.key, Bytes::from(bytes)).unwrap();
        }
    }
    wipe(&local);
    let err = Tenant::load_with_remote(&local, TENANT, conf(), &[], Some(&remote), None).err().expect("a corrupt index");
    assert!(format!("{err:#}").contains("is corrupt"), "{err:#}");
}

#[test]
fn a_truncated_object_is_detected_and_never_served() {
    // The last byte cut off every layer object (as an interrupted copy would).
    let (_dir, remote, local, last) = uploaded_then_damaged(|bytes| bytes.slice(..bytes.len() - 1));
    let tenant = Tenant::load_with_remote(&local, TENANT, conf(), &[], Some(&remote), None).unwrap();
    let main = tenant.get_timeline(MAIN).unwrap();
    let err = main.get(key(3), Lsn(last), &ModelReconstructor).unwrap_err().to_string();
    assert!(err.contains("could not download layer") && err.contains("bytes, the remote index says"), "{err}");
    // Nothing half-downloaded is left to be served later.
    let names: Vec<String> =
        std::fs::read_dir(main.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(names.iter().all(|n| !n.contains("__")), "no layer file may be on disk: {names:?}");
    tenant.shutdown_remote();
}

#[test]
fn a_superseded_attachment_never_deletes() {
    // The first attachment keeps the tenant (and its upload queue) alive to the end.
    let (_dir, remote, local1, local2) = two_homes();
    let (_first, main, last) = uploaded_tenant(&local1, &remote, 3);
    let want = snapshot(&main, 1, last);
    // A second pageserver attaches the same tenant by mistake.
    let second = Tenant::load_with_remote(&local2, TENANT, conf(), &[], Some(&remote), None).unwrap();
    assert_eq!(second.remote().unwrap().generation().0, 2);
    // The first compacts: its deletions must not happen, and it stops.
    main.compact_level0(true).unwrap();
    assert!(!main.wait_for_uploads(Duration::from_secs(5)) || main.remote_status().unwrap().superseded_by.is_some());
    let status = main.remote_status().unwrap();
    assert_eq!(status.superseded_by, Some(2), "{status:?}");
    assert_eq!(status.objects_deleted, 0);
    // The second still reads everything from what remote storage holds.
    let main2 = second.get_timeline(MAIN).unwrap();
    for layer in main2.evictable_layers() {
        layer.evict().unwrap();
    }
    assert_eq!(snapshot(&main2, 1, last), want);
    let _ = Arc::clone(&main2);
}

/// Two attachments of one tenant in one store: (store dir, storage, first's dir, second's dir).
fn two_homes() -> (tempfile::TempDir, RemoteStorage, std::path::PathBuf, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let remote = storage(dir.path());
    let (local1, local2) = (dir.path().join("one"), dir.path().join("two"));
    std::fs::create_dir(&local1).unwrap();
    std::fs::create_dir(&local2).unwrap();
    (dir, remote, local1, local2)
}

/// The index object `generation` wrote for `timeline`, if any.
fn index_of(remote: &RemoteStorage, timeline: TimelineId, generation: u32) -> Option<IndexPart> {
    let key = format!("tenants/{TENANT}/timelines/{timeline}/index_part.json-{generation:08x}");
    remote.get(&key).ok().map(|b| IndexPart::decode(&b, &key).unwrap())
}

/// What a process that claimed `generation` and died at once leaves: the claim, no index.
fn dead_claim(remote: &RemoteStorage, generation: u32) {
    let key = format!("tenants/{TENANT}/generations/{generation:08x}");
    assert!(remote.put_if_absent(&key, Bytes::from_static(b"{\"pid\": 4000000}\n")).unwrap());
}

#[test]
fn a_superseded_attachment_stops_uploading_its_index_and_its_position_stays() {
    let (_dir, remote, local1, local2) = two_homes();
    let (first, main, last) = uploaded_tenant(&local1, &remote, 2);
    let position = main.remote_consistent_lsn();
    assert_eq!(position, Lsn(last));
    // A second attachment becomes active: it uploads an index of its own at once.
    let second = Tenant::load_with_remote(&local2, TENANT, conf(), &[], Some(&remote), None).unwrap();
    let main2 = second.get_timeline(MAIN).unwrap();
    assert!(main2.wait_for_uploads(WAIT));
    assert!(index_of(&remote, MAIN, 2).is_some());
    let before = index_of(&remote, MAIN, 1).unwrap();
    // The first flushes more (no deletion is scheduled): its index upload finds generation 2.
    write(&main, last, 1);
    assert!(!main.wait_for_uploads(Duration::from_secs(5)) || main.remote_status().unwrap().superseded_by.is_some());
    let status = main.remote_status().unwrap();
    assert_eq!(status.superseded_by, Some(2), "{status:?}");
    assert_eq!(index_of(&remote, MAIN, 1), Some(before), "a superseded attachment uploaded its index");
    assert_eq!(main.remote_consistent_lsn(), position, "a superseded attachment moved its remote-consistent LSN");
    first.shutdown_remote();
    second.shutdown_remote();
}

#[test]
fn a_claim_that_never_became_active_does_not_stop_the_live_attachment() {
    let (_dir, remote, local1, _) = two_homes();
    let (first, main, last) = uploaded_tenant(&local1, &remote, 3);
    let position = main.remote_consistent_lsn();
    assert_eq!(main.remote_position(), (1, position));
    let (first_last, want) = (last, snapshot(&main, 1, last));
    dead_claim(&remote, 2);
    // Flushes and an L0 compaction (which deletes the L0 layers) go on.
    let last = write(&main, last, 2);
    main.compact_level0(true).unwrap();
    assert!(main.wait_for_uploads(WAIT), "the queue is not wedged");
    let status = main.remote_status().unwrap();
    assert_eq!(status.superseded_by, None, "a claim with no index of its own superseded the live attachment: {status:?}");
    assert_eq!(index_of(&remote, MAIN, 1).unwrap().disk_consistent_lsn, Lsn(last), "its index uploads go on");
    // While the claim is pending: nothing is deleted (the claimant may have loaded an index
    // naming those layers), and the position holds (it may resume from an older index).
    assert_eq!((status.pending_claim, status.objects_deleted), (Some(2), 0), "{status:?}");
    assert!(status.deferred_deletions > 0, "{status:?}");
    assert_eq!(main.remote_position(), (1, position));
    // After the grace time the claim is taken for dead: the live attachment claims
    // generation 3, and everything held back goes on, the idle queue included.
    let deadline = std::time::Instant::now() + WAIT;
    while main.remote_position() != (3, Lsn(last)) {
        assert!(std::time::Instant::now() < deadline, "held back for good: {:?}", main.remote_status());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(main.wait_for_uploads(WAIT));
    let status = main.remote_status().unwrap();
    assert_eq!(
        (status.generation, status.pending_claim, status.deferred_deletions, status.superseded_by),
        (3, None, 0, None),
        "{status:?}"
    );
    assert!(status.objects_deleted > 0, "{status:?}");
    assert_eq!(first.remote().unwrap().generation().0, 3);
    assert_eq!(index_of(&remote, MAIN, 3).unwrap().disk_consistent_lsn, Lsn(last));
    assert_index_names_only_existing_objects(&remote, MAIN);
    // Should the dead claim's process come back and upload an index after all, it is the
    // older attachment: the live one goes on.
    let zombie = IndexPart { generation: super::Generation(2), ..index_of(&remote, MAIN, 1).unwrap() };
    let key = format!("tenants/{TENANT}/timelines/{MAIN}/index_part.json-00000002");
    remote.put(&key, Bytes::from(zombie.encode())).unwrap();
    let more = write(&main, last, 1);
    assert!(main.wait_for_uploads(WAIT));
    assert_eq!(main.remote_position(), (3, Lsn(more)));
    first.shutdown_remote();
    drop((main, first));
    // A later attachment loads the live one's index, and reads what it wrote.
    let local3 = tempfile::tempdir().unwrap();
    let third = Tenant::load_with_remote(local3.path(), TENANT, conf(), &[], Some(&remote), None).unwrap();
    assert_eq!(third.remote().unwrap().generation().0, 4);
    let main3 = third.get_timeline(MAIN).unwrap();
    assert_eq!(main3.disk_consistent_lsn(), Lsn(more));
    assert_eq!(snapshot(&main3, 1, first_last), want);
    third.shutdown_remote();
}

#[test]
fn a_pending_claim_that_becomes_active_supersedes_the_live_attachment() {
    let (_dir, remote, local1, local2) = two_homes();
    let (first, main, last) = uploaded_tenant(&local1, &remote, 2);
    let position = main.remote_consistent_lsn();
    // A slow attach: generation 2 is claimed (here, by hand: its process has not uploaded
    // its index yet) while the first flushes.
    dead_claim(&remote, 2);
    write(&main, last, 1);
    assert!(main.wait_for_uploads(WAIT));
    assert_eq!(main.remote_status().unwrap().pending_claim, Some(2));
    // It becomes active (an index of its own), before the grace time ran out.
    let index = IndexPart { generation: super::Generation(2), ..index_of(&remote, MAIN, 1).unwrap() };
    let key = format!("tenants/{TENANT}/timelines/{MAIN}/index_part.json-00000002");
    remote.put(&key, Bytes::from(index.encode())).unwrap();
    main.compact_level0(true).unwrap();
    let _ = main.wait_for_uploads(Duration::from_secs(5));
    let status = main.remote_status().unwrap();
    assert_eq!((status.superseded_by, status.objects_deleted), (Some(2), 0), "{status:?}");
    assert_eq!(main.remote_position(), (1, position), "the position held since the claim");
    // A third attachment (generation 3) supersedes the second as well, never the first back.
    let second = Tenant::load_with_remote(&local2, TENANT, conf(), &[], Some(&remote), None).unwrap();
    assert_eq!(second.remote().unwrap().generation().0, 3);
    second.shutdown_remote();
    first.shutdown_remote();
}

/// A deletion never overtakes a pending claim itself, and after a re-claim it waits until
/// this timeline's index went under the new generation: a `Delete` that re-claimed and
/// deleted at once would leave the slow claimant's index (which loaded the deleted layer,
/// and whose claim check saw the new generation only claimed) the newest one if the
/// re-claiming process stopped before its next index upload. The test runs the queue's
/// operations by hand on a queue without its worker, since the grace deadline cannot be
/// placed between two operations from outside.
#[test]
fn a_reclaim_deletes_nothing_before_its_generation_is_active() {
    let (_dir, remote, local1, _) = two_homes();
    let (first, main, _) = uploaded_tenant(&local1, &remote, 3);
    main.shutdown_remote();
    let loaded = index_of(&remote, MAIN, 1).unwrap();
    // A slow attachment claims generation 2 and loads this index.
    dead_claim(&remote, 2);
    // The live attachment's queue, driven by hand: a layer it removed from its index waits
    // for the pending claim.
    let client = super::RemoteTimelineClient::start(first.remote().unwrap().clone(), MAIN, None, Some(loaded.clone()));
    client.shutdown();
    let (name, layer) = loaded.layers.iter().next().map(|(n, l)| (n.clone(), *l)).unwrap();
    let key = format!("tenants/{TENANT}/timelines/{MAIN}/{name}-{}", layer.generation);
    client.execute(&super::Op::Delete(vec![key.clone()])).unwrap();
    assert!(remote.get(&key).is_ok(), "deleted while a newer claim is pending");
    assert_eq!(client.status().deferred_deletions, 1);
    // The grace time passes; the next op to check the claims is a deletion. It does not
    // overtake the claim: that would delete before the new generation has an index.
    std::thread::sleep(CLAIM_GRACE + Duration::from_millis(300));
    client.execute(&super::Op::Delete(Vec::new())).unwrap();
    assert_eq!(first.remote().unwrap().generation().0, 1, "a deletion overtook the claim");
    assert!(remote.get(&key).is_ok(), "deleted while the newest index of the timeline is another attachment's");
    // The index upload that the idle queue schedules overtakes the claim (generation 3 is
    // claimed and gets this timeline's index at once), and only then do the deletions run.
    let mut without = loaded.clone();
    without.layers.remove(&name);
    let upload = super::Op::UploadIndex(without);
    crate::lock(&client.state).ops.push_back(super::clone_op(&upload));
    client.execute(&upload).unwrap();
    crate::lock(&client.state).ops.pop_front();
    assert_eq!(first.remote().unwrap().generation().0, 3, "the index upload overtook the dead claim");
    assert!(index_of(&remote, MAIN, 3).is_some());
    client.execute(&super::Op::Delete(Vec::new())).unwrap();
    assert!(remote.get(&key).is_err(), "the deferred deletion ran once generation 3 had the newest index");
    // The slow claimant, which checked the claims before generation 3 had an index, uploads
    // its index (generation 2, naming the layer): the newest index is still generation 3's.
    let zombie = IndexPart { generation: super::Generation(2), ..loaded.clone() };
    remote.put(&format!("tenants/{TENANT}/timelines/{MAIN}/index_part.json-00000002"), Bytes::from(zombie.encode())).unwrap();
    assert_index_names_only_existing_objects(&remote, MAIN);
    first.shutdown_remote();
}

/// What a `DiskBudget` was told, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum BudgetCall {
    /// `make_room(bytes, layer)`, and whether the layer was on local disk at the call.
    MakeRoom {
        bytes: u64,
        layer: crate::layer::LayerDesc,
        on_disk: bool,
    },
    Done {
        bytes: u64,
        layer: crate::layer::LayerDesc,
        resident: bool,
    },
}

#[derive(Debug, Default)]
struct RecordingBudget {
    calls: std::sync::Mutex<Vec<BudgetCall>>,
}

impl crate::layer::DiskBudget for RecordingBudget {
    fn make_room(&self, incoming_bytes: u64, downloading: &crate::layer::LayerFile) {
        let call = BudgetCall::MakeRoom { bytes: incoming_bytes, layer: downloading.desc().clone(), on_disk: downloading.path().exists() };
        self.calls.lock().unwrap().push(call);
    }

    fn download_done(&self, incoming_bytes: u64, downloading: &crate::layer::LayerFile) {
        let call = BudgetCall::Done { bytes: incoming_bytes, layer: downloading.desc().clone(), resident: downloading.is_resident() };
        self.calls.lock().unwrap().push(call);
    }
}

#[test]
fn every_download_asks_the_disk_budget_for_room_first_with_the_layer_size() {
    let (_dir, remote, local) = new_store();
    let budget = Arc::new(RecordingBudget::default());
    let tenant = Tenant::create_with_remote(&local, TENANT, conf(), &[], Some(&remote), Some(budget.clone())).unwrap();
    let main = tenant.create_timeline(MAIN).unwrap();
    let last = write(&main, 0, 4);
    assert!(main.wait_for_uploads(WAIT));
    let want = snapshot(&main, 1, last);
    assert!(budget.calls.lock().unwrap().is_empty(), "resident layers are read without asking the budget");
    let evicted = main.evictable_layers();
    assert!(evicted.len() >= 2, "{evicted:?}");
    let sizes: std::collections::HashMap<_, _> = evicted.iter().map(|l| (l.desc().clone(), l.file_size_bytes())).collect();
    for layer in &evicted {
        assert!(layer.evict().unwrap());
    }
    assert_eq!(snapshot(&main, 1, last), want);
    let calls = budget.calls.lock().unwrap().clone();
    let downloads: u64 = evicted.iter().map(|l| l.download_count()).sum();
    assert_eq!(calls.len() as u64, 2 * downloads, "one make_room and one download_done per download: {calls:?}");
    let mut asked = std::collections::HashSet::new();
    for pair in calls.chunks(2) {
        let (BudgetCall::MakeRoom { bytes, layer, on_disk }, BudgetCall::Done { bytes: done_bytes, layer: done_layer, resident }) =
            (&pair[0], &pair[1])
        else {
            panic!("make_room then download_done: {pair:?}");
        };
        assert_eq!(Some(bytes), sizes.get(layer), "make_room is asked for the size of the layer being downloaded");
        assert!(!on_disk, "make_room comes before the download of {layer}");
        assert_eq!((done_bytes, done_layer, resident), (bytes, layer, &true), "download_done after the layer is resident");
        asked.insert(layer.clone());
    }
    assert_eq!(asked.len() as u64, downloads, "each layer is downloaded (and asked for) once");
    // Layers read again while resident do not ask again.
    assert_eq!(snapshot(&main, 1, last), want);
    assert_eq!(budget.calls.lock().unwrap().len(), calls.len());
    tenant.shutdown_remote();
}

fn issued(local: &Path, remote: &RemoteStorage, generation: u32, node_id: u64) -> anyhow::Result<Tenant> {
    Tenant::load_as(local, TENANT, conf(), &[], Some(remote), None, super::GenerationSource::Issued { generation, node_id }, None)
}

#[test]
fn an_issued_generation_is_claimed_as_given_and_never_overtakes_a_newer_claim() {
    let (_dir, remote, local1, local2) = two_homes();
    // Node 7 attaches with generation 4, as the controller said (nothing below it exists).
    let first = issued(&local1, &remote, 4, 7).unwrap();
    assert_eq!(first.remote().unwrap().generation().0, 4);
    let main = first.create_timeline(MAIN).unwrap();
    let last = write(&main, 1, 2);
    assert!(main.wait_for_uploads(WAIT));
    // The same order again on the same node (a retried request, a restart) is its own.
    first.shutdown_remote();
    drop((main, first));
    let again = issued(&local1, &remote, 4, 7).unwrap();
    again.shutdown_remote();
    drop(again);
    // Another node may not take generation 4, nor anyone an older one.
    let err = issued(&local2, &remote, 4, 8).err().expect("generation 4 belongs to node 7");
    assert!(format!("{err:#}").contains("claimed by pageserver 7"), "{err:#}");
    let err = issued(&local2, &remote, 3, 8).err().expect("generation 5 is newer");
    assert!(format!("{err:#}").contains("stale"), "{err:#}");
    // A claim of 5 that never becomes active is never overtaken by an issued attachment,
    // however long it waits: deletions and the position hold, its generation stays 4.
    let live = issued(&local1, &remote, 4, 7).unwrap();
    let main = live.get_timeline(MAIN).unwrap();
    dead_claim(&remote, 5);
    let more = write(&main, last, 2);
    main.compact_level0(true).unwrap();
    std::thread::sleep(CLAIM_GRACE + Duration::from_secs(1));
    let _ = write(&main, more, 1);
    assert!(main.wait_for_uploads(WAIT), "the queue is not wedged");
    let status = main.remote_status().unwrap();
    assert_eq!((status.generation, status.pending_claim, status.objects_deleted), (4, Some(5), 0), "{status:?}");
    assert!(status.deferred_deletions > 0, "{status:?}");
    // Node 8 takes generation 6 (the controller raised it past the dead claim): it loads
    // what node 7 uploaded, and node 7 is superseded.
    let second = issued(&local2, &remote, 6, 8).unwrap();
    let main2 = second.get_timeline(MAIN).unwrap();
    assert!(main2.wait_for_uploads(WAIT));
    assert_eq!(snapshot(&main2, 1, last), snapshot(&main, 1, last));
    live.shutdown_remote();
    second.shutdown_remote();
}

#[test]
fn a_warm_secondary_downloads_the_hottest_layers_and_the_next_attach_takes_them() {
    let (dir, remote, local1, local2) = two_homes();
    let first = issued(&local1, &remote, 1, 1).unwrap();
    let main = first.create_timeline(MAIN).unwrap();
    let last = write(&main, 0, 6);
    assert!(main.wait_for_uploads(WAIT));
    let want = snapshot(&main, 1, last);
    let map = first.heatmap().expect("with remote storage");
    first.remote().unwrap().upload_heatmap(&map).unwrap();
    let layers = &map.timelines[0].layers;
    assert_eq!(layers.len(), main.layers().len());
    let total: u64 = layers.iter().map(|l| l.object.size_bytes).sum();

    let warm_dir = dir.path().join("warm");
    let got = super::heatmap::download_heatmap(&remote, TENANT).unwrap().expect("published");
    assert_eq!(got, map);
    // A budget below the whole: the hottest that fit, and nothing over it.
    let smallest = layers.iter().map(|l| l.object.size_bytes).min().unwrap();
    let part = super::heatmap::warm(&remote, TENANT, &got, &warm_dir, total - smallest, &|| true).unwrap();
    assert!(part.bytes <= total - smallest && part.layers < layers.len() as u64, "{part:?}");
    // A budget for all: the rest is downloaded, nothing twice.
    let all = super::heatmap::warm(&remote, TENANT, &got, &warm_dir, u64::MAX, &|| true).unwrap();
    assert_eq!((all.layers, all.bytes, all.downloaded_layers), (layers.len() as u64, total, layers.len() as u64 - part.layers));
    // Told to stop: no download at all.
    let stopped = super::heatmap::warm(&remote, TENANT, &got, &dir.path().join("other"), u64::MAX, &|| false).unwrap();
    assert_eq!(stopped.downloaded_layers, 0);
    // A copy that does not match the index (another size) is not taken.
    let victim = &layers[0];
    let victim_path = warm_dir.join(MAIN.to_string()).join(super::heatmap::warm_file_name(&victim.name, victim.object.generation));
    let good = std::fs::read(&victim_path).unwrap();
    std::fs::write(&victim_path, b"short").unwrap();

    // The next attachment (another node, generation 2) takes the warm copies of the
    // objects its index names; reads are the same and download only the one it refused.
    drop(main);
    first.shutdown_remote();
    let second = Tenant::load_as(
        &local2,
        TENANT,
        conf(),
        &[],
        Some(&remote),
        None,
        super::GenerationSource::Issued { generation: 2, node_id: 2 },
        Some(&warm_dir),
    )
    .unwrap();
    let main2 = second.get_timeline(MAIN).unwrap();
    assert_eq!(main2.evictable_layers().len(), layers.len() - 1, "every warm copy but the mismatched one is resident");
    assert_eq!(snapshot(&main2, 1, last), want);
    assert_eq!(main2.remote_status().unwrap().layers_downloaded, 1);
    assert!(victim_path.exists() && std::fs::read(&victim_path).unwrap() != good, "the refused copy is left where it was");
    second.shutdown_remote();
}
