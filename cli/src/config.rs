//! A repo's `config.toml`: what `fjord init` decided, read by every later command.
//!
//! Only the base port is stored; every port is derived from it by the functions here, so
//! two repos with base ports at least [`PORTS_PER_REPO`] apart never collide:
//!
//! | port | what |
//! |---|---|
//! | base | pageserver page service |
//! | base + 1 | pageserver HTTP management API |
//! | base + 2 + 2i | safekeeper i+1: proposer and replication protocols (i = 0..3) |
//! | base + 3 + 2i | safekeeper i+1: HTTP API |
//! | base + 10 .. base + 99 | endpoints (computes), in order of creation |

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

/// Ports a repo may use, starting at its base port.
pub const PORTS_PER_REPO: u16 = 100;
const FIRST_ENDPOINT_OFFSET: u16 = 10;
pub const DEFAULT_BASE_PORT: u16 = 15000;
/// How many safekeepers a repo runs unless `fjord init --safekeepers` says otherwise.
pub const DEFAULT_SAFEKEEPERS: u8 = 3;
/// The most safekeepers the port plan has room for.
pub const MAX_SAFEKEEPERS: u8 = 4;

fn default_safekeepers() -> u8 {
    DEFAULT_SAFEKEEPERS
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
        Ok(format!(
            "# fjord repo configuration, written by `fjord init`.\n\
             # Ports: page service = base_port, HTTP API = base_port + 1, safekeeper N = base_port + 2N\n\
             # (and its HTTP API base_port + 2N + 1), endpoints from base_port + 10.\n{body}"
        ))
    }

    pub fn pageserver_pg_port(&self) -> u16 {
        self.base_port
    }

    pub fn pageserver_http_port(&self) -> u16 {
        self.base_port + 1
    }

    pub fn pageserver_pg_addr(&self) -> String {
        format!("127.0.0.1:{}", self.pageserver_pg_port())
    }

    /// `https` with TLS on: every HTTP API then serves nothing else.
    fn http_scheme(&self) -> &'static str {
        if self.tls == Some(true) {
            "https"
        } else {
            "http"
        }
    }

    pub fn pageserver_http_url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.http_scheme(), self.pageserver_http_port())
    }

    /// The ports endpoints may use, lowest first.
    pub fn endpoint_ports(&self) -> std::ops::Range<u16> {
        self.base_port + FIRST_ENDPOINT_OFFSET..self.base_port + PORTS_PER_REPO
    }

    pub fn pageserver_bin(&self) -> PathBuf {
        self.fjord_bin_dir.join("pageserver")
    }

    pub fn compute_ctl_bin(&self) -> PathBuf {
        self.fjord_bin_dir.join("compute_ctl")
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
        assert_eq!(c.pageserver_pg_port(), 15000);
        assert_eq!(c.pageserver_http_port(), 15001);
        assert_eq!(c.pageserver_http_url(), "http://127.0.0.1:15001");
        let tls = RepoConfig { tls: Some(true), ..conf(15000) };
        assert_eq!(tls.pageserver_http_url(), "https://127.0.0.1:15001");
        assert_eq!(tls.safekeeper_http_url(2), "https://127.0.0.1:15005");
        assert_eq!(c.endpoint_ports(), 15010..15100);
        assert_eq!((c.safekeeper_port(1), c.safekeeper_http_port(1)), (15002, 15003));
        assert_eq!((c.safekeeper_port(3), c.safekeeper_http_port(3)), (15006, 15007));
        assert_eq!(c.safekeepers_list(), "127.0.0.1:15002,127.0.0.1:15004,127.0.0.1:15006");
        // The most safekeepers still end below the endpoints.
        let four = RepoConfig::new(15000, "/a".into(), "/b".into(), MAX_SAFEKEEPERS).unwrap();
        assert!(four.safekeeper_http_port(MAX_SAFEKEEPERS) < four.endpoint_ports().start);
        // Two repos a PORTS_PER_REPO apart share no port.
        let other = conf(15000 + PORTS_PER_REPO);
        assert!(other.pageserver_pg_port() >= c.endpoint_ports().end);
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
