//! Each tenant's own settings (`pageserver_api::models::TenantConfig`: today the PITR
//! window), set through the management API and persisted beside the engine's files.
//!
//! ```text
//! <workdir>/tenants/<tenant id>/tenant_config.json     this module's
//!                              /timelines/...           the engine's (layerstore)
//! ```
//! The file is replaced whole and atomically (`crashsafe`); a tenant without one uses the
//! pageserver's defaults. The engine reads only `timelines/` in a tenant directory, so the
//! file needs no declaring to it (unlike the service's entries inside a timeline directory,
//! `localwal::TIMELINE_DIR_ENTRIES`).
//!
//! Invariant: the map in memory is changed only after the file that says the same is
//! durable, so what a restart loads is what was last acknowledged.

use std::collections::HashMap;
use std::path::Path;
use std::sync::RwLock;

use anyhow::Context;
use pageserver_api::models::TenantConfig;
use proto::TenantId;

/// The file in a tenant's directory that holds its settings (JSON).
pub const TENANT_CONFIG_FILE_NAME: &str = "tenant_config.json";

/// The settings of every tenant that has any.
#[derive(Debug, Default)]
pub struct TenantConfs {
    confs: RwLock<HashMap<TenantId, TenantConfig>>,
}

impl TenantConfs {
    /// The tenant's settings (the defaults if it set none).
    pub fn get(&self, tenant: TenantId) -> TenantConfig {
        self.confs.read().unwrap_or_else(|e| e.into_inner()).get(&tenant).cloned().unwrap_or_default()
    }

    /// Reads `tenant_dir`'s settings file, if any, into the map (at load).
    pub fn load(&self, tenant: TenantId, tenant_dir: &Path) -> anyhow::Result<()> {
        let path = tenant_dir.join(TENANT_CONFIG_FILE_NAME);
        let tmp = crashsafe::temp_path(&path);
        if tmp.exists() {
            crashsafe::remove_temp(&tmp).with_context(|| format!("remove {}", tmp.display()))?;
        }
        let conf: TenantConfig = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).with_context(|| format!("parse {}", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e).with_context(|| format!("read {}", path.display())),
        };
        self.confs.write().unwrap_or_else(|e| e.into_inner()).insert(tenant, conf);
        Ok(())
    }

    /// Persists `conf` as the tenant's settings, then makes it the one in force.
    pub fn store(&self, tenant: TenantId, tenant_dir: &Path, conf: TenantConfig) -> anyhow::Result<()> {
        let path = tenant_dir.join(TENANT_CONFIG_FILE_NAME);
        let bytes = serde_json::to_vec(&conf).context("encode the tenant config")?;
        crashsafe::write_file_atomic(&path, &bytes).with_context(|| format!("write {}", path.display()))?;
        self.confs.write().unwrap_or_else(|e| e.into_inner()).insert(tenant, conf);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pageserver_api::time::HumanDuration;
    use std::time::Duration;

    #[test]
    fn settings_survive_a_reload_and_default_when_absent() {
        let dir = tempfile::tempdir().unwrap();
        let tenant = TenantId([1; 16]);
        let confs = TenantConfs::default();
        confs.load(tenant, dir.path()).unwrap();
        assert_eq!(confs.get(tenant), TenantConfig::default());
        let conf = TenantConfig { pitr_window: Some(HumanDuration(Duration::from_secs(1))) };
        confs.store(tenant, dir.path(), conf.clone()).unwrap();
        assert_eq!(std::fs::read_to_string(dir.path().join(TENANT_CONFIG_FILE_NAME)).unwrap(), r#"{"pitr_window":"1s"}"#);
        std::fs::write(crashsafe::temp_path(&dir.path().join(TENANT_CONFIG_FILE_NAME)), b"half").unwrap();
        let reloaded = TenantConfs::default();
        reloaded.load(tenant, dir.path()).unwrap();
        assert_eq!(reloaded.get(tenant), conf);
        assert!(!crashsafe::temp_path(&dir.path().join(TENANT_CONFIG_FILE_NAME)).exists(), "a crash leftover is removed");
        std::fs::write(dir.path().join(TENANT_CONFIG_FILE_NAME), br#"{"pitr":"1s"}"#).unwrap();
        let err = TenantConfs::default().load(tenant, dir.path()).unwrap_err();
        assert!(format!("{err:#}").contains("unknown field `pitr`"), "{err:#}");
    }
}
