//! The proposer over TLS against real safekeepers (the `safekeeper` crate's server, in this
//! process, on loopback, with certificates of a CA made here): WAL in large batches (more
//! than the sockets and rustls's buffer take at once) and in many small commits arrives
//! intact and commits; a sync works; a proposer without TLS, one that trusts another CA and
//! one that dials a name the certificate does not carry are refused, each with the reason
//! in its connection state, while the safekeepers go on serving the good one.

mod harness;

use harness::{pattern, wait_until, write_segments, SEGMENT_BYTES};
use proto::{Lsn, TenantId, TimelineId};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use walproposer::{sync_safekeepers, Config, Status, WalProposer};

fn ids() -> (TenantId, TimelineId) {
    ("11111111111111111111111111111111".parse().unwrap(), "22222222222222222222222222222222".parse().unwrap())
}

/// Three safekeepers serving TLS with a certificate for `127.0.0.1` only, on one runtime.
struct Cluster {
    rt: tokio::runtime::Runtime,
    sks: Vec<Arc<safekeeper::Safekeeper>>,
    ports: Vec<u16>,
    stops: Vec<tokio::sync::oneshot::Sender<()>>,
    ca: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Cluster {
    fn start() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let ca = tls::ca::Ca::create(&dir.path().join("ca")).unwrap();
        let (cert, key) = (dir.path().join("sk.crt"), dir.path().join("sk.key"));
        ca.issue_to_files("safekeeper", &["127.0.0.1".to_string()], tls::ca::SERVICE_VALIDITY, &cert, &key).unwrap();
        let server_tls = tls::ServerTls::load(&cert, &key).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let (mut sks, mut ports, mut stops) = (Vec::new(), Vec::new(), Vec::new());
        let (tenant, timeline) = ids();
        for id in 1..=3u64 {
            let config = safekeeper::SafekeeperConfig { tls: Some(server_tls.clone()), ..Default::default() };
            let sk = safekeeper::Safekeeper::open_with_config(id, &dir.path().join(format!("sk{id}")), config).unwrap();
            // The control plane creates the timeline on every safekeeper (voters).
            sk.create_timeline(tenant, timeline, 7, SEGMENT_BYTES as u32).unwrap();
            let (listener, http) = rt.block_on(async {
                (tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(), tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap())
            });
            ports.push(listener.local_addr().unwrap().port());
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            rt.spawn(safekeeper::server::run(sk.clone(), listener, http, async {
                let _ = rx.await;
            }));
            sks.push(sk);
            stops.push(tx);
        }
        Cluster { rt, sks, ports, stops, ca: dir.path().join("ca/ca.crt"), _dir: dir }
    }

    fn addrs(&self, host: &str) -> Vec<String> {
        self.ports.iter().map(|p| format!("{host}:{p}")).collect()
    }

    fn config(&self, wal_dir: Option<&Path>, start: Lsn) -> Config {
        let (tenant_id, timeline_id) = ids();
        Config {
            safekeepers: self.addrs("127.0.0.1"),
            tenant_id,
            timeline_id,
            system_id: 7,
            wal_segment_size: SEGMENT_BYTES as u32,
            wal_start: start,
            wal_dir: wal_dir.map(Path::to_path_buf),
            name: "tls test".into(),
            reconnect_max: Duration::from_millis(200),
            whole_records: false,
            auth_token: None,
            tls: Some(tls::ClientTls::load(&self.ca).unwrap()),
        }
    }

    fn failures(&self, reason: &str) -> u64 {
        self.sks.iter().map(|sk| sk.metrics.tls_handshake_failures.with_label_values(&[reason]).get()).sum()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for tx in self.stops.drain(..) {
            let _ = tx.send(());
        }
        self.rt.block_on(async { tokio::time::sleep(Duration::from_millis(50)).await });
    }
}

#[test]
fn streams_large_batches_and_small_commits_over_tls() {
    let cluster = Cluster::start();
    let wal = tempfile::tempdir().unwrap();
    let start = Lsn(3 * SEGMENT_BYTES + 40);
    write_segments(wal.path(), start, Lsn(8 * SEGMENT_BYTES));
    let config = cluster.config(Some(wal.path()), start);
    let p = WalProposer::start(config.clone(), Arc::new(|_| {})).unwrap();
    // One flush of megabytes: appends far beyond what a socket and rustls take at once, so
    // writes are partial and the rest waits for the socket.
    let big = Lsn(6 * SEGMENT_BYTES + 777);
    p.wal_flushed(big);
    wait_until("the large batch commits", Duration::from_secs(60), || p.commit_lsn() == big);
    // Then many small commits, each waiting for its acknowledgements (the commit path).
    let mut end = big;
    for i in 0..300u64 {
        end = Lsn(end.0 + 1 + (i * 37) % 300);
        p.wal_flushed(end);
        wait_until("a small commit", Duration::from_secs(30), || p.commit_lsn() == end);
    }
    assert!(matches!(p.status(), Status::Streaming { .. }), "{:?}", p.status());
    p.stop();
    // Every safekeeper has exactly the compute's bytes.
    let (tenant, timeline) = ids();
    for sk in &cluster.sks {
        let tl = sk.get_timeline(tenant, timeline).unwrap();
        wait_until("the safekeeper flushed", Duration::from_secs(30), || tl.flush_lsn() >= end);
        let mut at = start.0;
        while at < end.0 {
            let to = (at + 256 * 1024).min(end.0).min((at / SEGMENT_BYTES + 1) * SEGMENT_BYTES);
            let got = tl.read_wal(Lsn(at), Lsn(to)).unwrap();
            let want: Vec<u8> = (at..to).map(pattern).collect();
            assert!(got[..] == want[..], "WAL from {at} to {to} differs on safekeeper {}", sk.node_id);
            at = to;
        }
    }
    let synced = sync_safekeepers(&Config { wal_start: Lsn(0), wal_dir: None, ..config }, Duration::from_secs(30)).unwrap();
    assert_eq!(synced, Some(end));
    assert_eq!(cluster.failures("plaintext") + cluster.failures("handshake") + cluster.failures("timeout"), 0);
}

#[test]
fn clients_without_tls_or_trust_are_refused_and_others_served() {
    let cluster = Cluster::start();
    let other_ca_dir = tempfile::tempdir().unwrap();
    tls::ca::Ca::create(other_ca_dir.path()).unwrap();
    let sync = |config: Config| sync_safekeepers(&Config { wal_start: Lsn(0), wal_dir: None, ..config }, Duration::from_secs(3));
    let reasons = |config: Config| {
        let p =
            WalProposer::start(Config { wal_start: Lsn(SEGMENT_BYTES), wal_dir: Some("/nonexistent".into()), ..config }, Arc::new(|_| {}))
                .unwrap();
        let mut states = Vec::new();
        wait_until("every connection reports why it is down", Duration::from_secs(30), || {
            states = p.connections().into_iter().filter_map(|(_, why)| why).filter(|why| why != "not connected yet").collect();
            states.len() == 3
        });
        p.stop();
        states
    };
    // Without TLS: the safekeeper's refusal, in the proposer protocol.
    for why in reasons(Config { tls: None, ..cluster.config(None, Lsn(0)) }) {
        assert!(why.contains("accepts only TLS connections"), "{why}");
    }
    // Trusting another CA.
    let other = Config { tls: Some(tls::ClientTls::load(&other_ca_dir.path().join("ca.crt")).unwrap()), ..cluster.config(None, Lsn(0)) };
    for why in reasons(other.clone()) {
        assert!(why.contains("not signed by the cluster CA"), "{why}");
    }
    // Dialling a name the certificate does not carry (it names 127.0.0.1 only).
    let by_name = Config { safekeepers: cluster.addrs("localhost"), ..cluster.config(None, Lsn(0)) };
    for why in reasons(by_name) {
        assert!(why.contains("certificate for another host"), "{why}");
    }
    assert!(sync(other).is_err());
    wait_until("the refusals are counted", Duration::from_secs(10), || {
        cluster.failures("plaintext") >= 3 && cluster.failures("handshake") >= 6
    });
    // The safekeepers go on serving a proposer that connects properly.
    assert_eq!(sync(cluster.config(None, Lsn(0))).unwrap(), None);
}
