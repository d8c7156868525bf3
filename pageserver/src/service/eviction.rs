//! Local disk as a cache of remote storage: when the layer files on local disk pass 90% of
//! the configured budget, layers that remote storage holds are evicted, least recently
//! used first, until the total is at 80% (so eviction does not run again at the next
//! write). The checks are periodic: the top tenth of the budget is the room for what
//! flushes, compaction and downloads add between two checks, so that the budget holds
//! as a ceiling, not as a trigger. Reads download evicted layers again
//! (`layerstore::layer::LayerFile`).
//!
//! Invariant: only layers whose upload completed are evicted (`Timeline::evictable_layers`),
//! so eviction never deletes the only copy of a version. Layers not yet uploaded count
//! towards the budget but stay; the disk may exceed the budget while uploads lag.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use layerstore::tenant::Tenant;

/// What eviction has done since the process started, for `/metrics`.
#[derive(Debug, Default)]
pub struct EvictionStats {
    pub runs: AtomicU64,
    pub layers_evicted: AtomicU64,
    pub bytes_evicted: AtomicU64,
    /// Bytes of layer files on local disk at the last check.
    pub resident_bytes: AtomicU64,
}

/// The total above which eviction starts, as a percentage of the budget.
const HIGH_WATERMARK_PERCENT: u64 = 90;
/// The total at which eviction stops, as a percentage of the budget.
const LOW_WATERMARK_PERCENT: u64 = 80;

/// One check: evicts down to the low watermark if `tenants`' layers pass the high one.
/// Returns the bytes evicted.
pub fn evict_to_budget(tenants: &[Arc<Tenant>], budget_bytes: u64, stats: &EvictionStats) -> u64 {
    let timelines: Vec<_> = tenants.iter().flat_map(|t| t.timelines()).collect();
    let resident: u64 = timelines.iter().map(|t| t.resident_layer_bytes()).sum();
    stats.resident_bytes.store(resident, Ordering::Relaxed);
    if resident <= budget_bytes / 100 * HIGH_WATERMARK_PERCENT {
        return 0;
    }
    stats.runs.fetch_add(1, Ordering::Relaxed);
    let target = budget_bytes / 100 * LOW_WATERMARK_PERCENT;
    let mut candidates: Vec<_> = timelines.iter().flat_map(|t| t.evictable_layers()).collect();
    candidates.sort_by_key(|l| l.last_access_ms());
    let mut now = resident;
    let (mut evicted, mut bytes) = (0u64, 0u64);
    for layer in candidates {
        if now <= target {
            break;
        }
        match layer.evict() {
            Ok(true) => {
                now -= layer.file_size_bytes().min(now);
                evicted += 1;
                bytes += layer.file_size_bytes();
            }
            Ok(false) => {}
            Err(e) => tracing::warn!("could not evict layer {}: {e}", layer.path().display()),
        }
    }
    stats.layers_evicted.fetch_add(evicted, Ordering::Relaxed);
    stats.bytes_evicted.fetch_add(bytes, Ordering::Relaxed);
    stats.resident_bytes.store(now, Ordering::Relaxed);
    if now > budget_bytes {
        tracing::warn!("layer files use {now} bytes of local disk, over the budget of {budget_bytes}: the rest is not uploaded yet");
    }
    tracing::info!("evicted {evicted} layers ({bytes} bytes): layer files now use {now} of {budget_bytes} bytes");
    bytes
}
