//! Prometheus metrics of one controller process, in a registry of its own. Rendered by
//! `GET /metrics`.

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

pub struct Metrics {
    pub registry: Registry,
    /// 1 while this instance leads.
    pub leader: IntGauge,
    /// Pageservers by availability as this instance sees them (all unknown while it does
    /// not lead).
    pub nodes: IntGaugeVec,
    /// Tenants moved to their secondary.
    pub failovers: IntCounter,
    /// Heartbeats that got no answer in time.
    pub heartbeat_failures: IntCounter,
    /// Calls to the controller's database that failed (each is retried by its loop or
    /// reported to the API's caller).
    pub database_errors: IntCounter,
    /// HTTP API connections refused for TLS, by reason.
    pub http_tls_failures: IntCounterVec,
    /// Location orders sent to pageservers, by result (`ok`, `failed`).
    pub orders: IntCounterVec,
    /// Planned migrations by step (`started`, `cut_over`, `ended`, `abandoned`).
    pub migrations: IntCounterVec,
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let leader = IntGauge::new("fjord_controller_leader", "1 while this controller holds the leader lease").expect("valid");
        let nodes = IntGaugeVec::new(
            Opts::new("fjord_controller_nodes", "Pageservers by availability, as the leader sees them"),
            &["availability"],
        )
        .expect("valid");
        let failovers = IntCounter::new("fjord_controller_failovers_total", "Tenants moved from an offline pageserver to their secondary")
            .expect("valid");
        let heartbeat_failures =
            IntCounter::new("fjord_controller_heartbeat_failures_total", "Heartbeats a pageserver did not answer in time").expect("valid");
        let database_errors =
            IntCounter::new("fjord_controller_database_errors_total", "Calls to the controller's database that failed").expect("valid");
        let http_tls_failures = IntCounterVec::new(
            Opts::new("fjord_controller_http_tls_failures_total", "HTTP API connections refused for TLS, by reason"),
            &["reason"],
        )
        .expect("valid");
        let orders = IntCounterVec::new(
            Opts::new(
                "fjord_controller_location_orders_total",
                "Location orders (attach, secondary, detach) sent to pageservers, by result",
            ),
            &["result"],
        )
        .expect("valid");
        let migrations = IntCounterVec::new(
            Opts::new("fjord_controller_migrations_total", "Planned migrations of tenants, by step (started, cut_over, ended, abandoned)"),
            &["step"],
        )
        .expect("valid");
        for step in ["started", "cut_over", "ended", "abandoned"] {
            migrations.with_label_values(&[step]);
        }
        for result in ["ok", "failed"] {
            orders.with_label_values(&[result]);
        }
        for reason in tls::http::REFUSAL_REASONS {
            http_tls_failures.with_label_values(&[reason]);
        }
        for a in ["online", "offline", "unknown"] {
            nodes.with_label_values(&[a]);
        }
        for c in [&failovers, &heartbeat_failures, &database_errors] {
            registry.register(Box::new(c.clone())).expect("unique");
        }
        registry.register(Box::new(leader.clone())).expect("unique");
        registry.register(Box::new(nodes.clone())).expect("unique");
        registry.register(Box::new(http_tls_failures.clone())).expect("unique");
        registry.register(Box::new(orders.clone())).expect("unique");
        registry.register(Box::new(migrations.clone())).expect("unique");
        Metrics { registry, leader, nodes, failovers, heartbeat_failures, database_errors, http_tls_failures, orders, migrations }
    }

    pub fn render(&self) -> String {
        prometheus::TextEncoder::new().encode_to_string(&self.registry.gather()).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
