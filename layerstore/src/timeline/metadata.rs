//! The timeline metadata file: what a timeline must know about itself to load.
//!
//! One small binary file, `metadata`, in the timeline directory, rewritten whole and
//! crash-safely (temporary file, fsync, rename, fsync directory) whenever a field changes:
//! after a flush (disk-consistent LSN), and before GC removes anything (GC cutoff). Layout,
//! integers little-endian:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `FJTLMETA` |
//! | 8 | 2 | format version, 1 |
//! | 10 | 2 | flags: bit 0 = has an ancestor; other bits zero |
//! | 12 | 16 | this timeline's id (catches a file copied into the wrong directory) |
//! | 28 | 8 | disk-consistent LSN |
//! | 36 | 16 | ancestor timeline id, zero without an ancestor |
//! | 52 | 8 | ancestor LSN (the branch point), zero without an ancestor |
//! | 60 | 8 | latest GC cutoff LSN |
//! | 68 | 4 | CRC-32C of bytes 0..68 |
//!
//! Invariants: the disk-consistent LSN never decreases and is at least the ancestor LSN;
//! the GC cutoff never decreases; the ancestor never changes.

use std::path::Path;

use proto::{Lsn, TimelineId};

use crate::error::LayerError;

pub const METADATA_FILE_NAME: &str = "metadata";
const MAGIC: [u8; 8] = *b"FJTLMETA";
const FORMAT_VERSION: u16 = 1;
const SIZE_BYTES: usize = 72;
const FLAG_HAS_ANCESTOR: u16 = 1;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimelineMetadata {
    pub timeline_id: TimelineId,
    /// Every version with LSN at or below this is in layer files.
    pub disk_consistent_lsn: Lsn,
    /// The timeline this one branched from, and the LSN it branched at.
    pub ancestor: Option<(TimelineId, Lsn)>,
    /// Reads below this LSN are refused; GC may have removed what they need.
    pub latest_gc_cutoff: Lsn,
}

impl TimelineMetadata {
    pub fn encode(&self) -> [u8; SIZE_BYTES] {
        let mut b = [0u8; SIZE_BYTES];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        let flags = if self.ancestor.is_some() { FLAG_HAS_ANCESTOR } else { 0 };
        b[10..12].copy_from_slice(&flags.to_le_bytes());
        b[12..28].copy_from_slice(self.timeline_id.as_bytes());
        b[28..36].copy_from_slice(&self.disk_consistent_lsn.0.to_le_bytes());
        if let Some((id, lsn)) = self.ancestor {
            b[36..52].copy_from_slice(id.as_bytes());
            b[52..60].copy_from_slice(&lsn.0.to_le_bytes());
        }
        b[60..68].copy_from_slice(&self.latest_gc_cutoff.0.to_le_bytes());
        let crc = crc32c::crc32c(&b[..68]);
        b[68..72].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and checks the bytes of the metadata file at `path` (for errors).
    pub fn decode(bytes: &[u8], path: &Path) -> Result<TimelineMetadata, LayerError> {
        let corrupt = |offset: u64, reason: String| LayerError::corrupt(path, offset, reason);
        if bytes.len() != SIZE_BYTES {
            return Err(corrupt(0, format!("metadata file has {} bytes, expected {SIZE_BYTES}", bytes.len())));
        }
        if bytes[0..8] != MAGIC {
            return Err(corrupt(0, format!("bad magic {:02X?}", &bytes[0..8])));
        }
        let version = u16::from_le_bytes([bytes[8], bytes[9]]);
        if version != FORMAT_VERSION {
            return Err(LayerError::UnsupportedVersion {
                path: path.to_path_buf(),
                offset: 8,
                version,
                supported: FORMAT_VERSION..=FORMAT_VERSION,
            });
        }
        let crc = crc32c::crc32c(&bytes[..68]);
        let stored = u32::from_le_bytes([bytes[68], bytes[69], bytes[70], bytes[71]]);
        if crc != stored {
            return Err(corrupt(68, format!("checksum mismatch: stored {stored:08X}, computed {crc:08X}")));
        }
        let u64_at = |at: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(a)
        };
        let id_at = |at: usize| {
            let mut a = [0u8; 16];
            a.copy_from_slice(&bytes[at..at + 16]);
            TimelineId::from_bytes(a)
        };
        let flags = u16::from_le_bytes([bytes[10], bytes[11]]);
        let ancestor = match flags {
            0 if bytes[36..60].iter().all(|&b| b == 0) => None,
            FLAG_HAS_ANCESTOR => Some((id_at(36), Lsn(u64_at(52)))),
            _ => return Err(corrupt(10, format!("invalid flags {flags:#06x} or ancestor fields"))),
        };
        let meta =
            TimelineMetadata { timeline_id: id_at(12), disk_consistent_lsn: Lsn(u64_at(28)), ancestor, latest_gc_cutoff: Lsn(u64_at(60)) };
        if let Some((_, ancestor_lsn)) = meta.ancestor {
            if meta.disk_consistent_lsn < ancestor_lsn {
                return Err(corrupt(28, format!("disk-consistent LSN {} below the branch point {ancestor_lsn}", meta.disk_consistent_lsn)));
            }
        }
        Ok(meta)
    }

    /// Reads the metadata file of the timeline in `dir`, checking that it belongs there.
    pub fn read(dir: &Path, expected_id: TimelineId) -> Result<TimelineMetadata, LayerError> {
        let path = dir.join(METADATA_FILE_NAME);
        let bytes = std::fs::read(&path).map_err(|e| LayerError::io("read", &path, e))?;
        let meta = TimelineMetadata::decode(&bytes, &path)?;
        if meta.timeline_id != expected_id {
            return Err(LayerError::corrupt(&path, 12, format!("file belongs to timeline {}, not {expected_id}", meta.timeline_id)));
        }
        Ok(meta)
    }

    /// Replaces the metadata file of the timeline in `dir`, crash-safely.
    pub fn write(&self, dir: &Path) -> Result<(), LayerError> {
        let path = dir.join(METADATA_FILE_NAME);
        crashsafe::write_file_atomic(&path, &self.encode()).map_err(|e| LayerError::io("write", &path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ancestor: bool) -> TimelineMetadata {
        TimelineMetadata {
            timeline_id: TimelineId::from_bytes([7; 16]),
            disk_consistent_lsn: Lsn(0x1_0000_0200),
            ancestor: ancestor.then(|| (TimelineId::from_bytes([9; 16]), Lsn(0x100))),
            latest_gc_cutoff: Lsn(0x80),
        }
    }

    #[test]
    fn round_trips_through_a_file() {
        let dir = tempfile::tempdir().unwrap();
        for ancestor in [false, true] {
            let meta = sample(ancestor);
            meta.write(dir.path()).unwrap();
            assert_eq!(TimelineMetadata::read(dir.path(), meta.timeline_id).unwrap(), meta);
        }
        let err = TimelineMetadata::read(dir.path(), TimelineId::from_bytes([1; 16])).unwrap_err();
        assert!(err.to_string().contains("belongs to timeline 0707"), "{err}");
    }

    #[test]
    fn every_flipped_bit_is_detected() {
        let path = Path::new("/x/metadata");
        for ancestor in [false, true] {
            let bytes = sample(ancestor).encode();
            for i in 0..bytes.len() {
                for bit in 0..8 {
                    let mut bad = bytes;
                    bad[i] ^= 1 << bit;
                    let err = TimelineMetadata::decode(&bad, path).unwrap_err();
                    assert!(err.is_corruption(), "flip at {i}.{bit}: {err}");
                    assert!(err.to_string().starts_with("file /x/metadata "), "{err}");
                }
            }
            assert!(TimelineMetadata::decode(&bytes[..71], path).is_err());
        }
    }

    #[test]
    fn newer_version_is_named() {
        let mut bytes = sample(false).encode();
        bytes[8] = 2;
        let err = TimelineMetadata::decode(&bytes, Path::new("m")).unwrap_err();
        assert_eq!(err.to_string(), "file m has format version 2 (at offset 8), this build reads only version 1");
    }
}
