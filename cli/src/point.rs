//! `--at`: a point in a branch's history, given as an LSN or as a time.
//!
//! A time is mapped to an LSN by the pageserver (`get_lsn_by_timestamp`, from the commit
//! records' timestamps): the LSN that shows exactly the transactions committed up to that
//! time. A time in the future, or before what the branch can still show (its PITR window,
//! or its branch point), is refused with an error that says which.

use std::str::FromStr;
use std::time::{Duration, SystemTime};

use anyhow::bail;
use pageserver_api::models::{LsnByTimestampQuery, LsnKind};
use pageserver_api::time::{format_rfc3339, parse_rfc3339};
use pageserver_api::Client;
use proto::{Lsn, TenantId, TimelineId};

/// Where in a branch's history: an LSN (`X/X`) or a time (RFC 3339).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Point {
    Lsn(Lsn),
    Time(SystemTime),
}

impl FromStr for Point {
    type Err = String;

    fn from_str(s: &str) -> Result<Point, String> {
        if let Ok(lsn) = s.parse::<Lsn>() {
            return Ok(Point::Lsn(lsn));
        }
        parse_rfc3339(s).map(Point::Time).map_err(|e| {
            format!("{s:?} is neither an LSN (such as 0/16B3748) nor a time (RFC 3339, such as 2026-11-24T10:30:00Z or 2026-11-24 10:30:00+01:00): {e}")
        })
    }
}

/// How far ahead of this machine's clock a time may be before it counts as the future
/// (clocks of the machines involved differ a little).
const CLOCK_SLACK: Duration = Duration::from_secs(1);

/// The LSN of `point` on `timeline` (branch `branch`, for messages): an LSN as given, a
/// time as the pageserver maps it.
pub fn resolve(api: &Client, tenant: TenantId, timeline: TimelineId, branch: &str, point: Point) -> anyhow::Result<Lsn> {
    let time = match point {
        Point::Lsn(lsn) => return Ok(lsn),
        Point::Time(t) => t,
    };
    let shown = format_rfc3339(time);
    if time > SystemTime::now() + CLOCK_SLACK {
        bail!("{shown} is in the future; give a time up to now (or no --at for the branch's latest)");
    }
    let found = api.lsn_by_timestamp(tenant, timeline, &LsnByTimestampQuery { timestamp: time })?;
    match found.kind {
        LsnKind::Present => Ok(found.lsn),
        // After the last commit, or no commit at all yet: the branch as it is now shows
        // exactly what was committed by then.
        LsnKind::Future | LsnKind::NoData => Ok(found.lsn),
        LsnKind::Past => bail!(
            "{shown} is before the oldest point branch {branch} can still show (LSN {}: its PITR window or its branch point); \
             give a later time, or raise the tenant's pitr_window to keep more history",
            found.lsn
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lsns_and_times_and_says_what_it_expected() {
        assert_eq!("0/16B3748".parse::<Point>().unwrap(), Point::Lsn(Lsn(0x16B_3748)));
        let t = "2026-11-24T10:30:00Z".parse::<Point>().unwrap();
        assert_eq!(t, Point::Time(parse_rfc3339("2026-11-24T10:30:00Z").unwrap()));
        let err = "yesterday".parse::<Point>().unwrap_err();
        assert!(err.contains("neither an LSN") && err.contains("RFC 3339"), "{err}");
    }
}
