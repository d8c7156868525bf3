//! `PgReconstructor`: the real [`Reconstructor`], rebuilding PostgreSQL pages and the
//! pageserver's other values from what a read collected.
//!
//! - A relation page starts from its image, or from nothing if its oldest record
//!   initializes it. Runs of consecutive PostgreSQL records go to the WAL redo process
//!   in one request, with the page so far as the base; the Rust-applied records between
//!   them (visibility-map clears and truncations) are applied here, all in LSN order.
//! - An SLRU page (CLOG, multixact offsets and members) is rebuilt entirely in Rust: an
//!   image (every segment page starts as one, zeroed or imported) plus the records of
//!   `record.rs`.
//! - Every other value (directories, sizes, relmapper files, two-phase files, the
//!   checkpoint, the control file) is only ever stored whole, so it is its image.
//!
//! Invariants: a relation page with neither an image nor an initializing record is an
//! error naming the key and LSN, never a page rebuilt from zeros; a record of a kind that
//! does not belong on the key's kind of value is an error; every result is checked to be
//! one 8192-byte page where a page is expected.

pub mod layout;
pub mod record;

use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use proto::page::PAGE_SIZE_BYTES;
use proto::{BlockNumber, Key, KeyKind, Lsn, RelTag, SlruKind};

use crate::pgdata::walredo::{RedoRecord, WalRedoManager};
use layerstore::value::{ReconstructData, Reconstructor};
use layout::SlruPage;
pub use record::{RecordDecodeError, StoredRecord};

/// The reconstructor the pageserver serves reads with. See the module documentation.
pub struct PgReconstructor {
    redo: Option<Arc<WalRedoManager>>,
}

impl PgReconstructor {
    pub fn new(redo: Arc<WalRedoManager>) -> PgReconstructor {
        PgReconstructor { redo: Some(redo) }
    }

    /// A reconstructor without a WAL redo process: everything but relation pages that need
    /// PostgreSQL records replayed. For tools and tests that read only metadata and SLRUs.
    pub fn rust_only() -> PgReconstructor {
        PgReconstructor { redo: None }
    }

    pub fn redo_manager(&self) -> Option<&Arc<WalRedoManager>> {
        self.redo.as_ref()
    }

    fn redo(&self, rel: RelTag, blkno: BlockNumber, base: Option<&[u8]>, records: &[RedoRecord]) -> anyhow::Result<Bytes> {
        let redo = self.redo.as_ref().ok_or_else(|| anyhow!("no WAL redo process is configured to replay PostgreSQL records"))?;
        let page = redo.redo(rel, blkno, base, records)?;
        Ok(page)
    }

    fn rel_page(&self, key: Key, lsn: Lsn, rel: RelTag, blkno: BlockNumber, data: ReconstructData) -> anyhow::Result<Bytes> {
        let mut page: Option<Bytes> = match data.image {
            Some((img_lsn, img)) => {
                check_page_size(&img).with_context(|| format!("image at {img_lsn}"))?;
                Some(img)
            }
            None => None,
        };
        if page.is_none() {
            match data.records.first() {
                Some((_, first)) if first.will_init => {}
                Some((first_lsn, _)) => bail!(
                    "cannot reconstruct {rel} block {blkno} (key {key}) at LSN {lsn}: no page image, and the oldest \
                     record (at {first_lsn}) does not initialize the page"
                ),
                None => bail!("cannot reconstruct {rel} block {blkno} (key {key}) at LSN {lsn}: no versions"),
            }
        }
        let mut batch: Vec<RedoRecord> = Vec::new();
        for (rec_lsn, rec) in data.records {
            let stored = StoredRecord::decode(&rec.rec).with_context(|| format!("record at {rec_lsn}"))?;
            if let StoredRecord::Postgres(raw) = stored {
                batch.push(RedoRecord { end_lsn: rec_lsn, rec: raw });
                continue;
            }
            if !batch.is_empty() {
                page = Some(self.redo(rel, blkno, page.as_deref(), &batch)?);
                batch.clear();
            }
            let mut buf = page.take().ok_or_else(|| anyhow!("{} record at {rec_lsn} has no page to apply to", stored.name()))?.to_vec();
            let applied = match &stored {
                StoredRecord::VmClear { blocks } if rel.forknum == proto::ForkNumber::VisibilityMap => {
                    blocks.iter().try_for_each(|(heap_blkno, bits)| layout::vm_clear_bits(&mut buf, blkno, *heap_blkno, *bits))
                }
                StoredRecord::VmTruncate { heap_blocks } if rel.forknum == proto::ForkNumber::VisibilityMap => {
                    layout::vm_truncate_tail(&mut buf, blkno, *heap_blocks)
                }
                other => Err(format!("a {} record does not apply to {rel}", other.name())),
            };
            applied.map_err(|reason| anyhow!("record at {rec_lsn}: {reason}"))?;
            page = Some(Bytes::from(buf));
        }
        if !batch.is_empty() {
            page = Some(self.redo(rel, blkno, page.as_deref(), &batch)?);
        }
        let page = page.expect("a page: from the image, a record, or the check above");
        check_page_size(&page)?;
        Ok(page)
    }
}

fn check_page_size(page: &[u8]) -> anyhow::Result<()> {
    if page.len() != PAGE_SIZE_BYTES {
        bail!("page has {} bytes, expected {PAGE_SIZE_BYTES}", page.len());
    }
    Ok(())
}

/// Rebuilds an SLRU page from its image and the Rust-applied records after it.
fn slru_page(key: Key, lsn: Lsn, slru: SlruKind, here: SlruPage, data: ReconstructData) -> anyhow::Result<Bytes> {
    let Some((img_lsn, img)) = data.image else {
        bail!("cannot reconstruct {slru} segment {} page {} (key {key}) at LSN {lsn}: no page image", here.segno, here.blkno);
    };
    check_page_size(&img).with_context(|| format!("image at {img_lsn}"))?;
    if data.records.is_empty() {
        return Ok(img);
    }
    let mut page = img.to_vec();
    for (rec_lsn, rec) in data.records {
        let stored = StoredRecord::decode(&rec.rec).with_context(|| format!("record at {rec_lsn}"))?;
        let applied = match (&stored, slru) {
            (StoredRecord::ClogSetStatus { status, xids }, SlruKind::Clog) => {
                xids.iter().try_for_each(|xid| layout::clog_set_status(&mut page, here, *xid, *status))
            }
            (StoredRecord::MultiXactOffsets { entries }, SlruKind::MultiXactOffsets) => {
                entries.iter().try_for_each(|(multi, offset)| layout::multixact_set_offset(&mut page, here, *multi, *offset))
            }
            (StoredRecord::MultiXactMembers { members }, SlruKind::MultiXactMembers) => {
                members.iter().try_for_each(|(offset, xid, status)| layout::multixact_set_member(&mut page, here, *offset, *xid, *status))
            }
            (other, _) => Err(format!("a {} record does not apply to {slru}", other.name())),
        };
        applied.map_err(|reason| anyhow!("record at {rec_lsn}: {reason}"))?;
    }
    Ok(Bytes::from(page))
}

/// A value stored only whole: its image.
fn whole_value(key: Key, lsn: Lsn, data: ReconstructData) -> anyhow::Result<Bytes> {
    if let Some((rec_lsn, _)) = data.records.first() {
        bail!("key {key} holds only whole values, but has a record at {rec_lsn} (read at LSN {lsn})");
    }
    data.image.map(|(_, img)| img).ok_or_else(|| anyhow!("key {key} has no value at LSN {lsn}"))
}

impl Reconstructor for PgReconstructor {
    fn reconstruct(&self, key: Key, lsn: Lsn, data: ReconstructData) -> anyhow::Result<Bytes> {
        match key.kind() {
            KeyKind::RelBlock { rel, blkno } => self.rel_page(key, lsn, rel, blkno, data),
            KeyKind::SlruBlock { slru, segno, blkno } => slru_page(key, lsn, slru, SlruPage { segno, blkno }, data),
            _ => whole_value(key, lsn, data),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::layout::*;
    use super::*;
    use layerstore::Record;

    fn rec(r: StoredRecord) -> Record {
        Record { will_init: false, rec: r.encode() }
    }

    #[test]
    fn clog_page_from_image_and_records() {
        let key = Key::slru_block(SlruKind::Clog, 0, BlockNumber(0));
        let data = ReconstructData {
            image: Some((Lsn(10), Bytes::from(vec![0u8; PAGE_SIZE_BYTES]))),
            records: vec![
                (Lsn(20), rec(StoredRecord::ClogSetStatus { status: XidStatus::Committed, xids: vec![3, 4] })),
                (Lsn(30), rec(StoredRecord::ClogSetStatus { status: XidStatus::Aborted, xids: vec![5] })),
            ],
            ..Default::default()
        };
        let page = PgReconstructor::rust_only().reconstruct(key, Lsn(30), data).unwrap();
        assert_eq!(&page[..2], &[0b0100_0000, 0b0000_1001]);
    }

    #[test]
    fn vm_page_clears_in_lsn_order_without_redo() {
        let rel = RelTag { spcnode: 1663, dbnode: 5, relnode: 16384, forknum: proto::ForkNumber::VisibilityMap };
        let key = Key::rel_block(rel, BlockNumber(0));
        let mut img = page_init();
        img[24..].fill(0xff);
        let data = ReconstructData {
            image: Some((Lsn(10), Bytes::from(img))),
            records: vec![
                (Lsn(20), rec(StoredRecord::VmClear { blocks: vec![(BlockNumber(0), 3), (BlockNumber(5), 2)] })),
                (Lsn(30), rec(StoredRecord::VmTruncate { heap_blocks: BlockNumber(8) })),
            ],
            ..Default::default()
        };
        let page = PgReconstructor::rust_only().reconstruct(key, Lsn(30), data).unwrap();
        assert_eq!(&page[24..27], &[0b1111_1100, 0b1111_0111, 0]);
        assert_eq!(&page[..24], &page_init()[..24], "the header and page LSN are untouched");
    }

    #[test]
    fn errors_name_key_and_lsn() {
        let rel = RelTag { spcnode: 1663, dbnode: 5, relnode: 16384, forknum: proto::ForkNumber::Main };
        let key = Key::rel_block(rel, BlockNumber(7));
        let data = ReconstructData {
            image: None,
            records: vec![(Lsn(0x20), rec(StoredRecord::Postgres(Bytes::from_static(b"x"))))],
            ..Default::default()
        };
        let err = PgReconstructor::rust_only().reconstruct(key, Lsn(0x30), data).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "cannot reconstruct base/5/16384 block 7 (key {key}) at LSN 0/30: no page image, and the oldest record \
                 (at 0/20) does not initialize the page"
            )
        );
        // A CLOG record on a relation page, and a relation record on a CLOG page.
        let data = ReconstructData {
            image: Some((Lsn(1), Bytes::from(vec![0u8; PAGE_SIZE_BYTES]))),
            records: vec![(Lsn(2), rec(StoredRecord::ClogSetStatus { status: XidStatus::Committed, xids: vec![3] }))],
            ..Default::default()
        };
        let err = PgReconstructor::rust_only().reconstruct(key, Lsn(2), data.clone()).unwrap_err();
        assert_eq!(err.to_string(), "record at 0/2: a clog set status record does not apply to base/5/16384");
        let err = PgReconstructor::rust_only()
            .reconstruct(Key::slru_block(SlruKind::MultiXactOffsets, 0, BlockNumber(0)), Lsn(2), data)
            .unwrap_err();
        assert_eq!(err.to_string(), "record at 0/2: a clog set status record does not apply to pg_multixact/offsets");
        // A CLOG record for an xid of another page.
        let data = ReconstructData {
            image: Some((Lsn(1), Bytes::from(vec![0u8; PAGE_SIZE_BYTES]))),
            records: vec![(Lsn(2), rec(StoredRecord::ClogSetStatus { status: XidStatus::Committed, xids: vec![40000] }))],
            ..Default::default()
        };
        let err = PgReconstructor::rust_only().reconstruct(Key::slru_block(SlruKind::Clog, 0, BlockNumber(0)), Lsn(2), data).unwrap_err();
        assert_eq!(err.to_string(), "record at 0/2: the status of xid 40000 belongs on segment 0 page 1, not on segment 0 page 0");
        // Whole values never have records.
        let data = ReconstructData {
            image: None,
            records: vec![(Lsn(5), rec(StoredRecord::VmTruncate { heap_blocks: BlockNumber(1) }))],
            ..Default::default()
        };
        let err = PgReconstructor::rust_only().reconstruct(Key::checkpoint(), Lsn(5), data).unwrap_err();
        assert!(err.to_string().contains("holds only whole values, but has a record at 0/5"), "{err}");
    }
}
