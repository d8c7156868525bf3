//! fjord's pageserver: a multi-version key-value store per timeline, and the PostgreSQL
//! data path on top of it.
//!
//! The storage engine keeps every version of every value under `(Key, Lsn)` in layers: an
//! in-memory layer backed by an ephemeral file takes new versions; frozen, it is flushed to
//! an immutable delta layer file; compaction merges delta layers and creates image layers;
//! GC removes what no permitted read can need. A read of a key at an LSN walks the layers
//! from newer to older, and into the ancestor timeline at the branch point, until it finds
//! an image or a record that initializes the value. Turning what it found into a page is
//! WAL redo, behind the [`Reconstructor`] trait.
//!
//! The data path maps PostgreSQL onto that engine: [`datadir`] (which keys hold what, and
//! the reads that put a data directory back together), [`reconstruct`] (the real
//! [`Reconstructor`]: PostgreSQL redo for relation pages, Rust for SLRUs and visibility-map
//! bits), [`walingest`] (decoded WAL in, puts out), [`import`] (a shut-down data directory
//! in), and [`pageapi`] (GetPage@LSN and friends, still without a network).
//!
//! No networking or object storage yet (see README.md). The engine itself (`layer`,
//! `layer_map`, `timeline`, `tenant`) knows nothing of PostgreSQL: it reaches WAL redo only
//! through [`Reconstructor`]. Entry points: [`Tenant`] (create, load, branch, GC),
//! [`Timeline`] (put, read, freeze and flush, compact, wait for an LSN), [`import_datadir`],
//! [`WalIngest`], [`PageApi`].

pub mod basebackup;
pub mod config;
pub mod crashsafe;
pub mod datadir;
pub mod error;
pub mod import;
pub mod layer;
pub mod layer_map;
pub mod localwal;
pub mod page_service;
pub mod pageapi;
pub mod reconstruct;
#[cfg(feature = "server")]
pub mod server;
pub mod tenant;
pub mod timeline;
pub mod value;
pub mod walingest;
#[cfg(feature = "server")]
pub mod walreceiver;
pub mod walredo;

pub use config::StorageConfig;
pub use datadir::{Datadir, DatadirError, Modification};
pub use error::{CreateTimelineError, LayerError, ReadError, WaitLsnError, WriteError};
pub use import::{import_datadir, ImportSummary};
pub use layer::{LayerDesc, LayerKind};
pub use pageapi::{PageApi, PageApiError};
pub use reconstruct::{PgReconstructor, StoredRecord};
pub use tenant::Tenant;
pub use timeline::{CompactionResult, GcResult, RecordLsns, Timeline, TimelineMetadata};
pub use value::{ModelReconstructor, ReconstructData, Reconstructor, Value, WalRecord};
pub use walingest::{IngestStats, WalFilesIngested, WalIngest};
