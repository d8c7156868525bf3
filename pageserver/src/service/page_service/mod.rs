//! The page service: computes read pages, sizes and SLRU segments over TCP.
//!
//! The protocol is `proto::pagestream`: a `Hello` naming protocol version, tenant and
//! timeline, then pipelined requests answered in order. Each connection gets a thread of
//! its own with blocking I/O: a compute opens one connection per backend, and the work
//! behind a request (waiting for WAL, WAL redo) blocks. A request is served on the
//! connection's thread; the requests a pipelining client (readahead) already sent behind it
//! are read with it (up to 64) and served together on as many threads as the machine has
//! cores (at most 4), then answered in order. Responses are buffered and flushed when no
//! further request is already waiting in the input, so a pipelining client gets its
//! answers in batches and a one-at-a-time client gets each at once.
//!
//! With TLS configured ([`PageService::with_tls`]), a connection is TLS from its first
//! byte: the handshake runs on the connection's thread, then the same protocol runs over
//! the TLS stream. A client whose first bytes are no TLS ClientHello gets an `Error`
//! (code `Protocol`) saying the page service requires TLS, in the protocol it speaks, and
//! is closed. Refusals and failed handshakes are logged with the client's address and
//! counted. A client must finish the handshake and send its `Hello` within
//! [`HANDSHAKE_TIMEOUT`], so one that connects and sends nothing does not keep a thread.
//!
//! Invariants:
//! - Nothing a client sends can crash the service: a malformed message gets an `Error`
//!   with code `Protocol` and the connection is closed; a request that fails (LSN too old,
//!   timeout, no such block) gets an `Error` with the request's id and the connection
//!   stays open.
//! - Which LSN a read uses: the request's `request_lsn` if already ingested, else the
//!   newest ingested LSN, but never below `not_modified_since`, which is waited for. The
//!   compute promised the object did not change in between, so every choice in that range
//!   gives the same answer, and the earliest ingested one avoids waiting for newer WAL.

use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use proto::pagestream::{ErrorCode, PagestreamError, ReadLsns, Request, Response, MESSAGE_BYTES_MAX, PROTOCOL_VERSION};
use proto::{BlockNumber, Lsn, RelTag, TenantId, TimelineId};

use crate::pgdata::datadir::{DatadirError, ReadCost};
use crate::pgdata::pageapi::{PageApi, PageApiError};
use layerstore::tenant::Tenant;
use layerstore::timeline::Timeline;
use layerstore::value::Reconstructor;

/// The tenants this pageserver serves.
#[derive(Default)]
pub struct TenantRegistry {
    tenants: RwLock<HashMap<TenantId, Arc<Tenant>>>,
}

impl TenantRegistry {
    pub fn insert(&self, tenant: Arc<Tenant>) {
        self.tenants.write().unwrap_or_else(|p| p.into_inner()).insert(tenant.tenant_id(), tenant);
    }

    /// Takes a tenant out: requests that look it up from now on find nothing.
    pub fn remove(&self, id: TenantId) -> Option<Arc<Tenant>> {
        self.tenants.write().unwrap_or_else(|p| p.into_inner()).remove(&id)
    }

    pub fn get(&self, id: TenantId) -> Option<Arc<Tenant>> {
        self.tenants.read().unwrap_or_else(|p| p.into_inner()).get(&id).cloned()
    }

    /// Every tenant id, sorted.
    pub fn ids(&self) -> Vec<TenantId> {
        let mut ids: Vec<TenantId> = self.tenants.read().unwrap_or_else(|p| p.into_inner()).keys().copied().collect();
        ids.sort();
        ids
    }
}

/// Told what every page the service serves cost to read (read amplification metrics) and
/// how long it took, from the decoded request to the page (waiting for WAL included).
pub trait ReadObserver: Send + Sync {
    fn page_read(&self, cost: ReadCost, took: Duration);
}

/// Handed every page a GetPage rebuilt, with what the read cost, before the answer is sent:
/// a page that took many records to rebuild may be stored as an image of its newest
/// record (the materializer's read writeback).
pub trait ReadWriteback: Send + Sync {
    fn page_rebuilt(&self, timeline: &Timeline, rel: RelTag, blkno: BlockNumber, cost: ReadCost, page: &Bytes);
}

pub struct PageService {
    tenants: Arc<TenantRegistry>,
    reconstructor: Arc<dyn Reconstructor>,
    /// How long a request waits for its `not_modified_since` LSN to be ingested.
    wait_lsn_timeout: Duration,
    observer: Option<Arc<dyn ReadObserver>>,
    writeback: Option<Arc<dyn ReadWriteback>>,
    /// Checks the `Hello`'s token when set; told the reason of every refusal. (Tokens are
    /// part of the `server` feature; the fuzz targets build without it.)
    #[cfg(feature = "server")]
    auth: Option<(Arc<auth::Verifier>, Arc<RefusalObserver>)>,
    /// Requires TLS when set; told the reason ([`tls_failure_reason`]) of every client
    /// refused for it.
    #[cfg(feature = "server")]
    tls: Option<(Arc<tls::rustls::ServerConfig>, Arc<RefusalObserver>)>,
    /// How long a new connection may take to finish its TLS handshake and send `Hello`.
    handshake_timeout: Duration,
}

/// Told the reason of every refused client (`auth::AuthError::reason` for a `Hello`,
/// [`tls_failure_reason`] for TLS).
pub type RefusalObserver = dyn Fn(&'static str) + Send + Sync;

/// A running page service; stops when [`PageServiceHandle::shutdown`] is called.
pub struct PageServiceHandle {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl PageServiceHandle {
    /// Stops accepting connections; open connections end when their clients disconnect.
    pub fn shutdown(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the acceptor from accept().
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
    }
}

/// Why a connection ended abnormally (logged once, where it is handled).
#[derive(Debug, thiserror::Error)]
enum ConnectionError {
    #[error("could not read from or write to the client: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol violation: {0}")]
    Protocol(String),
}

impl ConnectionError {
    /// The client closed or reset the connection (a backend that exits with read-ahead
    /// answers unread, a compute stopped or killed): routine, logged at INFO, not WARN.
    fn client_went_away(&self) -> bool {
        use std::io::ErrorKind::*;
        matches!(self, ConnectionError::Io(e) if matches!(e.kind(), ConnectionReset | BrokenPipe | ConnectionAborted | UnexpectedEof))
    }
}

impl PageService {
    pub fn new(tenants: Arc<TenantRegistry>, reconstructor: Arc<dyn Reconstructor>, wait_lsn_timeout: Duration) -> PageService {
        PageService {
            tenants,
            reconstructor,
            wait_lsn_timeout,
            observer: None,
            writeback: None,
            #[cfg(feature = "server")]
            auth: None,
            #[cfg(feature = "server")]
            tls: None,
            handshake_timeout: HANDSHAKE_TIMEOUT,
        }
    }

    /// Requires TLS on every connection, with the certificate `config` hands out (a
    /// `tls::ServerTls`'s: each new handshake gets the current one, so a reloaded
    /// certificate reaches new connections and established ones keep theirs).
    #[cfg(feature = "server")]
    pub fn with_tls(mut self, config: Arc<tls::rustls::ServerConfig>, on_refusal: Arc<RefusalObserver>) -> PageService {
        self.tls = Some((config, on_refusal));
        self
    }

    /// Sets how long a new connection may take to finish its handshake and send `Hello`.
    pub fn with_handshake_timeout(mut self, timeout: Duration) -> PageService {
        self.handshake_timeout = timeout;
        self
    }

    /// Requires every `Hello` to carry a token that grants its timeline.
    #[cfg(feature = "server")]
    pub fn with_auth(mut self, verifier: Arc<auth::Verifier>, on_refusal: Arc<RefusalObserver>) -> PageService {
        self.auth = Some((verifier, on_refusal));
        self
    }

    /// Reports the cost of every GetPage served to `observer`.
    pub fn with_observer(mut self, observer: Arc<dyn ReadObserver>) -> PageService {
        self.observer = Some(observer);
        self
    }

    /// Hands every page a GetPage rebuilt to `writeback`.
    pub fn with_writeback(mut self, writeback: Arc<dyn ReadWriteback>) -> PageService {
        self.writeback = Some(writeback);
        self
    }

    /// Serves connections accepted on `listener` until shut down.
    pub fn start(self: Arc<Self>, listener: TcpListener) -> std::io::Result<PageServiceHandle> {
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let acceptor = std::thread::Builder::new().name("page-service-accept".into()).spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                let stream = match conn {
                    Ok(s) => s,
                    Err(e) => {
                        // Out of file descriptors, most likely: back off instead of spinning.
                        tracing::warn!("could not accept a page service connection: {e}");
                        std::thread::sleep(Duration::from_millis(100));
                        continue;
                    }
                };
                let service = Arc::clone(&self);
                let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
                let spawned = std::thread::Builder::new().name("page-service-conn".into()).spawn(move || {
                    match service.handle_connection(stream, &peer) {
                        Ok(()) => {}
                        Err(e) if e.client_went_away() => tracing::info!(peer, "page service connection ended: {e}"),
                        Err(e) => tracing::warn!(peer, "page service connection ended: {e}"),
                    }
                });
                if let Err(e) = spawned {
                    tracing::error!("could not start a thread for a page service connection: {e}");
                }
            }
        })?;
        Ok(PageServiceHandle { addr, stop, acceptor: Some(acceptor) })
    }

    fn handle_connection(&self, stream: TcpStream, peer: &str) -> Result<(), ConnectionError> {
        stream.set_nodelay(true)?;
        // Bounds how long a client that connects and sends nothing (or stalls in the TLS
        // handshake or before its Hello) holds this thread; lifted once the Hello is
        // answered, as a backend's connection may be idle for as long as the backend is.
        stream.set_read_timeout(Some(self.handshake_timeout))?;
        #[cfg(feature = "server")]
        if let Some((config, on_refusal)) = &self.tls {
            return match tls::accept_or_plaintext(Arc::clone(config), stream) {
                Ok(tls::Accepted::Tls(stream)) => self.serve(*stream, peer),
                Ok(tls::Accepted::Plaintext(tcp)) => {
                    on_refusal("plaintext");
                    tracing::warn!(peer, "page service refused a client without TLS");
                    refuse_plaintext(tcp);
                    Ok(())
                }
                Err(e) => {
                    let reason = tls_failure_reason(&e);
                    on_refusal(reason);
                    match reason {
                        "handshake" => tracing::warn!(peer, "page service TLS handshake failed: {e}"),
                        _ => tracing::info!(peer, "page service TLS handshake failed: {e}"),
                    }
                    Ok(())
                }
            };
        }
        self.serve(stream, peer)
    }

    /// Runs the protocol over `stream` (plain TCP, or TLS over it) until the client goes
    /// or the connection is refused, then closes it (a TLS stream with `close_notify`, so
    /// that the client can tell the end from a cut).
    fn serve<S: Transport>(&self, stream: S, peer: &str) -> Result<(), ConnectionError> {
        let mut conn = Conn { reader: BufReader::with_capacity(64 * 1024, stream), out: Vec::with_capacity(64 * 1024) };
        let result = self.run_protocol(&mut conn, peer);
        conn.reader.get_mut().close();
        result
    }

    fn run_protocol<S: Transport>(&self, conn: &mut Conn<S>, peer: &str) -> Result<(), ConnectionError> {
        // The handshake.
        let first = match read_request(conn) {
            Ok(Some(first)) => first,
            Ok(None) => return Ok(()),
            Err(ConnectionError::Io(e)) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                let timeout = self.handshake_timeout;
                tracing::info!(peer, "page service client sent no Hello within {timeout:?}; closing its connection");
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let (tenant_id, timeline_id, token) = match first {
            Request::Hello { protocol_version, tenant, timeline, auth_token } if protocol_version == PROTOCOL_VERSION => {
                (tenant, timeline, auth_token)
            }
            Request::Hello { protocol_version, .. } => {
                let msg =
                    format!("unsupported page service protocol version {protocol_version}; this pageserver speaks {PROTOCOL_VERSION}");
                send_error(conn, 0, ErrorCode::Protocol, &msg)?;
                return Err(ConnectionError::Protocol(msg));
            }
            other => {
                let msg = format!("expected Hello as the first message, got request {}", other.id());
                send_error(conn, 0, ErrorCode::Protocol, &msg)?;
                return Err(ConnectionError::Protocol(msg));
            }
        };
        // Before the timeline is looked up: a client without a token learns nothing.
        #[cfg(not(feature = "server"))]
        let _ = token;
        #[cfg(feature = "server")]
        if let Some((verifier, on_refusal)) = &self.auth {
            let access = auth::Access::Compute { tenant: tenant_id, timeline: Some(timeline_id) };
            if let Err(e) = verifier.authorize(Some(&token), access) {
                on_refusal(e.reason());
                tracing::warn!(peer, tenant_id = %tenant_id, timeline_id = %timeline_id, reason = e.reason(), "page service refused a client: {e}");
                send_error(conn, 0, ErrorCode::Unauthorized, &e.to_string())?;
                return Ok(());
            }
        }
        let Some(api) = self.page_api(tenant_id, timeline_id) else {
            let msg = format!("tenant {tenant_id} timeline {timeline_id} is not served by this pageserver");
            send_error(conn, 0, ErrorCode::NotFound, &msg)?;
            return Ok(());
        };
        let span = tracing::info_span!("page_service", tenant_id = %tenant_id, timeline_id = %timeline_id);
        let _enter = span.enter();
        Response::HelloOk { protocol_version: PROTOCOL_VERSION }.encode(&mut conn.out);
        conn.flush()?;
        conn.reader.get_ref().tcp().set_read_timeout(None)?;

        loop {
            let Some(first) = read_request(conn)? else { return Ok(()) };
            // Requests the client already sent behind this one (a pipelining client's
            // readahead) are served together, on up to `parallelism()` threads.
            let mut batch = vec![first];
            while batch.len() < BATCH_MAX && conn.input_waiting() {
                match read_request(conn)? {
                    Some(req) => batch.push(req),
                    None => break,
                }
            }
            let hello = batch.iter().position(|r| matches!(r, Request::Hello { .. }));
            if let Some(at) = hello {
                batch.truncate(at);
            }
            // The tenant may have been detached (moved to another pageserver) or attached
            // again (a new generation, new timeline objects) since the Hello: this
            // connection's timeline is not served any more, so its reads are refused as for
            // a new connection, and the client asks where the tenant is now.
            let served = self.tenants.get(tenant_id).and_then(|t| t.get_timeline(timeline_id));
            if !served.is_some_and(|now| Arc::ptr_eq(&now, api.timeline())) {
                let msg = format!("tenant {tenant_id} timeline {timeline_id} is no longer served by this pageserver");
                for req in &batch {
                    error_response(req.id(), ErrorCode::NotFound, msg.clone()).encode(&mut conn.out);
                }
                conn.flush()?;
                tracing::info!("{msg}: refused the connection's next requests");
                return Ok(());
            }
            for resp in self.serve_batch(&api, batch, &span) {
                resp.encode(&mut conn.out);
            }
            conn.write_out()?;
            if hello.is_some() {
                let msg = "Hello may only be sent once, as the first message";
                send_error(conn, 0, ErrorCode::Protocol, msg)?;
                return Err(ConnectionError::Protocol(msg.into()));
            }
            // Flush unless the client already sent the next request.
            if !conn.input_waiting() {
                conn.flush()?;
            }
        }
    }

    /// The answers to `batch`, in its order. Two or more requests are shared out over
    /// `parallelism()` threads (each request's work, waiting for WAL or WAL redo, blocks its
    /// thread); one is served on this thread, with no handoff.
    fn serve_batch(&self, api: &PageApi, batch: Vec<Request>, span: &tracing::Span) -> Vec<Response> {
        let threads = parallelism().min(batch.len());
        if threads < 2 {
            return batch.into_iter().map(|req| self.handle_request(api, req)).collect();
        }
        let n = batch.len();
        let mut shares: Vec<Vec<(usize, Request)>> = (0..threads).map(|_| Vec::new()).collect();
        for (i, req) in batch.into_iter().enumerate() {
            shares[i % threads].push((i, req));
        }
        let serve = |share: Vec<(usize, Request)>| -> Vec<(usize, Response)> {
            share.into_iter().map(|(i, req)| (i, self.handle_request(api, req))).collect()
        };
        let mut answers: Vec<Option<Response>> = (0..n).map(|_| None).collect();
        std::thread::scope(|scope| {
            let mut shares = shares.into_iter();
            let mine = shares.next().expect("at least two shares");
            let helpers: Vec<_> = shares
                .map(|share| {
                    let span = span.clone();
                    scope.spawn(move || {
                        let _enter = span.enter();
                        serve(share)
                    })
                })
                .collect();
            for (i, resp) in serve(mine) {
                answers[i] = Some(resp);
            }
            for helper in helpers {
                match helper.join() {
                    Ok(done) => {
                        for (i, resp) in done {
                            answers[i] = Some(resp);
                        }
                    }
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
        });
        answers.into_iter().map(|a| a.expect("every request of the batch was served")).collect()
    }

    fn page_api(&self, tenant: TenantId, timeline: TimelineId) -> Option<PageApi> {
        let timeline = self.tenants.get(tenant)?.get_timeline(timeline)?;
        Some(PageApi::new(timeline, Arc::clone(&self.reconstructor)))
    }

    fn handle_request(&self, api: &PageApi, req: Request) -> Response {
        let id = req.id();
        let t = self.wait_lsn_timeout;
        let result = match req {
            // The connection loop answers a second Hello itself; this keeps the match total.
            Request::Hello { .. } => return error_response(0, ErrorCode::Protocol, "Hello may only be sent once".into()),
            Request::GetPage { lsns, rel, blkno, .. } => {
                let started = std::time::Instant::now();
                api.get_page_with_cost(rel, blkno, read_lsn(api, lsns), t).map(|(page, cost)| {
                    if let Some(observer) = &self.observer {
                        observer.page_read(cost, started.elapsed());
                    }
                    if let Some(writeback) = &self.writeback {
                        writeback.page_rebuilt(api.timeline(), rel, blkno, cost, &page);
                    }
                    Response::Page { id, page: page.to_vec() }
                })
            }
            Request::Nblocks { lsns, rel, .. } => {
                api.get_rel_size(rel, read_lsn(api, lsns), t).map(|nblocks| Response::Nblocks { id, nblocks })
            }
            Request::Exists { lsns, rel, .. } => api.rel_exists(rel, read_lsn(api, lsns), t).map(|exists| Response::Exists { id, exists }),
            Request::DbSize { lsns, spcnode, dbnode, .. } => {
                api.get_db_size(spcnode, dbnode, read_lsn(api, lsns), t).map(|size_bytes| Response::DbSize { id, size_bytes })
            }
            Request::GetSlruSegment { lsns, kind, segno, .. } => {
                api.get_slru_segment(kind, segno, read_lsn(api, lsns), t).map(|data| Response::SlruSegment { id, data: data.to_vec() })
            }
        };
        result.unwrap_or_else(|e| {
            let code = error_code(&e);
            if code == ErrorCode::Internal {
                tracing::error!("request {id} failed: {e}");
            }
            error_response(id, code, e.to_string())
        })
    }
}

/// The LSN a read uses (see the module documentation).
fn read_lsn(api: &PageApi, lsns: ReadLsns) -> Lsn {
    let last = api.timeline().last_record_lsn();
    if lsns.request_lsn <= last {
        lsns.request_lsn
    } else {
        last.max(lsns.not_modified_since)
    }
}

fn error_code(e: &PageApiError) -> ErrorCode {
    match e {
        PageApiError::BelowGcHorizon { .. } => ErrorCode::LsnTooOld,
        PageApiError::WaitLsn(_) => ErrorCode::LsnTimeout,
        PageApiError::BlockBeyondEnd { .. } => ErrorCode::NoSuchBlock,
        PageApiError::Datadir(DatadirError::NotFound { .. }) => ErrorCode::NoSuchBlock,
        PageApiError::Datadir(_) => ErrorCode::Internal,
    }
}

fn error_response(id: u64, code: ErrorCode, message: String) -> Response {
    Response::Error { id, code, message }
}

/// The most requests read ahead into one batch.
const BATCH_MAX: usize = 64;

/// Threads one connection's batch is served on: the machine's cores, at most 4.
fn parallelism() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()).min(4))
}

/// How long a new connection may take to complete the TLS handshake and send its Hello
/// (unless [`PageService::with_handshake_timeout`] says otherwise).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a connection's bytes travel over: plain TCP, or TLS over TCP.
trait Transport: Read + Write {
    /// The TCP connection underneath (for its timeouts).
    fn tcp(&self) -> &TcpStream;

    /// Says goodbye before the connection is dropped (errors ignored: it is ending anyway).
    fn close(&mut self) {}
}

impl Transport for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

#[cfg(feature = "server")]
impl Transport for tls::ServerStream {
    fn tcp(&self) -> &TcpStream {
        &self.sock
    }

    fn close(&mut self) {
        self.conn.send_close_notify();
        // A client that stopped reading must not keep the thread.
        let _ = self.sock.set_write_timeout(Some(Duration::from_secs(1)));
        while self.conn.wants_write() && self.conn.write_tls(&mut self.sock).is_ok_and(|n| n > 0) {}
    }
}

/// What a page service client without TLS is told.
pub const TLS_REQUIRED: &str =
    "this pageserver's page service requires TLS: connect with TLS and verify its certificate against the cluster CA (fjord.tls_ca_file)";

/// Answers a client that does not speak TLS with an `Error` in its own protocol, then
/// closes. What it sent is read until it closes (for at most a second), so that closing
/// with unread input does not reset the connection before the client reads the answer.
#[cfg(feature = "server")]
fn refuse_plaintext(tcp: TcpStream) {
    let mut out = Vec::new();
    error_response(0, ErrorCode::Protocol, TLS_REQUIRED.to_string()).encode(&mut out);
    if (&tcp).write_all(&out).is_err() || tcp.shutdown(std::net::Shutdown::Write).is_err() {
        return;
    }
    let until = std::time::Instant::now() + Duration::from_secs(1);
    let _ = tcp.set_read_timeout(Some(Duration::from_millis(200)));
    let mut sink = [0u8; 4096];
    while std::time::Instant::now() < until {
        match (&tcp).read(&mut sink) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    }
}

/// The reason a TLS client was refused, for the refusal counter: `plaintext` (no TLS at
/// all), `closed` (gone during the handshake), `timeout`, `handshake` (the handshake
/// failed: the client refused our certificate, no common protocol version) or `io`.
#[cfg(feature = "server")]
pub fn tls_failure_reason(e: &tls::AcceptError) -> &'static str {
    match e {
        tls::AcceptError::NotTls { .. } => "plaintext",
        tls::AcceptError::Closed { .. } => "closed",
        tls::AcceptError::Timeout { .. } => "timeout",
        tls::AcceptError::Handshake { .. } => "handshake",
        tls::AcceptError::Io { .. } => "io",
    }
}

/// Every reason [`tls_failure_reason`] gives, for metrics that show each from the start.
pub const TLS_FAILURE_REASONS: [&str; 5] = ["plaintext", "closed", "timeout", "handshake", "io"];

/// One connection: its input, buffered, and its answers not yet written. A connection's
/// thread alternates reading and writing, so one object does both (a TLS stream cannot be
/// split into a reading and a writing half).
struct Conn<S: Transport> {
    reader: BufReader<S>,
    out: Vec<u8>,
}

/// Answers kept before they are written even when more requests wait (the write buffer).
const OUT_BYTES_MAX: usize = 64 * 1024;

impl<S: Transport> Conn<S> {
    /// Whether the next request's bytes are already read (a pipelining client).
    fn input_waiting(&self) -> bool {
        !self.reader.buffer().is_empty()
    }

    /// Writes the answers kept in `out` once they fill the write buffer.
    fn write_out(&mut self) -> std::io::Result<()> {
        if self.out.len() >= OUT_BYTES_MAX {
            self.reader.get_mut().write_all(&self.out)?;
            self.out.clear();
        }
        Ok(())
    }

    /// Writes every answer kept and flushes.
    fn flush(&mut self) -> std::io::Result<()> {
        if !self.out.is_empty() {
            self.reader.get_mut().write_all(&self.out)?;
            self.out.clear();
        }
        self.reader.get_mut().flush()
    }
}

fn send_error<S: Transport>(conn: &mut Conn<S>, id: u64, code: ErrorCode, message: &str) -> std::io::Result<()> {
    error_response(id, code, message.to_string()).encode(&mut conn.out);
    conn.flush()
}

/// Reads one request; `None` when the client closed the connection between messages.
/// A malformed message is answered with a protocol error before the connection closes.
fn read_request<S: Transport>(conn: &mut Conn<S>) -> Result<Option<Request>, ConnectionError> {
    let reader = &mut conn.reader;
    let mut header = [0u8; 5];
    match reader.read_exact(&mut header[..1]) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    reader.read_exact(&mut header[1..])?;
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    if len > MESSAGE_BYTES_MAX {
        let msg = PagestreamError::TooLong(len).to_string();
        send_error(conn, 0, ErrorCode::Protocol, &msg)?;
        return Err(ConnectionError::Protocol(msg));
    }
    let mut frame = vec![0u8; 5 + len];
    frame[..5].copy_from_slice(&header);
    reader.read_exact(&mut frame[5..])?;
    match Request::decode(&frame) {
        Ok((req, _)) => Ok(Some(req)),
        Err(e) => {
            let msg = e.to_string();
            send_error(conn, 0, ErrorCode::Protocol, &msg)?;
            Err(ConnectionError::Protocol(msg))
        }
    }
}

#[cfg(test)]
mod tests;
