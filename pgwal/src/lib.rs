//! PostgreSQL 15 WAL: the one place in fjord that knows the layout of WAL pages and records.
//!
//! Pure decoding: bytes in, typed values out. No files, no sockets, no async runtime, so the
//! pageserver, the safekeeper and tests can all drive it, and fuzzers can feed it garbage.
//! The three layers, each usable on its own:
//!
//! 1. [`WalStreamDecoder`] turns a byte stream into [`WalRecord`]s: page headers validated,
//!    records reassembled across pages and segments, header and CRC checked.
//! 2. [`DecodedRecord`] splits a record into its header, [`BlockRef`]s (with full-page
//!    images, [`BlockImage`], restorable to an 8192-byte page), and main data.
//! 3. [`parse_metadata`] turns the records that change more than their blocks into a
//!    [`MetadataRecord`].
//!
//! What [`parse_metadata`] parses, and what it leaves alone:
//!
//! | Resource manager | Parsed | Not parsed (stored per block, replayed by PostgreSQL) |
//! |---|---|---|
//! | XLOG | `CHECKPOINT_SHUTDOWN`, `CHECKPOINT_ONLINE` (the whole `CheckPoint`), `NEXTOID`, `SWITCH` | `FPI`, `FPI_FOR_HINT` (plain block references), `NOOP`, `BACKUP_END`, `PARAMETER_CHANGE`, `RESTORE_POINT`, `FPW_CHANGE`, `END_OF_RECOVERY`, `OVERWRITE_CONTRECORD` |
//! | Transaction | `COMMIT`, `ABORT`, `COMMIT_PREPARED`, `ABORT_PREPARED` (xid, subxacts, dropped relations, db/tablespace, 2PC xid and gid, origin), `PREPARE` (header, subxacts, relations, raw state) | invalidation messages and dropped statistics (skipped, length-checked), `ASSIGNMENT`, `INVALIDATIONS` |
//! | Storage | `CREATE` (relation fork), `TRUNCATE` (with `SMGR_TRUNCATE_*` flags) | |
//! | Database | `CREATE_FILE_COPY`, `CREATE_WAL_LOG`, `DROP` | |
//! | CLOG | `ZEROPAGE`, `TRUNCATE` | |
//! | MultiXact | `ZERO_OFF_PAGE`, `ZERO_MEM_PAGE`, `CREATE_ID` (with members), `TRUNCATE_ID` | |
//! | RelMap | `UPDATE` (the 512-byte map file) | |
//! | Heap | visibility-map bits cleared by `INSERT`, `DELETE`, `UPDATE`, `HOT_UPDATE`, `LOCK` | tuple contents, `TRUNCATE` (logical decoding only), `CONFIRM`, `INPLACE` |
//! | Heap2 | visibility-map bits cleared by `MULTI_INSERT`, `LOCK_UPDATED`; set by `VISIBLE` | `PRUNE`, `VACUUM`, `FREEZE_PAGE`, `NEW_CID`, `REWRITE` |
//! | Standby | `RUNNING_XACTS` (counts, overflow flag, next/oldest running/latest completed xid; the xid lists length-checked) | `LOCK`, `INVALIDATIONS` |
//! | all others (Btree, Hash, Gin, Gist, Sequence, SPGist, BRIN, Generic, CommitTs, ReplicationOrigin, LogicalMessage, Tablespace, custom) | | everything |
//!
//! Supported servers: PostgreSQL 15 (`XLOG_PAGE_MAGIC` 0xD110), 64-bit little-endian,
//! `BLCKSZ` = `XLOG_BLCKSZ` = 8192. WAL of other versions or byte orders fails page-header
//! validation (the magic number differs); other page sizes fail the long-header check.
//!
//! Ingesting a stream, in outline:
//!
//! ```
//! use pgwal::{parse_metadata, DecoderConfig, WalError, WalStreamDecoder};
//! use proto::Lsn;
//!
//! fn ingest(start: Lsn, chunks: impl IntoIterator<Item = Vec<u8>>) -> Result<(), WalError> {
//!     let mut decoder = WalStreamDecoder::new(start, DecoderConfig::default())?;
//!     for chunk in chunks {
//!         decoder.feed_bytes(&chunk);
//!         while let Some(record) = decoder.poll_decode()? {
//!             let decoded = record.decode()?;
//!             for block in &decoded.blocks {
//!                 // store `record.raw()` (or the block's image) under (block.rel, block.blkno)
//!                 // at `record.end_lsn()`
//!             }
//!             if let Some(metadata) = parse_metadata(&decoded)? {
//!                 // update relation sizes, CLOG, the database list, ...
//!             }
//!         }
//!     }
//!     Ok(())
//! }
//! # ingest(Lsn(0x0100_0000), Vec::new()).unwrap();
//! ```

pub mod consts;
mod cursor;
mod error;
pub mod fpi;
pub mod ids;
pub mod page;
pub mod parse;
pub mod pglz;
pub mod record;
pub mod segment;
pub mod stream;

#[cfg(test)]
mod record_tests;
#[cfg(test)]
mod stream_tests;
/// The test WAL encoder, for this crate's tests and, with the `test-encoder` feature, for
/// other crates' tests that need WAL of a particular shape (never in a service).
#[cfg(any(test, feature = "test-encoder"))]
pub mod test_encoder;

pub use error::WalError;
pub use fpi::{BlockImage, ImageCompression};
pub use ids::{FullTransactionId, MultiXactId, MultiXactOffset, RelFileNode, TimeLineId, TransactionId};
pub use page::{LongPageHeader, PageHeader};
pub use parse::{parse_metadata, MetadataRecord};
pub use record::{BlockRef, DecodedRecord, RecordHeader};
pub use stream::{DecoderConfig, WalRecord, WalStreamDecoder};
