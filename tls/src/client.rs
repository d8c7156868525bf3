//! The client side: trust in exactly the cluster CA's file, and a blocking handshake
//! whose errors say what is wrong in words a user can act on.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use rustls::pki_types::ServerName;
use rustls::{CertificateError, ClientConfig, ClientConnection, RootCertStore};

use crate::files::{provider, read_certs};
use crate::server::{is_timeout, restore, set_handshake_timeouts, HANDSHAKE_TIMEOUT};

/// A TLS connection a client made.
pub type ClientStream = rustls::StreamOwned<ClientConnection, TcpStream>;

/// Trust in the cluster CA: a cheap `Clone` handle.
#[derive(Clone)]
pub struct ClientTls {
    ca_path: PathBuf,
    config: Arc<ClientConfig>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls").field("ca", &self.ca_path).finish_non_exhaustive()
    }
}

impl PartialEq for ClientTls {
    fn eq(&self, other: &ClientTls) -> bool {
        self.ca_path == other.ca_path
    }
}

/// Why a TLS connection could not be made. The address is the server's; callers add
/// which service it is (`.context("connect to the pageserver")`).
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("the server at {addr} presented a certificate for another host: it names {presented}, not {host}")]
    WrongHost { addr: String, host: String, presented: String },
    #[error("the server at {addr} presented a certificate that is not signed by the cluster CA (--tls-ca {ca})")]
    UnknownCa { addr: String, ca: String },
    #[error("the server at {addr} presented a certificate that has expired or is not valid yet")]
    Expired { addr: String },
    #[error("the server at {addr} does not speak TLS: {detail}")]
    NotTls { addr: String, detail: String },
    #[error("the server at {addr} refused the TLS handshake: {source}")]
    Refused { addr: String, source: rustls::Error },
    #[error("the TLS handshake with the server at {addr} failed: {source}")]
    Handshake { addr: String, source: rustls::Error },
    #[error("the TLS handshake with the server at {addr} failed: {source}")]
    Io { addr: String, source: io::Error },
    #[error("{host:?} is not a host name or IP address a certificate can name")]
    InvalidHost { host: String },
}

impl ConnectError {
    /// Whether trying again later can help: the server was unreachable, slow or went
    /// away, not a certificate or protocol that is wrong and stays wrong.
    pub fn is_transient(&self) -> bool {
        matches!(self, ConnectError::Io { .. })
    }
}

impl ClientTls {
    /// Loads the CA certificate(s) in `ca` (PEM); servers are trusted only if one of them
    /// signed their certificate (never the system's roots).
    pub fn load(ca: &Path) -> Result<ClientTls> {
        let certs = read_certs(ca)?;
        let mut roots = RootCertStore::empty();
        for cert in certs {
            roots.add(cert).with_context(|| format!("{}: a certificate in it is no CA certificate rustls can use", ca.display()))?;
        }
        let config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .context("set the TLS protocol versions")?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(ClientTls { ca_path: ca.to_path_buf(), config: Arc::new(config) })
    }

    /// The configuration: for clients that make their own connections (tokio, ureq).
    pub fn config(&self) -> Arc<ClientConfig> {
        self.config.clone()
    }

    pub fn ca_path(&self) -> &Path {
        &self.ca_path
    }

    /// The server name rustls checks the certificate against: `host` is the name or IP
    /// address the client dialled (an IPv6 address may be in brackets).
    pub fn server_name(host: &str) -> Result<ServerName<'static>, ConnectError> {
        let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        ServerName::try_from(bare.to_string()).map_err(|_| ConnectError::InvalidHost { host: host.to_string() })
    }

    /// Makes a TLS connection over `tcp` with a blocking handshake (at most 10 s on a
    /// socket without timeouts of its own). The server's certificate must be signed by
    /// the CA and name `host`, the name or address the client dialled.
    pub fn connect(&self, tcp: TcpStream, host: &str) -> Result<ClientStream, ConnectError> {
        let name = Self::server_name(host)?;
        let addr = tcp.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| host.to_string());
        let io_err = |source| ConnectError::Io { addr: addr.clone(), source };
        let saved = set_handshake_timeouts(&tcp).map_err(io_err)?;
        let mut conn =
            ClientConnection::new(self.config.clone(), name).map_err(|source| ConnectError::Handshake { addr: addr.clone(), source })?;
        let mut recorder = Recorder { tcp, first: Vec::new() };
        while conn.is_handshaking() {
            if let Err(e) = conn.complete_io(&mut recorder) {
                return Err(self.explain(e, &addr, host, &recorder.first));
            }
        }
        while conn.wants_write() {
            if let Err(e) = conn.write_tls(&mut recorder) {
                return Err(self.explain(e, &addr, host, &recorder.first));
            }
        }
        restore(&recorder.tcp, saved).map_err(|source| ConnectError::Io { addr: addr.clone(), source })?;
        Ok(rustls::StreamOwned::new(conn, recorder.tcp))
    }

    fn explain(&self, e: io::Error, addr: &str, host: &str, first: &[u8]) -> ConnectError {
        let addr = addr.to_string();
        // A server that says nothing, or closes before its first byte, may be busy or
        // restarting: that is worth another try (`Io`). Only one that answered something
        // other than TLS is known not to speak it.
        if is_timeout(&e) && first.is_empty() {
            let source =
                io::Error::new(io::ErrorKind::TimedOut, format!("no answer to the TLS handshake within {} s", HANDSHAKE_TIMEOUT.as_secs()));
            return ConnectError::Io { addr, source };
        }
        if (e.kind() == io::ErrorKind::UnexpectedEof || e.kind() == io::ErrorKind::ConnectionReset) && first.is_empty() {
            let source = io::Error::new(e.kind(), "the server closed the connection before answering the TLS handshake");
            return ConnectError::Io { addr, source };
        }
        if is_timeout(&e) || e.kind() == io::ErrorKind::UnexpectedEof || e.kind() == io::ErrorKind::ConnectionReset {
            return ConnectError::NotTls { addr, detail: format!("it closed the connection after answering {}", show(first)) };
        }
        let Some(source) = e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()).cloned() else {
            return ConnectError::Io { addr, source: e };
        };
        match &source {
            rustls::Error::InvalidCertificate(cert) => match cert {
                CertificateError::NotValidForName => {
                    ConnectError::WrongHost { addr, host: host.to_string(), presented: "other names".to_string() }
                }
                CertificateError::NotValidForNameContext { presented, .. } => ConnectError::WrongHost {
                    addr,
                    host: host.to_string(),
                    presented: if presented.is_empty() { "no host".to_string() } else { presented.join(", ") },
                },
                CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                    ConnectError::UnknownCa { addr, ca: self.ca_path.display().to_string() }
                }
                CertificateError::Expired
                | CertificateError::ExpiredContext { .. }
                | CertificateError::NotValidYet
                | CertificateError::NotValidYetContext { .. } => ConnectError::Expired { addr },
                _ => ConnectError::Handshake { addr, source },
            },
            rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => ConnectError::NotTls {
                addr,
                detail: if first.is_empty() {
                    "it answered with no TLS record".to_string()
                } else {
                    format!("it answered {}", show(first))
                },
            },
            rustls::Error::AlertReceived(_) => ConnectError::Refused { addr, source },
            _ => ConnectError::Handshake { addr, source },
        }
    }
}

/// The first bytes a server answered, for an error message: text if they are text.
fn show(first: &[u8]) -> String {
    let text: String = first.iter().take(48).map(|&b| if (0x20..0x7f).contains(&b) { b as char } else { '.' }).collect();
    format!("{:?}", text.trim_end_matches('.'))
}

/// The socket under a client's handshake, keeping the first bytes the server sent.
struct Recorder {
    tcp: TcpStream,
    first: Vec<u8>,
}

impl Read for Recorder {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.tcp.read(buf)?;
        let room = 64usize.saturating_sub(self.first.len());
        self.first.extend_from_slice(&buf[..n.min(room)]);
        Ok(n)
    }
}

impl Write for Recorder {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.tcp.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.tcp.flush()
    }
}
