//! The durable extent of a timeline's WAL: a leaf shared by the WAL store, which records
//! it in `wal.end`, and the removal rule, which computes a new beginning from it.

use proto::Lsn;

/// The durable extent of the WAL as recorded in `wal.end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WalExtent {
    pub begin: Lsn,
    pub end: Lsn,
}
