//! A client connection's bytes: plain TCP, or TLS over TCP (`--tls-cert`), behind one type
//! for the proposer and replication code.
//!
//! A proposer's connection moves to a thread of its own with a runtime of its own once
//! greeted ([`crate::proposer`]); a tokio socket belongs to the runtime it was registered
//! with, so [`Socket`] can give its TCP stream up ([`Stream::detach`]) and take it back on the
//! other runtime ([`Stream::attach`]) while the TLS session around it stays as it is.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A TCP stream that can be moved to another runtime (see the module documentation).
/// Without one, every read and write fails with `NotConnected`.
pub struct Socket(Option<TcpStream>);

impl Socket {
    pub fn new(stream: TcpStream) -> Socket {
        Socket(Some(stream))
    }

    fn get(&mut self) -> io::Result<&mut TcpStream> {
        self.0.as_mut().ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "the connection is moving to another runtime"))
    }
}

impl AsyncRead for Socket {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut().get() {
            Ok(s) => Pin::new(s).poll_read(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl AsyncWrite for Socket {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut().get() {
            Ok(s) => Pin::new(s).poll_write(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        match self.get_mut().get() {
            Ok(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
    fn is_write_vectored(&self) -> bool {
        true
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut().get() {
            Ok(s) => Pin::new(s).poll_flush(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut().get() {
            Ok(s) => Pin::new(s).poll_shutdown(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

/// A client connection: plain TCP or TLS over TCP.
pub enum Stream {
    Plain(Socket),
    Tls(Box<tokio_rustls::server::TlsStream<Socket>>),
}

impl Stream {
    fn socket(&mut self) -> &mut Socket {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(t) => t.get_mut().0,
        }
    }

    /// Gives the TCP stream up, deregistered from this runtime, to [`Stream::attach`] it on
    /// another (the TLS session, and anything it has buffered, stays in `self`).
    pub fn detach(&mut self) -> io::Result<std::net::TcpStream> {
        let s = self.socket().0.take().ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "the connection is detached"))?;
        s.into_std()
    }

    /// Takes the TCP stream back, registered with the current runtime.
    pub fn attach(&mut self, s: std::net::TcpStream) -> io::Result<()> {
        self.socket().0 = Some(TcpStream::from_std(s)?);
        Ok(())
    }

    /// Reads what is there without waiting: `Ok(0)` at the end of the stream, `WouldBlock`
    /// when nothing is (and, over TLS, no whole record is: rustls keeps a partial one).
    pub fn try_read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.get()?.try_read_buf(buf),
            Stream::Tls(t) => {
                // The TLS stream reads its socket until it has plaintext or the socket would
                // block; a no-op waker suits a caller that polls the read again with its own
                // waker before it sleeps (a read future registers the real one then).
                let mut cx = Context::from_waker(std::task::Waker::noop());
                let before = buf.len();
                let mut rb = ReadBuf::uninit(buf.spare_capacity_mut());
                match Pin::new(&mut **t).poll_read(&mut cx, &mut rb) {
                    Poll::Ready(Ok(())) => {
                        let n = rb.filled().len();
                        // SAFETY: `poll_read` initialised the first `n` bytes of the spare
                        // capacity (`ReadBuf::filled`).
                        unsafe { buf.set_len(before + n) };
                        Ok(n)
                    }
                    Poll::Ready(Err(e)) => Err(e),
                    Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
                }
            }
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(t) => Pin::new(&mut **t).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(t) => Pin::new(&mut **t).poll_write(cx, buf),
        }
    }
    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(t) => Pin::new(&mut **t).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        true
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(t) => Pin::new(&mut **t).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(t) => Pin::new(&mut **t).poll_shutdown(cx),
        }
    }
}

/// The reading half of a replication connection (plain or TLS).
pub type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
/// The writing half of a replication connection (plain or TLS).
pub type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

/// Splits `stream` into halves for the replication code; `prefix` (bytes already read from
/// it) comes first. A plain stream splits without a lock between the halves.
pub fn split(stream: Stream, prefix: Vec<u8>) -> (ReadHalf, WriteHalf) {
    use tokio::io::AsyncReadExt;
    match stream {
        Stream::Plain(Socket(Some(tcp))) => {
            let (r, w) = tcp.into_split();
            (Box::new(std::io::Cursor::new(prefix).chain(r)), Box::new(w))
        }
        other => {
            let (r, w) = tokio::io::split(other);
            (Box::new(std::io::Cursor::new(prefix).chain(r)), Box::new(w))
        }
    }
}
