//! The local backend through the public API; the S3 backend is exercised against a real
//! MinIO by the pytest suite (`test_runner/`).

use super::*;

fn local() -> (tempfile::TempDir, RemoteStorage) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/remote", dir.path().display());
    let storage = RemoteStorage::from_url(&url).unwrap();
    (dir, storage)
}

#[test]
fn put_get_list_delete() {
    let (_dir, s) = local();
    assert!(s.list("").unwrap().is_empty());
    assert!(s.list("tenants/a").unwrap().is_empty());
    s.put("tenants/a/timelines/1/layer", Bytes::from_static(b"one")).unwrap();
    s.put("tenants/a/timelines/2/layer", Bytes::from_static(b"two!")).unwrap();
    s.put("tenants/b/x", Bytes::from_static(b"")).unwrap();
    assert_eq!(s.get("tenants/a/timelines/1/layer").unwrap(), Bytes::from_static(b"one"));
    let listed = s.list("tenants/a").unwrap();
    assert_eq!(
        listed,
        vec![
            ObjectInfo { key: "tenants/a/timelines/1/layer".into(), size_bytes: 3 },
            ObjectInfo { key: "tenants/a/timelines/2/layer".into(), size_bytes: 4 },
        ]
    );
    assert_eq!(s.list_dirs("tenants").unwrap(), vec!["a".to_string(), "b".to_string()]);
    assert_eq!(s.list_dirs("tenants/a/timelines").unwrap(), vec!["1".to_string(), "2".to_string()]);
    s.put("tenants/b/x", Bytes::from_static(b"replaced")).unwrap();
    assert_eq!(s.get("tenants/b/x").unwrap(), Bytes::from_static(b"replaced"));
    s.delete("tenants/b/x").unwrap();
    s.delete("tenants/b/x").unwrap();
    assert!(matches!(s.get("tenants/b/x"), Err(RemoteError::NotFound { .. })));
}

#[test]
fn put_if_absent_never_replaces() {
    let (_dir, s) = local();
    assert!(s.put_if_absent("gen/1", Bytes::from_static(b"first")).unwrap());
    assert!(!s.put_if_absent("gen/1", Bytes::from_static(b"second")).unwrap());
    assert_eq!(s.get("gen/1").unwrap(), Bytes::from_static(b"first"));
}

#[test]
fn bad_urls_are_refused_with_the_reason() {
    for (url, want) in [
        ("not a url", "invalid remote storage URL"),
        ("gs://bucket/x", "unknown scheme \"gs\""),
        ("s3:///prefix", "no bucket"),
        ("s3://bucket/p?endpoint=http://h:1&colour=blue", "unknown parameter \"colour\""),
        ("s3://bucket/p?allow_http=maybe", "allow_http"),
        ("file://host/dir", "without host or query"),
        ("file:///tmp/x?y=1", "without host or query"),
    ] {
        let err = RemoteStorage::from_url(url).expect_err(url);
        assert!(format!("{err:#}").contains(want), "{url}: {err:#}");
    }
}

#[test]
fn s3_description_names_no_secret() {
    let s = RemoteStorage::from_url("s3://bkt/some/prefix?endpoint=http://127.0.0.1:9&region=us-east-1&allow_http=true").unwrap();
    assert_eq!(s.to_string(), "s3://bkt/some/prefix at http://127.0.0.1:9");
}

#[test]
fn an_unreachable_s3_endpoint_is_a_transient_failure() {
    let s = RemoteStorage::from_url("s3://bkt/p?endpoint=http://127.0.0.1:9&region=us-east-1&allow_http=true").unwrap();
    let err = s.get("k").unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(err.to_string().starts_with("could not download k in s3://bkt/p at http://127.0.0.1:9"), "{err}");
}

#[test]
fn retry_stops_at_success_permanent_errors_and_the_deadline() {
    let transient = || RemoteError::Failed { op: "upload", key: "k".into(), storage: "s".into(), message: "down".into() };
    let mut calls = 0;
    let got = retry(
        || {
            calls += 1;
            if calls < 3 {
                Err(transient())
            } else {
                Ok(calls)
            }
        },
        Backoff::new(Duration::from_millis(1), Duration::from_millis(2)),
        None,
        |_, _| {},
    );
    assert_eq!(got.unwrap(), 3);
    let mut seen = 0;
    let err = retry(
        || -> Result<(), _> { Err(RemoteError::NotFound { key: "k".into(), storage: "s".into() }) },
        Backoff::new(Duration::from_millis(1), Duration::from_millis(1)),
        None,
        |_, _| seen += 1,
    );
    assert!(matches!(err, Err(RemoteError::NotFound { .. })) && seen == 0);
    let err = retry(
        || -> Result<(), _> { Err(transient()) },
        Backoff::new(Duration::from_millis(1), Duration::from_millis(1)),
        Some(Duration::ZERO),
        |_, _| {},
    );
    assert!(err.unwrap_err().is_transient());
}

#[test]
fn backoff_doubles_up_to_the_cap() {
    let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
    let got: Vec<u128> = (0..4).map(|_| b.next_delay().as_millis()).collect();
    assert_eq!(got, vec![100, 200, 350, 350]);
}
