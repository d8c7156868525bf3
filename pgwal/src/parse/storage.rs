//! Records that create, truncate and drop storage: `RM_SMGR_ID`, `RM_DBASE_ID`, and the
//! relation mapper (`RM_RELMAP_ID`), whose file says where the mapped catalogs live.
//!
//! Storage tracks which relations and databases exist and how many blocks each fork has;
//! these records change that without any block reference. In PostgreSQL 15, `CREATE
//! DATABASE` either copies files (`XLOG_DBASE_CREATE_FILE_COPY`: storage must copy the
//! template database) or logs every block (`XLOG_DBASE_CREATE_WAL_LOG`: only the database
//! directory is created here; smgr-create and full-page records follow).

use bytes::Bytes;
use proto::{BlockNumber, ForkNumber, Oid, RelTag};

use super::{MainData, MetadataRecord};
use crate::consts::*;
use crate::ids::RelFileNode;
use crate::record::DecodedRecord;
use crate::WalError;

/// `xl_smgr_create`: a relation fork's file is created (empty).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmgrCreate {
    pub rel: RelTag,
}

/// `xl_smgr_truncate`: forks of a relation are cut to a length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmgrTruncate {
    pub rnode: RelFileNode,
    /// The new length of the main fork, in blocks. The FSM and VM forks are cut to the
    /// matching lengths of their own (computed by their code, not logged).
    pub blkno: BlockNumber,
    /// `SMGR_TRUNCATE_*` bits: which forks are truncated.
    pub flags: u32,
}

impl SmgrTruncate {
    pub fn truncates(&self, fork: ForkNumber) -> bool {
        let bit = match fork {
            ForkNumber::Main => SMGR_TRUNCATE_HEAP,
            ForkNumber::Fsm => SMGR_TRUNCATE_FSM,
            ForkNumber::VisibilityMap => SMGR_TRUNCATE_VM,
            ForkNumber::Init => return false,
        };
        self.flags & bit != 0
    }
}

/// How a database was created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DbaseCreateStrategy {
    /// `XLOG_DBASE_CREATE_FILE_COPY`: copy every file of the source database.
    FileCopy { src_db_id: Oid, src_tablespace_id: Oid },
    /// `XLOG_DBASE_CREATE_WAL_LOG`: create the directory; the contents follow in WAL.
    WalLog,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DbaseCreate {
    pub db_id: Oid,
    pub tablespace_id: Oid,
    pub strategy: DbaseCreateStrategy,
}

/// `xl_dbase_drop_rec`: the database's directory in each tablespace is removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DbaseDrop {
    pub db_id: Oid,
    pub tablespace_ids: Vec<Oid>,
}

/// `xl_relmap_update`: the new contents of a `pg_filenode.map` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelmapUpdate {
    /// The database, or 0 for the shared map in `global/`.
    pub db_id: Oid,
    pub tablespace_id: Oid,
    /// The whole file, `RELMAP_FILE_SIZE` bytes.
    pub data: Bytes,
}

pub(super) fn parse_smgr(record: &DecodedRecord, info: u8) -> Result<Option<MetadataRecord>, WalError> {
    match info {
        XLOG_SMGR_CREATE => {
            let mut d = MainData::new(record, "smgr create", 16, true)?;
            let rnode = d.rel_file_node()?;
            let fork = d.u32()?;
            let forknum =
                u8::try_from(fork).ok().and_then(ForkNumber::from_u8).ok_or_else(|| d.error(format!("invalid fork number {fork}")))?;
            Ok(Some(MetadataRecord::SmgrCreate(SmgrCreate { rel: rnode.fork(forknum) })))
        }
        XLOG_SMGR_TRUNCATE => {
            let mut d = MainData::new(record, "smgr truncate", 20, true)?;
            let blkno = BlockNumber(d.u32()?);
            let rnode = d.rel_file_node()?;
            let flags = d.u32()?;
            Ok(Some(MetadataRecord::SmgrTruncate(SmgrTruncate { rnode, blkno, flags })))
        }
        _ => Ok(None),
    }
}

pub(super) fn parse_dbase(record: &DecodedRecord, info: u8) -> Result<Option<MetadataRecord>, WalError> {
    match info {
        XLOG_DBASE_CREATE_FILE_COPY => {
            let mut d = MainData::new(record, "database create", 16, true)?;
            let (db_id, tablespace_id) = (d.u32()?, d.u32()?);
            let strategy = DbaseCreateStrategy::FileCopy { src_db_id: d.u32()?, src_tablespace_id: d.u32()? };
            Ok(Some(MetadataRecord::DbaseCreate(DbaseCreate { db_id, tablespace_id, strategy })))
        }
        XLOG_DBASE_CREATE_WAL_LOG => {
            let mut d = MainData::new(record, "database create", 8, true)?;
            let (db_id, tablespace_id) = (d.u32()?, d.u32()?);
            let strategy = DbaseCreateStrategy::WalLog;
            Ok(Some(MetadataRecord::DbaseCreate(DbaseCreate { db_id, tablespace_id, strategy })))
        }
        XLOG_DBASE_DROP => {
            let mut d = MainData::new(record, "database drop", 8, false)?;
            let db_id = d.u32()?;
            let n = d.count("ntablespaces")?;
            if n.saturating_mul(4) != d.remaining() {
                return Err(d.error(format!("{n} tablespaces announced, {} bytes follow", d.remaining())));
            }
            let tablespace_ids = (0..n).map(|_| d.u32()).collect::<Result<_, _>>()?;
            Ok(Some(MetadataRecord::DbaseDrop(DbaseDrop { db_id, tablespace_ids })))
        }
        _ => Ok(None),
    }
}

pub(super) fn parse_relmap(record: &DecodedRecord, info: u8) -> Result<Option<MetadataRecord>, WalError> {
    if info != XLOG_RELMAP_UPDATE {
        return Ok(None);
    }
    let mut d = MainData::new(record, "relmap update", 12 + RELMAP_FILE_SIZE, true)?;
    let db_id = d.u32()?;
    let tablespace_id = d.u32()?;
    let nbytes = d.count("nbytes")?;
    if nbytes != RELMAP_FILE_SIZE {
        return Err(d.error(format!("nbytes is {nbytes}, expected {RELMAP_FILE_SIZE}")));
    }
    let data = record.main_data.slice(12..);
    Ok(Some(MetadataRecord::RelmapUpdate(RelmapUpdate { db_id, tablespace_id, data })))
}
