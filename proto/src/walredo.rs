//! The WAL redo protocol: what the pageserver sends to a `postgres --wal-redo fjord` process.
//!
//! The process (the C loop in `extension/c/walredo.c`) rebuilds one page at a time with
//! PostgreSQL's own redo routines. Each message is a tag byte, a big-endian `u32` payload
//! length, and the payload; integers are big-endian. A relation block is written as
//! spcnode, dbnode, relnode (`u32` each), fork (`u8`), block number (`u32`): 17 bytes.
//!
//! | tag | message | payload | answer |
//! |---|---|---|---|
//! | `B` | begin | rel block | none |
//! | `P` | push page | rel block, 8192-byte page | none |
//! | `A` | apply record | start LSN `u64` (0 if unknown), end LSN `u64`, the whole WAL record | none |
//! | `G` | get page | rel block | the 8192-byte page |
//! | `M` | mask page | resource manager id `u8`, block number `u32`, 8192-byte page | the page after that resource manager's `rm_mask` |
//!
//! A request is `B`, then optionally `P` (the base image), then any number of `A` in LSN
//! order, then `G`. `M` stands alone: it applies PostgreSQL's own masking (what
//! `wal_consistency_checking` ignores: hint bits, unused space, the page LSN) so that tests
//! can compare pages as PostgreSQL itself would. The process answers nothing else: any error is fatal for it, and its
//! message goes to stderr. The decoder exists for tests and fuzzing of the encoder's
//! counterpart; it validates everything the C side validates.

use crate::page::PAGE_SIZE_BYTES;
use crate::{BlockNumber, ForkNumber, Lsn, RelTag};

const REL_BLOCK_BYTES: usize = 17;
/// The largest WAL record PostgreSQL 15 writes (`XLogRecordMaxSize`), plus two LSNs.
pub const MESSAGE_BYTES_MAX: usize = 1020 * 1024 * 1024 + 16;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WalRedoRequest {
    Begin { rel: RelTag, blkno: BlockNumber },
    PushPage { rel: RelTag, blkno: BlockNumber, page: Vec<u8> },
    ApplyRecord { start_lsn: Lsn, end_lsn: Lsn, record: Vec<u8> },
    GetPage { rel: RelTag, blkno: BlockNumber },
    MaskPage { rmid: u8, blkno: BlockNumber, page: Vec<u8> },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WalRedoProtocolError {
    #[error("incomplete wal redo message: have {have} bytes, need {need}")]
    Incomplete { have: usize, need: usize },
    #[error("unrecognized wal redo message tag: {0}")]
    UnknownTag(u8),
    #[error("wal redo message {tag:?} has a payload of {len} bytes, expected {expected}")]
    BadLength { tag: char, len: usize, expected: String },
    #[error("invalid fork number in wal redo message: {0}")]
    BadFork(u8),
    #[error("push page carries {0} bytes, expected a {PAGE_SIZE_BYTES}-byte page")]
    BadPageSize(usize),
}

fn put_rel_block(buf: &mut Vec<u8>, rel: &RelTag, blkno: BlockNumber) {
    buf.extend_from_slice(&rel.spcnode.to_be_bytes());
    buf.extend_from_slice(&rel.dbnode.to_be_bytes());
    buf.extend_from_slice(&rel.relnode.to_be_bytes());
    buf.push(rel.forknum as u8);
    buf.extend_from_slice(&blkno.0.to_be_bytes());
}

fn be_u32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn be_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

fn get_rel_block(p: &[u8]) -> Result<(RelTag, BlockNumber), WalRedoProtocolError> {
    let fork = p[12];
    let forknum = ForkNumber::from_u8(fork).ok_or(WalRedoProtocolError::BadFork(fork))?;
    let rel = RelTag { spcnode: be_u32(&p[0..]), dbnode: be_u32(&p[4..]), relnode: be_u32(&p[8..]), forknum };
    Ok((rel, BlockNumber(be_u32(&p[13..]))))
}

impl WalRedoRequest {
    /// Appends the encoded message to `buf`.
    pub fn encode(&self, buf: &mut Vec<u8>) {
        let start = buf.len();
        buf.extend_from_slice(&[0; 5]);
        let tag = match self {
            WalRedoRequest::Begin { rel, blkno } => {
                put_rel_block(buf, rel, *blkno);
                b'B'
            }
            WalRedoRequest::PushPage { rel, blkno, page } => {
                put_rel_block(buf, rel, *blkno);
                buf.extend_from_slice(page);
                b'P'
            }
            WalRedoRequest::ApplyRecord { start_lsn, end_lsn, record } => {
                buf.extend_from_slice(&start_lsn.0.to_be_bytes());
                buf.extend_from_slice(&end_lsn.0.to_be_bytes());
                buf.extend_from_slice(record);
                b'A'
            }
            WalRedoRequest::GetPage { rel, blkno } => {
                put_rel_block(buf, rel, *blkno);
                b'G'
            }
            WalRedoRequest::MaskPage { rmid, blkno, page } => {
                buf.push(*rmid);
                buf.extend_from_slice(&blkno.0.to_be_bytes());
                buf.extend_from_slice(page);
                b'M'
            }
        };
        let len = u32::try_from(buf.len() - start - 5).expect("wal redo message fits in u32");
        buf[start] = tag;
        buf[start + 1..start + 5].copy_from_slice(&len.to_be_bytes());
    }

    /// Decodes one message from the front of `bytes`; returns it and the bytes it used.
    pub fn decode(bytes: &[u8]) -> Result<(WalRedoRequest, usize), WalRedoProtocolError> {
        if bytes.len() < 5 {
            return Err(WalRedoProtocolError::Incomplete { have: bytes.len(), need: 5 });
        }
        let tag = bytes[0];
        let len = be_u32(&bytes[1..]) as usize;
        let bad = |expected: String| WalRedoProtocolError::BadLength { tag: tag as char, len, expected };
        let check_len = |ok: bool, expected: &str| if ok { Ok(()) } else { Err(bad(expected.to_string())) };
        match tag {
            b'B' | b'G' => check_len(len == REL_BLOCK_BYTES, "17")?,
            b'P' => {
                check_len(len >= REL_BLOCK_BYTES, "17 + 8192")?;
                if len != REL_BLOCK_BYTES + PAGE_SIZE_BYTES {
                    return Err(WalRedoProtocolError::BadPageSize(len - REL_BLOCK_BYTES));
                }
            }
            b'M' => check_len(len == 5 + PAGE_SIZE_BYTES, "5 + 8192")?,
            b'A' => check_len((16 + 24..=MESSAGE_BYTES_MAX).contains(&len), "between 40 and the maximal record")?,
            other => return Err(WalRedoProtocolError::UnknownTag(other)),
        }
        let total = 5 + len;
        if bytes.len() < total {
            return Err(WalRedoProtocolError::Incomplete { have: bytes.len(), need: total });
        }
        let p = &bytes[5..total];
        let msg = match tag {
            b'B' => {
                let (rel, blkno) = get_rel_block(p)?;
                WalRedoRequest::Begin { rel, blkno }
            }
            b'G' => {
                let (rel, blkno) = get_rel_block(p)?;
                WalRedoRequest::GetPage { rel, blkno }
            }
            b'P' => {
                let (rel, blkno) = get_rel_block(p)?;
                WalRedoRequest::PushPage { rel, blkno, page: p[REL_BLOCK_BYTES..].to_vec() }
            }
            b'M' => WalRedoRequest::MaskPage { rmid: p[0], blkno: BlockNumber(be_u32(&p[1..])), page: p[5..].to_vec() },
            _ => WalRedoRequest::ApplyRecord { start_lsn: Lsn(be_u64(p)), end_lsn: Lsn(be_u64(&p[8..])), record: p[16..].to_vec() },
        };
        Ok((msg, total))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rel_strategy() -> impl Strategy<Value = RelTag> {
        (any::<u32>(), any::<u32>(), any::<u32>(), 0u8..4).prop_map(|(s, d, r, f)| RelTag {
            spcnode: s,
            dbnode: d,
            relnode: r,
            forknum: ForkNumber::from_u8(f).unwrap(),
        })
    }

    fn request_strategy() -> impl Strategy<Value = WalRedoRequest> {
        prop_oneof![
            (rel_strategy(), any::<u32>()).prop_map(|(rel, b)| WalRedoRequest::Begin { rel, blkno: BlockNumber(b) }),
            (rel_strategy(), any::<u32>()).prop_map(|(rel, b)| WalRedoRequest::GetPage { rel, blkno: BlockNumber(b) }),
            (rel_strategy(), any::<u32>(), any::<u8>()).prop_map(|(rel, b, fill)| WalRedoRequest::PushPage {
                rel,
                blkno: BlockNumber(b),
                page: vec![fill; PAGE_SIZE_BYTES]
            }),
            (any::<u8>(), any::<u32>(), any::<u8>()).prop_map(|(rmid, b, fill)| WalRedoRequest::MaskPage {
                rmid,
                blkno: BlockNumber(b),
                page: vec![fill; PAGE_SIZE_BYTES]
            }),
            (any::<u64>(), any::<u64>(), proptest::collection::vec(any::<u8>(), 24..200))
                .prop_map(|(s, e, record)| { WalRedoRequest::ApplyRecord { start_lsn: Lsn(s), end_lsn: Lsn(e), record } }),
        ]
    }

    proptest! {
        #[test]
        fn round_trips(reqs in proptest::collection::vec(request_strategy(), 1..5)) {
            let mut buf = Vec::new();
            for r in &reqs {
                r.encode(&mut buf);
            }
            let mut at = 0;
            for r in &reqs {
                let (got, used) = WalRedoRequest::decode(&buf[at..]).unwrap();
                prop_assert_eq!(&got, r);
                at += used;
            }
            prop_assert_eq!(at, buf.len());
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = WalRedoRequest::decode(&bytes);
        }
    }

    #[test]
    fn rejects_malformed_messages() {
        assert_eq!(WalRedoRequest::decode(b"X\0\0\0\x11").unwrap_err(), WalRedoProtocolError::UnknownTag(b'X'));
        assert!(matches!(WalRedoRequest::decode(b"B\0\0\0\x05abcde"), Err(WalRedoProtocolError::BadLength { .. })));
        let mut msg = b"G\0\0\0\x11".to_vec();
        msg.extend_from_slice(&[0; 12]);
        msg.push(9);
        msg.extend_from_slice(&[0; 4]);
        assert_eq!(WalRedoRequest::decode(&msg).unwrap_err(), WalRedoProtocolError::BadFork(9));
        assert_eq!(WalRedoRequest::decode(&msg[..10]).unwrap_err(), WalRedoProtocolError::Incomplete { have: 10, need: 22 });
    }
}
