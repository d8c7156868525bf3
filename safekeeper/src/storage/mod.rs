//! A timeline's durable state: the control file ([`control`]) and the WAL ([`wal`]), in
//! `<data_dir>/<tenant_id>/<timeline_id>/`.
//!
//! [`TimelineStorage`] carries out the acceptor's [`quorum::Persist`] actions:
//! - `Persist::Control` replaces the control file atomically before returning (durable).
//! - `Persist::Append` writes the bytes into their segments; they become durable at the next
//!   [`TimelineStorage::sync`] (with the boundary LSN it carries, in `wal.end`'s journal),
//!   which the caller runs before it replies to anything — once per batch of messages
//!   (group commit).
//! - `Persist::Truncate { at }` syncs pending appends, then moves the end (inside the WAL) or
//!   empties the WAL to begin at `at` (outside it), durably, before returning.
//!
//! The commit LSN, the peer horizon and the pageserver's remote-consistent LSN reach the
//! control file lazily ([`TimelineStorage::persist_lazy`]): losing them in a crash only makes
//! this safekeeper serve less WAL, or remove less, until it is told again.
//!
//! WAL removal ([`TimelineStorage::remove_wal`], the rule in [`removal`]) uses only the values
//! in the control file, so WAL is never removed on the strength of something a crash could
//! take back.
//!
//! Reads: [`TimelineStorage::read_wal`] returns bytes as stored;
//! [`TimelineStorage::read_wal_verified`] also checks the header of every WAL page the range
//! touches (magic, page address, timeline, and for a segment's first page the system id and
//! segment size) with `pgwal`, and names the segment file and LSN of a bad one.

pub mod control;
pub mod extent;
mod journal_io;
pub mod removal;
pub mod sync_stats;
pub mod wal;

use anyhow::{bail, Context};
use bytes::Bytes;
use proto::{Lsn, TenantId, TimelineId};
use quorum::{AcceptorState, Persist, TermHistory};
use std::path::{Path, PathBuf};

use control::{write_atomic, ControlFile, CONTROL_FILE_NAME};
use extent::WalExtent;
use pgwal::consts::{SIZE_OF_XLOG_LONG_PHD, SIZE_OF_XLOG_SHORT_PHD};
pub use removal::RemovalInputs;
pub use sync_stats::SyncStats;
use wal::{segment_file_name, WalStore, PG_TIMELINE};

/// A timeline's control file and WAL. The timeline's lock serialises access.
pub struct TimelineStorage {
    dir: PathBuf,
    control: ControlFile,
    wal: WalStore,
}

impl TimelineStorage {
    /// Creates the files of a new timeline in `dir` (which must not exist): built in a
    /// temporary sibling directory and renamed into place, so a crash never leaves half a
    /// timeline under its real name.
    pub fn create(
        dir: &Path,
        tenant: TenantId,
        timeline: TimelineId,
        system_id: u64,
        wal_segment_size: u32,
        learner: bool,
    ) -> anyhow::Result<TimelineStorage> {
        let parent = dir.parent().context("timeline directory has no parent")?;
        std::fs::create_dir_all(parent).with_context(|| format!("create {}", parent.display()))?;
        let tmp = parent.join(format!(".{timeline}.creating"));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).with_context(|| format!("remove {}", tmp.display()))?;
        }
        std::fs::create_dir(&tmp).with_context(|| format!("create {}", tmp.display()))?;
        let control = ControlFile {
            tenant,
            timeline,
            system_id,
            wal_segment_size,
            term: 0,
            history: TermHistory::default(),
            commit_lsn: Lsn(0),
            wal_begin: Lsn(0),
            peer_horizon_lsn: Lsn(0),
            remote_consistent_lsn: Lsn(0),
            remote_consistent_generation: 0,
            learner,
        };
        write_atomic(&tmp, CONTROL_FILE_NAME, &control.encode())?;
        WalStore::create(&tmp)?;
        control::fsync_dir(&tmp)?;
        crashsafe::durable_rename(&tmp, dir).with_context(|| format!("rename {} to {}", tmp.display(), dir.display()))?;
        // The tenant directory may be new too.
        if let Some(data_dir) = parent.parent() {
            control::fsync_dir(data_dir)?;
        }
        Self::open(dir)
    }

    /// Opens an existing timeline. Errors (a corrupt control file, a missing segment) are
    /// reported by the caller as the timeline being unusable; nothing is rewritten here.
    pub fn open(dir: &Path) -> anyhow::Result<TimelineStorage> {
        let path = dir.join(CONTROL_FILE_NAME);
        let bytes = std::fs::read(&path).with_context(|| format!("read {}", path.display()))?;
        let control = ControlFile::decode(&bytes).with_context(|| format!("{} is corrupt", path.display()))?;
        let wal = WalStore::open(dir, u64::from(control.wal_segment_size))?;
        let extent = wal.extent();
        if control.commit_lsn > extent.end {
            bail!("control file's commit LSN {} is beyond the end of WAL {}", control.commit_lsn, extent.end);
        }
        if control.commit_lsn > wal.boundary() {
            bail!("control file's commit LSN {} is beyond the last whole WAL record, which ends at {}", control.commit_lsn, wal.boundary());
        }
        Ok(TimelineStorage { dir: dir.to_path_buf(), control, wal })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn control(&self) -> &ControlFile {
        &self.control
    }

    pub fn wal_extent(&self) -> WalExtent {
        self.wal.extent()
    }

    /// The acceptor's durable state as on disk.
    pub fn acceptor_state(&self) -> AcceptorState {
        AcceptorState {
            term: self.control.term,
            history: self.control.history.clone(),
            commit_lsn: self.control.commit_lsn,
            flush_lsn: self.wal.extent().end,
            boundary_lsn: self.wal.boundary(),
            peer_horizon_lsn: self.control.peer_horizon_lsn,
            learner: self.control.learner,
            log_begin: self.wal.extent().begin,
        }
    }

    /// Carries out one `Persist` action; see the module docs for what is durable when.
    pub fn persist(&mut self, p: &Persist, stats: &mut SyncStats) -> anyhow::Result<()> {
        match p {
            Persist::Control { term, history, commit_lsn, learner } => {
                self.sync(stats)?;
                let mut c = self.control.clone();
                c.term = *term;
                c.history = history.clone();
                c.commit_lsn = *commit_lsn;
                c.learner = *learner;
                self.write_control(c, stats)
            }
            Persist::Truncate { at } => {
                self.sync(stats)?;
                self.wal.truncate(*at, stats)?;
                if self.control.wal_begin != self.wal.extent().begin {
                    // Keep the control file's informational copy of the beginning current.
                    let mut c = self.control.clone();
                    c.wal_begin = self.wal.extent().begin;
                    self.write_control(c, stats)?;
                }
                Ok(())
            }
            Persist::Append { begin, data, boundary } => self.wal.append(*begin, data, *boundary, stats),
        }
    }

    fn write_control(&mut self, mut c: ControlFile, stats: &mut SyncStats) -> anyhow::Result<()> {
        c.wal_begin = self.wal.extent().begin;
        let t = std::time::Instant::now();
        write_atomic(&self.dir, CONTROL_FILE_NAME, &c.encode())?;
        stats.fsyncs += 2;
        stats.fsync_seconds += t.elapsed().as_secs_f64();
        self.control = c;
        Ok(())
    }

    /// Makes every append so far durable (two fsyncs if there were any).
    pub fn sync(&mut self, stats: &mut SyncStats) -> anyhow::Result<()> {
        self.wal.sync(stats)
    }

    /// Syncs and settles `wal.end` (see [`wal::WalStore::settle`]): from then on, damage to
    /// the last batch's bytes is reported as corruption rather than taken for a batch a crash
    /// cut short. Part of the lazy path, so about once a second and at shutdown.
    pub fn settle(&mut self, stats: &mut SyncStats) -> anyhow::Result<()> {
        self.wal.settle(stats)
    }

    /// Writes the commit LSN, peer horizon and remote-consistent LSN into the control file
    /// if any of them moved forward (the lazy path); none of them ever goes back. The
    /// remote-consistent LSN is taken as of the generation in the control file (see
    /// [`TimelineStorage::persist_lazy_at`]). Returns whether it wrote.
    pub fn persist_lazy(&mut self, lazy: RemovalInputs, stats: &mut SyncStats) -> anyhow::Result<bool> {
        let generation = self.control.remote_consistent_generation;
        self.persist_lazy_at(lazy, generation, stats)
    }

    /// [`TimelineStorage::persist_lazy`] with the remote-consistent LSN reported by the
    /// pageserver of attachment `generation`: a newer generation's position replaces the
    /// one in the control file even if it is lower (only the newest attachment's counts), a
    /// position of the same generation only raises it, an older generation's is ignored.
    pub fn persist_lazy_at(&mut self, lazy: RemovalInputs, generation: u32, stats: &mut SyncStats) -> anyhow::Result<bool> {
        self.settle(stats)?;
        let c = &self.control;
        let position_moves = generation > c.remote_consistent_generation
            || (generation == c.remote_consistent_generation && lazy.remote_consistent_lsn > c.remote_consistent_lsn);
        if lazy.commit_lsn <= c.commit_lsn && lazy.peer_horizon_lsn <= c.peer_horizon_lsn && !position_moves {
            return Ok(false);
        }
        self.sync(stats)?;
        let mut c = self.control.clone();
        c.commit_lsn = c.commit_lsn.max(lazy.commit_lsn);
        c.peer_horizon_lsn = c.peer_horizon_lsn.max(lazy.peer_horizon_lsn);
        if position_moves {
            c.remote_consistent_generation = generation;
            c.remote_consistent_lsn = lazy.remote_consistent_lsn;
        }
        self.write_control(c, stats)?;
        Ok(true)
    }

    /// What the control file says bounds WAL removal (durable values only).
    pub fn removal_inputs(&self) -> RemovalInputs {
        RemovalInputs {
            remote_consistent_lsn: self.control.remote_consistent_lsn,
            peer_horizon_lsn: self.control.peer_horizon_lsn,
            commit_lsn: self.control.commit_lsn,
        }
    }

    /// Removes the WAL segments wholly below the horizon of the durable [`RemovalInputs`]
    /// (see [`removal`]). Returns the segment numbers removed, if any. The control file's
    /// informational copy of the WAL's beginning catches up at its next write.
    pub fn remove_wal(&mut self, stats: &mut SyncStats) -> anyhow::Result<Option<std::ops::Range<u64>>> {
        self.sync(stats)?;
        let horizon = self.removal_inputs().horizon();
        self.wal.remove_below(horizon, stats)
    }

    /// Bytes of WAL segment files on disk.
    pub fn wal_disk_bytes(&self) -> u64 {
        self.wal.disk_bytes()
    }

    /// The WAL in `[from, to)` as stored (`to` at most the end of what was written).
    pub fn read_wal(&mut self, from: Lsn, to: Lsn) -> anyhow::Result<Bytes> {
        self.wal.read(from, to)
    }

    /// The WAL in `[from, to)`, after checking the header of every page the range touches
    /// whose header is inside the WAL (the WAL may begin mid-page, after a header it never
    /// had). Errors name the segment file and the page's LSN.
    pub fn read_wal_verified(&mut self, from: Lsn, to: Lsn) -> anyhow::Result<Bytes> {
        let data = self.wal.read(from, to)?;
        if from == to {
            return Ok(data);
        }
        let seg = u64::from(self.control.wal_segment_size);
        let begin = self.wal.extent().begin;
        let mut page = from.0 - from.0 % proto::lsn::WAL_PAGE_SIZE_BYTES;
        while page < to.0 {
            let lsn = Lsn(page);
            let long = page.is_multiple_of(seg);
            let header_bytes = if long { SIZE_OF_XLOG_LONG_PHD } else { SIZE_OF_XLOG_SHORT_PHD } as u64;
            let header_end = page + header_bytes;
            // Only headers wholly inside the stored WAL can be checked.
            if page >= begin.0 && header_end <= self.wal_written_end().0 {
                let header = if page >= from.0 && header_end <= to.0 {
                    data.slice((page - from.0) as usize..(header_end - from.0) as usize)
                } else {
                    self.wal.read(lsn, Lsn(header_end))?
                };
                self.check_page_header(lsn, &header, seg)?;
            }
            page += proto::lsn::WAL_PAGE_SIZE_BYTES;
        }
        Ok(data)
    }

    fn wal_written_end(&self) -> Lsn {
        // Reads are bounded by the written end; verification uses the same bound.
        self.wal.written_end()
    }

    fn check_page_header(&self, lsn: Lsn, header: &[u8], seg: u64) -> anyhow::Result<()> {
        let segment = segment_file_name(lsn.0 / seg, seg);
        let h = pgwal::PageHeader::parse(header).with_context(|| format!("WAL segment {segment} at {lsn}: page header is truncated"))?;
        h.validate(lsn, seg, Some(self.control.system_id))
            .with_context(|| format!("WAL segment {segment} at {lsn}: invalid page header"))?;
        if h.tli.0 != PG_TIMELINE {
            bail!("WAL segment {segment} at {lsn}: page of timeline {}, expected {PG_TIMELINE}", h.tli.0);
        }
        Ok(())
    }
}
