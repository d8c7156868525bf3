//! Seeded deterministic simulation of the consensus core: 3 acceptors, 2-3 proposers, a
//! network that loses, delays, reorders and duplicates messages and cuts links, acceptor
//! crashes (losing what was not persisted, including lazily written commit LSNs) and
//! restarts, and client appends of WAL bytes.
//!
//! `FJORD_SIM_SEEDS=N` sets how many seeds `many_seeds` runs (default 2000);
//! `FJORD_SIM_SEED=S` replays one seed in `replay_seed`.

mod support;

use proto::Lsn;
use quorum::{NodeId, Proposer, ProposerAction, ProposerConfig, Term, ToAcceptor, ToProposer};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use support::{record, Disk, Node, Store, Wal, WAL_START};

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

struct ProposerNode {
    core: Proposer,
    store: Store,
    /// Votes' WAL snapshots in the current election, by acceptor.
    ghosts: BTreeMap<NodeId, Wal>,
}

struct Sim {
    rng: StdRng,
    now: u64,
    nodes: Vec<Option<Node>>,
    disks: Vec<Disk>,
    proposers: Vec<ProposerNode>,
    /// (deliver at, message)
    net: Vec<(u64, Envelope)>,
    /// Cut links (proposer, acceptor).
    cut: BTreeSet<(usize, NodeId)>,
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
}

type Check = Result<(), String>;

fn committed_end(c: &[u8]) -> Lsn {
    Lsn(WAL_START.0 + c.len() as u64)
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut rng = StdRng::seed_from_u64(seed);
        let proposers = rng.gen_range(2..=3);
        let loss = rng.gen_range(0.0..0.2);
        let dup = rng.gen_range(0.0..0.2);
        let max_delay = rng.gen_range(1..20);
        let crash_in_handler = rng.gen_range(0.0..0.05);
        // Small chunks and windows so appends split and streams throttle.
        let max_append = rng.gen_range(16..300);
        let config = ProposerConfig {
            max_append,
            window: max_append * rng.gen_range(1..8),
            max_fetch: rng.gen_range(16..500),
            ..ProposerConfig::default()
        };
        Sim {
            rng,
            now: 0,
            nodes: (0..ACCEPTORS).map(|_| Some(Node::start(&Disk::default()))).collect(),
            disks: vec![Disk::default(); ACCEPTORS],
            proposers: (0..proposers)
                .map(|_| ProposerNode {
                    core: Proposer::new(ACCEPTORS, WAL_START, config),
                    store: Store::default(),
                    ghosts: BTreeMap::new(),
                })
                .collect(),
            net: Vec::new(),
            cut: BTreeSet::new(),
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
        }
    }

    fn link_up(&self, p: usize, a: NodeId) -> bool {
        !self.cut.contains(&(p, a))
    }

    fn send(&mut self, env: Envelope) {
        if self.rng.gen_bool(self.loss) {
            return;
        }
        let copies = if self.rng.gen_bool(self.dup) { 2 } else { 1 };
        for _ in 0..copies {
            let at = self.now + self.rng.gen_range(0..=self.max_delay);
            self.net.push((at, env.clone()));
        }
    }

    fn proposer_actions(&mut self, p: usize, actions: Vec<ProposerAction>) -> Check {
        for a in actions {
            if let Some((to, msg)) = self.proposers[p].store.message(&a)? {
                self.send(Envelope::ToAcceptor { from: p, to, msg });
                continue;
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
                    let donor_log = pn.ghosts.get(&donor).cloned().ok_or("elected without the donor's vote")?;
                    if start_lsn != donor_log.end() && !(donor_log.bytes.is_empty() && start_lsn == WAL_START) {
                        return Err(format!("start LSN {start_lsn} is not the donor's flush LSN {}", donor_log.end()));
                    }
                    pn.store.elected(start_lsn, &donor_log)?;
                }
                ProposerAction::Commit { term, commit_lsn } => {
                    let log = self.proposers[p].store.committed(commit_lsn)?;
                    let n = log.len().min(self.committed.len());
                    if log[..n] != self.committed[..n] {
                        return Err(format!("term {term} commits up to {commit_lsn} WAL that differs from what was committed"));
                    }
                    if log.len() > self.committed.len() {
                        self.committed = log.to_vec();
                    }
                    self.commits += 1;
                }
                _ => {}
            }
        }
        Ok(())
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
                let (replies, crashed) = node.handle(&mut self.disks[to], msg, keep).map_err(|e| format!("acceptor {to}: {e}"))?;
                if crashed {
                    self.nodes[to] = None;
                    return Ok(());
                }
                for msg in replies {
                    let ghost = matches!(msg, ToProposer::Vote { .. }).then(|| self.disks[to].wal.clone());
                    self.send(Envelope::ToProposer { from: to, to: from, msg, ghost });
                }
            }
            Envelope::ToProposer { from, to, msg, ghost } => {
                if !self.link_up(to, from) {
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
        let ready: Vec<usize> = (0..self.net.len()).filter(|&i| self.net[i].0 <= self.now).collect();
        if ready.is_empty() {
            return Ok(());
        }
        let i = ready[self.rng.gen_range(0..ready.len())];
        let (_, env) = self.net.swap_remove(i);
        self.deliver(env)
    }

    fn client_append(&mut self, p: usize) -> Check {
        if self.proposers[p].core.wal_range().is_none() {
            return Ok(());
        }
        let len = self.rng.gen_range(1..200);
        let bytes = record(self.next_payload, len);
        self.next_payload += 1;
        let end = self.proposers[p].store.client_append(&bytes);
        let actions = self.proposers[p].core.append(end);
        self.proposer_actions(p, actions)
    }

    fn start_election(&mut self, p: usize) -> Check {
        self.proposers[p].ghosts.clear();
        let actions = self.proposers[p].core.start_election();
        self.proposer_actions(p, actions)
    }

    fn restart(&mut self, a: NodeId) {
        if self.nodes[a].is_none() {
            self.nodes[a] = Some(Node::start(&self.disks[a]));
            self.seen_commit[a] = self.disks[a].state.commit_lsn;
        }
    }

    fn step(&mut self) -> Check {
        self.now += 1;
        let np = self.proposers.len();
        let roll = self.rng.gen_range(0..100);
        match roll {
            0..=39 => self.deliver_random()?,
            40..=59 => {
                let p = self.rng.gen_range(0..np);
                let actions = self.proposers[p].core.tick();
                self.proposer_actions(p, actions)?;
            }
            60..=61 => {
                let p = self.rng.gen_range(0..np);
                self.start_election(p)?;
            }
            62..=78 => {
                let p = self.rng.gen_range(0..np);
                for _ in 0..self.rng.gen_range(1..4) {
                    self.client_append(p)?;
                }
            }
            79..=80 => {
                // The lazy write of an acceptor's commit LSN.
                let a = self.rng.gen_range(0..ACCEPTORS);
                if let Some(n) = &self.nodes[a] {
                    n.persist_commit(&mut self.disks[a]);
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
                let (p, a) = (self.rng.gen_range(0..np), self.rng.gen_range(0..ACCEPTORS));
                if !self.cut.remove(&(p, a)) {
                    self.cut.insert((p, a));
                } else {
                    let actions = self.proposers[p].core.reconnected(a);
                    self.proposer_actions(p, actions)?;
                }
            }
            _ => self.deliver_random()?,
        }
        self.check()
    }

    /// Safety invariants that must hold after every step.
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
                    let mine = disk.wal.range(WAL_START, commit)?;
                    if mine != &self.committed[..mine.len()] {
                        return Err(format!("acceptor {a} ({what}): WAL below its commit LSN {commit} differs from committed WAL"));
                    }
                }
            }
        }
        // The committed WAL is durable on a majority.
        if end > WAL_START {
            let holders = self.disks.iter().filter(|d| d.wal.range(WAL_START, end).is_ok_and(|w| w == &self.committed[..])).count();
            if holders <= ACCEPTORS / 2 {
                return Err(format!("committed WAL up to {end} is durable on only {holders} acceptors"));
            }
        }
        Ok(())
    }

    /// Heals everything and checks that one proposer brings all acceptors to the same,
    /// complete committed WAL.
    fn finish(&mut self) -> Check {
        self.cut.clear();
        self.loss = 0.0;
        self.crash_in_handler = 0.0;
        for a in 0..ACCEPTORS {
            self.restart(a);
        }
        let p = self.rng.gen_range(0..self.proposers.len());
        self.start_election(p)?;
        let mut appended: Option<(Term, Lsn)> = None;
        for i in 0..20_000 {
            self.now += 1;
            if i % 500 == 499 && !self.proposers[p].core.is_leader() {
                // Lost the race to a term another acceptor had seen: try again.
                self.start_election(p)?;
            } else if self.rng.gen_bool(0.1) {
                let actions = self.proposers[p].core.tick();
                self.proposer_actions(p, actions)?;
            } else {
                self.deliver_random()?;
            }
            if i % 16 == 0 {
                self.check()?;
            }
            // WAL appended in a term the proposer lost is gone with that term: append again.
            let term = self.proposers[p].core.term();
            if appended.is_none_or(|(t, _)| t != term) && self.proposers[p].core.wal_range().is_some() {
                let end = self.proposers[p].store.client_append(&record(u64::MAX - term, 1));
                appended = Some((term, end));
                let actions = self.proposers[p].core.append(end);
                self.proposer_actions(p, actions)?;
            }
            if let Some((_, end)) = appended {
                let synced = self.nodes.iter().all(|n| n.as_ref().is_some_and(|n| n.acceptor.state().commit_lsn >= end));
                if synced {
                    self.check()?;
                    let first = &self.disks[0].wal;
                    if self.disks.iter().any(|d| d.wal != *first) {
                        return Err("acceptors differ after catching up".into());
                    }
                    if first.range(WAL_START, committed_end(&self.committed)).map_err(|e| format!("after catching up: {e}"))?
                        != &self.committed[..]
                    {
                        return Err("the committed WAL is not a prefix of the acceptors' WAL after catching up".into());
                    }
                    return Ok(());
                }
            }
        }
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
}

fn run_seed(seed: u64) -> Result<Outcome, String> {
    let mut sim = Sim::new(seed);
    for step in 0..STEPS {
        sim.step().map_err(|e| format!("step {step}: {e}"))?;
    }
    sim.finish().map_err(|e| format!("after healing: {e}"))?;
    Ok(Outcome { commits: sim.commits, committed_bytes: sim.committed.len(), terms: sim.elected.len() })
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

#[test]
fn many_seeds() {
    let n: u64 = std::env::var("FJORD_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(2000);
    let (mut commits, mut bytes, mut terms) = (0, 0, 0);
    for seed in 0..n {
        let o = run_seed_or_panic(seed);
        commits += o.commits;
        bytes += o.committed_bytes;
        terms += o.terms;
    }
    eprintln!("{n} seeds: {commits} commit advances, {bytes} bytes committed, {terms} terms elected");
    // The simulation must exercise something.
    assert!(n == 0 || commits > n as usize && terms > n as usize);
}

#[test]
fn replay_seed() {
    let seed = std::env::var("FJORD_SIM_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(42);
    let o = run_seed_or_panic(seed);
    eprintln!("seed {seed}: {} commit advances, {} bytes committed, {} terms elected", o.commits, o.committed_bytes, o.terms);
}
