use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;

use crate::args::{ClientArgs, ServerArgs, ServerClientArgs};
use crate::ca::{Ca, SERVICE_VALIDITY};
use crate::*;

fn hosts(list: &[&str]) -> Vec<String> {
    list.iter().map(|h| h.to_string()).collect()
}

/// A CA in `dir` and a certificate for `name` naming `names`, as files.
fn issue(ca: &Ca, dir: &Path, name: &str, names: &[&str]) -> (PathBuf, PathBuf) {
    let cert = dir.join(format!("{name}.crt"));
    let key = dir.join(format!("{name}.key"));
    ca.issue_to_files(name, &hosts(names), SERVICE_VALIDITY, &cert, &key).unwrap();
    (cert, key)
}

/// A server that accepts TLS connections and echoes lines on each, until dropped.
fn echo_server(config: Arc<rustls::ServerConfig>) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for tcp in listener.incoming() {
            let config = config.clone();
            std::thread::spawn(move || {
                let Ok(stream) = accept(config, tcp.unwrap()) else { return };
                let mut reader = BufReader::new(stream);
                let mut line = String::new();
                while reader.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
                    let stream = reader.get_mut();
                    if stream.write_all(line.as_bytes()).and_then(|_| stream.flush()).is_err() {
                        return;
                    }
                    line.clear();
                }
            });
        }
    });
    addr
}

fn echo(stream: &mut ClientStream, text: &str) -> String {
    stream.write_all(format!("{text}\n").as_bytes()).unwrap();
    stream.flush().unwrap();
    let mut answer = Vec::new();
    let mut byte = [0u8; 1];
    while stream.read(&mut byte).unwrap() == 1 && byte[0] != b'\n' {
        answer.push(byte[0]);
    }
    String::from_utf8(answer).unwrap()
}

/// The name in the certificate a server presents to a new client: one without sessions
/// to resume, since a resumed session presents no certificate.
fn served_name(ca_file: &Path, addr: std::net::SocketAddr) -> String {
    let client = ClientTls::load(ca_file).unwrap();
    peer_common_name(&client.connect(TcpStream::connect(addr).unwrap(), "127.0.0.1").unwrap())
}

fn peer_common_name(stream: &ClientStream) -> String {
    let cert = &stream.conn.peer_certificates().unwrap()[0];
    let (_, parsed) = x509_parser::parse_x509_certificate(cert).unwrap();
    let cn = parsed.subject().iter_common_name().next().unwrap().as_str().unwrap().to_string();
    cn
}

#[test]
fn a_client_trusting_the_ca_talks_to_a_server_by_name_and_by_address() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::create(&dir.path().join("ca")).unwrap();
    let (cert, key) = issue(&ca, dir.path(), "pageserver", &["localhost", "127.0.0.1"]);
    let server = ServerTls::load(&cert, &key).unwrap();
    let addr = echo_server(server.config());
    let client = ClientTls::load(&dir.path().join("ca/ca.crt")).unwrap();
    for host in ["127.0.0.1", "localhost"] {
        let mut stream = client.connect(TcpStream::connect(addr).unwrap(), host).unwrap();
        assert_eq!(echo(&mut stream, "hello"), "hello");
        assert_eq!(peer_common_name(&stream), "pageserver");
    }
}

#[test]
fn a_certificate_for_another_host_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::create(dir.path()).unwrap();
    let (cert, key) = issue(&ca, dir.path(), "safekeeper-1", &["sk1.example", "10.0.0.9"]);
    let addr = echo_server(ServerTls::load(&cert, &key).unwrap().config());
    let client = ClientTls::load(&dir.path().join("ca.crt")).unwrap();
    let err = client.connect(TcpStream::connect(addr).unwrap(), "127.0.0.1").unwrap_err();
    assert!(matches!(err, ConnectError::WrongHost { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("presented a certificate for another host"), "{text}");
    assert!(text.contains("sk1.example") && text.contains("10.0.0.9") && text.contains("not 127.0.0.1"), "{text}");
    assert!(!err.is_transient());
}

#[test]
fn a_certificate_from_another_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::create(&dir.path().join("ours")).unwrap();
    let theirs = Ca::create(&dir.path().join("theirs")).unwrap();
    let (cert, key) = issue(&theirs, dir.path(), "pageserver", &["127.0.0.1"]);
    drop(ca);
    let addr = echo_server(ServerTls::load(&cert, &key).unwrap().config());
    let ca_file = dir.path().join("ours/ca.crt");
    let client = ClientTls::load(&ca_file).unwrap();
    let err = client.connect(TcpStream::connect(addr).unwrap(), "127.0.0.1").unwrap_err();
    assert!(matches!(err, ConnectError::UnknownCa { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("not signed by the cluster CA") && text.contains(&ca_file.display().to_string()), "{text}");
}

#[test]
fn plaintext_is_told_apart_on_both_sides() {
    assert!(looks_like_tls(&[0x16]));
    assert!(looks_like_tls(&[0x16, 0x03, 0x01]));
    assert!(!looks_like_tls(b"GET / HTTP/1.1"));
    assert!(!looks_like_tls(&[0, 0, 0, 8, 4, 210, 22, 47]));
    assert!(!looks_like_tls(&[]));

    // A server that requires TLS gets a plaintext client back untouched, to answer it in
    // its own protocol.
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::create(dir.path()).unwrap();
    let (cert, key) = issue(&ca, dir.path(), "pageserver", &["127.0.0.1"]);
    let server = ServerTls::load(&cert, &key).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    client.write_all(b"GET /v1/status HTTP/1.1\r\n\r\n").unwrap();
    let (tcp, _) = listener.accept().unwrap();
    let Accepted::Plaintext(mut tcp) = accept_or_plaintext(server.config(), tcp).unwrap() else {
        panic!("a plaintext client taken for TLS")
    };
    let mut first = [0u8; 14];
    tcp.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"GET /v1/status");
    drop(tcp);
    let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    client.write_all(b"hello\n").unwrap();
    let err = accept(server.config(), listener.accept().unwrap().0).unwrap_err();
    assert!(matches!(err, AcceptError::NotTls { .. }), "{err}");

    // A TLS client of a plaintext server learns what it answered.
    let plain = TcpListener::bind("127.0.0.1:0").unwrap();
    let plain_addr = plain.local_addr().unwrap();
    std::thread::spawn(move || {
        let (mut tcp, _) = plain.accept().unwrap();
        let mut buf = [0u8; 16];
        let _ = tcp.read(&mut buf);
        let _ = tcp.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n");
        std::thread::sleep(Duration::from_millis(200));
    });
    let client = ClientTls::load(&dir.path().join("ca.crt")).unwrap();
    let err = client.connect(TcpStream::connect(plain_addr).unwrap(), "127.0.0.1").unwrap_err();
    assert!(matches!(err, ConnectError::NotTls { .. }), "{err}");
    assert!(err.to_string().contains("does not speak TLS") && err.to_string().contains("HTTP/1.1 400"), "{err}");

    // One that closes at once.
    let plain = TcpListener::bind("127.0.0.1:0").unwrap();
    let plain_addr = plain.local_addr().unwrap();
    std::thread::spawn(move || drop(plain.accept().unwrap()));
    let err = client.connect(TcpStream::connect(plain_addr).unwrap(), "127.0.0.1").unwrap_err();
    assert!(matches!(err, ConnectError::NotTls { .. } | ConnectError::Io { .. }), "{err}");
}

/// Replaces a file the way an operator should: a new file renamed over the old.
fn replace(from: &Path, to: &Path) {
    let tmp = to.with_extension("tmp");
    std::fs::copy(from, &tmp).unwrap();
    std::fs::rename(&tmp, to).unwrap();
}

#[test]
fn a_reload_reaches_new_connections_and_leaves_established_ones_alone() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::create(dir.path()).unwrap();
    let (cert, key) = issue(&ca, dir.path(), "old", &["127.0.0.1"]);
    let (new_cert, new_key) = issue(&ca, dir.path(), "new", &["127.0.0.1"]);
    let server = ServerTls::load(&cert, &key).unwrap();
    let before = server.not_after();
    let addr = echo_server(server.config());
    let client = ClientTls::load(&dir.path().join("ca.crt")).unwrap();
    let mut established = client.connect(TcpStream::connect(addr).unwrap(), "127.0.0.1").unwrap();
    assert_eq!(peer_common_name(&established), "old");
    assert!(!server.reload().unwrap(), "nothing changed");

    replace(&new_cert, &cert);
    replace(&new_key, &key);
    assert!(server.reload().unwrap());
    let ca_file = dir.path().join("ca.crt");
    assert_eq!(served_name(&ca_file, addr), "new");
    assert_eq!(echo(&mut established, "still here"), "still here");
    assert!(server.not_after() >= before);

    // A certificate without its key (another pair's key) is refused and the current
    // pair kept.
    let (other_cert, _) = issue(&ca, dir.path(), "other", &["127.0.0.1"]);
    replace(&other_cert, &cert);
    let err = server.reload().unwrap_err();
    assert!(format!("{err:#}").contains("does not belong to the certificate"), "{err:#}");
    assert_eq!(served_name(&ca_file, addr), "new");
    // So is a file that is not PEM.
    std::fs::write(&key, "not a key").unwrap();
    assert!(format!("{:#}", server.reload().unwrap_err()).contains("holds no PEM private key"));
    assert_eq!(served_name(&ca_file, addr), "new");
    assert_eq!(echo(&mut established, "and here"), "and here");
}

#[test]
fn the_reloader_follows_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::create(dir.path()).unwrap();
    let (cert, key) = issue(&ca, dir.path(), "old", &["127.0.0.1"]);
    let (new_cert, new_key) = issue(&ca, dir.path(), "new", &["127.0.0.1"]);
    let server = ServerTls::load(&cert, &key).unwrap();
    server.start_reloader();
    let addr = echo_server(server.config());
    replace(&new_key, &key);
    replace(&new_cert, &cert);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if served_name(&dir.path().join("ca.crt"), addr) == "new" {
            break;
        }
        assert!(Instant::now() < deadline, "the reloader did not load the new pair");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn expiry_is_in_the_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::create(dir.path()).unwrap();
    let cert = dir.path().join("s.crt");
    let key = dir.path().join("s.key");
    ca.issue_to_files("s", &hosts(&["localhost"]), Duration::from_secs(10 * 86400), &cert, &key).unwrap();
    let server = ServerTls::load(&cert, &key).unwrap();
    let left = server.not_after().duration_since(std::time::SystemTime::now()).unwrap();
    assert!(left > Duration::from_secs(9 * 86400) && left <= Duration::from_secs(10 * 86400), "{left:?}");
    let secs = server.not_after().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let text = server.metrics_text();
    assert!(text.contains(&format!("\n{EXPIRY_METRIC} {secs}\n")), "{text}");
    assert!(text.contains(&format!("# TYPE {EXPIRY_METRIC} gauge")), "{text}");
}

#[test]
fn keys_are_private_and_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::create(dir.path()).unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir.path().join("ca.key")), 0o600);
    let (cert, key) = issue(&ca, dir.path(), "pageserver", &["localhost"]);
    assert_eq!(mode(&key), 0o600);
    let ca_key = std::fs::read(dir.path().join("ca.key")).unwrap();
    let err = Ca::create(dir.path()).err().unwrap();
    assert!(err.to_string().contains("already exists"), "{err}");
    assert_eq!(std::fs::read(dir.path().join("ca.key")).unwrap(), ca_key);

    // An existing key stops the pair: the certificate is not written either.
    std::fs::remove_file(&cert).unwrap();
    let service_key = std::fs::read(&key).unwrap();
    let err = ca.issue_to_files("pageserver", &hosts(&["localhost"]), SERVICE_VALIDITY, &cert, &key).unwrap_err();
    assert!(err.to_string().contains("never overwritten"), "{err}");
    assert!(!cert.exists());
    assert_eq!(std::fs::read(&key).unwrap(), service_key);

    // The CA loads back from its files and signs what clients of the first trust.
    let loaded = Ca::load_dir(dir.path()).unwrap();
    let (cert2, key2) = issue(&loaded, dir.path(), "again", &["127.0.0.1"]);
    let addr = echo_server(ServerTls::load(&cert2, &key2).unwrap().config());
    let client = ClientTls::load(&dir.path().join("ca.crt")).unwrap();
    let mut stream = client.connect(TcpStream::connect(addr).unwrap(), "127.0.0.1").unwrap();
    assert_eq!(echo(&mut stream, "ok"), "ok");
}

#[test]
fn ssl_request_then_tls_and_plaintext_startup_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::create(dir.path()).unwrap();
    let (cert, key) = issue(&ca, dir.path(), "safekeeper-1", &["127.0.0.1"]);
    let server = ServerTls::load(&cert, &key).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let config = server.config();
    let handle = std::thread::spawn(move || {
        let mut outcomes = Vec::new();
        for _ in 0..2 {
            let (tcp, _) = listener.accept().unwrap();
            match pg::accept(config.clone(), tcp).unwrap() {
                Accepted::Tls(mut stream) => {
                    let mut buf = [0u8; 5];
                    stream.read_exact(&mut buf).unwrap();
                    stream.write_all(b"world").unwrap();
                    stream.flush().unwrap();
                    outcomes.push(String::from_utf8(buf.to_vec()).unwrap());
                }
                Accepted::Plaintext(mut tcp) => {
                    let mut buf = [0u8; 8];
                    tcp.read_exact(&mut buf).unwrap();
                    outcomes.push(format!("plaintext {:?}", &buf[..4]));
                }
            }
        }
        outcomes
    });
    let client = ClientTls::load(&dir.path().join("ca.crt")).unwrap();
    let mut stream = pg::connect(&client, TcpStream::connect(addr).unwrap(), "127.0.0.1").unwrap();
    stream.write_all(b"hello").unwrap();
    stream.flush().unwrap();
    let mut answer = [0u8; 5];
    stream.read_exact(&mut answer).unwrap();
    assert_eq!(&answer, b"world");
    // A startup packet (length, protocol 3.0) is no SSLRequest.
    let mut plain = TcpStream::connect(addr).unwrap();
    plain.write_all(&[0, 0, 0, 9, 0, 3, 0, 0, 0]).unwrap();
    let outcomes = handle.join().unwrap();
    assert_eq!(outcomes, vec!["hello".to_string(), "plaintext [0, 0, 0, 9]".to_string()]);
    assert!(pg::is_ssl_request(&pg::ssl_request()));
    assert!(!pg::is_gssenc_request(&pg::ssl_request()));

    // A server that answers N runs without TLS: a clear error.
    let plain = TcpListener::bind("127.0.0.1:0").unwrap();
    let plain_addr = plain.local_addr().unwrap();
    std::thread::spawn(move || {
        let (mut tcp, _) = plain.accept().unwrap();
        let mut buf = [0u8; 8];
        tcp.read_exact(&mut buf).unwrap();
        tcp.write_all(b"N").unwrap();
        std::thread::sleep(Duration::from_millis(200));
    });
    let err = pg::connect(&client, TcpStream::connect(plain_addr).unwrap(), "127.0.0.1").unwrap_err();
    assert!(err.to_string().contains("answered the SSLRequest with N"), "{err}");
}

#[derive(clap::Parser, Debug)]
struct Server {
    #[command(flatten)]
    tls: ServerArgs,
}

#[derive(clap::Parser, Debug)]
struct Client {
    #[command(flatten)]
    tls: ClientArgs,
}

#[derive(clap::Parser, Debug)]
struct Both {
    #[command(flatten)]
    tls: ServerClientArgs,
}

#[test]
fn the_flags_take_exactly_one_of_tls_or_no_tls() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::create(dir.path()).unwrap();
    let (cert, key) = issue(&ca, dir.path(), "pageserver", &["127.0.0.1"]);
    let (cert, key, ca_file) = (cert.to_str().unwrap(), key.to_str().unwrap(), dir.path().join("ca.crt"));
    let ca_file = ca_file.to_str().unwrap();

    let none = Server::try_parse_from(["s"]).unwrap().tls.load().unwrap_err();
    assert!(none.to_string().contains("TLS is required") && none.to_string().contains("--no-tls"), "{none}");
    assert!(Server::try_parse_from(["s", "--no-tls"]).unwrap().tls.load().unwrap().is_none());
    assert!(Server::try_parse_from(["s", "--tls-cert", cert]).is_err());
    assert!(Server::try_parse_from(["s", "--tls-cert", cert, "--tls-key", key, "--no-tls"]).is_err());
    let args = Server::try_parse_from(["s", "--tls-cert", cert, "--tls-key", key]).unwrap().tls;
    assert!(args.load().unwrap().is_some());
    assert_eq!(
        Server::try_parse_from([&["s"][..], &args.to_args().iter().map(|s| s.as_str()).collect::<Vec<_>>()].concat()).unwrap().tls,
        args
    );
    let missing = Server::try_parse_from(["s", "--tls-cert", "/nonexistent.crt", "--tls-key", key]).unwrap().tls.load().unwrap_err();
    assert!(format!("{missing:#}").contains("/nonexistent.crt"), "{missing:#}");

    assert!(Client::try_parse_from(["c"]).unwrap().tls.load().unwrap_err().to_string().contains("--tls-ca FILE"));
    assert!(Client::try_parse_from(["c", "--no-tls"]).unwrap().tls.load().unwrap().is_none());
    assert!(Client::try_parse_from(["c", "--tls-ca", ca_file]).unwrap().tls.load().unwrap().is_some());
    assert!(Client::try_parse_from(["c", "--tls-ca", ca_file, "--no-tls"]).is_err());
    // A file with no certificate is a clear error.
    let bad = Client::try_parse_from(["c", "--tls-ca", key]).unwrap().tls.load().unwrap_err();
    assert!(format!("{bad:#}").contains("holds no PEM certificate"), "{bad:#}");

    assert!(Both::try_parse_from(["b"]).unwrap().tls.load().is_err());
    assert_eq!(Both::try_parse_from(["b", "--no-tls"]).unwrap().tls.load().unwrap(), Tls::default());
    assert!(Both::try_parse_from(["b", "--tls-cert", cert, "--tls-key", key]).is_err());
    let both = Both::try_parse_from(["b", "--tls-cert", cert, "--tls-key", key, "--tls-ca", ca_file]).unwrap().tls.load().unwrap();
    assert!(both.server.is_some() && both.client.is_some());
}
