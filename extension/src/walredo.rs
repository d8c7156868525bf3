//! The entry point of the WAL redo process: `postgres --wal-redo fjord`.
//!
//! Patch 0002 makes `postgres --wal-redo LIBRARY` load this library and call its
//! `WalRedoMain`. The redo loop itself is C (`c/walredo.c`): it is a standalone-backend
//! bootstrap made of PostgreSQL internals. This trampoline exists because a Rust cdylib
//! exports only symbols defined in Rust.
//!
//! Invariant: the loop never returns. It exits through `proc_exit` on end of input or on
//! any error (an ERROR with no handler is promoted to FATAL), so no PostgreSQL error ever
//! unwinds through this frame.

use std::ffi::{c_char, c_int};

extern "C" {
    fn fjord_wal_redo_main(argc: c_int, argv: *mut *mut c_char);
}

/// Called by patch 0002's `WalRedoMain` dispatch in `main.c`.
///
/// # Safety
/// Called once by the postgres binary with its own `argc`/`argv`.
#[no_mangle]
pub unsafe extern "C" fn WalRedoMain(argc: c_int, argv: *mut *mut c_char) {
    // SAFETY: arguments come straight from postgres's main().
    unsafe { fjord_wal_redo_main(argc, argv) };
    std::process::abort();
}
