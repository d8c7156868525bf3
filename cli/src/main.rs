//! `fjord`: runs a whole fjord cluster on one machine, for development, tests and demos, in
//! the spirit of `pg_ctl`: a pageserver, tenants with branches, and endpoints (computes).
//!
//! Everything lives in one repo directory (`repo.rs`); every port derives from its base
//! port (`config.rs`), so several repos run side by side. The CLI starts processes and keeps
//! names; the pageserver remains the authority on tenants, timelines and LSNs, and in a repo
//! with several pageservers the storage controller on where each tenant is
//! (`controller.rs`).

/// `println!` that does not panic when standard output is gone (`fjord stop | head -1`):
/// a command that stops or starts processes must finish its work whoever reads its report,
/// and `println!` panics on a broken pipe, which would leave a cluster half stopped.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

mod certs;
mod cluster;
mod config;
mod controller;
mod endpoint;
mod pageserver;
mod point;
mod process;
mod repo;
mod state;
mod tenant;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use proto::TenantId;

/// Runs a fjord cluster on this machine: a pageserver, safekeepers, tenants with branches,
/// and endpoints (PostgreSQL computes that send WAL to the safekeepers and read their pages
/// from the pageserver).
///
/// A first session:
///   fjord init && fjord start && fjord tenant create
///   fjord endpoint start main        # prints a connection string
///   fjord branch create dev --from main
///   fjord status
///   fjord stop
#[derive(Parser, Debug)]
#[command(name = "fjord", version, about, long_about, verbatim_doc_comment)]
struct Cli {
    /// The repo directory holding configuration, state, data and logs.
    #[arg(long, global = true, env = "FJORD_REPO_DIR", default_value = ".fjord", value_name = "DIR")]
    repo: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create a repo: config.toml (ports, binaries) and an empty pageserver directory.
    Init(cluster::InitArgs),
    /// Start the safekeepers and the pageserver in the background (with several
    /// pageservers: the storage controller and its database first, then every pageserver).
    Start,
    /// Stop every running endpoint, then the storage controller (if any), the pageservers,
    /// the safekeepers and the controller's database.
    Stop {
        /// Seconds to wait for each process before killing it.
        #[arg(long, default_value_t = 30)]
        timeout_secs: u64,
    },
    /// Show the pageserver(s), safekeepers, tenants, branches with their LSNs, and endpoints
    /// (with a storage controller: its leadership, each pageserver's health, and where each
    /// tenant is attached and has its secondary).
    Status,
    /// Pageservers: started and stopped with `fjord start`/`stop`; these commands act on
    /// one (e.g. to see a tenant fail over), or add one to a repo with a storage controller.
    #[command(subcommand)]
    Pageserver(PageserverCommand),
    /// Safekeepers: the WAL quorum (started and stopped with `fjord start`/`stop`; these
    /// commands act on one, e.g. to see the cluster ride out a failure).
    #[command(subcommand)]
    Safekeeper(SafekeeperCommand),
    /// Tenants: independent PostgreSQL clusters.
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// Branches: copy-on-write timelines with names.
    #[command(subcommand)]
    Branch(BranchCommand),
    /// Endpoints: computes (PostgreSQL servers) on a branch.
    #[command(subcommand)]
    Endpoint(EndpointCommand),
    /// Certificates: a CA, and a certificate for a service signed by the repo's CA (to
    /// bring a service on another host into the cluster).
    #[command(subcommand)]
    Cert(certs::CertCommand),
    /// Tokens for the pageserver's and the safekeepers' APIs, signed with the repo's key
    /// (the CLI gives every process its own; these are for you, e.g. with curl).
    #[command(subcommand)]
    Auth(AuthCommand),
}

#[derive(Subcommand, Debug)]
enum AuthCommand {
    /// Print a token: a tenant's (what a compute gets: its pages, WAL and the calls a
    /// compute makes), narrowed to a branch with --branch, an admin token (--admin), or a
    /// pageserver's own (--pageserver ID).
    /// Use it as `Authorization: Bearer <token>`.
    Token {
        /// An admin token: every API, every tenant.
        #[arg(long, conflicts_with_all = ["tenant", "branch", "pageserver"])]
        admin: bool,
        /// Pageserver ID's own token (a storage token for no tenant, naming the node): what
        /// `pageserver --controller --node-id ID` takes in FJORD_AUTH_TOKEN.
        #[arg(long, value_name = "ID", conflicts_with_all = ["tenant", "branch"])]
        pageserver: Option<u64>,
        /// Tenant [default: the default tenant].
        #[arg(long)]
        tenant: Option<TenantId>,
        /// Only this branch's timeline.
        #[arg(long)]
        branch: Option<String>,
        /// Make it expire after this many seconds [default: never].
        #[arg(long, value_name = "SECONDS")]
        expires_in: Option<u64>,
    },
}

#[derive(Subcommand, Debug)]
enum PageserverCommand {
    /// Start pageserver ID (1-based; the repo's only one is 1).
    Start { id: u64 },
    /// Stop pageserver ID.
    Stop {
        id: u64,
        /// Kill it (SIGKILL) as a crash would, instead of a clean shutdown: with a storage
        /// controller its tenants fail over to their secondaries.
        #[arg(long)]
        immediate: bool,
        /// Seconds to wait before killing it.
        #[arg(long, default_value_t = 30)]
        timeout_secs: u64,
    },
    /// Add a pageserver (the next node id) to a repo with a storage controller: its
    /// certificate, its directory, config.toml; started and joined to the controller.
    Add,
}

#[derive(Subcommand, Debug)]
enum SafekeeperCommand {
    /// Start safekeeper ID (1-based).
    Start { id: u8 },
    /// Stop safekeeper ID.
    Stop {
        id: u8,
        /// Kill it (SIGKILL) as a crash would, instead of a clean shutdown.
        #[arg(long)]
        immediate: bool,
        /// Seconds to wait before killing it.
        #[arg(long, default_value_t = 30)]
        timeout_secs: u64,
    },
}

#[derive(Subcommand, Debug)]
enum TenantCommand {
    /// Bootstrap a new database cluster (initdb, import) with the branch "main"; prints its id.
    /// The first tenant becomes the default tenant.
    Create {
        /// The tenant id (32 hex digits) [default: random].
        #[arg(long)]
        tenant_id: Option<TenantId>,
    },
    /// List tenants; the default one is marked.
    List,
    /// Move a tenant to another pageserver with no failed query (a cluster made with
    /// `init --pageservers N`): the destination attaches and catches up while the current
    /// one serves, computes move, and the old one becomes the secondary. Waits until done.
    Migrate {
        /// Tenant [default: the default tenant].
        tenant: Option<TenantId>,
        /// The pageserver (node id) to move it to.
        #[arg(long, value_name = "ID")]
        to: u64,
        /// Seconds to wait for the migration to end.
        #[arg(long, default_value_t = 120)]
        timeout_secs: u64,
    },
}

#[derive(Subcommand, Debug)]
enum BranchCommand {
    /// Create a branch from another one, now or at a past point (instant, copy-on-write).
    Create {
        /// Name of the new branch.
        name: String,
        /// The branch to start from.
        #[arg(long, default_value = "main")]
        from: String,
        /// Branch point: an LSN (X/X) of the source branch, or a time (RFC 3339, such as
        /// 2026-11-24T10:30:00Z): the branch then holds exactly the transactions committed
        /// by then [default: the source's latest].
        #[arg(long, value_name = "LSN|TIME")]
        at: Option<point::Point>,
        /// Tenant [default: the default tenant].
        #[arg(long)]
        tenant: Option<TenantId>,
    },
    /// Show the branch tree with LSNs.
    List {
        /// Tenant [default: the default tenant].
        #[arg(long)]
        tenant: Option<TenantId>,
    },
}

#[derive(Subcommand, Debug)]
enum EndpointCommand {
    /// Start a compute on a branch from a fresh basebackup; prints its connection string.
    Start(endpoint::StartArgs),
    /// Stop a compute.
    Stop {
        name: String,
        /// fast: roll back sessions and shut down cleanly; immediate: exit at once.
        #[arg(long, value_enum, default_value_t = endpoint::StopMode::Fast)]
        mode: endpoint::StopMode,
    },
    /// List endpoints: name, tenant, branch, port, status.
    List,
    /// Print an endpoint's connection string.
    Connstr { name: String },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fjord: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let dir = repo::resolve_dir(&cli.repo)?;
    if let Command::Init(args) = cli.command {
        return cluster::init(&dir, args);
    }
    // Certificates need no running cluster, and `cert ca` not even a repo.
    if let Command::Cert(command) = cli.command {
        return certs::run(&dir, command);
    }
    let mut repo = repo::Repo::open(&dir)?;
    let span = tracing::info_span!("repo", dir = %dir.display());
    let _entered = span.enter();
    match cli.command {
        Command::Init(_) | Command::Cert(_) => unreachable!("handled above"),
        Command::Start => cluster::start(&repo),
        Command::Stop { timeout_secs } => cluster::stop(&repo, std::time::Duration::from_secs(timeout_secs)),
        Command::Status => cluster::status(&repo),
        Command::Pageserver(PageserverCommand::Start { id }) => pageserver::start_command(&repo, id),
        Command::Pageserver(PageserverCommand::Stop { id, immediate, timeout_secs }) => {
            pageserver::stop_command(&repo, id, immediate, std::time::Duration::from_secs(timeout_secs))
        }
        Command::Pageserver(PageserverCommand::Add) => pageserver::add(&mut repo),
        Command::Safekeeper(SafekeeperCommand::Start { id }) => cluster::safekeeper_start(&repo, id),
        Command::Safekeeper(SafekeeperCommand::Stop { id, immediate, timeout_secs }) => {
            cluster::safekeeper_stop(&repo, id, immediate, std::time::Duration::from_secs(timeout_secs))
        }
        Command::Tenant(TenantCommand::Create { tenant_id }) => tenant::create(&repo, tenant_id),
        Command::Tenant(TenantCommand::List) => tenant::list(&repo),
        Command::Tenant(TenantCommand::Migrate { tenant, to, timeout_secs }) => {
            tenant::migrate(&repo, tenant, to, std::time::Duration::from_secs(timeout_secs))
        }
        Command::Branch(BranchCommand::Create { name, from, at, tenant }) => tenant::branch_create(&repo, &name, &from, at, tenant),
        Command::Branch(BranchCommand::List { tenant }) => tenant::branch_list(&repo, tenant),
        Command::Endpoint(EndpointCommand::Start(args)) => endpoint::start(&repo, args),
        Command::Endpoint(EndpointCommand::Stop { name, mode }) => endpoint::stop(&repo, &name, mode),
        Command::Endpoint(EndpointCommand::List) => endpoint::list(&repo),
        Command::Endpoint(EndpointCommand::Connstr { name }) => endpoint::connstr(&repo, &name),
        Command::Auth(AuthCommand::Token { admin, pageserver, tenant, branch, expires_in }) => {
            let mut claims = if admin {
                auth::Claims::admin()
            } else if let Some(node) = pageserver {
                auth::Claims::pageserver(node)
            } else {
                let state = repo.load_state()?;
                let tenant = state.tenant(tenant)?;
                let claims = auth::Claims::tenant(tenant);
                match branch {
                    Some(b) => claims.with_timeline(state.branch_timeline(tenant, &b)?),
                    None => claims,
                }
            };
            if let Some(secs) = expires_in {
                claims = claims.expiring_in(secs);
            }
            match repo.token(&claims) {
                Some(token) => {
                    say!("{token}");
                    Ok(())
                }
                None => anyhow::bail!("this repo runs without authentication (fjord init --no-auth): there are no tokens"),
            }
        }
    }
}
