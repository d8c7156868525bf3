//! The client side of a replication connection: startup, authentication (trust, or a
//! token as a cleartext password), replication commands with a row answer
//! (`IDENTIFY_SYSTEM`), and message reads with and without waiting. Message framing and the regular messages come from `postgres-protocol`;
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
//! LSN) and commands (`FJORD_REMOTE_CONSISTENT_LSN`, [`report_position`]), which a
//! compute's walsender would refuse.
//!
//! TLS: with the cluster CA ([`Credentials::tls`], the pageserver's `--tls-ca`), every
//! connection first asks for TLS (PostgreSQL's `SSLRequest`), and the safekeeper's
//! certificate must be signed by the CA and name the host of the source; the startup and
//! everything after travel inside TLS. Without it the connection is cleartext (a safekeeper
//! that requires TLS refuses it, and its reason is the error).
//!
//! Authentication: a server that asks for a cleartext password (a safekeeper started with
//! `--auth-public-key`) gets the token registered with the timeline's sources (a storage
//! token narrowed to the timeline). Without one the connection fails saying so. MD5 and SCRAM are not supported: the token is a
//! bearer token the server must see whole, and no fjord server asks for them.

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

/// The connection's bytes: cleartext, or TLS over TCP.
enum Link {
    Plain(TcpStream),
    Tls(Box<tls::ClientStream>),
}

impl Link {
    fn socket(&self) -> &TcpStream {
        match self {
            Link::Plain(s) => s,
            Link::Tls(t) => &t.sock,
        }
    }

    fn write_all(&mut self, out: &[u8]) -> std::io::Result<()> {
        match self {
            Link::Plain(s) => s.write_all(out),
            Link::Tls(t) => {
                t.write_all(out)?;
                t.flush()
            }
        }
    }

    /// Reads, waiting at most the socket's read timeout (`WouldBlock` or `TimedOut` then).
    /// `Ok(0)`: the server closed the connection.
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Link::Plain(s) => s.read(buf),
            Link::Tls(t) => match t.read(buf) {
                // Closed without TLS's close_notify: closed all the same.
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(0),
                r => r,
            },
        }
    }

    /// Reads what is there without waiting (`WouldBlock` when nothing is; over TLS, when
    /// no whole record is). `Ok(0)`: the server closed the connection.
    fn read_now(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let fd = self.socket().as_raw_fd();
        let recv = |buf: &mut [u8]| {
            // SAFETY: a valid buffer of the given length and an open socket.
            let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast::<libc::c_void>(), buf.len(), libc::MSG_DONTWAIT) };
            if n < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        };
        match self {
            Link::Plain(_) => recv(buf),
            Link::Tls(t) => loop {
                // Plaintext rustls already holds comes first; then the socket's bytes.
                match t.conn.reader().read(buf) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(0),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                struct DontWait<F>(F);
                impl<F: FnMut(&mut [u8]) -> std::io::Result<usize>> Read for DontWait<F> {
                    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                        (self.0)(buf)
                    }
                }
                let n = t.conn.read_tls(&mut DontWait(recv))?;
                t.conn.process_new_packets().map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
                if n == 0 {
                    // The end of the socket: what was decrypted before it, then 0.
                    return match t.conn.reader().read(buf) {
                        Ok(n) => Ok(n),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(0),
                        Err(e) => Err(e),
                    };
                }
            },
        }
    }
}

pub(super) struct Conn {
    stream: Link,
    buf: BytesMut,
    /// The server's `fjord.safekeeper` parameter: `Some(version)` for a safekeeper, `None`
    /// for a PostgreSQL walsender.
    safekeeper: Option<String>,
}

/// The `ParameterStatus` a safekeeper reports, and the versions of fjord's additions to the
/// protocol (`safekeeper/src/replication.rs`): 1 has the remote-consistent LSN message, 2
/// the attachment generation in it and the `FJORD_REMOTE_CONSISTENT_LSN` command.
pub(super) const SAFEKEEPER_PARAMETER: &str = "fjord.safekeeper";
const SAFEKEEPER_REMOTE_CONSISTENT_LSN_VERSION: u32 = 1;
const SAFEKEEPER_GENERATION_VERSION: u32 = 2;
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

/// A failed read or write: a reset (or a write to a closed socket) is the server closing
/// the connection, as a server that stops does when a status update of ours is on its way,
/// and is reported as such; anything else keeps its cause.
fn io_error(e: std::io::Error, what: &'static str) -> anyhow::Error {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset};
    if matches!(e.kind(), ConnectionReset | ConnectionAborted | BrokenPipe) {
        anyhow::anyhow!("the server closed the connection ({e})")
    } else {
        anyhow::Error::new(e).context(what)
    }
}

impl Conn {
    /// Whether the server is a safekeeper that accepts the remote-consistent LSN message
    /// (it reported `fjord.safekeeper` of version 1 or later at startup).
    pub fn accepts_remote_consistent_lsn(&self) -> bool {
        self.safekeeper_version().is_some_and(|v| v >= SAFEKEEPER_REMOTE_CONSISTENT_LSN_VERSION)
    }

    /// Whether the server is a safekeeper that takes the attachment generation with the
    /// remote-consistent LSN (version 2 or later).
    pub fn accepts_generation(&self) -> bool {
        self.safekeeper_version().is_some_and(|v| v >= SAFEKEEPER_GENERATION_VERSION)
    }

    fn safekeeper_version(&self) -> Option<u32> {
        self.safekeeper.as_deref().and_then(|v| v.parse::<u32>().ok())
    }

    /// The server's `fjord.safekeeper` parameter, if it reported one.
    pub fn safekeeper(&self) -> Option<&str> {
        self.safekeeper.as_deref()
    }

    pub fn send(&mut self, out: &BytesMut) -> anyhow::Result<()> {
        self.stream.write_all(out).map_err(|e| io_error(e, "write to the server"))
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
                // A read with a timeout is not restarted after a signal (SIGCONT after a
                // stop, say): read again.
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_error(e, "read from the server")),
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
            let n = match self.stream.read_now(&mut chunk) {
                Ok(n) => n,
                Err(e) => {
                    return match e.kind() {
                        std::io::ErrorKind::WouldBlock => Ok(None),
                        std::io::ErrorKind::Interrupted => continue,
                        _ => Err(io_error(e, "read from the server")),
                    }
                }
            };
            if n == 0 {
                bail!("the server closed the connection");
            }
            self.buf.extend_from_slice(&chunk[..n]);
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

/// What a receiver connects with: the token it sends a server that asks for a password,
/// and the trust in the cluster CA for TLS.
#[derive(Clone, Copy)]
pub(super) struct Credentials<'a> {
    /// The token registered with the sources, if any.
    pub token: Option<&'a str>,
    /// The cluster CA (`--tls-ca`): connect with TLS and verify the server against it;
    /// `None`: cleartext.
    pub tls: Option<&'a tls::ClientTls>,
}

/// The error when a server asks for a password and the pageserver has no token.
pub(super) const NO_TOKEN_ERROR: &str =
    "the safekeeper requires a token: register the timeline's WAL sources with one (POST .../wal_receiver with \"token\", as fjord start does)";

/// Opens a replication connection to `source`, giving up after `timeout` (connecting and
/// authenticating together). `database` is `<tenant id>/<timeline id>`.
pub(super) fn connect(source: &WalSource, database: &str, credentials: Credentials<'_>, timeout: Duration) -> anyhow::Result<Conn> {
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
    let stream = match credentials.tls {
        None => Link::Plain(stream),
        Some(_) if source.plaintext => Link::Plain(stream),
        Some(client) => {
            // The handshake has its own timeouts (the tls crate's); the read timeout below
            // is the streaming loop's.
            Link::Tls(Box::new(tls::pg::connect(client, stream, &source.host)?))
        }
    };
    stream.socket().set_read_timeout(Some(READ_TIMEOUT))?;
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
            Some(Msg::Backend(backend::Message::AuthenticationCleartextPassword)) => {
                let Some(token) = credentials.token else { bail!("{NO_TOKEN_ERROR}") };
                let mut out = BytesMut::new();
                frontend::password_message(token.as_bytes(), &mut out).context("encode the password message")?;
                conn.send(&out)?;
            }
            Some(Msg::Backend(backend::Message::AuthenticationMd5Password(_))) => {
                bail!("the server asks for MD5 password authentication, which the WAL receiver does not support (it sends its token as a cleartext password)")
            }
            Some(Msg::Backend(backend::Message::AuthenticationSasl(_))) => {
                bail!("the server asks for SASL (SCRAM) authentication, which the WAL receiver does not support (it sends its token as a cleartext password)")
            }
            Some(Msg::Backend(
                backend::Message::AuthenticationKerberosV5
                | backend::Message::AuthenticationScmCredential
                | backend::Message::AuthenticationGss
                | backend::Message::AuthenticationSspi,
            )) => bail!("the server asks for an authentication method the WAL receiver does not support (it sends its token as a cleartext password)"),
            Some(_) => {}
        }
    }
}

/// A short connection that tells a safekeeper the timeline's remote-consistent LSN and the
/// attachment generation it belongs to (`FJORD_REMOTE_CONSISTENT_LSN`). `Ok(false)`: the
/// source is not a safekeeper that takes it (a compute's walsender, or a safekeeper before
/// version 2), nothing was sent.
pub(super) fn report_position(
    source: &WalSource,
    database: &str,
    credentials: Credentials<'_>,
    (generation, lsn): (u32, Lsn),
    timeout: Duration,
) -> anyhow::Result<bool> {
    let deadline = Instant::now() + timeout;
    let mut conn = connect(source, database, credentials, timeout)?;
    let takes_it = conn.accepts_generation();
    if takes_it {
        conn.simple_query(&format!("FJORD_REMOTE_CONSISTENT_LSN {generation} {lsn}"), deadline)?;
    }
    let mut out = BytesMut::new();
    frontend::terminate(&mut out);
    let _ = conn.send(&out);
    Ok(takes_it)
}

/// A short connection that asks a source for its WAL end and closes.
pub(super) fn probe(source: &WalSource, database: &str, credentials: Credentials<'_>, timeout: Duration) -> anyhow::Result<Lsn> {
    let deadline = Instant::now() + timeout;
    let mut conn = connect(source, database, credentials, timeout)?;
    let ident = conn.identify_system(deadline)?;
    let mut out = BytesMut::new();
    frontend::terminate(&mut out);
    let _ = conn.send(&out);
    Ok(ident.xlogpos)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::thread::JoinHandle;

    /// How a fake server answers the startup packet, and what it then does with a password.
    enum Asks {
        /// `AuthenticationCleartextPassword`; then accepts the password if it equals this.
        Cleartext(&'static str),
        /// `AuthenticationMD5Password` with a salt.
        Md5,
        /// `AuthenticationSASL` offering SCRAM-SHA-256.
        Sasl,
    }

    fn backend_message(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![tag];
        m.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    /// A server for one connection, speaking just the startup and authentication; returns
    /// the password it received, if any.
    fn fake_server(asks: Asks) -> (WalSource, JoinHandle<Option<Vec<u8>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let source =
            WalSource { host: "127.0.0.1".into(), port: listener.local_addr().unwrap().port(), user: "ps".into(), plaintext: false };
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut len = [0u8; 4];
            s.read_exact(&mut len).unwrap();
            let mut startup = vec![0u8; u32::from_be_bytes(len) as usize - 4];
            s.read_exact(&mut startup).unwrap();
            let expected = match asks {
                Asks::Cleartext(expected) => expected,
                Asks::Md5 => {
                    s.write_all(&backend_message(b'R', &[0, 0, 0, 5, 1, 2, 3, 4])).unwrap();
                    return None;
                }
                Asks::Sasl => {
                    s.write_all(&backend_message(b'R', b"\0\0\0\x0aSCRAM-SHA-256\0\0")).unwrap();
                    return None;
                }
            };
            s.write_all(&backend_message(b'R', &3u32.to_be_bytes())).unwrap();
            let mut head = [0u8; 5];
            if s.read_exact(&mut head).is_err() {
                return None; // the client had no password and closed
            }
            assert_eq!(head[0], b'p');
            let mut body = vec![0u8; u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize - 4];
            s.read_exact(&mut body).unwrap();
            assert_eq!(body.pop(), Some(0), "the password is NUL-terminated");
            if body == expected.as_bytes() {
                let mut out = backend_message(b'R', &0u32.to_be_bytes());
                out.extend(backend_message(b'S', b"fjord.safekeeper\x001\0"));
                out.extend(backend_message(b'Z', b"I"));
                s.write_all(&out).unwrap();
            } else {
                let fields = b"SFATAL\0C28P01\0Mthe token's signature does not verify\0\0";
                s.write_all(&backend_message(b'E', fields)).unwrap();
            }
            Some(body)
        });
        (source, server)
    }

    const TIMEOUT: Duration = Duration::from_secs(10);

    #[test]
    fn a_reset_is_the_server_closing_the_connection() {
        let reset = io_error(std::io::Error::from(std::io::ErrorKind::ConnectionReset), "read from the server").to_string();
        assert!(reset.starts_with("the server closed the connection ("), "{reset}");
        let other = io_error(std::io::Error::from(std::io::ErrorKind::PermissionDenied), "read from the server").to_string();
        assert_eq!(other, "read from the server");
    }

    #[test]
    fn the_token_is_the_password_when_the_server_asks() {
        let (source, server) = fake_server(Asks::Cleartext("storage-token"));
        let conn = connect(&source, "t/tl", Credentials { token: Some("storage-token"), tls: None }, TIMEOUT).unwrap();
        assert_eq!(conn.safekeeper(), Some("1"));
        assert_eq!(server.join().unwrap().as_deref(), Some(&b"storage-token"[..]));

        // A token the server refuses: its reason is the error.
        let (source, server) = fake_server(Asks::Cleartext("storage-token"));
        let e = connect(&source, "t/tl", Credentials { token: Some("other"), tls: None }, TIMEOUT).err().unwrap().to_string();
        assert_eq!(e, "the server refused the connection: the token's signature does not verify");
        server.join().unwrap();
    }

    #[test]
    fn without_a_token_the_error_says_what_to_set() {
        let (source, server) = fake_server(Asks::Cleartext("storage-token"));
        let e = connect(&source, "t/tl", Credentials { token: None, tls: None }, TIMEOUT).err().unwrap().to_string();
        assert_eq!(e, NO_TOKEN_ERROR);
        assert!(e.contains("register the timeline's WAL sources with one"));
        assert_eq!(server.join().unwrap(), None, "nothing was sent as a password");
    }

    #[test]
    fn md5_and_sasl_are_refused_by_name() {
        for (asks, name) in [(Asks::Md5, "MD5"), (Asks::Sasl, "SASL")] {
            let (source, server) = fake_server(asks);
            let e = connect(&source, "t/tl", Credentials { token: Some("storage-token"), tls: None }, TIMEOUT).err().unwrap().to_string();
            assert!(e.contains(name) && e.contains("does not support"), "{e}");
            server.join().unwrap();
        }
    }
}
