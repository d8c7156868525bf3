//! Serving a service's HTTP API (an axum router) over https, or over plain HTTP with TLS
//! off: the pageserver's management API and the safekeeper's API share it.
//!
//! Each connection is one tokio task. With TLS on, the task peeks at the client's first
//! bytes: a TLS ClientHello goes on to the handshake (the acceptor takes the current
//! certificate of [`crate::ServerTls`], so a reload reaches new connections and never
//! touches established ones); anything else is a plaintext client, which gets an HTTP 400
//! whose body says the API requires https, in the JSON shape of every other error
//! (`{"error": "..."}`), and is closed. A refused client or a failed handshake is one WARN
//! line with the peer's address (a client that leaves half way through the handshake, one
//! INFO line: a stopped process, a probe), is told to the caller's observer with its reason (for a
//! counter), and never stops the server.
//!
//! Handlers can read the peer's address as axum's `ConnectInfo<SocketAddr>` either way.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::http::{header, StatusCode};
use axum::response::Response;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tower::ServiceExt;

use crate::looks_like_tls;

/// How long a new connection may take to send its first bytes and finish the handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The `error` of the answer to a plaintext request on a TLS port.
pub const HTTPS_REQUIRED: &str = "this API requires https: plaintext HTTP is refused (connect with https:// and the cluster CA)";

/// Every reason a client is refused for TLS: `plaintext` (no TLS at all), `timeout` (no
/// first byte or no finished handshake in time), `handshake` (the handshake failed: the
/// client does not trust the certificate, no common protocol version).
pub const REFUSAL_REASONS: [&str; 3] = ["plaintext", "timeout", "handshake"];

/// Told the reason (one of [`REFUSAL_REASONS`]) of every client refused for TLS.
pub type RefusalObserver = dyn Fn(&'static str) + Send + Sync;

/// HTTPS for [`serve`]: the server's configuration ([`crate::ServerTls::config`]) and who
/// is told of refusals.
#[derive(Clone)]
pub struct Https {
    pub config: Arc<rustls::ServerConfig>,
    pub on_refusal: Arc<RefusalObserver>,
}

/// Serves `router` on `listener` until `shutdown` completes, then stops accepting and
/// waits for the requests in flight (idle connections close at once). With `https`, every
/// connection must be https (see the module's documentation); without, plain HTTP.
pub async fn serve(listener: TcpListener, router: Router, https: Option<Https>, shutdown: impl Future<Output = ()>) {
    let https = https.map(|h| (tokio_rustls::TlsAcceptor::from(h.config), h.on_refusal));
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(connection) => connection,
                // A client that gave up before it was accepted: nothing to serve.
                Err(e) if matches!(e.kind(), std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset) => continue,
                Err(e) => {
                    // Out of file descriptors and the like: the listener stays, and a
                    // pause keeps the loop from spinning on it.
                    tracing::warn!("accept an HTTP connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = tcp.set_nodelay(true);
        let service = router.clone();
        let watcher = graceful.watcher();
        let https = https.clone();
        tokio::spawn(async move {
            // The router sees the peer as `axum::serve` with connect info would show it.
            let service = TowerToHyperService::new(service.map_request(move |req: axum::http::Request<Incoming>| {
                let mut req = req.map(axum::body::Body::new);
                req.extensions_mut().insert(ConnectInfo(peer));
                req
            }));
            let builder = hyper::server::conn::http1::Builder::new();
            let result = match https {
                None => watcher.watch(builder.serve_connection(TokioIo::new(tcp), service)).await,
                Some((acceptor, on_refusal)) => {
                    let stream = match handshake(&acceptor, tcp, peer).await {
                        Ok(Some(stream)) => stream,
                        Ok(None) => return,
                        Err(reason) => return on_refusal(reason),
                    };
                    watcher.watch(builder.serve_connection(TokioIo::new(stream), service)).await
                }
            };
            if let Err(e) = result {
                tracing::debug!("HTTP connection from {peer} ended: {e}");
            }
        });
    }
    graceful.shutdown().await;
}

/// The TLS stream of a client whose first bytes are a ClientHello and whose handshake
/// completes in time; `None` for a client that closed before its first byte; the reason
/// (logged here) for a refused one.
async fn handshake(
    acceptor: &tokio_rustls::TlsAcceptor,
    tcp: TcpStream,
    peer: SocketAddr,
) -> Result<Option<tokio_rustls::server::TlsStream<TcpStream>>, &'static str> {
    let mut first = [0u8; 3];
    let n = match tokio::time::timeout(HANDSHAKE_TIMEOUT, tcp.peek(&mut first)).await {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => {
            tracing::debug!("HTTP connection from {peer} failed before its first byte: {e}");
            return Ok(None);
        }
        Err(_) => {
            tracing::info!("HTTP client {peer} sent nothing within {HANDSHAKE_TIMEOUT:?}; closing its connection");
            return Err("timeout");
        }
    };
    if n == 0 {
        // Connected and closed without a byte (a port probe): nothing to say.
        return Ok(None);
    }
    if !looks_like_tls(&first[..n]) {
        tracing::warn!("refused a plaintext HTTP request from {peer}: the API requires https");
        refuse_plaintext(tcp).await;
        return Err("plaintext");
    }
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => Ok(Some(stream)),
        // The client went away in the middle (a process stopped while it connected, a
        // probe that gives up): nothing the server can act on, so not a warning.
        Ok(Err(e)) if matches!(e.kind(), std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset) => {
            tracing::info!("HTTP client {peer} left during the TLS handshake: {e}");
            Err("handshake")
        }
        Ok(Err(e)) => {
            tracing::warn!("TLS handshake with HTTP client {peer} failed: {e}");
            Err("handshake")
        }
        Err(_) => {
            tracing::warn!("TLS handshake with HTTP client {peer} did not finish within {HANDSHAKE_TIMEOUT:?}");
            Err("timeout")
        }
    }
}

/// Answers every request of a plaintext connection with a 400 saying https is required
/// and closes it. hyper reads the request before the answer goes out, so the client gets
/// the answer rather than a reset.
async fn refuse_plaintext(tcp: TcpStream) {
    let refuse = hyper::service::service_fn(|_req: axum::http::Request<Incoming>| async {
        let body = format!("{{\"error\":\"{HTTPS_REQUIRED}\"}}");
        let response = Response::builder()
            .status(StatusCode::BAD_REQUEST)
            .header(header::CONTENT_TYPE, "application/json")
            .body(axum::body::Body::from(body))
            .expect("a static response builds");
        Ok::<_, Infallible>(response)
    });
    let connection = hyper::server::conn::http1::Builder::new().keep_alive(false).serve_connection(TokioIo::new(tcp), refuse);
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, connection).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!("answering a plaintext HTTP client failed: {e}"),
        Err(_) => tracing::debug!("a plaintext HTTP client did not finish its request in {HANDSHAKE_TIMEOUT:?}"),
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::path::Path;
    use std::sync::Mutex;

    use axum::routing::get;

    use super::*;
    use crate::ca::{Ca, SERVICE_VALIDITY};
    use crate::{ClientTls, ConnectError, ServerTls};

    /// A router that answers `/v1/status` with "ok" and `/peer` with the peer's address.
    fn router() -> Router {
        Router::new()
            .route("/v1/status", get(|| async { "ok" }))
            .route("/peer", get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move { peer.to_string() }))
    }

    /// `router()` served on an ephemeral loopback port by a runtime of its own, until the
    /// test process exits; with `config`, https only, each refusal's reason kept.
    fn serve_router(config: Option<Arc<rustls::ServerConfig>>) -> (SocketAddr, Arc<Mutex<Vec<&'static str>>>) {
        let refusals = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&refusals);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let listener = TcpListener::from_std(listener).unwrap();
                let on_refusal: Arc<RefusalObserver> = Arc::new(move |reason| seen.lock().unwrap().push(reason));
                let https = config.map(|config| Https { config, on_refusal });
                serve(listener, router(), https, std::future::pending()).await;
            });
        });
        (addr, refusals)
    }

    /// A CA and a server certificate for localhost and 127.0.0.1, as files in `dir`.
    fn server_tls(dir: &Path) -> (ServerTls, ClientTls) {
        let ca = Ca::create(&dir.join("ca")).unwrap();
        let (cert, key) = (dir.join("server.crt"), dir.join("server.key"));
        ca.issue_to_files("server", &["localhost".to_string(), "127.0.0.1".to_string()], SERVICE_VALIDITY, &cert, &key).unwrap();
        (ServerTls::load(&cert, &key).unwrap(), ClientTls::load(&dir.join("ca").join("ca.crt")).unwrap())
    }

    /// One GET over `stream` (`Connection: close`): the status and the body.
    fn get_over(mut stream: impl Read + Write, path: &str) -> (u16, String) {
        write!(stream, "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").unwrap();
        stream.flush().unwrap();
        let mut answer = Vec::new();
        // A TLS peer that closes without close_notify is an error at the end; what was
        // read until then is the answer.
        let _ = stream.read_to_end(&mut answer);
        let answer = String::from_utf8_lossy(&answer).to_string();
        let status = answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        (status, body)
    }

    fn https_get(client: &ClientTls, addr: SocketAddr, host: &str, path: &str) -> Result<(u16, String), ConnectError> {
        let stream = client.connect(TcpStream::connect(addr).unwrap(), host)?;
        Ok(get_over(stream, path))
    }

    #[test]
    fn https_requests_are_served_with_the_peer_address() {
        let dir = tempfile::tempdir().unwrap();
        let (server, client) = server_tls(dir.path());
        let (addr, refusals) = serve_router(Some(server.config()));
        assert_eq!(https_get(&client, addr, "127.0.0.1", "/v1/status").unwrap(), (200, "ok".to_string()));
        let (status, peer) = https_get(&client, addr, "localhost", "/peer").unwrap();
        assert_eq!(status, 200);
        assert!(peer.starts_with("127.0.0.1:"), "{peer}");
        assert!(refusals.lock().unwrap().is_empty());
    }

    #[test]
    fn a_plaintext_request_gets_a_400_saying_https_is_required_and_the_server_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let (server, client) = server_tls(dir.path());
        let (addr, refusals) = serve_router(Some(server.config()));
        let (status, body) = get_over(TcpStream::connect(addr).unwrap(), "/v1/status");
        assert_eq!(status, 400);
        assert_eq!(body, format!("{{\"error\":\"{HTTPS_REQUIRED}\"}}"));
        assert!(body.contains("requires https"), "{body}");
        // The server counts the refusal once its answer is out: the client may read the
        // answer first.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while refusals.lock().unwrap().is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(*refusals.lock().unwrap(), ["plaintext"]);
        assert_eq!(https_get(&client, addr, "127.0.0.1", "/v1/status").unwrap(), (200, "ok".to_string()));
    }

    #[test]
    fn clients_of_another_ca_or_dialling_another_name_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (server, client) = server_tls(dir.path());
        let (addr, refusals) = serve_router(Some(server.config()));
        let other_dir = tempfile::tempdir().unwrap();
        let (_, other_client) = server_tls(other_dir.path());
        let err = https_get(&other_client, addr, "127.0.0.1", "/v1/status").unwrap_err();
        assert!(matches!(err, ConnectError::UnknownCa { .. }), "{err}");
        // 127.0.0.2 is loopback too, but the certificate does not name it.
        let err = https_get(&client, addr, "127.0.0.2", "/v1/status").unwrap_err();
        assert!(matches!(err, ConnectError::WrongHost { .. }), "{err}");
        assert!(err.to_string().contains("not 127.0.0.2"), "{err}");
        // Both clients abort their handshakes; the server counts them once they are seen.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while refusals.lock().unwrap().len() < 2 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(*refusals.lock().unwrap(), ["handshake", "handshake"]);
        assert_eq!(https_get(&client, addr, "localhost", "/v1/status").unwrap(), (200, "ok".to_string()));
    }

    #[test]
    fn without_tls_it_serves_plain_http() {
        let (addr, _) = serve_router(None);
        assert_eq!(get_over(TcpStream::connect(addr).unwrap(), "/v1/status"), (200, "ok".to_string()));
    }
}
