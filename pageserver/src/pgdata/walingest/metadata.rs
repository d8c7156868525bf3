//! Ingest of the records that change more than their blocks (`pgwal::MetadataRecord`):
//! which relations and databases exist and how long they are, transaction status (CLOG)
//! and the last commit timestamp, multixacts, the relation mapper, prepared transactions, the checkpoint, and
//! visibility-map bits that heap records clear without registering the map page.
//!
//! Each handler does what the record's PostgreSQL redo routine does to the files, in
//! terms of keys: `smgr_redo`, `dbase_redo`, `xact_redo`, `clog_redo`, `multixact_redo`,
//! `relmap_redo`, and the visibility-map side of `heap_xlog_*`. SLRU pages that redo would
//! read as zeros because they do not exist (`SlruPhysicalReadPage` in recovery) are created
//! as zero pages here too.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Context;
use bytes::Bytes;
use pgwal::parse::{
    visibility_map_location, DbaseCreate, DbaseCreateStrategy, MultiXactCreate, MultiXactTruncate, SmgrTruncate, VmBitsCleared,
    XactCompletion, XactKind,
};
use pgwal::MetadataRecord;
use proto::page::PAGE_SIZE_BYTES;
use proto::{BlockNumber, ForkNumber, Key, RelTag, SlruKind};

use super::WalIngest;
use crate::pgdata::datadir::codec::DbEntry;
use crate::pgdata::datadir::{Modification, ValueSource};
use crate::pgdata::reconstruct::layout::{self, page_init, SlruPage, XidStatus, SLRU_PAGES_PER_SEGMENT};
use crate::pgdata::reconstruct::StoredRecord;

/// `FirstNormalTransactionId`.
const FIRST_NORMAL_XID: u32 = 3;
/// `FirstMultiXactId`.
const FIRST_MULTIXACT_ID: u32 = 1;

impl WalIngest {
    pub(super) fn ingest_metadata(&mut self, m: &mut Modification<'_>, meta: MetadataRecord) -> anyhow::Result<()> {
        match meta {
            MetadataRecord::Checkpoint { .. }
            | MetadataRecord::NextOid(_)
            | MetadataRecord::Switch
            | MetadataRecord::VmBitsSet(_)
            | MetadataRecord::RunningXacts(_) => {
                // Nothing more to store: the checkpoint and the OID counter are in the
                // checkpoint value (`counters.rs`), a switch only ends a segment, and setting
                // visibility-map bits registers the map page. A running-transactions record
                // is stored by `ingest_record`, which knows where it starts.
            }
            MetadataRecord::XactCompletion(c) => self.xact_completion(m, c)?,
            MetadataRecord::XactPrepare(p) => {
                let mut xids = m.twophase_dir()?;
                xids.insert(p.xid.0);
                m.put_twophase_dir(&xids);
                m.put_image(Key::twophase_file(p.xid.0), Bytes::from(p.state_file()));
            }
            MetadataRecord::SmgrCreate(c) => {
                if c.rel.forknum != ForkNumber::Fsm {
                    self.create_rel(m, c.rel)?;
                }
            }
            MetadataRecord::SmgrTruncate(t) => self.smgr_truncate(m, t)?,
            MetadataRecord::DbaseCreate(c) => self.dbase_create(m, c)?,
            MetadataRecord::DbaseDrop(d) => {
                let mut dbs = m.db_dir()?;
                for &spcnode in &d.tablespace_ids {
                    dbs.remove(&DbEntry { spcnode, dbnode: d.db_id });
                    // An empty directory makes every relation of the database unreachable.
                    m.put_rel_dir(spcnode, d.db_id, &BTreeSet::new());
                    self.rel_sizes.retain(|r, _| (r.spcnode, r.dbnode) != (spcnode, d.db_id));
                }
                m.put_db_dir(&dbs);
            }
            MetadataRecord::ClogZeroPage { pageno } => self.zero_slru_page(m, SlruKind::Clog, SlruPage::from_pageno(pageno))?,
            MetadataRecord::ClogTruncate(t) => truncate_slru(m, SlruKind::Clog, t.pageno, clog_page_precedes)?,
            MetadataRecord::MultiXactZeroOffsetPage { pageno } => {
                if self.pre_initialized_offsets_page.take() != Some(pageno) {
                    self.zero_slru_page(m, SlruKind::MultiXactOffsets, SlruPage::from_pageno(pageno))?;
                }
            }
            MetadataRecord::MultiXactZeroMemberPage { pageno } => {
                self.zero_slru_page(m, SlruKind::MultiXactMembers, SlruPage::from_pageno(pageno))?
            }
            MetadataRecord::MultiXactCreate(c) => self.multixact_create(m, c)?,
            MetadataRecord::MultiXactTruncate(t) => multixact_truncate(m, t)?,
            MetadataRecord::RelmapUpdate(u) => m.put_image(Key::relmap_file(u.tablespace_id, u.db_id), u.data),
            MetadataRecord::VmBitsCleared(list) => self.vm_bits_cleared(m, &list)?,
        }
        Ok(())
    }

    fn xact_completion(&mut self, m: &mut Modification<'_>, c: XactCompletion) -> anyhow::Result<()> {
        if c.kind.is_commit() {
            self.put_commit_timestamp(m, c.xact_time)?;
        }
        let status = if c.kind.is_commit() { XidStatus::Committed } else { XidStatus::Aborted };
        // One record per CLOG page: the xid and its subtransactions may span pages.
        let mut pages: BTreeMap<SlruPage, Vec<u32>> = BTreeMap::new();
        let xids = std::iter::once(c.xid).chain(c.subxacts.iter().copied());
        for xid in xids.filter(|x| x.0 >= FIRST_NORMAL_XID) {
            pages.entry(layout::clog_page(xid.0)).or_default().push(xid.0);
        }
        for (page, xids) in pages {
            self.ensure_slru_page(m, SlruKind::Clog, page)?;
            let key = Key::slru_block(SlruKind::Clog, page.segno, page.blkno);
            self.put_rust_record(m, key, StoredRecord::ClogSetStatus { status, xids })?;
        }
        for rnode in &c.dropped_rels {
            self.drop_rel(m, *rnode)?;
        }
        if matches!(c.kind, XactKind::CommitPrepared | XactKind::AbortPrepared) {
            let mut xids = m.twophase_dir()?;
            if xids.remove(&c.xid.0) {
                m.put_twophase_dir(&xids);
            }
        }
        Ok(())
    }

    /// Stores the last commit timestamp at this commit's LSN: the greatest timestamp of any
    /// commit so far, so that it never decreases along the WAL (a backend takes its commit
    /// timestamp before it inserts the record, so two concurrent commits can reach the WAL
    /// in the other order). Every commit stores it, so the version's LSN is the end of the
    /// last commit record, which `lsn_for_timestamp` returns.
    fn put_commit_timestamp(&mut self, m: &mut Modification<'_>, xact_time: i64) -> anyhow::Result<()> {
        let stored = match self.last_commit_timestamp {
            Some(cached) => cached,
            None => m.last_commit_timestamp()?,
        };
        let timestamp = stored.map_or(xact_time, |s| s.max(xact_time));
        m.put_last_commit_timestamp(timestamp);
        self.last_commit_timestamp = Some(Some(timestamp));
        Ok(())
    }

    /// `smgr_redo` for `XLOG_SMGR_TRUNCATE`.
    fn smgr_truncate(&mut self, m: &mut Modification<'_>, t: SmgrTruncate) -> anyhow::Result<()> {
        let main = t.rnode.fork(ForkNumber::Main);
        // Redo creates the main fork if it is missing (it was dropped later in the WAL).
        self.create_rel(m, main)?;
        if t.truncates(ForkNumber::Main) && self.rel_sizes[&main] > t.blkno.0 {
            self.set_rel_size(m, main, t.blkno.0);
        }
        let vm = t.rnode.fork(ForkNumber::VisibilityMap);
        if t.truncates(ForkNumber::VisibilityMap) {
            if let Some(vm_size) = self.rel_size(m, vm)? {
                // visibilitymap_prepare_truncate: clear the tail of the last remaining map
                // page, then cut the fork after it.
                let loc = visibility_map_location(t.blkno);
                let mut new_size = loc.vm_blkno.0;
                let partial = !t.blkno.0.is_multiple_of(pgwal::consts::VM_HEAPBLOCKS_PER_PAGE);
                if partial && loc.vm_blkno.0 < vm_size {
                    let key = Key::rel_block(vm, loc.vm_blkno);
                    self.put_rust_record(m, key, StoredRecord::VmTruncate { heap_blocks: t.blkno })?;
                    new_size += 1;
                }
                if (!partial || loc.vm_blkno.0 < vm_size) && vm_size > new_size {
                    self.set_rel_size(m, vm, new_size);
                }
            }
        }
        Ok(())
    }

    /// `dbase_redo` for both `CREATE DATABASE` strategies.
    fn dbase_create(&mut self, m: &mut Modification<'_>, c: DbaseCreate) -> anyhow::Result<()> {
        let (spc, db) = (c.tablespace_id, c.db_id);
        self.create_db(m, spc, db)?;
        let DbaseCreateStrategy::FileCopy { src_db_id, src_tablespace_id } = c.strategy else {
            // WAL_LOG: the relations, their blocks and the relation map follow in WAL.
            return Ok(());
        };
        // FILE_COPY: PostgreSQL copies the template's files; copy every key of every
        // relation as of the previous record, and the relation map.
        let src_dir = m
            .rel_dir(src_tablespace_id, src_db_id)?
            .with_context(|| format!("template database {src_tablespace_id}/{src_db_id} of database {spc}/{db} does not exist"))?;
        let read_lsn = m.read_lsn();
        let timeline = m.timeline();
        for entry in &src_dir {
            let src = RelTag { spcnode: src_tablespace_id, dbnode: src_db_id, relnode: entry.relnode, forknum: entry.forknum };
            let dst = RelTag { spcnode: spc, dbnode: db, ..src };
            let size = self.rel_size(m, src)?.with_context(|| format!("relation {src} is listed but has no size"))?;
            for blkno in 0..size {
                let page = timeline
                    .get(Key::rel_block(src, BlockNumber(blkno)), read_lsn, self.reconstructor.as_ref())?
                    .with_context(|| format!("block {blkno} of {src} ({size} blocks) has no value at {read_lsn}"))?;
                m.put_image(Key::rel_block(dst, BlockNumber(blkno)), page);
            }
            m.put_rel_size(dst, size);
            self.rel_sizes.insert(dst, size);
        }
        m.put_rel_dir(spc, db, &src_dir);
        if let Some(map) = m.value(Key::relmap_file(src_tablespace_id, src_db_id))? {
            m.put_image(Key::relmap_file(spc, db), map);
        }
        Ok(())
    }

    /// The `MultiXactCreate` side of `RecordNewMultiXact`: this multixact's offset, its
    /// successor's offset (PostgreSQL 15.15 and later write both), and the members.
    fn multixact_create(&mut self, m: &mut Modification<'_>, c: MultiXactCreate) -> anyhow::Result<()> {
        self.pre_initialized_offsets_page = None;
        let mid = c.mid.0;
        let mut next = mid.wrapping_add(1);
        if next < FIRST_MULTIXACT_ID {
            next = FIRST_MULTIXACT_ID;
        }
        let nmembers = u32::try_from(c.members.len()).context("multixact member count")?;
        let mut next_offset = c.moff.0.wrapping_add(nmembers);
        if next_offset == 0 {
            next_offset = 1;
        }
        let (page, next_page) = (layout::multixact_offsets_page(mid), layout::multixact_offsets_page(next));
        if next_page != page && !self.slru_page_exists(m, SlruKind::MultiXactOffsets, next_page)? {
            // WAL of older minor versions zeroes the successor's page only later.
            self.zero_slru_page(m, SlruKind::MultiXactOffsets, next_page)?;
            self.pre_initialized_offsets_page = Some(next_page.pageno());
        }
        let mut offsets: BTreeMap<SlruPage, Vec<(u32, u32)>> = BTreeMap::new();
        offsets.entry(page).or_default().push((mid, c.moff.0));
        offsets.entry(next_page).or_default().push((next, next_offset));
        for (page, entries) in offsets {
            self.ensure_slru_page(m, SlruKind::MultiXactOffsets, page)?;
            let key = Key::slru_block(SlruKind::MultiXactOffsets, page.segno, page.blkno);
            self.put_rust_record(m, key, StoredRecord::MultiXactOffsets { entries })?;
        }
        let mut members: BTreeMap<SlruPage, Vec<(u32, u32, u8)>> = BTreeMap::new();
        for (i, member) in c.members.iter().enumerate() {
            let offset = c.moff.0.wrapping_add(i as u32);
            members.entry(layout::multixact_members_page(offset)).or_default().push((offset, member.xid.0, member.status as u8));
        }
        for (page, members) in members {
            self.ensure_slru_page(m, SlruKind::MultiXactMembers, page)?;
            let key = Key::slru_block(SlruKind::MultiXactMembers, page.segno, page.blkno);
            self.put_rust_record(m, key, StoredRecord::MultiXactMembers { members })?;
        }
        Ok(())
    }

    /// The visibility-map side of heap records: one `VmClear` per map page.
    fn vm_bits_cleared(&mut self, m: &mut Modification<'_>, list: &[VmBitsCleared]) -> anyhow::Result<()> {
        let mut pages: BTreeMap<(RelTag, BlockNumber), Vec<(BlockNumber, u8)>> = BTreeMap::new();
        for c in list {
            let vm = RelTag { forknum: ForkNumber::VisibilityMap, ..c.rel };
            pages.entry((vm, c.location().vm_blkno)).or_default().push((c.heap_blkno, c.bits));
        }
        for ((vm, vm_blkno), blocks) in pages {
            let size = self.rel_size(m, vm)?.unwrap_or(0);
            if vm_blkno.0 >= size {
                // visibilitymap_pin extends the map with zero pages and initializes the one
                // it reads; there are no bits to clear on it.
                let gap: BTreeSet<(RelTag, u32)> = [(vm, vm_blkno.0)].into();
                self.extend_rel(m, vm, vm_blkno.0 + 1, &gap)?;
                m.put_image(Key::rel_block(vm, vm_blkno), Bytes::from(page_init()));
                continue;
            }
            self.put_rust_record(m, Key::rel_block(vm, vm_blkno), StoredRecord::VmClear { blocks })?;
        }
        Ok(())
    }

    /// Stores a record that fjord applies itself.
    fn put_rust_record(&mut self, m: &mut Modification<'_>, key: Key, record: StoredRecord) -> anyhow::Result<()> {
        self.stats.rust_records += 1;
        // None of them builds a value from nothing: each edits an existing page.
        m.put_record(key, record, false)
    }

    fn slru_page_exists(&self, m: &Modification<'_>, slru: SlruKind, page: SlruPage) -> anyhow::Result<bool> {
        Ok(m.slru_segment_size(slru, page.segno)?.is_some_and(|pages| page.blkno.0 < pages))
    }

    /// Creates an SLRU page as zeros if it does not exist, as recovery reads a missing page.
    fn ensure_slru_page(&mut self, m: &mut Modification<'_>, slru: SlruKind, page: SlruPage) -> anyhow::Result<()> {
        if !self.slru_page_exists(m, slru, page)? {
            self.zero_slru_page(m, slru, page)?;
        }
        Ok(())
    }

    /// `SimpleLruZeroPage` and write: the page becomes zeros, the segment (created if
    /// needed) grows to include it, and pages skipped over become zeros as in a file.
    fn zero_slru_page(&mut self, m: &mut Modification<'_>, slru: SlruKind, page: SlruPage) -> anyhow::Result<()> {
        let mut segments = m.slru_dir(slru)?;
        let size = if segments.contains(&page.segno) {
            m.slru_segment_size(slru, page.segno)?.with_context(|| format!("{slru} segment {:04X} has no size", page.segno))?
        } else {
            segments.insert(page.segno);
            m.put_slru_dir(slru, &segments);
            0
        };
        let zero = Bytes::from(vec![0u8; PAGE_SIZE_BYTES]);
        for blkno in size..page.blkno.0 {
            m.put_image(Key::slru_block(slru, page.segno, BlockNumber(blkno)), zero.clone());
        }
        m.put_image(Key::slru_block(slru, page.segno, page.blkno), zero);
        if page.blkno.0 >= size {
            m.put_slru_segment_size(slru, page.segno, page.blkno.0 + 1);
        }
        Ok(())
    }
}

/// `SimpleLruTruncate`: removes the segments wholly before `cutoff_page`'s segment
/// (`SlruMayDeleteSegment`), using the SLRU's wraparound-aware page order.
fn truncate_slru(m: &mut Modification<'_>, slru: SlruKind, cutoff_page: u32, precedes: fn(u32, u32) -> bool) -> anyhow::Result<()> {
    let cutoff = cutoff_page - cutoff_page % SLRU_PAGES_PER_SEGMENT;
    let mut segments = m.slru_dir(slru)?;
    let removed: Vec<u32> = segments
        .iter()
        .copied()
        .filter(|&segno| {
            let first = segno.wrapping_mul(SLRU_PAGES_PER_SEGMENT);
            let last = first.wrapping_add(SLRU_PAGES_PER_SEGMENT - 1);
            precedes(first, cutoff) && precedes(last, cutoff)
        })
        .collect();
    if !removed.is_empty() {
        for segno in &removed {
            segments.remove(segno);
            // An empty size, not just a missing directory entry: after wraparound the same
            // segment number comes back, and its pages must start as zeros, not as the
            // pages of 2^32 transactions ago.
            m.put_slru_segment_size(slru, *segno, 0);
        }
        m.put_slru_dir(slru, &segments);
    }
    Ok(())
}

/// `TransactionIdPrecedes` (and `MultiXactIdPrecedes` for normal ids): modulo-2^32 order.
fn id_precedes(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// `CLOGPagePrecedes`.
fn clog_page_precedes(page1: u32, page2: u32) -> bool {
    let xid = |page: u32| page.wrapping_mul(layout::CLOG_XACTS_PER_PAGE).wrapping_add(FIRST_NORMAL_XID + 1);
    let (x1, x2) = (xid(page1), xid(page2));
    let precedes = |a: u32, b: u32| if a < FIRST_NORMAL_XID || b < FIRST_NORMAL_XID { a < b } else { id_precedes(a, b) };
    precedes(x1, x2) && precedes(x1, x2.wrapping_add(layout::CLOG_XACTS_PER_PAGE - 1))
}

/// `MultiXactOffsetPagePrecedes`.
fn multixact_offset_page_precedes(page1: u32, page2: u32) -> bool {
    let multi = |page: u32| page.wrapping_mul(layout::MULTIXACT_OFFSETS_PER_PAGE).wrapping_add(FIRST_MULTIXACT_ID + 1);
    let (m1, m2) = (multi(page1), multi(page2));
    id_precedes(m1, m2) && id_precedes(m1, m2.wrapping_add(layout::MULTIXACT_OFFSETS_PER_PAGE - 1))
}

/// `multixact_redo` for `XLOG_MULTIXACT_TRUNCATE_ID`: `PerformMembersTruncation` and
/// `PerformOffsetsTruncation`.
fn multixact_truncate(m: &mut Modification<'_>, t: MultiXactTruncate) -> anyhow::Result<()> {
    let member_segment = |offset: u32| layout::multixact_members_page(offset).segno;
    let max_segment = member_segment(u32::MAX);
    let end = member_segment(t.end_trunc_memb.0);
    let mut segno = member_segment(t.start_trunc_memb.0);
    let mut segments = m.slru_dir(SlruKind::MultiXactMembers)?;
    let before = segments.len();
    while segno != end {
        segments.remove(&segno);
        segno = if segno == max_segment { 0 } else { segno + 1 };
    }
    if segments.len() != before {
        m.put_slru_dir(SlruKind::MultiXactMembers, &segments);
    }
    let previous = if t.end_trunc_off.0 == FIRST_MULTIXACT_ID { u32::MAX } else { t.end_trunc_off.0.wrapping_sub(1) };
    truncate_slru(m, SlruKind::MultiXactOffsets, layout::multixact_offsets_page(previous).pageno(), multixact_offset_page_precedes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_order_follows_postgres() {
        assert!(clog_page_precedes(0, 1));
        assert!(!clog_page_precedes(1, 0));
        assert!(!clog_page_precedes(5, 5));
        // Half the page space ahead wraps around to "before".
        assert!(clog_page_precedes(0, 65535));
        assert!(!clog_page_precedes(0, 65537));
        assert!(multixact_offset_page_precedes(3, 64));
        assert!(!multixact_offset_page_precedes(64, 3));
    }
}
