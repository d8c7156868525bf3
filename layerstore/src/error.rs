//! The errors callers branch on: reading, writing, waiting, listing changes, creating
//! timelines, and the layer-file and metadata errors underneath them.
//!
//! Messages follow the house style: lowercase, no trailing period, the offending values
//! named; "could not" for failures that may go away (I/O), "cannot" for misuse that will
//! not. Corruption errors name the file and the byte offset of the structure that failed
//! its check, so that an operator can find and inspect it. Glue code (flush, compaction,
//! GC, loading) returns `anyhow::Error` with context instead; nobody branches on those.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use proto::{Key, Lsn, TimelineId};

/// A layer file, an ephemeral file or a metadata file could not be read, or failed a check.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("could not {op} {path}: {error}")]
    Io { op: &'static str, path: PathBuf, error: io::Error },
    #[error("file {path} is corrupt at offset {offset}: {reason}")]
    Corrupt { path: PathBuf, offset: u64, reason: String },
    #[error("file {path} has format version {version} (at offset {offset}), this build reads {}", versions(supported))]
    UnsupportedVersion { path: PathBuf, offset: u64, version: u16, supported: std::ops::RangeInclusive<u16> },
    /// A layer that is only in remote storage could not be brought back to local disk.
    #[error("could not download layer {path}: {reason}")]
    Download { path: PathBuf, reason: String },
}

impl LayerError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, error: io::Error) -> LayerError {
        LayerError::Io { op, path: path.into(), error }
    }

    pub(crate) fn corrupt(path: impl Into<PathBuf>, offset: u64, reason: impl Into<String>) -> LayerError {
        LayerError::Corrupt { path: path.into(), offset, reason: reason.into() }
    }

    /// Whether the error says the stored bytes are wrong (as opposed to unreadable).
    pub fn is_corruption(&self) -> bool {
        matches!(self, LayerError::Corrupt { .. } | LayerError::UnsupportedVersion { .. })
    }
}

/// "only version 1" or "versions 1 to 2": the format versions a build reads.
fn versions(supported: &std::ops::RangeInclusive<u16>) -> String {
    if supported.start() == supported.end() {
        format!("only version {}", supported.start())
    } else {
        format!("versions {} to {}", supported.start(), supported.end())
    }
}

/// A read (`get_reconstruct_data`, `get`, `keys_in_range`) was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("requested LSN {requested} is below the garbage collection horizon {horizon}")]
    BelowGcHorizon { requested: Lsn, horizon: Lsn },
    #[error("requested LSN {requested} has not been ingested yet: last record LSN is {last_record}")]
    NotYetIngested { requested: Lsn, last_record: Lsn },
    #[error(transparent)]
    Layer(#[from] LayerError),
    #[error("could not reconstruct key {key} at LSN {lsn}: {error:#}")]
    Reconstruct { key: Key, lsn: Lsn, error: anyhow::Error },
}

/// A put, an advance of the last record LSN or a freeze was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("cannot put key {key} at invalid LSN {lsn}")]
    InvalidLsn { key: Key, lsn: Lsn },
    #[error("cannot put key {key}: it is reserved and holds no value")]
    ReservedKey { key: Key },
    #[error("cannot put key {key} at LSN {lsn}: below LSN {last_put} of an earlier put")]
    LsnRegression { key: Key, lsn: Lsn, last_put: Lsn },
    #[error("cannot put key {key} at LSN {lsn}: not above the last record LSN {last_record}, which readers may already have seen")]
    AlreadyPublished { key: Key, lsn: Lsn, last_record: Lsn },
    #[error("cannot put key {key}: value of {len} bytes exceeds the limit of {max} bytes")]
    ValueTooLarge { key: Key, len: usize, max: usize },
    #[error("cannot advance the last record LSN to {lsn}: below {floor}")]
    AdvanceBackwards { lsn: Lsn, floor: Lsn },
    #[error("cannot advance the last record LSN to {lsn}: reserved value")]
    AdvanceInvalid { lsn: Lsn },
    #[error("cannot freeze at last record LSN {last_record}: values put at LSN {last_put} are not published yet")]
    UnpublishedPuts { last_record: Lsn, last_put: Lsn },
    #[error(transparent)]
    Layer(#[from] LayerError),
}

/// `wait_lsn` gave up.
#[derive(Debug, thiserror::Error)]
pub enum WaitLsnError {
    #[error("timed out after {timeout:?} waiting for LSN {awaited} to be ingested: last record LSN is {last_record}")]
    Timeout { awaited: Lsn, last_record: Lsn, timeout: Duration },
}

/// A listing of the keys changed between two LSNs (`Timeline::changed_keys`) was refused
/// or failed. Every refusal but `NotYetIngested` is permanent for the LSNs given: the
/// caller must not expect a complete answer for them, ever.
#[derive(Debug, thiserror::Error)]
pub enum ChangedKeysError {
    #[error("cannot list changes from LSN {from} to LSN {to}: the range ends before it starts")]
    InvalidRange { from: Lsn, to: Lsn },
    #[error("cannot list changes up to LSN {to}: it has not been ingested yet, last record LSN is {last_record}")]
    NotYetIngested { to: Lsn, last_record: Lsn },
    /// GC may have removed layers holding versions at or below the horizon, so the changes
    /// after `from` are no longer all known.
    #[error("cannot list changes since LSN {from}: below the garbage collection horizon {horizon}, the history before which is gone")]
    BelowGcHorizon { from: Lsn, horizon: Lsn },
    /// The changes before the branch point are the ancestor's history, not this timeline's.
    #[error("cannot list changes since LSN {from}: before the timeline's branch point {branch_lsn}, where its own history starts")]
    BeforeBranchPoint { from: Lsn, branch_lsn: Lsn },
    /// More distinct keys changed than the caller was willing to receive.
    #[error("too many changes: more than {limit} keys changed between LSN {from} and LSN {to}")]
    TooManyChanges { limit: usize, from: Lsn, to: Lsn },
    #[error(transparent)]
    Layer(#[from] LayerError),
}

/// Creating a timeline, empty or as a branch, was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum CreateTimelineError {
    #[error("timeline {0} already exists")]
    AlreadyExists(TimelineId),
    #[error("ancestor timeline {0} not found")]
    AncestorNotFound(TimelineId),
    #[error("cannot branch at LSN {at}: the ancestor has only ingested up to LSN {last_record}")]
    LsnNotReached { at: Lsn, last_record: Lsn },
    #[error("cannot branch at LSN {at}: below the ancestor's garbage collection horizon {horizon}")]
    BelowGcHorizon { at: Lsn, horizon: Lsn },
    #[error("cannot branch at LSN {at}: below the ancestor's own branch point {ancestor_lsn}; branch from timeline {grandparent} instead")]
    BelowAncestorBranchPoint { at: Lsn, ancestor_lsn: Lsn, grandparent: TimelineId },
    #[error("could not create timeline {timeline_id}: {error:#}")]
    Other { timeline_id: TimelineId, error: anyhow::Error },
}
