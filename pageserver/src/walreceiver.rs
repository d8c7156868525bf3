//! The WAL receiver: follows a PostgreSQL server's WAL over the physical replication
//! protocol and ingests it into a timeline.
//!
//! It speaks the client side of streaming replication: a replication connection,
//! `IDENTIFY_SYSTEM`, `START_REPLICATION PHYSICAL <lsn> TIMELINE <tli>` from the timeline's
//! last record LSN, then `XLogData` messages in and standby status updates out (write and
//! apply = ingested, flush = in layer files on disk), so the server can count the
//! pageserver as a standby. Until safekeepers exist, the compute's own walsender is the
//! source. Message framing and the regular messages come from `postgres-protocol`;
//! `CopyBothResponse` and the replication payloads are decoded here.
//!
//! Flush feedback means "in layer files on disk": when WAL stops arriving for a moment
//! (`IDLE_FLUSH_AFTER`) the open layer is frozen and flushed, so that a server waiting for
//! this standby (a shutdown, a synchronous commit) sees its WAL confirmed. Under steady
//! load the open layer is flushed by size instead.
//!
//! Invariants:
//! - Streaming always resumes at the timeline's last record LSN, a record boundary, so
//!   nothing is ingested twice or skipped across reconnects.
//! - A connection failure is logged once and retried with backoff up to a ceiling; a
//!   decoding or ingest error stops the receiver (ingesting past it would corrupt the
//!   timeline), and its status says why.

use std::io::{Read, Write};
use std::net::TcpStream;
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

use crate::timeline::Timeline;
use crate::value::Reconstructor;
use crate::walingest::WalIngest;

/// Where to stream from.
#[derive(Clone, Debug, serde::Deserialize)]
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
    pub last_error: Option<String>,
}

pub struct WalReceiver {
    stop: Arc<AtomicBool>,
    status: Arc<Mutex<WalReceiverStatus>>,
    thread: Option<JoinHandle<()>>,
}

const STATUS_INTERVAL: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// When no WAL arrived for this long and some is not yet in layer files, flush it.
const IDLE_FLUSH_AFTER: Duration = Duration::from_millis(50);
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
    let mut backoff = Duration::from_millis(100);
    while !stop.load(Ordering::SeqCst) {
        match stream(&timeline, &mut ingest, &source, &stop, &status) {
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

    /// The next message; `Ok(None)` on read timeout. `CopyBothResponse` ('W'), which
    /// postgres-protocol does not know, is returned as `Err` with a marker (see callers).
    fn next(&mut self) -> anyhow::Result<Option<Msg>> {
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
                if self.buf[0] == b'W' {
                    if self.buf.len() < 1 + len {
                        // fall through to read more
                    } else {
                        self.buf.advance(1 + len);
                        return Ok(Some(Msg::CopyBoth));
                    }
                } else if let Some(m) = backend::Message::parse(&mut self.buf).context("parse a server message")? {
                    return Ok(Some(Msg::Backend(m)));
                }
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
        [("user", source.user.as_str()), ("replication", "true"), ("application_name", "fjord_pageserver")],
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

fn send_status(conn: &mut Conn, timeline: &Timeline) -> anyhow::Result<()> {
    let ingested = timeline.last_record_lsn();
    let flushed = timeline.disk_consistent_lsn();
    let mut payload = Vec::with_capacity(34);
    payload.push(b'r');
    payload.extend_from_slice(&ingested.0.to_be_bytes()); // written
    payload.extend_from_slice(&flushed.0.to_be_bytes()); // flushed
    payload.extend_from_slice(&ingested.0.to_be_bytes()); // applied
    payload.extend_from_slice(&now_pg_micros().to_be_bytes());
    payload.push(0);
    let mut out = BytesMut::new();
    frontend::CopyData::new(&payload[..])?.write(&mut out);
    conn.send(&out)
}

fn stream(
    timeline: &Arc<Timeline>,
    ingest: &mut WalIngest,
    source: &WalSource,
    stop: &AtomicBool,
    status: &Mutex<WalReceiverStatus>,
) -> Ended {
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
    let start = timeline.last_record_lsn();
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
    });
    let mut last_status = Instant::now() - STATUS_INTERVAL;
    let mut last_data = Instant::now();
    let mut streaming = false;
    loop {
        if stop.load(Ordering::SeqCst) {
            return Ended::Stopped;
        }
        let msg = match conn.next() {
            Ok(m) => m,
            Err(e) => return Ended::Connection(e),
        };
        match msg {
            None => {}
            Some(Msg::CopyBoth) => streaming = true,
            Some(Msg::Backend(backend::Message::ErrorResponse(body))) => {
                return Ended::Connection(anyhow!("START_REPLICATION failed: {}", error_text(&body)));
            }
            Some(Msg::Backend(backend::Message::CopyData(body))) if streaming => {
                let data = body.data();
                match data.first() {
                    Some(b'w') if data.len() >= 25 => {
                        let wal_start = Lsn(u64::from_be_bytes(data[1..9].try_into().expect("8 bytes")));
                        let wal_end = Lsn(u64::from_be_bytes(data[9..17].try_into().expect("8 bytes")));
                        if wal_start != decoder.next_feed_lsn() {
                            return Ended::Fatal(anyhow!(
                                "the server sent WAL from {wal_start}, expected {}",
                                decoder.next_feed_lsn()
                            ));
                        }
                        decoder.feed_bytes(&data[25..]);
                        last_data = Instant::now();
                        loop {
                            match decoder.poll_decode() {
                                Ok(Some(record)) => {
                                    let ingested = record
                                        .decode()
                                        .map_err(anyhow::Error::from)
                                        .and_then(|d| ingest.ingest_record(&d, record.end_lsn()));
                                    if let Err(e) = ingested {
                                        return Ended::Fatal(e.context(format!("ingest the record at {}", record.start_lsn())));
                                    }
                                }
                                Ok(None) => break,
                                Err(e) => return Ended::Fatal(anyhow!("decode WAL: {e}")),
                            }
                        }
                        set_status(status, |s| {
                            s.last_received_lsn = Some(decoder.next_feed_lsn().to_string());
                            s.server_wal_end_lsn = Some(wal_end.to_string());
                            s.records_ingested = ingest.stats().records;
                        });
                    }
                    Some(b'k') if data.len() >= 18 => {
                        if data[17] != 0 {
                            if let Err(e) = send_status(&mut conn, timeline) {
                                return Ended::Connection(e);
                            }
                            last_status = Instant::now();
                        }
                    }
                    other => {
                        return Ended::Connection(anyhow!("unexpected replication message {:?} of {} bytes", other.map(|b| *b as char), data.len()));
                    }
                }
            }
            Some(_) => {}
        }
        let idle_with_unflushed = last_data.elapsed() >= IDLE_FLUSH_AFTER && timeline.disk_consistent_lsn() < timeline.last_record_lsn();
        let flushed = if idle_with_unflushed { timeline.freeze_and_flush().map(|()| true) } else { timeline.maybe_freeze_and_flush() };
        match flushed {
            Ok(true) => {
                // Tell the server at once: it may be waiting for exactly this.
                if streaming {
                    if let Err(e) = send_status(&mut conn, timeline) {
                        return Ended::Connection(e);
                    }
                    last_status = Instant::now();
                }
            }
            Ok(false) => {}
            Err(e) => return Ended::Fatal(e.context("flush ingested WAL to layer files")),
        }
        if streaming && last_status.elapsed() >= STATUS_INTERVAL {
            if let Err(e) = send_status(&mut conn, timeline) {
                return Ended::Connection(e);
            }
            last_status = Instant::now();
        }
    }
}
