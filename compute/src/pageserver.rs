//! compute_ctl's requests to the pageserver, through the shared `pageserver_api` client:
//! the basebackup it starts from, the timeline's system identifier, and the requests that
//! make the pageserver follow the new compute's WAL.
//!
//! The basebackup is a tar stream; it is unpacked as it arrives, never held in memory. Its
//! WAL segment stops after the start LSN's page and is extended here to a whole segment.
//! Errors carry the pageserver's own `{"error": ...}` message, worded as compute_ctl's log
//! and its callers have always seen them ("pageserver refused the basebackup request:
//! HTTP 404: ...").

use std::io::Read;
use std::path::Path;

use anyhow::{bail, Context};
use pageserver_api::client::{Client, Error};
use pageserver_api::models::{
    BasebackupQuery, ChangedBlocksQuery, WalReceiverRequest, WalSource, WalSourceList, CHANGED_BLOCKS_LIMIT_MAX, LSN_HEADER,
    SAFEKEEPER_REPLICATION_USER,
};
use proto::lsn::WAL_SEGMENT_SIZE_BYTES;
use proto::{Lsn, TenantId, TimelineId};

/// What a basebackup brought.
#[derive(Debug)]
pub struct Basebackup {
    /// The LSN the pageserver says it is at; `None` if it did not say.
    pub lsn: Option<Lsn>,
    pub bytes: u64,
}

/// An error status becomes "pageserver refused the {what} request: HTTP {status}: {message}";
/// the other kinds keep the client's own words.
fn refused(what: &'static str) -> impl FnOnce(Error) -> anyhow::Error {
    move |e| match e {
        Error::Status { status, message, .. } => anyhow::anyhow!("pageserver refused the {what} request: HTTP {status}: {message}"),
        other => other.into(),
    }
}

/// Streams the basebackup of `timeline` (at `lsn`, or its latest; for a hot standby, see
/// `BasebackupQuery::standby`) into `dest`.
pub fn basebackup(
    client: &Client,
    tenant: TenantId,
    timeline: TimelineId,
    lsn: Option<Lsn>,
    standby: bool,
    dest: &Path,
) -> anyhow::Result<Basebackup> {
    let query = BasebackupQuery { lsn, standby };
    let url = client.url(&client.basebackup_path(tenant, timeline, &query));
    tracing::info!("fetching basebackup from {url}");
    let response = client.basebackup(tenant, timeline, &query).map_err(|e| match e {
        Error::Unreachable { source, .. } => anyhow::Error::new(source).context(format!("could not request basebackup from {url}")),
        other => refused("basebackup")(other),
    })?;
    if response.lsn.is_none() {
        tracing::warn!("basebackup response has no {LSN_HEADER} header");
    }
    let lsn = response.lsn;
    let mut body = CountingReader { inner: response, bytes: 0 };
    let mut archive = tar::Archive::new(&mut body);
    archive.set_preserve_permissions(true);
    archive.set_overwrite(false);
    archive.unpack(dest).with_context(|| format!("unpack basebackup into {}", dest.display()))?;
    // Whatever follows the end-of-archive marker (block padding) is read so that a
    // truncated stream is reported rather than ignored.
    std::io::copy(&mut body, &mut std::io::sink()).context("read the end of the basebackup stream")?;
    extend_wal_segments(&dest.join("pg_wal"))?;
    Ok(Basebackup { lsn, bytes: body.bytes })
}

/// The basebackup's WAL segment ends at the end of the start LSN's page (the rest would be
/// zeros; `pageserver/src/pgdata/basebackup.rs`): extend every segment file in `pg_wal` to
/// the segment size, as PostgreSQL expects its segments, with a hole that reads as zeros.
fn extend_wal_segments(pg_wal: &Path) -> anyhow::Result<()> {
    let entries = std::fs::read_dir(pg_wal).with_context(|| format!("list {}", pg_wal.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("list {}", pg_wal.display()))?;
        let name = entry.file_name();
        let is_segment = name.len() == 24 && name.to_string_lossy().bytes().all(|b| b.is_ascii_hexdigit());
        let path = entry.path();
        if !is_segment || !entry.file_type().with_context(|| format!("stat {}", path.display()))?.is_file() {
            continue;
        }
        let file = std::fs::OpenOptions::new().write(true).open(&path).with_context(|| format!("open {}", path.display()))?;
        let len = file.metadata().with_context(|| format!("stat {}", path.display()))?.len();
        if len > WAL_SEGMENT_SIZE_BYTES {
            bail!("the basebackup's WAL segment {} has {len} bytes, more than a segment", path.display());
        }
        file.set_len(WAL_SEGMENT_SIZE_BYTES).with_context(|| format!("extend {} to a whole segment", path.display()))?;
    }
    Ok(())
}

/// PostgreSQL's system identifier of `timeline`, from the pageserver's timeline status.
pub fn system_id(client: &Client, tenant: TenantId, timeline: TimelineId) -> anyhow::Result<u64> {
    let info = client.timeline(tenant, timeline).map_err(refused("timeline status"))?;
    match info.system_id {
        Some(id) => Ok(id),
        None => bail!("timeline {timeline} has no data yet (no system_id); import or branch it first"),
    }
}

/// Asks the pageserver to stream WAL of `timeline` from the safekeepers (any of them; it
/// takes committed WAL only).
pub fn start_wal_receiver_from_safekeepers(
    client: &Client,
    tenant: TenantId,
    timeline: TimelineId,
    safekeepers: &[(String, u16)],
) -> anyhow::Result<()> {
    let sources = safekeepers.iter().map(|(host, port)| WalSource {
        host: host.clone(),
        port: *port,
        user: SAFEKEEPER_REPLICATION_USER.into(),
        plaintext: false,
    });
    let request = WalReceiverRequest::Sources(WalSourceList { sources: sources.collect(), token: None });
    client.start_wal_receiver(tenant, timeline, &request).map_err(refused("wal_receiver"))
}

/// Asks the pageserver to stream WAL of `timeline` from the compute at `host:port`.
pub fn start_wal_receiver(
    client: &Client,
    tenant: TenantId,
    timeline: TimelineId,
    host: &str,
    port: u16,
    user: &str,
) -> anyhow::Result<()> {
    let request = WalReceiverRequest::Single(WalSource { host: host.into(), port, user: user.into(), plaintext: true });
    client.start_wal_receiver(tenant, timeline, &request).map_err(refused("wal_receiver"))
}

struct CountingReader<R> {
    inner: R,
    bytes: u64,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
}

/// What changed on `timeline` in `(from, to]` (`GET .../changed_blocks`), for reusing a
/// saved file cache of `entries` pages. The limit scales with the cache: past it the
/// pageserver refuses and the cache is discarded, which is cheaper than a huge answer.
pub fn changed_blocks(
    client: &Client,
    tenant: TenantId,
    timeline: TimelineId,
    from: Lsn,
    to: Lsn,
    entries: usize,
) -> anyhow::Result<crate::file_cache::Changes> {
    let limit = (4 * entries as u64 + 10_000).min(CHANGED_BLOCKS_LIMIT_MAX);
    let answer =
        client.changed_blocks(tenant, timeline, &ChangedBlocksQuery { from, to, limit: Some(limit) }).map_err(refused("changed blocks"))?;
    let mut changes = crate::file_cache::Changes::default();
    for b in answer.blocks {
        let r = b.rel;
        let key = (r.spcnode, r.dbnode, r.relnode, r.forknum as u8, b.blkno.0);
        let newest = changes.blocks.entry(key).or_insert(b.lsn);
        *newest = (*newest).max(b.lsn);
    }
    for f in answer.relations {
        let r = f.rel;
        // Blocks at or past the fork's size at `to` (all of them when it is gone) are stale;
        // those below changed only if listed as blocks.
        let from_block = f.nblocks.unwrap_or(0);
        let cut = changes.relations.entry((r.spcnode, r.dbnode, r.relnode, r.forknum as u8)).or_insert(from_block);
        *cut = (*cut).min(from_block);
    }
    for d in answer.databases {
        changes.databases.insert((d.spcnode, d.dbnode));
    }
    Ok(changes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_statuses_are_worded_as_refusals() {
        let status = Error::Status { method: "GET", path: "/v1/x".into(), status: 404, message: "timeline not found".into() };
        assert_eq!(refused("basebackup")(status).to_string(), "pageserver refused the basebackup request: HTTP 404: timeline not found");
        let malformed = Error::Malformed { method: "GET", path: "/v1/x".into(), reason: "EOF".into() };
        assert_eq!(refused("basebackup")(malformed).to_string(), "pageserver: malformed answer to GET /v1/x: EOF");
    }

    #[test]
    fn wal_segments_are_extended_to_a_whole_segment_and_nothing_else_is_touched() {
        let dir = tempfile::tempdir().unwrap();
        let seg = dir.path().join("000000010000000000000003");
        std::fs::write(&seg, [7u8; 8192]).unwrap();
        std::fs::create_dir(dir.path().join("archive_status")).unwrap();
        std::fs::write(dir.path().join("00000002.history"), b"x").unwrap();
        extend_wal_segments(dir.path()).unwrap();
        let data = std::fs::read(&seg).unwrap();
        assert_eq!(data.len() as u64, WAL_SEGMENT_SIZE_BYTES);
        assert!(data[..8192].iter().all(|&b| b == 7) && data[8192..].iter().all(|&b| b == 0));
        assert_eq!(std::fs::read(dir.path().join("00000002.history")).unwrap(), b"x");

        std::fs::write(&seg, vec![0u8; WAL_SEGMENT_SIZE_BYTES as usize + 1]).unwrap();
        assert!(extend_wal_segments(dir.path()).unwrap_err().to_string().contains("more than a segment"));
    }
}
