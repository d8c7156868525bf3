//! The repo directory: one local cluster's configuration, state, data and logs.
//!
//! ```text
//! <repo>/config.toml               base port, binary directories (fjord init)
//! <repo>/auth_private_key.pem      the key that signs every token (mode 0600; with auth on)
//! <repo>/auth_public_key.pem       the key the pageserver and safekeepers check tokens with
//! <repo>/tls/ca.crt, ca.key        the cluster CA (ca.key mode 0600; with TLS on)
//! <repo>/tls/<service>.crt, .key  each service's certificate (pageserver, safekeeper-N)
//! <repo>/state.json                branches and endpoints (state.rs)
//! <repo>/.lock                     held by commands that change state
//! <repo>/pageserver/               pageserver 1's work directory
//! <repo>/pageserver.log, .pid
//! <repo>/pageservers/ps<N>/        pageserver N's work directory (N >= 2)
//! <repo>/pageserver<N>.log, .pid   (N >= 2)
//! <repo>/storage_controller.log, .pid   the storage controller (2 or more pageservers)
//! <repo>/controller_db/            its database's data directory (unless configured)
//! <repo>/controller_db.log, .pid
//! <repo>/safekeepers/sk<N>/        safekeeper N's data directory
//! <repo>/safekeeper<N>.log, .pid
//! <repo>/endpoints/<name>/pgdata   refetched at every start
//! <repo>/endpoints/<name>/{compute_ctl.log, compute_ctl.pid, postgres.log, status.json}
//! <repo>/tmp/                      initdb scratch space for `tenant create`
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use pageserver_api::{Client, ClientConfig, ControllerClient};
use proto::TenantId;

use crate::config::RepoConfig;
use crate::process::Daemon;
use crate::state::{RepoLock, State};

pub struct Repo {
    pub dir: PathBuf,
    pub config: RepoConfig,
    /// Signs the tokens every process gets, when the repo has authentication on.
    signer: Option<auth::Signer>,
}

impl Repo {
    pub fn config_path(dir: &Path) -> PathBuf {
        dir.join("config.toml")
    }

    /// Opens an initialized repo.
    pub fn open(dir: &Path) -> anyhow::Result<Repo> {
        let config_path = Repo::config_path(dir);
        if !config_path.exists() {
            bail!("no fjord repo at {} (no config.toml): run `fjord init` first, or pass --repo / set FJORD_REPO_DIR", dir.display());
        }
        let config = RepoConfig::load(&config_path)?;
        let signer = match config.auth {
            false => None,
            true => Some(
                auth::Signer::load(&dir.join(auth::PRIVATE_KEY_FILE))
                    .context("load the repo's private key (config.toml has auth = true: every process needs a token signed with it)")?,
            ),
        };
        Ok(Repo { dir: dir.to_path_buf(), config, signer })
    }

    pub fn public_key_path(&self) -> PathBuf {
        self.dir.join(auth::PUBLIC_KEY_FILE)
    }

    /// A token with `claims`, or `None` when the repo has authentication off.
    pub fn token(&self, claims: &auth::Claims) -> Option<String> {
        self.signer.as_ref().map(|s| s.sign(claims))
    }

    /// With authentication on: `--auth-public-key` and a token with `claims` in
    /// `FJORD_AUTH_TOKEN` (the environment, not the command line, which every user sees).
    pub fn with_auth(&self, cmd: &mut std::process::Command, claims: &auth::Claims) {
        if let Some(token) = self.token(claims) {
            cmd.arg("--auth-public-key").arg(self.public_key_path()).env(auth::TOKEN_ENV, token);
        }
    }

    /// The CLI's own token: it manages everything.
    pub fn admin_token(&self) -> Option<String> {
        self.token(&auth::Claims::admin())
    }

    /// Whether the repo's services run with TLS.
    pub fn tls_on(&self) -> bool {
        self.config.tls == Some(true)
    }

    /// The TLS flags of service `name` (`pageserver`, `safekeeper-N`): its certificate and
    /// key, the CA too if it also calls other services (`with_ca`), or `--no-tls`.
    pub fn server_tls_args(&self, name: &str, with_ca: bool) -> Vec<String> {
        if !self.tls_on() {
            self.say_if_made_before_tls(name);
            return vec!["--no-tls".to_string()];
        }
        let (cert, key) = crate::certs::service_files(&self.dir, name);
        let mut args = tls::args::ServerArgs { tls_cert: Some(cert), tls_key: Some(key), no_tls: false }.to_args();
        if with_ca {
            args.extend(["--tls-ca".to_string(), self.ca_cert_path().display().to_string()]);
        }
        args
    }

    /// The TLS flags of a client of the services (compute_ctl): the CA, or `--no-tls`.
    pub fn client_tls_args(&self, name: &str) -> Vec<String> {
        if !self.tls_on() {
            self.say_if_made_before_tls(name);
        }
        let ca = self.tls_on().then(|| self.ca_cert_path());
        tls::args::ClientArgs { tls_ca: ca, no_tls: !self.tls_on() }.to_args()
    }

    fn say_if_made_before_tls(&self, name: &str) {
        if self.config.tls.is_none() {
            tracing::warn!(
                "this repo was made before TLS existed (config.toml has no tls setting, there is no tls/ directory): the {name} runs with --no-tls"
            );
        }
    }

    pub fn ca_cert_path(&self) -> PathBuf {
        crate::certs::ca_cert(&self.dir)
    }

    /// The repo's trust in its CA, for its own clients; `None` with TLS off.
    pub fn client_tls(&self) -> anyhow::Result<Option<tls::ClientTls>> {
        if !self.tls_on() {
            return Ok(None);
        }
        Ok(Some(tls::ClientTls::load(&self.ca_cert_path()).context("load the repo's cluster CA")?))
    }

    pub fn state_path(&self) -> PathBuf {
        self.dir.join("state.json")
    }

    pub fn load_state(&self) -> anyhow::Result<State> {
        State::load(&self.state_path())
    }

    pub fn save_state(&self, state: &State) -> anyhow::Result<()> {
        state.save(&self.state_path())
    }

    pub fn lock(&self) -> anyhow::Result<RepoLock> {
        RepoLock::acquire(&self.dir.join(".lock"))
    }

    /// Pageserver `id`'s work directory: `pageserver/` for the first (where a repo with one
    /// pageserver has it), `pageservers/ps<N>/` for the others.
    pub fn pageserver_workdir_in(dir: &Path, id: u64) -> PathBuf {
        match id {
            1 => dir.join("pageserver"),
            n => dir.join("pageservers").join(format!("ps{n}")),
        }
    }

    pub fn pageserver_workdir(&self, id: u64) -> PathBuf {
        Repo::pageserver_workdir_in(&self.dir, id)
    }

    /// Pageserver `id` as a process: `pageserver.pid` and `.log` for the first,
    /// `pageserver<N>.pid` and `.log` for the others.
    pub fn pageserver(&self, id: u64) -> Daemon {
        let stem = if id == 1 { "pageserver".to_string() } else { format!("pageserver{id}") };
        Daemon {
            pid_file: self.dir.join(format!("{stem}.pid")),
            log_file: self.dir.join(format!("{stem}.log")),
            exe_name: "pageserver".into(),
        }
    }

    pub fn controller(&self) -> Daemon {
        Daemon {
            pid_file: self.dir.join("storage_controller.pid"),
            log_file: self.dir.join("storage_controller.log"),
            exe_name: "storage_controller".into(),
        }
    }

    pub fn controller_db_dir(&self) -> PathBuf {
        self.dir.join("controller_db")
    }

    /// The controller's database's postmaster (the CLI's own pid file: postgres keeps
    /// `postmaster.pid` inside the data directory).
    pub fn controller_db(&self) -> Daemon {
        Daemon { pid_file: self.dir.join("controller_db.pid"), log_file: self.dir.join("controller_db.log"), exe_name: "postgres".into() }
    }

    pub fn safekeeper_dir_in(dir: &Path, id: u8) -> PathBuf {
        dir.join("safekeepers").join(format!("sk{id}"))
    }

    pub fn safekeeper_dir(&self, id: u8) -> PathBuf {
        Repo::safekeeper_dir_in(&self.dir, id)
    }

    pub fn safekeeper(&self, id: u8) -> Daemon {
        Daemon {
            pid_file: self.dir.join(format!("safekeeper{id}.pid")),
            log_file: self.dir.join(format!("safekeeper{id}.log")),
            exe_name: "safekeeper".into(),
        }
    }

    fn client_config(&self) -> ClientConfig {
        ClientConfig {
            connect_timeout: Duration::from_secs(5),
            // Import of a large data directory takes a while; nothing else does.
            request_timeout: Some(Duration::from_secs(600)),
            // A CA file that does not load leaves the client without one: its https
            // requests then fail saying that the CA is missing.
            tls: self.client_tls().unwrap_or(None),
        }
    }

    /// The client of pageserver `id`'s API.
    pub fn api_of(&self, id: u64) -> Client {
        self.api_at(&self.config.pageserver_http_url(id))
    }

    /// The client of the pageserver API at `url`.
    pub fn api_at(&self, url: &str) -> Client {
        Client::with_config(url, self.client_config()).with_token(self.admin_token())
    }

    /// The client of this repo's pageserver (the first one).
    pub fn api(&self) -> Client {
        self.api_of(1)
    }

    /// The API of the pageserver that serves `tenant`, which must be up, with a hint if it
    /// is not: with a storage controller, the one it says computes read the tenant from
    /// (the attached one, or a planned migration's source until it cuts over); else the
    /// repo's pageserver.
    pub fn tenant_api(&self, tenant: TenantId) -> anyhow::Result<Client> {
        if !self.config.has_controller() {
            return self.running_api();
        }
        let location = self.locate(tenant)?;
        let serving = location.page_service();
        let api = self.api_at(&self.config.http_url_of(&serving.http_addr));
        if !is_up(&api) {
            bail!(
                "pageserver {} holds tenant {tenant} but is not running (nothing answers {}): run `fjord pageserver start {0}`, or wait for the controller to fail the tenant over",
                serving.node_id,
                api.base_url()
            );
        }
        Ok(api)
    }

    /// The API of a pageserver that must be up, with a hint if it is not.
    pub fn running_api(&self) -> anyhow::Result<Client> {
        let api = self.api();
        if !is_up(&api) {
            bail!("the pageserver is not running (nothing answers {}): run `fjord start`", api.base_url());
        }
        Ok(api)
    }

    /// Where the storage controller has `tenant` attached.
    pub fn locate(&self, tenant: TenantId) -> anyhow::Result<pageserver_api::controller::TenantLocation> {
        self.controller_api().tenant(tenant).map_err(|e| match e.status() {
            Some(404) => anyhow::anyhow!("the storage controller has no tenant {tenant}"),
            _ => anyhow::anyhow!("ask the storage controller where tenant {tenant} is (is it running? `fjord start`): {e}"),
        })
    }

    /// The client of the storage controller's API, with the CLI's admin token.
    pub fn controller_api(&self) -> ControllerClient {
        let config = ClientConfig { request_timeout: Some(Duration::from_secs(30)), ..self.client_config() };
        ControllerClient::with_config(&self.config.controller_url(), config).with_token(self.admin_token())
    }

    pub fn endpoint_dir(&self, name: &str) -> PathBuf {
        self.dir.join("endpoints").join(name)
    }

    pub fn endpoint(&self, name: &str) -> Daemon {
        let dir = self.endpoint_dir(name);
        Daemon { pid_file: dir.join("compute_ctl.pid"), log_file: dir.join("compute_ctl.log"), exe_name: "compute_ctl".into() }
    }

    pub fn tmp_dir(&self) -> PathBuf {
        self.dir.join("tmp")
    }
}

/// True if the pageserver answers `/v1/status`.
pub fn is_up(api: &Client) -> bool {
    api.status().is_ok_and(|s| s.status == "ok")
}

/// The repo directory: `--repo`, else `$FJORD_REPO_DIR`, else `./.fjord` (clap does the
/// first two). Made absolute so that paths handed to the pageserver and to background
/// processes do not depend on their working directory.
pub fn resolve_dir(given: &Path) -> anyhow::Result<PathBuf> {
    std::path::absolute(given).with_context(|| format!("make {} absolute", given.display()))
}
