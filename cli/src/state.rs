//! A repo's `state.json`: the names the CLI gives to what the pageserver knows by id
//! (branches -> timelines, the default tenant) and the endpoints it runs.
//!
//! The pageserver stays the authority on tenants, timelines and LSNs; this file holds only
//! what it has no word for. Every change is written to a temporary file, fsynced and renamed
//! over the old one, so a reader (or a crash) sees the old state or the new, never half.
//! Commands that change it hold the repo lock ([`RepoLock`]) from read to write.

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::path::Path;

use anyhow::{bail, Context};
use proto::{Lsn, TenantId, TimelineId};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct State {
    /// The tenant commands use when `--tenant` is not given: the first one created.
    #[serde(default, with = "opt_display")]
    pub default_tenant: Option<TenantId>,
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantState>,
    #[serde(default)]
    pub endpoints: BTreeMap<String, EndpointState>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantState {
    /// Branch name -> timeline id.
    #[serde(default)]
    pub branches: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointState {
    pub tenant_id: String,
    pub branch: String,
    pub timeline_id: String,
    pub port: u16,
    /// Set for a read-only endpoint at a past LSN.
    #[serde(default)]
    pub lsn: Option<String>,
    /// A read replica (hot standby) of its branch.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replica: bool,
}

impl State {
    pub fn load(path: &Path) -> anyhow::Result<State> {
        match std::fs::read(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(State::default()),
            Err(e) => Err(e).with_context(|| format!("read {}", path.display())),
            Ok(bytes) => serde_json::from_slice(&bytes).with_context(|| format!("parse {}", path.display())),
        }
    }

    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        let mut text = serde_json::to_string_pretty(self).context("render the repo state")?;
        text.push('\n');
        write_atomically(path, text.as_bytes())
    }

    /// `--tenant` if given, else the default tenant.
    pub fn tenant(&self, given: Option<TenantId>) -> anyhow::Result<TenantId> {
        match given.or(self.default_tenant) {
            Some(t) => Ok(t),
            None => bail!("no tenant yet: run `fjord tenant create` first"),
        }
    }

    pub fn branch_timeline(&self, tenant: TenantId, branch: &str) -> anyhow::Result<TimelineId> {
        let branches = self.tenants.get(&tenant.to_string()).map(|t| &t.branches);
        match branches.and_then(|b| b.get(branch)) {
            Some(tl) => tl.parse().with_context(|| format!("timeline id of branch {branch} in the repo state")),
            None => {
                let known: Vec<&str> = branches.map(|b| b.keys().map(String::as_str).collect()).unwrap_or_default();
                bail!(
                    "branch {branch:?} does not exist in tenant {tenant} (branches: {})",
                    if known.is_empty() { "none".into() } else { known.join(", ") }
                )
            }
        }
    }

    /// The branch name of a timeline, if it has one.
    pub fn branch_name(&self, tenant: &str, timeline: &str) -> Option<&str> {
        self.tenants.get(tenant)?.branches.iter().find(|(_, tl)| tl.as_str() == timeline).map(|(name, _)| name.as_str())
    }

    pub fn add_branch(&mut self, tenant: TenantId, branch: &str, timeline: TimelineId) {
        let entry = self.tenants.entry(tenant.to_string()).or_default();
        entry.branches.insert(branch.to_string(), timeline.to_string());
        if self.default_tenant.is_none() {
            self.default_tenant = Some(tenant);
        }
    }
}

impl EndpointState {
    pub fn lsn(&self) -> anyhow::Result<Option<Lsn>> {
        self.lsn.as_deref().map(|l| l.parse::<Lsn>().context("endpoint LSN in the repo state")).transpose()
    }

    /// Whether the endpoint writes to its branch (neither at a past LSN nor a replica).
    pub fn is_writer(&self) -> bool {
        self.lsn.is_none() && !self.replica
    }
}

/// Names of branches and endpoints: they become directory names and appear in commands.
pub fn check_name(kind: &str, name: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        && !name.starts_with('-');
    if !ok {
        bail!("invalid {kind} name {name:?}: use up to 63 letters, digits, '-' and '_', not starting with '-'");
    }
    Ok(())
}

/// Replaces `path` with `bytes` atomically and durably (`crashsafe::write_file_atomic`).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    crashsafe::write_file_atomic(path, bytes).with_context(|| format!("write {} atomically", path.display()))
}

/// An exclusive lock on the repo (flock on `.lock`), held by commands that change state, so
/// that two `fjord` processes never hand out one port or lose each other's changes.
pub struct RepoLock {
    _file: std::fs::File,
}

impl RepoLock {
    pub fn acquire(path: &Path) -> anyhow::Result<RepoLock> {
        let file = std::fs::File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .with_context(|| format!("open lock file {}", path.display()))?;
        // SAFETY: flock on a descriptor we own; released when the file is closed.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error()).with_context(|| format!("lock {}", path.display()));
        }
        Ok(RepoLock { _file: file })
    }
}

/// Serializes an optional id as its display form.
mod opt_display {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer, T: std::fmt::Display>(v: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.serialize_some(&v.to_string()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>, T>(d: D) -> Result<Option<T>, D::Error>
    where
        T: std::str::FromStr,
        T::Err: std::fmt::Display,
    {
        Option::<String>::deserialize(d)?.map(|s| s.parse().map_err(serde::de::Error::custom)).transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T1: &str = "11111111111111111111111111111111";
    const TL1: &str = "22222222222222222222222222222222";

    #[test]
    fn state_round_trips_through_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        assert_eq!(State::load(&path).unwrap(), State::default(), "no file is an empty state");
        let mut s = State::default();
        s.add_branch(T1.parse().unwrap(), "main", TL1.parse().unwrap());
        s.endpoints.insert(
            "ep".into(),
            EndpointState {
                tenant_id: T1.into(),
                branch: "main".into(),
                timeline_id: TL1.into(),
                port: 15010,
                lsn: Some("0/16B3F88".into()),
                replica: false,
            },
        );
        s.save(&path).unwrap();
        let back = State::load(&path).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.default_tenant.unwrap().to_string(), T1);
        assert_eq!(back.endpoints["ep"].lsn().unwrap(), Some(Lsn(0x16B3F88)));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file is left behind");
    }

    #[test]
    fn branches_resolve_and_unknown_ones_are_named() {
        let mut s = State::default();
        let t: TenantId = T1.parse().unwrap();
        assert!(s.tenant(None).unwrap_err().to_string().contains("fjord tenant create"));
        s.add_branch(t, "main", TL1.parse().unwrap());
        assert_eq!(s.tenant(None).unwrap(), t);
        assert_eq!(s.branch_timeline(t, "main").unwrap().to_string(), TL1);
        assert_eq!(s.branch_name(T1, TL1), Some("main"));
        let err = s.branch_timeline(t, "dev").unwrap_err().to_string();
        assert!(err.contains("\"dev\"") && err.contains("branches: main"), "{err}");
    }

    #[test]
    fn corrupt_state_is_an_error_not_an_empty_state() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        std::fs::write(&path, "{\"tenants\": 3}").unwrap();
        assert!(format!("{:#}", State::load(&path).unwrap_err()).contains("parse"));
        std::fs::write(&path, "{\"default_tenant\": \"xyz\"}").unwrap();
        assert!(State::load(&path).is_err());
    }

    #[test]
    fn names_are_checked() {
        for good in ["main", "dev-1", "a_b", "X"] {
            check_name("branch", good).unwrap();
        }
        for bad in ["", "-x", "a/b", "..", "a b", &"x".repeat(64)] {
            assert!(check_name("branch", bad).is_err(), "{bad:?}");
        }
    }
}
