//! The cluster CA: a self-signed CA certificate and key (`ca.crt`, `ca.key`), and the
//! service certificates it signs, each naming the hosts and addresses clients dial.
//! Keys are ECDSA P-256. A private key is written mode 0600, and no file here is ever
//! overwritten: an existing file is an error, and nothing is written then.

use std::fs::OpenOptions;
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use time::OffsetDateTime;

/// The CA's file names in a directory.
pub const CA_CERT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";

/// How long a CA is valid.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// How long a service certificate is valid unless asked otherwise.
pub const SERVICE_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

/// A CA that can sign: its certificate and key.
pub struct Ca {
    cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its private key, in PEM.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

fn serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    // A positive integer: the top bit clear.
    bytes[0] &= 0x7f;
    SerialNumber::from_slice(&bytes)
}

fn validity(params: &mut CertificateParams, valid_for: Duration) {
    let now = OffsetDateTime::now_utc();
    // An hour back, so that a host whose clock is a little behind accepts it at once.
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::seconds(valid_for.as_secs() as i64);
}

impl Ca {
    /// A new CA, in memory. Its name carries a random suffix, so that two clusters' CAs
    /// never share a name (a certificate of one is then plainly "not signed by" the
    /// other, not a bad signature under a familiar name).
    pub fn generate() -> Result<Ca> {
        let key = KeyPair::generate().context("generate the CA key")?;
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        let suffix: u32 = rand::random();
        params.distinguished_name.push(DnType::CommonName, format!("fjord cluster CA {suffix:08x}"));
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        params.serial_number = Some(serial());
        validity(&mut params, CA_VALIDITY);
        let cert = params.self_signed(&key).context("sign the CA certificate")?;
        Ok(Ca { cert_pem: cert.pem(), issuer: Issuer::new(params, key) })
    }

    /// Makes a new CA and writes `dir/ca.crt` and `dir/ca.key` (0600), creating `dir`;
    /// an existing file is an error and nothing is written.
    pub fn create(dir: &Path) -> Result<Ca> {
        let ca = Ca::generate()?;
        write_new_pair(&dir.join(CA_CERT), &ca.cert_pem, &dir.join(CA_KEY), &ca.issuer.key().serialize_pem())?;
        Ok(ca)
    }

    /// Loads a CA from its certificate and key files (PEM).
    pub fn load(cert: &Path, key: &Path) -> Result<Ca> {
        let cert_pem = std::fs::read_to_string(cert).with_context(|| format!("read the CA certificate {}", cert.display()))?;
        let key_pem = std::fs::read_to_string(key).with_context(|| format!("read the CA key {}", key.display()))?;
        let key = KeyPair::from_pem(&key_pem).map_err(|e| anyhow!("{}: not a PEM private key: {e}", key.display()))?;
        let issuer = Issuer::from_ca_cert_pem(&cert_pem, key).map_err(|e| anyhow!("{}: not a PEM CA certificate: {e}", cert.display()))?;
        Ok(Ca { cert_pem, issuer })
    }

    /// Loads `dir/ca.crt` and `dir/ca.key`.
    pub fn load_dir(dir: &Path) -> Result<Ca> {
        Ca::load(&dir.join(CA_CERT), &dir.join(CA_KEY))
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A service certificate for `name` (its common name) that names every host in
    /// `hosts` (DNS names, or IP addresses as IP address SANs), valid for `valid_for`,
    /// for TLS servers and clients alike, with a new key.
    pub fn issue(&self, name: &str, hosts: &[String], valid_for: Duration) -> Result<Issued> {
        if hosts.is_empty() {
            bail!("a certificate for {name:?} needs at least one host name or IP address");
        }
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.subject_alt_names = hosts.iter().map(|h| san(h)).collect::<Result<_>>()?;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        params.serial_number = Some(serial());
        validity(&mut params, valid_for);
        let key = KeyPair::generate().context("generate a service key")?;
        let cert = params.signed_by(&key, &self.issuer).with_context(|| format!("sign the certificate for {name:?}"))?;
        Ok(Issued { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }

    /// [`Ca::issue`], written to `cert` and `key` (0600); an existing file is an error
    /// and nothing is written.
    pub fn issue_to_files(&self, name: &str, hosts: &[String], valid_for: Duration, cert: &Path, key: &Path) -> Result<()> {
        let issued = self.issue(name, hosts, valid_for)?;
        write_new_pair(cert, &issued.cert_pem, key, &issued.key_pem)
    }
}

/// A SAN for a host: an IP address if it parses as one (brackets allowed), else a DNS name.
fn san(host: &str) -> Result<SanType> {
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(SanType::IpAddress(ip));
    }
    let name = bare.try_into().map_err(|e| anyhow!("{host:?} is not a host name or IP address: {e}"))?;
    Ok(SanType::DnsName(name))
}

/// Writes a new certificate (0644) and key (0600), neither of which may exist; each is
/// fsynced, then its directory.
pub fn write_new_pair(cert: &Path, cert_pem: &str, key: &Path, key_pem: &str) -> Result<()> {
    for path in [cert, key] {
        if path.exists() {
            bail!("{} already exists: it is never overwritten (move it away first to replace it)", path.display());
        }
    }
    for path in [cert, key] {
        if let Some(dir) = parent(path) {
            std::fs::create_dir_all(&dir).with_context(|| format!("create directory {}", dir.display()))?;
        }
    }
    write_new(cert, cert_pem.as_bytes(), 0o644)?;
    write_new(key, key_pem.as_bytes(), 0o600)?;
    for path in [cert, key] {
        if let Some(dir) = parent(path) {
            crashsafe::fsync_dir(&dir).with_context(|| format!("fsync directory {}", dir.display()))?;
        }
    }
    Ok(())
}

fn parent(path: &Path) -> Option<PathBuf> {
    path.parent().filter(|p| !p.as_os_str().is_empty()).map(Path::to_path_buf)
}

fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let mut file =
        OpenOptions::new().write(true).create_new(true).mode(mode).open(path).with_context(|| format!("create {}", path.display()))?;
    file.write_all(bytes).with_context(|| format!("write {}", path.display()))?;
    file.sync_all().with_context(|| format!("fsync {}", path.display()))?;
    Ok(())
}
