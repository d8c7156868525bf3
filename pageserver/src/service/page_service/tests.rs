//! The page service over real TCP on loopback, against a small timeline built with
//! `Modification` (pages are images, so no WAL redo process is needed).

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use proto::pagestream::{ErrorCode, ReadLsns, Request, Response, PROTOCOL_VERSION};
use proto::{BlockNumber, ForkNumber, Key, Lsn, RelTag, SlruKind, TenantId, TimelineId};

use super::*;
use crate::pgdata::datadir::codec::{DbEntry, RelEntry};
use crate::pgdata::datadir::Modification;
use crate::pgdata::reconstruct::PgReconstructor;
use layerstore::StorageConfig;

const TENANT: TenantId = TenantId([1; 16]);
const TIMELINE: TimelineId = TimelineId([2; 16]);

fn rel(relnode: u32) -> RelTag {
    RelTag { spcnode: 1663, dbnode: 5, relnode, forknum: ForkNumber::Main }
}

fn page(fill: u8) -> Bytes {
    Bytes::from(vec![fill; 8192])
}

struct Fixture {
    _dir: tempfile::TempDir,
    _tenant: Arc<Tenant>,
    handle: Option<PageServiceHandle>,
    reads: Arc<Reads>,
    registry: Arc<TenantRegistry>,
}

/// Records the cost of every page the service reports.
#[derive(Default)]
struct Reads(std::sync::Mutex<Vec<ReadCost>>);

impl ReadObserver for Reads {
    fn page_read(&self, cost: ReadCost, _took: std::time::Duration) {
        self.0.lock().unwrap().push(cost);
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            h.shutdown();
        }
    }
}

/// Relation 16384 has two blocks at 0/100; block 0 is rewritten at 0/200.
fn start() -> Fixture {
    start_with(|s| s)
}

fn start_with(configure: impl FnOnce(PageService) -> PageService) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let tenant = Arc::new(Tenant::create(dir.path(), TENANT, StorageConfig::default(), &[]).unwrap());
    let t = tenant.create_timeline(TIMELINE).unwrap();
    let mut m = Modification::new(&t, Lsn(0x100));
    m.put_db_dir(&[DbEntry { spcnode: 1663, dbnode: 5 }].into());
    m.put_rel_dir(1663, 5, &[RelEntry { relnode: 16384, forknum: ForkNumber::Main }].into());
    m.put_rel_size(rel(16384), 2);
    m.put_image(Key::rel_block(rel(16384), BlockNumber(0)), page(1));
    m.put_image(Key::rel_block(rel(16384), BlockNumber(1)), page(2));
    m.put_slru_dir(SlruKind::Clog, &BTreeSet::from([0]));
    m.put_slru_segment_size(SlruKind::Clog, 0, 1);
    m.put_image(Key::slru_block(SlruKind::Clog, 0, BlockNumber(0)), page(9));
    m.commit().unwrap();
    let mut m = Modification::new(&t, Lsn(0x200));
    m.put_image(Key::rel_block(rel(16384), BlockNumber(0)), page(3));
    m.commit().unwrap();

    let registry = Arc::new(TenantRegistry::default());
    registry.insert(Arc::clone(&tenant));
    let reads = Arc::new(Reads::default());
    let service = PageService::new(Arc::clone(&registry), Arc::new(PgReconstructor::rust_only()), Duration::from_millis(300));
    let service = Arc::new(configure(service.with_observer(reads.clone())));
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let handle = service.start(listener).unwrap();
    Fixture { _dir: dir, _tenant: tenant, handle: Some(handle), reads, registry }
}

/// A `Hello` of this protocol version for `tenant`'s test timeline.
fn hello(tenant: TenantId, auth_token: String) -> Request {
    Request::Hello { protocol_version: PROTOCOL_VERSION, tenant, timeline: TIMELINE, auth_token }
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

struct Client {
    stream: Box<dyn ReadWrite>,
    buf: Vec<u8>,
}

impl Client {
    fn tcp(f: &Fixture) -> TcpStream {
        let stream = TcpStream::connect(f.handle.as_ref().unwrap().addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        stream
    }

    fn connect(f: &Fixture) -> Client {
        Client { stream: Box::new(Client::tcp(f)), buf: Vec::new() }
    }

    /// A TLS connection that trusts `ca` and expects a certificate for `host`.
    fn connect_tls(f: &Fixture, ca: &tls::ClientTls, host: &str) -> Result<Client, tls::ConnectError> {
        let stream = ca.connect(Client::tcp(f), host)?;
        Ok(Client { stream: Box::new(stream), buf: Vec::new() })
    }

    fn send(&mut self, req: &Request) {
        let mut out = Vec::new();
        req.encode(&mut out);
        self.stream.write_all(&out).unwrap();
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    fn recv(&mut self) -> Option<Response> {
        loop {
            match Response::decode(&self.buf) {
                Ok((resp, used)) => {
                    self.buf.drain(..used);
                    return Some(resp);
                }
                Err(proto::pagestream::PagestreamError::Incomplete { .. }) => {}
                Err(e) => panic!("bad response: {e}"),
            }
            let mut chunk = [0u8; 16384];
            let n = match self.stream.read(&mut chunk) {
                Ok(n) => n,
                // A TLS peer that closes without close_notify.
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => 0,
                Err(e) => panic!("read: {e}"),
            };
            if n == 0 {
                return None;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn hello(f: &Fixture) -> Client {
        Client::connect(f).say_hello()
    }

    fn say_hello(mut self) -> Client {
        let c = &mut self;
        c.send(&Request::Hello { protocol_version: PROTOCOL_VERSION, tenant: TENANT, timeline: TIMELINE, auth_token: String::new() });
        assert_eq!(c.recv(), Some(Response::HelloOk { protocol_version: PROTOCOL_VERSION }));
        self
    }
}

fn lsns(request: u64, nms: u64) -> ReadLsns {
    ReadLsns { request_lsn: Lsn(request), not_modified_since: Lsn(nms) }
}

#[test]
fn serves_pages_sizes_and_slru_at_an_lsn() {
    let f = start();
    let mut c = Client::hello(&f);
    c.send(&Request::GetPage { id: 1, lsns: lsns(0x180, 0x100), rel: rel(16384), blkno: BlockNumber(0) });
    assert_eq!(c.recv(), Some(Response::Page { id: 1, page: page(1).to_vec() }));
    c.send(&Request::GetPage { id: 2, lsns: lsns(0x200, 0x200), rel: rel(16384), blkno: BlockNumber(0) });
    assert_eq!(c.recv(), Some(Response::Page { id: 2, page: page(3).to_vec() }));
    c.send(&Request::Nblocks { id: 3, lsns: lsns(0x200, 0x100), rel: rel(16384) });
    assert_eq!(c.recv(), Some(Response::Nblocks { id: 3, nblocks: 2 }));
    c.send(&Request::Exists { id: 4, lsns: lsns(0x200, 0x100), rel: rel(99) });
    assert_eq!(c.recv(), Some(Response::Exists { id: 4, exists: false }));
    c.send(&Request::DbSize { id: 5, lsns: lsns(0x200, 0x100), spcnode: 1663, dbnode: 5 });
    assert_eq!(c.recv(), Some(Response::DbSize { id: 5, size_bytes: 2 * 8192 }));
    c.send(&Request::GetSlruSegment { id: 6, lsns: lsns(0x200, 0x100), kind: SlruKind::Clog, segno: 0 });
    assert_eq!(c.recv(), Some(Response::SlruSegment { id: 6, data: page(9).to_vec() }));
    // Only the two pages served were reported: each an image in the open layer.
    let image = ReadCost { layers_visited: 1, records_replayed: 0, newest_record_lsn: None };
    assert_eq!(*f.reads.0.lock().unwrap(), [image, image]);
}

#[test]
fn a_connection_whose_tenant_was_detached_is_refused_its_next_reads_and_closed() {
    let f = start();
    let mut c = Client::hello(&f);
    let get = |id| Request::GetPage { id, lsns: lsns(0x200, 0x200), rel: rel(16384), blkno: BlockNumber(1) };
    c.send(&get(1));
    assert_eq!(c.recv(), Some(Response::Page { id: 1, page: page(2).to_vec() }));
    // Detached (moved elsewhere) after the Hello: the open connection must not go on
    // reading from the timeline it holds.
    let tenant = f.registry.remove(TENANT).expect("registered");
    c.send(&get(2));
    match c.recv() {
        Some(Response::Error { id: 2, code: ErrorCode::NotFound, message }) => assert!(message.contains("no longer served"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(c.recv(), None, "the connection is closed");
    // Attached again: a new connection is served.
    f.registry.insert(tenant);
    let mut c = Client::hello(&f);
    c.send(&get(3));
    assert_eq!(c.recv(), Some(Response::Page { id: 3, page: page(2).to_vec() }));
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let f = start();
    let mut c = Client::hello(&f);
    let mut batch = Vec::new();
    for id in 1..=200u64 {
        Request::GetPage { id, lsns: lsns(0x200, 0x100), rel: rel(16384), blkno: BlockNumber((id % 2) as u32) }.encode(&mut batch);
    }
    c.send_raw(&batch);
    for id in 1..=200u64 {
        let want = if id % 2 == 0 { page(3) } else { page(2) };
        assert_eq!(c.recv(), Some(Response::Page { id, page: want.to_vec() }));
    }
}

#[test]
fn a_request_ahead_of_ingest_waits_only_for_not_modified_since() {
    let f = start();
    let mut c = Client::hello(&f);
    // The compute is at 0/900 but promises the page did not change after 0/100: no wait.
    c.send(&Request::GetPage { id: 1, lsns: lsns(0x900, 0x100), rel: rel(16384), blkno: BlockNumber(1) });
    assert_eq!(c.recv(), Some(Response::Page { id: 1, page: page(2).to_vec() }));
    // Promising only 0/900 means waiting for WAL that never comes: a timeout, named.
    c.send(&Request::GetPage { id: 2, lsns: lsns(0x900, 0x900), rel: rel(16384), blkno: BlockNumber(1) });
    match c.recv() {
        Some(Response::Error { id: 2, code: ErrorCode::LsnTimeout, message }) => {
            assert!(message.contains("0/900"), "{message}")
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    // The connection is still usable.
    c.send(&Request::Nblocks { id: 3, lsns: lsns(0x200, 0x100), rel: rel(16384) });
    assert_eq!(c.recv(), Some(Response::Nblocks { id: 3, nblocks: 2 }));
}

#[test]
fn errors_name_what_is_wrong_and_keep_the_connection() {
    let f = start();
    let mut c = Client::hello(&f);
    c.send(&Request::GetPage { id: 7, lsns: lsns(0x200, 0x100), rel: rel(16384), blkno: BlockNumber(5) });
    match c.recv() {
        Some(Response::Error { id: 7, code: ErrorCode::NoSuchBlock, message }) => {
            assert!(message.contains("block 5") && message.contains("2 blocks"), "{message}")
        }
        other => panic!("expected no such block, got {other:?}"),
    }
    c.send(&Request::GetPage { id: 8, lsns: lsns(0x200, 0x100), rel: rel(16384), blkno: BlockNumber(1) });
    assert_eq!(c.recv(), Some(Response::Page { id: 8, page: page(2).to_vec() }));
}

#[test]
fn bad_handshakes_and_malformed_messages_are_refused() {
    let f = start();
    // Unknown tenant.
    let mut c = Client::connect(&f);
    c.send(&hello(TenantId([9; 16]), String::new()));
    match c.recv() {
        Some(Response::Error { code: ErrorCode::NotFound, message, .. }) => {
            assert!(message.contains("0909"), "names the tenant: {message}")
        }
        other => panic!("expected not found, got {other:?}"),
    }
    assert_eq!(c.recv(), None, "the connection is closed");

    // Wrong protocol version.
    let mut c = Client::connect(&f);
    c.send(&Request::Hello { protocol_version: 99, tenant: TENANT, timeline: TIMELINE, auth_token: String::new() });
    match c.recv() {
        Some(Response::Error { code: ErrorCode::Protocol, message, .. }) => assert!(message.contains("99"), "{message}"),
        other => panic!("expected a protocol error, got {other:?}"),
    }

    // A request before Hello.
    let mut c = Client::connect(&f);
    c.send(&Request::Nblocks { id: 1, lsns: lsns(0x200, 0x100), rel: rel(16384) });
    assert!(matches!(c.recv(), Some(Response::Error { code: ErrorCode::Protocol, .. })));

    // A second Hello closes the connection.
    let mut c = Client::hello(&f);
    c.send(&Request::Hello { protocol_version: PROTOCOL_VERSION, tenant: TENANT, timeline: TIMELINE, auth_token: String::new() });
    assert!(matches!(c.recv(), Some(Response::Error { id: 0, code: ErrorCode::Protocol, .. })));
    assert_eq!(c.recv(), None);

    // Garbage after a good handshake: a protocol error, then the connection closes, and
    // the service goes on serving others.
    let mut c = Client::hello(&f);
    c.send_raw(b"z\0\0\0\x01!");
    match c.recv() {
        Some(Response::Error { code: ErrorCode::Protocol, message, .. }) => {
            assert!(message.contains("unrecognized page service message tag: 122"), "{message}")
        }
        other => panic!("expected a protocol error, got {other:?}"),
    }
    assert_eq!(c.recv(), None);
    let mut c = Client::hello(&f);
    c.send(&Request::Nblocks { id: 1, lsns: lsns(0x200, 0x100), rel: rel(16384) });
    assert_eq!(c.recv(), Some(Response::Nblocks { id: 1, nblocks: 2 }));
}

#[test]
fn with_authentication_a_hello_needs_a_token_for_its_timeline() {
    let keys = tempfile::tempdir().unwrap();
    let (private, public) = auth::generate_key_pair(keys.path()).unwrap();
    let signer = auth::Signer::load(&private).unwrap();
    let verifier = Arc::new(auth::Verifier::load(&public).unwrap());
    let refusals = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = Arc::clone(&refusals);
    let f = start_with(move |s| s.with_auth(verifier, Arc::new(move |reason| seen.lock().unwrap().push(reason))));
    let handshake = |token: String| {
        let mut c = Client::connect(&f);
        c.send(&hello(TENANT, token));
        let answer = c.recv();
        (c, answer)
    };

    for (token, reason) in [
        (String::new(), "missing"),
        ("x.y.z".to_string(), "malformed"),
        (signer.sign(&auth::Claims::tenant(TenantId([7; 16]))), "wrong_tenant"),
        (signer.sign(&auth::Claims::tenant(TENANT).with_timeline(TimelineId([7; 16]))), "wrong_timeline"),
        (signer.sign(&auth::Claims::storage()), "forbidden"),
    ] {
        let (mut c, answer) = handshake(token);
        match answer {
            Some(Response::Error { id: 0, code: ErrorCode::Unauthorized, message }) => {
                assert!(!message.is_empty(), "{reason}: the refusal says why")
            }
            other => panic!("{reason}: expected Unauthorized, got {other:?}"),
        }
        assert_eq!(c.recv(), None, "{reason}: the connection is closed");
        assert_eq!(refusals.lock().unwrap().last().copied(), Some(reason));
    }
    // A refused client learns nothing about which tenants exist: same answer for an unknown one.
    let mut c = Client::connect(&f);
    c.send(&hello(TenantId([9; 16]), String::new()));
    assert!(matches!(c.recv(), Some(Response::Error { code: ErrorCode::Unauthorized, .. })));

    for claims in [auth::Claims::tenant(TENANT), auth::Claims::tenant(TENANT).with_timeline(TIMELINE), auth::Claims::admin()] {
        let (mut c, answer) = handshake(signer.sign(&claims));
        assert_eq!(answer, Some(Response::HelloOk { protocol_version: PROTOCOL_VERSION }), "{claims:?}");
        c.send(&Request::GetPage { id: 1, lsns: lsns(0x200, 0x100), rel: rel(16384), blkno: BlockNumber(1) });
        assert_eq!(c.recv(), Some(Response::Page { id: 1, page: page(2).to_vec() }));
    }
}

/// A cluster CA and the pageserver's certificate for `localhost` and 127.0.0.1.
struct Certs {
    _dir: tempfile::TempDir,
    server: tls::ServerTls,
    client: tls::ClientTls,
}

fn make_certs() -> Certs {
    let dir = tempfile::tempdir().unwrap();
    let ca = tls::ca::Ca::create(dir.path()).unwrap();
    let (cert, key) = (dir.path().join("pageserver.crt"), dir.path().join("pageserver.key"));
    let hosts = ["localhost".to_string(), "127.0.0.1".to_string()];
    ca.issue_to_files("pageserver", &hosts, Duration::from_secs(3600), &cert, &key).unwrap();
    let server = tls::ServerTls::load(&cert, &key).unwrap();
    let client = tls::ClientTls::load(&dir.path().join("ca.crt")).unwrap();
    Certs { _dir: dir, server, client }
}

type Refusals = Arc<std::sync::Mutex<Vec<&'static str>>>;

fn start_tls(certs: &Certs) -> (Fixture, Refusals) {
    let refusals: Refusals = Arc::default();
    let seen = Arc::clone(&refusals);
    let config = certs.server.config();
    let f = start_with(move |s| s.with_tls(config, Arc::new(move |reason| seen.lock().unwrap().push(reason))));
    (f, refusals)
}

/// Waits (up to 10 s) until the service has counted `n` refusals; the connection's thread
/// counts after the client has already seen the end of its connection.
fn refusals_reach(refusals: &Refusals, n: usize) -> Vec<&'static str> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let seen = refusals.lock().unwrap().clone();
        if seen.len() >= n || std::time::Instant::now() > deadline {
            return seen;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn with_tls_requests_are_served_over_it_and_a_plaintext_client_is_told_why_it_is_refused() {
    let certs = make_certs();
    let (f, refusals) = start_tls(&certs);
    for host in ["127.0.0.1", "localhost"] {
        let mut c = Client::connect_tls(&f, &certs.client, host).unwrap().say_hello();
        c.send(&Request::GetPage { id: 1, lsns: lsns(0x200, 0x100), rel: rel(16384), blkno: BlockNumber(0) });
        assert_eq!(c.recv(), Some(Response::Page { id: 1, page: page(3).to_vec() }));
    }

    // A client without TLS gets an error it can read, in its own protocol, then the end.
    let mut c = Client::connect(&f);
    c.send(&hello(TENANT, String::new()));
    match c.recv() {
        Some(Response::Error { id: 0, code: ErrorCode::Protocol, message }) => assert_eq!(message, TLS_REQUIRED),
        other => panic!("expected the TLS-required error, got {other:?}"),
    }
    assert_eq!(c.recv(), None, "the connection is closed");
    assert_eq!(refusals_reach(&refusals, 1), ["plaintext"]);

    // Pipelined requests over TLS (a readahead window) are answered in order, and the
    // service went on serving.
    let mut c = Client::connect_tls(&f, &certs.client, "127.0.0.1").unwrap().say_hello();
    let mut batch = Vec::new();
    for id in 1..=200u64 {
        Request::GetPage { id, lsns: lsns(0x200, 0x100), rel: rel(16384), blkno: BlockNumber((id % 2) as u32) }.encode(&mut batch);
    }
    c.send_raw(&batch);
    for id in 1..=200u64 {
        let want = if id % 2 == 0 { page(3) } else { page(2) };
        assert_eq!(c.recv(), Some(Response::Page { id, page: want.to_vec() }));
    }
}

#[test]
fn with_tls_a_client_of_another_ca_or_expecting_another_host_is_refused() {
    let certs = make_certs();
    let (f, refusals) = start_tls(&certs);

    let other = make_certs();
    match Client::connect_tls(&f, &other.client, "127.0.0.1") {
        Err(e @ tls::ConnectError::UnknownCa { .. }) => assert!(e.to_string().contains("not signed by the cluster CA"), "{e}"),
        Err(e) => panic!("expected an unknown CA, got {e}"),
        Ok(_) => panic!("a client of another CA was served"),
    }
    match Client::connect_tls(&f, &certs.client, "pageserver-2.example") {
        Err(e @ tls::ConnectError::WrongHost { .. }) => assert!(e.to_string().contains("pageserver-2.example"), "{e}"),
        Err(e) => panic!("expected a certificate for another host, got {e}"),
        Ok(_) => panic!("a client expecting another host was served"),
    }
    // The client's refusal of the certificate ends the handshake on the server too, counted
    // (as the client closing mid-handshake: rustls's client sends its alert, and the server
    // sees the connection end).
    let seen = refusals_reach(&refusals, 2);
    assert!(seen.len() == 2 && seen.iter().all(|r| ["handshake", "closed"].contains(r)), "{seen:?}");

    let mut c = Client::connect_tls(&f, &certs.client, "localhost").unwrap().say_hello();
    c.send(&Request::Nblocks { id: 1, lsns: lsns(0x200, 0x100), rel: rel(16384) });
    assert_eq!(c.recv(), Some(Response::Nblocks { id: 1, nblocks: 2 }));
}

#[test]
fn a_client_that_sends_nothing_is_closed_after_the_handshake_timeout() {
    let certs = make_certs();
    let refusals: Refusals = Arc::default();
    let seen = Arc::clone(&refusals);
    let config = certs.server.config();
    let quick = Duration::from_millis(300);
    let tls = start_with(move |s| s.with_tls(config, Arc::new(move |r| seen.lock().unwrap().push(r))).with_handshake_timeout(quick));
    let plain = start_with(move |s| s.with_handshake_timeout(quick));
    for f in [&tls, &plain] {
        let mut silent = Client::connect(f);
        let started = std::time::Instant::now();
        assert_eq!(silent.recv(), None, "the service closes the connection");
        assert!(started.elapsed() < Duration::from_secs(5), "closed after {:?}", started.elapsed());
    }
    assert_eq!(refusals_reach(&refusals, 1), ["timeout"]);
    // After a TLS handshake, the Hello is due within the same time.
    let mut c = Client::connect_tls(&tls, &certs.client, "127.0.0.1").unwrap();
    assert_eq!(c.recv(), None, "closed without a Hello");
    // A connection that said Hello may then stay idle for longer.
    let mut c = Client::connect_tls(&tls, &certs.client, "127.0.0.1").unwrap().say_hello();
    std::thread::sleep(quick * 2);
    c.send(&Request::Nblocks { id: 1, lsns: lsns(0x200, 0x100), rel: rel(16384) });
    assert_eq!(c.recv(), Some(Response::Nblocks { id: 1, nblocks: 2 }));
}

/// Records every page handed to the writeback.
#[derive(Default)]
struct Rebuilt(std::sync::Mutex<Vec<(RelTag, BlockNumber, ReadCost, Bytes)>>);

impl ReadWriteback for Rebuilt {
    fn page_rebuilt(&self, timeline: &Timeline, rel: RelTag, blkno: BlockNumber, cost: ReadCost, page: &Bytes) {
        assert_eq!(timeline.timeline_id(), TIMELINE);
        self.0.lock().unwrap().push((rel, blkno, cost, page.clone()));
    }
}

#[test]
fn every_page_served_is_handed_to_the_writeback_with_its_cost() {
    let rebuilt = Arc::new(Rebuilt::default());
    let r = Arc::clone(&rebuilt);
    let f = start_with(move |s| s.with_writeback(r));
    let mut c = Client::hello(&f);
    c.send(&Request::GetPage { id: 1, lsns: lsns(0x200, 0x100), rel: rel(16384), blkno: BlockNumber(1) });
    assert_eq!(c.recv(), Some(Response::Page { id: 1, page: page(2).to_vec() }));
    c.send(&Request::Nblocks { id: 2, lsns: lsns(0x200, 0x100), rel: rel(16384) });
    assert_eq!(c.recv(), Some(Response::Nblocks { id: 2, nblocks: 2 }));
    let cost = ReadCost { layers_visited: 1, records_replayed: 0, newest_record_lsn: None };
    assert_eq!(*rebuilt.0.lock().unwrap(), [(rel(16384), BlockNumber(1), cost, page(2))], "pages only, as served");
}
