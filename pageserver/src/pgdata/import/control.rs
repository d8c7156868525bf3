//! `global/pg_control`: the fields of PostgreSQL 15's `ControlFileData` that import needs,
//! and the rewrite a basebackup makes of it (`ControlFile::for_start_at`).
//!
//! Offsets are those of `catalog/pg_control.h` on a 64-bit little-endian build (checked
//! with `offsetof` against the headers our build installs): the file is a C struct
//! followed by zeros up to 8192 bytes, with a CRC-32C of the struct up to `crc`.
//!
//! Invariant: `ControlFile::parse` accepts only a file whose CRC, version, page and segment
//! sizes match what fjord supports, and without data checksums; every other field is taken
//! as PostgreSQL wrote it.
//!
//! Data checksums cannot work: a page the pageserver rebuilds from WAL keeps the checksum
//! of whatever version its base image had, and with full-page writes off nothing WAL-logs
//! a hint-bit change, so a compute would report checksum failures on good pages.

use anyhow::{bail, ensure};
use proto::lsn::WAL_SEGMENT_SIZE_BYTES;
use proto::page::PAGE_SIZE_BYTES;
use proto::Lsn;

/// `PG_CONTROL_VERSION` of PostgreSQL 15.
pub const PG_CONTROL_VERSION: u32 = 1300;
/// `PG_CONTROL_FILE_SIZE`.
pub const PG_CONTROL_FILE_SIZE_BYTES: usize = 8192;
/// `DBState`: `DB_SHUTDOWNED`, a cleanly shut down primary.
const DB_SHUTDOWNED: u32 = 1;

const OFFSET_SYSTEM_IDENTIFIER: usize = 0;
const OFFSET_CONTROL_VERSION: usize = 8;
const OFFSET_CATALOG_VERSION: usize = 12;
const OFFSET_STATE: usize = 16;
const OFFSET_TIME: usize = 24;
const OFFSET_CHECKPOINT: usize = 32;
const OFFSET_CHECKPOINT_COPY: usize = 40;
const OFFSET_MIN_RECOVERY_POINT: usize = 136;
const OFFSET_MIN_RECOVERY_POINT_TLI: usize = 144;
const OFFSET_BACKUP_START_POINT: usize = 152;
const OFFSET_BACKUP_END_POINT: usize = 160;
const OFFSET_BACKUP_END_REQUIRED: usize = 168;
/// `ThisTimeLineID` inside `CheckPoint`.
const OFFSET_CHECKPOINT_TLI: usize = OFFSET_CHECKPOINT_COPY + 8;
const OFFSET_BLCKSZ: usize = 216;
const OFFSET_XLOG_BLCKSZ: usize = 224;
const OFFSET_XLOG_SEG_SIZE: usize = 228;
const OFFSET_DATA_CHECKSUM_VERSION: usize = 252;
const OFFSET_CRC: usize = 288;

/// The parsed control file, with the raw bytes kept for the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControlFile {
    pub system_identifier: u64,
    pub catalog_version: u32,
    /// `DBState`: 1 is `DB_SHUTDOWNED`.
    pub state: u32,
    /// Where the latest checkpoint record starts.
    pub checkpoint_lsn: Lsn,
    /// `checkPointCopy`: the `CheckPoint` struct as in the checkpoint record's main data.
    pub checkpoint_copy: Vec<u8>,
    /// The timeline of the latest checkpoint (`checkPointCopy.ThisTimeLineID`).
    pub timeline_id: u32,
    pub raw: Vec<u8>,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

impl ControlFile {
    pub fn parse(raw: &[u8]) -> anyhow::Result<ControlFile> {
        ensure!(raw.len() == PG_CONTROL_FILE_SIZE_BYTES, "control file has {} bytes, expected {PG_CONTROL_FILE_SIZE_BYTES}", raw.len());
        let version = u32_at(raw, OFFSET_CONTROL_VERSION);
        if version != PG_CONTROL_VERSION {
            bail!("control file has pg_control_version {version}, expected {PG_CONTROL_VERSION} (PostgreSQL 15)");
        }
        let stored = u32_at(raw, OFFSET_CRC);
        let computed = crc32c::crc32c(&raw[..OFFSET_CRC]);
        if stored != computed {
            bail!("incorrect checksum in control file: stored {stored:08X}, computed {computed:08X}");
        }
        let blcksz = u32_at(raw, OFFSET_BLCKSZ);
        let xlog_blcksz = u32_at(raw, OFFSET_XLOG_BLCKSZ);
        let seg_size = u32_at(raw, OFFSET_XLOG_SEG_SIZE);
        ensure!(blcksz as usize == PAGE_SIZE_BYTES, "control file says BLCKSZ is {blcksz}, fjord supports only {PAGE_SIZE_BYTES}");
        ensure!(xlog_blcksz == 8192, "control file says XLOG_BLCKSZ is {xlog_blcksz}, fjord supports only 8192");
        ensure!(
            u64::from(seg_size) == WAL_SEGMENT_SIZE_BYTES,
            "control file says the WAL segment size is {seg_size}, fjord supports only {WAL_SEGMENT_SIZE_BYTES}"
        );
        let checksums = u32_at(raw, OFFSET_DATA_CHECKSUM_VERSION);
        ensure!(
            checksums == 0,
            "the cluster has data checksums on (version {checksums}); fjord needs a cluster made by initdb without \
             --data-checksums (pages rebuilt from WAL carry no valid checksum)"
        );
        Ok(ControlFile {
            system_identifier: u64::from_le_bytes(raw[OFFSET_SYSTEM_IDENTIFIER..8].try_into().expect("8 bytes")),
            catalog_version: u32_at(raw, OFFSET_CATALOG_VERSION),
            state: u32_at(raw, OFFSET_STATE),
            checkpoint_lsn: Lsn(u64::from_le_bytes(raw[OFFSET_CHECKPOINT..OFFSET_CHECKPOINT + 8].try_into().expect("8 bytes"))),
            checkpoint_copy: raw[OFFSET_CHECKPOINT_COPY..OFFSET_CHECKPOINT_COPY + pgwal::consts::SIZE_OF_CHECKPOINT].to_vec(),
            timeline_id: u32_at(raw, OFFSET_CHECKPOINT_TLI),
            raw: raw.to_vec(),
        })
    }

    pub fn is_shut_down(&self) -> bool {
        self.state == DB_SHUTDOWNED
    }

    /// This control file rewritten for a server that starts at `lsn` without reading WAL:
    /// a shutdown checkpoint at `lsn` (`checkPoint` = `lsn`, `checkPointCopy` =
    /// `checkpoint`, whose redo and timelines the caller set), state `DB_SHUTDOWNED`,
    /// `time` = `now` (seconds since the Unix epoch), no minimum recovery point and no
    /// backup in progress, and a new CRC. Every other field (system identifier, sizes,
    /// settings, `unloggedLSN`) stays as imported; bytes after the struct stay zero.
    pub fn for_start_at(&self, lsn: Lsn, checkpoint: &pgwal::parse::CheckPoint, now: i64) -> Vec<u8> {
        let mut raw = self.raw.clone();
        let mut put = |offset: usize, bytes: &[u8]| raw[offset..offset + bytes.len()].copy_from_slice(bytes);
        put(OFFSET_STATE, &DB_SHUTDOWNED.to_le_bytes());
        put(OFFSET_TIME, &now.to_le_bytes());
        put(OFFSET_CHECKPOINT, &lsn.0.to_le_bytes());
        put(OFFSET_CHECKPOINT_COPY, &checkpoint.to_bytes());
        put(OFFSET_MIN_RECOVERY_POINT, &0u64.to_le_bytes());
        put(OFFSET_MIN_RECOVERY_POINT_TLI, &0u32.to_le_bytes());
        put(OFFSET_BACKUP_START_POINT, &0u64.to_le_bytes());
        put(OFFSET_BACKUP_END_POINT, &0u64.to_le_bytes());
        put(OFFSET_BACKUP_END_REQUIRED, &[0]);
        let crc = crc32c::crc32c(&raw[..OFFSET_CRC]);
        raw[OFFSET_CRC..OFFSET_CRC + 4].copy_from_slice(&crc.to_le_bytes());
        raw
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let mut raw = vec![0u8; PG_CONTROL_FILE_SIZE_BYTES];
        raw[0..8].copy_from_slice(&0x1234_5678_9abc_def0u64.to_le_bytes());
        raw[8..12].copy_from_slice(&PG_CONTROL_VERSION.to_le_bytes());
        raw[12..16].copy_from_slice(&202209061u32.to_le_bytes());
        raw[16..20].copy_from_slice(&DB_SHUTDOWNED.to_le_bytes());
        raw[32..40].copy_from_slice(&0x0100_0028u64.to_le_bytes());
        raw[48..52].copy_from_slice(&1u32.to_le_bytes());
        raw[216..220].copy_from_slice(&8192u32.to_le_bytes());
        raw[224..228].copy_from_slice(&8192u32.to_le_bytes());
        raw[228..232].copy_from_slice(&(16u32 << 20).to_le_bytes());
        let crc = crc32c::crc32c(&raw[..OFFSET_CRC]);
        raw[OFFSET_CRC..OFFSET_CRC + 4].copy_from_slice(&crc.to_le_bytes());
        raw
    }

    #[test]
    fn parses_fields_and_checks_crc_and_sizes() {
        let cf = ControlFile::parse(&sample()).unwrap();
        assert_eq!(cf.system_identifier, 0x1234_5678_9abc_def0);
        assert_eq!(cf.checkpoint_lsn, Lsn(0x0100_0028));
        assert_eq!(cf.timeline_id, 1);
        assert!(cf.is_shut_down());
        assert_eq!(cf.checkpoint_copy.len(), 88);

        let mut bad = sample();
        bad[20] ^= 1;
        assert!(ControlFile::parse(&bad).unwrap_err().to_string().starts_with("incorrect checksum in control file"));
        let mut bad = sample();
        bad[8] = 0;
        assert!(ControlFile::parse(&bad).unwrap_err().to_string().contains("pg_control_version"));
        assert!(ControlFile::parse(&sample()[..100]).is_err());
        let mut checksums = sample();
        checksums[OFFSET_DATA_CHECKSUM_VERSION] = 1;
        let crc = crc32c::crc32c(&checksums[..OFFSET_CRC]);
        checksums[OFFSET_CRC..OFFSET_CRC + 4].copy_from_slice(&crc.to_le_bytes());
        assert!(ControlFile::parse(&checksums).unwrap_err().to_string().contains("data checksums on"));
    }

    #[test]
    fn rewritten_for_a_start_round_trips_with_a_valid_crc() {
        let mut raw = sample();
        raw[OFFSET_STATE..OFFSET_STATE + 4].copy_from_slice(&4u32.to_le_bytes()); // DB_SHUTDOWNED_IN_RECOVERY
        raw[OFFSET_MIN_RECOVERY_POINT..OFFSET_MIN_RECOVERY_POINT + 8].copy_from_slice(&77u64.to_le_bytes());
        raw[OFFSET_BACKUP_END_REQUIRED] = 1;
        raw[2000] = 0; // beyond the struct: stays as is
        let crc = crc32c::crc32c(&raw[..OFFSET_CRC]);
        raw[OFFSET_CRC..OFFSET_CRC + 4].copy_from_slice(&crc.to_le_bytes());
        let cf = ControlFile::parse(&raw).unwrap();
        let mut cp = pgwal::parse::CheckPoint::from_bytes(&cf.checkpoint_copy).unwrap();
        cp.redo = Lsn(0x0300_1234);
        cp.next_xid = pgwal::FullTransactionId(0x1_0000_0400);
        cp.next_oid = 24576;
        let new = cf.for_start_at(Lsn(0x0300_1234), &cp, 1_700_000_000);
        assert_eq!(new.len(), PG_CONTROL_FILE_SIZE_BYTES);
        let parsed = ControlFile::parse(&new).expect("the CRC is recomputed");
        assert!(parsed.is_shut_down());
        assert_eq!(parsed.checkpoint_lsn, Lsn(0x0300_1234));
        assert_eq!(parsed.system_identifier, cf.system_identifier);
        assert_eq!(pgwal::parse::CheckPoint::from_bytes(&parsed.checkpoint_copy).unwrap(), cp);
        assert_eq!(&new[OFFSET_TIME..OFFSET_TIME + 8], &1_700_000_000i64.to_le_bytes());
        assert_eq!(&new[OFFSET_MIN_RECOVERY_POINT..OFFSET_MIN_RECOVERY_POINT + 8], &[0; 8]);
        assert_eq!(new[OFFSET_BACKUP_END_REQUIRED], 0);
        // Only the fields named change.
        let changed: Vec<usize> = (0..new.len()).filter(|&i| new[i] != raw[i]).collect();
        assert!(
            changed.iter().all(|&i| (16..40).contains(&i) || (40..128).contains(&i) || (136..172).contains(&i) || (288..292).contains(&i)),
            "{changed:?}"
        );
    }
}
