//! The WAL receiver: follows a timeline's WAL over the physical replication protocol from
//! one of a list of sources, makes it durable in the timeline's local WAL (`localwal.rs`)
//! and ingests it.
//!
//! It speaks the client side of streaming replication (`conn.rs`): a replication
//! connection (`application_name=fjord_pageserver`, the name to put in
//! `synchronous_standby_names`; `database=<tenant id>/<timeline id>`, which selects the
//! timeline on a safekeeper and which a compute's walsender ignores), `IDENTIFY_SYSTEM`,
//! `START_REPLICATION PHYSICAL <lsn> TIMELINE <tli>`, then `XLogData` messages in and
//! standby status updates out, so the server counts the pageserver as a standby and a
//! safekeeper learns how far the pageserver got. The sources (`sources.rs`) are the
//! timeline's safekeepers, which serve only committed WAL, or a compute's walsender.
//!
//! **Sources and failover.** The receiver streams from one source at a time. When a
//! session with it fails (cannot connect, refused, stream error), the next session goes to
//! the next source in the list, round robin, at once; only after a whole round of failed
//! sessions does it wait, with a backoff doubling up to `BACKOFF_MAX`. A session that
//! streamed WAL (or ran for `HEALTHY_SESSION_AFTER`) resets the round and the backoff.
//! While streaming, if no WAL came from the current source for `LAG_PROBE_AFTER`, it
//! probes every other source at once (a short connection doing only `IDENTIFY_SYSTEM`,
//! whose `xlogpos` is that source's WAL end, at most `PROBE_TIMEOUT`), at most once per
//! `LAG_PROBE_AFTER`; if one has WAL beyond what was received, the session ends and the
//! next one goes to the source with the most WAL. That is how a safekeeper that fell
//! behind (or that is partitioned from the compute but still answers) is left. A source
//! switch is logged at info, a failure at warn when it differs from that source's previous
//! one (the same failure repeating each round is logged at debug). These decisions are made
//! by `failover.rs`, a state machine with no I/O that this file feeds with what happened
//! and when; here are only the connections, the probes' threads, the waits and the logs.
//!
//! **Durability and the fsync discipline.** Each turn of the loop waits (at most
//! `READ_TIMEOUT`) for a message, then drains every message already readable from the
//! socket without waiting (up to `BATCH_BYTES_MAX` of WAL), writing each `XLogData`
//! payload into the local WAL segment files as it comes. From a compute's walsender (the
//! pageserver as a synchronous standby), once per batch: one fsync of the segment files
//! written (and of the `wal/` directory if a segment was created), then at once a status
//! update with write = flush = the durable end and apply = the last record LSN (ingested).
//! Only then is the batch decoded and ingested, so a synchronous commit waits for the
//! network and one fsync, not for ingest or a layer flush. From a safekeeper, whose WAL a
//! quorum of safekeepers already holds and keeps until it is in object storage (the
//! remote-consistent LSN below), no commit waits for the pageserver: the fsync and the
//! status update come once per `STATUS_INTERVAL` instead of once per batch, which spares
//! every small OLTP commit an fsync on the pageserver and a status message relayed through
//! the safekeepers to the compute. WAL lost from the local WAL in a machine crash is
//! received again: a restart streams from the last record ingested into layer files. A
//! keepalive that asks for a reply gets one after the batch (after its fsync from a
//! walsender). A batch of at least
//! `APPLY_STATUS_BYTES` gets a second status update once it is ingested, so that the
//! compute's backpressure (`fjord.max_pageserver_lag_time` and `fjord.max_pageserver_lag`,
//! which compare against the apply position) sees a bulk load's progress as it happens, not up to `STATUS_INTERVAL` late;
//! the small batches of OLTP traffic do not pay for a second message. Status updates also
//! go out every `STATUS_INTERVAL`.
//!
//! **Start and restart.** Each streaming session (the first, after a reconnect or a switch
//! to another source, and after a pageserver restart, whose timeline stands at its
//! disk-consistent LSN) first ingests the local WAL from the timeline's last record LSN to
//! its end (the first incomplete record), fsyncs the local segments (a process that died
//! may not have), and then starts replication at the timeline's last record LSN, with a
//! new decoder there. That is the start of the first record not complete locally, at or
//! below the durable end the server was told: the bytes between are received again and
//! rewritten identically, which is why no durable-end marker is kept (it would cost a
//! second fsync per batch). Every source serves the same WAL (a safekeeper only WAL that a
//! quorum holds), so the bytes received again from another source are the same bytes.
//!
//! Layer flushes happen by size and age (`maybe_freeze_and_flush`, also after each
//! ingested record) and when WAL pauses (`IDLE_FLUSH_AFTER`); whenever the disk-consistent
//! LSN has moved, local segments wholly below it are deleted.
//!
//! **The remote-consistent LSN.** The safekeepers remove WAL below it (and below what every
//! safekeeper has), and they take it only from the pageserver, with the attachment
//! generation it belongs to (`Timeline::remote_position`: WAL below the LSN is in layers in
//! remote storage, as the attachment of that generation confirmed, or without remote
//! storage in local layer files, generation 0); they honour only the newest generation's.
//! What they are told is capped at where a replica's basebackup starts now, the newest
//! running-transactions record ([`retention_position`]): a replica streams its WAL from
//! there, and the record comes only every 15 s while the remote-consistent LSN moves on.
//! So the receiver tells every safekeeper of the list itself, not only the one it streams
//! from (a WAL proposer cannot relay it: it holds only a tenant token):
//! - to the safekeeper it streams from (one that reported `fjord.safekeeper` at startup,
//!   see `conn.rs`), each status update is followed by fjord's own CopyData message (`P`,
//!   the generation as a big-endian `u32` and the LSN as a big-endian `u64`; to a version 1
//!   safekeeper the LSN alone) whenever the position changed since the session last sent
//!   it, the first time at the session's first status update;
//! - a reporter thread tells every source, about once a second when the position changed
//!   since it last told that source, over a short connection (`FJORD_REMOTE_CONSISTENT_LSN
//!   <generation> X/X`, `conn::report_position`); a source that is down is told when it is
//!   back, one that is not a safekeeper of version 2 or later is skipped.
//!
//! A compute's walsender is never sent either: it would end the connection on them.
//!
//! **Authentication.** A source that asks for a cleartext password (a safekeeper started
//! with `--auth-public-key`) is given the token registered with the sources (a storage
//! token narrowed to the timeline), and nothing else: never a token of the process, which
//! would reach whatever source an admin registered without one (a compute's walsender, a
//! server its superuser controls). Without one the session fails with "the safekeeper
//! requires a token: ...", and the receiver goes on trying (the status says why). MD5 and
//! SCRAM are refused with a clear error (`conn.rs`).
//!
//! **WAL that does not decode.** A record that fails to decode (its CRC, a malformed header
//! or block reference) ends the session like a connection failure, and the next one goes to
//! the next source: one safekeeper's damaged copy must not stop ingest while the others
//! have good WAL. The damaged bytes are already in the local WAL, but the next session's
//! replay of it stops at the first record that does not decode (as PostgreSQL's recovery
//! does at the end of WAL), so streaming resumes at the last good record and the next
//! source's bytes overwrite them. If every source sends WAL that does not decode, the
//! receiver keeps trying them with its backoff, and its status says why.
//!
//! Invariants:
//! - WAL confirmed as flushed is in fsynced local segment files or in layer files.
//! - Streaming always resumes at the timeline's last record LSN, a record boundary, so
//!   nothing is ingested twice or skipped across reconnects, source switches and restarts.
//! - A connection failure, or WAL that does not decode, moves to the next source; an
//!   ingest or local WAL error stops the receiver (going past it would corrupt the
//!   timeline or lie about durability), and its status says why.

mod conn;
mod failover;
mod sources;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{anyhow, Context};
use bytes::BytesMut;
use pgwal::{DecoderConfig, WalStreamDecoder};
use postgres_protocol::message::{backend, frontend};
use proto::Lsn;

use crate::pgdata::walingest::WalIngest;
use crate::service::ingest_gate::IngestGate;
use crate::service::localwal::{LocalWal, LOCAL_WAL_TLI};
use conn::{connect, error_text, probe, report_position, Conn, Credentials, Msg, REMOTE_CONSISTENT_LSN_TAG};
use failover::{Failover, LogLevel, Retry, Switch};
use layerstore::timeline::Timeline;
use layerstore::value::Reconstructor;
pub use sources::{WalSource, WalSources, SOURCES_MAX};

/// The `application_name` the receiver connects with: what a server names in
/// `synchronous_standby_names` to wait for the pageserver.
pub const APPLICATION_NAME: &str = "fjord_pageserver";

/// The receiver's status is a type of the management API, which `GET .../timeline`
/// returns as it is.
pub use pageserver_api::models::{WalReceiverState, WalReceiverStatus, WalSourceStatus as SourceStatus};

pub struct WalReceiver {
    sources: WalSources,
    stop: Arc<AtomicBool>,
    status: Arc<Mutex<WalReceiverStatus>>,
    thread: Option<JoinHandle<()>>,
    /// Tells every source the timeline's remote-consistent LSN (see the module
    /// documentation).
    reporter: Option<JoinHandle<()>>,
}

// The failover policy's own timings (`BACKOFF_MIN`, `BACKOFF_MAX`, `HEALTHY_SESSION_AFTER`,
// `LAG_PROBE_AFTER`) are in `failover.rs`.
const STATUS_INTERVAL: Duration = Duration::from_millis(100);
/// Connecting, authenticating and `IDENTIFY_SYSTEM` of a streaming session.
const SESSION_START_TIMEOUT: Duration = Duration::from_secs(10);
/// A lag probe's connection and `IDENTIFY_SYSTEM`, together. Probes run in parallel, so
/// this is also the longest a probe holds up the stream.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// When no WAL arrived for this long and some is not yet in layer files, flush it (which
/// lets the local WAL shrink).
const IDLE_FLUSH_AFTER: Duration = Duration::from_millis(500);
/// At most this much WAL is drained from the socket per fsync.
const BATCH_BYTES_MAX: usize = 4 * 1024 * 1024;
/// A batch at least this large is followed by a status update once it is ingested.
const APPLY_STATUS_BYTES: usize = 256 * 1024;
/// How long a read waits before the loop checks for a stop request and sends feedback.
const READ_TIMEOUT: Duration = Duration::from_millis(20);
/// How often the reporter looks whether the remote-consistent LSN changed.
const REPORT_INTERVAL: Duration = Duration::from_secs(1);
/// A report's connection and command, together.
const REPORT_TIMEOUT: Duration = Duration::from_secs(2);

impl WalReceiver {
    /// Starts following `sources` into `timeline`, holding `gate` from confirming each batch
    /// of WAL until it is ingested. A source that asks for a password gets the token
    /// registered with the sources, if any.
    pub fn start(
        timeline: Arc<Timeline>,
        gate: Arc<IngestGate>,
        reconstructor: Arc<dyn Reconstructor>,
        sources: WalSources,
    ) -> WalReceiver {
        Self::start_with_tls(timeline, gate, reconstructor, sources, None)
    }

    /// [`WalReceiver::start`] over TLS with `tls` (the cluster CA), or cleartext with `None`.
    pub fn start_with_tls(
        timeline: Arc<Timeline>,
        gate: Arc<IngestGate>,
        reconstructor: Arc<dyn Reconstructor>,
        sources: WalSources,
        tls: Option<tls::ClientTls>,
    ) -> WalReceiver {
        let token = sources.token().map(str::to_string);
        Self::start_with_token(timeline, gate, reconstructor, sources, token, tls)
    }

    /// [`WalReceiver::start_with_tls`] with the token given rather than the sources' own.
    pub fn start_with_token(
        timeline: Arc<Timeline>,
        gate: Arc<IngestGate>,
        reconstructor: Arc<dyn Reconstructor>,
        sources: WalSources,
        auth_token: Option<String>,
        tls: Option<tls::ClientTls>,
    ) -> WalReceiver {
        let stop = Arc::new(AtomicBool::new(false));
        let status = Arc::new(Mutex::new(WalReceiverStatus {
            state: WalReceiverState::Starting,
            sources: sources
                .as_slice()
                .iter()
                .map(|s| SourceStatus { host: s.host.clone(), port: s.port, user: s.user.clone(), ..Default::default() })
                .collect(),
            ..Default::default()
        }));
        let standby_start = Arc::new(AtomicU64::new(0));
        let (stop2, sources2, token2, timeline2, tls2, start2) =
            (Arc::clone(&stop), sources.clone(), auth_token.clone(), Arc::clone(&timeline), tls.clone(), Arc::clone(&standby_start));
        let reporter = std::thread::Builder::new()
            .name("walreceiver-report".into())
            .spawn(move || report_positions(timeline2, sources2, token2, tls2, stop2, start2))
            .expect("spawn the wal receiver's reporter thread");
        let (stop2, status2, sources2) = (Arc::clone(&stop), Arc::clone(&status), sources.clone());
        let thread = std::thread::Builder::new()
            .name("walreceiver".into())
            .spawn(move || run(timeline, gate, reconstructor, sources2, (auth_token, tls), (stop2, status2), standby_start))
            .expect("spawn the wal receiver thread");
        WalReceiver { sources, stop, status, thread: Some(thread), reporter: Some(reporter) }
    }

    /// Whether this receiver follows exactly `sources` and is streaming from one of them
    /// now: asked to follow the same list again (every compute start asks), it is kept, since
    /// a restart would only make it reconnect and the compute's basebackup wait for that. One
    /// that is between sessions (a source down, backing off) is not kept: a new receiver
    /// tries the sources at once.
    pub fn is_streaming_from(&self, sources: &WalSources) -> bool {
        self.sources == *sources
            && self.thread.as_ref().is_some_and(|t| !t.is_finished())
            && self.status.lock().unwrap_or_else(|p| p.into_inner()).state == WalReceiverState::Streaming
    }

    pub fn status(&self) -> WalReceiverStatus {
        self.status.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in [self.thread.take(), self.reporter.take()].into_iter().flatten() {
            let _ = t.join();
        }
    }
}

impl Drop for WalReceiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// The reporter thread: tells every source the timeline's remote-consistent LSN and its
/// attachment generation when they changed since that source was last told.
/// What the safekeepers are told they may remove WAL below, with the attachment generation:
/// the remote-consistent LSN, but never past where a replica's basebackup starts now (the
/// newest running-transactions record, `standby_start`; 0 if none is known), since the
/// replica streams its WAL from there. Without this, a replica started while the primary
/// writes could find that WAL gone ("requested WAL ... is not available"): the record is
/// logged every 15 s, the remote-consistent LSN can move segments past it meanwhile.
fn retention_position(timeline: &Timeline, standby_start: &AtomicU64) -> (u32, Lsn) {
    let (generation, remote_consistent) = timeline.remote_position();
    let start = Lsn(standby_start.load(Ordering::Acquire));
    (generation, if start.is_valid() { remote_consistent.min(start) } else { remote_consistent })
}

fn report_positions(
    timeline: Arc<Timeline>,
    sources: WalSources,
    auth_token: Option<String>,
    tls: Option<tls::ClientTls>,
    stop: Arc<AtomicBool>,
    standby_start: Arc<AtomicU64>,
) {
    let span = tracing::info_span!("walreceiver", tenant_id = %timeline.tenant_id(), timeline_id = %timeline.timeline_id());
    let _entered = span.enter();
    let database = format!("{}/{}", timeline.tenant_id(), timeline.timeline_id());
    // What each source was last told (`None`: nothing yet), and the sources that do not
    // take it (a compute's walsender, an older safekeeper), which are not asked again.
    let mut told: Vec<Option<(u32, Lsn)>> = vec![None; sources.len()];
    let mut skip = vec![false; sources.len()];
    while !stop.load(Ordering::SeqCst) {
        let position = retention_position(&timeline, &standby_start);
        if position.1.is_valid() {
            for (i, source) in sources.as_slice().iter().enumerate() {
                if skip[i] || told[i] == Some(position) || stop.load(Ordering::SeqCst) {
                    continue;
                }
                let credentials = Credentials { token: auth_token.as_deref(), tls: tls.as_ref() };
                match report_position(source, &database, credentials, position, REPORT_TIMEOUT) {
                    Ok(true) => {
                        tracing::debug!("told {source} the remote-consistent LSN {} of generation {}", position.1, position.0);
                        told[i] = Some(position);
                    }
                    Ok(false) => skip[i] = true,
                    // Routine while a source is down; the streaming sessions log failures.
                    Err(e) => tracing::debug!("could not tell {source} the remote-consistent LSN: {e:#}"),
                }
            }
        }
        let until = Instant::now() + REPORT_INTERVAL;
        while Instant::now() < until && !stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn set_status(status: &Mutex<WalReceiverStatus>, f: impl FnOnce(&mut WalReceiverStatus)) {
    f(&mut status.lock().unwrap_or_else(|p| p.into_inner()));
}

fn set_source_status(status: &Mutex<WalReceiverStatus>, index: usize, f: impl FnOnce(&mut SourceStatus)) {
    set_status(status, |s| {
        if let Some(src) = s.sources.get_mut(index) {
            f(src);
        }
    });
}

/// Why a streaming session ended.
enum Ended {
    Stopped,
    /// The connection failed, or what the source sent does not decode; try the next source.
    Connection(anyhow::Error),
    /// The source (a safekeeper) has no committed WAL past where the timeline is: not a
    /// failure (a branch before its first compute), so it is not logged above debug; the
    /// next source is asked, with the same backoff as after failures.
    NoWalYet(String),
    /// Another source has WAL the current one did not send: stream from it (`Failover`
    /// already made it the current source).
    Switch(Switch),
    /// The WAL could not be ingested; going on would corrupt the timeline.
    Fatal(anyhow::Error),
}

/// What a session needs besides the timeline's state.
struct SessionCtx<'a> {
    sources: &'a WalSources,
    current: usize,
    /// The `database` startup parameter: `<tenant id>/<timeline id>`.
    database: &'a str,
    /// What to answer a source that asks for a password.
    credentials: Credentials<'a>,
    stop: &'a AtomicBool,
    status: &'a Mutex<WalReceiverStatus>,
    gate: &'a IngestGate,
    /// Where a replica's basebackup would start now (0: not known), for what the
    /// safekeepers are told ([`retention_position`]).
    standby_start: &'a AtomicU64,
}

fn run(
    timeline: Arc<Timeline>,
    gate: Arc<IngestGate>,
    reconstructor: Arc<dyn Reconstructor>,
    sources: WalSources,
    (auth_token, tls): (Option<String>, Option<tls::ClientTls>),
    (stop, status): (Arc<AtomicBool>, Arc<Mutex<WalReceiverStatus>>),
    standby_start: Arc<AtomicU64>,
) {
    let span = tracing::info_span!("walreceiver", tenant_id = %timeline.tenant_id(), timeline_id = %timeline.timeline_id());
    let _entered = span.enter();
    let database = format!("{}/{}", timeline.tenant_id(), timeline.timeline_id());
    // Until this receiver ingests a running-transactions record, the one stored before.
    match crate::pgdata::datadir::Datadir::new(&timeline, reconstructor.as_ref()).get_last_running_xacts(timeline.last_record_lsn()) {
        Ok(Some(r)) => standby_start.store(r.record_lsn.0, Ordering::Release),
        Ok(None) => {}
        Err(e) => tracing::warn!("could not read where a replica's basebackup starts; WAL removal is not held for it until the next running-transactions record: {e:#}"),
    }
    let mut ingest = WalIngest::new(Arc::clone(&timeline), reconstructor);
    let mut wal = match LocalWal::open(timeline.path(), timeline.last_record_lsn()) {
        Ok(w) => w,
        Err(e) => {
            tracing::error!("wal receiver stopped: {e:#}");
            set_status(&status, |s| {
                s.state = WalReceiverState::Failed;
                s.last_error = Some(format!("{e:#}"));
            });
            return;
        }
    };
    let mut failover = Failover::new(sources.len());
    while !stop.load(Ordering::SeqCst) {
        let current = failover.current();
        let source = &sources.as_slice()[current];
        set_status(&status, |s| {
            s.current_source = Some(current);
            s.current_source_address = Some(source.to_string());
        });
        let credentials = Credentials { token: auth_token.as_deref(), tls: tls.as_ref() };
        let ctx = SessionCtx {
            sources: &sources,
            current,
            database: &database,
            credentials,
            stop: &stop,
            status: &status,
            gate: &gate,
            standby_start: &standby_start,
        };
        match stream(&timeline, &mut ingest, &mut wal, &ctx, &mut failover) {
            Ended::Stopped => break,
            Ended::Fatal(e) => {
                tracing::error!("wal receiver stopped: {e:#}");
                set_status(&status, |s| {
                    s.state = WalReceiverState::Failed;
                    s.connected = false;
                    s.last_error = Some(format!("{e:#}"));
                });
                return;
            }
            Ended::Switch(Switch { from, to, its_end, received_end }) => {
                let (source, target) = (&sources.as_slice()[from], &sources.as_slice()[to]);
                tracing::info!(
                    "switching WAL source from {source} to {target}: {target} has WAL up to {its_end}, {source} stopped at {received_end}"
                );
                set_status(&status, |s| {
                    s.state = WalReceiverState::Switching;
                    s.connected = false;
                    s.lag_switches += 1;
                });
            }
            Ended::NoWalYet(message) => {
                let Retry { backoff, .. } = failover.session_failed(Instant::now(), &message);
                tracing::debug!("no WAL to stream yet: {message}");
                set_status(&status, |s| {
                    s.state = WalReceiverState::Waiting;
                    s.connected = false;
                    s.last_error = None;
                });
                set_source_status(&status, current, |s| s.last_error = None);
                if let Some(b) = backoff {
                    let until = Instant::now() + b;
                    while Instant::now() < until && !stop.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            }
            Ended::Connection(e) => {
                let message = format!("{e:#}");
                let Retry { next, backoff, level } = failover.session_failed(Instant::now(), &message);
                let then = match backoff {
                    Some(b) if sources.len() == 1 => format!("retrying in {b:?}"),
                    Some(b) => format!("every source failed; trying {} in {b:?}", sources.as_slice()[next]),
                    None => format!("trying {} next", sources.as_slice()[next]),
                };
                match level {
                    LogLevel::Warn => tracing::warn!("could not stream WAL from {source}: {message}; {then}"),
                    LogLevel::Debug => tracing::debug!("could not stream WAL from {source}: {message}; {then}"),
                }
                set_status(&status, |s| {
                    s.state = WalReceiverState::Reconnecting;
                    s.connected = false;
                    s.last_error = Some(message.clone());
                });
                set_source_status(&status, current, |s| s.last_error = Some(message));
                if let Some(b) = backoff {
                    let until = Instant::now() + b;
                    while Instant::now() < until && !stop.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            }
        }
    }
    set_status(&status, |s| {
        s.state = WalReceiverState::Stopped;
        s.connected = false;
    });
}

/// Asks each of `targets` for its WAL end, all at once, records the answers in the status
/// and returns them for `Failover::probed` (`None` for a probe that failed).
fn probe_sources(ctx: &SessionCtx<'_>, targets: &[usize]) -> Vec<(usize, Option<Lsn>)> {
    let results: Vec<(usize, anyhow::Result<Lsn>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = targets
            .iter()
            .map(|&i| {
                let source = &ctx.sources.as_slice()[i];
                (i, scope.spawn(move || probe(source, ctx.database, ctx.credentials, PROBE_TIMEOUT)))
            })
            .collect();
        handles.into_iter().map(|(i, h)| (i, h.join().unwrap_or_else(|_| Err(anyhow!("the probe thread panicked"))))).collect()
    });
    results
        .into_iter()
        .map(|(i, result)| match result {
            Ok(end) => {
                set_source_status(ctx.status, i, |s| {
                    s.end_lsn = Some(end);
                    s.last_error = None;
                });
                (i, Some(end))
            }
            Err(e) => {
                // Routine while a source is down; its sessions log the failure.
                tracing::debug!("could not probe {}: {e:#}", ctx.sources.as_slice()[i]);
                set_source_status(ctx.status, i, |s| s.last_error = Some(format!("{e:#}")));
                (i, None)
            }
        })
        .collect()
}

fn now_pg_micros() -> i64 {
    // PostgreSQL's epoch is 2000-01-01.
    const PG_EPOCH_UNIX_SECONDS: u64 = 946_684_800;
    let unix = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(unix.as_micros()).unwrap_or(i64::MAX) - (PG_EPOCH_UNIX_SECONDS as i64) * 1_000_000
}

/// What a session last told the server: when it sent a status update, and (a safekeeper
/// only) the remote-consistent LSN with its attachment generation.
struct StatusSent {
    at: Instant,
    position: Option<(u32, Lsn)>,
}

/// A standby status update: written = flushed = the local WAL's durable end, applied =
/// ingested (the last record LSN). To a safekeeper (`Conn::accepts_remote_consistent_lsn`),
/// also the timeline's remote-consistent LSN and its generation when they changed from
/// what `sent` records (fjord's message: `P`, the generation and the LSN, big-endian; the
/// LSN alone to a version 1 safekeeper): WAL below it is in object storage, and the
/// safekeepers may remove it.
fn send_status(conn: &mut Conn, timeline: &Timeline, standby_start: &AtomicU64, durable: Lsn, sent: &mut StatusSent) -> anyhow::Result<()> {
    let ingested = timeline.last_record_lsn();
    let mut payload = Vec::with_capacity(34);
    payload.push(b'r');
    payload.extend_from_slice(&durable.0.to_be_bytes()); // written
    payload.extend_from_slice(&durable.0.to_be_bytes()); // flushed
    payload.extend_from_slice(&ingested.0.to_be_bytes()); // applied
    payload.extend_from_slice(&now_pg_micros().to_be_bytes());
    payload.push(0);
    let mut out = BytesMut::new();
    frontend::CopyData::new(&payload[..])?.write(&mut out);
    let position = retention_position(timeline, standby_start);
    let (generation, remote_consistent) = position;
    let changed = sent.position != Some(position) && remote_consistent.is_valid();
    if conn.accepts_remote_consistent_lsn() && changed {
        let mut payload = Vec::with_capacity(13);
        payload.push(REMOTE_CONSISTENT_LSN_TAG);
        if conn.accepts_generation() {
            payload.extend_from_slice(&generation.to_be_bytes());
        }
        payload.extend_from_slice(&remote_consistent.0.to_be_bytes());
        frontend::CopyData::new(&payload[..])?.write(&mut out);
        tracing::debug!("remote-consistent LSN {remote_consistent} of generation {generation} sent");
    }
    conn.send(&out)?;
    if changed {
        sent.position = Some(position);
    }
    sent.at = Instant::now();
    Ok(())
}

/// Fsyncs what was written to the local WAL and publishes the new durable end.
fn sync_local_wal(wal: &mut LocalWal, status: &Mutex<WalReceiverStatus>) -> anyhow::Result<()> {
    let durable = wal.sync().context("fsync the local WAL")?;
    set_status(status, |s| s.durable_lsn = Some(durable));
    Ok(())
}

/// Ingests the local WAL from the timeline's last record LSN to its end, then makes the
/// local WAL ready for streaming from there (see the module documentation).
fn replay_local_wal(timeline: &Timeline, ingest: &mut WalIngest, wal: &mut LocalWal) -> anyhow::Result<Lsn> {
    let start = timeline.last_record_lsn();
    let replayed = ingest.ingest_pg_wal(wal.dir(), LOCAL_WAL_TLI, start).context("ingest the local WAL")?;
    if replayed.records > 0 {
        tracing::info!("ingested {} records of local WAL from {start} to {}", replayed.records, replayed.end_lsn);
    }
    let end = timeline.last_record_lsn();
    wal.restart_at(end)?;
    Ok(end)
}

/// The failure of a source whose WAL does not decode (logged at error: a damaged copy on a
/// safekeeper is worth an operator's attention even when another source has good WAL).
fn undecodable(source: &WalSource, at: Lsn, e: &dyn std::fmt::Display) -> anyhow::Error {
    let message = format!("the WAL {source} sent does not decode at {at}: {e}");
    tracing::error!("{message}; its copy may be damaged, the next source is tried");
    anyhow!(message)
}

fn stream(timeline: &Arc<Timeline>, ingest: &mut WalIngest, wal: &mut LocalWal, ctx: &SessionCtx<'_>, failover: &mut Failover) -> Ended {
    let (source, status) = (&ctx.sources.as_slice()[ctx.current], ctx.status);
    let replayed = {
        let _held = ctx.gate.hold();
        let replayed = replay_local_wal(timeline, ingest, wal);
        ctx.gate.set_last_record(ingest.last_record());
        if let Some(lsn) = ingest.standby_start() {
            ctx.standby_start.store(lsn.0, Ordering::Release);
        }
        replayed
    };
    let start = match replayed {
        Ok(lsn) => lsn,
        Err(e) => return Ended::Fatal(e),
    };
    let mut conn = match connect(source, ctx.database, ctx.credentials, SESSION_START_TIMEOUT) {
        Ok(c) => c,
        Err(e) => return Ended::Connection(e),
    };
    let ident = match conn.identify_system(Instant::now() + SESSION_START_TIMEOUT) {
        Ok(ident) => ident,
        Err(e) => return Ended::Connection(e),
    };
    set_source_status(status, ctx.current, |s| s.end_lsn = Some(ident.xlogpos));
    if conn.safekeeper().is_some() && ident.xlogpos < start {
        return Ended::NoWalYet(format!("{source} has committed WAL up to {}, before {start}", ident.xlogpos));
    }
    let tli = ident.tli;
    let mut out = BytesMut::new();
    if let Err(e) = frontend::query(&format!("START_REPLICATION PHYSICAL {start} TIMELINE {tli}"), &mut out)
        .map_err(anyhow::Error::from)
        .and_then(|()| conn.send(&out))
    {
        return Ended::Connection(e);
    }
    // A safekeeper's stream goes on across compute starts, and a compute whose basebackup's
    // previous record was unknown (the pageserver had just been restored from object
    // storage) writes its first record with `xl_prev` 0, as patch 0009 lets PostgreSQL read:
    // a receiver that was already streaming then must not take it for a broken chain (a
    // full test run saw one do so and fail over: "incorrect prev-link 0/0").
    let mut decoder = match WalStreamDecoder::new(start, DecoderConfig::default()).map(WalStreamDecoder::accept_unknown_prev_link) {
        Ok(d) => d,
        Err(e) => return Ended::Fatal(anyhow!("cannot decode WAL from {start}: {e}")),
    };
    // A safekeeper serves only WAL that a quorum of safekeepers holds (its commit LSN).
    let from_quorum = conn.safekeeper().is_some();
    match conn.safekeeper() {
        Some(v) => tracing::info!(
            "streaming WAL from safekeeper {source} (protocol additions version {v}) at {start}, timeline {tli} (it has WAL up to {})",
            ident.xlogpos
        ),
        None => tracing::info!("streaming WAL from {source} at {start}, timeline {tli} (it has WAL up to {})", ident.xlogpos),
    }
    set_status(status, |s| {
        s.state = WalReceiverState::Streaming;
        s.connected = true;
        s.last_error = None;
        s.durable_lsn = Some(start);
        if let Some(src) = s.sources.get_mut(ctx.current) {
            src.last_error = None;
        }
    });
    let mut sent = StatusSent { at: Instant::now() - STATUS_INTERVAL, position: None };
    let mut local_wal_removed_below = Lsn(0);
    // For the idle flush only; `failover` keeps its own time of the last WAL for probing.
    let mut last_data = Instant::now();
    failover.session_started(last_data, wal.written_end());
    let mut streaming = false;
    loop {
        if ctx.stop.load(Ordering::SeqCst) {
            return Ended::Stopped;
        }
        // One batch: wait for a message, then drain what is readable, writing WAL as it comes.
        let mut msg = match conn.next() {
            Ok(m) => m,
            Err(e) => return Ended::Connection(e),
        };
        let mut batch: Vec<bytes::Bytes> = Vec::new();
        let mut batch_bytes = 0usize;
        let mut reply_requested = false;
        let mut server_end = None;
        while let Some(m) = msg {
            match m {
                Msg::CopyBoth => {
                    streaming = true;
                    failover.stream_accepted();
                }
                Msg::Backend(backend::Message::ErrorResponse(body)) => {
                    return Ended::Connection(anyhow!("START_REPLICATION failed: {}", error_text(&body)));
                }
                Msg::Backend(backend::Message::CopyData(body)) if streaming => {
                    let data = body.into_bytes();
                    match data.first() {
                        Some(b'w') if data.len() >= 25 => {
                            let wal_start = Lsn(u64::from_be_bytes(data[1..9].try_into().expect("8 bytes")));
                            server_end = Some(Lsn(u64::from_be_bytes(data[9..17].try_into().expect("8 bytes"))));
                            if wal_start != wal.written_end() {
                                return Ended::Fatal(anyhow!("the server sent WAL from {wal_start}, expected {}", wal.written_end()));
                            }
                            if let Err(e) = wal.append(wal_start, &data[25..]) {
                                return Ended::Fatal(e.context("write to the local WAL"));
                            }
                            batch_bytes += data.len() - 25;
                            batch.push(data.slice(25..));
                        }
                        Some(b'k') if data.len() >= 18 => {
                            server_end = Some(Lsn(u64::from_be_bytes(data[1..9].try_into().expect("8 bytes"))));
                            reply_requested |= data[17] != 0;
                        }
                        other => {
                            return Ended::Connection(anyhow!(
                                "unexpected replication message {:?} of {} bytes",
                                other.map(|b| *b as char),
                                data.len()
                            ));
                        }
                    }
                }
                Msg::Backend(_) => {}
            }
            if batch_bytes >= BATCH_BYTES_MAX {
                break;
            }
            msg = match conn.try_next() {
                Ok(m) => m,
                Err(e) => return Ended::Connection(e),
            };
        }
        if !batch.is_empty() {
            last_data = Instant::now();
            failover.wal_received(last_data, wal.written_end());
            // From a safekeeper the WAL is already on a quorum: it is made durable here
            // with the periodic status update below, not once per batch.
            if !from_quorum {
                if let Err(e) = sync_local_wal(wal, status) {
                    return Ended::Fatal(e);
                }
            }
        }
        // Confirming and ingesting happen under the gate, so that a basebackup at the
        // newest LSN never falls between them (see `IngestGate`).
        let held = ctx.gate.hold();
        if streaming && ((!batch.is_empty() && !from_quorum) || reply_requested) {
            if let Err(e) = send_status(&mut conn, timeline, ctx.standby_start, wal.durable_end(), &mut sent) {
                return Ended::Connection(e);
            }
        }
        for data in batch {
            decoder.feed_bytes(&data);
            loop {
                match decoder.poll_decode() {
                    Ok(Some(record)) => {
                        let decoded = match record.decode() {
                            Ok(d) => d,
                            Err(e) => return Ended::Connection(undecodable(source, record.start_lsn(), &e)),
                        };
                        if let Err(e) = ingest.ingest_record(&decoded, record.end_lsn()) {
                            return Ended::Fatal(e.context(format!("ingest the record at {}", record.start_lsn())));
                        }
                    }
                    Ok(None) => break,
                    Err(e) => return Ended::Connection(undecodable(source, timeline.last_record_lsn(), &e)),
                }
            }
        }
        ctx.gate.set_last_record(ingest.last_record());
        if let Some(lsn) = ingest.standby_start() {
            ctx.standby_start.store(lsn.0, Ordering::Release);
        }
        drop(held);
        if streaming && batch_bytes >= APPLY_STATUS_BYTES {
            if let Err(e) = send_status(&mut conn, timeline, ctx.standby_start, wal.durable_end(), &mut sent) {
                return Ended::Connection(e);
            }
        }
        if let Some(wal_end) = server_end {
            set_status(status, |s| {
                s.last_received_lsn = Some(decoder.next_feed_lsn());
                s.server_wal_end_lsn = Some(wal_end);
                s.records_ingested = ingest.stats().records;
                if let Some(src) = s.sources.get_mut(ctx.current) {
                    src.end_lsn = Some(wal_end);
                    src.last_error = None;
                }
            });
        }
        let idle_with_unflushed = last_data.elapsed() >= IDLE_FLUSH_AFTER && timeline.disk_consistent_lsn() < timeline.last_record_lsn();
        let flushed = if idle_with_unflushed { timeline.freeze_and_flush() } else { timeline.maybe_freeze_and_flush().map(|_| ()) };
        if let Err(e) = flushed {
            return Ended::Fatal(e.context("flush ingested WAL to layer files"));
        }
        // Ingest itself flushes by size and age after a record, so the disk-consistent LSN
        // can move without a flush here: compare, not "did this call flush".
        let disk_consistent = timeline.disk_consistent_lsn();
        if disk_consistent > local_wal_removed_below {
            if let Err(e) = wal.remove_below(disk_consistent) {
                return Ended::Fatal(e.context("remove local WAL that is in layer files"));
            }
            local_wal_removed_below = disk_consistent;
        }
        if streaming && sent.at.elapsed() >= STATUS_INTERVAL {
            if from_quorum && wal.durable_end() < wal.written_end() {
                if let Err(e) = sync_local_wal(wal, status) {
                    return Ended::Fatal(e);
                }
            }
            if let Err(e) = send_status(&mut conn, timeline, ctx.standby_start, wal.durable_end(), &mut sent) {
                return Ended::Connection(e);
            }
        }
        if let Some(targets) = failover.probe_due(Instant::now()) {
            let results = probe_sources(ctx, &targets);
            if let Some(switch) = failover.probed(Instant::now(), results) {
                return Ended::Switch(switch);
            }
        }
    }
}
