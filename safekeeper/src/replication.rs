//! Placeholder: serving WAL to the pageserver over PostgreSQL's physical replication
//! protocol is written on another branch, which replaces this file (same signature).

use std::sync::Arc;

use crate::Safekeeper;

/// Serves one PostgreSQL replication connection (its first byte was not a proposer's
/// `Hello`).
pub async fn serve(stream: tokio::net::TcpStream, sk: Arc<Safekeeper>) -> anyhow::Result<()> {
    let _ = (stream, sk);
    anyhow::bail!("replication not implemented")
}
