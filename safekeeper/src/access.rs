//! Who may use this safekeeper: the token check shared by its three protocols.
//!
//! With `--auth-public-key` every proposer, replication client and HTTP request (except
//! `/metrics` and `/v1/status`) must carry a token signed by the cluster's key that grants
//! what it asks for (the rules are the `auth` crate's; each protocol takes the token out of
//! its own messages and names the [`Access`] it needs). Without the flag there is no
//! [`Authenticator`] at all and every protocol behaves as before authentication existed
//! (trust).
//!
//! Every refusal is logged here, once, at warn (the peer, what it asked for, the reason;
//! never the token), and counted in `safekeeper_auth_failures_total{reason}`; the callers
//! only tell the client and close.

use auth::{Access, AuthError, Claims, Verifier};
use prometheus::IntCounterVec;

/// Checks tokens with the cluster's public key, and reports refusals.
#[derive(Clone)]
pub struct Authenticator {
    verifier: Verifier,
    /// `safekeeper_auth_failures_total`, by reason.
    failures: IntCounterVec,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator").field("verifier", &self.verifier).finish_non_exhaustive()
    }
}

impl Authenticator {
    pub fn new(verifier: Verifier, failures: IntCounterVec) -> Authenticator {
        Authenticator { verifier, failures }
    }

    /// Whether `token` (None or empty: the client sent none) grants `access`. `peer` is the
    /// client's address and `request` what it asked for in its protocol's words (for the
    /// log line of a refusal).
    pub fn check(&self, token: Option<&str>, access: Access, peer: &str, request: &str) -> Result<Claims, AuthError> {
        self.verifier.authorize(token, access).inspect_err(|e| self.refused(e, access, peer, request))
    }

    /// Reports a refusal found before the token could be checked (a password message that
    /// is too long or not UTF-8, an `Authorization` header that is not `Bearer <token>`).
    pub fn refused(&self, e: &AuthError, access: Access, peer: &str, request: &str) {
        self.failures.with_label_values(&[e.reason()]).inc();
        tracing::warn!(%peer, request, wanted = %access, reason = e.reason(), "refused: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::{TenantId, TimelineId};

    #[test]
    fn refusals_are_counted_by_reason() {
        let dir = tempfile::tempdir().unwrap();
        let (private, public) = auth::generate_key_pair(dir.path()).unwrap();
        let signer = auth::Signer::load(&private).unwrap();
        let failures = IntCounterVec::new(prometheus::Opts::new("f", "f"), &["reason"]).unwrap();
        let a = Authenticator::new(Verifier::load(&public).unwrap(), failures.clone());
        let (t, tl) = (TenantId::from_bytes([1; 16]), TimelineId::from_bytes([2; 16]));
        let access = Access::Compute { tenant: t, timeline: Some(tl) };
        assert!(a.check(Some(&signer.sign(&Claims::tenant(t))), access, "peer", "Hello").is_ok());
        assert_eq!(a.check(None, access, "peer", "Hello").unwrap_err(), AuthError::Missing);
        let other = signer.sign(&Claims::tenant(TenantId::from_bytes([3; 16])));
        assert_eq!(a.check(Some(&other), access, "peer", "Hello").unwrap_err().reason(), "wrong_tenant");
        a.refused(&AuthError::Malformed("too long".into()), access, "peer", "Hello");
        let count = |r: &str| failures.with_label_values(&[r]).get();
        assert_eq!((count("missing"), count("wrong_tenant"), count("malformed"), count("expired")), (1, 1, 1, 0));
        assert!(AuthError::Expired.is_unauthenticated() && !a.check(Some(&other), access, "p", "r").unwrap_err().is_unauthenticated());
    }
}
