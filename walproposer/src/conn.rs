//! One thread per safekeeper for connecting: connect, greet (`Hello` → `HelloOk`), then hand
//! the socket to the core thread, which reads and writes it from then on
//! ([`crate::core`]); wait until the core gives the connection up (it says why), then back
//! off and connect again, until the proposer stops.
//!
//! With TLS on, this thread asks for TLS (`SSLRequest`), completes the handshake and greets
//! inside it, then hands the socket and the TLS session to the core ([`crate::tls_io`]).
//!
//! Why the core and not this thread reads: an acknowledgement read here went to the core
//! through a channel and its eventfd, one more thread wake-up on every commit's path, with
//! four threads sharing the compute's cores with its backends. Connecting stays here, where
//! a safekeeper that does not answer blocks no one.

use crate::shared::Event;
use bytes::BytesMut;
use quorum::wire::{AcceptorMessage, ProposerMessage, PROTOCOL_VERSION};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::shared::Shared;
use crate::tls_io::Tls;

/// How long a TCP connect may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the safekeeper may take to answer `Hello`.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// The wait for the core to give a connection up wakes this often to notice that the
/// proposer stops.
const STOP_POLL: Duration = Duration::from_millis(200);
/// The first reconnect delay; it doubles up to `Config::reconnect_max`.
const BACKOFF_MIN: Duration = Duration::from_millis(50);
/// A connection that lived this long resets the backoff.
const HEALTHY_AFTER: Duration = Duration::from_secs(2);

/// What a connecting thread needs.
pub struct ConnCtx {
    pub node: usize,
    pub addr: String,
    pub hello: ProposerMessage,
    /// TLS to the safekeeper ([`crate::Config::tls`]).
    pub tls: Option<tls::ClientTls>,
    pub reconnect_max: Duration,
    pub shared: Arc<Shared>,
    pub events: crate::bell::EventSender,
}

pub fn run(ctx: ConnCtx) {
    let mut backoff = BACKOFF_MIN;
    // The last state logged, so that a safekeeper that stays down is reported once.
    let mut last_logged: Option<String> = None;
    let mut log_once = |text: String, error: bool| {
        if last_logged.as_deref() != Some(&text) {
            if error {
                tracing::warn!(safekeeper = %ctx.addr, "{text}");
            } else {
                tracing::info!(safekeeper = %ctx.addr, "{text}");
            }
            last_logged = Some(text);
        }
    };
    while !ctx.shared.stopping.load(Ordering::SeqCst) {
        match connect(&ctx) {
            Ok((stream, tls, node_id, leftover)) => {
                let connected_at = Instant::now();
                log_once(format!("connected (safekeeper node id {node_id})"), false);
                ctx.shared.set_node_state(ctx.node, None);
                let (ended, why) = mpsc::channel();
                if ctx.events.send(Event::Connected { node: ctx.node, stream, tls, leftover, ended }).is_err() {
                    return;
                }
                let reason = loop {
                    match why.recv_timeout(STOP_POLL) {
                        Ok(reason) => break reason,
                        Err(RecvTimeoutError::Timeout) if !ctx.shared.stopping.load(Ordering::SeqCst) => {}
                        Err(RecvTimeoutError::Timeout) => return,
                        Err(RecvTimeoutError::Disconnected) => break "the proposer dropped the connection".to_string(),
                    }
                };
                if ctx.shared.stopping.load(Ordering::SeqCst) {
                    return;
                }
                log_once(format!("connection lost: {reason}"), true);
                ctx.shared.set_node_state(ctx.node, Some(format!("connection lost: {reason}")));
                if connected_at.elapsed() >= HEALTHY_AFTER {
                    backoff = BACKOFF_MIN;
                }
            }
            Err(e) => {
                log_once(e.clone(), true);
                ctx.shared.set_node_state(ctx.node, Some(e));
            }
        }
        ctx.shared.sleep_unless_stopping(backoff);
        backoff = (backoff * 2).min(ctx.reconnect_max.max(BACKOFF_MIN));
    }
}

/// What [`connect`] hands to the core: the socket, its TLS session (with TLS on), the
/// safekeeper's node id, and whatever it sent after `HelloOk`.
type Greeted = (TcpStream, Option<Box<Tls>>, u64, BytesMut);

/// Connects (over TLS, with TLS on) and greets; returns the stream, the safekeeper's node id,
/// and whatever it sent after `HelloOk` (it may send `Feedback` at once).
fn connect(ctx: &ConnCtx) -> Result<Greeted, String> {
    let addrs = ctx.addr.to_socket_addrs().map_err(|e| format!("could not resolve {}: {e}", ctx.addr))?;
    let mut last_error = format!("{} resolves to no address", ctx.addr);
    let mut stream = None;
    for a in addrs {
        match TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last_error = format!("could not connect to {a}: {e}"),
        }
    }
    let mut stream = stream.ok_or(last_error)?;
    let io = |what: &str, e: std::io::Error| format!("could not {what}: {e}");
    // Appends are latency-bound: a commit waits for the acknowledgement of the last one.
    stream.set_nodelay(true).map_err(|e| io("set TCP_NODELAY", e))?;
    stream.set_write_timeout(Some(HELLO_TIMEOUT)).map_err(|e| io("set a write timeout", e))?;
    stream.set_read_timeout(Some(HELLO_TIMEOUT)).map_err(|e| io("set a read timeout", e))?;
    let (stream, tls, node_id, buf) = match &ctx.tls {
        None => {
            let (node_id, buf) = greet(&mut stream, &ctx.hello)?;
            (stream, None, node_id, buf)
        }
        Some(config) => {
            let mut tls = crate::tls_io::connect(stream, &ctx.addr, config)?;
            let (node_id, mut buf) = greet(&mut tls, &ctx.hello)?;
            let (conn, stream) = tls.into_parts();
            let mut tls = Tls::new(conn);
            // What rustls decrypted beyond `HelloOk` goes to the core with the rest.
            tls.take_plaintext(&mut buf)?;
            (stream, Some(Box::new(tls)), node_id, buf)
        }
    };
    // The core reads and writes with MSG_DONTWAIT; no timeouts are left on the socket.
    stream.set_read_timeout(None).map_err(|e| io("clear the read timeout", e))?;
    Ok((stream, tls, node_id, buf))
}

/// Sends `Hello` and reads the answer; returns the safekeeper's node id and what it sent
/// after `HelloOk`.
fn greet(stream: &mut (impl Read + Write), hello: &ProposerMessage) -> Result<(u64, BytesMut), String> {
    let io = |what: &str, e: std::io::Error| format!("could not {what}: {e}");
    let mut buf = BytesMut::new();
    hello.encode(&mut buf);
    stream.write_all(&buf).map_err(|e| io("send Hello", e))?;
    stream.flush().map_err(|e| io("send Hello", e))?;
    let mut buf = BytesMut::new();
    let reply = loop {
        match AcceptorMessage::decode(&mut buf) {
            Ok(Some(m)) => break m,
            Ok(None) => {}
            Err(e) => return Err(format!("protocol error from safekeeper in reply to Hello: {e}")),
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk) {
            Ok(0) => return Err("safekeeper closed the connection before answering Hello".into()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(io("read the reply to Hello", e)),
        }
    };
    let node_id = match reply {
        AcceptorMessage::HelloOk { protocol_version, node_id } if protocol_version == PROTOCOL_VERSION => node_id,
        AcceptorMessage::HelloOk { protocol_version, .. } => {
            return Err(format!("safekeeper speaks protocol version {protocol_version}, this proposer {PROTOCOL_VERSION}"))
        }
        AcceptorMessage::Error { message } => return Err(format!("safekeeper refused the connection: {message}")),
        other => return Err(format!("protocol error: safekeeper answered Hello with {other:?}")),
    };
    Ok((node_id, buf))
}
