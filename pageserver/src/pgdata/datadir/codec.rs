//! Byte forms of the values under the pageserver's non-page keys: directories, sizes, the
//! checkpoint and the last commit timestamp.
//!
//! A directory is a set, stored whole under one key and rewritten when it changes:
//!
//! ```text
//! [kind u8][version u8][count u32 LE][entry]...      entries strictly ascending
//! ```
//!
//! | directory | kind | entry (little-endian) |
//! |---|---|---|
//! | databases | `D` | spcnode `u32`, dbnode `u32` (8 bytes) |
//! | relations of one database | `R` | relnode `u32`, fork `u8` (5 bytes) |
//! | segments of one SLRU | `S` | segno `u32` (4 bytes) |
//! | prepared transactions | `T` | xid `u32` (4 bytes) |
//!
//! A relation fork's or SLRU segment's size is a `u32` LE block count (4 bytes). The
//! checkpoint value (`StoredCheckpoint`) is
//!
//! ```text
//! [version u8 = 2][start LSN of the latest checkpoint record u64 LE]
//! [the current counters: a CheckPoint struct, 88 bytes as pg_control's checkPointCopy]
//! [the latest checkpoint WAL record, whole]
//! ```
//!
//! The last commit timestamp is `[version u8 = 1][TimestampTz i64 LE]` (9 bytes):
//! PostgreSQL's microseconds since 2000-01-01 00:00 UTC.
//!
//! The counters (next xid, OID, multixact and offset, oldest xid and multixact) are kept
//! current by ingest after every record, so that a basebackup at any LSN can write them
//! into `pg_control`; the other fields are the latest checkpoint record's. The struct is
//! in PostgreSQL's layout (`pgwal::parse::CheckPoint::{to_bytes, from_bytes}`), so only
//! `pgwal` knows it. Version 1 (the record alone) is no longer read: there are no
//! deployments to migrate.
//!
//! Invariants: each value has exactly one byte form (sorted, no duplicates, exact length),
//! so equal sets are equal bytes; every decoder validates kind, version, length, order and
//! field ranges and returns a [`DecodeError`] naming what is wrong, never panics. The kind
//! byte differs per directory so that a value read under the wrong key fails loudly.

use std::collections::BTreeSet;

use bytes::{BufMut, Bytes, BytesMut};
use pgwal::consts::SIZE_OF_CHECKPOINT;
use pgwal::parse::CheckPoint;
use proto::{ForkNumber, Lsn, Oid};

/// The version of every directory encoding written by this build.
pub const DIRECTORY_VERSION: u8 = 1;
/// The version of the checkpoint value written by this build.
pub const CHECKPOINT_VALUE_VERSION: u8 = 2;
/// The version of the last commit timestamp value written by this build.
pub const COMMIT_TIMESTAMP_VERSION: u8 = 1;

const HEADER_BYTES: usize = 6;

/// Stored bytes that are not a valid value of the kind expected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what}: {reason}")]
pub struct DecodeError {
    pub what: &'static str,
    pub reason: String,
}

fn err(what: &'static str, reason: impl Into<String>) -> DecodeError {
    DecodeError { what, reason: reason.into() }
}

/// One kind of directory: its name in errors, kind byte and entry codec.
trait Entry: Ord + Copy {
    const WHAT: &'static str;
    const KIND: u8;
    const LEN: usize;
    fn put(&self, buf: &mut BytesMut);
    fn get(bytes: &[u8]) -> Result<Self, String>;
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn encode_set<T: Entry>(set: &BTreeSet<T>) -> Bytes {
    let mut buf = BytesMut::with_capacity(HEADER_BYTES + set.len() * T::LEN);
    buf.put_u8(T::KIND);
    buf.put_u8(DIRECTORY_VERSION);
    let count = u32::try_from(set.len()).expect("a directory has fewer than 2^32 entries");
    buf.put_u32_le(count);
    for entry in set {
        entry.put(&mut buf);
    }
    buf.freeze()
}

/// Checks a set's header and length; returns its entry count.
fn check_set<T: Entry>(bytes: &[u8]) -> Result<usize, DecodeError> {
    if bytes.len() < HEADER_BYTES {
        return Err(err(T::WHAT, format!("{} bytes, shorter than the {HEADER_BYTES}-byte header", bytes.len())));
    }
    if bytes[0] != T::KIND {
        return Err(err(T::WHAT, format!("kind byte {:#04x}, expected {:#04x}", bytes[0], T::KIND)));
    }
    if bytes[1] != DIRECTORY_VERSION {
        return Err(err(T::WHAT, format!("format version {}, this build reads only version {DIRECTORY_VERSION}", bytes[1])));
    }
    let count = u32_at(bytes, 2) as usize;
    let expected = count.checked_mul(T::LEN).and_then(|n| n.checked_add(HEADER_BYTES));
    if expected != Some(bytes.len()) {
        return Err(err(T::WHAT, format!("{count} entries announced in {} bytes", bytes.len())));
    }
    Ok(count)
}

fn decode_set<T: Entry>(bytes: &[u8]) -> Result<BTreeSet<T>, DecodeError> {
    check_set::<T>(bytes)?;
    let mut set = BTreeSet::new();
    let mut last: Option<T> = None;
    for (i, chunk) in bytes[HEADER_BYTES..].chunks_exact(T::LEN).enumerate() {
        let entry = T::get(chunk).map_err(|reason| err(T::WHAT, format!("entry {i}: {reason}")))?;
        if last.is_some_and(|l| l >= entry) {
            return Err(err(T::WHAT, format!("entry {i} is not in ascending order")));
        }
        last = Some(entry);
        set.insert(entry);
    }
    Ok(set)
}

/// A database: (tablespace, database) oids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DbEntry {
    pub spcnode: Oid,
    pub dbnode: Oid,
}

impl Entry for DbEntry {
    const WHAT: &'static str = "database directory";
    const KIND: u8 = b'D';
    const LEN: usize = 8;
    fn put(&self, buf: &mut BytesMut) {
        buf.put_u32_le(self.spcnode);
        buf.put_u32_le(self.dbnode);
    }
    fn get(b: &[u8]) -> Result<Self, String> {
        Ok(DbEntry { spcnode: u32_at(b, 0), dbnode: u32_at(b, 4) })
    }
}

/// A relation fork inside one database's directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RelEntry {
    pub relnode: Oid,
    pub forknum: ForkNumber,
}

impl Entry for RelEntry {
    const WHAT: &'static str = "relation directory";
    const KIND: u8 = b'R';
    const LEN: usize = 5;
    fn put(&self, buf: &mut BytesMut) {
        buf.put_u32_le(self.relnode);
        buf.put_u8(self.forknum as u8);
    }
    fn get(b: &[u8]) -> Result<Self, String> {
        let relnode = u32_at(b, 0);
        if relnode == 0 {
            return Err("relnode 0 is not a relation".into());
        }
        let forknum = ForkNumber::from_u8(b[4]).ok_or_else(|| format!("invalid fork number {}", b[4]))?;
        Ok(RelEntry { relnode, forknum })
    }
}

/// A number stored as a 4-byte entry: an SLRU segment or a prepared transaction's xid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct U32Entry<const KIND: u8>(u32);

impl Entry for U32Entry<b'S'> {
    const WHAT: &'static str = "SLRU directory";
    const KIND: u8 = b'S';
    const LEN: usize = 4;
    fn put(&self, buf: &mut BytesMut) {
        buf.put_u32_le(self.0);
    }
    fn get(b: &[u8]) -> Result<Self, String> {
        Ok(U32Entry(u32_at(b, 0)))
    }
}

impl Entry for U32Entry<b'T'> {
    const WHAT: &'static str = "two-phase directory";
    const KIND: u8 = b'T';
    const LEN: usize = 4;
    fn put(&self, buf: &mut BytesMut) {
        buf.put_u32_le(self.0);
    }
    fn get(b: &[u8]) -> Result<Self, String> {
        let xid = u32_at(b, 0);
        if xid < 3 {
            return Err(format!("xid {xid} is not a normal transaction id"));
        }
        Ok(U32Entry(xid))
    }
}

pub fn encode_db_dir(dbs: &BTreeSet<DbEntry>) -> Bytes {
    encode_set(dbs)
}

pub fn decode_db_dir(bytes: &[u8]) -> Result<BTreeSet<DbEntry>, DecodeError> {
    decode_set(bytes)
}

pub fn encode_rel_dir(rels: &BTreeSet<RelEntry>) -> Bytes {
    encode_set(rels)
}

pub fn decode_rel_dir(bytes: &[u8]) -> Result<BTreeSet<RelEntry>, DecodeError> {
    decode_set(bytes)
}

/// Whether an encoded set holds `entry`: a binary search over the encoding (entries are
/// fixed-size and ascending), without building the set. Every page read asks this of its
/// database's relation directory, which can list thousands of forks. The entries probed
/// are checked as `decode_set` checks them; the order of the others is not.
fn set_contains<T: Entry>(bytes: &[u8], entry: &T) -> Result<bool, DecodeError> {
    let count = check_set::<T>(bytes)?;
    let entries = &bytes[HEADER_BYTES..];
    let (mut lo, mut hi) = (0, count);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let probed = T::get(&entries[mid * T::LEN..(mid + 1) * T::LEN]).map_err(|reason| err(T::WHAT, format!("entry {mid}: {reason}")))?;
        match probed.cmp(entry) {
            std::cmp::Ordering::Less => lo = mid + 1,
            std::cmp::Ordering::Greater => hi = mid,
            std::cmp::Ordering::Equal => return Ok(true),
        }
    }
    Ok(false)
}

/// Whether an encoded relation directory lists `entry` (see `set_contains`).
pub fn rel_dir_contains(bytes: &[u8], entry: &RelEntry) -> Result<bool, DecodeError> {
    set_contains(bytes, entry)
}

pub fn encode_slru_dir(segments: &BTreeSet<u32>) -> Bytes {
    encode_set(&segments.iter().map(|&s| U32Entry::<b'S'>(s)).collect())
}

pub fn decode_slru_dir(bytes: &[u8]) -> Result<BTreeSet<u32>, DecodeError> {
    Ok(decode_set::<U32Entry<b'S'>>(bytes)?.into_iter().map(|e| e.0).collect())
}

pub fn encode_twophase_dir(xids: &BTreeSet<u32>) -> Bytes {
    encode_set(&xids.iter().map(|&x| U32Entry::<b'T'>(x)).collect())
}

pub fn decode_twophase_dir(bytes: &[u8]) -> Result<BTreeSet<u32>, DecodeError> {
    Ok(decode_set::<U32Entry<b'T'>>(bytes)?.into_iter().map(|e| e.0).collect())
}

/// A relation fork's or SLRU segment's length in blocks.
pub fn encode_block_count(blocks: u32) -> Bytes {
    Bytes::copy_from_slice(&blocks.to_le_bytes())
}

pub fn decode_block_count(bytes: &[u8]) -> Result<u32, DecodeError> {
    let b: [u8; 4] = bytes.try_into().map_err(|_| err("block count", format!("{} bytes, expected 4", bytes.len())))?;
    Ok(u32::from_le_bytes(b))
}

/// The last commit timestamp: a `TimestampTz` (microseconds since 2000-01-01 UTC).
pub fn encode_commit_timestamp(timestamp: i64) -> Bytes {
    let mut buf = BytesMut::with_capacity(9);
    buf.put_u8(COMMIT_TIMESTAMP_VERSION);
    buf.put_i64_le(timestamp);
    buf.freeze()
}

pub fn decode_commit_timestamp(bytes: &[u8]) -> Result<i64, DecodeError> {
    const WHAT: &str = "commit timestamp";
    match bytes {
        [COMMIT_TIMESTAMP_VERSION, rest @ ..] if rest.len() == 8 => {
            Ok(i64::from_le_bytes(rest.try_into().map_err(|_| err(WHAT, "8 bytes expected"))?))
        }
        [COMMIT_TIMESTAMP_VERSION, ..] => Err(err(WHAT, format!("{} bytes, expected 9", bytes.len()))),
        [version, ..] => Err(err(WHAT, format!("unknown version {version}"))),
        [] => Err(err(WHAT, "0 bytes")),
    }
}

/// The last running-transactions record: where a hot standby begins replay for it (a record
/// boundary: the record's start, or the start of a completion record it raced, see
/// `WalIngest::standby_start_for`) and the oldest transaction it lists as running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredRunningXacts {
    pub record_lsn: Lsn,
    pub oldest_running_xid: u32,
    /// More subtransactions were running than the record could list: a standby starting
    /// here cannot serve queries until the oldest of them ends.
    pub subxid_overflow: bool,
}

const RUNNING_XACTS_VERSION: u8 = 1;
const RUNNING_XACTS_BYTES: usize = 1 + 8 + 4 + 1;

pub fn encode_running_xacts(r: &StoredRunningXacts) -> Bytes {
    let mut buf = BytesMut::with_capacity(RUNNING_XACTS_BYTES);
    buf.put_u8(RUNNING_XACTS_VERSION);
    buf.put_u64_le(r.record_lsn.0);
    buf.put_u32_le(r.oldest_running_xid);
    buf.put_u8(u8::from(r.subxid_overflow));
    buf.freeze()
}

pub fn decode_running_xacts(bytes: &[u8]) -> Result<StoredRunningXacts, DecodeError> {
    const WHAT: &str = "running xacts";
    match bytes {
        [RUNNING_XACTS_VERSION, ..] if bytes.len() != RUNNING_XACTS_BYTES => {
            Err(err(WHAT, format!("{} bytes, expected {RUNNING_XACTS_BYTES}", bytes.len())))
        }
        [RUNNING_XACTS_VERSION, ..] => {
            let lsn = u64::from_le_bytes(bytes[1..9].try_into().map_err(|_| err(WHAT, "8 bytes expected"))?);
            let xid = u32::from_le_bytes(bytes[9..13].try_into().map_err(|_| err(WHAT, "4 bytes expected"))?);
            let subxid_overflow = match bytes[13] {
                0 => false,
                1 => true,
                other => return Err(err(WHAT, format!("overflow flag {other}, expected 0 or 1"))),
            };
            Ok(StoredRunningXacts { record_lsn: Lsn(lsn), oldest_running_xid: xid, subxid_overflow })
        }
        [version, ..] => Err(err(WHAT, format!("unknown version {version}"))),
        [] => Err(err(WHAT, "0 bytes")),
    }
}

/// The checkpoint value: the latest checkpoint record and the counters as of now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredCheckpoint {
    /// Where the latest checkpoint record starts.
    pub record_lsn: Lsn,
    /// The latest checkpoint's fields with the counters advanced by every record since.
    pub current: CheckPoint,
    /// The latest checkpoint WAL record as logged (parsed by `pgwal` when read).
    pub record: Bytes,
}

const CHECKPOINT_HEADER_BYTES: usize = 9 + SIZE_OF_CHECKPOINT;

pub fn encode_checkpoint(cp: &StoredCheckpoint) -> Bytes {
    let mut buf = BytesMut::with_capacity(CHECKPOINT_HEADER_BYTES + cp.record.len());
    buf.put_u8(CHECKPOINT_VALUE_VERSION);
    buf.put_u64_le(cp.record_lsn.0);
    buf.put_slice(&cp.current.to_bytes());
    buf.put_slice(&cp.record);
    buf.freeze()
}

/// Checks version and length; the record itself is checked by `pgwal` when parsed.
pub fn decode_checkpoint(bytes: &Bytes) -> Result<StoredCheckpoint, DecodeError> {
    const WHAT: &str = "checkpoint value";
    if bytes.is_empty() {
        return Err(err(WHAT, "0 bytes"));
    }
    if bytes[0] != CHECKPOINT_VALUE_VERSION {
        return Err(err(WHAT, format!("format version {}, this build reads only version {CHECKPOINT_VALUE_VERSION}", bytes[0])));
    }
    if bytes.len() < CHECKPOINT_HEADER_BYTES {
        return Err(err(WHAT, format!("{} bytes, shorter than the {CHECKPOINT_HEADER_BYTES}-byte header", bytes.len())));
    }
    let record_lsn = Lsn(u64::from_le_bytes(bytes[1..9].try_into().map_err(|_| err(WHAT, "short LSN"))?));
    let current = CheckPoint::from_bytes(&bytes[9..CHECKPOINT_HEADER_BYTES]).map_err(|e| err(WHAT, e))?;
    Ok(StoredCheckpoint { record_lsn, current, record: bytes.slice(CHECKPOINT_HEADER_BYTES..) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rel(relnode: Oid, fork: u8) -> RelEntry {
        RelEntry { relnode, forknum: ForkNumber::from_u8(fork).unwrap() }
    }

    #[test]
    fn commit_timestamps_round_trip_and_bad_ones_are_refused() {
        let bytes = encode_commit_timestamp(-2);
        assert_eq!(&bytes[..], &[1, 0xFE, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]);
        assert_eq!(decode_commit_timestamp(&bytes), Ok(-2));
        assert_eq!(decode_commit_timestamp(&encode_commit_timestamp(i64::MAX)), Ok(i64::MAX));
        assert_eq!(decode_commit_timestamp(&bytes[..8]).unwrap_err().to_string(), "invalid commit timestamp: 8 bytes, expected 9");
        assert_eq!(decode_commit_timestamp(&[2; 9]).unwrap_err().to_string(), "invalid commit timestamp: unknown version 2");
        assert_eq!(decode_commit_timestamp(&[]).unwrap_err().to_string(), "invalid commit timestamp: 0 bytes");
    }

    #[test]
    fn running_xacts_round_trip_and_rejects_garbage() {
        let r = StoredRunningXacts { record_lsn: Lsn(0x1_0000_0028), oldest_running_xid: 740, subxid_overflow: true };
        let bytes = encode_running_xacts(&r);
        assert_eq!(&bytes[..], &[1, 0x28, 0, 0, 0, 1, 0, 0, 0, 0xE4, 0x02, 0, 0, 1]);
        assert_eq!(decode_running_xacts(&bytes), Ok(r));
        assert_eq!(decode_running_xacts(&bytes[..13]).unwrap_err().to_string(), "invalid running xacts: 13 bytes, expected 14");
        let mut bad = bytes.to_vec();
        bad[13] = 7;
        assert_eq!(decode_running_xacts(&bad).unwrap_err().to_string(), "invalid running xacts: overflow flag 7, expected 0 or 1");
        assert_eq!(decode_running_xacts(&[9; 14]).unwrap_err().to_string(), "invalid running xacts: unknown version 9");
        assert_eq!(decode_running_xacts(&[]).unwrap_err().to_string(), "invalid running xacts: 0 bytes");
    }

    #[test]
    fn golden_rel_dir() {
        let set: BTreeSet<RelEntry> = [rel(16384, 0), rel(1259, 2), rel(16384, 3)].into();
        let bytes = encode_rel_dir(&set);
        let expected: Vec<u8> =
            [&[b'R', 1, 3, 0, 0, 0][..], &[0xEB, 0x04, 0, 0, 2], &[0x00, 0x40, 0, 0, 0], &[0x00, 0x40, 0, 0, 3]].concat();
        assert_eq!(&bytes[..], &expected[..]);
        assert_eq!(decode_rel_dir(&bytes).unwrap(), set);
        assert_eq!(decode_rel_dir(&encode_rel_dir(&BTreeSet::new())).unwrap(), BTreeSet::new());
    }

    proptest! {
        #[test]
        fn rel_dir_contains_agrees_with_the_decoded_set(
            members in proptest::collection::btree_set((1u32..200, 0u8..4), 0..60),
            probe in (1u32..200, 0u8..4),
        ) {
            let set: BTreeSet<RelEntry> = members.iter().map(|&(r, f)| rel(r, f)).collect();
            let bytes = encode_rel_dir(&set);
            prop_assert_eq!(rel_dir_contains(&bytes, &rel(probe.0, probe.1)).unwrap(), set.contains(&rel(probe.0, probe.1)));
            for e in &set {
                prop_assert!(rel_dir_contains(&bytes, e).unwrap());
            }
        }
    }

    #[test]
    fn rel_dir_contains_refuses_what_decode_refuses() {
        let good = encode_rel_dir(&[rel(5, 0), rel(6, 0)].into()).to_vec();
        assert!(rel_dir_contains(&good[..good.len() - 1], &rel(5, 0)).is_err());
        let mut kind = good.clone();
        kind[0] = b'D';
        assert!(rel_dir_contains(&kind, &rel(5, 0)).is_err());
        let mut zero = good.clone();
        zero[HEADER_BYTES..HEADER_BYTES + 4].copy_from_slice(&[0, 0, 0, 0]);
        assert!(rel_dir_contains(&zero, &rel(5, 0)).is_err());
    }

    #[test]
    fn corrupt_directories_are_refused_with_the_reason() {
        let good = encode_rel_dir(&[rel(5, 0), rel(6, 0)].into()).to_vec();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![], "invalid relation directory: 0 bytes, shorter than the 6-byte header"),
            (good[..good.len() - 1].to_vec(), "invalid relation directory: 2 entries announced in 15 bytes"),
            ([&good[..], &[0]].concat(), "invalid relation directory: 2 entries announced in 17 bytes"),
            (
                {
                    let mut b = good.clone();
                    b[0] = b'D';
                    b
                },
                "invalid relation directory: kind byte 0x44, expected 0x52",
            ),
            (
                {
                    let mut b = good.clone();
                    b[1] = 2;
                    b
                },
                "invalid relation directory: format version 2, this build reads only version 1",
            ),
            (
                {
                    let mut b = good.clone();
                    b[10] = 9;
                    b
                },
                "invalid relation directory: entry 0: invalid fork number 9",
            ),
            (
                {
                    let mut b = good.clone();
                    b[6] = 0;
                    b
                },
                "invalid relation directory: entry 0: relnode 0 is not a relation",
            ),
            (
                {
                    let mut b = good.clone();
                    b[11] = 5;
                    b
                },
                "invalid relation directory: entry 1 is not in ascending order",
            ),
            (
                {
                    let mut b = good.clone();
                    b[2] = 0xff;
                    b[5] = 0xff;
                    b
                },
                "invalid relation directory: 4278190335 entries announced in 16 bytes",
            ),
        ];
        for (bytes, message) in cases {
            assert_eq!(decode_rel_dir(&bytes).unwrap_err().to_string(), message);
        }
        // A database directory is not a relation directory, and vice versa.
        let dbs = encode_db_dir(&[DbEntry { spcnode: 1663, dbnode: 5 }].into());
        assert!(decode_rel_dir(&dbs).is_err());
        assert!(decode_slru_dir(&dbs).is_err());
        assert_eq!(
            decode_twophase_dir(&encode_set(&[U32Entry::<b'T'>(2)].into())).unwrap_err().to_string(),
            "invalid two-phase directory: entry 0: xid 2 is not a normal transaction id"
        );
        assert_eq!(decode_block_count(&[1, 2, 3]).unwrap_err().to_string(), "invalid block count: 3 bytes, expected 4");
        assert_eq!(
            decode_checkpoint(&Bytes::from_static(&[1, 0, 0, 0, 0, 0, 0, 0, 0])).unwrap_err().to_string(),
            "invalid checkpoint value: format version 1, this build reads only version 2"
        );
        assert_eq!(
            decode_checkpoint(&Bytes::from_static(&[2, 0, 0, 0, 0, 0, 0, 0, 0])).unwrap_err().to_string(),
            "invalid checkpoint value: 9 bytes, shorter than the 97-byte header"
        );
    }

    proptest! {
        #[test]
        fn directories_round_trip(
            dbs in proptest::collection::btree_set((any::<u32>(), any::<u32>()), 0..50),
            rels in proptest::collection::btree_set((1..u32::MAX, 0u8..4), 0..50),
            segs in proptest::collection::btree_set(any::<u32>(), 0..50),
            xids in proptest::collection::btree_set(3..u32::MAX, 0..50),
            blocks in any::<u32>(),
            lsn in any::<u64>(),
            record in proptest::collection::vec(any::<u8>(), 0..100),
        ) {
            let dbs: BTreeSet<DbEntry> = dbs.into_iter().map(|(spcnode, dbnode)| DbEntry { spcnode, dbnode }).collect();
            prop_assert_eq!(decode_db_dir(&encode_db_dir(&dbs)).unwrap(), dbs);
            let rels: BTreeSet<RelEntry> = rels.into_iter().map(|(r, f)| rel(r, f)).collect();
            prop_assert_eq!(decode_rel_dir(&encode_rel_dir(&rels)).unwrap(), rels);
            prop_assert_eq!(decode_slru_dir(&encode_slru_dir(&segs)).unwrap(), segs.clone());
            prop_assert_eq!(decode_twophase_dir(&encode_twophase_dir(&xids)).unwrap(), xids);
            prop_assert_eq!(decode_block_count(&encode_block_count(blocks)).unwrap(), blocks);
            let mut current = CheckPoint::from_bytes(&[0u8; SIZE_OF_CHECKPOINT]).unwrap();
            current.next_xid = pgwal::FullTransactionId(lsn.rotate_left(7));
            current.next_oid = blocks;
            let cp = StoredCheckpoint { record_lsn: Lsn(lsn), current, record: Bytes::from(record) };
            prop_assert_eq!(decode_checkpoint(&encode_checkpoint(&cp)).unwrap(), cp);
        }

        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode_db_dir(&bytes);
            let _ = decode_rel_dir(&bytes);
            let _ = decode_slru_dir(&bytes);
            let _ = decode_twophase_dir(&bytes);
            let _ = decode_block_count(&bytes);
            let _ = decode_checkpoint(&Bytes::from(bytes));
        }
    }
}
