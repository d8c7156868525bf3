//! The repo's pageservers: starting one (`fjord start`, `fjord pageserver start ID`),
//! stopping one, and adding one to a repo with a storage controller (`fjord pageserver
//! add`).
//!
//! Pageserver 1 is the repo's only pageserver unless `init --pageservers N` said more; it
//! keeps its work directory, ports, log and certificate in every repo. With a controller
//! each pageserver joins it as its node id (`--controller`, `--node-id`, its advertised
//! addresses) with its own token, and holds only what the controller places on it.

use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context};

use crate::process::refuse_root;
use crate::repo::Repo;

/// The optional file of further pageserver settings in a repo.
pub const PAGESERVER_TOML: &str = "pageserver.toml";

/// A pageserver's certificate's name: `pageserver` for the first (as in a repo with one),
/// `pageserver-N` for the others.
pub fn cert_name(id: u64) -> String {
    match id {
        1 => "pageserver".to_string(),
        n => format!("pageserver-{n}"),
    }
}

/// The name a message gives pageserver `id`: "the pageserver" in a repo with one.
fn what(repo: &Repo, id: u64) -> String {
    if repo.config.has_controller() {
        format!("pageserver {id}")
    } else {
        "the pageserver".to_string()
    }
}

pub fn check_id(repo: &Repo, id: u64) -> anyhow::Result<()> {
    if !repo.config.pageserver_ids().contains(&id) {
        bail!("no pageserver {id}: this repo has {} (ids 1..={0})", repo.config.pageservers);
    }
    Ok(())
}

/// Starts pageserver `id` unless it runs; whether this call started it.
pub fn start(repo: &Repo, id: u64) -> anyhow::Result<bool> {
    check_id(repo, id)?;
    let daemon = repo.pageserver(id);
    let name = what(repo, id);
    if let Some(pid) = daemon.running_pid()? {
        say!("{name} already running (pid {pid})");
        return Ok(false);
    }
    let conf = &repo.config;
    let url = conf.pageserver_http_url(id);
    if crate::process::http_answers(&url, repo.client_tls()?.as_ref()) {
        bail!("something else already answers on {url}: is another repo using base port {}?", conf.base_port);
    }
    let workdir = repo.pageserver_workdir(id);
    std::fs::create_dir_all(&workdir).with_context(|| format!("create {}", workdir.display()))?;
    let mut cmd = Command::new(conf.pageserver_bin());
    cmd.arg("--workdir")
        .arg(&workdir)
        .arg("--listen-pg")
        .arg(conf.pageserver_pg_addr(id))
        .arg("--listen-http")
        .arg(conf.pageserver_http_addr(id))
        .arg("--pg-bin-dir")
        .arg(&conf.pg_bin_dir)
        .current_dir(&repo.dir);
    if let Some(url) = &conf.remote_storage {
        cmd.arg("--remote-storage").arg(url);
    }
    if let Some(budget) = conf.layer_disk_budget_bytes {
        cmd.arg("--layer-disk-budget-bytes").arg(budget.to_string());
    }
    // Never a token inherited from the caller's environment (an operator's admin token for
    // curl).
    cmd.env_remove(auth::TOKEN_ENV);
    if repo.admin_token().is_some() {
        cmd.arg("--auth-public-key").arg(repo.public_key_path());
    }
    if conf.has_controller() {
        // It joins the controller as node `id`, at the addresses it listens on (every
        // service of a repo is on one host), presenting its own token: a storage token
        // naming the node, which is also what it shows safekeepers it finds named in a
        // timeline's remote index after a failover.
        cmd.args(["--controller", &conf.controller_url(), "--node-id", &id.to_string()]).args([
            "--advertise-pg",
            &conf.pageserver_pg_addr(id),
            "--advertise-http",
            &conf.pageserver_http_addr(id),
        ]);
        if let Some(token) = repo.token(&auth::Claims::pageserver(id)) {
            cmd.env(auth::TOKEN_ENV, token);
        }
    }
    // Without a controller it has no token of its own: each timeline's WAL sources come
    // with a storage token for that timeline (`register_wal_sources`).
    // The pageserver is a client of the safekeepers (and of the controller) too: it gets
    // the CA.
    cmd.args(repo.server_tls_args(&cert_name(id), true));
    // Further pageserver settings (`pageserver --print-config` lists them) go in
    // pageserver.toml in the repo, for every pageserver; the flags above win over it.
    let extra = repo.dir.join(PAGESERVER_TOML);
    if extra.is_file() {
        cmd.arg("--config").arg(&extra);
    }
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "info");
    }
    tracing::info!("starting {} as {name}", conf.pageserver_bin().display());
    let api = repo.api_of(id);
    let child = crate::process::spawn_and_wait(&daemon, &mut cmd, &name, &url, || crate::repo::is_up(&api))?;
    say!(
        "{name} started (pid {}): page service {}, HTTP API {url}, log {}",
        child.id(),
        conf.pageserver_pg_addr(id),
        daemon.log_file.display()
    );
    Ok(true)
}

/// `fjord pageserver start ID`: starts it and, with a controller that runs, waits until the
/// controller sees it online.
pub fn start_command(repo: &Repo, id: u64) -> anyhow::Result<()> {
    refuse_root("start a pageserver")?;
    check_id(repo, id)?;
    let _lock = repo.lock()?;
    let started = start(repo, id)?;
    if started && repo.config.has_controller() && repo.controller().running_pid()?.is_some() {
        crate::controller::wait_online(repo, &[id])?;
        say!("pageserver {id} is online at the storage controller");
    }
    Ok(())
}

/// `fjord pageserver stop ID`: SIGTERM (clean) or, with `immediate`, SIGKILL (a crash: with
/// a controller its tenants fail over to their secondaries).
pub fn stop_command(repo: &Repo, id: u64, immediate: bool, timeout: Duration) -> anyhow::Result<()> {
    check_id(repo, id)?;
    let _lock = repo.lock()?;
    let signal = if immediate { libc::SIGKILL } else { libc::SIGTERM };
    let name = what(repo, id);
    if repo.pageserver(id).stop(signal, timeout)? {
        say!("{name} {}", if immediate { "killed" } else { "stopped" });
    } else {
        say!("{name} was not running");
    }
    Ok(())
}

/// `fjord pageserver add`: the next node id, its certificate, its directory, recorded in
/// config.toml, started and joined to the controller.
pub fn add(repo: &mut Repo) -> anyhow::Result<()> {
    refuse_root("start a pageserver")?;
    if !repo.config.has_controller() {
        bail!(
            "this repo has one pageserver and no storage controller, which places tenants on several: make a repo with one (`fjord init --pageservers 2`, or more)"
        );
    }
    let _lock = repo.lock()?;
    let id = u64::from(repo.config.pageservers) + 1;
    let count = u8::try_from(id).ok().filter(|n| crate::config::check_pageservers(*n).is_ok());
    let Some(count) = count else {
        bail!("cannot add pageserver {id}: the repo's ports have room for {} pageservers", crate::config::MAX_PAGESERVERS);
    };
    if repo.tls_on() {
        let (cert, _) = crate::certs::service_files(&repo.dir, &cert_name(id));
        // A certificate left by an add that failed later is used as it is.
        if !cert.exists() {
            crate::certs::issue_repo_cert(&repo.dir, &cert_name(id), repo.config.service_host())?;
        }
    }
    let mut config = repo.config.clone();
    config.pageservers = count;
    crate::state::write_atomically(&Repo::config_path(&repo.dir), config.to_toml()?.as_bytes())?;
    repo.config = config;
    say!("pageserver {id} added to config.toml");
    // A stopped cluster gets no lone pageserver running: it starts with the others.
    if repo.controller().running_pid()?.is_none() {
        say!("the storage controller is not running: pageserver {id} starts and joins it with `fjord start`");
        return Ok(());
    }
    start(repo, id)?;
    crate::controller::wait_online(repo, &[id])?;
    say!("pageserver {id} is online at the storage controller");
    Ok(())
}
