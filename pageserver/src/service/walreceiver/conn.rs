//! The client side of a replication connection: startup, trust authentication, replication
//! commands with a row answer (`IDENTIFY_SYSTEM`), and message reads with and without
//! waiting. Message framing and the regular messages come from `postgres-protocol`;
//! `CopyBothResponse`, which it does not know, is recognized here. The streaming loop and
//! the replication payloads are in `walreceiver.rs`.
//!
//! Every connection sends the same startup parameters, whatever the server:
//! `replication=true` (physical), `user`, `application_name=fjord_pageserver`, and
//! `database=<tenant id>/<timeline id>`, which a safekeeper uses to pick the timeline and a
//! physical walsender ignores (one code path for both).
//!
//! What the server is shows in its answer: a safekeeper reports the parameter
//! `fjord.safekeeper` (the version of fjord's additions to the protocol it accepts) among
//! its `ParameterStatus` messages, which no PostgreSQL server does ([`Conn::safekeeper`]).
//! Only then does the receiver send fjord's own CopyData messages (the remote-consistent
//! LSN), which a compute's walsender would refuse.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use bytes::{Buf, BytesMut};
use fallible_iterator::FallibleIterator;
use postgres_protocol::message::{backend, frontend};
use proto::Lsn;

use super::{WalSource, APPLICATION_NAME, READ_TIMEOUT};

pub(super) struct Conn {
    stream: TcpStream,
    buf: BytesMut,
    /// The server's `fjord.safekeeper` parameter: `Some(version)` for a safekeeper, `None`
    /// for a PostgreSQL walsender.
    safekeeper: Option<String>,
}

/// The `ParameterStatus` a safekeeper reports, and the version of fjord's additions to the
/// protocol that has the remote-consistent LSN message (`safekeeper/src/replication.rs`).
pub(super) const SAFEKEEPER_PARAMETER: &str = "fjord.safekeeper";
const SAFEKEEPER_REMOTE_CONSISTENT_LSN_VERSION: u32 = 1;
/// The tag of fjord's CopyData message with the remote-consistent LSN.
pub(super) const REMOTE_CONSISTENT_LSN_TAG: u8 = b'P';

pub(super) enum Msg {
    Backend(backend::Message),
    CopyBoth,
}

/// What `IDENTIFY_SYSTEM` answered.
#[derive(Debug, Clone, Copy)]
pub(super) struct Identity {
    pub tli: u32,
    /// The server's WAL end: its flush LSN, or a safekeeper's commit LSN.
    pub xlogpos: Lsn,
}

impl Conn {
    /// Whether the server is a safekeeper that accepts the remote-consistent LSN message
    /// (it reported `fjord.safekeeper` of version 1 or later at startup).
    pub fn accepts_remote_consistent_lsn(&self) -> bool {
        self.safekeeper.as_deref().and_then(|v| v.parse::<u32>().ok()).is_some_and(|v| v >= SAFEKEEPER_REMOTE_CONSISTENT_LSN_VERSION)
    }

    /// The server's `fjord.safekeeper` parameter, if it reported one.
    pub fn safekeeper(&self) -> Option<&str> {
        self.safekeeper.as_deref()
    }

    pub fn send(&mut self, out: &BytesMut) -> anyhow::Result<()> {
        self.stream.write_all(out).context("write to the server")
    }

    /// A complete message from the buffer, if there is one.
    fn buffered(&mut self) -> anyhow::Result<Option<Msg>> {
        if self.buf.len() >= 5 {
            let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
            if self.buf[0] == b'W' {
                if self.buf.len() > len {
                    self.buf.advance(1 + len);
                    return Ok(Some(Msg::CopyBoth));
                }
            } else if let Some(m) = backend::Message::parse(&mut self.buf).context("parse a server message")? {
                return Ok(Some(Msg::Backend(m)));
            }
        }
        Ok(None)
    }

    /// The next message, waiting at most `READ_TIMEOUT` for bytes; `Ok(None)` on timeout.
    pub fn next(&mut self) -> anyhow::Result<Option<Msg>> {
        loop {
            if let Some(m) = self.buffered()? {
                return Ok(Some(m));
            }
            let mut chunk = [0u8; 64 * 1024];
            match self.stream.read(&mut chunk) {
                Ok(0) => bail!("the server closed the connection"),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => return Ok(None),
                Err(e) => return Err(e).context("read from the server"),
            }
        }
    }

    /// The next message if it is already readable, without waiting.
    pub fn try_next(&mut self) -> anyhow::Result<Option<Msg>> {
        loop {
            if let Some(m) = self.buffered()? {
                return Ok(Some(m));
            }
            let mut chunk = [0u8; 64 * 1024];
            // SAFETY: a valid buffer of the given length and an open socket.
            let n =
                unsafe { libc::recv(self.stream.as_raw_fd(), chunk.as_mut_ptr().cast::<libc::c_void>(), chunk.len(), libc::MSG_DONTWAIT) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                return match e.kind() {
                    std::io::ErrorKind::WouldBlock => Ok(None),
                    std::io::ErrorKind::Interrupted => continue,
                    _ => Err(e).context("read from the server"),
                };
            }
            if n == 0 {
                bail!("the server closed the connection");
            }
            self.buf.extend_from_slice(&chunk[..n as usize]);
        }
    }

    /// Runs a replication command that returns rows, returning the first row's fields.
    pub fn simple_query(&mut self, query: &str, deadline: Instant) -> anyhow::Result<Vec<Option<String>>> {
        let mut out = BytesMut::new();
        frontend::query(query, &mut out)?;
        self.send(&out)?;
        let mut row = Vec::new();
        loop {
            match self.next()? {
                None if Instant::now() > deadline => bail!("timed out waiting for the answer to {query}"),
                None => {}
                Some(Msg::Backend(backend::Message::DataRow(body))) => {
                    let buf = body.buffer();
                    for range in body.ranges().iterator() {
                        let range = range.context("parse a data row")?;
                        row.push(range.map(|r| String::from_utf8_lossy(&buf[r]).into_owned()));
                    }
                }
                Some(Msg::Backend(backend::Message::ErrorResponse(body))) => bail!("{query} failed: {}", error_text(&body)),
                Some(Msg::Backend(backend::Message::ReadyForQuery(_))) => return Ok(row),
                Some(_) => {}
            }
        }
    }

    /// `IDENTIFY_SYSTEM`: the timeline (1 if the server sends none) and the WAL end.
    pub fn identify_system(&mut self, deadline: Instant) -> anyhow::Result<Identity> {
        let row = self.simple_query("IDENTIFY_SYSTEM", deadline)?;
        let tli = row.get(1).cloned().flatten().and_then(|t| t.parse::<u32>().ok()).unwrap_or(1);
        let xlogpos = match row.get(2).cloned().flatten() {
            Some(s) => s.parse::<Lsn>().map_err(|e| anyhow!("IDENTIFY_SYSTEM returned an invalid xlogpos {s:?}: {e}"))?,
            None => bail!("IDENTIFY_SYSTEM returned no xlogpos"),
        };
        Ok(Identity { tli, xlogpos })
    }
}

pub(super) fn error_text(body: &backend::ErrorResponseBody) -> String {
    let mut fields = body.fields();
    let mut msg = String::new();
    while let Ok(Some(f)) = fields.next() {
        if f.type_() == b'M' {
            msg = String::from_utf8_lossy(f.value_bytes()).into_owned();
        }
    }
    msg
}

/// Opens a replication connection to `source`, giving up after `timeout` (connecting and
/// authenticating together). `database` is `<tenant id>/<timeline id>`.
pub(super) fn connect(source: &WalSource, database: &str, timeout: Duration) -> anyhow::Result<Conn> {
    let deadline = Instant::now() + timeout;
    let addrs: Vec<_> = (source.host.as_str(), source.port).to_socket_addrs().context("resolve the host")?.collect();
    let mut last_err = None;
    let mut stream = None;
    for addr in addrs {
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        match TcpStream::connect_timeout(&addr, left) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last_err = Some(e),
        }
    }
    let stream = match (stream, last_err) {
        (Some(s), _) => s,
        (None, Some(e)) => return Err(e).context("connect"),
        (None, None) => bail!("the host resolves to no address"),
    };
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(READ_TIMEOUT))?;
    let mut conn = Conn { stream, buf: BytesMut::new(), safekeeper: None };
    let mut out = BytesMut::new();
    frontend::startup_message(
        [("user", source.user.as_str()), ("replication", "true"), ("application_name", APPLICATION_NAME), ("database", database)],
        &mut out,
    )?;
    conn.send(&out)?;
    loop {
        match conn.next()? {
            None if Instant::now() > deadline => bail!("timed out waiting for the server to accept the connection"),
            None => {}
            Some(Msg::Backend(backend::Message::AuthenticationOk)) => {}
            Some(Msg::Backend(backend::Message::ParameterStatus(p))) if p.name().is_ok_and(|n| n == SAFEKEEPER_PARAMETER) => {
                conn.safekeeper = Some(p.value().context("parse the fjord.safekeeper parameter")?.to_string());
            }
            Some(Msg::Backend(backend::Message::ReadyForQuery(_))) => return Ok(conn),
            Some(Msg::Backend(backend::Message::ErrorResponse(body))) => bail!("the server refused the connection: {}", error_text(&body)),
            Some(Msg::Backend(
                backend::Message::AuthenticationCleartextPassword
                | backend::Message::AuthenticationMd5Password(_)
                | backend::Message::AuthenticationSasl(_),
            )) => bail!("the server asks for a password; the wal receiver supports only trust authentication so far"),
            Some(_) => {}
        }
    }
}

/// A short connection that asks a source for its WAL end and closes.
pub(super) fn probe(source: &WalSource, database: &str, timeout: Duration) -> anyhow::Result<Lsn> {
    let deadline = Instant::now() + timeout;
    let mut conn = connect(source, database, timeout)?;
    let ident = conn.identify_system(deadline)?;
    let mut out = BytesMut::new();
    frontend::terminate(&mut out);
    let _ = conn.send(&out);
    Ok(ident.xlogpos)
}
