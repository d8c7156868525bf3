//! SLRU records: `RM_CLOG_ID` (transaction status pages) and `RM_MULTIXACT_ID`; and the
//! running-transactions record of `RM_STANDBY_ID`, which hot standbys start from.
//!
//! CLOG and multixact pages are not relation blocks, so their records carry no block
//! references: storage learns from these records when a page is zeroed, when old segments
//! are truncated away, and (for multixacts) which members a new multixact has, which redo
//! writes into the offsets and members SLRUs.

use proto::Oid;

use super::{MainData, MetadataRecord};
use crate::consts::*;
use crate::ids::{MultiXactId, MultiXactOffset, TransactionId};
use crate::record::DecodedRecord;
use crate::WalError;

/// `xl_clog_truncate`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClogTruncate {
    /// Segments wholly before this page are removed.
    pub pageno: u32,
    pub oldest_xact: TransactionId,
    pub oldest_xact_db: Oid,
}

/// `MultiXactStatus`: how a member holds its tuple.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MultiXactStatus {
    ForKeyShare = 0,
    ForShare = 1,
    ForNoKeyUpdate = 2,
    ForUpdate = 3,
    NoKeyUpdate = 4,
    Update = 5,
}

impl MultiXactStatus {
    pub fn from_u32(v: u32) -> Option<MultiXactStatus> {
        use MultiXactStatus::*;
        [ForKeyShare, ForShare, ForNoKeyUpdate, ForUpdate, NoKeyUpdate, Update].get(v as usize).copied()
    }
}

/// `MultiXactMember`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MultiXactMember {
    pub xid: TransactionId,
    pub status: MultiXactStatus,
}

/// `xl_multixact_create`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MultiXactCreate {
    pub mid: MultiXactId,
    /// Where the members start in the members SLRU.
    pub moff: MultiXactOffset,
    pub members: Vec<MultiXactMember>,
}

/// `xl_multixact_truncate`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MultiXactTruncate {
    pub oldest_multi_db: Oid,
    pub start_trunc_off: MultiXactId,
    pub end_trunc_off: MultiXactId,
    pub start_trunc_memb: MultiXactOffset,
    pub end_trunc_memb: MultiXactOffset,
}

/// A page number logged as a C `int`.
fn pageno(d: &mut MainData<'_>) -> Result<u32, WalError> {
    d.count("pageno").map(|n| n as u32)
}

pub(super) fn parse_clog(record: &DecodedRecord, info: u8) -> Result<Option<MetadataRecord>, WalError> {
    match info {
        CLOG_ZEROPAGE => {
            let mut d = MainData::new(record, "clog zeropage", 4, true)?;
            Ok(Some(MetadataRecord::ClogZeroPage { pageno: pageno(&mut d)? }))
        }
        CLOG_TRUNCATE => {
            let mut d = MainData::new(record, "clog truncate", 12, true)?;
            let pageno = pageno(&mut d)?;
            let oldest_xact = TransactionId(d.u32()?);
            let oldest_xact_db = d.u32()?;
            Ok(Some(MetadataRecord::ClogTruncate(ClogTruncate { pageno, oldest_xact, oldest_xact_db })))
        }
        _ => Ok(None),
    }
}

/// `xl_running_xacts` (`XLOG_RUNNING_XACTS` of `RM_STANDBY_ID`): the transactions running
/// when it was logged, which is where a hot standby learns them. The xid lists are
/// length-checked and skipped: storage only needs where the record is and its oldest xid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunningXacts {
    pub xcnt: u32,
    pub subxcnt: u32,
    pub subxid_overflow: bool,
    pub next_xid: TransactionId,
    pub oldest_running_xid: TransactionId,
    pub latest_completed_xid: TransactionId,
}

pub(super) fn parse_standby(record: &DecodedRecord, info: u8) -> Result<Option<MetadataRecord>, WalError> {
    if info != XLOG_RUNNING_XACTS {
        return Ok(None);
    }
    let mut d = MainData::new(record, "running xacts", MIN_SIZE_OF_RUNNING_XACTS, false)?;
    let xcnt = d.count("xcnt")?;
    let subxcnt = d.count("subxcnt")?;
    let subxid_overflow = match d.u8()? {
        0 => false,
        1 => true,
        other => return Err(d.error(format!("subxid_overflow is {other}, expected 0 or 1"))),
    };
    d.bytes(3)?; // padding before nextXid
    let next_xid = TransactionId(d.u32()?);
    let oldest_running_xid = TransactionId(d.u32()?);
    let latest_completed_xid = TransactionId(d.u32()?);
    let ids = xcnt.checked_add(subxcnt).ok_or_else(|| d.error("xcnt + subxcnt overflows"))?;
    d.skip_items(ids, 4)?;
    Ok(Some(MetadataRecord::RunningXacts(RunningXacts {
        xcnt: xcnt as u32,
        subxcnt: subxcnt as u32,
        subxid_overflow,
        next_xid,
        oldest_running_xid,
        latest_completed_xid,
    })))
}

pub(super) fn parse_multixact(record: &DecodedRecord, info: u8) -> Result<Option<MetadataRecord>, WalError> {
    match info {
        XLOG_MULTIXACT_ZERO_OFF_PAGE => {
            let mut d = MainData::new(record, "multixact zero offsets page", 4, true)?;
            Ok(Some(MetadataRecord::MultiXactZeroOffsetPage { pageno: pageno(&mut d)? }))
        }
        XLOG_MULTIXACT_ZERO_MEM_PAGE => {
            let mut d = MainData::new(record, "multixact zero members page", 4, true)?;
            Ok(Some(MetadataRecord::MultiXactZeroMemberPage { pageno: pageno(&mut d)? }))
        }
        XLOG_MULTIXACT_CREATE_ID => {
            let mut d = MainData::new(record, "multixact create", 12, false)?;
            let mid = MultiXactId(d.u32()?);
            let moff = MultiXactOffset(d.u32()?);
            let n = d.count("nmembers")?;
            if n.saturating_mul(8) != d.remaining() {
                return Err(d.error(format!("{n} members announced, {} bytes follow", d.remaining())));
            }
            let mut members = Vec::with_capacity(n);
            for _ in 0..n {
                let xid = TransactionId(d.u32()?);
                let raw = d.u32()?;
                let status = MultiXactStatus::from_u32(raw).ok_or_else(|| d.error(format!("invalid member status {raw}")))?;
                members.push(MultiXactMember { xid, status });
            }
            Ok(Some(MetadataRecord::MultiXactCreate(MultiXactCreate { mid, moff, members })))
        }
        XLOG_MULTIXACT_TRUNCATE_ID => {
            let mut d = MainData::new(record, "multixact truncate", 20, true)?;
            Ok(Some(MetadataRecord::MultiXactTruncate(MultiXactTruncate {
                oldest_multi_db: d.u32()?,
                start_trunc_off: MultiXactId(d.u32()?),
                end_trunc_off: MultiXactId(d.u32()?),
                start_trunc_memb: MultiXactOffset(d.u32()?),
                end_trunc_memb: MultiXactOffset(d.u32()?),
            })))
        }
        _ => Ok(None),
    }
}
