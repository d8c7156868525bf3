//! The server side of PostgreSQL's physical streaming replication protocol: how a
//! pageserver (and later a read replica, or `pg_receivewal`) streams a timeline's
//! *committed* WAL from a safekeeper.
//!
//! The listener hands every connection that does not open with the proposer protocol to
//! [`serve`]. The protocol code is generic over [`WalSource`], the little a replication
//! connection needs from a timeline, so it is tested against an in-memory source.
//!
//! # Connection
//! 1. Startup. An `SSLRequest` or `GSSENCRequest` is answered `N` (no encryption), then the
//!    real `StartupMessage` is read (protocol 3.0; a later minor version or `_pq_.` options
//!    get a `NegotiateProtocolVersion`). Parameters:
//!    - `replication`: must be `true`/`on`/`yes`/`1` (physical replication). `database`
//!      (logical replication) and plain SQL connections are refused.
//!    - `database`: `<tenant id>/<timeline id>` in hex, naming the timeline. PostgreSQL's own
//!      tools (`pg_receivewal`, `pg_basebackup`) always send `database=replication` on a
//!      physical replication connection, so when `database` is absent or `replication` the
//!      timeline is taken from `options` instead: `-c fjord.timeline=<tenant>/<timeline>`.
//!    - `user`: required, anything (trust authentication).
//!
//!    A missing, malformed or unknown timeline is a `FATAL` `ErrorResponse` and the
//!    connection is closed. Otherwise: `AuthenticationOk`, `ParameterStatus` (server_version
//!    15, UTF8 encodings, ISO dates, integer datetimes), `BackendKeyData`, `ReadyForQuery`.
//! 2. Simple queries, one command each (keywords case-insensitive, optional `;`):
//!    - `IDENTIFY_SYSTEM`: one row `systemid` (text), `timeline` (int4, always 1), `xlogpos`
//!      (text, the commit LSN) and `dbname` (NULL).
//!    - `SHOW name` for `wal_segment_size`, `server_version`, `server_version_num`,
//!      `data_directory_mode`, `integer_datetimes`, `server_encoding`, `client_encoding`.
//!    - `START_REPLICATION [SLOT name] [PHYSICAL] X/X [TIMELINE 1]`: streams WAL from `X/X`.
//!      Slots are not kept: a slot name is accepted and ignored, and what is streamed is
//!      decided only by the requested LSN.
//!
//!    Other replication commands (`TIMELINE_HISTORY`, `BASE_BACKUP`, slot commands, logical
//!    replication) and SQL get an `ERROR` and the connection stays usable.
//! 3. Streaming (`CopyBothResponse`, then CopyData both ways): `XLogData` messages
//!    (`w`, start LSN, end of WAL = commit LSN, send time, bytes) carry the WAL from the
//!    requested LSN up to the commit LSN in chunks of at most 128 KiB that never cross a
//!    WAL segment boundary; then the sender waits for the commit LSN to move. When idle it
//!    sends a primary keepalive (`k`) every second; when the client has sent nothing for
//!    half the sender timeout the keepalive asks for a reply, and after the whole timeout
//!    (60 s) the connection is closed. Standby status updates (`r`) are recorded with
//!    [`WalSource::set_pageserver_feedback`]; hot standby feedback (`h`) is ignored; the
//!    client's `CopyDone` ends streaming (`CopyDone`, `CommandComplete`, `ReadyForQuery`);
//!    `Terminate` closes.
//!
//! # Invariants
//! - Only committed WAL is sent: never beyond the commit LSN read from the timeline's watch.
//! - Only verified WAL is sent: every chunk comes from [`WalSource::read_wal_verified`];
//!   a read error (a corrupt segment) is logged at error level, reported to the client as a
//!   `FATAL` error (SQLSTATE XX001) and the connection is closed. A chunk of the wrong
//!   length is treated the same way.
//! - The WAL sent is contiguous: each `XLogData` starts where the previous one ended, the
//!   first at the requested LSN. A start beyond the commit LSN or before the beginning of
//!   the timeline's WAL is an `ERROR` (as PostgreSQL's walsender answers), not a gap.
//! - Bad input never panics. Where PostgreSQL's framing stays intact (a bad query string,
//!   an unknown command) the answer is `ERROR` then `ReadyForQuery` and the connection goes
//!   on; where the framing is broken (impossible length, unknown message type, bad startup
//!   packet) or the replication sub-protocol is violated, it is a `FATAL` error and the
//!   connection is closed. Every error message says what was wrong.
//!
//! Frontend messages are decoded here (the `postgres-protocol` crate parses only backend
//! messages); backend messages are encoded here too, since that crate encodes only frontend
//! ones. Its frontend encoder and backend parser drive the tests (`tests/replication.rs`),
//! together with PostgreSQL's `pg_receivewal`.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{anyhow, Context};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use proto::lsn::WAL_SEGMENT_SIZE_BYTES;
use proto::{Lsn, TenantId, TimelineId};
use quorum::wire::PageserverFeedback;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// What a replication connection needs from a timeline. The safekeeper's timeline
/// implements it; the tests use an in-memory one.
pub trait WalSource: Send + Sync + 'static {
    /// PostgreSQL's system identifier of the cluster whose WAL this is.
    fn system_id(&self) -> u64;
    /// The first LSN of WAL this safekeeper has for the timeline; nothing before it can be
    /// served.
    fn wal_start_lsn(&self) -> Lsn;
    /// The commit LSN: WAL below it is committed and may be served.
    fn commit_lsn(&self) -> Lsn;
    /// A watch of the commit LSN, which only moves forward. Its sender being dropped means
    /// the timeline is going away: streaming ends.
    fn commit_lsn_watch(&self) -> watch::Receiver<Lsn>;
    /// The WAL bytes in `[from, to)`, exactly `to - from` of them, checked against their
    /// checksums (an error for a corrupt or missing segment). Called only with
    /// `wal_start_lsn() <= from < to <= commit LSN`, and never across a segment boundary.
    /// It may block (file I/O): it runs on tokio's blocking pool.
    fn read_wal_verified(&self, from: Lsn, to: Lsn) -> anyhow::Result<Bytes>;
    /// Records the progress the client reported in a standby status update.
    fn set_pageserver_feedback(&self, feedback: PageserverFeedback);
}

/// Timing and size limits of a replication connection.
#[derive(Clone, Debug)]
pub struct Config {
    /// A keepalive goes out after this long without sending anything.
    pub keepalive_interval: Duration,
    /// PostgreSQL's `wal_sender_timeout`: with nothing from the client for half of it, a
    /// keepalive asks for a reply; after all of it the connection is closed. A write that
    /// blocks this long also closes it.
    pub sender_timeout: Duration,
    /// The most WAL one `XLogData` message carries.
    pub send_bytes_max: usize,
    /// How long the client has to complete the startup.
    pub startup_timeout: Duration,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            keepalive_interval: Duration::from_secs(1),
            sender_timeout: Duration::from_secs(60),
            send_bytes_max: MAX_SEND_BYTES,
            startup_timeout: Duration::from_secs(60),
        }
    }
}

/// PostgreSQL's `MAX_SEND_SIZE`: 16 WAL pages.
pub const MAX_SEND_BYTES: usize = 128 * 1024;
/// What `server_version` says: the PostgreSQL major version whose WAL is served.
pub const SERVER_VERSION: &str = "15.0";
const SERVER_VERSION_NUM: &str = "150000";
/// The only PostgreSQL timeline a fjord compute writes.
pub const PG_TIMELINE: u32 = 1;
/// The `options` setting that names the timeline when `database` cannot (see the module
/// documentation).
pub const TIMELINE_OPTION: &str = "fjord.timeline";

const STARTUP_PACKET_MAX: usize = 10_000;
/// No frontend message of this protocol is longer (PostgreSQL allows 1 GB for CopyData,
/// but a replication client sends only small status messages and queries).
const MESSAGE_BYTES_MAX: usize = 1 << 20;
const PROTOCOL_3_0: u32 = 3 << 16;
const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;
const CANCEL_REQUEST: u32 = 80_877_102;

const TEXT_OID: u32 = 25;
const INT4_OID: u32 = 23;

/// SQLSTATE codes used here.
mod sqlstate {
    pub const PROTOCOL_VIOLATION: &str = "08P01";
    pub const FEATURE_NOT_SUPPORTED: &str = "0A000";
    pub const INVALID_PARAMETER_VALUE: &str = "22023";
    pub const CHARACTER_NOT_IN_REPERTOIRE: &str = "22021";
    pub const INVALID_AUTHORIZATION: &str = "28000";
    pub const INVALID_CATALOG_NAME: &str = "3D000";
    pub const SYNTAX_ERROR: &str = "42601";
    pub const UNDEFINED_OBJECT: &str = "42704";
    pub const OBJECT_NOT_IN_PREREQUISITE_STATE: &str = "55000";
    pub const UNDEFINED_FILE: &str = "58P01";
    pub const DATA_CORRUPTED: &str = "XX001";
    pub const ADMIN_SHUTDOWN: &str = "57P01";
    pub const CONNECTION_FAILURE: &str = "08006";
}

/// Serves one replication connection handed over by the safekeeper's listener.
pub async fn serve(stream: TcpStream, sk: Arc<crate::Safekeeper>) -> anyhow::Result<()> {
    serve_with(stream, move |tenant, timeline| lookup_timeline(&sk, tenant, timeline)).await
}

/// The timeline a replication connection asked for.
///
/// MERGE: this is where the safekeeper's timeline registry plugs in: return
/// `sk.get_timeline(tenant, timeline)` (an `Arc<Timeline>`) once `crate::Safekeeper` and
/// `crate::timeline::Timeline` exist and `Timeline` implements [`WalSource`]; until then
/// `crate::Safekeeper` is a placeholder without timelines.
fn lookup_timeline(sk: &crate::Safekeeper, tenant: TenantId, timeline: TimelineId) -> anyhow::Result<Arc<dyn WalSource>> {
    sk.replication_source(tenant, timeline)
}

/// Serves one replication connection with the default [`Config`], looking the timeline
/// named at startup up with `lookup` (whose error is shown to the client).
pub async fn serve_with<S, L>(stream: TcpStream, lookup: L) -> anyhow::Result<()>
where
    S: WalSource + ?Sized,
    L: Fn(TenantId, TimelineId) -> anyhow::Result<Arc<S>>,
{
    serve_with_config(stream, lookup, Config::default()).await
}

/// [`serve_with`] with explicit limits.
pub async fn serve_with_config<S, L>(stream: TcpStream, lookup: L, config: Config) -> anyhow::Result<()>
where
    S: WalSource + ?Sized,
    L: Fn(TenantId, TimelineId) -> anyhow::Result<Arc<S>>,
{
    let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "unknown peer".into());
    let _ = stream.set_nodelay(true);
    let (read, write) = stream.into_split();
    let mut conn = Conn { read: Some(read), write, out: BytesMut::new(), config };
    let span = tracing::info_span!("replication", peer = %peer);
    let result = tracing::Instrument::instrument(run(&mut conn, lookup), span.clone()).await;
    match &result {
        Ok(()) => tracing::debug!(parent: &span, "replication connection closed"),
        Err(e) => tracing::info!(parent: &span, "replication connection ended: {e:#}"),
    }
    result
}

/// An error to report to the client.
#[derive(Debug)]
struct PgError {
    fatal: bool,
    code: &'static str,
    message: String,
}

impl PgError {
    fn error(code: &'static str, message: impl Into<String>) -> PgError {
        PgError { fatal: false, code, message: message.into() }
    }
    fn fatal(code: &'static str, message: impl Into<String>) -> PgError {
        PgError { fatal: true, code, message: message.into() }
    }
}

struct Conn {
    /// Taken by the reader task once the startup is done.
    read: Option<OwnedReadHalf>,
    write: OwnedWriteHalf,
    /// Messages not yet written.
    out: BytesMut,
    config: Config,
}

impl Conn {
    /// Writes everything queued, giving up after the sender timeout.
    async fn flush(&mut self) -> anyhow::Result<()> {
        tokio::time::timeout(self.config.sender_timeout, self.write.write_all(&self.out))
            .await
            .map_err(|_| anyhow!("the client read nothing for {:?}", self.config.sender_timeout))?
            .context("write to the client")?;
        self.out.clear();
        Ok(())
    }

    /// Sends `e` (and `ReadyForQuery` after a non-fatal error).
    async fn report(&mut self, e: &PgError) -> anyhow::Result<()> {
        error_response(&mut self.out, e);
        if !e.fatal {
            ready_for_query(&mut self.out);
        }
        self.flush().await
    }

    /// Sends a fatal error and returns it as the connection's result. Sending is best
    /// effort: the connection is being closed anyway.
    async fn fatal(&mut self, code: &'static str, message: String) -> anyhow::Error {
        let e = PgError::fatal(code, message);
        let _ = self.report(&e).await;
        anyhow!("{} (SQLSTATE {})", e.message, e.code)
    }
}

// ---------------------------------------------------------------------------------------
// Backend messages.

fn message(buf: &mut BytesMut, tag: u8, body: impl FnOnce(&mut BytesMut)) {
    buf.put_u8(tag);
    let at = buf.len();
    buf.put_u32(0);
    body(buf);
    let len = (buf.len() - at) as u32;
    buf[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

fn put_cstr(buf: &mut BytesMut, s: &str) {
    // A NUL inside would end the string early on the client's side.
    buf.put_slice(s.replace('\0', " ").as_bytes());
    buf.put_u8(0);
}

fn error_response(buf: &mut BytesMut, e: &PgError) {
    let severity = if e.fatal { "FATAL" } else { "ERROR" };
    message(buf, b'E', |b| {
        for (field, value) in [(b'S', severity), (b'V', severity), (b'C', e.code), (b'M', e.message.as_str())] {
            b.put_u8(field);
            put_cstr(b, value);
        }
        b.put_u8(0);
    });
}

fn ready_for_query(buf: &mut BytesMut) {
    message(buf, b'Z', |b| b.put_u8(b'I'));
}

fn parameter_status(buf: &mut BytesMut, name: &str, value: &str) {
    message(buf, b'S', |b| {
        put_cstr(b, name);
        put_cstr(b, value);
    });
}

fn row_description(buf: &mut BytesMut, columns: &[(&str, u32)]) {
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

fn data_row(buf: &mut BytesMut, values: &[Option<&str>]) {
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

fn command_complete(buf: &mut BytesMut, tag: &str) {
    message(buf, b'C', |b| put_cstr(b, tag));
}

/// Microseconds since 2000-01-01, PostgreSQL's `TimestampTz`.
fn pg_now() -> i64 {
    const PG_EPOCH_UNIX_SECONDS: i64 = 946_684_800;
    let unix = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(unix.as_micros()).unwrap_or(i64::MAX).saturating_sub(PG_EPOCH_UNIX_SECONDS * 1_000_000)
}

fn keepalive(buf: &mut BytesMut, wal_end: Lsn, reply_requested: bool) {
    message(buf, b'd', |b| {
        b.put_u8(b'k');
        b.put_u64(wal_end.0);
        b.put_i64(pg_now());
        b.put_u8(reply_requested as u8);
    });
}

// ---------------------------------------------------------------------------------------
// Startup.

/// What the startup packet asked for.
struct Startup {
    tenant: TenantId,
    timeline: TimelineId,
    application_name: Option<String>,
}

/// Reads a startup packet's length and code and its body, validating the length.
async fn read_startup_packet(read: &mut OwnedReadHalf) -> Result<Option<(u32, Bytes)>, PgError> {
    let mut head = [0u8; 4];
    match read.read_exact(&mut head).await {
        Ok(_) => {}
        // A client that connects and goes away (a port probe) is no error.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(PgError::fatal(sqlstate::CONNECTION_FAILURE, format!("could not read the startup packet: {e}"))),
    }
    let len = u32::from_be_bytes(head) as usize;
    if !(8..=STARTUP_PACKET_MAX).contains(&len) {
        return Err(PgError::fatal(
            sqlstate::PROTOCOL_VIOLATION,
            format!("invalid length of startup packet: {len} bytes (expected 8 to {STARTUP_PACKET_MAX})"),
        ));
    }
    let mut body = vec![0u8; len - 4];
    read.read_exact(&mut body).await.map_err(|e| {
        PgError::fatal(sqlstate::PROTOCOL_VIOLATION, format!("incomplete startup packet ({len} bytes announced): {e}"))
    })?;
    let mut body = Bytes::from(body);
    let code = body.get_u32();
    Ok(Some((code, body)))
}

/// Splits `key\0value\0...\0` into pairs.
fn parse_startup_params(mut body: Bytes) -> Result<BTreeMap<String, String>, PgError> {
    let bad = |what: &str| PgError::fatal(sqlstate::PROTOCOL_VIOLATION, format!("invalid startup packet layout: {what}"));
    let cstr = |body: &mut Bytes| -> Result<String, PgError> {
        let n = body.iter().position(|&b| b == 0).ok_or_else(|| bad("expected terminator as last byte"))?;
        let s = body.split_to(n);
        body.advance(1);
        String::from_utf8(s.to_vec()).map_err(|_| bad("a parameter is not valid UTF-8"))
    };
    let mut params = BTreeMap::new();
    loop {
        let key = cstr(&mut body)?;
        if key.is_empty() {
            break;
        }
        let value = cstr(&mut body)?;
        params.insert(key, value);
    }
    if !body.is_empty() {
        return Err(bad("bytes after the terminator"));
    }
    Ok(params)
}

/// The value of `-c name=value` or `--name=value` in PostgreSQL's `options` string
/// (whitespace separates arguments; a backslash escapes the next character).
fn option_value(options: &str, name: &str) -> Option<String> {
    let mut args = Vec::new();
    let mut cur = String::new();
    let mut chars = options.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => cur.extend(chars.next()),
            c if c.is_whitespace() => {
                if !cur.is_empty() {
                    args.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        args.push(cur);
    }
    let mut found = None;
    let mut i = 0;
    while i < args.len() {
        let setting = if args[i] == "-c" {
            i += 1;
            args.get(i).map(String::as_str)
        } else {
            args[i].strip_prefix("-c").or_else(|| args[i].strip_prefix("--"))
        };
        if let Some((k, v)) = setting.and_then(|s| s.split_once('=')) {
            if k.replace('-', "_").eq_ignore_ascii_case(name) {
                found = Some(v.to_string());
            }
        }
        i += 1;
    }
    found
}

/// Parses `<tenant id>/<timeline id>`.
fn parse_timeline_name(s: &str, from: &str) -> Result<(TenantId, TimelineId), PgError> {
    let bad = |why: String| {
        PgError::fatal(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!("{from} {s:?} does not name a timeline: {why} (expected <tenant id>/<timeline id>, 32 hex digits each)"),
        )
    };
    let (t, tl) = s.split_once('/').ok_or_else(|| bad("no '/'".into()))?;
    let tenant = t.parse::<TenantId>().map_err(|e| bad(e.to_string()))?;
    let timeline = tl.parse::<TimelineId>().map_err(|e| bad(e.to_string()))?;
    Ok((tenant, timeline))
}

/// Checks the startup parameters of a replication connection.
fn check_startup(params: &BTreeMap<String, String>) -> Result<Startup, PgError> {
    match params.get("replication").map(|v| v.to_ascii_lowercase()) {
        Some(v) if ["true", "on", "yes", "1"].contains(&v.as_str()) => {}
        Some(v) if v == "database" => {
            return Err(PgError::fatal(
                sqlstate::FEATURE_NOT_SUPPORTED,
                "logical replication (replication=database) is not served by a safekeeper; connect with replication=true",
            ))
        }
        Some(v) if ["false", "off", "no", "0"].contains(&v.as_str()) => {
            return Err(PgError::fatal(
                sqlstate::FEATURE_NOT_SUPPORTED,
                "a safekeeper serves only physical replication connections, and this one has replication=false",
            ))
        }
        Some(v) => {
            return Err(PgError::fatal(
                sqlstate::INVALID_PARAMETER_VALUE,
                format!("invalid value for parameter \"replication\": {v:?} (expected true, on, yes or 1)"),
            ))
        }
        None => {
            return Err(PgError::fatal(
                sqlstate::FEATURE_NOT_SUPPORTED,
                "a safekeeper serves only physical replication connections: the startup parameter replication=true is missing",
            ))
        }
    }
    if params.get("user").is_none_or(|u| u.is_empty()) {
        return Err(PgError::fatal(sqlstate::INVALID_AUTHORIZATION, "no PostgreSQL user name specified in startup packet"));
    }
    let (tenant, timeline) = match params.get("database").filter(|d| d.as_str() != "replication") {
        Some(db) => parse_timeline_name(db, "database")?,
        None => match params.get("options").and_then(|o| option_value(o, TIMELINE_OPTION)) {
            Some(v) => parse_timeline_name(&v, TIMELINE_OPTION)?,
            None => {
                return Err(PgError::fatal(
                    sqlstate::INVALID_CATALOG_NAME,
                    format!(
                        "no timeline named: set the startup parameter database=<tenant id>/<timeline id>, \
                         or options='-c {TIMELINE_OPTION}=<tenant id>/<timeline id>'"
                    ),
                ))
            }
        },
    };
    Ok(Startup { tenant, timeline, application_name: params.get("application_name").cloned() })
}

/// Runs the startup: `Ok(None)` if the client went away or cancelled.
async fn startup(conn: &mut Conn) -> Result<Option<Startup>, PgError> {
    let read = conn.read.as_mut().expect("the reader is taken only after the startup");
    // At most one SSL and one GSS negotiation, as PostgreSQL allows.
    for _ in 0..3 {
        let Some((code, body)) = read_startup_packet(read).await? else { return Ok(None) };
        match code {
            SSL_REQUEST | GSSENC_REQUEST => {
                if !body.is_empty() {
                    return Err(PgError::fatal(sqlstate::PROTOCOL_VIOLATION, "invalid length of encryption request packet"));
                }
                conn.write
                    .write_all(b"N")
                    .await
                    .map_err(|e| PgError::fatal(sqlstate::CONNECTION_FAILURE, format!("write to the client: {e}")))?;
            }
            CANCEL_REQUEST => {
                tracing::debug!("ignoring a cancel request: a replication connection has nothing to cancel");
                return Ok(None);
            }
            code if code >> 16 == 3 => {
                let params = parse_startup_params(body)?;
                let unknown_pq: Vec<&String> = params.keys().filter(|k| k.starts_with("_pq_.")).collect();
                if code != PROTOCOL_3_0 || !unknown_pq.is_empty() {
                    message(&mut conn.out, b'v', |b| {
                        b.put_u32(0);
                        b.put_u32(unknown_pq.len() as u32);
                        for k in &unknown_pq {
                            put_cstr(b, k);
                        }
                    });
                }
                return check_startup(&params).map(Some);
            }
            code => {
                return Err(PgError::fatal(
                    sqlstate::FEATURE_NOT_SUPPORTED,
                    format!("unsupported frontend protocol {}.{}: server supports 3.0", code >> 16, code & 0xffff),
                ))
            }
        }
    }
    Err(PgError::fatal(sqlstate::PROTOCOL_VIOLATION, "too many encryption requests before the startup packet"))
}

// ---------------------------------------------------------------------------------------
// Frontend messages after the startup.

/// One frontend message: its type byte and body.
struct Frontend {
    tag: u8,
    body: Bytes,
}

/// Why the reader stopped.
enum ReadEnd {
    /// The client closed the connection between messages.
    Closed,
    /// The connection broke, or the framing did: nothing more can be read.
    Broken(PgError),
}

/// The message types a client may send after the startup.
fn known_frontend_tag(tag: u8) -> bool {
    matches!(tag, b'Q' | b'X' | b'P' | b'B' | b'E' | b'D' | b'S' | b'C' | b'H' | b'F' | b'd' | b'c' | b'f' | b'p')
}

/// Reads frontend messages and passes them on, so that a client's status updates are read
/// even while WAL is being written to it. Stops at the first framing error.
async fn read_messages(mut read: OwnedReadHalf, tx: mpsc::Sender<Result<Frontend, ReadEnd>>) {
    let end = loop {
        let mut head = [0u8; 5];
        match read.read_exact(&mut head[..1]).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break ReadEnd::Closed,
            Err(e) => break ReadEnd::Broken(PgError::fatal(sqlstate::CONNECTION_FAILURE, format!("read from the client: {e}"))),
        }
        let tag = head[0];
        if !known_frontend_tag(tag) {
            break ReadEnd::Broken(PgError::fatal(
                sqlstate::PROTOCOL_VIOLATION,
                format!("invalid frontend message type {tag} ({:?})", tag as char),
            ));
        }
        if let Err(e) = read.read_exact(&mut head[1..]).await {
            break ReadEnd::Broken(PgError::fatal(
                sqlstate::PROTOCOL_VIOLATION,
                format!("unexpected EOF or error within the header of a {:?} message: {e}", tag as char),
            ));
        }
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        if !(4..=MESSAGE_BYTES_MAX).contains(&len) {
            break ReadEnd::Broken(PgError::fatal(
                sqlstate::PROTOCOL_VIOLATION,
                format!("invalid message length {len} for a {:?} message (expected 4 to {MESSAGE_BYTES_MAX})", tag as char),
            ));
        }
        let mut body = vec![0u8; len - 4];
        if let Err(e) = read.read_exact(&mut body).await {
            break ReadEnd::Broken(PgError::fatal(
                sqlstate::PROTOCOL_VIOLATION,
                format!("incomplete {:?} message ({len} bytes announced): {e}", tag as char),
            ));
        }
        if tx.send(Ok(Frontend { tag, body: body.into() })).await.is_err() {
            return;
        }
    };
    let _ = tx.send(Err(end)).await;
}

/// Aborts the reader task when the connection ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What ends the handling of a message.
enum Next {
    Continue,
    /// Close the connection cleanly.
    Close,
}

async fn run<S, L>(conn: &mut Conn, lookup: L) -> anyhow::Result<()>
where
    S: WalSource + ?Sized,
    L: Fn(TenantId, TimelineId) -> anyhow::Result<Arc<S>>,
{
    let startup = match tokio::time::timeout(conn.config.startup_timeout, startup(conn)).await {
        Err(_) => return Err(anyhow!("the client did not complete the startup in {:?}", conn.config.startup_timeout)),
        Ok(Ok(None)) => return Ok(()),
        Ok(Ok(Some(s))) => s,
        Ok(Err(e)) => return Err(conn.fatal(e.code, e.message).await),
    };
    let source = match lookup(startup.tenant, startup.timeline) {
        Ok(s) => s,
        Err(e) => {
            let message = format!("timeline {}/{} is not available on this safekeeper: {e:#}", startup.tenant, startup.timeline);
            return Err(conn.fatal(sqlstate::INVALID_CATALOG_NAME, message).await);
        }
    };
    let span = tracing::info_span!(
        "timeline",
        tenant_id = %startup.tenant,
        timeline_id = %startup.timeline,
        application_name = startup.application_name.as_deref().unwrap_or(""),
    );
    tracing::Instrument::instrument(session(conn, source, &startup), span).await
}

static NEXT_BACKEND_ID: AtomicI32 = AtomicI32::new(1);

async fn session<S: WalSource + ?Sized>(conn: &mut Conn, source: Arc<S>, startup: &Startup) -> anyhow::Result<()> {
    tracing::debug!("replication connection started");
    message(&mut conn.out, b'R', |b| b.put_u32(0));
    for (name, value) in [
        ("server_version", SERVER_VERSION),
        ("server_encoding", "UTF8"),
        ("client_encoding", "UTF8"),
        ("DateStyle", "ISO, MDY"),
        ("integer_datetimes", "on"),
        ("TimeZone", "UTC"),
        ("standard_conforming_strings", "on"),
        ("application_name", startup.application_name.as_deref().unwrap_or("")),
    ] {
        parameter_status(&mut conn.out, name, value);
    }
    // Cancel requests are ignored, so the key only has to be well formed.
    let id = NEXT_BACKEND_ID.fetch_add(1, Ordering::Relaxed);
    message(&mut conn.out, b'K', |b| {
        b.put_i32(id);
        b.put_i32(id.wrapping_mul(0x2545_f491));
    });
    ready_for_query(&mut conn.out);
    conn.flush().await?;

    let (tx, mut rx) = mpsc::channel(64);
    let read = conn.read.take().expect("the reader is taken once");
    let _reader = AbortOnDrop(tokio::spawn(read_messages(read, tx)));
    // After an error in an extended-query message, everything up to Sync is skipped.
    let mut ignore_till_sync = false;
    loop {
        let msg = match rx.recv().await {
            None | Some(Err(ReadEnd::Closed)) => return Ok(()),
            Some(Err(ReadEnd::Broken(e))) => return Err(conn.fatal(e.code, e.message).await),
            Some(Ok(m)) => m,
        };
        match msg.tag {
            b'Q' => {
                if let Next::Close = query(conn, &source, &mut rx, msg.body).await? {
                    return Ok(());
                }
            }
            b'X' => return Ok(()),
            b'S' => {
                ignore_till_sync = false;
                ready_for_query(&mut conn.out);
                conn.flush().await?;
            }
            b'P' | b'B' | b'E' | b'D' | b'C' | b'H' => {
                if !ignore_till_sync {
                    ignore_till_sync = true;
                    error_response(
                        &mut conn.out,
                        &PgError::error(sqlstate::PROTOCOL_VIOLATION, "extended query protocol not supported in a replication connection"),
                    );
                    conn.flush().await?;
                }
            }
            b'F' => {
                let e = PgError::error(sqlstate::PROTOCOL_VIOLATION, "fastpath function calls not supported in a replication connection");
                conn.report(&e).await?;
            }
            // Copy messages outside a copy are ignored, as the protocol says.
            b'd' | b'c' | b'f' => {}
            tag => {
                let message = format!("unexpected message type {:?} after authentication", tag as char);
                return Err(conn.fatal(sqlstate::PROTOCOL_VIOLATION, message).await);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Commands.

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// A keyword or identifier, lowercased.
    Word(String),
    /// A double-quoted identifier, as written.
    Quoted(String),
    Lsn(Lsn),
    Number(u64),
    Semicolon,
    Other(char),
}

impl std::fmt::Display for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Token::Word(w) => write!(f, "{w}"),
            Token::Quoted(q) => write!(f, "{q:?}"),
            Token::Lsn(l) => write!(f, "{l}"),
            Token::Number(n) => write!(f, "{n}"),
            Token::Semicolon => write!(f, ";"),
            Token::Other(c) => write!(f, "{c}"),
        }
    }
}

/// Splits a replication command into tokens, as PostgreSQL's `repl_scanner.l` does for the
/// part of the grammar served here.
fn tokenize(s: &str) -> Result<Vec<Token>, String> {
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '$';
    let mut tokens = Vec::new();
    let mut rest = s;
    while let Some(c) = rest.chars().next() {
        if c.is_whitespace() {
            rest = &rest[c.len_utf8()..];
        } else if c == ';' {
            tokens.push(Token::Semicolon);
            rest = &rest[1..];
        } else if c == '"' {
            let mut ident = String::new();
            let mut chars = rest[1..].char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                if c == '"' {
                    if rest[1 + i + 1..].starts_with('"') {
                        ident.push('"');
                        chars.next();
                    } else {
                        end = Some(1 + i + 1);
                        break;
                    }
                } else {
                    ident.push(c);
                }
            }
            let end = end.ok_or("unterminated quoted identifier")?;
            if ident.is_empty() {
                return Err("zero-length delimited identifier".into());
            }
            tokens.push(Token::Quoted(ident));
            rest = &rest[end..];
        } else if is_word(c) {
            let n = rest.find(|c: char| !is_word(c)).unwrap_or(rest.len());
            let word = &rest[..n];
            let after = &rest[n..];
            if after.starts_with('/') && word.bytes().all(|b| b.is_ascii_hexdigit()) {
                let m = after[1..].find(|c: char| !c.is_ascii_hexdigit()).unwrap_or(after.len() - 1);
                let text = &rest[..n + 1 + m];
                let lsn = text.parse::<Lsn>().map_err(|e| e.to_string())?;
                tokens.push(Token::Lsn(lsn));
                rest = &rest[n + 1 + m..];
            } else {
                if word.bytes().all(|b| b.is_ascii_digit()) {
                    tokens.push(Token::Number(word.parse().map_err(|_| format!("number {word} is out of range"))?));
                } else {
                    tokens.push(Token::Word(word.to_ascii_lowercase()));
                }
                rest = after;
            }
        } else {
            tokens.push(Token::Other(c));
            rest = &rest[c.len_utf8()..];
        }
    }
    if tokens.last() == Some(&Token::Semicolon) {
        tokens.pop();
    }
    Ok(tokens)
}

/// A parsed command.
#[derive(Debug, PartialEq, Eq)]
enum Command {
    IdentifySystem,
    Show(String),
    StartReplication { start: Lsn, timeline: Option<u64> },
}

fn syntax_error(command: &str, what: String) -> PgError {
    PgError::error(sqlstate::SYNTAX_ERROR, format!("syntax error in {command}: {what}"))
}

fn expect_end(command: &str, tokens: &[Token]) -> Result<(), PgError> {
    match tokens.first() {
        None => Ok(()),
        Some(t) => Err(syntax_error(command, format!("unexpected \"{t}\""))),
    }
}

fn parse_command(tokens: &[Token]) -> Result<Command, PgError> {
    let Some(first) = tokens.first() else { unreachable!("empty queries are answered before parsing") };
    let rest = &tokens[1..];
    let word = |t: Option<&Token>| match t {
        Some(Token::Word(w)) => Some(w.clone()),
        _ => None,
    };
    match word(Some(first)).as_deref() {
        Some("identify_system") => {
            expect_end("IDENTIFY_SYSTEM", rest)?;
            Ok(Command::IdentifySystem)
        }
        Some("show") => {
            // var_name: IDENT ('.' IDENT)*
            let mut name = String::new();
            let mut rest = rest;
            loop {
                match rest.first() {
                    Some(Token::Word(w)) | Some(Token::Quoted(w)) => name.push_str(w),
                    Some(t) => return Err(syntax_error("SHOW", format!("expected a parameter name, found \"{t}\""))),
                    None => return Err(syntax_error("SHOW", "expected a parameter name".into())),
                }
                rest = &rest[1..];
                if rest.first() == Some(&Token::Other('.')) {
                    name.push('.');
                    rest = &rest[1..];
                } else {
                    break;
                }
            }
            expect_end("SHOW", rest)?;
            Ok(Command::Show(name))
        }
        Some("start_replication") => {
            const C: &str = "START_REPLICATION";
            let mut rest = rest;
            if word(rest.first()).as_deref() == Some("slot") {
                match rest.get(1) {
                    Some(Token::Word(_) | Token::Quoted(_)) => rest = &rest[2..],
                    _ => return Err(syntax_error(C, "expected a slot name after SLOT".into())),
                }
            }
            match word(rest.first()).as_deref() {
                Some("physical") => rest = &rest[1..],
                Some("logical") => {
                    return Err(PgError::error(
                        sqlstate::FEATURE_NOT_SUPPORTED,
                        "logical replication is not served by a safekeeper; use START_REPLICATION [PHYSICAL] X/X",
                    ))
                }
                _ => {}
            }
            let start = match rest.first() {
                Some(Token::Lsn(l)) => *l,
                Some(t) => return Err(syntax_error(C, format!("expected a start LSN such as 0/16B3748, found \"{t}\""))),
                None => return Err(syntax_error(C, "expected a start LSN such as 0/16B3748".into())),
            };
            rest = &rest[1..];
            let mut timeline = None;
            if word(rest.first()).as_deref() == Some("timeline") {
                match rest.get(1) {
                    Some(Token::Number(n)) => timeline = Some(*n),
                    _ => return Err(syntax_error(C, "expected a timeline number after TIMELINE".into())),
                }
                rest = &rest[2..];
            }
            expect_end(C, rest)?;
            Ok(Command::StartReplication { start, timeline })
        }
        Some(
            w @ ("timeline_history"
            | "base_backup"
            | "create_replication_slot"
            | "drop_replication_slot"
            | "read_replication_slot"
            | "upload_manifest"),
        ) => Err(PgError::error(
            sqlstate::FEATURE_NOT_SUPPORTED,
            format!("{} is not supported by a safekeeper (it serves IDENTIFY_SYSTEM, SHOW and START_REPLICATION)", w.to_ascii_uppercase()),
        )),
        _ => Err(PgError::error(
            sqlstate::FEATURE_NOT_SUPPORTED,
            format!(
                "unknown replication command starting with \"{first}\": a safekeeper serves only \
                 IDENTIFY_SYSTEM, SHOW and START_REPLICATION (SQL is not accepted on physical replication connections)"
            ),
        )),
    }
}

/// The text of a Query message: one NUL-terminated UTF-8 string and nothing after it.
fn query_text(body: &Bytes) -> Result<&str, PgError> {
    let n = body.iter().position(|&b| b == 0).ok_or_else(|| {
        PgError::error(sqlstate::PROTOCOL_VIOLATION, "invalid string in message: the query string is not NUL-terminated")
    })?;
    if n + 1 != body.len() {
        return Err(PgError::error(
            sqlstate::PROTOCOL_VIOLATION,
            format!("invalid message format: {} bytes after the query string", body.len() - n - 1),
        ));
    }
    std::str::from_utf8(&body[..n]).map_err(|e| {
        PgError::error(sqlstate::CHARACTER_NOT_IN_REPERTOIRE, format!("invalid byte sequence for encoding \"UTF8\" in the query: {e}"))
    })
}

/// The value `SHOW name` answers, if it is one served here.
fn show_value(name: &str) -> Option<String> {
    Some(match name.to_ascii_lowercase().as_str() {
        "wal_segment_size" => format!("{}MB", WAL_SEGMENT_SIZE_BYTES >> 20),
        "server_version" => SERVER_VERSION.into(),
        "server_version_num" => SERVER_VERSION_NUM.into(),
        "data_directory_mode" => "0700".into(),
        "integer_datetimes" => "on".into(),
        "server_encoding" | "client_encoding" => "UTF8".into(),
        _ => return None,
    })
}

/// Runs one simple query.
async fn query<S: WalSource + ?Sized>(
    conn: &mut Conn,
    source: &Arc<S>,
    rx: &mut mpsc::Receiver<Result<Frontend, ReadEnd>>,
    body: Bytes,
) -> anyhow::Result<Next> {
    let text = match query_text(&body) {
        Ok(t) => t,
        Err(e) => {
            conn.report(&e).await?;
            return Ok(Next::Continue);
        }
    };
    let tokens = match tokenize(text) {
        Ok(t) => t,
        Err(why) => {
            conn.report(&PgError::error(sqlstate::SYNTAX_ERROR, format!("syntax error in {text:?}: {why}"))).await?;
            return Ok(Next::Continue);
        }
    };
    if tokens.is_empty() {
        message(&mut conn.out, b'I', |_| {});
        ready_for_query(&mut conn.out);
        conn.flush().await?;
        return Ok(Next::Continue);
    }
    let command = match parse_command(&tokens) {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!("refused command {text:?}: {}", e.message);
            conn.report(&e).await?;
            return Ok(Next::Continue);
        }
    };
    tracing::debug!("command {command:?}");
    match command {
        Command::IdentifySystem => {
            let system_id = source.system_id().to_string();
            let commit = source.commit_lsn().to_string();
            let timeline = PG_TIMELINE.to_string();
            row_description(&mut conn.out, &[("systemid", TEXT_OID), ("timeline", INT4_OID), ("xlogpos", TEXT_OID), ("dbname", TEXT_OID)]);
            data_row(&mut conn.out, &[Some(&system_id), Some(&timeline), Some(&commit), None]);
            command_complete(&mut conn.out, "IDENTIFY_SYSTEM");
            ready_for_query(&mut conn.out);
            conn.flush().await?;
        }
        Command::Show(name) => match show_value(&name) {
            Some(value) => {
                row_description(&mut conn.out, &[(name.as_str(), TEXT_OID)]);
                data_row(&mut conn.out, &[Some(&value)]);
                command_complete(&mut conn.out, "SHOW");
                ready_for_query(&mut conn.out);
                conn.flush().await?;
            }
            None => {
                let e = PgError::error(sqlstate::UNDEFINED_OBJECT, format!("unrecognized configuration parameter \"{name}\""));
                conn.report(&e).await?;
            }
        },
        Command::StartReplication { start, timeline } => {
            if let Some(tli) = timeline.filter(|&t| t != u64::from(PG_TIMELINE)) {
                let e = PgError::error(
                    sqlstate::INVALID_PARAMETER_VALUE,
                    format!("requested starting point {start} on timeline {tli} is not in this server's history (it has only timeline {PG_TIMELINE})"),
                );
                conn.report(&e).await?;
                return Ok(Next::Continue);
            }
            let commit = source.commit_lsn();
            let wal_start = source.wal_start_lsn();
            if start > commit {
                let e = PgError::error(
                    sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE,
                    format!("requested starting point {start} is ahead of the WAL flush position of this server {commit} (the timeline's commit LSN)"),
                );
                conn.report(&e).await?;
                return Ok(Next::Continue);
            }
            if start < wal_start {
                let e = PgError::error(
                    sqlstate::UNDEFINED_FILE,
                    format!("requested WAL at {start} is not available here (WAL begins at {wal_start})"),
                );
                conn.report(&e).await?;
                return Ok(Next::Continue);
            }
            tracing::info!("streaming committed WAL from {start} (commit LSN {commit})");
            // CopyBothResponse: binary, no columns.
            message(&mut conn.out, b'W', |b| {
                b.put_u8(0);
                b.put_i16(0);
            });
            conn.flush().await?;
            return stream_wal(conn, source, rx, start).await;
        }
    }
    Ok(Next::Continue)
}

// ---------------------------------------------------------------------------------------
// Streaming.

/// The end of the next chunk to send from `sent`: at most `max` bytes, not beyond `commit`,
/// not across a segment boundary.
fn chunk_end(sent: Lsn, commit: Lsn, max: usize) -> Lsn {
    let segment_end = (sent.0 / WAL_SEGMENT_SIZE_BYTES + 1).saturating_mul(WAL_SEGMENT_SIZE_BYTES);
    Lsn(sent.0.saturating_add(max.max(1) as u64).min(commit.0).min(segment_end))
}

/// The state of one `START_REPLICATION`.
struct Streaming {
    /// Everything below it was sent.
    sent: Lsn,
    last_send: Instant,
    /// When the client last sent anything.
    last_reply: Instant,
    /// A keepalive asking for a reply is out and unanswered.
    ping_sent: bool,
}

/// Handles one client message during streaming: `Some(next)` ends streaming.
async fn streaming_message<S: WalSource + ?Sized>(
    conn: &mut Conn,
    source: &Arc<S>,
    st: &mut Streaming,
    msg: Result<Frontend, ReadEnd>,
) -> anyhow::Result<Option<Next>> {
    let msg = match msg {
        Err(ReadEnd::Closed) => {
            tracing::info!("the client closed the connection while streaming (sent up to {})", st.sent);
            return Ok(Some(Next::Close));
        }
        Err(ReadEnd::Broken(e)) => return Err(conn.fatal(e.code, e.message).await),
        Ok(m) => m,
    };
    st.last_reply = Instant::now();
    st.ping_sent = false;
    match msg.tag {
        b'd' => {
            let mut body = msg.body;
            match body.first().copied() {
                Some(b'r') => {
                    if body.len() != 34 {
                        let m = format!("invalid standby status update: {} bytes, expected 34", body.len());
                        return Err(conn.fatal(sqlstate::PROTOCOL_VIOLATION, m).await);
                    }
                    body.advance(1);
                    let feedback = PageserverFeedback { write_lsn: Lsn(body.get_u64()), flush_lsn: Lsn(body.get_u64()), apply_lsn: Lsn(body.get_u64()) };
                    let _client_time = body.get_i64();
                    let reply_requested = body.get_u8() != 0;
                    tracing::trace!("standby status update {feedback:?}");
                    source.set_pageserver_feedback(feedback);
                    if reply_requested {
                        keepalive(&mut conn.out, source.commit_lsn(), false);
                        conn.flush().await?;
                        st.last_send = Instant::now();
                    }
                }
                // Hot standby feedback: no transactions run here, nothing to hold back.
                Some(b'h') => {}
                Some(t) => {
                    let m = format!("unexpected standby message type {:?} in CopyData (expected 'r' or 'h')", t as char);
                    return Err(conn.fatal(sqlstate::PROTOCOL_VIOLATION, m).await);
                }
                None => return Err(conn.fatal(sqlstate::PROTOCOL_VIOLATION, "empty CopyData message from the standby".into()).await),
            }
            Ok(None)
        }
        b'c' => {
            tracing::info!("the client ended streaming at {}", st.sent);
            message(&mut conn.out, b'c', |_| {});
            command_complete(&mut conn.out, "START_STREAMING");
            ready_for_query(&mut conn.out);
            conn.flush().await?;
            Ok(Some(Next::Continue))
        }
        b'X' => Ok(Some(Next::Close)),
        tag => {
            let m = format!("invalid standby message type {:?} during streaming (expected CopyData, CopyDone or Terminate)", tag as char);
            Err(conn.fatal(sqlstate::PROTOCOL_VIOLATION, m).await)
        }
    }
}

/// Streams committed WAL from `start` until the client ends it.
async fn stream_wal<S: WalSource + ?Sized>(
    conn: &mut Conn,
    source: &Arc<S>,
    rx: &mut mpsc::Receiver<Result<Frontend, ReadEnd>>,
    start: Lsn,
) -> anyhow::Result<Next> {
    let mut commit_rx = source.commit_lsn_watch();
    let now = Instant::now();
    let mut st = Streaming { sent: start, last_send: now, last_reply: now, ping_sent: false };
    let keepalive_interval = conn.config.keepalive_interval;
    let timeout = conn.config.sender_timeout;
    loop {
        // Whatever the client sent meanwhile.
        loop {
            match rx.try_recv() {
                Ok(m) => {
                    if let Some(next) = streaming_message(conn, source, &mut st, m).await? {
                        return Ok(next);
                    }
                }
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => return Ok(Next::Close),
            }
        }
        let now = Instant::now();
        if now >= st.last_reply + timeout {
            let m = format!("terminating replication: the client sent nothing for {timeout:?}");
            tracing::warn!("{m}");
            return Err(conn.fatal(sqlstate::CONNECTION_FAILURE, m).await);
        }
        let commit = *commit_rx.borrow_and_update();
        if !st.ping_sent && now >= st.last_reply + timeout / 2 {
            keepalive(&mut conn.out, commit, true);
            conn.flush().await?;
            st.ping_sent = true;
            st.last_send = now;
        }
        if st.sent < commit {
            let end = chunk_end(st.sent, commit, conn.config.send_bytes_max);
            let data = match read_wal(source, st.sent, end).await {
                Ok(d) => d,
                Err(e) => {
                    let m = format!("could not send WAL {}..{}: {e:#}", st.sent, end);
                    tracing::error!("{m}");
                    return Err(conn.fatal(sqlstate::DATA_CORRUPTED, m).await);
                }
            };
            message(&mut conn.out, b'd', |b| {
                b.put_u8(b'w');
                b.put_u64(st.sent.0);
                b.put_u64(commit.0);
                b.put_i64(pg_now());
                b.put_slice(&data);
            });
            conn.flush().await?;
            st.sent = end;
            st.last_send = Instant::now();
            continue;
        }
        // Caught up: wait for more WAL, the client, or a timer.
        let mut wake = st.last_send + keepalive_interval;
        if !st.ping_sent {
            wake = wake.min(st.last_reply + timeout / 2);
        }
        wake = wake.min(st.last_reply + timeout);
        tokio::select! {
            changed = commit_rx.changed() => {
                if changed.is_err() {
                    let m = format!("the timeline is shutting down (sent up to {})", st.sent);
                    return Err(conn.fatal(sqlstate::ADMIN_SHUTDOWN, m).await);
                }
            }
            m = rx.recv() => {
                let m = m.unwrap_or(Err(ReadEnd::Closed));
                if let Some(next) = streaming_message(conn, source, &mut st, m).await? {
                    return Ok(next);
                }
            }
            _ = tokio::time::sleep_until(wake) => {
                if Instant::now() >= st.last_send + keepalive_interval {
                    keepalive(&mut conn.out, commit, false);
                    conn.flush().await?;
                    st.last_send = Instant::now();
                }
            }
        }
    }
}

/// Reads `[from, to)` on the blocking pool and checks its length.
fn read_wal<S: WalSource + ?Sized>(source: &Arc<S>, from: Lsn, to: Lsn) -> impl Future<Output = anyhow::Result<Bytes>> {
    let source = Arc::clone(source);
    async move {
        let data = tokio::task::spawn_blocking(move || source.read_wal_verified(from, to))
            .await
            .map_err(|e| anyhow!("the WAL read failed: {e}"))??;
        let expected = to.0 - from.0;
        if data.len() as u64 != expected {
            return Err(anyhow!("the storage returned {} bytes, expected {expected}", data.len()));
        }
        Ok(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizes_replication_commands() {
        assert_eq!(
            tokenize("start_replication SLOT \"My\"\"slot\" physical 1A/B374D848 TIMELINE 1;").unwrap(),
            vec![
                Token::Word("start_replication".into()),
                Token::Word("slot".into()),
                Token::Quoted("My\"slot".into()),
                Token::Word("physical".into()),
                Token::Lsn(Lsn(0x1A_B374_D848)),
                Token::Word("timeline".into()),
                Token::Number(1),
            ]
        );
        assert_eq!(tokenize("  ;  ").unwrap(), vec![]);
        assert!(tokenize("START_REPLICATION 1/ZZ").is_err());
        assert!(tokenize("SHOW \"unterminated").is_err());
        assert!(tokenize("START_REPLICATION 123456789/0").is_err());
    }

    #[test]
    fn parses_commands() {
        let parse = |s: &str| parse_command(&tokenize(s).unwrap());
        assert_eq!(parse("identify_system").unwrap(), Command::IdentifySystem);
        assert_eq!(parse("SHOW wal_segment_size;").unwrap(), Command::Show("wal_segment_size".into()));
        assert_eq!(
            parse("START_REPLICATION 0/3000000").unwrap(),
            Command::StartReplication { start: Lsn(0x300_0000), timeline: None }
        );
        assert_eq!(
            parse("START_REPLICATION SLOT s PHYSICAL 0/3000000 TIMELINE 1").unwrap(),
            Command::StartReplication { start: Lsn(0x300_0000), timeline: Some(1) }
        );
        for bad in ["IDENTIFY_SYSTEM now", "START_REPLICATION", "START_REPLICATION PHYSICAL", "START_REPLICATION 0/1 TIMELINE", "SHOW", "SHOW 1"] {
            assert_eq!(parse(bad).unwrap_err().code, sqlstate::SYNTAX_ERROR, "{bad}");
        }
        for unsupported in ["TIMELINE_HISTORY 1", "BASE_BACKUP", "SELECT 1", "START_REPLICATION SLOT s LOGICAL 0/1"] {
            let e = parse(unsupported).unwrap_err();
            assert_eq!(e.code, sqlstate::FEATURE_NOT_SUPPORTED, "{unsupported}");
            assert!(!e.fatal);
        }
    }

    #[test]
    fn reads_the_timeline_from_options() {
        assert_eq!(option_value("-c fjord.timeline=a/b", TIMELINE_OPTION).as_deref(), Some("a/b"));
        assert_eq!(option_value("--fjord.timeline=a/b -c x=y", TIMELINE_OPTION).as_deref(), Some("a/b"));
        assert_eq!(option_value("-cfjord.timeline=a\\ b", TIMELINE_OPTION).as_deref(), Some("a b"));
        assert_eq!(option_value("-c other=1", TIMELINE_OPTION), None);
    }

    #[test]
    fn chunks_stop_at_commit_segment_end_and_size() {
        let seg = WAL_SEGMENT_SIZE_BYTES;
        assert_eq!(chunk_end(Lsn(seg - 10), Lsn(seg + 100), MAX_SEND_BYTES), Lsn(seg));
        assert_eq!(chunk_end(Lsn(seg), Lsn(seg + 100), MAX_SEND_BYTES), Lsn(seg + 100));
        assert_eq!(chunk_end(Lsn(seg), Lsn(3 * seg), MAX_SEND_BYTES), Lsn(seg + MAX_SEND_BYTES as u64));
    }

    #[test]
    fn startup_parameters_are_checked() {
        let params = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>();
        let t = "0123456789abcdef0123456789abcdef";
        let ok = check_startup(&params(&[("user", "u"), ("replication", "on"), ("database", &format!("{t}/{t}"))])).unwrap();
        assert_eq!(ok.tenant.to_string(), t);
        let e = |p: &[(&str, &str)]| check_startup(&params(p)).err().expect("refused");
        assert!(e(&[("user", "u"), ("database", &format!("{t}/{t}"))]).message.contains("replication=true is missing"));
        assert!(e(&[("user", "u"), ("replication", "database"), ("database", "x")]).message.contains("logical replication"));
        assert!(e(&[("user", "u"), ("replication", "maybe")]).message.contains("invalid value"));
        assert_eq!(e(&[("user", "u"), ("replication", "true"), ("database", "nope")]).code, sqlstate::INVALID_PARAMETER_VALUE);
        assert_eq!(e(&[("user", "u"), ("replication", "true"), ("database", "replication")]).code, sqlstate::INVALID_CATALOG_NAME);
        assert_eq!(e(&[("replication", "true"), ("database", &format!("{t}/{t}"))]).code, sqlstate::INVALID_AUTHORIZATION);
    }
}
