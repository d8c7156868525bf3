//! `WalError`: everything that can be wrong with WAL bytes, each case carrying the LSN.
//!
//! WAL is data from another process (and, at the pageserver, from the network), so a bad
//! byte must become an error the caller can act on, never a panic and never a silently
//! skipped record. Every variant names the LSN of the page or record where the problem was
//! found, so an operator can point `pg_waldump` at it. Messages follow PostgreSQL's wording
//! (`xlogreader.c`) where one exists, so they can be searched for in its source.

use proto::Lsn;

/// A WAL decoding failure. Decoding errors are permanent: feeding the same bytes again
/// fails the same way.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WalError {
    #[error("invalid WAL segment size: {size_bytes} (expected a power of two from 1 MiB to 1 GiB)")]
    InvalidSegmentSize { size_bytes: u64 },
    #[error("invalid WAL start position {lsn}: neither a page boundary nor a possible record start")]
    InvalidStartLsn { lsn: Lsn },

    #[error("invalid magic number {magic:04X} in WAL page at {lsn}")]
    InvalidPageMagic { lsn: Lsn, magic: u16 },
    #[error("invalid info bits {info:04X} in WAL page at {lsn}")]
    InvalidPageInfo { lsn: Lsn, info: u16 },
    #[error("missing long page header in WAL page at {lsn}, the start of a segment")]
    MissingLongPageHeader { lsn: Lsn },
    #[error("unexpected pageaddr {pageaddr} in WAL page at {lsn}")]
    UnexpectedPageAddr { lsn: Lsn, pageaddr: Lsn },
    #[error("WAL page at {lsn} is from a different database system: system identifier {found}, expected {expected}")]
    SystemIdMismatch { lsn: Lsn, found: u64, expected: u64 },
    #[error("incorrect segment size {found} in WAL page header at {lsn}, expected {expected}")]
    SegmentSizeMismatch { lsn: Lsn, found: u32, expected: u64 },
    #[error("incorrect XLOG_BLCKSZ {found} in WAL page header at {lsn}")]
    PageSizeMismatch { lsn: Lsn, found: u32 },
    #[error("there is no contrecord flag in WAL page at {lsn}, where record at {record_lsn} continues")]
    MissingContrecord { lsn: Lsn, record_lsn: Lsn },
    #[error("invalid contrecord length {rem_len} in WAL page at {lsn}, expected {expected}")]
    InvalidContrecordLength { lsn: Lsn, rem_len: u32, expected: u32 },
    #[error("unexpected contrecord in WAL page at {lsn}, where a record should start")]
    UnexpectedContrecord { lsn: Lsn },

    #[error("invalid record length {len} at {lsn}")]
    InvalidRecordLength { lsn: Lsn, len: u32 },
    #[error("invalid resource manager id {rmid} at {lsn}")]
    InvalidRmgrId { lsn: Lsn, rmid: u8 },
    #[error("record with incorrect prev-link {prev} at {lsn}")]
    IncorrectPrevLink { lsn: Lsn, prev: Lsn },
    #[error("incorrect resource manager data checksum in record at {lsn}: stored {stored:08X}, computed {computed:08X}")]
    IncorrectChecksum { lsn: Lsn, stored: u32, computed: u32 },

    #[error("invalid block_id {block_id} at {lsn}")]
    InvalidBlockId { lsn: Lsn, block_id: u8 },
    #[error("out-of-order block_id {block_id} at {lsn}")]
    OutOfOrderBlockId { lsn: Lsn, block_id: u8 },
    #[error("invalid block reference {block_id} at {lsn}: {reason}")]
    InvalidBlockRef { lsn: Lsn, block_id: u8, reason: String },
    #[error("record with invalid length at {lsn}: {reason}")]
    InvalidRecordData { lsn: Lsn, reason: String },
    #[error("cannot restore image of block {block_id} in record at {lsn}: {reason}")]
    InvalidImage { lsn: Lsn, block_id: u8, reason: String },
    #[error("invalid {record} record at {lsn}: {reason}")]
    InvalidRmgrData { lsn: Lsn, record: &'static str, reason: String },
}

impl WalError {
    /// The LSN of the page or record the error is about.
    pub fn lsn(&self) -> Lsn {
        use WalError::*;
        match self {
            InvalidSegmentSize { .. } => Lsn::INVALID,
            InvalidStartLsn { lsn }
            | InvalidPageMagic { lsn, .. }
            | InvalidPageInfo { lsn, .. }
            | MissingLongPageHeader { lsn }
            | UnexpectedPageAddr { lsn, .. }
            | SystemIdMismatch { lsn, .. }
            | SegmentSizeMismatch { lsn, .. }
            | PageSizeMismatch { lsn, .. }
            | MissingContrecord { lsn, .. }
            | InvalidContrecordLength { lsn, .. }
            | UnexpectedContrecord { lsn }
            | InvalidRecordLength { lsn, .. }
            | InvalidRmgrId { lsn, .. }
            | IncorrectPrevLink { lsn, .. }
            | IncorrectChecksum { lsn, .. }
            | InvalidBlockId { lsn, .. }
            | OutOfOrderBlockId { lsn, .. }
            | InvalidBlockRef { lsn, .. }
            | InvalidRecordData { lsn, .. }
            | InvalidImage { lsn, .. }
            | InvalidRmgrData { lsn, .. } => *lsn,
        }
    }
}
