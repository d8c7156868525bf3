//! `fjord init | start | stop | status` and `fjord safekeeper ...`: the repo, its pageserver
//! and its safekeepers.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::config::{RepoConfig, DEFAULT_BASE_PORT};
use crate::process::{http_up, refuse_root, Daemon};
use crate::repo::Repo;
use crate::state::{write_atomically, State};
use logtail::log_tail;
use proto::{TenantId, TimelineId};

#[derive(clap::Args, Debug)]
pub struct InitArgs {
    /// First of the 100 ports the repo uses: page service = base, HTTP API = base + 1,
    /// endpoints from base + 10.
    #[arg(long, default_value_t = DEFAULT_BASE_PORT)]
    base_port: u16,
    /// Bin directory of fjord's PostgreSQL build [default: `pg_config --bindir` of the
    /// pg_config on PATH].
    #[arg(long, value_name = "DIR")]
    pg_bin_dir: Option<PathBuf>,
    /// Directory holding `pageserver` and `compute_ctl` [default: the directory of this
    /// fjord executable].
    #[arg(long, value_name = "DIR")]
    fjord_bin_dir: Option<PathBuf>,
    /// How many safekeepers hold the WAL (a commit waits for a majority). 0: none, computes
    /// stream WAL straight to the pageserver (no quorum, no fencing).
    #[arg(long, default_value_t = crate::config::DEFAULT_SAFEKEEPERS, value_parser = clap::value_parser!(u8).range(0..=crate::config::MAX_SAFEKEEPERS as i64))]
    safekeepers: u8,
    /// Object storage for the pageserver's layers: file:///absolute/dir or
    /// s3://bucket/prefix?endpoint=http://host:port&region=...&allow_http=true (credentials
    /// from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY when the pageserver starts)
    /// [default: the directory remote_storage/ in the repo].
    #[arg(long, value_name = "URL")]
    remote_storage: Option<String>,
    /// Local disk budget for the pageserver's layer files in bytes; above it, layers that
    /// object storage holds are evicted and downloaded again when read [default: none].
    #[arg(long, value_name = "BYTES")]
    layer_disk_budget_bytes: Option<u64>,
    /// Run without authentication: any local process may then read and manage every
    /// tenant. For tests and experiments only; by default `init` makes a key pair
    /// (auth_private_key.pem, auth_public_key.pem) and every process gets a token.
    #[arg(long)]
    no_auth: bool,
    /// Run without TLS: pages, WAL and tokens then travel in cleartext. For tests only; by
    /// default `init` makes a cluster CA and a certificate per service in tls/.
    #[arg(long)]
    no_tls: bool,
}

pub fn init(dir: &Path, args: InitArgs) -> anyhow::Result<()> {
    if dir.exists() && std::fs::read_dir(dir).with_context(|| format!("list {}", dir.display()))?.next().is_some() {
        bail!("cannot initialize a repo at {}: it already exists and is not empty", dir.display());
    }
    let pg_bin_dir = match args.pg_bin_dir {
        Some(d) => d,
        None => pg_config_bindir()?,
    };
    let pg_bin_dir = canonical(&pg_bin_dir, "--pg-bin-dir")?;
    for tool in ["postgres", "initdb", "pg_isready", "pg_config"] {
        if !pg_bin_dir.join(tool).is_file() {
            bail!("cannot find {tool} in {} (pass --pg-bin-dir: fjord's PostgreSQL build is in target/pg15/bin)", pg_bin_dir.display());
        }
    }
    check_fjord_extension(&pg_bin_dir)?;
    let fjord_bin_dir = match args.fjord_bin_dir {
        Some(d) => d,
        None => std::env::current_exe()
            .context("find the fjord executable")?
            .parent()
            .context("the fjord executable has no directory")?
            .to_path_buf(),
    };
    let fjord_bin_dir = canonical(&fjord_bin_dir, "--fjord-bin-dir")?;
    let tools: &[&str] = if args.safekeepers > 0 { &["pageserver", "compute_ctl", "safekeeper"] } else { &["pageserver", "compute_ctl"] };
    for tool in tools {
        if !fjord_bin_dir.join(tool).is_file() {
            bail!("cannot find {tool} in {} (pass --fjord-bin-dir: `cargo build --release` puts it beside fjord)", fjord_bin_dir.display());
        }
    }
    let mut config = RepoConfig::new(args.base_port, pg_bin_dir, fjord_bin_dir, args.safekeepers)?;
    let remote_url = match args.remote_storage {
        Some(url) => url,
        None => {
            std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
            let dir = canonical(dir, "the repo directory")?;
            format!("file://{}/remote_storage", dir.display())
        }
    };
    // Parsing opens nothing remote: a typo is refused here, an unreachable server at start.
    remote_storage::RemoteStorage::from_url(&remote_url).context("check --remote-storage")?;
    config.remote_storage = Some(remote_url);
    config.layer_disk_budget_bytes = args.layer_disk_budget_bytes;
    config.auth = !args.no_auth;
    config.tls = Some(!args.no_tls);

    for sub in ["pageserver", "endpoints", "tmp"] {
        std::fs::create_dir_all(dir.join(sub)).with_context(|| format!("create {}", dir.join(sub).display()))?;
    }
    for id in config.safekeeper_ids() {
        let d = Repo::safekeeper_dir_in(dir, id);
        std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
    }
    if config.auth {
        auth::generate_key_pair(dir).context("make the repo's key pair")?;
    }
    if !args.no_tls {
        let mut services = vec!["pageserver".to_string()];
        services.extend(config.safekeeper_ids().map(safekeeper_name));
        crate::certs::make_repo_tls(dir, &services, config.service_host())?;
    }
    State::default().save(&dir.join("state.json"))?;
    // config.toml last: its presence is what makes the directory a repo.
    write_atomically(&Repo::config_path(dir), config.to_toml()?.as_bytes())?;
    say!(
        "initialized fjord repo at {}: page service 127.0.0.1:{}, HTTP API {}, {} safekeeper(s) from port {}, endpoints from port {}, object storage {}, authentication {}, TLS {}",
        dir.display(),
        config.pageserver_pg_port(),
        config.pageserver_http_url(),
        config.safekeepers,
        config.safekeeper_port(1),
        config.endpoint_ports().start,
        config.remote_storage.as_deref().unwrap_or("none"),
        if config.auth { "on (tokens signed with auth_private_key.pem)" } else { "OFF (--no-auth: any local process may read every tenant)" },
        if args.no_tls { "OFF (--no-tls: pages, WAL and tokens travel in cleartext)" } else { "on (the cluster CA and every service's certificate in tls/)" }
    );
    Ok(())
}

fn pg_config_bindir() -> anyhow::Result<PathBuf> {
    let out = Command::new("pg_config").arg("--bindir").output();
    match out {
        Ok(out) if out.status.success() => Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())),
        _ => bail!("cannot find PostgreSQL: no pg_config on PATH; pass --pg-bin-dir (fjord's build is in target/pg15/bin)"),
    }
}

/// A PostgreSQL without fjord's extension (say, the distribution's, whose pg_config is on
/// PATH) would be accepted here and fail at the first endpoint start with PostgreSQL's
/// "could not access file \"fjord\"": say so now, naming the library directory looked in.
fn check_fjord_extension(pg_bin_dir: &Path) -> anyhow::Result<()> {
    let pg_config = pg_bin_dir.join("pg_config");
    let out = Command::new(&pg_config).arg("--pkglibdir").output().with_context(|| format!("could not run {}", pg_config.display()))?;
    if !out.status.success() {
        bail!("{} --pkglibdir failed ({})", pg_config.display(), out.status);
    }
    let pkglibdir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !pkglibdir.join("fjord.so").is_file() {
        bail!(
            "the PostgreSQL in {} has no fjord extension (no fjord.so in {}): pass --pg-bin-dir with fjord's patched build (target/pg15/bin after scripts/setup)",
            pg_bin_dir.display(),
            pkglibdir.display()
        );
    }
    Ok(())
}

fn canonical(path: &Path, flag: &str) -> anyhow::Result<PathBuf> {
    path.canonicalize().with_context(|| format!("cannot use {} ({flag})", path.display()))
}

/// A safekeeper's name, as its certificate's files are named: `safekeeper-1`.
pub fn safekeeper_name(id: u8) -> String {
    format!("safekeeper-{id}")
}

/// `fjord start`: the pageserver, then every safekeeper.
pub fn start(repo: &Repo) -> anyhow::Result<()> {
    refuse_root("start the pageserver")?;
    let _lock = repo.lock()?;
    // The safekeepers first: the pageserver's WAL receivers connect to them as it starts.
    for id in repo.config.safekeeper_ids() {
        start_safekeeper(repo, id)?;
    }
    let started = start_pageserver(repo)?;
    resume_wal_receivers(repo, started)
}

/// Registers the safekeepers again as the WAL sources of every branch whose timeline the
/// pageserver follows with no receiver (or of every branch, `all`, when this command just
/// started the pageserver): a pageserver rebuilt from object storage (its work directory
/// lost) knows the timelines but not where their WAL comes from, which only the CLI knows;
/// without this its reads would wait until each endpoint restarted. Registering again
/// right after a start also hands a receiver persisted without a token the timeline's
/// token (the pageserver holds no token of its own, so such a receiver could not stream).
fn resume_wal_receivers(repo: &Repo, all: bool) -> anyhow::Result<()> {
    if repo.config.safekeepers == 0 {
        return Ok(());
    }
    let api = repo.api();
    let state = repo.load_state()?;
    let mut resumed = 0;
    for (tenant, t) in &state.tenants {
        let Ok(tenant) = tenant.parse::<TenantId>() else { continue };
        let timelines = match api.timelines(tenant) {
            Ok(list) => list,
            Err(e) => {
                tracing::warn!(%tenant, "could not list the timelines of tenant {tenant}: {e}");
                continue;
            }
        };
        for id in t.branches.values() {
            let Ok(timeline) = id.parse::<TimelineId>() else { continue };
            let Some(info) = timelines.iter().find(|i| i.timeline_id == timeline) else { continue };
            if (info.wal_receiver.is_some() && !all) || !info.last_record_lsn.is_valid() {
                continue;
            }
            crate::tenant::register_wal_sources(repo, &api, tenant, timeline)?;
            resumed += 1;
        }
    }
    if resumed > 0 {
        say!("the pageserver follows the safekeepers again on {resumed} timeline(s)");
    }
    Ok(())
}

/// Starts the pageserver unless it runs; whether this call started it.
fn start_pageserver(repo: &Repo) -> anyhow::Result<bool> {
    let daemon = repo.pageserver();
    if let Some(pid) = daemon.running_pid()? {
        say!("pageserver already running (pid {pid})");
        return Ok(false);
    }
    if crate::process::http_answers(&repo.config.pageserver_http_url(), repo.client_tls()?.as_ref()) {
        bail!(
            "something else already answers on {}: is another repo using base port {}?",
            repo.config.pageserver_http_url(),
            repo.config.base_port
        );
    }
    let conf = &repo.config;
    let mut cmd = Command::new(conf.pageserver_bin());
    cmd.arg("--workdir")
        .arg(repo.pageserver_workdir())
        .arg("--listen-pg")
        .arg(conf.pageserver_pg_addr())
        .arg("--listen-http")
        .arg(format!("127.0.0.1:{}", conf.pageserver_http_port()))
        .arg("--pg-bin-dir")
        .arg(&conf.pg_bin_dir)
        .current_dir(&repo.dir);
    if let Some(url) = &conf.remote_storage {
        cmd.arg("--remote-storage").arg(url);
    }
    if let Some(budget) = conf.layer_disk_budget_bytes {
        cmd.arg("--layer-disk-budget-bytes").arg(budget.to_string());
    }
    // It checks tokens with the public key. It has no token of its own: each timeline's
    // WAL sources come with a storage token for that timeline (`register_wal_sources`).
    // Nor one inherited from the caller's environment (an operator's admin token for curl).
    cmd.env_remove(auth::TOKEN_ENV);
    if repo.token(&auth::Claims::admin()).is_some() {
        cmd.arg("--auth-public-key").arg(repo.public_key_path());
    }
    // The pageserver is a client of the safekeepers too: it gets the CA.
    cmd.args(repo.server_tls_args("pageserver", true));
    // Further pageserver settings (`pageserver --print-config` lists them) go in
    // pageserver.toml in the repo; the flags above win over it.
    let extra = repo.dir.join(PAGESERVER_TOML);
    if extra.is_file() {
        cmd.arg("--config").arg(&extra);
    }
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "info");
    }
    tracing::info!("starting {}", conf.pageserver_bin().display());
    let api = repo.api();
    let child = spawn_and_wait(&daemon, &mut cmd, "the pageserver", &conf.pageserver_http_url(), || crate::repo::is_up(&api))?;
    say!(
        "pageserver started (pid {}): page service {}, HTTP API {}, log {}",
        child.id(),
        conf.pageserver_pg_addr(),
        conf.pageserver_http_url(),
        daemon.log_file.display()
    );
    Ok(true)
}

/// With authentication on: `--auth-public-key` and a token with `claims` in
/// `FJORD_AUTH_TOKEN` (the environment, not the command line, which every user sees).
fn with_auth(repo: &Repo, cmd: &mut Command, claims: &auth::Claims) {
    if let Some(token) = repo.token(claims) {
        cmd.arg("--auth-public-key").arg(repo.public_key_path()).env(auth::TOKEN_ENV, token);
    }
}

/// The optional file of further pageserver settings in a repo.
pub const PAGESERVER_TOML: &str = "pageserver.toml";

/// Spawns a daemon and waits until `is_up` (its HTTP API answers), at most 30 s.
fn spawn_and_wait(
    daemon: &Daemon,
    cmd: &mut Command,
    what: &str,
    url: &str,
    is_up: impl Fn() -> bool,
) -> anyhow::Result<std::process::Child> {
    let mut child = daemon.spawn(cmd)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().with_context(|| format!("wait for {what}"))? {
            crate::process::remove_file_if_exists(&daemon.pid_file)?;
            bail!("{what} exited during startup ({status}); the end of {}:\n{}", daemon.log_file.display(), log_tail(&daemon.log_file, 20));
        }
        if is_up() {
            return Ok(child);
        }
        if Instant::now() > deadline {
            daemon.stop(libc::SIGKILL, Duration::from_secs(5))?;
            bail!(
                "{what} did not answer on {url} within 30 s; the end of {}:\n{}",
                daemon.log_file.display(),
                log_tail(&daemon.log_file, 20)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn check_safekeeper_id(repo: &Repo, id: u8) -> anyhow::Result<()> {
    if !repo.config.safekeeper_ids().contains(&id) {
        bail!("no safekeeper {id}: this repo has {} (ids 1..={0})", repo.config.safekeepers);
    }
    Ok(())
}

/// Starts safekeeper `id` unless it runs.
pub fn start_safekeeper(repo: &Repo, id: u8) -> anyhow::Result<()> {
    check_safekeeper_id(repo, id)?;
    let conf = &repo.config;
    let daemon = repo.safekeeper(id);
    if let Some(pid) = daemon.running_pid()? {
        say!("safekeeper {id} already running (pid {pid})");
        return Ok(());
    }
    let url = conf.safekeeper_http_url(id);
    let tls = repo.client_tls()?;
    if crate::process::http_answers(&url, tls.as_ref()) {
        bail!("something else already answers on {url}: is another repo using base port {}?", conf.base_port);
    }
    let dir = repo.safekeeper_dir(id);
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let mut cmd = Command::new(conf.safekeeper_bin());
    cmd.args(["--id", &id.to_string()])
        .arg("--data-dir")
        .arg(&dir)
        .args(["--listen", &conf.safekeeper_addr(id), "--http", &format!("127.0.0.1:{}", conf.safekeeper_http_port(id))])
        .current_dir(&repo.dir);
    with_auth(repo, &mut cmd, &auth::Claims::storage());
    cmd.args(repo.server_tls_args(&safekeeper_name(id), false));
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "info");
    }
    let child = spawn_and_wait(&daemon, &mut cmd, &format!("safekeeper {id}"), &url, || http_up(&url, tls.as_ref()))?;
    say!("safekeeper {id} started (pid {}): {}, HTTP API {url}, log {}", child.id(), conf.safekeeper_addr(id), daemon.log_file.display());
    Ok(())
}

/// `fjord safekeeper start ID`.
pub fn safekeeper_start(repo: &Repo, id: u8) -> anyhow::Result<()> {
    refuse_root("start a safekeeper")?;
    let _lock = repo.lock()?;
    start_safekeeper(repo, id)
}

/// `fjord safekeeper stop ID`: SIGTERM (clean) or, with `immediate`, SIGKILL (a crash).
pub fn safekeeper_stop(repo: &Repo, id: u8, immediate: bool, timeout: Duration) -> anyhow::Result<()> {
    check_safekeeper_id(repo, id)?;
    let _lock = repo.lock()?;
    let signal = if immediate { libc::SIGKILL } else { libc::SIGTERM };
    if repo.safekeeper(id).stop(signal, timeout)? {
        say!("safekeeper {id} stopped");
    } else {
        say!("safekeeper {id} was not running");
    }
    Ok(())
}

fn print_tls(repo: &Repo) {
    match repo.config.tls {
        None => say!("tls         off (the repo was made before TLS existed)"),
        Some(false) => say!("tls         off (fjord init --no-tls)"),
        Some(true) => {
            let expiry = |name: &str| {
                let (cert, _) = crate::certs::service_files(&repo.dir, name);
                let state = crate::certs::expires_in(&cert).unwrap_or_else(|e| format!("unreadable: {e:#}"));
                format!("{name} {state}")
            };
            if let Err(e) = repo.client_tls() {
                say!("tls         on, but {e:#}");
                return;
            }
            let mut certs = vec![expiry("pageserver")];
            certs.extend(repo.config.safekeeper_ids().map(|id| expiry(&safekeeper_name(id))));
            say!("tls         on, cluster CA {}; {}", repo.ca_cert_path().display(), certs.join(", "));
        }
    }
}

fn print_safekeepers(repo: &Repo) -> anyhow::Result<()> {
    let conf = &repo.config;
    if conf.safekeepers == 0 {
        say!("safekeepers none (computes stream WAL straight to the pageserver)");
    }
    let tls = repo.client_tls()?;
    for id in conf.safekeeper_ids() {
        let url = conf.safekeeper_http_url(id);
        match (repo.safekeeper(id).running_pid()?, http_up(&url, tls.as_ref())) {
            (Some(pid), true) => say!("safekeeper {id} running (pid {pid}), {}, HTTP API {url}", conf.safekeeper_addr(id)),
            (Some(pid), false) => say!("safekeeper {id} not answering (pid {pid}), HTTP API {url}"),
            (None, true) => say!("safekeeper {id} answering on {url} but not started by this repo"),
            (None, false) => say!("safekeeper {id} stopped"),
        }
    }
    Ok(())
}

pub fn stop(repo: &Repo, timeout: Duration) -> anyhow::Result<()> {
    let _lock = repo.lock()?;
    let state = repo.load_state()?;
    for name in state.endpoints.keys() {
        if repo.endpoint(name).stop(libc::SIGTERM, timeout)? {
            crate::endpoint::discard_pgdata(repo, name);
            say!("endpoint {name} stopped");
        }
    }
    // The pageserver before the safekeepers it reads WAL from: it then stops streaming on
    // its own, instead of failing over between safekeepers that are going away.
    if repo.pageserver().stop(libc::SIGTERM, timeout)? {
        say!("pageserver stopped");
    } else {
        say!("pageserver was not running");
    }
    for id in repo.config.safekeeper_ids() {
        if repo.safekeeper(id).stop(libc::SIGTERM, timeout)? {
            say!("safekeeper {id} stopped");
        }
    }
    Ok(())
}

pub fn status(repo: &Repo) -> anyhow::Result<()> {
    let state = repo.load_state()?;
    let conf = &repo.config;
    say!("repo        {}", repo.dir.display());
    let pid = repo.pageserver().running_pid()?;
    let api = repo.api();
    let up = crate::repo::is_up(&api);
    match (pid, up) {
        (Some(pid), true) => {
            say!("pageserver  running (pid {pid}), page service {}, HTTP API {}", conf.pageserver_pg_addr(), conf.pageserver_http_url())
        }
        (Some(pid), false) => say!("pageserver  not answering (pid {pid}), HTTP API {}", conf.pageserver_http_url()),
        (None, true) => say!("pageserver  answering on {} but not started by this repo", conf.pageserver_http_url()),
        (None, false) => say!("pageserver  stopped"),
    }
    print_safekeepers(repo)?;
    print_tls(repo);
    say!();
    if up && pid.is_some() {
        let tenants = api.tenants()?;
        if tenants.is_empty() {
            say!("no tenants: run `fjord tenant create`");
        }
        for tenant in &tenants {
            let default = if state.default_tenant == Some(*tenant) { " (default)" } else { "" };
            say!("tenant {tenant}{default}");
            crate::tenant::print_branch_tree(&state, *tenant, &api.timelines(*tenant)?, "  ");
        }
    } else {
        for (tenant, t) in &state.tenants {
            say!("tenant {tenant} (LSNs unknown while the pageserver is stopped)");
            for (name, timeline) in &t.branches {
                say!("  {name:<12} {timeline}");
            }
        }
    }
    say!();
    crate::endpoint::print_table(repo, &state)?;
    Ok(())
}
