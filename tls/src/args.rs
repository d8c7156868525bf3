//! The command-line flags every service takes, to `#[command(flatten)]` into its parser.
//! TLS is never off by accident: a server needs `--tls-cert` and `--tls-key`, a client
//! `--tls-ca`, or either `--no-tls`; neither is an error at startup.

use std::path::PathBuf;

use anyhow::{bail, Result};

use crate::{ClientTls, ServerTls, Tls};

const SERVER_NEEDS: &str =
    "give --tls-cert FILE and --tls-key FILE (fjord init makes them in REPO/tls/), or --no-tls to serve in cleartext";
const BOTH_NEED: &str = "give --tls-cert FILE, --tls-key FILE and --tls-ca FILE (fjord init makes them in REPO/tls/), or --no-tls to serve and connect in cleartext";
const CLIENT_NEEDS: &str = "give --tls-ca FILE (the cluster CA, REPO/tls/ca.crt), or --no-tls to connect in cleartext";

/// A server's flags: its certificate and key, or `--no-tls`.
#[derive(clap::Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerArgs {
    /// This service's TLS certificate (PEM; reloaded when the file changes).
    #[arg(long, value_name = "FILE", requires = "tls_key", conflicts_with = "no_tls")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert", conflicts_with = "no_tls")]
    pub tls_key: Option<PathBuf>,
    /// Serve without TLS (tests and trusted networks only).
    #[arg(long)]
    pub no_tls: bool,
}

/// A client's flags: the cluster CA, or `--no-tls`.
#[derive(clap::Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientArgs {
    /// The cluster CA's certificate (PEM): servers must present a certificate it signed.
    #[arg(long, value_name = "FILE", conflicts_with = "no_tls")]
    pub tls_ca: Option<PathBuf>,
    /// Connect without TLS (tests and trusted networks only).
    #[arg(long)]
    pub no_tls: bool,
}

/// The flags of a service that serves and also calls other services (the pageserver,
/// a client of the safekeepers): its certificate and key and the cluster CA, or one
/// `--no-tls` for both sides.
#[derive(clap::Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerClientArgs {
    /// This service's TLS certificate (PEM; reloaded when the file changes).
    #[arg(long, value_name = "FILE", requires_all = ["tls_key", "tls_ca"], conflicts_with = "no_tls")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert", conflicts_with = "no_tls")]
    pub tls_key: Option<PathBuf>,
    /// The cluster CA's certificate (PEM): the services this one calls must present a
    /// certificate it signed.
    #[arg(long, value_name = "FILE", requires = "tls_cert", conflicts_with = "no_tls")]
    pub tls_ca: Option<PathBuf>,
    /// Serve and connect without TLS (tests and trusted networks only).
    #[arg(long)]
    pub no_tls: bool,
}

fn server(cert: &Option<PathBuf>, key: &Option<PathBuf>, no_tls: bool) -> Result<Option<ServerTls>> {
    match (cert, key, no_tls) {
        (None, None, true) => Ok(None),
        (Some(cert), Some(key), false) => Ok(Some(ServerTls::load(cert, key)?)),
        (None, None, false) => bail!("TLS is required: {SERVER_NEEDS}"),
        (Some(_), None, _) | (None, Some(_), _) => bail!("--tls-cert and --tls-key go together: {SERVER_NEEDS}"),
        (Some(_), Some(_), true) => bail!("--no-tls conflicts with --tls-cert and --tls-key: {SERVER_NEEDS}"),
    }
}

fn client(ca: &Option<PathBuf>, no_tls: bool) -> Result<Option<ClientTls>> {
    match (ca, no_tls) {
        (None, true) => Ok(None),
        (Some(ca), false) => Ok(Some(ClientTls::load(ca)?)),
        (None, false) => bail!("TLS is required: {CLIENT_NEEDS}"),
        (Some(_), true) => bail!("--no-tls conflicts with --tls-ca: {CLIENT_NEEDS}"),
    }
}

impl ServerArgs {
    /// The server's TLS, or `None` with `--no-tls`; an error if neither was given or a
    /// file does not load. It does not start the reloader.
    pub fn load(&self) -> Result<Option<ServerTls>> {
        server(&self.tls_cert, &self.tls_key, self.no_tls)
    }

    /// The same flags as arguments for a child process.
    pub fn to_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if self.no_tls {
            args.push("--no-tls".to_string());
        }
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            args.extend(["--tls-cert".to_string(), cert.display().to_string()]);
            args.extend(["--tls-key".to_string(), key.display().to_string()]);
        }
        args
    }
}

impl ClientArgs {
    /// The client's TLS, or `None` with `--no-tls`; an error if neither was given or the
    /// file does not load.
    pub fn load(&self) -> Result<Option<ClientTls>> {
        client(&self.tls_ca, self.no_tls)
    }

    /// The same flags as arguments for a child process.
    pub fn to_args(&self) -> Vec<String> {
        match (&self.tls_ca, self.no_tls) {
            (Some(ca), false) => vec!["--tls-ca".to_string(), ca.display().to_string()],
            _ => vec!["--no-tls".to_string()],
        }
    }
}

impl ServerClientArgs {
    /// Both sides' TLS, or neither with `--no-tls`.
    pub fn load(&self) -> Result<Tls> {
        if self.no_tls && self.tls_cert.is_none() && self.tls_key.is_none() && self.tls_ca.is_none() {
            return Ok(Tls::default());
        }
        if !self.no_tls && self.tls_ca.is_none() {
            bail!("TLS is required: {BOTH_NEED}");
        }
        let server = server(&self.tls_cert, &self.tls_key, self.no_tls)?;
        let client = client(&self.tls_ca, self.no_tls)?;
        Ok(Tls { server, client })
    }

    /// The same flags as arguments for a child process.
    pub fn to_args(&self) -> Vec<String> {
        let mut args = ServerArgs { tls_cert: self.tls_cert.clone(), tls_key: self.tls_key.clone(), no_tls: self.no_tls }.to_args();
        if let (Some(ca), false) = (&self.tls_ca, self.no_tls) {
            args.extend(["--tls-ca".to_string(), ca.display().to_string()]);
        }
        args
    }
}
