//! The pageserver's configuration: one typed struct, read from a TOML file, overridden by
//! command-line flags, with defaults that work on a laptop.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use layerstore::StorageConfig;
use pageserver_api::time::HumanDuration;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PageserverConfig {
    /// Where tenants live: `<workdir>/tenants/<tenant id>/timelines/<timeline id>/`.
    pub workdir: PathBuf,
    /// The page service (computes' GetPage@LSN).
    pub listen_pg_addr: SocketAddr,
    /// The HTTP management API and `/metrics`.
    pub listen_http_addr: SocketAddr,
    /// The bin directory of fjord's PostgreSQL build; its `postgres` runs WAL redo.
    pub pg_bin_dir: PathBuf,
    pub wal_redo_processes_max: usize,
    pub wal_redo_timeout_ms: u64,
    /// How long a page request waits for its not-modified-since LSN to be ingested.
    pub wait_lsn_timeout_ms: u64,
    /// Object storage under the local disk, the durable copy of every layer:
    /// `file:///absolute/dir` or `s3://bucket/prefix?endpoint=http://host:port&region=...`
    /// (credentials from `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`). Unset: local disk
    /// only, the pageserver's one copy.
    pub remote_storage: Option<String>,
    /// Local disk budget for layer files. A download of an evicted layer first evicts
    /// layers that remote storage holds, least recently used first, until it fits; every
    /// `eviction_period_ms`, above 90% of it, they are evicted down to 80%
    /// (`service::eviction`). Unset: no budget. Needs `remote_storage`.
    pub layer_disk_budget_bytes: Option<u64>,
    /// How often eviction checks the budget.
    pub eviction_period_ms: u64,
    /// Memory for decompressed layer file blocks that page reads reuse (the next block of
    /// a scan, every read's relation directory and size); 0 turns the cache off.
    pub block_cache_bytes: usize,
    /// At a clean shutdown, how long to wait for uploads to finish after the final flush.
    pub shutdown_upload_timeout_ms: u64,
    pub storage: StorageConfig,
    /// Whether the pageserver runs compaction, image layer creation and GC on its own
    /// (`service::background`). Off for tests that trigger them through the API alone.
    pub background_jobs_enabled: bool,
    /// How often the background jobs look at every timeline.
    pub background_job_period_ms: u64,
    /// After a start, how long the background jobs run no GC: LSN leases (read replicas'
    /// holds on their replay positions) live in memory, and their holders need this long
    /// to renew them. The management API's GC is not held back.
    pub gc_lease_grace_ms: u64,
    /// How far back in time GC keeps every timeline readable, for tenants that set no
    /// window of their own (`PUT /v1/tenant/{tenant}/config`): `7d`, `12h`, `30s` ...
    pub pitr_window: HumanDuration,
    /// The most key ranges image layer creation rebuilds per timeline and run: bounds the
    /// work (and the WAL redo) of one run; deeper ranges go first.
    pub image_creation_ranges_per_run: usize,
    /// Whether the materializer thread folds the keys the engine queues for their long
    /// chains of records (`[storage] fold_after_records` and `fold_after_bytes`) into
    /// images (`service::materializer`).
    pub materializer_enabled: bool,
    /// The share of one core the materializer's folds may take (0 < share <= 1).
    pub materializer_cpu_share: f64,
    /// Whether a GetPage that replayed at least `fold_after_records` records stores its
    /// page as an image of the newest record (no redo of its own).
    pub fold_read_writeback: bool,
    /// The cluster's Ed25519 public key (PEM), which every token must verify with: the
    /// page service then wants a tenant token in `Hello`, and the management API an
    /// `Authorization: Bearer` token (admin, or the tenant's for the calls a compute
    /// makes). Unset: no authentication, every client is trusted (logged at start).
    pub auth_public_key_path: Option<PathBuf>,
    /// TLS (`--tls-cert`, `--tls-key`, `--tls-ca` or `--no-tls`, flags only): the server
    /// certificate of the page service and the management API, and the cluster CA that
    /// the safekeepers' certificates must be signed by. Loaded by the binary at start.
    #[serde(skip)]
    pub tls: tls::Tls,
    /// The storage controller's base URL (`https://host:port`). With it the pageserver
    /// registers as `node_id` at start, attaches only the tenants the controller places on
    /// it, with the generations the controller issues, and takes its orders
    /// (`PUT /v1/tenant/{tenant}/location`). Needs `node_id` and `remote_storage`. Unset:
    /// every tenant on local disk and in remote storage is attached, each claiming its
    /// generation in remote storage itself.
    pub controller_url: Option<String>,
    /// This pageserver's id at the controller: stable across restarts, one per host.
    pub node_id: Option<u64>,
    /// Under a controller: how often each attached tenant's heatmap (its layers, the most
    /// recently read first) is published to object storage for its secondary.
    pub heatmap_period_ms: u64,
    /// Under a controller: how often a secondary reads its tenants' heatmaps and downloads
    /// the layers it lacks.
    pub secondary_download_period_ms: u64,
    /// The most bytes of warm layer copies kept per tenant held as secondary (the hottest
    /// first).
    pub secondary_disk_budget_bytes: u64,
    /// `host:port` that computes dial for the page service (default: `listen_pg_addr`).
    pub advertise_pg_addr: Option<String>,
    /// `host:port` that the controller dials for the HTTP API (default: `listen_http_addr`).
    pub advertise_http_addr: Option<String>,
    /// The pageserver's own token (from `FJORD_AUTH_TOKEN`, never from the file, and only
    /// with `controller_url`): presented to the controller, and to safekeepers registered
    /// without a token (those restored from a timeline's remote index). This node's own
    /// storage token (`fjord auth token --pageserver ID`).
    #[serde(skip)]
    pub auth_token: Option<String>,
}

impl Default for PageserverConfig {
    fn default() -> Self {
        PageserverConfig {
            workdir: PathBuf::from(".fjord/pageserver"),
            listen_pg_addr: "127.0.0.1:64000".parse().expect("valid address"),
            listen_http_addr: "127.0.0.1:9898".parse().expect("valid address"),
            pg_bin_dir: PathBuf::from("target/pg15/bin"),
            wal_redo_processes_max: 4,
            wal_redo_timeout_ms: 30_000,
            wait_lsn_timeout_ms: 60_000,
            remote_storage: None,
            layer_disk_budget_bytes: None,
            eviction_period_ms: 5_000,
            block_cache_bytes: layerstore::layer::block_cache::DEFAULT_CAPACITY_BYTES,
            shutdown_upload_timeout_ms: 30_000,
            storage: StorageConfig::default(),
            background_jobs_enabled: true,
            background_job_period_ms: 10_000,
            gc_lease_grace_ms: 30_000,
            pitr_window: HumanDuration(Duration::from_secs(7 * 24 * 3600)),
            image_creation_ranges_per_run: 2,
            materializer_enabled: true,
            materializer_cpu_share: 0.25,
            fold_read_writeback: true,
            auth_public_key_path: None,
            tls: tls::Tls::default(),
            controller_url: None,
            node_id: None,
            heatmap_period_ms: 30_000,
            secondary_download_period_ms: 10_000,
            secondary_disk_budget_bytes: 4 << 30,
            advertise_pg_addr: None,
            advertise_http_addr: None,
            auth_token: None,
        }
    }
}

impl PageserverConfig {
    /// Reads a TOML file; every field is optional and defaults as above.
    pub fn load(path: &Path) -> anyhow::Result<PageserverConfig> {
        let text = std::fs::read_to_string(path).with_context(|| format!("read config file {}", path.display()))?;
        let conf: PageserverConfig = toml::from_str(&text).with_context(|| format!("parse config file {}", path.display()))?;
        Ok(conf)
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.wal_redo_processes_max > 0, "wal_redo_processes_max must be at least 1");
        anyhow::ensure!(self.wal_redo_timeout_ms > 0, "wal_redo_timeout_ms must be positive");
        anyhow::ensure!(self.listen_pg_addr != self.listen_http_addr, "listen_pg_addr and listen_http_addr must differ");
        anyhow::ensure!(
            self.layer_disk_budget_bytes.is_none() || self.remote_storage.is_some(),
            "layer_disk_budget_bytes needs remote_storage: without it, local disk holds the only copy of every layer"
        );
        anyhow::ensure!(self.eviction_period_ms > 0, "eviction_period_ms must be positive");
        anyhow::ensure!(self.heatmap_period_ms > 0, "heatmap_period_ms must be positive");
        anyhow::ensure!(self.secondary_download_period_ms > 0, "secondary_download_period_ms must be positive");
        anyhow::ensure!(self.background_job_period_ms > 0, "background_job_period_ms must be positive");
        anyhow::ensure!(self.image_creation_ranges_per_run > 0, "image_creation_ranges_per_run must be at least 1");
        if self.controller_url.is_some() {
            anyhow::ensure!(self.node_id.is_some(), "controller_url needs node_id: the controller knows each pageserver by its id");
            anyhow::ensure!(
                self.remote_storage.is_some(),
                "controller_url needs remote_storage: a tenant moves between pageservers through remote storage"
            );
        }
        anyhow::ensure!(
            self.materializer_cpu_share > 0.0 && self.materializer_cpu_share <= 1.0,
            "materializer_cpu_share must be above 0 and at most 1, not {}",
            self.materializer_cpu_share
        );
        self.storage.validate()
    }

    /// The page service address computes dial.
    pub fn advertised_pg_addr(&self) -> String {
        self.advertise_pg_addr.clone().unwrap_or_else(|| self.listen_pg_addr.to_string())
    }

    /// The HTTP API address the controller dials.
    pub fn advertised_http_addr(&self) -> String {
        self.advertise_http_addr.clone().unwrap_or_else(|| self.listen_http_addr.to_string())
    }

    pub fn tenants_dir(&self) -> PathBuf {
        self.workdir.join("tenants")
    }

    pub fn wal_redo_timeout(&self) -> Duration {
        Duration::from_millis(self.wal_redo_timeout_ms)
    }

    pub fn shutdown_upload_timeout(&self) -> Duration {
        Duration::from_millis(self.shutdown_upload_timeout_ms)
    }

    pub fn wait_lsn_timeout(&self) -> Duration {
        Duration::from_millis(self.wait_lsn_timeout_ms)
    }

    pub fn background_job_period(&self) -> Duration {
        Duration::from_millis(self.background_job_period_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_fill_in_what_a_file_leaves_out() {
        let conf: PageserverConfig = toml::from_str("listen_pg_addr = '127.0.0.1:7000'\n[storage]\ngc_horizon_bytes = 1024\n").unwrap();
        assert_eq!(conf.listen_pg_addr.port(), 7000);
        assert_eq!(conf.storage.gc_horizon_bytes, 1024);
        assert_eq!(conf.wal_redo_processes_max, PageserverConfig::default().wal_redo_processes_max);
        conf.validate().unwrap();
    }

    #[test]
    fn unknown_and_bad_settings_are_refused() {
        let err = toml::from_str::<PageserverConfig>("listen_pg_adr = '127.0.0.1:7000'").unwrap_err();
        assert!(err.to_string().contains("listen_pg_adr"), "{err}");
        let err = toml::from_str::<PageserverConfig>("listen_pg_addr = 'nowhere'").unwrap_err();
        assert!(err.to_string().contains("listen_pg_addr"), "{err}");
        let conf = PageserverConfig { wal_redo_processes_max: 0, ..Default::default() };
        assert!(conf.validate().unwrap_err().to_string().contains("wal_redo_processes_max"));
        let conf = PageserverConfig { layer_disk_budget_bytes: Some(1 << 30), ..Default::default() };
        assert!(conf.validate().unwrap_err().to_string().contains("needs remote_storage"));
        let conf = PageserverConfig { background_job_period_ms: 0, ..Default::default() };
        assert_eq!(conf.validate().unwrap_err().to_string(), "background_job_period_ms must be positive");
        let conf = PageserverConfig { image_creation_ranges_per_run: 0, ..Default::default() };
        assert_eq!(conf.validate().unwrap_err().to_string(), "image_creation_ranges_per_run must be at least 1");
        let err = toml::from_str::<PageserverConfig>("pitr_window = '7 days'").unwrap_err();
        assert!(err.to_string().contains("invalid duration \"7 days\""), "{err}");
        let err = toml::from_str::<PageserverConfig>("pitr_window = 3600").unwrap_err();
        assert!(err.to_string().contains("pitr_window"), "{err}");
        let err = toml::from_str::<PageserverConfig>("[storage]\nimage_creation_threshold = 0").map(|c| c.validate()).unwrap().unwrap_err();
        assert_eq!(err.to_string(), "image_creation_threshold must be at least 1");
        let conf = PageserverConfig { materializer_cpu_share: 0.0, ..Default::default() };
        assert_eq!(conf.validate().unwrap_err().to_string(), "materializer_cpu_share must be above 0 and at most 1, not 0");
        let err = toml::from_str::<PageserverConfig>("[storage]\nfold_after_records = 1").map(|c| c.validate()).unwrap().unwrap_err();
        assert!(err.to_string().contains("fold_after_records"), "{err}");
    }

    #[test]
    fn background_jobs_settings() {
        let conf = PageserverConfig::default();
        assert!(conf.background_jobs_enabled);
        assert_eq!((conf.background_job_period(), conf.pitr_window.to_string()), (Duration::from_secs(10), "7d".to_string()));
        assert_eq!(conf.storage.image_creation_threshold, 3);
        let conf: PageserverConfig = toml::from_str(
            "background_jobs_enabled = false\nbackground_job_period_ms = 200\npitr_window = '1s'\n[storage]\nimage_creation_threshold = 1\n",
        )
        .unwrap();
        conf.validate().unwrap();
        assert!(!conf.background_jobs_enabled);
        assert_eq!(
            (conf.background_job_period_ms, conf.pitr_window.0, conf.storage.image_creation_threshold),
            (200, Duration::from_secs(1), 1)
        );
        // What --print-config shows reads back as the same configuration.
        let printed = toml::to_string(&conf).unwrap();
        assert!(printed.contains("pitr_window = \"1s\""), "{printed}");
        assert_eq!(toml::from_str::<PageserverConfig>(&printed).unwrap(), conf);
    }
}
