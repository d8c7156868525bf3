//! Full-page images: `XLogRecordBlockImageHeader` and `RestoreBlockImage`.
//!
//! A block reference may carry a copy of the whole 8 KiB page, minus its "hole" (the zeroed
//! gap between the line pointers and the tuples), optionally compressed with pglz, LZ4 or
//! zstd (`wal_compression`). `BlockImage` keeps the bytes as they were in the record; the
//! page is rebuilt only on request, because most images are stored and only a few are read.
//!
//! Invariant: a `BlockImage` has passed `DecodeXLogRecord`'s cross-checks, so its hole lies
//! inside the page and its stored length is consistent with the hole and compression flags;
//! `restore_page` still checks the decompressed size, which PostgreSQL 15 trusts for LZ4 and
//! zstd.

use bytes::Bytes;

use crate::consts::*;
use crate::pglz;

/// How an image's bytes are compressed (`BKPIMAGE_COMPRESS_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ImageCompression {
    None,
    Pglz,
    Lz4,
    Zstd,
}

impl ImageCompression {
    /// The method named by `bimg_info`, or `None` if more than one bit is set, which
    /// PostgreSQL would report as "compressed with unknown method".
    pub fn from_bimg_info(bimg_info: u8) -> Option<ImageCompression> {
        match bimg_info & BKPIMAGE_COMPRESS_MASK {
            0 => Some(ImageCompression::None),
            BKPIMAGE_COMPRESS_PGLZ => Some(ImageCompression::Pglz),
            BKPIMAGE_COMPRESS_LZ4 => Some(ImageCompression::Lz4),
            BKPIMAGE_COMPRESS_ZSTD => Some(ImageCompression::Zstd),
            _ => None,
        }
    }

    pub fn bimg_flag(self) -> u8 {
        match self {
            ImageCompression::None => 0,
            ImageCompression::Pglz => BKPIMAGE_COMPRESS_PGLZ,
            ImageCompression::Lz4 => BKPIMAGE_COMPRESS_LZ4,
            ImageCompression::Zstd => BKPIMAGE_COMPRESS_ZSTD,
        }
    }
}

/// A full-page image attached to a block reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockImage {
    /// `bimg_info`: the `BKPIMAGE_*` flags.
    pub bimg_info: u8,
    /// Bytes of the page before the hole.
    pub hole_offset: u16,
    /// Bytes of zeros removed from the page at `hole_offset`.
    pub hole_length: u16,
    pub compression: ImageCompression,
    /// The stored image: `BLCKSZ - hole_length` bytes of page, or their compressed form.
    pub stored: Bytes,
}

impl BlockImage {
    /// `BKPIMAGE_APPLY`: redo must restore this image (rather than it being there only for
    /// `wal_consistency_checking`). An image without it does not replace the page.
    pub fn apply(&self) -> bool {
        self.bimg_info & BKPIMAGE_APPLY != 0
    }

    /// Rebuilds the 8192-byte page: decompresses, checks the size, and puts the hole back.
    /// Errors are messages for `WalError::InvalidImage`, which adds the record's LSN.
    pub fn restore_page(&self) -> Result<Bytes, String> {
        let hole_offset = usize::from(self.hole_offset);
        let hole_length = usize::from(self.hole_length);
        if hole_offset + hole_length > BLCKSZ {
            return Err(format!("hole at offset {hole_offset} of length {hole_length} exceeds the page"));
        }
        let raw_len = BLCKSZ - hole_length;
        let raw: Vec<u8> = match self.compression {
            ImageCompression::None => self.stored.to_vec(),
            ImageCompression::Pglz => {
                pglz::decompress(&self.stored, raw_len).map_err(|e| format!("could not decompress pglz image: {e}"))?
            }
            ImageCompression::Lz4 => {
                let mut out = vec![0u8; raw_len];
                let n =
                    lz4_flex::block::decompress_into(&self.stored, &mut out).map_err(|e| format!("could not decompress lz4 image: {e}"))?;
                out.truncate(n);
                out
            }
            ImageCompression::Zstd => {
                zstd::bulk::decompress(&self.stored, raw_len).map_err(|e| format!("could not decompress zstd image: {e}"))?
            }
        };
        if raw.len() != raw_len {
            return Err(format!("image has {} bytes, expected {raw_len} with a hole of {hole_length}", raw.len()));
        }
        let mut page = Vec::with_capacity(BLCKSZ);
        page.extend_from_slice(&raw[..hole_offset]);
        page.resize(hole_offset + hole_length, 0);
        page.extend_from_slice(&raw[hole_offset..]);
        debug_assert_eq!(page.len(), BLCKSZ);
        Ok(Bytes::from(page))
    }
}

/// Cuts the hole out of `page` and compresses the rest, as `XLogRecordAssemble` does; tests
/// use it to make images. Like PostgreSQL, it stores the page uncompressed when compression
/// would not save space.
#[cfg(test)]
pub(crate) fn make_block_image(page: &[u8; BLCKSZ], hole_offset: u16, hole_length: u16, compression: ImageCompression) -> BlockImage {
    let (start, len) = (usize::from(hole_offset), usize::from(hole_length));
    let (start, len) = if len == 0 || start == 0 || start + len > BLCKSZ { (0, 0) } else { (start, len) };
    let mut raw = page[..start].to_vec();
    raw.extend_from_slice(&page[start + len..]);
    let compressed = match compression {
        ImageCompression::None => None,
        ImageCompression::Pglz => Some(pglz::compress(&raw)),
        ImageCompression::Lz4 => Some(lz4_flex::block::compress(&raw)),
        // zstd level 1 cannot fail on an in-memory slice; if it did, store the page raw.
        ImageCompression::Zstd => zstd::bulk::compress(&raw, 1).ok(),
    };
    let hole_info = if len > 0 { BKPIMAGE_HAS_HOLE } else { 0 };
    // PostgreSQL keeps a compressed image only if it saves more than the 2-byte
    // hole_length field it adds.
    let saved_enough = |c: &Vec<u8>| c.len() + usize::from(len > 0) * 2 < raw.len();
    match compressed.filter(saved_enough) {
        Some(stored) => BlockImage {
            bimg_info: BKPIMAGE_APPLY | hole_info | compression.bimg_flag(),
            hole_offset: start as u16,
            hole_length: len as u16,
            compression,
            stored: Bytes::from(stored),
        },
        None => BlockImage {
            bimg_info: BKPIMAGE_APPLY | hole_info,
            hole_offset: start as u16,
            hole_length: len as u16,
            compression: ImageCompression::None,
            stored: Bytes::from(raw),
        },
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A page that looks like a heap page: header, line pointers, a hole, tuples.
    pub(crate) fn sample_page(seed: u8) -> [u8; BLCKSZ] {
        let mut page = [0u8; BLCKSZ];
        for (i, b) in page[..200].iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(7).wrapping_add(seed);
        }
        for (i, b) in page[6000..].iter_mut().enumerate() {
            *b = ((i / 13) as u8).wrapping_add(seed);
        }
        page
    }

    #[test]
    fn every_compression_restores_the_page_with_its_hole() {
        let page = sample_page(3);
        for compression in [ImageCompression::None, ImageCompression::Pglz, ImageCompression::Lz4, ImageCompression::Zstd] {
            for (hole_offset, hole_length) in [(200, 5800), (0, 0)] {
                let image = make_block_image(&page, hole_offset, hole_length, compression);
                assert_eq!(image.compression, compression, "{compression:?} should pay off on this page");
                assert!(image.apply());
                assert_eq!(&image.restore_page().unwrap()[..], &page[..], "{compression:?} hole {hole_length}");
            }
        }
    }

    #[test]
    fn corrupt_images_are_errors() {
        let page = sample_page(9);
        for compression in [ImageCompression::Pglz, ImageCompression::Lz4, ImageCompression::Zstd] {
            let mut image = make_block_image(&page, 200, 5800, compression);
            let mut stored = image.stored.to_vec();
            stored.truncate(stored.len() / 2);
            image.stored = Bytes::from(stored);
            assert!(image.restore_page().is_err(), "{compression:?}");
        }
        let mut image = make_block_image(&page, 200, 5800, ImageCompression::None);
        image.hole_length = 100;
        assert!(image.restore_page().unwrap_err().contains("expected 8092"));
        image.hole_offset = 8190;
        assert!(image.restore_page().unwrap_err().contains("exceeds the page"));
    }
}
