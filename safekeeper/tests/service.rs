//! The `safekeeper` binary as a real process on loopback, driven over TCP by
//! `quorum::Proposer` speaking the wire protocol: election, appends, commit, restart;
//! malformed messages; a wrong system id; the HTTP API; the data directory lock; WAL
//! removal (and `--no-wal-removal`), and who may move its horizon; authentication (`--auth-public-key`) of proposers and
//! of the HTTP API.

use bytes::{Bytes, BytesMut};
use proto::{Lsn, TenantId, TimelineId};
use quorum::wire::{AcceptorMessage, ProposerMessage, PROTOCOL_VERSION};
use quorum::{Proposer, ProposerAction, ProposerConfig, ToAcceptor};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SEG: u32 = 1 << 20;
const SYSID: u64 = 7_123_456_789;

fn ids() -> (TenantId, TimelineId) {
    (TenantId::from_bytes([0x11; 16]), TimelineId::from_bytes([0x22; 16]))
}

/// `N` distinct loopback ports that nothing listens on and that this process has not handed
/// out before: every listener is held until all `N` are chosen, and a set remembers the ports
/// given to earlier callers (tests run on parallel threads), so two safekeepers started
/// from here never race for one port.
fn free_ports<const N: usize>() -> [u16; N] {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> = std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut given = GIVEN.lock().unwrap();
    let mut held = Vec::new();
    let mut ports = [0; N];
    for p in &mut ports {
        *p = loop {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = l.local_addr().unwrap().port();
            held.push(l);
            if given.insert(port) {
                break port;
            }
        };
    }
    ports
}

struct Node {
    child: Child,
    port: u16,
    http_port: u16,
}

impl Node {
    fn start(data_dir: &Path) -> Node {
        Node::start_with(data_dir, &[])
    }

    fn start_with(data_dir: &Path, extra_args: &[&str]) -> Node {
        let [port, http_port] = free_ports();
        let child = Command::new(env!("CARGO_BIN_EXE_safekeeper"))
            .args(["--id", "7", "--data-dir"])
            .arg(data_dir)
            .args(["--listen", &format!("127.0.0.1:{port}"), "--http", &format!("127.0.0.1:{http_port}")])
            .arg("--no-tls")
            .args(extra_args)
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let node = Node { child, port, http_port };
        let deadline = Instant::now() + Duration::from_secs(20);
        while http_get(node.http_port, "/v1/status").is_none() {
            assert!(Instant::now() < deadline, "safekeeper did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        node
    }

    /// SIGTERM, and expect a clean exit.
    fn stop(mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        assert!(status.success(), "safekeeper exited with {status}");
    }

    fn connect(&self) -> Conn {
        let s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        Conn { s, buf: BytesMut::new() }
    }

    /// Creates the test timeline on purpose (as the control plane does): a voter.
    fn create_timeline(&self) -> (u16, serde_json::Value) {
        let (t, tl) = ids();
        let body = format!(r#"{{"system_id": {SYSID}, "wal_segment_size": {SEG}}}"#);
        let (code, body) = http_post(self.http_port, &format!("/v1/tenant/{t}/timeline/{tl}"), &body).unwrap();
        (code, serde_json::from_str(&body).unwrap())
    }

    /// [`Node::create_timeline`] with an admin token, for a node with authentication on.
    fn create_timeline_with(&self, admin_token: &str) -> (u16, serde_json::Value) {
        let (t, tl) = ids();
        let body = format!(r#"{{"system_id": {SYSID}, "wal_segment_size": {SEG}}}"#);
        let auth = format!("Bearer {admin_token}");
        let (code, _, body) =
            http_request_with(self.http_port, "POST", &format!("/v1/tenant/{t}/timeline/{tl}"), Some(&body), Some(&auth)).unwrap();
        (code, serde_json::from_str(&body).unwrap())
    }

    fn timeline(&self) -> (u16, serde_json::Value) {
        let (t, tl) = ids();
        let (code, body) = http_get(self.http_port, &format!("/v1/tenant/{t}/timeline/{tl}")).unwrap();
        (code, serde_json::from_str(&body).unwrap())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A minimal HTTP/1.1 GET: (status code, body), `None` if nothing listens.
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    http_request(port, "GET", path, None)
}

/// A minimal HTTP/1.1 POST of a JSON body.
fn http_post(port: u16, path: &str, body: &str) -> Option<(u16, String)> {
    http_request(port, "POST", path, Some(body))
}

fn http_request(port: u16, method: &str, path: &str, body: Option<&str>) -> Option<(u16, String)> {
    http_request_with(port, method, path, body, None).map(|(code, _, body)| (code, body))
}

/// A request with an optional `Authorization` header value: (status code, head, body).
fn http_request_with(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&str>,
    authorization: Option<&str>,
) -> Option<(u16, String, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    let body = body.unwrap_or("");
    let auth = authorization.map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).ok()?;
    let code = resp.split(' ').nth(1)?.parse().ok()?;
    let (head, body) = resp.split_once("\r\n\r\n")?;
    Some((code, head.to_string(), body.to_string()))
}

struct Conn {
    s: TcpStream,
    buf: BytesMut,
}

impl Conn {
    fn send(&mut self, m: &ProposerMessage) {
        let mut out = BytesMut::new();
        m.encode(&mut out);
        self.s.write_all(&out).unwrap();
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).unwrap();
    }

    /// The next message; `None` at end of stream.
    fn recv(&mut self) -> Option<AcceptorMessage> {
        loop {
            if let Some(m) = AcceptorMessage::decode(&mut self.buf).unwrap() {
                return Some(m);
            }
            let mut chunk = [0u8; 65536];
            let n = self.s.read(&mut chunk).unwrap();
            if n == 0 {
                return None;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn hello(&mut self, system_id: u64) -> AcceptorMessage {
        self.hello_with_token(system_id, "")
    }

    fn hello_with_token(&mut self, system_id: u64, token: &str) -> AcceptorMessage {
        let (tenant, timeline) = ids();
        self.send(&ProposerMessage::Hello {
            protocol_version: PROTOCOL_VERSION,
            tenant,
            timeline,
            system_id,
            wal_segment_size: SEG,
            name: "test proposer".into(),
            auth_token: token.to_string(),
        });
        self.recv().unwrap()
    }
}

/// The proposer's shell: its WAL from `start`, one connection to acceptor 0.
struct Shell {
    p: Proposer,
    conn: Conn,
    start: Lsn,
    wal: Vec<u8>,
    elected: Option<Lsn>,
    commit: Lsn,
}

impl Shell {
    fn new(conn: Conn, start: Lsn) -> Shell {
        let p = Proposer::new(1, start, ProposerConfig { max_append: 64 * 1024, ..ProposerConfig::default() });
        Shell { p, conn, start, wal: Vec::new(), elected: None, commit: Lsn(0) }
    }

    /// Carries out actions and feeds replies back until nothing is outstanding.
    fn drive(&mut self, actions: Vec<ProposerAction>) {
        let mut queue: std::collections::VecDeque<ProposerAction> = actions.into();
        let mut outstanding = 0usize;
        loop {
            while let Some(a) = queue.pop_front() {
                match a {
                    ProposerAction::Send(0, m) => {
                        outstanding += 1;
                        self.conn.send(&ProposerMessage::Consensus(m));
                    }
                    ProposerAction::SendWal {
                        to: 0,
                        term,
                        begin,
                        end,
                        boundary_lsn,
                        commit_lsn,
                        peer_horizon_lsn,
                        remote_consistent_lsn,
                    } => {
                        let from = (begin.0 - self.start.0) as usize;
                        let to = (end.0 - self.start.0) as usize;
                        let data = Bytes::copy_from_slice(&self.wal[from..to]);
                        outstanding += 1;
                        let m = ToAcceptor::Append {
                            term,
                            begin_lsn: begin,
                            data,
                            boundary_lsn,
                            commit_lsn,
                            peer_horizon_lsn,
                            remote_consistent_lsn,
                        };
                        self.conn.send(&ProposerMessage::Consensus(m));
                    }
                    ProposerAction::Elected { start_lsn, .. } => self.elected = Some(start_lsn),
                    ProposerAction::Commit { commit_lsn, .. } => self.commit = commit_lsn,
                    other => panic!("unexpected proposer action {other:?}"),
                }
            }
            if outstanding == 0 {
                return;
            }
            match self.conn.recv().expect("safekeeper closed the connection") {
                AcceptorMessage::Consensus(m) => {
                    outstanding -= 1;
                    queue.extend(self.p.handle(0, m));
                }
                AcceptorMessage::Feedback(_) => {}
                other => panic!("unexpected message {other:?}"),
            }
        }
    }

    fn elect(&mut self) {
        let a = self.p.start_election();
        self.drive(a);
        assert!(self.p.is_leader(), "proposer was not elected");
    }

    fn append(&mut self, data: &[u8]) -> Lsn {
        self.wal.extend_from_slice(data);
        let end = Lsn(self.start.0 + self.wal.len() as u64);
        let a = self.p.append(end, end);
        self.drive(a);
        end
    }
}

fn synthetic(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A `Hello` of `protocol_version` for the test timeline, without a token.
fn hello_message(protocol_version: u32) -> ProposerMessage {
    let (tenant, timeline) = ids();
    ProposerMessage::Hello {
        protocol_version,
        tenant,
        timeline,
        system_id: SYSID,
        wal_segment_size: SEG,
        name: "x".into(),
        auth_token: String::new(),
    }
}

#[test]
fn proposer_session_election_appends_commit_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    assert_eq!(node.create_timeline().0, 201);
    let start = Lsn(3 * SEG as u64 + 0x28);

    let mut conn = node.connect();
    assert_eq!(conn.hello(SYSID), AcceptorMessage::HelloOk { protocol_version: PROTOCOL_VERSION, node_id: 7 });
    let mut shell = Shell::new(conn, start);
    shell.elect();
    assert_eq!(shell.elected, Some(start));
    let a = synthetic(300_000, 1);
    let b = synthetic(1_500_000, 2); // crosses a segment boundary
    shell.append(&a);
    let end = shell.append(&b);
    assert_eq!(shell.commit, end, "a single acceptor commits everything it flushed");
    let (code, st) = node.timeline();
    assert_eq!(code, 200);
    assert_eq!(st["state"], "ok");
    assert_eq!(st["learner"], false);
    assert_eq!(st["term"], 1);
    assert_eq!(st["flush_lsn"], end.to_string());
    assert_eq!(st["commit_lsn"], end.to_string());
    assert_eq!(st["wal_begin_lsn"], start.to_string());
    assert_eq!(st["term_history"][0]["lsn"], start.to_string());
    let (_, metrics) = http_get(node.http_port, "/metrics").unwrap();
    assert!(metrics.contains("safekeeper_fsyncs_total"), "{metrics}");
    assert!(metrics.contains(&format!("safekeeper_flush_lsn{{tenant_id=\"{}\"", ids().0)), "{metrics}");
    let (_, status) = http_get(node.http_port, "/v1/status").unwrap();
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["node_id"], 7);
    assert_eq!(status["timelines"], 1);
    drop(shell);
    node.stop();

    // Restart: term, history, flush and (persisted at shutdown) commit are back.
    let node = Node::start(dir.path());
    let (_, st) = node.timeline();
    assert_eq!(st["term"], 1);
    assert_eq!(st["flush_lsn"], end.to_string());
    assert_eq!(st["commit_lsn"], end.to_string());

    // A new proposer (a new compute) is elected in term 2 from this safekeeper's WAL and
    // continues it.
    let mut conn = node.connect();
    assert!(matches!(conn.hello(SYSID), AcceptorMessage::HelloOk { .. }));
    let mut shell2 = Shell::new(conn, end);
    shell2.elect();
    assert_eq!(shell2.p.term(), 2);
    assert_eq!(shell2.elected, Some(end));
    let c = synthetic(70_000, 3);
    let end2 = shell2.append(&c);
    assert_eq!(shell2.commit, end2);
    let (_, st) = node.timeline();
    assert_eq!(st["term"], 2);
    assert_eq!(st["term_history"].as_array().unwrap().len(), 2);
    assert_eq!(st["flush_lsn"], end2.to_string());
    drop(shell2);
    node.stop();

    // Every byte is on disk, in place.
    let sk = safekeeper::Safekeeper::open(7, dir.path()).unwrap();
    let tl = sk.get_timeline(ids().0, ids().1).unwrap();
    let all: Vec<u8> = [a, b, c].concat();
    assert_eq!(&tl.read_wal(start, end2).unwrap()[..], &all[..]);
    assert_eq!(tl.commit_lsn(), end2);
}

/// The segment files in the timeline's directory, sorted.
fn segment_files(data_dir: &Path) -> Vec<String> {
    let (t, tl) = ids();
    let mut v: Vec<String> = std::fs::read_dir(data_dir.join(t.to_string()).join(tl.to_string()))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.len() == 24)
        .collect();
    v.sort();
    v
}

/// Polls the timeline's HTTP status until `done` holds (at most 20 s).
/// What the pageserver does for a safekeeper it does not stream from: a replication
/// connection (the token as password if one is asked for) and fjord's
/// `FJORD_REMOTE_CONSISTENT_LSN <generation> X/X`. `Err` with the server's message for an
/// error.
fn report_remote_consistent_lsn(node: &Node, token: Option<&str>, generation: u32, lsn: Lsn) -> Result<(), String> {
    let (t, tl) = ids();
    let mut s = TcpStream::connect(("127.0.0.1", node.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut startup = 196608u32.to_be_bytes().to_vec();
    for (k, v) in [("user", "fjord".to_string()), ("replication", "true".into()), ("database", format!("{t}/{tl}"))] {
        startup.extend_from_slice(k.as_bytes());
        startup.push(0);
        startup.extend_from_slice(v.as_bytes());
        startup.push(0);
    }
    startup.push(0);
    let mut out = ((startup.len() + 4) as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&startup);
    s.write_all(&out).unwrap();
    let message = |tag: u8, body: &[u8]| {
        let mut m = vec![tag];
        m.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        m.extend_from_slice(body);
        m
    };
    let mut buf = Vec::new();
    let mut next = |s: &mut TcpStream| -> (u8, Vec<u8>) {
        loop {
            if buf.len() >= 5 {
                let n = u32::from_be_bytes(buf[1..5].try_into().unwrap()) as usize;
                if buf.len() > n {
                    let m: Vec<u8> = buf.drain(..1 + n).collect();
                    return (m[0], m[5..].to_vec());
                }
            }
            let mut chunk = [0u8; 4096];
            let n = s.read(&mut chunk).unwrap();
            assert!(n > 0, "the safekeeper closed the connection");
            buf.extend_from_slice(&chunk[..n]);
        }
    };
    let mut error = None;
    let mut query = Some(format!("FJORD_REMOTE_CONSISTENT_LSN {generation} {lsn}\0"));
    loop {
        match next(&mut s) {
            (b'R', body) if body == 3u32.to_be_bytes() => {
                let mut p = token.unwrap_or("").as_bytes().to_vec();
                p.push(0);
                s.write_all(&message(b'p', &p)).unwrap();
            }
            (b'E', body) => error = Some(String::from_utf8_lossy(&body).into_owned()),
            (b'Z', _) => match query.take() {
                Some(q) => s.write_all(&message(b'Q', q.as_bytes())).unwrap(),
                None => break,
            },
            _ => {}
        }
    }
    error.map_or(Ok(()), Err)
}

fn wait_status(node: &Node, what: &str, done: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, st) = node.timeline();
        if done(&st) {
            return st;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}: {st:#}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// WAL removal in the real process: nothing goes before a pageserver's remote-consistent
/// LSN arrives (relayed by the proposer here); then, within about a second, the segments
/// wholly below the lowest of it, the peer horizon and the commit LSN, which the status and
/// metrics show; the values survive a restart. With `--no-wal-removal` everything stays.
#[test]
fn wal_below_the_horizon_is_removed_unless_turned_off() {
    for removal in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let node = if removal { Node::start(dir.path()) } else { Node::start_with(dir.path(), &["--no-wal-removal"]) };
        node.create_timeline();
        let start = Lsn(3 * SEG as u64 + 0x28);
        let mut conn = node.connect();
        assert!(matches!(conn.hello(SYSID), AcceptorMessage::HelloOk { .. }));
        let mut shell = Shell::new(conn, start);
        shell.elect();
        let end = shell.append(&synthetic(4 * SEG as usize + 1000, 4)); // into segment 7
        let all = segment_files(dir.path());
        assert_eq!(all.len(), 5, "{all:?}");
        // Committed and on every acceptor (this proposer has one), the peer horizon reaches
        // the end at the next tick; still nothing is removed without a pageserver.
        let a = shell.p.tick();
        shell.drive(a);
        let st = wait_status(&node, "the peer horizon", |st| {
            st["wal_removal_horizon_lsn"] == "0/0" && st["peer_horizon_lsn"] == end.to_string()
        });
        assert_eq!(st["remote_consistent_lsn"], "0/0");
        std::thread::sleep(Duration::from_millis(1500));
        assert_eq!(segment_files(dir.path()), all, "removed before a pageserver reported");
        // The pageserver's remote-consistent LSN, as the pageserver reports it.
        let rcl = Lsn(6 * SEG as u64 + 10);
        report_remote_consistent_lsn(&node, None, 1, rcl).unwrap();
        let st = wait_status(&node, "the removal horizon", |st| st["wal_removal_horizon_lsn"] == rcl.to_string());
        assert_eq!(st["remote_consistent_lsn"], rcl.to_string());
        if removal {
            let st = wait_status(&node, "the removal", |st| st["wal_begin_lsn"] == Lsn(6 * SEG as u64).to_string());
            assert_eq!(st["wal_disk_bytes"], 2 * SEG as u64);
            assert_eq!(segment_files(dir.path()), all[3..].to_vec());
            let (_, metrics) = http_get(node.http_port, "/metrics").unwrap();
            let labels = format!("{{tenant_id=\"{}\",timeline_id=\"{}\"}}", ids().0, ids().1);
            for line in [
                format!("safekeeper_wal_segments_removed_total{labels} 3"),
                format!("safekeeper_wal_disk_bytes{labels} {}", 2 * SEG),
                format!("safekeeper_wal_removal_horizon_lsn{labels} {}", rcl.0),
                format!("safekeeper_remote_consistent_lsn{labels} {}", rcl.0),
                format!("safekeeper_peer_horizon_lsn{labels} {}", end.0),
            ] {
                assert!(
                    metrics.lines().any(|l| l == line),
                    "no line {line:?} in:
{metrics}"
                );
            }
        } else {
            std::thread::sleep(Duration::from_millis(2500));
            assert_eq!(segment_files(dir.path()), all, "removed with --no-wal-removal");
            assert_eq!(node.timeline().1["wal_begin_lsn"], start.to_string());
        }
        // Appends go on after a removal.
        let end2 = shell.append(&synthetic(1000, 5));
        drop(shell);
        node.stop();
        let node = if removal { Node::start(dir.path()) } else { Node::start_with(dir.path(), &["--no-wal-removal"]) };
        let (_, st) = node.timeline();
        assert_eq!(st["remote_consistent_lsn"], rcl.to_string(), "persisted");
        assert_eq!(st["remote_consistent_generation"], 1, "persisted");
        assert_eq!(st["peer_horizon_lsn"], end2.to_string(), "persisted (the commit-only append after the last one carried it)");
        assert_eq!(st["flush_lsn"], end2.to_string());
        let begin = if removal { Lsn(6 * SEG as u64) } else { start };
        assert_eq!(st["wal_begin_lsn"], begin.to_string());
        node.stop();
    }
}

/// A proposer holds only a tenant token (a compute's), so the remote-consistent LSN its
/// `Append`s carry is whatever the compute chose to send: it never moves the removal
/// horizon (only the pageserver's own report on a replication connection does).
#[test]
fn a_proposer_cannot_move_the_removal_horizon() {
    let (dir, keys) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (public, signer) = key_pair(keys.path());
    let node = Node::start_with(dir.path(), &["--auth-public-key", public.to_str().unwrap()]);
    let admin = signer.sign(&auth::Claims::admin());
    assert_eq!(node.create_timeline_with(&admin).0, 201);
    let (t, tl) = ids();
    let mut conn = node.connect();
    assert!(matches!(
        conn.hello_with_token(SYSID, &signer.sign(&auth::Claims::tenant(t).with_timeline(tl))),
        AcceptorMessage::HelloOk { .. }
    ));
    let start = Lsn(3 * SEG as u64 + 0x28);
    let mut shell = Shell::new(conn, start);
    shell.elect();
    let end = shell.append(&synthetic(4 * SEG as usize + 1000, 4));
    let all = segment_files(dir.path());
    // A remote-consistent LSN far ahead of anything uploaded, relayed with the next appends.
    shell.p.set_remote_consistent_lsn(Lsn(end.0 + (1 << 40)));
    let a = shell.p.tick();
    shell.drive(a);
    shell.append(&synthetic(1000, 5));
    let status = || {
        let (code, _, body) =
            http_request_with(node.http_port, "GET", &format!("/v1/tenant/{t}/timeline/{tl}"), None, Some(&format!("Bearer {admin}")))
                .unwrap();
        assert_eq!(code, 200, "{body}");
        serde_json::from_str::<serde_json::Value>(&body).unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while status()["peer_horizon_lsn"] == "0/0" {
        assert!(Instant::now() < deadline, "the peer horizon never arrived: {:#}", status());
        std::thread::sleep(Duration::from_millis(50));
    }
    // Lazy writes and removal run about once a second.
    std::thread::sleep(Duration::from_millis(2500));
    let st = status();
    assert_eq!(st["remote_consistent_lsn"], "0/0", "a proposer moved the removal horizon: {st:#}");
    assert_eq!(st["wal_removal_horizon_lsn"], "0/0", "{st:#}");
    assert_eq!(segment_files(dir.path()), all, "WAL was removed on a proposer's word");

    // Nor does a compute's (or an admin's) token on a replication connection: only the
    // pageserver's storage token.
    let far = Lsn(end.0 + (1 << 40));
    for token in [signer.sign(&auth::Claims::tenant(t)), signer.sign(&auth::Claims::tenant(t).with_timeline(tl)), admin.clone()] {
        let e = report_remote_consistent_lsn(&node, Some(&token), 1, far).unwrap_err();
        assert!(e.contains("42501") && e.contains("only the pageserver (a storage token) may report the remote-consistent LSN"), "{e}");
    }
    assert_eq!(status()["remote_consistent_lsn"], "0/0");
    let storage = signer.sign(&auth::Claims::storage());
    let rcl = Lsn(5 * SEG as u64 + 10);
    report_remote_consistent_lsn(&node, Some(&storage), 2, rcl).unwrap();
    // An older attachment generation's position is ignored; a newer one's replaces it.
    report_remote_consistent_lsn(&node, Some(&storage), 1, Lsn(rcl.0 + SEG as u64)).unwrap();
    let st = status();
    assert_eq!((st["remote_consistent_lsn"].as_str(), st["remote_consistent_generation"].as_u64()), (Some(&*rcl.to_string()), Some(2)));
    report_remote_consistent_lsn(&node, Some(&storage), 3, Lsn(4 * SEG as u64)).unwrap();
    let st = status();
    assert_eq!((st["remote_consistent_lsn"].as_str(), st["remote_consistent_generation"].as_u64()), (Some("0/400000"), Some(3)));
    let (_, metrics) = http_get(node.http_port, "/metrics").unwrap();
    for line in [
        "safekeeper_remote_consistent_lsn_ignored_total{reason=\"not_storage\"} 3",
        "safekeeper_remote_consistent_lsn_ignored_total{reason=\"superseded\"} 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "no line {line:?} in:\n{metrics}");
    }
    drop(shell);
    node.stop();
}

/// State of the timeline that malformed input must not change.
fn snapshot(node: &Node) -> serde_json::Value {
    node.timeline().1
}

#[test]
fn malformed_messages_get_an_error_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    node.create_timeline();
    let start = Lsn(SEG as u64 + 0x28);
    let mut conn = node.connect();
    conn.hello(SYSID);
    let mut shell = Shell::new(conn, start);
    shell.elect();
    shell.append(&synthetic(10_000, 4));
    let before = snapshot(&node);

    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("unknown tag", vec![b'Z', 0, 0, 0, 0], "unknown message tag"),
        ("truncated", vec![b'V', 0, 0, 0, 3, 1, 2, 3], "truncated"),
        ("trailing bytes", vec![b'G', 0, 0, 0, 10, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0], "trailing"),
        ("too long", vec![b'A', 0xff, 0xff, 0xff, 0xff], "too long"),
        ("garbage", b"\x00\x00\x00\x00\x05junk!".to_vec(), "unknown message tag 0x00"),
        ("garbage with a huge length", b"garbage garbage".to_vec(), "too long"),
        (
            "a second hello",
            {
                let mut b = BytesMut::new();
                hello_message(PROTOCOL_VERSION).encode(&mut b);
                b.to_vec()
            },
            "unexpected Hello",
        ),
        (
            "append in an old term",
            {
                let mut b = BytesMut::new();
                ProposerMessage::Consensus(ToAcceptor::Append {
                    term: 0,
                    begin_lsn: Lsn(0),
                    data: Bytes::new(),
                    boundary_lsn: Lsn(0),
                    commit_lsn: Lsn(0),
                    peer_horizon_lsn: Lsn(0),
                    remote_consistent_lsn: Lsn(0),
                })
                .encode(&mut b);
                // Valid on the wire (answered Rejected); then garbage.
                b.extend_from_slice(&[b'Q', 0, 0, 0, 0]);
                b.to_vec()
            },
            "unknown message tag",
        ),
    ];
    for (what, bytes, expect) in cases {
        let mut conn = node.connect();
        assert!(matches!(conn.hello(SYSID), AcceptorMessage::HelloOk { .. }), "{what}");
        conn.send_raw(&bytes);
        let mut got_error = None;
        while let Some(m) = conn.recv() {
            if let AcceptorMessage::Error { message } = m {
                got_error = Some(message);
            }
        }
        let message = got_error.unwrap_or_else(|| panic!("{what}: no Error reply"));
        assert!(message.contains(expect), "{what}: {message}");
        assert_eq!(snapshot(&node), before, "{what} changed the timeline");
    }

    // A connection whose first message is not Hello, but starts with 'H' garbage.
    let mut conn = node.connect();
    conn.send_raw(&[b'H', 0, 0, 0, 2, 1, 2]);
    match conn.recv() {
        Some(AcceptorMessage::Error { message }) => {
            assert!(message.contains("malformed greeting"), "{message}")
        }
        other => panic!("unexpected {other:?}"),
    }
    // The first proposer is still connected and still works.
    let end = shell.append(&synthetic(5_000, 5));
    assert_eq!(shell.commit, end);
}

#[test]
fn a_proposer_of_another_system_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    let mut conn = node.connect();
    assert!(matches!(conn.hello(SYSID), AcceptorMessage::HelloOk { .. }));
    drop(conn);
    let mut conn = node.connect();
    match conn.hello(SYSID + 1) {
        AcceptorMessage::Error { message } => {
            assert!(message.contains(&format!("was created for system {SYSID}")), "{message}");
            assert!(message.contains(&format!("writes WAL of system {}", SYSID + 1)), "{message}");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(conn.recv().is_none(), "the connection is closed");
    // Wrong protocol version.
    let mut conn = node.connect();
    conn.send(&hello_message(99));
    match conn.recv() {
        Some(AcceptorMessage::Error { message }) => {
            assert!(message.contains("protocol version 99"), "{message}")
        }
        other => panic!("unexpected {other:?}"),
    }
    // A proposer of version 4 (before tokens) is told both versions, not that its Hello is
    // truncated.
    let mut conn = node.connect();
    conn.send(&hello_message(4));
    match conn.recv() {
        Some(AcceptorMessage::Error { message }) => {
            assert_eq!(message, format!("unsupported protocol version 4, this safekeeper speaks {PROTOCOL_VERSION}"))
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn http_errors_and_the_lock_of_a_running_process() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    let (t, tl) = ids();
    let (code, body) = http_get(node.http_port, &format!("/v1/tenant/{t}/timeline/{tl}")).unwrap();
    assert_eq!(code, 404);
    assert!(body.contains("does not exist"), "{body}");
    let (code, body) = http_get(node.http_port, "/v1/tenant/nothex/timeline/x").unwrap();
    assert_eq!(code, 400, "{body}");
    // A second process on the same data directory refuses to start.
    let out = Command::new(env!("CARGO_BIN_EXE_safekeeper"))
        .args(["--id", "8", "--data-dir"])
        .arg(dir.path())
        .args(["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--no-tls"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("in use by another safekeeper"), "{stderr}");
    // A non-proposer connection goes to the replication handler.
    let mut s = TcpStream::connect(("127.0.0.1", node.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&[0, 0, 0, 8, 4, 210, 22, 47]).unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    node.stop();
}

#[test]
fn a_corrupt_control_file_is_reported_over_http_and_to_proposers() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    assert!(matches!(node.connect().hello(SYSID), AcceptorMessage::HelloOk { .. }));
    node.stop();
    let (t, tl) = ids();
    let control = dir.path().join(t.to_string()).join(tl.to_string()).join("safekeeper.control");
    let mut bytes = std::fs::read(&control).unwrap();
    bytes[50] ^= 0x80;
    std::fs::write(&control, &bytes).unwrap();

    let node = Node::start(dir.path());
    let (code, st) = node.timeline();
    assert_eq!(code, 200);
    assert_eq!(st["state"], "corrupt");
    assert!(st["error"].as_str().unwrap().contains("checksum"), "{st}");
    match node.connect().hello(SYSID) {
        AcceptorMessage::Error { message } => assert!(message.contains("unavailable"), "{message}"),
        other => panic!("a corrupt timeline was served: {other:?}"),
    }
    node.stop();
    assert_eq!(std::fs::read(&control).unwrap(), bytes, "the corrupt file is left as it was");
}

/// In process (the feedback comes from `replication.rs`, which runs inside the safekeeper):
/// a change of the pageserver's progress reaches connected proposers.
#[test]
fn pageserver_feedback_reaches_proposers() {
    let dir = tempfile::tempdir().unwrap();
    let sk = safekeeper::Safekeeper::open(3, dir.path()).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (listener, http) = rt.block_on(async {
        (tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(), tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap())
    });
    let port = listener.local_addr().unwrap().port();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = rt.spawn(safekeeper::server::run(sk.clone(), listener, http, async {
        let _ = stop_rx.await;
    }));
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut conn = Conn { s, buf: BytesMut::new() };
    assert!(matches!(conn.hello(SYSID), AcceptorMessage::HelloOk { node_id: 3, .. }));
    let tl = sk.get_timeline(ids().0, ids().1).unwrap();
    let f = quorum::wire::PageserverFeedback { write_lsn: Lsn(300), flush_lsn: Lsn(200), apply_lsn: Lsn(100), ..Default::default() };
    tl.set_pageserver_feedback(f);
    assert_eq!(conn.recv(), Some(AcceptorMessage::Feedback(f)));
    assert_eq!(tl.pageserver_feedback(), f);
    // The remote-consistent LSN too (for the proposer's status); status updates do not
    // reset it, and it never goes back within an attachment generation.
    use safekeeper::timeline::RemoteReport;
    assert_eq!(tl.set_remote_consistent_lsn(1, Lsn(150)), RemoteReport::Taken);
    let f = quorum::wire::PageserverFeedback { remote_consistent_lsn: Lsn(150), ..f };
    assert_eq!(conn.recv(), Some(AcceptorMessage::Feedback(f)));
    assert_eq!(tl.set_remote_consistent_lsn(1, Lsn(120)), RemoteReport::Taken);
    let g = quorum::wire::PageserverFeedback { write_lsn: Lsn(400), ..f };
    tl.set_pageserver_feedback(quorum::wire::PageserverFeedback { remote_consistent_lsn: Lsn(0), ..g });
    assert_eq!(conn.recv(), Some(AcceptorMessage::Feedback(g)));
    assert_eq!(tl.remote_consistent_lsn(), Lsn(150));
    // A newer attachment generation's position replaces it, even lower; an older one's is
    // ignored.
    assert_eq!(tl.set_remote_consistent_lsn(2, Lsn(130)), RemoteReport::Taken);
    let h = quorum::wire::PageserverFeedback { remote_consistent_lsn: Lsn(130), ..g };
    assert_eq!(conn.recv(), Some(AcceptorMessage::Feedback(h)));
    assert_eq!(tl.set_remote_consistent_lsn(1, Lsn(500)), RemoteReport::Superseded { newest: 2 });
    assert_eq!(tl.remote_position(), safekeeper::timeline::RemotePosition { generation: 2, lsn: Lsn(130) });
    let _ = stop_tx.send(());
    rt.block_on(server).unwrap().unwrap();
}

/// A timeline created on purpose is a voter; creating it again changes nothing, and a
/// creation that contradicts it or is malformed is refused. A timeline the safekeeper first
/// hears of from a proposer (never created here, or lost with the disk) is a learner: it
/// refuses to vote, so a lone proposer cannot be elected with it.
#[test]
fn created_timelines_vote_and_unknown_ones_are_learners() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path());
    let (t, tl) = ids();
    let path = format!("/v1/tenant/{t}/timeline/{tl}");
    assert_eq!(
        node.create_timeline(),
        (201, serde_json::json!({"tenant_id": t.to_string(), "timeline_id": tl.to_string(), "created": true}))
    );
    assert_eq!(node.create_timeline().0, 200, "creating it again changes nothing");
    for (body, code, says) in [
        (format!(r#"{{"system_id": {}}}"#, SYSID + 1), 409, "exists with system"),
        (r#"{"system_id": 1, "wal_segment_size": 1000}"#.to_string(), 400, "not a power of two"),
        (r#"{"system_id": 1, "colour": "red"}"#.to_string(), 400, "unknown field"),
        ("not json".to_string(), 400, "bad timeline creation request"),
    ] {
        let (c, b) = http_post(node.http_port, &path, &body).unwrap();
        assert_eq!(c, code, "{body}: {b}");
        assert!(b.contains(says), "{body}: {b}");
    }
    assert_eq!(node.timeline().1["learner"], false);
    node.stop();

    // The data directory is lost: a proposer's hello finds no record, and the timeline
    // comes back as a learner that refuses the vote.
    std::fs::remove_dir_all(dir.path()).unwrap();
    let node = Node::start(dir.path());
    let mut conn = node.connect();
    assert!(matches!(conn.hello(SYSID), AcceptorMessage::HelloOk { .. }));
    assert_eq!(node.timeline().1["learner"], true);
    conn.send(&ProposerMessage::Consensus(ToAcceptor::VoteRequest { term: 1, proposer: 1 }));
    match conn.recv() {
        Some(AcceptorMessage::Consensus(quorum::ToProposer::Vote { granted, acceptor_term, .. })) => {
            assert!(!granted, "a learner voted");
            assert_eq!(acceptor_term, 0);
        }
        other => panic!("unexpected {other:?}"),
    }
    // Creating it on purpose now does not make the learner a voter.
    assert_eq!(node.create_timeline().0, 200);
    assert_eq!(node.timeline().1["learner"], true);
    node.stop();
}

/// The cluster's key pair in `dir`: the public key's path and a signer.
fn key_pair(dir: &Path) -> (std::path::PathBuf, auth::Signer) {
    let (private, public) = auth::generate_key_pair(dir).unwrap();
    (public, auth::Signer::load(&private).unwrap())
}

/// `safekeeper_auth_failures_total{reason}` from `/metrics` (open with authentication on).
fn auth_failures(node: &Node, reason: &str) -> u64 {
    let (code, text) = http_get(node.http_port, "/metrics").unwrap();
    assert_eq!(code, 200);
    let want = format!("safekeeper_auth_failures_total{{reason=\"{reason}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(want.as_str())).unwrap_or_else(|| panic!("no {want} in {text}")).parse().unwrap()
}

/// With `--auth-public-key` a proposer's `Hello` needs a token that grants its timeline; a
/// refused one gets `Error` with the reason and creates nothing on disk; each refusal is
/// counted by reason. A good token (the tenant's, narrowed to the timeline or not, or an
/// admin's) is greeted and the proposer works as without authentication.
#[test]
fn with_auth_a_proposer_needs_a_token_for_its_timeline() {
    let (dir, keys, other_keys) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (public, signer) = key_pair(keys.path());
    let (_, other_signer) = key_pair(other_keys.path());
    let node = Node::start_with(dir.path(), &["--auth-public-key", public.to_str().unwrap()]);
    let (t, tl) = ids();
    for reason in auth::AuthError::REASONS {
        assert_eq!(auth_failures(&node, reason), 0, "{reason}");
    }
    let expired = auth::Claims { exp: Some(1), ..auth::Claims::tenant(t) };
    let refused: Vec<(String, &str, &str)> = vec![
        (String::new(), "missing", "authentication required"),
        ("not-a-token".into(), "malformed", "malformed token"),
        ("x".repeat(quorum::wire::TOKEN_BYTES_MAX), "malformed", "malformed token"),
        (other_signer.sign(&auth::Claims::tenant(t)), "bad_signature", "signature does not verify"),
        (signer.sign(&expired), "expired", "the token expired"),
        (signer.sign(&auth::Claims::storage()), "forbidden", "a storage token may not use timeline"),
        (signer.sign(&auth::Claims::tenant(TenantId::from_bytes([0x33; 16]))), "wrong_tenant", "it may not use timeline"),
        (
            signer.sign(&auth::Claims::tenant(t).with_timeline(TimelineId::from_bytes([0x44; 16]))),
            "wrong_timeline",
            "the token is for timeline",
        ),
    ];
    for (token, reason, says) in &refused {
        let before = auth_failures(&node, reason);
        let mut conn = node.connect();
        match conn.hello_with_token(SYSID, token) {
            AcceptorMessage::Error { message } => assert!(message.contains(says), "{reason}: {message}"),
            other => panic!("{reason}: a Hello was not refused: {other:?}"),
        }
        assert!(conn.recv().is_none(), "{reason}: the connection is closed");
        assert_eq!(auth_failures(&node, reason), before + 1, "{reason}");
    }
    // Nothing was created: not the timeline, not even the tenant's directory.
    assert!(!dir.path().join(t.to_string()).exists());
    let admin = signer.sign(&auth::Claims::admin());
    let (code, _, body) =
        http_request_with(node.http_port, "GET", &format!("/v1/tenant/{t}/timeline/{tl}"), None, Some(&format!("Bearer {admin}"))).unwrap();
    assert_eq!(code, 404, "{body}");

    // Good tokens.
    for token in [signer.sign(&auth::Claims::tenant(t)), admin.clone()] {
        assert!(matches!(node.connect().hello_with_token(SYSID, &token), AcceptorMessage::HelloOk { .. }));
    }
    let mut conn = node.connect();
    assert!(matches!(
        conn.hello_with_token(SYSID, &signer.sign(&auth::Claims::tenant(t).with_timeline(tl))),
        AcceptorMessage::HelloOk { .. }
    ));
    assert_eq!(node.create_timeline_with(&admin).0, 200, "the first Hello created it (as a learner)");
    // The connection works as without authentication (a learner refuses the vote).
    conn.send(&ProposerMessage::Consensus(ToAcceptor::VoteRequest { term: 1, proposer: 1 }));
    assert!(matches!(conn.recv(), Some(AcceptorMessage::Consensus(quorum::ToProposer::Vote { granted: false, .. }))));
    node.stop();
}

/// With `--auth-public-key` every HTTP route but `/metrics` and `/v1/status` needs an admin
/// token: 401 (with `WWW-Authenticate: Bearer`) without a valid one, 403 with a valid one
/// that is not an admin's; a refused request changes nothing.
#[test]
fn with_auth_the_http_api_needs_an_admin_token() {
    let (dir, keys, other_keys) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (public, signer) = key_pair(keys.path());
    let (_, other_signer) = key_pair(other_keys.path());
    let node = Node::start_with(dir.path(), &["--auth-public-key", public.to_str().unwrap()]);
    let (t, tl) = ids();
    let path = format!("/v1/tenant/{t}/timeline/{tl}");
    let create = format!(r#"{{"system_id": {SYSID}, "wal_segment_size": {SEG}}}"#);
    assert_eq!(http_get(node.http_port, "/v1/status").unwrap().0, 200);
    assert!(http_get(node.http_port, "/metrics").unwrap().1.contains("safekeeper_auth_failures_total{reason=\"expired\"} 0"));

    let bearer = |claims: auth::Claims| format!("Bearer {}", signer.sign(&claims));
    let expired = auth::Claims { exp: Some(1), ..auth::Claims::admin() };
    let cases: Vec<(Option<String>, u16, &str, &str)> = vec![
        (None, 401, "missing", "authentication required"),
        (Some("Basic dXNlcjpwYXNz".into()), 401, "malformed", "not Bearer"),
        (Some("Bearer".into()), 401, "malformed", "not 'Bearer <token>'"),
        (Some("Bearer not-a-token".into()), 401, "malformed", "malformed token"),
        (Some(format!("Bearer {}", other_signer.sign(&auth::Claims::admin()))), 401, "bad_signature", "signature does not verify"),
        (Some(bearer(expired)), 401, "expired", "the token expired"),
        (Some(bearer(auth::Claims::tenant(t))), 403, "forbidden", "a tenant token may not use the management API"),
        (Some(bearer(auth::Claims::storage())), 403, "forbidden", "a storage token may not use the management API"),
    ];
    for (authorization, code, reason, says) in &cases {
        for (method, body) in [("POST", Some(create.as_str())), ("GET", None)] {
            let before = auth_failures(&node, reason);
            let (c, head, b) = http_request_with(node.http_port, method, &path, body, authorization.as_deref()).unwrap();
            assert_eq!(c, *code, "{method} with {authorization:?}: {b}");
            let error: serde_json::Value = serde_json::from_str(&b).unwrap();
            assert!(error["error"].as_str().unwrap().contains(says), "{method} with {authorization:?}: {b}");
            assert_eq!(head.to_ascii_lowercase().contains("www-authenticate: bearer"), *code == 401, "{head}");
            assert_eq!(auth_failures(&node, reason), before + 1, "{reason}");
        }
    }
    assert!(!dir.path().join(t.to_string()).exists(), "a refused request created the timeline");
    // An unknown route is not open either.
    assert_eq!(http_get(node.http_port, "/v1/nothing").unwrap().0, 401);

    let admin = signer.sign(&auth::Claims::admin());
    assert_eq!(node.create_timeline_with(&admin).0, 201);
    let (code, _, body) = http_request_with(node.http_port, "GET", &path, None, Some(&format!("bearer  {admin} "))).unwrap();
    assert_eq!(code, 200, "{body}");
    let (code, _, _) = http_request_with(node.http_port, "GET", "/v1/nothing", None, Some(&format!("Bearer {admin}"))).unwrap();
    assert_eq!(code, 404);
    node.stop();
}
