//! fjord's TLS, one crate for every link: the configurations a server and a client use
//! (rustls on aws-lc-rs), blocking handshakes for the std-thread servers and clients with
//! errors a user can read, certificate reloading and expiry, PostgreSQL's `SSLRequest`,
//! the cluster CA that `fjord init` makes, and the command-line flags every service
//! takes. A client trusts exactly the cluster CA's file, never the system's roots, and
//! checks that the server's certificate names the host or address it dialled.
//!
//! Tokio servers wrap [`ServerTls::config`] in `tokio_rustls::TlsAcceptor`; the
//! resolver behind it hands every new handshake the current certificate, so a reload
//! reaches them too.

pub mod args;
pub mod ca;
mod client;
mod detect;
mod files;
#[cfg(feature = "http")]
pub mod http;
pub mod pg;
mod server;

pub use client::{ClientStream, ClientTls, ConnectError};
pub use detect::looks_like_tls;
pub use rustls;
pub use server::{accept, accept_or_plaintext, AcceptError, Accepted, ServerStream, ServerTls, EXPIRY_METRIC};

/// When the (first) certificate in a PEM file expires.
pub fn cert_not_after(path: &std::path::Path) -> anyhow::Result<std::time::SystemTime> {
    let certs = files::read_certs(path)?;
    let secs = server::not_after_of(&certs[0])?;
    Ok(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs.max(0) as u64))
}

/// A service's TLS on both sides, for configurations that carry it: its server
/// certificate (`None`: it serves in cleartext) and its trust in the cluster CA for the
/// services it calls (`None`: it calls them in cleartext). Equal when loaded from the
/// same files.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tls {
    pub server: Option<ServerTls>,
    pub client: Option<ClientTls>,
}

#[cfg(test)]
mod tests;
