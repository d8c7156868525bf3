//! The `--listen` port with TLS on, in process: a replication client that asks for TLS
//! (`SSLRequest`) streams inside it; a replication client and a proposer that do not are
//! refused in their own protocol, with the reason, and counted; the safekeeper goes on
//! serving. (The proposer over TLS: `walproposer/tests/tls.rs`.)

use bytes::BytesMut;
use postgres_protocol::message::{backend, frontend};
use proto::{TenantId, TimelineId};
use quorum::wire::{AcceptorMessage, ProposerMessage, PROTOCOL_VERSION};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

fn ids() -> (TenantId, TimelineId) {
    (TenantId::from_bytes([0x11; 16]), TimelineId::from_bytes([0x22; 16]))
}

/// Reads backend messages until `ReadyForQuery` (or an error), returning them.
fn until_ready(s: &mut impl Read, buf: &mut BytesMut) -> Vec<backend::Message> {
    let mut got = Vec::new();
    loop {
        while let Some(m) = backend::Message::parse(buf).unwrap() {
            let last = matches!(m, backend::Message::ReadyForQuery(_) | backend::Message::ErrorResponse(_));
            got.push(m);
            if last {
                return got;
            }
        }
        let mut chunk = [0u8; 8192];
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "the safekeeper closed the connection");
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn error_fields(m: &backend::Message) -> (String, String) {
    use fallible_iterator::FallibleIterator;
    let backend::Message::ErrorResponse(body) = m else { panic!("not an error") };
    let (mut code, mut message) = (String::new(), String::new());
    let mut fields = body.fields();
    while let Some(f) = fields.next().unwrap() {
        match f.type_() {
            b'C' => code = String::from_utf8_lossy(f.value_bytes()).into_owned(),
            b'M' => message = String::from_utf8_lossy(f.value_bytes()).into_owned(),
            _ => {}
        }
    }
    (code, message)
}

fn startup(s: &mut impl Write) {
    let (t, tl) = ids();
    let database = format!("{t}/{tl}");
    let mut out = BytesMut::new();
    frontend::startup_message([("user", "u"), ("replication", "true"), ("database", database.as_str())], &mut out).unwrap();
    s.write_all(&out).unwrap();
    s.flush().unwrap();
}

#[test]
fn replication_over_tls_and_plaintext_clients_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = tls::ca::Ca::create(&dir.path().join("ca")).unwrap();
    let (cert, key) = (dir.path().join("sk.crt"), dir.path().join("sk.key"));
    ca.issue_to_files("safekeeper-1", &["127.0.0.1".to_string()], tls::ca::SERVICE_VALIDITY, &cert, &key).unwrap();
    let config = safekeeper::SafekeeperConfig { tls: Some(tls::ServerTls::load(&cert, &key).unwrap()), ..Default::default() };
    let sk = safekeeper::Safekeeper::open_with_config(1, &dir.path().join("sk"), config).unwrap();
    let (t, tl) = ids();
    sk.create_timeline(t, tl, 7, 16 << 20).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (listener, http) = rt.block_on(async {
        (tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(), tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap())
    });
    let port = listener.local_addr().unwrap().port();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = rt.spawn(safekeeper::server::run(sk.clone(), listener, http, async {
        let _ = stop_rx.await;
    }));
    let client = tls::ClientTls::load(&dir.path().join("ca/ca.crt")).unwrap();
    let connect = || {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s
    };
    let identify_over_tls = || {
        let mut s = tls::pg::connect(&client, connect(), "127.0.0.1").unwrap();
        let mut buf = BytesMut::new();
        startup(&mut s);
        let msgs = until_ready(&mut s, &mut buf);
        assert!(matches!(msgs.last(), Some(backend::Message::ReadyForQuery(_))), "the startup failed");
        let mut out = BytesMut::new();
        frontend::query("IDENTIFY_SYSTEM", &mut out).unwrap();
        s.write_all(&out).unwrap();
        let msgs = until_ready(&mut s, &mut buf);
        assert!(msgs.iter().any(|m| matches!(m, backend::Message::DataRow(_))), "IDENTIFY_SYSTEM answered no row");
    };
    identify_over_tls();

    // A replication client without TLS: PostgreSQL's FATAL error, SQLSTATE 28000.
    let mut s = connect();
    startup(&mut s);
    let msgs = until_ready(&mut s, &mut BytesMut::new());
    let (code, message) = error_fields(msgs.last().unwrap());
    assert_eq!(code, "28000");
    assert!(message.contains("SSL required") && message.contains("sslmode=verify-full"), "{message}");

    // A proposer without TLS: the proposer protocol's Error.
    let mut s = connect();
    let mut out = BytesMut::new();
    ProposerMessage::Hello {
        protocol_version: PROTOCOL_VERSION,
        tenant: t,
        timeline: tl,
        system_id: 7,
        wal_segment_size: 16 << 20,
        name: "plaintext".into(),
        auth_token: String::new(),
    }
    .encode(&mut out);
    s.write_all(&out).unwrap();
    let mut buf = BytesMut::new();
    let reply = loop {
        if let Some(m) = AcceptorMessage::decode(&mut buf).unwrap() {
            break m;
        }
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "closed without a reason");
        buf.extend_from_slice(&chunk[..n]);
    };
    let AcceptorMessage::Error { message } = reply else { panic!("not refused: {reply:?}") };
    assert!(message.contains("accepts only TLS connections"), "{message}");

    // A client that trusts another CA: the handshake fails, and the safekeeper counts it.
    let other = tempfile::tempdir().unwrap();
    tls::ca::Ca::create(other.path()).unwrap();
    let other = tls::ClientTls::load(&other.path().join("ca.crt")).unwrap();
    let e = tls::pg::connect(&other, connect(), "127.0.0.1").err().unwrap().to_string();
    assert!(e.contains("not signed by the cluster CA"), "{e}");

    let failures = |reason: &str| sk.metrics.tls_handshake_failures.with_label_values(&[reason]).get();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while failures("plaintext") < 2 || failures("handshake") < 1 {
        assert!(std::time::Instant::now() < deadline, "refusals not counted: {} {}", failures("plaintext"), failures("handshake"));
        std::thread::sleep(Duration::from_millis(10));
    }
    // Still serving.
    identify_over_tls();
    let _ = stop_tx.send(());
    rt.block_on(server).unwrap().unwrap();
}
