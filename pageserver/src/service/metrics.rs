//! The pageserver's counters and histograms that live for the life of the process: what
//! the background jobs did, and what page reads cost (read amplification). `/metrics`
//! (`server::http`) renders them together with the gauges it reads off the timelines at
//! scrape time.
//!
//! | name | labels | what |
//! |---|---|---|
//! | `pageserver_background_job_runs_total` | `job` | runs, whether triggered by the scheduler or the API |
//! | `pageserver_background_job_failures_total` | `job` | runs that failed |
//! | `pageserver_background_job_duration_seconds` | `job` | histogram of run times |
//! | `pageserver_background_job_bytes_written_total` | `job` | bytes of layer files written |
//! | `pageserver_background_job_bytes_removed_total` | `job` | bytes of layer files removed |
//! | `pageserver_background_job_layers_created_total` | `job` | layer files written |
//! | `pageserver_background_job_layers_removed_total` | `job` | layer files removed |
//! | `pageserver_getpage_layers_visited` | | histogram: layers one GetPage searched |
//! | `pageserver_getpage_records_replayed` | | histogram: records one GetPage replayed |
//! | `pageserver_getpage_seconds` | | histogram: time to serve one GetPage, waiting for WAL included (buckets from 25 µs) |
//! | `pageserver_fold_images_total` | `trigger` | records replaced by an image of their page (`service::materializer`): `chain` by the materializer thread, `read` by a GetPage's writeback |
//! | `pageserver_fold_skipped_total` | `reason` | keys or reads not folded: `short`, `read_error`, `redo_error`, `write_error`, or the engine's refusal (`not_in_memory`, `no_such_version`, `already_image`, `unpublished`, `below_gc_cutoff`) |
//! | `pageserver_fold_seconds` | | histogram: time the materializer took for one fold (read, redo, replace) |
//!
//! | `pageserver_auth_failures_total` | `service`, `reason` | requests refused for their token (`page_service` or `http`; `reason` as `auth::AuthError::reason`) |
//! | `pageserver_tls_handshake_failures_total` | `service`, `reason` | connections refused for TLS (`page_service`, `http`; `reason`: `plaintext`, `closed`, `timeout`, `handshake`, `io`, as `page_service::tls_failure_reason`) |
//!
//! `job` is `compaction` (L0 into L1), `image_creation` or `gc`.

use std::time::Duration;

use prometheus::proto::MetricFamily;
use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

use crate::pgdata::datadir::ReadCost;
use crate::service::page_service::ReadObserver;

/// The kinds of background job, the `job` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobKind {
    Compaction,
    ImageCreation,
    Gc,
}

impl JobKind {
    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::Compaction => "compaction",
            JobKind::ImageCreation => "image_creation",
            JobKind::Gc => "gc",
        }
    }
}

/// What made a fold, the `trigger` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FoldTrigger {
    /// The materializer thread, from the engine's queue of long chains.
    Chain,
    /// A GetPage that replayed many records wrote its page back.
    Read,
}

impl FoldTrigger {
    pub fn as_str(self) -> &'static str {
        match self {
            FoldTrigger::Chain => "chain",
            FoldTrigger::Read => "read",
        }
    }
}

/// Every reason a fold is skipped (the `reason` label), created at start so that a rise
/// from 0 shows.
pub const FOLD_SKIP_REASONS: [&str; 9] = [
    "short",
    "read_error",
    "redo_error",
    "write_error",
    "not_in_memory",
    "no_such_version",
    "already_image",
    "unpublished",
    "below_gc_cutoff",
];

/// What one job run did, for the counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JobStats {
    pub bytes_written: u64,
    pub bytes_removed: u64,
    pub layers_created: u64,
    pub layers_removed: u64,
}

pub struct Metrics {
    registry: Registry,
    job_runs: IntCounterVec,
    job_failures: IntCounterVec,
    job_duration: HistogramVec,
    job_bytes_written: IntCounterVec,
    job_bytes_removed: IntCounterVec,
    job_layers_created: IntCounterVec,
    job_layers_removed: IntCounterVec,
    getpage_layers_visited: Histogram,
    getpage_records_replayed: Histogram,
    getpage_seconds: Histogram,
    auth_failures: IntCounterVec,
    tls_failures: IntCounterVec,
    fold_images: IntCounterVec,
    fold_skipped: IntCounterVec,
    fold_seconds: Histogram,
}

/// Buckets for counts that span from 0 to hundreds of thousands.
const COUNT_BUCKETS: [f64; 19] = [0.0, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 1e6];
/// Fine enough to tell a page from memory (tens of µs) from one that needed WAL redo or a
/// download (milliseconds and up).
const GETPAGE_BUCKETS: [f64; 18] =
    [0.000025, 0.00005, 0.0001, 0.0002, 0.0003, 0.0005, 0.00075, 0.001, 0.002, 0.003, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0, 10.0];
const DURATION_BUCKETS: [f64; 12] = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0];

impl Metrics {
    pub fn new() -> Metrics {
        // The names and buckets are constants: registering them cannot fail.
        let registry = Registry::new();
        let counter = |name: &str, help: &str| {
            let c = IntCounterVec::new(Opts::new(name, help), &["job"]).expect("a valid counter");
            registry.register(Box::new(c.clone())).expect("a metric registered once");
            c
        };
        let histogram = |name: &str, help: &str, buckets: &[f64]| {
            let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec())).expect("a valid histogram");
            registry.register(Box::new(h.clone())).expect("a metric registered once");
            h
        };
        let job_duration = HistogramVec::new(
            HistogramOpts::new("pageserver_background_job_duration_seconds", "Time taken by background job runs")
                .buckets(DURATION_BUCKETS.to_vec()),
            &["job"],
        )
        .expect("a valid histogram");
        registry.register(Box::new(job_duration.clone())).expect("a metric registered once");
        let auth_failures =
            IntCounterVec::new(Opts::new("pageserver_auth_failures_total", "Requests refused for their token"), &["service", "reason"])
                .expect("a valid counter");
        registry.register(Box::new(auth_failures.clone())).expect("a metric registered once");
        // Every series from the start, so that a rise from 0 shows.
        for service in ["page_service", "http"] {
            for reason in auth::AuthError::REASONS {
                auth_failures.with_label_values(&[service, reason]);
            }
        }
        let tls_failures = IntCounterVec::new(
            Opts::new("pageserver_tls_handshake_failures_total", "Connections refused for TLS: no TLS, or a handshake that failed"),
            &["service", "reason"],
        )
        .expect("a valid counter");
        registry.register(Box::new(tls_failures.clone())).expect("a metric registered once");
        for reason in crate::service::page_service::TLS_FAILURE_REASONS {
            tls_failures.with_label_values(&["page_service", reason]);
        }
        let labelled = |name: &str, help: &str, label: &str, values: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), &[label]).expect("a valid counter");
            registry.register(Box::new(c.clone())).expect("a metric registered once");
            for v in values {
                c.with_label_values(&[v]);
            }
            c
        };
        let fold_images = labelled(
            "pageserver_fold_images_total",
            "Records replaced by an image of their page, by what triggered the fold",
            "trigger",
            &[FoldTrigger::Chain.as_str(), FoldTrigger::Read.as_str()],
        );
        let fold_skipped = labelled("pageserver_fold_skipped_total", "Keys or reads not folded, by reason", "reason", &FOLD_SKIP_REASONS);
        Metrics {
            auth_failures,
            tls_failures,
            fold_images,
            fold_skipped,
            fold_seconds: histogram(
                "pageserver_fold_seconds",
                "Time the materializer took for one fold: read, WAL redo, replace",
                &GETPAGE_BUCKETS,
            ),
            job_runs: counter("pageserver_background_job_runs_total", "Background job runs"),
            job_failures: counter("pageserver_background_job_failures_total", "Background job runs that failed"),
            job_duration,
            job_bytes_written: counter("pageserver_background_job_bytes_written_total", "Bytes of layer files background jobs wrote"),
            job_bytes_removed: counter("pageserver_background_job_bytes_removed_total", "Bytes of layer files background jobs removed"),
            job_layers_created: counter("pageserver_background_job_layers_created_total", "Layer files background jobs wrote"),
            job_layers_removed: counter("pageserver_background_job_layers_removed_total", "Layer files background jobs removed"),
            getpage_layers_visited: histogram(
                "pageserver_getpage_layers_visited",
                "Layers (in-memory and files, across ancestors) one GetPage request searched",
                &COUNT_BUCKETS,
            ),
            getpage_records_replayed: histogram(
                "pageserver_getpage_records_replayed",
                "Records one GetPage request replayed on top of the newest image",
                &COUNT_BUCKETS,
            ),
            getpage_seconds: histogram(
                "pageserver_getpage_seconds",
                "Time to serve one GetPage request, from the decoded request to the page, waiting for WAL included",
                &GETPAGE_BUCKETS,
            ),
            registry,
        }
    }

    /// Counts one run of `kind`: its duration, and what it did or that it failed.
    pub fn job_finished(&self, kind: JobKind, took: Duration, outcome: Result<JobStats, ()>) {
        let job = [kind.as_str()];
        self.job_runs.with_label_values(&job).inc();
        self.job_duration.with_label_values(&job).observe(took.as_secs_f64());
        match outcome {
            Ok(stats) => {
                self.job_bytes_written.with_label_values(&job).inc_by(stats.bytes_written);
                self.job_bytes_removed.with_label_values(&job).inc_by(stats.bytes_removed);
                self.job_layers_created.with_label_values(&job).inc_by(stats.layers_created);
                self.job_layers_removed.with_label_values(&job).inc_by(stats.layers_removed);
            }
            Err(()) => self.job_failures.with_label_values(&job).inc(),
        }
    }

    /// Counts a request refused for its token.
    pub fn auth_refused(&self, service: &'static str, reason: &'static str) {
        self.auth_failures.with_label_values(&[service, reason]).inc();
    }

    /// Counts a connection refused for TLS (`reason` as `page_service::tls_failure_reason`).
    pub fn tls_refused(&self, service: &'static str, reason: &'static str) {
        self.tls_failures.with_label_values(&[service, reason]).inc();
    }

    /// Counts one fold; `took` is observed for the materializer's own folds.
    pub fn fold_done(&self, trigger: FoldTrigger, took: Duration) {
        self.fold_images.with_label_values(&[trigger.as_str()]).inc();
        if trigger == FoldTrigger::Chain {
            self.fold_seconds.observe(took.as_secs_f64());
        }
    }

    /// Counts a key or read not folded, with the reason.
    pub fn fold_skipped(&self, reason: &'static str) {
        self.fold_skipped.with_label_values(&[reason]).inc();
    }

    pub fn gather(&self) -> Vec<MetricFamily> {
        self.registry.gather()
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

impl ReadObserver for Metrics {
    fn page_read(&self, cost: ReadCost, took: Duration) {
        self.getpage_layers_visited.observe(cost.layers_visited as f64);
        self.getpage_records_replayed.observe(cost.records_replayed as f64);
        self.getpage_seconds.observe(took.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::Encoder;

    #[test]
    fn every_job_kind_and_read_shows_up() {
        let m = Metrics::new();
        m.job_finished(
            JobKind::Compaction,
            Duration::from_millis(20),
            Ok(JobStats { bytes_written: 100, layers_created: 2, ..JobStats::default() }),
        );
        m.job_finished(JobKind::Gc, Duration::from_millis(1), Err(()));
        m.fold_done(FoldTrigger::Read, Duration::ZERO);
        m.fold_skipped("short");
        m.page_read(ReadCost { layers_visited: 3, records_replayed: 7, ..ReadCost::default() }, Duration::from_micros(150));
        let mut out = Vec::new();
        prometheus::TextEncoder::new().encode(&m.gather(), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        for line in [
            "pageserver_background_job_runs_total{job=\"compaction\"} 1",
            "pageserver_background_job_failures_total{job=\"gc\"} 1",
            "pageserver_background_job_bytes_written_total{job=\"compaction\"} 100",
            "pageserver_background_job_layers_created_total{job=\"compaction\"} 2",
            "pageserver_background_job_duration_seconds_count{job=\"compaction\"} 1",
            "pageserver_getpage_layers_visited_sum 3",
            "pageserver_getpage_records_replayed_sum 7",
            "pageserver_getpage_records_replayed_bucket{le=\"5\"} 0",
            "pageserver_getpage_records_replayed_bucket{le=\"10\"} 1",
            "pageserver_getpage_seconds_bucket{le=\"0.0001\"} 0",
            "pageserver_getpage_seconds_bucket{le=\"0.0002\"} 1",
            "pageserver_fold_images_total{trigger=\"read\"} 1",
            "pageserver_fold_images_total{trigger=\"chain\"} 0",
            "pageserver_fold_skipped_total{reason=\"short\"} 1",
            "pageserver_fold_skipped_total{reason=\"not_in_memory\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from:\n{text}");
        }
    }
}
