//! PostgreSQL 15's WAL constants, named exactly as in its headers.
//!
//! Keeping PostgreSQL's names (rather than Rust-style ones) lets a reader grep the PostgreSQL
//! source for any constant used here and find its definition and its users. Each group says
//! which header it comes from; the values are those of PostgreSQL 15 on a 64-bit
//! little-endian build with default `BLCKSZ` and `XLOG_BLCKSZ`, the only kind fjord supports.
//! Nothing here is computed at run time: a wrong value is a wrong constant, caught by the
//! real-WAL test.

// --- c.h, pg_config.h ---

/// `MAXIMUM_ALIGNOF` on every 64-bit platform PostgreSQL supports: records start on
/// multiples of it and some payloads are padded to it.
pub const MAXIMUM_ALIGNOF: usize = 8;
/// Size of a data page (`BLCKSZ`), and so of every full-page image once restored.
pub const BLCKSZ: usize = proto::page::PAGE_SIZE_BYTES;
/// Size of a WAL page (`XLOG_BLCKSZ`).
pub const XLOG_BLCKSZ: usize = proto::lsn::WAL_PAGE_SIZE_BYTES as usize;

/// Rounds `len` up to a multiple of [`MAXIMUM_ALIGNOF`], as PostgreSQL's `MAXALIGN`.
pub const fn maxalign(len: usize) -> usize {
    (len + MAXIMUM_ALIGNOF - 1) & !(MAXIMUM_ALIGNOF - 1)
}

// --- access/xlog_internal.h ---

/// `xlp_magic` of every PostgreSQL 15 WAL page; it changes with each WAL format version.
pub const XLOG_PAGE_MAGIC: u16 = 0xD110;
/// `SizeOfXLogShortPHD`: `MAXALIGN(sizeof(XLogPageHeaderData))`.
pub const SIZE_OF_XLOG_SHORT_PHD: usize = 24;
/// `SizeOfXLogLongPHD`: `MAXALIGN(sizeof(XLogLongPageHeaderData))`.
pub const SIZE_OF_XLOG_LONG_PHD: usize = 40;
pub const XLP_FIRST_IS_CONTRECORD: u16 = 0x0001;
pub const XLP_LONG_HEADER: u16 = 0x0002;
pub const XLP_BKP_REMOVABLE: u16 = 0x0004;
pub const XLP_FIRST_IS_OVERWRITE_CONTRECORD: u16 = 0x0008;
pub const XLP_ALL_FLAGS: u16 = 0x000F;
/// `WalSegMinSize` and `WalSegMaxSize`: the range `initdb --wal-segsize` accepts.
pub const WAL_SEG_MIN_SIZE: u64 = 1024 * 1024;
pub const WAL_SEG_MAX_SIZE: u64 = 1024 * 1024 * 1024;

// --- access/xlogrecord.h ---

/// `SizeOfXLogRecord`: the fixed record header, up to and including `xl_crc`.
pub const SIZE_OF_XLOG_RECORD: usize = 24;
/// `offsetof(XLogRecord, xl_crc)`: the header bytes covered by the CRC.
pub const XLOG_RECORD_CRC_OFFSET: usize = 20;
pub const XLR_INFO_MASK: u8 = 0x0F;
pub const XLR_RMGR_INFO_MASK: u8 = 0xF0;
pub const XLR_SPECIAL_REL_UPDATE: u8 = 0x01;
pub const XLR_CHECK_CONSISTENCY: u8 = 0x02;

pub const BKPIMAGE_HAS_HOLE: u8 = 0x01;
pub const BKPIMAGE_APPLY: u8 = 0x02;
pub const BKPIMAGE_COMPRESS_PGLZ: u8 = 0x04;
pub const BKPIMAGE_COMPRESS_LZ4: u8 = 0x08;
pub const BKPIMAGE_COMPRESS_ZSTD: u8 = 0x10;
/// The bits of `bimg_info` that `BKPIMAGE_COMPRESSED()` tests.
pub const BKPIMAGE_COMPRESS_MASK: u8 = BKPIMAGE_COMPRESS_PGLZ | BKPIMAGE_COMPRESS_LZ4 | BKPIMAGE_COMPRESS_ZSTD;

pub const BKPBLOCK_FORK_MASK: u8 = 0x0F;
pub const BKPBLOCK_FLAG_MASK: u8 = 0xF0;
pub const BKPBLOCK_HAS_IMAGE: u8 = 0x10;
pub const BKPBLOCK_HAS_DATA: u8 = 0x20;
pub const BKPBLOCK_WILL_INIT: u8 = 0x40;
pub const BKPBLOCK_SAME_REL: u8 = 0x80;

pub const XLR_MAX_BLOCK_ID: u8 = 32;
pub const XLR_BLOCK_ID_DATA_SHORT: u8 = 255;
pub const XLR_BLOCK_ID_DATA_LONG: u8 = 254;
pub const XLR_BLOCK_ID_ORIGIN: u8 = 253;
pub const XLR_BLOCK_ID_TOPLEVEL_XID: u8 = 252;

/// PostgreSQL 15 refuses to allocate a record buffer past `MaxAllocSize`
/// (`allocate_recordbuf`), so no valid record is longer; a longer `xl_tot_len` is garbage.
pub const MAX_ALLOC_SIZE: u32 = 0x3fff_ffff;

// --- access/rmgrlist.h, access/rmgr.h ---

pub const RM_XLOG_ID: u8 = 0;
pub const RM_XACT_ID: u8 = 1;
pub const RM_SMGR_ID: u8 = 2;
pub const RM_CLOG_ID: u8 = 3;
pub const RM_DBASE_ID: u8 = 4;
pub const RM_TBLSPC_ID: u8 = 5;
pub const RM_MULTIXACT_ID: u8 = 6;
pub const RM_RELMAP_ID: u8 = 7;
pub const RM_STANDBY_ID: u8 = 8;
pub const RM_HEAP2_ID: u8 = 9;
pub const RM_HEAP_ID: u8 = 10;
pub const RM_BTREE_ID: u8 = 11;
pub const RM_HASH_ID: u8 = 12;
pub const RM_GIN_ID: u8 = 13;
pub const RM_GIST_ID: u8 = 14;
pub const RM_SEQ_ID: u8 = 15;
pub const RM_SPGIST_ID: u8 = 16;
pub const RM_BRIN_ID: u8 = 17;
pub const RM_COMMIT_TS_ID: u8 = 18;
pub const RM_REPLORIGIN_ID: u8 = 19;
pub const RM_GENERIC_ID: u8 = 20;
pub const RM_LOGICALMSG_ID: u8 = 21;
pub const RM_MAX_BUILTIN_ID: u8 = RM_LOGICALMSG_ID;
pub const RM_MIN_CUSTOM_ID: u8 = 128;
pub const RM_MAX_CUSTOM_ID: u8 = u8::MAX;

/// `RmgrIdIsValid`: built-in ids and the range reserved for extensions.
pub const fn rmgr_id_is_valid(rmid: u8) -> bool {
    rmid <= RM_MAX_BUILTIN_ID || rmid >= RM_MIN_CUSTOM_ID
}

/// The resource manager's name as `pg_waldump` prints it, for messages and statistics.
pub fn rmgr_name(rmid: u8) -> &'static str {
    const NAMES: [&str; 22] = [
        "XLOG",
        "Transaction",
        "Storage",
        "CLOG",
        "Database",
        "Tablespace",
        "MultiXact",
        "RelMap",
        "Standby",
        "Heap2",
        "Heap",
        "Btree",
        "Hash",
        "Gin",
        "Gist",
        "Sequence",
        "SPGist",
        "BRIN",
        "CommitTs",
        "ReplicationOrigin",
        "Generic",
        "LogicalMessage",
    ];
    NAMES.get(usize::from(rmid)).copied().unwrap_or("custom")
}

// --- catalog/pg_control.h (RM_XLOG_ID) ---

pub const XLOG_CHECKPOINT_SHUTDOWN: u8 = 0x00;
pub const XLOG_CHECKPOINT_ONLINE: u8 = 0x10;
pub const XLOG_NOOP: u8 = 0x20;
pub const XLOG_NEXTOID: u8 = 0x30;
pub const XLOG_SWITCH: u8 = 0x40;
pub const XLOG_BACKUP_END: u8 = 0x50;
pub const XLOG_PARAMETER_CHANGE: u8 = 0x60;
pub const XLOG_RESTORE_POINT: u8 = 0x70;
pub const XLOG_FPW_CHANGE: u8 = 0x80;
pub const XLOG_END_OF_RECOVERY: u8 = 0x90;
pub const XLOG_FPI_FOR_HINT: u8 = 0xA0;
pub const XLOG_FPI: u8 = 0xB0;
pub const XLOG_OVERWRITE_CONTRECORD: u8 = 0xD0;
/// `sizeof(CheckPoint)` with x86-64/aarch64 alignment.
pub const SIZE_OF_CHECKPOINT: usize = 88;

// --- access/xact.h (RM_XACT_ID) ---

pub const XLOG_XACT_COMMIT: u8 = 0x00;
pub const XLOG_XACT_PREPARE: u8 = 0x10;
pub const XLOG_XACT_ABORT: u8 = 0x20;
pub const XLOG_XACT_COMMIT_PREPARED: u8 = 0x30;
pub const XLOG_XACT_ABORT_PREPARED: u8 = 0x40;
pub const XLOG_XACT_ASSIGNMENT: u8 = 0x50;
pub const XLOG_XACT_INVALIDATIONS: u8 = 0x60;
pub const XLOG_XACT_OPMASK: u8 = 0x70;
pub const XLOG_XACT_HAS_INFO: u8 = 0x80;

pub const XACT_XINFO_HAS_DBINFO: u32 = 1 << 0;
pub const XACT_XINFO_HAS_SUBXACTS: u32 = 1 << 1;
pub const XACT_XINFO_HAS_RELFILENODES: u32 = 1 << 2;
pub const XACT_XINFO_HAS_INVALS: u32 = 1 << 3;
pub const XACT_XINFO_HAS_TWOPHASE: u32 = 1 << 4;
pub const XACT_XINFO_HAS_ORIGIN: u32 = 1 << 5;
pub const XACT_XINFO_HAS_AE_LOCKS: u32 = 1 << 6;
pub const XACT_XINFO_HAS_GID: u32 = 1 << 7;
pub const XACT_XINFO_HAS_DROPPED_STATS: u32 = 1 << 8;
pub const XACT_COMPLETION_APPLY_FEEDBACK: u32 = 1 << 29;
pub const XACT_COMPLETION_UPDATE_RELCACHE_FILE: u32 = 1 << 30;
pub const XACT_COMPLETION_FORCE_SYNC_COMMIT: u32 = 1 << 31;
/// `sizeof(SharedInvalidationMessage)`: invalidation messages are skipped, not parsed.
pub const SIZE_OF_SHARED_INVALIDATION_MESSAGE: usize = 16;
/// `sizeof(xl_xact_stats_item)`: dropped-statistics entries are skipped, not parsed.
pub const SIZE_OF_XACT_STATS_ITEM: usize = 12;
/// `sizeof(xl_xact_prepare)`, the header of a two-phase state file.
pub const SIZE_OF_XACT_PREPARE: usize = 72;
/// `TWOPHASE_MAGIC` (twophase.c): the format of the two-phase state in a prepare record.
pub const TWOPHASE_MAGIC: u32 = 0x57F9_4534;
/// `GIDSIZE`: a global transaction id is shorter than this, terminator included.
pub const GIDSIZE: usize = 200;

// --- catalog/storage_xlog.h (RM_SMGR_ID) ---

pub const XLOG_SMGR_CREATE: u8 = 0x10;
pub const XLOG_SMGR_TRUNCATE: u8 = 0x20;
pub const SMGR_TRUNCATE_HEAP: u32 = 0x0001;
pub const SMGR_TRUNCATE_VM: u32 = 0x0002;
pub const SMGR_TRUNCATE_FSM: u32 = 0x0004;
pub const SMGR_TRUNCATE_ALL: u32 = SMGR_TRUNCATE_HEAP | SMGR_TRUNCATE_VM | SMGR_TRUNCATE_FSM;

// --- commands/dbcommands_xlog.h (RM_DBASE_ID) ---

pub const XLOG_DBASE_CREATE_FILE_COPY: u8 = 0x00;
pub const XLOG_DBASE_CREATE_WAL_LOG: u8 = 0x10;
pub const XLOG_DBASE_DROP: u8 = 0x20;

// --- access/clog.h (RM_CLOG_ID) ---

pub const CLOG_ZEROPAGE: u8 = 0x00;
pub const CLOG_TRUNCATE: u8 = 0x10;

// --- access/multixact.h (RM_MULTIXACT_ID) ---

pub const XLOG_MULTIXACT_ZERO_OFF_PAGE: u8 = 0x00;
pub const XLOG_MULTIXACT_ZERO_MEM_PAGE: u8 = 0x10;
pub const XLOG_MULTIXACT_CREATE_ID: u8 = 0x20;
pub const XLOG_MULTIXACT_TRUNCATE_ID: u8 = 0x30;

// --- storage/standbydefs.h (RM_STANDBY_ID) ---

pub const XLOG_STANDBY_LOCK: u8 = 0x00;
pub const XLOG_RUNNING_XACTS: u8 = 0x10;
pub const XLOG_INVALIDATIONS: u8 = 0x20;
/// `MinSizeOfXactRunningXacts`: `xl_running_xacts` up to its xid array.
pub const MIN_SIZE_OF_RUNNING_XACTS: usize = 24;

// --- utils/relmapper.h, utils/cache/relmapper.c (RM_RELMAP_ID) ---

pub const XLOG_RELMAP_UPDATE: u8 = 0x00;
/// `sizeof(RelMapFile)`: relmap_redo PANICs on any other size, so we reject it.
pub const RELMAP_FILE_SIZE: usize = 512;

// --- access/heapam_xlog.h (RM_HEAP_ID, RM_HEAP2_ID) ---

pub const XLOG_HEAP_INSERT: u8 = 0x00;
pub const XLOG_HEAP_DELETE: u8 = 0x10;
pub const XLOG_HEAP_UPDATE: u8 = 0x20;
pub const XLOG_HEAP_TRUNCATE: u8 = 0x30;
pub const XLOG_HEAP_HOT_UPDATE: u8 = 0x40;
pub const XLOG_HEAP_CONFIRM: u8 = 0x50;
pub const XLOG_HEAP_LOCK: u8 = 0x60;
pub const XLOG_HEAP_INPLACE: u8 = 0x70;
pub const XLOG_HEAP_OPMASK: u8 = 0x70;
pub const XLOG_HEAP_INIT_PAGE: u8 = 0x80;

pub const XLOG_HEAP2_REWRITE: u8 = 0x00;
pub const XLOG_HEAP2_PRUNE: u8 = 0x10;
pub const XLOG_HEAP2_VACUUM: u8 = 0x20;
pub const XLOG_HEAP2_FREEZE_PAGE: u8 = 0x30;
pub const XLOG_HEAP2_VISIBLE: u8 = 0x40;
pub const XLOG_HEAP2_MULTI_INSERT: u8 = 0x50;
pub const XLOG_HEAP2_LOCK_UPDATED: u8 = 0x60;
pub const XLOG_HEAP2_NEW_CID: u8 = 0x70;

pub const XLH_INSERT_ALL_VISIBLE_CLEARED: u8 = 1 << 0;
pub const XLH_INSERT_LAST_IN_MULTI: u8 = 1 << 1;
pub const XLH_INSERT_IS_SPECULATIVE: u8 = 1 << 2;
pub const XLH_INSERT_CONTAINS_NEW_TUPLE: u8 = 1 << 3;
pub const XLH_INSERT_ON_TOAST_RELATION: u8 = 1 << 4;
pub const XLH_INSERT_ALL_FROZEN_SET: u8 = 1 << 5;
pub const XLH_UPDATE_OLD_ALL_VISIBLE_CLEARED: u8 = 1 << 0;
pub const XLH_UPDATE_NEW_ALL_VISIBLE_CLEARED: u8 = 1 << 1;
pub const XLH_DELETE_ALL_VISIBLE_CLEARED: u8 = 1 << 0;
pub const XLH_LOCK_ALL_FROZEN_CLEARED: u8 = 0x01;

/// `SizeOfHeapInsert`, `SizeOfHeapDelete`, ...: the fixed part of each heap record's main
/// data, which is all this crate reads.
pub const SIZE_OF_HEAP_INSERT: usize = 3;
pub const SIZE_OF_HEAP_DELETE: usize = 8;
pub const SIZE_OF_HEAP_UPDATE: usize = 14;
pub const SIZE_OF_HEAP_LOCK: usize = 8;
pub const SIZE_OF_HEAP_LOCK_UPDATED: usize = 8;
pub const SIZE_OF_HEAP_MULTI_INSERT: usize = 4;
pub const SIZE_OF_HEAP_VISIBLE: usize = 5;

// --- access/visibilitymapdefs.h, access/heap/visibilitymap.c ---

pub const VISIBILITYMAP_ALL_VISIBLE: u8 = 0x01;
pub const VISIBILITYMAP_ALL_FROZEN: u8 = 0x02;
pub const VISIBILITYMAP_VALID_BITS: u8 = 0x03;
/// `MAPSIZE`: bytes of bitmap in one visibility-map page (`BLCKSZ` minus the page header).
pub const VM_MAPSIZE: usize = BLCKSZ - maxalign(24);
/// `HEAPBLOCKS_PER_BYTE`: two bits per heap block.
pub const VM_HEAPBLOCKS_PER_BYTE: u32 = 4;
/// `HEAPBLOCKS_PER_PAGE`.
pub const VM_HEAPBLOCKS_PER_PAGE: u32 = VM_MAPSIZE as u32 * VM_HEAPBLOCKS_PER_BYTE;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_sizes_match_postgres() {
        assert_eq!(maxalign(20), SIZE_OF_XLOG_SHORT_PHD);
        assert_eq!(maxalign(36), SIZE_OF_XLOG_LONG_PHD);
        assert_eq!(VM_HEAPBLOCKS_PER_PAGE, 32672);
        assert!(rmgr_id_is_valid(RM_LOGICALMSG_ID));
        assert!(!rmgr_id_is_valid(22));
        assert!(!rmgr_id_is_valid(127));
        assert!(rmgr_id_is_valid(128));
        assert_eq!(rmgr_name(RM_HEAP2_ID), "Heap2");
    }
}
