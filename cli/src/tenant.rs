//! `fjord tenant ...` and `fjord branch ...`: bootstrapping a database cluster into the
//! pageserver, and naming the timelines branched from it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use proto::{Lsn, TenantId};
use serde_json::json;

use crate::pageserver_api::TimelineInfo;
use crate::repo::Repo;
use crate::state::{check_name, State};

/// The branch every tenant starts with.
pub const MAIN_BRANCH: &str = "main";

/// Removes a scratch directory when dropped, whatever happened in between.
struct ScratchDir(PathBuf);

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!("could not remove {}: {e}", self.0.display());
            }
        }
    }
}

pub fn create(repo: &Repo, tenant_id: Option<TenantId>) -> anyhow::Result<()> {
    crate::refuse_root("create a tenant")?;
    let api = repo.running_api()?;
    let _lock = repo.lock()?;
    let mut state = repo.load_state()?;
    let user = crate::os_user_name()?;

    // initdb makes the cluster; the pageserver imports it and the files are thrown away.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let scratch = ScratchDir(repo.tmp_dir().join(format!("initdb-{}-{nanos}", std::process::id())));
    std::fs::create_dir_all(repo.tmp_dir()).with_context(|| format!("create {}", repo.tmp_dir().display()))?;
    initdb(&repo.config.pg_bin_dir, &scratch.0, &user)?;

    let body = match tenant_id {
        Some(t) => json!({ "tenant_id": t.to_string() }),
        None => json!({}),
    };
    let created = api.post("/v1/tenant", &body)?;
    let tenant: TenantId = created["tenant_id"]
        .as_str()
        .context("tenant_id in the pageserver's answer")?
        .parse()
        .context("tenant_id in the pageserver's answer")?;
    let span = tracing::info_span!("tenant", tenant_id = %tenant);
    let _entered = span.enter();
    let timeline = api.post(&format!("/v1/tenant/{tenant}/timeline"), &json!({}))?;
    let timeline_id = timeline["timeline_id"].as_str().context("timeline_id in the pageserver's answer")?.to_string();
    let imported = api
        .post(&format!("/v1/tenant/{tenant}/timeline/{timeline_id}/import"), &json!({ "pgdata": scratch.0 }))
        .with_context(|| format!("import the new cluster (tenant {tenant} exists on the pageserver now, without a branch)"))?;
    state.add_branch(tenant, MAIN_BRANCH, timeline_id.parse().context("timeline_id in the pageserver's answer")?);
    repo.save_state(&state)?;
    eprintln!(
        "created tenant {tenant}: branch {MAIN_BRANCH} is timeline {timeline_id} at LSN {}{}",
        imported["import_lsn"].as_str().unwrap_or("?"),
        if state.default_tenant == Some(tenant) { " (default tenant)" } else { "" }
    );
    println!("{tenant}");
    Ok(())
}

fn initdb(pg_bin_dir: &Path, pgdata: &Path, user: &str) -> anyhow::Result<()> {
    let initdb = pg_bin_dir.join("initdb");
    tracing::info!("running initdb into {}", pgdata.display());
    // No fsync: the files are read once by the import and then removed; the pageserver
    // makes the imported data durable itself.
    let out = Command::new(&initdb)
        .arg("-D")
        .arg(pgdata)
        .args(["-U", user, "--no-instructions", "--no-sync", "--encoding=UTF8", "--locale=C", "--auth=trust"])
        .output()
        .with_context(|| format!("could not run {}", initdb.display()))?;
    if !out.status.success() {
        bail!("initdb failed ({}):\n{}{}", out.status, String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

pub fn list(repo: &Repo) -> anyhow::Result<()> {
    let state = repo.load_state()?;
    let default = state.default_tenant.map(|t| t.to_string());
    let api = repo.api();
    let tenants: Vec<String> = if api.is_up() { api.tenants()? } else { state.tenants.keys().cloned().collect() };
    for t in tenants {
        println!("{t}{}", if Some(&t) == default.as_ref() { " (default)" } else { "" });
    }
    Ok(())
}

pub fn branch_create(repo: &Repo, name: &str, from: &str, at: Option<Lsn>, tenant: Option<TenantId>) -> anyhow::Result<()> {
    check_name("branch", name)?;
    let api = repo.running_api()?;
    let _lock = repo.lock()?;
    let mut state = repo.load_state()?;
    let tenant = state.tenant(tenant)?;
    if state.branch_timeline(tenant, name).is_ok() {
        bail!("branch {name:?} already exists in tenant {tenant}");
    }
    let source = state.branch_timeline(tenant, from)?;
    let mut body = json!({ "ancestor_timeline_id": source.to_string() });
    if let Some(lsn) = at {
        body["ancestor_lsn"] = json!(lsn.to_string());
    }
    let created = api.post(&format!("/v1/tenant/{tenant}/timeline"), &body)?;
    let info: TimelineInfo = serde_json::from_value(created).context("parse the new timeline")?;
    state.add_branch(tenant, name, info.timeline_id.parse().context("timeline_id in the pageserver's answer")?);
    repo.save_state(&state)?;
    println!("branch {name} created from {from} at {} (timeline {})", info.ancestor_lsn.as_deref().unwrap_or("?"), info.timeline_id);
    Ok(())
}

pub fn branch_list(repo: &Repo, tenant: Option<TenantId>) -> anyhow::Result<()> {
    let state = repo.load_state()?;
    let tenant = state.tenant(tenant)?.to_string();
    let api = repo.running_api()?;
    print_branch_tree(&state, &tenant, &api.timelines(&tenant)?, "");
    Ok(())
}

/// Prints timelines as a tree under their ancestors:
///
/// ```text
/// main   <timeline id>  LSN 0/16B3F88
/// └ dev  <timeline id>  LSN 0/16B4000  from main@0/16B3F88
/// ```
pub fn print_branch_tree(state: &State, tenant: &str, timelines: &[TimelineInfo], indent: &str) {
    let name = |id: &str| state.branch_name(tenant, id).unwrap_or("-").to_string();
    let mut children: BTreeMap<Option<&str>, Vec<&TimelineInfo>> = BTreeMap::new();
    for t in timelines {
        children.entry(t.ancestor_timeline_id.as_deref()).or_default().push(t);
    }
    for list in children.values_mut() {
        list.sort_by_key(|t| (name(&t.timeline_id), t.timeline_id.clone()));
    }
    // Timelines whose ancestor the pageserver did not list are shown as roots.
    let known: Vec<&str> = timelines.iter().map(|t| t.timeline_id.as_str()).collect();
    let mut roots: Vec<&TimelineInfo> =
        timelines.iter().filter(|t| t.ancestor_timeline_id.as_deref().is_none_or(|a| !known.contains(&a))).collect();
    roots.sort_by_key(|t| (name(&t.timeline_id), t.timeline_id.clone()));
    let width =
        timelines.iter().map(|t| name(&t.timeline_id).len()).max().unwrap_or(0) + 2 * depth_max(&children, None, 0).saturating_sub(1);

    fn walk(
        t: &TimelineInfo,
        depth: usize,
        children: &BTreeMap<Option<&str>, Vec<&TimelineInfo>>,
        name: &dyn Fn(&str) -> String,
        indent: &str,
        width: usize,
    ) {
        let label = if depth == 0 { name(&t.timeline_id) } else { format!("{}└ {}", "  ".repeat(depth - 1), name(&t.timeline_id)) };
        let mut line = format!("{indent}{label:<width$}  {}  LSN {}", t.timeline_id, t.last_record_lsn);
        if let (Some(a), Some(lsn)) = (&t.ancestor_timeline_id, &t.ancestor_lsn) {
            line.push_str(&format!("  from {}@{lsn}", name(a)));
        }
        if let Some(state) = t.wal_receiver.as_ref().and_then(|w| w["state"].as_str()) {
            line.push_str(&format!("  wal receiver {state}"));
        }
        println!("{line}");
        for c in children.get(&Some(t.timeline_id.as_str())).into_iter().flatten() {
            walk(c, depth + 1, children, name, indent, width);
        }
    }
    if timelines.is_empty() {
        println!("{indent}no timelines");
    }
    for root in roots {
        walk(root, 0, &children, &name, indent, width);
    }
}

fn depth_max(children: &BTreeMap<Option<&str>, Vec<&TimelineInfo>>, of: Option<&str>, depth: usize) -> usize {
    // Depth is bounded by the number of timelines, since ancestry has no cycles.
    children.get(&of).into_iter().flatten().map(|c| depth_max(children, Some(c.timeline_id.as_str()), depth + 1)).max().unwrap_or(depth)
}
