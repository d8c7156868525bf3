//! SQL functions that show what the extension is doing, created by `CREATE EXTENSION fjord`
//! in the `fjord` schema.

use std::sync::atomic::Ordering;

use pgrx::prelude::*;

use crate::smgr;

/// One row describing fjord's storage manager in this server.
///
/// `active` is true when this backend routes relations through fjord's storage manager and
/// its shared counters exist, which is only the case when the library was preloaded.
/// `mode` says where pages of permanent relations come from: `pageserver`, or
/// `pass-through` (md.c, local files) when no pageserver is configured (the storage
/// manager's two modes, `docs/glossary.md`). The counters are totals across all processes since the server started.
#[pg_extern]
#[expect(clippy::type_complexity, reason = "pgrx takes a set-returning function's columns as one tuple of `name!` types")]
fn storage_manager() -> TableIterator<
    'static,
    (
        name!(active, bool),
        name!(mode, &'static str),
        name!(relations_opened, i64),
        name!(reads, i64),
        name!(writes, i64),
        name!(extends, i64),
        name!(truncates, i64),
        name!(nblocks_calls, i64),
        name!(creates, i64),
        name!(unlinks, i64),
        name!(pageserver_requests, i64),
        name!(pageserver_reconnects, i64),
        name!(eviction_images, i64),
        name!(relsize_cache_hits, i64),
        name!(relsize_cache_misses, i64),
        name!(prefetch_requests, i64),
        name!(prefetch_hits, i64),
        name!(prefetch_wasted, i64),
        name!(replay_skipped_blocks, i64),
    ),
> {
    let active = smgr::is_installed() && crate::shmem::shared().is_some();
    let get =
        |f: fn(&smgr::SmgrCounters) -> &std::sync::atomic::AtomicU64| -> i64 { i64::try_from(crate::shmem::total(f)).unwrap_or(i64::MAX) };
    let mode = match (active, smgr::in_pageserver_mode()) {
        (false, _) => "inactive",
        (true, false) => "pass-through",
        (true, true) => "pageserver",
    };
    TableIterator::once((
        active,
        mode,
        get(|c| &c.relations_opened),
        get(|c| &c.reads),
        get(|c| &c.writes),
        get(|c| &c.extends),
        get(|c| &c.truncates),
        get(|c| &c.nblocks),
        get(|c| &c.creates),
        get(|c| &c.unlinks),
        get(|c| &c.pageserver_requests),
        get(|c| &c.pageserver_reconnects),
        get(|c| &c.eviction_fpis),
        get(|c| &c.relsize_hits),
        get(|c| &c.relsize_misses),
        get(|c| &c.prefetch_requests),
        get(|c| &c.prefetch_hits),
        get(|c| &c.prefetch_wasted),
        get(|c| &c.replay_skipped_blocks),
    ))
}

/// One row describing the WAL proposer (`fjord.safekeepers`); see `wal_proposer.rs`.
///
/// `state` is `off` (no safekeepers configured, or the library not preloaded), `starting`,
/// `start failed` (retrying; `message` says why), `electing`, `streaming`, `fenced`
/// (`message` has the reason) or `stopped`. LSNs are text as `pg_lsn` prints them (cast
/// with `::pg_lsn`), `NULL` while unknown: `wal_start_lsn` where this compute's WAL begins,
/// `elected_start_lsn` where the elected proposer's WAL begins, `commit_lsn` what a majority
/// of safekeepers has flushed (commits up to it have returned), `flush_lsn` what the server
/// had flushed when the worker last looked, and the pageserver's flush and apply LSNs as the
/// safekeepers report them. `throttled_ms` and `throttled_waits` total the backpressure
/// (`fjord.max_pageserver_lag`) that commits went through since the server started.
#[pg_extern]
#[expect(clippy::type_complexity, reason = "pgrx takes a set-returning function's columns as one tuple of `name!` types")]
fn walproposer_status() -> TableIterator<
    'static,
    (
        name!(state, &'static str),
        name!(safekeepers, Option<String>),
        name!(term, Option<i64>),
        name!(wal_start_lsn, Option<String>),
        name!(elected_start_lsn, Option<String>),
        name!(commit_lsn, Option<String>),
        name!(flush_lsn, Option<String>),
        name!(pageserver_flush_lsn, Option<String>),
        name!(pageserver_apply_lsn, Option<String>),
        name!(throttled_ms, i64),
        name!(throttled_waits, i64),
        name!(proposer_starts, i64),
        name!(message, Option<String>),
    ),
> {
    let Some(shared) = crate::shmem::shared() else {
        return TableIterator::once(("off", None, None, None, None, None, None, None, None, 0, 0, 0, None));
    };
    let wp = &shared.walproposer;
    let lsn_value = |v: u64| -> Option<String> { (v != 0).then(|| proto::Lsn(v).to_string()) };
    let lsn = |a: &std::sync::atomic::AtomicU64| lsn_value(a.load(Ordering::Relaxed));
    let count = |a: &std::sync::atomic::AtomicU64| i64::try_from(a.load(Ordering::Relaxed)).unwrap_or(i64::MAX);
    let state = crate::wal_proposer::State::from_u32(wp.state.load(Ordering::Relaxed));
    let term = match wp.term.load(Ordering::Relaxed) {
        0 => None,
        t => Some(i64::try_from(t).unwrap_or(i64::MAX)),
    };
    let message = Some(wp.message()).filter(|m| !m.is_empty());
    TableIterator::once((
        state.name(),
        crate::guc::safekeepers().ok().flatten().map(|l| l.join(",")),
        term,
        lsn(&wp.wal_start_lsn),
        lsn(&wp.elected_start_lsn),
        // The worker publishes the commit LSN at its turns; the proposer's thread announces
        // each new one at once (`sync_commit::wake_committed`).
        lsn_value(wp.commit_lsn.load(Ordering::Relaxed).max(wp.proposer_commit_lsn.0.load(Ordering::Relaxed))),
        lsn(&wp.flush_lsn),
        lsn(&wp.pageserver_flush_lsn),
        lsn(&wp.pageserver_apply_lsn),
        count(&wp.throttled_us) / 1000,
        count(&wp.throttled_waits),
        count(&wp.starts),
        message,
    ))
}

/// The read replicas of this compute's branch, one row each, as the safekeepers they stream
/// from last reported them to the WAL proposer (PostgreSQL's `pg_stat_replication` shows
/// walsenders, and a fjord primary has none: its replicas stream from the safekeepers).
/// `replay_lag_bytes` is this compute's flushed WAL minus what the replica replayed;
/// `xmin` and `catalog_xmin` are its hot standby feedback (full transaction ids), which this
/// compute holds back in the temporary slot `fjord_replicas`; `last_report_ms` is how long
/// ago the safekeeper heard from it. Empty on a compute without a WAL proposer.
#[pg_extern]
#[expect(clippy::type_complexity, reason = "pgrx takes a set-returning function's columns as one tuple of `name!` types")]
fn replicas() -> TableIterator<
    'static,
    (
        name!(name, String),
        name!(safekeeper, String),
        name!(flush_lsn, String),
        name!(replay_lsn, String),
        name!(replay_lag_bytes, i64),
        name!(xmin, Option<i64>),
        name!(catalog_xmin, Option<i64>),
        name!(last_report_ms, i64),
    ),
> {
    let Some(shared) = crate::shmem::shared() else {
        return TableIterator::new(Vec::new());
    };
    let wp = &shared.walproposer;
    let (mut list, at_ms) = wp.replicas();
    list.sort_by(|a, b| (&a.name, &a.safekeeper).cmp(&(&b.name, &b.safekeeper)));
    let flushed = wp.flush_lsn.load(Ordering::Relaxed);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    let since_published = now_ms.saturating_sub(at_ms);
    let xid = |x: u64| (x != 0).then(|| i64::try_from(x).unwrap_or(i64::MAX));
    let rows: Vec<_> = list
        .into_iter()
        .map(|r| {
            (
                r.name,
                r.safekeeper,
                proto::Lsn(r.flush_lsn).to_string(),
                proto::Lsn(r.apply_lsn).to_string(),
                i64::try_from(flushed.saturating_sub(r.apply_lsn)).unwrap_or(i64::MAX),
                xid(r.xmin),
                xid(r.catalog_xmin),
                i64::try_from(u64::from(r.age_ms).saturating_add(since_published)).unwrap_or(i64::MAX),
            )
        })
        .collect();
    TableIterator::new(rows)
}

/// One row describing the local file cache (`file_cache.rs`): whether it is on, its file,
/// its size and pages in use, and counters since the server started: `hits` and `misses`
/// (reads of pages on the pageserver that found it or not), `stores` (pages written into it, from
/// pageserver reads and from pages leaving shared_buffers), `evictions`, `invalidations`
/// (truncations, drops), `restored` (entries reused from before the last restart) and
/// `checksum_failures` (cached pages that failed their CRC and were read from the
/// pageserver instead).
#[pg_extern]
#[expect(clippy::type_complexity, reason = "pgrx takes a set-returning function's columns as one tuple of `name!` types")]
fn file_cache_status() -> TableIterator<
    'static,
    (
        name!(enabled, bool),
        name!(path, Option<String>),
        name!(size_bytes, i64),
        name!(used_pages, i64),
        name!(hits, i64),
        name!(misses, i64),
        name!(stores, i64),
        name!(evictions, i64),
        name!(invalidations, i64),
        name!(restored, i64),
        name!(checksum_failures, i64),
    ),
> {
    let Some(fc) = crate::file_cache::status() else {
        return TableIterator::once((false, None, 0, 0, 0, 0, 0, 0, 0, 0, 0));
    };
    let c = |f: fn(&crate::file_cache::FileCacheCounters) -> &std::sync::atomic::AtomicU64| {
        i64::try_from(fc.counters.sum(f)).unwrap_or(i64::MAX)
    };
    TableIterator::once((
        fc.enabled(),
        (fc.slots() > 0).then(|| crate::file_cache::cache_path().display().to_string()),
        i64::try_from(fc.slots() * pg_sys::BLCKSZ as usize).unwrap_or(i64::MAX),
        i64::try_from(fc.used()).unwrap_or(i64::MAX),
        c(|c| &c.hits),
        c(|c| &c.misses),
        c(|c| &c.stores),
        c(|c| &c.evictions),
        c(|c| &c.invalidations),
        c(|c| &c.restored),
        c(|c| &c.checksum_failures),
    ))
}

/// GetPage round trips to the pageserver since the server started, by latency: one row per
/// bucket, `le_us` its upper bound in µs (NULL for the last, unbounded one) and `count` the
/// requests that took more than the previous bound and at most this one. The wait includes
/// retries and the pageserver waiting for WAL; pages found in the local file cache are not
/// counted.
#[pg_extern]
fn getpage_latency() -> TableIterator<'static, (name!(le_us, Option<i64>), name!(count, i64))> {
    let counts = (0..=crate::shmem::GETPAGE_BUCKETS_US.len())
        .map(|i| i64::try_from(crate::shmem::total(|c| &c.getpage_buckets[i])).unwrap_or(i64::MAX));
    let bounds = crate::shmem::GETPAGE_BUCKETS_US.iter().map(|&b| Some(b as i64)).chain(std::iter::once(None));
    TableIterator::new(bounds.zip(counts).collect::<Vec<_>>())
}

/// The version of the fjord library loaded into this server.
#[pg_extern]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}
