use std::os::unix::fs::PermissionsExt;

use proptest::prelude::*;

use super::*;

fn tid(n: u8) -> TenantId {
    TenantId::from_bytes([n; 16])
}

fn tlid(n: u8) -> TimelineId {
    TimelineId::from_bytes([n; 16])
}

struct Keys {
    _dir: tempfile::TempDir,
    signer: Signer,
    verifier: Verifier,
}

fn keys() -> Keys {
    let dir = tempfile::tempdir().unwrap();
    let (private, public) = generate_key_pair(dir.path()).unwrap();
    Keys { signer: Signer::load(&private).unwrap(), verifier: Verifier::load(&public).unwrap(), _dir: dir }
}

#[test]
fn a_signed_token_verifies_and_keeps_its_claims() {
    let k = keys();
    for claims in
        [Claims::admin(), Claims::storage(), Claims::tenant(tid(1)), Claims::tenant(tid(1)).with_timeline(tlid(2)).expiring_in(60)]
    {
        let token = k.signer.sign(&claims);
        assert_eq!(k.verifier.verify(&token).unwrap(), claims);
    }
}

#[test]
fn the_private_key_is_readable_by_its_owner_only_and_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let (private, public) = generate_key_pair(dir.path()).unwrap();
    assert_eq!(std::fs::metadata(&private).unwrap().permissions().mode() & 0o777, 0o600);
    assert!(std::fs::read_to_string(&public).unwrap().starts_with("-----BEGIN PUBLIC KEY-----"));
    let before = std::fs::read(&private).unwrap();
    assert!(matches!(generate_key_pair(dir.path()), Err(KeyError::Exists { .. })));
    assert_eq!(std::fs::read(&private).unwrap(), before);
}

#[test]
fn key_files_that_are_not_keys_are_refused_with_their_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k.pem");
    std::fs::write(&path, "not a key").unwrap();
    let err = Verifier::load(&path).unwrap_err().to_string();
    assert!(err.contains("k.pem") && err.contains("public"), "{err}");
    assert!(matches!(Signer::load(&path), Err(KeyError::Invalid { what: "private", .. })));
    assert!(matches!(Verifier::load(&dir.path().join("missing.pem")), Err(KeyError::Read { .. })));
}

#[test]
fn a_token_from_another_key_or_altered_is_refused() {
    let (a, b) = (keys(), keys());
    let token = a.signer.sign(&Claims::tenant(tid(1)));
    assert_eq!(b.verifier.verify(&token), Err(AuthError::BadSignature));

    // The same signature over other claims (another tenant).
    let other = a.signer.sign(&Claims::tenant(tid(2)));
    let (head, rest) = token.split_once('.').unwrap();
    let (_, sig) = rest.split_once('.').unwrap();
    let other_claims = other.split('.').nth(1).unwrap();
    let forged = format!("{head}.{other_claims}.{sig}");
    assert_eq!(a.verifier.verify(&forged), Err(AuthError::BadSignature));
}

#[test]
fn expired_unsigned_and_garbage_tokens_are_refused() {
    let k = keys();
    let mut claims = Claims::tenant(tid(1));
    claims.exp = Some(now() - 3600);
    assert_eq!(k.verifier.verify(&k.signer.sign(&claims)), Err(AuthError::Expired));

    let token = k.signer.sign(&Claims::admin());
    let claims_part = token.split('.').nth(1).unwrap();
    // {"alg":"none","typ":"JWT"}
    let unsigned = format!("eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.{claims_part}.");
    assert!(matches!(k.verifier.verify(&unsigned), Err(AuthError::Malformed(_))), "{:?}", k.verifier.verify(&unsigned));
    // {"alg":"HS256","typ":"JWT"}: a MAC "signed" with the public key must not pass.
    let hs256 = format!("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.{claims_part}.AAAA");
    assert!(matches!(k.verifier.verify(&hs256), Err(AuthError::Malformed(_))));

    assert_eq!(k.verifier.verify(""), Err(AuthError::Missing));
    assert!(matches!(k.verifier.verify("abc"), Err(AuthError::Malformed(_))));
    assert!(matches!(k.verifier.verify(&"a".repeat(TOKEN_BYTES_MAX + 1)), Err(AuthError::Malformed(_))));
}

#[test]
fn claims_of_the_wrong_shape_are_refused_even_when_signed() {
    let k = keys();
    let mut no_tenant = Claims::tenant(tid(1));
    no_tenant.tenant_id = None;
    let mut admin_with_tenant = Claims::admin();
    admin_with_tenant.tenant_id = Some(tid(1));
    let mut storage_timeline_without_tenant = Claims::storage();
    storage_timeline_without_tenant.timeline_id = Some(tlid(1));
    for claims in [no_tenant, admin_with_tenant, storage_timeline_without_tenant] {
        assert!(matches!(k.verifier.verify(&k.signer.sign(&claims)), Err(AuthError::Malformed(_))));
    }
}

#[test]
fn who_may_do_what() {
    let (t1, t2, l1, l2) = (tid(1), tid(2), tlid(1), tlid(2));
    let compute = |timeline| Access::Compute { tenant: t1, timeline };
    let read = Access::ReadWal { tenant: t1, timeline: l1 };
    let ok = |c: &Claims, a| check_access(c, a).is_ok();

    let admin = Claims::admin();
    assert!(ok(&admin, Access::Management) && ok(&admin, compute(None)) && ok(&admin, read));

    let storage = Claims::storage();
    assert!(ok(&storage, read));
    assert!(!ok(&storage, Access::Management) && !ok(&storage, compute(Some(l1))));

    // A storage token narrowed to one timeline reads that timeline's WAL and nothing else.
    let narrowed = Claims::storage_for(t1, l1);
    assert!(ok(&narrowed, read));
    assert_eq!(check_access(&narrowed, Access::ReadWal { tenant: t1, timeline: l2 }).unwrap_err().reason(), "wrong_timeline");
    assert_eq!(check_access(&narrowed, Access::ReadWal { tenant: t2, timeline: l1 }).unwrap_err().reason(), "wrong_tenant");
    assert!(!ok(&narrowed, Access::Management) && !ok(&narrowed, compute(Some(l1))));

    let tenant = Claims::tenant(t1);
    assert!(ok(&tenant, compute(None)) && ok(&tenant, compute(Some(l1))) && ok(&tenant, read));
    assert!(matches!(check_access(&tenant, Access::Management), Err(AuthError::Forbidden { .. })));
    let other = Access::Compute { tenant: t2, timeline: None };
    assert_eq!(check_access(&tenant, other).unwrap_err().reason(), "wrong_tenant");
    assert_eq!(check_access(&tenant, Access::ReadWal { tenant: t2, timeline: l1 }).unwrap_err().reason(), "wrong_tenant");

    // Joining the controller as node 7 is pageserver 7's own token's, or an admin's.
    let join = Access::Placement { node: 7 };
    assert!(ok(&admin, join) && ok(&Claims::pageserver(7), join));
    assert!(!ok(&Claims::pageserver(8), join) && !ok(&storage, join) && !ok(&narrowed, join) && !ok(&tenant, join));
    // A node id only on a storage token for no tenant.
    assert!(Claims { node_id: Some(1), ..Claims::admin() }.check_shape().is_err());
    assert!(Claims { node_id: Some(1), ..Claims::storage_for(t1, l1) }.check_shape().is_err());
    assert!(Claims::pageserver(1).check_shape().is_ok());
    // Where a tenant is: any token for it, not one for another tenant.
    let locate = Access::Locate { tenant: t1 };
    assert!(ok(&admin, locate) && ok(&storage, locate) && ok(&narrowed, locate) && ok(&tenant, locate));
    assert_eq!(check_access(&tenant, Access::Locate { tenant: t2 }).unwrap_err().reason(), "wrong_tenant");

    let timeline = Claims::tenant(t1).with_timeline(l1);
    assert!(ok(&timeline, compute(Some(l1))) && ok(&timeline, read) && ok(&timeline, locate));
    assert_eq!(check_access(&timeline, compute(Some(l2))).unwrap_err().reason(), "wrong_timeline");
    assert_eq!(check_access(&timeline, compute(None)).unwrap_err().reason(), "wrong_timeline");
}

#[test]
fn the_error_messages_say_what_to_do() {
    let err = check_access(&Claims::tenant(tid(1)), Access::Compute { tenant: tid(2), timeline: None }).unwrap_err();
    assert_eq!(err.to_string(), format!("the token is for tenant {}: it may not use tenant {}", tid(1), tid(2)));
    assert!(AuthError::REASONS.contains(&err.reason()));
    assert!(AuthError::Missing.to_string().contains("token"));
}

#[test]
fn bearer_headers() {
    assert_eq!(bearer("Bearer abc.def.ghi"), Ok("abc.def.ghi"));
    assert_eq!(bearer("bearer  x "), Ok("x"));
    assert!(matches!(bearer("Basic dXNlcjpwYXNz"), Err(AuthError::Malformed(_))));
    assert!(matches!(bearer("abc"), Err(AuthError::Malformed(_))));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_string_is_refused_without_a_panic(s in ".{0,300}", dots in "[A-Za-z0-9_-]{0,40}\\.[A-Za-z0-9_-]{0,40}\\.[A-Za-z0-9_-]{0,90}") {
        let k = keys();
        prop_assert!(k.verifier.verify(&s).is_err());
        prop_assert!(k.verifier.verify(&dots).is_err());
    }
}
