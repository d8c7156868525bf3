//! pglz decompression, PostgreSQL's own LZ77 variant (`common/pg_lzcompress.c`).
//!
//! `wal_compression = pglz` stores full-page images in this format. It is small enough to
//! carry here instead of binding to C: a control byte announces eight items, each either a
//! literal byte (bit clear) or a back-reference (bit set) of two bytes, `len - 3` in the low
//! nibble and the high four bits of the offset in the high nibble, then the low eight bits
//! of the offset; a length nibble of 15 means a third byte adds up to 255 more.
//!
//! Unlike the C version this one cannot read or write out of bounds whatever the input,
//! and, as `pglz_decompress(..., check_complete = true)` does, it insists that the input
//! is used up exactly when the output reaches the expected size.

/// Why a pglz stream could not be decompressed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PglzError {
    #[error("pglz match tag truncated at input offset {offset}")]
    TruncatedTag { offset: usize },
    #[error("pglz back-reference offset {distance} at output offset {output_len} points before the start")]
    InvalidDistance { distance: usize, output_len: usize },
    #[error("pglz data decompressed to {produced} bytes using {consumed} of {input_len} input bytes, expected {expected} bytes")]
    SizeMismatch { produced: usize, consumed: usize, input_len: usize, expected: usize },
}

/// Decompresses `src` into exactly `raw_len` bytes.
pub fn decompress(src: &[u8], raw_len: usize) -> Result<Vec<u8>, PglzError> {
    let mut out: Vec<u8> = Vec::with_capacity(raw_len);
    let mut sp = 0;
    while sp < src.len() && out.len() < raw_len {
        let mut ctrl = src[sp];
        sp += 1;
        for _ in 0..8 {
            if sp >= src.len() || out.len() >= raw_len {
                break;
            }
            if ctrl & 1 != 0 {
                if sp + 2 > src.len() {
                    return Err(PglzError::TruncatedTag { offset: sp });
                }
                let mut len = usize::from(src[sp] & 0x0f) + 3;
                let distance = (usize::from(src[sp] & 0xf0) << 4) | usize::from(src[sp + 1]);
                sp += 2;
                if len == 18 {
                    let Some(&extra) = src.get(sp) else {
                        return Err(PglzError::TruncatedTag { offset: sp });
                    };
                    len += usize::from(extra);
                    sp += 1;
                }
                // A zero distance would repeat nothing forever and a distance past the start
                // would read outside the output: both mean corrupt input.
                if distance == 0 || distance > out.len() {
                    return Err(PglzError::InvalidDistance { distance, output_len: out.len() });
                }
                len = len.min(raw_len - out.len());
                // The source may overlap the bytes being produced (a run), so copy byte by
                // byte from a start that stays `distance` behind.
                let start = out.len() - distance;
                for i in 0..len {
                    let b = out[start + i];
                    out.push(b);
                }
            } else {
                out.push(src[sp]);
                sp += 1;
            }
            ctrl >>= 1;
        }
    }
    if out.len() != raw_len || sp != src.len() {
        return Err(PglzError::SizeMismatch { produced: out.len(), consumed: sp, input_len: src.len(), expected: raw_len });
    }
    Ok(out)
}

/// A simple greedy pglz compressor, used by tests to make images PostgreSQL would accept.
/// It does not try to match PostgreSQL's output byte for byte, only its format.
#[cfg(test)]
pub(crate) fn compress(src: &[u8]) -> Vec<u8> {
    const MAX_DISTANCE: usize = 4095;
    const MAX_LEN: usize = 273;
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < src.len() {
        let ctrl_at = out.len();
        out.push(0u8);
        for bit in 0..8 {
            if pos >= src.len() {
                break;
            }
            let (mut best_len, mut best_distance) = (0, 0);
            for distance in 1..=pos.min(MAX_DISTANCE) {
                let mut len = 0;
                while len < MAX_LEN && pos + len < src.len() && src[pos + len] == src[pos + len - distance] {
                    len += 1;
                }
                if len > best_len {
                    (best_len, best_distance) = (len, distance);
                }
            }
            if best_len >= 3 {
                out[ctrl_at] |= 1 << bit;
                let nibble = (best_len - 3).min(15) as u8;
                out.push((((best_distance >> 4) & 0xf0) as u8) | nibble);
                out.push((best_distance & 0xff) as u8);
                if best_len >= 18 {
                    out.push((best_len - 18) as u8);
                }
                pos += best_len;
            } else {
                out.push(src[pos]);
                pos += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn decodes_literals_and_overlapping_runs() {
        // "11234" then a match of length 16 at distance 4: the example in pg_lzcompress.c.
        let src = [0b0010_0000, b'1', b'1', b'2', b'3', b'4', 0x0d, 0x04];
        assert_eq!(decompress(&src, 21).unwrap(), b"112341234123412341234");
    }

    #[test]
    fn rejects_corrupt_input() {
        assert!(matches!(decompress(&[0x01, 0x00, 0x00], 10), Err(PglzError::InvalidDistance { .. })));
        assert!(matches!(decompress(&[0x00, b'a', 0x01], 10), Err(PglzError::SizeMismatch { .. })));
        assert!(matches!(decompress(&[0x02, b'a', 0x0f], 30), Err(PglzError::TruncatedTag { .. })));
        assert!(matches!(decompress(&[0x00, b'a', b'b'], 1), Err(PglzError::SizeMismatch { .. })));
    }

    #[test]
    fn page_of_zeros_compresses_and_round_trips() {
        let page = vec![0u8; 8192];
        let packed = compress(&page);
        assert!(packed.len() < 200, "{}", packed.len());
        assert_eq!(decompress(&packed, page.len()).unwrap(), page);
    }

    proptest! {
        #[test]
        fn round_trips(data in proptest::collection::vec(prop_oneof![Just(0u8), Just(1u8), any::<u8>()], 0..2000)) {
            let packed = compress(&data);
            prop_assert_eq!(decompress(&packed, data.len()).unwrap(), data);
        }

        #[test]
        fn never_panics(src in proptest::collection::vec(any::<u8>(), 0..300), raw_len in 0usize..2000) {
            let _ = decompress(&src, raw_len);
        }
    }
}
