//! The scripted scenarios' cluster: three in-memory acceptors and a proposer driven by hand,
//! every message delivered reliably and at once unless a filter drops or changes it, with
//! a check that no two commits contradict each other. Shared by the scenario files
//! (`tests/scenarios.rs`, `tests/joining.rs`).

use super::{record, Disk, Node, Store, Wal, WAL_START};
use proto::Lsn;
use quorum::{AcceptorState, Proposer, ProposerAction, ProposerConfig, ProposerMode, ToAcceptor, ToProposer};
use std::collections::{BTreeMap, VecDeque};

pub struct Cluster {
    pub nodes: Vec<Node>,
    pub disks: Vec<Disk>,
    /// The committed WAL from WAL_START.
    pub committed: Vec<u8>,
}

/// A proposer with its WAL store.
pub struct P {
    pub core: Proposer,
    pub store: Store,
    pub ghosts: BTreeMap<usize, Wal>,
}

/// A new proposer id for each proposer of a test.
pub fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

pub fn proposer() -> P {
    P {
        core: Proposer::new(3, WAL_START, ProposerConfig::default()).identified(next_id()),
        store: Store::default(),
        ghosts: BTreeMap::new(),
    }
}

/// A proposer in `mode` whose own WAL starts at `wal_start`.
pub fn proposer_in(mode: ProposerMode, wal_start: Lsn, config: ProposerConfig) -> P {
    P {
        core: Proposer::new(3, wal_start, ProposerConfig { mode, ..config }).identified(next_id()),
        store: Store::default(),
        ghosts: BTreeMap::new(),
    }
}

pub type Filter<'a> = &'a dyn Fn(usize, ToAcceptor) -> Option<ToAcceptor>;

impl Cluster {
    pub fn new() -> Cluster {
        let disks = vec![Disk::default(); 3];
        Cluster { nodes: disks.iter().map(Node::start).collect(), disks, committed: Vec::new() }
    }

    /// Delivers everything `actions` lead to, reliably, until quiet. `filter` decides what
    /// reaches which acceptor, and may change a message. Returns the actions that are not
    /// messages (elected, commits, fenced, synced...).
    pub fn run(&mut self, p: &mut P, actions: Vec<ProposerAction>, filter: Filter) -> Vec<ProposerAction> {
        let mut events = Vec::new();
        let mut queue: VecDeque<ProposerAction> = actions.into();
        while let Some(a) = queue.pop_front() {
            if let Some((to, msg)) = p.store.message(&a).unwrap() {
                let Some(msg) = filter(to, msg) else { continue };
                let (replies, _) = self.nodes[to].handle(&mut self.disks[to], msg, None).unwrap();
                for reply in replies {
                    if matches!(reply, ToProposer::Vote { granted: true, .. }) {
                        p.ghosts.insert(to, self.disks[to].wal.clone());
                    }
                    queue.extend(p.core.handle(to, reply));
                }
                continue;
            }
            events.push(a.clone());
            match a {
                ProposerAction::Elected { start_lsn, donor, .. } => {
                    let g = p.ghosts[&donor].clone();
                    p.store.elected(start_lsn, &g, &self.committed).unwrap();
                }
                ProposerAction::Commit { commit_lsn, .. } => {
                    let log = p.store.committed(commit_lsn).unwrap();
                    let n = log.len().min(self.committed.len());
                    assert_eq!(log[..n], self.committed[..n], "conflicting commits");
                    if log.len() > self.committed.len() {
                        self.committed = log.to_vec();
                    }
                }
                _ => {}
            }
        }
        events
    }

    pub fn elect(&mut self, p: &mut P, filter: Filter) -> Vec<ProposerAction> {
        p.ghosts.clear();
        let a = p.core.start_election();
        self.run(p, a, filter)
    }

    pub fn wal(&self, a: usize) -> &[u8] {
        &self.disks[a].wal.bytes
    }
}

pub fn only(nodes: &'static [usize]) -> impl Fn(usize, ToAcceptor) -> Option<ToAcceptor> {
    move |to, msg| nodes.contains(&to).then_some(msg)
}

/// Appends a 10-byte record with payload `id`, delivered to `to` only.
pub fn append(c: &mut Cluster, p: &mut P, id: u64, to: &'static [usize]) -> Vec<ProposerAction> {
    let end = p.store.client_append(&record(id, 10));
    let a = p.core.append(end, end);
    c.run(p, a, &only(to))
}

pub fn lsn(offset: u64) -> Lsn {
    Lsn(WAL_START.0 + offset)
}
/// Ticks the proposer and delivers what follows through `filter`.
pub fn tick(c: &mut Cluster, p: &mut P, filter: Filter) -> Vec<ProposerAction> {
    let a = p.core.tick();
    c.run(p, a, filter)
}

/// An acceptor that lost its disk (a replaced safekeeper: its shell creates the timeline
/// again, as a learner).
pub fn wipe(c: &mut Cluster, a: usize) {
    c.disks[a] = Disk { state: AcceptorState { learner: true, ..AcceptorState::default() }, ..Disk::default() };
    c.nodes[a] = Node::start(&c.disks[a]);
}
