//! The `storage_controller` process: flags, logging, the tasks, signals.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

/// fjord's storage controller: where each tenant is attached, its warm secondary and its
/// generation, in a PostgreSQL database; heartbeats to every pageserver, and failover of a
/// dead pageserver's tenants to their secondaries.
///
/// Run two against the same database for a standby: the one holding the lease leads, the
/// other answers reads and takes over when the lease lapses. Logs go to stderr (RUST_LOG
/// changes what is logged). SIGTERM or SIGINT stops it and gives the lease up at once.
#[derive(Parser, Debug)]
#[command(version, about, long_about)]
struct Args {
    /// The controller's database: a libpq connection string or URL
    /// (e.g. "host=127.0.0.1 port=5432 user=fjord dbname=postgres"). Its tables are made on
    /// first start (fjord_controller_*).
    #[arg(long, value_name = "CONNINFO")]
    database: String,
    /// Address of the HTTP API.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:1234")]
    listen: String,
    /// The address others reach this controller at (shown to callers of a controller that
    /// does not lead); defaults to --listen.
    #[arg(long, value_name = "HOST:PORT")]
    advertise: Option<String>,
    /// How often the leader asks each pageserver for its status.
    #[arg(long, value_name = "MS", default_value_t = 500, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    heartbeat_interval_ms: u64,
    /// How long one heartbeat may take.
    #[arg(long, value_name = "MS", default_value_t = 500, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    heartbeat_timeout_ms: u64,
    /// A pageserver that has not answered for this long is offline and its tenants fail
    /// over. A dead pageserver is taken for dead within this plus the interval and the
    /// timeout.
    #[arg(long, value_name = "MS", default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    offline_after_ms: u64,
    /// How long the leader lease lasts (renewed every third of it): a killed leader is
    /// replaced within about this long.
    #[arg(long, value_name = "MS", default_value_t = 3_000, value_parser = clap::value_parser!(u64).range(300..=600_000))]
    lease_ms: u64,
    /// After a planned migration cuts over to its destination, how long the source keeps
    /// serving the tenant before it becomes its secondary (computes poll the controller
    /// every 250 ms and move meanwhile).
    #[arg(long, value_name = "MS", default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(0..=600_000))]
    cutover_grace_ms: u64,
    /// A planned migration whose destination has not caught up this long after it started
    /// is abandoned: the tenant goes back to its source, one generation up.
    #[arg(long, value_name = "MS", default_value_t = 300_000, value_parser = clap::value_parser!(u64).range(1_000..=86_400_000))]
    migration_timeout_ms: u64,
    /// Require a token on every call but /v1/status and /metrics: the cluster's Ed25519
    /// public key (PEM). The controller's own token for the pageservers' APIs (an admin
    /// token) comes from FJORD_AUTH_TOKEN.
    #[arg(long, value_name = "PATH")]
    auth_public_key: Option<PathBuf>,
    /// TLS: this controller's certificate and key, and the cluster CA the pageservers'
    /// certificates are checked against; or --no-tls.
    #[command(flatten)]
    tls: tls::args::ServerClientArgs,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    match run(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("storage_controller: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[tokio::main]
async fn run(args: Args) -> anyhow::Result<()> {
    let auth = match &args.auth_public_key {
        Some(path) => Some(auth::Verifier::load(path).context("load the public key of --auth-public-key")?),
        None => None,
    };
    let tls = args.tls.load().context("load TLS (--tls-cert, --tls-key, --tls-ca)")?;
    if let Some(server) = &tls.server {
        server.start_reloader();
    }
    let listener = tokio::net::TcpListener::bind(&args.listen).await.with_context(|| format!("listen on {}", args.listen))?;
    let config = controller::Config {
        advertise: args.advertise.clone().unwrap_or_else(|| args.listen.clone()),
        database_url: args.database.clone(),
        heartbeat_interval: Duration::from_millis(args.heartbeat_interval_ms),
        heartbeat_timeout: Duration::from_millis(args.heartbeat_timeout_ms),
        offline_after: Duration::from_millis(args.offline_after_ms),
        lease: Duration::from_millis(args.lease_ms),
        client_tls: tls.client.clone(),
        auth_token: std::env::var("FJORD_AUTH_TOKEN").ok().filter(|t| !t.is_empty()),
        cutover_grace: Duration::from_millis(args.cutover_grace_ms),
        migration_timeout: Duration::from_millis(args.migration_timeout_ms),
    };
    let ctl = controller::Controller::new(config, auth);
    ctl.db.migrate().await.context("prepare the controller's database (--database)")?;
    tracing::info!(
        "storage controller {} listening on {} ({}), advertised as {}; a dead pageserver is taken for dead within {:?}",
        ctl.instance,
        args.listen,
        if tls.server.is_some() { "https" } else { "http, TLS off" },
        ctl.config.advertise,
        controller::heartbeat::detection_bound(&ctl)
    );
    if ctl.auth.is_none() {
        tracing::warn!("authentication is off (no --auth-public-key): anyone who reaches the API may change placements");
    }
    let mut leader = tokio::spawn(controller::leader::run(ctl.clone()));
    let mut heartbeat = tokio::spawn(controller::heartbeat::run(ctl.clone()));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let (died_tx, died_rx) = tokio::sync::oneshot::channel::<String>();
    let stopper = Arc::clone(&ctl);
    // The lease goes first: on a signal, or if a task ended (a panic; they never return),
    // this instance stops leading before it stops serving, so the standby need not wait for
    // the lease to lapse. Requests in flight end within the database calls' limit.
    let shutdown = async move {
        let why = tokio::select! {
            _ = term.recv() => "SIGTERM".to_string(),
            _ = tokio::signal::ctrl_c() => "SIGINT".to_string(),
            r = &mut leader => format!("the leader lease task ended: {r:?}"),
            r = &mut heartbeat => format!("the heartbeat task ended: {r:?}"),
        };
        leader.abort();
        heartbeat.abort();
        if let Err(e) = stopper.lease_db.release_lease(&stopper.instance).await {
            tracing::warn!("could not give the leader lease up: {e}");
        }
        let _ = died_tx.send(why);
    };
    controller::http::serve(listener, ctl.clone(), tls.server.as_ref(), shutdown).await;
    let why = died_rx.await.unwrap_or_default();
    if why.starts_with("the ") {
        anyhow::bail!("{why}");
    }
    tracing::info!("stopping on {why}");
    tracing::info!("stopped");
    Ok(())
}
