//! Local disk as a cache of remote storage, under `layer_disk_budget_bytes`. Two paths
//! evict uploaded layers, least recently used first, through one function
//! (`evict_to_budget`), both under the one lock of `LayerDiskBudget`:
//!
//! - **Admission** (`DiskBudget::make_room`, which `layerstore::layer::LayerFile::reader`
//!   calls before it downloads an evicted layer for a read, compaction or image layer
//!   creation): when the resident layers, the downloads in flight and this download would
//!   pass the budget, layers are evicted until they fit. The budget is a ceiling for
//!   downloads, not just a trigger. The bytes of a download count as in flight from
//!   `make_room` until `download_done`, so two concurrent downloads never both see the same
//!   free room; the lock is not held during the download itself.
//! - **The periodic check** (every `eviction_period_ms`): when the resident layers (and
//!   downloads in flight) pass 90% of the budget, they are evicted down to 80%, so that
//!   what flushes and compaction write between two checks finds room.
//!
//! When nothing more can be evicted (every other resident layer is not uploaded yet, or in
//! use), the download goes ahead anyway and a warning says by how much the budget is
//! passed: a read never fails because of the budget. Eviction from either path never
//! waits for a layer (`LayerFile::try_evict`): a layer whose state is locked is being
//! downloaded or handed to a reader, and is skipped, so two downloads that make room by
//! evicting each other's layers cannot deadlock (see `layerstore::layer::file`).
//!
//! Invariant: only layers whose upload completed are evicted (`Timeline::evictable_layers`),
//! so eviction never deletes the only copy of a version. Layers not yet uploaded count
//! towards the budget but stay; the disk may exceed the budget while uploads lag.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use layerstore::layer::{DiskBudget, LayerFile};
use layerstore::tenant::Tenant;

use crate::service::page_service::TenantRegistry;

/// What eviction has done since the process started (both paths), for `/metrics`.
#[derive(Debug, Default)]
pub struct EvictionStats {
    pub runs: AtomicU64,
    pub layers_evicted: AtomicU64,
    pub bytes_evicted: AtomicU64,
    /// Bytes of layer files on local disk at the last check or admission.
    pub resident_bytes: AtomicU64,
}

/// The total above which the periodic check evicts, as a percentage of the budget.
const HIGH_WATERMARK_PERCENT: u64 = 90;
/// The total at which the periodic check stops evicting, as a percentage of the budget.
const LOW_WATERMARK_PERCENT: u64 = 80;

/// When an eviction run starts and where it stops, in bytes of resident layer files plus
/// incoming bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watermarks {
    /// A run starts when the total passes this.
    pub high_bytes: u64,
    /// A run evicts until the total is at or below this.
    pub target_bytes: u64,
}

impl Watermarks {
    /// The periodic check: above 90% of the budget, down to 80%.
    pub fn periodic(budget_bytes: u64) -> Watermarks {
        Watermarks { high_bytes: budget_bytes / 100 * HIGH_WATERMARK_PERCENT, target_bytes: budget_bytes / 100 * LOW_WATERMARK_PERCENT }
    }

    /// Admission of a download: just what makes it fit in the budget.
    pub fn admission(budget_bytes: u64) -> Watermarks {
        Watermarks { high_bytes: budget_bytes, target_bytes: budget_bytes }
    }
}

/// What one call of `evict_to_budget` found and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EvictionRun {
    /// Bytes of layer files on local disk before the run.
    pub resident_before: u64,
    /// Bytes of layer files on local disk after it.
    pub resident_after: u64,
    pub layers_evicted: u64,
    pub bytes_evicted: u64,
    /// Whether the total passed the high watermark (a run, counted in the stats).
    pub ran: bool,
}

/// The one eviction loop: if `tenants`' resident layer bytes plus `incoming_bytes` pass
/// `marks.high_bytes`, evicts uploaded layers, least recently used first, until the total
/// is at `marks.target_bytes` or nothing more can go. Never evicts the layer at `downloading`
/// nor waits for a layer in use. Counts the run in `stats`; logging is the caller's.
pub fn evict_to_budget(
    tenants: &[Arc<Tenant>],
    incoming_bytes: u64,
    marks: Watermarks,
    downloading: Option<&Path>,
    stats: &EvictionStats,
) -> EvictionRun {
    let timelines: Vec<_> = tenants.iter().flat_map(|t| t.timelines()).collect();
    let resident: u64 = timelines.iter().map(|t| t.resident_layer_bytes()).sum();
    stats.resident_bytes.store(resident, Ordering::Relaxed);
    let mut run = EvictionRun { resident_before: resident, resident_after: resident, ..EvictionRun::default() };
    if resident.saturating_add(incoming_bytes) <= marks.high_bytes {
        return run;
    }
    run.ran = true;
    stats.runs.fetch_add(1, Ordering::Relaxed);
    let mut candidates: Vec<_> =
        timelines.iter().flat_map(|t| t.evictable_layers()).filter(|l| downloading.is_none_or(|p| l.path() != p)).collect();
    candidates.sort_by_key(|l| l.last_access_ms());
    let mut now = resident;
    for layer in candidates {
        if now.saturating_add(incoming_bytes) <= marks.target_bytes {
            break;
        }
        match layer.try_evict() {
            Ok(true) => {
                now -= layer.file_size_bytes().min(now);
                run.layers_evicted += 1;
                run.bytes_evicted += layer.file_size_bytes();
            }
            Ok(false) => {}
            Err(e) => tracing::warn!("could not evict layer {}: {e}", layer.path().display()),
        }
    }
    run.resident_after = now;
    stats.layers_evicted.fetch_add(run.layers_evicted, Ordering::Relaxed);
    stats.bytes_evicted.fetch_add(run.bytes_evicted, Ordering::Relaxed);
    stats.resident_bytes.store(now, Ordering::Relaxed);
    run
}

/// The pageserver's layer disk budget: given to every tenant (`Tenant::load_with_remote`)
/// as its `DiskBudget`, and run periodically by the eviction thread (`check`).
#[derive(Debug)]
pub struct LayerDiskBudget {
    /// Weak: the tenants hold this budget (through their layers).
    tenants: Weak<TenantRegistry>,
    budget_bytes: u64,
    stats: Arc<EvictionStats>,
    /// Bytes of downloads admitted by `make_room` and not done yet. Held while a run
    /// evicts, never during a download: admissions and checks see one another's effects.
    in_flight: Mutex<u64>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl LayerDiskBudget {
    pub fn new(tenants: Weak<TenantRegistry>, budget_bytes: u64, stats: Arc<EvictionStats>) -> LayerDiskBudget {
        LayerDiskBudget { tenants, budget_bytes, stats, in_flight: Mutex::new(0) }
    }

    pub fn budget_bytes(&self) -> u64 {
        self.budget_bytes
    }

    /// Bytes of downloads admitted and not done yet.
    pub fn in_flight_bytes(&self) -> u64 {
        *lock(&self.in_flight)
    }

    fn tenants(&self) -> Vec<Arc<Tenant>> {
        let Some(registry) = self.tenants.upgrade() else { return Vec::new() };
        registry.ids().into_iter().filter_map(|id| registry.get(id)).collect()
    }

    /// The periodic check: above 90% of the budget, evicts down to 80%. Returns the bytes
    /// evicted.
    pub fn check(&self) -> u64 {
        let in_flight = lock(&self.in_flight);
        let run = evict_to_budget(&self.tenants(), *in_flight, Watermarks::periodic(self.budget_bytes), None, &self.stats);
        if !run.ran {
            return 0;
        }
        let (now, budget) = (run.resident_after, self.budget_bytes);
        if now.saturating_add(*in_flight) > budget {
            tracing::warn!(
                "layer files use {now} bytes of local disk ({} more being downloaded), over the budget of {budget}: the rest is not uploaded yet or in use",
                *in_flight
            );
        }
        tracing::info!("evicted {} layers ({} bytes): layer files now use {now} of {budget} bytes", run.layers_evicted, run.bytes_evicted);
        run.bytes_evicted
    }
}

impl DiskBudget for LayerDiskBudget {
    fn make_room(&self, incoming_bytes: u64, downloading: &LayerFile) {
        let mut in_flight = lock(&self.in_flight);
        let others = *in_flight;
        let incoming = others.saturating_add(incoming_bytes);
        let run =
            evict_to_budget(&self.tenants(), incoming, Watermarks::admission(self.budget_bytes), Some(downloading.path()), &self.stats);
        *in_flight = incoming;
        drop(in_flight);
        let (now, budget) = (run.resident_after, self.budget_bytes);
        if run.layers_evicted > 0 {
            tracing::info!(
                "evicted {} layers ({} bytes) to make room for downloading layer {} ({incoming_bytes} bytes): layer files now use {now} of {budget} bytes",
                run.layers_evicted,
                run.bytes_evicted,
                downloading.desc()
            );
        }
        if now.saturating_add(incoming) > budget {
            tracing::warn!(
                "downloading layer {} ({incoming_bytes} bytes) with {now} bytes of layer files on local disk and {others} more being downloaded passes the budget of {budget} bytes by {}: the other resident layers are not uploaded yet or in use",
                downloading.desc(),
                now + incoming - budget
            );
        }
    }

    fn download_done(&self, incoming_bytes: u64, _downloading: &LayerFile) {
        let mut in_flight = lock(&self.in_flight);
        *in_flight = in_flight.saturating_sub(incoming_bytes);
    }
}

#[cfg(test)]
mod tests {
    //! The budget as a ceiling for downloads, on a tenant whose remote storage is a local
    //! directory: every layer is evicted, then reads bring them back under a budget of a
    //! few layers.

    use std::path::PathBuf;
    use std::time::Duration;

    use bytes::Bytes;
    use layerstore::timeline::Timeline;
    use layerstore::value::{ModelReconstructor, Value};
    use layerstore::StorageConfig;
    use proto::{BlockNumber, ForkNumber, Key, Lsn, RelTag, TenantId, TimelineId};
    use remote_storage::RemoteStorage;

    use super::*;

    const TENANT: TenantId = TenantId([0x5A; 16]);
    const MAIN: TimelineId = TimelineId([0xA5; 16]);
    const KEYS_PER_LAYER: u32 = 6;
    const WAIT: Duration = Duration::from_secs(30);

    fn key(blk: u32) -> Key {
        Key::rel_block(RelTag { spcnode: 1663, dbnode: 5, relnode: 16384, forknum: ForkNumber::Main }, BlockNumber(blk))
    }

    /// 3000 bytes that do not compress, different for every key.
    fn payload(blk: u32) -> Bytes {
        let mut x = u64::from(blk).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        Bytes::from(
            (0..3000)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect::<Vec<u8>>(),
        )
    }

    /// The LSN at which layer `round` was flushed: its images are the newest there.
    fn round_lsn(round: u32) -> Lsn {
        Lsn(u64::from(round + 1) * u64::from(KEYS_PER_LAYER))
    }

    struct Setup {
        _dir: tempfile::TempDir,
        _registry: Arc<TenantRegistry>,
        budget: Arc<LayerDiskBudget>,
        stats: Arc<EvictionStats>,
        tenant: Arc<Tenant>,
        timeline: Arc<Timeline>,
        rounds: u32,
    }

    impl Drop for Setup {
        fn drop(&mut self) {
            self.tenant.shutdown_remote();
        }
    }

    /// `rounds` uploaded layers of `KEYS_PER_LAYER` images each, all evicted, in a tenant
    /// attached again under a budget that `budget_bytes` picks from the layer sizes.
    fn setup(rounds: u32, budget_bytes: impl FnOnce(&[u64]) -> u64) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let remote = RemoteStorage::from_url(&format!("file://{}/remote", dir.path().display())).unwrap();
        let local: PathBuf = dir.path().join("local");
        std::fs::create_dir(&local).unwrap();
        let sizes = {
            let tenant = Tenant::create_with_remote(&local, TENANT, StorageConfig::default(), &[], Some(&remote), None).unwrap();
            let timeline = tenant.create_timeline(MAIN).unwrap();
            let mut lsn = 0;
            for round in 0..rounds {
                for k in 0..KEYS_PER_LAYER {
                    lsn += 1;
                    let blk = round * KEYS_PER_LAYER + k;
                    timeline.put(key(blk), Lsn(lsn), &Value::Image(payload(blk))).unwrap();
                }
                timeline.advance_last_record_lsn(Lsn(lsn)).unwrap();
                assert_eq!(Lsn(lsn), round_lsn(round));
                timeline.freeze_and_flush().unwrap();
            }
            assert!(timeline.wait_for_uploads(WAIT));
            let sizes: Vec<u64> = timeline.layers().iter().filter_map(|d| timeline.layer_file_size_bytes(d)).collect();
            assert_eq!(sizes.len() as u32, rounds, "one layer per round");
            tenant.shutdown_remote();
            sizes
        };
        let registry = Arc::new(TenantRegistry::default());
        let stats = Arc::new(EvictionStats::default());
        let budget = Arc::new(LayerDiskBudget::new(Arc::downgrade(&registry), budget_bytes(&sizes), Arc::clone(&stats)));
        let dyn_budget: Arc<dyn DiskBudget> = budget.clone();
        let tenant =
            Arc::new(Tenant::load_with_remote(&local, TENANT, StorageConfig::default(), &[], Some(&remote), Some(dyn_budget)).unwrap());
        registry.insert(Arc::clone(&tenant));
        let timeline = tenant.get_timeline(MAIN).unwrap();
        assert!(timeline.wait_for_uploads(WAIT));
        for layer in timeline.evictable_layers() {
            assert!(layer.evict().unwrap());
        }
        assert_eq!(timeline.resident_layer_bytes(), 0, "every layer evicted");
        Setup { _dir: dir, _registry: registry, budget, stats, tenant, timeline, rounds }
    }

    fn read(timeline: &Timeline, blk: u32, lsn: Lsn) {
        let got = timeline.get(key(blk), lsn, &ModelReconstructor).unwrap();
        assert_eq!(got, Some(payload(blk)), "key {blk} at {lsn}");
    }

    fn downloads(timeline: &Timeline) -> u64 {
        timeline.remote_status().unwrap().layers_downloaded
    }

    #[test]
    fn downloads_make_room_and_resident_layers_never_pass_the_budget() {
        // Room for three of the ten layers.
        let s = setup(10, |sizes| 3 * sizes.iter().max().unwrap());
        let (t, budget) = (&s.timeline, s.budget.budget_bytes());
        let last = round_lsn(s.rounds - 1);
        // Each read at a layer's own LSN needs that layer only; every key at the last LSN
        // walks the layers above its own. Forwards, then backwards, then everything at once.
        let mut reads = 0;
        for pass in 0..2 {
            for round in 0..s.rounds {
                let round = if pass == 0 { round } else { s.rounds - 1 - round };
                for k in 0..KEYS_PER_LAYER {
                    read(t, round * KEYS_PER_LAYER + k, round_lsn(round));
                    reads += 1;
                    let resident = t.resident_layer_bytes();
                    assert!(resident <= budget, "read {reads}: {resident} bytes resident, budget {budget}");
                }
            }
        }
        for blk in 0..s.rounds * KEYS_PER_LAYER {
            read(t, blk, last);
            let resident = t.resident_layer_bytes();
            assert!(resident <= budget, "key {blk} at the last LSN: {resident} bytes resident, budget {budget}");
        }
        assert!(downloads(t) > u64::from(s.rounds), "layers were evicted and downloaded again: {}", downloads(t));
        let (runs, layers, bytes) = (
            s.stats.runs.load(Ordering::Relaxed),
            s.stats.layers_evicted.load(Ordering::Relaxed),
            s.stats.bytes_evicted.load(Ordering::Relaxed),
        );
        assert!(
            runs > 0 && layers >= downloads(t) - 3 && bytes > 0,
            "admissions count in the stats: {runs} runs, {layers} layers, {bytes} bytes"
        );
        assert_eq!(s.budget.in_flight_bytes(), 0, "every admitted download is done");
        // The periodic check shares the loop: above 90% it evicts down to 80%.
        if t.resident_layer_bytes() > budget / 100 * 90 {
            assert!(s.budget.check() > 0);
            assert!(t.resident_layer_bytes() <= budget / 100 * 80);
        }
    }

    #[test]
    fn a_download_with_no_room_to_make_goes_ahead() {
        // A budget smaller than one layer: nothing can make room, reads still succeed.
        let s = setup(3, |sizes| sizes.iter().min().unwrap() / 2);
        for round in 0..s.rounds {
            read(&s.timeline, round * KEYS_PER_LAYER, round_lsn(round));
        }
        assert_eq!(downloads(&s.timeline), u64::from(s.rounds));
        assert_eq!(s.budget.in_flight_bytes(), 0);
    }

    #[test]
    fn concurrent_downloads_under_a_tight_budget_do_not_deadlock() {
        // Room for two of eight layers; two readers keep downloading and evicting each
        // other's layers.
        let s = Arc::new(setup(8, |sizes| 2 * sizes.iter().max().unwrap()));
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let mut handles = Vec::new();
        for reader in 0..2u32 {
            let (s, done_tx) = (Arc::clone(&s), done_tx.clone());
            handles.push(std::thread::spawn(move || {
                for pass in 0..6 {
                    for round in (reader..s.rounds).step_by(2) {
                        read(&s.timeline, round * KEYS_PER_LAYER + pass % KEYS_PER_LAYER, round_lsn(round));
                        // The other reader's layer at the same time, too.
                        let other = (round + 1) % s.rounds;
                        read(&s.timeline, other * KEYS_PER_LAYER, round_lsn(other));
                    }
                }
                done_tx.send(reader).unwrap();
            }));
        }
        for _ in 0..2 {
            done_rx.recv_timeout(Duration::from_secs(120)).expect("both readers finish: no deadlock");
        }
        for h in handles {
            h.join().unwrap();
        }
        assert!(downloads(&s.timeline) > u64::from(s.rounds));
        assert_eq!(s.budget.in_flight_bytes(), 0);
        let (resident, budget) = (s.timeline.resident_layer_bytes(), s.budget.budget_bytes());
        assert!(resident <= budget, "{resident} bytes resident, budget {budget}");
    }
}
