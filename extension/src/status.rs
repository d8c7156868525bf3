//! SQL functions that show what the extension is doing, created by `CREATE EXTENSION fjord`
//! in the `fjord` schema.

use std::sync::atomic::Ordering;

use pgrx::prelude::*;

use crate::smgr;

/// One row describing fjord's storage manager in this server.
///
/// `active` is true when this backend routes relations through fjord's storage manager and
/// its shared counters exist, which is only the case when the library was preloaded.
/// `mode` says where pages come from: `passthrough` (md.c, local files) until a pageserver
/// is configured. The counters are totals across all processes since the server started.
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
    ),
> {
    let counters = smgr::counters();
    let active = smgr::is_installed() && counters.is_some();
    let get = |f: fn(&smgr::SmgrCounters) -> &std::sync::atomic::AtomicU64| -> i64 {
        counters.map_or(0, |c| i64::try_from(f(c).load(Ordering::Relaxed)).unwrap_or(i64::MAX))
    };
    let mode = if active { "passthrough" } else { "inactive" };
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
    ))
}

/// The version of the fjord library loaded into this server.
#[pg_extern]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}
