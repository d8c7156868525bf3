//! `StoredRecord`: what the bytes of a `Value::Record` mean.
//!
//! The storage engine keeps records opaque. The pageserver stores two families in them:
//! PostgreSQL WAL records, replayed by the WAL redo process, and changes that fjord applies
//! in Rust because PostgreSQL has no per-page redo for them (see `layout.rs`). The first
//! byte says which:
//!
//! | tag | record | payload (little-endian) | applied to |
//! |---|---|---|---|
//! | 1 | `Postgres` | the whole WAL record, header included | a relation page, by `postgres --wal-redo` |
//! | 2 | `ClogSetStatus` | status `u8`, count `u32`, xids `u32`... | one CLOG page: the xid and subxacts of one commit or abort that live on it |
//! | 3 | `MultiXactOffsets` | count `u32`, (multi `u32`, offset `u32`)... | one offsets page: a new multixact's start and its successor's (`RecordNewMultiXact`) |
//! | 4 | `MultiXactMembers` | count `u32`, (offset `u32`, xid `u32`, status `u8`)... | one members page: the members of a new multixact that live on it |
//! | 5 | `VmClear` | count `u32`, (heap block `u32`, bits `u8`)... | one visibility-map page: bits cleared by heap records, which do not register the map page |
//! | 6 | `VmTruncate` | new heap length in blocks `u32` | the last remaining visibility-map page of a truncated heap (`visibilitymap_prepare_truncate`) |
//!
//! Tags are persisted in layer files: never renumber one. Decoding checks the tag, the
//! exact length and every enumerated field.

use bytes::{BufMut, Bytes, BytesMut};
use proto::BlockNumber;

use super::layout::XidStatus;

const TAG_POSTGRES: u8 = 1;
const TAG_CLOG_SET_STATUS: u8 = 2;
const TAG_MULTIXACT_OFFSETS: u8 = 3;
const TAG_MULTIXACT_MEMBERS: u8 = 4;
const TAG_VM_CLEAR: u8 = 5;
const TAG_VM_TRUNCATE: u8 = 6;

/// The highest `MultiXactStatus` (`MultiXactStatusUpdate`).
const MULTIXACT_STATUS_MAX: u8 = 5;

/// A record stored under one key. See the module documentation for the byte form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoredRecord {
    Postgres(Bytes),
    ClogSetStatus { status: XidStatus, xids: Vec<u32> },
    MultiXactOffsets { entries: Vec<(u32, u32)> },
    MultiXactMembers { members: Vec<(u32, u32, u8)> },
    VmClear { blocks: Vec<(BlockNumber, u8)> },
    VmTruncate { heap_blocks: BlockNumber },
}

/// Bytes that are not a `StoredRecord`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid stored record: {0}")]
pub struct RecordDecodeError(pub String);

impl StoredRecord {
    /// A short name for logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            StoredRecord::Postgres(_) => "postgres",
            StoredRecord::ClogSetStatus { .. } => "clog set status",
            StoredRecord::MultiXactOffsets { .. } => "multixact offsets",
            StoredRecord::MultiXactMembers { .. } => "multixact members",
            StoredRecord::VmClear { .. } => "visibility map clear",
            StoredRecord::VmTruncate { .. } => "visibility map truncate",
        }
    }

    pub fn encode(&self) -> Bytes {
        fn count(n: usize) -> u32 {
            u32::try_from(n).expect("a stored record has fewer than 2^32 entries")
        }
        let mut b = BytesMut::new();
        match self {
            StoredRecord::Postgres(rec) => {
                b.reserve(1 + rec.len());
                b.put_u8(TAG_POSTGRES);
                b.put_slice(rec);
            }
            StoredRecord::ClogSetStatus { status, xids } => {
                b.put_u8(TAG_CLOG_SET_STATUS);
                b.put_u8(*status as u8);
                b.put_u32_le(count(xids.len()));
                xids.iter().for_each(|x| b.put_u32_le(*x));
            }
            StoredRecord::MultiXactOffsets { entries } => {
                b.put_u8(TAG_MULTIXACT_OFFSETS);
                b.put_u32_le(count(entries.len()));
                for (multi, offset) in entries {
                    b.put_u32_le(*multi);
                    b.put_u32_le(*offset);
                }
            }
            StoredRecord::MultiXactMembers { members } => {
                b.put_u8(TAG_MULTIXACT_MEMBERS);
                b.put_u32_le(count(members.len()));
                for (offset, xid, status) in members {
                    b.put_u32_le(*offset);
                    b.put_u32_le(*xid);
                    b.put_u8(*status);
                }
            }
            StoredRecord::VmClear { blocks } => {
                b.put_u8(TAG_VM_CLEAR);
                b.put_u32_le(count(blocks.len()));
                for (blkno, bits) in blocks {
                    b.put_u32_le(blkno.0);
                    b.put_u8(*bits);
                }
            }
            StoredRecord::VmTruncate { heap_blocks } => {
                b.put_u8(TAG_VM_TRUNCATE);
                b.put_u32_le(heap_blocks.0);
            }
        }
        b.freeze()
    }

    pub fn decode(bytes: &Bytes) -> Result<StoredRecord, RecordDecodeError> {
        let e = |s: String| RecordDecodeError(s);
        let Some(&tag) = bytes.first() else {
            return Err(e("empty".into()));
        };
        let body = &bytes[1..];
        let u32_at = |at: usize| u32::from_le_bytes(body[at..at + 4].try_into().expect("4 bytes"));
        // The entry count, checked against the bytes that follow it.
        let entries = |header: usize, entry: usize, what: &str| -> Result<usize, RecordDecodeError> {
            if body.len() < header + 4 {
                return Err(e(format!("{what} record of {} bytes is shorter than its header", bytes.len())));
            }
            let n = u32_at(header) as usize;
            let rest = body.len() - header - 4;
            if n.checked_mul(entry) != Some(rest) {
                return Err(e(format!("{what} record announces {n} entries of {entry} bytes, {rest} bytes follow")));
            }
            Ok(n)
        };
        match tag {
            TAG_POSTGRES => Ok(StoredRecord::Postgres(bytes.slice(1..))),
            TAG_CLOG_SET_STATUS => {
                let n = entries(1, 4, "clog set status")?;
                let status = XidStatus::from_u8(body[0]).ok_or_else(|| e(format!("invalid transaction status {}", body[0])))?;
                Ok(StoredRecord::ClogSetStatus { status, xids: (0..n).map(|i| u32_at(5 + 4 * i)).collect() })
            }
            TAG_MULTIXACT_OFFSETS => {
                let n = entries(0, 8, "multixact offsets")?;
                Ok(StoredRecord::MultiXactOffsets { entries: (0..n).map(|i| (u32_at(4 + 8 * i), u32_at(8 + 8 * i))).collect() })
            }
            TAG_MULTIXACT_MEMBERS => {
                let n = entries(0, 9, "multixact members")?;
                let members: Vec<(u32, u32, u8)> = (0..n).map(|i| (u32_at(4 + 9 * i), u32_at(8 + 9 * i), body[12 + 9 * i])).collect();
                if let Some(m) = members.iter().find(|m| m.2 > MULTIXACT_STATUS_MAX) {
                    return Err(e(format!("invalid multixact member status {}", m.2)));
                }
                Ok(StoredRecord::MultiXactMembers { members })
            }
            TAG_VM_CLEAR => {
                let n = entries(0, 5, "visibility map clear")?;
                let blocks: Vec<(BlockNumber, u8)> = (0..n).map(|i| (BlockNumber(u32_at(4 + 5 * i)), body[8 + 5 * i])).collect();
                if let Some(b) = blocks.iter().find(|b| b.1 & !3 != 0) {
                    return Err(e(format!("invalid visibility map bits {:#04x}", b.1)));
                }
                Ok(StoredRecord::VmClear { blocks })
            }
            TAG_VM_TRUNCATE => {
                if body.len() != 4 {
                    return Err(e(format!("visibility map truncate record of {} bytes, expected 5", bytes.len())));
                }
                Ok(StoredRecord::VmTruncate { heap_blocks: BlockNumber(u32_at(0)) })
            }
            other => Err(e(format!("unrecognized record tag: {other}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record_strategy() -> impl Strategy<Value = StoredRecord> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..64).prop_map(|v| StoredRecord::Postgres(Bytes::from(v))),
            (0u8..4, proptest::collection::vec(any::<u32>(), 0..10))
                .prop_map(|(s, xids)| StoredRecord::ClogSetStatus { status: XidStatus::from_u8(s).unwrap(), xids }),
            proptest::collection::vec(any::<(u32, u32)>(), 0..10).prop_map(|entries| StoredRecord::MultiXactOffsets { entries }),
            proptest::collection::vec((any::<u32>(), any::<u32>(), 0u8..=5), 0..10)
                .prop_map(|members| StoredRecord::MultiXactMembers { members }),
            proptest::collection::vec((any::<u32>(), 0u8..4), 0..10)
                .prop_map(|v| StoredRecord::VmClear { blocks: v.into_iter().map(|(b, bits)| (BlockNumber(b), bits)).collect() }),
            any::<u32>().prop_map(|b| StoredRecord::VmTruncate { heap_blocks: BlockNumber(b) }),
        ]
    }

    proptest! {
        #[test]
        fn round_trips(rec in record_strategy()) {
            prop_assert_eq!(StoredRecord::decode(&rec.encode()).unwrap(), rec);
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = StoredRecord::decode(&Bytes::from(bytes));
        }
    }

    #[test]
    fn golden_bytes_and_errors() {
        let rec = StoredRecord::ClogSetStatus { status: XidStatus::Aborted, xids: vec![3, 0x100] };
        assert_eq!(&rec.encode()[..], &[2, 2, 2, 0, 0, 0, 3, 0, 0, 0, 0, 1, 0, 0]);
        let rec = StoredRecord::VmClear { blocks: vec![(BlockNumber(7), 3)] };
        assert_eq!(&rec.encode()[..], &[5, 1, 0, 0, 0, 7, 0, 0, 0, 3]);
        let cases: [(&[u8], &str); 7] = [
            (&[], "invalid stored record: empty"),
            (&[9], "invalid stored record: unrecognized record tag: 9"),
            (&[2, 4, 0, 0, 0, 0], "invalid stored record: invalid transaction status 4"),
            (&[2, 1, 1, 0, 0, 0], "invalid stored record: clog set status record announces 1 entries of 4 bytes, 0 bytes follow"),
            (&[3, 0, 0], "invalid stored record: multixact offsets record of 3 bytes is shorter than its header"),
            (&[5, 1, 0, 0, 0, 7, 0, 0, 0, 4], "invalid stored record: invalid visibility map bits 0x04"),
            (&[6, 1, 0, 0], "invalid stored record: visibility map truncate record of 4 bytes, expected 5"),
        ];
        for (bytes, message) in cases {
            assert_eq!(StoredRecord::decode(&Bytes::copy_from_slice(bytes)).unwrap_err().to_string(), message);
        }
    }
}
