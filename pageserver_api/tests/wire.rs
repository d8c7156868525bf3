//! The client against recorded answers of the pageserver, over real HTTP on loopback.
//!
//! Each body below is what the pageserver sent before the models existed, written out from
//! its handlers (field order included). The pageserver's own test
//! (`server::http::tests`) holds its router to the bodies it can produce without
//! PostgreSQL; the ones here need data (an import, a running WAL receiver), so they are
//! recorded. Every test checks both directions: the client decodes the recorded bytes, and
//! the decoded model encodes to exactly those bytes again, so the server, which encodes
//! the same models, still sends them.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use pageserver_api::client::{Client, Error};
use pageserver_api::models::{
    BasebackupQuery, CompactRequest, EvictLayersResponse, GcRequest, ImportRequest, ImportResponse, LsnByTimestampQuery, LsnKind,
    StatusResponse, TenantConfig, TenantCreateRequest, TimelineCreateRequest, TimelineInfo, WalReceiverRequest, WalReceiverState,
    WalSource, WalSourceList,
};
use pageserver_api::time::HumanDuration;
use proto::{Lsn, TenantId, TimelineId};

const TENANT: &str = "11111111111111111111111111111111";
const TIMELINE: &str = "22222222222222222222222222222222";

/// A timeline with data, branched, with a WAL receiver streaming from the second of three
/// safekeepers (the first one down).
const TIMELINE_STREAMING: &str = concat!(
    r#"{"tenant_id":"11111111111111111111111111111111","timeline_id":"22222222222222222222222222222222","#,
    r#""ancestor_timeline_id":"33333333333333333333333333333333","ancestor_lsn":"0/1696F40","#,
    r#""last_record_lsn":"0/16B3748","disk_consistent_lsn":"0/16A0000","gc_cutoff_lsn":"0/0","layers":3,"#,
    r#""wal_receiver":{"state":"streaming","connected":true,"last_received_lsn":"0/16B3748","server_wal_end_lsn":"0/16B3748","#,
    r#""records_ingested":1234,"durable_lsn":"0/16B3748","last_error":null,"sources":["#,
    r#"{"host":"127.0.0.1","port":15002,"user":"fjord","end_lsn":null,"last_error":"could not connect: connection refused"},"#,
    r#"{"host":"127.0.0.1","port":15004,"user":"fjord","end_lsn":"0/16B3748","last_error":null},"#,
    r#"{"host":"::1","port":15006,"user":"fjord","end_lsn":"0/16B3700","last_error":null}],"#,
    r#""current_source":1,"current_source_address":"127.0.0.1:15004","lag_switches":0},"#,
    r#""system_id":"7426361234567890123"}"#
);

const IMPORTED: &str = r#"{"checkpoint_lsn":"0/16B36D0","databases":4,"import_lsn":"0/16B3748","system_identifier":"7426361234567890123"}"#;

/// A server that answers every request with the same recorded status, headers and body,
/// and keeps each request line and body for the test to look at.
struct Recorded {
    url: String,
    requests: Arc<Mutex<Vec<(String, String)>>>,
}

fn serve(status: u16, headers: &'static str, body: &'static str) -> Recorded {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let url = format!("http://{}", listener.local_addr().expect("local address"));
    let requests = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&requests);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().expect("clone the stream"));
            let mut line = String::new();
            reader.read_line(&mut line).expect("request line");
            let mut length = 0;
            loop {
                let mut header = String::new();
                reader.read_line(&mut header).expect("header");
                if header.trim().is_empty() {
                    break;
                }
                if let Some((name, value)) = header.split_once(':') {
                    if name.eq_ignore_ascii_case("content-length") {
                        length = value.trim().parse().expect("content length");
                    }
                }
            }
            let mut request_body = vec![0; length];
            reader.read_exact(&mut request_body).expect("request body");
            seen.lock().unwrap().push((line.trim().to_string(), String::from_utf8(request_body).expect("utf-8 body")));
            let answer = format!("HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n{headers}\r\n{body}", body.len());
            let _ = stream.write_all(answer.as_bytes());
        }
    });
    Recorded { url, requests }
}

fn tenant() -> TenantId {
    TENANT.parse().unwrap()
}

fn timeline() -> TimelineId {
    TIMELINE.parse().unwrap()
}

#[test]
fn a_streaming_timeline_decodes_and_encodes_to_the_same_bytes() {
    let server = serve(200, "Content-Type: application/json\r\n", TIMELINE_STREAMING);
    let info = Client::new(&server.url).timeline(tenant(), timeline()).unwrap();
    assert_eq!(info.ancestor_lsn, Some(Lsn(0x1696F40)));
    assert_eq!(info.system_id, Some(7426361234567890123));
    let receiver = info.wal_receiver.as_ref().unwrap();
    assert_eq!(receiver.state, WalReceiverState::Streaming);
    assert_eq!((receiver.sources[2].host.as_str(), receiver.current_source), ("::1", Some(1)));
    assert_eq!(receiver.sources[0].end_lsn, None);
    assert_eq!(serde_json::to_string(&info).unwrap(), TIMELINE_STREAMING);
    assert_eq!(server.requests.lock().unwrap()[0].0, format!("GET /v1/tenant/{TENANT}/timeline/{TIMELINE} HTTP/1.1"));

    let list = format!("[{TIMELINE_STREAMING}]");
    let list: &'static str = Box::leak(list.into_boxed_str());
    let server = serve(200, "", list);
    let timelines = Client::new(&server.url).timelines(tenant()).unwrap();
    assert_eq!(serde_json::to_string(&timelines).unwrap(), list);
}

/// `system_id` of a timeline without data, and the other receiver states.
#[test]
fn nulls_and_states() {
    let mut info: TimelineInfo = serde_json::from_str(TIMELINE_STREAMING).unwrap();
    info.system_id = None;
    let text = serde_json::to_string(&info).unwrap();
    assert!(text.ends_with(r#","system_id":null}"#), "{text}");
    for (state, name) in [
        (WalReceiverState::Starting, "starting"),
        (WalReceiverState::Reconnecting, "reconnecting"),
        (WalReceiverState::Switching, "switching"),
        (WalReceiverState::Failed, "failed"),
        (WalReceiverState::Stopped, "stopped"),
    ] {
        assert_eq!(serde_json::to_string(&state).unwrap(), format!("\"{name}\""));
    }
}

#[test]
fn import_sends_the_path_and_decodes_the_summary() {
    let server = serve(200, "Content-Type: application/json\r\n", IMPORTED);
    let request = ImportRequest { pgdata: "/tmp/pgdata".into() };
    let summary: ImportResponse = Client::new(&server.url).import(tenant(), timeline(), &request).unwrap();
    assert_eq!(summary.import_lsn, Lsn(0x16B3748));
    assert_eq!(summary.system_identifier, 7426361234567890123);
    assert_eq!(serde_json::to_string(&summary).unwrap(), IMPORTED);
    let requests = server.requests.lock().unwrap();
    assert_eq!(
        requests[0],
        (format!("POST /v1/tenant/{TENANT}/timeline/{TIMELINE}/import HTTP/1.1"), r#"{"pgdata":"/tmp/pgdata"}"#.into())
    );
}

/// The request bodies the CLI and compute_ctl sent before the client existed.
#[test]
fn requests_are_the_bodies_clients_always_sent() {
    let server = serve(201, "", r#"{"tenant_id":"11111111111111111111111111111111"}"#);
    let client = Client::new(&server.url);
    assert_eq!(client.create_tenant(&TenantCreateRequest::default()).unwrap().tenant_id, tenant());
    client.create_tenant(&TenantCreateRequest { tenant_id: Some(tenant()) }).unwrap();
    let server2 = serve(202, "", "");
    let client2 = Client::new(&server2.url);
    let source = WalSource { host: "127.0.0.1".into(), port: 55432, user: "me".into(), plaintext: false };
    client2.start_wal_receiver(tenant(), timeline(), &WalReceiverRequest::Single(source.clone())).unwrap();
    let list = WalReceiverRequest::Sources(WalSourceList { sources: vec![WalSource { user: "fjord".into(), ..source }], token: None });
    client2.start_wal_receiver(tenant(), timeline(), &list).unwrap();
    let bodies: Vec<String> =
        server.requests.lock().unwrap().iter().chain(server2.requests.lock().unwrap().iter()).map(|r| r.1.clone()).collect();
    assert_eq!(
        bodies,
        [
            "{}".to_string(),
            format!(r#"{{"tenant_id":"{TENANT}"}}"#),
            r#"{"host":"127.0.0.1","port":55432,"user":"me"}"#.to_string(),
            r#"{"sources":[{"host":"127.0.0.1","port":55432,"user":"fjord"}]}"#.to_string(),
        ]
    );

    // A branch: the ancestor and, if given, its LSN; the server names the new timeline.
    let server = serve(201, "", TIMELINE_STREAMING);
    let branch = TimelineCreateRequest { ancestor_timeline_id: Some(timeline()), ancestor_lsn: Some(Lsn(0x1696F40)), ..Default::default() };
    Client::new(&server.url).create_timeline(tenant(), &branch).unwrap();
    assert_eq!(server.requests.lock().unwrap()[0].1, format!(r#"{{"ancestor_timeline_id":"{TIMELINE}","ancestor_lsn":"0/1696F40"}}"#));
}

#[test]
fn error_answers_carry_the_server_message() {
    let server = serve(404, "Content-Type: application/json\r\n", r#"{"error":"tenant 11111111111111111111111111111111 not found"}"#);
    let err = Client::new(&server.url).timelines(tenant()).unwrap_err();
    assert_eq!(err.status(), Some(404));
    assert_eq!(err.to_string(), format!("pageserver: GET /v1/tenant/{TENANT}/timeline failed: HTTP 404: tenant {TENANT} not found"));

    let server = serve(500, "", "");
    let err = Client::new(&server.url).stop_wal_receiver(tenant(), timeline()).unwrap_err();
    assert!(matches!(&err, Error::Status { method: "DELETE", status: 500, message, .. } if message.contains("no message")), "{err:?}");
}

#[test]
fn answers_that_are_not_the_model_are_malformed() {
    let cases: &[(&'static str, &str)] =
        &[(r#"{"status":"ok"}"#, "missing field `version`"), ("<html>", "expected value"), ("", "EOF while parsing")];
    for (body, reason) in cases {
        let server = serve(200, "", body);
        let err = Client::new(&server.url).status().unwrap_err();
        assert!(matches!(&err, Error::Malformed { reason: r, .. } if r.contains(reason)), "{body}: {err:?}");
    }
    let server = serve(200, "", r#"{"tenant_id":"11","timeline_id":"22"}"#);
    let err = Client::new(&server.url).timeline(tenant(), timeline()).unwrap_err();
    assert!(err.to_string().contains("invalid tenant id: \"11\""), "{err}");

    let server = serve(200, "", r#"{"status":"ok","version":"0.1.0"}"#);
    let status: StatusResponse = Client::new(&server.url).status().unwrap();
    assert_eq!(status.status, "ok");
}

#[test]
fn basebackups_stream_with_their_lsn() {
    let server = serve(200, "Content-Type: application/x-tar\r\nX-Fjord-Lsn: 0/16B3748\r\n", "tar bytes");
    let client = Client::new(&server.url);
    let query = BasebackupQuery { lsn: Some(Lsn(0x16B3748)), standby: false };
    let mut backup = client.basebackup(tenant(), timeline(), &query).unwrap();
    assert_eq!(backup.lsn, Some(Lsn(0x16B3748)));
    let mut body = String::new();
    backup.read_to_string(&mut body).unwrap();
    assert_eq!(body, "tar bytes");
    assert_eq!(
        server.requests.lock().unwrap()[0].0,
        format!("GET /v1/tenant/{TENANT}/timeline/{TIMELINE}/basebackup?lsn=0/16B3748 HTTP/1.1")
    );

    let server = serve(200, "X-Fjord-Lsn: yesterday\r\n", "");
    let err = Client::new(&server.url).basebackup(tenant(), timeline(), &BasebackupQuery::default()).err().unwrap();
    assert!(err.to_string().contains("the X-Fjord-Lsn header: invalid LSN: \"yesterday\""), "{err}");
}

/// The maintenance routes (tenant config, checkpoint, layer eviction, compaction, GC, LSN by
/// timestamp): the paths and bodies sent, and answers decoded and encoded back to the same
/// bytes.
#[test]
fn maintenance_routes() {
    let config = r#"{"tenant_id":"11111111111111111111111111111111","config":{"pitr_window":"1s"},"effective_pitr_window":"1s"}"#;
    let server = serve(200, "", config);
    let client = Client::new(&server.url);
    let pitr = Some(HumanDuration(std::time::Duration::from_secs(1)));
    let info = client.set_tenant_config(tenant(), &TenantConfig { pitr_window: pitr }).unwrap();
    assert_eq!((info.config.pitr_window, info.effective_pitr_window.0.as_secs()), (pitr, 1));
    assert_eq!(serde_json::to_string(&info).unwrap(), config);
    client.tenant_config(tenant()).unwrap();
    let requests = server.requests.lock().unwrap().clone();
    assert_eq!(requests[0], (format!("PUT /v1/tenant/{TENANT}/config HTTP/1.1"), r#"{"pitr_window":"1s"}"#.into()));
    assert_eq!(requests[1].0, format!("GET /v1/tenant/{TENANT}/config HTTP/1.1"));

    let checkpoint = r#"{"disk_consistent_lsn":"0/16B3748","layers_created":1,"bytes_written":8192}"#;
    let server = serve(200, "", checkpoint);
    let done = Client::new(&server.url).checkpoint(tenant(), timeline()).unwrap();
    assert_eq!(serde_json::to_string(&done).unwrap(), checkpoint);
    assert_eq!(
        server.requests.lock().unwrap()[0],
        (format!("POST /v1/tenant/{TENANT}/timeline/{TIMELINE}/checkpoint HTTP/1.1"), String::new())
    );

    let evicted = r#"{"evicted":3,"bytes":24576}"#;
    let server = serve(200, "", evicted);
    let done = Client::new(&server.url).evict_layers(tenant(), timeline()).unwrap();
    assert_eq!(done, EvictLayersResponse { evicted: 3, bytes: 24576 });
    assert_eq!(serde_json::to_string(&done).unwrap(), evicted);
    assert_eq!(
        server.requests.lock().unwrap()[0],
        (format!("POST /v1/tenant/{TENANT}/timeline/{TIMELINE}/evict_layers HTTP/1.1"), String::new())
    );

    let compacted = concat!(
        r#"{"l0_layers_removed":10,"l1_layers_created":2,"image_layers_created":3,"image_ranges":1,"image_ranges_deferred":0,"#,
        r#""image_lsn":"0/16B3748","bytes_written":123456}"#
    );
    let server = serve(200, "", compacted);
    let request = CompactRequest { force_image_layers: true, ..Default::default() };
    let done = Client::new(&server.url).compact(tenant(), timeline(), &request).unwrap();
    assert_eq!((done.l0_layers_removed, done.image_lsn), (10, Some(Lsn(0x16B3748))));
    assert_eq!(serde_json::to_string(&done).unwrap(), compacted);
    assert_eq!(server.requests.lock().unwrap()[0].1, r#"{"force_image_layers":true}"#);

    let collected =
        r#"{"cutoff_lsn":"0/16B0000","pitr_cutoff":{"kind":"present","lsn":"0/16B0000"},"layers_removed":4,"bytes_removed":65536}"#;
    let server = serve(200, "", collected);
    let done = Client::new(&server.url).gc(tenant(), timeline(), &GcRequest { pitr_window: pitr }).unwrap();
    assert_eq!((done.pitr_cutoff.kind, done.layers_removed), (LsnKind::Present, 4));
    assert_eq!(serde_json::to_string(&done).unwrap(), collected);
    assert_eq!(
        server.requests.lock().unwrap()[0],
        (format!("POST /v1/tenant/{TENANT}/timeline/{TIMELINE}/gc HTTP/1.1"), r#"{"pitr_window":"1s"}"#.into())
    );

    let server = serve(200, "", r#"{"kind":"future","lsn":"0/16B3748"}"#);
    let at = LsnByTimestampQuery { timestamp: pageserver_api::time::parse_rfc3339("2026-11-24T10:30:00Z").unwrap() };
    let answer = Client::new(&server.url).lsn_by_timestamp(tenant(), timeline(), &at).unwrap();
    assert_eq!((answer.kind, answer.lsn), (LsnKind::Future, Lsn(0x16B3748)));
    assert_eq!(
        server.requests.lock().unwrap()[0].0,
        format!("GET /v1/tenant/{TENANT}/timeline/{TIMELINE}/get_lsn_by_timestamp?timestamp=2026-11-24T10%3A30%3A00Z HTTP/1.1")
    );
}

/// `changed_blocks`: the query sent, an answer decoded and encoded back to the same bytes,
/// and the refusal a compute acts on (drop its whole cache) with the server's message.
#[test]
fn changed_blocks_route() {
    let changed = concat!(
        r#"{"from":"0/16B0000","to":"0/16B3748","blocks":[[1663,5,16384,0,7,"0/16B2000"],[1663,5,16384,2,0,"0/16B2000"]],"#,
        r#""relations":[[1663,5,16390,0,3,"0/16B3000"],[1663,5,16400,0,null,"0/16B3100"]],"databases":[[1663,16500,"0/16B3200"]]}"#
    );
    let server = serve(200, "", changed);
    let query = pageserver_api::models::ChangedBlocksQuery { from: Lsn(0x16B0000), to: Lsn(0x16B3748), limit: Some(5000) };
    let answer = Client::new(&server.url).changed_blocks(tenant(), timeline(), &query).unwrap();
    assert_eq!((answer.blocks.len(), answer.blocks[1].rel.forknum), (2, proto::ForkNumber::VisibilityMap));
    assert_eq!((answer.relations[0].nblocks, answer.relations[1].nblocks), (Some(3), None));
    assert_eq!((answer.databases[0].dbnode, answer.databases[0].lsn), (16500, Lsn(0x16B3200)));
    assert_eq!(serde_json::to_string(&answer).unwrap(), changed);
    assert_eq!(
        server.requests.lock().unwrap()[0].0,
        format!("GET /v1/tenant/{TENANT}/timeline/{TIMELINE}/changed_blocks?from=0/16B0000&to=0/16B3748&limit=5000 HTTP/1.1")
    );

    let gone = r#"{"error":"cannot list changes since LSN 0/16B0000: below the garbage collection horizon 0/16B1000, the history before which is gone"}"#;
    let server = serve(410, "", gone);
    let err = Client::new(&server.url).changed_blocks(tenant(), timeline(), &query).unwrap_err();
    assert_eq!(err.status(), Some(410));
    assert!(err.to_string().ends_with("HTTP 410: cannot list changes since LSN 0/16B0000: below the garbage collection horizon 0/16B1000, the history before which is gone"), "{err}");
}
