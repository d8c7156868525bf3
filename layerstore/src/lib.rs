//! fjord's storage engine: a multi-version key-value store per timeline, in layers.
//!
//! Every version of every value is kept under `(Key, Lsn)`: an in-memory layer backed by an
//! ephemeral file takes new versions; frozen, it is flushed to an immutable L0 delta layer
//! file; compaction merges delta layers into L1 layers and creates image layers; GC removes
//! what no permitted read can need. A read of a key at an LSN walks the layers from newer to
//! older, and into the ancestor timeline at the branch point, until it finds an image or a
//! record that initializes the value. Combining what it found into one value is the
//! caller's business, behind the [`Reconstructor`] trait.
//!
//! Entry points: [`Tenant`] (create, load, branch, GC), [`Timeline`] (put, publish an LSN,
//! read, freeze and flush, compact, wait for an LSN), [`StorageConfig`] (the tunables).
//! The file formats are specified in `docs/layer-format.md`.
//!
//! **Architecture invariant:** the engine knows nothing of what its keys and values mean.
//! Keys are `proto::Key`s, values are opaque bytes marked as an image or as a record that
//! changes the previous version, and an LSN is a position in the caller's log. The
//! pageserver maps its database onto it; this crate depends on no crate that knows the
//! database's formats, and `tidy/tests/tidy.rs` checks that no source file here names them.

pub mod config;
pub mod error;
pub mod layer;
pub mod layer_map;
pub mod remote;
pub mod tenant;
pub mod timeline;
pub mod value;

/// Locks a mutex whose data stays consistent even if a holder panicked: every lock in the
/// engine guards state that is updated last, so a poisoned lock is still usable.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub use config::StorageConfig;
pub use error::{ChangedKeysError, CreateTimelineError, LayerError, ReadError, WaitLsnError, WriteError};
pub use layer::{LayerDesc, LayerKind};
pub use tenant::Tenant;
pub use timeline::{CompactionResult, GcResult, ImageCreationResult, RangeDepth, ReplaceOutcome, Timeline, TimelineMetadata};
pub use value::{ModelReconstructor, ReconstructData, Reconstructor, Record, Value};
