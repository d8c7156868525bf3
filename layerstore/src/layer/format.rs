//! The byte layout of layer files, shared by the writer and the reader.
//!
//! ```text
//! [header: 128 bytes][block][block]...[block][index: key_count * 46 bytes]
//! ```
//! The header is at offset 0 and fixed-size; blocks follow back to back; the index ends
//! the file. Every byte of the file is covered by exactly one checksum: the header's own
//! CRC, a block's CRC (which also covers the block's length fields) or the index CRC
//! stored in the header. There are no gaps and no padding, so a flipped byte anywhere is
//! caught by the check of the structure it belongs to. Integers are little-endian; keys
//! are their 18-byte `Key` form. The file holds no paths or host-specific data, so it can
//! be uploaded to object storage and downloaded elsewhere unchanged. See `docs/layer-format.md`
//! for the tables.
//!
//! The reader checks magic and version before the checksum, so that a file from a newer
//! build is reported as such rather than as corrupt; everything else is checked after it.
//! Version 1 files (index entries without the newest version's LSN) are still read;
//! everything written is the current version.

use proto::{Key, KeyRange, Lsn, KEY_SIZE_BYTES};

use super::name::LayerKind;

pub const MAGIC: [u8; 8] = *b"FJORDLYR";
/// Version 2 added the newest version's LSN to each index entry, so that a read looking for
/// versions above some LSN skips a key with none without reading its blocks.
pub const FORMAT_VERSION: u16 = 2;
/// The oldest version this build reads.
pub const FORMAT_VERSION_OLDEST: u16 = 1;
pub const HEADER_SIZE_BYTES: usize = 128;
/// Bytes of the header covered by its CRC (the CRC sits in the last four).
const HEADER_CRC_OFFSET: usize = HEADER_SIZE_BYTES - 4;

const KIND_DELTA: u8 = 1;
const KIND_IMAGE: u8 = 2;
const COMPRESSION_ZSTD: u8 = 1;

/// `compressed_len: u32, uncompressed_len: u32, crc32c: u32` before each block's payload.
pub const BLOCK_FRAME_SIZE_BYTES: usize = 12;
/// The reader refuses to allocate more than this for one decompressed block. Blocks are cut
/// at `block_size_bytes` (at most 16 MiB) plus one value (at most 16 MiB).
pub const BLOCK_SIZE_BYTES_MAX: usize = 64 * 1024 * 1024;

/// `key, lsn: u64, tag: u8, len: u32` before each value inside a decompressed block.
pub const ENTRY_HEADER_SIZE_BYTES: usize = KEY_SIZE_BYTES + 8 + 1 + 4;
/// `key, first_lsn: u64, last_lsn: u64, block_offset: u64, value_count: u32` per index entry.
pub const INDEX_ENTRY_SIZE_BYTES: usize = KEY_SIZE_BYTES + 8 + 8 + 8 + 4;
/// Version 1's index entry: no `last_lsn`.
const INDEX_ENTRY_V1_SIZE_BYTES: usize = KEY_SIZE_BYTES + 8 + 8 + 4;

/// The size of one index entry in a file of format `version`.
pub fn index_entry_size(version: u16) -> usize {
    if version == 1 {
        INDEX_ENTRY_V1_SIZE_BYTES
    } else {
        INDEX_ENTRY_SIZE_BYTES
    }
}

/// A failed check: where in the file, and why. The reader adds the file's path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatError {
    pub offset: u64,
    pub reason: String,
    /// Set when the header names a format version this build does not read.
    pub unsupported_version: Option<u16>,
}

impl FormatError {
    pub fn new(offset: u64, reason: impl Into<String>) -> FormatError {
        FormatError { offset, reason: reason.into(), unsupported_version: None }
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// The file header. See `docs/layer-format.md` for the byte table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The file's format version (the writer always writes `FORMAT_VERSION`).
    pub version: u16,
    pub kind: LayerKind,
    pub key_range: KeyRange,
    pub lsn_start: Lsn,
    pub lsn_end: Lsn,
    pub index_offset: u64,
    pub index_len: u64,
    pub index_crc: u32,
    pub key_count: u32,
    pub value_count: u64,
    pub block_count: u32,
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_SIZE_BYTES] {
        let mut b = [0u8; HEADER_SIZE_BYTES];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..10].copy_from_slice(&self.version.to_le_bytes());
        b[10] = match self.kind {
            LayerKind::Delta => KIND_DELTA,
            LayerKind::Image => KIND_IMAGE,
        };
        b[11] = COMPRESSION_ZSTD;
        // 12..16 reserved, zero.
        b[16..34].copy_from_slice(&self.key_range.start.to_bytes());
        b[34..52].copy_from_slice(&self.key_range.end.to_bytes());
        b[52..60].copy_from_slice(&self.lsn_start.0.to_le_bytes());
        b[60..68].copy_from_slice(&self.lsn_end.0.to_le_bytes());
        b[68..76].copy_from_slice(&self.index_offset.to_le_bytes());
        b[76..84].copy_from_slice(&self.index_len.to_le_bytes());
        b[84..88].copy_from_slice(&self.index_crc.to_le_bytes());
        b[88..92].copy_from_slice(&self.key_count.to_le_bytes());
        b[92..100].copy_from_slice(&self.value_count.to_le_bytes());
        b[100..104].copy_from_slice(&self.block_count.to_le_bytes());
        // 104..124 reserved, zero.
        let crc = crc32c::crc32c(&b[..HEADER_CRC_OFFSET]);
        b[HEADER_CRC_OFFSET..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and checks a header read from a file of `file_len` bytes.
    pub fn decode(b: &[u8; HEADER_SIZE_BYTES], file_len: u64) -> Result<Header, FormatError> {
        if b[0..8] != MAGIC {
            return Err(FormatError::new(0, format!("bad magic {:02X?}", &b[0..8])));
        }
        let version = u16_at(b, 8);
        if !(FORMAT_VERSION_OLDEST..=FORMAT_VERSION).contains(&version) {
            return Err(FormatError { unsupported_version: Some(version), ..FormatError::new(8, "unsupported version") });
        }
        let crc = crc32c::crc32c(&b[..HEADER_CRC_OFFSET]);
        let stored = u32_at(b, HEADER_CRC_OFFSET);
        if crc != stored {
            return Err(FormatError::new(0, format!("header checksum mismatch: stored {stored:08X}, computed {crc:08X}")));
        }
        // A correct checksum with impossible contents means a writer bug, not a flipped bit,
        // but the file is refused the same way.
        let kind = match b[10] {
            KIND_DELTA => LayerKind::Delta,
            KIND_IMAGE => LayerKind::Image,
            other => return Err(FormatError::new(10, format!("unknown layer kind {other}"))),
        };
        if b[11] != COMPRESSION_ZSTD {
            return Err(FormatError::new(11, format!("unknown compression {}", b[11])));
        }
        if b[12..16].iter().chain(&b[104..HEADER_CRC_OFFSET]).any(|&x| x != 0) {
            return Err(FormatError::new(12, "reserved header bytes are not zero"));
        }
        let key = |at: usize| Key::from_bytes(&b[at..at + KEY_SIZE_BYTES]).map_err(|e| FormatError::new(at as u64, e.to_string()));
        let h = Header {
            version,
            kind,
            key_range: KeyRange { start: key(16)?, end: key(34)? },
            lsn_start: Lsn(u64_at(b, 52)),
            lsn_end: Lsn(u64_at(b, 60)),
            index_offset: u64_at(b, 68),
            index_len: u64_at(b, 76),
            index_crc: u32_at(b, 84),
            key_count: u32_at(b, 88),
            value_count: u64_at(b, 92),
            block_count: u32_at(b, 100),
        };
        if h.key_range.is_empty() || h.lsn_start >= h.lsn_end {
            return Err(FormatError::new(16, "empty key or LSN range"));
        }
        if h.index_offset < HEADER_SIZE_BYTES as u64 || h.index_offset.checked_add(h.index_len) != Some(file_len) {
            return Err(FormatError::new(
                68,
                format!("index at {} with {} bytes does not end the {file_len}-byte file", h.index_offset, h.index_len),
            ));
        }
        if h.index_len != u64::from(h.key_count) * index_entry_size(version) as u64 {
            return Err(FormatError::new(76, format!("index of {} bytes cannot hold {} keys", h.index_len, h.key_count)));
        }
        Ok(h)
    }
}

/// Encodes a block frame header for `payload` (the compressed bytes).
pub fn encode_block_frame(payload: &[u8], uncompressed_len: u32) -> [u8; BLOCK_FRAME_SIZE_BYTES] {
    let mut f = [0u8; BLOCK_FRAME_SIZE_BYTES];
    let compressed_len = u32::try_from(payload.len()).expect("compressed block exceeds 4 GiB");
    f[0..4].copy_from_slice(&compressed_len.to_le_bytes());
    f[4..8].copy_from_slice(&uncompressed_len.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&f[0..8]), payload);
    f[8..12].copy_from_slice(&crc.to_le_bytes());
    f
}

/// A block frame header's fields: `(compressed_len, uncompressed_len, crc)`.
pub fn decode_block_frame(f: &[u8; BLOCK_FRAME_SIZE_BYTES]) -> (u32, u32, u32) {
    (u32_at(f, 0), u32_at(f, 4), u32_at(f, 8))
}

/// The CRC a block frame must carry for `payload`.
pub fn block_crc(f: &[u8; BLOCK_FRAME_SIZE_BYTES], payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&f[0..8]), payload)
}

/// Appends one value entry to an uncompressed block.
pub fn encode_entry(out: &mut Vec<u8>, key: Key, lsn: Lsn, tag: u8, payload: &[u8]) {
    out.extend_from_slice(&key.to_bytes());
    out.extend_from_slice(&lsn.0.to_le_bytes());
    out.push(tag);
    let len = u32::try_from(payload.len()).expect("value exceeds 4 GiB");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(payload);
}

/// One value entry of a decompressed block; `payload` is a range into the block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawEntry {
    pub key: Key,
    pub lsn: Lsn,
    pub tag: u8,
    pub payload: std::ops::Range<usize>,
}

/// Decodes the entry at `pos` of a decompressed block. `Ok(None)` at the end of the block.
/// Errors carry the position inside the decompressed block.
pub fn decode_entry(block: &[u8], pos: usize) -> Result<Option<(RawEntry, usize)>, String> {
    if pos == block.len() {
        return Ok(None);
    }
    let header_end = pos.checked_add(ENTRY_HEADER_SIZE_BYTES).filter(|&e| e <= block.len());
    let Some(header_end) = header_end else {
        return Err(format!("truncated entry header at block position {pos}"));
    };
    let key = Key::from_bytes(&block[pos..pos + KEY_SIZE_BYTES]).map_err(|e| format!("entry at block position {pos}: {e}"))?;
    let lsn = Lsn(u64_at(block, pos + KEY_SIZE_BYTES));
    let tag = block[pos + KEY_SIZE_BYTES + 8];
    let len = u32_at(block, pos + KEY_SIZE_BYTES + 9) as usize;
    let end = header_end.checked_add(len).filter(|&e| e <= block.len());
    let Some(end) = end else {
        return Err(format!("entry at block position {pos} claims {len} bytes past the end of the block"));
    };
    Ok(Some((RawEntry { key, lsn, tag, payload: header_end..end }, end)))
}

/// One index entry: where a key's versions start, and how many there are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    pub key: Key,
    /// The oldest version's LSN: lets `keys_in_range` answer without reading blocks.
    pub first_lsn: Lsn,
    /// The newest version's LSN: lets a read that wants versions above some LSN skip a key
    /// with none. `None` only in version 1 files with more than one version of the key.
    pub last_lsn: Option<Lsn>,
    /// File offset of the block frame holding the key's oldest version.
    pub block_offset: u64,
    pub value_count: u32,
}

impl IndexEntry {
    /// Encodes the entry in the current format; `last_lsn` must be known.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.key.to_bytes());
        out.extend_from_slice(&self.first_lsn.0.to_le_bytes());
        out.extend_from_slice(&self.last_lsn.expect("a written index entry knows its newest LSN").0.to_le_bytes());
        out.extend_from_slice(&self.block_offset.to_le_bytes());
        out.extend_from_slice(&self.value_count.to_le_bytes());
    }

    /// Decodes the entry in `b` (exactly `index_entry_size(version)` bytes); `offset` is
    /// its file offset, for errors.
    pub fn decode(b: &[u8], version: u16, offset: u64) -> Result<IndexEntry, FormatError> {
        let key = Key::from_bytes(&b[..KEY_SIZE_BYTES]).map_err(|e| FormatError::new(offset, format!("index entry: {e}")))?;
        let first_lsn = Lsn(u64_at(b, KEY_SIZE_BYTES));
        let (last_lsn, rest) =
            if version == 1 { (None, KEY_SIZE_BYTES + 8) } else { (Some(Lsn(u64_at(b, KEY_SIZE_BYTES + 8))), KEY_SIZE_BYTES + 16) };
        let value_count = u32_at(b, rest + 8);
        // A key with one version: its only version is also its newest, in any format.
        let last_lsn = if value_count == 1 && last_lsn.is_none() { Some(first_lsn) } else { last_lsn };
        Ok(IndexEntry { key, first_lsn, last_lsn, block_offset: u64_at(b, rest), value_count })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            version: FORMAT_VERSION,
            kind: LayerKind::Delta,
            key_range: KeyRange::ALL,
            lsn_start: Lsn(1),
            lsn_end: Lsn(9),
            index_offset: 200,
            index_len: 2 * INDEX_ENTRY_SIZE_BYTES as u64,
            index_crc: 7,
            key_count: 2,
            value_count: 5,
            block_count: 1,
        }
    }

    #[test]
    fn header_round_trips_and_every_flipped_byte_is_caught() {
        let h = header();
        let file_len = 200 + h.index_len;
        let bytes = h.encode();
        assert_eq!(Header::decode(&bytes, file_len).unwrap(), h);
        for i in 0..HEADER_SIZE_BYTES {
            let mut bad = bytes;
            bad[i] ^= 0x01;
            assert!(Header::decode(&bad, file_len).is_err(), "flip at {i} not detected");
        }
        assert!(Header::decode(&bytes, file_len + 1).is_err(), "trailing bytes not detected");
    }

    #[test]
    fn newer_version_is_reported_as_such() {
        let mut bytes = header().encode();
        bytes[8..10].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
        let err = Header::decode(&bytes, 200 + 2 * INDEX_ENTRY_SIZE_BYTES as u64).unwrap_err();
        assert_eq!(err.unsupported_version, Some(FORMAT_VERSION + 1));
        assert_eq!(err.offset, 8);
    }

    #[test]
    fn index_entries_round_trip_and_version_1_entries_still_decode() {
        let e = IndexEntry { key: Key::MIN, first_lsn: Lsn(3), last_lsn: Some(Lsn(8)), block_offset: 128, value_count: 4 };
        let mut b = Vec::new();
        e.encode(&mut b);
        assert_eq!(b.len(), index_entry_size(FORMAT_VERSION));
        assert_eq!(IndexEntry::decode(&b, FORMAT_VERSION, 0).unwrap(), e);
        // Version 1: the same entry without its newest LSN, unknown unless there is one version.
        let v1: Vec<u8> = [&b[..KEY_SIZE_BYTES + 8], &b[KEY_SIZE_BYTES + 16..]].concat();
        assert_eq!(v1.len(), index_entry_size(1));
        assert_eq!(IndexEntry::decode(&v1, 1, 0).unwrap(), IndexEntry { last_lsn: None, ..e });
        let mut one = v1.clone();
        one[KEY_SIZE_BYTES + 16..].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(IndexEntry::decode(&one, 1, 0).unwrap(), IndexEntry { last_lsn: Some(Lsn(3)), value_count: 1, ..e });
    }

    #[test]
    fn entries_decode_with_bounds_checks() {
        let mut block = Vec::new();
        encode_entry(&mut block, Key::MIN, Lsn(5), 1, b"abc");
        let (e, next) = decode_entry(&block, 0).unwrap().unwrap();
        assert_eq!((e.key, e.lsn, e.tag, &block[e.payload]), (Key::MIN, Lsn(5), 1, &b"abc"[..]));
        assert_eq!(decode_entry(&block, next).unwrap(), None);
        for cut in 1..block.len() {
            assert!(decode_entry(&block[..cut], 0).is_err(), "truncation at {cut} not detected");
        }
    }
}
