//! `fjord init | start | stop | status` and `fjord safekeeper ...`: the repo, its pageserver
//! and its safekeepers.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context};

use crate::config::{RepoConfig, DEFAULT_BASE_PORT};
use crate::process::{http_up, refuse_root};
use crate::repo::Repo;
use crate::state::{write_atomically, State};
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
    /// How many pageservers (node ids 1..=N). With 2 or more the repo also runs the storage
    /// controller, which places each tenant on one (and its warm secondary on another) and
    /// fails it over when that one dies, and the controller's database.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=crate::config::MAX_PAGESERVERS as i64))]
    pageservers: u8,
    /// An existing PostgreSQL for the storage controller's tables (a libpq connection
    /// string or URL) [default: a small PostgreSQL the repo runs, in controller_db/].
    #[arg(long, value_name = "URL")]
    controller_database: Option<String>,
}

pub fn init(dir: &Path, args: InitArgs) -> anyhow::Result<()> {
    if dir.exists() && std::fs::read_dir(dir).with_context(|| format!("list {}", dir.display()))?.next().is_some() {
        bail!("cannot initialize a repo at {}: it already exists and is not empty", dir.display());
    }
    if args.controller_database.is_some() && args.pageservers < 2 {
        bail!("--controller-database is for a repo with a storage controller: pass --pageservers 2 (or more); a repo with one pageserver runs none");
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
    let mut tools = vec!["pageserver", "compute_ctl"];
    if args.safekeepers > 0 {
        tools.push("safekeeper");
    }
    if args.pageservers > 1 {
        tools.push("storage_controller");
    }
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
    config.pageservers = args.pageservers;
    if args.pageservers > 1 {
        config.controller = Some(crate::config::ControllerConfig { database: args.controller_database });
    }
    config.validate()?;

    for sub in ["endpoints", "tmp"] {
        std::fs::create_dir_all(dir.join(sub)).with_context(|| format!("create {}", dir.join(sub).display()))?;
    }
    for id in config.pageserver_ids() {
        let d = Repo::pageserver_workdir_in(dir, id);
        std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
    }
    for id in config.safekeeper_ids() {
        let d = Repo::safekeeper_dir_in(dir, id);
        std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
    }
    if config.auth {
        auth::generate_key_pair(dir).context("make the repo's key pair")?;
    }
    if !args.no_tls {
        let mut services: Vec<String> = config.pageserver_ids().map(crate::pageserver::cert_name).collect();
        services.extend(config.safekeeper_ids().map(safekeeper_name));
        if config.has_controller() {
            services.push(crate::controller::CERT_NAME.to_string());
        }
        crate::certs::make_repo_tls(dir, &services, config.service_host())?;
    }
    if config.runs_controller_db() {
        let user = crate::process::os_user_name()?;
        crate::controller::init_database(
            &config.pg_bin_dir,
            &dir.join("controller_db"),
            config.controller_db_port(),
            config.service_host(),
            &user,
        )?;
    }
    State::default().save(&dir.join("state.json"))?;
    // config.toml last: its presence is what makes the directory a repo.
    write_atomically(&Repo::config_path(dir), config.to_toml()?.as_bytes())?;
    say!(
        "initialized fjord repo at {}: page service 127.0.0.1:{}, HTTP API {}, {} safekeeper(s) from port {}, endpoints from port {}, object storage {}, authentication {}, TLS {}",
        dir.display(),
        config.pageserver_pg_port(1),
        config.pageserver_http_url(1),
        config.safekeepers,
        config.safekeeper_port(1),
        config.endpoint_ports().start,
        config.remote_storage.as_deref().unwrap_or("none"),
        if config.auth { "on (tokens signed with auth_private_key.pem)" } else { "OFF (--no-auth: any local process may read every tenant)" },
        if args.no_tls { "OFF (--no-tls: pages, WAL and tokens travel in cleartext)" } else { "on (the cluster CA and every service's certificate in tls/)" }
    );
    if config.has_controller() {
        say!(
            "{} pageservers (node ids 1..={0}; pageserver N >= 2 from port {}), storage controller {}, its database {}",
            config.pageservers,
            config.pageserver_pg_port(2),
            config.controller_url(),
            if config.runs_controller_db() {
                format!("in controller_db/ on port {}", config.controller_db_port())
            } else {
                "as configured".to_string()
            }
        );
    }
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

/// `fjord start`: with a controller, its database and the controller; then every
/// safekeeper, then the pageservers.
pub fn start(repo: &Repo) -> anyhow::Result<()> {
    refuse_root("start the pageserver")?;
    let _lock = repo.lock()?;
    // The controller first: a pageserver serves nothing until it has joined it.
    if repo.config.has_controller() {
        crate::controller::start_database(repo)?;
        crate::controller::start_controller(repo)?;
    }
    // The safekeepers before the pageservers: their WAL receivers connect to them as they
    // start.
    for id in repo.config.safekeeper_ids() {
        start_safekeeper(repo, id)?;
    }
    if repo.config.has_controller() {
        for id in repo.config.pageserver_ids() {
            crate::pageserver::start(repo, id)?;
        }
        // Placement waits for them: a tenant created now gets a secondary at once.
        let ids: Vec<u64> = repo.config.pageserver_ids().collect();
        crate::controller::wait_online(repo, &ids)?;
        say!("the storage controller sees every pageserver online");
        // No WAL sources to register again: with a controller a timeline's remote index
        // names its safekeepers and each pageserver presents its own token to them, so an
        // attachment (after a restart, a rebuild or a failover) follows them by itself.
        return Ok(());
    }
    let started = crate::pageserver::start(repo, 1)?;
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
    repo.with_auth(&mut cmd, &auth::Claims::storage());
    cmd.args(repo.server_tls_args(&safekeeper_name(id), false));
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "info");
    }
    let child = crate::process::spawn_and_wait(&daemon, &mut cmd, &format!("safekeeper {id}"), &url, || http_up(&url, tls.as_ref()))?;
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
            let mut certs: Vec<String> = repo.config.pageserver_ids().map(|id| expiry(&crate::pageserver::cert_name(id))).collect();
            certs.extend(repo.config.safekeeper_ids().map(|id| expiry(&safekeeper_name(id))));
            if repo.config.has_controller() {
                certs.push(expiry(crate::controller::CERT_NAME));
            }
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
    // The controller before the pageservers: it would otherwise take each one that goes
    // away for dead and fail its tenants over to the others, which are going away too. The
    // pageservers come back with the same placements, their generations raised.
    if repo.config.has_controller() && repo.controller().stop(libc::SIGTERM, timeout)? {
        say!("storage controller stopped");
    }
    // The pageservers before the safekeepers they read WAL from: they then stop streaming
    // on their own, instead of failing over between safekeepers that are going away.
    for id in repo.config.pageserver_ids() {
        let name = if repo.config.has_controller() { format!("pageserver {id}") } else { "pageserver".to_string() };
        if repo.pageserver(id).stop(libc::SIGTERM, timeout)? {
            say!("{name} stopped");
        } else {
            say!("{name} was not running");
        }
    }
    for id in repo.config.safekeeper_ids() {
        if repo.safekeeper(id).stop(libc::SIGTERM, timeout)? {
            say!("safekeeper {id} stopped");
        }
    }
    // Its database last (the controller is stopped already).
    crate::controller::stop(repo, timeout)
}

pub fn status(repo: &Repo) -> anyhow::Result<()> {
    let state = repo.load_state()?;
    let conf = &repo.config;
    say!("repo        {}", repo.dir.display());
    if conf.has_controller() {
        return status_with_controller(repo, &state);
    }
    let pid = repo.pageserver(1).running_pid()?;
    let api = repo.api();
    let up = crate::repo::is_up(&api);
    match (pid, up) {
        (Some(pid), true) => {
            say!("pageserver  running (pid {pid}), page service {}, HTTP API {}", conf.pageserver_pg_addr(1), conf.pageserver_http_url(1))
        }
        (Some(pid), false) => say!("pageserver  not answering (pid {pid}), HTTP API {}", conf.pageserver_http_url(1)),
        (None, true) => say!("pageserver  answering on {} but not started by this repo", conf.pageserver_http_url(1)),
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

/// `fjord status` of a repo with a storage controller: the controller and its database,
/// each pageserver's health and holdings, then each tenant's branches as its attached
/// pageserver has them.
fn status_with_controller(repo: &Repo, state: &State) -> anyhow::Result<()> {
    crate::controller::print_status(repo)?;
    print_safekeepers(repo)?;
    print_tls(repo);
    say!();
    let placed = repo.controller_api().tenants().ok();
    if placed.as_ref().is_some_and(|p| p.is_empty()) {
        say!("no tenants: run `fjord tenant create`");
    }
    let mut shown = std::collections::BTreeSet::new();
    for location in placed.iter().flatten() {
        let tenant = location.tenant_id;
        shown.insert(tenant.to_string());
        let default = if state.default_tenant == Some(tenant) { " (default)" } else { "" };
        let secondary =
            location.secondary.as_ref().map_or_else(|| "no secondary".to_string(), |s| format!("secondary on pageserver {}", s.node_id));
        let migrating = match &location.migration {
            Some(m) if !m.cut_over => format!(", migrating from pageserver {} (which serves it until the cut-over)", m.from.node_id),
            Some(m) => format!(", migrated from pageserver {} (cut over)", m.from.node_id),
            None => String::new(),
        };
        say!(
            "tenant {tenant}{default}: attached to pageserver {} (generation {}){migrating}, {secondary}",
            location.attached.node_id,
            location.generation
        );
        match repo.tenant_api(tenant).and_then(|api| api.timelines(tenant).map_err(anyhow::Error::from)) {
            Ok(timelines) => crate::tenant::print_branch_tree(state, tenant, &timelines, "  "),
            Err(e) => say!("  branches unknown: {e:#}"),
        }
    }
    for (tenant, t) in state.tenants.iter().filter(|(t, _)| !shown.contains(*t)) {
        say!("tenant {tenant} (where it is unknown while the storage controller does not answer)");
        for (name, timeline) in &t.branches {
            say!("  {name:<12} {timeline}");
        }
    }
    say!();
    crate::endpoint::print_table(repo, state)
}
