//! `compute_ctl`: starts one fjord compute and supervises it in the foreground.
//!
//! empty data directory -> [with --safekeepers: sync the safekeepers, make the pageserver
//! follow them] -> basebackup from the pageserver (at the synced LSN) -> config files ->
//! `postgres -D` -> wait for connections -> [without: ask the pageserver to follow the
//! compute's WAL] -> report
//! (one JSON line on stdout) -> forward shutdown signals until postgres exits -> exit with
//! postgres' status.
//!
//! With `--controller`, the pageserver's addresses come from the storage controller at start,
//! and a watcher thread follows the tenant when it moves (`watch_controller`): postgres is
//! reloaded with the new page service address and compute_ctl's own pageserver client
//! moves too, with no restart.
//!
//! A read replica (`--replica`): no sync; the pageserver is pointed at the safekeepers, the
//! basebackup is a hot standby's (`standby=true`: it starts at a running-transactions
//! record), and `standby.signal` plus a `primary_conninfo` naming every safekeeper make
//! postgres stream and replay the committed WAL from there.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use compute::controller::{ControllerClient, Location, SharedLocation};
use compute::file_cache;
use compute::pageserver;
use compute::pgconf::{self, ComputeSettings};
use compute::postgres::{self, Postmaster};
use compute::safekeepers::{self, Safekeeper};
use pageserver_api::models::LsnLeaseRequest;
use pageserver_api::Client;
use proto::{Lsn, TenantId, TimelineId};

/// Starts a fjord compute: fetches a basebackup of a timeline from the pageserver into an
/// empty data directory, writes the configuration, runs postgres in the foreground and
/// makes the pageserver follow its WAL. SIGTERM or SIGINT stops postgres with a fast
/// shutdown, SIGQUIT with an immediate one; compute_ctl exits with postgres' status.
#[derive(Parser, Debug)]
#[command(
    version,
    about,
    long_about = None,
    after_help = "Environment:\n  FJORD_AUTH_TOKEN  the token (a JWT signed with the cluster's key, granting this tenant) that \
                  the pageserver and the safekeepers require when they run with authentication on; compute_ctl \
                  sends it to the pageserver's API, to the safekeepers in the sync, and passes it on to postgres \
                  (its page service connections and WAL proposer) and a replica's WAL receiver"
)]
struct Args {
    /// Data directory; must be absent or empty (a compute always starts fresh).
    #[arg(long, value_name = "DIR")]
    pgdata: PathBuf,
    /// Bin directory of fjord's PostgreSQL build (postgres, pg_isready).
    #[arg(long, value_name = "DIR")]
    pg_bin_dir: PathBuf,
    /// Base URL of the pageserver's management API [default without --controller:
    /// http://127.0.0.1:9898]. With --controller: used only if the controller does not
    /// answer at start.
    #[arg(long, value_name = "URL")]
    pageserver_http: Option<String>,
    /// host:port of the pageserver's page service, for the fjord extension [default without
    /// --controller: 127.0.0.1:64000]. With --controller: used only if the controller does
    /// not answer at start.
    #[arg(long, value_name = "HOST:PORT")]
    pageserver_pg: Option<String>,
    /// Base URL of the storage controller (https://host:port with --tls-ca): compute_ctl
    /// asks it where the tenant is attached (GET /v1/tenant/{tenant}) at start, then every
    /// --controller-poll-interval-ms, and when the tenant moves, it reloads postgres with the
    /// new page service address and moves its own pageserver requests, without a restart. A
    /// controller that does not answer changes nothing. Sends FJORD_AUTH_TOKEN.
    #[arg(long, value_name = "URL")]
    controller: Option<String>,
    /// How often to ask the storage controller (--controller) where the tenant is, in ms.
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_CONTROLLER_POLL_MS, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    controller_poll_interval_ms: u64,
    /// Tenant id (32 hex digits).
    #[arg(long)]
    tenant: TenantId,
    /// Timeline id (32 hex digits).
    #[arg(long)]
    timeline: TimelineId,
    /// Start read-only at this past LSN (X/X) instead of at the end of the timeline. Such a
    /// compute is not followed by the pageserver and refuses writes.
    #[arg(long, value_name = "X/X")]
    lsn: Option<Lsn>,
    /// TCP port postgres listens on.
    #[arg(long, default_value_t = 55432)]
    port: u16,
    /// listen_addresses for postgres; also the host the pageserver connects to for WAL.
    #[arg(long, default_value = "127.0.0.1")]
    listen: String,
    /// shared_buffers of the compute.
    #[arg(long, default_value = "128MB")]
    shared_buffers: String,
    /// Extra postgresql.conf setting, applied last; repeatable.
    #[arg(short = 'c', value_name = "NAME=VALUE")]
    settings: Vec<String>,
    /// File that receives postgres' stdout and stderr [default: <pgdata>/../postgres.log].
    #[arg(long, value_name = "FILE")]
    postgres_log: Option<PathBuf>,
    /// Also write the startup report (and, at exit, the final state) to this JSON file.
    #[arg(long, value_name = "FILE")]
    status_file: Option<PathBuf>,
    /// host:port,host:port,... of the safekeepers. The compute then starts at the end of the
    /// WAL they agree on (a sync runs first), streams its WAL to them, and the pageserver
    /// follows them instead of the compute.
    #[arg(long, value_name = "HOST:PORT,...")]
    safekeepers: Option<String>,
    /// Start a read replica (a hot standby) instead of the branch's writer: it streams the
    /// committed WAL from the safekeepers (--safekeepers, required), replays it on the
    /// pages it holds and reads the rest from the pageserver at its replay position. No
    /// sync: any number of replicas run beside the writer, or without one.
    #[arg(long, conflicts_with = "lsn")]
    replica: bool,
    /// The endpoint's name: a read replica streams under it as its `application_name` (what
    /// the primary's `fjord.replicas()` and the safekeepers' status show); a replica's and an
    /// `--lsn` compute's lease on the LSN they read at is named after it.
    #[arg(long, value_name = "NAME", default_value = "fjord_replica")]
    name: String,
    /// How long the pageserver keeps a replica's lease on its replay position, or an `--lsn`
    /// compute's on its LSN (each renewed every second), after the last renewal, in seconds.
    #[arg(long, env = "FJORD_REPLICA_LEASE_TTL_SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    replica_lease_ttl_secs: u64,
    /// How long the safekeeper sync may take, in seconds.
    #[arg(long, default_value_t = 30)]
    sync_safekeepers_timeout_secs: u64,
    /// The local file cache's file (`fjord.file_cache_path`), outside the data directory so
    /// that it survives a restart [default: <pgdata>/../file_cache]. Its size is
    /// `fjord.file_cache_size` (-c).
    #[arg(long, value_name = "FILE")]
    file_cache: Option<PathBuf>,
    /// How long to wait for postgres to accept connections, in seconds.
    #[arg(long, default_value_t = 60)]
    start_timeout_secs: u64,
    /// The token for the pageserver and the safekeepers, from `FJORD_AUTH_TOKEN` only (a
    /// command line is visible to every user of the machine); see `after_help`.
    #[arg(skip)]
    auth_token: Option<String>,
    /// TLS: the cluster CA the pageserver's and the safekeepers' certificates must be
    /// signed by, or --no-tls.
    #[command(flatten)]
    tls: tls::args::ClientArgs,
    /// The trust in the cluster CA that --tls-ca loads at start (`None`: --no-tls).
    #[arg(skip)]
    client_tls: Option<tls::ClientTls>,
}

/// Without --controller: where the pageserver is unless --pageserver-* say otherwise.
const DEFAULT_PAGESERVER_HTTP: &str = "http://127.0.0.1:9898";
const DEFAULT_PAGESERVER_PG: &str = "127.0.0.1:64000";

/// How often the watcher asks the controller where the tenant is. A failover must complete
/// within 5 s of a pageserver's death, end to end (docs/decisions/0013-storage-controller.md):
/// the controller takes up to 3 s to declare it dead, the database transaction and the
/// secondary's attach (it catches up WAL) take a few hundred ms, which leaves the compute
/// about 1.5 s. Its part is this interval (the move is seen at most one interval after the
/// controller committed it), one request (ms, on a kept-alive connection), the reload
/// (postgres signals every backend at once) and each backend's next request (a read waiting
/// on the dead pageserver sleeps between retries, but a reload wakes it and a move is tried
/// at once).
/// 250 ms uses a sixth of that margin; shorter would buy little against the 3 s of
/// detection and costs the controller a read per compute per interval (4 per second per
/// compute here).
const DEFAULT_CONTROLLER_POLL_MS: u64 = 250;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    let mut args = Args::parse();
    args.auth_token = std::env::var(proto::AUTH_TOKEN_ENV).ok().filter(|t| !t.is_empty());
    match run(args) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("compute_ctl: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(mut args: Args) -> anyhow::Result<i32> {
    if compute::running_as_root() {
        bail!("cannot run compute_ctl as root: postgres refuses to run as root; run it as an unprivileged user");
    }
    args.client_tls = args.tls.load().context("load TLS (--tls-ca)")?;
    let span = tracing::info_span!("compute", tenant_id = %args.tenant, timeline_id = %args.timeline);
    let _entered = span.enter();
    let started = Instant::now();
    let safekeepers = match &args.safekeepers {
        None => None,
        Some(_) if args.lsn.is_some() => {
            bail!("cannot use --safekeepers with --lsn: a compute at a past LSN writes no WAL and starts at the LSN given")
        }
        Some(list) => Some(safekeepers::parse_list(list)?),
    };
    if args.replica && safekeepers.is_none() {
        bail!("--replica needs --safekeepers: a read replica streams the branch's committed WAL from them");
    }
    let controller = args.controller.as_deref().map(|url| ControllerClient::new(url, args.client_tls.clone(), args.auth_token.clone()));
    let location = start_location(&args, controller.as_ref())?;
    let pgdata = absolute(&args.pgdata)?;
    let file_cache = file_cache_path(&args, &pgdata)?;
    let mut settings = settings(&args, safekeepers.as_deref(), &file_cache, &location.page_addr)?;
    let user = compute::os_user_name()?;
    let postgres_log = match &args.postgres_log {
        Some(p) => p.clone(),
        None => pgdata.parent().context("the data directory has no parent directory")?.join("postgres.log"),
    };
    if !args.pg_bin_dir.join("postgres").is_file() {
        bail!("cannot find postgres in {} (--pg-bin-dir)", args.pg_bin_dir.display());
    }
    if let Some(path) = &args.status_file {
        remove_if_exists(path)?;
    }

    let created = compute::prepare_pgdata(&pgdata)?;
    let client = pageserver_client(&args, &location.http_url);
    let location: SharedLocation = Arc::new(Mutex::new(location));
    keep_full_page_writes_unless_rebuilt_without(&client, &mut settings);
    let synced = match (&safekeepers, args.lsn) {
        (Some(list), _) if args.replica => follow_safekeepers(&client, &args, list).map(|()| None),
        (_, Some(lsn)) => lease_fixed_lsn(&client, &args, lsn).map(|()| None),
        (None, None) => Ok(None),
        (Some(list), None) => sync_and_follow(&client, &args, list).map(Some),
    };
    let fetched = synced.and_then(|synced| {
        let lsn = synced.as_ref().map_or(args.lsn, |s| s.lsn);
        pageserver::basebackup(&client, args.tenant, args.timeline, lsn, args.replica, &pgdata)
            .context("fetch basebackup")
            .and_then(|backup| compute::set_mode_0700(&pgdata).map(|()| backup))
            .and_then(|backup| pgconf::write_config_files(&pgdata, &settings).map(|()| backup))
            .map(|backup| (synced, backup))
    });
    let (synced, backup) = match fetched {
        Ok(backup) => backup,
        Err(e) => {
            compute::clear_pgdata(&pgdata, created);
            return Err(e);
        }
    };
    let basebackup_ms = started.elapsed().as_millis();
    tracing::info!(bytes = backup.bytes, lsn = ?backup.lsn.map(|l| l.to_string()), "basebackup unpacked in {basebackup_ms} ms");
    // The LSN this compute starts at: the safekeepers' end of WAL, or the pageserver's latest
    // when they have none yet (a new branch).
    let start_lsn = synced.as_ref().and_then(|s| s.lsn).or(backup.lsn).filter(|_| synced.is_some());
    let cache_outcome = reuse_file_cache(&client, &args, &file_cache, start_lsn);

    // From here on a signal must reach postgres, not kill us and orphan it.
    postgres::catch_shutdown_signals()?;
    let start_began = Instant::now();
    let mut postmaster = Postmaster::start(&args.pg_bin_dir, &pgdata, &postgres_log)?;
    let probe_host = probe_host(&args.listen);
    if let Err(e) = postmaster.wait_ready(&probe_host, args.port, Duration::from_secs(args.start_timeout_secs)) {
        postmaster.kill();
        compute::clear_pgdata(&pgdata, created);
        return Err(e);
    }
    let start_ms = start_began.elapsed().as_millis();
    tracing::info!(pid = postmaster.pid(), "postgres accepts connections on {probe_host}:{} after {start_ms} ms", args.port);

    if args.replica {
        tracing::info!(
            "hot standby: replaying the safekeepers' committed WAL from {}",
            backup.lsn.map_or_else(|| "?".to_string(), |l| l.to_string())
        );
    } else if args.lsn.is_none() && safekeepers.is_some() {
        postmaster.checkpoint_before_shutdown(&args.pg_bin_dir, &probe_host, args.port, &user);
        log_running_transactions_soon(&args, &probe_host, &user);
    } else if args.lsn.is_none() {
        if let Err(e) = pageserver::start_wal_receiver(&client, args.tenant, args.timeline, &probe_host, args.port, &user) {
            postmaster.kill();
            compute::clear_pgdata(&pgdata, created);
            return Err(e).context("make the pageserver follow the compute's WAL");
        }
        tracing::info!("the pageserver follows this compute's WAL");
        postmaster.checkpoint_before_shutdown(&args.pg_bin_dir, &probe_host, args.port, &user);
    }

    let report = serde_json::json!({
        "state": "running",
        "pid": std::process::id(),
        "postgres_pid": postmaster.pid(),
        "port": args.port,
        "tenant_id": args.tenant.to_string(),
        "timeline_id": args.timeline.to_string(),
        "lsn": backup.lsn.map(|l| l.to_string()),
        "read_only": args.lsn.is_some() || args.replica,
        "replica": args.replica,
        "basebackup_bytes": backup.bytes,
        "basebackup_ms": basebackup_ms,
        "start_ms": start_ms,
        "safekeepers": safekeepers.as_deref().map(safekeepers::to_setting),
        "sync_lsn": synced.as_ref().and_then(|s| s.lsn).map(|l| l.to_string()),
        "sync_ms": synced.as_ref().map(|s| s.elapsed.as_millis()),
        "file_cache_reused_pages": match cache_outcome { file_cache::Outcome::Reused { reused, .. } => reused, _ => 0 },
        "total_ms": started.elapsed().as_millis(),
    });
    // The status file first: whoever reads the stdout line may look at the file next.
    if let Some(path) = &args.status_file {
        write_atomically(path, &report.to_string())?;
    }
    tracing::info!("compute running: {report}");
    println!("{report}");
    let status_writes = Arc::new(Mutex::new(true));
    if args.replica {
        hold_replay_position(&args, &location, &probe_host, &user, report.clone(), Arc::clone(&status_writes));
    } else if let Some(lsn) = args.lsn {
        keep_lease(&args, &location, fixed_lsn_holder(&args, lsn), "the compute's LSN", move || Ok(lsn));
    }
    if let Some(controller) = controller {
        let follow = wal_source_for_a_new_pageserver(&args, safekeepers.as_deref(), &probe_host, &user);
        let watcher = Watcher {
            controller,
            tenant: args.tenant,
            interval: Duration::from_millis(args.controller_poll_interval_ms),
            location: Arc::clone(&location),
            settings,
            pgdata: pgdata.clone(),
            postmaster_pid: postmaster.pid(),
            client_config: (args.client_tls.clone(), args.auth_token.clone()),
            follow,
        };
        // The thread's lines carry the tenant and timeline, as the rest of compute_ctl's.
        let span = tracing::Span::current();
        if let Err(e) = std::thread::Builder::new().name("controller".into()).spawn(move || span.in_scope(|| watch_controller(watcher))) {
            tracing::error!("could not start the controller watcher: {e}; this compute does not follow its tenant if it moves");
        }
    }

    let status = postmaster.supervise()?;
    tracing::info!("postgres exited: {}", postgres::describe(status));
    // The lease thread writes the status file no more.
    *status_writes.lock().unwrap_or_else(|e| e.into_inner()) = false;
    if let Some(path) = &args.status_file {
        let mut last = report;
        last["state"] = "exited".into();
        last["exit"] = postgres::describe(status).into();
        write_atomically(path, &last.to_string())?;
    }
    Ok(postgres::exit_code(status))
}

/// The client of the pageserver's API at `url` (the current location's), with the token and
/// the cluster CA (an `https://` URL needs --tls-ca).
fn pageserver_client(args: &Args, url: &str) -> Client {
    client_at(url, args.client_tls.clone(), args.auth_token.clone())
}

/// How long telling a new pageserver where this compute's WAL is may take, from the
/// thread that polls the controller.
const FOLLOW_TIMEOUT: Duration = Duration::from_secs(3);

fn client_at(url: &str, tls: Option<tls::ClientTls>, token: Option<String>) -> Client {
    let config = pageserver_api::ClientConfig { tls, ..Default::default() };
    Client::with_config(url, config).with_token(token)
}

/// Where the pageserver is at start: --pageserver-* (or their defaults) without a
/// controller; with one, its answer, or --pageserver-* if it does not answer and both were
/// given.
fn start_location(args: &Args, controller: Option<&ControllerClient>) -> anyhow::Result<Location> {
    let flags = || Location {
        // Without a trailing slash, as the controller's answer is built: the two compare.
        http_url: args.pageserver_http.as_deref().unwrap_or(DEFAULT_PAGESERVER_HTTP).trim_end_matches('/').to_string(),
        page_addr: args.pageserver_pg.clone().unwrap_or_else(|| DEFAULT_PAGESERVER_PG.into()),
        node_id: None,
        generation: None,
    };
    let Some(controller) = controller else { return Ok(flags()) };
    match controller.location(args.tenant) {
        Ok(location) => {
            tracing::info!(
                node_id = location.node_id,
                generation = location.generation,
                "the storage controller places the tenant at page service {}, HTTP {}",
                location.page_addr,
                location.http_url
            );
            Ok(location)
        }
        Err(e) if args.pageserver_http.is_some() && args.pageserver_pg.is_some() => {
            tracing::warn!("{e:#}; starting with --pageserver-http and --pageserver-pg, and following the controller once it answers");
            Ok(flags())
        }
        Err(e) => {
            Err(e).context("ask the storage controller where the tenant is (--controller; or give --pageserver-http and --pageserver-pg)")
        }
    }
}

/// What tells a pageserver the tenant moved to where this compute's WAL is, as at start:
/// the safekeepers (a writer with safekeepers, a replica), the compute itself (a writer
/// without), nothing (a compute at a past LSN). Asking a pageserver that already follows
/// the same source changes nothing there.
type Follow = Box<dyn Fn(&Client) -> anyhow::Result<()> + Send>;

fn wal_source_for_a_new_pageserver(args: &Args, safekeepers: Option<&[Safekeeper]>, host: &str, user: &str) -> Option<Follow> {
    let (tenant, timeline) = (args.tenant, args.timeline);
    match safekeepers {
        _ if args.lsn.is_some() => None,
        Some(list) => {
            let sources: Vec<(String, u16)> = list.iter().map(|s| (s.host.clone(), s.port)).collect();
            Some(Box::new(move |client: &Client| pageserver::start_wal_receiver_from_safekeepers(client, tenant, timeline, &sources)))
        }
        None => {
            let (host, user, port) = (host.to_string(), user.to_string(), args.port);
            Some(Box::new(move |client: &Client| pageserver::start_wal_receiver(client, tenant, timeline, &host, port, &user)))
        }
    }
}

/// What the controller watcher needs.
struct Watcher {
    controller: ControllerClient,
    tenant: TenantId,
    interval: Duration,
    location: SharedLocation,
    /// postgresql.conf as written at start; a move changes its page service address.
    settings: ComputeSettings,
    pgdata: PathBuf,
    postmaster_pid: u32,
    /// The cluster CA and token for a client of the new pageserver.
    client_config: (Option<tls::ClientTls>, Option<String>),
    follow: Option<Follow>,
}

/// Asks the controller where the tenant is every `interval` until postgres shuts down, and
/// moves the compute when the answer names another pageserver: `fjord.pageserver_address`
/// rewritten in postgresql.conf and postgres reloaded (SIGHUP to the postmaster, which
/// passes it to every backend: the extension moves each backend's connection at its next
/// request, a read waiting on the old address included), then compute_ctl's own
/// pageserver client. A controller that does not answer, or answers nonsense, is logged
/// once and changes nothing: the compute serves on from the last location.
fn watch_controller(mut w: Watcher) {
    let mut unanswered: Option<String> = None;
    // The new pageserver has not yet been told where the WAL is.
    let mut follow_pending = false;
    let mut follow_failed = false;
    let mut move_failed: Option<String> = None;
    loop {
        std::thread::sleep(w.interval);
        if compute::postgres::shutting_down() {
            return;
        }
        let new = match w.controller.location(w.tenant) {
            Ok(new) => new,
            Err(e) => {
                if unanswered.is_none() {
                    let last = w.location.lock().unwrap_or_else(|e| e.into_inner()).page_addr.clone();
                    tracing::warn!("{e:#}; keeping page service {last} and asking again every {} ms", w.interval.as_millis());
                }
                unanswered = Some(format!("{e:#}"));
                continue;
            }
        };
        if unanswered.take().is_some() {
            tracing::info!("the storage controller at {} answers again", w.controller.base_url());
        }
        let old = w.location.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if old.moved_to(&new) {
            if let Err(e) = move_postgres(&mut w, &new) {
                // Said once per distinct failure, not at every poll.
                let message = format!("{e:#}");
                if move_failed.as_deref() != Some(message.as_str()) {
                    tracing::error!("could not move postgres to page service {}: {message}; trying again at every poll", new.page_addr);
                    move_failed = Some(message);
                }
                continue;
            }
            move_failed = None;
            tracing::info!(
                generation = new.generation,
                node_id = new.node_id,
                "tenant moved: page service {} -> {}, HTTP {} -> {}; postgres reloaded",
                old.page_addr,
                new.page_addr,
                old.http_url,
                new.http_url
            );
            *w.location.lock().unwrap_or_else(|e| e.into_inner()) = new.clone();
            follow_pending = w.follow.is_some();
            follow_failed = false;
        } else if old.generation != new.generation || old.node_id != new.node_id {
            tracing::info!(generation = new.generation, node_id = new.node_id, "tenant's attachment changed on the same addresses");
            *w.location.lock().unwrap_or_else(|e| e.into_inner()) = new.clone();
        }
        if let (true, Some(follow)) = (follow_pending, &w.follow) {
            // Bounded: this thread is the one that polls, and a pageserver that accepts the
            // call and then hangs must not stop it from following the next move.
            let config = pageserver_api::ClientConfig {
                tls: w.client_config.0.clone(),
                connect_timeout: FOLLOW_TIMEOUT,
                request_timeout: Some(FOLLOW_TIMEOUT),
            };
            let client = Client::with_config(&new.http_url, config).with_token(w.client_config.1.clone());
            match follow(&client) {
                Ok(()) => {
                    tracing::info!("the pageserver at {} follows this compute's WAL", new.http_url);
                    follow_pending = false;
                }
                Err(e) if !follow_failed => {
                    // Right after a failover the controller names the new pageserver before
                    // its attach is done: it does not know the tenant yet (404).
                    let attaching = e.chain().any(|c| c.downcast_ref::<pageserver_api::Error>().and_then(|x| x.status()) == Some(404))
                        || format!("{e:#}").contains("HTTP 404");
                    if attaching {
                        tracing::info!(
                            "the pageserver at {} does not hold the tenant yet (attaching); trying again at the next poll",
                            new.http_url
                        );
                    } else {
                        tracing::warn!(
                            "could not tell the pageserver at {} where this compute's WAL is: {e:#}; trying again at the next poll",
                            new.http_url
                        );
                    }
                    follow_failed = true;
                }
                Err(_) => {}
            }
        }
    }
}

/// Rewrites postgresql.conf with `new`'s page service address (atomically: a reload reads
/// the old file or the new one) and sends SIGHUP to the postmaster.
fn move_postgres(w: &mut Watcher, new: &Location) -> anyhow::Result<()> {
    // `ALTER SYSTEM` writes postgresql.auto.conf, which a reload reads after postgresql.conf:
    // a page service address there would win over the move.
    let auto = w.pgdata.join("postgresql.auto.conf");
    if std::fs::read_to_string(&auto)
        .is_ok_and(|text| text.lines().any(|l| l.trim_start().to_ascii_lowercase().starts_with("fjord.pageserver_address")))
    {
        anyhow::bail!(
            "{} sets fjord.pageserver_address (ALTER SYSTEM), which overrides postgresql.conf: run ALTER SYSTEM RESET fjord.pageserver_address for the compute to follow its tenant",
            auto.display()
        );
    }
    w.settings.pageserver_pg = new.page_addr.clone();
    pgconf::write_postgresql_conf(&w.pgdata, &w.settings)?;
    let pid = libc::pid_t::try_from(w.postmaster_pid).context("the postmaster's pid")?;
    // SAFETY: kill(2) with a pid compute_ctl started and supervises.
    if unsafe { libc::kill(pid, libc::SIGHUP) } != 0 {
        return Err(std::io::Error::last_os_error()).context("send SIGHUP to the postmaster");
    }
    Ok(())
}

/// Syncs the safekeepers and points the pageserver's WAL receiver at them (before the
/// basebackup: a basebackup at the synced LSN waits until the pageserver has that WAL).
fn sync_and_follow(client: &Client, args: &Args, list: &[Safekeeper]) -> anyhow::Result<safekeepers::Synced> {
    let system_id = pageserver::system_id(client, args.tenant, args.timeline).context("get the timeline's system identifier")?;
    let timeout = Duration::from_secs(args.sync_safekeepers_timeout_secs);
    tracing::info!("syncing safekeepers {}", safekeepers::to_setting(list));
    let synced = safekeepers::sync(list, args.tenant, args.timeline, system_id, args.auth_token.clone(), args.client_tls.clone(), timeout)?;
    match synced.lsn {
        Some(lsn) => tracing::info!("safekeepers synced at {lsn} in {} ms", synced.elapsed.as_millis()),
        None => tracing::info!("safekeepers have no WAL for this timeline yet; starting at the pageserver's latest LSN"),
    }
    follow_safekeepers(client, args, list)?;
    Ok(synced)
}

/// A writer's first running-transactions record, logged by a `CHECKPOINT` in the
/// background right after the start: a read replica's basebackup starts at the newest such
/// record on the branch, and without one a new replica would wait for PostgreSQL's next
/// (logged every 15 s while WAL is written). The checkpoint costs little at this point:
/// hardly anything is dirty yet.
fn log_running_transactions_soon(args: &Args, host: &str, user: &str) {
    let (pg_bin_dir, host, user, port) = (args.pg_bin_dir.clone(), host.to_string(), user.to_string(), args.port);
    let spawned = std::thread::Builder::new().name("first-checkpoint".into()).spawn(move || {
        let started = Instant::now();
        match postgres::query_value(&pg_bin_dir, &host, port, &user, "CHECKPOINT") {
            Ok(_) => tracing::info!(
                "checkpoint after start done in {} ms (a running-transactions record for read replicas)",
                started.elapsed().as_millis()
            ),
            Err(e) => {
                tracing::warn!("checkpoint after start failed: {e:#}; read replicas wait for PostgreSQL's next running-transactions record")
            }
        }
    });
    if let Err(e) = spawned {
        tracing::warn!("could not start the checkpoint after start: {e}");
    }
}

/// How often a replica renews its lease on its replay position (`--replica-lease-ttl-secs`
/// says how long a lease lasts without renewal: a replica that stops renewing, stopped or
/// hung, releases its hold on GC after that).
const LEASE_RENEW_INTERVAL: Duration = Duration::from_secs(1);

/// Keeps the pageserver's GC from collecting what this replica reads: every second, a lease
/// on its replay position (the LSN it reads every page at). A refused lease (the replica
/// fell behind the GC horizon, so its reads fail too) is logged as an error once.
fn hold_replay_position(
    args: &Args,
    location: &SharedLocation,
    host: &str,
    user: &str,
    report: serde_json::Value,
    status_writes: Arc<Mutex<bool>>,
) {
    let status_file = args.status_file.clone();
    let port = args.port;
    let (pg_bin_dir, host, user) = (args.pg_bin_dir.clone(), host.to_string(), user.to_string());
    let holder = format!("replica {} at {}:{port} pid {}", args.name, host, std::process::id());
    let session: Mutex<Option<postgres::Session>> = Mutex::new(None);
    keep_lease(args, location, holder, "the replay position", move || {
        let mut session = session.lock().unwrap_or_else(|e| e.into_inner());
        // No new connection to a postgres that is shutting down: it would refuse it.
        anyhow::ensure!(!compute::postgres::shutting_down(), "postgres is shutting down");
        if session.is_none() {
            *session = Some(postgres::Session::open(&pg_bin_dir, &host, port, &user)?);
        }
        let answer = session.as_mut().expect("opened above").query_value("SELECT pg_last_wal_replay_lsn()");
        if answer.is_err() {
            // Opened again at the next renewal (unless postgres is shutting down by then).
            *session = None;
        }
        let text = answer?;
        let lsn = text.parse::<Lsn>().map_err(|e| anyhow::anyhow!("replay LSN {text:?}: {e}"))?;
        // The status file shows where the replica is (`fjord endpoint list`).
        let allowed = status_writes.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(path), true) = (&status_file, *allowed) {
            let mut now = report.clone();
            now["replay_lsn"] = lsn.to_string().into();
            if let Err(e) = write_atomically(path, &now.to_string()) {
                tracing::warn!("could not update the status file: {e:#}");
            }
        }
        Ok(lsn)
    });
}

/// The holder name of a compute at a fixed past LSN's lease.
fn fixed_lsn_holder(args: &Args, lsn: Lsn) -> String {
    format!("endpoint {} at {lsn} port {} pid {}", args.name, args.port, std::process::id())
}

/// A compute at a past LSN (`--lsn`) reads every page at that LSN for as long as it runs:
/// the first lease on it is taken before the basebackup (so GC cannot move past it in
/// between; refused below the GC horizon, with the pageserver's reason), and is renewed
/// every second from then on (`keep_lease`), like a replica's.
fn lease_fixed_lsn(client: &Client, args: &Args, lsn: Lsn) -> anyhow::Result<()> {
    let request = LsnLeaseRequest { holder: fixed_lsn_holder(args, lsn), lsn, ttl_secs: args.replica_lease_ttl_secs };
    client.lsn_lease(args.tenant, args.timeline, &request).with_context(|| format!("lease LSN {lsn} from the pageserver's GC"))?;
    Ok(())
}

/// Renews the lease `holder` every `LEASE_RENEW_INTERVAL` on the LSN `lsn_now` gives, in a
/// thread until postgres is asked to shut down; a failure is logged as an error once (until
/// a renewal succeeds again). Each renewal goes to the pageserver of the current
/// `location` (the tenant may move).
fn keep_lease(
    args: &Args,
    location: &SharedLocation,
    holder: String,
    what: &'static str,
    lsn_now: impl Fn() -> anyhow::Result<Lsn> + Send + 'static,
) {
    let location = Arc::clone(location);
    let (tls, token) = (args.client_tls.clone(), args.auth_token.clone());
    let url_now = move || location.lock().unwrap_or_else(|e| e.into_inner()).http_url.clone();
    let mut client = client_at(&url_now(), tls.clone(), token.clone());
    let ttl_secs = args.replica_lease_ttl_secs;
    let (tenant, timeline) = (args.tenant, args.timeline);
    let spawned = std::thread::Builder::new().name("lease".into()).spawn(move || {
        let mut last_error: Option<String> = None;
        loop {
            let url = url_now();
            if client.base_url() != url.trim_end_matches('/') {
                client = client_at(&url, tls.clone(), token.clone());
            }
            let result = lsn_now().and_then(|lsn| {
                let request = LsnLeaseRequest { holder: holder.clone(), lsn, ttl_secs };
                client.lsn_lease(tenant, timeline, &request).map_err(anyhow::Error::from)
            });
            match result {
                Ok(_) if last_error.is_some() => {
                    tracing::info!("lease on {what} renewed again");
                    last_error = None;
                }
                Ok(_) => {}
                // Postgres is shutting down (so the replay position cannot be read any
                // more): the lease lapses with the compute, nothing to report.
                Err(_) if compute::postgres::shutting_down() => return,
                Err(e) => {
                    let text = format!("{e:#}");
                    if last_error.as_deref() != Some(text.as_str()) {
                        tracing::error!("could not lease {what} from the pageserver's GC: {text}");
                    }
                    last_error = Some(text);
                }
            }
            std::thread::sleep(LEASE_RENEW_INTERVAL);
        }
    });
    if let Err(e) = spawned {
        tracing::error!("could not start the lease thread: {e}; GC does not know this compute's LSN");
    }
}

/// Points the pageserver's WAL receiver at the safekeepers (a replica's reads wait for the
/// pageserver to have the WAL the replica replayed, so it must be following them even
/// when no writer runs).
fn follow_safekeepers(client: &Client, args: &Args, list: &[Safekeeper]) -> anyhow::Result<()> {
    let sources: Vec<(String, u16)> = list.iter().map(|s| (s.host.clone(), s.port)).collect();
    pageserver::start_wal_receiver_from_safekeepers(client, args.tenant, args.timeline, &sources)
        .context("make the pageserver follow the safekeepers")
}

/// The file cache's path: `-c fjord.file_cache_path=` if given (it wins in postgresql.conf),
/// else `--file-cache`, else `file_cache` next to the data directory.
fn file_cache_path(args: &Args, pgdata: &Path) -> anyhow::Result<PathBuf> {
    let overrides = args.settings.iter().map(|s| pgconf::parse_override(s)).collect::<anyhow::Result<Vec<_>>>()?;
    if let Some((_, v)) = overrides.iter().rev().find(|(k, _)| k == "fjord.file_cache_path") {
        return absolute(Path::new(v));
    }
    match &args.file_cache {
        Some(p) => absolute(p),
        None => Ok(pgdata.parent().context("the data directory has no parent directory")?.join("file_cache")),
    }
}

/// Hands the extension what can be reused of the file cache saved at the last clean stop.
/// Only a compute that writes (started at the safekeepers' end of WAL) reuses it; a compute
/// at a past LSN starts empty.
fn reuse_file_cache(client: &Client, args: &Args, cache: &Path, start: Option<Lsn>) -> file_cache::Outcome {
    let outcome = match start {
        Some(start) if args.lsn.is_none() => file_cache::prepare(cache, args.tenant, args.timeline, start, |from, to, entries| {
            pageserver::changed_blocks(client, args.tenant, args.timeline, from, to, entries)
        }),
        _ => {
            let _ = std::fs::remove_file(file_cache::saved_index_path(cache));
            let _ = std::fs::remove_file(file_cache::ready_index_path(cache));
            file_cache::Outcome::NothingSaved
        }
    };
    match &outcome {
        file_cache::Outcome::NothingSaved => tracing::info!("local file cache {}: starts empty (nothing saved)", cache.display()),
        file_cache::Outcome::Discarded(why) => tracing::warn!("local file cache {}: starts empty, the saved one is discarded: {why}", cache.display()),
        file_cache::Outcome::Reused { saved, reused, not_durable, changed, asked_from } => tracing::info!(
            "local file cache {}: reusing {reused} of {saved} saved pages ({not_durable} depend on WAL that was not durable, {changed} changed since; {})",
            cache.display(),
            match (asked_from, start) {
                (Some(from), Some(start)) => format!("asked the pageserver what changed in ({from}, {start}]"),
                _ => "nothing to ask: the start LSN is where the saved pages are known current".to_string(),
            }
        ),
    }
    outcome
}

/// Full-page writes are off on computes (`pgconf`), but only a pageserver that says it
/// rebuilds pages without them may follow such WAL: an older one would store a new
/// visibility-map page's first record as one it cannot replay, and fail every read of that
/// page from then on. Without that answer (an older pageserver, or no answer) they stay
/// on, with a warning; a `-c full_page_writes=...` of the caller's still wins.
fn keep_full_page_writes_unless_rebuilt_without(client: &Client, settings: &mut ComputeSettings) {
    if settings.overrides.iter().any(|(k, _)| k == "full_page_writes") {
        return;
    }
    let why = match client.status() {
        Ok(s) if s.features.iter().any(|f| f == pageserver_api::models::FEATURE_NO_FULL_PAGE_IMAGES) => return,
        Ok(s) => format!("the pageserver (version {}) does not say that it rebuilds pages without them", s.version),
        Err(e) => format!("could not ask the pageserver whether it rebuilds pages without them: {e}"),
    };
    tracing::warn!("full-page writes stay on: {why}");
    settings.overrides.insert(0, ("full_page_writes".into(), "on".into()));
}

fn settings(args: &Args, safekeepers: Option<&[Safekeeper]>, file_cache: &Path, pageserver_pg: &str) -> anyhow::Result<ComputeSettings> {
    let mut overrides = args.settings.iter().map(|s| pgconf::parse_override(s)).collect::<anyhow::Result<Vec<_>>>()?;
    if args.controller.is_some() && overrides.iter().any(|(k, _)| k.eq_ignore_ascii_case("fjord.pageserver_address")) {
        anyhow::bail!(
            "-c fjord.pageserver_address cannot go with --controller: the controller names the page service, and an override would stop the compute from following its tenant when it moves"
        );
    }
    overrides.insert(0, ("fjord.file_cache_path".into(), file_cache.display().to_string()));
    // Absolute: postgres (the extension, and a replica's walreceiver through libpq) reads
    // it with the data directory as its working directory.
    let tls_ca_file = args.client_tls.as_ref().map(|t| absolute(t.ca_path()).map(|p| p.display().to_string())).transpose()?;
    Ok(ComputeSettings {
        listen: args.listen.clone(),
        port: args.port,
        pageserver_pg: pageserver_pg.to_string(),
        tenant_id: args.tenant,
        timeline_id: args.timeline,
        tls_ca_file: tls_ca_file.clone(),
        shared_buffers: args.shared_buffers.clone(),
        static_lsn: args.lsn,
        replica_conninfo: match safekeepers {
            Some(list) if args.replica => {
                let hosts: Vec<(String, u16)> = list.iter().map(|s| (s.host.clone(), s.port)).collect();
                Some(pgconf::replica_conninfo(
                    &hosts,
                    args.tenant,
                    args.timeline,
                    &args.name,
                    args.auth_token.as_deref(),
                    tls_ca_file.as_deref(),
                ))
            }
            _ => None,
        },
        safekeepers: safekeepers.map(safekeepers::to_setting),
        socket_dir: pgconf::socket_dir_for(&absolute(&args.pgdata)?),
        overrides,
    })
}

/// The address to reach postgres at: the first of listen_addresses, or loopback when it
/// listens on every interface.
fn probe_host(listen: &str) -> String {
    match listen.split(',').map(str::trim).next() {
        None | Some("") | Some("*") | Some("0.0.0.0") => "127.0.0.1".to_string(),
        Some("::") => "::1".to_string(),
        Some(h) => h.to_string(),
    }
}

fn absolute(path: &Path) -> anyhow::Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("make {} absolute", path.display()))
}

fn remove_if_exists(path: &Path) -> anyhow::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e).with_context(|| format!("remove {}", path.display())),
        _ => Ok(()),
    }
}

/// Readers of the status file see the old or the new report, never half of one.
fn write_atomically(path: &Path, text: &str) -> anyhow::Result<()> {
    crashsafe::write_file_atomic(path, format!("{text}\n").as_bytes()).with_context(|| format!("write {} atomically", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relative_tls_ca_is_absolute_in_both_settings() {
        // A CA under the working directory, named by a relative path.
        let dir = tempfile::tempdir_in(".").unwrap();
        let ca_dir = dir.path().strip_prefix(std::env::current_dir().unwrap()).unwrap().join("ca");
        tls::ca::Ca::create(&ca_dir).unwrap();
        let ca = ca_dir.join("ca.crt");
        assert!(ca.is_relative(), "{}", ca.display());
        let mut args = Args::try_parse_from([
            "compute_ctl",
            "--pgdata",
            "pgdata",
            "--pg-bin-dir",
            "bin",
            "--tenant",
            "11111111111111111111111111111111",
            "--timeline",
            "22222222222222222222222222222222",
            "--safekeepers",
            "127.0.0.1:5454",
            "--replica",
            "--tls-ca",
            ca.to_str().unwrap(),
        ])
        .unwrap();
        args.client_tls = args.tls.load().unwrap();
        let list = safekeepers::parse_list(args.safekeepers.as_deref().unwrap()).unwrap();
        let s = settings(&args, Some(&list), Path::new("/cache"), "127.0.0.1:64000").unwrap();
        let expected = absolute(&ca).unwrap().display().to_string();
        assert_eq!(s.tls_ca_file.as_deref(), Some(expected.as_str()));
        let conninfo = s.replica_conninfo.unwrap();
        assert!(conninfo.ends_with(&format!("sslrootcert='{expected}'")), "{conninfo}");
    }
}
