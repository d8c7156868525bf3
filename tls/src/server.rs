//! The server side: a certificate and key loaded from files and reloaded when they
//! change, the configuration whose resolver hands every new handshake the current pair,
//! and the blocking handshake of the std-thread servers.

use std::io;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, Context, Result};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ServerConfig, ServerConnection};

use crate::detect::looks_like_tls;
use crate::files::{certs_from_pem, key_from_pem, provider};

/// The name of the metric [`ServerTls::metrics_text`] writes.
pub const EXPIRY_METRIC: &str = "fjord_tls_certificate_expiry_timestamp_seconds";

/// A certificate expiring sooner than this is logged at WARN (at load, then hourly).
const WARN_BEFORE_EXPIRY: Duration = Duration::from_secs(30 * 24 * 3600);
const WARN_EVERY: Duration = Duration::from_secs(3600);
/// How often the reloader looks at the files.
const RELOAD_CHECK_EVERY: Duration = Duration::from_secs(1);
/// How long a handshake may take before the peer counts as gone (or not speaking TLS).
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A TLS connection a server accepted.
pub type ServerStream = rustls::StreamOwned<ServerConnection, TcpStream>;

/// One loaded certificate and key, with the file contents they came from.
struct Loaded {
    key: Arc<CertifiedKey>,
    not_after: i64,
    cert_bytes: Vec<u8>,
    key_bytes: Vec<u8>,
}

/// What the configuration's resolver and the handle share: the current pair.
type Current = Arc<RwLock<Arc<Loaded>>>;

#[derive(Debug)]
struct Resolver(Current);

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loaded").field("not_after", &self.not_after).finish_non_exhaustive()
    }
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().unwrap().key.clone())
    }
}

struct Inner {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: Current,
    config: Arc<ServerConfig>,
}

/// A service's certificate and key: a cheap `Clone` handle. [`ServerTls::config`] is the
/// rustls configuration for every listener of the service; [`ServerTls::start_reloader`]
/// makes it follow the files.
#[derive(Clone)]
pub struct ServerTls {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").field("cert", &self.inner.cert_path).field("key", &self.inner.key_path).finish_non_exhaustive()
    }
}

impl PartialEq for ServerTls {
    fn eq(&self, other: &ServerTls) -> bool {
        self.inner.cert_path == other.inner.cert_path && self.inner.key_path == other.inner.key_path
    }
}

/// What one look at the files found.
enum Reload {
    Unchanged,
    Reloaded,
    Failed { error: anyhow::Error, contents: (Vec<u8>, Vec<u8>) },
}

fn load_pair(cert_path: &Path, key_path: &Path, cert_bytes: Vec<u8>, key_bytes: Vec<u8>) -> Result<Loaded> {
    // Parsed from the bytes already read, so that the pair compared on the next look and
    // the pair loaded are the same, whatever a writer does to the files meanwhile.
    let certs = certs_from_pem(cert_path, &cert_bytes)?;
    let key = key_from_pem(key_path, &key_bytes)?;
    let not_after = not_after_of(&certs[0]).with_context(|| format!("read the expiry of {}", cert_path.display()))?;
    let key = CertifiedKey::from_der(certs, key, &provider()).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => {
            anyhow!("the private key {} does not belong to the certificate {}", key_path.display(), cert_path.display())
        }
        e => anyhow!("load the private key {}: {e}", key_path.display()),
    })?;
    Ok(Loaded { key: Arc::new(key), not_after, cert_bytes, key_bytes })
}

/// A certificate's not_after, in seconds since the Unix epoch.
pub(crate) fn not_after_of(cert: &[u8]) -> Result<i64> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert).map_err(|e| anyhow!("parse the certificate: {e}"))?;
    Ok(parsed.validity().not_after.timestamp())
}

fn read_both(cert_path: &Path, key_path: &Path) -> Result<(Vec<u8>, Vec<u8>)> {
    let cert = std::fs::read(cert_path).with_context(|| format!("read certificate file {}", cert_path.display()))?;
    let key = std::fs::read(key_path).with_context(|| format!("read private key file {}", key_path.display()))?;
    Ok((cert, key))
}

fn now_unix() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

impl ServerTls {
    /// Loads a certificate (PEM, the service's own first, then any intermediates) and its
    /// private key; an error names the file and what is wrong with it, and a key that does
    /// not belong to the certificate is an error.
    pub fn load(cert: &Path, key: &Path) -> Result<ServerTls> {
        let (cert_bytes, key_bytes) = read_both(cert, key)?;
        let loaded = load_pair(cert, key, cert_bytes, key_bytes)?;
        let current: Current = Arc::new(RwLock::new(Arc::new(loaded)));
        let config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .context("set the TLS protocol versions")?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(Resolver(current.clone())));
        let tls = ServerTls {
            inner: Arc::new(Inner { cert_path: cert.to_path_buf(), key_path: key.to_path_buf(), current, config: Arc::new(config) }),
        };
        tls.warn_if_expiring();
        Ok(tls)
    }

    /// The configuration for every listener: its resolver hands each new handshake the
    /// current certificate, so a reload never needs a new configuration and never
    /// touches an established connection.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.inner.config.clone()
    }

    pub fn cert_path(&self) -> &Path {
        &self.inner.cert_path
    }

    pub fn key_path(&self) -> &Path {
        &self.inner.key_path
    }

    /// When the current certificate expires.
    pub fn not_after(&self) -> SystemTime {
        let secs = self.inner.current.read().unwrap().not_after;
        if secs >= 0 {
            UNIX_EPOCH + Duration::from_secs(secs as u64)
        } else {
            UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
        }
    }

    /// The current certificate's expiry as Prometheus text (one gauge, Unix seconds),
    /// for the service's `/metrics`.
    pub fn metrics_text(&self) -> String {
        let secs = self.inner.current.read().unwrap().not_after;
        format!(
            "# HELP {EXPIRY_METRIC} When the service's TLS certificate expires (its not_after, seconds since the Unix epoch).\n\
             # TYPE {EXPIRY_METRIC} gauge\n\
             {EXPIRY_METRIC} {secs}\n"
        )
    }

    /// Loads the files again if their contents changed. `Ok(true)` when a new pair is in
    /// place (new handshakes get it), `Ok(false)` when nothing changed; an error (a file
    /// missing or malformed, a key that does not match) keeps the current pair.
    pub fn reload(&self) -> Result<bool> {
        match self.check() {
            Reload::Unchanged => Ok(false),
            Reload::Reloaded => Ok(true),
            Reload::Failed { error, .. } => Err(error),
        }
    }

    fn check(&self) -> Reload {
        let inner = &self.inner;
        let (cert_bytes, key_bytes) = match read_both(&inner.cert_path, &inner.key_path) {
            Ok(both) => both,
            Err(error) => return Reload::Failed { error, contents: (Vec::new(), Vec::new()) },
        };
        {
            let current = inner.current.read().unwrap();
            if current.cert_bytes == cert_bytes && current.key_bytes == key_bytes {
                return Reload::Unchanged;
            }
        }
        let contents = (cert_bytes.clone(), key_bytes.clone());
        match load_pair(&inner.cert_path, &inner.key_path, cert_bytes, key_bytes) {
            Ok(loaded) => {
                let not_after = loaded.not_after;
                *inner.current.write().unwrap() = Arc::new(loaded);
                tracing::info!(
                    "reloaded the TLS certificate {} and key {}: new connections get it (expires at {})",
                    inner.cert_path.display(),
                    inner.key_path.display(),
                    format_unix(not_after)
                );
                self.warn_if_expiring();
                Reload::Reloaded
            }
            Err(error) => Reload::Failed { error, contents },
        }
    }

    /// Logs a WARN if the current certificate expires within 30 days (or has expired).
    fn warn_if_expiring(&self) {
        let not_after = self.inner.current.read().unwrap().not_after;
        let left = not_after - now_unix();
        if left < 0 {
            tracing::warn!(
                "the TLS certificate {} expired at {}: clients refuse it; replace it (the service reloads it)",
                self.inner.cert_path.display(),
                format_unix(not_after)
            );
        } else if left < WARN_BEFORE_EXPIRY.as_secs() as i64 {
            tracing::warn!(
                "the TLS certificate {} expires in {} days (at {}): replace it before then (the service reloads it)",
                self.inner.cert_path.display(),
                left / 86400,
                format_unix(not_after)
            );
        }
    }

    /// Starts one thread that looks at the files about once a second and reloads them on
    /// a change, and logs the expiry warning hourly. A pair that does not load is logged
    /// once it has stayed so for two looks (a writer replacing the certificate, then the
    /// key, is not an error), and the current pair is kept. The thread ends once every
    /// handle is dropped.
    pub fn start_reloader(&self) -> std::thread::JoinHandle<()> {
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        std::thread::Builder::new().name("tls-reloader".to_string()).spawn(move || reloader(weak)).expect("spawn the TLS reloader thread")
    }
}

fn reloader(weak: Weak<Inner>) {
    let mut last_failed: Option<(Vec<u8>, Vec<u8>)> = None;
    let mut logged = false;
    let mut last_warned = Instant::now();
    loop {
        std::thread::sleep(RELOAD_CHECK_EVERY);
        let Some(inner) = weak.upgrade() else { return };
        let tls = ServerTls { inner };
        match tls.check() {
            Reload::Unchanged | Reload::Reloaded => {
                last_failed = None;
                logged = false;
            }
            Reload::Failed { error, contents } => {
                if last_failed.as_ref() == Some(&contents) {
                    if !logged {
                        tracing::warn!("{error:#}: keeping the TLS certificate loaded before");
                        logged = true;
                    }
                } else {
                    last_failed = Some(contents);
                    logged = false;
                }
            }
        }
        if last_warned.elapsed() >= WARN_EVERY {
            last_warned = Instant::now();
            tls.warn_if_expiring();
        }
    }
}

fn format_unix(secs: i64) -> String {
    match time::OffsetDateTime::from_unix_timestamp(secs) {
        Ok(t) => {
            let f = time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second] UTC");
            t.format(&f).unwrap_or_else(|_| secs.to_string())
        }
        Err(_) => secs.to_string(),
    }
}

/// What a server that requires TLS got from a new connection.
#[derive(Debug)]
pub enum Accepted {
    Tls(Box<ServerStream>),
    /// The client's first bytes are no TLS ClientHello; nothing was read from the stream,
    /// so the server can answer in the client's own protocol.
    Plaintext(TcpStream),
}

#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    #[error("the client at {peer} does not speak TLS")]
    NotTls { peer: String },
    #[error("the client at {peer} closed the connection during the TLS handshake")]
    Closed { peer: String },
    #[error("the client at {peer} did not finish the TLS handshake within {} s", HANDSHAKE_TIMEOUT.as_secs())]
    Timeout { peer: String },
    #[error("the TLS handshake with the client at {peer} failed: {source}")]
    Handshake { peer: String, source: rustls::Error },
    #[error("the TLS handshake with the client at {peer} failed: {source}")]
    Io { peer: String, source: io::Error },
}

fn peer_of(tcp: &TcpStream) -> String {
    tcp.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "(unknown address)".to_string())
}

/// Sets a handshake timeout on a socket that has none; returns what to restore.
pub(crate) fn set_handshake_timeouts(tcp: &TcpStream) -> io::Result<(Option<Duration>, Option<Duration>)> {
    let saved = (tcp.read_timeout()?, tcp.write_timeout()?);
    if saved.0.is_none() {
        tcp.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    }
    if saved.1.is_none() {
        tcp.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
    }
    Ok(saved)
}

pub(crate) fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

/// Accepts a TLS connection with a blocking handshake (at most 10 s, on sockets without
/// timeouts of their own; run it on the connection's thread, not the accept loop). A
/// plaintext client is an [`AcceptError::NotTls`]; to answer one in its own protocol, use
/// [`accept_or_plaintext`].
pub fn accept(config: Arc<ServerConfig>, tcp: TcpStream) -> Result<ServerStream, AcceptError> {
    let peer = peer_of(&tcp);
    match accept_or_plaintext(config, tcp)? {
        Accepted::Tls(stream) => Ok(*stream),
        Accepted::Plaintext(_) => Err(AcceptError::NotTls { peer }),
    }
}

/// Like [`accept`], but a client whose first bytes are no TLS ClientHello comes back as
/// [`Accepted::Plaintext`] with nothing read, for an error in its own protocol.
pub fn accept_or_plaintext(config: Arc<ServerConfig>, tcp: TcpStream) -> Result<Accepted, AcceptError> {
    let peer = peer_of(&tcp);
    let saved = set_handshake_timeouts(&tcp).map_err(|source| AcceptError::Io { peer: peer.clone(), source })?;
    let mut first = [0u8; 3];
    let n = match tcp.peek(&mut first) {
        Ok(0) => return Err(AcceptError::Closed { peer }),
        Ok(n) => n,
        Err(e) if is_timeout(&e) => return Err(AcceptError::Timeout { peer }),
        Err(source) => return Err(AcceptError::Io { peer, source }),
    };
    if !looks_like_tls(&first[..n]) {
        restore(&tcp, saved).map_err(|source| AcceptError::Io { peer: peer.clone(), source })?;
        return Ok(Accepted::Plaintext(tcp));
    }
    let stream = handshake_server(config, tcp, &peer)?;
    restore(&stream.sock, saved).map_err(|source| AcceptError::Io { peer, source })?;
    Ok(Accepted::Tls(Box::new(stream)))
}

pub(crate) fn handshake_server(config: Arc<ServerConfig>, mut tcp: TcpStream, peer: &str) -> Result<ServerStream, AcceptError> {
    let mut conn = ServerConnection::new(config).map_err(|source| AcceptError::Handshake { peer: peer.to_string(), source })?;
    while conn.is_handshaking() {
        if let Err(e) = conn.complete_io(&mut tcp) {
            return Err(server_io_error(peer, e));
        }
    }
    while conn.wants_write() {
        conn.write_tls(&mut tcp).map_err(|e| server_io_error(peer, e))?;
    }
    Ok(rustls::StreamOwned::new(conn, tcp))
}

fn server_io_error(peer: &str, e: io::Error) -> AcceptError {
    let peer = peer.to_string();
    if is_timeout(&e) {
        return AcceptError::Timeout { peer };
    }
    if e.kind() == io::ErrorKind::UnexpectedEof {
        return AcceptError::Closed { peer };
    }
    match e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
        Some(source) => AcceptError::Handshake { peer, source: source.clone() },
        None => AcceptError::Io { peer, source: e },
    }
}

pub(crate) fn restore(tcp: &TcpStream, saved: (Option<Duration>, Option<Duration>)) -> io::Result<()> {
    tcp.set_read_timeout(saved.0)?;
    tcp.set_write_timeout(saved.1)
}
