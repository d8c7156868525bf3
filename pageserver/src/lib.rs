//! fjord's pageserver storage engine: a multi-version key-value store per timeline.
//!
//! Every version of every value is kept under `(Key, Lsn)` in layers: an in-memory layer
//! backed by an ephemeral file takes new versions; frozen, it is flushed to an immutable
//! delta layer file; compaction merges delta layers and creates image layers; GC removes
//! what no permitted read can need. A read of a key at an LSN walks the layers from newer
//! to older, and into the ancestor timeline at the branch point, until it finds an image
//! or a record that initializes the value. Turning what it found into a page is WAL redo,
//! behind the [`Reconstructor`] trait.
//!
//! No networking, WAL decoding or object storage in the engine: those are separate pieces
//! that drive it (see README.md). The engine reaches WAL redo only through
//! [`Reconstructor`]; `walredo` (the pool of redo processes) is a separate module that the
//! engine does not call. Entry points: [`Tenant`] (create, load, branch, GC), [`Timeline`]
//! (put, read, freeze and flush, compact, wait for an LSN).

pub mod config;
pub mod crashsafe;
pub mod error;
pub mod layer;
pub mod layer_map;
pub mod tenant;
pub mod timeline;
pub mod value;
pub mod walredo;

pub use config::StorageConfig;
pub use error::{CreateTimelineError, LayerError, ReadError, WaitLsnError, WriteError};
pub use layer::{LayerDesc, LayerKind};
pub use tenant::Tenant;
pub use timeline::{CompactionResult, GcResult, Timeline, TimelineMetadata};
pub use value::{ModelReconstructor, ReconstructData, Reconstructor, Value, WalRecord};
