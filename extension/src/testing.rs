//! SQL functions that only tests use, refused unless `fjord.testing_functions` is on (a
//! server start setting, off by default): they force states that take far too long to
//! reach naturally.

use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::guc;

/// Sets the next OID the server hands out, as if the counter had wrapped around to it:
/// how a test makes `GetNewRelFileNode()` offer the relfilenode of a live relation
/// (patch 0010). The counter's next allocation logs it (`XLOG_NEXTOID`) as usual.
#[pg_extern]
fn set_next_oid_for_testing(next: pg_sys::Oid) {
    if !guc::TESTING_FUNCTIONS.get() {
        ereport!(
            PgLogLevel::ERROR,
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "fjord.set_next_oid_for_testing() is a testing function; start the server with fjord.testing_functions = on to use it"
        );
    }
    if u32::from(next) < pg_sys::FirstNormalObjectId {
        ereport!(
            PgLogLevel::ERROR,
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("OID {} is below the first normal OID {}", u32::from(next), pg_sys::FirstNormalObjectId)
        );
    }
    // SAFETY: the OID counter is changed under its lock, as GetNewObjectId() does; a zero
    // oidCount makes the next allocation log a new XLOG_NEXTOID before using the counter.
    unsafe {
        pg_sys::LWLockAcquire(oid_gen_lock(), pg_sys::LWLockMode::LW_EXCLUSIVE);
        (*pg_sys::ShmemVariableCache).nextOid = next;
        (*pg_sys::ShmemVariableCache).oidCount = 0;
        pg_sys::LWLockRelease(oid_gen_lock());
    }
}

/// `OidGenLock`, a C macro for slot 2 of the main LWLock array (lwlocknames.txt).
unsafe fn oid_gen_lock() -> *mut pg_sys::LWLock {
    const OID_GEN_LOCK_SLOT: usize = 2;
    unsafe { &raw mut (*pg_sys::MainLWLockArray.add(OID_GEN_LOCK_SLOT)).lock }
}
