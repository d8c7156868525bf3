//! The page service protocol: how a compute asks a pageserver for pages and sizes.
//!
//! One TCP connection per compute backend. The client opens with `Hello` naming the
//! protocol version, tenant and timeline, and carrying its token (empty: none; a server
//! with authentication on refuses a `Hello` without one that grants the timeline); the
//! server answers `HelloOk` or `Error` and closes. After that the client sends requests, each with a `request_id` of its choosing,
//! and may send many before reading answers (pipelining); the server answers each request
//! exactly once, in order, echoing its id. Id 0 is reserved for errors that answer no
//! request (a refused `Hello`, a malformed message), so requests use ids from 1.
//!
//! Every message is framed as a tag byte, a big-endian `u32` payload length, and the
//! payload; integers are big-endian. The decoder validates everything (tags, lengths,
//! fork numbers, SLRU kinds, LSN order, UTF-8) and never panics, so a malformed message is
//! an error that names what was wrong, and the connection is closed.
//!
//! Two LSNs ride on every request, as in Neon's protocol v2:
//! - `request_lsn`: the point in WAL history the reader is at. A primary sends its
//!   current insert position, a replica its replay position, a read-only compute its fixed
//!   LSN. The answer is the version as of this LSN; it must not be below the GC horizon.
//! - `not_modified_since`: the caller promises the object did not change between this LSN
//!   and `request_lsn` (the compute's last-written LSN of the page). The server waits only
//!   until it has ingested this LSN, not `request_lsn`, so a read does not wait for the
//!   newest WAL to arrive. `not_modified_since <= request_lsn` always.

use crate::key::SlruKind;
use crate::page::PAGE_SIZE_BYTES;
use crate::{BlockNumber, ForkNumber, Lsn, Oid, RelTag, TenantId, TimelineId};

/// The protocol version this crate speaks.
pub const PROTOCOL_VERSION: u16 = 2;
/// The longest token a `Hello` carries (the same bound as `auth::TOKEN_BYTES_MAX`).
pub const TOKEN_BYTES_MAX: usize = 4096;
/// An SLRU segment is 32 pages.
pub const SLRU_SEGMENT_BYTES_MAX: usize = 32 * PAGE_SIZE_BYTES;
/// The longest error message a server sends.
pub const ERROR_MESSAGE_BYTES_MAX: usize = 4096;
/// No valid message is longer than this; anything longer is refused before it is read.
pub const MESSAGE_BYTES_MAX: usize = SLRU_SEGMENT_BYTES_MAX + 64;

/// The LSNs every request carries (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadLsns {
    pub request_lsn: Lsn,
    pub not_modified_since: Lsn,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// `auth_token` is a JWT (see the `auth` crate), or empty.
    Hello {
        protocol_version: u16,
        tenant: TenantId,
        timeline: TimelineId,
        auth_token: String,
    },
    GetPage {
        id: u64,
        lsns: ReadLsns,
        rel: RelTag,
        blkno: BlockNumber,
    },
    Nblocks {
        id: u64,
        lsns: ReadLsns,
        rel: RelTag,
    },
    Exists {
        id: u64,
        lsns: ReadLsns,
        rel: RelTag,
    },
    DbSize {
        id: u64,
        lsns: ReadLsns,
        spcnode: Oid,
        dbnode: Oid,
    },
    GetSlruSegment {
        id: u64,
        lsns: ReadLsns,
        kind: SlruKind,
        segno: u32,
    },
}

/// What went wrong, for a client that branches on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum ErrorCode {
    /// Malformed or out-of-order message; the connection is closed.
    Protocol = 1,
    /// The tenant or timeline does not exist here.
    NotFound = 2,
    /// The requested LSN is below the GC horizon.
    LsnTooOld = 3,
    /// The server did not reach `not_modified_since` in time.
    LsnTimeout = 4,
    /// The block is beyond the end of the relation, or the relation does not exist.
    NoSuchBlock = 5,
    /// Anything else (I/O, WAL redo); the message says what.
    Internal = 6,
    /// The `Hello`'s token is missing, invalid, or does not grant the timeline.
    Unauthorized = 7,
}

impl ErrorCode {
    fn from_u16(v: u16) -> Option<ErrorCode> {
        use ErrorCode::*;
        [Protocol, NotFound, LsnTooOld, LsnTimeout, NoSuchBlock, Internal, Unauthorized].into_iter().find(|c| *c as u16 == v)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    HelloOk {
        protocol_version: u16,
    },
    Page {
        id: u64,
        page: Vec<u8>,
    },
    Nblocks {
        id: u64,
        nblocks: u32,
    },
    Exists {
        id: u64,
        exists: bool,
    },
    DbSize {
        id: u64,
        size_bytes: u64,
    },
    SlruSegment {
        id: u64,
        data: Vec<u8>,
    },
    /// `id` is 0 for an error that answers no request (a failed `Hello`).
    Error {
        id: u64,
        code: ErrorCode,
        message: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PagestreamError {
    #[error("incomplete page service message: have {have} bytes, need {need}")]
    Incomplete { have: usize, need: usize },
    #[error("page service message of {0} bytes exceeds the limit of {MESSAGE_BYTES_MAX}")]
    TooLong(usize),
    #[error("unrecognized page service message tag: {0}")]
    UnknownTag(u8),
    #[error("page service message {tag:?} has a payload of {len} bytes, expected {expected}")]
    BadLength { tag: char, len: usize, expected: &'static str },
    #[error("invalid fork number in page service message: {0}")]
    BadFork(u8),
    #[error("unknown SLRU kind in page service message: {0}")]
    BadSlruKind(u8),
    #[error("unknown error code in page service message: {0}")]
    BadErrorCode(u16),
    #[error("not_modified_since {not_modified_since} is above request_lsn {request_lsn}")]
    LsnOrder { request_lsn: Lsn, not_modified_since: Lsn },
    #[error("request_lsn must be valid, got 0/0")]
    InvalidLsn,
    #[error("exists flag must be 0 or 1, got {0}")]
    BadBool(u8),
    #[error("{0} is not valid UTF-8")]
    BadUtf8(&'static str),
    #[error("request id 0 is reserved for connection-level errors")]
    ReservedId,
}

// Tags: requests are lowercase, responses uppercase, so a stream read in the wrong
// direction fails on its first byte.
const T_HELLO: u8 = b'h';
const T_GET_PAGE: u8 = b'p';
const T_NBLOCKS: u8 = b'n';
const T_EXISTS: u8 = b'e';
const T_DB_SIZE: u8 = b'd';
const T_SLRU: u8 = b's';
const T_HELLO_OK: u8 = b'H';
const T_PAGE: u8 = b'P';
const T_NBLOCKS_R: u8 = b'N';
const T_EXISTS_R: u8 = b'E';
const T_DB_SIZE_R: u8 = b'D';
const T_SLRU_R: u8 = b'S';
const T_ERROR: u8 = b'X';

const LSNS_BYTES: usize = 16;
const REL_BYTES: usize = 13;

/// Writes the frame header and returns where the payload starts.
fn begin(buf: &mut Vec<u8>, tag: u8) -> usize {
    buf.push(tag);
    buf.extend_from_slice(&[0; 4]);
    buf.len()
}

fn finish(buf: &mut [u8], start: usize) {
    let len = u32::try_from(buf.len() - start).expect("page service message fits in u32");
    buf[start - 4..start].copy_from_slice(&len.to_be_bytes());
}

fn put_lsns(buf: &mut Vec<u8>, l: &ReadLsns) {
    buf.extend_from_slice(&l.request_lsn.0.to_be_bytes());
    buf.extend_from_slice(&l.not_modified_since.0.to_be_bytes());
}

fn put_rel(buf: &mut Vec<u8>, r: &RelTag) {
    buf.extend_from_slice(&r.spcnode.to_be_bytes());
    buf.extend_from_slice(&r.dbnode.to_be_bytes());
    buf.extend_from_slice(&r.relnode.to_be_bytes());
    buf.push(r.forknum as u8);
}

/// Reads fixed-size fields off a payload whose length was checked beforehand.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let (head, rest) = self.0.split_at(N);
        self.0 = rest;
        head.try_into().expect("length checked by the caller")
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_be_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_be_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_be_bytes(self.take())
    }
    fn request_id(&mut self) -> Result<u64, PagestreamError> {
        match self.u64() {
            0 => Err(PagestreamError::ReservedId),
            id => Ok(id),
        }
    }
    fn lsns(&mut self) -> Result<ReadLsns, PagestreamError> {
        let request_lsn = Lsn(self.u64());
        let not_modified_since = Lsn(self.u64());
        if !request_lsn.is_valid() {
            return Err(PagestreamError::InvalidLsn);
        }
        if not_modified_since > request_lsn {
            return Err(PagestreamError::LsnOrder { request_lsn, not_modified_since });
        }
        Ok(ReadLsns { request_lsn, not_modified_since })
    }
    fn rel(&mut self) -> Result<RelTag, PagestreamError> {
        let (spcnode, dbnode, relnode) = (self.u32(), self.u32(), self.u32());
        let fork = self.u8();
        let forknum = ForkNumber::from_u8(fork).ok_or(PagestreamError::BadFork(fork))?;
        Ok(RelTag { spcnode, dbnode, relnode, forknum })
    }
    fn rest(&mut self) -> &[u8] {
        std::mem::take(&mut self.0)
    }
}

/// Splits one frame off the front of `bytes`: (tag, payload, bytes used).
fn frame(bytes: &[u8]) -> Result<(u8, &[u8], usize), PagestreamError> {
    if bytes.len() < 5 {
        return Err(PagestreamError::Incomplete { have: bytes.len(), need: 5 });
    }
    let len = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize;
    if len > MESSAGE_BYTES_MAX {
        return Err(PagestreamError::TooLong(len));
    }
    if bytes.len() < 5 + len {
        return Err(PagestreamError::Incomplete { have: bytes.len(), need: 5 + len });
    }
    Ok((bytes[0], &bytes[5..5 + len], 5 + len))
}

fn expect_len(tag: u8, len: usize, ok: bool, expected: &'static str) -> Result<(), PagestreamError> {
    if ok {
        Ok(())
    } else {
        Err(PagestreamError::BadLength { tag: tag as char, len, expected })
    }
}

/// The length of a complete frame at the front of `bytes`, if there is one: lets a reader
/// know how much to read before decoding. Errors as [`Request::decode`] does on the header.
pub fn frame_len(bytes: &[u8]) -> Result<usize, PagestreamError> {
    frame(bytes).map(|(_, _, used)| used)
}

impl Request {
    pub fn encode(&self, buf: &mut Vec<u8>) {
        let start;
        match self {
            Request::Hello { protocol_version, tenant, timeline, auth_token } => {
                start = begin(buf, T_HELLO);
                buf.extend_from_slice(&protocol_version.to_be_bytes());
                buf.extend_from_slice(tenant.as_bytes());
                buf.extend_from_slice(timeline.as_bytes());
                buf.extend_from_slice(auth_token.as_bytes());
            }
            Request::GetPage { id, lsns, rel, blkno } => {
                start = begin(buf, T_GET_PAGE);
                buf.extend_from_slice(&id.to_be_bytes());
                put_lsns(buf, lsns);
                put_rel(buf, rel);
                buf.extend_from_slice(&blkno.0.to_be_bytes());
            }
            Request::Nblocks { id, lsns, rel } | Request::Exists { id, lsns, rel } => {
                start = begin(buf, if matches!(self, Request::Nblocks { .. }) { T_NBLOCKS } else { T_EXISTS });
                buf.extend_from_slice(&id.to_be_bytes());
                put_lsns(buf, lsns);
                put_rel(buf, rel);
            }
            Request::DbSize { id, lsns, spcnode, dbnode } => {
                start = begin(buf, T_DB_SIZE);
                buf.extend_from_slice(&id.to_be_bytes());
                put_lsns(buf, lsns);
                buf.extend_from_slice(&spcnode.to_be_bytes());
                buf.extend_from_slice(&dbnode.to_be_bytes());
            }
            Request::GetSlruSegment { id, lsns, kind, segno } => {
                start = begin(buf, T_SLRU);
                buf.extend_from_slice(&id.to_be_bytes());
                put_lsns(buf, lsns);
                buf.push(*kind as u8);
                buf.extend_from_slice(&segno.to_be_bytes());
            }
        }
        finish(buf, start);
    }

    /// Decodes one request from the front of `bytes`; returns it and the bytes it used.
    pub fn decode(bytes: &[u8]) -> Result<(Request, usize), PagestreamError> {
        let (tag, p, used) = frame(bytes)?;
        let len = p.len();
        let mut f = Fields(p);
        let req = match tag {
            T_HELLO => {
                expect_len(tag, len, (34..=34 + TOKEN_BYTES_MAX).contains(&len), "34 to 4130")?;
                let (protocol_version, tenant, timeline) = (f.u16(), TenantId::from_bytes(f.take()), TimelineId::from_bytes(f.take()));
                let auth_token = std::str::from_utf8(f.rest()).map_err(|_| PagestreamError::BadUtf8("token"))?.to_string();
                Request::Hello { protocol_version, tenant, timeline, auth_token }
            }
            T_GET_PAGE => {
                expect_len(tag, len, len == 8 + LSNS_BYTES + REL_BYTES + 4, "41")?;
                Request::GetPage { id: f.request_id()?, lsns: f.lsns()?, rel: f.rel()?, blkno: BlockNumber(f.u32()) }
            }
            T_NBLOCKS | T_EXISTS => {
                expect_len(tag, len, len == 8 + LSNS_BYTES + REL_BYTES, "37")?;
                let (id, lsns, rel) = (f.request_id()?, f.lsns()?, f.rel()?);
                if tag == T_NBLOCKS {
                    Request::Nblocks { id, lsns, rel }
                } else {
                    Request::Exists { id, lsns, rel }
                }
            }
            T_DB_SIZE => {
                expect_len(tag, len, len == 8 + LSNS_BYTES + 8, "32")?;
                Request::DbSize { id: f.request_id()?, lsns: f.lsns()?, spcnode: f.u32(), dbnode: f.u32() }
            }
            T_SLRU => {
                expect_len(tag, len, len == 8 + LSNS_BYTES + 5, "29")?;
                let (id, lsns) = (f.request_id()?, f.lsns()?);
                let k = f.u8();
                let kind = SlruKind::from_u32(u32::from(k)).ok_or(PagestreamError::BadSlruKind(k))?;
                Request::GetSlruSegment { id, lsns, kind, segno: f.u32() }
            }
            other => return Err(PagestreamError::UnknownTag(other)),
        };
        Ok((req, used))
    }

    /// The id of a request (0 for `Hello`).
    pub fn id(&self) -> u64 {
        match self {
            Request::Hello { .. } => 0,
            Request::GetPage { id, .. }
            | Request::Nblocks { id, .. }
            | Request::Exists { id, .. }
            | Request::DbSize { id, .. }
            | Request::GetSlruSegment { id, .. } => *id,
        }
    }

    /// Checks that `resp` answers this request: an error for it, or the kind of answer it
    /// asks for, with its id (and for a page, a whole one). A mismatch means the connection
    /// is out of step (a bug, or a stale answer on a reused connection): the caller must
    /// not use the answer, and should drop the connection.
    pub fn check_answer(&self, resp: &Response) -> Result<(), String> {
        let kind_ok = matches!(
            (self, resp),
            (Request::Hello { .. }, Response::HelloOk { .. })
                | (Request::GetPage { .. }, Response::Page { .. })
                | (Request::Nblocks { .. }, Response::Nblocks { .. })
                | (Request::Exists { .. }, Response::Exists { .. })
                | (Request::DbSize { .. }, Response::DbSize { .. })
                | (Request::GetSlruSegment { .. }, Response::SlruSegment { .. })
                | (_, Response::Error { .. })
        );
        if !kind_ok {
            return Err(format!("the answer to request {} is of the wrong kind: {}", self.id(), resp.kind()));
        }
        if let Some(id) = resp.id() {
            if id != self.id() && !matches!(self, Request::Hello { .. }) {
                return Err(format!("the answer to request {} carries request id {id}", self.id()));
            }
        }
        if let Response::Page { page, .. } = resp {
            if page.len() != PAGE_SIZE_BYTES {
                return Err(format!("the page for request {} is {} bytes, not {PAGE_SIZE_BYTES}", self.id(), page.len()));
            }
        }
        Ok(())
    }
}

impl Response {
    /// The request id it answers (`None` for `HelloOk`).
    pub fn id(&self) -> Option<u64> {
        match self {
            Response::HelloOk { .. } => None,
            Response::Page { id, .. }
            | Response::Nblocks { id, .. }
            | Response::Exists { id, .. }
            | Response::DbSize { id, .. }
            | Response::SlruSegment { id, .. }
            | Response::Error { id, .. } => Some(*id),
        }
    }

    /// What kind of answer it is, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Response::HelloOk { .. } => "HelloOk",
            Response::Page { .. } => "Page",
            Response::Nblocks { .. } => "Nblocks",
            Response::Exists { .. } => "Exists",
            Response::DbSize { .. } => "DbSize",
            Response::SlruSegment { .. } => "SlruSegment",
            Response::Error { .. } => "Error",
        }
    }

    pub fn encode(&self, buf: &mut Vec<u8>) {
        let start;
        match self {
            Response::HelloOk { protocol_version } => {
                start = begin(buf, T_HELLO_OK);
                buf.extend_from_slice(&protocol_version.to_be_bytes());
            }
            Response::Page { id, page } => {
                start = begin(buf, T_PAGE);
                buf.extend_from_slice(&id.to_be_bytes());
                buf.extend_from_slice(page);
            }
            Response::Nblocks { id, nblocks } => {
                start = begin(buf, T_NBLOCKS_R);
                buf.extend_from_slice(&id.to_be_bytes());
                buf.extend_from_slice(&nblocks.to_be_bytes());
            }
            Response::Exists { id, exists } => {
                start = begin(buf, T_EXISTS_R);
                buf.extend_from_slice(&id.to_be_bytes());
                buf.push(u8::from(*exists));
            }
            Response::DbSize { id, size_bytes } => {
                start = begin(buf, T_DB_SIZE_R);
                buf.extend_from_slice(&id.to_be_bytes());
                buf.extend_from_slice(&size_bytes.to_be_bytes());
            }
            Response::SlruSegment { id, data } => {
                start = begin(buf, T_SLRU_R);
                buf.extend_from_slice(&id.to_be_bytes());
                buf.extend_from_slice(data);
            }
            Response::Error { id, code, message } => {
                start = begin(buf, T_ERROR);
                buf.extend_from_slice(&id.to_be_bytes());
                buf.extend_from_slice(&(*code as u16).to_be_bytes());
                // Cut at a character boundary so the message stays valid UTF-8.
                let mut end = message.len().min(ERROR_MESSAGE_BYTES_MAX);
                while !message.is_char_boundary(end) {
                    end -= 1;
                }
                buf.extend_from_slice(&message.as_bytes()[..end]);
            }
        }
        finish(buf, start);
    }

    /// Decodes one response from the front of `bytes`; returns it and the bytes it used.
    pub fn decode(bytes: &[u8]) -> Result<(Response, usize), PagestreamError> {
        let (tag, p, used) = frame(bytes)?;
        let len = p.len();
        let mut f = Fields(p);
        let resp = match tag {
            T_HELLO_OK => {
                expect_len(tag, len, len == 2, "2")?;
                Response::HelloOk { protocol_version: f.u16() }
            }
            T_PAGE => {
                expect_len(tag, len, len == 8 + PAGE_SIZE_BYTES, "8 + 8192")?;
                Response::Page { id: f.u64(), page: f.rest().to_vec() }
            }
            T_NBLOCKS_R => {
                expect_len(tag, len, len == 12, "12")?;
                Response::Nblocks { id: f.u64(), nblocks: f.u32() }
            }
            T_EXISTS_R => {
                expect_len(tag, len, len == 9, "9")?;
                let id = f.u64();
                let exists = match f.u8() {
                    0 => false,
                    1 => true,
                    other => return Err(PagestreamError::BadBool(other)),
                };
                Response::Exists { id, exists }
            }
            T_DB_SIZE_R => {
                expect_len(tag, len, len == 16, "16")?;
                Response::DbSize { id: f.u64(), size_bytes: f.u64() }
            }
            T_SLRU_R => {
                let ok = len >= 8 && (len - 8) % PAGE_SIZE_BYTES == 0 && len - 8 <= SLRU_SEGMENT_BYTES_MAX;
                expect_len(tag, len, ok, "8 + a whole number of pages, at most 32")?;
                Response::SlruSegment { id: f.u64(), data: f.rest().to_vec() }
            }
            T_ERROR => {
                expect_len(tag, len, (10..=10 + ERROR_MESSAGE_BYTES_MAX).contains(&len), "10 + a message of at most 4096 bytes")?;
                let id = f.u64();
                let c = f.u16();
                let code = ErrorCode::from_u16(c).ok_or(PagestreamError::BadErrorCode(c))?;
                let message = std::str::from_utf8(f.rest()).map_err(|_| PagestreamError::BadUtf8("error message"))?.to_string();
                Response::Error { id, code, message }
            }
            other => return Err(PagestreamError::UnknownTag(other)),
        };
        Ok((resp, used))
    }
}

#[cfg(test)]
mod tests;
