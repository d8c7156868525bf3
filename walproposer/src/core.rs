//! The core thread: owns the [`quorum::Proposer`] and the [`WalStore`], takes events from
//! the connection threads and from `wal_flushed`, ticks the proposer every [`TICK`], and
//! carries out its actions.
//!
//! Writes are queued per connection while one batch of events is handled and written at
//! the end of it (one `write_all` per safekeeper per batch, so appends coalesce). A failed
//! write shuts that socket down; its reader thread then reconnects, and the proposer is told
//! with `reconnected(i)`. Nothing here ever blocks on anything but the event channel and
//! those writes (bounded by [`crate::conn::WRITE_TIMEOUT`]).
//!
//! Invariants: a compute proposer streams only after it was elected with `start_lsn ==
//! wal_start`; once fenced or failed it sends nothing more, ever. Bytes at or beyond the LSN
//! PostgreSQL reported flushed are never sent (the WAL store refuses them).

use crate::walstore::WalStore;
use crate::{Outcome, Shared, Status};
use bytes::BytesMut;
use proto::Lsn;
use quorum::wire::ProposerMessage;
use quorum::{NodeId, Proposer, ProposerAction, ToAcceptor, ToProposer};
use std::collections::VecDeque;
use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the proposer is ticked (resends of unanswered messages, stalled streams).
pub const TICK: Duration = Duration::from_millis(500);
/// The first delay before an election is retried; doubles up to `reconnect_max`.
const ELECTION_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// At most this many events are handled before queued writes go out.
const BATCH_EVENTS_MAX: usize = 256;

pub enum Event {
    Connected {
        node: NodeId,
        generation: u64,
        writer: TcpStream,
    },
    Disconnected {
        node: NodeId,
        generation: u64,
    },
    Message {
        node: NodeId,
        generation: u64,
        msg: ToProposer,
    },
    /// `wal_flushed` raised `Shared::flushed` (coalesced: one event per burst).
    Flushed,
    Stop,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Inside a compute: stream its WAL, fence on any doubt.
    Compute,
    /// compute_ctl's sync: agree on the end of WAL, commit it, stop.
    Sync,
}

struct Conn {
    generation: u64,
    stream: TcpStream,
    out: BytesMut,
}

pub struct Core {
    pub proposer: Proposer,
    pub mode: Mode,
    pub wal_start: Lsn,
    pub store: WalStore,
    pub shared: Arc<Shared>,
    pub wake: Arc<dyn Fn() + Send + Sync>,
    pub addrs: Vec<String>,
    pub reconnect_max: Duration,
    /// See [`crate::Config::whole_records`].
    pub whole_records: bool,
    conns: Vec<Option<Conn>>,
    /// An election was started (once any connection existed).
    started: bool,
    /// `(term, start_lsn)` once elected.
    elected: Option<(u64, Lsn)>,
    commit_lsn: Lsn,
    /// Per safekeeper: the highest commit LSN it acknowledged in the current term.
    acked_commit: Vec<Lsn>,
    retry_at: Option<Instant>,
    election_backoff: Duration,
    /// The safekeeper whose message is being handled (to name it when stepping down).
    handling: Option<NodeId>,
    done: bool,
    /// Compute mode, once elected: decodes the compute's own WAL as it is flushed, so that
    /// only whole records are given to the proposer (see [`Core::record_end`]).
    decoder: Option<pgwal::WalStreamDecoder>,
    /// The end of the last whole record decoded.
    record_end: Lsn,
}

impl Core {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        proposer: Proposer,
        mode: Mode,
        wal_start: Lsn,
        store: WalStore,
        shared: Arc<Shared>,
        wake: Arc<dyn Fn() + Send + Sync>,
        addrs: Vec<String>,
        reconnect_max: Duration,
        whole_records: bool,
    ) -> Core {
        let n = addrs.len();
        Core {
            proposer,
            mode,
            wal_start,
            store,
            shared,
            wake,
            addrs,
            reconnect_max,
            whole_records,
            conns: (0..n).map(|_| None).collect(),
            started: false,
            elected: None,
            commit_lsn: Lsn(0),
            acked_commit: vec![Lsn(0); n],
            decoder: None,
            record_end: Lsn(0),
            retry_at: None,
            election_backoff: ELECTION_BACKOFF_MIN,
            handling: None,
            done: false,
        }
    }

    pub fn run(mut self, events: Receiver<Event>) {
        self.progress();
        let mut next_tick = Instant::now() + TICK;
        while !self.done {
            let now = Instant::now();
            let mut wait = next_tick.saturating_duration_since(now);
            if let Some(at) = self.retry_at {
                wait = wait.min(at.saturating_duration_since(now));
            }
            match events.recv_timeout(wait) {
                Ok(Event::Stop) | Err(RecvTimeoutError::Disconnected) => break,
                Ok(ev) => {
                    self.on_event(ev);
                    // Take what else is waiting before writing, so that writes coalesce.
                    for _ in 0..BATCH_EVENTS_MAX {
                        match events.try_recv() {
                            Ok(Event::Stop) => self.done = true,
                            Ok(ev) => self.on_event(ev),
                            Err(_) => break,
                        }
                        if self.done {
                            break;
                        }
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
            let now = Instant::now();
            if !self.done && now >= next_tick {
                next_tick = now + TICK;
                let actions = self.proposer.tick();
                if actions.is_empty() && self.started && !self.proposer.is_leader() && self.retry_at.is_none() {
                    // Outside leadership, the proposer's tick is silent only when it is idle:
                    // greeting and voting always resend to someone who has not answered. Idle
                    // before being elected means the election was refused.
                    self.schedule_retry("the election was refused (another proposer took the votes)");
                }
                self.perform(actions);
            }
            if !self.done && self.retry_at.is_some_and(|at| now >= at) {
                self.retry_at = None;
                tracing::debug!("starting an election");
                let actions = self.proposer.start_election();
                self.perform(actions);
            }
            self.write_out();
        }
        for c in self.conns.iter().flatten() {
            let _ = c.stream.shutdown(std::net::Shutdown::Both);
        }
    }

    fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Connected { node, generation, writer } => {
                self.conns[node] = Some(Conn { generation, stream: writer, out: BytesMut::new() });
                let actions = if self.started {
                    self.proposer.reconnected(node)
                } else {
                    self.started = true;
                    tracing::info!("starting the election");
                    self.proposer.start_election()
                };
                self.perform(actions);
            }
            Event::Disconnected { node, generation } => {
                if self.conns[node].as_ref().is_some_and(|c| c.generation == generation) {
                    self.conns[node] = None;
                }
            }
            Event::Message { node, generation, msg } => {
                if self.conns[node].as_ref().is_none_or(|c| c.generation != generation) {
                    return;
                }
                if let ToProposer::AppendAck { term, commit_lsn, .. } = &msg {
                    if *term == self.proposer.term() && *commit_lsn > self.acked_commit[node] {
                        self.acked_commit[node] = *commit_lsn;
                    }
                }
                self.handling = Some(node);
                let actions = self.proposer.handle(node, msg);
                self.perform(actions);
                self.handling = None;
                self.check_sync_done();
            }
            Event::Flushed => {
                self.shared.flush_pending.store(false, Ordering::SeqCst);
                let flushed = Lsn(self.shared.flushed.load(Ordering::SeqCst));
                self.store.set_flushed(flushed);
                if self.mode == Mode::Compute && self.elected.is_some() {
                    if let Some(end) = self.record_end(flushed) {
                        let actions = self.proposer.append(end);
                        self.perform(actions);
                    }
                }
            }
            Event::Stop => self.done = true,
        }
    }

    fn perform(&mut self, actions: Vec<ProposerAction>) {
        let mut queue: VecDeque<ProposerAction> = actions.into();
        while let Some(a) = queue.pop_front() {
            if self.done {
                return;
            }
            match a {
                ProposerAction::Send(i, msg) => self.queue(i, ProposerMessage::Consensus(msg)),
                ProposerAction::SendWal { to, term, begin, end, commit_lsn } => {
                    if self.conns[to].is_none() {
                        // Lost with the connection; the proposer resends after it rejoins.
                        continue;
                    }
                    match self.store.read(begin, end) {
                        Ok(data) => {
                            let msg = ToAcceptor::Append { term, begin_lsn: begin, data, commit_lsn };
                            self.queue(to, ProposerMessage::Consensus(msg));
                        }
                        Err(e) => {
                            let reason = format!("cannot send WAL to safekeeper {}: {e}", self.addrs[to]);
                            self.finish(Status::Failed { reason: reason.clone() }, Outcome::Failed(reason));
                        }
                    }
                }
                ProposerAction::StoreWal { from, data } => {
                    tracing::debug!("fetched {} bytes of WAL at {from} from the donor", data.len());
                    self.store.store(from, data);
                }
                ProposerAction::Elected { term, start_lsn, donor } => queue.extend(self.on_elected(term, start_lsn, donor)),
                ProposerAction::Commit { commit_lsn, .. } => {
                    self.commit_lsn = commit_lsn;
                    self.shared.commit_lsn.store(commit_lsn.0, Ordering::SeqCst);
                    (self.wake)();
                }
                ProposerAction::SteppedDown { term, seen } => self.on_stepped_down(term, seen),
            }
        }
    }

    fn on_elected(&mut self, term: u64, start_lsn: Lsn, donor: NodeId) -> Vec<ProposerAction> {
        self.election_backoff = ELECTION_BACKOFF_MIN;
        self.acked_commit.iter_mut().for_each(|c| *c = Lsn(0));
        if self.mode == Mode::Sync && start_lsn == Lsn(0) {
            tracing::info!("elected in term {term}: no safekeeper has WAL for this timeline");
            self.finish(Status::Streaming { term, start_lsn }, Outcome::Synced(None));
            return Vec::new();
        }
        if self.mode == Mode::Compute && start_lsn != self.wal_start {
            let reason = format!(
                "the safekeepers' WAL ends at {start_lsn}, but this compute started at {}: another compute has written WAL since",
                self.wal_start
            );
            self.finish(Status::Fenced { reason: reason.clone() }, Outcome::Failed(reason));
            return Vec::new();
        }
        tracing::info!("elected in term {term}; own WAL starts at {start_lsn}; donor is safekeeper {}", self.addrs[donor]);
        self.elected = Some((term, start_lsn));
        self.store.set_own_start(start_lsn);
        self.set_status(Status::Streaming { term, start_lsn });
        self.progress();
        match self.mode {
            Mode::Compute => {
                let flushed = Lsn(self.shared.flushed.load(Ordering::SeqCst));
                self.store.set_flushed(flushed);
                let config = pgwal::DecoderConfig { segment_size_bytes: self.store.segment_size(), system_id: None };
                match pgwal::WalStreamDecoder::new(start_lsn, config) {
                    Ok(d) => {
                        self.decoder = Some(d);
                        self.record_end = start_lsn;
                    }
                    Err(e) => {
                        let reason = format!("cannot decode this compute's WAL from {start_lsn}: {e}");
                        self.finish(Status::Failed { reason: reason.clone() }, Outcome::Failed(reason));
                        return Vec::new();
                    }
                }
                match self.record_end(flushed) {
                    Some(end) => self.proposer.append(end),
                    None => Vec::new(),
                }
            }
            Mode::Sync => Vec::new(),
        }
    }

    fn on_stepped_down(&mut self, term: u64, seen: u64) {
        let who = self.handling.map_or_else(|| "a safekeeper".to_string(), |i| format!("safekeeper {}", self.addrs[i]));
        if self.mode == Mode::Compute && self.elected.is_some() {
            let reason = format!(
                "{who} accepted term {seen} from another compute (this one was elected in term {term}); this compute can no longer commit"
            );
            self.finish(Status::Fenced { reason: reason.clone() }, Outcome::Failed(reason));
            return;
        }
        self.elected = None;
        self.set_status(Status::Electing);
        self.schedule_retry(&format!("{who} has seen term {seen}, above this proposer's {term}"));
    }

    fn schedule_retry(&mut self, why: &str) {
        tracing::info!("{why}; retrying the election in {:?}", self.election_backoff);
        self.retry_at = Some(Instant::now() + self.election_backoff);
        self.election_backoff = (self.election_backoff * 2).min(self.reconnect_max.max(ELECTION_BACKOFF_MIN));
        self.progress();
    }

    /// Sync: done once the commit LSN reached the start LSN and a majority acknowledged a
    /// commit LSN at least that high (so each of them will serve WAL up to it).
    fn check_sync_done(&mut self) {
        let (Mode::Sync, Some((_, start))) = (self.mode, self.elected) else { return };
        self.progress();
        let majority = self.addrs.len() / 2 + 1;
        let acked = self.acked_commit.iter().filter(|&&c| c >= start).count();
        if self.commit_lsn >= start && acked >= majority {
            tracing::info!("synced: WAL up to {start} is committed on {acked} safekeepers");
            self.finish(Status::Streaming { term: self.proposer.term(), start_lsn: start }, Outcome::Synced(Some(start)));
        }
    }

    fn set_status(&mut self, status: Status) {
        let mut s = self.shared.status.lock().unwrap_or_else(|e| e.into_inner());
        if *s != status {
            *s = status;
            drop(s);
            (self.wake)();
        }
    }

    /// The end of the last whole record in the compute's WAL below `flushed`, decoding what
    /// was flushed since the last call. PostgreSQL flushes whole pages in the background, so
    /// its flush LSN can be inside a record; a safekeeper's WAL must not end there, or the
    /// next compute would start inside a record. `None` if decoding failed (the proposer has
    /// failed then).
    fn record_end(&mut self, flushed: Lsn) -> Option<Lsn> {
        const STEP: u64 = 4 << 20;
        if !self.whole_records {
            return Some(flushed);
        }
        let decoder = self.decoder.as_mut()?;
        let mut failure = None;
        'feed: while decoder.next_feed_lsn() < flushed {
            let from = decoder.next_feed_lsn();
            let to = Lsn(flushed.0.min(from.0 + STEP));
            match self.store.read(from, to) {
                Ok(bytes) => decoder.feed_bytes(&bytes),
                Err(e) => {
                    failure = Some(format!("cannot read this compute's WAL at {from}: {e}"));
                    break;
                }
            }
            loop {
                match decoder.poll_decode() {
                    Ok(Some(rec)) => self.record_end = rec.end_lsn().min(flushed),
                    Ok(None) => break,
                    Err(e) => {
                        failure = Some(format!("cannot decode this compute's WAL: {e}"));
                        break 'feed;
                    }
                }
            }
        }
        if let Some(reason) = failure {
            self.decoder = None;
            self.finish(Status::Failed { reason: reason.clone() }, Outcome::Failed(reason));
            return None;
        }
        Some(self.record_end)
    }

    fn finish(&mut self, status: Status, outcome: Outcome) {
        match &status {
            Status::Fenced { reason } | Status::Failed { reason } => tracing::error!("{reason}"),
            _ => {}
        }
        self.set_status(status);
        self.progress();
        self.done = true;
        self.shared.set_outcome(outcome);
        (self.wake)();
    }

    /// A one-line description of where the proposer stands, for a sync's timeout error.
    fn progress(&self) {
        let text = match self.elected {
            None => format!("electing (term {})", self.proposer.term()),
            Some((term, start)) => {
                let majority = self.addrs.len() / 2 + 1;
                let acked = self.acked_commit.iter().filter(|&&c| c >= start).count();
                format!(
                    "elected in term {term} at {start}; commit LSN {}; {acked} of the {majority} needed safekeepers acknowledged a commit LSN of at least {start}; {} bytes fetched from the donor",
                    self.commit_lsn,
                    self.store.fetched_bytes()
                )
            }
        };
        *self.shared.progress.lock().unwrap_or_else(|e| e.into_inner()) = text;
    }

    fn queue(&mut self, node: NodeId, msg: ProposerMessage) {
        if let Some(c) = &mut self.conns[node] {
            msg.encode(&mut c.out);
        }
    }

    fn write_out(&mut self) {
        for (i, slot) in self.conns.iter_mut().enumerate() {
            let Some(c) = slot else { continue };
            if c.out.is_empty() {
                continue;
            }
            let result = c.stream.write_all(&c.out);
            c.out.clear();
            if let Err(e) = result {
                // The reader thread sees the shutdown, reports the loss and reconnects.
                tracing::debug!(safekeeper = %self.addrs[i], "write failed: {e}");
                let _ = c.stream.shutdown(std::net::Shutdown::Both);
                *slot = None;
            }
        }
    }
}
