//! One WAL record, decoded: the `XLogRecord` header, block references, full-page images,
//! per-block data and main data (`DecodeXLogRecord` in `xlogreader.c`).
//!
//! The layout is a fixed 24-byte header, then a sequence of fragment headers each starting
//! with an id byte (block references 0..=32, the replication origin, the top-level xid, and
//! last the main data header), then the payloads in the same order: for each block its image
//! then its data, and finally the main data. `DecodedRecord` keeps the record's bytes in one
//! shared `Bytes` and slices them, so handing a block's data to storage copies nothing.
//!
//! Invariants: a `DecodedRecord`'s CRC has been verified, its fragment lengths add up to
//! `xl_tot_len` exactly, block ids are strictly increasing, and every block image passed the
//! same cross-checks PostgreSQL makes (hole inside the page, lengths consistent with flags).

use bytes::Bytes;
use proto::{BlockNumber, ForkNumber, Lsn, RelTag};

use crate::consts::*;
use crate::cursor::Cursor;
use crate::fpi::{BlockImage, ImageCompression};
use crate::ids::{RelFileNode, TransactionId};
use crate::WalError;

/// The fixed header of every record (`XLogRecord`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    /// `xl_tot_len`: the whole record's length, this header included.
    pub tot_len: u32,
    /// `xl_xid`: the transaction that wrote the record, or invalid.
    pub xid: TransactionId,
    /// `xl_prev`: the start of the record before this one.
    pub prev: Lsn,
    /// `xl_info`: high nibble for the resource manager, low nibble `XLR_*` flags.
    pub info: u8,
    /// `xl_rmid`: the resource manager (`RM_*_ID`).
    pub rmid: u8,
    /// `xl_crc`: CRC-32C of the payload then of the header up to this field.
    pub crc: u32,
}

impl RecordHeader {
    /// Reads the header from the first 24 bytes of `buf`; `None` if `buf` is shorter.
    pub fn parse(buf: &[u8]) -> Option<RecordHeader> {
        let mut c = Cursor::new(buf);
        let tot_len = c.u32()?;
        let xid = TransactionId(c.u32()?);
        let prev = Lsn(c.u64()?);
        let info = c.u8()?;
        let rmid = c.u8()?;
        c.skip(2)?;
        let crc = c.u32()?;
        Some(RecordHeader { tot_len, xid, prev, info, rmid, crc })
    }

    /// The resource-manager-specific bits of `xl_info` (`XLogRecGetInfo() & ~XLR_INFO_MASK`).
    pub fn rmgr_info(&self) -> u8 {
        self.info & XLR_RMGR_INFO_MASK
    }

    /// Whether this is an `XLOG_SWITCH` record, after which the rest of the segment is unused.
    pub fn is_switch(&self) -> bool {
        self.rmid == RM_XLOG_ID && self.rmgr_info() == XLOG_SWITCH
    }
}

/// Checks a record length read from WAL before anything is allocated for it.
pub(crate) fn validate_tot_len(lsn: Lsn, tot_len: u32) -> Result<(), WalError> {
    if (tot_len as usize) < SIZE_OF_XLOG_RECORD || tot_len > MAX_ALLOC_SIZE {
        return Err(WalError::InvalidRecordLength { lsn, len: tot_len });
    }
    Ok(())
}

/// The parts of `ValidXLogRecordHeader` that need only the header itself.
pub(crate) fn validate_header(lsn: Lsn, header: &RecordHeader) -> Result<(), WalError> {
    validate_tot_len(lsn, header.tot_len)?;
    if !rmgr_id_is_valid(header.rmid) {
        return Err(WalError::InvalidRmgrId { lsn, rmid: header.rmid });
    }
    Ok(())
}

/// The CRC PostgreSQL stores in `xl_crc`: the payload after the header first, then the
/// header up to `xl_crc`. `record` must be at least a header long.
pub fn record_crc(record: &[u8]) -> u32 {
    let crc = crc32c::crc32c(record.get(SIZE_OF_XLOG_RECORD..).unwrap_or_default());
    crc32c::crc32c_append(crc, record.get(..XLOG_RECORD_CRC_OFFSET).unwrap_or_default())
}

/// `ValidXLogRecord`: compares the stored CRC with the computed one.
pub(crate) fn check_crc(lsn: Lsn, record: &[u8]) -> Result<(), WalError> {
    let stored = RecordHeader::parse(record).map(|h| h.crc).unwrap_or_default();
    let computed = record_crc(record);
    if stored != computed {
        return Err(WalError::IncorrectChecksum { lsn, stored, computed });
    }
    Ok(())
}

/// A reference from a record to one block of one relation fork (`DecodedBkpBlock`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockRef {
    /// The id the resource manager gave this reference (0..=32).
    pub block_id: u8,
    pub rel: RelTag,
    pub blkno: BlockNumber,
    /// `fork_flags`: the fork in the low nibble, `BKPBLOCK_*` flags in the high one.
    pub fork_flags: u8,
    pub image: Option<BlockImage>,
    /// Resource-manager data for this block; empty unless `has_data()`.
    pub data: Bytes,
}

impl BlockRef {
    pub fn has_image(&self) -> bool {
        self.fork_flags & BKPBLOCK_HAS_IMAGE != 0
    }

    pub fn has_data(&self) -> bool {
        self.fork_flags & BKPBLOCK_HAS_DATA != 0
    }

    /// `BKPBLOCK_WILL_INIT`: redo builds the page from scratch, ignoring its old contents.
    pub fn will_init(&self) -> bool {
        self.fork_flags & BKPBLOCK_WILL_INIT != 0
    }

    /// `BKPBLOCK_SAME_REL`: the relation was not repeated in the record.
    pub fn same_rel(&self) -> bool {
        self.fork_flags & BKPBLOCK_SAME_REL != 0
    }

    /// Whether replaying this record yields the page without its earlier versions: the page
    /// is initialized, or an image that redo applies replaces it.
    pub fn initializes_page(&self) -> bool {
        self.will_init() || self.image.as_ref().is_some_and(BlockImage::apply)
    }
}

/// A decoded record. See the module documentation for the invariants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodedRecord {
    /// Where the record starts.
    pub lsn: Lsn,
    pub header: RecordHeader,
    /// `XLR_BLOCK_ID_ORIGIN`: the replication origin that produced the change.
    pub origin: Option<u16>,
    /// `XLR_BLOCK_ID_TOPLEVEL_XID`: the top-level transaction of a subtransaction's record.
    pub toplevel_xid: Option<TransactionId>,
    /// Block references in increasing `block_id` order; ids may have gaps.
    pub blocks: Vec<BlockRef>,
    pub main_data: Bytes,
    /// The whole record as it was in WAL, header included.
    pub raw: Bytes,
}

impl DecodedRecord {
    /// Decodes a record that starts at `lsn`, checking its CRC first (bytes from anywhere
    /// other than [`crate::WalStreamDecoder`], such as storage, are verified again).
    pub fn decode(lsn: Lsn, raw: Bytes) -> Result<DecodedRecord, WalError> {
        let header = RecordHeader::parse(&raw).ok_or(WalError::InvalidRecordLength { lsn, len: raw.len() as u32 })?;
        if header.tot_len as usize != raw.len() {
            return Err(WalError::InvalidRecordLength { lsn, len: header.tot_len });
        }
        validate_header(lsn, &header)?;
        check_crc(lsn, &raw)?;
        decode_verified(lsn, raw)
    }

    pub fn rmid(&self) -> u8 {
        self.header.rmid
    }

    /// The resource-manager-specific bits of `xl_info`.
    pub fn rmgr_info(&self) -> u8 {
        self.header.rmgr_info()
    }

    /// `XLogRecGetBlock`: the reference with this id, if the record has one.
    pub fn block(&self, block_id: u8) -> Option<&BlockRef> {
        self.blocks.iter().find(|b| b.block_id == block_id)
    }

    /// `RestoreBlockImage`: the 8192-byte page stored in block `block_id`'s image.
    pub fn restore_page(&self, block_id: u8) -> Result<Bytes, WalError> {
        let err = |reason: String| WalError::InvalidImage { lsn: self.lsn, block_id, reason };
        let block = self.block(block_id).ok_or_else(|| err("no such block reference".into()))?;
        let image = block.image.as_ref().ok_or_else(|| err("block reference has no image".into()))?;
        image.restore_page().map_err(err)
    }
}

/// Image header fields as read, before the payload is sliced off.
struct ImageHeader {
    bimg_len: u16,
    hole_offset: u16,
    hole_length: u16,
    bimg_info: u8,
    compression: ImageCompression,
}

/// A block header as read, before the payloads are sliced off.
struct PendingBlock {
    block_id: u8,
    fork_flags: u8,
    data_len: u16,
    image: Option<ImageHeader>,
    rel: RelTag,
    blkno: BlockNumber,
}

/// `DecodeXLogRecord` for a record whose header and CRC were already checked.
pub(crate) fn decode_verified(lsn: Lsn, raw: Bytes) -> Result<DecodedRecord, WalError> {
    let short = |reason: &str| WalError::InvalidRecordData { lsn, reason: reason.to_string() };
    let header = RecordHeader::parse(&raw).ok_or_else(|| short("shorter than a record header"))?;
    let body = raw.get(SIZE_OF_XLOG_RECORD..).ok_or_else(|| short("shorter than a record header"))?;
    let mut c = Cursor::new(body);
    let mut origin = None;
    let mut toplevel_xid = None;
    let mut pending: Vec<PendingBlock> = Vec::new();
    let mut main_data_len: usize = 0;
    // Payload bytes announced so far; the headers end where the remaining bytes equal it.
    let mut datatotal: usize = 0;
    let mut last_rnode: Option<RelFileNode> = None;

    while c.remaining() > datatotal {
        let block_id = c.u8().ok_or_else(|| short("truncated fragment header"))?;
        match block_id {
            XLR_BLOCK_ID_DATA_SHORT => {
                main_data_len = usize::from(c.u8().ok_or_else(|| short("truncated main data header"))?);
                datatotal += main_data_len;
                break; // by convention the main data header is last
            }
            XLR_BLOCK_ID_DATA_LONG => {
                main_data_len = c.u32().ok_or_else(|| short("truncated main data header"))? as usize;
                datatotal += main_data_len;
                break;
            }
            XLR_BLOCK_ID_ORIGIN => {
                origin = Some(c.u16().ok_or_else(|| short("truncated origin"))?);
            }
            XLR_BLOCK_ID_TOPLEVEL_XID => {
                toplevel_xid = Some(TransactionId(c.u32().ok_or_else(|| short("truncated top-level xid"))?));
            }
            id if id <= XLR_MAX_BLOCK_ID => {
                if pending.last().is_some_and(|b| b.block_id >= id) {
                    return Err(WalError::OutOfOrderBlockId { lsn, block_id: id });
                }
                let block = decode_block_header(lsn, id, &mut c, &mut last_rnode)?;
                datatotal += usize::from(block.data_len);
                datatotal += block.image.as_ref().map_or(0, |i| usize::from(i.bimg_len));
                pending.push(block);
            }
            id => return Err(WalError::InvalidBlockId { lsn, block_id: id }),
        }
    }
    if c.remaining() != datatotal {
        return Err(WalError::InvalidRecordData {
            lsn,
            reason: format!("fragments announce {datatotal} bytes of payload, record has {}", c.remaining()),
        });
    }

    // The payloads follow in header order: each block's image, then its data; then main data.
    let mut offset = SIZE_OF_XLOG_RECORD + c.position();
    let mut take = |len: usize| {
        let slice = raw.slice(offset..offset + len);
        offset += len;
        slice
    };
    let mut blocks = Vec::with_capacity(pending.len());
    for p in pending {
        let image = p.image.map(|h| BlockImage {
            bimg_info: h.bimg_info,
            hole_offset: h.hole_offset,
            hole_length: h.hole_length,
            compression: h.compression,
            stored: take(usize::from(h.bimg_len)),
        });
        let data = take(usize::from(p.data_len));
        blocks.push(BlockRef { block_id: p.block_id, rel: p.rel, blkno: p.blkno, fork_flags: p.fork_flags, image, data });
    }
    let main_data = take(main_data_len);
    debug_assert_eq!(offset, raw.len());
    Ok(DecodedRecord { lsn, header, origin, toplevel_xid, blocks, main_data, raw })
}

/// Reads one `XLogRecordBlockHeader` with its optional image header, relation and block
/// number, applying `DecodeXLogRecord`'s cross-checks.
fn decode_block_header(lsn: Lsn, block_id: u8, c: &mut Cursor<'_>, last_rnode: &mut Option<RelFileNode>) -> Result<PendingBlock, WalError> {
    let short = || WalError::InvalidRecordData { lsn, reason: format!("truncated header of block {block_id}") };
    let bad = |reason: String| WalError::InvalidBlockRef { lsn, block_id, reason };
    let fork_flags = c.u8().ok_or_else(short)?;
    let data_len = c.u16().ok_or_else(short)?;
    let has_data = fork_flags & BKPBLOCK_HAS_DATA != 0;
    if has_data && data_len == 0 {
        return Err(bad("BKPBLOCK_HAS_DATA set, but no data included".into()));
    }
    if !has_data && data_len != 0 {
        return Err(bad(format!("BKPBLOCK_HAS_DATA not set, but data length is {data_len}")));
    }
    let image = if fork_flags & BKPBLOCK_HAS_IMAGE != 0 {
        let bimg_len = c.u16().ok_or_else(short)?;
        let hole_offset = c.u16().ok_or_else(short)?;
        let bimg_info = c.u8().ok_or_else(short)?;
        let compression = ImageCompression::from_bimg_info(bimg_info)
            .ok_or_else(|| bad(format!("image compressed with unknown method, bimg_info {bimg_info:#04x}")))?;
        let compressed = compression != ImageCompression::None;
        let has_hole = bimg_info & BKPIMAGE_HAS_HOLE != 0;
        let hole_length = if compressed {
            if has_hole {
                c.u16().ok_or_else(short)?
            } else {
                0
            }
        } else {
            // An uncompressed image is the page minus the hole; bimg_len > BLCKSZ is caught
            // by the flag checks below.
            (BLCKSZ as u16).wrapping_sub(bimg_len)
        };
        let blcksz = BLCKSZ as u16;
        if has_hole && (hole_offset == 0 || hole_length == 0 || bimg_len == blcksz) {
            return Err(bad(format!(
                "BKPIMAGE_HAS_HOLE set, but hole offset {hole_offset} length {hole_length} block image length {bimg_len}"
            )));
        }
        if !has_hole && (hole_offset != 0 || hole_length != 0) {
            return Err(bad(format!("BKPIMAGE_HAS_HOLE not set, but hole offset {hole_offset} length {hole_length}")));
        }
        if compressed && bimg_len >= blcksz {
            return Err(bad(format!("BKPIMAGE_COMPRESSED set, but block image length {bimg_len}")));
        }
        if !has_hole && !compressed && bimg_len != blcksz {
            return Err(bad(format!("neither BKPIMAGE_HAS_HOLE nor BKPIMAGE_COMPRESSED set, but block image length is {bimg_len}")));
        }
        // PostgreSQL trusts the hole to lie inside the page; we check, so restoring an image
        // can never index outside it.
        if usize::from(hole_offset) + usize::from(hole_length) > BLCKSZ || bimg_len > blcksz {
            return Err(bad(format!("hole offset {hole_offset} length {hole_length} lies outside the page")));
        }
        Some(ImageHeader { bimg_len, hole_offset, hole_length, bimg_info, compression })
    } else {
        None
    };
    let rnode = if fork_flags & BKPBLOCK_SAME_REL == 0 {
        let rnode =
            RelFileNode { spcnode: c.u32().ok_or_else(short)?, dbnode: c.u32().ok_or_else(short)?, relnode: c.u32().ok_or_else(short)? };
        *last_rnode = Some(rnode);
        rnode
    } else {
        last_rnode.ok_or_else(|| bad("BKPBLOCK_SAME_REL set but no previous rel".into()))?
    };
    let fork = fork_flags & BKPBLOCK_FORK_MASK;
    let forknum = ForkNumber::from_u8(fork).ok_or_else(|| bad(format!("invalid fork number {fork}")))?;
    let blkno = BlockNumber(c.u32().ok_or_else(short)?);
    Ok(PendingBlock { block_id, fork_flags, data_len, image, rel: rnode.fork(forknum), blkno })
}
