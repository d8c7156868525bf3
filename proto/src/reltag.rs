//! `RelTag`: which relation fork a page belongs to, PostgreSQL's `RelFileNode` + fork.
//!
//! A relation's storage is named by (tablespace oid, database oid, relfilenode) and split
//! into forks: main, free space map, visibility map and init (for unlogged relations).

use std::fmt;

/// A PostgreSQL object id.
pub type Oid = u32;

/// A block number inside one relation fork. `BlockNumber::INVALID` is PostgreSQL's
/// `InvalidBlockNumber`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockNumber(pub u32);

impl BlockNumber {
    pub const INVALID: BlockNumber = BlockNumber(u32::MAX);
}

impl fmt::Display for BlockNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A relation fork, with PostgreSQL's numbering (`ForkNumber` in `relpath.h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum ForkNumber {
    Main = 0,
    Fsm = 1,
    VisibilityMap = 2,
    Init = 3,
}

impl ForkNumber {
    pub const ALL: [ForkNumber; 4] = [ForkNumber::Main, ForkNumber::Fsm, ForkNumber::VisibilityMap, ForkNumber::Init];

    /// The fork with PostgreSQL's number `n`, or `None` if there is no such fork.
    pub fn from_u8(n: u8) -> Option<ForkNumber> {
        ForkNumber::ALL.get(usize::from(n)).copied()
    }

    /// The suffix PostgreSQL appends to a fork's file name (`_fsm`, `_vm`, `_init`).
    pub fn file_suffix(self) -> &'static str {
        match self {
            ForkNumber::Main => "",
            ForkNumber::Fsm => "_fsm",
            ForkNumber::VisibilityMap => "_vm",
            ForkNumber::Init => "_init",
        }
    }
}

/// One fork of one relation: (tablespace, database, relfilenode, fork).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RelTag {
    pub spcnode: Oid,
    pub dbnode: Oid,
    pub relnode: Oid,
    pub forknum: ForkNumber,
}

impl fmt::Display for RelTag {
    /// Prints as PostgreSQL's `relpathperm` would name the file, relative to the data
    /// directory, which is what a user finds in logs and `pg_relation_filepath()`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const GLOBALTABLESPACE_OID: Oid = 1664;
        const DEFAULTTABLESPACE_OID: Oid = 1663;
        let suffix = self.forknum.file_suffix();
        match self.spcnode {
            GLOBALTABLESPACE_OID => write!(f, "global/{}{}", self.relnode, suffix),
            DEFAULTTABLESPACE_OID => write!(f, "base/{}/{}{}", self.dbnode, self.relnode, suffix),
            spc => write!(f, "pg_tblspc/{}/PG_15_202209061/{}/{}{}", spc, self.dbnode, self.relnode, suffix),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_like_relpath() {
        let rel = RelTag { spcnode: 1663, dbnode: 5, relnode: 16384, forknum: ForkNumber::VisibilityMap };
        assert_eq!(rel.to_string(), "base/5/16384_vm");
        let rel = RelTag { spcnode: 1664, dbnode: 0, relnode: 1262, forknum: ForkNumber::Main };
        assert_eq!(rel.to_string(), "global/1262");
    }

    #[test]
    fn fork_numbers_match_postgres() {
        assert_eq!(ForkNumber::from_u8(2), Some(ForkNumber::VisibilityMap));
        assert_eq!(ForkNumber::from_u8(4), None);
        assert_eq!(ForkNumber::Init as u8, 3);
    }
}
