//! fjord's storage controller: where each tenant is attached, its warm secondary and its
//! generation, kept in PostgreSQL ([`persistence`]); which pageservers are alive
//! ([`heartbeat`]); and, when an attached pageserver is taken for dead, the failover of its
//! tenants to their secondaries with their generations raised; planned migrations
//! ([`migration`]); and the orders that make
//! each pageserver hold what the placements say ([`reconcile`]). Two controllers may run
//! against one database: the one holding the lease leads ([`leader`]), the other answers
//! reads and takes over when the lease lapses. The HTTP API is in [`http`], its types in
//! [`models`]. See README.md for what it does not do yet.

pub mod heartbeat;
pub mod http;
pub mod leader;
pub mod metrics;
pub mod migration;
pub mod models;
pub mod persistence;
pub mod reconcile;
pub mod scheduler;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use models::Availability;
use persistence::Db;

/// How the controller runs; the binary's flags fill it.
#[derive(Clone, Debug)]
pub struct Config {
    /// The address other controllers, the CLI and computes reach this one at.
    pub advertise: String,
    /// A libpq connection string or URL of the controller's database.
    pub database_url: String,
    /// How often the leader asks every pageserver for its status.
    pub heartbeat_interval: Duration,
    /// A pageserver that has not answered for this long (as seen by the current leader) is
    /// offline, and its tenants fail over.
    pub offline_after: Duration,
    /// How long a lease lasts; the leader renews it every third of it. A leader killed
    /// without a word is replaced within about this long.
    pub lease: Duration,
    /// How long one heartbeat may take before it counts as missed.
    pub heartbeat_timeout: Duration,
    /// The cluster CA that pageservers' certificates are checked against (None: TLS off).
    pub client_tls: Option<tls::ClientTls>,
    /// The token presented to the pageservers (admin), when they require one.
    pub auth_token: Option<String>,
    /// How long a planned migration's source keeps the tenant after the cutover, so that
    /// computes (which poll every 250 ms) have moved before it lets go.
    pub cutover_grace: Duration,
    /// A planned migration not cut over this long after it started goes back to its source.
    pub migration_timeout: Duration,
}

/// A node's health as this controller has observed it since it began leading.
#[derive(Clone, Debug)]
pub struct Health {
    pub availability: Availability,
    /// The last answered heartbeat, or when this controller began to watch.
    pub last_ok: Instant,
    /// Heartbeats missed in a row. A node is offline only after two at least, however long
    /// since `last_ok`: a controller that stalled (starved, its database slow) does not
    /// take its own silence for the node's.
    pub missed: u32,
}

/// The lease as this instance last saw it, for `/v1/status` and the answer of a controller
/// that does not lead (neither waits for the database).
#[derive(Clone, Debug, Default)]
pub struct LeaseView {
    pub leader_address: Option<String>,
    /// `ok`, or the last error reaching the database.
    pub database: String,
}

/// Whether this instance leads, and until when it may believe so by its own clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct Leadership {
    pub until: Option<Instant>,
}

pub struct Controller {
    pub config: Config,
    /// A random id per process: a restarted controller never inherits its predecessor's
    /// lease.
    pub instance: String,
    /// Changes (the API's and the heartbeats') and the heartbeats' reads.
    pub db: Db,
    /// The API's reads: every compute asks where its tenant is four times a second, and
    /// those questions must never queue a failover behind them.
    pub read_db: Db,
    /// The lease's own connection, so that renewals never queue behind other work.
    pub lease_db: Db,
    pub leadership: Mutex<Leadership>,
    pub lease_view: Mutex<LeaseView>,
    /// Filled while leading; emptied when leadership is lost.
    pub health: Mutex<HashMap<u64, Health>>,
    pub metrics: metrics::Metrics,
    pub auth: Option<auth::Verifier>,
    /// Location orders on their way to a pageserver: (node, tenant).
    pub orders_in_flight: Mutex<std::collections::HashSet<(u64, proto::TenantId)>>,
    /// The last error of each failing order, so that a repeated one is logged once.
    pub order_errors: Mutex<HashMap<(u64, proto::TenantId), String>>,
    /// Nodes whose pageserver answered with another node id (reported once).
    pub misnamed: Mutex<std::collections::HashSet<u64>>,
    /// What each migration's source had ingested at the last heartbeat ([`migration::ready`]).
    pub migration_marks: Mutex<HashMap<proto::TenantId, migration::Mark>>,
}

impl Controller {
    pub fn new(config: Config, auth: Option<auth::Verifier>) -> Arc<Controller> {
        let instance = format!("{:016x}", rand::random::<u64>());
        Arc::new(Controller {
            db: Db::new(&config.database_url, config.lease / 3),
            lease_db: Db::new(&config.database_url, config.lease / 3),
            read_db: Db::new(&config.database_url, config.lease / 3),
            lease_view: Mutex::new(LeaseView { leader_address: None, database: "not reached yet".into() }),
            config,
            instance,
            leadership: Mutex::new(Leadership::default()),
            health: Mutex::new(HashMap::new()),
            metrics: metrics::Metrics::new(),
            auth,
            orders_in_flight: Mutex::new(std::collections::HashSet::new()),
            misnamed: Mutex::new(std::collections::HashSet::new()),
            order_errors: Mutex::new(HashMap::new()),
            migration_marks: Mutex::new(HashMap::new()),
        })
    }

    /// True while this instance's lease is live by its own clock (which ends before the
    /// database's, see [`leader`]).
    pub fn is_leader(&self) -> bool {
        self.leadership.lock().expect("not poisoned").until.is_some_and(|t| Instant::now() < t)
    }

    /// The URL of a pageserver's HTTP API at `http_addr`: https when TLS is on.
    pub fn base_url(&self, http_addr: &str) -> String {
        format!("{}://{http_addr}", if self.config.client_tls.is_some() { "https" } else { "http" })
    }

    pub fn availability(&self, node: u64) -> Availability {
        if !self.is_leader() {
            return Availability::Unknown;
        }
        self.health.lock().expect("not poisoned").get(&node).map_or(Availability::Unknown, |h| h.availability)
    }

    /// Every node's availability now, for decisions that must not change their mind half
    /// way (a transaction that outlasts this instance's belief in its lease still chooses
    /// with what it saw when it began; the lease fences its commit).
    pub fn availability_snapshot(&self) -> HashMap<u64, Availability> {
        if !self.is_leader() {
            return HashMap::new();
        }
        self.health.lock().expect("not poisoned").iter().map(|(id, h)| (*id, h.availability)).collect()
    }
}
