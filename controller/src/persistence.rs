//! The controller's state in PostgreSQL: the leader lease, the nodes and every tenant's
//! placement and generation. Nothing else is durable: a node's health is what the leading
//! controller observes, and a new leader observes it afresh.
//!
//! **Fencing.** Every change is one transaction that first takes the lease row `FOR SHARE`
//! and checks that this instance holds it and that it has not expired by the database's
//! clock. Taking the lease over is an `UPDATE` of that row, so it waits for such a
//! transaction to end, and a controller whose lease lapsed (paused, cut off, slow) changes
//! nothing: two controllers can never both raise a tenant's generation.

use std::time::Duration;

use proto::TenantId;
use tokio::sync::Mutex;
use tokio_postgres::{Client, GenericClient, NoTls, Transaction};

use crate::models::{Migration, NodeLocation, NodeRegisterRequest, ReAttachTenant, TenantLocation};
use pageserver_api::models::LocationMode;

/// The schema this build uses. A database with an older one is upgraded by the steps in
/// [`UPGRADES`], in one transaction; one with a newer (or unknown) version is refused:
/// guessing would risk the placements.
pub const SCHEMA_VERSION: i32 = 2;

/// The statements that take a database from version `n` to `n + 1`, at index `n - 1`.
const UPGRADES: [&str; 1] = [
    // 1 -> 2: planned migrations.
    "ALTER TABLE fjord_controller_tenants
        ADD COLUMN IF NOT EXISTS migrating_from bigint REFERENCES fjord_controller_nodes
            CHECK (migrating_from IS NULL OR (migrating_from <> attached AND migrating_from IS DISTINCT FROM secondary)),
        ADD COLUMN IF NOT EXISTS cut_over_at timestamptz CHECK (cut_over_at IS NULL OR migrating_from IS NOT NULL),
        ADD COLUMN IF NOT EXISTS migration_started_at timestamptz;",
];

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS fjord_controller_schema (version integer NOT NULL);
CREATE TABLE IF NOT EXISTS fjord_controller_leader (
    id integer PRIMARY KEY CHECK (id = 1),
    holder text NOT NULL,
    address text NOT NULL,
    expires_at timestamptz NOT NULL,
    epoch bigint NOT NULL
);
INSERT INTO fjord_controller_leader VALUES (1, '', '', '-infinity', 0) ON CONFLICT DO NOTHING;
CREATE TABLE IF NOT EXISTS fjord_controller_nodes (
    node_id bigint PRIMARY KEY CHECK (node_id >= 0),
    http_addr text NOT NULL,
    page_addr text NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS fjord_controller_tenants (
    tenant_id text PRIMARY KEY,
    generation bigint NOT NULL CHECK (generation BETWEEN 1 AND 4294967295),
    attached bigint NOT NULL REFERENCES fjord_controller_nodes,
    secondary bigint REFERENCES fjord_controller_nodes CHECK (secondary IS DISTINCT FROM attached),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS fjord_controller_tenants_attached ON fjord_controller_tenants (attached);
CREATE INDEX IF NOT EXISTS fjord_controller_tenants_secondary ON fjord_controller_tenants (secondary);
";

/// Why a database call did not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("this controller does not hold the leader lease")]
    NotLeader,
    #[error("the controller's database: {}", describe(.0))]
    Postgres(#[from] tokio_postgres::Error),
    /// Nothing to place a tenant on (yet: a new leader knows no node for a moment).
    #[error(
        "no pageserver is online to place the tenant on (a controller that just began to lead knows none for a moment): retry shortly"
    )]
    NoNodeOnline,
    #[error("the controller's database did not answer within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Refused(String),
    #[error("the database's controller schema is version {0} now, this controller's {SCHEMA_VERSION}")]
    SchemaChanged(i32),
}

/// A database error with what the server said (tokio_postgres's own text is only "db
/// error"), or the connection's failure with its cause.
fn describe(e: &tokio_postgres::Error) -> String {
    match (e.as_db_error(), std::error::Error::source(e)) {
        (Some(db), _) => format!("{}: {} ({})", db.severity(), db.message(), db.code().code()),
        (None, Some(cause)) => format!("{e}: {cause}"),
        (None, None) => e.to_string(),
    }
}

/// One connection to the database, opened on first use and again after any error.
///
/// Nothing the database does may hold the controller longer than `limit`: each call is
/// abandoned after it (the connection dropped, so the server rolls the transaction back),
/// and the session's `statement_timeout`, `lock_timeout` and
/// `idle_in_transaction_session_timeout` end, on the server's side, a statement, a lock wait
/// or a transaction of a controller that stopped (paused, cut off) while holding the lease
/// row: a standby can always take over.
pub struct Db {
    url: String,
    limit: Duration,
    client: Mutex<Option<Client>>,
}
/// The lease as the database holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub holder: String,
    pub address: String,
    pub live: bool,
}

/// A node's row and its counts of tenants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRow {
    pub node: NodeLocation,
    pub attached: u64,
    pub secondaries: u64,
}

/// A tenant attached to a node, with its secondary, for a failover.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attachment {
    pub tenant_id: TenantId,
    pub generation: u32,
    pub attached: u64,
    pub secondary: Option<u64>,
    /// The source of a planned migration to `attached`, still holding the tenant.
    pub migrating_from: Option<u64>,
}

fn to_u64(v: i64) -> u64 {
    v.try_into().expect("the schema keeps ids non-negative")
}

fn to_u32(generation: i64) -> Result<u32, DbError> {
    u32::try_from(generation).map_err(|_| DbError::Refused(format!("generation {generation} is out of range")))
}

fn parse_tenant(id: String) -> Result<TenantId, DbError> {
    id.parse().map_err(|e| DbError::Refused(format!("a tenant id in the database does not parse: {id}: {e}")))
}

fn to_i64(v: u64) -> Result<i64, DbError> {
    v.try_into().map_err(|_| DbError::Refused(format!("node id {v} is above {}", i64::MAX)))
}

impl Db {
    /// `limit`: the longest any call may take (the controller uses a third of the lease).
    pub fn new(url: &str, limit: Duration) -> Db {
        Db { url: url.to_string(), limit, client: Mutex::new(None) }
    }

    async fn connect(&self) -> Result<Client, DbError> {
        let mut config: tokio_postgres::Config = self.url.parse()?;
        config.connect_timeout(self.limit).keepalives_idle(Duration::from_secs(5)).application_name("fjord_storage_controller");
        let (client, connection) = config.connect(NoTls).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!("the connection to the controller's database ended: {e}");
            }
        });
        let ms = self.limit.as_millis().max(1);
        client
            .batch_execute(&format!(
                "SET statement_timeout = {ms}; SET lock_timeout = {ms}; SET idle_in_transaction_session_timeout = {ms}"
            ))
            .await?;
        Ok(client)
    }

    /// Runs `f` on the connection (opening it if needed); an error drops the connection, so
    /// the next call opens a new one.
    async fn with<T>(&self, f: impl AsyncFnOnce(&mut Client) -> Result<T, DbError>) -> Result<T, DbError> {
        let attempt = async {
            let mut guard = self.client.lock().await;
            if guard.as_ref().is_none_or(|c| c.is_closed()) {
                *guard = Some(self.connect().await?);
            }
            let client = guard.as_mut().expect("just opened");
            let result = f(client).await;
            if let Err(DbError::Postgres(_)) = &result {
                *guard = None;
            }
            result
        };
        match tokio::time::timeout(self.limit, attempt).await {
            Ok(result) => result,
            Err(_) => {
                // The connection may be in any state: a new one next time.
                if let Ok(mut guard) = self.client.try_lock() {
                    *guard = None;
                }
                Err(DbError::Timeout(self.limit))
            }
        }
    }

    /// Creates the tables if they are missing, and checks the schema version. Two
    /// controllers starting at once serialize on an advisory lock.
    pub async fn migrate(&self) -> Result<(), DbError> {
        self.with(async |c: &mut Client| {
            let tx = c.transaction().await?;
            tx.execute("SELECT pg_advisory_xact_lock(7346281)", &[]).await?;
            // No notice for every table that already exists.
            tx.execute("SET LOCAL client_min_messages = warning", &[]).await?;
            tx.batch_execute(SCHEMA).await?;
            let versions: Vec<i32> = tx.query("SELECT version FROM fjord_controller_schema", &[]).await?.iter().map(|r| r.get(0)).collect();
            match versions.as_slice() {
                [] => {
                    // New tables are made at version 1 above, then upgraded like any other.
                    for step in UPGRADES {
                        tx.batch_execute(step).await?;
                    }
                    tx.execute("INSERT INTO fjord_controller_schema VALUES ($1)", &[&SCHEMA_VERSION]).await?;
                }
                [v] if *v == SCHEMA_VERSION => {}
                [v] if (1..SCHEMA_VERSION).contains(v) => {
                    // Not under a controller that still runs the old schema: it would go on
                    // with tables it does not know.
                    let live = tx
                        .query_opt(
                            "SELECT holder, address FROM fjord_controller_leader
                              WHERE id = 1 AND holder <> '' AND expires_at > clock_timestamp()",
                            &[],
                        )
                        .await?;
                    if let Some(row) = live {
                        let address: String = row.get(1);
                        tx.rollback().await?;
                        return Err(DbError::Refused(format!(
                            "the database's controller schema is version {v}, and a controller ({address}) leads with it: stop it (or let its lease lapse) before this controller upgrades the schema to {SCHEMA_VERSION}"
                        )));
                    }
                    for step in &UPGRADES[(*v as usize - 1)..] {
                        tx.batch_execute(step).await?;
                    }
                    tx.execute("UPDATE fjord_controller_schema SET version = $1", &[&SCHEMA_VERSION]).await?;
                    tracing::info!("upgraded the controller's schema from version {v} to {SCHEMA_VERSION}");
                }
                other => {
                    // Rolled back and answered before the error ends the process (a dropped
                    // transaction's rollback is only queued).
                    tx.rollback().await?;
                    return Err(DbError::Refused(format!(
                        "the database's controller schema is version {other:?}, this controller's {SCHEMA_VERSION}: refusing to touch it"
                    )));
                }
            }
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    /// Takes or renews the lease for `lease` from now (the database's clock): true if this
    /// instance holds it afterwards. Only an expired lease, or one's own, is taken; never
    /// by a controller whose schema version is not the database's
    /// ([`DbError::SchemaChanged`]).
    pub async fn acquire_lease(&self, instance: &str, address: &str, lease: Duration) -> Result<bool, DbError> {
        let secs = lease.as_secs_f64();
        self.with(async |c: &mut Client| {
            let version: i32 = c.query_one("SELECT version FROM fjord_controller_schema", &[]).await?.get(0);
            if version != SCHEMA_VERSION {
                return Err(DbError::SchemaChanged(version));
            }
            let rows = c
                .query(
                    "UPDATE fjord_controller_leader
                        SET holder = $1, address = $2, expires_at = clock_timestamp() + make_interval(secs => $3),
                            epoch = CASE WHEN holder = $1 THEN epoch ELSE epoch + 1 END
                      WHERE id = 1 AND (holder = $1 OR expires_at < clock_timestamp())
                  RETURNING epoch",
                    &[&instance, &address, &secs],
                )
                .await?;
            Ok(!rows.is_empty())
        })
        .await
    }

    /// Gives the lease up at once (a clean stop), if this instance holds it.
    pub async fn release_lease(&self, instance: &str) -> Result<(), DbError> {
        self.with(async |c: &mut Client| {
            c.execute("UPDATE fjord_controller_leader SET expires_at = '-infinity' WHERE id = 1 AND holder = $1", &[&instance]).await?;
            Ok(())
        })
        .await
    }

    pub async fn lease(&self) -> Result<Lease, DbError> {
        self.with(async |c: &mut Client| {
            let row = c
                .query_one("SELECT holder, address, expires_at > clock_timestamp() FROM fjord_controller_leader WHERE id = 1", &[])
                .await?;
            Ok(Lease { holder: row.get(0), address: row.get(1), live: row.get(2) })
        })
        .await
    }

    /// Adds a node, or changes its addresses; true if it was known with other addresses.
    /// Refused when another node has either address (two ids for one pageserver would let
    /// a tenant's secondary be its attached pageserver).
    pub async fn register_node(&self, instance: &str, req: &NodeRegisterRequest) -> Result<bool, DbError> {
        let id = to_i64(req.node_id)?;
        self.with(async |c: &mut Client| {
            let tx = c.transaction().await?;
            tx.execute("LOCK TABLE fjord_controller_nodes IN SHARE ROW EXCLUSIVE MODE", &[]).await?;
            let clash = tx
                .query_opt(
                    "SELECT node_id FROM fjord_controller_nodes WHERE node_id <> $1 AND (http_addr IN ($2, $3) OR page_addr IN ($2, $3)) LIMIT 1",
                    &[&id, &req.http_addr, &req.page_addr],
                )
                .await?;
            if let Some(row) = clash {
                let other: i64 = row.get(0);
                return Err(DbError::Refused(format!("node {other} already has one of the addresses {} and {}", req.http_addr, req.page_addr)));
            }
            let before = tx.query_opt("SELECT http_addr, page_addr FROM fjord_controller_nodes WHERE node_id = $1", &[&id]).await?;
            tx.execute(
                "INSERT INTO fjord_controller_nodes (node_id, http_addr, page_addr) VALUES ($1, $2, $3)
                 ON CONFLICT (node_id) DO UPDATE SET http_addr = excluded.http_addr, page_addr = excluded.page_addr",
                &[&id, &req.http_addr, &req.page_addr],
            )
            .await?;
            fence(&tx, instance).await?;
            tx.commit().await?;
            Ok(before.is_some_and(|r| r.get::<_, String>(0) != req.http_addr || r.get::<_, String>(1) != req.page_addr))
        })
        .await
    }

    pub async fn nodes(&self) -> Result<Vec<NodeRow>, DbError> {
        self.with(async |c: &mut Client| nodes(&*c).await).await
    }

    /// Places a new tenant with `choose(nodes)` (the nodes with their loads, read in the
    /// same transaction) at generation 1. A tenant already placed is refused.
    pub async fn create_tenant(
        &self,
        instance: &str,
        tenant: TenantId,
        choose: impl FnOnce(&[NodeRow]) -> Result<(u64, Option<u64>), DbError>,
    ) -> Result<TenantLocation, DbError> {
        self.with(async |c: &mut Client| {
            let tx = c.transaction().await?;
            // One placement at a time, so that two creations see each other's loads.
            tx.execute("LOCK TABLE fjord_controller_tenants IN SHARE ROW EXCLUSIVE MODE", &[]).await?;
            let (attached, secondary) = choose(&nodes(&tx).await?)?;
            let secondary = secondary.map(to_i64).transpose()?;
            let inserted = tx
                .execute(
                    "INSERT INTO fjord_controller_tenants (tenant_id, generation, attached, secondary) VALUES ($1, 1, $2, $3)
                     ON CONFLICT (tenant_id) DO NOTHING",
                    &[&tenant.to_string(), &to_i64(attached)?, &secondary],
                )
                .await?;
            if inserted == 0 {
                return Err(DbError::Refused(format!("tenant {tenant} is already placed")));
            }
            let location = tenant_location(&tx, tenant).await?.expect("just inserted");
            fence(&tx, instance).await?;
            tx.commit().await?;
            Ok(location)
        })
        .await
    }

    pub async fn tenant(&self, tenant: TenantId) -> Result<Option<TenantLocation>, DbError> {
        self.with(async |c: &mut Client| tenant_location(&*c, tenant).await).await
    }

    pub async fn tenants(&self) -> Result<Vec<TenantLocation>, DbError> {
        self.with(async |c: &mut Client| {
            let rows = c.query(&format!("{LOCATION_QUERY} ORDER BY t.tenant_id"), &[]).await?;
            rows.iter().map(location_of).collect()
        })
        .await
    }

    /// What `node` holds, for a pageserver that starts: every tenant attached to it, with its
    /// generation raised by one (its previous process may still be finishing writes under
    /// the old one), and every tenant it is the secondary of. One transaction. An unknown
    /// node is refused: it registers first.
    pub async fn re_attach(&self, instance: &str, node: u64) -> Result<Vec<ReAttachTenant>, DbError> {
        let id = to_i64(node)?;
        self.with(async |c: &mut Client| {
            let tx = c.transaction().await?;
            tx.execute("LOCK TABLE fjord_controller_tenants IN SHARE ROW EXCLUSIVE MODE", &[]).await?;
            if tx.query_opt("SELECT 1 FROM fjord_controller_nodes WHERE node_id = $1", &[&id]).await?.is_none() {
                return Err(DbError::Refused(format!("pageserver {node} is not registered: POST /v1/node first")));
            }
            let mut out = Vec::new();
            let attached = tx
                .query(
                    "UPDATE fjord_controller_tenants SET generation = generation + 1, updated_at = clock_timestamp()
                      WHERE attached = $1 RETURNING tenant_id, generation",
                    &[&id],
                )
                .await?;
            for row in attached {
                out.push(ReAttachTenant {
                    tenant_id: parse_tenant(row.get(0))?,
                    mode: LocationMode::Attached,
                    generation: to_u32(row.get(1))?,
                });
            }
            // A migration's source that restarts no longer holds the tenant: computes go to
            // the destination at once, and the source holds it as its secondary.
            tx.execute(
                "UPDATE fjord_controller_tenants SET migrating_from = NULL, cut_over_at = NULL, secondary = $1, updated_at = clock_timestamp()
                  WHERE migrating_from = $1",
                &[&id],
            )
            .await?;
            for row in tx.query("SELECT tenant_id FROM fjord_controller_tenants WHERE secondary = $1", &[&id]).await? {
                out.push(ReAttachTenant { tenant_id: parse_tenant(row.get(0))?, mode: LocationMode::Secondary, generation: 0 });
            }
            out.sort_by_key(|t| t.tenant_id);
            fence(&tx, instance).await?;
            tx.commit().await?;
            Ok(out)
        })
        .await
    }

    /// Moves every tenant attached to `from` (a node taken for dead) to its secondary, with
    /// its generation raised by one, and gives it a new secondary from `choose(new attached,
    /// nodes)`. Tenants whose secondary is in `unusable` (offline, unknown) or missing stay
    /// where they are and are returned in the second list. One transaction; the nodes'
    /// loads are read once and kept up to date as tenants move.
    pub async fn fail_over(
        &self,
        instance: &str,
        from: u64,
        unusable: &[u64],
        choose: impl Fn(u64, &[NodeRow]) -> Option<u64>,
    ) -> Result<(Vec<TenantLocation>, Vec<Attachment>), DbError> {
        let from_id = to_i64(from)?;
        self.with(async |c: &mut Client| {
            let tx = c.transaction().await?;
            tx.execute("LOCK TABLE fjord_controller_tenants IN SHARE ROW EXCLUSIVE MODE", &[]).await?;
            let mut loads = nodes(&tx).await?;
            let (mut moved, mut stuck) = (Vec::new(), Vec::new());
            // Migrations away from the dead node cut over at once: its computes cannot read
            // from it anyway, and the destination holds the tenant with the newest generation.
            let cut = tx
                .execute(
                    "UPDATE fjord_controller_tenants SET migrating_from = NULL, cut_over_at = NULL, updated_at = clock_timestamp()
                      WHERE migrating_from = $1",
                    &[&from_id],
                )
                .await?;
            for a in attachments(&tx, "attached = $1", from_id).await? {
                // A migration's destination died: back to its source, which still holds the
                // tenant and is warm; else to the secondary.
                let Some(to) = a.migrating_from.or(a.secondary).filter(|s| !unusable.contains(s)) else {
                    stuck.push(a);
                    continue;
                };
                let secondary = choose(to, &loads).filter(|s| *s != to && *s != from && !unusable.contains(s));
                tx.execute(
                    "UPDATE fjord_controller_tenants SET generation = generation + 1, attached = $2, secondary = $3,
                            migrating_from = NULL, cut_over_at = NULL, updated_at = clock_timestamp()
                      WHERE tenant_id = $1",
                    &[&a.tenant_id.to_string(), &to_i64(to)?, &secondary.map(to_i64).transpose()?],
                )
                .await?;
                adjust(&mut loads, from, |n| n.attached = n.attached.saturating_sub(1));
                adjust(&mut loads, to, |n| {
                    n.attached += 1;
                    n.secondaries = n.secondaries.saturating_sub(1)
                });
                if let Some(s) = secondary {
                    adjust(&mut loads, s, |n| n.secondaries += 1);
                }
                moved.push(tenant_location(&tx, a.tenant_id).await?.expect("locked"));
            }
            if moved.is_empty() && cut == 0 {
                // Nothing changed: rolled back, no fence needed.
                return Ok((moved, stuck));
            }
            fence(&tx, instance).await?;
            tx.commit().await?;
            Ok((moved, stuck))
        })
        .await
    }

    /// Gives a secondary, from `choose(attached, nodes)`, to every tenant whose secondary is
    /// `lost` or that has none; returns the tenants changed. One transaction.
    pub async fn replace_secondaries(
        &self,
        instance: &str,
        lost: &[u64],
        choose: impl Fn(u64, &[NodeRow]) -> Option<u64>,
    ) -> Result<Vec<TenantLocation>, DbError> {
        let lost_ids = lost.iter().map(|n| to_i64(*n)).collect::<Result<Vec<i64>, _>>()?;
        self.with(async |c: &mut Client| {
            let tx = c.transaction().await?;
            tx.execute("LOCK TABLE fjord_controller_tenants IN SHARE ROW EXCLUSIVE MODE", &[]).await?;
            let mut loads = nodes(&tx).await?;
            let mut changed = Vec::new();
            // A migration's source becomes the secondary when it ends: none is chosen before.
            for a in attachments(&tx, "migrating_from IS NULL AND (secondary IS NULL OR secondary = ANY($1))", lost_ids).await? {
                let secondary = choose(a.attached, &loads).filter(|s| *s != a.attached && !lost.contains(s));
                if secondary == a.secondary {
                    continue;
                }
                tx.execute(
                    "UPDATE fjord_controller_tenants SET secondary = $2, updated_at = clock_timestamp() WHERE tenant_id = $1",
                    &[&a.tenant_id.to_string(), &secondary.map(to_i64).transpose()?],
                )
                .await?;
                if let Some(old) = a.secondary {
                    adjust(&mut loads, old, |n| n.secondaries = n.secondaries.saturating_sub(1));
                }
                if let Some(s) = secondary {
                    adjust(&mut loads, s, |n| n.secondaries += 1);
                }
                changed.push(tenant_location(&tx, a.tenant_id).await?.expect("locked"));
            }
            if changed.is_empty() {
                return Ok(changed);
            }
            fence(&tx, instance).await?;
            tx.commit().await?;
            Ok(changed)
        })
        .await
    }
}

/// What [`Db::advance_migrations`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MigrationSteps {
    pub cut_over: Vec<TenantId>,
    pub ended: Vec<TenantLocation>,
    /// Not cut over in time: back on their source.
    pub abandoned: Vec<TenantLocation>,
}

/// What [`Db::start_migration`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MigrationStart {
    /// Under way, with the tenant's location now.
    Started(TenantLocation),
    /// The tenant is attached there already, with no migration under way.
    AlreadyThere(TenantLocation),
}

impl Db {
    /// Starts a planned migration of `tenant` to `to`: `to` becomes the attached node with
    /// the generation raised by one, the node it leaves keeps serving computes until the
    /// migration cuts over ([`Db::advance_migrations`]). One at a time per tenant; a
    /// secondary that is `to` is dropped (the source becomes the secondary at the end).
    pub async fn start_migration(&self, instance: &str, tenant: TenantId, to: u64) -> Result<Option<MigrationStart>, DbError> {
        let to_id = to_i64(to)?;
        self.with(async |c: &mut Client| {
            let tx = c.transaction().await?;
            tx.execute("LOCK TABLE fjord_controller_tenants IN SHARE ROW EXCLUSIVE MODE", &[]).await?;
            let Some(now) = tenant_location(&tx, tenant).await? else { return Ok(None) };
            if let Some(m) = &now.migration {
                return Err(DbError::Refused(format!(
                    "tenant {tenant} is migrating from pageserver {} to pageserver {} already: wait for it to finish",
                    m.from.node_id, now.attached.node_id
                )));
            }
            if now.attached.node_id == to {
                return Ok(Some(MigrationStart::AlreadyThere(now)));
            }
            if tx.query_opt("SELECT 1 FROM fjord_controller_nodes WHERE node_id = $1", &[&to_id]).await?.is_none() {
                return Err(DbError::Refused(format!("pageserver {to} is not registered")));
            }
            tx.execute(
                "UPDATE fjord_controller_tenants
                    SET generation = generation + 1, migrating_from = attached, attached = $2, cut_over_at = NULL,
                        migration_started_at = clock_timestamp(),
                        secondary = CASE WHEN secondary = $2 THEN NULL ELSE secondary END, updated_at = clock_timestamp()
                  WHERE tenant_id = $1",
                &[&tenant.to_string(), &to_id],
            )
            .await?;
            let location = tenant_location(&tx, tenant).await?.expect("locked");
            fence(&tx, instance).await?;
            tx.commit().await?;
            Ok(Some(MigrationStart::Started(location)))
        })
        .await
    }

    /// Moves planned migrations on: those in `ready` (the destination holds the tenant with
    /// its generation and has caught up with the source) cut over, so computes are told
    /// the destination; those cut over at least `grace` ago (by the database's clock) end,
    /// the source becoming the tenant's secondary; those not cut over `timeout` after they
    /// started are abandoned: the tenant goes back to its source (which still holds it),
    /// one generation up. Returns the tenants cut over, those whose migration ended and
    /// those abandoned. One transaction.
    pub async fn advance_migrations(
        &self,
        instance: &str,
        ready: &[(TenantId, u32)],
        grace: Duration,
        timeout: Duration,
    ) -> Result<MigrationSteps, DbError> {
        self.with(async |c: &mut Client| {
            let tx = c.transaction().await?;
            let mut cut = Vec::new();
            for (tenant, generation) in ready {
                let n = tx
                    .execute(
                        "UPDATE fjord_controller_tenants SET cut_over_at = clock_timestamp(), updated_at = clock_timestamp()
                          WHERE tenant_id = $1 AND generation = $2 AND migrating_from IS NOT NULL AND cut_over_at IS NULL",
                        &[&tenant.to_string(), &i64::from(*generation)],
                    )
                    .await?;
                if n > 0 {
                    cut.push(*tenant);
                }
            }
            let ended = tx
                .query(
                    "UPDATE fjord_controller_tenants SET secondary = migrating_from, migrating_from = NULL, cut_over_at = NULL,
                            migration_started_at = NULL, updated_at = clock_timestamp()
                      WHERE cut_over_at < clock_timestamp() - make_interval(secs => $1)
                  RETURNING tenant_id",
                    &[&grace.as_secs_f64()],
                )
                .await?;
            // The destination that never caught up is let go as any node that holds a
            // tenant it should not: the reconcile orders it to detach.
            let abandoned = tx
                .query(
                    "UPDATE fjord_controller_tenants SET attached = migrating_from, generation = generation + 1,
                            secondary = CASE WHEN secondary = migrating_from THEN NULL ELSE secondary END,
                            migrating_from = NULL, cut_over_at = NULL, migration_started_at = NULL, updated_at = clock_timestamp()
                      WHERE migrating_from IS NOT NULL AND cut_over_at IS NULL
                        AND migration_started_at < clock_timestamp() - make_interval(secs => $1)
                  RETURNING tenant_id",
                    &[&timeout.as_secs_f64()],
                )
                .await?;
            let mut steps = MigrationSteps { cut_over: cut, ..Default::default() };
            if steps.cut_over.is_empty() && ended.is_empty() && abandoned.is_empty() {
                return Ok(steps);
            }
            for row in ended {
                steps.ended.push(tenant_location(&tx, parse_tenant(row.get(0))?).await?.expect("just updated"));
            }
            for row in abandoned {
                steps.abandoned.push(tenant_location(&tx, parse_tenant(row.get(0))?).await?.expect("just updated"));
            }
            fence(&tx, instance).await?;
            tx.commit().await?;
            Ok(steps)
        })
        .await
    }
}

fn adjust(loads: &mut [NodeRow], node: u64, f: impl FnOnce(&mut NodeRow)) {
    if let Some(n) = loads.iter_mut().find(|n| n.node.node_id == node) {
        f(n);
    }
}

/// Fails unless `instance` holds a live lease. Called last, just before the commit: it
/// holds the lease row (`FOR SHARE`) until the transaction ends, so that no takeover
/// commits between this check and the commit, and only for that moment, so that the
/// holder's own renewals never wait behind a transaction that waits for a table lock.
async fn fence(tx: &Transaction<'_>, instance: &str) -> Result<(), DbError> {
    // The schema's version too: a controller of another version (an upgrade made under it)
    // changes nothing.
    let rows = tx
        .query(
            "SELECT 1 FROM fjord_controller_leader WHERE id = 1 AND holder = $1 AND expires_at > clock_timestamp()
                AND (SELECT version FROM fjord_controller_schema) = $2 FOR SHARE",
            &[&instance, &SCHEMA_VERSION],
        )
        .await?;
    if rows.is_empty() {
        return Err(DbError::NotLeader);
    }
    Ok(())
}

async fn nodes(c: &impl GenericClient) -> Result<Vec<NodeRow>, DbError> {
    let rows = c
        .query(
            "SELECT n.node_id, n.http_addr, n.page_addr,
                    (SELECT count(*) FROM fjord_controller_tenants t WHERE t.attached = n.node_id),
                    (SELECT count(*) FROM fjord_controller_tenants t WHERE t.secondary = n.node_id)
               FROM fjord_controller_nodes n ORDER BY n.node_id",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| NodeRow {
            node: NodeLocation { node_id: to_u64(r.get(0)), http_addr: r.get(1), page_addr: r.get(2) },
            attached: to_u64(r.get(3)),
            secondaries: to_u64(r.get(4)),
        })
        .collect())
}

async fn attachments<P: tokio_postgres::types::ToSql + Sync>(
    c: &impl GenericClient,
    filter: &str,
    param: P,
) -> Result<Vec<Attachment>, DbError> {
    let rows = c
        .query(
            &format!(
                "SELECT tenant_id, generation, attached, secondary, migrating_from FROM fjord_controller_tenants WHERE {filter} ORDER BY tenant_id"
            ),
            &[&param],
        )
        .await?;
    rows.iter()
        .map(|r| {
            let id = r.get(0);
            Ok(Attachment {
                tenant_id: parse_tenant(id)?,
                generation: u32::try_from(r.get::<_, i64>(1)).expect("the schema bounds generations"),
                attached: to_u64(r.get(2)),
                secondary: r.get::<_, Option<i64>>(3).map(to_u64),
                migrating_from: r.get::<_, Option<i64>>(4).map(to_u64),
            })
        })
        .collect()
}

/// A tenant's location with its nodes' addresses: [`location_of`] reads a row.
const LOCATION_QUERY: &str = "SELECT t.generation, a.node_id, a.http_addr, a.page_addr, s.node_id, s.http_addr, s.page_addr,
                m.node_id, m.http_addr, m.page_addr, t.cut_over_at IS NOT NULL, t.tenant_id
           FROM fjord_controller_tenants t
           JOIN fjord_controller_nodes a ON a.node_id = t.attached
           LEFT JOIN fjord_controller_nodes s ON s.node_id = t.secondary
           LEFT JOIN fjord_controller_nodes m ON m.node_id = t.migrating_from";

fn location_of(r: &tokio_postgres::Row) -> Result<TenantLocation, DbError> {
    let node = |i: usize| {
        r.get::<_, Option<i64>>(i).map(|id| NodeLocation { node_id: to_u64(id), http_addr: r.get(i + 1), page_addr: r.get(i + 2) })
    };
    Ok(TenantLocation {
        tenant_id: parse_tenant(r.get(11))?,
        generation: u32::try_from(r.get::<_, i64>(0)).expect("the schema bounds generations"),
        attached: node(1).expect("attached is NOT NULL"),
        secondary: node(4),
        migration: node(7).map(|from| Migration { from, cut_over: r.get(10) }),
    })
}

async fn tenant_location(c: &impl GenericClient, tenant: TenantId) -> Result<Option<TenantLocation>, DbError> {
    let row = c.query_opt(&format!("{LOCATION_QUERY} WHERE t.tenant_id = $1"), &[&tenant.to_string()]).await?;
    row.as_ref().map(location_of).transpose()
}
