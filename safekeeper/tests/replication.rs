//! The replication protocol (`safekeeper::replication`) over real loopback sockets, against
//! real WAL (the fixture PostgreSQL 15 wrote for `pgwal`'s tests).
//!
//! The timeline is an in-memory [`WalSource`] holding that WAL (the protocol code is generic
//! over it; the real storage is tested in `storage.rs` and `service.rs`). The clients are `postgres-protocol`'s
//! frontend encoder and backend parser, and PostgreSQL's own `pg_receivewal`, whose segment
//! files must come out byte for byte equal to the WAL served. With authentication on, the
//! cleartext password exchange with tokens of every kind.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use fallible_iterator::FallibleIterator;
use pgwal::{DecoderConfig, WalStreamDecoder};
use postgres_protocol::message::{backend, frontend};
use proto::{Lsn, TenantId, TimelineId};
use quorum::wire::PageserverFeedback;
use safekeeper::replication::{serve_with_config, Config, WalSource};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

const SEGMENT: u64 = 16 * 1024 * 1024;

struct Fixture {
    start: Lsn,
    end: Lsn,
    system_id: u64,
    wal: Vec<u8>,
}

fn fixture() -> Fixture {
    let dir = manifest_dir().join("../pgwal/tests/data").display().to_string();
    let env = std::fs::read_to_string(format!("{dir}/fixture.env")).expect("read fixture.env");
    let vars: BTreeMap<&str, &str> = env.lines().filter_map(|l| l.split_once('=')).collect();
    let wal = zstd::decode_all(&std::fs::read(format!("{dir}/wal.bin.zst")).expect("read wal.bin.zst")[..]).expect("unzstd");
    let f = Fixture {
        start: vars["START_LSN"].parse().unwrap(),
        end: vars["END_LSN"].parse().unwrap(),
        system_id: vars["SYSTEM_ID"].parse().unwrap(),
        wal,
    };
    assert!(f.wal.len() as u64 >= f.end.0 - f.start.0);
    assert!(f.end.0 > f.start.0 + SEGMENT, "the fixture must cross a segment boundary");
    f
}

/// The storage test double: WAL in memory from `start`, a commit LSN watch, and a range
/// that reads as corrupt.
struct MemWal {
    system_id: u64,
    segment_bytes: u64,
    start: Lsn,
    wal: Vec<u8>,
    commit: watch::Sender<Lsn>,
    corrupt: Mutex<Option<Lsn>>,
    feedback: Mutex<Vec<PageserverFeedback>>,
    /// WAL below this was removed (the beginning moves up to it).
    removed_below: Mutex<Lsn>,
    remote_consistent: Mutex<Vec<(u32, Lsn)>>,
    /// Hot standby feedback (xmin, catalog xmin) as recorded, and disconnections, by client.
    hot_standby: Mutex<Vec<(String, u64, u64)>>,
    disconnected: Mutex<Vec<String>>,
}

impl MemWal {
    fn new(f: &Fixture, commit: Lsn) -> Arc<MemWal> {
        MemWal::with_wal(f.system_id, SEGMENT, f.start, f.wal[..(f.end.0 - f.start.0) as usize].to_vec(), commit)
    }
    /// Any WAL (`wal` from `start`, in segments of `segment_bytes`).
    fn with_wal(system_id: u64, segment_bytes: u64, start: Lsn, wal: Vec<u8>, commit: Lsn) -> Arc<MemWal> {
        Arc::new(MemWal {
            system_id,
            segment_bytes,
            start,
            wal,
            commit: watch::channel(commit).0,
            corrupt: Mutex::new(None),
            feedback: Mutex::new(Vec::new()),
            removed_below: Mutex::new(Lsn(0)),
            remote_consistent: Mutex::new(Vec::new()),
            hot_standby: Mutex::new(Vec::new()),
            disconnected: Mutex::new(Vec::new()),
        })
    }
    fn bytes(&self, from: Lsn, to: Lsn) -> &[u8] {
        &self.wal[(from.0 - self.start.0) as usize..(to.0 - self.start.0) as usize]
    }
    fn last_feedback(&self) -> Option<PageserverFeedback> {
        self.feedback.lock().unwrap().last().copied()
    }
}

impl WalSource for MemWal {
    fn system_id(&self) -> u64 {
        self.system_id
    }
    fn wal_segment_size(&self) -> u32 {
        self.segment_bytes as u32
    }
    fn wal_begin_lsn(&self) -> Lsn {
        self.start.max(*self.removed_below.lock().unwrap())
    }
    fn commit_lsn(&self) -> Lsn {
        *self.commit.borrow()
    }
    fn commit_lsn_watch(&self) -> watch::Receiver<Lsn> {
        self.commit.subscribe()
    }
    fn read_wal_verified(&self, from: Lsn, to: Lsn) -> anyhow::Result<Bytes> {
        assert!(self.start <= from && from < to && to <= self.commit_lsn(), "read {from}..{to} outside the committed WAL");
        if from < self.wal_begin_lsn() {
            // As the real storage refuses it.
            anyhow::bail!("cannot read WAL {from}..{to}: this safekeeper has WAL {}..", self.wal_begin_lsn());
        }
        assert_eq!(from.0 / self.segment_bytes, (to.0 - 1) / self.segment_bytes, "read {from}..{to} crosses a segment");
        if let Some(bad) = *self.corrupt.lock().unwrap() {
            if from <= bad && bad < to {
                anyhow::bail!("CRC mismatch in WAL segment 000000010000000000000002 at {bad}");
            }
        }
        Ok(Bytes::copy_from_slice(self.bytes(from, to)))
    }
    fn set_standby_feedback(&self, _client: &str, feedback: PageserverFeedback) {
        self.feedback.lock().unwrap().push(feedback);
    }
    fn set_remote_consistent_lsn(&self, generation: u32, lsn: Lsn) -> safekeeper::timeline::RemoteReport {
        self.remote_consistent.lock().unwrap().push((generation, lsn));
        safekeeper::timeline::RemoteReport::Taken
    }
    fn set_hot_standby_feedback(&self, client: &str, xmin: u64, catalog_xmin: u64) {
        self.hot_standby.lock().unwrap().push((client.to_string(), xmin, catalog_xmin));
    }
    fn standby_disconnected(&self, client: &str) {
        self.disconnected.lock().unwrap().push(client.to_string());
    }
}

struct Server {
    addr: SocketAddr,
    tenant: TenantId,
    timeline: TimelineId,
    /// The result of each connection, as it ends.
    results: mpsc::UnboundedReceiver<anyhow::Result<()>>,
}

impl Server {
    fn database(&self) -> String {
        format!("{}/{}", self.tenant, self.timeline)
    }
    async fn next_result(&mut self) -> anyhow::Result<()> {
        tokio::time::timeout(Duration::from_secs(10), self.results.recv()).await.expect("a connection ends").expect("server runs")
    }
}

async fn server(src: Arc<MemWal>, config: Config) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let tenant: TenantId = "11111111111111111111111111111111".parse().unwrap();
    let timeline: TimelineId = "22222222222222222222222222222222".parse().unwrap();
    let (tx, results) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let (src, tx, config) = (Arc::clone(&src), tx.clone(), config.clone());
            tokio::spawn(async move {
                let lookup = move |t: TenantId, tl: TimelineId| {
                    if (t, tl) == (tenant, timeline) {
                        Ok(Arc::clone(&src))
                    } else {
                        Err(anyhow::anyhow!("no such timeline here"))
                    }
                };
                let _ = tx.send(serve_with_config(stream, lookup, config).await);
            });
        }
    });
    Server { addr, tenant, timeline, results }
}

enum Msg {
    Backend(backend::Message),
    CopyBoth,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use backend::Message as M;
        match self {
            Msg::CopyBoth => write!(f, "CopyBothResponse"),
            Msg::Backend(M::ErrorResponse(e)) => write!(f, "ErrorResponse({:?})", pg_err(e)),
            Msg::Backend(M::CopyData(d)) => write!(f, "CopyData({:?}, {} bytes)", d.data().first().map(|&b| b as char), d.data().len()),
            Msg::Backend(M::CommandComplete(c)) => write!(f, "CommandComplete({:?})", c.tag().ok()),
            Msg::Backend(M::ParameterStatus(p)) => write!(f, "ParameterStatus({:?})", p.name().ok()),
            Msg::Backend(M::AuthenticationOk) => write!(f, "AuthenticationOk"),
            Msg::Backend(M::ReadyForQuery(_)) => write!(f, "ReadyForQuery"),
            Msg::Backend(M::RowDescription(_)) => write!(f, "RowDescription"),
            Msg::Backend(M::DataRow(_)) => write!(f, "DataRow"),
            Msg::Backend(M::EmptyQueryResponse) => write!(f, "EmptyQueryResponse"),
            Msg::Backend(M::CopyDone) => write!(f, "CopyDone"),
            Msg::Backend(M::BackendKeyData(_)) => write!(f, "BackendKeyData"),
            Msg::Backend(_) => write!(f, "another backend message"),
        }
    }
}

#[derive(Debug, PartialEq)]
struct PgErr {
    severity: String,
    code: String,
    message: String,
}

fn pg_err(body: &backend::ErrorResponseBody) -> PgErr {
    let mut e = PgErr { severity: String::new(), code: String::new(), message: String::new() };
    let mut fields = body.fields();
    while let Some(f) = fields.next().unwrap() {
        let value = String::from_utf8_lossy(f.value_bytes()).into_owned();
        match f.type_() {
            b'S' => e.severity = value,
            b'C' => e.code = value,
            b'M' => e.message = value,
            _ => {}
        }
    }
    e
}

struct Client {
    s: TcpStream,
    buf: BytesMut,
}

impl Client {
    async fn raw(addr: SocketAddr) -> Client {
        Client { s: TcpStream::connect(addr).await.unwrap(), buf: BytesMut::new() }
    }

    async fn connect(addr: SocketAddr, params: &[(&str, &str)]) -> Client {
        let mut c = Client::raw(addr).await;
        c.send(|b| frontend::startup_message(params.iter().copied(), b).unwrap()).await;
        c
    }

    /// Connects as the pageserver does and waits for ReadyForQuery.
    async fn ready(server: &Server) -> Client {
        let db = server.database();
        let mut c =
            Client::connect(server.addr, &[("user", "ps"), ("replication", "true"), ("application_name", "test"), ("database", &db)]).await;
        let msgs = c.until_ready().await;
        assert!(matches!(msgs[0], Msg::Backend(backend::Message::AuthenticationOk)), "{msgs:?}");
        let params: BTreeMap<String, String> = msgs
            .iter()
            .filter_map(|m| match m {
                Msg::Backend(backend::Message::ParameterStatus(p)) => Some((p.name().unwrap().into(), p.value().unwrap().into())),
                _ => None,
            })
            .collect();
        assert!(params["server_version"].starts_with("15"));
        assert_eq!(params["integer_datetimes"], "on");
        assert_eq!(params["server_encoding"], "UTF8");
        // How a pageserver tells a safekeeper from a PostgreSQL walsender.
        assert_eq!(params["fjord.safekeeper"], "2");
        assert!(msgs.iter().any(|m| matches!(m, Msg::Backend(backend::Message::BackendKeyData(_)))));
        c
    }

    async fn send(&mut self, f: impl FnOnce(&mut BytesMut)) {
        let mut out = BytesMut::new();
        f(&mut out);
        self.s.write_all(&out).await.unwrap();
    }

    async fn send_raw(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).await.unwrap();
    }

    /// The next message, `None` once the server closed the connection.
    async fn recv(&mut self) -> Option<Msg> {
        loop {
            if self.buf.len() >= 5 && self.buf[0] == b'W' {
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
                if self.buf.len() > len {
                    assert_eq!(&self.buf[5..1 + len], &[0, 0, 0], "CopyBothResponse: binary, no columns");
                    self.buf.advance(1 + len);
                    return Some(Msg::CopyBoth);
                }
            } else if let Some(m) = backend::Message::parse(&mut self.buf).unwrap() {
                return Some(Msg::Backend(m));
            }
            let n = tokio::time::timeout(Duration::from_secs(10), self.s.read_buf(&mut self.buf))
                .await
                .expect("the server answers within 10 s")
                .unwrap_or(0);
            if n == 0 {
                assert!(self.buf.is_empty(), "the server closed in the middle of a message");
                return None;
            }
        }
    }

    async fn until_ready(&mut self) -> Vec<Msg> {
        let mut msgs = Vec::new();
        loop {
            let m = self.recv().await.expect("ReadyForQuery before the connection closes");
            if matches!(m, Msg::Backend(backend::Message::ReadyForQuery(_))) {
                return msgs;
            }
            msgs.push(m);
        }
    }

    /// Runs a query: its rows (text) and column types, or its error.
    async fn query(&mut self, q: &str) -> Result<(Vec<(String, u32)>, Vec<Vec<Option<String>>>), PgErr> {
        self.send(|b| frontend::query(q, b).unwrap()).await;
        let mut cols = Vec::new();
        let mut rows = Vec::new();
        let mut err = None;
        for m in self.until_ready().await {
            match m {
                Msg::Backend(backend::Message::RowDescription(d)) => {
                    cols = d.fields().map(|f| Ok((f.name().to_string(), f.type_oid()))).collect().unwrap();
                }
                Msg::Backend(backend::Message::DataRow(r)) => {
                    let buf = r.buffer();
                    rows.push(r.ranges().map(|x| Ok(x.map(|x| String::from_utf8(buf[x].to_vec()).unwrap()))).collect().unwrap());
                }
                Msg::Backend(backend::Message::ErrorResponse(e)) => err = Some(pg_err(&e)),
                _ => {}
            }
        }
        match err {
            Some(e) => Err(e),
            None => Ok((cols, rows)),
        }
    }

    /// Expects a FATAL error and then the end of the connection.
    async fn expect_fatal(&mut self) -> PgErr {
        loop {
            match self.recv().await {
                Some(Msg::Backend(backend::Message::ErrorResponse(e))) => {
                    let e = pg_err(&e);
                    assert_eq!(e.severity, "FATAL", "{e:?}");
                    assert!(self.recv().await.is_none(), "the connection is closed after FATAL");
                    return e;
                }
                Some(Msg::Backend(backend::Message::NoticeResponse(_))) => {}
                other => panic!("expected a FATAL error, got {other:?}"),
            }
        }
    }

    /// fjord's remote-consistent LSN message, as the pageserver sends it: with its
    /// attachment generation, or (`None`) in version 1's form without one.
    async fn remote_consistent_lsn(&mut self, generation: Option<u32>, lsn: Lsn) {
        let mut p = vec![b'P'];
        if let Some(g) = generation {
            p.extend_from_slice(&g.to_be_bytes());
        }
        p.extend_from_slice(&lsn.0.to_be_bytes());
        self.send(|b| frontend::CopyData::new(&p[..]).unwrap().write(b)).await;
    }

    /// PostgreSQL's hot standby feedback: time, xmin and its epoch, catalog xmin and its epoch.
    async fn hot_standby_feedback(&mut self, xmin: u32, xmin_epoch: u32, catalog_xmin: u32, catalog_epoch: u32) {
        let mut p = vec![b'h'];
        p.extend_from_slice(&0i64.to_be_bytes());
        for v in [xmin, xmin_epoch, catalog_xmin, catalog_epoch] {
            p.extend_from_slice(&v.to_be_bytes());
        }
        self.send(|b| frontend::CopyData::new(&p[..]).unwrap().write(b)).await;
    }

    async fn status_update(&mut self, write: Lsn, flush: Lsn, apply: Lsn, reply: bool) {
        let mut p = Vec::new();
        p.push(b'r');
        for v in [write.0, flush.0, apply.0, 0] {
            p.extend_from_slice(&v.to_be_bytes());
        }
        p.push(reply as u8);
        self.send(|b| frontend::CopyData::new(&p[..]).unwrap().write(b)).await;
    }
}

/// A replication message inside CopyData.
#[derive(Debug)]
enum Repl {
    XLogData { start: Lsn, end: Lsn, data: Bytes },
    Keepalive { end: Lsn, reply: bool },
}

fn repl(m: Option<Msg>) -> Repl {
    let Some(Msg::Backend(backend::Message::CopyData(d))) = m else { panic!("expected CopyData, got {m:?}") };
    let mut d = d.into_bytes();
    match d.get_u8() {
        b'w' => {
            let start = Lsn(d.get_u64());
            let end = Lsn(d.get_u64());
            let _time = d.get_i64();
            Repl::XLogData { start, end, data: d }
        }
        b'k' => {
            assert_eq!(d.len(), 17);
            let end = Lsn(d.get_u64());
            let _time = d.get_i64();
            Repl::Keepalive { end, reply: d.get_u8() != 0 }
        }
        t => panic!("unexpected replication message {:?}", t as char),
    }
}

/// Receives XLogData until `upto`, checking it is contiguous from `*next`, in chunks of at
/// most 128 KiB that do not cross segments and announce `commit` as the end of WAL.
async fn receive_until(c: &mut Client, next: &mut Lsn, upto: Lsn, commit: Lsn, into: &mut Vec<u8>) {
    receive_segments_until(c, next, upto, commit, into, SEGMENT).await
}

/// [`receive_until`] for WAL in segments of `segment_bytes`.
async fn receive_segments_until(c: &mut Client, next: &mut Lsn, upto: Lsn, commit: Lsn, into: &mut Vec<u8>, segment_bytes: u64) {
    while *next < upto {
        match repl(c.recv().await) {
            Repl::XLogData { start, end, data } => {
                assert_eq!(start, *next, "contiguous WAL");
                assert_eq!(end, commit, "walEnd is the commit LSN");
                assert!(!data.is_empty() && data.len() <= 128 * 1024, "chunk of {} bytes", data.len());
                assert_eq!(start.0 / segment_bytes, (start.0 + data.len() as u64 - 1) / segment_bytes, "chunk crosses a segment");
                *next = Lsn(start.0 + data.len() as u64);
                assert!(*next <= commit, "sent beyond the commit LSN");
                into.extend_from_slice(&data);
            }
            Repl::Keepalive { .. } => {}
        }
    }
}

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn streams_committed_wal_and_follows_the_commit_lsn() {
    let f = fixture();
    let first_commit = Lsn(f.start.0 + 1_000_003);
    let src = MemWal::new(&f, first_commit);
    let mut server = server(Arc::clone(&src), Config::default()).await;
    let mut c = Client::ready(&server).await;

    let (cols, rows) = c.query("IDENTIFY_SYSTEM").await.unwrap();
    assert_eq!(cols, vec![("systemid".into(), 25), ("timeline".into(), 23), ("xlogpos".into(), 25), ("dbname".into(), 25)]);
    assert_eq!(rows, vec![vec![Some(f.system_id.to_string()), Some("1".into()), Some(first_commit.to_string()), None]]);
    let (_, rows) = c.query("show WAL_SEGMENT_SIZE;").await.unwrap();
    assert_eq!(rows, vec![vec![Some("16MB".to_string())]]);

    c.send(|b| frontend::query(&format!("START_REPLICATION PHYSICAL {} TIMELINE 1", f.start), b).unwrap()).await;
    assert!(matches!(c.recv().await, Some(Msg::CopyBoth)));
    let mut got = Vec::new();
    let mut next = f.start;
    receive_until(&mut c, &mut next, first_commit, first_commit, &mut got).await;
    assert_eq!(&got[..], src.bytes(f.start, first_commit));

    // The pageserver's progress is recorded as it reports it.
    c.status_update(first_commit, Lsn(first_commit.0 - 10), f.start, false).await;
    wait_for("the status update", || src.last_feedback().is_some()).await;
    assert_eq!(
        src.last_feedback().unwrap(),
        PageserverFeedback { write_lsn: first_commit, flush_lsn: Lsn(first_commit.0 - 10), apply_lsn: f.start, ..Default::default() }
    );

    // And a replica's hot standby feedback, as full transaction ids (0: none).
    c.hot_standby_feedback(1234, 2, 0, 7).await;
    wait_for("the hot standby feedback", || !src.hot_standby.lock().unwrap().is_empty()).await;
    let (client, xmin, catalog_xmin) = src.hot_standby.lock().unwrap()[0].clone();
    assert!(client.contains('@'), "{client}");
    assert_eq!((xmin, catalog_xmin), ((2 << 32) | 1234, 0));

    // So is its remote-consistent LSN, in fjord's own message.
    // With its attachment generation, or without one (generation 0).
    c.remote_consistent_lsn(Some(3), Lsn(f.start.0 + 4096)).await;
    c.remote_consistent_lsn(None, Lsn(f.start.0 + 8192)).await;
    wait_for("the remote-consistent LSN", || src.remote_consistent.lock().unwrap().len() == 2).await;
    assert_eq!(*src.remote_consistent.lock().unwrap(), vec![(3, Lsn(f.start.0 + 4096)), (0, Lsn(f.start.0 + 8192))]);

    // Nothing beyond the commit LSN is sent until it moves; then all of it, across the
    // segment boundary.
    src.commit.send_replace(f.end);
    receive_until(&mut c, &mut next, f.end, f.end, &mut got).await;
    assert_eq!(next, f.end);
    assert_eq!(&got[..], src.bytes(f.start, f.end));

    // The client ends streaming; the connection is then usable again.
    c.send(frontend::copy_done).await;
    let mut saw_copy_done = false;
    let mut tags = Vec::new();
    for m in c.until_ready().await {
        match m {
            Msg::Backend(backend::Message::CopyDone) => saw_copy_done = true,
            Msg::Backend(backend::Message::CommandComplete(t)) => tags.push(t.tag().unwrap().to_string()),
            Msg::Backend(backend::Message::CopyData(_)) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(saw_copy_done);
    assert_eq!(tags, vec!["START_STREAMING".to_string()]);
    // The end of streaming releases whatever the client held back.
    assert_eq!(*src.disconnected.lock().unwrap(), vec![client]);
    let (_, rows) = c.query("IDENTIFY_SYSTEM").await.unwrap();
    assert_eq!(rows[0][2], Some(f.end.to_string()));

    c.send(frontend::terminate).await;
    assert!(c.recv().await.is_none());
    server.next_result().await.unwrap();
}

#[tokio::test]
async fn keepalives_ask_for_a_reply_and_a_silent_client_is_dropped() {
    let f = fixture();
    let commit = Lsn(f.start.0 + 8192);
    let src = MemWal::new(&f, commit);
    let config =
        Config { keepalive_interval: Duration::from_millis(100), sender_timeout: Duration::from_millis(1500), ..Config::default() };
    let mut server = server(Arc::clone(&src), config).await;
    let mut c = Client::ready(&server).await;
    c.send(|b| frontend::query(&format!("START_REPLICATION {commit}"), b).unwrap()).await;
    assert!(matches!(c.recv().await, Some(Msg::CopyBoth)));
    // Caught up at once: keepalives without a reply request, announcing the commit LSN.
    let Repl::Keepalive { end, reply: false } = repl(c.recv().await) else { panic!("expected a plain keepalive") };
    assert_eq!(end, commit);
    // A reply resets the clock; silence for half the timeout brings a reply request.
    c.status_update(commit, commit, commit, false).await;
    let started = std::time::Instant::now();
    loop {
        match repl(c.recv().await) {
            Repl::Keepalive { reply: true, .. } => break,
            Repl::Keepalive { reply: false, .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(started.elapsed() >= Duration::from_millis(600), "the reply was requested after {:?}", started.elapsed());
    // Still silent: the connection is closed after the whole timeout.
    let e = loop {
        match c.recv().await {
            Some(Msg::Backend(backend::Message::ErrorResponse(e))) => break pg_err(&e),
            Some(Msg::Backend(backend::Message::CopyData(_))) => {}
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(e.severity, "FATAL");
    assert!(e.message.contains("sent nothing"), "{e:?}");
    assert!(c.recv().await.is_none());
    assert!(server.next_result().await.is_err());
}

#[tokio::test]
async fn refuses_bad_startups() {
    let f = fixture();
    let src = MemWal::new(&f, f.end);
    let mut server = server(src, Config::default()).await;
    let db = server.database();
    let other = format!("{}/33333333333333333333333333333333", server.tenant);
    // (startup parameters, SQLSTATE, part of the message)
    type Case<'a> = (Vec<(&'a str, &'a str)>, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        (vec![("user", "u"), ("replication", "true"), ("database", &other)], "3D000", "no such timeline here"),
        (vec![("user", "u"), ("database", &db)], "0A000", "replication=true is missing"),
        (vec![("user", "u"), ("replication", "database"), ("database", &db)], "0A000", "logical replication"),
        (vec![("user", "u"), ("replication", "true"), ("database", "tenant/timeline")], "22023", "does not name a timeline"),
        (vec![("user", "u"), ("replication", "true"), ("database", "replication")], "3D000", "no timeline named"),
        (vec![("replication", "true"), ("database", &db)], "28000", "no PostgreSQL user name"),
    ];
    for (params, code, text) in cases {
        let mut c = Client::connect(server.addr, &params).await;
        let e = c.expect_fatal().await;
        assert_eq!(e.code, code, "{params:?}: {e:?}");
        assert!(e.message.contains(text), "{params:?}: {e:?}");
        assert!(server.next_result().await.is_err());
    }

    // A startup packet of an impossible length.
    let mut c = Client::raw(server.addr).await;
    c.send_raw(&[0, 0, 0, 3]).await;
    let e = c.expect_fatal().await;
    assert!(e.message.contains("invalid length of startup packet"), "{e:?}");
    assert!(server.next_result().await.is_err());

    // An unknown protocol version.
    let mut c = Client::raw(server.addr).await;
    c.send_raw(&[0, 0, 0, 8, 0, 2, 0, 0]).await;
    let e = c.expect_fatal().await;
    assert!(e.message.contains("unsupported frontend protocol 2.0"), "{e:?}");
    assert!(server.next_result().await.is_err());

    // SSL and GSS encryption requests are declined, then the startup goes on; the timeline
    // can also be named in `options`, as pg_receivewal must.
    let mut c = Client::raw(server.addr).await;
    c.send(frontend::ssl_request).await;
    let mut answer = [0u8; 1];
    c.s.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"N");
    c.send_raw(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x30]).await;
    c.s.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"N");
    let options = format!("-c fjord.timeline={db}");
    c.send(|b| {
        frontend::startup_message([("user", "u"), ("replication", "on"), ("database", "replication"), ("options", options.as_str())], b)
            .unwrap()
    })
    .await;
    c.until_ready().await;
    let (_, rows) = c.query("IDENTIFY_SYSTEM").await.unwrap();
    assert_eq!(rows[0][2], Some(f.end.to_string()));
    drop(c);
    server.next_result().await.unwrap();

    // A client that connects and leaves is no error.
    drop(Client::raw(server.addr).await);
    server.next_result().await.unwrap();
}

#[tokio::test]
async fn malformed_messages_and_unknown_commands() {
    let f = fixture();
    let src = MemWal::new(&f, f.end);
    let mut server = server(src, Config::default()).await;
    let mut c = Client::ready(&server).await;

    // Framing intact: ERROR, ReadyForQuery, and the connection goes on.
    let query_without_nul = [b'Q', 0, 0, 0, 8, b'a', b'b', b'c', b'd'];
    let bad_utf8 = [b'Q', 0, 0, 0, 7, b'S', 0xff, 0];
    let trailing = [b'Q', 0, 0, 0, 7, b'x', 0, b'y'];
    for (bytes, code, text) in [
        (&query_without_nul[..], "08P01", "not NUL-terminated"),
        (&bad_utf8[..], "22021", "invalid byte sequence"),
        (&trailing[..], "08P01", "bytes after the query string"),
    ] {
        c.send_raw(bytes).await;
        let msgs = c.until_ready().await;
        let [Msg::Backend(backend::Message::ErrorResponse(e))] = &msgs[..] else { panic!("expected one error, got {msgs:?}") };
        let e = pg_err(e);
        assert_eq!((e.severity.as_str(), e.code.as_str()), ("ERROR", code), "{e:?}");
        assert!(e.message.contains(text), "{e:?}");
    }
    for (q, code, text) in [
        ("SELECT 1", "0A000", "unknown replication command starting with \"select\""),
        ("TIMELINE_HISTORY 1", "0A000", "TIMELINE_HISTORY is not supported"),
        ("START_REPLICATION LOGICAL 0/1", "0A000", "logical replication"),
        ("IDENTIFY_SYSTEM please", "42601", "unexpected \"please\""),
        ("START_REPLICATION PHYSICAL 0/ZZ", "42601", "invalid LSN: \"0/\""),
        ("START_REPLICATION PHYSICAL now", "42601", "expected a start LSN"),
        ("SHOW work_mem", "42704", "unrecognized configuration parameter \"work_mem\""),
    ] {
        let e = c.query(q).await.unwrap_err();
        assert_eq!((e.severity.as_str(), e.code.as_str()), ("ERROR", code), "{q}: {e:?}");
        assert!(e.message.contains(text), "{q}: {e:?}");
    }
    // An empty query.
    c.send(|b| frontend::query(" ; ", b).unwrap()).await;
    let msgs = c.until_ready().await;
    assert!(matches!(msgs[..], [Msg::Backend(backend::Message::EmptyQueryResponse)]), "{msgs:?}");
    // The extended query protocol: one error, everything up to Sync skipped.
    c.send(|b| {
        frontend::parse("", "IDENTIFY_SYSTEM", None, b).unwrap();
        frontend::execute("", 0, b).unwrap();
        frontend::sync(b);
    })
    .await;
    let msgs = c.until_ready().await;
    let [Msg::Backend(backend::Message::ErrorResponse(e))] = &msgs[..] else { panic!("expected one error, got {msgs:?}") };
    assert!(pg_err(e).message.contains("extended query protocol not supported"));
    assert!(c.query("IDENTIFY_SYSTEM").await.is_ok(), "still usable");

    // Broken framing: FATAL and closed.
    c.send_raw(&[b'Y', 0, 0, 0, 4]).await;
    let e = c.expect_fatal().await;
    assert!(e.message.contains("invalid frontend message type 89"), "{e:?}");
    assert!(server.next_result().await.is_err());

    let mut c = Client::ready(&server).await;
    c.send_raw(&[b'Q', 0, 0, 0, 2]).await;
    let e = c.expect_fatal().await;
    assert!(e.message.contains("invalid message length 2"), "{e:?}");
    assert!(server.next_result().await.is_err());

    let mut c = Client::ready(&server).await;
    c.send_raw(&[b'Q', 0x7f, 0, 0, 0]).await;
    let e = c.expect_fatal().await;
    assert!(e.message.contains("invalid message length"), "{e:?}");
    assert!(server.next_result().await.is_err());

    // A standby message the protocol does not have, while streaming.
    let e = streaming_error(&server, f.end, b"z123").await;
    assert!(e.message.contains("unexpected standby message type 'z'"), "{e:?}");
    assert!(server.next_result().await.is_err());

    // Hot standby feedback of the wrong length is refused, not half-read.
    let e = streaming_error(&server, f.end, b"h12345678").await;
    assert!(e.message.contains("invalid hot standby feedback: 9 bytes, expected 25"), "{e:?}");
    assert!(server.next_result().await.is_err());
}

/// Starts streaming at `start`, sends `payload` as a CopyData message, and returns the
/// error the server answers with (it must then close the connection).
async fn streaming_error(server: &Server, start: Lsn, payload: &[u8]) -> PgErr {
    let mut c = Client::ready(server).await;
    c.send(|b| frontend::query(&format!("START_REPLICATION {start}"), b).unwrap()).await;
    assert!(matches!(c.recv().await, Some(Msg::CopyBoth)));
    c.send(|b| frontend::CopyData::new(payload).unwrap().write(b)).await;
    let e = loop {
        match c.recv().await {
            Some(Msg::Backend(backend::Message::ErrorResponse(e))) => break pg_err(&e),
            Some(Msg::Backend(backend::Message::CopyData(_))) => {}
            other => panic!("unexpected {other:?}"),
        }
    };
    assert!(c.recv().await.is_none(), "the connection stays open after {e:?}");
    e
}

#[tokio::test]
async fn start_positions_outside_the_committed_wal_are_refused() {
    let f = fixture();
    let commit = Lsn(f.start.0 + 100_000);
    let src = MemWal::new(&f, commit);
    let server = server(src, Config::default()).await;
    let mut c = Client::ready(&server).await;
    let ahead = Lsn(commit.0 + 1);
    let e = c.query(&format!("START_REPLICATION PHYSICAL {ahead} TIMELINE 1")).await.unwrap_err();
    assert_eq!(e.severity, "ERROR");
    assert!(
        e.message.contains(&format!("requested starting point {ahead} is ahead of the WAL flush position of this server {commit}")),
        "{e:?}"
    );
    let below = Lsn(f.start.0 - 8192);
    let e = c.query(&format!("START_REPLICATION {below}")).await.unwrap_err();
    assert!(e.message.contains(&format!("requested WAL at {below} is not available here (WAL begins at {})", f.start)), "{e:?}");
    let e = c.query(&format!("START_REPLICATION {} TIMELINE 2", f.start)).await.unwrap_err();
    assert!(e.message.contains("timeline 2 is not in this server's history"), "{e:?}");
    // Streaming from exactly the commit LSN is allowed (nothing to send yet).
    c.send(|b| frontend::query(&format!("START_REPLICATION {commit}"), b).unwrap()).await;
    assert!(matches!(c.recv().await, Some(Msg::CopyBoth)));
}

/// A client streaming below the removal horizon (not the pageserver, whose remote-consistent
/// LSN bounds it) is told its WAL was removed, not that it is corrupt, and gets no zeros; a
/// new start there is refused; a malformed remote-consistent LSN message is a protocol
/// violation.
#[tokio::test]
async fn wal_removed_under_a_streaming_client_ends_the_stream_with_a_clear_error() {
    let f = fixture();
    // A record boundary: the sender sends whole records only.
    let commit = record_end_at_or_after(&f, Lsn(f.start.0 + 100_000));
    let src = MemWal::new(&f, commit);
    let mut server = server(Arc::clone(&src), Config::default()).await;
    let mut c = Client::ready(&server).await;
    c.send(|b| frontend::query(&format!("START_REPLICATION {}", f.start), b).unwrap()).await;
    assert!(matches!(c.recv().await, Some(Msg::CopyBoth)));
    let mut next = f.start;
    let mut got = Vec::new();
    receive_until(&mut c, &mut next, commit, commit, &mut got).await;
    // Everything committed so far is removed; the next WAL, once committed, is below the new
    // beginning for this client.
    // WAL that begins inside a page begins at a record (as a compute's first WAL does).
    let removed = record_end_at_or_after(&f, Lsn(f.start.0 + 200_000));
    *src.removed_below.lock().unwrap() = removed;
    src.commit.send_replace(Lsn(f.start.0 + 300_000));
    let e = loop {
        match c.recv().await {
            Some(Msg::Backend(backend::Message::ErrorResponse(e))) => break pg_err(&e),
            Some(Msg::Backend(backend::Message::CopyData(d))) => {
                assert_ne!(d.data().first(), Some(&b'w'), "WAL sent from below the beginning");
            }
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!((e.severity.as_str(), e.code.as_str()), ("FATAL", "58P01"), "{e:?}");
    assert_eq!(e.message, format!("requested WAL at {commit} has been removed from this safekeeper (its WAL now begins at {removed})"));
    assert!(c.recv().await.is_none());
    assert!(server.next_result().await.is_err());
    // Starting there again is refused and the connection stays usable.
    let mut c = Client::ready(&server).await;
    let e = c.query(&format!("START_REPLICATION {commit}")).await.unwrap_err();
    assert_eq!(e.severity, "ERROR");
    assert!(e.message.contains(&format!("requested WAL at {commit} is not available here (WAL begins at {removed})")), "{e:?}");
    // A remote-consistent LSN message of the wrong length.
    c.send(|b| frontend::query(&format!("START_REPLICATION {removed}"), b).unwrap()).await;
    assert!(matches!(c.recv().await, Some(Msg::CopyBoth)));
    c.send(|b| frontend::CopyData::new(&b"P1234"[..]).unwrap().write(b)).await;
    let e = loop {
        match c.recv().await {
            Some(Msg::Backend(backend::Message::ErrorResponse(e))) => break pg_err(&e),
            Some(Msg::Backend(backend::Message::CopyData(_))) => {}
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(e.code, "08P01", "{e:?}");
    assert_eq!(e.message, "invalid remote-consistent LSN message: 5 bytes, expected 13 (or 9 without a generation)");
    assert!(src.remote_consistent.lock().unwrap().is_empty());
}

#[tokio::test]
async fn corrupt_wal_is_never_sent() {
    let f = fixture();
    let commit = Lsn(f.start.0 + 1_000_000);
    let src = MemWal::new(&f, commit);
    let bad = Lsn(f.start.0 + 300_000);
    *src.corrupt.lock().unwrap() = Some(bad);
    let mut server = server(Arc::clone(&src), Config::default()).await;
    let mut c = Client::ready(&server).await;
    c.send(|b| frontend::query(&format!("START_REPLICATION {}", f.start), b).unwrap()).await;
    assert!(matches!(c.recv().await, Some(Msg::CopyBoth)));
    let mut got = Vec::new();
    let e = loop {
        match c.recv().await {
            Some(Msg::Backend(backend::Message::ErrorResponse(e))) => break pg_err(&e),
            m @ Some(Msg::Backend(backend::Message::CopyData(_))) => {
                if let Repl::XLogData { start, data, .. } = repl(m) {
                    assert_eq!(start.0, f.start.0 + got.len() as u64);
                    got.extend_from_slice(&data);
                }
            }
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!((e.severity.as_str(), e.code.as_str()), ("FATAL", "XX001"), "{e:?}");
    assert!(e.message.contains("CRC mismatch in WAL segment"), "{e:?}");
    assert!(f.start.0 + (got.len() as u64) <= bad.0, "WAL up to {} was sent past the corrupt byte at {bad}", got.len());
    assert_eq!(&got[..], src.bytes(f.start, Lsn(f.start.0 + got.len() as u64)));
    assert!(c.recv().await.is_none());
    // Logged once, where it was found: not an error of the connection for the listener
    // to log again.
    server.next_result().await.unwrap();
}

// ---------------------------------------------------------------------------------------
// Record verification: every record checked (header and CRC32C) before its bytes are sent.

/// The fixture's records as pgwal decodes them: where each starts and where the next one
/// starts.
fn records(f: &Fixture) -> Vec<(Lsn, Lsn)> {
    let config = DecoderConfig { segment_size_bytes: SEGMENT, system_id: Some(f.system_id) };
    let mut d = WalStreamDecoder::new(f.start, config).unwrap();
    d.feed_bytes(&f.wal[..(f.end.0 - f.start.0) as usize]);
    let mut out = Vec::new();
    while let Some(r) = d.poll_decode().unwrap() {
        out.push((r.start_lsn(), r.end_lsn()));
    }
    assert!(out.len() > 100);
    out
}

/// The first record boundary at or after `lsn` (a commit LSN as the proposer makes them).
fn record_end_at_or_after(f: &Fixture, lsn: Lsn) -> Lsn {
    records(f).iter().map(|r| r.1).find(|&e| e >= lsn && e <= f.end).expect("a record ends there")
}

/// The fixture with the byte at `lsn` flipped.
fn fixture_with_flipped_byte(lsn: Lsn) -> Fixture {
    let mut f = fixture();
    let at = (lsn.0 - f.start.0) as usize;
    f.wal[at] ^= 0x5a;
    f
}

/// A config whose WAL corruption counter the test can read.
fn counted_config(config: Config) -> (Config, prometheus::IntCounterVec) {
    let counter = prometheus::IntCounterVec::new(prometheus::Opts::new("corruption", "test"), &["tenant_id", "timeline_id"]).unwrap();
    (Config { wal_corruption: Some(counter.clone()), ..config }, counter)
}

/// Streams from `start` until the server's error; returns the error and the WAL received
/// (contiguous from `start`).
async fn stream_until_error(c: &mut Client, start: Lsn) -> (PgErr, Vec<u8>) {
    c.send(|b| frontend::query(&format!("START_REPLICATION {start}"), b).unwrap()).await;
    assert!(matches!(c.recv().await, Some(Msg::CopyBoth)));
    let mut got = Vec::new();
    let e = loop {
        match c.recv().await {
            Some(Msg::Backend(backend::Message::ErrorResponse(e))) => break pg_err(&e),
            m @ Some(Msg::Backend(backend::Message::CopyData(_))) => {
                if let Repl::XLogData { start: at, data, .. } = repl(m) {
                    assert_eq!(at.0, start.0 + got.len() as u64, "contiguous WAL");
                    got.extend_from_slice(&data);
                }
            }
            other => panic!("unexpected {other:?}"),
        }
    };
    assert!(c.recv().await.is_none(), "the connection is closed after {e:?}");
    (e, got)
}

/// A byte flipped inside a record's body (its page headers intact, so the storage's page
/// checks pass): every record before it is sent, no byte of it, and the stream ends with
/// FATAL XX001 naming its LSN and segment file; counted; found again by the next stream;
/// a client starting after it is served.
#[tokio::test]
async fn a_record_that_fails_its_crc_is_never_sent() {
    let f = fixture();
    let recs = records(&f);
    let &(bad_start, bad_end) = recs
        .iter()
        .find(|(s, e)| s.0 > f.start.0 + 50_000 && e.0 - s.0 > 200 && s.0 / 8192 == (e.0 - 1) / 8192)
        .expect("a record of some size within one page");
    let bad = fixture_with_flipped_byte(Lsn(bad_start.0 + 100));
    let commit = record_end_at_or_after(&f, Lsn(bad_end.0 + 100_000));
    let src = MemWal::new(&bad, commit);
    let (config, counter) = counted_config(Config::default());
    let mut server = self::server(Arc::clone(&src), config).await;
    let corruptions = || counter.with_label_values(&[&server_tenant(), &server_timeline()]).get();
    for round in 1..=2 {
        let mut c = Client::ready(&server).await;
        let (e, got) = stream_until_error(&mut c, f.start).await;
        assert_eq!((e.severity.as_str(), e.code.as_str()), ("FATAL", "XX001"), "{e:?}");
        assert!(
            e.message.contains(&format!("WAL at {bad_start} is corrupt on this safekeeper (segment file 000000010000000000000002)")),
            "{e:?}"
        );
        assert!(e.message.contains("incorrect resource manager data checksum"), "{e:?}");
        // Exactly the records before it, as they are.
        assert_eq!(f.start.0 + got.len() as u64, bad_start.0, "sent up to {}", f.start.0 + got.len() as u64);
        assert!(got[..] == f.wal[..got.len()]);
        server.next_result().await.unwrap();
        assert_eq!(corruptions(), round);
    }
    // A client that starts on a later page (the pageserver, at a record boundary inside a
    // page) is served everything from there.
    let &(later, _) = recs.iter().find(|(s, _)| s.0 / 8192 > bad_end.0 / 8192 + 1 && s.0 % 8192 != 0).unwrap();
    let mut c = Client::ready(&server).await;
    c.send(|b| frontend::query(&format!("START_REPLICATION {later}"), b).unwrap()).await;
    assert!(matches!(c.recv().await, Some(Msg::CopyBoth)));
    let (mut next, mut got) = (later, Vec::new());
    receive_until(&mut c, &mut next, commit, commit, &mut got).await;
    assert!(got[..] == *src.bytes(later, commit));
    assert_eq!(corruptions(), 2);
}

fn server_tenant() -> String {
    "11111111111111111111111111111111".into()
}

fn server_timeline() -> String {
    "22222222222222222222222222222222".into()
}

/// A start at a page boundary inside a record: the whole record is checked (decoding
/// begins where it begins), and only the bytes from the start are sent.
#[tokio::test]
async fn a_start_inside_a_record_checks_that_record_whole() {
    let f = fixture();
    let recs = records(&f);
    let &(rec_start, rec_end) = recs
        .iter()
        .find(|(s, e)| s.0 > f.start.0 + 8192 && s.0 % 8192 < 8000 && s.0 / 8192 != (e.0 - 1) / 8192)
        .expect("a record across a page boundary");
    let page = Lsn((rec_start.0 / 8192 + 1) * 8192);
    assert!(rec_start < page && page < rec_end);
    let commit = record_end_at_or_after(&f, Lsn(rec_end.0 + 50_000));
    let src = MemWal::new(&f, commit);
    let mut server = self::server(Arc::clone(&src), Config::default()).await;
    let mut c = Client::ready(&server).await;
    c.send(|b| frontend::query(&format!("START_REPLICATION {page}"), b).unwrap()).await;
    assert!(matches!(c.recv().await, Some(Msg::CopyBoth)));
    let (mut next, mut got) = (page, Vec::new());
    receive_until(&mut c, &mut next, commit, commit, &mut got).await;
    assert!(got[..] == *src.bytes(page, commit));
    drop(c);
    server.next_result().await.unwrap();

    // The record's first bytes, before the start (never sent), rotten: it does not check,
    // so nothing of it is sent.
    let bad = fixture_with_flipped_byte(Lsn(rec_start.0 + 30));
    let (config, counter) = counted_config(Config::default());
    let mut server = self::server(MemWal::new(&bad, commit), config).await;
    let mut c = Client::ready(&server).await;
    let (e, got) = stream_until_error(&mut c, page).await;
    assert_eq!((e.severity.as_str(), e.code.as_str()), ("FATAL", "XX001"), "{e:?}");
    assert!(e.message.contains(&format!("WAL at {rec_start} is corrupt")), "{e:?}");
    assert!(got.is_empty(), "{} bytes sent", got.len());
    server.next_result().await.unwrap();
    assert_eq!(counter.with_label_values(&[&server_tenant(), &server_timeline()]).get(), 1);
}

/// The commit LSN inside a record (a record longer than one append): everything before the
/// record is sent, then keepalives while the commit LSN stays there (no deadlock, no
/// error), and the record once the commit LSN passes its end; then exactly the committed
/// bytes at each record boundary the commit LSN reaches.
#[tokio::test]
async fn a_record_the_commit_lsn_ends_inside_is_sent_once_it_is_committed() {
    let f = fixture();
    let recs = records(&f);
    let &(rec_start, rec_end) = recs.iter().find(|(s, e)| s.0 > f.start.0 + 20_000 && e.0 - s.0 > 200).unwrap();
    let inside = Lsn(rec_start.0 + 77);
    let src = MemWal::new(&f, inside);
    let config = Config { keepalive_interval: Duration::from_millis(50), ..Config::default() };
    let mut server = self::server(Arc::clone(&src), config).await;
    let mut c = Client::ready(&server).await;
    c.send(|b| frontend::query(&format!("START_REPLICATION {}", f.start), b).unwrap()).await;
    assert!(matches!(c.recv().await, Some(Msg::CopyBoth)));
    let (mut next, mut got) = (f.start, Vec::new());
    receive_until(&mut c, &mut next, rec_start, inside, &mut got).await;
    assert_eq!(next, rec_start);
    for _ in 0..3 {
        match repl(c.recv().await) {
            Repl::Keepalive { end, .. } => assert_eq!(end, inside, "walEnd is the commit LSN"),
            other => panic!("sent part of the record the commit LSN ends inside: {other:?}"),
        }
    }
    src.commit.send_replace(rec_end);
    receive_until(&mut c, &mut next, rec_end, rec_end, &mut got).await;
    let later = record_end_at_or_after(&f, Lsn(rec_end.0 + 300_000));
    src.commit.send_replace(later);
    receive_until(&mut c, &mut next, later, later, &mut got).await;
    assert_eq!(next, later);
    assert!(got[..] == *src.bytes(f.start, later));
    // Nothing beyond it.
    assert!(matches!(repl(c.recv().await), Repl::Keepalive { .. }));
    drop(c);
    server.next_result().await.unwrap();
}

/// WAL of 1 MiB segments with a 30 KB record across a segment boundary, from the test
/// encoder: the records, and the WAL from `start`.
fn wal_across_a_segment() -> (Vec<(Lsn, Lsn)>, Lsn, Vec<u8>) {
    use pgwal::consts::{RM_HEAP_ID, XLOG_HEAP_INSERT};
    use pgwal::test_encoder::{RecordSpec, WalWriter};
    let start = Lsn(3 * SMALL_SEGMENT - 3 * 8192);
    let mut w = WalWriter::new(start, SMALL_SEGMENT);
    let record = |len: usize, seed: u8| {
        let data = (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
        RecordSpec::new(RM_HEAP_ID, XLOG_HEAP_INSERT).xid(700 + u32::from(seed)).main_data(data)
    };
    let placed = [w.append(&record(100, 1)), w.append(&record(30_000, 2)), w.append(&record(500, 3)), w.append(&record(40, 4))];
    let recs: Vec<(Lsn, Lsn)> = placed.iter().map(|p| (p.start, p.end)).collect();
    // Up to the last record's aligned end, where the next would begin.
    let mut wal = w.out;
    wal.resize((recs[3].1 .0 - start.0) as usize, 0);
    (recs, start, wal)
}

const SMALL_SEGMENT: u64 = 1 << 20;

/// A read replica (or `pg_receivewal`) starts at a segment boundary, here inside a record
/// that began in the previous segment: the record is checked whole from its beginning and
/// the WAL from the boundary sent. If the record's first part is rotten, nothing of it is
/// sent. If this safekeeper's WAL begins at the boundary (the previous segment removed), the
/// record's tail is sent with only its page headers checked, and the records after it are
/// checked.
#[tokio::test]
async fn a_start_at_a_segment_boundary_inside_a_record() {
    let (recs, start, wal) = wal_across_a_segment();
    let boundary = Lsn(3 * SMALL_SEGMENT);
    let (big_start, big_end) = recs[1];
    assert!(big_start < boundary && boundary < big_end && big_start.0 < boundary.0 - 8192, "{recs:?}");
    let commit = recs[3].1;
    let bytes = |from: Lsn, to: Lsn| wal[(from.0 - start.0) as usize..(to.0 - start.0) as usize].to_vec();

    let src = MemWal::with_wal(7, SMALL_SEGMENT, start, wal.clone(), commit);
    let mut server = self::server(Arc::clone(&src), Config::default()).await;
    let mut c = Client::ready(&server).await;
    c.send(|b| frontend::query(&format!("START_REPLICATION {boundary}"), b).unwrap()).await;
    assert!(matches!(c.recv().await, Some(Msg::CopyBoth)));
    let (mut next, mut got) = (boundary, Vec::new());
    receive_segments_until(&mut c, &mut next, commit, commit, &mut got, SMALL_SEGMENT).await;
    assert!(got == bytes(boundary, commit));
    drop(c);
    server.next_result().await.unwrap();

    // Its first part, in the previous segment, rotten.
    let mut rotten = wal.clone();
    rotten[(big_start.0 + 1000 - start.0) as usize] ^= 1;
    let mut server = self::server(MemWal::with_wal(7, SMALL_SEGMENT, start, rotten, commit), Config::default()).await;
    let mut c = Client::ready(&server).await;
    let (e, got) = stream_until_error(&mut c, boundary).await;
    assert_eq!(e.code, "XX001", "{e:?}");
    assert!(
        e.message.contains(&format!("WAL at {big_start} is corrupt on this safekeeper (segment file 000000010000000000000002)")),
        "{e:?}"
    );
    assert!(got.is_empty());
    server.next_result().await.unwrap();

    // This safekeeper's WAL begins at the boundary: the tail cannot be checked; it goes out
    // with the next record, which is checked (here it is rotten: nothing is sent).
    let mut rotten = wal.clone();
    rotten[(recs[2].0 .0 + 100 - start.0) as usize] ^= 1;
    let src = MemWal::with_wal(7, SMALL_SEGMENT, start, rotten, commit);
    *src.removed_below.lock().unwrap() = boundary;
    let mut server = self::server(src, Config::default()).await;
    let mut c = Client::ready(&server).await;
    let (e, got) = stream_until_error(&mut c, boundary).await;
    assert_eq!(e.code, "XX001", "{e:?}");
    assert!(e.message.contains(&format!("WAL at {} is corrupt", recs[2].0)), "{e:?}");
    assert!(got.is_empty(), "{} bytes sent", got.len());
    server.next_result().await.unwrap();
    // Intact, all of it.
    let src = MemWal::with_wal(7, SMALL_SEGMENT, start, wal.clone(), commit);
    *src.removed_below.lock().unwrap() = boundary;
    let mut server = self::server(src, Config::default()).await;
    let mut c = Client::ready(&server).await;
    c.send(|b| frontend::query(&format!("START_REPLICATION {boundary}"), b).unwrap()).await;
    assert!(matches!(c.recv().await, Some(Msg::CopyBoth)));
    let (mut next, mut got) = (boundary, Vec::new());
    receive_segments_until(&mut c, &mut next, commit, commit, &mut got, SMALL_SEGMENT).await;
    assert!(got == bytes(boundary, commit));
    drop(c);
    server.next_result().await.unwrap();
}

/// A compute started from a basebackup whose previous record the pageserver did not know
/// writes its first record with `xl_prev` = 0 (compute patch 0009): WAL streamed across
/// that start is no corruption.
#[tokio::test]
async fn a_first_record_with_an_unknown_prev_link_is_not_corruption() {
    use pgwal::consts::{RM_HEAP_ID, XLOG_HEAP_INSERT};
    use pgwal::test_encoder::{RecordSpec, WalWriter};
    let start = Lsn(5 * SMALL_SEGMENT);
    let mut w = WalWriter::new(start, SMALL_SEGMENT);
    let record = |seed: u8| RecordSpec::new(RM_HEAP_ID, XLOG_HEAP_INSERT).xid(700).main_data(vec![seed; 300]);
    w.append(&record(1));
    let restart = w.append_encoded(&record(2).encode(Lsn::INVALID));
    let last = w.append(&record(3));
    let mut wal = w.out;
    wal.resize((last.end.0 - start.0) as usize, 0);
    let src = MemWal::with_wal(7, SMALL_SEGMENT, start, wal.clone(), last.end);
    let mut server = self::server(Arc::clone(&src), Config::default()).await;
    let mut c = Client::ready(&server).await;
    c.send(|b| frontend::query(&format!("START_REPLICATION {start}"), b).unwrap()).await;
    assert!(matches!(c.recv().await, Some(Msg::CopyBoth)));
    let (mut next, mut got) = (start, Vec::new());
    receive_segments_until(&mut c, &mut next, last.end, last.end, &mut got, SMALL_SEGMENT).await;
    assert!(got == wal && restart.start < last.start);
    drop(c);
    server.next_result().await.unwrap();
}

/// Not a test: how fast the sender's record verification goes (decoding and CRC32C of the
/// fixture's records, and of test-encoder WAL of records from 100 bytes to 8 KB, fed in
/// 128 KiB reads). `cargo test -p safekeeper --release --test replication --
/// --ignored --nocapture verification_throughput`.
#[test]
#[ignore]
fn verification_throughput() {
    use safekeeper::verify::{DecodeStart, VerifiedStream};

    fn run(name: &str, start: Lsn, wal: &Bytes, config: DecoderConfig, repeat: usize) {
        let began = std::time::Instant::now();
        let (mut bytes, mut records) = (0u64, 0u64);
        for _ in 0..repeat {
            let mut s = VerifiedStream::new(start, DecodeStart { lsn: start, unverifiable_tail: false }, config).unwrap();
            let mut at = 0;
            while at < wal.len() {
                let seg_end = (((start.0 + at as u64) / config.segment_size_bytes + 1) * config.segment_size_bytes - start.0) as usize;
                let end = (at + 128 * 1024).min(wal.len()).min(seg_end);
                s.feed(wal.slice(at..end)).unwrap();
                while let Some((_, b)) = s.next_send(128 * 1024) {
                    bytes += b.len() as u64;
                }
                at = end;
            }
            records += s.records();
        }
        let secs = began.elapsed().as_secs_f64();
        println!(
            "{name}: {:.0} MB/s verified and handed out ({} MB, {} records, {:.2} s; {:.0} ns per record)",
            bytes as f64 / secs / 1e6,
            bytes / 1_000_000,
            records,
            secs,
            secs * 1e9 / records as f64
        );
    }

    let f = fixture();
    // The fixture's first segment up to its switch record, whose end is the next segment:
    // only the records (the rest of that segment is unused and skipped).
    let recs = records(&f);
    let last_in_first = recs.iter().rfind(|(s, _)| s.0 < f.start.0 + SEGMENT).unwrap();
    let used = Bytes::copy_from_slice(&f.wal[..(last_in_first.0 .0 + 64 - f.start.0) as usize]);
    let config = DecoderConfig { segment_size_bytes: SEGMENT, system_id: Some(f.system_id) };
    run("real WAL (pgwal fixture)", f.start, &used, config, 2000);

    let (start, synthetic) = synthetic_wal(64 << 20);
    let config = DecoderConfig { segment_size_bytes: SEGMENT, system_id: Some(7) };
    run("test-encoder WAL, records of 100 B to 8 KB", start, &Bytes::from(synthetic), config, 20);
}

/// About `bytes` of test-encoder WAL of records from 100 bytes to 8 KB, in 16 MiB
/// segments, ending at a record boundary; and where it starts.
fn synthetic_wal(bytes: usize) -> (Lsn, Vec<u8>) {
    use pgwal::consts::{RM_HEAP_ID, XLOG_HEAP_INSERT};
    use pgwal::test_encoder::{RecordSpec, WalWriter};
    let start = Lsn(16 * SEGMENT);
    let mut w = WalWriter::new(start, SEGMENT);
    let mut seed = 1u32;
    let mut end = start;
    while w.out.len() < bytes {
        seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let len = 100 + (seed >> 8) as usize % 8000;
        let data = (0..len).map(|i| (i as u8).wrapping_add(seed as u8)).collect();
        end = w.append(&RecordSpec::new(RM_HEAP_ID, XLOG_HEAP_INSERT).xid(700).main_data(data)).end;
    }
    let mut wal = w.out;
    wal.resize((end.0 - start.0) as usize, 0);
    (start, wal)
}

/// Not a test: the sender's throughput over loopback with every record checked, 256 MiB of
/// test-encoder WAL to a client that only counts it. `cargo test -p safekeeper --release
/// --test replication -- --ignored --nocapture streaming_throughput`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn streaming_throughput() {
    let (start, wal) = synthetic_wal(256 << 20);
    let end = Lsn(start.0 + wal.len() as u64);
    let src = MemWal::with_wal(7, SEGMENT, start, wal, end);
    let mut server = self::server(Arc::clone(&src), Config::default()).await;
    let mut c = Client::ready(&server).await;
    let began = std::time::Instant::now();
    c.send(|b| frontend::query(&format!("START_REPLICATION {start}"), b).unwrap()).await;
    assert!(matches!(c.recv().await, Some(Msg::CopyBoth)));
    let mut next = start;
    while next < end {
        if let Repl::XLogData { start: at, data, .. } = repl(c.recv().await) {
            assert_eq!(at, next);
            next = Lsn(at.0 + data.len() as u64);
        }
    }
    let secs = began.elapsed().as_secs_f64();
    println!(
        "streamed {} MB with every record checked in {secs:.2} s: {:.0} MB/s",
        (end.0 - start.0) / 1_000_000,
        (end.0 - start.0) as f64 / secs / 1e6
    );
    drop(c);
    server.next_result().await.unwrap();
}

/// The crate's directory, from cargo at run time (a test binary reused from another
/// checkout's build must not read that checkout).
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR").map(std::path::PathBuf::from).unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into())
}

/// PostgreSQL's bin directory: `FJORD_PG_BIN`, or `target/pg15/bin` as `scripts/setup`
/// builds it (as the pageserver's tests find it).
fn pg_bin() -> std::path::PathBuf {
    let dir = std::env::var_os("FJORD_PG_BIN").map(std::path::PathBuf::from).unwrap_or_else(|| manifest_dir().join("../target/pg15/bin"));
    assert!(dir.join("pg_receivewal").exists(), "no pg_receivewal in {}; run ./scripts/setup first or set FJORD_PG_BIN", dir.display());
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_receivewal_writes_exactly_the_served_wal() {
    let bin = pg_bin();
    let f = fixture();
    assert_eq!(f.start.0 % SEGMENT, 0);
    let first_commit = Lsn(f.start.0 + 5 * 1024 * 1024 + 77);
    let src = MemWal::new(&f, first_commit);
    let server = server(Arc::clone(&src), Config::default()).await;
    let dir = tempfile::tempdir().unwrap();
    // pg_receivewal starts after the newest complete segment in its directory: a dummy
    // segment before the fixture's first makes it start at the fixture's start.
    let seg = |n: u64| pgwal::segment::segment_file_name(1, n, SEGMENT);
    let first = f.start.0 / SEGMENT;
    std::fs::write(dir.path().join(seg(first - 1)), vec![0u8; SEGMENT as usize]).unwrap();
    let conninfo = format!("host=127.0.0.1 port={} user=fjord options='-c fjord.timeline={}'", server.addr.port(), server.database());
    let mut child = std::process::Command::new(bin.join("pg_receivewal"))
        .args(["-d", &conninfo, "-D"])
        .arg(dir.path())
        .args(["--no-loop", "--verbose", "--status-interval=1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();

    // It reports what it wrote (and flushed) as it goes; then the commit LSN moves.
    wait_for("pg_receivewal to report the first commit LSN", || src.last_feedback().is_some_and(|fb| fb.write_lsn >= first_commit)).await;
    src.commit.send_replace(f.end);
    wait_for("pg_receivewal to report the end of the WAL", || src.last_feedback().is_some_and(|fb| fb.write_lsn >= f.end)).await;
    assert!(src.last_feedback().unwrap().write_lsn == f.end, "{:?}", src.last_feedback());

    // SIGINT makes it close its files and exit 0.
    let killed = std::process::Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(killed.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "pg_receivewal did not exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(status.success(), "pg_receivewal failed: {log}");

    // The complete segment and the partial one hold exactly the WAL served.
    let full = std::fs::read(dir.path().join(seg(first))).unwrap_or_else(|e| panic!("segment {}: {e}; log: {log}", seg(first)));
    assert_eq!(full.len() as u64, SEGMENT);
    assert!(full == src.bytes(f.start, Lsn(f.start.0 + SEGMENT)), "segment {} differs", seg(first));
    let partial = std::fs::read(dir.path().join(format!("{}.partial", seg(first + 1)))).unwrap();
    let tail = src.bytes(Lsn(f.start.0 + SEGMENT), f.end);
    assert!(&partial[..tail.len()] == tail, "the partial segment differs");
    assert!(partial[tail.len()..].iter().all(|&b| b == 0), "bytes after the commit LSN in the partial segment");
    assert!(log.contains("starting log streaming at 0/2000000"), "{log}");
}

/// A server with authentication on: its config, a signer of the key it trusts, and the
/// failure counter it reports to.
fn auth_config(dir: &std::path::Path) -> (Config, auth::Signer, prometheus::IntCounterVec) {
    let (private, public) = auth::generate_key_pair(dir).unwrap();
    let failures = prometheus::IntCounterVec::new(prometheus::Opts::new("failures", "test"), &["reason"]).unwrap();
    let authenticator = safekeeper::access::Authenticator::new(auth::Verifier::load(&public).unwrap(), failures.clone());
    (Config { auth: Some(authenticator), ..Config::default() }, auth::Signer::load(&private).unwrap(), failures)
}

/// Connects with `database`, expects the request for a cleartext password, and answers it
/// with `password` (`None`: closes the connection instead, as libpq does without one).
async fn connect_with_password(server: &Server, database: &str, password: Option<&[u8]>) -> Option<Client> {
    let mut c = Client::connect(server.addr, &[("user", "ps"), ("replication", "true"), ("database", database)]).await;
    match c.recv().await {
        Some(Msg::Backend(backend::Message::AuthenticationCleartextPassword)) => {}
        other => panic!("expected a request for a cleartext password, got {other:?}"),
    }
    let password = password?;
    c.send(|b| frontend::password_message(password, b).unwrap()).await;
    Some(c)
}

/// With authentication on the server asks for the token as a cleartext password before it
/// looks at the timeline, and lets in only a token that may read that timeline's WAL; a
/// refusal is FATAL with SQLSTATE 28P01 (no valid token) or 28000 (a valid one that does
/// not grant the timeline) and counted by reason.
#[tokio::test]
async fn with_auth_the_password_must_be_a_token_that_may_read_the_timeline() {
    let f = fixture();
    let (keys, other_keys) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (config, signer, failures) = auth_config(keys.path());
    let (_, other_signer, _) = auth_config(other_keys.path());
    let mut server = self::server(MemWal::new(&f, f.end), config).await;
    let db = server.database();
    let t = server.tenant;
    let count = |reason: &str| failures.with_label_values(&[reason]).get();

    let expired = auth::Claims { exp: Some(1), ..auth::Claims::storage() };
    let refused: Vec<(Vec<u8>, &str, &str, &str)> = vec![
        (b"".to_vec(), "28P01", "missing", "authentication required"),
        (b"not-a-token".to_vec(), "28P01", "malformed", "malformed token"),
        (vec![b'x'; auth::TOKEN_BYTES_MAX + 1], "28P01", "malformed", "longer than the 4096 allowed"),
        (b"caf\xe9".to_vec(), "28P01", "malformed", "not UTF-8"),
        (other_signer.sign(&auth::Claims::storage()).into_bytes(), "28P01", "bad_signature", "signature does not verify"),
        (signer.sign(&expired).into_bytes(), "28P01", "expired", "the token expired"),
        (
            signer.sign(&auth::Claims::tenant(TenantId::from_bytes([3; 16]))).into_bytes(),
            "28000",
            "wrong_tenant",
            "may not read the WAL of",
        ),
        (
            signer.sign(&auth::Claims::tenant(t).with_timeline(TimelineId::from_bytes([4; 16]))).into_bytes(),
            "28000",
            "wrong_timeline",
            "the token is for timeline",
        ),
    ];
    for (password, code, reason, says) in &refused {
        let before = count(reason);
        let mut c = connect_with_password(&server, &db, Some(password)).await.unwrap();
        let e = c.expect_fatal().await;
        assert_eq!((e.code.as_str(), reason), (*code, reason), "{e:?}");
        assert!(e.message.contains(says), "{reason}: {e:?}");
        // Not an error of the connection (the refusal is logged once, by the check).
        server.next_result().await.unwrap();
        assert_eq!(count(reason), before + 1, "{reason}");
    }
    // A client without a password closes the connection: refused as sending none.
    let before = count("missing");
    drop(connect_with_password(&server, &db, None).await);
    server.next_result().await.unwrap();
    assert_eq!(count("missing"), before + 1);
    // An unknown timeline: the token is checked first, so a client without one learns
    // nothing; with one that grants it, the timeline's absence is the error.
    let unknown = format!("{t}/33333333333333333333333333333333");
    let mut c = connect_with_password(&server, &unknown, Some(b"")).await.unwrap();
    assert_eq!(c.expect_fatal().await.code, "28P01");
    server.next_result().await.unwrap();
    let mut c = connect_with_password(&server, &unknown, Some(signer.sign(&auth::Claims::storage()).as_bytes())).await.unwrap();
    assert_eq!(c.expect_fatal().await.code, "3D000");
    assert!(server.next_result().await.is_err());

    // Tokens that may read it: the pageserver's (storage), an admin's, the tenant's (a
    // read replica), narrowed to the timeline or not. The session then works as ever.
    let (failures_before, timeline) = (auth::AuthError::REASONS.map(count), server.timeline);
    for claims in [auth::Claims::storage(), auth::Claims::admin(), auth::Claims::tenant(t), auth::Claims::tenant(t).with_timeline(timeline)]
    {
        let mut c = connect_with_password(&server, &db, Some(signer.sign(&claims).as_bytes())).await.unwrap();
        let msgs = c.until_ready().await;
        assert!(matches!(msgs[0], Msg::Backend(backend::Message::AuthenticationOk)), "{claims:?}: {msgs:?}");
        let (_, rows) = c.query("IDENTIFY_SYSTEM").await.unwrap();
        assert_eq!(rows[0][2], Some(f.end.to_string()));
        drop(c);
        server.next_result().await.unwrap();
    }
    assert_eq!(auth::AuthError::REASONS.map(count), failures_before, "nothing refused");
}

/// Without authentication nothing is asked: `AuthenticationOk` right after the startup
/// (trust, as before tokens existed). `Client::ready` checks it in every other test.
#[tokio::test]
async fn without_auth_nothing_is_asked() {
    let f = fixture();
    let mut server = self::server(MemWal::new(&f, f.end), Config::default()).await;
    drop(Client::ready(&server).await);
    server.next_result().await.unwrap();
}
