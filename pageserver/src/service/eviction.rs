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

