//! The materializer: folds the chains of records of hot keys into images, so that no page
//! read replays more than about `fold_after_records` records from an in-memory layer.
//!
//! The engine queues a key when its records since its newest image (or initializing
//! record) in the open layer cross `fold_after_records` or `fold_after_bytes`
//! (`layerstore`'s "Folds"). One thread (`MaterializerThread`) takes the queued keys of every
//! timeline, longest chains first and a few at a time, reads each at the last record LSN, rebuilds the value at
//! its newest version `L` through a WAL redo pool of its own (one process, so a GetPage
//! never waits behind a fold) and replaces the record at `L` by that image
//! (`Timeline::replace_with_image`). Every read returns the same bytes as before; reads at
//! or above `L` start from the image, and so does the L0 file the layer becomes.
//!
//! Second trigger, the read writeback: a GetPage that replayed at least
//! `fold_after_records` records already holds the page its newest record denotes, and hands
//! it to `ReadWriteback::page_rebuilt`, which replaces that record the same way at the cost
//! of one 8 KiB write and no redo.
//!
//! A key is skipped, and counted by reason in `pageserver_fold_skipped_total`, when its
//! chain is already short (under half the threshold: an image arrived, a fold or a flush
//! came first), when the read or the redo fails (logged: a GetPage of the page would fail
//! the same way), and when the engine refuses the replace (`ReplaceOutcome::reason`: the
//! layer was flushed meanwhile, and so on). Folds are paced to `materializer_cpu_share` of
//! one core: after a fold that took `t`, the thread sleeps `t * (1 / share - 1)`.
//!
//! Invariant: a fold only ever stores the value the replaced version denotes, rebuilt from
//! this timeline's versions at exactly that LSN; so whatever the materializer does or fails
//! to do, no read's answer changes.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use proto::{BlockNumber, Key, KeyKind, Lsn, RelTag};

use crate::pgdata::datadir::ReadCost;
use crate::service::background::StopFlag;
use crate::service::metrics::{FoldTrigger, Metrics};
use crate::service::page_service::{ReadWriteback, TenantRegistry};
use layerstore::timeline::Timeline;
use layerstore::value::Reconstructor;
use layerstore::ReplaceOutcome;

/// How long the thread sleeps when no timeline has a key queued.
const IDLE_POLL: Duration = Duration::from_millis(20);
/// Keys taken from one timeline's queue at a time: few, so that the longest chains are
/// chosen again after every few folds (a hot key's chain grows while others are folded),
/// and so that one busy timeline does not starve the others.
const KEYS_PER_TURN: usize = 4;
/// How often the thread logs what it did (when it did anything).
const SUMMARY_PERIOD: Duration = Duration::from_secs(60);

/// The pageserver-wide settings (from `PageserverConfig`).
#[derive(Clone, Copy, Debug)]
pub struct MaterializerSettings {
    /// The share of one core folds may take (0 < share <= 1).
    pub cpu_share: f64,
}

/// What `Materializer::fold_key` did with one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FoldOutcome {
    Folded {
        records: usize,
    },
    /// Not folded, with the reason (the `reason` label of the skip counter).
    Skipped(&'static str),
}

/// The folding policy and its redo: used by the thread and by the page service's writeback.
pub struct Materializer {
    tenants: Arc<TenantRegistry>,
    /// Redo for folds: a pool apart from the page service's.
    reconstructor: Arc<dyn Reconstructor>,
    metrics: Arc<Metrics>,
    settings: MaterializerSettings,
    /// Keys whose rebuild failed, so that a key queued again every few records (one a
    /// GetPage cannot rebuild either) is warned about once, not at every threshold.
    failed: std::sync::Mutex<std::collections::HashSet<(proto::TimelineId, Key)>>,
}

/// The most keys `Materializer::failed` remembers; it starts again when full.
const FAILED_KEYS_MAX: usize = 10_000;

impl Materializer {
    pub fn new(
        tenants: Arc<TenantRegistry>,
        reconstructor: Arc<dyn Reconstructor>,
        metrics: Arc<Metrics>,
        settings: MaterializerSettings,
    ) -> Materializer {
        Materializer { tenants, reconstructor, metrics, settings, failed: Default::default() }
    }

    /// Whether this is the first failed rebuild of `key` remembered.
    fn first_failure(&self, timeline: &Timeline, key: Key) -> bool {
        let mut failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        if failed.len() >= FAILED_KEYS_MAX {
            failed.clear();
        }
        failed.insert((timeline.timeline_id(), key))
    }

    /// Folds `key` at its newest version, unless its chain is already short.
    pub fn fold_key(&self, timeline: &Timeline, key: Key) -> FoldOutcome {
        let started = Instant::now();
        let outcome = self.fold_key_inner(timeline, key);
        match outcome {
            FoldOutcome::Folded { .. } => {
                self.metrics.fold_done(FoldTrigger::Chain, started.elapsed());
            }
            FoldOutcome::Skipped(reason) => self.metrics.fold_skipped(reason),
        }
        outcome
    }

    fn fold_key_inner(&self, timeline: &Timeline, key: Key) -> FoldOutcome {
        let lsn = timeline.last_record_lsn();
        let data = match timeline.get_reconstruct_data(key, lsn) {
            Ok(data) => data,
            Err(e) => {
                tracing::info!("cannot fold {key} at {lsn}: {e}");
                return FoldOutcome::Skipped("read_error");
            }
        };
        let records = data.records.len();
        let bytes: u64 = data.records.iter().map(|(_, r)| r.rec.len() as u64).sum();
        if is_short_chain(timeline, records, bytes) {
            return FoldOutcome::Skipped("short");
        }
        let newest = data.records.last().expect("records is not empty").0;
        let image = match self.reconstructor.reconstruct(key, newest, data) {
            Ok(image) => image,
            Err(e) => {
                let msg = format!("could not fold {key} at {newest}: rebuilding it from {records} records failed: {e:#}");
                if self.first_failure(timeline, key) {
                    tracing::warn!("{msg} (later failures of this key are logged at debug level)");
                } else {
                    tracing::debug!("{msg}");
                }
                return FoldOutcome::Skipped("redo_error");
            }
        };
        match timeline.replace_with_image(key, newest, &image) {
            Ok(ReplaceOutcome::Replaced) => {
                tracing::debug!("folded {key}: {records} records into an image at {newest}");
                FoldOutcome::Folded { records }
            }
            Ok(other) => FoldOutcome::Skipped(other.reason()),
            Err(e) => {
                tracing::warn!("could not fold {key} at {newest}: {e}");
                FoldOutcome::Skipped("write_error")
            }
        }
    }

    /// One turn over every timeline of every tenant: folds up to `KEYS_PER_TURN` queued keys
    /// of each, pacing itself after each fold. Returns the keys it took.
    pub fn run_once(&self, stop: &StopFlag, summary: &mut Summary) -> usize {
        let mut taken = 0;
        for tenant_id in self.tenants.ids() {
            let Some(tenant) = self.tenants.get(tenant_id) else { continue };
            for timeline in tenant.timelines() {
                let keys = timeline.take_long_chains(KEYS_PER_TURN);
                if keys.is_empty() {
                    continue;
                }
                let span = tracing::info_span!("materializer", tenant_id = %tenant_id, timeline_id = %timeline.timeline_id());
                let _entered = span.enter();
                for (key, _chain) in keys {
                    if stop.is_set() {
                        return taken;
                    }
                    taken += 1;
                    let started = Instant::now();
                    summary.add(self.fold_key(&timeline, key));
                    if stop.sleep(pace(started.elapsed(), self.settings.cpu_share)) {
                        return taken;
                    }
                }
            }
        }
        taken
    }
}

/// Under this many records a queued key is not worth a fold any more: half the threshold
/// (one record when only the byte threshold is on).
/// A chain below half of both thresholds is not worth a fold: an image arrived since the
/// key was queued, or it was queued by one threshold and has since been folded. A chain
/// queued by its bytes (a few records of large WAL records) is long by bytes, however few
/// its records.
fn is_short_chain(timeline: &Timeline, records: usize, bytes: u64) -> bool {
    let conf = timeline.conf();
    let by_records = conf.fold_after_records == 0 || records < (conf.fold_after_records as usize / 2).max(1);
    let by_bytes = conf.fold_after_bytes == 0 || bytes < conf.fold_after_bytes / 2;
    by_records && by_bytes
}

/// How long to sleep after work that took `took`, to use at most `share` of a core.
fn pace(took: Duration, share: f64) -> Duration {
    took.mul_f64((1.0 / share - 1.0).max(0.0))
}

impl ReadWriteback for Materializer {
    fn page_rebuilt(&self, timeline: &Timeline, rel: RelTag, blkno: BlockNumber, cost: ReadCost, page: &Bytes) {
        let threshold = timeline.conf().fold_after_records as usize;
        let Some(newest) = cost.newest_record_lsn else { return };
        if threshold == 0 || cost.records_replayed < threshold {
            return;
        }
        let Ok(key) = Key::try_from(KeyKind::RelBlock { rel, blkno }) else { return };
        match write_back(timeline, key, newest, page) {
            Ok(ReplaceOutcome::Replaced) => {
                tracing::debug!("a read of {rel} block {blkno} folded {} records into an image at {newest}", cost.records_replayed);
                self.metrics.fold_done(FoldTrigger::Read, Duration::ZERO);
            }
            Ok(other) => self.metrics.fold_skipped(other.reason()),
            Err(e) => {
                tracing::warn!("could not write back {rel} block {blkno} at {newest}: {e}");
                self.metrics.fold_skipped("write_error");
            }
        }
    }
}

/// Replaces the record at `newest` (the newest version a read at some LSN found) by the page
/// that read rebuilt: with no version between `newest` and the read's LSN, the page is the
/// value at `newest` too.
fn write_back(timeline: &Timeline, key: Key, newest: Lsn, page: &[u8]) -> Result<ReplaceOutcome, layerstore::WriteError> {
    timeline.replace_with_image(key, newest, page)
}

/// What the thread did since its last log line.
#[derive(Debug, Default)]
pub struct Summary {
    folded: u64,
    records: u64,
    skipped: std::collections::BTreeMap<&'static str, u64>,
    since: Option<Instant>,
}

impl Summary {
    /// Keys folded (since the last log line).
    pub fn folded(&self) -> u64 {
        self.folded
    }

    fn add(&mut self, outcome: FoldOutcome) {
        self.since.get_or_insert_with(Instant::now);
        match outcome {
            FoldOutcome::Folded { records } => {
                self.folded += 1;
                self.records += records as u64;
            }
            FoldOutcome::Skipped(reason) => *self.skipped.entry(reason).or_default() += 1,
        }
    }

    /// Logs one line once `SUMMARY_PERIOD` has passed since the first outcome, then starts
    /// again.
    fn log_if_due(&mut self) {
        let Some(since) = self.since else { return };
        if since.elapsed() < SUMMARY_PERIOD {
            return;
        }
        tracing::info!(
            "folded {} hot keys ({} records) into images in the last {} s; skipped: {:?}",
            self.folded,
            self.records,
            since.elapsed().as_secs(),
            self.skipped
        );
        *self = Summary::default();
    }
}

/// The running materializer thread; stopped by `stop` (waits for the fold in progress).
pub struct MaterializerThread {
    stop: Arc<StopFlag>,
    thread: Option<JoinHandle<()>>,
}

impl MaterializerThread {
    pub fn start(materializer: Arc<Materializer>) -> anyhow::Result<MaterializerThread> {
        let stop = Arc::new(StopFlag::default());
        let stop2 = Arc::clone(&stop);
        let share = materializer.settings.cpu_share;
        let thread = std::thread::Builder::new()
            .name("materializer".into())
            .spawn(move || {
                let mut summary = Summary::default();
                loop {
                    let taken = materializer.run_once(&stop2, &mut summary);
                    summary.log_if_due();
                    if stop2.is_set() || (taken == 0 && stop2.sleep(IDLE_POLL)) {
                        return;
                    }
                }
            })
            .context("start the materializer thread")?;
        tracing::info!("materializer started: hot keys are folded into images, with at most {:.0}% of a core", share * 100.0);
        Ok(MaterializerThread { stop, thread: Some(thread) })
    }

    pub fn stop(mut self) {
        self.stop.set();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for MaterializerThread {
    fn drop(&mut self) {
        self.stop.set();
    }
}

#[cfg(test)]
mod tests;
