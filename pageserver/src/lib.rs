//! fjord's pageserver: the PostgreSQL data path on top of the storage engine, and the
//! service around both.
//!
//! Three layers, each knowing only the ones below it:
//! - the storage engine, the `layerstore` crate: versions of opaque values under
//!   `(Key, Lsn)` in layer files, timelines with ancestors, compaction, GC. It knows nothing
//!   of PostgreSQL, and its crate depends on nothing that does.
//! - [`pgdata`], the PostgreSQL data path: which keys hold what ([`pgdata::datadir`]), decoded
//!   WAL in ([`pgdata::walingest`]), a shut-down data directory in ([`pgdata::import`]),
//!   pages out ([`pgdata::reconstruct`], with PostgreSQL's own redo code in
//!   [`pgdata::walredo`]'s process pool; [`pgdata::pageapi`]: GetPage@LSN and friends),
//!   basebackups ([`pgdata::basebackup`]), and the blocks changed between two LSNs
//!   ([`pgdata::changes`]). No sockets; the only threads it starts read
//!   the stderr of WAL redo processes, one per process.
//! - [`service`], the process: configuration, the HTTP management API and the tenants it
//!   serves ([`service::server`]), the page service over TCP ([`service::page_service`]),
//!   the WAL receiver that follows the safekeepers ([`service::walreceiver`]) and the local
//!   WAL it keeps durable until ingested ([`service::localwal`]).
//!
//! Entry points: `bin/pageserver.rs` (the process), [`import_datadir`], [`WalIngest`],
//! [`PageApi`]; the engine's are `layerstore::Tenant` and `layerstore::Timeline`.

pub mod pgdata;
pub mod service;

pub use pgdata::changes::{changed_blocks, ChangedBlocks, ChangesError};
pub use pgdata::datadir::{Datadir, DatadirError, Modification, ReadCost};
pub use pgdata::import::{import_datadir, ImportSummary};
pub use pgdata::pageapi::{PageApi, PageApiError};
pub use pgdata::reconstruct::{PgReconstructor, StoredRecord};
pub use pgdata::timestamp::{lsn_for_timestamp, LsnForTimestamp, TimestampTz};
pub use pgdata::walingest::{IngestStats, WalFilesIngested, WalIngest};
