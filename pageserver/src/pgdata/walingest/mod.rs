//! WAL ingest: decoded PostgreSQL records in, puts and published LSNs out.
//!
//! Every value a record produces is put at the record's **end LSN**: that is the LSN
//! PostgreSQL's redo stamps on the pages it changes, and a compute that read a page with
//! LSN X asks for it "at X", so a read at X must see every record ending at or before X.
//! After the record's values are in, `advance_last_record_lsn(end_lsn)` publishes them.
//!
//! For each block reference (`ingest_blocks`):
//! - an applied full-page image becomes `Value::Image` of the restored page, with `pd_lsn`
//!   set to the end LSN unless the page is new (all zeros), exactly what PostgreSQL's
//!   `XLogReadBufferForRedoExtended` produces;
//! - otherwise the whole record is stored for the block (`StoredRecord::Postgres`), with
//!   `will_init` from `BKPBLOCK_WILL_INIT`; the WAL redo process replays only that block;
//! - a block at or beyond the fork's end extends it, and blocks skipped over become zero
//!   pages (PostgreSQL's redo extends a relation with zeros the same way); a reference to
//!   a fork that does not exist creates it, as `XLogReadBufferExtended` does;
//! - free space map blocks are ignored (see `datadir`).
//!
//! Records that change more than their blocks are handled in `metadata.rs`; WAL files in
//! `files.rs`.
//!
//! Invariants: the relation size cache always equals the stored sizes as of the last
//! record, because this is the timeline's only writer. After any error the ingest refuses
//! further records: its cache may be ahead of the store, and the caller must start again
//! from the timeline's last record LSN with a new `WalIngest`.

mod counters;
mod files;
mod metadata;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use anyhow::{bail, Context};
use bytes::Bytes;
use pgwal::{parse_metadata, DecodedRecord, MetadataRecord, TransactionId};
use proto::page::PAGE_SIZE_BYTES;
use proto::{BlockNumber, ForkNumber, Key, KeyKind, Lsn, RelTag};

use crate::pgdata::datadir::codec::{encode_checkpoint, DbEntry, RelEntry, StoredCheckpoint, StoredRunningXacts};
use crate::pgdata::datadir::{Modification, ValueSource};
use crate::pgdata::reconstruct::StoredRecord;
pub use files::{wal_segment_file_name, WalFilesIngested};
use layerstore::timeline::Timeline;
use layerstore::value::Reconstructor;
use proto::page::{page_is_new, page_set_lsn};

/// What one `WalIngest` has done so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IngestStats {
    pub records: u64,
    /// Block references stored as page images (applied full-page images).
    pub images: u64,
    /// Block references stored as PostgreSQL records.
    pub block_records: u64,
    /// Records fjord applies itself (CLOG, multixact, visibility map; `StoredRecord`).
    pub rust_records: u64,
    /// Values put, all kinds.
    pub puts: u64,
}

/// Ingests the WAL of one timeline. See the module documentation.
pub struct WalIngest {
    timeline: Arc<Timeline>,
    /// Rebuilds relation pages that `CREATE DATABASE ... STRATEGY FILE_COPY` copies.
    reconstructor: Arc<dyn Reconstructor>,
    /// Sizes of the existing relation forks (never the FSM) that ingest has looked at.
    rel_sizes: HashMap<RelTag, u32>,
    /// The multixact offsets page that a `CREATE_ID` record zeroed because it did not exist
    /// yet; the `ZERO_OFF_PAGE` record for it that follows must not zero it again
    /// (`pre_initialized_offsets_page` in `multixact.c`).
    pre_initialized_offsets_page: Option<u32>,
    /// The stored checkpoint value as of the last record (`counters.rs`); loaded from the
    /// store on the first record, `Some(None)` if the timeline has none yet.
    checkpoint: Option<Option<StoredCheckpoint>>,
    failed: bool,
    stats: IngestStats,
    /// Where the last record ingested here starts and ends.
    last_record: Option<LastRecord>,
    /// The stored last commit timestamp as of the last record (`metadata.rs`); loaded from
    /// the store on the first commit, `Some(None)` if the timeline has none yet.
    last_commit_timestamp: Option<Option<i64>>,
    /// Where a replica's basebackup starts, by the newest running-transactions record
    /// ingested here (`standby_start_for`): the safekeepers must keep the WAL from there on.
    standby_start: Option<Lsn>,
    /// Transaction completions (commit or abort records) that a running-transactions record
    /// may yet race: the newest xid of each one's tree and where its record starts.
    completions: std::collections::VecDeque<(TransactionId, Lsn)>,
}

/// The most completions `WalIngest::completions` keeps: a running-transactions record
/// comes every 15 s, and the race it guards against lasts a commit's latency; older ones
/// are forgotten first.
const COMPLETIONS_KEPT: usize = 100_000;

/// Where a WAL record starts and ends: what a server started at `end` needs as its
/// previous-record pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LastRecord {
    pub start: Lsn,
    pub end: Lsn,
}

impl WalIngest {
    /// Ingest for `timeline`, continuing after its last record LSN (the import LSN for a
    /// freshly imported timeline).
    pub fn new(timeline: Arc<Timeline>, reconstructor: Arc<dyn Reconstructor>) -> WalIngest {
        WalIngest {
            timeline,
            reconstructor,
            rel_sizes: HashMap::new(),
            pre_initialized_offsets_page: None,
            checkpoint: None,
            failed: false,
            stats: IngestStats::default(),
            last_record: None,
            last_commit_timestamp: None,
            standby_start: None,
            completions: std::collections::VecDeque::new(),
        }
    }

    /// Where the newest running-transactions record ingested by this ingest starts (None
    /// before the first): see [`crate::pgdata::datadir::Datadir::get_last_running_xacts`]
    /// for the one stored before.
    pub fn standby_start(&self) -> Option<Lsn> {
        self.standby_start
    }

    pub fn timeline(&self) -> &Arc<Timeline> {
        &self.timeline
    }

    pub fn stats(&self) -> &IngestStats {
        &self.stats
    }

    /// The last record ingested by this `WalIngest`, if any.
    pub fn last_record(&self) -> Option<LastRecord> {
        self.last_record
    }

    /// Stores everything `record`, which ends at `end_lsn`, changes, then publishes
    /// `end_lsn`. Records must come in WAL order, each ending after the last record LSN.
    pub fn ingest_record(&mut self, record: &DecodedRecord, end_lsn: Lsn) -> anyhow::Result<()> {
        if self.failed {
            bail!("cannot ingest the record at {}: an earlier record failed, ingest must restart", record.lsn);
        }
        let result = self.ingest_record_inner(record, end_lsn);
        if result.is_err() {
            self.failed = true;
        }
        result.with_context(|| format!("ingest the WAL record at {} (ending at {end_lsn})", record.lsn))
    }

    fn ingest_record_inner(&mut self, record: &DecodedRecord, end_lsn: Lsn) -> anyhow::Result<()> {
        let last = self.timeline.last_record_lsn();
        if end_lsn <= last {
            bail!("record ends at {end_lsn}, not after the last record LSN {last}");
        }
        let timeline = Arc::clone(&self.timeline);
        let mut m = Modification::new(&timeline, end_lsn);
        self.ingest_blocks(&mut m, record, end_lsn)?;
        let meta = parse_metadata(record)?;
        self.track_counters(&mut m, record, meta.as_ref())?;
        if let Some(MetadataRecord::XactCompletion(c)) = &meta {
            let newest = c.subxacts.iter().fold(c.xid, |a, &x| if x.follows(a) { x } else { a });
            if self.completions.len() == COMPLETIONS_KEPT {
                self.completions.pop_front();
            }
            self.completions.push_back((newest, record.lsn));
        }
        if let Some(MetadataRecord::RunningXacts(r)) = &meta {
            // Stored here, where the record's start is known: a standby starts there.
            let start = self.standby_start_for(record.lsn, r.latest_completed_xid);
            m.put_last_running_xacts(&StoredRunningXacts {
                record_lsn: start,
                oldest_running_xid: r.oldest_running_xid.0,
                subxid_overflow: r.subxid_overflow,
            });
            self.standby_start = Some(start);
        }
        if let Some(meta) = meta {
            self.ingest_metadata(&mut m, meta)?;
        }
        self.stats.records += 1;
        self.stats.puts += m.len() as u64;
        m.commit()?;
        self.last_record = Some(LastRecord { start: record.lsn, end: end_lsn });
        self.timeline.maybe_freeze_and_flush()?;
        Ok(())
    }

    /// Where a hot standby starts replay, given a running-transactions record at `lsn` that
    /// says `latest_completed` is the newest completed transaction: the record itself, or
    /// the first completion record before it of a newer transaction.
    ///
    /// PostgreSQL writes a commit record, waits for it to be durable (here: acknowledged by
    /// the safekeepers, milliseconds) and only then takes the transaction out of the
    /// process array, where `LogStandbySnapshot` reads the running transactions and
    /// `latestCompletedXid`. A record taken in between lists the transaction as running and
    /// gives a `latestCompletedXid` below it, although its commit is already in the WAL. A
    /// standby that starts replay at that record learns of the commit from pg_xact (and
    /// drops the xid from its running set), but never replays the commit record, so its
    /// snapshots' xmax stays at or below the xid and its rows stay invisible until a newer
    /// transaction completes. Starting at the first such completion record replays it, which
    /// moves the standby's `latestCompletedXid` past it as on a primary.
    fn standby_start_for(&mut self, lsn: Lsn, latest_completed: TransactionId) -> Lsn {
        let raced = self.completions.iter().filter(|(xid, _)| xid.follows(latest_completed)).map(|&(_, at)| at).min();
        // Completions the record already counts never matter again; the raced ones may
        // still be ahead of the next record's count.
        self.completions.retain(|(xid, _)| xid.follows(latest_completed));
        raced.map_or(lsn, |at| at.min(lsn))
    }

    fn ingest_blocks(&mut self, m: &mut Modification<'_>, record: &DecodedRecord, end_lsn: Lsn) -> anyhow::Result<()> {
        // First extend every fork to its highest referenced block, so that the zero pages
        // of a gap never collide with a block this same record writes.
        let mut highest: BTreeMap<RelTag, u32> = BTreeMap::new();
        let mut referenced: BTreeSet<(RelTag, u32)> = BTreeSet::new();
        for blk in record.blocks.iter().filter(|b| b.rel.forknum != ForkNumber::Fsm) {
            Key::try_from(KeyKind::RelBlock { rel: blk.rel, blkno: blk.blkno })
                .with_context(|| format!("block reference {} names no relation block", blk.block_id))?;
            let h = highest.entry(blk.rel).or_insert(blk.blkno.0);
            *h = (*h).max(blk.blkno.0);
            referenced.insert((blk.rel, blk.blkno.0));
        }
        // The visibility map's size before this record: a map block at or past it did not
        // exist, and its redo starts from a zero page (below).
        let mut vm_sizes: BTreeMap<RelTag, u32> = BTreeMap::new();
        for &rel in highest.keys().filter(|r| r.forknum == ForkNumber::VisibilityMap) {
            let size = self.rel_size(m, rel)?.unwrap_or(0);
            vm_sizes.insert(rel, size);
        }
        for (rel, blkno) in highest {
            self.extend_rel(m, rel, blkno + 1, &referenced)?;
        }
        for blk in record.blocks.iter().filter(|b| b.rel.forknum != ForkNumber::Fsm) {
            let key = Key::rel_block(blk.rel, blk.blkno);
            if blk.image.as_ref().is_some_and(|i| i.apply()) {
                let mut page = record.restore_page(blk.block_id)?.to_vec();
                if !page_is_new(&page) {
                    page_set_lsn(&mut page, end_lsn);
                }
                m.put_image(key, Bytes::from(page));
                self.stats.images += 1;
            } else {
                // PostgreSQL extends the visibility map without WAL (`vm_extend`), and the
                // first record to set a bit on a new map page registers it with neither an
                // image nor `WILL_INIT`: redo reads a missing block as a zero page and
                // initializes it (`heap_xlog_visible`). With full-page writes on, an image
                // always came with it; without, the record itself must start from zeros.
                let new_vm_page = vm_sizes.get(&blk.rel).is_some_and(|&size| blk.blkno.0 >= size);
                m.put_record(key, StoredRecord::Postgres(record.raw.clone()), blk.will_init() || new_vm_page)?;
                self.stats.block_records += 1;
            }
        }
        Ok(())
    }

    /// Puts the checkpoint value if `record` changes the counters (`counters.rs`).
    fn track_counters(
        &mut self,
        m: &mut Modification<'_>,
        record: &DecodedRecord,
        meta: Option<&pgwal::MetadataRecord>,
    ) -> anyhow::Result<()> {
        let stored = match self.checkpoint.take() {
            Some(cached) => cached,
            None => m.checkpoint()?,
        };
        let updated = counters::apply(stored.as_ref(), record, meta);
        if let Some(new) = &updated {
            m.put_image(Key::checkpoint(), encode_checkpoint(new));
        }
        self.checkpoint = Some(updated.or(stored));
        Ok(())
    }

    /// The size of an existing fork, or `None` if it does not exist.
    fn rel_size(&mut self, m: &Modification<'_>, rel: RelTag) -> anyhow::Result<Option<u32>> {
        if let Some(&n) = self.rel_sizes.get(&rel) {
            return Ok(Some(n));
        }
        if !m.rel_listed(rel)? {
            return Ok(None);
        }
        let n = m.rel_size_raw(rel)?.with_context(|| format!("relation {rel} is listed but has no size"))?;
        self.rel_sizes.insert(rel, n);
        Ok(Some(n))
    }

    /// Creates `rel` with 0 blocks if it does not exist (and its database, if needed).
    fn create_rel(&mut self, m: &mut Modification<'_>, rel: RelTag) -> anyhow::Result<()> {
        debug_assert_ne!(rel.forknum, ForkNumber::Fsm, "the FSM is not stored");
        if self.rel_size(m, rel)?.is_some() {
            return Ok(());
        }
        let mut dir = match m.rel_dir(rel.spcnode, rel.dbnode)? {
            Some(dir) => dir,
            None => {
                self.create_db(m, rel.spcnode, rel.dbnode)?;
                BTreeSet::new()
            }
        };
        dir.insert(RelEntry { relnode: rel.relnode, forknum: rel.forknum });
        m.put_rel_dir(rel.spcnode, rel.dbnode, &dir);
        m.put_rel_size(rel, 0);
        self.rel_sizes.insert(rel, 0);
        Ok(())
    }

    /// Adds a database with an empty relation directory, replacing whatever a dropped
    /// database of the same oids left behind.
    fn create_db(&mut self, m: &mut Modification<'_>, spcnode: u32, dbnode: u32) -> anyhow::Result<()> {
        let mut dbs = m.db_dir()?;
        dbs.insert(DbEntry { spcnode, dbnode });
        m.put_db_dir(&dbs);
        m.put_rel_dir(spcnode, dbnode, &BTreeSet::new());
        self.rel_sizes.retain(|r, _| (r.spcnode, r.dbnode) != (spcnode, dbnode));
        Ok(())
    }

    /// Makes `rel` at least `blocks` long, creating it if needed; new blocks not in
    /// `skip` become zero pages.
    fn extend_rel(&mut self, m: &mut Modification<'_>, rel: RelTag, blocks: u32, skip: &BTreeSet<(RelTag, u32)>) -> anyhow::Result<()> {
        self.create_rel(m, rel)?;
        let size = self.rel_sizes[&rel];
        if blocks <= size {
            return Ok(());
        }
        let zero = Bytes::from(vec![0u8; PAGE_SIZE_BYTES]);
        for blkno in size..blocks {
            if !skip.contains(&(rel, blkno)) {
                m.put_image(Key::rel_block(rel, BlockNumber(blkno)), zero.clone());
            }
        }
        m.put_rel_size(rel, blocks);
        self.rel_sizes.insert(rel, blocks);
        Ok(())
    }

    /// Sets the size of an existing fork (truncation).
    fn set_rel_size(&mut self, m: &mut Modification<'_>, rel: RelTag, blocks: u32) {
        m.put_rel_size(rel, blocks);
        self.rel_sizes.insert(rel, blocks);
    }

    /// Removes every fork of a relation from its database's directory.
    fn drop_rel(&mut self, m: &mut Modification<'_>, rnode: pgwal::RelFileNode) -> anyhow::Result<()> {
        let Some(mut dir) = m.rel_dir(rnode.spcnode, rnode.dbnode)? else {
            return Ok(());
        };
        let before = dir.len();
        dir.retain(|e| e.relnode != rnode.relnode);
        if dir.len() != before {
            m.put_rel_dir(rnode.spcnode, rnode.dbnode, &dir);
        }
        for forknum in ForkNumber::ALL {
            self.rel_sizes.remove(&rnode.fork(forknum));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
