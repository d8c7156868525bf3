//! The `safekeeper` process: flags, logging, the data directory lock, signals.

use clap::Parser;
use std::path::PathBuf;
use tokio::net::TcpListener;

/// fjord's safekeeper: stores a compute's WAL durably as one of a quorum of acceptors and
/// serves committed WAL to the pageserver.
///
/// Proposers (the compute's WAL proposer) and PostgreSQL replication clients (the
/// pageserver) share the --listen port. Logs go to stderr; set RUST_LOG (e.g.
/// RUST_LOG=safekeeper=debug) to change what is logged. SIGTERM or SIGINT stops it cleanly.
#[derive(Parser, Debug)]
#[command(version, about, long_about)]
struct Args {
    /// This safekeeper's node id, reported to proposers.
    #[arg(long)]
    id: u64,
    /// Where timelines are stored (<dir>/<tenant_id>/<timeline_id>/); created if missing.
    /// Only one safekeeper may use a directory at a time.
    #[arg(long, value_name = "DIR")]
    data_dir: PathBuf,
    /// Address for proposers and replication clients.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:5454")]
    listen: String,
    /// Address of the HTTP API (status, timelines, /metrics).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:7676")]
    http: String,
    /// Never remove WAL. By default a timeline's WAL segments are removed once they are
    /// wholly below the pageserver's remote-consistent LSN, the peer horizon (WAL every
    /// safekeeper has) and the commit LSN.
    #[arg(long)]
    no_wal_removal: bool,
    /// Require tokens: the cluster's Ed25519 public key (PEM) that every token must be
    /// signed with. Proposers then need a token for their timeline in Hello, replication
    /// clients one that may read the timeline's WAL as their password, and HTTP requests
    /// an admin token (Authorization: Bearer), except /metrics and /v1/status. Without it
    /// anyone who reaches the ports may do anything.
    #[arg(long, value_name = "PATH")]
    auth_public_key: Option<PathBuf>,
    /// TLS: this safekeeper's certificate and key, or --no-tls.
    #[command(flatten)]
    tls: tls::args::ServerArgs,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        // Plain text in a log file, so that it reads (and greps) as text.
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    match run(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("safekeeper: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    use anyhow::Context;
    let auth = match &args.auth_public_key {
        Some(path) => Some(auth::Verifier::load(path).context("load the public key of --auth-public-key")?),
        None => None,
    };
    let tls = args.tls.load().context("load TLS (--tls-cert, --tls-key)")?;
    if let Some(tls) = &tls {
        tls.start_reloader();
    }
    let config = safekeeper::SafekeeperConfig { wal_removal: !args.no_wal_removal, auth, tls: tls.clone(), ..Default::default() };
    let sk = safekeeper::Safekeeper::open_with_config(args.id, &args.data_dir, config)?;
    let rt = tokio::runtime::Runtime::new().context("start the async runtime")?;
    rt.block_on(async {
        let listener = TcpListener::bind(&args.listen).await.with_context(|| format!("listen on {}", args.listen))?;
        let http = TcpListener::bind(&args.http).await.with_context(|| format!("listen on {}", args.http))?;
        tracing::info!(
            node_id = args.id,
            data_dir = %args.data_dir.display(),
            listen = %listener.local_addr()?,
            http = %http.local_addr()?,
            wal_removal = !args.no_wal_removal,
            "safekeeper started"
        );
        match &args.auth_public_key {
            Some(path) => tracing::info!(
                "authentication is on: proposers, replication clients and the HTTP API (but /metrics and /v1/status) need a token signed with the key in {}",
                path.display()
            ),
            None => tracing::warn!(
                "authentication is off: anyone who can reach --listen may write and read any timeline's WAL, and anyone who can reach --http may manage timelines; start with --auth-public-key to require tokens"
            ),
        }
        match &tls {
            Some(tls) => tracing::info!("TLS is on: certificate {}", tls.cert_path().display()),
            None => tracing::warn!("TLS is off (--no-tls): WAL and tokens travel in cleartext"),
        }
        safekeeper::server::run(sk, listener, http, shutdown_signal()).await
    })?;
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    tracing::info!("safekeeper stopped");
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        tracing::error!("could not install signal handlers; stop with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
    }
}
