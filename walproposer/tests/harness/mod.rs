//! A test double of the safekeeper service: a TCP server on loopback that speaks
//! `quorum::wire` around a `quorum::Acceptor`, keeping its WAL in a `Vec<u8>`.
//!
//! Written before the service existed; kept because it is fast and lets the tests script
//! failures. `real_safekeepers.rs` and `test_runner/safekeeper/` use real processes.
//! "Persisting" is applying to memory, which is what the protocol requires of ordering.

#![allow(dead_code, reason = "each test binary that includes this module uses a different part of it")]

use bytes::{Bytes, BytesMut};
use proto::Lsn;
use quorum::wire::{AcceptorMessage, PageserverFeedback, ProposerMessage, PROTOCOL_VERSION};
use quorum::{Acceptor, AcceptorAction, AcceptorState, Persist, ToProposer};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct Node {
    pub acceptor: Acceptor,
    /// WAL bytes from `begin`.
    pub begin: Lsn,
    pub wal: Vec<u8>,
    /// The highest remote-consistent LSN a proposer relayed.
    pub remote_consistent_lsn: Lsn,
    /// The token of every `Hello` received, in order (empty: none).
    pub hello_tokens: Vec<String>,
    /// If set, a `Hello` with another token is refused with `Error`, as a safekeeper with
    /// authentication on refuses it (the real check is the `auth` crate's, tested there
    /// and in the safekeeper).
    pub required_token: Option<String>,
}

impl Node {
    fn apply(&mut self, p: &Persist) {
        match p {
            Persist::Control { .. } => {}
            Persist::Truncate { at } => {
                let end = self.begin.0 + self.wal.len() as u64;
                if at.0 >= self.begin.0 && at.0 <= end && !self.wal.is_empty() {
                    self.wal.truncate((at.0 - self.begin.0) as usize);
                } else {
                    self.wal.clear();
                    self.begin = *at;
                }
            }
            Persist::Append { begin, data, .. } => {
                if self.wal.is_empty() {
                    self.begin = *begin;
                }
                assert_eq!(begin.0, self.begin.0 + self.wal.len() as u64, "append must continue the WAL");
                self.wal.extend_from_slice(data);
            }
        }
    }

    /// The bytes in `[from, to)`.
    pub fn bytes(&self, from: Lsn, to: Lsn) -> &[u8] {
        &self.wal[(from.0 - self.begin.0) as usize..(to.0 - self.begin.0) as usize]
    }
}

pub struct TestSafekeeper {
    pub addr: String,
    pub node: Arc<Mutex<Node>>,
    up: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    /// Connections stay open but nothing is read from them (a stuck safekeeper).
    paused: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl TestSafekeeper {
    pub fn start(node_id: u64) -> TestSafekeeper {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        listener.set_nonblocking(true).unwrap();
        let node = Arc::new(Mutex::new(Node {
            acceptor: Acceptor::new(AcceptorState::default()),
            begin: Lsn(0),
            wal: Vec::new(),
            remote_consistent_lsn: Lsn(0),
            hello_tokens: Vec::new(),
            required_token: None,
        }));
        let up = Arc::new(AtomicBool::new(true));
        let stop = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let paused = Arc::new(AtomicBool::new(false));
        let (n, u, s, c, p) = (Arc::clone(&node), Arc::clone(&up), Arc::clone(&stop), Arc::clone(&conns), Arc::clone(&paused));
        std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        if !u.load(Ordering::SeqCst) {
                            drop(stream);
                            continue;
                        }
                        stream.set_nonblocking(false).unwrap();
                        c.lock().unwrap().push(stream.try_clone().unwrap());
                        let (n, u, p) = (Arc::clone(&n), Arc::clone(&u), Arc::clone(&p));
                        std::thread::spawn(move || serve(stream, node_id, n, u, p));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        TestSafekeeper { addr, node, up, stop, paused, conns }
    }

    /// Stops reading its connections, which stay open; `resume` reads them again.
    pub fn pause(&self) {
        self.paused.store(true, Ordering::SeqCst);
    }

    pub fn resume(&self) {
        self.paused.store(false, Ordering::SeqCst);
    }

    /// Closes every connection and refuses new ones (the state is kept, as after a restart).
    pub fn down(&self) {
        self.up.store(false, Ordering::SeqCst);
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    pub fn up(&self) {
        self.up.store(true, Ordering::SeqCst);
    }

    pub fn flush_lsn(&self) -> Lsn {
        self.node.lock().unwrap().acceptor.state().flush_lsn
    }

    /// The end of the last whole record it holds (`quorum`'s "Record boundaries").
    pub fn boundary_lsn(&self) -> Lsn {
        self.node.lock().unwrap().acceptor.state().boundary_lsn
    }

    pub fn commit_lsn(&self) -> Lsn {
        self.node.lock().unwrap().acceptor.state().commit_lsn
    }
}

impl Drop for TestSafekeeper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.down();
    }
}

fn serve(mut stream: TcpStream, node_id: u64, node: Arc<Mutex<Node>>, up: Arc<AtomicBool>, paused: Arc<AtomicBool>) {
    stream.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let mut buf = BytesMut::new();
    let mut chunk = vec![0u8; 256 * 1024];
    let mut greeted = false;
    loop {
        if !up.load(Ordering::SeqCst) {
            return;
        }
        let mut out = BytesMut::new();
        loop {
            let msg = match ProposerMessage::decode(&mut buf) {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(e) => {
                    AcceptorMessage::Error { message: e.to_string() }.encode(&mut out);
                    let _ = stream.write_all(&out);
                    return;
                }
            };
            match msg {
                ProposerMessage::Hello { auth_token, .. } if !greeted => {
                    let mut n = node.lock().unwrap();
                    n.hello_tokens.push(auth_token.clone());
                    if n.required_token.as_ref().is_some_and(|t| *t != auth_token) {
                        AcceptorMessage::Error { message: "the token's signature does not verify".into() }.encode(&mut out);
                        let _ = stream.write_all(&out);
                        return;
                    }
                    greeted = true;
                    AcceptorMessage::HelloOk { protocol_version: PROTOCOL_VERSION, node_id }.encode(&mut out);
                }
                ProposerMessage::Hello { .. } => return,
                ProposerMessage::Consensus(m) => {
                    let mut n = node.lock().unwrap();
                    for a in n.acceptor.handle(m) {
                        match a {
                            AcceptorAction::Persist(p) => n.apply(&p),
                            AcceptorAction::CommitLsn(_) | AcceptorAction::PeerHorizon(_) => {}
                            AcceptorAction::RemoteConsistentLsn(l) => n.remote_consistent_lsn = n.remote_consistent_lsn.max(l),
                            AcceptorAction::SendWal { term, from, to } => {
                                let data = Bytes::copy_from_slice(n.bytes(from, to));
                                AcceptorMessage::Consensus(ToProposer::Wal { term, from, data }).encode(&mut out);
                            }
                            AcceptorAction::Reply(r) => {
                                let ack = matches!(r, ToProposer::AppendAck { .. });
                                AcceptorMessage::Consensus(r).encode(&mut out);
                                if ack {
                                    // A pretend pageserver that is always at the commit LSN,
                                    // and streams from node 1 only, which alone hears its
                                    // remote-consistent LSN (half the commit LSN) directly.
                                    let c = n.acceptor.state().commit_lsn;
                                    let remote_consistent_lsn = if node_id == 1 { Lsn(c.0 / 2) } else { n.remote_consistent_lsn };
                                    let f = PageserverFeedback { write_lsn: c, flush_lsn: c, apply_lsn: c, remote_consistent_lsn };
                                    AcceptorMessage::Feedback(f).encode(&mut out);
                                }
                            }
                        }
                    }
                }
            }
        }
        if !out.is_empty() && stream.write_all(&out).is_err() {
            return;
        }
        while paused.load(Ordering::SeqCst) && up.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
        }
        match stream.read(&mut chunk) {
            Ok(0) => return,
            Ok(k) => buf.extend_from_slice(&chunk[..k]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    }
}

/// The byte PostgreSQL "wrote" at `lsn` in these tests.
pub fn pattern(lsn: u64) -> u8 {
    (lsn.wrapping_mul(31) % 251) as u8
}

pub const SEGMENT_BYTES: u64 = 1 << 20;

/// A pg_wal-like directory: segment files of `SEGMENT_BYTES` holding `pattern`, covering
/// `[from, to)` (whole segments).
pub fn write_segments(dir: &std::path::Path, from: Lsn, to: Lsn) {
    std::fs::create_dir_all(dir).unwrap();
    for segno in from.0 / SEGMENT_BYTES..to.0.div_ceil(SEGMENT_BYTES) {
        let data: Vec<u8> = (segno * SEGMENT_BYTES..(segno + 1) * SEGMENT_BYTES).map(pattern).collect();
        std::fs::write(dir.join(pgwal::segment::segment_file_name(1, segno, SEGMENT_BYTES)), data).unwrap();
    }
}

pub fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
