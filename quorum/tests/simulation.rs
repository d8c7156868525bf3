//! Seeded deterministic simulation of the consensus core: 3 acceptors, 2-3 proposers, a
//! network that loses, delays, reorders and duplicates messages and cuts links, acceptor
//! crashes (losing what was not persisted) and restarts, and client appends.
//!
//! `FJORD_SIM_SEEDS=N` sets how many seeds `many_seeds` runs (default 2000);
//! `FJORD_SIM_SEED=S` replays one seed in `replay_seed`.

use proto::Lsn;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use safekeeper::consensus::{
    Acceptor, AcceptorAction, AcceptorState, NodeId, Proposer, ProposerAction, Record, Term, ToAcceptor,
    ToProposer,
};
use std::collections::{BTreeMap, BTreeSet};

const ACCEPTORS: usize = 3;
const STEPS: usize = 350;

#[derive(Clone, Debug)]
enum Envelope {
    ToAcceptor { from: usize, to: NodeId, msg: ToAcceptor },
    ToProposer { from: NodeId, to: usize, msg: ToProposer },
}

struct Sim {
    rng: StdRng,
    now: u64,
    acceptors: Vec<Option<Acceptor>>,
    disks: Vec<AcceptorState>,
    proposers: Vec<Proposer>,
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
    committed: BTreeMap<Lsn, Record>,
    committed_end: Lsn,
    committed_ids: BTreeSet<u64>,
    seen_commit: Vec<Lsn>,
    seen_disk_commit: Vec<Lsn>,
    next_payload: u64,
}

type Check = Result<(), String>;

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut rng = StdRng::seed_from_u64(seed);
        let proposers = rng.gen_range(2..=3);
        let loss = rng.gen_range(0.0..0.2);
        let dup = rng.gen_range(0.0..0.2);
        let max_delay = rng.gen_range(1..20);
        let crash_in_handler = rng.gen_range(0.0..0.05);
        Sim {
            rng,
            now: 0,
            acceptors: (0..ACCEPTORS).map(|_| Some(Acceptor::new(AcceptorState::default()))).collect(),
            disks: vec![AcceptorState::default(); ACCEPTORS],
            proposers: (0..proposers).map(|_| Proposer::new(ACCEPTORS)).collect(),
            net: Vec::new(),
            cut: BTreeSet::new(),
            loss,
            dup,
            max_delay,
            crash_in_handler,
            elected: BTreeMap::new(),
            committed: BTreeMap::new(),
            committed_end: Lsn(0),
            committed_ids: BTreeSet::new(),
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
            match a {
                ProposerAction::Send(to, msg) => self.send(Envelope::ToAcceptor { from: p, to, msg }),
                ProposerAction::Elected { term } => {
                    if let Some(&other) = self.elected.get(&term) {
                        if other != p {
                            return Err(format!("proposers {other} and {p} both elected in term {term}"));
                        }
                    }
                    self.elected.insert(term, p);
                }
                ProposerAction::Commit { term, commit_lsn } => {
                    let log = self.proposers[p].log().ok_or("commit without a log")?;
                    let upto = log.partition_point(|r| r.end <= commit_lsn);
                    let log = log[..upto].to_vec();
                    for r in &log {
                        match self.committed.get(&r.start) {
                            Some(c) if c != r => {
                                return Err(format!("term {term} commits {r:?} where {c:?} was committed"));
                            }
                            Some(_) => {}
                            None => {
                                if !self.committed_ids.insert(r.payload) {
                                    return Err(format!("payload {} committed twice", r.payload));
                                }
                                self.committed.insert(r.start, r.clone());
                            }
                        }
                    }
                    self.committed_end = self.committed_end.max(commit_lsn);
                }
                ProposerAction::SteppedDown { .. } => {}
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
                let Some(acc) = self.acceptors[to].as_mut() else { return Ok(()) };
                let actions = acc.handle(msg);
                let crash = self.rng.gen_bool(self.crash_in_handler);
                let persists = actions.iter().filter(|a| matches!(a, AcceptorAction::Persist(_))).count();
                let keep = if crash { self.rng.gen_range(0..=persists) } else { persists };
                let mut applied = 0;
                for a in actions {
                    match a {
                        AcceptorAction::Persist(p) => {
                            if applied == keep {
                                break;
                            }
                            self.disks[to].apply(&p);
                            applied += 1;
                        }
                        AcceptorAction::Reply(msg) => {
                            if applied < persists {
                                return Err(format!("acceptor {to} replies before persisting: {msg:?}"));
                            }
                            self.send(Envelope::ToProposer { from: to, to: from, msg });
                        }
                    }
                }
                if crash {
                    self.acceptors[to] = None;
                }
            }
            Envelope::ToProposer { from, to, msg } => {
                if !self.link_up(to, from) {
                    return Ok(());
                }
                let actions = self.proposers[to].handle(from, msg);
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
        let payload = self.next_payload;
        let len = self.rng.gen_range(1..200);
        if let Some((_, _, actions)) = self.proposers[p].append(payload, len) {
            self.next_payload += 1;
            self.proposer_actions(p, actions)?;
        }
        Ok(())
    }

    fn step(&mut self) -> Check {
        self.now += 1;
        let np = self.proposers.len();
        let roll = self.rng.gen_range(0..100);
        match roll {
            0..=39 => self.deliver_random()?,
            40..=59 => {
                let p = self.rng.gen_range(0..np);
                let actions = self.proposers[p].tick();
                self.proposer_actions(p, actions)?;
            }
            60..=61 => {
                let p = self.rng.gen_range(0..np);
                let actions = self.proposers[p].start_election();
                self.proposer_actions(p, actions)?;
            }
            62..=80 => {
                let p = self.rng.gen_range(0..np);
                for _ in 0..self.rng.gen_range(1..4) {
                    self.client_append(p)?;
                }
            }
            81..=82 => {
                let a = self.rng.gen_range(0..ACCEPTORS);
                self.acceptors[a] = None;
            }
            83..=87 => {
                let a = self.rng.gen_range(0..ACCEPTORS);
                if self.acceptors[a].is_none() {
                    self.acceptors[a] = Some(Acceptor::new(self.disks[a].clone()));
                    self.seen_commit[a] = self.disks[a].commit_lsn;
                }
            }
            88..=90 => {
                let link = (self.rng.gen_range(0..np), self.rng.gen_range(0..ACCEPTORS));
                if !self.cut.remove(&link) {
                    self.cut.insert(link);
                }
            }
            _ => self.deliver_random()?,
        }
        self.check()
    }

    /// Safety invariants that must hold after every step.
    fn check(&mut self) -> Check {
        for a in 0..ACCEPTORS {
            let disk = &self.disks[a];
            if disk.commit_lsn < self.seen_disk_commit[a] {
                return Err(format!("acceptor {a}: durable commit LSN went back"));
            }
            self.seen_disk_commit[a] = disk.commit_lsn;
            let mut states = vec![("disk", disk)];
            if let Some(acc) = &self.acceptors[a] {
                let s = acc.state();
                if s.commit_lsn < self.seen_commit[a] {
                    return Err(format!("acceptor {a}: commit LSN went back"));
                }
                self.seen_commit[a] = s.commit_lsn;
                states.push(("memory", s));
            }
            for (what, s) in states {
                if s.commit_lsn > s.flush_lsn() {
                    return Err(format!("acceptor {a} ({what}): commit LSN beyond flush LSN"));
                }
                if s.commit_lsn > self.committed_end {
                    return Err(format!("acceptor {a} ({what}): commit LSN {} never committed", s.commit_lsn));
                }
                for r in s.wal.iter().take_while(|r| r.end <= s.commit_lsn) {
                    if self.committed.get(&r.start) != Some(r) {
                        return Err(format!("acceptor {a} ({what}): {r:?} below its commit LSN differs from committed WAL"));
                    }
                }
            }
        }
        // Every committed record is durable on a majority.
        for r in self.committed.values() {
            let holders = self.disks.iter().filter(|d| d.wal.binary_search_by_key(&r.start, |x| x.start).is_ok_and(|i| d.wal[i] == *r)).count();
            if holders <= ACCEPTORS / 2 {
                return Err(format!("committed {r:?} is durable on only {holders} acceptors"));
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
            if self.acceptors[a].is_none() {
                self.acceptors[a] = Some(Acceptor::new(self.disks[a].clone()));
                self.seen_commit[a] = self.disks[a].commit_lsn;
            }
        }
        let p = self.rng.gen_range(0..self.proposers.len());
        let actions = self.proposers[p].start_election();
        self.proposer_actions(p, actions)?;
        let mut appended = None;
        for i in 0..20_000 {
            self.now += 1;
            if i % 500 == 499 && !self.proposers[p].is_leader() {
                // Lost the race to a term another acceptor had seen: try again.
                let actions = self.proposers[p].start_election();
                self.proposer_actions(p, actions)?;
            } else if self.rng.gen_bool(0.1) {
                let actions = self.proposers[p].tick();
                self.proposer_actions(p, actions)?;
            } else {
                self.deliver_random()?;
            }
            if i % 16 == 0 {
                self.check()?;
            }
            // A record appended in a term the proposer lost is gone with that term: append again.
            let term = self.proposers[p].term();
            if appended.is_none_or(|(t, _)| t != term) {
                if let Some((_, end, actions)) = self.proposers[p].append(u64::MAX - term, 1) {
                    appended = Some((term, end));
                    self.proposer_actions(p, actions)?;
                }
            }
            if let Some((_, end)) = appended {
                let synced = self.acceptors.iter().all(|a| a.as_ref().is_some_and(|a| a.state().commit_lsn >= end));
                if synced {
                    self.check()?;
                    let first = &self.disks[0].wal;
                    if self.disks.iter().any(|d| d.wal != *first) {
                        return Err("acceptors differ after catching up".into());
                    }
                    if !self.committed.values().all(|r| first.contains(r)) {
                        return Err("a committed record is missing after catching up".into());
                    }
                    return Ok(());
                }
            }
        }
        Err(format!(
            "no progress after healing (proposer {p}: {:?}); acceptors: {:?}",
            self.proposers[p],
            self.acceptors.iter().map(|a| a.as_ref().map(|a| a.state().clone())).collect::<Vec<_>>()
        ))
    }
}

struct Outcome {
    commits: usize,
    terms: usize,
}

fn run_seed(seed: u64) -> Result<Outcome, String> {
    let mut sim = Sim::new(seed);
    for step in 0..STEPS {
        sim.step().map_err(|e| format!("step {step}: {e}"))?;
    }
    sim.finish().map_err(|e| format!("after healing: {e}"))?;
    Ok(Outcome { commits: sim.committed.len(), terms: sim.elected.len() })
}

fn run_seed_or_panic(seed: u64) -> Outcome {
    let result = std::panic::catch_unwind(|| run_seed(seed));
    match result {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(e)) => panic!("simulation seed {seed} failed: {e}\nreplay: FJORD_SIM_SEED={seed} cargo test -p safekeeper --test simulation replay_seed"),
        Err(_) => panic!("simulation seed {seed} panicked\nreplay: FJORD_SIM_SEED={seed} cargo test -p safekeeper --test simulation replay_seed"),
    }
}

#[test]
fn many_seeds() {
    let n: u64 = std::env::var("FJORD_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(2000);
    let (mut commits, mut terms) = (0, 0);
    for seed in 0..n {
        let o = run_seed_or_panic(seed);
        commits += o.commits;
        terms += o.terms;
    }
    eprintln!("{n} seeds: {commits} records committed, {terms} terms elected");
    // The simulation must exercise something.
    assert!(n == 0 || commits > n as usize && terms > n as usize);
}

#[test]
fn replay_seed() {
    let seed = std::env::var("FJORD_SIM_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(42);
    let o = run_seed_or_panic(seed);
    eprintln!("seed {seed}: {} records committed, {} terms elected", o.commits, o.terms);
}
