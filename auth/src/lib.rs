//! Tenant-scoped tokens: who may talk to fjord's storage, and about which tenant.
//!
//! A token is a JWT signed with Ed25519 (`EdDSA`). `fjord init` generates the cluster's key
//! pair ([`generate_key_pair`]); the private key stays with the CLI, which signs tokens
//! ([`Signer`]); the pageserver and the safekeepers hold only the public key and check
//! every token they are given ([`Verifier`]). Nothing in this crate reads a socket: the
//! services take the token out of their own protocol (a `Hello` field, a password
//! message, an `Authorization: Bearer` header) and ask [`Verifier::authorize`] whether it
//! grants an [`Access`].
//!
//! Three scopes:
//! - `tenant`: a compute's token. Reads pages and basebackups of its tenant, proposes and
//!   streams its WAL, and uses the few management calls a compute makes (start a WAL
//!   receiver, lease an LSN, map a time to an LSN, list changed blocks). It may name a
//!   timeline too, and then grants that timeline only.
//! - `storage`: the pageserver's token for reading committed WAL from the safekeepers. It
//!   may name a tenant, or a tenant and a timeline, and then reads that WAL only: the
//!   token a pageserver's WAL receiver presents for one timeline is narrowed to it, so a
//!   source that is given it learns nothing it could use elsewhere. One that names no
//!   tenant but a `node_id` is a pageserver's own (`Claims::pageserver`): it also joins the
//!   storage controller as that node and asks it which tenants the node holds
//!   (`Access::Placement`), which no other token but an admin's may do for that node.
//!
//! Where a tenant is attached (`Access::Locate`) any token for the tenant may ask: a
//! compute follows its pageserver with its own token.
//! - `admin`: everything, including the management APIs (create, configure, collect).
//!
//! A token may carry `exp` (seconds since the epoch); an expired token is refused. Tokens
//! for computes carry none, like a password: a compute may run for months.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use proto::{TenantId, TimelineId};
use serde::{Deserialize, Serialize};

/// Where a client process (compute_ctl, the compute, the pageserver as a WAL reader)
/// finds its token.
pub const TOKEN_ENV: &str = proto::AUTH_TOKEN_ENV;
/// The private key's file name in a `fjord` repository.
pub const PRIVATE_KEY_FILE: &str = "auth_private_key.pem";
/// The public key's file name in a `fjord` repository.
pub const PUBLIC_KEY_FILE: &str = "auth_public_key.pem";
/// No token is longer: a longer one is refused before it is parsed.
pub const TOKEN_BYTES_MAX: usize = proto::pagestream::TOKEN_BYTES_MAX;
/// Clock difference tolerated when checking `exp`, in seconds.
const LEEWAY_SECONDS: u64 = 5;

/// What a token lets its holder do (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    Admin,
    Storage,
    Tenant,
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Scope::Admin => "admin",
            Scope::Storage => "storage",
            Scope::Tenant => "tenant",
        })
    }
}

/// A token's claims. `tenant_id` is required for the `tenant` scope, optional for
/// `storage` (it narrows the token to that tenant) and refused for `admin`; `timeline_id`
/// narrows a tenant or storage token that names a tenant to one timeline; `node_id` makes
/// a storage token for no tenant the token of one pageserver, the only one that may join
/// the storage controller as that node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub scope: Scope,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_id: Option<TenantId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline_id: Option<TimelineId>,
    /// Issued at, seconds since the epoch (informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iat: Option<u64>,
    /// Expires at, seconds since the epoch; none: does not expire.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exp: Option<u64>,
    /// The pageserver (storage controller node id) a storage token belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<u64>,
}

impl Claims {
    fn new(scope: Scope, tenant_id: Option<TenantId>) -> Claims {
        Claims { scope, tenant_id, timeline_id: None, iat: Some(now()), exp: None, node_id: None }
    }

    pub fn admin() -> Claims {
        Claims::new(Scope::Admin, None)
    }

    pub fn storage() -> Claims {
        Claims::new(Scope::Storage, None)
    }

    pub fn tenant(tenant: TenantId) -> Claims {
        Claims::new(Scope::Tenant, Some(tenant))
    }

    /// Pageserver `node`'s own token: a storage token for no tenant in particular that may
    /// also join the storage controller as that node.
    pub fn pageserver(node: u64) -> Claims {
        Claims { node_id: Some(node), ..Claims::storage() }
    }

    /// A storage token that reads the WAL of one tenant's timeline only.
    pub fn storage_for(tenant: TenantId, timeline: TimelineId) -> Claims {
        Claims::new(Scope::Storage, Some(tenant)).with_timeline(timeline)
    }

    /// Narrows a tenant (or tenant-narrowed storage) token to one timeline.
    pub fn with_timeline(mut self, timeline: TimelineId) -> Claims {
        self.timeline_id = Some(timeline);
        self
    }

    /// Makes the token expire `seconds` from now.
    pub fn expiring_in(mut self, seconds: u64) -> Claims {
        self.exp = Some(now().saturating_add(seconds));
        self
    }

    fn check_shape(&self) -> Result<(), AuthError> {
        match (self.scope, self.tenant_id, self.timeline_id) {
            (Scope::Tenant, None, _) => Err(AuthError::Malformed("a tenant token must name its tenant_id".into())),
            (Scope::Admin, Some(_), _) | (Scope::Admin, _, Some(_)) => {
                Err(AuthError::Malformed(format!("a {} token names no tenant or timeline", self.scope)))
            }
            (Scope::Storage, None, Some(_)) => {
                Err(AuthError::Malformed("a storage token that names a timeline must name its tenant_id".into()))
            }
            _ if self.node_id.is_some() && (self.scope != Scope::Storage || self.tenant_id.is_some()) => {
                Err(AuthError::Malformed("only a storage token for no tenant names a node_id".into()))
            }
            _ => Ok(()),
        }
    }
}

/// What a request needs a token for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// A management call: create, configure, collect, list. Admin only.
    Management,
    /// A compute's work on one tenant's timeline: pages, basebackups, proposing WAL, and
    /// the management calls a compute makes. Admin, or a tenant token for it.
    Compute { tenant: TenantId, timeline: Option<TimelineId> },
    /// Reading committed WAL: admin, storage, or a tenant token for it (a read replica).
    ReadWal { tenant: TenantId, timeline: TimelineId },
    /// Pageserver `node`'s calls to the storage controller (joining, asking what it
    /// holds): admin, or that pageserver's own token (storage, naming the node).
    Placement { node: u64 },
    /// Asking the storage controller where a tenant is (a compute following its pageserver):
    /// admin, storage, or a tenant token for it, narrowed to a timeline or not.
    Locate { tenant: TenantId },
}

impl std::fmt::Display for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Access::Management => f.write_str("use the management API"),
            Access::Compute { tenant, timeline: Some(timeline) } => write!(f, "use timeline {tenant}/{timeline}"),
            Access::Compute { tenant, timeline: None } => write!(f, "use tenant {tenant}"),
            Access::ReadWal { tenant, timeline } => write!(f, "read the WAL of {tenant}/{timeline}"),
            Access::Placement { node } => write!(f, "join the storage controller as pageserver {node}"),
            Access::Locate { tenant } => write!(f, "locate tenant {tenant}"),
        }
    }
}

/// Why a token was refused. `Display` is the message the client gets; [`AuthError::reason`]
/// is the metric label.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("authentication required: this server accepts only requests with a token signed by the cluster's key")]
    Missing,
    #[error("malformed token: {0}")]
    Malformed(String),
    #[error("the token's signature does not verify with this server's public key (a token from another cluster, or altered)")]
    BadSignature,
    #[error("the token expired")]
    Expired,
    #[error("a {scope} token may not {access}")]
    Forbidden { scope: Scope, access: String },
    #[error("the token is for tenant {token}: it may not {access}")]
    WrongTenant { token: TenantId, access: String },
    #[error("the token is for timeline {token}: it may not {access}")]
    WrongTimeline { token: TimelineId, access: String },
}

impl AuthError {
    /// A short label for metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            AuthError::Missing => "missing",
            AuthError::Malformed(_) => "malformed",
            AuthError::BadSignature => "bad_signature",
            AuthError::Expired => "expired",
            AuthError::Forbidden { .. } => "forbidden",
            AuthError::WrongTenant { .. } => "wrong_tenant",
            AuthError::WrongTimeline { .. } => "wrong_timeline",
        }
    }

    /// No valid token at all (HTTP 401, SQLSTATE 28P01), as opposed to a valid token that
    /// does not grant what was asked (403, 28000).
    pub fn is_unauthenticated(&self) -> bool {
        matches!(self, AuthError::Missing | AuthError::Malformed(_) | AuthError::BadSignature | AuthError::Expired)
    }

    /// Every label [`AuthError::reason`] returns, for metrics that list them all.
    pub const REASONS: [&'static str; 7] =
        ["missing", "malformed", "bad_signature", "expired", "forbidden", "wrong_tenant", "wrong_timeline"];
}

/// A problem with a key file.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("{path} already exists: fjord does not overwrite a key pair")]
    Exists { path: PathBuf },
    #[error("{path} is not an Ed25519 {what} key in PEM: {reason}")]
    Invalid { path: PathBuf, what: &'static str, reason: String },
    #[error("generate an Ed25519 key pair: {0}")]
    Generate(String),
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn read_key(path: &Path) -> Result<Vec<u8>, KeyError> {
    std::fs::read(path).map_err(|source| KeyError::Read { path: path.to_owned(), source })
}

/// Checks tokens with the cluster's public key.
#[derive(Clone)]
pub struct Verifier {
    key: DecodingKey,
    validation: Validation,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Verifier(Ed25519)")
    }
}

impl Verifier {
    /// Reads a PEM public key (`-----BEGIN PUBLIC KEY-----`, Ed25519).
    pub fn load(path: &Path) -> Result<Verifier, KeyError> {
        let pem = read_key(path)?;
        Verifier::from_pem(&pem).map_err(|reason| KeyError::Invalid { path: path.to_owned(), what: "public", reason: reason.to_string() })
    }

    pub fn from_pem(pem: &[u8]) -> Result<Verifier, jsonwebtoken::errors::Error> {
        let key = DecodingKey::from_ed_pem(pem)?;
        let mut validation = Validation::new(Algorithm::EdDSA);
        // `exp` is optional (see the module documentation); when present it is checked.
        validation.required_spec_claims.clear();
        validation.validate_exp = true;
        validation.leeway = LEEWAY_SECONDS;
        Ok(Verifier { key, validation })
    }

    /// Verifies a token's signature, expiry and shape, and returns its claims.
    pub fn verify(&self, token: &str) -> Result<Claims, AuthError> {
        if token.is_empty() {
            return Err(AuthError::Missing);
        }
        if token.len() > TOKEN_BYTES_MAX {
            return Err(AuthError::Malformed(format!("{} bytes, longer than the {TOKEN_BYTES_MAX} allowed", token.len())));
        }
        let data = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation).map_err(|e| match e.kind() {
            ErrorKind::InvalidSignature => AuthError::BadSignature,
            ErrorKind::ExpiredSignature => AuthError::Expired,
            ErrorKind::InvalidAlgorithm => AuthError::Malformed("not signed with EdDSA".into()),
            ErrorKind::ImmatureSignature => AuthError::Malformed("not valid yet (nbf)".into()),
            _ => AuthError::Malformed(e.to_string()),
        })?;
        data.claims.check_shape()?;
        Ok(data.claims)
    }

    /// Verifies `token` (None: the client sent none) and checks that it grants `access`.
    pub fn authorize(&self, token: Option<&str>, access: Access) -> Result<Claims, AuthError> {
        let claims = self.verify(token.unwrap_or(""))?;
        check_access(&claims, access)?;
        Ok(claims)
    }
}

/// Whether `claims` grant `access` (the rules are in the module documentation).
pub fn check_access(claims: &Claims, access: Access) -> Result<(), AuthError> {
    let forbidden = || AuthError::Forbidden { scope: claims.scope, access: access.to_string() };
    let (tenant, timeline) = match (claims.scope, access) {
        (Scope::Admin, _) => return Ok(()),
        (Scope::Storage, Access::Placement { node }) if claims.tenant_id.is_none() && claims.node_id == Some(node) => return Ok(()),
        (Scope::Storage, Access::ReadWal { .. } | Access::Locate { .. }) if claims.tenant_id.is_none() => return Ok(()),
        (Scope::Storage | Scope::Tenant, Access::Locate { tenant }) => (tenant, None),
        (Scope::Storage, Access::ReadWal { tenant, timeline }) => (tenant, Some(timeline)),
        (Scope::Storage, _) | (Scope::Tenant, Access::Management | Access::Placement { .. }) => return Err(forbidden()),
        (Scope::Tenant, Access::Compute { tenant, timeline }) => (tenant, timeline),
        (Scope::Tenant, Access::ReadWal { tenant, timeline }) => (tenant, Some(timeline)),
    };
    let token_tenant = claims.tenant_id.ok_or_else(forbidden)?;
    if token_tenant != tenant {
        return Err(AuthError::WrongTenant { token: token_tenant, access: access.to_string() });
    }
    match (claims.timeline_id, timeline) {
        // Where a tenant is, a token for any of its timelines may ask.
        _ if matches!(access, Access::Locate { .. }) => Ok(()),
        (Some(token), Some(wanted)) if token != wanted => Err(AuthError::WrongTimeline { token, access: access.to_string() }),
        // A timeline token grants nothing tenant-wide.
        (Some(token), None) => Err(AuthError::WrongTimeline { token, access: access.to_string() }),
        _ => Ok(()),
    }
}

/// The token in an HTTP `Authorization` header's value (`Bearer <token>`).
pub fn bearer(header: &str) -> Result<&str, AuthError> {
    let (scheme, token) =
        header.trim().split_once(' ').ok_or_else(|| AuthError::Malformed("the Authorization header is not 'Bearer <token>'".into()))?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(AuthError::Malformed(format!("the Authorization scheme is {scheme:?}, not Bearer")));
    }
    Ok(token.trim())
}

/// Signs tokens with the cluster's private key (the CLI's side).
pub struct Signer {
    key: EncodingKey,
}

impl Signer {
    /// Reads a PEM PKCS#8 private key (`-----BEGIN PRIVATE KEY-----`, Ed25519).
    pub fn load(path: &Path) -> Result<Signer, KeyError> {
        let pem = read_key(path)?;
        let key = EncodingKey::from_ed_pem(&pem).map_err(|e| KeyError::Invalid {
            path: path.to_owned(),
            what: "private",
            reason: e.to_string(),
        })?;
        Ok(Signer { key })
    }

    pub fn sign(&self, claims: &Claims) -> String {
        jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), claims, &self.key)
            .expect("an Ed25519 key loaded from its PEM signs any claims")
    }
}

/// Generates an Ed25519 key pair into `dir` as [`PRIVATE_KEY_FILE`] (mode 0600) and
/// [`PUBLIC_KEY_FILE`]; refuses to overwrite either.
pub fn generate_key_pair(dir: &Path) -> Result<(PathBuf, PathBuf), KeyError> {
    use aws_lc_rs::encoding::AsDer;
    use aws_lc_rs::signature::{Ed25519KeyPair, KeyPair};

    let private = dir.join(PRIVATE_KEY_FILE);
    let public = dir.join(PUBLIC_KEY_FILE);
    for path in [&private, &public] {
        if path.exists() {
            return Err(KeyError::Exists { path: path.clone() });
        }
    }
    let rng = aws_lc_rs::rand::SystemRandom::new();
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).map_err(|e| KeyError::Generate(e.to_string()))?;
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).map_err(|e| KeyError::Generate(e.to_string()))?;
    let spki = pair.public_key().as_der().map_err(|e| KeyError::Generate(e.to_string()))?;
    write_pem(&private, "PRIVATE KEY", pkcs8.as_ref(), 0o600)?;
    write_pem(&public, "PUBLIC KEY", spki.as_ref(), 0o644)?;
    Ok((private, public))
}

/// Writes a PEM file durably (temporary file with its final mode, fsync, rename).
fn write_pem(path: &Path, tag: &str, der: &[u8], mode: u32) -> Result<(), KeyError> {
    let text = pem::encode(&pem::Pem::new(tag, der.to_vec()));
    let tmp = crashsafe::temp_path(path);
    let err = |source| KeyError::Write { path: path.to_owned(), source };
    let _ = std::fs::remove_file(&tmp);
    let mut f = OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp).map_err(err)?;
    f.write_all(text.as_bytes()).map_err(err)?;
    f.sync_all().map_err(err)?;
    drop(f);
    crashsafe::durable_rename(&tmp, path).map_err(err)
}

#[cfg(test)]
mod tests;
