//! GetPage@LSN and the other requests a compute makes, without the network: what the
//! page service will answer, as plain method calls on one timeline.
//!
//! Every request names an LSN, "the newest version, which I promise was not modified after
//! this LSN" (see `DESIGN-NOTES.md`). A request first refuses an LSN below the GC horizon
//! (no waiting for an answer that cannot come), then waits until ingest has published the
//! LSN, at most `timeout`, then reads. A block at or beyond the relation's end is an
//! error naming the relation, the block and the size: a compute asking for it has lost
//! track of the relation's size, which must not be papered over with a zero page.
//!
//! The FSM is the exception, as in `datadir`: it is not stored, has size 0, and any of its
//! blocks reads as zeros (a compute may have extended it locally; zeros mean "no free
//! space known").

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use proto::{BlockNumber, ForkNumber, Lsn, Oid, RelTag, SlruKind};

use crate::pgdata::datadir::{Datadir, DatadirError, ReadCost};
use layerstore::error::WaitLsnError;
use layerstore::timeline::Timeline;
use layerstore::value::Reconstructor;

/// A request was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum PageApiError {
    #[error("requested LSN {requested} is below the garbage collection horizon {horizon}")]
    BelowGcHorizon { requested: Lsn, horizon: Lsn },
    #[error(transparent)]
    WaitLsn(#[from] WaitLsnError),
    #[error("cannot read block {blkno} of relation {rel} at LSN {lsn}: the relation has {size} blocks")]
    BlockBeyondEnd { rel: RelTag, blkno: BlockNumber, size: u32, lsn: Lsn },
    #[error(transparent)]
    Datadir(#[from] DatadirError),
}

/// The requests of a compute against one timeline.
pub struct PageApi {
    timeline: Arc<Timeline>,
    reconstructor: Arc<dyn Reconstructor>,
}

impl PageApi {
    pub fn new(timeline: Arc<Timeline>, reconstructor: Arc<dyn Reconstructor>) -> PageApi {
        PageApi { timeline, reconstructor }
    }

    pub fn timeline(&self) -> &Arc<Timeline> {
        &self.timeline
    }

    /// Reads without waiting, for callers that know the LSN is published.
    pub fn datadir(&self) -> Datadir<'_> {
        Datadir::new(&self.timeline, self.reconstructor.as_ref())
    }

    /// Refuses an LSN below the GC horizon, then waits for it to be ingested.
    fn wait(&self, lsn: Lsn, timeout: Duration) -> Result<(), PageApiError> {
        let horizon = self.timeline.gc_cutoff_lsn();
        if lsn < horizon {
            return Err(PageApiError::BelowGcHorizon { requested: lsn, horizon });
        }
        self.timeline.wait_lsn(lsn, timeout)?;
        Ok(())
    }

    /// GetPage@LSN: block `blkno` of `rel` as of `lsn`.
    pub fn get_page(&self, rel: RelTag, blkno: BlockNumber, lsn: Lsn, timeout: Duration) -> Result<Bytes, PageApiError> {
        self.get_page_with_cost(rel, blkno, lsn, timeout).map(|(page, _)| page)
    }

    /// `get_page`, and what reading the page cost (`Datadir::get_rel_page_with_cost`).
    pub fn get_page_with_cost(
        &self,
        rel: RelTag,
        blkno: BlockNumber,
        lsn: Lsn,
        timeout: Duration,
    ) -> Result<(Bytes, ReadCost), PageApiError> {
        self.wait(lsn, timeout)?;
        let datadir = self.datadir();
        if rel.forknum != ForkNumber::Fsm {
            let size = datadir.get_rel_size(rel, lsn)?;
            if blkno.0 >= size {
                return Err(PageApiError::BlockBeyondEnd { rel, blkno, size, lsn });
            }
        }
        Ok(datadir.get_rel_page_with_cost(rel, blkno, lsn)?)
    }

    /// The relation fork's length in blocks; an error if it does not exist.
    pub fn get_rel_size(&self, rel: RelTag, lsn: Lsn, timeout: Duration) -> Result<u32, PageApiError> {
        self.wait(lsn, timeout)?;
        Ok(self.datadir().get_rel_size(rel, lsn)?)
    }

    pub fn rel_exists(&self, rel: RelTag, lsn: Lsn, timeout: Duration) -> Result<bool, PageApiError> {
        self.wait(lsn, timeout)?;
        Ok(self.datadir().rel_exists(rel, lsn)?)
    }

    /// The database's stored relation forks' size in bytes.
    pub fn get_db_size(&self, spcnode: Oid, dbnode: Oid, lsn: Lsn, timeout: Duration) -> Result<u64, PageApiError> {
        self.wait(lsn, timeout)?;
        Ok(self.datadir().get_db_size(spcnode, dbnode, lsn)?)
    }

    /// A whole SLRU segment file.
    pub fn get_slru_segment(&self, slru: SlruKind, segno: u32, lsn: Lsn, timeout: Duration) -> Result<Bytes, PageApiError> {
        self.wait(lsn, timeout)?;
        Ok(self.datadir().get_slru_segment(slru, segno, lsn)?)
    }

    pub fn list_rels(&self, spcnode: Oid, dbnode: Oid, lsn: Lsn, timeout: Duration) -> Result<BTreeSet<RelTag>, PageApiError> {
        self.wait(lsn, timeout)?;
        Ok(self.datadir().list_rels(spcnode, dbnode, lsn)?)
    }

    pub fn list_dbs(&self, lsn: Lsn, timeout: Duration) -> Result<BTreeSet<(Oid, Oid)>, PageApiError> {
        self.wait(lsn, timeout)?;
        Ok(self.datadir().list_dbs(lsn)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pgdata::datadir::codec::{DbEntry, RelEntry};
    use crate::pgdata::datadir::Modification;
    use crate::pgdata::reconstruct::PgReconstructor;
    use layerstore::tenant::Tenant;
    use layerstore::StorageConfig;
    use proto::{Key, TenantId, TimelineId};

    #[test]
    fn waits_refuses_and_checks_the_relation_size() {
        let dir = tempfile::tempdir().unwrap();
        let tenant = Tenant::create(dir.path(), TenantId([5; 16]), StorageConfig::default(), &[]).unwrap();
        let timeline_id = TimelineId([6; 16]);
        let timeline = tenant.create_timeline(timeline_id).unwrap();
        let rel = RelTag { spcnode: 1663, dbnode: 5, relnode: 16384, forknum: ForkNumber::Main };
        for (lsn, blocks) in [(0x100, 1u32), (0x200, 2)] {
            let mut m = Modification::new(&timeline, Lsn(lsn));
            m.put_db_dir(&[DbEntry { spcnode: 1663, dbnode: 5 }].into());
            m.put_rel_dir(1663, 5, &[RelEntry { relnode: 16384, forknum: ForkNumber::Main }].into());
            m.put_rel_size(rel, blocks);
            m.put_image(Key::rel_block(rel, BlockNumber(blocks - 1)), Bytes::from(vec![blocks as u8; 8192]));
            m.commit().unwrap();
        }
        let api = PageApi::new(timeline.clone(), Arc::new(PgReconstructor::rust_only()));
        let t = Duration::from_millis(20);
        assert_eq!(api.get_page(rel, BlockNumber(1), Lsn(0x200), t).unwrap()[0], 2);
        let (_, cost) = api.get_page_with_cost(rel, BlockNumber(1), Lsn(0x200), t).unwrap();
        assert_eq!(cost, ReadCost { layers_visited: 1, records_replayed: 0, newest_record_lsn: None }, "an image in the open layer");
        assert_eq!(api.get_rel_size(rel, Lsn(0x100), t).unwrap(), 1);
        assert_eq!(api.get_db_size(1663, 5, Lsn(0x200), t).unwrap(), 2 * 8192);
        let err = api.get_page(rel, BlockNumber(1), Lsn(0x100), t).unwrap_err();
        assert_eq!(err.to_string(), "cannot read block 1 of relation base/5/16384 at LSN 0/100: the relation has 1 blocks");
        let err = api.get_page(rel, BlockNumber(0), Lsn(0x300), t).unwrap_err();
        assert_eq!(err.to_string(), "timed out after 20ms waiting for LSN 0/300 to be ingested: last record LSN is 0/200");
        let missing = RelTag { relnode: 16385, ..rel };
        let err = api.get_page(missing, BlockNumber(0), Lsn(0x200), t).unwrap_err();
        assert_eq!(err.to_string(), "relation base/5/16385 does not exist at LSN 0/200");
        let fsm = RelTag { forknum: ForkNumber::Fsm, ..rel };
        assert!(api.get_page(fsm, BlockNumber(7), Lsn(0x200), t).unwrap().iter().all(|&b| b == 0));

        tenant.gc_timeline(timeline_id, Lsn(0x180)).unwrap();
        let err = api.get_page(rel, BlockNumber(0), Lsn(0x100), t).unwrap_err();
        assert!(matches!(err, PageApiError::BelowGcHorizon { .. }), "{err}");
        assert_eq!(err.to_string(), "requested LSN 0/100 is below the garbage collection horizon 0/180");
        // A request that waits wakes up when the LSN is published.
        let waiter = {
            let api = PageApi::new(timeline.clone(), Arc::new(PgReconstructor::rust_only()));
            std::thread::spawn(move || api.get_rel_size(rel, Lsn(0x300), Duration::from_secs(10)))
        };
        let mut m = Modification::new(&timeline, Lsn(0x300));
        m.put_rel_size(rel, 3);
        m.commit().unwrap();
        assert_eq!(waiter.join().unwrap().unwrap(), 3);
    }
}
