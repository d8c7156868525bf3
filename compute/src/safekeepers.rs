//! compute_ctl and the safekeepers: the `--safekeepers` list, and the sync that decides where
//! a compute starts.
//!
//! With safekeepers, a compute must start exactly at the end of the WAL a majority of them
//! agreed on (the elected start LSN of a sync), so compute_ctl syncs them before it fetches
//! the basebackup and asks the pageserver for that LSN. The compute's own WAL proposer (in
//! the extension) then continues from there.

use std::time::{Duration, Instant};

use anyhow::Context;
use proto::{Lsn, TenantId, TimelineId};

/// One safekeeper of `--safekeepers`.
pub use walproposer::SafekeeperAddr as Safekeeper;

/// Parses `host:port,host:port,...` with the parser the extension uses for
/// `fjord.safekeepers` (`walproposer::parse_safekeeper_list`): no empty entries, valid
/// ports, IPv6 in brackets, no duplicates, at most `walproposer::SAFEKEEPERS_MAX`.
pub fn parse_list(list: &str) -> anyhow::Result<Vec<Safekeeper>> {
    Ok(walproposer::parse_safekeeper_list("--safekeepers", list)?)
}

/// The list as `fjord.safekeepers` takes it.
pub fn to_setting(list: &[Safekeeper]) -> String {
    list.iter().map(|s| s.addr.as_str()).collect::<Vec<_>>().join(",")
}

/// What a sync found.
#[derive(Debug)]
pub struct Synced {
    /// The end of the committed WAL; `None` if no safekeeper has WAL for the timeline.
    pub lsn: Option<Lsn>,
    pub elapsed: Duration,
}

/// Syncs the safekeepers of a timeline (see `walproposer::sync_safekeepers`), over TLS
/// trusting the cluster CA of `tls` (`None`: cleartext).
pub fn sync(
    list: &[Safekeeper],
    tenant: TenantId,
    timeline: TimelineId,
    system_id: u64,
    auth_token: Option<String>,
    tls: Option<tls::ClientTls>,
    timeout: Duration,
) -> anyhow::Result<Synced> {
    let started = Instant::now();
    let config = walproposer::Config {
        safekeepers: list.iter().map(|s| s.addr.clone()).collect(),
        tenant_id: tenant,
        timeline_id: timeline,
        system_id,
        wal_segment_size: proto::lsn::WAL_SEGMENT_SIZE_BYTES as u32,
        wal_start: Lsn(0),
        wal_dir: None,
        name: format!("compute_ctl sync (pid {})", std::process::id()),
        reconnect_max: Duration::from_secs(1),
        whole_records: true,
        auth_token,
        tls,
    };
    let lsn = walproposer::sync_safekeepers(&config, timeout).context("sync the safekeepers")?;
    Ok(Synced { lsn, elapsed: started.elapsed() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_are_validated() {
        let l = parse_list("127.0.0.1:5454, sk2:5455,[::1]:5456").unwrap();
        assert_eq!(l.len(), 3);
        assert_eq!((l[1].host.as_str(), l[1].port), ("sk2", 5455));
        assert_eq!((l[2].host.as_str(), l[2].addr.as_str()), ("::1", "[::1]:5456"));
        assert_eq!(to_setting(&l), "127.0.0.1:5454,sk2:5455,[::1]:5456");
        for (bad, why) in [
            ("", "empty entry"),
            ("a:1,,b:2", "empty entry"),
            ("host", "--safekeepers entry \"host\" is not host:port"),
            ("host:0", "invalid port \"0\""),
            ("host:99999", "invalid port \"99999\""),
            (":5454", "no valid host"),
            ("::1:5454", "IPv6"),
            ("a:1,a:1", "names \"a:1\" twice"),
            ("h1:1,h2:1,h3:1,h4:1,h5:1,h6:1,h7:1,h8:1", "at most 7"),
        ] {
            let err = parse_list(bad).unwrap_err().to_string();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
    }
}
