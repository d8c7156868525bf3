//! A small WAL encoder for tests: builds records (`XLogRecordAssemble`) and lays them out on
//! pages with headers and continuation records (`CopyXLogRecordToWAL`).
//!
//! It exists so the decoder can be tested against WAL with known contents, including shapes
//! a short real workload rarely produces (records spanning several pages and a segment
//! boundary, switch records, every image compression). It is compiled only for tests (this
//! crate's, and other crates' through the `test-encoder` feature, which only
//! dev-dependencies enable): fjord never writes WAL records through this crate.

use bytes::Bytes;
use proto::{BlockNumber, Lsn, RelTag};

use crate::consts::*;
use crate::fpi::BlockImage;
use crate::ids::TimeLineId;
use crate::page::PageHeader;
use crate::record::{record_crc, DecodedRecord};

/// One block reference to encode.
#[derive(Clone, Debug)]
pub struct BlockSpec {
    pub block_id: u8,
    pub rel: RelTag,
    pub blkno: BlockNumber,
    pub will_init: bool,
    pub image: Option<BlockImage>,
    pub data: Vec<u8>,
}

impl BlockSpec {
    pub fn new(block_id: u8, rel: RelTag, blkno: u32) -> BlockSpec {
        BlockSpec { block_id, rel, blkno: BlockNumber(blkno), will_init: false, image: None, data: Vec::new() }
    }

    pub fn data(mut self, data: Vec<u8>) -> BlockSpec {
        self.data = data;
        self
    }

    pub fn image(mut self, image: BlockImage) -> BlockSpec {
        self.image = Some(image);
        self
    }

    pub fn will_init(mut self) -> BlockSpec {
        self.will_init = true;
        self
    }
}

/// One record to encode.
#[derive(Clone, Debug)]
pub struct RecordSpec {
    pub rmid: u8,
    pub info: u8,
    pub xid: u32,
    pub origin: Option<u16>,
    pub toplevel_xid: Option<u32>,
    pub blocks: Vec<BlockSpec>,
    pub main_data: Vec<u8>,
}

impl RecordSpec {
    pub fn new(rmid: u8, info: u8) -> RecordSpec {
        RecordSpec { rmid, info, xid: 0, origin: None, toplevel_xid: None, blocks: Vec::new(), main_data: Vec::new() }
    }

    pub fn xid(mut self, xid: u32) -> RecordSpec {
        self.xid = xid;
        self
    }

    pub fn main_data(mut self, data: Vec<u8>) -> RecordSpec {
        self.main_data = data;
        self
    }

    pub fn block(mut self, block: BlockSpec) -> RecordSpec {
        self.blocks.push(block);
        self
    }

    /// The record's bytes with `xl_prev = prev` and a correct CRC.
    pub fn encode(&self, prev: Lsn) -> Vec<u8> {
        let mut headers = Vec::new();
        let mut payload = Vec::new();
        let mut last_rel: Option<RelTag> = None;
        for b in &self.blocks {
            let same_rel = last_rel.is_some_and(|r| crate::RelFileNode::from(r) == crate::RelFileNode::from(b.rel));
            let mut fork_flags = b.rel.forknum as u8;
            if b.image.is_some() {
                fork_flags |= BKPBLOCK_HAS_IMAGE;
            }
            if !b.data.is_empty() {
                fork_flags |= BKPBLOCK_HAS_DATA;
            }
            if b.will_init {
                fork_flags |= BKPBLOCK_WILL_INIT;
            }
            if same_rel {
                fork_flags |= BKPBLOCK_SAME_REL;
            }
            headers.push(b.block_id);
            headers.push(fork_flags);
            headers.extend_from_slice(&(b.data.len() as u16).to_le_bytes());
            if let Some(img) = &b.image {
                headers.extend_from_slice(&(img.stored.len() as u16).to_le_bytes());
                headers.extend_from_slice(&img.hole_offset.to_le_bytes());
                headers.push(img.bimg_info);
                if img.bimg_info & BKPIMAGE_COMPRESS_MASK != 0 && img.bimg_info & BKPIMAGE_HAS_HOLE != 0 {
                    headers.extend_from_slice(&img.hole_length.to_le_bytes());
                }
                payload.extend_from_slice(&img.stored);
            }
            if !same_rel {
                for oid in [b.rel.spcnode, b.rel.dbnode, b.rel.relnode] {
                    headers.extend_from_slice(&oid.to_le_bytes());
                }
            }
            headers.extend_from_slice(&b.blkno.0.to_le_bytes());
            payload.extend_from_slice(&b.data);
            last_rel = Some(b.rel);
        }
        if let Some(origin) = self.origin {
            headers.push(XLR_BLOCK_ID_ORIGIN);
            headers.extend_from_slice(&origin.to_le_bytes());
        }
        if let Some(xid) = self.toplevel_xid {
            headers.push(XLR_BLOCK_ID_TOPLEVEL_XID);
            headers.extend_from_slice(&xid.to_le_bytes());
        }
        if self.main_data.len() > 255 {
            headers.push(XLR_BLOCK_ID_DATA_LONG);
            headers.extend_from_slice(&(self.main_data.len() as u32).to_le_bytes());
        } else if !self.main_data.is_empty() {
            headers.push(XLR_BLOCK_ID_DATA_SHORT);
            headers.push(self.main_data.len() as u8);
        }
        payload.extend_from_slice(&self.main_data);

        let tot_len = (SIZE_OF_XLOG_RECORD + headers.len() + payload.len()) as u32;
        let mut rec = Vec::with_capacity(tot_len as usize);
        rec.extend_from_slice(&tot_len.to_le_bytes());
        rec.extend_from_slice(&self.xid.to_le_bytes());
        rec.extend_from_slice(&prev.0.to_le_bytes());
        rec.push(self.info);
        rec.push(self.rmid);
        rec.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        rec.extend_from_slice(&headers);
        rec.extend_from_slice(&payload);
        let crc = record_crc(&rec);
        rec[XLOG_RECORD_CRC_OFFSET..SIZE_OF_XLOG_RECORD].copy_from_slice(&crc.to_le_bytes());
        rec
    }

    /// Encodes and decodes the record as if it started at `lsn`.
    pub fn decoded(&self, lsn: Lsn) -> DecodedRecord {
        DecodedRecord::decode(lsn, Bytes::from(self.encode(Lsn(0)))).expect("test record decodes")
    }
}

/// Lays records out on WAL pages from a starting position.
pub struct WalWriter {
    pub start: Lsn,
    pub pos: Lsn,
    pub out: Vec<u8>,
    pub segment_size_bytes: u64,
    pub sysid: u64,
    pub prev: Lsn,
}

/// Where the writer put one record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placed {
    pub start: Lsn,
    pub end: Lsn,
}

impl WalWriter {
    /// A writer whose first byte is at `start` (a page boundary or a record start).
    pub fn new(start: Lsn, segment_size_bytes: u64) -> WalWriter {
        WalWriter { start, pos: start, out: Vec::new(), segment_size_bytes, sysid: 7, prev: Lsn(start.0.saturating_sub(64)) }
    }

    fn page_header(&mut self, rem_len: u32) {
        let mut hdr = PageHeader::new(self.pos, TimeLineId(1), self.segment_size_bytes, self.sysid);
        if rem_len > 0 {
            hdr.info |= XLP_FIRST_IS_CONTRECORD;
            hdr.rem_len = rem_len;
        }
        self.raw(&hdr.to_bytes());
    }

    fn raw(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
        self.pos = Lsn(self.pos.0 + bytes.len() as u64);
    }

    /// Writes an encoded record (its `xl_prev` already set) at the next aligned position.
    pub fn append_encoded(&mut self, rec: &[u8]) -> Placed {
        let aligned = self.pos.align8();
        self.raw(&vec![0; (aligned.0 - self.pos.0) as usize]);
        if self.pos.0.is_multiple_of(XLOG_BLCKSZ as u64) {
            self.page_header(0);
        }
        let start = self.pos;
        let mut written = 0;
        while written < rec.len() {
            if self.pos.0.is_multiple_of(XLOG_BLCKSZ as u64) {
                self.page_header((rec.len() - written) as u32);
            }
            let room = XLOG_BLCKSZ - (self.pos.0 % XLOG_BLCKSZ as u64) as usize;
            let n = room.min(rec.len() - written);
            self.raw(&rec[written..written + n]);
            written += n;
        }
        let is_switch = rec.get(17) == Some(&RM_XLOG_ID) && rec.get(16).map(|i| i & 0xF0) == Some(XLOG_SWITCH);
        let end = if is_switch {
            // Fill the rest of the segment as PostgreSQL does: zeroed pages with headers.
            let seg_end = self.pos.0.div_ceil(self.segment_size_bytes) * self.segment_size_bytes;
            while self.pos.0 < seg_end {
                if self.pos.0.is_multiple_of(XLOG_BLCKSZ as u64) {
                    self.page_header(0);
                }
                let room = XLOG_BLCKSZ - (self.pos.0 % XLOG_BLCKSZ as u64) as usize;
                self.raw(&vec![0; room]);
            }
            self.pos
        } else {
            self.pos.align8()
        };
        self.prev = start;
        Placed { start, end }
    }

    /// Encodes `spec` with the right `xl_prev` and writes it.
    pub fn append(&mut self, spec: &RecordSpec) -> Placed {
        let rec = spec.encode(self.prev);
        self.append_encoded(&rec)
    }

    /// The bytes written from `lsn` on.
    pub fn bytes_from(&self, lsn: Lsn) -> &[u8] {
        &self.out[(lsn.0 - self.start.0) as usize..]
    }
}
