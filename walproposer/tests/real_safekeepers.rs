//! WalProposer and sync_safekeepers against real `safekeeper` processes: the binary named by
//! `FJORD_SAFEKEEPER_BIN`, or `target/bin/safekeeper` as `scripts/setup` builds it (the test
//! fails, naming both, if there is none).

mod harness;

use harness::{wait_until, write_segments, SEGMENT_BYTES};
use proto::Lsn;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use walproposer::{sync_safekeepers, Config, Status, WalProposer};

/// A safekeeper process, killed when dropped, with the file its stderr goes to.
struct Proc {
    child: Child,
    log: std::path::PathBuf,
}
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `POST /v1/tenant/{tenant}/timeline/{timeline}` on a safekeeper's HTTP port, retried
/// until it answers (it may still be starting). Fails with the safekeeper's log, and its
/// exit status if it exited, when it does not answer 201 in time.
fn create_timeline(sk: &mut Proc, http_port: u16, tenant: &str, timeline: &str, system_id: u64) {
    use std::io::{Read, Write};
    let body = format!(r#"{{"system_id": {system_id}, "wal_segment_size": {SEGMENT_BYTES}}}"#);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let last = match std::net::TcpStream::connect(("127.0.0.1", http_port)) {
            Ok(mut s) => {
                let req = format!(
                    "POST /v1/tenant/{tenant}/timeline/{timeline} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                let mut resp = String::new();
                match s.write_all(req.as_bytes()).and_then(|_| s.read_to_string(&mut resp)) {
                    Ok(_) if resp.starts_with("HTTP/1.1 201") => return,
                    Ok(_) => format!("answer: {resp}"),
                    Err(e) => format!("request failed: {e}"),
                }
            }
            Err(e) => format!("connect to 127.0.0.1:{http_port}: {e}"),
        };
        let exited = sk.child.try_wait().unwrap();
        if exited.is_some() || std::time::Instant::now() > deadline {
            let log = std::fs::read_to_string(&sk.log).unwrap_or_default();
            panic!("the safekeeper did not create the timeline (exit status {exited:?}; last: {last}); its log:\n{log}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn streams_commits_and_syncs_with_real_safekeepers() {
    let bin = std::env::var_os("FJORD_SAFEKEEPER_BIN").map(std::path::PathBuf::from).unwrap_or_else(|| {
        let manifest =
            std::env::var_os("CARGO_MANIFEST_DIR").map(std::path::PathBuf::from).unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into());
        manifest.join("../target/bin/safekeeper")
    });
    assert!(bin.is_file(), "no safekeeper binary at {} (run ./scripts/setup, or set FJORD_SAFEKEEPER_BIN)", bin.display());
    let root = std::env::temp_dir().join(format!("walproposer-real-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let mut procs = Vec::new();
    let mut addrs = Vec::new();
    let mut https = Vec::new();
    std::fs::create_dir_all(&root).unwrap();
    // Six distinct free ports: each listener is held until all six are chosen (bind(0) may
    // give a port again once its socket is closed, and two safekeepers would race for it).
    let listeners: Vec<_> = (0..6).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let ports: Vec<u16> = listeners.iter().map(|l| l.local_addr().unwrap().port()).collect();
    drop(listeners);
    for id in 1..=3 {
        let (port, http) = (ports[2 * id - 2], ports[2 * id - 1]);
        let log = root.join(format!("sk{id}.log"));
        let child = Command::new(&bin)
            .args(["--id", &id.to_string(), "--listen", &format!("127.0.0.1:{port}"), "--http", &format!("127.0.0.1:{http}")])
            .arg("--data-dir")
            .arg(root.join(format!("sk{id}")))
            // TLS: `tests/tls.rs`.
            .arg("--no-tls")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        procs.push(Proc { child, log });
        addrs.push(format!("127.0.0.1:{port}"));
        https.push(http);
    }
    // The control plane creates the timeline on every safekeeper (one a proposer finds
    // unknown would be a learner, which does not vote).
    for (sk, http) in procs.iter_mut().zip(https) {
        create_timeline(sk, http, "11111111111111111111111111111111", "22222222222222222222222222222222", 7);
    }
    let dir = root.join("pg_wal");
    let start = Lsn(3 * SEGMENT_BYTES + 40);
    write_segments(&dir, start, Lsn(6 * SEGMENT_BYTES));
    let config = Config {
        safekeepers: addrs,
        tenant_id: "11111111111111111111111111111111".parse().unwrap(),
        timeline_id: "22222222222222222222222222222222".parse().unwrap(),
        system_id: 7,
        wal_segment_size: SEGMENT_BYTES as u32,
        wal_start: start,
        wal_dir: Some(dir),
        name: "test".into(),
        reconnect_max: Duration::from_millis(200),
        whole_records: false,
        auth_token: None,
        tls: None,
    };
    let p = WalProposer::start(config.clone(), Arc::new(|_| {})).unwrap();
    let end = Lsn(5 * SEGMENT_BYTES + 777);
    p.wal_flushed(end);
    wait_until("commit", Duration::from_secs(30), || p.commit_lsn() == end);
    assert!(matches!(p.status(), Status::Streaming { .. }));
    p.stop();
    let synced = sync_safekeepers(&Config { wal_start: Lsn(0), wal_dir: None, ..config }, Duration::from_secs(30)).unwrap();
    assert_eq!(synced, Some(end));
    drop(procs);
    let _ = std::fs::remove_dir_all(&root);
}
