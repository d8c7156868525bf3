//! The server side of PostgreSQL's physical streaming replication protocol: how a
//! pageserver (and later a read replica, or `pg_receivewal`) streams a timeline's
//! *committed* WAL from a safekeeper.
//!
//! The listener hands every connection that does not open with the proposer protocol to
//! [`serve`]. The protocol code is generic over [`WalSource`], the little a replication
//! connection needs from a timeline, so it is tested against an in-memory source.
//!
//! # Connection
//! 1. Startup. With TLS on, the listener has already answered the client's `SSLRequest`
//!    and the connection is TLS (`crate::server`). An `SSLRequest` or `GSSENCRequest` that
//!    reaches this code is answered `N` (no encryption, or no more of it), then the
//!    real `StartupMessage` is read (protocol 3.0; a later minor version or `_pq_.` options
//!    get a `NegotiateProtocolVersion`). Parameters:
//!    - `replication`: must be `true`/`on`/`yes`/`1` (physical replication). `database`
//!      (logical replication) and plain SQL connections are refused.
//!    - `database`: `<tenant id>/<timeline id>` in hex, naming the timeline. PostgreSQL's own
//!      tools (`pg_receivewal`, `pg_basebackup`) always send `database=replication` on a
//!      physical replication connection, so when `database` is absent or `replication` the
//!      timeline is taken from `options` instead: `-c fjord.timeline=<tenant>/<timeline>`.
//!    - `user`: required, anything (it is not checked: the token is what counts).
//!
//!    A missing, malformed or unknown timeline is a `FATAL` `ErrorResponse` and the
//!    connection is closed.
//!
//!    Authentication. Without a [`Config::auth`] (a safekeeper without
//!    `--auth-public-key`): trust, nothing is asked. With one, after the startup packet
//!    the server asks for a cleartext password (`AuthenticationCleartextPassword`, `R` and
//!    3) and reads the `PasswordMessage` (`p`): the password is a token (at most
//!    `auth::TOKEN_BYTES_MAX` bytes), which must grant `Access::ReadWal` of the timeline
//!    (a storage or admin token, or the tenant's own, e.g. a read replica's). A refusal is a
//!    `FATAL` error with the reason: SQLSTATE 28P01 (`invalid_password`) when there is no
//!    valid token (none, malformed, another key's, expired), 28000
//!    (`invalid_authorization_specification`) when a valid token does not grant this
//!    timeline. A client that closes instead of answering (libpq without a password) is
//!    refused as sending none. The exchange happens before the timeline is looked up, so an
//!    unauthenticated client learns nothing of which timelines exist. Cleartext, because
//!    the password is a bearer token that the server must see whole; with TLS on, inside
//!    the TLS connection.
//!
//!    Then: `AuthenticationOk`, `ParameterStatus` (server_version
//!    15, UTF8 encodings, ISO dates, integer datetimes, and [`SAFEKEEPER_PARAMETER`]
//!    `fjord.safekeeper = 1`), `BackendKeyData`, `ReadyForQuery`.
//!
//!    `fjord.safekeeper` is how a client tells a safekeeper from a PostgreSQL walsender: no
//!    PostgreSQL server reports that parameter (clients ignore parameters they do not know,
//!    as libpq and `pg_receivewal` do). Its value is the version of fjord's additions to the
//!    protocol the server accepts: 1 is the remote-consistent LSN message below; 2 adds the
//!    attachment generation to it and the `FJORD_REMOTE_CONSISTENT_LSN` command. The
//!    pageserver sends them only to a server that reported the parameter; a PostgreSQL
//!    walsender would end the connection on them.
//! 2. Simple queries, one command each (keywords case-insensitive, optional `;`):
//!    - `IDENTIFY_SYSTEM`: one row `systemid` (text), `timeline` (int4, always 1), `xlogpos`
//!      (text, the commit LSN) and `dbname` (NULL).
//!    - `SHOW name` for `wal_segment_size`, `server_version`, `server_version_num`,
//!      `data_directory_mode`, `integer_datetimes`, `server_encoding`, `client_encoding`.
//!    - `START_REPLICATION [SLOT name] [PHYSICAL] X/X [TIMELINE 1]`: streams WAL from `X/X`.
//!      Slots are not kept: a slot name is accepted and ignored, and what is streamed is
//!      decided only by the requested LSN.
//!    - `FJORD_REMOTE_CONSISTENT_LSN <generation> X/X` (fjord's): the pageserver's
//!      remote-consistent LSN and its attachment generation, as the `P` message below, for
//!      the safekeepers it does not stream from. `CommandComplete` when it was handled
//!      (taken, or ignored as a superseded generation's); an `ERROR` (SQLSTATE 42501) for a
//!      client that may not report it.
//!
//!    Other replication commands (`TIMELINE_HISTORY`, `BASE_BACKUP`, slot commands, logical
//!    replication) and SQL get an `ERROR` and the connection stays usable.
//! 3. Streaming (`CopyBothResponse`, then CopyData both ways): `XLogData` messages
//!    (`w`, start LSN, end of WAL = commit LSN, send time, bytes) carry the WAL from the
//!    requested LSN up to the commit LSN in chunks of at most 128 KiB that never cross a
//!    WAL segment boundary, each record once it has been checked whole (so a record the
//!    commit LSN ends inside waits for the rest of it; see [`verify`]); then the sender
//!    waits for the commit LSN to move. When idle it
//!    sends a primary keepalive (`k`) every second; when the client has sent nothing for
//!    half the sender timeout the keepalive asks for a reply, and after the whole timeout
//!    (60 s) the connection is closed. Standby status updates (`r`) are recorded with
//!    [`WalSource::set_standby_feedback`] (the pageserver's, `application_name`
//!    `fjord_pageserver`, are its feedback; a read replica's are shown in the timeline's
//!    status and relayed to proposers), hot standby feedback (`h`) with
//!    [`WalSource::set_hot_standby_feedback`] (relayed to proposers, which hold the
//!    primary's horizon for it; the end of streaming releases it); the
//!    pageserver's remote-consistent LSN (fjord's own CopyData message: `P`, the attachment
//!    generation as a big-endian `u32` and the LSN as a big-endian `u64`, 13 bytes in all;
//!    or version 1's 9 bytes without the generation, taken as generation 0: WAL below it is
//!    in object storage) is recorded with [`WalSource::set_remote_consistent_lsn`]; the
//!    client's `CopyDone` ends streaming
//!    (`CopyDone`, `CommandComplete`, `ReadyForQuery`); `Terminate` closes.
//!
//! # Who may move the removal horizon
//! The remote-consistent LSN lets the safekeepers remove WAL, so only the pageserver may
//! report it: with authentication on, only a client whose token has the `storage` scope
//! (a tenant's token may read its WAL, as a read replica does, but a compute holds one, and
//! an admin token is the operator's, not the pageserver's). Another client's report is
//! ignored in the stream, refused (`ERROR`) as a command, logged at warn and counted in
//! `safekeeper_remote_consistent_lsn_ignored_total{reason="not_storage"}`. Without
//! authentication every client is trusted, as for everything else. Among the pageserver's
//! reports the newest attachment generation's count (see `Timeline::set_remote_consistent_lsn`);
//! an older one's are logged and counted (`reason="superseded"`).
//!
//! # Invariants
//! - Only committed WAL is sent: never beyond the commit LSN read from the timeline's watch.
//! - Only verified WAL is sent: every chunk comes from [`WalSource::read_wal_verified`]
//!   (page headers checked) and is sent only once `pgwal`'s decoder has checked every
//!   record it belongs to, header and CRC32C ([`verify`]: the start inside a record, the
//!   record at the commit LSN, and what cannot be checked). A read error (a corrupt
//!   segment) or a record that does not check is logged at error level (naming the LSN and
//!   the segment file), counted in [`Config::wal_corruption`], reported to the client as a
//!   `FATAL` error (SQLSTATE XX001) and the connection is closed; the bad record's bytes
//!   are never sent. A chunk of the wrong length is treated the same way.
//! - The WAL sent is contiguous: each `XLogData` starts where the previous one ended, the
//!   first at the requested LSN. A start beyond the commit LSN or before the beginning of
//!   the timeline's WAL is an `ERROR` (as PostgreSQL's walsender answers), not a gap. WAL
//!   removed while a client streams (a client behind the removal horizon: not the
//!   pageserver, whose remote-consistent LSN bounds the horizon) ends the stream with a
//!   `FATAL` error saying so (SQLSTATE 58P01), never with zeros or a corruption report.
//! - Bad input never panics. Where PostgreSQL's framing stays intact (a bad query string,
//!   an unknown command) the answer is `ERROR` then `ReadyForQuery` and the connection goes
//!   on; where the framing is broken (impossible length, unknown message type, bad startup
//!   packet) or the replication sub-protocol is violated, it is a `FATAL` error and the
//!   connection is closed. Every error message says what was wrong.
//!
//! Code map: this file has the connection, the frontend message reader, the command loop and
//! streaming; `startup` the startup packet and its parameters; `command` the tokenizer and
//! parser of replication commands; `messages` the backend messages, errors and SQLSTATEs;
//! `crate::verify` the record checks of the WAL being sent (no I/O), which the proposer's
//! `FetchWal` shares.
//! Frontend messages are decoded here (the `postgres-protocol` crate parses only backend
//! messages), and backend messages encoded here (it encodes only frontend ones). Its frontend
//! encoder and backend parser drive the tests (`tests/replication.rs`), together with
//! PostgreSQL's `pg_receivewal`.

use std::future::Future;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use pgwal::{DecoderConfig, WalError};
use proto::{Lsn, TenantId, TimelineId};
use quorum::wire::PageserverFeedback;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

mod command;
mod messages;
mod startup;

use crate::stream::{ReadHalf, WriteHalf};
use crate::verify::{self, VerifiedStream};
use command::{parse_command, query_text, show_value, tokenize, Command};
use messages::{
    command_complete, data_row, error_response, keepalive, message, parameter_status, pg_now, ready_for_query, row_description, sqlstate,
    PgError, INT4_OID, TEXT_OID,
};
use startup::{authenticate, startup, Startup};

/// What a replication connection needs from a timeline. The safekeeper's timeline
/// implements it; the tests use an in-memory one.
pub trait WalSource: Send + Sync + 'static {
    /// PostgreSQL's system identifier of the cluster whose WAL this is.
    fn system_id(&self) -> u64;
    /// The WAL segment size in bytes (a power of two, 1 MiB to 1 GiB; 16 MiB in fjord).
    fn wal_segment_size(&self) -> u32;
    /// The first LSN of WAL this safekeeper has for the timeline; nothing before it can be
    /// served.
    fn wal_begin_lsn(&self) -> Lsn;
    /// The commit LSN: WAL below it is committed and may be served.
    fn commit_lsn(&self) -> Lsn;
    /// A watch of the commit LSN, which only moves forward. Its sender being dropped means
    /// the timeline is going away: streaming ends.
    fn commit_lsn_watch(&self) -> watch::Receiver<Lsn>;
    /// The WAL bytes in `[from, to)`, exactly `to - from` of them, checked against their
    /// checksums (an error for a corrupt or missing segment). Called only with
    /// `wal_begin_lsn() <= from < to <= commit LSN`, and never across a segment boundary.
    /// It may block (file I/O): it runs on tokio's blocking pool.
    fn read_wal_verified(&self, from: Lsn, to: Lsn) -> anyhow::Result<Bytes>;
    /// Records the progress the client reported in a standby status update; `client` is
    /// `application_name@address` (the pageserver's application name is
    /// [`PAGESERVER_APPLICATION_NAME`]).
    fn set_standby_feedback(&self, client: &str, feedback: PageserverFeedback);
    /// Records a client's hot standby feedback: the oldest transaction its queries may
    /// still need, as full transaction ids (0: none).
    fn set_hot_standby_feedback(&self, _client: &str, _xmin: u64, _catalog_xmin: u64) {}
    /// The client's streaming ended: it holds nothing back any more.
    fn standby_disconnected(&self, _client: &str) {}
    /// Records the remote-consistent LSN the pageserver of attachment `generation` reported
    /// (fjord's `P` message or command): taken, or ignored as an older generation's.
    fn set_remote_consistent_lsn(&self, generation: u32, lsn: Lsn) -> crate::timeline::RemoteReport;
}

/// Committed WAL at least this big goes out without lingering ([`Config::linger`]).
pub const LINGER_BYTES: u64 = 64 * 1024;

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
    /// Newly committed WAL of less than [`LINGER_BYTES`] waits until this long after the
    /// last send, so that a stream of small commits goes out a few at a time: each message
    /// costs this safekeeper a read and a send and the client (the pageserver's WAL receiver)
    /// a wake-up and an ingest step, and pgbench read-write commits every half millisecond.
    /// After a quiet spell the first commit goes out at once. Zero: every commit at once.
    pub linger: Duration,
    /// How long the client has to complete the startup (authentication included).
    pub startup_timeout: Duration,
    /// With authentication on, the token check (see the module documentation); `None`:
    /// trust.
    pub auth: Option<crate::access::Authenticator>,
    /// Counts WAL that failed verification before it was sent, by tenant and timeline
    /// (`safekeeper_wal_corruption_total`); `None`: not counted.
    pub wal_corruption: Option<prometheus::IntCounterVec>,
    /// Counts remote-consistent LSNs ignored, by reason
    /// (`safekeeper_remote_consistent_lsn_ignored_total`); `None`: not counted.
    pub remote_ignored: Option<prometheus::IntCounterVec>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            keepalive_interval: Duration::from_secs(1),
            sender_timeout: Duration::from_secs(60),
            send_bytes_max: MAX_SEND_BYTES,
            linger: Duration::from_millis(2),
            startup_timeout: Duration::from_secs(60),
            auth: None,
            wal_corruption: None,
            remote_ignored: None,
        }
    }
}

/// PostgreSQL's `MAX_SEND_SIZE`: 16 WAL pages.
pub const MAX_SEND_BYTES: usize = 128 * 1024;
/// What `server_version` says: the PostgreSQL major version whose WAL is served.
pub const SERVER_VERSION: &str = "15.0";
pub(crate) const SERVER_VERSION_NUM: &str = "150000";
/// The only PostgreSQL timeline a fjord compute writes.
pub const PG_TIMELINE: u32 = 1;
/// The `options` setting that names the timeline when `database` cannot (see the module
/// documentation).
pub const TIMELINE_OPTION: &str = "fjord.timeline";
/// The `ParameterStatus` by which a safekeeper tells a client what it is, and its value:
/// the version of fjord's additions to the protocol it accepts (see the module
/// documentation).
pub const SAFEKEEPER_PARAMETER: &str = "fjord.safekeeper";
pub const SAFEKEEPER_PROTOCOL_VERSION: &str = "2";
/// The tag of fjord's CopyData message carrying the pageserver's remote-consistent LSN.
pub const REMOTE_CONSISTENT_LSN_TAG: u8 = b'P';

/// No frontend message of this protocol is longer (PostgreSQL allows 1 GB for CopyData,
/// but a replication client sends only small status messages and queries).
const MESSAGE_BYTES_MAX: usize = 1 << 20;

/// Serves one replication connection handed over by the safekeeper's listener: its two
/// halves (plain TCP or TLS) and the client's address.
pub async fn serve(read: ReadHalf, write: WriteHalf, peer: String, sk: Arc<crate::Safekeeper>) -> anyhow::Result<()> {
    let config = Config {
        auth: sk.auth.clone(),
        wal_corruption: Some(sk.metrics.wal_corruption.clone()),
        remote_ignored: Some(sk.metrics.remote_consistent_lsn_ignored.clone()),
        ..Config::default()
    };
    serve_halves(read, write, peer, move |tenant, timeline| lookup_timeline(&sk, tenant, timeline), config).await
}

/// The timeline a replication connection asked for (unknown and unavailable timelines are
/// errors that the client is shown).
fn lookup_timeline(sk: &crate::Safekeeper, tenant: TenantId, timeline: TimelineId) -> anyhow::Result<Arc<crate::Timeline>> {
    Ok(sk.get_timeline(tenant, timeline)?)
}

impl WalSource for crate::Timeline {
    fn system_id(&self) -> u64 {
        crate::Timeline::system_id(self)
    }
    fn wal_segment_size(&self) -> u32 {
        crate::Timeline::wal_segment_size(self)
    }
    fn wal_begin_lsn(&self) -> Lsn {
        crate::Timeline::wal_begin_lsn(self)
    }
    fn commit_lsn(&self) -> Lsn {
        crate::Timeline::commit_lsn(self)
    }
    fn commit_lsn_watch(&self) -> watch::Receiver<Lsn> {
        crate::Timeline::commit_lsn_watch(self)
    }
    fn read_wal_verified(&self, from: Lsn, to: Lsn) -> anyhow::Result<Bytes> {
        crate::Timeline::read_wal_verified(self, from, to)
    }
    fn set_standby_feedback(&self, client: &str, f: PageserverFeedback) {
        // Only the pageserver's progress is the pageserver's feedback (backpressure,
        // proposers' view); a read replica's or pg_receivewal's is only shown.
        if client.split('@').next() == Some(PAGESERVER_APPLICATION_NAME) {
            crate::Timeline::set_pageserver_feedback(self, f)
        } else {
            crate::Timeline::set_standby_feedback(self, client, f)
        }
    }
    fn set_hot_standby_feedback(&self, client: &str, xmin: u64, catalog_xmin: u64) {
        if client.split('@').next() != Some(PAGESERVER_APPLICATION_NAME) {
            crate::Timeline::set_hot_standby_feedback(self, client, xmin, catalog_xmin)
        }
    }
    fn standby_disconnected(&self, client: &str) {
        crate::Timeline::standby_disconnected(self, client)
    }
    fn set_remote_consistent_lsn(&self, generation: u32, lsn: Lsn) -> crate::timeline::RemoteReport {
        crate::Timeline::set_remote_consistent_lsn(self, generation, lsn)
    }
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
    serve_halves(Box::new(read), Box::new(write), peer, lookup, config).await
}

/// A `FATAL` error with SQLSTATE 28000 (`invalid_authorization_specification`, what
/// PostgreSQL answers a connection its `pg_hba.conf` does not allow), as the bytes of an
/// `ErrorResponse`: the listener's answer to a replication client that did not ask for TLS.
pub(crate) fn refusal(message: String) -> BytesMut {
    let mut out = BytesMut::new();
    error_response(&mut out, &PgError::fatal(sqlstate::INVALID_AUTHORIZATION, message));
    out
}

/// Writes `bytes` and flushes them (over TLS, what the socket did not take at once stays in
/// the session until a flush).
async fn write_flush(write: &mut WriteHalf, bytes: &[u8]) -> std::io::Result<()> {
    write.write_all(bytes).await?;
    write.flush().await
}

async fn serve_halves<S, L>(read: ReadHalf, write: WriteHalf, peer: String, lookup: L, config: Config) -> anyhow::Result<()>
where
    S: WalSource + ?Sized,
    L: Fn(TenantId, TimelineId) -> anyhow::Result<Arc<S>>,
{
    // Without authentication every client is trusted, the pageserver's reports included.
    let may_report = config.auth.is_none();
    let mut conn = Conn {
        client: format!("@{peer}"),
        peer: peer.clone(),
        read: Some(read),
        write,
        out: BytesMut::new(),
        config,
        timeline: None,
        may_report,
    };
    let span = tracing::info_span!("replication", peer = %peer);
    let result = tracing::Instrument::instrument(run(&mut conn, lookup), span.clone()).await;
    match &result {
        Ok(()) => tracing::debug!(parent: &span, "replication connection closed"),
        Err(e) => tracing::info!(parent: &span, "replication connection ended: {e:#}"),
    }
    result
}

struct Conn {
    /// `application_name@peer address`, once the startup packet is read.
    client: String,
    /// The client's address.
    peer: String,
    /// Taken by the reader task once the startup is done.
    read: Option<ReadHalf>,
    write: WriteHalf,
    /// Messages not yet written.
    out: BytesMut,
    config: Config,
    /// The timeline, once it is found: the labels of its metrics.
    timeline: Option<(TenantId, TimelineId)>,
    /// Whether this client may report the remote-consistent LSN: its token has the
    /// `storage` scope (the pageserver's), or authentication is off.
    may_report: bool,
}

impl Conn {
    /// Records a remote-consistent LSN the client reported, if it may report one (see the
    /// module documentation); `false` if it may not.
    fn report_remote_consistent_lsn<S: WalSource + ?Sized>(&self, source: &S, generation: u32, lsn: Lsn) -> bool {
        let count = |reason: &str| {
            if let Some(c) = &self.config.remote_ignored {
                c.with_label_values(&[reason]).inc();
            }
        };
        if !self.may_report {
            tracing::warn!(
                client = %self.client,
                "ignored the remote-consistent LSN {lsn} (generation {generation}): the client's token is not a storage token, and only the pageserver may move the removal horizon"
            );
            count("not_storage");
            return false;
        }
        match source.set_remote_consistent_lsn(generation, lsn) {
            crate::timeline::RemoteReport::Taken => {
                tracing::debug!("the pageserver's remote-consistent LSN is {lsn} (generation {generation})")
            }
            crate::timeline::RemoteReport::Superseded { newest } => {
                tracing::info!(
                    client = %self.client,
                    "ignored the remote-consistent LSN {lsn} of attachment generation {generation}: generation {newest} is newer"
                );
                count("superseded");
            }
        }
        true
    }

    /// Writes everything queued, giving up after the sender timeout.
    async fn flush(&mut self) -> anyhow::Result<()> {
        tokio::time::timeout(self.config.sender_timeout, write_flush(&mut self.write, &self.out))
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
async fn read_messages(mut read: ReadHalf, tx: mpsc::Sender<Result<Frontend, ReadEnd>>) {
    let end = loop {
        let mut head = [0u8; 5];
        match read.read_exact(&mut head[..1]).await {
            Ok(_) => {}
            // Closed or reset between messages (a pageserver that moves to another
            // safekeeper, a process killed): the client is gone, which ends the connection
            // without an error.
            Err(e) if crate::peer::went_away_io(&e) => break ReadEnd::Closed,
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
    /// How the startup and the authentication ended.
    enum Begun {
        /// The client went away or cancelled.
        Gone,
        /// Its token was refused: the error to send it (already logged and counted).
        Refused(PgError),
        Ready(Startup),
    }
    let startup_timeout = conn.config.startup_timeout;
    let startup_and_auth = async {
        let Some(s) = startup(conn).await? else { return Ok::<_, PgError>(Begun::Gone) };
        if let Some(auth) = conn.config.auth.clone() {
            match authenticate(conn, &auth, &s).await? {
                Err(refusal) => return Ok(Begun::Refused(refusal)),
                Ok(claims) => conn.may_report = claims.scope == auth::Scope::Storage,
            }
        }
        Ok(Begun::Ready(s))
    };
    let startup = match tokio::time::timeout(startup_timeout, startup_and_auth).await {
        Err(_) => return Err(anyhow!("the client did not complete the startup in {startup_timeout:?}")),
        Ok(Ok(Begun::Gone)) => return Ok(()),
        Ok(Ok(Begun::Refused(e))) => {
            // Not an error of the connection: the refusal was logged once, where it was
            // decided, and the listener must not log it again.
            let _ = conn.report(&e).await;
            return Ok(());
        }
        Ok(Ok(Begun::Ready(s))) => s,
        Ok(Err(e)) => return Err(conn.fatal(e.code, e.message).await),
    };
    let source = match lookup(startup.tenant, startup.timeline) {
        Ok(s) => s,
        Err(e) => {
            let message = format!("timeline {}/{} is not available on this safekeeper: {e:#}", startup.tenant, startup.timeline);
            return Err(conn.fatal(sqlstate::INVALID_CATALOG_NAME, message).await);
        }
    };
    conn.timeline = Some((startup.tenant, startup.timeline));
    let span = tracing::info_span!(
        "timeline",
        tenant_id = %startup.tenant,
        timeline_id = %startup.timeline,
        application_name = startup.application_name.as_deref().unwrap_or(""),
    );
    tracing::Instrument::instrument(session(conn, source, &startup), span).await
}

static NEXT_BACKEND_ID: AtomicI32 = AtomicI32::new(1);

/// The `application_name` of the pageserver's WAL receiver: its standby status updates
/// are the pageserver's feedback.
pub const PAGESERVER_APPLICATION_NAME: &str = "fjord_pageserver";

async fn session<S: WalSource + ?Sized>(conn: &mut Conn, source: Arc<S>, startup: &Startup) -> anyhow::Result<()> {
    tracing::debug!("replication connection started");
    conn.client = format!("{}{}", startup.application_name.as_deref().unwrap_or(""), conn.client);
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
        (SAFEKEEPER_PARAMETER, SAFEKEEPER_PROTOCOL_VERSION),
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
        Command::FjordRemoteConsistentLsn { generation, lsn } => {
            if conn.report_remote_consistent_lsn(&**source, generation, lsn) {
                command_complete(&mut conn.out, "FJORD_REMOTE_CONSISTENT_LSN");
                ready_for_query(&mut conn.out);
                conn.flush().await?;
            } else {
                let e = PgError::error(
                    sqlstate::INSUFFICIENT_PRIVILEGE,
                    "only the pageserver (a storage token) may report the remote-consistent LSN",
                );
                conn.report(&e).await?;
            }
        }
        Command::Show(name) => match show_value(&name, source.wal_segment_size()) {
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
            let wal_start = source.wal_begin_lsn();
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
            let r = stream_wal(conn, source, rx, start).await;
            source.standby_disconnected(&conn.client);
            return r;
        }
    }
    Ok(Next::Continue)
}

// ---------------------------------------------------------------------------------------
// Streaming.

/// The end of the next chunk to send from `sent`: at most `max` bytes, not beyond `commit`,
/// not across a boundary of segments of `segment_bytes`.
fn chunk_end(sent: Lsn, commit: Lsn, max: usize, segment_bytes: u64) -> Lsn {
    let segment_bytes = segment_bytes.max(1);
    let segment_end = (sent.0 / segment_bytes + 1).saturating_mul(segment_bytes);
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
                    let feedback = PageserverFeedback {
                        write_lsn: Lsn(body.get_u64()),
                        flush_lsn: Lsn(body.get_u64()),
                        apply_lsn: Lsn(body.get_u64()),
                        ..PageserverFeedback::default()
                    };
                    let _client_time = body.get_i64();
                    let reply_requested = body.get_u8() != 0;
                    tracing::trace!("standby status update {feedback:?}");
                    source.set_standby_feedback(&conn.client, feedback);
                    if reply_requested {
                        keepalive(&mut conn.out, source.commit_lsn(), false);
                        conn.flush().await?;
                        st.last_send = Instant::now();
                    }
                }
                // Hot standby feedback (PostgreSQL's layout): the time, then the xmin and
                // catalog xmin, each as a 32-bit xid and its epoch; 0 is none.
                Some(b'h') => {
                    if body.len() != 25 {
                        let m = format!("invalid hot standby feedback: {} bytes, expected 25", body.len());
                        return Err(conn.fatal(sqlstate::PROTOCOL_VIOLATION, m).await);
                    }
                    body.advance(1);
                    let _client_time = body.get_i64();
                    let mut full_xid = || {
                        let xid = body.get_u32();
                        let epoch = body.get_u32();
                        if xid == 0 {
                            0
                        } else {
                            (u64::from(epoch) << 32) | u64::from(xid)
                        }
                    };
                    let xmin = full_xid();
                    let catalog_xmin = full_xid();
                    tracing::trace!("hot standby feedback: xmin {xmin}, catalog xmin {catalog_xmin}");
                    source.set_hot_standby_feedback(&conn.client, xmin, catalog_xmin);
                }
                Some(REMOTE_CONSISTENT_LSN_TAG) => {
                    if body.len() != 9 && body.len() != 13 {
                        let m =
                            format!("invalid remote-consistent LSN message: {} bytes, expected 13 (or 9 without a generation)", body.len());
                        return Err(conn.fatal(sqlstate::PROTOCOL_VIOLATION, m).await);
                    }
                    body.advance(1);
                    let generation = if body.len() == 12 { body.get_u32() } else { 0 };
                    let lsn = Lsn(body.get_u64());
                    conn.report_remote_consistent_lsn(&**source, generation, lsn);
                }
                Some(t) => {
                    let m = format!("unexpected standby message type {:?} in CopyData (expected 'r', 'h' or 'P')", t as char);
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

/// Streams committed WAL from `start` until the client ends it, each record checked before
/// any of its bytes is sent ([`verify`]).
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
    let segment_bytes = u64::from(source.wal_segment_size());
    let decoder_config = DecoderConfig { segment_size_bytes: segment_bytes, system_id: Some(source.system_id()) };
    // Set up once the first committed bytes after `start` are there to decode.
    let mut wal: Option<VerifiedStream> = None;
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
        // Checked WAL goes out first, one message per turn, so client messages are read in
        // between; only then is more read.
        if let Some(w) = wal.as_mut() {
            if send_verified(conn, w, commit, &mut st).await? {
                continue;
            }
        }
        let read_from = match &wal {
            Some(w) => w.next_read_lsn(),
            None if start < commit => match setup_stream(source, start, commit, decoder_config).await {
                Ok(Some(w)) => {
                    wal = Some(w);
                    continue;
                }
                Ok(None) => commit,
                Err(Setup::Read { from, error }) => return read_failed(conn, source, from, commit, error).await,
                Err(Setup::Corrupt(e)) => return corrupt_wal(conn, source, e).await,
            },
            None => commit,
        };
        if read_from < commit {
            let end = chunk_end(read_from, commit, conn.config.send_bytes_max, segment_bytes);
            let data = match read_wal(source, read_from, end).await {
                Ok(d) => d,
                Err(e) => return read_failed(conn, source, read_from, end, e).await,
            };
            let Some(w) = wal.as_mut() else { unreachable!("reads begin once the stream is set up") };
            if let Err(e) = w.feed(data) {
                // What checked before the bad record goes out; the bad record never does.
                while send_verified(conn, w, commit, &mut st).await? {}
                return corrupt_wal(conn, source, e).await;
            }
            continue;
        }
        // Caught up (or holding back a record the commit LSN ends inside): wait for more
        // WAL, the client, or a timer.
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
                let new = commit_rx.borrow().0.saturating_sub(read_from.0);
                if new < LINGER_BYTES {
                    tokio::time::sleep_until(st.last_send + conn.config.linger).await;
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

/// Sends the next checked WAL as one `XLogData` message; `false` if none is waiting.
async fn send_verified(conn: &mut Conn, wal: &mut VerifiedStream, commit: Lsn, st: &mut Streaming) -> anyhow::Result<bool> {
    let Some((at, data)) = wal.next_send(conn.config.send_bytes_max) else { return Ok(false) };
    message(&mut conn.out, b'd', |b| {
        b.put_u8(b'w');
        b.put_u64(at.0);
        b.put_u64(commit.0);
        b.put_i64(pg_now());
        b.put_slice(&data);
    });
    conn.flush().await?;
    st.sent = wal.sent_lsn();
    st.last_send = Instant::now();
    Ok(true)
}

/// Why a stream could not be set up.
enum Setup {
    Read { from: Lsn, error: anyhow::Error },
    Corrupt(WalError),
}

/// Finds where decoding begins for a client starting at `start` (reading page headers on
/// the blocking pool) and sets the stream up there; `None` until `start`'s page header is
/// committed.
async fn setup_stream<S: WalSource + ?Sized>(
    source: &Arc<S>,
    start: Lsn,
    commit: Lsn,
    config: DecoderConfig,
) -> Result<Option<VerifiedStream>, Setup> {
    let src = Arc::clone(source);
    let begin = source.wal_begin_lsn();
    let found = tokio::task::spawn_blocking(move || {
        let mut last_read = start;
        let found = verify::decode_start(start, begin, commit, config, |from, to| {
            last_read = from;
            src.read_wal_verified(from, to)
        });
        found.map_err(|error| Setup::Read { from: last_read, error })
    })
    .await
    .map_err(|e| Setup::Read { from: start, error: anyhow!("the WAL read failed: {e}") })??;
    let Some(from) = found else { return Ok(None) };
    if from.unverifiable_tail {
        tracing::info!(
            "{start} is inside a record that began before this safekeeper's WAL (it begins at {}): the rest of that record is sent with only its page headers checked",
            from.lsn
        );
    } else if from.lsn < start {
        tracing::debug!("decoding from {} to check the record that holds {start}", from.lsn);
    }
    VerifiedStream::new(start, from, config).map(Some).map_err(Setup::Corrupt)
}

/// A read failed: WAL removed under the client (behind the removal horizon: no
/// corruption, an error of the connection), or a segment the storage found corrupt
/// (logged here at error level, counted, `FATAL` XX001, and the connection closed).
async fn read_failed<S: WalSource + ?Sized>(
    conn: &mut Conn,
    source: &Arc<S>,
    from: Lsn,
    to: Lsn,
    e: anyhow::Error,
) -> anyhow::Result<Next> {
    let begin = source.wal_begin_lsn();
    if from < begin {
        let m = format!("requested WAL at {from} has been removed from this safekeeper (its WAL now begins at {begin})");
        tracing::warn!("{m}");
        return Err(conn.fatal(sqlstate::UNDEFINED_FILE, m).await);
    }
    let m = format!("could not send WAL {from}..{to}: {e:#}");
    tracing::error!("{m}");
    corruption_reported(conn, m).await
}

/// A record (or page header) failed the decoder's checks: logged once, here, counted, and
/// the client told with `FATAL` XX001 so that it goes to another safekeeper.
async fn corrupt_wal<S: WalSource + ?Sized>(conn: &mut Conn, source: &Arc<S>, e: WalError) -> anyhow::Result<Next> {
    let lsn = e.lsn();
    let segment_bytes = u64::from(source.wal_segment_size()).max(1);
    let segment = pgwal::segment::segment_file_name(PG_TIMELINE, lsn.0 / segment_bytes, segment_bytes);
    tracing::error!("WAL at {lsn} in segment file {segment} failed verification and is not sent: {e}");
    corruption_reported(conn, format!("WAL at {lsn} is corrupt on this safekeeper (segment file {segment}): {e}")).await
}

/// Counts corruption already logged, tells the client (`FATAL` XX001) and closes the
/// connection. Not an error of the connection: it was logged once, where it was found,
/// and the listener must not log it again (as with a refused token).
async fn corruption_reported(conn: &mut Conn, message: String) -> anyhow::Result<Next> {
    count_corruption(conn);
    let _ = conn.fatal(sqlstate::DATA_CORRUPTED, message).await;
    Ok(Next::Close)
}

fn count_corruption(conn: &Conn) {
    if let (Some(counter), Some((tenant, timeline))) = (&conn.config.wal_corruption, conn.timeline) {
        counter.with_label_values(&[&tenant.to_string(), &timeline.to_string()]).inc();
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
    fn chunks_stop_at_commit_segment_end_and_size() {
        let seg = 16 << 20;
        assert_eq!(chunk_end(Lsn(seg - 10), Lsn(seg + 100), MAX_SEND_BYTES, seg), Lsn(seg));
        assert_eq!(chunk_end(Lsn(seg), Lsn(seg + 100), MAX_SEND_BYTES, seg), Lsn(seg + 100));
        assert_eq!(chunk_end(Lsn(seg), Lsn(3 * seg), MAX_SEND_BYTES, seg), Lsn(seg + MAX_SEND_BYTES as u64));
        assert_eq!(chunk_end(Lsn((1 << 20) - 1), Lsn(3 * seg), MAX_SEND_BYTES, 1 << 20), Lsn(1 << 20));
        assert_eq!(show_value("wal_segment_size", 1 << 30).as_deref(), Some("1GB"));
        assert_eq!(show_value("WAL_SEGMENT_SIZE", 16 << 20).as_deref(), Some("16MB"));
    }
}
