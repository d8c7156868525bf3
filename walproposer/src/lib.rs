//! The WAL proposer's I/O shell around [`quorum::Proposer`]: connections to the safekeepers,
//! the WAL it sends (the compute's `pg_wal`, plus WAL fetched from a donor), and the two ways
//! it is used:
//! - [`WalProposer`]: inside a compute (the `fjord` extension's background worker). It runs
//!   the election at start, streams the WAL PostgreSQL flushes locally, and reports the
//!   commit LSN (WAL on a majority) so committing backends can return.
//! - [`sync_safekeepers`]: `compute_ctl` before it starts a compute: a majority of
//!   safekeepers agree on the end of WAL, and that is where the compute starts.
//!
//! Threads: plain std threads and blocking sockets; no PostgreSQL function is ever called
//! from them (the extension gives a `wake` callback that only sets a latch).
//!
//! See README.md for the threads, what is read from where, and how failures are handled.

mod bell;
mod conn;
mod core;
pub mod lag;
mod safekeeper_list;
mod walstore;

pub use bell::{new_eventfd, ring_fd};
pub use quorum::majority;
pub use quorum::wire::StandbyReport;
pub use safekeeper_list::{parse_safekeeper_list, SafekeeperAddr, SafekeeperListError, SafekeeperListProblem, SAFEKEEPERS_MAX};
pub use walstore::WalReadError;

use proto::{Lsn, TenantId, TimelineId};
use quorum::wire::{PageserverFeedback, ProposerMessage, PROTOCOL_VERSION, TOKEN_BYTES_MAX};
use quorum::{Proposer, ProposerConfig, ProposerMode};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::core::{Core, Event};
use crate::walstore::WalStore;

/// The callback a proposer calls from its threads when the commit LSN or the status changes,
/// with the commit LSN. It must not block: it runs on the thread that handles the
/// safekeepers' answers.
pub type Wake = Arc<dyn Fn(Lsn) + Send + Sync>;

/// How processes other than the proposer's own wake its core thread when they have flushed
/// WAL (inside a compute: the committing backends), without a turn of the thread that calls
/// [`WalProposer::wal_flushed`]: they raise what `flushed` returns (in shared memory), then
/// ring `fd` ([`ring_fd`]), an eventfd (non-blocking) that stays open while the proposer
/// runs. The core takes `flushed()` as flushed WAL at every wake-up.
#[derive(Clone)]
pub struct Doorbell {
    pub fd: std::os::fd::RawFd,
    pub flushed: FlushedElsewhere,
}

/// [`Doorbell::flushed`]: how far other processes flushed WAL.
pub type FlushedElsewhere = Arc<dyn Fn() -> Lsn + Send + Sync>;

/// Where and what to propose. `Debug` leaves the token out.
#[derive(Clone)]
pub struct Config {
    /// `host:port` of every safekeeper (the proposer protocol port).
    pub safekeepers: Vec<String>,
    pub tenant_id: TenantId,
    pub timeline_id: TimelineId,
    /// PostgreSQL's system identifier (from `pg_control`).
    pub system_id: u64,
    /// The WAL segment size in bytes (16 MiB unless initdb said otherwise).
    pub wal_segment_size: u32,
    /// Where this proposer's own WAL begins: the LSN the compute started at. `Lsn(0)` for a
    /// sync, which writes no WAL of its own.
    pub wal_start: Lsn,
    /// The compute's `pg_wal` directory (segments of PostgreSQL timeline 1); `None` for a sync.
    pub wal_dir: Option<PathBuf>,
    /// Who we are, for the safekeepers' logs.
    pub name: String,
    /// Reconnect backoff ceiling.
    pub reconnect_max: Duration,
    /// Tell the safekeepers where whole PostgreSQL WAL records end: the proposer decodes the
    /// compute's WAL (`pgwal`) and declares the end of the last complete record with the
    /// WAL it streams (which may end inside a record: PostgreSQL flushes whole pages in the
    /// background, and a record may be longer than a message), so that commits, the
    /// safekeepers' logs as elections see them, and the next compute's start, end at a
    /// record boundary. `true` for every compute; `false` only where the bytes are not WAL
    /// (tests with synthetic segments: every flush LSN is then taken for a boundary).
    pub whole_records: bool,
    /// The token sent in every `Hello` (a JWT of the `auth` crate granting this timeline;
    /// the callers take it from `FJORD_AUTH_TOKEN`), for safekeepers that run with
    /// authentication on. `None` (or empty): no token, which such a safekeeper refuses.
    /// At most `quorum::wire::TOKEN_BYTES_MAX` bytes. Never logged.
    pub auth_token: Option<String>,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Config {
            safekeepers,
            tenant_id,
            timeline_id,
            system_id,
            wal_segment_size,
            wal_start,
            wal_dir,
            name,
            reconnect_max,
            whole_records,
            auth_token,
        } = self;
        f.debug_struct("Config")
            .field("safekeepers", safekeepers)
            .field("tenant_id", tenant_id)
            .field("timeline_id", timeline_id)
            .field("system_id", system_id)
            .field("wal_segment_size", wal_segment_size)
            .field("wal_start", wal_start)
            .field("wal_dir", wal_dir)
            .field("name", name)
            .field("reconnect_max", reconnect_max)
            .field("whole_records", whole_records)
            .field("auth_token", &auth_token.as_ref().map(|_| format_args!("<redacted>")))
            .finish()
    }
}

/// The proposer's state, for logs, status functions and decisions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// Connecting and running the election.
    Electing,
    /// Elected in `term`; WAL from `start_lsn` on is this proposer's.
    Streaming { term: u64, start_lsn: Lsn },
    /// Another proposer took over (a higher term) or the safekeepers' WAL does not continue
    /// where this compute started: this compute must never commit again. `reason` says why.
    Fenced { reason: String },
    /// The proposer cannot go on for a reason of its own (e.g. a WAL segment a safekeeper
    /// needs was already removed from `pg_wal`). Fatal for the compute, as `Fenced` is.
    Failed { reason: String },
}

/// The pageserver's progress, as the safekeepers report it (the highest over them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Feedback {
    pub pageserver_flush_lsn: Lsn,
    pub pageserver_apply_lsn: Lsn,
    /// WAL below it is in object storage (what the safekeepers may remove below).
    pub pageserver_remote_consistent_lsn: Lsn,
}

/// How a proposer ended (sync: its result).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Synced(Option<Lsn>),
    Failed(String),
}

/// State shared by the caller, the core thread and the connecting threads.
pub(crate) struct Shared {
    pub stopping: AtomicBool,
    pub commit_lsn: AtomicU64,
    /// The highest LSN `wal_flushed` reported.
    pub flushed: AtomicU64,
    /// An `Event::Flushed` is on its way to the core: later calls only raise `flushed`.
    pub flush_pending: AtomicBool,
    pub status: Mutex<Status>,
    /// Per safekeeper: the last feedback it sent.
    feedback: Mutex<Vec<PageserverFeedback>>,
    /// Per safekeeper: the read replicas streaming from it, as it last listed them, and
    /// when that list arrived.
    standbys: Mutex<Vec<(Vec<StandbyReport>, Instant)>>,
    /// Per safekeeper: `None` while connected, else why not.
    nodes: Mutex<Vec<Option<String>>>,
    /// Fetched WAL held in memory now, and the most held at once.
    pub fetched_bytes: AtomicU64,
    pub fetched_peak_bytes: AtomicU64,
    /// Lines for the caller's log (the extension has no `tracing` subscriber: these threads
    /// may not call PostgreSQL's), oldest first, at most [`NOTICES_MAX`].
    notices: Mutex<std::collections::VecDeque<String>>,
    /// The core's one-line account of where it stands.
    pub progress: Mutex<String>,
    outcome: Mutex<Option<Outcome>>,
    outcome_cv: Condvar,
    stop_lock: Mutex<()>,
    stop_cv: Condvar,
}

impl Shared {
    fn new(n: usize, wal_start: Lsn) -> Shared {
        Shared {
            stopping: AtomicBool::new(false),
            commit_lsn: AtomicU64::new(0),
            flushed: AtomicU64::new(wal_start.0),
            flush_pending: AtomicBool::new(false),
            status: Mutex::new(Status::Electing),
            feedback: Mutex::new(vec![PageserverFeedback::default(); n]),
            standbys: Mutex::new(vec![(Vec::new(), Instant::now()); n]),
            nodes: Mutex::new(vec![Some("not connected yet".to_string()); n]),
            fetched_bytes: AtomicU64::new(0),
            fetched_peak_bytes: AtomicU64::new(0),
            notices: Mutex::new(std::collections::VecDeque::new()),
            progress: Mutex::new(String::new()),
            outcome: Mutex::new(None),
            outcome_cv: Condvar::new(),
            stop_lock: Mutex::new(()),
            stop_cv: Condvar::new(),
        }
    }

    pub fn set_feedback(&self, node: usize, f: PageserverFeedback) {
        lock(&self.feedback)[node] = f;
    }

    /// The highest remote-consistent LSN any safekeeper reported.
    pub fn remote_consistent_lsn(&self) -> Lsn {
        lock(&self.feedback).iter().map(|f| f.remote_consistent_lsn).max().unwrap_or_default()
    }

    pub fn set_standbys(&self, node: usize, list: Vec<StandbyReport>) {
        lock(&self.standbys)[node] = (list, Instant::now());
    }

    pub fn set_node_state(&self, node: usize, down_because: Option<String>) {
        if down_because.is_some() {
            // What a safekeeper we cannot hear from listed is not known to be true any more.
            lock(&self.standbys)[node].0.clear();
        }
        lock(&self.nodes)[node] = down_because;
    }

    /// A line for the caller's log (also logged through `tracing` by the caller of this).
    /// The oldest is dropped when the caller does not take them.
    pub fn notice(&self, line: String) {
        let mut n = lock(&self.notices);
        if n.len() == NOTICES_MAX {
            n.pop_front();
        }
        n.push_back(line);
    }

    pub fn set_outcome(&self, outcome: Outcome) {
        let mut o = lock(&self.outcome);
        if o.is_none() {
            *o = Some(outcome);
        }
        self.outcome_cv.notify_all();
    }

    /// Sleeps for `d`, or less if the proposer stops meanwhile.
    pub fn sleep_unless_stopping(&self, d: Duration) {
        let guard = lock(&self.stop_lock);
        if self.stopping.load(Ordering::SeqCst) {
            return;
        }
        let _ = self.stop_cv.wait_timeout(guard, d);
    }

    fn stop(&self) {
        let _guard = lock(&self.stop_lock);
        self.stopping.store(true, Ordering::SeqCst);
        self.stop_cv.notify_all();
    }
}

/// At most this many lines wait for [`WalProposer::take_notices`].
const NOTICES_MAX: usize = 64;

/// A poisoned lock only means another thread panicked while holding it; the data (plain
/// values replaced whole) is still consistent.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running proposer (threads inside).
pub struct WalProposer {
    shared: Arc<Shared>,
    events: bell::EventSender,
    threads: Vec<JoinHandle<()>>,
    addrs: Vec<String>,
}

impl WalProposer {
    /// Connects to the safekeepers and starts the election in background threads. `wake` is
    /// called (from those threads) whenever the commit LSN or the status changes, with the
    /// commit LSN (WAL below it is on a majority; 0 before the first commit).
    pub fn start(config: Config, wake: Wake) -> anyhow::Result<WalProposer> {
        Self::start_with_doorbell(config, wake, None)
    }

    /// [`WalProposer::start`], with a [`Doorbell`] that other processes ring when they have
    /// flushed WAL.
    pub fn start_with_doorbell(config: Config, wake: Wake, doorbell: Option<Doorbell>) -> anyhow::Result<WalProposer> {
        if !config.wal_start.is_valid() {
            anyhow::bail!("cannot start a WAL proposer without a start LSN (wal_start is 0)");
        }
        let Some(dir) = config.wal_dir.clone() else {
            anyhow::bail!("cannot start a WAL proposer without a pg_wal directory (wal_dir)");
        };
        Self::spawn(&config, ProposerMode::Compute, Some(dir), config.wal_start, wake, doorbell)
    }

    fn spawn(
        config: &Config,
        mode: ProposerMode,
        dir: Option<PathBuf>,
        wal_start: Lsn,
        wake: Wake,
        doorbell: Option<Doorbell>,
    ) -> anyhow::Result<WalProposer> {
        validate(config)?;
        let n = config.safekeepers.len();
        let shared = Arc::new(Shared::new(n, wal_start));
        let (tx, rx) = mpsc::channel();
        let (bell, flush_hint) = match doorbell {
            // SAFETY: the caller keeps the eventfd open while the proposer runs (Doorbell).
            Some(d) => (unsafe { bell::Bell::borrowed(d.fd) }, Some(d.flushed)),
            None => (bell::Bell::new().map_err(|e| anyhow::anyhow!("could not create the proposer's eventfd: {e}"))?, None),
        };
        let bell = Arc::new(bell);
        let tx = bell::EventSender::new(tx, Arc::clone(&bell));
        let segment_size = u64::from(config.wal_segment_size);
        let core = Core::new(
            Proposer::new(
                n,
                wal_start,
                ProposerConfig { mode, defer_commit_lsn: mode == ProposerMode::Compute, ..ProposerConfig::default() },
            )
            .identified(proposer_id()),
            WalStore::new(dir, segment_size, wal_start),
            Arc::clone(&shared),
            wake,
            config.safekeepers.clone(),
            config.reconnect_max,
            config.whole_records,
        );
        let hello = ProposerMessage::Hello {
            protocol_version: PROTOCOL_VERSION,
            tenant: config.tenant_id,
            timeline: config.timeline_id,
            system_id: config.system_id,
            wal_segment_size: config.wal_segment_size,
            name: config.name.clone(),
            auth_token: config.auth_token.clone().unwrap_or_default(),
        };
        let mut proposer =
            WalProposer { shared: Arc::clone(&shared), events: tx.clone(), threads: Vec::new(), addrs: config.safekeepers.clone() };
        let span = tracing::info_span!("walproposer", tenant_id = %config.tenant_id, timeline_id = %config.timeline_id);
        let core_span = span.clone();
        let spawned = std::thread::Builder::new().name("walproposer".into()).spawn(move || {
            let _entered = core_span.enter();
            core.run(rx, bell, flush_hint)
        });
        proposer.threads.push(spawned.map_err(|e| anyhow::anyhow!("could not start the proposer's core thread: {e}"))?);
        for (node, addr) in config.safekeepers.iter().enumerate() {
            let ctx = conn::ConnCtx {
                node,
                addr: addr.clone(),
                hello: hello.clone(),
                reconnect_max: config.reconnect_max,
                shared: Arc::clone(&shared),
                events: tx.clone(),
            };
            let conn_span = span.clone();
            let spawned = std::thread::Builder::new().name(format!("walproposer sk{node}")).spawn(move || {
                let _entered = conn_span.enter();
                conn::run(ctx)
            });
            // On failure, `proposer` drops here and stops the threads already running.
            proposer.threads.push(spawned.map_err(|e| anyhow::anyhow!("could not start a proposer's connecting thread: {e}"))?);
        }
        Ok(proposer)
    }

    /// PostgreSQL has flushed its WAL up to `lsn` (monotone; ignored if lower than before).
    /// Cheap: an atomic maximum, and an event to the core only if none is pending.
    pub fn wal_flushed(&self, lsn: Lsn) {
        let previous = self.shared.flushed.fetch_max(lsn.0, Ordering::SeqCst);
        if lsn.0 > previous && !self.shared.flush_pending.swap(true, Ordering::SeqCst) {
            let _ = self.events.send(Event::Flushed);
        }
    }

    /// WAL below this is on a majority of safekeepers.
    pub fn commit_lsn(&self) -> Lsn {
        Lsn(self.shared.commit_lsn.load(Ordering::SeqCst))
    }

    pub fn status(&self) -> Status {
        lock(&self.shared.status).clone()
    }

    /// The pageserver's progress: the highest any safekeeper reported.
    pub fn feedback(&self) -> Feedback {
        let all = lock(&self.shared.feedback);
        Feedback {
            pageserver_flush_lsn: all.iter().map(|f| f.flush_lsn).max().unwrap_or_default(),
            pageserver_apply_lsn: all.iter().map(|f| f.apply_lsn).max().unwrap_or_default(),
            pageserver_remote_consistent_lsn: all.iter().map(|f| f.remote_consistent_lsn).max().unwrap_or_default(),
        }
    }

    /// The read replicas streaming from the safekeepers, each with the safekeeper
    /// (`host:port`) it streams from; its `age_ms` counts from its last report to now.
    pub fn standbys(&self) -> Vec<(String, StandbyReport)> {
        let all = lock(&self.shared.standbys);
        let mut out = Vec::new();
        for (addr, (list, at)) in self.addrs.iter().zip(all.iter()) {
            let since = u32::try_from(at.elapsed().as_millis()).unwrap_or(u32::MAX);
            for s in list {
                out.push((addr.clone(), StandbyReport { age_ms: s.age_ms.saturating_add(since), ..s.clone() }));
            }
        }
        out
    }

    /// Per safekeeper (`host:port`): `None` while connected, else why not.
    pub fn connections(&self) -> Vec<(String, Option<String>)> {
        let nodes = lock(&self.shared.nodes);
        self.addrs.iter().cloned().zip(nodes.iter().cloned()).collect()
    }

    /// Lines for the compute's log that the proposer's threads cannot write themselves (a
    /// safekeeper being caught up with WAL fetched from the others, and when it is through),
    /// oldest first; each is returned once.
    pub fn take_notices(&self) -> Vec<String> {
        lock(&self.shared.notices).drain(..).collect()
    }

    /// WAL fetched from safekeepers that this proposer holds in memory now (for a safekeeper
    /// that lags behind what `pg_wal` keeps; at most `quorum::ProposerConfig::max_fetched`
    /// plus one fetch), and the most it held at once.
    pub fn fetched_wal_bytes(&self) -> (u64, u64) {
        (self.shared.fetched_bytes.load(Ordering::SeqCst), self.shared.fetched_peak_bytes.load(Ordering::SeqCst))
    }

    /// Stops the threads (closing the connections).
    pub fn stop(self) {}

    fn shutdown(&mut self) {
        self.shared.stop();
        let _ = self.events.send(Event::Stop);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for WalProposer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn validate(config: &Config) -> anyhow::Result<()> {
    if config.safekeepers.is_empty() {
        anyhow::bail!("cannot propose WAL without safekeepers: the list is empty");
    }
    for (i, a) in config.safekeepers.iter().enumerate() {
        if config.safekeepers[..i].contains(a) {
            anyhow::bail!("safekeeper {a} is listed twice");
        }
    }
    let size = config.wal_segment_size;
    if !size.is_power_of_two() || !(1 << 20..=1 << 30).contains(&size) {
        anyhow::bail!("invalid WAL segment size {size}: must be a power of two between 1 MiB and 1 GiB");
    }
    if let Some(token) = &config.auth_token {
        // Checked here rather than cut in the encoder: a cut token could only be refused.
        if token.len() > TOKEN_BYTES_MAX {
            anyhow::bail!("the auth token is {} bytes long, longer than the {TOKEN_BYTES_MAX} a safekeeper accepts", token.len());
        }
    }
    Ok(())
}

/// Makes a majority of safekeepers agree on the end of the timeline's WAL, commits it, and
/// returns it; `None` if no safekeeper has WAL for the timeline yet. Gives up after `timeout`.
///
/// The sync is a proposer that writes no WAL of its own: `config.wal_start` and
/// `config.wal_dir` are ignored (taken as 0 and none). It wins an election, fetches the
/// donor's WAL as far as a lagging safekeeper needs it, and returns once the commit LSN has
/// reached the elected start LSN and a majority of safekeepers acknowledged a commit LSN at
/// least that high, so that they serve the WAL up to it to the pageserver.
pub fn sync_safekeepers(config: &Config, timeout: Duration) -> anyhow::Result<Option<Lsn>> {
    let started = Instant::now();
    let proposer = WalProposer::spawn(config, ProposerMode::Sync, None, Lsn(0), Arc::new(|_| {}), None)?;
    let shared = Arc::clone(&proposer.shared);
    let mut outcome = lock(&shared.outcome);
    while outcome.is_none() {
        let left = timeout.saturating_sub(started.elapsed());
        if left.is_zero() {
            break;
        }
        outcome = shared.outcome_cv.wait_timeout(outcome, left).unwrap_or_else(|e| e.into_inner()).0;
    }
    let result = outcome.clone();
    drop(outcome);
    let connections = proposer.connections();
    let progress = lock(&shared.progress).clone();
    drop(proposer);
    match result {
        Some(Outcome::Synced(lsn)) => Ok(lsn),
        Some(Outcome::Failed(reason)) => anyhow::bail!("could not sync the safekeepers: {reason}"),
        None => {
            let down: Vec<String> = connections.iter().filter_map(|(a, why)| why.as_ref().map(|w| format!("{a} ({w})"))).collect();
            let down = if down.is_empty() { "none".to_string() } else { down.join(", ") };
            anyhow::bail!("could not sync the safekeepers within {timeout:?}: {progress}; unreachable safekeepers: {down}")
        }
    }
}

/// A random id for a proposer (`quorum::Proposer::identified`): std's per-process random
/// hash keys, mixed with the time and the process id, so two proposers of a timeline (two
/// computes, a compute and a sync) differ.
fn proposer_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
    h.write_u32(std::process::id());
    h.finish()
}
