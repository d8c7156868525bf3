//! The pageserver as a service: the parts that talk to the network and run threads, on top
//! of the PostgreSQL data path (`crate::pgdata`) and the storage engine (`layerstore`).
//!
//! - [`server`]: the process's state (tenants, WAL receivers), its configuration and the
//!   HTTP management API.
//! - [`page_service`]: GetPage@LSN and friends over TCP (`proto::pagestream`).
//! - [`walreceiver`]: follows a list of safekeepers over PostgreSQL's streaming replication
//!   protocol, failing over between them, and ingests what it receives.
//! - [`localwal`]: the received WAL, fsynced before it is confirmed and kept until it is in
//!   layer files.
//! - [`ingest_gate`]: what the WAL receiver and a basebackup at the newest LSN share.
//! - [`eviction`]: keeps the layer files on local disk under a budget when remote storage
//!   holds them.
//! - [`background`]: compaction, image layer creation and GC, on a schedule of the
//!   pageserver's own and on demand; [`tenant_conf`]: each tenant's settings (its PITR
//!   window); [`metrics`]: the counters and histograms of jobs and page reads.
//! - [`materializer`]: folds hot keys' chains of records into images, from the engine's
//!   queue and from GetPages that replayed many records.
//!
//! The network-facing parts (`server`, `walreceiver`) and what only they use (`background`,
//! `materializer`, `tenant_conf`, `metrics`) are behind the `server` feature, which the fuzz targets turn
//! off.

#[cfg(feature = "server")]
pub mod background;
pub mod eviction;
pub mod ingest_gate;
pub mod localwal;
#[cfg(feature = "server")]
pub mod materializer;
#[cfg(feature = "server")]
pub mod metrics;
pub mod page_service;
#[cfg(feature = "server")]
pub mod server;
#[cfg(feature = "server")]
pub mod tenant_conf;
#[cfg(feature = "server")]
pub mod walreceiver;
