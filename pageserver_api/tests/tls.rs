//! The client over https on loopback: the cluster CA is the only root it trusts, the
//! certificate must name the host of the URL, and each TLS failure is an `Error::Tls`
//! that says what is wrong (never an `Unreachable`, which a caller retries).

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::Arc;

use pageserver_api::client::{Client, ClientConfig, Error};
use tls::ca::{Ca, SERVICE_VALIDITY};
use tls::{ClientTls, ServerTls};

const STATUS: &str = r#"{"status":"ok","version":"0.1.0"}"#;

/// A server on an ephemeral loopback port that answers every request with `STATUS`: over
/// TLS with `config`, else in plaintext. Its URL's host is 127.0.0.1.
fn serve(config: Option<Arc<tls::rustls::ServerConfig>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let port = listener.local_addr().expect("local address").port();
    std::thread::spawn(move || {
        for tcp in listener.incoming() {
            let Ok(tcp) = tcp else { continue };
            let config = config.clone();
            std::thread::spawn(move || match config {
                Some(config) => {
                    if let Ok(stream) = tls::accept(config, tcp) {
                        answer(stream);
                    }
                }
                None => answer(tcp),
            });
        }
    });
    format!("127.0.0.1:{port}")
}

/// Answers one request with `STATUS`; what is no HTTP request (a TLS ClientHello) gets a
/// 400, as hyper answers bytes it cannot parse.
fn answer(stream: impl std::io::Read + Write) {
    let mut reader = BufReader::new(stream);
    match reader.fill_buf() {
        Ok(first) if first.first().is_some_and(u8::is_ascii_alphabetic) => {}
        _ => {
            let _ = reader.get_mut().write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            return;
        }
    }
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        if line.trim().is_empty() {
            break;
        }
    }
    let stream = reader.get_mut();
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{STATUS}",
        STATUS.len()
    );
    let _ = stream.flush();
}

/// A CA in `dir` and a server certificate naming `hosts`.
fn issue(dir: &Path, hosts: &[&str]) -> (ServerTls, ClientTls) {
    let ca = Ca::create(&dir.join("ca")).expect("make a CA");
    let (cert, key) = (dir.join("server.crt"), dir.join("server.key"));
    let hosts: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
    ca.issue_to_files("pageserver", &hosts, SERVICE_VALIDITY, &cert, &key).expect("issue a certificate");
    (ServerTls::load(&cert, &key).expect("load it"), ClientTls::load(&dir.join("ca").join("ca.crt")).expect("load the CA"))
}

fn client(url: &str, tls: Option<&ClientTls>) -> Client {
    Client::with_config(url, ClientConfig { tls: tls.cloned(), ..Default::default() })
}

/// The reason of an `Error::Tls`, or a failure naming what came instead.
fn tls_reason(result: Result<pageserver_api::models::StatusResponse, Error>) -> String {
    match result {
        Err(Error::Tls { reason, .. }) => reason,
        other => panic!("expected a TLS error, got {other:?}"),
    }
}

#[test]
fn https_with_the_cluster_ca_works() {
    let dir = tempfile::tempdir().unwrap();
    let (server, ca) = issue(dir.path(), &["localhost", "127.0.0.1"]);
    let addr = serve(Some(server.config()));
    assert_eq!(client(&format!("https://{addr}"), Some(&ca)).status().unwrap().status, "ok");
}

#[test]
fn a_certificate_of_another_ca_is_refused_naming_the_ca_file() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = issue(dir.path(), &["127.0.0.1"]);
    let other = tempfile::tempdir().unwrap();
    let (_, other_ca) = issue(other.path(), &["127.0.0.1"]);
    let addr = serve(Some(server.config()));
    let err = client(&format!("https://{addr}"), Some(&other_ca)).status().unwrap_err();
    assert!(err.to_string().starts_with(&format!("TLS with the pageserver at https://{addr}/v1/status failed: ")), "{err}");
    let reason = tls_reason(Err(err));
    assert!(reason.contains("not signed by the cluster CA") && reason.contains(&other_ca.ca_path().display().to_string()), "{reason}");
}

#[test]
fn a_certificate_for_another_host_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let (server, ca) = issue(dir.path(), &["pageserver.example"]);
    let addr = serve(Some(server.config()));
    let reason = tls_reason(client(&format!("https://{addr}"), Some(&ca)).status());
    assert!(reason.contains("another host") && reason.contains("pageserver.example") && reason.contains("not 127.0.0.1"), "{reason}");
}

#[test]
fn a_plaintext_server_behind_an_https_url_does_not_speak_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (_, ca) = issue(dir.path(), &["127.0.0.1"]);
    let addr = serve(None);
    let reason = tls_reason(client(&format!("https://{addr}"), Some(&ca)).status());
    assert!(reason.contains("does not speak TLS"), "{reason}");
    // The same server over http works: TLS off on both sides.
    assert_eq!(client(&format!("http://{addr}"), None).status().unwrap().status, "ok");
}

#[test]
fn an_https_url_without_a_ca_says_one_is_needed() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = issue(dir.path(), &["127.0.0.1"]);
    let addr = serve(Some(server.config()));
    let reason = tls_reason(client(&format!("https://{addr}"), None).status());
    assert!(reason.contains("--tls-ca"), "{reason}");
}

#[test]
fn a_client_with_the_cluster_ca_never_sends_a_request_over_http() {
    // A plaintext listener that records whether any byte (a request, its token) arrived.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let addr = listener.local_addr().expect("local address");
    let received = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = Arc::clone(&received);
    std::thread::spawn(move || {
        for tcp in listener.incoming() {
            let Ok(mut tcp) = tcp else { continue };
            let _ = tcp.set_read_timeout(Some(std::time::Duration::from_millis(500)));
            let mut buf = [0u8; 4096];
            if let Ok(n) = std::io::Read::read(&mut tcp, &mut buf) {
                seen.lock().unwrap().extend_from_slice(&buf[..n]);
            }
            let _ = tcp.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let (_, ca) = issue(dir.path(), &["127.0.0.1"]);
    let client = client(&format!("http://{addr}"), Some(&ca)).with_token(Some("secret-token".into()));
    let reason = tls_reason(client.status());
    assert!(reason.contains("https://") && reason.contains("--tls-ca"), "{reason}");
    assert!(received.lock().unwrap().is_empty(), "the request went out in cleartext");
}
