//! `RM_XACT_ID` records: commit, abort, and the two-phase prepare, commit and abort.
//!
//! These set transaction status in CLOG (for the xid and its subtransactions) and drop the
//! relations a transaction deleted, so storage must see them. The layout is
//! `ParseCommitRecord` / `ParseAbortRecord` / `ParsePrepareRecord` in `xactdesc.c`: a fixed
//! part, then optional sub-records announced by bits in `xinfo`, in a fixed order.
//! Invalidation messages and dropped-statistics entries are skipped, not parsed: storage has
//! no use for them, but their lengths are still checked.

use bytes::Bytes;
use proto::{Lsn, Oid};

use super::{MainData, MetadataRecord};
use crate::consts::*;
use crate::ids::{RelFileNode, TransactionId};
use crate::record::DecodedRecord;
use crate::WalError;

/// Which way a transaction ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum XactKind {
    Commit,
    Abort,
    CommitPrepared,
    AbortPrepared,
}

impl XactKind {
    pub fn is_commit(self) -> bool {
        matches!(self, XactKind::Commit | XactKind::CommitPrepared)
    }
}

/// A commit or abort (`xl_xact_parsed_commit` / `xl_xact_parsed_abort`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XactCompletion {
    pub kind: XactKind,
    /// The transaction that ended: the record's `xl_xid`, or for the `*Prepared` kinds the
    /// prepared transaction (the record's own `xl_xid` belongs to the session that ran
    /// `COMMIT PREPARED`).
    pub xid: TransactionId,
    /// `TimestampTz`: microseconds since 2000-01-01.
    pub xact_time: i64,
    pub xinfo: u32,
    /// Database and tablespace, when `XACT_XINFO_HAS_DBINFO`; 0 otherwise.
    pub db_id: Oid,
    pub ts_id: Oid,
    pub subxacts: Vec<TransactionId>,
    /// Relations whose every fork is dropped by this commit or abort.
    pub dropped_rels: Vec<RelFileNode>,
    pub twophase_xid: Option<TransactionId>,
    /// The global transaction id, decoded lossily if it is not UTF-8.
    pub twophase_gid: Option<String>,
    /// The replication origin's LSN and timestamp, when `XACT_XINFO_HAS_ORIGIN`.
    pub origin: Option<(Lsn, i64)>,
}

/// A `PREPARE TRANSACTION` (`xl_xact_prepare` and what follows it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XactPrepare {
    pub xid: TransactionId,
    pub db_id: Oid,
    /// `TimestampTz`: microseconds since 2000-01-01.
    pub prepared_at: i64,
    pub owner: Oid,
    pub subxacts: Vec<TransactionId>,
    /// Relations dropped if the transaction commits, and if it aborts.
    pub commit_rels: Vec<RelFileNode>,
    pub abort_rels: Vec<RelFileNode>,
    pub gid: String,
    /// The whole two-phase state as logged: the content of `pg_twophase/<xid>` minus its CRC.
    pub state: Bytes,
}

impl XactPrepare {
    /// The `pg_twophase` state file PostgreSQL would write for this transaction: the state
    /// followed by its CRC-32C (`RecreateTwoPhaseFile`).
    pub fn state_file(&self) -> Vec<u8> {
        let mut out = self.state.to_vec();
        out.extend_from_slice(&crc32c::crc32c(&self.state).to_le_bytes());
        out
    }
}

pub(super) fn parse(record: &DecodedRecord, info: u8) -> Result<Option<MetadataRecord>, WalError> {
    let kind = match info & XLOG_XACT_OPMASK {
        XLOG_XACT_COMMIT => XactKind::Commit,
        XLOG_XACT_ABORT => XactKind::Abort,
        XLOG_XACT_COMMIT_PREPARED => XactKind::CommitPrepared,
        XLOG_XACT_ABORT_PREPARED => XactKind::AbortPrepared,
        XLOG_XACT_PREPARE => return parse_prepare(record).map(|p| Some(MetadataRecord::XactPrepare(p))),
        _ => return Ok(None),
    };
    parse_completion(record, info, kind).map(|c| Some(MetadataRecord::XactCompletion(c)))
}

fn parse_completion(record: &DecodedRecord, info: u8, kind: XactKind) -> Result<XactCompletion, WalError> {
    let what = if kind.is_commit() { "transaction commit" } else { "transaction abort" };
    let mut d = MainData::new(record, what, 8, false)?;
    let xact_time = d.i64()?;
    let xinfo = if info & XLOG_XACT_HAS_INFO != 0 { d.u32()? } else { 0 };
    let (mut db_id, mut ts_id) = (0, 0);
    if xinfo & XACT_XINFO_HAS_DBINFO != 0 {
        db_id = d.u32()?;
        ts_id = d.u32()?;
    }
    let mut subxacts = Vec::new();
    if xinfo & XACT_XINFO_HAS_SUBXACTS != 0 {
        let n = d.count("nsubxacts")?;
        subxacts = read_xids(&mut d, n)?;
    }
    let mut dropped_rels = Vec::new();
    if xinfo & XACT_XINFO_HAS_RELFILENODES != 0 {
        let n = d.count("nrels")?;
        dropped_rels = read_rels(&mut d, n)?;
    }
    if xinfo & XACT_XINFO_HAS_DROPPED_STATS != 0 {
        let n = d.count("nitems")?;
        d.skip_items(n, SIZE_OF_XACT_STATS_ITEM)?;
    }
    // Abort records never carry invalidations, whatever the bit says (ParseAbortRecord).
    if kind.is_commit() && xinfo & XACT_XINFO_HAS_INVALS != 0 {
        let n = d.count("nmsgs")?;
        d.skip_items(n, SIZE_OF_SHARED_INVALIDATION_MESSAGE)?;
    }
    let (mut twophase_xid, mut twophase_gid) = (None, None);
    if xinfo & XACT_XINFO_HAS_TWOPHASE != 0 {
        twophase_xid = Some(TransactionId(d.u32()?));
        if xinfo & XACT_XINFO_HAS_GID != 0 {
            twophase_gid = Some(read_gid(&mut d)?);
        }
    }
    let mut origin = None;
    if xinfo & XACT_XINFO_HAS_ORIGIN != 0 {
        origin = Some((Lsn(d.u64()?), d.i64()?));
    }
    let xid = match kind {
        XactKind::Commit | XactKind::Abort => record.header.xid,
        XactKind::CommitPrepared | XactKind::AbortPrepared => {
            twophase_xid.ok_or_else(|| d.error("prepared transaction record without XACT_XINFO_HAS_TWOPHASE"))?
        }
    };
    Ok(XactCompletion { kind, xid, xact_time, xinfo, db_id, ts_id, subxacts, dropped_rels, twophase_xid, twophase_gid, origin })
}

fn parse_prepare(record: &DecodedRecord) -> Result<XactPrepare, WalError> {
    let mut d = MainData::new(record, "transaction prepare", SIZE_OF_XACT_PREPARE, false)?;
    let magic = d.u32()?;
    if magic != TWOPHASE_MAGIC {
        return Err(d.error(format!("invalid two-phase magic number {magic:08X}")));
    }
    let _total_len = d.u32()?;
    let xid = TransactionId(d.u32()?);
    let db_id = d.u32()?;
    let prepared_at = d.i64()?;
    let owner = d.u32()?;
    let nsubxacts = d.count("nsubxacts")?;
    let ncommitrels = d.count("ncommitrels")?;
    let nabortrels = d.count("nabortrels")?;
    let ncommitstats = d.count("ncommitstats")?;
    let nabortstats = d.count("nabortstats")?;
    let ninvalmsgs = d.count("ninvalmsgs")?;
    let _initfileinval = d.u8()?;
    d.u8()?; // padding before the 2-byte-aligned gidlen
    let gidlen = usize::from(d.u16()?);
    let _origin_lsn = d.u64()?;
    let _origin_timestamp = d.i64()?;
    // Each part after the header is MAXALIGNed (save_state_data pads every chunk).
    if gidlen == 0 || gidlen > GIDSIZE {
        return Err(d.error(format!("invalid gidlen {gidlen}")));
    }
    let gid_bytes = d.bytes(gidlen)?;
    let gid_end = gid_bytes.iter().position(|&b| b == 0).unwrap_or(gid_bytes.len());
    let gid = String::from_utf8_lossy(&gid_bytes[..gid_end]).into_owned();
    d.align8()?;
    let subxacts = read_xids(&mut d, nsubxacts)?;
    d.align8()?;
    let commit_rels = read_rels(&mut d, ncommitrels)?;
    d.align8()?;
    let abort_rels = read_rels(&mut d, nabortrels)?;
    d.align8()?;
    d.skip_items(ncommitstats, SIZE_OF_XACT_STATS_ITEM)?;
    d.align8()?;
    d.skip_items(nabortstats, SIZE_OF_XACT_STATS_ITEM)?;
    d.align8()?;
    d.skip_items(ninvalmsgs, SIZE_OF_SHARED_INVALIDATION_MESSAGE)?;
    Ok(XactPrepare { xid, db_id, prepared_at, owner, subxacts, commit_rels, abort_rels, gid, state: record.main_data.clone() })
}

fn read_xids(d: &mut MainData<'_>, n: usize) -> Result<Vec<TransactionId>, WalError> {
    // Check the bytes are there before allocating for a count read from WAL.
    if n.saturating_mul(4) > d.remaining() {
        return Err(d.error(format!("{n} transaction ids announced, only {} bytes left", d.remaining())));
    }
    (0..n).map(|_| d.u32().map(TransactionId)).collect()
}

fn read_rels(d: &mut MainData<'_>, n: usize) -> Result<Vec<RelFileNode>, WalError> {
    if n.saturating_mul(RelFileNode::SIZE) > d.remaining() {
        return Err(d.error(format!("{n} relations announced, only {} bytes left", d.remaining())));
    }
    (0..n).map(|_| d.rel_file_node()).collect()
}

/// A NUL-terminated global transaction id of at most `GIDSIZE` bytes.
fn read_gid(d: &mut MainData<'_>) -> Result<String, WalError> {
    let mut gid = Vec::new();
    loop {
        match d.u8()? {
            0 => break,
            b if gid.len() + 1 < GIDSIZE => gid.push(b),
            _ => return Err(d.error(format!("gid longer than {} bytes", GIDSIZE - 1))),
        }
    }
    Ok(String::from_utf8_lossy(&gid).into_owned())
}
