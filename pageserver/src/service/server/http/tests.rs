//! The API as bytes on the wire, against the real router on loopback: each exchange is
//! recorded (status and body, byte for byte), so a change of the JSON a client sees
//! fails here before it fails a client. Only what needs no PostgreSQL is exercised
//! (changed blocks on values put as ingest puts them);
//! the bodies of an import and of a running WAL receiver are recorded in
//! `pageserver_api`'s tests and exercised by pytest.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use super::*;
use crate::service::server::PageserverConfig;

const TENANT: &str = "11111111111111111111111111111111";
const TIMELINE: &str = "22222222222222222222222222222222";
const BRANCH: &str = "33333333333333333333333333333333";

/// The router on an ephemeral loopback port, served by its own runtime until the test
/// process exits.
fn serve(workdir: &std::path::Path) -> SocketAddr {
    serve_with(PageserverConfig { workdir: workdir.to_path_buf(), ..Default::default() }).0
}

/// `serve` with a configuration, returning the pageserver too (to put values into its
/// timelines directly).
fn serve_with(conf: PageserverConfig) -> (SocketAddr, Arc<Pageserver>) {
    let ps = Arc::new(Pageserver::open(conf).expect("open the pageserver"));
    let served = Arc::clone(&ps);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    listener.set_nonblocking(true).expect("nonblocking listener");
    let addr = listener.local_addr().expect("local address");
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
            axum::serve(listener, router(served)).await.expect("serve");
        });
    });
    (addr, ps)
}

/// One HTTP/1.1 exchange over a fresh connection: the status and the body as text.
fn exchange(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    let body = body.unwrap_or("");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).expect("send");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).expect("receive");
    let text = String::from_utf8(response).expect("utf-8 response");
    let (head, body) = text.split_once("\r\n\r\n").expect("a header block");
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("a status line");
    (status, body.to_string())
}

#[test]
fn responses_are_byte_for_byte_what_clients_expect() {
    let dir = tempfile::tempdir().unwrap();
    let addr = serve(dir.path());
    let version = env!("CARGO_PKG_VERSION");
    let empty_timeline = |id: &str| {
        format!(
            r#"{{"tenant_id":"{TENANT}","timeline_id":"{id}","ancestor_timeline_id":null,"ancestor_lsn":null,"last_record_lsn":"0/0","disk_consistent_lsn":"0/0","gc_cutoff_lsn":"0/0","layers":0,"wal_receiver":null,"system_id":null}}"#
        )
    };
    let branch = format!(
        r#"{{"tenant_id":"{TENANT}","timeline_id":"{BRANCH}","ancestor_timeline_id":"{TIMELINE}","ancestor_lsn":"0/0","last_record_lsn":"0/0","disk_consistent_lsn":"0/0","gc_cutoff_lsn":"0/0","layers":0,"wal_receiver":null,"system_id":null}}"#
    );
    let timeline_path = format!("/v1/tenant/{TENANT}/timeline/{TIMELINE}");
    let tenant_config =
        |config: &str, effective: &str| format!(r#"{{"tenant_id":"{TENANT}","config":{config},"effective_pitr_window":"{effective}"}}"#);
    let cases: Vec<(&str, String, Option<String>, u16, String)> = vec![
        ("GET", "/v1/status".into(), None, 200, format!(r#"{{"status":"ok","version":"{version}","features":["no-full-page-images"]}}"#)),
        ("GET", "/v1/tenant".into(), None, 200, "[]".into()),
        ("POST", "/v1/tenant".into(), Some(format!(r#"{{"tenant_id": "{TENANT}"}}"#)), 201, format!(r#"{{"tenant_id":"{TENANT}"}}"#)),
        (
            "POST",
            "/v1/tenant".into(),
            Some(format!(r#"{{"tenant_id": "{TENANT}"}}"#)),
            409,
            format!(r#"{{"error":"tenant {TENANT} already exists"}}"#),
        ),
        // Ids in a body are checked as the body is decoded, so the message is the
        // decoder's, said once (not "invalid tenant id: invalid tenant id: ...").
        (
            "POST",
            "/v1/tenant".into(),
            Some(r#"{"tenant_id": "xyz"}"#.into()),
            400,
            r#"{"error":"invalid request body: invalid tenant id: \"xyz\" (expected 32 hexadecimal digits) at line 1 column 19"}"#
                .into(),
        ),
        (
            "POST",
            "/v1/tenant".into(),
            Some(format!(r#"{{"tenant": "{TENANT}"}}"#)),
            400,
            r#"{"error":"invalid request body: unknown field `tenant`, expected `tenant_id` at line 1 column 9"}"#.into(),
        ),
        ("GET", "/v1/tenant".into(), None, 200, format!(r#"["{TENANT}"]"#)),
        ("GET", format!("/v1/tenant/{TENANT}/timeline"), None, 200, "[]".into()),
        (
            "POST",
            format!("/v1/tenant/{TENANT}/timeline"),
            Some(format!(r#"{{"timeline_id": "{TIMELINE}"}}"#)),
            201,
            empty_timeline(TIMELINE),
        ),
        (
            "POST",
            format!("/v1/tenant/{TENANT}/timeline"),
            Some(format!(r#"{{"timeline_id": "{TIMELINE}"}}"#)),
            409,
            format!(r#"{{"error":"timeline {TIMELINE} already exists"}}"#),
        ),
        (
            "POST",
            format!("/v1/tenant/{TENANT}/timeline"),
            Some(r#"{"ancestor_lsn": "0/10"}"#.into()),
            400,
            r#"{"error":"ancestor_lsn needs ancestor_timeline_id"}"#.into(),
        ),
        (
            "POST",
            format!("/v1/tenant/{TENANT}/timeline"),
            Some(format!(r#"{{"timeline_id": "{BRANCH}", "ancestor_timeline_id": "{TIMELINE}"}}"#)),
            201,
            branch.clone(),
        ),
        ("GET", timeline_path.clone(), None, 200, empty_timeline(TIMELINE)),
        ("GET", format!("/v1/tenant/{TENANT}/timeline/{BRANCH}"), None, 200, branch.clone()),
        ("GET", format!("/v1/tenant/{TENANT}/timeline"), None, 200, format!("[{},{branch}]", empty_timeline(TIMELINE))),
        (
            "GET",
            format!("/v1/tenant/{}/timeline", "4".repeat(32)),
            None,
            404,
            format!(r#"{{"error":"tenant {} not found"}}"#, "4".repeat(32)),
        ),
        (
            "GET",
            format!("/v1/tenant/{TENANT}/timeline/{}", "5".repeat(32)),
            None,
            404,
            format!(r#"{{"error":"timeline {} of tenant {TENANT} not found"}}"#, "5".repeat(32)),
        ),
        (
            "GET",
            "/v1/tenant/xyz/timeline".into(),
            None,
            400,
            r#"{"error":"invalid tenant id: invalid tenant id: \"xyz\" (expected 32 hexadecimal digits)"}"#.into(),
        ),
        (
            "POST",
            format!("{timeline_path}/import"),
            Some(r#"{"pgdata": ""}"#.into()),
            400,
            r#"{"error":"import needs \"pgdata\": the path of a shut-down data directory"}"#.into(),
        ),
        (
            "POST",
            format!("{timeline_path}/wal_receiver"),
            Some(r#"{"host": "127.0.0.1", "port": 5432, "user": "u"}"#.into()),
            409,
            format!(r#"{{"error":"timeline {TIMELINE} has no data yet; import or branch it before streaming WAL into it"}}"#),
        ),
        (
            "POST",
            format!("{timeline_path}/wal_receiver"),
            Some(r#"{"sources": []}"#.into()),
            400,
            r#"{"error":"invalid request body: sources must not be empty"}"#.into(),
        ),
        (
            "DELETE",
            format!("{timeline_path}/wal_receiver"),
            None,
            404,
            format!(r#"{{"error":"timeline {TIMELINE} of tenant {TENANT} has no WAL receiver"}}"#),
        ),
        (
            "GET",
            format!("{timeline_path}/basebackup?lsn=0%2F10"),
            None,
            409,
            format!(r#"{{"error":"timeline {TIMELINE} has no data yet; import or branch it first"}}"#),
        ),
        (
            "GET",
            format!("{timeline_path}/basebackup?at=0/10"),
            None,
            400,
            r#"{"error":"unknown query parameter \"at=0/10\"; expected lsn=X/X or standby=true|false"}"#.into(),
        ),
        ("GET", format!("/v1/tenant/{TENANT}/config"), None, 200, tenant_config("{}", "7d")),
        ("PUT", format!("/v1/tenant/{TENANT}/config"), Some(r#"{"pitr_window": "1s"}"#.into()), 200, tenant_config(r#"{"pitr_window":"1s"}"#, "1s")),
        ("GET", format!("/v1/tenant/{TENANT}/config"), None, 200, tenant_config(r#"{"pitr_window":"1s"}"#, "1s")),
        ("PUT", format!("/v1/tenant/{TENANT}/config"), None, 200, tenant_config("{}", "7d")),
        (
            "PUT",
            format!("/v1/tenant/{TENANT}/config"),
            Some(r#"{"pitr_window": "1 week"}"#.into()),
            400,
            r#"{"error":"invalid request body: invalid duration \"1 week\" (expected a number and a unit: ms, s, m, h or d, such as 7d or 30s) at line 1 column 25"}"#.into(),
        ),
        (
            "GET",
            format!("/v1/tenant/{}/config", "4".repeat(32)),
            None,
            404,
            format!(r#"{{"error":"tenant {} not found"}}"#, "4".repeat(32)),
        ),
        ("POST", format!("{timeline_path}/checkpoint"), None, 200, r#"{"disk_consistent_lsn":"0/0","layers_created":0,"bytes_written":0}"#.into()),
        (
            "POST",
            format!("{timeline_path}/compact"),
            Some(r#"{"force_image_layers": true}"#.into()),
            200,
            r#"{"l0_layers_removed":0,"l1_layers_created":0,"image_layers_created":0,"image_ranges":0,"image_ranges_deferred":0,"image_lsn":null,"bytes_written":0}"#.into(),
        ),
        (
            "POST",
            format!("{timeline_path}/compact"),
            Some(r#"{"force": true}"#.into()),
            400,
            r#"{"error":"invalid request body: unknown field `force`, expected `force_l0` or `force_image_layers` at line 1 column 8"}"#.into(),
        ),
        (
            "POST",
            format!("{timeline_path}/gc"),
            Some(r#"{"pitr_window": "0s"}"#.into()),
            200,
            r#"{"cutoff_lsn":"0/0","pitr_cutoff":{"kind":"nodata","lsn":"0/0"},"layers_removed":0,"bytes_removed":0}"#.into(),
        ),
        (
            "GET",
            format!("{timeline_path}/get_lsn_by_timestamp?timestamp=2026-11-24T10%3A30%3A00Z"),
            None,
            200,
            r#"{"kind":"nodata","lsn":"0/0"}"#.into(),
        ),
        (
            "GET",
            format!("{timeline_path}/get_lsn_by_timestamp?timestamp=yesterday"),
            None,
            400,
            r#"{"error":"invalid timestamp \"yesterday\": not in the form YYYY-MM-DDTHH:MM:SS (expected RFC 3339, such as 2026-11-24T10:30:00Z)"}"#.into(),
        ),
        (
            "GET",
            format!("{timeline_path}/get_lsn_by_timestamp"),
            None,
            400,
            r#"{"error":"missing query parameter timestamp=<RFC 3339>"}"#.into(),
        ),
        (
            "GET",
            format!("{timeline_path}/changed_blocks?from=0/0&to=0%2F0"),
            None,
            200,
            r#"{"from":"0/0","to":"0/0","blocks":[],"relations":[],"databases":[]}"#.into(),
        ),
        (
            "GET",
            format!("{timeline_path}/changed_blocks?from=0/0"),
            None,
            400,
            r#"{"error":"missing query parameter to=X/X"}"#.into(),
        ),
        (
            "GET",
            format!("{timeline_path}/changed_blocks?from=0/2&to=0/1"),
            None,
            400,
            r#"{"error":"cannot list changes from LSN 0/2 to LSN 0/1: the range ends before it starts"}"#.into(),
        ),
        (
            "GET",
            format!("{timeline_path}/changed_blocks?from=0/0&to=0/1&limit=many"),
            None,
            400,
            r#"{"error":"invalid limit \"many\": expected a number of keys from 0 to 1000000"}"#.into(),
        ),
        (
            "GET",
            format!("/v1/tenant/{TENANT}/timeline/{}/changed_blocks?from=0/0&to=0/0", "5".repeat(32)),
            None,
            404,
            format!(r#"{{"error":"timeline {} of tenant {TENANT} not found"}}"#, "5".repeat(32)),
        ),
        (
            "GET",
            format!("{timeline_path}/basebackup?lsn=x"),
            None,
            400,
            r#"{"error":"invalid LSN: invalid LSN: \"x\" (expected two hexadecimal numbers such as 16/B374D848)"}"#.into(),
        ),
    ];
    for (method, path, body, status, expected) in cases {
        let (got_status, got) = exchange(addr, method, &path, body.as_deref());
        assert_eq!((got_status, got.as_str()), (status, expected.as_str()), "{method} {path}");
    }
}

/// The client the CLI and compute_ctl use, against this router: every answer decodes,
/// and each kind of failure comes out as its own kind of error.
#[test]
fn the_shared_client_decodes_what_the_router_encodes() {
    use pageserver_api::client::{Client, Error};
    use pageserver_api::models::{BasebackupQuery, ImportRequest, WalReceiverRequest, WalSource};
    use proto::Lsn;

    let dir = tempfile::tempdir().unwrap();
    let client = Client::new(&format!("http://{}", serve(dir.path())));
    let (tenant, timeline) = (TENANT.parse::<TenantId>().unwrap(), TIMELINE.parse::<TimelineId>().unwrap());

    assert_eq!(
        client.status().unwrap(),
        StatusResponse { status: "ok".into(), version: env!("CARGO_PKG_VERSION").into(), features: vec!["no-full-page-images".into()] }
    );
    assert_eq!(client.tenants().unwrap(), []);
    let created = client.create_tenant(&TenantCreateRequest::default()).unwrap().tenant_id;
    assert_eq!(client.create_tenant(&TenantCreateRequest { tenant_id: Some(tenant) }).unwrap().tenant_id, tenant);
    let mut tenants = client.tenants().unwrap();
    tenants.sort();
    let mut expected = vec![created, tenant];
    expected.sort();
    assert_eq!(tenants, expected);

    let root = client.create_timeline(tenant, &TimelineCreateRequest { timeline_id: Some(timeline), ..Default::default() }).unwrap();
    assert_eq!((root.tenant_id, root.timeline_id, root.last_record_lsn, root.system_id), (tenant, timeline, Lsn::INVALID, None));
    let branch =
        client.create_timeline(tenant, &TimelineCreateRequest { ancestor_timeline_id: Some(timeline), ..Default::default() }).unwrap();
    assert_eq!((branch.ancestor_timeline_id, branch.ancestor_lsn), (Some(timeline), Some(Lsn::INVALID)));
    assert_eq!(client.timeline(tenant, branch.timeline_id).unwrap(), branch);
    assert_eq!(client.timelines(tenant).unwrap().len(), 2);

    fn status_of<T>(r: Result<T, Error>) -> (u16, String) {
        match r {
            Err(Error::Status { status, message, .. }) => (status, message),
            Err(other) => panic!("expected an HTTP error status, got {other:?}"),
            Ok(_) => panic!("expected an HTTP error status, got success"),
        }
    }
    let missing = TimelineId([9; 16]);
    assert_eq!(status_of(client.timeline(tenant, missing)), (404, format!("timeline {missing} of tenant {tenant} not found")));
    assert_eq!(status_of(client.create_tenant(&TenantCreateRequest { tenant_id: Some(tenant) })).0, 409);
    assert_eq!(status_of(client.import(tenant, timeline, &ImportRequest::default())).0, 400);
    let source = WalSource { host: "127.0.0.1".into(), port: 5432, user: "u".into(), plaintext: false };
    assert_eq!(status_of(client.start_wal_receiver(tenant, timeline, &WalReceiverRequest::Single(source))).0, 409);
    assert_eq!(status_of(client.stop_wal_receiver(tenant, timeline)).0, 404);
    let at = BasebackupQuery { lsn: Some(Lsn(0x10)), standby: false };
    assert_eq!(status_of(client.basebackup(tenant, timeline, &at).map(|b| b.lsn)).0, 409);

    use pageserver_api::models::{CompactRequest, GcRequest, LsnByTimestampQuery, LsnKind, TenantConfig};
    use pageserver_api::time::HumanDuration;
    let one_second = Some(HumanDuration(std::time::Duration::from_secs(1)));
    let set = client.set_tenant_config(tenant, &TenantConfig { pitr_window: one_second }).unwrap();
    assert_eq!((set.config.pitr_window, set.effective_pitr_window), (one_second, HumanDuration(std::time::Duration::from_secs(1))));
    assert_eq!(client.tenant_config(tenant).unwrap(), set);
    assert_eq!(client.checkpoint(tenant, timeline).unwrap().layers_created, 0);
    assert_eq!(client.evict_layers(tenant, timeline).unwrap(), EvictLayersResponse::default(), "nothing is remote");
    assert_eq!(client.compact(tenant, timeline, &CompactRequest::default()).unwrap().image_lsn, None);
    assert_eq!(client.gc(tenant, timeline, &GcRequest::default()).unwrap().pitr_cutoff.kind, LsnKind::NoData);
    let now = LsnByTimestampQuery { timestamp: std::time::SystemTime::now() };
    assert_eq!(client.lsn_by_timestamp(tenant, timeline, &now).unwrap().kind, LsnKind::NoData);
    assert_eq!(status_of(client.checkpoint(tenant, missing)).0, 404);
}

/// `changed_blocks` on a timeline with data (put as ingest puts it): the answer byte for
/// byte and through the client, and each refusal with its status: too many changes
/// (409), `to` not ingested in time (504), `from` below the GC horizon or the branch
/// point (410).
#[test]
fn changed_blocks_answers_and_refusals() {
    use std::collections::BTreeSet;

    use bytes::Bytes;
    use pageserver_api::client::Client;
    use pageserver_api::models::ChangedBlocksQuery;
    use proto::{BlockNumber, ForkNumber, Key, Lsn, RelTag};

    use crate::pgdata::datadir::codec::{DbEntry, RelEntry};
    use crate::pgdata::datadir::Modification;

    let dir = tempfile::tempdir().unwrap();
    let conf = PageserverConfig {
        workdir: dir.path().to_path_buf(),
        wait_lsn_timeout_ms: 100,
        background_jobs_enabled: false,
        ..Default::default()
    };
    let (addr, ps) = serve_with(conf);
    let (tenant, timeline) = (TENANT.parse::<TenantId>().unwrap(), TIMELINE.parse::<TimelineId>().unwrap());
    ps.create_tenant(tenant).unwrap();
    let t = ps.create_timeline(tenant, timeline, None).unwrap();
    let rel = RelTag { spcnode: 1663, dbnode: 5, relnode: 16384, forknum: ForkNumber::Main };
    let page = |fill: u8| Bytes::from(vec![fill; 8192]);
    let mut m = Modification::new(&t, Lsn(0x100));
    m.put_db_dir(&[DbEntry { spcnode: 1664, dbnode: 0 }, DbEntry { spcnode: 1663, dbnode: 5 }].into());
    m.put_rel_dir(1663, 5, &BTreeSet::from([RelEntry { relnode: 16384, forknum: ForkNumber::Main }]));
    m.put_rel_size(rel, 2);
    m.put_image(Key::rel_block(rel, BlockNumber(0)), page(1));
    m.put_image(Key::rel_block(rel, BlockNumber(1)), page(2));
    m.commit().unwrap();
    let mut m = Modification::new(&t, Lsn(0x200));
    m.put_image(Key::rel_block(rel, BlockNumber(1)), page(3));
    m.commit().unwrap();
    let mut m = Modification::new(&t, Lsn(0x300));
    m.put_rel_size(rel, 1);
    m.commit().unwrap();

    let path = |query: &str| format!("/v1/tenant/{TENANT}/timeline/{TIMELINE}/changed_blocks?{query}");
    let answer =
        r#"{"from":"0/100","to":"0/300","blocks":[[1663,5,16384,0,1,"0/200"]],"relations":[[1663,5,16384,0,1,"0/300"]],"databases":[]}"#;
    assert_eq!(exchange(addr, "GET", &path("from=0/100&to=0/300"), None), (200, answer.to_string()));
    let client = Client::new(&format!("http://{addr}"));
    let query = ChangedBlocksQuery { from: Lsn(0x100), to: Lsn(0x300), limit: Some(2) };
    let decoded = client.changed_blocks(tenant, timeline, &query).unwrap();
    assert_eq!(serde_json::to_string(&decoded).unwrap(), answer);
    assert_eq!(
        exchange(addr, "GET", &path("from=0/100&to=0/300&limit=1"), None),
        (409, r#"{"error":"too many changes: more than 1 keys changed between LSN 0/100 and LSN 0/300"}"#.into())
    );
    assert_eq!(
        exchange(addr, "GET", &path("from=0/100&to=0/400"), None),
        (504, r#"{"error":"timed out after 100ms waiting for LSN 0/400 to be ingested: last record LSN is 0/300"}"#.into())
    );

    t.gc(Lsn(0x200), &[]).unwrap();
    let gone =
        r#"{"error":"cannot list changes since LSN 0/100: below the garbage collection horizon 0/200, the history before which is gone"}"#;
    assert_eq!(exchange(addr, "GET", &path("from=0/100&to=0/300"), None), (410, gone.to_string()));
    let err = client.changed_blocks(tenant, timeline, &query).unwrap_err();
    assert_eq!(err.status(), Some(410));
    assert_eq!(
        exchange(addr, "GET", &path("from=0/200&to=0/300"), None),
        (200, r#"{"from":"0/200","to":"0/300","blocks":[],"relations":[[1663,5,16384,0,1,"0/300"]],"databases":[]}"#.into())
    );

    let branch = BRANCH.parse::<TimelineId>().unwrap();
    ps.create_timeline(tenant, branch, Some((timeline, Some(Lsn(0x300))))).unwrap();
    assert_eq!(
        exchange(addr, "GET", &format!("/v1/tenant/{TENANT}/timeline/{BRANCH}/changed_blocks?from=0/200&to=0/300"), None),
        (
            410,
            r#"{"error":"cannot list changes since LSN 0/200: before the timeline's branch point 0/300, where its own history starts"}"#
                .into()
        )
    );
}

#[test]
fn the_lsn_header_name_agrees_with_the_models() {
    use pageserver_api::models::LSN_HEADER;
    assert_eq!(LSN_HEADER_LOWERCASE, LSN_HEADER.to_ascii_lowercase());
}
