//! PostgreSQL's `SSLRequest`: a client that wants TLS first sends 8 bytes (length 8, code
//! 80877103), the server answers one byte, `S` (TLS follows) or `N` (no TLS), and the
//! startup packet then travels inside TLS. The safekeepers' port speaks it, so libpq
//! clients (`sslmode=verify-full`) and fjord's own both reach it the same way.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::ServerConfig;

use crate::client::{ClientStream, ClientTls, ConnectError};
use crate::server::{handshake_server, is_timeout, restore, set_handshake_timeouts, AcceptError, Accepted, HANDSHAKE_TIMEOUT};

/// The code of an `SSLRequest`.
pub const SSL_REQUEST_CODE: u32 = 80877103;
/// The code of a `GSSENCRequest`, which a server without GSSAPI answers with `N`.
pub const GSSENC_REQUEST_CODE: u32 = 80877104;

/// The 8 bytes of an `SSLRequest`.
pub fn ssl_request() -> [u8; 8] {
    let mut bytes = [0u8; 8];
    bytes[..4].copy_from_slice(&8u32.to_be_bytes());
    bytes[4..].copy_from_slice(&SSL_REQUEST_CODE.to_be_bytes());
    bytes
}

fn is_request(first: &[u8], code: u32) -> bool {
    first.len() >= 8 && first[..4] == 8u32.to_be_bytes() && first[4..8] == code.to_be_bytes()
}

/// Whether a connection's first 8 bytes are an `SSLRequest`.
pub fn is_ssl_request(first: &[u8]) -> bool {
    is_request(first, SSL_REQUEST_CODE)
}

/// Whether a connection's first 8 bytes are a `GSSENCRequest`.
pub fn is_gssenc_request(first: &[u8]) -> bool {
    is_request(first, GSSENC_REQUEST_CODE)
}

/// Client side: sends an `SSLRequest` and reads the answer: `Ok(true)` for `S`,
/// `Ok(false)` for `N`; anything else is an error.
pub fn request_ssl(tcp: &mut TcpStream) -> io::Result<bool> {
    tcp.write_all(&ssl_request())?;
    let mut answer = [0u8; 1];
    tcp.read_exact(&mut answer)?;
    match answer[0] {
        b'S' => Ok(true),
        b'N' => Ok(false),
        other => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the server answered the SSLRequest with {:?}, not S or N", other as char),
        )),
    }
}

/// Client side: an `SSLRequest`, then the TLS handshake against `host` (see
/// [`ClientTls::connect`]). A server that answers `N` runs without TLS, which is an error.
pub fn connect(client: &ClientTls, mut tcp: TcpStream, host: &str) -> Result<ClientStream, ConnectError> {
    let addr = tcp.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| host.to_string());
    let saved = set_handshake_timeouts(&tcp).map_err(|source| ConnectError::Io { addr: addr.clone(), source })?;
    match request_ssl(&mut tcp) {
        Ok(true) => {}
        Ok(false) => {
            return Err(ConnectError::NotTls {
                addr,
                detail: "it answered the SSLRequest with N (is it running with --no-tls?)".to_string(),
            })
        }
        // Silence or a close before the answer: a busy or restarting server, worth another try.
        Err(e) if is_timeout(&e) => {
            let source =
                io::Error::new(io::ErrorKind::TimedOut, format!("no answer to the SSLRequest within {} s", HANDSHAKE_TIMEOUT.as_secs()));
            return Err(ConnectError::Io { addr, source });
        }
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            let source = io::Error::new(io::ErrorKind::UnexpectedEof, "the server closed the connection before answering the SSLRequest");
            return Err(ConnectError::Io { addr, source });
        }
        Err(e) if e.kind() == io::ErrorKind::InvalidData => return Err(ConnectError::NotTls { addr, detail: e.to_string() }),
        Err(source) => return Err(ConnectError::Io { addr, source }),
    }
    restore(&tcp, saved).map_err(|source| ConnectError::Io { addr, source })?;
    client.connect(tcp, host)
}

/// Server side: whether the client's first bytes are an `SSLRequest`, consuming those 8
/// bytes only if they are (anything else is left unread for the plaintext protocol). An
/// EOF or timeout before 8 bytes arrived is an error.
pub fn read_ssl_request(tcp: &mut TcpStream) -> io::Result<bool> {
    let deadline = Instant::now() + tcp.read_timeout()?.unwrap_or(HANDSHAKE_TIMEOUT);
    let mut first = [0u8; 8];
    loop {
        let n = tcp.peek(&mut first)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        // Anything that is no 8-byte request shows it in its first 4 bytes (its length).
        if n >= 4 && first[..4] != 8u32.to_be_bytes() {
            return Ok(false);
        }
        if n == 8 {
            break;
        }
        if Instant::now() >= deadline {
            return Err(io::ErrorKind::TimedOut.into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    if !is_ssl_request(&first) {
        return Ok(false);
    }
    tcp.read_exact(&mut first)?;
    Ok(true)
}

/// Server side, blocking: a client that sends an `SSLRequest` gets `S` and the TLS
/// handshake; any other client comes back as [`Accepted::Plaintext`] with nothing read,
/// for the server to refuse in the PostgreSQL protocol (an `ErrorResponse`).
pub fn accept(config: Arc<ServerConfig>, mut tcp: TcpStream) -> Result<Accepted, AcceptError> {
    let peer = tcp.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "(unknown address)".to_string());
    let saved = set_handshake_timeouts(&tcp).map_err(|source| AcceptError::Io { peer: peer.clone(), source })?;
    let requested = match read_ssl_request(&mut tcp) {
        Ok(requested) => requested,
        Err(e) if is_timeout(&e) => return Err(AcceptError::Timeout { peer }),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(AcceptError::Closed { peer }),
        Err(source) => return Err(AcceptError::Io { peer, source }),
    };
    if !requested {
        restore(&tcp, saved).map_err(|source| AcceptError::Io { peer, source })?;
        return Ok(Accepted::Plaintext(tcp));
    }
    tcp.write_all(b"S").map_err(|source| AcceptError::Io { peer: peer.clone(), source })?;
    let stream = handshake_server(config, tcp, &peer)?;
    restore(&stream.sock, saved).map_err(|source| AcceptError::Io { peer, source })?;
    Ok(Accepted::Tls(Box::new(stream)))
}
