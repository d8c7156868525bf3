//! Reading PEM files and the crypto provider every configuration uses.

use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// aws-lc-rs, the one crypto library in the tree.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Every certificate in a PEM file, in order; at least one.
pub(crate) fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let bytes = std::fs::read(path).with_context(|| format!("read certificate file {}", path.display()))?;
    certs_from_pem(path, &bytes)
}

/// Every certificate in the PEM text `bytes` read from `path`; at least one.
pub(crate) fn certs_from_pem(path: &Path, bytes: &[u8]) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("{}: not a PEM certificate file: {e}", path.display()))?;
    if certs.is_empty() {
        bail!("{}: holds no PEM certificate (BEGIN CERTIFICATE)", path.display());
    }
    Ok(certs)
}

/// The private key (PKCS#8, PKCS#1 or SEC1) in the PEM text `bytes` read from `path`.
pub(crate) fn key_from_pem(path: &Path, bytes: &[u8]) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_slice(bytes).map_err(|e| anyhow!("{}: holds no PEM private key: {e}", path.display()))
}
