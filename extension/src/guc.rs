//! The extension's settings (`fjord.*`), fixed at server start unless noted.
//!
//! With `fjord.pageserver_address` empty the storage manager runs in pass-through mode
//! (every relation on local disk through md.c); set, permanent relations live on the
//! pageserver and `fjord.tenant_id` / `fjord.timeline_id` must name the timeline. Which of
//! the two is decided at server start; the address itself may change on reload (a tenant
//! moved to another pageserver), and backends follow it (`client.rs`, `reload.rs`).
//!
//! With `fjord.safekeepers` set, the WAL proposer runs as a background worker and commits
//! wait for a majority of safekeepers (`wal_proposer.rs`). The list is validated in
//! `_PG_init` ([`safekeepers`]), not by a GUC check hook: PostgreSQL applies a value that a
//! check hook rejects at preload time as a WARNING and keeps the default, which here would
//! silently start a compute that commits without safekeepers. An invalid list is FATAL.

use std::ffi::CString;

use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};

pub static PAGESERVER_ADDRESS: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
pub static TENANT_ID: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
pub static TIMELINE_ID: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
pub static TLS_CA_FILE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
pub static READ_LSN: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
pub static PAGESERVER_TIMEOUT_MS: GucSetting<i32> = GucSetting::<i32>::new(60_000);
pub static RELSIZE_CACHE_ENTRIES: GucSetting<i32> = GucSetting::<i32>::new(131_072);
pub static SAFEKEEPERS: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
/// In MB; -1: automatic (see `file_cache.rs`).
pub static FILE_CACHE_SIZE_MB: GucSetting<i32> = GucSetting::<i32>::new(-1);
pub static FILE_CACHE_PATH: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
pub static READAHEAD_BLOCKS: GucSetting<i32> = GucSetting::<i32>::new(32);
pub static TESTING_FUNCTIONS: GucSetting<bool> = GucSetting::<bool>::new(false);
/// In MB; see [`max_pageserver_lag_bytes`].
pub static MAX_PAGESERVER_LAG_MB: GucSetting<i32> = GucSetting::<i32>::new(1024);
/// In ms; see [`max_pageserver_lag_time`].
pub static MAX_PAGESERVER_LAG_TIME_MS: GucSetting<i32> = GucSetting::<i32>::new(2000);

pub fn define() {
    GucRegistry::define_string_guc(
        c"fjord.pageserver_address",
        c"host:port of the pageserver's page service; empty keeps every relation on local disk.",
        c"When set at server start, permanent relations are read from the pageserver at an LSN and never written to local files. A reload may change the address (not empty it, nor set it on a server started without one): each backend moves its connection at its next request, and a read waiting on the old address moves too.",
        &PAGESERVER_ADDRESS,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"fjord.tenant_id",
        c"The tenant (32 hex digits) whose timeline this compute serves.",
        c"",
        &TENANT_ID,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"fjord.timeline_id",
        c"The timeline (32 hex digits) this compute reads and writes.",
        c"",
        &TIMELINE_ID,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"fjord.tls_ca_file",
        c"The cluster CA's certificate (PEM): page service connections use TLS and trust only it; empty: cleartext.",
        c"The pageserver's certificate must be signed by this CA and name the host of fjord.pageserver_address. Each backend reads the file at its first page service connection, so a replaced CA file reaches new backends without a restart.",
        &TLS_CA_FILE,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"fjord.read_lsn",
        c"Read every page at this fixed LSN (X/X): a read-only compute on a point in the past.",
        c"Empty: read the newest version, as a primary does. compute_ctl --lsn sets it.",
        &READ_LSN,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"fjord.pageserver_timeout",
        c"How long one page service request may take, reconnects included, before the query fails.",
        c"",
        &PAGESERVER_TIMEOUT_MS,
        100,
        3_600_000,
        GucContext::Suset,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"fjord.relsize_cache_entries",
        c"Relation forks whose size the shared relation-size cache can hold.",
        c"Every permanent relation fork a compute extends, creates or asks the size of takes one entry until it is dropped.",
        &RELSIZE_CACHE_ENTRIES,
        1024,
        16_777_216,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"fjord.file_cache_size",
        c"Size of the local file cache of pages on this compute's disk; 0 turns it off, -1 picks a size.",
        c"-1 (the default): an eighth of the machine's memory, at most 4 GB and a quarter of the free disk, or the size of the cache file already there. The cache sits between shared_buffers and the pageserver; the OS page cache keeps its hot part in memory.",
        &FILE_CACHE_SIZE_MB,
        -1,
        1_048_576,
        GucContext::Postmaster,
        GucFlags::UNIT_MB,
    );
    GucRegistry::define_string_guc(
        c"fjord.file_cache_path",
        c"The local file cache's file; relative paths are in the data directory. Its directory must exist.",
        c"compute_ctl puts it outside the data directory so that it survives a restart of the endpoint.",
        &FILE_CACHE_PATH,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"fjord.readahead",
        c"How many blocks ahead a sequential read of a relation asks the pageserver for, without waiting; 0 turns readahead off.",
        c"After a few consecutive blocks of one relation are read, GetPage requests for the next ones are sent on the same connection, so a scan waits for one round trip per window. At most 32.",
        &READAHEAD_BLOCKS,
        0,
        32,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"fjord.testing_functions",
        c"Allows fjord's functions that only tests need (fjord.set_next_oid_for_testing); off in production.",
        c"They force states that take hours to reach naturally, such as the OID counter near wraparound.",
        &TESTING_FUNCTIONS,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"fjord.safekeepers",
        c"host:port of every safekeeper, comma-separated (1 to 7, an odd number); empty: no WAL proposer.",
        c"When set, the WAL proposer worker streams WAL to the safekeepers and a commit returns once a majority has flushed it (with synchronous_standby_names = 'walproposer').",
        &SAFEKEEPERS,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"fjord.max_pageserver_lag",
        c"How many bytes of WAL the pageserver may fall behind this compute's before commits are slowed down; 0 disables.",
        c"The lag is this compute's flushed WAL minus the pageserver's apply LSN as the safekeepers report it. A hard cap beside fjord.max_pageserver_lag_time, which is what bounds how long reads wait.",
        &MAX_PAGESERVER_LAG_MB,
        0,
        1_048_576,
        GucContext::Sighup,
        GucFlags::UNIT_MB,
    );
    GucRegistry::define_int_guc(
        c"fjord.max_pageserver_lag_time",
        c"How old the oldest WAL the pageserver has not applied may be before commits are slowed down; 0 disables.",
        c"Reads of pages that are not local wait for the pageserver to apply WAL up to their LSN; this bounds that wait whatever the pageserver's ingest speed (bulk loads ingest at hundreds of MiB/s, small OLTP records at a few).",
        &MAX_PAGESERVER_LAG_TIME_MS,
        0,
        3_600_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
}

fn string(s: &GucSetting<Option<CString>>) -> Option<String> {
    s.get().map(|c| c.to_string_lossy().into_owned()).filter(|s| !s.trim().is_empty())
}

/// The page service address, if the compute reads from a pageserver: the value this
/// process last applied (a reload may not be applied yet; see `reload.rs`).
pub fn pageserver_address() -> Option<String> {
    string(&PAGESERVER_ADDRESS)
}

/// The cluster CA's certificate file, if page service connections use TLS.
pub fn tls_ca_file() -> Option<String> {
    string(&TLS_CA_FILE)
}

pub fn file_cache_path() -> Option<String> {
    string(&FILE_CACHE_PATH)
}

pub fn tenant_id() -> Option<String> {
    string(&TENANT_ID)
}

pub fn timeline_id() -> Option<String> {
    string(&TIMELINE_ID)
}

/// The fixed LSN of a read-only compute, in bytes, if `fjord.read_lsn` is set. Parsed once
/// per process (the setting is fixed at server start; every read asks).
pub fn read_lsn() -> Option<u64> {
    static PARSED: std::sync::OnceLock<Result<Option<u64>, String>> = std::sync::OnceLock::new();
    let parsed = PARSED.get_or_init(|| {
        let Some(text) = string(&READ_LSN) else { return Ok(None) };
        match text.trim().parse::<proto::Lsn>() {
            Ok(lsn) if lsn.0 != 0 => Ok(Some(lsn.0)),
            _ => Err(format!("fjord.read_lsn \"{text}\" is not an LSN like 0/16B3748")),
        }
    });
    match parsed {
        Ok(lsn) => *lsn,
        Err(message) => pgrx::error!("{message}"),
    }
}

/// The safekeepers named by `fjord.safekeepers`, validated: `None` when the setting is empty
/// (no WAL proposer), else 1 to [`walproposer::SAFEKEEPERS_MAX`] distinct `host:port`
/// entries. The error names the entry and what is wrong with it
/// (`walproposer::parse_safekeeper_list`, the parser compute_ctl uses too).
pub fn safekeepers() -> Result<Option<Vec<String>>, String> {
    let Some(text) = string(&SAFEKEEPERS) else { return Ok(None) };
    match walproposer::parse_safekeeper_list("fjord.safekeepers", &text) {
        Ok(list) => Ok(Some(list.into_iter().map(|s| s.addr).collect())),
        Err(e) => Err(e.to_string()),
    }
}

/// `fjord.max_pageserver_lag` in bytes; 0 when backpressure is off. Read by backends as they
/// wait for a commit (the setting can change on reload).
pub fn max_pageserver_lag_bytes() -> u64 {
    u64::try_from(MAX_PAGESERVER_LAG_MB.get()).unwrap_or(0) << 20
}

/// `fjord.max_pageserver_lag_time` in microseconds; 0 when off. Read by backends as they wait
/// for a commit (the setting can change on reload).
pub fn max_pageserver_lag_time_us() -> u64 {
    u64::try_from(MAX_PAGESERVER_LAG_TIME_MS.get()).unwrap_or(0) * 1000
}
