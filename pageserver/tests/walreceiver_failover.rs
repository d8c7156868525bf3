//! The WAL receiver's choice of source, end to end on loopback.
//!
//! - `dead_first_source_fails_over_to_a_real_postgres`: sources `[a dead port, a real
//!   PostgreSQL]`; the receiver must stream from the second, as a standby the server
//!   reports under `fjord_pageserver`, and ingest the server's WAL (the `database` startup
//!   parameter that every connection sends is ignored by a physical walsender).
//! - `lagging_source_is_left_for_one_with_more_wal`: two fake walsenders serve the same
//!   real WAL (a workload's, from a real PostgreSQL's `pg_wal`), the first only up to the
//!   middle and then nothing but keepalives; the receiver must probe, switch to the second
//!   and ingest to the end, exactly where ingesting `pg_wal` directly ends. The fakes
//!   (`FakeWalsender`) stand in for safekeepers, which serve committed WAL over the same
//!   protocol (a real safekeeper falls behind only by accident); they speak just enough of
//!   it: startup, trust authentication, `IDENTIFY_SYSTEM`, `START_REPLICATION` with
//!   `XLogData` and keepalives, and standby status updates read back. The second says it is
//!   a safekeeper (`ParameterStatus fjord.safekeeper = 1`) and must be sent the timeline's
//!   remote-consistent LSN in fjord's own message; the first, a plain walsender, never.
//!
//! Needs our PostgreSQL build (`target/pg15`, see `tests/support`).

mod support;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use layerstore::{Reconstructor, StorageConfig, Tenant};
use pageserver::service::walreceiver::{WalReceiver, WalReceiverStatus, WalSource, WalSources};
use pageserver::{import_datadir, PgReconstructor, WalIngest};
use proto::{Lsn, TenantId, TimelineId};
use support::PgCluster;

const WAIT: Duration = Duration::from_secs(60);

/// A port nothing listens on (at the moment it is returned).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn source(port: u16) -> WalSource {
    WalSource { host: "127.0.0.1".into(), port, user: "postgres".into(), plaintext: false }
}

fn wait_for(what: &str, rx: &WalReceiver, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "waited {WAIT:?} for {what}; receiver status: {:#?}", rx.status());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn reconstructor() -> Arc<dyn Reconstructor> {
    // Ingest needs no WAL redo; reads are not tested here.
    Arc::new(PgReconstructor::rust_only())
}

#[test]
fn dead_first_source_fails_over_to_a_real_postgres() {
    let mut pg = PgCluster::initdb();
    let tenants = pg.dir.path().join("tenants");
    std::fs::create_dir(&tenants).unwrap();
    let tenant = Tenant::create(&tenants, TenantId([1; 16]), StorageConfig::default(), &[]).unwrap();
    let timeline = tenant.create_timeline(TimelineId([2; 16])).unwrap();
    import_datadir(&timeline, &pg.pgdata).expect("import the initdb output");
    pg.configure(&[("fsync", "off"), ("autovacuum", "off"), ("wal_keep_size", "'1GB'")]);
    pg.start_on_loopback(free_port());
    let dead = free_port();
    let sources = WalSources::new(vec![source(dead), source(pg.port())]).unwrap();
    let rx = WalReceiver::start(Arc::clone(&timeline), Default::default(), reconstructor(), sources);

    pg.psql("postgres", "CREATE TABLE t AS SELECT g, md5(g::text) FROM generate_series(1, 5000) g;");
    let flushed: Lsn = pg.psql("postgres", "SELECT pg_current_wal_flush_lsn()").trim().parse().unwrap();
    wait_for("the receiver to ingest the server's WAL", &rx, || timeline.last_record_lsn() >= flushed);
    let status = rx.status();
    assert_eq!(status.state.as_str(), "streaming", "{status:#?}");
    assert_eq!(status.current_source, Some(1), "{status:#?}");
    assert_eq!(status.current_source_address.as_deref(), Some(format!("127.0.0.1:{}", pg.port()).as_str()));
    let dead_error = status.sources[0].last_error.as_deref().unwrap_or_default();
    assert!(dead_error.contains("connect"), "the dead source's error: {status:#?}");
    assert!(status.sources[1].end_lsn.is_some() && status.sources[1].last_error.is_none(), "{status:#?}");
    assert_eq!(pg.psql("postgres", "SELECT application_name FROM pg_stat_replication").trim(), "fjord_pageserver");
    rx.stop();
    pg.stop();
}

#[test]
fn lagging_source_is_left_for_one_with_more_wal() {
    let mut pg = PgCluster::initdb();
    let tenants = pg.dir.path().join("tenants");
    std::fs::create_dir(&tenants).unwrap();
    let tenant = Tenant::create(&tenants, TenantId([3; 16]), StorageConfig::default(), &[]).unwrap();
    let timeline = tenant.create_timeline(TimelineId([4; 16])).unwrap();
    let reference = tenant.create_timeline(TimelineId([5; 16])).unwrap();
    let summary = import_datadir(&timeline, &pg.pgdata).expect("import the initdb output");
    import_datadir(&reference, &pg.pgdata).expect("import the initdb output again");
    pg.configure(&[("fsync", "off"), ("autovacuum", "off"), ("wal_keep_size", "'1GB'")]);
    pg.start();
    pg.psql("postgres", "CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 5000) g; DELETE FROM t WHERE id % 3 = 0;");
    pg.stop();

    // Where the WAL ends, as ingesting pg_wal directly finds it.
    let pg_wal = pg.pgdata.join("pg_wal");
    let start = summary.import_lsn;
    let end =
        WalIngest::new(Arc::clone(&reference), reconstructor()).ingest_pg_wal(&pg_wal, summary.pg_timeline_id, start).unwrap().end_lsn;
    assert!(end.0 > start.0 + 100_000, "the workload wrote WAL: {start}..{end}");
    let wal = read_wal(&pg_wal, summary.pg_timeline_id, start, end);
    let middle = Lsn(start.0 + (end.0 - start.0) / 2);

    let behind = FakeWalsender::start(start, wal.clone(), middle, false);
    let ahead = FakeWalsender::start(start, wal, end, true);
    let sources = WalSources::new(vec![source(behind.port), source(ahead.port)]).unwrap();
    let rx = WalReceiver::start(Arc::clone(&timeline), Default::default(), reconstructor(), sources);
    wait_for("the receiver to ingest all the WAL", &rx, || timeline.last_record_lsn() == end);

    let status: WalReceiverStatus = rx.status();
    assert_eq!(status.current_source, Some(1), "{status:#?}");
    assert_eq!(status.lag_switches, 1, "{status:#?}");
    assert_eq!(status.sources[0].end_lsn, Some(middle), "{status:#?}");
    assert_eq!(status.sources[1].end_lsn, Some(end), "{status:#?}");
    // Idle, the receiver flushes its layers; the safekeeper learns how far that got.
    wait_for("the remote-consistent LSN to reach the safekeeper", &rx, || {
        ahead.remote_consistent.lock().unwrap().last() == Some(&end) && timeline.remote_consistent_lsn() == end
    });
    rx.stop();
    let sent = ahead.remote_consistent.lock().unwrap().clone();
    assert!(sent.windows(2).all(|w| w[0] < w[1]), "sent only when it moved: {sent:?}");
    assert!(behind.remote_consistent.lock().unwrap().is_empty(), "a walsender that is no safekeeper was sent fjord's message");

    // The lagging source was told how far the pageserver got: all it had, fsynced.
    assert_eq!(*behind.flushed.lock().unwrap(), Some(middle));
    // The second session started where the first left a complete record, not above.
    let starts = ahead.replication_starts.lock().unwrap().clone();
    assert!(!starts.is_empty() && starts.iter().all(|&s| s >= start && s <= middle), "{starts:?}, {start}..{middle}");
    let database = format!("{}/{}", timeline.tenant_id(), timeline.timeline_id());
    for fake in [&behind, &ahead] {
        let params = fake.startups.lock().unwrap().clone();
        assert!(!params.is_empty());
        for p in params {
            assert_eq!(p.get("database"), Some(&database), "{p:?}");
            assert_eq!(p.get("replication").map(String::as_str), Some("true"), "{p:?}");
            assert_eq!(p.get("application_name").map(String::as_str), Some("fjord_pageserver"), "{p:?}");
        }
    }
}

/// The bytes of WAL `[start, end)` from PostgreSQL's 16 MiB segment files.
fn read_wal(pg_wal: &Path, tli: u32, start: Lsn, end: Lsn) -> Vec<u8> {
    const SEGMENT_BYTES: u64 = 16 * 1024 * 1024;
    let mut out = Vec::new();
    let mut pos = start.0;
    while pos < end.0 {
        let segno = pos / SEGMENT_BYTES;
        let name = pgwal::segment::segment_file_name(tli, segno, SEGMENT_BYTES);
        let file = std::fs::read(pg_wal.join(&name)).unwrap_or_else(|e| panic!("read {name}: {e}"));
        let from = (pos % SEGMENT_BYTES) as usize;
        let to = (end.0.min((segno + 1) * SEGMENT_BYTES) - segno * SEGMENT_BYTES) as usize;
        out.extend_from_slice(&file[from..to]);
        pos = (segno * SEGMENT_BYTES) + to as u64;
    }
    out
}

/// A walsender serving `wal` (which starts at `wal_start`) up to `serve_end`, then only
/// keepalives. What clients sent is recorded for the test to check.
struct FakeWalsender {
    port: u16,
    /// Each connection's startup parameters.
    startups: Arc<Mutex<Vec<HashMap<String, String>>>>,
    /// Each `START_REPLICATION`'s LSN.
    replication_starts: Arc<Mutex<Vec<Lsn>>>,
    /// The highest flush LSN of the standby status updates received.
    flushed: Arc<Mutex<Option<Lsn>>>,
    /// The remote-consistent LSN messages received, in order.
    remote_consistent: Arc<Mutex<Vec<Lsn>>>,
}

#[derive(Clone)]
struct Served {
    /// Reports `fjord.safekeeper` at startup, as a safekeeper does.
    safekeeper: bool,
    remote_consistent: Arc<Mutex<Vec<Lsn>>>,
    wal_start: Lsn,
    wal: Arc<Vec<u8>>,
    serve_end: Lsn,
    startups: Arc<Mutex<Vec<HashMap<String, String>>>>,
    replication_starts: Arc<Mutex<Vec<Lsn>>>,
    flushed: Arc<Mutex<Option<Lsn>>>,
}

impl FakeWalsender {
    fn start(wal_start: Lsn, wal: Vec<u8>, serve_end: Lsn, safekeeper: bool) -> FakeWalsender {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let served = Served {
            safekeeper,
            remote_consistent: Arc::default(),
            wal_start,
            wal: Arc::new(wal),
            serve_end,
            startups: Arc::default(),
            replication_starts: Arc::default(),
            flushed: Arc::default(),
        };
        let fake = FakeWalsender {
            port,
            startups: Arc::clone(&served.startups),
            replication_starts: Arc::clone(&served.replication_starts),
            flushed: Arc::clone(&served.flushed),
            remote_consistent: Arc::clone(&served.remote_consistent),
        };
        // The threads end with the test process; a client closing ends its connection's.
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let served = served.clone();
                std::thread::spawn(move || {
                    let _ = serve(conn, &served);
                });
            }
        });
        fake
    }
}

fn message(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![tag];
    m.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
    m.extend_from_slice(body);
    m
}

fn read_message(conn: &mut TcpStream) -> std::io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 5];
    conn.read_exact(&mut head)?;
    let len = u32::from_be_bytes(head[1..5].try_into().unwrap()) as usize;
    let mut body = vec![0u8; len - 4];
    conn.read_exact(&mut body)?;
    Ok((head[0], body))
}

fn data_row(fields: &[Option<&str>]) -> Vec<u8> {
    let mut body = (fields.len() as u16).to_be_bytes().to_vec();
    for f in fields {
        match f {
            Some(s) => {
                body.extend_from_slice(&(s.len() as i32).to_be_bytes());
                body.extend_from_slice(s.as_bytes());
            }
            None => body.extend_from_slice(&(-1i32).to_be_bytes()),
        }
    }
    message(b'D', &body)
}

fn serve(mut conn: TcpStream, served: &Served) -> std::io::Result<()> {
    // Startup: length, protocol 3.0, then name/value pairs ending with an empty name.
    let mut len = [0u8; 4];
    conn.read_exact(&mut len)?;
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize - 4];
    conn.read_exact(&mut body)?;
    assert_eq!(&body[..4], &196_608u32.to_be_bytes(), "protocol 3.0");
    let strings: Vec<String> = body[4..].split(|&b| b == 0).map(|s| String::from_utf8_lossy(s).into_owned()).collect();
    let params: HashMap<String, String> =
        strings.chunks(2).filter(|c| c.len() == 2 && !c[0].is_empty()).map(|c| (c[0].clone(), c[1].clone())).collect();
    served.startups.lock().unwrap().push(params);
    conn.write_all(&message(b'R', &0u32.to_be_bytes()))?;
    if served.safekeeper {
        conn.write_all(&message(b'S', b"fjord.safekeeper\x001\x00"))?;
    }
    conn.write_all(&message(b'Z', b"I"))?;
    loop {
        let (tag, body) = read_message(&mut conn)?;
        if tag == b'X' {
            return Ok(());
        }
        assert_eq!(tag, b'Q', "only simple queries");
        let query = String::from_utf8_lossy(&body[..body.len() - 1]).into_owned();
        if query == "IDENTIFY_SYSTEM" {
            let end = served.serve_end.to_string();
            conn.write_all(&data_row(&[Some("7000000000000000001"), Some("1"), Some(&end), None]))?;
            conn.write_all(&message(b'C', b"IDENTIFY_SYSTEM\0"))?;
            conn.write_all(&message(b'Z', b"I"))?;
        } else if let Some(rest) = query.strip_prefix("START_REPLICATION PHYSICAL ") {
            let lsn: Lsn = rest.split(' ').next().unwrap().parse().unwrap();
            served.replication_starts.lock().unwrap().push(lsn);
            return stream(conn, served, lsn);
        } else {
            panic!("unexpected query {query:?}");
        }
    }
}

/// CopyBoth, then `XLogData` from `from` to the served end, then a keepalive every 100 ms;
/// standby status updates are read all along.
fn stream(mut conn: TcpStream, served: &Served, from: Lsn) -> std::io::Result<()> {
    conn.write_all(&message(b'W', &[0, 0, 0]))?;
    let mut pos = from.0;
    while pos < served.serve_end.0 {
        let to = served.serve_end.0.min(pos + 8192);
        let mut payload = vec![b'w'];
        payload.extend_from_slice(&pos.to_be_bytes());
        payload.extend_from_slice(&served.serve_end.0.to_be_bytes());
        payload.extend_from_slice(&0i64.to_be_bytes());
        let offset = (pos - served.wal_start.0) as usize;
        payload.extend_from_slice(&served.wal[offset..offset + (to - pos) as usize]);
        conn.write_all(&message(b'd', &payload))?;
        pos = to;
    }
    conn.set_read_timeout(Some(Duration::from_millis(100)))?;
    let mut buf = Vec::new();
    loop {
        let mut keepalive = vec![b'k'];
        keepalive.extend_from_slice(&served.serve_end.0.to_be_bytes());
        keepalive.extend_from_slice(&0i64.to_be_bytes());
        keepalive.push(0);
        conn.write_all(&message(b'd', &keepalive))?;
        let mut chunk = [0u8; 4096];
        match conn.read(&mut chunk) {
            Ok(0) => return Ok(()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) => return Err(e),
        }
        // Complete messages: CopyData with a standby status update ('r'), hot standby
        // feedback ('h', ignored) or fjord's remote-consistent LSN ('P', 9 bytes).
        while buf.len() >= 5 {
            let len = u32::from_be_bytes(buf[1..5].try_into().unwrap()) as usize;
            if buf.len() < 1 + len {
                break;
            }
            let msg: Vec<u8> = buf.drain(..1 + len).collect();
            if msg[0] == b'd' && msg.get(5) == Some(&b'r') && msg.len() >= 5 + 34 {
                let flush = Lsn(u64::from_be_bytes(msg[14..22].try_into().unwrap()));
                let mut flushed = served.flushed.lock().unwrap();
                *flushed = Some(flushed.map_or(flush, |f| f.max(flush)));
            }
            if msg[0] == b'd' && msg.get(5) == Some(&b'P') {
                assert_eq!(msg.len(), 5 + 9, "the remote-consistent LSN message");
                served.remote_consistent.lock().unwrap().push(Lsn(u64::from_be_bytes(msg[6..14].try_into().unwrap())));
            }
        }
    }
}
