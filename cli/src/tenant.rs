//! `fjord tenant ...` and `fjord branch ...`: bootstrapping a database cluster into the
//! pageserver, and naming the timelines branched from it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use pageserver_api::models::{
    ImportRequest, TenantCreateRequest, TimelineCreateRequest, TimelineInfo, WalReceiverRequest, WalSource, WalSourceList,
    SAFEKEEPER_REPLICATION_USER,
};
use proto::{TenantId, TimelineId};

use crate::point::Point;
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
    crate::process::refuse_root("create a tenant")?;
    // With a controller, the pageserver is the one it places the tenant on (below).
    let api = if repo.config.has_controller() { None } else { Some(repo.running_api()?) };
    let _lock = repo.lock()?;
    let mut state = repo.load_state()?;
    let user = crate::process::os_user_name()?;

    // initdb makes the cluster; the pageserver imports it and the files are thrown away.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let scratch = ScratchDir(repo.tmp_dir().join(format!("initdb-{}-{nanos}", std::process::id())));
    std::fs::create_dir_all(repo.tmp_dir()).with_context(|| format!("create {}", repo.tmp_dir().display()))?;
    initdb(&repo.config.pg_bin_dir, &scratch.0, &user)?;

    check_safekeepers_up(repo)?;
    let (api, tenant) = match api {
        Some(api) => {
            let tenant = api.create_tenant(&TenantCreateRequest { tenant_id })?.tenant_id;
            (api, tenant)
        }
        None => place(repo, tenant_id)?,
    };
    let span = tracing::info_span!("tenant", tenant_id = %tenant);
    let _entered = span.enter();
    let timeline_id = api.create_timeline(tenant, &TimelineCreateRequest::default())?.timeline_id;
    let imported = api
        .import(tenant, timeline_id, &ImportRequest { pgdata: scratch.0.clone() })
        .with_context(|| format!("import the new cluster (tenant {tenant} exists on the pageserver now, without a branch)"))?;
    create_on_safekeepers(repo, tenant, timeline_id, imported.system_identifier)?;
    register_wal_sources(repo, &api, tenant, timeline_id)?;
    state.add_branch(tenant, MAIN_BRANCH, timeline_id);
    repo.save_state(&state)?;
    eprintln!(
        "created tenant {tenant}: branch {MAIN_BRANCH} is timeline {timeline_id} at LSN {}{}",
        imported.import_lsn,
        if state.default_tenant == Some(tenant) { " (default tenant)" } else { "" }
    );
    say!("{tenant}");
    Ok(())
}

/// Asks the storage controller to place a new tenant (`POST /v1/tenant`), and waits until
/// the pageserver it is attached to holds it attached (the controller's order reaches it
/// with the next heartbeat): the client of that pageserver, and the tenant.
fn place(repo: &Repo, tenant_id: Option<TenantId>) -> anyhow::Result<(pageserver_api::Client, TenantId)> {
    let tenant = match tenant_id {
        Some(t) => t,
        None => random_tenant_id()?,
    };
    let location = repo
        .controller_api()
        .create_tenant(&pageserver_api::controller::TenantCreateRequest { tenant_id: tenant })
        .with_context(|| format!("ask the storage controller at {} to place tenant {tenant}", repo.config.controller_url()))?;
    let node = location.attached.node_id;
    let api = repo.api_at(&repo.config.http_url_of(&location.attached.http_addr));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let held = api.locations().ok().is_some_and(|l| {
            l.tenants.iter().any(|t| {
                t.tenant_id == tenant && t.mode == pageserver_api::models::LocationMode::Attached && t.generation == location.generation
            })
        });
        if held {
            break;
        }
        if std::time::Instant::now() > deadline {
            bail!(
                "pageserver {node} did not attach tenant {tenant} within 30 s of its placement (the controller has placed it there; see {} and {})",
                repo.pageserver(node).log_file.display(),
                repo.controller().log_file.display()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let secondary = location.secondary.map_or_else(|| "no secondary yet".to_string(), |s| format!("secondary on pageserver {}", s.node_id));
    eprintln!("the storage controller placed tenant {tenant} on pageserver {node} (generation {}), {secondary}", location.generation);
    Ok((api, tenant))
}

/// A random tenant id (the pageserver chooses one when it creates the tenant itself).
fn random_tenant_id() -> anyhow::Result<TenantId> {
    use std::io::Read as _;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)).context("read /dev/urandom for a tenant id")?;
    Ok(TenantId::from_bytes(bytes))
}

/// Registers the repo's safekeepers as the timeline's WAL sources on the pageserver (an
/// admin call: a compute may only restart registered sources, never name others), with a
/// storage token narrowed to the timeline for the pageserver to present to them. Nothing to
/// do without safekeepers: then `fjord endpoint start` registers the compute's walsender.
pub fn register_wal_sources(
    repo: &Repo,
    api: &pageserver_api::client::Client,
    tenant: TenantId,
    timeline: TimelineId,
) -> anyhow::Result<()> {
    if repo.config.safekeepers == 0 {
        return Ok(());
    }
    let sources = repo
        .config
        .safekeeper_ids()
        .map(|id| WalSource {
            host: repo.config.service_host().into(),
            port: repo.config.safekeeper_port(id),
            user: SAFEKEEPER_REPLICATION_USER.into(),
            plaintext: false,
        })
        .collect();
    let token = repo.token(&auth::Claims::storage_for(tenant, timeline));
    api.start_wal_receiver(tenant, timeline, &WalReceiverRequest::Sources(WalSourceList { sources, token }))
        .with_context(|| format!("register the safekeepers as timeline {timeline}'s WAL sources on the pageserver"))?;
    tracing::info!("registered the safekeepers as timeline {timeline}'s WAL sources");
    Ok(())
}

/// A new timeline is created on every safekeeper, so they must all run: one that finds a
/// timeline it has no record of takes it for one it lost, and joins as a learner (it does
/// not vote until it caught up; see `quorum`'s "Learners").
fn check_safekeepers_up(repo: &Repo) -> anyhow::Result<()> {
    let tls = repo.client_tls()?;
    let down: Vec<String> = repo
        .config
        .safekeeper_ids()
        .filter(|&id| !crate::process::http_up(&repo.config.safekeeper_http_url(id), tls.as_ref()))
        .map(|id| id.to_string())
        .collect();
    if !down.is_empty() {
        bail!(
            "safekeeper(s) {} not running: a new timeline is created on every safekeeper (start them with `fjord safekeeper start ID`, or `fjord start`)",
            down.join(", ")
        );
    }
    Ok(())
}

/// Creates the timeline on every safekeeper, as a voter (`POST
/// /v1/tenant/{tenant}/timeline/{timeline}`), with PostgreSQL's default 16 MiB segments. The
/// safekeepers are asked at the same time: each creation makes a directory and a control
/// file durable (about 15 ms of fsyncs here), most of a branch creation's time if done one
/// after another. Every failure is reported, the first one as the error.
fn create_on_safekeepers(repo: &Repo, tenant: TenantId, timeline: TimelineId, system_id: u64) -> anyhow::Result<()> {
    let tls = repo.client_tls()?;
    let config =
        pageserver_api::ClientConfig { request_timeout: Some(std::time::Duration::from_secs(30)), tls: tls.clone(), ..Default::default() };
    let agent = pageserver_api::client::agent(&config);
    let body = serde_json::json!({ "system_id": system_id, "wal_segment_size": 16u32 << 20 }).to_string();
    let token = repo.admin_token();
    let create = |id: u8| -> anyhow::Result<()> {
        let url = format!("{}/v1/tenant/{tenant}/timeline/{timeline}", repo.config.safekeeper_http_url(id));
        let mut req = agent.post(&url).content_type("application/json");
        if let Some(token) = &token {
            req = req.header("Authorization", format!("Bearer {token}"));
        }
        let mut resp = req.send(body.as_str()).map_err(|e| match pageserver_api::client::tls_failure(&e, &url, tls.as_ref()) {
            Some(reason) => anyhow::anyhow!("create timeline {timeline} on safekeeper {id}: TLS with {url} failed: {reason}"),
            None => anyhow::Error::new(e).context(format!("create timeline {timeline} on safekeeper {id} ({url})")),
        })?;
        let status = resp.status().as_u16();
        if !(200..300).contains(&status) {
            let text = resp.body_mut().read_to_string().unwrap_or_default();
            bail!("safekeeper {id} refused to create timeline {timeline} ({status}): {}", pageserver_api::client::server_message(&text));
        }
        tracing::info!(safekeeper = id, "created timeline {timeline} on safekeeper {id}");
        Ok(())
    };
    let results: Vec<anyhow::Result<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = repo.config.safekeeper_ids().map(|id| scope.spawn(move || create(id))).collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a safekeeper request panicked")))).collect()
    });
    let mut errors = results.into_iter().filter_map(Result::err);
    match errors.next() {
        None => Ok(()),
        Some(first) => {
            for other in errors {
                eprintln!("fjord: also: {other:#}");
            }
            Err(first)
        }
    }
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
    let tenants: Vec<String> = if repo.config.has_controller() {
        match repo.controller_api().tenants() {
            Ok(placed) => placed.iter().map(|t| t.tenant_id.to_string()).collect(),
            Err(_) => state.tenants.keys().cloned().collect(),
        }
    } else if crate::repo::is_up(&api) {
        api.tenants()?.iter().map(TenantId::to_string).collect()
    } else {
        state.tenants.keys().cloned().collect()
    };
    for t in tenants {
        say!("{t}{}", if Some(&t) == default.as_ref() { " (default)" } else { "" });
    }
    Ok(())
}

pub fn branch_create(repo: &Repo, name: &str, from: &str, at: Option<Point>, tenant: Option<TenantId>) -> anyhow::Result<()> {
    check_name("branch", name)?;
    // Without a controller the one pageserver must run, whatever the tenant; with one,
    // the tenant's attached pageserver must.
    let early = if repo.config.has_controller() { None } else { Some(repo.running_api()?) };
    let _lock = repo.lock()?;
    let mut state = repo.load_state()?;
    let tenant = state.tenant(tenant)?;
    let api = match early {
        Some(api) => api,
        None => {
            // A planned migration's source writes nothing to object storage, and its
            // destination has not caught up yet: a timeline belongs on neither until the
            // cut-over.
            if let Some(m) = repo.locate(tenant)?.migration.filter(|m| !m.cut_over) {
                bail!(
                    "tenant {tenant} is migrating from pageserver {}: create the branch once the migration has cut over (`fjord status`)",
                    m.from.node_id
                );
            }
            repo.tenant_api(tenant)?
        }
    };
    if state.branch_timeline(tenant, name).is_ok() {
        bail!("branch {name:?} already exists in tenant {tenant}");
    }
    let source = state.branch_timeline(tenant, from)?;
    let at = at.map(|p| crate::point::resolve(&api, tenant, source, from, p)).transpose()?;
    check_safekeepers_up(repo)?;
    let request = TimelineCreateRequest { ancestor_timeline_id: Some(source), ancestor_lsn: at, ..Default::default() };
    let info = api.create_timeline(tenant, &request)?;
    let system_id = match info.system_id {
        Some(id) => id,
        None => api.timeline(tenant, source)?.system_id.context("the branch's parent has no system identifier yet")?,
    };
    create_on_safekeepers(repo, tenant, info.timeline_id, system_id)?;
    register_wal_sources(repo, &api, tenant, info.timeline_id)?;
    state.add_branch(tenant, name, info.timeline_id);
    repo.save_state(&state)?;
    let at = info.ancestor_lsn.map_or_else(|| "?".to_string(), |lsn| lsn.to_string());
    say!("branch {name} created from {from} at {at} (timeline {})", info.timeline_id);
    Ok(())
}

pub fn branch_list(repo: &Repo, tenant: Option<TenantId>) -> anyhow::Result<()> {
    let state = repo.load_state()?;
    let tenant = state.tenant(tenant)?;
    let api = repo.tenant_api(tenant)?;
    print_branch_tree(&state, tenant, &api.timelines(tenant)?, "");
    Ok(())
}

/// Prints timelines as a tree under their ancestors:
///
/// ```text
/// main   <timeline id>  LSN 0/16B3F88
/// └ dev  <timeline id>  LSN 0/16B4000  from main@0/16B3F88
/// ```
pub fn print_branch_tree(state: &State, tenant: TenantId, timelines: &[TimelineInfo], indent: &str) {
    let tenant = tenant.to_string();
    let name = |id: TimelineId| state.branch_name(&tenant, &id.to_string()).unwrap_or("-").to_string();
    let mut children: BTreeMap<Option<TimelineId>, Vec<&TimelineInfo>> = BTreeMap::new();
    for t in timelines {
        children.entry(t.ancestor_timeline_id).or_default().push(t);
    }
    // Ids order as their hex text does, so the order is the same as by the printed id.
    for list in children.values_mut() {
        list.sort_by_key(|t| (name(t.timeline_id), t.timeline_id));
    }
    // Timelines whose ancestor the pageserver did not list are shown as roots.
    let known: Vec<TimelineId> = timelines.iter().map(|t| t.timeline_id).collect();
    let mut roots: Vec<&TimelineInfo> = timelines.iter().filter(|t| t.ancestor_timeline_id.is_none_or(|a| !known.contains(&a))).collect();
    roots.sort_by_key(|t| (name(t.timeline_id), t.timeline_id));
    let width =
        timelines.iter().map(|t| name(t.timeline_id).len()).max().unwrap_or(0) + 2 * depth_max(&children, None, 0).saturating_sub(1);

    fn walk(
        t: &TimelineInfo,
        depth: usize,
        children: &BTreeMap<Option<TimelineId>, Vec<&TimelineInfo>>,
        name: &dyn Fn(TimelineId) -> String,
        indent: &str,
        width: usize,
    ) {
        let label = if depth == 0 { name(t.timeline_id) } else { format!("{}└ {}", "  ".repeat(depth - 1), name(t.timeline_id)) };
        let mut line = format!("{indent}{label:<width$}  {}  LSN {}", t.timeline_id, t.last_record_lsn);
        if let (Some(a), Some(lsn)) = (t.ancestor_timeline_id, t.ancestor_lsn) {
            line.push_str(&format!("  from {}@{lsn}", name(a)));
        }
        if let Some(receiver) = &t.wal_receiver {
            line.push_str(&format!("  wal receiver {}", receiver.state.as_str()));
        }
        say!("{line}");
        for c in children.get(&Some(t.timeline_id)).into_iter().flatten() {
            walk(c, depth + 1, children, name, indent, width);
        }
    }
    if timelines.is_empty() {
        say!("{indent}no timelines");
    }
    for root in roots {
        walk(root, 0, &children, &name, indent, width);
    }
}

fn depth_max(children: &BTreeMap<Option<TimelineId>, Vec<&TimelineInfo>>, of: Option<TimelineId>, depth: usize) -> usize {
    // Depth is bounded by the number of timelines, since ancestry has no cycles.
    children.get(&of).into_iter().flatten().map(|c| depth_max(children, Some(c.timeline_id), depth + 1)).max().unwrap_or(depth)
}

/// `fjord tenant migrate`: asks the storage controller to move the tenant to pageserver `to`
/// and waits until the migration has ended (the old pageserver holds it as secondary),
/// saying each step as the controller reports it.
pub fn migrate(repo: &Repo, tenant: Option<TenantId>, to: u64, timeout: std::time::Duration) -> anyhow::Result<()> {
    if !repo.config.has_controller() {
        bail!("this repo has one pageserver and no storage controller: there is nowhere to move a tenant (make a cluster with `fjord init --pageservers 2`)");
    }
    let state = repo.load_state()?;
    let tenant = state.tenant(tenant)?;
    let api = repo.controller_api();
    let before = repo.locate(tenant)?;
    let started = api.migrate(tenant, to).map_err(|e| anyhow::anyhow!("migrate tenant {tenant} to pageserver {to}: {e}"))?;
    if started.migration.is_none() && started.attached.node_id == to {
        say!("tenant {tenant} is on pageserver {to} already");
        return Ok(());
    }
    say!("tenant {tenant}: moving from pageserver {} to pageserver {to} (generation {})", before.attached.node_id, started.generation);
    let deadline = std::time::Instant::now() + timeout;
    let mut cut_over = false;
    loop {
        let now = repo.locate(tenant)?;
        match &now.migration {
            Some(m) if m.cut_over && !cut_over => {
                say!("cut over: computes read from pageserver {to}");
                cut_over = true;
            }
            Some(_) => {}
            None if now.attached.node_id == to => {
                let secondary = now.secondary.as_ref().map_or("none".to_string(), |s| format!("pageserver {}", s.node_id));
                say!("done: tenant {tenant} is on pageserver {to} (generation {}), secondary {secondary}", now.generation);
                return Ok(());
            }
            None => bail!(
                "the migration of tenant {tenant} ended elsewhere: it is on pageserver {} (the destination went offline?); see the controller's log",
                now.attached.node_id
            ),
        }
        if std::time::Instant::now() >= deadline {
            bail!("the migration of tenant {tenant} to pageserver {to} has not ended after {timeout:?}; it goes on (see `fjord status`)");
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}
