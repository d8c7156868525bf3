//! Prometheus metrics of one safekeeper process, in a registry of its own (so in-process
//! tests can run several safekeepers). Rendered by `GET /metrics`.

use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

pub struct Metrics {
    pub registry: Registry,
    /// Per timeline: the durable end of WAL.
    pub flush_lsn: IntGaugeVec,
    /// Per timeline: the commit LSN as this safekeeper knows it.
    pub commit_lsn: IntGaugeVec,
    /// Per timeline: `Append` messages that carried new WAL.
    pub appends: IntCounterVec,
    /// Per timeline: WAL bytes written.
    pub wal_bytes_written: IntCounterVec,
    /// Per timeline: WAL segment files removed.
    pub wal_segments_removed: IntCounterVec,
    /// Per timeline: bytes of WAL segment files on disk.
    pub wal_disk_bytes: IntGaugeVec,
    /// Per timeline: WAL below this may be removed (the lowest of the three below and the
    /// commit LSN, as the control file has them).
    pub wal_removal_horizon_lsn: IntGaugeVec,
    /// Per timeline: the pageserver's remote-consistent LSN as heard.
    pub remote_consistent_lsn: IntGaugeVec,
    /// Per timeline: the peer horizon as received.
    pub peer_horizon_lsn: IntGaugeVec,
    pub fsyncs: IntCounter,
    pub fsync_seconds: Histogram,
    /// Batches of proposer messages handled (each read of a proposer's socket that brought
    /// whole messages: one lock of the timeline, at most one sync), and the messages in them.
    /// Messages per batch is the group commit; batches per commit what a commit costs.
    pub proposer_batches: IntCounter,
    pub proposer_messages: IntCounter,
    /// Connections accepted, by kind (`proposer`, `replication`).
    pub connections: IntCounterVec,
    /// Open proposer connections.
    pub proposer_connections_open: IntGauge,
    /// Requests refused for their token (any protocol), by `auth::AuthError::reason`; every
    /// reason is present from the start, at 0.
    pub auth_failures: IntCounterVec,
    /// Per timeline: WAL found corrupt while serving it (a record whose CRC or header does
    /// not check, a bad page header), never sent, logged at error level: to a replication
    /// client, where each ended a stream with `FATAL` XX001, or to a proposer fetching WAL
    /// for a lagging safekeeper (`FetchWal`), left unanswered.
    pub wal_corruption: IntCounterVec,
    /// Remote-consistent LSNs ignored, by reason: `not_storage` (a client that is not the
    /// pageserver), `superseded` (an older attachment generation than the newest heard).
    pub remote_consistent_lsn_ignored: IntCounterVec,
    /// Connections to the `--listen` port that did not get through the TLS handshake, by
    /// reason (`plaintext`: no `SSLRequest`; `handshake`: the handshake failed, e.g. the
    /// client does not trust the certificate; `timeout`); every reason present from the
    /// start, at 0.
    pub tls_handshake_failures: IntCounterVec,
    /// `safekeeper_http_tls_failures_total`: HTTP API connections refused for TLS, by
    /// reason (`plaintext`: a plaintext request, answered 400; `handshake`; `timeout`).
    pub http_tls_failures: IntCounterVec,
}

/// The reasons of `safekeeper_tls_handshake_failures_total`.
pub const TLS_FAILURE_REASONS: [&str; 3] = ["plaintext", "handshake", "timeout"];

impl Metrics {
    pub fn new() -> anyhow::Result<Metrics> {
        let registry = Registry::new();
        let tl = &["tenant_id", "timeline_id"];
        let flush_lsn = IntGaugeVec::new(Opts::new("safekeeper_flush_lsn", "durable end of WAL (as a byte position)"), tl)?;
        let commit_lsn = IntGaugeVec::new(Opts::new("safekeeper_commit_lsn", "commit LSN known to this safekeeper"), tl)?;
        let appends = IntCounterVec::new(Opts::new("safekeeper_appends_total", "appends that carried new WAL"), tl)?;
        let wal_bytes_written = IntCounterVec::new(Opts::new("safekeeper_wal_bytes_written_total", "WAL bytes written"), tl)?;
        let wal_segments_removed = IntCounterVec::new(
            Opts::new("safekeeper_wal_segments_removed_total", "WAL segment files removed below the removal horizon"),
            tl,
        )?;
        let wal_disk_bytes = IntGaugeVec::new(Opts::new("safekeeper_wal_disk_bytes", "bytes of WAL segment files on disk"), tl)?;
        let wal_removal_horizon_lsn = IntGaugeVec::new(
            Opts::new(
                "safekeeper_wal_removal_horizon_lsn",
                "WAL below this may be removed: min of the durable remote-consistent LSN, peer horizon and commit LSN",
            ),
            tl,
        )?;
        let remote_consistent_lsn = IntGaugeVec::new(
            Opts::new(
                "safekeeper_remote_consistent_lsn",
                "the pageserver's remote-consistent LSN as heard (of the newest attachment generation)",
            ),
            tl,
        )?;
        let peer_horizon_lsn =
            IntGaugeVec::new(Opts::new("safekeeper_peer_horizon_lsn", "the peer horizon: WAL below it is on every safekeeper"), tl)?;
        let fsyncs = IntCounter::new("safekeeper_fsyncs_total", "fsync and fdatasync calls")?;
        let fsync_seconds = Histogram::with_opts(
            HistogramOpts::new("safekeeper_fsync_seconds", "time spent in fsync per batch")
                .buckets(vec![0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0]),
        )?;
        let proposer_batches =
            IntCounter::new("safekeeper_proposer_batches_total", "batches of proposer messages handled (one sync at most each)")?;
        let proposer_messages = IntCounter::new("safekeeper_proposer_messages_total", "proposer messages handled")?;
        let connections = IntCounterVec::new(Opts::new("safekeeper_connections_total", "connections accepted"), &["kind"])?;
        let proposer_connections_open = IntGauge::new("safekeeper_proposer_connections_open", "open proposer connections")?;
        let auth_failures = IntCounterVec::new(
            Opts::new("safekeeper_auth_failures_total", "proposers, replication clients and HTTP requests refused for their token"),
            &["reason"],
        )?;
        let wal_corruption = IntCounterVec::new(
            Opts::new(
                "safekeeper_wal_corruption_total",
                "WAL found corrupt while serving it to a replication client or a proposer's FetchWal (never sent)",
            ),
            tl,
        )?;
        for reason in auth::AuthError::REASONS {
            auth_failures.with_label_values(&[reason]);
        }
        let remote_consistent_lsn_ignored = IntCounterVec::new(
            Opts::new(
                "safekeeper_remote_consistent_lsn_ignored_total",
                "remote-consistent LSNs ignored: from a client that is not the pageserver, or from a superseded attachment generation",
            ),
            &["reason"],
        )?;
        for reason in ["not_storage", "superseded"] {
            remote_consistent_lsn_ignored.with_label_values(&[reason]);
        }
        let tls_handshake_failures = IntCounterVec::new(
            Opts::new("safekeeper_tls_handshake_failures_total", "connections refused before or during the TLS handshake"),
            &["reason"],
        )?;
        for reason in TLS_FAILURE_REASONS {
            tls_handshake_failures.with_label_values(&[reason]);
        }
        let http_tls_failures = IntCounterVec::new(
            Opts::new("safekeeper_http_tls_failures_total", "HTTP API connections refused before or during the TLS handshake"),
            &["reason"],
        )?;
        for reason in TLS_FAILURE_REASONS {
            http_tls_failures.with_label_values(&[reason]);
        }
        registry.register(Box::new(flush_lsn.clone()))?;
        registry.register(Box::new(commit_lsn.clone()))?;
        registry.register(Box::new(appends.clone()))?;
        registry.register(Box::new(wal_bytes_written.clone()))?;
        registry.register(Box::new(wal_segments_removed.clone()))?;
        registry.register(Box::new(wal_disk_bytes.clone()))?;
        registry.register(Box::new(wal_removal_horizon_lsn.clone()))?;
        registry.register(Box::new(remote_consistent_lsn.clone()))?;
        registry.register(Box::new(peer_horizon_lsn.clone()))?;
        registry.register(Box::new(fsyncs.clone()))?;
        registry.register(Box::new(fsync_seconds.clone()))?;
        registry.register(Box::new(proposer_batches.clone()))?;
        registry.register(Box::new(proposer_messages.clone()))?;
        registry.register(Box::new(connections.clone()))?;
        registry.register(Box::new(proposer_connections_open.clone()))?;
        registry.register(Box::new(auth_failures.clone()))?;
        registry.register(Box::new(wal_corruption.clone()))?;
        registry.register(Box::new(remote_consistent_lsn_ignored.clone()))?;
        registry.register(Box::new(tls_handshake_failures.clone()))?;
        registry.register(Box::new(http_tls_failures.clone()))?;
        Ok(Metrics {
            registry,
            flush_lsn,
            commit_lsn,
            appends,
            wal_bytes_written,
            wal_segments_removed,
            wal_disk_bytes,
            wal_removal_horizon_lsn,
            remote_consistent_lsn,
            peer_horizon_lsn,
            fsyncs,
            fsync_seconds,
            proposer_batches,
            proposer_messages,
            connections,
            proposer_connections_open,
            auth_failures,
            wal_corruption,
            remote_consistent_lsn_ignored,
            tls_handshake_failures,
            http_tls_failures,
        })
    }

    /// The text exposition format.
    pub fn render(&self) -> anyhow::Result<String> {
        use prometheus::Encoder;
        let mut buf = Vec::new();
        prometheus::TextEncoder::new().encode(&self.registry.gather(), &mut buf)?;
        Ok(String::from_utf8(buf)?)
    }
}
