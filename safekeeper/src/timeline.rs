//! One timeline on this safekeeper: its [`quorum::Acceptor`], its storage, and the values
//! other tasks watch (commit LSN, flush LSN, pageserver feedback).
//!
//! WAL removal: the pageserver's remote-consistent LSN arrives, with its attachment
//! generation, only from the pageserver itself on a replication connection with a storage
//! token ([`Timeline::set_remote_consistent_lsn`]; the newest generation's position counts);
//! the one a proposer's `Append` relays is ignored (a compute holds only a tenant token, so
//! it could say anything). The peer horizon comes in `Append`s (kept by the acceptor). Both
//! are written to the control file lazily with the commit LSN ([`Timeline::persist_lazy`]),
//! and [`Timeline::remove_wal`] removes segments below the horizon of the durable values
//! (the rule: [`crate::storage::removal`]). The remote-consistent LSN goes to proposers in
//! `Feedback`, for their status.
//!
//! All proposer connections of a timeline (an old and a new compute may both be connected)
//! go through one lock: a batch of messages is handled under it, its `Persist` actions are
//! carried out in order, and pending appends are synced before the lock is released and the
//! replies are sent. So a reply never precedes the durability it depends on, and the
//! in-memory acceptor state equals the durable state whenever the lock is free.
//!
//! If storage fails mid-batch (an fsync error), the in-memory state may be ahead of the disk;
//! the timeline is then marked broken and refuses everything until it is reloaded from disk
//! (retrying an fsync after a failure proves nothing): [`crate::Safekeeper`] does that when
//! the timeline is asked for again, at most once per `broken_reload_interval`, as a restart
//! of the process would. A panic while the lock is held (a bug: an invariant the acceptor
//! asserts) poisons the lock; the next user marks the timeline broken the same way, since
//! the panic may have left the in-memory acceptor apart from the disk.

use bytes::Bytes;
use proto::{Lsn, TenantId, TimelineId};
use quorum::wire::{PageserverFeedback, StandbyReport, STANDBYS_MAX, WAL_BYTES_MAX};
use quorum::{Acceptor, AcceptorAction, Persist, ToAcceptor, ToProposer};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::watch;

use crate::metrics::Metrics;
use crate::storage::wal::segment_file_name;

mod fetch_check;
use crate::storage::{RemovalInputs, SyncStats, TimelineStorage};
use fetch_check::{FetchCheck, Refusal, WalBounds};

/// Why a timeline cannot be used.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum TimelineError {
    #[error("timeline {tenant}/{timeline} does not exist on this safekeeper")]
    NotFound { tenant: TenantId, timeline: TimelineId },
    #[error("timeline {tenant}/{timeline} is unavailable: {reason}")]
    Unavailable { tenant: TenantId, timeline: TimelineId, reason: String },
}

/// What handling a batch of proposer messages produced.
#[derive(Debug, Default)]
pub struct BatchOutcome {
    /// Replies to send, in order; everything they depend on is durable.
    pub replies: Vec<ToProposer>,
    /// The request could not be served (the connection says so and closes); replies before
    /// it are still valid.
    pub error: Option<String>,
}

struct Inner {
    acceptor: Acceptor,
    storage: TimelineStorage,
    /// Set when storage failed; the timeline refuses everything after that.
    broken: Option<String>,
    /// The record checks on WAL served through `FetchWal` (`fetch_check`).
    fetch_check: FetchCheck,
    /// When a refused `FetchWal` was last logged, and how many were refused since.
    fetch_refusals_logged: Option<(Instant, u64)>,
}

/// A refusal of `FetchWal` the proposer repeats (every tick) is logged again at most this
/// often.
const FETCH_REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// How long a streaming client's last report stays in the status.
const STANDBY_SHOWN_FOR: Duration = Duration::from_secs(60);

/// A streaming client other than the pageserver (a read replica), as it last reported.
#[derive(Clone, Debug)]
struct Standby {
    positions: PageserverFeedback,
    /// Hot standby feedback, full transaction ids; 0 for none.
    xmin: u64,
    catalog_xmin: u64,
    at: Instant,
    /// Still streaming: only then does its xmin hold anything back (as a walsender's does
    /// in PostgreSQL, which forgets it when the connection ends).
    connected: bool,
}

/// The pageserver's position as a safekeeper holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemotePosition {
    /// The attachment generation of the pageserver that reported it.
    pub generation: u32,
    pub lsn: Lsn,
}

/// What became of a reported remote-consistent LSN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteReport {
    Taken,
    /// From an attachment older than the newest one heard: ignored.
    Superseded {
        newest: u32,
    },
}

pub struct Timeline {
    pub tenant: TenantId,
    pub timeline: TimelineId,
    system_id: u64,
    wal_segment_size: u32,
    inner: Mutex<Inner>,
    commit_tx: watch::Sender<Lsn>,
    flush_tx: watch::Sender<Lsn>,
    feedback_tx: watch::Sender<PageserverFeedback>,
    /// The pageserver's position: the newest attachment generation heard and the highest
    /// remote-consistent LSN it reported (durable once `persist_lazy` wrote it). Outside the
    /// timeline's lock: the replication connection sets it without waiting for a batch's
    /// fsyncs.
    remote_position: Mutex<RemotePosition>,
    /// What the other streaming clients (read replicas, `pg_receivewal`) last reported, by
    /// `application_name@peer`: shown in the status; the connected ones are sent to
    /// proposers (`standbys_tx`), so that the primary sees its replicas and holds back what
    /// their hot standby feedback asks for.
    standbys: Mutex<BTreeMap<String, Standby>>,
    standbys_tx: watch::Sender<Vec<StandbyReport>>,
    metrics: Arc<Metrics>,
    /// This timeline's series of the per-timeline metrics, looked up once: a batch updates
    /// eight of them, and a lookup by label values formats both ids and hashes them.
    series: Series,
}

/// This timeline's series of the per-timeline metrics.
struct Series {
    flush_lsn: prometheus::IntGauge,
    commit_lsn: prometheus::IntGauge,
    peer_horizon_lsn: prometheus::IntGauge,
    remote_consistent_lsn: prometheus::IntGauge,
    wal_removal_horizon_lsn: prometheus::IntGauge,
    wal_disk_bytes: prometheus::IntGauge,
    appends: prometheus::IntCounter,
    wal_bytes_written: prometheus::IntCounter,
    wal_corruption: prometheus::IntCounter,
    wal_segments_removed: prometheus::IntCounter,
}

impl Series {
    fn new(m: &Metrics, tenant: TenantId, timeline: TimelineId) -> Series {
        let (t, tl) = (tenant.to_string(), timeline.to_string());
        let labels = [t.as_str(), tl.as_str()];
        Series {
            flush_lsn: m.flush_lsn.with_label_values(&labels),
            commit_lsn: m.commit_lsn.with_label_values(&labels),
            peer_horizon_lsn: m.peer_horizon_lsn.with_label_values(&labels),
            remote_consistent_lsn: m.remote_consistent_lsn.with_label_values(&labels),
            wal_removal_horizon_lsn: m.wal_removal_horizon_lsn.with_label_values(&labels),
            wal_disk_bytes: m.wal_disk_bytes.with_label_values(&labels),
            appends: m.appends.with_label_values(&labels),
            wal_bytes_written: m.wal_bytes_written.with_label_values(&labels),
            wal_corruption: m.wal_corruption.with_label_values(&labels),
            wal_segments_removed: m.wal_segments_removed.with_label_values(&labels),
        }
    }
}

/// The state of a timeline as the HTTP API shows it.
#[derive(Debug, Serialize)]
pub struct TimelineStatus {
    pub tenant_id: String,
    pub timeline_id: String,
    pub state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub system_id: u64,
    pub wal_segment_size: u32,
    pub term: u64,
    /// Created without a record of this timeline (a lost disk, or a timeline never created
    /// here): it does not vote until it has caught up (`quorum`'s "Learners").
    pub learner: bool,
    pub term_history: Vec<TermSwitchJson>,
    pub flush_lsn: String,
    /// The end of the last whole WAL record (at most `flush_lsn`): where an election sees
    /// this safekeeper's log end (`quorum`'s "Record boundaries").
    pub boundary_lsn: String,
    pub commit_lsn: String,
    pub wal_begin_lsn: String,
    /// The pageserver's remote-consistent LSN (the highest the newest attachment generation
    /// reported; 0/0: never).
    pub remote_consistent_lsn: String,
    /// The attachment generation of the pageserver that reported it (0: none known).
    pub remote_consistent_generation: u32,
    /// The highest peer horizon a proposer sent.
    pub peer_horizon_lsn: String,
    /// WAL below this may be removed: the lowest of the three in the control file (which
    /// may lag the values above by up to a second).
    pub wal_removal_horizon_lsn: String,
    /// Bytes of WAL segment files on disk.
    pub wal_disk_bytes: u64,
    pub pageserver_feedback: FeedbackJson,
    /// The other streaming clients heard from in the last minute: read replicas' positions.
    pub standbys: Vec<StandbyJson>,
}

/// A streaming client other than the pageserver, as its last status update had it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StandbyJson {
    /// `application_name@address`.
    pub client: String,
    pub write_lsn: String,
    pub flush_lsn: String,
    pub apply_lsn: String,
    /// Its hot standby feedback (full transaction ids; 0: none).
    pub xmin: u64,
    pub catalog_xmin: u64,
    /// Still streaming (a disconnected one holds nothing back).
    pub connected: bool,
    /// Milliseconds since that update.
    pub reported_ms_ago: u64,
}

#[derive(Debug, Serialize)]
pub struct TermSwitchJson {
    pub term: u64,
    pub lsn: String,
}

#[derive(Debug, Serialize)]
pub struct FeedbackJson {
    pub write_lsn: String,
    pub flush_lsn: String,
    pub apply_lsn: String,
}

impl Timeline {
    pub(crate) fn new(storage: TimelineStorage, metrics: Arc<Metrics>) -> Timeline {
        let c = storage.control().clone();
        let state = storage.acceptor_state();
        let (commit_tx, _) = watch::channel(state.commit_lsn);
        let (flush_tx, _) = watch::channel(state.flush_lsn);
        // Proposers learn the remote-consistent LSN from the control file after a restart.
        let feedback = PageserverFeedback { remote_consistent_lsn: c.remote_consistent_lsn, ..PageserverFeedback::default() };
        let (feedback_tx, _) = watch::channel(feedback);
        let inner = Inner {
            acceptor: Acceptor::new(state),
            storage,
            broken: None,
            fetch_check: FetchCheck::default(),
            fetch_refusals_logged: None,
        };
        let tl = Timeline {
            tenant: c.tenant,
            timeline: c.timeline,
            system_id: c.system_id,
            wal_segment_size: c.wal_segment_size,
            inner: Mutex::new(inner),
            commit_tx,
            flush_tx,
            feedback_tx,
            remote_position: Mutex::new(RemotePosition { generation: c.remote_consistent_generation, lsn: c.remote_consistent_lsn }),
            standbys: Mutex::new(BTreeMap::new()),
            standbys_tx: watch::channel(Vec::new()).0,
            series: Series::new(&metrics, c.tenant, c.timeline),
            metrics,
        };
        tl.update_gauges(&tl.lock());
        tl
    }

    fn update_gauges(&self, inner: &Inner) {
        let s = inner.acceptor.state();
        let m = &self.series;
        m.flush_lsn.set(s.flush_lsn.0 as i64);
        m.commit_lsn.set(s.commit_lsn.0 as i64);
        m.peer_horizon_lsn.set(s.peer_horizon_lsn.0 as i64);
        m.remote_consistent_lsn.set(self.remote_consistent_lsn().0 as i64);
        m.wal_removal_horizon_lsn.set(inner.storage.removal_inputs().horizon().0 as i64);
        m.wal_disk_bytes.set(inner.storage.wal_disk_bytes() as i64);
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        match self.inner.lock() {
            Ok(guard) => guard,
            Err(poisoned) => {
                // A panic while the lock was held may have left the in-memory acceptor ahead
                // of the disk, or halfway through a message: nothing it says can be trusted
                // any more. Broken, like after a storage failure; the disk is reloaded.
                let mut guard = poisoned.into_inner();
                if guard.broken.is_none() {
                    let reason =
                        "a panic while handling this timeline (a bug; see the log above); it is reloaded from disk when asked for again"
                            .to_string();
                    tracing::error!(tenant_id = %self.tenant, timeline_id = %self.timeline, "{reason}");
                    guard.broken = Some(reason);
                }
                self.inner.clear_poison();
                guard
            }
        }
    }

    fn unavailable(&self, reason: &str) -> TimelineError {
        TimelineError::Unavailable { tenant: self.tenant, timeline: self.timeline, reason: reason.to_string() }
    }

    /// The PostgreSQL system identifier of this timeline's WAL.
    pub fn system_id(&self) -> u64 {
        self.system_id
    }

    pub fn wal_segment_size(&self) -> u32 {
        self.wal_segment_size
    }

    /// The commit LSN as this safekeeper knows it: WAL below it is on a majority. WAL may be
    /// served to pageservers and replicas only up to here. This safekeeper holds it durably
    /// (the commit LSN never exceeds the flush LSN).
    pub fn commit_lsn(&self) -> Lsn {
        *self.commit_tx.borrow()
    }

    /// A receiver of the commit LSN that changes whenever it advances (after the batch that
    /// advanced it is durable).
    /// Where this timeline's WAL begins on this safekeeper.
    pub fn wal_begin_lsn(&self) -> Lsn {
        self.lock().storage.wal_extent().begin
    }

    pub fn commit_lsn_watch(&self) -> watch::Receiver<Lsn> {
        self.commit_tx.subscribe()
    }

    /// The durable end of this safekeeper's WAL (which may include uncommitted WAL, and may
    /// move back when an election truncates it; never below the commit LSN).
    pub fn flush_lsn(&self) -> Lsn {
        *self.flush_tx.borrow()
    }

    /// Records the pageserver's progress (write, flush and apply LSNs of replication standby
    /// status updates; the remote-consistent LSN is kept apart, see
    /// [`Timeline::set_remote_consistent_lsn`]); proposer connections forward it to their
    /// proposer when it changes.
    pub fn set_pageserver_feedback(&self, f: PageserverFeedback) {
        self.feedback_tx.send_if_modified(|cur| {
            let new = PageserverFeedback { remote_consistent_lsn: cur.remote_consistent_lsn, ..f };
            std::mem::replace(cur, new) != new
        });
    }

    /// Another streaming client (a read replica) reported its position.
    pub fn set_standby_feedback(&self, client: &str, f: PageserverFeedback) {
        self.update_standby(client, |s| s.positions = f);
    }

    /// A streaming client sent hot standby feedback: the oldest transaction its queries
    /// may still need (full transaction ids, 0 for none).
    pub fn set_hot_standby_feedback(&self, client: &str, xmin: u64, catalog_xmin: u64) {
        self.update_standby(client, |s| {
            s.xmin = xmin;
            s.catalog_xmin = catalog_xmin;
        });
    }

    /// A streaming client's connection ended: it is still shown for a while, but holds
    /// nothing back any more.
    pub fn standby_disconnected(&self, client: &str) {
        let mut standbys = self.standbys.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = standbys.get_mut(client) {
            s.connected = false;
            s.xmin = 0;
            s.catalog_xmin = 0;
            self.publish_standbys(&standbys);
        }
    }

    fn update_standby(&self, client: &str, f: impl FnOnce(&mut Standby)) {
        let mut standbys = self.standbys.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        standbys.retain(|_, s| now.duration_since(s.at) < STANDBY_SHOWN_FOR);
        let s = standbys.entry(client.to_string()).or_insert_with(|| Standby {
            positions: PageserverFeedback::default(),
            xmin: 0,
            catalog_xmin: 0,
            at: now,
            connected: true,
        });
        f(s);
        s.at = now;
        s.connected = true;
        self.publish_standbys(&standbys);
    }

    /// Sends proposers the connected standbys (their names are the `application_name`
    /// part of the client).
    fn publish_standbys(&self, standbys: &BTreeMap<String, Standby>) {
        let now = Instant::now();
        let list: Vec<StandbyReport> = standbys
            .iter()
            .filter(|(_, s)| s.connected)
            .take(STANDBYS_MAX)
            .map(|(client, s)| StandbyReport {
                name: standby_name(client).to_string(),
                flush_lsn: s.positions.flush_lsn,
                apply_lsn: s.positions.apply_lsn,
                xmin: s.xmin,
                catalog_xmin: s.catalog_xmin,
                age_ms: u32::try_from(now.duration_since(s.at).as_millis()).unwrap_or(u32::MAX),
            })
            .collect();
        self.standbys_tx.send_if_modified(|cur| {
            // Ages alone do not make a change worth a message.
            let same = cur.len() == list.len()
                && cur.iter().zip(&list).all(|(a, b)| StandbyReport { age_ms: 0, ..a.clone() } == StandbyReport { age_ms: 0, ..b.clone() });
            *cur = list;
            !same
        });
    }

    /// The connected read replicas, for proposers.
    pub fn standbys_watch(&self) -> watch::Receiver<Vec<StandbyReport>> {
        self.standbys_tx.subscribe()
    }

    /// The pageserver of attachment `generation` reported its remote-consistent LSN (WAL
    /// below it is in object storage; generation 0: a pageserver without object storage, or
    /// one that does not say). A newer generation's position replaces the one held even if
    /// it is lower, since only the newest attachment's needs count; the same generation's
    /// only raises it; an older generation's (a superseded attachment still running) is
    /// ignored. It reaches the control file with the next lazy write, proposers in
    /// `Feedback`. Only the pageserver may call this: see `replication.rs`.
    pub fn set_remote_consistent_lsn(&self, generation: u32, lsn: Lsn) -> RemoteReport {
        let mut pos = self.remote_position.lock().unwrap_or_else(|e| e.into_inner());
        let outcome = if generation > pos.generation {
            if pos.generation != 0 || pos.lsn.is_valid() {
                tracing::info!(
                    tenant_id = %self.tenant,
                    timeline_id = %self.timeline,
                    "the pageserver's attachment generation {generation} replaces generation {} (remote-consistent LSN {lsn}, was {})",
                    pos.generation,
                    pos.lsn
                );
            }
            *pos = RemotePosition { generation, lsn };
            RemoteReport::Taken
        } else if generation == pos.generation {
            pos.lsn = pos.lsn.max(lsn);
            RemoteReport::Taken
        } else {
            return RemoteReport::Superseded { newest: pos.generation };
        };
        let now = pos.lsn;
        drop(pos);
        self.feedback_tx.send_if_modified(|cur| std::mem::replace(&mut cur.remote_consistent_lsn, now) != now);
        outcome
    }

    /// The remote-consistent LSN held (0: none yet).
    pub fn remote_consistent_lsn(&self) -> Lsn {
        self.remote_position().lsn
    }

    /// The generation and remote-consistent LSN held.
    pub fn remote_position(&self) -> RemotePosition {
        *self.remote_position.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The lazily persisted values as they are in memory, and the generation of the
    /// remote-consistent LSN among them (read together with it).
    fn lazy_state(&self, inner: &Inner) -> (RemovalInputs, u32) {
        let s = inner.acceptor.state();
        let pos = self.remote_position();
        (RemovalInputs { remote_consistent_lsn: pos.lsn, peer_horizon_lsn: s.peer_horizon_lsn, commit_lsn: s.commit_lsn }, pos.generation)
    }

    pub fn pageserver_feedback(&self) -> PageserverFeedback {
        *self.feedback_tx.borrow()
    }

    pub fn feedback_watch(&self) -> watch::Receiver<PageserverFeedback> {
        self.feedback_tx.subscribe()
    }

    /// Whether storage failed; the reason if so.
    pub fn broken(&self) -> Option<String> {
        self.lock().broken.clone()
    }

    /// The WAL in `[from, to)` as stored, blocking (call from `spawn_blocking` in async code).
    /// `to` must not exceed [`Timeline::flush_lsn`]; `from` must not be below the WAL's
    /// beginning.
    pub fn read_wal(&self, from: Lsn, to: Lsn) -> anyhow::Result<Bytes> {
        let mut inner = self.lock();
        if let Some(b) = &inner.broken {
            return Err(self.unavailable(b).into());
        }
        inner.storage.read_wal(from, to)
    }

    /// Like [`Timeline::read_wal`], and checks the header of every WAL page the range touches
    /// (magic, page address, timeline 1, system id and segment size on a segment's first
    /// page); an error names the segment file and the page's LSN. Blocking. Replication
    /// must not ask beyond [`Timeline::commit_lsn`].
    pub fn read_wal_verified(&self, from: Lsn, to: Lsn) -> anyhow::Result<Bytes> {
        let mut inner = self.lock();
        if let Some(b) = &inner.broken {
            return Err(self.unavailable(b).into());
        }
        inner.storage.read_wal_verified(from, to)
    }

    /// Handles a batch of messages from one proposer connection, blocking: runs each through
    /// the acceptor, carries out its actions in order, syncs pending appends once at the end,
    /// and returns the replies (all now safe to send).
    pub fn handle_batch(&self, msgs: Vec<ToAcceptor>) -> Result<BatchOutcome, TimelineError> {
        let mut inner = self.lock();
        if let Some(b) = &inner.broken {
            return Err(self.unavailable(b));
        }
        self.metrics.proposer_batches.inc();
        self.metrics.proposer_messages.inc_by(msgs.len() as u64);
        let mut stats = SyncStats::default();
        let mut out = BatchOutcome::default();
        let mut appends = 0u64;
        let mut bytes = 0u64;
        let was_learner = inner.acceptor.state().learner;
        let result = (|| -> anyhow::Result<()> {
            'msgs: for msg in msgs {
                let actions = inner.acceptor.handle(msg);
                for action in actions {
                    match action {
                        AcceptorAction::Persist(p) => {
                            match &p {
                                Persist::Append { data, .. } => {
                                    appends += 1;
                                    bytes += data.len() as u64;
                                }
                                // Bytes below the flush LSN may change: what was checked is stale.
                                Persist::Truncate { .. } => inner.fetch_check.forget(),
                                Persist::Control { .. } => {}
                            }
                            inner.storage.persist(&p, &mut stats)?;
                        }
                        // Persisted lazily by `persist_lazy`.
                        AcceptorAction::CommitLsn(_) | AcceptorAction::PeerHorizon(_) => {}
                        // A proposer holds a tenant token: what it relays is no evidence of
                        // what the pageserver uploaded, and never moves the removal horizon.
                        AcceptorAction::RemoteConsistentLsn(_) => {}
                        AcceptorAction::SendWal { term, from, to } => {
                            let to = Lsn(to.0.min(from.0.saturating_add(WAL_BYTES_MAX as u64)));
                            match self.check_fetched_wal(&mut inner, from, to) {
                                Ok(()) => {}
                                // Not served, and not answered: the proposer asks again at
                                // its next tick (see `check_fetched_wal`).
                                Err(None) => continue,
                                Err(Some(e)) => {
                                    out.error = Some(e);
                                    break 'msgs;
                                }
                            }
                            match inner.storage.read_wal(from, to) {
                                Ok(data) => out.replies.push(ToProposer::Wal { term, from, data }),
                                Err(e) => {
                                    out.error = Some(format!("{e:#}"));
                                    break 'msgs;
                                }
                            }
                        }
                        AcceptorAction::Reply(r) => out.replies.push(r),
                    }
                }
            }
            inner.storage.sync(&mut stats)
        })();
        self.metrics.fsyncs.inc_by(stats.fsyncs);
        if stats.fsyncs > 0 {
            self.metrics.fsync_seconds.observe(stats.fsync_seconds);
        }
        self.series.appends.inc_by(appends);
        self.series.wal_bytes_written.inc_by(bytes);
        if let Err(e) = result {
            let reason = format!("storage failed, restart the safekeeper to reload from disk: {e:#}");
            tracing::error!(tenant_id = %self.tenant, timeline_id = %self.timeline, "{reason}");
            inner.broken = Some(reason.clone());
            return Err(self.unavailable(&reason));
        }
        let state = inner.acceptor.state();
        let (flush, commit) = (state.flush_lsn, state.commit_lsn);
        if was_learner && !state.learner {
            tracing::info!(
                tenant_id = %self.tenant,
                timeline_id = %self.timeline,
                term = state.term,
                flush_lsn = %flush,
                "caught up with the log of the term it joined: this safekeeper votes again for this timeline"
            );
        }
        self.update_gauges(&inner);
        drop(inner);
        self.flush_tx.send_if_modified(|f| std::mem::replace(f, flush) != flush);
        self.commit_tx.send_if_modified(|c| std::mem::replace(c, commit) != commit);
        Ok(out)
    }

    /// Checks every record that overlaps the WAL `[from, to)` a proposer fetched
    /// (`fetch_check`) before it is served. `Err(None)`: damaged or uncheckable here, logged
    /// (and counted if damaged), and left unanswered; `Err(Some(e))`: the storage failed a
    /// read, the connection is told and closed, as for any failed read of `FetchWal`.
    ///
    /// Why no answer: `quorum` has no "cannot serve" reply. An `Error` closes the connection,
    /// and the proposer, while it reconnects, has one safekeeper fewer for its commits (the
    /// one it is catching up counts for none until it is caught up), then asks this one
    /// again, since it always asks the election's donor first. Left unanswered, the proposer
    /// asks again at its next tick and the compute notices nothing: its commits go on with
    /// the other safekeepers, and the lagging one stays behind as one that cannot be reached
    /// would (the safekeeper README's "Serving WAL to a proposer" has the whole argument).
    fn check_fetched_wal(&self, inner: &mut Inner, from: Lsn, to: Lsn) -> Result<(), Option<String>> {
        let started = Instant::now();
        let seg = u64::from(self.wal_segment_size);
        let wal = WalBounds {
            begin: inner.storage.wal_extent().begin,
            end: inner.acceptor.state().flush_lsn,
            config: pgwal::DecoderConfig { segment_size_bytes: seg, system_id: Some(self.system_id) },
        };
        let Inner { storage, fetch_check, .. } = inner;
        let refusal = match fetch_check.check(from, to, wal, |f, t| storage.read_wal(f, t)) {
            Ok(stats) => {
                if stats.decoded_bytes > 0 {
                    tracing::debug!(
                        tenant_id = %self.tenant,
                        timeline_id = %self.timeline,
                        "checked {} records ({} bytes) for FetchWal {from}..{to} in {:?}",
                        stats.records,
                        stats.decoded_bytes,
                        started.elapsed()
                    );
                }
                return Ok(());
            }
            Err(r) => r,
        };
        let segment = |lsn: Lsn| segment_file_name(lsn.0 / seg, seg);
        let (text, found_now) = match &refusal {
            Refusal::Corrupt { lsn, reason, found_now } => (
                format!(
                    "WAL at {lsn} in segment file {} failed verification and is not served to the proposer (FetchWal {from}..{to}, WAL for a lagging safekeeper); the request is left unanswered: {reason}",
                    segment(*lsn)
                ),
                *found_now,
            ),
            Refusal::Incomplete { record_from, wal_end } => (
                format!(
                    "cannot check the WAL record at {record_from} (segment file {}) for FetchWal {from}..{to}: it continues past the end of this safekeeper's WAL at {wal_end}; the request is left unanswered",
                    segment(*record_from)
                ),
                false,
            ),
            Refusal::Unreadable { from: f, to: t, error } => return Err(Some(format!("could not read WAL {f}..{t} to check it: {error}"))),
        };
        if found_now {
            self.series.wal_corruption.inc();
        }
        // Logged when found, then at most once a minute while the proposer keeps asking.
        let now = Instant::now();
        let repeated = match &mut inner.fetch_refusals_logged {
            Some((at, n)) if !found_now && now.duration_since(*at) < FETCH_REFUSAL_LOG_INTERVAL => {
                *n += 1;
                return Err(None);
            }
            Some((_, n)) => std::mem::take(n),
            None => 0,
        };
        inner.fetch_refusals_logged = Some((now, 0));
        let again = if repeated > 0 { format!(" ({repeated} requests refused since last logged)") } else { String::new() };
        match refusal {
            Refusal::Corrupt { .. } => tracing::error!(tenant_id = %self.tenant, timeline_id = %self.timeline, "{text}{again}"),
            _ => tracing::warn!(tenant_id = %self.tenant, timeline_id = %self.timeline, "{text}{again}"),
        }
        Err(None)
    }

    /// Writes the commit LSN, the peer horizon and the remote-consistent LSN into the
    /// control file if any advanced since they were last written (the lazy path for
    /// `AcceptorAction::CommitLsn` and the others). Blocking.
    pub fn persist_lazy(&self) -> anyhow::Result<()> {
        let mut inner = self.lock();
        if inner.broken.is_some() {
            return Ok(());
        }
        let (lazy, generation) = self.lazy_state(&inner);
        let mut stats = SyncStats::default();
        let r = inner.storage.persist_lazy_at(lazy, generation, &mut stats);
        self.metrics.fsyncs.inc_by(stats.fsyncs);
        self.update_gauges(&inner);
        r.map(|_| ())
    }

    /// Removes the WAL segments wholly below the removal horizon of the values in the
    /// control file (see [`crate::storage::removal`]), oldest first, and logs what went.
    /// Blocking; a failure marks the timeline broken, as any storage failure does (the
    /// directory's state is then unknown until a restart reloads it).
    pub fn remove_wal(&self) -> Result<(), TimelineError> {
        let mut inner = self.lock();
        if let Some(b) = &inner.broken {
            return Err(self.unavailable(b));
        }
        let mut stats = SyncStats::default();
        let result = inner.storage.remove_wal(&mut stats);
        self.metrics.fsyncs.inc_by(stats.fsyncs);
        let segments = match result {
            Ok(s) => s,
            Err(e) => {
                let reason = format!("WAL removal failed, restart the safekeeper to reload from disk: {e:#}");
                tracing::error!(tenant_id = %self.tenant, timeline_id = %self.timeline, "{reason}");
                inner.broken = Some(reason.clone());
                return Err(self.unavailable(&reason));
            }
        };
        if let Some(segments) = segments {
            let seg = u64::from(self.wal_segment_size);
            let n = segments.end - segments.start;
            let i = inner.storage.removal_inputs();
            tracing::info!(
                tenant_id = %self.tenant,
                timeline_id = %self.timeline,
                "removed WAL segments {} to {} ({n} segments, {} MiB) below the removal horizon {} (remote-consistent LSN {}, peer horizon {}, commit LSN {}); WAL now begins at {}",
                segment_file_name(segments.start, seg),
                segment_file_name(segments.end - 1, seg),
                (n * seg) >> 20,
                i.horizon(),
                i.remote_consistent_lsn,
                i.peer_horizon_lsn,
                i.commit_lsn,
                inner.storage.wal_extent().begin,
            );
            self.series.wal_segments_removed.inc_by(n);
        }
        self.update_gauges(&inner);
        Ok(())
    }

    pub fn status(&self) -> TimelineStatus {
        let inner = self.lock();
        let state = inner.acceptor.state();
        let f = self.pageserver_feedback();
        TimelineStatus {
            tenant_id: self.tenant.to_string(),
            timeline_id: self.timeline.to_string(),
            state: if inner.broken.is_some() { "broken" } else { "ok" },
            error: inner.broken.clone(),
            system_id: self.system_id,
            wal_segment_size: self.wal_segment_size,
            term: state.term,
            learner: state.learner,
            term_history: state.history.0.iter().map(|e| TermSwitchJson { term: e.term, lsn: e.lsn.to_string() }).collect(),
            flush_lsn: state.flush_lsn.to_string(),
            boundary_lsn: state.boundary_lsn.to_string(),
            commit_lsn: state.commit_lsn.to_string(),
            wal_begin_lsn: inner.storage.wal_extent().begin.to_string(),
            remote_consistent_lsn: self.remote_consistent_lsn().to_string(),
            remote_consistent_generation: self.remote_position().generation,
            peer_horizon_lsn: state.peer_horizon_lsn.to_string(),
            wal_removal_horizon_lsn: inner.storage.removal_inputs().horizon().to_string(),
            wal_disk_bytes: inner.storage.wal_disk_bytes(),
            pageserver_feedback: FeedbackJson {
                write_lsn: f.write_lsn.to_string(),
                flush_lsn: f.flush_lsn.to_string(),
                apply_lsn: f.apply_lsn.to_string(),
            },
            standbys: {
                let now = Instant::now();
                let standbys = self.standbys.lock().unwrap_or_else(|e| e.into_inner());
                standbys
                    .iter()
                    .map(|(client, s)| (client, s, now.duration_since(s.at)))
                    .filter(|(_, _, ago)| *ago < STANDBY_SHOWN_FOR)
                    .map(|(client, s, ago)| StandbyJson {
                        client: client.clone(),
                        write_lsn: s.positions.write_lsn.to_string(),
                        flush_lsn: s.positions.flush_lsn.to_string(),
                        apply_lsn: s.positions.apply_lsn.to_string(),
                        xmin: s.xmin,
                        catalog_xmin: s.catalog_xmin,
                        connected: s.connected,
                        reported_ms_ago: u64::try_from(ago.as_millis()).unwrap_or(u64::MAX),
                    })
                    .collect()
            },
        }
    }
}

#[cfg(test)]
impl Timeline {
    /// Panics on another thread while holding the lock, as a broken invariant would.
    pub(crate) fn poison_for_tests(&self) {
        let panicked = std::thread::scope(|s| {
            s.spawn(|| {
                let _guard = self.inner.lock();
                panic!("an invariant broken while handling a message (a test)");
            })
            .join()
            .is_err()
        });
        assert!(panicked);
    }
}

/// The name a streaming client is shown by: its `application_name`, or its address if it
/// gave none (`client` is `application_name@address`).
fn standby_name(client: &str) -> &str {
    match client.rsplit_once('@') {
        Some((name, _)) if !name.is_empty() => name,
        Some((_, addr)) => addr,
        None => client,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A timeline in a temporary directory (kept alive by the returned guard).
    fn scratch() -> (tempfile::TempDir, Timeline) {
        let dir = tempfile::tempdir().unwrap();
        let (t, tl) = (TenantId::from_bytes([1; 16]), TimelineId::from_bytes([2; 16]));
        let storage = TimelineStorage::create(&dir.path().join(t.to_string()).join(tl.to_string()), t, tl, 7, 1 << 20, false).unwrap();
        let metrics = Arc::new(Metrics::new().unwrap());
        (dir, Timeline::new(storage, metrics))
    }

    /// A panic while the lock is held breaks the timeline: everything is refused after it.
    #[test]
    fn a_panic_under_the_lock_breaks_the_timeline() {
        let (_dir, tl) = scratch();
        assert_eq!(tl.broken(), None);
        tl.poison_for_tests();
        let reason = tl.broken().expect("broken after the panic");
        assert!(reason.contains("a panic while handling this timeline"), "{reason}");
        assert!(tl.handle_batch(vec![ToAcceptor::Greeting { round: 1 }]).is_err());
        assert!(tl.read_wal(Lsn(0), Lsn(0)).is_err());
        assert_eq!(tl.status().state, "broken");
    }

    #[test]
    fn standbys_are_named_by_their_application_name() {
        assert_eq!(super::standby_name("r1@127.0.0.1:5000"), "r1");
        assert_eq!(super::standby_name("@127.0.0.1:5000"), "127.0.0.1:5000");
        assert_eq!(super::standby_name("a@b@[::1]:5"), "a@b");
    }
}
