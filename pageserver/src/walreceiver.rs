//! The WAL receiver: follows a PostgreSQL server's WAL over the physical replication
//! protocol, makes it durable in the timeline's local WAL (`localwal.rs`) and ingests it.
//!
//! It speaks the client side of streaming replication: a replication connection
//! (`application_name=fjord_pageserver`, the name to put in `synchronous_standby_names`),
//! `IDENTIFY_SYSTEM`, `START_REPLICATION PHYSICAL <lsn> TIMELINE <tli>`, then `XLogData`
//! messages in and standby status updates out, so the server counts the pageserver as a
//! standby. Until safekeepers exist, the compute's own walsender is the source. Message
//! framing and the regular messages come from `postgres-protocol`; `CopyBothResponse` and
//! the replication payloads are decoded here.
//!
//! **Durability and the fsync discipline.** Each turn of the loop waits (at most
//! `READ_TIMEOUT`) for a message, then drains every message already readable from the
//! socket without waiting (up to `BATCH_BYTES_MAX` of WAL), writing each `XLogData`
//! payload into the local WAL segment files as it comes. Then, once per batch: one fsync
//! of the segment files written (and of the `wal/` directory if a segment was created),
//! then at once a status update with write = flush = the durable end and apply = the last
//! record LSN (ingested). Only then is the batch decoded and ingested, so a synchronous
//! commit waits for the network and one fsync, not for ingest or a layer flush. A
//! keepalive that asks for a reply gets one after the batch's fsync. Status updates also
//! go out every `STATUS_INTERVAL`.
//!
//! **Start and restart.** Each streaming session (the first, after a reconnect, and after
//! a pageserver restart, whose timeline stands at its disk-consistent LSN) first ingests
//! the local WAL from the timeline's last record LSN to its end (the first incomplete
//! record), fsyncs the local segments (a process that died may not have), and then starts
//! replication at the timeline's last record LSN, with a new decoder there. That is the
//! start of the first record not complete locally, at or below the durable end the server
//! was told: the bytes between are received again and rewritten identically, which is
//! why no durable-end marker is kept (it would cost a second fsync per batch).
//!
//! Layer flushes happen by size (`maybe_freeze_and_flush`) and when WAL pauses
//! (`IDLE_FLUSH_AFTER`); after each, local segments wholly below the disk-consistent LSN
//! are deleted.
//!
//! Invariants:
//! - WAL confirmed as flushed is in fsynced local segment files or in layer files.
//! - Streaming always resumes at the timeline's last record LSN, a record boundary, so
//!   nothing is ingested twice or skipped across reconnects and restarts.
//! - A connection failure is logged once and retried with backoff up to a ceiling; a
//!   decoding, ingest or local WAL error stops the receiver (going past it would corrupt
//!   the timeline or lie about durability), and its status says why.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{anyhow, bail, Context};
use bytes::{Buf, BytesMut};
use fallible_iterator::FallibleIterator;
use pgwal::{DecoderConfig, WalStreamDecoder};
use postgres_protocol::message::{backend, frontend};
use proto::Lsn;
use serde::Serialize;

use crate::localwal::{LocalWal, LOCAL_WAL_TLI};
use crate::timeline::Timeline;
use crate::value::Reconstructor;
use crate::walingest::WalIngest;

/// The `application_name` the receiver connects with: what a server names in
/// `synchronous_standby_names` to wait for the pageserver.
pub const APPLICATION_NAME: &str = "fjord_pageserver";

/// Where to stream from.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WalSource {
    pub host: String,
    pub port: u16,
    pub user: String,
}

/// What the receiver is doing, for the management API.
#[derive(Clone, Debug, Default, Serialize)]
pub struct WalReceiverStatus {
    pub state: String,
    pub connected: bool,
    pub last_received_lsn: Option<String>,
    pub server_wal_end_lsn: Option<String>,
    pub records_ingested: u64,
    /// The end of the WAL fsynced in the local WAL, confirmed to the server as flushed.
    pub durable_lsn: Option<String>,
    pub last_error: Option<String>,
}

pub struct WalReceiver {
    stop: Arc<AtomicBool>,
    status: Arc<Mutex<WalReceiverStatus>>,
    thread: Option<JoinHandle<()>>,
}

const STATUS_INTERVAL: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// When no WAL arrived for this long and some is not yet in layer files, flush it (which
/// lets the local WAL shrink).
const IDLE_FLUSH_AFTER: Duration = Duration::from_millis(500);
/// At most this much WAL is drained from the socket per fsync.
const BATCH_BYTES_MAX: usize = 4 * 1024 * 1024;
/// How long a read waits before the loop checks for a stop request and sends feedback.
const READ_TIMEOUT: Duration = Duration::from_millis(20);

impl WalReceiver {
    pub fn start(timeline: Arc<Timeline>, reconstructor: Arc<dyn Reconstructor>, source: WalSource) -> WalReceiver {
        let stop = Arc::new(AtomicBool::new(false));
        let status = Arc::new(Mutex::new(WalReceiverStatus { state: "starting".into(), ..Default::default() }));
        let (stop2, status2) = (Arc::clone(&stop), Arc::clone(&status));
        let thread = std::thread::Builder::new()
            .name("walreceiver".into())
            .spawn(move || run(timeline, reconstructor, source, stop2, status2))
            .expect("spawn the wal receiver thread");
        WalReceiver { stop, status, thread: Some(thread) }
    }

    pub fn status(&self) -> WalReceiverStatus {
        self.status.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for WalReceiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn set_status(status: &Mutex<WalReceiverStatus>, f: impl FnOnce(&mut WalReceiverStatus)) {
    f(&mut status.lock().unwrap_or_else(|p| p.into_inner()));
}

/// Why a streaming session ended.
enum Ended {
    Stopped,
    /// The connection failed; try again.
    Connection(anyhow::Error),
    /// The WAL could not be ingested; going on would corrupt the timeline.
    Fatal(anyhow::Error),
}

fn run(
    timeline: Arc<Timeline>,
    reconstructor: Arc<dyn Reconstructor>,
    source: WalSource,
    stop: Arc<AtomicBool>,
    status: Arc<Mutex<WalReceiverStatus>>,
) {
    let span = tracing::info_span!("walreceiver", tenant_id = %timeline.tenant_id(), timeline_id = %timeline.timeline_id());
    let _entered = span.enter();
    let mut ingest = WalIngest::new(Arc::clone(&timeline), reconstructor);
    let mut wal = match LocalWal::open(timeline.path(), timeline.last_record_lsn()) {
        Ok(w) => w,
        Err(e) => {
            tracing::error!("wal receiver stopped: {e:#}");
            set_status(&status, |s| {
                s.state = "failed".into();
                s.last_error = Some(format!("{e:#}"));
            });
            return;
        }
    };
    let mut backoff = Duration::from_millis(100);
    while !stop.load(Ordering::SeqCst) {
        match stream(&timeline, &mut ingest, &mut wal, &source, &stop, &status) {
            Ended::Stopped => break,
            Ended::Fatal(e) => {
                tracing::error!("wal receiver stopped: {e:#}");
                set_status(&status, |s| {
                    s.state = "failed".into();
                    s.connected = false;
                    s.last_error = Some(format!("{e:#}"));
                });
                return;
            }
            Ended::Connection(e) => {
                tracing::warn!("could not stream WAL from {}:{}: {e:#}; retrying in {backoff:?}", source.host, source.port);
                set_status(&status, |s| {
                    s.state = "reconnecting".into();
                    s.connected = false;
                    s.last_error = Some(format!("{e:#}"));
                });
                let until = Instant::now() + backoff;
                while Instant::now() < until && !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }
    set_status(&status, |s| {
        s.state = "stopped".into();
        s.connected = false;
    });
}

struct Conn {
    stream: TcpStream,
    buf: BytesMut,
}

impl Conn {
    fn send(&mut self, out: &BytesMut) -> anyhow::Result<()> {
        self.stream.write_all(out).context("write to the server")
    }

    /// A complete message from the buffer, if there is one. `CopyBothResponse` ('W'),
    /// which postgres-protocol does not know, is `Msg::CopyBoth`.
    fn buffered(&mut self) -> anyhow::Result<Option<Msg>> {
        if self.buf.len() >= 5 {
            let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
            if self.buf[0] == b'W' {
                if self.buf.len() >= 1 + len {
                    self.buf.advance(1 + len);
                    return Ok(Some(Msg::CopyBoth));
                }
            } else if let Some(m) = backend::Message::parse(&mut self.buf).context("parse a server message")? {
                return Ok(Some(Msg::Backend(m)));
            }
        }
        Ok(None)
    }

    /// The next message, waiting at most `READ_TIMEOUT` for bytes; `Ok(None)` on timeout.
    fn next(&mut self) -> anyhow::Result<Option<Msg>> {
        loop {
            if let Some(m) = self.buffered()? {
                return Ok(Some(m));
            }
            let mut chunk = [0u8; 64 * 1024];
            match self.stream.read(&mut chunk) {
                Ok(0) => bail!("the server closed the connection"),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => return Ok(None),
                Err(e) => return Err(e).context("read from the server"),
            }
        }
    }

    /// The next message if it is already readable, without waiting.
    fn try_next(&mut self) -> anyhow::Result<Option<Msg>> {
        loop {
            if let Some(m) = self.buffered()? {
                return Ok(Some(m));
            }
            let mut chunk = [0u8; 64 * 1024];
            // SAFETY: a valid buffer of the given length and an open socket.
            let n = unsafe {
                libc::recv(self.stream.as_raw_fd(), chunk.as_mut_ptr().cast::<libc::c_void>(), chunk.len(), libc::MSG_DONTWAIT)
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                return match e.kind() {
                    std::io::ErrorKind::WouldBlock => Ok(None),
                    std::io::ErrorKind::Interrupted => continue,
                    _ => Err(e).context("read from the server"),
                };
            }
            if n == 0 {
                bail!("the server closed the connection");
            }
            self.buf.extend_from_slice(&chunk[..n as usize]);
        }
    }

    /// Runs a replication command that returns rows, returning the first row's fields.
    fn simple_query(&mut self, query: &str, deadline: Instant) -> anyhow::Result<Vec<Option<String>>> {
        let mut out = BytesMut::new();
        frontend::query(query, &mut out)?;
        self.send(&out)?;
        let mut row = Vec::new();
        loop {
            match self.next()? {
                None if Instant::now() > deadline => bail!("timed out waiting for the answer to {query}"),
                None => {}
                Some(Msg::Backend(backend::Message::DataRow(body))) => {
                    let buf = body.buffer();
                    for range in body.ranges().iterator() {
                        let range = range.context("parse a data row")?;
                        row.push(range.map(|r| String::from_utf8_lossy(&buf[r]).into_owned()));
                    }
                }
                Some(Msg::Backend(backend::Message::ErrorResponse(body))) => bail!("{query} failed: {}", error_text(&body)),
                Some(Msg::Backend(backend::Message::ReadyForQuery(_))) => return Ok(row),
                Some(_) => {}
            }
        }
    }
}

enum Msg {
    Backend(backend::Message),
    CopyBoth,
}

fn error_text(body: &backend::ErrorResponseBody) -> String {
    let mut fields = body.fields();
    let mut msg = String::new();
    while let Ok(Some(f)) = fields.next() {
        if f.type_() == b'M' {
            msg = String::from_utf8_lossy(f.value_bytes()).into_owned();
        }
    }
    msg
}

fn connect(source: &WalSource) -> anyhow::Result<Conn> {
    let stream = TcpStream::connect((source.host.as_str(), source.port)).context("connect")?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(READ_TIMEOUT))?;
    let mut conn = Conn { stream, buf: BytesMut::new() };
    let mut out = BytesMut::new();
    frontend::startup_message(
        [("user", source.user.as_str()), ("replication", "true"), ("application_name", APPLICATION_NAME)],
        &mut out,
    )?;
    conn.send(&out)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match conn.next()? {
            None if Instant::now() > deadline => bail!("timed out waiting for the server to accept the connection"),
            None => {}
            Some(Msg::Backend(backend::Message::AuthenticationOk)) => {}
            Some(Msg::Backend(backend::Message::ReadyForQuery(_))) => return Ok(conn),
            Some(Msg::Backend(backend::Message::ErrorResponse(body))) => bail!("the server refused the connection: {}", error_text(&body)),
            Some(Msg::Backend(
                backend::Message::AuthenticationCleartextPassword
                | backend::Message::AuthenticationMd5Password(_)
                | backend::Message::AuthenticationSasl(_),
            )) => bail!("the server asks for a password; the wal receiver supports only trust authentication so far"),
            Some(_) => {}
        }
    }
}

fn now_pg_micros() -> i64 {
    // PostgreSQL's epoch is 2000-01-01.
    const PG_EPOCH_UNIX_SECONDS: u64 = 946_684_800;
    let unix = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(unix.as_micros()).unwrap_or(i64::MAX) - (PG_EPOCH_UNIX_SECONDS as i64) * 1_000_000
}

/// A standby status update: written = flushed = the local WAL's durable end, applied =
/// ingested (the last record LSN).
fn send_status(conn: &mut Conn, timeline: &Timeline, durable: Lsn) -> anyhow::Result<()> {
    let ingested = timeline.last_record_lsn();
    let mut payload = Vec::with_capacity(34);
    payload.push(b'r');
    payload.extend_from_slice(&durable.0.to_be_bytes()); // written
    payload.extend_from_slice(&durable.0.to_be_bytes()); // flushed
    payload.extend_from_slice(&ingested.0.to_be_bytes()); // applied
    payload.extend_from_slice(&now_pg_micros().to_be_bytes());
    payload.push(0);
    let mut out = BytesMut::new();
    frontend::CopyData::new(&payload[..])?.write(&mut out);
    conn.send(&out)
}

/// Ingests the local WAL from the timeline's last record LSN to its end, then makes the
/// local WAL ready for streaming from there (see the module documentation).
fn replay_local_wal(timeline: &Timeline, ingest: &mut WalIngest, wal: &mut LocalWal) -> anyhow::Result<Lsn> {
    let start = timeline.last_record_lsn();
    let replayed = ingest.ingest_pg_wal(wal.dir(), LOCAL_WAL_TLI, start).context("ingest the local WAL")?;
    if replayed.records > 0 {
        tracing::info!("ingested {} records of local WAL from {start} to {}", replayed.records, replayed.end_lsn);
    }
    let end = timeline.last_record_lsn();
    wal.restart_at(end)?;
    Ok(end)
}

fn stream(
    timeline: &Arc<Timeline>,
    ingest: &mut WalIngest,
    wal: &mut LocalWal,
    source: &WalSource,
    stop: &AtomicBool,
    status: &Mutex<WalReceiverStatus>,
) -> Ended {
    let start = match replay_local_wal(timeline, ingest, wal) {
        Ok(lsn) => lsn,
        Err(e) => return Ended::Fatal(e),
    };
    let mut conn = match connect(source) {
        Ok(c) => c,
        Err(e) => return Ended::Connection(e),
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let ident = match conn.simple_query("IDENTIFY_SYSTEM", deadline) {
        Ok(row) => row,
        Err(e) => return Ended::Connection(e),
    };
    let tli = ident.get(1).cloned().flatten().and_then(|t| t.parse::<u32>().ok()).unwrap_or(1);
    let mut out = BytesMut::new();
    if let Err(e) = frontend::query(&format!("START_REPLICATION PHYSICAL {start} TIMELINE {tli}"), &mut out).map_err(anyhow::Error::from).and_then(|()| conn.send(&out)) {
        return Ended::Connection(e);
    }
    let mut decoder = match WalStreamDecoder::new(start, DecoderConfig::default()) {
        Ok(d) => d,
        Err(e) => return Ended::Fatal(anyhow!("cannot decode WAL from {start}: {e}")),
    };
    tracing::info!("streaming WAL from {}:{} at {start}, timeline {tli}", source.host, source.port);
    set_status(status, |s| {
        s.state = "streaming".into();
        s.connected = true;
        s.last_error = None;
        s.durable_lsn = Some(start.to_string());
    });
    let mut last_status = Instant::now() - STATUS_INTERVAL;
    let mut last_data = Instant::now();
    let mut streaming = false;
    loop {
        if stop.load(Ordering::SeqCst) {
            return Ended::Stopped;
        }
        // One batch: wait for a message, then drain what is readable, writing WAL as it comes.
        let mut msg = match conn.next() {
            Ok(m) => m,
            Err(e) => return Ended::Connection(e),
        };
        let mut batch: Vec<bytes::Bytes> = Vec::new();
        let mut batch_bytes = 0usize;
        let mut reply_requested = false;
        let mut server_end = None;
        while let Some(m) = msg {
            match m {
                Msg::CopyBoth => streaming = true,
                Msg::Backend(backend::Message::ErrorResponse(body)) => {
                    return Ended::Connection(anyhow!("START_REPLICATION failed: {}", error_text(&body)));
                }
                Msg::Backend(backend::Message::CopyData(body)) if streaming => {
                    let data = body.into_bytes();
                    match data.first() {
                        Some(b'w') if data.len() >= 25 => {
                            let wal_start = Lsn(u64::from_be_bytes(data[1..9].try_into().expect("8 bytes")));
                            server_end = Some(Lsn(u64::from_be_bytes(data[9..17].try_into().expect("8 bytes"))));
                            if wal_start != wal.written_end() {
                                return Ended::Fatal(anyhow!("the server sent WAL from {wal_start}, expected {}", wal.written_end()));
                            }
                            if let Err(e) = wal.append(wal_start, &data[25..]) {
                                return Ended::Fatal(e.context("write to the local WAL"));
                            }
                            batch_bytes += data.len() - 25;
                            batch.push(data.slice(25..));
                        }
                        Some(b'k') if data.len() >= 18 => reply_requested |= data[17] != 0,
                        other => {
                            return Ended::Connection(anyhow!(
                                "unexpected replication message {:?} of {} bytes",
                                other.map(|b| *b as char),
                                data.len()
                            ));
                        }
                    }
                }
                Msg::Backend(_) => {}
            }
            if batch_bytes >= BATCH_BYTES_MAX {
                break;
            }
            msg = match conn.try_next() {
                Ok(m) => m,
                Err(e) => return Ended::Connection(e),
            };
        }
        if !batch.is_empty() {
            last_data = Instant::now();
            let durable = match wal.sync() {
                Ok(lsn) => lsn,
                Err(e) => return Ended::Fatal(e.context("fsync the local WAL")),
            };
            set_status(status, |s| s.durable_lsn = Some(durable.to_string()));
        }
        // Confirming and ingesting happen under the gate, so that a basebackup at the
        // newest LSN never falls between them (see Timeline::confirm_gate).
        let gate = timeline.confirm_gate();
        if streaming && (!batch.is_empty() || reply_requested) {
            if let Err(e) = send_status(&mut conn, timeline, wal.durable_end()) {
                return Ended::Connection(e);
            }
            last_status = Instant::now();
        }
        for data in batch {
            decoder.feed_bytes(&data);
            loop {
                match decoder.poll_decode() {
                    Ok(Some(record)) => {
                        let ingested = record.decode().map_err(anyhow::Error::from).and_then(|d| ingest.ingest_record(&d, record.end_lsn()));
                        if let Err(e) = ingested {
                            return Ended::Fatal(e.context(format!("ingest the record at {}", record.start_lsn())));
                        }
                    }
                    Ok(None) => break,
                    Err(e) => return Ended::Fatal(anyhow!("decode WAL: {e}")),
                }
            }
        }
        drop(gate);
        if let Some(wal_end) = server_end {
            set_status(status, |s| {
                s.last_received_lsn = Some(decoder.next_feed_lsn().to_string());
                s.server_wal_end_lsn = Some(wal_end.to_string());
                s.records_ingested = ingest.stats().records;
            });
        }
        let idle_with_unflushed = last_data.elapsed() >= IDLE_FLUSH_AFTER && timeline.disk_consistent_lsn() < timeline.last_record_lsn();
        let flushed = if idle_with_unflushed { timeline.freeze_and_flush().map(|()| true) } else { timeline.maybe_freeze_and_flush() };
        match flushed {
            Ok(true) => {
                if let Err(e) = wal.remove_below(timeline.disk_consistent_lsn()) {
                    return Ended::Fatal(e.context("remove local WAL that is in layer files"));
                }
            }
            Ok(false) => {}
            Err(e) => return Ended::Fatal(e.context("flush ingested WAL to layer files")),
        }
        if streaming && last_status.elapsed() >= STATUS_INTERVAL {
            if let Err(e) = send_status(&mut conn, timeline, wal.durable_end()) {
                return Ended::Connection(e);
            }
            last_status = Instant::now();
        }
    }
}
