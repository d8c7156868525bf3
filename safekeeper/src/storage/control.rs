//! The control file, `safekeeper.control`: what a timeline's acceptor keeps durably besides
//! its WAL bytes.
//!
//! Layout (integers little-endian), followed by a crc32c of everything before it:
//!
//! | bytes | field |
//! |---|---|
//! | 4 | magic `FJSK` |
//! | 4 | format version (4; 1 to 3 are read too) |
//! | 16 | tenant id |
//! | 16 | timeline id |
//! | 8 | PostgreSQL system identifier of the WAL |
//! | 4 | WAL segment size in bytes |
//! | 8 | term |
//! | 4 + 16 n | term history: n, then n × (term, LSN) |
//! | 8 | commit LSN |
//! | 8 | the WAL's beginning LSN when this file was written (informational: the durable
//! |   | beginning and end live together in `wal.end`, see [`super::wal`]) |
//! | 8 | peer horizon (version 2) |
//! | 8 | the pageserver's remote-consistent LSN (version 2) |
//! | 4 | flags (version 3): bit 0, a *learner* (`quorum`'s "Learners"); others must be 0 |
//! | 4 | the attachment generation of the pageserver that reported the remote-consistent LSN (version 4; 0: none known) |
//! | 4 | crc32c |
//!
//! Version 1 had neither of the two LSNs of version 2: such a file is read with both 0
//! (nothing may be removed until they are learnt again). Versions 1 and 2 had no flags: a
//! voter (they knew no learners). Versions before 4 had no generation: 0, which any
//! pageserver's next report replaces. The next write makes any of them version 4. A
//! safekeeper does not read versions after its own: downgrading is not supported.
//!
//! The file is replaced atomically (write a temporary file, fsync it, rename it over the
//! old one, fsync the directory), so a crash leaves either the old or the new contents.
//! A file that fails its checksum or cannot be parsed is corruption: the caller reports the
//! timeline unusable and never rewrites the file.

use anyhow::Context;
use proto::{Lsn, TenantId, TimelineId};
use quorum::{Term, TermHistory, TermSwitch};
use std::path::Path;

pub const CONTROL_FILE_NAME: &str = "safekeeper.control";
const MAGIC: [u8; 4] = *b"FJSK";
const FORMAT_VERSION: u32 = 4;
/// Flags (version 3): the acceptor is a learner.
const FLAG_LEARNER: u32 = 1;
/// The oldest format version this safekeeper still reads.
const FORMAT_VERSION_OLDEST: u32 = 1;
/// A history longer than this is not something the wire would accept either.
const HISTORY_ENTRIES_MAX: usize = quorum::wire::HISTORY_ENTRIES_MAX;

/// The contents of a control file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControlFile {
    pub tenant: TenantId,
    pub timeline: TimelineId,
    pub system_id: u64,
    pub wal_segment_size: u32,
    pub term: Term,
    pub history: TermHistory,
    pub commit_lsn: Lsn,
    pub wal_begin: Lsn,
    /// The highest peer horizon received (see `quorum`'s "WAL removal"); WAL may be
    /// removed only below it.
    pub peer_horizon_lsn: Lsn,
    /// The remote-consistent LSN the pageserver of the newest attachment generation
    /// reported (the highest it reported): WAL below it is in object storage. 0: never
    /// reported.
    pub remote_consistent_lsn: Lsn,
    /// The attachment generation that reported `remote_consistent_lsn` (version 4; 0: none
    /// known, as from a pageserver without object storage).
    pub remote_consistent_generation: u32,
    /// Created without a record of the timeline: no vote until it caught up (`quorum`'s
    /// "Learners").
    pub learner: bool,
}

/// Why a control file cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ControlFileError {
    #[error("control file is {0} bytes, too short to be one")]
    TooShort(usize),
    #[error("control file has a bad checksum (stored {stored:#010x}, computed {computed:#010x})")]
    Checksum { stored: u32, computed: u32 },
    #[error("control file has bad magic {0:02x?}")]
    Magic([u8; 4]),
    #[error("control file has format version {0}, this safekeeper reads versions {FORMAT_VERSION_OLDEST} to {FORMAT_VERSION}")]
    Version(u32),
    #[error("control file is malformed: {0}")]
    Malformed(String),
}

impl ControlFile {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(128 + 16 * self.history.0.len());
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        b.extend_from_slice(self.tenant.as_bytes());
        b.extend_from_slice(self.timeline.as_bytes());
        b.extend_from_slice(&self.system_id.to_le_bytes());
        b.extend_from_slice(&self.wal_segment_size.to_le_bytes());
        b.extend_from_slice(&self.term.to_le_bytes());
        b.extend_from_slice(&(self.history.0.len() as u32).to_le_bytes());
        for e in &self.history.0 {
            b.extend_from_slice(&e.term.to_le_bytes());
            b.extend_from_slice(&e.lsn.0.to_le_bytes());
        }
        b.extend_from_slice(&self.commit_lsn.0.to_le_bytes());
        b.extend_from_slice(&self.wal_begin.0.to_le_bytes());
        b.extend_from_slice(&self.peer_horizon_lsn.0.to_le_bytes());
        b.extend_from_slice(&self.remote_consistent_lsn.0.to_le_bytes());
        let flags = if self.learner { FLAG_LEARNER } else { 0 };
        b.extend_from_slice(&flags.to_le_bytes());
        b.extend_from_slice(&self.remote_consistent_generation.to_le_bytes());
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(buf: &[u8]) -> Result<ControlFile, ControlFileError> {
        if buf.len() < 4 + 4 + 4 {
            return Err(ControlFileError::TooShort(buf.len()));
        }
        let (body, crc) = buf.split_at(buf.len() - 4);
        let stored = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
        let computed = crc32c::crc32c(body);
        if stored != computed {
            return Err(ControlFileError::Checksum { stored, computed });
        }
        let mut r = Reader(body);
        let magic: [u8; 4] = r.take(4)?.try_into().expect("4 bytes");
        if magic != MAGIC {
            return Err(ControlFileError::Magic(magic));
        }
        let version = r.u32()?;
        if !(FORMAT_VERSION_OLDEST..=FORMAT_VERSION).contains(&version) {
            return Err(ControlFileError::Version(version));
        }
        let tenant = TenantId::from_bytes(r.take(16)?.try_into().expect("16 bytes"));
        let timeline = TimelineId::from_bytes(r.take(16)?.try_into().expect("16 bytes"));
        let system_id = r.u64()?;
        let wal_segment_size = r.u32()?;
        if !wal_segment_size.is_power_of_two() || !(1 << 20..=1 << 30).contains(&wal_segment_size) {
            return Err(ControlFileError::Malformed(format!("WAL segment size {wal_segment_size}")));
        }
        let term = r.u64()?;
        let n = r.u32()? as usize;
        if n > HISTORY_ENTRIES_MAX {
            return Err(ControlFileError::Malformed(format!("term history of {n} entries")));
        }
        let mut history = Vec::with_capacity(n);
        for _ in 0..n {
            let e = TermSwitch { term: r.u64()?, lsn: Lsn(r.u64()?) };
            if history.last().is_some_and(|p: &TermSwitch| e.term <= p.term || e.lsn < p.lsn) {
                return Err(ControlFileError::Malformed("term history is not increasing".into()));
            }
            history.push(e);
        }
        let commit_lsn = Lsn(r.u64()?);
        let wal_begin = Lsn(r.u64()?);
        let (peer_horizon_lsn, remote_consistent_lsn) = if version >= 2 { (Lsn(r.u64()?), Lsn(r.u64()?)) } else { (Lsn(0), Lsn(0)) };
        let flags = if version >= 3 { r.u32()? } else { 0 };
        if flags & !FLAG_LEARNER != 0 {
            return Err(ControlFileError::Malformed(format!("unknown flags {flags:#x}")));
        }
        let remote_consistent_generation = if version >= 4 { r.u32()? } else { 0 };
        if !r.0.is_empty() {
            return Err(ControlFileError::Malformed(format!("{} trailing bytes", r.0.len())));
        }
        if peer_horizon_lsn > commit_lsn {
            return Err(ControlFileError::Malformed(format!("peer horizon {peer_horizon_lsn} is beyond the commit LSN {commit_lsn}")));
        }
        Ok(ControlFile {
            tenant,
            timeline,
            system_id,
            wal_segment_size,
            term,
            history: TermHistory(history),
            commit_lsn,
            wal_begin,
            peer_horizon_lsn,
            remote_consistent_lsn,
            remote_consistent_generation,
            learner: flags & FLAG_LEARNER != 0,
        })
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ControlFileError> {
        if self.0.len() < n {
            return Err(ControlFileError::Malformed("truncated".into()));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u32(&mut self) -> Result<u32, ControlFileError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64, ControlFileError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
}

/// Replaces `dir/name` with `contents` atomically and durably (`crashsafe`: temporary
/// file, fsync, rename, fsync of the directory).
pub fn write_atomic(dir: &Path, name: &str, contents: &[u8]) -> anyhow::Result<()> {
    let path = dir.join(name);
    crashsafe::write_file_atomic(&path, contents).with_context(|| format!("write {} atomically", path.display()))
}

pub fn fsync_dir(dir: &Path) -> anyhow::Result<()> {
    crashsafe::fsync_dir(dir).with_context(|| format!("fsync directory {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ControlFile {
        ControlFile {
            tenant: TenantId::from_bytes([1; 16]),
            timeline: TimelineId::from_bytes([2; 16]),
            system_id: 7,
            wal_segment_size: 16 << 20,
            term: 3,
            history: TermHistory(vec![TermSwitch { term: 1, lsn: Lsn(100) }, TermSwitch { term: 3, lsn: Lsn(200) }]),
            commit_lsn: Lsn(150),
            wal_begin: Lsn(100),
            peer_horizon_lsn: Lsn(120),
            remote_consistent_lsn: Lsn(110),
            remote_consistent_generation: 5,
            learner: true,
        }
    }

    /// A version-1 file as that version wrote it: no peer horizon, no remote-consistent LSN.
    fn encode_v1(c: &ControlFile) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(c.tenant.as_bytes());
        b.extend_from_slice(c.timeline.as_bytes());
        b.extend_from_slice(&c.system_id.to_le_bytes());
        b.extend_from_slice(&c.wal_segment_size.to_le_bytes());
        b.extend_from_slice(&c.term.to_le_bytes());
        b.extend_from_slice(&(c.history.0.len() as u32).to_le_bytes());
        for e in &c.history.0 {
            b.extend_from_slice(&e.term.to_le_bytes());
            b.extend_from_slice(&e.lsn.0.to_le_bytes());
        }
        b.extend_from_slice(&c.commit_lsn.0.to_le_bytes());
        b.extend_from_slice(&c.wal_begin.0.to_le_bytes());
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// A file as version 1, 2 or 3 wrote it: version 1 without the peer horizon and the
    /// remote-consistent LSN, 1 and 2 without flags, none with the generation.
    fn encode_old(c: &ControlFile, version: u32) -> Vec<u8> {
        let mut b = encode_v1(c);
        b.truncate(b.len() - 4);
        b[4..8].copy_from_slice(&version.to_le_bytes());
        if version >= 2 {
            b.extend_from_slice(&c.peer_horizon_lsn.0.to_le_bytes());
            b.extend_from_slice(&c.remote_consistent_lsn.0.to_le_bytes());
        }
        if version >= 3 {
            b.extend_from_slice(&u32::from(c.learner).to_le_bytes());
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    #[test]
    fn versions_1_to_3_are_read_and_rewritten_as_version_4() {
        let v1 = encode_v1(&sample());
        assert_eq!(encode_old(&sample(), 1), v1);
        let c = ControlFile::decode(&v1).unwrap();
        // Everything version 1 had, nothing learnt yet of what may be removed, a voter.
        let nothing = ControlFile {
            peer_horizon_lsn: Lsn(0),
            remote_consistent_lsn: Lsn(0),
            remote_consistent_generation: 0,
            learner: false,
            ..sample()
        };
        assert_eq!(c, nothing);
        let v4 = c.encode();
        assert_eq!(u32::from_le_bytes(v4[4..8].try_into().unwrap()), 4);
        assert_eq!(v4.len(), v1.len() + 24);
        assert_eq!(ControlFile::decode(&v4), Ok(c));
        let v2 = encode_old(&sample(), 2);
        assert_eq!(ControlFile::decode(&v2), Ok(ControlFile { learner: false, remote_consistent_generation: 0, ..sample() }));
        // Version 3: no generation (0, which any pageserver's report replaces).
        let v3 = encode_old(&sample(), 3);
        assert_eq!(ControlFile::decode(&v3), Ok(ControlFile { remote_consistent_generation: 0, ..sample() }));
        assert_eq!(sample().encode().len(), v3.len() + 4);
        // A version-1 file with version 2's fields, or a version-2 file without them, is
        // malformed (the checksums are right).
        let mut long = v1[..v1.len() - 4].to_vec();
        long.extend_from_slice(&[0; 16]);
        long.extend_from_slice(&crc32c::crc32c(&long).to_le_bytes());
        assert_eq!(ControlFile::decode(&long), Err(ControlFileError::Malformed("16 trailing bytes".into())));
        let mut short = v1[..v1.len() - 4].to_vec();
        short[4..8].copy_from_slice(&2u32.to_le_bytes());
        short.extend_from_slice(&crc32c::crc32c(&short).to_le_bytes());
        assert_eq!(ControlFile::decode(&short), Err(ControlFileError::Malformed("truncated".into())));
        // A version-4 file without the generation is malformed too.
        let mut short = v3[..v3.len() - 4].to_vec();
        short[4..8].copy_from_slice(&4u32.to_le_bytes());
        short.extend_from_slice(&crc32c::crc32c(&short).to_le_bytes());
        assert_eq!(ControlFile::decode(&short), Err(ControlFileError::Malformed("truncated".into())));
        // Versions before 1 and after 4 are refused, naming what is read.
        for v in [0u32, 5] {
            let mut b = v4[..v4.len() - 4].to_vec();
            b[4..8].copy_from_slice(&v.to_le_bytes());
            b.extend_from_slice(&crc32c::crc32c(&b).to_le_bytes());
            let e = ControlFile::decode(&b).unwrap_err();
            assert_eq!(e, ControlFileError::Version(v));
            assert_eq!(e.to_string(), format!("control file has format version {v}, this safekeeper reads versions 1 to 4"));
        }
        // Unknown flags are refused.
        let mut b = v4[..v4.len() - 4].to_vec();
        let at = b.len() - 8;
        b[at..at + 4].copy_from_slice(&2u32.to_le_bytes());
        b.extend_from_slice(&crc32c::crc32c(&b).to_le_bytes());
        assert_eq!(ControlFile::decode(&b), Err(ControlFileError::Malformed("unknown flags 0x2".into())));
    }

    #[test]
    fn a_peer_horizon_beyond_the_commit_lsn_is_refused() {
        let c = ControlFile { peer_horizon_lsn: Lsn(151), ..sample() };
        let e = ControlFile::decode(&c.encode()).unwrap_err();
        assert_eq!(e.to_string(), "control file is malformed: peer horizon 0/97 is beyond the commit LSN 0/96");
    }

    #[test]
    fn round_trips() {
        let c = sample();
        assert_eq!(ControlFile::decode(&c.encode()), Ok(c));
    }

    #[test]
    fn every_flipped_byte_is_caught() {
        let bytes = sample().encode();
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert!(ControlFile::decode(&b).is_err(), "flip at {i} not caught");
        }
        for n in 0..bytes.len() {
            assert!(ControlFile::decode(&bytes[..n]).is_err(), "truncation to {n} not caught");
        }
    }
}
