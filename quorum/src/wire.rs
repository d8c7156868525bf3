//! The safekeeper protocol on the wire: how a proposer (the compute's WAL proposer, or
//! `compute_ctl` syncing) talks to a safekeeper.
//!
//! One TCP connection per proposer and safekeeper. The proposer opens with `Hello` naming
//! the protocol version, tenant, timeline and the PostgreSQL system it writes WAL for, and
//! carrying its token (a JWT of the `auth` crate, or empty); the safekeeper answers
//! `HelloOk` (creating the timeline if it is new) or `Error` and closes. A safekeeper with
//! authentication on checks the token before anything else the `Hello` names, so a refused
//! proposer creates nothing.
//! After that the connection carries the consensus messages of [`crate::ToAcceptor`] and
//! [`crate::ToProposer`], and the safekeeper adds `Feedback` (the pageserver's progress)
//! and `Standbys` (the read replicas streaming from it) when they change.
//!
//! Every message is framed as a tag byte, a big-endian `u32` payload length, and the payload
//! (as the page service protocol in `proto::pagestream`); integers are big-endian, LSNs and
//! terms `u64`. WAL bytes are the rest of the payload. The decoder validates everything and
//! never panics: a malformed message is a [`WireError`] naming what was wrong, and the
//! receiver closes the connection after saying so.
//!
//! # Versions
//! Both sides must speak the same [`PROTOCOL_VERSION`]: the safekeeper refuses a `Hello` of
//! another version with `Error`, and the proposer a `HelloOk` of another version.
//! - 1: the first.
//! - 2 (WAL removal): `Append` carries the peer horizon and the pageserver's
//!   remote-consistent LSN after the commit LSN; `Feedback` carries the remote-consistent LSN
//!   after the apply LSN.
//! - 3: whole-record sync (no change to the messages here).
//! - 4 (read replicas): `Standbys`, the read replicas streaming from the safekeeper, with
//!   their positions and the oldest transaction they still need (hot standby feedback).
//! - 5 (authentication): `Hello` ends with the proposer's token (a string, empty for
//!   none), at most [`TOKEN_BYTES_MAX`] bytes.
//! - 6 (records of any size: the crate's "Record boundaries"): `Append` carries a record
//!   boundary after its begin LSN; `ElectedAck` and `AppendAck` carry the acceptor's
//!   boundary LSN after its flush LSN; `GreetingReply` and `Vote` report the boundary LSN
//!   where they reported the flush LSN (same layout).
//!
//! `Hello` is laid out alike up to its name in every version, so that a safekeeper can
//! decode an older proposer's `Hello` and refuse it naming both versions (rather than
//! reporting a truncated message): a `Hello` of version 4 or earlier is decoded without a
//! token, and encoded without one; versions 5 and 6 have the same `Hello`.

use crate::{Term, TermHistory, TermSwitch, ToAcceptor, ToProposer};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use proto::{Lsn, TenantId, TimelineId};

/// The protocol version this crate speaks.
pub const PROTOCOL_VERSION: u32 = 6;
/// The first version whose `Hello` carries a token.
pub const TOKEN_PROTOCOL_VERSION: u32 = 5;
/// The most WAL one `Append` or `Wal` message carries.
pub const WAL_BYTES_MAX: usize = 16 * 1024 * 1024;
/// No valid message is longer than this; anything longer is refused before it is read.
pub const MESSAGE_BYTES_MAX: usize = WAL_BYTES_MAX + 64;
/// The longest term history accepted.
pub const HISTORY_ENTRIES_MAX: usize = 10_000;
/// The longest string (a name, an error message) accepted.
pub const STRING_BYTES_MAX: usize = 4096;
/// The most read replicas one `Standbys` message lists (a safekeeper reports the ones it
/// heard from most recently).
pub const STANDBYS_MAX: usize = 64;
/// The longest standby name accepted.
pub const STANDBY_NAME_BYTES_MAX: usize = 128;
/// The longest token a `Hello` carries: the same bound as `auth::TOKEN_BYTES_MAX` (this
/// crate does not depend on `auth`, which does crypto; a proposer checks its token against
/// this bound before it connects, and a safekeeper refuses a longer one as malformed).
pub const TOKEN_BYTES_MAX: usize = 4096;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("message too long: {0} bytes (at most {MESSAGE_BYTES_MAX})")]
    TooLong(usize),
    #[error("unknown message tag {0:#04x}")]
    UnknownTag(u8),
    #[error("message {tag:?} is truncated")]
    Truncated { tag: char },
    #[error("message {tag:?} has {extra} unexpected trailing bytes")]
    Trailing { tag: char, extra: usize },
    #[error("message {tag:?}: {what}")]
    Invalid { tag: char, what: String },
}

/// The proposer's side. `Debug` leaves the token out: messages end up in logs.
#[derive(Clone, PartialEq, Eq)]
pub enum ProposerMessage {
    Hello {
        protocol_version: u32,
        tenant: TenantId,
        timeline: TimelineId,
        /// PostgreSQL's system identifier of the cluster whose WAL this is.
        system_id: u64,
        wal_segment_size: u32,
        /// Who is speaking, for the safekeeper's log (e.g. "walproposer pid 123").
        name: String,
        /// The proposer's token (a JWT signed by the cluster's key, granting this
        /// timeline), or empty for none. Only from [`TOKEN_PROTOCOL_VERSION`] on; never
        /// logged.
        auth_token: String,
    },
    Consensus(ToAcceptor),
}

impl std::fmt::Debug for ProposerMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProposerMessage::Hello { protocol_version, tenant, timeline, system_id, wal_segment_size, name, auth_token } => f
                .debug_struct("Hello")
                .field("protocol_version", protocol_version)
                .field("tenant", tenant)
                .field("timeline", timeline)
                .field("system_id", system_id)
                .field("wal_segment_size", wal_segment_size)
                .field("name", name)
                .field("auth_token", &format_args!("{}", if auth_token.is_empty() { "none" } else { "<redacted>" }))
                .finish(),
            ProposerMessage::Consensus(m) => f.debug_tuple("Consensus").field(m).finish(),
        }
    }
}

/// The pageserver's progress as a safekeeper last heard it (standby status updates), and
/// the highest remote-consistent LSN it knows (from the pageserver, or relayed by a
/// proposer).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageserverFeedback {
    pub write_lsn: Lsn,
    pub flush_lsn: Lsn,
    pub apply_lsn: Lsn,
    pub remote_consistent_lsn: Lsn,
}

/// One read replica streaming from a safekeeper, as it last reported itself: the positions
/// of its standby status updates and the transaction horizon of its hot standby feedback.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StandbyReport {
    /// The replica's `application_name` (compute_ctl names it after the endpoint).
    pub name: String,
    /// WAL the replica has received and flushed.
    pub flush_lsn: Lsn,
    /// WAL the replica has replayed: its queries see the data as of this LSN.
    pub apply_lsn: Lsn,
    /// The oldest transaction id (with epoch: a `FullTransactionId`) that a query on the
    /// replica may still need; 0 if it reported none (no hot standby feedback, or nothing
    /// running).
    pub xmin: u64,
    /// The same for the system catalogs (logical decoding); 0 if none.
    pub catalog_xmin: u64,
    /// How long ago the safekeeper last heard from the replica, in milliseconds.
    pub age_ms: u32,
}

/// The safekeeper's side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcceptorMessage {
    HelloOk {
        protocol_version: u32,
        node_id: u64,
    },
    /// Refused: the connection is closed after this.
    Error {
        message: String,
    },
    Consensus(ToProposer),
    Feedback(PageserverFeedback),
    /// The read replicas streaming from this safekeeper now (replaces the previous list).
    Standbys(Vec<StandbyReport>),
}

/// How many bytes the first complete frame in `buf` occupies, or `None` if it is not
/// complete yet. Errors on an unknown tag or an impossible length before the rest arrives.
pub fn frame_len(buf: &[u8]) -> Result<Option<usize>, WireError> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if len > MESSAGE_BYTES_MAX {
        return Err(WireError::TooLong(len));
    }
    Ok(if buf.len() >= 5 + len { Some(5 + len) } else { None })
}

fn frame(buf: &mut BytesMut, tag: u8, body: impl FnOnce(&mut BytesMut)) {
    buf.put_u8(tag);
    let at = buf.len();
    buf.put_u32(0);
    body(buf);
    let len = (buf.len() - at - 4) as u32;
    buf[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
fn truncate_utf8(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn put_str(buf: &mut BytesMut, s: &str) {
    let s = &s.as_bytes()[..s.len().min(STRING_BYTES_MAX)];
    buf.put_u32(s.len() as u32);
    buf.put_slice(s);
}

fn put_history(buf: &mut BytesMut, h: &TermHistory) {
    buf.put_u32(h.0.len() as u32);
    for e in &h.0 {
        buf.put_u64(e.term);
        buf.put_u64(e.lsn.0);
    }
}

/// Reads a payload, checking every length.
struct Reader {
    tag: char,
    b: Bytes,
}

impl Reader {
    fn need(&self, n: usize) -> Result<(), WireError> {
        if self.b.remaining() < n {
            return Err(WireError::Truncated { tag: self.tag });
        }
        Ok(())
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        self.need(1)?;
        Ok(self.b.get_u8())
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        self.need(4)?;
        Ok(self.b.get_u32())
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        self.need(8)?;
        Ok(self.b.get_u64())
    }
    fn lsn(&mut self) -> Result<Lsn, WireError> {
        self.u64().map(Lsn)
    }
    fn id16(&mut self) -> Result<[u8; 16], WireError> {
        self.need(16)?;
        let mut a = [0u8; 16];
        self.b.copy_to_slice(&mut a);
        Ok(a)
    }
    fn invalid(&self, what: impl Into<String>) -> WireError {
        WireError::Invalid { tag: self.tag, what: what.into() }
    }
    fn string(&mut self) -> Result<String, WireError> {
        let n = self.u32()? as usize;
        if n > STRING_BYTES_MAX {
            return Err(self.invalid(format!("string of {n} bytes (at most {STRING_BYTES_MAX})")));
        }
        self.need(n)?;
        let s = self.b.split_to(n);
        String::from_utf8(s.to_vec()).map_err(|_| self.invalid("string is not UTF-8"))
    }
    /// A `Hello`'s token: a string of at most [`TOKEN_BYTES_MAX`] bytes.
    fn token(&mut self) -> Result<String, WireError> {
        let n = self.u32()? as usize;
        if n > TOKEN_BYTES_MAX {
            return Err(self.invalid(format!("token of {n} bytes (at most {TOKEN_BYTES_MAX})")));
        }
        self.need(n)?;
        let s = self.b.split_to(n);
        String::from_utf8(s.to_vec()).map_err(|_| self.invalid("token is not UTF-8"))
    }
    fn bool(&mut self) -> Result<bool, WireError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(self.invalid(format!("boolean {v}"))),
        }
    }
    fn history(&mut self) -> Result<TermHistory, WireError> {
        let n = self.u32()? as usize;
        if n > HISTORY_ENTRIES_MAX {
            return Err(self.invalid(format!("term history of {n} entries (at most {HISTORY_ENTRIES_MAX})")));
        }
        self.need(n * 16)?;
        let mut h = Vec::with_capacity(n);
        for _ in 0..n {
            let term: Term = self.b.get_u64();
            let lsn = Lsn(self.b.get_u64());
            if let Some(prev) = h.last() {
                let prev: &TermSwitch = prev;
                if term <= prev.term || lsn < prev.lsn {
                    return Err(self.invalid("term history is not increasing"));
                }
            }
            if term == 0 {
                return Err(self.invalid("term history has term 0"));
            }
            h.push(TermSwitch { term, lsn });
        }
        Ok(TermHistory(h))
    }
    fn rest(&mut self) -> Bytes {
        std::mem::take(&mut self.b)
    }
    fn wal(&mut self) -> Result<Bytes, WireError> {
        let data = self.rest();
        if data.len() > WAL_BYTES_MAX {
            return Err(self.invalid(format!("{} WAL bytes (at most {WAL_BYTES_MAX})", data.len())));
        }
        Ok(data)
    }
    fn done(self) -> Result<(), WireError> {
        if self.b.has_remaining() {
            return Err(WireError::Trailing { tag: self.tag, extra: self.b.remaining() });
        }
        Ok(())
    }
}

/// Splits the first complete frame off `buf`: `(tag, payload)`, or `None` if incomplete.
fn split_frame(buf: &mut BytesMut) -> Result<Option<(u8, Bytes)>, WireError> {
    let Some(n) = frame_len(buf)? else { return Ok(None) };
    let mut f = buf.split_to(n).freeze();
    let tag = f.get_u8();
    f.advance(4);
    Ok(Some((tag, f)))
}

fn lsn_range_ok(r: &Reader, from: Lsn, to: Lsn) -> Result<(), WireError> {
    if from > to {
        return Err(r.invalid(format!("range {from}..{to} is backwards")));
    }
    Ok(())
}

impl ProposerMessage {
    pub fn encode(&self, buf: &mut BytesMut) {
        match self {
            ProposerMessage::Hello { protocol_version, tenant, timeline, system_id, wal_segment_size, name, auth_token } => {
                frame(buf, b'H', |b| {
                    b.put_u32(*protocol_version);
                    b.put_slice(tenant.as_bytes());
                    b.put_slice(timeline.as_bytes());
                    b.put_u64(*system_id);
                    b.put_u32(*wal_segment_size);
                    put_str(b, name);
                    if *protocol_version >= TOKEN_PROTOCOL_VERSION {
                        // Written whole, never cut: a cut token would only fail as a bad
                        // signature. One over the bound is refused by the decoder, naming
                        // its length (the proposer checks the bound before it connects).
                        b.put_u32(auth_token.len() as u32);
                        b.put_slice(auth_token.as_bytes());
                    }
                })
            }
            ProposerMessage::Consensus(m) => match m {
                ToAcceptor::Greeting { round } => frame(buf, b'G', |b| b.put_u64(*round)),
                ToAcceptor::VoteRequest { term, proposer } => frame(buf, b'V', |b| {
                    b.put_u64(*term);
                    b.put_u64(*proposer);
                }),
                ToAcceptor::Elected { term, history, start_lsn, log_begin, proposer } => frame(buf, b'E', |b| {
                    b.put_u64(*term);
                    b.put_u64(start_lsn.0);
                    b.put_u64(log_begin.0);
                    b.put_u64(*proposer);
                    put_history(b, history);
                }),
                ToAcceptor::FetchWal { term, from, to } => frame(buf, b'F', |b| {
                    b.put_u64(*term);
                    b.put_u64(from.0);
                    b.put_u64(to.0);
                }),
                ToAcceptor::Append { term, begin_lsn, data, boundary_lsn, commit_lsn, peer_horizon_lsn, remote_consistent_lsn } => {
                    frame(buf, b'A', |b| {
                        b.put_u64(*term);
                        b.put_u64(begin_lsn.0);
                        b.put_u64(boundary_lsn.0);
                        b.put_u64(commit_lsn.0);
                        b.put_u64(peer_horizon_lsn.0);
                        b.put_u64(remote_consistent_lsn.0);
                        b.put_slice(data);
                    })
                }
            },
        }
    }

    /// Decodes the first complete message in `buf` and removes it; `Ok(None)` if `buf`
    /// does not hold a whole one yet.
    pub fn decode(buf: &mut BytesMut) -> Result<Option<ProposerMessage>, WireError> {
        let Some((tag, payload)) = split_frame(buf)? else { return Ok(None) };
        let mut r = Reader { tag: tag as char, b: payload };
        let m = match tag {
            b'H' => {
                let protocol_version = r.u32()?;
                let tenant = TenantId::from_bytes(r.id16()?);
                let timeline = TimelineId::from_bytes(r.id16()?);
                let system_id = r.u64()?;
                let wal_segment_size = r.u32()?;
                if !wal_segment_size.is_power_of_two() || !(1 << 20..=1 << 30).contains(&wal_segment_size) {
                    return Err(r.invalid(format!("WAL segment size {wal_segment_size} is not a power of two between 1 MiB and 1 GiB")));
                }
                let name = r.string()?;
                let auth_token = if protocol_version >= TOKEN_PROTOCOL_VERSION { r.token()? } else { String::new() };
                ProposerMessage::Hello { protocol_version, tenant, timeline, system_id, wal_segment_size, name, auth_token }
            }
            b'G' => ProposerMessage::Consensus(ToAcceptor::Greeting { round: r.u64()? }),
            b'V' => {
                let term = r.u64()?;
                let proposer = r.u64()?;
                if term == 0 {
                    return Err(r.invalid("vote request for term 0"));
                }
                ProposerMessage::Consensus(ToAcceptor::VoteRequest { term, proposer })
            }
            b'E' => {
                let term = r.u64()?;
                let start_lsn = r.lsn()?;
                let log_begin = r.lsn()?;
                let proposer = r.u64()?;
                let history = r.history()?;
                match history.0.last() {
                    Some(last) if last.term == term && last.lsn == start_lsn => {}
                    _ => return Err(r.invalid("elected history does not end with the term at its start LSN")),
                }
                if log_begin > start_lsn {
                    return Err(r.invalid(format!("log begin {log_begin} beyond the start LSN {start_lsn}")));
                }
                ProposerMessage::Consensus(ToAcceptor::Elected { term, history, start_lsn, log_begin, proposer })
            }
            b'F' => {
                let term = r.u64()?;
                let from = r.lsn()?;
                let to = r.lsn()?;
                lsn_range_ok(&r, from, to)?;
                ProposerMessage::Consensus(ToAcceptor::FetchWal { term, from, to })
            }
            b'A' => {
                let term = r.u64()?;
                let begin_lsn = r.lsn()?;
                let boundary_lsn = r.lsn()?;
                let commit_lsn = r.lsn()?;
                let peer_horizon_lsn = r.lsn()?;
                let remote_consistent_lsn = r.lsn()?;
                let data = r.wal()?;
                let Some(end) = begin_lsn.0.checked_add(data.len() as u64) else {
                    return Err(r.invalid("WAL beyond the largest LSN"));
                };
                // A boundary the acceptor's WAL could reach only with bytes not sent.
                if boundary_lsn.0 > end {
                    return Err(r.invalid(format!("record boundary {boundary_lsn} beyond the end of the WAL sent {}", Lsn(end))));
                }
                // A proposer caps the horizon by its commit LSN.
                if peer_horizon_lsn > commit_lsn {
                    return Err(r.invalid(format!("peer horizon {peer_horizon_lsn} beyond the commit LSN {commit_lsn}")));
                }
                ProposerMessage::Consensus(ToAcceptor::Append {
                    term,
                    begin_lsn,
                    data,
                    boundary_lsn,
                    commit_lsn,
                    peer_horizon_lsn,
                    remote_consistent_lsn,
                })
            }
            t => return Err(WireError::UnknownTag(t)),
        };
        r.done()?;
        Ok(Some(m))
    }
}

impl AcceptorMessage {
    pub fn encode(&self, buf: &mut BytesMut) {
        match self {
            AcceptorMessage::HelloOk { protocol_version, node_id } => frame(buf, b'h', |b| {
                b.put_u32(*protocol_version);
                b.put_u64(*node_id);
            }),
            AcceptorMessage::Error { message } => frame(buf, b'x', |b| put_str(b, message)),
            AcceptorMessage::Feedback(f) => frame(buf, b'f', |b| {
                b.put_u64(f.write_lsn.0);
                b.put_u64(f.flush_lsn.0);
                b.put_u64(f.apply_lsn.0);
                b.put_u64(f.remote_consistent_lsn.0);
            }),
            AcceptorMessage::Standbys(list) => frame(buf, b's', |b| {
                let list = &list[..list.len().min(STANDBYS_MAX)];
                b.put_u32(list.len() as u32);
                for s in list {
                    let name = truncate_utf8(&s.name, STANDBY_NAME_BYTES_MAX);
                    put_str(b, name);
                    b.put_u64(s.flush_lsn.0);
                    b.put_u64(s.apply_lsn.0);
                    b.put_u64(s.xmin);
                    b.put_u64(s.catalog_xmin);
                    b.put_u32(s.age_ms);
                }
            }),
            AcceptorMessage::Consensus(m) => match m {
                ToProposer::GreetingReply { round, term, last_log_term, boundary_lsn, learner } => frame(buf, b'g', |b| {
                    b.put_u64(*round);
                    b.put_u64(*term);
                    b.put_u64(*last_log_term);
                    b.put_u64(boundary_lsn.0);
                    b.put_u8(*learner as u8);
                }),
                ToProposer::Vote { term, granted, acceptor_term, history, boundary_lsn, commit_lsn, peer_horizon_lsn } => {
                    frame(buf, b'v', |b| {
                        b.put_u64(*term);
                        b.put_u8(*granted as u8);
                        b.put_u64(*acceptor_term);
                        b.put_u64(boundary_lsn.0);
                        b.put_u64(commit_lsn.0);
                        b.put_u64(peer_horizon_lsn.0);
                        put_history(b, history);
                    })
                }
                ToProposer::ElectedAck { term, flush_lsn, boundary_lsn } => frame(buf, b'k', |b| {
                    b.put_u64(*term);
                    b.put_u64(flush_lsn.0);
                    b.put_u64(boundary_lsn.0);
                }),
                ToProposer::Wal { term, from, data } => frame(buf, b'w', |b| {
                    b.put_u64(*term);
                    b.put_u64(from.0);
                    b.put_slice(data);
                }),
                ToProposer::AppendAck { term, flush_lsn, boundary_lsn, commit_lsn } => frame(buf, b'a', |b| {
                    b.put_u64(*term);
                    b.put_u64(flush_lsn.0);
                    b.put_u64(boundary_lsn.0);
                    b.put_u64(commit_lsn.0);
                }),
                ToProposer::Rejected { term, acceptor_term } => frame(buf, b'r', |b| {
                    b.put_u64(*term);
                    b.put_u64(*acceptor_term);
                }),
            },
        }
    }

    /// Decodes the first complete message in `buf` and removes it; `Ok(None)` if `buf`
    /// does not hold a whole one yet.
    pub fn decode(buf: &mut BytesMut) -> Result<Option<AcceptorMessage>, WireError> {
        let Some((tag, payload)) = split_frame(buf)? else { return Ok(None) };
        let mut r = Reader { tag: tag as char, b: payload };
        let m = match tag {
            b'h' => AcceptorMessage::HelloOk { protocol_version: r.u32()?, node_id: r.u64()? },
            b'x' => AcceptorMessage::Error { message: r.string()? },
            b'f' => AcceptorMessage::Feedback(PageserverFeedback {
                write_lsn: r.lsn()?,
                flush_lsn: r.lsn()?,
                apply_lsn: r.lsn()?,
                remote_consistent_lsn: r.lsn()?,
            }),
            b's' => {
                let n = r.u32()? as usize;
                if n > STANDBYS_MAX {
                    return Err(r.invalid(format!("{n} standbys (at most {STANDBYS_MAX})")));
                }
                let mut list = Vec::with_capacity(n);
                for _ in 0..n {
                    let name = r.string()?;
                    if name.len() > STANDBY_NAME_BYTES_MAX {
                        return Err(r.invalid(format!("standby name of {} bytes (at most {STANDBY_NAME_BYTES_MAX})", name.len())));
                    }
                    let s = StandbyReport {
                        name,
                        flush_lsn: r.lsn()?,
                        apply_lsn: r.lsn()?,
                        xmin: r.u64()?,
                        catalog_xmin: r.u64()?,
                        age_ms: r.u32()?,
                    };
                    list.push(s);
                }
                AcceptorMessage::Standbys(list)
            }
            b'g' => {
                let round = r.u64()?;
                let term = r.u64()?;
                let last_log_term = r.u64()?;
                let boundary_lsn = r.lsn()?;
                let learner = r.bool()?;
                // An acceptor's log holds only terms it has seen.
                if last_log_term > term {
                    return Err(r.invalid(format!("last log term {last_log_term} above the term {term}")));
                }
                AcceptorMessage::Consensus(ToProposer::GreetingReply { round, term, last_log_term, boundary_lsn, learner })
            }
            b'v' => {
                let term = r.u64()?;
                let granted = r.bool()?;
                let acceptor_term = r.u64()?;
                let boundary_lsn = r.lsn()?;
                let commit_lsn = r.lsn()?;
                let peer_horizon_lsn = r.lsn()?;
                let history = r.history()?;
                if commit_lsn > boundary_lsn {
                    return Err(r.invalid("commit LSN beyond the boundary LSN"));
                }
                if peer_horizon_lsn > boundary_lsn {
                    return Err(r.invalid("peer horizon beyond the boundary LSN"));
                }
                AcceptorMessage::Consensus(ToProposer::Vote {
                    term,
                    granted,
                    acceptor_term,
                    history,
                    boundary_lsn,
                    commit_lsn,
                    peer_horizon_lsn,
                })
            }
            b'k' => {
                let term = r.u64()?;
                let flush_lsn = r.lsn()?;
                let boundary_lsn = r.lsn()?;
                if boundary_lsn > flush_lsn {
                    return Err(r.invalid("boundary LSN beyond flush LSN"));
                }
                AcceptorMessage::Consensus(ToProposer::ElectedAck { term, flush_lsn, boundary_lsn })
            }
            b'w' => {
                let term = r.u64()?;
                let from = r.lsn()?;
                let data = r.wal()?;
                AcceptorMessage::Consensus(ToProposer::Wal { term, from, data })
            }
            b'a' => {
                let term = r.u64()?;
                let flush_lsn = r.lsn()?;
                let boundary_lsn = r.lsn()?;
                let commit_lsn = r.lsn()?;
                if boundary_lsn > flush_lsn {
                    return Err(r.invalid("boundary LSN beyond flush LSN"));
                }
                if commit_lsn > boundary_lsn {
                    return Err(r.invalid("commit LSN beyond the boundary LSN"));
                }
                AcceptorMessage::Consensus(ToProposer::AppendAck { term, flush_lsn, boundary_lsn, commit_lsn })
            }
            b'r' => AcceptorMessage::Consensus(ToProposer::Rejected { term: r.u64()?, acceptor_term: r.u64()? }),
            t => return Err(WireError::UnknownTag(t)),
        };
        r.done()?;
        Ok(Some(m))
    }
}

#[cfg(test)]
mod tests;
