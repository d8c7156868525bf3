//! How a PostgreSQL data directory maps onto keys and values, and the reads that put it
//! back together at an LSN.
//!
//! | PostgreSQL | key (`proto::Key`) | value |
//! |---|---|---|
//! | the databases (`base/*`, plus the pseudo-database (1664, 0) of `global/`) | `db_dir` | database directory (`codec.rs`) |
//! | the relation forks of one database | `rel_dir(spc, db)` | relation directory |
//! | one block of a relation fork | `rel_block(rel, blkno)` | page image or WAL records |
//! | a relation fork's length | `rel_size(rel)` | `u32` LE block count |
//! | `pg_filenode.map` of a database (of `global/`: (1664, 0)) | `relmap_file(spc, db)` | the 512-byte file |
//! | the segments of `pg_xact`, `pg_multixact/offsets`, `.../members` | `slru_dir(kind)` | SLRU directory |
//! | one page of an SLRU segment (32 pages of 8192 bytes) | `slru_block(kind, segno, blkno)` | page image or Rust records |
//! | an SLRU segment's length | `slru_segment_size(kind, segno)` | `u32` LE page count |
//! | the prepared transactions (`pg_twophase`) | `twophase_dir` | two-phase directory |
//! | `pg_twophase/<xid>` | `twophase_file(xid)` | the state file, CRC included |
//! | the latest checkpoint record, and the counters as of each LSN | `checkpoint` | start LSN, current `CheckPoint`, the WAL record (`codec.rs`) |
//! | `global/pg_control` | `control_file` | the 8192-byte file as imported |
//! | (none: when the last commit at or before an LSN happened) | `last_commit_timestamp` | `TimestampTz` (`codec.rs`), never decreasing |
//! | (none: the newest running-transactions record at or before an LSN, where a hot standby starts) | `last_running_xacts` | where replay starts (the record, or an earlier commit it raced: `WalIngest::standby_start_for`) and its oldest running xid (`codec.rs`) |
//!
//! Decisions:
//! - **Existence is the directory's word.** Versions are never deleted, so a dropped
//!   relation's blocks and size stay in the store; they are unreachable because every read
//!   checks the relation (or SLRU segment, or database) directory first. Creating a
//!   relation or segment again writes a fresh size.
//! - **The free space map is not stored.** PostgreSQL does not WAL-log FSM changes, so a
//!   stored copy would be stale. Reads say the FSM fork does not exist, has 0 blocks, and
//!   that any FSM block is all zeros; a compute treats a missing or zeroed FSM as "no free
//!   space known", which is safe: it costs only a relation extension.
//! - **Unlogged relations keep only their init fork** (the only fork that is WAL-logged);
//!   temporary relations are never stored.
//!
//! Reads of these values never run WAL redo: directories and sizes are stored whole, and
//! SLRU pages are rebuilt in Rust (`reconstruct`). `Modification` gathers the puts of one
//! WAL record so that its reads see its own earlier writes, then publishes them at once.
//!
//! Invariant: every value read is decoded and validated; a value that fails is a
//! `DatadirError::Corrupt` naming the key and LSN.

pub mod codec;

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use pgwal::parse::CheckPoint;
use pgwal::{parse_metadata, DecodedRecord, MetadataRecord};
use proto::page::PAGE_SIZE_BYTES;
use proto::{BlockNumber, ForkNumber, Key, Lsn, Oid, RelTag, SlruKind};

use crate::pgdata::reconstruct::{PgReconstructor, StoredRecord};
use codec::{DbEntry, RelEntry, StoredCheckpoint};
use layerstore::error::{ReadError, WriteError};
use layerstore::timeline::Timeline;
use layerstore::{ReconstructData, Reconstructor, Record, Value};

/// `GLOBALTABLESPACE_OID`: the tablespace of the shared catalogs in `global/`.
pub const GLOBAL_TABLESPACE_OID: Oid = 1664;
/// `DEFAULTTABLESPACE_OID`: `base/`.
pub const DEFAULT_TABLESPACE_OID: Oid = 1663;

/// A read of the data directory at an LSN failed.
#[derive(Debug, thiserror::Error)]
pub enum DatadirError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("{what} does not exist at LSN {lsn}")]
    NotFound { what: String, lsn: Lsn },
    #[error("value of key {key} at LSN {lsn} is corrupt: {reason}")]
    Corrupt { key: Key, lsn: Lsn, reason: String },
}

/// Where typed reads get values from: the store at an LSN, or a `Modification` in progress.
pub(crate) trait ValueSource {
    fn read_lsn(&self) -> Lsn;
    /// The value of a key stored whole (or an SLRU page), `None` if it has none.
    fn value(&self, key: Key) -> Result<Option<Bytes>, DatadirError>;

    fn decoded<T, E: std::fmt::Display>(&self, key: Key, decode: impl FnOnce(&[u8]) -> Result<T, E>) -> Result<Option<T>, DatadirError> {
        match self.value(key)? {
            None => Ok(None),
            Some(bytes) => decode(&bytes).map(Some).map_err(|e| DatadirError::Corrupt { key, lsn: self.read_lsn(), reason: e.to_string() }),
        }
    }

    fn db_dir(&self) -> Result<BTreeSet<DbEntry>, DatadirError> {
        Ok(self.decoded(Key::db_dir(), codec::decode_db_dir)?.unwrap_or_default())
    }

    fn rel_dir(&self, spcnode: Oid, dbnode: Oid) -> Result<Option<BTreeSet<RelEntry>>, DatadirError> {
        self.decoded(Key::rel_dir(spcnode, dbnode), codec::decode_rel_dir)
    }

    /// Whether `rel` is listed in its database's relation directory.
    fn rel_listed(&self, rel: RelTag) -> Result<bool, DatadirError> {
        let entry = RelEntry { relnode: rel.relnode, forknum: rel.forknum };
        Ok(self.decoded(Key::rel_dir(rel.spcnode, rel.dbnode), |b| codec::rel_dir_contains(b, &entry))?.unwrap_or(false))
    }

    /// The stored size of `rel`, without checking that it exists.
    fn rel_size_raw(&self, rel: RelTag) -> Result<Option<u32>, DatadirError> {
        self.decoded(Key::rel_size(rel), codec::decode_block_count)
    }

    fn slru_dir(&self, slru: SlruKind) -> Result<BTreeSet<u32>, DatadirError> {
        Ok(self.decoded(Key::slru_dir(slru), codec::decode_slru_dir)?.unwrap_or_default())
    }

    /// The size of an SLRU segment in pages; `None` if the segment does not exist.
    fn slru_segment_size(&self, slru: SlruKind, segno: u32) -> Result<Option<u32>, DatadirError> {
        if !self.slru_dir(slru)?.contains(&segno) {
            return Ok(None);
        }
        self.decoded(Key::slru_segment_size(slru, segno), codec::decode_block_count)
    }

    fn twophase_dir(&self) -> Result<BTreeSet<u32>, DatadirError> {
        Ok(self.decoded(Key::twophase_dir(), codec::decode_twophase_dir)?.unwrap_or_default())
    }

    fn checkpoint(&self) -> Result<Option<StoredCheckpoint>, DatadirError> {
        self.decoded(Key::checkpoint(), |b| codec::decode_checkpoint(&Bytes::copy_from_slice(b)))
    }

    fn last_commit_timestamp(&self) -> Result<Option<i64>, DatadirError> {
        self.decoded(Key::last_commit_timestamp(), codec::decode_commit_timestamp)
    }
}

/// The store at one LSN, read without WAL redo.
struct Snapshot<'a> {
    timeline: &'a Timeline,
    lsn: Lsn,
}

impl ValueSource for Snapshot<'_> {
    fn read_lsn(&self) -> Lsn {
        self.lsn
    }

    fn value(&self, key: Key) -> Result<Option<Bytes>, DatadirError> {
        Ok(self.timeline.get(key, self.lsn, &PgReconstructor::rust_only())?)
    }
}

/// Reads of the data directory of one timeline. See the module documentation.
pub struct Datadir<'a> {
    timeline: &'a Timeline,
    reconstructor: &'a dyn Reconstructor,
}

impl<'a> Datadir<'a> {
    /// `reconstructor` rebuilds relation pages (`get_rel_page`); everything else is read
    /// without it.
    pub fn new(timeline: &'a Timeline, reconstructor: &'a dyn Reconstructor) -> Datadir<'a> {
        Datadir { timeline, reconstructor }
    }

    fn at(&self, lsn: Lsn) -> Snapshot<'a> {
        Snapshot { timeline: self.timeline, lsn }
    }

    /// Whether the relation fork exists. Always false for the FSM, which is not stored.
    pub fn rel_exists(&self, rel: RelTag, lsn: Lsn) -> Result<bool, DatadirError> {
        if rel.forknum == ForkNumber::Fsm {
            return Ok(false);
        }
        self.at(lsn).rel_listed(rel)
    }

    /// The length of a relation fork in blocks. The FSM has 0; a missing fork is an error.
    pub fn get_rel_size(&self, rel: RelTag, lsn: Lsn) -> Result<u32, DatadirError> {
        if rel.forknum == ForkNumber::Fsm {
            return Ok(0);
        }
        let snap = self.at(lsn);
        if !snap.rel_listed(rel)? {
            return Err(DatadirError::NotFound { what: format!("relation {rel}"), lsn });
        }
        snap.rel_size_raw(rel)?.ok_or_else(|| DatadirError::Corrupt {
            key: Key::rel_size(rel),
            lsn,
            reason: format!("relation {rel} is listed in its directory but has no size"),
        })
    }

    /// Every stored relation fork of a database (never an FSM fork).
    pub fn list_rels(&self, spcnode: Oid, dbnode: Oid, lsn: Lsn) -> Result<BTreeSet<RelTag>, DatadirError> {
        let dir = self
            .at(lsn)
            .rel_dir(spcnode, dbnode)?
            .ok_or_else(|| DatadirError::NotFound { what: format!("database {spcnode}/{dbnode}"), lsn })?;
        Ok(dir.into_iter().map(|e| RelTag { spcnode, dbnode, relnode: e.relnode, forknum: e.forknum }).collect())
    }

    /// Every database as (spcnode, dbnode), including (1664, 0): the shared catalogs.
    pub fn list_dbs(&self, lsn: Lsn) -> Result<BTreeSet<(Oid, Oid)>, DatadirError> {
        Ok(self.at(lsn).db_dir()?.into_iter().map(|d| (d.spcnode, d.dbnode)).collect())
    }

    /// The size of a database's stored relation forks in bytes (no FSM, no files other than
    /// relations), as `pg_database_size` would count them.
    pub fn get_db_size(&self, spcnode: Oid, dbnode: Oid, lsn: Lsn) -> Result<u64, DatadirError> {
        let mut blocks: u64 = 0;
        for rel in self.list_rels(spcnode, dbnode, lsn)? {
            blocks += u64::from(self.get_rel_size(rel, lsn)?);
        }
        Ok(blocks * PAGE_SIZE_BYTES as u64)
    }

    /// The block of a relation fork, rebuilt at `lsn`. The FSM's blocks are all zeros.
    pub fn get_rel_page(&self, rel: RelTag, blkno: BlockNumber, lsn: Lsn) -> Result<Bytes, DatadirError> {
        self.get_rel_page_with_cost(rel, blkno, lsn).map(|(page, _)| page)
    }

    /// `get_rel_page`, and what the read cost: the layers it searched and the records
    /// replayed on top of the newest image (for the page service's read amplification
    /// metrics).
    pub fn get_rel_page_with_cost(&self, rel: RelTag, blkno: BlockNumber, lsn: Lsn) -> Result<(Bytes, ReadCost), DatadirError> {
        if rel.forknum == ForkNumber::Fsm {
            return Ok((Bytes::from(vec![0u8; PAGE_SIZE_BYTES]), ReadCost::default()));
        }
        let key = Key::try_from(proto::KeyKind::RelBlock { rel, blkno })
            .map_err(|e| DatadirError::NotFound { what: format!("block {blkno} of {rel} ({e})"), lsn })?;
        let data = self.timeline.get_reconstruct_data(key, lsn)?;
        if data.is_empty() {
            return Err(DatadirError::NotFound { what: format!("block {blkno} of relation {rel}"), lsn });
        }
        let cost = ReadCost {
            layers_visited: data.layers_visited,
            records_replayed: data.records.len(),
            newest_record_lsn: data.records.last().map(|(l, _)| *l),
        };
        let page = self.reconstructor.reconstruct(key, lsn, data).map_err(|error| ReadError::Reconstruct { key, lsn, error })?;
        Ok((page, cost))
    }

    pub fn list_slru_segments(&self, slru: SlruKind, lsn: Lsn) -> Result<BTreeSet<u32>, DatadirError> {
        self.at(lsn).slru_dir(slru)
    }

    /// A whole SLRU segment file: its pages, concatenated.
    pub fn get_slru_segment(&self, slru: SlruKind, segno: u32, lsn: Lsn) -> Result<Bytes, DatadirError> {
        let snap = self.at(lsn);
        let pages = snap
            .slru_segment_size(slru, segno)?
            .ok_or_else(|| DatadirError::NotFound { what: format!("{slru} segment {segno:04X}"), lsn })?;
        let mut out = Vec::with_capacity(pages as usize * PAGE_SIZE_BYTES);
        for blkno in 0..pages {
            let key = Key::slru_block(slru, segno, BlockNumber(blkno));
            let page = snap.value(key)?.ok_or_else(|| DatadirError::Corrupt {
                key,
                lsn,
                reason: format!("page {blkno} of {slru} segment {segno:04X} ({pages} pages) is missing"),
            })?;
            out.extend_from_slice(&page);
        }
        Ok(Bytes::from(out))
    }

    /// A database's `pg_filenode.map` ((1664, 0) for `global/`).
    pub fn get_relmap(&self, spcnode: Oid, dbnode: Oid, lsn: Lsn) -> Result<Bytes, DatadirError> {
        self.at(lsn)
            .value(Key::relmap_file(spcnode, dbnode))?
            .ok_or_else(|| DatadirError::NotFound { what: format!("relation map of database {spcnode}/{dbnode}"), lsn })
    }

    pub fn list_twophase(&self, lsn: Lsn) -> Result<BTreeSet<u32>, DatadirError> {
        self.at(lsn).twophase_dir()
    }

    /// `pg_twophase/<xid>` of a prepared transaction.
    pub fn get_twophase_file(&self, xid: u32, lsn: Lsn) -> Result<Bytes, DatadirError> {
        let snap = self.at(lsn);
        let missing = || DatadirError::NotFound { what: format!("prepared transaction {xid}"), lsn };
        if !snap.twophase_dir()?.contains(&xid) {
            return Err(missing());
        }
        snap.value(Key::twophase_file(xid))?.ok_or_else(missing)
    }

    /// The latest checkpoint record at `lsn`: where it starts and what it says.
    pub fn get_checkpoint(&self, lsn: Lsn) -> Result<(Lsn, CheckPoint), DatadirError> {
        let stored = self.get_checkpoint_state(lsn)?;
        let start = stored.record_lsn;
        let corrupt = |reason: String| DatadirError::Corrupt { key: Key::checkpoint(), lsn, reason };
        let record = DecodedRecord::decode(start, stored.record).map_err(|e| corrupt(e.to_string()))?;
        match parse_metadata(&record).map_err(|e| corrupt(e.to_string()))? {
            Some(MetadataRecord::Checkpoint { checkpoint, .. }) => Ok((start, checkpoint)),
            _ => Err(corrupt(format!("the record at {start} is not a checkpoint"))),
        }
    }

    /// The checkpoint value at `lsn`: the latest checkpoint record, and in `current` the
    /// counters (next xid, OID, multixact, oldest xid ...) as of `lsn`, which is what a
    /// basebackup's `pg_control` needs.
    pub fn get_checkpoint_state(&self, lsn: Lsn) -> Result<StoredCheckpoint, DatadirError> {
        self.at(lsn).checkpoint()?.ok_or_else(|| DatadirError::NotFound { what: "checkpoint".into(), lsn })
    }

    /// `global/pg_control` as imported.
    pub fn get_control_file(&self, lsn: Lsn) -> Result<Bytes, DatadirError> {
        self.at(lsn).value(Key::control_file())?.ok_or_else(|| DatadirError::NotFound { what: "control file".into(), lsn })
    }

    /// The newest running-transactions record ending at or before `lsn` (on this timeline
    /// or, below the branch point, its ancestors); `None` if there is none.
    pub fn get_last_running_xacts(&self, lsn: Lsn) -> Result<Option<codec::StoredRunningXacts>, DatadirError> {
        self.at(lsn).decoded(Key::last_running_xacts(), codec::decode_running_xacts)
    }

    /// The last commit at or before `lsn`: the LSN it was stored at (the end of its commit
    /// record) and its timestamp, the greatest of any commit up to there (`TimestampTz`).
    /// `None` if no commit was ingested up to `lsn` (on this timeline or, below the branch
    /// point, its ancestors).
    pub fn get_last_commit(&self, lsn: Lsn) -> Result<Option<(Lsn, i64)>, DatadirError> {
        let key = Key::last_commit_timestamp();
        let data = self.timeline.get_reconstruct_data(key, lsn)?;
        let corrupt = |reason: String| DatadirError::Corrupt { key, lsn, reason };
        if let Some((rec_lsn, _)) = data.records.first() {
            return Err(corrupt(format!("a record at {rec_lsn}, where only whole values are stored")));
        }
        match data.image {
            None => Ok(None),
            Some((at, bytes)) => Ok(Some((at, codec::decode_commit_timestamp(&bytes).map_err(|e| corrupt(e.to_string()))?))),
        }
    }
}

/// What one page read cost: the layers searched (in-memory and files, across ancestors)
/// and the records replayed on top of the newest image; and the LSN of the newest record
/// replayed, if any, whose value the page is (what a fold may replace it with).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadCost {
    pub layers_visited: usize,
    pub records_replayed: usize,
    pub newest_record_lsn: Option<Lsn>,
}

/// The puts of one WAL record (or of an import), gathered so that reads during it see its
/// own earlier writes, then published together at `lsn`.
pub struct Modification<'t> {
    timeline: &'t Timeline,
    read_lsn: Lsn,
    lsn: Lsn,
    pending: BTreeMap<Key, Value>,
}

impl<'t> Modification<'t> {
    /// Starts the changes to be published at `lsn`; reads of unchanged keys see the
    /// timeline's last record LSN.
    pub fn new(timeline: &'t Timeline, lsn: Lsn) -> Modification<'t> {
        Modification { timeline, read_lsn: timeline.last_record_lsn(), lsn, pending: BTreeMap::new() }
    }

    pub fn lsn(&self) -> Lsn {
        self.lsn
    }

    pub fn timeline(&self) -> &'t Timeline {
        self.timeline
    }

    pub fn put_image(&mut self, key: Key, image: Bytes) {
        self.pending.insert(key, Value::Image(image));
    }

    /// Adds a record for `key`. On a value written earlier in this modification, a
    /// Rust-applied record is applied to it right away (one key holds one value per LSN);
    /// any other combination is refused.
    pub fn put_record(&mut self, key: Key, record: StoredRecord, will_init: bool) -> anyhow::Result<()> {
        match self.pending.get(&key) {
            None => {
                self.pending.insert(key, Value::Record { will_init, rec: record.encode() });
            }
            Some(Value::Image(img)) if !matches!(record, StoredRecord::Postgres(_)) => {
                let data = ReconstructData {
                    image: Some((self.lsn, img.clone())),
                    records: vec![(self.lsn, Record { will_init, rec: record.encode() })],
                    ..Default::default()
                };
                let page = PgReconstructor::rust_only().reconstruct(key, self.lsn, data)?;
                self.pending.insert(key, Value::Image(page));
            }
            Some(_) => anyhow::bail!("cannot store a second value for key {key} at LSN {}: {} record", self.lsn, record.name()),
        }
        Ok(())
    }

    pub fn put_db_dir(&mut self, dbs: &BTreeSet<DbEntry>) {
        self.put_image(Key::db_dir(), codec::encode_db_dir(dbs));
    }

    pub fn put_rel_dir(&mut self, spcnode: Oid, dbnode: Oid, rels: &BTreeSet<RelEntry>) {
        self.put_image(Key::rel_dir(spcnode, dbnode), codec::encode_rel_dir(rels));
    }

    pub fn put_rel_size(&mut self, rel: RelTag, blocks: u32) {
        self.put_image(Key::rel_size(rel), codec::encode_block_count(blocks));
    }

    pub fn put_slru_dir(&mut self, slru: SlruKind, segments: &BTreeSet<u32>) {
        self.put_image(Key::slru_dir(slru), codec::encode_slru_dir(segments));
    }

    pub fn put_slru_segment_size(&mut self, slru: SlruKind, segno: u32, pages: u32) {
        self.put_image(Key::slru_segment_size(slru, segno), codec::encode_block_count(pages));
    }

    pub fn put_twophase_dir(&mut self, xids: &BTreeSet<u32>) {
        self.put_image(Key::twophase_dir(), codec::encode_twophase_dir(xids));
    }

    /// `timestamp` is a `TimestampTz`; callers keep it from decreasing (see `walingest`).
    pub fn put_last_commit_timestamp(&mut self, timestamp: i64) {
        self.put_image(Key::last_commit_timestamp(), codec::encode_commit_timestamp(timestamp));
    }

    /// The running-transactions record that starts at `r.record_lsn` and ends at this
    /// modification's LSN.
    pub fn put_last_running_xacts(&mut self, r: &codec::StoredRunningXacts) {
        self.put_image(Key::last_running_xacts(), codec::encode_running_xacts(r));
    }

    /// How many values are waiting to be put.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Puts every value at `lsn`, in key order, then publishes `lsn`.
    pub fn commit(self) -> Result<(), WriteError> {
        for (key, value) in &self.pending {
            self.timeline.put(*key, self.lsn, value)?;
        }
        self.timeline.advance_last_record_lsn(self.lsn)
    }
}

impl ValueSource for Modification<'_> {
    fn read_lsn(&self) -> Lsn {
        self.read_lsn
    }

    fn value(&self, key: Key) -> Result<Option<Bytes>, DatadirError> {
        match self.pending.get(&key) {
            Some(Value::Image(img)) => Ok(Some(img.clone())),
            Some(Value::Record { .. }) => {
                Err(DatadirError::Corrupt { key, lsn: self.lsn, reason: "read of a value this modification holds only as a record".into() })
            }
            None => Snapshot { timeline: self.timeline, lsn: self.read_lsn }.value(key),
        }
    }
}

#[cfg(test)]
mod tests;
