//! Resource-manager records that change more than the blocks they reference.
//!
//! Most records are stored as they are, once per block they reference, and replayed by
//! PostgreSQL's own redo code. The records here also change state that has no block
//! reference: which relations and databases exist and how long they are, transaction
//! status (CLOG), multixacts, the relation mapper, the checkpoint, and visibility-map bits
//! that heap records clear without registering the map page. `parse_metadata` turns those
//! into typed values; it returns `Ok(None)` for every other record.
//!
//! Invariant: each parser checks the main data length against the struct it reads (exactly
//! where PostgreSQL registers a fixed-size struct, at least the fixed part where a variable
//! tail follows) and errors rather than reading past the end.

mod heap;
mod storage;
mod transam;
mod xact;
mod xlog;

pub use heap::{visibility_map_location, VmBitsCleared, VmBitsSet, VmLocation};
pub use storage::{DbaseCreate, DbaseCreateStrategy, DbaseDrop, RelmapUpdate, SmgrCreate, SmgrTruncate};
pub use transam::{ClogTruncate, MultiXactCreate, MultiXactMember, MultiXactStatus, MultiXactTruncate, RunningXacts};
pub use xact::{XactCompletion, XactKind, XactPrepare};
pub use xlog::CheckPoint;

use proto::{Lsn, Oid};

use crate::consts::*;
use crate::cursor::Cursor;
use crate::record::DecodedRecord;
use crate::WalError;

/// A record that changes state beyond its block references. See the module documentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetadataRecord {
    /// `XLOG_CHECKPOINT_SHUTDOWN` or `XLOG_CHECKPOINT_ONLINE`.
    Checkpoint { shutdown: bool, checkpoint: CheckPoint },
    /// `XLOG_NEXTOID`: the OID counter advanced past this value.
    NextOid(Oid),
    /// `XLOG_SWITCH`: the rest of the segment is unused.
    Switch,
    /// `XLOG_XACT_COMMIT`, `_ABORT`, `_COMMIT_PREPARED`, `_ABORT_PREPARED`.
    XactCompletion(XactCompletion),
    /// `XLOG_XACT_PREPARE`.
    XactPrepare(XactPrepare),
    /// `XLOG_SMGR_CREATE`.
    SmgrCreate(SmgrCreate),
    /// `XLOG_SMGR_TRUNCATE`.
    SmgrTruncate(SmgrTruncate),
    /// `XLOG_DBASE_CREATE_FILE_COPY` or `XLOG_DBASE_CREATE_WAL_LOG`.
    DbaseCreate(DbaseCreate),
    /// `XLOG_DBASE_DROP`.
    DbaseDrop(DbaseDrop),
    /// `CLOG_ZEROPAGE`: a CLOG page is initialized to zeros.
    ClogZeroPage { pageno: u32 },
    /// `CLOG_TRUNCATE`.
    ClogTruncate(ClogTruncate),
    /// `XLOG_MULTIXACT_ZERO_OFF_PAGE`.
    MultiXactZeroOffsetPage { pageno: u32 },
    /// `XLOG_MULTIXACT_ZERO_MEM_PAGE`.
    MultiXactZeroMemberPage { pageno: u32 },
    /// `XLOG_MULTIXACT_CREATE_ID`.
    MultiXactCreate(MultiXactCreate),
    /// `XLOG_MULTIXACT_TRUNCATE_ID`.
    MultiXactTruncate(MultiXactTruncate),
    /// `XLOG_RELMAP_UPDATE`: a whole `pg_filenode.map` file.
    RelmapUpdate(RelmapUpdate),
    /// A heap or heap2 record cleared visibility-map bits of one or two heap blocks.
    VmBitsCleared(Vec<VmBitsCleared>),
    /// `XLOG_HEAP2_VISIBLE`: visibility-map bits set for one heap block.
    VmBitsSet(VmBitsSet),
    /// `XLOG_RUNNING_XACTS`: the transactions running at this point (for hot standbys).
    RunningXacts(RunningXacts),
}

/// Parses `record` if it is one of the kinds in [`MetadataRecord`]; `Ok(None)` otherwise
/// (including heap records that clear no visibility-map bit).
pub fn parse_metadata(record: &DecodedRecord) -> Result<Option<MetadataRecord>, WalError> {
    let info = record.rmgr_info();
    match record.rmid() {
        RM_XLOG_ID => xlog::parse(record, info),
        RM_XACT_ID => xact::parse(record, info),
        RM_SMGR_ID => storage::parse_smgr(record, info),
        RM_DBASE_ID => storage::parse_dbase(record, info),
        RM_RELMAP_ID => storage::parse_relmap(record, info),
        RM_CLOG_ID => transam::parse_clog(record, info),
        RM_MULTIXACT_ID => transam::parse_multixact(record, info),
        RM_HEAP_ID => heap::parse_heap(record, info),
        RM_HEAP2_ID => heap::parse_heap2(record, info),
        RM_STANDBY_ID => transam::parse_standby(record, info),
        _ => Ok(None),
    }
}

/// Reads a record's main data with errors that name the record kind and its LSN.
pub(crate) struct MainData<'a> {
    cursor: Cursor<'a>,
    lsn: Lsn,
    what: &'static str,
}

impl<'a> MainData<'a> {
    /// Starts reading `record`'s main data, which must be at least `min_len_bytes` long, or
    /// exactly that long if `exact`.
    pub(crate) fn new(record: &'a DecodedRecord, what: &'static str, min_len_bytes: usize, exact: bool) -> Result<MainData<'a>, WalError> {
        let data = &record.main_data[..];
        let ok = if exact { data.len() == min_len_bytes } else { data.len() >= min_len_bytes };
        if !ok {
            let relation = if exact { "" } else { "at least " };
            return Err(WalError::InvalidRmgrData {
                lsn: record.lsn,
                record: what,
                reason: format!("main data is {} bytes, expected {relation}{min_len_bytes}", data.len()),
            });
        }
        Ok(MainData { cursor: Cursor::new(data), lsn: record.lsn, what })
    }

    pub(crate) fn error(&self, reason: impl Into<String>) -> WalError {
        WalError::InvalidRmgrData { lsn: self.lsn, record: self.what, reason: reason.into() }
    }

    fn short(&self) -> WalError {
        self.error(format!("main data ends at byte {}, before the fields it announces", self.cursor.position()))
    }

    pub(crate) fn u8(&mut self) -> Result<u8, WalError> {
        self.cursor.u8().ok_or_else(|| self.short())
    }

    pub(crate) fn u16(&mut self) -> Result<u16, WalError> {
        self.cursor.u16().ok_or_else(|| self.short())
    }

    pub(crate) fn u32(&mut self) -> Result<u32, WalError> {
        self.cursor.u32().ok_or_else(|| self.short())
    }

    /// A C `int` used as a count: negative values are corrupt.
    pub(crate) fn count(&mut self, name: &str) -> Result<usize, WalError> {
        let n = self.cursor.i32().ok_or_else(|| self.short())?;
        usize::try_from(n).map_err(|_| self.error(format!("negative {name}: {n}")))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, WalError> {
        self.cursor.u64().ok_or_else(|| self.short())
    }

    pub(crate) fn i64(&mut self) -> Result<i64, WalError> {
        self.cursor.i64().ok_or_else(|| self.short())
    }

    pub(crate) fn bytes(&mut self, len: usize) -> Result<&'a [u8], WalError> {
        self.cursor.bytes(len).ok_or_else(|| self.short())
    }

    /// Skips `count` items of `item_len` bytes, checking they are there.
    pub(crate) fn skip_items(&mut self, count: usize, item_len: usize) -> Result<(), WalError> {
        let len = count.checked_mul(item_len).ok_or_else(|| self.short())?;
        self.cursor.skip(len).ok_or_else(|| self.short())
    }

    pub(crate) fn align8(&mut self) -> Result<(), WalError> {
        self.cursor.align8().ok_or_else(|| self.short())
    }

    /// Reads a `RelFileNode`.
    pub(crate) fn rel_file_node(&mut self) -> Result<crate::RelFileNode, WalError> {
        Ok(crate::RelFileNode { spcnode: self.u32()?, dbnode: self.u32()?, relnode: self.u32()? })
    }

    pub(crate) fn remaining(&self) -> usize {
        self.cursor.remaining()
    }
}
