//! One thread per safekeeper: connect, greet (`Hello` → `HelloOk`), then read and decode
//! every message into the core's channel until the connection breaks; then back off and
//! connect again, until the proposer stops.
//!
//! The thread only reads. The core writes on a clone of the socket, and marks a connection
//! down by shutting that socket down, which ends this thread's read with an error and makes
//! it reconnect. Each connection has a generation number so that the core can ignore events
//! of a connection it already gave up on.

use crate::core::Event;
use bytes::BytesMut;
use quorum::wire::{AcceptorMessage, ProposerMessage, PROTOCOL_VERSION};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::Shared;

/// How long a TCP connect may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the safekeeper may take to answer `Hello`.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one write may block (a full socket buffer of a stuck safekeeper).
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Reads wake up this often to notice that the proposer stops.
const READ_POLL: Duration = Duration::from_millis(200);
/// The first reconnect delay; it doubles up to `Config::reconnect_max`.
const BACKOFF_MIN: Duration = Duration::from_millis(50);
/// A connection that lived this long resets the backoff.
const HEALTHY_AFTER: Duration = Duration::from_secs(2);

/// What a connection thread needs.
pub struct ConnCtx {
    pub node: usize,
    pub addr: String,
    pub hello: ProposerMessage,
    pub reconnect_max: Duration,
    pub shared: Arc<Shared>,
    pub events: crate::bell::EventSender,
}

pub fn run(ctx: ConnCtx) {
    let mut backoff = BACKOFF_MIN;
    let mut generation = 0u64;
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
            Ok((stream, node_id, leftover)) => {
                generation += 1;
                let connected_at = Instant::now();
                log_once(format!("connected (safekeeper node id {node_id})"), false);
                ctx.shared.set_node_state(ctx.node, None);
                let writer = match stream.try_clone() {
                    Ok(w) => w,
                    Err(e) => {
                        log_once(format!("could not clone socket: {e}"), true);
                        continue;
                    }
                };
                if ctx.events.send(Event::Connected { node: ctx.node, generation, writer }).is_err() {
                    return;
                }
                let reason = read_loop(&ctx, stream, generation, leftover);
                if ctx.shared.stopping.load(Ordering::SeqCst) {
                    return;
                }
                log_once(format!("connection lost: {reason}"), true);
                ctx.shared.set_node_state(ctx.node, Some(format!("connection lost: {reason}")));
                if ctx.events.send(Event::Disconnected { node: ctx.node, generation }).is_err() {
                    return;
                }
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

/// Connects and greets; returns the stream and the safekeeper's node id.
/// Connects and greets; returns the stream, the safekeeper's node id, and whatever it sent
/// after `HelloOk` (it may send `Feedback` at once).
fn connect(ctx: &ConnCtx) -> Result<(TcpStream, u64, BytesMut), String> {
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
    stream.set_write_timeout(Some(WRITE_TIMEOUT)).map_err(|e| io("set a write timeout", e))?;
    stream.set_read_timeout(Some(HELLO_TIMEOUT)).map_err(|e| io("set a read timeout", e))?;
    let mut buf = BytesMut::new();
    ctx.hello.encode(&mut buf);
    stream.write_all(&buf).map_err(|e| io("send Hello", e))?;
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
    stream.set_read_timeout(Some(READ_POLL)).map_err(|e| io("set a read timeout", e))?;
    Ok((stream, node_id, buf))
}

/// Reads messages until the connection breaks or the proposer stops; returns why it ended.
fn read_loop(ctx: &ConnCtx, mut stream: TcpStream, generation: u64, mut buf: BytesMut) -> String {
    buf.reserve(64 * 1024);
    let mut chunk = vec![0u8; 256 * 1024];
    loop {
        loop {
            match AcceptorMessage::decode(&mut buf) {
                Ok(Some(AcceptorMessage::Consensus(msg))) => {
                    if ctx.events.send(Event::Message { node: ctx.node, generation, msg }).is_err() {
                        return "the proposer stopped".into();
                    }
                }
                Ok(Some(AcceptorMessage::Feedback(f))) => ctx.shared.set_feedback(ctx.node, f),
                Ok(Some(AcceptorMessage::Standbys(list))) => ctx.shared.set_standbys(ctx.node, list),
                Ok(Some(AcceptorMessage::Error { message })) => {
                    let _ = stream.shutdown(std::net::Shutdown::Both);
                    return format!("safekeeper reported an error: {message}");
                }
                Ok(Some(other @ AcceptorMessage::HelloOk { .. })) => {
                    let _ = stream.shutdown(std::net::Shutdown::Both);
                    return format!("protocol error: unexpected {other:?}");
                }
                Ok(None) => break,
                Err(e) => {
                    let _ = stream.shutdown(std::net::Shutdown::Both);
                    return format!("protocol error from safekeeper: {e}");
                }
            }
        }
        if ctx.shared.stopping.load(Ordering::SeqCst) {
            return "the proposer stopped".into();
        }
        match stream.read(&mut chunk) {
            Ok(0) => return "closed by the safekeeper (or by this proposer after a failed write)".into(),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted) => {}
            Err(e) => return format!("read failed: {e}"),
        }
    }
}
