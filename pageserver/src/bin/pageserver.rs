//! `pageserver`: serves pages of every tenant's timelines to computes.
//!
//! Reads its configuration from a TOML file (`--config`), then applies flags; every
//! setting has a default that works on a laptop. Runs until SIGINT or SIGTERM.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use std::sync::atomic::{AtomicBool, Ordering};

use pageserver::service::server::{http, join_controller, Pageserver, PageserverConfig};

/// fjord's pageserver: stores every page version of its tenants' timelines and serves
/// GetPage@LSN to computes.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// TOML configuration file; flags override what it says.
    #[arg(short = 'c', long)]
    config: Option<PathBuf>,
    /// Directory for tenants and their layer files.
    #[arg(short = 'D', long)]
    workdir: Option<PathBuf>,
    /// Address of the page service (computes connect here).
    #[arg(long)]
    listen_pg: Option<std::net::SocketAddr>,
    /// Address of the HTTP management API and /metrics.
    #[arg(long)]
    listen_http: Option<std::net::SocketAddr>,
    /// Bin directory of fjord's PostgreSQL build, whose `postgres` runs WAL redo.
    #[arg(long)]
    pg_bin_dir: Option<PathBuf>,
    /// Object storage for layer files: file:///absolute/dir or
    /// s3://bucket/prefix?endpoint=http://host:port&region=... (credentials from
    /// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY).
    #[arg(long, value_name = "URL")]
    remote_storage: Option<String>,
    /// Local disk budget for layer files in bytes; layers in remote storage are evicted
    /// (least recently used first) to keep downloads under it, and above 90% of it.
    #[arg(long, value_name = "BYTES")]
    layer_disk_budget_bytes: Option<u64>,
    /// The cluster's Ed25519 public key (PEM): every client must then present a token it
    /// verifies (`fjord init` makes the key pair). Unset: no authentication.
    #[arg(long, value_name = "PATH")]
    auth_public_key: Option<PathBuf>,
    /// The storage controller's base URL (https://host:port): the pageserver joins it as
    /// --node-id at start and holds only the tenants it places here, with the generations
    /// it issues. Needs --node-id and --remote-storage. The token presented to it (and to
    /// safekeepers restored from remote indexes) comes from FJORD_AUTH_TOKEN: this node's
    /// own (`fjord auth token --pageserver ID`), checked at start.
    #[arg(long, value_name = "URL")]
    controller: Option<String>,
    /// This pageserver's id at the storage controller: stable across restarts, one per host.
    #[arg(long, value_name = "ID")]
    node_id: Option<u64>,
    /// host:port computes dial for the page service (default: --listen-pg).
    #[arg(long, value_name = "HOST:PORT")]
    advertise_pg: Option<String>,
    /// host:port the storage controller dials for the HTTP API (default: --listen-http).
    #[arg(long, value_name = "HOST:PORT")]
    advertise_http: Option<String>,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    print_config: bool,
    /// TLS: this pageserver's certificate and key, and the cluster CA for the
    /// safekeepers it streams WAL from; or --no-tls.
    #[command(flatten)]
    tls: tls::args::ServerClientArgs,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_target(false)
        // Plain text in a log file, so that a WARN is a word a reader (or a test) can find.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    let args = Args::parse();
    let mut conf = match &args.config {
        Some(path) => PageserverConfig::load(path)?,
        None => PageserverConfig::default(),
    };
    if let Some(v) = args.workdir {
        conf.workdir = v;
    }
    if let Some(v) = args.listen_pg {
        conf.listen_pg_addr = v;
    }
    if let Some(v) = args.listen_http {
        conf.listen_http_addr = v;
    }
    if let Some(v) = args.pg_bin_dir {
        conf.pg_bin_dir = v;
    }
    if let Some(v) = args.remote_storage {
        conf.remote_storage = Some(v);
    }
    if let Some(v) = args.layer_disk_budget_bytes {
        conf.layer_disk_budget_bytes = Some(v);
    }
    if let Some(v) = args.auth_public_key {
        conf.auth_public_key_path = Some(v);
    }
    if let Some(v) = args.controller {
        conf.controller_url = Some(v);
    }
    if let Some(v) = args.node_id {
        conf.node_id = Some(v);
    }
    if let Some(v) = args.advertise_pg {
        conf.advertise_pg_addr = Some(v);
    }
    if let Some(v) = args.advertise_http {
        conf.advertise_http_addr = Some(v);
    }
    // Its own token only with a controller: without one the pageserver holds no token, and
    // one inherited from the caller's environment must not reach any WAL source.
    if conf.controller_url.is_some() {
        conf.auth_token = std::env::var("FJORD_AUTH_TOKEN").ok().filter(|t| !t.is_empty());
    }
    check_own_token(&conf)?;
    if args.print_config {
        print!("{}", toml::to_string(&conf).context("render the configuration")?);
        return Ok(());
    }
    // SAFETY: a plain libc call.
    if unsafe { libc::geteuid() } == 0 {
        anyhow::bail!("cannot run the pageserver as root: its WAL redo processes are postgres, which refuses root");
    }
    conf.tls = args.tls.load().context("load TLS (--tls-cert, --tls-key, --tls-ca)")?;
    match &conf.tls.server {
        Some(server) => {
            server.start_reloader();
            tracing::info!(
                "TLS is on: certificate {}, cluster CA {}",
                server.cert_path().display(),
                conf.tls.client.as_ref().map(|c| c.ca_path().display().to_string()).unwrap_or_default()
            );
        }
        None => tracing::warn!("TLS is off (--no-tls): pages, WAL and tokens travel in cleartext"),
    }

    layerstore::layer::block_cache::set_capacity_bytes(conf.block_cache_bytes);
    let ps = Arc::new(Pageserver::open(conf).context("start the pageserver")?);
    let page_service = ps.start_page_service()?;
    if ps.conf.controller_url.is_none() {
        let receivers = ps.start_persisted_wal_receivers().context("restart the WAL receivers")?;
        tracing::info!("restarted {receivers} WAL receivers");
    }
    ps.start_eviction();
    ps.start_secondaries();
    let background_jobs = ps.start_background_jobs()?;
    let materializer = ps.start_materializer()?;
    tracing::info!("page service listening on {}", page_service.addr);

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().context("start tokio")?;
    let ps2 = Arc::clone(&ps);
    runtime.block_on(async move {
        let ps = ps2;
        let listener = tokio::net::TcpListener::bind(ps.conf.listen_http_addr)
            .await
            .with_context(|| format!("listen for HTTP on {}", ps.conf.listen_http_addr))?;
        let https = ps.conf.tls.server.as_ref().map(|tls| {
            let metrics = Arc::clone(&ps.metrics);
            tls::http::Https { config: tls.config(), on_refusal: Arc::new(move |reason: &'static str| metrics.tls_refused("http", reason)) }
        });
        let scheme = if https.is_some() { "https" } else { "http" };
        tracing::info!("management API listening on {scheme}://{}", ps.conf.listen_http_addr);
        // Joins the storage controller while the API serves (orders wait until it is done).
        let stop_joining = Arc::new(AtomicBool::new(false));
        if ps.conf.controller_url.is_some() {
            let (ps, stop) = (Arc::clone(&ps), Arc::clone(&stop_joining));
            tokio::task::spawn_blocking(move || match join_controller(&ps, &stop) {
                Ok(n) => tracing::info!("attached the {n} tenants the storage controller places here"),
                Err(e) => tracing::warn!("{e:#}"),
            });
        }
        tls::http::serve(listener, http::router(Arc::clone(&ps)), https, shutdown_signal()).await;
        stop_joining.store(true, Ordering::SeqCst);
        anyhow::Ok(())
    })?;
    if let Some(jobs) = background_jobs {
        jobs.stop();
    }
    if let Some(materializer) = materializer {
        materializer.stop();
    }
    ps.stop_wal_receivers();
    page_service.shutdown();
    ps.shutdown_storage();
    tracing::info!("pageserver stopped");
    Ok(())
}

/// With a controller and authentication on, the pageserver's own token must be this node's
/// (`auth::Claims::pageserver`): it is presented to the controller and to safekeepers, and
/// an admin token there would give them everything.
fn check_own_token(conf: &PageserverConfig) -> anyhow::Result<()> {
    let (Some(node), Some(key)) = (conf.node_id.filter(|_| conf.controller_url.is_some()), &conf.auth_public_key_path) else {
        return Ok(());
    };
    let Some(token) = &conf.auth_token else {
        anyhow::bail!("with --controller and authentication on, FJORD_AUTH_TOKEN must hold this pageserver's own token (fjord auth token --pageserver {node})");
    };
    let verifier = auth::Verifier::load(key).context("load the authentication public key")?;
    let claims = verifier.verify(token).map_err(|e| anyhow::anyhow!("FJORD_AUTH_TOKEN: {e}"))?;
    if claims.scope != auth::Scope::Storage || claims.tenant_id.is_some() || claims.node_id != Some(node) {
        anyhow::bail!(
            "FJORD_AUTH_TOKEN is a {} token{}: the pageserver needs its own, a storage token for node {node} and no tenant",
            claims.scope,
            claims.node_id.map_or(String::new(), |n| format!(" for node {n}"))
        );
    }
    Ok(())
}

/// Waits for SIGINT or SIGTERM. SIGHUP, whose default action would end the process without
/// a line in its log, is logged and otherwise ignored (nothing is reloaded).
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("install a SIGTERM handler");
    let mut hup = signal(SignalKind::hangup()).expect("install a SIGHUP handler");
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {
                tracing::info!("got SIGINT, shutting down");
                return;
            }
            _ = term.recv() => {
                tracing::info!("got SIGTERM, shutting down");
                return;
            }
            _ = hup.recv() => tracing::warn!("got SIGHUP; ignored (the pageserver reads its configuration only at start)"),
        }
    }
}
