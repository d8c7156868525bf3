//! Newtypes for the PostgreSQL identifiers that appear in WAL records but not in `proto`.
//!
//! Transaction ids, multixact ids and offsets, and timeline ids are all 32-bit integers in
//! PostgreSQL, which makes them easy to mix up; here each is its own type. They live in
//! this crate because WAL is where fjord first meets them; if a service needs them in wire
//! messages they can move to `proto` unchanged. `RelFileNode` is here because commit records
//! and smgr truncation name a relation without a fork (every fork is meant).

use std::fmt;

use proto::{ForkNumber, Oid, RelTag};

/// A 32-bit transaction id (`TransactionId`). 0 is `InvalidTransactionId`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TransactionId(pub u32);

impl TransactionId {
    pub const INVALID: TransactionId = TransactionId(0);

    pub fn is_valid(self) -> bool {
        self != TransactionId::INVALID
    }

    /// Whether `self` is newer than `other` (PostgreSQL's `TransactionIdFollows`): modulo
    /// 2^32 for normal ids (3 and up), plainly for the special ones below them.
    pub fn follows(self, other: TransactionId) -> bool {
        if self.0 < 3 || other.0 < 3 {
            return self.0 > other.0;
        }
        (self.0.wrapping_sub(other.0) as i32) > 0
    }
}

impl fmt::Display for TransactionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A 64-bit transaction id: epoch in the high half, `TransactionId` in the low half
/// (`FullTransactionId`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FullTransactionId(pub u64);

impl FullTransactionId {
    pub fn epoch(self) -> u32 {
        (self.0 >> 32) as u32
    }

    pub fn xid(self) -> TransactionId {
        TransactionId(self.0 as u32)
    }
}

impl fmt::Display for FullTransactionId {
    /// Prints as `pg_waldump` does: `epoch:xid`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.epoch(), self.xid())
    }
}

/// A multixact id (`MultiXactId`), a name for a set of transactions locking one tuple.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MultiXactId(pub u32);

/// A position in the multixact members SLRU (`MultiXactOffset`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MultiXactOffset(pub u32);

/// A timeline id (`TimeLineID`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TimeLineId(pub u32);

/// A relation's storage without a fork: PostgreSQL's `RelFileNode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RelFileNode {
    pub spcnode: Oid,
    pub dbnode: Oid,
    pub relnode: Oid,
}

impl RelFileNode {
    /// `sizeof(RelFileNode)` in WAL.
    pub const SIZE: usize = 12;

    pub fn fork(self, forknum: ForkNumber) -> RelTag {
        RelTag { spcnode: self.spcnode, dbnode: self.dbnode, relnode: self.relnode, forknum }
    }
}

impl From<RelTag> for RelFileNode {
    fn from(rel: RelTag) -> RelFileNode {
        RelFileNode { spcnode: rel.spcnode, dbnode: rel.dbnode, relnode: rel.relnode }
    }
}

impl fmt::Display for RelFileNode {
    /// Prints as `pg_waldump` prints a relation: `spc/db/rel`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.spcnode, self.dbnode, self.relnode)
    }
}

#[cfg(test)]
mod tests {
    use super::TransactionId as X;

    #[test]
    fn follows_wraps_around_like_postgres() {
        assert!(X(10).follows(X(9)) && !X(9).follows(X(10)) && !X(9).follows(X(9)));
        // Across the wraparound: 5 is newer than 2^32 - 5.
        assert!(X(5).follows(X(u32::MAX - 5)) && !X(u32::MAX - 5).follows(X(5)));
        // The special ids compare plainly: every normal id follows them.
        assert!(X(3).follows(X(2)) && X(u32::MAX).follows(X(1)) && !X(0).follows(X(3)));
    }
}
