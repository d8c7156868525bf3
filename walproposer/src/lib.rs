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
//! STATUS: API only; being implemented.

use proto::{Lsn, TenantId, TimelineId};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Where and what to propose.
#[derive(Clone, Debug)]
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
}

/// The pageserver's progress, as the safekeepers report it (the highest over them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Feedback {
    pub pageserver_flush_lsn: Lsn,
    pub pageserver_apply_lsn: Lsn,
}

/// A running proposer (threads inside).
pub struct WalProposer {
    _private: (),
}

impl WalProposer {
    /// Connects to the safekeepers and starts the election in background threads. `wake` is
    /// called (from those threads) whenever the commit LSN or the status changes.
    pub fn start(config: Config, wake: Arc<dyn Fn() + Send + Sync>) -> anyhow::Result<WalProposer> {
        let _ = (config, wake);
        anyhow::bail!("walproposer: not implemented yet")
    }

    /// PostgreSQL has flushed its WAL up to `lsn` (monotone; ignored if lower than before).
    pub fn wal_flushed(&self, lsn: Lsn) {
        let _ = lsn;
    }

    /// WAL below this is on a majority of safekeepers.
    pub fn commit_lsn(&self) -> Lsn {
        Lsn(0)
    }

    pub fn status(&self) -> Status {
        Status::Electing
    }

    pub fn feedback(&self) -> Feedback {
        Feedback::default()
    }

    /// Stops the threads (closing the connections).
    pub fn stop(self) {}
}

/// Makes a majority of safekeepers agree on the end of the timeline's WAL, commits it, and
/// returns it; `None` if no safekeeper has WAL for the timeline yet. Gives up after `timeout`.
pub fn sync_safekeepers(config: &Config, timeout: Duration) -> anyhow::Result<Option<Lsn>> {
    let _ = (config, timeout);
    anyhow::bail!("sync_safekeepers: not implemented yet")
}
