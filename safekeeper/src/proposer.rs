//! One proposer connection: `Hello`, then consensus messages through the timeline's
//! acceptor (`quorum::wire` framing).
//!
//! Group commit: each time the socket is readable, everything already received is read and
//! decoded, and the whole batch goes through [`Timeline::handle_batch`], which syncs once;
//! the replies go out together afterwards. A proposer that pipelines appends (it may send up
//! to its window ahead) thus pays one fsync per batch, not per message.
//!
//! After the `Hello`, the connection runs on a thread of its own (`session_on_own_thread`),
//! which handles each batch where it woke up for the socket.
//!
//! A malformed message or a protocol violation gets `Error` with the reason and the
//! connection is closed; messages decoded before it in the same read were valid and are
//! handled first, the bad one changes nothing.
//!
//! With authentication on, the `Hello`'s token must grant the timeline it names
//! (`Access::Compute` of that timeline). It is checked right after the protocol version and
//! before the timeline is looked at: a refused proposer gets `Error` with the reason and
//! creates nothing, loads nothing and writes nothing.

use bytes::BytesMut;
use quorum::wire::{AcceptorMessage, PageserverFeedback, ProposerMessage, StandbyReport, PROTOCOL_VERSION};
use quorum::ToAcceptor;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::Instrument;

use crate::stream::Stream;
use crate::timeline::{BatchOutcome, Timeline, TimelineError};
use crate::Safekeeper;

/// Read-ahead per socket read.
const READ_CHUNK_BYTES: usize = 256 * 1024;
/// Stop draining the socket into one batch beyond this (bounds memory per connection).
const BATCH_BYTES_MAX: usize = 32 * 1024 * 1024;

/// Closes the connection after telling the proposer why.
async fn refuse(stream: &mut Stream, message: String) -> anyhow::Result<()> {
    tell_and_close(stream, &message).await;
    anyhow::bail!("{message}")
}

/// Sends `Error` and closes the connection, best effort (it is being closed anyway).
async fn tell_and_close(stream: &mut Stream, message: &str) {
    let mut out = BytesMut::new();
    AcceptorMessage::Error { message: message.to_string() }.encode(&mut out);
    let _ = send(stream, &out).await;
    let _ = stream.shutdown().await;
}

/// Writes `out` and flushes it: over TLS, bytes the socket did not take at once stay in the
/// session until a flush.
async fn send(stream: &mut Stream, out: &[u8]) -> std::io::Result<()> {
    stream.write_all(out).await?;
    stream.flush().await
}

/// Reads until `buf` holds at least one more byte; `false` on end of stream.
async fn read_more(stream: &mut Stream, buf: &mut BytesMut) -> anyhow::Result<bool> {
    buf.reserve(READ_CHUNK_BYTES);
    Ok(stream.read_buf(buf).await? > 0)
}

/// Runs [`Timeline::handle_batch`] (blocking: it writes and fsyncs) right here, on the
/// connection's own thread (see [`serve`]): a commit waits for this batch, and nothing else
/// runs on this thread. A panic (a broken invariant, which poisons the timeline's lock)
/// ends only this connection.
fn handle_batch_here(tl: &Arc<Timeline>, msgs: Vec<ToAcceptor>) -> anyhow::Result<Result<BatchOutcome, TimelineError>> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tl.handle_batch(msgs)))
        .map_err(|_| anyhow::anyhow!("handling a batch of proposer messages panicked"))
}

/// Runs a greeted connection's session on a thread of its own, with a current-thread
/// runtime that serves only this connection, and waits for it to end.
///
/// Why not a task on the shared runtime: every batch blocks (a write and an `fdatasync`),
/// and a commit waits for it. On the shared runtime that means `block_in_place`, which hands
/// the worker's other tasks to another thread for each batch and takes them back after:
/// with three safekeepers on a 2-core machine, that thread switching is most of the
/// safekeepers' CPU under pgbench read-write (`docs/decisions/0006-a-thread-per-proposer-connection.md`).
/// Here the thread that wakes up for the socket handles the batch and answers: one wake-up
/// per batch.
/// The feedback and standby lists still arrive through the timeline's watch channels, which
/// work across runtimes.
async fn session_on_own_thread(
    mut stream: Stream,
    buf: BytesMut,
    tl: Arc<Timeline>,
    feedback: tokio::sync::watch::Receiver<PageserverFeedback>,
    standbys: tokio::sync::watch::Receiver<Vec<StandbyReport>>,
) -> anyhow::Result<()> {
    let socket = stream.detach()?;
    let span = tracing::Span::current();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    // Dropped with this future (the connection task ends: the runtime shuts down), which
    // ends the session too, as it ended with the task before.
    let (_stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::Builder::new().name("sk-proposer".into()).spawn(move || {
        let result = (|| {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(
                async move {
                    let mut stream = stream;
                    stream.attach(socket)?;
                    let mut buf = buf;
                    session(&mut stream, &mut buf, &tl, feedback, standbys, stop_rx).await
                }
                .instrument(span),
            )
        })();
        let _ = done_tx.send(result);
    })?;
    done_rx.await.unwrap_or_else(|_| Err(anyhow::anyhow!("the connection's thread ended without a result")))
}

/// Serves a proposer connection (its first byte is `b'H'`) from `peer`; `buf` holds what
/// was already read of it.
pub async fn serve(mut stream: Stream, mut buf: BytesMut, peer: String, sk: Arc<Safekeeper>) -> anyhow::Result<()> {
    buf.reserve(READ_CHUNK_BYTES);
    let hello = loop {
        match ProposerMessage::decode(&mut buf) {
            Ok(Some(m)) => break m,
            Ok(None) => {
                if !read_more(&mut stream, &mut buf).await? {
                    return Ok(());
                }
            }
            Err(e) => return refuse(&mut stream, format!("malformed greeting: {e}")).await,
        }
    };
    let ProposerMessage::Hello { protocol_version, tenant, timeline, system_id, wal_segment_size, name, auth_token } = hello else {
        return refuse(&mut stream, "the first message must be Hello".into()).await;
    };
    if protocol_version != PROTOCOL_VERSION {
        return refuse(&mut stream, format!("unsupported protocol version {protocol_version}, this safekeeper speaks {PROTOCOL_VERSION}"))
            .await;
    }
    if let Some(auth) = &sk.auth {
        let access = auth::Access::Compute { tenant, timeline: Some(timeline) };
        if let Err(e) = auth.check(Some(&auth_token), access, &peer, &format!("proposer Hello ({name})")) {
            // Logged (once) and counted by the check; the connection ends without an error
            // of its own, so the refusal is not logged twice.
            tell_and_close(&mut stream, &e.to_string()).await;
            return Ok(());
        }
    }
    let span = tracing::info_span!("proposer", tenant_id = %tenant, timeline_id = %timeline, %peer, %name);
    async move {
        let sk2 = sk.clone();
        let tl = tokio::task::spawn_blocking(move || sk2.hello_timeline(tenant, timeline, system_id, wal_segment_size)).await?;
        let tl = match tl {
            Ok(tl) => tl,
            Err(message) => {
                tracing::warn!("refused: {message}");
                return refuse(&mut stream, message).await;
            }
        };
        // Subscribe before answering, so no change after the answer is missed; a proposer
        // learns the current progress right away.
        let feedback = tl.feedback_watch();
        let mut standbys = tl.standbys_watch();
        let mut out = BytesMut::new();
        AcceptorMessage::HelloOk { protocol_version: PROTOCOL_VERSION, node_id: sk.node_id }.encode(&mut out);
        let current = *feedback.borrow();
        if current != PageserverFeedback::default() {
            AcceptorMessage::Feedback(current).encode(&mut out);
        }
        let list = standbys.borrow_and_update().clone();
        if !list.is_empty() {
            AcceptorMessage::Standbys(list).encode(&mut out);
        }
        send(&mut stream, &out).await?;
        tracing::info!("proposer connected");
        sk.metrics.proposer_connections_open.inc();
        let r = session_on_own_thread(stream, buf, tl, feedback, standbys).await;
        sk.metrics.proposer_connections_open.dec();
        match &r {
            Ok(()) => tracing::info!("proposer disconnected"),
            Err(e) if crate::peer::went_away(e) => tracing::info!("proposer connection closed: {e:#}"),
            Err(e) => tracing::warn!("proposer connection closed: {e:#}"),
        }
        r
    }
    .instrument(span)
    .await
}

async fn session(
    stream: &mut Stream,
    buf: &mut BytesMut,
    tl: &Arc<Timeline>,
    mut feedback: tokio::sync::watch::Receiver<PageserverFeedback>,
    mut standbys: tokio::sync::watch::Receiver<Vec<StandbyReport>>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) -> anyhow::Result<()> {
    loop {
        // Drain what the socket already has, without waiting, so one sync covers it all.
        while buf.len() < BATCH_BYTES_MAX {
            buf.reserve(READ_CHUNK_BYTES);
            match stream.try_read_buf(buf) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e.into()),
            }
        }
        let mut msgs = Vec::new();
        let mut violation = None;
        loop {
            match ProposerMessage::decode(buf) {
                Ok(Some(ProposerMessage::Consensus(m))) => msgs.push(m),
                Ok(Some(ProposerMessage::Hello { .. })) => {
                    violation = Some("unexpected Hello on a connection that already greeted".to_string());
                    break;
                }
                Ok(None) => break,
                Err(e) => {
                    violation = Some(e.to_string());
                    break;
                }
            }
        }
        if !msgs.is_empty() {
            let outcome = handle_batch_here(tl, msgs)?;
            let outcome = match outcome {
                Ok(o) => o,
                Err(e) => return refuse(stream, e.to_string()).await,
            };
            let mut out = BytesMut::new();
            for r in outcome.replies {
                AcceptorMessage::Consensus(r).encode(&mut out);
            }
            send(stream, &out).await?;
            if let Some(e) = outcome.error {
                return refuse(stream, e).await;
            }
        }
        if let Some(v) = violation {
            return refuse(stream, v).await;
        }
        enum Event {
            Read(anyhow::Result<bool>),
            Feedback,
            Standbys,
            Stop,
        }
        let event = tokio::select! {
            more = read_more(stream, buf) => Event::Read(more),
            _ = &mut stop => Event::Stop,
            changed = feedback.changed() => match changed {
                Ok(()) => Event::Feedback,
                // The timeline outlives its connections; treat it as nothing to send.
                Err(_) => Event::Read(Ok(true)),
            },
            changed = standbys.changed() => match changed {
                Ok(()) => Event::Standbys,
                Err(_) => Event::Read(Ok(true)),
            },
        };
        match event {
            Event::Stop => return Ok(()),
            Event::Read(more) => {
                if !more? {
                    return Ok(());
                }
            }
            Event::Feedback => {
                let f = *feedback.borrow_and_update();
                let mut out = BytesMut::new();
                AcceptorMessage::Feedback(f).encode(&mut out);
                send(stream, &out).await?;
            }
            Event::Standbys => {
                let list = standbys.borrow_and_update().clone();
                let mut out = BytesMut::new();
                AcceptorMessage::Standbys(list).encode(&mut out);
                send(stream, &out).await?;
            }
        }
    }
}
