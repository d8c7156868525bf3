//! The core thread: owns the [`quorum::Proposer`], the [`WalStore`] and the safekeepers'
//! sockets once connected; reads and decodes what the safekeepers send, takes events from
//! the connecting threads and from `wal_flushed`, ticks the proposer every [`TICK`], and
//! carries out its actions.
//!
//! It sleeps in one `ppoll` on its eventfd ([`Bell`]) and the sockets: an acknowledgement
//! is read and handled by this thread, and a commit it completes releases its backend with
//! no other thread woken in between. Sockets are read and written with `MSG_DONTWAIT`, so
//! nothing here ever blocks but that `ppoll`: a safekeeper that stops reading cannot stall
//! the others, nor the reading of its own answers. Writes are queued per connection while
//! one turn's events and messages are handled, and written at the end of the turn (appends
//! coalesce); what the socket does not take waits for it to be writable (the proposer's
//! window bounds it). A connection whose socket fails, closes, sends something malformed,
//! or takes no bytes for [`WRITE_TIMEOUT`] is shut down and its connecting
//! thread told why; it reconnects, and the proposer is told with `reconnected(i)`.
//!
//! Policy is not decided here: `quorum::Proposer` in `Compute` or `Sync` mode says when this
//! compute is fenced, when a sync is done, when an election is lost, and commits (and lets a
//! sync end) only at the record boundaries given to `append`. This thread carries that out:
//! sockets, the clock (ticks, election backoff), the WAL store, decoding the compute's WAL
//! to find those boundaries, status and log lines.
//!
//! Invariants: once fenced or failed it sends nothing more, ever (the core stops, and so
//! does this thread). Bytes at or beyond the LSN PostgreSQL reported flushed are never sent
//! (the WAL store refuses them).

use crate::shared::{Event, FlushedElsewhere, Outcome, Shared, Status, Wake};
use crate::walstore::{WalReadError, WalStore};
use bytes::{Buf, BytesMut};
use proto::Lsn;
use quorum::wire::{AcceptorMessage, ProposerMessage};
use quorum::{FenceReason, NodeId, Proposer, ProposerAction, ProposerMode, Term, ToAcceptor, ToProposer};
use std::collections::VecDeque;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::bell::Bell;
use crate::tls_io::Tls;

/// How long the core's writes to a safekeeper may make no progress (a full socket buffer of
/// a stuck safekeeper) before it gives the connection up.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the proposer is ticked (resends of unanswered messages, stalled streams).
pub const TICK: Duration = Duration::from_millis(500);
/// How long a commit LSN that no WAL carried waits before it is sent on its own
/// (`quorum::ProposerConfig::defer_commit_lsn`): under load the next commit's WAL, a fraction
/// of a millisecond later, takes it along, and each safekeeper is spared a message, a wake-up
/// and an answer per commit. What waits for it is only what the safekeepers serve onwards
/// (the pageserver's ingest, replicas), a millisecond later when the compute is idle.
pub const COMMIT_ANNOUNCE_DELAY: Duration = Duration::from_millis(1);
/// The first delay before an election is retried; doubles up to `reconnect_max`.
const ELECTION_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// The compute's WAL is decoded this much at a time; each step is given to the proposer
/// with the end of the last whole record decoded so far as its boundary, so that WAL goes
/// out while a long flush is still being decoded.
const RECORD_STEP_BYTES: u64 = 4 << 20;
/// At most this many events are handled before queued writes go out.
const BATCH_EVENTS_MAX: usize = 256;
/// A socket is read in pieces of this size, and at most [`READ_TURN_BYTES`] of it per turn
/// (so that one safekeeper sending fetched WAL does not hold up the others' answers).
const READ_CHUNK_BYTES: usize = 256 * 1024;
const READ_TURN_BYTES: usize = 4 << 20;

struct Conn {
    stream: TcpStream,
    /// The TLS session over `stream`, with TLS on.
    tls: Option<Box<Tls>>,
    /// Bytes read and not yet decoded into messages.
    input: BytesMut,
    /// Bytes queued and not yet taken by the socket.
    out: BytesMut,
    /// Since when the socket has taken none of `out`.
    stalled_since: Option<Instant>,
    ended: Sender<String>,
}

pub struct Core {
    pub proposer: Proposer,
    pub store: WalStore,
    pub shared: Arc<Shared>,
    pub wake: Wake,
    pub addrs: Vec<String>,
    pub reconnect_max: Duration,
    /// See [`crate::Config::whole_records`].
    pub whole_records: bool,
    conns: Vec<Option<Conn>>,
    /// An election was started (once any connection existed).
    started: bool,
    /// `(term, start_lsn)` once elected.
    elected: Option<(Term, Lsn)>,
    commit_lsn: Lsn,
    retry_at: Option<Instant>,
    election_backoff: Duration,
    done: bool,
    /// Compute mode, once elected: decodes the compute's own WAL as it is flushed, so
    /// that the proposer learns where whole records end (see [`Core::record_ends`]).
    decoder: Option<pgwal::WalStreamDecoder>,
    /// The end of the last whole record decoded.
    record_end: Lsn,
    /// Per safekeeper: caught up with fetched WAL (it needs WAL below what this proposer can
    /// read itself), since when and from where, for the log line when it is through.
    catching_up: Vec<Option<(Instant, Lsn)>>,
    /// The safekeeper the last `FetchWal` went to.
    fetch_source: Option<NodeId>,
    /// The last segment found gone, for the error if that WAL is lost.
    gone: Option<String>,
    /// Where reads land before they are appended to a connection's input.
    chunk: Vec<u8>,
}

impl Core {
    pub fn new(
        proposer: Proposer,
        store: WalStore,
        shared: Arc<Shared>,
        wake: Wake,
        addrs: Vec<String>,
        reconnect_max: Duration,
        whole_records: bool,
    ) -> Core {
        let n = addrs.len();
        Core {
            proposer,
            store,
            shared,
            wake,
            addrs,
            reconnect_max,
            whole_records,
            conns: (0..n).map(|_| None).collect(),
            catching_up: vec![None; n],
            fetch_source: None,
            gone: None,
            started: false,
            elected: None,
            commit_lsn: Lsn(0),
            decoder: None,
            record_end: Lsn(0),
            retry_at: None,
            election_backoff: ELECTION_BACKOFF_MIN,
            done: false,
            chunk: vec![0; READ_CHUNK_BYTES],
        }
    }

    /// The thread's loop: sleeps on `bell` (rung by every event sent, and by other processes
    /// through a [`crate::Doorbell`], whose `flushed` is `flush_hint`) and the sockets, then
    /// reads what the safekeepers sent and takes what the channel holds.
    pub fn run(mut self, events: Receiver<Event>, bell: Arc<Bell>, flush_hint: Option<FlushedElsewhere>) {
        self.progress();
        let mut next_tick = Instant::now() + TICK;
        let mut announce_at: Option<Instant> = None;
        while !self.done {
            let now = Instant::now();
            let mut wait = next_tick.saturating_duration_since(now);
            for at in [self.retry_at, announce_at].into_iter().flatten() {
                wait = wait.min(at.saturating_duration_since(now));
            }
            let first = events.try_recv();
            let timeout = if matches!(first, Err(TryRecvError::Empty)) { wait } else { Duration::ZERO };
            let readable = self.wait(&bell, timeout);
            let first = match first {
                Err(TryRecvError::Empty) => events.try_recv(),
                other => other,
            };
            // Looked at every turn, rung or not: cheap, and a busy channel must not delay it.
            if let Some(hint) = &flush_hint {
                self.flushed_elsewhere(hint());
            }
            for node in readable {
                if !self.done {
                    self.read_from(node);
                }
            }
            match first {
                Ok(Event::Stop) | Err(TryRecvError::Disconnected) => break,
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
                Err(TryRecvError::Empty) => {}
            }
            let now = Instant::now();
            if !self.done && now >= next_tick {
                next_tick = now + TICK;
                // The pageserver's remote-consistent LSN, as the safekeepers report it, goes
                // to every safekeeper with the proposer's appends (the pageserver tells only
                // the one it streams from).
                self.proposer.set_remote_consistent_lsn(self.shared.remote_consistent_lsn());
                let actions = self.proposer.tick();
                self.perform(actions);
            }
            if !self.done && self.retry_at.is_some_and(|at| now >= at) {
                self.retry_at = None;
                tracing::debug!("starting an election");
                let actions = self.proposer.start_election();
                self.perform(actions);
            }
            if !self.done && announce_at.is_some_and(|at| now >= at) {
                let actions = self.proposer.announce_commit();
                self.perform(actions);
            }
            // Armed when the commit LSN moved past what the safekeepers were sent, and kept
            // (not pushed back) while more commits follow; disarmed once WAL carried it.
            announce_at = if self.proposer.commit_unannounced() { Some(announce_at.unwrap_or(now + COMMIT_ANNOUNCE_DELAY)) } else { None };
            if !self.done {
                self.report_catch_up();
            }
            self.write_out();
        }
        // Stopped while leading: the safekeepers learn the last commit LSN now (the shutdown
        // checkpoint's), not from the next compute's sync.
        if self.proposer.commit_unannounced() {
            let actions = self.proposer.announce_commit();
            self.perform(actions);
            self.write_out();
        }
        // Done for good (stopped, synced, fenced or failed): the connecting threads must see
        // the end, not a connection lost to report and retry (a sync's callers saw a WARN
        // for each safekeeper that closed first), so `stopping` is set before the sockets
        // close and the connections (with their `ended` senders) are dropped.
        self.shared.stop();
        for c in self.conns.iter().flatten() {
            let _ = c.stream.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Another process flushed WAL up to `lsn` (a compute's committing backend, through the
    /// doorbell): the same as `wal_flushed`, without a trip through the channel.
    fn flushed_elsewhere(&mut self, lsn: Lsn) {
        let previous = self.shared.flushed.fetch_max(lsn.0, Ordering::SeqCst);
        if lsn.0 > previous {
            self.on_event(Event::Flushed);
        }
    }

    fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Connected { node, stream, tls, leftover, ended } => {
                if let Some(old) = self.conns[node].take() {
                    let _ = old.stream.shutdown(std::net::Shutdown::Both);
                }
                self.conns[node] = Some(Conn { stream, tls, input: leftover, out: BytesMut::new(), stalled_since: None, ended });
                let actions = if self.started {
                    self.proposer.reconnected(node)
                } else {
                    self.started = true;
                    tracing::info!("starting the election");
                    self.proposer.start_election()
                };
                self.perform(actions);
                // What the safekeeper sent right after `HelloOk` (it may send `Feedback` at once).
                self.decode_input(node);
            }
            Event::Flushed => {
                self.shared.flush_pending.store(false, Ordering::SeqCst);
                let flushed = Lsn(self.shared.flushed.load(Ordering::SeqCst));
                self.store.set_flushed(flushed);
                if self.proposer.mode() == ProposerMode::Compute && self.elected.is_some() {
                    for (end, boundary) in self.record_ends(flushed) {
                        let actions = self.proposer.append(end, boundary);
                        self.perform(actions);
                    }
                }
            }
            Event::Stop => self.done = true,
        }
    }

    /// Sleeps until the bell rings, a connection's socket has something to read (or has
    /// room for queued bytes), or `timeout` passes; returns the connections to read.
    fn wait(&mut self, bell: &Bell, timeout: Duration) -> Vec<NodeId> {
        let mut nodes = Vec::with_capacity(self.conns.len());
        let mut fds = Vec::with_capacity(self.conns.len());
        for (i, c) in self.conns.iter().enumerate() {
            let Some(c) = c else { continue };
            // Over TLS, rustls may hold records to send even when `out` is empty (a reply of
            // its own, or what the socket did not take).
            let pending = !c.out.is_empty() || c.tls.as_ref().is_some_and(|t| t.wants_write());
            let events = if pending { libc::POLLIN | libc::POLLOUT } else { libc::POLLIN };
            nodes.push(i);
            fds.push(libc::pollfd { fd: c.stream.as_raw_fd(), events, revents: 0 });
        }
        bell.wait_with(&mut fds, timeout);
        // Readable, closed or failed: a read says which.
        let ready = libc::POLLIN | libc::POLLHUP | libc::POLLERR;
        nodes.into_iter().zip(fds).filter(|(_, f)| f.revents & ready != 0).map(|(i, _)| i).collect()
    }

    /// Reads what safekeeper `node`'s socket holds (up to [`READ_TURN_BYTES`]) and handles
    /// the messages in it; gives the connection up if it closed or failed.
    fn read_from(&mut self, node: NodeId) {
        let Some(c) = self.conns[node].as_mut() else { return };
        let fd = c.stream.as_raw_fd();
        if let Some(tls) = c.tls.as_mut() {
            let ended = match tls.read(fd, &mut c.input, READ_TURN_BYTES) {
                Ok(true) => Some("closed by the safekeeper".to_string()),
                Ok(false) => None,
                Err(e) => Some(e),
            };
            self.decode_input(node);
            if let Some(reason) = ended {
                self.drop_conn(node, reason);
            }
            return;
        }
        let mut total = 0;
        let ended = loop {
            // SAFETY: reads at most `chunk.len()` bytes into `chunk`, which lives across the
            // call; MSG_DONTWAIT makes it return at once when nothing is there.
            let n = unsafe { libc::recv(fd, self.chunk.as_mut_ptr().cast(), self.chunk.len(), libc::MSG_DONTWAIT) };
            if n > 0 {
                let n = n as usize;
                c.input.extend_from_slice(&self.chunk[..n]);
                total += n;
                if n < self.chunk.len() || total >= READ_TURN_BYTES {
                    break None;
                }
                continue;
            }
            if n == 0 {
                break Some("closed by the safekeeper".to_string());
            }
            let e = std::io::Error::last_os_error();
            match e.kind() {
                std::io::ErrorKind::Interrupted => {}
                std::io::ErrorKind::WouldBlock => break None,
                _ => break Some(format!("read failed: {e}")),
            }
        };
        // Messages that arrived before a close still count.
        self.decode_input(node);
        if let Some(reason) = ended {
            self.drop_conn(node, reason);
        }
    }

    /// Handles every whole message in safekeeper `node`'s input.
    fn decode_input(&mut self, node: NodeId) {
        while !self.done {
            let Some(c) = self.conns[node].as_mut() else { return };
            match AcceptorMessage::decode(&mut c.input) {
                Ok(Some(AcceptorMessage::Consensus(msg))) => self.on_message(node, msg),
                Ok(Some(AcceptorMessage::Feedback(f))) => self.shared.set_feedback(node, f),
                Ok(Some(AcceptorMessage::Standbys(list))) => self.shared.set_standbys(node, list),
                Ok(Some(AcceptorMessage::Error { message })) => {
                    return self.drop_conn(node, format!("safekeeper reported an error: {message}"));
                }
                Ok(Some(other @ AcceptorMessage::HelloOk { .. })) => {
                    return self.drop_conn(node, format!("protocol error: unexpected {other:?}"));
                }
                Ok(None) => return,
                Err(e) => return self.drop_conn(node, format!("protocol error from safekeeper: {e}")),
            }
        }
    }

    fn on_message(&mut self, node: NodeId, msg: ToProposer) {
        let actions = self.proposer.handle(node, msg);
        self.perform(actions);
        if self.proposer.mode() == ProposerMode::Sync && (self.elected.is_some() || !self.proposer.learners().is_empty()) {
            // A sync's timeout error tells how far it got (or who would not vote).
            self.progress();
        }
    }

    /// Gives the connection to safekeeper `node` up: shuts its socket down and tells its
    /// connecting thread why (which logs it and reconnects). What was queued for it is
    /// dropped; the proposer resends what matters after `reconnected`.
    fn drop_conn(&mut self, node: NodeId, reason: String) {
        if let Some(c) = self.conns[node].take() {
            let _ = c.stream.shutdown(std::net::Shutdown::Both);
            let _ = c.ended.send(reason);
        }
    }

    fn perform(&mut self, actions: Vec<ProposerAction>) {
        let mut queue: VecDeque<ProposerAction> = actions.into();
        while let Some(a) = queue.pop_front() {
            if self.done {
                return;
            }
            match a {
                ProposerAction::Send(i, msg) => {
                    if matches!(msg, ToAcceptor::FetchWal { .. }) {
                        self.fetch_source = Some(i);
                    }
                    self.queue(i, ProposerMessage::Consensus(msg))
                }
                ProposerAction::SendWal { to, term, begin, end, boundary_lsn, commit_lsn, peer_horizon_lsn, remote_consistent_lsn } => {
                    if self.conns[to].is_none() {
                        // Lost with the connection; the proposer resends after it rejoins.
                        continue;
                    }
                    match self.store.read(begin, end) {
                        Ok(data) => {
                            let msg = ToAcceptor::Append {
                                term,
                                begin_lsn: begin,
                                data,
                                boundary_lsn,
                                commit_lsn,
                                peer_horizon_lsn,
                                remote_consistent_lsn,
                            };
                            self.queue(to, ProposerMessage::Consensus(msg));
                        }
                        Err(e @ WalReadError::SegmentGone { lsn, .. }) => queue.extend(self.own_wal_gone(to, lsn, &e)),
                        Err(e) => {
                            let reason = format!("cannot send WAL to safekeeper {}: {e}", self.addrs[to]);
                            self.finish(Status::Failed { reason: reason.clone() }, Outcome::Failed(reason));
                        }
                    }
                }
                ProposerAction::StoreWal { from, data } => {
                    tracing::debug!("fetched {} bytes of WAL at {from}", data.len());
                    self.store.store(from, data);
                    self.note_fetched();
                }
                ProposerAction::ReleaseWal { below } => {
                    self.store.release_below(below);
                    self.note_fetched();
                }
                ProposerAction::WalLost { from, to, .. } => {
                    let gone = self.gone.take().unwrap_or_default();
                    let reason = format!(
                        "{gone}; no safekeeper acknowledged the WAL from {from} to {to}, which is gone from pg_wal: it can never be committed"
                    );
                    self.finish(Status::Failed { reason: reason.clone() }, Outcome::Failed(reason));
                }
                ProposerAction::Elected { term, start_lsn, donor } => queue.extend(self.on_elected(term, start_lsn, donor)),
                ProposerAction::Commit { commit_lsn, .. } => {
                    self.commit_lsn = commit_lsn;
                    self.shared.commit_lsn.store(commit_lsn.0, Ordering::SeqCst);
                    (self.wake)(self.commit_lsn);
                }
                ProposerAction::SteppedDown { term, seen, by } => {
                    self.elected = None;
                    self.set_status(Status::Electing);
                    self.schedule_retry(&format!("safekeeper {} has seen term {seen}, above this proposer's {term}", self.addrs[by]));
                }
                ProposerAction::ElectionLost { term, learners } if !learners.is_empty() => {
                    let names: Vec<&str> = learners.iter().map(|&i| self.addrs[i].as_str()).collect();
                    self.schedule_retry(&format!(
                        "the election in term {term} was refused: safekeepers {} have no record of this timeline (a lost disk, or a timeline never created on them) and do not vote until they have caught up in an election the others win",
                        names.join(", ")
                    ));
                }
                ProposerAction::ElectionLost { term, .. } => {
                    self.schedule_retry(&format!("the election in term {term} was refused (another proposer took the votes)"));
                }
                ProposerAction::Fenced { term, reason } => {
                    let reason = match reason {
                        FenceReason::WalMismatch { start_lsn, wal_start } => format!(
                            "the safekeepers' WAL ends at {start_lsn}, but this compute started at {wal_start}: another compute has written WAL since"
                        ),
                        FenceReason::HigherTerm { by, seen } => format!(
                            "safekeeper {} accepted term {seen} from another compute (this one was elected in term {term}); this compute can no longer commit",
                            self.addrs[by]
                        ),
                    };
                    self.finish(Status::Fenced { reason: reason.clone() }, Outcome::Failed(reason));
                }
                ProposerAction::SyncDone { term, lsn } => {
                    match lsn {
                        Some(lsn) => tracing::info!(
                            "synced in term {term}: WAL up to {lsn} is committed on {} safekeepers",
                            self.proposer.acked_commit_count(lsn)
                        ),
                        None => tracing::info!("synced in term {term}: no safekeeper has WAL for this timeline"),
                    }
                    let start_lsn = lsn.unwrap_or(Lsn(0));
                    self.finish(Status::Streaming { term, start_lsn }, Outcome::Synced(lsn));
                }
            }
        }
    }

    fn on_elected(&mut self, term: Term, start_lsn: Lsn, donor: NodeId) -> Vec<ProposerAction> {
        self.election_backoff = ELECTION_BACKOFF_MIN;
        tracing::info!("elected in term {term}; own WAL starts at {start_lsn}; donor is safekeeper {}", self.addrs[donor]);
        self.elected = Some((term, start_lsn));
        self.store.set_own_start(start_lsn);
        self.set_status(Status::Streaming { term, start_lsn });
        self.progress();
        if self.proposer.mode() != ProposerMode::Compute {
            return Vec::new();
        }
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
        self.record_ends(flushed).into_iter().flat_map(|(end, boundary)| self.proposer.append(end, boundary)).collect()
    }

    /// Safekeeper `to` needs WAL that the compute's `pg_wal` no longer has (it lagged more
    /// than `wal_keep_size` behind, as a safekeeper down for long does; or PostgreSQL removed
    /// the segment while it caught up). That is no reason to stop this compute, nor to leave
    /// the safekeeper behind: the core is told where `pg_wal` now begins, and fetches what
    /// the safekeeper lacks from another that has it, through bounded memory, until the
    /// safekeeper reaches WAL `pg_wal` still has (`quorum`'s `Proposer::wal_removed_below`).
    /// Only if no safekeeper has that WAL either does the core give up on it (`WalLost`).
    fn own_wal_gone(&mut self, to: NodeId, lsn: Lsn, e: &WalReadError) -> Vec<ProposerAction> {
        let floor = self.store.own_wal_floor(lsn);
        let line =
            format!("pg_wal no longer has the WAL below {floor} ({e}); safekeepers that need older WAL get it fetched from the others");
        tracing::info!(safekeeper = %self.addrs[to], "{line}");
        self.shared.notice(line);
        self.gone = Some(format!("cannot send WAL to safekeeper {}: {e}", self.addrs[to]));
        self.proposer.wal_removed_below(floor)
    }

    /// Logs when a safekeeper starts being caught up with fetched WAL (it needs WAL below
    /// what this proposer can read itself: below the elected start, or gone from `pg_wal`)
    /// and when it is through, so that an operator sees a lagging safekeeper come back.
    fn report_catch_up(&mut self) {
        let now: Vec<(NodeId, Lsn)> = self.proposer.catching_up();
        for i in 0..self.addrs.len() {
            let flush = now.iter().find(|(n, _)| *n == i).map(|(_, f)| *f);
            match (self.catching_up[i], flush) {
                (None, Some(from)) => {
                    let source = self.fetch_source.map_or("another safekeeper".to_string(), |s| format!("safekeeper {}", self.addrs[s]));
                    let line = format!(
                        "catching up safekeeper {} from {from}, below the WAL this proposer can read itself, with WAL fetched from {source}",
                        self.addrs[i]
                    );
                    tracing::info!("{line}");
                    self.shared.notice(line);
                    self.catching_up[i] = Some((Instant::now(), from));
                }
                (Some((since, from)), None) => {
                    let at = self.proposer.acceptor_flush().into_iter().find(|(n, _)| *n == i).map(|(_, f)| f);
                    let line = match at {
                        Some(at) => format!(
                            "safekeeper {} caught up from {from} to {at} in {:.1} s with fetched WAL; it streams from this proposer's own WAL now",
                            self.addrs[i],
                            since.elapsed().as_secs_f64()
                        ),
                        None => format!("safekeeper {} disconnected while it was caught up from {from}", self.addrs[i]),
                    };
                    tracing::info!("{line}");
                    self.shared.notice(line);
                    self.catching_up[i] = None;
                }
                _ => {}
            }
        }
    }

    /// Publishes the fetched WAL held in memory, and the most held at once.
    fn note_fetched(&self) {
        let bytes = self.store.fetched_bytes();
        self.shared.fetched_bytes.store(bytes, Ordering::SeqCst);
        self.shared.fetched_peak_bytes.fetch_max(bytes, Ordering::SeqCst);
    }

    fn schedule_retry(&mut self, why: &str) {
        tracing::info!("{why}; retrying the election in {:?}", self.election_backoff);
        self.retry_at = Some(Instant::now() + self.election_backoff);
        self.election_backoff = (self.election_backoff * 2).min(self.reconnect_max.max(ELECTION_BACKOFF_MIN));
        self.progress();
    }

    fn set_status(&mut self, status: Status) {
        let mut s = self.shared.status.lock().unwrap_or_else(|e| e.into_inner());
        if *s != status {
            *s = status;
            drop(s);
            (self.wake)(self.commit_lsn);
        }
    }

    /// What to give the proposer's `append` for the compute's WAL up to `flushed`, decoding
    /// what was flushed since the last call: per [`RECORD_STEP_BYTES`] decoded, the end of
    /// the step and the end of the last whole record decoded so far. PostgreSQL flushes whole
    /// pages in the background, so its flush LSN can be inside a record, and a record may be
    /// far longer than a step or a message: the proposer sends the bytes as they come, but
    /// commits, and lets the safekeepers' logs end for elections, only at the boundaries it
    /// is given, so that the next compute never starts inside a record (`quorum`'s "Record
    /// boundaries"). Empty if decoding failed (the proposer has failed then).
    fn record_ends(&mut self, flushed: Lsn) -> Vec<(Lsn, Lsn)> {
        if !self.whole_records {
            return vec![(flushed, flushed)];
        }
        let mut ends = Vec::new();
        let Some(decoder) = self.decoder.as_mut() else { return ends };
        let mut failure = None;
        'feed: while decoder.next_feed_lsn() < flushed {
            let from = decoder.next_feed_lsn();
            let to = Lsn(flushed.0.min(from.0 + RECORD_STEP_BYTES));
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
            ends.push((to, self.record_end));
        }
        if let Some(reason) = failure {
            self.decoder = None;
            self.finish(Status::Failed { reason: reason.clone() }, Outcome::Failed(reason));
            return Vec::new();
        }
        ends
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
        (self.wake)(self.commit_lsn);
    }

    /// A one-line description of where the proposer stands, for a sync's timeout error.
    fn progress(&self) {
        let text = match self.elected {
            None => {
                let learners: Vec<&str> = self.proposer.learners().into_iter().map(|i| self.addrs[i].as_str()).collect();
                if learners.is_empty() {
                    format!("electing (term {})", self.proposer.term())
                } else {
                    format!(
                        "electing (term {}); safekeepers {} have no record of this timeline (a lost disk, or a timeline never created on them) and do not vote until they have caught up in an election the others win",
                        self.proposer.term(),
                        learners.join(", ")
                    )
                }
            }
            Some((term, start)) => {
                let majority = quorum::majority(self.addrs.len());
                let acked = self.proposer.acked_commit_count(start);
                format!(
                    "elected in term {term} at {start}; commit LSN {}; {acked} of the {majority} needed safekeepers acknowledged a commit LSN of at least {start}; {} fetched bytes held",
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

    /// Gives each socket as much of its queued bytes as it takes without blocking.
    fn write_out(&mut self) {
        for node in 0..self.conns.len() {
            let Some(c) = self.conns[node].as_mut() else { continue };
            let fd = c.stream.as_raw_fd();
            if let Some(tls) = c.tls.as_mut() {
                let failed = match tls.write(fd, &mut c.out) {
                    Ok(progress) if progress || (c.out.is_empty() && !tls.wants_write()) => {
                        c.stalled_since = None;
                        None
                    }
                    Ok(_) => {
                        let since = *c.stalled_since.get_or_insert_with(Instant::now);
                        if since.elapsed() >= WRITE_TIMEOUT {
                            Some(format!("the safekeeper took none of {} queued bytes for {:?}", c.out.len(), WRITE_TIMEOUT))
                        } else {
                            None
                        }
                    }
                    Err(e) => Some(format!("write failed: {e}")),
                };
                if let Some(reason) = failed {
                    self.drop_conn(node, reason);
                }
                continue;
            }
            let failed = loop {
                if c.out.is_empty() {
                    c.stalled_since = None;
                    break None;
                }
                // SAFETY: sends from `out`'s initialised bytes; MSG_DONTWAIT returns at once
                // when the socket is full, MSG_NOSIGNAL turns a closed peer into EPIPE.
                let n = unsafe { libc::send(fd, c.out.as_ptr().cast(), c.out.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
                if n > 0 {
                    c.out.advance(n as usize);
                    c.stalled_since = None;
                    continue;
                }
                if n == 0 {
                    break None;
                }
                let e = std::io::Error::last_os_error();
                match e.kind() {
                    std::io::ErrorKind::Interrupted => {}
                    std::io::ErrorKind::WouldBlock => {
                        let since = *c.stalled_since.get_or_insert_with(Instant::now);
                        if since.elapsed() >= WRITE_TIMEOUT {
                            break Some(format!("the safekeeper took none of {} queued bytes for {:?}", c.out.len(), WRITE_TIMEOUT));
                        }
                        break None;
                    }
                    _ => break Some(format!("write failed: {e}")),
                }
            };
            if let Some(reason) = failed {
                self.drop_conn(node, reason);
            }
        }
    }
}
