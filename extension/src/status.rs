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
/// `passthrough` (md.c, local files) when no pageserver is configured. The counters are totals across all processes since the server started.
#[pg_extern]
#[allow(clippy::type_complexity)]
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
        name!(remote_requests, i64),
        name!(remote_reconnects, i64),
        name!(eviction_images, i64),
        name!(relsize_cache_hits, i64),
        name!(relsize_cache_misses, i64),
    ),
> {
    let counters = smgr::counters();
    let active = smgr::is_installed() && counters.is_some();
    let get = |f: fn(&smgr::SmgrCounters) -> &std::sync::atomic::AtomicU64| -> i64 {
        counters.map_or(0, |c| i64::try_from(f(c).load(Ordering::Relaxed)).unwrap_or(i64::MAX))
    };
    let mode = match (active, smgr::is_remote()) {
        (false, _) => "inactive",
        (true, false) => "passthrough",
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
        get(|c| &c.remote_requests),
        get(|c| &c.remote_reconnects),
        get(|c| &c.eviction_fpis),
        get(|c| &c.relsize_hits),
        get(|c| &c.relsize_misses),
    ))
}

/// The version of the fjord library loaded into this server.
#[pg_extern]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}
