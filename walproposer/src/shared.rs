//! What the caller, the core thread and the connecting threads share: the state behind an
//! `Arc` ([`Shared`]: status, commit LSN, feedback, notices, the outcome), the events the
//! core thread takes from its channel ([`Event`]), and the callbacks a proposer is given
//! ([`Wake`], [`FlushedElsewhere`]). A leaf: it names no other module of the crate, so the
//! threads' modules and the crate root can all use it.

use bytes::BytesMut;
use proto::Lsn;
use quorum::wire::{PageserverFeedback, StandbyReport};
use quorum::NodeId;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The callback a proposer calls from its threads when the commit LSN or the status changes,
/// with the commit LSN. It must not block: it runs on the thread that handles the
/// safekeepers' answers.
pub type Wake = Arc<dyn Fn(Lsn) + Send + Sync>;

/// [`Doorbell::flushed`]: how far other processes flushed WAL.
pub type FlushedElsewhere = Arc<dyn Fn() -> Lsn + Send + Sync>;

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

/// What the core thread takes from its channel.
pub enum Event {
    /// A connecting thread greeted safekeeper `node` on `stream`; `leftover` is what it read
    /// after `HelloOk`. When this core gives the connection up, it sends why on `ended`.
    Connected {
        node: NodeId,
        stream: TcpStream,
        /// The TLS session over `stream`, with TLS on.
        tls: Option<Box<crate::tls_io::Tls>>,
        leftover: BytesMut,
        ended: Sender<String>,
    },
    /// `wal_flushed` raised `Shared::flushed` (coalesced: one event per burst).
    Flushed,
    Stop,
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
    pub feedback: Mutex<Vec<PageserverFeedback>>,
    /// Per safekeeper: the read replicas streaming from it, as it last listed them, and
    /// when that list arrived.
    pub standbys: Mutex<Vec<(Vec<StandbyReport>, Instant)>>,
    /// Per safekeeper: `None` while connected, else why not.
    pub nodes: Mutex<Vec<Option<String>>>,
    /// Fetched WAL held in memory now, and the most held at once.
    pub fetched_bytes: AtomicU64,
    pub fetched_peak_bytes: AtomicU64,
    /// Lines for the caller's log (the extension has no `tracing` subscriber: these threads
    /// may not call PostgreSQL's), oldest first, at most [`NOTICES_MAX`].
    pub notices: Mutex<std::collections::VecDeque<String>>,
    /// The core's one-line account of where it stands.
    pub progress: Mutex<String>,
    pub outcome: Mutex<Option<Outcome>>,
    pub outcome_cv: Condvar,
    stop_lock: Mutex<()>,
    stop_cv: Condvar,
}

impl Shared {
    pub fn new(n: usize, wal_start: Lsn) -> Shared {
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

    pub fn stop(&self) {
        let _guard = lock(&self.stop_lock);
        self.stopping.store(true, Ordering::SeqCst);
        self.stop_cv.notify_all();
    }
}

/// At most this many lines wait for [`crate::WalProposer::take_notices`].
pub const NOTICES_MAX: usize = 64;

/// A poisoned lock only means another thread panicked while holding it; the data (plain
/// values replaced whole) is still consistent.
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
