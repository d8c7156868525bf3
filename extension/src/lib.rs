//! The `fjord` PostgreSQL extension: the compute node's half of fjord.
//!
//! Loaded through `shared_preload_libraries`, it installs fjord's storage manager through
//! the `smgr_select_hook` that patch 0001 adds to PostgreSQL. Today that storage manager
//! keeps permanent relations on the pageserver when `fjord.pageserver_address` is set
//! (`smgr.rs`, `client.rs`, `cache.rs`), and is a counting pass-through to md.c otherwise.
//! With `fjord.safekeepers` set it also runs the WAL proposer as a background worker and
//! makes commits wait for a majority of safekeepers (`wal_proposer.rs`, `sync_commit.rs`,
//! patch 0008). `CREATE EXTENSION fjord` adds SQL functions in the `fjord` schema
//! that show what the extension is doing.
//!
//! Invariant: nothing here runs unless the library was preloaded. Loaded any other way
//! (a plain `LOAD` or `CREATE EXTENSION` without preloading), the functions report the
//! storage manager as inactive; they never install hooks mid-session, because backends
//! that started earlier would keep md.c and the cluster would disagree with itself.

use pgrx::prelude::*;

mod cache;
mod client;
mod file_cache;
mod guc;
mod reload;
mod replica;
mod shmem;
mod smgr;
mod status;
mod sync_commit;
mod testing;
mod wakeup;
mod wal_proposer;
mod walredo;

::pgrx::pg_module_magic!(name, version);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    // SAFETY: a plain read of a PostgreSQL global from the process that is loading us.
    let preloading = unsafe { pg_sys::process_shared_preload_libraries_in_progress };
    if !preloading {
        return;
    }
    guc::define();
    smgr::install();
    if smgr::in_pageserver_mode() {
        client::check_settings();
        replica::install();
    }
    wal_proposer::install();
}
