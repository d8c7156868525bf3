//! I/O shells for the consensus core used by the simulation and the scenarios: an acceptor
//! whose "disk" is a `Vec<u8>` of WAL plus its durable state, and a proposer whose WAL store
//! is a `Vec<u8>`. Both check that the core only asks for what they can do. The acceptor
//! removes WAL as the safekeeper does, but as far as the rule allows (to the byte, not in
//! whole segments, and without waiting for a pageserver): below its durable peer horizon
//! and commit LSN. Removed bytes stay in the `Vec` for the checker, but the core may not
//! read them nor truncate into them.

#![allow(dead_code, reason = "each test binary that includes this module uses a different part of it")]

pub mod cluster;

use bytes::Bytes;
use proto::Lsn;
use quorum::{Acceptor, AcceptorAction, AcceptorState, Persist, ProposerAction, ToAcceptor, ToProposer};

/// The simulation's random numbers: SplitMix64, seeded by the seed. Cheaper than `StdRng`
/// (a cryptographic generator, a quarter of the simulation's time) and, being written here,
/// the same sequence for a seed on every platform and `rand` version, so a printed seed
/// replays anywhere.
pub struct SimRng(u64);

impl SimRng {
    pub fn new(seed: u64) -> SimRng {
        SimRng(seed)
    }
}

impl rand::RngCore for SimRng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        for chunk in dest.chunks_mut(8) {
            let bytes = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

/// Where every proposer's own WAL begins in these tests: the timeline's first LSN.
pub const WAL_START: Lsn = Lsn(100);

/// WAL bytes `[begin, begin + bytes.len())`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Wal {
    pub begin: Lsn,
    pub bytes: Vec<u8>,
}

impl Wal {
    pub fn end(&self) -> Lsn {
        Lsn(self.begin.0 + self.bytes.len() as u64)
    }

    /// The whole log from `WAL_START`: a log that begins later (a learner's, which began at
    /// a peer horizon) is preceded by that much of `committed` (all acceptors hold it, or
    /// held it: it was committed). `None` if `committed` does not reach its beginning.
    pub fn whole_log(&self, committed: &[u8]) -> Option<Vec<u8>> {
        let below = (self.begin.0.max(WAL_START.0) - WAL_START.0) as usize;
        let mut all = committed.get(..below)?.to_vec();
        all.extend_from_slice(&self.bytes[(WAL_START.0.saturating_sub(self.begin.0) as usize).min(self.bytes.len())..]);
        Some(all)
    }

    pub fn range(&self, from: Lsn, to: Lsn) -> Result<&[u8], String> {
        if from < self.begin || to > self.end() || from > to {
            return Err(format!("{from}..{to} is outside the WAL {}..{}", self.begin, self.end()));
        }
        Ok(&self.bytes[(from.0 - self.begin.0) as usize..(to.0 - self.begin.0) as usize])
    }
}

/// An acceptor's durable state: what survives a crash.
#[derive(Clone, Debug, Default)]
pub struct Disk {
    pub state: AcceptorState,
    pub wal: Wal,
    /// WAL below this was removed: the core must never ask for it again.
    pub removed_below: Lsn,
}

impl Disk {
    pub fn apply(&mut self, p: &Persist) -> Result<(), String> {
        match p {
            Persist::Control { .. } => {}
            Persist::Truncate { at } => {
                if *at < self.removed_below {
                    return Err(format!("truncation at {at}, into WAL removed below {}", self.removed_below));
                }
                if *at >= self.wal.begin && *at <= self.wal.end() && !self.wal.bytes.is_empty() {
                    self.wal.bytes.truncate((at.0 - self.wal.begin.0) as usize);
                } else {
                    self.wal = Wal { begin: *at, bytes: Vec::new() };
                }
            }
            Persist::Append { begin, data, .. } => {
                if *begin != self.wal.end() {
                    return Err(format!("append at {begin} but the WAL ends at {}", self.wal.end()));
                }
                self.wal.bytes.extend_from_slice(data);
            }
        }
        self.state.apply(p);
        if self.state.flush_lsn != self.wal.end() && !(self.wal.bytes.is_empty() && self.state.flush_lsn == self.wal.begin) {
            return Err(format!("flush LSN {} but the WAL ends at {}", self.state.flush_lsn, self.wal.end()));
        }
        Ok(())
    }
}

/// A running acceptor over a disk.
pub struct Node {
    pub acceptor: Acceptor,
    /// The highest remote-consistent LSN proposers relayed (kept in memory only here).
    pub remote_consistent_lsn: Lsn,
}

impl Node {
    pub fn start(disk: &Disk) -> Node {
        Node { acceptor: Acceptor::new(disk.state.clone()), remote_consistent_lsn: Lsn(0) }
    }

    /// Handles a message: applies up to `keep` persists (all if `None`: no crash), returns
    /// the replies (none if it crashed) and whether it crashed.
    pub fn handle(&mut self, disk: &mut Disk, msg: ToAcceptor, keep: Option<usize>) -> Result<(Vec<ToProposer>, bool), String> {
        let actions = self.acceptor.handle(msg);
        let persists = actions.iter().filter(|a| matches!(a, AcceptorAction::Persist(_))).count();
        let keep = keep.map(|k| k.min(persists));
        let mut applied = 0;
        let mut replies = Vec::new();
        for a in actions {
            match a {
                AcceptorAction::Persist(p) => {
                    if Some(applied) == keep {
                        return Ok((Vec::new(), true));
                    }
                    disk.apply(&p)?;
                    applied += 1;
                }
                AcceptorAction::CommitLsn(_) | AcceptorAction::PeerHorizon(_) => {}
                AcceptorAction::RemoteConsistentLsn(lsn) => self.remote_consistent_lsn = self.remote_consistent_lsn.max(lsn),
                AcceptorAction::SendWal { term, from, to } => {
                    if applied < persists {
                        return Err("WAL sent before persisting".into());
                    }
                    if from < disk.removed_below {
                        return Err(format!("asked for WAL {from}..{to}, but WAL below {} was removed", disk.removed_below));
                    }
                    let data = Bytes::copy_from_slice(disk.wal.range(from, to)?);
                    replies.push(ToProposer::Wal { term, from, data });
                }
                AcceptorAction::Reply(msg) => {
                    if applied < persists {
                        return Err(format!("reply before persisting: {msg:?}"));
                    }
                    replies.push(msg);
                }
            }
        }
        if keep.is_some_and(|k| k < persists) {
            return Ok((Vec::new(), true));
        }
        Ok((replies, false))
    }

    /// Makes the in-memory commit LSN and peer horizon durable (the lazy write of the
    /// control file), then removes the WAL below both, as far as it goes (the safekeeper
    /// removes whole segments, and only below the pageserver's remote-consistent LSN too).
    /// Returns whether more WAL was removed.
    pub fn persist_lazy_and_remove(&self, disk: &mut Disk) -> bool {
        let s = self.acceptor.state();
        disk.state.commit_lsn = disk.state.commit_lsn.max(s.commit_lsn);
        disk.state.peer_horizon_lsn = disk.state.peer_horizon_lsn.max(s.peer_horizon_lsn);
        let horizon = disk.state.peer_horizon_lsn.min(disk.state.commit_lsn);
        if horizon > disk.removed_below {
            disk.removed_below = horizon;
            return true;
        }
        false
    }
}

/// A proposer's WAL store, and its ghost: the whole log it believes in (the donor's log
/// below its start LSN, as the donor had it when it voted, then its own WAL). The ghost is
/// test-only knowledge used to check commits; the core never sees it. Its own WAL (`wal`)
/// loses its oldest bytes when the test says so (as a compute's `pg_wal` loses segments,
/// [`Store::drop_own_below`]); fetched WAL (`fetched`) is one contiguous range, released to
/// the byte when the core says so, and never longer than `fetched_max`.
#[derive(Clone, Debug, Default)]
pub struct Store {
    pub wal: Wal,
    pub fetched: Wal,
    pub ghost: Vec<u8>,
    /// The core's `max_fetched` (0: not checked).
    pub fetched_max: u64,
    /// The most fetched bytes held at once, and how many were fetched from above the start
    /// LSN (a mid-term catch-up, below what the store still has of its own WAL).
    pub fetched_peak: u64,
    pub fetched_above_start: u64,
    /// The start LSN it was elected at.
    pub start: Lsn,
}

impl Store {
    /// Elected: the store starts empty at `start`; the ghost is the donor's log up to it
    /// (from `WAL_START`: below the beginning of a log that begins later, the `committed` WAL).
    pub fn elected(&mut self, start: Lsn, donor_log: &Wal, committed: &[u8]) -> Result<(), String> {
        self.wal = Wal { begin: start, bytes: Vec::new() };
        self.fetched = Wal { begin: start, bytes: Vec::new() };
        self.start = start;
        self.ghost = if start == WAL_START && donor_log.bytes.is_empty() {
            Vec::new()
        } else {
            let whole = donor_log.whole_log(committed).ok_or("the donor's log begins above the committed WAL")?;
            whole.get(..(start.0 - WAL_START.0) as usize).ok_or(format!("the donor's log ends below the start {start}"))?.to_vec()
        };
        Ok(())
    }

    pub fn client_append(&mut self, data: &[u8]) -> Lsn {
        self.wal.bytes.extend_from_slice(data);
        self.ghost.extend_from_slice(data);
        self.wal.end()
    }

    /// Its own WAL below `lsn` is gone (at most to its end).
    pub fn drop_own_below(&mut self, lsn: Lsn) {
        let lsn = lsn.min(self.wal.end());
        if lsn > self.wal.begin {
            self.wal.bytes.drain(..(lsn.0 - self.wal.begin.0) as usize);
            self.wal.begin = lsn;
        }
    }

    /// The WAL in `[begin, end)`: from fetched WAL where that holds `begin`, and on from its
    /// own; an error if it has neither.
    fn read(&self, begin: Lsn, end: Lsn) -> Result<Vec<u8>, String> {
        if begin >= self.fetched.begin && begin < self.fetched.end() {
            let split = end.min(self.fetched.end());
            let mut out = self.fetched.range(begin, split)?.to_vec();
            if end > split {
                out.extend_from_slice(self.wal.range(split, end).map_err(|e| format!("after fetched WAL: {e}"))?);
            }
            return Ok(out);
        }
        Ok(self.wal.range(begin, end)?.to_vec())
    }

    /// Turns a proposer action into the message to send, if it is one.
    pub fn message(&mut self, a: &ProposerAction) -> Result<Option<(usize, ToAcceptor)>, String> {
        Ok(match a {
            ProposerAction::Send(to, m) => Some((*to, m.clone())),
            ProposerAction::SendWal { to, term, begin, end, boundary_lsn, commit_lsn, peer_horizon_lsn, remote_consistent_lsn } => {
                let data = Bytes::from(self.read(*begin, *end)?);
                let msg = ToAcceptor::Append {
                    term: *term,
                    begin_lsn: *begin,
                    data,
                    boundary_lsn: *boundary_lsn,
                    commit_lsn: *commit_lsn,
                    peer_horizon_lsn: *peer_horizon_lsn,
                    remote_consistent_lsn: *remote_consistent_lsn,
                };
                Some((*to, msg))
            }
            ProposerAction::StoreWal { from, data } => {
                if self.fetched.bytes.is_empty() {
                    self.fetched = Wal { begin: *from, bytes: Vec::new() };
                } else if *from != self.fetched.end() {
                    return Err(format!("fetched WAL at {from} does not continue the fetched WAL ending at {}", self.fetched.end()));
                }
                let to = from.0 + data.len() as u64;
                let ghost =
                    self.ghost.get((from.0 - WAL_START.0) as usize..(to - WAL_START.0) as usize).ok_or("fetched WAL beyond the log")?;
                if ghost != &data[..] {
                    return Err(format!("fetched WAL at {from} differs from the elected history"));
                }
                self.fetched.bytes.extend_from_slice(data);
                let held = self.fetched.bytes.len() as u64;
                if self.fetched_max > 0 && held > self.fetched_max {
                    return Err(format!("{held} fetched bytes held, more than max_fetched {}", self.fetched_max));
                }
                self.fetched_peak = self.fetched_peak.max(held);
                // Above the start: its own WAL, fetched back for an acceptor behind what it kept.
                self.fetched_above_start += to.saturating_sub(from.0.max(self.start.0));
                None
            }
            ProposerAction::ReleaseWal { below } => {
                if *below >= self.fetched.end() {
                    self.fetched = Wal { begin: *below, bytes: Vec::new() };
                } else if *below > self.fetched.begin {
                    self.fetched.bytes.drain(..(below.0 - self.fetched.begin.0) as usize);
                    self.fetched.begin = *below;
                }
                None
            }
            _ => None,
        })
    }

    /// The committed log this proposer claims when it reports `commit_lsn`.
    pub fn committed(&self, commit_lsn: Lsn) -> Result<&[u8], String> {
        let n = (commit_lsn.0 - WAL_START.0) as usize;
        self.ghost.get(..n).ok_or_else(|| format!("commit {commit_lsn} beyond the proposer's log"))
    }
}

/// Record bytes for payload `id`: deterministic, and different for different ids. Like a
/// WAL record, it says how long it is (its first two bytes, little-endian; or, for a record
/// of 64 KiB or more, two zero bytes and then four), so a log can be split into records
/// ([`is_record_boundary`]). `len` is at least 2, and at least 6 for a long one.
pub fn record(id: u64, len: usize) -> Vec<u8> {
    assert!(len >= 2 && len <= u32::MAX as usize);
    let mut x = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut bytes: Vec<u8> =
        if len <= u16::MAX as usize { (len as u16).to_le_bytes().to_vec() } else { [&[0u8, 0][..], &(len as u32).to_le_bytes()].concat() };
    let header = bytes.len();
    bytes.extend((header..len).map(|_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x as u8
    }));
    bytes
}

/// Whether a record of `log` (WAL from `WAL_START`) ends at `lsn`, or `lsn` is the start.
pub fn is_record_boundary(log: &[u8], lsn: Lsn) -> bool {
    let Some(target) = lsn.0.checked_sub(WAL_START.0).map(|t| t as usize) else { return false };
    let mut at = 0;
    while at < target {
        let Some(header) = log.get(at..at + 2) else { return false };
        let mut len = u16::from_le_bytes([header[0], header[1]]) as usize;
        if len == 0 {
            let Some(long) = log.get(at + 2..at + 6) else { return false };
            len = u32::from_le_bytes(long.try_into().expect("4 bytes")) as usize;
        }
        if len < 2 {
            return false;
        }
        at += len;
    }
    at == target && target <= log.len()
}
