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
mod shared;
mod tls_io;
mod walstore;

pub use bell::{new_eventfd, ring_fd};
pub use quorum::majority;
pub use quorum::wire::StandbyReport;
pub use safekeeper_list::{parse_safekeeper_list, SafekeeperAddr, SafekeeperListError, SafekeeperListProblem, SAFEKEEPERS_MAX};
pub use shared::{FlushedElsewhere, Status, Wake};
pub use walstore::WalReadError;

use proto::{Lsn, TenantId, TimelineId};
use quorum::wire::{ProposerMessage, PROTOCOL_VERSION, TOKEN_BYTES_MAX};
use quorum::{Proposer, ProposerConfig, ProposerMode};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::core::Core;
use crate::shared::{lock, Event, Outcome, Shared};
use crate::walstore::WalStore;

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
    /// TLS to the safekeepers: trust in the cluster CA. Each connection asks for TLS with PostgreSQL's
    /// `SSLRequest` and checks the safekeeper's certificate against the CA and the host it
    /// dialled. `None`: plain TCP (a safekeeper with TLS on refuses it).
    pub tls: Option<tls::ClientTls>,
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
            tls,
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
            .field("tls", &tls.is_some())
            .finish()
    }
}

/// The pageserver's progress, as the safekeepers report it (the highest over them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Feedback {
    pub pageserver_flush_lsn: Lsn,
    pub pageserver_apply_lsn: Lsn,
    /// WAL below it is in object storage (what the safekeepers may remove below).
    pub pageserver_remote_consistent_lsn: Lsn,
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
                tls: config.tls.clone(),
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
