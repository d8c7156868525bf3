//! TLS to the safekeepers ([`crate::Config::tls`]): the connecting thread asks for it
//! (PostgreSQL's `SSLRequest`, answered `S`) and completes the handshake with blocking I/O;
//! the core thread then drives the `rustls::ClientConnection` on the non-blocking socket
//! itself ([`Tls`]), with the same `MSG_DONTWAIT` reads and writes as in plaintext.
//!
//! Copies: rustls reads the socket straight into its own buffer and decrypts there; the
//! plaintext is copied once into the connection's input (as a plaintext read is copied once
//! from the read buffer). Queued messages are encrypted from the connection's output buffer
//! into rustls's, which is written to the socket with one `sendmsg` of all its records.
//!
//! The core sleeps only when rustls holds nothing it could act on: every read decrypts what
//! it read and takes out all the plaintext (a partial record waits for the socket), and the
//! socket is polled for writing while rustls has TLS bytes to send.

use std::io::{self, BufRead, Read, Write};
use std::net::TcpStream;
use std::os::fd::RawFd;

use bytes::BytesMut;
use rustls::ClientConnection;

/// A socket read and written without blocking, for rustls's `read_tls`/`write_tls`.
pub struct Fd(pub RawFd);

impl Read for Fd {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: reads at most `buf.len()` bytes into `buf`; MSG_DONTWAIT returns at once
        // when nothing is there.
        let n = unsafe { libc::recv(self.0, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }
}

impl Write for Fd {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // SAFETY: sends from `buf`'s initialised bytes; MSG_NOSIGNAL turns a closed peer
        // into EPIPE.
        let n = unsafe { libc::send(self.0, buf.as_ptr().cast(), buf.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    /// All of rustls's queued records in one system call.
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        // SAFETY: an all-zero msghdr is valid (no name, no control data).
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        // `IoSlice` is ABI-compatible with `iovec` on Unix; sendmsg only reads them.
        msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = bufs.len().min(libc::UIO_MAXIOV as usize) as _;
        // SAFETY: `msg` points at `bufs`, which lives across the call.
        let n = unsafe { libc::sendmsg(self.0, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The host part of `host:port`: what the safekeeper's certificate must name.
fn host_of(addr: &str) -> &str {
    addr.rsplit_once(':').map_or(addr, |(h, _)| h)
}

/// Asks the safekeeper at `addr` for TLS on `tcp` (PostgreSQL's `SSLRequest`) and
/// completes the handshake, blocking, verifying its certificate against the cluster CA and
/// the host in `addr`. The error says what went wrong in words a user can act on (another
/// CA, another host, a safekeeper without TLS).
pub fn connect(tcp: TcpStream, addr: &str, client: &tls::ClientTls) -> Result<tls::ClientStream, String> {
    tls::pg::connect(client, tcp, host_of(addr)).map_err(|e| format!("no TLS connection to the safekeeper: {e}"))
}

/// The core thread's side of one TLS connection.
pub struct Tls {
    conn: ClientConnection,
}

impl Tls {
    pub fn new(conn: ClientConnection) -> Tls {
        Tls { conn }
    }

    /// Whether rustls holds TLS bytes for the socket.
    pub fn wants_write(&self) -> bool {
        self.conn.wants_write()
    }

    /// Moves all the decrypted plaintext into `input`.
    pub fn take_plaintext(&mut self, input: &mut BytesMut) -> Result<(), String> {
        let mut reader = self.conn.reader();
        loop {
            match reader.fill_buf() {
                Ok([]) => return Ok(()),
                Ok(chunk) => {
                    let n = chunk.len();
                    input.extend_from_slice(chunk);
                    reader.consume(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                // The safekeeper closed without close_notify: the socket read says so.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(format!("read failed: {e}")),
            }
        }
    }

    /// Reads what the socket holds (up to about `limit` bytes of TLS), decrypts it, and
    /// moves the plaintext into `input`. `Ok(true)`: the socket is at its end.
    pub fn read(&mut self, fd: RawFd, input: &mut BytesMut, limit: usize) -> Result<bool, String> {
        let mut total = 0;
        let mut sock = Fd(fd);
        loop {
            match self.conn.read_tls(&mut sock) {
                Ok(0) => {
                    self.process()?;
                    self.take_plaintext(input)?;
                    return Ok(true);
                }
                Ok(n) => {
                    total += n;
                    self.process()?;
                    self.take_plaintext(input)?;
                    if total >= limit {
                        return Ok(false);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(format!("read failed: {e}")),
            }
        }
    }

    fn process(&mut self) -> Result<(), String> {
        self.conn.process_new_packets().map(|_| ()).map_err(|e| format!("TLS error: {e}"))
    }

    /// Encrypts what it can of `out` (consuming it) and writes rustls's TLS bytes to the
    /// socket until it would block. `Ok(true)` if the socket took any bytes.
    pub fn write(&mut self, fd: RawFd, out: &mut BytesMut) -> io::Result<bool> {
        use bytes::Buf;
        let mut sock = Fd(fd);
        let mut progress = false;
        loop {
            if !out.is_empty() {
                // rustls takes up to its buffer limit (64 KiB of TLS not yet written).
                let n = self.conn.writer().write(out)?;
                out.advance(n);
            }
            if !self.conn.wants_write() {
                return Ok(progress);
            }
            match self.conn.write_tls(&mut sock) {
                Ok(0) => return Ok(progress),
                Ok(_) => progress = true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(progress),
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_is_taken_from_the_address() {
        assert_eq!(host_of("sk1.example:5454"), "sk1.example");
        assert_eq!(host_of("127.0.0.1:5454"), "127.0.0.1");
        assert_eq!(host_of("[::1]:5454"), "[::1]");
    }
}
