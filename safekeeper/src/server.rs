//! The safekeeper's TCP listener and the process around it.
//!
//! One port serves both protocols: the first byte of a connection tells them apart. A
//! proposer's first message is `Hello`, tag `b'H'` ([`crate::proposer`]); anything else is a
//! PostgreSQL client (a startup packet begins with its length, whose first byte is 0 for any
//! sane packet), handed to [`crate::replication`].
//!
//! Without TLS the first byte is peeked, not consumed (`TcpStream::peek`). With TLS
//! ([`crate::SafekeeperConfig::tls`]) every client, proposers included, first sends
//! PostgreSQL's `SSLRequest` (8 bytes); the listener answers `S`, completes the TLS handshake
//! and tells the protocols apart by the first byte inside the TLS stream (read, and handed
//! to the protocol with the stream). A `GSSENCRequest` is answered `N` (libpq then asks for
//! TLS). A client that sends anything else is refused in its own protocol, so that it shows
//! the reason: a proposer's `Hello` gets the proposer protocol's `Error`, anything else a
//! PostgreSQL `FATAL` error (SQLSTATE 28000). Refusals and failed handshakes are logged at
//! WARN with the client's address and counted in `safekeeper_tls_handshake_failures_total`;
//! they end only that connection. A client that resets or closes the connection in the
//! middle of the handshake is counted the same way but logged at INFO: a compute stopped
//! while it connects does that, and is no fault of either side.

use bytes::BytesMut;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::stream::{Socket, Stream};
use crate::Safekeeper;

/// How long a client has to ask for TLS, complete the handshake and send its first byte.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
use tls::pg::{GSSENC_REQUEST_CODE as GSSENC_REQUEST, SSL_REQUEST_CODE as SSL_REQUEST};
/// After refusing a client, the rest of what it sent is read (and dropped) for at most this
/// long, so that closing with unread bytes does not reset the connection before the client
/// has read the refusal.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);

/// How often advanced commit LSNs (and removal horizons) are written to control files, and
/// WAL below the removal horizon is removed.
pub const LAZY_PERSIST_INTERVAL: Duration = Duration::from_secs(1);

/// Accepts connections forever, one task each.
pub async fn accept_loop(listener: TcpListener, sk: Arc<Safekeeper>) -> anyhow::Result<()> {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // EMFILE and friends: transient; do not spin.
                tracing::warn!("could not accept a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let sk = sk.clone();
        tokio::spawn(async move {
            let result = match sk.config.tls.clone() {
                None => dispatch(stream, peer, sk).await,
                Some(tls) => dispatch_tls(stream, peer, tls.config(), sk).await,
            };
            match result {
                Ok(()) => {}
                Err(e) if crate::peer::went_away(&e) => tracing::info!(%peer, "connection ended: {e:#}"),
                Err(e) => tracing::warn!(%peer, "connection ended with an error: {e:#}"),
            }
        });
    }
}

async fn dispatch(stream: TcpStream, peer: SocketAddr, sk: Arc<Safekeeper>) -> anyhow::Result<()> {
    let mut first = [0u8; 1];
    let n = stream.peek(&mut first).await?;
    if n == 0 {
        return Ok(());
    }
    route(Stream::Plain(Socket::new(stream)), first[0], Vec::new(), peer, sk).await
}

/// Hands a connection to its protocol by its first byte; `read` holds what was already
/// consumed of it.
async fn route(stream: Stream, first: u8, read: Vec<u8>, peer: SocketAddr, sk: Arc<Safekeeper>) -> anyhow::Result<()> {
    if first == b'H' {
        sk.metrics.connections.with_label_values(&["proposer"]).inc();
        crate::proposer::serve(stream, BytesMut::from(&read[..]), peer.to_string(), sk).await
    } else {
        sk.metrics.connections.with_label_values(&["replication"]).inc();
        let (r, w) = crate::stream::split(stream, read);
        crate::replication::serve(r, w, peer.to_string(), sk).await
    }
}

/// Why a connection did not get through to a protocol over TLS.
enum NoTls {
    /// The client closed the connection before sending anything (a port probe).
    Closed,
    /// Refused or failed: the metric's reason and the log line.
    Failed(&'static str, String),
    /// The client left in the middle of the handshake (a reset or an early close): counted
    /// like a failure, but logged at INFO, since a compute stopped while it connects, or a
    /// client that does not trust our certificate, does just this.
    WentAway(&'static str, String),
}

/// The TLS side of [`dispatch`] (see the module documentation).
async fn dispatch_tls(stream: TcpStream, peer: SocketAddr, config: Arc<rustls::ServerConfig>, sk: Arc<Safekeeper>) -> anyhow::Result<()> {
    let opened = match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, open_tls(stream, config)).await {
        Ok(r) => r,
        Err(_) => Err(NoTls::Failed("timeout", format!("did not ask for TLS and complete the handshake within {TLS_HANDSHAKE_TIMEOUT:?}"))),
    };
    match opened {
        Ok((stream, first)) => route(stream, first, vec![first], peer, sk).await,
        Err(NoTls::Closed) => Ok(()),
        Err(NoTls::Failed(reason, message)) => {
            tracing::warn!(%peer, "refused a connection to the TLS port: {message}");
            sk.metrics.tls_handshake_failures.with_label_values(&[reason]).inc();
            Ok(())
        }
        Err(NoTls::WentAway(reason, message)) => {
            tracing::info!(%peer, "a client left the TLS port during the handshake: {message}");
            sk.metrics.tls_handshake_failures.with_label_values(&[reason]).inc();
            Ok(())
        }
    }
}

/// Reads the `SSLRequest`, answers it, completes the handshake and reads the first byte
/// inside TLS; refuses a client that sends anything else.
async fn open_tls(mut tcp: TcpStream, config: Arc<rustls::ServerConfig>) -> Result<(Stream, u8), NoTls> {
    let io = |what: &str, e: std::io::Error| NoTls::Failed("handshake", format!("{what}: {e}"));
    // At most one GSS negotiation before the SSL one, as PostgreSQL allows.
    for _ in 0..2 {
        let mut head = [0u8; 8];
        let mut got = 0;
        while got < head.len() {
            match tcp.read(&mut head[got..]).await {
                Ok(0) if got == 0 => return Err(NoTls::Closed),
                Ok(0) => return Err(NoTls::Failed("plaintext", format!("sent {got} bytes and closed the connection, no SSLRequest"))),
                Ok(n) => got += n,
                Err(e) if crate::peer::went_away_io(&e) && got == 0 => return Err(NoTls::Closed),
                Err(e) => return Err(io("read the SSLRequest", e)),
            }
            if head[0] == b'H' {
                // A proposer's `Hello` in plaintext: refused in the proposer protocol.
                let message = "this safekeeper accepts only TLS connections: the proposer must connect with TLS (the cluster CA in fjord.tls_ca_file, or compute_ctl's --tls-ca)";
                let mut out = BytesMut::new();
                quorum::wire::AcceptorMessage::Error { message: message.to_string() }.encode(&mut out);
                refuse(tcp, &out).await;
                return Err(NoTls::Failed("plaintext", "a proposer sent Hello without TLS".into()));
            }
        }
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        let code = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
        match (len, code) {
            (8, SSL_REQUEST) => {
                tcp.write_all(b"S").await.map_err(|e| io("answer the SSLRequest", e))?;
                let mut tls = tokio_rustls::TlsAcceptor::from(config).accept(Socket::new(tcp)).await.map_err(|e| {
                    let message = format!("the TLS handshake failed: {e}");
                    if crate::peer::went_away_io(&e) {
                        NoTls::WentAway("handshake", message)
                    } else {
                        NoTls::Failed("handshake", message)
                    }
                })?;
                let mut first = [0u8; 1];
                return match tls.read(&mut first).await {
                    Ok(0) => Err(NoTls::Closed),
                    Ok(_) => Ok((Stream::Tls(Box::new(tls)), first[0])),
                    Err(e) if crate::peer::went_away_io(&e) => Err(NoTls::Closed),
                    Err(e) => Err(io("read the first message inside TLS", e)),
                };
            }
            (8, GSSENC_REQUEST) => tcp.write_all(b"N").await.map_err(|e| io("answer the GSSENCRequest", e))?,
            _ if head[0] == 0x16 => {
                // A TLS ClientHello without the SSLRequest (PostgreSQL 17's direct SSL): there
                // is no protocol to answer it in.
                return Err(NoTls::Failed(
                    "plaintext",
                    "sent a TLS handshake without PostgreSQL's SSLRequest first (direct TLS is not supported)".into(),
                ));
            }
            _ => {
                let out = crate::replication::refusal(
                    "SSL required: this safekeeper accepts only TLS connections (connect with sslmode=verify-full and the cluster CA as sslrootcert)".into(),
                );
                refuse(tcp, &out).await;
                return Err(NoTls::Failed("plaintext", "a PostgreSQL client connected without TLS".into()));
            }
        }
    }
    Err(NoTls::Failed("plaintext", "sent a second GSSENCRequest instead of an SSLRequest".into()))
}

/// Sends `refusal`, then reads what else the client sent until it closes (for at most
/// [`REFUSAL_LINGER`]), so that it reads the refusal rather than a reset.
async fn refuse(mut tcp: TcpStream, refusal: &[u8]) {
    if tcp.write_all(refusal).await.is_err() {
        return;
    }
    let _ = tcp.shutdown().await;
    let _ = tokio::time::timeout(REFUSAL_LINGER, async {
        let mut sink = [0u8; 4096];
        while matches!(tcp.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// About once a second: writes advanced commit LSNs and removal horizons, then removes WAL
/// below the horizons just made durable.
pub async fn lazy_persister(sk: Arc<Safekeeper>) {
    let mut tick = tokio::time::interval(LAZY_PERSIST_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let sk = sk.clone();
        let _ = tokio::task::spawn_blocking(move || {
            sk.persist_lazy_state();
            sk.remove_wal();
        })
        .await;
    }
}

/// Runs the safekeeper on the two listeners until `shutdown` completes, then persists every
/// commit LSN and removal horizon. Connections still open are dropped with the runtime.
pub async fn run(
    sk: Arc<Safekeeper>,
    listener: TcpListener,
    http_listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let mut accept = tokio::spawn(accept_loop(listener, sk.clone()));
    let mut http = tokio::spawn(crate::http::serve(http_listener, sk.clone()));
    let persister = tokio::spawn(lazy_persister(sk.clone()));
    let result = tokio::select! {
        _ = shutdown => Ok(()),
        r = &mut accept => r.map_err(anyhow::Error::from).and_then(|r| r),
        r = &mut http => r.map_err(anyhow::Error::from).and_then(|r| r),
    };
    accept.abort();
    http.abort();
    persister.abort();
    let sk2 = sk.clone();
    tokio::task::spawn_blocking(move || sk2.persist_lazy_state()).await?;
    result
}
