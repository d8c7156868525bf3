//! The safekeeper's TCP listener and the process around it.
//!
//! One port serves both protocols: the first byte of a connection tells them apart without
//! consuming it (`TcpStream::peek`). A proposer's first message is `Hello`, tag `b'H'`
//! ([`crate::proposer`]); anything else is a PostgreSQL client (a startup packet begins with
//! its length, whose first byte is 0 for any sane packet), handed to [`crate::replication`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

use crate::Safekeeper;

/// How often advanced commit LSNs (and removal horizons) are written to control files, and
/// WAL below the removal horizon is removed.
pub const LAZY_PERSIST_INTERVAL: Duration = Duration::from_secs(1);

/// Accepts connections forever, one task each.
pub async fn accept_loop(listener: TcpListener, sk: Arc<Safekeeper>) -> anyhow::Result<()> {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // EMFILE and friends: transient; do not spin.
                tracing::warn!("could not accept a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let sk = sk.clone();
        tokio::spawn(async move {
            match dispatch(stream, sk).await {
                Ok(()) => {}
                Err(e) if crate::peer::went_away(&e) => tracing::info!(%peer, "connection ended: {e:#}"),
                Err(e) => tracing::warn!(%peer, "connection ended with an error: {e:#}"),
            }
        });
    }
}

async fn dispatch(stream: TcpStream, sk: Arc<Safekeeper>) -> anyhow::Result<()> {
    let mut first = [0u8; 1];
    let n = stream.peek(&mut first).await?;
    if n == 0 {
        return Ok(());
    }
    if first[0] == b'H' {
        sk.metrics.connections.with_label_values(&["proposer"]).inc();
        crate::proposer::serve(stream, sk).await
    } else {
        sk.metrics.connections.with_label_values(&["replication"]).inc();
        crate::replication::serve(stream, sk).await
    }
}

/// About once a second: writes advanced commit LSNs and removal horizons, then removes WAL
/// below the horizons just made durable.
pub async fn lazy_persister(sk: Arc<Safekeeper>) {
    let mut tick = tokio::time::interval(LAZY_PERSIST_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let sk = sk.clone();
        let _ = tokio::task::spawn_blocking(move || {
            sk.persist_lazy_state();
            sk.remove_wal();
        })
        .await;
    }
}

/// Runs the safekeeper on the two listeners until `shutdown` completes, then persists every
/// commit LSN and removal horizon. Connections still open are dropped with the runtime.
pub async fn run(
    sk: Arc<Safekeeper>,
    listener: TcpListener,
    http_listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let mut accept = tokio::spawn(accept_loop(listener, sk.clone()));
    let mut http = tokio::spawn(crate::http::serve(http_listener, sk.clone()));
    let persister = tokio::spawn(lazy_persister(sk.clone()));
    let result = tokio::select! {
        _ = shutdown => Ok(()),
        r = &mut accept => r.map_err(anyhow::Error::from).and_then(|r| r),
        r = &mut http => r.map_err(anyhow::Error::from).and_then(|r| r),
    };
    accept.abort();
    http.abort();
    persister.abort();
    let sk2 = sk.clone();
    tokio::task::spawn_blocking(move || sk2.persist_lazy_state()).await?;
    result
}
