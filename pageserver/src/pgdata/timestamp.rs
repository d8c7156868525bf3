//! Points in time and LSNs: which LSN of a timeline shows exactly the transactions
//! committed by a given time.
//!
//! Ingest stores, at the end LSN of every commit record, the last commit timestamp
//! (`datadir`'s `last_commit_timestamp` key): the greatest commit timestamp so far. Read at
//! any LSN it says when the last commit at or before that LSN happened, and it never
//! decreases as the LSN grows, so a binary search over LSNs finds where a point in time
//! falls. The search reads only LSNs a read may use: from the GC cutoff or the branch point
//! (whichever is higher) up to the last record LSN; below the branch point the key comes
//! from the ancestor, as every read does.
//!
//! Used by GC (the PITR window's start as an LSN) and by anything that starts a compute "as
//! of" a time. Times are PostgreSQL's `TimestampTz`: microseconds since 2000-01-01 00:00
//! UTC, as commit records carry them.
//!
//! Invariant: a `Present` LSN is the end of a commit record (a record boundary, where a
//! basebackup may start) or the lowest readable LSN, and reading at it shows every commit
//! stamped at or before the time and none stamped after it (up to PostgreSQL's own
//! ordering: a commit stamped earlier but logged after a later-stamped one counts as later).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use proto::Lsn;

use crate::pgdata::datadir::{Datadir, DatadirError};
use crate::pgdata::reconstruct::PgReconstructor;
use layerstore::timeline::Timeline;

/// PostgreSQL's `TimestampTz`: microseconds since 2000-01-01 00:00:00 UTC.
pub type TimestampTz = i64;

/// Seconds from the Unix epoch to PostgreSQL's (2000-01-01).
const PG_EPOCH_UNIX_SECONDS: u64 = 946_684_800;

/// `t` as a `TimestampTz` (saturating far outside the years 1707 to 2292).
pub fn timestamptz_from_system_time(t: SystemTime) -> TimestampTz {
    let pg_epoch = UNIX_EPOCH + Duration::from_secs(PG_EPOCH_UNIX_SECONDS);
    let micros = |d: Duration| i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
    match t.duration_since(pg_epoch) {
        Ok(after) => micros(after),
        Err(before) => -micros(before.duration()),
    }
}

/// The `SystemTime` of a `TimestampTz`.
pub fn system_time_from_timestamptz(ts: TimestampTz) -> SystemTime {
    let pg_epoch = UNIX_EPOCH + Duration::from_secs(PG_EPOCH_UNIX_SECONDS);
    let offset = Duration::from_micros(ts.unsigned_abs());
    if ts >= 0 {
        pg_epoch + offset
    } else {
        pg_epoch - offset
    }
}

/// Where a point in time falls in a timeline's history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LsnForTimestamp {
    /// Commits at or before the time and after it are known. Reading at this LSN (the end
    /// of the last commit record at or before the time, or the lowest readable LSN if that
    /// commit is below it) shows exactly the commits up to the time.
    Present(Lsn),
    /// Every commit ingested is at or before the time: the last record LSN, which shows them
    /// all. WAL not yet ingested may still hold commits before the time.
    Future(Lsn),
    /// Every commit the readable history knows is after the time: the lowest readable LSN
    /// (GC cutoff or branch point), which already shows some of them. The state at the
    /// time itself can no longer be read.
    Past(Lsn),
    /// No commit up to the last record LSN (none since import, or WAL ingested before
    /// commit timestamps were stored): the last record LSN.
    NoData(Lsn),
}

impl std::fmt::Display for LsnForTimestamp {
    /// `present 0/16B3748`: the kind as the API names it, and the LSN.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            LsnForTimestamp::Present(_) => "present",
            LsnForTimestamp::Future(_) => "future",
            LsnForTimestamp::Past(_) => "past",
            LsnForTimestamp::NoData(_) => "nodata",
        };
        write!(f, "{kind} {}", self.lsn())
    }
}

impl LsnForTimestamp {
    pub fn lsn(&self) -> Lsn {
        match *self {
            LsnForTimestamp::Present(lsn) | LsnForTimestamp::Future(lsn) | LsnForTimestamp::Past(lsn) | LsnForTimestamp::NoData(lsn) => lsn,
        }
    }
}

/// The LSN of `timeline` that shows exactly the commits stamped at or before `timestamp`;
/// see [`LsnForTimestamp`] for what each answer means. About 64 reads of one key.
pub fn lsn_for_timestamp(timeline: &Timeline, timestamp: TimestampTz) -> Result<LsnForTimestamp, DatadirError> {
    let reconstructor = PgReconstructor::rust_only();
    let datadir = Datadir::new(timeline, &reconstructor);
    let hi = timeline.last_record_lsn();
    let lo = timeline.gc_cutoff_lsn().max(timeline.ancestor_lsn().unwrap_or(Lsn::INVALID)).min(hi);
    let at_or_before = |lsn: Lsn| -> Result<bool, DatadirError> { Ok(datadir.get_last_commit(lsn)?.is_none_or(|(_, ts)| ts <= timestamp)) };
    match datadir.get_last_commit(hi)? {
        None => return Ok(LsnForTimestamp::NoData(hi)),
        Some((_, newest)) if newest <= timestamp => return Ok(LsnForTimestamp::Future(hi)),
        Some(_) => {}
    }
    if !at_or_before(lo)? {
        return Ok(LsnForTimestamp::Past(lo));
    }
    // Invariant: the last commit at or before `good` is at or before the time (or there is
    // none), the last commit at or before `bad` is after it.
    let (mut good, mut bad) = (lo, hi);
    while bad.0 - good.0 > 1 {
        let mid = Lsn(good.0 + (bad.0 - good.0) / 2);
        if at_or_before(mid)? {
            good = mid;
        } else {
            bad = mid;
        }
    }
    // `good` is just below the first commit after the time; no commit lies between the
    // last one at or before `good` and `good`, so that commit's own LSN shows the same.
    Ok(match datadir.get_last_commit(good)? {
        Some((commit_lsn, _)) => LsnForTimestamp::Present(commit_lsn.max(lo)),
        None => LsnForTimestamp::Past(lo),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pgdata::datadir::Modification;
    use layerstore::tenant::Tenant;
    use layerstore::StorageConfig;
    use proto::{Key, TenantId, TimelineId};

    const MAIN: TimelineId = TimelineId([1; 16]);
    const BRANCH: TimelineId = TimelineId([2; 16]);

    /// Commits stamped 1000, 2000 and 3000 at 0x100, 0x200 and 0x300, and a record that
    /// is no commit at 0x400.
    fn timeline(dir: &std::path::Path) -> Tenant {
        let tenant = Tenant::create(dir, TenantId([7; 16]), StorageConfig::default(), &[]).unwrap();
        let t = tenant.create_timeline(MAIN).unwrap();
        for (lsn, ts) in [(0x100, 1000), (0x200, 2000), (0x300, 3000)] {
            let mut m = Modification::new(&t, Lsn(lsn));
            m.put_last_commit_timestamp(ts);
            m.commit().unwrap();
        }
        let mut m = Modification::new(&t, Lsn(0x400));
        m.put_image(Key::checkpoint(), bytes::Bytes::from_static(b"not a commit"));
        m.commit().unwrap();
        tenant
    }

    #[test]
    fn times_fall_between_commits() {
        let dir = tempfile::tempdir().unwrap();
        let tenant = timeline(dir.path());
        let t = tenant.get_timeline(MAIN).unwrap();
        use LsnForTimestamp::*;
        let cases = [
            (500, Past(Lsn(0))),
            (999, Past(Lsn(0))),
            (1000, Present(Lsn(0x100))),
            (1500, Present(Lsn(0x100))),
            (2000, Present(Lsn(0x200))),
            (2999, Present(Lsn(0x200))),
            (3000, Future(Lsn(0x400))),
            (i64::MAX, Future(Lsn(0x400))),
        ];
        for (ts, want) in cases {
            assert_eq!(lsn_for_timestamp(&t, ts).unwrap(), want, "at {ts}");
        }
        // The same through flushed layers, compaction and images.
        t.freeze_and_flush().unwrap();
        t.compact_level0(true).unwrap();
        for (ts, want) in cases {
            assert_eq!(lsn_for_timestamp(&t, ts).unwrap(), want, "at {ts} from layer files");
        }
    }

    #[test]
    fn the_search_stays_above_the_gc_cutoff_and_the_branch_point() {
        let dir = tempfile::tempdir().unwrap();
        let tenant = timeline(dir.path());
        let t = tenant.get_timeline(MAIN).unwrap();
        t.freeze_and_flush().unwrap();
        tenant.gc_timeline(MAIN, Lsn(0x250)).unwrap();
        use LsnForTimestamp::*;
        assert_eq!(lsn_for_timestamp(&t, 1500).unwrap(), Past(Lsn(0x250)), "commit 0x200 (2000) is below the cutoff");
        assert_eq!(lsn_for_timestamp(&t, 2500).unwrap(), Present(Lsn(0x250)), "0x200 shows the same, but is unreadable");
        assert_eq!(lsn_for_timestamp(&t, 3500).unwrap(), Future(Lsn(0x400)));

        // A branch at 0x280 sees the ancestor's commits up to there, then its own.
        let b = tenant.branch_timeline(BRANCH, MAIN, Lsn(0x280)).unwrap();
        let mut m = Modification::new(&b, Lsn(0x500));
        m.put_last_commit_timestamp(4000);
        m.commit().unwrap();
        assert_eq!(lsn_for_timestamp(&b, 1500).unwrap(), Past(Lsn(0x280)));
        assert_eq!(lsn_for_timestamp(&b, 2500).unwrap(), Present(Lsn(0x280)));
        assert_eq!(lsn_for_timestamp(&b, 3500).unwrap(), Present(Lsn(0x280)), "the ancestor's commit at 0x300 is not the branch's");
        assert_eq!(lsn_for_timestamp(&b, 4000).unwrap(), Future(Lsn(0x500)));
    }

    #[test]
    fn no_commits_is_no_data() {
        let dir = tempfile::tempdir().unwrap();
        let tenant = Tenant::create(dir.path(), TenantId([7; 16]), StorageConfig::default(), &[]).unwrap();
        let t = tenant.create_timeline(MAIN).unwrap();
        assert_eq!(lsn_for_timestamp(&t, 0).unwrap(), LsnForTimestamp::NoData(Lsn::INVALID));
        let mut m = Modification::new(&t, Lsn(0x100));
        m.put_image(Key::checkpoint(), bytes::Bytes::from_static(b"x"));
        m.commit().unwrap();
        assert_eq!(lsn_for_timestamp(&t, 0).unwrap(), LsnForTimestamp::NoData(Lsn(0x100)));
        assert_eq!(LsnForTimestamp::NoData(Lsn(0x100)).lsn(), Lsn(0x100));
        assert_eq!(LsnForTimestamp::NoData(Lsn(0x100)).to_string(), "nodata 0/100");
        assert_eq!(LsnForTimestamp::Present(Lsn(0x16B3748)).to_string(), "present 0/16B3748");
    }

    #[test]
    fn timestamps_convert_both_ways() {
        let pg_epoch = UNIX_EPOCH + Duration::from_secs(PG_EPOCH_UNIX_SECONDS);
        assert_eq!(timestamptz_from_system_time(pg_epoch), 0);
        assert_eq!(timestamptz_from_system_time(UNIX_EPOCH), -946_684_800_000_000);
        // A midnight UTC, in seconds as PostgreSQL's `extract(epoch ...)` gives it.
        let t = UNIX_EPOCH + Duration::from_secs(1_795_478_400);
        assert_eq!(timestamptz_from_system_time(t), (1_795_478_400 - 946_684_800) * 1_000_000);
        for ts in [0, 1, -1, 123_456_789_012, -987_654_321] {
            assert_eq!(timestamptz_from_system_time(system_time_from_timestamptz(ts)), ts);
        }
    }
}
