//! Which relation blocks may have changed between two LSNs, in PostgreSQL's terms: what a
//! compute's local file cache must drop at a restart.
//!
//! A compute that cached pages as of LSNs `d` (each page equal to its version at `d` on the
//! timeline) and starts again at `to` asks once, with `from` the lowest `d`, and drops
//! every cached page the answer covers with an LSN above the page's `d`. The answer must
//! never miss a page whose content differs between its `d` and `to`; it may list more.
//!
//! The engine's `changed_keys` gives every key of the database part of the key space (the
//! database directory, and each database's relation directory, relation map, sizes and
//! blocks) with a version in `from+1..=to` and its newest LSN there. Whatever ingest wrote
//! for a change is such a version (`walingest`): block references (records and full-page
//! images, whatever the resource manager), visibility-map bits cleared by heap records (a
//! record on the map block's key), the zero pages of an extension, the tail of the map
//! cleared by a truncation, and every block `CREATE DATABASE ... FILE_COPY` copies. What
//! changes blocks without writing their keys is a change of existence, and that writes a
//! size or a directory:
//!
//! - **A relation block key**: the block, with its newest change (`BlockChange`).
//! - **A relation size key** (a fork created, extended or truncated, by `XLOG_SMGR_CREATE`,
//!   an extension, `XLOG_SMGR_TRUNCATE` or a `FILE_COPY`): the fork with its size at `to`
//!   (`RelationChange`). Blocks at or beyond that size no longer exist; a block below it
//!   that changed has its own entry, since a block that is truncated away and written
//!   again gets a new version when the fork is extended again. A client may drop the
//!   whole fork instead, or just the blocks at or beyond the size.
//! - **A relation directory key** (relations created, or dropped at commit or abort by
//!   `xl_xact_*`'s dropped relfilenodes, or a database emptied by `DROP DATABASE`): the
//!   forks listed at `from` and not at `to` are gone (`RelationChange` with no size), and
//!   so is any fork whose size changed in the range but that is not listed at `to`. Their
//!   LSN is the directory's newest change, which is at or after the drop. A fork dropped
//!   and created again has a new size, so it is listed with that size.
//! - **The database directory key** (`CREATE DATABASE`, `DROP DATABASE`): the databases
//!   listed at `from` and not at `to` are gone (`DatabaseDrop`), with the directory's
//!   newest LSN; nothing else of theirs is listed. A database dropped and created again is
//!   listed in both, and its relations follow the rules above (its relation directory and
//!   every relation of the new one were written).
//! - A relation map (`pg_filenode.map`) names which file a mapped catalog uses; the files
//!   themselves are relations with keys of their own, and a cache is keyed by file, so a map
//!   change needs nothing more. SLRUs, two-phase state, the checkpoint and the control file
//!   are not relation pages and are not asked for.
//!
//! The free space map is never listed: it is not stored (not WAL-logged), and computes keep
//! it locally. Unlogged relations' main forks are not stored either; their init forks are.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};

use layerstore::timeline::Timeline;
use layerstore::{ChangedKeysError, ReadError};
use proto::{BlockNumber, Key, KeyKind, KeyRange, Lsn, Oid, RelTag, SlruKind};

use crate::pgdata::datadir::{codec, Datadir, DatadirError};
use crate::pgdata::reconstruct::PgReconstructor;

/// A block whose content changed; `lsn` is its newest change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockChange {
    pub rel: RelTag,
    pub blkno: BlockNumber,
    pub lsn: Lsn,
}

/// A relation fork that was created, extended, truncated or dropped. `nblocks` is its size
/// at `to`, `None` if it does not exist there; every cached block at or beyond it is stale.
/// `lsn` is at or after the last such change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RelationChange {
    pub rel: RelTag,
    pub nblocks: Option<u32>,
    pub lsn: Lsn,
}

/// A database that existed at `from` and does not at `to`; `lsn` is at or after its drop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DatabaseDrop {
    pub spcnode: Oid,
    pub dbnode: Oid,
    pub lsn: Lsn,
}

/// What changed between `from` and `to`, each list in key order. See the module doc.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChangedBlocks {
    pub from: Lsn,
    pub to: Lsn,
    pub blocks: Vec<BlockChange>,
    pub relations: Vec<RelationChange>,
    pub databases: Vec<DatabaseDrop>,
}

/// Why `changed_blocks` gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum ChangesError {
    /// The engine refused (bad range, history gone, too many changes) or failed.
    #[error(transparent)]
    Keys(#[from] ChangedKeysError),
    /// A directory could not be read at `from` or `to`.
    #[error(transparent)]
    Datadir(#[from] DatadirError),
}

impl ChangesError {
    /// Whether the history the answer needs is gone (below the GC horizon or before the
    /// branch point): permanent, unlike a failure.
    pub fn is_history_gone(&self) -> bool {
        matches!(
            self,
            ChangesError::Keys(ChangedKeysError::BelowGcHorizon { .. } | ChangedKeysError::BeforeBranchPoint { .. })
                | ChangesError::Datadir(DatadirError::Read(ReadError::BelowGcHorizon { .. }))
        )
    }
}

/// The part of the key space that holds databases: the database directory, then every
/// database's keys, up to the first SLRU key.
pub fn database_key_range() -> KeyRange {
    KeyRange { start: Key::db_dir(), end: Key::slru_dir(SlruKind::Clog) }
}

/// What may have changed between `from` and `to` (published LSNs), refused if more than
/// `limit` keys of the databases changed (`ChangedKeysError::TooManyChanges`). See the
/// module doc for what is listed and why it is enough.
pub fn changed_blocks(timeline: &Timeline, from: Lsn, to: Lsn, limit: usize) -> Result<ChangedBlocks, ChangesError> {
    let keys = timeline.changed_keys(&database_key_range(), from, to, limit)?;
    let rust_only = PgReconstructor::rust_only();
    let datadir = Datadir::new(timeline, &rust_only);

    let mut db_dir_lsn = None;
    let mut rel_dir_lsns: BTreeMap<(Oid, Oid), Lsn> = BTreeMap::new();
    let mut size_lsns: BTreeMap<RelTag, Lsn> = BTreeMap::new();
    let mut blocks = Vec::new();
    for (key, lsn) in keys {
        match key.kind() {
            KeyKind::DbDir => db_dir_lsn = Some(lsn),
            KeyKind::RelDir { spcnode, dbnode } => {
                rel_dir_lsns.insert((spcnode, dbnode), lsn);
            }
            KeyKind::RelSize { rel } => {
                size_lsns.insert(rel, lsn);
            }
            KeyKind::RelBlock { rel, blkno } => blocks.push(BlockChange { rel, blkno, lsn }),
            // A map names files; the files change through their own keys (module doc).
            KeyKind::RelMapFile { .. } => {}
            // Outside the range asked for.
            KeyKind::SlruDir { .. }
            | KeyKind::SlruBlock { .. }
            | KeyKind::SlruSegmentSize { .. }
            | KeyKind::TwoPhaseDir
            | KeyKind::TwoPhaseFile { .. }
            | KeyKind::Checkpoint
            | KeyKind::ControlFile
            | KeyKind::LastCommitTimestamp
            | KeyKind::LastRunningXacts
            | KeyKind::Max => {}
        }
    }

    let mut databases: BTreeMap<(Oid, Oid), Lsn> = BTreeMap::new();
    if let Some(lsn) = db_dir_lsn {
        let after = datadir.list_dbs(to)?;
        for db in datadir.list_dbs(from)?.difference(&after) {
            databases.insert(*db, lsn);
        }
    }
    let in_dropped_db = |rel: &RelTag| databases.contains_key(&(rel.spcnode, rel.dbnode));

    // Each database's relations at `to`, read once however many of its forks changed.
    let mut rels_at_to: BTreeMap<(Oid, Oid), BTreeSet<RelTag>> = BTreeMap::new();
    let mut relations: BTreeMap<RelTag, (Option<u32>, Lsn)> = BTreeMap::new();
    for (&(spcnode, dbnode), &lsn) in rel_dir_lsns.iter().filter(|(db, _)| !databases.contains_key(db)) {
        let after = rels_cached(&mut rels_at_to, &datadir, spcnode, dbnode, to)?;
        for rel in rels_of(&datadir, spcnode, dbnode, from)?.difference(after) {
            relations.insert(*rel, (None, lsn));
        }
    }
    for (rel, lsn) in size_lsns.into_iter().filter(|(rel, _)| !in_dropped_db(rel)) {
        if rels_cached(&mut rels_at_to, &datadir, rel.spcnode, rel.dbnode, to)?.contains(&rel) {
            relations.insert(rel, (Some(rel_size(timeline, &rust_only, rel, to)?), lsn));
        } else {
            // Created (or extended) and dropped in the range. The drop rewrote the
            // relation directory, so its newest LSN is at or after the drop; `to` if it
            // is somehow missing, which covers every cached copy but those as of `to`.
            let dropped_at = rel_dir_lsns.get(&(rel.spcnode, rel.dbnode)).copied().unwrap_or(to).max(lsn);
            let entry = relations.entry(rel).or_insert((None, dropped_at));
            entry.1 = entry.1.max(dropped_at);
        }
    }
    blocks.retain(|b| !in_dropped_db(&b.rel) && !matches!(relations.get(&b.rel), Some((None, _))));

    Ok(ChangedBlocks {
        from,
        to,
        blocks,
        relations: relations.into_iter().map(|(rel, (nblocks, lsn))| RelationChange { rel, nblocks, lsn }).collect(),
        databases: databases.into_iter().map(|((spcnode, dbnode), lsn)| DatabaseDrop { spcnode, dbnode, lsn }).collect(),
    })
}

/// `rels_of` through a cache of databases already read at `lsn`.
fn rels_cached<'c>(
    cache: &'c mut BTreeMap<(Oid, Oid), BTreeSet<RelTag>>,
    datadir: &Datadir<'_>,
    spcnode: Oid,
    dbnode: Oid,
    lsn: Lsn,
) -> Result<&'c BTreeSet<RelTag>, DatadirError> {
    match cache.entry((spcnode, dbnode)) {
        Entry::Occupied(e) => Ok(e.into_mut()),
        Entry::Vacant(e) => Ok(e.insert(rels_of(datadir, spcnode, dbnode, lsn)?)),
    }
}

/// The stored size of a fork its directory lists at `lsn` (which `Datadir::get_rel_size`
/// would check again, reading the directory once per fork).
fn rel_size(timeline: &Timeline, rust_only: &PgReconstructor, rel: RelTag, lsn: Lsn) -> Result<u32, DatadirError> {
    let key = Key::rel_size(rel);
    let corrupt = |reason: String| DatadirError::Corrupt { key, lsn, reason };
    let bytes = timeline.get(key, lsn, rust_only)?.ok_or_else(|| corrupt(format!("relation {rel} is listed but has no size")))?;
    codec::decode_block_count(&bytes).map_err(|e| corrupt(e.to_string()))
}

/// The relation forks of a database at `lsn`; none if the database has no relation
/// directory there (it did not exist yet).
fn rels_of(datadir: &Datadir<'_>, spcnode: Oid, dbnode: Oid, lsn: Lsn) -> Result<BTreeSet<RelTag>, DatadirError> {
    match datadir.list_rels(spcnode, dbnode, lsn) {
        Err(DatadirError::NotFound { .. }) => Ok(BTreeSet::new()),
        other => other,
    }
}

#[cfg(test)]
mod tests;
