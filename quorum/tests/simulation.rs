//! Seeded deterministic simulation of the consensus core: 3 acceptors, 2-3 proposers or
//! endpoints, a network that loses, delays, reorders and duplicates messages and cuts links
//! for a while, acceptor crashes (losing what was not persisted, including lazily written
//! commit LSNs) and restarts, lost disks (an acceptor back blank as a learner, one at a
//! time), and client appends of WAL records (which, like PostgreSQL's,
//! say how long they are, so the checker can tell where records end). Records are appended
//! in parts as often as not (a compute's flush ends inside a record, and it declares only
//! the end of the last whole one), and now and then one is longer than a piece and than the
//! window, so pieces are cut inside records.
//!
//! Even seeds run plain proposers (`ProposerMode::Plain`) that continue any log they are
//! elected with and are restarted at random, as before the endpoints existed. Odd seeds run
//! endpoints, as compute_ctl and a compute do: a sync (`ProposerMode::Sync`) finds the end of
//! the WAL, then a compute (`ProposerMode::Compute`) starts exactly there and writes records;
//! a lost election is retried after a doubling backoff. Endpoint 0 is the primary: fenced,
//! it syncs again (or now and then restarts an old compute without syncing). The others
//! are intruders that start at random: a sync and its compute, or a stale compute that
//! starts at an older LSN and tries to take over from the healthy one.
//!
//! After every step: at most one proposer elected per term; committed WAL is never
//! contradicted, is durable on a majority (counting an acceptor that lost its disk since), and is what every acceptor has below its commit
//! LSN; commit LSNs never go back; no reply before its persists; fetched WAL is the elected
//! history's; every acceptor's boundary LSN (what its greetings and votes report, and where
//! a sync ends), in memory and on disk, is the end of a whole record, at least its commit
//! LSN and at most its flush LSN; no acceptor's peer horizon (in memory
//! or durable) exceeds any acceptor's flush LSN. Acceptors remove WAL below their durable
//! peer horizon and commit LSN whenever they write them lazily, and fail the seed if the
//! core then asks them for removed WAL (a lagging acceptor's catch-up, a sync's or a
//! compute's fetch) or to truncate into it. A proposer's own WAL loses its oldest bytes at
//! random (up to its commit LSN, as a compute's `pg_wal` loses segments), so a lagging
//! acceptor's catch-up goes through WAL fetched mid-term, never more than `max_fetched` of
//! it held. A pageserver's remote-consistent LSN rises at
//! random up to the committed end; proposers learn it at their ticks, as the `walproposer` core thread
//! does, and every value an acceptor receives must be one the pageserver reported. On every
//! action: every peer horizon sent is at most every acceptor's flush LSN; a compute is elected
//! only at its own start; a fenced or synced proposer never acts again (it is still ticked,
//! asked to elect and sent replies); fencing has a true reason; a commit ends a record; a
//! sync ends at committed WAL, at a record boundary; an elected proposer asks for no vote.
//! At the end everything heals (but one acceptor, until a proposer that writes is elected
//! without it) and one endpoint brings all acceptors to identical WAL that holds everything
//! committed; then another acceptor goes down and that leader must commit with the other
//! two (the crate's "Late voters").
//!
//! `many_seeds` runs a fixed block of seeds, the same in every run, and a block that starts
//! at a random seed, new in every run, so that CI also explores seeds no run saw before.
//! `FJORD_SIM_SEEDS=N` sets the fixed block's size (default 2000) and `FJORD_SIM_SEED_START`
//! its first seed (default 0); `FJORD_SIM_RANDOM_SEEDS=N` sets the random block's size
//! (default 1000, 0 for none) and `FJORD_SIM_RANDOM_START=S` its first seed (default: drawn
//! at random from 2,000,000 up, above what `scripts/sim` runs by default, and printed).
//! `scripts/sim` runs many more fixed seeds in parallel shards. A failing seed panics with
//! the command that replays it: `FJORD_SIM_SEED=S` replays one seed in `replay_seed`; with
//! `FJORD_SIM_TRACE=1` it prints the events that shape elections and commits, to trace how
//! a failing seed's state arose.

mod support;

use proto::Lsn;
use quorum::{AcceptorState, FenceReason, NodeId, Proposer, ProposerAction, ProposerConfig, ProposerMode, Term, ToAcceptor, ToProposer};
use rand::Rng;
use std::collections::BTreeMap;
use support::{is_record_boundary, record, Disk, Node, SimRng, Store, Wal, WAL_START};

const ACCEPTORS: usize = 3;
const STEPS: usize = 350;

#[derive(Clone, Debug)]
enum Envelope {
    ToAcceptor {
        from: usize,
        to: NodeId,
        msg: ToAcceptor,
    },
    /// `ghost`: the acceptor's WAL when it sent a vote (test-only knowledge for the checker).
    ToProposer {
        from: NodeId,
        to: usize,
        msg: ToProposer,
        ghost: Option<Wal>,
    },
}

/// One proposer: an incarnation of an endpoint's sync or compute.
struct ProposerNode {
    core: Proposer,
    store: Store,
    /// Votes' WAL snapshots in the current election, by acceptor.
    ghosts: BTreeMap<NodeId, Wal>,
    /// Fenced or synced: any action from it now is a failure.
    stopped: bool,
    /// Replaced by a newer incarnation without stopping (a crash): no longer driven, and
    /// messages to it are lost.
    crashed: bool,
    /// Elected (as a compute or a sync).
    elected: bool,
    /// Where its own WAL starts (0 for a sync).
    wal_start: Lsn,
    /// Lost an election or stepped down: its shell starts another one at this time.
    retry_at: Option<u64>,
    /// The shell's election backoff: doubles on every lost election, as `walproposer`'s does,
    /// so that two endpoints' proposers stop dueling.
    backoff: u64,
    /// The rest of the record the client is writing: a compute flushes WAL that ends inside
    /// a record as often as not, and declares only the end of the last whole one.
    partial: Vec<u8>,
    /// The end of the last whole record given to the core.
    boundary: Lsn,
}

/// A compute endpoint: its current proposer, and where its next compute starts.
struct Endpoint {
    current: usize,
    /// The LSN its last sync returned, for the compute that follows it.
    next_start: Option<Lsn>,
}

struct Sim {
    rng: SimRng,
    now: u64,
    nodes: Vec<Option<Node>>,
    disks: Vec<Disk>,
    config: ProposerConfig,
    /// Every proposer ever started, by index; messages name these.
    proposers: Vec<ProposerNode>,
    endpoints: Vec<Endpoint>,
    /// Every LSN a compute has started at (what a stale restart picks from).
    compute_starts: Vec<Lsn>,
    /// (deliver at, message)
    /// Messages on their way, by (deliver at, sequence number).
    net: BTreeMap<(u64, u64), Envelope>,
    sent: u64,
    /// Messages due for delivery, delivered in random order.
    due: Vec<Envelope>,
    /// Cut links (proposer, acceptor).
    /// Cut links (proposer, acceptor), and when each heals by itself.
    cut: BTreeMap<(usize, NodeId), u64>,
    loss: f64,
    dup: f64,
    max_delay: u64,
    crash_in_handler: f64,
    // Checker state.
    elected: BTreeMap<Term, usize>,
    /// The committed WAL from WAL_START.
    committed: Vec<u8>,
    commits: usize,
    seen_commit: Vec<Lsn>,
    seen_disk_commit: Vec<Lsn>,
    next_payload: u64,
    /// Computes fenced at their election (their start is not the log's end: stale), and
    /// after it (a higher term: fenced by another endpoint's sync or a stale compute).
    fenced_stale: usize,
    fenced_later: usize,
    synced: usize,
    /// Times an acceptor removed WAL, and the highest LSN removed below.
    removals: usize,
    removed_max: Lsn,
    /// The pageserver's remote-consistent LSN (it rises to at most the committed end).
    remote_consistent_lsn: Lsn,
    /// Plain proposers instead of endpoints (they never move on).
    plain: bool,
    /// Disks lost (an acceptor back blank, as a learner).
    wipes: usize,
    /// Checks that found an acceptor whose WAL ends past its boundary LSN (inside a record).
    partial_ends: usize,
    /// Seeds whose final leader was elected while one acceptor was down, and committed with
    /// it once another went down (the crate's "Late voters").
    late_voter_commits: usize,
}

fn learner_disk() -> Disk {
    Disk { state: AcceptorState { learner: true, ..AcceptorState::default() }, ..Disk::default() }
}

type Check = Result<(), String>;

/// `FJORD_SIM_TRACE=1` with `replay_seed`: prints the events that shape elections and commits
/// (vote requests and elections as each acceptor takes them, with its state after, and the
/// proposers' actions other than messages: elected, commits, steps down; lost disks), to
/// trace how a failing seed's state arose.
fn tracing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("FJORD_SIM_TRACE").is_some())
}

fn committed_end(c: &[u8]) -> Lsn {
    Lsn(WAL_START.0 + c.len() as u64)
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut rng = SimRng::new(seed);
        let endpoints = rng.gen_range(2..=3);
        let loss = rng.gen_range(0.0..0.2);
        let dup = rng.gen_range(0.0..0.2);
        let max_delay = rng.gen_range(1..20);
        let crash_in_handler = rng.gen_range(0.0..0.05);
        // Small chunks and windows so appends split and streams throttle.
        let max_append = rng.gen_range(16..300);
        let max_fetch = rng.gen_range(16..500);
        let config = ProposerConfig {
            max_append,
            window: max_append * rng.gen_range(1..8),
            max_fetch,
            // As little as one fetch: a lagging acceptor's catch-up then waits for each.
            max_fetched: max_fetch * rng.gen_range(1..4),
            // walproposer defers commit-LSN-only appends; some runs send them at once.
            defer_commit_lsn: rng.gen_bool(0.5),
            ..ProposerConfig::default()
        };
        let mut sim = Sim {
            rng,
            now: 0,
            nodes: (0..ACCEPTORS).map(|_| Some(Node::start(&Disk::default()))).collect(),
            disks: vec![Disk::default(); ACCEPTORS],
            config,
            proposers: Vec::new(),
            endpoints: Vec::new(),
            compute_starts: vec![WAL_START],
            net: BTreeMap::new(),
            sent: 0,
            due: Vec::new(),
            cut: BTreeMap::new(),
            loss,
            dup,
            max_delay,
            crash_in_handler,
            elected: BTreeMap::new(),
            committed: Vec::new(),
            commits: 0,
            seen_commit: vec![Lsn(0); ACCEPTORS],
            seen_disk_commit: vec![Lsn(0); ACCEPTORS],
            next_payload: 1,
            fenced_stale: 0,
            fenced_later: 0,
            synced: 0,
            removals: 0,
            removed_max: Lsn(0),
            remote_consistent_lsn: Lsn(0),
            plain: false,
            wipes: 0,
            partial_ends: 0,
            late_voter_commits: 0,
        };
        // Odd seeds: endpoints that sync and compute. Even seeds: plain proposers that
        // continue any log they are elected with and stay, so that streaming, catch-up and
        // commits of long-lived leaders get as many steps as before the endpoints existed.
        let plain = seed.is_multiple_of(2);
        for _ in 0..endpoints {
            let p = if plain { sim.start_proposer(ProposerMode::Plain, WAL_START) } else { sim.start_proposer(ProposerMode::Sync, Lsn(0)) };
            sim.endpoints.push(Endpoint { current: p, next_start: None });
        }
        sim.plain = plain;
        sim
    }

    fn start_proposer(&mut self, mode: ProposerMode, wal_start: Lsn) -> usize {
        let config = ProposerConfig { mode, ..self.config };
        self.proposers.push(ProposerNode {
            core: Proposer::new(ACCEPTORS, wal_start, config).identified(self.proposers.len() as u64 + 1),
            store: Store { fetched_max: config.max_fetched, ..Store::default() },
            ghosts: BTreeMap::new(),
            stopped: false,
            crashed: false,
            elected: false,
            wal_start,
            retry_at: None,
            backoff: 10,
            partial: Vec::new(),
            boundary: Lsn(0),
        });
        self.proposers.len() - 1
    }

    /// Endpoint `e` moves on, as compute_ctl would: after a sync, a compute at the LSN it
    /// returned; after anything else, a sync. `stale`: a compute at an LSN some compute
    /// started at before, without syncing. The previous proposer, if still running, crashed.
    fn next_incarnation(&mut self, e: usize, stale: bool) -> Check {
        let old = self.endpoints[e].current;
        if !self.proposers[old].stopped {
            self.proposers[old].crashed = true;
        }
        let p = if stale {
            // Older than the committed WAL's end where there is such a start: a compute that
            // restarts there is behind the log for sure.
            let end = committed_end(&self.committed);
            let old: Vec<Lsn> = self.compute_starts.iter().copied().filter(|&l| l < end).collect();
            let choices = if old.is_empty() { &self.compute_starts } else { &old };
            let start = choices[self.rng.gen_range(0..choices.len())];
            self.start_proposer(ProposerMode::Compute, start)
        } else if let Some(start) = self.endpoints[e].next_start.take() {
            self.compute_starts.push(start);
            self.start_proposer(ProposerMode::Compute, start)
        } else {
            self.start_proposer(ProposerMode::Sync, Lsn(0))
        };
        self.endpoints[e].current = p;
        self.start_election(p)
    }

    fn link_up(&self, p: usize, a: NodeId) -> bool {
        !self.cut.contains_key(&(p, a))
    }

    fn send(&mut self, env: Envelope) {
        if self.rng.gen_bool(self.loss) {
            return;
        }
        let copies = if self.rng.gen_bool(self.dup) { 2 } else { 1 };
        for _ in 0..copies {
            let at = self.now + self.rng.gen_range(0..=self.max_delay);
            self.sent += 1;
            self.net.insert((at, self.sent), env.clone());
        }
    }

    fn proposer_actions(&mut self, p: usize, actions: Vec<ProposerAction>) -> Check {
        if self.proposers[p].stopped {
            if let Some(a) = actions.first() {
                return Err(format!("proposer {p} acted after it stopped: {a:?}"));
            }
        }
        let count = actions.len();
        for (i, a) in actions.into_iter().enumerate() {
            if matches!(a, ProposerAction::Fenced { .. } | ProposerAction::SyncDone { .. }) && i + 1 != count {
                return Err(format!("proposer {p}: actions follow {a:?}"));
            }
            if matches!(a, ProposerAction::Send(_, ToAcceptor::VoteRequest { .. })) && self.proposers[p].core.is_leader() {
                // A learner may join an election whose vote request it saw: one sent once
                // elected could reach a learner whose earlier incarnation acknowledged WAL
                // in this term, or voted in a higher one (the crate's "Learners").
                return Err(format!("proposer {p} asks for a vote while elected: {a:?}"));
            }
            if let ProposerAction::SendWal { to, peer_horizon_lsn, remote_consistent_lsn, .. } = a {
                // The peer horizon lets acceptors remove WAL: it must never be above any
                // acceptor's flush LSN (what the proposer knows of it, and what it really is).
                for (b, d) in self.disks.iter().enumerate().filter(|(_, d)| !d.state.learner) {
                    if peer_horizon_lsn > d.state.flush_lsn {
                        return Err(format!(
                            "proposer {p} sends acceptor {to} the peer horizon {peer_horizon_lsn}, above acceptor {b}'s flush LSN {}",
                            d.state.flush_lsn
                        ));
                    }
                }
                if remote_consistent_lsn > self.remote_consistent_lsn {
                    return Err(format!("proposer {p} relays the remote-consistent LSN {remote_consistent_lsn}, never reported"));
                }
            }
            if let Some((to, msg)) = self.proposers[p].store.message(&a)? {
                self.send(Envelope::ToAcceptor { from: p, to, msg });
                continue;
            }
            if tracing() && !matches!(a, ProposerAction::StoreWal { .. } | ProposerAction::ReleaseWal { .. }) {
                eprintln!("t={} proposer {p} ({:?}): {a:?}", self.now, self.proposers[p].core.mode());
            }
            match a {
                ProposerAction::Elected { term, start_lsn, donor } => {
                    if let Some(&other) = self.elected.get(&term) {
                        if other != p {
                            return Err(format!("proposers {other} and {p} both elected in term {term}"));
                        }
                    }
                    self.elected.insert(term, p);
                    let pn = &mut self.proposers[p];
                    pn.elected = true;
                    if pn.core.mode() == ProposerMode::Compute && start_lsn != pn.wal_start {
                        return Err(format!("compute {p} elected at {start_lsn}, not at its own start {}", pn.wal_start));
                    }
                    let donor_log = pn.ghosts.get(&donor).cloned().ok_or("elected without the donor's vote")?;
                    if start_lsn != donor_log.end() && !(donor_log.bytes.is_empty() && start_lsn == WAL_START) {
                        return Err(format!("start LSN {start_lsn} is not the donor's boundary LSN {}", donor_log.end()));
                    }
                    pn.store.elected(start_lsn, &donor_log, &self.committed)?;
                    // A record cut short in an earlier term is gone: the term starts at the
                    // end of a whole one.
                    pn.partial.clear();
                    pn.boundary = start_lsn;
                }
                ProposerAction::Commit { term, commit_lsn } => {
                    let log = self.proposers[p].store.committed(commit_lsn)?;
                    if !is_record_boundary(log, commit_lsn) {
                        return Err(format!("term {term} commits up to {commit_lsn}, inside a record"));
                    }
                    let n = log.len().min(self.committed.len());
                    if log[..n] != self.committed[..n] {
                        return Err(format!("term {term} commits up to {commit_lsn} WAL that differs from what was committed"));
                    }
                    if log.len() > self.committed.len() {
                        self.committed = log.to_vec();
                    }
                    self.commits += 1;
                }
                ProposerAction::Fenced { term, reason } => {
                    let pn = &mut self.proposers[p];
                    if pn.core.mode() != ProposerMode::Compute || !pn.core.is_stopped() {
                        return Err(format!("proposer {p} fenced in term {term}, but it is not a stopped compute"));
                    }
                    match reason {
                        FenceReason::WalMismatch { start_lsn, wal_start } if start_lsn == wal_start => {
                            return Err(format!("compute {p} fenced in term {term} although the WAL ends at its start {wal_start}"))
                        }
                        FenceReason::HigherTerm { seen, .. } if !pn.elected || seen <= term => {
                            return Err(format!("compute {p} fenced by term {seen} in term {term} (elected: {})", pn.elected))
                        }
                        FenceReason::WalMismatch { .. } => self.fenced_stale += 1,
                        FenceReason::HigherTerm { .. } => self.fenced_later += 1,
                    }
                    pn.stopped = true;
                }
                ProposerAction::SyncDone { term, lsn } => {
                    let pn = &mut self.proposers[p];
                    if pn.core.mode() != ProposerMode::Sync || !pn.core.is_stopped() {
                        return Err(format!("proposer {p} synced in term {term}, but it is not a stopped sync"));
                    }
                    pn.stopped = true;
                    self.synced += 1;
                    if let Some(lsn) = lsn {
                        // The sync ends where its own term starts, on committed WAL, at the end
                        // of a record: the next compute starts there.
                        if pn.core.wal_range().is_some() || !pn.elected {
                            return Err(format!("sync {p} done at {lsn} without being elected"));
                        }
                        if lsn > committed_end(&self.committed) {
                            return Err(format!("sync {p} ends at {lsn}, beyond the committed {}", committed_end(&self.committed)));
                        }
                        if !is_record_boundary(&self.committed, lsn) {
                            return Err(format!("sync {p} ends at {lsn}, inside a record"));
                        }
                    }
                    let e = self.endpoints.iter().position(|e| e.current == p).ok_or("a sync without an endpoint")?;
                    self.endpoints[e].next_start = Some(lsn.unwrap_or(WAL_START));
                }
                ProposerAction::SteppedDown { .. } | ProposerAction::ElectionLost { .. } => {
                    if self.proposers[p].core.is_stopped() {
                        return Err(format!("proposer {p} stepped down after it stopped"));
                    }
                    // Its shell retries after a backoff. (Plain proposers are restarted only at
                    // random: retrying ones that never stop would duel forever.)
                    if self.proposers[p].core.mode() != ProposerMode::Plain {
                        let backoff = self.proposers[p].backoff;
                        self.proposers[p].retry_at = Some(self.now + self.rng.gen_range(backoff / 2..=backoff));
                        self.proposers[p].backoff = (backoff * 2).min(320);
                    }
                }
                ProposerAction::WalLost { term, from, to } => {
                    // Its own WAL is dropped only below its commit LSN, which acceptors
                    // acknowledged in its term: never lost.
                    return Err(format!("proposer {p} in term {term} lost its WAL {from}..{to}"));
                }
                ProposerAction::Send(..)
                | ProposerAction::SendWal { .. }
                | ProposerAction::StoreWal { .. }
                | ProposerAction::ReleaseWal { .. } => {}
            }
        }
        Ok(())
    }

    /// The current proposer of a random endpoint.
    fn some_proposer(&mut self) -> usize {
        let e = self.rng.gen_range(0..self.endpoints.len());
        self.endpoints[e].current
    }

    fn deliver(&mut self, env: Envelope) -> Check {
        match env {
            Envelope::ToAcceptor { from, to, msg } => {
                if !self.link_up(from, to) {
                    return Ok(());
                }
                let Some(node) = self.nodes[to].as_mut() else { return Ok(()) };
                let crash = self.rng.gen_bool(self.crash_in_handler);
                let keep = if crash { Some(self.rng.gen_range(0..3)) } else { None };
                let shown = tracing() && matches!(msg, ToAcceptor::VoteRequest { .. } | ToAcceptor::Elected { .. });
                let before = shown.then(|| format!("{msg:?}"));
                let (replies, crashed) = node.handle(&mut self.disks[to], msg, keep).map_err(|e| format!("acceptor {to}: {e}"))?;
                if let Some(before) = before {
                    let s = self.disks[to].state.clone();
                    eprintln!(
                        "t={} proposer {from} -> acceptor {to}: {before}; now term {} history {:?} flush {} boundary {} commit {} learner {} crashed {crashed} replies {replies:?}",
                        self.now, s.term, s.history.0.iter().map(|e| (e.term, e.lsn.0)).collect::<Vec<_>>(), s.flush_lsn, s.boundary_lsn,
                        node.acceptor.state().commit_lsn, s.learner
                    );
                }
                if crashed {
                    self.nodes[to] = None;
                    return Ok(());
                }
                for msg in replies {
                    // (Of a granted vote only: a refusal, such as a learner's, never makes a donor.)
                    // The log as the vote offers it: up to its boundary LSN.
                    let ghost = match &msg {
                        ToProposer::Vote { granted: true, boundary_lsn, .. } => {
                            let mut wal = self.disks[to].wal.clone();
                            wal.bytes.truncate(boundary_lsn.0.saturating_sub(wal.begin.0) as usize);
                            Some(wal)
                        }
                        _ => None,
                    };
                    self.send(Envelope::ToProposer { from: to, to: from, msg, ghost });
                }
            }
            Envelope::ToProposer { from, to, msg, ghost } => {
                if !self.link_up(to, from) || self.proposers[to].crashed {
                    return Ok(());
                }
                if let (Some(g), ToProposer::Vote { term, .. }) = (ghost, &msg) {
                    if *term == self.proposers[to].core.term() {
                        self.proposers[to].ghosts.insert(from, g);
                    }
                }
                let actions = self.proposers[to].core.handle(from, msg);
                self.proposer_actions(to, actions)?;
            }
        }
        Ok(())
    }

    fn deliver_random(&mut self) -> Check {
        while let Some(entry) = self.net.first_entry() {
            if entry.key().0 > self.now {
                break;
            }
            self.due.push(entry.remove());
        }
        // One message, or more when many are due: a network that delivers less than its
        // proposers send would make every message wait longer and longer, and elections
        // would stop completing.
        let count = 1 + self.due.len() / 4;
        for _ in 0..count {
            if self.due.is_empty() {
                break;
            }
            let i = self.rng.gen_range(0..self.due.len());
            let env = self.due.swap_remove(i);
            self.deliver(env)?;
        }
        Ok(())
    }

    fn client_append(&mut self, p: usize) -> Check {
        if self.proposers[p].core.mode() == ProposerMode::Sync || self.proposers[p].core.wal_range().is_none() {
            return Ok(());
        }
        if self.proposers[p].partial.is_empty() {
            // Mostly short records; now and then one longer than a piece (`max_append` is
            // at most 300) and than the window, so that pieces are cut inside records.
            let len = if self.rng.gen_bool(0.08) { self.rng.gen_range(300..3000) } else { self.rng.gen_range(2..200) };
            self.proposers[p].partial = record(self.next_payload, len);
            self.next_payload += 1;
        }
        // The whole rest of the record, or only part of it (a flush inside the record).
        let rest = self.proposers[p].partial.len();
        let n = if self.rng.gen_bool(0.5) { rest } else { self.rng.gen_range(1..=rest) };
        let pn = &mut self.proposers[p];
        let bytes: Vec<u8> = pn.partial.drain(..n).collect();
        let end = pn.store.client_append(&bytes);
        if pn.partial.is_empty() {
            pn.boundary = end;
        }
        let actions = pn.core.append(end, pn.boundary);
        self.proposer_actions(p, actions)
    }

    fn start_election(&mut self, p: usize) -> Check {
        self.proposers[p].ghosts.clear();
        self.proposers[p].retry_at = None;
        let actions = self.proposers[p].core.start_election();
        self.proposer_actions(p, actions)
    }

    /// A learner that has not joined proposer `p`'s term (it missed the vote request).
    fn learner_left_out(&self, p: usize) -> bool {
        let term = self.proposers[p].core.term();
        self.disks.iter().any(|d| d.state.learner && d.state.history.last_term() != term)
    }

    /// Acceptor `a` loses its disk: it restarts blank, a learner, as a safekeeper whose
    /// timeline is created again by a proposer's hello. A restarted process has new
    /// connections: what was on its way to or from it is lost, and every proposer's shell
    /// reconnects (as `walproposer`'s does when a connection fails).
    fn wipe(&mut self, a: NodeId) -> Check {
        if tracing() {
            eprintln!("t={} acceptor {a} loses its disk: {:?}", self.now, self.disks[a].state);
        }
        self.disks[a] = learner_disk();
        self.nodes[a] = Some(Node::start(&self.disks[a]));
        self.seen_commit[a] = Lsn(0);
        self.seen_disk_commit[a] = Lsn(0);
        self.wipes += 1;
        let involves = |env: &Envelope| match env {
            Envelope::ToAcceptor { to, .. } => *to == a,
            Envelope::ToProposer { from, .. } => *from == a,
        };
        self.net.retain(|_, env| !involves(env));
        self.due.retain(|env| !involves(env));
        for p in 0..self.proposers.len() {
            if !self.proposers[p].crashed {
                self.heal(p, a)?;
            }
        }
        Ok(())
    }

    fn restart(&mut self, a: NodeId) {
        if self.nodes[a].is_none() {
            self.nodes[a] = Some(Node::start(&self.disks[a]));
            self.seen_commit[a] = self.disks[a].state.commit_lsn;
        }
    }

    fn step(&mut self) -> Check {
        self.now += 1;
        let roll = self.rng.gen_range(0..100);
        match roll {
            0..=39 => self.deliver_random()?,
            40..=59 => {
                let p = self.some_proposer();
                // the `walproposer` core thread passes the highest remote-consistent LSN of the
                // acceptors' feedback to the proposer before each tick.
                if self.rng.gen_bool(0.5) {
                    let lsn = self.remote_consistent_lsn;
                    self.proposers[p].core.set_remote_consistent_lsn(lsn);
                }
                if self.rng.gen_bool(0.6) {
                    self.drop_own_wal(p)?;
                }
                // the `walproposer` core thread announces a deferred commit LSN a moment after it moved,
                // between its ticks.
                let actions = if self.rng.gen_bool(0.5) && self.proposers[p].core.commit_unannounced() {
                    self.proposers[p].core.announce_commit()
                } else {
                    self.proposers[p].core.tick()
                };
                self.proposer_actions(p, actions)?;
            }
            60..=61 => {
                // A retried election; or, once stopped, the endpoint's next proposer. The
                // stopped one is asked first: it must not start anything.
                let e = self.rng.gen_range(0..self.endpoints.len());
                let p = self.endpoints[e].current;
                // A compute's or sync's shell starts an election only after it lost one (at
                // `retry_at`); a plain proposer restarts at random, even when elected.
                if self.plain || self.proposers[p].stopped {
                    self.start_election(p)?;
                }
                if self.proposers[p].stopped {
                    self.next_incarnation(e, false)?;
                }
            }
            62..=78 => {
                let p = self.some_proposer();
                for _ in 0..self.rng.gen_range(1..4) {
                    self.client_append(p)?;
                }
            }
            79..=80 => {
                // The lazy write of an acceptor's commit LSN and peer horizon, and WAL removal
                // below them; and the pageserver makes progress.
                let a = self.rng.gen_range(0..ACCEPTORS);
                self.persist_lazy_and_remove(a);
                let end = committed_end(&self.committed).0;
                if end > self.remote_consistent_lsn.0 {
                    self.remote_consistent_lsn = Lsn(self.rng.gen_range(self.remote_consistent_lsn.0..=end));
                }
            }
            81..=82 => {
                let a = self.rng.gen_range(0..ACCEPTORS);
                self.nodes[a] = None;
            }
            83..=87 => {
                let a = self.rng.gen_range(0..ACCEPTORS);
                self.restart(a);
            }
            88..=90 => {
                let (p, a) = (self.some_proposer(), self.rng.gen_range(0..ACCEPTORS));
                if self.cut.remove(&(p, a)).is_none() {
                    let heal_at = self.now + self.rng.gen_range(10..300);
                    self.cut.insert((p, a), heal_at);
                } else {
                    self.heal(p, a)?;
                }
            }
            92 if self.rng.gen_bool(0.3) && self.disks.iter().all(|d| !d.state.learner) => {
                // A disk is lost and replaced: the acceptor comes back blank, as a learner
                // (one at a time: losing two of three copies is beyond any quorum).
                let a = self.rng.gen_range(0..ACCEPTORS);
                self.wipe(a)?;
            }
            91 if !self.plain && self.rng.gen_bool(0.6) => {
                // An endpoint crashes and restarts, or an intruder starts: a sync, or a stale
                // compute that starts at an older LSN and tries to take over.
                let e = self.rng.gen_range(0..self.endpoints.len());
                let stale = self.rng.gen_bool(0.5);
                self.next_incarnation(e, stale)?;
            }
            _ => self.deliver_random()?,
        }
        // Partitions end by themselves too: a link cut for good would leave a proposer that
        // reaches no majority stuck for the rest of the seed.
        let healed: Vec<(usize, NodeId)> = self.cut.iter().filter(|(_, &at)| at <= self.now).map(|(&k, _)| k).collect();
        for (p, a) in healed {
            self.cut.remove(&(p, a));
            self.heal(p, a)?;
        }
        // compute_ctl moves on soon after its proposer stopped: after a sync it starts the
        // compute; the primary endpoint (0) also restarts after its compute was fenced,
        // sometimes as an old compute without syncing first. The others are intruders that
        // come back only at random (above). A proposer that lost an election tries again
        // after its backoff.
        for e in 0..self.endpoints.len() {
            let p = self.endpoints[e].current;
            let moves_on = e == 0 || self.endpoints[e].next_start.is_some();
            if self.proposers[p].stopped && moves_on && self.rng.gen_bool(0.2) {
                let stale = self.rng.gen_bool(0.1);
                self.next_incarnation(e, stale)?;
            } else if self.proposers[p].retry_at.is_some_and(|at| at <= self.now) {
                self.proposers[p].retry_at = None;
                self.start_election(p)?;
            }
        }
        self.check()
    }

    /// The compute's PostgreSQL removes old `pg_wal` segments (a checkpoint), whatever the
    /// acceptors still need: proposer `p`'s own WAL loses its oldest bytes, up to a random LSN
    /// at most its commit LSN (which acceptors acknowledged in its term; dropping WAL nobody
    /// acknowledged is `WalLost`, which a compute keeping `wal_keep_size` never meets). An
    /// acceptor that lags behind then catches up through WAL fetched mid-term.
    fn drop_own_wal(&mut self, p: usize) -> Check {
        let pn = &mut self.proposers[p];
        let Some(commit) = pn.core.commit_lsn() else { return Ok(()) };
        let begin = pn.store.wal.begin;
        if commit <= begin || pn.stopped {
            return Ok(());
        }
        let lsn = Lsn(self.rng.gen_range(begin.0..=commit.0));
        pn.store.drop_own_below(lsn);
        let actions = pn.core.wal_removed_below(lsn);
        self.proposer_actions(p, actions)
    }

    /// Acceptor `a` (if running) writes its commit LSN and peer horizon and removes WAL below
    /// them.
    fn persist_lazy_and_remove(&mut self, a: NodeId) {
        if let Some(n) = &self.nodes[a] {
            if n.persist_lazy_and_remove(&mut self.disks[a]) {
                self.removals += 1;
                self.removed_max = self.removed_max.max(self.disks[a].removed_below);
            }
        }
    }

    /// A cut link is back: the proposer's shell reconnects.
    fn heal(&mut self, p: usize, a: NodeId) -> Check {
        if self.proposers[p].crashed {
            return Ok(());
        }
        let actions = self.proposers[p].core.reconnected(a);
        self.proposer_actions(p, actions)
    }

    /// Safety invariants that must hold after every step.
    /// One step of a final phase: proposer `p` ticks (one step in ten) or a random message
    /// is delivered; every 16th step the invariants are checked.
    fn tick_or_deliver(&mut self, p: usize, i: usize) -> Check {
        if self.rng.gen_bool(0.1) {
            let actions = self.proposers[p].core.tick();
            self.proposer_actions(p, actions)?;
        } else {
            self.deliver_random()?;
        }
        if i.is_multiple_of(16) {
            self.check()?;
        }
        Ok(())
    }

    fn check(&mut self) -> Check {
        let end = committed_end(&self.committed);
        for a in 0..ACCEPTORS {
            let disk = &self.disks[a];
            if disk.state.commit_lsn < self.seen_disk_commit[a] {
                return Err(format!("acceptor {a}: durable commit LSN went back"));
            }
            self.seen_disk_commit[a] = disk.state.commit_lsn;
            let mut commits = vec![("disk", disk.state.commit_lsn, disk.state.flush_lsn)];
            if let Some(n) = &self.nodes[a] {
                let s = n.acceptor.state();
                if s.commit_lsn < self.seen_commit[a] {
                    return Err(format!("acceptor {a}: commit LSN went back"));
                }
                self.seen_commit[a] = s.commit_lsn;
                if s.flush_lsn != disk.state.flush_lsn {
                    return Err(format!("acceptor {a}: flush LSN {} in memory, {} on disk", s.flush_lsn, disk.state.flush_lsn));
                }
                commits.push(("memory", s.commit_lsn, s.flush_lsn));
            }
            for (what, commit, flush) in commits {
                if commit > flush {
                    return Err(format!("acceptor {a} ({what}): commit LSN {commit} beyond flush LSN {flush}"));
                }
                if commit > end {
                    return Err(format!("acceptor {a} ({what}): commit LSN {commit} never committed (committed up to {end})"));
                }
                if commit > WAL_START {
                    let from = disk.wal.begin.max(WAL_START);
                    let mine = disk.wal.range(from, commit)?;
                    let theirs = &self.committed[(from.0 - WAL_START.0) as usize..];
                    if mine != &theirs[..mine.len()] {
                        return Err(format!("acceptor {a} ({what}): WAL below its commit LSN {commit} differs from committed WAL"));
                    }
                }
            }
            // The peer horizon: WAL below it is on every acceptor for good, which is what
            // makes removing it safe.
            let mut horizons = vec![("disk", disk.state.peer_horizon_lsn)];
            if let Some(n) = &self.nodes[a] {
                horizons.push(("memory", n.acceptor.state().peer_horizon_lsn));
                if n.remote_consistent_lsn > self.remote_consistent_lsn {
                    return Err(format!("acceptor {a}: remote-consistent LSN {} never reported", n.remote_consistent_lsn));
                }
            }
            // (A learner that lost its disk is below the others' horizons until it caught
            // up: its log begins at a horizon, and it does not vote until then.)
            for (what, horizon) in horizons {
                for (b, other) in self.disks.iter().enumerate().filter(|(_, d)| !d.state.learner) {
                    if horizon > other.state.flush_lsn {
                        return Err(format!(
                            "acceptor {a} ({what}): peer horizon {horizon} above acceptor {b}'s flush LSN {}",
                            other.state.flush_lsn
                        ));
                    }
                }
            }
            // Pieces are cut anywhere, but the end of the log an election sees (and that a
            // sync ends at), the boundary LSN, is always the end of a whole record, in memory
            // and on disk; the commit LSN never passes it, and it never passes the WAL.
            let mut boundaries = vec![("disk", &disk.state)];
            if let Some(n) = &self.nodes[a] {
                boundaries.push(("memory", n.acceptor.state()));
            }
            if disk.state.flush_lsn > disk.state.boundary_lsn {
                self.partial_ends += 1;
            }
            for (what, s) in boundaries {
                if s.commit_lsn > s.boundary_lsn || s.boundary_lsn > s.flush_lsn {
                    return Err(format!(
                        "acceptor {a} ({what}): commit LSN {}, boundary LSN {}, flush LSN {} out of order",
                        s.commit_lsn, s.boundary_lsn, s.flush_lsn
                    ));
                }
                if let Some(whole) = disk.wal.whole_log(&self.committed) {
                    if s.boundary_lsn.is_valid() && !is_record_boundary(&whole, s.boundary_lsn) {
                        return Err(format!("acceptor {a} ({what}): its boundary LSN {} is inside a record", s.boundary_lsn));
                    }
                }
                if !disk.wal.bytes.is_empty() && disk.wal.end() > disk.wal.begin && s.boundary_lsn < disk.wal.begin {
                    return Err(format!(
                        "acceptor {a} ({what}): boundary LSN {} below its log's beginning {}",
                        s.boundary_lsn, disk.wal.begin
                    ));
                }
            }
        }
        // The committed WAL is durable on a majority: a log that begins later (a learner's)
        // holds what it has of it; a learner that has not got it yet counts too, since it
        // lost its disk after the commit (the fault this simulation allows once at a time).
        if end > WAL_START {
            let holds = |d: &Disk| {
                let from = d.wal.begin.max(WAL_START);
                d.state.learner || d.wal.range(from, end).is_ok_and(|w| w == &self.committed[(from.0 - WAL_START.0) as usize..])
            };
            let holders = self.disks.iter().filter(|d| holds(d)).count();
            if holders <= ACCEPTORS / 2 {
                let shapes: Vec<String> = self
                    .disks
                    .iter()
                    .map(|d| format!("{}..{} term {} learner {}", d.wal.begin, d.wal.end(), d.state.term, d.state.learner))
                    .collect();
                return Err(format!("committed WAL up to {end} is durable on only {holders} acceptors: {}", shapes.join(", ")));
            }
        }
        Ok(())
    }

    /// After `finish` caught everyone up: another acceptor than the one that was away during
    /// `p`'s election (`away`: that one and `p`'s term), or any, goes down, and `p` must
    /// commit a new record with the other two.
    fn commit_with_one_down(&mut self, p: usize, away: Option<(NodeId, usize, Term)>) -> Check {
        if !self.proposers[p].core.is_leader() || self.proposers[p].core.mode() == ProposerMode::Sync {
            // (A compute fenced since it appended: nothing more to see.)
            return Ok(());
        }
        let others: Vec<NodeId> = (0..ACCEPTORS).filter(|&a| away.is_none_or(|(w, _, _)| w != a)).collect();
        let down = others[self.rng.gen_range(0..others.len())];
        self.nodes[down] = None;
        let pn = &mut self.proposers[p];
        let term = pn.core.term();
        let end = pn.store.client_append(&record(u64::MAX - 2 * term - 1, 2));
        pn.boundary = end;
        let actions = pn.core.append(end, end);
        self.proposer_actions(p, actions)?;
        for i in 0..5000 {
            self.now += 1;
            self.tick_or_deliver(p, i)?;
            if self.proposers[p].core.commit_lsn().is_some_and(|c| c >= end) {
                self.late_voter_commits += usize::from(away.is_some());
                return self.check();
            }
            if !self.proposers[p].core.is_leader() || self.proposers[p].core.term() != term {
                // Another proposer's election, from messages sent before the healing (a
                // short seed's are still on their way): a higher term, not the gap.
                return self.check();
            }
        }
        Err(format!(
            "no commit in term {term} with acceptor {down} down{} (proposer {p}: {:?}); acceptors: {:?}",
            away.map_or(String::new(), |(a, _, _)| format!(", acceptor {a} away during the election")),
            self.proposers[p].core,
            self.nodes.iter().map(|n| n.as_ref().map(|n| n.acceptor.state().clone())).collect::<Vec<_>>()
        ))
    }

    /// Heals everything and checks that one proposer brings all acceptors to the same,
    /// complete committed WAL; then that it commits on with one acceptor down. One acceptor
    /// stays down through the election of the first proposer that writes (or for 4000
    /// steps, if none is elected without it), so that the acceptor that goes down at the
    /// end is, as often as not, one that voted, and the other one was away: the leader must
    /// count the latter (the crate's "Late voters"; before it, it counted from the next
    /// election only, and this check failed).
    fn finish(&mut self) -> Check {
        self.cut.clear();
        self.loss = 0.0;
        self.crash_in_handler = 0.0;
        let mut away = Some(self.rng.gen_range(0..ACCEPTORS));
        let mut elected_without = None;
        for a in 0..ACCEPTORS {
            if Some(a) == away {
                self.nodes[a] = None;
            } else {
                self.restart(a);
            }
        }
        let e = self.rng.gen_range(0..self.endpoints.len());
        if self.plain {
            self.start_election(self.endpoints[e].current)?;
        } else {
            self.next_incarnation(e, false)?;
        }
        // (proposer, term, end of the record it appended in that term)
        let mut appended: Option<(usize, Term, Lsn)> = None;
        for i in 0..20_000usize {
            self.now += 1;
            let p = self.endpoints[e].current;
            if let Some(a) = away {
                let writes = self.proposers[p].core.mode() != ProposerMode::Sync && self.proposers[p].core.wal_range().is_some();
                if writes || i >= 4000 {
                    // Back, and its connection with it.
                    away = None;
                    elected_without = writes.then_some((a, p, self.proposers[p].core.term()));
                    self.restart(a);
                    self.heal(p, a)?;
                }
            }
            if self.proposers[p].stopped {
                // Synced (a compute follows), or fenced by a proposer of before the healing
                // (a sync follows).
                self.next_incarnation(e, false)?;
            } else if i % 500 == 499 && (!self.proposers[p].core.is_leader() || self.learner_left_out(p)) {
                // Lost the race to a term another acceptor had seen: try again. Or a learner
                // missed this election's vote request and waits for the next one (a compute
                // is fenced by its own new election, and the endpoint moves on). A learner
                // that joined is catching up: not interrupted.
                self.start_election(p)?;
                if i.is_multiple_of(16) {
                    self.check()?;
                }
            } else {
                self.tick_or_deliver(p, i)?;
            }
            if i % 16 == 8 {
                self.drop_own_wal(self.endpoints[e].current)?;
            }
            if i % 64 == 32 {
                // Lazy writes and WAL removal go on while the endpoint catches everyone up.
                let a = self.rng.gen_range(0..ACCEPTORS);
                self.persist_lazy_and_remove(a);
            }
            // A compute writes one record once elected; a later compute writes its own.
            let p = self.endpoints[e].current;
            let writes = self.proposers[p].core.mode() != ProposerMode::Sync && self.proposers[p].core.wal_range().is_some();
            let term = self.proposers[p].core.term();
            if appended.is_none_or(|(q, t, _)| q != p || t != term) && writes {
                // After the rest of a record cut short, if any: only whole records commit.
                let pn = &mut self.proposers[p];
                let mut bytes = std::mem::take(&mut pn.partial);
                bytes.extend(record(u64::MAX - term, 2));
                let end = pn.store.client_append(&bytes);
                pn.boundary = end;
                appended = Some((p, term, end));
                let actions = pn.core.append(end, end);
                self.proposer_actions(p, actions)?;
            }
            if let Some((q, t, end)) = appended {
                // Only a record of the current term: an older one's end says nothing about the
                // catch-up of this term (an acceptor may have committed it and still lag).
                let current = q == p && t == self.proposers[p].core.term();
                // And no learner left: one that caught up becomes a voter once the peer horizon
                // reaches it (a tick later).
                let synced = current
                    && self
                        .nodes
                        .iter()
                        .all(|n| n.as_ref().is_some_and(|n| n.acceptor.state().commit_lsn >= end && !n.acceptor.state().learner));
                if synced {
                    self.check()?;
                    // Identical WAL (from the committed WAL below a learner's beginning), that
                    // holds everything committed; and no learner left.
                    let logs: Vec<Option<Vec<u8>>> = self.disks.iter().map(|d| d.wal.whole_log(&self.committed)).collect();
                    let learners = self.disks.iter().filter(|d| d.state.learner).count();
                    if logs.iter().any(|l| l.is_none() || *l != logs[0]) || learners > 0 {
                        let shapes: Vec<String> =
                            self.disks.iter().map(|d| format!("{}..{} learner {}", d.wal.begin, d.wal.end(), d.state.learner)).collect();
                        return Err(format!("acceptors differ after catching up: {}", shapes.join(", ")));
                    }
                    let first = logs[0].as_ref().expect("checked");
                    if first.get(..self.committed.len()) != Some(&self.committed[..]) {
                        return Err("the committed WAL is not a prefix of the acceptors' WAL after catching up".into());
                    }
                    return self.commit_with_one_down(p, elected_without.filter(|&(_, q, t)| q == p && t == self.proposers[p].core.term()));
                }
            }
        }
        let p = self.endpoints[e].current;
        Err(format!(
            "no progress after healing (proposer {p}: {:?}); acceptors: {:?}",
            self.proposers[p].core,
            self.nodes.iter().map(|n| n.as_ref().map(|n| n.acceptor.state().clone())).collect::<Vec<_>>()
        ))
    }
}

struct Outcome {
    commits: usize,
    committed_bytes: usize,
    terms: usize,
    fenced_stale: usize,
    fenced_later: usize,
    synced: usize,
    removals: usize,
    removed_bytes: u64,
    wipes: usize,
    partial_ends: usize,
    late_voter_commits: usize,
    /// Fetched bytes of a proposer's own WAL (above its start: a mid-term catch-up), and the
    /// most fetched bytes any proposer held at once.
    fetched_above_start: u64,
    fetched_peak: u64,
}

fn run_seed(seed: u64) -> Result<Outcome, String> {
    let mut sim = Sim::new(seed);
    // Every endpoint starts with compute_ctl's sync, at a random time (plain proposers
    // start at random steps).
    for e in 0..sim.endpoints.len() {
        if !sim.plain {
            let p = sim.endpoints[e].current;
            sim.proposers[p].retry_at = Some(sim.rng.gen_range(0..100));
        }
    }
    for step in 0..STEPS {
        sim.step().map_err(|e| format!("step {step}: {e}"))?;
    }
    sim.finish().map_err(|e| format!("after healing: {e}"))?;
    Ok(Outcome {
        commits: sim.commits,
        committed_bytes: sim.committed.len(),
        terms: sim.elected.len(),
        fenced_stale: sim.fenced_stale,
        fenced_later: sim.fenced_later,
        synced: sim.synced,
        removals: sim.removals,
        wipes: sim.wipes,
        partial_ends: sim.partial_ends,
        late_voter_commits: sim.late_voter_commits,
        removed_bytes: sim.removed_max.0.saturating_sub(WAL_START.0),
        fetched_above_start: sim.proposers.iter().map(|p| p.store.fetched_above_start).sum(),
        fetched_peak: sim.proposers.iter().map(|p| p.store.fetched_peak).max().unwrap_or(0),
    })
}

fn run_seed_or_panic(seed: u64) -> Outcome {
    let result = std::panic::catch_unwind(|| run_seed(seed));
    let replay = format!("replay: FJORD_SIM_SEED={seed} cargo test -p quorum --test simulation replay_seed");
    match result {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(e)) => panic!("simulation seed {seed} failed: {e}\n{replay}"),
        Err(_) => panic!("simulation seed {seed} panicked\n{replay}"),
    }
}

/// The first seed a random block may start at: above the seeds `scripts/sim` runs by default.
const RANDOM_START_MIN: u64 = 2_000_000;

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(value.parse().unwrap_or_else(|_| panic!("{name} must be a whole number, got {value:?}")))
}

#[test]
fn many_seeds() {
    let fixed_n = env_u64("FJORD_SIM_SEEDS").unwrap_or(2000);
    let fixed_first = env_u64("FJORD_SIM_SEED_START").unwrap_or(0);
    let random_n = env_u64("FJORD_SIM_RANDOM_SEEDS").unwrap_or(1000);
    let random_first = env_u64("FJORD_SIM_RANDOM_START").unwrap_or_else(|| rand::thread_rng().gen_range(RANDOM_START_MIN..1 << 48));
    if random_n > 0 {
        // Printed first, so that the output of a run that dies names the block too.
        eprintln!(
            "random seeds: {random_n} from {random_first} (FJORD_SIM_RANDOM_START={random_first} \
             cargo test -p quorum --test simulation many_seeds runs them again)"
        );
    }
    let (mut commits, mut bytes, mut terms, mut fenced_stale, mut fenced_later, mut synced) = (0, 0, 0, 0, 0, 0);
    let (mut removals, mut removed_bytes, mut wipes, mut partial_ends) = (0, 0, 0, 0);
    let (mut mid_term_fetched, mut mid_term_seeds, mut late_voter_commits) = (0, 0, 0);
    for seed in (fixed_first..fixed_first + fixed_n).chain(random_first..random_first + random_n) {
        let o = run_seed_or_panic(seed);
        mid_term_fetched += o.fetched_above_start;
        mid_term_seeds += usize::from(o.fetched_above_start > 0);
        wipes += o.wipes;
        partial_ends += o.partial_ends;
        late_voter_commits += o.late_voter_commits;
        removals += o.removals;
        removed_bytes += o.removed_bytes;
        commits += o.commits;
        bytes += o.committed_bytes;
        terms += o.terms;
        fenced_stale += o.fenced_stale;
        fenced_later += o.fenced_later;
        synced += o.synced;
    }
    let random = if random_n > 0 { format!(" and {random_n} from {random_first}") } else { String::new() };
    eprintln!(
        "{fixed_n} seeds from {fixed_first}{random}: {commits} commit advances, {bytes} bytes committed, {terms} terms elected, {synced} syncs done, \
         {fenced_stale} computes fenced at election, {fenced_later} after it, {removals} WAL removals \
         ({removed_bytes} bytes below the highest removal point, summed over seeds), {wipes} disks lost, \
         {partial_ends} acceptor states seen with WAL past the last whole record, \
         {mid_term_fetched} bytes fetched mid-term in {mid_term_seeds} seeds, \
         {late_voter_commits} seeds committed with an acceptor down after another was away during the election"
    );
    // The simulation must exercise something: commits, elections, fencing, syncs, removal,
    // lost disks, and logs that end inside a record.
    let n = (fixed_n + random_n) as usize;
    assert!(
        n == 0
            || commits > n
                && terms > n
                && synced > n / 2
                && fenced_stale > n / 40
                && fenced_later > n / 40
                && removals > n / 2
                && wipes > n / 4
                && partial_ends > n
                && mid_term_seeds > n / 10
                && late_voter_commits > n / 4
    );
}

#[test]
fn replay_seed() {
    let seed = std::env::var("FJORD_SIM_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(42);
    let o = run_seed_or_panic(seed);
    eprintln!(
        "seed {seed}: {} commit advances, {} bytes committed, {} terms elected, {} syncs done, {} computes fenced at election, {} after it, \
         {} WAL removals (up to {} bytes), {} disks lost, {} acceptor states with WAL past the last whole record, \
         {} bytes fetched mid-term (at most {} held at once)",
        o.commits,
        o.committed_bytes,
        o.terms,
        o.synced,
        o.fenced_stale,
        o.fenced_later,
        o.removals,
        o.removed_bytes,
        o.wipes,
        o.partial_ends,
        o.fetched_above_start,
        o.fetched_peak
    );
}
