//! A repo's `config.toml`: what `fjord init` decided, read by every later command.
//!
//! Only the base port is stored; every port is derived from it by the functions here, so
//! two repos with base ports at least [`PORTS_PER_REPO`] apart never collide:
//!
//! | port | what |
//! |---|---|
//! | base | pageserver 1: page service |
//! | base + 1 | pageserver 1: HTTP management API |
//! | base + 2 + 2i | safekeeper i+1: proposer and replication protocols (i = 0..3) |
//! | base + 3 + 2i | safekeeper i+1: HTTP API |
//! | base + 10 .. base + 69 | endpoints (computes), in order of creation |
//! | base + 70 | storage controller: HTTP API (a repo with 2 or more pageservers) |
//! | base + 71 | the storage controller's database (a plain PostgreSQL the repo runs) |
//! | base + 72 + 2(n-2) | pageserver n: page service (n = 2..=15) |
//! | base + 73 + 2(n-2) | pageserver n: HTTP management API |
//!
//! Pageserver 1 keeps the ports it has in a repo without a controller, so a repo with one
//! pageserver is exactly what it always was.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

/// Ports a repo may use, starting at its base port.
pub const PORTS_PER_REPO: u16 = 100;
const FIRST_ENDPOINT_OFFSET: u16 = 10;
/// Endpoints take the ports below this offset.
const CONTROLLER_OFFSET: u16 = 70;
const CONTROLLER_DB_OFFSET: u16 = 71;
/// Pageserver 2's page service; each further pageserver takes the next two ports.
const SECOND_PAGESERVER_OFFSET: u16 = 72;
/// The most pageservers the port plan has room for (node ids 1..=15).
pub const MAX_PAGESERVERS: u8 = 1 + ((PORTS_PER_REPO - SECOND_PAGESERVER_OFFSET) / 2) as u8;
pub const DEFAULT_BASE_PORT: u16 = 15000;
/// How many safekeepers a repo runs unless `fjord init --safekeepers` says otherwise.
pub const DEFAULT_SAFEKEEPERS: u8 = 3;
/// The most safekeepers the port plan has room for.
pub const MAX_SAFEKEEPERS: u8 = 4;

fn default_safekeepers() -> u8 {
    DEFAULT_SAFEKEEPERS
}

fn default_pageservers() -> u8 {
    1
}

fn is_one(n: &u8) -> bool {
    *n == 1
}

/// The storage controller of a repo with several pageservers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControllerConfig {
    /// A connection string of an existing PostgreSQL for the controller's tables; absent:
    /// the repo runs a small PostgreSQL of its own (`controller_db/`, port base + 71).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepoConfig {
    pub base_port: u16,
    /// Bin directory of fjord's PostgreSQL build (initdb, postgres, pg_isready).
    pub pg_bin_dir: PathBuf,
    /// Where `pageserver`, `safekeeper` and `compute_ctl` are.
    pub fjord_bin_dir: PathBuf,
    /// How many safekeepers; 0 = none: computes send WAL straight to the pageserver (their
    /// synchronous standby), with no quorum and no fencing.
    #[serde(default = "default_safekeepers")]
    pub safekeepers: u8,
    /// The pageserver's object storage (`file:///...` or `s3://bucket/prefix?...`); `fjord
    /// init` puts a local directory in the repo unless told otherwise. Absent in repos made
    /// before object storage existed: the pageserver then keeps layers on local disk only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_storage: Option<String>,
    /// Local disk budget for the pageserver's layer files (bytes); unset: no budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_disk_budget_bytes: Option<u64>,
    /// Whether the pageserver and the safekeepers require tokens signed with the repo's
    /// key pair (`auth_private_key.pem`, `auth_public_key.pem`). `fjord init` turns it on
    /// unless told `--no-auth`; absent (false) in repos made before authentication existed.
    #[serde(default)]
    pub auth: bool,
    /// Whether every link is TLS, with the files in `tls/` (the cluster CA and a
    /// certificate per service). `fjord init` turns it on unless told `--no-tls`; absent
    /// in repos made before TLS existed, whose services then run with `--no-tls` (said in
    /// a log line when they start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<bool>,
    /// How many pageservers (node ids 1..=pageservers). Absent: one, as in every repo made
    /// before a repo could run several.
    #[serde(default = "default_pageservers", skip_serializing_if = "is_one")]
    pub pageservers: u8,
    /// The storage controller, in a repo with two or more pageservers: it places tenants,
    /// and fails them over when a pageserver dies. Absent: no controller (one pageserver,
    /// which holds every tenant).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller: Option<ControllerConfig>,
}

impl RepoConfig {
    pub fn new(base_port: u16, pg_bin_dir: PathBuf, fjord_bin_dir: PathBuf, safekeepers: u8) -> anyhow::Result<RepoConfig> {
        let conf = RepoConfig {
            base_port,
            pg_bin_dir,
            fjord_bin_dir,
            safekeepers,
            remote_storage: None,
            layer_disk_budget_bytes: None,
            auth: false,
            tls: None,
            pageservers: 1,
            controller: None,
        };
        conf.validate()?;
        Ok(conf)
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        if self.base_port < 1024 {
            bail!("invalid base port {}: it must be at least 1024 (ports below need root)", self.base_port);
        }
        if u32::from(self.base_port) + u32::from(PORTS_PER_REPO) > 65536 {
            bail!("invalid base port {}: it must leave room for {PORTS_PER_REPO} ports below 65536", self.base_port);
        }
        if self.safekeepers > MAX_SAFEKEEPERS {
            bail!("invalid number of safekeepers {}: at most {MAX_SAFEKEEPERS} (3 is the usual quorum)", self.safekeepers);
        }
        check_pageservers(self.pageservers)?;
        if self.pageservers > 1 && self.controller.is_none() {
            bail!("{} pageservers need a storage controller, and there is no [controller] section", self.pageservers);
        }
        Ok(())
    }

    pub fn load(path: &Path) -> anyhow::Result<RepoConfig> {
        let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        let conf: RepoConfig = toml::from_str(&text).with_context(|| format!("parse {}", path.display()))?;
        conf.validate().with_context(|| format!("check {}", path.display()))?;
        Ok(conf)
    }

    pub fn to_toml(&self) -> anyhow::Result<String> {
        let body = toml::to_string(self).context("render config.toml")?;
        let several = if self.controller.is_some() {
            "# The storage controller = base_port + 70, its database base_port + 71, pageserver N >= 2 =\n\
             # base_port + 72 + 2(N-2) (and its HTTP API one above).\n"
        } else {
            ""
        };
        Ok(format!(
            "# fjord repo configuration, written by `fjord init`.\n\
             # Ports: page service = base_port, HTTP API = base_port + 1, safekeeper N = base_port + 2N\n\
             # (and its HTTP API base_port + 2N + 1), endpoints from base_port + 10.\n{several}{body}"
        ))
    }

    /// Pageserver node ids: 1..=pageservers.
    pub fn pageserver_ids(&self) -> std::ops::RangeInclusive<u64> {
        1..=u64::from(self.pageservers)
    }

    /// The page service port of pageserver `id` (1-based).
    pub fn pageserver_pg_port(&self, id: u64) -> u16 {
        match id {
            1 => self.base_port,
            n => self.base_port + SECOND_PAGESERVER_OFFSET + 2 * (n as u16 - 2),
        }
    }

    pub fn pageserver_http_port(&self, id: u64) -> u16 {
        self.pageserver_pg_port(id) + 1
    }

    pub fn pageserver_pg_addr(&self, id: u64) -> String {
        format!("{}:{}", self.service_host(), self.pageserver_pg_port(id))
    }

    pub fn pageserver_http_addr(&self, id: u64) -> String {
        format!("{}:{}", self.service_host(), self.pageserver_http_port(id))
    }

    /// Whether the repo runs a storage controller.
    pub fn has_controller(&self) -> bool {
        self.controller.is_some()
    }

    pub fn controller_port(&self) -> u16 {
        self.base_port + CONTROLLER_OFFSET
    }

    pub fn controller_addr(&self) -> String {
        format!("{}:{}", self.service_host(), self.controller_port())
    }

    pub fn controller_url(&self) -> String {
        format!("{}://{}", self.http_scheme(), self.controller_addr())
    }

    pub fn controller_db_port(&self) -> u16 {
        self.base_port + CONTROLLER_DB_OFFSET
    }

    /// Whether the repo runs the controller's database itself (no `database` given).
    pub fn runs_controller_db(&self) -> bool {
        self.controller.as_ref().is_some_and(|c| c.database.is_none())
    }

    /// The connection string the controller gets: the configured one, else the repo's own
    /// database, reached as `user` (initdb's superuser).
    pub fn controller_database(&self, user: &str) -> Option<String> {
        let c = self.controller.as_ref()?;
        Some(match &c.database {
            Some(db) => db.clone(),
            None => format!("host={} port={} user={user} dbname=postgres", self.service_host(), self.controller_db_port()),
        })
    }

    /// `https` with TLS on: every HTTP API then serves nothing else.
    fn http_scheme(&self) -> &'static str {
        if self.tls == Some(true) {
            "https"
        } else {
            "http"
        }
    }

    pub fn pageserver_http_url(&self, id: u64) -> String {
        format!("{}://{}", self.http_scheme(), self.pageserver_http_addr(id))
    }

    /// The URL of an HTTP API at `addr` (`host:port`, as the controller names a node's).
    pub fn http_url_of(&self, addr: &str) -> String {
        format!("{}://{addr}", self.http_scheme())
    }

    /// The ports endpoints may use, lowest first.
    pub fn endpoint_ports(&self) -> std::ops::Range<u16> {
        self.base_port + FIRST_ENDPOINT_OFFSET..self.base_port + CONTROLLER_OFFSET
    }

    pub fn pageserver_bin(&self) -> PathBuf {
        self.fjord_bin_dir.join("pageserver")
    }

    pub fn compute_ctl_bin(&self) -> PathBuf {
        self.fjord_bin_dir.join("compute_ctl")
    }

    pub fn controller_bin(&self) -> PathBuf {
        self.fjord_bin_dir.join("storage_controller")
    }

    pub fn safekeeper_bin(&self) -> PathBuf {
        self.fjord_bin_dir.join("safekeeper")
    }

    /// Safekeeper ids: 1..=safekeepers.
    pub fn safekeeper_ids(&self) -> std::ops::RangeInclusive<u8> {
        1..=self.safekeepers
    }

    /// The port of safekeeper `id` (1-based) for proposers and replication clients.
    pub fn safekeeper_port(&self, id: u8) -> u16 {
        self.base_port + 2 * u16::from(id)
    }

    pub fn safekeeper_http_port(&self, id: u8) -> u16 {
        self.base_port + 2 * u16::from(id) + 1
    }

    /// The host every service of the repo listens on (and is reached at).
    pub fn service_host(&self) -> &'static str {
        "127.0.0.1"
    }

    pub fn safekeeper_addr(&self, id: u8) -> String {
        format!("{}:{}", self.service_host(), self.safekeeper_port(id))
    }

    pub fn safekeeper_http_url(&self, id: u8) -> String {
        format!("{}://127.0.0.1:{}", self.http_scheme(), self.safekeeper_http_port(id))
    }

    /// Every safekeeper's address, comma-separated, as compute_ctl takes them.
    pub fn safekeepers_list(&self) -> String {
        self.safekeeper_ids().map(|id| self.safekeeper_addr(id)).collect::<Vec<_>>().join(",")
    }
}

/// Refuses a number of pageservers the port plan has no room for.
pub fn check_pageservers(n: u8) -> anyhow::Result<()> {
    if n == 0 || n > MAX_PAGESERVERS {
        bail!("invalid number of pageservers {n}: from 1 to {MAX_PAGESERVERS} (the ports a repo has room for)");
    }
    Ok(())
}

/// The lowest endpoint port not in `taken`.
pub fn first_free_port(range: std::ops::Range<u16>, taken: &[u16]) -> anyhow::Result<u16> {
    let (start, end) = (range.start, range.end);
    range
        .into_iter()
        .find(|p| !taken.contains(p))
        .with_context(|| format!("every endpoint port ({start}..{end}) is taken; stop or remove an endpoint"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(base: u16) -> RepoConfig {
        RepoConfig::new(base, "/pg/bin".into(), "/fjord/bin".into(), 3).unwrap()
    }

    #[test]
    fn ports_derive_from_the_base_port() {
        let c = conf(15000);
        assert_eq!(c.pageserver_pg_port(1), 15000);
        assert_eq!(c.pageserver_http_port(1), 15001);
        assert_eq!(c.pageserver_http_url(1), "http://127.0.0.1:15001");
        let tls = RepoConfig { tls: Some(true), ..conf(15000) };
        assert_eq!(tls.pageserver_http_url(1), "https://127.0.0.1:15001");
        assert_eq!(tls.safekeeper_http_url(2), "https://127.0.0.1:15005");
        assert_eq!(c.endpoint_ports(), 15010..15070);
        assert_eq!((c.safekeeper_port(1), c.safekeeper_http_port(1)), (15002, 15003));
        assert_eq!((c.safekeeper_port(3), c.safekeeper_http_port(3)), (15006, 15007));
        assert_eq!(c.safekeepers_list(), "127.0.0.1:15002,127.0.0.1:15004,127.0.0.1:15006");
        // The most safekeepers still end below the endpoints.
        let four = RepoConfig::new(15000, "/a".into(), "/b".into(), MAX_SAFEKEEPERS).unwrap();
        assert!(four.safekeeper_http_port(MAX_SAFEKEEPERS) < four.endpoint_ports().start);
        // Two repos a PORTS_PER_REPO apart share no port.
        let other = conf(15000 + PORTS_PER_REPO);
        assert!(other.pageserver_pg_port(1) >= c.base_port + PORTS_PER_REPO);
    }

    #[test]
    fn several_pageservers_and_the_controller_fit_in_the_plan() {
        let c = RepoConfig { pageservers: MAX_PAGESERVERS, controller: Some(ControllerConfig::default()), ..conf(15000) };
        c.validate().unwrap();
        assert_eq!(MAX_PAGESERVERS, 15);
        assert_eq!((c.controller_port(), c.controller_db_port()), (15070, 15071));
        assert_eq!((c.pageserver_pg_port(2), c.pageserver_http_port(2)), (15072, 15073));
        assert_eq!(c.pageserver_http_port(u64::from(MAX_PAGESERVERS)), 15099);
        assert_eq!(c.controller_url(), "http://127.0.0.1:15070");
        assert_eq!(c.controller_database("me").unwrap(), "host=127.0.0.1 port=15071 user=me dbname=postgres");
        // Every port of the repo is used once, and all lie within its hundred.
        let mut ports: Vec<u16> = c.endpoint_ports().collect();
        for id in c.pageserver_ids() {
            ports.extend([c.pageserver_pg_port(id), c.pageserver_http_port(id)]);
        }
        for id in 1..=MAX_SAFEKEEPERS {
            ports.extend([c.safekeeper_port(id), c.safekeeper_http_port(id)]);
        }
        ports.extend([c.controller_port(), c.controller_db_port()]);
        let n = ports.len();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), n, "a port is used twice");
        assert!(ports.iter().all(|p| (15000..15100).contains(p)));
        // More pageservers than that, or several without a controller, are refused.
        let more = RepoConfig { pageservers: MAX_PAGESERVERS + 1, ..c.clone() };
        assert!(more.validate().unwrap_err().to_string().contains("from 1 to 15"));
        let bare = RepoConfig { pageservers: 2, controller: None, ..conf(15000) };
        assert!(bare.validate().unwrap_err().to_string().contains("storage controller"));
    }

    #[test]
    fn one_pageserver_writes_the_config_it_always_did() {
        let text = conf(16000).to_toml().unwrap();
        assert!(!text.contains("pageservers") && !text.contains("controller"), "{text}");
        let two = RepoConfig { pageservers: 2, controller: Some(ControllerConfig { database: Some("host=db".into()) }), ..conf(16000) };
        let text = two.to_toml().unwrap();
        assert!(text.contains("pageservers = 2") && text.contains("[controller]"), "{text}");
        assert_eq!(toml::from_str::<RepoConfig>(&text).unwrap(), two);
    }

    #[test]
    fn base_ports_that_do_not_fit_are_refused() {
        assert!(RepoConfig::new(80, "/a".into(), "/b".into(), 3).unwrap_err().to_string().contains("at least 1024"));
        assert!(RepoConfig::new(65500, "/a".into(), "/b".into(), 3).unwrap_err().to_string().contains("below 65536"));
        RepoConfig::new(65436, "/a".into(), "/b".into(), 3).unwrap();
        assert!(RepoConfig::new(15000, "/a".into(), "/b".into(), 5).unwrap_err().to_string().contains("at most 4"));
    }

    #[test]
    fn free_ports_are_found_in_order() {
        let c = conf(20000);
        assert_eq!(first_free_port(c.endpoint_ports(), &[]).unwrap(), 20010);
        assert_eq!(first_free_port(c.endpoint_ports(), &[20010, 20012]).unwrap(), 20011);
        let all: Vec<u16> = c.endpoint_ports().collect();
        assert!(first_free_port(c.endpoint_ports(), &all).unwrap_err().to_string().contains("taken"));
    }

    #[test]
    fn config_round_trips_and_refuses_unknown_keys() {
        let c = conf(16000);
        let text = c.to_toml().unwrap();
        assert_eq!(toml::from_str::<RepoConfig>(&text).unwrap(), c);
        let err = toml::from_str::<RepoConfig>("base_prot = 1\npg_bin_dir = 'a'\nfjord_bin_dir = 'b'\n").unwrap_err();
        assert!(err.to_string().contains("base_prot"), "{err}");
        // A config written before safekeepers existed gets the default.
        let old: RepoConfig = toml::from_str("base_port = 16000\npg_bin_dir = 'a'\nfjord_bin_dir = 'b'\n").unwrap();
        assert_eq!(old.safekeepers, DEFAULT_SAFEKEEPERS);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(&path, "base_port = 10\npg_bin_dir = 'a'\nfjord_bin_dir = 'b'\n").unwrap();
        assert!(format!("{:#}", RepoConfig::load(&path).unwrap_err()).contains("at least 1024"));
    }
}
