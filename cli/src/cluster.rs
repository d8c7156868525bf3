//! `fjord init | start | stop | status`: the repo and its pageserver.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::config::{RepoConfig, DEFAULT_BASE_PORT};
use crate::process::log_tail;
use crate::repo::Repo;
use crate::state::{write_atomically, State};

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
    for tool in ["postgres", "initdb", "pg_isready"] {
        if !pg_bin_dir.join(tool).is_file() {
            bail!("cannot find {tool} in {} (pass --pg-bin-dir: fjord's PostgreSQL build is in target/pg15/bin)", pg_bin_dir.display());
        }
    }
    let fjord_bin_dir = match args.fjord_bin_dir {
        Some(d) => d,
        None => std::env::current_exe()
            .context("find the fjord executable")?
            .parent()
            .context("the fjord executable has no directory")?
            .to_path_buf(),
    };
    let fjord_bin_dir = canonical(&fjord_bin_dir, "--fjord-bin-dir")?;
    for tool in ["pageserver", "compute_ctl"] {
        if !fjord_bin_dir.join(tool).is_file() {
            bail!("cannot find {tool} in {} (pass --fjord-bin-dir: `cargo build --release` puts it beside fjord)", fjord_bin_dir.display());
        }
    }
    let config = RepoConfig::new(args.base_port, pg_bin_dir, fjord_bin_dir)?;

    for sub in ["pageserver", "endpoints", "tmp"] {
        std::fs::create_dir_all(dir.join(sub)).with_context(|| format!("create {}", dir.join(sub).display()))?;
    }
    State::default().save(&dir.join("state.json"))?;
    // config.toml last: its presence is what makes the directory a repo.
    write_atomically(&Repo::config_path(dir), config.to_toml()?.as_bytes())?;
    println!(
        "initialized fjord repo at {}: page service 127.0.0.1:{}, HTTP API {}, endpoints from port {}",
        dir.display(),
        config.pageserver_pg_port(),
        config.pageserver_http_url(),
        config.endpoint_ports().start
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

fn canonical(path: &Path, flag: &str) -> anyhow::Result<PathBuf> {
    path.canonicalize().with_context(|| format!("cannot use {} ({flag})", path.display()))
}

pub fn start(repo: &Repo) -> anyhow::Result<()> {
    crate::refuse_root("start the pageserver")?;
    let _lock = repo.lock()?;
    let daemon = repo.pageserver();
    if let Some(pid) = daemon.running_pid()? {
        println!("pageserver already running (pid {pid})");
        return Ok(());
    }
    let api = repo.api();
    if api.is_up() {
        bail!("something else already answers on {}: is another repo using base port {}?", repo.config.pageserver_http_url(), repo.config.base_port);
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
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "info");
    }
    tracing::info!("starting {}", conf.pageserver_bin().display());
    let mut child = daemon.spawn(&mut cmd)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().context("wait for the pageserver")? {
            crate::process::remove_file_if_exists(&daemon.pid_file)?;
            bail!("the pageserver exited during startup ({status}); the end of {}:\n{}", daemon.log_file.display(), log_tail(&daemon.log_file, 20));
        }
        if api.is_up() {
            break;
        }
        if Instant::now() > deadline {
            daemon.stop(libc::SIGKILL, Duration::from_secs(5))?;
            bail!("the pageserver did not answer on {} within 30 s; the end of {}:\n{}", conf.pageserver_http_url(), daemon.log_file.display(), log_tail(&daemon.log_file, 20));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "pageserver started (pid {}): page service {}, HTTP API {}, log {}",
        child.id(),
        conf.pageserver_pg_addr(),
        conf.pageserver_http_url(),
        daemon.log_file.display()
    );
    Ok(())
}

pub fn stop(repo: &Repo, timeout: Duration) -> anyhow::Result<()> {
    let _lock = repo.lock()?;
    let state = repo.load_state()?;
    for name in state.endpoints.keys() {
        if repo.endpoint(name).stop(libc::SIGTERM, timeout)? {
            println!("endpoint {name} stopped");
        }
    }
    if repo.pageserver().stop(libc::SIGTERM, timeout)? {
        println!("pageserver stopped");
    } else {
        println!("pageserver was not running");
    }
    Ok(())
}

pub fn status(repo: &Repo) -> anyhow::Result<()> {
    let state = repo.load_state()?;
    let conf = &repo.config;
    println!("repo        {}", repo.dir.display());
    let pid = repo.pageserver().running_pid()?;
    let api = repo.api();
    let up = api.is_up();
    match (pid, up) {
        (Some(pid), true) => println!("pageserver  running (pid {pid}), page service {}, HTTP API {}", conf.pageserver_pg_addr(), conf.pageserver_http_url()),
        (Some(pid), false) => println!("pageserver  not answering (pid {pid}), HTTP API {}", conf.pageserver_http_url()),
        (None, true) => println!("pageserver  answering on {} but not started by this repo", conf.pageserver_http_url()),
        (None, false) => println!("pageserver  stopped"),
    }
    println!();
    if up && pid.is_some() {
        let tenants = api.tenants()?;
        if tenants.is_empty() {
            println!("no tenants: run `fjord tenant create`");
        }
        for tenant in &tenants {
            let default = if state.default_tenant.map(|t| t.to_string()).as_deref() == Some(tenant) { " (default)" } else { "" };
            println!("tenant {tenant}{default}");
            crate::tenant::print_branch_tree(&state, tenant, &api.timelines(tenant)?, "  ");
        }
    } else {
        for (tenant, t) in &state.tenants {
            println!("tenant {tenant} (LSNs unknown while the pageserver is stopped)");
            for (name, timeline) in &t.branches {
                println!("  {name:<12} {timeline}");
            }
        }
    }
    println!();
    crate::endpoint::print_table(repo, &state)?;
    Ok(())
}
