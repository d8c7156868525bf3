//! One page service connection per backend (`proto::pagestream` over TCP).
//!
//! Requests are answered in order. Besides the request a read waits for, a backend may
//! have prefetches in flight on the same connection ([`prefetch`]: GetPage requests sent
//! ahead for blocks it expects to read, up to [`PREFETCH_MAX`]); their answers are read as
//! they come, kept until the block is read ([`take_prefetched`]) or pushed out, and never
//! used unless the caller confirms the page cannot have changed since the request. A
//! request that
//! cannot complete (connection refused or lost, a read that times out) is retried on a
//! fresh connection, with backoff from 10 ms to 1 s, until `fjord.pageserver_timeout` has
//! passed since it started; then the query fails with an ERROR naming the pageserver and
//! the last failure, and the backend stays up. Every request is a read, so resending it is
//! safe. While waiting, interrupts are serviced: a cancelled query stops waiting.
//!
//! The address is `fjord.pageserver_address`, which a reload may change while the compute
//! runs (compute_ctl follows the storage controller that way). Each connection remembers
//! the address it was opened to. Before a request is sent, the address is looked up again
//! (`reload::pageserver_address`: a pending reload is applied, or peeked from the
//! configuration files where applying it is not safe); if it differs from the open
//! connection's, that connection is closed and a new one opened to the new address, and
//! the requests still waiting for an answer on the old one (prefetches) are sent again on
//! the new one, in order, so that nothing queued is lost or answered from the old address.
//! The lookup is repeated at every connection attempt and after every failed request, and
//! a pageserver's error answer is not returned while the address has changed under it
//! (the request is sent to the new address instead); an answer that the timeline is not on
//! that pageserver (`NotFound`: detached there, the move not yet known here) is retried
//! like a lost connection. A query therefore sees no error from
//! a move, unless the new address stays unreachable past `fjord.pageserver_timeout`.
//! Prefetches and the pages they bring are never taken from a connection to an address
//! other than the current one. An empty address from a reload is ignored: whether the
//! compute reads from a pageserver at all is decided at server start (`smgr::install`).
//!
//! With `fjord.tls_ca_file` set, every connection is TLS from its first byte (the CA file is
//! read once per backend, at its first connection): the pageserver's certificate must be
//! signed by that CA and name the host of the address dialled. A certificate that is
//! wrong in a way a retry cannot fix (another host, another CA, expired) fails the query at
//! once, with the reason; everything else (the pageserver restarting, a handshake cut off)
//! is retried like a lost connection. A connection lives as long as its backend, so the
//! handshake is paid once per backend, not per request.
//!
//! Invariant: a connection whose next answer may be half read is never reused. `reading` is
//! set while an answer is read and cleared once it is whole; if an ERROR (a cancel) unwinds
//! out of the middle, the next call finds it set and drops the connection with its queue.
//! Every answer is matched, in order, to the oldest request still waiting for one.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::{BufReader, ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::str::FromStr;
use std::time::{Duration, Instant};

use pgrx::prelude::*;
use proto::pagestream::{frame_len, ErrorCode, PagestreamError, ReadLsns, Request, Response, PROTOCOL_VERSION};
use proto::{BlockNumber, RelTag, TenantId, TimelineId};

use crate::guc;
use crate::reload;
use crate::shmem::{self, Mine};

/// How long one blocking socket read may last before we look at interrupts and the deadline.
const POLL: Duration = Duration::from_millis(100);

/// Requests a backend may have sent ahead of its reads.
pub const PREFETCH_MAX: usize = 64;

/// A connection's bytes: plain TCP, or TLS over it.
enum Stream {
    Plain(TcpStream),
    Tls(Box<tls::rustls::StreamOwned<tls::rustls::ClientConnection, BufTcp>>),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// The TCP connection under TLS, read through a buffer: rustls asks for at most 4 KiB per
/// read, and the answers to a window of prefetches are hundreds of KiB. A read that times
/// out (the poll for interrupts) loses nothing: rustls keeps a partial record.
struct BufTcp(BufReader<TcpStream>);

impl Read for BufTcp {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for BufTcp {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.get_mut().write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.get_mut().flush()
    }
}

struct Conn {
    /// The `host:port` it was opened to.
    address: String,
    stream: Stream,
    buf: Vec<u8>,
    /// An answer is being read (see the module's invariant).
    reading: bool,
    /// Requests sent, oldest first, with their answers once read.
    queue: VecDeque<Queued>,
}

struct Queued {
    req: Request,
    answer: Option<Response>,
}

struct Client {
    conn: Option<Conn>,
    next_id: u64,
    /// Whether the last failure was already logged (log once per outage, not per retry).
    outage_logged: bool,
    /// The address of the last connection opened: what an empty setting (from a reload)
    /// leaves in place.
    last_address: Option<String>,
}

thread_local! {
    static CLIENT: RefCell<Client> =
        const { RefCell::new(Client { conn: None, next_id: 1, outage_logged: false, last_address: None }) };
}

/// The pageserver answered with an error.
#[derive(Debug)]
pub struct ServerError {
    pub code: ErrorCode,
    pub message: String,
}

struct Target {
    tenant: TenantId,
    timeline: TimelineId,
    /// Sent in `Hello`: the compute's token from `FJORD_AUTH_TOKEN`, or empty.
    token: String,
    /// With `fjord.tls_ca_file` set: the cluster CA (the host its certificate must name is
    /// the one dialled).
    tls: Option<tls::ClientTls>,
}

/// The timeline and the trust from the `fjord.*` settings, which are fixed at server
/// start: parsed once per process, not per request. The address is not among them: a
/// reload may change it ([`address`]).
fn target() -> &'static Target {
    static TARGET: std::sync::OnceLock<Result<Target, (String, &'static str)>> = std::sync::OnceLock::new();
    match TARGET.get_or_init(parse_target) {
        Ok(t) => t,
        Err((message, hint)) => {
            ereport!(PgLogLevel::ERROR, PgSqlErrorCode::ERRCODE_CONFIG_FILE_ERROR, message.clone(), *hint);
            unreachable!("ereport(ERROR) does not return")
        }
    }
}

fn parse_target() -> Result<Target, (String, &'static str)> {
    const HINT: &str = "compute_ctl writes all three; set them in postgresql.conf.";
    let id = |name: &str, v: Option<String>| v.ok_or_else(|| (format!("fjord.pageserver_address is set but {name} is not"), HINT));
    let tenant_s = id("fjord.tenant_id", guc::tenant_id())?;
    let timeline_s = id("fjord.timeline_id", guc::timeline_id())?;
    let tenant =
        TenantId::from_str(tenant_s.trim()).map_err(|e| (format!("fjord.tenant_id \"{tenant_s}\" is not a tenant id: {e}"), HINT))?;
    let timeline = TimelineId::from_str(timeline_s.trim())
        .map_err(|e| (format!("fjord.timeline_id \"{timeline_s}\" is not a timeline id: {e}"), HINT))?;
    // compute_ctl passes the token in the postmaster's environment, which every backend
    // inherits; empty: none (a pageserver without authentication).
    let token = std::env::var(proto::AUTH_TOKEN_ENV).unwrap_or_default();
    let tls = match guc::tls_ca_file() {
        None => None,
        Some(ca) => Some(load_ca(&ca).map_err(|e| (e, HINT))?),
    };
    Ok(Target { tenant, timeline, token, tls })
}

/// The address at server start, set in the postmaster (every backend inherits it): what an
/// emptied setting leaves in place for a backend that never connected.
static START_ADDRESS: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Checks at server start that `fjord.tls_ca_file`, if set, is a CA certificate file:
/// FATAL in the postmaster otherwise, so that a compute never starts unable to read a page.
/// (Each backend loads the file again at its first connection.)
pub fn check_settings() {
    let _ = START_ADDRESS.set(guc::pageserver_address().unwrap_or_default());
    let Some(ca) = guc::tls_ca_file() else { return };
    if let Err(message) = load_ca(&ca) {
        ereport!(
            PgLogLevel::FATAL,
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            message,
            "compute_ctl writes fjord.tls_ca_file from its --tls-ca; the file must be readable by the postgres user"
        );
        unreachable!("ereport(FATAL) does not return")
    }
}

/// The cluster CA in `path` (`fjord.tls_ca_file`).
pub fn load_ca(path: &str) -> Result<tls::ClientTls, String> {
    tls::ClientTls::load(std::path::Path::new(path)).map_err(|e| format!("fjord.tls_ca_file \"{path}\": {e:#}"))
}

/// The host of a `host:port` address (an IPv6 address keeps its brackets).
fn host_of(address: &str) -> &str {
    address.trim().rsplit_once(':').map_or(address.trim(), |(host, _)| host)
}

/// The page service address to use now (`fresh`: read a pending reload's files again, see
/// `reload`); an empty setting keeps the last address this backend connected to. Called
/// with no borrow of `CLIENT` held: applying a reload runs other code.
fn address(fresh: bool) -> String {
    let now = reload::pageserver_address(fresh);
    now.or_else(|| CLIENT.with(|c| c.borrow().last_address.clone())).or_else(|| START_ADDRESS.get().cloned()).unwrap_or_default()
}

/// Why a connection attempt or a request failed.
struct Failure {
    message: String,
    /// A retry cannot help (a certificate for another host or from another CA).
    permanent: bool,
}

impl From<String> for Failure {
    fn from(message: String) -> Failure {
        Failure { message, permanent: false }
    }
}

fn io_err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

impl Conn {
    fn connect(t: &Target, address: &str, deadline: Instant) -> Result<Conn, Failure> {
        let addrs: Vec<_> = address.to_socket_addrs().map_err(|e| format!("cannot resolve \"{address}\": {e}"))?.collect();
        // Each address the name resolves to in turn (a name may resolve to ::1 first and
        // a pageserver listen on 127.0.0.1 only); the last failure is the one reported.
        let mut last = format!("\"{address}\" resolves to no address");
        let mut connected = None;
        for addr in &addrs {
            let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(10));
            match TcpStream::connect_timeout(addr, left.min(Duration::from_secs(5))) {
                Ok(tcp) => {
                    connected = Some(tcp);
                    break;
                }
                Err(e) => last = e.to_string(),
            }
        }
        let tcp = connected.ok_or(last)?;
        tcp.set_nodelay(true).map_err(io_err)?;
        let stream = match &t.tls {
            None => {
                tcp.set_read_timeout(Some(POLL)).map_err(io_err)?;
                Stream::Plain(tcp)
            }
            Some(ca) => {
                let host = host_of(address);
                // The handshake blocks (no interrupts serviced) for at most 5 s and never
                // past the deadline.
                let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(10));
                tcp.set_read_timeout(Some(left.min(Duration::from_secs(5)))).map_err(io_err)?;
                let tls = ca.connect(tcp, host).map_err(|e| {
                    use tls::ConnectError::*;
                    let permanent = matches!(e, WrongHost { .. } | UnknownCa { .. } | Expired { .. } | InvalidHost { .. });
                    Failure { message: e.to_string(), permanent }
                })?;
                tls.sock.set_read_timeout(Some(POLL)).map_err(io_err)?;
                let (conn, tcp) = (tls.conn, tls.sock);
                Stream::Tls(Box::new(tls::rustls::StreamOwned::new(conn, BufTcp(BufReader::with_capacity(64 * 1024, tcp)))))
            }
        };
        let mut conn =
            Conn { address: address.to_string(), stream, buf: Vec::with_capacity(16 * 1024), reading: false, queue: VecDeque::new() };
        let hello =
            Request::Hello { protocol_version: PROTOCOL_VERSION, tenant: t.tenant, timeline: t.timeline, auth_token: t.token.clone() };
        conn.send(hello)?;
        match conn.wait_for(0, deadline)? {
            Response::HelloOk { .. } => Ok(conn),
            Response::Error { message, .. } => Err(format!("pageserver refused the connection: {message}").into()),
            other => Err(format!("pageserver answered Hello with {other:?}").into()),
        }
    }

    /// Sends `req` and queues it for its answer.
    fn send(&mut self, req: Request) -> Result<(), String> {
        let mut out = Vec::with_capacity(64);
        req.encode(&mut out);
        self.stream.write_all(&out).map_err(|e| format!("send: {e}"))?;
        self.queue.push_back(Queued { req, answer: None });
        Ok(())
    }

    /// Reads answers until queue entry `idx` has one, then removes it and returns it. An
    /// answer that is not its request's (`Request::check_answer`) is an error: the
    /// connection is out of step.
    fn wait_for(&mut self, idx: usize, deadline: Instant) -> Result<Response, String> {
        while self.queue[idx].answer.is_none() {
            self.reading = true;
            let resp = self.read_response(deadline)?;
            self.reading = false;
            let waiting = self.queue.iter_mut().find(|q| q.answer.is_none()).ok_or("an answer to no request")?;
            waiting.req.check_answer(&resp).map_err(|e| format!("out of step with the pageserver: {e}"))?;
            waiting.answer = Some(resp);
        }
        let q = self.queue.remove(idx).expect("the index is in the queue");
        Ok(q.answer.expect("answered above"))
    }

    fn position(&self, rel: RelTag, blkno: BlockNumber) -> Option<usize> {
        self.queue.iter().position(|q| matches!(q.req, Request::GetPage { rel: r, blkno: b, .. } if r == rel && b == blkno))
    }

    fn read_response(&mut self, deadline: Instant) -> Result<Response, String> {
        loop {
            match frame_len(&self.buf) {
                Ok(n) => {
                    let (resp, used) = Response::decode(&self.buf[..n]).map_err(|e| format!("malformed answer: {e}"))?;
                    self.buf.drain(..used);
                    return Ok(resp);
                }
                Err(PagestreamError::Incomplete { .. }) => {}
                Err(e) => return Err(format!("malformed answer: {e}")),
            }
            let mut chunk = [0u8; 16 * 1024];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err("connection closed by the pageserver".into()),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {
                    check_for_interrupts!();
                    if Instant::now() >= deadline {
                        return Err("no answer before fjord.pageserver_timeout".into());
                    }
                    // A silent pageserver never closes the connection: a move is noticed
                    // here, and the caller asks the new address.
                    if reload::moved_away_from(&self.address) {
                        return Err(format!("no answer from {} while the page service moved", self.address));
                    }
                }
                Err(e) => return Err(format!("receive: {e}")),
            }
        }
    }
}

/// Sends the request `make(id)` and returns the answer; a pageserver-side error is
/// `Err(ServerError)`. An answer that is not this request's (`Request::check_answer`) counts
/// as a connection failure. Connection trouble is retried until the deadline, then ERRORs.
/// The address is looked up again before every attempt (see the module doc).
pub fn request(what: &dyn Fn() -> String, make: &dyn Fn(u64) -> Request) -> Result<Response, ServerError> {
    let t = target();
    let timeout = Duration::from_millis(guc::PAGESERVER_TIMEOUT_MS.get().max(100) as u64);
    let deadline = Instant::now() + timeout;
    let mut backoff = Duration::from_millis(10);
    let mut last_error;
    // A failed attempt reads a pending reload's files again before the next one.
    let mut fresh = false;
    loop {
        let connected = CLIENT.with(|c| c.borrow().conn.is_some());
        let wanted = address(fresh || !connected);
        let attempt = CLIENT.with(|c| {
            let mut c = c.borrow_mut();
            drop_if_half_read(&mut c);
            if c.conn.as_ref().is_some_and(|conn| conn.address != wanted) {
                switch(&mut c, t, &wanted, deadline)?;
            }
            if c.conn.is_none() {
                shmem::count(|s| &s.pageserver_reconnects);
                c.conn = Some(Conn::connect(t, &wanted, deadline)?);
                c.last_address = Some(wanted.clone());
                if c.outage_logged {
                    log!("fjord: reconnected to pageserver at {wanted}");
                    c.outage_logged = false;
                }
            }
            let id = c.next_id;
            c.next_id += 1;
            shmem::count(|s| &s.pageserver_requests);
            let conn = c.conn.as_mut().expect("connected above");
            // An answer that is not this request's (another id, another kind, a short page)
            // means the connection is out of step: never used, the connection dropped.
            let answer = conn.send(make(id)).and_then(|()| {
                let idx = conn.queue.len() - 1;
                conn.wait_for(idx, deadline)
            });
            match answer {
                Ok(resp) => Ok(resp),
                Err(e) => {
                    c.conn = None;
                    Err(Failure::from(e))
                }
            }
        });
        match attempt {
            // The timeline is not (or no longer) on this pageserver: the tenant may have
            // been detached here on its way elsewhere, before this compute heard of the
            // move. Like a lost connection, retried, the address looked up again each
            // time, until the deadline (a refused `Hello` is retried the same way).
            Ok(Response::Error { code: ErrorCode::NotFound, message, .. }) => {
                CLIENT.with(|c| dropped_prefetches(c.borrow_mut().conn.take().map_or(0, |conn| conn.queue.len())));
                last_error = format!("the pageserver does not have the timeline: {message}");
            }
            Ok(Response::Error { code, message, .. }) => {
                // Any other refusal from a pageserver the compute has just moved away from
                // is not this read's answer: the new one is asked instead.
                let moved = address(true) != wanted;
                if !moved || Instant::now() >= deadline {
                    return Err(ServerError { code, message });
                }
                fresh = true;
                continue;
            }
            Ok(resp) => return Ok(resp),
            Err(Failure { message, permanent: true }) => {
                ereport!(
                    PgLogLevel::ERROR,
                    PgSqlErrorCode::ERRCODE_CONNECTION_FAILURE,
                    format!("fjord: could not connect to the pageserver at {wanted} while {}: {message}", what()),
                    "The pageserver's certificate must be signed by the CA in fjord.tls_ca_file and name the host in fjord.pageserver_address."
                );
                unreachable!("ereport(ERROR) does not return")
            }
            Err(Failure { message, .. }) => last_error = message,
        }
        fresh = true;
        CLIENT.with(|c| {
            let mut c = c.borrow_mut();
            if !c.outage_logged {
                log!("fjord: page service at {wanted} failed ({last_error}) while {}; retrying", what());
                c.outage_logged = true;
            }
        });
        if Instant::now() + backoff >= deadline {
            ereport!(
                PgLogLevel::ERROR,
                PgSqlErrorCode::ERRCODE_CONNECTION_FAILURE,
                format!("fjord: could not reach the pageserver at {wanted} while {}", what()),
                format!("Last failure: {last_error}. Gave up after fjord.pageserver_timeout = {} ms.", timeout.as_millis())
            );
        }
        // A move is retried at once, and from the shortest backoff: the new address has
        // not failed yet (it may be attaching the tenant still).
        if address(true) == wanted {
            sleep_interruptibly(backoff);
            backoff = (backoff * 2).min(Duration::from_secs(1));
        } else {
            backoff = Duration::from_millis(10);
        }
    }
}

/// Moves this backend's connection to `to`: the old one is closed, a new one opened, and
/// the requests still waiting for an answer on the old one are sent again on the new one
/// in their order; answers already read stay queued where they were (they are the same
/// timeline's pages at the same LSNs, whichever pageserver served them). If the new
/// address cannot be reached or a resend fails, no connection is left and the caller
/// retries as after any failure.
fn switch(c: &mut Client, t: &Target, to: &str, deadline: Instant) -> Result<(), Failure> {
    let Some(old) = c.conn.take() else { return Ok(()) };
    shmem::count(|s| &s.pageserver_reconnects);
    let old_address = old.address;
    let mut new = match Conn::connect(t, to, deadline) {
        Ok(new) => new,
        Err(e) => {
            log!("fjord: page service moved from {old_address} to {to}; could not connect there yet: {}", e.message);
            dropped_prefetches(old.queue.len());
            return Err(e);
        }
    };
    c.last_address = Some(to.to_string());
    let (answered, waiting): (Vec<Queued>, Vec<Queued>) = old.queue.into_iter().partition(|q| q.answer.is_some());
    new.queue.extend(answered);
    let resent = waiting.len();
    for q in waiting {
        if let Err(e) = new.send(q.req) {
            dropped_prefetches(resent);
            return Err(e.into());
        }
    }
    log!("fjord: page service moved from {} to {to}; connection moved, {resent} requests in flight sent again", old_address);
    c.conn = Some(new);
    Ok(())
}

/// Drops the connection if an ERROR left an answer half read (see the module doc).
fn drop_if_half_read(c: &mut Client) {
    if c.conn.as_ref().is_some_and(|conn| conn.reading) {
        dropped_prefetches(c.conn.take().map_or(0, |conn| conn.queue.len()));
    }
}

fn dropped_prefetches(n: usize) {
    if n > 0 {
        if let Some(s) = shmem::shared() {
            s.counters.mine().prefetch_wasted.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Whether a GetPage for this block is already sent and not yet taken.
pub fn is_queued(rel: RelTag, blkno: BlockNumber) -> bool {
    CLIENT.with(|c| c.borrow().conn.as_ref().is_some_and(|conn| conn.position(rel, blkno).is_some()))
}

/// Sends a GetPage for a block this backend expects to read soon, without waiting. Returns
/// false when it was not sent (no connection yet, the queue full of unanswered requests, a
/// send error); a prefetch is only a hint, so nothing is retried and no error is raised.
pub fn prefetch(rel: RelTag, blkno: BlockNumber, lsns: ReadLsns) -> bool {
    let wanted = address(false);
    CLIENT.with(|c| {
        let mut c = c.borrow_mut();
        drop_if_half_read(&mut c);
        let Some(conn) = c.conn.as_mut() else { return false };
        if conn.address != wanted {
            // The next read moves the connection (`request`); nothing is sent to the old.
            return false;
        }
        if conn.position(rel, blkno).is_some() {
            return true;
        }
        if conn.queue.len() >= PREFETCH_MAX {
            // Make room by forgetting the oldest answered prefetch, if there is one.
            match conn.queue.front() {
                Some(q) if q.answer.is_some() => {
                    conn.queue.pop_front();
                    dropped_prefetches(1);
                }
                _ => return false,
            }
        }
        let id = c.next_id;
        c.next_id += 1;
        let conn = c.conn.as_mut().expect("checked above");
        match conn.send(Request::GetPage { id, lsns, rel, blkno }) {
            Ok(()) => {
                shmem::count(|s| &s.prefetch_requests);
                shmem::count(|s| &s.pageserver_requests);
                true
            }
            Err(_) => {
                dropped_prefetches(c.conn.take().map_or(0, |conn| conn.queue.len()));
                false
            }
        }
    })
}

/// The page a prefetch brought for this block, if one was sent, it arrives before the
/// deadline, and `still_valid(lsns of the request)` says the block cannot have changed
/// since. Anything else is `None` (the caller reads the block the ordinary way); a
/// connection failure drops the connection and every prefetch on it.
pub fn take_prefetched(rel: RelTag, blkno: BlockNumber, still_valid: impl Fn(&ReadLsns) -> bool) -> Option<Vec<u8>> {
    let wanted = address(false);
    CLIENT.with(|c| {
        let mut c = c.borrow_mut();
        drop_if_half_read(&mut c);
        let conn = c.conn.as_mut()?;
        if conn.address != wanted {
            // Read the ordinary way: `request` moves the connection first.
            return None;
        }
        let idx = conn.position(rel, blkno)?;
        let lsns = match conn.queue[idx].req {
            Request::GetPage { lsns, .. } => lsns,
            _ => unreachable!("position() finds GetPage requests only"),
        };
        let timeout = Duration::from_millis(guc::PAGESERVER_TIMEOUT_MS.get().max(100) as u64);
        match conn.wait_for(idx, Instant::now() + timeout) {
            Ok(Response::Page { page, .. }) if still_valid(&lsns) => {
                shmem::count(|s| &s.prefetch_hits);
                Some(page)
            }
            Ok(_) => {
                dropped_prefetches(1);
                None
            }
            Err(_) => {
                dropped_prefetches(c.conn.take().map_or(0, |conn| conn.queue.len()) + 1);
                None
            }
        }
    })
}

/// Sleeps `d`, servicing interrupts, and wakes early when a reload is signalled: it may
/// carry a new address, which is tried at once.
fn sleep_interruptibly(d: Duration) {
    let end = Instant::now() + d;
    let pending_before = reload::reload_pending();
    while Instant::now() < end {
        check_for_interrupts!();
        if !pending_before && reload::reload_pending() {
            return;
        }
        std::thread::sleep((end - Instant::now()).min(Duration::from_millis(20)));
    }
}
