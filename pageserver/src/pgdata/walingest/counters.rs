//! The cluster-wide counters a new server needs in `pg_control` (`checkPointCopy`), kept
//! current after every record: next xid (64-bit, with epoch), next OID, next multixact and
//! member offset, oldest xid and multixact with their databases.
//!
//! PostgreSQL's recovery keeps the same counters in shared memory while it replays WAL;
//! each rule here is the one its redo applies, so that a basebackup at any LSN starts a
//! server with the counters recovery would have reached there:
//!
//! - every record's `xl_xid`, and the subtransactions a commit or abort lists, advance the
//!   next xid past them (`AdvanceNextFullTransactionIdPastXid`): compared modulo 2^32
//!   (`TransactionIdFollowsOrEquals`), the epoch incremented when the 32-bit xid wraps, and
//!   the special xids 0..2 skipped after a wrap (`FullTransactionIdAdvance`);
//! - `XLOG_NEXTOID` sets the next OID; it is logged before any OID of the new range is
//!   used, so it is always ahead of every OID in use;
//! - `MultiXactCreate` advances the next multixact to `mid + 1` and the next offset to
//!   `moff + nmembers`, each only forward in modulo-2^32 order
//!   (`MultiXactAdvanceNextMXact`); `MultiXactTruncate` sets the oldest multixact
//!   (`SetMultiXactIdLimit(endTruncOff, oldestMultiDB)`);
//! - a checkpoint record replaces every other field (redo, timelines, time, commit
//!   timestamp xids, oldest active xid, `fullPageWrites`). Its counters are authoritative
//!   at its redo point, but records between the redo point and the checkpoint record may
//!   already have advanced the tracked ones, so next xid, next multixact and next offset
//!   take the later of the two. The next OID: a **shutdown** checkpoint's is taken as is
//!   (nothing ran after it); an **online** checkpoint's is ignored, as `xlog_redo` does,
//!   because `XLOG_NEXTOID` records already keep the tracked value ahead of it (the
//!   checkpoint's value can lag the OID range in use). The oldest xid: set by a shutdown
//!   checkpoint, advanced by an online one (`SetTransactionIdLimit`); the oldest multixact
//!   likewise advanced only (`MultiXactAdvanceOldest`), set by a shutdown checkpoint.
//!
//! Invariant: the stored checkpoint value changes only when a record changes it, and is
//! put at most once per record (with the record's other values, at its end LSN).

use pgwal::parse::CheckPoint;
use pgwal::{DecodedRecord, FullTransactionId, MetadataRecord, MultiXactId, MultiXactOffset, TransactionId};

use crate::pgdata::datadir::codec::StoredCheckpoint;

/// `FirstNormalTransactionId`.
const FIRST_NORMAL_XID: u32 = 3;

/// Modulo-2^32 `a precedes b` (`TransactionIdPrecedes` for normal xids,
/// `MultiXactIdPrecedes`, `MultiXactOffsetPrecedes`).
fn precedes(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// `AdvanceNextFullTransactionIdPastXid`: makes `next` follow `xid` if `xid` is a normal
/// xid at or after it.
pub fn advance_next_xid(next: &mut FullTransactionId, xid: TransactionId) {
    if xid.0 < FIRST_NORMAL_XID {
        return;
    }
    let next32 = next.xid().0;
    if precedes(xid.0, next32) {
        return;
    }
    let mut advanced = next.0.wrapping_add(u64::from(xid.0.wrapping_sub(next32))).wrapping_add(1);
    let low = advanced as u32;
    if low < FIRST_NORMAL_XID {
        // The 32-bit xid wrapped: the epoch is already incremented, skip the special xids.
        advanced += u64::from(FIRST_NORMAL_XID - low);
    }
    *next = FullTransactionId(advanced);
}

/// The later of two modulo-2^32 ids.
fn later(current: u32, candidate: u32) -> u32 {
    if precedes(current, candidate) {
        candidate
    } else {
        current
    }
}

/// Applies `record` (with its parsed metadata, if any) to the stored checkpoint; returns
/// the new value if anything changed. `record` is the whole checkpoint record when it is
/// one, and `stored` is `None` before any checkpoint is known (a timeline not made by
/// import): then only a checkpoint record starts tracking.
pub fn apply(stored: Option<&StoredCheckpoint>, record: &DecodedRecord, meta: Option<&MetadataRecord>) -> Option<StoredCheckpoint> {
    let mut new = match (stored, meta) {
        (old, Some(MetadataRecord::Checkpoint { shutdown, checkpoint })) => StoredCheckpoint {
            record_lsn: record.lsn,
            current: merge_checkpoint(old.map(|o| &o.current), checkpoint, *shutdown),
            record: record.raw.clone(),
        },
        (Some(old), _) => old.clone(),
        (None, _) => return None,
    };
    let cp = &mut new.current;
    advance_next_xid(&mut cp.next_xid, record.header.xid);
    match meta {
        Some(MetadataRecord::NextOid(oid)) => cp.next_oid = *oid,
        Some(MetadataRecord::XactCompletion(c)) => {
            advance_next_xid(&mut cp.next_xid, c.xid);
            for &sub in &c.subxacts {
                advance_next_xid(&mut cp.next_xid, sub);
            }
        }
        Some(MetadataRecord::XactPrepare(p)) => {
            advance_next_xid(&mut cp.next_xid, p.xid);
            for &sub in &p.subxacts {
                advance_next_xid(&mut cp.next_xid, sub);
            }
        }
        Some(MetadataRecord::MultiXactCreate(c)) => {
            let nmembers = c.members.len() as u32;
            cp.next_multi = MultiXactId(later(cp.next_multi.0, c.mid.0.wrapping_add(1)));
            cp.next_multi_offset = MultiXactOffset(later(cp.next_multi_offset.0, c.moff.0.wrapping_add(nmembers)));
        }
        Some(MetadataRecord::MultiXactTruncate(t)) => {
            cp.oldest_multi = t.end_trunc_off;
            cp.oldest_multi_db = t.oldest_multi_db;
        }
        _ => {}
    }
    (stored != Some(&new)).then_some(new)
}

/// The counters after checkpoint record `cp`, given those tracked before it.
fn merge_checkpoint(tracked: Option<&CheckPoint>, cp: &CheckPoint, shutdown: bool) -> CheckPoint {
    let Some(t) = tracked else {
        return *cp;
    };
    let mut out = *cp;
    out.next_xid = cp.next_xid.max(t.next_xid);
    out.next_multi = MultiXactId(later(t.next_multi.0, cp.next_multi.0));
    out.next_multi_offset = MultiXactOffset(later(t.next_multi_offset.0, cp.next_multi_offset.0));
    if !shutdown {
        out.next_oid = t.next_oid;
        if !precedes(t.oldest_xid.0, cp.oldest_xid.0) {
            out.oldest_xid = t.oldest_xid;
            out.oldest_xid_db = t.oldest_xid_db;
        }
        if !precedes(t.oldest_multi.0, cp.oldest_multi.0) {
            out.oldest_multi = t.oldest_multi;
            out.oldest_multi_db = t.oldest_multi_db;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(epoch: u32, xid: u32) -> FullTransactionId {
        FullTransactionId((u64::from(epoch) << 32) | u64::from(xid))
    }

    #[test]
    fn next_xid_advances_modulo_2_32_with_the_epoch() {
        let mut next = full(0, 100);
        advance_next_xid(&mut next, TransactionId(99));
        assert_eq!(next, full(0, 100), "an older xid does not move it");
        advance_next_xid(&mut next, TransactionId(2));
        assert_eq!(next, full(0, 100), "special xids are ignored");
        advance_next_xid(&mut next, TransactionId(100));
        assert_eq!(next, full(0, 101));
        advance_next_xid(&mut next, TransactionId(500));
        assert_eq!(next, full(0, 501));
        // Close to wraparound: an xid just past 2^32 belongs to the next epoch.
        let mut next = full(7, u32::MAX - 10);
        advance_next_xid(&mut next, TransactionId(u32::MAX - 1));
        assert_eq!(next, full(7, u32::MAX));
        advance_next_xid(&mut next, TransactionId(u32::MAX));
        assert_eq!(next, full(8, 3), "0, 1 and 2 are skipped after a wrap");
        let mut next = full(7, u32::MAX - 10);
        advance_next_xid(&mut next, TransactionId(5));
        assert_eq!(next, full(8, 6), "an xid after the wrap follows in modulo order");
        // Half the xid space ahead counts as the past.
        let mut next = full(1, 10);
        advance_next_xid(&mut next, TransactionId(10u32.wrapping_add(1 << 31)));
        assert_eq!(next, full(1, 10));
    }

    fn checkpoint(next_xid: FullTransactionId, next_oid: u32, next_multi: u32, next_offset: u32) -> CheckPoint {
        let mut cp = CheckPoint::from_bytes(&[0u8; pgwal::consts::SIZE_OF_CHECKPOINT]).unwrap();
        cp.next_xid = next_xid;
        cp.next_oid = next_oid;
        cp.next_multi = MultiXactId(next_multi);
        cp.next_multi_offset = MultiXactOffset(next_offset);
        cp.oldest_xid = TransactionId(700);
        cp
    }

    #[test]
    fn checkpoints_never_move_counters_back_but_shutdown_sets_the_oid() {
        let tracked = checkpoint(full(0, 900), 20000, 50, 400);
        let online = checkpoint(full(0, 800), 16384, 40, u32::MAX - 5);
        let merged = merge_checkpoint(Some(&tracked), &online, false);
        assert_eq!(merged.next_xid, full(0, 900));
        assert_eq!(merged.next_oid, 20000, "an online checkpoint's OID is ignored");
        assert_eq!(merged.next_multi, MultiXactId(50));
        assert_eq!(merged.next_multi_offset, MultiXactOffset(400), "modulo order: 400 follows 2^32-5");
        let shutdown = checkpoint(full(0, 950), 16000, 60, 500);
        let merged = merge_checkpoint(Some(&tracked), &shutdown, true);
        assert_eq!((merged.next_xid, merged.next_oid, merged.next_multi.0), (full(0, 950), 16000, 60));
        assert_eq!(merge_checkpoint(None, &online, false), online);
    }
}
