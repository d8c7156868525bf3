//! `RM_XLOG_ID` records: checkpoints, `XLOG_NEXTOID` and `XLOG_SWITCH`.
//!
//! The checkpoint record carries the cluster-wide counters (next xid, next OID, next
//! multixact, the oldest xids) that a basebackup's `pg_control` must reproduce, so it is
//! parsed field by field. `CheckPoint` also serializes back to the same 88 bytes, for the
//! code that synthesizes `pg_control`. Full-page-image records (`XLOG_FPI`,
//! `XLOG_FPI_FOR_HINT`) need nothing here: they are ordinary block references.

use proto::{Lsn, Oid};

use super::{MainData, MetadataRecord};
use crate::consts::*;
use crate::ids::{FullTransactionId, MultiXactId, MultiXactOffset, TimeLineId, TransactionId};
use crate::record::DecodedRecord;
use crate::WalError;

/// PostgreSQL's `CheckPoint` struct (`catalog/pg_control.h`), field for field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckPoint {
    /// Where redo starts: the insert position when the checkpoint began.
    pub redo: Lsn,
    pub this_timeline_id: TimeLineId,
    pub prev_timeline_id: TimeLineId,
    pub full_page_writes: bool,
    pub next_xid: FullTransactionId,
    pub next_oid: Oid,
    pub next_multi: MultiXactId,
    pub next_multi_offset: MultiXactOffset,
    /// The cluster-wide minimum `datfrozenxid`.
    pub oldest_xid: TransactionId,
    pub oldest_xid_db: Oid,
    pub oldest_multi: MultiXactId,
    pub oldest_multi_db: Oid,
    /// Seconds since the Unix epoch (`pg_time_t`).
    pub time: i64,
    pub oldest_commit_ts_xid: TransactionId,
    pub newest_commit_ts_xid: TransactionId,
    /// Oldest running xid, for hot standby; invalid in shutdown checkpoints.
    pub oldest_active_xid: TransactionId,
}

impl CheckPoint {
    fn read(d: &mut MainData<'_>) -> Result<CheckPoint, WalError> {
        let redo = Lsn(d.u64()?);
        let this_timeline_id = TimeLineId(d.u32()?);
        let prev_timeline_id = TimeLineId(d.u32()?);
        let full_page_writes = d.u8()? != 0;
        d.align8()?; // FullTransactionId is 8-aligned
        let next_xid = FullTransactionId(d.u64()?);
        let next_oid = d.u32()?;
        let next_multi = MultiXactId(d.u32()?);
        let next_multi_offset = MultiXactOffset(d.u32()?);
        let oldest_xid = TransactionId(d.u32()?);
        let oldest_xid_db = d.u32()?;
        let oldest_multi = MultiXactId(d.u32()?);
        let oldest_multi_db = d.u32()?;
        d.align8()?; // pg_time_t is 8-aligned
        let time = d.i64()?;
        let oldest_commit_ts_xid = TransactionId(d.u32()?);
        let newest_commit_ts_xid = TransactionId(d.u32()?);
        let oldest_active_xid = TransactionId(d.u32()?);
        Ok(CheckPoint {
            redo,
            this_timeline_id,
            prev_timeline_id,
            full_page_writes,
            next_xid,
            next_oid,
            next_multi,
            next_multi_offset,
            oldest_xid,
            oldest_xid_db,
            oldest_multi,
            oldest_multi_db,
            time,
            oldest_commit_ts_xid,
            newest_commit_ts_xid,
            oldest_active_xid,
        })
    }

    /// Reads the struct from its in-memory layout (the inverse of `to_bytes`), as stored in
    /// `pg_control`'s `checkPointCopy` or in a value of fjord's own. Padding is ignored.
    pub fn from_bytes(bytes: &[u8]) -> Result<CheckPoint, String> {
        if bytes.len() != SIZE_OF_CHECKPOINT {
            return Err(format!("CheckPoint is {} bytes, expected {SIZE_OF_CHECKPOINT}", bytes.len()));
        }
        let u32_at = |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        let u64_at = |at: usize| u64::from(u32_at(at)) | (u64::from(u32_at(at + 4)) << 32);
        Ok(CheckPoint {
            redo: Lsn(u64_at(0)),
            this_timeline_id: TimeLineId(u32_at(8)),
            prev_timeline_id: TimeLineId(u32_at(12)),
            full_page_writes: bytes[16] != 0,
            next_xid: FullTransactionId(u64_at(24)),
            next_oid: u32_at(32),
            next_multi: MultiXactId(u32_at(36)),
            next_multi_offset: MultiXactOffset(u32_at(40)),
            oldest_xid: TransactionId(u32_at(44)),
            oldest_xid_db: u32_at(48),
            oldest_multi: MultiXactId(u32_at(52)),
            oldest_multi_db: u32_at(56),
            time: u64_at(64) as i64,
            oldest_commit_ts_xid: TransactionId(u32_at(72)),
            newest_commit_ts_xid: TransactionId(u32_at(76)),
            oldest_active_xid: TransactionId(u32_at(80)),
        })
    }

    /// The struct's in-memory (and in-WAL) layout: `SIZE_OF_CHECKPOINT` bytes, padding zeroed.
    pub fn to_bytes(&self) -> [u8; SIZE_OF_CHECKPOINT] {
        let mut out = [0u8; SIZE_OF_CHECKPOINT];
        let mut put = |offset: usize, bytes: &[u8]| out[offset..offset + bytes.len()].copy_from_slice(bytes);
        put(0, &self.redo.0.to_le_bytes());
        put(8, &self.this_timeline_id.0.to_le_bytes());
        put(12, &self.prev_timeline_id.0.to_le_bytes());
        put(16, &[u8::from(self.full_page_writes)]);
        put(24, &self.next_xid.0.to_le_bytes());
        put(32, &self.next_oid.to_le_bytes());
        put(36, &self.next_multi.0.to_le_bytes());
        put(40, &self.next_multi_offset.0.to_le_bytes());
        put(44, &self.oldest_xid.0.to_le_bytes());
        put(48, &self.oldest_xid_db.to_le_bytes());
        put(52, &self.oldest_multi.0.to_le_bytes());
        put(56, &self.oldest_multi_db.to_le_bytes());
        put(64, &self.time.to_le_bytes());
        put(72, &self.oldest_commit_ts_xid.0.to_le_bytes());
        put(76, &self.newest_commit_ts_xid.0.to_le_bytes());
        put(80, &self.oldest_active_xid.0.to_le_bytes());
        out
    }
}

pub(super) fn parse(record: &DecodedRecord, info: u8) -> Result<Option<MetadataRecord>, WalError> {
    match info {
        XLOG_CHECKPOINT_SHUTDOWN | XLOG_CHECKPOINT_ONLINE => {
            let mut d = MainData::new(record, "checkpoint", SIZE_OF_CHECKPOINT, true)?;
            let checkpoint = CheckPoint::read(&mut d)?;
            Ok(Some(MetadataRecord::Checkpoint { shutdown: info == XLOG_CHECKPOINT_SHUTDOWN, checkpoint }))
        }
        XLOG_NEXTOID => {
            let mut d = MainData::new(record, "nextoid", 4, true)?;
            Ok(Some(MetadataRecord::NextOid(d.u32()?)))
        }
        XLOG_SWITCH => Ok(Some(MetadataRecord::Switch)),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn decode(bytes: &[u8]) -> Result<CheckPoint, WalError> {
        let record =
            crate::test_encoder::RecordSpec::new(RM_XLOG_ID, XLOG_CHECKPOINT_ONLINE).main_data(bytes.to_vec()).decoded(Lsn(0x1000028));
        match super::parse(&record, XLOG_CHECKPOINT_ONLINE)? {
            Some(MetadataRecord::Checkpoint { checkpoint, shutdown: false }) => Ok(checkpoint),
            other => panic!("unexpected {other:?}"),
        }
    }

    proptest! {
        #[test]
        fn checkpoint_round_trips(
            redo in any::<u64>(), tli in any::<u32>(), fpw in any::<bool>(), next_xid in any::<u64>(),
            oids in any::<[u32; 7]>(), time in any::<i64>(), xids in any::<[u32; 3]>(),
        ) {
            let cp = CheckPoint {
                redo: Lsn(redo),
                this_timeline_id: TimeLineId(tli),
                prev_timeline_id: TimeLineId(tli),
                full_page_writes: fpw,
                next_xid: FullTransactionId(next_xid),
                next_oid: oids[0],
                next_multi: MultiXactId(oids[1]),
                next_multi_offset: MultiXactOffset(oids[2]),
                oldest_xid: TransactionId(oids[3]),
                oldest_xid_db: oids[4],
                oldest_multi: MultiXactId(oids[5]),
                oldest_multi_db: oids[6],
                time,
                oldest_commit_ts_xid: TransactionId(xids[0]),
                newest_commit_ts_xid: TransactionId(xids[1]),
                oldest_active_xid: TransactionId(xids[2]),
            };
            prop_assert_eq!(decode(&cp.to_bytes()).unwrap(), cp);
            prop_assert_eq!(CheckPoint::from_bytes(&cp.to_bytes()).unwrap(), cp);
        }
    }

    #[test]
    fn wrong_length_is_an_error() {
        let err = decode(&[0u8; 80]).unwrap_err();
        assert_eq!(err.to_string(), "invalid checkpoint record at 0/1000028: main data is 80 bytes, expected 88");
        assert_eq!(CheckPoint::from_bytes(&[0u8; 87]).unwrap_err(), "CheckPoint is 87 bytes, expected 88");
    }
}
