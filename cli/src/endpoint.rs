//! `fjord endpoint ...`: computes on a branch, each a `compute_ctl` in the background.
//!
//! An endpoint keeps its name, branch and port across restarts, nothing else: its data
//! directory is removed and refetched from the pageserver at every start, because a compute
//! is stateless. compute_ctl reports readiness through its status file
//! (`endpoints/<name>/status.json`), which the CLI waits for.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use pageserver_api::models::{WalReceiverRequest, WalSource};
use proto::TenantId;

use crate::config::first_free_port;
use crate::point::Point;
use crate::process::{remove_file_if_exists, Daemon};
use crate::repo::Repo;
use crate::state::{check_name, EndpointState, State};
use crate::tenant::MAIN_BRANCH;
use logtail::log_tail;

/// How long `--at LSN` waits for the pageserver to ingest up to the LSN before it is called
/// past the branch's end.
const INGEST_WAIT: Duration = Duration::from_secs(2);

#[derive(clap::Args, Debug)]
pub struct StartArgs {
    /// Endpoint name.
    name: String,
    /// Branch to run on [default: the endpoint's branch from its last start, else main].
    #[arg(long)]
    branch: Option<String>,
    /// Port [default: the endpoint's port from its last start, else the first free one from
    /// base port + 10].
    #[arg(long)]
    port: Option<u16>,
    /// Start read-only at a past point of the branch: an LSN (X/X) or a time (RFC 3339,
    /// such as 2026-11-24T10:30:00Z: exactly the transactions committed by then).
    #[arg(long, alias = "lsn", value_name = "LSN|TIME")]
    at: Option<Point>,
    /// Start a read replica: a hot standby that follows the branch's committed WAL from the
    /// safekeepers and reads pages from the pageserver at its replay position. Any number
    /// run beside the branch's writer (or without one); they accept only reads.
    #[arg(long, conflicts_with = "at")]
    replica: bool,
    /// Tenant [default: the default tenant].
    #[arg(long)]
    tenant: Option<TenantId>,
    /// Extra postgresql.conf setting for the compute; repeatable.
    #[arg(short = 'c', value_name = "NAME=VALUE")]
    settings: Vec<String>,
    /// Seconds to wait for the compute to accept connections.
    #[arg(long, default_value_t = 120)]
    start_timeout_secs: u64,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopMode {
    /// Roll back sessions, checkpoint, exit (SIGTERM to compute_ctl).
    Fast,
    /// Exit at once (SIGQUIT to compute_ctl).
    Immediate,
}

pub fn connection_string(user: &str, port: u16) -> String {
    format!("postgresql://{user}@127.0.0.1:{port}/postgres")
}

pub fn start(repo: &Repo, args: StartArgs) -> anyhow::Result<()> {
    check_name("endpoint", &args.name)?;
    crate::process::refuse_root("start an endpoint")?;
    // Without a controller the one pageserver must run, whatever the tenant; with one,
    // the tenant's attached pageserver must (below).
    let early = if repo.config.has_controller() { None } else { Some(repo.running_api()?) };
    let _lock = repo.lock()?;
    let mut state = repo.load_state()?;
    let name = args.name.as_str();
    let daemon = repo.endpoint(name);
    if let Some(pid) = daemon.running_pid()? {
        bail!("endpoint {name} is already running (compute_ctl pid {pid}); stop it first");
    }
    let previous = state.endpoints.get(name).cloned();
    let tenant = match (args.tenant, &previous) {
        (Some(t), _) => t,
        (None, Some(p)) => p.tenant_id.parse().context("tenant id of the endpoint in the repo state")?,
        (None, None) => state.tenant(None)?,
    };
    let branch = args.branch.clone().or_else(|| previous.as_ref().map(|p| p.branch.clone())).unwrap_or_else(|| MAIN_BRANCH.to_string());
    let timeline = state.branch_timeline(tenant, &branch)?;
    let api = match early {
        Some(api) => api,
        None => repo.tenant_api(tenant)?,
    };
    let span = tracing::info_span!("endpoint", name, tenant_id = %tenant, timeline_id = %timeline);
    let _entered = span.enter();

    // Two writers on one branch: with safekeepers the second would fence the first off (its
    // commits stop); without, their WAL would fork. Either way the CLI refuses.
    if args.at.is_none() && !args.replica {
        for (other, ep) in &state.endpoints {
            if other != name && ep.is_writer() && ep.timeline_id == timeline.to_string() && repo.endpoint(other).running_pid()?.is_some() {
                bail!("endpoint {other} already writes to branch {branch}; stop it first (two writers on one branch would diverge), or start this one read-only with --replica or --at LSN|TIME");
            }
        }
    }
    if args.replica && repo.config.safekeepers == 0 {
        bail!("a read replica follows the branch's WAL on the safekeepers, and this repo has none (fjord init --safekeepers N)");
    }
    let at = match args.at {
        None => None,
        Some(point) => {
            let lsn = crate::point::resolve(&api, tenant, timeline, &branch, point)?;
            // WAL a compute has just committed reaches the pageserver a moment later (and
            // later still right after the timeline's first compute started, while the WAL
            // receiver waits out a round of sources that had no WAL yet): an LSN just read
            // from a compute is given that moment before it is called past the end.
            let deadline = Instant::now() + INGEST_WAIT;
            let last = loop {
                let last = api.timeline(tenant, timeline)?.last_record_lsn;
                if lsn <= last || Instant::now() >= deadline {
                    break last;
                }
                std::thread::sleep(Duration::from_millis(10));
            };
            if lsn > last {
                bail!("cannot start at {lsn}: branch {branch} ends at {last}");
            }
            Some(lsn)
        }
    };
    let port = choose_port(repo, &state, name, args.port, previous.as_ref().map(|p| p.port))?;

    let dir = repo.endpoint_dir(name);
    let pgdata = dir.join("pgdata");
    let status_file = dir.join("status.json");
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    if pgdata.exists() {
        std::fs::remove_dir_all(&pgdata).with_context(|| format!("remove the old data directory {}", pgdata.display()))?;
    }
    remove_file_if_exists(&status_file)?;

    let conf = &repo.config;
    if conf.safekeepers == 0 && at.is_none() && !args.replica {
        // Without safekeepers the pageserver follows the compute's own walsender. Sources
        // are an admin's to set: compute_ctl's token may only restart registered ones.
        let source = WalSource { host: conf.service_host().into(), port, user: crate::process::os_user_name()?, plaintext: true };
        api.start_wal_receiver(tenant, timeline, &WalReceiverRequest::Single(source))
            .context("register the compute as the branch's WAL source on the pageserver")?;
    }
    // The page service of the pageserver serving the tenant; with a controller, compute_ctl
    // asks it again at start and follows the tenant when it moves (a failover, a
    // migration), without a restart.
    let page_addr = match conf.has_controller() {
        true => repo.locate(tenant)?.page_service().page_addr.clone(),
        false => conf.pageserver_pg_addr(1),
    };
    let mut cmd = Command::new(conf.compute_ctl_bin());
    cmd.arg("--pgdata")
        .arg(&pgdata)
        .arg("--pg-bin-dir")
        .arg(&conf.pg_bin_dir)
        .args(["--pageserver-http", api.base_url(), "--pageserver-pg", &page_addr])
        .args(["--tenant", &tenant.to_string(), "--timeline", &timeline.to_string(), "--port", &port.to_string()])
        .arg("--postgres-log")
        .arg(dir.join("postgres.log"))
        .arg("--status-file")
        .arg(&status_file)
        .args(["--start-timeout-secs", &args.start_timeout_secs.to_string()])
        .current_dir(&dir);
    if let Some(lsn) = at {
        cmd.args(["--lsn", &lsn.to_string()]);
    } else if conf.safekeepers > 0 {
        cmd.args(["--safekeepers", &conf.safekeepers_list()]);
    }
    // The name goes with the compute's lease (a replica's or an --at compute's) and a
    // replica's application_name.
    cmd.args(["--name", name]);
    if conf.has_controller() {
        cmd.args(["--controller", &conf.controller_url()]);
    }
    if args.replica {
        cmd.arg("--replica");
    }
    for s in &args.settings {
        cmd.arg("-c").arg(s);
    }
    cmd.args(repo.client_tls_args("compute_ctl"));
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "info");
    }
    // The compute's token grants its own timeline only.
    if let Some(token) = repo.token(&auth::Claims::tenant(tenant).with_timeline(timeline)) {
        cmd.env(auth::TOKEN_ENV, token);
    }
    tracing::info!("starting compute_ctl on port {port}");
    let mut child = daemon.spawn(&mut cmd)?;
    state.endpoints.insert(
        name.to_string(),
        EndpointState {
            tenant_id: tenant.to_string(),
            branch: branch.clone(),
            timeline_id: timeline.to_string(),
            port,
            lsn: at.map(|l| l.to_string()),
            replica: args.replica,
        },
    );
    repo.save_state(&state)?;

    let report = match wait_ready(&daemon, &mut child, &status_file, name, args.start_timeout_secs) {
        Ok(report) => report,
        Err(e) => {
            // A failed start leaves the endpoint as it was: unknown, or with its old record.
            match previous {
                Some(p) => state.endpoints.insert(name.to_string(), p),
                None => state.endpoints.remove(name),
            };
            repo.save_state(&state)?;
            return Err(e);
        }
    };
    // compute_ctl said so; one connection attempt confirms what a client will see.
    std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(5))
        .with_context(|| format!("endpoint {name} reported ready but does not accept connections on port {port}"))?;
    eprintln!(
        "endpoint {name} running on branch {branch}{} (port {port}, LSN {}, basebackup {} ms, total {} ms)",
        match (at, args.replica) {
            (Some(l), _) => format!(" read-only at {l}"),
            (None, true) => " as a read replica".to_string(),
            (None, false) => String::new(),
        },
        report["lsn"].as_str().unwrap_or("?"),
        report["basebackup_ms"],
        report["total_ms"]
    );
    say!("{}", connection_string(&crate::process::os_user_name()?, port));
    Ok(())
}

/// Waits until compute_ctl's status file says "running"; fails with the end of its log if it
/// exits first or takes too long.
fn wait_ready(
    daemon: &Daemon,
    child: &mut Child,
    status_file: &Path,
    name: &str,
    start_timeout_secs: u64,
) -> anyhow::Result<serde_json::Value> {
    // compute_ctl has its own startup timeout; ours covers the basebackup too.
    let deadline = Instant::now() + Duration::from_secs(start_timeout_secs + 60);
    loop {
        if let Some(status) = child.try_wait().context("wait for compute_ctl")? {
            remove_file_if_exists(&daemon.pid_file)?;
            bail!(
                "endpoint {name} failed to start (compute_ctl {status}); the end of {}:\n{}",
                daemon.log_file.display(),
                log_tail(&daemon.log_file, 30)
            );
        }
        if let Ok(text) = std::fs::read_to_string(status_file) {
            let report: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("parse {}", status_file.display()))?;
            if report["state"] == "running" {
                return Ok(report);
            }
        }
        if Instant::now() > deadline {
            daemon.stop(libc::SIGQUIT, Duration::from_secs(10))?;
            bail!(
                "endpoint {name} was not ready within {} s; the end of {}:\n{}",
                start_timeout_secs + 60,
                daemon.log_file.display(),
                log_tail(&daemon.log_file, 30)
            );
        }
        // compute_ctl writes the file once, when postgres accepts connections: look often,
        // since every millisecond here is start time the user sees.
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `--port`, else the endpoint's previous port, else the first endpoint port that no other
/// endpoint of the repo has and nothing listens on.
fn choose_port(repo: &Repo, state: &State, name: &str, given: Option<u16>, previous: Option<u16>) -> anyhow::Result<u16> {
    let taken_by = |port: u16| state.endpoints.iter().find(|(n, e)| n.as_str() != name && e.port == port).map(|(n, _)| n.clone());
    let free_now = |port: u16| TcpListener::bind(("127.0.0.1", port)).is_ok();
    if let Some(port) = given.or(previous) {
        if let Some(other) = taken_by(port) {
            bail!("port {port} belongs to endpoint {other}");
        }
        if !free_now(port) {
            bail!("port {port} is in use by another program; pass --port to choose another");
        }
        return Ok(port);
    }
    let mut taken: Vec<u16> = state.endpoints.iter().filter(|(n, _)| n.as_str() != name).map(|(_, e)| e.port).collect();
    loop {
        let port = first_free_port(repo.config.endpoint_ports(), &taken)?;
        if free_now(port) {
            return Ok(port);
        }
        taken.push(port);
    }
}

pub fn stop(repo: &Repo, name: &str, mode: StopMode) -> anyhow::Result<()> {
    let _lock = repo.lock()?;
    let state = repo.load_state()?;
    if !state.endpoints.contains_key(name) {
        bail!("endpoint {name:?} does not exist");
    }
    let signal = match mode {
        StopMode::Fast => libc::SIGTERM,
        StopMode::Immediate => libc::SIGQUIT,
    };
    if repo.endpoint(name).stop(signal, Duration::from_secs(60))? {
        discard_pgdata(repo, name);
        say!("endpoint {name} stopped");
    } else {
        say!("endpoint {name} was not running");
    }
    Ok(())
}

/// Removes a stopped endpoint's data directory: the next start fetches a fresh basebackup
/// anyway, and removing it here keeps that work (hundreds of milliseconds for a `pg_wal`
/// of recycled segments) off the next start's path. Its logs and its file cache live
/// beside it, not in it. A failure is only logged: `endpoint start` removes what is left.
pub fn discard_pgdata(repo: &Repo, name: &str) {
    let pgdata = repo.endpoint_dir(name).join("pgdata");
    if let Err(e) = std::fs::remove_dir_all(&pgdata) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!("could not remove {}: {e}", pgdata.display());
        }
    }
}

pub fn list(repo: &Repo) -> anyhow::Result<()> {
    print_table(repo, &repo.load_state()?)
}

/// The endpoint table of `list` and `status`.
pub fn print_table(repo: &Repo, state: &State) -> anyhow::Result<()> {
    if state.endpoints.is_empty() {
        say!("no endpoints");
        return Ok(());
    }
    say!("{:<16} {:<12} {:<6} {:<12} {:<24} TENANT", "ENDPOINT", "BRANCH", "PORT", "LSN", "STATUS");
    for (name, ep) in &state.endpoints {
        let running = repo.endpoint(name).running_pid()?;
        let status = match running {
            Some(pid) if ep.replica => format!("running (pid {pid}){}", replica_lag(repo, name, ep)),
            Some(pid) => format!("running (pid {pid})"),
            None => "stopped".to_string(),
        };
        let lsn = match ep.lsn()? {
            Some(l) => format!("at {l}"),
            None if ep.replica => "replica".into(),
            None => "latest".into(),
        };
        say!("{name:<16} {:<12} {:<6} {lsn:<12} {status:<24} {}", ep.branch, ep.port, ep.tenant_id);
    }
    Ok(())
}

/// A running replica's position: what it replayed (from compute_ctl's status file, updated
/// every second) and how far that is behind what the pageserver has ingested of the
/// branch; empty when either is unknown.
fn replica_lag(repo: &Repo, name: &str, ep: &EndpointState) -> String {
    let status_file = repo.endpoint_dir(name).join("status.json");
    let replayed = std::fs::read_to_string(&status_file)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["replay_lsn"].as_str().and_then(|l| l.parse::<proto::Lsn>().ok()));
    let Some(replayed) = replayed else { return String::new() };
    let latest = ep
        .tenant_id
        .parse()
        .ok()
        .zip(ep.timeline_id.parse().ok())
        .and_then(|(t, tl)| {
            // The tenant's pageserver: with a controller, the one it is attached to now.
            let api = if repo.config.has_controller() { repo.tenant_api(t).ok()? } else { repo.api() };
            api.timeline(t, tl).ok()
        })
        .map(|info| info.last_record_lsn);
    match latest {
        Some(latest) => format!(", replayed {replayed}, {} bytes behind", latest.0.saturating_sub(replayed.0)),
        None => format!(", replayed {replayed}"),
    }
}

pub fn connstr(repo: &Repo, name: &str) -> anyhow::Result<()> {
    let state = repo.load_state()?;
    let ep = state.endpoints.get(name).with_context(|| format!("endpoint {name:?} does not exist"))?;
    say!("{}", connection_string(&crate::process::os_user_name()?, ep.port));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_strings_point_at_loopback() {
        assert_eq!(connection_string("fjord", 15010), "postgresql://fjord@127.0.0.1:15010/postgres");
    }
}
