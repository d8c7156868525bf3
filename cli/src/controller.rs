//! The storage controller of a repo with several pageservers (`fjord init --pageservers N`,
//! N >= 2), and the small PostgreSQL it keeps its placements in: `init` makes that
//! database (`controller_db/`) unless `--controller-database` names another, `start` runs
//! both before the safekeepers and the pageservers, `stop` stops them after the computes.
//!
//! The controller is the authority on where each tenant is attached; the CLI asks it
//! (`GET /v1/tenant/{id}`) before every call that concerns one tenant, so that a tenant
//! failed over to another pageserver is found there.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use pageserver_api::controller::{NodeInfo, TenantLocation};

use crate::process::http_up;
use crate::repo::Repo;

/// The controller's certificate's name (`tls/storage-controller.crt`).
pub const CERT_NAME: &str = "storage-controller";

/// How long `start` waits for the controller to lead and for each pageserver to be online.
const READY_WAIT: Duration = Duration::from_secs(30);

/// Makes the controller's database at `init`: an initdb'd data directory whose
/// postgresql.conf listens on the repo's host and port only (no Unix socket: the repo's
/// path may be too long for one), trust authentication for the os user on loopback.
pub fn init_database(pg_bin_dir: &Path, dir: &Path, port: u16, host: &str, user: &str) -> anyhow::Result<()> {
    let initdb = pg_bin_dir.join("initdb");
    let out = Command::new(&initdb)
        .arg("-D")
        .arg(dir)
        .args(["-U", user, "--no-instructions", "--encoding=UTF8", "--locale=C", "--auth=trust"])
        .output()
        .with_context(|| format!("could not run {}", initdb.display()))?;
    if !out.status.success() {
        bail!(
            "initdb of the controller's database failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let conf = dir.join("postgresql.conf");
    let mut text = std::fs::read_to_string(&conf).with_context(|| format!("read {}", conf.display()))?;
    text.push_str(&format!(
        "\n# written by `fjord init`: the storage controller's database\n\
         listen_addresses = '{host}'\nport = {port}\nunix_socket_directories = ''\n\
         max_connections = 20\nshared_buffers = 16MB\n"
    ));
    crate::state::write_atomically(&conf, text.as_bytes())
}

/// Starts the repo's own controller database unless it runs (or the repo uses another).
pub fn start_database(repo: &Repo) -> anyhow::Result<()> {
    if !repo.config.runs_controller_db() {
        return Ok(());
    }
    let daemon = repo.controller_db();
    if let Some(pid) = daemon.running_pid()? {
        say!("controller database already running (pid {pid})");
        return Ok(());
    }
    let conf = &repo.config;
    let port = conf.controller_db_port();
    let addr: std::net::SocketAddr = format!("{}:{port}", conf.service_host()).parse().context("the repo's service host")?;
    if std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok() {
        bail!("something else already listens on port {port}: is another repo using base port {}?", conf.base_port);
    }
    let postgres = conf.pg_bin_dir.join("postgres");
    let mut cmd = Command::new(&postgres);
    cmd.arg("-D").arg(repo.controller_db_dir()).current_dir(&repo.dir);
    let child =
        crate::process::spawn_and_wait(&daemon, &mut cmd, "the controller's database", &format!("port {port}"), || postmaster_ready(repo))?;
    say!("controller database started (pid {}): port {port}, log {}", child.id(), daemon.log_file.display());
    Ok(())
}

/// Whether the database's postmaster that `daemon` started accepts connections: what it
/// says in its `postmaster.pid` (the pid on the first line, `ready` on the eighth), as
/// `pg_ctl -w` reads it. A probe by connection would leave a FATAL line in its log
/// ("the database system is starting up") for every attempt that comes too early.
fn postmaster_ready(repo: &Repo) -> bool {
    let Ok(Some(pid)) = repo.controller_db().running_pid() else { return false };
    let Ok(text) = std::fs::read_to_string(repo.controller_db_dir().join("postmaster.pid")) else { return false };
    let lines: Vec<&str> = text.lines().collect();
    lines.first().is_some_and(|l| l.trim() == pid.to_string()) && lines.get(7).is_some_and(|l| l.trim() == "ready")
}

/// Starts the storage controller unless it runs, and waits until it leads.
pub fn start_controller(repo: &Repo) -> anyhow::Result<()> {
    let conf = &repo.config;
    let daemon = repo.controller();
    let url = conf.controller_url();
    let tls = repo.client_tls()?;
    if let Some(pid) = daemon.running_pid()? {
        say!("storage controller already running (pid {pid})");
        return Ok(());
    }
    if crate::process::http_answers(&url, tls.as_ref()) {
        bail!("something else already answers on {url}: is another repo using base port {}?", conf.base_port);
    }
    let database = conf.controller_database(&crate::process::os_user_name()?).context("the repo has no storage controller")?;
    let mut cmd = Command::new(conf.controller_bin());
    cmd.arg("--database")
        .arg(&database)
        .args(["--listen", &conf.controller_addr(), "--advertise", &conf.controller_addr()])
        .current_dir(&repo.dir);
    // Its own token (an admin's) for the pageservers' APIs: heartbeats and orders.
    repo.with_auth(&mut cmd, &auth::Claims::admin());
    if repo.admin_token().is_none() {
        cmd.env_remove(auth::TOKEN_ENV);
    }
    // It calls the pageservers: it gets the CA.
    cmd.args(repo.server_tls_args(CERT_NAME, true));
    if std::env::var_os("RUST_LOG").is_none() {
        // The database's notices are not the controller's own words.
        cmd.env("RUST_LOG", "info,tokio_postgres::connection=warn");
    }
    let child = crate::process::spawn_and_wait(&daemon, &mut cmd, "the storage controller", &url, || http_up(&url, tls.as_ref()))?;
    let api = repo.controller_api();
    let deadline = Instant::now() + READY_WAIT;
    loop {
        match api.status() {
            Ok(s) if s.leader => break,
            Ok(s) if Instant::now() > deadline => bail!(
                "the storage controller did not take the lead within {} s (its database: {}); the end of {}:\n{}",
                READY_WAIT.as_secs(),
                s.database,
                daemon.log_file.display(),
                logtail::log_tail(&daemon.log_file, 20)
            ),
            Err(e) if Instant::now() > deadline => {
                bail!(
                    "the storage controller stopped answering ({e}); the end of {}:\n{}",
                    daemon.log_file.display(),
                    logtail::log_tail(&daemon.log_file, 20)
                )
            }
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    say!("storage controller started (pid {}): HTTP API {url}, leading, log {}", child.id(), daemon.log_file.display());
    Ok(())
}

/// Waits until the controller has seen pageservers `ids` online (joined and answering its
/// heartbeats): only then does it place tenants and secondaries on them.
pub fn wait_online(repo: &Repo, ids: &[u64]) -> anyhow::Result<()> {
    let api = repo.controller_api();
    let deadline = Instant::now() + READY_WAIT;
    loop {
        let nodes = api.nodes().map_err(|e| anyhow::anyhow!("ask the storage controller for its pageservers: {e}"))?;
        let offline: Vec<u64> = ids
            .iter()
            .copied()
            .filter(|id| !nodes.iter().any(|n| n.node_id == *id && n.availability == pageserver_api::controller::Availability::Online))
            .collect();
        if offline.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = offline.iter().map(|id| repo.pageserver(*id).log_file.display().to_string()).collect();
            bail!(
                "the storage controller does not see pageserver(s) {} online within {} s; see {} and {}",
                offline.iter().map(u64::to_string).collect::<Vec<_>>().join(", "),
                READY_WAIT.as_secs(),
                logs.join(", "),
                repo.controller().log_file.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Stops the controller, then its database (the controller first: it would only log that
/// its database went away).
pub fn stop(repo: &Repo, timeout: Duration) -> anyhow::Result<()> {
    if !repo.config.has_controller() {
        return Ok(());
    }
    if repo.controller().stop(libc::SIGTERM, timeout)? {
        say!("storage controller stopped");
    }
    // SIGINT: PostgreSQL's fast shutdown (SIGTERM's smart one would wait for clients).
    if repo.config.runs_controller_db() && repo.controller_db().stop(libc::SIGINT, timeout)? {
        say!("controller database stopped");
    }
    Ok(())
}

/// `fjord status` with a controller: the controller, then each pageserver with its health
/// (as the leader sees it) and the tenants it holds attached and as secondary.
pub fn print_status(repo: &Repo) -> anyhow::Result<()> {
    let conf = &repo.config;
    let api = repo.controller_api();
    let pid = repo.controller().running_pid()?;
    if conf.runs_controller_db() {
        match repo.controller_db().running_pid()? {
            Some(pid) => say!("controller database  running (pid {pid}), port {}", conf.controller_db_port()),
            None => say!("controller database  stopped"),
        }
    } else {
        say!("controller database  external (config.toml)");
    }
    let status = api.status();
    match (pid, &status) {
        (Some(pid), Ok(s)) => say!(
            "storage controller   running (pid {pid}), HTTP API {}, {}, database {}",
            conf.controller_url(),
            if s.leader {
                "leading".to_string()
            } else {
                format!("not leading (leader: {})", s.leader_address.as_deref().unwrap_or("none"))
            },
            s.database
        ),
        (Some(pid), Err(_)) => say!("storage controller   not answering (pid {pid}), HTTP API {}", conf.controller_url()),
        (None, Ok(_)) => say!("storage controller   answering on {} but not started by this repo", conf.controller_url()),
        (None, Err(_)) => say!("storage controller   stopped"),
    }
    let (nodes, tenants): (Vec<NodeInfo>, Vec<TenantLocation>) = match (api.nodes(), api.tenants()) {
        (Ok(n), Ok(t)) => (n, t),
        (Err(e), _) | (_, Err(e)) => {
            for id in conf.pageserver_ids() {
                let process = match repo.pageserver(id).running_pid()? {
                    Some(pid) => format!("running (pid {pid})"),
                    None => "stopped".to_string(),
                };
                say!("pageserver {id}  {process}, page service {}, HTTP API {}", conf.pageserver_pg_addr(id), conf.pageserver_http_url(id));
            }
            tracing::info!("the storage controller does not answer: {e}");
            say!("health and placement unknown: the storage controller does not answer at {}", conf.controller_url());
            return Ok(());
        }
    };
    for id in conf.pageserver_ids() {
        let process = match repo.pageserver(id).running_pid()? {
            Some(pid) => format!("running (pid {pid})"),
            None => "stopped".to_string(),
        };
        let Some(node) = nodes.iter().find(|n| n.node_id == id) else {
            say!(
                "pageserver {id}  {process}, page service {}, HTTP API {}, not known to the controller",
                conf.pageserver_pg_addr(id),
                conf.pageserver_http_url(id)
            );
            continue;
        };
        let health = match node.availability {
            pageserver_api::controller::Availability::Online => "online",
            pageserver_api::controller::Availability::Offline => "OFFLINE",
            pageserver_api::controller::Availability::Unknown => "health unknown",
        };
        let list = |ids: Vec<String>| if ids.is_empty() { "none".to_string() } else { ids.join(", ") };
        let attached = list(
            tenants.iter().filter(|t| t.attached.node_id == id).map(|t| format!("{} (generation {})", t.tenant_id, t.generation)).collect(),
        );
        let secondary = list(
            tenants.iter().filter(|t| t.secondary.as_ref().is_some_and(|s| s.node_id == id)).map(|t| t.tenant_id.to_string()).collect(),
        );
        say!(
            "pageserver {id}  {process}, {health}, page service {}, HTTP API {}; attached: {attached}; secondary: {secondary}",
            node.page_addr,
            conf.http_url_of(&node.http_addr)
        );
    }
    Ok(())
}
