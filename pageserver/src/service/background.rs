//! Background jobs: compaction, image layer creation and GC, scheduled by the pageserver
//! itself, and the same jobs run on demand through the management API.
//!
//! One scheduler thread (`BackgroundJobs`) wakes every `background_job_period_ms` and, for
//! every timeline of every tenant, in turn:
//! 1. **image creation**: cuts the key space into partitions of at most
//!    `image_layer_target_size_bytes / 8 KiB` keys (a page each, so a partition's images are
//!    about one image layer) and rebuilds, at the disk-consistent LSN, the partitions whose
//!    delta depth reached `image_creation_threshold`, deepest first, at most
//!    `image_creation_ranges_per_run` of them per timeline and run
//!    (`Timeline::create_image_layers_where_needed`). The work of a run is bounded by that
//!    budget; what is left waits for the next run. It runs before compaction, which would
//!    hide the depth (see `Jobs::compact`);
//! 2. **compaction**: merges the L0 layers into L1 layers once `compaction_l0_threshold` of
//!    them exist (`Timeline::compact`);
//! 3. **GC** at a cutoff that keeps the tenant's PITR window: the start of the window as an
//!    LSN (`lsn_for_timestamp` of now minus the window; a time before every readable
//!    commit, or no commits at all, keeps the current cutoff), lowered to keep
//!    `gc_horizon_bytes` of log below the last record, to the disk-consistent LSN, and to
//!    the lowest LSN a reader holds a lease on (`renew_lsn_lease`: read replicas renew one at
//!    their replay position every second or two; a lease not renewed within its time to live
//!    lapses). The tenant keeps its children's branch points (`Tenant::gc_timeline`).
//!    Leases are granted and GC picks its cutoff under one lock, so a lease granted at or
//!    above the timeline's GC cutoff is never collected under. Leases live in memory: after
//!    a start the scheduler runs no GC for `gc_lease_grace_ms` (30 s), time for their
//!    holders (renewing every second) to renew.
//!
//! Jobs never block ingest or reads for long: the engine runs them under the timeline's
//! `layer_removal_lock`, which neither takes, and swaps the layer map in one short write.
//! Image creation replays records through a WAL redo pool of its own (one process), so it
//! never takes a redo process from a GetPage. A job that fails is logged once here and
//! counted; the next run tries again. Every run is counted in `metrics`; a run that did
//! something logs one line at info (what, how much, how long).

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use proto::page::PAGE_SIZE_BYTES;
use proto::{KeyRange, Lsn, TenantId, TimelineId};

use crate::pgdata::timestamp::{lsn_for_timestamp, timestamptz_from_system_time, LsnForTimestamp};
use crate::service::metrics::{JobKind, JobStats, Metrics};
use crate::service::page_service::TenantRegistry;
use crate::service::tenant_conf::TenantConfs;
use layerstore::tenant::Tenant;
use layerstore::timeline::Timeline;
use layerstore::value::Reconstructor;
use layerstore::{CompactionResult, GcResult, ImageCreationResult};

/// The pageserver-wide settings of the jobs (from `PageserverConfig`).
#[derive(Clone, Debug)]
pub struct JobSettings {
    /// The PITR window of tenants that set none.
    pub pitr_window_default: Duration,
    /// Image creation rebuilds at most this many partitions per timeline and run.
    pub image_ranges_per_run: usize,
    /// After a start, the scheduler runs no GC for this long (leases live in memory; their
    /// holders renew them meanwhile).
    pub lease_grace: Duration,
}

/// What `compact` did: image layers, then L0 compaction.
#[derive(Clone, Debug, Default)]
pub struct CompactOutcome {
    pub compaction: CompactionResult,
    pub images: ImageCreationResult,
}

/// What `gc` did, and where the PITR window's start fell.
#[derive(Clone, Debug)]
pub struct GcOutcome {
    pub result: GcResult,
    pub pitr_cutoff: LsnForTimestamp,
}

/// Everything the jobs need, shared by the scheduler thread and the management API.
pub struct Jobs {
    tenants: Arc<TenantRegistry>,
    /// Redo for image creation: a pool apart from the page service's.
    reconstructor: Arc<dyn Reconstructor>,
    tenant_confs: Arc<TenantConfs>,
    metrics: Arc<Metrics>,
    settings: JobSettings,
    /// Per timeline, the leases by holder: GC keeps every LSN at or above the lowest.
    leases: Mutex<HashMap<(TenantId, TimelineId), HashMap<String, Lease>>>,
    /// When this process started: leases live in memory only, so the scheduler runs no GC
    /// until their holders had `settings.lease_grace` to renew them.
    started: Instant,
    /// When each tenant was attached here after the start (a failover, a migration): its
    /// leases were held on another pageserver, and their holders need the same grace to
    /// renew them here.
    attached: Mutex<HashMap<TenantId, Instant>>,
}

/// A reader's hold on an LSN: GC keeps it readable until the lease lapses.
#[derive(Clone, Copy, Debug)]
struct Lease {
    lsn: Lsn,
    /// `None`: until lifted.
    expires: Option<Instant>,
    /// Whose it is: the fingerprint of the token that took it, `None` for an admin's (or
    /// with authentication off). Only its owner or an admin renews or moves it.
    owner: Option<u64>,
}

/// Why a lease was refused.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("LSN {lsn} is below the garbage collection horizon {cutoff} of the timeline: pages there may already be gone")]
    BelowGcHorizon { lsn: Lsn, cutoff: Lsn },
    #[error("the lease {holder:?} is held by another token until it lapses")]
    HeldByAnother { holder: String },
}

impl Jobs {
    pub fn new(
        tenants: Arc<TenantRegistry>,
        reconstructor: Arc<dyn Reconstructor>,
        tenant_confs: Arc<TenantConfs>,
        metrics: Arc<Metrics>,
        settings: JobSettings,
    ) -> Jobs {
        Jobs {
            tenants,
            reconstructor,
            tenant_confs,
            metrics,
            settings,
            leases: Mutex::new(HashMap::new()),
            started: Instant::now(),
            attached: Mutex::new(HashMap::new()),
        }
    }

    /// `tenant` was attached just now: no scheduled GC of it for the lease grace.
    pub fn note_attached(&self, tenant: TenantId) {
        self.attached.lock().unwrap_or_else(|e| e.into_inner()).insert(tenant, Instant::now());
    }

    /// Whether the scheduler may collect `tenant`'s garbage: every reader's lease had the
    /// grace to be renewed here since the start, and since the tenant's attach.
    fn lease_grace_over(&self, tenant: TenantId) -> bool {
        let since_attach = self.attached.lock().unwrap_or_else(|e| e.into_inner()).get(&tenant).map(|t| t.elapsed());
        self.started.elapsed() >= self.settings.lease_grace && since_attach.is_none_or(|d| d >= self.settings.lease_grace)
    }

    /// The PITR window in force for `tenant`: its own, or the pageserver's default.
    pub fn pitr_window(&self, tenant: TenantId) -> Duration {
        self.tenant_confs.get(tenant).pitr_window.map_or(self.settings.pitr_window_default, |w| w.0)
    }

    /// Makes GC keep every LSN at or above `floor` readable on the timeline (`None` lifts
    /// it): the hook for read replicas and other readers that GC must not overtake. Kept in
    /// memory only: whoever sets it sets it again after a restart.
    pub fn set_gc_retain_floor(&self, tenant: TenantId, timeline: TimelineId, floor: Option<Lsn>) {
        let mut leases = self.leases.lock().unwrap_or_else(|e| e.into_inner());
        let held = leases.entry((tenant, timeline)).or_default();
        match floor {
            Some(lsn) => held.insert(String::new(), Lease { lsn, expires: None, owner: None }),
            None => held.remove(""),
        };
    }

    /// Grants or renews `holder`'s lease on `lsn` of `timeline` for `ttl` (replacing the
    /// holder's previous one, which may be lower or higher): GC keeps every LSN at or above
    /// it readable until then. Refused below the timeline's GC cutoff, and when the holder's
    /// lease in force belongs to another `owner` (a token's fingerprint; `None`, an admin,
    /// may replace any): otherwise any compute of the timeline could move a replica's lease
    /// up and let GC take the pages the replica reads.
    pub fn renew_lsn_lease(
        &self,
        timeline: &Timeline,
        holder: &str,
        lsn: Lsn,
        ttl: Duration,
        owner: Option<u64>,
    ) -> Result<(), LeaseError> {
        let mut leases = self.leases.lock().unwrap_or_else(|e| e.into_inner());
        let cutoff = timeline.gc_cutoff_lsn();
        if lsn < cutoff {
            return Err(LeaseError::BelowGcHorizon { lsn, cutoff });
        }
        let key = (timeline.tenant_id(), timeline.timeline_id());
        let now = Instant::now();
        let held = leases.entry(key).or_default();
        if let (Some(caller), Some(current)) = (owner, held.get(holder)) {
            let live = current.expires.is_none_or(|e| e > now);
            if live && current.owner != Some(caller) {
                return Err(LeaseError::HeldByAnother { holder: holder.to_string() });
            }
        }
        // A TTL is bounded by the caller; saturate rather than overflow the clock.
        let expires = now.checked_add(ttl).unwrap_or(now + Duration::from_secs(3600));
        held.insert(holder.to_string(), Lease { lsn, expires: Some(expires), owner });
        Ok(())
    }

    /// The lowest leased LSN of a timeline, dropping lapsed leases; the caller holds the lock.
    fn lowest_lease(leases: &mut HashMap<(TenantId, TimelineId), HashMap<String, Lease>>, key: (TenantId, TimelineId)) -> Option<Lsn> {
        let now = Instant::now();
        let held = leases.get_mut(&key)?;
        held.retain(|holder, l| {
            let live = l.expires.is_none_or(|e| e > now);
            if !live {
                tracing::info!(tenant_id = %key.0, timeline_id = %key.1, "the lease of {holder:?} on {} lapsed", l.lsn);
            }
            live
        });
        held.values().map(|l| l.lsn).min()
    }

    /// The leases of a timeline in force: (holder, LSN), for the management API.
    pub fn lsn_leases(&self, tenant: TenantId, timeline: TimelineId) -> Vec<(String, Lsn)> {
        let mut leases = self.leases.lock().unwrap_or_else(|e| e.into_inner());
        Self::lowest_lease(&mut leases, (tenant, timeline));
        let mut out: Vec<(String, Lsn)> =
            leases.get(&(tenant, timeline)).map(|h| h.iter().map(|(k, l)| (k.clone(), l.lsn)).collect()).unwrap_or_default();
        out.sort();
        out
    }

    /// Image layers where the delta depth reached the threshold, within the per-run budget
    /// (or for every partition with `force_images`), then L0 compaction (at the threshold,
    /// or of every L0 layer with `force_l0`).
    ///
    /// Images come first because depth counts layers, not records: compaction would merge
    /// the L0 layers above the newest image into one L1 layer per key range, with all their
    /// records, and a hot key's depth would drop while its records stayed. Counted over the
    /// separate L0 layers, a depth below the threshold bounds the records a read replays to
    /// fewer than `image_creation_threshold` flushes' worth, plus the open layer.
    pub fn compact(&self, tenant: &Tenant, timeline: &Timeline, force_l0: bool, force_images: bool) -> anyhow::Result<CompactOutcome> {
        let started = Instant::now();
        let images = self.create_images(tenant, timeline, force_images).context("create image layers");
        let stats = |r: &ImageCreationResult| JobStats {
            bytes_written: r.bytes_written,
            layers_created: r.layers_created.len() as u64,
            ..JobStats::default()
        };
        self.metrics.job_finished(JobKind::ImageCreation, started.elapsed(), images.as_ref().map(stats).map_err(drop));
        let images = images?;
        if !images.ranges.is_empty() {
            let depth = images.ranges.first().map_or(0, |r| r.depth);
            tracing::info!(
                "image creation: {} key ranges (deepest {depth} delta layers) at {} into {} image layers, {} written in {:.3} s{}",
                images.ranges.len(),
                images.lsn,
                images.layers_created.len(),
                mib(images.bytes_written),
                started.elapsed().as_secs_f64(),
                if images.ranges_deferred > 0 { format!("; {} ranges left for later runs", images.ranges_deferred) } else { String::new() }
            );
        }

        let started = Instant::now();
        let compaction = timeline.compact_level0(force_l0).context("compact L0 layers");
        let stats = |r: &CompactionResult| JobStats {
            bytes_written: r.bytes_written,
            layers_created: r.l1_created.len() as u64,
            layers_removed: r.l0_removed.len() as u64,
            ..JobStats::default()
        };
        self.metrics.job_finished(JobKind::Compaction, started.elapsed(), compaction.as_ref().map(stats).map_err(drop));
        let compaction = compaction?;
        if !compaction.l0_removed.is_empty() {
            tracing::info!(
                "compaction: {} L0 layers into {} L1 layers, {} written in {:.3} s",
                compaction.l0_removed.len(),
                compaction.l1_created.len(),
                mib(compaction.bytes_written),
                started.elapsed().as_secs_f64()
            );
        }
        Ok(CompactOutcome { compaction, images })
    }

    fn create_images(&self, tenant: &Tenant, timeline: &Timeline, force: bool) -> anyhow::Result<ImageCreationResult> {
        let lsn = timeline.disk_consistent_lsn();
        let (min_depth, ranges_max) =
            if force { (0, usize::MAX) } else { (tenant.conf().image_creation_threshold, self.settings.image_ranges_per_run) };
        // Listing the keys costs a pass over every layer's index; skip it when no range can
        // be deep enough.
        if !lsn.is_valid() || lsn < timeline.gc_cutoff_lsn() || timeline.delta_depth(&KeyRange::ALL) < min_depth {
            return Ok(ImageCreationResult::default());
        }
        let keys_per_partition = (tenant.conf().image_layer_target_size_bytes / PAGE_SIZE_BYTES as u64).max(1);
        let partitions = timeline.partition_keys(lsn, usize::try_from(keys_per_partition).unwrap_or(usize::MAX))?;
        timeline.create_image_layers_where_needed(&partitions, min_depth, ranges_max, self.reconstructor.as_ref())
    }

    /// GC of one timeline at the cutoff the module doc describes; `pitr_window` replaces the
    /// tenant's for this run.
    pub fn gc(&self, tenant: &Tenant, timeline: &Timeline, pitr_window: Option<Duration>) -> anyhow::Result<GcOutcome> {
        let started = Instant::now();
        let outcome = self.gc_inner(tenant, timeline, pitr_window).context("collect garbage");
        let stats = |o: &GcOutcome| JobStats {
            bytes_removed: o.result.bytes_removed,
            layers_removed: o.result.layers_removed.len() as u64,
            ..JobStats::default()
        };
        self.metrics.job_finished(JobKind::Gc, started.elapsed(), outcome.as_ref().map(stats).map_err(drop));
        let outcome = outcome?;
        if !outcome.result.layers_removed.is_empty() {
            tracing::info!(
                "gc: cutoff {} (PITR window start: {}), {} layers removed, {} freed in {:.3} s",
                outcome.result.cutoff,
                outcome.pitr_cutoff,
                outcome.result.layers_removed.len(),
                mib(outcome.result.bytes_removed),
                started.elapsed().as_secs_f64()
            );
        }
        Ok(outcome)
    }

    fn gc_inner(&self, tenant: &Tenant, timeline: &Timeline, pitr_window: Option<Duration>) -> anyhow::Result<GcOutcome> {
        let window = pitr_window.unwrap_or_else(|| self.pitr_window(tenant.tenant_id()));
        let start = SystemTime::now().checked_sub(window).unwrap_or(SystemTime::UNIX_EPOCH);
        let pitr_cutoff = lsn_for_timestamp(timeline, timestamptz_from_system_time(start)).context("find the PITR window's start")?;
        let time_lsn = match pitr_cutoff {
            LsnForTimestamp::Present(lsn) | LsnForTimestamp::Future(lsn) => lsn,
            // Nothing readable is older than the window, or no time is known: keep what is.
            LsnForTimestamp::Past(_) | LsnForTimestamp::NoData(_) => timeline.gc_cutoff_lsn(),
        };
        let space_lsn = Lsn(timeline.last_record_lsn().0.saturating_sub(tenant.conf().gc_horizon_bytes));
        let mut cutoff = time_lsn.min(space_lsn).min(timeline.disk_consistent_lsn());
        // Held until GC is done: no lease is granted between the cutoff's choice and its use.
        let mut leases = self.leases.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(floor) = Self::lowest_lease(&mut leases, (tenant.tenant_id(), timeline.timeline_id())) {
            cutoff = cutoff.min(floor);
        }
        let result = tenant.gc_timeline(timeline.timeline_id(), cutoff)?;
        drop(leases);
        Ok(GcOutcome { result, pitr_cutoff })
    }

    /// One pass of the scheduler over every timeline of every tenant.
    pub fn run_once(&self, stop: &StopFlag) {
        for tenant_id in self.tenants.ids() {
            let Some(tenant) = self.tenants.get(tenant_id) else { continue };
            for timeline in tenant.timelines() {
                if stop.is_set() {
                    return;
                }
                if !timeline.last_record_lsn().is_valid() {
                    continue;
                }
                let span = tracing::info_span!("background", tenant_id = %tenant_id, timeline_id = %timeline.timeline_id());
                let _entered = span.enter();
                // The error's context says which job failed; the next run tries again.
                if let Err(e) = self.compact(&tenant, &timeline, false, false) {
                    tracing::error!("background job failed: {e:#}");
                }
                if self.lease_grace_over(tenant_id) {
                    if let Err(e) = self.gc(&tenant, &timeline, None) {
                        tracing::error!("background job failed: {e:#}");
                    }
                }
            }
        }
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// Set once to stop the scheduler; wakes it from its sleep.
#[derive(Default)]
pub struct StopFlag {
    stopped: Mutex<bool>,
    changed: Condvar,
}

impl StopFlag {
    pub fn is_set(&self) -> bool {
        *self.stopped.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set(&self) {
        *self.stopped.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.changed.notify_all();
    }

    /// Sleeps for `period` or until set; returns whether it is set.
    pub fn sleep(&self, period: Duration) -> bool {
        let guard = self.stopped.lock().unwrap_or_else(|e| e.into_inner());
        let (guard, _) = self.changed.wait_timeout_while(guard, period, |stopped| !*stopped).unwrap_or_else(|e| e.into_inner());
        *guard
    }
}

/// The running scheduler thread; stopped by `stop` (waits for a run in progress).
pub struct BackgroundJobs {
    stop: Arc<StopFlag>,
    thread: Option<JoinHandle<()>>,
}

impl BackgroundJobs {
    /// Runs `jobs` every `period`, the first time one period from now.
    pub fn start(jobs: Arc<Jobs>, period: Duration) -> anyhow::Result<BackgroundJobs> {
        let stop = Arc::new(StopFlag::default());
        let stop2 = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("background-jobs".into())
            .spawn(move || {
                while !stop2.sleep(period) {
                    jobs.run_once(&stop2);
                }
            })
            .context("start the background job thread")?;
        tracing::info!("background jobs run every {} ms", period.as_millis());
        Ok(BackgroundJobs { stop, thread: Some(thread) })
    }

    pub fn stop(mut self) {
        self.stop.set();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for BackgroundJobs {
    fn drop(&mut self) {
        self.stop.set();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pgdata::datadir::Modification;
    use bytes::Bytes;
    use layerstore::{ModelReconstructor, StorageConfig};
    use proto::{BlockNumber, ForkNumber, Key, RelTag};

    const TENANT: TenantId = TenantId([3; 16]);
    const MAIN: TimelineId = TimelineId([4; 16]);

    fn key(blk: u32) -> Key {
        Key::rel_block(RelTag { spcnode: 1663, dbnode: 5, relnode: 16384, forknum: ForkNumber::Main }, BlockNumber(blk))
    }

    /// A tenant whose storage compacts after 3 L0 layers and images after a depth of 2,
    /// with partitions of 2 keys (16 KiB of image layer target at 8 KiB per key).
    fn setup() -> (tempfile::TempDir, Arc<Jobs>, Arc<Tenant>, Arc<Timeline>) {
        let dir = tempfile::tempdir().unwrap();
        let conf = StorageConfig {
            compaction_l0_threshold: 3,
            image_creation_threshold: 2,
            image_layer_target_size_bytes: 2 * PAGE_SIZE_BYTES as u64,
            gc_horizon_bytes: 0,
            ..StorageConfig::default()
        };
        let tenant = Arc::new(Tenant::create(dir.path(), TENANT, conf, &[]).unwrap());
        let timeline = tenant.create_timeline(MAIN).unwrap();
        let registry = Arc::new(TenantRegistry::default());
        registry.insert(Arc::clone(&tenant));
        let settings = JobSettings { pitr_window_default: Duration::from_secs(3600), image_ranges_per_run: 1, lease_grace: Duration::ZERO };
        let jobs = Jobs::new(registry, Arc::new(ModelReconstructor), Arc::default(), Arc::new(Metrics::new()), settings);
        (dir, Arc::new(jobs), tenant, timeline)
    }

    /// A commit at `lsn` stamped `ago` before now that writes `value` to key 0 (and, the
    /// first time, keys 1 to 5), then a flush: one L0 layer per call.
    fn commit(t: &Timeline, lsn: u64, ago: Duration, value: &str) {
        let mut m = Modification::new(t, Lsn(lsn));
        m.put_last_commit_timestamp(timestamptz_from_system_time(SystemTime::now() - ago));
        if lsn == 0x100 {
            for blk in 1..6 {
                m.put_image(key(blk), Bytes::from(format!("k{blk}")));
            }
            m.put_image(key(0), Bytes::from(value.to_string()));
        } else {
            m.put_record(key(0), crate::pgdata::reconstruct::StoredRecord::Postgres(Bytes::from(value.to_string())), false).unwrap();
        }
        m.commit().unwrap();
        t.freeze_and_flush().unwrap();
    }

    fn l0_count(t: &Timeline) -> usize {
        t.layers().iter().filter(|d| d.is_l0()).count()
    }

    #[test]
    fn images_where_deep_within_the_budget_then_compaction() {
        let (_dir, jobs, tenant, t) = setup();
        let hour = Duration::from_secs(3600);
        commit(&t, 0x100, hour, "a");
        commit(&t, 0x200, hour, "b");
        let outcome = jobs.compact(&tenant, &t, false, false).unwrap();
        // Two L0 layers are a depth of 2 everywhere: every partition is deep, one per run
        // (the first, holding key 0: equals go in key order).
        assert_eq!((outcome.images.ranges.len(), outcome.images.ranges_deferred), (1, 3));
        assert_eq!(outcome.images.ranges[0].key_range.start, Key::MIN);
        assert!(outcome.compaction.l0_removed.is_empty(), "two L0 layers are below the threshold of 3");
        commit(&t, 0x300, hour, "c");
        let outcome = jobs.compact(&tenant, &t, false, false).unwrap();
        // The deferred partitions, at depth 3, before the first one (depth 1); then all
        // three L0 layers are compacted.
        assert_eq!((outcome.images.ranges.len(), outcome.images.ranges[0].depth, outcome.images.ranges_deferred), (1, 3, 2));
        assert_eq!(outcome.compaction.l0_removed.len(), 3);
        assert_eq!(l0_count(&t), 0);
        // Key 0 was imaged at 0x200: a read replays the one record after it.
        let data = t.get_reconstruct_data(key(0), t.last_record_lsn()).unwrap();
        assert_eq!(data.records.len(), 1);
        // Forced: every partition, whatever its depth, without a budget.
        let forced = jobs.compact(&tenant, &t, false, true).unwrap();
        assert_eq!(forced.images.ranges_deferred, 0);
        assert!(forced.images.ranges.len() >= 3, "{:?}", forced.images.ranges);
        assert_eq!(t.delta_depth(&KeyRange::ALL), 0);
        let value = t.get(key(0), t.last_record_lsn(), &ModelReconstructor).unwrap().unwrap();
        assert_eq!(&value[..], b"a\x01b\x01c" as &[u8], "the image holds what the records built");
        let families = jobs.metrics.gather();
        let runs = families.iter().find(|f| f.name() == "pageserver_background_job_runs_total").unwrap();
        assert_eq!(runs.get_metric().len(), 2, "compaction and image creation were counted");
    }

    #[test]
    fn gc_keeps_the_pitr_window_branch_points_and_the_retain_floor() {
        let (_dir, jobs, tenant, t) = setup();
        let hour = Duration::from_secs(3600);
        commit(&t, 0x100, 3 * hour, "a");
        commit(&t, 0x200, 2 * hour, "b");
        commit(&t, 0x300, Duration::ZERO, "c");
        jobs.compact(&tenant, &t, true, true).unwrap();
        commit(&t, 0x400, Duration::ZERO, "d");

        // No commit is older than a 4-hour window: the cutoff stays.
        let outcome = jobs.gc(&tenant, &t, Some(4 * hour)).unwrap();
        assert_eq!((outcome.pitr_cutoff, outcome.result.cutoff), (LsnForTimestamp::Past(Lsn(0)), Lsn(0)));
        // A 90-minute window starts after the commit at 0x200.
        jobs.set_gc_retain_floor(TENANT, MAIN, Some(Lsn(0x180)));
        let outcome = jobs.gc(&tenant, &t, Some(hour + hour / 2)).unwrap();
        assert_eq!(outcome.pitr_cutoff, LsnForTimestamp::Present(Lsn(0x200)));
        assert_eq!(outcome.result.cutoff, Lsn(0x180), "the retain floor holds it back");
        jobs.set_gc_retain_floor(TENANT, MAIN, None);
        let branch = tenant.branch_timeline(TimelineId([5; 16]), MAIN, Lsn(0x200)).unwrap();
        let outcome = jobs.gc(&tenant, &t, Some(hour + hour / 2)).unwrap();
        assert_eq!(outcome.result.cutoff, Lsn(0x200));
        assert_eq!(outcome.result.layers_removed, [], "the images at 0x300 are newer than the cutoff");
        // Images at 0x400 make the layers between 0x300 and 0x400 removable with a zero
        // window (up to the disk-consistent LSN), but what the branch at 0x200 reads stays.
        jobs.compact(&tenant, &t, true, true).unwrap();
        let outcome = jobs.gc(&tenant, &t, Some(Duration::ZERO)).unwrap();
        assert_eq!(outcome.pitr_cutoff, LsnForTimestamp::Future(Lsn(0x400)));
        assert_eq!(outcome.result.cutoff, Lsn(0x400));
        assert!(!outcome.result.layers_removed.is_empty());
        assert!(outcome.result.layers_removed.iter().all(|d| d.lsn_range.start > Lsn(0x200)), "{:?}", outcome.result.layers_removed);
        assert!(outcome.result.bytes_removed > 0);
        assert_eq!(&t.get(key(0), Lsn(0x400), &ModelReconstructor).unwrap().unwrap()[..], b"a\x01b\x01c\x01d" as &[u8]);
        // The branch still reads at its branch point.
        let value = branch.get(key(0), Lsn(0x200), &ModelReconstructor).unwrap().unwrap();
        assert_eq!(&value[..], b"a\x01b" as &[u8]);
    }

    #[test]
    fn lsn_leases_hold_gc_back_until_they_lapse_and_are_refused_below_the_cutoff() {
        let (_dir, jobs, tenant, t) = setup();
        let hour = Duration::from_secs(3600);
        commit(&t, 0x100, 3 * hour, "a");
        commit(&t, 0x200, 2 * hour, "b");
        commit(&t, 0x300, Duration::ZERO, "c");
        jobs.compact(&tenant, &t, true, true).unwrap();
        jobs.renew_lsn_lease(&t, "r1", Lsn(0x180), Duration::from_secs(60), None).unwrap();
        jobs.renew_lsn_lease(&t, "r2", Lsn(0x250), Duration::from_millis(50), None).unwrap();
        assert_eq!(jobs.lsn_leases(TENANT, MAIN), [("r1".to_string(), Lsn(0x180)), ("r2".to_string(), Lsn(0x250))]);
        let outcome = jobs.gc(&tenant, &t, Some(Duration::ZERO)).unwrap();
        assert_eq!(outcome.result.cutoff, Lsn(0x180), "the lowest lease holds GC back");
        // r1 moves on; r2's lease lapses.
        jobs.renew_lsn_lease(&t, "r1", Lsn(0x280), Duration::from_secs(60), None).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(jobs.lsn_leases(TENANT, MAIN), [("r1".to_string(), Lsn(0x280))]);
        let outcome = jobs.gc(&tenant, &t, Some(Duration::ZERO)).unwrap();
        assert_eq!(outcome.result.cutoff, Lsn(0x280));
        let refused = jobs.renew_lsn_lease(&t, "late", Lsn(0x200), Duration::from_secs(60), None).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "LSN 0/200 is below the garbage collection horizon 0/280 of the timeline: pages there may already be gone"
        );
    }

    #[test]
    fn a_lease_is_renewed_only_by_its_owner_or_an_admin_until_it_lapses() {
        let (_dir, jobs, _tenant, t) = setup();
        commit(&t, 0x100, Duration::ZERO, "a");
        let (mine, theirs) = (Some(1), Some(2));
        jobs.renew_lsn_lease(&t, "replica r1", Lsn(0x100), Duration::from_millis(300), mine).unwrap();
        jobs.renew_lsn_lease(&t, "replica r1", Lsn(0x100), Duration::from_millis(300), mine).unwrap();
        let refused = jobs.renew_lsn_lease(&t, "replica r1", Lsn(0x900), Duration::from_secs(60), theirs).unwrap_err();
        assert_eq!(refused.to_string(), "the lease \"replica r1\" is held by another token until it lapses");
        assert_eq!(jobs.lsn_leases(TENANT, MAIN), [("replica r1".to_string(), Lsn(0x100))], "unchanged");
        // An admin's lease is an admin's: a tenant token does not take it over either.
        jobs.renew_lsn_lease(&t, "pinned", Lsn(0x100), Duration::from_secs(60), None).unwrap();
        assert!(jobs.renew_lsn_lease(&t, "pinned", Lsn(0x900), Duration::from_secs(60), mine).is_err());
        // Once lapsed, a holder's name is free again.
        std::thread::sleep(Duration::from_millis(400));
        jobs.renew_lsn_lease(&t, "replica r1", Lsn(0x100), Duration::from_secs(60), theirs).unwrap();
        // A TTL past what the clock can add saturates instead of panicking.
        jobs.renew_lsn_lease(&t, "long", Lsn(0x100), Duration::MAX, mine).unwrap();
    }

    #[test]
    fn the_scheduler_compacts_on_its_own_and_stops() {
        let (_dir, jobs, _tenant, t) = setup();
        for i in 1..=4u64 {
            commit(&t, 0x100 * i, Duration::ZERO, "x");
        }
        assert_eq!(l0_count(&t), 4);
        let scheduler = BackgroundJobs::start(Arc::clone(&jobs), Duration::from_millis(10)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while l0_count(&t) > 0 {
            assert!(Instant::now() < deadline, "no compaction within 30 s: {:?}", t.layers());
            std::thread::sleep(Duration::from_millis(10));
        }
        scheduler.stop();
        assert_eq!(jobs.pitr_window(TENANT), Duration::from_secs(3600));
    }
}
