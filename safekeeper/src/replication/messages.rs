//! Backend messages of PostgreSQL's protocol as a replication server sends them, the
//! errors it reports, and their SQLSTATEs.

use std::time::SystemTime;

use bytes::{BufMut, BytesMut};
use proto::Lsn;

pub(super) const TEXT_OID: u32 = 25;
pub(super) const INT4_OID: u32 = 23;

/// SQLSTATE codes used here.
pub(super) mod sqlstate {
    pub const PROTOCOL_VIOLATION: &str = "08P01";
    pub const FEATURE_NOT_SUPPORTED: &str = "0A000";
    pub const INVALID_PARAMETER_VALUE: &str = "22023";
    pub const CHARACTER_NOT_IN_REPERTOIRE: &str = "22021";
    pub const INVALID_AUTHORIZATION: &str = "28000";
    pub const INVALID_PASSWORD: &str = "28P01";
    pub const INSUFFICIENT_PRIVILEGE: &str = "42501";
    pub const INVALID_CATALOG_NAME: &str = "3D000";
    pub const SYNTAX_ERROR: &str = "42601";
    pub const UNDEFINED_OBJECT: &str = "42704";
    pub const OBJECT_NOT_IN_PREREQUISITE_STATE: &str = "55000";
    pub const UNDEFINED_FILE: &str = "58P01";
    pub const DATA_CORRUPTED: &str = "XX001";
    pub const ADMIN_SHUTDOWN: &str = "57P01";
    pub const CONNECTION_FAILURE: &str = "08006";
}

/// An error to report to the client.
#[derive(Debug)]
pub(super) struct PgError {
    pub fatal: bool,
    pub code: &'static str,
    pub message: String,
}

impl PgError {
    pub fn error(code: &'static str, message: impl Into<String>) -> PgError {
        PgError { fatal: false, code, message: message.into() }
    }
    pub fn fatal(code: &'static str, message: impl Into<String>) -> PgError {
        PgError { fatal: true, code, message: message.into() }
    }
}

pub(super) fn message(buf: &mut BytesMut, tag: u8, body: impl FnOnce(&mut BytesMut)) {
    buf.put_u8(tag);
    let at = buf.len();
    buf.put_u32(0);
    body(buf);
    let len = (buf.len() - at) as u32;
    buf[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

pub(super) fn put_cstr(buf: &mut BytesMut, s: &str) {
    // A NUL inside would end the string early on the client's side.
    buf.put_slice(s.replace('\0', " ").as_bytes());
    buf.put_u8(0);
}

pub(super) fn error_response(buf: &mut BytesMut, e: &PgError) {
    let severity = if e.fatal { "FATAL" } else { "ERROR" };
    message(buf, b'E', |b| {
        for (field, value) in [(b'S', severity), (b'V', severity), (b'C', e.code), (b'M', e.message.as_str())] {
            b.put_u8(field);
            put_cstr(b, value);
        }
        b.put_u8(0);
    });
}

pub(super) fn ready_for_query(buf: &mut BytesMut) {
    message(buf, b'Z', |b| b.put_u8(b'I'));
}

pub(super) fn parameter_status(buf: &mut BytesMut, name: &str, value: &str) {
    message(buf, b'S', |b| {
        put_cstr(b, name);
        put_cstr(b, value);
    });
}

pub(super) fn row_description(buf: &mut BytesMut, columns: &[(&str, u32)]) {
    message(buf, b'T', |b| {
        b.put_i16(columns.len() as i16);
        for (name, type_oid) in columns {
            put_cstr(b, name);
            b.put_u32(0); // table
            b.put_i16(0); // column
            b.put_u32(*type_oid);
            b.put_i16(if *type_oid == INT4_OID { 4 } else { -1 });
            b.put_i32(-1); // type modifier
            b.put_i16(0); // text format
        }
    });
}

pub(super) fn data_row(buf: &mut BytesMut, values: &[Option<&str>]) {
    message(buf, b'D', |b| {
        b.put_i16(values.len() as i16);
        for v in values {
            match v {
                Some(v) => {
                    b.put_i32(v.len() as i32);
                    b.put_slice(v.as_bytes());
                }
                None => b.put_i32(-1),
            }
        }
    });
}

pub(super) fn command_complete(buf: &mut BytesMut, tag: &str) {
    message(buf, b'C', |b| put_cstr(b, tag));
}

/// Microseconds since 2000-01-01, PostgreSQL's `TimestampTz`.
pub(super) fn pg_now() -> i64 {
    const PG_EPOCH_UNIX_SECONDS: i64 = 946_684_800;
    let unix = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(unix.as_micros()).unwrap_or(i64::MAX).saturating_sub(PG_EPOCH_UNIX_SECONDS * 1_000_000)
}

pub(super) fn keepalive(buf: &mut BytesMut, wal_end: Lsn, reply_requested: bool) {
    message(buf, b'd', |b| {
        b.put_u8(b'k');
        b.put_u64(wal_end.0);
        b.put_i64(pg_now());
        b.put_u8(reply_requested as u8);
    });
}
